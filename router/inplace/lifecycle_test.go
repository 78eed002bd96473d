package inplace

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// The regression tests of issue 25 for the reboot in place: each failed on 625c04b.

// TestPostponedAfterRunEnded: defect 2. AWS postpones a system reboot; the run for the old
// start ends ("no visible effect") and the same event at its new start must begin a new run,
// not be answered "already" (AWS would then reboot the node with its pods on it).
func TestPostponedAfterRunEnded(t *testing.T) {
	r := newRig(t, rigOpts{})
	ev := scheduled("ev-1", event.ScheduledSystemReboot, start)
	r.begin(ev)
	r.passTo(StepAwait)
	r.clock.SetTime(start.Add(DefaultQuiet))
	r.passTo(StepDone)
	later := start.Add(48 * time.Hour)
	postponed := scheduled("ev-1-update", event.ScheduledSystemReboot, later)
	postponed.Health.EventARN = ev.Health.EventARN
	r.clock.SetTime(later.Add(-3 * time.Hour))
	if r.begin(postponed) {
		t.Fatal("the postponed maintenance was answered 'already' by the run of its old start")
	}
	if st := r.state(); !st.Start.Equal(later) || st.Over() {
		t.Errorf("the new run: %s", encode(st))
	}
}

// TestSystemRebootNotEmptiedEarly: defect 7. A run begun days before AWS's start (at the
// pool's window) must not cordon and empty the node until shortly before the start.
func TestSystemRebootNotEmptiedEarly(t *testing.T) {
	r := newRig(t, rigOpts{})
	far := t0.Add(3 * 24 * time.Hour)
	r.begin(scheduled("ev-1", event.ScheduledSystemMaintenance, far))
	for range 3 {
		r.pass()
	}
	if r.node().Spec.Unschedulable || r.evictor.calls > 0 {
		t.Fatalf("the node was cordoned (%v) or emptied (%d rounds) three days before AWS acts", r.node().Spec.Unschedulable, r.evictor.calls)
	}
	r.clock.SetTime(far.Add(-2 * time.Hour))
	r.passTo(StepAwait)
	if !r.node().Spec.Unschedulable || r.evictor.calls == 0 {
		t.Errorf("not emptied before the start: cordoned %v, %d rounds", r.node().Spec.Unschedulable, r.evictor.calls)
	}
}

// TestBlipBeforeAWSReboot: defect 10. With the event's end ahead, a NotReady->Ready blip with
// the same boot ID is not AWS's reboot: the run keeps the node out of service until a new boot.
func TestBlipBeforeAWSReboot(t *testing.T) {
	r := newRig(t, rigOpts{})
	ev := scheduled("ev-1", event.ScheduledSystemReboot, start)
	ev.Health.End = start.Add(2 * time.Hour)
	r.begin(ev)
	r.passTo(StepAwait)
	r.clock.SetTime(start.Add(time.Minute))
	r.kubelet(corev1.ConditionFalse, start.Add(30*time.Second), "boot-1")
	r.pass()
	r.clock.Step(2 * time.Minute)
	r.kubelet(corev1.ConditionTrue, r.clock.Now().Add(-time.Second), "boot-1")
	r.pass()
	r.pass()
	if st := r.state(); st.Over() || !r.node().Spec.Unschedulable {
		t.Fatalf("a blip ended the run before AWS's reboot: %s, cordoned %v", encode(st), r.node().Spec.Unschedulable)
	}
	r.clock.Step(10 * time.Minute)
	r.kubelet(corev1.ConditionTrue, r.clock.Now(), "boot-2")
	r.passTo(StepDone)
	if r.node().Spec.Unschedulable {
		t.Error("still cordoned after the reboot")
	}
}

// TestRebootCalledOnce: defect 10. RebootInstances succeeds, the write recording it fails:
// the next pass must not reboot the instance a second time.
func TestRebootCalledOnce(t *testing.T) {
	failAfterReboot := false
	var r *rig
	r = newRig(t, rigOpts{funcs: interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*karpv1.NodeClaim); ok && failAfterReboot && len(r.ec2.calls) > 0 {
				failAfterReboot = false
				return errors.New("http2: client connection lost")
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}})
	r.begin(scheduled("ev-1", event.ScheduledInstanceReboot, start))
	r.passTo(StepReboot)
	failAfterReboot = true
	_, _ = r.runner.Reconcile(r.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: claimName}})
	r.runner = r.newRunner()
	for range 3 {
		r.pass()
	}
	if len(r.ec2.calls) != 1 {
		t.Errorf("RebootInstances called %d times", len(r.ec2.calls))
	}
}

// TestPostponedMidRun: AWS postpones the maintenance by days while the run has emptied the
// Node: the Node goes back into service (uncordoned, do-not-disrupt removed from it) and the
// run waits for the new start, protected; it empties the Node again before it.
func TestPostponedMidRun(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	r.passTo(StepAwait)
	later := start.Add(72 * time.Hour)
	if !r.begin(scheduled("ev-1", event.ScheduledSystemReboot, later)) {
		t.Fatal("the postponed run: not already")
	}
	r.passTo(StepWait)
	if claim, node, cordoned := r.protection(); !claim || node || cordoned {
		t.Errorf("released: nodeclaim protected %v (want true), node protected %v, cordoned %v (want neither)", claim, node, cordoned)
	}
	if wait := r.pass(); wait != later.Add(-DefaultPrepare-DefaultEvictMargin).Sub(r.clock.Now()) {
		t.Errorf("waits %s", wait)
	}
	r.clock.SetTime(later.Add(-DefaultPrepare))
	r.passTo(StepAwait)
	if !r.node().Spec.Unschedulable {
		t.Error("not emptied again before the new start")
	}
	r.clock.SetTime(later.Add(DefaultQuiet))
	r.passTo(StepDone)
	if claim, node, cordoned := r.protection(); claim || node || cordoned {
		t.Errorf("after the run: %v %v %v", claim, node, cordoned)
	}
}

// TestCancelled: defect 4. A cancel before the reboot gives the Node back at once; after
// AWS's start (or the router's reboot) the run sees the reboot through.
func TestCancelled(t *testing.T) {
	closed := func(ev event.Event) event.Event {
		c := ev
		h := *ev.Health
		h.Status = event.HealthClosed
		c.ID, c.Health = ev.ID+"-closed", &h
		return c
	}
	t.Run("before the reboot", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		ev := scheduled("ev-1", event.ScheduledInstanceReboot, start)
		r.begin(ev)
		r.passTo(StepReboot)
		r.events()
		if ok, err := r.runner.Cancel(r.ctx, r.claim(), closed(ev)); err != nil || !ok {
			t.Fatalf("Cancel: %v %v", ok, err)
		}
		r.passTo(StepDone)
		if len(r.ec2.calls) != 0 {
			t.Error("rebooted a cancelled maintenance")
		}
		if claim, node, cordoned := r.protection(); claim || node || cordoned {
			t.Errorf("after the cancel: nodeclaim protected %v, node protected %v, cordoned %v", claim, node, cordoned)
		}
		r.expectEvents("cancel", ReasonCancelled, ReasonDone, ReasonDone)
	})
	t.Run("another maintenance's close", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
		other := closed(scheduled("ev-2", event.ScheduledSystemReboot, start.Add(24*time.Hour)))
		if ok, _ := r.runner.Cancel(r.ctx, r.claim(), other); ok {
			t.Error("cancelled by another maintenance's close")
		}
	})
	t.Run("a close of the start the router moved it from", func(t *testing.T) {
		// The router moved the maintenance into the window (ev.MovedFrom); another source, or
		// an AWS Health code the router does not map, closes it at the start it had. A report
		// of that start is the moved maintenance (router/record), and so is its close.
		r := newRig(t, rigOpts{})
		first := start.Add(-3 * 24 * time.Hour)
		ev := scheduled("ev-1", event.ScheduledSystemReboot, start)
		ev.MovedFrom = first
		r.begin(ev)
		unmapped := closed(scheduled("ev-2", "", first))
		if ok, err := r.runner.Cancel(r.ctx, r.claim(), unmapped); err != nil || !ok {
			t.Fatalf("Cancel by a close of the first start: %v %v", ok, err)
		}
	})
	t.Run("the reboot under way", func(t *testing.T) {
		r := newRig(t, rigOpts{})
		ev := scheduled("ev-1", event.ScheduledSystemReboot, start)
		r.begin(ev)
		r.passTo(StepAwait)
		r.clock.SetTime(start.Add(time.Minute))
		if ok, _ := r.runner.Cancel(r.ctx, r.claim(), closed(ev)); ok {
			t.Error("a run past AWS's start was cancelled")
		}
	})
}

// TestForgedRunLeftAlone: issue 26. A run whose record names another instance or Node than
// its NodeClaim's own reboots, cordons and evicts nothing. Since the store only the router
// writes the record (TestRunAnnotationIsNotAnOrder: an annotation is nothing); this stays for
// a record restored from a backup onto another NodeClaim, or a router's bug.
func TestForgedRunLeftAlone(t *testing.T) {
	// On 625c04b the first rebooted i-0ffffffffffffffff (not in the cluster); the second sent
	// the run to its fallback, deleting the NodeClaim.
	for _, forged := range []State{
		{Version: Version, EventID: "forged", Type: event.ScheduledInstanceReboot, Instance: "i-0ffffffffffffffff", Node: nodeName, Start: start, Step: StepReboot, Began: t0, StepSince: t0},
		{Version: Version, EventID: "forged", Type: event.ScheduledInstanceReboot, Instance: instance, Node: "ng-system-1", Start: start, Step: StepCordon, Began: t0, StepSince: t0},
	} {
		forgedRun(t, forged)
	}
}

func forgedRun(t *testing.T, forged State) {
	r := newRig(t, rigOpts{})
	r.seedRun(encode(forged))
	for range 3 {
		r.pass()
	}
	if len(r.ec2.calls) != 0 || r.evictor.calls != 0 || r.node().Spec.Unschedulable || len(r.fallback.whys) != 0 {
		t.Errorf("a forged run acted: %d reboots (%v), %d eviction rounds, fallbacks %v", len(r.ec2.calls), r.ec2.calls, r.evictor.calls, r.fallback.whys)
	}
	if got := r.refusedCount(); got == 0 {
		t.Error("not counted")
	}
	r.expectEvents("forged", ReasonRefused, ReasonRefused, ReasonRefused)
}

// TestNodeRegisteredAgain: defect 10. The Node is deleted and registered again under the same
// name while the run evicts: the run cordons the new Node before it evicts on.
func TestNodeRegisteredAgain(t *testing.T) {
	r := newRig(t, rigOpts{})
	r.evictor.rounds = []evictResult{{left: 1}, {left: 1}, {}}
	r.begin(scheduled("ev-1", event.ScheduledSystemReboot, start))
	r.passTo(StepEvict)
	old := r.node()
	if err := r.kube.Delete(r.ctx, old); err != nil {
		t.Fatal(err)
	}
	again := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "re-registered"}, Spec: corev1.NodeSpec{ProviderID: old.Spec.ProviderID},
		Status: old.Status}
	if err := r.kube.Create(r.ctx, again); err != nil {
		t.Fatal(err)
	}
	r.pass()
	r.passTo(StepEvict)
	if !r.node().Spec.Unschedulable {
		t.Errorf("the Node registered again is not cordoned while the run evicts: %s", encode(r.state()))
	}
}

// TestRebootOnlyForAMaintenanceEC2Shows: issue 26 item 3. A run in the store for a
// maintenance EC2 no longer shows (restored from a backup, or a router's bug), naming the
// NodeClaim's own instance and Node, for an instance-reboot EC2 does not show: the instance is not rebooted, the run
// ends and gives the Node back, with a Warning and the refused metric.
func TestRebootOnlyForAMaintenanceEC2Shows(t *testing.T) {
	r := newRig(t, rigOpts{})
	forged := State{Version: Version, EventID: "forged", Type: event.ScheduledInstanceReboot, Instance: instance, Node: nodeName,
		Start: start, Step: StepCordon, Began: t0, StepSince: t0}
	r.seedRun(encode(forged))
	// EC2 shows an instance-reboot, but not this one (another start), and a completed one at
	// this start: neither is the maintenance the run is for.
	r.ec2.shown = []ec2types.InstanceStatusEvent{
		{InstanceEventId: aws.String("instance-event-1"), Code: ec2types.EventCodeInstanceReboot, NotBefore: aws.Time(start.Add(24 * time.Hour))},
		{InstanceEventId: aws.String("instance-event-2"), Code: ec2types.EventCodeInstanceReboot, NotBefore: aws.Time(start), Description: aws.String("[Completed] The instance is scheduled for a reboot")},
	}
	for range 6 {
		r.pass()
	}
	if len(r.ec2.calls) != 0 {
		t.Fatalf("rebooted for a maintenance EC2 does not show: RebootInstances %v", r.ec2.calls)
	}
	st := r.state()
	if !st.Over() || st.Step != StepDone || !strings.Contains(st.Outcome, "EC2 shows no") {
		t.Errorf("the run: %s; want it over, the node given back", encode(st))
	}
	if r.node().Spec.Unschedulable || len(r.fallback.whys) != 0 {
		t.Errorf("the node left cordoned (%v) or replaced (%v)", r.node().Spec.Unschedulable, r.fallback.whys)
	}
	if got := r.refusedCount(); got != 1 {
		t.Errorf("refused metric %v, want 1", got)
	}
	if evs := strings.Join(r.events(), "\n"); !strings.Contains(evs, "Warning "+ReasonRefused) {
		t.Errorf("no %s Warning: %s", ReasonRefused, evs)
	}
}

// TestRebootConfirmation: the maintenance is confirmed with EC2 before RebootInstances.
func TestRebootConfirmation(t *testing.T) {
	tests := []struct {
		name        string
		shown       func(ev event.Event) []ec2types.InstanceStatusEvent
		describeErr error
		wantReboot  bool
		wantStep    Step
	}{
		{name: "shown by the start and type", wantReboot: true, wantStep: StepAwait, shown: func(ev event.Event) []ec2types.InstanceStatusEvent {
			return []ec2types.InstanceStatusEvent{{InstanceEventId: aws.String("instance-event-9"), Code: ec2types.EventCodeInstanceReboot, NotBefore: aws.Time(start)}}
		}},
		{name: "shown by EC2's event ID (a run the poller began)", wantReboot: true, wantStep: StepAwait, shown: func(ev event.Event) []ec2types.InstanceStatusEvent {
			return []ec2types.InstanceStatusEvent{{InstanceEventId: aws.String(ev.Health.EventARN), Code: ec2types.EventCodeInstanceReboot, NotBefore: aws.Time(start.Add(time.Minute))}}
		}},
		{name: "none shown", wantStep: StepDone, shown: func(event.Event) []ec2types.InstanceStatusEvent { return nil }},
		{name: "another type at the start", wantStep: StepDone, shown: func(event.Event) []ec2types.InstanceStatusEvent {
			return []ec2types.InstanceStatusEvent{{InstanceEventId: aws.String("instance-event-9"), Code: ec2types.EventCodeSystemReboot, NotBefore: aws.Time(start)}}
		}},
		{name: "cancelled", wantStep: StepDone, shown: func(event.Event) []ec2types.InstanceStatusEvent {
			return []ec2types.InstanceStatusEvent{{InstanceEventId: aws.String("instance-event-9"), Code: ec2types.EventCodeInstanceReboot, NotBefore: aws.Time(start), Description: aws.String("[Canceled] The instance is scheduled for a reboot")}}
		}},
		// EC2 does not answer: no reboot on an unconfirmed claim; the call is retried as a
		// failed reboot is, and then left to AWS at the start (which reboots it, if the
		// maintenance is real).
		{name: "EC2 unavailable", describeErr: errors.New("api error RequestLimitExceeded: Request limit exceeded."), wantStep: StepAwait,
			shown: func(event.Event) []ec2types.InstanceStatusEvent { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigOpts{})
			ev := scheduled("ev-1", event.ScheduledInstanceReboot, start)
			ev.Health.EventARN = "instance-event-0123"
			r.begin(ev)
			r.ec2.shown, r.ec2.describeErr = tt.shown(ev), tt.describeErr
			for range 12 {
				if st := r.state(); st.Step == tt.wantStep || st.Over() {
					break
				}
				r.pass()
				r.clock.Step(DefaultRetryMax)
			}
			if got := len(r.ec2.calls) > 0; got != tt.wantReboot {
				t.Errorf("rebooted %v, want %v", got, tt.wantReboot)
			}
			if st := r.state(); st.Step != tt.wantStep {
				t.Errorf("the run: %s, want step %s", encode(st), tt.wantStep)
			}
			if r.ec2.described == 0 {
				t.Error("EC2 not asked")
			}
			if refused := r.refusedCount(); (refused == 1) != (tt.wantStep == StepDone) {
				t.Errorf("refused metric %v", refused)
			}
		})
	}
}

// TestRunAnnotationIsNotAnOrder: issue 36, defect 9. Anyone with `patch nodeclaims` writes a
// run on the NodeClaim's own instance and Node, in the key routers before the store kept it
// in, at each of its dangerous steps: on 22df557 the evict step emptied the node, the reboot
// step rebooted it with its pods on it, and the fallback step deleted the NodeClaim. The run
// lives in the router's HealthRecord now: the annotation is nothing.
func TestRunAnnotationIsNotAnOrder(t *testing.T) {
	for _, step := range []Step{StepEvict, StepReboot, StepFallback} {
		t.Run(string(step), func(t *testing.T) {
			r := newRig(t, rigOpts{})
			forged := State{Version: Version, EventID: "forged", Type: event.ScheduledInstanceReboot, Instance: instance, Node: nodeName,
				Start: start, Step: step, Began: t0, StepSince: t0}
			r.ec2.show(scheduled("forged", event.ScheduledInstanceReboot, start))
			nc := r.claim()
			nc.Annotations = map[string]string{Annotation: encode(forged)}
			if err := r.kube.Update(r.ctx, nc); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				r.pass()
			}
			if len(r.ec2.calls) != 0 || r.evictor.calls != 0 || r.node().Spec.Unschedulable || len(r.fallback.whys) != 0 {
				t.Errorf("a run written by someone else acted: %d reboots, %d eviction rounds, cordoned %v, fallbacks %q",
					len(r.ec2.calls), r.evictor.calls, r.node().Spec.Unschedulable, r.fallback.whys)
			}
		})
	}
}
