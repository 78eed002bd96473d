package main

// The burst bench (`-burst`): a burst of Spot interruption warnings for a pool that drains
// them, interleaved with as many rebalance recommendations for a pool annotated to ignore
// them, sent evenly over a few seconds into moto's SQS intake queue, with the router in
// process as in production (app.Run, its flags' defaults). For each warning it measures the
// time from its send to its outcome recorded by the router on the NodeClaim (deleting in
// delete-nodeclaim mode; the drain stamp, written before the forward, in forward mode), as
// a watch of NodeClaims shows it; it asserts that nothing is dropped (every warning's
// outcome recorded, every rebalance recommendation decided ignore, the intake queue empty,
// the dead-letter queue empty, every forward in Karpenter's queue) and counts the router's
// API requests against its client limit and its SQS calls per message.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/bench/realistic"
	"github.com/health-router/health-router/test/harness"
)

// burstDrainPool prefixes the burst's pools that drain its Spot warnings: Spot pools.
const burstDrainPool = "burst-drain-"

// burstAccount is the account of the burst's events, and the router's.
const burstAccount = "111122223333"

// burstTarget is the most a warning may take, at p99, from its send to its outcome recorded.
const burstTarget = time.Second

type burstFlags struct {
	warnings    int
	over        time.Duration
	modes       string
	routerFlags string
	senders     int
	sendBatch   int
	cpuProfile  string
	sqs         string // "in-test,moto": which SQS serves the intake, one burst each
	// noTarget leaves the latency target unjudged (the figures are still tabled): make test's
	// small burst (TestBurstSmall) checks that nothing is dropped, never a speed on a busy machine.
	noTarget bool
}

// The SQS a burst runs on: the in-test server (test/harness.SQS, SQS's JSON protocol, O(log n)
// per call) measures the router's own share against the target; moto_server is the reference
// whose per-call cost grows with its queue.
const (
	sqsInTest = "in-test"
	sqsMoto   = "moto"
)

// runBurst runs the burst bench once per signalling mode, each on pools of its own.
func (b *bench) runBurst(bf burstFlags) error {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	ctx, cancel := context.WithTimeout(context.Background(), b.f.timeout)
	defer cancel()
	loadStart := loadavg()

	sv, err := startServers("burst: ")
	if err != nil {
		return err
	}
	defer sv.stop()
	motoURL, restCfg, setupCfg, kube, sqsc, ec2c := sv.motoURL, sv.restCfg, sv.setupCfg, sv.kube, sv.sqs, sv.ec2
	img, err := ec2c.RegisterImage(ctx, &ec2.RegisterImageInput{Name: aws.String("amazon-eks-node-al2023-x86_64-standard-1.34-v20261118"),
		Architecture: ec2types.ArchitectureValuesX8664, RootDeviceName: aws.String("/dev/xvda")})
	if err != nil {
		return fmt.Errorf("registering the node image in moto: %w", err)
	}
	amiAMD64 = aws.ToString(img.ImageId)
	if err := createNodeClass(ctx, kube); err != nil {
		return err
	}
	// The router's AWS calls go through a proxy that counts them by API.
	awsCalls := newAWSCounter(motoURL)
	defer awsCalls.srv.Close()
	w := newFirsts()
	if err := w.watch(ctx, setupCfg); err != nil {
		return err
	}
	local := harness.NewSQS()
	defer local.Close()
	localc := sqs.NewFromConfig(aws.Config{Region: harness.Region, Credentials: sqsc.Options().Credentials},
		func(o *sqs.Options) { o.BaseEndpoint = aws.String(local.URL) })
	k := 0
	for _, server := range strings.Split(bf.sqs, ",") {
		server = strings.TrimSpace(server)
		c, url := sqsc, motoURL
		if server == sqsInTest {
			c, url = localc, local.URL
		} else if server != sqsMoto {
			return fmt.Errorf("--burst-sqs: %q is neither %s nor %s", server, sqsInTest, sqsMoto)
		}
		awsCalls.routeSQS(url)
		for _, flags := range strings.Split(bf.routerFlags, ";") {
			for _, mode := range strings.Split(bf.modes, ",") {
				if err := b.burstRun(ctx, bf, k, server, signal.Mode(strings.TrimSpace(mode)), strings.Fields(flags), kube, restCfg, c, awsCalls, w); err != nil {
					return err
				}
				k++
			}
		}
	}
	b.add("machine load average (1, 5, 15 min) at start / end", loadStart+" / "+loadavg(), "")
	return nil
}

// burstRun is one burst through a router in mode.
func (b *bench) burstRun(ctx context.Context, bf burstFlags, k int, server string, mode signal.Mode, routerFlags []string, kube client.Client, restCfg *rest.Config, sqsc *sqs.Client,
	awsCalls *awsCounter, w *firsts) error {
	n := bf.warnings
	tag := fmt.Sprintf("run %d, %s SQS, %s", k+1, server, mode)
	if len(routerFlags) > 0 {
		tag += " " + strings.Join(routerFlags, " ")
	}
	drainPool, ignorePool := fmt.Sprintf("%s%d", burstDrainPool, k), fmt.Sprintf("burst-ignore-%d", k)
	drainUID, err := createPool(ctx, kube, drainPool, nil)
	if err != nil {
		return err
	}
	ignoreUID, err := createPool(ctx, kube, ignorePool, map[string]string{policy.ActionKey(event.KindRebalance): string(policy.ActionIgnore)})
	if err != nil {
		return err
	}
	// Node indices of this run: [base, base+n) drain, [base+n, base+2n) ignore.
	base := (4 << 20) + k*2*n
	pool := func(i int) (string, types.UID) {
		if i < base+n {
			return drainPool, drainUID
		}
		return ignorePool, ignoreUID
	}
	progress("burst %s: creating %d Nodes (~40 images each) and NodeClaims through the API server", tag, 2*n)
	t0 := time.Now()
	if err := createNodes(ctx, kube, base, base+2*n, 8, pool, true, time.Now().UTC()); err != nil {
		return err
	}
	b.add(fmt.Sprintf("%s setup: %d realistic Nodes + NodeClaims created (%d per pool)", tag, 2*n, n), time.Since(t0).Round(time.Second).String(), "")

	intakeURL, err := createQueue(ctx, sqsc, fmt.Sprintf("burst-intake-%d", k))
	if err != nil {
		return err
	}
	dlqURL, err := createQueue(ctx, sqsc, fmt.Sprintf("burst-dlq-%d", k))
	if err != nil {
		return err
	}
	args := []string{"--queue-url", intakeURL, "--dead-letter-queue-url", dlqURL, "--signal", string(mode),
		"--feature-gates", "ReservedCapacity=false", // moto has no capacity reservation API
		"--forward-confirm-timeout", "10m", // no Karpenter here: no fallback deletes during the run
		"--kube-client-qps", fmt.Sprint(b.f.qps), "--kube-client-burst", fmt.Sprint(b.f.burst)}
	var karpURL string
	if mode == signal.ModeForward {
		if karpURL, err = createQueue(ctx, sqsc, fmt.Sprintf("burst-karpenter-%d", k)); err != nil {
			return err
		}
		args = append(args, "--karpenter-queue-url", karpURL)
	}
	args = append(args, routerFlags...)
	o, err := options.ParseRun(args, func(string) string { return "" })
	if err != nil {
		return fmt.Errorf("router flags: %w", err)
	}
	// What a test machine needs that a cluster does not: no Lease (one replica), local
	// addresses, moto through the counting proxy, no instance-status poll of moto's empty EC2.
	probe := freePort()
	o.LeaderElect, o.MetricsBindAddress, o.HealthProbeBindAddress = false, "0", fmt.Sprintf("127.0.0.1:%d", probe)
	o.AWSEndpointURL, o.Region, o.InstanceStatusPoller = awsCalls.srv.URL, harness.Region, false
	// The account the burst's events name (burstBody): the origin check defaults to the
	// caller's account, moto's, and dead-lettered every message of the burst as foreign.
	o.Account = burstAccount

	reqs := newTimedRequests()
	cfg := rest.CopyConfig(restCfg)
	cfg.WrapTransport = reqs.wrap
	reg := prometheus.NewRegistry()
	routerCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	progress("burst %s: starting the router in process (workers %d, receivers %d, client limit %g/%d)", tag, o.Workers, o.Receivers, o.KubeClientQPS, o.KubeClientBurst)
	go func() { done <- app.Run(routerCtx, o, cfg, reg, log) }()
	if err := waitReady(ctx, probe, done); err != nil {
		return err
	}

	// The messages: warning j (instance base+j) and recommendation j (instance base+n+j)
	// alternate, one every over/(2n).
	claims := make([]string, n)
	for j := range claims {
		claims[j] = realistic.ClaimName(drainPool, base+j)
	}
	w.expect(claims)
	sendAt := make([]time.Time, 2*n)
	var behind atomic.Int64
	var sendErrs atomic.Int64
	var next atomic.Int64
	step := bf.over / time.Duration(2*n)
	profile := ""
	if bf.cpuProfile != "" {
		profile = fmt.Sprintf("%s.%d", bf.cpuProfile, k)
	}
	stopProfile, err := startProfile(profile)
	if err != nil {
		return err
	}
	defer stopProfile()
	awsCalls.reset()
	reqsBefore := reqs.count()
	cpuBefore := cpuTimes()
	progress("burst %s: sending %d Spot interruption warnings and %d rebalance recommendations over %s, %d per send", tag, n, n, bf.over, bf.sendBatch)
	tStart := time.Now().Add(50 * time.Millisecond)
	batches := (2*n + bf.sendBatch - 1) / bf.sendBatch
	var senders sync.WaitGroup
	for s := 0; s < bf.senders; s++ {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for {
				bi := int(next.Add(1) - 1)
				if bi >= batches {
					return
				}
				from, to := bi*bf.sendBatch, min((bi+1)*bf.sendBatch, 2*n)
				at := tStart.Add(time.Duration(from) * step)
				time.Sleep(time.Until(at))
				now := time.Now()
				if late := now.Sub(at); late > time.Duration(behind.Load()) {
					behind.Store(int64(late)) // a race between senders only under-reports by a hair
				}
				var entries []sqstypes.SendMessageBatchRequestEntry
				for m := from; m < to; m++ {
					var body string
					if j := m / 2; m%2 == 0 {
						body = burstBody("EC2 Spot Instance Interruption Warning", fmt.Sprintf("5b1c0f3e-%04d-4000-8000-%012d", k, j), realistic.InstanceID(base+j), now)
					} else {
						body = burstBody("EC2 Instance Rebalance Recommendation", fmt.Sprintf("5d5555d5-%04d-4555-a555-%012d", k, j), realistic.InstanceID(base+n+j), now)
					}
					sendAt[m] = now
					entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(m)), MessageBody: aws.String(body)})
				}
				out, err := sqsc.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(intakeURL), Entries: entries})
				if err != nil {
					sendErrs.Add(int64(len(entries)))
				} else {
					sendErrs.Add(int64(len(out.Failed)))
				}
			}
		}()
	}
	senders.Wait()
	sentIn := time.Since(tStart)
	if sendErrs.Load() > 0 {
		return fmt.Errorf("burst %s: %d sends failed", tag, sendErrs.Load())
	}
	// The wait is bounded from the last send: a warning not recorded by then is reported as
	// not recorded (moto's backlog once held outcomes past an earlier, shorter bound).
	waitBound := bf.over + 5*time.Minute
	select {
	case <-w.all():
	case <-time.After(waitBound):
	case err := <-done:
		return fmt.Errorf("the router stopped: %v", err)
	}
	stopProfile()
	recorded := w.times()
	var lat []time.Duration
	for j, c := range claims {
		if at, ok := recorded[c]; ok {
			lat = append(lat, at.Sub(sendAt[2*j]))
		}
	}
	emptyCtx, cancelEmpty := context.WithTimeout(ctx, 2*time.Minute)
	emptyAt := waitQueueEmpty(emptyCtx, sqsc, intakeURL)
	intakeLeft := emptyCtx.Err() != nil
	cancelEmpty()
	reqsAfter := reqs.count()
	calls := awsCalls.snapshot()
	cpu := cpuSince(cpuBefore, time.Since(tStart))

	b.add(fmt.Sprintf("%s burst: %d Spot warnings + %d rebalance recommendations sent over %s (%d per SendMessageBatch)", tag, n, n, bf.over, bf.sendBatch),
		fmt.Sprintf("sent in %s, at most %s behind schedule", sentIn.Round(10*time.Millisecond), time.Duration(behind.Load()).Round(time.Millisecond)), "")
	if len(lat) > 0 {
		slices.Sort(lat)
		p50, p99, worst := percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
		what := map[signal.Mode]string{signal.ModeDeleteNodeClaim: "NodeClaim deleting", signal.ModeForward: "drain stamp; an urgent forward goes at once"}[mode]
		target := fmt.Sprintf("p99 ≤ %s", ms(burstTarget))
		if server == sqsMoto {
			target = "reference (moto's cost per call grows with its queue)"
		}
		b.add(fmt.Sprintf("%s warning: send until outcome recorded (%s), p50 / p99 / max", tag, what),
			fmt.Sprintf("%s / **%s** / %s", ms(p50), ms(p99), ms(worst)), target)
		if p99 > burstTarget && server == sqsInTest && !bf.noTarget {
			b.fail("%s: p99 %s from send to outcome recorded (target %s)", tag, ms(p99), ms(burstTarget))
		}
	}
	// Nothing dropped: every warning recorded, every recommendation ignored, the queues empty.
	ignored := counterValue(reg, metrics.Decisions, map[string]string{"kind": string(event.KindRebalance), "action": string(policy.ActionIgnore)})
	drained := counterValue(reg, metrics.Decisions, map[string]string{"kind": string(event.KindSpotInterruption), "action": string(policy.ActionDrain)})
	dlq := queueDepth(ctx, sqsc, dlqURL)
	dropped := fmt.Sprintf("warnings recorded %d/%d within %s of the last send (drain decisions %.0f), recommendations ignored %.0f/%d, intake queue %s, DLQ %d",
		len(lat), n, waitBound, drained, ignored, n, map[bool]string{true: "NOT empty after 2 min", false: fmt.Sprintf("empty %s after the last send", emptyAt.Sub(tStart.Add(sentIn)).Round(10*time.Millisecond))}[intakeLeft], dlq)
	if len(lat) < n || ignored != float64(n) || intakeLeft || dlq != 0 {
		b.fail("%s: something was dropped: %s", tag, dropped)
	}
	if mode == signal.ModeForward {
		forwarded := queueDepth(ctx, sqsc, karpURL)
		dropped += fmt.Sprintf(", Karpenter's queue %d", forwarded)
		if forwarded != n {
			b.fail("%s: %d forwards in Karpenter's queue, want %d", tag, forwarded, n)
		}
	}
	b.add(tag+" nothing dropped", dropped, "all; 0 in the DLQ")
	b.add(tag+" CPU used, send until the queue is empty", cpu, "")
	// SQS calls per message, on the intake (receive, delete, visibility) and to Karpenter.
	var parts []string
	total := 0
	for _, name := range sortedKeys(calls) {
		parts = append(parts, fmt.Sprintf("%s %d", name, calls[name]))
		total += calls[name]
	}
	b.add(fmt.Sprintf("%s router's SQS calls, send until the queue is empty (%.2f per message)", tag, float64(total)/float64(2*n)), strings.Join(parts, ", "), "")
	// The client limit: each client of the router (controller-runtime makes one per resource
	// type, and one for Events) has its own token bucket of qps with burst.
	lines, totalReqs, _ := since(reqsAfter, reqsBefore)
	peak, peakKey := reqs.peak(time.Second)
	b.add(fmt.Sprintf("%s router's API requests, send until the queue is empty (%d)", tag, totalReqs), strings.Join(lines, ", "), "")
	b.add(tag+" busiest second of one client (resource)", fmt.Sprintf("%d (%s)", peak, peakKey), fmt.Sprintf("≤ %.0f (qps %g + burst %d)", b.f.qps+float64(b.f.burst), b.f.qps, b.f.burst))
	if float64(peak) > b.f.qps+float64(b.f.burst) {
		b.fail("%s: %d requests of %s in one second, over the client limit %g/%d", tag, peak, peakKey, b.f.qps, b.f.burst)
	}
	stopRouter()
	if err := <-done; err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

func burstBody(detailType, id, instance string, now time.Time) string {
	return fmt.Sprintf(`{"version":"0","id":%q,"detail-type":%q,"source":"aws.ec2","account":"`+burstAccount+`","time":%q,"region":"eu-west-1","resources":["arn:aws:ec2:eu-west-1:`+burstAccount+`:instance/%s"],"detail":{"instance-id":%q,"instance-action":"terminate"}}`,
		id, detailType, now.UTC().Format(time.RFC3339), instance, instance)
}

// percentile is the nearest-rank p-th percentile of sorted d.
func percentile(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	return d[max(i-1, 0)]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// queueDepth is how many messages a queue holds, visible or not.
func queueDepth(ctx context.Context, sqsc *sqs.Client, url string) int {
	a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}})
	if err != nil {
		return -1
	}
	v, _ := strconv.Atoi(a.Attributes["ApproximateNumberOfMessages"])
	nv, _ := strconv.Atoi(a.Attributes["ApproximateNumberOfMessagesNotVisible"])
	return v + nv
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || (m[keys[i]] == m[keys[j]] && keys[i] < keys[j]) })
	return keys
}

// firsts watches NodeClaims' metadata and keeps, for each NodeClaim expected, when the watch
// first showed its drain recorded: deleting (or gone), or the drain stamp.
type firsts struct {
	mu    sync.Mutex
	want  map[string]bool
	at    map[string]time.Time
	done  chan struct{}
	count int
}

func newFirsts() *firsts {
	return &firsts{want: map[string]bool{}, at: map[string]time.Time{}, done: make(chan struct{})}
}

func (f *firsts) expect(claims []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.want, f.at, f.done, f.count = map[string]bool{}, map[string]time.Time{}, make(chan struct{}), 0
	for _, c := range claims {
		f.want[c] = true
	}
}

func (f *firsts) all() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.done
}

func (f *firsts) times() map[string]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copyTimes(f.at)
}

func copyTimes(m map[string]time.Time) map[string]time.Time {
	out := make(map[string]time.Time, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (f *firsts) observe(m *metav1.PartialObjectMetadata, gone bool) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.want[m.Name] || !f.at[m.Name].IsZero() {
		return
	}
	if gone || m.DeletionTimestamp != nil || m.Annotations[record.AnnotationDrainSignalled] != "" {
		f.at[m.Name] = now
		if len(f.at) == len(f.want) {
			close(f.done)
		}
	}
}

func (f *firsts) watch(ctx context.Context, cfg *rest.Config) error {
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	fac := metadatainformer.NewSharedInformerFactory(mc, 0)
	inf := fac.ForResource(schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}).Informer()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { f.observe(obj.(*metav1.PartialObjectMetadata), false) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				f.observe(m, true)
			}
		},
	}); err != nil {
		return err
	}
	fac.Start(ctx.Done())
	for _, ok := range fac.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("nodeclaim metadata watch did not sync")
		}
	}
	return watchRecords(ctx, cfg, f.observe)
}

// timedRequests counts a client's API requests by verb and resource with their times, for the
// busiest second of each.
type timedRequests struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func newTimedRequests() *timedRequests { return &timedRequests{at: map[string][]time.Time{}} }

func (r *timedRequests) wrap(rt http.RoundTripper) http.RoundTripper { return timedRT{r, rt} }

type timedRT struct {
	r    *timedRequests
	next http.RoundTripper
}

func (t timedRT) RoundTrip(req *http.Request) (*http.Response, error) {
	key := verb(req) + " " + resourceOf(req.URL.Path)
	t.r.mu.Lock()
	t.r.at[key] = append(t.r.at[key], time.Now())
	t.r.mu.Unlock()
	return t.next.RoundTrip(req)
}

func (r *timedRequests) count() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.at {
		out[k] = len(v)
	}
	return out
}

// peak is the most requests of one resource within any window (watches left out: one
// request each, held open).
func (r *timedRequests) peak(window time.Duration) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	byResource := map[string][]time.Time{}
	for k, v := range r.at {
		verb, res, _ := strings.Cut(k, " ")
		if verb != "watch" {
			byResource[res] = append(byResource[res], v...)
		}
	}
	best, bestKey := 0, ""
	for res, ts := range byResource {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		lo := 0
		for hi := range ts {
			for ts[hi].Sub(ts[lo]) >= window {
				lo++
			}
			if hi-lo+1 > best {
				best, bestKey = hi-lo+1, res
			}
		}
	}
	return best, bestKey
}

// awsCounter is a reverse proxy that counts the calls through it by API: SQS's (JSON
// protocol) to the SQS of the run, the rest (EC2) to moto (harness.SplitHandler).
type awsCounter struct {
	srv   *httptest.Server
	moto  string
	mu    sync.Mutex
	calls map[string]int
	to    http.Handler
}

// routeSQS sends SQS's calls to target from now on.
func (c *awsCounter) routeSQS(target string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.to = harness.SplitHandler(c.moto, target)
}

func newAWSCounter(target string) *awsCounter {
	c := &awsCounter{calls: map[string]int{}, moto: target, to: harness.SplitHandler(target, target)}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("X-Amz-Target") // SQS's JSON protocol: AmazonSQS.ReceiveMessage
		if name == "" {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			if form, err := url.ParseQuery(string(body)); err == nil {
				name = form.Get("Action")
			}
		}
		if _, api, ok := strings.Cut(name, "."); ok {
			name = api
		}
		c.mu.Lock()
		c.calls[name]++
		to := c.to
		c.mu.Unlock()
		to.ServeHTTP(w, r)
	}))
	return c
}

func (c *awsCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = map[string]int{}
}

func (c *awsCounter) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.calls))
	for k, v := range c.calls {
		out[k] = v
	}
	return out
}

// cpuTimes is the CPU time, in seconds, of this process and of each child process by name
// (moto_server, kube-apiserver, etcd), from /proc: who was busy during a burst.
func cpuTimes() map[string]float64 {
	out := map[string]float64{}
	self := os.Getpid()
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15, counted after the comm.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		comm, f := s[open+1:end], strings.Fields(s[end+1:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if pid != self && ppid != self {
			continue
		}
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		name := comm
		if pid == self {
			name = "bench+router"
		} else if strings.HasPrefix(comm, "moto") || strings.Contains(comm, "python") {
			name = "moto_server"
		}
		out[name] += (utime + stime) / 100 // USER_HZ
	}
	return out
}

// cpuSince writes the CPU seconds each process used since before, over wall, as shares of a
// core.
func cpuSince(before map[string]float64, wall time.Duration) string {
	now := cpuTimes()
	names := make([]string, 0, len(now))
	for k := range now {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		if d := now[k] - before[k]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f s (%.0f%% of a core)", k, d, 100*d/wall.Seconds()))
		}
	}
	return strings.Join(parts, ", ")
}
