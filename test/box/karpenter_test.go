package box_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/bench/gen"
	"github.com/health-router/health-router/test/box"
	"github.com/health-router/health-router/test/harness"
	"github.com/health-router/health-router/test/harness/inproc"
)

// TestBoxSideBySide runs the same world and the same AWS event twice, one box after the other:
// the kafka StatefulSet (3 brokers, one per node, PDB maxUnavailable 1) on a Karpenter NodePool
// whose owners want maintenance in a window, and an AWS Health retirement of one broker's
// instance scheduled minutes ahead (time compressed by policy: a 3-minute window opening a
// minute or two after the event, AWS's start 8 minutes after it, a drain lead of 2 minutes).
//
//   - Karpenter alone (no router: the event on Karpenter's interruption queue, as its own
//     EventBridge rule sends it): Karpenter drains the node at once, outside the window;
//   - the router in front (Karpenter's rule removed, the router's feeding its intake, drains
//     forwarded to Karpenter's queue), the pool annotated to defer into the window: nothing is
//     disrupted before the window; in it the router has Karpenter drain the node, before AWS.
//
// Both runs: the brokers' pending pods bring up three nodes through the real Karpenter (its
// provisioner, moto's EC2, the box playing each instance's kubelet), the broker is evicted
// under its PDB and moved to a node Karpenter launches in its place. It prints the table
// (docs/testing.md) and writes the picture of Ready brokers over time, both runs on one axis,
// to $BOX_PLOT (make box-plot writes docs/box-side-by-side.png) or the test's directory.
func TestBoxSideBySide(t *testing.T) {
	var runs []sideRun
	t.Run("karpenter alone", func(t *testing.T) {
		k := kafkaOnKarpenter(t, nil)
		r := k.begin("Karpenter alone", windowAfter(time.Now()))
		r.sent = k.send(t, k.stage.QueueURL, r.aws)
		k.waitDrained(t)
		r.drained = time.Now()
		k.waitMoved(t)
		runs = append(runs, k.finish(t, r))
	})
	t.Run("router in front", func(t *testing.T) {
		k := kafkaOnKarpenter(t, nil)
		// The pool's owners ask for its window once the world is up (the router reads the
		// annotations as they are when it decides).
		opens := windowAfter(time.Now())
		np := &karpv1.NodePool{}
		if err := k.c.Get(k.ctx, client.ObjectKey{Name: "kafka"}, np); err != nil {
			t.Fatal(err)
		}
		np.Annotations = map[string]string{
			policy.AnnotationAction:         "defer",
			policy.AnnotationWindowSchedule: fmt.Sprintf("%d %d * * *", opens.Minute(), opens.Hour()),
			policy.AnnotationWindowDuration: sideWindow.String(),
			policy.AnnotationDrainLead:      sideLead.String(),
		}
		if err := k.c.Update(k.ctx, np); err != nil {
			t.Fatal(err)
		}
		r := k.begin("router in front", opens)
		intake := k.queue(t, "box-intake")
		inproc.Router(t, options.Run{
			QueueURL: intake, DeadLetterQueueURL: k.queue(t, "box-dlq"), Signal: signal.ModeForward, KarpenterQueueURL: k.stage.QueueURL,
			Workers: 10, Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 5 * time.Second,
			Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: k.stage.Moto, Gates: checks.NewFeatureGates(),
			MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second, NodeMarks: true,
		}, k.box.Config())
		// The event arrives a minute or more before the window, as scheduled maintenance does.
		r.sent = k.send(t, intake, r.aws)
		for time.Now().Before(opens.Add(-5 * time.Second)) {
			if k.deleting(t) {
				t.Fatalf("the nodeclaim is deleting at %s, before the window opens at %s", time.Now().UTC().Format(time.TimeOnly), opens.Format(time.TimeOnly))
			}
			time.Sleep(time.Second)
		}
		k.waitDrained(t)
		r.drained = time.Now()
		k.waitMoved(t)
		runs = append(runs, k.finish(t, r))
	})
	if len(runs) != 2 {
		t.Fatalf("%d of 2 runs finished", len(runs))
	}
	alone, router := runs[0], runs[1]
	table := sideTable(runs)
	t.Logf("side by side, one kafka broker's instance retired by AWS:\n%s", table)
	path := os.Getenv("BOX_PLOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "side-by-side.png")
	}
	if err := sidePlot(runs, path); err != nil {
		t.Fatalf("the picture: %v", err)
	}
	t.Logf("picture: %s", path)
	// What the table must show (issue 37): Karpenter alone disrupts kafka outside its window
	// for an event AWS scheduled ahead, the router does not; neither breaks the PDB, both act
	// before AWS and lose no event.
	if alone.outsideWindow() == 0 {
		t.Errorf("Karpenter alone: no disruption outside the window (drained %s after the event)", alone.drained.Sub(alone.sent))
	}
	if n := router.outsideWindow(); n != 0 {
		t.Errorf("router in front: %d disruption(s) outside the window", n)
	}
	for _, r := range runs {
		if r.least < 2 || r.belowPDB > 0 {
			t.Errorf("%s: at least %d broker(s) Ready, %s below the PDB's minimum, want 2 and none", r.name, r.least, r.belowPDB)
		}
		if !r.drained.Before(r.aws) {
			t.Errorf("%s: drained at %s, not before AWS's start %s", r.name, r.drained.Format(time.TimeOnly), r.aws.Format(time.TimeOnly))
		}
	}
}

// The side-by-side run's compressed schedule: a window of sideWindow opening a minute or two
// after the event, AWS's start sideAWSAfterOpen after the opening, and a drain lead of
// sideLead (the router drains at deadline minus lead at the latest).
const (
	sideWindow       = 3 * time.Minute
	sideAWSAfterOpen = 6 * time.Minute
	sideLead         = 2 * time.Minute
)

// windowAfter is the first minute boundary at least 70 s after at: where a daily window of
// the side-by-side run opens.
func windowAfter(at time.Time) time.Time {
	return at.UTC().Add(70 * time.Second).Truncate(time.Minute).Add(time.Minute)
}

// kafkaWorld is the kafka StatefulSet on three nodes Karpenter launched in a box, and the
// broker whose instance the tests' AWS event names.
type kafkaWorld struct {
	ctx      context.Context
	box      *box.Box
	stage    *harness.KarpenterStage
	c        client.Client
	claim    karpv1.NodeClaim // kafka-0's
	node     string
	instance string
	low      func() int // the fewest Ready brokers seen since the world was up
	samples  func() []readySample
}

// kafkaOnKarpenter starts a box with Karpenter, the NodePool "kafka" with annotations, the
// StatefulSet and its PDB (maxUnavailable 1), and waits until the three brokers are Ready on
// three nodes Karpenter launched.
func kafkaOnKarpenter(t *testing.T, annotations map[string]string) *kafkaWorld {
	t.Helper()
	start := time.Now()
	b := box.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	stage, err := b.StartKarpenter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("box and Karpenter up in %s", time.Since(start).Round(time.Millisecond))
	c := b.Client()
	if err := stage.NodePool(ctx, "kafka", annotations); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kafka"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kafka"}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	ss := kafka()
	ss.Spec.Template.Spec.NodeSelector = map[string]string{karpv1.NodePoolLabelKey: "kafka"}
	ss.Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi"),
	}
	if err := c.Create(ctx, ss); err != nil {
		t.Fatal(err)
	}
	// Karpenter launches a node per broker (one per node, by anti-affinity); the box registers
	// them; the scheduler binds the brokers there.
	pods := waitPods(ctx, t, c, "3 brokers Ready on 3 nodes Karpenter launched", func(pods []corev1.Pod) bool {
		return len(pods) == 3 && allReady(pods) && len(nodesOf(pods)) == 3
	})
	k := &kafkaWorld{ctx: ctx, box: b, stage: stage, c: c, node: podsByName(pods)["kafka-0"].Spec.NodeName}
	for _, nc := range initialized(ctx, t, c, 3) {
		if box.NodeOf(&nc) == k.node {
			k.claim = nc
		}
	}
	if k.claim.Name == "" {
		t.Fatalf("no NodeClaim of node %s", k.node)
	}
	k.instance = k.claim.Status.ProviderID[strings.LastIndex(k.claim.Status.ProviderID, "/")+1:]
	t.Logf("kafka-0 on %s (nodeclaim %s, instance %s), %s after the start", k.node, k.claim.Name, k.instance, time.Since(start).Round(time.Millisecond))
	k.low, k.samples = watchReady(ctx, t, c)
	return k
}

// queue creates an SQS queue in the stage's moto.
func (k *kafkaWorld) queue(t *testing.T, name string) string {
	t.Helper()
	out, err := k.stage.SQS.CreateQueue(k.ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

// send puts AWS Health's retirement of kafka-0's instance, starting at start, on a queue, as
// an EventBridge rule would, and returns when.
func (k *kafkaWorld) send(t *testing.T, queueURL string, start time.Time) time.Time {
	t.Helper()
	sent := time.Now()
	body := gen.HealthBody("retire-"+k.instance, "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", sent, start, []string{k.instance})
	if _, err := k.stage.SQS.SendMessage(k.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queueURL), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	return sent
}

// deleting reports whether kafka-0's NodeClaim is deleting or gone.
func (k *kafkaWorld) deleting(t *testing.T) bool {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	err := k.c.Get(k.ctx, client.ObjectKey{Name: k.claim.Name}, nc)
	if client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	return err != nil || !nc.DeletionTimestamp.IsZero()
}

// waitDrained waits until Karpenter deletes kafka-0's NodeClaim.
func (k *kafkaWorld) waitDrained(t *testing.T) {
	t.Helper()
	waitFor(k.ctx, t, "Karpenter deleting kafka-0's NodeClaim", func() (bool, string, error) {
		return k.deleting(t), "", nil
	})
}

// waitMoved waits until kafka-0 runs Ready on another node, every broker Ready, the instance
// terminated and three NodeClaims initialized again.
func (k *kafkaWorld) waitMoved(t *testing.T) {
	t.Helper()
	waitPods(k.ctx, t, k.c, "kafka-0 moved to a node Karpenter launched in its place, every broker Ready", func(pods []corev1.Pod) bool {
		p := podsByName(pods)["kafka-0"]
		return len(pods) == 3 && allReady(pods) && p.Spec.NodeName != "" && p.Spec.NodeName != k.node && len(nodesOf(pods)) == 3
	})
	waitFor(k.ctx, t, "the retired instance terminated", func() (bool, string, error) {
		state, err := k.stage.InstanceState(k.ctx, k.instance)
		return state == "terminated" || state == "shutting-down", state, err
	})
	initialized(k.ctx, t, k.c, 3)
}

// initialized waits until n NodeClaims are initialized, and returns them.
func initialized(ctx context.Context, t *testing.T, c client.Client, n int) []karpv1.NodeClaim {
	t.Helper()
	var out []karpv1.NodeClaim
	waitFor(ctx, t, fmt.Sprintf("%d nodeclaims initialized", n), func() (bool, string, error) {
		var list karpv1.NodeClaimList
		if err := c.List(ctx, &list); err != nil {
			return false, "", err
		}
		out = out[:0]
		var state []string
		for _, nc := range list.Items {
			if nc.DeletionTimestamp.IsZero() && nc.StatusConditions().Get(karpv1.ConditionTypeInitialized).IsTrue() {
				out = append(out, nc)
			}
			state = append(state, fmt.Sprintf("%s %s deleting=%v", nc.Name, nc.Status.ProviderID, !nc.DeletionTimestamp.IsZero()))
		}
		return len(out) == n, strings.Join(state, "\n"), nil
	})
	return out
}

// readySample is the number of Ready brokers at a time.
type readySample struct {
	at    time.Time
	ready int
}

// watchReady samples the Ready kafka pods every 100 ms until the test ends; the returned
// functions report the fewest seen, and every sample.
func watchReady(ctx context.Context, t *testing.T, c client.Client) (func() int, func() []readySample) {
	var mu sync.Mutex
	least := 3
	var samples []readySample
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list := &corev1.PodList{}
			if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"app": "kafka"}); err == nil {
				ready := 0
				for i := range list.Items {
					if podReady(&list.Items[i]) && list.Items[i].DeletionTimestamp.IsZero() {
						ready++
					}
				}
				mu.Lock()
				least = min(least, ready)
				samples = append(samples, readySample{time.Now(), ready})
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() int {
			mu.Lock()
			defer mu.Unlock()
			return least
		}, func() []readySample {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(samples)
		}
}
