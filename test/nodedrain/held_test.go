package nodedrain

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/health-router/health-router/router/nodedrain"
)

// An unmanaged node's drain holds the Node for every maintenance AWS reports while it is on
// (issue 25's lifecycle: supersede): a postponed maintenance moves the drain's release, a
// second one is held beside the first. Both failed on 23f378a: Begin answered "already" and
// kept only the first report, so the Node went back into service at the first maintenance's
// end, or at its close, with a reboot still to come.

// TestPostponedMaintenanceMovesTheRelease: AWS postpones the system reboot of an unmanaged
// node the router drained (a newer report of the same event, a later start); the Node stays
// out of service past the first start's end, until the new one's.
func TestPostponedMaintenanceMovesTheRelease(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "postponed-a", false)
	first, later := t0.Add(5*time.Hour), t0.Add(3*24*time.Hour)
	dr := nodedrain.Drain{EventID: "ev-1", Key: "arn:health/reboot", Match: "system-reboot@" + first.Format(time.RFC3339), Kind: "scheduled-change",
		EventTime: t0, Release: first.Add(2 * time.Hour)}
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "postponed-a"), dr); err != nil || already {
		t.Fatalf("Begin: already=%v err=%v", already, err)
	}
	s.finishDrain("postponed-a")
	moved := nodedrain.Drain{EventID: "ev-2", Key: "arn:health/reboot", Match: "system-reboot@" + later.Format(time.RFC3339), Kind: "scheduled-change",
		EventTime: t0.Add(time.Hour), Release: later.Add(2 * time.Hour)}
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "postponed-a"), moved); err != nil || !already {
		t.Fatalf("Begin of the postponement: already=%v err=%v, want the drain holding on", already, err)
	}
	s.releasePass("postponed-a", first.Add(2*time.Hour))
	if !getNode(t, "postponed-a").Spec.Unschedulable {
		t.Fatal("the Node went back into service at the first start's end, with the postponed reboot still to come")
	}
	s.releasePass("postponed-a", later.Add(2*time.Hour))
	if n := getNode(t, "postponed-a"); n.Spec.Unschedulable || stored(t, n.Name) != "" {
		t.Errorf("after the postponed maintenance: unschedulable %v, record %q", n.Spec.Unschedulable, stored(t, n.Name))
	}
}

// TestSecondMaintenanceIsHeld: a second maintenance (another type, a later start) reported
// while the drain is on is held beside the first: the first's close hands the Node on to it,
// not back into service, and the drain ends at the second's end.
func TestSecondMaintenanceIsHeld(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "second-a", false)
	first, second := t0.Add(5*time.Hour), t0.Add(2*24*time.Hour)
	a := nodedrain.Drain{EventID: "ev-a", Key: "arn:health/reboot", Match: "system-reboot@" + first.Format(time.RFC3339), Kind: "scheduled-change",
		EventTime: t0, Release: first.Add(2 * time.Hour)}
	b := nodedrain.Drain{EventID: "ev-b", Key: "arn:health/maintenance", Match: "system-maintenance@" + second.Format(time.RFC3339), Kind: "scheduled-change",
		EventTime: t0.Add(time.Minute), Release: second.Add(2 * time.Hour)}
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "second-a"), a); err != nil {
		t.Fatal(err)
	}
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "second-a"), b); err != nil || !already {
		t.Fatalf("Begin of the second maintenance: already=%v err=%v", already, err)
	}
	ended, err := s.drainer.Cancel(s.ctx, "second-a", nodedrain.Drain{EventID: "ev-a-closed", Key: a.Key, Match: a.Match, Kind: "scheduled-change", EventTime: t0.Add(2 * time.Minute)})
	if err != nil || ended {
		t.Fatalf("the first maintenance's close: ended=%v err=%v, want the drain handed on", ended, err)
	}
	if rec, _ := record(t, "second-a"); !getNode(t, "second-a").Spec.Unschedulable || rec.EventID != "ev-b" {
		t.Fatalf("after the first's close: unschedulable %v, record %+v, want the Node held for ev-b", getNode(t, "second-a").Spec.Unschedulable, rec)
	}
	s.finishDrain("second-a")
	s.releasePass("second-a", first.Add(2*time.Hour))
	if !getNode(t, "second-a").Spec.Unschedulable {
		t.Fatal("the Node went back into service at the first maintenance's end, with the second still to come")
	}
	s.releasePass("second-a", second.Add(2*time.Hour))
	if getNode(t, "second-a").Spec.Unschedulable {
		t.Error("still cordoned after the second maintenance's end")
	}
}

// TestRunningAgainHandsTheStopDrainOn: a stop drain that took in a reboot maintenance ends
// when the instance runs again, but the Node stays held for the maintenance.
func TestRunningAgainHandsTheStopDrainOn(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "stopheld-a", false)
	reboot := t0.Add(30 * time.Hour)
	stop := nodedrain.Drain{EventID: "stop-1", Kind: "state-change", EventTime: t0}
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "stopheld-a"), stop); err != nil {
		t.Fatal(err)
	}
	m := nodedrain.Drain{EventID: "ev-m", Key: "arn:health/reboot", Match: "system-reboot@" + reboot.Format(time.RFC3339), Kind: "scheduled-change",
		EventTime: t0.Add(time.Minute), Release: reboot.Add(2 * time.Hour)}
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "stopheld-a"), m); err != nil {
		t.Fatal(err)
	}
	if _, err := s.drainer.Cancel(s.ctx, "stopheld-a", nodedrain.Drain{EventID: "run-1", Kind: "state-change", EventTime: t0.Add(2 * time.Minute), Resumes: true}); err != nil {
		t.Fatal(err)
	}
	rec, _ := record(t, "stopheld-a")
	if !getNode(t, "stopheld-a").Spec.Unschedulable || rec.EventID != "ev-m" {
		t.Fatalf("after the running: unschedulable %v, record %+v, want the Node held for the reboot", getNode(t, "stopheld-a").Spec.Unschedulable, rec)
	}
}

// finishDrain runs passes until the cache shows the Node's drain done (no pods: one pass).
func (s *setup) finishDrain(node string) {
	s.t.Helper()
	eventually(s.t, "the cache shows the drain", func() bool { return cachedStored(s.t, node) != "" })
	s.pass()
	eventually(s.t, "the cache shows it done", func() bool {
		rec, ok, _ := cachedRecord(s.t, node)
		return ok && rec.Finished()
	})
}

// releasePass sets the clock to at, the Node Ready (AWS's reboot over), and runs a pass once
// the cache shows the record as written.
func (s *setup) releasePass(node string, at time.Time) {
	s.t.Helper()
	want := stored(s.t, node)
	eventually(s.t, "the cache shows the record", func() bool { return cachedStored(s.t, node) == want })
	s.clock.SetTime(at)
	n := getNode(s.t, node)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	must(s.t, direct.Status().Update(s.ctx, n))
	s.pass()
}
