// Package pipeline decides an event for every instance it names and carries each outcome
// out. SQS messages (router/intake), the instance-status poller (router/poller) and
// deferrals coming due (router/deferral) all take this one path.
//
// An event's outcome per instance is recorded on the instance's NodeClaim (a deferral
// record, or the drain-signalled stamp), so progress survives a retry: a redelivered event
// skips the instances it recorded already, and a retried bulk event never starts over.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/signal"
)

// BulkInstances is the most instances an event may name and still get Kubernetes Events per
// instance; a larger one (an AZ-wide maintenance) gets one summary Event per NodePool and
// action, and each instance's outcome stays on its NodeClaim.
const BulkInstances = 10

// DefaultParallelism is how many instances of one event are decided and carried out at once:
// enough to keep a polite client limit (200 requests/s) busy over API server round trips,
// bounded so that one bulk event cannot take every connection.
const DefaultParallelism = 16

// Publisher receives decisions for the CloudWatch dashboard; nil-safe.
type Publisher interface {
	Decision(kind, action string)
}

// NodeDrainer drains a node Karpenter does not manage (--unmanaged-nodes=cordon-drain):
// Begin records the drain on the Node and cordons it; the drainer evicts its pods from there.
type NodeDrainer interface {
	Begin(ctx context.Context, node *corev1.Node, eventID, kind string, deadline time.Time) (already bool, err error)
}

// Pipeline decides and carries out events.
type Pipeline struct {
	engine    *engine.Engine
	signal    *signal.Signaller
	metrics   *metrics.Router
	publisher Publisher
	clock     clock.PassiveClock
	log       *slog.Logger
	parallel  int
	nodes     NodeDrainer // nil: unmanaged nodes are not drained
	notify    Notifier    // nil: no notifications
	pods      PodNotifier // nil: the pods are not told
	resched   Rescheduler // nil: no event is moved
	inPlace   InPlacer    // nil: a reboot in place is replaced instead
	cluster   string
}

// InPlacer begins a reboot in place (router/inplace's Runner).
type InPlacer interface {
	Begin(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (already bool, err error)
}

// WithInPlace has the pipeline keep nodes through reboots for the pools that ask
// (reboot-in-place), through r.
func (p *Pipeline) WithInPlace(r InPlacer) *Pipeline {
	p.inPlace = r
	return p
}

// Rescheduler finds an instance's scheduled event in EC2 and moves it (reschedule.Events).
type Rescheduler = reschedule.API

// WithRescheduler has the pipeline move the scheduled events of pools annotated
// healthrouter.io/reschedule=true into their window.
func (p *Pipeline) WithRescheduler(r Rescheduler) *Pipeline {
	p.resched = r
	return p
}

// PodNotifier is told of each drain and deferral of a node, to tell its pods' owners
// (router/podnotice: bounded, never blocking).
type PodNotifier interface {
	Notify(podnotice.Notice)
}

// WithPodNotifier has the pipeline tell n of each node's drain and deferral.
func (p *Pipeline) WithPodNotifier(n PodNotifier) *Pipeline {
	p.pods = n
	return p
}

// Notifier is told of every event received and every decision carried out, without ever
// blocking (router/notify: a bounded queue, sent by the leader).
type Notifier interface {
	Notify(notify.Notice)
}

// WithNotifier has the pipeline tell n of each event on receipt and of each decision; cluster
// names the cluster in the notices.
func (p *Pipeline) WithNotifier(n Notifier, cluster string) *Pipeline {
	p.notify, p.cluster = n, cluster
	return p
}

// WithNodeDrainer gives the pipeline what drains nodes Karpenter does not manage.
func (p *Pipeline) WithNodeDrainer(d NodeDrainer) *Pipeline {
	p.nodes = d
	return p
}

// New returns a Pipeline; publisher may be nil, parallel < 1 means DefaultParallelism.
func New(eng *engine.Engine, sig *signal.Signaller, m *metrics.Router, publisher Publisher, clk clock.PassiveClock, log *slog.Logger, parallel int) *Pipeline {
	if parallel < 1 {
		parallel = DefaultParallelism
	}
	return &Pipeline{engine: eng, signal: sig, metrics: m, publisher: publisher, clock: clk, log: log, parallel: parallel}
}

// Result counts an event's outcomes by action, and the instances skipped because their
// outcome was recorded before.
type Result struct {
	Actions         map[policy.Action]int
	AlreadyRecorded int
}

// Handle decides ev for each instance and carries the outcomes out; it implements the
// poller's handler. It returns nil once every instance's outcome is recorded.
func (p *Pipeline) Handle(ctx context.Context, ev event.Event) error {
	_, err := p.Process(ctx, ev)
	return err
}

// Process decides ev for each instance it names, in parallel, and carries the outcomes out.
// An error means some instances must be tried again (those recorded meanwhile are skipped
// then); the others' outcomes stand.
func (p *Pipeline) Process(ctx context.Context, ev event.Event) (Result, error) {
	res := Result{Actions: map[policy.Action]int{}}
	if ev.Kind == event.KindAMIStateChange {
		o := p.engine.ImageChanged(ctx, ev)
		res.Actions[o.Action]++
		return res, nil
	}
	if p.notify != nil {
		p.notify.Notify(notify.Received(ev, p.cluster))
	}
	bulk := newSummary(len(ev.Instances) > BulkInstances)
	var (
		mu   sync.Mutex
		errs []error
	)
	var g errgroup.Group // not WithContext: one instance's failure must not stop the others' progress
	g.SetLimit(p.parallel)
	for _, id := range ev.Instances {
		g.Go(func() error {
			action, recorded, err := p.instance(ctx, ev, id, bulk, false, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("instance %s: %w", id, err))
			case recorded:
				res.AlreadyRecorded++
			default:
				res.Actions[action]++
			}
			return nil
		})
	}
	_ = g.Wait()
	bulk.post(p.signal, ev)
	return res, errors.Join(errs...)
}

// ErrBadRecord marks a deferral record whose event does not parse (written by hand, or
// damaged): it can never be decided, and is dropped rather than retried.
var ErrBadRecord = errors.New("deferral record holds no event the router can parse")

// Redecide decides one due (or released) deferral of a NodeClaim again and carries the new
// outcome out. It returns the new decision (a defer carries its next Until).
func (p *Pipeline) Redecide(ctx context.Context, nc *karpv1.NodeClaim, rec record.Record) (policy.Decision, error) {
	ev, err := event.Parse(rec.Event)
	if err != nil {
		return policy.Decision{}, fmt.Errorf("%w: %s on nodeclaim %s: %v", ErrBadRecord, rec.EventID, nc.Name, err)
	}
	id := cluster.InstanceID(nc.Status.ProviderID)
	if id == "" && len(ev.Instances) == 1 {
		id = ev.Instances[0]
	}
	ev.Instances = []string{id}
	p.metrics.Redecisions.WithLabelValues(string(rec.Hold)).Inc()
	var d policy.Decision
	_, _, err = p.instance(ctx, ev, id, newSummary(false), true, &d)
	return d, err
}

// instance decides ev for one instance and carries the outcome out; recorded is true
// when the instance's outcome was recorded before (nothing was decided).
func (p *Pipeline) instance(ctx context.Context, ev event.Event, id string, bulk *summary, redecide bool, out *policy.Decision) (policy.Action, bool, error) {
	resolved, err := p.engine.Resolve(ctx, id)
	if err != nil {
		return "", false, err
	}
	log := p.log.With("event_id", ev.ID, "kind", ev.Kind, "instance", id)
	if nc := resolved.NodeClaim; nc != nil && !redecide {
		set, _ := record.Read(nc) // unreadable: nothing is recorded as far as this router can tell
		if rec, ok := set.Recorded(ev); ok {
			log.Debug("outcome recorded already", "nodeclaim", nc.Name, "state", rec.State, "recorded_event", rec.EventID)
			p.metrics.AlreadyRecorded.Inc()
			return "", true, nil
		}
		stamped, _, via, ok := record.ParseDrainStamp(nc.Annotations[cluster.AnnotationDrainSignalled])
		resend := ok && stamped == ev.ID && signal.Mode(via) == signal.ModeForward && nc.DeletionTimestamp.IsZero()
		if ok && stamped == ev.ID && !resend {
			p.metrics.AlreadyRecorded.Inc()
			return "", true, nil
		}
		// A forward stamped by an earlier try of this event that Karpenter has not acted on yet
		// is decided again: the signaller sends it again (the earlier try may have died before
		// its send).
		if cluster.Draining(nc) && !ev.Urgent() && !resend {
			// Being drained (by this event before a retry, or another): nothing to decide,
			// nothing to write. An urgent event still goes through and is recorded as a drain
			// (the signaller finds it draining already and signals nothing).
			log.Debug("outcome recorded already: being drained", "nodeclaim", nc.Name)
			p.metrics.AlreadyRecorded.Inc()
			return "", true, nil
		}
	}
	o, err := p.engine.DecideInstance(ctx, ev, func(context.Context, string) (cluster.Resolved, error) { return resolved, nil }, id, p.clock.Now())
	if err != nil {
		return "", false, err
	}
	d := o.Decision
	if p.resched != nil && !redecide && o.Resolved.NodePool != nil &&
		reschedule.Eligible(ev, d.Action, o.Resolved.NodeClaim != nil, policy.FromAnnotations(o.Resolved.NodePool.Annotations)) {
		moved, how, changed := p.reschedule(ctx, ev, id, o.Resolved)
		if changed {
			// The event as EC2 now holds it: it may be a maintenance recorded already (the
			// other source's view of an event moved before).
			set, _ := record.Read(o.Resolved.NodeClaim)
			if _, recorded := set.Recorded(moved); recorded {
				log.Debug("outcome recorded already: the moved maintenance", "nodeclaim", o.Resolved.NodeClaim.Name, "start", moved.Deadline)
				p.metrics.AlreadyRecorded.Inc()
				return "", true, nil
			}
			ev = moved
			if o, err = p.engine.DecideInstance(ctx, ev, func(context.Context, string) (cluster.Resolved, error) { return resolved, nil }, id, p.clock.Now()); err != nil {
				return "", false, err
			}
			d = o.Decision
		}
		d.Reason = how + "; " + d.Reason
	}
	if d.Action == policy.ActionDefer && o.Resolved.NodeClaim == nil {
		// A deferral lives on the NodeClaim; an instance without one is not Karpenter's.
		d.Action, d.Hold = policy.ActionSkip, ""
		d.Reason = "would defer (" + d.Reason + "), but the instance has no NodeClaim: Karpenter does not manage it"
	}
	if out != nil {
		*out = d
	}
	ilog := log.With("node", d.Node, "nodepool", d.NodePool, "action", d.Action)
	p.metrics.Decisions.WithLabelValues(string(ev.Kind), string(d.Action), d.NodePool).Inc()
	if p.publisher != nil {
		p.publisher.Decision(string(ev.Kind), string(d.Action))
	}
	for _, c := range d.Checks {
		p.metrics.CheckResults.WithLabelValues(c.Name, checkResult(c)).Inc()
	}
	unmanaged := o.Resolved.Node != nil && o.Resolved.NodeClaim == nil
	if unmanaged {
		p.metrics.Unmanaged.WithLabelValues(string(ev.Kind), string(d.Action)).Inc()
	}
	if d.Action == policy.ActionDefer && (d.Hold == policy.HoldPDB || d.Hold == policy.HoldAlerts || d.Hold == policy.HoldRepairCutoff) {
		p.metrics.GateHolds.WithLabelValues(string(d.Hold)).Inc()
	}
	p.signal.PolicyProblems(o.Resolved, o.Problems)
	quiet := bulk.quiet
	switch {
	case unmanaged && d.Action == policy.ActionDrain:
		err = p.drainUnmanaged(ctx, ev, d, o.Resolved, quiet)
	case unmanaged && d.Action == policy.ActionSkip:
		// Nothing to do, and nothing to retry: told once per event on the Node.
		if !quiet {
			p.signal.NotManaged(o.Resolved, ev, d)
		}
		ilog.Info("skipped", "reason", d.Reason)
	case d.Action == policy.ActionRebootInPlace && p.inPlace == nil:
		// The router was started without the reboot in place (--reboot-in-place=false):
		// the node is replaced, as a drain, and the decision says so.
		d.Action = policy.ActionDrain
		d.Warnings = append(d.Warnings, "reboot-in-place is off in this router (--reboot-in-place=false): the node is replaced instead")
		var already bool
		already, err = p.signal.Drain(ctx, ev, d, o.Resolved, quiet)
		if err == nil {
			ilog.Info("drain signalled", "reason", d.Reason, "already_draining", already, "via", p.signal.Via(ev))
		} else {
			p.engine.Unreserve(d.NodePool, d.NodeClaim)
		}
	case d.Action == policy.ActionRebootInPlace:
		one, rerr := p.restrict(ev, id)
		if rerr != nil {
			err = rerr
			break
		}
		var already bool
		already, err = p.signal.InPlace(ctx, ev, d, o.Resolved, func(ctx context.Context, nc *karpv1.NodeClaim) (bool, error) { return p.inPlace.Begin(ctx, nc, one) })
		if err == nil {
			ilog.Info("reboot in place begun", "reason", d.Reason, "already", already)
		} else {
			p.engine.Unreserve(d.NodePool, d.NodeClaim)
		}
	case d.Action == policy.ActionDrain:
		var already bool
		already, err = p.signal.Drain(ctx, ev, d, o.Resolved, quiet)
		if err == nil {
			ilog.Info("drain signalled", "reason", d.Reason, "already_draining", already, "via", p.signal.Via(ev))
		} else {
			p.engine.Unreserve(d.NodePool, d.NodeClaim) // nothing was signalled (a stamp comes first)
		}
	case d.Action == policy.ActionDefer:
		_, err = p.signal.Defer(ctx, ev, d, o.Resolved, quiet)
		if err == nil {
			ilog.Info("deferred", "until", d.Until, "hold", d.Hold, "reason", d.Reason)
		}
	case d.Action == policy.ActionIgnore:
		err = p.signal.Ignore(ctx, ev, d, o.Resolved, quiet)
		if err == nil {
			ilog.Info("ignored", "reason", d.Reason)
		}
	case d.Action == policy.ActionSkip:
		ilog.Info("skipped", "reason", d.Reason)
	}
	if err != nil {
		p.metrics.SignalErrors.WithLabelValues(string(p.signal.Via(ev))).Inc()
		return "", false, fmt.Errorf("carrying out %s: %w", d.Action, err)
	}
	bulk.add(o.Resolved.NodePool, d)
	if p.notify != nil && d.Action != policy.ActionSkip {
		p.notify.Notify(notify.FromDecision(ev, d, p.cluster))
	}
	if p.pods != nil && (d.Action == policy.ActionDrain || d.Action == policy.ActionDefer || d.Action == policy.ActionRebootInPlace) {
		p.pods.Notify(podnotice.Notice{EventID: ev.ID, Kind: ev.Kind, Action: d.Action, Hold: d.Hold, Until: d.Until, Deadline: d.Deadline,
			Node: d.Node, NodePool: d.NodePool, Reason: d.Reason})
	}
	return d.Action, false, nil
}

// reschedule moves the instance's scheduled event into its pool's window (reschedule.Attempt)
// and returns the event as EC2 then holds it (changed: it starts at another time than ev
// says) and what was done, for the decision's reason.
func (p *Pipeline) reschedule(ctx context.Context, ev event.Event, id string, res cluster.Resolved) (event.Event, string, bool) {
	one, err := p.restrict(ev, id)
	if err != nil {
		p.metrics.Reschedules.WithLabelValues(reschedule.ResultNotMoved).Inc()
		return ev, "not rescheduled: " + err.Error(), false
	}
	out := reschedule.Attempt(ctx, p.resched, one, id, policy.FromAnnotations(res.NodePool.Annotations), p.clock.Now())
	p.metrics.Reschedules.WithLabelValues(out.Result).Inc()
	if out.Result == reschedule.ResultMoved {
		p.signal.Rescheduled(res, ev, out.Note)
		p.log.Info("scheduled event moved into the window", "event_id", ev.ID, "instance", id, "ec2_event", out.EventID, "from", out.From, "to", out.To)
	}
	if !out.Changed {
		return ev, out.Note, false
	}
	return out.Event, out.Note, true
}

// restrict returns ev as it names only instance id (its canonical body, parsed).
func (p *Pipeline) restrict(ev event.Event, id string) (event.Event, error) {
	if len(ev.Instances) == 1 {
		return ev, nil
	}
	body, err := signal.Canonical(ev, id)
	if err != nil {
		return event.Event{}, err
	}
	return event.Parse(body)
}

// drainUnmanaged drains a node Karpenter does not manage through the NodeDrainer: its record
// and cordon are on the Node, and the drainer evicts its pods with PDBs respected.
func (p *Pipeline) drainUnmanaged(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) error {
	if p.nodes == nil {
		return fmt.Errorf("instance %s: %w, and no drainer for such nodes is configured", d.InstanceID, signal.ErrNotManaged)
	}
	already, err := p.nodes.Begin(ctx, res.Node, ev.ID, string(ev.Kind), d.Deadline)
	if err != nil {
		return fmt.Errorf("cordoning node %s: %w", res.Node.Name, err)
	}
	if !already && !quiet {
		p.signal.NotManaged(res, ev, d)
	}
	p.log.Info("unmanaged node cordoned for draining", "event_id", ev.ID, "instance", d.InstanceID, "node", res.Node.Name, "already", already)
	return nil
}

func checkResult(c policy.Check) string {
	switch {
	case c.Passed:
		return "passed"
	case c.Unavailable:
		return "unavailable"
	}
	return "failed"
}

// summary gathers a bulk event's outcomes per NodePool and action, for one Event each.
type summary struct {
	quiet bool
	mu    sync.Mutex
	pools map[string]*karpv1.NodePool
	count map[string]map[policy.Action]int
	first map[string]map[policy.Action]policy.Decision
}

func newSummary(quiet bool) *summary {
	return &summary{quiet: quiet, pools: map[string]*karpv1.NodePool{}, count: map[string]map[policy.Action]int{}, first: map[string]map[policy.Action]policy.Decision{}}
}

func (s *summary) add(pool *karpv1.NodePool, d policy.Decision) {
	if !s.quiet || pool == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.count[pool.Name] == nil {
		s.pools[pool.Name] = pool
		s.count[pool.Name] = map[policy.Action]int{}
		s.first[pool.Name] = map[policy.Action]policy.Decision{}
	}
	if s.count[pool.Name][d.Action] == 0 {
		s.first[pool.Name][d.Action] = d
	}
	s.count[pool.Name][d.Action]++
}

func (s *summary) post(sig *signal.Signaller, ev event.Event) {
	for name, byAction := range s.count {
		for action, n := range byAction {
			sig.Summary(s.pools[name], ev, action, n, s.first[name][action])
		}
	}
}
