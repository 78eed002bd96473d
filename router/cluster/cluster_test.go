package cluster

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

func TestInstanceID(t *testing.T) {
	for in, want := range map[string]string{
		"aws:///eu-west-1a/i-0a1b2c3d4e5f60718": "i-0a1b2c3d4e5f60718",
		"aws:///i-0a1b2c3d4e5f60718":            "i-0a1b2c3d4e5f60718",
		"gce://project/zone/instance-1":         "",
		"aws:///eu-west-1a/":                    "",
		"":                                      "",
	} {
		if got := InstanceID(in); got != want {
			t.Errorf("InstanceID(%q) = %q, want %q", in, got, want)
		}
	}
}

func loadDemo(t *testing.T) *Model {
	t.Helper()
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("../../test/demo/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, ignored, err := Load(scheme, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(ignored) != 0 || len(objs) != 2+4+16 {
		t.Fatalf("loaded %d objects, ignored %v", len(objs), ignored)
	}
	snap, err := NewSnapshot(scheme, objs...)
	if err != nil {
		t.Fatal(err)
	}
	return New(snap)
}

func TestResolveSnapshot(t *testing.T) {
	m := loadDemo(t)
	ctx := context.Background()
	res, err := m.Resolve(ctx, "i-0fedcba9876543210")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Found() || res.Node == nil || res.Node.Name != "ip-10-0-2-202.eu-west-1.compute.internal" {
		t.Fatalf("node: %+v", res.Node)
	}
	if res.NodeClaim == nil || res.NodeClaim.Name != "kafka-h2j8c" {
		t.Fatalf("nodeclaim: %+v", res.NodeClaim)
	}
	if res.NodePool == nil || res.NodePool.Name != "kafka" || res.NodePool.Annotations["healthrouter.io/action"] != "defer" {
		t.Fatalf("nodepool: %+v", res.NodePool)
	}
	if res.NodeClass == nil || res.NodeClass.Name != "kafka" || len(res.NodeClass.Status.AMIs) != 1 {
		t.Fatalf("nodeclass: %+v", res.NodeClass)
	}
	// Plain reads are copies: changing one does not change the snapshot.
	node := &corev1.Node{}
	if err := m.reader.Get(ctx, client.ObjectKey{Name: res.Node.Name}, node); err != nil {
		t.Fatal(err)
	}
	node.Labels["x"] = "y"
	again, _ := m.Resolve(ctx, "i-0fedcba9876543210")
	if again.Node.Labels["x"] != "" {
		t.Error("snapshot handed out its own object to a plain Get")
	}

	missing, err := m.Resolve(ctx, "i-0999888777666555a")
	if err != nil || missing.Found() {
		t.Errorf("unknown instance: %+v, %v", missing, err)
	}
	nodes, inFlight, err := m.PoolState(ctx, "kafka")
	if err != nil || nodes != 3 || inFlight != 0 {
		t.Errorf("PoolState(kafka) = %d, %d, %v", nodes, inFlight, err)
	}
}

func TestSnapshotRejectsScan(t *testing.T) {
	m := loadDemo(t)
	err := m.reader.List(context.Background(), newNodeList(), client.MatchingFields{"spec.unindexed": "x", IndexInstanceID: "y"})
	if err == nil || !strings.Contains(err.Error(), "only one exact match") {
		t.Errorf("a two-field selector was served: %v", err)
	}
}

func TestLoadMultiDocument(t *testing.T) {
	scheme, _ := NewScheme()
	doc := `
apiVersion: v1
kind: Node
metadata: {name: n1}
spec: {providerID: "aws:///eu-west-1a/i-0a1b2c3d4e5f60718"}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm1, namespace: default}
---
apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: kafka, labels: {app: kafka}}
spec: {nodeName: n1, containers: [{name: c, image: kafka}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: kafka-pdb, namespace: kafka}
spec: {selector: {matchLabels: {app: kafka}}}
status: {disruptionsAllowed: 0, currentHealthy: 2, desiredHealthy: 3, expectedPods: 3}
---
apiVersion: karpenter.sh/v1
kind: NodeClaim
metadata: {name: c1, labels: {karpenter.sh/nodepool: default}}
spec: {nodeClassRef: {group: karpenter.k8s.aws, kind: EC2NodeClass, name: default}, requirements: []}
status: {providerID: "aws:///eu-west-1a/i-0a1b2c3d4e5f60718"}
`
	objs, ignored, err := Load(scheme, strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 4 || len(ignored) != 1 || ignored[0] != "/v1, Kind=ConfigMap" {
		t.Errorf("objs %d, ignored %v", len(objs), ignored)
	}
	// The gates' index on a snapshot: the pods of a node.
	byNode := Index{Object: &corev1.Pod{}, Field: "test/node", Extract: func(o client.Object) []string { return []string{o.(*corev1.Pod).Spec.NodeName} }}
	snap, err := NewSnapshotIndexed(scheme, append(Indexes(), byNode), objs...)
	if err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := snap.List(context.Background(), &pods, client.MatchingFields{"test/node": "n1"}); err != nil || len(pods.Items) != 1 || pods.Items[0].Labels["app"] != "kafka" {
		t.Errorf("pods of n1: %+v, %v", pods.Items, err)
	}
	var pdbs policyv1.PodDisruptionBudgetList
	if err := snap.List(context.Background(), &pdbs, client.InNamespace("kafka")); err != nil || len(pdbs.Items) != 1 || pdbs.Items[0].Status.DesiredHealthy != 3 {
		t.Errorf("pdbs of kafka: %+v, %v", pdbs.Items, err)
	}
	if _, _, err := Load(scheme, strings.NewReader("kind: [")); err == nil {
		t.Error("bad YAML accepted")
	}
}

func newNodeList() client.ObjectList { return &corev1.NodeList{} }

// TestInstanceLookups: IndexInstanceID holds buckets of instance IDs, so instances that share
// a bucket (the same last digits) must still resolve to their own objects only.
func TestInstanceLookups(t *testing.T) {
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	node := func(name, id string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + id}}
	}
	claim := func(name, id string) *karpv1.NodeClaim {
		return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + id}}
	}
	const a, b, c = "i-0000000000000a123", "i-0000000000000b123", "i-0000000000000a124"
	if InstanceBucket(a) != InstanceBucket(b) || InstanceBucket(a) == InstanceBucket(c) {
		t.Fatalf("buckets: %s %s %s", InstanceBucket(a), InstanceBucket(b), InstanceBucket(c))
	}
	snap, err := NewSnapshot(scheme, node("na", a), node("nb", b), node("nc", c), node("unlaunched", ""), claim("ca", a), claim("cb", b))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		id            string
		nodes, claims []string
	}{
		{a, []string{"na"}, []string{"ca"}},
		{b, []string{"nb"}, []string{"cb"}},
		{c, []string{"nc"}, nil},
		{"i-0000000000000f123", nil, nil}, // same bucket, no such instance
		{"i-0000000000000f999", nil, nil},
	} {
		nodes, err := InstanceNodes(ctx, snap, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		claims, err := InstanceClaims(ctx, snap, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		var gotNodes, gotClaims []string
		for _, n := range nodes {
			gotNodes = append(gotNodes, n.Name)
		}
		for _, nc := range claims {
			gotClaims = append(gotClaims, nc.Name)
		}
		if !slices.Equal(gotNodes, tc.nodes) || !slices.Equal(gotClaims, tc.claims) {
			t.Errorf("%s: nodes %v claims %v, want %v %v", tc.id, gotNodes, gotClaims, tc.nodes, tc.claims)
		}
		res, err := New(snap).Resolve(ctx, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		if res.Found() != (tc.nodes != nil) || (res.Node != nil && res.Node.Name != tc.nodes[0]) {
			t.Errorf("%s: resolved %+v", tc.id, res)
		}
	}
}
