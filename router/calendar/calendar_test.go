package calendar

import (
	"bytes"
	"strings"
	"testing"
	"time"

	ics "github.com/arran4/golang-ical"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/status"
)

// now is Saturday 2026-11-21 12:00 UTC, as in router/status's tests.
var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func deferred(nodeClaim, node, id string, until time.Time, hold, reason string) status.Deferred {
	return status.Deferred{NodeClaim: nodeClaim, Node: node, EventID: id, Kind: event.KindScheduledChange, Until: until, Hold: hold, Reason: reason}
}

// kafka is a pool with a Saturday window and two deferred drains.
func kafka() status.NodePool {
	return status.NodePool{
		Name:   "kafka",
		Window: &status.Window{Schedule: "0 2 * * 6", Duration: (4 * time.Hour).String()},
		Deferred: []status.Deferred{
			deferred("kafka-c", "ip-10-0-1-2", "ev-reboot", now.Add(time.Minute), status.HoldPacing, "held by max-concurrent-drains 1; until a drain finishes"),
			deferred("kafka-b", "ip-10-0-1-3", "ev-window", time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), status.HoldWindow, "healthrouter.io/action=defer: waiting for the maintenance window at 2026-11-28T02:00:00Z"),
		},
	}
}

func report(at time.Time, pools ...status.NodePool) status.Report {
	return status.Report{Now: at, NodePools: pools}
}

func drainUID(t *testing.T, pool string, d status.Deferred) string {
	t.Helper()
	es := Entries(report(now, status.NodePool{Name: pool, Deferred: []status.Deferred{d}}), DefaultHorizon)
	if len(es) != 1 || es[0].Kind != KindDrain {
		t.Fatalf("entries %+v, want one drain", es)
	}
	return es[0].UID
}

func TestUIDs(t *testing.T) {
	base := deferred("kafka-b", "ip-10-0-1-3", "ev-window", now.Add(time.Hour), status.HoldWindow, "waiting for the window")
	for _, tc := range []struct {
		name   string
		pool   string
		change func(*status.Deferred)
		same   bool
	}{
		{"a new until-time", "kafka", func(d *status.Deferred) { d.Until = d.Until.Add(24 * time.Hour) }, true},
		{"a new reason and hold", "kafka", func(d *status.Deferred) { d.Reason, d.Hold = "held by a check", status.HoldCheck }, true},
		{"the Node registered", "kafka", func(d *status.Deferred) { d.Node = "ip-10-0-9-9" }, true},
		{"another event", "kafka", func(d *status.Deferred) { d.EventID = "ev-other" }, false},
		{"another NodeClaim", "kafka", func(d *status.Deferred) { d.NodeClaim = "kafka-z" }, false},
		{"another pool", "web", func(*status.Deferred) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := base
			tc.change(&d)
			a, b := drainUID(t, "kafka", base), drainUID(t, tc.pool, d)
			if (a == b) != tc.same {
				t.Errorf("UIDs %s and %s; same: %t, want %t", a, b, a == b, tc.same)
			}
		})
	}

	// A window occurrence keeps its UID when the report is read at another time, and the
	// next occurrence has its own.
	w := status.NodePool{Name: "kafka", Window: &status.Window{Schedule: "0 2 * * 6", Duration: "4h"}}
	first := Entries(report(now, w), DefaultHorizon)
	later := Entries(report(now.Add(72*time.Hour), w), DefaultHorizon)
	if len(first) != 2 || len(later) != 2 || first[0].UID != later[0].UID || first[1].UID != later[1].UID || first[0].UID == first[1].UID {
		t.Errorf("window UIDs %v then %v, want two distinct, kept", uids(first), uids(later))
	}
	if !strings.HasSuffix(first[0].UID, uidDomain) || !strings.HasPrefix(first[0].UID, KindWindow+"-") {
		t.Errorf("UID %s", first[0].UID)
	}
}

func uids(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.UID)
	}
	return out
}

func TestWindows(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name             string
		schedule, length string
		now              time.Time
		horizon          time.Duration
		want             []string // start/end, RFC 3339
	}{
		{name: "weekly, two weeks", schedule: "0 2 * * 6", length: "4h", now: now, horizon: DefaultHorizon,
			want: []string{"2026-11-28T02:00:00Z/2026-11-28T06:00:00Z", "2026-12-05T02:00:00Z/2026-12-05T06:00:00Z"}},
		{name: "open now: the open window first", schedule: "0 2 * * 6", length: "4h", now: at("2026-11-21T03:30:00Z"), horizon: DefaultHorizon,
			want: []string{"2026-11-21T02:00:00Z/2026-11-21T06:00:00Z", "2026-11-28T02:00:00Z/2026-11-28T06:00:00Z", "2026-12-05T02:00:00Z/2026-12-05T06:00:00Z"}},
		{name: "closed at the instant it ends", schedule: "0 2 * * 6", length: "4h", now: at("2026-11-21T06:00:00Z"), horizon: 7 * 24 * time.Hour,
			want: []string{"2026-11-28T02:00:00Z/2026-11-28T06:00:00Z"}},
		{name: "a start at the horizon is in", schedule: "0 2 * * 6", length: "4h", now: at("2026-11-21T02:00:00Z"), horizon: 7 * 24 * time.Hour,
			want: []string{"2026-11-21T02:00:00Z/2026-11-21T06:00:00Z", "2026-11-28T02:00:00Z/2026-11-28T06:00:00Z"}},
		{name: "a short horizon", schedule: "0 2 * * 6", length: "4h", now: now, horizon: 24 * time.Hour, want: nil},
		// 02:00 in Berlin is 00:00Z in summer time, 01:00Z after; on 10-25 the hour from 02:00
		// to 03:00 comes twice, and the schedule (robfig/cron, as policy.Window.Open reads it)
		// fires at both: the calendar shows the windows the router keeps.
		{name: "a zone across the end of summer time", schedule: "CRON_TZ=Europe/Berlin 0 2 * * *", length: "1h", now: at("2026-10-23T12:00:00Z"), horizon: 3 * 24 * time.Hour,
			want: []string{"2026-10-24T00:00:00Z/2026-10-24T01:00:00Z", "2026-10-25T00:00:00Z/2026-10-25T01:00:00Z", "2026-10-25T01:00:00Z/2026-10-25T02:00:00Z", "2026-10-26T01:00:00Z/2026-10-26T02:00:00Z"}},
		{name: "longer than its period: overlapping windows", schedule: "0 */6 * * *", length: "8h", now: now, horizon: 12 * time.Hour,
			want: []string{"2026-11-21T06:00:00Z/2026-11-21T14:00:00Z", "2026-11-21T12:00:00Z/2026-11-21T20:00:00Z", "2026-11-21T18:00:00Z/2026-11-22T02:00:00Z", "2026-11-22T00:00:00Z/2026-11-22T08:00:00Z"}},
		{name: "never fires", schedule: "0 0 30 2 *", length: "1h", now: now, horizon: DefaultHorizon, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := Entries(report(tc.now, status.NodePool{Name: "p", Window: &status.Window{Schedule: tc.schedule, Duration: tc.length}}), tc.horizon)
			var got []string
			for _, e := range es {
				if e.Kind != KindWindow || e.NodePool != "p" {
					t.Errorf("entry %+v", e)
				}
				got = append(got, e.Start.Format(time.RFC3339)+"/"+e.End.Format(time.RFC3339))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("windows\n %v\nwant\n %v", got, tc.want)
			}
		})
	}

	t.Run("bounded", func(t *testing.T) {
		es := Entries(report(now, status.NodePool{Name: "p", Window: &status.Window{Schedule: "* * * * *", Duration: "1m"}}), DefaultHorizon)
		if len(es) != maxOccurrences {
			t.Errorf("%d occurrences of a window every minute, want the bound %d", len(es), maxOccurrences)
		}
	})
}

// parse reads a calendar back with the library.
func parse(t *testing.T, b []byte) *ics.Calendar {
	t.Helper()
	cal, err := ics.ParseCalendar(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parsing the calendar back: %v\n%s", err, b)
	}
	return cal
}

func prop(e *ics.VEvent, p ics.ComponentProperty) string {
	if v := e.GetProperty(p); v != nil {
		return v.Value
	}
	return ""
}

func write(t *testing.T, c *Calendar, rep status.Report) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Write(&buf, rep); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestICS(t *testing.T) {
	tricky := deferred("web-a", "", "ev-spot", now.Add(2*time.Minute), status.HoldCheck,
		"drain held until the replacement is sound (ami: image ami-1 is pending; not available, re-checked)\nsecond line")
	tricky.Kind = event.KindSpotInterruption
	web := status.NodePool{Name: "web", Deferred: []status.Deferred{tricky}}
	out := write(t, New(DefaultHorizon), report(now, kafka(), web))
	if !bytes.Contains(out, []byte("\r\n")) || bytes.Contains(bytes.ReplaceAll(out, []byte("\r\n"), nil), []byte("\n")) {
		t.Error("lines do not all end in CRLF")
	}
	for _, line := range strings.Split(string(out), "\r\n") {
		if len(line) > 75 {
			t.Errorf("a line of %d octets (RFC 5545 folds at 75): %q", len(line), line)
		}
	}
	cal := parse(t, out)
	var calProps []string
	for _, p := range cal.CalendarProperties {
		calProps = append(calProps, p.IANAToken+":"+p.Value)
	}
	if got := strings.Join(calProps, " "); !strings.Contains(got, "VERSION:2.0") || !strings.Contains(got, "PRODID:"+ProductID) {
		t.Errorf("calendar properties %s", got)
	}

	type want struct{ summary, start, end, category string }
	wants := []want{
		{"kafka: scheduled-change drain of node ip-10-0-1-2 (hold: pacing)", "20261121T120100Z", "", KindDrain},
		{"web: spot-interruption drain of nodeclaim web-a (hold: check)", "20261121T120200Z", "", KindDrain},
		{"kafka: maintenance window", "20261128T020000Z", "20261128T060000Z", KindWindow},
		{"kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)", "20261128T020000Z", "", KindDrain},
		{"kafka: maintenance window", "20261205T020000Z", "20261205T060000Z", KindWindow},
	}
	events := cal.Events()
	if len(events) != len(wants) {
		t.Fatalf("%d events, want %d:\n%s", len(events), len(wants), out)
	}
	// Entries sorts equal starts by UID; the drain and the window at 11-28 02:00 may come in
	// either order.
	bySummaryStart := map[string]*ics.VEvent{}
	for _, e := range events {
		bySummaryStart[prop(e, ics.ComponentPropertySummary)+"@"+prop(e, ics.ComponentPropertyDtStart)] = e
	}
	for _, w := range wants {
		e := bySummaryStart[w.summary+"@"+w.start]
		if e == nil {
			t.Errorf("no event %q at %s; have %v", w.summary, w.start, keys(bySummaryStart))
			continue
		}
		if got := prop(e, ics.ComponentPropertyDtEnd); got != w.end {
			t.Errorf("%s: DTEND %q, want %q", w.summary, got, w.end)
		}
		if got := prop(e, ics.ComponentPropertyCategories); got != w.category {
			t.Errorf("%s: CATEGORIES %q, want %q", w.summary, got, w.category)
		}
		for _, p := range []ics.ComponentProperty{ics.ComponentPropertyDtstamp, ics.ComponentPropertyLastModified} {
			if got := prop(e, p); got != "20261121T120000Z" {
				t.Errorf("%s: %s %q, want the report's time", w.summary, p, got)
			}
		}
		if got := prop(e, ics.ComponentPropertySequence); got != "0" {
			t.Errorf("%s: SEQUENCE %q, want 0", w.summary, got)
		}
		if !strings.HasPrefix(e.Id(), w.category+"-") {
			t.Errorf("%s: UID %q", w.summary, e.Id())
		}
	}
	// The description survives the escaping of ; , and newlines.
	e := bySummaryStart["web: spot-interruption drain of nodeclaim web-a (hold: check)@20261121T120200Z"]
	if e != nil {
		desc := prop(e, ics.ComponentPropertyDescription)
		for _, s := range []string{"Event: ev-spot", "Hold: check", "NodeClaim: web-a", "Reason: " + tricky.Reason} {
			if !strings.Contains(desc, s) {
				t.Errorf("description %q lacks %q", desc, s)
			}
		}
	}

	t.Run("nothing planned", func(t *testing.T) {
		out := write(t, New(DefaultHorizon), report(now, status.NodePool{Name: "default"}))
		if n := len(parse(t, out).Events()); n != 0 {
			t.Errorf("%d events in a calendar with nothing planned", n)
		}
	})
}

func keys(m map[string]*ics.VEvent) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestRevisions(t *testing.T) {
	c := New(DefaultHorizon)
	first := write(t, c, report(now, kafka()))
	if again := write(t, c, report(now.Add(time.Minute), kafka())); !bytes.Equal(first, again) {
		t.Errorf("an unchanged calendar changed when written again:\n%s\n%s", first, again)
	}

	// The pacing drain is decided again: a new until-time and reason, the same event.
	later := now.Add(10 * time.Minute)
	p := kafka()
	p.Deferred[0].Until, p.Deferred[0].Reason = later.Add(5*time.Minute), "held by max-concurrent-drains 1 again"
	cal := parse(t, write(t, c, report(later, p)))
	var drains int
	for _, e := range cal.Events() {
		if prop(e, ics.ComponentPropertyCategories) != KindDrain {
			continue
		}
		drains++
		seq, mod := prop(e, ics.ComponentPropertySequence), prop(e, ics.ComponentPropertyLastModified)
		switch e.Id() {
		case drainUID(t, "kafka", kafka().Deferred[0]):
			if seq != "1" || mod != "20261121T121000Z" || prop(e, ics.ComponentPropertyDtStart) != "20261121T121500Z" {
				t.Errorf("the re-decided drain: SEQUENCE %s, LAST-MODIFIED %s, DTSTART %s; want 1, its time, the new until", seq, mod, prop(e, ics.ComponentPropertyDtStart))
			}
		case drainUID(t, "kafka", kafka().Deferred[1]):
			if seq != "0" || mod != "20261121T120000Z" {
				t.Errorf("the unchanged drain: SEQUENCE %s, LAST-MODIFIED %s; want 0 and the first time", seq, mod)
			}
		default:
			t.Errorf("a drain with a new UID %s", e.Id())
		}
	}
	if drains != 2 {
		t.Errorf("%d drains, want 2", drains)
	}

	// A drain carried out is forgotten: deferred again later, it starts at SEQUENCE 0.
	p.Deferred = p.Deferred[1:]
	write(t, c, report(later, p))
	if _, ok := c.revisions["kafka"][drainUID(t, "kafka", kafka().Deferred[0])]; ok {
		t.Error("a drain no longer reported is still remembered")
	}
}
