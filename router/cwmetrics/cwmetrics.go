// Package cwmetrics publishes the router's dashboard and alarm metrics to CloudWatch. The
// router's hot path only adds to in-memory aggregates under a mutex; Run sends them with
// PutMetricData once per interval, with a Heartbeat every time, so that the "router silent"
// alarm fires when the router stops, not when it is merely idle.
//
// Names and dimensions come from router/metrics, which the Terraform dashboard and alarms are
// checked against.
package cwmetrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/metrics"
)

// metricsAPI is the part of CloudWatch the publisher uses.
type metricsAPI interface {
	PutMetricData(context.Context, *cloudwatch.PutMetricDataInput, ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error)
}

// MaxDatumsPerCall is the most datums one PutMetricData call carries: the API accepts at most
// 1000 metrics per request (and 1 MB; a datum here is a few hundred bytes, so 1000 of them stay
// far below that).
const MaxDatumsPerCall = 1000

// maxPendingSeries bounds the distinct series (metric and dimension values) held between
// flushes, new ones and those kept from failed publishes alike, so that memory stays bounded
// while CloudWatch is unreachable or if a caller passes unbounded dimension values. The router
// produces a few dozen; beyond the bound new series are dropped and counted, existing ones keep
// adding up.
const maxPendingSeries = 2 * MaxDatumsPerCall

// finalFlushTimeout bounds the flush Run makes after its context is done, within the pod's
// shutdown budget.
const finalFlushTimeout = 5 * time.Second

// maxDimensionValueLen is CloudWatch's limit on a dimension value; emptyDimensionValue stands
// in for an empty one, which CloudWatch rejects (and with it the whole batch).
const (
	maxDimensionValueLen = 1024
	emptyDimensionValue  = "unknown"
)

// series names one CloudWatch series: a metric and the values of its dimensions after
// ClusterName (empty for dimensions the metric does not have).
type series struct {
	metric, kind, action, api, finding string
}

// stat aggregates the values added to a series in an interval. Counters use only sum.
type stat struct {
	count, sum, min, max float64
}

func one(v float64) stat { return stat{count: 1, sum: v, min: v, max: v} }

func (s *stat) merge(o stat) {
	if s.count == 0 {
		*s = o
		return
	}
	s.count += o.count
	s.sum += o.sum
	s.min = min(s.min, o.min)
	s.max = max(s.max, o.max)
}

// Publisher aggregates the router's metrics in memory and publishes them to CloudWatch. Its
// methods are safe for concurrent use. The recording methods (Decision, DeadLettered, Latency,
// AWSCallError, SetDeferred) of a nil *Publisher do nothing, so that the router needs no check
// when CloudWatch publishing is off; Run and Flush need a Publisher from New.
type Publisher struct {
	api     metricsAPI
	cluster string
	clock   clock.Clock
	log     *slog.Logger

	mu          sync.Mutex
	pending     map[series]stat
	deferred    int
	deferredSet bool
	watchdog    map[string]int
	dropped     int // series dropped at maxPendingSeries since the last flush
}

// New returns a Publisher that publishes with api, under the ClusterName dimension
// clusterName.
func New(api metricsAPI, clusterName string, clk clock.Clock, log *slog.Logger) *Publisher {
	return &Publisher{
		api:     api,
		cluster: dimensionValue(clusterName),
		clock:   clk,
		log:     log,
		pending: map[series]stat{},
	}
}

// Decision counts a decision of an event kind (scheduled-change, ...) with an action (drain,
// defer, ...).
func (p *Publisher) Decision(kind, action string) {
	p.add(series{metric: metrics.CWDecisions, kind: dimensionValue(kind), action: dimensionValue(action)}, one(1))
}

// DeadLettered counts a message sent to the dead-letter queue.
func (p *Publisher) DeadLettered() {
	p.add(series{metric: metrics.CWDeadLettered}, one(1))
}

// Latency records the time from an event to its outcome. A negative d (an event stamped
// ahead of this clock) counts as zero.
func (p *Publisher) Latency(d time.Duration) {
	ms := float64(max(d, 0)) / float64(time.Millisecond)
	p.add(series{metric: metrics.CWEventLatency}, one(ms))
}

// AWSCallError counts an AWS call that failed after the SDK's retries, by API
// (DescribeImages, ReceiveMessage, ...).
func (p *Publisher) AWSCallError(api string) {
	p.add(series{metric: metrics.CWAWSCallErrors, api: dimensionValue(api)}, one(1))
}

// SetDeferred sets the number of events deferred now. The latest value is published at every
// flush from then on.
func (p *Publisher) SetDeferred(n int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deferred, p.deferredSet = max(n, 0), true
}

// SetWatchdog sets the latest count of each watchdog finding (stuck-empty,
// unavailable-image, reservation-drift); they are published at every flush as
// WatchdogFindings{Finding}.
func (p *Publisher) SetWatchdog(counts map[string]int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watchdog = maps.Clone(counts)
}

func (p *Publisher) add(s series, v stat) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mergeLocked(s, v)
}

// mergeLocked adds v to the series s, or drops it when s is new and maxPendingSeries are
// held already. p.mu must be held.
func (p *Publisher) mergeLocked(s series, v stat) {
	cur, ok := p.pending[s]
	if !ok && len(p.pending) >= maxPendingSeries {
		p.dropped++
		return
	}
	cur.merge(v)
	p.pending[s] = cur
}

// Run flushes every interval until ctx is done, then flushes once more (within
// finalFlushTimeout) and returns that flush's error. A failed flush in between is logged; what
// it could not send is published at the next one.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("CloudWatch publish interval %s: want a positive duration", interval)
	}
	// A timer rather than a ticker: clock.Clock has no tickers. Each flush is due at a fixed
	// cadence from the start, however long the last one took.
	next := p.clock.Now().Add(interval)
	t := p.clock.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			err := p.Flush(final)
			cancel()
			return err
		case <-t.C():
			if err := p.Flush(ctx); err != nil {
				p.log.Warn("publishing CloudWatch metrics", "error", err)
			}
			now := p.clock.Now()
			for !next.After(now) {
				next = next.Add(interval)
			}
			t.Reset(next.Sub(now))
		}
	}
}

// entry is a datum with the series it came from, so that a failed call can put it back.
type entry struct {
	series series
	stat   stat
	datum  types.MetricDatum
	keep   bool // merged back after a failed call: counts and latencies, not the heartbeat or the gauge
}

// Flush publishes what was recorded since the last flush, a Heartbeat of 1, and the latest
// DeferredEvents, in calls of at most MaxDatumsPerCall datums. When a call fails, the counts
// and latencies of that call and of the calls not yet made are kept and published with the
// next flush (under its timestamp), unless CloudWatch rejected the data itself as invalid.
func (p *Publisher) Flush(ctx context.Context) error {
	now := p.clock.Now()
	p.mu.Lock()
	pending := p.pending
	p.pending = make(map[series]stat, len(pending))
	deferred, deferredSet := p.deferred, p.deferredSet
	watchdog := p.watchdog
	dropped := p.dropped
	p.dropped = 0
	p.mu.Unlock()

	if dropped > 0 {
		p.log.Warn("CloudWatch metrics dropped: too many distinct series", "dropped", dropped, "max", maxPendingSeries)
	}

	entries := make([]entry, 0, len(pending)+2)
	entries = append(entries, p.entry(series{metric: metrics.CWHeartbeat}, one(1), now, false))
	if deferredSet {
		entries = append(entries, p.entry(series{metric: metrics.CWDeferredEvents}, one(float64(deferred)), now, false))
	}
	for _, f := range slices.Sorted(maps.Keys(watchdog)) {
		entries = append(entries, p.entry(series{metric: metrics.CWWatchdog, finding: f}, one(float64(watchdog[f])), now, false))
	}
	keys := make([]series, 0, len(pending))
	for s := range pending {
		keys = append(keys, s)
	}
	slices.SortFunc(keys, compareSeries)
	for _, s := range keys {
		entries = append(entries, p.entry(s, pending[s], now, true))
	}

	for start := 0; start < len(entries); start += MaxDatumsPerCall {
		batch := entries[start:min(start+MaxDatumsPerCall, len(entries))]
		data := make([]types.MetricDatum, len(batch))
		for i, e := range batch {
			data[i] = e.datum
		}
		_, err := p.api.PutMetricData(ctx, &cloudwatch.PutMetricDataInput{
			Namespace:  aws.String(metrics.CloudWatchNamespace),
			MetricData: data,
		})
		if err == nil {
			continue
		}
		if invalidData(err) {
			// Sending the same data again would fail the same way, and every flush after it.
			return fmt.Errorf("putting %d CloudWatch datums (dropped, CloudWatch rejects them): %w", len(batch), err)
		}
		p.keep(entries[start:])
		return fmt.Errorf("putting %d CloudWatch datums (kept with %d not yet sent): %w", len(batch), len(entries)-start-len(batch), err)
	}
	return nil
}

// keep merges the counts and latencies of entries back into the pending aggregates.
func (p *Publisher) keep(entries []entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range entries {
		if e.keep {
			p.mergeLocked(e.series, e.stat)
		}
	}
}

// entry builds the datum of a series: a StatisticSet for EventLatency, a Count value for the
// others, with exactly the dimensions router/metrics lists for the metric.
func (p *Publisher) entry(s series, v stat, now time.Time, keep bool) entry {
	d := types.MetricDatum{
		MetricName: aws.String(s.metric),
		Timestamp:  aws.Time(now),
		Unit:       types.StandardUnitCount,
	}
	for _, name := range metrics.CloudWatchDimensions[s.metric] {
		d.Dimensions = append(d.Dimensions, types.Dimension{Name: aws.String(name), Value: aws.String(p.dimension(s, name))})
	}
	if s.metric == metrics.CWEventLatency {
		d.Unit = types.StandardUnitMilliseconds
		d.StatisticValues = &types.StatisticSet{
			SampleCount: aws.Float64(v.count),
			Sum:         aws.Float64(v.sum),
			Minimum:     aws.Float64(v.min),
			Maximum:     aws.Float64(v.max),
		}
	} else {
		d.Value = aws.Float64(v.sum)
	}
	return entry{series: s, stat: v, datum: d, keep: keep}
}

// dimension returns the value of the dimension name for s.
func (p *Publisher) dimension(s series, name string) string {
	switch name {
	case metrics.DimClusterName:
		return p.cluster
	case metrics.DimKind:
		return s.kind
	case metrics.DimAction:
		return s.action
	case metrics.DimAPI:
		return s.api
	case metrics.DimFinding:
		return s.finding
	}
	return emptyDimensionValue
}

// compareSeries orders series, so that datums go out in a stable order.
func compareSeries(a, b series) int {
	return cmp.Or(cmp.Compare(a.metric, b.metric), cmp.Compare(a.kind, b.kind), cmp.Compare(a.action, b.action), cmp.Compare(a.api, b.api), cmp.Compare(a.finding, b.finding))
}

// dimensionValue makes v acceptable to CloudWatch as a dimension value: not empty, at most
// maxDimensionValueLen bytes.
func dimensionValue(v string) string {
	if v == "" {
		return emptyDimensionValue
	}
	if len(v) > maxDimensionValueLen {
		return strings.ToValidUTF8(v[:maxDimensionValueLen], "")
	}
	return v
}

// invalidData says whether CloudWatch rejected a PutMetricData for its content, which no retry
// fixes; throttling, unavailability, access denied and the like may pass later.
func invalidData(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "InvalidParameterValue", "InvalidParameterCombination", "MissingParameter", "MissingRequiredParameter":
		return true
	}
	return false
}
