package gates

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/health-router/health-router/router/policy"
)

var since = time.Date(2026, 11, 21, 11, 40, 0, 0, time.UTC)

func pod(ns, name, node string, lbls map[string]string, mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, m := range mut {
		m(p)
	}
	return p
}

func daemonSetOwned(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "node-exporter", UID: "u1", Controller: ptr.To(true)}}
}
func mirror(p *corev1.Pod)    { p.Annotations = map[string]string{AnnotationMirror: "abc"} }
func succeeded(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }

func pdb(ns, name string, sel *metav1.LabelSelector, allowed int32) *policyv1.PodDisruptionBudget {
	status := metav1.ConditionTrue
	if allowed == 0 {
		status = metav1.ConditionFalse
	}
	return &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: sel},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, CurrentHealthy: 2, DesiredHealthy: 3,
			Conditions: []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition, Status: status, Reason: "x", LastTransitionTime: metav1.NewTime(since)}}}}
}

func app(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
}

func newReader(t *testing.T, objs ...client.Object) client.Reader {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...)
	for _, ix := range Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	return b.Build()
}

func TestPDBCheck(t *testing.T) {
	const node = "ip-10-0-1-23"
	kafka := map[string]string{"app": "kafka"}
	tests := []struct {
		name     string
		objs     []client.Object
		held     bool
		pdbs     string
		reason   string
		wantTime bool
	}{
		{name: "no pods, no pdb", objs: nil, reason: "no PodDisruptionBudget is at zero"},
		{name: "no pods on the node, a pdb at zero", objs: []client.Object{pdb("kafka", "kafka-pdb", app("kafka"), 0)}, reason: "0 pod(s)"},
		{name: "pdb at zero selecting a pod on the node", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("kafka", "kafka-pdb", app("kafka"), 0)},
			held: true, pdbs: "kafka/kafka-pdb", reason: "PodDisruptionBudget kafka/kafka-pdb allows no disruption (2 healthy, 3 desired) and selects kafka-0", wantTime: true},
		{name: "pdb allowing one: the pods are not read", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("kafka", "kafka-pdb", app("kafka"), 1)}, reason: "no PodDisruptionBudget is at zero"},
		{name: "pdb at zero selecting other pods", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("kafka", "zk-pdb", app("zookeeper"), 0)}},
		{name: "pdb at zero in another namespace", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("other", "kafka-pdb", app("kafka"), 0)}},
		{name: "pod on another node", objs: []client.Object{pod("kafka", "kafka-1", "ip-10-0-9-9", kafka), pdb("kafka", "kafka-pdb", app("kafka"), 0)}, reason: "0 pod(s)"},
		{name: "daemonset pod skipped", objs: []client.Object{pod("kafka", "exporter", node, kafka, daemonSetOwned), pdb("kafka", "kafka-pdb", app("kafka"), 0)}},
		{name: "mirror pod skipped", objs: []client.Object{pod("kafka", "static", node, kafka, mirror), pdb("kafka", "kafka-pdb", app("kafka"), 0)}},
		{name: "terminal pod skipped", objs: []client.Object{pod("kafka", "job", node, kafka, succeeded), pdb("kafka", "kafka-pdb", app("kafka"), 0)}},
		{name: "empty selector selects the namespace", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("kafka", "all", &metav1.LabelSelector{}, 0)}, held: true, pdbs: "kafka/all"},
		{name: "nil selector selects nothing", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pdb("kafka", "none", nil, 0)}},
		{name: "match expressions", objs: []client.Object{pod("kafka", "kafka-0", node, kafka),
			pdb("kafka", "expr", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"kafka", "zk"}}}}, 0)}, held: true, pdbs: "kafka/expr"},
		{name: "two pdbs at zero in two namespaces", objs: []client.Object{pod("kafka", "kafka-0", node, kafka), pod("zk", "zk-0", node, map[string]string{"app": "zk"}),
			pdb("kafka", "kafka-pdb", app("kafka"), 0), pdb("zk", "zk-pdb", app("zk"), 0), pdb("zk", "fine", app("zk"), 2)}, held: true, pdbs: "kafka/kafka-pdb,zk/zk-pdb"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewPDB(newReader(t, tt.objs...)).Check(context.Background(), node)
			if err != nil {
				t.Fatal(err)
			}
			if g.Name != policy.GatePDB || g.Held != tt.held || g.Evidence[EvidencePDBs] != tt.pdbs {
				t.Errorf("gate %+v, want held=%v pdbs=%q", g, tt.held, tt.pdbs)
			}
			if !strings.Contains(g.Reason, tt.reason) {
				t.Errorf("reason %q lacks %q", g.Reason, tt.reason)
			}
			if tt.wantTime && !g.Since.Equal(since) {
				t.Errorf("since %s, want the DisruptionAllowed=False transition %s", g.Since, since)
			}
			d := policy.Decision{Gates: []policy.Gate{g}}
			if got := strings.Join(HeldPDBs(d), ","); got != tt.pdbs {
				t.Errorf("HeldPDBs %q, want %q", got, tt.pdbs)
			}
		})
	}
}

func TestPDBKey(t *testing.T) {
	if k := PDBKey("kafka", "kafka-pdb"); k != "pdb/kafka/kafka-pdb" {
		t.Errorf("PDBKey %q", k)
	}
}

func TestEvicted(t *testing.T) {
	notController := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "x", UID: "u"}}
	}
	rs := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "ReplicaSet", Name: "x", UID: "u", Controller: ptr.To(true)}}
	}
	failed := func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }
	for _, tt := range []struct {
		name string
		p    *corev1.Pod
		want bool
	}{
		{"plain", pod("a", "p", "n", nil), true},
		{"replicaset", pod("a", "p", "n", nil, rs), true},
		{"daemonset", pod("a", "p", "n", nil, daemonSetOwned), false},
		{"daemonset owner not controller", pod("a", "p", "n", nil, notController), true},
		{"mirror", pod("a", "p", "n", nil, mirror), false},
		{"succeeded", pod("a", "p", "n", nil, succeeded), false},
		{"failed", pod("a", "p", "n", nil, failed), false},
	} {
		if got := Evicted(tt.p); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestPDBReleased(t *testing.T) {
	zero, one := pdb("kafka", "p", app("kafka"), 0), pdb("kafka", "p", app("kafka"), 1)
	for _, tt := range []struct {
		name     string
		old, new *policyv1.PodDisruptionBudget
		want     bool
	}{
		{"recovers", zero, one, true},
		{"deleted", zero, nil, true},
		{"still zero", zero, zero, false},
		{"was allowing", one, zero, false},
		{"created", nil, one, false},
	} {
		if got := PDBReleased(tt.old, tt.new); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
