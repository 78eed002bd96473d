package checks

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
)

// AMI checks that the image Karpenter would launch for a node's shape is available.
type AMI struct {
	images *ImageStates
}

// NewAMI returns an AMI check over api, caching with clk.
func NewAMI(api imagesAPI, clk clock.Clock) *AMI {
	return &AMI{images: NewImageStates(api, clk)}
}

// Invalidate forgets the state of image id.
func (a *AMI) Invalidate(id string) { a.images.Invalidate(id) }

// Check finds the replacement image for the node and asks EC2 for its state.
func (a *AMI) Check(ctx context.Context, res cluster.Resolved) policy.Check {
	if res.NodeClass == nil {
		return policy.Check{Name: NameAMI, Reason: "no EC2NodeClass found for the node: cannot tell which image replaces it"}
	}
	labels := nodeLabels(res)
	img, err := SelectImage(res.NodeClass.Status.AMIs, labels)
	if err != nil {
		return policy.Check{Name: NameAMI, Reason: fmt.Sprintf("EC2NodeClass %s: %v", res.NodeClass.Name, err)}
	}
	ids := make([]string, 0, len(res.NodeClass.Status.AMIs))
	for _, am := range res.NodeClass.Status.AMIs {
		ids = append(ids, am.ID)
	}
	state, err := a.state(ctx, img.ID, ids)
	evidence := map[string]string{"image": img.ID, "nodeclass": res.NodeClass.Name}
	if img.Name != "" {
		evidence["image_name"] = img.Name
	}
	if err != nil {
		c := unavailable(NameAMI, err)
		c.Evidence = evidence
		return c
	}
	evidence["state"] = state
	switch state {
	case string(ec2types.ImageStateAvailable):
		return policy.Check{Name: NameAMI, Passed: true, Reason: fmt.Sprintf("image %s is available", img.ID), Evidence: evidence}
	case "":
		evidence["state"] = "missing"
		return policy.Check{Name: NameAMI, Reason: fmt.Sprintf("image %s does not exist in EC2", img.ID), Evidence: evidence}
	}
	return policy.Check{Name: NameAMI, Reason: fmt.Sprintf("image %s is %s, not available", img.ID, state), Evidence: evidence}
}

// state returns the state of image id, describing the node class's whole image set in one
// call when it is not cached.
func (a *AMI) state(ctx context.Context, id string, set []string) (string, error) {
	states, err := a.images.States(ctx, set)
	if st, ok := states[id]; ok {
		return st, nil
	}
	if err != nil {
		return "", err
	}
	// The set was described but this image was not in it (it was added meanwhile).
	states, err = a.images.States(ctx, []string{id})
	return states[id], err
}

// SelectImage returns the image Karpenter launches for a node with these labels: the first
// non-deprecated entry of status.amis (Karpenter keeps them newest first) whose requirements
// all hold for the node's own labels, else the first deprecated one. Matching is strict, on
// the node's labels rather than the NodeClaim's looser requirements: an alias resolves to
// several images (x86/arm, with or without NVIDIA) and only one fits the node.
func SelectImage(amis []awsv1.AMI, labels map[string]string) (awsv1.AMI, error) {
	node := &corev1.Node{}
	node.Labels = labels
	var deprecated *awsv1.AMI
	for i, am := range amis {
		sel, err := nodeaffinity.NewNodeSelector(&corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: am.Requirements}}})
		if err != nil {
			continue // Karpenter validates requirements; an invalid one cannot match
		}
		if !sel.Match(node) {
			continue
		}
		if !am.Deprecated {
			return am, nil
		}
		if deprecated == nil {
			deprecated = &amis[i]
		}
	}
	if deprecated != nil {
		return *deprecated, nil
	}
	if len(amis) == 0 {
		return awsv1.AMI{}, errors.New("status.amis is empty: Karpenter has resolved no image")
	}
	return awsv1.AMI{}, fmt.Errorf("no image in status.amis matches the node's shape (%s)", shape(labels))
}

// nodeLabels are the node's own labels: the NodeClaim's, which Karpenter computes for the
// node's shape and copies onto the Node once it registers (the router's cache keeps the
// shape labels on NodeClaims only, to hold one copy per node); else the Node's.
func nodeLabels(res cluster.Resolved) map[string]string {
	if res.NodeClaim != nil && res.NodeClaim.Labels[corev1.LabelArchStable] != "" {
		return res.NodeClaim.Labels
	}
	if res.Node != nil {
		return res.Node.Labels
	}
	if res.NodeClaim != nil {
		return res.NodeClaim.Labels
	}
	return nil
}

func shape(labels map[string]string) string {
	keys := []string{corev1.LabelArchStable, awsv1.LabelInstanceGPUCount, awsv1.LabelInstanceGPUManufacturer, awsv1.LabelInstanceAcceleratorCount, corev1.LabelInstanceTypeStable}
	var parts []string
	for _, k := range keys {
		if v, ok := labels[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, ", ")
}
