package record

import "slices"

// The records' state machine. A record is one event held for one NodeClaim; every change of
// its State is one of Transitions, made by one of the Set's operations (the Op), and no other
// code writes State. The pacer, the marks, the watchdog and the calendar read the phase the
// records give (Summarize), never a record's internals. An ended record (any State but
// StateDeferred) never becomes active again: it stays, to recognise a late duplicate of its
// event, until Prune removes it.

// Ops of the Set, the only writers of a record's State.
const (
	OpPut     = "put"      // Set.Put: a deferral decided (again)
	OpCancel  = "cancel"   // Set.Cancel: a close, a running instance, a recovery, or a policy that now ignores the event
	OpDrained = "drained"  // Set.Drained: the node is drained for an event
	OpInPlace = "in-place" // Set.InPlace: the event is handed to a reboot in place
	OpRemove  = "remove"   // Set.Remove: a record removed by its event (carried out, or adopted again)
	OpPrune   = "prune"    // Set.Prune: an ended record whose time has passed
	OpTrim    = "trim"     // Trim, at every write: past EndedKept ended records, the oldest
)

// StateNone is "no record" in a Transition: before a record is written, after it is removed.
const StateNone = ""

// Transition is one change of a record's State, From to To, by Op, and why.
type Transition struct {
	Op, From, To, Why string
}

// ended are the States of a record that no longer waits.
var ended = []string{StateCancelled, StateSuperseded, StateDrained, StateInPlace, StateClosed}

// Transitions is every change of a record's State the Set makes: the records' state machine.
// Docs and tests read it; TestTransitions holds the Set to it.
var Transitions = func() []Transition {
	ts := []Transition{
		{OpPut, StateNone, StateDeferred, "an event deferred: it waits for its time, its window or a hold"},
		{OpPut, StateDeferred, StateDeferred, "the deferral decided again: a new time, hold or reason"},
		{OpPut, StateDeferred, StateSuperseded, "a newer update of the same event, or the same maintenance at another time, replaces it"},
		{OpCancel, StateDeferred, StateNone, "its pool's policy now ignores the event: the deferral goes"},
		{OpCancel, StateDeferred, StateCancelled, "a closed maintenance, a running instance or a recovered one ends it"},
		{OpCancel, StateNone, StateClosed, "a closing report applied: kept so that a late or repeated report cannot cancel what came after it"},
		{OpCancel, StateDeferred, StateClosed, "a closing report under the deferral's own event ID: the deferral goes, the close is kept"},
		{OpDrained, StateDeferred, StateDrained, "the node is drained for another event: nothing it held waits any more"},
		{OpInPlace, StateDeferred, StateInPlace, "the event is carried out by a reboot in place (the run is its own, router/inplace)"},
	}
	for _, s := range append([]string{StateDeferred}, ended...) {
		ts = append(ts,
			Transition{OpDrained, s, StateNone, "the drained event's own records are carried out"},
			Transition{OpRemove, s, StateNone, "removed by its event"})
	}
	for _, s := range ended {
		ts = append(ts,
			Transition{OpPrune, s, StateNone, "its until-time and its maintenance's time have passed"},
			Transition{OpTrim, s, StateNone, "more ended records than EndedKept: the oldest go"})
	}
	return ts
}()

// Allowed reports whether op may change a record from from to to. The same State is no
// change of State, and allowed (Put's deferral decided again is in Transitions, for the docs).
func Allowed(op, from, to string) bool {
	if from == to {
		return true
	}
	return slices.ContainsFunc(Transitions, func(t Transition) bool { return t.Op == op && t.From == from && t.To == to })
}
