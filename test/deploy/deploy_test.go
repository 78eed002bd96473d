// Package deploy_test checks the Helm chart in deploy/charts/health-router with the real helm
// (built by test/tools/helm-bin.sh; HELM_BIN): `helm lint --strict`, `helm template` over the
// chart-testing values sets in ci/, the schema's refusals, and, against a real kube-apiserver
// with the Karpenter CRDs, a server-side dry run of every object and `helm install`, `upgrade`
// and `uninstall`, with the installed RBAC checked by SubjectAccessReviews. The Deployment's
// promises (two replicas, probes, hardening) that a careless edit could break are checked on
// the rendered objects.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"

	"github.com/health-router/health-router/test/harness"
)

// namespace is the release's namespace, which the Terraform module's
// service_account_namespace defaults to as well.
const namespace = "health-router"

// release is the release name of every render and install: the README's.
const release = "health-router"

// fieldOwner is the field manager of every apply the test makes.
const fieldOwner = "deploy-test"

// repoRoot is the root of the repository, found from this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// chartDir is the chart.
func chartDir(t *testing.T) string {
	return filepath.Join(repoRoot(t), "deploy", "charts", "health-router")
}

// ciValues is a chart-testing values file of the chart (ci/<name>-values.yaml).
func ciValues(t *testing.T, name string) string {
	return filepath.Join(chartDir(t), "ci", name+"-values.yaml")
}

var helmBin struct {
	once sync.Once
	path string
	err  error
}

// helm returns the helm binary: HELM_BIN (set by `make test`), or the one
// test/tools/helm-bin.sh builds and caches. No helm fails the test: it is never skipped.
func helmPath(t *testing.T) string {
	t.Helper()
	helmBin.once.Do(func() {
		if p := os.Getenv("HELM_BIN"); p != "" {
			helmBin.path = p
			return
		}
		out, err := exec.Command(filepath.Join(repoRoot(t), "test", "tools", "helm-bin.sh")).Output()
		if err != nil {
			helmBin.err = fmt.Errorf("HELM_BIN is not set and test/tools/helm-bin.sh failed: %w", err)
			return
		}
		helmBin.path = strings.TrimSpace(string(out))
	})
	if helmBin.err != nil {
		t.Fatal(helmBin.err)
	}
	if fi, err := os.Stat(helmBin.path); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("helm %q is not an executable (HELM_BIN, or test/tools/helm-bin.sh): %v", helmBin.path, err)
	}
	return helmBin.path
}

// runHelm runs helm with args and returns its stdout; a failure is returned with stderr.
func runHelm(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helmPath(t), args...)
	cmd.Dir = repoRoot(t)
	// helm's own state (repositories, cache) stays in the test's directory.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), stderr.String(), err
}

// template runs `helm template` of the chart with extra arguments (-f, --set).
func template(t *testing.T, args ...string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, _, err := runHelm(t, nil, append([]string{"template", release, chartDir(t), "--namespace", namespace}, args...)...)
	if err != nil {
		return nil, err
	}
	return parseObjects(out)
}

// mustTemplate is template, failing the test on an error.
func mustTemplate(t *testing.T, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := template(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// parseObjects decodes a multi-document YAML stream, skipping empty documents.
func parseObjects(stream string) ([]*unstructured.Unstructured, error) {
	dec := k8syaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
}

// build renders the chart with the default values and the two required settings.
func build(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return mustTemplate(t, "-f", ciValues(t, "default"))
}

// manifests is the rendered chart, decoded into typed objects.
type manifests struct {
	all                []*unstructured.Unstructured
	serviceAccount     corev1.ServiceAccount
	deployment         appsv1.Deployment
	pdb                policyv1.PodDisruptionBudget
	service            corev1.Service
	clusterRole        rbacv1.ClusterRole
	recordsView        *rbacv1.ClusterRole
	crd                *unstructured.Unstructured
	clusterRoleBinding rbacv1.ClusterRoleBinding
	role               rbacv1.Role
	roleBinding        rbacv1.RoleBinding
	serviceMonitor     *unstructured.Unstructured
	grafanaDashboard   *corev1.ConfigMap
	// metricsReader is the ClusterRole to bind to a scraper (metrics.secure only).
	metricsReader *rbacv1.ClusterRole
	// karpenterRole and karpenterRoleBinding let doctor in the router's pod read Karpenter's
	// Deployment (settings.karpenterNamespace): nil when that setting is empty.
	karpenterRole        *rbacv1.Role
	karpenterRoleBinding *rbacv1.RoleBinding
	// shadowReader is the ClusterRole to bind to the people who read /shadow (metrics.secure only).
	shadowReader  *rbacv1.ClusterRole
	networkPolicy *networkingv1.NetworkPolicy
}

// decode renders the chart (with the given helm arguments, default: ci/default-values.yaml)
// and decodes each object into its typed form. Exactly one object of each kind is expected;
// anything else is an error, so that an object added to the chart without a thought for this
// test is noticed.
func decode(t *testing.T, args ...string) manifests {
	t.Helper()
	if len(args) == 0 {
		args = []string{"-f", ciValues(t, "default")}
	}
	m := manifests{all: mustTemplate(t, args...)}
	seen := map[string]int{}
	for _, u := range m.all {
		kind := u.GetKind()
		seen[kind]++
		var into any
		switch kind {
		case "ServiceAccount":
			into = &m.serviceAccount
		case "Deployment":
			into = &m.deployment
		case "PodDisruptionBudget":
			into = &m.pdb
		case "Service":
			into = &m.service
		case "ClusterRole":
			into = &m.clusterRole
			if strings.HasSuffix(u.GetName(), "-metrics-reader") {
				seen[kind]-- // a second ClusterRole, of another purpose
				m.metricsReader = &rbacv1.ClusterRole{}
				into = m.metricsReader
			}
			if strings.HasSuffix(u.GetName(), "-shadow-reader") {
				seen[kind]-- // the shadow report's readers (metrics.secure)
				m.shadowReader = &rbacv1.ClusterRole{}
				into = m.shadowReader
			}
			if strings.HasSuffix(u.GetName(), "-healthrecords-view") {
				seen[kind]-- // read access to the router's memory, aggregated into view
				m.recordsView = &rbacv1.ClusterRole{}
				into = m.recordsView
			}
		case "CustomResourceDefinition":
			m.crd = u
			continue
		case "ClusterRoleBinding":
			into = &m.clusterRoleBinding
		case "Role":
			into = &m.role
			if strings.HasSuffix(u.GetName(), "-karpenter") {
				seen[kind]-- // in Karpenter's namespace, for doctor
				m.karpenterRole = &rbacv1.Role{}
				into = m.karpenterRole
			}
		case "RoleBinding":
			into = &m.roleBinding
			if strings.HasSuffix(u.GetName(), "-karpenter") {
				seen[kind]--
				m.karpenterRoleBinding = &rbacv1.RoleBinding{}
				into = m.karpenterRoleBinding
			}
		case "ServiceMonitor":
			m.serviceMonitor = u
			continue
		case "ConfigMap":
			m.grafanaDashboard = &corev1.ConfigMap{}
			into = m.grafanaDashboard
		case "NetworkPolicy":
			m.networkPolicy = &networkingv1.NetworkPolicy{}
			into = m.networkPolicy
		default:
			t.Fatalf("the chart renders a %s (%s) this test does not know: add its checks", kind, u.GetName())
		}
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
			t.Fatalf("%s %s: %v", kind, u.GetName(), err)
		}
	}
	for kind, n := range seen {
		if n > 1 {
			t.Fatalf("the chart renders %d objects of kind %s, want 1", n, kind)
		}
	}
	for _, kind := range []string{"Deployment", "PodDisruptionBudget", "Service", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		if seen[kind] == 0 {
			t.Fatalf("the chart renders no %s", kind)
		}
	}
	return m
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
	// The release's namespace, whatever it is; the chart makes no Namespace (helm install
	// --create-namespace does).
	m := decode(t, "-f", ciValues(t, "servicemonitor"))
	if m.serviceMonitor == nil {
		t.Fatal("serviceMonitor.enabled renders no ServiceMonitor")
	}
	for _, u := range m.all {
		switch u.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition":
			if u.GetNamespace() != "" {
				t.Errorf("cluster-scoped %s %s has namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
			}
		case "Role", "RoleBinding":
			// Every Role in the release's namespace but the one in Karpenter's, for doctor.
			want := namespace
			if strings.HasSuffix(u.GetName(), "-karpenter") {
				want = "kube-system"
			}
			if u.GetNamespace() != want {
				t.Errorf("%s %s in namespace %q, want %q", u.GetKind(), u.GetName(), u.GetNamespace(), want)
			}
		default:
			if u.GetNamespace() != namespace {
				t.Errorf("%s %s in namespace %q, want %q", u.GetKind(), u.GetName(), u.GetNamespace(), namespace)
			}
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
	// As Karpenter's chart: a system node group tainted CriticalAddonsOnly (any value, any
	// effect) takes the router.
	addons := corev1.Toleration{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}
	if !slices.Equal(spec.Tolerations, []corev1.Toleration{addons}) {
		t.Errorf("tolerations %+v, want only %+v", spec.Tolerations, addons)
	}
	for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
		taint := corev1.Taint{Key: "CriticalAddonsOnly", Value: "true", Effect: effect}
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(klog.Background(), &taint, false) }) {
			t.Errorf("the pod does not tolerate the taint %s", taint.ToString())
		}
	}
	// `tolerations: []` takes the default away.
	none := filepath.Join(t.TempDir(), "no-tolerations.yaml")
	if err := os.WriteFile(none, []byte("tolerations: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := decode(t, "-f", ciValues(t, "default"), "-f", none).deployment.Spec.Template.Spec.Tolerations; len(got) != 0 {
		t.Errorf("tolerations: [] rendered %+v, want none", got)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	ctr := spec.Containers[0]
	if ctr.Image != "ghcr.io/health-router/health-router:0.1.0" {
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

	// Settings: the required ones, the chart's defaults, and nothing the values leave empty;
	// the leader election namespace is the pod's own.
	got := env(ctr)
	want := map[string]string{
		"HEALTH_ROUTER_QUEUE_URL":                 "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-my-cluster",
		"HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL":     "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-my-cluster-dlq",
		"HEALTH_ROUTER_CLUSTER_NAME":              "my-cluster",
		"HEALTH_ROUTER_CLOUDWATCH_METRICS":        "true",
		"HEALTH_ROUTER_LEADER_ELECT":              "true",
		"HEALTH_ROUTER_FEATURE_GATES":             "ReservedCapacity=true",
		"HEALTH_ROUTER_LOG_LEVEL":                 "info",
		"HEALTH_ROUTER_METRICS_BIND_ADDRESS":      ":8080",
		"HEALTH_ROUTER_HEALTH_PROBE_BIND_ADDRESS": ":8081",
		"HEALTH_ROUTER_SHADOW_LEDGER":             "health-router-shadow",
		"HEALTH_ROUTER_KARPENTER_NAMESPACE":       "kube-system",
		"HEALTH_ROUTER_KARPENTER_DEPLOYMENT":      "karpenter",
	}
	if !maps.Equal(got, want) {
		t.Errorf("environment with the default values:\n got %v\nwant %v", got, want)
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

	if m.pdb.Spec.MaxUnavailable == nil || *m.pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || m.pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget minAvailable %v maxUnavailable %v, want maxUnavailable 1 (of 2 replicas)", m.pdb.Spec.MinAvailable, m.pdb.Spec.MaxUnavailable)
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
// touches, with the verbs it uses on each. The chart's README explains each.
var clusterRoleAllowlist = map[groupResource][]string{
	{"", "nodes"}:                           {"get", "list", "watch", "patch"},
	{"karpenter.sh", "nodeclaims"}:          {"get", "list", "watch", "patch", "delete"},
	{"karpenter.sh", "nodepools"}:           {"get", "list", "watch"},
	{"karpenter.k8s.aws", "ec2nodeclasses"}: {"get", "list", "watch"},
	{"", "pods"}:                            {"list"}, // get too with cordon-drain or the reboot in place: TestRBACEvictions
	{"policy", "poddisruptionbudgets"}:      {"get", "list", "watch"},
	{"", "events"}:                          {"create", "patch"},
	{"events.k8s.io", "events"}:             {"create", "patch"},
	{"healthrouter.io", "healthrecords"}:    {"get", "list", "watch", "create", "update", "delete"},
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

// TestRBACEvictions: evictions (and the DaemonSet and pod reads of kubectl's drain helper) are
// granted for cordon-drain and the reboot in place only. Pods are listed, never watched: the
// router reads them uncached (issue 38 item 5: the chart granted get, list and watch on every
// pod to every install).
func TestRBACEvictions(t *testing.T) {
	grants := func(m manifests, resource, verb string) bool {
		return slices.ContainsFunc(m.clusterRole.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb)
		})
	}
	evicts := func(m manifests) bool {
		if grants(m, "pods", "watch") || !grants(m, "pods", "list") {
			t.Errorf("pods: watch granted or list not: %+v", m.clusterRole.Rules)
		}
		e, d, g := grants(m, "pods/eviction", "create"), grants(m, "daemonsets", "get"), grants(m, "pods", "get")
		if e != d || e != g {
			t.Errorf("evictions %v, daemonsets get %v, pods get %v: the drain helper needs all three or none", e, d, g)
		}
		return e
	}
	for _, tt := range []struct {
		set  []string
		want bool
	}{
		{nil, false},
		{[]string{"--set", "settings.rebootInPlace=true"}, true},
		{[]string{"--set", "settings.rebootInPlace=false"}, false},
		{[]string{"--set", "settings.unmanagedNodes=cordon-drain"}, true},
	} {
		if got := evicts(decode(t, append([]string{"-f", ciValues(t, "default")}, tt.set...)...)); got != tt.want {
			t.Errorf("%v: evictions granted %v, want %v", tt.set, got, tt.want)
		}
	}
}

// TestRBACKarpenterDeployment: doctor in the router's pod reads Karpenter's Deployment (its
// feature gates and version, issue 38): the chart grants `get` on that one Deployment, in
// Karpenter's namespace, and nothing else there; with settings.karpenterNamespace empty, no
// Role is made there and doctor is not pointed at it.
func TestRBACKarpenterDeployment(t *testing.T) {
	for _, tt := range []struct {
		set             []string
		namespace, name string // "": no Role
	}{
		{nil, "kube-system", "karpenter"},
		{[]string{"--set", "settings.karpenterNamespace=karpenter", "--set", "settings.karpenterDeployment=karpenter-controller"}, "karpenter", "karpenter-controller"},
		{[]string{"--set", "settings.karpenterNamespace="}, "", ""},
	} {
		m := decode(t, append([]string{"-f", ciValues(t, "default")}, tt.set...)...)
		got := env(m.deployment.Spec.Template.Spec.Containers[0])
		if got["HEALTH_ROUTER_KARPENTER_NAMESPACE"] != tt.namespace || got["HEALTH_ROUTER_KARPENTER_DEPLOYMENT"] != tt.name {
			t.Errorf("%v: doctor's environment names %q/%q, want %q/%q", tt.set, got["HEALTH_ROUTER_KARPENTER_NAMESPACE"], got["HEALTH_ROUTER_KARPENTER_DEPLOYMENT"], tt.namespace, tt.name)
		}
		if tt.namespace == "" {
			if m.karpenterRole != nil || m.karpenterRoleBinding != nil {
				t.Errorf("%v: a Role in Karpenter's namespace is rendered: %+v", tt.set, m.karpenterRole)
			}
			continue
		}
		if m.karpenterRole == nil || m.karpenterRoleBinding == nil {
			t.Fatalf("%v: no Role and RoleBinding in Karpenter's namespace", tt.set)
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{tt.name}, Verbs: []string{"get"}}}
		if m.karpenterRole.Namespace != tt.namespace || !reflect.DeepEqual(m.karpenterRole.Rules, want) {
			t.Errorf("%v: Role %s/%s grants %+v, want %+v in %s", tt.set, m.karpenterRole.Namespace, m.karpenterRole.Name, m.karpenterRole.Rules, want, tt.namespace)
		}
		b := m.karpenterRoleBinding
		sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: m.serviceAccount.Name, Namespace: m.serviceAccount.Namespace}
		if b.Namespace != tt.namespace || b.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: m.karpenterRole.Name}) || len(b.Subjects) != 1 || b.Subjects[0] != sa {
			t.Errorf("%v: RoleBinding %s/%s: roleRef %+v, subjects %+v; want Role %s bound to %+v only", tt.set, b.Namespace, b.Name, b.RoleRef, b.Subjects, m.karpenterRole.Name, sa)
		}
	}
}

// TestRBACNodeMarks: patching Nodes is granted for the node marks (on by default) or for
// cordon-drain, and not when neither is on.
func TestRBACNodeMarks(t *testing.T) {
	patchesNodes := func(m manifests) bool {
		return slices.ContainsFunc(m.clusterRole.Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, "nodes") && slices.Contains(r.Verbs, "patch")
		})
	}
	for _, tt := range []struct {
		set  []string
		want bool
	}{
		{nil, true},
		{[]string{"--set", "settings.nodeMarks=false"}, false},
		{[]string{"--set", "settings.nodeMarks=false", "--set", "settings.unmanagedNodes=cordon-drain"}, true},
		{[]string{"--set", "settings.nodeMarks=true"}, true},
		{[]string{"--set", "settings.nodeMarks=false", "--set", "settings.rebootInPlace=true"}, true},
	} {
		if got := patchesNodes(decode(t, append([]string{"-f", ciValues(t, "default")}, tt.set...)...)); got != tt.want {
			t.Errorf("%v: patch nodes granted %v, want %v", tt.set, got, tt.want)
		}
	}
}

func TestRBAC(t *testing.T) {
	m := decode(t)
	for _, p := range ruleProblems(m.clusterRole.Rules, clusterRoleAllowlist) {
		t.Errorf("ClusterRole %s: %s", m.clusterRole.Name, p)
	}
	// The router's memory: its CRD ships with the chart (upgraded with it, kept on uninstall),
	// and everyone else only reads it, through the view role.
	if m.crd == nil || m.crd.GetName() != "healthrecords.healthrouter.io" || m.crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Errorf("the HealthRecord CRD: %v", m.crd)
	}
	if m.recordsView == nil || m.recordsView.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Fatalf("no view role for healthrecords aggregated into view: %+v", m.recordsView)
	}
	for _, p := range ruleProblems(m.recordsView.Rules, map[groupResource][]string{{"healthrouter.io", "healthrecords"}: {"get", "list", "watch"}}) {
		t.Errorf("ClusterRole %s: %s", m.recordsView.Name, p)
	}
	// The Role: the leader election's Lease, and the ConfigMap where routers before the store
	// kept the shadow ledger, read once and deleted by name (the ledger is a HealthRecord now):
	// no ConfigMap is created or written.
	var named, unnamed []rbacv1.PolicyRule
	for _, r := range m.role.Rules {
		if len(r.ResourceNames) > 0 {
			named = append(named, r)
		} else {
			unnamed = append(unnamed, r)
		}
	}
	for _, p := range ruleProblems(unnamed, map[groupResource][]string{{"coordination.k8s.io", "leases"}: leaseVerbs}) {
		t.Errorf("Role %s (leader election): %s", m.role.Name, p)
	}
	if len(named) != 1 || !slices.Equal(named[0].ResourceNames, []string{m.deployment.Name + "-shadow"}) || !slices.Equal(named[0].Resources, []string{"configmaps"}) ||
		!slices.Equal(named[0].APIGroups, []string{""}) || !slices.Equal(named[0].Verbs, []string{"get", "delete"}) {
		t.Errorf("Role %s: the rules limited by name are %+v, want get and delete on the ConfigMap %s-shadow only (the old ledger, adopted)", m.role.Name, named, m.deployment.Name)
	}
	if got := env(m.deployment.Spec.Template.Spec.Containers[0])["HEALTH_ROUTER_SHADOW_LEDGER"]; got != m.deployment.Name+"-shadow" {
		t.Errorf("HEALTH_ROUTER_SHADOW_LEDGER %q, want the ConfigMap the Role names", got)
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
