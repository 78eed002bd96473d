package signal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// sentMessages records what reaches SQS; the integration suite forwards through moto.
type sentMessages struct {
	mu     sync.Mutex
	calls  int
	bodies []string
	refuse string // a body SQS refuses, per entry
}

func (s *sentMessages) SendMessageBatch(_ context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	out := &sqs.SendMessageBatchOutput{}
	for _, e := range in.Entries {
		if aws.ToString(e.MessageBody) == s.refuse {
			out.Failed = append(out.Failed, sqstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InvalidMessageContents"), Message: aws.String("no"), SenderFault: true})
			continue
		}
		s.bodies = append(s.bodies, aws.ToString(e.MessageBody))
		out.Successful = append(out.Successful, sqstypes.SendMessageBatchResultEntry{Id: e.Id, MessageId: aws.String("m")})
	}
	return out, nil
}

const healthBody = `{"version":"0","id":"h1","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":["i-0a1b2c3d4e5f6000a","i-0a1b2c3d4e5f6000b"],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/RET/1","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":"Sat, 28 Nov 2026 10:00:00 GMT","affectedEntities":[{"entityValue":"i-0a1b2c3d4e5f6000a"},{"entityValue":"i-0a1b2c3d4e5f6000b"}]}}`

type rig struct {
	kube     client.Client
	sent     *sentMessages
	recorder *events.FakeRecorder
	clock    *clocktesting.FakeClock
	claim    *karpv1.NodeClaim
}

func newRig(t *testing.T, mode Mode) (*Signaller, *rig) {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-a", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}},
		Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-0a1b2c3d4e5f6000a"}}
	r := &rig{kube: fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim).Build(), sent: &sentMessages{},
		recorder: events.NewFakeRecorder(100), clock: clocktesting.NewFakeClock(now)}
	r.claim = r.get(t)
	return New(r.kube, r.kube, mode, r.sent, "karpenter", r.recorder, r.clock), r
}

func (r *rig) get(t *testing.T) *karpv1.NodeClaim {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, nc); err != nil {
		t.Fatal(err)
	}
	return nc
}

func (r *rig) resolved(t *testing.T) cluster.Resolved {
	return cluster.Resolved{InstanceID: "i-0a1b2c3d4e5f6000a", NodeClaim: r.get(t)}
}

func parse(t *testing.T, body string) event.Event {
	t.Helper()
	ev, err := event.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestVia(t *testing.T) {
	spotEv := event.Event{Source: "aws.ec2", Kind: event.KindSpotInterruption}
	tests := []struct {
		mode Mode
		ev   event.Event
		want Mode
	}{
		{ModeForward, spotEv, ModeForward},
		{ModeForward, event.Event{Source: "aws.ec2", Kind: event.KindCapacityReservation}, ModeForward},
		{ModeForward, event.Event{Source: "aws.ec2", Kind: event.KindStateChange}, ModeForward},
		{ModeForward, event.Event{Source: "aws.health", Kind: event.KindScheduledChange}, ModeForward},
		// Karpenter only records a rebalance recommendation: deleting the NodeClaim drains.
		{ModeForward, event.Event{Source: "aws.ec2", Kind: event.KindRebalance}, ModeDeleteNodeClaim},
		// A finding of the router's own poller is nothing Karpenter's queue parses.
		{ModeForward, event.Event{Source: "healthrouter.io", Kind: event.KindScheduledChange}, ModeDeleteNodeClaim},
		{ModeDeleteNodeClaim, spotEv, ModeDeleteNodeClaim},
	}
	for _, tt := range tests {
		s := &Signaller{mode: tt.mode}
		if got := s.Via(tt.ev); got != tt.want {
			t.Errorf("%s mode, %s %s: %s, want %s", tt.mode, tt.ev.Source, tt.ev.Kind, got, tt.want)
		}
	}
}

// TestViaKarpenterVersion (issue 27, 2): Karpenter before v1.10 has no parser for a
// reservation interruption; an unknown version is taken as the newest.
func TestViaKarpenterVersion(t *testing.T) {
	reservation := event.Event{Source: "aws.ec2", Kind: event.KindCapacityReservation}
	tests := []struct {
		karpenter KarpenterVersion
		ev        event.Event
		want      Mode
	}{
		{KarpenterVersion{1, 9, 3}, reservation, ModeDeleteNodeClaim},
		{KarpenterVersion{1, 0, 8}, reservation, ModeDeleteNodeClaim},
		{KarpenterVersion{1, 10, 0}, reservation, ModeForward},
		{KarpenterVersion{}, reservation, ModeForward},
		{KarpenterVersion{1, 0, 8}, event.Event{Source: "aws.ec2", Kind: event.KindSpotInterruption}, ModeForward},
		{KarpenterVersion{1, 0, 0}, event.Event{Source: "aws.health", Kind: event.KindScheduledChange}, ModeForward},
		{KarpenterVersion{1, 0, 8}, event.Event{Source: "aws.ec2", Kind: event.KindStateChange}, ModeForward},
	}
	for _, tt := range tests {
		s := &Signaller{mode: ModeForward}
		s.SetKarpenterVersion(tt.karpenter)
		if got := s.Via(tt.ev); got != tt.want {
			t.Errorf("Karpenter %s, %s: %s, want %s", tt.karpenter, tt.ev.Kind, got, tt.want)
		}
	}
}

func TestDrainForwardsOnceAndStamps(t *testing.T) {
	s, r := newRig(t, ModeForward)
	ev := parse(t, healthBody)
	d := policy.Decision{EventID: ev.ID, InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain, Reason: "drain"}
	stale := r.resolved(t) // the cache, before the stamp shows
	already, err := s.Drain(context.Background(), ev, d, stale, false)
	if err != nil || already {
		t.Fatalf("drain: already %v, err %v", already, err)
	}
	if len(r.sent.bodies) != 1 || strings.Contains(r.sent.bodies[0], "i-0a1b2c3d4e5f6000b") || !strings.Contains(r.sent.bodies[0], "i-0a1b2c3d4e5f6000a") {
		t.Fatalf("forwarded %v", r.sent.bodies)
	}
	if d := r.mem(t).Drain; d == nil || d.EventID != "h1" || !d.At.Equal(now) || Mode(d.Via) != ModeForward {
		t.Errorf("drain %+v", d)
	}
	// A duplicate handled while the cache is still stale signals nothing.
	if already, err := s.Drain(context.Background(), ev, d, stale, false); err != nil || !already || len(r.sent.bodies) != 1 {
		t.Errorf("duplicate: already %v, err %v, %d forwarded", already, err, len(r.sent.bodies))
	}
}

func TestDrainRebalanceDeletesInForwardMode(t *testing.T) {
	s, r := newRig(t, ModeForward)
	ev := event.Event{ID: "rb1", Source: "aws.ec2", Kind: event.KindRebalance, Instances: []string{"i-0a1b2c3d4e5f6000a"}}
	if _, err := s.Drain(context.Background(), ev, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain}, r.resolved(t), true); err != nil {
		t.Fatal(err)
	}
	if len(r.sent.bodies) != 0 {
		t.Errorf("forwarded a rebalance Karpenter would only record: %v", r.sent.bodies)
	}
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, nc); err == nil {
		t.Errorf("nodeclaim not deleted: %+v", nc.ObjectMeta)
	}
	if len(r.recorder.Events) != 0 {
		t.Errorf("quiet drain posted %d Events", len(r.recorder.Events))
	}
}

func TestDeferRecordsTheEvent(t *testing.T) {
	s, r := newRig(t, ModeForward)
	ev := parse(t, healthBody)
	until := now.Add(24 * time.Hour)
	d := policy.Decision{EventID: ev.ID, InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDefer, Until: until, Hold: policy.HoldWindow, Reason: "window"}
	changed, err := s.Defer(context.Background(), ev, d, r.resolved(t), false)
	if err != nil || !changed {
		t.Fatalf("defer: changed %v, err %v", changed, err)
	}
	ds := r.mem(t).Records
	if len(ds) != 1 || ds[0].Hold != policy.HoldWindow || !ds[0].Until.Equal(until) || ds[0].Match != "instance-retirement@2026-11-28T10:00:00Z" {
		t.Fatalf("record %+v", ds)
	}
	// The record holds the event restricted to the instance, and it parses back.
	back, err := event.Parse(ds[0].Event)
	if err != nil || len(back.Instances) != 1 || back.Instances[0] != "i-0a1b2c3d4e5f6000a" || back.ID != "h1" {
		t.Errorf("recorded event: %v %+v", err, back)
	}
	set := r.mem(t).Set()
	if rec, ok := set.Recorded(ev); !ok || rec.EventID != "h1" {
		t.Error("Recorded does not find the deferral")
	}
	// A redelivery changes nothing and posts no Event.
	events := len(r.recorder.Events)
	if changed, err := s.Defer(context.Background(), ev, d, r.resolved(t), false); err != nil || changed || len(r.recorder.Events) != events {
		t.Errorf("redelivery: changed %v, err %v", changed, err)
	}
	// A newer update of the same Health event supersedes it.
	upd := ev
	upd.ID = "h2"
	if _, err := s.Defer(context.Background(), upd, d, r.resolved(t), true); err != nil {
		t.Fatal(err)
	}
	ds = r.mem(t).Records
	if len(ds) != 2 || ds[0].State != record.StateSuperseded || ds[1].State != record.StateDeferred {
		t.Errorf("after an update: %+v", ds)
	}
	// The drain of the newer update removes both records.
	if _, err := s.Drain(context.Background(), upd, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain}, r.resolved(t), true); err != nil {
		t.Fatal(err)
	}
	if ds := r.mem(t).Records; len(ds) != 0 {
		t.Errorf("records left after the drain: %+v", ds)
	}
}

func TestDeferWithoutNodeClaimFails(t *testing.T) {
	s, _ := newRig(t, ModeDeleteNodeClaim)
	ev := parse(t, healthBody)
	if _, err := s.Defer(context.Background(), ev, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDefer}, cluster.Resolved{InstanceID: "i-0a1b2c3d4e5f6000a"}, false); err == nil {
		t.Error("a deferral with no NodeClaim to hold it was accepted")
	}
}

func TestMatchAcrossSources(t *testing.T) {
	health := parse(t, healthBody)
	polled := event.Event{ID: "p1", Kind: event.KindScheduledChange, Deadline: health.Deadline.Add(300 * time.Millisecond),
		Health: &event.Health{Scheduled: event.ScheduledInstanceRetirement}}
	if record.Match(health) == "" || record.Match(health) != record.Match(polled) {
		t.Errorf("Match %q vs %q", record.Match(health), record.Match(polled))
	}
	other := polled
	other.Health = &event.Health{Scheduled: event.ScheduledInstanceReboot}
	if record.Match(other) == record.Match(health) {
		t.Error("a reboot matches a retirement")
	}
	if record.Match(event.Event{Kind: event.KindSpotInterruption}) != "" {
		t.Error("a spot interruption has a maintenance identity")
	}
}

func TestIgnoreCancelsAndRemoves(t *testing.T) {
	s, r := newRig(t, ModeDeleteNodeClaim)
	stop := parse(t, `{"version":"0","id":"s1","detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","time":"2026-11-21T12:00:00Z","region":"eu-west-1","resources":[],"detail":{"instance-id":"i-0a1b2c3d4e5f6000a","state":"stopping"}}`)
	if _, err := s.Defer(context.Background(), stop, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDefer, Until: now.Add(15 * time.Minute), Hold: policy.HoldRestartGrace}, r.resolved(t), false); err != nil {
		t.Fatal(err)
	}
	running := event.Event{ID: "r1", Kind: event.KindStateChange, State: event.StateRunning}
	if err := s.Ignore(context.Background(), running, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionIgnore, Cancel: true}, r.resolved(t), false); err != nil {
		t.Fatal(err)
	}
	ds := r.mem(t).Records
	if len(ds) != 1 || ds[0].State != record.StateCancelled || ds[0].Active() {
		t.Fatalf("after running: %+v", ds)
	}
	// Pruned only once its time has passed.
	if err := s.Prune(context.Background(), r.get(t), now); err != nil || len(r.mem(t).Records) != 1 {
		t.Errorf("pruned early: %v", err)
	}
	if err := s.Prune(context.Background(), r.get(t), now.Add(16*time.Minute)); err != nil || len(r.mem(t).Records) != 0 {
		t.Errorf("not pruned after its time: %v %+v", err, r.mem(t).Records)
	}
	// A deferral re-decided as ignored (the pool's policy changed) is removed.
	if _, err := s.Defer(context.Background(), stop, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDefer, Until: now.Add(time.Hour)}, r.resolved(t), true); err != nil {
		t.Fatal(err)
	}
	if err := s.Ignore(context.Background(), stop, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionIgnore}, r.resolved(t), true); err != nil {
		t.Fatal(err)
	}
	if ds := r.mem(t).Records; len(ds) != 0 {
		t.Errorf("ignored deferral kept: %+v", ds)
	}
}

// TestUpdateRereadsOnConflict: a write starts from the cached object; when someone else wrote
// first (a stale resourceVersion), it reads fresh and applies the change again.
func TestUpdateRereadsOnConflict(t *testing.T) {
	s, r := newRig(t, ModeDeleteNodeClaim)
	stale := r.get(t)
	other := r.get(t)
	other.Annotations = map[string]string{"someone": "else"}
	if err := r.kube.Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if err := s.update(context.Background(), stale, func(nc *karpv1.NodeClaim) (bool, error) { nc.Annotations["mine"] = "1"; return true, nil }); err != nil {
		t.Fatal(err)
	}
	got := r.get(t).Annotations
	if got["mine"] != "1" || got["someone"] != "else" {
		t.Errorf("annotations %v", got)
	}
}

// TestUpdatePatchesMetadataOnly: the router's NodeClaim writes name the object's metadata
// alone, so the API server answers with metadata, not the whole NodeClaim (the live bench's
// profile had a tenth of the router's CPU decoding those answers); the write still lands,
// with its optimistic lock.
func TestUpdatePatchesMetadataOnly(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-a"}}
	var targets []string
	var patches []string
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim).WithInterceptorFuncs(interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			targets = append(targets, fmt.Sprintf("%T", obj))
			data, _ := patch.Data(obj)
			patches = append(patches, string(data))
			return c.Patch(ctx, obj, patch, opts...)
		},
	}).Build()
	s := New(kube, kube, ModeDeleteNodeClaim, nil, "", events.NewFakeRecorder(10), clocktesting.NewFakeClock(now))
	cached := &karpv1.NodeClaim{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, cached); err != nil {
		t.Fatal(err)
	}
	if err := s.update(context.Background(), cached, func(nc *karpv1.NodeClaim) (bool, error) { nc.Annotations["mine"] = "1"; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if len(targets) != 1 || targets[0] != "*v1.PartialObjectMetadata" {
		t.Errorf("patch targets %v, want one *v1.PartialObjectMetadata", targets)
	}
	if len(patches) != 1 || !strings.Contains(patches[0], `"mine":"1"`) || !strings.Contains(patches[0], `"resourceVersion":"`+cached.ResourceVersion+`"`) {
		t.Errorf("patches %v: want the annotation and the optimistic lock", patches)
	}
	got := &karpv1.NodeClaim{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, got); err != nil || got.Annotations["mine"] != "1" {
		t.Errorf("annotations %v (%v)", got.Annotations, err)
	}
}

func TestFallbackDeletesAndRestamps(t *testing.T) {
	s, r := newRig(t, ModeForward)
	nc := r.get(t)
	nc.Finalizers = []string{"karpenter.sh/termination"} // held, as Karpenter's finalizer holds it
	if err := r.kube.Update(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if err := s.Store().Update(context.Background(), nc, func(m *record.Memory) (bool, error) {
		m.Drain = &record.Drain{EventID: "h1", At: now, Via: string(ModeForward)}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if forwarded, err := s.Fallback(context.Background(), r.get(t), 25*time.Second); err != nil || !forwarded {
		t.Fatalf("fallback: forwarded %v, err %v", forwarded, err)
	}
	got := r.get(t)
	if got.DeletionTimestamp.IsZero() {
		t.Error("not deleted")
	}
	if d := r.mem(t).Drain; d == nil || Mode(d.Via) != ModeDeleteNodeClaim {
		t.Errorf("drain %+v", d)
	}
	select {
	case e := <-r.recorder.Events:
		if !strings.Contains(e, ReasonForwardUnconfirmed) {
			t.Errorf("event %q", e)
		}
	default:
		t.Error("no Warning Event")
	}
}

func TestDrainStampRoundTrip(t *testing.T) {
	for _, v := range []string{record.DrainStamp("e1", now, string(ModeForward)), "e1 2026-11-21T12:00:00Z"} {
		id, at, _, ok := record.ParseDrainStamp(v)
		if !ok || id != "e1" || !at.Equal(now) {
			t.Errorf("%q: %s %s %v", v, id, at, ok)
		}
	}
	if _, _, _, ok := record.ParseDrainStamp("garbage"); ok {
		t.Error("garbage parsed")
	}
	b, _ := json.Marshal(record.Record{EventID: "x"})
	if strings.Contains(string(b), "hold") || strings.Contains(string(b), `"event"`) {
		t.Errorf("empty optional fields written: %s", b)
	}
}

// TestForwardsShareBatches: forwards made at once share SendMessageBatch calls of at most
// ten; one SQS refuses fails only its sender.
func TestForwardsShareBatches(t *testing.T) {
	sent := &sentMessages{refuse: "body-7"}
	b := newBatcher(sent, "karpenter")
	var wg sync.WaitGroup
	errs := make([]error, 25)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = b.send(context.Background(), fmt.Sprintf("body-%d", i))
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if (err != nil) != (i == 7) {
			t.Errorf("send %d: %v", i, err)
		}
	}
	if len(sent.bodies) != 24 || sent.calls < 3 || sent.calls > 12 {
		t.Errorf("%d bodies in %d calls; want 24 in 3 to 12", len(sent.bodies), sent.calls)
	}
	// A lone forward goes out on its own after the linger.
	start := time.Now()
	if err := b.send(context.Background(), "alone"); err != nil || time.Since(start) > time.Second {
		t.Errorf("lone send: %v after %s", err, time.Since(start))
	}
}

func ensureAnnotations(nc *karpv1.NodeClaim) *karpv1.NodeClaim {
	if nc.Annotations == nil {
		nc.Annotations = map[string]string{}
	}
	return nc
}

// TestForwardBodyPerInstance: the bodies of one event's instances (a bulk event, then each
// instance's record, which share the event's ID and their bodies' length) each name their own
// instance.
func TestForwardBodyPerInstance(t *testing.T) {
	s, _ := newRig(t, ModeForward)
	bulk := parse(t, healthBody)
	for _, id := range bulk.Instances {
		body, err := s.forwardBody(bulk, id)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := event.Parse(body)
		if err != nil || len(rec.Instances) != 1 || rec.Instances[0] != id {
			t.Fatalf("bulk body for %s: %v %v", id, rec.Instances, err)
		}
		// The record's event, decided again: its body for its own instance.
		again, err := s.forwardBody(rec, id)
		if err != nil {
			t.Fatal(err)
		}
		if back, _ := event.Parse(again); len(back.Instances) != 1 || back.Instances[0] != id {
			t.Errorf("record body for %s names %v", id, back.Instances)
		}
	}
}

// TestFailedDeleteIsRetried: a DELETE that fails (the API server unreachable) is an error, and
// the retry deletes: the instance is not remembered as signalled (a lost drain otherwise).
func TestFailedDeleteIsRetried(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-a", Finalizers: []string{"karpenter.sh/termination"}}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-0a1b2c3d4e5f6000a"}}
	failures := 1
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if failures > 0 {
				failures--
				return errors.New("EOF")
			}
			return c.Delete(ctx, obj, opts...)
		},
	}).Build()
	s := New(kube, kube, ModeDeleteNodeClaim, nil, "", events.NewFakeRecorder(10), clocktesting.NewFakeClock(now))
	ev := event.Event{ID: "spot-1", Source: "aws.ec2", Kind: event.KindSpotInterruption, Instances: []string{"i-0a1b2c3d4e5f6000a"}}
	d := policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain}
	res := cluster.Resolved{InstanceID: "i-0a1b2c3d4e5f6000a", NodeClaim: claim}
	if _, err := s.Drain(context.Background(), ev, d, res, true); err == nil {
		t.Fatal("a failed DELETE was not an error")
	}
	already, err := s.Drain(context.Background(), ev, d, res, true)
	if err != nil || already {
		t.Fatalf("retry: already %v, err %v", already, err)
	}
	got := &karpv1.NodeClaim{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, got); err != nil || got.DeletionTimestamp.IsZero() {
		t.Errorf("not deleted on the retry: %v", err)
	}
}

// TestForwardWhoseStampFailed (issue 15, 8a): on 351c311 a forward went out first and its stamp
// after; a stamp that failed was a success with no stamp (no confirm-or-fallback, the pacing slot
// held). Now the stamp comes first: a stamp that fails sends nothing and is an error (retried,
// the slot given back), and the retry stamps and forwards once. A send that fails after the stamp
// is left to the deferral controller's fallback delete.
func TestForwardWhoseStampFailed(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-a"}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-0a1b2c3d4e5f6000a"}}
	failures := 1
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if failures > 0 {
				failures--
				return errors.New("EOF")
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	sent := &sentMessages{}
	s := New(kube, kube, ModeForward, sent, "karpenter", events.NewFakeRecorder(10), clocktesting.NewFakeClock(now))
	ev := parse(t, healthBody)
	d := policy.Decision{EventID: ev.ID, InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain}
	res := cluster.Resolved{InstanceID: "i-0a1b2c3d4e5f6000a", NodeClaim: claim}
	if _, err := s.Drain(context.Background(), ev, d, res, true); err == nil || len(sent.bodies) != 0 {
		t.Fatalf("a failed stamp: err %v, %d forwarded (want an error and nothing sent)", err, len(sent.bodies))
	}
	if _, err := s.Drain(context.Background(), ev, d, res, true); err != nil {
		t.Fatalf("retry: %v", err)
	}
	got := &karpv1.NodeClaim{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: "kafka-a"}, got); err != nil || memOf(t, kube, "kafka-a").Drain == nil {
		t.Errorf("the retry did not stamp: %v %v", err, memOf(t, kube, "kafka-a"))
	}
	if len(sent.bodies) != 1 {
		t.Errorf("forwarded %d times, want once", len(sent.bodies))
	}
}

const spotBody = `{"version":"0","id":"s1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-21T11:58:00Z","region":"eu-west-1","resources":["arn:aws:ec2:eu-west-1a:123456789012:instance/i-0a1b2c3d4e5f6000a"],"detail":{"instance-id":"i-0a1b2c3d4e5f6000a","instance-action":"terminate"}}`

// refusingSQS fails every send, as SQS unreachable.
type refusingSQS struct{}

func (refusingSQS) SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	return nil, errors.New("dial tcp: connection refused")
}

// An urgent forward (a Spot warning) does not wait on the API server: the stamp and the send
// go at once. A stamp that fails is an error whose retry stamps without sending again; a send
// that fails leaves the stamp to the confirm-or-fallback; a NodeClaim gone is drained already.
func TestUrgentForwardStampsAndSendsAtOnce(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	notFound := errors.New("not found")
	for _, tc := range []struct {
		name string
		// patch is called on each PATCH of the NodeClaim with what was sent by then; it
		// returns the error the API server answers (nil: the PATCH goes through).
		patch        func(sent *sentMessages, try int) error
		refuse       bool
		wantFirstErr bool
		wantAlready  bool
		wantSent     int
		wantStamp    bool
		wantRetry    bool // a second Drain is needed and must succeed without sending again
	}{
		{name: "the send goes while the stamp waits on the API server", wantSent: 1, wantStamp: true,
			patch: func(sent *sentMessages, _ int) error {
				deadline := time.Now().Add(5 * time.Second)
				for time.Now().Before(deadline) {
					sent.mu.Lock()
					n := len(sent.bodies)
					sent.mu.Unlock()
					if n > 0 {
						return nil
					}
					time.Sleep(time.Millisecond)
				}
				return errors.New("the send waited for the stamp")
			}},
		{name: "a stamp that fails: an error, the retry stamps and sends nothing more", wantFirstErr: true, wantSent: 1, wantStamp: true, wantRetry: true,
			patch: func(_ *sentMessages, try int) error {
				if try == 0 {
					return errors.New("EOF")
				}
				return nil
			}},
		{name: "a send that fails: the stamp stays for the fallback", refuse: true, wantSent: 0, wantStamp: true},
		{name: "the NodeClaim is gone: drained already", wantAlready: true, wantSent: 1,
			patch: func(*sentMessages, int) error { return notFound }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "spot-a"}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/i-0a1b2c3d4e5f6000a"}}
			sent := &sentMessages{}
			tries := 0
			kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if tc.patch != nil {
						err := tc.patch(sent, tries)
						tries++
						if err == notFound {
							return apierrorsNotFound(obj.GetName())
						}
						if err != nil {
							return err
						}
					}
					return c.Create(ctx, obj, opts...)
				},
			}).Build()
			var api batchAPI = sent
			if tc.refuse {
				api = refusingSQS{}
			}
			rec := events.NewFakeRecorder(10)
			s := New(kube, kube, ModeForward, api, "karpenter", rec, clocktesting.NewFakeClock(now))
			ev := parse(t, spotBody)
			if !ev.Urgent() {
				t.Fatal("the Spot warning is not urgent")
			}
			d := policy.Decision{EventID: ev.ID, InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDrain}
			res := cluster.Resolved{InstanceID: "i-0a1b2c3d4e5f6000a", NodeClaim: claim}
			already, err := s.Drain(context.Background(), ev, d, res, true)
			if (err != nil) != tc.wantFirstErr || already != tc.wantAlready {
				t.Fatalf("Drain: already %t, err %v; want already %t, an error %t", already, err, tc.wantAlready, tc.wantFirstErr)
			}
			if tc.wantRetry {
				if _, err := s.Drain(context.Background(), ev, d, res, true); err != nil {
					t.Fatalf("retry: %v", err)
				}
			}
			if len(sent.bodies) != tc.wantSent {
				t.Errorf("forwarded %d times, want %d", len(sent.bodies), tc.wantSent)
			}
			got := &karpv1.NodeClaim{}
			if err := kube.Get(context.Background(), client.ObjectKey{Name: "spot-a"}, got); err != nil {
				t.Fatal(err)
			}
			if stamped := memOf(t, kube, "spot-a").Drain != nil; stamped != tc.wantStamp {
				t.Errorf("stamped %t, want %t (%+v)", stamped, tc.wantStamp, memOf(t, kube, "spot-a"))
			}
			if tc.refuse && !strings.Contains(strings.Join(drainEvents(rec), "\n"), "forwarding it to Karpenter failed") {
				t.Error("no Warning Event for the failed send")
			}
		})
	}
}

func apierrorsNotFound(name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Group: "karpenter.sh", Resource: "nodeclaims"}, name)
}

// While the API server fails, urgent forwards wait for their stamps again: the first, in
// flight when the stamps began to fail, went out unstamped; the next sends nothing until its
// stamp is written. Once stamps have gone through for stampTrouble, they go at once again.
func TestUrgentForwardWaitsWhileStampsFail(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	claim := func(name, id string) *karpv1.NodeClaim {
		return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + id}}
	}
	a, b := claim("spot-a", "i-0a1b2c3d4e5f6000a"), claim("spot-b", "i-0a1b2c3d4e5f6000b")
	down := true
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(a, b).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if down {
				return errors.New("EOF")
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	sent := &sentMessages{}
	clk := clocktesting.NewFakeClock(now)
	s := New(kube, kube, ModeForward, sent, "karpenter", events.NewFakeRecorder(10), clk)
	drain := func(nc *karpv1.NodeClaim, id string) error {
		ev := parse(t, strings.ReplaceAll(strings.ReplaceAll(spotBody, "i-0a1b2c3d4e5f6000a", id), `"id":"s1"`, `"id":"s-`+id+`"`))
		d := policy.Decision{EventID: ev.ID, InstanceID: id, Action: policy.ActionDrain}
		_, err := s.Drain(context.Background(), ev, d, cluster.Resolved{InstanceID: id, NodeClaim: nc}, true)
		return err
	}
	if err := drain(a, "i-0a1b2c3d4e5f6000a"); err == nil || len(sent.bodies) != 1 {
		t.Fatalf("the first, as the stamps begin to fail: err %v, %d sent (want an error, 1 sent)", err, len(sent.bodies))
	}
	if err := drain(b, "i-0a1b2c3d4e5f6000b"); err == nil || len(sent.bodies) != 1 {
		t.Fatalf("the next, while they fail: err %v, %d sent (want an error, nothing more sent)", err, len(sent.bodies))
	}
	down = false
	if err := drain(b, "i-0a1b2c3d4e5f6000b"); err != nil || len(sent.bodies) != 2 {
		t.Fatalf("the API server back: err %v, %d sent (want 2)", err, len(sent.bodies))
	}
	if !s.apiTroubled() {
		t.Error("a stamp that went through ended the wait before stampTrouble")
	}
	clk.Step(stampTrouble)
	if s.apiTroubled() {
		t.Errorf("urgent forwards still wait for their stamps %s after the last failure", stampTrouble)
	}
}

// The memory of recent drains: an entry counts for recentTTL, checked on each lookup, and
// expired entries are swept at most once per recentSweep.
func TestSignalledRecently(t *testing.T) {
	clk := clocktesting.NewFakeClock(now)
	s := New(nil, nil, ModeDeleteNodeClaim, nil, "", events.NewFakeRecorder(1), clk)
	for _, tc := range []struct {
		step     time.Duration
		remember string
		ask      string
		want     bool
		kept     int // entries in the map after the lookup
	}{
		{remember: "i-a", ask: "i-a", want: true, kept: 1},
		{ask: "i-b", want: false, kept: 1},
		{step: recentTTL - recentSweep/2, remember: "i-b", ask: "i-a", want: true, kept: 2},
		{step: recentSweep, ask: "i-a", want: false, kept: 1}, // swept: a minute since the last sweep
		{step: recentSweep / 2, ask: "i-b", want: true, kept: 1},
		{step: recentTTL, ask: "i-b", want: false, kept: 0},
		{remember: "i-c", ask: "i-c", want: true, kept: 1},
		{step: recentTTL - recentSweep/2, ask: "i-c", want: true, kept: 1},
		{step: 3 * recentSweep / 4, ask: "i-c", want: false, kept: 1}, // expired, not yet swept
	} {
		clk.Step(tc.step)
		if tc.remember != "" {
			s.remember(tc.remember)
		}
		if got := s.signalledRecently(tc.ask); got != tc.want {
			t.Errorf("at +%s: %s recent %t, want %t", clk.Since(now), tc.ask, got, tc.want)
		}
		if len(s.recent) != tc.kept {
			t.Errorf("at +%s: %d entries kept, want %d", clk.Since(now), len(s.recent), tc.kept)
		}
	}
}

// The patch names what changed in the annotations and nothing else, with the optimistic lock;
// it matches, key for key, the merge patch controller-runtime computes from the whole objects.
func TestAnnotationPatch(t *testing.T) {
	for _, tc := range []struct {
		name       string
		base, next map[string]string
		want       string
	}{
		{"added to none", nil, map[string]string{"a": "1"}, `{"metadata":{"annotations":{"a":"1"},"resourceVersion":"7"}}`},
		{"changed", map[string]string{"a": "1", "b": "2"}, map[string]string{"a": "1", "b": "3"}, `{"metadata":{"annotations":{"b":"3"},"resourceVersion":"7"}}`},
		{"removed", map[string]string{"a": "1", "b": "2"}, map[string]string{"a": "1"}, `{"metadata":{"annotations":{"b":null},"resourceVersion":"7"}}`},
		{"set to empty", map[string]string{"a": "1"}, map[string]string{"a": ""}, `{"metadata":{"annotations":{"a":""},"resourceVersion":"7"}}`},
		{"quoted value", nil, map[string]string{"r": `{"version":2,"records":[]}`}, `{"metadata":{"annotations":{"r":"{\"version\":2,\"records\":[]}"},"resourceVersion":"7"}}`},
		{"unchanged", map[string]string{"a": "1"}, map[string]string{"a": "1"}, ``},
		{"both empty", nil, map[string]string{}, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "x", ResourceVersion: "7", Annotations: tc.base}}
			next := base.DeepCopy()
			next.Annotations = tc.next
			next.Labels = map[string]string{"not": "sent"} // only annotations are written
			got, err := annotationPatch(base, next)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
			if tc.want == "" {
				return
			}
			next.Labels = base.Labels
			lib, err := client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}).Data(next)
			if err != nil {
				t.Fatal(err)
			}
			var a, b any
			if err := json.Unmarshal(got, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(lib, &b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("got %s, controller-runtime's merge patch %s", got, lib)
			}
		})
	}
}

// TestDeferAfterAConcurrentClose: an update of a Health event and its close are decided at once
// (two workers of one batch). The close is written first; the deferral, decided from a copy
// read before it, is written over the fresh set: the close's tombstone ends it there, as it
// would have ended it at the decision. Two shapes: the close newer than the update, and from
// the same second (AWS Health closes an event last).
func TestDeferAfterAConcurrentClose(t *testing.T) {
	const closedBody = `{"version":"0","id":"h9","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"%s","region":"eu-west-1","resources":[],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/RET/1","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"closed","startTime":"Sat, 28 Nov 2026 10:00:00 GMT","affectedEntities":[{"entityValue":"i-0a1b2c3d4e5f6000a"}]}}`
	for _, closedAt := range []string{"2026-11-21T11:00:00Z", "2026-11-21T10:00:00Z"} {
		t.Run("closed at "+closedAt, func(t *testing.T) {
			s, r := newRig(t, ModeDeleteNodeClaim)
			upd := parse(t, healthBody) // sent at 10:00
			stale := r.resolved(t)      // the update's worker read the NodeClaim here
			closed := parse(t, fmt.Sprintf(closedBody, closedAt))
			if err := s.Ignore(context.Background(), closed, policy.Decision{InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionIgnore, Cancel: true}, r.resolved(t), false); err != nil {
				t.Fatal(err)
			}
			d := policy.Decision{EventID: upd.ID, InstanceID: "i-0a1b2c3d4e5f6000a", Action: policy.ActionDefer, Until: now.Add(24 * time.Hour), Hold: policy.HoldWindow, Reason: "window"}
			changed, err := s.Defer(context.Background(), upd, d, stale, false)
			if err != nil {
				t.Fatal(err)
			}
			set := r.mem(t).Set()
			if a := set.Active(); changed || len(a) != 0 {
				t.Errorf("changed %v, %d active record(s): the close written first must end the older update", changed, len(a))
			}
		})
	}
}

// memOf is the router's memory of NodeClaim name, as the API server holds it.
func memOf(t *testing.T, c client.Reader, name string) record.Memory {
	t.Helper()
	m, err := record.Load(context.Background(), c, name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (r *rig) mem(t *testing.T) record.Memory {
	t.Helper()
	return memOf(t, r.kube, "kafka-a")
}
