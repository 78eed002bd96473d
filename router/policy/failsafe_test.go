package policy

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
)

// failSafeCase is an annotation set, the problem FromAnnotations reports for it, and what tells
// that the pool got the safe setting.
type failSafeCase struct {
	name    string
	ann     map[string]string
	problem string // a substring of the one problem; "" for none
	ok      func(Policy) bool
}

// failSafeCases are the cases of TestFromAnnotationsFailSafe; Examples holds each annotation set.
func failSafeCases() []failSafeCase {
	saturdays := map[string]string{AnnotationWindowSchedule: "0 2 * * 6"}
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
	retirement := scheduled(event.ScheduledInstanceRetirement, now.Add(7*24*time.Hour))
	pacedAtOne := func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 1 }
	defaultCutoff := func(p Policy) bool { return p.RepairCutoff(10) == 2 } // 20% of 10
	defers := func(p Policy) bool { a, _ := p.ActionFor(retirement); return a == ActionDefer }
	return []failSafeCase{
		// mode: shadow or active; anything else is active (shadow while Karpenter's handling is
		// off would lose the pool's events).
		{"mode shadow", map[string]string{AnnotationMode: "shadow"}, "", func(p Policy) bool { return p.Shadow }},
		{"mode active", map[string]string{AnnotationMode: "active"}, "", func(p Policy) bool { return !p.Shadow }},
		{"mode capitalised", map[string]string{AnnotationMode: "Shadow"}, "want active or shadow", func(p Policy) bool { return !p.Shadow }},
		{"mode dry-run", map[string]string{AnnotationMode: "dry-run"}, "the pool is active", func(p Policy) bool { return !p.Shadow }},
		{"mode empty", map[string]string{AnnotationMode: ""}, "want active or shadow", func(p Policy) bool { return !p.Shadow }},
		// max-concurrent-drains: whole numbers and whole percentages only; an invalid value paces at 1.
		{"drains 12.5%", map[string]string{AnnotationMaxConcurrentDrains: "12.5%"}, "pacing at 1", pacedAtOne},
		{"drains 20abc%", map[string]string{AnnotationMaxConcurrentDrains: "20abc%"}, "pacing at 1", pacedAtOne},
		{"drains 1e1%", map[string]string{AnnotationMaxConcurrentDrains: "1e1%"}, "pacing at 1", pacedAtOne},
		{"drains -3", map[string]string{AnnotationMaxConcurrentDrains: "-3"}, "pacing at 1", pacedAtOne},
		{"drains +3", map[string]string{AnnotationMaxConcurrentDrains: "+3"}, "pacing at 1", pacedAtOne},
		{"drains 3.0", map[string]string{AnnotationMaxConcurrentDrains: "3.0"}, "pacing at 1", pacedAtOne},
		{"drains 101%", map[string]string{AnnotationMaxConcurrentDrains: "101%"}, "pacing at 1", pacedAtOne},
		{"drains empty", map[string]string{AnnotationMaxConcurrentDrains: ""}, "pacing at 1", pacedAtOne},
		{"drains past int32", map[string]string{AnnotationMaxConcurrentDrains: "99999999999"}, "pacing at 1", pacedAtOne},
		{"drains 0", map[string]string{AnnotationMaxConcurrentDrains: "0"}, "", func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 0 }},
		{"drains 3", map[string]string{AnnotationMaxConcurrentDrains: "3"}, "", func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 3 }},
		{"drains 0%", map[string]string{AnnotationMaxConcurrentDrains: "0%"}, "", func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 0 }},
		{"drains 25%", map[string]string{AnnotationMaxConcurrentDrains: "25%"}, "", func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 3 }},
		{"drains 100%", map[string]string{AnnotationMaxConcurrentDrains: "100%"}, "", func(p Policy) bool { n, ok := p.DrainLimit(10); return ok && n == 10 }},

		// repair-max-unhealthy: an invalid value is the default cut-off, not "no repairs".
		{"repair 12.5%", map[string]string{AnnotationRepairMaxUnhealthy: "12.5%"}, "20%", defaultCutoff},
		{"repair 20abc%", map[string]string{AnnotationRepairMaxUnhealthy: "20abc%"}, "20%", defaultCutoff},
		{"repair 1e1%", map[string]string{AnnotationRepairMaxUnhealthy: "1e1%"}, "20%", defaultCutoff},
		{"repair -3", map[string]string{AnnotationRepairMaxUnhealthy: "-3"}, "20%", defaultCutoff},
		{"repair 40%", map[string]string{AnnotationRepairMaxUnhealthy: "40%"}, "", func(p Policy) bool { return p.RepairCutoff(10) == 4 }},
		{"repair 3", map[string]string{AnnotationRepairMaxUnhealthy: "3"}, "", func(p Policy) bool { return p.RepairCutoff(10) == 3 }},
		{"repair cap 1.5", map[string]string{AnnotationRepairMaxUnhealthyCap: "1.5"}, "10", func(p Policy) bool { return p.RepairMaxUnhealthyCap == DefaultRepairMaxUnhealthyCap }},

		// Durations are bounded; an invalid or out-of-range one is the default.
		{"drain-lead 876000h", map[string]string{AnnotationDrainLead: "876000h"}, "at most", func(p Policy) bool { return p.DrainLead == DefaultDrainLead }},
		{"drain-lead -1h", map[string]string{AnnotationDrainLead: "-1h"}, "drain-lead", func(p Policy) bool { return p.DrainLead == DefaultDrainLead }},
		{"drain-lead 0s", map[string]string{AnnotationDrainLead: "0s"}, "", func(p Policy) bool { return p.DrainLead == 0 }},
		{"drain-lead 72h", map[string]string{AnnotationDrainLead: "72h"}, "", func(p Policy) bool { return p.DrainLead == 72*time.Hour }},
		{"restart-grace 876000h", map[string]string{AnnotationRestartGrace: "876000h"}, "at most", func(p Policy) bool { return p.RestartGrace == DefaultRestartGrace }},
		{"restart-grace 24h", map[string]string{AnnotationRestartGrace: "24h"}, "", func(p Policy) bool { return p.RestartGrace == 24*time.Hour }},
		// drain-settle: past its bound, the bound (a longer settle paces more, not less).
		{"drain-settle 876000h", map[string]string{AnnotationDrainSettle: "876000h"}, "at most", func(p Policy) bool { return p.DrainSettle == Settle{Duration: MaxDrainSettle} }},
		{"drain-settle soon", map[string]string{AnnotationDrainSettle: "soon"}, "or ready", func(p Policy) bool { return p.DrainSettle == Settle{} }},

		// window-duration: an invalid one keeps the schedule with a one-hour window, so that
		// deferrals still wait for it (a window always open would drain everything now).
		{"window 9999h", with(saturdays, AnnotationWindowDuration, "9999h"), "at most", func(p Policy) bool {
			return p.Window != nil && p.Window.Schedule == "0 2 * * 6" && p.Window.Duration == time.Hour
		}},
		{"window 7d", with(saturdays, AnnotationWindowDuration, "7d"), "window-duration", func(p Policy) bool { return p.Window != nil && p.Window.Duration == time.Hour }},
		{"window daily 25h never closes", map[string]string{AnnotationWindowSchedule: "0 2 * * *", AnnotationWindowDuration: "25h"}, "never closes", func(p Policy) bool {
			return p.Window != nil && p.Window.Duration == time.Hour
		}},
		{"window every minute never closes", map[string]string{AnnotationWindowSchedule: "* * * * *", AnnotationWindowDuration: "1h"}, "opens too often", func(p Policy) bool { return p.Window == nil }},
		{"window every minute, 30s", map[string]string{AnnotationWindowSchedule: "* * * * *", AnnotationWindowDuration: "30s"}, "", func(p Policy) bool { return p.Window != nil }},
		{"window schedule alone", saturdays, "window-duration", func(p Policy) bool { return p.Window != nil && p.Window.Duration == time.Hour }},
		{"window weekdays 120h", map[string]string{AnnotationWindowSchedule: "0 0 * * 1", AnnotationWindowDuration: "120h"}, "", func(p Policy) bool {
			return p.Window != nil && p.Window.Duration == 120*time.Hour
		}},
		{"window weekly 144h", with(saturdays, AnnotationWindowDuration, "144h"), "", func(p Policy) bool { return p.Window != nil && p.Window.Duration == 144*time.Hour }},

		// Actions are case-sensitive; an unknown one defers rather than drains.
		{"action Defer", map[string]string{AnnotationAction: "Defer"}, "defer", defers},
		{"action empty", map[string]string{AnnotationAction: ""}, "defer", defers},
		{"action.scheduled-change DRAIN", map[string]string{AnnotationAction: "drain", ActionKey(event.KindScheduledChange): "DRAIN"}, "defer", defers},
		{"action.scheduled-change.instance-retirement reboot-in-place", map[string]string{ScheduledActionKey(event.ScheduledInstanceRetirement): "reboot-in-place"}, "defer", defers},
		{"action drain", map[string]string{AnnotationAction: "drain"}, "", func(p Policy) bool { a, _ := p.ActionFor(retirement); return a == ActionDrain }},
		{"action defer", map[string]string{AnnotationAction: "defer"}, "", defers},
		{"action ignore", map[string]string{AnnotationAction: "ignore"}, "", func(p Policy) bool { a, _ := p.ActionFor(retirement); return a == ActionIgnore }},
	}
}

// TestFromAnnotationsFailSafe: a value that does not parse, or is out of range, is a problem,
// and the pool gets the conservative setting, never "unlimited" or "drain now".
func TestFromAnnotationsFailSafe(t *testing.T) {
	tests := failSafeCases()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := FromAnnotations(tt.ann)
			switch {
			case tt.problem == "" && len(p.Problems) != 0:
				t.Errorf("a valid value has problems: %q", p.Problems)
			case tt.problem != "" && (len(p.Problems) != 1 || !strings.Contains(p.Problems[0], tt.problem)):
				t.Errorf("problems %q, want one mentioning %q", p.Problems, tt.problem)
			}
			if !tt.ok(p) {
				t.Errorf("not the safe setting: %+v", p)
			}
		})
	}
}

// TestExamplesCoverFailSafe: every annotation set of the fail-safe table is in Examples, which
// test/deploy writes to a real API server through the chart's admission policy.
func TestExamplesCoverFailSafe(t *testing.T) {
	for _, tt := range failSafeCases() {
		if !slices.ContainsFunc(Examples(), func(ex map[string]string) bool { return maps.Equal(ex, tt.ann) }) {
			t.Errorf("%s: %v is not in Examples (router/policy/examples.go)", tt.name, tt.ann)
		}
	}
}

// TestDecideFailSafe: what Decide then does with a pool whose annotation is invalid is the
// conservative outcome: held, paced, repaired within the default cut-off; never drained now
// for want of a limit.
func TestDecideFailSafe(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	retirement := scheduled(event.ScheduledInstanceRetirement, week)
	impairedEv := event.Event{ID: "ev-imp", Kind: event.KindInstanceStatus, Time: now,
		Status: &event.InstanceStatus{SystemStatus: "impaired", ImpairedSince: now.Add(-10 * time.Minute)}}
	stopped := instanceEvent(event.KindStateChange, event.StateStopped)
	stopped.Time = now.Add(-20 * time.Minute)
	rebalance := instanceEvent(event.KindRebalance, "")
	pool := func(ann map[string]string, inFlight, impaired int) Target {
		tg := target(ann)
		tg.PoolNodes, tg.DrainsInFlight, tg.Impaired = 10, inFlight, impaired
		return tg
	}
	nextSaturday := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		ev     event.Event
		tg     Target
		action Action
		hold   Hold
		until  time.Time
		reason string
	}{
		{"max-concurrent-drains 12.5% paces at 1", retirement, pool(map[string]string{AnnotationMaxConcurrentDrains: "12.5%"}, 1, 0), ActionDefer, HoldPacing, week.Add(-DefaultDrainLead), "max-concurrent-drains"},
		{"max-concurrent-drains 20abc% paces at 1", retirement, pool(map[string]string{AnnotationMaxConcurrentDrains: "20abc%"}, 1, 0), ActionDefer, HoldPacing, week.Add(-DefaultDrainLead), "max-concurrent-drains"},
		{"max-concurrent-drains 1e1% paces at 1", retirement, pool(map[string]string{AnnotationMaxConcurrentDrains: "1e1%"}, 1, 0), ActionDefer, HoldPacing, week.Add(-DefaultDrainLead), "max-concurrent-drains"},
		{"max-concurrent-drains -3 paces at 1", retirement, pool(map[string]string{AnnotationMaxConcurrentDrains: "-3"}, 1, 0), ActionDefer, HoldPacing, week.Add(-DefaultDrainLead), "max-concurrent-drains"},
		{"max-concurrent-drains -3: the first drain goes", retirement, pool(map[string]string{AnnotationMaxConcurrentDrains: "-3"}, 0, 0), ActionDrain, "", time.Time{}, ""},
		{"repair-max-unhealthy 12.5% repairs within 20%", impairedEv, pool(map[string]string{AnnotationRepairMaxUnhealthy: "12.5%"}, 0, 1), ActionDrain, "", time.Time{}, "instance status"},
		{"repair-max-unhealthy 12.5% stops over 20%", impairedEv, pool(map[string]string{AnnotationRepairMaxUnhealthy: "12.5%"}, 0, 2), ActionDefer, HoldRepairCutoff, now.Add(RepairRecheck), "repair cut-off"},
		{"drain-lead 876000h holds to deadline minus the default lead", retirement, pool(map[string]string{AnnotationAction: "defer", AnnotationDrainLead: "876000h"}, 0, 0), ActionDefer, HoldDeadline, week.Add(-DefaultDrainLead), "drain-lead 1h"},
		{"window-duration 9999h waits for the next opening", retirement, pool(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "9999h"}, 0, 0), ActionDefer, HoldWindow, nextSaturday, "maintenance window"},
		{"window-duration 9999h: a rebalance waits too", rebalance, pool(map[string]string{ActionKey(event.KindRebalance): "defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "9999h"}, 0, 0), ActionDefer, HoldWindow, nextSaturday, "maintenance window"},
		{"restart-grace 876000h: the default grace", stopped, pool(map[string]string{ActionKey(event.KindStateChange): "defer", AnnotationRestartGrace: "876000h"}, 0, 0), ActionDrain, "", time.Time{}, "restart-grace 15m"},
		{"action Defer defers", retirement, pool(map[string]string{AnnotationAction: "Defer"}, 0, 0), ActionDefer, HoldDeadline, week.Add(-DefaultDrainLead), "invalid"},
		{"action Defer defers to the window", retirement, pool(map[string]string{AnnotationAction: "Defer", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"}, 0, 0), ActionDefer, HoldWindow, nextSaturday, "invalid"},
		{"action Defer is paced in its window", retirement, pool(map[string]string{AnnotationAction: "Defer", AnnotationWindowSchedule: "0 10 * * *", AnnotationWindowDuration: "4h", AnnotationMaxConcurrentDrains: "1"}, 1, 0), ActionDefer, HoldPacing, week.Add(-DefaultDrainLead), "invalid"},
		{"action.scheduled-change DRAIN defers", retirement, pool(map[string]string{ActionKey(event.KindScheduledChange): "DRAIN"}, 0, 0), ActionDefer, HoldDeadline, week.Add(-DefaultDrainLead), "invalid"},
		{"action Defer: a rebalance is recorded only", rebalance, pool(map[string]string{AnnotationAction: "Defer"}, 0, 0), ActionIgnore, "", time.Time{}, "invalid"},
		{"action Defer: Spot still drains", instanceEvent(event.KindSpotInterruption, ""), pool(map[string]string{AnnotationAction: "Defer"}, 0, 0), ActionDrain, "", time.Time{}, ""},
		{"invalid window-schedule: a deferred rebalance waits for it to be fixed", rebalance, pool(map[string]string{ActionKey(event.KindRebalance): "defer", AnnotationWindowSchedule: "saturdays", AnnotationWindowDuration: "4h"}, 0, 0), ActionDefer, HoldWindow, now.Add(WindowRecheck), "invalid"},
		{"invalid window-schedule: a deadline holds to deadline minus lead", retirement, pool(map[string]string{AnnotationAction: "defer", AnnotationWindowSchedule: "saturdays", AnnotationWindowDuration: "4h"}, 0, 0), ActionDefer, HoldDeadline, week.Add(-DefaultDrainLead), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.tg.Policy.Problems) == 0 {
				t.Errorf("setup: no problem in %+v", tt.tg.Policy)
			}
			d := Decide(tt.ev, tt.tg, now)
			if d.Action != tt.action || d.Hold != tt.hold {
				t.Fatalf("%s hold %q (%s), want %s hold %q", d.Action, d.Hold, d.Reason, tt.action, tt.hold)
			}
			if !tt.until.IsZero() && !d.Until.Equal(tt.until) {
				t.Errorf("until %s, want %s (%s)", d.Until, tt.until, d.Reason)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q lacks %q", d.Reason, tt.reason)
			}
			if len(d.Warnings) == 0 {
				t.Error("the problem is not in the decision's warnings")
			}
		})
	}
}

// TestInvalidAlertMatcherFailsSafe: hold-while-alerts that does not parse cannot say whether
// an alert fires: the pool's hold-while-alerts-unreachable decides, as when Alertmanager
// cannot be reached (hold by default), rather than the gate being off.
func TestInvalidAlertMatcherFailsSafe(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	ev := scheduled(event.ScheduledInstanceRetirement, week)
	for _, tt := range []struct {
		ann  map[string]string
		want Action
	}{
		{map[string]string{AnnotationHoldWhileAlerts: "Kafka("}, ActionDefer},
		{map[string]string{AnnotationHoldWhileAlerts: "Kafka(", AnnotationRespectPDB: "false"}, ActionDefer},
		{map[string]string{AnnotationHoldWhileAlerts: "Kafka(", AnnotationHoldWhileAlertsUnreachable: "drain"}, ActionDrain},
	} {
		tg := target(tt.ann)
		if !Gated(ev, tg.Policy, now) {
			t.Errorf("%v: not gated", tt.ann)
			continue
		}
		d := ApplyGates(Decide(ev, tg, now), ev, tg.Policy, nil, now)
		if d.Action != tt.want {
			t.Errorf("%v: %s (%s), want %s", tt.ann, d.Action, d.Reason, tt.want)
		}
		if d.Action == ActionDefer && (d.Hold != HoldAlerts || !strings.Contains(d.Reason, AnnotationHoldWhileAlerts)) {
			t.Errorf("%v: hold %q, reason %q", tt.ann, d.Hold, d.Reason)
		}
	}
}
