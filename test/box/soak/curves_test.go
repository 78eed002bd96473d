package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// How the router's resource curves are judged, per process lifetime, by a least-squares slope
// over the samples after a warm-up (the informers' first sync, the first decisions).
//
// A lifetime of longSpan or more is judged strictly: a slope above its bound per hour (a share
// of the mean plus a floor) is growth without bound, which a four-hour soak, whose routers live
// 40 minutes on average, can tell from noise. A shorter lifetime, all a five-minute soak has,
// cannot: a minute of GC cycles and informer resyncs moves the heap and the goroutines by more
// than a leak would. So a short lifetime's slopes are reported, and fail only on gross growth:
// a slope that would double the mean within the lifetime itself.
const (
	longSpan   = 30 * time.Minute
	minSamples = 6
)

// measure is one curve sampled from the router: how to read it from a sample (the previous
// one too, for a rate), and its strict bound per hour: rel of the mean plus abs.
type measure struct {
	name, unit string
	value      func(prev, s sample) float64
	rel, abs   float64
}

const mib = 1 << 20

var measures = []measure{
	{name: "RSS", unit: "MiB", value: func(_, s sample) float64 { return s.rss / mib }, rel: 0.25, abs: 16},
	{name: "heap", unit: "MiB", value: func(_, s sample) float64 { return s.heap / mib }, rel: 0.25, abs: 16},
	{name: "goroutines", value: func(_, s sample) float64 { return s.goroutines }, rel: 0.10, abs: 20},
	{name: "open files", value: func(_, s sample) float64 { return s.fds }, rel: 0.10, abs: 5},
	{name: "API requests", unit: "/s", value: func(p, s sample) float64 { return (s.request - p.request) / s.at.Sub(p.at).Seconds() }, rel: 0.5, abs: 1},
}

// curve is one resource's line over one lifetime.
type curve struct {
	resource string
	unit     string
	life     int
	span     time.Duration
	samples  int
	mean     float64
	perHour  float64 // the slope
	verdict  string
	grows    bool
}

// judgeCurves fits a line to each resource of each router lifetime and fails the test for
// each that grows without bound.
func judgeCurves(t *testing.T, r *routerProc) []curve {
	r.mu.Lock()
	lives := slices.Clone(r.lives)
	r.mu.Unlock()
	var out []curve
	for _, l := range lives {
		r.mu.Lock()
		samples := slices.Clone(l.samples)
		r.mu.Unlock()
		if len(samples) == 0 {
			continue
		}
		// The warm-up: a tenth of the samples, at least a minute, at most five.
		warm := min(max(time.Minute, samples[len(samples)-1].at.Sub(l.started)/10), 5*time.Minute)
		var kept []sample
		for _, s := range samples {
			if s.at.Sub(l.started) >= warm {
				kept = append(kept, s)
			}
		}
		for _, res := range measures {
			c := curve{resource: res.name, unit: res.unit, life: l.n}
			var xs, ys []float64
			for i := 1; i < len(kept); i++ { // from the second: a rate needs the one before
				xs = append(xs, kept[i].at.Sub(l.started).Hours())
				ys = append(ys, res.value(kept[i-1], kept[i]))
			}
			c.samples = len(xs)
			if c.samples < minSamples {
				c.verdict = fmt.Sprintf("too short to judge (%d samples after a %s warm-up)", c.samples, warm.Round(time.Second))
				out = append(out, c)
				continue
			}
			c.span = time.Duration((xs[len(xs)-1] - xs[0]) * float64(time.Hour))
			c.perHour, c.mean = slope(xs, ys)
			bound := res.rel*c.mean + res.abs
			switch {
			case c.span >= longSpan && c.perHour > bound:
				c.grows, c.verdict = true, fmt.Sprintf("GROWS: over %.3g%s per hour", bound, res.unit)
			case c.span >= longSpan:
				c.verdict = fmt.Sprintf("flat (bound %.3g%s per hour)", bound, res.unit)
			case c.perHour*c.span.Hours() > c.mean+res.abs:
				c.grows, c.verdict = true, "GROWS: would double within the lifetime"
			default:
				c.verdict = "reported (a lifetime under 30m is judged on gross growth only)"
			}
			if c.grows {
				t.Errorf("router %d's %s grows without bound: %+.3g%s per hour over %s (mean %.3g%s, %d samples)",
					l.n, res.name, c.perHour, res.unit, c.span.Round(time.Second), c.mean, res.unit, c.samples)
			}
			out = append(out, c)
		}
	}
	return out
}

// slope returns the least-squares slope of ys over xs, and the mean of ys.
func slope(xs, ys []float64) (b, mean float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, sy / n
	}
	return (n*sxy - sx*sy) / d, sy / n
}

// table is the soak's summary: the events drawn by kind and what AWS did, the faults, the
// invariants checked and violated, the disruptions by cause, and the resource curves.
func table(aws *cloud, f *faults, chk *checker, r *routerProc, curves []curve) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	aws.mu.Lock()
	fmt.Fprintln(tw, "AWS\tcount\t")
	total := 0
	for _, k := range kinds {
		fmt.Fprintf(tw, "  drawn: %s\t%d\t\n", k.code, aws.drawn[k.code])
		total += aws.drawn[k.code]
	}
	fmt.Fprintf(tw, "  drawn in all\t%d\t\n", total)
	fmt.Fprintf(tw, "  cancelled before their start\t%d\t\n", aws.closes)
	fmt.Fprintf(tw, "  postponed\t%d\t\n", aws.postponed)
	outcomes := map[string]int{}
	for _, m := range aws.maints {
		if m.done {
			outcomes[m.outcome]++
		}
	}
	for _, o := range slices.Sorted(maps.Keys(outcomes)) {
		fmt.Fprintf(tw, "  at the start: %s\t%d\t\n", o, outcomes[o])
	}
	fmt.Fprintf(tw, "  draws with no instance free\t%d\t\n", aws.skips)
	fmt.Fprintf(tw, "  stand-in errors\t%d\t\n", aws.errs)
	aws.mu.Unlock()

	f.mu.Lock()
	r.mu.Lock()
	unexpected := 0
	for _, l := range r.lives {
		if !l.expected {
			unexpected++
		}
	}
	fmt.Fprintln(tw, "faults\t\t")
	for _, k := range faultKinds {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, f.counts[k])
	}
	fmt.Fprintf(tw, "  router processes\t%d\t\n", len(r.lives))
	fmt.Fprintf(tw, "  router exits on its own\t%d\t\n", unexpected)
	r.mu.Unlock()
	f.mu.Unlock()

	chk.mu.Lock()
	fmt.Fprintf(tw, "invariants (checker samples: %d, read errors: %d)\tchecked\tviolations\n", chk.samples, chk.errs)
	for _, inv := range invariants {
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", inv, chk.tallies[inv].checked, chk.tallies[inv].violations)
	}
	fmt.Fprintln(tw, "disruptions seen\t\t")
	for _, k := range slices.Sorted(maps.Keys(chk.counts)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, chk.counts[k])
	}
	chk.mu.Unlock()
	tw.Flush()

	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "router\tresource\tspan\tsamples\tmean\tslope per hour\tverdict")
	for _, c := range curves {
		if c.samples < minSamples {
			fmt.Fprintf(tw, "%d\t%s\t\t%d\t\t\t%s\n", c.life, c.resource, c.samples, c.verdict)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.3g%s\t%+.3g%s\t%s\n", c.life, c.resource, c.span.Round(time.Second), c.samples, c.mean, c.unit, c.perHour, c.unit, c.verdict)
	}
	tw.Flush()
	return b.String()
}
