package reschedule

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// API is what Attempt calls: Events, or a what-if stand-in (replay).
type API interface {
	FindEvent(ctx context.Context, instanceID string, code event.ScheduledType) (Event, bool, error)
	Move(ctx context.Context, instanceID, eventID string, newStart time.Time) (Event, error)
}

// Eligible reports whether the router tries to move ev for an instance: a scheduled change
// with a known type that is not over, of a NodeClaim (managed) in a pool annotated
// healthrouter.io/reschedule=true, that the pool does not drain now (a drain replaces the
// instance: nothing to move).
func Eligible(ev event.Event, action policy.Action, managed bool, pool policy.Policy) bool {
	return ev.Kind == event.KindScheduledChange && ev.Health != nil && ev.Health.Scheduled != "" && ev.Health.Status != event.HealthClosed &&
		managed && pool.Reschedule && (action == policy.ActionDefer || action == policy.ActionIgnore)
}

// Results of an Attempt, as the metric counts them.
const (
	ResultMoved       = "moved"
	ResultInWindow    = "in-window"
	ResultNotMoved    = "not-moved"
	ResultRefused     = "refused"
	ResultUnavailable = "unavailable"
)

// Outcome is what an Attempt did.
type Outcome struct {
	// Event is the event as EC2 holds it after the attempt (one instance); Changed reports
	// that it starts at another time than the event the attempt was given (moved now, or
	// before: the given report was older than EC2's event).
	Event   event.Event
	Changed bool
	Result  string
	// Note is for the decision's reason: "rescheduled <EC2 event> moved from ... to ..." or
	// "not rescheduled: why".
	Note     string
	EventID  string // EC2's instance-event ID
	From, To time.Time
}

// Attempt moves one instance's scheduled event (ev names that instance alone) into its pool's
// next window opening that fits (Plan), through api. Whatever fails, the event stays as EC2
// holds it, and the note says why.
func Attempt(ctx context.Context, api API, ev event.Event, instanceID string, pool policy.Policy, now time.Time) Outcome {
	out := Outcome{Event: ev}
	notMoved := func(result, why string) Outcome {
		out.Result, out.Note = result, "not rescheduled: "+strings.TrimPrefix(why, "not moved: ")
		return out
	}
	held, ok, err := api.FindEvent(ctx, instanceID, ev.Health.Scheduled)
	switch {
	case errors.Is(err, ErrRefused):
		return notMoved(ResultRefused, FailureReason(err))
	case err != nil:
		return notMoved(ResultUnavailable, FailureReason(err))
	case !ok:
		return notMoved(ResultNotMoved, fmt.Sprintf("EC2 reports no open %s event for the instance", ev.Health.Scheduled))
	}
	out.EventID, out.From = held.ID, held.NotBefore
	// A report older than a move (this router's, or AWS's own) names the former start: the
	// event is the one EC2 holds.
	if start := held.NotBefore.UTC().Truncate(time.Second); !start.Equal(ev.Deadline.UTC().Truncate(time.Second)) {
		current, err := event.Moved(ev, start)
		if err != nil {
			return notMoved(ResultNotMoved, err.Error())
		}
		out.Event, out.Changed = current, true
	}
	plan := Plan(Input{Now: now, NotBefore: held.NotBefore, Deadline: held.Deadline, Window: pool.Window, DrainLead: pool.DrainLead})
	if !plan.Move {
		result := ResultNotMoved
		if strings.HasPrefix(plan.Reason, "not moved: already in the window") {
			result = ResultInWindow
		}
		return notMoved(result, plan.Reason)
	}
	if _, err := api.Move(ctx, instanceID, held.ID, plan.NewStart); err != nil {
		result := ResultUnavailable
		if errors.Is(err, ErrRefused) {
			result = ResultRefused
		}
		return notMoved(result, FailureReason(err))
	}
	moved, err := event.Moved(ev, plan.NewStart)
	if err != nil { // cannot happen: ev is a scheduled change with a start
		return notMoved(ResultNotMoved, err.Error())
	}
	out.Event, out.Changed, out.Result, out.To = moved, true, ResultMoved, plan.NewStart
	out.Note = fmt.Sprintf("rescheduled %s %s", held.ID, plan.Reason)
	return out
}
