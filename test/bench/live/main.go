// Command live is the live load bench behind `make bench`: the envtest kube-apiserver with
// the Karpenter CRDs, N realistic Nodes and NodeClaims over NodePools with mixed policies
// (a defer pool whose window is closed, a paced pool, a default pool that drains), and one
// AWS Health maintenance naming every instance sent to moto's SQS intake queue. The router
// runs in process as in production (router/app.Run: real client, real cache, client limit
// 200/300) in delete-nodeclaim mode. Before it, on the same API server, a bare loop reaches
// the same outcomes with one write each (pacing the paced share by hand, with the same
// played Karpenter). It sends a Spot interruption during the bulk work, runs the built
// binary as the cluster grows, and weighs the cache. It prints one table and exits non-zero
// when an assertion fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
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
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/bench/gen"
	"github.com/health-router/health-router/test/bench/realistic"
	"github.com/health-router/health-router/test/harness"
)

// Pool names.
const (
	poolDefer   = "defer-window"
	poolDefault = "default"
	poolPaced   = "paced"
	poolSpot    = "spot"
	poolBare    = "bare"
)

// maxEventBytes is EventBridge's limit on one event (and SQS's on one message).
const maxEventBytes = 256 * 1024

type flags struct {
	nodes, perEvent, parallel, burst, spotNodes, memoryNodes, untrimmedNodes, liveNodes, rounds, profileRound int
	binary, watchReference                                                                                    bool
	qps                                                                                                       float64
	pacedLimit, cpuProfile, apiserverProfile                                                                  string
	karpenterDelay, timeout                                                                                   time.Duration
}

type row struct{ measure, result, target string }

type bench struct {
	f        flags
	title    string // "live bench", "burst bench"
	rows     []row
	failures []string
	// bareWrites and bareRequests are the bare loop's writes and API requests per instance,
	// beside the router's.
	bareWrites, bareRequests float64
	// round is the round running, from 1 (0 outside the rounds); a round after the first adds
	// no rows (its ratio is tabled with the others at the end).
	round int
}

// add adds a row to the table, and shows it at once on stderr (a long run shows its figures
// as they come).
func (b *bench) add(measure, result, target string) {
	if b.round > 1 {
		progress("  (round) %s: %s", measure, result)
		return
	}
	b.rows = append(b.rows, row{measure, result, target})
	progress("  %s: %s", measure, result)
}

func (b *bench) fail(format string, args ...any) {
	b.failures = append(b.failures, fmt.Sprintf(format, args...))
}

func main() {
	var f flags
	flag.IntVar(&f.nodes, "nodes", 4000, "Nodes and NodeClaims named by the bulk event (2/5 defer pool, 2/5 default pool, 1/5 paced pool)")
	flag.IntVar(&f.perEvent, "per-event", 4000, "most instance IDs in one Health event (EventBridge's 256 KiB holds about 4,000)")
	flag.Float64Var(&f.qps, "kube-client-qps", options.DefaultKubeClientQPS, "client limit of the router and of the bare loop")
	flag.IntVar(&f.burst, "kube-client-burst", options.DefaultKubeClientBurst, "client burst of the router and of the bare loop")
	flag.IntVar(&f.parallel, "instance-parallelism", 16, "instances carried out at once, by the router and by the bare loop")
	flag.StringVar(&f.pacedLimit, "paced-limit", "2%", "healthrouter.io/max-concurrent-drains of the paced pool")
	flag.DurationVar(&f.karpenterDelay, "karpenter-delay", 2*time.Second, "how long Karpenter (played by the bench) takes to drain a NodeClaim of the paced pool")
	flag.IntVar(&f.rounds, "rounds", 4, "rounds of the bare loop and the router (the API server's CPU for the same requests moves by up to 35% from one side to the next, and drifts through a round): the bare loop first in odd rounds and last in even ones; the first round on the setup's objects, tabled in detail; each later one on fresh Nodes and NodeClaims of its own, removed after; every round's ratio and their median are tabled")
	flag.IntVar(&f.spotNodes, "spot-nodes", 4, "nodes of a Spot pool outside the bulk event; one gets a Spot interruption during the bulk work")
	flag.IntVar(&f.memoryNodes, "memory-nodes", 100000, "realistic Nodes and NodeClaims stored through the cache transforms to weigh the cache in process (0 skips)")
	flag.IntVar(&f.untrimmedNodes, "untrimmed-nodes", 10000, "nodes stored untrimmed for comparison (at most --memory-nodes)")
	flag.BoolVar(&f.watchReference, "watch-reference", true, "each round also runs the bare loop with the router's watches beside it (its cache of Nodes and NodeClaims, with its options and indexes, in the same process), a reference for what watching alone costs")
	flag.BoolVar(&f.binary, "binary", true, "also run the router binary: its RSS and heap, five events together, an interrupted event")
	flag.IntVar(&f.liveNodes, "live-nodes", 20000, "nodes the cluster grows to (defer pool) for the binary's second weighing and the five-event run (0 skips both and the interrupted event)")
	flag.DurationVar(&f.timeout, "timeout", 75*time.Minute, "the whole bench")
	flag.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench's process (the router in process, the bench's watch and played Karpenter) from the bulk event's send until every outcome is recorded")
	flag.StringVar(&f.apiserverProfile, "apiserver-cpuprofile", "", "write a CPU profile of kube-apiserver (its /debug/pprof) for the first 20 s of each side, to this path suffixed .bare, .watches (the bare loop with the router's watches) and .router")
	flag.IntVar(&f.profileRound, "profile-round", 1, "the round -cpuprofile and -apiserver-cpuprofile profile")
	var burst bool
	var bf burstFlags
	flag.BoolVar(&burst, "burst", false, "run the burst bench instead (burst.go): Spot warnings and rebalance recommendations sent evenly, send until each warning's outcome is recorded")
	flag.IntVar(&bf.warnings, "burst-warnings", 1000, "Spot interruption warnings in the burst (and as many rebalance recommendations, for a pool that ignores them)")
	flag.DurationVar(&bf.over, "burst-over", 10*time.Second, "the burst's length: its messages are sent evenly over it")
	flag.StringVar(&bf.modes, "burst-signal", "delete-nodeclaim,forward", "signalling modes, one burst each (on pools of its own)")
	flag.StringVar(&bf.routerFlags, "burst-router-flags", "", "more flags for the router of the burst, e.g. \"--workers=20\" (its defaults otherwise, as in production); sets separated by ';' run one after the other, each in every --burst-signal mode, for a comparison in one run")
	flag.IntVar(&bf.senders, "burst-senders", 16, "goroutines sending the burst's messages (each waits for its message's time)")
	flag.IntVar(&bf.sendBatch, "burst-send-batch", 10, "messages per SendMessageBatch of the burst (1 to 10): moto spends ~5 ms of its one core per call, so 200 single sends a second alone would saturate it")
	flag.StringVar(&bf.sqs, "burst-sqs", "in-test,moto", "the SQS serving the intake, one burst (in every --burst-signal mode) each: in-test (test/harness.SQS, SQS's JSON protocol in the bench's process; the target applies) or moto (moto_server, for reference: its cost per call grows with its queue)")
	flag.StringVar(&bf.cpuProfile, "burst-cpuprofile", "", "write a CPU profile of each burst (the router in process, the bench and its watch) to this path, suffixed .<run>")
	flag.Parse()
	if f.nodes < 10 || f.perEvent < 1 || f.parallel < 1 || f.qps <= 0 || f.burst < 1 || f.spotNodes < 1 {
		fmt.Fprintln(os.Stderr, "live: --nodes >= 10, --per-event, --instance-parallelism, --kube-client-qps, --kube-client-burst and --spot-nodes >= 1")
		os.Exit(2)
	}
	b := &bench{f: f, title: "live bench"}
	run := b.run
	if burst {
		if bf.warnings < 1 || bf.over <= 0 || bf.senders < 1 || bf.sendBatch < 1 || bf.sendBatch > 10 {
			fmt.Fprintln(os.Stderr, "live: --burst-warnings, --burst-over and --burst-senders must be positive, --burst-send-batch 1 to 10")
			os.Exit(2)
		}
		b.title = "burst bench"
		run = func() error { return b.runBurst(bf) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "live:", err)
		os.Exit(1)
	}
	b.print()
	if len(b.failures) > 0 {
		for _, s := range b.failures {
			fmt.Fprintln(os.Stderr, "live: FAILED:", s)
		}
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "live: "+format+"\n", args...)
}

func (b *bench) run() error {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	ctx, cancel := context.WithTimeout(context.Background(), b.f.timeout)
	defer cancel()
	root, err := repoRoot()
	if err != nil {
		return err
	}

	sv, err := startServers("")
	if err != nil {
		return err
	}
	defer sv.stop()
	motoURL, restCfg, setupCfg, kube, sqsc, ec2c := sv.motoURL, sv.restCfg, sv.setupCfg, sv.kube, sv.sqs, sv.ec2
	intakeURL, err := createQueue(ctx, sqsc, "health-router-intake")
	if err != nil {
		return err
	}
	dlqURL, err := createQueue(ctx, sqsc, "health-router-dlq")
	if err != nil {
		return err
	}
	img, err := ec2c.RegisterImage(ctx, &ec2.RegisterImageInput{Name: aws.String("amazon-eks-node-al2023-x86_64-standard-1.34-v20261118"),
		Architecture: ec2types.ArchitectureValuesX8664, RootDeviceName: aws.String("/dev/xvda")})
	if err != nil {
		return fmt.Errorf("registering the node image in moto: %w", err)
	}
	amiAMD64 = aws.ToString(img.ImageId)

	now := time.Now().UTC()
	uids, err := createPools(ctx, kube, now, b.f.pacedLimit)
	if err != nil {
		return err
	}
	n := b.f.nodes
	poolOf := func(i int) (string, types.UID) {
		var p string
		switch {
		case i >= n:
			p = poolSpot
		case i%5 < 2:
			p = poolDefer
		case i%5 < 4:
			p = poolDefault
		default:
			p = poolPaced
		}
		return p, uids[p]
	}
	progress("creating %d Nodes (~40 images each) and NodeClaims through the API server", n+b.f.spotNodes)
	t0 := time.Now()
	if err := createNodes(ctx, kube, 0, n+b.f.spotNodes, 8, poolOf, true, now); err != nil {
		return err
	}
	b.add(fmt.Sprintf("setup: %d realistic Nodes + NodeClaims created (4 requests each, 8 creators)", n+b.f.spotNodes), time.Since(t0).Round(time.Second).String(), "")

	// What the API server wrote as managedFields, for the in-process cache weighing.
	var node0 corev1.Node
	var claim0 karpv1.NodeClaim
	if err := kube.Get(ctx, client.ObjectKey{Name: realistic.NodeName(0)}, &node0); err != nil {
		return err
	}
	if err := kube.Get(ctx, client.ObjectKey{Name: realistic.ClaimName(poolDefer, 0)}, &claim0); err != nil {
		return err
	}

	obs := newOutcomes(poolPaced)
	if err := obs.watch(ctx, setupCfg); err != nil {
		return err
	}
	var l *live
	if b.f.binary {
		dir, err := os.MkdirTemp("", "health-router-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if l, err = newLive(ctx, sv.env, root, dir, sqsc, kube, obs, dlqURL, motoURL); err != nil {
			return err
		}
		if err := b.weighLive(ctx, l, n+b.f.spotNodes); err != nil {
			return err
		}
	}

	var ratios, watchRatios, routerWatchRatios []float64 // bare / router; bare / bare with watches; bare with watches / router
	// round runs one round on the objects of indices [from, from+n]: the bare loop (and the
	// reference with the router's watches) and the router, the bare loop first in odd rounds
	// and last in even ones, so that what drifts through a round (the API server's heap, etcd's
	// revisions) weighs on both sides alike.
	round := func(r, from, tag int) (roundResult, error) {
		b.round = r
		var bare, watched time.Duration
		var res roundResult
		var err error
		bareFirst := r%2 == 1
		if bareFirst {
			if bare, watched, err = b.bareLoops(ctx, kube, restCfg, setupCfg, uids[poolBare], now, false); err != nil {
				return res, err
			}
		}
		if res, err = b.routerRun(ctx, kube, uids, restCfg, setupCfg, sqsc, obs, intakeURL, dlqURL, motoURL, from, n, tag, now); err != nil {
			return res, err
		}
		if !bareFirst {
			if bare, watched, err = b.bareLoops(ctx, kube, restCfg, setupCfg, uids[poolBare], now, true); err != nil {
				return res, err
			}
		}
		ratio := bare.Seconds() / res.took.Seconds()
		b.add("**router speed / bare-loop speed** (same client limit and parallelism)", fmt.Sprintf("**%.2f×**", ratio), "≥ 1.0×")
		b.add("router: writes per instance (patch + delete nodeclaims, healthrecord writes, create events)", fmt.Sprintf("%.2f", res.writes), fmt.Sprintf("bare loop: %.2f", b.bareWrites))
		b.add("**router: API requests per instance / the bare loop's** (issue 36's budget)", fmt.Sprintf("**%.2f×** (%.2f / %.2f)", res.requests/b.bareRequests, res.requests, b.bareRequests), "≤ 1.10×")
		ratios = append(ratios, ratio)
		if watched > 0 {
			watchRatios, routerWatchRatios = append(watchRatios, bare.Seconds()/watched.Seconds()), append(routerWatchRatios, watched.Seconds()/res.took.Seconds())
		}
		return res, nil
	}
	res, err := round(1, 0, 0)
	if err != nil {
		return err
	}
	// More rounds, the same work on fresh objects of their own (indices from r<<18), removed
	// after. Each starts with the paced pool as the first did: the replacements the played
	// Karpenter made in the round before are removed first.
	repl := [2]int{res.replFrom, res.replTo}
	for r := 1; r < b.f.rounds; r++ {
		from := r << 18
		progress("round %d of %d: removing the paced pool's replacements, creating %d Nodes and NodeClaims of its own", r+1, b.f.rounds, n+1)
		if err := b.removeClaims(ctx, kube, repl[0], repl[1], func(int) string { return poolPaced }, false); err != nil {
			return err
		}
		if err := createNodes(ctx, kube, from, from+n+1, 8, func(i int) (string, types.UID) { return poolOf(i - from) }, true, now); err != nil {
			return err
		}
		res, err := round(r+1, from, 100+r)
		if err != nil {
			return err
		}
		progress("round %d: removing its objects", r+1)
		if err := b.removeClaims(ctx, kube, from, from+n+1, func(i int) string { p, _ := b.poolName(i - from); return p }, true); err != nil {
			return err
		}
		repl = [2]int{res.replFrom, res.replTo}
	}
	b.round = 0 // the rounds are over: what follows is tabled
	if len(ratios) > 1 {
		b.add(fmt.Sprintf("**router speed / bare-loop speed, %d rounds** (the bare loop first in odd rounds and last in even ones; each round after the first on fresh objects; the first is the one above)", len(ratios)),
			"**"+medianOf(ratios)+"**", "≥ 1.0×")
	}
	if len(watchRatios) > 0 {
		b.add(fmt.Sprintf("reference: speed of the bare loop with the router's watches beside it / bare-loop speed, %d round(s): what watching Nodes and NodeClaims alone costs", len(watchRatios)),
			medianOf(watchRatios), "")
		b.add(fmt.Sprintf("reference: router speed / speed of the bare loop with the router's watches, %d round(s): what the router costs beyond its watches", len(routerWatchRatios)),
			medianOf(routerWatchRatios), "")
	}
	if m := b.f.memoryNodes; m > 0 {
		progress("weighing the cache in process: %d realistic Nodes + NodeClaims through the router's transforms", m)
		trimmed, err := realistic.CacheHeap(m, true, node0.ManagedFields, claim0.ManagedFields, now)
		if err != nil {
			return err
		}
		b.add(fmt.Sprintf("cache heap per node (Node + NodeClaim, indexed), %d realistic nodes through cluster.Trimmer", m),
			fmt.Sprintf("%.2f KiB (%.0f MiB in all)", trimmed/1024, trimmed*float64(m)/(1<<20)), "≤ 2 KiB")
		if u := min(m, b.f.untrimmedNodes); u > 0 {
			progress("weighing the cache in process: %d untrimmed", u)
			whole, err := realistic.CacheHeap(u, false, node0.ManagedFields, claim0.ManagedFields, now)
			if err != nil {
				return err
			}
			b.add(fmt.Sprintf("same, untrimmed (whole objects, as without the transforms), %d nodes", u),
				fmt.Sprintf("%.2f KiB (%.1f× the trimmed)", whole/1024, whole/trimmed), "")
		}
	}
	if l != nil && b.f.liveNodes > 0 {
		var claims, ids []string
		for i := 0; i < n; i++ {
			if p, _ := b.poolName(i); p == poolDefer {
				claims, ids = append(claims, realistic.ClaimName(poolDefer, i)), append(ids, realistic.InstanceID(i))
			}
		}
		if err := b.scale(ctx, l, uids, n+b.f.spotNodes, claims, ids, 0, now); err != nil {
			return err
		}
	}
	return nil
}

// createNodeClass creates the EC2NodeClass "default", its image the one registered in moto.
func createNodeClass(ctx context.Context, kube client.Client) error {
	nc := &awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: awsv1.EC2NodeClassSpec{
		Role:                       "KarpenterNodeRole-bench",
		AMISelectorTerms:           []awsv1.AMISelectorTerm{{Alias: "al2023@v20261118"}},
		SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "bench"}}},
		SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "bench"}}},
	}}
	if err := kube.Create(ctx, nc); err != nil {
		return fmt.Errorf("creating the EC2NodeClass: %w", err)
	}
	nc.Status.AMIs = []awsv1.AMI{{ID: amiAMD64, Name: "amazon-eks-node-al2023-x86_64-standard-1.34-v20261118", Requirements: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}
	if err := kube.Status().Update(ctx, nc); err != nil {
		return fmt.Errorf("EC2NodeClass status: %w", err)
	}
	return nil
}

// createPool creates a NodePool of the default EC2NodeClass with the given annotations.
func createPool(ctx context.Context, kube client.Client, name string, annotations map[string]string) (types.UID, error) {
	np := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}, Spec: karpv1.NodePoolSpec{
		Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
		}},
	}}
	if err := kube.Create(ctx, np); err != nil {
		return "", fmt.Errorf("creating nodepool %s: %w", name, err)
	}
	return np.UID, nil
}

// createPools creates the EC2NodeClass (its image in moto) and the NodePools.
func createPools(ctx context.Context, kube client.Client, now time.Time, pacedLimit string) (map[string]types.UID, error) {
	if err := createNodeClass(ctx, kube); err != nil {
		return nil, err
	}
	// The defer pool's daily window opens 12 hours from now: closed during the bench.
	hour := (now.Hour() + 12) % 24
	annotations := map[string]map[string]string{
		poolDefer: {"healthrouter.io/action": "defer", "healthrouter.io/window-schedule": fmt.Sprintf("0 %d * * *", hour), "healthrouter.io/window-duration": "2h"},
		poolPaced: {"healthrouter.io/max-concurrent-drains": pacedLimit},
	}
	uids := map[string]types.UID{}
	for _, name := range []string{poolDefer, poolDefault, poolPaced, poolSpot, poolBare} {
		uid, err := createPool(ctx, kube, name, annotations[name])
		if err != nil {
			return nil, err
		}
		uids[name] = uid
	}
	return uids, nil
}

// startProfile writes a CPU profile of this process to path until stop (called once or
// more); path "" profiles nothing.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { pprof.StopCPUProfile(); f.Close() }) }, nil
}

// apiserverProfile profiles kube-apiserver for seconds, from now, into path (nothing when
// path is ""); wait returns once the profile is written.
func apiserverProfile(ctx context.Context, cfg *rest.Config, path string, seconds int) (wait func() error) {
	if path == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		c := rest.CopyConfig(cfg)
		c.Timeout = time.Duration(seconds+30) * time.Second
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			done <- err
			return
		}
		b, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(seconds)).DoRaw(ctx)
		if err != nil {
			done <- fmt.Errorf("profiling kube-apiserver: %w", err)
			return
		}
		done <- os.WriteFile(path, b, 0o644)
	}()
	return func() error { return <-done }
}

// limited returns a client with the router's client limit.
func limited(cfg *rest.Config, qps float64, burst int) (client.Client, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = float32(qps), burst
	s, _ := cluster.NewScheme()
	return client.New(c, client.Options{Scheme: s})
}

// bareLoop reaches the router's outcomes with the fewest writes, on N fresh NodeClaims in a
// pool of its own whose instances take the roles of the router's pools (i%5, as poolName):
// one merge patch of a record the size of the router's for each deferred instance (the defer
// pool, and the paced share past its limit), one DELETE for each drain (the default pool, the
// paced share up to its limit); as the Karpenter the bench plays (the same as in the router's
// run) finishes a paced drain, the next held instance is deleted. It uses the router's client
// limit and parallelism and takes, as the router's run, the time until every instance's
// outcome is written: the least any design recording these outcomes can take, with the same
// background on the API server. With watches, the router's cache of Nodes and NodeClaims
// (app.CacheOptions, the router's indexes) runs beside it in the same process, following every
// change as the router's would.
func (b *bench) bareLoop(ctx context.Context, kube client.Client, restCfg, setupCfg *rest.Config, uid types.UID, now time.Time, watches bool) (time.Duration, error) {
	n := b.f.nodes
	name := "bare loop"
	if watches {
		name = "bare loop with the router's watches"
	}
	// The paced share's limit is the router's: that of the paced pool's size as the round
	// starts.
	var pool metav1.PartialObjectMetadataList
	pool.SetGroupVersionKind(schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaimList"})
	if err := kube.List(ctx, &pool, client.MatchingLabels{karpv1.NodePoolLabelKey: poolPaced}); err != nil {
		return 0, err
	}
	progress("%s: creating %d fresh NodeClaims", name, n)
	offset := 1 << 20
	if err := createNodes(ctx, kube, offset, offset+n, 8, func(int) (string, types.UID) { return poolBare, uid }, false, now); err != nil {
		return 0, err
	}
	reqs := newRequests()
	c, err := limited(reqs.config(restCfg), b.f.qps, b.f.burst)
	if err != nil {
		return 0, err
	}
	karp, err := newKarpenter(setupCfg, b.f.karpenterDelay, 5<<20)
	if err != nil {
		return 0, err
	}
	if watches {
		stop, err := routerWatches(ctx, restCfg, b.f.qps, b.f.burst)
		if err != nil {
			return 0, err
		}
		defer stop()
	}
	// The value the router records for a deferred instance: a record holding the event
	// restricted to that instance (built before the clock starts: the loop only writes).
	values := make([]string, n)
	for i := range values {
		id := realistic.InstanceID(offset + i)
		body := gen.HealthBody("bare-0000", "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", now, now.Add(96*time.Hour), []string{id})
		values[i] = fmt.Sprintf(`[{"event_id":"bare-0000","key":"arn:aws:health:eu-west-1::event/EC2/x/bare-0000","kind":"scheduled-change","until":%q,"reason":"waiting for the maintenance window","state":"deferred","hold":"window","event":%s}]`,
			now.Add(12*time.Hour).Format(time.RFC3339), body)
	}
	limit := pacedLimitFor(b.f.pacedLimit, len(pool.Items))

	// Pacing by hand: at most limit paced drains at once; a finished one deletes the oldest
	// held instance, or frees its slot.
	var (
		mu       sync.Mutex
		inFlight int
		held     []string
		stopped  bool
		failed   atomic.Int64
		deletes  atomic.Int64
		patches  atomic.Int64
		released atomic.Int64
	)
	var del func(name string, pacedDrain bool)
	finished := func() {
		mu.Lock()
		if stopped || len(held) == 0 {
			inFlight--
			mu.Unlock()
			return
		}
		next := held[0]
		held = held[1:]
		mu.Unlock()
		released.Add(1)
		del(next, true)
	}
	var paceMu sync.Mutex
	pacedDrains := map[string]bool{}
	del = func(name string, pacedDrain bool) {
		if pacedDrain {
			paceMu.Lock()
			pacedDrains[name] = true
			paceMu.Unlock()
		}
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := c.Delete(ctx, nc); err != nil && ctx.Err() == nil {
			failed.Add(1)
			return
		}
		deletes.Add(1)
	}
	// Karpenter drains what its watch sees deleting; the bare loop's paced share is the
	// instances it deleted as paced drains.
	karpCtx, stopKarp := context.WithCancel(ctx)
	defer stopKarp()
	if err := karp.watch(karpCtx, poolBare, func(name string) {
		paceMu.Lock()
		paced := pacedDrains[name]
		paceMu.Unlock()
		if paced {
			karp.drain(ctx, name, poolBare, uid, now, finished)
		}
	}); err != nil {
		return 0, err
	}
	patch := func(i int, name string) bool {
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}
		body := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, record.Annotation, values[i])
		if err := c.Patch(ctx, nc, client.RawPatch(types.MergePatchType, body)); err != nil {
			failed.Add(1)
			return false
		}
		patches.Add(1)
		return true
	}

	progress("%s: the router's outcomes, one write each, %d at once, client limit %g/%d; the paced share at most %d at once", name, b.f.parallel, b.f.qps, b.f.burst, limit)
	var next atomic.Int64
	var wg sync.WaitGroup
	settle(ctx, 30*time.Second) // from a quiet API server, as the router's run
	suffix := ".bare"
	if watches {
		suffix = ".watches"
	}
	profiled := apiserverProfile(ctx, setupCfg, b.profilePath(b.f.apiserverProfile, suffix), 20)
	cpuBefore := cpuTimes()
	t0 := time.Now()
	for w := 0; w < b.f.parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				name := realistic.ClaimName(poolBare, offset+i)
				switch p, _ := b.poolName(i); p {
				case poolDefer:
					patch(i, name)
				case poolDefault:
					del(name, false)
				default:
					mu.Lock()
					free := inFlight < limit
					if free {
						inFlight++
					}
					mu.Unlock()
					if free {
						del(name, true)
					} else if patch(i, name) {
						mu.Lock()
						held = append(held, name)
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	cpu := cpuSince(cpuBefore, d)
	karpReqs := karp.requests()
	_, total, _ := since(reqs.snapshot(), nil)
	mu.Lock()
	stopped = true
	mu.Unlock()
	if failed.Load() > 0 {
		return 0, fmt.Errorf("%s: %d writes failed", name, failed.Load())
	}
	b.add(fmt.Sprintf("%s: the router's outcomes for %d instances with one write each (%d merge patches, %d DELETEs, %d of them paced drains released as Karpenter finished), %d at once, limit %g/%d",
		name, n, patches.Load(), deletes.Load(), released.Load(), b.f.parallel, b.f.qps, b.f.burst),
		fmt.Sprintf("%s (%.0f/s)", d.Round(10*time.Millisecond), float64(n)/d.Seconds()), "")
	b.add(name+": API requests while it ran: its own / Karpenter's (played)", fmt.Sprintf("%d (%.2f per instance) / %d", total, float64(total)/float64(n), karpReqs), "")
	b.add(name+": CPU while it ran", cpu, "")
	if !watches {
		b.bareWrites = float64(patches.Load()+deletes.Load()) / float64(n)
		b.bareRequests = float64(total) / float64(n)
	}
	if err := profiled(); err != nil {
		return 0, err
	}
	// Out of the way of the router's run: the played drains finish, finalizers off, then one
	// collection delete.
	progress("%s: removing its NodeClaims", name)
	karp.wg.Wait()
	if err := unfinalize(ctx, kube, offset, offset+n, poolBare); err != nil {
		return 0, err
	}
	if from, to := karp.replacements(); to > from {
		if err := unfinalize(ctx, kube, from, to, poolBare); err != nil {
			return 0, err
		}
	}
	if err := kube.DeleteAllOf(ctx, &karpv1.NodeClaim{}, client.MatchingLabels{karpv1.NodePoolLabelKey: poolBare}); err != nil {
		return 0, err
	}
	return d, nil
}

// bareLoops runs the bare loop and (-watch-reference) the bare loop with the router's
// watches, in that order or (reverse) the other; watched is 0 without the reference.
func (b *bench) bareLoops(ctx context.Context, kube client.Client, restCfg, setupCfg *rest.Config, uid types.UID, now time.Time, reverse bool) (bare, watched time.Duration, err error) {
	if !b.f.watchReference {
		bare, err = b.bareLoop(ctx, kube, restCfg, setupCfg, uid, now, false)
		return bare, 0, err
	}
	first, second := &bare, &watched
	if reverse {
		first, second = second, first
	}
	if *first, err = b.bareLoop(ctx, kube, restCfg, setupCfg, uid, now, reverse); err != nil {
		return 0, 0, err
	}
	*second, err = b.bareLoop(ctx, kube, restCfg, setupCfg, uid, now, !reverse)
	return bare, watched, err
}

// medianOf tables ratios: their median (of an even number, the mean of the middle two) and
// each in order.
func medianOf(ratios []float64) string {
	var each []string
	for _, r := range ratios {
		each = append(each, fmt.Sprintf("%.2f×", r))
	}
	sorted := slices.Clone(ratios)
	slices.Sort(sorted)
	median := (sorted[(len(sorted)-1)/2] + sorted[len(sorted)/2]) / 2
	return fmt.Sprintf("median %.2f× (rounds in order: %s)", median, strings.Join(each, ", "))
}

// routerWatches starts the router's cache of Nodes and NodeClaims as the router builds it
// (app.CacheOptions, cluster's indexes, its client limit) and waits for it to sync; stop ends
// it.
func routerWatches(ctx context.Context, cfg *rest.Config, qps float64, burst int) (stop func(), err error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = float32(qps), burst
	scheme, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := crcache.New(cfg, app.CacheOptions(scheme, cluster.NewTrimmer()))
	if err != nil {
		return nil, err
	}
	if err := cluster.SetupIndexes(ctx, c); err != nil {
		return nil, err
	}
	for _, obj := range []client.Object{&corev1.Node{}, &karpv1.NodeClaim{}} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			return nil, err
		}
	}
	return startCache(ctx, c, "the router's watches")
}

// startCache starts c and waits for its informers to sync; stop ends it and waits until it
// has stopped.
func startCache(ctx context.Context, c crcache.Cache, what string) (stop func(), err error) {
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Start(cctx) }()
	if !c.WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("%s did not sync: %v", what, <-done)
	}
	return func() { cancel(); <-done }, nil
}

func unfinalize(ctx context.Context, kube client.Client, from, to int, pool string) error {
	return inParallel(from, to, 8, func(i int) error {
		return unfinalizeOne(ctx, kube, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: realistic.ClaimName(pool, i)}})
	})
}

// unfinalizeOne takes the finalizers off nc; one already gone is no error.
func unfinalizeOne(ctx context.Context, kube client.Client, nc *karpv1.NodeClaim) error {
	if err := kube.Patch(ctx, nc, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// roundResult is what a round of the router leaves: its time, and the index range of the
// played Karpenter's replacements.
type roundResult struct {
	took             time.Duration
	writes           float64 // NodeClaim patches and deletes, HealthRecord writes and Event creates per instance
	requests         float64 // API requests per instance
	replFrom, replTo int
}

// removeClaims removes the NodeClaims of indices [from, to), each of the pool pool(i)
// names, finalizers off first, and with node their Nodes.
func (b *bench) removeClaims(ctx context.Context, kube client.Client, from, to int, pool func(i int) string, node bool) error {
	return inParallel(from, to, 8, func(i int) error {
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: realistic.ClaimName(pool(i), i)}}
		if err := unfinalizeOne(ctx, kube, nc); err != nil {
			return err
		}
		if err := kube.Delete(ctx, nc); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if !node {
			return nil
		}
		if err := kube.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: realistic.NodeName(i)}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
}

// inParallel calls fn for every i in [from, to), workers at once; the first error is returned.
func inParallel(from, to, workers int, fn func(i int) error) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := fn(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}

// routerRun runs the router in process and sends the bulk event naming instances [from,
// from+n), the Spot interruption in the middle of it, and plays Karpenter for the paced pool.
func (b *bench) routerRun(ctx context.Context, kube client.Client, uids map[string]types.UID, restCfg, setupCfg *rest.Config, sqsc *sqs.Client, obs *outcomes,
	intakeURL, dlqURL, motoURL string, from, n, tag int, now time.Time) (res roundResult, err error) {
	reqs := newRequests()
	cfg := reqs.config(restCfg)
	gates := checks.NewFeatureGates()
	_ = gates.Set("ReservedCapacity=false") // moto has no capacity reservation API
	probe := freePort()
	o := options.Run{
		QueueURL: intakeURL, DeadLetterQueueURL: dlqURL, Signal: signal.ModeDeleteNodeClaim,
		Workers: options.DefaultWorkers, Receivers: options.DefaultReceivers,
		Visibility: 30 * time.Second, WaitTime: time.Second, HandleTimeout: 2 * time.Minute, Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: motoURL,
		Gates: gates, MetricsBindAddress: "0", HealthProbeBindAddress: fmt.Sprintf("127.0.0.1:%d", probe), ShutdownTimeout: 10 * time.Second,
		KubeClientQPS: b.f.qps, KubeClientBurst: b.f.burst, InstanceParallelism: b.f.parallel,
	}
	reg := prometheus.NewRegistry()
	routerCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	progress("starting the router in process (delete-nodeclaim mode, client limit %g/%d, %d instances at once)", b.f.qps, b.f.burst, b.f.parallel)
	tStart := time.Now()
	go func() { done <- app.Run(routerCtx, o, cfg, reg, log) }()
	if err := waitReady(ctx, probe, done); err != nil {
		return res, err
	}
	b.add("router: start until ready (cache synced)", time.Since(tStart).Round(10*time.Millisecond).String(), "")

	// Karpenter, as the bench plays it for the paced pool (as in the bare loop's run).
	karp, err := newKarpenter(setupCfg, b.f.karpenterDelay, 3<<20+from)
	if err != nil {
		return res, err
	}
	if err := karp.watch(routerCtx, poolPaced, func(name string) { karp.drain(ctx, name, poolPaced, uids[poolPaced], now, nil) }); err != nil {
		return res, err
	}
	// As in a cluster where the router has been running: its start-up work (the first
	// reconcile of every NodeClaim by the deferral controller, more in a larger cluster) is
	// done before the event is sent, and the API server is as quiet as before the bare loop.
	settled := settle(ctx, 30*time.Second)
	b.add("router: ready until settled (the bench's process and kube-apiserver under 10% of a core for a second)", settled.Round(100*time.Millisecond).String(), "")

	// The bulk event: every instance, split as EventBridge must (256 KiB, at most perEvent IDs).
	var ids, claims, paced []string
	for i := from; i < from+n; i++ {
		ids = append(ids, realistic.InstanceID(i))
		p, _ := b.poolName(i - from)
		claims = append(claims, realistic.ClaimName(p, i))
		if p == poolPaced {
			paced = append(paced, claims[len(claims)-1])
		}
	}
	bodies, eventIDs := healthEvents(ids, b.f.perEvent, now, tag, 4)
	obs.expect(eventIDs, claims, paced)
	before := reqs.snapshot()
	progress("sending %d Health event(s) naming %d instances", len(bodies), n)
	stopProfile, err := startProfile(b.profilePath(b.f.cpuProfile, ""))
	if err != nil {
		return res, err
	}
	defer stopProfile()
	profiled := apiserverProfile(ctx, setupCfg, b.profilePath(b.f.apiserverProfile, ".router"), 20)
	cpuBefore := cpuTimes()
	tSend := time.Now()
	for _, body := range bodies {
		if _, err := sqsc.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(intakeURL), MessageBody: aws.String(body)}); err != nil {
			return res, fmt.Errorf("sending the Health event: %w", err)
		}
	}

	// A Spot interruption for a node outside the bulk event, once a quarter of it is recorded.
	spotClaim := realistic.ClaimName(poolSpot, from+n)
	spotDeleted := obs.deletionOf(spotClaim)
	spotLatency := make(chan time.Duration, 1)
	go func() {
		for obs.recordedCount() < n/4 && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		body := spotBody(realistic.InstanceID(from+n), time.Now())
		t := time.Now()
		if _, err := sqsc.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(intakeURL), MessageBody: aws.String(body)}); err != nil {
			spotLatency <- -1
			return
		}
		select {
		case at := <-spotDeleted:
			spotLatency <- at.Sub(t)
		case <-time.After(2 * time.Minute):
			spotLatency <- -1
		}
	}()

	select {
	case <-obs.onAll:
	case <-ctx.Done():
		return res, fmt.Errorf("the bulk event was not carried out before the bench's timeout (%d of %d recorded)", obs.recordedCount(), n)
	case err := <-done:
		return res, fmt.Errorf("the router stopped: %v", err)
	}
	took := obs.allAt.Sub(tSend)
	res.took = took
	cpu := cpuSince(cpuBefore, time.Since(tSend))
	stopProfile()
	lines, total, by := since(reqs.snapshot(), before)
	karpReqs := karp.requests()
	deletedAt := waitQueueEmpty(ctx, sqsc, intakeURL)
	if err := profiled(); err != nil {
		return res, err
	}
	b.add(fmt.Sprintf("router: %d instances, send until every outcome is recorded", n),
		fmt.Sprintf("%s (%.0f/s)", took.Round(10*time.Millisecond), float64(n)/took.Seconds()), "")
	b.add("router: send until the message(s) are deleted from SQS", deletedAt.Sub(tSend).Round(10*time.Millisecond).String(), "")
	b.add("router: CPU until every outcome is recorded (Karpenter played by the bench included)", cpu, "")
	b.add(fmt.Sprintf("router: API requests until recorded (%d, %.2f per instance)", total, float64(total)/float64(n)), strings.Join(lines, ", "), "")
	b.add("router: Karpenter's (played) API requests until recorded", fmt.Sprint(karpReqs), "")
	res.writes = float64(by["patch nodeclaims"]+by["delete nodeclaims"]+by["create healthrecords"]+by["update healthrecords"]+by["delete healthrecords"]+by["create events"]) / float64(n)
	res.requests = float64(total) / float64(n)

	select {
	case l := <-spotLatency:
		if l < 0 {
			b.fail("the Spot interruption sent during the bulk work was not signalled")
			b.add("Spot interruption during the bulk work: send until NodeClaim deleted", "not signalled", "≤ 5 s")
		} else {
			b.add("Spot interruption during the bulk work: send until NodeClaim deleted", l.Round(time.Millisecond).String(), "≤ 5 s")
			if l > 5*time.Second {
				b.fail("the Spot interruption took %s to be signalled (target 5 s)", l)
			}
		}
	case <-ctx.Done():
		return res, ctx.Err()
	}

	progress("waiting for the paced pool (%d NodeClaims, max-concurrent-drains %s) to drain", len(paced), b.f.pacedLimit)
	select {
	case <-obs.onPacedDone:
	case <-ctx.Done():
		obs.mu.Lock()
		left := len(obs.pacedLeft)
		obs.mu.Unlock()
		b.fail("the paced pool did not drain before the timeout (%d NodeClaims left)", left)
	}
	obs.mu.Lock()
	maxIn, pacedDone, largest := obs.maxInFlight, obs.pacedDone, obs.maxPresent
	obs.mu.Unlock()
	// Karpenter's replacements grow the pool while drains are in flight, and a percentage
	// grows with it: the bound is the limit at the pool's largest size.
	limit := pacedLimitFor(b.f.pacedLimit, largest)
	releases := counterValue(reg, metrics.Redecisions, map[string]string{"hold": "pacing"})
	if !pacedDone.IsZero() {
		b.add(fmt.Sprintf("paced pool: %d NodeClaims drained (Karpenter played: a replacement at once, %s per drain)", len(paced), b.f.karpenterDelay),
			fmt.Sprintf("%s from the send, %.0f held drains released by the deferral controller", pacedDone.Sub(tSend).Round(100*time.Millisecond), releases),
			fmt.Sprintf("≥ %s (%d rounds of %d)", (time.Duration((len(paced)+limit-1)/max(limit, 1))*b.f.karpenterDelay).Round(time.Second), (len(paced)+limit-1)/max(limit, 1), limit))
	}
	b.add("paced pool: most drains in flight at once (every change the watch showed)", fmt.Sprintf("%d", maxIn), fmt.Sprintf("≤ %d (max-concurrent-drains %s of the pool's largest size, %d NodeClaims)", limit, b.f.pacedLimit, largest))
	if maxIn > limit {
		b.fail("the paced pool had %d drains in flight, over its limit %d", maxIn, limit)
	}
	switch {
	case maxIn >= limit && releases == 0:
		b.fail("the paced pool reached its limit but no drain held by pacing was released by the deferral controller")
	case maxIn < limit:
		// Karpenter (as played) finished drains faster than the router signalled them:
		// pacing never had to hold one. Said in the table, not hidden.
		b.add("paced pool: pacing engaged?", fmt.Sprintf("no: the router signalled the pool's drains slower than Karpenter finished them (%d in flight at most, limit %d); raise --karpenter-delay", maxIn, limit), "")
	}
	stopRouter()
	if err := <-done; err != nil {
		return res, fmt.Errorf("router: %w", err)
	}
	karp.wg.Wait()
	res.replFrom, res.replTo = karp.replacements()
	return res, nil
}

func (b *bench) poolName(i int) (string, bool) {
	switch {
	case i >= b.f.nodes:
		return poolSpot, false
	case i%5 < 2:
		return poolDefer, false
	case i%5 < 4:
		return poolDefault, false
	}
	return poolPaced, true
}

// pacedLimitFor is the limit of a pool of size nodes, as the router reads it (percentages
// round up, as Karpenter's disruption budgets).
func pacedLimitFor(v string, nodes int) int {
	if p, ok := strings.CutSuffix(v, "%"); ok {
		var pct int
		fmt.Sscan(p, &pct)
		return (pct*nodes + 99) / 100
	}
	var k int
	fmt.Sscan(v, &k)
	return k
}

// healthEvents splits one AZ-wide maintenance into Health events of at most perEvent IDs and
// 256 KiB each, as AWS Health delivers it through EventBridge. tag keeps the event IDs of
// each phase apart; days sets the maintenance's start (a different one is a different
// maintenance for the same instances).
func healthEvents(ids []string, perEvent int, now time.Time, tag, days int) (bodies, eventIDs []string) {
	start := now.Add(time.Duration(days) * 24 * time.Hour)
	k := min(perEvent, len(ids))
	for ; k > 1; k -= 50 {
		if len(gen.HealthBody("a2f0c1d2-0000-4000-8000-000000000000", "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", now, start, ids[:k])) <= maxEventBytes {
			break
		}
	}
	for from := 0; from < len(ids); from += k {
		id := fmt.Sprintf("a2f0c1d2-%04d-4000-8000-%012d", tag, from)
		bodies = append(bodies, gen.HealthBody(id, "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED", now, start, ids[from:min(from+k, len(ids))]))
		eventIDs = append(eventIDs, id)
	}
	return bodies, eventIDs
}

func spotBody(instance string, now time.Time) string {
	return fmt.Sprintf(`{"version":"0","id":"5b1c0f3e-spot-4000-8000-%012d","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"111122223333","time":%q,"region":"eu-west-1","resources":["arn:aws:ec2:eu-west-1:111122223333:instance/%s"],"detail":{"instance-id":%q,"instance-action":"terminate"}}`,
		now.UnixNano()%1e12, now.UTC().Format(time.RFC3339), instance, instance)
}

func waitReady(ctx context.Context, port int, done <-chan error) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	for {
		select {
		case err := <-done:
			return fmt.Errorf("the router stopped before it was ready: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

// waitQueueEmpty waits until the intake queue holds no message, visible or not: every
// message was deleted.
func waitQueueEmpty(ctx context.Context, sqsc *sqs.Client, url string) time.Time {
	for ctx.Err() == nil {
		a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}})
		if err == nil && a.Attributes["ApproximateNumberOfMessages"] == "0" && a.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0" {
			return time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Now()
}

func counterValue(reg *prometheus.Registry, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			total += m.GetCounter().GetValue()
		}
	}
	return total
}

func createQueue(ctx context.Context, c *sqs.Client, name string) (string, error) {
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("creating queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

func (b *bench) print() {
	fmt.Printf("\nhealth-router %s — %s, %d CPUs (%s), %s; envtest kube-apiserver %s, moto_server SQS/EC2\n\n",
		b.title, runtime.Version(), runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02"), "v1.37")
	fmt.Println("| measure | result | target |")
	fmt.Println("| --- | --- | --- |")
	for _, r := range b.rows {
		fmt.Printf("| %s | %s | %s |\n", r.measure, r.result, r.target)
	}
}

// settle waits until the bench's process (the router in it) and kube-apiserver each use
// under a tenth of a core over a second, or for at most bound; it returns how long it waited.
func settle(ctx context.Context, bound time.Duration) time.Duration {
	t0 := time.Now()
	for time.Since(t0) < bound && ctx.Err() == nil {
		before := cpuTimes()
		time.Sleep(time.Second)
		after := cpuTimes()
		if after["bench+router"]-before["bench+router"] < 0.1 && after["kube-apiserver"]-before["kube-apiserver"] < 0.1 {
			break
		}
	}
	return time.Since(t0)
}

// profilePath is path with suffix, or "" (no profile) for no path and in a round other than
// -profile-round.
func (b *bench) profilePath(path, suffix string) string {
	if path == "" || b.round != b.f.profileRound {
		return ""
	}
	return path + suffix
}

func cpuModel() string {
	bs, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(bs), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

func repoRoot() (string, error) { return harness.RepoRoot() }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// servers are what both benches run on: moto_server and the envtest kube-apiserver with the
// Karpenter CRDs, a fast client for the setup, and SQS and EC2 clients on moto.
type servers struct {
	motoURL           string
	env               *envtest.Environment
	restCfg, setupCfg *rest.Config
	kube              client.Client
	scheme            *k8sruntime.Scheme
	sqs               *sqs.Client
	ec2               *ec2.Client
	stop              func()
}

// startServers starts the servers; what says which bench (its progress prefix).
func startServers(what string) (*servers, error) {
	progress("%sstarting moto_server and the envtest kube-apiserver with the Karpenter CRDs", what)
	motoURL, stopMoto, err := harness.StartMoto()
	if err != nil {
		return nil, err
	}
	env, restCfg, err := harness.StartEnvtest()
	if err != nil {
		stopMoto()
		return nil, err
	}
	sv := &servers{motoURL: motoURL, env: env, restCfg: restCfg, stop: func() { _ = env.Stop(); stopMoto() }}
	if sv.scheme, err = cluster.NewScheme(); err != nil {
		sv.stop()
		return nil, err
	}
	sv.setupCfg = rest.CopyConfig(restCfg)
	sv.setupCfg.QPS, sv.setupCfg.Burst = 5000, 5000
	if sv.kube, err = client.New(sv.setupCfg, client.Options{Scheme: sv.scheme}); err != nil {
		sv.stop()
		return nil, err
	}
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": harness.Region} {
		os.Setenv(k, v)
	}
	awsCfg := aws.Config{Region: harness.Region, Credentials: credentials.NewStaticCredentialsProvider("bench", "bench", "")}
	sv.sqs = sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(motoURL) })
	sv.ec2 = ec2.NewFromConfig(awsCfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(motoURL) })
	return sv, nil
}
