// Package soak runs the router as a process for minutes or hours in the cluster in a box
// (test/box) with the real Karpenter, while an EC2 that acts like AWS draws scheduled
// maintenance for the workloads' instances and carries out at its start whatever nothing
// moved, the router is killed and restarted at random times, and an outside checker that
// reads only the cluster and the EC2 stand-in asserts, every second, what the workloads'
// owners were promised (issue 37, item 3). `make soak DURATION=4h` runs it for hours; `make
// test` for five minutes.
//
// Time is compressed by policy, never by a fake clock: the kafka pool's window opens every
// three minutes for one minute, its drain-lead is 90 seconds, and AWS schedules its events
// two and a half to five minutes ahead.
package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/box"
	"github.com/health-router/health-router/test/harness"
)

// The kafka pool's policy, compressed: a window every windowEvery (cron "*/3"), windowLength
// long, and drain-lead. The checker judges with these numbers, not with the router's parser.
const (
	windowEvery  = 3 * time.Minute
	windowLength = time.Minute
	drainLead    = 90 * time.Second
)

// How far ahead AWS schedules a maintenance: enough for drain-lead and a drain, short enough
// that a five-minute soak sees them carried out or acted on.
const (
	aheadMin = 150 * time.Second
	aheadMax = 5 * time.Minute
)

// settle is how long before the end of the run the last maintenance starts and the last
// fault is injected, so that the end checks see a world at rest.
const settle = 45 * time.Second

// defaultSeed is the seed of a soak run without SOAK_SEED: make test draws the same events
// every time.
const defaultSeed = 20261207

// namespace holds the workloads.
const namespace = "soak"

// Replicas of each workload, one per node, and the least Ready their PDBs allow.
const (
	replicas = 3
	minReady = 2
)

// settings are the run's duration and seed, from SOAK_DURATION and SOAK_SEED.
type settings struct {
	duration time.Duration
	seed     uint64
}

func readSettings(t *testing.T) settings {
	t.Helper()
	s := settings{duration: 5 * time.Minute, seed: defaultSeed}
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 3*time.Minute {
			t.Fatalf("SOAK_DURATION=%q: want a Go duration of at least 3m (5m, 4h)", v)
		}
		s.duration = d
	}
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want a whole number", v)
		}
		s.seed = n
	}
	return s
}

// TestSoak is the soak: the world (kafka deferring into its window, web draining at once),
// the router as a process in front of Karpenter, AWS drawing maintenance and carrying it out,
// the router SIGKILLed and restarted, and the outside checker. It ends with a table of what
// was drawn, injected and checked, and the router's resource curves.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak runs a cluster in a box, the real Karpenter and the router for minutes")
	}
	cfg := readSettings(t)
	t.Logf("soak: %s, seed %d (SOAK_SEED=%d draws the same events and faults; the interleaving of the goroutines, the router's and Karpenter's is not replayed)", cfg.duration, cfg.seed, cfg.seed)
	began := time.Now()
	w := newWorld(t)
	t.Logf("world up in %s: kafka and web Ready, 3 nodes each", time.Since(began).Round(time.Second))

	r := startRouter(t, w)
	start := time.Now()
	end := start.Add(cfg.duration)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A maintenance every 12 s on average in a short run, every minute in a long one: each
	// replaces a node (Karpenter launches another), and moto keeps every instance it ever ran.
	gap := min(max(cfg.duration/25, 12*time.Second), time.Minute)
	sim := newCloud(w, rand.New(rand.NewPCG(cfg.seed, 1)), end.Add(-settle), gap)
	chk := newChecker(w, sim)
	kills := newFaults(w, r, rand.New(rand.NewPCG(cfg.seed, 2)), cfg.duration)
	stopped := runAll(ctx,
		sim.mirror, sim.draw, sim.carryOut,
		chk.run,
		r.sample,
		// Faults in the first 60% of the run only: the last router then lives long enough for
		// its curves to say something, 2 minutes of a 5-minute run, 96 of a 4-hour one.
		func(ctx context.Context) { kills.run(ctx, start.Add(cfg.duration*6/10)) },
	)
	select {
	case <-time.After(time.Until(end)):
	case <-w.ctx.Done():
		t.Errorf("the soak's own deadline passed before its end")
	}
	kills.wait()
	r.ensureRunning()
	chk.settle(ctx)
	cancel()
	stopped()
	sim.wait()
	chk.final(context.Background())
	r.stop()
	curves := judgeCurves(t, r)
	t.Logf("soak done: %s of soak, %s in all", time.Since(start).Round(time.Second), time.Since(began).Round(time.Second))
	t.Log("\n" + table(sim, kills, chk, r, curves))
}

// world is the box with Karpenter, the two pools and their workloads, the queues the router
// reads, and the EC2 stand-in the router asks about scheduled events.
type world struct {
	t        *testing.T
	ctx      context.Context // bounds the whole test: setup, the run, the end checks
	box      *box.Box
	stage    *harness.KarpenterStage
	kube     client.Client
	ec2      *harness.EC2InstanceStatus
	moto     *harness.Proxy // the router's way to moto
	endpoint string         // the router's AWS endpoint: the stand-in for scheduled events, moto for the rest
	intake   string
	dlq      string
}

// newWorld starts the box and Karpenter, creates the pools, the workloads and their PDBs, and
// returns once both workloads are Ready on three nodes each that Karpenter launched.
func newWorld(t *testing.T) *world {
	t.Helper()
	b := box.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute+soakBound())
	t.Cleanup(cancel)
	stage, err := b.StartKarpenter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, box: b, stage: stage, kube: b.Client()}
	if err := stage.NodePool(ctx, "kafka", map[string]string{
		policy.AnnotationAction:              "defer",
		policy.AnnotationWindowSchedule:      fmt.Sprintf("*/%d * * * *", int(windowEvery.Minutes())),
		policy.AnnotationWindowDuration:      windowLength.String(),
		policy.AnnotationDrainLead:           drainLead.String(),
		policy.AnnotationMaxConcurrentDrains: "1",
	}); err != nil {
		t.Fatal(err)
	}
	if err := stage.NodePool(ctx, "web", map[string]string{policy.AnnotationAction: "drain"}); err != nil {
		t.Fatal(err)
	}
	if err := w.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"kafka", "web"} {
		if err := w.kube.Create(ctx, pdb(app)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.kube.Create(ctx, kafka()); err != nil {
		t.Fatal(err)
	}
	if err := w.kube.Create(ctx, web()); err != nil {
		t.Fatal(err)
	}
	w.waitWorkloads(ctx, 5*time.Minute)
	w.ec2, _ = harness.NewEC2InstanceStatus(t)
	// The router reaches moto (SQS, the rest of EC2) through a proxy the faults can cut.
	w.moto = harness.NewProxy(t, strings.TrimPrefix(stage.Moto, "http://"))
	w.endpoint = harness.SplitEC2(t, "http://"+w.moto.Addr, w.ec2)
	w.intake, w.dlq = w.queue("soak-intake"), w.queue("soak-dlq")
	return w
}

// soakBound is the longest the run itself may take, past which the world's context ends.
func soakBound() time.Duration {
	d := 5 * time.Minute
	if v, err := time.ParseDuration(os.Getenv("SOAK_DURATION")); err == nil {
		d = v
	}
	return d + 10*time.Minute // the end checks and the router's shutdown
}

// waitWorkloads waits until both workloads have every replica Ready, each on a node of its own.
func (w *world) waitWorkloads(ctx context.Context, timeout time.Duration) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		kafka, web, err := w.readyPods(ctx)
		if err == nil && len(kafka) == replicas && len(web) == replicas {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("workloads not Ready within %s: kafka on %v, web on %v (error %v)", timeout, kafka, web, err)
		}
		time.Sleep(time.Second)
	}
}

// readyPods returns the nodes of each workload's Ready pods (one pod per node by
// anti-affinity).
func (w *world) readyPods(ctx context.Context) (kafka, web []string, err error) {
	pods := &corev1.PodList{}
	if err := w.kube.List(ctx, pods, client.InNamespace(namespace)); err != nil {
		return nil, nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !podReady(p) {
			continue
		}
		switch p.Labels["app"] {
		case "kafka":
			kafka = append(kafka, p.Spec.NodeName)
		case "web":
			web = append(web, p.Spec.NodeName)
		}
	}
	return kafka, web, nil
}

// queue creates an SQS queue in the stage's moto.
func (w *world) queue(name string) string {
	w.t.Helper()
	out, err := w.stage.SQS.CreateQueue(w.ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		w.t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

// kafka is the StatefulSet: 3 brokers on the kafka pool, one per node.
func kafka() *appsv1.StatefulSet {
	labels := map[string]string{"app": "kafka"}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "kafka"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](replicas),
			ServiceName:         "kafka",
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template:            podTemplate("kafka", labels),
		},
	}
}

// web is the Deployment: 3 replicas on the web pool, one per node.
func web() *appsv1.Deployment {
	labels := map[string]string{"app": "web"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: podTemplate("web", labels),
		},
	}
}

// podTemplate is a pod of pool's workload: on the pool's nodes, one per node, with requests
// that make Karpenter launch a node for it.
func podTemplate(pool string, labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{karpv1.NodePoolLabelKey: pool},
			Containers: []corev1.Container{{Name: pool, Image: pool + ":box", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi"),
			}}}},
			Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
					LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					TopologyKey:   corev1.LabelHostname,
				}},
			}},
		},
	}
}

// pdb is app's PodDisruptionBudget: one pod down at most.
func pdb(app string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(replicas - minReady)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
}

// podReady reports whether a pod serves: running, Ready, not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// instanceOf returns the EC2 instance of a provider ID (aws:///<zone>/<instance>), or "".
func instanceOf(providerID string) string {
	i := strings.LastIndex(providerID, "/")
	if !strings.HasPrefix(providerID, "aws:///") || i < 0 || !strings.HasPrefix(providerID[i+1:], "i-") {
		return ""
	}
	return providerID[i+1:]
}

// runAll runs each loop in a goroutine until ctx ends; the returned function waits for them.
func runAll(ctx context.Context, loops ...func(context.Context)) (wait func()) {
	done := make(chan struct{}, len(loops))
	for _, loop := range loops {
		go func() {
			defer func() { done <- struct{}{} }()
			loop(ctx)
		}()
	}
	return func() {
		for range loops {
			<-done
		}
	}
}
