// Package engine decides an event end to end: it resolves each instance through the
// cluster model, reads the NodePool's policy, decides, and runs the pre-signal checks on
// drains. The live intake and the replay tool share it.
package engine

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
)

// Engine decides events. It is safe for concurrent use: the instances of one event, and
// several events, may be decided in parallel; drain pacing holds across all of them.
type Engine struct {
	model   *cluster.Model
	checker *checks.Checker // nil: no checks
	pdbs    pdbGate         // nil: the PDB gate is not run
	alerts  alertGate       // nil: the alert gate is not run
	pacer   *pacer
	// unmanaged is the cluster's --unmanaged-nodes: what is done for a Node without a NodeClaim.
	unmanaged string
	// imageListeners are told of every EC2 AMI State Change, to drop what they cached.
	imageListeners []func(ctx context.Context, id, state string)
}

// Option configures an Engine.
type Option func(*Engine)

// WithImageListener registers f to be told the image and state of every EC2 AMI State Change
// event (the watchdog drops its cached state of that image; the deferral controller releases
// drains that wait on it).
func WithImageListener(f func(ctx context.Context, id, state string)) Option {
	return func(e *Engine) { e.imageListeners = append(e.imageListeners, f) }
}

// pdbGate is the PodDisruptionBudget gate (router/gates.PDB).
type pdbGate interface {
	Check(ctx context.Context, node string) (policy.Gate, error)
}

// alertGate is the Alertmanager gate (router/gates.Alerts).
type alertGate interface {
	Check(ctx context.Context, m *policy.AlertMatcher, onUnreachable string) policy.Gate
}

// WithGates gives the engine its gates: pdbs reads PodDisruptionBudgets of the pods on a node,
// alerts asks Alertmanager. Either may be nil: that gate is not run (replay without pods or
// alerts). The live router without an Alertmanager passes gates.NoAlertmanager, so that a pool
// asking for the alert gate finds it unreachable and its hold-while-alerts-unreachable decides.
func WithGates(pdbs pdbGate, alerts alertGate) Option {
	return func(e *Engine) { e.pdbs, e.alerts = pdbs, alerts }
}

// WithUnmanaged sets what the engine decides for a node Karpenter does not manage (a Node
// without a NodeClaim): policy.UnmanagedIgnore (the default) or policy.UnmanagedCordonDrain.
func WithUnmanaged(mode string) Option {
	return func(e *Engine) { e.unmanaged = mode }
}

// WithSettle gives the engine the reader of a node's pods, for drain-settle "ready" (the
// owners of the pods a drain evicts, and whether they are Ready again).
func WithSettle(pods client.Reader) Option {
	return func(e *Engine) { e.pacer.pods = pods }
}

// New returns an Engine; checker may be nil to run no pre-signal checks. Drains it decides
// count towards their pool's drains in flight until the cluster shows them (or Unreserve).
func New(model *cluster.Model, checker *checks.Checker, opts ...Option) *Engine {
	e := &Engine{model: model, checker: checker, pacer: newPacer(model), unmanaged: policy.UnmanagedIgnore}
	// Options may set the pacer's readers: it exists first.
	for _, o := range opts {
		o(e)
	}
	return e
}

// ReportImpaired tells the engine which instances EC2 reports impaired now (the poller's last
// answer, every impaired instance whether decided or not): the repair cut-off counts them all.
// The set replaces the last one; an empty set clears it.
func (e *Engine) ReportImpaired(ids []string) { e.pacer.reportImpaired(ids) }

// urgentCheckTimeout bounds the pre-signal checks of an urgent drain: it goes ahead whatever
// they say, so they may only add a warning, never hold a two-minute notice for the SDK's
// retries against a throttling EC2.
const urgentCheckTimeout = 5 * time.Second

func (e *Engine) runChecks(ctx context.Context, ev event.Event, res cluster.Resolved) []policy.Check {
	if ev.Urgent() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, urgentCheckTimeout)
		defer cancel()
	}
	return e.checker.Run(ctx, res)
}

// Outcome is a decision together with what the cluster model resolved, for the caller
// that acts on it (annotations, Kubernetes Events).
type Outcome struct {
	policy.Decision
	Resolved cluster.Resolved `json:"-"`
	// Problems are the NodePool's ignored annotations, for an Event on the NodePool.
	Problems []string `json:"-"`
}

// Decide returns one outcome per instance the event names (one for an AMI state change; one
// per NodeClaim of the block for a Capacity Block's expiration, Expand), in order. An error means the cluster could not be read: the event must be retried, not dropped.
func (e *Engine) Decide(ctx context.Context, ev event.Event, now time.Time) ([]Outcome, error) {
	if ev.Kind == event.KindAMIStateChange {
		return []Outcome{e.ImageChanged(ctx, ev)}, nil
	}
	ev, err := e.Expand(ctx, ev)
	if err != nil {
		return nil, err
	}
	out := make([]Outcome, 0, len(ev.Instances))
	for _, id := range ev.Instances {
		o, err := e.DecideInstance(ctx, ev, e.Resolve, id, now)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// Resolve looks an instance up in the cluster model.
func (e *Engine) Resolve(ctx context.Context, id string) (cluster.Resolved, error) {
	return e.model.Resolve(ctx, id)
}

// Expand returns ev with the instances it is about where the event names a group rather than
// instances: a Capacity Block's expiration is about the NodeClaims that carry its reservation
// (whatever instances the body may name: the router binds to what the cluster shows).
func (e *Engine) Expand(ctx context.Context, ev event.Event) (event.Event, error) {
	if ev.Kind != event.KindCapacityBlockExpiration {
		return ev, nil
	}
	ids, err := e.model.ReservationInstances(ctx, ev.Reservation)
	if err != nil {
		return ev, err
	}
	ev.Instances = ids
	return ev, nil
}

// ImageChanged handles an EC2 AMI State Change: cached image states are dropped and the
// listeners told, so that drains waiting on the image are checked again.
func (e *Engine) ImageChanged(ctx context.Context, ev event.Event) Outcome {
	if e.checker != nil {
		e.checker.InvalidateImage(ev.Image.ID)
	}
	for _, f := range e.imageListeners {
		f(ctx, ev.Image.ID, ev.Image.State)
	}
	return Outcome{Decision: policy.Decision{
		EventID: ev.ID, Kind: ev.Kind, Action: policy.ActionIgnore,
		Reason: fmt.Sprintf("image %s is now %s: deferrals waiting on it are checked again", ev.Image.ID, ev.Image.State),
	}}
}

// DecideInstance decides ev for one instance, resolved through resolve. A drain it returns
// holds a slot of its pool's max-concurrent-drains until the cluster shows the drain;
// if the drain is not signalled after all, give the slot back with Unreserve.
func (e *Engine) DecideInstance(ctx context.Context, ev event.Event, resolve func(context.Context, string) (cluster.Resolved, error), id string, now time.Time) (Outcome, error) {
	res, err := resolve(ctx, id)
	if err != nil {
		return Outcome{}, err
	}
	return e.decideResolved(ctx, ev, res, now)
}

func (e *Engine) decideResolved(ctx context.Context, ev event.Event, res cluster.Resolved, now time.Time) (Outcome, error) {
	tg := policy.Target{InstanceID: res.InstanceID, Found: res.Found(), NodePool: res.PoolName()}
	if res.Node != nil {
		tg.Node = res.Node.Name
	}
	if res.NodeClaim != nil {
		tg.NodeClaim = res.NodeClaim.Name
	}
	var annotations map[string]string
	if res.NodePool != nil {
		annotations = res.NodePool.Annotations
		tg.Budgets = res.NodePool.Spec.Disruption.Budgets
	}
	tg.Policy = policy.FromAnnotations(annotations)
	if res.Node != nil && res.NodeClaim == nil {
		// Not Karpenter's: no pool policy, pacing, gates or replacement checks apply; the
		// cluster's --unmanaged-nodes decides (a drain there evicts with PDBs respected).
		tg.Unmanaged, tg.NodePool, tg.Policy, tg.Budgets = e.unmanaged, "", policy.FromAnnotations(nil), nil
		return Outcome{Decision: policy.Decide(ev, tg, now), Resolved: res}, nil
	}
	switch {
	case res.Memory != nil:
		tg.RunningSince = res.Memory.Running
	case res.NodeClaim != nil:
		tg.RunningSince = e.model.Memory(ctx, res.NodeClaim.Name).Running
	}
	var d policy.Decision
	reserved := false
	if tg.Found && tg.NodePool != "" && (policy.Paced(ev, tg.Policy) || policy.Breaks(ev, tg.Policy)) {
		// The pool's size, drains in flight and urgent drains matter only here; deciding and
		// reserving a slot (and, for an urgent drain, noting it for the breaker) happen under
		// the pool's lock, so that instances decided in parallel never pass the breaker.
		var err error
		kind := drainPaced
		switch {
		case ev.Kind == event.KindInstanceStatus:
			kind = drainRepair
		case ev.Urgent():
			kind = drainUrgent
		}
		reserved, err = e.pacer.decide(ctx, tg.NodePool, tg.NodeClaim, kind, now, func(v poolView) bool {
			tg.PoolNodes, tg.DrainsInFlight, tg.Impaired, tg.UrgentDrains = v.Nodes, v.InFlight, v.Impaired, v.Urgent
			d = policy.Decide(ev, tg, now)
			return d.Action == policy.ActionDrain
		})
		if err != nil {
			return Outcome{}, err
		}
	} else {
		d = policy.Decide(ev, tg, now)
		if d.Action == policy.ActionDrain && tg.NodePool != "" && tg.NodeClaim != "" && tg.Policy.MaxConcurrentDrains != nil {
			// An urgent drain is never held, but it is in flight: counted at once, so that a
			// paced drain decided before the cache shows it does not go over the limit.
			e.pacer.take(tg.NodePool, tg.NodeClaim, now)
			reserved = true
		}
	}
	// Gates before checks: they read the cache; the checks ask EC2.
	if d.Action == policy.ActionDrain && policy.Gated(ev, tg.Policy, now) {
		gs, err := e.runGates(ctx, tg)
		if err != nil {
			if reserved {
				e.pacer.unreserve(tg.NodePool, tg.NodeClaim)
			}
			return Outcome{}, err
		}
		d = policy.ApplyGates(d, ev, tg.Policy, gs, now)
	}
	if d.Action == policy.ActionDrain && !d.InPlace && e.checker != nil {
		// A reboot in place keeps the node: no replacement to check.
		d = policy.ApplyChecks(d, ev, tg.Policy, e.runChecks(ctx, ev, res), now)
	}
	if reserved && d.Action != policy.ActionDrain {
		e.pacer.unreserve(tg.NodePool, tg.NodeClaim)
	}
	if d.InPlace && d.Action == policy.ActionDrain {
		// Paced and gated as a drain (its slot stays reserved: the run is in flight); carried
		// out by keeping the node through the reboot.
		d.Action = policy.ActionRebootInPlace
	}
	if reserved && d.Action == policy.ActionDrain && tg.Policy.DrainSettle != (policy.Settle{}) {
		st := &settle{policy: tg.Policy.DrainSettle, node: tg.Node}
		if st.policy.Ready && e.pacer.pods != nil && tg.Node != "" {
			// The owners are read now: by the time the drain settles, node and pods are gone.
			owners, err := gates.Owners(ctx, e.pacer.pods, tg.Node)
			if err != nil {
				e.pacer.unreserve(tg.NodePool, tg.NodeClaim)
				return Outcome{}, err
			}
			st.owners = owners
		}
		e.pacer.noteSettle(tg.NodePool, tg.NodeClaim, st)
	}
	return Outcome{Decision: d, Resolved: res, Problems: tg.Policy.Problems}, nil
}

// runGates asks the gates the pool's policy names. An error means the cache could not be
// read: the event is retried. An unreachable Alertmanager is not an error: the gate says
// so, and the pool's hold-while-alerts-unreachable decides.
func (e *Engine) runGates(ctx context.Context, tg policy.Target) ([]policy.Gate, error) {
	var gs []policy.Gate
	if tg.Policy.RespectPDB && e.pdbs != nil && tg.Node != "" {
		g, err := e.pdbs.Check(ctx, tg.Node)
		if err != nil {
			return nil, err
		}
		gs = append(gs, g)
	}
	if m := tg.Policy.HoldWhileAlerts; m != nil && e.alerts != nil {
		gs = append(gs, e.alerts.Check(ctx, m, tg.Policy.AlertsUnreachable))
	}
	return gs, nil
}

// Unreserve gives back the pacing slot of a drain that was decided but not signalled.
func (e *Engine) Unreserve(pool, nodeClaim string) {
	if pool != "" && nodeClaim != "" {
		e.pacer.unreserve(pool, nodeClaim)
	}
}

// DrainFinished tells the engine that a NodeClaim of pool is gone, so that the next pacing
// decision reads the pool again; with drain-settle, that drain now settles.
func (e *Engine) DrainFinished(pool, nodeClaim string, now time.Time) {
	e.pacer.finished(pool, nodeClaim, now)
}

// FreeDrains returns how many more drains pool's max-concurrent-drains allows now, for
// releasing drains held by pacing; ok is false when the pool does not pace.
func (e *Engine) FreeDrains(ctx context.Context, pool string, now time.Time) (n int, ok bool, err error) {
	np := &karpv1.NodePool{}
	if err := e.model.Get(ctx, pool, np); err != nil {
		return 0, false, err
	}
	p := policy.FromAnnotations(np.Annotations)
	if p.MaxConcurrentDrains == nil || p.Shadow {
		// A pool in shadow paces nothing: the router decides for it as Karpenter would.
		return 0, false, nil
	}
	n, err = e.pacer.free(ctx, pool, now, p.DrainLimit)
	return n, true, err
}
