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
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
	"k8s.io/utils/clock"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/shadow"
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
// Begin records the drain on the Node and cordons it; the drainer evicts its pods from there;
// Cancel ends it when its maintenance closes (router/nodedrain's Drainer).
type NodeDrainer interface {
	Begin(ctx context.Context, node *corev1.Node, dr nodedrain.Drain) (already bool, err error)
	Cancel(ctx context.Context, node string, dr nodedrain.Drain) (bool, error)
}

// Holder is an action that holds state for a maintenance after the pipeline carried it out:
// a reboot in place (on the NodeClaim and its Node), a drain of an unmanaged Node. Each is
// begun by its outcome; a close of the maintenance (a decision with Cancel) reaches every
// one through this one contract, whichever began it, and each ends only what is its own
// (it matches the event by its own keys). The deferral records are the signaller's, ended by
// the same decision (signal.Ignore).
type Holder interface {
	// Cancel ends what is held for the maintenance ev closes, and reports whether it did.
	Cancel(ctx context.Context, res cluster.Resolved, ev event.Event) (bool, error)
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
	nodes     NodeDrainer        // nil: unmanaged nodes are not drained
	notify    Notifier           // nil: no notifications
	pods      PodNotifier        // nil: the pods are not told
	resched   Rescheduler        // nil: no event is moved
	inPlace   InPlacer           // nil: a reboot in place is replaced instead
	holders   []Holder           // every action that holds state: a close reaches each
	states    InstanceStates     // nil: an urgent state change is taken at its word
	stateOf   singleflight.Group // one DescribeInstanceStatus at a time per instance (a shutting-down and its terminated arrive together)
	fresh     client.Reader
	cluster   string
	shadowAll bool           // --shadow: every pool's outcomes only recorded
	ledger    *shadow.Ledger // nil: would-be outcomes only on the NodeClaims
}

// WithShadow has the pipeline record the would-be outcomes of pools in shadow in ledger (nil:
// on their NodeClaims only); all puts every pool, and nodes Karpenter does not manage, in
// shadow (--shadow).
func (p *Pipeline) WithShadow(all bool, ledger *shadow.Ledger) *Pipeline {
	p.shadowAll, p.ledger = all, ledger
	return p
}

// InPlacer begins and cancels reboots in place (router/inplace's Runner). Begin fails with
// inplace.ErrBusy while the node is being rebooted already: a run of another maintenance, or
// Karpenter's own reboot (node repair).
type InPlacer interface {
	Begin(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (already bool, err error)
	Cancel(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (bool, error)
}

// WithInPlace has the pipeline keep nodes through reboots for the pools that ask
// (reboot-in-place), through r.
func (p *Pipeline) WithInPlace(r InPlacer) *Pipeline {
	p.inPlace = r
	p.holders = append(p.holders, inPlaceHolder{r})
	return p
}

// WithInPlaceHeld gives the pipeline the runs in progress of a reboot in place turned off
// (--reboot-in-place=false after a router that had it on): a close still reaches them, and
// their runner carries them to their end, but no new run begins (a reboot-in-place decision
// replaces the node, as without a runner). A feature turned off still owns what it left.
func (p *Pipeline) WithInPlaceHeld(r InPlacer) *Pipeline {
	p.holders = append(p.holders, inPlaceHolder{r})
	return p
}

// WithFreshReads has the pipeline read a NodeClaim fresh (r: an API reader, not the cache)
// before a destructive action that rests on its records: a drain, a reboot in place. The
// informer cache lags the router's own writes: a close, a `running` or another worker's
// outcome written a moment before is not in it yet, and the decision is made again on what
// the API server holds.
func (p *Pipeline) WithFreshReads(r client.Reader) *Pipeline {
	p.fresh = r
	return p
}

// inPlaceHolder carries a close to the NodeClaim's reboot in place.
type inPlaceHolder struct{ r InPlacer }

func (h inPlaceHolder) Cancel(ctx context.Context, res cluster.Resolved, ev event.Event) (bool, error) {
	if res.NodeClaim == nil {
		return false, nil
	}
	return h.r.Cancel(ctx, res.NodeClaim, ev)
}

// nodeDrainHolder carries a close to an unmanaged Node's drain.
type nodeDrainHolder struct{ d NodeDrainer }

func (h nodeDrainHolder) Cancel(ctx context.Context, res cluster.Resolved, ev event.Event) (bool, error) {
	if res.Node == nil || res.NodeClaim != nil {
		return false, nil
	}
	return h.d.Cancel(ctx, res.Node.Name, drainOf(ev, time.Time{}))
}

// drainOf is what a drain of an unmanaged Node records of ev: its keys, so that a close
// reaches it, and, for a maintenance AWS keeps the instance through (a reboot), when it ends.
func drainOf(ev event.Event, deadline time.Time) nodedrain.Drain {
	dr := nodedrain.Drain{EventID: ev.ID, Key: record.Key(ev), Match: record.Match(ev), Kind: string(ev.Kind), EventTime: ev.Time, Deadline: deadline,
		Resumes:  ev.Kind == event.KindStateChange && ev.State == event.StateRunning,
		Recovers: ev.Kind == event.KindInstanceStatus && ev.Status != nil && ev.Status.Recovered}
	if h := ev.Health; h != nil && ev.Kind == event.KindScheduledChange && slices.Contains(inplace.Types, h.Scheduled) {
		switch {
		case h.End.After(ev.Deadline):
			dr.Release = h.End
		case !ev.Deadline.IsZero():
			dr.Release = ev.Deadline.Add(inplace.DefaultQuiet)
		}
	}
	return dr
}

// InstanceStates is the part of EC2 the pipeline confirms an urgent state change with: the
// poller's DescribeInstanceStatus, which with IncludeAllInstances reports the instance's
// state (the router's role has it; ec2:DescribeInstances it has not).
type InstanceStates interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// Results of a close's confirmation, as the close-confirmations metric labels them.
const (
	CloseConfirmed    = "confirmed"
	CloseContradicted = "contradicted"
	CloseUnavailable  = "unavailable"
)

// Results of an urgent state change's confirmation, as the state-confirmations metric labels
// them.
const (
	StateConfirmed    = "confirmed"
	StateContradicted = "contradicted"
	StateUnavailable  = "unavailable"
)

// WithStateConfirmation has the pipeline confirm each urgent state change (shutting-down,
// terminated) of a cluster node with EC2 (api) before it drains the node at once: a queue
// message is a claim. See confirmState.
func (p *Pipeline) WithStateConfirmation(api InstanceStates) *Pipeline {
	p.states = api
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

// WithNodeDrainerHeld gives the pipeline the drains in progress of --unmanaged-nodes=cordon-drain
// turned off: a close or a `running` still reaches them, and the drainer carries them to their
// end, but no new drain begins. A feature turned off still owns what it left.
func (p *Pipeline) WithNodeDrainerHeld(d NodeDrainer) *Pipeline {
	p.holders = append(p.holders, nodeDrainHolder{d})
	return p
}

// WithNodeDrainer gives the pipeline what drains nodes Karpenter does not manage.
func (p *Pipeline) WithNodeDrainer(d NodeDrainer) *Pipeline {
	p.nodes = d
	p.holders = append(p.holders, nodeDrainHolder{d})
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
	if ev.Kind == event.KindCapacityBlockExpiration {
		var err error
		if ev, err = p.engine.Expand(ctx, ev); err != nil {
			return res, err // the cluster could not be read: retried
		}
		p.log.Info("capacity block ends", "event_id", ev.ID, "kind", string(ev.Kind), "reservation", ev.Reservation, "deadline", ev.Deadline, "instances", len(ev.Instances))
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
	decide := func(ev event.Event, id string) {
		g.Go(func() error {
			action, recorded, err := p.instance(ctx, ev, id, bulk, "", nil)
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
	for _, id := range ev.Instances {
		decide(ev, id)
	}
	// The instances the report resolves: the maintenance is over for them, and its close for
	// them ends their deferrals, runs and drains (a resolved entity was dropped from the
	// event, and its deferral drained it in the window for nothing).
	if closed, ok := ev.ResolvedClose(); ok {
		for _, id := range closed.Instances {
			decide(closed, id)
		}
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
	ev, id, err := signal.RecordEvent(rec.Event, nc)
	if err != nil {
		return policy.Decision{}, fmt.Errorf("%w: %s on nodeclaim %s: %v", ErrBadRecord, rec.EventID, nc.Name, err)
	}
	// The body holds the start the router moved the maintenance to; the record keeps the one it
	// had, which a close or another source's report may still name.
	ev.MovedFrom = rec.MovedFrom
	p.metrics.Redecisions.WithLabelValues(string(rec.Hold)).Inc()
	var d policy.Decision
	_, _, err = p.instance(ctx, ev, id, newSummary(false), rec.EventID, &d)
	return d, err
}

// instance decides ev for one instance and carries the outcome out, in one pass: decide
// (engine, with a reschedule where the pool asks), read fresh before a destructive outcome
// (refresh), carry a close to every action that holds state (Holder), carry the outcome out
// (carryOut), and tell of it. recorded is true when the instance's outcome was recorded
// before (nothing was decided). redecide is the event ID of the due deferral being decided
// again ("" for an event received).
//
// A pool in shadow (healthrouter.io/mode=shadow) on an active router has its would-be outcome
// recorded, and Karpenter's own behaviour carried out for it: after the takeover nobody else
// hears of its events (Karpenter's rules are gone), so recording alone would lose them. The
// router stands in for Karpenter there: the event is decided as for a pool with no annotation
// (drain at once, through Karpenter's queue in forward mode, with the replacement checks and
// the PodDisruptionBudget gate every drain gets). Only --shadow, before the takeover, records
// and carries out nothing: Karpenter's own rules still feed it then.
func (p *Pipeline) instance(ctx context.Context, ev event.Event, id string, bulk *summary, redecide string, out *policy.Decision) (policy.Action, bool, error) {
	resolved, err := p.engine.Resolve(ctx, id)
	if err != nil {
		return "", false, err
	}
	log := p.log.With("event_id", ev.ID, "kind", ev.Kind, "instance", id)
	c := &claim{ev: ev}
	switch {
	case !p.shadowed(resolved):
		return p.act(ctx, c, id, resolved, bulk, redecide, out, log)
	case p.shadowAll:
		return p.observe(ctx, c, id, resolved, bulk, redecide, true, out, log)
	}
	if redecide == "" {
		if _, _, err := p.observe(ctx, c, id, resolved, bulk, "", false, nil, log); err != nil {
			return "", false, err
		}
	}
	return p.act(ctx, c, id, standIn(resolved), bulk, redecide, out, log.With("stand_in", true))
}

// claim is an event as checked for one instance: plausible for its NodeClaim (plausible),
// its state change confirmed with EC2 (confirmState). A pool in shadow is decided twice in
// one pass, for its would-be outcome and as Karpenter's stand-in, on one check: one call to
// EC2 and one count in the metrics.
type claim struct {
	ev          event.Event
	unconfirmed string // the decision's warning when EC2 did not confirm the state change
	checked     bool
}

// check checks c's event for the instance once (see claim).
func (p *Pipeline) check(ctx context.Context, c *claim, id string, resolved cluster.Resolved, log *slog.Logger) error {
	if c.checked {
		return nil
	}
	ev, unconfirmed, err := p.confirmState(ctx, p.plausible(c.ev, resolved, log), id, resolved, log)
	if err != nil {
		return err
	}
	c.ev, c.unconfirmed, c.checked = ev, unconfirmed, true
	return nil
}

// standIn is res as Karpenter's own handling decides it: its NodePool without the router's
// annotations (a copy; the cache's object is not changed). It is how the router acts for a
// pool in shadow once Karpenter's rules no longer feed Karpenter.
func standIn(res cluster.Resolved) cluster.Resolved {
	if res.NodePool == nil {
		return res
	}
	np := res.NodePool.DeepCopy()
	for k := range np.Annotations {
		// The mode stays: it decides nothing but says why Karpenter's behaviour applies.
		if strings.HasPrefix(k, policy.Prefix) && k != policy.AnnotationMode {
			delete(np.Annotations, k)
		}
	}
	res.NodePool = np
	return res
}

// observe decides ev for a pool in shadow and records its would-be outcome, carrying nothing
// out. owner is true under --shadow, where nothing else acts for the router: a close then ends
// what the router holds, and a due deferral of before the shadow is dropped (Karpenter's own
// handling decides). A pool in shadow on an active router leaves both to act, which stands
// in for Karpenter.
func (p *Pipeline) observe(ctx context.Context, c *claim, id string, resolved cluster.Resolved, bulk *summary, redecide string, owner bool, out *policy.Decision, log *slog.Logger) (policy.Action, bool, error) {
	if redecide == "" && p.shadowRecorded(ctx, resolved.NodeClaim, c.ev, log) {
		return "", true, nil
	}
	if err := p.check(ctx, c, id, resolved, log); err != nil {
		return "", false, err
	}
	ev, unconfirmed := c.ev, c.unconfirmed
	o, ev, skipped, err := p.decide(ctx, ev, id, resolved, redecide != "", true, log)
	if err != nil || skipped {
		return "", skipped, err
	}
	if o.Decision.Cancel && owner {
		if o, err = p.confirmClose(ctx, ev, id, o, log); err != nil {
			return "", false, err
		}
	}
	if unconfirmed != "" {
		o.Decision.Warnings = append(o.Decision.Warnings, unconfirmed)
	}
	if out != nil {
		*out = o.Decision
	}
	return p.shadow(ctx, ev, o, redecide, bulk.quiet, owner, log)
}

// act decides ev for the instance and carries the outcome out (see instance).
func (p *Pipeline) act(ctx context.Context, c *claim, id string, resolved cluster.Resolved, bulk *summary, redecide string, out *policy.Decision, log *slog.Logger) (policy.Action, bool, error) {
	if redecide == "" && p.skip(c.ev, resolved.NodeClaim, p.memory(ctx, resolved.NodeClaim), log) {
		return "", true, nil
	}
	if err := p.check(ctx, c, id, resolved, log); err != nil {
		return "", false, err
	}
	ev, unconfirmed := c.ev, c.unconfirmed
	o, ev, skipped, err := p.decide(ctx, ev, id, resolved, redecide != "", false, log)
	if err != nil || skipped {
		return "", skipped, err
	}
	if o.Decision.Cancel {
		if o, err = p.confirmClose(ctx, ev, id, o, log); err != nil {
			return "", false, err
		}
	}
	// An urgent drain (a plausible Spot or reservation interruption, a Capacity Block's end, a
	// shutting-down EC2 confirmed) is not read again: no record changes its decision (it skips
	// deferral, pacing and gates), the signaller's stamp and memory keep a duplicate from
	// signalling twice, and Karpenter ignores one for a NodeClaim it deletes already. A reclaim
	// is when the API server is busiest: the read cost a request per warning, and the burst
	// bench's p99 with it.
	if destructive(o.Decision.Action) && o.Resolved.NodeClaim != nil && p.fresh != nil && !ev.Urgent() {
		var gone bool
		if o, gone, err = p.refresh(ctx, ev, o, redecide, log); err != nil || gone {
			return "", gone, err
		}
	}
	if unconfirmed != "" {
		o.Decision.Warnings = append(o.Decision.Warnings, unconfirmed)
	}
	d := o.Decision
	if out != nil {
		*out = d
	}
	ilog := log.With("node", d.Node, "nodepool", d.NodePool, "action", d.Action)
	p.count(ev, o)
	p.signal.PolicyProblems(o.Resolved, o.Problems)
	if d.Cancel {
		if err := p.cancelHeld(ctx, ev, o.Resolved, ilog); err != nil {
			p.metrics.SignalErrors.WithLabelValues(string(p.signal.Via(ev))).Inc()
			return "", false, err
		}
	}
	d, err = p.carryOut(ctx, ev, id, d, o.Resolved, bulk.quiet, ilog)
	if out != nil {
		*out = d
	}
	if err != nil {
		p.metrics.SignalErrors.WithLabelValues(string(p.signal.Via(ev))).Inc()
		return "", false, fmt.Errorf("carrying out %s: %w", d.Action, err)
	}
	bulk.add(o.Resolved.NodePool, d)
	p.tell(ev, d)
	return d.Action, false, nil
}

// plausible checks an urgent event against the node it names: a queue message is a claim,
// not a fact, and an urgent one skips pacing, gates and deferral. A Spot interruption warning
// for a NodeClaim whose capacity type is not spot, or a capacity-reservation interruption for
// one that is not reserved, is marked Implausible and loses its claimed deadline (decided as an
// ordinary drain with no deadline: paced, gated, deferred where the pool defers; never
// forwarded), with a warning in the decision and a metric. A NodeClaim without a capacity type (launched
// before Karpenter set it) is taken at its word.
func (p *Pipeline) plausible(ev event.Event, res cluster.Resolved, log *slog.Logger) event.Event {
	nc := res.NodeClaim
	if nc == nil || ev.Implausible != "" {
		return ev
	}
	ev.Implausible = signal.Implausible(ev, nc)
	if ev.Implausible != "" {
		// Its two-minute deadline is part of the claim: not trusted either, or it would
		// drain at once past pacing ("deadline minus drain-lead is reached").
		ev.Deadline = time.Time{}
		p.metrics.Implausible.WithLabelValues(string(ev.Kind)).Inc()
		log.Warn("implausible urgent event: decided as an ordinary drain", "nodeclaim", nc.Name, "capacity_type", nc.Labels[karpv1.CapacityTypeLabelKey], "why", ev.Implausible)
	}
	return ev
}

// confirmState checks an urgent state change (shutting-down, terminated) of a cluster node
// against EC2 before it is trusted: taken at its word it drains the node at once, past
// pacing, gates and deferral. EC2 showing the instance running or pending contradicts it (a
// forged message, or one so stale that the instance runs again): it is marked Implausible,
// decided as an ordinary drain as a forged Spot warning is, with the implausible metric and a
// warning. EC2 showing it in any other state, or no longer knowing it
// (InvalidInstanceID.NotFound: terminated a while ago), confirms it.
//
// EC2 not answering (throttled or down) holds the event for a bounded time: the message stays
// and is tried again, for StateConfirmWait from this router's first try. EC2's throttling is
// per account, so anyone in it can make EC2 unanswered at will, and a forged shutting-down
// taken at its word then drains at once, past pacing and gates. Past the bound it is acted on
// as claimed, and unconfirmed says so for the decision's warnings: an instance really shutting
// down is gone within minutes, and holding its drain longer would drain nothing before it
// goes; a forged event acted on then drains one node through Karpenter, gracefully, and the
// pool's urgent-drain breaker bounds how many (healthrouter.io/urgent-drain-max). EC2 refusing
// the call (a missing grant) does not heal by waiting: acted on as claimed at once.
//
// A stopping or stopped state change is asked about too: taken at its word it drains the node
// (Karpenter's behaviour) or holds it for restart-grace. EC2 showing the instance running or
// pending again says the stop is over (a stop/start whose `stopping` arrived after its
// `running`, which the router does not keep for a pool with nothing deferred) or never was:
// RunsAgain is set and the event is ignored. EC2 not answering leaves it as claimed: the node
// is drained as Karpenter would, and unconfirmed says so.
func (p *Pipeline) confirmState(ctx context.Context, ev event.Event, id string, res cluster.Resolved, log *slog.Logger) (_ event.Event, unconfirmed string, _ error) {
	stop := ev.Kind == event.KindStateChange && (ev.State == event.StateStopping || ev.State == event.StateStopped)
	if p.states == nil || ev.Kind != event.KindStateChange || !(ev.Urgent() || stop) || !res.Found() {
		return ev, "", nil
	}
	state, err := p.instanceState(ctx, id)
	if err != nil && !stop && awscalls.Classify(err) != awscalls.Denied {
		// The wait is the message's own: from SQS's first delivery of it, so the router keeps
		// no memory of it and a restart does not begin it again. An event that came from no
		// queue (zero) is returned to its caller to be tried again while EC2 does not answer.
		since := ev.FirstReceived
		if since.IsZero() {
			since = p.clock.Now()
		}
		if until := since.Add(StateConfirmWait); p.clock.Now().Before(until) {
			p.metrics.StateConfirmations.WithLabelValues(StateUnavailable).Inc()
			return ev, "", fmt.Errorf("the %s state of %s is not confirmed: EC2 did not answer (tried again until %s, then acted on as claimed): %w",
				ev.State, id, until.UTC().Format(time.RFC3339), err)
		}
	}
	ev, unconfirmed = p.stateOutcome(ev, stop, state, err, log)
	return ev, unconfirmed, nil
}

// StateConfirmWait is how long after its message was first received an urgent state change
// EC2 does not answer about is tried again before it is acted on as claimed (see
// confirmState).
const StateConfirmWait = 90 * time.Second

// stateOutcome applies EC2's answer (state, or err) about ev's instance: see confirmState.
func (p *Pipeline) stateOutcome(ev event.Event, stop bool, state ec2types.InstanceStateName, err error, log *slog.Logger) (_ event.Event, unconfirmed string) {
	switch {
	case stop && err == nil && (state == ec2types.InstanceStateNameRunning || state == ec2types.InstanceStateNamePending):
		p.metrics.StateConfirmations.WithLabelValues(StateContradicted).Inc()
		ev.RunsAgain = fmt.Sprintf("EC2 shows it %s", state)
		log.Info("stop contradicted by EC2: ignored", "state", ev.State, "ec2_state", state)
		return ev, ""
	case stop && err == nil:
		p.metrics.StateConfirmations.WithLabelValues(StateConfirmed).Inc()
		return ev, ""
	case err != nil:
		p.metrics.StateConfirmations.WithLabelValues(StateUnavailable).Inc()
		log.Warn("state change not confirmed: EC2 did not answer; acted on as claimed", "state", ev.State, "error", err)
		return ev, fmt.Sprintf("the %s state was not confirmed with EC2 (%v): acted on as claimed, the instance may be going away", ev.State, err)
	case state == ec2types.InstanceStateNameRunning || state == ec2types.InstanceStateNamePending:
		p.metrics.StateConfirmations.WithLabelValues(StateContradicted).Inc()
		p.metrics.Implausible.WithLabelValues(string(ev.Kind)).Inc()
		ev.Implausible = fmt.Sprintf("a %s state change for an instance EC2 shows %s", ev.State, state)
		ev.Deadline = time.Time{}
		log.Warn("implausible urgent event: decided as an ordinary drain", "state", ev.State, "ec2_state", state, "why", ev.Implausible)
		return ev, ""
	}
	p.metrics.StateConfirmations.WithLabelValues(StateConfirmed).Inc()
	return ev, ""
}

// confirmClose checks a closed AWS Health report of a maintenance EC2 schedules against EC2
// before it ends what holds the maintenance (deferrals, runs, drains): a queue message is a
// claim, and a forged close would otherwise cancel a deferral and have AWS act on a node the
// router no longer protects. EC2 still scheduling an event of that type for the instance at
// that start, not completed or cancelled, contradicts the close: the decision keeps what it
// holds (no Cancel) and says why. EC2 showing it closed, at another start or not at all
// confirms it. EC2 not answering is an error: the message stays and is tried again, the
// deferral kept meanwhile (the safe side: a drain in the window rather than AWS's act
// unprotected). A close AWS Health alone knows (a code EC2 has no event type for), and the
// router's own findings (EC2's own answer), are taken as they are.
func (p *Pipeline) confirmClose(ctx context.Context, ev event.Event, id string, o engine.Outcome, log *slog.Logger) (engine.Outcome, error) {
	if p.states == nil || ev.Source != "aws.health" || ev.Health == nil || ev.Health.Status != event.HealthClosed || ev.Health.Scheduled == "" || !o.Resolved.Found() {
		return o, nil
	}
	v, err, _ := p.stateOf.Do("events/"+id, func() (any, error) {
		return p.states.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{InstanceIds: []string{id}, IncludeAllInstances: aws.Bool(true)})
	})
	var ae smithy.APIError
	switch {
	case err != nil && errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound":
		// EC2 no longer knows the instance: no maintenance is scheduled for it.
		p.metrics.CloseConfirmations.WithLabelValues(CloseConfirmed).Inc()
		return o, nil
	case err != nil && awscalls.Classify(err) == awscalls.Denied:
		// A refusal does not heal by asking again: kept, and said (doctor checks the grant).
		p.metrics.CloseConfirmations.WithLabelValues(CloseUnavailable).Inc()
		why := fmt.Sprintf("AWS Health reports %s closed, but EC2 refused to confirm it (%v): what holds it is kept; grant ec2:DescribeInstanceStatus", ev.Health.EventARN, err)
		o.Decision.Cancel, o.Decision.Reason = false, why
		o.Decision.Warnings = append(o.Decision.Warnings, why)
		return o, nil
	case err != nil:
		p.metrics.CloseConfirmations.WithLabelValues(CloseUnavailable).Inc()
		return o, fmt.Errorf("confirming the close of %s with EC2 (kept until it answers): %w", ev.Health.EventARN, err)
	}
	out, _ := v.(*ec2.DescribeInstanceStatusOutput)
	if out == nil {
		out = &ec2.DescribeInstanceStatusOutput{}
	}
	for _, st := range out.InstanceStatuses {
		if aws.ToString(st.InstanceId) != id {
			continue
		}
		for _, e := range st.Events {
			if string(e.Code) != string(ev.Health.Scheduled) || e.NotBefore == nil || !e.NotBefore.Truncate(time.Second).Equal(ev.Deadline.Truncate(time.Second)) ||
				event.ClosedDescription(aws.ToString(e.Description)) {
				continue
			}
			p.metrics.CloseConfirmations.WithLabelValues(CloseContradicted).Inc()
			why := fmt.Sprintf("AWS Health reports %s closed, but EC2 still schedules %s for %s at %s (%s): what holds it is kept; a close EC2 contradicts is not trusted",
				ev.Health.EventARN, ev.Health.Scheduled, id, ev.Deadline.UTC().Format(time.RFC3339), aws.ToString(e.InstanceEventId))
			o.Decision.Cancel = false
			o.Decision.Reason = why
			o.Decision.Warnings = append(o.Decision.Warnings, why)
			log.Warn("close contradicted by EC2: kept", "event_arn", ev.Health.EventARN, "ec2_event", aws.ToString(e.InstanceEventId))
			return o, nil
		}
	}
	p.metrics.CloseConfirmations.WithLabelValues(CloseConfirmed).Inc()
	return o, nil
}

// instanceState returns the instance's state as EC2 reports it ("" when EC2 no longer knows
// the instance: terminated a while ago). An answer without the instance or its state is an
// error: nothing was confirmed.
func (p *Pipeline) instanceState(ctx context.Context, id string) (ec2types.InstanceStateName, error) {
	v, err, _ := p.stateOf.Do(id, func() (any, error) {
		return p.states.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{InstanceIds: []string{id}, IncludeAllInstances: aws.Bool(true)})
	})
	out, _ := v.(*ec2.DescribeInstanceStatusOutput)
	if err != nil {
		if ae := smithy.APIError(nil); errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound" {
			return "", nil
		}
		return "", fmt.Errorf("describing the status of instance %s: %w", id, err)
	}
	if out == nil {
		return "", fmt.Errorf("describing the status of instance %s: no answer", id)
	}
	for _, st := range out.InstanceStatuses {
		if aws.ToString(st.InstanceId) == id && st.InstanceState != nil && st.InstanceState.Name != "" {
			return st.InstanceState.Name, nil
		}
	}
	return "", fmt.Errorf("describing the status of instance %s: EC2's answer has no state for it", id)
}

// skip reports whether ev's outcome for the NodeClaim was recorded before (a redelivery, the
// other source's report of a recorded maintenance, an update older than its close) or the
// NodeClaim is being drained already: nothing to decide, nothing to write.
func (p *Pipeline) skip(ev event.Event, nc *karpv1.NodeClaim, mem record.Memory, log *slog.Logger) bool {
	if nc == nil {
		return false
	}
	if rec, ok := mem.Set().Recorded(ev); ok {
		log.Debug("outcome recorded already", "nodeclaim", nc.Name, "state", rec.State, "recorded_event", rec.EventID)
		p.metrics.AlreadyRecorded.Inc()
		return true
	}
	var stamped, via string
	ok := mem.Drain != nil
	if ok {
		stamped, via = mem.Drain.EventID, mem.Drain.Via
	}
	resend := ok && stamped == ev.ID && signal.Mode(via) == signal.ModeForward && nc.DeletionTimestamp.IsZero()
	if ok && stamped == ev.ID && !resend {
		p.metrics.AlreadyRecorded.Inc()
		return true
	}
	// A forward stamped by an earlier try of this event that Karpenter has not acted on yet
	// is decided again: the signaller sends it again (the earlier try may have died before
	// its send).
	if cluster.Draining(nc, mem) && !ev.Urgent() && !resend {
		// Being drained (by this event before a retry, or another): nothing to decide,
		// nothing to write. An urgent event still goes through and is recorded as a drain
		// (the signaller finds it draining already and signals nothing).
		log.Debug("outcome recorded already: being drained", "nodeclaim", nc.Name)
		p.metrics.AlreadyRecorded.Inc()
		return true
	}
	return false
}

// decide decides ev for the instance, moving its scheduled event into the pool's window
// first where the pool asks (and deciding the event as EC2 then holds it). It returns the
// event decided; skipped when the moved maintenance was recorded already.
func (p *Pipeline) decide(ctx context.Context, ev event.Event, id string, resolved cluster.Resolved, redecide, shadowed bool, log *slog.Logger) (engine.Outcome, event.Event, bool, error) {
	fixed := func(context.Context, string) (cluster.Resolved, error) { return resolved, nil }
	o, err := p.engine.DecideInstance(ctx, ev, fixed, id, p.clock.Now())
	if err != nil {
		return engine.Outcome{}, ev, false, err
	}
	d := o.Decision
	eligible := p.resched != nil && !redecide && o.Resolved.NodePool != nil &&
		reschedule.Eligible(ev, d.Action, o.Resolved.NodeClaim != nil, policy.FromAnnotations(o.Resolved.NodePool.Annotations))
	if eligible && shadowed {
		// Moving the event is a write at EC2: in shadow it is only said.
		o.Decision.Reason = "would move the scheduled event into the window (" + policy.AnnotationReschedule + "); " + o.Decision.Reason
		eligible = false
	}
	if eligible {
		moved, how, changed, result := p.reschedule(ctx, ev, id, o.Resolved)
		if result == reschedule.ResultUnavailable {
			if r, ok := postpones(o.Resolved.NodeClaim, p.memory(ctx, o.Resolved.NodeClaim), ev); ok {
				// EC2 does not answer, and this report puts the maintenance of an active record
				// later: it may be AWS postponing it, or a report sent before the router moved it
				// earlier, into the window (SQS and retries reorder). Only EC2 can tell, and
				// taking it as a move would give up the earlier start EC2 may hold: the message
				// stays, and is retried; the record keeps the earlier start meanwhile (the safe
				// side). A report of an earlier start is taken at its word.
				return engine.Outcome{}, ev, false, fmt.Errorf("%s: its start %s is later than the %s of the active record %s, and EC2 cannot be asked which one it holds: retried",
					how, ev.Deadline.UTC().Format(time.RFC3339), r.Match, r.EventID)
			}
		}
		if changed {
			// The event as EC2 now holds it: it may be a maintenance recorded already (the
			// other source's view of an event moved before).
			if _, recorded := p.memory(ctx, o.Resolved.NodeClaim).Set().Recorded(moved); recorded {
				log.Debug("outcome recorded already: the moved maintenance", "nodeclaim", o.Resolved.NodeClaim.Name, "start", moved.Deadline)
				p.metrics.AlreadyRecorded.Inc()
				return engine.Outcome{}, ev, true, nil
			}
			ev = moved
			if o, err = p.engine.DecideInstance(ctx, ev, fixed, id, p.clock.Now()); err != nil {
				return engine.Outcome{}, ev, false, err
			}
		}
		o.Decision.Reason = how + "; " + o.Decision.Reason
	}
	if o.Decision.Action == policy.ActionDefer && o.Resolved.NodeClaim == nil {
		// A deferral lives on the NodeClaim; an instance without one is not Karpenter's.
		o.Decision.Action, o.Decision.Hold = policy.ActionSkip, ""
		o.Decision.Reason = "would defer (" + o.Decision.Reason + "), but the instance has no NodeClaim: Karpenter does not manage it"
	}
	return o, ev, false, nil
}

// shadowed reports whether the instance's outcome is only recorded: its pool is in shadow
// (healthrouter.io/mode=shadow), or the whole router is (--shadow).
func (p *Pipeline) shadowed(res cluster.Resolved) bool {
	if p.shadowAll {
		return true
	}
	return res.NodePool != nil && res.NodeClaim != nil && policy.FromAnnotations(res.NodePool.Annotations).Shadow
}

// shadowRecorded reports whether ev's would-be outcome is recorded on the NodeClaim already.
// Unlike skip, a NodeClaim Karpenter is draining is decided: that is the comparison a shadow
// run exists for.
func (p *Pipeline) shadowRecorded(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event, log *slog.Logger) bool {
	outs, _ := shadow.Read(p.memory(ctx, nc)) // unreadable: decided, and the write says why it cannot record
	if shadow.Recorded(outs, ev) {
		log.Debug("shadow outcome recorded already", "nodeclaim", nc.Name)
		p.metrics.AlreadyRecorded.Inc()
		return true
	}
	return false
}

// shadow records the would-be outcome of a shadow pool's decision and carries nothing out:
// no drain, deferral, reboot, mark or pod notice (the webhook is told what would have been
// done). Under --shadow (owner), a close still reaches the actions begun before the router went
// into shadow (ending them is the safe side), and a deferral of that time coming due is
// dropped: the events are Karpenter's own handling's now. A pool in shadow on an active router
// leaves both to the decision the router carries out for Karpenter (see instance).
func (p *Pipeline) shadow(ctx context.Context, ev event.Event, o engine.Outcome, redecide string, quiet, owner bool, log *slog.Logger) (policy.Action, bool, error) {
	d := o.Decision
	p.engine.Unreserve(d.NodePool, d.NodeClaim) // nothing is signalled: no pacing slot is held
	ilog := log.With("node", d.Node, "nodepool", d.NodePool, "action", d.Action)
	if d.Cancel && owner {
		// A close ends what the router holds, in shadow too (a deferral written before the
		// pool went to shadow would come due once it is active again): the held runs and
		// drains, and the deferrals. A NodeClaim with no active record gets no write.
		if err := p.cancelHeld(ctx, ev, o.Resolved, ilog); err != nil {
			return "", false, err
		}
		if nc := o.Resolved.NodeClaim; nc != nil && slices.ContainsFunc(p.memory(ctx, nc).Records, record.Record.Active) {
			if _, err := p.signal.Close(ctx, ev, d, o.Resolved); err != nil {
				return "", false, err
			}
		}
	}
	if redecide != "" && o.Resolved.NodeClaim != nil && owner {
		if err := p.signal.Drop(ctx, o.Resolved.NodeClaim, redecide, "its pool is in shadow now: nothing is carried out, Karpenter's own handling decides"); err != nil {
			return "", false, err
		}
	}
	recorded, err := p.signal.Shadow(ctx, ev, d, o.Resolved, quiet)
	if err != nil {
		return "", false, err
	}
	if !recorded {
		p.metrics.AlreadyRecorded.Inc()
		return "", true, nil
	}
	p.metrics.ShadowDecisions.WithLabelValues(string(ev.Kind), string(d.Action), d.NodePool).Inc()
	if p.ledger != nil {
		out := shadow.OutcomeOf(ev, d, p.clock.Now())
		p.ledger.Add(shadow.Entry{NodePool: d.NodePool, NodeClaim: d.NodeClaim, Node: d.Node, Instance: d.InstanceID, Kind: ev.Kind, EventID: ev.ID,
			Start: ev.Deadline.UTC(), Decided: out.Decided, Would: d.Action, WouldAt: out.At, Hold: d.Hold, Reason: d.Reason})
	}
	if p.notify != nil && d.Action != policy.ActionSkip {
		n := notify.FromDecision(ev, d, p.cluster)
		n.Phase = notify.PhaseShadow
		p.notify.Notify(n)
	}
	ilog.Info("shadow: would-be outcome recorded, nothing carried out", "until", d.Until, "hold", d.Hold, "reason", d.Reason)
	return d.Action, false, nil
}

// destructive reports whether an action cannot be taken back: the node is drained or
// emptied and rebooted.
func destructive(a policy.Action) bool {
	return a == policy.ActionDrain || a == policy.ActionRebootInPlace
}

// refresh reads the NodeClaim of a destructive outcome fresh from the API server (read fresh
// before you destroy: the decision rests on its records, and the cache may not show a write
// of a moment ago, such as a close, a `running`, or another worker's outcome). Unchanged, the
// outcome stands. Changed, the event is skipped if its outcome is recorded now (or, for a due
// deferral, that deferral is no longer active), and else decided again on the fresh NodeClaim.
// gone is true when nothing is left to do.
func (p *Pipeline) refresh(ctx context.Context, ev event.Event, o engine.Outcome, redecide string, log *slog.Logger) (engine.Outcome, bool, error) {
	cached := o.Resolved.NodeClaim
	fresh := &karpv1.NodeClaim{}
	if err := p.fresh.Get(ctx, client.ObjectKeyFromObject(cached), fresh); err != nil {
		p.engine.Unreserve(o.Decision.NodePool, o.Decision.NodeClaim)
		if apierrors.IsNotFound(err) {
			p.metrics.AlreadyRecorded.Inc()
			return o, true, nil // gone: drained already
		}
		return o, false, fmt.Errorf("reading nodeclaim %s before a %s: %w", cached.Name, o.Decision.Action, err)
	}
	freshMem, err := record.Load(ctx, p.fresh, cached.Name)
	if err != nil {
		p.engine.Unreserve(o.Decision.NodePool, o.Decision.NodeClaim)
		return o, false, fmt.Errorf("reading the healthrecord of nodeclaim %s before a %s: %w", cached.Name, o.Decision.Action, err)
	}
	if fresh.ResourceVersion == cached.ResourceVersion && freshMem.Equal(p.memory(ctx, cached)) {
		return o, false, nil
	}
	p.engine.Unreserve(o.Decision.NodePool, o.Decision.NodeClaim)
	if redecide != "" {
		if !slices.ContainsFunc(freshMem.Records, func(r record.Record) bool { return r.EventID == redecide && r.Active() }) {
			log.Info("deferral ended meanwhile: not decided again", "nodeclaim", fresh.Name)
			p.metrics.AlreadyRecorded.Inc()
			return o, true, nil
		}
	} else if p.skip(ev, fresh, freshMem, log) {
		return o, true, nil
	}
	res := o.Resolved
	res.NodeClaim, res.Memory = fresh, &freshMem
	again, err := p.engine.DecideInstance(ctx, ev, func(context.Context, string) (cluster.Resolved, error) { return res, nil }, res.InstanceID, p.clock.Now())
	if err != nil {
		return o, false, err
	}
	if again.Decision.Action != o.Decision.Action {
		log.Info("decided again on the nodeclaim as the API server holds it", "nodeclaim", fresh.Name, "was", o.Decision.Action, "now", again.Decision.Action)
	}
	return again, false, nil
}

// count counts the decision (and its checks, holds, unmanaged nodes).
func (p *Pipeline) count(ev event.Event, o engine.Outcome) {
	d := o.Decision
	p.metrics.Decisions.WithLabelValues(string(ev.Kind), string(d.Action), d.NodePool).Inc()
	if p.publisher != nil {
		p.publisher.Decision(string(ev.Kind), string(d.Action))
	}
	for _, c := range d.Checks {
		p.metrics.CheckResults.WithLabelValues(c.Name, checkResult(c)).Inc()
	}
	if o.Resolved.Node != nil && o.Resolved.NodeClaim == nil {
		p.metrics.Unmanaged.WithLabelValues(string(ev.Kind), string(d.Action)).Inc()
	}
	if d.Action == policy.ActionDefer && (d.Hold == policy.HoldPDB || d.Hold == policy.HoldAlerts || d.Hold == policy.HoldRepairCutoff || d.Hold == policy.HoldUrgentBreaker) {
		p.metrics.GateHolds.WithLabelValues(string(d.Hold)).Inc()
	}
	if d.Action == policy.ActionDefer && d.Hold == policy.HoldUrgentBreaker {
		p.signal.UrgentDrainsHeld(o.Resolved, ev, d)
	}
}

// cancelHeld carries a close to every action that holds state for the instance (Holder).
func (p *Pipeline) cancelHeld(ctx context.Context, ev event.Event, res cluster.Resolved, log *slog.Logger) error {
	var errs []error
	for _, h := range p.holders {
		ended, err := h.Cancel(ctx, res, ev)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ended {
			log.Info("a held action ended by the close", "holder", fmt.Sprintf("%T", h))
		}
	}
	return errors.Join(errs...)
}

// carryOut carries the decision out, one way per action, and returns it as carried out (a
// reboot in place that waits for another run becomes a deferral; one the router cannot do
// becomes a drain).
func (p *Pipeline) carryOut(ctx context.Context, ev event.Event, id string, d policy.Decision, res cluster.Resolved, quiet bool, log *slog.Logger) (policy.Decision, error) {
	unmanaged := res.Node != nil && res.NodeClaim == nil
	var err error
	switch {
	case unmanaged && d.Action == policy.ActionDrain:
		err = p.drainUnmanaged(ctx, ev, d, res, quiet)
	case unmanaged && d.Action == policy.ActionSkip:
		// Nothing to do, and nothing to retry: told once per event on the Node.
		if !quiet {
			p.signal.NotManaged(res, ev, d)
		}
		log.Info("skipped", "reason", d.Reason)
	case d.Action == policy.ActionRebootInPlace && p.inPlace == nil:
		// The router was started without the reboot in place (--reboot-in-place=false):
		// the node is replaced, as a drain, and the decision says so.
		d.Action = policy.ActionDrain
		d.Warnings = append(d.Warnings, "reboot-in-place is off in this router (--reboot-in-place=false): the node is replaced instead")
		err = p.drain(ctx, ev, d, res, quiet, log)
	case d.Action == policy.ActionRebootInPlace:
		d, err = p.rebootInPlace(ctx, ev, id, d, res, quiet, log)
	case d.Action == policy.ActionDrain:
		err = p.drain(ctx, ev, d, res, quiet, log)
	case d.Action == policy.ActionDefer:
		if _, err = p.signal.Defer(ctx, ev, d, res, quiet); err == nil {
			log.Info("deferred", "until", d.Until, "hold", d.Hold, "reason", d.Reason)
		}
	case d.Action == policy.ActionIgnore:
		if err = p.signal.Ignore(ctx, ev, d, res, quiet); err == nil {
			log.Info("ignored", "reason", d.Reason)
		}
	case d.Action == policy.ActionSkip:
		log.Info("skipped", "reason", d.Reason)
	}
	return d, err
}

// drain signals Karpenter to drain the node; a failure gives the pacing slot back (nothing
// was signalled: a stamp comes first).
func (p *Pipeline) drain(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool, log *slog.Logger) error {
	already, err := p.signal.Drain(ctx, ev, d, res, quiet)
	if err != nil {
		p.engine.Unreserve(d.NodePool, d.NodeClaim)
		return err
	}
	log.Info("drain signalled", "reason", d.Reason, "already_draining", already, "via", p.signal.Via(ev))
	return nil
}

// rebootInPlace begins the node's reboot in place. While a run of another maintenance is in
// progress on it, or Karpenter is rebooting it, the event is held (a deferral, HoldInPlace) and decided again later: it is
// not handled by the run in progress.
func (p *Pipeline) rebootInPlace(ctx context.Context, ev event.Event, id string, d policy.Decision, res cluster.Resolved, quiet bool, log *slog.Logger) (policy.Decision, error) {
	one, err := p.restrict(ev, id)
	if err != nil {
		p.engine.Unreserve(d.NodePool, d.NodeClaim)
		return d, err
	}
	already, err := p.signal.InPlace(ctx, ev, d, res, func(ctx context.Context, nc *karpv1.NodeClaim) (bool, error) { return p.inPlace.Begin(ctx, nc, one) })
	if err == nil {
		log.Info("reboot in place begun", "reason", d.Reason, "already", already)
		return d, nil
	}
	p.engine.Unreserve(d.NodePool, d.NodeClaim)
	if !errors.Is(err, inplace.ErrBusy) {
		return d, err
	}
	d.Action, d.Hold, d.Until = policy.ActionDefer, policy.HoldInPlace, p.clock.Now().Add(policy.InPlaceRecheck)
	if !d.Deadline.IsZero() && d.Deadline.Before(d.Until) {
		d.Until = d.Deadline
	}
	d.Reason = "held: the node is being rebooted already (" + err.Error() + "); " + d.Reason
	if _, err := p.signal.Defer(ctx, ev, d, res, quiet); err != nil {
		return d, err
	}
	log.Info("deferred", "until", d.Until, "hold", d.Hold, "reason", d.Reason)
	return d, nil
}

// tell notifies the webhook and the node's pods of the outcome.
func (p *Pipeline) tell(ev event.Event, d policy.Decision) {
	if p.notify != nil && d.Action != policy.ActionSkip {
		p.notify.Notify(notify.FromDecision(ev, d, p.cluster))
	}
	if p.pods != nil && (d.Action == policy.ActionDrain || d.Action == policy.ActionDefer || d.Action == policy.ActionRebootInPlace) {
		p.pods.Notify(podnotice.Notice{EventID: ev.ID, Kind: ev.Kind, Action: d.Action, Hold: d.Hold, Until: d.Until, Deadline: d.Deadline,
			Node: d.Node, NodePool: d.NodePool, Reason: d.Reason})
	}
}

// reschedule moves the instance's scheduled event into its pool's window (reschedule.Attempt)
// and returns the event as EC2 then holds it (changed: it starts at another time than ev
// says) and what was done, for the decision's reason.
func (p *Pipeline) reschedule(ctx context.Context, ev event.Event, id string, res cluster.Resolved) (event.Event, string, bool, string) {
	one, err := p.restrict(ev, id)
	if err != nil {
		p.metrics.Reschedules.WithLabelValues(reschedule.ResultNotMoved).Inc()
		return ev, "not rescheduled: " + err.Error(), false, reschedule.ResultNotMoved
	}
	out := reschedule.Attempt(ctx, p.resched, one, id, policy.FromAnnotations(res.NodePool.Annotations), p.clock.Now())
	p.metrics.Reschedules.WithLabelValues(out.Result).Inc()
	if out.Result == reschedule.ResultMoved {
		p.signal.Rescheduled(res, ev, out.Note)
		p.log.Info("scheduled event moved into the window", "event_id", ev.ID, "instance", id, "ec2_event", out.EventID, "from", out.From, "to", out.To)
	}
	if !out.Changed {
		return ev, out.Note, false, out.Result
	}
	return out.Event, out.Note, true, out.Result
}

// postpones returns the active record of nc whose maintenance ev would move later: the same
// kind of maintenance at a later start (record.Rescheduled), under its own key (an older update)
// or another source's.
func postpones(nc *karpv1.NodeClaim, mem record.Memory, ev event.Event) (record.Record, bool) {
	if nc == nil {
		return record.Record{}, false
	}
	set := mem.Set()
	match := record.Match(ev)
	for _, r := range set.Active() {
		if r.Kind != event.KindScheduledChange || r.EventID == ev.ID || !record.Rescheduled(r.Match, match) {
			continue
		}
		_, at, _ := strings.Cut(r.Match, "@")
		if start, err := time.Parse(time.RFC3339, at); err == nil && ev.Deadline.After(start) {
			return r, true
		}
	}
	return record.Record{}, false
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
	already, err := p.nodes.Begin(ctx, res.Node, drainOf(ev, d.Deadline))
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

// memory is the router's memory of nc from the cache (nil, or unreadable: nothing is
// recorded as far as this router can tell).
func (p *Pipeline) memory(ctx context.Context, nc *karpv1.NodeClaim) record.Memory {
	return p.signal.Store().Of(ctx, nc)
}
