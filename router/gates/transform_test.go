package gates

import (
	"encoding/json"
	"fmt"
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
	t.Logf("pod JSON %d bytes -> %d trimmed (%.1fx smaller)", len(before), len(after), float64(len(before))/float64(len(after)))
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

// realisticPod is a Kafka broker pod as a StatefulSet and the kubelet write it: two
// containers with env, probes, mounts and resources, the default tolerations, volumes,
// managedFields from three managers, container statuses and five conditions.
func realisticPod() *corev1.Pod {
	var env []corev1.EnvVar
	for i := range 12 {
		env = append(env, corev1.EnvVar{Name: "KAFKA_CFG_SETTING_" + string(rune('A'+i)), Value: "some-value-for-the-broker-setting"})
	}
	mounts := []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/kafka"}, {Name: "config", MountPath: "/etc/kafka"}, {Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(9092)}}, InitialDelaySeconds: 30, PeriodSeconds: 10}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi")}, Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}}
	c := corev1.Container{Name: "kafka", Image: "docker.io/bitnami/kafka:3.9.0-debian-12-r4", Env: env, VolumeMounts: mounts, LivenessProbe: probe, ReadinessProbe: probe, Resources: res,
		Ports: []corev1.ContainerPort{{Name: "client", ContainerPort: 9092}, {Name: "internal", ContainerPort: 9094}}}
	exporter := c
	exporter.Name, exporter.Image = "jmx-exporter", "docker.io/bitnami/jmx-exporter:1.0.1"
	fields := []byte(`{"f:metadata":{"f:labels":{}`)
	for i := 0; len(fields) < 3500; i++ {
		fields = fmt.Appendf(fields, `,"f:spec.containers.env.KAFKA_CFG_SETTING_%d":{".":{},"f:name":{},"f:value":{}}`, i)
	}
	fields = append(fields, "}}"...)
	now := metav1.NewTime(since)
	var conds []corev1.PodCondition
	for _, t := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		conds = append(conds, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	status := corev1.ContainerStatus{Name: "kafka", Ready: true, RestartCount: 0, Image: c.Image, ImageID: "docker.io/bitnami/kafka@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		ContainerID: "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Started: ptr.To(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kafka", Name: "kafka-0", UID: "0d9c3f4e-1111-4c3b-9c1e-000000000001", ResourceVersion: "123456789",
			Labels:          map[string]string{"app.kubernetes.io/name": "kafka", "app.kubernetes.io/instance": "kafka", "app.kubernetes.io/component": "broker", "statefulset.kubernetes.io/pod-name": "kafka-0", "controller-revision-hash": "kafka-7d9f8b6c5"},
			Annotations:     map[string]string{"checksum/config": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "prometheus.io/scrape": "true", "prometheus.io/port": "5556"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "kafka", UID: "s", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: fields}},
				{Manager: "kubelet", Operation: "Update", Subresource: "status", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: fields}}}},
		Spec: corev1.PodSpec{NodeName: "ip-10-0-1-23.eu-west-1.compute.internal", Containers: []corev1.Container{c, exporter}, ServiceAccountName: "kafka", Hostname: "kafka-0", Subdomain: "kafka-headless",
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-kafka-0"}}},
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kafka-config"}}}}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](300)}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds, HostIP: "10.0.1.23", PodIP: "10.0.1.57", PodIPs: []corev1.PodIP{{IP: "10.0.1.57"}}, StartTime: &now, QOSClass: corev1.PodQOSBurstable,
			ContainerStatuses: []corev1.ContainerStatus{status, status}},
	}
}

// TestTrimPodRealistic bounds what a cached pod costs: the trimmed pod is a small fraction
// of what the API server sends.
func TestTrimPodRealistic(t *testing.T) {
	p := realisticPod()
	before, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := TrimPod(p)
	after, _ := json.Marshal(out)
	ratio := float64(len(before)) / float64(len(after))
	t.Logf("realistic broker pod: %d bytes of JSON -> %d trimmed (%.1fx smaller)", len(before), len(after), ratio)
	if ratio < 5 {
		t.Errorf("trimmed pod only %.1fx smaller", ratio)
	}
}
