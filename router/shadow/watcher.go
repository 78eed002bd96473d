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

// SetupWithManager watches the NodeClaims that carry would-be outcomes.
func (w *Watcher) SetupWithManager(mgr ctrl.Manager) error {
	has := predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetAnnotations()[Annotation]
		return ok && !o.GetDeletionTimestamp().IsZero()
	})
	return ctrl.NewControllerManagedBy(mgr).Named("shadow").
		For(&karpv1.NodeClaim{}, builder.WithPredicates(has)).
		// SkipNameValidation: the router runs one manager per process, but tests run several
		// (the second failed "controller with name shadow already exists").
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
	w.Observe(nc)
	return reconcile.Result{}, nil
}

// Observe notes nc's deletion if it carries would-be outcomes and is deleting.
func (w *Watcher) Observe(nc *karpv1.NodeClaim) {
	if _, ok := nc.Annotations[Annotation]; !ok || nc.DeletionTimestamp.IsZero() {
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
