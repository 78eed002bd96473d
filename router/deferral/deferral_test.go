package deferral

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
	"github.com/health-router/health-router/router/signal"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

type rig struct {
	c     *Controller
	kube  client.Client
	clock *clocktesting.FakeClock
	m     *metrics.Router
}

func instanceID(i int) string { return fmt.Sprintf("i-0a1b2c3d4e5f6%04d", i) }

// retirementBody is a Health retirement of one instance, deadline start.
func retirementBody(id string, start time.Time) []byte {
	return []byte(fmt.Sprintf(`{"version":"0","id":"ret-%s","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-20T10:00:00Z","region":"eu-west-1","resources":["%s"],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/RET/%s","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":"%s","affectedEntities":[{"entityValue":"%s"}]}}`,
		id, id, id, start.UTC().Format(time.RFC1123), id))
}

// newRig builds a pool of n NodeClaims; each claim i gets the deferral records recs(i).
func newRig(t *testing.T, poolAnnotations map[string]string, n int, recs func(i int) []record.Record) *rig {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: poolAnnotations}}}
	var seeds []*karpv1.NodeClaim
	var seedRecs [][]record.Record
	for i := 0; i < n; i++ {
		labels := map[string]string{karpv1.NodePoolLabelKey: "kafka"}
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("kafka-%d", i), Labels: labels, Annotations: map[string]string{},
			Finalizers: []string{"karpenter.sh/termination"}}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + instanceID(i)}}
		if rs := recs(i); len(rs) > 0 {
			seeds, seedRecs = append(seeds, nc), append(seedRecs, rs)
		}
		objs = append(objs, nc, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + instanceID(i)}})
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	for _, ix := range cluster.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	kube := b.WithIndex(&record.HealthRecord{}, IndexHeldOn, HeldOn).Build()
	for i, nc := range seeds {
		recordtest.Seed(t, kube, nc, record.Memory{Records: seedRecs[i]})
	}
	clk := clocktesting.NewFakeClock(now)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	eng := engine.New(cluster.New(kube), nil)
	sig := signal.New(kube, kube, signal.ModeDeleteNodeClaim, nil, "", events.NewFakeRecorder(1000), clk)
	p := pipeline.New(eng, sig, m, nil, clk, log, 4)
	c := New(kube, p, eng, sig, m, clk, log, 20*time.Second)
	c.leading.Store(true) // as the elected leader's: its releases are queued
	return &rig{c: c, kube: kube, clock: clk, m: m}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := jsonMarshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (r *rig) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := r.c.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func (r *rig) claim(t *testing.T, name string) *karpv1.NodeClaim {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return nc
}

func deferral(i int, until time.Time, hold policy.Hold, deadline time.Time) record.Record {
	return record.Record{EventID: "ret-" + instanceID(i), Key: "arn:aws:health:eu-west-1::event/EC2/RET/" + instanceID(i), Kind: event.KindScheduledChange,
		Until: until, Reason: "r", State: record.StateDeferred, Hold: hold, Event: retirementBody(instanceID(i), deadline)}
}

func TestReconcileRequeuesUntilDueThenDrains(t *testing.T) {
	deadline := now.Add(2 * time.Hour)
	r := newRig(t, map[string]string{policy.AnnotationAction: "defer"}, 1, func(i int) []record.Record {
		return []record.Record{deferral(i, deadline.Add(-policy.DefaultDrainLead), policy.HoldDeadline, deadline)}
	})
	res := r.reconcile(t, "kafka-0")
	if res.RequeueAfter != time.Hour {
		t.Errorf("requeue after %s, want 1h (deadline minus drain-lead)", res.RequeueAfter)
	}
	if r.c.Deferred() != 1 {
		t.Errorf("deferred gauge %v", r.c.Deferred())
	}
	if nc := r.claim(t, "kafka-0"); nc == nil || !nc.DeletionTimestamp.IsZero() {
		t.Fatal("drained before its time")
	}
	r.clock.Step(time.Hour)
	r.reconcile(t, "kafka-0")
	if nc := r.claim(t, "kafka-0"); nc == nil || nc.DeletionTimestamp.IsZero() {
		t.Fatal("not drained when due")
	}
	if got := testutil.ToFloat64(r.m.Redecisions.WithLabelValues("deadline")); got != 1 {
		t.Errorf("redecisions %v", got)
	}
}

// TestReleasePoolReleasesOnlyWhatTheLimitAllows: with max-concurrent-drains 2 and one drain in
// flight, a release lets exactly one held drain go, the oldest.
func TestReleasePoolReleasesOnlyWhatTheLimitAllows(t *testing.T) {
	deadline := now.Add(72 * time.Hour)
	r := newRig(t, map[string]string{policy.AnnotationMaxConcurrentDrains: "2"}, 6, func(i int) []record.Record {
		if i == 0 {
			return nil
		}
		// held until deadline - lead; claim 3 has the earliest until
		until := deadline.Add(-policy.DefaultDrainLead).Add(time.Duration(i) * time.Minute)
		if i == 3 {
			until = until.Add(-time.Hour)
		}
		return []record.Record{deferral(i, until, policy.HoldPacing, deadline)}
	})
	// claim 0 is draining
	recordtest.Seed(t, r.kube, r.claim(t, "kafka-0"), record.Memory{Drain: &record.Drain{EventID: "x", At: now, Via: string(signal.ModeDeleteNodeClaim)}})
	if err := r.c.ReleasePool(context.Background(), "kafka"); err != nil {
		t.Fatal(err)
	}
	if len(r.c.wake) != 1 {
		t.Fatalf("%d released, want 1", len(r.c.wake))
	}
	released := (<-r.c.wake).Object.GetName()
	if released != "kafka-3" {
		t.Errorf("released %s, want the oldest held (kafka-3)", released)
	}
	r.reconcile(t, released)
	if nc := r.claim(t, released); nc == nil || nc.DeletionTimestamp.IsZero() {
		t.Fatal("released drain not carried out")
	}
	// A held claim reconciled without a release (an unrelated update) stays held.
	r.reconcile(t, "kafka-4")
	if nc := r.claim(t, "kafka-4"); !nc.DeletionTimestamp.IsZero() {
		t.Error("a held drain went without a release")
	}
	// Now two are in flight: a release lets none go.
	if err := r.c.ReleasePool(context.Background(), "kafka"); err != nil || len(r.c.wake) != 0 {
		t.Errorf("released %d with the pool at its limit (%v)", len(r.c.wake), err)
	}
}

func TestConfirmForwardFallsBack(t *testing.T) {
	r := newRig(t, nil, 1, func(int) []record.Record { return nil })
	recordtest.Seed(t, r.kube, r.claim(t, "kafka-0"), record.Memory{Drain: &record.Drain{EventID: "spot-1", At: now, Via: string(signal.ModeForward)}})
	if res := r.reconcile(t, "kafka-0"); res.RequeueAfter != 20*time.Second {
		t.Errorf("requeue %s, want the confirmation bound", res.RequeueAfter)
	}
	r.clock.Step(21 * time.Second)
	r.reconcile(t, "kafka-0")
	if nc := r.claim(t, "kafka-0"); nc == nil || nc.DeletionTimestamp.IsZero() {
		t.Fatal("an unconfirmed forward was not followed by a delete")
	}
	if got := testutil.ToFloat64(r.m.ForwardUnconfirmed); got != 1 {
		t.Errorf("unconfirmed metric %v", got)
	}
	// Confirmed (Karpenter deleted it): nothing more to do.
	if res := r.reconcile(t, "kafka-0"); res.RequeueAfter != 0 {
		t.Errorf("requeued a NodeClaim being deleted: %s", res.RequeueAfter)
	}
}

func TestEndedRecordsArePrunedAfterTheirTime(t *testing.T) {
	r := newRig(t, nil, 1, func(i int) []record.Record {
		d := deferral(i, now.Add(time.Minute), policy.HoldRestartGrace, now.Add(time.Hour))
		d.State = record.StateCancelled
		return []record.Record{d}
	})
	if res := r.reconcile(t, "kafka-0"); res.RequeueAfter != time.Minute {
		t.Errorf("requeue %s", res.RequeueAfter)
	}
	if r.c.Deferred() != 0 {
		t.Errorf("a cancelled deferral counted as held")
	}
	r.clock.Step(time.Minute)
	r.reconcile(t, "kafka-0")
	nc := r.claim(t, "kafka-0")
	if len(recordtest.Records(t, r.kube, nc)) != 0 || !nc.DeletionTimestamp.IsZero() {
		t.Errorf("cancelled record: %+v, deleting %v", recordtest.Records(t, r.kube, nc), !nc.DeletionTimestamp.IsZero())
	}
}

func TestHeldOn(t *testing.T) {
	recs := []record.Record{
		{EventID: "a", State: record.StateDeferred, Hold: policy.HoldPacing},
		{EventID: "b", State: record.StateDeferred, Hold: policy.HoldCheck, Image: "ami-1"},
		{EventID: "c", State: record.StateCancelled, Hold: policy.HoldCheck, Image: "ami-2"},
		{EventID: "d", State: record.StateDeferred, Hold: policy.HoldWindow},
	}
	hr := &record.HealthRecord{Spec: record.HealthRecordSpec{NodePool: "kafka"}, Status: record.HealthRecordStatus{Memory: record.Memory{Records: recs}}}
	got := HeldOn(hr)
	if fmt.Sprint(got) != "[pool/kafka image/ami-1]" {
		t.Errorf("HeldOn = %v", got)
	}
	if HeldOn(&record.HealthRecord{}) != nil || HeldOn(&karpv1.NodeClaim{}) != nil {
		t.Error("a record with no records, or a NodeClaim, is held on something")
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// TestConfirmDeleteRetries: a delete-mode stamp (the router stamps, then deletes) on a NodeClaim
// that is not deleting past the bound (the DELETE failed) is deleted again, with no
// "Karpenter did not act" count.
func TestConfirmDeleteRetries(t *testing.T) {
	r := newRig(t, nil, 1, func(int) []record.Record { return nil })
	recordtest.Seed(t, r.kube, r.claim(t, "kafka-0"), record.Memory{Drain: &record.Drain{EventID: "ret-1", At: now, Via: string(signal.ModeDeleteNodeClaim)}})
	r.clock.Step(30 * time.Second)
	r.reconcile(t, "kafka-0")
	if nc := r.claim(t, "kafka-0"); nc == nil || nc.DeletionTimestamp.IsZero() {
		t.Fatal("a stamped NodeClaim was not deleted again")
	}
	if got := testutil.ToFloat64(r.m.ForwardUnconfirmed); got != 0 {
		t.Errorf("counted as an unconfirmed forward: %v", got)
	}
}

// TestBrokenRecordIsDropped: a record whose event does not parse is dropped with a Warning,
// not retried forever; the NodeClaim's other records stay.
func TestBrokenRecordIsDropped(t *testing.T) {
	deadline := now.Add(72 * time.Hour)
	r := newRig(t, map[string]string{policy.AnnotationAction: "defer"}, 1, func(i int) []record.Record {
		bad := deferral(i, now.Add(-time.Minute), policy.HoldDeadline, deadline)
		bad.EventID, bad.Event = "bad", []byte(`"by hand"`)
		return []record.Record{bad, deferral(i, deadline.Add(-time.Hour), policy.HoldDeadline, deadline)}
	})
	r.reconcile(t, "kafka-0")
	ds := recordtest.Records(t, r.kube, r.claim(t, "kafka-0"))
	if len(ds) != 1 || ds[0].EventID == "bad" {
		t.Errorf("records %+v", ds)
	}
}

// TestStandbyQueuesNothing: a standby's informers call the release handlers too, but only the
// leader's controller reads the wake queue. On the main this fix starts from (351c311) a
// standby queued every release, and after 1,024 its handler blocked for good (client-go
// then buffers every later notification without bound).
func TestStandbyQueuesNothing(t *testing.T) {
	r := newRig(t, map[string]string{policy.AnnotationMaxConcurrentDrains: "100%"}, 3, func(i int) []record.Record {
		return []record.Record{{EventID: fmt.Sprint("e", i), Key: fmt.Sprint("e", i), Kind: "scheduled-change", Until: now.Add(time.Hour), State: record.StateDeferred, Hold: policy.HoldPacing}}
	})
	r.c.leading.Store(false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 3*wakeQueue; i++ {
			if err := r.c.ReleasePool(context.Background(), "kafka"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the standby's release blocked")
	}
	if released, queued := r.c.Pending(); released != 0 || queued != 0 {
		t.Errorf("standby holds %d releases and %d queued wakes, want none", released, queued)
	}
	r.c.leading.Store(true)
	if err := r.c.ReleasePool(context.Background(), "kafka"); err != nil {
		t.Fatal(err)
	}
	if _, queued := r.c.Pending(); queued != 3 {
		t.Errorf("the leader queued %d wakes, want 3", queued)
	}
}

// TestLeadershipLostLetsGo: found by the simulation (seed 11326855635866004735): a replica that
// loses the lease kept the releases it had queued as leader, which nobody reads any more.
func TestLeadershipLostLetsGo(t *testing.T) {
	r := newRig(t, map[string]string{policy.AnnotationMaxConcurrentDrains: "100%"}, 2, func(i int) []record.Record {
		return []record.Record{{EventID: fmt.Sprint("e", i), Key: fmt.Sprint("e", i), Kind: "scheduled-change", Until: now.Add(time.Hour), State: record.StateDeferred, Hold: policy.HoldPacing}}
	})
	r.c.leading.Store(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.c.Start(ctx) }()
	for !r.c.Leading() {
		time.Sleep(time.Millisecond)
	}
	if err := r.c.ReleasePool(context.Background(), "kafka"); err != nil {
		t.Fatal(err)
	}
	if released, queued := r.c.Pending(); released != 2 || queued != 2 {
		t.Fatalf("as leader: %d released, %d queued", released, queued)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if released, queued := r.c.Pending(); released != 0 || queued != 0 {
		t.Errorf("after losing the lease: %d released, %d queued", released, queued)
	}
}

// TestOldKeysAreNotOrders: issue 36, defects 9-10 (the keys part). Anyone with `patch
// nodeclaims` writes the keys routers kept their memory in: a drain stamp and a deferral due
// now. On 22df557 the stamp became the fallback's DELETE within the confirmation bound, and
// the deferral a drain; the router's memory is its HealthRecord now, and the keys are nothing.
func TestOldKeysAreNotOrders(t *testing.T) {
	deadline := now.Add(72 * time.Hour)
	due := deferral(0, now.Add(-time.Minute), policy.HoldDeadline, deadline)
	v, err := record.Encode(record.Set{Records: []record.Record{due}})
	if err != nil {
		t.Fatal(err)
	}
	for name, keys := range map[string]map[string]string{
		"a drain stamp":   {"healthrouter.io/drain-signalled": "forged " + now.Add(-time.Hour).Format(time.RFC3339) + " forward"},
		"a due deferral":  {"healthrouter.io/deferred": v},
		"both, by anyone": {"healthrouter.io/deferred": v, "healthrouter.io/drain-signalled": "forged " + now.Add(-time.Hour).Format(time.RFC3339) + " forward"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t, map[string]string{policy.AnnotationAction: "drain"}, 1, func(int) []record.Record { return nil })
			nc := r.claim(t, "kafka-0")
			if nc.Annotations == nil {
				nc.Annotations = map[string]string{}
			}
			for k, v := range keys {
				nc.Annotations[k] = v
			}
			if err := r.kube.Update(context.Background(), nc); err != nil {
				t.Fatal(err)
			}
			r.reconcile(t, "kafka-0")
			r.clock.Step(time.Minute) // past the confirmation bound
			r.reconcile(t, "kafka-0")
			if nc := r.claim(t, "kafka-0"); nc == nil || !nc.DeletionTimestamp.IsZero() {
				t.Fatalf("keys written by someone else drained the node")
			}
		})
	}
}

// TestSweepPassesTheLedgerAndNodesBy: a reconcile of a name with no NodeClaim removes the
// HealthRecord of a NodeClaim gone, but never the shadow ledger's (it names no NodeClaim and
// outlives them) nor a Node's.
func TestSweepPassesTheLedgerAndNodesBy(t *testing.T) {
	r := newRig(t, nil, 0, func(int) []record.Record { return nil })
	ctx := context.Background()
	objs := []*record.HealthRecord{
		{ObjectMeta: metav1.ObjectMeta{Name: record.LedgerRecordName("health-router-shadow")},
			Status: record.HealthRecordStatus{Version: record.Version, Memory: record.Memory{Ledger: []byte(`{"version":1,"entries":[]}`)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: record.NodeRecordName("ip-10-0-0-1")}, Spec: record.HealthRecordSpec{NodeName: "ip-10-0-0-1"},
			Status: record.HealthRecordStatus{Version: record.Version, Memory: record.Memory{NodeDrain: []byte(`{"event_id":"e","kind":"spot-interruption","started":"2026-11-21T12:00:00Z"}`)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kafka-gone"}, Spec: record.HealthRecordSpec{NodeClaim: "kafka-gone"},
			Status: record.HealthRecordStatus{Version: record.Version, Memory: record.Memory{Running: now}}},
	}
	for _, hr := range objs {
		if err := r.kube.Create(ctx, hr); err != nil {
			t.Fatal(err)
		}
		r.reconcile(t, hr.Name)
	}
	for _, hr := range objs {
		err := r.kube.Get(ctx, client.ObjectKey{Name: hr.Name}, &record.HealthRecord{})
		if gone, want := apierrors.IsNotFound(err), hr.OfClaim(); gone != want {
			t.Errorf("healthrecord %s: removed %t, want %t (%v)", hr.Name, gone, want, err)
		}
	}
}
