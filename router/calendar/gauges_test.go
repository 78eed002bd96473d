package calendar

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/status"
)

// planned reads the planned gauge's series as "nodepool/node/kind=unix seconds", sorted.
func planned(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != metrics.MaintenancePlanned {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, l[metrics.LabelNodePool]+"/"+l[metrics.LabelNode]+"/"+l[metrics.LabelKind]+"="+time.Unix(int64(m.GetGauge().GetValue()), 0).UTC().Format(time.RFC3339))
		}
	}
	sort.Strings(out)
	return out
}

func TestGauges(t *testing.T) {
	at := func(h int) time.Time { return now.Add(time.Duration(h) * time.Hour) }
	spot := func(d status.Deferred) status.Deferred { d.Kind = event.KindSpotInterruption; return d }
	for _, tc := range []struct {
		name     string
		limit    int
		reports  []status.Report // applied in turn; the last is checked
		want     []string
		overflow float64
	}{
		{
			name: "one series per node and kind, the earliest drain", limit: 10,
			reports: []status.Report{report(now, status.NodePool{Name: "kafka", Deferred: []status.Deferred{
				deferred("kafka-a", "ip-a", "ev-1", at(5), status.HoldWindow, ""),
				deferred("kafka-a", "ip-a", "ev-2", at(2), status.HoldPacing, ""),
				spot(deferred("kafka-a", "ip-a", "ev-3", at(1), status.HoldCheck, "")),
				deferred("kafka-b", "", "ev-4", at(3), status.HoldWindow, ""),
			}})},
			want: []string{
				"kafka/ip-a/scheduled-change=2026-11-21T14:00:00Z",
				"kafka/ip-a/spot-interruption=2026-11-21T13:00:00Z",
				"kafka/kafka-b/scheduled-change=2026-11-21T15:00:00Z", // no Node yet: the NodeClaim
			},
		},
		{
			name: "bounded: the earliest kept, the rest counted", limit: 2,
			reports: []status.Report{report(now,
				status.NodePool{Name: "a", Deferred: []status.Deferred{deferred("a-1", "n1", "e1", at(9), "", ""), deferred("a-2", "n2", "e2", at(1), "", "")}},
				status.NodePool{Name: "b", Deferred: []status.Deferred{deferred("b-1", "n3", "e3", at(4), "", ""), deferred("b-2", "n4", "e4", at(2), "", "")}},
			)},
			want:     []string{"a/n2/scheduled-change=2026-11-21T13:00:00Z", "b/n4/scheduled-change=2026-11-21T14:00:00Z"},
			overflow: 2,
		},
		{
			name: "stale series removed", limit: 2,
			reports: []status.Report{
				report(now, status.NodePool{Name: "a", Deferred: []status.Deferred{deferred("a-1", "n1", "e1", at(1), "", ""), deferred("a-2", "n2", "e2", at(2), "", ""), deferred("a-3", "n3", "e3", at(3), "", "")}}),
				// n1 drained; n2 re-decided later than n3, which comes back under the bound.
				report(now, status.NodePool{Name: "a", Deferred: []status.Deferred{deferred("a-2", "n2", "e2", at(8), "", ""), deferred("a-3", "n3", "e3", at(3), "", "")}}),
			},
			want: []string{"a/n2/scheduled-change=2026-11-21T20:00:00Z", "a/n3/scheduled-change=2026-11-21T15:00:00Z"},
		},
		{
			name: "nothing planned any more", limit: 2,
			reports: []status.Report{
				report(now, status.NodePool{Name: "a", Deferred: []status.Deferred{deferred("a-1", "n1", "e1", at(1), "", ""), deferred("a-2", "n2", "e2", at(2), "", ""), deferred("a-3", "n3", "e3", at(3), "", "")}}),
				report(now, status.NodePool{Name: "a"}),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			g := NewGauges(reg, tc.limit)
			for _, r := range tc.reports {
				g.Update(r)
			}
			if got := planned(t, reg); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("series\n %v\nwant\n %v", got, tc.want)
			}
			if got := testutil.ToFloat64(g.overflow); got != tc.overflow {
				t.Errorf("overflow %v, want %v", got, tc.overflow)
			}
		})
	}

	t.Run("default bound", func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		g := NewGauges(reg, 0)
		var ds []status.Deferred
		for i := range DefaultSeriesLimit + 7 {
			n := "n" + time.Duration(i).String()
			ds = append(ds, deferred(n, n, "e", at(i), "", ""))
		}
		g.Update(report(now, status.NodePool{Name: "big", Deferred: ds}))
		if n := len(planned(t, reg)); n != DefaultSeriesLimit {
			t.Errorf("%d series, want the default bound %d", n, DefaultSeriesLimit)
		}
		if got := testutil.ToFloat64(g.overflow); got != 7 {
			t.Errorf("overflow %v, want 7", got)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %v", problems, err)
		}
	})
}
