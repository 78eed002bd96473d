package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// now is Saturday 2026-11-21 12:00 UTC.
var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func scheduled(typ event.ScheduledType, start time.Time) event.Event {
	return event.Event{
		ID: "ev-1", Kind: event.KindScheduledChange, Time: now.Add(-24 * time.Hour), Deadline: start,
		Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/X/1", TypeCode: "AWS_EC2_X", Status: event.HealthUpcoming, Scheduled: typ, Start: start},
	}
}

func instanceEvent(kind event.Kind, state event.InstanceState) event.Event {
	ev := event.Event{ID: "ev-2", Kind: kind, Time: now.Add(-time.Minute), State: state}
	if kind == event.KindSpotInterruption || kind == event.KindCapacityReservation {
		ev.Deadline = ev.Time.Add(event.InterruptionNotice)
	}
	return ev
}

func target(ann map[string]string) Target {
	return Target{InstanceID: "i-0a1b2c3d4e5f60718", Found: true, Node: "ip-10-0-1-23.eu-west-1.compute.internal",
		NodeClaim: "kafka-abc12", NodePool: "kafka", Policy: FromAnnotations(ann), PoolNodes: 6}
}

func TestDecide(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	saturdays := map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name    string
		ev      event.Event
		tg      Target
		action  Action
		until   time.Time
		reason  string
		warning string
		cancel  bool
	}{
		// No annotations: Karpenter's behaviour.
		{name: "default scheduled drains", ev: scheduled(event.ScheduledInstanceReboot, week), tg: target(nil), action: ActionDrain, reason: "no annotation"},
		{name: "default spot drains", ev: instanceEvent(event.KindSpotInterruption, ""), tg: target(nil), action: ActionDrain},
		{name: "default capacity reservation drains", ev: instanceEvent(event.KindCapacityReservation, ""), tg: target(nil), action: ActionDrain},
		{name: "default rebalance recorded", ev: instanceEvent(event.KindRebalance, ""), tg: target(nil), action: ActionIgnore, reason: "recorded only"},
		{name: "default stopping drains", ev: instanceEvent(event.KindStateChange, event.StateStopping), tg: target(nil), action: ActionDrain},
		{name: "default terminated drains", ev: instanceEvent(event.KindStateChange, event.StateTerminated), tg: target(nil), action: ActionDrain},
		{name: "pending ignored", ev: instanceEvent(event.KindStateChange, event.StatePending), tg: target(nil), action: ActionIgnore},
		{name: "running cancels", ev: instanceEvent(event.KindStateChange, event.StateRunning), tg: target(nil), action: ActionIgnore, cancel: true},
		{name: "not in cluster", ev: instanceEvent(event.KindSpotInterruption, ""), tg: Target{InstanceID: "i-0fedcba9876543210"}, action: ActionSkip, reason: "not a node"},

		// Ignore.
		{name: "ignore reboot", ev: scheduled(event.ScheduledInstanceReboot, week), tg: target(map[string]string{ScheduledActionKey(event.ScheduledInstanceReboot): "ignore"}), action: ActionIgnore, reason: "instance-reboot"},
		{name: "ignore spot warns", ev: instanceEvent(event.KindSpotInterruption, ""), tg: target(map[string]string{AnnotationAction: "ignore"}), action: ActionIgnore, warning: "not drained"},
		{name: "ignore stopping", ev: instanceEvent(event.KindStateChange, event.StateStopping), tg: target(map[string]string{AnnotationAction: "ignore"}), action: ActionIgnore},

		// Reboot in place: deferred to the window as a drain; when it goes, a drain the
		// engine carries out in place (InPlace), paced as a drain.
		{name: "reboot in place waits for the window", ev: scheduled(event.ScheduledSystemReboot, week),
			tg: target(with(saturdays, ScheduledActionKey(event.ScheduledSystemReboot), "reboot-in-place")), action: ActionDefer, until: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), reason: "waiting for the maintenance window"},
		{name: "reboot in place goes at deadline minus lead", ev: scheduled(event.ScheduledInstanceReboot, now.Add(30*time.Minute)),
			tg: target(map[string]string{ScheduledActionKey(event.ScheduledInstanceReboot): "reboot-in-place"}), action: ActionDrain, reason: "rebooting in place"},
		{name: "reboot in place paced", ev: scheduled(event.ScheduledSystemMaintenance, now.Add(30*time.Minute)),
			tg: func() Target {
				tg := target(map[string]string{ScheduledActionKey(event.ScheduledSystemMaintenance): "reboot-in-place", AnnotationMaxConcurrentDrains: "1"})
				tg.DrainsInFlight = 1
				return tg
			}(), action: ActionDrain, warning: "draining over max-concurrent-drains"},
		{name: "reboot in place on retirement is refused: defers", ev: scheduled(event.ScheduledInstanceRetirement, week),
			tg: target(map[string]string{ScheduledActionKey(event.ScheduledInstanceRetirement): "reboot-in-place"}), action: ActionDefer, until: week.Add(-DefaultDrainLead), warning: "reboot-in-place applies to"},

		// Defer.
		{name: "defer urgent spot drains", ev: instanceEvent(event.KindSpotInterruption, ""), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionDrain, warning: "cannot be deferred"},
		{name: "defer urgent capacity reservation drains", ev: instanceEvent(event.KindCapacityReservation, ""), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionDrain, warning: "cannot be deferred"},
		{name: "defer shutting-down drains", ev: instanceEvent(event.KindStateChange, event.StateShuttingDown), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionDrain, warning: "cannot be deferred"},
		{name: "defer no window waits for deadline-lead", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionDefer, until: week.Add(-time.Hour), reason: "no maintenance window"},
		{name: "defer custom lead", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "defer", AnnotationDrainLead: "6h"}), action: ActionDefer, until: week.Add(-6 * time.Hour)},
		{name: "defer waits for next window", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(with(saturdays, AnnotationAction, "defer")), action: ActionDefer, until: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), reason: "waiting for the maintenance window"},
		// A rescheduled event starts at the opening plus drain-lead: the drain is in the window.
		{name: "defer window opens at deadline minus lead", ev: scheduled(event.ScheduledSystemReboot, time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)), tg: target(with(saturdays, AnnotationAction, "defer", AnnotationDrainLead, "1h")), action: ActionDefer, until: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), reason: "waiting for the maintenance window"},
		{name: "defer window opens after deadline", ev: scheduled(event.ScheduledInstanceRetirement, now.Add(48*time.Hour)), tg: target(with(saturdays, AnnotationAction, "defer")), action: ActionDefer, until: now.Add(47 * time.Hour), reason: "opens after deadline"},
		{name: "defer window open now drains", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 10 * * *", AnnotationWindowDuration: "4h"}), action: ActionDrain, reason: "is open"},
		{name: "defer deadline passed drains", ev: scheduled(event.ScheduledInstanceRetirement, now.Add(-time.Hour)), tg: target(with(saturdays, AnnotationAction, "defer")), action: ActionDrain, reason: "is reached"},
		{name: "defer inside lead drains", ev: scheduled(event.ScheduledInstanceRetirement, now.Add(30*time.Minute)), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionDrain, reason: "is reached"},
		{name: "defer time zone window", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "CRON_TZ=America/New_York 0 1 * * *", AnnotationWindowDuration: "2h"}), action: ActionDefer, until: time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)},
		{name: "defer stopping waits restart grace", ev: instanceEvent(event.KindStateChange, event.StateStopped), tg: target(map[string]string{ActionKey(event.KindStateChange): "defer"}), action: ActionDefer, until: now.Add(-time.Minute + DefaultRestartGrace), reason: "restart-grace"},
		{name: "defer stopping grace over drains", ev: func() event.Event {
			e := instanceEvent(event.KindStateChange, event.StateStopped)
			e.Time = now.Add(-time.Hour)
			return e
		}(), tg: target(map[string]string{ActionKey(event.KindStateChange): "defer"}), action: ActionDrain, reason: "not running again"},
		{name: "defer rebalance waits for window", ev: instanceEvent(event.KindRebalance, ""), tg: target(with(saturdays, ActionKey(event.KindRebalance), "defer")), action: ActionDefer, until: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)},
		{name: "defer rebalance without window drains", ev: instanceEvent(event.KindRebalance, ""), tg: target(map[string]string{ActionKey(event.KindRebalance): "defer"}), action: ActionDrain, reason: "nothing to wait for"},

		// Most specific key wins: a Kafka pool ignores reboots, drains retirements.
		{name: "kafka reboot", ev: scheduled(event.ScheduledSystemReboot, week), tg: target(map[string]string{AnnotationAction: "drain", ScheduledActionKey(event.ScheduledSystemReboot): "ignore"}), action: ActionIgnore},
		{name: "kafka retirement", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "drain", ScheduledActionKey(event.ScheduledSystemReboot): "ignore"}), action: ActionDrain},

		// Closed Health events cancel.
		{name: "closed cancels", ev: func() event.Event {
			e := scheduled(event.ScheduledInstanceReboot, week)
			e.Health.Status = event.HealthClosed
			return e
		}(), tg: target(map[string]string{AnnotationAction: "defer"}), action: ActionIgnore, cancel: true, reason: "closed"},

		// Pacing.
		{name: "pacing holds", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 1
			return t
		}(), action: ActionDefer, until: week.Add(-DefaultDrainLead), reason: "max-concurrent-drains"},
		{name: "pacing holds an event with no deadline for at most PacingRecheck", ev: event.Event{ID: "rb", Kind: event.KindRebalance, Time: now}, tg: func() Target {
			t := target(map[string]string{ActionKey(event.KindRebalance): "drain", AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 1
			return t
		}(), action: ActionDefer, until: now.Add(PacingRecheck), reason: "max-concurrent-drains"},
		{name: "pacing percent of a pool of one node", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "10%"})
			t.PoolNodes = 1
			return t
		}(), action: ActionDrain},
		{name: "pacing percent under limit", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "34%"})
			t.DrainsInFlight = 2
			return t
		}(), action: ActionDrain},
		{name: "pacing percent at limit", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "33%"})
			t.DrainsInFlight = 2
			return t
		}(), action: ActionDefer},
		{name: "pacing never holds urgent", ev: instanceEvent(event.KindSpotInterruption, ""), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 3
			return t
		}(), action: ActionDrain},
		{name: "pacing gives way at deadline-lead", ev: scheduled(event.ScheduledInstanceRetirement, now.Add(30*time.Minute)), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 1
			return t
		}(), action: ActionDrain, warning: "over max-concurrent-drains"},
		{name: "pacing hold capped at deadline-lead", ev: scheduled(event.ScheduledInstanceRetirement, now.Add(time.Hour+30*time.Second)), tg: func() Target {
			t := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 1
			return t
		}(), action: ActionDefer, until: now.Add(30 * time.Second)},
		{name: "pacing applies to window drain", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: func() Target {
			t := target(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 10 * * *", AnnotationWindowDuration: "4h", AnnotationMaxConcurrentDrains: "1"})
			t.DrainsInFlight = 1
			return t
		}(), action: ActionDefer, reason: "is open; held by max-concurrent-drains"},

		// Invalid annotations fall to the safe side and say so.
		{name: "invalid action defers", ev: scheduled(event.ScheduledInstanceRetirement, week), tg: target(map[string]string{AnnotationAction: "later"}), action: ActionDefer, until: week.Add(-DefaultDrainLead), reason: "invalid", warning: "want drain, defer or ignore"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.ev, tt.tg, now)
			if d.Action != tt.action {
				t.Fatalf("action = %s (%s), want %s", d.Action, d.Reason, tt.action)
			}
			if d.Action == ActionDefer && d.Until.IsZero() {
				t.Error("a defer without until")
			}
			if !tt.until.IsZero() && !d.Until.Equal(tt.until) {
				t.Errorf("until = %s, want %s (%s)", d.Until, tt.until, d.Reason)
			}
			if d.Action == ActionDefer && !d.Deadline.IsZero() && d.Until.After(d.Deadline.Add(-tt.tg.Policy.DrainLead)) {
				t.Errorf("until %s is past deadline-lead", d.Until)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q does not mention %q", d.Reason, tt.reason)
			}
			if d.Reason == "" {
				t.Error("no reason")
			}
			if tt.warning != "" && !strings.Contains(strings.Join(d.Warnings, "|"), tt.warning) {
				t.Errorf("warnings %q do not mention %q", d.Warnings, tt.warning)
			}
			if d.Cancel != tt.cancel {
				t.Errorf("cancel = %v", d.Cancel)
			}
			if d.EventID != tt.ev.ID || d.InstanceID != tt.tg.InstanceID {
				t.Errorf("identity: %+v", d)
			}
		})
	}
}

func TestApplyChecks(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	pass := Check{Name: "ami", Passed: true, Reason: "ami-1 available"}
	fail := Check{Name: "ami", Reason: "ami-2 is pending"}
	down := Check{Name: "capacity-reservation", Unavailable: true, Reason: "check unavailable: throttled"}
	p := FromAnnotations(nil)
	drain := func(ev event.Event) Decision { return Decide(ev, target(nil), now) }

	d := ApplyChecks(drain(scheduled(event.ScheduledInstanceRetirement, week)), scheduled(event.ScheduledInstanceRetirement, week), p, []Check{pass}, now)
	if d.Action != ActionDrain || len(d.Checks) != 1 {
		t.Errorf("passing checks: %+v", d)
	}
	ev := scheduled(event.ScheduledInstanceRetirement, week)
	d = ApplyChecks(drain(ev), ev, p, []Check{pass, fail}, now)
	if d.Action != ActionDefer || !d.Until.Equal(now.Add(CheckRecheck)) || !strings.Contains(d.Reason, "ami-2 is pending") {
		t.Errorf("failed check on non-urgent: %+v", d)
	}
	ev = scheduled(event.ScheduledInstanceRetirement, now.Add(time.Hour+time.Minute))
	d = ApplyChecks(drain(ev), ev, p, []Check{down}, now)
	if d.Action != ActionDefer || !d.Until.Equal(now.Add(time.Minute)) || !strings.Contains(d.Reason, "check unavailable") {
		t.Errorf("unavailable check capped at deadline-lead: %+v", d)
	}
	ev = scheduled(event.ScheduledInstanceRetirement, now.Add(time.Hour))
	d = ApplyChecks(drain(ev), ev, p, []Check{fail}, now)
	if d.Action != ActionDrain || len(d.Warnings) == 0 {
		t.Errorf("deadline-lead reached drains with warning: %+v", d)
	}
	spot := instanceEvent(event.KindSpotInterruption, "")
	d = ApplyChecks(drain(spot), spot, p, []Check{fail}, now)
	if d.Action != ActionDrain || !strings.Contains(strings.Join(d.Warnings, "|"), "ami-2 is pending") {
		t.Errorf("urgent drains with warning: %+v", d)
	}
	ign := Decide(instanceEvent(event.KindRebalance, ""), target(nil), now)
	if d := ApplyChecks(ign, instanceEvent(event.KindRebalance, ""), p, []Check{fail}, now); d.Action != ActionIgnore {
		t.Errorf("checks changed a non-drain: %+v", d)
	}
}

// TestHolds: every deferral says what it waits for, so the live router can release it early.
func TestHolds(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	paced := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
	paced.DrainsInFlight = 1
	windowed := target(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "1h"})
	stop := event.Event{ID: "st", Kind: event.KindStateChange, State: event.StateStopping, Time: now}
	tests := []struct {
		name string
		ev   event.Event
		tg   Target
		want Hold
	}{
		{"window", scheduled(event.ScheduledInstanceRetirement, week), windowed, HoldWindow},
		{"deadline without a window", scheduled(event.ScheduledInstanceRetirement, week), target(map[string]string{AnnotationAction: "defer"}), HoldDeadline},
		{"window opens at deadline minus drain-lead", scheduled(event.ScheduledSystemReboot, time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)), func() Target {
			t := windowed
			t.Policy = FromAnnotations(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "1h", AnnotationDrainLead: "1h"})
			return t
		}(), HoldWindow},
		{"window opens too late", scheduled(event.ScheduledInstanceRetirement, now.Add(3*time.Hour)), func() Target {
			t := windowed
			t.Policy = FromAnnotations(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 2 1 1 *", AnnotationWindowDuration: "1h"})
			return t
		}(), HoldDeadline},
		{"restart grace", stop, target(map[string]string{ActionKey(event.KindStateChange): "defer"}), HoldRestartGrace},
		{"pacing", scheduled(event.ScheduledInstanceRetirement, week), paced, HoldPacing},
		{"a drain holds nothing", scheduled(event.ScheduledInstanceRetirement, week), target(nil), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.ev, tt.tg, now)
			if d.Hold != tt.want {
				t.Errorf("hold %q, want %q (%s: %s)", d.Hold, tt.want, d.Action, d.Reason)
			}
		})
	}
	d := ApplyChecks(Decide(scheduled(event.ScheduledInstanceRetirement, week), target(nil), now), scheduled(event.ScheduledInstanceRetirement, week), target(nil).Policy,
		[]Check{{Name: "ami", Reason: "ami-1 is pending"}}, now)
	if d.Action != ActionDefer || d.Hold != HoldCheck {
		t.Errorf("failed check: %s hold %q", d.Action, d.Hold)
	}
}

func TestPaced(t *testing.T) {
	limited := FromAnnotations(map[string]string{AnnotationMaxConcurrentDrains: "20%"})
	for _, tt := range []struct {
		ev   event.Event
		p    Policy
		want bool
	}{
		{scheduled(event.ScheduledInstanceRetirement, now), limited, true},
		{event.Event{Kind: event.KindSpotInterruption}, limited, false},
		{event.Event{Kind: event.KindStateChange, State: event.StateTerminated}, limited, false},
		{scheduled(event.ScheduledInstanceRetirement, now), FromAnnotations(nil), false},
	} {
		if got := Paced(tt.ev, tt.p); got != tt.want {
			t.Errorf("Paced(%s %s) = %v, want %v", tt.ev.Kind, tt.ev.State, got, tt.want)
		}
	}
}
func impaired() event.Event {
	return event.Event{
		ID: "healthrouter.io/instance-status/i-0a1b2c3d4e5f60718/impaired/2026-11-21T11:57:00Z", Kind: event.KindInstanceStatus, Time: now,
		Status: &event.InstanceStatus{InstanceStatus: "impaired", SystemStatus: "ok", ImpairedSince: now.Add(-3 * time.Minute)},
	}
}

// TestDecideCapacityBlockExpiration (issue 27, 5): a Capacity Block's expiration is urgent:
// drained at once by default (past a window, pacing and a defer of the pool's default action
// alike), ignored only where the pool asks; a pool whose action for it is defer keeps its
// nodes until deadline (the first terminations, end - 30 min) minus drain-lead.
func TestDecideCapacityBlockExpiration(t *testing.T) {
	end := now.Add(40 * time.Minute) // the warning came now
	ev := event.Event{ID: "cb-1", Kind: event.KindCapacityBlockExpiration, Source: "aws.ec2", Time: now, Reservation: "cr-0a1b2c3d4e5f60901",
		Deadline: end.Add(-event.CapacityBlockTerminationLead)}
	key := ActionKey(event.KindCapacityBlockExpiration)
	tests := []struct {
		name   string
		ann    map[string]string
		action Action
		until  time.Time
		reason string
	}{
		{"default drains at once", nil, ActionDrain, time.Time{}, "EC2 terminates its instances from 2026-11-21T12:10:00Z"},
		{"a window does not hold it", map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h", AnnotationMaxConcurrentDrains: "1"}, ActionDrain, time.Time{}, "Capacity Block cr-0a1b2c3d4e5f60901 ends"},
		// The default drain-lead (1h) is past the block's ten minutes.
		{"the pool's defer with the default drain-lead drains", map[string]string{AnnotationAction: "defer"}, ActionDrain, time.Time{}, "deadline minus drain-lead 1h0m0s is reached"},
		{"its own defer drains at deadline - drain-lead", map[string]string{key: "defer", AnnotationDrainLead: "5m"}, ActionDefer, now.Add(5 * time.Minute), "draining at deadline minus drain-lead 5m0s"},
		{"its own defer past deadline - drain-lead drains", map[string]string{key: "defer", AnnotationDrainLead: "15m"}, ActionDrain, time.Time{}, "is reached"},
		{"ignored where the pool asks", map[string]string{key: "ignore"}, ActionIgnore, time.Time{}, "ends"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(ev, target(tt.ann), now)
			if d.Action != tt.action || !d.Until.Equal(tt.until) || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("%s until %s (%s), want %s until %s, reason with %q", d.Action, d.Until, d.Reason, tt.action, tt.until, tt.reason)
			}
		})
	}
}

func TestDecideInstanceStatus(t *testing.T) {
	saturdays := map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h", AnnotationAction: "defer"}
	paced := target(map[string]string{AnnotationMaxConcurrentDrains: "1"})
	paced.DrainsInFlight = 1
	tests := []struct {
		name    string
		tg      Target
		action  Action
		until   time.Time
		reason  string
		warning string
	}{
		{name: "default drains, as Karpenter", tg: target(nil), action: ActionDrain, reason: "no annotation"},
		{name: "explicit drain", tg: target(map[string]string{ActionKey(event.KindInstanceStatus): "drain"}), action: ActionDrain, reason: "healthrouter.io/action.instance-status=drain"},
		{name: "ignore honoured with a warning", tg: target(map[string]string{ActionKey(event.KindInstanceStatus): "ignore"}), action: ActionIgnore, reason: "left in place", warning: "Karpenter would have replaced it"},
		{name: "pool-wide ignore applies", tg: target(map[string]string{AnnotationAction: "ignore"}), action: ActionIgnore, warning: "Karpenter would have replaced it"},
		{name: "defer drains with a warning", tg: target(map[string]string{ActionKey(event.KindInstanceStatus): "defer"}), action: ActionDrain, reason: "overridden", warning: "cannot be deferred"},
		{name: "defer does not wait for a window", tg: target(saturdays), action: ActionDrain, warning: "cannot be deferred"},
		{name: "kind key beats pool default", tg: target(map[string]string{AnnotationAction: "ignore", ActionKey(event.KindInstanceStatus): "drain"}), action: ActionDrain},
		{name: "paced by max-concurrent-drains", tg: paced, action: ActionDefer, until: now.Add(PacingRecheck), reason: "max-concurrent-drains"},
		{name: "not in cluster", tg: Target{InstanceID: "i-0fedcba9876543210"}, action: ActionSkip},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(impaired(), tt.tg, now)
			if d.Action != tt.action {
				t.Fatalf("action = %s (%s), want %s", d.Action, d.Reason, tt.action)
			}
			if !d.Until.Equal(tt.until) {
				t.Errorf("until = %v, want %v", d.Until, tt.until)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q does not mention %q", d.Reason, tt.reason)
			}
			if tt.warning != "" && !strings.Contains(strings.Join(d.Warnings, "; "), tt.warning) {
				t.Errorf("warnings %q do not mention %q", d.Warnings, tt.warning)
			}
			if tt.warning == "" && len(d.Warnings) > 0 {
				t.Errorf("unexpected warnings %q", d.Warnings)
			}
			if d.Kind != event.KindInstanceStatus || !d.Deadline.IsZero() {
				t.Errorf("kind %q deadline %v", d.Kind, d.Deadline)
			}
		})
	}
}

// TestDecideInstanceStatusFinding: a scheduled event the poller found is decided exactly as
// the AWS Health event of the same maintenance, by the same annotations.
func TestDecideInstanceStatusFinding(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	for _, typ := range event.ScheduledTypes {
		_, finding, err := event.StatusFinding{InstanceID: "i-0a1b2c3d4e5f60718", Finding: event.FindingScheduledEvent, Time: now,
			Code: typ, EventID: "instance-event-0d59937288b749b32", NotBefore: week}.Event()
		if err != nil {
			t.Fatal(err)
		}
		health := scheduled(typ, week)
		for _, ann := range []map[string]string{
			nil,
			{ScheduledActionKey(typ): "ignore"},
			{ScheduledActionKey(typ): "defer"},
			{ActionKey(event.KindScheduledChange): "defer", AnnotationDrainLead: "6h"},
			{AnnotationAction: "defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"},
		} {
			a, b := Decide(finding, target(ann), now), Decide(health, target(ann), now)
			if a.Action != b.Action || !a.Until.Equal(b.Until) {
				t.Errorf("%s %v: finding %s until %v, Health event %s until %v", typ, ann, a.Action, a.Until, b.Action, b.Until)
			}
		}
	}
}

func TestInstanceStatusAnnotation(t *testing.T) {
	if !slices.Contains(Annotations(), "healthrouter.io/action.instance-status") {
		t.Error("healthrouter.io/action.instance-status is not a known annotation")
	}
	p := FromAnnotations(map[string]string{"healthrouter.io/action.instance-status": "ignore"})
	if p.Kinds[event.KindInstanceStatus] != ActionIgnore || len(p.Problems) > 0 {
		t.Errorf("policy = %+v", p)
	}
}

// TestDecideSeams: the rules behind the seams issue 15 found, each as a table row.
func TestDecideSeams(t *testing.T) {
	impaired := event.Event{ID: "healthrouter.io/instance-status/i-1/impaired/2026-11-21T11:50:00Z", Kind: event.KindInstanceStatus, Time: now,
		Status: &event.InstanceStatus{SystemStatus: "impaired", ImpairedSince: now.Add(-10 * time.Minute)}}
	recovered := event.Event{ID: "r", Kind: event.KindInstanceStatus, Time: now, Status: &event.InstanceStatus{InstanceStatus: "ok", SystemStatus: "ok", Recovered: true}}
	stopped := instanceEvent(event.KindStateChange, event.StateStopped)
	withPool := func(tg Target, nodes, impaired int, ann map[string]string) Target {
		tg.Policy, tg.PoolNodes, tg.Impaired = FromAnnotations(ann), nodes, impaired
		return tg
	}
	unmanaged := func(mode string) Target {
		return Target{InstanceID: "i-0ffffffffffff0001", Found: true, Node: "ng-node-0", Unmanaged: mode}
	}
	running := target(nil)
	running.RunningSince = stopped.Time.Add(time.Minute)
	tests := []struct {
		name   string
		ev     event.Event
		tg     Target
		action Action
		hold   Hold
		reason string
		cancel bool
	}{
		{"impaired: first of a pool of 10 is replaced", impaired, withPool(target(nil), 10, 0, nil), ActionDrain, "", "instance status", false},
		{"impaired: a second within 20% of 10", impaired, withPool(target(nil), 10, 1, nil), ActionDrain, "", "", false},
		{"impaired: a third is over the cut-off", impaired, withPool(target(nil), 10, 2, nil), ActionDefer, HoldRepairCutoff, "repair cut-off", false},
		{"impaired: the cap bounds a large pool", impaired, withPool(target(nil), 1000, 10, nil), ActionDefer, HoldRepairCutoff, "at most 10", false},
		{"impaired: a pool that raises its cut-off", impaired, withPool(target(nil), 10, 4, map[string]string{AnnotationRepairMaxUnhealthy: "50%"}), ActionDrain, "", "", false},
		{"impaired: a count cut-off of zero stops every repair", impaired, withPool(target(nil), 10, 0, map[string]string{AnnotationRepairMaxUnhealthy: "0"}), ActionDefer, HoldRepairCutoff, "", false},
		{"impaired: ignore is not cut off", impaired, withPool(target(nil), 10, 5, map[string]string{AnnotationAction: "ignore"}), ActionIgnore, "", "", false},
		{"recovered cancels a held repair", recovered, target(nil), ActionIgnore, "", "passes its status checks again", true},
		{"a stop older than the last running is over", stopped, running, ActionIgnore, "", "has been running since", false},
		{"a stop EC2 shows running again is over", func() event.Event { ev := stopped; ev.RunsAgain = "EC2 shows it running"; return ev }(), target(nil), ActionIgnore, "", "EC2 shows it running: the stop is over", false},
		{"a stop EC2 shows running again is over, in a pool that defers stops", func() event.Event { ev := stopped; ev.RunsAgain = "EC2 shows it pending"; return ev }(),
			target(map[string]string{ActionKey(event.KindStateChange): "defer"}), ActionIgnore, "", "EC2 shows it pending", false},
		{"a stop after the last running drains", stopped, func() Target { tg := target(nil); tg.RunningSince = stopped.Time.Add(-time.Hour); return tg }(), ActionDrain, "", "", false},
		{"unmanaged, ignore: a clear outcome", scheduled(event.ScheduledInstanceRetirement, now.Add(72*time.Hour)), unmanaged(UnmanagedIgnore), ActionSkip, "", "not managed by Karpenter", false},
		{"unmanaged, ignore: even a Spot warning", instanceEvent(event.KindSpotInterruption, ""), unmanaged(UnmanagedIgnore), ActionSkip, "", "not managed by Karpenter", false},
		{"unmanaged, cordon-drain: a Spot warning drains", instanceEvent(event.KindSpotInterruption, ""), unmanaged(UnmanagedCordonDrain), ActionDrain, "", "", false},
		{"unmanaged, cordon-drain: an impaired node is not cut off", impaired, unmanaged(UnmanagedCordonDrain), ActionDrain, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.ev, tt.tg, now)
			if d.Action != tt.action || d.Hold != tt.hold || d.Cancel != tt.cancel || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("got %s hold %q cancel %v (%s)", d.Action, d.Hold, d.Cancel, d.Reason)
			}
			if d.Hold == HoldRepairCutoff && (!d.Until.Equal(now.Add(RepairRecheck)) || len(d.Warnings) == 0) {
				t.Errorf("a cut-off hold must recheck at %s with a warning: until %s, warnings %v", now.Add(RepairRecheck), d.Until, d.Warnings)
			}
		})
	}
}

// TestRepairLimit: a NodePool's disruption budget naming the reason Unhealthy (Karpenter
// v1.15's node repair) bounds the router's repair cut-off too; the stricter of it and
// repair-max-unhealthy wins, and the decision says which held it. A budget without reasons,
// or for other reasons, is not read; a scheduled one counts only while active.
func TestRepairLimit(t *testing.T) {
	impaired := event.Event{ID: "healthrouter.io/instance-status/i-1/impaired/2026-11-21T11:50:00Z", Kind: event.KindInstanceStatus, Time: now,
		Status: &event.InstanceStatus{SystemStatus: "impaired", ImpairedSince: now.Add(-10 * time.Minute)}}
	unhealthy := func(nodes string) karpv1.Budget {
		return karpv1.Budget{Nodes: nodes, Reasons: []karpv1.DisruptionReason{karpv1.DisruptionReasonUnhealthy}}
	}
	scheduledBudget := func(nodes, schedule string, d time.Duration) karpv1.Budget {
		b := unhealthy(nodes)
		b.Schedule, b.Duration = &schedule, &metav1.Duration{Duration: d}
		return b
	}
	hour := fmt.Sprintf("%d %d * * *", now.Minute(), now.Hour()) // began at now
	for _, tt := range []struct {
		name     string
		ann      map[string]string
		budgets  []karpv1.Budget
		nodes    int
		impaired int // the pool's others
		want     int
		by       string
		action   Action
	}{
		{name: "no budget: repair-max-unhealthy", nodes: 10, impaired: 1, want: 2, by: AnnotationRepairMaxUnhealthy, action: ActionDrain},
		{name: "an Unhealthy budget stricter than the cut-off holds the second", budgets: []karpv1.Budget{unhealthy("1")}, nodes: 10, impaired: 1, want: 1,
			by: "Unhealthy disruption budget nodes=1", action: ActionDefer},
		{name: "an Unhealthy budget as a percentage, rounded up", budgets: []karpv1.Budget{unhealthy("5%")}, nodes: 30, impaired: 1, want: 2,
			by: "Unhealthy disruption budget nodes=5%", action: ActionDrain},
		{name: "an Unhealthy budget looser than the cut-off: the cut-off holds", ann: map[string]string{AnnotationRepairMaxUnhealthy: "1"},
			budgets: []karpv1.Budget{unhealthy("50%")}, nodes: 10, impaired: 1, want: 1, by: AnnotationRepairMaxUnhealthy, action: ActionDefer},
		{name: "an Unhealthy budget of 0 stops every repair", budgets: []karpv1.Budget{unhealthy("0")}, nodes: 10, want: 0,
			by: "Unhealthy disruption budget nodes=0", action: ActionDefer},
		{name: "a budget without reasons is Karpenter's pacing, not read", budgets: []karpv1.Budget{{Nodes: "0"}}, nodes: 10, want: 2,
			by: AnnotationRepairMaxUnhealthy, action: ActionDrain},
		{name: "a budget for other reasons is not read", budgets: []karpv1.Budget{{Nodes: "0", Reasons: []karpv1.DisruptionReason{karpv1.DisruptionReasonDrifted}}},
			nodes: 10, want: 2, by: AnnotationRepairMaxUnhealthy, action: ActionDrain},
		{name: "a scheduled Unhealthy budget, active", budgets: []karpv1.Budget{scheduledBudget("0", hour, time.Hour)}, nodes: 10, want: 0,
			by: "schedule", action: ActionDefer},
		{name: "a scheduled Unhealthy budget, over", budgets: []karpv1.Budget{scheduledBudget("0", fmt.Sprintf("%d %d * * *", now.Minute(), (now.Hour()+22)%24), time.Hour)},
			nodes: 10, want: 2, by: AnnotationRepairMaxUnhealthy, action: ActionDrain},
		{name: "the strictest of several Unhealthy budgets", budgets: []karpv1.Budget{unhealthy("3"), unhealthy("1"), {Nodes: "0"}}, nodes: 100, impaired: 0, want: 1,
			by: "nodes=1", action: ActionDrain},
		{name: "a budget Karpenter cannot evaluate counts as 0", budgets: []karpv1.Budget{scheduledBudget("5", "not a cron", time.Hour)}, nodes: 10, want: 0,
			by: "cannot evaluate", action: ActionDefer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := FromAnnotations(tt.ann)
			got, by := RepairLimit(p, tt.budgets, tt.nodes, now)
			if got != tt.want || !strings.Contains(by, tt.by) {
				t.Errorf("RepairLimit: %d (%s), want %d (%s)", got, by, tt.want, tt.by)
			}
			tg := target(nil)
			tg.Policy, tg.Budgets, tg.PoolNodes, tg.Impaired = p, tt.budgets, tt.nodes, tt.impaired
			d := Decide(impaired, tg, now)
			if d.Action != tt.action {
				t.Errorf("Decide: %s (%s), want %s", d.Action, d.Reason, tt.action)
			}
			if d.Action == ActionDefer && (d.Hold != HoldRepairCutoff || !strings.Contains(d.Reason, tt.by)) {
				t.Errorf("a hold must be the cut-off's and name what held it (%q): %s %q", tt.by, d.Hold, d.Reason)
			}
		})
	}
}

func TestRepairCutoff(t *testing.T) {
	for _, tt := range []struct {
		ann   map[string]string
		nodes int
		want  int
	}{
		{nil, 3, 1}, {nil, 10, 2}, {nil, 11, 3}, {nil, 1000, 10}, {nil, 0, 0},
		{map[string]string{AnnotationRepairMaxUnhealthy: "3"}, 100, 3},
		{map[string]string{AnnotationRepairMaxUnhealthyCap: "50"}, 1000, 50},
		{map[string]string{AnnotationRepairMaxUnhealthy: "oops"}, 10, 2}, // ignored, with a problem
	} {
		p := FromAnnotations(tt.ann)
		if got := p.RepairCutoff(tt.nodes); got != tt.want {
			t.Errorf("%v over %d nodes: %d, want %d", tt.ann, tt.nodes, got, tt.want)
		}
	}
	if p := FromAnnotations(map[string]string{AnnotationRepairMaxUnhealthyCap: "-1"}); len(p.Problems) != 1 || p.RepairMaxUnhealthyCap != DefaultRepairMaxUnhealthyCap {
		t.Errorf("a negative cap: %v %d", p.Problems, p.RepairMaxUnhealthyCap)
	}
}

// TestRebootInPlaceMarked: only the pools that keep the node mark their decisions InPlace,
// held or going; and the annotation is refused for types AWS replaces the instance for.
func TestRebootInPlaceMarked(t *testing.T) {
	soon := scheduled(event.ScheduledSystemReboot, now.Add(30*time.Minute))
	if d := Decide(soon, target(map[string]string{ScheduledActionKey(event.ScheduledSystemReboot): "reboot-in-place"}), now); !d.InPlace || d.Action != ActionDrain {
		t.Errorf("due: %+v", d)
	}
	if d := Decide(soon, target(map[string]string{ScheduledActionKey(event.ScheduledSystemReboot): "drain"}), now); d.InPlace {
		t.Errorf("a drain pool marked in place: %+v", d)
	}
	stop := scheduled(event.ScheduledInstanceStop, now.Add(7*24*time.Hour))
	for _, key := range []string{AnnotationAction, ActionKey(event.KindScheduledChange), ScheduledActionKey(event.ScheduledInstanceStop)} {
		p := FromAnnotations(map[string]string{key: "reboot-in-place"})
		if a, _ := p.ActionFor(stop); len(p.Problems) != 1 || a != ActionDefer {
			t.Errorf("%s=reboot-in-place: problems %v, action %s, want one problem and a deferral", key, p.Problems, a)
		}
	}
	p := FromAnnotations(map[string]string{ScheduledActionKey(event.ScheduledInstanceReboot): "reboot-in-place"})
	if len(p.Problems) != 0 || p.Scheduled[event.ScheduledInstanceReboot] != ActionRebootInPlace {
		t.Errorf("instance-reboot: %+v", p)
	}
}

// TestUrgentBreaker: the pool's urgent-drain breaker holds an urgent drain once the pool's
// urgent drains within UrgentWindow reach urgent-drain-max; without the annotation none is
// held; an invalid value is a problem and holds at the recommended value.
func TestUrgentBreaker(t *testing.T) {
	spot := instanceEvent(event.KindSpotInterruption, "")
	shutting := instanceEvent(event.KindStateChange, event.StateShuttingDown)
	retire := scheduled(event.ScheduledInstanceRetirement, now.Add(72*time.Hour))
	pool := func(ann map[string]string, nodes, urgent int) Target {
		tg := target(ann)
		tg.PoolNodes, tg.UrgentDrains = nodes, urgent
		return tg
	}
	tests := []struct {
		name    string
		ev      event.Event
		tg      Target
		action  Action
		hold    Hold
		problem string
	}{
		{"no breaker: a storm drains", spot, pool(nil, 10, 9), ActionDrain, "", ""},
		{"within the breaker", spot, pool(map[string]string{AnnotationUrgentDrainMax: "20%"}, 10, 1), ActionDrain, "", ""},
		{"at the breaker: held", spot, pool(map[string]string{AnnotationUrgentDrainMax: "20%"}, 10, 2), ActionDefer, HoldUrgentBreaker, ""},
		{"a percentage rounds up", spot, pool(map[string]string{AnnotationUrgentDrainMax: "20%"}, 6, 1), ActionDrain, "", ""},
		{"a count", shutting, pool(map[string]string{AnnotationUrgentDrainMax: "3"}, 100, 3), ActionDefer, HoldUrgentBreaker, ""},
		{"zero holds every urgent drain", spot, pool(map[string]string{AnnotationUrgentDrainMax: "0"}, 10, 0), ActionDefer, HoldUrgentBreaker, ""},
		{"a defer pool's urgent drain is held too", spot, pool(map[string]string{AnnotationAction: "defer", AnnotationUrgentDrainMax: "1"}, 10, 1), ActionDefer, HoldUrgentBreaker, ""},
		{"an ignore pool ignores", spot, pool(map[string]string{AnnotationAction: "ignore", AnnotationUrgentDrainMax: "0"}, 10, 5), ActionIgnore, "", ""},
		{"not urgent: not the breaker's", retire, pool(map[string]string{AnnotationUrgentDrainMax: "0"}, 10, 5), ActionDrain, "", ""},
		{"an implausible event is not urgent", func() event.Event { e := spot; e.Implausible = "forged"; e.Deadline = time.Time{}; return e }(),
			pool(map[string]string{AnnotationUrgentDrainMax: "0"}, 10, 5), ActionDrain, "", ""},
		{"invalid: the recommended 20%", spot, pool(map[string]string{AnnotationUrgentDrainMax: "lots"}, 10, 2), ActionDefer, HoldUrgentBreaker, "holds urgent drains past 20%"},
		{"invalid: within the recommended 20%", spot, pool(map[string]string{AnnotationUrgentDrainMax: "12.5%"}, 10, 1), ActionDrain, "", "the recommended value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.ev, tt.tg, now)
			if d.Action != tt.action || d.Hold != tt.hold {
				t.Errorf("got %s hold %q (%s), want %s %q", d.Action, d.Hold, d.Reason, tt.action, tt.hold)
			}
			if d.Hold == HoldUrgentBreaker && (!d.Until.Equal(now.Add(UrgentRecheck)) || !strings.Contains(d.Reason, "urgent-drain breaker") || len(d.Warnings) == 0) {
				t.Errorf("a breaker hold rechecks at %s with a reason and a warning: until %s, %q, %v", now.Add(UrgentRecheck), d.Until, d.Reason, d.Warnings)
			}
			problems := strings.Join(tt.tg.Policy.Problems, "; ")
			if (tt.problem == "") != (problems == "") || !strings.Contains(problems, tt.problem) {
				t.Errorf("problems %q, want %q", problems, tt.problem)
			}
			if Breaks(tt.ev, tt.tg.Policy) != (tt.tg.Policy.UrgentDrainMax != nil && tt.ev.Urgent()) {
				t.Error("Breaks disagrees")
			}
		})
	}
}
