package upcoming

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
)

const pid = "aws:///eu-west-1a/i-0123456789abcdef0"

func claim(t *testing.T, recs ...record.Record) *karpv1.NodeClaim {
	t.Helper()
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-abc", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}},
		Status: karpv1.NodeClaimStatus{ProviderID: pid, NodeName: "ip-10-0-1-2"}}
	if recs != nil {
		v, err := record.Encode(record.Set{Records: recs})
		if err != nil {
			t.Fatal(err)
		}
		nc.Annotations = map[string]string{record.Annotation: v}
	}
	return nc
}

func pool(taint string) *karpv1.NodePool {
	np := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}
	if taint != "" {
		np.Annotations = map[string]string{policy.AnnotationTaintUpcoming: taint}
	}
	return np
}

func TestReconcile(t *testing.T) {
	deferred := rec("ev-1", record.StateDeferred, t0, policy.HoldWindow)
	drained := rec("ev-1", record.StateDrained, t0, "")
	marked := Desired(record.Set{Records: []record.Record{deferred}}, false)
	tainted := Desired(record.Set{Records: []record.Record{deferred}}, true)
	other := corev1.Taint{Key: "dedicated", Value: "kafka", Effect: corev1.TaintEffectNoSchedule}
	tests := []struct {
		name      string
		claim     *karpv1.NodeClaim
		pool      *karpv1.NodePool
		node      Marks // what the Node carries before
		deleting  bool
		conflicts int
		want      Marks
		wantErr   bool
		writes    float64
	}{
		{name: "a deferral marks the node", claim: claim(t, deferred), pool: pool(""), want: marked, writes: 1},
		{name: "taint-upcoming adds the taint", claim: claim(t, deferred), pool: pool("true"), want: tainted, writes: 1},
		{name: "an invalid taint-upcoming adds none", claim: claim(t, deferred), pool: pool("sure"), want: marked, writes: 1},
		{name: "marked already: no write", claim: claim(t, deferred), pool: pool(""), node: marked, want: marked},
		{name: "the outcome ended: the marks go", claim: claim(t, drained), pool: pool("true"), node: tainted, want: Marks{}, writes: 1},
		{name: "the pool turned the taint off", claim: claim(t, deferred), pool: pool("false"), node: tainted, want: marked, writes: 1},
		{name: "no records: stale marks go", claim: claim(t), pool: pool(""), node: tainted, want: Marks{}, writes: 1},
		{name: "the pool is gone: marks without taint", claim: claim(t, deferred), node: tainted, want: marked, writes: 1},
		{name: "being deleted: the marks go", claim: claim(t, deferred), pool: pool("true"), node: tainted, deleting: true, want: Marks{}, writes: 1},
		{name: "unreadable records: the marks stay", claim: func() *karpv1.NodeClaim {
			nc := claim(t)
			nc.Annotations = map[string]string{record.Annotation: `{"version":9}`}
			return nc
		}(), pool: pool(""), node: tainted, want: tainted},
		{name: "a conflicting write is an error (the workqueue retries)", claim: claim(t, deferred), pool: pool(""), conflicts: 1, want: Marks{}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := node(tt.node, other)
			n.Name, n.Spec.ProviderID = "ip-10-0-1-2", pid
			objs := []client.Object{tt.claim, &n}
			if tt.pool != nil {
				objs = append(objs, tt.pool)
			}
			if tt.deleting {
				tt.claim.DeletionTimestamp, tt.claim.Finalizers = &metav1.Time{Time: t0}, []string{"karpenter.sh/termination"}
			}
			scheme, err := cluster.NewScheme()
			if err != nil {
				t.Fatal(err)
			}
			conflicts := tt.conflicts
			b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
					if conflicts > 0 {
						conflicts--
						return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, obj.GetName(), errors.New("changed"))
					}
					return c.Patch(ctx, obj, p, opts...)
				}})
			for _, ix := range cluster.Indexes() {
				b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
			}
			kube := b.Build()
			recordtest.FromAnnotations(t, kube)
			c := New(kube, kube, kube, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
			_, err = c.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: tt.claim.Name}})
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			var got corev1.Node
			if err := kube.Get(context.Background(), client.ObjectKey{Name: n.Name}, &got); err != nil {
				t.Fatal(err)
			}
			if tt.wantErr {
				return
			}
			if Current(&got) != tt.want {
				t.Errorf("node carries %+v, want %+v", Current(&got), tt.want)
			}
			if len(got.Spec.Taints) == 0 || got.Spec.Taints[0] != other {
				t.Errorf("another taint was lost: %v", got.Spec.Taints)
			}
			if w := testutil.ToFloat64(c.writes.WithLabelValues("set")) + testutil.ToFloat64(c.writes.WithLabelValues("clear")); w != tt.writes {
				t.Errorf("%v writes, want %v", w, tt.writes)
			}
		})
	}
}

func TestMapping(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	withRecords := claim(t, rec("ev-1", record.StateDeferred, t0, ""))
	bare := claim(t)
	bare.Name, bare.Status.ProviderID = "kafka-def", "aws:///eu-west-1a/i-0fedcba9876543210"
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(withRecords, bare)
	for _, ix := range cluster.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	kube := b.Build()
	recordtest.FromAnnotations(t, kube)
	c := New(kube, kube, kube, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	ctx := context.Background()
	// A taint-upcoming change touches only the pool's NodeClaims with records.
	if got := c.nodeClaimsOfPool(ctx, pool("true")); len(got) != 1 || got[0].Name != "kafka-abc" {
		t.Errorf("pool maps to %v", got)
	}
	// A Node maps to its NodeClaim by instance ID, records or not (stale marks go too).
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{ProviderID: bare.Status.ProviderID}}
	if got := c.nodeClaimsOfNode(ctx, n); len(got) != 1 || got[0].Name != "kafka-def" {
		t.Errorf("node maps to %v", got)
	}
	if got := c.nodeClaimsOfNode(ctx, &corev1.Node{Spec: corev1.NodeSpec{ProviderID: "kind://x"}}); got != nil {
		t.Errorf("a node of no instance maps to %v", got)
	}
}
