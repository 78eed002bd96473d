// Package reschedule moves an EC2 scheduled event into its NodePool's maintenance window, for
// pools annotated healthrouter.io/reschedule=true. Plan decides, as a pure function of the
// event, the pool's window and drain-lead and the time, whether and where the event moves;
// Events finds the event in DescribeInstanceStatus and moves it with
// ModifyInstanceEventStartTime. Where an event cannot move, the pool's ordinary policy
// applies, and the plan's reason (or FailureReason of the call) says why.
//
// The router drains (or prepares) a pool's node at the window's opening and AWS acts
// drain-lead later, so an event moves to a window opening plus drain-lead.
package reschedule

import (
	"fmt"
	"time"

	"github.com/health-router/health-router/router/policy"
)

// EC2's bounds on ModifyInstanceEventStartTime (Amazon EC2 User Guide, "Reschedule scheduled
// events"): only an event with a deadline (NotBeforeDeadline), up to that deadline; not an
// event that starts within FreezeBefore; the new start at least MinLead ahead.
const (
	MinLead      = 60 * time.Minute
	FreezeBefore = 5 * time.Minute
	// Slack is what a plan keeps beyond MinLead and FreezeBefore: the call reaches EC2 a
	// little after the plan, and the router's clock is not EC2's, so a start planned exactly
	// MinLead ahead would be refused.
	Slack = 2 * time.Minute
)

// Input is what a plan is made from.
type Input struct {
	// Now is the time of the plan.
	Now time.Time
	// NotBefore is the event's current start; Deadline its NotBeforeDeadline (zero: none).
	NotBefore time.Time
	Deadline  time.Time
	// Window is the pool's maintenance window (nil: none); DrainLead is how long before
	// AWS acts the router drains.
	Window    *policy.Window
	DrainLead time.Duration
}

// Result is a plan: whether to move the event, where to, and why.
type Result struct {
	Move bool
	// NewStart is the start to ask EC2 for: WindowOpen plus drain-lead. Zero unless Move.
	NewStart time.Time
	// WindowOpen is the window opening the event moves to; when the event does not move
	// because that opening plus drain-lead is past the deadline, the opening considered.
	WindowOpen time.Time
	// Reason is for people, in the pool's decision: "moved ..." or "not moved: ...".
	Reason string
}

// Plan decides whether and where to move an event. The event moves to the pool's next window
// opening W (at or after now) with W + drain-lead at least MinLead+Slack ahead and not past
// the deadline. It stays where it is when it cannot move (no window, no deadline, started
// or about to start, no opening fits before the deadline) and when it is already in the
// window: its start minus drain-lead, when the router drains, falls inside a window.
func Plan(in Input) Result {
	now := in.Now
	switch {
	case in.Window == nil:
		return notMoved("the pool has no maintenance window")
	case !now.Before(in.NotBefore):
		return notMoved("the event has started (at %s)", stamp(in.NotBefore))
	case in.Window.Open(in.NotBefore.Add(-in.DrainLead)):
		return notMoved("already in the window: its start %s minus drain-lead %s falls in maintenance window %q",
			stamp(in.NotBefore), in.DrainLead, in.Window.Schedule)
	case in.Deadline.IsZero():
		return notMoved("the event has no deadline (EC2 reschedules only events with a NotBeforeDeadline)")
	case !in.NotBefore.After(now.Add(FreezeBefore + Slack)):
		return notMoved("its start %s is within %s (EC2 does not reschedule an event within %s of its start)",
			stamp(in.NotBefore), FreezeBefore+Slack, FreezeBefore)
	}
	earliest := now.Add(MinLead + Slack)
	if in.Deadline.Before(earliest) {
		return notMoved("its deadline %s is less than %s ahead (EC2 moves an event at least %s ahead, never past its deadline)",
			stamp(in.Deadline), MinLead+Slack, MinLead)
	}
	// The first opening W at or after from; W + drain-lead >= earliest. An opening before
	// now (the window is open) is not used: the drain would come less than drain-lead
	// before AWS acts.
	from := now
	if t := earliest.Add(-in.DrainLead); t.After(from) {
		from = t
	}
	open := in.Window.Next(from.Add(-time.Nanosecond)) // Next is strictly after its argument
	if open.IsZero() {
		return notMoved("maintenance window %q never opens", in.Window.Schedule)
	}
	start := open.Add(in.DrainLead)
	if start.After(in.Deadline) {
		r := notMoved("no window opening before the deadline %s: the next that fits, %s, plus drain-lead %s is %s",
			stamp(in.Deadline), stamp(open), in.DrainLead, stamp(start))
		r.WindowOpen = open
		return r
	}
	return Result{Move: true, NewStart: start, WindowOpen: open,
		Reason: fmt.Sprintf("moved from %s to %s: the maintenance window opening %s plus drain-lead %s (deadline %s)",
			stamp(in.NotBefore), stamp(start), stamp(open), in.DrainLead, stamp(in.Deadline))}
}

func notMoved(format string, args ...any) Result {
	return Result{Reason: "not moved: " + fmt.Sprintf(format, args...)}
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
