// Package calendar publishes the maintenance the router plans as an iCalendar feed and as
// Prometheus gauges, so that the people who own a NodePool see its drains and windows in the
// calendar they already read. Everything comes from a status.Report (router/status): one
// event per deferred drain, at its until-time, and one per occurrence of the pool's
// maintenance window within a horizon.
//
// UIDs are stable: a drain's UID hashes its NodePool, NodeClaim and event ID, a window's its
// NodePool and start, never the until-time or the reason, so that a re-decided drain (a new
// until-time, a new hold) is an update of the same calendar event, not a second one.
package calendar

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	// golang-ical rather than emersion/go-ical: it has tagged releases (semver, released this
	// year), no run-time dependencies, folds and escapes on its own, and writes an empty
	// VCALENDAR; emersion's encoder refuses a calendar without a component, which is this
	// feed's usual state in a cluster with nothing planned.
	ics "github.com/arran4/golang-ical"

	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/status"
)

// DefaultHorizon is how far ahead window occurrences are written: two weeks covers the next
// two of a weekly window, which is what a team plans around.
const DefaultHorizon = 14 * 24 * time.Hour

// maxOccurrences bounds the occurrences of one pool's window within the horizon: a schedule
// that fires every minute would otherwise write 20,160 events for two weeks.
const maxOccurrences = 500

// ProductID is the calendar's PRODID.
const ProductID = "-//health-router//maintenance calendar//EN"

// uidDomain ends every UID, as RFC 5545 suggests (a globally unique right-hand side).
const uidDomain = "@health-router.healthrouter.io"

// Kinds of Entry.
const (
	KindDrain  = "drain"
	KindWindow = "window"
)

// Entry is one maintenance on the calendar.
type Entry struct {
	UID      string
	Kind     string // KindDrain or KindWindow
	NodePool string
	// Start is a drain's until-time (when the router decides it again: the drain, at the
	// earliest) or a window's opening.
	Start time.Time
	// End is when a window closes; zero for a drain, which is an instant.
	End         time.Time
	Summary     string
	Description string
}

// Entries lists the maintenance in rep, soonest first: every deferred drain, and the
// occurrences of each pool's window that are open at rep.Now or start within horizon of it.
func Entries(rep status.Report, horizon time.Duration) []Entry {
	var out []Entry
	for _, p := range rep.NodePools {
		for _, d := range p.Deferred {
			out = append(out, drainEntry(p.Name, d))
		}
		if p.Window != nil {
			out = append(out, windowEntries(p.Name, p.Window, rep.Now, horizon)...)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.Before(out[j].Start)
		}
		return out[i].UID < out[j].UID
	})
	return out
}

func drainEntry(pool string, d status.Deferred) Entry {
	target := "node " + d.Node
	if d.Node == "" {
		target = "nodeclaim " + d.NodeClaim // not registered yet: no Node
	}
	desc := []string{
		"NodePool: " + pool,
		"NodeClaim: " + d.NodeClaim,
	}
	if d.Node != "" {
		desc = append(desc, "Node: "+d.Node)
	}
	desc = append(desc,
		"Event: "+d.EventID,
		"Kind: "+string(d.Kind),
		"Hold: "+d.Hold,
		"Until: "+d.Until.UTC().Format(time.RFC3339),
		"Reason: "+d.Reason,
	)
	return Entry{
		// The event ID, not the until-time or the reason: those change when the drain is
		// decided again, and the calendar must update the event rather than add one.
		UID:         uid(KindDrain, pool, d.NodeClaim, d.EventID),
		Kind:        KindDrain,
		NodePool:    pool,
		Start:       d.Until.UTC(),
		Summary:     fmt.Sprintf("%s: %s drain of %s (hold: %s)", pool, d.Kind, target, d.Hold),
		Description: strings.Join(desc, "\n"),
	}
}

// windowEntries expands the window's schedule from now to now+horizon. The window open at
// now, if any, is included: its start is before now, its end after.
func windowEntries(pool string, sw *status.Window, now time.Time, horizon time.Duration) []Entry {
	w, err := policy.NewWindow(sw.Schedule, sw.Duration)
	if err != nil {
		// status read it through policy.FromAnnotations, which dropped an invalid window; a
		// window that does not parse again cannot be expanded.
		return nil
	}
	var out []Entry
	end := now.Add(horizon)
	// Next(t) is the first start strictly after t: from now-duration, the first start whose
	// window has not closed by now.
	for t := now.Add(-w.Duration); len(out) < maxOccurrences; {
		start := w.Next(t)
		if start.IsZero() || start.After(end) {
			break
		}
		out = append(out, Entry{
			UID:      uid(KindWindow, pool, start.UTC().Format(time.RFC3339)),
			Kind:     KindWindow,
			NodePool: pool,
			Start:    start.UTC(),
			End:      start.Add(w.Duration).UTC(),
			Summary:  fmt.Sprintf("%s: maintenance window", pool),
			Description: fmt.Sprintf("NodePool: %s\nSchedule: %s\nDuration: %s\nDrains of this pool deferred to the window start when it opens.",
				pool, w.Schedule, w.Duration),
		})
		t = start
	}
	return out
}

// uid hashes the fields that name one maintenance. The separator keeps ("a", "bc") and
// ("ab", "c") apart.
func uid(kind string, fields ...string) string {
	h := sha256.New()
	for _, f := range fields {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return kind + "-" + hex.EncodeToString(h.Sum(nil)[:16]) + uidDomain
}

// Calendar writes reports as iCalendar, remembering each event's revisions so that
// SEQUENCE grows and LAST-MODIFIED moves when an event changes (a drain decided again with a
// new until-time or hold). The memory is this process's: SEQUENCE starts at 0 in a new
// process (and in each replica), which costs subscribers nothing, as calendar clients match
// a published feed's events by UID.
type Calendar struct {
	horizon time.Duration

	mu sync.Mutex
	// revisions per NodePool, per UID; a pool's map is replaced on each write that reports
	// the pool, so finished drains and past windows are forgotten.
	revisions map[string]map[string]revision
}

// revision is what the Calendar last wrote for a UID.
type revision struct {
	fingerprint string
	sequence    int
	modified    time.Time
}

// New returns a Calendar writing window occurrences up to horizon ahead (DefaultHorizon when
// horizon is not positive).
func New(horizon time.Duration) *Calendar {
	if horizon <= 0 {
		horizon = DefaultHorizon
	}
	return &Calendar{horizon: horizon, revisions: map[string]map[string]revision{}}
}

// Build returns rep's calendar: one VEVENT per Entry. DTSTAMP and LAST-MODIFIED are the time
// the Calendar first wrote the event as it is now (RFC 5545 3.8.7.2: without METHOD, DTSTAMP
// is when the information was last revised), so an unchanged feed is byte for byte the same.
func (c *Calendar) Build(rep status.Report) *ics.Calendar {
	cal, _ := c.build(rep, 0)
	return cal
}

// build is Build keeping the soonest maxEvents entries (all when maxEvents is not positive);
// it returns how many it left out, which the calendar's description tells its reader.
func (c *Calendar) build(rep status.Report, maxEvents int) (*ics.Calendar, int) {
	entries := Entries(rep, c.horizon)
	omitted := 0
	if maxEvents > 0 && len(entries) > maxEvents {
		// Entries are soonest first: what is left out is what is furthest away.
		omitted, entries = len(entries)-maxEvents, entries[:maxEvents]
	}
	revs := c.revise(rep, entries)

	cal := ics.NewCalendarFor("health-router")
	cal.SetProductId(ProductID)
	cal.SetCalscale("GREGORIAN")
	cal.SetXWRCalName("health-router maintenance")
	desc := "Drains the router plans and the NodePools' maintenance windows"
	if omitted > 0 {
		desc += fmt.Sprintf(" (the soonest %d shown; %d later ones left out: ask for one pool with ?nodepool=)", maxEvents, omitted)
	}
	cal.SetXWRCalDesc(desc)
	// Clients poll a subscribed feed at this interval (Outlook reads X-PUBLISHED-TTL).
	cal.SetRefreshInterval("PT15M")
	cal.SetXPublishedTTL("PT15M")
	for _, e := range entries {
		r := revs[e.UID]
		ev := cal.AddEvent(e.UID)
		ev.SetDtStampTime(r.modified)
		ev.SetModifiedAt(r.modified)
		ev.SetSequence(r.sequence)
		ev.SetStartAt(e.Start)
		if !e.End.IsZero() {
			ev.SetEndAt(e.End)
		}
		ev.SetSummary(e.Summary)
		ev.SetDescription(e.Description)
		ev.AddCategory(e.Kind)
		// Maintenance is not the reader's busy time.
		ev.SetTimeTransparency(ics.TransparencyTransparent)
	}
	return cal, omitted
}

// Write writes rep's calendar to w.
func (c *Calendar) Write(w io.Writer, rep status.Report) error {
	_, err := c.WriteLimited(w, rep, 0)
	return err
}

// WriteLimited writes rep's calendar to w with its soonest maxEvents events (all when
// maxEvents is not positive), and returns how many it left out.
func (c *Calendar) WriteLimited(w io.Writer, rep status.Report, maxEvents int) (int, error) {
	cal, omitted := c.build(rep, maxEvents)
	// RFC 5545 ends lines with CRLF; the library's default is the platform's newline.
	if err := cal.SerializeTo(w, ics.WithNewLineWindows); err != nil {
		return omitted, fmt.Errorf("writing the calendar: %w", err)
	}
	return omitted, nil
}

// revise returns the revision of every entry, counting a change of an entry's content (start,
// end, summary, description) as a new revision at rep.Now.
func (c *Calendar) revise(rep status.Report, entries []Entry) map[string]revision {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := map[string]map[string]revision{}
	for _, p := range rep.NodePools {
		next[p.Name] = map[string]revision{}
	}
	out := make(map[string]revision, len(entries))
	for _, e := range entries {
		fp := strings.Join([]string{e.Start.Format(time.RFC3339), e.End.Format(time.RFC3339), e.Summary, e.Description}, "\x00")
		r, seen := c.revisions[e.NodePool][e.UID]
		switch {
		case !seen:
			r = revision{fingerprint: fp, modified: rep.Now.UTC()}
		case r.fingerprint != fp:
			r = revision{fingerprint: fp, sequence: r.sequence + 1, modified: rep.Now.UTC()}
		}
		next[e.NodePool][e.UID] = r
		out[e.UID] = r
	}
	for pool, revs := range next {
		c.revisions[pool] = revs
	}
	return out
}
