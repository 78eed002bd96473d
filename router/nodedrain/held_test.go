package nodedrain

import (
	"testing"
	"time"
)

// reboot is a drain's report of a system reboot starting at start (Health's key arn, EC2's
// otherwise), released two hours after it.
func reboot(id, key string, start, at time.Time) Drain {
	return Drain{EventID: id, Key: key, Match: "system-reboot@" + start.Format(time.RFC3339), Kind: scheduledChangeKind, EventTime: at, Release: start.Add(2 * time.Hour)}
}

func TestHold(t *testing.T) {
	start := t0.Add(5 * time.Hour)
	own := reboot("ev-1", "arn:reboot", start, t0)
	begun := Record{EventID: own.EventID, Key: own.Key, Match: own.Match, Kind: own.Kind, EventTime: own.EventTime, Release: own.Release, Started: t0}
	later := start.Add(72 * time.Hour)
	retire := Drain{EventID: "ev-r", Key: "arn:retire", Match: "instance-retirement@" + later.Format(time.RFC3339), Kind: scheduledChangeKind, EventTime: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name        string
		rec         Record
		dr          Drain
		changed     bool
		wantEvent   string
		wantAlso    []string
		wantRelease time.Time // ReleaseAt; zero: none (held until the instance goes)
	}{
		{"a redelivery", begun, own, false, "ev-1", nil, start.Add(2 * time.Hour)},
		{"the same maintenance from EC2", begun, reboot("poll-1", "i-1/instance-event-0", start, t0.Add(time.Minute)), false, "ev-1", nil, start.Add(2 * time.Hour)},
		{"postponed: a newer report of the event", begun, reboot("ev-2", "arn:reboot", later, t0.Add(time.Minute)), true, "ev-2", nil, later.Add(2 * time.Hour)},
		{"brought forward: a newer report of the event", begun, reboot("ev-2", "arn:reboot", t0.Add(90*time.Minute), t0.Add(time.Minute)), true, "ev-2", nil, t0.Add(210 * time.Minute)},
		{"an older report of the event", begun, reboot("ev-0", "arn:reboot", later, t0.Add(-time.Minute)), false, "ev-1", nil, start.Add(2 * time.Hour)},
		{"rescheduled, seen first by EC2", begun, reboot("poll-2", "i-1/instance-event-0", later, t0.Add(time.Minute)), true, "poll-2", nil, later.Add(2 * time.Hour)},
		{"a second maintenance", begun, retire, true, "ev-1", []string{"ev-r"}, time.Time{}},
		{"a Spot warning: no maintenance", begun, Drain{EventID: "spot-1", Kind: "spot-interruption", EventTime: t0.Add(time.Minute)}, false, "ev-1", nil, start.Add(2 * time.Hour)},
		{"a maintenance beside a stop drain", Record{EventID: "stop-1", Kind: stateChangeKind, EventTime: t0}, own, true, "stop-1", []string{"ev-1"}, time.Time{}},
		{"a held maintenance postponed",
			Record{EventID: "stop-1", Kind: stateChangeKind, EventTime: t0, Also: []Held{{EventID: "ev-1", Key: "arn:reboot", Match: own.Match, EventTime: t0, Release: own.Release}}},
			reboot("ev-2", "arn:reboot", later, t0.Add(time.Minute)), true, "stop-1", []string{"ev-2"}, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tc.rec
			rec.Also = append([]Held(nil), tc.rec.Also...)
			if got := rec.hold(tc.dr); got != tc.changed {
				t.Errorf("changed = %v, want %v", got, tc.changed)
			}
			if rec.EventID != tc.wantEvent {
				t.Errorf("drain for %s, want %s", rec.EventID, tc.wantEvent)
			}
			var also []string
			for _, a := range rec.Also {
				also = append(also, a.EventID)
			}
			if len(also) != len(tc.wantAlso) || (len(also) > 0 && also[0] != tc.wantAlso[0]) {
				t.Errorf("also %v, want %v", also, tc.wantAlso)
			}
			at, ok := rec.ReleaseAt()
			if ok != !tc.wantRelease.IsZero() || !at.Equal(tc.wantRelease) {
				t.Errorf("ReleaseAt = %v, %v; want %v", at, ok, tc.wantRelease)
			}
		})
	}
}

func TestCloses(t *testing.T) {
	first, second := t0.Add(5*time.Hour), t0.Add(48*time.Hour)
	a, b := reboot("ev-a", "arn:a", first, t0), reboot("ev-b", "arn:b", second, t0)
	b.Match = "system-maintenance@" + second.Format(time.RFC3339)
	held := Record{EventID: a.EventID, Key: a.Key, Match: a.Match, Kind: a.Kind, EventTime: a.EventTime, Release: a.Release, Cordoned: true,
		Also: []Held{{EventID: b.EventID, Key: b.Key, Match: b.Match, EventTime: b.EventTime, Release: b.Release}}}
	alone := held
	alone.Also = nil
	for _, tc := range []struct {
		name      string
		rec       Record
		close     Drain
		end       bool
		wantEvent string
		wantAlso  int
		release   time.Time
	}{
		{"its own event, nothing else held", alone, Drain{EventID: "x", Key: "arn:a"}, true, "ev-a", 0, a.Release},
		{"its own maintenance from EC2", alone, Drain{EventID: "x", Key: "i-1/instance-event-0", Match: a.Match}, true, "ev-a", 0, a.Release},
		{"its own event, another held: handed on", held, Drain{EventID: "x", Key: "arn:a"}, false, "ev-b", 0, b.Release},
		{"the held one: dropped", held, Drain{EventID: "x", Key: "arn:b"}, false, "ev-a", 0, a.Release},
		{"another event: nothing", held, Drain{EventID: "x", Key: "arn:c", Match: "system-reboot@2027-01-01T00:00:00Z"}, false, "ev-a", 1, b.Release},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, end := tc.rec.closes(tc.close)
			if end != tc.end {
				t.Fatalf("end = %v, want %v", end, tc.end)
			}
			if end {
				return
			}
			if next.EventID != tc.wantEvent || len(next.Also) != tc.wantAlso || !next.Cordoned {
				t.Errorf("next: %s, also %d, cordoned %v; want %s, also %d, cordoned", next.EventID, len(next.Also), next.Cordoned, tc.wantEvent, tc.wantAlso)
			}
			if at, ok := next.ReleaseAt(); !ok || !at.Equal(tc.release) {
				t.Errorf("ReleaseAt = %v, %v; want %v", at, ok, tc.release)
			}
		})
	}
	if len(held.Also) != 1 || held.Also[0].EventID != "ev-b" {
		t.Errorf("closes changed the record it was given: %+v", held.Also)
	}
}

func TestCarry(t *testing.T) {
	first, later := t0.Add(5*time.Hour), t0.Add(72*time.Hour)
	prevDone := t0.Add(time.Minute)
	prev := Record{EventID: "ev-1", Key: "arn:reboot", Match: "system-reboot@" + first.Format(time.RFC3339), Kind: scheduledChangeKind, EventTime: t0.Add(time.Hour),
		Release: first.Add(2 * time.Hour), Done: &prevDone}
	for _, tc := range []struct {
		name      string
		dr        Drain
		wantEvent string
		wantAlso  int
	}{
		{"a Spot warning: the reboot still held", Drain{EventID: "spot-1", Kind: "spot-interruption", EventTime: t0.Add(2 * time.Hour)}, "spot-1", 1},
		{"EC2's newer report of the reboot, moved", reboot("poll-1", "i-1/instance-event-0", later, t0.Add(2*time.Hour)), "poll-1", 0},
		{"EC2's older report, from before the move", reboot("poll-0", "i-1/instance-event-0", later, t0), "ev-1", 0},
		{"another maintenance: both held", Drain{EventID: "ev-m", Key: "arn:m", Match: "system-maintenance@" + later.Format(time.RFC3339), Kind: scheduledChangeKind, EventTime: t0.Add(2 * time.Hour)}, "ev-m", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := Record{EventID: tc.dr.EventID, Key: tc.dr.Key, Match: tc.dr.Match, Kind: tc.dr.Kind, EventTime: tc.dr.EventTime, Release: tc.dr.Release}
			carry(&rec, prev)
			if rec.EventID != tc.wantEvent || len(rec.Also) != tc.wantAlso {
				t.Errorf("drain for %s with %d held; want %s with %d", rec.EventID, len(rec.Also), tc.wantEvent, tc.wantAlso)
			}
		})
	}
}

func TestHandOn(t *testing.T) {
	stop := Record{EventID: "stop-1", Kind: stateChangeKind, RunningSince: t0, Warned: true, Cordoned: true}
	if _, ok := stop.handOn(); ok {
		t.Error("a drain holding nothing else handed on")
	}
	stop.Also = []Held{{EventID: "ev-1", Key: "arn:reboot", Match: "system-reboot@2026-03-02T00:00:00Z", Release: t0.Add(48 * time.Hour)}, {EventID: "ev-2", Match: "instance-retirement@2026-03-09T00:00:00Z"}}
	next, ok := stop.handOn()
	if !ok || next.EventID != "ev-1" || next.Kind != scheduledChangeKind || len(next.Also) != 1 || !next.Cordoned || next.Warned || !next.RunningSince.Equal(t0) {
		t.Errorf("handOn = %+v, %v", next, ok)
	}
	if len(stop.Also) != 2 {
		t.Error("handOn changed the record it was given")
	}
	if _, ok := next.ReleaseAt(); ok {
		t.Error("a held retirement released the drain")
	}
}
