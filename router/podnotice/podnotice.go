// Package podnotice tells the owners of the pods on a node what the router decided for it:
// one Kubernetes Event per pod when its node's drain is decided or deferred (what, why, the
// planned time), so that `kubectl describe pod` and `kubectl get events -n team` show it
// to the people who run the workload, not only to the platform team.
//
// It is bounded, because a bulk event names thousands of nodes: at most PerNode pods of one
// node and PerEvent pods of one event get their own Event; the pods past either bound are
// counted per namespace, and each namespace gets one summary Event (regarding the Namespace,
// in the namespace) per event and decision, rewritten in place as its counts grow. It never
// blocks a decision: notices wait in a bounded queue (a full queue drops the notice and
// counts it), and the pod reads take their own rate limit, below the client's, so that
// decisions keep theirs.
package podnotice

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
)

// Event reasons on pods and namespaces.
const (
	// ReasonDrain: the node is being drained now (Karpenter evicts the pod shortly).
	ReasonDrain = "HealthRouterNodeDrain"
	// ReasonDeferred: the node's drain is planned (the pool's window, deadline minus
	// drain-lead) or held (pacing, a check, a gate) until the time the Event says.
	ReasonDeferred = "HealthRouterNodeMaintenance"
	// ReasonSummary: the pods of one namespace past the bounds, counted.
	ReasonSummary = "HealthRouterMaintenanceSummary"
)

// Defaults of Options.
const (
	DefaultPerEvent = 1000
	DefaultPerNode  = 110 // the kubelet's default max-pods
	DefaultQueue    = 4096
	// DefaultQPS bounds the pod reads (one per node): the decisions' own client budget is
	// left to them.
	DefaultQPS = 20
	// DefaultReporter is the reporting controller of the summary Events: the name the router's
	// Event recorder reports as.
	DefaultReporter = "health-router"
)

// Notice is one decision for one node.
type Notice struct {
	EventID  string
	Kind     event.Kind
	Action   policy.Action // drain or defer
	Hold     policy.Hold
	Until    time.Time // the planned time of a deferral
	Deadline time.Time // when AWS acts; zero when it does not
	Node     string
	NodePool string
	Reason   string
}

// Options bound the notices.
type Options struct {
	PerEvent, PerNode, Queue int
	QPS                      float32
	// Reporter and Instance are the summary Events' reporting controller and instance
	// (default DefaultReporter, and Reporter-<hostname> as the recorder's).
	Reporter, Instance string
}

// kubeAPI is what the Notifier reads and writes itself: the pods of a node (the API
// server's field selector: the live router does not cache Pods) and the summary Events.
// The pods' own Events go through the recorder.
type kubeAPI interface {
	List(context.Context, client.ObjectList, ...client.ListOption) error
	Create(context.Context, client.Object, ...client.CreateOption) error
	Patch(context.Context, client.Object, client.Patch, ...client.PatchOption) error
}

// Notifier writes the Events. Start runs its worker (on every replica: the replica that
// decides notifies); Notify hands it a notice.
type Notifier struct {
	kube     kubeAPI
	recorder events.EventRecorder
	clock    clock.Clock
	log      *slog.Logger
	opts     Options
	limiter  flowcontrol.RateLimiter

	queue chan Notice

	mu sync.Mutex
	// events: what each event has written so far, and the summaries still to write.
	events map[string]*budget
	// last is the last notice per node and event: a decision that is re-made with the same
	// outcome (a held drain rechecked) is not told again.
	last map[string]string

	written, dropped *prometheus.CounterVec
}

type budget struct {
	at      time.Time
	written int
	// past counts the pods past the bounds per summary key (namespace and outcome).
	past map[summaryKey]*tally
}

type summaryKey struct {
	namespace string
	action    policy.Action
	until     time.Time
}

type tally struct {
	pods    int
	nodes   map[string]bool
	flushed int // pods counted in the last summary written
	notice  Notice
}

// New returns a Notifier; reg may be nil.
func New(kube kubeAPI, recorder events.EventRecorder, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer, opts Options) *Notifier {
	if opts.PerEvent <= 0 {
		opts.PerEvent = DefaultPerEvent
	}
	if opts.PerNode <= 0 {
		opts.PerNode = DefaultPerNode
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	if opts.QPS <= 0 {
		opts.QPS = DefaultQPS
	}
	if opts.Reporter == "" {
		opts.Reporter = DefaultReporter
	}
	if opts.Instance == "" {
		host, _ := os.Hostname()
		opts.Instance = opts.Reporter + "-" + host
	}
	n := &Notifier{kube: kube, recorder: recorder, clock: clk, log: log, opts: opts,
		limiter: flowcontrol.NewTokenBucketRateLimiter(opts.QPS, int(opts.QPS)),
		queue:   make(chan Notice, opts.Queue), events: map[string]*budget{}, last: map[string]string{},
		written: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "health_router_pod_events_total",
			Help: "Kubernetes Events written for the pods of nodes whose drain was decided or deferred, by kind: pod (one per pod) or summary (one per namespace past the bounds)."}, []string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "health_router_pod_notices_dropped_total",
			Help: "Node decisions whose pods were not told, by reason: queue-full, or list-failed (the pods could not be read)."}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(n.written, n.dropped)
	}
	return n
}

// Notify hands a decision over; it never blocks. Only drains and deferrals are told, and a
// deferral re-made with the same hold and time is not told again.
func (n *Notifier) Notify(x Notice) {
	if x.Node == "" || (x.Action != policy.ActionDrain && x.Action != policy.ActionDefer && x.Action != policy.ActionRebootInPlace) {
		return
	}
	key, val := x.Node+"/"+x.EventID, fmt.Sprintf("%s/%s/%d", x.Action, x.Hold, x.Until.Unix())
	if x.Hold != policy.HoldWindow && x.Hold != policy.HoldDeadline && x.Hold != policy.HoldRestartGrace {
		val = fmt.Sprintf("%s/%s", x.Action, x.Hold) // a hold on live state is rechecked often: told once
	}
	n.mu.Lock()
	if n.last[key] == val {
		n.mu.Unlock()
		return
	}
	if len(n.last) >= 4*n.opts.Queue { // bounded: forgetting only risks telling again
		clear(n.last)
	}
	n.last[key] = val
	n.mu.Unlock()
	select {
	case n.queue <- x:
	default:
		n.dropped.WithLabelValues("queue-full").Inc()
	}
}

// NeedLeaderElection is false: every replica tells what it decides.
func (n *Notifier) NeedLeaderElection() bool { return false }

// Start works the queue until ctx ends; summaries are written when the queue runs empty.
func (n *Notifier) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case x := <-n.queue:
			n.Handle(ctx, x)
			if len(n.queue) == 0 {
				n.Flush(ctx)
			}
		}
	}
}

// Handle tells the pods of one notice's node (Start calls it; tests call it directly).
func (n *Notifier) Handle(ctx context.Context, x Notice) {
	if err := n.limiter.Wait(ctx); err != nil {
		return
	}
	var pods corev1.PodList
	if err := n.kube.List(ctx, &pods, client.MatchingFields{gates.IndexPodNode: x.Node}); err != nil {
		n.dropped.WithLabelValues("list-failed").Inc()
		n.log.Error("reading the pods of a node to tell them", "node", x.Node, "event_id", x.EventID, "err", err)
		return
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		a, b := pods.Items[i], pods.Items[j]
		return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
	})
	n.mu.Lock()
	b := n.budget(x.EventID)
	var tell []*corev1.Pod
	perNode := 0
	for i := range pods.Items {
		p := &pods.Items[i]
		if !gates.Evicted(p) {
			continue
		}
		if perNode < n.opts.PerNode && b.written < n.opts.PerEvent {
			perNode++
			b.written++
			tell = append(tell, p)
			continue
		}
		k := summaryKey{namespace: p.Namespace, action: x.Action, until: x.Until}
		t := b.past[k]
		if t == nil {
			t = &tally{nodes: map[string]bool{}, notice: x}
			b.past[k] = t
		}
		t.pods++
		t.nodes[x.Node] = true
	}
	n.mu.Unlock()
	reason, note := message(x)
	for _, p := range tell {
		n.recorder.Eventf(p, nil, corev1.EventTypeNormal, reason, string(x.Action), "%s", note)
		n.written.WithLabelValues("pod").Inc()
	}
}

// Flush writes a summary per namespace for the pods past the bounds since the last one. A
// summary that grows is rewritten in place: the recorder would fold it into the first one's
// series and keep the first one's note, with the first one's counts.
func (n *Notifier) Flush(ctx context.Context) {
	type pending struct {
		k           summaryKey
		t           *tally
		pods, nodes int
		first       bool
		notice      Notice
	}
	var out []pending
	n.mu.Lock()
	for _, b := range n.events {
		for k, t := range b.past {
			if t.pods > t.flushed {
				out = append(out, pending{k, t, t.pods, len(t.nodes), t.flushed == 0, t.notice})
			}
		}
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		return out[i].k.namespace < out[j].k.namespace || (out[i].k.namespace == out[j].k.namespace && out[i].notice.EventID < out[j].notice.EventID)
	})
	for _, s := range out {
		_, note := message(s.notice)
		note = fmt.Sprintf("%d pods of this namespace on %d nodes past the bounds of pod Events (%d per node, %d per event); for example %s",
			s.pods, s.nodes, n.opts.PerNode, n.opts.PerEvent, note)
		if err := n.summary(ctx, s.k, s.notice.EventID, note, s.first); err != nil {
			// Not counted as written: the next flush writes it again.
			n.log.Error("writing the summary Event of a namespace", "namespace", s.k.namespace, "event_id", s.notice.EventID, "err", err)
			continue
		}
		n.mu.Lock()
		s.t.flushed = max(s.t.flushed, s.pods)
		n.mu.Unlock()
		n.written.WithLabelValues("summary").Inc()
	}
}

// summary creates the summary Event of k, or rewrites its note. Its name is derived from
// the event and k, so that every write of one summary lands on one Event.
func (n *Notifier) summary(ctx context.Context, k summaryKey, eventID, note string, first bool) error {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%s/%d", eventID, k.action, k.until.Unix())
	name := fmt.Sprintf("%s.healthrouter-summary-%016x", k.namespace, h.Sum64())
	if len(note) > maxNote {
		note = note[:maxNote]
	}
	if first {
		err := n.kube.Create(ctx, &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.namespace},
			EventTime:  metav1.NewMicroTime(n.clock.Now()),
			// A namespaced Event must name its own namespace in regarding.
			Regarding:           corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: k.namespace, Namespace: k.namespace},
			ReportingController: n.opts.Reporter, ReportingInstance: n.opts.Instance,
			Action: string(k.action), Reason: ReasonSummary, Note: note, Type: corev1.EventTypeNormal,
		})
		if !apierrors.IsAlreadyExists(err) { // else written before this Notifier started: rewritten below
			return err
		}
	}
	// events.k8s.io/v1 refuses a change of an Event's note; the core API serves the same
	// object and lets its message change.
	patch, err := json.Marshal(map[string]any{"message": note})
	if err != nil {
		return err
	}
	return n.kube.Patch(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.namespace}}, client.RawPatch(types.MergePatchType, patch))
}

// maxNote is the API server's bound on an Event's note.
const maxNote = 1024

// budget returns the event's budget (n.mu held), forgetting events told more than a day ago.
func (n *Notifier) budget(eventID string) *budget {
	now := n.clock.Now()
	if b := n.events[eventID]; b != nil {
		return b
	}
	for id, b := range n.events {
		if now.Sub(b.at) > 24*time.Hour {
			delete(n.events, id)
		}
	}
	b := &budget{at: now, past: map[summaryKey]*tally{}}
	n.events[eventID] = b
	return b
}

// message is an Event's reason and note for a notice.
func message(x Notice) (reason, note string) {
	what := string(x.Kind)
	if x.Deadline.IsZero() {
		what += " (" + x.EventID + ")"
	} else {
		what += fmt.Sprintf(" (%s, AWS acts at %s)", x.EventID, x.Deadline.UTC().Format(time.RFC3339))
	}
	if x.Action == policy.ActionRebootInPlace {
		return ReasonDrain, fmt.Sprintf("node %s (nodepool %s) is being emptied for %s: it reboots in place and comes back; this pod will be evicted and rescheduled elsewhere", x.Node, x.NodePool, what)
	}
	if x.Action == policy.ActionDrain {
		return ReasonDrain, fmt.Sprintf("node %s (nodepool %s) is being drained for %s: this pod will be evicted and rescheduled elsewhere", x.Node, x.NodePool, what)
	}
	hold := ""
	if x.Hold != "" {
		hold = " (" + string(x.Hold) + ")"
	}
	return ReasonDeferred, fmt.Sprintf("node %s (nodepool %s) will be drained for %s: planned at %s%s; this pod will then be evicted and rescheduled elsewhere",
		x.Node, x.NodePool, what, x.Until.UTC().Format(time.RFC3339), hold)
}
