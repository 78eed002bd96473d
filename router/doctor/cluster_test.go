package doctor

import (
	"context"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
