package box_test

import (
	"context"
	"fmt"
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

// TestBoxKarpenterAlone runs the kafka StatefulSet on a Karpenter NodePool in the box, with no
// router: the brokers' pending pods bring up three nodes through the real Karpenter (its
// provisioner, moto's EC2, the box playing each instance's kubelet), and an AWS Health
// retirement scheduled two weeks ahead for one broker's instance, sent to Karpenter's
// interruption queue as its own EventBridge rule would, has Karpenter drain that node at once:
// the broker is evicted under its PodDisruptionBudget (one down at most, never two), moved to a
// node Karpenter launches in its place, and the instance terminated — weeks before AWS would
// have acted. This is the baseline the router is measured against (issue 37).
func TestBoxKarpenterAlone(t *testing.T) {
	k := kafkaOnKarpenter(t, nil)
	sent := k.send(t, k.stage.QueueURL)
	k.waitDrained(t)
	acted := time.Since(sent)
	k.waitMoved(t)
	if got := k.low(); got < 2 {
		t.Errorf("at least %d broker(s) Ready while Karpenter drained, want 2 (the PDB's maxUnavailable 1)", got)
	}
	t.Logf("Karpenter alone: node drained %s after the event, 14 days before AWS's start; at least %d of 3 brokers Ready throughout", acted.Round(time.Millisecond), k.low())
}

// TestBoxRouterInFront is the same world and the same event with the router in front
// (Karpenter's rule removed, the router's feeding its intake, drains forwarded to Karpenter's
// queue), and the kafka pool deferring into a maintenance window that opens a minute or two
// later (time compressed by policy, not by a fake clock): nothing is disrupted before the
// window, and in it the router has Karpenter drain the node, the broker evicted under its PDB
// and moved as Karpenter alone would have, weeks ahead of AWS still, but in the window.
func TestBoxRouterInFront(t *testing.T) {
	// A daily window opening at the next minute boundary at least 70 s away, 10 minutes long.
	opens := time.Now().UTC().Add(70 * time.Second).Truncate(time.Minute).Add(time.Minute)
	k := kafkaOnKarpenter(t, map[string]string{
		policy.AnnotationAction:         "defer",
		policy.AnnotationWindowSchedule: fmt.Sprintf("%d %d * * *", opens.Minute(), opens.Hour()),
		policy.AnnotationWindowDuration: "10m",
	})
	intake := k.queue(t, "box-intake")
	inproc.Router(t, options.Run{
		QueueURL: intake, DeadLetterQueueURL: k.queue(t, "box-dlq"), Signal: signal.ModeForward, KarpenterQueueURL: k.stage.QueueURL,
		Workers: 10, Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 5 * time.Second,
		Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: k.stage.Moto, Gates: checks.NewFeatureGates(),
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second, NodeMarks: true,
	}, k.box.Config())
	k.send(t, intake)
	// Before the window: the router holds the event; no broker is disrupted.
	for time.Now().Before(opens.Add(-5 * time.Second)) {
		if k.deleting(t) {
			t.Fatalf("the nodeclaim is deleting at %s, before the window opens at %s", time.Now().UTC().Format(time.TimeOnly), opens.Format(time.TimeOnly))
		}
		time.Sleep(time.Second)
	}
	if got := k.low(); got != 3 {
		t.Errorf("before the window: at least %d broker(s) Ready, want all 3 throughout", got)
	}
	k.waitDrained(t)
	if at := time.Now().UTC(); at.Before(opens) || at.After(opens.Add(10*time.Minute)) {
		t.Errorf("drained at %s, outside the window %s + 10m", at.Format(time.TimeOnly), opens.Format(time.TimeOnly))
	}
	k.waitMoved(t)
	if got := k.low(); got < 2 {
		t.Errorf("at least %d broker(s) Ready while the node drained, want 2 (the PDB's maxUnavailable 1)", got)
	}
	t.Logf("router in front: node drained in the window opening at %s (%s after it); at least %d of 3 brokers Ready throughout", opens.Format(time.TimeOnly),
		time.Since(opens).Round(time.Second), k.low())
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
	k.low = watchReady(ctx, t, c)
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

// send puts AWS Health's retirement of kafka-0's instance, scheduled 14 days ahead, on a
// queue, as an EventBridge rule would, and returns when.
func (k *kafkaWorld) send(t *testing.T, queueURL string) time.Time {
	t.Helper()
	sent := time.Now()
	body := gen.HealthBody("retire-"+k.instance, "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", sent, sent.Add(14*24*time.Hour), []string{k.instance})
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

// watchReady samples the Ready kafka pods every 100 ms until the test ends; the returned
// function reports the fewest seen.
func watchReady(ctx context.Context, t *testing.T, c client.Client) func() int {
	var mu sync.Mutex
	least := 3
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
	}
}
