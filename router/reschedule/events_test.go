package reschedule

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/test/harness"
)

// t0 is a Wednesday; the server's clock stands still at it.
var t0 = time.Date(2026, 11, 18, 12, 0, 0, 0, time.UTC)

const (
	inst      = "i-0a1b2c3d4e5f60718"
	quiet     = "i-0a1b2c3d4e5f60719" // no events
	reboot    = "instance-event-0d59937288b749b32"
	noDL      = "instance-event-0000000000000000a"
	soon      = "instance-event-0000000000000000b"
	completed = "instance-event-0000000000000000c"
	later     = "instance-event-0000000000000000d"
)

// newEC2 serves EC2's instance status with one instance holding one event of each shape,
// and returns Events calling it through the real SDK client.
func newEC2(t *testing.T) (*harness.EC2InstanceStatus, *Events) {
	srv, client := harness.NewEC2InstanceStatus(t)
	srv.Now = func() time.Time { return t0 }
	srv.Add(inst, &harness.Instance{Events: []harness.ScheduledEvent{
		{ID: completed, Code: "system-reboot", Description: "[Completed] The instance is scheduled for a reboot", NotBefore: t0.Add(-24 * time.Hour), NotBeforeDeadline: t0.Add(24 * time.Hour)},
		{ID: later, Code: "system-reboot", Description: "The instance is scheduled for a reboot", NotBefore: t0.Add(11 * 24 * time.Hour), NotBeforeDeadline: t0.Add(20 * 24 * time.Hour)},
		{ID: reboot, Code: "system-reboot", Description: "The instance is scheduled for a reboot", NotBefore: t0.Add(48 * time.Hour), NotAfter: t0.Add(50 * time.Hour), NotBeforeDeadline: t0.Add(10 * 24 * time.Hour)},
		{ID: noDL, Code: "instance-stop", Description: "The instance is scheduled to stop", NotBefore: t0.Add(48 * time.Hour)},
		{ID: soon, Code: "instance-reboot", Description: "The instance is scheduled for a reboot", NotBefore: t0.Add(4 * time.Minute), NotBeforeDeadline: t0.Add(24 * time.Hour)},
	}})
	srv.Add(quiet, &harness.Instance{})
	return srv, NewEvents(client)
}

func TestFindEvent(t *testing.T) {
	ctx := context.Background()
	srv, ev := newEC2(t)
	tests := []struct {
		name     string
		instance string
		code     event.ScheduledType
		ok       bool
		want     Event
	}{
		// Of three system-reboot events: not the [Completed] one, the earlier of the two open ones.
		{"the open event that starts first", inst, event.ScheduledSystemReboot, true, Event{ID: reboot, Code: event.ScheduledSystemReboot,
			Description: "The instance is scheduled for a reboot", NotBefore: t0.Add(48 * time.Hour), NotAfter: t0.Add(50 * time.Hour), Deadline: t0.Add(10 * 24 * time.Hour)}},
		{"without a deadline", inst, event.ScheduledInstanceStop, true, Event{ID: noDL, Code: event.ScheduledInstanceStop,
			Description: "The instance is scheduled to stop", NotBefore: t0.Add(48 * time.Hour)}},
		{"no event of that type", inst, event.ScheduledInstanceRetirement, false, Event{}},
		{"no events at all", quiet, event.ScheduledSystemReboot, false, Event{}},
		{"no such instance", "i-0ffffffffffffffff", event.ScheduledSystemReboot, false, Event{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := ev.FindEvent(ctx, tt.instance, tt.code)
			if err != nil || ok != tt.ok {
				t.Fatalf("FindEvent = %+v, %v, %v; want ok %v", got, ok, err, tt.ok)
			}
			if !equalEvent(got, tt.want) {
				t.Errorf("FindEvent = %+v\nwant        %+v", got, tt.want)
			}
		})
	}
	_, _, asked, includeAll := srv.Stats()
	for i, ids := range asked {
		if len(ids) != 1 || !includeAll[i] {
			t.Errorf("call %d named %v (IncludeAllInstances %v): want the one instance, all states", i, ids, includeAll[i])
		}
	}

	srv.Fail = 1
	if _, _, err := ev.FindEvent(ctx, inst, event.ScheduledSystemReboot); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		t.Errorf("a 500: %v, want ErrUnavailable", err)
	}
	srv.Denied = map[string]bool{"DescribeInstanceStatus": true}
	if _, _, err := ev.FindEvent(ctx, inst, event.ScheduledSystemReboot); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "UnauthorizedOperation") {
		t.Errorf("denied: %v, want ErrRefused (UnauthorizedOperation)", err)
	}
}

func equalEvent(a, b Event) bool {
	return a.ID == b.ID && a.Code == b.Code && a.Description == b.Description &&
		a.NotBefore.Equal(b.NotBefore) && a.NotAfter.Equal(b.NotAfter) && a.Deadline.Equal(b.Deadline)
}

func TestMove(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name            string
		instance, event string
		newStart        time.Time
		setup           func(*harness.EC2InstanceStatus)
		want            error  // nil, ErrRefused or ErrUnavailable
		code            string // EC2's error code
	}{
		{name: "moved", instance: inst, event: reboot, newStart: t0.Add(3 * 24 * time.Hour)},
		{name: "exactly 60 minutes ahead", instance: inst, event: reboot, newStart: t0.Add(time.Hour)},
		{name: "exactly the deadline", instance: inst, event: reboot, newStart: t0.Add(10 * 24 * time.Hour)},
		{name: "no deadline", instance: inst, event: noDL, newStart: t0.Add(3 * 24 * time.Hour), want: ErrRefused, code: "InvalidInstanceEventStartTime"},
		{name: "after the deadline", instance: inst, event: reboot, newStart: t0.Add(10*24*time.Hour + time.Second), want: ErrRefused, code: "InvalidInstanceEventStartTime"},
		{name: "less than 60 minutes ahead", instance: inst, event: reboot, newStart: t0.Add(59 * time.Minute), want: ErrRefused, code: "InvalidInstanceEventStartTime"},
		{name: "within 5 minutes of its start", instance: inst, event: soon, newStart: t0.Add(2 * time.Hour), want: ErrRefused, code: "InvalidInstanceEventStartTime"},
		{name: "unknown event", instance: inst, event: "instance-event-0ffffffffffffffff", newStart: t0.Add(3 * 24 * time.Hour), want: ErrRefused, code: "InvalidInstanceEventIDNotFound"},
		{name: "unknown instance", instance: "i-0ffffffffffffffff", event: reboot, newStart: t0.Add(3 * 24 * time.Hour), want: ErrRefused, code: "InvalidInstanceID.NotFound"},
		{name: "denied", instance: inst, event: reboot, newStart: t0.Add(3 * 24 * time.Hour), want: ErrRefused, code: "UnauthorizedOperation",
			setup: func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"ModifyInstanceEventStartTime": true} }},
		{name: "500", instance: inst, event: reboot, newStart: t0.Add(3 * 24 * time.Hour), want: ErrUnavailable, code: "InternalError",
			setup: func(s *harness.EC2InstanceStatus) { s.Fail = 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, ev := newEC2(t)
			if tt.setup != nil {
				tt.setup(srv)
			}
			before, _ := srv.Event(tt.instance, tt.event)
			got, err := ev.Move(ctx, tt.instance, tt.event, tt.newStart)
			moves := srv.Moves()
			if len(moves) != 1 || moves[0].InstanceID != tt.instance || moves[0].EventID != tt.event || !moves[0].NotBefore.Equal(tt.newStart) || moves[0].DryRun || moves[0].Error != tt.code {
				t.Errorf("EC2 was asked %+v, want one call for %s %s at %s answered %q", moves, tt.instance, tt.event, tt.newStart, tt.code)
			}
			after, _ := srv.Event(tt.instance, tt.event)
			if tt.want != nil {
				var ae smithy.APIError
				if !errors.Is(err, tt.want) || !errors.As(err, &ae) || ae.ErrorCode() != tt.code {
					t.Fatalf("Move: %v, want %v with code %s", err, tt.want, tt.code)
				}
				if other := map[error]error{ErrRefused: ErrUnavailable, ErrUnavailable: ErrRefused}[tt.want]; errors.Is(err, other) {
					t.Errorf("Move: %v is both refused and unavailable", err)
				}
				if !after.NotBefore.Equal(before.NotBefore) || !after.NotAfter.Equal(before.NotAfter) {
					t.Errorf("a failed move changed the event: %+v, was %+v", after, before)
				}
				if r := FailureReason(err); !strings.HasPrefix(r, "not moved: EC2 ") || !strings.Contains(r, tt.code) {
					t.Errorf("FailureReason = %q", r)
				}
				return
			}
			if err != nil {
				t.Fatalf("Move: %v", err)
			}
			shift := tt.newStart.Sub(before.NotBefore)
			want := Event{ID: tt.event, Code: event.ScheduledType(before.Code), Description: before.Description,
				NotBefore: tt.newStart, NotAfter: before.NotAfter.Add(shift), Deadline: before.NotBeforeDeadline}
			if !equalEvent(got, want) {
				t.Errorf("Move returned %+v\nwant          %+v", got, want)
			}
			// A later DescribeInstanceStatus shows the moved start, as EC2's does.
			found, ok, err := ev.FindEvent(ctx, tt.instance, want.Code)
			if err != nil || !ok || !equalEvent(found, want) {
				t.Errorf("after the move FindEvent = %+v, %v, %v; want %+v", found, ok, err, want)
			}
		})
	}
}

// TestMoveUnreachable: no answer at all is unavailability, not a refusal.
func TestMoveUnreachable(t *testing.T) {
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close()
	cfg := harness.AWSConfig(nil)
	cfg.Retryer = func() aws.Retryer { return aws.NopRetryer{} }
	ev := NewEvents(ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) }))
	_, err := ev.Move(context.Background(), inst, reboot, t0.Add(3*24*time.Hour))
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		t.Errorf("unreachable: %v, want ErrUnavailable", err)
	}
	if r := FailureReason(err); !strings.HasPrefix(r, "not moved: EC2 unavailable") {
		t.Errorf("FailureReason = %q", r)
	}
}

// TestClassify: EC2's answers by code, including those the stand-in does not serve.
func TestClassify(t *testing.T) {
	for code, want := range map[string]error{
		"RequestLimitExceeded":           ErrUnavailable, // EC2's throttling
		"Throttling":                     ErrUnavailable,
		"RequestTimeout":                 ErrUnavailable,
		"InternalError":                  ErrUnavailable,
		"Unavailable":                    ErrUnavailable,
		"InvalidInstanceEventStartTime":  ErrRefused,
		"InvalidInstanceEventIDNotFound": ErrRefused,
		"InvalidParameterValue":          ErrRefused,
		"IncorrectState":                 ErrRefused,
		"UnauthorizedOperation":          ErrRefused,
		"SomethingNew":                   ErrRefused, // a 4xx EC2 answered: asking again does not help
	} {
		err := classify(&smithy.GenericAPIError{Code: code, Message: "m"})
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", code, err, want)
		}
	}
	if err := classify(context.DeadlineExceeded); !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: %v", err)
	}
}

// TestPlanThenMove: a planned start is one the stand-in, which holds EC2's bounds, accepts;
// its deadline is what FindEvent reports.
func TestPlanThenMove(t *testing.T) {
	ctx := context.Background()
	srv, ev := newEC2(t)
	found, ok, err := ev.FindEvent(ctx, inst, event.ScheduledSystemReboot)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	plan := Plan(Input{Now: t0, NotBefore: found.NotBefore, Deadline: found.Deadline, Window: window(t, "0 2 * * 6", "4h"), DrainLead: time.Hour})
	if !plan.Move || !plan.NewStart.Equal(time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)) {
		t.Fatalf("plan %+v", plan)
	}
	moved, err := ev.Move(ctx, inst, found.ID, plan.NewStart)
	if err != nil || !moved.NotBefore.Equal(plan.NewStart) {
		t.Fatalf("Move = %+v, %v", moved, err)
	}
	if e, _ := srv.Event(inst, found.ID); !e.NotBefore.Equal(plan.NewStart) {
		t.Errorf("EC2 holds %s, want %s", e.NotBefore, plan.NewStart)
	}
}
