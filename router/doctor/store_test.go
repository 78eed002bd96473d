package doctor

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/health-router/health-router/router/cluster"
)

// TestStore: doctor says whether the API server serves the router's memory (the HealthRecord
// CRD the chart installs): without it the router records nothing.
func TestStore(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		err  error
		want Status
	}{
		{"served", nil, OK},
		{"no CRD", &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "healthrouter.io", Kind: "HealthRecord"}}, Fail},
		{"another error", errors.New("connection refused"), Unknown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			kube := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if tt.err != nil {
						return tt.err
					}
					return c.List(ctx, list, opts...)
				},
			}).Build()
			var r Report
			(&Doctor{kube: kube}).store(context.Background(), &r)
			if len(r) != 1 || r[0].Status != tt.want || r[0].Check != "store" {
				t.Errorf("report %+v, want one store item %s", r, tt.want)
			}
		})
	}
}
