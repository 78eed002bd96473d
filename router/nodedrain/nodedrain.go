// Package nodedrain drains the Nodes Karpenter does not manage (EKS managed node groups,
// self-managed nodes: a Node with no NodeClaim) when an AWS event concerns them, as
// aws-node-termination-handler does: the router cordons the Node and evicts its pods through
// the Eviction API with kubectl's drain helper, so that PodDisruptionBudgets are respected
// and never overridden. The drain's record lives in the router's store (router/record: the
// Node's HealthRecord, which only the router writes), never on the Node, whose annotations
// anyone with `patch nodes` writes: the elected router resumes every unfinished drain from the
// store, one bounded pass at a time. The Node carries only the cordon; whenever the router's
// cordon is on it, a record that says so (Record.Cordoned) exists: a new record is written
// before the cordon, and a cordon goes before the record that owns it.
package nodedrain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/drain"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/record"
)

// Kubernetes Event reasons, on the drained Node.
const (
	// ReasonNodeDrained: no evictable pod is left; the record is done.
	ReasonNodeDrained = "HealthEventNodeDrained"
	// ReasonNodeDrainBlocked (Warning): a PodDisruptionBudget still refuses an eviction past
	// the drain's deadline. The router keeps trying; it never overrides the budget.
	ReasonNodeDrainBlocked = "HealthEventNodeDrainBlocked"
	// ReasonNodeDrainEnded: the drain ended without the instance going away (its
	// maintenance was cancelled, or AWS completed a reboot): the router uncordoned the Node
	// if it had cordoned it.
	ReasonNodeDrainEnded = "HealthEventNodeDrainEnded"
	// ReasonNodeDrainFeatureOff (Warning): the router runs without
	// --unmanaged-nodes=cordon-drain, and the Node carries a drain an earlier router began: it
	// is carried to its end (a close still ends it), and no new one begins.
	ReasonNodeDrainFeatureOff = "HealthEventNodeDrainFeatureOff"
)

// Drain is what Begin records: the event a Node is drained for. To Cancel it is the closing
// event: its keys, or (Resumes) an instance running again at EventTime.
type Drain struct {
	EventID, Key, Match, Kind string
	// EventTime is when the event happened (EventBridge's time).
	EventTime time.Time
	// Resumes marks a `running` state change: it ends a drain for a stop that happened before.
	Resumes bool
	// Recovers marks the poller's finding that the instance passes its status checks again:
	// it ends a drain for the instance's impairment.
	Recovers bool
	// Deadline bounds the drain (the event's deadline minus drain-lead), or zero.
	Deadline time.Time
	// Release: see Record.Release.
	Release time.Time
}

// eventAction is the action of every Event this package posts.
const eventAction = "Drain"

// Defaults of Options.
const (
	DefaultInterval     = 10 * time.Second
	DefaultEvictTimeout = 30 * time.Second
	DefaultPerPass      = 50
)

// evictRetryDelay is how long the drain helper waits before it asks again for an eviction a
// PodDisruptionBudget refused (kubectl's own default): the budget changes only when a pod
// elsewhere becomes ready, and an eviction every few milliseconds would only load the API
// server. It is shortened for a short EvictTimeout so that a round still asks more than once.
const evictRetryDelay = 5 * time.Second

// Options tune the drainer; zero values take the defaults.
type Options struct {
	// Interval is the time between passes.
	Interval time.Duration
	// EvictTimeout bounds one node's eviction round in a pass: the helper's retries of
	// refused evictions and its wait for evicted pods to be gone.
	EvictTimeout time.Duration
	// PerPass is how many Nodes one pass works on, at once.
	PerPass int
	// Off says the router does not begin drains (--unmanaged-nodes is not cordon-drain): the
	// drainer still carries the ones an earlier router began to their end, each told once with
	// a Warning (ReasonNodeDrainFeatureOff).
	Off bool
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.EvictTimeout <= 0 {
		o.EvictTimeout = DefaultEvictTimeout
	}
	if o.PerPass <= 0 {
		o.PerPass = DefaultPerPass
	}
	return o
}

// Drainer cordons and drains Nodes whose HealthRecord holds a Record, one pass at a time.
type Drainer struct {
	kube     client.Client        // Node and HealthRecord reads (usually the cache) and writes
	api      client.Reader        // fresh reads (the API server, not the cache)
	store    *record.Store        // the drains' records
	cs       kubernetes.Interface // the drain helper's pod listing and evictions
	clock    clock.WithTicker
	recorder events.EventRecorder
	log      *slog.Logger
	opts     Options

	draining atomic.Int64
	mu       sync.Mutex
	// lastTried is when this process last worked on each Node, so that each pass starts with
	// the drains it has waited on longest.
	lastTried map[string]time.Time
	// warned are the drains (node/event) told as carried on with the feature off.
	warned map[string]bool
}

// New returns a Drainer. kube reads Nodes and HealthRecords (a cache will do: the passes list
// the records from there) and writes them; api reads from the API server where a decision
// rests on what the cache trims or may not show yet (a Node's cordon, its status, a record
// just written); cs lists the pods of a Node and evicts them.
func New(kube client.Client, api client.Reader, cs kubernetes.Interface, clk clock.WithTicker, rec events.EventRecorder, log *slog.Logger, opts Options) *Drainer {
	return &Drainer{kube: kube, api: api, store: record.NewStore(kube, api), cs: cs, clock: clk, recorder: rec, log: log, opts: opts.withDefaults(),
		lastTried: map[string]time.Time{}, warned: map[string]bool{}}
}

// NeedLeaderElection reports true: two routers draining the same Node would double the
// evictions and fight over its record.
func (d *Drainer) NeedLeaderElection() bool { return true }

// Draining returns the number of Nodes whose drain was unfinished at the end of the last pass.
func (d *Drainer) Draining() int { return int(d.draining.Load()) }

// Start runs Pass every Options.Interval until ctx ends (manager.Runnable, on the leader).
func (d *Drainer) Start(ctx context.Context) error {
	t := d.clock.NewTicker(d.opts.Interval)
	defer t.Stop()
	for {
		if _, err := d.Pass(ctx); err != nil && ctx.Err() == nil {
			d.log.Error("node drain pass", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// Begin records the drain in the store and cordons the Node (optimistic lock, retried on
// conflict, idempotent): already=true when the Node has an unfinished drain, or a finished one
// of the same event. That drain then holds the Node for dr's maintenance too (Record.hold): a
// postponed or rescheduled maintenance moves its release, a second one is held beside it, so
// that the Node is not handed back before AWS carries the last of them out. A finished drain
// of another event is replaced: the instance was drained before and is now drained again (an
// operator may have uncordoned it meanwhile); the maintenances it still held are carried over.
// The Node is read fresh, not from the router's cache, which trims spec.unschedulable: whether
// the router cordons it (and so may uncordon it) is decided on what the Node is. The record is
// written before the cordon: a Begin that stops between the two leaves a record that says
// Cordoned on a Node that is not, and its retry (the same event) cordons it.
func (d *Drainer) Begin(ctx context.Context, node *corev1.Node, dr Drain) (already bool, err error) {
	if dr.EventID == "" {
		return false, fmt.Errorf("beginning a drain of node %s: no event ID", node.Name)
	}
	fresh, err := d.node(ctx, node.Name)
	if err != nil {
		return false, fmt.Errorf("beginning a drain of node %s: reading it: %w", node.Name, err)
	}
	cordon := false
	err = d.store.UpdateNode(ctx, fresh, func(m *record.Memory) (bool, error) {
		cordon = false
		prev, found, err := Of(*m)
		if err != nil {
			// A record this router cannot read (a newer router's): overwriting it would lose
			// what it meant.
			return false, err
		}
		stale := found && ((prev.Running && dr.Kind == prev.Kind && !dr.EventTime.After(prev.EventTime)) ||
			(!prev.RunningSince.IsZero() && dr.Resumable() && !dr.EventTime.After(prev.RunningSince)) ||
			(prev.Closed && !dr.EventTime.IsZero() && !dr.EventTime.After(prev.EventTime) &&
				((dr.Key != "" && prev.Key == dr.Key) || sameMaintenance(prev.Match, dr.Match))))
		already = stale || (found && !prev.Closed && (!prev.Finished() || prev.EventID == dr.EventID || (dr.Key != "" && prev.Key == dr.Key)))
		if stale {
			return false, nil
		}
		if already {
			// An earlier Begin of this drain stopped between the record and the cordon.
			cordon = prev.EventID == dr.EventID && !prev.Finished() && prev.Cordoned && !fresh.Spec.Unschedulable
			if !prev.hold(dr) {
				return false, nil
			}
			put(m, prev)
			return true, nil
		}
		// A finished drain's cordon is still the router's if the Node is still cordoned.
		cordoned := !fresh.Spec.Unschedulable || (found && prev.Cordoned)
		rec := Record{EventID: dr.EventID, Key: dr.Key, Match: dr.Match, Kind: dr.Kind, EventTime: dr.EventTime, Started: d.clock.Now(), Deadline: dr.Deadline,
			Release: dr.Release, Cordoned: cordoned}
		if found && !prev.Closed && !prev.Running {
			carry(&rec, prev)
		}
		put(m, rec)
		cordon = !fresh.Spec.Unschedulable
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("beginning a drain of node %s: %w", node.Name, err)
	}
	if cordon {
		if err := d.setCordon(ctx, node.Name, true); err != nil {
			return already, fmt.Errorf("beginning a drain of node %s: cordoning it: %w", node.Name, err)
		}
	}
	if !already {
		d.log.Info("node cordoned for a drain", "node", node.Name, "event_id", dr.EventID, "kind", dr.Kind, "deadline", dr.Deadline)
	}
	return already, nil
}

// setCordon makes the Node named name unschedulable (on) or schedulable again, read fresh and
// written under its resource version, again after a conflict; a Node already so, or gone, is
// left as it is.
func (d *Drainer) setCordon(ctx context.Context, name string, on bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := d.node(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.Spec.Unschedulable == on {
			return nil
		}
		next := cur.DeepCopy()
		next.Spec.Unschedulable = on
		err = d.kube.Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// carry holds the new drain rec for the maintenances the finished drain prev it replaces
// still held (a reboot AWS has yet to carry out): each is taken as a report (Record.hold), so
// that a newer report of rec's own maintenance replaces it, and another is held beside it.
func carry(rec *Record, prev Record) {
	held := prev.Also
	if prev.Match != "" {
		held = append([]Held{prev.own()}, held...)
	}
	for _, h := range held {
		rec.hold(Drain{EventID: h.EventID, Key: h.Key, Match: h.Match, EventTime: h.EventTime, Deadline: h.Deadline, Release: h.Release})
	}
}

// Resumable reports whether the drain is one a `running` of the instance after it ends: a
// stop's (a state change).
func (dr Drain) Resumable() bool { return dr.Kind == stateChangeKind && !dr.Resumes }

// stateChangeKind is router/event's KindStateChange, restated: this package is below event's
// users in the pipeline and names kinds as strings.
const stateChangeKind = "state-change"

// scheduledChangeKind is router/event's KindScheduledChange, restated.
const scheduledChangeKind = "scheduled-change"

// impairedKey is in the key of a drain for an impairment the poller found (the finding's
// event ID, router/event's StatusFinding.ID: <prefix><instance>/impaired/<since>).
const impairedKey = "/impaired/"

// HeldImpaired returns the instances of Nodes this router cordons for an impairment: the
// poller watches them, and hands one that passes its checks again over as recovered, which
// ends the drain (Cancel, Drain.Recovers). Read from the cache at every poll, so that a
// restart forgets none.
func (d *Drainer) HeldImpaired(ctx context.Context) ([]string, error) {
	var ids []string
	err := d.records(ctx, func(hr *record.HealthRecord, rec Record) {
		if !rec.Running && strings.Contains(rec.Key, impairedKey) && hr.Spec.InstanceID != "" {
			ids = append(ids, hr.Spec.InstanceID)
		}
	})
	return ids, err
}

// records calls f with every Node's drain record the cache holds, and the HealthRecord it is
// in (the cache's own object: read it, never change it). A record that does not parse is
// passed by, said in the log.
func (d *Drainer) records(ctx context.Context, f func(*record.HealthRecord, Record)) error {
	var hrs record.HealthRecordList
	// Every HealthRecord is read, without copies, to find the few of Nodes: the drains are
	// too few to warrant an index of their own.
	if err := d.kube.List(ctx, &hrs, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing healthrecords: %w", err)
	}
	for i := range hrs.Items {
		hr := &hrs.Items[i]
		if !hr.OfNode() || len(hr.Status.NodeDrain) == 0 {
			continue
		}
		mem, err := hr.Memory()
		if err == nil {
			var rec Record
			var ok bool
			if rec, ok, err = Of(mem); err == nil && ok {
				f(hr, rec)
				continue
			}
		}
		if err != nil {
			d.log.Warn("node drain record ignored", "node", hr.Spec.NodeName, "healthrecord", hr.Name, "error", err)
		}
	}
	return nil
}

// node reads a Node from the API server.
func (d *Drainer) node(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	if err := d.api.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		return nil, err
	}
	return n, nil
}

// Cancel ends the Node's drain if it is for the maintenance that closes (a closed event:
// the same event ID or key, or the same maintenance, Record.Match), for an impairment the
// instance recovered from (Drain.Recovers), or for a stop of the instance that now runs again
// (Drain.Resumes, after the stop): the record goes and the Node is uncordoned if the router
// cordoned it. A drain that holds the Node for another maintenance too (Record.Also) is handed
// on to it instead, and a close of such a maintenance drops it from the drain. It reports
// whether it ended a drain.
func (d *Drainer) Cancel(ctx context.Context, name string, dr Drain) (bool, error) {
	node, err := d.node(ctx, name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading node %s: %w", name, err)
	}
	if dr.Resumes {
		return d.resume(ctx, node, dr)
	}
	if dr.Recovers {
		return d.settle(ctx, node, "the instance passes its status checks again ("+dr.EventID+")", func(cur Record) (Record, bool) {
			if cur.Kind != dr.Kind || !strings.Contains(cur.Key, impairedKey) {
				return cur, false
			}
			next, ok := cur.handOn()
			return next, !ok
		})
	}
	ended, err := d.settle(ctx, node, "its maintenance was cancelled ("+dr.Kind+" "+dr.EventID+")", func(cur Record) (Record, bool) {
		return cur.closes(dr)
	})
	if err != nil {
		return false, err
	}
	// The close is kept on a Node with no drain of its own now: an older report of the same
	// maintenance that arrives after it begins none.
	if err := d.tombstone(ctx, name, dr); err != nil {
		return ended, err
	}
	return ended, nil
}

// settle applies f to the Node's drain as the write finds it (an unfinished or finished
// drain, not a close or a running kept): f returns the drain as it stands after, or end=true
// to end it (the record goes, the Node is uncordoned if the router cordoned it: the cordon
// first, then the record that owns it). Deciding on the record as written, not as first read,
// keeps a maintenance that Begin took into the drain meanwhile (Record.Also) from being
// dropped with it. It says why on the Node and reports whether the drain ended.
func (d *Drainer) settle(ctx context.Context, node *corev1.Node, why string, f func(cur Record) (next Record, end bool)) (bool, error) {
	var ended, from, held *Record
	var handed string
	uncordoned := false
	err := d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		ended, from, held, handed = nil, nil, nil, ""
		cur, ok, err := Of(*m)
		if err != nil || !ok || cur.Closed || cur.Running {
			return false, nil
		}
		next, end := f(cur)
		if end {
			c := cur
			ended = &c
			if cur.Cordoned {
				if err := d.setCordon(ctx, node.Name, false); err != nil {
					return false, fmt.Errorf("uncordoning it: %w", err)
				}
				uncordoned = true
			}
			m.NodeDrain = nil
			return true, nil
		}
		n := next
		held = &n
		if next.EventID == cur.EventID && slices.EqualFunc(next.Also, cur.Also, sameHeld) {
			return false, nil
		}
		if next.EventID != cur.EventID {
			c := cur
			from, handed = &c, next.EventID
		}
		put(m, next)
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("recording the drain of node %s: %w", node.Name, err)
	}
	if ended == nil && uncordoned && held != nil && held.Cordoned {
		// An earlier try ended the drain and uncordoned the Node, but its write found the drain
		// holding the Node for a maintenance taken in meanwhile: the cordon is its again.
		if err := d.setCordon(ctx, node.Name, true); err != nil {
			return false, fmt.Errorf("cordoning node %s again: %w", node.Name, err)
		}
	}
	d.mu.Lock()
	if ended != nil {
		delete(d.lastTried, node.Name)
	}
	d.mu.Unlock()
	switch {
	case ended != nil:
		d.ended(node, *ended, why)
	case from != nil:
		d.log.Info("node drain holds on", "node", node.Name, "event_id", from.EventID, "why", why, "now_for", handed)
	}
	return ended != nil, nil
}

// sameHeld compares two held maintenances.
func sameHeld(a, b Held) bool { return a.EventID == b.EventID && a.EventTime.Equal(b.EventTime) }

// tombstone records the close dr for the Node when it has no record (or only an earlier close):
// a drain in progress, a finished one, or a running is left as it is.
func (d *Drainer) tombstone(ctx context.Context, name string, dr Drain) error {
	if dr.EventTime.IsZero() || (dr.Key == "" && dr.Match == "") {
		return nil // nothing a late report could be told apart by
	}
	node, err := d.node(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", name, err)
	}
	err = d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		cur, found, err := Of(*m)
		if err != nil || (found && !cur.Closed) || (found && !dr.EventTime.After(cur.EventTime) && cur.Key == dr.Key) {
			return false, nil
		}
		now := d.clock.Now()
		// The running the close it replaces kept (RunningSince) is kept too: the poller
		// reports a cancelled event at every poll, each report newer than the last, and a
		// stop from before the running, arriving late, must still begin no drain.
		put(m, Record{EventID: dr.EventID, Key: dr.Key, Match: dr.Match, Kind: dr.Kind, EventTime: dr.EventTime,
			Started: now, Done: &now, Closed: true, RunningSince: cur.RunningSince})
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("recording the close for node %s: %w", name, err)
	}
	return nil
}

// resume handles a `running` of the instance (dr.Resumes): a drain for a stop from before it
// ends (the stop is over: the record goes, the Node is uncordoned if the router cordoned it),
// and the `running` is kept in its place, so that a stop from before it that arrives late
// (SQS reorders, workers decide at once) begins none (Begin). All of it is decided on the
// record as the write finds it: a stop's Begin racing this running (two workers of one batch)
// either comes first, and its drain is ended here, or finds the running.
func (d *Drainer) resume(ctx context.Context, node *corev1.Node, dr Drain) (bool, error) {
	var ended *Record
	err := d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		ended = nil
		cur, found, err := Of(*m)
		if err != nil {
			return false, nil // not one this router can trace
		}
		switch {
		case !found, cur.Running && dr.EventTime.After(cur.EventTime):
			// No drain to end; this running is the latest.
		case !cur.Running && cur.Kind == dr.Kind && !cur.EventTime.IsZero() && dr.EventTime.After(cur.EventTime) && len(cur.Also) > 0:
			// The stop is over, but the drain holds the Node for a maintenance still to come.
			next, _ := cur.handOn()
			next.RunningSince = dr.EventTime
			put(m, next)
			return true, nil
		case !cur.Running && cur.Kind == dr.Kind && !cur.EventTime.IsZero() && dr.EventTime.After(cur.EventTime):
			c := cur
			ended = &c
			// The cordon goes first: the record that owns it is replaced below.
			if cur.Cordoned {
				if err := d.setCordon(ctx, node.Name, false); err != nil {
					return false, fmt.Errorf("uncordoning it: %w", err)
				}
			}
		case !cur.Running && cur.Finished() && cur.RunningSince.Before(dr.EventTime):
			// Another event's drain, finished, stays (its release is still to come): the
			// running is kept beside it, so that a stop from before it begins no drain.
			cur.RunningSince = dr.EventTime
			put(m, cur)
			return true, nil
		default:
			return false, nil // a drain in progress, or a later running recorded
		}
		now := d.clock.Now()
		put(m, Record{EventID: dr.EventID, Key: dr.Key, Kind: dr.Kind, EventTime: dr.EventTime, Started: now, Done: &now, Running: true})
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("recording the running of node %s: %w", node.Name, err)
	}
	if ended == nil {
		return false, nil
	}
	d.recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonNodeDrainEnded, eventAction, "%s (%s): the drain ended: the instance runs again (%s); %s",
		ended.Kind, ended.EventID, dr.EventID, map[bool]string{true: "uncordoned", false: "left cordoned: it was cordoned before the drain"}[ended.Cordoned])
	d.log.Info("node drain ended", "node", node.Name, "event_id", ended.EventID, "why", "the instance runs again", "uncordoned", ended.Cordoned)
	return true, nil
}

// sameMaintenance is router/record's SameMaintenance ("<type>@<not-before>", the type
// empty where unknown), restated: this package is below record in the pipeline.
func sameMaintenance(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	ta, at, _ := strings.Cut(a, "@")
	tb, bt, _ := strings.Cut(b, "@")
	return at == bt && (ta == tb || ta == "" || tb == "")
}

// ended says on the Node why its drain rec ended.
func (d *Drainer) ended(node *corev1.Node, rec Record, why string) {
	how := "left cordoned: it was cordoned before the drain"
	if rec.Cordoned {
		how = "uncordoned"
	}
	d.recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonNodeDrainEnded, eventAction, "%s (%s): the drain ended: %s; %s", rec.Kind, rec.EventID, why, how)
	d.log.Info("node drain ended", "node", node.Name, "event_id", rec.EventID, "why", why, "uncordoned", rec.Cordoned)
}

// featureOff tells, once per drain, that a drain an earlier router began is carried to its end
// by a router that begins none.
func (d *Drainer) featureOff(node *corev1.Node, rec Record) {
	key := node.Name + "/" + rec.EventID
	d.mu.Lock()
	told := d.warned[key]
	d.warned[key] = true
	d.mu.Unlock()
	if told {
		return
	}
	d.recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonNodeDrainFeatureOff, eventAction,
		"%s (%s): --unmanaged-nodes is not cordon-drain in this router, but an earlier one began this drain: it is carried to its end (a close still ends it); no new drain begins", rec.Kind, rec.EventID)
	d.log.Warn("unmanaged-node drain carried on with cordon-drain off", "node", node.Name, "event_id", rec.EventID)
}

// Forget removes the record and uncordons the Node, if the router cordoned it (the cordon
// first, then the record); no-op without a record. It reads the record fresh, not from the
// cache: a cancellation can follow Begin closely, before the cache shows the record, and "no
// record" would then leave the Node cordoned. A record that does not parse is removed, but
// the Node stays cordoned: who cordoned it is not known.
func (d *Drainer) Forget(ctx context.Context, name string) error {
	node, err := d.node(ctx, name)
	if apierrors.IsNotFound(err) {
		// Gone: its record goes with it (the garbage collector's work, done now).
		return d.store.DeleteNode(ctx, name)
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", name, err)
	}
	err = d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		if len(m.NodeDrain) == 0 {
			return false, nil
		}
		if rec, _, err := Of(*m); err == nil && rec.Cordoned {
			if err := d.setCordon(ctx, name, false); err != nil {
				return false, fmt.Errorf("uncordoning it: %w", err)
			}
		}
		m.NodeDrain = nil
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("forgetting the drain of node %s: %w", name, err)
	}
	d.mu.Lock()
	delete(d.lastTried, name)
	d.mu.Unlock()
	return nil
}

// Pass evicts the pods of every Node whose record in the store is unfinished, once (bounded
// work per pass: Options.PerPass nodes at once, each eviction round bounded by
// Options.EvictTimeout), marks a record Done once only DaemonSet and mirror pods remain, and
// posts Events on the Node: ReasonNodeDrained when done, ReasonNodeDrainBlocked (Warning,
// once per record) when a PodDisruptionBudget refuses an eviction past the record's
// deadline. It returns the number of Nodes still draining. Nothing on the Node is read as a
// drain: only the router writes the store.
func (d *Drainer) Pass(ctx context.Context) (int, error) {
	type found struct {
		hr  *record.HealthRecord
		rec Record
	}
	var all []found
	if err := d.records(ctx, func(hr *record.HealthRecord, rec Record) { all = append(all, found{hr, rec}) }); err != nil {
		return d.Draining(), err
	}
	var todo []pending
	byName := map[string]*corev1.Node{}
	now := d.clock.Now()
	var errs []error
	for _, f := range all {
		rec, name := f.rec, f.hr.Spec.NodeName
		if at, held := rec.ReleaseAt(); rec.Finished() && held && !now.Before(at) {
			if err := d.release(ctx, name, rec, at); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if rec.Finished() {
			continue
		}
		n := &corev1.Node{}
		if err := d.kube.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			if !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("reading node %s: %w", name, err))
			}
			continue // gone: the garbage collector removes its record
		}
		if uid := f.hr.NodeUID(); uid != "" && n.UID != "" && uid != n.UID {
			continue // the record of an earlier Node of the same name, not of this one
		}
		if d.opts.Off {
			d.featureOff(n, rec)
		}
		todo = append(todo, pending{node: name, rec: rec})
		byName[name] = n
	}
	d.mu.Lock()
	for name := range d.lastTried {
		if byName[name] == nil {
			delete(d.lastTried, name) // done, forgotten or gone
		}
	}
	order(todo, d.lastTried)
	work := todo[:min(len(todo), d.opts.PerPass)]
	for _, p := range work {
		d.lastTried[p.node] = now
	}
	d.mu.Unlock()

	// The Nodes of a pass drain at once: each round mostly waits (on a budget, on pods
	// terminating), and one after the other, a pass of many Nodes would outlast a Spot
	// warning's two minutes.
	var wg sync.WaitGroup
	finished := make([]bool, len(work))
	roundErrs := make([]error, len(work))
	for i, p := range work {
		wg.Go(func() {
			finished[i], roundErrs[i] = d.drainNode(ctx, byName[p.node], p.rec)
		})
	}
	wg.Wait()
	errs = append(errs, roundErrs...)
	left := len(todo)
	for _, f := range finished {
		if f {
			left--
		}
	}
	d.draining.Store(int64(left))
	return left, errors.Join(errs...)
}

// release ends a finished drain whose maintenance AWS kept the instance through, once the
// Node is Ready (read fresh: the cache trims Node status): AWS's reboot is over.
func (d *Drainer) release(ctx context.Context, name string, rec Record, at time.Time) error {
	node, err := d.node(ctx, name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", name, err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			_, err := d.settle(ctx, node, "AWS's maintenance is over ("+at.UTC().Format(time.RFC3339)+") and the Node is Ready", func(cur Record) (Record, bool) {
				// Ended as the pass found it: a maintenance taken in meanwhile holds it on.
				return cur, cur.EventID == rec.EventID && slices.EqualFunc(cur.Also, rec.Also, sameHeld)
			})
			return err
		}
	}
	return nil // not Ready yet: the next pass looks again
}

// drainNode runs one eviction round on a Node and records its outcome. A drain whose record
// says the router cordons the Node first makes sure it is cordoned: a Begin that stopped
// between its record and its cordon, with no retry to come, would otherwise evict pods from a
// schedulable Node, where the scheduler puts them back.
func (d *Drainer) drainNode(ctx context.Context, node *corev1.Node, rec Record) (finished bool, err error) {
	log := d.log.With("node", node.Name, "event_id", rec.EventID, "kind", rec.Kind)
	if rec.Cordoned {
		if err := d.setCordon(ctx, node.Name, true); err != nil {
			return false, fmt.Errorf("cordoning node %s before its eviction round: %w", node.Name, err)
		}
	}
	round, err := EvictRound(ctx, d.cs, node.Name, d.opts.EvictTimeout, log)
	pods := round.Left
	if err == nil && len(pods) == 0 {
		return d.finish(ctx, node, rec, log)
	}

	why := fmt.Sprintf("%d pod(s) left", len(pods))
	if err != nil {
		why = err.Error()
	}
	refused := round.Refused
	overdue := len(refused) > 0 && rec.Overdue(d.clock.Now())
	// warn is decided on the record as written, not as the cache showed it: a pass that read
	// a stale copy must not warn a second time.
	warn := false
	uerr := d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		warn = false
		cur, ok, err := Of(*m)
		if err != nil || !ok || cur.EventID != rec.EventID || cur.Finished() {
			return false, nil // forgotten, replaced or finished meanwhile: nothing of ours to record
		}
		cur.Attempts++
		cur.LastError = truncate(why, lastErrorMax)
		if overdue && !cur.Warned {
			cur.Warned, warn = true, true
		}
		put(m, cur)
		return true, nil
	})
	if uerr != nil {
		return false, fmt.Errorf("recording the drain of node %s: %w", node.Name, uerr)
	}
	if warn && uerr == nil {
		d.recorder.Eventf(node, nil, corev1.EventTypeWarning, ReasonNodeDrainBlocked, eventAction,
			"%s (%s): past the drain's deadline %s, a PodDisruptionBudget still refuses to evict %s; the router keeps trying and never overrides it",
			rec.Kind, rec.EventID, rec.Deadline.UTC().Format(time.RFC3339), BlockedNote(refused))
	}
	// The round's failure is the drain's, recorded on it and retried by the next pass (a
	// refusal is the budget doing its job; pods still terminating are progress); only a
	// failure to record it is the pass's.
	log.Info("node drain unfinished", "pods_left", len(pods), "pdb_refused", len(refused), "error", err)
	return false, nil
}

// finish marks the record done and says so on the Node.
func (d *Drainer) finish(ctx context.Context, node *corev1.Node, rec Record, log *slog.Logger) (bool, error) {
	now := d.clock.Now()
	// Only the pass that writes Done says so: another one may have read a stale copy.
	wrote := false
	err := d.store.UpdateNode(ctx, node, func(m *record.Memory) (bool, error) {
		wrote = false
		cur, ok, err := Of(*m)
		if err != nil || !ok || cur.EventID != rec.EventID || cur.Finished() {
			return false, nil
		}
		cur.Done, cur.LastError = &now, ""
		put(m, cur)
		wrote = true
		return true, nil
	})
	if err != nil {
		return false, fmt.Errorf("recording the end of the drain of node %s: %w", node.Name, err)
	}
	if !wrote {
		return true, nil
	}
	d.recorder.Eventf(node, nil, corev1.EventTypeNormal, ReasonNodeDrained, eventAction,
		"%s (%s): drained by the router, no evictable pod left (started %s)", rec.Kind, rec.EventID, rec.Started.UTC().Format(time.RFC3339))
	log.Info("node drained", "started", rec.Started)
	return true, nil
}

// Round is what one eviction round left on a Node.
type Round struct {
	// Left are the pods still to evict at the end of the round: refused by a budget, still
	// terminating, or not reached before the round's bound. DaemonSet and mirror pods are
	// never counted: they stay.
	Left []corev1.Pod
	// Refused maps "namespace/pod" to the API server's explanation, for each pod a
	// PodDisruptionBudget still refused to let go at the end of the round.
	Refused map[string]string
}

// EvictRound evicts the pods of node once, through the Eviction API with kubectl's drain
// helper (budgets respected, never a plain delete; DaemonSet and mirror pods left in place),
// and waits for the evicted pods to be gone, for at most timeout. It is the router's one way
// to empty a Node: the drain of unmanaged Nodes (Drainer) and the reboot in place
// (router/inplace) both use it. It neither cordons nor records anything.
func EvictRound(ctx context.Context, cs kubernetes.Interface, node string, timeout time.Duration, log *slog.Logger) (Round, error) {
	obs := &observer{refused: map[string]string{}}
	h := helper(ctx, cs, timeout, obs, log)
	pods, err := podsToEvict(h, node)
	if err == nil && len(pods) > 0 {
		err = evict(h, cs, pods)
		if left, lerr := podsToEvict(h, node); lerr != nil {
			err = errors.Join(err, lerr)
		} else {
			pods = left
		}
	}
	return Round{Left: pods, Refused: obs.snapshot()}, err
}

// helper configures kubectl's drain helper for one round on one Node.
func helper(ctx context.Context, cs kubernetes.Interface, timeout time.Duration, obs *observer, log *slog.Logger) *drain.Helper {
	retryDelay := min(evictRetryDelay, timeout/4)
	out := logWriter{ctx: ctx, log: log, level: slog.LevelDebug}
	return &drain.Helper{
		Ctx:    ctx,
		Client: observed{Interface: cs, obs: obs},
		// Force lets the helper evict pods that no controller owns (it touches nothing else:
		// budgets still apply). Without it one bare pod fails the whole drain, and the pod
		// dies with the instance anyway; evicted, it at least gets its graceful termination.
		// aws-node-termination-handler drains the same way.
		Force: true,
		// DaemonSet pods stay: their controller would put them back on the cordoned Node
		// (they tolerate unschedulable), and they serve the Node to its end (logs, CNI).
		IgnoreAllDaemonSets: true,
		// emptyDir data goes with the instance whether or not the pod is evicted first.
		DeleteEmptyDirData: true,
		// -1: each pod's own terminationGracePeriodSeconds.
		GracePeriodSeconds:   -1,
		Timeout:              timeout,
		EvictErrorRetryDelay: retryDelay,
		// Never delete: a pod is only ever evicted, so that budgets hold (see evict).
		DisableEviction: false,
		Out:             out,
		ErrOut:          out,
		OnPodDeletionOrEvictionFinished: func(p *corev1.Pod, _ bool, err error) {
			if err == nil {
				log.Info("pod evicted", "pod", p.Namespace+"/"+p.Name)
			}
		},
	}
}

// podsToEvict lists the pods the helper would evict from node: every pod but DaemonSet and
// mirror pods (and pods terminating: they are waited for).
func podsToEvict(h *drain.Helper, node string) ([]corev1.Pod, error) {
	list, errs := h.GetPodsForDeletion(node)
	if len(errs) > 0 {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, errors.Join(errs...))
	}
	return list.Pods(), nil
}

// evict runs one eviction round. The helper deletes pods outright when the API server does
// not advertise the Eviction API: that would bypass every budget, so the round refuses to
// start then. Every API server EKS runs serves policy/v1 evictions.
func evict(h *drain.Helper, cs kubernetes.Interface, pods []corev1.Pod) error {
	gv, err := drain.CheckEvictionSupport(cs)
	if err != nil {
		return fmt.Errorf("discovering the eviction API: %w", err)
	}
	if gv != policyv1.SchemeGroupVersion {
		return fmt.Errorf("the API server does not serve policy/v1 evictions (found %q): refusing to delete pods without their budgets", gv.String())
	}
	return h.DeleteOrEvictPods(pods)
}

// logWriter turns the drain helper's progress lines into log records.
type logWriter struct {
	ctx   context.Context
	log   *slog.Logger
	level slog.Level
}

func (w logWriter) Write(p []byte) (int, error) {
	if msg := strings.TrimSpace(string(p)); msg != "" {
		w.log.Log(w.ctx, w.level, "drain helper", "detail", msg)
	}
	return len(p), nil
}
