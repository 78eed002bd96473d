package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// claimRow is what the demo shows of one NodeClaim: its state, and each decision the router
// made for it with why, from the Events the router posted on it.
type claimRow struct {
	Name, Pool, State string
	Outcomes          []outcome
}

// outcome is one of the router's Events on a NodeClaim.
type outcome struct {
	Time   time.Time
	Event  string // the event's kind and the start of its ID
	Action string // the Event's action: Drain, Defer, Ignore, CancelDeferral, ...
	Reason string // why, as the router wrote it
}

// readClaims reads the NodeClaims and the router's Events on them.
func readClaims(ctx context.Context, kube client.Client, names []string) ([]claimRow, error) {
	var evs eventsv1.EventList
	if err := kube.List(ctx, &evs); err != nil {
		return nil, fmt.Errorf("listing Events: %w", err)
	}
	byClaim := map[string][]outcome{}
	for _, e := range evs.Items {
		if e.Regarding.Kind != "NodeClaim" {
			continue
		}
		ev, why := splitNote(e.Note)
		t := e.EventTime.Time
		if t.IsZero() {
			t = e.DeprecatedLastTimestamp.Time
		}
		byClaim[e.Regarding.Name] = append(byClaim[e.Regarding.Name], outcome{Time: t, Event: ev, Action: e.Action, Reason: why})
	}
	names = append([]string(nil), names...)
	sort.Strings(names)
	var rows []claimRow
	for _, name := range names {
		nc := &karpv1.NodeClaim{}
		if err := kube.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return nil, err
		}
		outs := byClaim[name]
		sort.SliceStable(outs, func(i, j int) bool { return outs[i].Time.Before(outs[j].Time) })
		mem, err := record.Load(ctx, kube, name)
		if err != nil {
			return nil, err
		}
		rows = append(rows, claimRow{Name: name, Pool: nc.Labels[karpv1.NodePoolLabelKey], State: claimState(nc, mem), Outcomes: outs})
	}
	return rows, nil
}

// claimState is where the NodeClaim stands now, by the router's memory of it.
func claimState(nc *karpv1.NodeClaim, mem record.Memory) string {
	switch {
	case !nc.DeletionTimestamp.IsZero():
		return "DELETED (Karpenter drains it)"
	case mem.Drain != nil:
		return "drain signalled"
	}
	// The reasons say until when and why; the state says what holds the NodeClaim.
	var holds []string
	var until time.Time
	for _, d := range mem.Records {
		if d.Active() {
			if !slices.Contains(holds, string(d.Hold)) {
				holds = append(holds, string(d.Hold))
			}
			if until.IsZero() || d.Until.Before(until) {
				until = d.Until
			}
		}
	}
	if len(holds) > 0 {
		return fmt.Sprintf("deferred to %s (%s)", until.UTC().Format("01-02 15:04"), strings.Join(holds, ", "))
	}
	return "running"
}

// splitNote takes the router's Event note apart: "<kind> (<event id>): <why>" or
// "<kind> (<event id>) deferred until <time>: <why>". A note of another form is all reason.
func splitNote(note string) (event, why string) {
	i := strings.Index(note, " (")
	j := strings.Index(note, ")")
	if i <= 0 || j < i {
		return "-", note
	}
	id := note[i+2 : j]
	if len(id) > 8 {
		id = id[:8]
	}
	return note[:i] + " " + id, strings.TrimPrefix(strings.TrimSpace(note[j+1:]), ": ")
}

// writeClaims prints one line per decision, the NodeClaim's name, pool and state on its
// first: what the router did, and why.
func writeClaims(w io.Writer, rows []claimRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODECLAIM\tNODEPOOL\tSTATE\tEVENT\tOUTCOME\tREASON")
	for _, r := range rows {
		if len(r.Outcomes) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\tno event named its instance\n", r.Name, r.Pool, r.State)
			continue
		}
		for i, o := range r.Outcomes {
			name, pool, state := r.Name, r.Pool, r.State
			if i > 0 {
				name, pool, state = "", "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, pool, state, o.Event, o.Action, o.Reason)
		}
	}
	return tw.Flush()
}
