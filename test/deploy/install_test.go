package deploy_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/test/harness"
)

// TestAgainstAPIServer runs the chart past a real kube-apiserver with the Karpenter CRDs: every
// rendered object in a server-side dry run, then the README's install for real: `helm
// install`, the RBAC it installed checked with the server's authorizer, `helm upgrade` (the
// same values leave the pods alone; a changed setting rolls them) and `helm uninstall`.
func TestAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd (envtest)")
	}
	objs := build(t) // not decoded here, so that the server is the one to judge them
	// envtest logs through controller-runtime; without a logger it prints a stack trace.
	ctrl.SetLogger(logr.Discard())
	cfg := harness.KubeAPIServerBare(t) // the chart installs the router's own CRD
	warnings := &warningRecorder{}
	cfg.WarningHandlerWithContext = warnings
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The namespace enforces and warns on the "restricted" Pod Security Standard (as the
	// chart's README suggests), so a pod template that breaks it shows.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
		"pod-security.kubernetes.io/warn":    "restricted",
	}}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating Namespace %s: %v", namespace, err)
	}
	t.Run("dry-run apply", func(t *testing.T) { dryRunApply(t, c, objs, warnings) })
	t.Run("dry-run apply, locked down", func(t *testing.T) {
		// The NetworkPolicy, the metrics-reader ClusterRole, the calendar's ports (the
		// ServiceMonitor's CRD comes with the install below).
		dryRunApply(t, c, mustTemplate(t, "-f", ciValues(t, "locked-down"), "--set", "serviceMonitor.enabled=false"), warnings)
	})
	t.Run("Pod Security warns", func(t *testing.T) {
		// The warning check of the dry run can fail: a privilege-escalating pod template draws one.
		bad := mustTemplate(t, "-f", ciValues(t, "default"), "--set", "containerSecurityContext.allowPrivilegeEscalation=true")
		i := slices.IndexFunc(bad, func(u *unstructured.Unstructured) bool { return u.GetKind() == "Deployment" })
		if i < 0 {
			t.Fatal("the chart renders no Deployment")
		}
		before := len(warnings.all())
		if err := c.Apply(t.Context(), client.ApplyConfigurationFromUnstructured(bad[i]), client.DryRunAll, client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
		w := warnings.all()[before:]
		if !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, "allowPrivilegeEscalation") }) {
			t.Errorf("no Pod Security warning for allowPrivilegeEscalation=true: %q", w)
		}
	})
	t.Run("helm install, upgrade, uninstall", func(t *testing.T) { lifecycle(t, cfg, c) })
}

// kubeconfig writes a kubeconfig for cfg (envtest's admin user) for helm.
func kubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// serviceMonitorCRD is the smallest CustomResourceDefinition of the Prometheus Operator's
// ServiceMonitor that the API server accepts the chart's ServiceMonitor against (the
// operator's own CRD is not in the module cache; envtest has none).
func serviceMonitorCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "ServiceMonitor", ListKind: "ServiceMonitorList", Plural: "servicemonitors", Singular: "servicemonitor"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object", XPreserveUnknownFields: &preserve},
					},
				}},
			}},
		},
	}
}

// lifecycle installs, upgrades and uninstalls the chart with helm, as the README does.
func lifecycle(t *testing.T, cfg *rest.Config, c client.Client) {
	ctx := t.Context()
	crd := serviceMonitorCRD()
	if err := c.Create(ctx, crd); err != nil {
		t.Fatalf("creating the ServiceMonitor CRD: %v", err)
	}
	// The CRD serves once it is Established.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), crd); err != nil {
			return false, err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("ServiceMonitor CRD not established: %v", err)
	}

	kc := []string{"--kubeconfig", kubeconfig(t, cfg), "--namespace", namespace}
	helm := func(args ...string) string {
		t.Helper()
		// helm does not show the API server's warnings: the dry-run subtests catch a pod
		// template that breaks the "restricted" Pod Security Standard.
		out, _, err := runHelm(t, nil, append(args, kc...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	deployment := func() *appsv1.Deployment {
		t.Helper()
		d := &appsv1.Deployment{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: release}, d); err != nil {
			t.Fatalf("getting Deployment %s: %v", release, err)
		}
		return d
	}
	defaults := ciValues(t, "default")

	// Install: the README's command.
	notes := helm("install", release, chartDir(t), "-f", defaults)
	if !strings.Contains(notes, "health-router doctor") || !strings.Contains(notes, "--queue-url https://sqs.eu-west-1.amazonaws.com/111122223333/hr-my-cluster") {
		t.Errorf("the install's NOTES do not give the doctor command with the queue:\n%s", notes)
	}
	installed := deployment()
	for _, obj := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: release}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Errorf("after helm install: %T %s: %v", obj, obj.GetName(), err)
		}
	}
	t.Run("RBAC authorizes", func(t *testing.T) { rbacAuthorizes(t, c, installed) })

	// The same values again: the pod template does not change, so the pods stay.
	helm("upgrade", release, chartDir(t), "-f", defaults)
	if d := deployment(); d.Generation != installed.Generation {
		t.Errorf("helm upgrade with the same values moved the Deployment from generation %d to %d: the pods would roll for nothing", installed.Generation, d.Generation)
	}

	// A changed setting rolls the pods: the pod template changes (the Deployment controller
	// rolls on exactly that), and the ServiceMonitor appears.
	helm("upgrade", release, chartDir(t), "-f", defaults, "--set", "settings.workers=20", "--set", "serviceMonitor.enabled=true")
	upgraded := deployment()
	if upgraded.Generation == installed.Generation {
		t.Errorf("helm upgrade --set settings.workers=20 left the Deployment at generation %d: the pods would not roll", upgraded.Generation)
	}
	if got := env(upgraded.Spec.Template.Spec.Containers[0])["HEALTH_ROUTER_WORKERS"]; got != "20" {
		t.Errorf("after the upgrade HEALTH_ROUTER_WORKERS = %q, want 20", got)
	}
	sm := &unstructured.Unstructured{}
	sm.SetGroupVersionKind(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"})
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: release}, sm); err != nil {
		t.Errorf("after the upgrade with serviceMonitor.enabled: %v", err)
	}

	// IRSA: the role ARN lands on the ServiceAccount.
	helm("upgrade", release, chartDir(t), "-f", ciValues(t, "irsa"))
	sa := &corev1.ServiceAccount{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: release}, sa); err != nil {
		t.Fatal(err)
	}
	if got := sa.Annotations["eks.amazonaws.com/role-arn"]; got != "arn:aws:iam::111122223333:role/hr-my-cluster-router" {
		t.Errorf("after the IRSA upgrade the ServiceAccount's role-arn annotation is %q", got)
	}

	// Locked down: the server grants the metrics server its reviews, and holds the
	// NetworkPolicy and the metrics-reader ClusterRole.
	notes = helm("upgrade", release, chartDir(t), "-f", ciValues(t, "locked-down"))
	for _, want := range []string{"port-forward service/" + release + " 8082:calendar", "never expose it publicly", "--clusterrole=" + release + "-metrics-reader"} {
		if !strings.Contains(notes, want) {
			t.Errorf("the locked-down upgrade's NOTES do not say %q:\n%s", want, notes)
		}
	}
	user := fmt.Sprintf("system:serviceaccount:%s:%s", namespace, release)
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Verb: "create", Group: "authentication.k8s.io", Resource: "tokenreviews"},
		{Verb: "create", Group: "authorization.k8s.io", Resource: "subjectaccessreviews"},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}, ResourceAttributes: &ra}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if !sar.Status.Allowed {
			t.Errorf("with metrics.secure, %s may not %s %s.%s (%s)", user, ra.Verb, ra.Resource, ra.Group, sar.Status.Reason)
		}
	}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}}
	reader := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release + "-metrics-reader"}}
	for _, obj := range []client.Object{np, reader} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Errorf("after the locked-down upgrade: %T %s: %v", obj, obj.GetName(), err)
		}
	}

	// Uninstall removes what the chart made, the cluster-scoped RBAC included.
	helm("uninstall", release)
	for _, obj := range []client.Object{
		np, reader,
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: release}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: release}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: release}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: release + "-karpenter"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: release + "-karpenter"}},
		sm,
	} {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("after helm uninstall: %T %s: %v, want NotFound", obj, obj.GetName(), err)
		}
	}
	if out, _, err := runHelm(t, nil, append([]string{"list", "--short"}, kc...)...); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("helm list after uninstall: %q %v, want nothing", out, err)
	}
}

// env is a container's plain environment variables.
func env(ctr corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil {
			m[e.Name] = e.Value
		}
	}
	return m
}

// rbacAuthorizes asks the API server's RBAC authorizer (SubjectAccessReview) what the
// ServiceAccount of the installed Deployment may do: every verb the router uses, and nothing
// next to it.
func rbacAuthorizes(t *testing.T, c client.Client, d *appsv1.Deployment) {
	ctx := t.Context()
	user := fmt.Sprintf("system:serviceaccount:%s:%s", d.Namespace, d.Spec.Template.Spec.ServiceAccountName)

	// resource may name a subresource: pods/eviction.
	type access struct {
		verb, group, resource, namespace, name string
	}
	var allowed []access
	for gr, verbs := range clusterRoleAllowlist {
		for _, v := range verbs {
			// Cluster-wide, and in "default", where Events of cluster-scoped objects go.
			allowed = append(allowed, access{v, gr.group, gr.resource, "", ""}, access{v, gr.group, gr.resource, "default", ""})
		}
	}
	for _, v := range leaseVerbs {
		allowed = append(allowed, access{v, "coordination.k8s.io", "leases", namespace, ""})
	}
	// doctor in the router's pod reads Karpenter's Deployment (settings.karpenterNamespace,
	// karpenterDeployment): that one, by name, and nothing else in Karpenter's namespace.
	allowed = append(allowed, access{"get", "apps", "deployments", "kube-system", "karpenter"})
	denied := []access{
		{"get", "", "secrets", namespace, ""},
		{"list", "", "secrets", "", ""},
		{"delete", "", "pods", "", ""},
		// Pods are read uncached (issue 38 item 5): never watched; get only for the drain
		// helper of cordon-drain and the reboot in place, off in this install.
		{"watch", "", "pods", "", ""},
		{"get", "", "pods", "default", ""},
		{"create", "", "pods/eviction", "default", ""},
		{"delete", "", "nodes", "", ""},
		{"update", "", "nodes/status", "", ""},
		{"create", "karpenter.sh", "nodeclaims", "", ""},
		{"update", "karpenter.sh", "nodeclaims", "", ""},
		{"patch", "karpenter.sh", "nodeclaims/status", "", ""},
		{"patch", "karpenter.sh", "nodepools", "", ""},
		{"update", "karpenter.k8s.aws", "ec2nodeclasses", "", ""},
		{"delete", "", "events", "default", ""},
		{"create", "coordination.k8s.io", "leases", "kube-system", ""},
		{"delete", "coordination.k8s.io", "leases", namespace, ""},
		{"escalate", "rbac.authorization.k8s.io", "clusterroles", "", ""},
		{"get", "apps", "deployments", "kube-system", "coredns"},
		{"list", "apps", "deployments", "kube-system", ""},
		{"update", "apps", "deployments", "kube-system", "karpenter"},
		{"get", "", "secrets", "kube-system", "karpenter-cert"},
		// The router's memory is written whole, under its resource version: no patch.
		{"patch", "healthrouter.io", "healthrecords", "", ""},
	}
	check := func(a access, want bool) {
		res, sub, _ := strings.Cut(a.resource, "/")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: res, Subresource: sub, Namespace: a.namespace, Name: a.name,
			},
		}}
		if err := c.Create(ctx, sar); err != nil {
			t.Fatalf("SubjectAccessReview %+v: %v", a, err)
		}
		if sar.Status.Allowed != want {
			t.Errorf("%s may %s %s.%s %q in %q: %v, want %v (%s)", user, a.verb, a.resource, a.group, a.name, a.namespace, sar.Status.Allowed, want, sar.Status.Reason)
		}
	}
	for _, a := range allowed {
		check(a, true)
	}
	for _, a := range denied {
		check(a, false)
	}
}

// dryRunApply applies every rendered object with server-side apply in dry-run mode:
// the server validates each one fully (schema, unknown fields, defaults, admission) without
// storing it. The Namespace enforces and warns on the "restricted" Pod Security Standard, so a
// pod template that breaks it shows as a warning, which fails the test.
func dryRunApply(t *testing.T, c client.Client, objs []*unstructured.Unstructured, warnings *warningRecorder) {
	ctx := t.Context()
	applied := 0
	var deployment *unstructured.Unstructured
	for _, u := range objs {
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
	if want := len(objs); applied != want {
		t.Errorf("applied %d objects, want %d", applied, want)
	}
	if w := warnings.all(); len(w) > 0 {
		t.Errorf("the API server warned:\n  %s", strings.Join(w, "\n  "))
	}
	// A dry run stores nothing.
	if deployment == nil {
		t.Fatal("the chart renders no Deployment")
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKeyFromObject(deployment), &d); !apierrors.IsNotFound(err) {
		t.Errorf("after the dry run, getting Deployment %s: %v, want NotFound", deployment.GetName(), err)
	}
}
