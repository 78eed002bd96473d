package upcoming

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// Controller keeps every Node's marks equal to what its NodeClaim's records say. It runs on
// the leader. It reads NodeClaims, NodePools and Nodes from the cache (whose Node transform
// keeps the marks: cluster.Trimmer), and reads a Node from the API server only to change it:
// the taints are a list, and a merge patch of a list replaces it whole.
type Controller struct {
	cache client.Reader
	api   client.Reader
	kube  client.Writer
	log   *slog.Logger
	// Writes counts the Node writes by op (set, clear).
	writes *prometheus.CounterVec
}

// New returns the controller; reg may be nil.
func New(cache, api client.Reader, kube client.Writer, log *slog.Logger, reg prometheus.Registerer) *Controller {
	c := &Controller{cache: cache, api: api, kube: kube, log: log,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "health_router_node_marks_writes_total",
			Help: "Writes of the upcoming-maintenance marks on Nodes (label, annotation, taint), by op: set (marked or changed) or clear (removed)."}, []string{"op"})}
	if reg != nil {
		reg.MustRegister(c.writes)
	}
	return c
}

// SetupWithManager watches NodeClaims whose records change, Nodes (a new Node of a NodeClaim
// with records, marks changed by hand) and NodePools whose taint-upcoming changes.
func (c *Controller) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("upcoming").
		For(&karpv1.NodeClaim{}, builder.WithPredicates(recordsChanged())).
		// The router's memory of a NodeClaim is its HealthRecord of the same name (a Node's
		// record, router/nodedrain's, names no NodeClaim).
		Watches(&record.HealthRecord{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(record.OfClaims())).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(c.nodeClaimsOfNode), builder.WithPredicates(nodeChanged())).
		Watches(&karpv1.NodePool{}, handler.EnqueueRequestsFromMapFunc(c.nodeClaimsOfPool), builder.WithPredicates(taintSettingChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}).
		Complete(c)
}

// recordsChanged passes a NodeClaim whose deletion begins: its marks go (what the router
// keeps of it, its records and its run, is its HealthRecord, watched on its own).
func recordsChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(ctrlevent.CreateEvent) bool { return false },
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false }, // the Node goes with it
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

func nodeChanged() predicate.Funcs {
	marks := func(o client.Object) Marks {
		n, ok := o.(*corev1.Node)
		if !ok {
			return Marks{}
		}
		return Current(n)
	}
	return predicate.Funcs{
		CreateFunc:  func(ctrlevent.CreateEvent) bool { return true },
		UpdateFunc:  func(e ctrlevent.UpdateEvent) bool { return marks(e.ObjectOld) != marks(e.ObjectNew) },
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

// Taints reports whether a pool with these annotations taints its nodes with an upcoming
// maintenance (healthrouter.io/taint-upcoming): never while it is in shadow, where its policy is
// only recorded.
func Taints(annotations map[string]string) bool {
	p := policy.FromAnnotations(annotations)
	return p.TaintUpcoming && !p.Shadow
}

func taintSettingChanged() predicate.Funcs {
	setting := func(o client.Object) bool { return Taints(o.GetAnnotations()) }
	return predicate.Funcs{
		CreateFunc:  func(ctrlevent.CreateEvent) bool { return false }, // its NodeClaims come with their own events
		UpdateFunc:  func(e ctrlevent.UpdateEvent) bool { return setting(e.ObjectOld) != setting(e.ObjectNew) },
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

func (c *Controller) nodeClaimsOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	n, ok := o.(*corev1.Node)
	if !ok {
		return nil
	}
	id := cluster.InstanceID(n.Spec.ProviderID)
	if id == "" {
		return nil
	}
	claims, err := cluster.InstanceClaims(ctx, c.cache, id, client.UnsafeDisableDeepCopy)
	if err != nil {
		c.log.Error("listing the nodeclaims of a node", "node", n.Name, "err", err)
		return nil
	}
	return requests(claims, func(*karpv1.NodeClaim) bool { return true })
}

func (c *Controller) nodeClaimsOfPool(ctx context.Context, o client.Object) []reconcile.Request {
	var claims karpv1.NodeClaimList
	if err := c.cache.List(ctx, &claims, client.MatchingFields{cluster.IndexNodePool: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Error("listing the nodeclaims of a nodepool", "nodepool", o.GetName(), "err", err)
		return nil
	}
	var hrs record.HealthRecordList
	if err := c.cache.List(ctx, &hrs, client.MatchingLabels{karpv1.NodePoolLabelKey: o.GetName()}, client.UnsafeDisableDeepCopy); err != nil {
		c.log.Error("listing the healthrecords of a nodepool", "nodepool", o.GetName(), "err", err)
		return nil
	}
	kept := make(map[string]bool, len(hrs.Items))
	for i := range hrs.Items {
		kept[hrs.Items[i].Name] = len(hrs.Items[i].Status.Records) > 0
	}
	return requests(claims.Items, func(nc *karpv1.NodeClaim) bool { return kept[nc.Name] })
}

func requests(claims []karpv1.NodeClaim, keep func(*karpv1.NodeClaim) bool) []reconcile.Request {
	var out []reconcile.Request
	for i := range claims {
		if keep(&claims[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: claims[i].Name}})
		}
	}
	return out
}

// Reconcile makes the Node of NodeClaim req carry the marks of its records.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var nc karpv1.NodeClaim
	if err := c.cache.Get(ctx, req.NamespacedName, &nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	id := cluster.InstanceID(nc.Status.ProviderID)
	if id == "" {
		return reconcile.Result{}, nil // not launched yet: no Node
	}
	mem, err := record.Load(ctx, c.cache, nc.Name)
	if errors.Is(err, record.ErrUnreadable) {
		return reconcile.Result{}, nil // kept as it is, and so are the marks
	}
	taint := false
	if pool := nc.Labels[karpv1.NodePoolLabelKey]; pool != "" {
		var np karpv1.NodePool
		switch err := c.cache.Get(ctx, client.ObjectKey{Name: pool}, &np); {
		case err == nil:
			taint = Taints(np.Annotations)
		case !apierrors.IsNotFound(err):
			return reconcile.Result{}, err
		}
	}
	want := DesiredFor(mem, taint)
	if !nc.DeletionTimestamp.IsZero() {
		want = Marks{} // being drained: nothing is pending any more
	}
	nodes, err := cluster.InstanceNodes(ctx, c.cache, id, client.UnsafeDisableDeepCopy)
	if err != nil {
		return reconcile.Result{}, err
	}
	for i := range nodes {
		if Current(&nodes[i]) == want {
			continue
		}
		if err := c.mark(ctx, nodes[i].Name, want); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// mark writes m on Node name, read fresh from the API server, under its resource version.
func (c *Controller) mark(ctx context.Context, name string, m Marks) error {
	var n corev1.Node
	if err := c.api.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !n.DeletionTimestamp.IsZero() && !m.None() {
		return nil
	}
	base := n.DeepCopy()
	if !Apply(&n, m) {
		return nil
	}
	if err := c.kube.Patch(ctx, &n, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("marking node %s: %w", name, err) // a conflict is retried by the workqueue
	}
	op := "set"
	if m.None() {
		op = "clear"
	}
	c.writes.WithLabelValues(op).Inc()
	c.log.Debug("node marks written", "node", name, "op", op, "maintenance_at", m.At, "taint", m.Taint != "")
	return nil
}
