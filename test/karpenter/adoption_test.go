package karpenter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/handback"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/test/harness"
	"github.com/health-router/health-router/test/harness/inproc"
)

// adoptionNamespace is the router's namespace in this test: its shadow ledger lives there.
const adoptionNamespace = "health-router"

// router runs the router with o on the stage's API server until stop is called (or the test
// ends).
func router(t *testing.T, o options.Run) (stop func()) {
	t.Helper()
	return inproc.Router(t, o, stage.Rest)
}

// TestAdoption walks the way in and the way back (docs/runbook.md) beside the real Karpenter:
//
//  1. the router in shadow (--shadow) beside Karpenter's own handling: both get the same AWS
//     Health event, Karpenter drains the node at once, the router records that it would have
//     deferred it to the pool's window; the shadow report pairs the two;
//  2. the takeover, in the runbook's order (step 4): (a) the router active while Karpenter's
//     rules still feed it: an event sent to both queues is acted on by both, Karpenter draining
//     at once; (c) Karpenter's rules gone (the event goes to the intake only): the router
//     defers the next event, marks the node, and Karpenter does nothing; a pool in shadow
//     (healthrouter.io/mode=shadow) then gets Karpenter's behaviour from the router: its event,
//     sent to the intake only, is forwarded and Karpenter drains the node (issue 36, defect 14:
//     recorded only, it was acted on by nobody);
//  3. the way back: the router stopped, handback drains what is pending through Karpenter's
//     queue (Karpenter acts on it) and leaves no state of the router behind.
func TestAdoption(t *testing.T) {
	ctx := context.Background()
	pool := "adopt"
	window := map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h"}
	shadowPool := "adopt-shadow"
	inShadow := map[string]string{policy.AnnotationMode: policy.ModeShadow}
	for k, v := range window {
		inShadow[k] = v
	}
	launched := launch(t, map[string]map[string]string{pool: window, shadowPool: inShadow}, map[string]int{pool: 3, shadowPool: 1})
	nodes := launched[pool]
	if err := stage.Kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: adoptionNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	base := options.Run{
		DeadLetterQueueURL: queue(t, "adopt-dlq"), Signal: signal.ModeForward, KarpenterQueueURL: stage.QueueURL, Workers: 10,
		Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 5 * time.Second,
		Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: stage.Moto, Gates: checks.NewFeatureGates(),
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second, NodeMarks: true,
		LeaderElect: true, LeaderElectionNamespace: adoptionNamespace, LeaderElectionID: "health-router-adopt", ShadowLedger: shadow.DefaultLedgerName,
	}

	// 1. Shadow: Karpenter acts, the router records.
	shadowed := base
	shadowed.QueueURL, shadowed.Shadow = queue(t, "adopt-intake-shadow"), true
	stopShadow := router(t, shadowed)
	first := nodes[0]
	start := time.Now().Add(19 * 24 * time.Hour).Truncate(time.Second)
	body := healthBody("adopt-1", start, first.Instance)
	// EventBridge delivers the event to Karpenter's rule and to the router's. The router's copy
	// is sent first and decided before Karpenter's is sent, so that the router sees the node
	// before Karpenter removes it (a NodeClaim already deleting is decided too; one gone is not
	// the router's any more).
	send(t, shadowed.QueueURL, body)
	eventually(t, "the router records its would-be outcome on the NodeClaim", 30*time.Second, func() bool {
		nc := &karpv1.NodeClaim{}
		if stage.Kube.Get(ctx, client.ObjectKey{Name: first.NodeClaim}, nc) != nil {
			return false
		}
		mem, _ := record.Load(ctx, stage.Kube, nc.Name)
		outs, _ := shadow.Read(mem)
		return len(outs) == 1
	})
	if deleting, _ := claimState(t, first.NodeClaim); deleting {
		t.Fatal("the router in shadow drained the node")
	}
	sent := send(t, stage.QueueURL, body)
	took := expectKarpenterActed(t, first, sent)
	t.Logf("Karpenter drained %s %s after the event, for a retirement %s ahead", first.NodeClaim, took.Round(time.Millisecond), time.Until(start).Round(time.Hour))
	var entries []shadow.Entry
	eventually(t, "the shadow ledger pairs the router's would-be deferral with Karpenter's drain", 30*time.Second, func() bool {
		var err error
		entries, err = shadow.ReadLedger(ctx, stage.Kube, adoptionNamespace, shadow.DefaultLedgerName)
		if err != nil && !errors.Is(err, shadow.ErrNoLedger) {
			t.Fatal(err)
		}
		return len(entries) == 1 && !entries[0].KarpenterAt.IsZero()
	})
	e := entries[0]
	if e.NodePool != pool || e.Would != policy.ActionDefer || e.Hold != policy.HoldWindow || e.WouldAt.Weekday() != time.Saturday || !e.Start.Equal(start) {
		t.Errorf("ledger entry %+v: want a deferral of %s to a Saturday window, AWS's start %s", e, pool, start)
	}
	if e.KarpenterAt.Before(e.Decided.Add(-time.Minute)) || e.KarpenterAt.After(time.Now()) {
		t.Errorf("Karpenter drained at %s, decided at %s", e.KarpenterAt, e.Decided)
	}
	var report strings.Builder
	rep := shadow.BuildReport(entries, "")
	if err := rep.WriteTable(&report); err != nil {
		t.Fatal(err)
	}
	t.Logf("health-router status --shadow:\n%s", report.String())
	if len(rep.Pools) != 1 || !strings.Contains(rep.Pools[0].Summary[0], "Karpenter drained 1 node of adopt") ||
		!strings.Contains(rep.Pools[0].Summary[0], "the router would have deferred it to") {
		t.Errorf("report summary %q", rep.Pools[0].Summary)
	}
	stopShadow()

	// 2. The takeover. (a) The router leaves shadow while Karpenter's rules still feed it: each
	// event reaches both, and both act (a drain twice is one drain).
	active := base
	active.QueueURL = queue(t, "adopt-intake")
	stopActive := router(t, active)
	both := nodes[2]
	bothBody := healthBody("adopt-both", start, both.Instance)
	send(t, active.QueueURL, bothBody)
	sent = send(t, stage.QueueURL, bothBody)
	expectKarpenterActed(t, both, sent)

	// (c) Karpenter's rules gone: the router acts; Karpenter hears only from it.
	second := nodes[1]
	send(t, active.QueueURL, healthBody("adopt-2", start, second.Instance))
	eventually(t, "the router defers the second event to the window and marks the node", 30*time.Second, func() bool {
		nc := &karpv1.NodeClaim{}
		n := &corev1.Node{}
		if stage.Kube.Get(ctx, client.ObjectKey{Name: second.NodeClaim}, nc) != nil || stage.Kube.Get(ctx, client.ObjectKey{Name: second.Node}, n) != nil {
			return false
		}
		mem, _ := record.Load(ctx, stage.Kube, nc.Name)
		return len(mem.Set().Active()) == 1 && !upcoming.Current(n).None()
	})
	time.Sleep(3 * time.Second)
	if deleting, _ := claimState(t, second.NodeClaim); deleting {
		t.Fatal("Karpenter drained a node the router deferred")
	}
	// A pool in shadow after the takeover: nobody but the router hears of its events, and it
	// stands in for Karpenter (the would-be deferral recorded, the drain forwarded).
	shadowNode := launched[shadowPool][0]
	sent = send(t, active.QueueURL, healthBody("adopt-shadow", start, shadowNode.Instance))
	expectKarpenterActed(t, shadowNode, sent)
	// The router still runs: handback refuses (it would write its state again behind it).
	if _, err := app.Handback(ctx, options.Handback{Pending: handback.PendingDrain, Namespace: adoptionNamespace, LeaderElectionID: base.LeaderElectionID,
		ConfirmTimeout: time.Second}, stage.Rest); !errors.Is(err, handback.ErrRouterRunning) {
		t.Fatalf("handback beside a running router: %v, want it refused", err)
	}
	stopActive() // the Lease is released: handback may run

	// 3. The way back: pending events drained through Karpenter, no state left.
	rep2, err := app.Handback(ctx, options.Handback{Pending: handback.PendingDrain, Namespace: adoptionNamespace, LeaderElectionID: base.LeaderElectionID,
		ShadowLedger: shadow.DefaultLedgerName, KarpenterQueueURL: stage.QueueURL, ConfirmTimeout: actTimeout, Region: harness.Region, AWSEndpointURL: stage.Moto}, stage.Rest)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := rep2.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("health-router handback --pending drain:\n%s", out.String())
	if rep2.Problems() != 0 {
		t.Errorf("handback left %d item(s)", rep2.Problems())
	}
	drained := false
	for _, it := range rep2.Items {
		drained = drained || (it.Object == "nodeclaim/"+second.NodeClaim && it.What == handback.WhatDeferred && it.Done == "drained (forwarded to Karpenter)")
	}
	if !drained {
		t.Errorf("the pending deferral was not drained through Karpenter: %+v", rep2.Items)
	}
	expectKarpenterActed(t, second, time.Now())
	cm := &corev1.ConfigMap{}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Namespace: adoptionNamespace, Name: shadow.DefaultLedgerName}, cm); !apierrors.IsNotFound(err) {
		t.Errorf("a ConfigMap of the shadow ledger is there: %v", err)
	}
	if err := stage.Kube.Get(ctx, client.ObjectKey{Name: record.LedgerRecordName(shadow.DefaultLedgerName)}, &record.HealthRecord{}); !apierrors.IsNotFound(err) {
		t.Errorf("the shadow ledger is still there: %v", err)
	}
	// Nothing of the router's is left on the Nodes that remain (Karpenter's replacements and
	// any other pool's).
	var ns corev1.NodeList
	if err := stage.Kube.List(ctx, &ns); err != nil {
		t.Fatal(err)
	}
	for _, n := range ns.Items {
		if !upcoming.Current(&n).None() {
			t.Errorf("node %s keeps the router's marks", n.Name)
		}
	}
}
