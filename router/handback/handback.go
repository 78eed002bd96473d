// Package handback gives the handling of AWS events back to Karpenter: the way back from a
// takeover (docs/takeover.md). Once the router is stopped, it finds every piece of state the
// router keeps in the cluster and ends it, with a report of each:
//
//   - events still pending (a deferral to the pool's window or to deadline minus drain-lead, a
//     drain held by pacing, a check or a gate; a reboot in place in progress) are drained now
//     (forwarded to Karpenter's queue, or the NodeClaim deleted, as the router would) or
//     dropped (Karpenter's poller finds the scheduled ones again once it may call
//     DescribeInstanceStatus);
//   - the records on NodeClaims (healthrouter.io/deferred, healthrouter.io/in-place) go, and
//     karpenter.sh/do-not-disrupt where a reboot in place added it; so do the would-be
//     outcomes of pools in shadow (healthrouter.io/shadow) and their ledger (a ConfigMap);
//   - the node marks go (the healthrouter.io/maintenance-at label, the healthrouter.io/maintenance
//     annotation, the healthrouter.io/maintenance-upcoming taint), and the Node's part of a
//     reboot in place;
//   - a drain of a node Karpenter does not manage loses its record (the Node's HealthRecord);
//     the Node is uncordoned where the router cordoned it and nothing is left to wait for
//     (dropped, or its maintenance is over), and otherwise stays cordoned with a note. The key
//     routers before the store kept it in (healthrouter.io/node-drain) goes, and is not read.
//
// It refuses to run while the router's leader Lease is held: a running router would write its
// state again behind it.
package handback

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
)

// Pending is what becomes of the events still pending.
type Pending string

const (
	// PendingDrain drains every node with a pending event now, as the router would have at
	// the event's time: Karpenter replaces them.
	PendingDrain Pending = "drain"
	// PendingDrop ends the pending events without acting on them: each is listed, and
	// Karpenter's own handling takes what AWS reports again (its poller finds the scheduled
	// events; a queue message already consumed is not sent again).
	PendingDrop Pending = "drop"
)

// DefaultConfirmTimeout is how long a drain forwarded to Karpenter has to start (the NodeClaim
// deleting) before the NodeClaim is deleted instead: the router's own confirm-or-fallback bound.
const DefaultConfirmTimeout = 20 * time.Second

// confirmPoll is how often a forwarded drain is looked for.
const confirmPoll = time.Second

// Options is what a handback does.
type Options struct {
	Pending Pending
	// DryRun lists what would be done and changes nothing.
	DryRun bool
	// LeaseNamespace and LeaseName name the router's leader-election Lease; a Lease held and
	// renewed within its duration means the router still runs.
	LeaseNamespace string
	LeaseName      string
	// ConfirmTimeout bounds the wait for Karpenter to act on a forwarded drain.
	ConfirmTimeout time.Duration
	// LedgerName is the name of the ConfigMap (in LeaseNamespace) where a router before the
	// store kept the shadow ledger; empty: none is looked for. The ledger's HealthRecords are
	// deleted whatever their name.
	LedgerName string
	// KarpenterVersion is the Karpenter the drains are forwarded to (the router's
	// --karpenter-version; zero: unknown, taken as the newest): an event it has no parser for
	// deletes the NodeClaim at once, as the router would, instead of a forward it drops.
	KarpenterVersion signal.KarpenterVersion
}

// Forwarder sends an event body to Karpenter's interruption queue.
type Forwarder interface {
	Forward(ctx context.Context, body []byte) error
}

// What a reported Item is.
const (
	WhatDeferred  = "deferred"      // an active record: an event waiting for its time or a hold
	WhatInPlace   = "in-place"      // a reboot in place in progress
	WhatRecords   = "records"       // ended records and finished runs, kept to recognise duplicates
	WhatMarks     = "node-marks"    // the node marks of router/upcoming
	WhatNodeDrain = "node-drain"    // a drain of a node Karpenter does not manage
	WhatNodeRun   = "in-place-node" // the Node's part of a reboot in place whose NodeClaim is gone
	WhatShadow    = "shadow"        // would-be outcomes of a pool in shadow (router/shadow)
	WhatLedger    = "shadow-ledger" // the would-be outcomes beside Karpenter's drains (its HealthRecord, or an old router's ConfigMap)
	// WhatDrainSignalled: a drain the router signalled (its stamp on the NodeClaim) that
	// Karpenter has not started; the router's fallback would delete the NodeClaim.
	WhatDrainSignalled = "drain-signalled"
)

// Item is one piece of the router's state and what the handback did with it.
type Item struct {
	Object   string    `json:"object"` // nodeclaim/NAME or node/NAME
	NodePool string    `json:"nodepool,omitempty"`
	Instance string    `json:"instance,omitempty"`
	What     string    `json:"what"`
	Kind     string    `json:"kind,omitempty"`
	Event    string    `json:"event,omitempty"`
	Until    time.Time `json:"until,omitzero"`
	Done     string    `json:"done"`
	// Problem marks an item the handback could not end: it is left as it is.
	Problem bool `json:"problem,omitempty"`
}

// Report is what a handback found and did.
type Report struct {
	Pending Pending `json:"pending"`
	DryRun  bool    `json:"dry_run"`
	// Warning says what makes the list unreliable: a dry run beside a router still running
	// (which may change the state listed meanwhile, and refuses a real handback).
	Warning string `json:"warning,omitempty"`
	Items   []Item `json:"items"`
}

// Problems counts the items left as they were.
func (r Report) Problems() int {
	n := 0
	for _, it := range r.Items {
		if it.Problem {
			n++
		}
	}
	return n
}

// Handback ends the router's state in a cluster.
type Handback struct {
	kube    client.Client
	forward Forwarder
	clock   clock.WithTicker
	opts    Options
}

// New returns a Handback writing through kube (read fresh: no cache), forwarding drains
// through forward (nil: drains delete the NodeClaim).
func New(kube client.Client, forward Forwarder, clk clock.WithTicker, opts Options) *Handback {
	if opts.ConfirmTimeout <= 0 {
		opts.ConfirmTimeout = DefaultConfirmTimeout
	}
	return &Handback{kube: kube, forward: forward, clock: clk, opts: opts}
}

// ErrRouterRunning is returned while the router's leader Lease is held.
var ErrRouterRunning = errors.New("the router is still running")

// Run checks that the router is stopped, then ends its state. Items it could not end are in
// the Report as problems; err is set when the cluster could not be read or the router runs.
func (h *Handback) Run(ctx context.Context) (Report, error) {
	rep := Report{Pending: h.opts.Pending, DryRun: h.opts.DryRun}
	if h.opts.Pending != PendingDrain && h.opts.Pending != PendingDrop {
		return rep, fmt.Errorf("pending %q: want drain or drop", h.opts.Pending)
	}
	if err := h.checkLease(ctx); err != nil {
		if !h.opts.DryRun || !errors.Is(err, ErrRouterRunning) {
			return rep, err
		}
		// A dry run changes nothing: it lists, and says that the router may change what it
		// lists, and that the real handback will refuse until it is stopped.
		rep.Warning = err.Error()
	}
	var claims karpv1.NodeClaimList
	if err := h.kube.List(ctx, &claims); err != nil {
		return rep, fmt.Errorf("listing nodeclaims: %w", err)
	}
	var nodes corev1.NodeList
	if err := h.kube.List(ctx, &nodes); err != nil {
		return rep, fmt.Errorf("listing nodes: %w", err)
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}
	// The router's memory (its HealthRecords), one list: none where it keeps nothing.
	var hrs record.HealthRecordList
	if err := h.kube.List(ctx, &hrs); err != nil && !meta.IsNoMatchError(err) {
		return rep, fmt.Errorf("listing healthrecords: %w", err)
	}
	mems := make(map[string]*record.HealthRecord, len(hrs.Items))
	nodeRecs := map[string]*record.HealthRecord{} // the records of Nodes, by Node name
	var ledgers []*record.HealthRecord
	for i := range hrs.Items {
		if hr := &hrs.Items[i]; hr.OfNode() {
			nodeRecs[hr.Spec.NodeName] = hr
			continue
		} else if hr.OfLedger() {
			ledgers = append(ledgers, hr)
			continue
		}
		mems[hrs.Items[i].Name] = &hrs.Items[i]
	}
	slices.SortFunc(claims.Items, func(a, b karpv1.NodeClaim) int { return cmp.Compare(a.Name, b.Name) })
	runNodes := map[string]bool{} // Nodes whose run part their NodeClaim's pass handled
	for i := range claims.Items {
		nc := &claims.Items[i]
		node := byName[nc.Status.NodeName]
		var mem record.Memory
		if hr := mems[nc.Name]; hr != nil {
			mem = hr.Status.Memory
		}
		if st, ok, err := inplace.Read(mem); err == nil && ok && st.Node != "" {
			runNodes[st.Node] = true
			if node == nil {
				node = byName[st.Node]
			}
		}
		rep.Items = append(rep.Items, h.claim(ctx, nc, mems[nc.Name], node)...)
		delete(mems, nc.Name)
	}
	for _, hr := range mems {
		// A HealthRecord whose NodeClaim is gone: the router's sweep would have removed it.
		if it, ok := h.orphan(ctx, hr); ok {
			rep.Items = append(rep.Items, it)
		}
	}
	slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	for i := range nodes.Items {
		n := &nodes.Items[i]
		hr := nodeRecs[n.Name]
		delete(nodeRecs, n.Name)
		if hr != nil && hr.NodeUID() != "" && hr.NodeUID() != n.UID {
			// The record of an earlier Node of the same name.
			if it, ok := h.orphan(ctx, hr); ok {
				rep.Items = append(rep.Items, it)
			}
			hr = nil
		}
		rep.Items = append(rep.Items, h.node(ctx, n, runNodes, hr)...)
	}
	for _, hr := range nodeRecs {
		// A Node's record whose Node is gone: the garbage collector would have removed it.
		if it, ok := h.orphan(ctx, hr); ok {
			rep.Items = append(rep.Items, it)
		}
	}
	slices.SortFunc(ledgers, func(a, b *record.HealthRecord) int { return cmp.Compare(a.Name, b.Name) })
	for _, hr := range ledgers {
		rep.Items = append(rep.Items, h.ledger(ctx, hr))
	}
	if it, ok := h.oldLedger(ctx); ok {
		rep.Items = append(rep.Items, it)
	}
	return rep, nil
}

// ledger deletes the shadow ledger hr: the router made it, and nothing else removes it (it
// has no owner: the NodeClaims it tells of are gone long before it).
func (h *Handback) ledger(ctx context.Context, hr *record.HealthRecord) Item {
	it := Item{Object: "healthrecord/" + hr.Name, What: WhatLedger, Done: "deleted"}
	if h.opts.DryRun {
		it.Done = "would be deleted"
		return it
	}
	if err := h.kube.Delete(ctx, hr); err != nil && !apierrors.IsNotFound(err) {
		return problem(it, WhatLedger, err)
	}
	return it
}

// oldLedger deletes the ledger's ConfigMap that a router before the store kept, and that no
// router since has adopted (router/shadow's Ledger adopts it once, then deletes it).
func (h *Handback) oldLedger(ctx context.Context) (Item, bool) {
	if h.opts.LedgerName == "" {
		return Item{}, false
	}
	it := Item{Object: "configmap/" + h.opts.LeaseNamespace + "/" + h.opts.LedgerName, What: WhatLedger, Done: "deleted"}
	cm := &corev1.ConfigMap{}
	err := h.kube.Get(ctx, client.ObjectKey{Namespace: h.opts.LeaseNamespace, Name: h.opts.LedgerName}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return Item{}, false
	case err != nil:
		return problem(it, WhatLedger, err), true
	case h.opts.DryRun:
		it.Done = "would be deleted"
	default:
		if err := h.kube.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
			return problem(it, WhatLedger, err), true
		}
	}
	return it, true
}

// checkLease refuses while the router's leader Lease is held and was renewed within its
// duration. A router stopped normally releases it (LeaderElectionReleaseOnCancel); a killed
// one's lapses after the duration.
func (h *Handback) checkLease(ctx context.Context) error {
	if h.opts.LeaseName == "" {
		return nil
	}
	var l coordinationv1.Lease
	err := h.kube.Get(ctx, client.ObjectKey{Namespace: h.opts.LeaseNamespace, Name: h.opts.LeaseName}, &l)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the router's Lease %s/%s: %w", h.opts.LeaseNamespace, h.opts.LeaseName, err)
	}
	holder := ""
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	if holder == "" || l.Spec.RenewTime == nil {
		return nil
	}
	d := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	if expires := l.Spec.RenewTime.Add(d); h.clock.Now().Before(expires) {
		return fmt.Errorf("%w: Lease %s/%s is held by %s until %s; stop it first (helm uninstall, or scale the Deployment to 0 replicas), then run handback again: a running router writes its state again",
			ErrRouterRunning, h.opts.LeaseNamespace, h.opts.LeaseName, holder, expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// orphan removes a HealthRecord whose NodeClaim (or Node) is gone.
func (h *Handback) orphan(ctx context.Context, hr *record.HealthRecord) (Item, bool) {
	what := "nodeclaim"
	if hr.OfNode() {
		what = "node"
	}
	it := Item{Object: "healthrecord/" + hr.Name, NodePool: hr.Spec.NodePool, Instance: hr.Spec.InstanceID, What: WhatRecords, Done: "removed (its " + what + " is gone)"}
	if h.opts.DryRun {
		it.Done = "would be removed (its " + what + " is gone)"
		return it, true
	}
	if err := h.kube.Delete(ctx, hr); err != nil && !apierrors.IsNotFound(err) {
		return problem(it, WhatRecords, err), true
	}
	return it, true
}

// claim ends the router's state on one NodeClaim: its HealthRecord hr (nil: none), the
// annotations it writes, and the Node part of its reboot in place.
func (h *Handback) claim(ctx context.Context, nc *karpv1.NodeClaim, hr *record.HealthRecord, node *corev1.Node) []Item {
	base := Item{Object: "nodeclaim/" + nc.Name, NodePool: nc.Labels[karpv1.NodePoolLabelKey], Instance: instanceOf(nc)}
	var mem record.Memory
	var setErr error
	if hr != nil {
		mem, setErr = hr.Memory()
	}
	hasRecords := hr != nil
	hasRun := len(mem.Run) > 0
	_, oldShadow := nc.Annotations[shadow.Annotation]
	hasShadow := len(mem.Shadow) > 0 || oldShadow
	hasStamp := mem.Drain != nil
	if !hasRecords && !hasRun && !hasShadow && !hasStamp {
		return nil
	}
	var items []Item
	if hasStamp && nc.DeletionTimestamp == nil {
		// A drain the router signalled and Karpenter has not started: owed, not lost. Drained,
		// the NodeClaim is deleted (the router's own fallback); dropped, the drain is forgotten.
		it := h.drainStamp(ctx, base, nc, hr, *mem.Drain)
		items = append(items, it)
		if it.Problem || h.opts.Pending == PendingDrain || (!hasRecords && !hasRun && !hasShadow) {
			return items
		}
	}
	if hasShadow {
		it := base
		it.What, it.Done = WhatShadow, "removed"
		if h.opts.DryRun {
			it.Done = "would be removed"
		} else if err := h.patchClaim(ctx, nc, func(c *karpv1.NodeClaim) { delete(c.Annotations, shadow.Annotation) }); err != nil && !apierrors.IsNotFound(err) {
			it = problem(base, WhatShadow, err)
		}
		items = append(items, it)
		if !hasRecords && !hasRun {
			return items
		}
	}
	set := mem.Set()
	st, runOK, runErr := inplace.Read(mem)
	if setErr != nil {
		it := base
		it.What, it.Done, it.Problem = WhatRecords, "left as they are: "+setErr.Error()+" (a newer router's? delete healthrecord "+nc.Name+" by hand once read)", true
		items = append(items, it)
	}
	if runErr != nil {
		it := base
		it.What, it.Done, it.Problem = WhatInPlace, "left as it is: "+runErr.Error(), true
		items = append(items, it)
	}
	if nc.DeletionTimestamp != nil {
		// Karpenter is draining it: nothing the handback does changes that.
		it := base
		it.What, it.Done = WhatRecords, "nodeclaim deleting: left to Karpenter"
		return append(items, it)
	}
	active := set.Active()
	running := runOK && !st.Over()
	var pending []Item
	for _, r := range active {
		it := base
		it.What, it.Kind, it.Event, it.Until = WhatDeferred, string(r.Kind), r.EventID, r.Until
		if r.Hold != "" {
			it.Kind += " (" + string(r.Hold) + ")"
		}
		pending = append(pending, it)
	}
	if running {
		it := base
		it.What, it.Kind, it.Event, it.Until = WhatInPlace, string(st.Type)+" (step "+string(st.Step)+")", st.EventID, st.Start
		pending = append(pending, it)
	}

	// What becomes of the pending events.
	outcome := ""
	drained := false
	switch {
	case len(pending) == 0:
	case h.opts.Pending == PendingDrop:
		outcome = "dropped"
		if running {
			outcome = "dropped; node back in service"
		}
	case h.opts.DryRun:
		outcome = "would drain"
	default:
		how, err := h.drain(ctx, nc, active)
		if err != nil {
			for i := range pending {
				pending[i].Done, pending[i].Problem = "drain failed, left as it is: "+err.Error(), true
			}
			return append(items, pending...)
		}
		outcome, drained = how, true
	}
	if h.opts.DryRun && outcome != "" && !strings.HasPrefix(outcome, "would") {
		outcome = "would be " + outcome
	}
	for i := range pending {
		pending[i].Done = outcome
	}
	items = append(items, pending...)

	// The router's annotations go; ended records and finished runs are reported in one line.
	if len(pending) == 0 && setErr == nil && runErr == nil {
		it := base
		it.What, it.Done = WhatRecords, "removed"
		if h.opts.DryRun {
			it.Done = "would be removed"
		}
		items = append(items, it)
	}
	if h.opts.DryRun {
		return items
	}
	if node != nil && runOK {
		// The run's cordon stays on a node being drained (Karpenter cordons it anyway), and
		// goes with a dropped run: the node goes back into service.
		if err := h.patchNode(ctx, node, func(n *corev1.Node) { inplace.UndoNode(n, st, !drained) }); err != nil {
			items = append(items, problem(base, WhatInPlace, err))
		}
	}
	if hr != nil && setErr == nil {
		if err := h.kube.Delete(ctx, hr); err != nil && !apierrors.IsNotFound(err) {
			items = append(items, problem(base, WhatRecords, err))
		}
	}
	if hasRun && runErr == nil {
		if err := h.patchClaim(ctx, nc, func(c *karpv1.NodeClaim) { inplace.UndoClaim(c, st) }); err != nil && !apierrors.IsNotFound(err) {
			items = append(items, problem(base, WhatRecords, err))
		}
	}
	return items
}

// drainStamp ends a drain the router signalled that Karpenter has not started.
func (h *Handback) drainStamp(ctx context.Context, base Item, nc *karpv1.NodeClaim, hr *record.HealthRecord, d record.Drain) Item {
	it := base
	it.What = WhatDrainSignalled
	it.Kind, it.Event, it.Until = "drain ("+d.Via+")", d.EventID, d.At
	switch {
	case h.opts.Pending == PendingDrop && h.opts.DryRun:
		it.Done = "would be dropped"
	case h.opts.Pending == PendingDrop:
		it.Done = "dropped"
		if err := h.kube.Delete(ctx, hr); err != nil && !apierrors.IsNotFound(err) {
			return problem(base, WhatDrainSignalled, err)
		}
	case h.opts.DryRun:
		it.Done = "would drain"
	default:
		if err := h.delete(ctx, nc); err != nil {
			return problem(base, WhatDrainSignalled, err)
		}
		it.Done = "drained (nodeclaim deleted: Karpenter had not started the drain the router signalled)"
	}
	return it
}

// drain drains a NodeClaim with pending events as the router would, through the signaller's
// rules: the earliest record's event, bound to this NodeClaim's own instance and checked
// against it (signal.RecordEvent, signal.Implausible), forwarded to Karpenter built for that
// instance (signal.Canonical) when the router would forward it (signal.Forwarded; Karpenter
// must start within ConfirmTimeout, else the NodeClaim is deleted); otherwise (no Forwarder,
// no recorded event as for a reboot in place, an implausible event, a kind the Karpenter has
// no parser for) the NodeClaim deleted. A record whose event does not parse, or is not about
// this instance, is no order: nothing is done for it (dropped, with the reason).
func (h *Handback) drain(ctx context.Context, nc *karpv1.NodeClaim, active []record.Record) (string, error) {
	var body []byte
	if len(active) > 0 {
		first := slices.MinFunc(active, func(a, b record.Record) int { return a.Until.Compare(b.Until) })
		ev, id, err := signal.RecordEvent(first.Event, nc)
		if err != nil {
			return "dropped, not acted on: its recorded event does not parse (" + err.Error() + ")", nil
		}
		ev.Implausible = signal.Implausible(ev, nc)
		switch {
		case h.forward == nil:
		case ev.Implausible != "":
			if err := h.delete(ctx, nc); err != nil {
				return "", err
			}
			return "drained (nodeclaim deleted, not forwarded: " + ev.Implausible + ")", nil
		case !signal.Forwarded(ev, h.opts.KarpenterVersion):
			if err := h.delete(ctx, nc); err != nil {
				return "", err
			}
			return "drained (nodeclaim deleted: " + h.unparsed(ev) + ")", nil
		default:
			if body, err = signal.Canonical(ev, id); err != nil {
				return "dropped, not acted on: its recorded event is not this instance's (" + err.Error() + ")", nil
			}
		}
	}
	if len(body) > 0 {
		if err := h.forward.Forward(ctx, body); err != nil {
			return "", fmt.Errorf("forwarding to Karpenter: %w", err)
		}
		ok, err := h.confirm(ctx, nc.Name)
		if err != nil {
			return "", err
		}
		if ok {
			return "drained (forwarded to Karpenter)", nil
		}
		if err := h.delete(ctx, nc); err != nil {
			return "", err
		}
		return fmt.Sprintf("drained (forwarded; Karpenter did not act within %s: nodeclaim deleted)", h.opts.ConfirmTimeout), nil
	}
	if err := h.delete(ctx, nc); err != nil {
		return "", err
	}
	return "drained (nodeclaim deleted)", nil
}

// unparsed says why Karpenter would drop a forward of ev: no version parses its kind (a
// Capacity Block's expiration, a rebalance recommendation it only records), or the version
// the handback was given is older than the first that does (a capacity-reservation
// interruption before v1.10), as the router's signaller decides.
func (h *Handback) unparsed(ev event.Event) string {
	if since, ok := signal.KarpenterParsesSince(ev); ok {
		return fmt.Sprintf("Karpenter %s has no parser for a %s message (since %s)", h.opts.KarpenterVersion, ev.Kind, since)
	}
	return fmt.Sprintf("no Karpenter acts on a %s message", ev.Kind)
}

// confirm waits up to ConfirmTimeout for the NodeClaim to be deleting or gone.
func (h *Handback) confirm(ctx context.Context, name string) (bool, error) {
	deadline := h.clock.Now().Add(h.opts.ConfirmTimeout)
	t := h.clock.NewTicker(confirmPoll)
	defer t.Stop()
	for {
		var nc karpv1.NodeClaim
		err := h.kube.Get(ctx, client.ObjectKey{Name: name}, &nc)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, fmt.Errorf("reading nodeclaim %s: %w", name, err)
		case nc.DeletionTimestamp != nil:
			return true, nil
		case !h.clock.Now().Before(deadline):
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C():
		}
	}
}

func (h *Handback) delete(ctx context.Context, nc *karpv1.NodeClaim) error {
	if err := h.kube.Delete(ctx, nc.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting nodeclaim %s: %w", nc.Name, err)
	}
	return nil
}

// node ends the router's state on one Node: its marks, a drain of an unmanaged node (its
// record hr, nil: none), and the Node's part of a reboot in place whose NodeClaim is gone.
func (h *Handback) node(ctx context.Context, n *corev1.Node, runNodes map[string]bool, hr *record.HealthRecord) []Item {
	base := Item{Object: "node/" + n.Name, NodePool: n.Labels[karpv1.NodePoolLabelKey], Instance: instanceOfNode(n)}
	var items []Item
	var mutations []func(*corev1.Node)
	if m := upcoming.Current(n); !m.None() {
		it := base
		it.What, it.Done = WhatMarks, "removed"
		var p upcoming.Pending
		if json.Unmarshal([]byte(m.Annotation), &p) == nil {
			it.Kind, it.Event, it.Until = p.Kind, p.Event, p.Until
		}
		items = append(items, it)
		mutations = append(mutations, func(n *corev1.Node) { upcoming.Apply(n, upcoming.Marks{}) })
	}
	if hr != nil {
		if _, err := hr.Memory(); err != nil {
			// A newer router's: left as it is, as a NodeClaim's is.
			items = append(items, problem(base, WhatNodeDrain, err))
			hr = nil
		}
	}
	if hr != nil {
		it, uncordon := h.nodeDrain(base, n, hr)
		items = append(items, it)
		if uncordon {
			mutations = append(mutations, func(n *corev1.Node) { n.Spec.Unschedulable = false })
		}
	}
	if _, ok := n.Annotations[nodedrain.AnnotationNodeDrain]; ok {
		// Not read: anyone with `patch nodes` writes it. Its cordon, if any, is left as it is.
		it := base
		it.What, it.Done = WhatNodeDrain, "removed "+nodedrain.AnnotationNodeDrain+" (kept by routers before the store; not read: the node's cordon is left as it is)"
		items = append(items, it)
		mutations = append(mutations, func(n *corev1.Node) { delete(n.Annotations, nodedrain.AnnotationNodeDrain) })
	}
	if _, ok := n.Annotations[inplace.Annotation]; ok && !runNodes[n.Name] {
		it := base
		// The run's record went with its NodeClaim: what the mark says is not read (anyone with
		// `patch nodes` writes it), so the cordon and the vetoes stay as they are.
		it.What, it.Done = WhatNodeRun, "removed "+inplace.Annotation+" (no NodeClaim runs it; not read: the node's cordon, do-not-disrupt and do-not-repair are left as they are)"
		items = append(items, it)
		mutations = append(mutations, func(n *corev1.Node) { inplace.UndoNode(n, inplace.State{}, true) })
	}
	if len(items) == 0 {
		return nil
	}
	if h.opts.DryRun {
		for i := range items {
			items[i].Done = "would be " + items[i].Done
		}
		return items
	}
	// The Node first (its cordon goes), then the record that says the router set it: a
	// handback that stops between the two leaves a record, found by the next one.
	err := h.patchNode(ctx, n, func(n *corev1.Node) {
		for _, m := range mutations {
			m(n)
		}
	})
	if err == nil && hr != nil {
		if err = h.kube.Delete(ctx, hr, client.Preconditions{UID: &hr.UID}); apierrors.IsNotFound(err) {
			err = nil
		}
	}
	if err != nil {
		for i := range items {
			items[i].Done, items[i].Problem = "left as it is: "+err.Error(), true
		}
	}
	return items
}

// nodeDrain reports a drain of an unmanaged node (its record hr) and whether ending it
// uncordons the Node: dropped, or its maintenance over (a release past), the cordon the
// router set goes; a drain still owed stays cordoned, for its owner to finish (kubectl drain).
func (h *Handback) nodeDrain(base Item, n *corev1.Node, hr *record.HealthRecord) (Item, bool) {
	it := base
	it.What = WhatNodeDrain
	mem, err := hr.Memory()
	var rec nodedrain.Record
	if err == nil {
		rec, _, err = nodedrain.Of(mem)
	}
	if err != nil {
		it.Done = "record removed; node left cordoned (the record did not parse: who cordoned it is not known)"
		return it, false
	}
	it.Kind, it.Event, it.Until = rec.Kind, rec.EventID, rec.Deadline
	now := h.clock.Now()
	release, byItself := rec.ReleaseAt() // the last of the maintenances the drain holds the Node for
	switch {
	case !rec.Cordoned:
		it.Done = "record removed (the router did not cordon it)"
		return it, false
	case h.opts.Pending == PendingDrop:
		it.Done = "dropped; uncordoned"
		return it, true
	case byItself && !now.Before(release):
		it.Done = "record removed; uncordoned (its maintenance is over)"
		return it, true
	case byItself:
		it.Done = fmt.Sprintf("record removed; left cordoned: uncordon after the maintenance (%s)", release.UTC().Format(time.RFC3339))
	case rec.Finished():
		it.Done = "record removed; left cordoned (its instance ends)"
	default:
		it.Done = "record removed; left cordoned: finish the drain (kubectl drain " + n.Name + " --ignore-daemonsets --delete-emptydir-data)"
	}
	return it, false
}

func problem(base Item, what string, err error) Item {
	base.What, base.Done, base.Problem = what, "left as it is: "+err.Error(), true
	return base
}

// patchNode applies mutate to the Node read fresh and writes the difference under its
// resource version, again after a conflict.
func (h *Handback) patchNode(ctx context.Context, node *corev1.Node, mutate func(*corev1.Node)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &corev1.Node{}
		if err := h.kube.Get(ctx, client.ObjectKey{Name: node.Name}, cur); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		mutate(next)
		if equality.Semantic.DeepEqual(cur.Spec, next.Spec) && equality.Semantic.DeepEqual(cur.Annotations, next.Annotations) &&
			equality.Semantic.DeepEqual(cur.Labels, next.Labels) {
			return nil
		}
		return h.kube.Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	})
}

// patchClaim is patchNode for a NodeClaim.
func (h *Handback) patchClaim(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*karpv1.NodeClaim)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &karpv1.NodeClaim{}
		if err := h.kube.Get(ctx, client.ObjectKey{Name: nc.Name}, cur); err != nil {
			return err
		}
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		mutate(next)
		if equality.Semantic.DeepEqual(cur.Annotations, next.Annotations) {
			return nil
		}
		return h.kube.Patch(ctx, next, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	})
}

func instanceOf(nc *karpv1.NodeClaim) string { return cluster.InstanceID(nc.Status.ProviderID) }

func instanceOfNode(n *corev1.Node) string { return cluster.InstanceID(n.Spec.ProviderID) }

// WriteTable prints the report for people, then what is left to do.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.Warning != "" {
		fmt.Fprintf(w, "warning: %s\n\n", r.Warning)
	}
	fmt.Fprintln(tw, "OBJECT\tNODEPOOL\tINSTANCE\tWHAT\tKIND\tEVENT\tUNTIL\tDONE")
	for _, it := range r.Items {
		until := "-"
		if !it.Until.IsZero() {
			until = it.Until.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", it.Object, dash(it.NodePool), dash(it.Instance), it.What, dash(it.Kind), dash(it.Event), until, it.Done)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(r.Items) == 0:
		fmt.Fprintln(w, "\nthe cluster holds no state of the router.")
	case r.DryRun:
		fmt.Fprintf(w, "\ndry run: nothing changed. Run again without --dry-run to carry it out (--pending=%s).\n", r.Pending)
	}
	if n := r.Problems(); n > 0 {
		fmt.Fprintf(w, "%d item(s) left as they were: see DONE.\n", n)
	}
	return nil
}

// WriteJSON prints the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	if r.Items == nil {
		r.Items = []Item{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
