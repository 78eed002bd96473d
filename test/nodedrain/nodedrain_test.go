package nodedrain

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/nodedrain"
	store "github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
)

// TestBeginCordonsAndRecords: Begin cordons and records in one write; a second Begin, from a
// stale copy of the Node (a conflict) or a fresh one, writes nothing; Forget uncordons only a
// Node the router cordoned.
func TestBeginCordonsAndRecords(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "begin-a", false)
	newNode(t, "begin-cordoned", true)
	newNode(t, "begin-broken", false)

	stale := getNode(t, "begin-a")
	deadline := t0.Add(90 * time.Second)
	already, err := s.drainer.Begin(s.ctx, stale, nodedrain.Drain{EventID: "ev-1", Kind: "spot-interruption", Deadline: deadline})
	if err != nil || already {
		t.Fatalf("Begin: already=%v err=%v", already, err)
	}
	n := getNode(t, "begin-a")
	if !n.Spec.Unschedulable {
		t.Error("Begin did not cordon the node")
	}
	rec, ok := record(t, "begin-a")
	if !ok || rec.EventID != "ev-1" || rec.Kind != "spot-interruption" || !rec.Started.Equal(t0) || !rec.Deadline.Equal(deadline) ||
		!rec.Cordoned || rec.Finished() || rec.Attempts != 0 {
		t.Errorf("record after Begin: ok=%v %+v", ok, rec)
	}
	annotation, rv := stored(t, "begin-a"), n.ResourceVersion

	// The stale copy's resourceVersion conflicts: Begin reads the Node afresh and finds the
	// record. A fresh copy finds it at once. Neither writes.
	for _, from := range []*corev1.Node{stale, getNode(t, "begin-a")} {
		already, err := s.drainer.Begin(s.ctx, from, nodedrain.Drain{EventID: "ev-2", Kind: "scheduled-change", Deadline: time.Time{}})
		if err != nil || !already {
			t.Errorf("second Begin (from resourceVersion %s): already=%v err=%v", from.ResourceVersion, already, err)
		}
	}
	if n := getNode(t, "begin-a"); n.ResourceVersion != rv || stored(t, "begin-a") != annotation {
		t.Errorf("a second Begin wrote: resourceVersion %s -> %s, record %s -> %s", rv, n.ResourceVersion, annotation, stored(t, "begin-a"))
	}

	// Someone else's cordon stays after Forget.
	if _, err := s.drainer.Begin(s.ctx, getNode(t, "begin-cordoned"), nodedrain.Drain{EventID: "ev-3", Kind: "spot-interruption", Deadline: time.Time{}}); err != nil {
		t.Fatal(err)
	}
	if rec, _ := record(t, "begin-cordoned"); rec.Cordoned {
		t.Error("the record claims a cordon the router did not set")
	}

	// A record that does not parse (a newer router's) is not overwritten.
	broken := getNode(t, "begin-broken")
	recordtest.SeedNode(t, direct, broken, store.Memory{NodeDrain: json.RawMessage(`{"future":1}`)})
	if _, err := s.drainer.Begin(s.ctx, broken, nodedrain.Drain{EventID: "ev-4", Kind: "spot-interruption", Deadline: time.Time{}}); err == nil || !strings.Contains(err.Error(), "no event_id") {
		t.Errorf("Begin over a broken record: %v, want an error saying why it does not parse", err)
	}
	if stored(t, "begin-broken") != `{"future":1}` || getNode(t, "begin-broken").Spec.Unschedulable {
		t.Error("Begin overwrote a broken record, or cordoned beside it")
	}

	for _, tc := range []struct {
		node          string
		unschedulable bool
	}{{"begin-a", false}, {"begin-cordoned", true}} {
		must(t, s.drainer.Forget(s.ctx, tc.node))
		n := getNode(t, tc.node)
		if stored(t, tc.node) != "" || n.Spec.Unschedulable != tc.unschedulable {
			t.Errorf("after Forget(%s): record %q, unschedulable %v (want %v)", tc.node, stored(t, tc.node), n.Spec.Unschedulable, tc.unschedulable)
		}
	}
	// Forget without a record, or without a Node, does nothing.
	rv = getNode(t, "begin-a").ResourceVersion
	must(t, s.drainer.Forget(s.ctx, "begin-a"))
	must(t, s.drainer.Forget(s.ctx, "no-such-node"))
	if getNode(t, "begin-a").ResourceVersion != rv {
		t.Error("Forget without a record wrote")
	}
	// Forgotten, the Node can be drained again.
	if already, err := s.drainer.Begin(s.ctx, getNode(t, "begin-a"), nodedrain.Drain{EventID: "ev-5", Kind: "spot-interruption", Deadline: time.Time{}}); err != nil || already {
		t.Errorf("Begin after Forget: already=%v err=%v", already, err)
	}
	if !s.drainer.NeedLeaderElection() {
		t.Error("the drainer must run on the leader only")
	}
}

// TestBeginRetriedCordons: a Begin that stopped between its two writes left the record, which
// says the router cordons the Node, and no cordon; the retry of the same event finds its record
// and cordons the Node. Whenever the router's cordon is on a Node, a record that says so exists.
func TestBeginRetriedCordons(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "retried-a", false)
	rec := fmt.Sprintf(`{"event_id":"ev-1","kind":"spot-interruption","started":%q,"cordoned":true}`, t0.Format(time.RFC3339))
	recordtest.SeedNode(t, direct, getNode(t, "retried-a"), store.Memory{NodeDrain: json.RawMessage(rec)})
	already, err := s.drainer.Begin(s.ctx, getNode(t, "retried-a"), nodedrain.Drain{EventID: "ev-1", Kind: "spot-interruption"})
	if err != nil || !already {
		t.Fatalf("the retried Begin: already=%v err=%v", already, err)
	}
	if !getNode(t, "retried-a").Spec.Unschedulable {
		t.Error("the retried Begin left the Node its record says the router cordons uncordoned")
	}
	if got, ok := record(t, "retried-a"); !ok || got.EventID != "ev-1" || !got.Cordoned || got.Finished() {
		t.Errorf("the record changed: %+v", got)
	}
}

// TestPassCordonsFirst: a record that says the router cordons its Node, on a Node that is not
// cordoned (a Begin stopped between the two writes, and no retry came), has the pass cordon the
// Node before it evicts: evicted from a schedulable Node, a pod would be put back there.
func TestPassCordonsFirst(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	newNode(t, "stopped-a", false)
	rec := fmt.Sprintf(`{"event_id":"ev-1","kind":"spot-interruption","started":%q,"cordoned":true}`, t0.Format(time.RFC3339))
	recordtest.SeedNode(t, direct, getNode(t, "stopped-a"), store.Memory{NodeDrain: json.RawMessage(rec)})
	eventually(t, "the cache shows the record", func() bool { _, ok, _ := cachedRecord(t, "stopped-a"); return ok })
	if left := s.pass(); left != 0 {
		t.Errorf("Pass left %d nodes draining, want 0 (no pod on it)", left)
	}
	if !getNode(t, "stopped-a").Spec.Unschedulable {
		t.Error("the pass evicted from a Node its record says the router cordons, without cordoning it")
	}
}

// TestPassEvictsAndFinishes: one pass evicts, through the Eviction API, the pods of a
// ReplicaSet, a bare pod and a pod with emptyDir; it leaves the DaemonSet's pod and the
// mirror pod, and pods of other Nodes; it marks the record done and says so once.
func TestPassEvictsAndFinishes(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	const ns = "evict"
	newNamespace(t, ns)
	newNode(t, "worker-1", false)
	newNode(t, "worker-2", false)
	web := map[string]string{"app": "web"}
	rs := replicaSet(t, ns, "web-7d9f", web)
	ds := daemonSet(t, ns, "node-agent")
	newPod(t, ns, "web-7d9f-a", "worker-1", podOpts{owner: rs, labels: web})
	newPod(t, ns, "bare", "worker-1", podOpts{})
	newPod(t, ns, "scratch", "worker-1", podOpts{owner: rs, labels: web, emptyDir: true})
	newPod(t, ns, "node-agent-x", "worker-1", podOpts{owner: ds})
	newPod(t, ns, "static-worker-1", "worker-1", podOpts{mirror: true})
	newPod(t, ns, "web-7d9f-b", "worker-2", podOpts{owner: rs, labels: web})
	k := startKubelet(t, ns)

	s.begin("worker-1", "ev-evict", t0.Add(2*time.Minute))
	if left := s.pass(); left != 0 {
		t.Errorf("Pass left %d nodes draining, want 0", left)
	}
	for pod, want := range map[string]string{"web-7d9f-a": "gone", "bare": "gone", "scratch": "gone",
		"node-agent-x": "running", "static-worker-1": "running", "web-7d9f-b": "running"} {
		if got := podState(t, ns, pod); got != want {
			t.Errorf("pod %s: %s, want %s", pod, got, want)
		}
	}
	for _, pod := range []string{"web-7d9f-a", "bare", "scratch"} {
		if !k.evictedByAPI(pod) {
			t.Errorf("pod %s was not removed through the Eviction API", pod)
		}
	}
	rec, _ := record(t, "worker-1")
	if !rec.Finished() || !rec.Done.Equal(t0) || rec.LastError != "" {
		t.Errorf("record after the pass: %+v", rec)
	}
	if !getNode(t, "worker-1").Spec.Unschedulable {
		t.Error("a drained node was uncordoned")
	}
	evs := s.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+nodedrain.ReasonNodeDrained+" ") || !strings.Contains(evs[0], "ev-evict") {
		t.Errorf("events: %q, want one %s", evs, nodedrain.ReasonNodeDrained)
	}
	if s.drainer.Draining() != 0 {
		t.Errorf("Draining() = %d", s.drainer.Draining())
	}

	// A done record is not worked on again.
	eventually(t, "the cache shows the drain done", func() bool {
		rec, _, _ := cachedRecord(t, "worker-1")
		return rec.Finished()
	})
	if left := s.pass(); left != 0 {
		t.Errorf("second Pass: %d draining", left)
	}
	if evs := s.events(); len(evs) != 0 {
		t.Errorf("a done drain posted again: %q", evs)
	}
}

// TestPassWaitsForTerminatingPods: an evicted pod that does not terminate (no kubelet) keeps
// the drain unfinished; the round is bounded by EvictTimeout; once the pod is gone, the
// next pass finishes.
func TestPassWaitsForTerminatingPods(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	const ns = "terminating"
	newNamespace(t, ns)
	newNode(t, "worker-3", false)
	web := map[string]string{"app": "slow"}
	newPod(t, ns, "slow-0", "worker-3", podOpts{owner: replicaSet(t, ns, "slow", web), labels: web})

	s.begin("worker-3", "ev-slow", time.Time{})
	start := time.Now()
	if left := s.pass(); left != 1 {
		t.Errorf("Pass with a pod still terminating: %d draining, want 1", left)
	}
	took := time.Since(start)
	if took < evictTimeout || took > evictTimeout+5*time.Second {
		t.Errorf("the round took %s: the helper waits for the pod until EvictTimeout (%s), and no longer", took, evictTimeout)
	}
	if got := podState(t, ns, "slow-0"); got != "terminating" {
		t.Errorf("pod slow-0 is %s, want terminating (evicted, no kubelet)", got)
	}
	rec, _ := record(t, "worker-3")
	if rec.Finished() || rec.Attempts != 1 || rec.LastError == "" {
		t.Errorf("record after an unfinished round: %+v", rec)
	}
	if evs := s.events(); len(evs) != 0 {
		t.Errorf("events of an unfinished drain without a deadline: %q", evs)
	}
	if s.drainer.Draining() != 1 {
		t.Errorf("Draining() = %d, want 1", s.drainer.Draining())
	}

	startKubelet(t, ns)
	eventually(t, "the kubelet removes slow-0", func() bool { return podState(t, ns, "slow-0") == "gone" })
	if left := s.pass(); left != 0 {
		t.Errorf("Pass once the pod is gone: %d draining", left)
	}
	if rec, _ := record(t, "worker-3"); !rec.Finished() || rec.Attempts != 1 {
		t.Errorf("record: %+v", rec)
	}
}

// TestBudgetBlocks: a PodDisruptionBudget at zero refuses the eviction: the drain stays
// unfinished and the pod untouched; past the record's deadline one Warning says so (not one
// per pass); once the budget allows a disruption, the next pass finishes.
func TestBudgetBlocks(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	const ns = "budget"
	newNamespace(t, ns)
	newNode(t, "worker-4", false)
	kafka := map[string]string{"app": "kafka"}
	newPod(t, ns, "kafka-0", "worker-4", podOpts{owner: replicaSet(t, ns, "kafka", kafka), labels: kafka})
	pdb := budget(t, ns, "kafka-pdb", kafka, 0, 1)
	k := startKubelet(t, ns)

	deadline := t0.Add(time.Hour)
	s.begin("worker-4", "ev-pdb", deadline)
	for i := 1; i <= 2; i++ {
		if left := s.pass(); left != 1 {
			t.Errorf("pass %d: %d draining, want 1", i, left)
		}
		if got := podState(t, ns, "kafka-0"); got != "running" {
			t.Fatalf("pass %d: kafka-0 is %s despite its budget", i, got)
		}
		rec, _ := record(t, "worker-4")
		if rec.Finished() || rec.Attempts != i || rec.Warned {
			t.Errorf("pass %d, before the deadline: %+v", i, rec)
		}
	}
	if evs := s.events(); len(evs) != 0 {
		t.Errorf("events before the deadline: %q", evs)
	}

	s.clock.SetTime(deadline) // the bound is reached: the router says so, and keeps to the budget
	for i := 3; i <= 4; i++ {
		if left := s.pass(); left != 1 {
			t.Errorf("pass %d: %d draining, want 1", i, left)
		}
		if got := podState(t, ns, "kafka-0"); got != "running" {
			t.Fatalf("pass %d, past the deadline: kafka-0 is %s: the budget was overridden", i, got)
		}
	}
	evs := s.events()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+nodedrain.ReasonNodeDrainBlocked+" ") ||
		!strings.Contains(evs[0], "budget/kafka-0") || !strings.Contains(evs[0], "kafka-pdb") {
		t.Errorf("events past the deadline: %q, want one %s naming budget/kafka-0 and kafka-pdb", evs, nodedrain.ReasonNodeDrainBlocked)
	}
	if rec, _ := record(t, "worker-4"); !rec.Warned || rec.Attempts != 4 || !strings.Contains(rec.LastError, "kafka-0") {
		t.Errorf("record past the deadline: %+v", rec)
	}

	// The budget allows one: the disruption controller would see maxUnavailable 1.
	must(t, direct.Get(s.ctx, client.ObjectKeyFromObject(pdb), pdb))
	pdb.Spec.MaxUnavailable.IntVal = 1
	must(t, direct.Update(s.ctx, pdb))
	setBudgetStatus(t, pdb, 1)
	if left := s.pass(); left != 0 {
		t.Errorf("pass once the budget allows: %d draining", left)
	}
	if got := podState(t, ns, "kafka-0"); got != "gone" || !k.evictedByAPI("kafka-0") {
		t.Errorf("kafka-0 is %s (through the Eviction API: %v), want gone", got, k.evictedByAPI("kafka-0"))
	}
	rec, _ := record(t, "worker-4")
	if !rec.Finished() || !rec.Warned {
		t.Errorf("record: %+v", rec)
	}
	if evs := s.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal "+nodedrain.ReasonNodeDrained+" ") {
		t.Errorf("events: %q, want one %s", evs, nodedrain.ReasonNodeDrained)
	}
	// The eviction was counted against the budget, as the Eviction API does.
	must(t, direct.Get(s.ctx, client.ObjectKeyFromObject(pdb), pdb))
	if _, ok := pdb.Status.DisruptedPods["kafka-0"]; !ok || pdb.Status.DisruptionsAllowed != 0 {
		t.Errorf("budget status after the eviction: %+v", pdb.Status)
	}
}

// TestPerPass: a pass works on at most PerPass Nodes, and the next pass on the others.
func TestPerPass(t *testing.T) {
	s := newSetup(t, nodedrain.Options{PerPass: 1})
	for _, n := range []string{"empty-a", "empty-b"} {
		newNode(t, n, false)
		s.begin(n, "ev-"+n, time.Time{})
	}
	done := func() int {
		c := 0
		for _, n := range []string{"empty-a", "empty-b"} {
			if rec, _ := record(t, n); rec.Finished() {
				c++
			}
		}
		return c
	}
	if left := s.pass(); left != 1 || done() != 1 {
		t.Errorf("first pass: %d draining, %d done; want 1 and 1", left, done())
	}
	eventually(t, "the cache shows one drain done", func() bool {
		c := 0
		for _, n := range []string{"empty-a", "empty-b"} {
			if rec, ok, _ := cachedRecord(t, n); ok && rec.Finished() {
				c++
			}
		}
		return c == 1
	})
	if left := s.pass(); left != 0 || done() != 2 {
		t.Errorf("second pass: %d draining, %d done; want 0 and 2", left, done())
	}
}

// TestStart: Start passes on its own, on the leader only, and stops with its context.
func TestStart(t *testing.T) {
	s := newSetup(t, nodedrain.Options{Interval: time.Minute})
	newNode(t, "started", false)
	ctx, cancel := context.WithCancel(s.ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- s.drainer.Start(ctx) }()
	eventually(t, "Start waits on its ticker", s.clock.HasWaiters)

	s.begin("started", "ev-start", time.Time{})
	// Each step of the fake clock by Interval is one tick: one more pass.
	eventually(t, "a pass of Start finishes the drain", func() bool {
		s.clock.Step(time.Minute)
		rec, _ := record(t, "started")
		return rec.Finished()
	})
	cancel()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}
