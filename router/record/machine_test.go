package record

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/health-router/health-router/router/event"
)

// states returns each record's State by event ID.
func states(s Set) map[string]string {
	out := map[string]string{}
	for _, r := range s.Records {
		out[r.EventID] = r.State
	}
	return out
}

// moves returns the changes of State from before to after, by event ID.
func moves(op string, before, after map[string]string) []Transition {
	var out []Transition
	for id, from := range before {
		if to, ok := after[id]; !ok {
			out = append(out, Transition{Op: op, From: from, To: StateNone, Why: id})
		} else if to != from {
			out = append(out, Transition{Op: op, From: from, To: to, Why: id})
		}
	}
	for id, to := range after {
		if _, ok := before[id]; !ok {
			out = append(out, Transition{Op: op, From: StateNone, To: to, Why: id})
		}
	}
	return out
}

// rec is ev's deferral.
func rec(ev event.Event) Record {
	return Record{EventID: ev.ID, Key: Key(ev), Kind: ev.Kind, State: StateDeferred, Match: Match(ev), Until: ev.Deadline}
}

func deferredRecord(id, key string) Record {
	return Record{EventID: id, Key: key, Kind: event.KindScheduledChange, State: StateDeferred, Until: t0.Add(time.Hour), Match: "system-reboot@" + t0.Add(72*time.Hour).Format(time.RFC3339)}
}

func endedRecord(id, state string) Record {
	r := deferredRecord(id, id)
	r.State, r.Until = state, t0
	return r
}

// TestTransitions drives each transition of the records' state machine by the operation that
// makes it, and checks that every row of Transitions is driven here.
func TestTransitions(t *testing.T) {
	week := t0.Add(7 * 24 * time.Hour)
	closed := health("h-closed", "arn:health/1", event.ScheduledSystemReboot, week, event.HealthClosed)
	upcoming := health("h-1", "arn:health/1", event.ScheduledSystemReboot, week, event.HealthUpcoming)
	type row struct {
		name   string
		before []Record
		op     string
		apply  func(*Set)
		want   []Transition // From, To (Why: the event ID)
	}
	rows := []row{
		{"a deferral", nil, OpPut, func(s *Set) { s.Put(rec(upcoming)) }, []Transition{{From: StateNone, To: StateDeferred, Why: "h-1"}}},
		{"a deferral decided again keeps its state", []Record{rec(upcoming)}, OpPut, func(s *Set) {
			r := rec(upcoming)
			r.Until = week
			s.Put(r)
		}, nil},
		{"a newer update supersedes", []Record{deferredRecord("old", "k")}, OpPut, func(s *Set) { s.Put(deferredRecord("new", "k")) },
			[]Transition{{From: StateDeferred, To: StateSuperseded, Why: "old"}, {From: StateNone, To: StateDeferred, Why: "new"}}},
		{"an ended record is never put back", []Record{endedRecord("e", StateCancelled)}, OpPut, func(s *Set) { s.Put(deferredRecord("e", "e")) }, nil},
		{"an ended record is not put", nil, OpPut, func(s *Set) { s.Put(endedRecord("x", StateCancelled)) }, nil},
		{"a policy that now ignores the event", []Record{deferredRecord("e", "e")}, OpCancel, func(s *Set) { s.Cancel(event.Event{ID: "e", Kind: event.KindScheduledChange}, false) },
			[]Transition{{From: StateDeferred, To: StateNone, Why: "e"}}},
		{"a close cancels, and is kept", []Record{rec(upcoming)}, OpCancel, func(s *Set) { s.Cancel(closed, true) },
			[]Transition{{From: StateDeferred, To: StateCancelled, Why: "h-1"}, {From: StateNone, To: StateClosed, Why: "h-closed"}}},
		{"a close under the deferral's own ID", []Record{deferredRecord("h-closed", "arn:health/1")}, OpCancel, func(s *Set) { s.Cancel(closed, true) },
			[]Transition{{From: StateDeferred, To: StateClosed, Why: "h-closed"}}},
		{"a drain ends what waited and carries out its own", []Record{deferredRecord("other", "o"), deferredRecord("own", "k"), endedRecord("c", StateCancelled)}, OpDrained,
			func(s *Set) { s.Drained("own", "k") },
			[]Transition{{From: StateDeferred, To: StateDrained, Why: "other"}, {From: StateDeferred, To: StateNone, Why: "own"}}},
		{"a reboot in place", []Record{deferredRecord("r", "r")}, OpInPlace, func(s *Set) { s.InPlace("r", "r") }, []Transition{{From: StateDeferred, To: StateInPlace, Why: "r"}}},
	}
	for _, st := range append([]string{StateDeferred}, ended...) {
		rows = append(rows,
			row{"a drain carries out its own " + st + " record", []Record{endedRecordOr(st)}, OpDrained, func(s *Set) { s.Drained("x", "x") }, []Transition{{From: st, To: StateNone, Why: "x"}}},
			row{"remove a " + st + " record", []Record{endedRecordOr(st)}, OpRemove, func(s *Set) { s.Remove("x") }, []Transition{{From: st, To: StateNone, Why: "x"}}})
	}
	for _, st := range ended {
		rows = append(rows,
			row{"prune a " + st + " record past its time", []Record{endedRecord("x", st)}, OpPrune, func(s *Set) { s.Prune(t0.Add(time.Hour * 100)) }, []Transition{{From: st, To: StateNone, Why: "x"}}},
			row{"a deferral is not pruned, a " + st + " record not before its time", []Record{deferredRecord("d", "d"), endedRecord("x", st)}, OpPrune, func(s *Set) { s.Prune(t0) }, nil},
			row{"trim the oldest " + st + " record", trimmable(st), OpTrim, func(s *Set) { s.Records = Trim(s.Records) }, []Transition{{From: st, To: StateNone, Why: "ended-0"}}})
	}
	driven := map[Transition]bool{}
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			s := Set{Records: slices.Clone(tt.before)}
			before := states(s)
			tt.apply(&s)
			got := moves(tt.op, before, states(s))
			want := tt.want
			for i := range want {
				want[i].Op = tt.op
			}
			less := func(a, b Transition) int { return compareTransitions(a, b) }
			slices.SortFunc(got, less)
			slices.SortFunc(want, less)
			if !slices.Equal(got, want) {
				t.Errorf("transitions %+v, want %+v", got, want)
			}
			for _, m := range got {
				if !Allowed(m.Op, m.From, m.To) {
					t.Errorf("%s %s -> %s is not in Transitions", m.Op, m.From, m.To)
				}
				driven[Transition{Op: m.Op, From: m.From, To: m.To}] = true
			}
		})
	}
	for _, tr := range Transitions {
		if tr.From != tr.To && !driven[Transition{Op: tr.Op, From: tr.From, To: tr.To}] {
			t.Errorf("no row drives %s %q -> %q (%s)", tr.Op, tr.From, tr.To, tr.Why)
		}
	}
}

func compareTransitions(a, b Transition) int {
	return slices.Compare([]string{a.Op, a.From, a.To, a.Why}, []string{b.Op, b.From, b.To, b.Why})
}

// endedRecordOr is the record "x" in state st (active when st is StateDeferred).
func endedRecordOr(st string) Record {
	if st == StateDeferred {
		return deferredRecord("x", "x")
	}
	return endedRecord("x", st)
}

// trimmable is EndedKept+1 ended records of state st, the oldest first ("ended-0").
func trimmable(st string) []Record {
	var rs []Record
	for i := range EndedKept + 1 {
		rs = append(rs, endedRecord(fmt.Sprintf("ended-%d", i), st))
	}
	return rs
}

// TestMachineProperty: whatever the Set's operations are given, in any order, on any records,
// every change of a record's State is one of Transitions, and an ended record never waits again.
func TestMachineProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ids := []string{"a", "b", "c", "d"}
		keys := []string{"k1", "k2"}
		matches := []string{"system-reboot@" + t0.Format(time.RFC3339), "system-reboot@" + t0.Add(time.Hour).Format(time.RFC3339), "instance-stop@" + t0.Format(time.RFC3339)}
		kinds := []event.Kind{event.KindScheduledChange, event.KindStateChange, event.KindInstanceStatus, event.KindSpotInterruption}
		genRecord := func(t *rapid.T, id string, state string) Record {
			return Record{EventID: id, Key: rapid.SampledFrom(keys).Draw(t, "key"), Kind: rapid.SampledFrom(kinds).Draw(t, "kind"), State: state,
				Match: rapid.SampledFrom(matches).Draw(t, "match"), Until: t0.Add(time.Duration(rapid.IntRange(0, 4).Draw(t, "until")) * time.Hour)}
		}
		var s Set
		for _, id := range ids {
			if rapid.Bool().Draw(t, "has "+id) {
				s.Records = append(s.Records, genRecord(t, id, rapid.SampledFrom(append([]string{StateDeferred}, ended...)).Draw(t, "state")))
			}
		}
		for range rapid.IntRange(1, 12).Draw(t, "ops") {
			before := states(s)
			op := rapid.SampledFrom([]string{OpPut, OpCancel, OpDrained, OpInPlace, OpRemove, OpPrune, OpTrim}).Draw(t, "op")
			id := rapid.SampledFrom(append(ids, "e")).Draw(t, "id")
			switch op {
			case OpPut:
				s.Put(genRecord(t, id, StateDeferred))
			case OpCancel:
				ev := event.Event{ID: id, Kind: rapid.SampledFrom(kinds).Draw(t, "event kind"), Time: t0}
				if rapid.Bool().Draw(t, "a close") {
					ev = health(id, rapid.SampledFrom(keys).Draw(t, "arn"), event.ScheduledSystemReboot, t0, event.HealthClosed)
				} else if ev.Kind == event.KindStateChange {
					ev.State = event.StateRunning
				}
				s.Cancel(ev, rapid.Bool().Draw(t, "cancel"))
			case OpDrained:
				s.Drained(id, rapid.SampledFrom(keys).Draw(t, "key"))
			case OpInPlace:
				s.InPlace(id, rapid.SampledFrom(keys).Draw(t, "key"))
			case OpRemove:
				s.Remove(id)
			case OpPrune:
				s.Prune(t0.Add(time.Duration(rapid.IntRange(0, 6).Draw(t, "now")) * time.Hour))
			case OpTrim:
				s.Records = Trim(s.Records)
			}
			for _, m := range moves(op, before, states(s)) {
				if !Allowed(m.Op, m.From, m.To) {
					t.Fatalf("%s of %s: %q -> %q is not in Transitions", m.Op, m.Why, m.From, m.To)
				}
			}
		}
	})
}
