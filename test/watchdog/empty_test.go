package watchdog_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/watchdog"
)

// podCache is a cache as the router builds it when the gates are on: Nodes, NodeClaims,
// Pods and PDBs trimmed by their transforms, with the cluster's and the gates' indexes.
func (k *kube) podCache() cache.Cache {
	k.t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		k.t.Fatal(err)
	}
	trim := cluster.NewTrimmer()
	c, err := cache.New(k.cfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Node{}:                  {Transform: trim.Node},
		&karpv1.NodeClaim{}:             {Transform: trim.NodeClaim},
		&corev1.Pod{}:                   {Transform: gates.TrimPod},
		&policyv1.PodDisruptionBudget{}: {Transform: gates.TrimPDB},
	}})
	if err != nil {
		k.t.Fatal(err)
	}
	for _, ix := range slices.Concat(cluster.Indexes(), gates.Indexes()) {
		if err := c.IndexField(k.ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			k.t.Fatal(err)
		}
	}
	go func() { _ = c.Start(k.ctx) }()
	if !c.WaitForCacheSync(k.ctx) {
		k.t.Fatal("cache did not sync")
	}
	return c
}

// node creates a Karpenter node of pool and its NodeClaim (same provider ID).
func (k *kube) node(name, pool string) {
	k.t.Helper()
	h := fnv.New64a()
	h.Write([]byte(name))
	id := fmt.Sprintf("aws:///eu-west-1a/i-%017x", h.Sum64()>>4)
	k.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		karpv1.NodePoolLabelKey: pool, karpv1.NodeInitializedLabelKey: "true"}}, Spec: corev1.NodeSpec{ProviderID: id}})
	c := k.nodeClaim(name, pool, nil)
	c.Status.ProviderID = id
	k.updateStatus(c)
}

func (k *kube) pod(name, node string, mut ...func(*corev1.Pod)) *corev1.Pod {
	k.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	for _, m := range mut {
		m(p)
	}
	k.create(p)
	return p
}

func daemonSetPod(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "node-exporter", UID: "0d9c3f4e-1111-4c3b-9c1e-000000000001", Controller: ptr.To(true)}}
}
func mirrorPod(p *corev1.Pod) {
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
}

// TestStuckEmptyFromPods: Karpenter v1 writes no Empty condition; with Pods cached the
// watchdog flags nodes of WhenEmpty and WhenEmptyOrUnderutilized pools whose only pods are
// DaemonSet, mirror or finished ones, consolidateAfter plus grace after it first saw them
// empty, unless they are being deleted.
func TestStuckEmptyFromPods(t *testing.T) {
	k := newKube(t)
	k.nodePool("kafka", karpv1.ConsolidationPolicyWhenEmpty, "1m")
	k.nodePool("web", karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized, "5m")
	k.nodePool("never", karpv1.ConsolidationPolicyWhenEmpty, "Never")
	for _, n := range []struct{ name, pool string }{{"kafka-empty", "kafka"}, {"kafka-busy", "kafka"}, {"kafka-done", "kafka"},
		{"kafka-going", "kafka"}, {"web-empty", "web"}, {"never-empty", "never"}} {
		k.node(n.name, n.pool)
	}
	k.pod("exporter", "kafka-empty", daemonSetPod)
	k.pod("static", "kafka-empty", mirrorPod)
	k.pod("broker", "kafka-busy")
	done := k.pod("job", "kafka-done")
	done.Status.Phase = corev1.PodSucceeded
	k.updateStatus(done)
	k.deleteClaim("kafka-going") // held by its finalizer: being deleted

	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(now)
	reg := prometheus.NewRegistry()
	recorder := events.NewFakeRecorder(100)
	c := k.podCache()
	wd := watchdog.New(c, &ec2.Client{}, recorder, checks.NewFeatureGates(), clk, reg, watchdog.Options{EmptyFromPods: true})

	// First sight: the cache has every object, nothing is flagged yet.
	scanUntil(t, wd, "cache caught up", func(watchdog.Findings) bool {
		var pods corev1.PodList
		var claims karpv1.NodeClaimList
		_ = c.List(context.Background(), &pods)
		_ = c.List(context.Background(), &claims)
		going := slices.ContainsFunc(claims.Items, func(nc karpv1.NodeClaim) bool { return nc.Name == "kafka-going" && !nc.DeletionTimestamp.IsZero() })
		doneSeen := slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.Name == "job" && p.Status.Phase == corev1.PodSucceeded })
		return len(pods.Items) == 4 && len(claims.Items) == 6 && going && doneSeen
	})
	f, err := wd.Scan(context.Background())
	if err != nil || len(f.StuckEmpty) != 0 {
		t.Fatalf("first scan: %+v, %v", f.StuckEmpty, err)
	}
	// kafka: 1m + 10m grace; web: 5m + 10m.
	clk.Step(12 * time.Minute)
	f, err = wd.Scan(context.Background())
	if err != nil || len(f.StuckEmpty) != 1 || f.StuckEmpty[0].NodePool != "kafka" || !slices.Equal(f.StuckEmpty[0].NodeClaims, []string{"kafka-done", "kafka-empty"}) || !f.StuckEmpty[0].Since.Equal(now) {
		t.Fatalf("after 12m: %+v, %v (want kafka-done and kafka-empty of kafka, since the first scan)", f.StuckEmpty, err)
	}
	clk.Step(4 * time.Minute)
	f, _ = wd.Scan(context.Background())
	if len(f.StuckEmpty) != 2 || f.StuckEmpty[1].NodePool != "web" || !slices.Equal(f.StuckEmpty[1].NodeClaims, []string{"web-empty"}) {
		t.Fatalf("after 16m: %+v (want web-empty too: WhenEmptyOrUnderutilized)", f.StuckEmpty)
	}
	if got := gauge(t, reg, metrics.WatchdogStuckEmpty); len(got) != 2 || got["kafka"] != 2 || got["web"] != 1 {
		t.Errorf("gauge = %v, want kafka=2 web=1 (never has consolidateAfter Never)", got)
	}
	ev := drain(recorder)
	if len(ev) != 2 || !strings.Contains(strings.Join(ev, "|"), "Warning "+watchdog.ReasonStuckEmpty+" 2 NodeClaim(s) empty (no pods but DaemonSet and mirror pods)") {
		t.Errorf("events = %q", ev)
	}

	// A pod lands on kafka-empty: no longer empty, and its clock is forgotten.
	broker := k.pod("broker-2", "kafka-empty")
	f = scanUntil(t, wd, "kafka-empty busy", func(f watchdog.Findings) bool {
		return len(f.StuckEmpty) == 2 && slices.Equal(f.StuckEmpty[0].NodeClaims, []string{"kafka-done"})
	})
	if err := k.client.Delete(k.ctx, broker, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	scanUntil(t, wd, "broker-2 gone from the cache", func(watchdog.Findings) bool {
		var pods corev1.PodList
		_ = c.List(context.Background(), &pods, client.MatchingFields{gates.IndexPodNode: "kafka-empty"})
		return len(pods.Items) == 2
	})
	clk.Step(5 * time.Minute)
	f, _ = wd.Scan(context.Background())
	if slices.Contains(f.StuckEmpty[0].NodeClaims, "kafka-empty") {
		t.Errorf("kafka-empty flagged 5m after it became empty again: %+v", f.StuckEmpty)
	}
	clk.Step(7 * time.Minute)
	f, _ = wd.Scan(context.Background())
	if !slices.Equal(f.StuckEmpty[0].NodeClaims, []string{"kafka-done", "kafka-empty"}) {
		t.Errorf("kafka-empty not flagged 12m after it became empty again: %+v", f.StuckEmpty)
	}
}
