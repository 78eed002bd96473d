package event

import (
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
