// Package signal carries out decisions on the cluster: it signals Karpenter to drain (by
// forwarding the event to Karpenter's interruption queue, or by deleting the NodeClaim),
// records deferrals on the NodeClaim where people and a restarted router see them, and
// leaves a Kubernetes Event for every decision.
package signal

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/keymutex"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
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
)

// actions are the Event actions of each reason.
var actions = map[string]string{
	ReasonDrained: "Drain", ReasonDeferred: "Defer", ReasonIgnored: "Ignore", ReasonDeferralCancelled: "CancelDeferral",
}

// Deferral states on the NodeClaim.
const (
	StateDeferred   = "deferred"
	StateCancelled  = "cancelled"  // a running instance, or a closed Health event, ended it
	StateSuperseded = "superseded" // a newer update of the same Health event replaced it
)

// Deferral is one deferred event for one instance, as recorded in the NodeClaim's
// healthrouter.io/deferred annotation (a JSON list). The record is the deferral's durable
// home: it holds the event itself, so the router decides it again at Until (or when its Hold
// ends) with nothing kept in SQS.
type Deferral struct {
	EventID string     `json:"event_id"`
	Key     string     `json:"key"` // the Health eventArn, or the event ID
	Kind    event.Kind `json:"kind"`
	Until   time.Time  `json:"until"`
	Reason  string     `json:"reason"`
	State   string     `json:"state"`
	// Hold is what the deferral waits for; Image the image a check hold waits on, PDBs the
	// PodDisruptionBudgets ("namespace/name") a pdb hold waits on.
	Hold  policy.Hold `json:"hold,omitempty"`
	Image string      `json:"image,omitempty"`
	PDBs  []string    `json:"pdbs,omitempty"`
	// Match identifies a scheduled maintenance whichever source reported it (AWS Health or
	// EC2's instance status): "<scheduled type>@<not-before, RFC 3339>".
	Match string `json:"match,omitempty"`
	// Event is the event's body restricted to this instance, as forwarded to Karpenter.
	Event json.RawMessage `json:"event,omitempty"`
}

// Active reports whether the deferral still waits (not cancelled or superseded).
func (d Deferral) Active() bool { return d.State == StateDeferred }

// Match returns the identity of a scheduled maintenance across its sources, or "" for
// other events: the same instance, scheduled type and not-before are the same maintenance.
func Match(ev event.Event) string {
	if ev.Kind != event.KindScheduledChange || ev.Health == nil || ev.Health.Scheduled == "" || ev.Deadline.IsZero() {
		return ""
	}
	return string(ev.Health.Scheduled) + "@" + ev.Deadline.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// Recorded returns the NodeClaim's record of ev, if any: an event recorded already needs no
// new decision. That is the same event (its ID: a redelivery), or the same scheduled
// maintenance reported by another source (AWS Health and EC2's instance status: another key,
// the same Match). An update of the same Health event (same key: a new status, a closed
// event) is never "recorded": it is decided, and supersedes or cancels the record.
func Recorded(nc *karpv1.NodeClaim, ev event.Event) (Deferral, bool) {
	match, key := Match(ev), DeferralKey(ev)
	closed := ev.Health != nil && ev.Health.Status == event.HealthClosed
	for _, d := range Deferrals(nc) {
		if d.EventID == ev.ID || (match != "" && !closed && d.Match == match && d.Key != key) {
			return d, true
		}
	}
	return Deferral{}, false
}

// DeferralKey identifies an event across its updates: the Health eventArn, else its ID.
func DeferralKey(ev event.Event) string {
	if ev.Health != nil && ev.Health.EventARN != "" {
		return ev.Health.EventARN
	}
	return ev.ID
}

// Deferrals reads a NodeClaim's deferral records.
func Deferrals(nc *karpv1.NodeClaim) []Deferral {
	if nc == nil || nc.Annotations[cluster.AnnotationDeferred] == "" {
		return nil
	}
	var ds []Deferral
	if err := json.Unmarshal([]byte(nc.Annotations[cluster.AnnotationDeferred]), &ds); err != nil {
		return nil // written by hand and broken: start afresh rather than fail every event
	}
	return ds
}

// DeferralState returns the recorded state of ev on the NodeClaim, or "" if none.
func DeferralState(nc *karpv1.NodeClaim, ev event.Event) string {
	for _, d := range Deferrals(nc) {
		if d.EventID == ev.ID {
			return d.State
		}
	}
	return ""
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
	mode     Mode
	forward  *batcher // to Karpenter's interruption queue, for ModeForward
	recorder events.EventRecorder
	clock    clock.Clock
	locks    keymutex.KeyMutex // one drain at a time per instance: duplicates signal once
	recentMu sync.Mutex
	recent   map[string]time.Time // instance -> when this process signalled its drain
	canonMu  sync.Mutex
	canon    map[string]*Canonicalizer // parsed events worked on now, by ID and body size
}

// New returns a Signaller. sqsClient and karpenterQueueURL are used in ModeForward only.
func New(kube client.Client, fresh client.Reader, mode Mode, sqsClient sendAPI, karpenterQueueURL string, recorder events.EventRecorder, clk clock.Clock) *Signaller {
	s := &Signaller{kube: kube, fresh: fresh, mode: mode, recorder: recorder, clock: clk,
		locks: keymutex.NewHashed(instanceLocks), recent: map[string]time.Time{}, canon: map[string]*Canonicalizer{}}
	if sqsClient != nil && karpenterQueueURL != "" {
		s.forward = newBatcher(sqsClient, karpenterQueueURL)
	}
	return s
}

// Mode returns the signalling mode.
func (s *Signaller) Mode() Mode { return s.mode }

// Via returns how a drain of ev is signalled: forwarded to Karpenter's queue only for what
// Karpenter's interruption controller acts on (Spot and capacity-reservation interruptions,
// AWS Health scheduled changes, state changes); a rebalance recommendation (Karpenter only
// records it), an instance-status finding of the router's own poller, and everything in
// delete-nodeclaim mode delete the NodeClaim.
func (s *Signaller) Via(ev event.Event) Mode {
	if s.mode != ModeForward {
		return ModeDeleteNodeClaim
	}
	switch {
	case ev.Source == "aws.ec2" && (ev.Kind == event.KindSpotInterruption || ev.Kind == event.KindCapacityReservation || ev.Kind == event.KindStateChange):
		return ModeForward
	case ev.Source == "aws.health" && ev.Kind == event.KindScheduledChange:
		return ModeForward
	}
	return ModeDeleteNodeClaim
}

func (s *Signaller) signalledRecently(id string) bool {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	now := s.clock.Now()
	for k, t := range s.recent {
		if now.Sub(t) > recentTTL {
			delete(s.recent, k)
		}
	}
	_, ok := s.recent[id]
	return ok
}

func (s *Signaller) remember(id string) {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	s.recent[id] = s.clock.Now()
}

// DrainStamp is the value of the drain-signalled annotation: "<event id> <RFC 3339> <via>".
func DrainStamp(eventID string, at time.Time, via Mode) string {
	return eventID + " " + at.UTC().Format(time.RFC3339) + " " + string(via)
}

// ParseDrainStamp reads a drain-signalled annotation; via is empty in stamps written before
// it was recorded.
func ParseDrainStamp(v string) (eventID string, at time.Time, via Mode, ok bool) {
	f := strings.Fields(v)
	if len(f) < 2 {
		return "", time.Time{}, "", false
	}
	at, err := time.Parse(time.RFC3339, f[1])
	if err != nil {
		return "", time.Time{}, "", false
	}
	if len(f) > 2 {
		via = Mode(f[2])
	}
	return f[0], at, via, true
}

// Drain, Defer and Ignore take quiet to leave out the per-instance Kubernetes Events: a bulk
// event is summarised on its NodePools instead (Summary).

// Drain signals Karpenter to drain the instance. It returns already=true, and signals
// nothing, when the instance is already being drained (by this event or another): the
// NodeClaim is being deleted or carries the router's drain-signalled annotation. It reads
// the NodeClaim from the cache; the per-instance lock and an in-memory note of recent drains
// cover the moment before the cache shows a drain this process signalled.
func (s *Signaller) Drain(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved, quiet bool) (already bool, err error) {
	s.locks.LockKey(d.InstanceID)
	defer func() { _ = s.locks.UnlockKey(d.InstanceID) }()

	claim := res.NodeClaim
	if claim != nil && (cluster.Draining(claim) || s.signalledRecently(d.InstanceID)) {
		return true, nil
	}
	via := s.Via(ev)
	stamp := func() error {
		if claim == nil {
			return nil
		}
		return s.update(ctx, claim, func(nc *karpv1.NodeClaim) bool {
			ds := Deferrals(nc)
			ds = slices.DeleteFunc(ds, func(x Deferral) bool { return x.Key == DeferralKey(ev) || x.EventID == ev.ID })
			setDeferrals(nc, ds)
			nc.Annotations[cluster.AnnotationDrainSignalled] = DrainStamp(ev.ID, s.clock.Now(), via)
			return true
		})
	}
	switch via {
	case ModeForward:
		body, err := s.forwardBody(ev, d.InstanceID)
		if err != nil {
			return false, err
		}
		if s.forward == nil {
			return false, errNoBatcher
		}
		if err := s.forward.send(ctx, string(body)); err != nil {
			return false, fmt.Errorf("forwarding event %s for %s to Karpenter: %w", ev.ID, d.InstanceID, err)
		}
		s.remember(d.InstanceID)
		if err := stamp(); err != nil && !apierrors.IsNotFound(err) {
			// The signal went out; only the record failed. Report it, but do not retry the
			// signal: the NodeClaim is being drained.
			s.event(res, corev1.EventTypeWarning, ReasonDrained, "%s; recording it on the NodeClaim failed: %v", d.Reason, err)
			return false, nil
		}
	case ModeDeleteNodeClaim:
		if claim == nil {
			return false, fmt.Errorf("instance %s has a Node but no NodeClaim: nothing to delete", d.InstanceID)
		}
		// With deferral records to clear: the stamp first, from the cached object (one PATCH,
		// no conflict), then the DELETE; should the DELETE fail, the deferral controller deletes
		// a stamped NodeClaim that is not deleting within the confirmation bound. Without
		// records the DELETE alone records the drain: a deleting NodeClaim counts as draining,
		// and a redelivered event skips it.
		if len(Deferrals(claim)) > 0 {
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
	id, _, via, _ := ParseDrainStamp(nc.Annotations[cluster.AnnotationDrainSignalled])
	if via != ModeForward {
		return false, nil
	}
	if err := s.update(ctx, nc, func(c *karpv1.NodeClaim) bool {
		c.Annotations[cluster.AnnotationDrainSignalled] = DrainStamp(id, s.clock.Now(), ModeDeleteNodeClaim)
		return true
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
	key := DeferralKey(ev)
	entry := Deferral{EventID: ev.ID, Key: key, Kind: ev.Kind, Until: d.Until.UTC(), Reason: d.Reason, State: StateDeferred,
		Hold: d.Hold, Image: holdImage(d), PDBs: gates.HeldPDBs(d), Match: Match(ev), Event: body}
	err = s.update(ctx, res.NodeClaim, func(nc *karpv1.NodeClaim) bool {
		ds := Deferrals(nc)
		found := false
		for i := range ds {
			switch {
			case ds[i].EventID == ev.ID:
				found = true
				if sameDeferral(ds[i], entry) {
					return false
				}
				ds[i] = entry
			case ds[i].Key == key && ds[i].State == StateDeferred:
				ds[i].State = StateSuperseded // an older update of the same Health event
			}
		}
		if !found {
			ds = append(ds, entry)
		}
		setDeferrals(nc, ds)
		changed = true
		return true
	})
	if err != nil {
		return false, fmt.Errorf("recording deferral on nodeclaim %s: %w", res.NodeClaim.Name, err)
	}
	if changed && !quiet {
		s.event(res, eventType(d), ReasonDeferred, "%s (%s) deferred until %s: %s", ev.Kind, ev.ID, d.Until.UTC().Format(time.RFC3339), summary(d))
	}
	return changed, nil
}

func sameDeferral(a, b Deferral) bool {
	return a.EventID == b.EventID && a.Key == b.Key && a.Kind == b.Kind && a.Until.Equal(b.Until) && a.Reason == b.Reason &&
		a.State == b.State && a.Hold == b.Hold && a.Image == b.Image && slices.Equal(a.PDBs, b.PDBs) && a.Match == b.Match && string(a.Event) == string(b.Event)
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
	if res.NodeClaim != nil {
		var cancelled []string
		err := s.update(ctx, res.NodeClaim, func(nc *karpv1.NodeClaim) bool {
			ds := Deferrals(nc)
			n := len(ds)
			ds = slices.DeleteFunc(ds, func(x Deferral) bool { return x.EventID == ev.ID && x.Active() })
			removed := len(ds) != n
			cancelled = cancelled[:0]
			for i := range ds {
				if !d.Cancel || ds[i].State != StateDeferred {
					continue
				}
				closedHealth := ev.Health != nil && ds[i].Key == DeferralKey(ev)
				running := ev.Kind == event.KindStateChange && ds[i].Kind == event.KindStateChange
				if closedHealth || running {
					ds[i].State = StateCancelled
					cancelled = append(cancelled, ds[i].EventID)
				}
			}
			if len(cancelled) == 0 && !removed {
				return false
			}
			setDeferrals(nc, ds)
			return true
		})
		if err != nil {
			return fmt.Errorf("updating deferrals on nodeclaim %s: %w", res.NodeClaim.Name, err)
		}
		if len(cancelled) > 0 {
			s.event(res, corev1.EventTypeNormal, ReasonDeferralCancelled, "%s (%s) cancels deferred %s: %s", ev.Kind, ev.ID, strings.Join(cancelled, ", "), d.Reason)
			return nil
		}
	}
	if !quiet {
		s.event(res, eventType(d), ReasonIgnored, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
	}
	return nil
}

// Drop removes one deferral record that can never be decided, with a Warning Event.
func (s *Signaller) Drop(ctx context.Context, nc *karpv1.NodeClaim, eventID, why string) error {
	err := s.update(ctx, nc, func(c *karpv1.NodeClaim) bool {
		ds := Deferrals(c)
		n := len(ds)
		ds = slices.DeleteFunc(ds, func(x Deferral) bool { return x.EventID == eventID })
		setDeferrals(c, ds)
		return len(ds) != n
	})
	if err != nil {
		return fmt.Errorf("dropping deferral %s of nodeclaim %s: %w", eventID, nc.Name, err)
	}
	s.recorder.Eventf(nc, nil, corev1.EventTypeWarning, ReasonDeferralDropped, "CancelDeferral", "deferral %s dropped: %s", eventID, why)
	return nil
}

// Prune removes the ended deferrals (cancelled, superseded) whose time has passed: they are
// kept until then only so that a late duplicate of their event is recognised.
func (s *Signaller) Prune(ctx context.Context, nc *karpv1.NodeClaim, now time.Time) error {
	return s.update(ctx, nc, func(c *karpv1.NodeClaim) bool {
		ds := Deferrals(c)
		n := len(ds)
		ds = slices.DeleteFunc(ds, func(x Deferral) bool { return !x.Active() && !now.Before(x.Until) })
		if len(ds) == n {
			return false
		}
		setDeferrals(c, ds)
		return true
	})
}

// Summary posts one Event on a NodePool for the instances of one event that got the same
// action: a bulk event (an AZ-wide maintenance naming thousands) is summarised, not told
// twice per instance; each instance's record stays on its NodeClaim.
func (s *Signaller) Summary(pool *karpv1.NodePool, ev event.Event, action policy.Action, n int, example policy.Decision) {
	if pool == nil || n == 0 {
		return
	}
	reason := map[policy.Action]string{policy.ActionDrain: ReasonDrained, policy.ActionDefer: ReasonDeferred, policy.ActionIgnore: ReasonIgnored}[action]
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

var pastTense = map[policy.Action]string{policy.ActionDrain: "drained", policy.ActionDefer: "deferred", policy.ActionIgnore: "ignored"}

// PolicyProblems posts a Warning Event on the NodePool for each ignored annotation.
func (s *Signaller) PolicyProblems(res cluster.Resolved, problems []string) {
	if res.NodePool == nil {
		return
	}
	for _, p := range problems {
		s.recorder.Eventf(res.NodePool, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "ReadPolicy", "%s", p)
	}
}

// update applies mutate to a copy of the NodeClaim as the caller (the cache) has it and
// patches it with an optimistic lock; on a conflict it reads the NodeClaim fresh and tries
// again. mutate returns false when there is nothing to change. One write per instance,
// and a read only when someone else wrote first.
func (s *Signaller) update(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*karpv1.NodeClaim) bool) error {
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
		base := cur.DeepCopy()
		next := cur.DeepCopy()
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		if !mutate(next) {
			return nil
		}
		return s.kube.Patch(ctx, next, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
}

func setDeferrals(nc *karpv1.NodeClaim, ds []Deferral) {
	if len(ds) == 0 {
		delete(nc.Annotations, cluster.AnnotationDeferred)
		return
	}
	b, _ := json.Marshal(ds) // a slice of plain structs always marshals
	nc.Annotations[cluster.AnnotationDeferred] = string(b)
}

// event posts an Event on the Node and the NodeClaim.
func (s *Signaller) event(res cluster.Resolved, typ, reason, format string, args ...any) {
	for _, obj := range []runtime.Object{nodeOrNil(res.Node), claimOrNil(res.NodeClaim)} {
		if obj != nil {
			s.recorder.Eventf(obj, nil, typ, reason, actions[reason], format, args...)
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
