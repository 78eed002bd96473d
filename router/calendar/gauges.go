package calendar

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/status"
)

// DefaultSeriesLimit is the default bound on the planned-maintenance series.
const DefaultSeriesLimit = 500

// Gauges exports the planned drains as Prometheus gauges:
// health_router_maintenance_planned_timestamp_seconds{nodepool,node,kind}, the Unix time of
// the earliest planned drain (a deferral's until-time) per NodePool, Node and event kind.
//
// Cardinality is bounded: at most the limit given to NewGauges (DefaultSeriesLimit, 500, by
// default) series are exported, the earliest first; the planned drains left out are counted
// in health_router_maintenance_planned_overflow. A series whose drain is no longer planned
// (carried out, cancelled, or pushed past the bound) is removed at the next Update.
type Gauges struct {
	limit    int
	planned  *prometheus.GaugeVec
	overflow prometheus.Gauge

	mu   sync.Mutex
	have map[series]bool // the label sets exported now
}

// series is one label set of the planned gauge.
type series struct{ pool, node, kind string }

// NewGauges returns Gauges exporting at most limit series (DefaultSeriesLimit when limit is
// not positive), registered with reg.
func NewGauges(reg prometheus.Registerer, limit int) *Gauges {
	if limit <= 0 {
		limit = DefaultSeriesLimit
	}
	g := &Gauges{
		limit: limit,
		planned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metrics.MaintenancePlanned,
			Help: "Unix time of the earliest drain the router plans (a deferred event's until-time), per NodePool, Node (the NodeClaim before its Node registers) and event kind, refreshed every minute by the leader; at most a bounded number of series (500 by default), the earliest first.",
		}, []string{metrics.LabelNodePool, metrics.LabelNode, metrics.LabelKind}),
		overflow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metrics.MaintenancePlannedOverflow,
			Help: "Planned drains (NodePool, Node and kind) left out of " + metrics.MaintenancePlanned + " by its bound on series.",
		}),
		have: map[series]bool{},
	}
	reg.MustRegister(g.planned, g.overflow)
	return g
}

// Update replaces the gauges with the drains planned in rep, which must be the report of
// every NodePool (status.Read with no pool): a pool missing from it loses its series.
func (g *Gauges) Update(rep status.Report) {
	earliest := map[series]float64{}
	for _, p := range rep.NodePools {
		for _, d := range p.Deferred {
			node := d.Node
			if node == "" {
				node = d.NodeClaim // no Node registered yet: the NodeClaim names the machine
			}
			s := series{pool: p.Name, node: node, kind: string(d.Kind)}
			at := float64(d.Until.Unix())
			if v, ok := earliest[s]; !ok || at < v {
				earliest[s] = at
			}
		}
	}
	all := make([]series, 0, len(earliest))
	for s := range earliest {
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool {
		a, b := all[i], all[j]
		if earliest[a] != earliest[b] {
			return earliest[a] < earliest[b]
		}
		if a.pool != b.pool {
			return a.pool < b.pool
		}
		if a.node != b.node {
			return a.node < b.node
		}
		return a.kind < b.kind
	})
	kept := all[:min(len(all), g.limit)]

	g.mu.Lock()
	defer g.mu.Unlock()
	now := make(map[series]bool, len(kept))
	for _, s := range kept {
		g.planned.WithLabelValues(s.pool, s.node, s.kind).Set(earliest[s])
		now[s] = true
	}
	for s := range g.have {
		if !now[s] {
			g.planned.DeleteLabelValues(s.pool, s.node, s.kind)
		}
	}
	g.have = now
	g.overflow.Set(float64(len(all) - len(kept)))
}
