package box_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/test/box"
)

const ns = "kafka"

// TestBoxRunsAWorkload runs a kafka StatefulSet (3 brokers, one per node, a PDB of
// maxUnavailable 1) on three kwok nodes, and checks that every part of the box does its
// cluster's job: the scheduler places the pods, kwok runs them, the disruption controller
// computes the PDB, the API server admits one eviction and refuses the next, the StatefulSet
// controller recreates the evicted pod, a short reboot restarts a pod unseen by the control
// plane, the node lifecycle controller marks a stopped node's pods not ready, a reboot comes
// back with a new boot ID, the pod garbage collector removes the pods of a deleted Node and
// the garbage collector its lease and, with the StatefulSet, its pods.
func TestBoxRunsAWorkload(t *testing.T) {
	start := time.Now()
	b := box.New(t)
	t.Logf("box up in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := b.Client()

	// Three nodes, as three EC2 instances' kubelets register them (at once: each waits for the
	// node lifecycle controller's next pass).
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range []string{"box-a", "box-b", "box-c"} {
		g.Go(func() error {
			node, err := b.AddNode(gctx, box.NodeSpec{Name: name, Labels: map[string]string{"pool": "kafka"}})
			if err != nil {
				return err
			}
			if !strings.HasPrefix(node.Spec.ProviderID, "aws:///eu-west-1a/i-") || node.Status.NodeInfo.BootID == "" || !box.Ready(node) {
				return fmt.Errorf("node %s: providerID %q, boot ID %q, ready %v", name, node.Spec.ProviderID, node.Status.NodeInfo.BootID, box.Ready(node))
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 nodes Ready and known to the node lifecycle controller (%s)", time.Since(start).Round(time.Millisecond))

	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kafka"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kafka"}},
		},
	}
	if err := c.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, kafka()); err != nil {
		t.Fatal(err)
	}

	// The scheduler places one broker per node; kwok runs them.
	pods := waitPods(ctx, t, c, "3 brokers Running and Ready, one per node", func(pods []corev1.Pod) bool {
		return len(pods) == 3 && allReady(pods) && len(nodesOf(pods)) == 3
	})
	for _, p := range pods {
		if cond := podCondition(&p, corev1.PodScheduled); cond == nil || cond.Status != corev1.ConditionTrue {
			t.Errorf("pod %s: PodScheduled %+v, want True (bound by the scheduler)", p.Name, cond)
		}
	}
	byName := podsByName(pods)

	// The disruption controller computes the PDB.
	waitPDB(ctx, t, c, 1, 3)

	// A drain of kafka-0's node: cordoned, so that the recreated kafka-0 has nowhere to go
	// (the other nodes hold a broker each); its eviction is admitted, the next is refused
	// while kafka-0 is not back.
	nodeA := byName["kafka-0"].Spec.NodeName
	setUnschedulable(ctx, t, c, nodeA, true)
	if err := evict(ctx, c, "kafka-0"); err != nil {
		t.Fatalf("evicting kafka-0 with 1 disruption allowed: %v", err)
	}
	if err := evict(ctx, c, "kafka-1"); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting kafka-1 while kafka-0 is not back: %v, want 429 Too Many Requests", err)
	}
	waitPods(ctx, t, c, "kafka-0 recreated by the StatefulSet controller, unschedulable", func(pods []corev1.Pod) bool {
		p, ok := podsByName(pods)["kafka-0"]
		if !ok || p.UID == byName["kafka-0"].UID {
			return false
		}
		cond := podCondition(&p, corev1.PodScheduled)
		return p.Spec.NodeName == "" && cond != nil && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable
	})
	waitPDB(ctx, t, c, 0, 2)

	// Uncordoned, kafka-0 goes back to its node; the PDB allows one disruption again.
	setUnschedulable(ctx, t, c, nodeA, false)
	pods = waitPods(ctx, t, c, "kafka-0 back on its node", func(pods []corev1.Pod) bool {
		p := podsByName(pods)["kafka-0"]
		return len(pods) == 3 && allReady(pods) && p.Spec.NodeName == nodeA
	})
	byName = podsByName(pods)
	waitPDB(ctx, t, c, 1, 3)

	// kafka-0's node reboots for 2 s: too short for the node lifecycle controller to notice
	// (it waits 50 s for a lease), but the node has a new boot ID and kafka-0 restarted.
	before := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: nodeA}, before); err != nil {
		t.Fatal(err)
	}
	after, err := b.Reboot(ctx, nodeA, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if after.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID || !box.Ready(after) {
		t.Errorf("after the reboot: boot ID %q (before %q), ready %v", after.Status.NodeInfo.BootID, before.Status.NodeInfo.BootID, box.Ready(after))
	}
	waitRestarted(ctx, t, c, byName["kafka-0"].UID)
	notReady := &corev1.EventList{}
	if err := c.List(ctx, notReady, client.MatchingFields{"involvedObject.name": nodeA, "reason": "NodeNotReady"}); err != nil {
		t.Fatal(err)
	}
	if len(notReady.Items) != 0 {
		t.Errorf("a 2 s reboot of %s was seen by the node lifecycle controller: %+v", nodeA, notReady.Items)
	}
	waitPDB(ctx, t, c, 1, 3)

	// At once, kafka-1's node stops (its kubelet hangs) and kafka-2's Node is deleted (its
	// instance gone). The node lifecycle controller finds kafka-1's node's lease stale, taints
	// the node and marks kafka-1 not ready; the pod garbage collector removes kafka-2, which
	// comes back unschedulable, and the garbage collector the deleted node's lease (owned by
	// the Node).
	nodeB, nodeC := byName["kafka-1"].Spec.NodeName, byName["kafka-2"].Spec.NodeName
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: nodeC}, lease); err != nil {
		t.Fatalf("node %s's lease (kwok renews it): %v", nodeC, err)
	}
	if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].Kind != "Node" || lease.OwnerReferences[0].Name != nodeC {
		t.Fatalf("node %s's lease is owned by %+v, want the Node", nodeC, lease.OwnerReferences)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: nodeB}, before); err != nil {
		t.Fatal(err)
	}
	if err := b.SetNotReady(ctx, nodeB); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeC}}); err != nil {
		t.Fatal(err)
	}
	waitPods(ctx, t, c, "kafka-1 marked not ready by the node lifecycle controller", func(pods []corev1.Pod) bool {
		p := podsByName(pods)["kafka-1"]
		return p.UID == byName["kafka-1"].UID && !podReady(&p)
	})
	waitNode(ctx, t, c, nodeB, "tainted unreachable by the node lifecycle controller", func(n *corev1.Node) bool {
		return hasTaint(n, corev1.TaintNodeUnreachable)
	})
	waitPods(ctx, t, c, "kafka-2 removed with its node and recreated, unschedulable", func(pods []corev1.Pod) bool {
		p, ok := podsByName(pods)["kafka-2"]
		return ok && p.UID != byName["kafka-2"].UID && p.Spec.NodeName == ""
	})
	waitFor(ctx, t, "node "+nodeC+"'s lease removed by the garbage collector", func() (bool, string, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(lease), &coordinationv1.Lease{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), client.IgnoreNotFound(err)
	})
	waitPDB(ctx, t, c, 0, 1)

	// kafka-1's node reboots: a new boot ID, its taints lifted, kafka-1 restarted in place.
	if after, err = b.Reboot(ctx, nodeB, 0); err != nil {
		t.Fatal(err)
	}
	if after.Status.NodeInfo.BootID == before.Status.NodeInfo.BootID || hasTaint(after, corev1.TaintNodeUnreachable) || hasTaint(after, corev1.TaintNodeNotReady) {
		t.Errorf("after the reboot: boot ID %q (before %q), taints %+v", after.Status.NodeInfo.BootID, before.Status.NodeInfo.BootID, after.Spec.Taints)
	}
	waitRestarted(ctx, t, c, byName["kafka-1"].UID)
	waitPDB(ctx, t, c, 0, 2)

	// The StatefulSet deleted, the garbage collector deletes its pods and kwok finishes them.
	if err := c.Delete(ctx, kafka(), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	waitPods(ctx, t, c, "every broker deleted with its StatefulSet", func(pods []corev1.Pod) bool { return len(pods) == 0 })
	t.Logf("test done in %s", time.Since(start).Round(time.Millisecond))
}

// kafka is the StatefulSet: 3 brokers, at most one per node.
func kafka() *appsv1.StatefulSet {
	labels := map[string]string{"app": "kafka"}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kafka"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To[int32](3),
			ServiceName:         "kafka",
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "broker", Image: "kafka:box"}},
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
							LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
							TopologyKey:   corev1.LabelHostname,
						}},
					}},
				},
			},
		},
	}
}

// waitFor polls cond until it holds; on timeout the test fails with the last state seen.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, string, error)) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // the pod garbage collector takes 40-60 s
	defer cancel()
	var last string
	for {
		ok, state, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			t.Logf("%s (%s)", what, time.Since(start).Round(time.Millisecond))
			return
		}
		last = state
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %s; last seen:\n%s", what, time.Since(start).Round(time.Second), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitPods waits until the kafka pods satisfy cond, and returns them.
func waitPods(ctx context.Context, t *testing.T, c client.Client, what string, cond func([]corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(ctx, t, what, func() (bool, string, error) {
		list := &corev1.PodList{}
		if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{"app": "kafka"}); err != nil {
			return false, "", err
		}
		pods = list.Items
		return cond(pods), describe(pods), nil
	})
	return pods
}

// waitRestarted waits until the pod of that UID is ready again with its container restarted
// once.
func waitRestarted(ctx context.Context, t *testing.T, c client.Client, uid types.UID) {
	t.Helper()
	waitPods(ctx, t, c, "pod "+string(uid)+" ready again in place, restarted once", func(pods []corev1.Pod) bool {
		for _, p := range pods {
			if p.UID == uid {
				return podReady(&p) && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 1
			}
		}
		return false
	})
}

// waitPDB waits until the disruption controller has computed the PDB with the given
// disruptions allowed and healthy pods, of 3 expected and 2 desired.
func waitPDB(ctx context.Context, t *testing.T, c client.Client, allowed, healthy int32) {
	t.Helper()
	waitFor(ctx, t, fmt.Sprintf("PDB: %d disruption(s) allowed, %d healthy", allowed, healthy), func() (bool, string, error) {
		pdb := &policyv1.PodDisruptionBudget{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kafka"}, pdb); err != nil {
			return false, "", err
		}
		s := pdb.Status
		return s.ObservedGeneration == pdb.Generation && s.DisruptionsAllowed == allowed && s.CurrentHealthy == healthy &&
			s.DesiredHealthy == 2 && s.ExpectedPods == 3, fmt.Sprintf("%+v", s), nil
	})
}

// waitNode waits until the Node satisfies cond.
func waitNode(ctx context.Context, t *testing.T, c client.Client, name, what string, cond func(*corev1.Node) bool) {
	t.Helper()
	waitFor(ctx, t, "node "+name+": "+what, func() (bool, string, error) {
		n := &corev1.Node{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return false, "", err
		}
		return cond(n), fmt.Sprintf("taints %+v, conditions %+v", n.Spec.Taints, n.Status.Conditions), nil
	})
}

func evict(ctx context.Context, c client.Client, name string) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	return c.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
}

func setUnschedulable(ctx context.Context, t *testing.T, c client.Client, name string, v bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, v)
	if err := c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	c := podCondition(p, corev1.PodReady)
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && c != nil && c.Status == corev1.ConditionTrue
}

func allReady(pods []corev1.Pod) bool {
	for i := range pods {
		if !podReady(&pods[i]) {
			return false
		}
	}
	return true
}

func nodesOf(pods []corev1.Pod) map[string]bool {
	nodes := map[string]bool{}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			nodes[p.Spec.NodeName] = true
		}
	}
	return nodes
}

func podsByName(pods []corev1.Pod) map[string]corev1.Pod {
	m := map[string]corev1.Pod{}
	for _, p := range pods {
		m[p.Name] = p
	}
	return m
}

func hasTaint(n *corev1.Node, key string) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == key })
}

// describe lists the pods for a failure message: name, node, phase, readiness, restarts (-1:
// no container status yet), UID.
func describe(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		restarts := int32(-1)
		if len(p.Status.ContainerStatuses) > 0 {
			restarts = p.Status.ContainerStatuses[0].RestartCount
		}
		fmt.Fprintf(&b, "  %s node=%q phase=%s ready=%v restarts=%d deleting=%v uid=%s\n", p.Name, p.Spec.NodeName, p.Status.Phase, podReady(&p), restarts, p.DeletionTimestamp != nil, p.UID)
	}
	return b.String()
}
