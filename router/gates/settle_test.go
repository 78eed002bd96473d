package gates

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func ownedPod(name, node, kind, owner string, uid types.UID, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return pod("kafka", name, node, map[string]string{"app": owner}, func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: owner, UID: uid, Controller: ptr.To(true)}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	})
}

func TestOwners(t *testing.T) {
	r := newReader(t,
		ownedPod("kafka-0", "node-a", "StatefulSet", "kafka", "u-kafka", true),
		ownedPod("kafka-1", "node-a", "StatefulSet", "kafka", "u-kafka", true),
		ownedPod("web-1", "node-a", "ReplicaSet", "web-7d9f", "u-web", true),
		ownedPod("exporter", "node-a", "DaemonSet", "exporter", "u-ds", true),
		pod("kafka", "bare", "node-a", nil),
		ownedPod("kafka-2", "node-b", "StatefulSet", "kafka", "u-kafka", true),
	)
	owners, err := Owners(context.Background(), r, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range owners {
		got = append(got, o.String())
	}
	if want := []string{"kafka/replicaset/web-7d9f", "kafka/statefulset/kafka"}; !slices.Equal(got, want) {
		t.Errorf("owners %v, want %v (each once, no DaemonSet, no bare pod)", got, want)
	}
}

func TestSettled(t *testing.T) {
	kafka := Owner{Namespace: "kafka", Kind: "StatefulSet", Name: "kafka", UID: "u-kafka"}
	tests := []struct {
		name    string
		node    string
		pods    []*corev1.Pod
		settled bool
		reason  string
	}{
		{name: "all Ready elsewhere", node: "node-a", pods: []*corev1.Pod{ownedPod("kafka-0", "node-c", "StatefulSet", "kafka", "u-kafka", true), ownedPod("kafka-1", "node-b", "StatefulSet", "kafka", "u-kafka", true)},
			settled: true, reason: "Ready again"},
		{name: "replacement not Ready yet", node: "node-a", pods: []*corev1.Pod{ownedPod("kafka-0", "node-c", "StatefulSet", "kafka", "u-kafka", false), ownedPod("kafka-1", "node-b", "StatefulSet", "kafka", "u-kafka", true)},
			reason: "kafka/statefulset/kafka (1 of 2 pods Ready elsewhere)"},
		{name: "still on the drained node", node: "node-a", pods: []*corev1.Pod{ownedPod("kafka-0", "node-a", "StatefulSet", "kafka", "u-kafka", true)}, reason: "0 of 1"},
		{name: "no pod recreated yet", node: "", pods: nil, reason: "0 of 0"},
		{name: "pods of other owners do not count", node: "node-a", pods: []*corev1.Pod{ownedPod("kafka-0", "node-c", "StatefulSet", "kafka", "u-kafka", true), ownedPod("zk-0", "node-c", "StatefulSet", "zk", "u-zk", false)},
			settled: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []client.Object
			for _, p := range tt.pods {
				objs = append(objs, p)
			}
			ok, reason, err := Settled(context.Background(), newReader(t, objs...), []Owner{kafka}, tt.node)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tt.settled || !strings.Contains(reason, tt.reason) {
				t.Errorf("settled %v (%s), want %v with %q", ok, reason, tt.settled, tt.reason)
			}
		})
	}
}
