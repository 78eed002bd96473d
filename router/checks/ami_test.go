package checks

import (
	"strings"
	"testing"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
)

func req(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

// bottlerocket is what an alias such as bottlerocket@1.49.0 resolves to in status.amis:
// four images, newest first, told apart by arch and by GPU presence.
var bottlerocket = []awsv1.AMI{
	{ID: "ami-0a1111111111111aa", Name: "bottlerocket-aws-k8s-1.34-nvidia-x86_64-v1.49.0", Requirements: []corev1.NodeSelectorRequirement{
		req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpExists)}},
	{ID: "ami-0a2222222222222bb", Name: "bottlerocket-aws-k8s-1.34-nvidia-aarch64-v1.49.0", Requirements: []corev1.NodeSelectorRequirement{
		req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpExists)}},
	{ID: "ami-0a3333333333333cc", Name: "bottlerocket-aws-k8s-1.34-x86_64-v1.49.0", Requirements: []corev1.NodeSelectorRequirement{
		req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
	{ID: "ami-0a4444444444444dd", Name: "bottlerocket-aws-k8s-1.34-aarch64-v1.49.0", Requirements: []corev1.NodeSelectorRequirement{
		req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
}

func TestSelectImage(t *testing.T) {
	deprecatedFirst := append([]awsv1.AMI{{ID: "ami-0old0000000000000", Deprecated: true, Requirements: bottlerocket[2].Requirements}}, bottlerocket...)
	onlyDeprecated := []awsv1.AMI{{ID: "ami-0old0000000000000", Deprecated: true, Requirements: bottlerocket[2].Requirements}}
	tests := []struct {
		name   string
		amis   []awsv1.AMI
		labels map[string]string
		want   string
		err    string
	}{
		{"x86 no gpu", bottlerocket, map[string]string{corev1.LabelArchStable: "amd64"}, "ami-0a3333333333333cc", ""},
		{"arm no gpu", bottlerocket, map[string]string{corev1.LabelArchStable: "arm64"}, "ami-0a4444444444444dd", ""},
		{"x86 gpu", bottlerocket, map[string]string{corev1.LabelArchStable: "amd64", awsv1.LabelInstanceGPUCount: "1"}, "ami-0a1111111111111aa", ""},
		{"arm gpu", bottlerocket, map[string]string{corev1.LabelArchStable: "arm64", awsv1.LabelInstanceGPUCount: "4"}, "ami-0a2222222222222bb", ""},
		{"skips deprecated", deprecatedFirst, map[string]string{corev1.LabelArchStable: "amd64"}, "ami-0a3333333333333cc", ""},
		{"deprecated when alone", onlyDeprecated, map[string]string{corev1.LabelArchStable: "amd64"}, "ami-0old0000000000000", ""},
		{"no arch label matches nothing", bottlerocket, map[string]string{}, "", "no image"},
		{"unknown arch", bottlerocket, map[string]string{corev1.LabelArchStable: "s390x"}, "", "kubernetes.io/arch=s390x"},
		{"empty status", nil, map[string]string{corev1.LabelArchStable: "amd64"}, "", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SelectImage(tt.amis, tt.labels)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != tt.want {
				t.Errorf("image = %s (%s), want %s", got.ID, got.Name, tt.want)
			}
		})
	}
}

func TestFeatureGateDefaults(t *testing.T) {
	g := NewFeatureGates()
	if !g.Enabled(ReservedCapacity) {
		t.Error("ReservedCapacity should default on, as in current Karpenter")
	}
	if err := g.Set("ReservedCapacity=false"); err != nil {
		t.Fatal(err)
	}
	if g.Enabled(ReservedCapacity) {
		t.Error("gate not turned off")
	}
	if err := NewFeatureGates().Set("NoSuchGate=true"); err == nil {
		t.Error("unknown gate accepted")
	}
	// With the gate off the checker holds no reservation check at all.
	if c := NewChecker(nil, NewReservations(nil, nil), g); c.reservations != nil {
		t.Error("reservation check kept with the gate off")
	}
}
