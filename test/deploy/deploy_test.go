// Package deploy_test checks the in-cluster manifests in deploy/: kustomize builds them, a real
// kube-apiserver with the Karpenter CRDs accepts every object (server-side apply, dry run), the
// RBAC grants what the router uses and nothing more, and the Deployment keeps its promises
// (two replicas, probes, hardening) that a careless edit could break.
package deploy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/health-router/health-router/test/harness"
)

// namespace is the kustomization's namespace, which the Terraform module's
// service_account_namespace defaults to as well.
const namespace = "health-router"

// fieldOwner is the field manager of every apply the test makes.
const fieldOwner = "deploy-test"

// deployDir is deploy/ at the root of the repository, found from this file.
func deployDir(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "deploy")
}

// build runs `kustomize build deploy/` and returns the objects.
func build(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), deployDir(t))
	if err != nil {
		t.Fatalf("kustomize build deploy/: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, r := range resMap.Resources() {
		// Through JSON, so that numbers are int64 as in every other Unstructured.
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			t.Fatalf("%s: %v", r.CurId(), err)
		}
		objs = append(objs, u)
	}
	return objs
}

// manifests is the built deploy/, decoded into typed objects.
type manifests struct {
	all                []*unstructured.Unstructured
	namespace          corev1.Namespace
	serviceAccount     corev1.ServiceAccount
	configMaps         []corev1.ConfigMap
	deployment         appsv1.Deployment
	pdb                policyv1.PodDisruptionBudget
	service            corev1.Service
	clusterRole        rbacv1.ClusterRole
	clusterRoleBinding rbacv1.ClusterRoleBinding
	role               rbacv1.Role
	roleBinding        rbacv1.RoleBinding
}

// decode builds deploy/ and decodes each object into its typed form. Exactly one object of
// each kind is expected (ConfigMaps aside); anything else is an error, so that an object
// added to deploy/ without a thought for this test is noticed.
func decode(t *testing.T) manifests {
	t.Helper()
	m := manifests{all: build(t)}
	seen := map[string]int{}
	for _, u := range m.all {
		kind := u.GetKind()
		seen[kind]++
		var into any
		switch kind {
		case "Namespace":
			into = &m.namespace
		case "ServiceAccount":
			into = &m.serviceAccount
		case "ConfigMap":
			m.configMaps = append(m.configMaps, corev1.ConfigMap{})
			into = &m.configMaps[len(m.configMaps)-1]
		case "Deployment":
			into = &m.deployment
		case "PodDisruptionBudget":
			into = &m.pdb
		case "Service":
			into = &m.service
		case "ClusterRole":
			into = &m.clusterRole
		case "ClusterRoleBinding":
			into = &m.clusterRoleBinding
		case "Role":
			into = &m.role
		case "RoleBinding":
			into = &m.roleBinding
		default:
			t.Fatalf("deploy/ builds a %s (%s) this test does not know: add its checks", kind, u.GetName())
		}
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
			t.Fatalf("%s %s: %v", kind, u.GetName(), err)
		}
	}
	for kind, n := range seen {
		if n > 1 && kind != "ConfigMap" {
			t.Fatalf("deploy/ builds %d objects of kind %s, want 1", n, kind)
		}
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		if seen[kind] == 0 {
			t.Fatalf("deploy/ builds no %s", kind)
		}
	}
	return m
}

// TestAgainstAPIServer runs deploy/ past a real kube-apiserver with the Karpenter CRDs: first
// every object in a server-side dry run, then the RBAC for real, asking the server's
// authorizer what the router may do.
func TestAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd (envtest)")
	}
	objs := build(t) // not decoded here, so that the server is the one to judge them
	cfg := harness.KubeAPIServer(t)
	warnings := &warningRecorder{}
	cfg.WarningHandlerWithContext = warnings
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(objs, func(u *unstructured.Unstructured) bool { return u.GetKind() == "Namespace" })
	if i < 0 {
		t.Fatal("deploy/ builds no Namespace")
	}
	if err := c.Create(t.Context(), objs[i].DeepCopy(), client.FieldOwner(fieldOwner)); err != nil {
		t.Fatalf("creating Namespace %s: %v", objs[i].GetName(), err)
	}
	t.Run("dry-run apply", func(t *testing.T) { dryRunApply(t, c, objs, warnings) })
	t.Run("RBAC authorizes", func(t *testing.T) { rbacAuthorizes(t, c, decode(t)) })
}

// dryRunApply applies every object but the Namespace with server-side apply in dry-run mode:
// the server validates each one fully (schema, unknown fields, defaults, admission) without
// storing it. The Namespace enforces and warns on the "restricted" Pod Security Standard, so a
// pod template that breaks it shows as a warning, which fails the test.
func dryRunApply(t *testing.T, c client.Client, objs []*unstructured.Unstructured, warnings *warningRecorder) {
	ctx := t.Context()
	applied := 0
	var deployment *unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			continue
		}
		if u.GetKind() == "Deployment" {
			deployment = u
		}
		name := fmt.Sprintf("%s %s", u.GetKind(), u.GetName())
		obj := u.DeepCopy()
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.DryRunAll, client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			t.Errorf("server-side apply (dry run) of %s: %v", name, err)
			continue
		}
		// The answer is the object as the server would store it: ours, with a UID and our
		// field manager.
		if obj.GetName() != u.GetName() || obj.GetUID() == "" {
			t.Errorf("%s: dry-run answer has name %q, uid %q", name, obj.GetName(), obj.GetUID())
		}
		if !slices.ContainsFunc(obj.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool { return f.Manager == fieldOwner }) {
			t.Errorf("%s: dry-run answer is not managed by %s", name, fieldOwner)
		}
		applied++
	}
	if want := len(objs) - 1; applied != want {
		t.Errorf("applied %d objects, want %d", applied, want)
	}
	if w := warnings.all(); len(w) > 0 {
		t.Errorf("the API server warned:\n  %s", strings.Join(w, "\n  "))
	}
	// A dry run stores nothing.
	if deployment == nil {
		t.Fatal("deploy/ builds no Deployment")
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKeyFromObject(deployment), &d); !apierrors.IsNotFound(err) {
		t.Errorf("after the dry run, getting Deployment %s: %v, want NotFound", deployment.GetName(), err)
	}
}

// rbacAuthorizes applies the ServiceAccount and the RBAC objects for real, then asks the API
// server's RBAC authorizer (SubjectAccessReview) what the router's ServiceAccount may do:
// everything the router needs, and nothing next to it.
func rbacAuthorizes(t *testing.T, c client.Client, m manifests) {
	ctx := t.Context()
	for _, u := range m.all {
		switch u.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
				t.Fatalf("applying %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		}
	}
	user := fmt.Sprintf("system:serviceaccount:%s:%s", m.deployment.Namespace, m.deployment.Spec.Template.Spec.ServiceAccountName)

	// resource may name a subresource: pods/eviction.
	type access struct {
		verb, group, resource, namespace string
	}
	var allowed []access
	for gr, verbs := range clusterRoleAllowlist {
		for _, v := range verbs {
			// Cluster-wide, and in "default", where Events of cluster-scoped objects go.
			allowed = append(allowed, access{v, gr.group, gr.resource, ""}, access{v, gr.group, gr.resource, "default"})
		}
	}
	for _, v := range leaseVerbs {
		allowed = append(allowed, access{v, "coordination.k8s.io", "leases", namespace})
	}
	denied := []access{
		{"get", "", "secrets", namespace},
		{"list", "", "secrets", ""},
		{"delete", "", "pods", ""},
		{"create", "", "pods/eviction", "default"},
		{"patch", "", "nodes", ""},
		{"delete", "", "nodes", ""},
		{"update", "", "nodes/status", ""},
		{"create", "karpenter.sh", "nodeclaims", ""},
		{"update", "karpenter.sh", "nodeclaims", ""},
		{"patch", "karpenter.sh", "nodeclaims/status", ""},
		{"patch", "karpenter.sh", "nodepools", ""},
		{"update", "karpenter.k8s.aws", "ec2nodeclasses", ""},
		{"delete", "", "events", "default"},
		{"create", "coordination.k8s.io", "leases", "kube-system"},
		{"delete", "coordination.k8s.io", "leases", namespace},
		{"escalate", "rbac.authorization.k8s.io", "clusterroles", ""},
	}
	check := func(a access, want bool) {
		res, sub, _ := strings.Cut(a.resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: res, Subresource: sub, Namespace: a.namespace,
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatalf("SubjectAccessReview %+v: %v", a, err)
		}
		if sar.Status.Allowed != want {
			t.Errorf("%s may %s %s.%s in %q: %v, want %v (%s)", user, a.verb, a.resource, a.group, a.namespace, sar.Status.Allowed, want, sar.Status.Reason)
		}
	}
	for _, a := range allowed {
		check(a, true)
	}
	for _, a := range denied {
		check(a, false)
	}
}

// warningRecorder keeps the API server's warnings.
type warningRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (w *warningRecorder) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

func TestNamespaced(t *testing.T) {
	m := decode(t)
	if m.namespace.Name != namespace {
		t.Errorf("Namespace %q, want %q", m.namespace.Name, namespace)
	}
	for _, u := range m.all {
		switch u.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding":
			if u.GetNamespace() != "" {
				t.Errorf("cluster-scoped %s %s has namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
			}
		default:
			if u.GetNamespace() != namespace {
				t.Errorf("%s %s in namespace %q, want %q", u.GetKind(), u.GetName(), u.GetNamespace(), namespace)
			}
		}
	}
	for _, mode := range []string{"enforce", "warn"} {
		if got := m.namespace.Labels["pod-security.kubernetes.io/"+mode]; got != "restricted" {
			t.Errorf("Namespace label pod-security.kubernetes.io/%s = %q, want restricted", mode, got)
		}
	}
}

func TestDeployment(t *testing.T) {
	m := decode(t)
	d := m.deployment
	spec := d.Spec.Template.Spec

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2 (a leader and a standby)", d.Spec.Replicas)
	}
	if spec.ServiceAccountName != m.serviceAccount.Name {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", spec.ServiceAccountName, m.serviceAccount.Name)
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds != 60 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 60", spec.TerminationGracePeriodSeconds)
	}
	if spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName = %q", spec.PriorityClassName)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	ctr := spec.Containers[0]
	if ctr.Image != "ghcr.io/health-router/health-router:v0.1.0" {
		t.Errorf("image %q", ctr.Image)
	}
	if !slices.Equal(ctr.Args, []string{"run"}) || len(ctr.Command) != 0 {
		t.Errorf("command %q args %q, want the image's entrypoint with args [run]", ctr.Command, ctr.Args)
	}

	// Ports and probes.
	if port(t, ctr, intstr.FromString("metrics")) != 8080 {
		t.Errorf("no container port named metrics on 8080: %+v", ctr.Ports)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", ctr.LivenessProbe, "/healthz"}, {"readinessProbe", ctr.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe", p.name)
			continue
		}
		if p.probe.HTTPGet.Path != p.path || port(t, ctr, p.probe.HTTPGet.Port) != 8081 {
			t.Errorf("%s: GET %s on port %s, want %s on 8081", p.name, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path)
		}
	}

	// Settings: the generated ConfigMap exists and sets every required variable; the
	// leader election namespace is the pod's own.
	var cmNames []string
	for _, ef := range ctr.EnvFrom {
		if ef.ConfigMapRef != nil {
			cmNames = append(cmNames, ef.ConfigMapRef.Name)
		}
	}
	if len(cmNames) != 1 {
		t.Fatalf("envFrom ConfigMaps %q, want one", cmNames)
	}
	i := slices.IndexFunc(m.configMaps, func(cm corev1.ConfigMap) bool { return cm.Name == cmNames[0] })
	if i < 0 {
		t.Fatalf("envFrom names ConfigMap %q, which deploy/ does not build", cmNames[0])
	}
	if !strings.HasPrefix(cmNames[0], "health-router") {
		t.Errorf("ConfigMap %q, want health-router (with kustomize's hash suffix)", cmNames[0])
	}
	for _, key := range []string{"HEALTH_ROUTER_QUEUE_URL", "HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL", "HEALTH_ROUTER_KARPENTER_QUEUE_URL", "HEALTH_ROUTER_REGION", "HEALTH_ROUTER_CLUSTER_NAME", "HEALTH_ROUTER_CLOUDWATCH_METRICS"} {
		if m.configMaps[i].Data[key] == "" {
			t.Errorf("ConfigMap %s sets no %s", cmNames[0], key)
		}
	}
	j := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "HEALTH_ROUTER_LEADER_ELECTION_NAMESPACE" })
	if j < 0 || ctr.Env[j].ValueFrom == nil || ctr.Env[j].ValueFrom.FieldRef == nil || ctr.Env[j].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("HEALTH_ROUTER_LEADER_ELECTION_NAMESPACE is not the downward API metadata.namespace: %+v", ctr.Env)
	}

	// Resources: a memory limit, no CPU limit (throttling a 50m process helps nobody).
	for _, r := range []struct {
		name string
		list corev1.ResourceList
		res  corev1.ResourceName
		want string
	}{
		{"requests", ctr.Resources.Requests, corev1.ResourceCPU, "50m"},
		{"requests", ctr.Resources.Requests, corev1.ResourceMemory, "64Mi"},
		{"limits", ctr.Resources.Limits, corev1.ResourceMemory, "256Mi"},
	} {
		got, ok := r.list[r.res]
		if want := resource.MustParse(r.want); !ok || got.Cmp(want) != 0 {
			t.Errorf("resources.%s.%s = %s, want %s", r.name, r.res, got.String(), r.want)
		}
	}
	if _, ok := ctr.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("a CPU limit is set")
	}

	// Hardening.
	psc, csc := spec.SecurityContext, ctr.SecurityContext
	if psc == nil || csc == nil {
		t.Fatal("pod or container securityContext missing")
	}
	nonRoot := (csc.RunAsNonRoot != nil && *csc.RunAsNonRoot) || (psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
	seccomp := (csc.SeccompProfile != nil && csc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault) ||
		(psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault)
	switch {
	case !nonRoot:
		t.Error("runAsNonRoot is not set")
	case !seccomp:
		t.Error("seccompProfile is not RuntimeDefault")
	case csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem:
		t.Error("readOnlyRootFilesystem is not set")
	case csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation is not false")
	case csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v, want drop [ALL] and add nothing", csc.Capabilities)
	}

	// Never both replicas on one node.
	if !spreadsOverNodes(spec, d.Spec.Template.Labels) {
		t.Error("no required podAntiAffinity or DoNotSchedule topologySpreadConstraint on kubernetes.io/hostname selecting the router's pods")
	}
}

// port resolves a probe or Service port, by number or by name, to the container's port.
func port(t *testing.T, ctr corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range ctr.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	return 0
}

// spreadsOverNodes says whether the scheduler must place the pods with labels podLabels on
// different nodes.
func spreadsOverNodes(spec corev1.PodSpec, podLabels map[string]string) bool {
	selects := func(ls *metav1.LabelSelector) bool {
		sel, err := metav1.LabelSelectorAsSelector(ls)
		return err == nil && ls != nil && !sel.Empty() && sel.Matches(labels.Set(podLabels))
	}
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if term.TopologyKey == corev1.LabelHostname && selects(term.LabelSelector) {
				return true
			}
		}
	}
	for _, c := range spec.TopologySpreadConstraints {
		if c.TopologyKey == corev1.LabelHostname && c.WhenUnsatisfiable == corev1.DoNotSchedule && c.MaxSkew == 1 && selects(c.LabelSelector) {
			return true
		}
	}
	return false
}

func TestSelectors(t *testing.T) {
	m := decode(t)
	podLabels := labels.Set(m.deployment.Spec.Template.Labels)

	sel, err := metav1.LabelSelectorAsSelector(m.deployment.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v (%v)", m.deployment.Spec.Selector, podLabels, err)
	}

	if m.pdb.Spec.MinAvailable == nil || *m.pdb.Spec.MinAvailable != intstr.FromInt32(1) || m.pdb.Spec.MaxUnavailable != nil {
		t.Errorf("PodDisruptionBudget minAvailable %v maxUnavailable %v, want minAvailable 1", m.pdb.Spec.MinAvailable, m.pdb.Spec.MaxUnavailable)
	}
	sel, err = metav1.LabelSelectorAsSelector(m.pdb.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods %v (%v)", m.pdb.Spec.Selector, podLabels, err)
	}

	if len(m.service.Spec.Selector) == 0 || !labels.SelectorFromSet(m.service.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select the pods %v", m.service.Spec.Selector, podLabels)
	}
	if len(m.service.Spec.Ports) != 1 {
		t.Fatalf("Service ports %+v, want one", m.service.Spec.Ports)
	}
	sp := m.service.Spec.Ports[0]
	if sp.Name != "metrics" || sp.Port != 8080 || port(t, m.deployment.Spec.Template.Spec.Containers[0], sp.TargetPort) != 8080 {
		t.Errorf("Service port %+v, want metrics 8080 to the container's 8080", sp)
	}
}

// groupResource is an API group and resource, "" being the core group.
type groupResource struct{ group, resource string }

// clusterRoleAllowlist is everything the ClusterRole may grant: the resources the router
// touches, with the verbs it uses on each. deploy/README.md explains each.
var clusterRoleAllowlist = map[groupResource][]string{
	{"", "nodes"}:                           {"get", "list", "watch"},
	{"karpenter.sh", "nodeclaims"}:          {"get", "list", "watch", "patch", "delete"},
	{"karpenter.sh", "nodepools"}:           {"get", "list", "watch"},
	{"karpenter.k8s.aws", "ec2nodeclasses"}: {"get", "list", "watch"},
	{"", "pods"}:                            {"get", "list", "watch"},
	{"policy", "poddisruptionbudgets"}:      {"get", "list", "watch"},
	{"", "events"}:                          {"create", "patch"},
	{"events.k8s.io", "events"}:             {"create", "patch"},
}

// leaseVerbs are what controller-runtime's leader election does with its Lease.
var leaseVerbs = []string{"get", "list", "watch", "create", "update", "patch"}

// ruleProblems lists what rules grant beyond allow (wildcards included), and what in allow
// they do not grant.
func ruleProblems(rules []rbacv1.PolicyRule, allow map[groupResource][]string) []string {
	var problems []string
	granted := map[groupResource]map[string]bool{}
	for i, r := range rules {
		if len(r.NonResourceURLs) > 0 {
			problems = append(problems, fmt.Sprintf("rule %d grants nonResourceURLs %q", i, r.NonResourceURLs))
		}
		if len(r.ResourceNames) > 0 {
			problems = append(problems, fmt.Sprintf("rule %d is limited to resourceNames %q: the allowlist does not expect that", i, r.ResourceNames))
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					gr := groupResource{g, res}
					if g == "*" || v == "*" || strings.Contains(res, "*") {
						problems = append(problems, fmt.Sprintf("rule %d: wildcard: %s %s.%s", i, v, res, g))
						continue
					}
					if !slices.Contains(allow[gr], v) {
						problems = append(problems, fmt.Sprintf("rule %d grants %s on %s.%s, outside the allowlist", i, v, res, g))
						continue
					}
					if granted[gr] == nil {
						granted[gr] = map[string]bool{}
					}
					granted[gr][v] = true
				}
			}
		}
	}
	for gr, verbs := range allow {
		for _, v := range verbs {
			if !granted[gr][v] {
				problems = append(problems, fmt.Sprintf("%s on %s.%s is not granted: the router needs it", v, gr.resource, gr.group))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func TestRuleProblems(t *testing.T) {
	allow := map[groupResource][]string{{"", "nodes"}: {"get", "list"}}
	for _, tt := range []struct {
		name  string
		rules []rbacv1.PolicyRule
		want  string // a substring of a problem; "" for none
	}{
		{"exact", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}}}, ""},
		{"split over rules", []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}},
		}, ""},
		{"wildcard verb", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"*"}}}, "wildcard"},
		{"wildcard resource", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"*"}, Verbs: []string{"get"}}}, "wildcard"},
		{"wildcard group", []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}, "wildcard"},
		{"extra verb", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "delete"}}}, "delete on nodes."},
		{"other resource", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes", "secrets"}, Verbs: []string{"get", "list"}}}, "secrets"},
		{"same resource, other group", []rbacv1.PolicyRule{{APIGroups: []string{"", "metrics.k8s.io"}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}}}, "metrics.k8s.io"},
		{"missing verb", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}, "list on nodes. is not granted"},
		{"non-resource URL", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}}, {NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}, "nonResourceURLs"},
	} {
		got := ruleProblems(tt.rules, allow)
		if tt.want == "" {
			if len(got) > 0 {
				t.Errorf("%s: problems %q, want none", tt.name, got)
			}
			continue
		}
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, tt.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", tt.name, got, tt.want)
		}
	}
}

func TestRBAC(t *testing.T) {
	m := decode(t)
	for _, p := range ruleProblems(m.clusterRole.Rules, clusterRoleAllowlist) {
		t.Errorf("ClusterRole %s: %s", m.clusterRole.Name, p)
	}
	for _, p := range ruleProblems(m.role.Rules, map[groupResource][]string{{"coordination.k8s.io", "leases"}: leaseVerbs}) {
		t.Errorf("Role %s (leader election): %s", m.role.Name, p)
	}
	if m.clusterRole.AggregationRule != nil {
		t.Errorf("ClusterRole %s aggregates other roles", m.clusterRole.Name)
	}

	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: m.deployment.Spec.Template.Spec.ServiceAccountName, Namespace: m.deployment.Namespace}
	if sa.Name != m.serviceAccount.Name || sa.Namespace != m.serviceAccount.Namespace {
		t.Errorf("Deployment runs as %s/%s, ServiceAccount is %s/%s", sa.Namespace, sa.Name, m.serviceAccount.Namespace, m.serviceAccount.Name)
	}
	for _, b := range []struct {
		what     string
		roleRef  rbacv1.RoleRef
		subjects []rbacv1.Subject
		kind     string
		role     string
	}{
		{"ClusterRoleBinding " + m.clusterRoleBinding.Name, m.clusterRoleBinding.RoleRef, m.clusterRoleBinding.Subjects, "ClusterRole", m.clusterRole.Name},
		{"RoleBinding " + m.roleBinding.Name, m.roleBinding.RoleRef, m.roleBinding.Subjects, "Role", m.role.Name},
	} {
		if b.roleRef.APIGroup != rbacv1.GroupName || b.roleRef.Kind != b.kind || b.roleRef.Name != b.role {
			t.Errorf("%s: roleRef %+v, want %s %s", b.what, b.roleRef, b.kind, b.role)
		}
		if len(b.subjects) != 1 || b.subjects[0] != sa {
			t.Errorf("%s: subjects %+v, want only %+v", b.what, b.subjects, sa)
		}
	}
	if m.roleBinding.Namespace != m.role.Namespace || m.role.Namespace != m.deployment.Namespace {
		t.Errorf("Role in %q, RoleBinding in %q, Deployment in %q: leader election needs one namespace", m.role.Namespace, m.roleBinding.Namespace, m.deployment.Namespace)
	}
}
