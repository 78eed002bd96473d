package reference

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/calendar"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/router/watchdog"
)

// Metric is one Prometheus metric the router exports, as its collector describes it.
type Metric struct {
	Name, Type, Help string
	Labels           []string
}

// registrar is a package that registers Prometheus collectors, and how: its constructor,
// called with throwaway dependencies, as router/app calls it with real ones.
type registrar struct {
	// pkg is the package's directory under the module: router/poller.
	pkg      string
	register func(prometheus.Registerer) error
}

// registrars lists every package that registers collectors. A test fails when a package
// under router/ calls MustRegister or Register and is not here: a new one is one entry.
func registrars() []registrar {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return []registrar{
		{"router/metrics", func(r prometheus.Registerer) error {
			metrics.NewRouter(r, func() float64 { return 0 })
			return nil
		}},
		{"router/awscalls", func(r prometheus.Registerer) error { awscalls.NewCounter(r); return nil }},
		{"router/poller", func(r prometheus.Registerer) error {
			poller.New(nil, nil, nil, clk, log, r, poller.Options{})
			return nil
		}},
		{"router/watchdog", func(r prometheus.Registerer) error {
			watchdog.New(nil, nil, nil, checks.NewFeatureGates(), clk, r, watchdog.Options{})
			return nil
		}},
		{"router/calendar", func(r prometheus.Registerer) error { calendar.NewGauges(r, 0); return nil }},
		{"router/podnotice", func(r prometheus.Registerer) error {
			podnotice.New(nil, nil, clk, log, r, podnotice.Options{})
			return nil
		}},
		{"router/upcoming", func(r prometheus.Registerer) error { upcoming.New(nil, nil, nil, log, r); return nil }},
		{"router/inplace", func(r prometheus.Registerer) error {
			inplace.New(nil, nil, nil, nil, clk, nil, log, r, nil, inplace.Options{})
			return nil
		}},
		{"router/eventwindow", func(r prometheus.Registerer) error {
			eventwindow.New(nil, nil, nil, clk, log, r, "")
			return nil
		}},
		{"router/notify", func(r prometheus.Registerer) error {
			_, err := notify.New(notify.Options{URL: "http://receiver.invalid/"}, nil, clk, log, r)
			return err
		}},
	}
}

// recorder is a Registerer that keeps what is registered, and registers it with a real
// registry too, so that a clash of names fails here as it would in the router.
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

// Metrics builds every collector the router registers into a fresh registry and returns the
// metrics they describe, by name: the reference can list no metric that does not exist.
// controller-runtime's own metrics, served beside them, are not included.
func Metrics() ([]Metric, error) {
	rec := &recorder{reg: prometheus.NewRegistry()}
	for _, r := range registrars() {
		if err := r.register(rec); err != nil {
			return nil, fmt.Errorf("registering the metrics of %s: %w", r.pkg, err)
		}
	}
	// A metric that is not a vector has its one series already: Gather gives its type.
	families, err := rec.reg.Gather()
	if err != nil {
		return nil, err
	}
	gathered := map[string]string{}
	for _, f := range families {
		gathered[f.GetName()] = strings.ToLower(f.GetType().String())
	}
	var out []Metric
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m, err := parseDesc(d)
			if err != nil {
				return nil, err
			}
			if m.Type = vectorType(c); m.Type == "" {
				m.Type = gathered[m.Name]
			}
			if m.Type == "" {
				return nil, fmt.Errorf("%s (%T): no type: neither a vector nor a gathered series", m.Name, c)
			}
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b Metric) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// vectorType is the Prometheus type of a vector (which has no series until a label set is
// used, so Gather does not show it); "" for any other collector.
func vectorType(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.CounterVec:
		return "counter"
	case *prometheus.GaugeVec:
		return "gauge"
	case *prometheus.HistogramVec:
		return "histogram"
	case *prometheus.SummaryVec:
		return "summary"
	}
	return ""
}

// parseDesc reads a Desc's name, help and variable labels: client_golang exposes them only
// through String(), `Desc{fqName: "...", help: "...", unit: "...", constLabels: {...},
// variableLabels: {a,b}}`.
func parseDesc(d *prometheus.Desc) (Metric, error) {
	s := d.String()
	fail := func() (Metric, error) {
		return Metric{}, fmt.Errorf("cannot read %s: client_golang changed Desc.String", s)
	}
	quoted := func(field string) (string, bool) {
		i := strings.Index(s, field+": ")
		if i < 0 {
			return "", false
		}
		q, err := strconv.QuotedPrefix(s[i+len(field)+2:])
		if err != nil {
			return "", false
		}
		v, err := strconv.Unquote(q)
		return v, err == nil
	}
	name, ok := quoted("fqName")
	if !ok {
		return fail()
	}
	help, ok := quoted("help")
	if !ok {
		return fail()
	}
	labels, ok := strings.CutSuffix(s, "}}")
	if !ok {
		return fail()
	}
	i := strings.LastIndex(labels, "variableLabels: {")
	if i < 0 {
		return fail()
	}
	m := Metric{Name: name, Help: help}
	for l := range strings.SplitSeq(labels[i+len("variableLabels: {"):], ",") {
		if l != "" {
			m.Labels = append(m.Labels, l)
		}
	}
	return m, nil
}
