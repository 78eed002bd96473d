package box_test

import (
	"context"
	"fmt"
	"image/color"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// sideRun is what one run of TestBoxSideBySide measured: its window and AWS's start (the
// same offsets from the world's start in both runs), when the event was sent, when the node
// was drained (Karpenter deleted its NodeClaim), and the Ready brokers over time.
type sideRun struct {
	name                      string
	opens, aws, sent, drained time.Time
	samples                   []readySample
	least                     int
	belowPDB                  time.Duration // time with fewer Ready brokers than the PDB's minimum (2)
	replaced                  int           // NodeClaims Karpenter launched after the event
	lost                      int           // events neither Karpenter nor the router acted on
}

// begin starts a run's measure: its window opens at opens, AWS acts sideAWSAfterOpen later.
func (k *kafkaWorld) begin(name string, opens time.Time) sideRun {
	return sideRun{name: name, opens: opens, aws: opens.Add(sideAWSAfterOpen)}
}

// finish completes r from the world: the samples, the least Ready, the time below the PDB's
// minimum, the NodeClaims launched since the event, and whether the event was acted on.
func (k *kafkaWorld) finish(t *testing.T, r sideRun) sideRun {
	t.Helper()
	r.samples = k.samples()
	r.least = k.low()
	for i := 1; i < len(r.samples); i++ {
		if r.samples[i-1].ready < 2 {
			r.belowPDB += r.samples[i].at.Sub(r.samples[i-1].at)
		}
	}
	var list karpv1.NodeClaimList
	if err := k.c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	for _, nc := range list.Items {
		if nc.CreationTimestamp.After(r.sent) {
			r.replaced++
		}
	}
	if r.drained.IsZero() {
		r.lost = 1
	}
	return r
}

// outsideWindow counts the disruptions (a fall in Ready brokers) that began outside the
// window [opens, opens+sideWindow] and before AWS's start: the ones the owners did not want.
func (r sideRun) outsideWindow() int {
	n := 0
	for i := 1; i < len(r.samples); i++ {
		at := r.samples[i].at
		if r.samples[i].ready < r.samples[i-1].ready && (at.Before(r.opens) || at.After(r.opens.Add(sideWindow))) && at.Before(r.aws) {
			n++
		}
	}
	return n
}

// sideTable is the runs side by side, one column each.
func sideTable(runs []sideRun) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	row := func(what string, f func(sideRun) string) {
		fmt.Fprintf(tw, "%s", what)
		for _, r := range runs {
			fmt.Fprintf(tw, "\t%s", f(r))
		}
		fmt.Fprintln(tw)
	}
	row("kafka (3 brokers, PDB maxUnavailable 1)", func(r sideRun) string { return r.name })
	row("disruptions outside its window", func(r sideRun) string { return fmt.Sprint(r.outsideWindow()) })
	row("node drained, after the event", func(r sideRun) string { return r.drained.Sub(r.sent).Round(100 * time.Millisecond).String() })
	row("node drained, against the window", func(r sideRun) string {
		switch d := r.drained.Sub(r.opens); {
		case d < 0:
			return (-d).Round(time.Second).String() + " before it opens"
		case d > sideWindow:
			return (d - sideWindow).Round(time.Second).String() + " after it closes"
		default:
			return d.Round(time.Second).String() + " after it opens"
		}
	})
	row("node emptied before AWS's start by", func(r sideRun) string { return r.aws.Sub(r.drained).Round(time.Second).String() })
	row("least Ready brokers", func(r sideRun) string { return fmt.Sprintf("%d of 3", r.least) })
	row("time below the PDB's minimum (2)", func(r sideRun) string { return r.belowPDB.String() })
	row("nodes replaced", func(r sideRun) string { return fmt.Sprint(r.replaced) })
	row("events lost", func(r sideRun) string { return fmt.Sprint(r.lost) })
	_ = tw.Flush()
	return b.String()
}

// sidePlot draws Ready brokers over time, both runs on one axis: the time from the opening of
// each run's window (the same policy, at the same offsets from its world's start), with the
// window, AWS's start and when each run's event was sent marked, as a PNG at path.
func sidePlot(runs []sideRun, path string) error {
	p := plot.New()
	p.Title.Text = "kafka Ready brokers through one AWS retirement: Karpenter alone vs the router in front"
	p.X.Label.Text = "seconds from the opening of the owners' maintenance window"
	p.Y.Label.Text = "Ready brokers"
	p.Y.Min, p.Y.Max = 0, 3.6
	colors := []color.Color{color.RGBA{R: 200, G: 40, B: 40, A: 255}, color.RGBA{R: 30, G: 90, B: 200, A: 255}}
	minX := 0.0
	for i, r := range runs {
		pts := make(plotter.XYs, 0, len(r.samples))
		for _, s := range r.samples {
			if !s.at.Before(r.sent.Add(-10 * time.Second)) {
				pts = append(pts, plotter.XY{X: s.at.Sub(r.opens).Seconds(), Y: float64(s.ready)})
			}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color = colors[i%len(colors)]
		line.Width = vg.Points(2)
		if i > 0 {
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(line)
		p.Legend.Add(r.name+" (until its node was replaced)", line)
		sent, err := plotter.NewScatter(plotter.XYs{{X: r.sent.Sub(r.opens).Seconds(), Y: 3.3}})
		if err != nil {
			return err
		}
		sent.Color = line.Color
		p.Add(sent)
		p.Legend.Add("event sent ("+r.name+")", sent)
		minX = min(minX, r.sent.Sub(r.opens).Seconds())
	}
	mark := func(x float64, label string, c color.Color) error {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: 3.5}})
		if err != nil {
			return err
		}
		l.Color = c
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
		p.Legend.Add(label, l)
		return nil
	}
	if err := mark(0, "the window opens", color.RGBA{G: 150, A: 255}); err != nil {
		return err
	}
	if err := mark(sideWindow.Seconds(), "the window closes", color.RGBA{G: 90, A: 255}); err != nil {
		return err
	}
	if err := mark(sideAWSAfterOpen.Seconds(), "AWS's start", color.Black); err != nil {
		return err
	}
	p.X.Min, p.X.Max = minX-20, sideAWSAfterOpen.Seconds()+20
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(-90), vg.Points(40)
	return p.Save(12*vg.Inch, 5*vg.Inch, path)
}
