package inplace

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"pgregory.net/rapid"

	"github.com/health-router/health-router/router/event"
)

var (
	t0    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	start = t0.Add(2 * time.Hour)
	// evictBy is start - DefaultEvictMargin.
	evictBy = start.Add(-DefaultEvictMargin)
	// rebooted is when the router's RebootInstances succeeded in the cases that need it.
	rebooted = t0.Add(5 * time.Minute)
)

// run returns a run of typ at step, begun at t0.
func run(typ event.ScheduledType, step Step) State {
	return State{Version: Version, EventID: "ev-1", Type: typ, Instance: "i-0123456789abcdef0", Node: "ip-10-0-0-1",
		Start: start, Step: step, Began: t0, StepSince: t0}
}

func with(st State, f func(*State)) State { f(&st); return st }

// node states a pass may read.
var (
	ready       = NodeStatus{Found: true, Ready: corev1.ConditionTrue, ReadySince: t0.Add(-24 * time.Hour), BootID: "boot-1"}
	notReady    = NodeStatus{Found: true, Ready: corev1.ConditionFalse, ReadySince: t0.Add(-24 * time.Hour), BootID: "boot-1"}
	unknown     = NodeStatus{Found: true, Ready: corev1.ConditionUnknown, ReadySince: t0.Add(-24 * time.Hour), BootID: "boot-1"}
	noCondition = NodeStatus{Found: true, BootID: "boot-1"}
	gone        = NodeStatus{}
)

func readyAt(since time.Time, boot string) NodeStatus {
	return NodeStatus{Found: true, Ready: corev1.ConditionTrue, ReadySince: since, BootID: boot}
}

var errAPI = errors.New("the server is currently unable to handle the request")

func TestNext(t *testing.T) {
	reboot := event.ScheduledInstanceReboot
	system := event.ScheduledSystemReboot
	awaitRouter := with(run(reboot, StepAwait), func(s *State) { s.Rebooted, s.BootID, s.StepSince = rebooted, "boot-1", rebooted })
	awaitAWS := with(run(system, StepAwait), func(s *State) { s.BootID = "boot-1" })
	readyStep := func(typ event.ScheduledType, since time.Time) State {
		return with(run(typ, StepReady), func(s *State) { s.NotReadySince, s.StepSince, s.BootID = since, since, "boot-1" })
	}
	for _, tc := range []struct {
		name string
		st   State
		obs  Observation
		now  time.Time
		// want is the state Next must return; wantWait the wait; why, if set, must be in
		// Why (fallback) or LastError.
		want     State
		wantWait time.Duration
		why      string
	}{
		// StepCordon
		{name: "cordon: done, the run cordoned and protected the node", st: run(reboot, StepCordon),
			obs: Observation{Node: ready, Cordoned: true, NodeProtected: true}, now: t0.Add(time.Second),
			want: with(run(reboot, StepCordon), func(s *State) {
				s.Step, s.StepSince, s.Cordoned, s.NodeProtected = StepEvict, t0.Add(time.Second), true, true
			})},
		{name: "cordon: the node was cordoned and protected already: nothing to undo later", st: run(system, StepCordon),
			obs: Observation{Node: ready}, now: t0,
			want: with(run(system, StepCordon), func(s *State) { s.Step = StepEvict })},
		{name: "cordon: failed, retried after RetryMin", st: run(reboot, StepCordon),
			obs: Observation{Node: ready, Err: errAPI}, now: t0,
			want: with(run(reboot, StepCordon), func(s *State) { s.Attempts, s.LastError = 1, errAPI.Error() }), wantWait: DefaultRetryMin},
		{name: "cordon: third failure backs off 4x", st: with(run(reboot, StepCordon), func(s *State) { s.Attempts = 2 }),
			obs: Observation{Node: ready, Err: errAPI}, now: t0,
			want: with(run(reboot, StepCordon), func(s *State) { s.Attempts, s.LastError = 3, errAPI.Error() }), wantWait: 4 * DefaultRetryMin},
		{name: "cordon: the backoff stops at RetryMax", st: with(run(reboot, StepCordon), func(s *State) { s.Attempts = 30 }),
			obs: Observation{Node: ready, Err: errAPI}, now: t0,
			want: with(run(reboot, StepCordon), func(s *State) { s.Attempts, s.LastError = 31, errAPI.Error() }), wantWait: DefaultRetryMax},
		{name: "cordon: still failing at start - margin: fall back", st: with(run(reboot, StepCordon), func(s *State) { s.Attempts = 9 }),
			obs: Observation{Node: ready, Err: errAPI}, now: evictBy,
			want: with(run(reboot, StepCordon), func(s *State) { s.Step, s.StepSince = StepFallback, evictBy }), why: "could not be cordoned by 2026-03-01T13:50:00Z"},
		{name: "cordon: the node is gone: fall back", st: run(reboot, StepCordon), obs: Observation{Node: gone}, now: t0,
			want: with(run(reboot, StepCordon), func(s *State) { s.Step = StepFallback }), why: "the Node ip-10-0-0-1 is gone"},

		// StepEvict
		{name: "evict: none left, instance-reboot: the router reboots", st: run(reboot, StepEvict), obs: Observation{Node: ready}, now: t0.Add(time.Minute),
			want: with(run(reboot, StepEvict), func(s *State) { s.Step, s.StepSince = StepReboot, t0.Add(time.Minute) })},
		{name: "evict: none left, system-reboot: wait for AWS at the start, boot ID noted", st: run(system, StepEvict), obs: Observation{Node: ready}, now: t0.Add(time.Minute),
			want:     with(run(system, StepEvict), func(s *State) { s.Step, s.StepSince, s.BootID = StepAwait, t0.Add(time.Minute), "boot-1" }),
			wantWait: start.Sub(t0.Add(time.Minute))},
		{name: "evict: system-maintenance too", st: run(event.ScheduledSystemMaintenance, StepEvict), obs: Observation{Node: ready}, now: t0,
			want:     with(run(event.ScheduledSystemMaintenance, StepEvict), func(s *State) { s.Step, s.BootID = StepAwait, "boot-1" }),
			wantWait: 2 * time.Hour},
		{name: "evict: a budget refuses: another round after EvictEvery, recorded", st: run(reboot, StepEvict),
			obs: Observation{Node: ready, Left: 2, Refused: map[string]string{"kafka/kafka-0": "Cannot evict pod as it would violate the pod's disruption budget."}}, now: t0,
			want: with(run(reboot, StepEvict), func(s *State) {
				s.Attempts = 1
				s.LastError = "2 pod(s) left; refused by a PodDisruptionBudget: kafka/kafka-0: Cannot evict pod as it would violate the pod's disruption budget."
			}), wantWait: DefaultEvictEvery},
		{name: "evict: a refusal the helper retried until its timeout is a refusal, not a failure", st: run(reboot, StepEvict),
			obs: Observation{Node: ready, Left: 1, Refused: map[string]string{"kafka/kafka-1": "pdb"}, Err: errors.New("global timeout reached: 30s")}, now: t0,
			want: with(run(reboot, StepEvict), func(s *State) {
				s.Attempts, s.LastError = 1, "1 pod(s) left; refused by a PodDisruptionBudget: kafka/kafka-1: pdb"
			}), wantWait: DefaultEvictEvery},
		{name: "evict: the round failed: backoff", st: with(run(reboot, StepEvict), func(s *State) { s.Attempts = 1 }),
			obs: Observation{Node: ready, Left: 3, Err: errAPI}, now: t0,
			want: with(run(reboot, StepEvict), func(s *State) { s.Attempts, s.LastError = 2, errAPI.Error() }), wantWait: 2 * DefaultRetryMin},
		{name: "evict: pods left at start - margin: fall back, naming the refusal", st: with(run(system, StepEvict), func(s *State) { s.Attempts = 40 }),
			obs: Observation{Node: ready, Left: 1, Refused: map[string]string{"kafka/kafka-0": "pdb kafka"}}, now: evictBy,
			want: with(run(system, StepEvict), func(s *State) { s.Step, s.StepSince = StepFallback, evictBy }),
			why:  "the pods could not be evicted by 2026-03-01T13:50:00Z (10m0s before the start): 1 pod(s) left; refused by a PodDisruptionBudget: kafka/kafka-0: pdb kafka"},
		{name: "evict: the round failed at start - margin: fall back", st: run(system, StepEvict),
			obs: Observation{Node: ready, Err: errAPI}, now: evictBy.Add(time.Minute),
			want: with(run(system, StepEvict), func(s *State) { s.Step, s.StepSince = StepFallback, evictBy.Add(time.Minute) }), why: errAPI.Error()},
		{name: "evict: emptied late (a late hand-over) still goes on", st: run(reboot, StepEvict), obs: Observation{Node: ready}, now: evictBy.Add(time.Minute),
			want: with(run(reboot, StepEvict), func(s *State) { s.Step, s.StepSince = StepReboot, evictBy.Add(time.Minute) })},
		{name: "evict: restarted mid-way (attempts from the annotation), emptied: attempts reset",
			st:  with(run(reboot, StepEvict), func(s *State) { s.Attempts, s.LastError, s.Cordoned = 7, "1 pod(s) left", true }),
			obs: Observation{Node: ready}, now: t0.Add(20 * time.Minute),
			want: with(run(reboot, StepEvict), func(s *State) { s.Step, s.StepSince, s.Cordoned = StepReboot, t0.Add(20*time.Minute), true })},
		{name: "evict: the node is gone: fall back", st: run(reboot, StepEvict), obs: Observation{Node: gone}, now: t0,
			want: with(run(reboot, StepEvict), func(s *State) { s.Step = StepFallback }), why: "is gone"},

		// StepReboot
		{name: "reboot: called: wait for the reboot, from the call, boot ID noted", st: run(reboot, StepReboot), obs: Observation{Node: ready}, now: rebooted,
			want: with(run(reboot, StepReboot), func(s *State) { s.Step, s.StepSince, s.Rebooted, s.BootID = StepAwait, rebooted, rebooted, "boot-1" }), wantWait: DefaultPoll},
		{name: "reboot: EC2 does not show the maintenance: not rebooted, the Node given back", st: with(run(reboot, StepReboot), func(s *State) { s.RebootAsked = rebooted }),
			obs: Observation{Node: ready, Unscheduled: "EC2 shows no open instance-reboot"}, now: rebooted,
			want: with(run(reboot, StepReboot), func(s *State) { s.Step, s.StepSince = StepUncordon, rebooted }), why: "not rebooted: EC2 shows no open instance-reboot"},
		{name: "reboot: the call failed: retried", st: run(reboot, StepReboot), obs: Observation{Node: ready, Err: errAPI}, now: rebooted,
			want: with(run(reboot, StepReboot), func(s *State) { s.Attempts, s.LastError = 1, errAPI.Error() }), wantWait: DefaultRetryMin},
		{name: "reboot: RebootAttempts failures: AWS reboots at the start, the run waits for that",
			st:  with(run(reboot, StepReboot), func(s *State) { s.Attempts = DefaultRebootAttempts - 1 }),
			obs: Observation{Node: ready, Err: errAPI}, now: rebooted,
			want: with(run(reboot, StepReboot), func(s *State) {
				s.Step, s.StepSince, s.BootID = StepAwait, rebooted, "boot-1"
				s.LastError = "RebootInstances failed 5 time(s), the last: " + errAPI.Error() + "; AWS reboots the instance at the start"
			}), wantWait: start.Sub(rebooted)},
		{name: "reboot: a failure at start - margin leaves it to AWS at once", st: run(reboot, StepReboot),
			obs: Observation{Node: ready, Err: errAPI}, now: evictBy,
			want: with(run(reboot, StepReboot), func(s *State) {
				s.Step, s.StepSince, s.BootID = StepAwait, evictBy, "boot-1"
				s.LastError = "RebootInstances failed 1 time(s), the last: " + errAPI.Error() + "; AWS reboots the instance at the start"
			}), wantWait: DefaultEvictMargin},
		{name: "reboot: the node is gone: fall back", st: run(reboot, StepReboot), obs: Observation{Node: gone}, now: t0,
			want: with(run(reboot, StepReboot), func(s *State) { s.Step = StepFallback }), why: "is gone"},

		// StepAwait after the router's reboot
		{name: "await (router): still Ready, same boot, no transition: poll", st: awaitRouter, obs: Observation{Node: ready}, now: rebooted.Add(time.Minute),
			want: awaitRouter, wantWait: DefaultPoll},
		{name: "await (router): NotReady: wait for Ready", st: awaitRouter, obs: Observation{Node: notReady}, now: rebooted.Add(time.Minute),
			want: with(awaitRouter, func(s *State) {
				s.Step, s.StepSince, s.NotReadySince = StepReady, rebooted.Add(time.Minute), rebooted.Add(time.Minute)
			}), wantWait: DefaultPoll},
		{name: "await (router): Unknown (the node controller's view) counts as NotReady", st: awaitRouter, obs: Observation{Node: unknown}, now: rebooted.Add(time.Minute),
			want: with(awaitRouter, func(s *State) {
				s.Step, s.StepSince, s.NotReadySince = StepReady, rebooted.Add(time.Minute), rebooted.Add(time.Minute)
			}), wantWait: DefaultPoll},
		{name: "await (router): no Ready condition counts as NotReady", st: awaitRouter, obs: Observation{Node: noCondition}, now: rebooted.Add(time.Minute),
			want: with(awaitRouter, func(s *State) {
				s.Step, s.StepSince, s.NotReadySince = StepReady, rebooted.Add(time.Minute), rebooted.Add(time.Minute)
			}), wantWait: DefaultPoll},
		{name: "await (router): Ready with a new boot ID: rebooted, uncordon", st: awaitRouter,
			obs: Observation{Node: readyAt(t0.Add(-24*time.Hour), "boot-2")}, now: rebooted.Add(2 * time.Minute),
			want: with(awaitRouter, func(s *State) { s.Step, s.StepSince = StepUncordon, rebooted.Add(2*time.Minute) })},
		{name: "await (router): a fast reboot never seen NotReady: Ready transition after the call", st: awaitRouter,
			obs: Observation{Node: readyAt(rebooted.Add(time.Second), "boot-1")}, now: rebooted.Add(2 * time.Minute),
			want: with(awaitRouter, func(s *State) { s.Step, s.StepSince = StepUncordon, rebooted.Add(2*time.Minute) })},
		{name: "await (router): a transition at the call itself is not after it", st: awaitRouter,
			obs: Observation{Node: readyAt(rebooted, "boot-1")}, now: rebooted.Add(2 * time.Minute), want: awaitRouter, wantWait: DefaultPoll},
		{name: "await (router): no boot ID recorded: a new one is no proof, the transition still is",
			st:  with(awaitRouter, func(s *State) { s.BootID = "" }),
			obs: Observation{Node: readyAt(t0.Add(-time.Hour), "boot-2")}, now: rebooted.Add(2 * time.Minute),
			want: with(awaitRouter, func(s *State) { s.BootID = "" }), wantWait: DefaultPoll},
		{name: "await (router): no reboot seen within ReadyTimeout of the call: fall back", st: awaitRouter,
			obs: Observation{Node: ready}, now: rebooted.Add(DefaultReadyTimeout),
			want: with(awaitRouter, func(s *State) { s.Step, s.StepSince = StepFallback, rebooted.Add(DefaultReadyTimeout) }),
			why:  "no reboot seen within 15m0s of RebootInstances"},
		{name: "await (router): the node is gone: fall back", st: awaitRouter, obs: Observation{Node: gone}, now: rebooted.Add(time.Minute),
			want: with(awaitRouter, func(s *State) { s.Step, s.StepSince = StepFallback, rebooted.Add(time.Minute) }), why: "is gone"},

		// StepAwait for AWS's reboot at the start
		{name: "await (AWS): before the start, even NotReady: wait for the start", st: awaitAWS, obs: Observation{Node: notReady}, now: start.Add(-time.Hour),
			want: awaitAWS, wantWait: time.Hour},
		{name: "await (AWS): after the start, NotReady: wait for Ready", st: awaitAWS, obs: Observation{Node: notReady}, now: start.Add(3 * time.Minute),
			want: with(awaitAWS, func(s *State) {
				s.Step, s.StepSince, s.NotReadySince = StepReady, start.Add(3*time.Minute), start.Add(3*time.Minute)
			}),
			wantWait: DefaultPoll},
		{name: "await (AWS): after the start, Ready with a new boot: uncordon", st: awaitAWS,
			obs: Observation{Node: readyAt(t0, "boot-2")}, now: start.Add(5 * time.Minute),
			want: with(awaitAWS, func(s *State) { s.Step, s.StepSince = StepUncordon, start.Add(5*time.Minute) })},
		{name: "await (AWS): after the start, a Ready transition after the start: uncordon", st: awaitAWS,
			obs: Observation{Node: readyAt(start.Add(time.Minute), "boot-1")}, now: start.Add(5 * time.Minute),
			want: with(awaitAWS, func(s *State) { s.Step, s.StepSince = StepUncordon, start.Add(5*time.Minute) })},
		{name: "await (AWS): Ready throughout, within Quiet: poll", st: awaitAWS, obs: Observation{Node: ready}, now: start.Add(10 * time.Minute),
			want: awaitAWS, wantWait: DefaultPoll},
		{name: "await (AWS): Ready throughout, Quiet nearly over: wait only until its end", st: awaitAWS, obs: Observation{Node: ready},
			now: start.Add(DefaultQuiet - 5*time.Second), want: awaitAWS, wantWait: 5 * time.Second},
		{name: "await (AWS): Ready throughout Quiet: no visible effect, uncordon", st: awaitAWS, obs: Observation{Node: ready}, now: start.Add(DefaultQuiet),
			want: with(awaitAWS, func(s *State) { s.Step, s.StepSince = StepUncordon, start.Add(DefaultQuiet) }),
			why:  "stayed Ready from the start 2026-03-01T14:00:00Z to 2026-03-01T15:00:00Z"},
		{name: "await (AWS): the event's window ends before Quiet: its end bounds the wait",
			st:  with(awaitAWS, func(s *State) { s.End = start.Add(30 * time.Minute) }),
			obs: Observation{Node: ready}, now: start.Add(30 * time.Minute),
			want: with(awaitAWS, func(s *State) {
				s.End, s.Step, s.StepSince = start.Add(30*time.Minute), StepUncordon, start.Add(30*time.Minute)
			}),
			why: "to 2026-03-01T14:30:00Z"},
		{name: "await (AWS): a window longer than Quiet is waited out", st: with(awaitAWS, func(s *State) { s.End = start.Add(3 * time.Hour) }),
			obs: Observation{Node: ready}, now: start.Add(DefaultQuiet), want: with(awaitAWS, func(s *State) { s.End = start.Add(3 * time.Hour) }), wantWait: DefaultPoll},
		{name: "await (AWS): an end before the start is ignored", st: with(awaitAWS, func(s *State) { s.End = start.Add(-time.Minute) }),
			obs: Observation{Node: ready}, now: start.Add(DefaultQuiet),
			want: with(awaitAWS, func(s *State) {
				s.End, s.Step, s.StepSince = start.Add(-time.Minute), StepUncordon, start.Add(DefaultQuiet)
			}),
			why: "to 2026-03-01T15:00:00Z"},
		{name: "await (AWS): a reboot left to AWS after RebootInstances failed waits for the start",
			st:  with(run(reboot, StepAwait), func(s *State) { s.BootID = "boot-1" }),
			obs: Observation{Node: ready}, now: start.Add(-time.Minute), want: with(run(reboot, StepAwait), func(s *State) { s.BootID = "boot-1" }), wantWait: time.Minute},

		// StepReady
		{name: "ready: Ready again: uncordon", st: readyStep(reboot, rebooted.Add(time.Minute)), obs: Observation{Node: readyAt(rebooted.Add(3*time.Minute), "boot-2")},
			now:  rebooted.Add(4 * time.Minute),
			want: with(readyStep(reboot, rebooted.Add(time.Minute)), func(s *State) { s.Step, s.StepSince = StepUncordon, rebooted.Add(4*time.Minute) })},
		{name: "ready: still NotReady: poll", st: readyStep(system, start), obs: Observation{Node: notReady}, now: start.Add(time.Minute),
			want: readyStep(system, start), wantWait: DefaultPoll},
		{name: "ready: still NotReady, the bound near: wait only until it", st: readyStep(system, start), obs: Observation{Node: notReady},
			now: start.Add(DefaultReadyTimeout - 2*time.Second), want: readyStep(system, start), wantWait: 2 * time.Second},
		{name: "ready: NotReady ReadyTimeout after going NotReady: fall back", st: readyStep(system, start), obs: Observation{Node: unknown},
			now:  start.Add(DefaultReadyTimeout),
			want: with(readyStep(system, start), func(s *State) { s.Step, s.StepSince = StepFallback, start.Add(DefaultReadyTimeout) }),
			why:  "not Ready again within 15m0s of going NotReady at 2026-03-01T14:00:00Z"},
		{name: "ready: the node is gone: fall back", st: readyStep(system, start), obs: Observation{Node: gone}, now: start.Add(time.Minute),
			want: with(readyStep(system, start), func(s *State) { s.Step, s.StepSince = StepFallback, start.Add(time.Minute) }), why: "is gone"},

		// StepUncordon
		{name: "uncordon: done", st: run(reboot, StepUncordon), obs: Observation{Node: ready}, now: t0.Add(time.Hour),
			want: with(run(reboot, StepUncordon), func(s *State) { s.Step, s.StepSince, s.Outcome = StepDone, t0.Add(time.Hour), "done" })},
		{name: "uncordon: done, with the note of a maintenance without effect", st: with(run(system, StepUncordon), func(s *State) { s.Why = "no visible effect" }),
			obs: Observation{Node: ready}, now: t0,
			want: with(run(system, StepUncordon), func(s *State) { s.Why, s.Step, s.Outcome = "no visible effect", StepDone, "done: no visible effect" })},
		{name: "uncordon: failed: retried, without bound", st: with(run(reboot, StepUncordon), func(s *State) { s.Attempts = 3 }),
			obs: Observation{Node: ready, Err: errAPI}, now: start.Add(48 * time.Hour),
			want: with(run(reboot, StepUncordon), func(s *State) { s.Attempts, s.LastError = 4, errAPI.Error() }), wantWait: 8 * DefaultRetryMin},
		{name: "uncordon: the node is gone: nothing to undo, done", st: run(reboot, StepUncordon), obs: Observation{Node: gone}, now: t0,
			want: with(run(reboot, StepUncordon), func(s *State) { s.Step, s.Outcome = StepDone, "done" })},

		// StepFallback
		{name: "fallback: called: over", st: with(run(reboot, StepFallback), func(s *State) { s.Why = "no reboot seen" }), obs: Observation{Node: ready}, now: t0.Add(time.Hour),
			want: with(run(reboot, StepFallback), func(s *State) {
				s.Why, s.StepSince, s.Outcome = "no reboot seen", t0.Add(time.Hour), "fallback: no reboot seen"
			})},
		{name: "fallback: failed: retried", st: with(run(reboot, StepFallback), func(s *State) { s.Why = "w" }), obs: Observation{Node: ready, Err: errAPI}, now: t0,
			want: with(run(reboot, StepFallback), func(s *State) { s.Why, s.Attempts, s.LastError = "w", 1, errAPI.Error() }), wantWait: DefaultRetryMin},
		{name: "fallback: the node is gone: called all the same, over", st: with(run(reboot, StepFallback), func(s *State) { s.Why = "w" }), obs: Observation{Node: gone}, now: t0,
			want: with(run(reboot, StepFallback), func(s *State) { s.Why, s.Outcome = "w", "fallback: w" })},

		// Reboot migration (system-reboot): asked on the first pass; on, the router reboots in
		// the window and confirms the event gone; off, AWS reboots at the start.
		{name: "migration: asked while waiting, on: prepared at once", st: with(run(system, StepWait), func(s *State) { s.Start = t0.Add(48 * time.Hour) }),
			obs: Observation{Node: ready, Migration: MigrationOn, MigrationWhy: "default"}, now: t0,
			want: with(run(system, StepWait), func(s *State) {
				s.Start, s.Step, s.Migration, s.MigrationWhy = t0.Add(48*time.Hour), StepCordon, MigrationOn, "default"
			})},
		{name: "migration: asked while waiting, off: waits for the start as before", st: with(run(system, StepWait), func(s *State) { s.Start = t0.Add(48 * time.Hour) }),
			obs: Observation{Node: ready, Migration: MigrationOff, MigrationWhy: "disabled"}, now: t0,
			want:     with(run(system, StepWait), func(s *State) { s.Start, s.Migration, s.MigrationWhy = t0.Add(48*time.Hour), MigrationOff, "disabled" }),
			wantWait: 48*time.Hour - DefaultPrepare - DefaultEvictMargin},
		{name: "migration: not asked for a system-maintenance", st: run(event.ScheduledSystemMaintenance, StepCordon),
			obs: Observation{Node: ready, Migration: MigrationOn}, now: t0,
			want: with(run(event.ScheduledSystemMaintenance, StepCordon), func(s *State) { s.Step = StepEvict })},
		{name: "migration: on, evicted: the router reboots", st: with(run(system, StepEvict), func(s *State) { s.Migration = MigrationOn }), obs: Observation{Node: ready}, now: t0,
			want: with(run(system, StepEvict), func(s *State) { s.Migration, s.Step = MigrationOn, StepReboot })},
		{name: "migration: rebooted and Ready with a new boot: confirm with EC2",
			st: with(run(system, StepAwait), func(s *State) {
				s.Migration, s.Rebooted, s.BootID, s.StepSince = MigrationOn, rebooted, "boot-1", rebooted
			}),
			obs: Observation{Node: readyAt(rebooted.Add(time.Minute), "boot-2")}, now: rebooted.Add(2 * time.Minute),
			want: with(run(system, StepAwait), func(s *State) {
				s.Migration, s.Rebooted, s.BootID, s.Step, s.StepSince = MigrationOn, rebooted, "boot-1", StepConfirm, rebooted.Add(2*time.Minute)
			})},
		{name: "migration: Ready again after NotReady: confirm with EC2",
			st:  with(readyStep(system, rebooted.Add(time.Minute)), func(s *State) { s.Migration, s.Rebooted = MigrationOn, rebooted }),
			obs: Observation{Node: readyAt(rebooted.Add(3*time.Minute), "boot-2")}, now: rebooted.Add(3 * time.Minute),
			want: with(readyStep(system, rebooted.Add(time.Minute)), func(s *State) {
				s.Migration, s.Rebooted, s.Step, s.StepSince = MigrationOn, rebooted, StepConfirm, rebooted.Add(3*time.Minute)
			})},
		{name: "migration: EC2 no longer shows the event: uncordon",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: ready, Unscheduled: "EC2 shows no open system-reboot"}, now: rebooted.Add(time.Minute),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Migration, s.Rebooted, s.Step, s.StepSince = MigrationOn, rebooted, StepUncordon, rebooted.Add(time.Minute)
			}), why: "the reboot migrated the instance: EC2 shows no open system-reboot"},
		{name: "migration: the event still shown: asked again",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: ready}, now: rebooted.Add(time.Minute),
			want: with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }), wantWait: DefaultPoll},
		{name: "migration: EC2 fails to answer: noted, asked again",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: ready, Err: errAPI}, now: rebooted.Add(time.Minute),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Migration, s.Rebooted, s.StepSince, s.Attempts, s.LastError = MigrationOn, rebooted, rebooted, 1, errAPI.Error()
			}), wantWait: DefaultPoll},
		{name: "migration: still shown past the bound, the start far: the Node serves until then",
			st: with(run(system, StepConfirm), func(s *State) {
				s.Start, s.Migration, s.Rebooted, s.StepSince = t0.Add(48*time.Hour), MigrationOn, rebooted, rebooted
			}),
			obs: Observation{Node: readyAt(rebooted, "boot-2")}, now: rebooted.Add(DefaultMigrationConfirm),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Start, s.Migration, s.Step, s.StepSince, s.BootID = t0.Add(48*time.Hour), MigrationOff, StepRelease, rebooted.Add(DefaultMigrationConfirm), "boot-2"
				s.MigrationWhy = "the router's reboot at 2026-03-01T12:05:00Z did not clear the system-reboot (EC2 still shows it 10m0s after the Node was Ready again; the last answer: the event is shown)"
			}), why: "not migrated: the Node serves until AWS's reboot at 2026-03-03T12:00:00Z"},
		{name: "migration: still shown past the bound, the start near: out of service until AWS's reboot",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: readyAt(rebooted, "boot-2")}, now: rebooted.Add(DefaultMigrationConfirm),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Migration, s.Step, s.StepSince, s.BootID = MigrationOff, StepAwait, rebooted.Add(DefaultMigrationConfirm), "boot-2"
				s.MigrationWhy = "the router's reboot at 2026-03-01T12:05:00Z did not clear the system-reboot (EC2 still shows it 10m0s after the Node was Ready again; the last answer: the event is shown)"
			}), why: "stays out of service until AWS's reboot", wantWait: start.Sub(rebooted.Add(DefaultMigrationConfirm))},

		// EC2 does not answer past the bound: whether the migration cleared the event is not
		// known. The Node stays out of service (if the event remains, AWS reboots it at the
		// start) and EC2 is asked again, until AWS's window is over either way: neither given
		// back to be emptied again for a reboot that may never come, nor held for it.
		{name: "migration: EC2 has not answered by the bound, the start far: asked again, the Node kept out",
			st: with(run(system, StepConfirm), func(s *State) {
				s.Start, s.Migration, s.Rebooted, s.StepSince, s.Attempts = t0.Add(48*time.Hour), MigrationOn, rebooted, rebooted, 9
			}),
			obs: Observation{Node: readyAt(rebooted, "boot-2"), Err: errAPI}, now: rebooted.Add(DefaultMigrationConfirm),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Start, s.Migration, s.Rebooted, s.StepSince, s.Attempts, s.LastError = t0.Add(48*time.Hour), MigrationOn, rebooted, rebooted, 10, errAPI.Error()
			}), wantWait: DefaultRetryMax},
		{name: "migration: EC2 has not answered by the bound, the start near: asked again, not waiting for AWS",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: readyAt(rebooted, "boot-2"), Err: errAPI}, now: rebooted.Add(DefaultMigrationConfirm),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Migration, s.Rebooted, s.StepSince, s.Attempts, s.LastError = MigrationOn, rebooted, rebooted, 1, errAPI.Error()
			}), wantWait: DefaultRetryMin},
		{name: "migration: EC2 has not answered through AWS's window: given back",
			st:  with(run(system, StepConfirm), func(s *State) { s.Migration, s.Rebooted, s.StepSince = MigrationOn, rebooted, rebooted }),
			obs: Observation{Node: readyAt(rebooted, "boot-2"), Err: errAPI}, now: start.Add(DefaultQuiet),
			want: with(run(system, StepConfirm), func(s *State) {
				s.Migration, s.Rebooted, s.Step, s.StepSince = MigrationOn, rebooted, StepUncordon, start.Add(DefaultQuiet)
			}), why: "EC2 did not answer whether the reboot migration cleared the system-reboot"},

		// Karpenter reboots the node (its Rebooting condition): a run that has not rebooted
		// holds, whatever its deadlines; one whose reboot is under way goes on.
		{name: "karpenter rebooting: the cordon holds", st: run(reboot, StepCordon), obs: Observation{Node: ready, KarpenterRebooting: true}, now: t0,
			want: with(run(reboot, StepCordon), func(s *State) { s.LastError = heldNote }), wantWait: DefaultPoll},
		{name: "karpenter rebooting: the evictions hold past start - margin, no fallback", st: run(system, StepEvict), obs: Observation{Node: notReady, Left: 2, KarpenterRebooting: true}, now: evictBy.Add(time.Minute),
			want: with(run(system, StepEvict), func(s *State) { s.LastError = heldNote }), wantWait: DefaultPoll},
		{name: "karpenter rebooting: the router's reboot holds", st: run(reboot, StepReboot), obs: Observation{Node: ready, KarpenterRebooting: true}, now: t0,
			want: with(run(reboot, StepReboot), func(s *State) { s.LastError = heldNote }), wantWait: DefaultPoll},
		{name: "karpenter rebooting: a wait that is due holds", st: run(system, StepWait), obs: Observation{Node: ready, KarpenterRebooting: true}, now: start.Add(-DefaultPrepare),
			want: with(run(system, StepWait), func(s *State) { s.LastError = heldNote }), wantWait: DefaultPoll},
		{name: "karpenter rebooting: a wait not due waits as before", st: with(run(system, StepWait), func(s *State) { s.Start = t0.Add(5 * time.Hour) }),
			obs: Observation{Node: ready, KarpenterRebooting: true}, now: t0,
			want: with(run(system, StepWait), func(s *State) { s.Start = t0.Add(5 * time.Hour) }), wantWait: 5*time.Hour - DefaultPrepare - DefaultEvictMargin},
		{name: "karpenter rebooting: a reboot the router asked for goes on", st: with(run(reboot, StepReboot), func(s *State) { s.RebootAsked = t0 }),
			obs: Observation{Node: ready, KarpenterRebooting: true}, now: t0.Add(time.Second),
			want: with(run(reboot, StepReboot), func(s *State) {
				s.Step, s.StepSince, s.RebootAsked, s.Rebooted, s.BootID = StepAwait, t0.Add(time.Second), t0, t0, "boot-1"
			}), wantWait: DefaultPoll},

		// Over
		{name: "done: nothing more", st: with(run(reboot, StepDone), func(s *State) { s.Outcome = "done" }), obs: Observation{Node: gone}, now: start.Add(time.Hour),
			want: with(run(reboot, StepDone), func(s *State) { s.Outcome = "done" })},
		{name: "fallen back: nothing more", st: with(run(reboot, StepFallback), func(s *State) { s.Why, s.Outcome = "w", "fallback: w" }), obs: Observation{Node: notReady, Err: errAPI},
			now: start, want: with(run(reboot, StepFallback), func(s *State) { s.Why, s.Outcome = "w", "fallback: w" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Next(tc.st, tc.obs, tc.now, Options{})
			got := d.State
			if tc.why != "" {
				if !strings.Contains(got.Why, tc.why) && !strings.Contains(got.LastError, tc.why) {
					t.Errorf("why %q / last error %q, want it to contain %q", got.Why, got.LastError, tc.why)
				}
				got.Why = tc.want.Why
			}
			if encode(got) != encode(tc.want) {
				t.Errorf("state:\n got %s\nwant %s", encode(got), encode(tc.want))
			}
			if d.Wait != tc.wantWait {
				t.Errorf("wait %s, want %s", d.Wait, tc.wantWait)
			}
			// A restarted router reads the state back from the annotation: same decision.
			back, err := decode(encode(tc.st))
			if err != nil {
				t.Fatal(err)
			}
			if again := Next(back, tc.obs, tc.now, Options{}); encode(again.State) != encode(d.State) || again.Wait != d.Wait {
				t.Errorf("after a restart (the state read back): %s, wait %s; before: %s, wait %s", encode(again.State), again.Wait, encode(d.State), d.Wait)
			}
		})
	}
}

// TestNextOptions: the bounds follow Options.
func TestNextOptions(t *testing.T) {
	o := Options{EvictMargin: time.Hour, ReadyTimeout: time.Minute, Quiet: 5 * time.Minute, Poll: time.Second, EvictEvery: 3 * time.Second,
		RebootAttempts: 1, RetryMin: time.Second, RetryMax: 2 * time.Second}
	system := run(event.ScheduledSystemReboot, StepEvict)
	if d := Next(system, Observation{Node: ready, Left: 1}, start.Add(-time.Hour), o); d.State.Step != StepFallback {
		t.Errorf("evict at start - EvictMargin: %s, want fallback", d.State.Step)
	}
	if d := Next(system, Observation{Node: ready, Left: 1}, start.Add(-time.Hour-time.Second), o); d.State.Step != StepEvict || d.Wait != 3*time.Second {
		t.Errorf("evict before start - EvictMargin: %s after %s, want evict after EvictEvery", d.State.Step, d.Wait)
	}
	if d := Next(run(event.ScheduledInstanceReboot, StepReboot), Observation{Node: ready, Err: errAPI}, t0, o); d.State.Step != StepAwait {
		t.Errorf("reboot failed with RebootAttempts 1: %s, want await (left to AWS)", d.State.Step)
	}
	aws := with(run(event.ScheduledSystemReboot, StepAwait), func(s *State) { s.BootID = "boot-1" })
	if d := Next(aws, Observation{Node: ready}, start.Add(5*time.Minute), o); d.State.Step != StepUncordon {
		t.Errorf("Ready throughout Quiet: %s, want uncordon", d.State.Step)
	}
	if d := Next(aws, Observation{Node: ready}, start.Add(time.Minute), o); d.Wait != time.Second {
		t.Errorf("poll: %s, want Poll", d.Wait)
	}
	r := with(run(event.ScheduledSystemReboot, StepReady), func(s *State) { s.NotReadySince = start })
	if d := Next(r, Observation{Node: notReady}, start.Add(time.Minute), o); d.State.Step != StepFallback {
		t.Errorf("NotReady for ReadyTimeout: %s, want fallback", d.State.Step)
	}
	c := with(run(event.ScheduledSystemReboot, StepCordon), func(s *State) { s.Attempts = 5 })
	if d := Next(c, Observation{Node: ready, Err: errAPI}, t0, o); d.Wait != 2*time.Second {
		t.Errorf("backoff: %s, want RetryMax", d.Wait)
	}
}

// TestNextWalk: whole runs, pass by pass, as the Runner drives Next.
func TestNextWalk(t *testing.T) {
	type pass struct {
		at   time.Duration // after t0
		obs  Observation
		step Step // after the pass
	}
	for _, tc := range []struct {
		name    string
		typ     event.ScheduledType
		passes  []pass
		outcome string
	}{
		{"instance-reboot, seen NotReady", event.ScheduledInstanceReboot, []pass{
			{0, Observation{Node: ready, Cordoned: true, NodeProtected: true}, StepEvict},
			{time.Second, Observation{Node: ready, Left: 1}, StepEvict},
			{time.Minute, Observation{Node: ready}, StepReboot},
			{2 * time.Minute, Observation{Node: ready}, StepAwait},
			{3 * time.Minute, Observation{Node: notReady}, StepReady},
			{4 * time.Minute, Observation{Node: notReady}, StepReady},
			{5 * time.Minute, Observation{Node: readyAt(t0.Add(5*time.Minute), "boot-2")}, StepUncordon},
			{6 * time.Minute, Observation{Node: readyAt(t0.Add(5*time.Minute), "boot-2")}, StepDone},
		}, "done"},
		{"system-reboot, AWS at the start", event.ScheduledSystemReboot, []pass{
			{0, Observation{Node: ready}, StepEvict},
			{time.Minute, Observation{Node: ready}, StepAwait},
			{time.Hour, Observation{Node: ready}, StepAwait},
			{2*time.Hour + time.Minute, Observation{Node: unknown}, StepReady},
			{2*time.Hour + 20*time.Minute, Observation{Node: unknown}, StepFallback},
			{2*time.Hour + 21*time.Minute, Observation{Node: unknown}, StepFallback},
		}, "fallback: the Node was not Ready again within 15m0s of going NotReady at 2026-03-01T14:01:00Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := run(tc.typ, StepCordon)
			for i, p := range tc.passes {
				st = Next(st, p.obs, t0.Add(p.at), Options{}).State
				if st.Step != p.step {
					t.Fatalf("pass %d: step %s, want %s (%s)", i, st.Step, p.step, encode(st))
				}
			}
			if st.Outcome != tc.outcome {
				t.Errorf("outcome %q, want %q", st.Outcome, tc.outcome)
			}
		})
	}
}

// next are the steps a step may be followed by.
var next = map[Step][]Step{
	StepCordon:   {StepCordon, StepEvict, StepFallback},
	StepEvict:    {StepEvict, StepReboot, StepAwait, StepFallback},
	StepReboot:   {StepReboot, StepAwait, StepUncordon, StepFallback}, // uncordon: EC2 shows no maintenance to reboot for
	StepAwait:    {StepAwait, StepReady, StepConfirm, StepUncordon, StepFallback},
	StepReady:    {StepReady, StepAwait, StepConfirm, StepUncordon, StepFallback}, // back to await: a blip before AWS's reboot
	StepConfirm:  {StepConfirm, StepUncordon, StepRelease, StepAwait, StepFallback},
	StepWait:     {StepWait, StepCordon},
	StepRelease:  {StepRelease, StepWait},
	StepUncordon: {StepUncordon, StepDone},
	StepFallback: {StepFallback},
	StepDone:     {StepDone},
}

// TestNextProperties: whatever the Node does and whatever fails, a run moves only along the
// steps' edges, never changes once over, and, once its bounds have passed and its actions
// succeed, is over within a few passes.
func TestNextProperties(t *testing.T) {
	statuses := []NodeStatus{ready, notReady, unknown, noCondition, gone, readyAt(t0, "boot-2")}
	rapid.Check(t, func(t *rapid.T) {
		typ := rapid.SampledFrom(Types).Draw(t, "type")
		st := run(typ, StepCordon)
		st.Start = t0.Add(time.Duration(rapid.Int64Range(-30, 300).Draw(t, "start_min")) * time.Minute)
		if rapid.Bool().Draw(t, "end") {
			st.End = st.Start.Add(time.Duration(rapid.Int64Range(-10, 240).Draw(t, "end_min")) * time.Minute)
		}
		now := t0
		for i := range rapid.IntRange(1, 60).Draw(t, "passes") {
			now = now.Add(time.Duration(rapid.Int64Range(0, 20*60).Draw(t, "step_s")) * time.Second)
			obs := Observation{Node: rapid.SampledFrom(statuses).Draw(t, "node")}
			obs.Node.ReadySince = now.Add(-time.Duration(rapid.Int64Range(0, 3600).Draw(t, "since_s")) * time.Second)
			if rapid.IntRange(0, 3).Draw(t, "fail") == 0 {
				obs.Err = errAPI
			}
			if st.Step == StepEvict {
				obs.Left = rapid.IntRange(0, 2).Draw(t, "left")
			}
			obs.Migration = rapid.SampledFrom([]Migration{"", MigrationOn, MigrationOff}).Draw(t, "migration")
			if rapid.Bool().Draw(t, "unscheduled") {
				obs.Unscheduled = "EC2 shows no open event"
			}
			d := Next(st, obs, now, Options{})
			if !slices.Contains(next[st.Step], d.State.Step) {
				t.Fatalf("pass %d: %s -> %s", i, st.Step, d.State.Step)
			}
			if st.Over() && encode(d.State) != encode(st) {
				t.Fatalf("pass %d: an ended run changed: %s -> %s", i, encode(st), encode(d.State))
			}
			if d.State.Step != st.Step && (d.State.Attempts != 0 || d.State.LastError != "" && d.State.Step != StepAwait) {
				t.Fatalf("pass %d: a new step keeps the last one's attempts: %s", i, encode(d.State))
			}
			if d.Wait < 0 {
				t.Fatalf("pass %d: negative wait %s", i, d.Wait)
			}
			st = d.State
		}
		// Every bound passed; from now on actions succeed, the Node does whatever, and the
		// passes come ReadyTimeout apart (a Node first seen NotReady now has that long): a
		// run at any step is over within as many passes as there are steps.
		end := st.Start
		if now.After(end) {
			end = now
		}
		end = end.Add(DefaultQuiet + 2*DefaultReadyTimeout)
		if st.End.After(st.Start) {
			end = end.Add(st.End.Sub(st.Start))
		}
		for i := range len(steps) {
			obs := Observation{Node: rapid.SampledFrom(statuses).Draw(t, "late_node")}
			st = Next(st, obs, end.Add(time.Duration(i)*DefaultReadyTimeout), Options{}).State
		}
		if !st.Over() {
			t.Fatalf("past every bound, the run is not over: %s", encode(st))
		}
	})
}

// TestSteps: the steps replay shows follow the order a run takes, with the router's reboot
// for instance-reboot only.
func TestSteps(t *testing.T) {
	for _, typ := range Types {
		got := Steps(typ)
		if got[0] != StepCordon || got[len(got)-1] != StepDone || slices.Contains(got, StepReboot) != (typ == event.ScheduledInstanceReboot) {
			t.Errorf("%s: %v", typ, got)
		}
		for i := 1; i < len(got); i++ {
			if slices.Index(steps, got[i]) <= slices.Index(steps, got[i-1]) {
				t.Errorf("%s: %v out of order", typ, got)
			}
		}
	}
}
