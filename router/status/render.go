package status

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as one indented JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people: a block per NodePool.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "Router state at %s\n", stamp(r.Now))
	if len(r.NodePools) == 0 {
		fmt.Fprintln(w, "\nNo NodePools.")
	}
	for _, p := range r.NodePools {
		fmt.Fprintf(w, "\nNodePool %s (%d %s)\n", p.Name, p.Nodes, plural(p.Nodes, "NodeClaim", "NodeClaims"))
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  policy:\t%s\n", p.Policy)
		for _, pr := range p.Problems {
			fmt.Fprintf(tw, "  ignored:\t%s\n", pr)
		}
		fmt.Fprintf(tw, "  window:\t%s\n", windowLine(p.Window, r.Now))
		fmt.Fprintf(tw, "  drains:\t%s\n", drainsLine(p))
		fmt.Fprintf(tw, "  deferred:\t%s\n", deferredLine(p))
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(p.Drains) > 0 {
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "    DRAINING\tNODE\tSTATE\tSINCE\tEVENT")
			for _, d := range p.Drains {
				state := "signalled"
				if d.Deleting {
					state = "deleting"
				}
				if d.InPlace != "" {
					state = "reboot in place: " + d.InPlace
				}
				since := "-"
				if d.Since != nil {
					since = stamp(*d.Since)
				}
				fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", d.NodeClaim, dash(d.Node), state, since, dash(d.EventID))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if len(p.Deferred) > 0 {
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "    DEFERRED\tNODE\tKIND\tUNTIL\tHOLD\tEVENT\tREASON")
			for _, d := range p.Deferred {
				fmt.Fprintf(tw, "    %s\t%s\t%s\t%s (%s)\t%s\t%s\t%s\n", d.NodeClaim, dash(d.Node), d.Kind, stamp(d.Until), in(d.Until, r.Now), d.Hold, d.EventID, d.Reason)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	return r.writeNodes(w)
}

// writeNodes prints the router's drains of Nodes Karpenter does not manage.
func (r Report) writeNodes(w io.Writer) error {
	if len(r.Nodes) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nNodes Karpenter does not manage, drained by the router (%d)\n", len(r.Nodes))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    NODE\tINSTANCE\tSTATE\tSINCE\tKIND\tEVENT")
	for _, d := range r.Nodes {
		state := "cordoned, draining"
		switch {
		case d.Done && d.Release != nil:
			state = "drained, cordoned until " + stamp(*d.Release)
		case d.Done:
			state = "drained"
		}
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\t%s\n", d.Node, dash(d.Instance), state, stamp(d.Since), d.Kind, d.EventID)
	}
	return tw.Flush()
}

func windowLine(w *Window, now time.Time) string {
	if w == nil {
		return "none (deferred events wait for their deadline minus drain-lead)"
	}
	var s string
	if w.Open {
		s = fmt.Sprintf("OPEN now, closes %s (%s)", stamp(*w.OpenUntil), in(*w.OpenUntil, now))
		if w.Next != nil {
			s += fmt.Sprintf("; then opens %s", stamp(*w.Next))
		}
		return s
	}
	if w.Next == nil {
		return fmt.Sprintf("closed; %q never opens again", w.Schedule)
	}
	return fmt.Sprintf("closed; opens %s (%s) for %s", stamp(*w.Next), in(*w.Next, now), w.Duration)
}

func drainsLine(p NodePool) string {
	limit := "no limit"
	if p.DrainLimit != nil {
		limit = fmt.Sprintf("limit %d", *p.DrainLimit)
		if p.DrainsInFlight >= *p.DrainLimit {
			limit += ", FULL: further drains wait"
		}
	}
	return fmt.Sprintf("%d in flight (%s)", p.DrainsInFlight, limit)
}

func deferredLine(p NodePool) string {
	if len(p.Deferred) == 0 {
		return "none"
	}
	counts := map[string]int{}
	var order []string
	for _, d := range p.Deferred {
		if counts[d.Hold] == 0 {
			order = append(order, d.Hold)
		}
		counts[d.Hold]++
	}
	var parts []string
	for _, h := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[h], holdWords(h)))
	}
	return fmt.Sprintf("%d %s: %s; next at %s", len(p.Deferred), plural(len(p.Deferred), "event", "events"), strings.Join(parts, ", "), stamp(p.Deferred[0].Until))
}

func holdWords(h string) string {
	switch h {
	case HoldCheck:
		return "HELD BY A CHECK (replacement not sound)"
	case HoldPacing:
		return "held by max-concurrent-drains"
	case HoldWindow:
		return "waiting for the window"
	case HoldDeadline:
		return "waiting for deadline minus drain-lead"
	case HoldRestartGrace:
		return "in restart-grace"
	case HoldPDB:
		return "held by a PodDisruptionBudget at zero"
	case HoldAlerts:
		return "held by firing alerts"
	}
	return "held (" + h + ")"
}

// in says how far t is from now, rounded to the minute: "in 2d3h", "5m ago".
func in(t, now time.Time) string {
	d := t.Sub(now).Round(time.Minute)
	ago := d < 0
	if ago {
		d = -d
	}
	days, hours, mins := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour), int(d%time.Hour/time.Minute)
	var s string
	for _, part := range []struct {
		n    int
		unit string
	}{{days, "d"}, {hours, "h"}, {mins, "m"}} {
		if part.n > 0 {
			s += fmt.Sprintf("%d%s", part.n, part.unit)
		}
	}
	if s == "" {
		return "now"
	}
	if ago {
		return s + " ago"
	}
	return "in " + s
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
