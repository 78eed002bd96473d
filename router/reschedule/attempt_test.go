package reschedule

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// fakeAPI answers Attempt's two calls from fields (the wire format is tested in events_test.go
// and through the pipeline).
type fakeAPI struct {
	held           Event
	ok             bool
	findErr, mvErr error
	moves          []time.Time
}

func (f *fakeAPI) FindEvent(context.Context, string, event.ScheduledType) (Event, bool, error) {
	return f.held, f.ok, f.findErr
}

func (f *fakeAPI) Move(_ context.Context, _, _ string, to time.Time) (Event, error) {
	if f.mvErr != nil {
		return Event{}, f.mvErr
	}
	f.moves = append(f.moves, to)
	return f.held, nil
}

func TestAttempt(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC) // a Saturday, after the window
	start := now.Add(10 * 24 * time.Hour)
	open := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	pool := policy.FromAnnotations(map[string]string{policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		policy.AnnotationDrainLead: "1h", policy.AnnotationReschedule: "true"})
	body := fmt.Sprintf(`{"version":"0","id":"h-1","detail-type":"AWS Health Event","source":"aws.health","account":"111122223333","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/X/1","service":"EC2","eventTypeCode":"AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"affectedEntities":[{"entityValue":"i-0123456789abcdef0"}]}}`, start.Format(time.RFC1123))
	ev, err := event.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	deadline := now.Add(14 * 24 * time.Hour)
	inWindow := open.Add(time.Hour)
	tests := []struct {
		name        string
		api         fakeAPI
		wantResult  string
		wantNote    string
		wantStart   time.Time
		wantChanged bool
		wantMoves   int
	}{
		{"moved", fakeAPI{held: Event{ID: "e-1", NotBefore: start, Deadline: deadline}, ok: true}, ResultMoved, "rescheduled e-1 moved from", inWindow, true, 1},
		{"EC2 holds it in the window already (a report older than the move)", fakeAPI{held: Event{ID: "e-1", NotBefore: inWindow, Deadline: deadline}, ok: true},
			ResultInWindow, "not rescheduled: already in the window", inWindow, true, 0},
		{"no deadline", fakeAPI{held: Event{ID: "e-1", NotBefore: start}, ok: true}, ResultNotMoved, "not rescheduled: the event has no deadline", start, false, 0},
		{"no open event", fakeAPI{}, ResultNotMoved, "not rescheduled: EC2 reports no open system-reboot event", start, false, 0},
		{"the lookup fails", fakeAPI{findErr: fmt.Errorf("%w: timeout", ErrUnavailable)}, ResultUnavailable, "not rescheduled: EC2 unavailable", start, false, 0},
		{"the lookup is refused", fakeAPI{findErr: fmt.Errorf("%w: denied", ErrRefused)}, ResultRefused, "not rescheduled: EC2 refused", start, false, 0},
		{"the move is refused", fakeAPI{held: Event{ID: "e-1", NotBefore: start, Deadline: deadline}, ok: true, mvErr: fmt.Errorf("%w: too close", ErrRefused)},
			ResultRefused, "not rescheduled: EC2 refused", start, false, 0},
		{"the move fails", fakeAPI{held: Event{ID: "e-1", NotBefore: start, Deadline: deadline}, ok: true, mvErr: fmt.Errorf("%w: 500", ErrUnavailable)},
			ResultUnavailable, "not rescheduled: EC2 unavailable", start, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			api := tt.api
			out := Attempt(context.Background(), &api, ev, "i-0123456789abcdef0", pool, now)
			if out.Result != tt.wantResult || !strings.HasPrefix(out.Note, tt.wantNote) || out.Changed != tt.wantChanged || !out.Event.Deadline.Equal(tt.wantStart) {
				t.Errorf("Attempt = result %s, note %q, changed %v, start %s", out.Result, out.Note, out.Changed, out.Event.Deadline)
			}
			if len(api.moves) != tt.wantMoves {
				t.Errorf("%d moves, want %d", len(api.moves), tt.wantMoves)
			}
		})
	}
}

func TestEligible(t *testing.T) {
	on := policy.Policy{Reschedule: true}
	sched := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{Scheduled: event.ScheduledSystemReboot, Status: event.HealthUpcoming}}
	closed := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{Scheduled: event.ScheduledSystemReboot, Status: event.HealthClosed}}
	unknown := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{}}
	for _, tt := range []struct {
		name    string
		ev      event.Event
		action  policy.Action
		managed bool
		pool    policy.Policy
		want    bool
	}{
		{"deferred", sched, policy.ActionDefer, true, on, true},
		{"ignored", sched, policy.ActionIgnore, true, on, true},
		{"drained now", sched, policy.ActionDrain, true, on, false},
		{"the pool does not ask", sched, policy.ActionDefer, true, policy.Policy{}, false},
		{"no NodeClaim", sched, policy.ActionDefer, false, on, false},
		{"closed", closed, policy.ActionIgnore, true, on, false},
		{"a type the router does not map", unknown, policy.ActionDefer, true, on, false},
		{"a Spot warning", event.Event{Kind: event.KindSpotInterruption}, policy.ActionDefer, true, on, false},
	} {
		if got := Eligible(tt.ev, tt.action, tt.managed, tt.pool); got != tt.want {
			t.Errorf("%s: Eligible = %v, want %v", tt.name, got, tt.want)
		}
	}
}
