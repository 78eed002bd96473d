// Package deferral holds deferred events where Kubernetes keeps them: each deferral is a
// record on its instance's NodeClaim (healthrouter.io/deferred), and this controller requeues
// each NodeClaim until its earliest record is due, then decides that instance again — the
// shape of Karpenter's own controllers (Reconcile, RequeueAfter). Nothing waits in SQS: the
// intake deletes a message once every instance's outcome is recorded.
//
// Holds on live state end early: a drain held by pacing is released when one of its pool's
// drains finishes (only as many as the pool's limit then allows), a drain held by the AMI
// check when the image becomes available. The controller also confirms forwarded drains:
// a NodeClaim that Karpenter has not started deleting within the bound is deleted by the
// router, with a Warning Event.
package deferral

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
)

// IndexHeldOn indexes NodeClaims by what their active deferrals wait on: "pool/<nodepool>"
// for drains held by pacing, "image/<ami>" for drains held by the AMI check, "pdb/<ns>/<name>"
// for drains held by a PodDisruptionBudget.
const IndexHeldOn = "healthrouter.io/held-on"

// DefaultConfirmTimeout is how long Karpenter has to start deleting a NodeClaim whose drain
// was forwarded to its queue. Karpenter long-polls its queue and acts within a second or two;
// past this bound the message was lost or refused (a body it cannot parse is deleted
// unread), and the router deletes the NodeClaim itself.
const DefaultConfirmTimeout = 20 * time.Second

// maxConcurrentReconciles bounds the deferrals decided at once when many come due together
// (a window opening over thousands of deferred instances).
const maxConcurrentReconciles = 8

// releasable are the holds on live state that a release ends early.
var releasable = map[policy.Hold]bool{policy.HoldPacing: true, policy.HoldCheck: true, policy.HoldPDB: true, policy.HoldRepairCutoff: true}

// HeldOn returns the index values of a HealthRecord: what its active deferrals wait on.
func HeldOn(o client.Object) []string {
	hr, ok := o.(*record.HealthRecord)
	if !ok {
		return nil
	}
	var keys []string
	repair := false
	for _, d := range hr.Status.Records {
		if d.Active() && d.Kind == event.KindInstanceStatus && !repair {
			// Any held repair (by the cut-off, pacing, a check) ends if the instance recovers.
			keys, repair = append(keys, RepairKey), true
		}
		switch {
		case !d.Active():
		case d.Hold == policy.HoldPacing:
			keys = append(keys, PoolKey(hr.Spec.NodePool))
		case d.Hold == policy.HoldCheck && d.Image != "":
			keys = append(keys, ImageKey(d.Image))
		case d.Hold == policy.HoldPDB:
			for _, p := range d.PDBs {
				keys = append(keys, "pdb/"+p)
			}
		}
	}
	return keys
}

// RepairKey is the IndexHeldOn value of NodeClaims whose impaired-instance repair is held
// (by the repair cut-off, pacing or a check): the poller watches them for recovery.
const RepairKey = "repair"

// HeldImpaired returns the instances whose repair is held by the repair cut-off (the
// poller hands those that recover to the pipeline, which cancels the hold).
func (c *Controller) HeldImpaired(ctx context.Context) ([]string, error) {
	var hrs record.HealthRecordList
	if err := c.kube.List(ctx, &hrs, client.MatchingFields{IndexHeldOn: RepairKey}); err != nil {
		return nil, fmt.Errorf("listing healthrecords held on %s: %w", RepairKey, err)
	}
	ids := make([]string, 0, len(hrs.Items))
	for i := range hrs.Items {
		if id := hrs.Items[i].Spec.InstanceID; id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// PoolKey and ImageKey are IndexHeldOn values.
func PoolKey(pool string) string   { return "pool/" + pool }
func ImageKey(image string) string { return "image/" + image }

// Controller decides deferrals again when they come due.
type Controller struct {
	kube     client.Reader // the cache
	pipeline *pipeline.Pipeline
	engine   *engine.Engine
	signal   *signal.Signaller
	metrics  *metrics.Router
	clock    clock.WithTicker
	log      *slog.Logger
	confirm  time.Duration
	wake     chan ctrlevent.TypedGenericEvent[client.Object]

	// leading is set while this replica is the elected leader: only then are releases
	// queued. Every replica's informers call the release handlers, but only the leader's
	// controller reads the wake queue; a standby that queued would fill it and then block.
	leading atomic.Bool

	mu       sync.Mutex
	released map[string]bool // NodeClaims whose pacing or check hold was released
	active   map[string]int  // NodeClaim -> active deferrals, for the gauge
}

// wakeQueue bounds the releases queued for the controller at once; a release that does not
// fit is dropped and counted (the Rechecker and each record's own time cover it).
const wakeQueue = 1024

// New returns a Controller; confirm <= 0 means DefaultConfirmTimeout.
func New(kube client.Reader, p *pipeline.Pipeline, eng *engine.Engine, sig *signal.Signaller, m *metrics.Router, clk clock.WithTicker, log *slog.Logger, confirm time.Duration) *Controller {
	if confirm <= 0 {
		confirm = DefaultConfirmTimeout
	}
	return &Controller{kube: kube, pipeline: p, engine: eng, signal: sig, metrics: m, clock: clk, log: log, confirm: confirm,
		wake: make(chan ctrlevent.TypedGenericEvent[client.Object], wakeQueue), released: map[string]bool{}, active: map[string]int{}}
}

// Start marks this replica the leader until ctx ends; the manager runs it on the elected
// leader only (NeedLeaderElection).
func (c *Controller) Start(ctx context.Context) error {
	c.leading.Store(true)
	<-ctx.Done()
	c.leading.Store(false)
	// No longer the leader: what was queued for this replica's controller will not be read
	// (the new leader releases from its own informers and records), so it is let go.
	c.mu.Lock()
	clear(c.released)
	c.mu.Unlock()
	for {
		select {
		case <-c.wake:
		default:
			return nil
		}
	}
}

// NeedLeaderElection: Start runs on the leader only.
func (c *Controller) NeedLeaderElection() bool { return true }

// Wakes is the release queue the controller's source reads; the simulation (test/sim),
// which plays controller-runtime's workqueue, reads it in its place.
func (c *Controller) Wakes() <-chan ctrlevent.TypedGenericEvent[client.Object] { return c.wake }

// Leading reports whether this replica queues releases (it is the leader).
func (c *Controller) Leading() bool { return c.leading.Load() }

// Pending returns what the controller holds in memory, for the simulation's bounds: releases
// not yet reconciled, and wake events queued.
func (c *Controller) Pending() (released, queued int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.released), len(c.wake)
}

// SetupWithManager registers the controller (leader only, as every controller) and the
// index it releases holds through.
func (c *Controller) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &record.HealthRecord{}, IndexHeldOn, HeldOn); err != nil {
		return fmt.Errorf("indexing healthrecords by %s: %w", IndexHeldOn, err)
	}
	if err := mgr.Add(c); err != nil { // leader only: marks when releases are queued
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("deferral").
		// The router's memory of a NodeClaim is its HealthRecord of the same name; a NodeClaim
		// deleting or gone ends it (the sweep, where the garbage collector has not). The
		// records of Nodes (router/nodedrain's) are not NodeClaims': passed by, never swept.
		For(&record.HealthRecord{}, builder.WithPredicates(record.OfClaims())).
		Watches(&karpv1.NodeClaim{}, &handler.EnqueueRequestForObject{}, builder.WithPredicates(record.ClaimEnds())).
		WatchesRawSource(source.Channel(c.wake, &handler.EnqueueRequestForObject{})).
		// SkipNameValidation: the router runs one manager per process, but tests, drills and
		// the bench run several routers in one process, each with this controller.
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrentReconciles, SkipNameValidation: ptr.To(true)}).
		Complete(c)
}

// Deferred returns the number of active deferrals, for the gauge.
func (c *Controller) Deferred() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.active {
		n += k
	}
	return float64(n)
}

// Reconcile decides a NodeClaim's due deferrals again, prunes the ended ones, confirms a
// forwarded drain, and requeues the NodeClaim at its next deferral.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.kube.Get(ctx, req.NamespacedName, nc); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(req.Name)
			hr := &record.HealthRecord{}
			if err := c.kube.Get(ctx, req.NamespacedName, hr); err == nil && !hr.OfClaim() {
				return reconcile.Result{}, nil // a Node's record or the ledger (a wake can name one): not a NodeClaim's to sweep
			}
			// Gone: so is what the router kept for it (the garbage collector removes an owned
			// HealthRecord too; this sweeps one it has not, or one with no owner).
			return reconcile.Result{}, c.signal.Store().Delete(ctx, req.Name)
		}
		return reconcile.Result{}, err
	}
	now := c.clock.Now()
	if !nc.DeletionTimestamp.IsZero() {
		c.forget(nc.Name) // being drained: its deferrals end with it
		return reconcile.Result{}, nil
	}
	mem, err := c.signal.Store().Get(ctx, nc.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if mem.Drain != nil {
		at := mem.Drain.At
		// Signalled, not deleting yet: Karpenter must act on a forward (or the router's own
		// DELETE must land) within the bound; past it the router deletes the NodeClaim.
		c.forget(nc.Name)
		if waited := now.Sub(at); waited < c.confirm {
			return reconcile.Result{RequeueAfter: c.confirm - waited}, nil
		}
		forwarded, err := c.signal.Fallback(ctx, nc, now.Sub(at))
		if err != nil {
			return reconcile.Result{}, err
		}
		if forwarded {
			c.log.Warn("Karpenter did not act on a forwarded drain: deleted the NodeClaim", "nodeclaim", nc.Name, "waited", now.Sub(at))
			c.metrics.ForwardUnconfirmed.Inc()
		}
		return reconcile.Result{}, nil
	}

	c.mu.Lock()
	released := c.released[nc.Name]
	delete(c.released, nc.Name)
	c.mu.Unlock()
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	ended, active := false, 0
	var errs []error // one record that fails does not hold back the others
	for _, d := range mem.Records {
		if !d.Active() {
			if now.Before(d.KeptUntil()) {
				later(d.KeptUntil())
			} else {
				ended = true
			}
			continue
		}
		due := !now.Before(d.Until) || (released && d.Hold != "" && releasable[d.Hold])
		if !due {
			active++
			later(d.Until)
			continue
		}
		dec, err := c.pipeline.Redecide(ctx, nc, d)
		if errors.Is(err, pipeline.ErrBadRecord) {
			c.log.Error("dropping a deferral that can never be decided", "nodeclaim", nc.Name, "event_id", d.EventID, "err", err)
			if err := c.signal.Drop(ctx, nc, d.EventID, err.Error()); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deciding deferral %s of nodeclaim %s again: %w", d.EventID, nc.Name, err))
			continue
		}
		if dec.Action == policy.ActionDefer {
			active++
			later(dec.Until)
		}
	}
	if ended && len(errs) == 0 {
		if err := c.signal.Prune(ctx, nc, now); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("pruning ended deferrals of nodeclaim %s: %w", nc.Name, err))
		}
	}
	if len(errs) > 0 {
		return reconcile.Result{}, errors.Join(errs...)
	}
	c.mu.Lock()
	if active > 0 {
		c.active[nc.Name] = active
	} else {
		delete(c.active, nc.Name)
	}
	c.mu.Unlock()
	if next.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: max(next.Sub(now), time.Second)}, nil
}

func (c *Controller) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.active, name)
	delete(c.released, name)
}

// DrainFinished is called when a NodeClaim of pool is gone: pacing reads the pool again and
// releases as many held drains as the pool's limit now allows (a drain with drain-settle
// keeps its slot until it settles; the Rechecker releases then).
func (c *Controller) DrainFinished(ctx context.Context, pool, nodeClaim string) {
	c.engine.DrainFinished(pool, nodeClaim, c.clock.Now())
	if !c.Leading() {
		return
	}
	if err := c.ReleasePool(ctx, pool); err != nil {
		c.log.Error("releasing drains held by pacing", "nodepool", pool, "err", err)
	}
}

// ReleasePool releases, oldest first, as many of pool's drains held by pacing as its
// max-concurrent-drains allows now: each recheck costs what it releases, not a pass over
// every held instance.
func (c *Controller) ReleasePool(ctx context.Context, pool string) error {
	free, paced, err := c.engine.FreeDrains(ctx, pool, c.clock.Now())
	if err != nil || !paced || free == 0 {
		return err
	}
	held, err := c.held(ctx, PoolKey(pool))
	if err != nil {
		return err
	}
	sort.Slice(held, func(i, j int) bool {
		if !held[i].until.Equal(held[j].until) {
			return held[i].until.Before(held[j].until)
		}
		return held[i].name < held[j].name
	})
	c.release(held[:min(free, len(held))])
	return nil
}

// ReleaseImage releases the drains held by the AMI check on image (it became available).
func (c *Controller) ReleaseImage(ctx context.Context, image string) error {
	held, err := c.held(ctx, ImageKey(image))
	if err != nil {
		return err
	}
	c.release(held)
	return nil
}

// ReleasePDB releases the drains held on a PodDisruptionBudget (it allows disruptions again,
// or is gone): each is decided again, and goes if every gate lets it.
func (c *Controller) ReleasePDB(ctx context.Context, namespace, name string) error {
	held, err := c.held(ctx, "pdb/"+namespace+"/"+name)
	if err != nil {
		return err
	}
	c.release(held)
	return nil
}

// ImageChanged is the engine's image listener: an image that became available releases the
// drains waiting on it.
func (c *Controller) ImageChanged(ctx context.Context, id, state string) {
	if state != "available" {
		return
	}
	if err := c.ReleaseImage(ctx, id); err != nil {
		c.log.Error("releasing drains held on an image", "image", id, "err", err)
	}
}

type heldClaim struct {
	name  string // the NodeClaim's (and its HealthRecord's)
	until time.Time
}

// held returns the NodeClaims held on key, each with its earliest until. They are the
// cache's own objects, not copies (read them, never change them): a paced pool releasing one
// drain at a time would otherwise copy every held NodeClaim at each finished drain.
func (c *Controller) held(ctx context.Context, key string) ([]heldClaim, error) {
	var hrs record.HealthRecordList
	if err := c.kube.List(ctx, &hrs, client.MatchingFields{IndexHeldOn: key}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing healthrecords held on %s: %w", key, err)
	}
	out := make([]heldClaim, 0, len(hrs.Items))
	for i := range hrs.Items {
		h := heldClaim{name: hrs.Items[i].Name}
		for _, d := range hrs.Items[i].Status.Records {
			if d.Active() && (h.until.IsZero() || d.Until.Before(h.until)) {
				h.until = d.Until
			}
		}
		out = append(out, h)
	}
	return out, nil
}

func (c *Controller) release(held []heldClaim) {
	if !c.Leading() {
		return // the leader's own informers release; a standby's queue is never read
	}
	for _, h := range held {
		c.mu.Lock()
		c.released[h.name] = true // before the wake: its Reconcile reads it
		c.mu.Unlock()
		select {
		case c.wake <- ctrlevent.TypedGenericEvent[client.Object]{Object: &record.HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: h.name}}}:
		default:
			c.mu.Lock()
			delete(c.released, h.name)
			c.mu.Unlock()
			c.metrics.WakesDropped.Inc()
		}
	}
}

// Rechecker releases, every interval, the drains held by pacing in every pool that paces: a
// safety net for a finished drain whose deletion was missed (a restart, a watch gap).
type Rechecker struct {
	c        *Controller
	pools    client.Reader
	interval time.Duration
}

// NewRechecker returns the periodic release of paced drains.
func (c *Controller) NewRechecker(pools client.Reader, interval time.Duration) *Rechecker {
	return &Rechecker{c: c, pools: pools, interval: interval}
}

// NeedLeaderElection: only the leader releases.
func (r *Rechecker) NeedLeaderElection() bool { return true }

// Start runs until ctx is done.
func (r *Rechecker) Start(ctx context.Context) error {
	t := r.c.clock.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		var pools karpv1.NodePoolList
		if err := r.pools.List(ctx, &pools); err != nil {
			r.c.log.Error("listing nodepools to release paced drains", "err", err)
			continue
		}
		for i := range pools.Items {
			if pools.Items[i].Annotations[policy.AnnotationMaxConcurrentDrains] == "" {
				continue
			}
			if err := r.c.ReleasePool(ctx, pools.Items[i].Name); err != nil {
				r.c.log.Error("releasing drains held by pacing", "nodepool", pools.Items[i].Name, "err", err)
			}
		}
	}
}
