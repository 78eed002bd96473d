package watchdog

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/checks"
)

// ImagesAPI is the part of EC2 the unavailable-image detector uses.
type ImagesAPI interface {
	DescribeImages(context.Context, *ec2.DescribeImagesInput, ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error)
}

// StateMissing is the state of an image EC2 does not know (deregistered and gone, or never
// there): not one of EC2's ImageState values.
const StateMissing = "missing"

// describeBatch is how many image IDs one DescribeImages call names (checks' batch).
const describeBatch = checks.DescribeImagesBatch

// imageStates reads image states through the checks' cache (5-minute TTL, batched and
// collapsed calls, failures answered for 30 s), reporting unknown images as StateMissing.
type imageStates struct {
	shared *checks.ImageStates
}

func newImageStates(api ImagesAPI, clk clock.Clock) *imageStates {
	return &imageStates{shared: checks.NewImageStates(api, clk)}
}

func (s *imageStates) invalidate(id string) { s.shared.Invalidate(id) }

// get returns the state of each image in ids it could learn (StateMissing for an image EC2
// does not know); an image EC2 could not answer for is absent from the map, and the error
// says why.
func (s *imageStates) get(ctx context.Context, ids []string) (map[string]string, error) {
	states, err := s.shared.States(ctx, ids)
	for id, st := range states {
		if st == "" {
			states[id] = StateMissing
		}
	}
	return states, err
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
