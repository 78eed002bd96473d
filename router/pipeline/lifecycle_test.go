package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	corev1 "k8s.io/api/core/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// The lifecycle of the actions that hold state, carried by the pipeline (issue 25): a close
// reaches every one of them, a second maintenance waits for a run in progress, and a
// destructive outcome is decided on the NodeClaim as the API server holds it.

const (
	rebootCode = "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"
	rebootARN  = "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED/1"
)

// noEvictions empties nodes at once; noReboots is EC2 for a run that never reboots itself.
type noEvictions struct{}

func (noEvictions) Evict(context.Context, string, time.Time) (int, map[string]string, error) {
	return 0, nil, nil
}

type noReboots struct{}

func (noReboots) RebootInstances(context.Context, *ec2.RebootInstancesInput, ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error) {
	return nil, errors.New("not in this test")
}

func (noReboots) DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	return nil, errors.New("not in this test")
}

// inPlaceRig is a pipeline whose kafka pool keeps its nodes through system reboots, with the
// real reboot-in-place runner over the rig's API server.
func inPlaceRig(t *testing.T) (*rig, *inplace.Runner, *clocktesting.FakeClock) {
	t.Helper()
	r := newRig(t, map[string]map[string]string{"kafka": {policy.ScheduledActionKey(event.ScheduledSystemReboot): string(policy.ActionRebootInPlace),
		policy.ScheduledActionKey(event.ScheduledSystemMaintenance): string(policy.ActionRebootInPlace)}}, map[string]int{"kafka": 1})
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "kafka-0"}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.NodeName = "node-0"
	if err := r.kube.Update(context.Background(), nc); err != nil { // the rig serves no status subresource
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(now)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sig := signal.New(r.kube, r.kube, signal.ModeDeleteNodeClaim, nil, "", r.recorder, clk)
	runner := inplace.New(r.kube, r.kube, noEvictions{}, noReboots{}, clk, r.recorder, log, nil, func(context.Context, *karpv1.NodeClaim, inplace.State, string) error { return nil }, inplace.Options{})
	r.p = New(engine.New(cluster.New(r.kube), nil), sig, r.m, nil, clk, log, 1).WithInPlace(runner).WithFreshReads(r.kube)
	return r, runner, clk
}

func (r *rig) run(t *testing.T, runner *inplace.Runner, passes int) inplace.State {
	t.Helper()
	for range passes {
		if _, err := runner.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: "kafka-0"}}); err != nil {
			t.Fatal(err)
		}
	}
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "kafka-0"}, nc); err != nil {
		t.Fatal(err)
	}
	st, _, err := inplace.Read(recordtest.Memory(t, r.kube, nc))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCloseReachesTheRebootInPlace: defect 4. A closed Health event reaches the run of its
// maintenance: the node goes back into service, nothing is rebooted.
func TestCloseReachesTheRebootInPlace(t *testing.T) {
	r, runner, _ := inPlaceRig(t)
	start := now.Add(30 * time.Minute) // within its deadline minus drain-lead: carried out now
	if res, err := r.p.Process(context.Background(), scheduled("up", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0))); err != nil || res.Actions[policy.ActionRebootInPlace] != 1 {
		t.Fatalf("upcoming: %+v %v", res, err)
	}
	if st := r.run(t, runner, 3); st.Step != inplace.StepAwait {
		t.Fatalf("the run: %+v", st)
	}
	if _, err := r.p.Process(context.Background(), scheduled("closed", rebootARN, rebootCode, start, event.HealthClosed, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	r.givenBack(t, runner, "after the close")
}

// givenBack checks that the run ends within two passes and the Node is back in service.
func (r *rig) givenBack(t *testing.T, runner *inplace.Runner, when string) {
	t.Helper()
	st := r.run(t, runner, 2)
	n := &corev1.Node{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "node-0"}, n); err != nil {
		t.Fatal(err)
	}
	if !st.Over() || n.Spec.Unschedulable {
		t.Errorf("%s: run %+v, node cordoned %v", when, st, n.Spec.Unschedulable)
	}
}

// TestCloseOfTheFirstStartReachesAMovedRun: a deferral the router had moved into the window
// comes due and begins a reboot in place; a close of the start it was moved from (here an AWS
// Health code the router does not map) is of that maintenance, as it is for the deferral
// (router/record), and ends the run. Before, the run knew its moved start only, and kept the
// node cordoned and emptied for a cancelled maintenance.
func TestCloseOfTheFirstStartReachesAMovedRun(t *testing.T) {
	r, runner, _ := inPlaceRig(t)
	start := now.Add(30 * time.Minute) // the moved start: within deadline minus drain-lead
	first := now.Add(50 * time.Hour)
	up := scheduled("up", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0))
	nc := r.claims(t)[0]
	rec := record.Record{EventID: up.ID, Key: record.Key(up), Kind: up.Kind, State: record.StateDeferred, Match: record.Match(up),
		Until: now, EventTime: up.Time, Event: scheduledBody("up", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0)), MovedFrom: first}
	if d, err := r.p.Redecide(context.Background(), &nc, rec); err != nil || d.Action != policy.ActionRebootInPlace {
		t.Fatalf("the moved deferral, due: %+v %v", d, err)
	}
	r.run(t, runner, 2)
	if _, err := r.p.Process(context.Background(), scheduled("unmapped-closed", rebootARN+"-unmapped", "AWS_EC2_SOMETHING_NEW_SCHEDULED", first, event.HealthClosed, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	r.givenBack(t, runner, "after the close of the first start")
}

// TestSecondMaintenanceWaitsForTheRun: defect 5. Another reboot-type maintenance while a run
// is in progress is held (a deferral), not marked as handled by the run in progress.
func TestSecondMaintenanceWaitsForTheRun(t *testing.T) {
	r, runner, _ := inPlaceRig(t)
	start := now.Add(30 * time.Minute) // within its deadline minus drain-lead: carried out now
	if _, err := r.p.Process(context.Background(), scheduled("a", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	r.run(t, runner, 2)
	second := scheduled("b", rebootARN+"-b", "AWS_EC2_MAINTENANCE_SCHEDULED", start.Add(15*time.Minute), event.HealthUpcoming, instanceID(0))
	res, err := r.p.Process(context.Background(), second)
	if err != nil || res.Actions[policy.ActionDefer] != 1 {
		t.Fatalf("the second maintenance: %+v %v", res, err)
	}
	claim := r.claims(t)[0]
	set := recordtest.Set(t, r.kube, &claim)
	active := set.Active()
	if len(active) != 1 || active[0].EventID != "b" || active[0].Hold != policy.HoldInPlace {
		t.Errorf("records %+v", set.Records)
	}
}

// TestCloseReachesTheUnmanagedDrain: defect 1. With --unmanaged-nodes=cordon-drain, a close of
// the maintenance reaches the drain of the Node; a reboot-type drain carries when it ends.
func TestCloseReachesTheUnmanagedDrain(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1}, 0)
	nd := &nodeDrainer{}
	clk := clocktesting.NewFakeClock(now)
	r.p = New(engine.New(cluster.New(r.kube), nil, engine.WithUnmanaged(policy.UnmanagedCordonDrain)), signal.New(r.kube, r.kube, signal.ModeDeleteNodeClaim, nil, "", r.recorder, clk),
		r.m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), 1).WithNodeDrainer(nd)
	start := now.Add(30 * time.Minute)
	if _, err := r.p.Process(context.Background(), scheduled("up", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	if len(nd.drains) != 1 || !nd.drains[0].Release.Equal(start.Add(inplace.DefaultQuiet)) || nd.drains[0].Key != rebootARN {
		t.Fatalf("begun %+v", nd.drains)
	}
	if _, err := r.p.Process(context.Background(), scheduled("closed", rebootARN, rebootCode, start, event.HealthClosed, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	if len(nd.cancelled) != 1 || nd.cancelled[0] != "node-0/closed" {
		t.Errorf("cancelled %v", nd.cancelled)
	}
}

// TestDrainDecidedOnTheFreshNodeClaim: defect 6. The cache has not caught up with the
// `running` the router recorded a moment ago: a stop from before it, in a drain-on-stop pool,
// is decided again on the NodeClaim as the API server holds it, and nothing is drained.
func TestDrainDecidedOnTheFreshNodeClaim(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1})
	stale := r.claims(t)[0]
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	// The API server's copy: a later `running` recorded.
	fresh := stale.DeepCopy()
	fresh.ResourceVersion = ""
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(fresh).Build()
	recordtest.Seed(t, api, fresh, record.Memory{Running: now.Add(-time.Minute)})
	if m := recordtest.Memory(t, r.kube, &stale); !m.Running.IsZero() {
		t.Fatalf("the cache must not show the API server's memory yet: %+v", m)
	}
	r.p.WithFreshReads(api)
	res, err := r.p.Process(context.Background(), stateChange("stop", instanceID(0), event.StateStopped, now.Add(-3*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Actions[policy.ActionDrain] != 0 || len(r.claims(t)) != 1 || !r.claims(t)[0].DeletionTimestamp.IsZero() {
		t.Errorf("a stop older than the recorded `running` drained the node: %+v", res)
	}
}

// TestForgedSpotWarnings: issue 26, an abuse. Anyone who may send to the intake queue writes
// a Spot interruption warning for every node of an on-demand pool. Taken at their word they
// skip pacing and drain the whole pool at once (625c04b drained all three); checked against
// the nodes' capacity type they are ordinary drains, paced by max-concurrent-drains.
func TestForgedSpotWarnings(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": {policy.AnnotationMaxConcurrentDrains: "1"}}, map[string]int{"web": 3})
	for _, nc := range r.claims(t) {
		nc.Labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeOnDemand
		if err := r.kube.Update(context.Background(), &nc); err != nil {
			t.Fatal(err)
		}
	}
	drained := 0
	for i := range 3 {
		res, err := r.p.Process(context.Background(), spot(fmt.Sprintf("forged-%d", i), instanceID(i)))
		if err != nil {
			t.Fatal(err)
		}
		drained += res.Actions[policy.ActionDrain]
	}
	if drained != 1 {
		t.Errorf("%d of 3 on-demand nodes drained at once by forged Spot warnings, want 1 (paced)", drained)
	}
	if got := testutil.ToFloat64(r.m.Implausible.WithLabelValues(string(event.KindSpotInterruption))); got != 3 {
		t.Errorf("implausible counted %v, want 3", got)
	}
}

// TestForgedStateChanges: issue 26 item 2, an abuse. Anyone who may send to the intake queue
// writes a `shutting-down` state change for every node of a pool. Taken at their word they
// skip pacing and drain the whole pool at once; confirmed with EC2, which shows the instances
// running, they are ordinary drains, paced by max-concurrent-drains.
func TestForgedStateChanges(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": {policy.AnnotationMaxConcurrentDrains: "1"}}, map[string]int{"web": 3})
	srv, client := harness.NewEC2InstanceStatus(t)
	for i := range 3 {
		srv.Add(instanceID(i), &harness.Instance{State: "running"})
	}
	r.p.WithStateConfirmation(client)
	drained := 0
	for i := range 3 {
		res, err := r.p.Process(context.Background(), stateChange(fmt.Sprintf("forged-%d", i), instanceID(i), event.StateShuttingDown, now))
		if err != nil {
			t.Fatal(err)
		}
		drained += res.Actions[policy.ActionDrain]
	}
	if drained != 1 {
		t.Errorf("%d of 3 running nodes drained at once by forged shutting-down state changes, want 1 (paced)", drained)
	}
	if got := testutil.ToFloat64(r.m.Implausible.WithLabelValues(string(event.KindStateChange))); got != 3 {
		t.Errorf("implausible counted %v, want 3", got)
	}
}

// TestUrgentDrainBreaker: issue 26 item 2, an abuse the EC2 checks cannot catch. Anyone who may
// send to the intake queue writes a Spot interruption warning for every node of a Spot pool:
// plausible (the nodes are Spot), and EC2 shows nothing to contradict them. Taken at their
// word they drain the whole pool at once; with the pool's urgent-drain breaker at 20% (2 of
// 10 nodes within a minute), the third and later are held, with a Warning on the NodePool and
// the gate-holds metric, and decided again once the minute has passed. A pool without the
// breaker drains every one (a genuine reclaim of many nodes at once).
func TestUrgentDrainBreaker(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationUrgentDrainMax: "20%"}, "web": nil}, map[string]int{"kafka": 10, "web": 5})
	for _, nc := range r.claims(t) {
		nc.Labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeSpot
		if err := r.kube.Update(context.Background(), &nc); err != nil {
			t.Fatal(err)
		}
	}
	drained := map[string]int{}
	for i := range 15 {
		pool := "kafka"
		if i >= 10 {
			pool = "web"
		}
		res, err := r.p.Process(context.Background(), spot(fmt.Sprintf("storm-%d", i), instanceID(i)))
		if err != nil {
			t.Fatal(err)
		}
		drained[pool] += res.Actions[policy.ActionDrain]
	}
	if drained["kafka"] != 2 || drained["web"] != 5 {
		t.Fatalf("drained %v at once by a storm of Spot warnings, want kafka 2 (its breaker), web 5 (none)", drained)
	}
	if got := testutil.ToFloat64(r.m.GateHolds.WithLabelValues(string(policy.HoldUrgentBreaker))); got != 8 {
		t.Errorf("gate holds{urgent-breaker} %v, want 8", got)
	}
	warned := false
	for _, e := range drainEvents(r.recorder) {
		warned = warned || (strings.Contains(e, "Warning HealthRouterUrgentDrainsHeld") && strings.Contains(e, "2 of 10 nodes drained for urgent events"))
	}
	if !warned {
		t.Error("no Warning on the NodePool")
	}
	var held *karpv1.NodeClaim
	for _, nc := range r.claims(t) {
		if rs := recordtest.Records(t, r.kube, &nc); len(rs) == 1 && rs[0].Hold == policy.HoldUrgentBreaker {
			if !rs[0].Until.Equal(now.Add(policy.UrgentRecheck)) {
				t.Errorf("held until %s, want %s", rs[0].Until, now.Add(policy.UrgentRecheck))
			}
			held = nc.DeepCopy()
		}
	}
	if held == nil {
		t.Fatal("no deferral held by the breaker")
	}
	// Within the minute: held again. Past it: the breaker has closed, and the drain goes.
	r.p.clock.(*clocktesting.FakeClock).Step(policy.UrgentRecheck)
	if d, err := r.p.Redecide(context.Background(), held, recordtest.Records(t, r.kube, held)[0]); err != nil || d.Hold != policy.HoldUrgentBreaker {
		t.Errorf("within the minute: %s %s (%v), want held", d.Action, d.Hold, err)
	}
	r.p.clock.(*clocktesting.FakeClock).Step(policy.UrgentWindow)
	if d, err := r.p.Redecide(context.Background(), held, recordtest.Records(t, r.kube, held)[0]); err != nil || d.Action != policy.ActionDrain {
		t.Errorf("past the minute: %s %s (%v), want a drain", d.Action, d.Hold, err)
	}
}

// TestUrgentDrainBreakerConcurrent: urgent warnings decided at once (concurrent workers) never
// pass the breaker: deciding and noting an urgent drain happen under the pool's lock.
func TestUrgentDrainBreakerConcurrent(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationUrgentDrainMax: "2"}}, map[string]int{"kafka": 10})
	var wg sync.WaitGroup
	var mu sync.Mutex
	drained := 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.p.Process(context.Background(), spot(fmt.Sprintf("storm-%d", i), instanceID(i)))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			drained += res.Actions[policy.ActionDrain]
			mu.Unlock()
		}()
	}
	wg.Wait()
	if drained != 2 {
		t.Errorf("%d drained by 10 concurrent warnings, want 2", drained)
	}
}

// TestRunsOfARebootInPlaceTurnedOff: a router restarted with --reboot-in-place=false beside a
// run a router with it on began (issue 36, defect 2): the run is still the runner's to end, and
// a close still reaches it (the node back in service, not cordoned for good); a new
// reboot-type event replaces the node instead of beginning a run.
func TestRunsOfARebootInPlaceTurnedOff(t *testing.T) {
	r, runner, clk := inPlaceRig(t)
	start := now.Add(30 * time.Minute)
	if res, err := r.p.Process(context.Background(), scheduled("up", rebootARN, rebootCode, start, event.HealthUpcoming, instanceID(0))); err != nil || res.Actions[policy.ActionRebootInPlace] != 1 {
		t.Fatalf("upcoming: %+v %v", res, err)
	}
	if st := r.run(t, runner, 3); st.Step != inplace.StepAwait {
		t.Fatalf("the run: %+v", st)
	}
	// The restart, with the flag off: the same runner (its state is on the NodeClaim), held only.
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sig := signal.New(r.kube, r.kube, signal.ModeDeleteNodeClaim, nil, "", r.recorder, clk)
	r.p = New(engine.New(cluster.New(r.kube), nil), sig, r.m, nil, clk, log, 1).WithInPlaceHeld(runner).WithFreshReads(r.kube)
	if _, err := r.p.Process(context.Background(), scheduled("closed", rebootARN, rebootCode, start, event.HealthClosed, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	r.givenBack(t, runner, "after the close, with reboot-in-place off")
	// A new maintenance: no run begins; the node is replaced, and the decision says why.
	var d policy.Decision
	if _, _, err := r.p.instance(context.Background(), scheduled("again", rebootARN+"-2", rebootCode, start.Add(time.Minute), event.HealthUpcoming, instanceID(0)), instanceID(0), newSummary(false), "", &d); err != nil {
		t.Fatal(err)
	}
	if d.Action != policy.ActionDrain || !strings.Contains(strings.Join(d.Warnings, "|"), "reboot-in-place is off") {
		t.Errorf("a new reboot-type event with reboot-in-place off: %s %q", d.Action, d.Warnings)
	}
}
