package shadow

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// Watcher notes in the ledger when a NodeClaim with a would-be outcome begins deleting: what
// Karpenter's own handling did meanwhile. It reads the cache: the deletion timestamp is set
// once and kept (Karpenter's termination finalizer holds the NodeClaim while it drains).
type Watcher struct {
	reader client.Reader
	ledger *Ledger
	drains *prometheus.CounterVec // by nodepool
	mu     sync.Mutex
	seen   map[string]bool // NodeClaims noted by this process (the counter counts each once)
}

// NewWatcher returns a Watcher reading through reader.
func NewWatcher(reader client.Reader, ledger *Ledger, drains *prometheus.CounterVec) *Watcher {
	return &Watcher{reader: reader, ledger: ledger, drains: drains, seen: map[string]bool{}}
}

// SetupWithManager watches the NodeClaims being deleted (Reconcile reads whether the router
// keeps would-be outcomes for them).
func (w *Watcher) SetupWithManager(mgr ctrl.Manager) error {
	has := predicate.NewPredicateFuncs(func(o client.Object) bool { return !o.GetDeletionTimestamp().IsZero() })
	return ctrl.NewControllerManagedBy(mgr).Named("shadow").
		For(&karpv1.NodeClaim{}, builder.WithPredicates(has)).
		// SkipNameValidation: the router runs one manager per process, but tests run several.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		Complete(w)
}

// Reconcile notes a deleting NodeClaim's deletion in the ledger.
func (w *Watcher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := w.reader.Get(ctx, req.NamespacedName, nc); err != nil {
		if apierrors.IsNotFound(err) {
			w.mu.Lock()
			delete(w.seen, req.Name) // gone: its deletion was noted
			w.mu.Unlock()
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	mem, err := record.Load(ctx, w.reader, nc.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	w.Observe(nc, mem)
	return reconcile.Result{}, nil
}

// Observe notes nc's deletion if the router keeps would-be outcomes for it (mem) and it is
// deleting.
func (w *Watcher) Observe(nc *karpv1.NodeClaim, mem record.Memory) {
	if len(mem.Shadow) == 0 || nc.DeletionTimestamp.IsZero() {
		return
	}
	w.ledger.KarpenterActed(nc.Name, nc.DeletionTimestamp.Time)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen[nc.Name] {
		w.seen[nc.Name] = true
		if w.drains != nil {
			w.drains.WithLabelValues(nc.Labels[karpv1.NodePoolLabelKey]).Inc()
		}
	}
}
