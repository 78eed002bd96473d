package inplace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/record"
)

// Kubernetes Event reasons, on the NodeClaim and its Node.
const (
	// ReasonBegun: a run began: the plan, and when AWS acts.
	ReasonBegun = "HealthEventRebootInPlaceBegun"
	// ReasonRebooting: the router rebooted the instance (RebootInstances), or, when AWS
	// reboots, the Node went NotReady after the event's start.
	ReasonRebooting = "HealthEventRebootInPlaceRebooting"
	// ReasonRebootFailed (Warning): RebootInstances kept failing; AWS reboots the instance
	// at the event's start, and the run waits for that.
	ReasonRebootFailed = "HealthEventRebootInPlaceRebootFailed"
	// ReasonDone: the Node is Ready again after the reboot, uncordoned; the node was kept.
	ReasonDone = "HealthEventRebootInPlaceDone"
	// ReasonFallback (Warning): the run gave up keeping the node: why, and that the node is
	// replaced through the pool's ordinary drain.
	ReasonFallback = "HealthEventRebootInPlaceFallback"
	// ReasonMigrated: the router's reboot of a system-reboot moved the instance to new
	// hardware (reboot migration): EC2 no longer shows the event.
	ReasonMigrated = "HealthEventRebootInPlaceMigrated"
	// ReasonNotMigrated (Warning): EC2 still shows the system-reboot after the router's
	// reboot: AWS reboots the instance at the start, and the run waits for that.
	ReasonNotMigrated = "HealthEventRebootInPlaceNotMigrated"
	// ReasonCancelled: the maintenance was cancelled before the reboot: the Node goes back
	// into service.
	ReasonCancelled = "HealthEventRebootInPlaceCancelled"
	// ReasonRefused (Warning): the run's record names another instance or Node than its
	// NodeClaim's own: written by someone else, it is left alone. Or, before the router's
	// RebootInstances, EC2 does not show the maintenance the run is for: not rebooted, the
	// Node is given back and the run ends.
	ReasonRefused = "HealthEventRebootInPlaceRefused"
)

// ErrBusy: the node is being rebooted already: the NodeClaim has a run of another maintenance
// in progress, or Karpenter is rebooting it (its Rebooting condition). One reboot at a time:
// the caller holds the event until that one ends (it is not handled by the one in progress).
var ErrBusy = errors.New("another reboot of the node is in progress")

// eventAction is the action of every Event this package posts.
const eventAction = "RebootInPlace"

// Outcomes, as the runs metric labels them.
const (
	OutcomeDone     = "done"
	OutcomeFallback = "fallback"
)

// again is how soon a run whose step changed is looked at again. The write of its annotation
// brings it back sooner through the watch; this is in case the watch is slow.
const again = time.Second

// maxConcurrentReconciles is how many runs progress at once: an eviction round waits for
// up to Options.EvictRound, and runs of different nodes must not wait on each other.
const maxConcurrentReconciles = 4

// RebootAPI is the part of EC2 the run uses: the reboot, and the instance's scheduled events,
// which confirm the maintenance before it (DescribeInstanceStatus, the call the poller makes:
// the role has it). An EC2 that also has DescribeInstances (instancesAPI: the SDK's client)
// lets a system-reboot run use reboot migration.
type RebootAPI interface {
	RebootInstances(context.Context, *ec2.RebootInstancesInput, ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error)
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// instancesAPI shows an instance's reboot-migration setting (maintenanceOptions). It is
// optional, so that an EC2 stand-in without it keeps today's behaviour: AWS reboots a
// system-reboot at its start.
type instancesAPI interface {
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
}

// Fallback replaces the node when the run cannot keep it (the router wires the pool's
// ordinary drain through Karpenter). It is called at least once per run that falls back,
// and may be called again (after a failure to record that it was), so it must be
// idempotent. nc is the NodeClaim as read from the API server.
type Fallback func(ctx context.Context, nc *karpv1.NodeClaim, st State, why string) error

// Runner carries out reboots in place: Begin records a run on a NodeClaim, and Reconcile
// (a controller over NodeClaims with a run, on the leader) moves it on, one step per call.
type Runner struct {
	kube     client.Client // writes NodeClaims and Nodes
	api      client.Reader // reads them fresh: the cache trims Nodes' status and Karpenter's annotations
	store    *record.Store // the run, in the NodeClaim's HealthRecord
	evictor  Evictor
	ec2      RebootAPI
	clock    clock.Clock
	recorder events.EventRecorder
	log      *slog.Logger
	fallback Fallback
	opts     Options

	runs       *prometheus.CounterVec
	inProgress prometheus.Gauge
	refused    prometheus.Counter
	mu         sync.Mutex
	active     map[string]bool // NodeClaims whose run this process saw in progress
}

// New returns a Runner. kube writes; api reads without a cache (a Node's conditions and a
// NodeClaim's Karpenter annotations are not in the router's cache). reg may be nil.
func New(kube client.Client, api client.Reader, evict Evictor, ec2 RebootAPI, clk clock.Clock, rec events.EventRecorder, log *slog.Logger,
	reg prometheus.Registerer, fallback Fallback, opts Options) *Runner {
	r := &Runner{kube: kube, api: api, store: record.NewStore(kube, api), evictor: evict, ec2: ec2, clock: clk, recorder: rec, log: log, fallback: fallback, opts: opts.withDefaults(),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.InPlaceRuns,
			Help: "Reboots in place that ended, by outcome: done (the node was kept, Ready again) or fallback (the node is replaced through the pool's ordinary drain)."},
			[]string{metrics.LabelOutcome}),
		inProgress: prometheus.NewGauge(prometheus.GaugeOpts{Name: metrics.InPlaceInProgress,
			Help: "Reboots in place in progress, as this router (the leader) carries them out."}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: metrics.InPlaceRefused,
			Help: "Reboot-in-place runs refused: records left alone because they name another instance or Node than their NodeClaim's own, and reboots not made because EC2 does not show the maintenance the run is for."}),
		active: map[string]bool{},
	}
	for _, o := range []string{OutcomeDone, OutcomeFallback} {
		r.runs.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(r.runs, r.inProgress, r.refused)
	}
	return r
}

// Begin records a run of a reboot in place on the NodeClaim for the scheduled event ev, and
// puts karpenter.sh/do-not-disrupt on it (noting whether it was there), in one write under
// the NodeClaim's resource version; the controller takes it from there. It is idempotent:
// already=true, and nothing written, when the NodeClaim has a run in progress of the same
// event (same event ID or ARN, or the same maintenance: type and start) or a run that ended
// for it at the same start. For a run in progress of the same event that was rescheduled, the
// new start (and end) is recorded (Options.Postponed). A run in progress of another
// maintenance fails Begin with ErrBusy (one run at a time); a run that ended is replaced by a
// run of another event, or of the same one at another start (AWS postponed it).
func (r *Runner) Begin(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (already bool, err error) {
	typ, start, end, arn, err := scheduledOf(ev)
	if err != nil {
		return false, fmt.Errorf("beginning a reboot in place of nodeclaim %s: %w", nc.Name, err)
	}
	now := r.clock.Now()
	var begun State
	var node *corev1.Node
	busy := ""
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		already, begun, node, busy = false, State{}, nil, ""
		cur := &karpv1.NodeClaim{}
		if err := r.api.Get(ctx, client.ObjectKey{Name: nc.Name}, cur); err != nil {
			return err
		}
		if !cur.DeletionTimestamp.IsZero() {
			return errors.New("the nodeclaim is being deleted")
		}
		st, ok, err := r.run(ctx, cur.Name)
		if err != nil {
			return err // a newer router's run, or a damaged one: overwriting it would lose it
		}
		prev := ""
		if ok {
			prev = encode(st)
			same := st.EventID == ev.ID || (arn != "" && st.EventARN == arn) || (st.Type == typ && st.Start.Equal(start))
			switch {
			case same && !st.Over() && (!st.Start.Equal(start) || !st.End.Equal(end)):
				already = true
				r.log.Info("reboot in place rescheduled", "nodeclaim", cur.Name, "event_id", ev.ID, "start", start, "former_start", st.Start)
				next := r.opts.Postponed(st, start, end, now)
				return conflictOnChange(cur.Name, r.write(ctx, cur, prev, next))
			case same && !st.Over():
				already = true
				return nil
			case !st.Over():
				busy = "the router's reboot in place of " + st.EventID
				return nil
			case same && st.Start.Equal(start):
				already = true // the run of this maintenance at this start is over
				return nil
			}
		}
		if KarpenterRebooting(cur) {
			// One reboot at a time: Karpenter's own (node repair) ends within its deadlines, or
			// replaces the node; the event is held and decided again meanwhile.
			busy = "Karpenter is rebooting the node (its Rebooting condition is true)"
			return nil
		}
		instance := cluster.InstanceID(cur.Status.ProviderID)
		if instance == "" {
			return errors.New("the nodeclaim has no instance yet")
		}
		if len(ev.Instances) > 0 && !slices.Contains(ev.Instances, instance) {
			return fmt.Errorf("event %s does not name instance %s", ev.ID, instance)
		}
		if cur.Status.NodeName == "" {
			return errors.New("the nodeclaim has no node yet")
		}
		node = &corev1.Node{}
		if err := r.api.Get(ctx, client.ObjectKey{Name: cur.Status.NodeName}, node); err != nil {
			return fmt.Errorf("reading node %s: %w", cur.Status.NodeName, err)
		}
		st = State{Version: Version, EventID: ev.ID, EventARN: arn, Type: typ, Instance: instance, Node: cur.Status.NodeName,
			Start: start, End: end, MovedFrom: ev.MovedFrom.UTC(), Began: now, StepSince: now}
		st.Step = r.opts.FirstStep(st, now)
		st.Protected = cur.Annotations[karpv1.DoNotDisruptAnnotationKey] != "true"
		st.RepairVetoed = cur.Annotations[karpv1.DoNotRepairAnnotationKey] != "true"
		begun = st
		// The run first (what it will add is in it), then the vetoes: a stop between the two
		// leaves a run that protects its Node (the Node's vetoes are what Karpenter reads) and
		// undoes only what is there.
		if err := conflictOnChange(cur.Name, r.write(ctx, cur, prev, st)); err != nil {
			return err
		}
		return r.patchClaim(ctx, cur, func(a map[string]string) {
			a[karpv1.DoNotDisruptAnnotationKey] = "true"
			a[karpv1.DoNotRepairAnnotationKey] = "true"
		})
	})
	if err != nil {
		return false, fmt.Errorf("beginning a reboot in place of nodeclaim %s: %w", nc.Name, err)
	}
	if busy != "" {
		return false, fmt.Errorf("beginning a reboot in place of nodeclaim %s for %s: %w (%s)", nc.Name, ev.ID, ErrBusy, busy)
	}
	if already {
		return true, nil
	}
	r.track(nc.Name, true)
	r.log.Info("reboot in place begun", "nodeclaim", nc.Name, "node", begun.Node, "instance", begun.Instance, "event_id", ev.ID, "kind", typ, "start", start)
	then := "wait for AWS's reboot at the start"
	if typ == event.ScheduledSystemReboot {
		then = "reboot the instance itself where EC2 offers reboot migration (which clears the event), else wait for AWS's reboot at the start"
	}
	if typ == event.ScheduledInstanceReboot {
		then = "reboot the instance (EC2 RebootInstances)"
	}
	from := "now"
	if begun.Step == StepWait {
		from = "from " + stamp(r.opts.PrepareAt(begun))
	}
	r.post([]runtime.Object{nc, node}, corev1.EventTypeNormal, ReasonBegun,
		"%s (%s): the router keeps this node through the reboot: cordon %s, evict its pods (budgets respected) by %s, %s, uncordon once Ready; AWS acts at %s",
		typ, ev.ID, from, stamp(r.opts.EvictBy(begun)), then, stamp(start))
	return false, nil
}

// Cancel ends the NodeClaim's run of the maintenance that ev closes (a closed AWS Health
// event, a [Canceled] or [Completed] EC2 event: the same event ID or ARN, or the same type at
// its start or the start the router moved it from), if the reboot has not begun (Cancelled):
// the run gives the Node back and ends. It reports whether it did; a run of another
// maintenance, or one whose reboot is under way, is left as it is. It reads the NodeClaim fresh and writes under its resource version.
func (r *Runner) Cancel(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (bool, error) {
	var arn string
	var typ event.ScheduledType
	if ev.Health != nil {
		arn, typ = ev.Health.EventARN, ev.Health.Scheduled
	}
	now := r.clock.Now()
	cancelled := false
	var ended State
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cancelled = false
		cur := &karpv1.NodeClaim{}
		if err := r.api.Get(ctx, client.ObjectKey{Name: nc.Name}, cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		st, ok, err := r.run(ctx, cur.Name)
		if err != nil || !ok {
			return nil // none, or not this router's to change
		}
		at := !ev.Deadline.IsZero() && (st.Start.Equal(ev.Deadline) || st.MovedFrom.Equal(ev.Deadline))
		same := st.EventID == ev.ID || (arn != "" && st.EventARN == arn) || (at && (typ == "" || typ == st.Type))
		if !same {
			return nil
		}
		next, reached := Cancelled(st, fmt.Sprintf("%s (%s) closed the maintenance", ev.Kind, ev.ID), now)
		if !reached {
			return nil
		}
		cancelled, ended = true, next
		return conflictOnChange(cur.Name, r.write(ctx, cur, encode(st), next))
	})
	if err != nil {
		return false, fmt.Errorf("cancelling the reboot in place of nodeclaim %s: %w", nc.Name, err)
	}
	if cancelled {
		r.log.Info("reboot in place cancelled", "nodeclaim", nc.Name, "event_id", ev.ID, "run", ended.EventID, "step", ended.Step)
		r.post([]runtime.Object{nc}, corev1.EventTypeNormal, ReasonCancelled, "%s (%s): %s; the node goes back into service", ended.Type, ended.EventID, ended.Why)
	}
	return cancelled, nil
}

// scheduledOf returns what a run needs of a scheduled event: a reboot-type event, open,
// with a start.
func scheduledOf(ev event.Event) (typ event.ScheduledType, start, end time.Time, arn string, err error) {
	if ev.ID == "" {
		return "", time.Time{}, time.Time{}, "", errors.New("an event without an ID")
	}
	if ev.Kind != event.KindScheduledChange || ev.Health == nil {
		return "", time.Time{}, time.Time{}, "", fmt.Errorf("event %s is a %s, not a scheduled change", ev.ID, ev.Kind)
	}
	h := ev.Health
	if !slices.Contains(Types, h.Scheduled) {
		return "", time.Time{}, time.Time{}, "", fmt.Errorf("event %s: AWS does not keep the instance through %q (%s)", ev.ID, h.Scheduled, h.TypeCode)
	}
	if h.Status == event.HealthClosed {
		return "", time.Time{}, time.Time{}, "", fmt.Errorf("event %s is closed", ev.ID)
	}
	start = ev.Deadline
	if start.IsZero() {
		start = h.Start
	}
	if start.IsZero() {
		return "", time.Time{}, time.Time{}, "", fmt.Errorf("event %s has no start", ev.ID)
	}
	return h.Scheduled, start, h.End, h.EventARN, nil
}

// SetupWithManager runs the Runner as a controller over the NodeClaims that carry a run, on
// the leader (controller-runtime's default for controllers).
func (r *Runner) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("inplace").
		// The run is in the NodeClaim's HealthRecord (same name). No watch of NodeClaims: a
		// pass reads the NodeClaim from the API server, and every deletion in a burst of Spot
		// reclaims would cost two uncached reads; the run's own requeue and its record's
		// deletion with the NodeClaim end what this process tracks.
		For(&record.HealthRecord{}, builder.WithPredicates(runChanged())).
		// SkipNameValidation: the router runs one manager per process, but tests run several.
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrentReconciles, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

// runChanged passes a HealthRecord that holds a run when it appears (every one, when the
// controller starts: that is how a new leader resumes) and when its run changes.
func runChanged() predicate.Funcs {
	run := func(o client.Object) string {
		if hr, ok := o.(*record.HealthRecord); ok {
			return string(hr.Status.Run)
		}
		return ""
	}
	return predicate.Funcs{
		CreateFunc: func(e ctrlevent.CreateEvent) bool { return run(e.Object) != "" },
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			return run(e.ObjectNew) != "" && run(e.ObjectOld) != run(e.ObjectNew)
		},
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return true }, // to forget it
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
	}
}

// Reconcile moves the NodeClaim's run on by one step: it reads the NodeClaim and its Node
// from the API server, carries out the step's action, records what Next decides, and says
// when to look again.
func (r *Runner) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := r.api.Get(ctx, req.NamespacedName, nc); err != nil {
		if apierrors.IsNotFound(err) {
			r.track(req.Name, false)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading nodeclaim %s: %w", req.Name, err)
	}
	st, ok, err := r.run(ctx, nc.Name)
	if err != nil && !errors.Is(err, errUnreadableRun) {
		return reconcile.Result{}, err
	}
	if err != nil {
		// Kept as it is: a newer router's run, or one edited beyond use, is not this one's.
		r.log.Warn("reboot in place left alone: its record cannot be read", "nodeclaim", nc.Name, "error", err)
		r.track(nc.Name, false)
		return reconcile.Result{}, nil
	}
	if !ok || st.Over() || !nc.DeletionTimestamp.IsZero() {
		// Over, or Karpenter is terminating the NodeClaim (the node goes, and what the run
		// changed on it with it).
		r.track(nc.Name, false)
		return reconcile.Result{}, nil
	}
	log := r.log.With("nodeclaim", nc.Name, "node", st.Node, "instance", st.Instance, "event_id", st.EventID, "kind", st.Type)
	if id := cluster.InstanceID(nc.Status.ProviderID); st.Instance != id || st.Node != nc.Status.NodeName {
		// Trust what the NodeClaim is, not what an annotation says it is: a run names only its
		// own NodeClaim's instance and Node (Begin writes them from there). Anyone who may
		// patch NodeClaims could otherwise reboot any instance of the account, or cordon and
		// empty any Node.
		r.track(nc.Name, false)
		r.refused.Inc()
		log.Warn("reboot in place left alone: its record names another instance or node than its nodeclaim", "claim_instance", id, "claim_node", nc.Status.NodeName)
		r.post([]runtime.Object{nc}, corev1.EventTypeWarning, ReasonRefused,
			"the run in healthrecord %s names instance %q and node %q, but this NodeClaim is instance %q on node %q: left alone, nothing rebooted, cordoned or evicted",
			nc.Name, st.Instance, st.Node, id, nc.Status.NodeName)
		return reconcile.Result{}, nil
	}
	r.track(nc.Name, true)

	node := &corev1.Node{}
	if err := r.api.Get(ctx, client.ObjectKey{Name: st.Node}, node); apierrors.IsNotFound(err) {
		node = nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("reading node %s: %w", st.Node, err)
	}
	obs := Observation{Node: NodeStatusOf(node), KarpenterRebooting: KarpenterRebooting(nc)}
	now := r.clock.Now()
	askedBefore := st.Step == StepReboot && !st.RebootAsked.IsZero()
	if st.Step == StepReboot && !askedBefore && node != nil && !Held(st, obs) {
		// Write-ahead: the call is recorded as asked before it goes out, so that a pass
		// whose record of the outcome fails never reboots the instance a second time.
		asked := st
		asked.RebootAsked = now
		switch err := r.record(ctx, nc, st, asked); {
		case errors.Is(err, errRunChanged):
			return reconcile.Result{RequeueAfter: again}, nil
		case err != nil:
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("recording the reboot of nodeclaim %s before it: %w", nc.Name, err))
		}
		st = asked
	}
	if st.Step == StepCordon && node != nil && !Held(st, obs) && !st.changesRecordedFor(node) {
		// Write-ahead: what the cordon changes on the Node is recorded before the patch, so
		// that the run alone says what to undo, whenever the pass stops.
		asked := st
		asked.NodeChanges = changesOf(node)
		switch err := r.record(ctx, nc, st, asked); {
		case errors.Is(err, errRunChanged):
			return reconcile.Result{RequeueAfter: again}, nil
		case err != nil:
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("recording what the cordon of nodeclaim %s changes before it: %w", nc.Name, err))
		}
		st = asked
	}
	r.act(ctx, nc, node, st, now, &obs, log, askedBefore)
	d := Next(st, obs, now, r.opts)
	if encode(d.State) != encode(st) {
		switch err := r.record(ctx, nc, st, d.State); {
		case errors.Is(err, errRunChanged):
			return reconcile.Result{RequeueAfter: again}, nil // decided again from what was written
		case apierrors.IsNotFound(err):
			r.track(nc.Name, false)
			if d.State.Over() {
				r.ended(nc, node, d.State, log) // the fallback may have deleted the NodeClaim
			}
			return reconcile.Result{}, nil
		case err != nil:
			return reconcile.Result{}, fmt.Errorf("recording the reboot in place of nodeclaim %s: %w", nc.Name, err)
		}
		if obs.Unscheduled != "" && d.State.Step != st.Step {
			r.refused.Inc()
			log.Warn("reboot in place: not rebooted, EC2 does not show the maintenance", "why", obs.Unscheduled)
			r.post([]runtime.Object{nc, node}, corev1.EventTypeWarning, ReasonRefused,
				"%s (%s): not rebooted: %s. The node is given back into service and the run ends", st.Type, st.EventID, obs.Unscheduled)
		}
		r.announce(nc, node, st, d.State, log)
	}
	wait := d.Wait
	if wait <= 0 {
		wait = again
	}
	return reconcile.Result{RequeueAfter: wait}, nil
}

// act carries out the action of the run's step and notes its outcome in obs. There is none
// for a Node that is gone, but Fallback is called all the same.
func (r *Runner) act(ctx context.Context, nc *karpv1.NodeClaim, node *corev1.Node, st State, now time.Time, obs *Observation, log *slog.Logger, askedBefore bool) {
	if (node == nil && st.Step != StepFallback) || Held(st, *obs) {
		return
	}
	if AsksMigration(st) {
		obs.Migration, obs.MigrationWhy = r.migration(ctx, st)
	}
	switch st.Step {
	case StepWait:
		// The Node serves until the run prepares it.
	case StepRelease:
		obs.Err = r.restore(ctx, node, st, true)
	case StepCordon:
		m, err := r.cordon(ctx, node, st)
		obs.Cordoned, obs.NodeProtected, obs.NodeRepairVetoed, obs.Err = m.Cordoned, m.Protected, m.RepairVetoed, err
	case StepEvict:
		end := now.Add(r.opts.EvictRound)
		if by := r.opts.EvictBy(st); by.After(now) && by.Before(end) {
			end = by
		}
		obs.Left, obs.Refused, obs.Err = r.evictor.Evict(ctx, st.Node, end)
	case StepReboot:
		if askedBefore {
			break // an earlier pass asked, and its outcome went unrecorded: not asked again
		}
		// Confirm before the irreversible call: the run's record is a claim (anyone who may
		// patch NodeClaims can write one for the NodeClaim's own instance), EC2's scheduled
		// event is the fact.
		if obs.Unscheduled, obs.Err = r.confirm(ctx, st); obs.Err == nil && obs.Unscheduled == "" {
			obs.Err = r.reboot(ctx, st)
		}
	case StepConfirm:
		obs.Unscheduled, obs.Err = r.confirm(ctx, st)
	case StepUncordon:
		obs.Err = r.restore(ctx, node, st, true)
	case StepFallback:
		if node != nil {
			obs.Err = r.restore(ctx, node, st, false) // the node is being replaced: it stays cordoned
		}
		if obs.Err == nil {
			if r.fallback == nil {
				log.Warn("reboot in place fallen back with no fallback to call", "why", st.Why)
			} else if err := r.fallback(ctx, nc, st, st.Why); err != nil {
				obs.Err = fmt.Errorf("fallback: %w", err)
			}
		}
	}
}

// confirm asks EC2 whether it still shows the maintenance the run is for, before the router
// reboots the instance: an open scheduled event of the run's type, with EC2's event ID the run
// recorded (a run the poller began) or the run's start (a run AWS Health began: the start is
// how a Health event and EC2's event are one maintenance, as in the records). It returns why
// not when EC2 does not show it (unscheduled), and an error when EC2 does not answer: then
// the reboot is not made either (a failed attempt, retried with backoff; AWS reboots at the
// start if the maintenance is real).
func (r *Runner) confirm(ctx context.Context, st State) (unscheduled string, err error) {
	if r.ec2 == nil {
		return "", errors.New("no EC2 client")
	}
	out, err := r.ec2.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{InstanceIds: []string{st.Instance}, IncludeAllInstances: aws.Bool(true)})
	if err != nil {
		if ae := smithy.APIError(nil); errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound" {
			return fmt.Sprintf("EC2 shows no instance %s", st.Instance), nil
		}
		return "", fmt.Errorf("confirming the %s of instance %s with EC2 (DescribeInstanceStatus): %w", st.Type, st.Instance, err)
	}
	for _, is := range out.InstanceStatuses {
		if aws.ToString(is.InstanceId) != st.Instance {
			continue
		}
		for _, e := range is.Events {
			if string(e.Code) != string(st.Type) || event.ClosedDescription(aws.ToString(e.Description)) {
				continue
			}
			if (st.EventARN != "" && aws.ToString(e.InstanceEventId) == st.EventARN) || aws.ToTime(e.NotBefore).Truncate(time.Second).Equal(st.Start) {
				return "", nil
			}
		}
	}
	return fmt.Sprintf("EC2 shows no open %s of instance %s at %s: the maintenance the run is for is not EC2's", st.Type, st.Instance, stamp(st.Start)), nil
}

// migration asks EC2 whether the instance offers reboot migration (its
// maintenanceOptions.rebootMigration is "default"). Anything else, and a failed call, is
// MigrationOff: AWS reboots the instance at the start, as without migration.
func (r *Runner) migration(ctx context.Context, st State) (Migration, string) {
	api, ok := r.ec2.(instancesAPI)
	if !ok {
		return MigrationOff, "the router's EC2 client does not describe instances"
	}
	out, err := api.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{st.Instance}})
	if err != nil {
		return MigrationOff, fmt.Sprintf("DescribeInstances of %s failed: %v", st.Instance, err)
	}
	for _, res := range out.Reservations {
		for _, in := range res.Instances {
			if aws.ToString(in.InstanceId) != st.Instance {
				continue
			}
			var m ec2types.InstanceRebootMigrationState
			if in.MaintenanceOptions != nil {
				m = in.MaintenanceOptions.RebootMigration
			}
			switch m {
			case ec2types.InstanceRebootMigrationStateDefault:
				return MigrationOn, "EC2: rebootMigration default: the router's reboot moves the instance to new hardware and clears the event"
			case "":
				return MigrationOff, "EC2 reports no rebootMigration for the instance (not supported)"
			default:
				return MigrationOff, fmt.Sprintf("EC2: rebootMigration %s", m)
			}
		}
	}
	return MigrationOff, fmt.Sprintf("DescribeInstances does not show instance %s", st.Instance)
}

func (r *Runner) reboot(ctx context.Context, st State) error {
	if r.ec2 == nil {
		return errors.New("no EC2 client")
	}
	if _, err := r.ec2.RebootInstances(ctx, &ec2.RebootInstancesInput{InstanceIds: []string{st.Instance}}); err != nil {
		return fmt.Errorf("rebooting instance %s: %w", st.Instance, err)
	}
	return nil
}

// cordon makes the Node unschedulable and puts do-not-disrupt and do-not-repair on it (on a
// registered node Karpenter reads the Node's, not the NodeClaim's), and writes the Node's
// mark (for people) in the same patch. What it changes is the run's NodeChanges, read from the
// Node and recorded before this patch (Reconcile's write-ahead), never a mark found there.
func (r *Runner) cordon(ctx context.Context, node *corev1.Node, st State) (nodeMark, error) {
	c := st.NodeChanges
	if !st.changesRecordedFor(node) {
		c = changesOf(node) // no write-ahead (a caller of act's own): as the Node is now
	}
	mark := nodeMark{EventID: st.EventID, Cordoned: c.Cordoned, Protected: c.Protected, RepairVetoed: c.RepairVetoed}
	err := r.patchNode(ctx, node, func(n *corev1.Node) {
		n.Spec.Unschedulable = true
		n.Annotations[karpv1.DoNotDisruptAnnotationKey] = "true"
		n.Annotations[karpv1.DoNotRepairAnnotationKey] = "true"
		n.Annotations[Annotation] = encodeMark(mark)
	})
	if err != nil {
		return nodeMark{}, fmt.Errorf("cordoning node %s: %w", node.Name, err)
	}
	return mark, nil
}

// restore undoes on the Node what the run st changed (UndoNode) and removes its mark, in one
// patch; the cordon only when uncordon is set.
func (r *Runner) restore(ctx context.Context, node *corev1.Node, st State, uncordon bool) error {
	err := r.patchNode(ctx, node, func(n *corev1.Node) { UndoNode(n, st, uncordon) })
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restoring node %s: %w", node.Name, err)
	}
	return nil
}

// patchNode applies mutate to a copy of node and writes the difference as a merge patch
// under the Node's resource version (only what mutate changed: the router's marks and
// taints, written by router/upcoming, are left as they are); after a conflict it reads the
// Node fresh and applies mutate again.
func (r *Runner) patchNode(ctx context.Context, node *corev1.Node, mutate func(*corev1.Node)) error {
	cur := node
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if cur == nil {
			fresh := &corev1.Node{}
			if err := r.api.Get(ctx, client.ObjectKey{Name: node.Name}, fresh); err != nil {
				return err
			}
			cur = fresh
		}
		base, next := cur.DeepCopy(), cur.DeepCopy()
		cur = nil // a retry reads afresh
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		mutate(next)
		if equality.Semantic.DeepEqual(base.Spec, next.Spec) && equality.Semantic.DeepEqual(base.Annotations, next.Annotations) {
			return nil
		}
		return r.kube.Patch(ctx, next, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
}

// patchClaim changes the NodeClaim's annotations with a merge patch under its resource
// version.
func (r *Runner) patchClaim(ctx context.Context, nc *karpv1.NodeClaim, mutate func(map[string]string)) error {
	base, next := nc.DeepCopy(), nc.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	mutate(next.Annotations)
	return r.kube.Patch(ctx, next, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// errRunChanged: the run on the NodeClaim changed since the pass read it (a Begin recorded a
// new start): the pass's decision is dropped, and the next pass decides from what is there.
var errRunChanged = errors.New("the run changed meanwhile")

// record writes next over prev in the NodeClaim's HealthRecord (errRunChanged when the run
// there is no longer prev), and, when the run is over, removes from the NodeClaim the
// do-not-disrupt and do-not-repair it added (read fresh after a conflict).
func (r *Runner) record(ctx context.Context, nc *karpv1.NodeClaim, prev, next State) error {
	if err := r.write(ctx, nc, encode(prev), next); err != nil {
		return err
	}
	if !next.Over() {
		return nil
	}
	cur := nc
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if cur == nil {
			fresh := &karpv1.NodeClaim{}
			if err := r.api.Get(ctx, client.ObjectKey{Name: nc.Name}, fresh); err != nil {
				return err
			}
			cur = fresh
		}
		claim := cur
		cur = nil
		return r.patchClaim(ctx, claim, func(a map[string]string) {
			delete(a, Annotation) // a router's before the store
			undoClaim(next, a)
		})
	})
}

// errUnreadableRun marks a run this router cannot read (a newer router's, or damaged).
var errUnreadableRun = errors.New("a run this router cannot read")

// run reads the NodeClaim's run from its HealthRecord, as the API server holds it.
func (r *Runner) run(ctx context.Context, name string) (State, bool, error) {
	mem, err := record.Load(ctx, r.api, name)
	if errors.Is(err, record.ErrUnreadable) {
		return State{}, false, fmt.Errorf("%w: %w", errUnreadableRun, err)
	}
	if err != nil {
		return State{}, false, err
	}
	st, ok, err := Read(mem)
	if err != nil {
		return State{}, false, fmt.Errorf("%w: %w", errUnreadableRun, err)
	}
	return st, ok, nil
}

// write records next as the NodeClaim's run, if the run in its HealthRecord is still prev
// (encode of the run read; "" for none): errRunChanged otherwise.
func (r *Runner) write(ctx context.Context, nc *karpv1.NodeClaim, prev string, next State) error {
	return r.store.Update(ctx, nc, func(m *record.Memory) (bool, error) {
		cur := ""
		if st, ok, err := Read(*m); err != nil {
			return false, fmt.Errorf("%w: %w", errUnreadableRun, err)
		} else if ok {
			cur = encode(st)
		}
		if cur != prev {
			return false, errRunChanged
		}
		m.Run = json.RawMessage(encode(next))
		return true, nil
	})
}

// conflictOnChange turns errRunChanged into a conflict, for a RetryOnConflict that reads the
// run again.
func conflictOnChange(name string, err error) error {
	if errors.Is(err, errRunChanged) {
		return apierrors.NewConflict(record.GroupVersion.WithResource(record.Resource).GroupResource(), name, err)
	}
	return err
}

// announce logs a recorded change of the run, and posts the Events of its milestones.
func (r *Runner) announce(nc *karpv1.NodeClaim, node *corev1.Node, prev, next State, log *slog.Logger) {
	objs := []runtime.Object{nc, node}
	if next.Step != prev.Step {
		log.Info("reboot in place step", "step", next.Step, "from", prev.Step, "why", next.Why, "last_error", next.LastError)
	} else if next.LastError != "" {
		log.Info("reboot in place step unfinished", "step", next.Step, "attempts", next.Attempts, "error", next.LastError)
	}
	switch {
	case prev.Step == StepReboot && next.Step == StepAwait && !next.Rebooted.IsZero():
		migration := ""
		if next.Type == event.ScheduledSystemReboot {
			migration = " for reboot migration"
		}
		r.post(objs, corev1.EventTypeNormal, ReasonRebooting, "%s (%s): pods evicted; the router rebooted instance %s (EC2 RebootInstances)%s, and waits for the node to be Ready again (at most %s)",
			next.Type, next.EventID, next.Instance, migration, r.opts.ReadyTimeout)
	case prev.Step == StepConfirm && next.Step == StepUncordon:
		r.post(objs, corev1.EventTypeNormal, ReasonMigrated, "%s (%s): %s; the node goes back into service", next.Type, next.EventID, next.Why)
	case prev.Step == StepConfirm && next.Step != StepConfirm:
		log.Warn("reboot in place: the reboot migration did not clear the event", "why", next.MigrationWhy)
		r.post(objs, corev1.EventTypeWarning, ReasonNotMigrated, "%s (%s): %s; %s", next.Type, next.EventID, next.MigrationWhy, next.Why)
	case prev.Step == StepReboot && next.Step == StepAwait:
		r.post(objs, corev1.EventTypeWarning, ReasonRebootFailed, "%s (%s): %s (%s); the node stays cordoned and empty until then",
			next.Type, next.EventID, next.LastError, stamp(next.Start))
	case prev.Step == StepAwait && next.Step == StepReady && next.Rebooted.IsZero():
		r.post(objs, corev1.EventTypeNormal, ReasonRebooting, "%s (%s): the node went NotReady after the start %s: AWS's maintenance is under way; waiting for it to be Ready again (at most %s)",
			next.Type, next.EventID, stamp(next.Start), r.opts.ReadyTimeout)
	case prev.Step != StepFallback && next.Step == StepFallback:
		log.Warn("reboot in place falls back to replacing the node", "why", next.Why)
	}
	if next.Over() {
		r.ended(nc, node, next, log)
	}
}

// ended counts and announces a run that is over.
func (r *Runner) ended(nc *karpv1.NodeClaim, node *corev1.Node, next State, log *slog.Logger) {
	r.track(nc.Name, false)
	objs := []runtime.Object{nc, node}
	if next.Step == StepDone {
		r.runs.WithLabelValues(OutcomeDone).Inc()
		log.Info("reboot in place done", "outcome", next.Outcome, "began", next.Began)
		how := "Ready again after the reboot"
		if next.Why != "" {
			how = next.Why
		}
		r.post(objs, corev1.EventTypeNormal, ReasonDone, "%s (%s): the node is kept: %s; uncordoned and do-not-disrupt removed where the router set them (began %s)",
			next.Type, next.EventID, how, stamp(next.Began))
		return
	}
	r.runs.WithLabelValues(OutcomeFallback).Inc()
	log.Warn("reboot in place fell back", "outcome", next.Outcome)
	r.post(objs, corev1.EventTypeWarning, ReasonFallback, "%s (%s): the node is replaced through the pool's ordinary drain instead of kept: %s. It stays cordoned; do-not-disrupt removed",
		next.Type, next.EventID, next.Why)
}

// post posts an Event on each object that is there.
func (r *Runner) post(objs []runtime.Object, typ, reason, format string, args ...any) {
	if r.recorder == nil {
		return
	}
	for _, o := range objs {
		switch v := o.(type) {
		case *karpv1.NodeClaim:
			if v == nil {
				continue
			}
		case *corev1.Node:
			if v == nil {
				continue
			}
		}
		r.recorder.Eventf(o, nil, typ, reason, eventAction, format, args...)
	}
}

// track notes whether a NodeClaim's run is in progress, for the gauge.
func (r *Runner) track(name string, active bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if active {
		r.active[name] = true
	} else {
		delete(r.active, name)
	}
	r.inProgress.Set(float64(len(r.active)))
}
