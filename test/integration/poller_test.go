package integration

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/test/harness"
)

// deciding is a pipeline stand-in for these tests: it decides each event with the real
// engine over the cluster model, and records the decisions.
type deciding struct {
	eng *engine.Engine
	now func() time.Time

	mu        sync.Mutex
	decisions map[string]policy.Decision // instance -> last decision
	events    []event.Event
}

func (d *deciding) Handle(ctx context.Context, ev event.Event) error {
	outs, err := d.eng.Decide(ctx, ev, d.now())
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, ev)
	for _, o := range outs {
		d.decisions[o.InstanceID] = o.Decision
	}
	return nil
}

// pollerCluster is two pools: web (no annotations: Karpenter's behaviour) and kafka (defers
// reboots to its Saturday window and leaves impaired brokers in place), plus a NodeClaim not
// launched yet and a Node no NodeClaim owns.
func pollerCluster(t *testing.T) (*cluster.Snapshot, []string) {
	t.Helper()
	objs := []client.Object{
		&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "web"}},
		&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: map[string]string{
			policy.ScheduledActionKey(event.ScheduledSystemReboot): "defer",
			policy.ActionKey(event.KindInstanceStatus):             "ignore",
			policy.AnnotationWindowSchedule:                        "0 2 * * 6",
			policy.AnnotationWindowDuration:                        "4h",
		}}},
		&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "web-launching", Labels: map[string]string{karpv1.NodePoolLabelKey: "web"}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "managed-0"}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + instance(900)}},
	}
	ids := []string{instance(900)}
	for i := range 6 {
		pool := []string{"web", "kafka"}[i%2]
		pid := "aws:///eu-west-1a/" + instance(i)
		labels := map[string]string{karpv1.NodePoolLabelKey: pool}
		objs = append(objs,
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", pool, i), Labels: labels}, Status: karpv1.NodeClaimStatus{ProviderID: pid}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}})
		ids = append(ids, instance(i))
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := cluster.NewSnapshot(scheme, objs...)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return snap, ids
}

// TestPollerDecides: what the poller finds is decided by NodePool policy through the real
// engine and cluster model, a scheduled event exactly as the AWS Health event of the same
// maintenance.
func TestPollerDecides(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 19, 12, 0, 0, 0, time.UTC) // a Thursday
	clk := clocktesting.NewFakeClock(now)
	snap, ids := pollerCluster(t)

	got, err := poller.NewClusterInstances(snap).InstanceIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("cluster instances %v, want %v (launched NodeClaims and Nodes, no duplicates)", got, ids)
	}

	srv, ec2c := harness.NewEC2InstanceStatus(t)
	for _, id := range ids {
		srv.Add(id, &harness.Instance{})
	}
	srv.Add(instance(999), &harness.Instance{InstanceStatus: "impaired"}) // another cluster's
	reboot := now.Add(5 * 24 * time.Hour)                                 // Tuesday
	for _, i := range []int{0, 1} {                                       // web-0, kafka-1
		srv.Set(instance(i), func(in *harness.Instance) {
			in.Events = []harness.ScheduledEvent{{ID: fmt.Sprintf("instance-event-%017x", i), Code: "system-reboot", Description: "scheduled reboot", NotBefore: reboot, NotAfter: reboot.Add(2 * time.Hour)}}
		})
	}
	for _, i := range []int{2, 3} { // web-2, kafka-3
		srv.Set(instance(i), func(in *harness.Instance) { in.SystemStatus = "impaired" })
	}
	h := &deciding{eng: engine.New(cluster.New(snap), nil), now: clk.Now, decisions: map[string]policy.Decision{}}
	p := poller.New(ec2c, poller.NewClusterInstances(snap), h, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), poller.Options{})
	for range 3 { // t, t+1m, t+2m: the impairments reach two minutes at the third poll
		if err := p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		clk.Step(time.Minute)
	}

	saturday := time.Date(2026, 11, 21, 2, 0, 0, 0, time.UTC)
	want := map[string]struct {
		action policy.Action
		until  time.Time
	}{
		instance(0): {policy.ActionDrain, time.Time{}},  // web: Karpenter's behaviour
		instance(1): {policy.ActionDefer, saturday},     // kafka: system-reboot deferred to the window
		instance(2): {policy.ActionDrain, time.Time{}},  // web: impaired, replaced
		instance(3): {policy.ActionIgnore, time.Time{}}, // kafka: impaired, left in place
	}
	if len(h.decisions) != len(want) {
		t.Errorf("%d instances decided, want %d: %v", len(h.decisions), len(want), h.decisions)
	}
	for id, w := range want {
		d, ok := h.decisions[id]
		if !ok {
			t.Errorf("%s not decided", id)
			continue
		}
		if d.Action != w.action || !d.Until.Equal(w.until) {
			t.Errorf("%s (%s): %s until %v (%s), want %s until %v", id, d.NodePool, d.Action, d.Until, d.Reason, w.action, w.until)
		}
	}
	// The same maintenance reported by AWS Health is decided the same way.
	for _, ev := range h.events {
		if ev.Kind != event.KindScheduledChange {
			continue
		}
		health := event.Event{ID: "health", Kind: event.KindScheduledChange, Time: now.Add(-time.Hour), Instances: ev.Instances, Deadline: reboot,
			Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED/1", TypeCode: "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
				Status: event.HealthUpcoming, Scheduled: event.ScheduledTypeOf["AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"], Start: reboot}}
		outs, err := h.eng.Decide(ctx, health, clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d := h.decisions[ev.Instances[0]]; outs[0].Action != d.Action || !outs[0].Until.Equal(d.Until) {
			t.Errorf("%s: Health event %s until %v, poller finding %s until %v", ev.Instances[0], outs[0].Action, outs[0].Until, d.Action, d.Until)
		}
		if ev.Health.Scheduled != health.Health.Scheduled || !ev.Deadline.Equal(health.Deadline) {
			t.Errorf("%s: the finding (%s, %v) does not carry the Health event's identity (%s, %v)", ev.Instances[0], ev.Health.Scheduled, ev.Deadline, health.Health.Scheduled, health.Deadline)
		}
	}
	_, _, asked, _ := srv.Stats()
	for _, call := range asked {
		if slices.Contains(call, instance(999)) {
			t.Error("asked about another cluster's instance")
		}
	}
	if len(asked) != 3 {
		t.Errorf("%d DescribeInstanceStatus calls for 3 polls of 7 instances, want 3", len(asked))
	}
}

// TestClusterInstancesEnvtest lists the cluster's instances through a controller-runtime
// cache on the envtest API server with Karpenter's CRDs, as the live router does.
func TestClusterInstancesEnvtest(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest suite")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := harness.KubeAPIServer(t)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	c, err := crcache.New(cfg, crcache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache not synced")
	}
	launched := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "web-a"},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}
	launching := launched.DeepCopy()
	launching.Name = "web-b"
	for _, nc := range []*karpv1.NodeClaim{launched, launching} {
		if err := kube.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	launched.Status.ProviderID = "aws:///eu-west-1a/" + instance(2) // its Node has not registered yet
	if err := kube.Status().Update(ctx, launched); err != nil {
		t.Fatal(err)
	}
	for name, pid := range map[string]string{"node-a": "aws:///eu-west-1a/" + instance(1), "node-c": "aws:///eu-west-1b/" + instance(3), "kind-node": "kind://docker/kind/kind-worker"} {
		if err := kube.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: pid}}); err != nil {
			t.Fatal(err)
		}
	}
	lister := poller.NewClusterInstances(c)
	want := []string{instance(1), instance(2), instance(3)}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = lister.InstanceIDs(ctx); err == nil && slices.Equal(got, want) {
			return
		}
	}
	t.Errorf("instances %v (%v), want %v: launched NodeClaims and Nodes, no other providers", got, err, want)
}
