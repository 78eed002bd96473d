// Package dashboard_test checks the chart's Grafana dashboard
// (deploy/charts/health-router/dashboards/health-router.json) against the router: every
// PromQL expression parses (Prometheus's own parser), and every metric it reads is one the
// router registers, as its constructors register them. A renamed metric breaks this test,
// not a panel on a night of maintenance. No server is needed.
package dashboard_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/calendar"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/router/watchdog"
	"github.com/health-router/health-router/test/harness"
)

// prometheusOwn are series Prometheus writes itself for every target, which the dashboard
// may read beside the router's: up is the heartbeat panel.
var prometheusOwn = map[string]bool{"up": true}

// histogramSuffixes are the series a histogram is exposed as.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// recorder is a Registerer that keeps what is registered, and registers it with a real
// registry too (so a clash of names still fails, as in the router).
type recorder struct {
	reg        *prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// fqName reads a Desc's name: client_golang exposes it only through String().
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// routerMetrics builds every collector of the router (grep MustRegister under router/) and
// returns the series names they export, histograms with their suffixes.
func routerMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &recorder{reg: prometheus.NewRegistry()}
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	metrics.NewRouter(rec, func() float64 { return 0 })
	awscalls.NewCounter(rec)
	poller.New(nil, nil, nil, clk, log, rec, poller.Options{})
	watchdog.New(nil, nil, nil, checks.NewFeatureGates(), clk, rec, watchdog.Options{})
	calendar.NewGauges(rec, 0)

	names := map[string]bool{}
	for _, c := range rec.collectors {
		histogram := false
		switch c.(type) {
		case prometheus.Histogram, *prometheus.HistogramVec:
			histogram = true
		}
		ch := make(chan *prometheus.Desc, 16)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s: client_golang changed Desc.String", d)
			}
			if histogram {
				for _, s := range histogramSuffixes {
					names[m[1]+s] = true
				}
				continue
			}
			names[m[1]] = true
		}
	}
	// A sanity check on the collection itself: the names router/metrics defines are there.
	for _, n := range []string{metrics.Decisions, metrics.AWSCalls, metrics.PollerPolls, metrics.WatchdogStuckEmpty, metrics.MaintenancePlanned, metrics.MaintenancePlannedOverflow, metrics.EventLatency + "_bucket"} {
		if !names[n] {
			t.Fatalf("the router's collectors lack %s: %v", n, names)
		}
	}
	return names
}

func dashboardPath(t *testing.T) string {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", "charts", "health-router", "dashboards", "health-router.json")
}

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ X, Y, W, H int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type variable struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Definition string `json:"definition"`
}

func load(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath(t))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	return d
}

// grafanaRanges are Grafana's interval variables, which stand where PromQL wants a duration.
var grafanaRanges = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)(_s|_ms)?\}?`)

// labelValues is a query variable's label_values(<selector>, label).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// promql parses the PromQL a Prometheus accepts without feature flags (no experimental
// functions): the dashboard must work on a stock kube-prometheus-stack.
var promql = parser.NewParser(parser.Options{})

// metricNames parses expr and returns the metric names it selects.
func metricNames(expr string) ([]string, error) {
	e, err := promql.ParseExpr(grafanaRanges.ReplaceAllString(expr, "5m"))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		names = append(names, name)
		return nil
	})
	return names, nil
}

func flatten(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatten(p.Panels)...)
	}
	return out
}

func TestDashboard(t *testing.T) {
	exported := routerMetrics(t)
	d := load(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: the sidecar's Grafana needs both", d.UID, d.Title)
	}

	used := map[string]bool{}
	check := func(where, expr string) {
		names, err := metricNames(expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, expr, err)
			return
		}
		if len(names) == 0 {
			t.Errorf("%s: %q reads no metric", where, expr)
		}
		for _, n := range names {
			used[n] = true
			if !exported[n] && !prometheusOwn[n] {
				t.Errorf("%s: %q reads %s, which the router does not export", where, expr, n)
			}
		}
	}

	ids := map[int]string{}
	targets := 0
	for _, p := range flatten(d.Panels) {
		where := "panel " + p.Title
		if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id %d is also %s's", where, p.ID, other)
		}
		ids[p.ID] = p.Title
		if p.GridPos.X < 0 || p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside Grafana's 24 columns", where, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want the ${datasource} variable (no UID of someone's Grafana)", where, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		for _, tg := range p.Targets {
			targets++
			check(where+" "+tg.RefID, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, v.Definition)
			continue
		}
		check("variable "+v.Name, m[1])
	}
	if targets < 10 {
		t.Errorf("%d queries: the dashboard lost its panels", targets)
	}

	// The panels the issue asks for: the CloudWatch dashboard's, from the router's series,
	// and the planned-maintenance timeline from the new gauges.
	for _, n := range []string{
		metrics.MessagesReceived, metrics.MessagesDeadLettered, metrics.DeferredEvents, metrics.Decisions,
		metrics.EventLatency + "_bucket", metrics.AWSCalls, metrics.WatchdogStuckEmpty, metrics.WatchdogUnavailableImage,
		metrics.WatchdogReservationDrift, "up", metrics.MaintenancePlanned, metrics.MaintenancePlannedOverflow,
	} {
		if !used[n] {
			t.Errorf("no panel reads %s", n)
		}
	}
	var unused []string
	for n := range exported {
		if !used[n] && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") {
			unused = append(unused, n)
		}
	}
	slices.Sort(unused)
	t.Logf("router metrics no panel reads: %v", unused)
}

// TestMetricNames checks the test's own parser walk: a misspelt name is caught, a histogram's
// suffixes and Prometheus's up are accepted.
func TestMetricNames(t *testing.T) {
	exported := routerMetrics(t)
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum(rate(health_router_decisions_total{job=~"$job"}[$__rate_interval]))`, true},
		{`histogram_quantile(0.9, sum by (le) (rate(health_router_intake_event_latency_seconds_bucket[5m])))`, true},
		{`{__name__="health_router_poller_instances"}`, true},
		{`sum(up{job=~"$job"})`, true},
		{`sum(rate(health_router_decision_decision_total[5m]))`, false},
		{`health_router_intake_event_latency_seconds`, false}, // a histogram has no bare series
	} {
		names, err := metricNames(tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		ok := len(names) > 0
		for _, n := range names {
			ok = ok && (exported[n] || prometheusOwn[n])
		}
		if ok != tc.ok {
			t.Errorf("%q (names %v): accepted %t, want %t", tc.expr, names, ok, tc.ok)
		}
	}
	if _, err := metricNames(`sum(rate(x[5m])`); err == nil {
		t.Error("an unbalanced expression parses")
	}
}
