package reschedule

import (
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/health-router/health-router/router/policy"
)

func at(t testing.TB, s string) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

func window(t interface {
	Helper()
	Fatal(...any)
}, schedule, duration string) *policy.Window {
	t.Helper()
	w, err := policy.NewWindow(schedule, duration)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestPlan(t *testing.T) {
	// Saturdays 02:00-06:00 UTC: 2026-11-21, 2026-11-28, 2026-12-05 are Saturdays.
	sat := window(t, "0 2 * * 6", "4h")
	daily := window(t, "0 1 * * *", "2h")  // 01:00-03:00 UTC every day
	never := window(t, "0 0 30 2 *", "1h") // 30 February
	berlin := window(t, "CRON_TZ=Europe/Berlin 0 2 * * 6", "4h")
	tests := []struct {
		name                     string
		w                        *policy.Window
		lead                     time.Duration
		now, notBefore, deadline string // "" deadline: none
		move                     bool
		newStart, open           string // "" when not expected
		reason                   string // a substring of the reason
	}{
		{name: "moves into the next window opening plus drain-lead", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			move: true, newStart: "2026-11-21T03:00:00Z", open: "2026-11-21T02:00:00Z",
			reason: "moved from 2026-11-19T14:00:00Z to 2026-11-21T03:00:00Z: the maintenance window opening 2026-11-21T02:00:00Z plus drain-lead 1h0m0s (deadline 2026-12-01T00:00:00Z)"},
		{name: "moves earlier when the start is after the window and outside it", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-25T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			move: true, newStart: "2026-11-21T03:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved"},
		{name: "no window", w: nil, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: "not moved: the pool has no maintenance window"},
		{name: "no deadline", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z",
			reason: "not moved: the event has no deadline"},
		{name: "started", w: sat, lead: time.Hour,
			now: "2026-11-19T14:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: "not moved: the event has started (at 2026-11-19T14:00:00Z)"},
		{name: "within EC2's 5 minutes", w: sat, lead: time.Hour,
			now: "2026-11-19T13:55:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: "not moved: its start 2026-11-19T14:00:00Z is within 7m0s (EC2 does not reschedule an event within 5m0s of its start)"},
		{name: "exactly 5 minutes plus slack is within", w: sat, lead: time.Hour,
			now: "2026-11-19T13:53:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: "is within 7m0s"},
		{name: "a second past 5 minutes plus slack moves", w: sat, lead: time.Hour,
			now: "2026-11-19T13:52:59Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			move: true, newStart: "2026-11-21T03:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved"},
		{name: "deadline less than 60 minutes plus slack ahead", w: daily, lead: 0,
			now: "2026-11-21T11:00:00Z", notBefore: "2026-11-21T11:30:00Z", deadline: "2026-11-21T12:01:59Z",
			reason: "not moved: its deadline 2026-11-21T12:01:59Z is less than 1h2m0s ahead"},
		// Daily 01:00, drain-lead 0: the opening is the new start.
		{name: "exactly 60 minutes plus slack ahead", w: daily, lead: 0,
			now: "2026-11-20T23:58:00Z", notBefore: "2026-11-21T12:00:00Z", deadline: "2026-11-21T20:00:00Z",
			move: true, newStart: "2026-11-21T01:00:00Z", open: "2026-11-21T01:00:00Z", reason: "moved"},
		{name: "a second short of 60 minutes plus slack", w: daily, lead: 0,
			now: "2026-11-20T23:58:01Z", notBefore: "2026-11-21T12:00:00Z", deadline: "2026-11-21T20:00:00Z",
			open:   "2026-11-22T01:00:00Z",
			reason: "not moved: no window opening before the deadline 2026-11-21T20:00:00Z: the next that fits, 2026-11-22T01:00:00Z, plus drain-lead 0s is 2026-11-22T01:00:00Z"},
		{name: "exactly EC2's 60 minutes is not enough", w: daily, lead: 0,
			now: "2026-11-21T00:00:00Z", notBefore: "2026-11-21T12:00:00Z", deadline: "2026-11-21T20:00:00Z",
			open: "2026-11-22T01:00:00Z", reason: "no window opening before the deadline"},
		{name: "exactly the deadline", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-11-21T03:00:00Z",
			move: true, newStart: "2026-11-21T03:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved"},
		{name: "a second before the deadline is past it", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-11-21T02:59:59Z",
			open: "2026-11-21T02:00:00Z", reason: "no window opening before the deadline 2026-11-21T02:59:59Z"},
		{name: "drain-lead pushes past the deadline", w: sat, lead: 4 * time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-11-21T05:00:00Z",
			open: "2026-11-21T02:00:00Z", reason: "plus drain-lead 4h0m0s is 2026-11-21T06:00:00Z"},
		{name: "window opens after the deadline", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-11-20T00:00:00Z",
			open: "2026-11-21T02:00:00Z", reason: "no window opening before the deadline 2026-11-20T00:00:00Z"},
		// The window is open (since 02:00); with drain-lead 3h its opening plus drain-lead
		// (05:00) is far enough ahead for EC2, but the drain would have begun before now.
		{name: "an opening before now is not used", w: sat, lead: 3 * time.Hour,
			now: "2026-11-21T03:00:00Z", notBefore: "2026-11-23T10:00:00Z", deadline: "2026-12-10T00:00:00Z",
			move: true, newStart: "2026-11-28T05:00:00Z", open: "2026-11-28T02:00:00Z", reason: "moved"},
		// Drain-lead 2h: an opening exactly now is far enough ahead (now + 2h), and not before now.
		{name: "an opening exactly now is used", w: sat, lead: 2 * time.Hour,
			now: "2026-11-21T02:00:00Z", notBefore: "2026-11-23T10:00:00Z", deadline: "2026-12-10T00:00:00Z",
			move: true, newStart: "2026-11-21T04:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved"},
		{name: "already where it would be put", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-21T03:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: `not moved: already in the window: its start 2026-11-21T03:00:00Z minus drain-lead 1h0m0s falls in maintenance window "0 2 * * 6"`},
		{name: "already in the window, later in it", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-21T06:59:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: "already in the window"},
		{name: "already in the window, no deadline", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-21T04:00:00Z",
			reason: "already in the window"},
		// The start is inside the window, but the drain (an hour before) is not: it moves later.
		{name: "start in the window, drain before it", w: sat, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-21T02:30:00Z", deadline: "2026-12-01T00:00:00Z",
			move: true, newStart: "2026-11-21T03:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved from 2026-11-21T02:30:00Z"},
		{name: "just after the window, drain-lead 0", w: sat, lead: 0,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-21T06:00:00Z", deadline: "2026-12-01T00:00:00Z",
			move: true, newStart: "2026-11-21T02:00:00Z", open: "2026-11-21T02:00:00Z", reason: "moved"},
		{name: "never opens", w: never, lead: time.Hour,
			now: "2026-11-18T12:00:00Z", notBefore: "2026-11-19T14:00:00Z", deadline: "2026-12-01T00:00:00Z",
			reason: `not moved: maintenance window "0 0 30 2 *" never opens`},
		// A plain schedule is UTC: 02:00Z on both sides of the end of European summer time
		// (2026-10-25); a CRON_TZ schedule follows its zone (02:00 Berlin is 00:00Z, then 01:00Z).
		{name: "UTC cron across a DST change", w: sat, lead: time.Hour,
			now: "2026-10-24T12:00:00Z", notBefore: "2026-10-26T10:00:00Z", deadline: "2026-11-05T00:00:00Z",
			move: true, newStart: "2026-10-31T03:00:00Z", open: "2026-10-31T02:00:00Z", reason: "moved"},
		{name: "CRON_TZ before the DST change", w: berlin, lead: time.Hour,
			now: "2026-10-21T12:00:00Z", notBefore: "2026-10-26T10:00:00Z", deadline: "2026-11-05T00:00:00Z",
			move: true, newStart: "2026-10-24T01:00:00Z", open: "2026-10-24T00:00:00Z", reason: "moved"},
		{name: "CRON_TZ after the DST change", w: berlin, lead: time.Hour,
			now: "2026-10-24T12:00:00Z", notBefore: "2026-10-26T10:00:00Z", deadline: "2026-11-05T00:00:00Z",
			move: true, newStart: "2026-10-31T02:00:00Z", open: "2026-10-31T01:00:00Z", reason: "moved"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Input{Now: at(t, tt.now), NotBefore: at(t, tt.notBefore), Window: tt.w, DrainLead: tt.lead}
			if tt.deadline != "" {
				in.Deadline = at(t, tt.deadline)
			}
			got := Plan(in)
			if got.Move != tt.move || !strings.Contains(got.Reason, tt.reason) {
				t.Fatalf("Plan = %+v\nwant move %v, reason mentioning %q", got, tt.move, tt.reason)
			}
			if !tt.move && !strings.HasPrefix(got.Reason, "not moved: ") {
				t.Errorf("reason %q: a plan that does not move says so first", got.Reason)
			}
			wantTime := func(field string, got time.Time, want string) {
				if want == "" {
					if !got.IsZero() {
						t.Errorf("%s = %s, want none", field, got)
					}
					return
				}
				if !got.Equal(at(t, want)) {
					t.Errorf("%s = %s, want %s", field, got, want)
				}
			}
			wantTime("NewStart", got.NewStart, tt.newStart)
			wantTime("WindowOpen", got.WindowOpen, tt.open)
		})
	}
}

// TestPlanProperties: whatever the inputs, a move is one EC2 accepts (a deadline, the event
// not within FreezeBefore of its start, the new start at least MinLead ahead and not past
// the deadline), lands on a window opening at or after now plus drain-lead, and changes
// the start; a plan that does not move says why.
func TestPlanProperties(t *testing.T) {
	base := time.Date(2026, 11, 18, 0, 0, 0, 0, time.UTC)
	schedules := []string{"0 2 * * 6", "0 1 * * *", "30 22 * * 1-5", "0 */6 * * *", "CRON_TZ=Europe/Berlin 0 2 * * 0"}
	moved := 0
	rapid.Check(t, func(t *rapid.T) {
		w := window(t, rapid.SampledFrom(schedules).Draw(t, "schedule"), rapid.SampledFrom([]string{"1h", "4h", "30m"}).Draw(t, "duration"))
		now := base.Add(time.Duration(rapid.Int64Range(0, 14*24*60).Draw(t, "now_min")) * time.Minute)
		// Half the draws are of an event EC2 can move (two days ahead or more, a deadline
		// eight days past its start or more, so that every schedule here opens before it):
		// rapid starts from the smallest values, which never move, and make unit draws 20.
		movable := rapid.Bool().Draw(t, "movable")
		startMin, deadlineMin := int64(-60), int64(0)
		if movable {
			startMin, deadlineMin = 2*24*60, 8*24*60
		}
		in := Input{
			Now:       now,
			NotBefore: now.Add(time.Duration(rapid.Int64Range(startMin, 21*24*60).Draw(t, "start_in_min")) * time.Minute),
			Window:    w,
			DrainLead: time.Duration(rapid.Int64Range(0, 6*60).Draw(t, "lead_min")) * time.Minute,
		}
		if movable || rapid.IntRange(0, 9).Draw(t, "deadline_unless_0") != 0 {
			in.Deadline = in.NotBefore.Add(time.Duration(rapid.Int64Range(deadlineMin, 28*24*60).Draw(t, "deadline_after_start_min")) * time.Minute)
		}
		got := Plan(in)
		if !got.Move {
			if !strings.HasPrefix(got.Reason, "not moved: ") || !got.NewStart.IsZero() {
				t.Fatalf("%+v: a plan that does not move says so and has no new start", got)
			}
			return
		}
		moved++
		switch {
		case in.Deadline.IsZero():
			t.Fatalf("%+v: moved an event without a deadline", got)
		case !in.NotBefore.After(now.Add(FreezeBefore)):
			t.Fatalf("%+v: moved an event within %s of its start %s", got, FreezeBefore, in.NotBefore)
		case got.NewStart.Before(now.Add(MinLead)):
			t.Fatalf("%+v: new start less than %s ahead of %s", got, MinLead, now)
		case got.NewStart.After(in.Deadline):
			t.Fatalf("%+v: new start past the deadline %s", got, in.Deadline)
		case !got.NewStart.Equal(got.WindowOpen.Add(in.DrainLead)):
			t.Fatalf("%+v: new start is not the opening plus drain-lead %s", got, in.DrainLead)
		case got.WindowOpen.Before(now) || !w.Open(got.WindowOpen) || !w.Next(got.WindowOpen.Add(-time.Second)).Equal(got.WindowOpen):
			t.Fatalf("%+v: %s is not a window opening at or after now", got, got.WindowOpen)
		case got.NewStart.Equal(in.NotBefore) || w.Open(in.NotBefore.Add(-in.DrainLead)):
			t.Fatalf("%+v: moved an event already in the window", got)
		}
	})
	if moved == 0 {
		t.Error("no drawn input moved: the properties of a move were not checked")
	}
}
