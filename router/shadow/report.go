package shadow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"golang.org/x/sync/singleflight"
	"io"
	"k8s.io/utils/clock"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// Report pairs, per pool, what the router would have done with what Karpenter did.
type Report struct {
	Pools []PoolReport `json:"pools"`
}

// PoolReport is one pool's entries and their summary lines.
type PoolReport struct {
	NodePool string   `json:"nodepool"`
	Summary  []string `json:"summary"`
	Entries  []Entry  `json:"entries"`
}

// TextAdopted marks, in the table, an entry carried over from an earlier router's ConfigMap.
const TextAdopted = "from an earlier router's ConfigMap, unverified"

// BuildReport groups entries by pool (and, for the summary, by kind and would-be action).
// nodepool, if set, keeps only that pool.
func BuildReport(entries []Entry, nodepool string) Report {
	byPool := map[string][]Entry{}
	for _, e := range entries {
		if nodepool != "" && e.NodePool != nodepool {
			continue
		}
		p := cmp.Or(e.NodePool, "(not Karpenter's)")
		byPool[p] = append(byPool[p], e)
	}
	var r Report
	for _, pool := range sortedKeys(byPool) {
		es := byPool[pool]
		slices.SortStableFunc(es, func(a, b Entry) int { return a.Decided.Compare(b.Decided) })
		r.Pools = append(r.Pools, PoolReport{NodePool: pool, Entries: es, Summary: summarise(pool, es)})
	}
	return r
}

// summarise writes one line per kind and would-be action: "Karpenter drained 3 nodes of kafka
// at 14:02 for scheduled-change (AWS's start 19 days later); the router would have deferred
// them to 2026-12-05 02:00 (window)".
func summarise(pool string, es []Entry) []string {
	type group struct {
		kind  event.Kind
		would policy.Action
	}
	groups := map[group][]Entry{}
	var order []group
	for _, e := range es {
		g := group{e.Kind, e.Would}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], e)
	}
	var lines []string
	for _, g := range order {
		gs := groups[g]
		var acted []Entry
		for _, e := range gs {
			if !e.KarpenterAt.IsZero() {
				acted = append(acted, e)
			}
		}
		router := fmt.Sprintf("the router would have %s %s", pastTense(g.would), nodes(len(gs), "them", "it"))
		if wouldAt := earliest(gs, func(e Entry) time.Time { return e.WouldAt }); g.would == policy.ActionDefer && !wouldAt.IsZero() {
			router += " to " + stamp(wouldAt)
			if h := gs[0].Hold; h != "" {
				router += " (" + string(h) + ")"
			}
		}
		start := earliest(gs, func(e Entry) time.Time { return e.Start })
		switch {
		case len(acted) == 0:
			lines = append(lines, fmt.Sprintf("%s of %s for %s: Karpenter drained none; %s", capital(nodes(len(gs), "", "")), pool, g.kind, router))
		default:
			first := earliest(acted, func(e Entry) time.Time { return e.KarpenterAt })
			when := ""
			if !start.IsZero() && start.After(first) {
				when = fmt.Sprintf(" (AWS's start %s later)", ahead(start.Sub(first)))
			}
			lines = append(lines, fmt.Sprintf("Karpenter drained %s of %s at %s for %s%s; %s", nodes(len(acted), "", ""), pool, stamp(first), g.kind, when, router))
		}
	}
	return lines
}

// WriteTable prints the report for people.
func (r Report) WriteTable(w io.Writer) error {
	if len(r.Pools) == 0 {
		_, err := fmt.Fprintln(w, "no would-be outcomes recorded: no pool is in shadow (healthrouter.io/mode=shadow, or --shadow), or no event came yet")
		return err
	}
	for i, p := range r.Pools {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "NodePool %s\n", p.NodePool)
		for _, s := range p.Summary {
			fmt.Fprintf(w, "  %s\n", s)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODECLAIM\tINSTANCE\tKIND\tEVENT\tAWS START\tROUTER WOULD\tAT\tKARPENTER\tREASON")
		for _, e := range p.Entries {
			karp := "-"
			if !e.KarpenterAt.IsZero() {
				karp = "drained " + stamp(e.KarpenterAt)
			}
			reason := oneLine(e.Reason, 80)
			if e.Adopted {
				reason = "(" + TextAdopted + ") " + reason
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cmp.Or(e.NodeClaim, "-"), e.Instance, e.Kind, e.EventID, orDash(e.Start),
				e.Would, orDash(e.WouldAt), karp, reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the report as JSON.
func (r Report) WriteJSON(w io.Writer) error {
	if r.Pools == nil {
		r.Pools = []PoolReport{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func pastTense(a policy.Action) string {
	switch a {
	case policy.ActionDrain:
		return "drained"
	case policy.ActionDefer:
		return "deferred"
	case policy.ActionIgnore:
		return "ignored"
	case policy.ActionRebootInPlace:
		return "rebooted in place"
	case policy.ActionSkip:
		return "skipped"
	}
	return string(a)
}

// nodes says "3 nodes", or, for the pronoun forms, "them"/"it".
func nodes(n int, many, one string) string {
	switch {
	case n == 1 && one != "":
		return one
	case n != 1 && many != "":
		return many
	case n == 1:
		return "1 node"
	}
	return fmt.Sprintf("%d nodes", n)
}

func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func earliest(es []Entry, at func(Entry) time.Time) time.Time {
	var t time.Time
	for _, e := range es {
		if v := at(e); !v.IsZero() && (t.IsZero() || v.Before(t)) {
			t = v
		}
	}
	return t
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST (Mon)") }

func orDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// ahead writes a lead in days, hours or minutes: "19 days", "5h", "40m".
func ahead(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", int(d.Round(24*time.Hour)/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%dh", int(d.Round(time.Hour)/time.Hour))
	}
	return fmt.Sprintf("%dm", int(d.Round(time.Minute)/time.Minute))
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Path is where the report is served (the metrics port under --metrics-secure, and the
// calendar's listener).
const Path = "/shadow"

// What /shadow answers on a failure: fixed texts, the detail in the router's log only (an API
// error names the namespace, the ConfigMap and the router's identity).
const (
	TextUnavailable = "the shadow report is unavailable; the router's log says why"
	TextBusy        = "too many shadow report requests at once; retry later"
)

// Bounds of /shadow, as the calendar's.
const (
	// DefaultMaxInFlight is how many requests are answered at once; the others get 503.
	DefaultMaxInFlight = 4
	// ledgerTTL is how long a read of the ledger answers requests: one read of the ConfigMap
	// per TTL whatever the request rate (the ledger flushes every few seconds anyway).
	ledgerTTL = 5 * time.Second
)

// HandlerOptions bounds /shadow.
type HandlerOptions struct {
	MaxInFlight int
	// Log receives the detail of every failure (the answer carries none); nil: discarded.
	Log *slog.Logger
	// Clock times the ledger's reads (nil: the real clock).
	Clock clock.PassiveClock
}

// Handler serves the report (text; ?o=json for JSON; ?nodepool=NAME for one pool), from the
// ledger read at most once per ledgerTTL (concurrent requests share the read), at most
// MaxInFlight requests at once, with fixed error texts.
func Handler(reader client.Reader, namespace, name string, opts HandlerOptions) http.Handler {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	inFlight := make(chan struct{}, opts.MaxInFlight)
	var (
		mu      sync.Mutex
		read    time.Time
		entries []Entry
		group   singleflight.Group
	)
	ledger := func(ctx context.Context) ([]Entry, error) {
		mu.Lock()
		if !read.IsZero() && opts.Clock.Since(read) < ledgerTTL {
			defer mu.Unlock()
			return entries, nil
		}
		mu.Unlock()
		v, err, _ := group.Do("ledger", func() (any, error) {
			es, err := ReadLedger(ctx, reader, namespace, name)
			if errors.Is(err, ErrNoLedger) {
				err = nil // the router serving this has recorded nothing yet
			}
			if err != nil {
				return nil, err
			}
			mu.Lock()
			entries, read = es, opts.Clock.Now()
			mu.Unlock()
			return es, nil
		})
		es, _ := v.([]Entry)
		return es, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			http.Error(w, "GET only", http.StatusMethodNotAllowed)
			return
		}
		select {
		case inFlight <- struct{}{}:
			defer func() { <-inFlight }()
		default:
			http.Error(w, TextBusy, http.StatusServiceUnavailable)
			return
		}
		entries, err := ledger(r.Context())
		if err != nil {
			opts.Log.Error("reading the shadow ledger", "namespace", namespace, "name", name, "err", err)
			http.Error(w, TextUnavailable, http.StatusServiceUnavailable)
			return
		}
		rep := BuildReport(entries, r.URL.Query().Get("nodepool"))
		if r.URL.Query().Get("o") == "json" {
			w.Header().Set("Content-Type", "application/json")
			_ = rep.WriteJSON(w)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_ = rep.WriteTable(w)
	})
}
