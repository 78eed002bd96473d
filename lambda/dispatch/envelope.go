package dispatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// kind is what the dispatcher needs to know about an event to route it; the names are the
// router's event kinds.
type kind string

const (
	kindScheduledChange     kind = "scheduled-change"
	kindSpotInterruption    kind = "spot-interruption"
	kindRebalance           kind = "rebalance-recommendation"
	kindStateChange         kind = "state-change"
	kindCapacityReservation kind = "capacity-reservation-interruption"
	kindAMIStateChange      kind = "ami-state-change"
	kindCapacityBlock       kind = "capacity-block-expiration"
	kindUnknown             kind = "unknown"
)

// kinds is keyed by (source, detail-type), as the router's parsers are.
var kinds = map[[2]string]kind{
	{"aws.health", "AWS Health Event"}:                                    kindScheduledChange,
	{"aws.ec2", "EC2 Spot Instance Interruption Warning"}:                 kindSpotInterruption,
	{"aws.ec2", "EC2 Instance Rebalance Recommendation"}:                  kindRebalance,
	{"aws.ec2", "EC2 Instance State-change Notification"}:                 kindStateChange,
	{"aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"}: kindCapacityReservation,
	{"aws.ec2", "EC2 AMI State Change"}:                                   kindAMIStateChange,
	{"aws.ec2", "Capacity Block Expiration Warning"}:                      kindCapacityBlock, // EventBridge's reference
	{"aws.ec2", "Capacity Block Reservation Expiration Warning"}:          kindCapacityBlock, // some of EC2's samples
}

var instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]{8,17}$`)

// envelope is an EventBridge event kept as raw JSON fields, so that a restricted copy keeps
// every field the router may read, known or not.
type envelope struct {
	raw        []byte
	fields     map[string]json.RawMessage
	id         string
	source     string
	detailType string
	kind       kind
	// account and region are what the event is about: an AWS Health event's
	// detail.affectedAccount and detail.eventRegion where it has them (the organizational view,
	// received by the management or delegated-admin account), else the envelope's.
	account, region string
}

func parseEnvelope(body []byte) (envelope, error) {
	ev := envelope{raw: body}
	if err := json.Unmarshal(body, &ev.fields); err != nil {
		return ev, fmt.Errorf("not a JSON object: %w", err)
	}
	var head struct {
		ID         string `json:"id"`
		Source     string `json:"source"`
		DetailType string `json:"detail-type"`
		Account    string `json:"account"`
		Region     string `json:"region"`
		Detail     struct {
			AffectedAccount string `json:"affectedAccount"`
			EventRegion     string `json:"eventRegion"`
		} `json:"detail"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return ev, fmt.Errorf("reading id, source and detail-type: %w", err)
	}
	ev.id, ev.source, ev.detailType = head.ID, head.Source, head.DetailType
	ev.account, ev.region = head.Account, head.Region
	if head.Source == "aws.health" && head.Detail.AffectedAccount != "" {
		ev.account = head.Detail.AffectedAccount
	}
	if head.Source == "aws.health" && head.Detail.EventRegion != "" {
		ev.region = head.Detail.EventRegion
	}
	ev.kind = kindUnknown
	if k, ok := kinds[[2]string{head.Source, head.DetailType}]; ok {
		ev.kind = k
	}
	return ev, nil
}

// instances returns the instance IDs the event names, in order, without duplicates.
func (ev envelope) instances() []string {
	var ids []string
	add := func(id string) {
		if instanceIDPattern.MatchString(id) && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if ev.kind == kindScheduledChange {
		var detail struct {
			AffectedEntities []struct {
				EntityValue string `json:"entityValue"`
			} `json:"affectedEntities"`
		}
		_ = json.Unmarshal(ev.fields["detail"], &detail) // a bad detail names no instance
		for _, e := range detail.AffectedEntities {
			add(e.EntityValue)
		}
		for _, r := range ev.resources() {
			add(instanceOf(r))
		}
		return ids
	}
	var detail struct {
		InstanceID string `json:"instance-id"`
	}
	_ = json.Unmarshal(ev.fields["detail"], &detail)
	add(detail.InstanceID)
	return ids
}

// resources reads "resources" as a list, tolerating the single string some documented samples
// carry.
func (ev envelope) resources() []string {
	raw, ok := ev.fields["resources"]
	if !ok {
		return nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil && one != "" {
		return []string{one}
	}
	return nil
}

// instanceOf returns the instance ID in a resource: the ID itself or an instance ARN.
func instanceOf(resource string) string {
	if i := strings.LastIndex(resource, ":instance/"); i >= 0 {
		return resource[i+len(":instance/"):]
	}
	return resource
}

// restrictTo returns the event with detail.affectedEntities and resources limited to ids: the
// same envelope (id, time, every other field) for the cluster that owns those instances.
func (ev envelope) restrictTo(ids []string) ([]byte, error) {
	if ev.kind != kindScheduledChange {
		return nil, errors.New("only Health events name several instances")
	}
	keep := func(id string) bool { return slices.Contains(ids, id) }

	var detail map[string]json.RawMessage
	if err := json.Unmarshal(ev.fields["detail"], &detail); err != nil {
		return nil, fmt.Errorf("reading detail: %w", err)
	}
	var entities []map[string]json.RawMessage
	if err := json.Unmarshal(detail["affectedEntities"], &entities); err != nil {
		return nil, fmt.Errorf("reading detail.affectedEntities: %w", err)
	}
	kept := []map[string]json.RawMessage{}
	for _, e := range entities {
		var value string
		_ = json.Unmarshal(e["entityValue"], &value)
		if keep(value) {
			kept = append(kept, e)
		}
	}

	resources := []string{}
	for _, r := range ev.resources() {
		if keep(instanceOf(r)) {
			resources = append(resources, r)
		}
	}

	fields := maps.Clone(ev.fields)
	var err error
	if detail["affectedEntities"], err = json.Marshal(kept); err != nil {
		return nil, err
	}
	if fields["detail"], err = json.Marshal(detail); err != nil {
		return nil, err
	}
	if fields["resources"], err = json.Marshal(resources); err != nil {
		return nil, err
	}
	return json.Marshal(fields)
}
