// Package engine decides an event end to end: it resolves each instance through the
// cluster model, reads the NodePool's policy, decides, and runs the pre-signal checks on
// drains. The live intake and the replay tool share it.
package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// Engine decides events.
type Engine struct {
	model   *cluster.Model
	checker *checks.Checker // nil: no checks
	// pending counts drains decided by this engine that the cluster does not show yet,
	// per NodePool; nil unless tracking is on.
	pending map[string]int
	// imageListeners are told of every EC2 AMI State Change, to drop what they cached.
	imageListeners []func(id string)
}

// Option configures an Engine.
type Option func(*Engine)

// WithDrainTracking makes the engine count the drains it decides towards each pool's
// drains in flight, for a replay where nothing is signalled to the cluster.
func WithDrainTracking() Option { return func(e *Engine) { e.pending = map[string]int{} } }

// WithImageListener registers f to be told the image of every EC2 AMI State Change event
// (the watchdog drops its cached state of that image).
func WithImageListener(f func(id string)) Option {
	return func(e *Engine) { e.imageListeners = append(e.imageListeners, f) }
}

// New returns an Engine; checker may be nil to run no pre-signal checks.
func New(model *cluster.Model, checker *checks.Checker, opts ...Option) *Engine {
	e := &Engine{model: model, checker: checker}
	for _, o := range opts {
		o(e)
	}
	return e
}

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

// Decide returns one outcome per instance the event names (one for an AMI state change).
// An error means the cluster could not be read: the event must be retried, not dropped.
func (e *Engine) Decide(ctx context.Context, ev event.Event, now time.Time) ([]Outcome, error) {
	if ev.Kind == event.KindAMIStateChange {
		if e.checker != nil {
			e.checker.InvalidateImage(ev.Image.ID)
		}
		for _, f := range e.imageListeners {
			f(ev.Image.ID)
		}
		return []Outcome{{Decision: policy.Decision{
			EventID: ev.ID, Kind: ev.Kind, Action: policy.ActionIgnore,
			Reason: fmt.Sprintf("image %s is now %s: deferrals waiting on it are checked again", ev.Image.ID, ev.Image.State),
		}}}, nil
	}
	decided := map[string]int{} // drains decided for earlier instances of this same event
	out := make([]Outcome, 0, len(ev.Instances))
	for _, id := range ev.Instances {
		res, err := e.model.Resolve(ctx, id)
		if err != nil {
			return nil, err
		}
		tg := policy.Target{InstanceID: id, Found: res.Found(), NodePool: res.PoolName()}
		if res.Node != nil {
			tg.Node = res.Node.Name
		}
		if res.NodeClaim != nil {
			tg.NodeClaim = res.NodeClaim.Name
		}
		if res.NodePool != nil {
			tg.Policy = policy.FromAnnotations(res.NodePool.Annotations)
		} else {
			tg.Policy = policy.FromAnnotations(nil)
		}
		d := policy.Decide(ev, tg, now)
		// Pool state costs a list of the pool's NodeClaims: read it only when pacing can
		// hold this decision (a non-urgent drain in a pool that paces), then decide again.
		if d.Action == policy.ActionDrain && !ev.Urgent() && tg.Policy.MaxConcurrentDrains != nil && tg.NodePool != "" {
			nodes, inFlight, err := e.model.PoolState(ctx, tg.NodePool)
			if err != nil {
				return nil, err
			}
			tg.PoolNodes, tg.DrainsInFlight = nodes, inFlight+decided[tg.NodePool]+e.pending[tg.NodePool]
			d = policy.Decide(ev, tg, now)
		}
		if d.Action == policy.ActionDrain && e.checker != nil {
			d = policy.ApplyChecks(d, ev, tg.Policy, e.runChecks(ctx, ev, res), now)
		}
		if d.Action == policy.ActionDrain && tg.NodePool != "" {
			decided[tg.NodePool]++
		}
		out = append(out, Outcome{Decision: d, Resolved: res, Problems: tg.Policy.Problems})
	}
	if e.pending != nil {
		for pool, n := range decided {
			e.pending[pool] += n
		}
	}
	return out, nil
}
