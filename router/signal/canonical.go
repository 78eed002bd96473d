package signal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
// from the event's partition, region and account) and the input's detail restricted to that
// instance (a Health event keeps that instance's affected entity only). Whatever oddities of
// the input the parser tolerates (no version, resources as a single string, a bare instance
// ID as resource), Karpenter's parsers accept the result: an input it would reject is lost
// there without a trace, since Karpenter deletes a message it cannot parse.
func Canonical(ev event.Event, instanceID string) ([]byte, error) {
	if !slices.Contains(ev.Instances, instanceID) {
		return nil, fmt.Errorf("canonical body of event %s: it does not name instance %s", ev.ID, instanceID)
	}
	var in struct {
		Resources json.RawMessage `json:"resources"`
		Detail    json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal(ev.Body, &in); err != nil {
		return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
	}
	detail := in.Detail
	if ev.Kind == event.KindScheduledChange {
		var err error
		if detail, err = restrictHealthDetail(in.Detail, instanceID); err != nil {
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
		Resources:  []string{instanceARN(ev, in.Resources, instanceID)},
		Detail:     detail,
	}
	body, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("canonical body of event %s: %w", ev.ID, err)
	}
	return body, nil
}

// restrictHealthDetail keeps, of a Health event's affected entities, the first one naming
// instanceID; every other field of the detail is kept as it was.
func restrictHealthDetail(raw json.RawMessage, instanceID string) (json.RawMessage, error) {
	var detail map[string]json.RawMessage
	if err := json.Unmarshal(raw, &detail); err != nil {
		return nil, fmt.Errorf("detail: %w", err)
	}
	var entities []json.RawMessage
	if err := json.Unmarshal(detail["affectedEntities"], &entities); err != nil {
		return nil, fmt.Errorf("detail.affectedEntities: %w", err)
	}
	for _, e := range entities {
		var entity struct {
			EntityValue string `json:"entityValue"`
		}
		if json.Unmarshal(e, &entity) == nil && entity.EntityValue == instanceID {
			detail["affectedEntities"], _ = json.Marshal([]json.RawMessage{e})
			return json.Marshal(detail)
		}
	}
	return nil, fmt.Errorf("instance %s is not among the affected entities", instanceID)
}

// instanceARN returns the input's ARN of instanceID (resources as an array or a single
// string), or builds it when the input named the instance by ID only or not at all.
func instanceARN(ev event.Event, raw json.RawMessage, instanceID string) string {
	var list []string
	raw = bytes.TrimSpace(raw)
	if json.Unmarshal(raw, &list) != nil {
		var one string
		if json.Unmarshal(raw, &one) == nil {
			list = []string{one}
		}
	}
	for _, r := range list {
		if strings.HasPrefix(r, "arn:") && strings.HasSuffix(r, ":instance/"+instanceID) {
			return r
		}
	}
	return fmt.Sprintf("arn:%s:ec2:%s:%s:instance/%s", partition(ev.Region), ev.Region, ev.Account, instanceID)
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
