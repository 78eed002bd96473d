package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// poolSpec is one NodePool of a test cluster: its annotations, its nodes, and how many of
// them are already being drained (the first ones: deleted or signalled).
type poolSpec struct {
	annotations map[string]string
	nodes       int
	draining    int
	budgets     []karpv1.Budget // spec.disruption.budgets
}

// testCluster builds a snapshot of the pools; instance IDs are i-<pool>-<n>, NodeClaims
// <pool>-<n>.
func testCluster(t testing.TB, pools map[string]poolSpec) *cluster.Model {
	t.Helper()
	var objs []client.Object
	for name, p := range pools {
		objs = append(objs, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: p.annotations},
			Spec: karpv1.NodePoolSpec{Disruption: karpv1.Disruption{Budgets: p.budgets}}})
		for i := 0; i < p.nodes; i++ {
			pid := "aws:///eu-west-1a/" + instance(name, i)
			labels := map[string]string{karpv1.NodePoolLabelKey: name}
			claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Labels: labels, Annotations: map[string]string{}}, Status: karpv1.NodeClaimStatus{ProviderID: pid}}
			if i < p.draining {
				objs = append(objs, &record.HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Labels: labels},
					Spec:   record.HealthRecordSpec{NodeClaim: claim.Name, NodePool: name},
					Status: record.HealthRecordStatus{Version: record.Version, Memory: record.Memory{Drain: &record.Drain{EventID: "earlier", At: now}}}})
			}
			objs = append(objs, claim, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%s-%d", name, i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}})
		}
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := cluster.NewSnapshot(scheme, objs...)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.New(snap)
}

func instance(pool string, i int) string { return fmt.Sprintf("i-%s%013d", pool[:4], i) }

func retirement(ids ...string) event.Event {
	start := now.Add(7 * 24 * time.Hour)
	return event.Event{ID: "ret-1", Kind: event.KindScheduledChange, Time: now, Deadline: start, Instances: ids,
		Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/RET/1", TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Status: event.HealthUpcoming, Scheduled: event.ScheduledInstanceRetirement, Start: start}}
}

func spot(id string) event.Event {
	return event.Event{ID: "spot-" + id, Kind: event.KindSpotInterruption, Time: now, Deadline: now.Add(2 * time.Minute), Instances: []string{id}}
}

func actions(outs []Outcome) []policy.Action {
	var a []policy.Action
	for _, o := range outs {
		a = append(a, o.Action)
	}
	return a
}

func TestPacing(t *testing.T) {
	drain, deferred := policy.ActionDrain, policy.ActionDefer
	tests := []struct {
		name string
		pool poolSpec
		// event names these node indexes of the pool
		instances []int
		spot      bool
		want      []policy.Action
	}{
		{name: "integer limit, several instances of one event", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "2"}, nodes: 10},
			instances: []int{0, 1, 2, 3}, want: []policy.Action{drain, drain, deferred, deferred}},
		{name: "integer limit with drains already in flight", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "2"}, nodes: 10, draining: 1},
			instances: []int{5, 6, 7}, want: []policy.Action{drain, deferred, deferred}},
		{name: "limit reached by drains in flight", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "1"}, nodes: 4, draining: 1},
			instances: []int{2}, want: []policy.Action{deferred}},
		// The bug: the pool's size was read only after a first drain, and 20% of 0 nodes is
		// 0, so every drain of a percentage-paced pool was deferred.
		{name: "percentage of the pool's size, first decision", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "20%"}, nodes: 10},
			instances: []int{0, 1, 2}, want: []policy.Action{drain, drain, deferred}},
		{name: "percentage rounds up: 10% of 5 nodes is 1", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "10%"}, nodes: 5},
			instances: []int{0, 1}, want: []policy.Action{drain, deferred}},
		{name: "percentage with drains in flight", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "30%"}, nodes: 10, draining: 2},
			instances: []int{4, 5}, want: []policy.Action{drain, deferred}},
		{name: "0 holds every non-urgent drain", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "0"}, nodes: 3},
			instances: []int{0}, want: []policy.Action{deferred}},
		{name: "no limit", pool: poolSpec{nodes: 3, draining: 2},
			instances: []int{0, 1, 2}, want: []policy.Action{drain, drain, drain}},
		{name: "urgent kinds pass the limit", pool: poolSpec{annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "1"}, nodes: 4, draining: 1},
			instances: []int{2}, spot: true, want: []policy.Action{drain}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := New(testCluster(t, map[string]poolSpec{"kafka": tt.pool}), nil)
			var ids []string
			for _, i := range tt.instances {
				ids = append(ids, instance("kafka", i))
			}
			var outs []Outcome
			if tt.spot {
				o, err := eng.Decide(context.Background(), spot(ids[0]), now)
				if err != nil {
					t.Fatal(err)
				}
				outs = o
			} else {
				o, err := eng.Decide(context.Background(), retirement(ids...), now)
				if err != nil {
					t.Fatal(err)
				}
				outs = o
			}
			if got := actions(outs); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				for _, o := range outs {
					t.Logf("%s: %s: %s", o.InstanceID, o.Action, o.Reason)
				}
				t.Fatalf("actions %v, want %v", got, tt.want)
			}
			for _, o := range outs {
				if o.Action == policy.ActionDefer && (o.Hold != policy.HoldPacing || !o.Until.Equal(now.Add(7*24*time.Hour-policy.DefaultDrainLead))) {
					t.Errorf("%s held %q until %s", o.InstanceID, o.Hold, o.Until)
				}
			}
		})
	}
}

// impairedEvent is the router's instance-status finding that instance i of pool is impaired.
func impairedEvent(pool string, i int) event.Event {
	id := instance(pool, i)
	return event.Event{ID: "healthrouter.io/instance-status/" + id + "/impaired/2026-11-21T11:50:00Z", Kind: event.KindInstanceStatus, Time: now, Instances: []string{id},
		Status: &event.InstanceStatus{SystemStatus: "impaired", ImpairedSince: now.Add(-10 * time.Minute)}}
}

// TestRepairBudget: the repair cut-off of impaired instances reads the NodePool's disruption
// budget for the reason Unhealthy (Karpenter v1.15's node repair): with nodes=1, the second
// impaired node of a pool of 10 is held, where repair-max-unhealthy alone (20%: 2) lets it go.
func TestRepairBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budgets []karpv1.Budget
		want    []policy.Action
	}{
		{name: "no Unhealthy budget: the cut-off of 2", budgets: []karpv1.Budget{{Nodes: "0"}}, want: []policy.Action{policy.ActionDrain, policy.ActionDrain}},
		{name: "an Unhealthy budget of 1", budgets: []karpv1.Budget{{Nodes: "1", Reasons: []karpv1.DisruptionReason{karpv1.DisruptionReasonUnhealthy}}},
			want: []policy.Action{policy.ActionDrain, policy.ActionDefer}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := New(testCluster(t, map[string]poolSpec{"kafka": {nodes: 10, budgets: tc.budgets}}), nil)
			var got []policy.Action
			for i := range 2 {
				outs, err := eng.Decide(context.Background(), impairedEvent("kafka", i), now)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, actions(outs)...)
				if o := outs[0]; o.Action == policy.ActionDefer && (o.Hold != policy.HoldRepairCutoff || !strings.Contains(o.Reason, "Unhealthy disruption budget nodes=1")) {
					t.Errorf("held %q: %s", o.Hold, o.Reason)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("actions %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPacingAcrossEvents: drains decided for one event count against the next event's, and
// a slot given back (the drain was not signalled) is free again.
func TestPacingAcrossEvents(t *testing.T) {
	eng := New(testCluster(t, map[string]poolSpec{"kafka": {annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "1"}, nodes: 3}}), nil)
	ctx := context.Background()
	first, _ := eng.Decide(ctx, retirement(instance("kafka", 0)), now)
	second, _ := eng.Decide(ctx, retirement(instance("kafka", 1)), now)
	if first[0].Action != policy.ActionDrain || second[0].Action != policy.ActionDefer {
		t.Fatalf("first %s, second %s", first[0].Action, second[0].Action)
	}
	eng.Unreserve("kafka", first[0].NodeClaim)
	third, _ := eng.Decide(ctx, retirement(instance("kafka", 1)), now)
	if third[0].Action != policy.ActionDrain {
		t.Errorf("after the slot was given back: %s (%s)", third[0].Action, third[0].Reason)
	}
	free, ok, err := eng.FreeDrains(ctx, "kafka", now)
	if err != nil || !ok || free != 0 {
		t.Errorf("FreeDrains = %d, %v, %v; want 0 free", free, ok, err)
	}
	if _, ok, _ := eng.FreeDrains(ctx, "nope", now); ok {
		t.Error("a pool that does not exist paces")
	}
}

// TestPacingInParallel: instances decided concurrently never exceed the pool's limit.
func TestPacingInParallel(t *testing.T) {
	const nodes, limit = 400, 7
	eng := New(testCluster(t, map[string]poolSpec{"kafka": {annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: fmt.Sprint(limit)}, nodes: nodes}}), nil)
	var ids []string
	for i := 0; i < nodes; i++ {
		ids = append(ids, instance("kafka", i))
	}
	ev := retirement(ids...)
	var mu sync.Mutex
	drains := 0
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < nodes; i += 16 {
				o, err := eng.DecideInstance(context.Background(), ev, eng.Resolve, ids[i], now)
				if err != nil {
					t.Error(err)
					return
				}
				if o.Action == policy.ActionDrain {
					mu.Lock()
					drains++
					mu.Unlock()
				}
			}
		}(w)
	}
	wg.Wait()
	if drains != limit {
		t.Errorf("%d drains decided in parallel, want exactly %d", drains, limit)
	}
}

// settleRig is a pool of three nodes (limit 1) on the fake client, which lets a test delete a
// NodeClaim (a drain finished) and move pods.
func settleRig(t *testing.T, settle string) (*Engine, client.Client) {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: map[string]string{
		policy.AnnotationMaxConcurrentDrains: "1", policy.AnnotationDrainSettle: settle, policy.AnnotationRespectPDB: "false"}}}}
	for i := 0; i < 3; i++ {
		pid := "aws:///eu-west-1a/" + instance("kafka", i)
		labels := map[string]string{karpv1.NodePoolLabelKey: "kafka"}
		objs = append(objs,
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("kafka-%d", i), Labels: labels}, Status: karpv1.NodeClaimStatus{ProviderID: pid}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}})
	}
	// A broker owned by a StatefulSet on node-0.
	objs = append(objs, brokerPod("broker-0", "node-0", false))
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	for _, ix := range append(cluster.Indexes(), gates.Indexes()...) {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	kube := b.Build()
	recordtest.FromAnnotations(t, kube)
	return New(cluster.New(kube), nil, WithSettle(kube)), kube
}

func brokerPod(name, node string, ready bool) *corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kafka", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "broker", UID: "sts-uid", Controller: ptr.To(true)}}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}}
}

func decideOne(t *testing.T, eng *Engine, i int, at time.Time) policy.Decision {
	t.Helper()
	outs, err := eng.Decide(context.Background(), retirement(instance("kafka", i)), at)
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Decision
}

// finish deletes a drained NodeClaim and tells the engine, as the informer does.
func finish(t *testing.T, eng *Engine, kube client.Client, i int, at time.Time) {
	t.Helper()
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("kafka-%d", i)}}
	if err := kube.Delete(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	eng.DrainFinished("kafka", nc.Name, at)
}

// TestDrainSettleDuration: with drain-settle 10m, a drain still counts against
// max-concurrent-drains for 10 minutes after its NodeClaim is gone.
func TestDrainSettleDuration(t *testing.T) {
	eng, kube := settleRig(t, "10m")
	if d := decideOne(t, eng, 0, now); d.Action != policy.ActionDrain {
		t.Fatalf("first drain: %s (%s)", d.Action, d.Reason)
	}
	finish(t, eng, kube, 0, now.Add(time.Minute))
	if d := decideOne(t, eng, 1, now.Add(5*time.Minute)); d.Action != policy.ActionDefer || d.Hold != policy.HoldPacing {
		t.Errorf("while settling: %s (%s)", d.Action, d.Reason)
	}
	if d := decideOne(t, eng, 1, now.Add(11*time.Minute+2*time.Second)); d.Action != policy.ActionDrain {
		t.Errorf("after the settle time: %s (%s)", d.Action, d.Reason)
	}
}

// TestDrainSettleReady: with drain-settle ready, the drain counts until the pods it evicted
// (by owner) are Ready again elsewhere.
func TestDrainSettleReady(t *testing.T) {
	eng, kube := settleRig(t, "ready")
	if d := decideOne(t, eng, 0, now); d.Action != policy.ActionDrain {
		t.Fatalf("first drain: %s (%s)", d.Action, d.Reason)
	}
	finish(t, eng, kube, 0, now)
	// The broker is recreated on node-2, not Ready yet (catching up its partitions).
	if err := kube.Delete(context.Background(), brokerPod("broker-0", "node-0", false)); err != nil {
		t.Fatal(err)
	}
	if err := kube.Create(context.Background(), brokerPod("broker-0", "node-2", false)); err != nil {
		t.Fatal(err)
	}
	if d := decideOne(t, eng, 1, now.Add(5*time.Minute)); d.Action != policy.ActionDefer {
		t.Errorf("replacement not Ready: %s (%s)", d.Action, d.Reason)
	}
	if err := kube.Delete(context.Background(), brokerPod("broker-0", "node-2", false)); err != nil {
		t.Fatal(err)
	}
	if err := kube.Create(context.Background(), brokerPod("broker-0", "node-2", true)); err != nil {
		t.Fatal(err)
	}
	if d := decideOne(t, eng, 1, now.Add(time.Hour+2*time.Second)); d.Action != policy.ActionDrain {
		t.Errorf("replacement Ready: %s (%s)", d.Action, d.Reason)
	}
}

// TestDrainSettleReadyBounded: an owner whose pods never come back (a Job that completed, a
// ReplicaSet scaled to zero, a deleted owner) holds the pool's slot only until
// SettleReadyBound; before the bound it is not settled. On the main this fix starts from
// (351c311) the slot was held for ever, and every later drain waited until deadline minus
// drain-lead.
func TestDrainSettleReadyBounded(t *testing.T) {
	eng, kube := settleRig(t, "ready")
	if d := decideOne(t, eng, 0, now); d.Action != policy.ActionDrain {
		t.Fatalf("first drain: %s (%s)", d.Action, d.Reason)
	}
	finish(t, eng, kube, 0, now)
	// The owner is scaled to zero: its pod is gone and none comes back.
	if err := kube.Delete(context.Background(), brokerPod("broker-0", "node-0", false)); err != nil {
		t.Fatal(err)
	}
	if d := decideOne(t, eng, 1, now.Add(5*time.Minute)); d.Action != policy.ActionDefer || d.Hold != policy.HoldPacing {
		t.Errorf("before the bound: %s (%s)", d.Action, d.Reason)
	}
	if d := decideOne(t, eng, 1, now.Add(policy.SettleReadyBound+time.Second)); d.Action != policy.ActionDrain {
		t.Errorf("past the bound: %s (%s)", d.Action, d.Reason)
	}
}

// TestUrgentDrainCountsAtOnce: found by the simulation (seed 4309708758477942132, shrunk to a
// Spot warning and an impaired instance in one paced pool within the pool cache's second). An
// urgent drain is never held, but it is in flight: a paced drain decided before the cache shows
// it must see it. On 351c311 the second drain went over max-concurrent-drains.
func TestUrgentDrainCountsAtOnce(t *testing.T) {
	eng, _ := settleRig(t, "0s")
	if d := decideOne(t, eng, 0, now); d.Action != policy.ActionDrain { // reads the pool: nothing in flight
		t.Fatalf("first: %s (%s)", d.Action, d.Reason)
	}
	eng.Unreserve("kafka", "kafka-0") // as if its signal failed: the pool has no drain in flight
	outs, err := eng.Decide(context.Background(), spot(instance("kafka", 1)), now)
	if err != nil || outs[0].Action != policy.ActionDrain {
		t.Fatalf("spot: %v %+v", err, outs)
	}
	if d := decideOne(t, eng, 2, now); d.Action != policy.ActionDefer || d.Hold != policy.HoldPacing {
		t.Errorf("a paced drain beside an urgent one in flight: %s (%s)", d.Action, d.Reason)
	}
}

// TestUrgentBreakerKeepsASignalledDrain: found by the simulation (a Storm of Spot warnings, two
// per node). A NodeClaim's urgent drain is signalled; a second urgent event of the same
// NodeClaim is decided, and given back (Unreserve: the fresh read showed it drained already).
// Giving the second back forgot the first: the breaker then let a third node through. A
// breaker's count is only ever too high (an urgent drain decided and not signalled counts for
// the rest of its minute), never too low.
func TestUrgentBreakerKeepsASignalledDrain(t *testing.T) {
	eng := New(testCluster(t, map[string]poolSpec{"spot": {annotations: map[string]string{policy.AnnotationUrgentDrainMax: "2"}, nodes: 5}}), nil)
	decide := func(i int, id string) policy.Decision {
		t.Helper()
		ev := spot(instance("spot", i))
		ev.ID = id
		outs, err := eng.Decide(context.Background(), ev, now)
		if err != nil || len(outs) != 1 {
			t.Fatalf("%s: %v %+v", id, err, outs)
		}
		return outs[0].Decision
	}
	for i := range 2 {
		if d := decide(i, fmt.Sprintf("first-%d", i)); d.Action != policy.ActionDrain {
			t.Fatalf("node %d: %s (%s)", i, d.Action, d.Reason)
		}
	}
	// A second warning of node 0, decided and given back: node 0's drain stays counted.
	if d := decide(0, "second-0"); d.Action != policy.ActionDrain {
		t.Fatalf("the second warning of node 0: %s (%s)", d.Action, d.Reason)
	}
	eng.Unreserve("spot", "spot-0")
	if d := decide(2, "first-2"); d.Action != policy.ActionDefer || d.Hold != policy.HoldUrgentBreaker {
		t.Errorf("a third node within the minute: %s (%s), want held by the breaker", d.Action, d.Reason)
	}
}

// TestPacingKeepsASignalledDrain: found by make sim SEEDS=500. A NodeClaim's paced drain is
// signalled; a second event of the same NodeClaim (the other source's report of the same
// maintenance) is decided too, and given back (Unreserve: the fresh read showed its deferral
// ended). Giving the second back released the first's slot: the next drain of the pool went
// over max-concurrent-drains while the cache did not show the first drain yet.
func TestPacingKeepsASignalledDrain(t *testing.T) {
	eng := New(testCluster(t, map[string]poolSpec{"kafka": {annotations: map[string]string{policy.AnnotationMaxConcurrentDrains: "1"}, nodes: 4}}), nil)
	decide := func(i int, id string) policy.Decision {
		t.Helper()
		ev := retirement(instance("kafka", i))
		ev.ID = id
		outs, err := eng.Decide(context.Background(), ev, now)
		if err != nil || len(outs) != 1 {
			t.Fatalf("%s: %v %+v", id, err, outs)
		}
		return outs[0].Decision
	}
	if d := decide(0, "health-0"); d.Action != policy.ActionDrain {
		t.Fatalf("first: %s (%s)", d.Action, d.Reason)
	}
	if d := decide(0, "poller-0"); d.Action != policy.ActionDrain { // the same NodeClaim: its own slot
		t.Fatalf("the second report of node 0: %s (%s)", d.Action, d.Reason)
	}
	eng.Unreserve("kafka", "kafka-0")
	if d := decide(1, "health-1"); d.Action != policy.ActionDefer || d.Hold != policy.HoldPacing {
		t.Errorf("node 1 beside node 0's drain: %s (%s), want held by pacing", d.Action, d.Reason)
	}
}

// TestRepairCutoffCountsWhatEC2Reports: the repair cut-off counts every instance of the pool
// EC2 reports impaired now, decided or not (issue 36, defect 13: an AZ-wide impairment arriving
// over several polls had each instance decided with "held 0 + replacing 0 + this 1", and all
// three impaired nodes of a pool of five were replaced in 70 s while 60% of it was impaired).
func TestRepairCutoffCountsWhatEC2Reports(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reported []int
		want     policy.Action
	}{
		{"EC2 reports this one only: 1 of 5, within 20%", []int{1}, policy.ActionDrain},
		{"EC2 reports two, the other undecided: 2 of 5, over 20%", []int{1, 2}, policy.ActionDefer},
		{"nothing reported yet (no poll answered): the router's own count", nil, policy.ActionDrain},
		{"an instance of another pool does not count", []int{1, 9}, policy.ActionDrain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := New(testCluster(t, map[string]poolSpec{"kafka": {nodes: 5}, "other": {nodes: 1}}), nil)
			var ids []string
			for _, i := range tc.reported {
				ids = append(ids, instance("kafka", i))
			}
			if slices.Contains(tc.reported, 9) {
				ids = append(ids[:1], instance("other", 0))
			}
			eng.ReportImpaired(ids)
			outs, err := eng.Decide(context.Background(), impairedEvent("kafka", 1), now)
			if err != nil {
				t.Fatal(err)
			}
			if o := outs[0]; o.Action != tc.want || (o.Action == policy.ActionDefer && o.Hold != policy.HoldRepairCutoff) {
				t.Errorf("%s held %q, want %s: %s", o.Action, o.Hold, tc.want, o.Reason)
			}
		})
	}
}
