package integration

import (
	"context"
	"testing"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/test/harness"
)

// TestLiveModel resolves instances through a controller-runtime cache over a real
// kube-apiserver with the real Karpenter CRDs: the same Model the snapshot tests use.
func TestLiveModel(t *testing.T) {
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
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.SetupIndexes(ctx, c); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	nodeClass := &awsv1.EC2NodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "kafka"},
		Spec: awsv1.EC2NodeClassSpec{
			Role:                       "KarpenterNodeRole-test",
			AMISelectorTerms:           []awsv1.AMISelectorTerm{{Alias: "al2023@latest"}},
			SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
			SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
		},
	}
	mustCreate(t, kube, nodeClass)
	nodeClass.Status.AMIs = []awsv1.AMI{{ID: "ami-0c55b159cbfafe1f0", Requirements: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}
	if err := kube.Status().Update(ctx, nodeClass); err != nil {
		t.Fatalf("status of ec2nodeclass: %v", err)
	}
	pool := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: map[string]string{"healthrouter.io/action": "defer"}},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "kafka"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
		}}},
	}
	mustCreate(t, kube, pool)
	ids := []string{"i-07c3e1d2b4a596870", "i-0fedcba9876543210"}
	for i, id := range ids {
		claim := &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "kafka-" + id[2:8], Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}, Finalizers: []string{"test.healthrouter.io/hold"}},
			Spec: karpv1.NodeClaimSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "kafka"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"kafka"}}},
			},
		}
		mustCreate(t, kube, claim)
		claim.Status.ProviderID = "aws:///eu-west-1a/" + id
		if err := kube.Status().Update(ctx, claim); err != nil {
			t.Fatalf("status of nodeclaim: %v", err)
		}
		if i == 0 {
			node := &corev1.Node{
				ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-1-201.eu-west-1.compute.internal", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka", corev1.LabelArchStable: "amd64"}},
				Spec:       corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + id},
			}
			mustCreate(t, kube, node)
		}
	}

	model := cluster.New(c)
	var res cluster.Resolved
	poll(t, func() bool {
		res, err = model.Resolve(ctx, ids[0])
		return err == nil && res.Node != nil && res.NodeClaim != nil && res.NodeClass != nil && len(res.NodeClass.Status.AMIs) == 1
	})
	if res.NodePool == nil || res.NodePool.Annotations["healthrouter.io/action"] != "defer" || res.PoolName() != "kafka" {
		t.Fatalf("nodepool: %+v", res.NodePool)
	}
	// The second instance has a NodeClaim but no Node yet (still launching): still found.
	poll(t, func() bool {
		r, err := model.Resolve(ctx, ids[1])
		return err == nil && r.Found() && r.Node == nil && r.NodeClaim != nil
	})
	if r, err := model.Resolve(ctx, "i-0999888777666555a"); err != nil || r.Found() {
		t.Fatalf("unknown instance: %+v, %v", r, err)
	}

	// A NodeClaim being deleted counts as a drain in flight.
	nodes, inFlight, err := model.PoolState(ctx, "kafka")
	if err != nil || nodes != 2 || inFlight != 0 {
		t.Fatalf("PoolState = %d, %d, %v", nodes, inFlight, err)
	}
	if err := kube.Delete(ctx, res.NodeClaim); err != nil {
		t.Fatal(err)
	}
	poll(t, func() bool {
		nodes, inFlight, err = model.PoolState(ctx, "kafka")
		return err == nil && nodes == 2 && inFlight == 1
	})
}

func mustCreate(t *testing.T, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func poll(t *testing.T, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal("condition not met within 20s")
	}
}
