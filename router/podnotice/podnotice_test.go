package podnotice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
)

var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

func pod(ns, name, node string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func daemon(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: ptr.To(true)}}
}
func mirror(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} }
func done(p *corev1.Pod)   { p.Status.Phase = corev1.PodSucceeded }

func newNotifier(t *testing.T, opts Options, failList bool, objs ...client.Object) (*Notifier, *events.FakeRecorder) {
	t.Helper()
	n, rec, _ := newNotifierWith(t, opts, interceptor.Funcs{}, failList, objs...)
	return n, rec
}

// newNotifierWith returns a Notifier on a fake API server, and that server's client to read
// the summary Events with. As the real one, it serves an Event in both APIs: a message
// patched through the core API is the note of the events.k8s.io Event.
func newNotifierWith(t *testing.T, opts Options, funcs interceptor.Funcs, failList bool, objs ...client.Object) (*Notifier, *events.FakeRecorder, client.Client) {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	for _, ix := range gates.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	if failList {
		funcs.List = func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
			return errors.New("connection refused")
		}
	}
	if funcs.Patch == nil {
		funcs.Patch = corePatch
	}
	c := b.WithInterceptorFuncs(funcs).Build()
	rec := events.NewFakeRecorder(10000)
	opts.QPS = 1000
	return New(c, rec, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), opts), rec, c
}

// corePatch applies a merge patch of a core Event's message to the events.k8s.io Event.
func corePatch(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if _, ok := obj.(*corev1.Event); !ok {
		return c.Patch(ctx, obj, patch, opts...)
	}
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	var m struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	var e eventsv1.Event
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &e); err != nil {
		return err
	}
	e.Note = m.Message
	return c.Update(ctx, &e)
}

// summaries returns the summary Events' notes by namespace.
func summaries(t *testing.T, c client.Client) map[string][]string {
	t.Helper()
	var evs eventsv1.EventList
	if err := c.List(context.Background(), &evs); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range evs.Items {
		if e.Reason != ReasonSummary {
			continue
		}
		if e.Regarding.Kind != "Namespace" || e.Regarding.Name != e.Namespace || e.Regarding.Namespace != e.Namespace || e.ReportingController != DefaultReporter || e.EventTime.IsZero() {
			t.Errorf("summary Event %s/%s: regarding %+v, reported by %q, at %s", e.Namespace, e.Name, e.Regarding, e.ReportingController, e.EventTime)
		}
		out[e.Namespace] = append(out[e.Namespace], e.Note)
	}
	return out
}

func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func deferral(node string) Notice {
	return Notice{EventID: "ev-1", Kind: event.KindScheduledChange, Action: policy.ActionDefer, Hold: policy.HoldWindow,
		Until: now.Add(72 * time.Hour), Deadline: now.Add(14 * 24 * time.Hour), Node: node, NodePool: "kafka"}
}

func TestHandle(t *testing.T) {
	n, rec := newNotifier(t, Options{}, false,
		pod("kafka", "kafka-0", "node-a"), pod("team", "web-1", "node-a"), pod("kube-system", "aws-node-x", "node-a", daemon),
		pod("kube-system", "static", "node-a", mirror), pod("batch", "job-1", "node-a", done), pod("kafka", "kafka-1", "node-b"))
	n.Handle(context.Background(), deferral("node-a"))
	got := drain(rec)
	if len(got) != 2 {
		t.Fatalf("%d Events, want 2 (the evicted pods of node-a only):\n%s", len(got), strings.Join(got, "\n"))
	}
	for _, e := range got {
		for _, want := range []string{"Normal", ReasonDeferred, "node node-a (nodepool kafka) will be drained for scheduled-change (ev-1", "planned at 2026-11-27T12:00:00Z (window)"} {
			if !strings.Contains(e, want) {
				t.Errorf("Event %q lacks %q", e, want)
			}
		}
	}
	n.Handle(context.Background(), Notice{EventID: "ev-2", Kind: event.KindSpotInterruption, Action: policy.ActionDrain, Node: "node-b", NodePool: "kafka", Deadline: now.Add(2 * time.Minute)})
	if got := drain(rec); len(got) != 1 || !strings.Contains(got[0], ReasonDrain) || !strings.Contains(got[0], "is being drained") {
		t.Errorf("drain Events %v", got)
	}
	if w := testutil.ToFloat64(n.written.WithLabelValues("pod")); w != 3 {
		t.Errorf("pod Events counted %v, want 3", w)
	}
}

// A bulk event stays under the bounds: per node, then per event, and the rest is one
// summary per namespace.
func TestBounds(t *testing.T) {
	var objs []client.Object
	for node := range 10 {
		for i := range 4 {
			ns := []string{"kafka", "team"}[i%2]
			objs = append(objs, pod(ns, fmt.Sprintf("p-%d-%d", node, i), fmt.Sprintf("node-%d", node)))
		}
	}
	n, rec, c := newNotifierWith(t, Options{PerNode: 3, PerEvent: 10}, interceptor.Funcs{}, false, objs...)
	for node := range 10 {
		n.Handle(context.Background(), deferral(fmt.Sprintf("node-%d", node)))
	}
	n.Flush(context.Background())
	if pods := drain(rec); len(pods) != 10 {
		t.Errorf("%d pod Events, want the per-event bound 10", len(pods))
	}
	// 40 pods, 10 told; 30 counted: node-0..2 leave one pod each (per node), node-3 one
	// more (the per-event bound is reached mid-node), node-4..9 all four.
	sums := summaries(t, c)
	if len(sums) != 2 || len(sums["kafka"]) != 1 || len(sums["team"]) != 1 {
		t.Fatalf("summaries %v, want one per namespace", sums)
	}
	total := 0
	for _, notes := range sums {
		var k, nodes int
		if _, err := fmt.Sscanf(notes[0], "%d pods of this namespace on %d nodes", &k, &nodes); err != nil {
			t.Fatalf("summary %q: %v", notes[0], err)
		}
		total += k
	}
	if total != 30 {
		t.Errorf("summaries count %d pods, want 30", total)
	}
	if w := testutil.ToFloat64(n.written.WithLabelValues("summary")); w != 2 {
		t.Errorf("summaries counted %v, want 2", w)
	}
	// Nothing new past the bounds: nothing written.
	n.Flush(context.Background())
	if w := testutil.ToFloat64(n.written.WithLabelValues("summary")); w != 2 || len(drain(rec)) != 0 {
		t.Errorf("a second flush wrote: %v summaries counted", w)
	}
}

// A summary that grows over several flushes (the queue ran empty between the nodes of one
// event) stays one Event, whose note carries the latest counts; one whose write failed is
// written at the next flush.
func TestSummaryGrows(t *testing.T) {
	var objs []client.Object
	for node := range 4 {
		for i := range 2 {
			objs = append(objs, pod("team", fmt.Sprintf("p-%d-%d", node, i), fmt.Sprintf("node-%d", node)))
		}
	}
	creates := 0
	failCreate := interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if creates++; creates == 1 {
			return errors.New("connection refused")
		}
		return c.Create(ctx, obj, opts...)
	}}
	n, _, c := newNotifierWith(t, Options{PerEvent: 2}, failCreate, false, objs...)
	ctx := context.Background()
	want := []string{
		"", // node-0: its two pods told, nothing past the bound
		"", // node-1: two pods past it, but the summary's write fails
		"4 pods of this namespace on 2 nodes",
		"6 pods of this namespace on 3 nodes",
	}
	for node, w := range want {
		n.Handle(ctx, deferral(fmt.Sprintf("node-%d", node)))
		n.Flush(ctx)
		sums := summaries(t, c)
		switch {
		case w == "" && len(sums) != 0:
			t.Errorf("after node-%d: summaries %v, want none", node, sums)
		case w != "" && (len(sums) != 1 || len(sums["team"]) != 1 || !strings.HasPrefix(sums["team"][0], w)):
			t.Errorf("after node-%d: summaries %v, want one in team starting %q", node, sums, w)
		}
	}
}

func TestNotify(t *testing.T) {
	n, _ := newNotifier(t, Options{Queue: 2}, false)
	n.Notify(deferral("node-a"))
	n.Notify(deferral("node-a")) // the same deferral decided again: told once
	held := deferral("node-a")
	held.Hold, held.Until = policy.HoldPDB, now.Add(time.Minute)
	n.Notify(held)
	held.Until = now.Add(2 * time.Minute) // the hold rechecked: not told again
	n.Notify(held)
	ignore := deferral("node-b")
	ignore.Action = policy.ActionIgnore
	n.Notify(ignore)
	n.Notify(Notice{EventID: "ev-1", Action: policy.ActionDrain}) // no node
	if len(n.queue) != 2 {
		t.Errorf("%d notices queued, want 2", len(n.queue))
	}
	n.Notify(deferral("node-c")) // the queue is full: dropped, counted, never blocking
	if d := testutil.ToFloat64(n.dropped.WithLabelValues("queue-full")); d != 1 {
		t.Errorf("dropped %v, want 1", d)
	}
}

func TestListFailure(t *testing.T) {
	n, rec := newNotifier(t, Options{}, true, pod("kafka", "kafka-0", "node-a"))
	n.Handle(context.Background(), deferral("node-a"))
	if got := drain(rec); len(got) != 0 {
		t.Errorf("Events %v", got)
	}
	if d := testutil.ToFloat64(n.dropped.WithLabelValues("list-failed")); d != 1 {
		t.Errorf("dropped %v, want 1", d)
	}
}
