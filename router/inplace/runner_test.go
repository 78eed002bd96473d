package inplace

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/awslabs/operatorpkg/status"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
)

const (
	claimName = "default-x7k2p"
	nodeName  = "ip-10-0-0-1.eu-west-1.compute.internal"
	instance  = "i-0123456789abcdef0"
	// the router's own marks on the Node (router/upcoming): a run must leave them alone.
	upcomingTaint = "healthrouter.io/maintenance-upcoming"
	upcomingNote  = "healthrouter.io/maintenance"
)

// scheduled returns a scheduled event of typ for the instance, starting at start.
func scheduled(id string, typ event.ScheduledType, at time.Time) event.Event {
	return event.Event{ID: id, Kind: event.KindScheduledChange, Source: "aws.health", Instances: []string{instance}, Deadline: at,
		Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/" + id, TypeCode: "AWS_EC2_" + string(typ), Category: "scheduledChange",
			Status: event.HealthUpcoming, Scheduled: typ, Start: at}}
}

// fakeEvictor answers each round with the next of its scripted results (the last one
// repeats).
type fakeEvictor struct {
	rounds    []evictResult
	calls     int
	deadlines []time.Time
}

type evictResult struct {
	left    int
	refused map[string]string
	err     error
}

func (f *fakeEvictor) Evict(_ context.Context, node string, deadline time.Time) (int, map[string]string, error) {
	if node != nodeName {
		return 0, nil, errors.New("evicting the wrong node " + node)
	}
	f.deadlines = append(f.deadlines, deadline)
	r := evictResult{}
	if len(f.rounds) > 0 {
		r = f.rounds[min(f.calls, len(f.rounds)-1)]
	}
	f.calls++
	return r.left, r.refused, r.err
}

// fakeEC2 fails its first failures RebootInstances calls, and shows the scheduled events of
// shown for the instance (the rig's begin adds the event it begins with: EC2 shows the
// maintenance the run is for); describeErr fails DescribeInstanceStatus.
type fakeEC2 struct {
	failures    int
	calls       [][]string
	shown       []ec2types.InstanceStatusEvent
	describeErr error
	described   int
}

func (f *fakeEC2) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	f.described++
	if f.describeErr != nil {
		return nil, f.describeErr
	}
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		if id == instance {
			out.InstanceStatuses = append(out.InstanceStatuses, ec2types.InstanceStatus{InstanceId: aws.String(id), Events: f.shown,
				InstanceState: &ec2types.InstanceState{Name: ec2types.InstanceStateNameRunning}})
		}
	}
	return out, nil
}

// show has EC2 show ev's maintenance for the instance, as EC2 holds a scheduled event.
func (f *fakeEC2) show(ev event.Event) {
	if ev.Health == nil {
		return
	}
	f.shown = append(f.shown, ec2types.InstanceStatusEvent{InstanceEventId: aws.String("instance-event-" + ev.ID), Code: ec2types.EventCode(ev.Health.Scheduled),
		Description: aws.String("The instance is scheduled for " + string(ev.Health.Scheduled)), NotBefore: aws.Time(ev.Deadline)})
}

func (f *fakeEC2) RebootInstances(_ context.Context, in *ec2.RebootInstancesInput, _ ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error) {
	f.calls = append(f.calls, in.InstanceIds)
	if f.failures > 0 {
		f.failures--
		return nil, errors.New("api error UnauthorizedOperation: You are not authorized to perform this operation.")
	}
	return &ec2.RebootInstancesOutput{}, nil
}

// fallbacks records the calls of Fallback.
type fallbacks struct {
	whys []string
	err  error
}

func (f *fallbacks) call(_ context.Context, nc *karpv1.NodeClaim, st State, why string) error {
	if nc.Name != claimName || st.EventID == "" {
		return errors.New("fallback called with the wrong nodeclaim")
	}
	f.whys = append(f.whys, why)
	return f.err
}

// rig is a Runner over a fake API server holding one NodeClaim and its Node.
type rig struct {
	t        *testing.T
	ctx      context.Context
	kube     client.Client
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	evictor  *fakeEvictor
	ec2      *fakeEC2
	fallback *fallbacks
	reg      *prometheus.Registry
	runner   *Runner
	funcs    interceptor.Funcs
}

type rigOpts struct {
	claimProtected bool // the NodeClaim carries do-not-disrupt before the run
	nodeCordoned   bool // the Node is cordoned before the run
	nodeProtected  bool // the Node carries do-not-disrupt before the run
	noRepair       bool // the NodeClaim and the Node carry do-not-repair before the run
	funcs          interceptor.Funcs
}

func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: claimName, Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}, Annotations: map[string]string{}},
		Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + instance, NodeName: nodeName}}
	if o.claimProtected {
		claim.Annotations[karpv1.DoNotDisruptAnnotationKey] = "true"
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid-1", Annotations: map[string]string{upcomingNote: `{"kind":"scheduled-change"}`}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + instance, Unschedulable: o.nodeCordoned,
			Taints: []corev1.Taint{{Key: upcomingTaint, Value: "scheduled-change", Effect: corev1.TaintEffectPreferNoSchedule}}},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: "boot-1"},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(-24 * time.Hour))}}}}
	if o.nodeProtected {
		node.Annotations[karpv1.DoNotDisruptAnnotationKey] = "true"
	}
	if o.noRepair {
		claim.Annotations[karpv1.DoNotRepairAnnotationKey] = "true"
		node.Annotations[karpv1.DoNotRepairAnnotationKey] = "true"
	}
	r := &rig{t: t, ctx: context.Background(), clock: clocktesting.NewFakeClock(t0), recorder: events.NewFakeRecorder(100),
		evictor: &fakeEvictor{}, ec2: &fakeEC2{}, fallback: &fallbacks{}, funcs: o.funcs}
	r.kube = fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim, node).WithInterceptorFuncs(o.funcs).Build()
	r.runner = r.newRunner()
	return r
}

// newRunner is a Runner over the rig's API server: a restarted router, with new metrics.
func (r *rig) newRunner() *Runner {
	r.reg = prometheus.NewRegistry()
	return New(r.kube, r.kube, r.evictor, r.ec2, r.clock, r.recorder, slog.New(slog.NewTextHandler(io.Discard, nil)), r.reg, r.fallback.call, Options{})
}

func (r *rig) begin(ev event.Event) bool {
	r.t.Helper()
	r.ec2.show(ev)
	already, err := r.runner.Begin(r.ctx, r.claim(), ev)
	if err != nil {
		r.t.Fatalf("Begin: %v", err)
	}
	return already
}

// pass runs one Reconcile and returns its wait.
func (r *rig) pass() time.Duration {
	r.t.Helper()
	res, err := r.runner.Reconcile(r.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: claimName}})
	if err != nil {
		r.t.Fatalf("Reconcile: %v", err)
	}
	return res.RequeueAfter
}

// passTo runs passes until the run is at step, at most 10.
func (r *rig) passTo(step Step) {
	r.t.Helper()
	for range 10 {
		if r.state().Step == step {
			return
		}
		r.pass()
	}
	r.t.Fatalf("the run did not reach %s: %s", step, encode(r.state()))
}

// mem is the router's memory of the rig's NodeClaim, as the API server holds it.
func (r *rig) mem() record.Memory {
	r.t.Helper()
	return recordtest.Memory(r.t, r.kube, r.claim())
}

// seedRun writes v as the NodeClaim's run, as a router would have.
func (r *rig) seedRun(v string) {
	r.t.Helper()
	recordtest.Seed(r.t, r.kube, r.claim(), record.Memory{Run: json.RawMessage(v)})
}

func (r *rig) claim() *karpv1.NodeClaim {
	r.t.Helper()
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(r.ctx, client.ObjectKey{Name: claimName}, nc); err != nil {
		r.t.Fatal(err)
	}
	return nc
}

func (r *rig) node() *corev1.Node {
	r.t.Helper()
	n := &corev1.Node{}
	if err := r.kube.Get(r.ctx, client.ObjectKey{Name: nodeName}, n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *rig) state() State {
	r.t.Helper()
	st, ok, err := Read(r.mem())
	if err != nil || !ok {
		r.t.Fatalf("Read: ok=%v err=%v", ok, err)
	}
	return st
}

// kubelet sets the Node's Ready condition and boot ID, as the kubelet (or the node
// lifecycle controller) would.
func (r *rig) kubelet(status corev1.ConditionStatus, since time.Time, boot string) {
	r.t.Helper()
	n := r.node()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, LastTransitionTime: metav1.NewTime(since)}}
	n.Status.NodeInfo.BootID = boot
	if err := r.kube.Status().Update(r.ctx, n); err != nil {
		r.t.Fatal(err)
	}
}

// events returns the Events posted since the last call.
func (r *rig) events() []string {
	var out []string
	for {
		select {
		case e := <-r.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// expectEvents checks that the Events since the last call are, in order, of these reasons.
func (r *rig) expectEvents(what string, reasons ...string) []string {
	r.t.Helper()
	evs := r.events()
	if len(evs) != len(reasons) {
		r.t.Errorf("%s: events %q, want reasons %v", what, evs, reasons)
		return evs
	}
	for i, e := range evs {
		if f := strings.Fields(e); len(f) < 2 || f[1] != reasons[i] {
			r.t.Errorf("%s: event %d is %q, want %s", what, i, e, reasons[i])
		}
	}
	return evs
}

// protection reports the NodeClaim's and the Node's do-not-disrupt, and the Node's cordon.
func (r *rig) protection() (claim, node, cordoned bool) {
	return r.claim().Annotations[karpv1.DoNotDisruptAnnotationKey] == "true", r.node().Annotations[karpv1.DoNotDisruptAnnotationKey] == "true", r.node().Spec.Unschedulable
}

// repairVeto reports the NodeClaim's and the Node's do-not-repair.
func (r *rig) repairVeto() (claim, node bool) {
	return r.claim().Annotations[karpv1.DoNotRepairAnnotationKey] == "true", r.node().Annotations[karpv1.DoNotRepairAnnotationKey] == "true"
}

// karpenterRebooting sets the NodeClaim's Rebooting condition, as Karpenter's node repair
// (RebootForRepair) and its reboot controller do.
func (r *rig) karpenterRebooting(on bool) {
	r.t.Helper()
	nc := r.claim()
	cs, reason := metav1.ConditionTrue, karpv1.RebootReasonRequested
	if !on {
		cs, reason = metav1.ConditionFalse, karpv1.RebootReasonSucceeded
	}
	nc.Status.Conditions = []status.Condition{{Type: karpv1.ConditionTypeRebooting, Status: cs, Reason: reason, Message: "rebooting for AcceleratedHardwareReady/XID48",
		LastTransitionTime: metav1.NewTime(r.clock.Now())}}
	// The fake API server keeps a NodeClaim's status without a subresource.
	if err := r.kube.Update(r.ctx, nc); err != nil {
		r.t.Fatal(err)
	}
}

// checkMarksKept fails when the run changed the router's other marks on the Node.
func (r *rig) checkMarksKept() {
	r.t.Helper()
	n := r.node()
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != upcomingTaint || n.Annotations[upcomingNote] == "" {
		r.t.Errorf("the router's marks on the node changed: taints %v, annotations %v", n.Spec.Taints, n.Annotations)
	}
}

func (r *rig) metric(outcome string) float64 {
	return testutil.ToFloat64(r.runner.runs.WithLabelValues(outcome))
}

func TestBegin(t *testing.T) {
	r := newRig(t, rigOpts{})
	ev := scheduled("ev-1", event.ScheduledInstanceReboot, start)
	if r.begin(ev) {
		t.Fatal("a first Begin said already")
	}
	st := r.state()
	want := State{Version: Version, EventID: "ev-1", EventARN: ev.Health.EventARN, Type: event.ScheduledInstanceReboot, Instance: instance, Node: nodeName,
		Start: start, Step: StepCordon, Began: t0, StepSince: t0, Protected: true, RepairVetoed: true}
	if encode(st) != encode(want) {
		t.Errorf("run:\n got %s\nwant %s", encode(st), encode(want))
	}
	if claim, node, cordoned := r.protection(); !claim || node || cordoned {
		t.Errorf("after Begin: nodeclaim protected %v (want true), node protected %v and cordoned %v (want neither yet)", claim, node, cordoned)
	}
	evs := r.expectEvents("Begin", ReasonBegun, ReasonBegun)
	if len(evs) == 0 || !strings.Contains(evs[0], "RebootInstances") || !strings.Contains(evs[0], "AWS acts at 2026-03-01T14:00:00Z") {
		t.Errorf("Begin's Event: %q", evs)
	}
	if got := testutil.ToFloat64(r.runner.inProgress); got != 1 {
		t.Errorf("runs in progress: %v", got)
	}

	rv := r.claim().ResourceVersion
	if !r.begin(ev) {
		t.Errorf("Begin(%s) again with its run in progress: not already", ev.ID)
	}
	// Another maintenance while a run is in progress is not handled by it: one run at a time,
	// and the caller holds the event until the run ends (issue 25, defect 5).
	if _, err := r.runner.Begin(r.ctx, r.claim(), scheduled("ev-2", event.ScheduledSystemReboot, start.Add(time.Hour))); !errors.Is(err, ErrBusy) {
		t.Errorf("Begin of another maintenance with a run in progress: %v, want ErrBusy", err)
	}
	if r.claim().ResourceVersion != rv {
		t.Error("a repeated Begin wrote")
	}
	// The same event, rescheduled: the new start is recorded.
	moved := scheduled("ev-1", event.ScheduledInstanceReboot, start.Add(3*time.Hour))
	moved.Health.End = start.Add(5 * time.Hour)
	if !r.begin(moved) {
		t.Error("Begin of the rescheduled event: not already")
	}
	if st := r.state(); !st.Start.Equal(start.Add(3*time.Hour)) || !st.End.Equal(start.Add(5*time.Hour)) || st.Step != StepCordon {
		t.Errorf("after the reschedule: %s", encode(st))
	}
	r.expectEvents("repeated Begins")

	for _, bad := range []struct {
		name string
		ev   event.Event
		want string
	}{
		{"instance-stop: AWS does not keep the instance", scheduled("ev-3", event.ScheduledInstanceStop, start), "does not keep the instance"},
		{"closed", func() event.Event {
			e := scheduled("ev-4", event.ScheduledSystemReboot, start)
			e.Health.Status = event.HealthClosed
			return e
		}(), "closed"},
		{"no start", scheduled("ev-5", event.ScheduledSystemReboot, time.Time{}), "no start"},
		{"not a scheduled change", event.Event{ID: "ev-6", Kind: event.KindSpotInterruption}, "not a scheduled change"},
	} {
		if _, err := r.runner.Begin(r.ctx, r.claim(), bad.ev); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Begin, %s: %v, want an error with %q", bad.name, err, bad.want)
		}
	}
}

func TestBeginRefuses(t *testing.T) {
	ev := scheduled("ev-1", event.ScheduledSystemReboot, start)
	t.Run("an unreadable run is not overwritten", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		r.seedRun(`{"version":2,"event_id":"x","step":"teleport"}`)
		before := string(r.mem().Run)
		if _, err := r.runner.Begin(r.ctx, r.claim(), ev); err == nil || !strings.Contains(err.Error(), "newer router") {
			t.Errorf("Begin over a newer router's run: %v", err)
		}
		if string(r.mem().Run) != before {
			t.Error("overwritten")
		}
		// Reconcile leaves it alone too.
		r.pass()
		if string(r.mem().Run) != before || r.node().Spec.Unschedulable {
			t.Error("Reconcile acted on an unreadable run")
		}
	})
	t.Run("an event for another instance", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		other := scheduled("ev-7", event.ScheduledSystemReboot, start)
		other.Instances = []string{"i-0fffffffffffffff0"}
		if _, err := r.runner.Begin(r.ctx, r.claim(), other); err == nil || !strings.Contains(err.Error(), "does not name") {
			t.Errorf("Begin: %v", err)
		}
	})
	t.Run("a nodeclaim without a node", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		nc := r.claim()
		nc.Status.NodeName = ""
		if err := r.kube.Update(r.ctx, nc); err != nil {
			t.Fatal(err)
		}
		if _, err := r.runner.Begin(r.ctx, nc, ev); err == nil || !strings.Contains(err.Error(), "no node yet") {
			t.Errorf("Begin: %v", err)
		}
	})
	t.Run("a nodeclaim being deleted", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		nc := r.claim()
		nc.Finalizers = []string{karpv1.TerminationFinalizer}
		if err := r.kube.Update(r.ctx, nc); err != nil {
			t.Fatal(err)
		}
		if err := r.kube.Delete(r.ctx, nc); err != nil {
			t.Fatal(err)
		}
		if _, err := r.runner.Begin(r.ctx, nc, ev); err == nil || !strings.Contains(err.Error(), "being deleted") {
			t.Errorf("Begin: %v", err)
		}
	})
	t.Run("a run that ended is replaced by another event's, not by its own", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		r.seedRun(encode(with(run(event.ScheduledSystemReboot, StepDone), func(s *State) { s.EventID, s.Outcome = "ev-1", "done" })))
		if !r.begin(ev) {
			t.Error("Begin of the event whose run is done: not already")
		}
		if r.begin(scheduled("ev-9", event.ScheduledInstanceReboot, start.Add(48*time.Hour))) {
			t.Error("Begin of a new event after a run ended: already")
		}
		if st := r.state(); st.EventID != "ev-9" || st.Step != StepCordon {
			t.Errorf("the new run: %s", encode(st))
		}
	})
}

// TestInstanceReboot: the whole run: cordon, evictions (a budget refuses once), the
// router's reboot, NotReady, Ready with a new boot, uncordon; protection added and removed;
// the router's other marks on the Node untouched.
func TestInstanceReboot(t *testing.T) {
	r := newRig(t, rigOpts{})
	refused := map[string]string{"kafka/kafka-0": "Cannot evict pod as it would violate the pod's disruption budget."}
	r.evictor.rounds = []evictResult{{left: 1, refused: refused}, {}}
	r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
	r.events()

	r.pass() // cordon
	if st := r.state(); st.Step != StepEvict || !st.Cordoned || !st.NodeProtected || !st.Protected {
		t.Errorf("after the cordon: %s", encode(st))
	}
	if claim, node, cordoned := r.protection(); !claim || !node || !cordoned {
		t.Errorf("after the cordon: nodeclaim protected %v, node protected %v, cordoned %v; want all", claim, node, cordoned)
	}
	r.checkMarksKept()

	if wait := r.pass(); wait != DefaultEvictEvery { // a budget refuses
		t.Errorf("wait after a refused round: %s", wait)
	}
	if st := r.state(); st.Step != StepEvict || st.Attempts != 1 || !strings.Contains(st.LastError, "kafka/kafka-0") {
		t.Errorf("after a refused round: %s", encode(st))
	}
	if len(r.evictor.deadlines) != 1 || !r.evictor.deadlines[0].Equal(t0.Add(DefaultEvictRound)) {
		t.Errorf("the round's deadline: %v, want now + EvictRound", r.evictor.deadlines)
	}
	r.clock.Step(DefaultEvictEvery)
	r.pass() // evicted
	if st := r.state(); st.Step != StepReboot || st.Attempts != 0 {
		t.Errorf("after the evictions: %s", encode(st))
	}
	if len(r.ec2.calls) != 0 {
		t.Error("rebooted before the reboot step")
	}
	r.clock.Step(time.Second)
	rebootAt := r.clock.Now()
	r.pass() // reboot
	if len(r.ec2.calls) != 1 || len(r.ec2.calls[0]) != 1 || r.ec2.calls[0][0] != instance {
		t.Errorf("RebootInstances calls: %v", r.ec2.calls)
	}
	if st := r.state(); st.Step != StepAwait || !st.Rebooted.Equal(rebootAt) || st.BootID != "boot-1" {
		t.Errorf("after the reboot: %s", encode(st))
	}
	r.expectEvents("reboot", ReasonRebooting, ReasonRebooting)

	r.clock.Step(10 * time.Second)
	if wait := r.pass(); wait != DefaultPoll || r.state().Step != StepAwait {
		t.Errorf("Ready, no sign of the reboot yet: step %s, wait %s", r.state().Step, wait)
	}
	r.kubelet(corev1.ConditionFalse, r.clock.Now(), "boot-1")
	r.clock.Step(10 * time.Second)
	r.pass()
	if st := r.state(); st.Step != StepReady || !st.NotReadySince.Equal(r.clock.Now()) {
		t.Errorf("NotReady: %s", encode(st))
	}
	r.kubelet(corev1.ConditionTrue, r.clock.Now(), "boot-2")
	r.clock.Step(10 * time.Second)
	r.pass()
	if st := r.state(); st.Step != StepUncordon {
		t.Errorf("Ready again: %s", encode(st))
	}
	if got := testutil.ToFloat64(r.runner.inProgress); got != 1 {
		t.Errorf("runs in progress: %v", got)
	}
	r.pass()
	st := r.state()
	if st.Step != StepDone || st.Outcome != "done" {
		t.Errorf("after the uncordon: %s", encode(st))
	}
	if claim, node, cordoned := r.protection(); claim || node || cordoned {
		t.Errorf("after the run: nodeclaim protected %v, node protected %v, cordoned %v; want none", claim, node, cordoned)
	}
	if _, ok := r.node().Annotations[Annotation]; ok {
		t.Error("the node's mark was left")
	}
	r.checkMarksKept()
	r.expectEvents("done", ReasonDone, ReasonDone)
	if r.metric(OutcomeDone) != 1 || r.metric(OutcomeFallback) != 0 || testutil.ToFloat64(r.runner.inProgress) != 0 {
		t.Errorf("metrics: done %v, fallback %v, in progress %v", r.metric(OutcomeDone), r.metric(OutcomeFallback), testutil.ToFloat64(r.runner.inProgress))
	}
	if n, err := testutil.GatherAndCount(r.reg, metrics.InPlaceRuns, metrics.InPlaceInProgress); err != nil || n != 3 {
		t.Errorf("registered series: %d, %v", n, err)
	}
	// Over: a pass does nothing.
	rv := r.claim().ResourceVersion
	if wait := r.pass(); wait != 0 || r.claim().ResourceVersion != rv || len(r.ec2.calls) != 1 {
		t.Errorf("a pass over an ended run: wait %s, wrote %v", wait, r.claim().ResourceVersion != rv)
	}
}

// TestRepairVeto: the run puts karpenter.sh/do-not-repair on the NodeClaim at Begin and on
// the Node at the cordon (Karpenter v1.15's node repair, a voluntary disruption that
// do-not-disrupt does not stop, reads a registered node's), as it does do-not-disrupt, and
// removes each where it added it: when the run is done, and when it falls back (the node is
// then Karpenter's to replace); a veto that was there before the run stays.
func TestRepairVeto(t *testing.T) {
	for _, tc := range []struct {
		name     string
		before   bool // do-not-repair on both before the run
		fallBack bool
	}{
		{name: "added and removed when done"},
		{name: "added and removed when the run falls back", fallBack: true},
		{name: "there before: kept", before: true},
		{name: "there before, fallback: kept", before: true, fallBack: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpts{noRepair: tc.before})
			r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
			if claim, node := r.repairVeto(); !claim || node != tc.before {
				t.Errorf("after Begin: do-not-repair on the nodeclaim %v (want true), on the node %v (want %v)", claim, node, tc.before)
			}
			if st := r.state(); st.RepairVetoed == tc.before {
				t.Errorf("after Begin: RepairVetoed %v with do-not-repair there before: %v", st.RepairVetoed, tc.before)
			}
			r.pass() // cordon
			if claim, node := r.repairVeto(); !claim || !node {
				t.Errorf("after the cordon: do-not-repair on the nodeclaim %v, on the node %v; want both", claim, node)
			}
			if st := r.state(); st.NodeRepairVetoed == tc.before {
				t.Errorf("after the cordon: NodeRepairVetoed %v with do-not-repair there before: %v", st.NodeRepairVetoed, tc.before)
			}
			r.passTo(StepAwait)
			r.clock.Step(time.Minute)
			if tc.fallBack {
				r.kubelet(corev1.ConditionFalse, r.clock.Now(), "boot-1")
				r.passTo(StepReady)
				r.clock.Step(DefaultReadyTimeout)
				r.passTo(StepFallback)
				r.pass()
				if st := r.state(); !strings.HasPrefix(st.Outcome, "fallback") {
					t.Fatalf("outcome %q, want a fallback", st.Outcome)
				}
			} else {
				r.kubelet(corev1.ConditionTrue, r.clock.Now(), "boot-2")
				r.passTo(StepDone)
			}
			if claim, node := r.repairVeto(); claim != tc.before || node != tc.before {
				t.Errorf("after the run: do-not-repair on the nodeclaim %v, on the node %v; want %v, as before", claim, node, tc.before)
			}
		})
	}
}

// TestUndo: UndoNode and UndoClaim (router/handback's way out of a run, and the runner's)
// remove do-not-repair exactly where the run added it, as they do do-not-disrupt, from what
// the run's record says; the Node's mark, which anyone with patch nodes writes, is removed
// and never read (on 1dd416f a forged mark had an operator's cordon and vetoes undone).
func TestUndo(t *testing.T) {
	vetoes := func() map[string]string {
		return map[string]string{karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}
	}
	recorded := run(event.ScheduledSystemReboot, StepEvict)
	recorded.NodeUID, recorded.NodeProtected, recorded.NodeRepairVetoed = "uid-1", true, true // the run did not cordon: it was cordoned
	aheadOnly := run(event.ScheduledSystemReboot, StepCordon)
	aheadOnly.NodeChanges = &NodeChanges{UID: "uid-1", Cordoned: true, Protected: true}
	forged := encodeMark(nodeMark{EventID: "ev-1", Cordoned: true, Protected: true, RepairVetoed: true})
	tests := []struct {
		name         string
		st           State
		annotations  map[string]string
		uid          string
		uncordon     bool
		wantVetoes   []string // left on the Node
		wantCordoned bool
	}{
		{"the recorded cordon step: both vetoes undone, the cordon (not the run's) kept", recorded, vetoes(), "uid-1", true, nil, true},
		{"a forged mark saying the run did all: only what the record says is undone", recorded, map[string]string{Annotation: forged, karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}, "uid-1", true, nil, true},
		{"a forged mark with no run: nothing undone, the mark removed", State{}, map[string]string{Annotation: forged, karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}, "uid-1", true,
			[]string{karpv1.DoNotDisruptAnnotationKey, karpv1.DoNotRepairAnnotationKey}, true},
		{"the write-ahead only (the pass stopped after the patch): undone as it says", aheadOnly, vetoes(), "uid-1", true, []string{karpv1.DoNotRepairAnnotationKey}, false},
		{"without uncordon the cordon stays", aheadOnly, vetoes(), "uid-1", false, []string{karpv1.DoNotRepairAnnotationKey}, true},
		{"a Node registered again under the name: nothing undone", recorded, vetoes(), "uid-2", true, []string{karpv1.DoNotDisruptAnnotationKey, karpv1.DoNotRepairAnnotationKey}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{UID: types.UID(tt.uid), Annotations: tt.annotations}, Spec: corev1.NodeSpec{Unschedulable: true}}
			UndoNode(n, tt.st, tt.uncordon)
			var left []string
			for _, k := range []string{karpv1.DoNotDisruptAnnotationKey, karpv1.DoNotRepairAnnotationKey} {
				if n.Annotations[k] == "true" {
					left = append(left, k)
				}
			}
			if !slices.Equal(left, tt.wantVetoes) || n.Spec.Unschedulable != tt.wantCordoned {
				t.Errorf("vetoes left %v, cordoned %v; want %v, %v", left, n.Spec.Unschedulable, tt.wantVetoes, tt.wantCordoned)
			}
			if _, ok := n.Annotations[Annotation]; ok {
				t.Error("the mark is still there")
			}
		})
	}
	st := run(event.ScheduledSystemReboot, StepEvict)
	st.RepairVetoed = true
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}}}
	if !UndoClaim(nc, st) || len(nc.Annotations) != 1 || nc.Annotations[karpv1.DoNotDisruptAnnotationKey] != "true" {
		t.Errorf("UndoClaim of a run that added do-not-repair only: %v", nc.Annotations)
	}
}

// TestKarpenterRebooting: a NodeClaim Karpenter is rebooting (its Rebooting condition, set by
// v1.15's node repair with RebootForRepair) is not rebooted by the router as well: Begin
// fails with ErrBusy and writes nothing (the pipeline holds the event and decides it again);
// a run that has not rebooted holds while the condition is true, neither cordoning, evicting
// nor rebooting, and goes on once it is false.
func TestKarpenterRebooting(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.karpenterRebooting(true)
	ev := scheduled("ev-1", event.ScheduledInstanceReboot, start)
	r.ec2.show(ev)
	rv := r.claim().ResourceVersion
	if _, err := r.runner.Begin(r.ctx, r.claim(), ev); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "Karpenter is rebooting") {
		t.Fatalf("Begin on a NodeClaim Karpenter reboots: %v, want ErrBusy naming Karpenter's reboot", err)
	}
	if r.claim().ResourceVersion != rv {
		t.Error("Begin wrote on a NodeClaim Karpenter reboots")
	}
	r.karpenterRebooting(false)
	r.begin(ev)
	r.events()

	// Karpenter commits a reboot before the run cordons (the Node's veto comes with the
	// cordon), and again before the router's reboot.
	for _, step := range []Step{StepCordon, StepReboot} {
		r.passTo(step)
		r.karpenterRebooting(true)
		for range 3 {
			if wait := r.pass(); wait != DefaultPoll {
				t.Errorf("%s held: wait %v, want %v", step, wait, DefaultPoll)
			}
		}
		st := r.state()
		if st.Step != step || st.LastError != heldNote || !st.RebootAsked.IsZero() {
			t.Errorf("%s while Karpenter reboots: %s", step, encode(st))
		}
		if step == StepCordon && r.node().Spec.Unschedulable {
			t.Error("the run cordoned while Karpenter reboots")
		}
		if len(r.ec2.calls) != 0 {
			t.Errorf("RebootInstances called while Karpenter reboots: %v", r.ec2.calls)
		}
		r.karpenterRebooting(false)
		r.pass()
		if st := r.state(); st.Step == step || st.LastError == heldNote {
			t.Errorf("%s after Karpenter's reboot ended: %s", step, encode(st))
		}
	}
	if len(r.ec2.calls) != 1 {
		t.Errorf("RebootInstances calls: %v, want one after Karpenter's reboot ended", r.ec2.calls)
	}
}

// TestProtectionLeftAsFound: do-not-disrupt and a cordon that were there before the run
// are there after it.
func TestProtectionLeftAsFound(t *testing.T) {
	r := newRig(t, rigOpts{claimProtected: true, nodeCordoned: true, nodeProtected: true})
	r.begin(scheduled("ev-1", event.ScheduledSystemMaintenance, start))
	if st := r.state(); st.Protected {
		t.Errorf("the run claims a do-not-disrupt it did not add: %s", encode(st))
	}
	r.pass()
	if st := r.state(); st.Cordoned || st.NodeProtected {
		t.Errorf("the run claims a cordon or protection it did not add: %s", encode(st))
	}
	r.passTo(StepAwait)
	r.clock.SetTime(start.Add(DefaultQuiet)) // Ready throughout: no visible effect
	r.passTo(StepDone)
	if st := r.state(); !strings.HasPrefix(st.Outcome, "done: the Node stayed Ready") {
		t.Errorf("outcome %q", st.Outcome)
	}
	if claim, node, cordoned := r.protection(); !claim || !node || !cordoned {
		t.Errorf("after the run: nodeclaim protected %v, node protected %v, cordoned %v; want all, as before", claim, node, cordoned)
	}
}

// TestFallbackNotReady: a system reboot after which the Node stays NotReady: Fallback is
// called, do-not-disrupt removed, the Node left cordoned.
func TestFallbackNotReady(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	r.passTo(StepAwait)
	if wait := r.pass(); wait != start.Sub(t0) {
		t.Errorf("waiting for the start: %s", wait)
	}
	r.clock.SetTime(start.Add(2 * time.Minute))
	r.kubelet(corev1.ConditionUnknown, start.Add(time.Minute), "boot-1")
	r.events()
	r.pass()
	if st := r.state(); st.Step != StepReady {
		t.Fatalf("NotReady after the start: %s", encode(st))
	}
	r.expectEvents("NotReady after the start", ReasonRebooting, ReasonRebooting)
	r.clock.Step(DefaultReadyTimeout)
	r.pass()
	if st := r.state(); st.Step != StepFallback || st.Over() || len(r.fallback.whys) != 0 {
		t.Fatalf("past ReadyTimeout: %s, fallback called %d times", encode(st), len(r.fallback.whys))
	}
	r.pass()
	st := r.state()
	if len(r.fallback.whys) != 1 || !strings.Contains(r.fallback.whys[0], "not Ready again within 15m0s") {
		t.Errorf("fallback calls: %q", r.fallback.whys)
	}
	if !st.Over() || st.Outcome != "fallback: "+r.fallback.whys[0] {
		t.Errorf("after the fallback: %s", encode(st))
	}
	if claim, node, cordoned := r.protection(); claim || node || !cordoned {
		t.Errorf("after the fallback: nodeclaim protected %v, node protected %v (want neither), cordoned %v (want it)", claim, node, cordoned)
	}
	r.checkMarksKept()
	evs := r.expectEvents("fallback", ReasonFallback, ReasonFallback)
	if len(evs) > 0 && !strings.HasPrefix(evs[0], "Warning ") {
		t.Errorf("fallback Event: %q", evs[0])
	}
	if r.metric(OutcomeFallback) != 1 || r.metric(OutcomeDone) != 0 {
		t.Errorf("metrics: done %v, fallback %v", r.metric(OutcomeDone), r.metric(OutcomeFallback))
	}
}

// TestFallbackPodsLeft: pods a budget keeps past start - margin: the node is replaced; a
// failing Fallback is retried.
func TestFallbackPodsLeft(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.evictor.rounds = []evictResult{{left: 2, refused: map[string]string{"kafka/kafka-0": "pdb"}}}
	r.fallback.err = errors.New("the interruption queue is unreachable")
	r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
	r.passTo(StepEvict)
	r.pass()
	r.clock.SetTime(evictBy.Add(-10 * time.Second))
	r.pass()
	if len(r.evictor.deadlines) != 2 || !r.evictor.deadlines[1].Equal(evictBy) {
		t.Errorf("a round near start - margin ends there: %v", r.evictor.deadlines)
	}
	r.clock.SetTime(evictBy)
	r.pass()
	if st := r.state(); st.Step != StepFallback || !strings.Contains(st.Why, "2 pod(s) left") {
		t.Fatalf("%s", encode(st))
	}
	if wait := r.pass(); wait != DefaultRetryMin {
		t.Errorf("a failed fallback is retried after %s, want RetryMin", wait)
	}
	if st := r.state(); st.Over() || st.Attempts != 1 || !strings.Contains(st.LastError, "unreachable") {
		t.Errorf("after a failed fallback: %s", encode(st))
	}
	r.fallback.err = nil
	r.pass()
	if st := r.state(); !st.Over() || len(r.fallback.whys) != 2 || len(r.ec2.calls) != 0 {
		t.Errorf("after the retried fallback: %s; %d calls; %d reboots", encode(st), len(r.fallback.whys), len(r.ec2.calls))
	}
}

// TestRebootLeftToAWS: RebootInstances keeps failing: the run waits for AWS's own reboot at
// the start, and says so once.
func TestRebootLeftToAWS(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.ec2.failures = 100
	r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
	r.passTo(StepReboot)
	r.events()
	for range DefaultRebootAttempts {
		r.pass()
	}
	st := r.state()
	if st.Step != StepAwait || !st.Rebooted.IsZero() || !strings.Contains(st.LastError, "UnauthorizedOperation") || len(r.ec2.calls) != DefaultRebootAttempts {
		t.Fatalf("after %d failed reboots: %s (%d calls)", DefaultRebootAttempts, encode(st), len(r.ec2.calls))
	}
	r.expectEvents("reboot left to AWS", ReasonRebootFailed, ReasonRebootFailed)
	r.clock.SetTime(start.Add(time.Minute))
	r.kubelet(corev1.ConditionTrue, start.Add(30*time.Second), "boot-2")
	r.passTo(StepDone)
	if len(r.ec2.calls) != DefaultRebootAttempts {
		t.Errorf("RebootInstances called again after the run left it to AWS")
	}
}

// TestRestart: a new Runner over the same API server resumes from the annotation: no step
// done twice, the reboot called once.
func TestRestart(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
	r.passTo(StepReboot)
	r.pass()
	r.runner = r.newRunner() // restarted, or another router elected
	r.kubelet(corev1.ConditionTrue, r.clock.Now().Add(time.Second), "boot-2")
	r.clock.Step(time.Minute)
	r.passTo(StepDone)
	if len(r.ec2.calls) != 1 || r.evictor.calls != 1 {
		t.Errorf("after the restart: %d reboots, %d eviction rounds; want 1 and 1", len(r.ec2.calls), r.evictor.calls)
	}
	if claim, node, cordoned := r.protection(); claim || node || cordoned {
		t.Errorf("after the run: nodeclaim protected %v, node protected %v, cordoned %v", claim, node, cordoned)
	}
	// The new runner counted the run it finished.
	if r.metric(OutcomeDone) != 1 {
		t.Errorf("done: %v", r.metric(OutcomeDone))
	}
}

// TestCordonThenStop: the router stops after cordoning the Node and before recording it:
// the next pass knows from the run's write-ahead (NodeChanges, recorded before the patch),
// not from anything on the Node, that the run cordoned it (not that someone else had), so it
// is uncordoned at the end.
func TestCordonThenStop(t *testing.T) {
	fail := false
	updates := 0
	r := newRig(t, rigOpts{funcs: interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*record.HealthRecord); ok && fail {
				if updates++; updates > 1 { // the write-ahead goes through, the step's record fails
					return errors.New("http2: client connection lost")
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	}})
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	fail = true
	if _, err := r.runner.Reconcile(r.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: claimName}}); err == nil {
		t.Fatal("a pass whose record failed: no error")
	}
	if st := r.state(); st.Step != StepCordon {
		t.Fatalf("recorded despite the outage: %s", encode(st))
	}
	if !r.node().Spec.Unschedulable {
		t.Fatal("the node was not cordoned")
	}
	fail = false
	r.runner = r.newRunner()
	r.pass()
	if st := r.state(); st.Step != StepEvict || !st.Cordoned || !st.NodeProtected {
		t.Errorf("resumed: %s: the run's own cordon must be known as its own", encode(st))
	}
	r.passTo(StepAwait)
	r.clock.SetTime(start.Add(DefaultQuiet))
	r.passTo(StepDone)
	if _, node, cordoned := r.protection(); node || cordoned {
		t.Errorf("after the run: node protected %v, cordoned %v", node, cordoned)
	}
}

// TestFaults: a conflict on the run's record (the HealthRecord) or the Node's patch is retried
// within the pass; an outage reading the Node fails the pass and changes nothing.
func TestFaults(t *testing.T) {
	conflicts := map[string]int{}
	outage := false
	gr := schema.GroupResource{Group: "karpenter.sh", Resource: "nodeclaims"}
	r := newRig(t, rigOpts{funcs: interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok && conflicts["node"] > 0 {
				conflicts["node"]--
				return apierrors.NewConflict(gr, obj.GetName(), errors.New("the object has been modified"))
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*record.HealthRecord); ok && conflicts["record"] > 0 {
				// Another replica's write of the same record, a moment before (a failover).
				conflicts["record"]--
				return apierrors.NewConflict(gr, obj.GetName(), errors.New("the object has been modified"))
			}
			return c.Update(ctx, obj, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Node); ok && outage {
				return errors.New("dial tcp 10.100.0.1:443: connect: connection refused")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}})
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	conflicts["node"], conflicts["record"] = 1, 1
	r.pass()
	if st := r.state(); st.Step != StepEvict || !st.Cordoned || conflicts["node"] != 0 || conflicts["record"] != 0 {
		t.Errorf("after conflicts: %s (conflicts left %v)", encode(st), conflicts)
	}
	outage = true
	rv := r.claim().ResourceVersion
	if _, err := r.runner.Reconcile(r.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: claimName}}); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("a pass during an outage: %v", err)
	}
	if r.claim().ResourceVersion != rv || r.evictor.calls != 0 {
		t.Error("a pass that could not read the node acted")
	}
	outage = false
	r.pass()
	if r.state().Step != StepAwait {
		t.Errorf("after the outage: %s", encode(r.state()))
	}
}

// TestRescheduledMidRun: a Begin that records a new start while a pass is under way: the
// pass's record finds the run changed and drops its decision; the next pass decides again.
func TestRescheduledMidRun(t *testing.T) {
	var r *rig
	once := true
	r = newRig(t, rigOpts{funcs: interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if hr, ok := obj.(*record.HealthRecord); ok && once && strings.Contains(string(hr.Status.Run), `"step":"await"`) {
				once = false
				// Moved by minutes: the Node, being emptied, stays out of service (a move that
				// leaves it hours to serve gives it back: TestPostponedMidRun).
				moved := scheduled("ev-1", event.ScheduledSystemReboot, start.Add(5*time.Minute))
				if already, err := r.runner.Begin(ctx, r.claim(), moved); err != nil || !already {
					return errors.Join(errors.New("rescheduling"), err)
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	}})
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	r.passTo(StepEvict)
	if wait := r.pass(); wait != again {
		t.Errorf("a pass whose run changed meanwhile: wait %s, want %s", wait, again)
	}
	if st := r.state(); st.Step != StepEvict || !st.Start.Equal(start.Add(5*time.Minute)) {
		t.Errorf("the reschedule was lost: %s", encode(st))
	}
	if wait := r.pass(); wait != start.Add(5*time.Minute).Sub(t0) || r.state().Step != StepAwait {
		t.Errorf("the next pass: %s, wait %s", encode(r.state()), wait)
	}
}

// TestReconcileLeavesAlone: a NodeClaim gone, without a run, or being deleted.
func TestReconcileLeavesAlone(t *testing.T) {
	r := newRig(t, rigOpts{})
	if _, err := r.runner.Reconcile(r.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: "nope"}}); err != nil {
		t.Errorf("a NodeClaim gone: %v", err)
	}
	r.pass() // no run
	if r.node().Spec.Unschedulable {
		t.Error("a NodeClaim without a run: the node was cordoned")
	}
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	nc := r.claim()
	nc.Finalizers = []string{karpv1.TerminationFinalizer}
	if err := r.kube.Update(r.ctx, nc); err != nil {
		t.Fatal(err)
	}
	if err := r.kube.Delete(r.ctx, nc); err != nil {
		t.Fatal(err)
	}
	r.pass()
	if r.node().Spec.Unschedulable || r.state().Step != StepCordon {
		t.Error("a NodeClaim being deleted: the run went on")
	}
	if got := testutil.ToFloat64(r.runner.inProgress); got != 0 {
		t.Errorf("runs in progress: %v", got)
	}
}

func TestReadAndActive(t *testing.T) {
	running := encode(run(event.ScheduledSystemReboot, StepEvict))
	for _, tc := range []struct {
		name       string
		value      *string
		ok, active bool
		err        string
	}{
		{"none", nil, false, false, ""},
		{"in progress", &running, true, true, ""},
		{"done", ptr.To(encode(with(run(event.ScheduledSystemReboot, StepDone), func(s *State) { s.Outcome = "done" }))), true, false, ""},
		{"fallback pending", ptr.To(encode(with(run(event.ScheduledSystemReboot, StepFallback), func(s *State) { s.Why = "w" }))), true, true, ""},
		{"fallen back", ptr.To(encode(with(run(event.ScheduledSystemReboot, StepFallback), func(s *State) { s.Why, s.Outcome = "w", "fallback: w" }))), true, false, ""},
		{"not JSON", ptr.To("rebooting"), false, false, "invalid character"},
		{"a newer router's", ptr.To(`{"version":2,"event_id":"e","step":"cordon"}`), false, false, "newer router"},
		{"no version", ptr.To(`{"event_id":"e","step":"cordon"}`), false, false, "no version"},
		{"no event", ptr.To(`{"version":1,"step":"cordon"}`), false, false, "no event_id"},
		{"unknown step", ptr.To(`{"version":1,"event_id":"e","step":"teleport"}`), false, false, "unknown step"},
		{"unknown fields are a newer router's additions, kept readable", ptr.To(`{"version":1,"event_id":"e","step":"await","future":true}`), true, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mem record.Memory
			if tc.value != nil {
				mem.Run = json.RawMessage(*tc.value)
			}
			_, ok, err := Read(mem)
			nc := mem
			if ok != tc.ok || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("Read: ok=%v err=%v; want ok=%v err with %q", ok, err, tc.ok, tc.err)
			}
			if Active(nc) != tc.active {
				t.Errorf("Active = %v", !tc.active)
			}
		})
	}
	// The format is the contract with people and other routers: times in UTC, zero ones out.
	cet := time.FixedZone("CET", 3600)
	st := State{EventID: "e", Type: event.ScheduledInstanceReboot, Instance: instance, Node: "n", Start: start.In(cet), Step: StepAwait, Began: t0.In(cet),
		StepSince: t0, Cordoned: true, Protected: true, BootID: "b", Rebooted: t0.Add(time.Minute)}
	want := `{"version":1,"event_id":"e","type":"instance-reboot","instance":"i-0123456789abcdef0","node":"n","start":"2026-03-01T14:00:00Z","step":"await","began":"2026-03-01T12:00:00Z","step_since":"2026-03-01T12:00:00Z","cordoned":true,"protected":true,"boot_id":"b","rebooted":"2026-03-01T12:01:00Z"}`
	if got := encode(st); got != want {
		t.Errorf("encode:\n got %s\nwant %s", got, want)
	}
	if got := truncate(strings.Repeat("é", 400), lastErrorMax); len(got) > lastErrorMax || !strings.HasSuffix(got, " …") {
		t.Errorf("truncate: %d bytes, %q", len(got), got[len(got)-8:])
	}
}

func (r *rig) refusedCount() float64 { return testutil.ToFloat64(r.runner.refused) }
