// Package signal carries out decisions on the cluster: it signals Karpenter to drain (by
// forwarding the event to Karpenter's interruption queue, or by deleting the NodeClaim),
// records deferrals on the NodeClaim where people and a restarted router see them, and
// leaves a Kubernetes Event for every decision.
package signal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/keymutex"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/apis"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
)

// Mode is how a drain is signalled to Karpenter.
type Mode string

const (
	// ModeForward sends the event, restricted to the drained instance, to Karpenter's
	// interruption queue: Karpenter then does what it does today (including marking a Spot
	// offering unavailable).
	ModeForward Mode = "forward"
	// ModeDeleteNodeClaim deletes the NodeClaim; Karpenter's termination controller drains.
	ModeDeleteNodeClaim Mode = "delete-nodeclaim"
)

// Kubernetes Event reasons.
const (
	ReasonDrained            = "HealthEventDrained"
	ReasonDeferred           = "HealthEventDeferred"
	ReasonIgnored            = "HealthEventIgnored"
	ReasonDeferralCancelled  = "HealthEventDeferralCancelled"
	ReasonInvalidAnnotation  = "HealthRouterInvalidAnnotation"
	ReasonReplacementUnsound = "HealthEventReplacementUnsound"
	ReasonForwardUnconfirmed = "HealthEventForwardUnconfirmed"
	ReasonDeferralDropped    = "HealthEventDeferralDropped"
	ReasonRecordUnreadable   = "HealthRouterRecordUnreadable"
	ReasonNotManaged         = "HealthEventNotManaged"
	ReasonRescheduled        = "HealthEventRescheduled"
	// ReasonShadow: a pool in shadow; what the router would have done, nothing carried out.
	ReasonShadow = "HealthEventShadowDecision"
	// ReasonUrgentDrainsHeld (Warning, on the NodePool): the pool's urgent-drain breaker holds
	// an urgent drain.
	ReasonUrgentDrainsHeld = "HealthRouterUrgentDrainsHeld"
)

// ErrNotManaged marks an instance whose Node has no NodeClaim: Karpenter does not manage it
// (a managed node group, a self-managed node), so there is nothing to forward or delete.
var ErrNotManaged = errors.New("not managed by Karpenter: the node has no NodeClaim")

// actions are the Event actions of each reason.
var actions = map[string]string{
	ReasonDrained: "Drain", ReasonDeferred: "Defer", ReasonIgnored: "Ignore", ReasonDeferralCancelled: "CancelDeferral",
	ReasonShadow: "Shadow",
}

// sendAPI is the part of SQS the forward mode uses.
type sendAPI interface {
	SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// instanceLocks is how many locks the per-instance lock hashes onto. keymutex's default is one
// per CPU: two on a small node, so drains of different instances waited on each other's API
// calls; a bulk event carries out 16 instances at once.
const instanceLocks = 4096

// recentTTL is how long a signalled drain is remembered in memory: longer than the cache
// takes to show the drain-signalled annotation, so that a duplicate of the event handled
// meanwhile does not signal again.
const recentTTL = 10 * time.Minute

// Signaller carries out decisions.
type Signaller struct {
	kube     client.Client // writes; reads through the cache
	fresh    client.Reader // uncached reads, only after a write conflicted
	store    *record.Store // the router's memory: records and drains, in HealthRecords
	mode     Mode
	forward  *batcher // to Karpenter's interruption queue, for ModeForward
	recorder events.EventRecorder
	clock    clock.Clock
	locks    keymutex.KeyMutex // one drain at a time per instance: duplicates signal once
	recentMu sync.Mutex
	recent   map[string]time.Time // instance -> when this process signalled its drain
	swept    time.Time            // the last sweep of recent's expired entries
	canonMu  sync.Mutex
	canon    map[string]*Canonicalizer // parsed events worked on now, by ID and body size
	// onUnreadable counts a NodeClaim whose records cannot be read (a metric); may be nil.
	onUnreadable func()
	// budget bounds the per-instance Events; nil: unbounded (SetInstanceEventRate).
	budget *eventBudget
	// stampFailed is when a drain stamp last failed (UnixNano on clock; 0: never): while
	// the API server fails, urgent forwards wait for their stamps again (stampTrouble).
	stampFailed atomic.Int64
	// karpenter is the version of the Karpenter signalled (zero: unknown, taken as the newest).
	karpenter KarpenterVersion
}

// stampTrouble is how long after a failed drain stamp urgent forwards wait for their stamps:
// while the API server fails, a send that goes before its stamp would be sent again by the
// next leader (its memory of the send dies with the process), once per instance.
const stampTrouble = 30 * time.Second

// apiTroubled reports whether a drain stamp failed within stampTrouble.
func (s *Signaller) apiTroubled() bool {
	at := s.stampFailed.Load()
	return at != 0 && s.clock.Since(time.Unix(0, at)) < stampTrouble
}

// OnUnreadable sets what counts a NodeClaim whose records this router cannot read.
func (s *Signaller) OnUnreadable(f func()) { s.onUnreadable = f }

// New returns a Signaller. sqsClient and karpenterQueueURL are used in ModeForward only.
func New(kube client.Client, fresh client.Reader, mode Mode, sqsClient sendAPI, karpenterQueueURL string, recorder events.EventRecorder, clk clock.Clock) *Signaller {
	s := &Signaller{kube: kube, fresh: fresh, store: record.NewStore(kube, fresh), mode: mode, recorder: recorder, clock: clk,
		locks: keymutex.NewHashed(instanceLocks), recent: map[string]time.Time{}, canon: map[string]*Canonicalizer{}}
	if sqsClient != nil && karpenterQueueURL != "" {
		s.forward = newBatcher(sqsClient, karpenterQueueURL)
	}
	return s
}

// Store returns the store the Signaller keeps its records in.
func (s *Signaller) Store() *record.Store { return s.store }

// Mode returns the signalling mode.
func (s *Signaller) Mode() Mode { return s.mode }

// Via returns how a drain of ev is signalled: forwarded to Karpenter's queue only for what
// Karpenter's interruption controller acts on (Spot and capacity-reservation interruptions,
// AWS Health scheduled changes, state changes) in the version it is told (SetKarpenterVersion);
// a rebalance recommendation (Karpenter only records it), an instance-status finding of the
// router's own poller, a kind the version has no parser for (a reservation interruption before
// v1.10: Karpenter would delete it as a no-op, and the drain would wait for the
// confirm-or-fallback), and everything in delete-nodeclaim mode delete the NodeClaim.
func (s *Signaller) Via(ev event.Event) Mode {
	if s.mode == ModeForward && Forwarded(ev, s.karpenter) {
		return ModeForward
	}
	return ModeDeleteNodeClaim
}

// signalledRecently reports whether id was remembered within recentTTL. Expired entries are
// swept at most once per recentSweep, not on every call: a bulk event's instances each ask,
// and a sweep walks every entry.
func (s *Signaller) signalledRecently(id string) bool {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	now := s.clock.Now()
	if now.Sub(s.swept) >= recentSweep || now.Before(s.swept) {
		for k, t := range s.recent {
			if now.Sub(t) > recentTTL {
				delete(s.recent, k)
			}
		}
		s.swept = now
	}
	t, ok := s.recent[id]
	return ok && now.Sub(t) <= recentTTL
}

// recentSweep is how often signalledRecently sweeps expired entries.
const recentSweep = time.Minute

func (s *Signaller) remember(id string) {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	s.recent[id] = s.clock.Now()
}

// Drain, Defer and Ignore take quiet to leave out the per-instance Kubernetes Events: a bulk
// event is summarised on its NodePools instead (Summary).

// Drain signals Karpenter to drain the instance. It returns already=true, and signals
// nothing, when the instance is already being drained (by this event or another): the
// NodeClaim is being deleted or its HealthRecord holds a drain. It reads the NodeClaim and
// its record from the cache; the per-instance lock and an in-memory note of recent drains
// cover the moment before the cache shows a drain this process signalled.
func (s *Signaller) Drain(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) (already bool, err error) {
	s.locks.LockKey(d.InstanceID)
	defer func() { _ = s.locks.UnlockKey(d.InstanceID) }()

	claim := res.NodeClaim
	if claim == nil {
		// Karpenter manages no such node: the pipeline decides it by --unmanaged-nodes.
		return false, fmt.Errorf("instance %s: %w", d.InstanceID, ErrNotManaged)
	}
	via := s.Via(ev)
	resend := false
	mem, memErr := s.store.Get(ctx, claim.Name)
	if errors.Is(memErr, record.ErrUnreadable) {
		// A newer router's memory, kept as it is: nothing can be recorded beside it, so the
		// drain is one that records itself, the NodeClaim's DELETE.
		s.unreadable(claim, memErr)
		via, memErr = ModeDeleteNodeClaim, nil
	}
	switch {
	case !claim.DeletionTimestamp.IsZero():
		return true, nil
	case memErr != nil:
		return false, memErr
	case mem.Drain != nil:
		// Stamped by an earlier try of this same event whose send may not have gone out (the
		// process died between the stamp and the send): send again until Karpenter acts.
		if mem.Drain.EventID != ev.ID || Mode(mem.Drain.Via) != ModeForward || via != ModeForward {
			return true, nil
		}
		resend = true
	}
	stamp := func() error {
		err := s.store.Update(ctx, claim, func(m *record.Memory) (bool, error) {
			if m.Drain != nil {
				return false, nil // recorded by an earlier try, or drained by another: nothing to add
			}
			// Every record it held ends with the node.
			set := m.Set()
			set.Drained(ev.ID, record.Key(ev))
			m.SetSet(set)
			m.Drain = &record.Drain{EventID: ev.ID, At: s.clock.Now().UTC(), Via: string(via)}
			return true, nil
		})
		if err != nil && !apierrors.IsNotFound(err) {
			s.stampFailed.Store(s.clock.Now().UnixNano())
		}
		return err
	}
	switch via {
	case ModeForward:
		if s.signalledRecently(d.InstanceID) {
			return true, nil // a duplicate handled before the cache shows the stamp
		}
		body, err := s.forwardBody(ev, d.InstanceID)
		if err != nil {
			return false, err
		}
		if s.forward == nil {
			return false, errNoBatcher
		}
		// sentBefore: an earlier try of this process sent it, and its stamp failed.
		sentKey := "sent/" + ev.ID + "/" + d.InstanceID
		sentBefore := !resend && s.signalledRecently(sentKey)
		sent, sendErr := sentBefore, error(nil)
		switch {
		case resend:
			// Stamped by an earlier try: only the send is left.
		case ev.Urgent() && !sentBefore && !s.apiTroubled():
			// An urgent event (a Spot warning, a reservation's end, a stopping instance) has
			// minutes: the send does not wait on the API server, which is busiest in the same
			// reclaim. Stamp and send go at once. Urgent drains are not paced, so an unstamped
			// send holds no pacing slot; a stamp that fails is an error (retried: the retry
			// stamps and does not send again), and a crash between the two forwards the event
			// again on redelivery (Karpenter ignores an interruption for a deleting NodeClaim).
			// Once a stamp has failed, urgent forwards wait for their stamps for stampTrouble:
			// an outage then sends nothing unstamped past the forwards in flight when it began.
			done := make(chan error, 1)
			go func() { done <- s.forward.send(ctx, string(body)) }()
			serr := stamp()
			sent, sendErr = true, <-done
			if serr != nil {
				if apierrors.IsNotFound(serr) {
					return true, nil
				}
				if sendErr == nil {
					s.remember(sentKey) // the retry stamps, and sends nothing more
				}
				return false, fmt.Errorf("recording the drain of %s on nodeclaim %s (forwarded: %t): %w", d.InstanceID, claim.Name, sendErr == nil, serr)
			}
		default:
			// The stamp first (write-ahead): a stamp that fails sends nothing, so a retry
			// cannot forward twice, and the pacer counts the drain from the moment it is sent;
			// a send that fails after it leaves a stamped NodeClaim, which the deferral
			// controller deletes past the confirmation bound (the confirm-or-fallback). After
			// an earlier try's send, only the stamp is left.
			if err := stamp(); err != nil {
				if apierrors.IsNotFound(err) {
					return true, nil
				}
				return false, fmt.Errorf("recording the drain of %s on nodeclaim %s (forwarded: %t): %w", d.InstanceID, claim.Name, sentBefore, err)
			}
		}
		s.remember(d.InstanceID)
		if !sent {
			sendErr = s.forward.send(ctx, string(body))
		}
		if sendErr != nil {
			s.event(res, corev1.EventTypeWarning, ReasonDrained, "%s; forwarding it to Karpenter failed (%v): the router deletes the NodeClaim itself within the confirmation bound", d.Reason, sendErr)
			return false, nil
		}
	case ModeDeleteNodeClaim:
		if s.signalledRecently(d.InstanceID) {
			return true, nil
		}
		// With records to clear: the stamp first, from the cached object (one PATCH,
		// no conflict), then the DELETE; should the DELETE fail, the deferral controller deletes
		// a stamped NodeClaim that is not deleting within the confirmation bound. Without
		// records the DELETE alone records the drain: a deleting NodeClaim counts as draining,
		// and a redelivered event skips it.
		if len(mem.Records) > 0 {
			if err := stamp(); err != nil {
				if apierrors.IsNotFound(err) {
					return true, nil
				}
				return false, fmt.Errorf("stamping nodeclaim %s before deleting it: %w", claim.Name, err)
			}
		}
		if err := s.kube.Delete(ctx, claim.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
			// Not remembered as signalled: the retry must delete it. (A stamped NodeClaim is
			// also deleted by the deferral controller past the confirmation bound.)
			return false, fmt.Errorf("deleting nodeclaim %s: %w", claim.Name, err)
		}
		s.remember(d.InstanceID)
	}
	if !quiet {
		s.event(res, eventType(d), ReasonDrained, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
	}
	if res.NodeClass != nil {
		for _, c := range d.Checks {
			if !c.Passed {
				s.recorder.Eventf(res.NodeClass, nil, corev1.EventTypeWarning, ReasonReplacementUnsound, "Drain", "drained %s for %s although %s: %s", d.InstanceID, ev.Kind, c.Name, c.Reason)
			}
		}
	}
	return false, nil
}

// forwardBody is the body forwarded to Karpenter for one instance, and kept in a deferral
// record: the canonical EventBridge body Karpenter's parsers accept (Canonical). The parsed
// event is kept for the events worked on now, so that the instances of a bulk event are not
// each a parse of the whole body.
func (s *Signaller) forwardBody(ev event.Event, instanceID string) ([]byte, error) {
	if len(ev.Instances) < 2 {
		// One instance (a deferral record's event, a Spot warning): nothing to share, and the
		// records of one event share its ID and, often, its body's length.
		return Canonical(ev, instanceID)
	}
	key := ev.ID + "/" + strconv.Itoa(len(ev.Body)) + "/" + strconv.Itoa(len(ev.Instances))
	s.canonMu.Lock()
	c := s.canon[key]
	s.canonMu.Unlock()
	if c == nil {
		var err error
		if c, err = NewCanonicalizer(ev); err != nil {
			return nil, err
		}
		s.canonMu.Lock()
		if len(s.canon) >= canonicalizersKept {
			clear(s.canon) // events worked on at once are few: start afresh rather than track age
		}
		s.canon[key] = c
		s.canonMu.Unlock()
	}
	return c.Body(instanceID)
}

// canonicalizersKept bounds the parsed events kept: about the messages worked on at once.
const canonicalizersKept = 64

// Fallback deletes a NodeClaim whose drain was signalled but has not started within the
// confirmation bound: Karpenter did not act on a forwarded event (a Warning Event says so,
// and the stamp then names delete-nodeclaim), or the router's own DELETE failed after its
// stamp. It reports whether Karpenter had been forwarded the drain.
func (s *Signaller) Fallback(ctx context.Context, nc *karpv1.NodeClaim, waited time.Duration) (forwarded bool, err error) {
	if err := s.kube.Delete(ctx, nc.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("deleting nodeclaim %s after an unconfirmed drain: %w", nc.Name, err)
	}
	mem, err := s.store.Get(ctx, nc.Name)
	if err != nil || mem.Drain == nil || Mode(mem.Drain.Via) != ModeForward {
		return false, nil
	}
	id := mem.Drain.EventID
	if err := s.store.Update(ctx, nc, func(m *record.Memory) (bool, error) {
		if m.Drain == nil {
			return false, nil
		}
		m.Drain.At, m.Drain.Via = s.clock.Now().UTC(), string(ModeDeleteNodeClaim)
		return true, nil
	}); err != nil && !apierrors.IsNotFound(err) {
		return true, fmt.Errorf("recording the fallback on nodeclaim %s: %w", nc.Name, err)
	}
	s.recorder.Eventf(nc, nil, corev1.EventTypeWarning, ReasonForwardUnconfirmed, "Drain",
		"Karpenter did not act on the forwarded event %s within %s (no deletion of this NodeClaim): deleted the NodeClaim instead", id, waited.Round(time.Second))
	return true, nil
}

// Defer records the deferral on the NodeClaim, with the event restricted to the instance so
// that the router can decide it again with nothing held elsewhere. changed is false when the
// same deferral was already recorded (a redelivery), so that Events are not repeated. An
// instance with no NodeClaim has nowhere to hold a deferral: ok is false, nothing is written.
func (s *Signaller) Defer(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) (changed bool, err error) {
	if res.NodeClaim == nil {
		return false, fmt.Errorf("instance %s has no NodeClaim to hold its deferral", d.InstanceID)
	}
	body, err := s.forwardBody(ev, d.InstanceID)
	if err != nil {
		return false, err
	}
	entry := record.Record{EventID: ev.ID, Key: record.Key(ev), Kind: ev.Kind, Until: d.Until.UTC(), Reason: d.Reason, State: record.StateDeferred,
		Hold: d.Hold, Image: holdImage(d), PDBs: gates.HeldPDBs(d), Match: record.Match(ev), EventTime: ev.Time.UTC(), Event: body,
		Communication: record.Communication(ev), MovedFrom: ev.MovedFrom, Start: ev.Deadline.UTC()}
	err = s.updateRecords(ctx, res.NodeClaim, func(set *record.Set) bool {
		// The decision read the records before this write; a close written since (another
		// worker's, at the same moment) ends the event here as it would have there.
		if set.ClosedSince(ev) {
			changed = false
			return false
		}
		changed = set.Put(entry)
		return changed
	})
	if err != nil {
		return false, fmt.Errorf("recording deferral on nodeclaim %s: %w", res.NodeClaim.Name, err)
	}
	if changed && !quiet {
		s.event(res, eventType(d), ReasonDeferred, "%s (%s) deferred until %s: %s", ev.Kind, ev.ID, d.Until.UTC().Format(time.RFC3339), summary(d))
	}
	return changed, nil
}

// Shadow records the would-be outcome of decision d on the NodeClaim (router/shadow), and
// carries nothing out. recorded is false when it was recorded before (a redelivery, or the
// other source's report of the same maintenance): nothing is written, no Event is posted. An
// instance with no NodeClaim (a node Karpenter does not manage) has nothing to write on:
// recorded is true, and the caller keeps the outcome elsewhere (the ledger).
func (s *Signaller) Shadow(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) (recorded bool, err error) {
	out := shadow.OutcomeOf(ev, d, s.clock.Now())
	if res.NodeClaim != nil {
		err = s.store.Update(ctx, res.NodeClaim, func(m *record.Memory) (bool, error) {
			outs, err := shadow.Read(*m)
			if err != nil {
				return false, err
			}
			if shadow.Recorded(outs, ev) {
				return false, nil
			}
			recorded = true
			m.Shadow = shadow.Encode(shadow.Add(outs, out))
			return true, nil
		})
		if err != nil {
			return false, fmt.Errorf("recording the would-be outcome on nodeclaim %s: %w", res.NodeClaim.Name, err)
		}
	} else {
		recorded = true
	}
	if recorded && !quiet {
		when := ""
		if d.Action == policy.ActionDefer {
			when = " until " + d.Until.UTC().Format(time.RFC3339)
		}
		s.event(res, corev1.EventTypeNormal, ReasonShadow, "shadow: %s (%s) would be %s%s: %s; nothing done", ev.Kind, ev.ID, wouldBe(d.Action), when, summary(d))
	}
	return recorded, nil
}

// wouldBe is an action as a participle: "would be drained".
func wouldBe(a policy.Action) string {
	switch a {
	case policy.ActionDrain:
		return "drained"
	case policy.ActionDefer:
		return "deferred"
	case policy.ActionIgnore:
		return "ignored"
	case policy.ActionRebootInPlace:
		return "rebooted in place"
	case policy.ActionSkip:
		return "skipped"
	}
	return string(a)
}

// holdImage is the image a drain held by the AMI check waits on.
func holdImage(d policy.Decision) string {
	if d.Hold != policy.HoldCheck {
		return ""
	}
	for _, c := range d.Checks {
		if c.Name == "ami" && !c.Passed && c.Evidence["image"] != "" {
			return c.Evidence["image"]
		}
	}
	return ""
}

// Ignore records an ignored event, and cancels the deferrals it ends: a closed Health event
// cancels its own; a running instance cancels deferred state changes. A deferral of this
// same event that is now ignored (its pool's policy changed) is removed.
func (s *Signaller) Ignore(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) error {
	cancelled, err := s.Close(ctx, ev, d, res)
	if err != nil || len(cancelled) > 0 {
		return err
	}
	if !quiet {
		s.event(res, eventType(d), ReasonIgnored, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
	}
	return nil
}

// Close applies ev to the NodeClaim's records: the deferrals it cancels end (a running
// instance, a closed maintenance: d.Cancel), with an Event naming them. It is what Ignore
// records, and what a pool in shadow still carries out: ending what the router holds is never
// withheld, since a deferral left active would come due once the pool is active again.
func (s *Signaller) Close(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved) (cancelled []string, err error) {
	if res.NodeClaim == nil {
		return nil, nil
	}
	err = s.updateRecords(ctx, res.NodeClaim, func(set *record.Set) bool {
		var changed bool
		cancelled, changed = set.Cancel(ev, d.Cancel)
		return changed
	})
	if err != nil {
		return nil, fmt.Errorf("updating deferrals on nodeclaim %s: %w", res.NodeClaim.Name, err)
	}
	if len(cancelled) > 0 {
		s.event(res, corev1.EventTypeNormal, ReasonDeferralCancelled, "%s (%s) cancels deferred %s: %s", ev.Kind, ev.ID, strings.Join(cancelled, ", "), d.Reason)
	}
	return cancelled, nil
}

// InPlace carries out a reboot-in-place decision: begin starts the run (router/inplace's
// Runner.Begin, idempotent by event), then the records of the event end as handed to it.
// It returns whether the run was begun before.
func (s *Signaller) InPlace(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, begin func(context.Context, *karpv1.NodeClaim) (bool, error)) (bool, error) {
	if res.NodeClaim == nil {
		return false, fmt.Errorf("instance %s: %w", d.InstanceID, ErrNotManaged)
	}
	s.locks.LockKey(d.InstanceID)
	defer func() { _ = s.locks.UnlockKey(d.InstanceID) }()
	already, err := begin(ctx, res.NodeClaim)
	if err != nil {
		return false, fmt.Errorf("beginning the reboot in place of nodeclaim %s: %w", res.NodeClaim.Name, err)
	}
	if err := s.updateRecords(ctx, res.NodeClaim, func(set *record.Set) bool { return set.InPlace(ev.ID, record.Key(ev)) }); err != nil {
		return already, fmt.Errorf("ending the records of %s on nodeclaim %s: %w", ev.ID, res.NodeClaim.Name, err)
	}
	return already, nil
}

// Replace deletes a NodeClaim whose reboot in place fell back: Karpenter drains the node and
// replaces it. Deleting one that is gone is done.
func (s *Signaller) Replace(ctx context.Context, nc *karpv1.NodeClaim) error {
	if err := s.kube.Delete(ctx, nc.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting nodeclaim %s to replace it: %w", nc.Name, err)
	}
	return nil
}

// Drop removes one deferral record that can never be decided, with a Warning Event.
func (s *Signaller) Drop(ctx context.Context, nc *karpv1.NodeClaim, eventID, why string) error {
	err := s.updateRecords(ctx, nc, func(set *record.Set) bool { return set.Remove(eventID) })
	if err != nil {
		return fmt.Errorf("dropping deferral %s of nodeclaim %s: %w", eventID, nc.Name, err)
	}
	s.recorder.Eventf(nc, nil, corev1.EventTypeWarning, ReasonDeferralDropped, "CancelDeferral", "deferral %s dropped: %s", eventID, why)
	return nil
}

// Prune removes the ended deferrals (cancelled, superseded) whose time has passed: they are
// kept until then only so that a late duplicate of their event is recognised.
func (s *Signaller) Prune(ctx context.Context, nc *karpv1.NodeClaim, now time.Time) error {
	return s.updateRecords(ctx, nc, func(set *record.Set) bool { return set.Prune(now) })
}

// Summary posts one Event on a NodePool for the instances of one event that got the same
// action: a bulk event (an AZ-wide maintenance naming thousands) is summarised, not told
// twice per instance; each instance's record stays on its NodeClaim.
func (s *Signaller) Summary(pool *karpv1.NodePool, ev event.Event, action policy.Action, n int, example policy.Decision) {
	if pool == nil || n == 0 {
		return
	}
	reason := map[policy.Action]string{policy.ActionDrain: ReasonDrained, policy.ActionDefer: ReasonDeferred, policy.ActionIgnore: ReasonIgnored, policy.ActionRebootInPlace: ReasonDrained}[action]
	if reason == "" {
		return
	}
	typ := corev1.EventTypeNormal
	if len(example.Warnings) > 0 {
		typ = corev1.EventTypeWarning
	}
	s.recorder.Eventf(pool, nil, typ, reason, actions[reason], "%s (%s): %d instances of this pool %s; for example %s: %s",
		ev.Kind, ev.ID, n, pastTense[action], example.InstanceID, summary(example))
}

var pastTense = map[policy.Action]string{policy.ActionDrain: "drained", policy.ActionDefer: "deferred", policy.ActionIgnore: "ignored", policy.ActionRebootInPlace: "rebooting in place"}

// NotManaged posts an Event on a Node Karpenter does not manage: what the router decided for
// it (nothing, under --unmanaged-nodes=ignore; a cordon and drain under cordon-drain).
func (s *Signaller) NotManaged(res cluster.Resolved, ev event.Event, d policy.Decision) {
	if res.Node == nil {
		return
	}
	s.recorder.Eventf(res.Node, nil, corev1.EventTypeWarning, ReasonNotManaged, string(d.Action), "%s (%s): %s", ev.Kind, ev.ID, summary(d))
}

// Rescheduled posts an Event on the NodeClaim and the Node: the router moved the instance's
// scheduled event into its pool's window (EC2 ModifyInstanceEventStartTime).
func (s *Signaller) Rescheduled(res cluster.Resolved, ev event.Event, how string) {
	if res.NodeClaim != nil {
		s.recorder.Eventf(res.NodeClaim, nil, corev1.EventTypeNormal, ReasonRescheduled, "Reschedule", "%s (%s): %s", ev.Kind, ev.ID, how)
	}
	if res.Node != nil {
		s.recorder.Eventf(res.Node, nil, corev1.EventTypeNormal, ReasonRescheduled, "Reschedule", "%s (%s): %s", ev.Kind, ev.ID, how)
	}
}

// UrgentDrainsHeld posts a Warning Event on the NodePool: its urgent-drain breaker holds an
// urgent drain (d, HoldUrgentBreaker). Posted for every hold, bulk or not: the recorder folds
// a storm's Events into one series on the pool.
func (s *Signaller) UrgentDrainsHeld(res cluster.Resolved, ev event.Event, d policy.Decision) {
	if res.NodePool == nil {
		return
	}
	s.recorder.Eventf(res.NodePool, nil, corev1.EventTypeWarning, ReasonUrgentDrainsHeld, "Hold", "%s (%s) for %s held: %s", ev.Kind, ev.ID, d.InstanceID, strings.Join(d.Warnings, "; "))
}

// noteLimit is the longest Event note the API server accepts (events.k8s.io/v1): it refuses
// a longer one, and the Event is lost.
const noteLimit = 1024

// PolicyProblems posts one Warning Event on the NodePool that lists every ignored annotation.
// One Event, not one per problem: the events.k8s.io recorder folds Events that differ only in
// their note into a series that keeps the first note, so a pool with several problems showed
// one of them.
func (s *Signaller) PolicyProblems(res cluster.Resolved, problems []string) {
	if res.NodePool == nil || len(problems) == 0 {
		return
	}
	s.recorder.Eventf(res.NodePool, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "ReadPolicy", "%s", problemsNote(res.NodePool.Name, problems))
}

// problemsNote writes a pool's problems as one note, numbered when there are several, cut at
// noteLimit with a pointer to where all of them are listed.
func problemsNote(pool string, problems []string) string {
	note := problems[0]
	if len(problems) > 1 {
		var b strings.Builder
		fmt.Fprintf(&b, "%d problems:", len(problems))
		for i, p := range problems {
			fmt.Fprintf(&b, " (%d) %s", i+1, p)
		}
		note = b.String()
	}
	if len(note) <= noteLimit {
		return note
	}
	tail := fmt.Sprintf(" … (cut short: health-router status --nodepool %s lists them all)", pool)
	cut := max(noteLimit-len(tail), 0)
	for cut > 0 && !utf8.RuneStart(note[cut]) {
		cut--
	}
	return note[:cut] + tail
}

// nodeClaimGVK is the kind update's metadata-only patches name.
var nodeClaimGVK = schema.GroupVersionKind{Group: apis.Group, Version: "v1", Kind: "NodeClaim"}

// update applies mutate to a copy of the NodeClaim as the caller (the cache) has it and
// patches its annotations, the only thing the router writes on a NodeClaim, with an
// optimistic lock; on a conflict it reads the NodeClaim fresh and tries again. mutate returns
// false when there is nothing to change; what it changes besides annotations is not sent.
// One write per instance, and a read only when someone else wrote first. An error of mutate
// ends it.
func (s *Signaller) update(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*karpv1.NodeClaim) (bool, error)) error {
	cur := nc
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			fresh := &karpv1.NodeClaim{}
			if err := s.fresh.Get(ctx, client.ObjectKeyFromObject(nc), fresh); err != nil {
				return err
			}
			cur = fresh
		}
		first = false
		base := cur
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		if ok, err := mutate(next); err != nil || !ok {
			return err
		}
		data, err := annotationPatch(base, next)
		if err != nil {
			return fmt.Errorf("nodeclaim %s: computing the patch: %w", next.Name, err)
		}
		if data == nil {
			return nil // mutate left the annotations as they were
		}
		// Sent for the NodeClaim's metadata alone: the API server answers with metadata (in
		// protobuf), not the whole object in JSON, which nothing here reads.
		target := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: next.Name}}
		target.SetGroupVersionKind(nodeClaimGVK)
		err = s.kube.Patch(ctx, target, client.RawPatch(types.MergePatchType, data))
		if apierrors.IsRequestEntityTooLargeError(err) || (apierrors.IsInvalid(err) && strings.Contains(err.Error(), "annotations")) {
			// Refused for its size or form: the same write fails on every retry.
			return fmt.Errorf("%w: %w", record.ErrTooLarge, err)
		}
		return err
	})
}

// annotationPatch is the JSON merge patch from base's annotations to next's (a removed key
// set to null) with base's resourceVersion as the optimistic lock, or nil when they are the
// same: what client.MergeFromWithOptimisticLock sends for a change of annotations, without
// encoding both whole objects and diffing them.
func annotationPatch(base, next *karpv1.NodeClaim) ([]byte, error) {
	changed := map[string]*string{}
	for k, v := range next.Annotations {
		if old, ok := base.Annotations[k]; !ok || old != v {
			changed[k] = &v
		}
	}
	for k := range base.Annotations {
		if _, ok := next.Annotations[k]; !ok {
			changed[k] = nil
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	type meta struct {
		Annotations     map[string]*string `json:"annotations"`
		ResourceVersion string             `json:"resourceVersion"`
	}
	return json.Marshal(struct {
		Metadata meta `json:"metadata"`
	}{meta{changed, base.ResourceVersion}})
}

// updateRecords applies mutate to the NodeClaim's records. Records this router cannot read
// are kept as they are: the write fails with record.ErrUnreadable, and is counted and told.
func (s *Signaller) updateRecords(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*record.Set) bool) error {
	err := s.store.Update(ctx, nc, func(m *record.Memory) (bool, error) {
		set := m.Set()
		if !mutate(&set) {
			return false, nil
		}
		m.SetSet(set)
		return true, nil
	})
	if errors.Is(err, record.ErrUnreadable) {
		s.unreadable(nc, err)
	}
	return err
}

// unreadable tells that a NodeClaim's records cannot be read and are kept as they are.
func (s *Signaller) unreadable(nc *karpv1.NodeClaim, err error) {
	if s.onUnreadable != nil {
		s.onUnreadable()
	}
	s.recorder.Eventf(nc, nil, corev1.EventTypeWarning, ReasonRecordUnreadable, "ReadRecords",
		"its HealthRecord is kept as it is and not rewritten (%v): a newer router wrote it", err)
}

// event posts an Event on the Node and the NodeClaim, within the instance Event budget (held
// back and summed up per pool past it; see SetInstanceEventRate).
func (s *Signaller) event(res cluster.Resolved, typ, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if !s.budget.allow(res, typ, reason, res.InstanceID+": "+msg, s.clock.Now()) {
		return
	}
	for _, obj := range []runtime.Object{nodeOrNil(res.Node), claimOrNil(res.NodeClaim)} {
		if obj != nil {
			s.recorder.Eventf(obj, nil, typ, reason, actions[reason], "%s", msg)
		}
	}
}

func nodeOrNil(n *corev1.Node) runtime.Object {
	if n == nil {
		return nil
	}
	return n
}

func claimOrNil(c *karpv1.NodeClaim) runtime.Object {
	if c == nil {
		return nil
	}
	return c
}

func eventType(d policy.Decision) string {
	if len(d.Warnings) > 0 {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

func summary(d policy.Decision) string {
	s := d.Reason
	if len(d.Warnings) > 0 {
		s += " (warning: " + strings.Join(d.Warnings, "; ") + ")"
	}
	return s
}
