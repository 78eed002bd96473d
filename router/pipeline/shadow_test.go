package pipeline

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/test/harness"
)

// routerWrites lists what the router wrote on the cluster's NodeClaims and Nodes that is not a
// would-be outcome: records, drain stamps, deletions, cordons, marks.
func routerWrites(t *testing.T, r *rig) []string {
	t.Helper()
	var out []string
	for _, nc := range r.claims(t) {
		for k := range nc.Annotations {
			if strings.HasPrefix(k, policy.Prefix) && k != shadow.Annotation {
				out = append(out, nc.Name+": "+k)
			}
		}
		if !nc.DeletionTimestamp.IsZero() {
			out = append(out, nc.Name+": deleted")
		}
		// The router's memory holds nothing but would-be outcomes (and what a close ends).
		mem := recordtest.Memory(t, r.kube, &nc)
		if len(mem.Set().Active()) > 0 || mem.Drain != nil || len(mem.Run) > 0 {
			out = append(out, nc.Name+": memory acts")
		}
	}
	var nodes corev1.NodeList
	if err := r.kube.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			out = append(out, n.Name+": cordoned")
		}
		if !upcoming.Current(&n).None() {
			out = append(out, n.Name+": marked")
		}
		if len(recordtest.NodeMemory(t, r.kube, n.Name).NodeDrain) > 0 {
			out = append(out, n.Name+": node drain")
		}
	}
	return out
}

func shadowOf(t *testing.T, r *rig, name string) []shadow.Outcome {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		t.Fatal(err)
	}
	outs, err := shadow.Read(recordtest.Memory(t, r.kube, nc))
	if err != nil {
		t.Fatal(err)
	}
	return outs
}

// TestShadowCarriesNothingOut: under --shadow (before the takeover: Karpenter's own rules
// still feed it) every pool decides as usual (drain, defer by its window) and records each
// would-be outcome; nothing is drained, deferred, marked or notified, and a redelivery records
// nothing twice.
func TestShadowCarriesNothingOut(t *testing.T) {
	deferring := map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h"}
	tests := []struct {
		name   string
		pools  map[string]map[string]string
		claims map[string]int
		want   policy.Action
		wantAt time.Time
	}{
		{name: "a retirement in a pool with no annotation would drain", pools: map[string]map[string]string{"web": nil}, claims: map[string]int{"web": 1},
			want: policy.ActionDrain, wantAt: now},
		{name: "a retirement in a deferring pool would defer to the window", pools: map[string]map[string]string{"kafka": deferring}, claims: map[string]int{"kafka": 1},
			want: policy.ActionDefer, wantAt: time.Date(2026, 11, 21, 2, 0, 0, 0, time.UTC).AddDate(0, 0, 7)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.pools, tt.claims)
			r.p.WithShadow(true, nil)
			ev := retirement("ret-1", now.Add(10*24*time.Hour), instanceID(0))
			res, err := r.p.Process(context.Background(), ev)
			if err != nil {
				t.Fatal(err)
			}
			if res.Actions[tt.want] != 1 {
				t.Fatalf("actions %+v, want one %s", res.Actions, tt.want)
			}
			if w := routerWrites(t, r); len(w) != 0 {
				t.Errorf("the router carried something out in shadow: %v", w)
			}
			outs := shadowOf(t, r, r.claims(t)[0].Name)
			if len(outs) != 1 || outs[0].Action != tt.want || !outs[0].At.Equal(tt.wantAt) || outs[0].State != shadow.State {
				t.Fatalf("would-be outcomes %+v, want one %s at %s", outs, tt.want, tt.wantAt)
			}
			pool := r.claims(t)[0].Labels[karpv1.NodePoolLabelKey]
			if got := testutil.ToFloat64(r.m.ShadowDecisions.WithLabelValues("scheduled-change", string(tt.want), pool)); got != 1 {
				t.Errorf("shadow decisions metric = %v", got)
			}
			if got := testutil.ToFloat64(r.m.Decisions.WithLabelValues("scheduled-change", string(tt.want), pool)); got != 0 {
				t.Errorf("a shadow decision counted among the decisions carried out: %v", got)
			}
			// A redelivery: recorded already, nothing written again.
			res, err = r.p.Process(context.Background(), ev)
			if err != nil || res.AlreadyRecorded != 1 {
				t.Fatalf("redelivery: %+v, %v", res, err)
			}
			if outs := shadowOf(t, r, r.claims(t)[0].Name); len(outs) != 1 {
				t.Errorf("redelivery recorded again: %+v", outs)
			}
		})
	}
}

// TestShadowPoolStandsInForKarpenter (issue 36, defect 14): a pool put in shadow
// (healthrouter.io/mode=shadow) on an active router, after the takeover: Karpenter's rules no
// longer feed Karpenter, so an event only recorded as would-be is acted on by nobody. The
// router records the pool's would-be outcome and carries out Karpenter's behaviour (a pool with
// no annotation) for it: the node is drained for a retirement at once, whatever the pool's
// window would have done; a rebalance recommendation is only told, as Karpenter does.
func TestShadowPoolStandsInForKarpenter(t *testing.T) {
	deferring := map[string]string{policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer",
		policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h", policy.AnnotationMaxConcurrentDrains: "1"}
	tests := []struct {
		name      string
		ev        event.Event
		would     policy.Action
		carried   policy.Action
		wantDrain bool
		ec2Calls  int // DescribeInstanceStatus calls for the pass: the would-be outcome and the stand-in share one check
	}{
		{name: "a retirement: would defer to the window, drained as Karpenter would", ev: retirement("ret-1", now.Add(10*24*time.Hour), instanceID(0)),
			would: policy.ActionDefer, carried: policy.ActionDrain, wantDrain: true},
		{name: "a Spot warning: drained at once", ev: spot("spot-1", instanceID(0)), would: policy.ActionDrain, carried: policy.ActionDrain, wantDrain: true},
		{name: "a stop: Karpenter's drain", ev: stateChange("stop-1", instanceID(0), event.StateStopped, now), would: policy.ActionDefer, carried: policy.ActionDrain, wantDrain: true,
			ec2Calls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, map[string]map[string]string{"kafka": deferring}, map[string]int{"kafka": 1})
			srv, client := harness.NewEC2InstanceStatus(t)
			srv.Add(instanceID(0), &harness.Instance{State: "stopped"})
			r.p.WithStateConfirmation(client)
			res, err := r.p.Process(context.Background(), tt.ev)
			if err != nil {
				t.Fatal(err)
			}
			if calls, _, _, _ := srv.Stats(); calls != tt.ec2Calls {
				t.Errorf("%d DescribeInstanceStatus calls, want %d", calls, tt.ec2Calls)
			}
			// The drain's Event says why Karpenter's behaviour applies: the pool is in shadow
			// (it has annotations; "no annotation" would mislead whoever reads it).
			var said []string
			for len(r.recorder.Events) > 0 {
				said = append(said, <-r.recorder.Events)
			}
			if !slices.ContainsFunc(said, func(e string) bool {
				return strings.Contains(e, "pool in shadow: Karpenter's behaviour, carried out by the router")
			}) {
				t.Errorf("no Event says the drain is Karpenter's behaviour for a pool in shadow: %q", said)
			}
			if res.Actions[tt.carried] != 1 {
				t.Fatalf("carried out %+v, want one %s", res.Actions, tt.carried)
			}
			nc := r.claims(t)[0]
			if deleted := !nc.DeletionTimestamp.IsZero(); deleted != tt.wantDrain {
				t.Errorf("NodeClaim deleted %v, want %v", deleted, tt.wantDrain)
			}
			outs := shadowOf(t, r, nc.Name)
			if len(outs) != 1 || outs[0].Action != tt.would {
				t.Errorf("would-be outcomes %+v, want one %s", outs, tt.would)
			}
			if got := testutil.ToFloat64(r.m.ShadowDecisions.WithLabelValues(string(tt.ev.Kind), string(tt.would), "kafka")); got != 1 {
				t.Errorf("shadow decisions metric = %v", got)
			}
			// A redelivery: nothing recorded or carried out twice.
			res, err = r.p.Process(context.Background(), tt.ev)
			// An urgent drain goes through again; the signaller finds it draining already.
			if err != nil || (!tt.ev.Urgent() && len(res.Actions) != 0) {
				t.Fatalf("redelivery: %+v, %v", res, err)
			}
			if outs := shadowOf(t, r, nc.Name); len(outs) != 1 {
				t.Errorf("redelivery recorded again: %+v", outs)
			}
		})
	}
}

// TestShadowDecidesWhileKarpenterDrains: in shadow Karpenter acts on the same event, often
// first; a NodeClaim it is deleting is still decided (and recorded), where an active pool
// skips it. A pool in shadow on an active router records it too, and skips carrying it out.
func TestShadowDecidesWhileKarpenterDrains(t *testing.T) {
	for _, all := range []bool{true, false} {
		r := newRig(t, map[string]map[string]string{"web": {policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer"}}, map[string]int{"web": 1})
		r.p.WithShadow(all, nil)
		nc := r.claims(t)[0]
		if err := r.kube.Delete(context.Background(), &nc); err != nil { // Karpenter's own handling, first
			t.Fatal(err)
		}
		res, err := r.p.Process(context.Background(), retirement("ret-1", now.Add(19*24*time.Hour), instanceID(0)))
		if err != nil || (all && res.Actions[policy.ActionDefer] != 1) || (!all && (len(res.Actions) != 0 || res.AlreadyRecorded != 1)) {
			t.Fatalf("--shadow=%v: %+v, %v", all, res, err)
		}
		if outs := shadowOf(t, r, nc.Name); len(outs) != 1 || outs[0].Action != policy.ActionDefer {
			t.Fatalf("--shadow=%v: would-be outcomes %+v", all, outs)
		}
	}
}

// TestShadowUnmanagedNode: under --shadow a node Karpenter does not manage, whose drain
// --unmanaged-nodes=cordon-drain would begin, is not cordoned.
func TestShadowUnmanagedNode(t *testing.T) {
	rr := newRig(t, map[string]map[string]string{"web": nil}, map[string]int{"web": 1}, 0)
	clk := clocktesting.NewFakeClock(now)
	drainer := &countingDrainer{}
	rr.p = New(engine.New(cluster.New(rr.kube), nil, engine.WithUnmanaged(policy.UnmanagedCordonDrain)), signal.New(rr.kube, rr.kube, signal.ModeDeleteNodeClaim, nil, "", rr.recorder, clk),
		rr.m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)), 4).WithNodeDrainer(drainer).WithShadow(true, nil)
	res, err := rr.p.Process(context.Background(), spot("spot-1", instanceID(0)))
	if err != nil || res.Actions[policy.ActionDrain] != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
	if drainer.begun != 0 {
		t.Errorf("an unmanaged node's drain begun in shadow")
	}
	if w := routerWrites(t, rr); len(w) != 0 {
		t.Errorf("carried out in shadow: %v", w)
	}
}

type countingDrainer struct{ begun int }

func (d *countingDrainer) Begin(context.Context, *corev1.Node, nodedrain.Drain) (bool, error) {
	d.begun++
	return false, nil
}
func (d *countingDrainer) Cancel(context.Context, string, nodedrain.Drain) (bool, error) {
	return false, nil
}

// TestShadowDeferralComingDue: a deferral recorded while the pool was active, coming due
// after it went into shadow. Under --shadow (Karpenter's rules feed it again) it is dropped
// (its outcome recorded as would-be), not drained. A pool in shadow on an active router is the
// router's to act for, as Karpenter would: the node is drained (defect 14: dropped, the
// maintenance was left to nobody).
func TestShadowDeferralComingDue(t *testing.T) {
	for _, all := range []bool{true, false} {
		r := newRig(t, map[string]map[string]string{"web": {policy.AnnotationAction: "defer"}}, map[string]int{"web": 1})
		ev := retirement("ret-1", now.Add(3*24*time.Hour), instanceID(0))
		if _, err := r.p.Process(context.Background(), ev); err != nil {
			t.Fatal(err)
		}
		nc := r.claims(t)[0]
		recs := recordtest.Records(t, r.kube, &nc)
		if len(recs) != 1 || !recs[0].Active() {
			t.Fatalf("records %+v", recs)
		}
		np := &karpv1.NodePool{}
		if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "web"}, np); err != nil {
			t.Fatal(err)
		}
		np.Annotations = map[string]string{policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer"}
		if err := r.kube.Update(context.Background(), np); err != nil {
			t.Fatal(err)
		}
		r.p.WithShadow(all, nil)
		d, err := r.p.Redecide(context.Background(), &nc, recs[0])
		if err != nil {
			t.Fatal(err)
		}
		// Under --shadow the decision is the would-be one (the pool's policy: defer); on an
		// active router the one carried out (Karpenter's behaviour: drain).
		if want := map[bool]policy.Action{true: policy.ActionDefer, false: policy.ActionDrain}[all]; d.Action != want {
			t.Fatalf("--shadow=%v: action %s, want %s", all, d.Action, want)
		}
		after := r.claims(t)[0]
		if drained := !after.DeletionTimestamp.IsZero(); drained == all {
			t.Fatalf("--shadow=%v: drained %v", all, drained)
		}
		if active := recordtest.Set(t, r.kube, &after).Active(); len(active) != 0 {
			t.Errorf("--shadow=%v: the deferral stays active: %+v", all, active)
		}
		if outs := shadowOf(t, r, after.Name); all && len(outs) != 1 {
			t.Errorf("would-be outcomes %+v", outs)
		}
	}
}

// TestShadowLedger: the ledger gets one entry per would-be outcome, with the event's start.
func TestShadowLedger(t *testing.T) {
	r := newRig(t, map[string]map[string]string{"web": {policy.AnnotationMode: policy.ModeShadow}}, map[string]int{"web": 2})
	ledger := shadow.NewLedger(record.NewStore(r.kube, r.kube), r.kube, "health-router", shadow.DefaultLedgerName, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)))
	r.p.WithShadow(false, ledger)
	start := now.Add(19 * 24 * time.Hour)
	if _, err := r.p.Process(context.Background(), retirement("ret-1", start, instanceID(0), instanceID(1))); err != nil {
		t.Fatal(err)
	}
	if err := ledger.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	entries, err := shadow.ReadLedger(context.Background(), r.kube, "health-router", shadow.DefaultLedgerName)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Would != policy.ActionDrain || !entries[0].Start.Equal(start) || entries[0].NodePool != "web" {
		t.Fatalf("ledger %+v", entries)
	}
}

// setPoolAnnotations replaces a pool's annotations.
func setPoolAnnotations(t *testing.T, r *rig, pool string, ann map[string]string) {
	t.Helper()
	np := &karpv1.NodePool{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: pool}, np); err != nil {
		t.Fatal(err)
	}
	np.Annotations = ann
	if err := r.kube.Update(context.Background(), np); err != nil {
		t.Fatal(err)
	}
}

// TestCloseInShadowEndsTheDeferral: a deferral of a pool that goes to shadow, then AWS closes
// its maintenance, then the pool goes back to active: the close ended the deferral, which
// never comes due (issue 36, defect 1; on dd387c1 shadow cancelled only the held runs and
// drains, and the node was drained for a cancelled maintenance). Ending what the router holds
// is always carried out, in shadow too: only new work is withheld.
func TestCloseInShadowEndsTheDeferral(t *testing.T) {
	deferring := map[string]string{policy.AnnotationAction: "defer"}
	r := newRig(t, map[string]map[string]string{"web": deferring}, map[string]int{"web": 1})
	start := now.Add(3 * 24 * time.Hour)
	if _, err := r.p.Process(context.Background(), retirement("ret-1", start, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	setPoolAnnotations(t, r, "web", map[string]string{policy.AnnotationAction: "defer", policy.AnnotationMode: policy.ModeShadow})
	closed := retirement("ret-1-closed", start, instanceID(0))
	closed.Health.Status = event.HealthClosed
	if _, err := r.p.Process(context.Background(), closed); err != nil {
		t.Fatal(err)
	}
	setPoolAnnotations(t, r, "web", deferring)
	nc := r.claims(t)[0]
	for _, rec := range recordtest.Records(t, r.kube, &nc) {
		if rec.Active() {
			t.Errorf("the deferral of the closed maintenance is still active: %s %s until %s", rec.EventID, rec.State, rec.Until)
		}
	}
	// And the pool back to active decides the close's maintenance no more.
	if _, err := r.p.Process(context.Background(), retirement("ret-1", start, instanceID(0))); err != nil {
		t.Fatal(err)
	}
	nc = r.claims(t)[0]
	if !nc.DeletionTimestamp.IsZero() {
		t.Error("drained for a closed maintenance")
	}
}
