package karpenter

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// repairToleration is how long Karpenter's repair policies tolerate a NotReady Node in
// TestRebootInPlaceWithNodeRepair (30 minutes in the provider's own policies).
const repairToleration = 5 * time.Second

// repairStage starts a stage of its own whose Karpenter runs node repair (the NodeRepair
// feature gate) with the repair policies' toleration shortened to repairToleration: the
// controller test/tools/karpenter-bin.sh builds with "repair" (KARPENTER_REPAIR_BIN, or
// built here as make does). It replaces the package's stage until the test ends: the other
// tests keep the provider's own controller, with repair off.
func repairStage(t *testing.T) {
	t.Helper()
	bin := os.Getenv("KARPENTER_REPAIR_BIN")
	if bin == "" {
		cmd := exec.Command(filepath.Join("..", "tools", "karpenter-bin.sh"), "repair")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("building Karpenter's controller with the repair toleration (karpenter-bin.sh repair): %v", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	began := time.Now()
	s, err := harness.StartKarpenterStageWith(context.Background(), bin, t.TempDir(),
		harness.KarpenterStageOptions{NodeRepair: true, RepairToleration: repairToleration})
	if err != nil {
		t.Fatalf("starting Karpenter with node repair: %v", err)
	}
	t.Logf("envtest, moto and Karpenter (node repair, toleration %s) up in %s", repairToleration, time.Since(began).Round(100*time.Millisecond))
	shared := stage
	stage = s
	t.Cleanup(func() {
		if t.Failed() {
			tail(s.Log, 60)
		}
		s.Stop()
		stage = shared
	})
}

// repairBudgets are the budgets of the test's pools: Karpenter may repair one node at a time
// (reason Unhealthy) and disrupts nothing else (moto's fleet makes every node drifted).
var repairBudgets = []karpv1.Budget{
	{Nodes: "0", Reasons: []karpv1.DisruptionReason{karpv1.DisruptionReasonDrifted, karpv1.DisruptionReasonUnderutilized, karpv1.DisruptionReasonEmpty}},
	{Nodes: "1", Reasons: []karpv1.DisruptionReason{karpv1.DisruptionReasonUnhealthy}},
}

// rebooting reports whether Karpenter has begun rebooting the NodeClaim (its Rebooting
// condition, node repair's reboot action).
func rebooting(t *testing.T, name string) bool {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	if err := stage.Kube.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		t.Fatal(err)
	}
	return nc.StatusConditions().Get(karpv1.ConditionTypeRebooting) != nil
}

// TestRebootInPlaceWithNodeRepair: Karpenter v1.15's node repair is on, with a toleration of
// seconds and a budget that lets it repair one node of the pool at a time. A node of a pool
// without the router's reboot in place goes NotReady: Karpenter replaces it (its NodeClaim
// deleted) within the test's time, so repair is live. A node of a reboot-in-place pool goes
// through the router's reboot and stays NotReady for six tolerations: Karpenter neither
// replaces nor reboots it (karpenter.sh/do-not-repair on the Node, which do-not-disrupt alone
// does not give: v1.15 repairs through do-not-disrupt), and after the run the vetoes are gone
// and the node is kept.
func TestRebootInPlaceWithNodeRepair(t *testing.T) {
	began := time.Now()
	repairStage(t)
	ctx := context.Background()
	const pool, control = "inplace-repair", "repair-control"
	if err := stage.NodePoolBudgets(ctx, pool, map[string]string{
		policy.ScheduledActionKey(event.ScheduledInstanceReboot): string(policy.ActionRebootInPlace),
		policy.AnnotationDrainLead:                               "1h",
	}, repairBudgets); err != nil {
		t.Fatal(err)
	}
	if err := stage.NodePoolBudgets(ctx, control, nil, repairBudgets); err != nil {
		t.Fatal(err)
	}
	nodes, err := stage.Launch(ctx, pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	controls, err := stage.Launch(ctx, control, 1)
	if err != nil {
		t.Fatal(err)
	}
	n, c := nodes[0], controls[0]
	kubelet(t, n.Node, corev1.ConditionTrue, "boot-1")

	// Repair is live: a NotReady node is replaced.
	kubelet(t, c.Node, corev1.ConditionFalse, "boot-1")
	notReady := time.Now()
	eventually(t, "Karpenter's node repair deleting the NotReady control NodeClaim "+c.NodeClaim, 2*time.Minute, func() bool {
		deleting, _ := claimState(t, c.NodeClaim)
		return deleting
	})
	repaired := time.Since(notReady)
	t.Logf("Karpenter repaired the NotReady control node %s after it was NotReady (toleration %s)", repaired.Round(100*time.Millisecond), repairToleration)

	start := time.Now().Add(30 * time.Minute)
	ec2s, _ := harness.NewEC2InstanceStatus(t)
	ec2s.Add(n.Instance, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0a1b2c3d4e5f60002", Code: string(event.ScheduledInstanceReboot),
		Description: "The instance is scheduled for a reboot", NotBefore: start.UTC().Truncate(time.Second)}}})
	endpoint := harness.SplitEC2(t, stage.Moto, ec2s)
	intake := startRouter(t, "inplace-repair", signal.ModeForward, func(o *options.Run) { o.RebootInPlace, o.AWSEndpointURL = true, endpoint })
	run := func() inplace.State {
		nc := &karpv1.NodeClaim{}
		if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.NodeClaim}, nc); err != nil {
			t.Fatal(err)
		}
		mem, err := record.Load(ctx, stage.Kube, nc.Name)
		if err != nil {
			t.Fatal(err)
		}
		st, _, err := inplace.Read(mem)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	kept := func() {
		t.Helper()
		if deleting, gone := claimState(t, n.NodeClaim); deleting || gone {
			t.Fatalf("Karpenter deleted NodeClaim %s (gone: %v) during the reboot in place: node repair replaced it", n.NodeClaim, gone)
		}
		if rebooting(t, n.NodeClaim) {
			t.Fatalf("Karpenter is rebooting NodeClaim %s (its Rebooting condition) during the reboot in place", n.NodeClaim)
		}
		if s := instanceState(t, n.Instance); s != "running" {
			t.Fatalf("instance %s is %s", n.Instance, s)
		}
	}
	send(t, intake, healthBodyOf("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", "inplace-repair", start, n.Instance))
	eventually(t, "the router's reboot of the instance", 40*time.Second, func() bool {
		kept()
		st := run()
		return st.Step == inplace.StepAwait && !st.Rebooted.IsZero()
	})
	node := &corev1.Node{}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.Node}, node); err != nil {
		t.Fatal(err)
	}
	if node.Annotations[karpv1.DoNotRepairAnnotationKey] != "true" || node.Annotations[karpv1.DoNotDisruptAnnotationKey] != "true" {
		t.Errorf("rebooting: the Node's do-not-repair %q, do-not-disrupt %q", node.Annotations[karpv1.DoNotRepairAnnotationKey], node.Annotations[karpv1.DoNotDisruptAnnotationKey])
	}

	// The reboot: NotReady for six tolerations, more than the control needed to be replaced.
	kubelet(t, n.Node, corev1.ConditionFalse, "boot-1")
	down := time.Now()
	hold := max(6*repairToleration, repaired+10*time.Second)
	for time.Since(down) < hold {
		kept()
		time.Sleep(250 * time.Millisecond)
	}
	if st := run(); st.Step != inplace.StepReady {
		t.Fatalf("after %s NotReady the run is at %s, want %s: %s", hold, st.Step, inplace.StepReady, st.LastError)
	}
	kubelet(t, n.Node, corev1.ConditionTrue, "boot-2")
	eventually(t, "the run done", 30*time.Second, func() bool { kept(); return run().Over() })
	if st := run(); st.Outcome != inplace.OutcomeDone {
		t.Fatalf("outcome %q, want done", st.Outcome)
	}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.Node}, node); err != nil {
		t.Fatal(err)
	}
	nc := &karpv1.NodeClaim{}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.NodeClaim}, nc); err != nil {
		t.Fatal(err)
	}
	if node.Spec.Unschedulable || node.Annotations[karpv1.DoNotRepairAnnotationKey] != "" || nc.Annotations[karpv1.DoNotRepairAnnotationKey] != "" ||
		node.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" || nc.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" {
		t.Errorf("after the run: node cordoned %v, do-not-repair on node %q and nodeclaim %q, do-not-disrupt on node %q and nodeclaim %q",
			node.Spec.Unschedulable, node.Annotations[karpv1.DoNotRepairAnnotationKey], nc.Annotations[karpv1.DoNotRepairAnnotationKey],
			node.Annotations[karpv1.DoNotDisruptAnnotationKey], nc.Annotations[karpv1.DoNotDisruptAnnotationKey])
	}
	// Ready again: repair has nothing to act on, and the node stays.
	for after := time.Now(); time.Since(after) < 2*repairToleration; {
		kept()
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("TestRebootInPlaceWithNodeRepair wall time: %s", time.Since(began).Round(100*time.Millisecond))
}
