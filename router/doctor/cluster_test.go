package doctor

import (
	"context"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
)

// TestAPIServerFirst: an API server that does not answer is one FAIL with a connection fix,
// and the cluster checks are skipped, not each answered with an RBAC grant ("connection
// refused": "grant get/list on nodepools", issue 38, 15); a server that answers, even with a
// denial, gets the cluster checks.
func TestAPIServerFirst(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	// A closed port: the real client's own error for a refused connection.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	refused, err := client.New(&rest.Config{Host: "http://" + addr}, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	denied := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: "authorization.k8s.io", Resource: "selfsubjectaccessreviews"}, "", nil)
		},
	}).Build()
	wrapped := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
			return &url.Error{Op: "Post", URL: "https://api.example:6443", Err: syscall.ECONNREFUSED}
		},
	}).Build()
	for _, tt := range []struct {
		name     string
		kube     client.Client
		reached  bool
		grantFix bool // some item's fix is an RBAC grant
	}{
		{"connection refused", refused, false, false},
		{"a network error", wrapped, false, false},
		{"answered with a denial", denied, true, false},
		{"answered", fake.NewClientBuilder().WithScheme(scheme).Build(), true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r Report
			(&Doctor{kube: tt.kube}).cluster(context.Background(), &r, Config{Gates: checks.NewFeatureGates(), KarpenterNamespace: "kube-system"})
			var server, skipped, rbac bool
			for _, it := range r {
				switch it.Check {
				case CheckAPIServer:
					server = it.Status == Fail && strings.Contains(it.Fix, "--kubeconfig")
				case CheckClusterSkipped:
					skipped = true
				case "RBAC":
					rbac = true
				}
				if !tt.reached && strings.HasPrefix(it.Fix, "grant the router get/list") {
					t.Errorf("an RBAC fix for a server that did not answer: %+v", it)
				}
			}
			if tt.reached != rbac || tt.reached == server || tt.reached == skipped {
				t.Errorf("report %+v: want the cluster checks %v", r, tt.reached)
			}
		})
	}
}

// TestNoNilInDetails: no check writes a nil error into its line ("(<nil>)": a Karpenter
// Deployment that is not there is not an error, issue 38, 15).
func TestNoNilInDetails(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	(&Doctor{kube: fake.NewClientBuilder().WithScheme(scheme).Build()}).cluster(context.Background(), &r, Config{Gates: checks.NewFeatureGates(), KarpenterNamespace: "kube-system"})
	for _, it := range r {
		if strings.Contains(it.Detail, "<nil>") || strings.Contains(it.Fix, "<nil>") {
			t.Errorf("%s: %q (fix %q)", it.Check, it.Detail, it.Fix)
		}
	}
}

// TestKarpenterDeployment: doctor reads Karpenter's Deployment by name first, which is all the
// chart grants the router's pod (issue 38: the in-pod doctor printed "?" for Karpenter's
// feature gate and version, for want of a grant to list Deployments), then by the chart's
// label, which a user with wider rights has; it names what it could not read.
func TestKarpenterDeployment(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	dep := func(name string, labelled bool, gates string) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}}
		if labelled {
			d.Labels = map[string]string{"app.kubernetes.io/name": "karpenter", "app.kubernetes.io/version": "1.9.3"}
		}
		d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "controller", Image: "public.ecr.aws/karpenter/controller:1.15.0",
			Env: []corev1.EnvVar{{Name: "FEATURE_GATES", Value: gates}}}}
		return d
	}
	forbidList := interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
		return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "", nil)
	}}
	forbidGet := interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*appsv1.Deployment); ok {
			return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, key.Name, nil)
		}
		return c.Get(ctx, key, obj, opts...)
	}}
	for _, tt := range []struct {
		name       string
		objs       []client.Object
		funcs      interceptor.Funcs
		deployment string
		gate       Status // the ReservedCapacity comparison (the router's gate is on)
		version    string // in the version line's detail
		problem    string // in both lines' detail, when neither could read it
	}{
		{"by name, the pod's only grant", []client.Object{dep("karpenter", false, "ReservedCapacity=true")}, forbidList, "", OK, "1.15.0", ""},
		{"by name, unlabelled, beside a labelled other", []client.Object{dep("karpenter", false, "ReservedCapacity=true"), dep("other", true, "ReservedCapacity=false")}, interceptor.Funcs{}, "", OK, "1.15.0", ""},
		{"by a name of the user's", []client.Object{dep("karpenter-controller", false, "ReservedCapacity=false")}, forbidList, "karpenter-controller", Fail, "1.15.0", ""},
		{"by label, named otherwise", []client.Object{dep("kp", true, "ReservedCapacity=false")}, interceptor.Funcs{}, "", Fail, "1.9.3", ""},
		{"by label, the name forbidden", []client.Object{dep("karpenter", true, "ReservedCapacity=true")}, forbidGet, "", OK, "1.9.3", ""},
		{"neither: none there", nil, interceptor.Funcs{}, "", Unknown, "", "no Deployment kube-system/karpenter, and none labelled app.kubernetes.io/name=karpenter in kube-system"},
		{"neither: both forbidden", []client.Object{dep("karpenter", true, "")}, interceptor.Funcs{Get: forbidGet.Get, List: forbidList.List}, "", Unknown, "", "cannot read Karpenter's Deployment kube-system/karpenter"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.objs...).WithInterceptorFuncs(tt.funcs).Build()
			gates := checks.NewFeatureGates()
			if err := gates.Set("ReservedCapacity=true"); err != nil {
				t.Fatal(err)
			}
			c := Config{Gates: gates, KarpenterNamespace: "kube-system", KarpenterDeployment: tt.deployment}
			var r Report
			d := &Doctor{kube: kube}
			d.gates(context.Background(), &r, c)
			d.karpenterVersion(context.Background(), &r, c)
			if len(r) != 2 {
				t.Fatalf("report %+v, want two lines", r)
			}
			if r[0].Status != tt.gate {
				t.Errorf("feature gate: %+v, want %v", r[0], tt.gate)
			}
			if tt.problem != "" {
				for _, it := range r {
					if it.Status != Unknown || !strings.Contains(it.Detail, tt.problem) || !strings.Contains(it.Fix, "--karpenter-deployment") {
						t.Errorf("%+v: want unknown, saying %q, with the flags to point doctor at it", it, tt.problem)
					}
				}
				return
			}
			if !strings.Contains(r[1].Detail, tt.version) {
				t.Errorf("version: %+v, want it read as %s", r[1], tt.version)
			}
		})
	}
}
