package karpenter

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// kubelet reports the Node's Ready condition (changed now) and boot ID, as its kubelet would.
func kubelet(t *testing.T, node string, ready corev1.ConditionStatus, boot string) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	base := n.DeepCopy()
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	n.Status.NodeInfo.BootID = boot
	if err := stage.Kube.Status().Patch(ctx, n, client.MergeFrom(base)); err != nil {
		t.Fatalf("node %s status: %v", node, err)
	}
}

// TestRebootInPlaceBesideKarpenter: a node of a reboot-in-place pool goes through its reboot
// with the router in forward mode (Karpenter's interruption queue is the router's forward
// queue) and the real Karpenter running. Karpenter receives nothing, deletes nothing and
// launches nothing, during the run and after it; the node is kept, uncordoned.
func TestRebootInPlaceBesideKarpenter(t *testing.T) {
	began := time.Now()
	const pool = "inplace"
	nodes := launch(t, map[string]map[string]string{pool: {
		policy.ScheduledActionKey(event.ScheduledInstanceReboot): string(policy.ActionRebootInPlace),
		policy.AnnotationDrainLead:                               "1h",
	}}, nil)
	n := nodes[pool][0]
	t.Logf("launched a node through Karpenter in %s", time.Since(began).Round(100*time.Millisecond))
	ctx := context.Background()
	kubelet(t, n.Node, corev1.ConditionTrue, "boot-1")
	// A pod the run evicts; its grace period of 0 stands in for the kubelet removing it.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "inplace-app"},
		Spec: corev1.PodSpec{NodeName: n.Node, TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}}}
	if err := stage.Kube.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	received := metric(t, receivedMessages, nil)
	// AWS reboots the instance in 30 minutes, within drain-lead: the run begins at once. EC2
	// shows the event (the stand-in behind the proxy: moto reports no scheduled events), which
	// the run confirms before it reboots.
	start := time.Now().Add(30 * time.Minute)
	ec2s, _ := harness.NewEC2InstanceStatus(t)
	ec2s.Add(n.Instance, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0a1b2c3d4e5f60001", Code: string(event.ScheduledInstanceReboot),
		Description: "The instance is scheduled for a reboot", NotBefore: start.UTC().Truncate(time.Second)}}})
	endpoint := harness.SplitEC2(t, stage.Moto, ec2s)
	intake := startRouter(t, "inplace", signal.ModeForward, func(o *options.Run) { o.RebootInPlace, o.AWSEndpointURL = true, endpoint })

	// Karpenter, throughout: the NodeClaim there and not deleting, the pool's only one, the
	// instance running, no message received on its queue, no disruption of the pool.
	keptByKarpenter := func() {
		t.Helper()
		if deleting, gone := claimState(t, n.NodeClaim); deleting || gone {
			t.Fatalf("NodeClaim %s deleted (gone: %v) during the reboot in place", n.NodeClaim, gone)
		}
		var l karpv1.NodeClaimList
		if err := stage.Kube.List(ctx, &l, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 {
			var names []string
			for _, nc := range l.Items {
				names = append(names, nc.Name)
			}
			t.Fatalf("pool %s has NodeClaims %v: Karpenter launched a replacement", pool, names)
		}
		if s := instanceState(t, n.Instance); s != "running" {
			t.Fatalf("instance %s is %s", n.Instance, s)
		}
		if got := metric(t, receivedMessages, nil); got != received {
			t.Fatalf("Karpenter received %v interruption messages during the reboot in place", got-received)
		}
		if got := metric(t, disruptedClaims, map[string]string{"nodepool": pool}); got != 0 {
			t.Fatalf("Karpenter disrupted %v NodeClaims of %s", got, pool)
		}
	}
	run := func() (inplace.State, bool) {
		nc := &karpv1.NodeClaim{}
		if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.NodeClaim}, nc); err != nil {
			t.Fatal(err)
		}
		mem, err := record.Load(ctx, stage.Kube, nc.Name)
		if err != nil {
			t.Fatal(err)
		}
		st, ok, err := inplace.Read(mem)
		if err != nil {
			t.Fatal(err)
		}
		return st, ok
	}
	// until polls cond, with Karpenter watched at every poll.
	until := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		eventually(t, what, timeout, func() bool { keptByKarpenter(); return cond() })
	}

	send(t, intake, healthBodyOf("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", "inplace-reboot", start, n.Instance))
	var st inplace.State
	until("the instance rebooted (RebootInstances in moto)", 40*time.Second, func() bool {
		var ok bool
		st, ok = run()
		return ok && st.Step == inplace.StepAwait && !st.Rebooted.IsZero()
	})
	node := &corev1.Node{}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.Node}, node); err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable || node.Annotations[karpv1.DoNotDisruptAnnotationKey] != "true" {
		t.Errorf("rebooting: node cordoned %v, do-not-disrupt %q", node.Spec.Unschedulable, node.Annotations[karpv1.DoNotDisruptAnnotationKey])
	}
	if err := stage.Kube.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); err == nil {
		t.Errorf("pod %s still on the node after the reboot", pod.Name)
	}

	kubelet(t, n.Node, corev1.ConditionFalse, "boot-1")
	until("the run sees the Node NotReady", 30*time.Second, func() bool { st, _ = run(); return st.Step == inplace.StepReady })
	kubelet(t, n.Node, corev1.ConditionTrue, "boot-2")
	until("the run done", 30*time.Second, func() bool { st, _ = run(); return st.Over() })
	if st.Outcome != inplace.OutcomeDone {
		t.Fatalf("outcome %q, want done", st.Outcome)
	}
	uncordoned := time.Now()
	// After the run: Karpenter still leaves the node alone.
	for time.Since(uncordoned) < 10*time.Second {
		keptByKarpenter()
		time.Sleep(250 * time.Millisecond)
	}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.Node}, node); err != nil {
		t.Fatal(err)
	}
	if node.Spec.Unschedulable || node.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" {
		t.Errorf("after the run: node cordoned %v, do-not-disrupt %q", node.Spec.Unschedulable, node.Annotations[karpv1.DoNotDisruptAnnotationKey])
	}
	t.Logf("TestRebootInPlaceBesideKarpenter wall time: %s", time.Since(began).Round(100*time.Millisecond))
}
