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
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
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

// Deferral is one deferred event, as recorded in the NodeClaim's healthrouter.io/deferred
// annotation (a JSON list).
type Deferral struct {
	EventID string     `json:"event_id"`
	Key     string     `json:"key"` // the Health eventArn, or the event ID
	Kind    event.Kind `json:"kind"`
	Until   time.Time  `json:"until"`
	Reason  string     `json:"reason"`
	State   string     `json:"state"`
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
	SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// Signaller carries out decisions.
type Signaller struct {
	kube     client.Client // writes; reads through the cache
	fresh    client.Reader // uncached reads, before writes that must not race
	mode     Mode
	sqs      sendAPI
	queueURL string // Karpenter's interruption queue, for ModeForward
	recorder events.EventRecorder
	clock    clock.Clock
	locks    keymutex.KeyMutex // one drain at a time per instance: duplicates signal once
}

// New returns a Signaller. sqsClient and karpenterQueueURL are used in ModeForward only.
func New(kube client.Client, fresh client.Reader, mode Mode, sqsClient sendAPI, karpenterQueueURL string, recorder events.EventRecorder, clk clock.Clock) *Signaller {
	return &Signaller{kube: kube, fresh: fresh, mode: mode, sqs: sqsClient, queueURL: karpenterQueueURL, recorder: recorder, clock: clk, locks: keymutex.NewHashed(0)}
}

// Mode returns the signalling mode.
func (s *Signaller) Mode() Mode { return s.mode }

// Drain signals Karpenter to drain the instance. It returns already=true, and signals
// nothing, when the instance is already being drained (by this event or another): the
// NodeClaim is being deleted or carries the router's drain-signalled annotation.
func (s *Signaller) Drain(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved) (already bool, err error) {
	s.locks.LockKey(d.InstanceID)
	defer func() { _ = s.locks.UnlockKey(d.InstanceID) }()

	var claim *karpv1.NodeClaim
	if res.NodeClaim != nil {
		claim = &karpv1.NodeClaim{}
		err := s.fresh.Get(ctx, client.ObjectKeyFromObject(res.NodeClaim), claim)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil // gone: nothing left to drain
		case err != nil:
			return false, fmt.Errorf("reading nodeclaim %s: %w", res.NodeClaim.Name, err)
		case !claim.DeletionTimestamp.IsZero() || claim.Annotations[cluster.AnnotationDrainSignalled] != "":
			return true, nil
		}
	}
	switch s.mode {
	case ModeForward:
		body, err := Restrict(ev.Body, d.InstanceID)
		if err != nil {
			return false, err
		}
		if _, err := s.sqs.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(s.queueURL), MessageBody: aws.String(string(body))}); err != nil {
			return false, fmt.Errorf("forwarding event %s for %s to Karpenter: %w", ev.ID, d.InstanceID, err)
		}
	case ModeDeleteNodeClaim:
		if claim == nil {
			return false, fmt.Errorf("instance %s has a Node but no NodeClaim: nothing to delete", d.InstanceID)
		}
		if err := s.kube.Delete(ctx, claim); err != nil && !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("deleting nodeclaim %s: %w", claim.Name, err)
		}
	}
	if claim != nil {
		stamp := ev.ID + " " + s.clock.Now().UTC().Format(time.RFC3339)
		err := s.update(ctx, claim, func(nc *karpv1.NodeClaim) bool {
			ds := Deferrals(nc)
			ds = slices.DeleteFunc(ds, func(x Deferral) bool { return x.Key == DeferralKey(ev) })
			setDeferrals(nc, ds)
			nc.Annotations[cluster.AnnotationDrainSignalled] = stamp
			return true
		})
		if err != nil && !apierrors.IsNotFound(err) {
			// The signal went out; only the record failed. Report it, but do not retry the
			// signal: the NodeClaim is being drained.
			s.event(res, corev1.EventTypeWarning, ReasonDrained, "%s; recording it on the NodeClaim failed: %v", d.Reason, err)
			return false, nil
		}
	}
	s.event(res, eventType(d), ReasonDrained, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
	if res.NodeClass != nil {
		for _, c := range d.Checks {
			if !c.Passed {
				s.recorder.Eventf(res.NodeClass, nil, corev1.EventTypeWarning, ReasonReplacementUnsound, "Drain", "drained %s for %s although %s: %s", d.InstanceID, ev.Kind, c.Name, c.Reason)
			}
		}
	}
	return false, nil
}

// Defer records the deferral on the NodeClaim. changed is false when the same deferral was
// already recorded (a redelivery), so that Events are not repeated.
func (s *Signaller) Defer(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved) (changed bool, err error) {
	if res.NodeClaim == nil {
		s.event(res, corev1.EventTypeNormal, ReasonDeferred, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
		return true, nil
	}
	key := DeferralKey(ev)
	err = s.update(ctx, res.NodeClaim, func(nc *karpv1.NodeClaim) bool {
		ds := Deferrals(nc)
		entry := Deferral{EventID: ev.ID, Key: key, Kind: ev.Kind, Until: d.Until.UTC(), Reason: d.Reason, State: StateDeferred}
		found := false
		for i := range ds {
			switch {
			case ds[i].EventID == ev.ID:
				found = true
				if ds[i] == entry {
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
	if changed {
		s.event(res, eventType(d), ReasonDeferred, "%s (%s) deferred until %s: %s", ev.Kind, ev.ID, d.Until.UTC().Format(time.RFC3339), summary(d))
	}
	return changed, nil
}

// Ignore records an ignored event, and cancels the deferrals it ends: a closed Health event
// cancels its own; a running instance cancels deferred state changes.
func (s *Signaller) Ignore(ctx context.Context, ev event.Event, d policy.Decision, res cluster.Resolved) error {
	if d.Cancel && res.NodeClaim != nil {
		var cancelled []string
		err := s.update(ctx, res.NodeClaim, func(nc *karpv1.NodeClaim) bool {
			ds := Deferrals(nc)
			cancelled = cancelled[:0]
			for i := range ds {
				if ds[i].State != StateDeferred {
					continue
				}
				closedHealth := ev.Health != nil && ds[i].Key == DeferralKey(ev)
				running := ev.Kind == event.KindStateChange && ds[i].Kind == event.KindStateChange
				if closedHealth || running {
					ds[i].State = StateCancelled
					cancelled = append(cancelled, ds[i].EventID)
				}
			}
			if len(cancelled) == 0 {
				return false
			}
			setDeferrals(nc, ds)
			return true
		})
		if err != nil {
			return fmt.Errorf("cancelling deferrals on nodeclaim %s: %w", res.NodeClaim.Name, err)
		}
		if len(cancelled) > 0 {
			s.event(res, corev1.EventTypeNormal, ReasonDeferralCancelled, "%s (%s) cancels deferred %s: %s", ev.Kind, ev.ID, strings.Join(cancelled, ", "), d.Reason)
			return nil
		}
	}
	s.event(res, eventType(d), ReasonIgnored, "%s (%s): %s", ev.Kind, ev.ID, summary(d))
	return nil
}

// PolicyProblems posts a Warning Event on the NodePool for each ignored annotation.
func (s *Signaller) PolicyProblems(res cluster.Resolved, problems []string) {
	if res.NodePool == nil {
		return
	}
	for _, p := range problems {
		s.recorder.Eventf(res.NodePool, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "ReadPolicy", "%s", p)
	}
}

// update applies mutate to a fresh copy of the NodeClaim and patches it with an optimistic
// lock, retrying on conflict; mutate returns false when there is nothing to change.
func (s *Signaller) update(ctx context.Context, nc *karpv1.NodeClaim, mutate func(*karpv1.NodeClaim) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &karpv1.NodeClaim{}
		if err := s.fresh.Get(ctx, client.ObjectKeyFromObject(nc), cur); err != nil {
			return err
		}
		base := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		if !mutate(cur) {
			return nil
		}
		return s.kube.Patch(ctx, cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
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

// Restrict returns the event body naming only instanceID, for forwarding to Karpenter: a
// Health event keeps the affected entity and resource of that instance only; other kinds
// name one instance already and pass unchanged.
func Restrict(body []byte, instanceID string) ([]byte, error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("restricting event to %s: %w", instanceID, err)
	}
	var source string
	_ = json.Unmarshal(env["source"], &source)
	if source != "aws.health" {
		return body, nil
	}
	var detail map[string]json.RawMessage
	if err := json.Unmarshal(env["detail"], &detail); err != nil {
		return nil, fmt.Errorf("restricting event to %s: %w", instanceID, err)
	}
	var entities []map[string]json.RawMessage
	if err := json.Unmarshal(detail["affectedEntities"], &entities); err != nil {
		return nil, fmt.Errorf("restricting event to %s: affectedEntities: %w", instanceID, err)
	}
	kept := entities[:0]
	for _, e := range entities {
		var v string
		_ = json.Unmarshal(e["entityValue"], &v)
		if v == instanceID {
			kept = append(kept, e)
		}
	}
	if len(kept) == 0 {
		return nil, errors.New("restricting event: instance " + instanceID + " is not among its affected entities")
	}
	detail["affectedEntities"], _ = json.Marshal(kept[:1])
	env["detail"], _ = json.Marshal(detail)
	env["resources"], _ = json.Marshal([]string{instanceID})
	return json.Marshal(env)
}
