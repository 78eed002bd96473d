package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func instanceID(i int) string { return fmt.Sprintf("i-0a1b2c3d4e5f6%04d", i) }

type rig struct {
	p        *Pipeline
	kube     client.Client
	recorder *events.FakeRecorder
	m        *metrics.Router
}

// newRig builds pools of NodeClaims and Nodes: claims[pool] instances each; instance IDs are
// numbered across pools in order. nodeOnly instances have a Node but no NodeClaim.
func newRig(t *testing.T, pools map[string]map[string]string, claims map[string]int, nodeOnly ...int) *rig {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	i := 0
	for _, name := range []string{"kafka", "web"} {
		if _, ok := pools[name]; !ok {
			continue
		}
		objs = append(objs, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: pools[name]}})
		for n := 0; n < claims[name]; n++ {
			pid := "aws:///eu-west-1a/" + instanceID(i)
			labels := map[string]string{karpv1.NodePoolLabelKey: name}
			objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}})
			skip := false
			for _, o := range nodeOnly {
				skip = skip || o == i
			}
			if !skip {
				objs = append(objs, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i), Labels: labels, Finalizers: []string{"karpenter.sh/termination"}},
					Status: karpv1.NodeClaimStatus{ProviderID: pid}})
			}
			i++
		}
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	for _, ix := range cluster.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	kube := b.Build()
	clk := clocktesting.NewFakeClock(now)
	rec := events.NewFakeRecorder(10000)
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	sig := signal.New(kube, kube, signal.ModeDeleteNodeClaim, nil, "", rec, clk)
	return &rig{p: New(engine.New(cluster.New(kube), nil), sig, m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), 4), kube: kube, recorder: rec, m: m}
}

func retirement(id string, start time.Time, ids ...string) event.Event {
	var entities []string
	for _, i := range ids {
		entities = append(entities, fmt.Sprintf(`{"entityValue":%q}`, i))
	}
	body := fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/RET/%s","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"affectedEntities":[%s]}}`,
		id, id, start.UTC().Format(time.RFC1123), strings.Join(entities, ","))
	ev, err := event.Parse([]byte(body))
	if err != nil {
		panic(err)
	}
	return ev
}

func (r *rig) claims(t *testing.T) []karpv1.NodeClaim {
	t.Helper()
	var l karpv1.NodeClaimList
	if err := r.kube.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestBulkEventResumes: an event over two pools is carried out whole; handled again (a
// redelivery after a timeout), every instance is skipped as recorded, and no write is made.
func TestBulkEventResumes(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}, "web": nil}, map[string]int{"kafka": 12, "web": 8})
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, instanceID(i))
	}
	ev := retirement("bulk", now.Add(72*time.Hour), ids...)
	res, err := r.p.Process(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if res.Actions[policy.ActionDefer] != 12 || res.Actions[policy.ActionDrain] != 8 || res.AlreadyRecorded != 0 {
		t.Fatalf("first pass: %+v", res)
	}
	deferred, deleting := 0, 0
	for _, nc := range r.claims(t) {
		if len(recordtest.Records(t, r.kube, &nc)) == 1 {
			deferred++
		}
		if !nc.DeletionTimestamp.IsZero() {
			deleting++
		}
	}
	if deferred != 12 || deleting != 8 {
		t.Errorf("recorded %d deferrals, %d deletions", deferred, deleting)
	}
	// Bulk: one summary Event per pool and action, not two per instance.
	if n := len(r.recorder.Events); n != 2 {
		t.Errorf("%d Events for a 20-instance event, want 2 summaries", n)
	}
	for len(r.recorder.Events) > 0 {
		e := <-r.recorder.Events
		if !strings.Contains(e, "12 instances of this pool deferred") && !strings.Contains(e, "8 instances of this pool drained") {
			t.Errorf("summary %q", e)
		}
	}
	res, err = r.p.Process(context.Background(), ev)
	if err != nil {
		t.Fatal(err)
	}
	if res.AlreadyRecorded != 20 || len(res.Actions) != 0 {
		t.Errorf("redelivery: %+v", res)
	}
	if got := testutil.ToFloat64(r.m.AlreadyRecorded); got != 20 {
		t.Errorf("already-recorded metric %v", got)
	}
}

// TestOneMaintenanceDecidedOnce: the same maintenance reported by the poller after AWS Health
// (another event ID, same instance, type and not-before) is not decided again.
func TestOneMaintenanceDecidedOnce(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	start := now.Add(72 * time.Hour)
	if _, err := r.p.Process(context.Background(), retirement("from-health", start, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	polled := retirement("from-poller", start, instanceID(0))
	res, err := r.p.Process(context.Background(), polled)
	if err != nil || res.AlreadyRecorded != 1 {
		t.Fatalf("second report: %+v, %v", res, err)
	}
	if ds := recordtest.Records(t, r.kube, &r.claims(t)[0]); len(ds) != 1 || ds[0].EventID != "from-health" {
		t.Errorf("records %+v", ds)
	}
	// Rescheduled (another not-before): decided again.
	if res, err := r.p.Process(context.Background(), retirement("rescheduled", start.Add(24*time.Hour), instanceID(0))); err != nil || res.Actions[policy.ActionDefer] != 1 {
		t.Errorf("rescheduled: %+v, %v", res, err)
	}
}

// TestInstanceWithoutNodeClaim: a deferral needs a NodeClaim to live on; an instance with only
// a Node is skipped with the reason, and the rest of the event is carried out.
func TestInstanceWithoutNodeClaim(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 2}, 1)
	res, err := r.p.Process(context.Background(), retirement("e", now.Add(72*time.Hour), instanceID(0), instanceID(1)))
	if err != nil {
		t.Fatal(err)
	}
	if res.Actions[policy.ActionDefer] != 1 || res.Actions[policy.ActionSkip] != 1 {
		t.Errorf("outcomes %+v", res)
	}
}

// TestRedecideADueDeferral: a due record is decided again from the event it holds.
func TestRedecideADueDeferral(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	start := now.Add(90 * time.Minute)
	if _, err := r.p.Process(context.Background(), retirement("e", start, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	nc := r.claims(t)[0]
	rec := recordtest.Records(t, r.kube, &nc)[0]
	d, err := r.p.Redecide(context.Background(), &nc, rec)
	if err != nil || d.Action != policy.ActionDefer || !d.Until.Equal(start.Add(-time.Hour)) {
		t.Fatalf("before its time: %s until %s (%v)", d.Action, d.Until, err)
	}
	r.p.clock.(*clocktesting.FakeClock).Step(31 * time.Minute)
	d, err = r.p.Redecide(context.Background(), &nc, rec)
	if err != nil || d.Action != policy.ActionDrain {
		t.Fatalf("when due: %s (%v)", d.Action, err)
	}
	if nc := r.claims(t)[0]; nc.DeletionTimestamp.IsZero() || len(recordtest.Records(t, r.kube, &nc)) != 0 {
		t.Errorf("after the drain: deleting %v, records %+v", !nc.DeletionTimestamp.IsZero(), recordtest.Records(t, r.kube, &nc))
	}
	broken := rec
	broken.Event = []byte("{not json")
	if _, err := r.p.Redecide(context.Background(), &nc, broken); err == nil {
		t.Error("a record whose event does not parse was decided")
	}
}

// TestClosedHealthEventCancels: the closed update of a deferred Health event (same eventArn
// and start time, another event ID) is decided, and cancels the deferral.
func TestClosedHealthEventCancels(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	start := now.Add(72 * time.Hour)
	if _, err := r.p.Process(context.Background(), retirement("e", start, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	closed := retirement("e", start, instanceID(0))
	closed.ID = "e-closed"
	closed.Health.Status = event.HealthClosed
	res, err := r.p.Process(context.Background(), closed)
	if err != nil || res.Actions[policy.ActionIgnore] != 1 {
		t.Fatalf("closed: %+v, %v", res, err)
	}
	// The deferral is cancelled; the closing report is kept as applied (a tombstone), so that
	// the same report again (the poller's, after a restart) is recognised, not re-applied.
	if ds := recordtest.Records(t, r.kube, &r.claims(t)[0]); len(ds) != 2 || ds[0].State != record.StateCancelled || ds[1].State != record.StateClosed || ds[1].EventID != "e-closed" {
		t.Errorf("records %+v", ds)
	}
	if res, err := r.p.Process(context.Background(), closed); err != nil || res.AlreadyRecorded != 1 {
		t.Errorf("the closing report again: %+v, %v", res, err)
	}
}

// TestDrainingNodeClaimIsSkipped: a NodeClaim already being drained gets no new deferral.
func TestDrainingNodeClaimIsSkipped(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	nc := r.claims(t)[0]
	recordtest.Seed(t, r.kube, &nc, record.Memory{Drain: &record.Drain{EventID: "other", At: now, Via: string(signal.ModeForward)}})
	res, err := r.p.Process(context.Background(), retirement("e", now.Add(72*time.Hour), instanceID(0)))
	if err != nil || res.AlreadyRecorded != 1 || len(res.Actions) != 0 {
		t.Fatalf("%+v, %v", res, err)
	}
	if ds := recordtest.Records(t, r.kube, &r.claims(t)[0]); len(ds) != 0 {
		t.Errorf("a deferral written on a draining NodeClaim: %+v", ds)
	}
}

// The seams of issue 15, each through the pipeline. Every one of these fails on 351c311.

func spot(id, inst string) event.Event {
	body := fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-21T12:00:00Z","region":"eu-west-1","resources":["arn:aws:ec2:eu-west-1:123456789012:instance/%s"],"detail":{"instance-id":%q,"instance-action":"terminate"}}`, id, inst, inst)
	ev, err := event.Parse([]byte(body))
	if err != nil {
		panic(err)
	}
	return ev
}

func stateChange(id, inst string, st event.InstanceState, at time.Time) event.Event {
	body := fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":%q,"region":"eu-west-1","resources":[],"detail":{"instance-id":%q,"state":%q}}`,
		id, at.UTC().Format(time.RFC3339), inst, st)
	ev, err := event.Parse([]byte(body))
	if err != nil {
		panic(err)
	}
	return ev
}

// TestSeamUnmanagedNode (defect 1): a Spot warning for a node-group node (a Node, no NodeClaim)
// in delete mode is a clear "not managed by Karpenter" outcome, not an error retried to the
// dead-letter queue; a Health event says so too, not "replacement unsound".
func TestSeamUnmanagedNode(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1}, 0)
	for _, ev := range []event.Event{spot("s1", instanceID(0)), retirement("h1", now.Add(72*time.Hour), instanceID(0))} {
		res, err := r.p.Process(context.Background(), ev)
		if err != nil || res.Actions[policy.ActionSkip] != 1 {
			t.Fatalf("%s: %+v, %v", ev.Kind, res, err)
		}
	}
	if n := testutil.ToFloat64(r.m.Unmanaged.WithLabelValues(string(event.KindSpotInterruption), string(policy.ActionSkip))); n != 1 {
		t.Errorf("unmanaged metric %v", n)
	}
	found := false
	for len(r.recorder.Events) > 0 {
		if e := <-r.recorder.Events; strings.Contains(e, "HealthEventNotManaged") && strings.Contains(e, "not managed by Karpenter") {
			found = true
		}
	}
	if !found {
		t.Error("no HealthEventNotManaged Event on the Node")
	}
}

// nodeDrainer records Begin and Cancel calls (the real one is router/nodedrain, tested on
// envtest).
type nodeDrainer struct {
	begun     []string
	drains    []nodedrain.Drain
	cancelled []string
}

func (d *nodeDrainer) Begin(_ context.Context, node *corev1.Node, dr nodedrain.Drain) (bool, error) {
	d.begun = append(d.begun, node.Name+"/"+dr.EventID)
	d.drains = append(d.drains, dr)
	return false, nil
}

func (d *nodeDrainer) Cancel(_ context.Context, node string, dr nodedrain.Drain) (bool, error) {
	d.cancelled = append(d.cancelled, node+"/"+dr.EventID)
	return true, nil
}

// TestSeamUnmanagedCordonDrain: with --unmanaged-nodes=cordon-drain the node is handed to the
// drainer (cordon and evict), once per event.
func TestSeamUnmanagedCordonDrain(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1}, 0)
	nd := &nodeDrainer{}
	clk := clocktesting.NewFakeClock(now)
	r.p = New(engine.New(cluster.New(r.kube), nil, engine.WithUnmanaged(policy.UnmanagedCordonDrain)), signal.New(r.kube, r.kube, signal.ModeDeleteNodeClaim, nil, "", r.recorder, clk),
		r.m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), 1).WithNodeDrainer(nd)
	if res, err := r.p.Process(context.Background(), spot("s1", instanceID(0))); err != nil || res.Actions[policy.ActionDrain] != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	if fmt.Sprint(nd.begun) != "[node-0/s1]" {
		t.Errorf("drainer began %v", nd.begun)
	}
}

// TestSeamPollerFindingDefers (defect 2): a scheduled event found by the poller is deferred
// like the Health event of the same maintenance: a record, not an error handed back every minute.
func TestSeamPollerFindingDefers(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	f := event.StatusFinding{InstanceID: instanceID(0), Finding: event.FindingScheduledEvent, Time: now, Account: "123456789012", Region: "eu-west-1",
		Code: event.ScheduledSystemReboot, EventID: "instance-event-0123456789abcdef0", NotBefore: now.Add(72 * time.Hour)}
	_, ev, err := f.Event()
	if err != nil {
		t.Fatal(err)
	}
	if res, err := r.p.Process(context.Background(), ev); err != nil || res.Actions[policy.ActionDefer] != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	ds := recordtest.Records(t, r.kube, &r.claims(t)[0])
	if len(ds) != 1 || ds[0].Match != "system-reboot@2026-11-24T12:00:00Z" {
		t.Fatalf("records %+v", ds)
	}
	if back, err := event.Parse(ds[0].Event); err != nil || back.ID != ev.ID {
		t.Errorf("the record's event does not parse back: %v", err)
	}
	// [Canceled] by EC2: the poller's closing report cancels it (defect 3).
	f.Description = "[Canceled] the maintenance will not happen"
	_, closed, err := f.Event()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.p.Process(context.Background(), closed); err != nil {
		t.Fatal(err)
	}
	if ds := recordtest.Records(t, r.kube, &r.claims(t)[0]); len(ds) != 2 || ds[0].State != record.StateCancelled || ds[1].State != record.StateClosed {
		t.Errorf("after [Canceled]: %+v", ds)
	}
}

// TestSeamRunningBeforeStopped (defect 4): a `running` handled before the `stopped` it follows
// leaves a marker; the late stop is over, and nothing is deferred or drained for it.
func TestSeamRunningBeforeStopped(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	if _, err := r.p.Process(context.Background(), stateChange("run", instanceID(0), event.StateRunning, now.Add(-time.Minute))); err != nil {
		t.Fatal(err)
	}
	res, err := r.p.Process(context.Background(), stateChange("stop", instanceID(0), event.StateStopped, now.Add(-3*time.Minute)))
	if err != nil || res.Actions[policy.ActionIgnore] != 1 {
		t.Fatalf("late stop: %+v, %v", res, err)
	}
	nc := r.claims(t)[0]
	if set := recordtest.Set(t, r.kube, &nc); len(set.Active()) != 0 || !nc.DeletionTimestamp.IsZero() {
		t.Errorf("late stop left %+v (deleting %v)", set, !nc.DeletionTimestamp.IsZero())
	}
}

// TestSeamUnreadableRecordsKept (item 4): records a newer router wrote are kept as they are;
// a deferral is refused (retried, then dead-lettered), a drain still goes, the refusal is told.
func TestSeamUnreadableRecordsKept(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 2})
	r.p.signal.OnUnreadable(r.m.RecordsUnreadable.Inc)
	for i := range r.claims(t) {
		nc := r.claims(t)[i]
		recordtest.Seed(t, r.kube, &nc, record.Memory{Records: []record.Record{{EventID: "from-the-future"}}})
		newer(t, r.kube, nc.Name)
	}
	_, err := r.p.Process(context.Background(), retirement("h", now.Add(72*time.Hour), instanceID(0)))
	if !errors.Is(err, record.ErrUnreadable) {
		t.Fatalf("deferral onto unreadable records: %v", err)
	}
	if hr := (&record.HealthRecord{}); r.kube.Get(context.Background(), client.ObjectKey{Name: r.claims(t)[0].Name}, hr) != nil || hr.Status.Version != record.Version+7 || len(hr.Status.Records) != 1 {
		t.Errorf("records rewritten: %+v", hr.Status)
	}
	if n := testutil.ToFloat64(r.m.RecordsUnreadable); n != 1 {
		t.Errorf("unreadable metric %v", n)
	}
	if res, err := r.p.Process(context.Background(), spot("s", instanceID(1))); err != nil || res.Actions[policy.ActionDrain] != 1 {
		t.Errorf("a drain must still go: %+v, %v", res, err)
	}
}

// TestSeamDrainEndsEarlierRecords (8g): a NodeClaim drained by a later urgent event no longer
// shows its earlier record as deferred.
func TestSeamDrainEndsEarlierRecords(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}}, map[string]int{"kafka": 1})
	if _, err := r.p.Process(context.Background(), retirement("h", now.Add(72*time.Hour), instanceID(0))); err != nil {
		t.Fatal(err)
	}
	if _, err := r.p.Process(context.Background(), spot("s", instanceID(0))); err != nil {
		t.Fatal(err)
	}
	ds := recordtest.Records(t, r.kube, &r.claims(t)[0])
	if len(ds) != 1 || ds[0].State != record.StateDrained {
		t.Errorf("records after the drain: %+v", ds)
	}
}

type podNotices struct{ got []podnotice.Notice }

func (p *podNotices) Notify(n podnotice.Notice) { p.got = append(p.got, n) }

// TestPodNotices: the pods' owners are told of a deferral (with its planned time) and of the
// drain when it comes due; not of an ignore, nor of an instance with no node.
func TestPodNotices(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer"}, "web": {policy.AnnotationAction: "ignore"}}, map[string]int{"kafka": 1, "web": 1})
	pn := &podNotices{}
	r.p.WithPodNotifier(pn)
	start := now.Add(90 * time.Minute)
	if _, err := r.p.Process(context.Background(), retirement("e", start, instanceID(0), instanceID(1), "i-0ffffffffffffffff")); err != nil {
		t.Fatal(err)
	}
	if len(pn.got) != 1 || pn.got[0].Node != "node-0" || pn.got[0].Action != policy.ActionDefer || !pn.got[0].Until.Equal(start.Add(-time.Hour)) ||
		pn.got[0].NodePool != "kafka" || pn.got[0].EventID != "e" || !pn.got[0].Deadline.Equal(start) {
		t.Fatalf("notices %+v, want the kafka node's deferral", pn.got)
	}
	r.p.clock.(*clocktesting.FakeClock).Step(31 * time.Minute)
	var nc karpv1.NodeClaim
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "kafka-0"}, &nc); err != nil {
		t.Fatal(err)
	}
	if _, err := r.p.Redecide(context.Background(), &nc, recordtest.Records(t, r.kube, &nc)[0]); err != nil {
		t.Fatal(err)
	}
	if len(pn.got) != 2 || pn.got[1].Action != policy.ActionDrain || pn.got[1].Node != "node-0" {
		t.Errorf("notices %+v, want the drain second", pn.got)
	}
}

func scheduled(id, arn, code string, start time.Time, status string, ids ...string) event.Event {
	ev, err := event.Parse(scheduledBody(id, arn, code, start, status, ids...))
	if err != nil {
		panic(err)
	}
	return ev
}

// scheduledBody is the AWS Health event scheduled parses.
func scheduledBody(id, arn, code string, start time.Time, status string, ids ...string) []byte {
	var entities []string
	for _, i := range ids {
		entities = append(entities, fmt.Sprintf(`{"entityValue":%q}`, i))
	}
	return []byte(fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"eventArn":%q,"service":"EC2","eventTypeCode":%q,"eventTypeCategory":"scheduledChange","statusCode":%q,"startTime":%q,"affectedEntities":[%s]}}`,
		id, arn, code, status, start.UTC().Format(time.RFC1123), strings.Join(entities, ",")))
}

// TestReschedule: a pool annotated reschedule=true has its scheduled event moved into its
// window (EC2's wire protocol, served by the stand-in), the record follows the moved start,
// and the other views of the moved event are the same maintenance; where the event cannot
// move, the pool's ordinary policy applies and the reason says why.
func TestReschedule(t *testing.T) {
	const rebootCode = "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"
	pool := map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		policy.AnnotationDrainLead: "1h", policy.AnnotationReschedule: "true"}
	start := now.Add(10 * 24 * time.Hour)                 // Tuesday 1 December, 12:00
	open := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC) // the next Saturday window
	tests := []struct {
		name       string
		deadline   time.Time // NotBeforeDeadline; zero: none
		fail       int
		denied     bool
		wantMoved  bool
		wantReason string
		wantResult string
	}{
		{name: "moved to the window opening plus drain-lead", deadline: now.Add(14 * 24 * time.Hour), wantMoved: true, wantReason: "rescheduled instance-event-1 moved from", wantResult: "moved"},
		{name: "no deadline: deferred as ever", wantReason: "not rescheduled: the event has no deadline", wantResult: "not-moved"},
		{name: "the deadline before the window", deadline: now.Add(3 * 24 * time.Hour), wantReason: "not rescheduled: no window opening before the deadline", wantResult: "not-moved"},
		{name: "EC2 refuses (no permission)", deadline: now.Add(14 * 24 * time.Hour), denied: true, wantReason: "not rescheduled: EC2 refused (UnauthorizedOperation", wantResult: "refused"},
		{name: "EC2 fails", deadline: now.Add(14 * 24 * time.Hour), fail: 1, wantReason: "not rescheduled: EC2 unavailable", wantResult: "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, srv, client := rescheduleRig(t, pool, start, tt.deadline)
			srv.Fail = tt.fail
			if tt.denied {
				srv.Denied = map[string]bool{"ModifyInstanceEventStartTime": true}
			}
			r.p.WithRescheduler(reschedule.NewEvents(client))
			arn := "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/r1"
			res, err := r.p.Process(context.Background(), scheduled("h-1", arn, rebootCode, start, "upcoming", instanceID(0)))
			if err != nil || res.Actions[policy.ActionDefer] != 1 {
				t.Fatalf("outcome %+v, %v", res, err)
			}
			recs := recordtest.Records(t, r.kube, &r.claims(t)[0])
			if len(recs) != 1 || !strings.HasPrefix(recs[0].Reason, tt.wantReason) {
				t.Fatalf("records %+v, want one whose reason starts %q", recs, tt.wantReason)
			}
			if got := testutil.ToFloat64(r.m.Reschedules.WithLabelValues(tt.wantResult)); got != 1 {
				t.Errorf("reschedules{result=%s} = %v", tt.wantResult, got)
			}
			held, _ := srv.Event(instanceID(0), "instance-event-1")
			if !tt.wantMoved {
				// The ordinary policy: deferred to the window before the unmoved start.
				if !held.NotBefore.Equal(start) || !recs[0].Until.Equal(open) || recs[0].Match != "system-reboot@"+start.Format(time.RFC3339) {
					t.Errorf("EC2 holds %s, record until %s match %s", held.NotBefore, recs[0].Until, recs[0].Match)
				}
				return
			}
			moved := open.Add(time.Hour)
			if !held.NotBefore.Equal(moved) || !held.NotAfter.Equal(moved.Add(2*time.Hour)) {
				t.Fatalf("EC2 holds the event at %s-%s, want %s", held.NotBefore, held.NotAfter, moved)
			}
			if !recs[0].Until.Equal(open) || recs[0].Match != "system-reboot@"+moved.Format(time.RFC3339) {
				t.Errorf("record until %s match %s: want the window opening, and the moved start", recs[0].Until, recs[0].Match)
			}
			if ev, err := event.Parse(recs[0].Event); err != nil || !ev.Deadline.Equal(moved) {
				t.Errorf("the recorded event starts at %v (%v), want the moved start", ev.Deadline, err)
			}
			if !strings.Contains(strings.Join(drainEvents(r.recorder), "\n"), signal.ReasonRescheduled) {
				t.Error("no Rescheduled Event")
			}
			// The poller's view of the moved event is the same maintenance: not decided again.
			finding := event.StatusFinding{InstanceID: instanceID(0), Finding: event.FindingScheduledEvent, Time: now, Code: event.ScheduledSystemReboot,
				EventID: "instance-event-1", NotBefore: moved, NotAfter: moved.Add(2 * time.Hour), Description: "The instance is scheduled for a reboot"}
			_, polled, err := finding.Event()
			if err != nil {
				t.Fatal(err)
			}
			if res, err := r.p.Process(context.Background(), polled); err != nil || res.AlreadyRecorded != 1 {
				t.Errorf("the poller's view: %+v, %v; want it recorded already", res, err)
			}
			// A late view of the event before the move (reordered) is the event EC2 now holds,
			// recorded already; it does not move anything again.
			if res, err := r.p.Process(context.Background(), scheduled("h-0", "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/other-view", rebootCode, start, "upcoming", instanceID(0))); err != nil || res.AlreadyRecorded != 1 {
				t.Errorf("a late view of the former start: %+v, %v; want it recorded already", res, err)
			}
			// AWS Health's update of the moved event (same eventArn, the new start) supersedes the
			// record: one active record, at the same time, and EC2 asked to move nothing more.
			if _, err := r.p.Process(context.Background(), scheduled("h-2", arn, rebootCode, moved, "upcoming", instanceID(0))); err != nil {
				t.Fatal(err)
			}
			set := recordtest.Set(t, r.kube, &r.claims(t)[0])
			if a := set.Active(); len(a) != 1 || a[0].EventID != "h-2" || !a[0].Until.Equal(open) {
				t.Errorf("active records %+v, want Health's update alone, until the window", a)
			}
			if n := len(srv.Moves()); n != 1 {
				t.Errorf("%d ModifyInstanceEventStartTime calls, want 1", n)
			}
		})
	}
}

// rescheduleRig is a rig whose kafka pool (annotated pool) has one instance, and EC2's stand-in
// holding its system reboot instance-event-1 at start (deadline: NotBeforeDeadline).
func rescheduleRig(t *testing.T, pool map[string]string, start, deadline time.Time) (*rig, *harness.EC2InstanceStatus, *ec2.Client) {
	t.Helper()
	r := newRig(t, map[string]map[string]string{"kafka": pool}, map[string]int{"kafka": 1})
	srv, client := harness.NewEC2InstanceStatus(t)
	srv.Now = func() time.Time { return now }
	srv.Add(instanceID(0), &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-1", Code: "system-reboot",
		Description: "The instance is scheduled for a reboot", NotBefore: start, NotAfter: start.Add(2 * time.Hour), NotBeforeDeadline: deadline}}})
	return r, srv, client
}

func drainEvents(rec *events.FakeRecorder) []string {
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

// TestStateConfirmation: an urgent state change is confirmed with EC2 (DescribeInstanceStatus,
// served by the stand-in) before it drains at once. In a pool that defers, an urgent drain
// goes now and an ordinary one is deferred: the outcome shows which the event was taken for.
func TestStateConfirmation(t *testing.T) {
	tests := []struct {
		name    string
		state   event.InstanceState // the event's
		ec2     string              // what EC2 shows; "" for an instance EC2 does not know
		fail    int
		denied  bool
		retried bool // the first try is an error (the message stays), the one after StateConfirmWait decides
		// receivedAgo is how long before now SQS first delivered the message: a router
		// restarted since its first try (or another replica) sees it that old.
		receivedAgo time.Duration
		wantAction  policy.Action
		wantResult  string
		wantWarn    string
	}{
		{name: "shutting-down, EC2 shows it shutting down", state: event.StateShuttingDown, ec2: "shutting-down", wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "terminated, EC2 shows it terminated", state: event.StateTerminated, ec2: "terminated", wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "terminated, EC2 no longer knows it", state: event.StateTerminated, wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "shutting-down, EC2 shows it stopping", state: event.StateShuttingDown, ec2: "stopping", wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "shutting-down, EC2 shows it running", state: event.StateShuttingDown, ec2: "running", wantAction: policy.ActionDefer, wantResult: StateContradicted,
			wantWarn: "a shutting-down state change for an instance EC2 shows running: not trusted as urgent"},
		{name: "terminated, EC2 shows it pending", state: event.StateTerminated, ec2: "pending", wantAction: policy.ActionDefer, wantResult: StateContradicted,
			wantWarn: "a terminated state change for an instance EC2 shows pending"},
		// Issue 38 item 4: EC2 unanswered (anyone in the account can throttle it) holds the
		// event for StateConfirmWait, then it is acted on as claimed.
		{name: "EC2 fails: retried, then acted on as claimed", state: event.StateShuttingDown, ec2: "running", fail: 1, retried: true, wantAction: policy.ActionDrain, wantResult: StateUnavailable,
			wantWarn: "the shutting-down state was not confirmed with EC2"},
		{name: "EC2 fails, first received a wait ago (the router restarted since): acted on as claimed", state: event.StateShuttingDown, ec2: "running", fail: 1,
			receivedAgo: StateConfirmWait, wantAction: policy.ActionDrain, wantResult: StateUnavailable, wantWarn: "the shutting-down state was not confirmed with EC2"},
		{name: "EC2 refuses: acted on as claimed", state: event.StateTerminated, ec2: "running", denied: true, wantAction: policy.ActionDrain, wantResult: StateUnavailable,
			wantWarn: "UnauthorizedOperation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, map[string]map[string]string{"kafka": {policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h"}},
				map[string]int{"kafka": 1})
			srv, client := harness.NewEC2InstanceStatus(t)
			if tt.ec2 != "" {
				srv.Add(instanceID(0), &harness.Instance{State: tt.ec2})
			}
			srv.Fail = tt.fail
			if tt.denied {
				srv.Denied = map[string]bool{"DescribeInstanceStatus": true}
			}
			r.p.WithStateConfirmation(client)
			var d policy.Decision
			ev := stateChange("sc", instanceID(0), tt.state, now)
			ev.FirstReceived = now.Add(-tt.receivedAgo)
			_, _, err := r.p.instance(context.Background(), ev, instanceID(0), newSummary(false), "", &d)
			tries := 1
			if tt.retried {
				if err == nil || !strings.Contains(err.Error(), "EC2 did not answer") {
					t.Fatalf("first try while EC2 does not answer: %v (%s), want it retried", err, d.Action)
				}
				if deleting := !r.claims(t)[0].DeletionTimestamp.IsZero(); deleting {
					t.Fatal("drained on the first try while EC2 does not answer")
				}
				r.p.clock.(*clocktesting.FakeClock).Step(StateConfirmWait)
				srv.Fail = tt.fail
				_, _, err = r.p.instance(context.Background(), ev, instanceID(0), newSummary(false), "", &d)
				tries = 2
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Action != tt.wantAction {
				t.Errorf("action %s (%s), want %s", d.Action, d.Reason, tt.wantAction)
			}
			if got := testutil.ToFloat64(r.m.StateConfirmations.WithLabelValues(tt.wantResult)); got != float64(tries) {
				t.Errorf("state confirmations{result=%s} = %v, want %d", tt.wantResult, got, tries)
			}
			warnings := strings.Join(d.Warnings, "; ")
			if strings.Contains(warnings, "EC2") != (tt.wantWarn != "") || !strings.Contains(warnings, tt.wantWarn) {
				t.Errorf("warnings %q, want %q", warnings, tt.wantWarn)
			}
			_, _, asked, includeAll := srv.Stats()
			if len(asked) != tries || !includeAll[0] {
				t.Errorf("DescribeInstanceStatus calls %v (IncludeAllInstances %v), want one with all instances", asked, includeAll)
			}
			// The instance-status findings and running/stopped changes are not asked about.
			r2 := newRig(t, map[string]map[string]string{"kafka": nil}, map[string]int{"kafka": 1})
			r2.p.WithStateConfirmation(client)
			if _, err := r2.p.Process(context.Background(), stateChange("run", instanceID(0), event.StateRunning, now)); err != nil {
				t.Fatal(err)
			}
			if calls, _, _, _ := srv.Stats(); calls != tries {
				t.Errorf("%d DescribeInstanceStatus calls; a running state change needs none", calls)
			}
		})
	}
}

// TestStaleStopIsOver (issue 36, defect 12): a stop/start whose `running` is handled first
// and whose older `stopping` comes after it, in a pool with no annotation (Karpenter's
// behaviour: a stop drains). What the router kept of the `running` may not be in its cache yet
// (or another replica handled it), so it must ask EC2: an instance EC2 shows running or pending again is not drained for its stop. A stop EC2
// confirms, or one it cannot confirm, drains as claimed.
func TestStaleStopIsOver(t *testing.T) {
	tests := []struct {
		name       string
		state      event.InstanceState
		ec2        string // "" for an instance EC2 does not know
		fail       int
		wantAction policy.Action
		wantResult string
		wantReason string
	}{
		{name: "stopping after its running: EC2 shows it running", state: event.StateStopping, ec2: "running", wantAction: policy.ActionIgnore, wantResult: StateContradicted,
			wantReason: "EC2 shows it running: the stop is over"},
		{name: "stopped, EC2 shows it pending (started again)", state: event.StateStopped, ec2: "pending", wantAction: policy.ActionIgnore, wantResult: StateContradicted,
			wantReason: "EC2 shows it pending"},
		{name: "stopping, EC2 shows it stopping", state: event.StateStopping, ec2: "stopping", wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "stopped, EC2 shows it stopped", state: event.StateStopped, ec2: "stopped", wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "stopped, EC2 no longer knows it", state: event.StateStopped, wantAction: policy.ActionDrain, wantResult: StateConfirmed},
		{name: "EC2 fails: drained as claimed", state: event.StateStopping, ec2: "running", fail: 1, wantAction: policy.ActionDrain, wantResult: StateUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1})
			srv, ec2c := harness.NewEC2InstanceStatus(t)
			if tt.ec2 != "" {
				srv.Add(instanceID(0), &harness.Instance{State: tt.ec2})
			}
			srv.Fail = tt.fail
			r.p.WithStateConfirmation(ec2c)
			// The `running` at now was handled, but its write is not in this router's cache
			// yet (live, the stop came up to 3 s after it): only EC2 knows.
			ctx := context.Background()
			var d policy.Decision
			if _, _, err := r.p.instance(ctx, stateChange("stop", instanceID(0), tt.state, now.Add(-30*time.Second)), instanceID(0), newSummary(false), "", &d); err != nil {
				t.Fatal(err)
			}
			if d.Action != tt.wantAction || !strings.Contains(d.Reason, tt.wantReason) {
				t.Errorf("action %s (%s), want %s (%q)", d.Action, d.Reason, tt.wantAction, tt.wantReason)
			}
			if got := testutil.ToFloat64(r.m.StateConfirmations.WithLabelValues(tt.wantResult)); got != 1 {
				t.Errorf("state confirmations{result=%s} = %v", tt.wantResult, got)
			}
			var nc karpv1.NodeClaim
			if err := r.kube.Get(ctx, client.ObjectKey{Name: "web-0"}, &nc); err != nil {
				t.Fatal(err)
			}
			if deleted := nc.DeletionTimestamp != nil; deleted != (tt.wantAction == policy.ActionDrain) {
				t.Errorf("NodeClaim deleted %v, want %v", deleted, tt.wantAction == policy.ActionDrain)
			}
		})
	}
}

// TestRescheduleReportDuringEC2Outage: the router moved a maintenance into the window, then a
// report of it at a later start comes while EC2 does not answer (a report sent before the move,
// reordered, or AWS postponing it: only EC2 can tell). Taken at its word it would supersede the
// record of the start EC2 holds; it is retried instead, and the record keeps the earlier start.
// A report of an earlier start is taken at its word (the safe side).
func TestRescheduleReportDuringEC2Outage(t *testing.T) {
	const rebootCode = "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"
	pool := map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		policy.AnnotationDrainLead: "1h", policy.AnnotationReschedule: "true"}
	start := now.Add(10 * 24 * time.Hour) // Tuesday 1 December, 12:00
	moved := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		report    time.Time
		wantErr   bool
		wantMatch time.Time // the active record's start after the report
	}{
		// The start the router moved it from is the moved maintenance: recorded, EC2 or not.
		{name: "the start before the move: the moved maintenance, recorded", report: start, wantMatch: moved},
		{name: "another later start (a report from before the move, or AWS postponing it): retried, the moved start kept", report: start.Add(24 * time.Hour), wantErr: true, wantMatch: moved},
		{name: "an earlier start: taken", report: moved.Add(-24 * time.Hour), wantMatch: moved.Add(-24 * time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, srv, client := rescheduleRig(t, pool, start, now.Add(14*24*time.Hour))
			r.p.WithRescheduler(reschedule.NewEvents(client))
			if _, err := r.p.Process(context.Background(), scheduled("h-1", "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/r1", rebootCode, start, "upcoming", instanceID(0))); err != nil {
				t.Fatal(err)
			}
			if held, _ := srv.Event(instanceID(0), "instance-event-1"); !held.NotBefore.Equal(moved) {
				t.Fatalf("EC2 holds %s, want the move to %s", held.NotBefore, moved)
			}
			srv.Fail = 1000 // EC2 answers nothing from here on
			_, err := r.p.Process(context.Background(), scheduled("h-0", "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/other-view", rebootCode, tt.report, "upcoming", instanceID(0)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want an error %v", err, tt.wantErr)
			}
			set := recordtest.Set(t, r.kube, &r.claims(t)[0])
			a := set.Active()
			if len(a) != 1 || a[0].Match != "system-reboot@"+tt.wantMatch.Format(time.RFC3339) {
				t.Errorf("active records %+v, want one of the maintenance at %s", a, tt.wantMatch)
			}
		})
	}
}

// TestReportOfTheFirstStartAfterACancel: found by make sim (a random seed on c7c27b0, after 200
// seeds). The router moved a kafka node's system reboot into the window, and AWS cancelled it
// there. The other source's report of the first start, sent before the move, was decided after
// the cancel: EC2 showed no open event to resolve it against, so it was taken at its word and
// stayed deferred for a maintenance that was cancelled (the node would be emptied for nothing),
// whether it came before the close or after it. It is the moved maintenance, recorded already.
func TestReportOfTheFirstStartAfterACancel(t *testing.T) {
	const rebootCode = "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED"
	const arn = "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/r1"
	pool := map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		policy.AnnotationDrainLead: "1h", policy.AnnotationReschedule: "true"}
	start := now.Add(10 * 24 * time.Hour)
	moved := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	for _, closeFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("close processed first: %v", closeFirst), func(t *testing.T) {
			r, srv, client := rescheduleRig(t, pool, start, now.Add(14*24*time.Hour))
			r.p.WithRescheduler(reschedule.NewEvents(client))
			if _, err := r.p.Process(context.Background(), scheduled("h-1", arn, rebootCode, start, "upcoming", instanceID(0))); err != nil {
				t.Fatal(err)
			}
			if held, _ := srv.Event(instanceID(0), "instance-event-1"); !held.NotBefore.Equal(moved) {
				t.Fatalf("EC2 holds %s, want the move to %s", held.NotBefore, moved)
			}
			srv.Set(instanceID(0), func(in *harness.Instance) { in.Events[0].Description = "[Canceled] " + in.Events[0].Description })
			if closeFirst {
				if _, err := r.p.Process(context.Background(), scheduled("h-1-closed", arn, rebootCode, moved, "closed", instanceID(0))); err != nil {
					t.Fatal(err)
				}
			}
			// The other source's view of the first start (another event ARN), sent before the move.
			if _, err := r.p.Process(context.Background(), scheduled("h-0", "arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/other-view", rebootCode, start, "upcoming", instanceID(0))); err != nil {
				t.Fatal(err)
			}
			if !closeFirst {
				if _, err := r.p.Process(context.Background(), scheduled("h-1-closed", arn, rebootCode, moved, "closed", instanceID(0))); err != nil {
					t.Fatal(err)
				}
			}
			set := recordtest.Set(t, r.kube, &r.claims(t)[0])
			if a := set.Active(); len(a) != 0 {
				t.Errorf("active records %+v after the cancel, want none", a)
			}
		})
	}
}

// newer makes the HealthRecord name a newer router's: a format this router does not read.
func newer(t *testing.T, c client.Client, name string) {
	t.Helper()
	hr := &record.HealthRecord{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, hr); err != nil {
		t.Fatal(err)
	}
	hr.Status.Version = record.Version + 7
	if err := c.Update(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
}
