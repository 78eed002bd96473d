package gates

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/harness"
)

// TestPDBGateEnvtest runs the PDB gate on a real API server through a cache built as the
// router builds it (Pods and PDBs trimmed, Pods indexed by node): a PDB at zero holds, a
// PDB that recovers releases, and the cache keeps only the trimmed objects.
func TestPDBGateEnvtest(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest suite; run without -short")
	}
	cfg := harness.KubeAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}:                   {Transform: gates.TrimPod},
		&policyv1.PodDisruptionBudget{}: {Transform: gates.TrimPDB},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ix := range gates.Indexes() {
		if err := c.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}))
	for _, p := range []struct{ name, node, app string }{{"kafka-0", "node-a", "kafka"}, {"kafka-1", "node-b", "kafka"}, {"web-0", "node-b", "web"}} {
		must(kube.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kafka", Name: p.name, Labels: map[string]string{"app": p.app}},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}}}}}))
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "kafka", Name: "kafka-pdb"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kafka"}}}}
	must(kube.Create(ctx, pdb))
	// No disruption controller runs in envtest: set the status as kube-controller-manager
	// would for a budget with one broker already down.
	setAllowed := func(n int32) {
		t.Helper()
		must(kube.Get(ctx, client.ObjectKeyFromObject(pdb), pdb))
		status := metav1.ConditionTrue
		if n == 0 {
			status = metav1.ConditionFalse
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: n, CurrentHealthy: 2 + n, DesiredHealthy: 2, ExpectedPods: 3,
			Conditions: []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition, Status: status, Reason: "SufficientPods", Message: "x", LastTransitionTime: metav1.Now()}}}
		must(kube.Status().Update(ctx, pdb))
	}
	setAllowed(0)

	g := gates.NewPDB(c)
	check := func(node string) policy.Gate {
		gate, err := g.Check(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		return gate
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: not within 20s", what)
		}
	}
	eventually("node-a held by kafka-pdb", func() bool {
		gate := check("node-a")
		return gate.Held && gate.Evidence[gates.EvidencePDBs] == "kafka/kafka-pdb" && strings.Contains(gate.Reason, "selects kafka-0") && !gate.Since.IsZero()
	})
	if gate := check("node-c"); gate.Held {
		t.Errorf("a node without pods is held: %+v", gate)
	}

	// The cache holds trimmed pods: no containers.
	var pods corev1.PodList
	must(c.List(ctx, &pods, client.MatchingFields{gates.IndexPodNode: "node-b"}))
	names := []string{}
	for _, p := range pods.Items {
		names = append(names, p.Name)
		if len(p.Spec.Containers) != 0 || p.Spec.NodeName != "node-b" {
			t.Errorf("cached pod %s not trimmed: %+v", p.Name, p.Spec)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"kafka-1", "web-0"}) {
		t.Errorf("pods of node-b from the index: %v", names)
	}

	// The budget recovers: the gate releases.
	setAllowed(1)
	eventually("node-a released", func() bool { return !check("node-a").Held })
}
