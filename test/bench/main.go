// Command bench is the load harness behind `make bench`: it generates a synthetic cluster
// and event bursts, measures the decision pipeline in process, runs a burst end to end
// through the router's intake against moto_server's SQS beside a bare receive/delete loop on
// the same server, counts AWS calls, and prints one table.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/bench/gen"
	"github.com/health-router/health-router/test/harness"
)

type row struct{ measure, result, target string }

func main() {
	nodes := flag.Int("nodes", 5000, "nodes (and NodeClaims) in the synthetic cluster")
	pools := flag.Int("pools", 20, "NodePools, with mixed policies")
	classes := flag.Int("classes", 4, "EC2NodeClasses, each with a multi-image alias")
	reservations := flag.Int("reservations", 8, "capacity reservations")
	mixed := flag.Int("events", 10000, "mixed events (with duplicates) for the in-process run")
	e2e := flag.Int("e2e-events", 10000, "events for the end-to-end run on moto (0 skips it)")
	flag.Parse()
	ctx := context.Background()
	var rows []row

	// The cluster, and what holding it costs.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	c := gen.NewCluster(*nodes, *pools, *classes, *reservations, 1)
	scheme, err := cluster.NewScheme()
	must(err)
	snap, err := cluster.NewSnapshot(scheme, c.Objects()...)
	must(err)
	model := cluster.New(snap)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	rows = append(rows, row{fmt.Sprintf("heap holding %d nodes + NodeClaims, indexed", *nodes), mib(after.HeapAlloc - before.HeapAlloc), ""})

	// Pre-signal checks answered by counting stand-ins, to count EC2 calls per burst.
	ec2c := &countingEC2{images: c.Images(), reservations: c.Reservations()}
	gates := checks.NewFeatureGates()
	checker := checks.NewChecker(checks.NewAMI(ec2c, clock.RealClock{}), checks.NewReservations(ec2c, clock.RealClock{}), gates)

	// In process, one core.
	prev := runtime.GOMAXPROCS(1)
	eng := engine.New(model, checker)
	now := time.Now().UTC()
	evs := gen.MixedEvents(*mixed, *nodes, now, 2)
	lat := make([]time.Duration, 0, len(evs))
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	decisions := 0
	for _, ev := range evs {
		t0 := time.Now()
		outs, err := eng.Decide(ctx, ev, now)
		must(err)
		lat = append(lat, time.Since(t0))
		decisions += len(outs)
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	runtime.GOMAXPROCS(prev)
	slices.Sort(lat)
	rows = append(rows,
		row{fmt.Sprintf("decisions/s, 1 core, %d mixed events (~20%% duplicates), checks on", len(evs)), fmt.Sprintf("%.0f", float64(decisions)/elapsed.Seconds()), "≥ 5,000"},
		row{"decision latency p50 / p99 (one event)", fmt.Sprintf("%s / %s", lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond)), "p99 < 2 ms"},
		row{"allocations per event", fmt.Sprintf("%d (%s)", (ms1.Mallocs-ms0.Mallocs)/uint64(len(evs)), kib((ms1.TotalAlloc-ms0.TotalAlloc)/uint64(len(evs)))), ""},
		row{"EC2 describe calls for the burst", fmt.Sprintf("%d DescribeImages + %d DescribeCapacityReservations", ec2c.imageCalls.Load(), ec2c.reservationCalls.Load()),
			fmt.Sprintf("≤ %d image sets + %d reservations", 1, *reservations)},
	)

	// An AZ-wide Health event naming every instance.
	az := gen.AZWideHealth(*nodes, 1000, now)
	t0 := time.Now()
	azDecisions := 0
	for _, ev := range az {
		outs, err := eng.Decide(ctx, ev, now)
		must(err)
		azDecisions += len(outs)
	}
	rows = append(rows, row{fmt.Sprintf("AZ-wide Health maintenance naming %d instances (%d events of 1,000): decided", *nodes, len(az)), fmt.Sprintf("%s (%d decisions)", time.Since(t0).Round(time.Millisecond), azDecisions), ""})

	if *e2e > 0 {
		rows = append(rows, endToEnd(ctx, c, *e2e, *nodes, now)...)
	}
	rows = append(rows, row{"peak RSS of this process (cluster, events, both runs)", peakRSS(), "≤ 150 MiB at 5,000 nodes"})

	fmt.Printf("\nhealth-router bench — %s, %d CPUs (%s), %s\n\n", runtime.Version(), runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02"))
	fmt.Println("| measure | result | target |")
	fmt.Println("| --- | --- | --- |")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s |\n", r.measure, r.result, r.target)
	}
}

// endToEnd pushes a burst through moto's SQS twice: once consumed by a bare receive/delete
// loop, once by the router's intake (decisions over the synthetic cluster, drains forwarded to
// a Karpenter queue on moto, cluster writes in memory).
func endToEnd(ctx context.Context, c *gen.Cluster, n, nodes int, now time.Time) []row {
	motoURL, stop, err := harness.StartMoto()
	if err != nil {
		return []row{{"end to end on moto", "skipped: " + err.Error(), ""}}
	}
	defer stop()
	counter := &callCounter{calls: map[string]int{}}
	cfg := aws.Config{Region: "eu-west-1", Credentials: credentials.NewStaticCredentialsProvider("bench", "bench", ""), HTTPClient: &http.Client{Transport: counter}}
	q := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(motoURL) })
	mk := func(name string) string {
		out, err := q.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		must(err)
		return aws.ToString(out.QueueUrl)
	}
	bareURL, routerURL, dlqURL, karpURL := mk("bare"), mk("intake"), mk("dlq"), mk("karpenter")
	bodies := gen.MixedBodies(n, nodes, now, 3, false)
	fill(ctx, q, bareURL, bodies)
	fill(ctx, q, routerURL, bodies)
	const workers = 10

	// The bare loop: what any consumer must do at least, with the same workers.
	t0 := time.Now()
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < int64(n) {
				out, err := q.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(bareURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err != nil {
					continue
				}
				for _, m := range out.Messages {
					if _, err := q.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(bareURL), ReceiptHandle: m.ReceiptHandle}); err == nil {
						done.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	bare := time.Since(t0)

	// The router's intake with its engine and signaller.
	scheme, _ := cluster.NewScheme()
	snap, err := cluster.NewSnapshot(scheme, c.Objects()...)
	must(err)
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(c.Objects()...).Build()
	ec2c := &countingEC2{images: c.Images(), reservations: c.Reservations()}
	checker := checks.NewChecker(checks.NewAMI(ec2c, clock.RealClock{}), checks.NewReservations(ec2c, clock.RealClock{}), checks.NewFeatureGates())
	eng := engine.New(cluster.New(snap), checker)
	sig := signal.New(kube, kube, signal.ModeForward, q, karpURL, &events.FakeRecorder{}, clock.RealClock{})
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	pipe := pipeline.New(eng, sig, m, nil, clock.RealClock{}, log, 0)
	in := intake.New(intake.Config{QueueURL: routerURL, DeadLetterQueueURL: dlqURL, Workers: workers, Visibility: 60 * time.Second, WaitTime: time.Second}, q, pipe, m, nil, clock.RealClock{}, log)
	before := counter.total()
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	t0 = time.Now()
	go func() { errc <- in.Start(runCtx) }()
	// Done when every message has an outcome: deleted, or deferred (held invisible).
	for {
		time.Sleep(200 * time.Millisecond)
		a, err := q.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(routerURL), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages"}})
		if err == nil && a.Attributes["ApproximateNumberOfMessages"] == "0" && inFlightDone(m) >= float64(n) {
			break
		}
	}
	routerTime := time.Since(t0)
	cancel()
	<-errc
	calls := counter.total() - before
	return []row{
		{fmt.Sprintf("end to end, %d-event burst on moto SQS: bare receive/delete loop (%d workers)", n, workers), fmt.Sprintf("%s (%.0f msg/s)", bare.Round(time.Millisecond), float64(n)/bare.Seconds()), ""},
		{"end to end, same burst: the router (decide, check, forward drains, record)", fmt.Sprintf("%s (%.0f msg/s)", routerTime.Round(time.Millisecond), float64(n)/routerTime.Seconds()), ""},
		{"router throughput / bare loop throughput", fmt.Sprintf("%.2f", bare.Seconds()/routerTime.Seconds()), "≥ 0.8"},
		{"SQS calls per event in the router run (receive, delete, visibility, forward, heartbeat)", fmt.Sprintf("%.2f", float64(calls)/float64(n)), ""},
	}
}

// inFlightDone is the number of messages the router has finished: decisions recorded for
// events that parsed, plus dead letters.
func inFlightDone(m *metrics.Router) float64 {
	return sumCounter(m.Received)
}

func sumCounter(c *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	total := 0.0
	for mt := range ch {
		var d dto.Metric
		_ = mt.Write(&d)
		total += d.GetCounter().GetValue()
	}
	return total
}

func fill(ctx context.Context, q *sqs.Client, url string, bodies []string) {
	for i := 0; i < len(bodies); i += 10 {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for j, b := range bodies[i:min(i+10, len(bodies))] {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(j)), MessageBody: aws.String(b)})
		}
		_, err := q.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		must(err)
	}
}

// countingEC2 answers the checks from the generated cluster and counts the calls.
type countingEC2 struct {
	images           map[string]string
	reservations     map[string]int32
	imageCalls       atomic.Int64
	reservationCalls atomic.Int64
}

func (c *countingEC2) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	c.imageCalls.Add(1)
	out := &ec2.DescribeImagesOutput{}
	for _, id := range in.ImageIds {
		out.Images = append(out.Images, ec2types.Image{ImageId: aws.String(id), State: ec2types.ImageState(c.images[id])})
	}
	return out, nil
}

func (c *countingEC2) DescribeCapacityReservations(_ context.Context, in *ec2.DescribeCapacityReservationsInput, _ ...func(*ec2.Options)) (*ec2.DescribeCapacityReservationsOutput, error) {
	c.reservationCalls.Add(1)
	out := &ec2.DescribeCapacityReservationsOutput{}
	for _, id := range in.CapacityReservationIds {
		out.CapacityReservations = append(out.CapacityReservations, ec2types.CapacityReservation{CapacityReservationId: aws.String(id), State: "active", TotalInstanceCount: aws.Int32(100), AvailableInstanceCount: aws.Int32(c.reservations[id])})
	}
	return out, nil
}

type callCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *callCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.calls[r.Header.Get("X-Amz-Target")]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *callCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := 0
	for _, n := range c.calls {
		t += n
	}
	return t
}

func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
func kib(b uint64) string { return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10)) }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
