package policy

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
)

func TestFromAnnotations(t *testing.T) {
	p := FromAnnotations(map[string]string{
		AnnotationAction:                                  "defer",
		ActionKey(event.KindSpotInterruption):             "ignore",
		ScheduledActionKey(event.ScheduledInstanceReboot): "ignore",
		AnnotationMaxConcurrentDrains:                     "20%",
		AnnotationWindowSchedule:                          "0 2 * * 6",
		AnnotationWindowDuration:                          "4h",
		AnnotationDrainLead:                               "2h",
		AnnotationRestartGrace:                            "10m",
		AnnotationTaintUpcoming:                           "true",
		"karpenter.sh/other":                              "left alone",
	})
	if len(p.Problems) != 0 {
		t.Fatalf("problems: %v", p.Problems)
	}
	if p.Default != ActionDefer || p.Kinds[event.KindSpotInterruption] != ActionIgnore || p.Scheduled[event.ScheduledInstanceReboot] != ActionIgnore {
		t.Errorf("actions: %+v", p)
	}
	if p.DrainLead != 2*time.Hour || p.RestartGrace != 10*time.Minute || p.Window == nil || p.Window.Duration != 4*time.Hour {
		t.Errorf("timing: %+v", p)
	}
	if !p.TaintUpcoming {
		t.Error("taint-upcoming=true not read")
	}
	if n, ok := p.DrainLimit(12); !ok || n != 3 { // 20% of 12 rounds up to 3
		t.Errorf("DrainLimit(12) = %d, %v", n, ok)
	}
}

func TestFromAnnotationsDefaults(t *testing.T) {
	p := FromAnnotations(nil)
	if p.DrainLead != DefaultDrainLead || p.RestartGrace != DefaultRestartGrace || p.Window != nil || p.Default != "" || p.TaintUpcoming || p.Reschedule {
		t.Errorf("defaults: %+v", p)
	}
	if _, ok := p.DrainLimit(10); ok {
		t.Error("unlimited by default")
	}
}

func TestFromAnnotationsInvalid(t *testing.T) {
	tests := []struct {
		ann  map[string]string
		want string
		// check that the invalid value fell back to the default
		check func(Policy) bool
	}{
		// An invalid action defers (a rebalance recommendation is recorded only); an invalid
		// max-concurrent-drains paces at one drain at a time.
		{map[string]string{AnnotationAction: "defr"}, "want drain, defer or ignore", func(p Policy) bool { return p.Default == ActionDefer && p.Invalid(AnnotationAction) }},
		{map[string]string{ActionKey(event.KindRebalance): "DRAIN"}, "want drain", func(p Policy) bool {
			a, _ := p.ActionFor(event.Event{Kind: event.KindRebalance})
			return a == ActionIgnore
		}},
		{map[string]string{ScheduledActionKey(event.ScheduledSystemReboot): "skip"}, "want drain", func(p Policy) bool { return p.Scheduled[event.ScheduledSystemReboot] == ActionDefer }},
		{map[string]string{AnnotationMaxConcurrentDrains: "-1"}, "whole number", func(p Policy) bool { return p.MaxConcurrentDrains.String() == "1" }},
		{map[string]string{AnnotationMaxConcurrentDrains: "lots"}, "percentage", func(p Policy) bool { return p.MaxConcurrentDrains.String() == "1" }},
		{map[string]string{AnnotationMaxConcurrentDrains: "150%"}, "percentage", func(p Policy) bool { return p.MaxConcurrentDrains.String() == "1" }},
		{map[string]string{AnnotationTaintUpcoming: "yes please"}, "want true or false", func(p Policy) bool { return !p.TaintUpcoming }},
		{map[string]string{AnnotationDrainLead: "1 hour"}, "duration", func(p Policy) bool { return p.DrainLead == DefaultDrainLead }},
		{map[string]string{AnnotationRestartGrace: "-5m"}, "negative", func(p Policy) bool { return p.RestartGrace == DefaultRestartGrace }},
		// A valid schedule is kept with a one-hour window; no window comes of an invalid one.
		{map[string]string{AnnotationWindowSchedule: "0 2 * * 6"}, "window-duration=\"\" ignored: not set", func(p Policy) bool { return p.Window.Duration == FallbackWindowDuration }},
		{map[string]string{AnnotationWindowDuration: "4h"}, "without " + AnnotationWindowSchedule, func(p Policy) bool { return p.Window == nil }},
		{map[string]string{AnnotationWindowSchedule: "every saturday", AnnotationWindowDuration: "4h"}, "every saturday", func(p Policy) bool { return p.Window == nil }},
		{map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "0s"}, "positive duration", func(p Policy) bool { return p.Window.Duration == FallbackWindowDuration }},
		{map[string]string{AnnotationWindowSchedule: "CRON_TZ=Mars/Olympus 0 2 * * 6", AnnotationWindowDuration: "1h"}, "Mars/Olympus", func(p Policy) bool { return p.Window == nil }},
		{map[string]string{Prefix + "acton": "ignore"}, "unknown annotation", func(p Policy) bool { return p.Default == "" }},
		{map[string]string{ActionKey("spot"): "ignore"}, "unknown annotation", func(p Policy) bool { return p.Kinds == nil }},
		{map[string]string{AnnotationReschedule: "yes please", AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"}, "want true or false", func(p Policy) bool { return !p.Reschedule && p.Window != nil }},
		{map[string]string{AnnotationReschedule: "true"}, "no valid maintenance window", func(p Policy) bool { return !p.Reschedule }},
	}
	for _, tt := range tests {
		p := FromAnnotations(tt.ann)
		if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], tt.want) {
			t.Errorf("%v: problems %q, want one mentioning %q", tt.ann, p.Problems, tt.want)
		}
		if !tt.check(p) {
			t.Errorf("%v: invalid value was not ignored: %+v", tt.ann, p)
		}
	}
}

// TestReschedule: healthrouter.io/reschedule is off by default and takes effect only with a
// maintenance window to move events into.
func TestReschedule(t *testing.T) {
	window := map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range window {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name     string
		ann      map[string]string
		want     bool
		problems []string // each a substring of one problem, in order
	}{
		{"unset", window, false, nil},
		{"true", with(AnnotationReschedule, "true"), true, nil},
		{"spaces around", with(AnnotationReschedule, " true "), true, nil},
		{"1", with(AnnotationReschedule, "1"), true, nil},
		{"false", with(AnnotationReschedule, "false"), false, nil},
		{"invalid", with(AnnotationReschedule, "always"), false, []string{AnnotationReschedule + `="always" ignored: want true or false`}},
		{"empty", with(AnnotationReschedule, ""), false, []string{"want true or false"}},
		{"no window", map[string]string{AnnotationReschedule: "true"}, false, []string{AnnotationReschedule + `="true" ignored: the pool has no valid maintenance window`}},
		{"no window, off", map[string]string{AnnotationReschedule: "false"}, false, nil},
		{"invalid window", with(AnnotationReschedule, "true", AnnotationWindowSchedule, "saturdays"), false,
			[]string{"maintenance window ignored", AnnotationReschedule + `="true" ignored`}},
		// The fallback window is not one the owner set: no AWS event is moved into it.
		{"invalid window duration", with(AnnotationReschedule, "true", AnnotationWindowDuration, "forever"), false,
			[]string{AnnotationWindowDuration + `="forever" ignored`, AnnotationReschedule + `="true" ignored`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := FromAnnotations(tt.ann)
			if p.Reschedule != tt.want {
				t.Errorf("Reschedule = %v, want %v", p.Reschedule, tt.want)
			}
			if len(p.Problems) != len(tt.problems) {
				t.Fatalf("problems %q, want %d", p.Problems, len(tt.problems))
			}
			for i, want := range tt.problems {
				if !strings.Contains(p.Problems[i], want) {
					t.Errorf("problem %d %q, want it to mention %q", i, p.Problems[i], want)
				}
			}
		})
	}
	if !slices.Contains(Annotations(), AnnotationReschedule) {
		t.Error("Annotations() must list " + AnnotationReschedule)
	}
}

func TestWindow(t *testing.T) {
	utc := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	tests := []struct {
		name, schedule, duration string
		now                      string
		open                     bool
		next                     string
	}{
		// Saturday 2026-11-21; the window is Saturdays 02:00-06:00 UTC.
		{"inside", "0 2 * * 6", "4h", "2026-11-21T03:00:00Z", true, "2026-11-28T02:00:00Z"},
		{"at start", "0 2 * * 6", "4h", "2026-11-21T02:00:00Z", true, "2026-11-28T02:00:00Z"},
		{"at end is closed", "0 2 * * 6", "4h", "2026-11-21T06:00:00Z", false, "2026-11-28T02:00:00Z"},
		{"before", "0 2 * * 6", "4h", "2026-11-21T01:59:00Z", false, "2026-11-21T02:00:00Z"},
		// 22:00 for 4h crosses midnight: open at 01:00 the next day.
		{"crosses midnight", "0 22 * * *", "4h", "2026-11-22T01:00:00Z", true, "2026-11-22T22:00:00Z"},
		{"after midnight end", "0 22 * * *", "4h", "2026-11-22T02:30:00Z", false, "2026-11-22T22:00:00Z"},
		// 02:00 in Berlin is 01:00 UTC in November (CET, UTC+1).
		{"time zone", "CRON_TZ=Europe/Berlin 0 2 * * *", "1h", "2026-11-21T01:30:00Z", true, "2026-11-22T01:00:00Z"},
		{"time zone closed", "CRON_TZ=Europe/Berlin 0 2 * * *", "1h", "2026-11-21T02:30:00Z", false, "2026-11-22T01:00:00Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := NewWindow(tt.schedule, tt.duration)
			if err != nil {
				t.Fatal(err)
			}
			now := utc(tt.now)
			if got := w.Open(now); got != tt.open {
				t.Errorf("Open(%s) = %v", tt.now, got)
			}
			if got := w.Next(now); !got.Equal(utc(tt.next)) {
				t.Errorf("Next(%s) = %s, want %s", tt.now, got, tt.next)
			}
		})
	}
}

func TestActionForPrecedence(t *testing.T) {
	reboot := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{Scheduled: event.ScheduledInstanceReboot}}
	retire := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{Scheduled: event.ScheduledInstanceRetirement}}
	unmapped := event.Event{Kind: event.KindScheduledChange, Health: &event.Health{TypeCode: "AWS_EC2_SOMETHING_NEW"}}
	rebalance := event.Event{Kind: event.KindRebalance}
	p := FromAnnotations(map[string]string{
		AnnotationAction:                                  "defer",
		ActionKey(event.KindScheduledChange):              "drain",
		ScheduledActionKey(event.ScheduledInstanceReboot): "ignore",
	})
	for _, tt := range []struct {
		p    Policy
		ev   event.Event
		want Action
		key  string
	}{
		{p, reboot, ActionIgnore, ScheduledActionKey(event.ScheduledInstanceReboot)},
		{p, retire, ActionDrain, ActionKey(event.KindScheduledChange)},
		{p, unmapped, ActionDrain, ActionKey(event.KindScheduledChange)},
		{p, rebalance, ActionDefer, AnnotationAction},
		{Policy{}, rebalance, ActionIgnore, ""},
		{Policy{}, retire, ActionDrain, ""},
	} {
		got, key := tt.p.ActionFor(tt.ev)
		if got != tt.want || key != tt.key {
			t.Errorf("%s/%v: %s from %q, want %s from %q", tt.ev.Kind, tt.ev.Health, got, key, tt.want, tt.key)
		}
	}
}

// TestEventWindow: healthrouter.io/event-window is off by default, an invalid value is a
// problem and no EC2 window (AWS keeps its own timing), and it takes effect only with a
// maintenance window the owner set in full.
func TestEventWindow(t *testing.T) {
	window := map[string]string{AnnotationWindowSchedule: "0 2 * * 6", AnnotationWindowDuration: "4h"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(window)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name     string
		ann      map[string]string
		want     bool
		problems []string // each a substring of one problem, in order
	}{
		{"unset", window, false, nil},
		{"true", with(AnnotationEventWindow, "true"), true, nil},
		{"spaces around", with(AnnotationEventWindow, " true "), true, nil},
		{"false", with(AnnotationEventWindow, "false"), false, nil},
		{"invalid", with(AnnotationEventWindow, "yes"), false, []string{AnnotationEventWindow + `="yes" ignored: want true or false; no EC2 event window`}},
		{"no window", map[string]string{AnnotationEventWindow: "true"}, false, []string{AnnotationEventWindow + `="true" ignored: the pool has no valid maintenance window`}},
		{"no window, off", map[string]string{AnnotationEventWindow: "false"}, false, nil},
		{"invalid window", with(AnnotationEventWindow, "true", AnnotationWindowSchedule, "saturdays"), false,
			[]string{"maintenance window ignored", AnnotationEventWindow + `="true" ignored`}},
		// The fallback window is not one the owner set: it is not handed to AWS.
		{"invalid window duration", with(AnnotationEventWindow, "true", AnnotationWindowDuration, "forever"), false,
			[]string{AnnotationWindowDuration + `="forever" ignored`, AnnotationEventWindow + `="true" ignored`}},
		// Whether EC2 can express the window is not the parser's to say (the manager and doctor
		// say it): a daylight-saving zone is a valid window.
		{"a window EC2 cannot express", with(AnnotationEventWindow, "true", AnnotationWindowSchedule, "CRON_TZ=Europe/Paris 0 2 * * 6"), true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := FromAnnotations(tt.ann)
			if p.EventWindow != tt.want {
				t.Errorf("EventWindow = %v, want %v", p.EventWindow, tt.want)
			}
			if len(p.Problems) != len(tt.problems) {
				t.Fatalf("problems %q, want %d", p.Problems, len(tt.problems))
			}
			for i, want := range tt.problems {
				if !strings.Contains(p.Problems[i], want) {
					t.Errorf("problem %d %q, want it to mention %q", i, p.Problems[i], want)
				}
			}
		})
	}
}
