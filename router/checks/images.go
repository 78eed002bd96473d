package checks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// imageStateTTL is how long an image's state is trusted. Images change state rarely and an
// EC2 AMI State Change event invalidates the entry at once; the TTL bounds staleness when
// that event is not routed, and makes a burst of events cost one call per image set.
const imageStateTTL = 5 * time.Minute

// unavailableTTL is how long a failed describe answers for itself: while EC2 throttles or
// is down, the checks of a burst report "unavailable" at once instead of each waiting
// through the SDK's retries again (a Spot notice gives two minutes).
const unavailableTTL = 30 * time.Second

// DescribeImagesBatch is how many image IDs one DescribeImages call names: far below what EC2
// accepts, so that many EC2NodeClasses never hit a request-size limit.
const DescribeImagesBatch = 100

// imagesAPI is the part of EC2 that image states come from.
type imagesAPI interface {
	DescribeImages(context.Context, *ec2.DescribeImagesInput, ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
}

// ImageStates answers the states of images from EC2, cached per image, describing the
// images not cached in batched calls and collapsing concurrent identical calls. The AMI
// check and the watchdog both read image states through it.
type ImageStates struct {
	api      imagesAPI
	states   *cache.Expiring // image ID -> state ("" when EC2 does not know the image)
	failures *cache.Expiring // batch of image IDs -> the error describing it
	group    singleflight.Group
}

// NewImageStates returns image states read through api, cached with clk.
func NewImageStates(api imagesAPI, clk clock.Clock) *ImageStates {
	return &ImageStates{api: api, states: cache.NewExpiringWithClock(clk), failures: cache.NewExpiringWithClock(clk)}
}

// Invalidate forgets the state of image id (an EC2 AMI State Change event arrived for it).
func (s *ImageStates) Invalidate(id string) { s.states.Delete(id) }

// States returns the state of each image in ids it could learn ("" for an image EC2 does
// not know); an image EC2 could not answer for is absent from the map, and the error says why.
func (s *ImageStates) States(ctx context.Context, ids []string) (map[string]string, error) {
	out := map[string]string{}
	var todo []string
	for _, id := range ids {
		if st, ok := s.states.Get(id); ok {
			out[id] = st.(string)
		} else {
			todo = append(todo, id)
		}
	}
	slices.Sort(todo)
	todo = slices.Compact(todo)
	var errs []error
	for batch := range slices.Chunk(todo, DescribeImagesBatch) {
		key := strings.Join(batch, ",")
		if err, ok := s.failures.Get(key); ok {
			errs = append(errs, err.(error))
			continue
		}
		_, err, _ := s.group.Do(key, func() (any, error) {
			if _, ok := s.states.Get(batch[0]); ok {
				return nil, nil // answered by a call that ended after this caller's lookup
			}
			err := s.describe(ctx, batch)
			if err != nil {
				s.failures.Set(key, err, unavailableTTL)
			}
			return nil, err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range todo {
		if st, ok := s.states.Get(id); ok {
			out[id] = st.(string)
		}
	}
	return out, errors.Join(errs...)
}

// describe asks EC2 for the states of ids and caches them.
func (s *ImageStates) describe(ctx context.Context, ids []string) error {
	known := map[string]string{}
	// Deprecated and disabled images are returned too: they are states, not missing images.
	p := ec2.NewDescribeImagesPaginator(s.api, &ec2.DescribeImagesInput{ImageIds: ids, IncludeDeprecated: aws.Bool(true), IncludeDisabled: aws.Bool(true)})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			err = classify(err)
			if errors.Is(err, errNotFound) && len(ids) > 1 {
				// One missing image fails the whole call: ask for each so the others are known.
				return s.describeEach(ctx, ids)
			}
			if errors.Is(err, errNotFound) {
				s.states.Set(ids[0], "", imageStateTTL)
				return nil
			}
			return fmt.Errorf("describing images %s: %w", strings.Join(ids, ","), err)
		}
		for _, im := range out.Images {
			known[aws.ToString(im.ImageId)] = string(im.State)
		}
	}
	for _, id := range ids {
		s.states.Set(id, known[id], imageStateTTL) // absent from the answer: missing
	}
	return nil
}

func (s *ImageStates) describeEach(ctx context.Context, ids []string) error {
	var errs []error
	for _, id := range ids {
		if err := s.describe(ctx, []string{id}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
