package cwmetrics_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/cwmetrics"
	"github.com/health-router/health-router/router/metrics"
)

const cluster = "prod-eu"

var start = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// fakeCloudWatch records PutMetricData calls and fails the ones listed in failures (1-based
// call numbers) with the error given.
type fakeCloudWatch struct {
	mu       sync.Mutex
	calls    []*cloudwatch.PutMetricDataInput
	failures map[int]error
}

func (f *fakeCloudWatch) PutMetricData(_ context.Context, in *cloudwatch.PutMetricDataInput, _ ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, in)
	if err := f.failures[len(f.calls)]; err != nil {
		return nil, err
	}
	return &cloudwatch.PutMetricDataOutput{}, nil
}

func (f *fakeCloudWatch) call(t *testing.T, n int) *cloudwatch.PutMetricDataInput {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) < n {
		t.Fatalf("%d PutMetricData calls, want at least %d", len(f.calls), n)
	}
	return f.calls[n-1]
}

func (f *fakeCloudWatch) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

var throttled = &smithy.GenericAPIError{Code: "Throttling", Message: "Rate exceeded", Fault: smithy.FaultClient}

// logBuffer is a log destination that Run's goroutine and the test may use at once.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newPublisher(api *fakeCloudWatch) (*cwmetrics.Publisher, *clocktesting.FakeClock, *logBuffer) {
	clk := clocktesting.NewFakeClock(start)
	logs := &logBuffer{}
	return cwmetrics.New(api, cluster, clk, slog.New(slog.NewTextHandler(logs, nil))), clk, logs
}

// key names a datum by metric and dimension values, in order: "Decisions prod-eu/spot/drain".
func key(d types.MetricDatum) string {
	var vals []string
	for _, dim := range d.Dimensions {
		vals = append(vals, aws.ToString(dim.Value))
	}
	return aws.ToString(d.MetricName) + " " + strings.Join(vals, "/")
}

// byKey indexes the datums of calls by key, failing on a duplicate.
func byKey(t *testing.T, calls ...*cloudwatch.PutMetricDataInput) map[string]types.MetricDatum {
	t.Helper()
	m := map[string]types.MetricDatum{}
	for _, in := range calls {
		if aws.ToString(in.Namespace) != metrics.CloudWatchNamespace {
			t.Errorf("namespace %q, want %q", aws.ToString(in.Namespace), metrics.CloudWatchNamespace)
		}
		for _, d := range in.MetricData {
			k := key(d)
			if _, dup := m[k]; dup {
				t.Errorf("datum %s sent twice in one flush", k)
			}
			m[k] = d
		}
	}
	return m
}

func value(t *testing.T, data map[string]types.MetricDatum, k string) float64 {
	t.Helper()
	d, ok := data[k]
	if !ok {
		t.Errorf("no datum %s; have %v", k, keys(data))
		return -1
	}
	if d.Value == nil || d.StatisticValues != nil {
		t.Errorf("%s: want a single Value", k)
		return -1
	}
	return *d.Value
}

func keys(data map[string]types.MetricDatum) []string {
	var ks []string
	for k := range data {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestFlushNamesUnitsAndDimensions(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	p.Decision("spot-interruption", "drain")
	p.Decision("spot-interruption", "drain")
	p.Decision("scheduled-change", "defer")
	p.DeadLettered()
	p.Latency(120 * time.Millisecond)
	p.Latency(80 * time.Millisecond)
	p.Latency(1500 * time.Microsecond)
	p.AWSCallError("DescribeImages")
	p.SetDeferred(7)
	p.SetDeferred(4) // the latest wins
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if api.numCalls() != 1 {
		t.Fatalf("%d calls, want 1", api.numCalls())
	}
	data := byKey(t, api.call(t, 1))

	for k, want := range map[string]float64{
		"Decisions prod-eu/spot-interruption/drain": 2,
		"Decisions prod-eu/scheduled-change/defer":  1,
		"DeadLettered prod-eu":                      1,
		"AWSCallErrors prod-eu/DescribeImages":      1,
		"DeferredEvents prod-eu":                    4,
		"Heartbeat prod-eu":                         1,
	} {
		if got := value(t, data, k); got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	lat, ok := data["EventLatency prod-eu"]
	if !ok || lat.StatisticValues == nil || lat.Value != nil {
		t.Fatalf("EventLatency: want a StatisticSet only, got %+v", lat)
	}
	s := lat.StatisticValues
	if *s.SampleCount != 3 || *s.Sum != 201.5 || *s.Minimum != 1.5 || *s.Maximum != 120 || lat.Unit != types.StandardUnitMilliseconds {
		t.Errorf("EventLatency = count %v sum %v min %v max %v unit %s, want 3, 201.5, 1.5, 120 ms", *s.SampleCount, *s.Sum, *s.Minimum, *s.Maximum, lat.Unit)
	}
	if len(data) != 7 {
		t.Errorf("datums %v, want 7", keys(data))
	}

	// Exactly the dimensions router/metrics lists, in its order, ClusterName first; every
	// datum stamped with the flush time.
	for k, d := range data {
		var names []string
		for _, dim := range d.Dimensions {
			names = append(names, aws.ToString(dim.Name))
		}
		want := metrics.CloudWatchDimensions[aws.ToString(d.MetricName)]
		if !slices.Equal(names, want) || names[0] != metrics.DimClusterName {
			t.Errorf("%s: dimensions %v, want %v", k, names, want)
		}
		if d.Unit != types.StandardUnitCount && aws.ToString(d.MetricName) != metrics.CWEventLatency {
			t.Errorf("%s: unit %s, want Count", k, d.Unit)
		}
		if !aws.ToTime(d.Timestamp).Equal(start) {
			t.Errorf("%s: timestamp %v, want %v", k, aws.ToTime(d.Timestamp), start)
		}
	}

	// Counts start again from zero; the gauge stays.
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := keys(byKey(t, api.call(t, 2))); !slices.Equal(got, []string{"DeferredEvents prod-eu", "Heartbeat prod-eu"}) {
		t.Errorf("second flush sent %v, want only the gauge and the heartbeat", got)
	}
}

func TestHeartbeatOnIdleFlush(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	data := byKey(t, api.call(t, 1))
	if len(data) != 1 || value(t, data, "Heartbeat prod-eu") != 1 {
		t.Errorf("idle flush sent %v, want Heartbeat prod-eu = 1 only", keys(data))
	}
}

func TestFailedFlushIsMergedIntoTheNext(t *testing.T) {
	api := &fakeCloudWatch{failures: map[int]error{1: throttled}}
	p, clk, _ := newPublisher(api)
	p.Decision("spot-interruption", "drain")
	p.Decision("spot-interruption", "drain")
	p.DeadLettered()
	p.Latency(100 * time.Millisecond)
	p.Latency(300 * time.Millisecond)
	p.SetDeferred(2)
	err := p.Flush(t.Context())
	if err == nil || !strings.Contains(err.Error(), "Throttling") {
		t.Fatalf("Flush = %v, want the Throttling error", err)
	}

	clk.Step(time.Minute)
	p.Decision("spot-interruption", "drain")
	p.Decision("state-change", "ignore")
	p.Latency(50 * time.Millisecond)
	p.SetDeferred(1)
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	data := byKey(t, api.call(t, 2))
	for k, want := range map[string]float64{
		"Decisions prod-eu/spot-interruption/drain": 3,
		"Decisions prod-eu/state-change/ignore":     1,
		"DeadLettered prod-eu":                      1,
		"DeferredEvents prod-eu":                    1, // the current value, not the failed one
		"Heartbeat prod-eu":                         1, // this interval's, not two
	} {
		if got := value(t, data, k); got != want {
			t.Errorf("after a failed flush, %s = %v, want %v", k, got, want)
		}
	}
	s := data["EventLatency prod-eu"].StatisticValues
	if s == nil || *s.SampleCount != 3 || *s.Sum != 450 || *s.Minimum != 50 || *s.Maximum != 300 {
		t.Errorf("merged EventLatency %+v, want count 3, sum 450, min 50, max 300", s)
	}
	if len(data) != 6 {
		t.Errorf("datums %v, want 6", keys(data))
	}
	if ts := aws.ToTime(data["DeadLettered prod-eu"].Timestamp); !ts.Equal(start.Add(time.Minute)) {
		t.Errorf("kept datum stamped %v, want the publishing flush's time", ts)
	}

	// Sent once: the flush after carries only the heartbeat and the gauge.
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := keys(byKey(t, api.call(t, 3))); len(got) != 2 {
		t.Errorf("third flush sent %v, want the gauge and the heartbeat", got)
	}
}

func TestInvalidDataIsNotRetried(t *testing.T) {
	invalid := &smithy.GenericAPIError{Code: "InvalidParameterValue", Message: "bad value", Fault: smithy.FaultClient}
	api := &fakeCloudWatch{failures: map[int]error{1: invalid}}
	p, _, _ := newPublisher(api)
	p.Decision("spot-interruption", "drain")
	if err := p.Flush(t.Context()); err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Fatalf("Flush = %v, want an error saying the data was dropped", err)
	}
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := keys(byKey(t, api.call(t, 2))); !slices.Equal(got, []string{"Heartbeat prod-eu"}) {
		t.Errorf("after CloudWatch rejected the data, the next flush sent %v, want the heartbeat only", got)
	}
}

// decisions records one decision of each of n distinct kinds.
func decisions(p *cwmetrics.Publisher, prefix string, n int) {
	for i := range n {
		p.Decision(fmt.Sprintf("%s-%04d", prefix, i), "drain")
	}
}

func TestBatchesOfAtMost1000(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	decisions(p, "kind", 1500)
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if api.numCalls() != 2 {
		t.Fatalf("%d calls for 1501 datums, want 2", api.numCalls())
	}
	sizes := []int{len(api.call(t, 1).MetricData), len(api.call(t, 2).MetricData)}
	if !slices.Equal(sizes, []int{cwmetrics.MaxDatumsPerCall, 501}) {
		t.Errorf("batch sizes %v, want [1000 501]", sizes)
	}
	data := byKey(t, api.call(t, 1), api.call(t, 2))
	if len(data) != 1501 || value(t, data, "Decisions prod-eu/kind-1499/drain") != 1 || value(t, data, "Heartbeat prod-eu") != 1 {
		t.Errorf("%d distinct datums over the calls, want 1501 with each decision and the heartbeat", len(data))
	}
}

func TestFailedBatchKeepsOnlyWhatWasNotSent(t *testing.T) {
	api := &fakeCloudWatch{failures: map[int]error{2: throttled}}
	p, _, _ := newPublisher(api)
	decisions(p, "kind", 1500)
	if err := p.Flush(t.Context()); err == nil {
		t.Fatal("Flush succeeded, want the second call's error")
	}
	sent := byKey(t, api.call(t, 1))
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	resent := byKey(t, api.call(t, 3))
	// 1501 datums: the first call carried 1000 (the heartbeat and 999 decisions), the failed
	// one 501 decisions, which come again with this flush's heartbeat.
	if len(resent) != 502 || value(t, resent, "Heartbeat prod-eu") != 1 {
		t.Errorf("flush after the failure sent %d datums, want the 501 unsent and a heartbeat", len(resent))
	}
	for k := range resent {
		if _, dup := sent[k]; dup && !strings.HasPrefix(k, metrics.CWHeartbeat) {
			t.Errorf("%s sent again after it succeeded", k)
		}
	}
}

func TestPendingSeriesAreBounded(t *testing.T) {
	api := &fakeCloudWatch{failures: map[int]error{1: throttled}}
	p, _, logs := newPublisher(api)
	// 2000 series fail to go out and are kept; 2000 new ones find no room.
	decisions(p, "old", 2000)
	if err := p.Flush(t.Context()); err == nil {
		t.Fatal("want the throttling error")
	}
	decisions(p, "new", 2000)
	p.Decision("old-0000", "drain") // an existing series still adds up
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var calls []*cloudwatch.PutMetricDataInput
	for i := 2; i <= api.numCalls(); i++ {
		calls = append(calls, api.call(t, i))
	}
	data := byKey(t, calls...)
	if len(data) != 2001 {
		t.Errorf("sent %d datums, want the 2000 kept series and the heartbeat", len(data))
	}
	if value(t, data, "Decisions prod-eu/old-0000/drain") != 2 {
		t.Errorf("old-0000 = %v, want 2", value(t, data, "Decisions prod-eu/old-0000/drain"))
	}
	if _, ok := data["Decisions prod-eu/new-0000/drain"]; ok {
		t.Error("a series beyond the bound was kept")
	}
	if !strings.Contains(logs.String(), "dropped=2000") {
		t.Errorf("the dropped series were not logged:\n%s", logs.String())
	}
}

func TestEmptyDimensionValues(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	p.Decision("", "drain")
	p.AWSCallError("")
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	data := byKey(t, api.call(t, 1))
	for _, k := range []string{"Decisions prod-eu/unknown/drain", "AWSCallErrors prod-eu/unknown"} {
		if value(t, data, k) != 1 {
			t.Errorf("%s missing: CloudWatch rejects an empty dimension value", k)
		}
	}
}

func TestConcurrentRecording(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				p.Decision("spot-interruption", "drain")
				p.Latency(time.Millisecond)
			}
		})
	}
	// Flushes race the recording; nothing may be lost or counted twice.
	for range 5 {
		if err := p.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var decided, latencies float64
	for i := 1; i <= api.numCalls(); i++ {
		data := byKey(t, api.call(t, i))
		if d, ok := data["Decisions prod-eu/spot-interruption/drain"]; ok {
			decided += *d.Value
		}
		if d, ok := data["EventLatency prod-eu"]; ok {
			latencies += *d.StatisticValues.SampleCount
		}
	}
	if decided != 4000 || latencies != 4000 {
		t.Errorf("published %v decisions and %v latencies, want 4000 each", decided, latencies)
	}
}

func TestNilPublisherDiscards(t *testing.T) {
	var p *cwmetrics.Publisher
	p.Decision("spot-interruption", "drain")
	p.DeadLettered()
	p.Latency(time.Second)
	p.AWSCallError("ReceiveMessage")
	p.SetDeferred(1)
}

func TestRunFlushesEveryIntervalAndOnShutdown(t *testing.T) {
	api := &fakeCloudWatch{failures: map[int]error{1: throttled}}
	p, clk, logs := newPublisher(api)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, time.Minute) }()

	step := func(wantCalls int) {
		t.Helper()
		waitFor(t, clk.HasWaiters)
		clk.Step(time.Minute)
		waitFor(t, func() bool { return api.numCalls() == wantCalls })
	}
	p.DeadLettered()
	step(1) // fails, logged, kept
	if api.numCalls() != 1 {
		t.Fatalf("%d calls after one interval, want 1", api.numCalls())
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "Throttling") })
	step(2) // the dead letter again, with a heartbeat
	p.Decision("spot-interruption", "drain")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if api.numCalls() != 3 {
		t.Fatalf("%d calls, want 3: two intervals and the final flush", api.numCalls())
	}
	if got := value(t, byKey(t, api.call(t, 2)), "DeadLettered prod-eu"); got != 1 {
		t.Errorf("second interval DeadLettered = %v, want 1 (kept from the failed flush)", got)
	}
	final := byKey(t, api.call(t, 3))
	if value(t, final, "Decisions prod-eu/spot-interruption/drain") != 1 || value(t, final, "Heartbeat prod-eu") != 1 {
		t.Errorf("final flush sent %v, want the decision recorded before shutdown and a heartbeat", keys(final))
	}
	if err := p.Run(t.Context(), 0); err == nil {
		t.Error("Run with a zero interval: want an error")
	}
}

// waitFor polls cond for up to 10 s of real time (Run is a goroutine).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWatchdogFindings(t *testing.T) {
	api := &fakeCloudWatch{}
	p, _, _ := newPublisher(api)
	counts := map[string]int{"stuck-empty": 2, "unavailable-image": 0, "reservation-drift": 5}
	p.SetWatchdog(counts)
	counts["stuck-empty"] = 99 // the publisher keeps its own copy
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	data := byKey(t, api.call(t, 1))
	for k, want := range map[string]float64{"WatchdogFindings prod-eu/stuck-empty": 2, "WatchdogFindings prod-eu/unavailable-image": 0, "WatchdogFindings prod-eu/reservation-drift": 5} {
		if got := value(t, data, k); got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
	// The latest value is sent again at the next flush, as a gauge.
	if err := p.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := value(t, byKey(t, api.call(t, 2)), "WatchdogFindings prod-eu/reservation-drift"); got != 5 {
		t.Errorf("second flush: %v", got)
	}
}
