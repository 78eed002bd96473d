package inplace

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/test/harness"
)

// TestInstanceReboot: the whole run on a real API server and EC2: the Node cordoned and
// protected, its pods evicted through the Eviction API with a budget refusing one until
// another replica is Ready, the DaemonSet's pod left, RebootInstances called on the
// instance, the Node NotReady then Ready with a new boot, uncordoned, protection removed;
// router/upcoming's marks untouched.
func TestInstanceReboot(t *testing.T) {
	s := newSetup(t)
	const ns, name = "kafka", "kafka-a"
	id := s.instance()
	machine(t, name, id)
	newNamespace(t, ns)
	kafka := map[string]string{"app": "kafka"}
	rs := owner(t, ns, "kafka", false, kafka)
	newPod(t, ns, "kafka-0", name, rs, kafka)
	newPod(t, ns, "kafka-1", name, rs, kafka)
	newPod(t, ns, "kafka-2", "elsewhere", rs, kafka)
	newPod(t, ns, "agent-x", name, owner(t, ns, "agent", true, map[string]string{"app": "agent"}), nil)
	// Three healthy, two must stay: one eviction at a time.
	pdb := budget(t, ns, "kafka", kafka, 2, 3)
	k := startPodKubelet(t, ns)

	s.begin(name, scheduled("ev-reboot", id, event.ScheduledInstanceReboot))
	if got := s.reasons(); !slices.Equal(got, []string{inplace.ReasonBegun, inplace.ReasonBegun}) {
		t.Errorf("Events of Begin: %v", got)
	}
	if claim, node, cordoned := protection(t, name); !claim || node || cordoned {
		t.Errorf("after Begin: nodeclaim protected %v (want true), node protected %v, cordoned %v (want neither yet)", claim, node, cordoned)
	}

	s.pass(name) // cordon
	if claim, node, cordoned := protection(t, name); !claim || !node || !cordoned {
		t.Errorf("after the cordon: nodeclaim protected %v, node protected %v, cordoned %v; want all", claim, node, cordoned)
	}
	checkMarksKept(t, name)

	s.pass(name) // one eviction allowed, the second refused
	st := state(t, name)
	left := 0
	for _, p := range []string{"kafka-0", "kafka-1"} {
		if podState(t, ns, p) != "gone" {
			left++
		}
	}
	if st.Step != inplace.StepEvict || st.Attempts != 1 || left != 1 || !strings.Contains(st.LastError, "refused by a PodDisruptionBudget") {
		t.Fatalf("after the first round: %d kafka pod(s) left on the node; %+v", left, st)
	}
	// Another replica is Ready elsewhere: the disruption controller allows one again.
	newPod(t, ns, "kafka-3", "elsewhere", rs, kafka)
	setBudgetStatus(t, pdb, 3)
	s.clock.Step(10 * time.Second)
	s.pass(name)
	if st := state(t, name); st.Step != inplace.StepReboot {
		t.Fatalf("after the second round: %+v", st)
	}
	for pod, want := range map[string]string{"kafka-0": "gone", "kafka-1": "gone", "agent-x": "running", "kafka-2": "running", "kafka-3": "running"} {
		if got := podState(t, ns, pod); got != want {
			t.Errorf("pod %s: %s, want %s", pod, got, want)
		}
	}
	for _, pod := range []string{"kafka-0", "kafka-1"} {
		if !k.evictedByAPI(pod) {
			t.Errorf("pod %s was not removed through the Eviction API", pod)
		}
	}
	if n := s.calls.Calls("RebootInstances"); n != 0 {
		t.Fatalf("rebooted before the pods were evicted: %d calls", n)
	}

	s.clock.Step(time.Second)
	rebootAt := s.clock.Now()
	s.pass(name) // RebootInstances against moto: the instance exists, the call succeeds
	if n := s.calls.Calls("RebootInstances"); n != 1 {
		t.Errorf("RebootInstances calls: %d", n)
	}
	if st := state(t, name); st.Step != inplace.StepAwait || !st.Rebooted.Equal(rebootAt) || st.BootID != "boot-1" {
		t.Errorf("after the reboot: %+v", st)
	}
	s.events()

	s.clock.Step(20 * time.Second)
	kubelet(t, name, corev1.ConditionFalse, s.clock.Now(), "boot-1")
	s.clock.Step(15 * time.Second)
	s.pass(name)
	if st := state(t, name); st.Step != inplace.StepReady {
		t.Fatalf("the node NotReady: %+v", st)
	}
	s.clock.Step(45 * time.Second)
	kubelet(t, name, corev1.ConditionTrue, s.clock.Now(), "boot-2")
	s.clock.Step(15 * time.Second)
	s.passTo(name, inplace.StepDone)
	if st := state(t, name); st.Outcome != "done" {
		t.Errorf("outcome: %+v", st)
	}
	if claim, node, cordoned := protection(t, name); claim || node || cordoned {
		t.Errorf("after the run: nodeclaim protected %v, node protected %v, cordoned %v; want none", claim, node, cordoned)
	}
	if _, ok := getNode(t, name).Annotations[inplace.Annotation]; ok {
		t.Error("the run's mark was left on the node")
	}
	checkMarksKept(t, name)
	if got := s.reasons(); !slices.Equal(got, []string{inplace.ReasonDone, inplace.ReasonDone}) {
		t.Errorf("Events at the end: %v", got)
	}
	if len(s.fallbackCalls()) != 0 {
		t.Errorf("fallback called: %q", s.fallbackCalls())
	}
}

// TestNotReadyFallsBack: after AWS's system reboot the Node stays NotReady: the node is
// replaced (Fallback called), do-not-disrupt removed, the Node left cordoned.
func TestNotReadyFallsBack(t *testing.T) {
	s := newSetup(t)
	const name = "kafka-b"
	id := s.instance()
	machine(t, name, id)
	s.begin(name, scheduled("ev-system", id, event.ScheduledSystemReboot))
	s.passTo(name, inplace.StepAwait)
	if wait := s.pass(name); wait != start.Sub(t0) {
		t.Errorf("before the start: wait %s, want until the start", wait)
	}
	s.clock.SetTime(start.Add(time.Minute))
	kubelet(t, name, corev1.ConditionUnknown, start.Add(30*time.Second), "boot-1")
	s.pass(name)
	if st := state(t, name); st.Step != inplace.StepReady {
		t.Fatalf("NotReady after the start: %+v", st)
	}
	s.clock.Step(inplace.DefaultReadyTimeout)
	s.passTo(name, inplace.StepFallback)
	s.pass(name)
	st := state(t, name)
	calls := s.fallbackCalls()
	if !st.Over() || len(calls) != 1 || !strings.Contains(calls[0], "not Ready again") || st.Outcome != "fallback: "+st.Why {
		t.Errorf("after the fallback: %+v; fallbacks %q", st, calls)
	}
	if claim, node, cordoned := protection(t, name); claim || node || !cordoned {
		t.Errorf("after the fallback: nodeclaim protected %v, node protected %v (want neither), cordoned %v (want it)", claim, node, cordoned)
	}
	checkMarksKept(t, name)
	evs := s.events()
	if len(evs) < 2 || !strings.HasPrefix(evs[len(evs)-1], "Warning "+inplace.ReasonFallback) {
		t.Errorf("Events: %q, want the fallback's Warning last", evs)
	}
	if n := s.calls.Calls("RebootInstances"); n != 0 {
		t.Errorf("the router rebooted for a system event: %d calls", n)
	}
}

// TestSystemRebootMigration: a system-reboot of an instance whose reboot migration is on
// (DescribeInstances: rebootMigration default) is rebooted by the router once the Node is
// emptied, in the window that began the run, two days before AWS's start; EC2 (the stand-in,
// as EC2 does) then clears the event, which the run confirms before it gives the Node back.
// Where the migration does not happen (EC2 rebooted in place, the event remains) the Node
// goes back into service until the run prepares for AWS's start; where reboot migration is
// disabled the run waits for AWS's start as before, and the router never reboots.
func TestSystemRebootMigration(t *testing.T) {
	farStart := t0.Add(48 * time.Hour)
	for _, tc := range []struct {
		name      string
		migration string
		fails     bool
	}{
		{name: "migrated", migration: "default"},
		{name: "not migrated: the event remains", migration: "default", fails: true},
		{name: "disabled: AWS at the start", migration: "disabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t)
			s.ec2.migration = true
			s.restart()
			name := "kafka-m" + strings.Fields(tc.name)[0][:3]
			id := s.instance()
			machine(t, name, id)
			ev := scheduled("ev-migrate", id, event.ScheduledSystemReboot)
			ev.Deadline, ev.Health.Start = farStart, farStart
			s.begin(name, ev)
			s.status.Set(id, func(in *harness.Instance) { in.RebootMigration, in.MigrationFails = tc.migration, tc.fails })
			s.events()

			if tc.migration != "default" {
				s.pass(name)
				st := state(t, name)
				if st.Step != inplace.StepWait || st.Migration != inplace.MigrationOff || !strings.Contains(st.MigrationWhy, "disabled") {
					t.Fatalf("migration disabled: %+v", st)
				}
				if _, _, cordoned := protection(t, name); cordoned {
					t.Error("cordoned two days before AWS's start")
				}
				s.clock.SetTime(farStart.Add(-inplace.DefaultPrepare - inplace.DefaultEvictMargin))
				s.passTo(name, inplace.StepAwait)
				if st := state(t, name); !st.Rebooted.IsZero() || len(s.status.Reboots()) != 0 {
					t.Errorf("the router rebooted a system-reboot without reboot migration: %+v, %v", st, s.status.Reboots())
				}
				return
			}

			s.passTo(name, inplace.StepAwait)
			st := state(t, name)
			if st.Migration != inplace.MigrationOn || st.Rebooted.IsZero() {
				t.Fatalf("migration on, evicted: %+v", st)
			}
			if rb := s.status.Reboots(); len(rb) != 1 || rb[0].Error != "" || !slices.Equal(rb[0].InstanceIDs, []string{id}) {
				t.Fatalf("RebootInstances calls: %+v", rb)
			}
			if _, _, cordoned := protection(t, name); !cordoned {
				t.Error("rebooted without the cordon")
			}
			s.clock.Step(time.Minute)
			kubelet(t, name, corev1.ConditionFalse, s.clock.Now(), "boot-1")
			s.passTo(name, inplace.StepReady)
			s.clock.Step(2 * time.Minute)
			kubelet(t, name, corev1.ConditionTrue, s.clock.Now(), "boot-2")
			s.passTo(name, inplace.StepConfirm)
			_, shown := s.status.Event(id, "instance-event-ev-migrate")
			if shown == !tc.fails {
				t.Errorf("after the reboot EC2 shows the event: %v, want %v", shown, tc.fails)
			}
			if !tc.fails {
				s.passTo(name, inplace.StepDone)
				st := state(t, name)
				if st.Outcome != "done: the reboot migrated the instance: "+st.Why[len("the reboot migrated the instance: "):] || !strings.HasPrefix(st.Why, "the reboot migrated the instance") {
					t.Errorf("outcome %q", st.Outcome)
				}
				if claim, node, cordoned := protection(t, name); claim || node || cordoned {
					t.Errorf("after the migration: nodeclaim protected %v, node protected %v, cordoned %v; want none", claim, node, cordoned)
				}
				if back := s.clock.Now(); !back.Before(farStart.Add(-47 * time.Hour)) {
					t.Errorf("the node back in service at %s, not in the window (AWS's start %s)", back, farStart)
				}
				if got := s.reasons(); !slices.Contains(got, inplace.ReasonMigrated) {
					t.Errorf("Events %v, want %s", got, inplace.ReasonMigrated)
				}
				return
			}
			s.pass(name)
			if st := state(t, name); st.Step != inplace.StepConfirm {
				t.Fatalf("the event still shown within the bound: %+v", st)
			}
			s.clock.Step(inplace.DefaultMigrationConfirm)
			s.pass(name)
			st = state(t, name)
			if st.Step != inplace.StepRelease || st.Migration != inplace.MigrationOff || !strings.Contains(st.MigrationWhy, "did not clear") {
				t.Fatalf("not migrated: %+v", st)
			}
			s.passTo(name, inplace.StepWait)
			if claim, node, cordoned := protection(t, name); !claim || node || cordoned {
				t.Errorf("not migrated, back in service until AWS's start: nodeclaim protected %v (want it), node protected %v, cordoned %v", claim, node, cordoned)
			}
			if got := s.reasons(); !slices.Contains(got, inplace.ReasonNotMigrated) {
				t.Errorf("Events %v, want %s", got, inplace.ReasonNotMigrated)
			}
			if wait := s.pass(name); wait != farStart.Add(-inplace.DefaultPrepare-inplace.DefaultEvictMargin).Sub(s.clock.Now()) {
				t.Errorf("waiting for AWS's start: %s", wait)
			}
		})
	}
}

// TestRunnerReplaced: a new Runner (a restarted router, or another one elected) takes over
// mid-way from the annotations alone: the reboot is called once, and the run it did not
// begin is undone exactly.
func TestRunnerReplaced(t *testing.T) {
	s := newSetup(t)
	const name = "kafka-c"
	id := s.instance()
	machine(t, name, id)
	s.begin(name, scheduled("ev-replaced", id, event.ScheduledInstanceReboot))
	s.passTo(name, inplace.StepAwait) // cordon, evict (nothing to evict), reboot
	if n := s.calls.Calls("RebootInstances"); n != 1 {
		t.Fatalf("RebootInstances calls: %d", n)
	}
	s.restart()
	s.clock.Step(30 * time.Second)
	kubelet(t, name, corev1.ConditionTrue, s.clock.Now(), "boot-2") // a fast reboot, never seen NotReady
	s.clock.Step(10 * time.Second)
	s.passTo(name, inplace.StepDone)
	if n := s.calls.Calls("RebootInstances"); n != 1 {
		t.Errorf("RebootInstances calls after the takeover: %d, want 1", n)
	}
	if claim, node, cordoned := protection(t, name); claim || node || cordoned {
		t.Errorf("after the run: nodeclaim protected %v, node protected %v, cordoned %v; want none", claim, node, cordoned)
	}
	if got := s.reasons(); !slices.Equal(got, []string{inplace.ReasonDone, inplace.ReasonDone}) {
		t.Errorf("the new runner's Events: %v", got)
	}
}

// TestController: the Runner as a controller in a manager: a Begin is enough, the watch on
// the NodeClaim's annotation moves the run on, step by step, to the wait for AWS's start.
func TestController(t *testing.T) {
	s := newSetup(t)
	const name = "kafka-d"
	id := s.instance()
	machine(t, name, id)
	scheme, err := cluster.NewScheme()
	must(t, err)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	must(t, err)
	runner := inplace.New(mgr.GetClient(), mgr.GetAPIReader(), inplace.NewDrainEvictor(cs, s.log, inplace.WithClock(s.clock), inplace.WithMaxRound(evictRound)),
		s.ec2, s.clock, s.recorder, s.log, nil, s.fallback, inplace.Options{})
	must(t, runner.SetupWithManager(mgr))
	ctx, cancel := context.WithCancel(s.ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	s.runner = runner
	s.begin(name, scheduled("ev-controller", id, event.ScheduledSystemMaintenance))
	eventually(t, "the controller takes the run to the wait for the start", func() bool {
		mem, err := record.Load(background, direct, name)
		if err != nil {
			return false
		}
		st, ok, err := inplace.Read(mem)
		return err == nil && ok && st.Step == inplace.StepAwait
	})
	if claim, node, cordoned := protection(t, name); !claim || !node || !cordoned {
		t.Errorf("waiting for the start: nodeclaim protected %v, node protected %v, cordoned %v; want all", claim, node, cordoned)
	}
	if n := s.calls.Calls("RebootInstances"); n != 0 {
		t.Errorf("the router rebooted for a system event: %d calls", n)
	}
}

// TestOldKeysListedByMetadata: the adoption at start finds the NodeClaims that carry a key of
// the router's memory before the store through the API server's metadata-only list, and reads
// only those in full (a full list of every NodeClaim, twice, was the start's cost at scale).
func TestOldKeysListedByMetadata(t *testing.T) {
	machine(t, "old-keys-a", "i-0000000000000a0a1")
	machine(t, "old-keys-b", "i-0000000000000a0a2")
	machine(t, "old-keys-c", "i-0000000000000a0a3")
	nc := getClaim(t, "old-keys-b")
	nc.Annotations = map[string]string{record.AnnotationRun: `{"version":1}`}
	must(t, direct.Update(background, nc))
	got, err := record.WithOldKeys(background, direct, record.AnnotationRun, record.Annotation)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "old-keys-b" || got[0].Status.ProviderID == "" {
		t.Fatalf("nodeclaims with old keys: %+v, want old-keys-b read in full", got)
	}
}
