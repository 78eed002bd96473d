package nodedrain

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/nodedrain"
)

// The drain of an unmanaged node as one lifecycle (issue 25, defects 1 and 8): begun, ended
// by a close of its maintenance or by the end of a reboot AWS kept the instance through, and
// begun again for a later event. Each case failed on 625c04b.

// TestCancelEndsTheDrain: a close of the maintenance uncordons the Node the router cordoned;
// a close of another event leaves the drain alone.
func TestCancelEndsTheDrain(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "cancel-a", false)
	dr := nodedrain.Drain{EventID: "ev-1", Key: "arn:health/1", Match: "system-reboot@2026-03-08T02:00:00Z", Kind: "scheduled-change"}
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "cancel-a"), dr); err != nil {
		t.Fatal(err)
	}
	if ended, err := s.drainer.Cancel(s.ctx, "cancel-a", nodedrain.Drain{EventID: "ev-9", Key: "arn:health/9", Kind: "scheduled-change"}); err != nil || ended {
		t.Fatalf("another event's close: ended=%v err=%v", ended, err)
	}
	// The other source's close of the same maintenance (another key, the same type and start).
	closing := nodedrain.Drain{EventID: "poll-closed", Key: "instance-event-1", Match: "system-reboot@2026-03-08T02:00:00Z", Kind: "scheduled-change"}
	if ended, err := s.drainer.Cancel(s.ctx, "cancel-a", closing); err != nil || !ended {
		t.Fatalf("the maintenance's close: ended=%v err=%v", ended, err)
	}
	n := getNode(t, "cancel-a")
	if n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the cancel: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
}

// TestFinishedDrainDoesNotSwallowTheNext: defect 1. A finished drain's record stays on the
// Node; an operator uncordons it; a later event of the instance (a Spot warning) must cordon
// and drain it again, not be counted as begun already.
func TestFinishedDrainDoesNotSwallowTheNext(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "again-a", false)
	s.begin("again-a", "ev-1", time.Time{})
	s.pass() // no pods: done
	if rec, _ := record(t, "again-a"); !rec.Finished() {
		t.Fatalf("not finished: %+v", rec)
	}
	n := getNode(t, "again-a")
	n.Spec.Unschedulable = false // the operator's uncordon
	must(t, direct.Update(s.ctx, n))
	already, err := s.drainer.Begin(s.ctx, getNode(t, "again-a"), nodedrain.Drain{EventID: "spot-1", Kind: "spot-interruption"})
	if err != nil || already {
		t.Fatalf("Begin of a later event: already=%v err=%v", already, err)
	}
	rec, _ := record(t, "again-a")
	if n := getNode(t, "again-a"); !n.Spec.Unschedulable || rec.EventID != "spot-1" || rec.Finished() || !rec.Cordoned {
		t.Errorf("the later drain: unschedulable %v, record %+v", n.Spec.Unschedulable, rec)
	}
}

// TestBeginReadsTheNodeFresh: defect 8. The router's cache trims spec.unschedulable; a Node
// an operator cordoned, handed to Begin as the cache has it, must not be recorded as cordoned
// by the router (an end of the drain would then uncordon the operator's cordon).
func TestBeginReadsTheNodeFresh(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "fresh-a", true)
	trimmed := getNode(t, "fresh-a")
	trimmed.Spec.Unschedulable = false // as the trimmed cache shows it
	if _, err := s.drainer.Begin(s.ctx, trimmed, nodedrain.Drain{EventID: "ev-1", Key: "arn:1", Kind: "scheduled-change"}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := record(t, "fresh-a"); rec.Cordoned {
		t.Fatalf("the record claims the operator's cordon: %+v", rec)
	}
	if _, err := s.drainer.Cancel(s.ctx, "fresh-a", nodedrain.Drain{EventID: "ev-1-closed", Key: "arn:1", Kind: "scheduled-change"}); err != nil {
		t.Fatal(err)
	}
	if !getNode(t, "fresh-a").Spec.Unschedulable {
		t.Error("the end of the drain uncordoned a Node the operator had cordoned")
	}
}

// TestReleasedAfterTheReboot: a drain for a reboot AWS keeps the instance through ends past
// its release time, once the drain is done and the Node Ready: the Node serves again.
func TestReleasedAfterTheReboot(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "release-a", false)
	release := t0.Add(3 * time.Hour)
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "release-a"), nodedrain.Drain{EventID: "ev-1", Kind: "scheduled-change", Release: release}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache shows the drain", func() bool { return cachedStored(t, "release-a") != "" })
	s.pass()
	eventually(t, "the cache shows it done", func() bool {
		rec, ok, _ := cachedRecord(t, "release-a")
		return ok && rec.Finished()
	})
	s.pass()
	if !getNode(t, "release-a").Spec.Unschedulable {
		t.Fatal("released before AWS's maintenance is over")
	}
	s.clock.SetTime(release)
	n := getNode(t, "release-a")
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	must(t, direct.Status().Update(s.ctx, n))
	s.pass()
	if n := getNode(t, "release-a"); n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the maintenance: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
}

// TestRunningAgainEndsTheStopDrain: found by the simulation. A drain for a stop ends when the
// instance runs again after the stop (a stop/start, not a loss); an older `running` does not.
func TestRunningAgainEndsTheStopDrain(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "stop-a", false)
	stopped := t0.Add(-3 * time.Minute)
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "stop-a"), nodedrain.Drain{EventID: "stop-1", Key: "stop-1", Kind: "state-change", EventTime: stopped}); err != nil {
		t.Fatal(err)
	}
	older := nodedrain.Drain{EventID: "run-0", Key: "run-0", Kind: "state-change", EventTime: stopped.Add(-time.Minute), Resumes: true}
	if ended, err := s.drainer.Cancel(s.ctx, "stop-a", older); err != nil || ended {
		t.Fatalf("a running older than the stop: ended=%v err=%v", ended, err)
	}
	later := nodedrain.Drain{EventID: "run-1", Key: "run-1", Kind: "state-change", EventTime: stopped.Add(time.Minute), Resumes: true}
	if ended, err := s.drainer.Cancel(s.ctx, "stop-a", later); err != nil || !ended {
		t.Fatalf("a running after the stop: ended=%v err=%v", ended, err)
	}
	if getNode(t, "stop-a").Spec.Unschedulable {
		t.Error("still cordoned after the instance runs again")
	}
}

// TestLateStopAfterRunning: found by the simulation. The instance's `running` is handled
// before its older stop (SQS reorders, workers decide at once): the stop begins no drain.
func TestLateStopAfterRunning(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "late-a", false)
	stopped := t0.Add(-3 * time.Minute)
	running := nodedrain.Drain{EventID: "run-1", Key: "run-1", Kind: "state-change", EventTime: stopped.Add(time.Minute), Resumes: true}
	if ended, err := s.drainer.Cancel(s.ctx, "late-a", running); err != nil || ended {
		t.Fatalf("a running with no drain: ended=%v err=%v", ended, err)
	}
	already, err := s.drainer.Begin(s.ctx, getNode(t, "late-a"), nodedrain.Drain{EventID: "stop-1", Key: "stop-1", Kind: "state-change", EventTime: stopped})
	if err != nil || !already || getNode(t, "late-a").Spec.Unschedulable {
		t.Errorf("a stop older than the running: already=%v err=%v cordoned=%v", already, err, getNode(t, "late-a").Spec.Unschedulable)
	}
	// A later stop drains.
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "late-a"), nodedrain.Drain{EventID: "stop-2", Key: "stop-2", Kind: "state-change", EventTime: stopped.Add(2 * time.Minute)}); err != nil || already {
		t.Errorf("a later stop: already=%v err=%v", already, err)
	}
}

// staleOnce serves its Node as it was before a write, once: the read a worker made before
// another worker's write landed.
type staleOnce struct {
	client.Reader
	node *corev1.Node
}

func (r *staleOnce) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if n, ok := obj.(*corev1.Node); ok && r.node != nil && key.Name == r.node.Name {
		r.node.DeepCopyInto(n)
		r.node = nil
		return nil
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// TestRunningRacesTheStop: found by the simulation (make sim SEEDS=500, concurrent workers).
// The instance's stop and its later running are decided by two workers at once: the running
// reads the Node before the stop's drain is written, the stop cordons, and the running's write
// then conflicts. Decided on the Node as it read it first ("no drain"), the running left the
// stop's drain in place: the node stayed cordoned for a stop that was over. It is decided on
// the Node the write finds: the drain ends.
func TestRunningRacesTheStop(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "race-a", false)
	before := getNode(t, "race-a")
	stopped := t0.Add(-3 * time.Minute)
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "race-a"), nodedrain.Drain{EventID: "stop-1", Key: "stop-1", Kind: "state-change", EventTime: stopped}); err != nil || already {
		t.Fatalf("the stop: already=%v err=%v", already, err)
	}
	racing := nodedrain.New(kube, &staleOnce{Reader: direct, node: before}, cs, s.clock, s.recorder, slog.New(slog.NewTextHandler(io.Discard, nil)), nodedrain.Options{})
	running := nodedrain.Drain{EventID: "run-1", Key: "run-1", Kind: "state-change", EventTime: stopped.Add(2 * time.Minute), Resumes: true}
	ended, err := racing.Cancel(s.ctx, "race-a", running)
	if err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, "race-a"); !ended || n.Spec.Unschedulable {
		t.Errorf("the running decided beside the stop: ended=%v, still cordoned=%v, record %s", ended, n.Spec.Unschedulable, stored(t, n.Name))
	}
}

// TestRecoveryEndsTheImpairedDrain: found by make sim SEEDS=500. An unmanaged Node cordoned
// and drained for its instance's impairment stayed cordoned once the instance passed its
// checks again: the poller told of a recovery only for repairs held on NodeClaims, and a
// recovery's key is not the impairment's. The poller now watches the Nodes cordoned for an
// impairment (HeldImpaired), and the recovery ends their drain.
func TestRecoveryEndsTheImpairedDrain(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "impaired-a", false)
	const prefix = "healthrouter.io/instance-status/i-0123456789abcdef0/"
	impaired := nodedrain.Drain{EventID: prefix + "impaired/2026-03-01T11:50:00Z", Key: prefix + "impaired/2026-03-01T11:50:00Z", Kind: "instance-status", EventTime: t0}
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "impaired-a"), impaired); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the poller is told to watch the instance", func() bool {
		ids, err := s.drainer.HeldImpaired(s.ctx)
		return err == nil && len(ids) == 1 && ids[0] == "i-0123456789abcdef0"
	})
	recovered := nodedrain.Drain{EventID: prefix + "recovered/2026-03-01T12:30:00Z", Key: prefix + "recovered/2026-03-01T12:30:00Z", Kind: "instance-status", EventTime: t0.Add(30 * time.Minute), Recovers: true}
	if ended, err := s.drainer.Cancel(s.ctx, "impaired-a", recovered); err != nil || !ended {
		t.Fatalf("the recovery: ended=%v err=%v", ended, err)
	}
	if n := getNode(t, "impaired-a"); n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the recovery: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
	eventually(t, "the poller no longer watches it", func() bool {
		ids, err := s.drainer.HeldImpaired(s.ctx)
		return err == nil && len(ids) == 0
	})
}

// TestLateStopBesideAFinishedDrain: found by make sim SEEDS=500. The Node carries the
// finished drain of a maintenance AWS keeps it through (its release still to come); the
// instance's `running` is handled before its older stop. The running left no trace beside the
// maintenance's record, so the late stop began a drain of its own and the Node stayed
// cordoned for a stop that was over. The running is kept on the record, and the stop begins
// none; the maintenance's release still gives the Node back.
func TestLateStopBesideAFinishedDrain(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "beside-a", false)
	release := t0.Add(3 * time.Hour)
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "beside-a"), nodedrain.Drain{EventID: "ev-1", Kind: "scheduled-change", Release: release}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache shows the drain", func() bool { return cachedStored(t, "beside-a") != "" })
	s.pass()
	eventually(t, "the cache shows it done", func() bool {
		rec, ok, _ := cachedRecord(t, "beside-a")
		return ok && rec.Finished()
	})
	stopped := t0.Add(-3 * time.Minute)
	running := nodedrain.Drain{EventID: "run-1", Key: "run-1", Kind: "state-change", EventTime: stopped.Add(2 * time.Minute), Resumes: true}
	if _, err := s.drainer.Cancel(s.ctx, "beside-a", running); err != nil {
		t.Fatal(err)
	}
	already, err := s.drainer.Begin(s.ctx, getNode(t, "beside-a"), nodedrain.Drain{EventID: "stop-1", Key: "stop-1", Kind: "state-change", EventTime: stopped})
	if err != nil || !already {
		t.Fatalf("a stop older than the running: already=%v err=%v", already, err)
	}
	rec, _, _ := freshRecord(t, "beside-a")
	if rec.EventID != "ev-1" {
		t.Errorf("the maintenance's record was replaced: %+v", rec)
	}
	s.clock.SetTime(release)
	n := getNode(t, "beside-a")
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	must(t, direct.Status().Update(s.ctx, n))
	eventually(t, "the cache shows the Node Ready", func() bool { return len(cached(t, "beside-a").Status.Conditions) > 0 })
	s.pass()
	if n := getNode(t, "beside-a"); n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the maintenance: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
}

// TestLateUpdateAfterClose: an older report of a maintenance, processed after the close that
// cancelled it (SQS reorders, and so does the router's own retry backoff), begins no drain of
// an unmanaged node: the close leaves a tombstone on the Node, as a closed record does on a
// NodeClaim (router/record). Found by make sim (a random seed): an upcoming event of an unmapped
// type, retried after an API outage, was decided after the close of the same instance's
// maintenance at the same start, and the node was cordoned and drained for nothing.
func TestLateUpdateAfterClose(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "late-a", false)
	at := t0.Add(-10 * time.Minute)
	closed := nodedrain.Drain{EventID: "close-1", Key: "arn:retirement", Match: "instance-retirement@2026-11-24T13:00:00Z", Kind: "scheduled-change", EventTime: at}
	if ended, err := s.drainer.Cancel(s.ctx, "late-a", closed); err != nil || ended {
		t.Fatalf("a close with no drain: ended=%v err=%v", ended, err)
	}
	for _, late := range []nodedrain.Drain{
		{EventID: "up-1", Key: "arn:retirement", Match: "instance-retirement@2026-11-24T13:00:00Z", Kind: "scheduled-change", EventTime: at},                         // the same event, older word
		{EventID: "up-2", Key: "arn:unmapped", Match: "@2026-11-24T13:00:00Z", Kind: "scheduled-change", EventTime: at.Add(-time.Minute)},                            // the same maintenance, an unmapped type, from before
		{EventID: "up-3", Key: "i-1/instance-event-1", Match: "instance-retirement@2026-11-24T13:00:00Z", Kind: "scheduled-change", EventTime: at.Add(-time.Second)}, // the poller's report of it, from before
	} {
		already, err := s.drainer.Begin(s.ctx, getNode(t, "late-a"), late)
		if err != nil || !already {
			t.Errorf("%s after the close: already=%v err=%v, want it taken as over", late.EventID, already, err)
		}
		if getNode(t, "late-a").Spec.Unschedulable {
			t.Fatalf("%s after the close cordoned the node", late.EventID)
		}
	}
	// A newer report of the same maintenance (AWS scheduled it again) and another maintenance
	// still drain.
	again, err := s.drainer.Begin(s.ctx, getNode(t, "late-a"), nodedrain.Drain{EventID: "up-4", Key: "arn:retirement", Match: "instance-retirement@2026-11-24T13:00:00Z",
		Kind: "scheduled-change", EventTime: at.Add(time.Minute)})
	if err != nil || again || !getNode(t, "late-a").Spec.Unschedulable {
		t.Errorf("a report newer than the close: already=%v err=%v, want the drain begun", again, err)
	}
}

// TestLateStopAfterARepeatedClose: found by make sim (a random seed on 2ad330c). The poller
// reports a cancelled EC2 event at every poll, each report newer than the last; each rewrote
// the close kept on the Node and dropped the `running` kept beside it, so a stop from before
// that running, arriving late (SQS reorders), cordoned and drained the node for a stop that
// was over, and no running was left to come and end it.
func TestLateStopAfterARepeatedClose(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "reclose-a", false)
	closed := func(at time.Time) nodedrain.Drain {
		return nodedrain.Drain{EventID: "closed-" + at.Format("1504"), Key: "i-1/instance-event-0", Match: "instance-retirement@2026-03-01T11:00:00Z", Kind: "scheduled-change", EventTime: at}
	}
	stopped := t0.Add(-3 * time.Minute)
	if _, err := s.drainer.Cancel(s.ctx, "reclose-a", closed(t0.Add(-10*time.Minute))); err != nil {
		t.Fatal(err)
	}
	running := nodedrain.Drain{EventID: "run-1", Key: "run-1", Kind: "state-change", EventTime: stopped.Add(2 * time.Minute), Resumes: true}
	if _, err := s.drainer.Cancel(s.ctx, "reclose-a", running); err != nil {
		t.Fatal(err)
	}
	// The next poll reports the cancelled event again.
	if _, err := s.drainer.Cancel(s.ctx, "reclose-a", closed(t0)); err != nil {
		t.Fatal(err)
	}
	already, err := s.drainer.Begin(s.ctx, getNode(t, "reclose-a"), nodedrain.Drain{EventID: "stop-1", Key: "stop-1", Kind: "state-change", EventTime: stopped})
	if err != nil || !already || getNode(t, "reclose-a").Spec.Unschedulable {
		t.Fatalf("a stop older than the running: already=%v err=%v cordoned=%v, want it taken as over", already, err, getNode(t, "reclose-a").Spec.Unschedulable)
	}
}

// TestFeatureOffCarriesTheDrainOn (issue 36, defect 2): a router restarted without
// --unmanaged-nodes=cordon-drain beside a drain an earlier router began. The drainer still
// runs (it did not: the Node stayed cordoned with its pods on it for good): it carries the
// drain to its end, with one Warning, and a close still ends a drain it holds.
func TestFeatureOffCarriesTheDrainOn(t *testing.T) {
	on := newSetup(t, nodedrain.Options{})
	const ns = "feature-off"
	newNamespace(t, ns)
	newNode(t, "off-1", false)
	newNode(t, "off-2", false)
	web := map[string]string{"app": "web"}
	rs := replicaSet(t, ns, "web-off", web)
	newPod(t, ns, "web-off-a", "off-1", podOpts{owner: rs, labels: web})
	startKubelet(t, ns)
	on.begin("off-1", "ev-off", t0.Add(2*time.Minute))
	dr := nodedrain.Drain{EventID: "ev-off-2", Key: "arn:health/off-2", Match: "system-reboot@2026-03-08T02:00:00Z", Kind: "scheduled-change"}
	if _, err := on.drainer.Begin(on.ctx, getNode(t, "off-2"), dr); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache shows the second drain", func() bool { return cachedStored(t, "off-2") != "" })

	// The restart, with the feature off.
	off := newSetup(t, nodedrain.Options{Off: true})
	off.pass()
	if got := podState(t, ns, "web-off-a"); got != "gone" {
		t.Errorf("pod web-off-a: %s, want gone (the drain carried on)", got)
	}
	if rec, _ := record(t, "off-1"); !rec.Finished() {
		t.Errorf("record after the pass: %+v", rec)
	}
	off.pass()
	warnings := 0
	for _, e := range off.events() {
		if strings.HasPrefix(e, "Warning "+nodedrain.ReasonNodeDrainFeatureOff+" ") {
			warnings++
		}
	}
	if warnings != 2 {
		t.Errorf("%d %s warnings over two passes, want one per drain (2)", warnings, nodedrain.ReasonNodeDrainFeatureOff)
	}
	closing := nodedrain.Drain{EventID: "poll-closed", Key: "instance-event-9", Match: dr.Match, Kind: "scheduled-change"}
	if ended, err := off.drainer.Cancel(off.ctx, "off-2", closing); err != nil || !ended {
		t.Fatalf("the close with the feature off: ended=%v err=%v", ended, err)
	}
	if n := getNode(t, "off-2"); n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the close: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
}
