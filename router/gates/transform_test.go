package gates

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestTrimPod(t *testing.T) {
	now := metav1.NewTime(since)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kafka", Name: "kafka-0", UID: "u", ResourceVersion: "7", Labels: map[string]string{"app": "kafka"},
			Annotations:       map[string]string{AnnotationMirror: "h", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			OwnerReferences:   []metav1.OwnerReference{{Kind: "StatefulSet", Name: "kafka", UID: "s", Controller: ptr.To(true)}},
			DeletionTimestamp: &now, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "ip-10-0-1-23", Containers: []corev1.Container{{Name: "kafka", Image: "kafka:3", Env: []corev1.EnvVar{{Name: "A", Value: "b"}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}}},
			Volumes: []corev1.Volume{{Name: "data"}}, Tolerations: []corev1.Toleration{{Key: "x"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.1.5",
			Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now, Message: "m"}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "kafka", Ready: true, Image: "kafka:3"}}},
	}
	before, _ := json.Marshal(p)
	out, err := TrimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if got.Name != "kafka-0" || got.Namespace != "kafka" || got.UID != "u" || got.Labels["app"] != "kafka" || len(got.OwnerReferences) != 1 ||
		got.Spec.NodeName != "ip-10-0-1-23" || got.Status.Phase != corev1.PodRunning || got.DeletionTimestamp == nil || got.Annotations[AnnotationMirror] != "h" {
		t.Errorf("lost what the gates read: %+v", got)
	}
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != corev1.PodReady || got.Status.Conditions[0].Status != corev1.ConditionTrue || !got.Status.Conditions[0].LastTransitionTime.Equal(&now) {
		t.Errorf("conditions: want Ready only, got %+v", got.Status.Conditions)
	}
	if got.Spec.Containers != nil || got.Spec.Volumes != nil || got.Spec.Tolerations != nil || got.Status.ContainerStatuses != nil || got.ManagedFields != nil ||
		got.Status.PodIP != "" || len(got.Annotations) != 1 || got.Status.Conditions[0].Message != "" {
		t.Errorf("kept what the gates never read: %+v", got)
	}
	after, _ := json.Marshal(got)
	if len(after) >= len(before)/2 {
		t.Errorf("trimmed pod is %d bytes of %d", len(after), len(before))
	}
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": "b"}}}
	if o, _ := TrimPod(plain); o.(*corev1.Pod).Annotations != nil {
		t.Error("annotations of a non-mirror pod were kept")
	}
	if o, _ := TrimPod("not a pod"); o != "not a pod" {
		t.Error("a foreign object was changed")
	}
}

func TestTrimPDB(t *testing.T) {
	min := intstr.FromInt32(2)
	p := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kafka", Name: "kafka-pdb", Labels: map[string]string{"x": "y"}, Annotations: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "helm"}}},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &min, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kafka"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 0, CurrentHealthy: 2, DesiredHealthy: 2, ExpectedPods: 3,
			DisruptedPods: map[string]metav1.Time{"kafka-1": metav1.NewTime(since)},
			Conditions:    []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionFalse, Reason: "InsufficientPods", Message: "long", LastTransitionTime: metav1.NewTime(since)}, {Type: "Other"}}},
	}
	out, err := TrimPDB(p)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*policyv1.PodDisruptionBudget)
	if got.Name != "kafka-pdb" || got.Spec.Selector == nil || got.Spec.Selector.MatchLabels["app"] != "kafka" || got.Status.CurrentHealthy != 2 || got.Status.DesiredHealthy != 2 {
		t.Errorf("lost what the gate reads: %+v", got)
	}
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Status != metav1.ConditionFalse || !got.Status.Conditions[0].LastTransitionTime.Time.Equal(since) || got.Status.Conditions[0].Message != "" {
		t.Errorf("conditions: %+v", got.Status.Conditions)
	}
	if got.Spec.MinAvailable != nil || got.Status.DisruptedPods != nil || got.Status.ExpectedPods != 0 || got.Labels != nil || got.Annotations != nil || got.ManagedFields != nil {
		t.Errorf("kept what the gate never reads: %+v", got)
	}
	if o, _ := TrimPDB("x"); o != "x" {
		t.Error("a foreign object was changed")
	}
}
