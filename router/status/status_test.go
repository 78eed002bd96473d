package status

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// now is Saturday 2026-11-21 12:00 UTC.
var now = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

var saturdays = map[string]string{
	policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
	policy.AnnotationMaxConcurrentDrains: "1",
}

func scheduled(id string, start time.Time) event.Event {
	return event.Event{
		ID: id, Kind: event.KindScheduledChange, Time: now.Add(-24 * time.Hour), Deadline: start,
		Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/X/" + id, TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Scheduled: event.ScheduledInstanceRetirement, Start: start},
	}
}

// decided returns the deferral record the signaller writes for a decision that policy.Decide
// made: the reasons are the real ones, so holdOf is tested on what the router writes.
func decided(t *testing.T, ev event.Event, ann map[string]string, inFlight int, checks ...policy.Check) record.Record {
	t.Helper()
	tg := policy.Target{InstanceID: "i-0a1b2c3d4e5f60718", Found: true, NodeClaim: "x", NodePool: "p", Policy: policy.FromAnnotations(ann), PoolNodes: 4, DrainsInFlight: inFlight}
	d := policy.Decide(ev, tg, now)
	if len(checks) > 0 {
		d = policy.ApplyChecks(d, ev, tg.Policy, checks, now)
	}
	if d.Action != policy.ActionDefer {
		t.Fatalf("decision %s (%s), want defer", d.Action, d.Reason)
	}
	return record.Record{EventID: ev.ID, Key: record.Key(ev), Kind: ev.Kind, Until: d.Until, Reason: d.Reason, State: record.StateDeferred}
}

func TestHoldOf(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	stop := event.Event{ID: "stop", Kind: event.KindStateChange, Time: now.Add(-time.Minute), State: event.StateStopped}
	amiFailed := policy.Check{Name: "ami", Reason: "image ami-0e1f2a3b4c5d6e7f8 is pending, not available"}
	for _, tc := range []struct {
		name string
		d    record.Record
		want string
	}{
		{"waits for the window", decided(t, scheduled("w", week), saturdays, 0), HoldWindow},
		{"window after the deadline", decided(t, scheduled("d", now.Add(48*time.Hour)), saturdays, 0), HoldDeadline},
		{"no window", decided(t, scheduled("n", week), map[string]string{policy.AnnotationAction: "defer"}, 0), HoldDeadline},
		{"stopped instance", decided(t, stop, map[string]string{policy.AnnotationAction: "defer"}, 0), HoldRestartGrace},
		{"pacing", decided(t, scheduled("p", week), map[string]string{policy.AnnotationMaxConcurrentDrains: "1"}, 1), HoldPacing},
		{"check", decided(t, scheduled("c", week), nil, 0, amiFailed), HoldCheck},
		{"a reason the router does not write", record.Record{Reason: "set by hand"}, HoldOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := holdOf(tc.d); got != tc.want {
				t.Errorf("holdOf(%q) = %s, want %s", tc.d.Reason, got, tc.want)
			}
		})
	}
}

func TestOneLine(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want string
	}{
		{nil, "Karpenter's (drain; rebalance ignored); no window; drain-lead 1h0m0s; restart-grace 15m0s; drains unlimited"},
		{saturdays, `defer; window "0 2 * * 6" for 4h0m0s; drain-lead 1h0m0s; restart-grace 15m0s; max-concurrent-drains 1`},
		{map[string]string{
			policy.AnnotationAction: "defer", policy.ActionKey(event.KindSpotInterruption): "ignore",
			policy.ScheduledActionKey(event.ScheduledSystemReboot): "drain", policy.AnnotationDrainLead: "6h",
			policy.AnnotationMaxConcurrentDrains: "20%",
		}, "defer (spot-interruption=ignore, scheduled-change.system-reboot=drain); no window; drain-lead 6h0m0s; restart-grace 15m0s; max-concurrent-drains 20%"},
		{map[string]string{policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer"},
			"SHADOW: its policy recorded as would-be, Karpenter's behaviour carried out (status --shadow); defer; no window; drain-lead 1h0m0s; restart-grace 15m0s; drains unlimited"},
	} {
		if got := OneLine(policy.FromAnnotations(tc.ann)); got != tc.want {
			t.Errorf("OneLine(%v)\n got %s\nwant %s", tc.ann, got, tc.want)
		}
	}
}

func claim(t *testing.T, name string, ds []record.Record, ann map[string]string, deleting bool) *karpv1.NodeClaim {
	t.Helper()
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}, Annotations: map[string]string{}}}
	nc.Status.NodeName = "node-" + name
	for k, v := range ann {
		nc.Annotations[k] = v
	}
	if deleting {
		ts := metav1.NewTime(now.Add(-10 * time.Minute))
		nc.DeletionTimestamp = &ts
	}
	return nc
}

func TestPoolStatus(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	window := decided(t, scheduled("ev-window", week), saturdays, 0)
	check := decided(t, scheduled("ev-check", week), nil, 0, policy.Check{Name: "ami", Reason: "image ami-1 is pending, not available"})
	cancelled := window
	cancelled.EventID, cancelled.State = "ev-old", record.StateCancelled
	signalledAt := now.Add(-5 * time.Minute)
	deletedAt := now.Add(-10 * time.Minute) // claim() deletes 10 minutes ago
	np := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: saturdays}}
	mems := map[string]record.Memory{
		"kafka-d": {Records: []record.Record{window, cancelled}},
		"kafka-a": {Drain: &record.Drain{EventID: "ev-spot", At: signalledAt, Via: "forward"}},
		"kafka-c": {Records: []record.Record{check}},
		"kafka-e": {Drain: &record.Drain{At: signalledAt}},
		"kafka-f": {Run: json.RawMessage(`{"version":1,"event_id":"ev-reboot","type":"system-reboot","step":"evict","began":"` + signalledAt.Format(time.RFC3339) + `"}`)},
		"kafka-g": {Run: json.RawMessage(`{"version":1,"event_id":"ev-old-reboot","type":"system-reboot","step":"done","outcome":"done"}`)},
	}
	claims := []*karpv1.NodeClaim{
		claim(t, "kafka-d", nil, nil, false),
		claim(t, "kafka-a", nil, nil, false),
		claim(t, "kafka-b", nil, nil, true),
		claim(t, "kafka-c", nil, nil, false),
		claim(t, "kafka-e", nil, nil, false),
		claim(t, "kafka-f", nil, nil, false),
		claim(t, "kafka-g", nil, nil, false),
	}
	got := poolStatus(np, claims, mems, now)
	next := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	limit := 1
	want := NodePool{
		Name: "kafka", Policy: OneLine(policy.FromAnnotations(saturdays)), Nodes: 7,
		Window:         &Window{Schedule: "0 2 * * 6", Duration: "4h0m0s", Next: &next},
		DrainsInFlight: 4, DrainLimit: &limit,
		Drains: []Drain{
			{NodeClaim: "kafka-a", Node: "node-kafka-a", EventID: "ev-spot", Since: &signalledAt},
			{NodeClaim: "kafka-b", Node: "node-kafka-b", Deleting: true, Since: &deletedAt}, // no stamp: since its deletion
			{NodeClaim: "kafka-e", Node: "node-kafka-e", Since: &signalledAt},
			{NodeClaim: "kafka-f", Node: "node-kafka-f", EventID: "ev-reboot", Since: &signalledAt, InPlace: "evict"}, // a run in progress; kafka-g's is over
		},
		Deferred: []Deferred{
			{NodeClaim: "kafka-c", Node: "node-kafka-c", EventID: "ev-check", Kind: event.KindScheduledChange, Until: now.Add(policy.CheckRecheck), Hold: HoldCheck, Reason: check.Reason},
			{NodeClaim: "kafka-d", Node: "node-kafka-d", EventID: "ev-window", Kind: event.KindScheduledChange, Until: next, Hold: HoldWindow, Reason: window.Reason},
		},
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("got\n%s\nwant\n%s", g, w)
	}
}

func TestWindowOpen(t *testing.T) {
	sat := time.Date(2026, 11, 28, 3, 30, 0, 0, time.UTC) // inside 02:00-06:00
	got := poolStatus(&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: saturdays}}, nil, nil, sat)
	closes := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	next := time.Date(2026, 12, 5, 2, 0, 0, 0, time.UTC)
	if w := got.Window; w == nil || !w.Open || w.OpenUntil == nil || !w.OpenUntil.Equal(closes) || w.Next == nil || !w.Next.Equal(next) {
		t.Errorf("window %+v, want open until %s, next %s", got.Window, closes, next)
	}
	if got.DrainLimit == nil || *got.DrainLimit != 1 || got.Nodes != 0 {
		t.Errorf("limit %v of %d nodes", got.DrainLimit, got.Nodes)
	}
	bad := poolStatus(&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{policy.AnnotationWindowSchedule: "0 2 * *"}}}, nil, nil, sat)
	if bad.Window != nil || len(bad.Problems) == 0 || !strings.Contains(bad.Problems[0], "window") {
		t.Errorf("a broken window: %+v", bad)
	}
}

func TestWriteTable(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	check := decided(t, scheduled("ev-check", week), nil, 0, policy.Check{Name: "ami", Reason: "image ami-1 is pending, not available"})
	rep := Report{Now: now, NodePools: []NodePool{
		poolStatus(&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: saturdays}}, []*karpv1.NodeClaim{
			claim(t, "kafka-a", nil, nil, false),
			claim(t, "kafka-c", nil, nil, false),
		}, map[string]record.Memory{
			"kafka-a": {Drain: &record.Drain{EventID: "ev-spot", At: now.Add(-5 * time.Minute), Via: "forward"}},
			"kafka-c": {Records: []record.Record{check}},
		}, now),
		poolStatus(&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{policy.AnnotationAction: "bogus"}}}, nil, nil, now),
	}}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"Router state at 2026-11-21 12:00 UTC",
		"NodePool kafka (2 NodeClaims)",
		`policy:    defer; window "0 2 * * 6" for 4h0m0s`,
		"window:    closed; opens 2026-11-28 02:00 UTC (in 6d14h) for 4h0m0s",
		"drains:    1 in flight (limit 1, FULL: further drains wait)",
		"deferred:  1 event: 1 HELD BY A CHECK (replacement not sound); next at 2026-11-21 12:05 UTC",
		"kafka-a   node-kafka-a  signalled  2026-11-21 11:55 UTC  ev-spot",
		"kafka-c   node-kafka-c  scheduled-change  2026-11-21 12:05 UTC (in 5m)  check  ev-check  drain held until the replacement is sound",
		"NodePool web (0 NodeClaims)",
		`ignored:   healthrouter.io/action="bogus" ignored`,
		"window:    none",
		"drains:    0 in flight (no limit)",
		"deferred:  none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	buf.Reset()
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rep) {
		t.Errorf("JSON does not round-trip:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), `"hold": "check"`) || !strings.Contains(buf.String(), `"drainLimit": 1`) {
		t.Errorf("JSON:\n%s", buf.String())
	}
}

func TestIn(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "now", 5 * time.Minute: "in 5m", 3 * time.Hour: "in 3h", 50*time.Hour + 30*time.Minute: "in 2d2h30m",
		-90 * time.Second: "2m ago", 24 * time.Hour: "in 1d",
	} {
		if got := in(now.Add(d), now); got != want {
			t.Errorf("in(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestGateHoldWords(t *testing.T) {
	p := NodePool{Deferred: []Deferred{{Hold: HoldPDB}, {Hold: HoldAlerts}, {Hold: HoldPDB}}}
	line := deferredLine(p)
	if !strings.Contains(line, "2 held by a PodDisruptionBudget at zero") || !strings.Contains(line, "1 held by firing alerts") {
		t.Errorf("deferred line %q", line)
	}
}

// TestReadNodeDrains: status lists the router's drains of Nodes Karpenter does not manage
// (their HealthRecords), in progress or held until AWS's release, and not a close kept for late
// reports nor another record.
func TestReadNodeDrains(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	nodeRec := func(node, drain string) *record.HealthRecord {
		return &record.HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: record.NodeRecordName(node)},
			Spec:   record.HealthRecordSpec{NodeName: node, InstanceID: "i-" + node},
			Status: record.HealthRecordStatus{Version: record.Version, Memory: record.Memory{NodeDrain: []byte(drain)}}}
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		nodeRec("b-draining", `{"event_id":"ev-b","kind":"spot-interruption","started":"2026-11-21T11:50:00Z"}`),
		nodeRec("a-held", `{"event_id":"ev-a","kind":"scheduled-change","started":"2026-11-21T10:00:00Z","done":"2026-11-21T10:05:00Z","release":"2026-11-21T15:00:00Z"}`),
		nodeRec("c-closed", `{"event_id":"ev-c","kind":"scheduled-change","started":"2026-11-21T10:00:00Z","closed":true}`),
	).Build()
	rep, err := Read(context.Background(), kube, now, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Nodes) != 2 || rep.Nodes[0].Node != "a-held" || !rep.Nodes[0].Done || rep.Nodes[0].Release == nil ||
		rep.Nodes[1].Node != "b-draining" || rep.Nodes[1].Done || rep.Nodes[1].Instance != "i-b-draining" {
		t.Fatalf("nodes %+v", rep.Nodes)
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Nodes Karpenter does not manage, drained by the router (2)", "drained, cordoned until 2026-11-21 15:00 UTC", "cordoned, draining", "ev-b"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, b.String())
		}
	}
}
