package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/shadow"
)

// The demo's pool in shadow (issue 38 item 14): `reports` asks for a deferral to its
// Saturday window, but is in shadow (healthrouter.io/mode=shadow). The router records what it
// would have done and keeps Karpenter's behaviour for it (the takeover is done in the demo:
// nobody else hears of its events), so its retirement, twelve days ahead, is drained at once;
// `health-router status --shadow` then lists both side by side. It lives here rather than in
// test/demo/cluster.yaml, which `replay` reads too: replay decides policies, and has no
// Karpenter beside it to compare with.
const (
	shadowPool     = "reports"
	shadowClaim    = "reports-m4q9d"
	shadowNode     = "ip-10-0-3-41.eu-west-1.compute.internal"
	shadowInstance = "i-0b5e7d1c3a9f24680"
)

// shadowObjects are the pool in shadow, its NodeClaim and its Node.
func shadowObjects() (*karpv1.NodePool, *karpv1.NodeClaim, *corev1.Node) {
	labels := map[string]string{
		karpv1.NodePoolLabelKey: shadowPool, karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeOnDemand,
		corev1.LabelArchStable: "amd64", corev1.LabelInstanceTypeStable: "r7i.2xlarge", corev1.LabelTopologyZone: "eu-west-1b", corev1.LabelOSStable: "linux",
		"karpenter.k8s.aws/ec2nodeclass": "default",
	}
	ref := &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: shadowPool, Annotations: map[string]string{
			policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer",
			policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		}},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: ref,
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
		}}},
	}
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: shadowClaim, Labels: labels, Finalizers: []string{karpv1.TerminationFinalizer}},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: ref,
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{shadowPool}}}},
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: shadowNode, Labels: labels},
		Spec:       corev1.NodeSpec{ProviderID: "aws:///eu-west-1b/" + shadowInstance},
	}
	return np, nc, node
}

// loadShadowPool creates the pool in shadow and its node; it returns the NodeClaim's name, and
// creates the router's namespace, where the shadow ledger is kept.
func loadShadowPool(ctx context.Context, kube client.Client) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: app.Namespace("")}}
	if err := kube.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating the router's namespace %s (the shadow ledger's): %w", ns.Name, err)
	}
	np, nc, node := shadowObjects()
	for _, o := range []client.Object{np, node} {
		if err := kube.Create(ctx, o); err != nil {
			return "", err
		}
	}
	if err := kube.Create(ctx, nc); err != nil {
		return "", err
	}
	nc.Status.ProviderID, nc.Status.NodeName = node.Spec.ProviderID, node.Name
	if err := kube.Status().Update(ctx, nc); err != nil {
		return "", err
	}
	return nc.Name, nil
}

// putShadowEvent sends, through EventBridge, an AWS Health retirement of the shadow pool's
// instance twelve days ahead: the pool's policy would defer it to a Saturday window.
func putShadowEvent(ctx context.Context, ebc *eventbridge.Client, now time.Time) error {
	start := now.Add(12 * 24 * time.Hour).Truncate(time.Hour).UTC().Format(time.RFC1123)
	detail, err := json.Marshal(map[string]any{
		"eventArn":          "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED/AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED_demo-shadow-7c1e",
		"service":           "EC2",
		"eventTypeCode":     "AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
		"eventTypeCategory": "scheduledChange",
		"statusCode":        "upcoming",
		"startTime":         start,
		"endTime":           start,
		"eventDescription":  []map[string]string{{"language": "en_US", "latestDescription": "Scheduled retirement of your instance."}},
		"affectedEntities":  []map[string]any{{"entityValue": shadowInstance, "tags": map[string]string{}}},
	})
	if err != nil {
		return err
	}
	out, err := ebc.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		Source: aws.String("aws.health"), DetailType: aws.String("AWS Health Event"), Detail: aws.String(string(detail)),
		Resources: []string{shadowInstance}, Time: aws.Time(now),
	}}})
	if err != nil || out.FailedEntryCount > 0 {
		return fmt.Errorf("PutEvents (the shadow pool's retirement): %v", err)
	}
	return nil
}

// shadowReport prints what `health-router status --shadow` prints: the would-be outcome of
// the pool in shadow beside what was done. The ledger is written by the leader every
// shadow.FlushInterval; it is waited for until it holds the pool's entry and Karpenter's act.
func shadowReport(ctx context.Context, kube client.Reader, w io.Writer) error {
	fmt.Fprintf(w, "\nThe pool in shadow (%s: %s=%s), as `health-router status --shadow` lists it:\n", shadowPool, policy.AnnotationMode, policy.ModeShadow)
	var entries []shadow.Entry
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		entries, err = shadow.ReadLedger(ctx, kube, app.Namespace(""), shadow.DefaultLedgerName)
		if err != nil && !errors.Is(err, shadow.ErrNoLedger) {
			return err
		}
		if shadowSettled(entries) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return shadow.BuildReport(entries, shadowPool).WriteTable(w)
}

// shadowSettled says whether the ledger holds the shadow pool's would-be outcome and the drain.
func shadowSettled(entries []shadow.Entry) bool {
	for _, e := range entries {
		if e.NodeClaim == shadowClaim && !e.KarpenterAt.IsZero() {
			return true
		}
	}
	return false
}
