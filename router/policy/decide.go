package policy

import (
	"fmt"
	"time"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// Recheck intervals of decisions that wait on live state rather than on a time.
const (
	// PacingRecheck is how soon a drain held by max-concurrent-drains, in an event with no
	// deadline, is decided again at the latest. The live router releases held drains as soon
	// as one of the pool's drains finishes (and checks each pool that holds drains this often),
	// so this bounds only what a missed release could cost; a drain with a deadline waits at
	// most until deadline minus drain-lead.
	PacingRecheck = 10 * time.Minute
	// CheckRecheck is how soon a drain held by a failed pre-signal check is checked again.
	CheckRecheck = 5 * time.Minute
	// WindowRecheck is how soon an event with no deadline, deferred to a pool whose window
	// annotations are invalid, is decided again: the annotations are read afresh each time, so
	// a fix takes effect within it.
	WindowRecheck = 10 * time.Minute
)

// Hold says what a deferred decision waits for; the live router releases a deferral early
// when what it waits on changes (a pool's drain finishes, an image becomes available).
type Hold string

const (
	HoldWindow       Hold = "window"        // the pool's next maintenance window
	HoldDeadline     Hold = "deadline"      // deadline minus drain-lead (no window, or it opens too late)
	HoldRestartGrace Hold = "restart-grace" // a stopped instance may run again
	HoldPacing       Hold = "pacing"        // max-concurrent-drains: a drain of the pool must finish
	HoldCheck        Hold = "check"         // a pre-signal check failed or could not answer
	// HoldRepairCutoff: more of the pool is impaired than its repair cut-off; released when
	// the storm passes (impaired instances recover or are replaced).
	HoldRepairCutoff Hold = "repair-cutoff"
	// HoldInPlace: a reboot in place of another maintenance runs on the node (one run at a
	// time); decided again when it may have ended.
	HoldInPlace Hold = "in-place"
	// HoldUrgentBreaker: the pool's urgent-drain breaker (urgent-drain-max) is open: more of
	// the pool was drained for urgent events within UrgentWindow than it allows; decided
	// again after UrgentRecheck.
	HoldUrgentBreaker Hold = "urgent-breaker"
)

// UrgentRecheck is how soon an urgent drain held by the pool's breaker is decided again:
// within a Spot warning's two minutes, so that a genuine one still drains once the storm's
// minute has passed.
const UrgentRecheck = 30 * time.Second

// InPlaceRecheck is how soon a reboot in place held by another run on its node is decided
// again: a run's steps are minutes apart.
const InPlaceRecheck = 15 * time.Minute

// RepairRecheck is how soon an impaired instance held by the repair cut-off is decided again.
const RepairRecheck = time.Minute

// Values of the router's --unmanaged-nodes: what it does for a node Karpenter does not manage
// (a managed node group's, a self-managed one: a Node without a NodeClaim).
const (
	UnmanagedIgnore      = "ignore"       // a clear "not managed by Karpenter" outcome; nothing is done
	UnmanagedCordonDrain = "cordon-drain" // cordon and evict its pods (Eviction API, PDBs respected)
)

// Target is the instance an event names, as the cluster model resolved it.
type Target struct {
	InstanceID string
	// Found is false when no Node or NodeClaim of the cluster has this instance.
	Found     bool
	Node      string
	NodeClaim string
	NodePool  string
	Policy    Policy
	// PoolNodes is the number of NodeClaims in the pool; DrainsInFlight how many of them
	// are being drained (deleted or signalled, not yet replaced).
	PoolNodes      int
	DrainsInFlight int
	// Impaired counts the pool's other nodes the router holds or replaces as impaired, for
	// the repair cut-off of an instance-status event.
	Impaired int
	// Budgets are the NodePool's disruption budgets (spec.disruption.budgets): those naming
	// the reason Unhealthy (Karpenter v1.15's node repair) bound the repair cut-off as well
	// (RepairLimit).
	Budgets []karpv1.Budget
	// UrgentDrains counts the pool's other nodes drained for urgent events within
	// UrgentWindow, for the urgent-drain breaker.
	UrgentDrains int
	// RunningSince is the latest `running` state change handled for the instance.
	RunningSince time.Time
	// Unmanaged is set for a Node without a NodeClaim: the cluster's --unmanaged-nodes
	// (UnmanagedIgnore or UnmanagedCordonDrain) decides it, not a NodePool.
	Unmanaged string
}

// Decision is what the router does with one event for one instance, and why.
type Decision struct {
	EventID    string     `json:"event_id"`
	Kind       event.Kind `json:"kind"`
	InstanceID string     `json:"instance_id,omitempty"`
	Node       string     `json:"node,omitempty"`
	NodeClaim  string     `json:"nodeclaim,omitempty"`
	NodePool   string     `json:"nodepool,omitempty"`
	Action     Action     `json:"action"`
	// Until is when a deferred event is decided again (at the latest: a Hold on live state
	// can end earlier).
	Until time.Time `json:"until,omitzero"`
	// Hold is what a deferred event waits for.
	Hold     Hold      `json:"hold,omitempty"`
	Deadline time.Time `json:"deadline,omitzero"`
	Reason   string    `json:"reason"`
	Warnings []string  `json:"warnings,omitempty"`
	Checks   []Check   `json:"checks,omitempty"`
	// Gates are the answers of the pool's gates (which PDB, which alert, since when).
	Gates []Gate `json:"gates,omitempty"`
	// Cancel is set when the event ends an earlier deferral of the same instance: a
	// closed AWS Health event, or a stopped instance that is running again.
	Cancel bool `json:"cancel,omitempty"`
	// InPlace marks a decision of a pool that keeps the node through a reboot
	// (ActionRebootInPlace): deferred to the window as a drain would be, paced and gated as a
	// drain; when it goes, the engine turns the drain into ActionRebootInPlace.
	InPlace bool `json:"in_place,omitempty"`
}

// Check is the outcome of one pre-signal check.
type Check struct {
	Name string `json:"name"`
	// Passed is true when the replacement is sound as far as this check can tell.
	Passed bool `json:"passed"`
	// Unavailable is true when the check could not get an answer (AWS unreachable, throttled).
	Unavailable bool              `json:"unavailable,omitempty"`
	Reason      string            `json:"reason"`
	Evidence    map[string]string `json:"evidence,omitempty"`
}

// Decide decides what to do with ev for one target at now. It is a pure function.
func Decide(ev event.Event, tg Target, now time.Time) Decision {
	d := Decision{
		EventID: ev.ID, Kind: ev.Kind, InstanceID: tg.InstanceID,
		Node: tg.Node, NodeClaim: tg.NodeClaim, NodePool: tg.NodePool, Deadline: ev.Deadline,
	}
	if !tg.Found {
		return d.with(ActionSkip, "instance %s is not a node of this cluster", tg.InstanceID)
	}
	d.Warnings = append(d.Warnings, tg.Policy.Problems...)
	if ev.Implausible != "" {
		d.Warnings = append(d.Warnings, ev.Implausible+": not trusted as urgent, decided as an ordinary drain (paced and gated)")
	}
	if tg.Unmanaged == UnmanagedIgnore {
		return d.with(ActionSkip, "not managed by Karpenter: node %s has no NodeClaim, and --unmanaged-nodes=%s", tg.Node, UnmanagedIgnore)
	}

	if ev.Health != nil && ev.Health.Status == event.HealthClosed {
		d.Cancel = true
		return d.with(ActionIgnore, "AWS Health event %s is closed: nothing left to do, and any deferral it held is cancelled", ev.Health.TypeCode)
	}
	if ev.Kind == event.KindInstanceStatus && ev.Status != nil && ev.Status.Recovered {
		d.Cancel = true
		return d.with(ActionIgnore, "instance passes its status checks again: a repair held for it is cancelled")
	}
	if ev.Kind == event.KindStateChange {
		switch ev.State {
		case event.StatePending:
			return d.with(ActionIgnore, "instance is pending: nothing to act on")
		case event.StateRunning:
			d.Cancel = true
			return d.with(ActionIgnore, "instance is running: a deferred stop of it is cancelled (a stop/start, not a loss)")
		case event.StateStopping, event.StateStopped:
			if ev.RunsAgain != "" {
				return d.with(ActionIgnore, "instance was %s at %s, but %s: the stop is over, or never was", ev.State, stamp(ev.Time), ev.RunsAgain)
			}
			if !tg.RunningSince.IsZero() && !ev.Time.After(tg.RunningSince) {
				return d.with(ActionIgnore, "instance was %s at %s but has been running since %s: the stop is over (its event arrived late)", ev.State, stamp(ev.Time), stamp(tg.RunningSince))
			}
		}
	}

	action, key := tg.Policy.ActionFor(ev)
	chose := fmt.Sprintf("%s=%s", key, action)
	switch {
	case key == "" && tg.Policy.Shadow:
		// A pool in shadow on an active router: the router carries out Karpenter's behaviour
		// for it (its own decision is recorded as would-be).
		chose = fmt.Sprintf("%s (pool in shadow: Karpenter's behaviour, carried out by the router)", action)
	case key == "":
		chose = fmt.Sprintf("%s (no annotation: Karpenter's behaviour)", action)
	case tg.Policy.Invalid(key):
		chose = fmt.Sprintf("%s invalid, so %s (the safe side)", key, action)
	}

	if ev.Urgent() {
		switch {
		case action == ActionDefer && ev.Kind == event.KindCapacityBlockExpiration:
			// A Capacity Block's warning leaves ten minutes to the first terminations and the
			// pool's lead may be shorter: the pool asked to keep its nodes until deadline
			// minus drain-lead (training jobs checkpoint late). Past it, drain now.
			if latest := ev.Deadline.Add(-tg.Policy.DrainLead); latest.After(now) {
				d.Until, d.Hold = latest, HoldDeadline
				return d.with(ActionDefer, "%s: %s; draining at deadline minus drain-lead %s, %s", chose, urgentWhat(ev), tg.Policy.DrainLead, stamp(latest))
			}
			d = d.with(ActionDrain, "%s: %s, and deadline minus drain-lead %s is reached", chose, urgentWhat(ev), tg.Policy.DrainLead)
			return urgentBreaker(d, tg, now)
		}
		switch action {
		case ActionIgnore:
			d.Warnings = append(d.Warnings, fmt.Sprintf("%s is ignored as the pool asks, but AWS reclaims the instance within minutes and its pods are not drained first", ev.Kind))
			return d.with(ActionIgnore, "%s: %s", chose, urgentWhat(ev))
		case ActionDefer:
			d.Warnings = append(d.Warnings, fmt.Sprintf("%s cannot be deferred: %s", ev.Kind, urgentWhat(ev)))
			d = d.with(ActionDrain, "%s overridden: %s, draining now", chose, urgentWhat(ev))
		default:
			d = d.with(ActionDrain, "%s: %s", chose, urgentWhat(ev))
		}
		return urgentBreaker(d, tg, now)
	}

	if ev.Kind == event.KindInstanceStatus {
		return decideImpaired(d, ev, tg, now, action, chose)
	}

	switch action {
	case ActionIgnore:
		return d.with(ActionIgnore, "%s: %s", chose, ignoreWhat(ev))
	case ActionRebootInPlace:
		if ev.Health == nil || !RebootsInPlace(ev.Health.Scheduled) {
			// Unreachable from FromAnnotations, which accepts it only for these types.
			d = d.with(ActionDrain, "%s: not a reboot type; draining", chose)
			break
		}
		d.InPlace = true
		d = deferToWindow(d, ev, tg.Policy, now, chose)
		if d.Action != ActionDrain {
			return d
		}
		d.Reason += "; rebooting in place (the node is kept)"
	case ActionDefer:
		if ev.Kind == event.KindStateChange {
			return deferStop(d, ev, tg.Policy, now, chose)
		}
		d = deferToWindow(d, ev, tg.Policy, now, chose)
		if d.Action != ActionDrain {
			return d
		}
	default:
		d = d.with(ActionDrain, "%s", chose)
	}
	return pace(d, ev, tg, now)
}

// ApplyChecks folds pre-signal check outcomes into a drain decision. A non-urgent drain
// whose replacement is not sound (or cannot be checked) waits, never past deadline minus
// drain-lead; an urgent one drains anyway, with the failures as warnings.
func ApplyChecks(d Decision, ev event.Event, p Policy, checks []Check, now time.Time) Decision {
	d.Checks = append(d.Checks, checks...)
	if d.Action != ActionDrain {
		return d
	}
	var failed []Check
	for _, c := range checks {
		if !c.Passed {
			failed = append(failed, c)
		}
	}
	if len(failed) == 0 {
		return d
	}
	what := ""
	for i, c := range failed {
		if i > 0 {
			what += "; "
		}
		what += c.Name + ": " + c.Reason
	}
	if ev.Urgent() {
		d.Warnings = append(d.Warnings, "draining although the replacement may not be sound: "+what)
		return d
	}
	until, _, _, reached := heldUntil(ev, p, now, CheckRecheck)
	if reached {
		d.Warnings = append(d.Warnings, "draining although the replacement may not be sound, as deadline minus drain-lead is reached: "+what)
		return d
	}
	d.Action, d.Until, d.Hold = ActionDefer, until, HoldCheck
	d.Reason = fmt.Sprintf("drain held until the replacement is sound (%s); re-checked at %s", what, stamp(until))
	return d
}

// decideImpaired decides an instance whose status check is impaired. Karpenter (v1.13+)
// force-terminates it after two minutes, and the poller reports it only then: drain is the
// default. Ignore is honoured with a warning. Defer has nothing to wait for (AWS sets no
// deadline, and an impaired instance is not serving), so it drains, with a warning; the
// pool's max-concurrent-drains still paces it, as Cluster API's maxUnhealthy stops a
// cascade of repairs.
func decideImpaired(d Decision, ev event.Event, tg Target, now time.Time, action Action, chose string) Decision {
	what := "instance status check impaired"
	if ev.Status != nil {
		what = fmt.Sprintf("instance status %s, system status %s, impaired since %s", orUnknown(ev.Status.InstanceStatus), orUnknown(ev.Status.SystemStatus), stamp(ev.Status.ImpairedSince))
	}
	switch action {
	case ActionIgnore:
		d.Warnings = append(d.Warnings, "an impaired instance is left in place; Karpenter would have replaced it")
		return d.with(ActionIgnore, "%s: %s; the node is left in place", chose, what)
	case ActionDefer:
		d.Warnings = append(d.Warnings, "an impaired instance cannot be deferred: it is not serving and AWS sets no deadline to wait for")
		d = d.with(ActionDrain, "%s overridden: %s, draining now", chose, what)
	default:
		d = d.with(ActionDrain, "%s: %s", chose, what)
	}
	if tg.Unmanaged != "" {
		return d
	}
	if cutoff, by := RepairLimit(tg.Policy, tg.Budgets, tg.PoolNodes, now); tg.Impaired+1 > cutoff {
		d.Action, d.Until, d.Hold = ActionDefer, now.Add(RepairRecheck), HoldRepairCutoff
		d.Warnings = append(d.Warnings, fmt.Sprintf("impaired-instance repair stopped in this pool: %d of %d nodes impaired, over its cut-off of %d (%s)", tg.Impaired+1, tg.PoolNodes, cutoff, by))
		d.Reason = fmt.Sprintf("%s; held by the repair cut-off (%s: %d nodes) while %d of %d nodes are impaired; re-checked at %s",
			d.Reason, by, cutoff, tg.Impaired+1, tg.PoolNodes, stamp(d.Until))
		return d
	}
	return pace(d, ev, tg, now)
}

// urgentBreaker holds an urgent drain while the pool's urgent-drain breaker is open: more of
// the pool drained for urgent events within UrgentWindow than urgent-drain-max allows. A storm
// of urgent events over one pool is what a forged or replayed batch looks like (and what an
// EC2 outage that leaves state changes unconfirmed lets through); a genuine Spot reclaim of
// many nodes looks the same, which is why the breaker is the pool owner's choice.
func urgentBreaker(d Decision, tg Target, now time.Time) Decision {
	limit, on := tg.Policy.UrgentLimit(tg.PoolNodes)
	if !on || tg.Unmanaged != "" || tg.UrgentDrains+1 <= limit {
		return d
	}
	d.Action, d.Until, d.Hold = ActionDefer, now.Add(UrgentRecheck), HoldUrgentBreaker
	d.Warnings = append(d.Warnings, fmt.Sprintf("urgent drains stopped in this pool: %d of %d nodes drained for urgent events within %s, over its breaker of %d (%s=%s)",
		tg.UrgentDrains, tg.PoolNodes, short(UrgentWindow), limit, AnnotationUrgentDrainMax, tg.Policy.UrgentDrainMax.String()))
	d.Reason = fmt.Sprintf("%s; held by the urgent-drain breaker (%s of the pool: %d nodes within %s) while %d of %d nodes were drained for urgent events; re-checked at %s",
		d.Reason, tg.Policy.UrgentDrainMax.String(), limit, short(UrgentWindow), tg.UrgentDrains, tg.PoolNodes, stamp(d.Until))
	return d
}

// Breaks reports whether an urgent drain of ev is subject to the pool's urgent-drain breaker:
// the engine then decides it with the pool's size and urgent drains (under the pool's lock).
func Breaks(ev event.Event, p Policy) bool {
	return ev.Urgent() && p.UrgentDrainMax != nil
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// deferStop holds a stopping or stopped instance for restart-grace after the event, in case
// it comes back (a stop/start); then it drains.
func deferStop(d Decision, ev event.Event, p Policy, now time.Time, chose string) Decision {
	until := ev.Time.Add(p.RestartGrace)
	if !now.Before(until) {
		return d.with(ActionDrain, "%s: instance %s and not running again within restart-grace %s", chose, ev.State, p.RestartGrace)
	}
	d.Until, d.Hold = until, HoldRestartGrace
	return d.with(ActionDefer, "%s: instance %s; waiting until %s (restart-grace %s) for it to run again", chose, ev.State, stamp(until), p.RestartGrace)
}

// deferToWindow holds an event until the pool's maintenance window, and never later than
// its deadline minus drain-lead. It returns a drain when there is nothing to wait for.
func deferToWindow(d Decision, ev event.Event, p Policy, now time.Time, chose string) Decision {
	latest, hasDeadline := latestSafe(ev, p)
	if hasDeadline && !now.Before(latest) {
		return d.with(ActionDrain, "%s: deadline %s minus drain-lead %s is reached", chose, stamp(ev.Deadline), p.DrainLead)
	}
	if p.Window != nil {
		if p.Window.Open(now) {
			return d.with(ActionDrain, "%s: maintenance window %q is open", chose, p.Window.Schedule)
		}
		next := p.Window.Next(now)
		// A window that opens at deadline minus drain-lead itself (where reschedule moves an
		// event: the opening plus drain-lead) is waited for: the drain then is in the window.
		if hasDeadline && (next.IsZero() || next.After(latest)) {
			d.Until, d.Hold = latest, HoldDeadline
			return d.with(ActionDefer, "%s: the next maintenance window (%s) opens after deadline %s minus drain-lead %s; draining at %s", chose, stamp(next), stamp(ev.Deadline), p.DrainLead, stamp(latest))
		}
		if next.IsZero() {
			return d.with(ActionDrain, "%s: maintenance window %q never opens and the event has no deadline", chose, p.Window.Schedule)
		}
		d.Until, d.Hold = next, HoldWindow
		return d.with(ActionDefer, "%s: waiting for the maintenance window at %s", chose, stamp(next))
	}
	if hasDeadline {
		d.Until, d.Hold = latest, HoldDeadline
		return d.with(ActionDefer, "%s: no maintenance window; draining at deadline %s minus drain-lead %s", chose, stamp(ev.Deadline), p.DrainLead)
	}
	if p.windowInvalid {
		// The owner asked for a window the router cannot read: draining now would go around it.
		d.Until, d.Hold = now.Add(WindowRecheck), HoldWindow
		return d.with(ActionDefer, "%s: the pool's maintenance window annotations are invalid (see the warnings) and the event has no deadline: held until they are fixed, decided again at %s", chose, stamp(d.Until))
	}
	return d.with(ActionDrain, "%s: nothing to wait for (no maintenance window, no deadline)", chose)
}

// pace holds a non-urgent drain while the pool has max-concurrent-drains in flight, until
// one finishes (the live router releases it then) or deadline minus drain-lead is reached.
func pace(d Decision, ev event.Event, tg Target, now time.Time) Decision {
	limit, limited := tg.Policy.DrainLimit(tg.PoolNodes)
	if !limited || tg.DrainsInFlight < limit {
		return d
	}
	latest, hasDeadline := latestSafe(ev, tg.Policy)
	if hasDeadline && !now.Before(latest) {
		d.Warnings = append(d.Warnings, fmt.Sprintf("draining over max-concurrent-drains %d (%d in flight): deadline minus drain-lead is reached", limit, tg.DrainsInFlight))
		return d
	}
	until := now.Add(PacingRecheck)
	if hasDeadline {
		until = latest
	}
	d.Action, d.Until, d.Hold = ActionDefer, until, HoldPacing
	d.Reason = fmt.Sprintf("%s; held by max-concurrent-drains %s (%d of %d nodes, %d in flight) until a drain finishes, at the latest %s", d.Reason, tg.Policy.MaxConcurrentDrains.String(), limit, tg.PoolNodes, tg.DrainsInFlight, stamp(until))
	return d
}

// Paced reports whether pacing can hold a decision of ev under p: a non-urgent event in a
// pool with max-concurrent-drains. Only then does the caller need the pool's state.
func Paced(ev event.Event, p Policy) bool {
	return (p.MaxConcurrentDrains != nil && !ev.Urgent()) || ev.Kind == event.KindInstanceStatus
}

// heldUntil is when a drain held on live state (a failed check, a gate) is decided again:
// after recheck, never past deadline minus drain-lead. reached reports that deadline minus
// drain-lead has come: the drain then goes, with a warning, whatever holds it.
func heldUntil(ev event.Event, p Policy, now time.Time, recheck time.Duration) (until, latest time.Time, hasDeadline, reached bool) {
	latest, hasDeadline = latestSafe(ev, p)
	if hasDeadline && !now.Before(latest) {
		return time.Time{}, latest, true, true
	}
	until = now.Add(recheck)
	if hasDeadline && latest.Before(until) {
		until = latest
	}
	return until, latest, hasDeadline, false
}

// latestSafe is the deadline minus drain-lead: the last moment a deferred event may wait.
func latestSafe(ev event.Event, p Policy) (time.Time, bool) {
	if ev.Deadline.IsZero() {
		return time.Time{}, false
	}
	return ev.Deadline.Add(-p.DrainLead), true
}

func (d Decision) with(a Action, format string, args ...any) Decision {
	d.Action = a
	d.Reason = fmt.Sprintf(format, args...)
	return d
}

func urgentWhat(ev event.Event) string {
	switch ev.Kind {
	case event.KindStateChange:
		return fmt.Sprintf("instance is %s", ev.State)
	case event.KindCapacityBlockExpiration:
		return fmt.Sprintf("Capacity Block %s ends; EC2 terminates its instances from %s", ev.Reservation, stamp(ev.Deadline))
	default:
		return fmt.Sprintf("AWS acts at %s (two-minute notice)", stamp(ev.Deadline))
	}
}

func ignoreWhat(ev event.Event) string {
	switch {
	case ev.Health != nil && ev.Health.Scheduled != "":
		return fmt.Sprintf("AWS performs the %s at %s; the node is left in place", ev.Health.Scheduled, stamp(ev.Deadline))
	case ev.Health != nil:
		return fmt.Sprintf("AWS performs %s at %s; the node is left in place", ev.Health.TypeCode, stamp(ev.Deadline))
	case ev.Kind == event.KindStateChange:
		return fmt.Sprintf("instance is %s; the node is left in place", ev.State)
	}
	return "recorded only"
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}
