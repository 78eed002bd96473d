package signal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
)

// canonicalVersion is the only EventBridge envelope version Karpenter keys its parsers by:
// a body without it is not parsed at all, and is deleted from Karpenter's queue as a no-op.
const canonicalVersion = "0"

// Canonical returns the EventBridge body to forward to Karpenter for one instance of ev:
// version "0", the event's own id, source, detail-type, account, region and time (RFC 3339),
// resources an array naming that instance only (its ARN as the input gave it, or one built
// from the event's partition, region and account) and a detail for that instance alone: a
// Health event's detail keeps that instance's affected entity only; every other kind's detail
// is built from the router's event model for that instance (detailFor), never copied from the
// input, so that a body kept in a deferral record and bound to its NodeClaim's instance names
// that instance and nothing a forged record put there. Whatever oddities of
// the input the parser tolerates (no version, resources as a single string, a bare instance
// ID as resource), Karpenter's parsers accept the result: an input it would reject is lost
// there without a trace, since Karpenter deletes a message it cannot parse.
func Canonical(ev event.Event, instanceID string) ([]byte, error) {
	c, err := NewCanonicalizer(ev)
	if err != nil {
		return nil, err
	}
	return c.Body(instanceID)
}

// Canonicalizer makes the canonical bodies of one event, parsing it once: an AWS Health event
// of an AZ-wide maintenance names ~4,000 instances in 235 KiB, and parsing it again for each
// instance made the bodies of a bulk event quadratic in its instances.
type Canonicalizer struct {
	ev        event.Event
	instances map[string]bool
	arns      map[string]string          // instance ID -> its ARN in the input's resources
	detail    map[string]json.RawMessage // Health: every field but affectedEntities, per entity below
	entities  map[string]json.RawMessage // Health: instance ID -> its (first) affected entity
	finding   json.RawMessage            // the router's own instance-status finding: its detail
}

// NewCanonicalizer parses ev's body once.
func NewCanonicalizer(ev event.Event) (*Canonicalizer, error) {
	var in struct {
		Resources json.RawMessage `json:"resources"`
		Detail    json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal(ev.Body, &in); err != nil {
		return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
	}
	c := &Canonicalizer{ev: ev, instances: make(map[string]bool, len(ev.Instances)), arns: instanceARNs(in.Resources)}
	if ev.Source == event.SourceHealthRouter {
		c.finding = in.Detail
	}
	for _, id := range ev.Instances {
		c.instances[id] = true
	}
	if !c.healthEntities() {
		// Every other kind names one instance in its detail, which Body builds for the instance.
		return c, nil
	}
	if err := json.Unmarshal(in.Detail, &c.detail); err != nil {
		return nil, fmt.Errorf("canonical body of event %s: detail: %w", ev.ID, err)
	}
	var entities []json.RawMessage
	if err := json.Unmarshal(c.detail["affectedEntities"], &entities); err != nil {
		return nil, fmt.Errorf("canonical body of event %s: detail.affectedEntities: %w", ev.ID, err)
	}
	c.entities = make(map[string]json.RawMessage, len(entities))
	for _, e := range entities {
		var entity struct {
			EntityValue string `json:"entityValue"`
		}
		// Trimmed as the parser trims it: " i-0a…" names the instance the event decided.
		if json.Unmarshal(e, &entity) == nil && c.entities[strings.TrimSpace(entity.EntityValue)] == nil {
			c.entities[strings.TrimSpace(entity.EntityValue)] = e
		}
	}
	return c, nil
}

// Body returns the canonical body for one instance of the event.
func (c *Canonicalizer) Body(instanceID string) ([]byte, error) {
	ev := c.ev
	if !c.instances[instanceID] {
		return nil, fmt.Errorf("canonical body of event %s: it does not name instance %s", ev.ID, instanceID)
	}
	var detail json.RawMessage
	if !c.healthEntities() {
		var err error
		if detail, err = detailFor(ev, c.finding, instanceID); err != nil {
			return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
		}
	} else {
		e := c.entities[instanceID]
		if e == nil {
			return nil, fmt.Errorf("canonical body of event %s: instance %s is not among the affected entities", ev.ID, instanceID)
		}
		one := make(map[string]json.RawMessage, len(c.detail))
		for k, v := range c.detail {
			one[k] = v
		}
		one["affectedEntities"], _ = json.Marshal([]json.RawMessage{e})
		var err error
		if detail, err = json.Marshal(one); err != nil {
			return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
		}
	}
	out := event.Envelope{
		Version:    canonicalVersion,
		ID:         ev.ID,
		DetailType: ev.DetailType,
		Source:     ev.Source,
		Account:    ev.Account,
		Time:       ev.Time.UTC().Format(time.RFC3339),
		Region:     ev.Region,
		Resources:  []string{instanceARN(ev, c.arns, instanceID)},
		Detail:     detail,
	}
	body, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
	}
	return body, nil
}

// instanceARNs returns the input's instance ARNs by instance ID (resources as an array or a
// single string).
func instanceARNs(raw json.RawMessage) map[string]string {
	var list []string
	raw = bytes.TrimSpace(raw)
	if json.Unmarshal(raw, &list) != nil {
		var one string
		if json.Unmarshal(raw, &one) == nil {
			list = []string{one}
		}
	}
	arns := make(map[string]string, len(list))
	for _, r := range list {
		if i := strings.LastIndex(r, ":instance/"); strings.HasPrefix(r, "arn:") && i > 0 {
			id := r[i+len(":instance/"):]
			if _, seen := arns[id]; !seen {
				arns[id] = r
			}
		}
	}
	return arns
}

// instanceARN is the input's ARN of instanceID, or one built when the input named the instance
// by ID only or not at all: in the account and region the event is about (an organizational
// view's affected account and event region, not the management account's).
func instanceARN(ev event.Event, arns map[string]string, instanceID string) string {
	if arn, ok := arns[instanceID]; ok {
		return arn
	}
	region := ev.OriginRegion()
	return fmt.Sprintf("arn:%s:ec2:%s:%s:instance/%s", partition(region), region, ev.OriginAccount(), instanceID)
}

// partition is the ARN partition of a region.
func partition(region string) string {
	switch {
	case strings.HasPrefix(region, "cn-"):
		return "aws-cn"
	case strings.HasPrefix(region, "us-gov-"):
		return "aws-us-gov"
	case strings.HasPrefix(region, "us-iso-"):
		return "aws-iso"
	case strings.HasPrefix(region, "us-isob-"):
		return "aws-iso-b"
	}
	return "aws"
}

// healthEntities reports whether the event is an AWS Health event, whose detail lists its
// instances in affectedEntities (restricted to one in each canonical body).
func (c *Canonicalizer) healthEntities() bool {
	return c.ev.Kind == event.KindScheduledChange && c.ev.Source != event.SourceHealthRouter
}

// detailFor builds the detail of an EC2 event (or of the router's own instance-status finding)
// for one instance from the event model: the fields Karpenter's parsers read (instance-id,
// instance-action, state) and the ones the router's own parser reads back (a reservation
// interruption's termination time, a Capacity Block's end), nothing else. A stored body is
// data the router parsed once; only what the model kept of it goes out again.
func detailFor(ev event.Event, finding json.RawMessage, instanceID string) (json.RawMessage, error) {
	var d any
	switch ev.Kind {
	case event.KindSpotInterruption:
		d = struct {
			InstanceID     string `json:"instance-id"`
			InstanceAction string `json:"instance-action,omitempty"`
		}{instanceID, ev.InstanceAction}
	case event.KindCapacityReservation:
		d = struct {
			InstanceID      string `json:"instance-id"`
			InstanceAction  string `json:"instance-action,omitempty"`
			TerminationTime string `json:"instance-termination-time,omitempty"`
		}{instanceID, ev.InstanceAction, rfc3339(ev.Deadline)}
	case event.KindStateChange:
		d = struct {
			InstanceID string              `json:"instance-id"`
			State      event.InstanceState `json:"state"`
		}{instanceID, ev.State}
	case event.KindRebalance:
		d = struct {
			InstanceID string `json:"instance-id"`
		}{instanceID}
	case event.KindCapacityBlockExpiration:
		// It names a reservation, not an instance: the pipeline found this NodeClaim by it.
		end := ""
		if !ev.Deadline.IsZero() {
			end = rfc3339(ev.Deadline.Add(event.CapacityBlockTerminationLead))
		}
		d = struct {
			ReservationID string `json:"capacity-reservation-id"`
			EndDate       string `json:"end-date,omitempty"`
		}{ev.Reservation, end}
	default:
		if ev.Source != event.SourceHealthRouter {
			return nil, fmt.Errorf("no detail for a %s event of %s", ev.Kind, ev.Source)
		}
		// The router's own finding: its typed detail, bound to the instance.
		return event.FindingDetail(finding, instanceID)
	}
	return json.Marshal(d)
}

// rfc3339 formats t in UTC ("" for zero).
func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
