// Package record is the router's memory of each instance, kept on its NodeClaim in the
// healthrouter.io/deferred annotation: what was deferred and until when, what ended it
// (cancelled, superseded, drained), and when the instance was last seen running. Every source
// (the SQS intake, the instance-status poller, deferrals coming due) reads and writes it
// through this package, so the seams between them live in one place:
//
//   - Key: one event across its updates (an AWS Health eventArn; EC2's instance-event ID
//     for the poller's findings, which keeps its ID when EC2 reschedules it);
//   - Match: one scheduled maintenance across its sources (instance, scheduled type and
//     not-before), so that AWS Health and the poller decide it once;
//   - Supersede and Cancel: an update, a reschedule seen by either source, a closed or
//     cancelled maintenance ends the records of the same maintenance whichever source wrote them;
//   - Version: the annotation is versioned; a value this router cannot read (a newer
//     replica's during a rolling upgrade, or a damaged one) is kept as it is, never erased.
package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// Annotation held a NodeClaim's records before the store (HealthRecord): the router no
// longer reads it as its memory; it is only removed (router/app's cleanup of the old keys).
const Annotation = "healthrouter.io/deferred"

// Version is the record format this router writes. Version 1 is the bare JSON list of
// records that routers before it wrote; it is read, and rewritten as Version on the next write.
const Version = 2

// States of a record.
const (
	StateDeferred   = "deferred"
	StateCancelled  = "cancelled"  // a running instance, or a closed or cancelled maintenance, ended it
	StateSuperseded = "superseded" // a newer update or a reschedule of the same maintenance replaced it
	StateDrained    = "drained"    // the node is being drained for another event
	// StateInPlace: the event is being carried out by keeping the node through the reboot
	// (router/inplace holds the run, on its own annotation).
	StateInPlace = "in-place"
	// StateClosed marks a closing report (a closed Health event, a [Canceled] or [Completed]
	// poller finding) as applied: the poller reports it again after a restart, and the second
	// report must not cancel what was recorded after the first.
	StateClosed = "closed"
)

// Bounds of what one NodeClaim keeps.
const (
	// EndedKept is how many ended records are kept (newest first) to recognise a late
	// duplicate of their event; older ones go. Ended records keep no event body.
	EndedKept = 16
	// MaxBytes bounds the annotation's value: Kubernetes refuses all of an object's
	// annotations past 256 KiB, and a write refused for size would fail every retry.
	MaxBytes = 64 << 10
)

// Record is one event deferred for one instance. It holds the event itself (restricted to the
// instance), so the router decides it again at Until (or when its Hold ends) with nothing kept
// elsewhere.
type Record struct {
	EventID string     `json:"event_id"`
	Key     string     `json:"key"` // see Key
	Kind    event.Kind `json:"kind"`
	Until   time.Time  `json:"until"`
	Reason  string     `json:"reason"`
	State   string     `json:"state"`
	// Hold is what the record waits for; Image the image a check hold waits on, PDBs the
	// PodDisruptionBudgets ("namespace/name") a pdb hold waits on.
	Hold  policy.Hold `json:"hold,omitempty"`
	Image string      `json:"image,omitempty"`
	PDBs  []string    `json:"pdbs,omitempty"`
	// Match identifies a scheduled maintenance whichever source reported it; see Match.
	Match string `json:"match,omitempty"`
	// EventTime is when the event happened (EventBridge's time): it orders state changes
	// that arrive out of order.
	EventTime time.Time `json:"event_time,omitzero"`
	// Event is the event's body restricted to this instance, as forwarded to Karpenter.
	Event json.RawMessage `json:"event,omitempty"`
	// Communication is the AWS Health communication the record was decided from (see
	// Communication): another copy of it is the same decision.
	Communication string `json:"communication,omitempty"`
	// MovedFrom is the start the maintenance was reported at before it moved (event.Event's
	// MovedFrom: the router moved it into the window): a report of that start, sent before
	// the move, is this maintenance (Recorded).
	MovedFrom time.Time `json:"moved_from,omitzero"`
	// Start is AWS's start of the event (its not-before), when it has one: shown by
	// `kubectl get healthrecords`.
	Start time.Time `json:"start,omitzero"`
}

// Active reports whether the record still waits.
func (r Record) Active() bool { return r.State == StateDeferred }

// Set is a NodeClaim's records as read from its annotation.
type Set struct {
	Records []Record `json:"records"`
	// Running is the time of the latest `running` state change handled for the instance: a
	// stop that happened before it is over, whenever its event arrives.
	Running time.Time `json:"running,omitzero"`
}

// envelope is the annotation's encoding from Version 2 on.
type envelope struct {
	Version int       `json:"version"`
	Records []Record  `json:"records,omitempty"`
	Running time.Time `json:"running,omitzero"`
}

// ErrUnreadable marks an annotation this router cannot read: written by a newer router
// (an unknown version) or damaged. It is kept as it is; writes that must change it fail.
var ErrUnreadable = errors.New("records this router cannot read")

// ErrTooLarge marks a write that would exceed MaxBytes: retrying cannot help.
var ErrTooLarge = errors.New("records would exceed their size bound")

// Decode reads an annotation value; "" is an empty Set. An error wraps ErrUnreadable.
func Decode(v string) (Set, error) {
	raw := bytes.TrimSpace([]byte(v))
	if len(raw) == 0 {
		return Set{}, nil
	}
	switch raw[0] {
	case '[': // Version 1: a bare list
		var rs []Record
		if err := json.Unmarshal(raw, &rs); err != nil {
			return Set{}, fmt.Errorf("%w: version 1 list: %v", ErrUnreadable, err)
		}
		return Set{Records: rs}, nil
	case '{':
		// One pass in the common case; the version alone is read again only to explain a
		// value that does not decode (a newer version's records may not fit this one's).
		var e envelope
		err := json.Unmarshal(raw, &e)
		version := e.Version
		if err != nil {
			var head struct {
				Version int `json:"version"`
			}
			if herr := json.Unmarshal(raw, &head); herr != nil {
				return Set{}, fmt.Errorf("%w: %v", ErrUnreadable, herr)
			}
			version = head.Version
		}
		if version < 2 || version > Version {
			return Set{}, fmt.Errorf("%w: version %d (this router reads 1 to %d)", ErrUnreadable, version, Version)
		}
		if err != nil {
			return Set{}, fmt.Errorf("%w: version %d: %v", ErrUnreadable, version, err)
		}
		return Set{Records: e.Records, Running: e.Running}, nil
	}
	return Set{}, fmt.Errorf("%w: neither a list nor an object", ErrUnreadable)
}

// Encode writes a Set as the annotation's value ("" for an empty Set), after trimming it
// (Trim). It fails with ErrTooLarge past MaxBytes.
func Encode(s Set) (string, error) {
	s.Records = Trim(s.Records)
	if len(s.Records) == 0 && s.Running.IsZero() {
		return "", nil
	}
	b, err := json.Marshal(envelope{Version: Version, Records: s.Records, Running: s.Running})
	if err != nil {
		return "", fmt.Errorf("encoding records: %w", err)
	}
	if len(b) > MaxBytes {
		return "", fmt.Errorf("%w: %d bytes, %d records (bound %d bytes)", ErrTooLarge, len(b), len(s.Records), MaxBytes)
	}
	return string(b), nil
}

// Trim keeps every active record and the EndedKept newest ended ones, without their event
// bodies (an ended record is kept only so that a late duplicate of its event is recognised).
func Trim(rs []Record) []Record {
	out := make([]Record, 0, len(rs))
	ended := 0
	for i := len(rs) - 1; i >= 0; i-- { // newest are appended last
		r := rs[i]
		if !r.Active() {
			if ended == EndedKept {
				continue
			}
			ended++
			r.Event = nil
		}
		out = append(out, r)
	}
	slices.Reverse(out)
	return out
}

// Key identifies an event across its updates: the AWS Health eventArn; for the poller's
// scheduled-event finding, the instance and EC2's instance-event ID (EC2 keeps the ID when
// the event is rescheduled); else the event's ID.
func Key(ev event.Event) string {
	if ev.Health != nil && ev.Health.EventARN != "" {
		return ev.Health.EventARN
	}
	return ev.ID
}

// Communication identifies one communication of an AWS Health event, "<eventArn>#<communicationId>",
// or "" for other events and a Health event without a communicationId. Copies of one
// communication (delivered twice, or both to the account and through the organizational view)
// have other EventBridge ids but are one decision; its pages name other instances, so each
// instance is still decided once; an update of the event is a new communication.
func Communication(ev event.Event) string {
	if ev.Health == nil || ev.Health.CommunicationID == "" || ev.Health.EventARN == "" {
		return ""
	}
	return ev.Health.EventARN + "#" + ev.Health.CommunicationID
}

// Match returns the identity of a scheduled maintenance across its sources, or "" for other
// events: "<scheduled type>@<not-before, RFC 3339>". The type is empty for an AWS Health code
// the router does not map to one; such a Match is the same maintenance as any type's at the
// same time (SameMaintenance).
func Match(ev event.Event) string {
	if ev.Kind != event.KindScheduledChange || ev.Health == nil || ev.Deadline.IsZero() {
		return ""
	}
	return string(ev.Health.Scheduled) + "@" + ev.Deadline.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// SameMaintenance reports whether two Match values name one maintenance: the same not-before,
// and the same scheduled type where both know it.
func SameMaintenance(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ta, at, _ := strings.Cut(a, "@")
	tb, bt, _ := strings.Cut(b, "@")
	return at == bt && (ta == tb || ta == "" || tb == "")
}

// Rescheduled reports whether match b is the same kind of maintenance as a at another time:
// the same (known) scheduled type, another not-before. EC2 schedules one event of a type per
// instance at a time, so the later report is the maintenance moved.
func Rescheduled(a, b string) bool {
	ta, at, _ := strings.Cut(a, "@")
	tb, bt, _ := strings.Cut(b, "@")
	return a != "" && b != "" && ta != "" && ta == tb && at != bt
}

// Closed reports whether ev ends its maintenance: a closed AWS Health event, or a scheduled
// event EC2 reports as completed or cancelled.
func Closed(ev event.Event) bool {
	return ev.Health != nil && ev.Health.Status == event.HealthClosed
}

// Recorded returns the record of ev, if any: an event recorded already needs no new decision.
// That is the same event (its ID: a redelivery), the same scheduled maintenance reported by
// another source under another key (unless a close cancelled that record before ev was sent:
// reopened), or an update of an event that was closed by a report at least as new
// (lateAfterClose). Any other update under the same key (a new status, a closed event) is
// never "recorded": it is decided, and supersedes or cancels the record.
func (s Set) Recorded(ev event.Event) (Record, bool) {
	match, key := Match(ev), Key(ev)
	closed := Closed(ev)
	comm := Communication(ev)
	for _, r := range s.Records {
		if comm != "" && r.Communication == comm {
			return r, true // another copy of a communication decided already
		}
		if r.EventID == ev.ID && movedBack(r, ev, match) {
			continue
		}
		// The other source's report of the maintenance, or of the start it had before the
		// router moved it (sent before the move: EC2 may not show the event open any more,
		// cancelled since, so the report cannot be moved to it first).
		same := SameMaintenance(r.Match, match) || SameMaintenance(movedFrom(r), match)
		if r.EventID == ev.ID || (!closed && r.State != StateClosed && r.Key != key && same && !s.reopened(r, ev)) {
			return r, true
		}
		if !closed && r.State == StateClosed && lateAfterClose(r, ev, key) {
			return r, true
		}
	}
	return Record{}, false
}

// ClosedSince reports whether a close applied to the set ended ev's event or maintenance after
// ev was sent (lateAfterClose): a deferral decided from a copy read before the close was
// written, by another worker at the same moment, must not bring back what the close ended.
func (s Set) ClosedSince(ev event.Event) bool {
	if Closed(ev) {
		return false
	}
	key := Key(ev)
	return slices.ContainsFunc(s.Records, func(r Record) bool { return r.State == StateClosed && lateAfterClose(r, ev, key) })
}

// movedFrom is r's maintenance at the start it had before it moved ("" when it did not).
func movedFrom(r Record) string { return matchAt(r.Match, r.MovedFrom) }

// matchAt is the maintenance match names, at start instead ("" when either is missing).
func matchAt(match string, start time.Time) string {
	if start.IsZero() || match == "" {
		return ""
	}
	typ, _, _ := strings.Cut(match, "@")
	return typ + "@" + start.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// reopened reports whether ev, a report of the cancelled record r's maintenance from another
// source, was sent after the close that cancelled it (the close kept in the set, of r's key or
// maintenance): AWS scheduled the instance that maintenance again (the router moves every
// event of a pool into the same place of its window, so a new one may start where a cancelled
// one did). It is decided, not taken as the cancelled one. A report from before the close, or
// from its second, is the cancelled maintenance, late.
func (s Set) reopened(r Record, ev event.Event) bool {
	if r.State != StateCancelled || ev.Time.IsZero() {
		return false
	}
	var last time.Time // the latest close of r's event or maintenance: the one that cancelled it
	for _, c := range s.Records {
		if c.State == StateClosed && (c.Key == r.Key || SameMaintenance(c.Match, r.Match)) && c.EventTime.After(last) {
			last = c.EventTime
		}
	}
	return !last.IsZero() && ev.Time.After(last)
}

// movedBack reports whether ev, a report of EC2's own (the instance-status poller), names its
// maintenance at another start than the active record of the same report holds: the router
// moved the event (the record holds the new start) and EC2 now shows the report's start again
// (AWS moved it back). The finding's ID is the same as the first report's, yet the outcome
// recorded is for a start EC2 no longer holds: it is decided again.
func movedBack(r Record, ev event.Event, match string) bool {
	return ev.Source == event.SourceHealthRouter && r.Active() && match != "" && r.Match != "" && r.Match != match
}

// lateAfterClose reports whether ev is an update of the event (or the maintenance) that the
// closing report c ended, sent before it: SQS and the router's own retry backoff reorder
// messages, and the older word must not reopen what the newer closed. Under the same key an
// update from the close's own second is taken as older too (AWS Health closes an event last);
// from another source only a strictly older one, since its clock is not the close's. A report
// the router moved is of the close of the start it was moved from too.
func lateAfterClose(c Record, ev event.Event, key string) bool {
	if c.EventTime.IsZero() || ev.Time.IsZero() {
		return false
	}
	switch {
	case c.Key == key:
		return !ev.Time.After(c.EventTime)
	case SameMaintenance(c.Match, Match(ev)) || SameMaintenance(c.Match, movedMatch(ev)):
		return ev.Time.Before(c.EventTime)
	}
	return false
}

// movedMatch is ev's maintenance at the start it had before the router moved it ("" when it
// did not): a close of that start is of it (a report is moved before its deferral is written).
func movedMatch(ev event.Event) string { return matchAt(Match(ev), ev.MovedFrom) }

// Put records r (a deferral of its event): it replaces the record of the same event (unless
// that one has ended: it stays ended), and
// supersedes the active records it replaces: the same key (an older update of the same
// event), or the same kind of maintenance at another time (a reschedule seen first by the
// other source). Only a deferral is put (an ended record is written by the operation that
// ends it: Transitions): another record changes nothing. It reports whether anything changed.
func (s *Set) Put(r Record) bool {
	if !r.Active() {
		return false
	}
	found, changed := false, false
	for i := range s.Records {
		cur := &s.Records[i]
		switch {
		case cur.EventID == r.EventID:
			found = true
			if r.MovedFrom.IsZero() {
				r.MovedFrom = cur.MovedFrom // a deferral decided again keeps the start it was moved from
			}
			if Same(*cur, r) || (!cur.Active() && r.Active()) {
				// An ended record stays ended: a deferral decided again from a stale copy (a
				// lagging cache) must not bring back what a close, a newer update or a drain
				// ended meanwhile.
				continue
			}
			*cur = r
			changed = true
		case cur.Active() && (cur.Key == r.Key || (r.Kind == event.KindScheduledChange && cur.Kind == event.KindScheduledChange && Rescheduled(cur.Match, r.Match))):
			cur.State = StateSuperseded
			changed = true
		}
	}
	if !found {
		s.Records = append(s.Records, r)
		changed = true
	}
	return changed
}

// Cancel ends the active records ev ends (ev is a closed maintenance, or a running instance;
// cancel says the decision asks for it) and removes an active record of ev itself (its pool's
// policy now ignores it). It returns the event IDs it cancelled, and whether anything changed.
func (s *Set) Cancel(ev event.Event, cancel bool) (cancelled []string, changed bool) {
	n := len(s.Records)
	s.Records = slices.DeleteFunc(s.Records, func(r Record) bool { return r.EventID == ev.ID && r.Active() })
	changed = len(s.Records) != n
	if ev.Kind == event.KindStateChange && ev.State == event.StateRunning && ev.Time.After(s.Running) {
		s.Running, changed = ev.Time.UTC(), true
	}
	if !cancel {
		return nil, changed
	}
	key, match := Key(ev), Match(ev)
	if Closed(ev) && !slices.ContainsFunc(s.Records, func(r Record) bool { return r.EventID == ev.ID }) {
		defer func() {
			s.Records = append(s.Records, Record{EventID: ev.ID, Key: key, Kind: ev.Kind, State: StateClosed, Match: match,
				Until: ev.Deadline.UTC(), EventTime: ev.Time.UTC(), Reason: "closing report applied"})
			changed = true
		}()
	}
	for i := range s.Records {
		r := &s.Records[i]
		if !r.Active() {
			continue
		}
		// A close of the start the router moved the maintenance from is of it too, as a report
		// of that start is (Recorded).
		closed := Closed(ev) && (r.Key == key || SameMaintenance(r.Match, match) || SameMaintenance(movedFrom(*r), match))
		running := ev.Kind == event.KindStateChange && r.Kind == event.KindStateChange
		recovered := ev.Kind == event.KindInstanceStatus && r.Kind == event.KindInstanceStatus
		if closed || running || recovered {
			r.State = StateCancelled
			cancelled = append(cancelled, r.EventID)
			changed = true
		}
	}
	return cancelled, changed
}

// Drained ends every active record: the node is being drained (for eventID), so nothing it
// held waits any more. It removes the records of eventID's own key (they are carried out).
func (s *Set) Drained(eventID, key string) bool {
	n := len(s.Records)
	s.Records = slices.DeleteFunc(s.Records, func(r Record) bool { return r.Key == key || r.EventID == eventID })
	changed := len(s.Records) != n
	for i := range s.Records {
		if s.Records[i].Active() {
			s.Records[i].State, s.Records[i].Reason = StateDrained, "drained for "+eventID+": "+s.Records[i].Reason
			changed = true
		}
	}
	return changed
}

// InPlace ends the active records of ev's event (its ID, or its key: an update of it) as
// handed to a reboot in place; the records of other events stay as they are.
func (s *Set) InPlace(eventID, key string) bool {
	changed := false
	for i := range s.Records {
		if r := &s.Records[i]; r.Active() && (r.EventID == eventID || r.Key == key) {
			r.State, r.Event = StateInPlace, nil
			changed = true
		}
	}
	return changed
}

// Remove removes the record of eventID; it reports whether it was there.
func (s *Set) Remove(eventID string) bool {
	n := len(s.Records)
	s.Records = slices.DeleteFunc(s.Records, func(r Record) bool { return r.EventID == eventID })
	return len(s.Records) != n
}

// Prune removes the ended records whose time has passed: their until-time and, for a
// scheduled maintenance, the maintenance's own time. Until then a late duplicate of their event
// is recognised (Recorded) and cannot bring an ended maintenance back.
func (s *Set) Prune(now time.Time) bool {
	n := len(s.Records)
	s.Records = slices.DeleteFunc(s.Records, func(r Record) bool { return !r.Active() && !now.Before(r.KeptUntil()) })
	return len(s.Records) != n
}

// KeptUntil is when an ended record may go: its until-time, or its maintenance's time if later.
func (r Record) KeptUntil() time.Time {
	if _, at, ok := strings.Cut(r.Match, "@"); ok {
		if t, err := time.Parse(time.RFC3339, at); err == nil && t.After(r.Until) {
			return t
		}
	}
	return r.Until
}

// Active returns the active records.
func (s Set) Active() []Record {
	var out []Record
	for _, r := range s.Records {
		if r.Active() {
			out = append(out, r)
		}
	}
	return out
}

// Same reports whether two records say the same.
func Same(a, b Record) bool {
	return a.EventID == b.EventID && a.Key == b.Key && a.Kind == b.Kind && a.Until.Equal(b.Until) && a.Reason == b.Reason &&
		a.State == b.State && a.Hold == b.Hold && a.Image == b.Image && slices.Equal(a.PDBs, b.PDBs) && a.Match == b.Match &&
		a.EventTime.Equal(b.EventTime) && sameJSON(a.Event, b.Event)
}

// sameJSON reports whether two event bodies are the same JSON: a body read back from the
// API server has its object keys in another order than the one written.
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// DrainStamp is the value of the drain-signalled annotation: "<event id> <RFC 3339> <via>".
func DrainStamp(eventID string, at time.Time, via string) string {
	return eventID + " " + at.UTC().Format(time.RFC3339) + " " + via
}

// ParseDrainStamp reads a drain-signalled annotation; via is empty in stamps written before
// it was recorded.
func ParseDrainStamp(v string) (eventID string, at time.Time, via string, ok bool) {
	f := strings.Fields(v)
	if len(f) < 2 {
		return "", time.Time{}, "", false
	}
	at, err := time.Parse(time.RFC3339, f[1])
	if err != nil {
		return "", time.Time{}, "", false
	}
	if len(f) > 2 {
		via = f[2]
	}
	return f[0], at, via, true
}
