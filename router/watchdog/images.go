package watchdog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/aws/smithy-go"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// ImagesAPI is the part of EC2 the unavailable-image detector uses.
type ImagesAPI interface {
	DescribeImages(context.Context, *ec2.DescribeImagesInput, ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
}

// StateMissing is the state of an image EC2 does not know (deregistered and gone, or never
// there): not one of EC2's ImageState values.
const StateMissing = "missing"

// imageStateTTL is how long an image's state is trusted. The watchdog scans every minute and
// images change state rarely: five minutes makes a cluster's image set cost one
// DescribeImages call per five minutes, and bounds how late a change is flagged (or
// cleared) when no EC2 AMI State Change event invalidates the entry first.
const imageStateTTL = 5 * time.Minute

// describeBatch is how many image IDs one DescribeImages call names: far below what EC2
// accepts, so that a cluster with many EC2NodeClasses never hits a request-size limit.
const describeBatch = 100

// imageStates caches image states, collapsing concurrent identical calls.
type imageStates struct {
	api    ImagesAPI
	states *cache.Expiring // image ID -> state ("" when EC2 does not know the image)
	group  singleflight.Group
}

func newImageStates(api ImagesAPI, clk clock.Clock) *imageStates {
	return &imageStates{api: api, states: cache.NewExpiringWithClock(clk)}
}

func (s *imageStates) invalidate(id string) { s.states.Delete(id) }

// get returns the state of each image in ids it could learn (StateMissing for an image EC2
// does not know), describing those not cached; an image EC2 could not answer for is absent
// from the map, and the error says why.
func (s *imageStates) get(ctx context.Context, ids []string) (map[string]string, error) {
	out := map[string]string{}
	var todo []string
	for _, id := range ids {
		if st, ok := s.cached(id); ok {
			out[id] = st
		} else {
			todo = append(todo, id)
		}
	}
	slices.Sort(todo)
	todo = slices.Compact(todo)
	var errs []error
	for batch := range slices.Chunk(todo, describeBatch) {
		_, err, _ := s.group.Do(strings.Join(batch, ","), func() (any, error) {
			return nil, s.describe(ctx, batch)
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, id := range todo {
		if st, ok := s.cached(id); ok {
			out[id] = st
		}
	}
	return out, errors.Join(errs...)
}

func (s *imageStates) cached(id string) (string, bool) {
	v, ok := s.states.Get(id)
	if !ok {
		return "", false
	}
	if st := v.(string); st != "" {
		return st, true
	}
	return StateMissing, true
}

// describe asks EC2 for the states of ids and caches them.
func (s *imageStates) describe(ctx context.Context, ids []string) error {
	known := map[string]string{}
	// Deprecated and disabled images are returned too: they are states to report, not
	// missing images.
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

func (s *imageStates) describeEach(ctx context.Context, ids []string) error {
	var errs []error
	for _, id := range ids {
		if err := s.describe(ctx, []string{id}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// errNotFound marks an EC2 answer that the image does not exist: a real answer, unlike
// throttling or an outage.
var errNotFound = errors.New("not found")

// classify sorts EC2 errors, in one place, as router/checks does: "not found" codes are
// answers; everything else (throttling past the SDK's retries, outages, access denied)
// leaves the images unanswered.
func classify(err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "InvalidAMIID.Malformed":
			return fmt.Errorf("%w: %s", errNotFound, ae.ErrorMessage())
		}
	}
	return err
}

// unavailableImages returns the EC2NodeClasses whose status.amis name images that are not
// available, and sets their gauge. An EC2NodeClass whose images EC2 could not answer for
// keeps its previous finding.
func (w *Watchdog) unavailableImages(ctx context.Context, classes []awsv1.EC2NodeClass) ([]UnavailableImages, error) {
	var ids []string
	for _, c := range classes {
		for _, am := range c.Status.AMIs {
			ids = append(ids, am.ID)
		}
	}
	states, err := w.images.get(ctx, ids)
	known := map[string][]ImageState{}
	var checked []string
	for _, c := range classes {
		checked = append(checked, c.Name)
		var bad []ImageState
		seen := map[string]bool{}
		complete := true
		for _, am := range c.Status.AMIs {
			if seen[am.ID] {
				continue
			}
			seen[am.ID] = true
			st, ok := states[am.ID]
			if !ok {
				complete = false
				break
			}
			if st != string(ec2types.ImageStateAvailable) {
				bad = append(bad, ImageState{ID: am.ID, Name: am.Name, State: st})
			}
		}
		if !complete {
			bad = w.known[c.Name]
		}
		slices.SortFunc(bad, func(a, b ImageState) int { return strings.Compare(a.ID, b.ID) })
		if len(bad) > 0 {
			known[c.Name] = bad
		}
	}
	w.known = known
	w.imagesGauge.set(checked, func(class string) float64 { return float64(len(known[class])) })
	var found []UnavailableImages
	for _, class := range sortedKeys(known) {
		found = append(found, UnavailableImages{NodeClass: class, Images: known[class]})
	}
	return found, err
}

// String is the image as an Event names it: "ami-0123 (al2023-x86_64): pending".
func (im ImageState) String() string {
	if im.Name != "" {
		return fmt.Sprintf("%s (%s): %s", im.ID, im.Name, im.State)
	}
	return fmt.Sprintf("%s: %s", im.ID, im.State)
}
