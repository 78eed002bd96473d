package inplace

import (
	"io"
	"log/slog"
	"testing"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/record"
)

// TestAdoptRuns: an upgrade adopts a run from the old annotation only as EC2 and the
// NodeClaim confirm it, never at a step that reboots or empties on the annotation's word, and
// removes the key.
func TestAdoptRuns(t *testing.T) {
	ev := scheduled("ev-1", event.ScheduledInstanceReboot, start)
	at := func(step Step, f ...func(*State)) State {
		st := State{Version: Version, EventID: "ev-1", Type: event.ScheduledInstanceReboot, Instance: instance, Node: nodeName,
			Start: start, Step: step, Began: t0, StepSince: t0, Cordoned: true}
		for _, fn := range f {
			fn(&st)
		}
		return st
	}
	tests := []struct {
		name  string
		run   State
		shown bool
		// step is the adopted run's step ("" when nothing is adopted).
		step Step
	}{
		{"at the reboot, EC2 schedules it: started again from the cordon", at(StepReboot), true, StepCordon},
		{"evicting, EC2 schedules it: started again from the cordon", at(StepEvict), true, StepCordon},
		{"waiting for the start, EC2 schedules it: kept", at(StepWait), true, StepWait},
		{"past the reboot: kept, to give the node back once Ready", at(StepReady, func(s *State) { s.Rebooted = t0 }), true, StepReady},
		{"EC2 no longer schedules it: the node given back", at(StepEvict), false, StepUncordon},
		{"another instance: not adopted", at(StepReboot, func(s *State) { s.Instance = "i-0fffffffffffffff0" }), true, ""},
		{"another node: not adopted", at(StepCordon, func(s *State) { s.Node = "ng-system-1" }), true, ""},
		{"over: not adopted", at(StepDone, func(s *State) { s.Outcome = "done" }), true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigOpts{})
			if tt.shown {
				r.ec2.show(ev)
			}
			nc := r.claim()
			if nc.Annotations == nil {
				nc.Annotations = map[string]string{}
			}
			nc.Annotations[record.AnnotationRun] = encode(tt.run)
			if err := r.kube.Update(r.ctx, nc); err != nil {
				t.Fatal(err)
			}
			if _, err := AdoptRuns(r.ctx, r.kube, r.kube, r.ec2, r.clock, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
				t.Fatal(err)
			}
			if _, ok := r.claim().Annotations[record.AnnotationRun]; ok {
				t.Error("the old key stays")
			}
			st, ok, err := Read(r.mem())
			if err != nil || ok != (tt.step != "") || (ok && st.Step != tt.step) {
				t.Fatalf("adopted %v %s (%v), want step %q", ok, st.Step, err, tt.step)
			}
			for range 3 {
				r.pass()
			}
			if tt.step != StepReady && tt.step != StepCordon && tt.step != StepWait && len(r.ec2.calls) != 0 {
				t.Errorf("rebooted: %v", r.ec2.calls)
			}
			if tt.step == StepCordon && len(r.ec2.calls) > 0 && r.evictor.calls == 0 {
				t.Error("rebooted before evicting")
			}
		})
	}
}
