package nodedrain

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/health-router/health-router/router/record"
)

// AnnotationNodeDrain held, on the Node, the Record of a drain routers before the store kept
// there. It is no longer read: anyone with `patch nodes` writes it. A router that starts
// beside one adopts it once, on what EC2 confirms (Adopt), and removes it.
const AnnotationNodeDrain = record.AnnotationNodeDrain

// Record is the drain the router keeps of a Node it drains itself, in the Node's HealthRecord
// (router/record's Memory.NodeDrain, JSON): the event, its kind, when it began, and the bound
// (the event's deadline minus drain-lead, or zero for none); Done when no evictable pod is
// left. The store is the record's only home, and only the router writes it: a restarted or
// newly elected router resumes every unfinished drain from it.
type Record struct {
	EventID string `json:"event_id"`
	// Key is the event across its updates (an AWS Health ARN), Match the scheduled
	// maintenance across its sources (router/record's Key and Match): a close of either
	// reaches the drain (Drainer.Cancel).
	Key   string `json:"key,omitempty"`
	Match string `json:"match,omitempty"`
	Kind  string `json:"kind"`
	// EventTime is when the event happened: a `running` after it ends a drain for a stop.
	EventTime time.Time `json:"event_time,omitzero"`
	// Running marks no drain but the latest `running` of the instance handled while it had
	// none: a stop from before it, arriving late, is over and begins no drain.
	Running bool `json:"running,omitempty"`
	// RunningSince is the latest `running` of the instance handled while this record (of
	// another event, its drain finished) was on the Node: a stop from before it, arriving
	// late, is over and begins no drain either.
	RunningSince time.Time `json:"running_since,omitzero"`
	// Closed marks no drain but a maintenance closed (a closed Health event, a [Canceled] or
	// [Completed] poller finding) while the Node had no drain for it: an older report of the
	// same event or maintenance, arriving late, is over and begins no drain (Begin), as a
	// closed record on a NodeClaim does (router/record). EventTime is the close's.
	Closed bool `json:"closed,omitempty"`
	// Release is when a drain for a maintenance AWS keeps the instance through (a reboot)
	// ends: past it, once the drain is done and the Node Ready, the router uncordons the Node
	// it cordoned. Zero for the events that end the instance.
	Release  time.Time `json:"release,omitzero"`
	Started  time.Time `json:"started"`
	Deadline time.Time `json:"deadline,omitzero"`
	// Done is when the router found no evictable pod left on the Node.
	Done *time.Time `json:"done,omitempty"`
	// Attempts counts the eviction rounds; LastError is why the last one did not finish.
	Attempts  int    `json:"attempts,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Cordoned is set when the router made the Node unschedulable: Forget uncordons only
	// then, so that a cordon someone else set before the event is left in place.
	Cordoned bool `json:"cordoned,omitempty"`
	// Warned is set once the Warning that a PodDisruptionBudget blocks the drain past its
	// deadline has been posted: once per record, across restarts and leader changes.
	Warned bool `json:"warned,omitempty"`
	// Also are the other scheduled maintenances of the instance AWS reported while the drain
	// held the Node: the drain holds it for each of them too. It ends (Release) when the last
	// of them is over; a close, a recovery or a running that ends the drain's own event hands
	// the Node to the next of them instead of uncordoning it.
	Also []Held `json:"also,omitempty"`
}

// Held is a scheduled maintenance a drain holds its Node for, beside the event it began for
// (Record.Also): its report's keys, time, bound and release, as a Drain gives them.
type Held struct {
	EventID   string    `json:"event_id"`
	Key       string    `json:"key,omitempty"`
	Match     string    `json:"match"`
	EventTime time.Time `json:"event_time,omitzero"`
	Deadline  time.Time `json:"deadline,omitzero"`
	Release   time.Time `json:"release,omitzero"`
}

// hold takes the report dr of a scheduled maintenance into the drain r, which holds the Node
// already: a newer report of a maintenance r holds (its key, or the same type at another
// start: AWS rescheduled it, as router/record's Rescheduled says) replaces it, so the drain's
// release moves with it; an older one, or the same maintenance from the other source, changes
// nothing; another maintenance is held beside the drain's own (Also). A report of no scheduled
// maintenance (a Spot warning, a stop, an impairment) changes nothing either. It reports
// whether r changed.
func (r *Record) hold(dr Drain) bool {
	if dr.Match == "" {
		return false
	}
	h := Held{EventID: dr.EventID, Key: dr.Key, Match: dr.Match, EventTime: dr.EventTime, Deadline: dr.Deadline, Release: dr.Release}
	if r.Match != "" {
		if same, newer := reports(r.own(), h); same {
			if newer {
				r.follow(h)
			}
			return newer
		}
	}
	for i, a := range r.Also {
		if same, newer := reports(a, h); same {
			if newer {
				r.Also[i] = h
			}
			return newer
		}
	}
	r.Also = append(r.Also, h)
	return true
}

// follow makes h the drain's own maintenance (its kind stays).
func (r *Record) follow(h Held) {
	r.EventID, r.Key, r.Match, r.EventTime, r.Deadline, r.Release = h.EventID, h.Key, h.Match, h.EventTime, h.Deadline, h.Release
}

// own is the drain's own maintenance as a Held.
func (r Record) own() Held {
	return Held{EventID: r.EventID, Key: r.Key, Match: r.Match, EventTime: r.EventTime, Deadline: r.Deadline, Release: r.Release}
}

// reports tells whether h is a report of the maintenance a (same: its key, the same
// maintenance, or the same type rescheduled) and whether it replaces a's (newer: a later
// report that moves it).
func reports(a, h Held) (same, newer bool) {
	switch {
	case sameMaintenance(a.Match, h.Match):
		return true, false
	case (h.Key != "" && a.Key == h.Key) || rescheduled(a.Match, h.Match):
		return true, h.EventTime.After(a.EventTime)
	}
	return false, false
}

// rescheduled is router/record's Rescheduled (the same known type at another start),
// restated: this package is below record in the pipeline.
func rescheduled(a, b string) bool {
	ta, at, _ := strings.Cut(a, "@")
	tb, bt, _ := strings.Cut(b, "@")
	return a != "" && b != "" && ta != "" && ta == tb && at != bt
}

// handOn ends the drain's own event and hands the Node to the next maintenance it holds
// (Also): ok=false when it holds none, and the drain ends.
func (r Record) handOn() (Record, bool) {
	if len(r.Also) == 0 {
		return r, false
	}
	r.follow(r.Also[0])
	r.Kind = scheduledChangeKind
	r.Also = slices.Clone(r.Also[1:])
	r.Warned = false // the next maintenance's bound is its own
	return r, true
}

// closes applies the close dr (a closed maintenance: its event ID, key or maintenance) to the
// drain: a close of its own event hands the Node on (handOn), or ends the drain (end); a close
// of a maintenance in Also drops it. It returns the drain as it stands after.
func (r Record) closes(dr Drain) (next Record, end bool) {
	if r.EventID == dr.EventID || (dr.Key != "" && r.Key == dr.Key) || (dr.Match != "" && sameMaintenance(r.Match, dr.Match)) {
		next, ok := r.handOn()
		return next, !ok
	}
	r.Also = slices.DeleteFunc(slices.Clone(r.Also), func(a Held) bool {
		return a.EventID == dr.EventID || (dr.Key != "" && a.Key == dr.Key) || (dr.Match != "" && sameMaintenance(a.Match, dr.Match))
	})
	return r, false
}

// ReleaseAt is when the finished drain ends by itself: the last release of the maintenances
// it holds, AWS's reboots over. ok=false when one of them has none (it ends the instance, or
// is no maintenance: a Spot warning, a stop).
func (r Record) ReleaseAt() (at time.Time, ok bool) {
	if r.Release.IsZero() {
		return time.Time{}, false
	}
	at = r.Release
	for _, a := range r.Also {
		if a.Release.IsZero() {
			return time.Time{}, false
		}
		at = later(at, a.Release)
	}
	return at, true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Finished reports whether the drain is done.
func (r Record) Finished() bool { return r.Done != nil }

// Overdue reports whether the drain's bound has passed at now (never, without a bound).
func (r Record) Overdue(now time.Time) bool { return !r.Deadline.IsZero() && !now.Before(r.Deadline) }

// Of returns the drain record a Node's memory holds (ok=false if none, err if it does not
// parse).
func Of(m record.Memory) (Record, bool, error) {
	if len(m.NodeDrain) == 0 {
		return Record{}, false, nil
	}
	rec, err := decode(string(m.NodeDrain))
	if err != nil {
		return Record{}, false, fmt.Errorf("the node drain record: %w", err)
	}
	return rec, true, nil
}

// put makes r the drain record of m.
func put(m *record.Memory, r Record) { m.NodeDrain = json.RawMessage(encode(r)) }

// FromAnnotation returns the record routers before the store kept on the Node n
// (AnnotationNodeDrain; ok=false if none, err if it does not parse): read by Adopt only, and
// taken on nothing but what EC2 confirms.
func FromAnnotation(n *corev1.Node) (Record, bool, error) {
	v, ok := n.Annotations[AnnotationNodeDrain]
	if !ok {
		return Record{}, false, nil
	}
	rec, err := decode(v)
	if err != nil {
		return Record{}, false, fmt.Errorf("annotation %s of node %s: %w", AnnotationNodeDrain, n.Name, err)
	}
	return rec, true, nil
}

func decode(v string) (Record, error) {
	var rec Record
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return Record{}, err
	}
	// An empty object, or a hand-written one without the event, would be resumed as a drain
	// nobody can trace back: refuse it.
	if rec.EventID == "" {
		return Record{}, errors.New("no event_id")
	}
	return rec, nil
}

func encode(r Record) string {
	r.Started = r.Started.UTC()
	r.Deadline = r.Deadline.UTC()
	r.Release = r.Release.UTC()
	r.EventTime = r.EventTime.UTC()
	r.Also = slices.Clone(r.Also)
	for i := range r.Also {
		a := &r.Also[i]
		a.EventTime, a.Deadline, a.Release = a.EventTime.UTC(), a.Deadline.UTC(), a.Release.UTC()
	}
	if r.Done != nil {
		done := r.Done.UTC()
		r.Done = &done
	}
	b, _ := json.Marshal(r) // a struct of strings, times and numbers always marshals
	return string(b)
}

// lastErrorMax bounds LastError: the record is read by every watcher of HealthRecords (and
// bounded by the store's MaxBytes), and a round that failed for a hundred pods must not grow
// it by a hundred messages.
const lastErrorMax = 1024

// truncate shortens s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …"
	cut := n - len(mark)
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// pending is one unfinished drain as a pass sees it.
type pending struct {
	node string
	rec  Record
}

// order sorts the unfinished drains a pass works through: the ones this process tried least
// recently first (never tried, then oldest), so that drains a PodDisruptionBudget holds for
// hours do not take every place of every pass; then the nearest deadline (a drain without
// one last), then the name, for a stable order.
func order(ps []pending, lastTried map[string]time.Time) {
	slices.SortFunc(ps, func(a, b pending) int {
		if c := lastTried[a.node].Compare(lastTried[b.node]); c != 0 {
			return c
		}
		if c := compareDeadlines(a.rec.Deadline, b.rec.Deadline); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
}

// compareDeadlines orders deadlines, the zero time (no deadline) last.
func compareDeadlines(a, b time.Time) int {
	switch {
	case a.IsZero() && b.IsZero():
		return 0
	case a.IsZero():
		return 1
	case b.IsZero():
		return -1
	}
	return a.Compare(b)
}

// budgetRefusal returns the API server's explanation when err is an eviction refused by a
// PodDisruptionBudget: a 429 (the budget allows no disruption now, or its status is not yet
// current) or a 403 (the budget is in a state that allows none), each with a cause of type
// DisruptionBudget naming the budget.
func budgetRefusal(err error) (string, bool) {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return "", false
	}
	details := status.Status().Details
	if details == nil {
		return "", false
	}
	for _, c := range details.Causes {
		if c.Type == policyv1.DisruptionBudgetCause {
			return c.Message, true
		}
	}
	return "", false
}

// BlockedNote describes the pods a budget refused, "ns/pod: why" for each, at most five,
// sorted: the text of the Warning, and of the reboot in place's record (router/inplace).
func BlockedNote(refused map[string]string) string {
	const most = 5
	keys := make([]string, 0, len(refused))
	for k := range refused {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, most)
	for _, k := range keys[:min(len(keys), most)] {
		parts = append(parts, k+": "+refused[k])
	}
	s := strings.Join(parts, "; ")
	if len(keys) > most {
		s += fmt.Sprintf("; and %d more", len(keys)-most)
	}
	return s
}
