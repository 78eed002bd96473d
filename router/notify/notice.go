package notify

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// Phase is when in an event's life a notice is sent.
type Phase string

const (
	// PhaseReceived: the router has the event, before any decision (one notice per event).
	PhaseReceived Phase = "received"
	// PhaseDecided: the router decided what to do with one instance of the event.
	PhaseDecided Phase = "decided"
	// PhaseShadow: the router decided one instance of a pool in shadow: Action is what it
	// would have done; nothing was carried out.
	PhaseShadow Phase = "shadow"
)

// Notice is what a webhook is told: the data a template renders. Its JSON form (the template
// `{{json .}}`) uses the tags below.
type Notice struct {
	Phase   Phase      `json:"phase"`
	Cluster string     `json:"cluster,omitempty"`
	EventID string     `json:"eventId"`
	Kind    event.Kind `json:"kind"`
	// Summary says in one line what AWS reported, whatever the kind.
	Summary string `json:"summary"`
	// Instances are the instances the notice is about: every instance of the event on
	// receipt (the first maxInstances), the decided instance after a decision.
	Instances []string `json:"instances"`
	// MoreInstances counts the instances of the event left out of Instances.
	MoreInstances int `json:"moreInstances,omitempty"`
	// Node, NodePool, Action, Hold, Reason, Until, Cancel and Warnings are those of the
	// decision; empty on receipt.
	Node     string        `json:"node,omitempty"`
	NodePool string        `json:"nodepool,omitempty"`
	Action   policy.Action `json:"action,omitempty"`
	Hold     policy.Hold   `json:"hold,omitempty"`
	Reason   string        `json:"reason,omitempty"`
	Cancel   bool          `json:"cancel,omitempty"`
	// Until is when a deferred instance is decided again, at the latest.
	Until time.Time `json:"until,omitzero"`
	// Deadline is when AWS acts on the instance; zero when it does not.
	Deadline time.Time `json:"deadline,omitzero"`
	// Time is the event's time, as AWS (or the instance-status poller) stamped it.
	Time     time.Time `json:"time,omitzero"`
	Warnings []string  `json:"warnings,omitempty"`
}

// Received is the notice of an event on receipt: one per event, naming all its instances,
// so that a bulk maintenance of 200 instances is one message, not 200.
func Received(ev event.Event, cluster string) Notice {
	return Notice{
		Phase: PhaseReceived, Cluster: cluster, EventID: ev.ID, Kind: ev.Kind,
		Summary: Summary(ev), Instances: slices.Clone(ev.Instances), Deadline: ev.Deadline, Time: ev.Time,
	}
}

// FromDecision is the notice of one decision d of ev.
func FromDecision(ev event.Event, d policy.Decision, cluster string) Notice {
	kind := d.Kind
	if kind == "" {
		kind = ev.Kind
	}
	deadline := d.Deadline
	if deadline.IsZero() {
		deadline = ev.Deadline
	}
	var instances []string
	if d.InstanceID != "" {
		instances = []string{d.InstanceID}
	}
	return Notice{
		Phase: PhaseDecided, Cluster: cluster, EventID: d.EventID, Kind: kind, Summary: Summary(ev),
		Instances: instances, Node: d.Node, NodePool: d.NodePool, Action: d.Action, Hold: d.Hold,
		Reason: d.Reason, Cancel: d.Cancel, Until: d.Until, Deadline: deadline, Time: ev.Time,
		Warnings: slices.Clone(d.Warnings),
	}
}

// Summary says in one line what an event reports, for every kind.
func Summary(ev event.Event) string {
	switch ev.Kind {
	case event.KindScheduledChange:
		h := ev.Health
		if h == nil {
			return "scheduled change"
		}
		from := "AWS Health"
		if ev.Source == event.SourceHealthRouter {
			from = "EC2 scheduled event" // found by the instance-status poller
		}
		s := fmt.Sprintf("%s %s", from, orUnknown(h.TypeCode))
		if h.Status != "" {
			s += fmt.Sprintf(" (%s)", h.Status)
		}
		if h.Scheduled != "" {
			s += fmt.Sprintf(": %s", h.Scheduled)
		}
		if !h.Start.IsZero() {
			s += fmt.Sprintf(", from %s", stamp(h.Start))
		}
		if !h.End.IsZero() {
			s += fmt.Sprintf(" to %s", stamp(h.End))
		}
		return s
	case event.KindCapacityBlockExpiration:
		return fmt.Sprintf("Capacity Block %s ends: EC2 terminates its instances from %s", orUnknown(ev.Reservation), stamp(ev.Deadline))
	case event.KindSpotInterruption:
		return "Spot interruption: EC2 reclaims the instance two minutes after the notice"
	case event.KindRebalance:
		return "EC2 rebalance recommendation: the Spot instance is at elevated risk of interruption"
	case event.KindStateChange:
		return fmt.Sprintf("instance state %s", orUnknown(string(ev.State)))
	case event.KindCapacityReservation:
		return fmt.Sprintf("capacity reservation interruption: instance action %s", orUnknown(ev.InstanceAction))
	case event.KindInstanceStatus:
		st := ev.Status
		if st == nil {
			return "instance status check impaired"
		}
		s := fmt.Sprintf("instance status %s, system status %s", orUnknown(st.InstanceStatus), orUnknown(st.SystemStatus))
		if !st.ImpairedSince.IsZero() {
			s += ", impaired since " + stamp(st.ImpairedSince)
		}
		return s
	case event.KindAMIStateChange:
		if ev.Image != nil {
			return fmt.Sprintf("AMI %s is %s", ev.Image.ID, orUnknown(ev.Image.State))
		}
	}
	return string(ev.Kind)
}

// Caps of a notice. Its fields are claims from outside (an event ID, an AWS Health type code)
// or grow with the cluster (the instances of an AZ-wide maintenance, a decision's warnings):
// a notice is read by people, waits in a queue of DefaultQueueSize, and its key is kept for
// deduplication, so each is bounded before it is queued.
const (
	// maxFieldBytes caps each text field and each warning: a reason or a warning the policy
	// writes is a sentence or two, a few hundred bytes; an ID or a name is shorter.
	maxFieldBytes = 1 << 10
	// maxInstances caps the instances a notice names (the rest are counted in
	// MoreInstances): a bulk maintenance of 200 instances is still named whole, one of 4,000
	// is not a list anyone reads in a chat message.
	maxInstances = 200
	// maxWarnings caps a decision's warnings (the rest are counted in a last one); a decision
	// has one or two.
	maxWarnings = 10
	// maxBodyBytes caps a rendered body. The default template renders a capped notice of
	// plain text in at most about 21 KiB (every field and warning at its cap, 200
	// instances); a notice whose fields are mostly characters that JSON or Slack escape to
	// several bytes can pass the cap, and so can a custom template: the notice then fails
	// (counted as a template failure) rather than sending what Slack would truncate (past
	// 40,000 characters) and Teams refuse (past 28 KB).
	maxBodyBytes = 32 << 10
)

// capped is n with each field within the caps above; a clipped field ends in clipMark.
func (n Notice) capped() Notice {
	if len(n.Instances) > maxInstances {
		n.MoreInstances += len(n.Instances) - maxInstances
		n.Instances = n.Instances[:maxInstances]
	}
	if len(n.Warnings) > maxWarnings {
		more := len(n.Warnings) - maxWarnings
		n.Warnings = append(n.Warnings[:maxWarnings:maxWarnings], fmt.Sprintf("%d more warnings not shown", more))
	}
	n.Instances = clipAll(n.Instances)
	n.Warnings = clipAll(n.Warnings)
	n.Cluster, n.EventID, n.Summary = clip(n.Cluster), clip(n.EventID), clip(n.Summary)
	n.Node, n.NodePool, n.Reason = clip(n.Node), clip(n.NodePool), clip(n.Reason)
	n.Kind, n.Action, n.Hold = event.Kind(clip(string(n.Kind))), policy.Action(clip(string(n.Action))), policy.Hold(clip(string(n.Hold)))
	return n
}

// clipMark ends a clipped field.
const clipMark = "… (clipped)"

// clip cuts s to maxFieldBytes on a rune boundary, marking the cut.
func clip(s string) string {
	if len(s) <= maxFieldBytes {
		return s
	}
	cut := maxFieldBytes - len(clipMark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + clipMark
}

// clipAll clips each of ss, copying ss only when one is clipped.
func clipAll(ss []string) []string {
	for i, s := range ss {
		if len(s) > maxFieldBytes {
			out := slices.Clone(ss)
			for j := i; j < len(out); j++ {
				out[j] = clip(out[j])
			}
			return out
		}
	}
	return ss
}

// key identifies a notice for deduplication: a redelivered event, or a re-decision that
// changed neither the action, nor what it waits for, nor (for a hold on a time) its
// until-time, has the same key.
func (n Notice) key() string {
	until := ""
	if !rechecks(n.Hold) {
		until = n.Until.UTC().Format(time.RFC3339Nano)
	}
	return strings.Join([]string{
		string(n.Phase), n.EventID, strings.Join(n.Instances, ","), string(n.Action), string(n.Hold), until,
	}, "\x00")
}

// rechecks reports whether a hold's Until is only when the router looks again at live state
// (a pacing slot, the repair cut-off, a failed check, a gate): it moves at each look while
// the hold stays the same (every minute under the repair cut-off), so a new one is no news.
// The Until of a window, a deadline or a restart-grace is a time people plan by: a new one is
// sent. A hold not listed here keeps its Until in the key: a notice too many, not one lost.
func rechecks(h policy.Hold) bool {
	switch h {
	case policy.HoldPacing, policy.HoldRepairCutoff, policy.HoldCheck, policy.HoldPDB, policy.HoldAlerts, policy.HoldInPlace, policy.HoldUrgentBreaker:
		return true
	}
	return false
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
