package event

import (
	"regexp"
	"strings"
	"time"
)

// InterruptionNotice is how long AWS waits after a Spot or capacity-reservation
// interruption warning before it acts.
const InterruptionNotice = 2 * time.Minute

type instanceDetail struct {
	InstanceID      string `json:"instance-id"`
	InstanceAction  string `json:"instance-action"`
	State           string `json:"state"`
	TerminationTime string `json:"instance-termination-time"`
}

func parseSpot(env envelope, ev *Event) error {
	var d instanceDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	ids, err := instanceID(d.InstanceID)
	if err != nil {
		return err
	}
	ev.Kind, ev.Instances, ev.InstanceAction = KindSpotInterruption, ids, d.InstanceAction
	ev.Deadline = ev.Time.Add(InterruptionNotice)
	return nil
}

func parseRebalance(env envelope, ev *Event) error {
	var d instanceDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	ids, err := instanceID(d.InstanceID)
	if err != nil {
		return err
	}
	ev.Kind, ev.Instances = KindRebalance, ids
	return nil
}

func parseStateChange(env envelope, ev *Event) error {
	var d instanceDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	ids, err := instanceID(d.InstanceID)
	if err != nil {
		return err
	}
	// An exact match: NTH matched states by substring, so that an empty state matched.
	s := InstanceState(d.State)
	if !instanceStates[s] {
		return reject(ReasonInvalid, "instance state %q is not an EC2 instance state", d.State)
	}
	ev.Kind, ev.Instances, ev.State = KindStateChange, ids, s
	return nil
}

func parseCapacityReservation(env envelope, ev *Event) error {
	var d instanceDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	ids, err := instanceID(d.InstanceID)
	if err != nil {
		return err
	}
	ev.Kind, ev.Instances, ev.InstanceAction = KindCapacityReservation, ids, d.InstanceAction
	ev.Deadline = ev.Time.Add(InterruptionNotice)
	if d.TerminationTime != "" {
		t, err := time.Parse(time.RFC3339, d.TerminationTime)
		if err != nil {
			return reject(ReasonInvalid, "instance-termination-time %q is not RFC 3339", d.TerminationTime)
		}
		ev.Deadline = t.UTC()
	}
	return nil
}

// amiStates are the states EC2 AMI State Change reports (there is no event for pending).
var amiStates = map[string]bool{"available": true, "failed": true, "deregistered": true, "disabled": true}

func parseAMIStateChange(env envelope, ev *Event) error {
	var d struct {
		ImageID      string `json:"ImageId"`
		State        string `json:"State"`
		ErrorMessage string `json:"ErrorMessage"`
	}
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	if !strings.HasPrefix(d.ImageID, "ami-") {
		return reject(ReasonInvalid, "ImageId %q is not an AMI ID", d.ImageID)
	}
	if !amiStates[d.State] {
		return reject(ReasonInvalid, "AMI state %q", d.State)
	}
	ev.Kind = KindAMIStateChange
	ev.Image = &Image{ID: d.ImageID, State: d.State, Error: d.ErrorMessage}
	return nil
}

// DetailTypeCapacityBlockExpiration is EC2's warning that a Capacity Block for ML ends, as
// EventBridge's reference of EC2's events names it; DetailTypeCapacityBlockReservationExpiration
// is the name some of EC2's user guide samples give it. Both parse, and the Terraform module's
// rule matches both (EC2's other detail-types begin "EC2 "; these do not).
const (
	DetailTypeCapacityBlockExpiration            = "Capacity Block Expiration Warning"
	DetailTypeCapacityBlockReservationExpiration = "Capacity Block Reservation Expiration Warning"
)

// Capacity Block timing: EC2 warns CapacityBlockWarning before the block's end, and begins
// terminating its instances CapacityBlockTerminationLead before the end (ten minutes after
// the warning).
const (
	CapacityBlockWarning         = 40 * time.Minute
	CapacityBlockTerminationLead = 30 * time.Minute
)

var reservationIDPattern = regexp.MustCompile(`^cr-[0-9a-f]{8}([0-9a-f]{9})?$`)

// parseCapacityBlockExpiration reads Capacity Block Expiration Warning: detail
// capacity-reservation-id and end-date (the block's end). Its Deadline is when EC2 begins to
// terminate the block's instances, CapacityBlockTerminationLead before the end; without an
// end-date, ten minutes after the warning. It names no instance: the pipeline finds the
// NodeClaims that carry the reservation (a body that named instances would be a claim about
// nodes the router does not take from a message).
func parseCapacityBlockExpiration(env envelope, ev *Event) error {
	var d struct {
		ReservationID string `json:"capacity-reservation-id"`
		EndDate       string `json:"end-date"`
	}
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	if !reservationIDPattern.MatchString(d.ReservationID) {
		return reject(ReasonInvalid, "capacity-reservation-id %q is not a capacity reservation ID", d.ReservationID)
	}
	ev.Kind, ev.Reservation = KindCapacityBlockExpiration, d.ReservationID
	ev.Deadline = ev.Time.Add(CapacityBlockWarning - CapacityBlockTerminationLead)
	if d.EndDate != "" {
		end, err := time.Parse(time.RFC3339, d.EndDate)
		if err != nil {
			return reject(ReasonInvalid, "end-date %q is not RFC 3339", d.EndDate)
		}
		ev.Deadline = end.UTC().Add(-CapacityBlockTerminationLead)
	}
	return nil
}
