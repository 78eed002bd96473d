package inplace

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/nodedrain"
)

// Defaults of Options.
const (
	DefaultEvictRound     = 30 * time.Second
	DefaultEvictEvery     = 10 * time.Second
	DefaultEvictMargin    = 10 * time.Minute
	DefaultReadyTimeout   = 15 * time.Minute
	DefaultQuiet          = time.Hour
	DefaultPoll           = 15 * time.Second
	DefaultRebootAttempts = 5
	DefaultRetryMin       = 5 * time.Second
	DefaultRetryMax       = 5 * time.Minute
	DefaultPrepare        = 2 * time.Hour
	// DefaultMigrationConfirm is how long after the Node is Ready again EC2 has to show a
	// migrated instance's system-reboot event gone (EC2 updates its events within minutes).
	DefaultMigrationConfirm = 10 * time.Minute
)

// Options bound the steps of a run; zero values take the defaults.
type Options struct {
	// EvictRound bounds one eviction round: the drain helper's retries of refused
	// evictions and its wait for evicted pods to be gone.
	EvictRound time.Duration
	// EvictEvery is the pause between eviction rounds that left pods.
	EvictEvery time.Duration
	// EvictMargin: the Node must be cordoned and emptied by Start - EvictMargin, or the run
	// falls back; the margin is the time left for Karpenter to replace the node before AWS
	// acts.
	EvictMargin time.Duration
	// ReadyTimeout: the Node must be Ready again within ReadyTimeout of going NotReady; and
	// after the router's RebootInstances, the reboot must show within ReadyTimeout. Past
	// either, the run falls back. The default stays under the 30 minutes of NotReady after
	// which Karpenter's node repair replaces a node itself.
	ReadyTimeout time.Duration
	// Quiet: when AWS reboots (the system events) and the event has no end, a Node Ready
	// throughout Start..Start+Quiet ends the run: AWS's maintenance had no visible effect.
	// With an end, the run waits until the end.
	Quiet time.Duration
	// Poll is how often the Node's readiness is read while the run waits on it.
	Poll time.Duration
	// RebootAttempts is how many failed RebootInstances calls the run makes before it
	// leaves the reboot to AWS, at the event's start.
	RebootAttempts int
	// RetryMin and RetryMax bound the backoff after a failed action (a cordon, an eviction
	// round that failed, a reboot call, an uncordon, a fallback).
	RetryMin, RetryMax time.Duration
	// Prepare is how long before AWS's start a run of an event AWS reboots itself
	// (system-reboot, system-maintenance) cordons and empties the Node: long enough for its
	// pods' budgets to let them go one at a time, short enough that the node is not idle for
	// days when the run began in a window long before the start. The window decides when the
	// disruption may happen; it does not make the node idle earlier. A system-reboot the
	// router reboots itself (reboot migration) is prepared at once, as an instance-reboot.
	Prepare time.Duration
	// MigrationConfirm bounds StepConfirm: past it with the event still shown, the reboot
	// migration did not clear it and the run waits for AWS's start.
	MigrationConfirm time.Duration
}

func (o Options) withDefaults() Options {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&o.EvictRound, DefaultEvictRound)
	set(&o.EvictEvery, DefaultEvictEvery)
	set(&o.EvictMargin, DefaultEvictMargin)
	set(&o.ReadyTimeout, DefaultReadyTimeout)
	set(&o.Quiet, DefaultQuiet)
	set(&o.Poll, DefaultPoll)
	set(&o.RetryMin, DefaultRetryMin)
	set(&o.RetryMax, DefaultRetryMax)
	set(&o.Prepare, DefaultPrepare)
	set(&o.MigrationConfirm, DefaultMigrationConfirm)
	if o.RebootAttempts <= 0 {
		o.RebootAttempts = DefaultRebootAttempts
	}
	return o
}

// EvictBy is when the Node must be emptied (and, for instance-reboot, rebooted by the
// router): Start - EvictMargin.
func (o Options) EvictBy(st State) time.Time {
	return st.Start.Add(-o.withDefaults().EvictMargin)
}

// PrepareLead is how long before AWS's start a run of an event AWS reboots itself empties the
// Node (Prepare plus EvictMargin): the longest lead of a reboot in place, which the pool's EC2
// event window leaves (policy.Policy.EC2Leads).
func (o Options) PrepareLead() time.Duration {
	o = o.withDefaults()
	return o.Prepare + o.EvictMargin
}

// PrepareAt is when the run cordons and empties the Node: at once for an instance-reboot and
// a system-reboot with reboot migration (the router reboots it itself, in the window that
// began the run), Start - Prepare - EvictMargin for the events AWS reboots at its start.
func (o Options) PrepareAt(st State) time.Time {
	o = o.withDefaults()
	if routerReboots(st) {
		return time.Time{}
	}
	return st.Start.Add(-o.Prepare - o.EvictMargin)
}

// routerReboots reports whether the router reboots the instance itself: an instance-reboot,
// or a system-reboot with reboot migration.
func routerReboots(st State) bool {
	return st.Type == event.ScheduledInstanceReboot || (st.Type == event.ScheduledSystemReboot && st.Migration == MigrationOn)
}

// AsksMigration reports whether a pass asks EC2 whether the instance offers reboot migration:
// a system-reboot run not asked yet that has not finished its evictions.
func AsksMigration(st State) bool {
	return st.Type == event.ScheduledSystemReboot && st.Migration == "" &&
		(st.Step == StepWait || st.Step == StepCordon || st.Step == StepEvict)
}

// FirstStep is the step a run begins with at now: StepWait while the Node may stay in
// service, else StepCordon.
func (o Options) FirstStep(st State, now time.Time) Step {
	if now.Before(o.PrepareAt(st)) {
		return StepWait
	}
	return StepCordon
}

// Postponed returns the run as its maintenance moved to start (and end): a run that emptied the
// Node for the old start and has not rebooted gives the Node back (StepRelease) when the new
// start leaves it time to serve; a run still waiting waits for the new start.
func (o Options) Postponed(st State, start, end, now time.Time) State {
	st.Start, st.End = start, end
	emptied := st.Step == StepCordon || st.Step == StepEvict || (st.Step == StepAwait && st.Rebooted.IsZero() && st.RebootAsked.IsZero())
	if emptied && now.Before(o.PrepareAt(st)) {
		st = advance(st, StepRelease, now)
		st.Why = "the maintenance moved to " + stamp(start) + ": the Node serves until then"
	}
	return st
}

// Cancelled returns the run as its maintenance was cancelled, and whether the cancel reaches
// it: a run that has not rebooted (and, for the events AWS reboots, whose start has not come)
// gives the Node back at once; once the reboot is under way the run sees it through.
func Cancelled(st State, why string, now time.Time) (State, bool) {
	if st.Over() || st.Step == StepUncordon || st.Step == StepFallback {
		return st, false
	}
	if !st.Rebooted.IsZero() || !st.RebootAsked.IsZero() || st.Step == StepReady ||
		(st.Type != event.ScheduledInstanceReboot && !now.Before(st.Start)) {
		return st, false
	}
	st = advance(st, StepUncordon, now)
	st.Why = truncate("cancelled: "+why, lastErrorMax)
	return st, true
}

// NodeStatus is the Node as a pass reads it from the API server.
type NodeStatus struct {
	Found bool
	// Ready is the Node's Ready condition ("" without one); ReadySince its last transition.
	Ready      corev1.ConditionStatus
	ReadySince time.Time
	// BootID is status.nodeInfo.bootID: the kubelet reports a new one after every boot.
	BootID string
	// UID is the Node object's: a Node deleted and registered again under the same name has
	// another, and carries none of what the run put on the one before.
	UID string
}

// NodeStatusOf reads a Node's readiness and boot ID.
func NodeStatusOf(n *corev1.Node) NodeStatus {
	if n == nil {
		return NodeStatus{}
	}
	s := NodeStatus{Found: true, BootID: n.Status.NodeInfo.BootID, UID: string(n.UID)}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			s.Ready, s.ReadySince = c.Status, c.LastTransitionTime.Time
		}
	}
	return s
}

// Observation is what a pass saw: the Node, read before the pass's action, and the
// outcome of the action of the step (each step has at most one: StepCordon cordons,
// StepEvict runs an eviction round, StepReboot calls RebootInstances, StepUncordon undoes
// the run's changes, StepFallback calls Fallback). No action is taken for a Node not found.
type Observation struct {
	Node NodeStatus
	// Err is the action's failure.
	Err error
	// KarpenterRebooting: the NodeClaim's Rebooting condition is true (Karpenter's node
	// repair reboots the node): a run that has not rebooted holds (Held).
	KarpenterRebooting bool
	// StepCordon: what the run changed on the Node (its mark).
	Cordoned, NodeProtected, NodeRepairVetoed bool
	// StepEvict: the pods the round left, and those a PodDisruptionBudget refused.
	Left    int
	Refused map[string]string
	// StepReboot: why the reboot was not made: EC2 does not show the maintenance the run
	// is for ("" when it does, or did not answer: then Err). StepConfirm: EC2 no longer shows
	// the event (the reboot migration cleared it).
	Unscheduled string
	// Migration is what EC2 said of the instance's reboot migration, when the pass asked
	// (AsksMigration); MigrationWhy says why.
	Migration    Migration
	MigrationWhy string
}

// Decision is the outcome of a pass: the run's state to record, and when to look again.
type Decision struct {
	State State
	// Wait is when the next pass is due; zero: at once.
	Wait time.Duration
}

// Next is the run's step function: from the recorded State, what the pass observed and did,
// and now, it returns the State to record and when to look again. It is pure: the Runner
// observes, acts, and records what Next returns, so a restarted router (which reads the
// State back from the NodeClaim) continues exactly where the last one stopped.
func Next(st State, obs Observation, now time.Time, o Options) Decision {
	o = o.withDefaults()
	if st.Over() {
		return Decision{State: st}
	}
	if !obs.Node.Found && st.Step != StepUncordon && st.Step != StepFallback && st.Step != StepWait && st.Step != StepRelease {
		return fallback(st, fmt.Sprintf("the Node %s is gone", st.Node), now)
	}
	if st.NodeUID != "" && obs.Node.UID != "" && obs.Node.UID != st.NodeUID && (st.Step == StepEvict || st.Step == StepReboot) {
		// The Node was registered again: the cordon and do-not-disrupt the run put on the one
		// before are gone. Cordon the new one before evicting on.
		st = advance(st, StepCordon, now)
		st.Why = "the Node " + st.Node + " was registered again: cordoned anew"
		return Decision{State: st}
	}
	if AsksMigration(st) && obs.Migration != "" {
		st.Migration, st.MigrationWhy = obs.Migration, truncate(obs.MigrationWhy, lastErrorMax)
	}
	if Held(st, obs) && (st.Step != StepWait || !now.Before(o.PrepareAt(st))) {
		// Karpenter reboots the node: the run neither cordons, evicts nor reboots meanwhile,
		// and gives no deadline of its own to Karpenter's reboot, which has its own (it
		// replaces the node when the reboot fails: the run then ends with its NodeClaim).
		st.LastError = heldNote
		return Decision{State: st, Wait: o.Poll}
	}
	switch st.Step {
	case StepWait:
		if at := o.PrepareAt(st); now.Before(at) {
			return Decision{State: st, Wait: at.Sub(now)}
		}
		return Decision{State: advance(st, StepCordon, now)}
	case StepRelease:
		if obs.Err != nil {
			return backoff(st, obs.Err.Error(), now, o)
		}
		why := st.Why
		st = advance(st, StepWait, now)
		st.Cordoned, st.NodeProtected, st.NodeRepairVetoed, st.BootID, st.NotReadySince, st.Why = false, false, false, "", time.Time{}, why
		return Decision{State: st, Wait: max(0, o.PrepareAt(st).Sub(now))}
	case StepCordon:
		return cordonNext(st, obs, now, o)
	case StepEvict:
		return evictNext(st, obs, now, o)
	case StepReboot:
		return rebootNext(st, obs, now, o)
	case StepAwait:
		return awaitNext(st, obs, now, o)
	case StepReady:
		return readyNext(st, obs, now, o)
	case StepConfirm:
		return confirmNext(st, obs, now, o)
	case StepUncordon:
		if obs.Err != nil {
			return backoff(st, obs.Err.Error(), now, o)
		}
		st = advance(st, StepDone, now)
		st.Outcome = "done"
		if st.Why != "" {
			st.Outcome += ": " + st.Why
		}
		return Decision{State: st}
	case StepFallback:
		if obs.Err != nil {
			return backoff(st, obs.Err.Error(), now, o)
		}
		st.Attempts, st.LastError, st.StepSince = 0, "", now
		st.Outcome = "fallback: " + st.Why
		return Decision{State: st}
	}
	return Decision{State: st} // a step Read refuses: nothing to do
}

func cordonNext(st State, obs Observation, now time.Time, o Options) Decision {
	if obs.Err != nil {
		if by := o.EvictBy(st); !now.Before(by) {
			return fallback(st, fmt.Sprintf("the Node could not be cordoned by %s (%s before the start): %v", stamp(by), o.EvictMargin, obs.Err), now)
		}
		return backoff(st, obs.Err.Error(), now, o)
	}
	st = advance(st, StepEvict, now)
	st.Cordoned, st.NodeProtected, st.NodeRepairVetoed, st.NodeUID = obs.Cordoned, obs.NodeProtected, obs.NodeRepairVetoed, obs.Node.UID
	return Decision{State: st}
}

func evictNext(st State, obs Observation, now time.Time, o Options) Decision {
	if obs.Err == nil && obs.Left == 0 {
		if routerReboots(st) {
			return Decision{State: advance(st, StepReboot, now)}
		}
		st = advance(st, StepAwait, now)
		st.BootID = obs.Node.BootID
		return Decision{State: st, Wait: max(0, st.Start.Sub(now))}
	}
	// A budget's refusal, or pods still terminating, is the drain's ordinary course, not a
	// failure to back off from (the drain helper reports a refusal it kept retrying as a
	// timeout: the refusal is the news).
	failed := obs.Err != nil && len(obs.Refused) == 0
	why := fmt.Sprintf("%d pod(s) left", obs.Left)
	if len(obs.Refused) > 0 {
		why += "; refused by a PodDisruptionBudget: " + nodedrain.BlockedNote(obs.Refused)
	}
	if failed {
		why = obs.Err.Error()
	}
	if by := o.EvictBy(st); !now.Before(by) {
		return fallback(st, fmt.Sprintf("the pods could not be evicted by %s (%s before the start): %s", stamp(by), o.EvictMargin, why), now)
	}
	if failed {
		return backoff(st, why, now, o)
	}
	st.Attempts++
	st.LastError = truncate(why, lastErrorMax)
	return Decision{State: st, Wait: o.EvictEvery}
}

func rebootNext(st State, obs Observation, now time.Time, o Options) Decision {
	if obs.Unscheduled != "" {
		// Nothing to reboot for: the Node is given back, and the run ends.
		st = advance(st, StepUncordon, now)
		st.RebootAsked = time.Time{}
		st.Why = truncate("not rebooted: "+obs.Unscheduled, lastErrorMax)
		return Decision{State: st}
	}
	if obs.Err == nil {
		asked := st.RebootAsked
		if asked.IsZero() {
			asked = now
		}
		st = advance(st, StepAwait, now)
		st.Rebooted, st.BootID = asked, obs.Node.BootID
		return Decision{State: st, Wait: o.Poll}
	}
	st.RebootAsked = time.Time{} // the call failed: the next may go out
	if st.Attempts+1 < o.RebootAttempts && now.Before(o.EvictBy(st)) {
		return backoff(st, obs.Err.Error(), now, o)
	}
	// AWS reboots the instance at the start whatever the router does: the Node, empty and
	// cordoned, waits for that instead of being replaced.
	attempts := st.Attempts + 1
	st = advance(st, StepAwait, now)
	st.BootID = obs.Node.BootID
	st.LastError = truncate(fmt.Sprintf("RebootInstances failed %d time(s), the last: %v; AWS reboots the instance at the start", attempts, obs.Err), lastErrorMax)
	return Decision{State: st, Wait: max(0, st.Start.Sub(now))}
}

func awaitNext(st State, obs Observation, now time.Time, o Options) Decision {
	ref := st.RebootRef()
	if now.Before(ref) {
		// AWS has not acted yet. The wait ends early when the run is rescheduled (a write of
		// the annotation brings the NodeClaim back).
		return Decision{State: st, Wait: ref.Sub(now)}
	}
	n := obs.Node
	newBoot := st.BootID != "" && n.BootID != "" && n.BootID != st.BootID
	if n.Ready != corev1.ConditionTrue {
		st = advance(st, StepReady, now)
		st.NotReadySince = now
		return Decision{State: st, Wait: o.Poll}
	}
	// Ready. A reboot shows as a new boot ID, or as a Ready transition after the reboot
	// began (the Node went NotReady and back between two reads). A heartbeat alone proves
	// nothing: a kubelet still shutting down posts one too.
	// While AWS's window is open and boot IDs are known, only a new boot proves AWS's reboot: a
	// Ready transition alone may be a blip before it.
	transition := n.ReadySince.After(ref) && (st.BootID == "" || n.BootID == "" || !st.Rebooted.IsZero() || !now.Before(st.End))
	if newBoot || transition {
		return Decision{State: advance(st, afterReboot(st), now)}
	}
	if !st.Rebooted.IsZero() {
		if by := st.Rebooted.Add(o.ReadyTimeout); !now.Before(by) {
			return fallback(st, fmt.Sprintf("no reboot seen within %s of RebootInstances: the Node stayed Ready with the same boot ID", o.ReadyTimeout), now)
		}
		return Decision{State: st, Wait: o.Poll}
	}
	quietUntil := o.windowOver(st)
	if !now.Before(quietUntil) {
		st = advance(st, StepUncordon, now)
		st.Why = fmt.Sprintf("the Node stayed Ready from the start %s to %s: AWS's maintenance had no visible effect", stamp(st.Start), stamp(quietUntil))
		return Decision{State: st}
	}
	return Decision{State: st, Wait: min(o.Poll, quietUntil.Sub(now))}
}

func readyNext(st State, obs Observation, now time.Time, o Options) Decision {
	if obs.Node.Ready == corev1.ConditionTrue {
		newBoot := st.BootID != "" && obs.Node.BootID != "" && obs.Node.BootID != st.BootID
		if !newBoot && st.Rebooted.IsZero() && now.Before(st.End) {
			// Ready again with the same boot ID while AWS's window is still open: a blip (a
			// kubelet restart, a network hiccup), not AWS's reboot, which is still to come.
			st = advance(st, StepAwait, now)
			st.NotReadySince = time.Time{}
			return Decision{State: st, Wait: o.Poll}
		}
		return Decision{State: advance(st, afterReboot(st), now)}
	}
	by := st.NotReadySince.Add(o.ReadyTimeout)
	if !now.Before(by) {
		return fallback(st, fmt.Sprintf("the Node was not Ready again within %s of going NotReady at %s", o.ReadyTimeout, stamp(st.NotReadySince)), now)
	}
	return Decision{State: st, Wait: min(o.Poll, by.Sub(now))}
}

// afterReboot is the step after the reboot showed and the Node is Ready: StepConfirm after the
// router's reboot of a system-reboot for reboot migration, else StepUncordon.
func afterReboot(st State) Step {
	if st.Type == event.ScheduledSystemReboot && st.Migration == MigrationOn && !st.Rebooted.IsZero() {
		return StepConfirm
	}
	return StepUncordon
}

// confirmNext waits for EC2 to show the migrated instance's system-reboot gone. Past
// MigrationConfirm with the event still there, the migration did not happen (EC2 rebooted the
// instance in place): AWS reboots it at the start. The Node goes back into service until the
// run prepares for that (StepRelease), or, with the start nearer than Prepare, stays out of
// service and waits for it: uncordoned now, it would be emptied again within the hour. EC2 not
// answering is not "still there": the Node stays out of service, and EC2 is asked again with
// backoff until AWS's window is over either way.
func confirmNext(st State, obs Observation, now time.Time, o Options) Decision {
	if obs.Unscheduled != "" {
		st = advance(st, StepUncordon, now)
		st.Why = "the reboot migrated the instance: " + truncate(obs.Unscheduled, lastErrorMax/2)
		return Decision{State: st}
	}
	by := st.StepSince.Add(o.MigrationConfirm)
	if now.Before(by) {
		if obs.Err != nil {
			st.Attempts++
			st.LastError = truncate(obs.Err.Error(), lastErrorMax)
		}
		return Decision{State: st, Wait: min(o.Poll, by.Sub(now))}
	}
	if obs.Err != nil {
		// EC2 does not answer: whether the migration cleared the event is not known, and an
		// outage is not an answer. The Node stays out of service (if the event remains, AWS
		// reboots it at the start; given back, it would be emptied again for a reboot that
		// may never come) and EC2 is asked again, until AWS's window is over either way.
		over := o.windowOver(st)
		if now.Before(over) {
			d := backoff(st, obs.Err.Error(), now, o)
			d.Wait = min(d.Wait, over.Sub(now))
			return d
		}
		err := obs.Err.Error()
		st = advance(st, StepUncordon, now)
		st.Why = truncate(fmt.Sprintf("EC2 did not answer whether the reboot migration cleared the %s, and AWS's window for it ended at %s (the last answer: %s)",
			st.Type, stamp(over), err), lastErrorMax)
		return Decision{State: st}
	}
	why := fmt.Sprintf("the router's reboot at %s did not clear the %s (EC2 still shows it %s after the Node was Ready again; the last answer: %s)",
		stamp(st.Rebooted), st.Type, o.MigrationConfirm, orShown(obs.Err))
	st.Migration, st.MigrationWhy = MigrationOff, truncate(why, lastErrorMax)
	st.Rebooted, st.RebootAsked, st.NotReadySince, st.BootID = time.Time{}, time.Time{}, time.Time{}, obs.Node.BootID
	if now.Before(o.PrepareAt(st)) {
		st = advance(st, StepRelease, now)
		st.Why = "not migrated: the Node serves until AWS's reboot at " + stamp(st.Start)
		return Decision{State: st}
	}
	st = advance(st, StepAwait, now)
	st.Why = "not migrated: the Node stays out of service until AWS's reboot at " + stamp(st.Start)
	return Decision{State: st, Wait: max(0, st.Start.Sub(now))}
}

// windowOver is when AWS's window for the run's maintenance is over: its end, or, with none
// known, the start plus Quiet.
func (o Options) windowOver(st State) time.Time {
	if st.End.After(st.Start) {
		return st.End
	}
	return st.Start.Add(o.Quiet)
}

func orShown(err error) string {
	if err != nil {
		return err.Error()
	}
	return "the event is shown"
}

// heldNote is LastError while the run holds for Karpenter's reboot.
const heldNote = "held: Karpenter is rebooting the node (the NodeClaim's Rebooting condition is true); the run goes on once that reboot has ended"

// Held reports whether the pass holds the run instead of acting: Karpenter is rebooting the
// node and the run has not rebooted it yet (it would cordon, evict or reboot next). Once the
// run's own reboot is under way, Karpenter's node repair is vetoed (do-not-repair on the
// Node) and cannot begin one.
func Held(st State, obs Observation) bool {
	if !obs.KarpenterRebooting || st.Over() {
		return false
	}
	switch st.Step {
	case StepWait, StepCordon, StepEvict:
		return true
	case StepReboot:
		return st.RebootAsked.IsZero()
	}
	return false
}

// advance moves the run to step, at now.
func advance(st State, step Step, now time.Time) State {
	st.Step, st.StepSince, st.Attempts, st.LastError = step, now, 0, ""
	return st
}

// fallback moves the run to StepFallback: the next pass calls Fallback.
func fallback(st State, why string, now time.Time) Decision {
	st = advance(st, StepFallback, now)
	st.Why = truncate(why, lastErrorMax)
	return Decision{State: st}
}

// backoff records a failed action and backs off: RetryMin, doubling, at most RetryMax.
func backoff(st State, why string, now time.Time, o Options) Decision {
	st.Attempts++
	st.LastError = truncate(why, lastErrorMax)
	wait := o.RetryMin
	for i := 1; i < st.Attempts && wait < o.RetryMax; i++ {
		wait *= 2
	}
	return Decision{State: st, Wait: min(wait, o.RetryMax)}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
