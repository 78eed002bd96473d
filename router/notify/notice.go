package notify

import (
	"fmt"
	"slices"
	"strings"
	"time"

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
	// receipt, the decided instance after a decision.
	Instances []string `json:"instances"`
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
	case policy.HoldPacing, policy.HoldRepairCutoff, policy.HoldCheck, policy.HoldPDB, policy.HoldAlerts:
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
