package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// benchCluster builds n nodes over pools NodePools with mixed policies.
func benchCluster(b *testing.B, n, pools int) *cluster.Model {
	b.Helper()
	policies := []map[string]string{
		nil,
		{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h", policy.AnnotationMaxConcurrentDrains: "10%"},
		{policy.AnnotationAction: "ignore"},
		{policy.ScheduledActionKey(event.ScheduledInstanceReboot): "ignore", policy.AnnotationMaxConcurrentDrains: "5"},
	}
	var objs []client.Object
	for p := 0; p < pools; p++ {
		objs = append(objs, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pool-%d", p), Annotations: policies[p%len(policies)]}})
	}
	for i := 0; i < n; i++ {
		pid := fmt.Sprintf("aws:///eu-west-1a/i-%017x", i)
		labels := map[string]string{karpv1.NodePoolLabelKey: fmt.Sprintf("pool-%d", i%pools)}
		objs = append(objs,
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Labels: labels}, Status: karpv1.NodeClaimStatus{ProviderID: pid}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}})
	}
	scheme, _ := cluster.NewScheme()
	snap, err := cluster.NewSnapshot(scheme, objs...)
	if err != nil {
		b.Fatal(err)
	}
	return cluster.New(snap)
}

// BenchmarkDecide measures one event for one instance through the engine: cluster lookup
// (indexed), pool state, policy and decision; no pre-signal check.
func BenchmarkDecide(b *testing.B) {
	for _, nodes := range []int{500, 5000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			model := benchCluster(b, nodes, 50)
			eng := New(model, nil)
			now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				ev := event.Event{ID: "e", Kind: event.KindScheduledChange, Time: now, Deadline: now.Add(72 * time.Hour),
					Instances: []string{fmt.Sprintf("i-%017x", i%nodes)},
					Health:    &event.Health{Scheduled: event.ScheduledInstanceRetirement, Start: now.Add(72 * time.Hour)}}
				if _, err := eng.Decide(ctx, ev, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParse measures parsing a Health event naming one instance.
func BenchmarkParse(b *testing.B) {
	body := []byte(`{"version":"0","id":"3f5e6a1c-8d2b-4c7e-9a41-6b0d2e9f1a77","detail-type":"AWS Health Event","source":"aws.health","account":"111122223333","time":"2026-11-20T09:12:44Z","region":"eu-west-1","resources":["i-0a1b2c3d4e5f60718"],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED/x","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":"Sat, 5 Dec 2026 02:00:00 GMT","affectedEntities":[{"entityValue":"i-0a1b2c3d4e5f60718"}]}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := event.Parse(body); err != nil {
			b.Fatal(err)
		}
	}
}
