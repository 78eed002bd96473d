// Package event is the router's model of the EventBridge events it receives, with one
// parser per (source, detail-type). Parsing never panics: a body the router cannot act on
// becomes a *RejectError that names the reason, and the intake dead-letters it. The intake
// parses with ParseReceived, which knows only the kinds AWS sends; Parse also reads the
// router's own (its instance-status poller's findings), for the bodies the router wrote.
package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Kind is what happened, in the words of the NodePool annotations.
type Kind string

const (
	KindScheduledChange     Kind = "scheduled-change"
	KindSpotInterruption    Kind = "spot-interruption"
	KindRebalance           Kind = "rebalance-recommendation"
	KindStateChange         Kind = "state-change"
	KindCapacityReservation Kind = "capacity-reservation-interruption"
	KindAMIStateChange      Kind = "ami-state-change"
	// KindCapacityBlockExpiration is a Capacity Block for ML about to end: EC2 warns 40
	// minutes before the end and terminates the block's instances from 10 minutes later. The
	// event names the reservation, not its instances: the pipeline maps it to the NodeClaims
	// that carry the reservation.
	KindCapacityBlockExpiration Kind = "capacity-block-expiration"
	// KindInstanceStatus is an instance whose EC2 instance or system status check is
	// impaired, as the router's instance-status poller finds it (no EventBridge event exists).
	KindInstanceStatus Kind = "instance-status"
	KindUnknown        Kind = "unknown"
)

// InstanceKinds are the kinds that name instances and that a NodePool policy decides on.
var InstanceKinds = []Kind{KindScheduledChange, KindSpotInterruption, KindRebalance, KindStateChange, KindCapacityReservation, KindInstanceStatus, KindCapacityBlockExpiration}

// ScheduledType is the EC2 scheduled-event type that an AWS Health event code maps to
// (the codes EC2's DescribeInstanceStatus reports for the same maintenance).
type ScheduledType string

const (
	ScheduledInstanceReboot     ScheduledType = "instance-reboot"
	ScheduledSystemReboot       ScheduledType = "system-reboot"
	ScheduledInstanceStop       ScheduledType = "instance-stop"
	ScheduledInstanceRetirement ScheduledType = "instance-retirement"
	ScheduledSystemMaintenance  ScheduledType = "system-maintenance"
)

// ScheduledTypes lists every scheduled type, for annotation validation and documentation.
var ScheduledTypes = []ScheduledType{ScheduledInstanceReboot, ScheduledSystemReboot, ScheduledInstanceStop, ScheduledInstanceRetirement, ScheduledSystemMaintenance}

// InstanceState is an EC2 instance state from a state-change notification.
type InstanceState string

const (
	StatePending      InstanceState = "pending"
	StateRunning      InstanceState = "running"
	StateStopping     InstanceState = "stopping"
	StateStopped      InstanceState = "stopped"
	StateShuttingDown InstanceState = "shutting-down"
	StateTerminated   InstanceState = "terminated"
)

var instanceStates = map[InstanceState]bool{
	StatePending: true, StateRunning: true, StateStopping: true,
	StateStopped: true, StateShuttingDown: true, StateTerminated: true,
}

// Health status codes of an AWS Health event; each update of one event (same eventArn)
// arrives again with a new status or start time.
const (
	HealthUpcoming = "upcoming"
	HealthOpen     = "open"
	HealthClosed   = "closed"
)

// Event is one parsed EventBridge event.
type Event struct {
	ID         string    `json:"id"`
	Kind       Kind      `json:"kind"`
	Source     string    `json:"source"`
	DetailType string    `json:"detailType"`
	Account    string    `json:"account"`
	Region     string    `json:"region"`
	Time       time.Time `json:"time"`
	// Instances are the EC2 instance IDs the event names, in order, without duplicates.
	Instances []string `json:"instances,omitempty"`
	// Resolved are the instances an AWS Health report that is not a close names with the
	// entity status RESOLVED: the maintenance is over for them (ResolvedClose), while it goes
	// on for Instances.
	Resolved []string `json:"resolved,omitempty"`
	// Deadline is when AWS acts on the instances; zero when it does not act (a rebalance
	// recommendation, a state change that already happened, an AMI state change).
	Deadline time.Time `json:"deadline,omitzero"`

	Health *Health       `json:"health,omitempty"`
	State  InstanceState `json:"state,omitempty"`
	Image  *Image        `json:"image,omitempty"`
	// CapacityReservationAction is the capacity-reservation interruption's instance-action.
	InstanceAction string `json:"instanceAction,omitempty"`
	// Reservation is the Capacity Block (a capacity reservation ID) an expiration warning
	// names.
	Reservation string `json:"reservation,omitempty"`
	// Status is the instance-status finding of an instance-status event.
	Status *InstanceStatus `json:"instanceStatus,omitempty"`
	// Implausible says why the event does not fit the instance it names (a Spot warning for
	// an on-demand node): such an event is not trusted as urgent (Urgent is false), and is
	// decided as an ordinary drain, paced and gated. Set by the pipeline per instance.
	Implausible string `json:"implausible,omitempty"`
	// MovedFrom is the start a scheduled change was reported at before it moved (Moved: the
	// router moved it into a window, or EC2 holds it at another start than the report said),
	// the earliest when it moved more than once; zero when it did not. A report of that start
	// is the same maintenance, sent before the move.
	MovedFrom time.Time `json:"movedFrom,omitzero"`
	// RunsAgain says why a stopping or stopped state change is over: EC2 shows the instance
	// running (or pending) again, so it is a stop/start reported late, or a forged stop. Set
	// by the pipeline per instance, after asking EC2.
	RunsAgain string `json:"runsAgain,omitempty"`

	// Body is the event exactly as received, for forwarding to Karpenter.
	Body []byte `json:"-"`
	// FirstReceived is when SQS first delivered the message that carried the event
	// (ApproximateFirstReceiveTimestamp: set by SQS, not by the sender); zero for an event
	// that did not come from a queue. A wait the message bounds (an urgent state change EC2
	// does not answer about) is measured from it, so that no memory of it is kept and a
	// restart does not begin the wait again.
	FirstReceived time.Time `json:"-"`
}

// ResolvedClose is the close, for its Resolved instances, of an AWS Health report that
// resolves some of its entities: the same event (ID, ARN, start) as a closed report naming
// only them, so that it ends what was decided for them as a close of the event would. ok is
// false when nothing is resolved.
func (e Event) ResolvedClose() (Event, bool) {
	if e.Health == nil || len(e.Resolved) == 0 {
		return Event{}, false
	}
	c := e
	h := *e.Health
	h.Status = HealthClosed
	c.Health, c.Instances, c.Resolved = &h, slices.Clone(e.Resolved), nil
	return c, true
}

// Health is the AWS Health part of a scheduled-change event.
type Health struct {
	EventARN  string        `json:"eventArn"`
	TypeCode  string        `json:"eventTypeCode"`
	Category  string        `json:"eventTypeCategory"`
	Status    string        `json:"statusCode,omitempty"`
	Scheduled ScheduledType `json:"scheduledType,omitempty"`
	Start     time.Time     `json:"startTime,omitzero"`
	End       time.Time     `json:"endTime,omitzero"`
	// CommunicationID identifies one communication of the event: the copies and the pages of
	// one communication share it (a page names other entities), an update has a new one.
	CommunicationID string `json:"communicationId,omitempty"`
	// AffectedAccount and EventRegion are the account and region the event is about, in the
	// organizational view: the envelope's account is then the management or delegated-admin
	// account that received it, and its region the one it was delivered to.
	AffectedAccount string `json:"affectedAccount,omitempty"`
	EventRegion     string `json:"eventRegion,omitempty"`
}

// Image is the AMI of an EC2 AMI State Change event.
type Image struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Error string `json:"error,omitempty"`
}

// OriginAccount is the account the event is about: an AWS Health event's affectedAccount
// where it names one (the organizational view), else the envelope's account.
func (e Event) OriginAccount() string {
	if e.Health != nil && e.Health.AffectedAccount != "" {
		return e.Health.AffectedAccount
	}
	return e.Account
}

// OriginRegion is the region the event is about: an AWS Health event's eventRegion where it
// names one, else the envelope's region (where EventBridge delivered it).
func (e Event) OriginRegion() string {
	if e.Health != nil && e.Health.EventRegion != "" {
		return e.Health.EventRegion
	}
	return e.Region
}

// Urgent reports whether AWS acts within minutes, so that the event cannot wait for a
// window or for drain pacing: Spot and capacity-reservation interruptions (two-minute
// notice), a Capacity Block's expiration (ten minutes to the first terminations) and an
// instance that is already shutting down or terminated.
func (e Event) Urgent() bool {
	if e.Implausible != "" {
		return false
	}
	switch e.Kind {
	case KindSpotInterruption, KindCapacityReservation, KindCapacityBlockExpiration:
		return true
	case KindStateChange:
		return e.State == StateShuttingDown || e.State == StateTerminated
	}
	return false
}

// Reason says why a message was rejected; it travels with the message to the dead-letter queue.
type Reason string

const (
	ReasonMalformed   Reason = "malformed"    // not JSON, or not an EventBridge envelope
	ReasonUnknownKind Reason = "unknown-kind" // a (source, detail-type) the router has no parser for, or its own kind received from outside
	ReasonUnsupported Reason = "unsupported"  // a known source, but not something the router acts on
	ReasonInvalid     Reason = "invalid"      // a known kind with missing or contradictory fields
	ReasonForeign     Reason = "foreign"      // another account or region than the router's
	ReasonOversized   Reason = "oversized"    // larger than any real event
	// Reasons the intake gives when carrying an event out fails for good.
	ReasonUnrecordable     Reason = "unrecordable"      // its outcome cannot be recorded on the NodeClaim (refused by the API server for size)
	ReasonRetriesExhausted Reason = "retries-exhausted" // failed on every one of --max-receives deliveries (the detail says the last error)
	ReasonForeignSender    Reason = "foreign-sender"    // sent by a principal not in --sender-ids (the detail names it)
)

// RejectError is the outcome of a message the router cannot act on.
type RejectError struct {
	Reason Reason
	Detail string
}

func (e *RejectError) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Detail) }

func reject(r Reason, format string, args ...any) error {
	return &RejectError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// RejectReason returns the reason of a rejection, or "" when err is not one.
func RejectReason(err error) Reason {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// Envelope is an EventBridge event as the router writes one (a canonical body forwarded to
// Karpenter, a finding of its own poller): version "0", resources an array of strings, in
// EventBridge's own field order. Parsing reads the tolerant form (no version, resources as a
// single string).
type Envelope struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       string          `json:"time"`
	Region     string          `json:"region"`
	Resources  []string        `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}
