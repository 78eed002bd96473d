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

	"github.com/health-router/health-router/test/bench/gen"
	"github.com/health-router/health-router/test/box"
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
	start := time.Now()
	b := box.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	stage, err := b.StartKarpenter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("box and Karpenter up in %s", time.Since(start).Round(time.Millisecond))
	c := b.Client()
	if err := stage.NodePool(ctx, "kafka", nil); err != nil {
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
	claims := initialized(ctx, t, c, 3)
	victim := podsByName(pods)["kafka-0"].Spec.NodeName
	var claim karpv1.NodeClaim
	for _, nc := range claims {
		if box.NodeOf(&nc) == victim {
			claim = nc
		}
	}
	if claim.Name == "" {
		t.Fatalf("no NodeClaim of node %s among %d", victim, len(claims))
	}
	instance := claim.Status.ProviderID[strings.LastIndex(claim.Status.ProviderID, "/")+1:]
	t.Logf("kafka-0 on %s (nodeclaim %s, instance %s), %s after the start", victim, claim.Name, instance, time.Since(start).Round(time.Millisecond))

	// Ready brokers, sampled from now on: a PDB of maxUnavailable 1 keeps two at least.
	low := watchReady(ctx, t, c)

	// AWS schedules the instance's retirement two weeks ahead; Karpenter's rule delivers it.
	sent := time.Now()
	body := gen.HealthBody("retire-"+instance, "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", sent, sent.Add(14*24*time.Hour), []string{instance})
	if _, err := stage.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(stage.QueueURL), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "Karpenter deleting the NodeClaim at once, for an event two weeks ahead", func() (bool, string, error) {
		nc := &karpv1.NodeClaim{}
		err := c.Get(ctx, client.ObjectKey{Name: claim.Name}, nc)
		if client.IgnoreNotFound(err) != nil {
			return false, "", err
		}
		return err != nil || !nc.DeletionTimestamp.IsZero(), fmt.Sprintf("%+v", nc.Status.Conditions), nil
	})
	acted := time.Since(sent)
	waitPods(ctx, t, c, "kafka-0 moved to a node Karpenter launched in its place, every broker Ready", func(pods []corev1.Pod) bool {
		p := podsByName(pods)["kafka-0"]
		return len(pods) == 3 && allReady(pods) && p.Spec.NodeName != "" && p.Spec.NodeName != victim && len(nodesOf(pods)) == 3
	})
	waitFor(ctx, t, "the retired instance terminated", func() (bool, string, error) {
		state, err := stage.InstanceState(ctx, instance)
		return state == "terminated" || state == "shutting-down", state, err
	})
	if got := low(); got < 2 {
		t.Errorf("at least %d broker(s) Ready while Karpenter drained, want 2 (the PDB's maxUnavailable 1)", got)
	} else {
		t.Logf("Karpenter alone: node drained %s after the event, 14 days before AWS's start; at least %d of 3 brokers Ready throughout", acted.Round(time.Millisecond), got)
	}
	initialized(ctx, t, c, 3)
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
