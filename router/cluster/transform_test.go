package cluster

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

func TestTrimNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-1-2", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "healthrouter.io/maintenance": "{}"},
			Labels: map[string]string{corev1.LabelArchStable: "arm64", karpv1.NodePoolLabelKey: "kafka", "karpenter.k8s.aws/instance-gpu-count": "1", "team": "payments",
				"healthrouter.io/maintenance-at": "1796436000"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0", Unschedulable: true,
			Taints: []corev1.Taint{{Key: "x"}, {Key: "healthrouter.io/maintenance-upcoming", Value: "scheduled-change", Effect: corev1.TaintEffectPreferNoSchedule}}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"a"}, SizeBytes: 1}}, Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}},
	}
	out, err := TrimNode(n)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Node)
	if got.Name != "ip-10-0-1-2" || got.Spec.ProviderID == "" || InstanceID(got.Spec.ProviderID) != "i-0123456789abcdef0" {
		t.Errorf("lost what the router reads: %+v", got)
	}
	if got.Labels[corev1.LabelArchStable] != "arm64" || got.Labels[karpv1.NodePoolLabelKey] != "kafka" {
		t.Errorf("labels the model reads were dropped: %v", got.Labels)
	}
	// The shape labels are kept once per node, on the NodeClaim.
	if _, ok := got.Labels["karpenter.k8s.aws/instance-gpu-count"]; ok {
		t.Errorf("a shape label kept on the Node: %v", got.Labels)
	}
	// The router's own marks (router/upcoming) are kept: it compares them with what the
	// records say without reading the Node from the API server.
	if got.Labels["healthrouter.io/maintenance-at"] == "" || len(got.Annotations) != 1 || got.Annotations["healthrouter.io/maintenance"] == "" ||
		len(got.Spec.Taints) != 1 || got.Spec.Taints[0].Key != "healthrouter.io/maintenance-upcoming" {
		t.Errorf("the router's marks were dropped: %+v %+v", got.ObjectMeta, got.Spec)
	}
	if _, ok := got.Labels["team"]; ok || got.ManagedFields != nil || len(got.Status.Images) > 0 || got.Spec.Unschedulable || got.Status.Capacity != nil {
		t.Errorf("kept what the router never reads: %+v", got)
	}
	if o, _ := TrimNode("not a node"); o != "not a node" {
		t.Error("a foreign object was changed")
	}
}

func TestTrimNodeClaim(t *testing.T) {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "kafka-a1", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "karpenter"}},
			Annotations: map[string]string{AnnotationDeferred: "[]", AnnotationDrainSignalled: "e1 2026-11-21T12:00:00Z forward", "karpenter.k8s.aws/ec2nodeclass-hash": "123"},
			Labels:      map[string]string{karpv1.NodePoolLabelKey: "kafka", "custom": "x"}, Finalizers: []string{"karpenter.sh/termination"}},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: "k", Operator: corev1.NodeSelectorOpIn, Values: []string{"v"}}}},
		Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-1", ImageID: "ami-1", Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}},
	}
	nc.StatusConditions().SetTrueWithReason("Drifted", "AMIDrift", fmt.Sprintf("%0500d", 0))
	nc.StatusConditions().SetTrue("Launched")
	out, _ := TrimNodeClaim(nc)
	got := out.(*karpv1.NodeClaim)
	if got.Annotations[AnnotationDeferred] != "[]" || got.Annotations[AnnotationDrainSignalled] == "" || got.Spec.NodeClassRef == nil || got.Status.ProviderID != "aws:///eu-west-1a/i-1" {
		t.Errorf("lost what the router reads: %+v", got)
	}
	// Counted before StatusConditions(), which fills in the default conditions.
	if c := got.Status.Conditions; len(c) != 1 || c[0].Type != "Drifted" || c[0].Status != "True" || c[0].Message != "" || c[0].LastTransitionTime.IsZero() {
		t.Errorf("conditions: %+v", got.Status.Conditions)
	}
	if got.ManagedFields != nil || got.Spec.Requirements != nil || got.Status.Capacity != nil || got.Labels["custom"] != "" ||
		got.Finalizers != nil || got.Annotations["karpenter.k8s.aws/ec2nodeclass-hash"] != "" {
		t.Errorf("kept what the router never reads: %+v", got)
	}
}
