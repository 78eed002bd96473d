package eventwindow

import (
	"context"
	"time"

	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// passKey is the one request of the controller: every change it watches asks for a Pass, and
// the queue folds a burst of them into one.
var passKey = reconcile.Request{}

// SetupWithManager runs the manager as a controller on the leader (controllers run on the
// leader only): a Pass when a NodePool is created, changed or deleted, when a NodeClaim gets
// its instance, and when a backoff or the re-read of EC2's windows is due.
func (m *Manager) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{passKey} })
	return ctrl.NewControllerManagedBy(mgr).Named("eventwindow").
		Watches(&karpv1.NodePool{}, one, builder.WithPredicates(predicate.Or(predicate.AnnotationChangedPredicate{}, predicate.GenerationChangedPredicate{}))).
		Watches(&karpv1.NodeClaim{}, one, builder.WithPredicates(instanceKnown())).
		// One Pass at a time; SkipNameValidation: tests run several managers in one process.
		WithOptions(controller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true)}).
		Complete(m)
}

// instanceKnown passes a NodeClaim once it names its instance (status.providerID), and its
// deletion, after which its instance is forgotten.
func instanceKnown() predicate.Funcs {
	id := func(o client.Object) string {
		if nc, ok := o.(*karpv1.NodeClaim); ok {
			return cluster.InstanceID(nc.Status.ProviderID)
		}
		return ""
	}
	return predicate.Funcs{
		CreateFunc:  func(e ctrlevent.CreateEvent) bool { return id(e.Object) != "" },
		UpdateFunc:  func(e ctrlevent.UpdateEvent) bool { return id(e.ObjectNew) != id(e.ObjectOld) },
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

// Reconcile runs a Pass and asks to run again when the next backoff or re-read is due. A
// failure to read the cluster is returned (the controller's rate limiter retries it); EC2's
// failures are in backoff and never make the controller retry at once.
func (m *Manager) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	if err := m.Pass(ctx); err != nil {
		return reconcile.Result{}, err
	}
	next := m.Next()
	if next.IsZero() {
		return reconcile.Result{RequeueAfter: DescribeTTL}, nil
	}
	return reconcile.Result{RequeueAfter: max(next.Sub(m.clk.Now()), time.Second)}, nil
}
