package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/test/harness"
)

// vapAPI is the API the chart's admission policies need; `helm install` learns it from the
// server, `helm template` is told.
const vapAPI = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

// admissionObjects renders the chart's ValidatingAdmissionPolicies and their bindings.
func admissionObjects(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, u := range mustTemplate(t, append([]string{"-f", ciValues(t, "default"), "--api-versions", vapAPI}, args...)...) {
		if strings.HasPrefix(u.GetKind(), "ValidatingAdmissionPolicy") {
			out = append(out, u)
		}
	}
	return out
}

// TestAdmissionPolicyRendering: both policies are on by default where the API server serves
// the API (issue 38 item 5: the router-writes guard was off, and refused the reboot in place's
// do-not-repair), off where it does not or when turned off.
func TestAdmissionPolicyRendering(t *testing.T) {
	kinds := func(objs []*unstructured.Unstructured) []string {
		var names []string
		for _, u := range objs {
			names = append(names, u.GetKind()+"/"+u.GetName())
		}
		slices.Sort(names)
		return names
	}
	pools := []string{"ValidatingAdmissionPolicy/health-router-nodepool-annotations", "ValidatingAdmissionPolicyBinding/health-router-nodepool-annotations"}
	writes := []string{"ValidatingAdmissionPolicy/health-router-router-writes", "ValidatingAdmissionPolicyBinding/health-router-router-writes"}
	sorted := func(names ...[]string) []string { all := slices.Concat(names...); slices.Sort(all); return all }
	for _, tc := range []struct {
		name string
		set  []string
		want []string
	}{
		{"default", nil, sorted(pools, writes)},
		{"NodePool policy off", []string{"--set", "admissionPolicies.nodePoolAnnotations.enabled=false"}, writes},
		{"guard off", []string{"--set", "admissionPolicies.routerWrites.enabled=false"}, pools},
		{"both off", []string{"--set", "admissionPolicies.nodePoolAnnotations.enabled=false", "--set", "admissionPolicies.routerWrites.enabled=false"}, nil},
		{"the reboot in place on", []string{"--set", "settings.rebootInPlace=true"}, sorted(pools, writes)},
	} {
		if got := kinds(admissionObjects(t, tc.set...)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, u := range build(t) { // no --api-versions: an API server without the API
		if strings.HasPrefix(u.GetKind(), "ValidatingAdmissionPolicy") {
			t.Errorf("rendered without the API: %s %s", u.GetKind(), u.GetName())
		}
	}
}

// testNodePool is a NodePool the Karpenter CRD accepts, with annotations.
func testNodePool(name string, annotations map[string]string) *karpv1.NodePool {
	return &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
		}}},
	}
}

// annotate is `kubectl annotate nodepool <name> k=v`: a merge patch of the annotations.
func annotate(ctx context.Context, c client.Client, name string, kv map[string]string) error {
	ann := map[string]any{}
	for k, v := range kv {
		ann[k] = v
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": ann}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return c.Patch(ctx, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch("application/merge-patch+json", raw))
}

// installAdmission creates the objects and waits until the policy is enforced: bad (a
// write the policy refuses) is refused. The API server compiles a new policy a moment after it
// is created.
func installAdmission(t *testing.T, c client.Client, objs []*unstructured.Unstructured, bad func() error) {
	t.Helper()
	for _, u := range objs {
		if err := c.Create(t.Context(), u.DeepCopy()); err != nil {
			t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return bad() != nil, nil
	})
	if err != nil {
		t.Fatalf("the policy is not enforced 30s after it was created: %v", err)
	}
}

// TestAdmissionPolicies runs the chart's ValidatingAdmissionPolicies on a real kube-apiserver.
func TestAdmissionPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd (envtest)")
	}
	ctrl.SetLogger(logr.Discard())
	cfg := harness.KubeAPIServer(t)
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("nodepool annotations", func(t *testing.T) { nodePoolAnnotations(t, c) })
	t.Run("router writes", func(t *testing.T) { routerWrites(t, cfg, c) })
}

// nodePoolAnnotations: the NodePool policy refuses exactly the annotations the router's parser
// ignores (policy.Examples), with a message that names the key.
func nodePoolAnnotations(t *testing.T, c client.Client) {
	ctx := t.Context()
	bad := map[string]string{policy.AnnotationMaxConcurrentDrains: "12.5%"}
	// Before: the API server takes anything, and the router finds out later.
	if err := c.Create(ctx, testNodePool("before", map[string]string{policy.AnnotationAction: "defer"})); err != nil {
		t.Fatal(err)
	}
	if err := annotate(ctx, c, "before", bad); err != nil {
		t.Fatalf("without the policy, max-concurrent-drains=12.5%% is refused already: %v", err)
	}
	// The NodePool policy alone: the router-writes guard (on by default) is the next subtest's.
	installAdmission(t, c, admissionObjects(t, "--set", "admissionPolicies.routerWrites.enabled=false"), func() error {
		return c.Create(ctx, testNodePool("probe", bad), client.DryRunAll)
	})

	t.Run("kubectl annotate", func(t *testing.T) {
		if err := c.Create(ctx, testNodePool("after", map[string]string{policy.AnnotationAction: "defer"})); err != nil {
			t.Fatal(err)
		}
		err := annotate(ctx, c, "after", bad)
		if err == nil || !strings.Contains(err.Error(), policy.AnnotationMaxConcurrentDrains) || !strings.Contains(err.Error(), "want a whole number") {
			t.Fatalf("max-concurrent-drains=12.5%%: %v, want refused, naming the key and what it wants", err)
		}
		t.Logf("refused: %v", err)
		if err := annotate(ctx, c, "after", map[string]string{policy.AnnotationMaxConcurrentDrains: "12%"}); err != nil {
			t.Errorf("max-concurrent-drains=12%%: %v", err)
		}
	})
	t.Run("a pool annotated before takes other writes", func(t *testing.T) {
		// Karpenter writes its hash annotations on every NodePool: an invalid value written
		// before the policy must not lock the pool against them.
		if err := annotate(ctx, c, "before", map[string]string{"karpenter.sh/nodepool-hash": "123"}); err != nil {
			t.Errorf("an unrelated write to a pool annotated before the policy: %v", err)
		}
		if err := annotate(ctx, c, "before", map[string]string{policy.AnnotationMaxConcurrentDrains: "13.5%"}); err == nil {
			t.Error("changing the invalid value to another invalid one is admitted")
		}
		if err := annotate(ctx, c, "before", map[string]string{policy.AnnotationMaxConcurrentDrains: "2"}); err != nil {
			t.Errorf("fixing the value: %v", err)
		}
	})
	t.Run("removing half of the window", func(t *testing.T) {
		window := map[string]string{policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h"}
		if err := c.Create(ctx, testNodePool("window", window)); err != nil {
			t.Fatal(err)
		}
		// A merge patch with null removes the key, as kubectl annotate key- does.
		patch := []byte(`{"metadata":{"annotations":{"` + policy.AnnotationWindowDuration + `":null}}}`)
		err := c.Patch(ctx, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "window"}}, client.RawPatch("application/merge-patch+json", patch))
		if err == nil || !strings.Contains(err.Error(), "set both, or neither") {
			t.Errorf("removing window-duration alone: %v, want refused", err)
		}
	})
	t.Run("agrees with the router's parser", func(t *testing.T) {
		var refused, admitted int
		for i, ann := range policy.Examples() {
			problems := policy.FromAnnotations(ann).Problems
			err := c.Create(ctx, testNodePool(fmt.Sprintf("example-%d", i), ann), client.DryRunAll)
			if err != nil {
				refused++
				t.Logf("%v: %v", ann, err)
			} else {
				admitted++
			}
			switch {
			case len(problems) == 0 && err != nil:
				t.Errorf("%v: the router takes it, the API server refuses it: %v", ann, err)
			case len(problems) != 0 && err == nil:
				t.Errorf("%v: the router ignores it (%q), the API server admits it", ann, problems)
			case err != nil && !slices.ContainsFunc(slices.Collect(maps.Keys(ann)), func(k string) bool { return strings.Contains(err.Error(), k) }):
				t.Errorf("%v: the refusal names none of the keys: %v", ann, err)
			}
		}
		if refused < 40 || admitted < 40 {
			t.Errorf("%d examples refused, %d admitted: the table no longer tries both sides", refused, admitted)
		}
	})
}

// routerUser is the username of the router's ServiceAccount in the default render.
const routerUser = "system:serviceaccount:" + namespace + ":" + release

// routerWrites: with the guard on, the router's ServiceAccount may write its own marks on a
// Node and a NodeClaim and nothing else; another user is not affected.
func routerWrites(t *testing.T, cfg *rest.Config, admin client.Client) {
	ctx := t.Context()
	// RBAC lets the ServiceAccount update both, so that only the policy stands in the way.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "router-writes-test"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch", "update"}},
		{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodeclaims"}, Verbs: []string{"get", "patch", "update"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "router-writes-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: release}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1.ec2.internal", Labels: map[string]string{"team": "kafka"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/i-0123456789abcdef0"}}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-abc12", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"kafka"}}},
		}}
	for _, o := range []client.Object{role, binding, node, claim} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("creating %T: %v", o, err)
		}
	}
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: routerUser}
	router, err := client.New(rc, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// write reads obj afresh and patches it as c with change applied, as the router does.
	write := func(c client.Client, obj client.Object, change func()) error {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		before := obj.DeepCopyObject().(client.Object)
		change()
		return c.Patch(ctx, obj, client.MergeFrom(before))
	}
	noExecute := func() {
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "example.com/evict", Effect: corev1.TaintEffectNoExecute})
	}

	var objs []*unstructured.Unstructured
	for _, u := range admissionObjects(t) { // on by default
		if strings.HasSuffix(u.GetName(), "-router-writes") {
			objs = append(objs, u)
		}
	}
	if len(objs) != 2 {
		t.Fatalf("the chart renders %d objects of the guard, want 2", len(objs))
	}
	// Before the guard, the router's token can taint a Node NoExecute (RBAC grants patch).
	if err := write(router, node, noExecute); err != nil {
		t.Fatalf("before the guard: %v", err)
	}
	if err := write(admin, node, func() { node.Spec.Taints = nil }); err != nil {
		t.Fatal(err)
	}
	installAdmission(t, admin, objs, func() error {
		err := write(router, node, noExecute)
		if err == nil {
			_ = write(admin, node, func() { node.Spec.Taints = nil })
		}
		return err
	})

	for _, tt := range []struct {
		name   string
		obj    client.Object
		change func()
		allow  bool
	}{
		// The marks as router/upcoming writes them (label, annotation, PreferNoSchedule taint).
		{"the router's marks on a Node", node, func() {
			upcoming.Apply(node, upcoming.Marks{At: "1796000000", Annotation: `{"kind":"scheduled-change"}`, Taint: "scheduled-change"})
		}, true},
		// A cordon and do-not-disrupt, as router/inplace and router/nodedrain write them.
		{"a cordon and do-not-disrupt", node, func() {
			if node.Annotations == nil {
				node.Annotations = map[string]string{}
			}
			node.Annotations[karpv1.DoNotDisruptAnnotationKey] = "true"
			node.Annotations["healthrouter.io/node-drain"] = "{}"
			node.Spec.Unschedulable = true
		}, true},
		{"removing them again", node, func() {
			upcoming.Apply(node, upcoming.Marks{})
			node.Annotations = nil
			node.Spec.Unschedulable = false
		}, true},
		{"a NoExecute taint", node, noExecute, false},
		{"its own taint key, NoExecute", node, func() {
			node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: upcoming.TaintKey, Effect: corev1.TaintEffectNoExecute})
		}, false},
		{"a NoSchedule taint", node, func() {
			node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule})
		}, false},
		{"another label", node, func() { node.Labels["team"] = "payments" }, false},
		{"removing another label", node, func() { delete(node.Labels, "team") }, false},
		{"another annotation", node, func() { node.Annotations = map[string]string{"example.com/owner": "me"} }, false},
		{"a finalizer", node, func() { node.Finalizers = append(node.Finalizers, "example.com/hold") }, false},
		// The reboot in place's vetoes (router/inplace), on the NodeClaim and on its Node: the
		// guard refused do-not-repair before, so no one running the reboot in place could turn
		// it on (issue 38 item 5).
		{"the reboot in place's vetoes on a NodeClaim", claim, func() {
			claim.Annotations = map[string]string{karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}
		}, true},
		{"the reboot in place's vetoes on a Node", node, func() {
			node.Annotations = map[string]string{karpv1.DoNotDisruptAnnotationKey: "true", karpv1.DoNotRepairAnnotationKey: "true"}
			node.Spec.Unschedulable = true
		}, true},
		{"undoing them", node, func() {
			node.Annotations = nil
			node.Spec.Unschedulable = false
		}, true},
		{"the router's record on a NodeClaim", claim, func() {
			claim.Annotations = map[string]string{"healthrouter.io/deferred": "{}", "karpenter.sh/do-not-disrupt": "true"}
		}, true},
		{"a NodeClaim's label", claim, func() { claim.Labels[karpv1.NodePoolLabelKey] = "other" }, false},
		// A NodeClaim's spec is immutable (Karpenter's CRD): no test of the guard's spec rule there.
		{"a NodeClaim's annotation", claim, func() { claim.Annotations["karpenter.sh/nodepool-hash"] = "0" }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := write(router, tt.obj, tt.change)
			switch {
			case tt.allow && err != nil:
				t.Errorf("refused: %v", err)
			case !tt.allow && err == nil:
				t.Error("admitted")
			case !tt.allow && !strings.Contains(err.Error(), "health-router ServiceAccount may"):
				t.Errorf("refused, but not by the guard: %v", err)
			case err != nil:
				t.Logf("refused: %v", err)
			}
		})
	}
	t.Run("removing a stray taint of its key", func(t *testing.T) {
		// Someone else put healthrouter.io/maintenance-upcoming on with another effect: the
		// router removes it (upcoming.Apply), and may.
		if err := write(admin, node, func() {
			node.Spec.Taints = []corev1.Taint{{Key: upcoming.TaintKey, Value: "x", Effect: corev1.TaintEffectNoExecute}}
		}); err != nil {
			t.Fatal(err)
		}
		if err := write(router, node, func() {
			if !upcoming.Apply(node, upcoming.Marks{}) {
				t.Error("upcoming.Apply leaves the stray taint")
			}
		}); err != nil {
			t.Errorf("refused: %v", err)
		}
	})
	t.Run("another user is not affected", func(t *testing.T) {
		if err := write(admin, node, noExecute); err != nil {
			t.Errorf("the admin's NoExecute taint: %v", err)
		}
		if err := write(admin, node, func() { node.Labels["team"] = "payments" }); err != nil {
			t.Errorf("the admin's label: %v", err)
		}
	})
}
