package cluster

import (
	"fmt"
	"maps"
	"reflect"
	"runtime"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

func TestTrimmerNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-1-2", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0", "healthrouter.io/maintenance": "{}"},
			Labels: map[string]string{corev1.LabelArchStable: "arm64", karpv1.NodePoolLabelKey: "kafka", "karpenter.k8s.aws/instance-gpu-count": "1", "team": "payments",
				"healthrouter.io/maintenance-at": "1796436000"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0", Unschedulable: true,
			Taints: []corev1.Taint{{Key: "x"}, {Key: "healthrouter.io/maintenance-upcoming", Value: "scheduled-change", Effect: corev1.TaintEffectPreferNoSchedule}}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"a"}, SizeBytes: 1}}, Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}},
	}
	out, err := NewTrimmer().Node(n)
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
	if o, _ := NewTrimmer().Node("not a node"); o != "not a node" {
		t.Error("a foreign object was changed")
	}
}

func TestTrimmerNodeClaim(t *testing.T) {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "kafka-a1", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "karpenter"}},
			Annotations: map[string]string{record.Annotation: "[]", record.AnnotationDrainSignalled: "e1 2026-11-21T12:00:00Z forward", "karpenter.k8s.aws/ec2nodeclass-hash": "123"},
			Labels:      map[string]string{karpv1.NodePoolLabelKey: "kafka", "custom": "x"}, Finalizers: []string{"karpenter.sh/termination"}},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: "k", Operator: corev1.NodeSelectorOpIn, Values: []string{"v"}}}},
		Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-1", NodeName: "ip-10-0-0-1.eu-west-1.compute.internal", ImageID: "ami-1", Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}},
	}
	nc.StatusConditions().SetTrueWithReason("Drifted", "AMIDrift", fmt.Sprintf("%0500d", 0))
	nc.StatusConditions().SetTrue("Launched")
	out, _ := NewTrimmer().NodeClaim(nc)
	got := out.(*karpv1.NodeClaim)
	if got.Spec.NodeClassRef == nil || got.Status.ProviderID != "aws:///eu-west-1a/i-1" {
		t.Errorf("lost what the router reads: %+v", got)
	}
	// The keys routers before the store kept their memory in are not the router's memory:
	// not cached, so never read back as orders.
	if _, ok := got.Annotations[record.Annotation]; ok {
		t.Errorf("cached %s", record.Annotation)
	}
	if _, ok := got.Annotations[record.AnnotationDrainSignalled]; ok {
		t.Errorf("cached %s", record.AnnotationDrainSignalled)
	}
	// The Node's name stays: status, the calendar and the planned-drain gauges name it
	// (issue 25: the live router named no node).
	if got.Status.NodeName != "ip-10-0-0-1.eu-west-1.compute.internal" {
		t.Errorf("node name %q dropped", got.Status.NodeName)
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

// sameMap reports whether a and b are one map (not merely equal).
func sameMap(a, b map[string]string) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func TestTrimmerSharesLabels(t *testing.T) {
	base := map[string]string{karpv1.NodePoolLabelKey: "kafka", karpv1.CapacityTypeLabelKey: "spot", corev1.LabelArchStable: "arm64", "team": "payments"}
	with := func(k, v string) map[string]string {
		m := maps.Clone(base)
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name  string
		other map[string]string
		share bool
	}{
		{"equal labels", maps.Clone(base), true},
		{"differ only in a dropped label", with("team", "search"), true},
		{"differ in a kept label", with(karpv1.NodePoolLabelKey, "web"), false},
		{"one more kept label", with(corev1.LabelOSStable, "linux"), false},
		{"the router's mark (a per-event value)", with("healthrouter.io/maintenance-at", "1796436000"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTrimmer()
			a, _ := tr.Node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: maps.Clone(base)}})
			b, _ := tr.Node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: tc.other}})
			la, lb := a.(*corev1.Node).Labels, b.(*corev1.Node).Labels
			if sameMap(la, lb) != tc.share {
				t.Errorf("shared %v, want %v: %v %v", sameMap(la, lb), tc.share, la, lb)
			}
			if _, ok := lb["team"]; ok || lb[karpv1.NodePoolLabelKey] != tc.other[karpv1.NodePoolLabelKey] {
				t.Errorf("kept labels: %v", lb)
			}
			// Interned: equal strings of different objects are one string in memory.
			if unsafe.StringData(la[corev1.LabelArchStable]) != unsafe.StringData(lb[corev1.LabelArchStable]) {
				t.Error("the arch value was not interned")
			}
			for k := range lb {
				if _, ok := la[k]; ok && !internedKey(la, lb, k) {
					t.Errorf("key %s not interned", k)
				}
			}
		})
	}
}

// internedKey reports whether the key k of a and of b is one string in memory.
func internedKey(a, b map[string]string, k string) bool {
	var ka, kb string
	for x := range a {
		if x == k {
			ka = x
		}
	}
	for x := range b {
		if x == k {
			kb = x
		}
	}
	return unsafe.StringData(ka) == unsafe.StringData(kb)
}

func TestTrimmerSharesNodeClaimParts(t *testing.T) {
	tr := NewTrimmer()
	claim := func(name, pool, class string) *karpv1.NodeClaim {
		nc, _ := tr.NodeClaim(&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{karpv1.NodePoolLabelKey: pool, "x": name},
			Annotations: map[string]string{"healthrouter.io/shadow": name, "karpenter.sh/nodepool-hash": "1"}},
			Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: class}}})
		return nc.(*karpv1.NodeClaim)
	}
	a := claim("a", "kafka", "default")
	// A garbage collection between two objects must not cost the sharing (CI once found a
	// pool that dropped its strings when no handle to them was live).
	runtime.GC()
	runtime.GC()
	b, c := claim("b", "kafka", "default"), claim("c", "web", "gpu")
	if !sameMap(a.Labels, b.Labels) || sameMap(a.Labels, c.Labels) || a.Labels["x"] != "" {
		t.Errorf("labels: %v %v %v", a.Labels, b.Labels, c.Labels)
	}
	if a.Spec.NodeClassRef != b.Spec.NodeClassRef || a.Spec.NodeClassRef == c.Spec.NodeClassRef || c.Spec.NodeClassRef.Name != "gpu" {
		t.Errorf("NodeClass references: %p %p %+v", a.Spec.NodeClassRef, b.Spec.NodeClassRef, c.Spec.NodeClassRef)
	}
	// Annotations are the object's own (records differ per NodeClaim); their keys are interned.
	if sameMap(a.Annotations, b.Annotations) || a.Annotations["healthrouter.io/shadow"] != "a" || len(a.Annotations) != 1 || !internedKey(a.Annotations, b.Annotations, "healthrouter.io/shadow") {
		t.Errorf("annotations: %v %v", a.Annotations, b.Annotations)
	}
}

// TestTrimmerBounded: the shared tables start again past maxShared, so churn of shapes cannot
// grow them without bound; objects trimmed before keep their maps.
func TestTrimmerBounded(t *testing.T) {
	tr := NewTrimmer()
	first, _ := tr.Node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{karpv1.NodePoolLabelKey: "p0"}}})
	for i := 1; i <= maxShared+10; i++ {
		tr.Node(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{karpv1.NodePoolLabelKey: fmt.Sprint("p", i)}}})
	}
	if len(tr.labels) > maxShared {
		t.Errorf("%d shared label sets, bound %d", len(tr.labels), maxShared)
	}
	if first.(*corev1.Node).Labels[karpv1.NodePoolLabelKey] != "p0" {
		t.Errorf("an earlier object's labels changed: %v", first.(*corev1.Node).Labels)
	}
}
