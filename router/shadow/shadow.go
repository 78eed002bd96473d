// Package shadow is the router's dry run beside Karpenter: for a NodePool in shadow
// (healthrouter.io/mode=shadow, or every pool under --shadow) each event is decided as usual,
// and its would-be outcome is recorded instead of carried out:
//
//   - on the NodeClaim, in the healthrouter.io/shadow annotation (Outcomes, state "shadow"),
//     apart from the router's records: nothing the router acts on reads it, so a pool taken
//     out of shadow decides its next events as if it had never been in shadow;
//   - as a Kubernetes Event (ShadowDecision) on the NodeClaim and the Node;
//   - in health_router_shadow_decisions_total;
//   - in the Ledger, a ConfigMap that outlives the NodeClaim, beside what Karpenter did
//     meanwhile: the Watcher notes when each such NodeClaim began deleting.
//
// health-router status --shadow, and /shadow on the metrics port, pair the two per pool
// (Report). Nothing is carried out: no forward, no delete, no reboot, no deferral record, no
// node mark, no notice to pods, no move of the event at EC2; the webhook is told what would
// have been done.
package shadow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// Annotation held a NodeClaim's would-be outcomes in routers before the store: they are in
// its HealthRecord now (record.Memory.Shadow).
const Annotation = record.AnnotationShadow

// Version is the annotation's format.
const Version = 1

// State is the state of every shadow outcome: recorded, never carried out.
const State = "shadow"

// Kept is how many outcomes a NodeClaim keeps, newest last.
const Kept = 16

// Outcome is one would-be outcome of an event for one instance.
type Outcome struct {
	EventID string     `json:"event_id"`
	Key     string     `json:"key"`             // router/record's Key: the event across its updates
	Match   string     `json:"match,omitempty"` // router/record's Match: the maintenance across its sources
	Kind    event.Kind `json:"kind"`
	State   string     `json:"state"`
	// Action is what the router would have done; At when (the decision for a drain, the
	// until-time of a deferral), Hold what a deferral would have waited for.
	Action  policy.Action `json:"action"`
	At      time.Time     `json:"at"`
	Hold    policy.Hold   `json:"hold,omitempty"`
	Reason  string        `json:"reason"`
	Decided time.Time     `json:"decided"`
}

type claimValue struct {
	Version  int       `json:"version"`
	Outcomes []Outcome `json:"outcomes"`
}

// ErrUnreadable marks an annotation this router cannot read (a newer router's, or damaged).
var ErrUnreadable = errors.New("shadow outcomes this router cannot read")

// Read returns the would-be outcomes the router's memory of a NodeClaim holds.
func Read(mem record.Memory) ([]Outcome, error) {
	if len(mem.Shadow) == 0 {
		return nil, nil
	}
	var cv claimValue
	if err := json.Unmarshal(mem.Shadow, &cv); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
	}
	if cv.Version != Version {
		return nil, fmt.Errorf("%w: version %d, this router writes %d", ErrUnreadable, cv.Version, Version)
	}
	return cv.Outcomes, nil
}

// Encode writes outcomes as the memory's value.
func Encode(outs []Outcome) json.RawMessage {
	b, _ := json.Marshal(claimValue{Version: Version, Outcomes: outs}) // plain fields: cannot fail
	return b
}

// Recorded reports whether ev's would-be outcome is recorded among outs: a redelivery (its
// ID), or the same scheduled maintenance reported by the other source (its Match) under
// another key. An update of the event (a new ID under the same key) is decided again.
func Recorded(outs []Outcome, ev event.Event) bool {
	match, key := record.Match(ev), record.Key(ev)
	return slices.ContainsFunc(outs, func(o Outcome) bool {
		return o.EventID == ev.ID || (o.Key != key && record.SameMaintenance(o.Match, match))
	})
}

// Add adds o (replacing an outcome of the same event) and keeps the newest Kept.
func Add(outs []Outcome, o Outcome) []Outcome {
	outs = slices.DeleteFunc(slices.Clone(outs), func(x Outcome) bool { return x.EventID == o.EventID })
	outs = append(outs, o)
	if len(outs) > Kept {
		outs = outs[len(outs)-Kept:]
	}
	return outs
}

// OutcomeOf is the would-be outcome of decision d of ev, decided at now.
func OutcomeOf(ev event.Event, d policy.Decision, now time.Time) Outcome {
	at := now
	if d.Action == policy.ActionDefer && !d.Until.IsZero() {
		at = d.Until
	}
	return Outcome{EventID: ev.ID, Key: record.Key(ev), Match: record.Match(ev), Kind: ev.Kind, State: State,
		Action: d.Action, At: at.UTC(), Hold: d.Hold, Reason: d.Reason, Decided: now.UTC()}
}
