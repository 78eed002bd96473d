package event

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"time"
)

// MaxBodyBytes is the largest body the router parses: EventBridge caps an event at 256 KiB,
// so anything larger did not come from a rule and is rejected before it is decoded.
const MaxBodyBytes = 256 * 1024

// key identifies a parser, as Karpenter's interruption controller keys its parsers.
type key struct{ source, detailType string }

type parser func(env envelope, ev *Event) error

// awsParsers are the kinds AWS sends, through EventBridge, to the intake queue: the only ones
// a received body may be.
var awsParsers = map[key]parser{
	{"aws.health", "AWS Health Event"}:                                    parseHealth,
	{"aws.ec2", "EC2 Spot Instance Interruption Warning"}:                 parseSpot,
	{"aws.ec2", "EC2 Instance Rebalance Recommendation"}:                  parseRebalance,
	{"aws.ec2", "EC2 Instance State-change Notification"}:                 parseStateChange,
	{"aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"}: parseCapacityReservation,
	{"aws.ec2", "EC2 AMI State Change"}:                                   parseAMIStateChange,
	{"aws.ec2", DetailTypeCapacityBlockExpiration}:                        parseCapacityBlockExpiration,
	{"aws.ec2", DetailTypeCapacityBlockReservationExpiration}:             parseCapacityBlockExpiration,
}

// ownParsers are the router's own kinds: it builds them (its instance-status poller's
// findings) and keeps them in its deferral records, and nothing else sends them.
var ownParsers = map[key]parser{
	{SourceHealthRouter, DetailTypeInstanceStatus}: parseInstanceStatus,
}

// envelope is the EventBridge wrapper. Version is not required (some documented samples
// omit it) and resources may be a single string (the capacity-reservation sample).
type envelope struct {
	Version    string          `json:"version"`
	ID         string          `json:"id"`
	DetailType string          `json:"detail-type"`
	Source     string          `json:"source"`
	Account    string          `json:"account"`
	Time       string          `json:"time"`
	Region     string          `json:"region"`
	Resources  json.RawMessage `json:"resources"`
	Detail     json.RawMessage `json:"detail"`
}

// Parse decodes a body the router trusts: one of its own (a poller finding as the poller builds
// it, the event of a deferral record, a body it rewrote) or one ParseReceived accepted. Every
// kind parses, the router's own included. The error, when not nil, is a *RejectError.
func Parse(body []byte) (Event, error) { return parse(body, true) }

// ParseReceived decodes a body received from outside the router (a message of the intake
// queue): as Parse, but the router's own kinds are refused as kinds it has no parser for
// (ReasonUnknownKind, naming the source). No AWS service sends them, so one on the queue is
// forged or misrouted, and taken as the poller's it would report any instance impaired to
// whoever can send to the queue. The error, when not nil, is a *RejectError.
func ParseReceived(body []byte) (Event, error) { return parse(body, false) }

// parse decodes a body with the AWS parsers and, when own, the router's own.
func parse(body []byte, own bool) (Event, error) {
	if len(body) > MaxBodyBytes {
		return Event{}, reject(ReasonOversized, "%d bytes, more than the %d an EventBridge event can have", len(body), MaxBodyBytes)
	}
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&env); err != nil {
		return Event{}, reject(ReasonMalformed, "not an EventBridge event: %v", err)
	}
	if dec.More() {
		return Event{}, reject(ReasonMalformed, "trailing data after the event")
	}
	if env.Source == "" || env.DetailType == "" {
		return Event{}, reject(ReasonMalformed, "no source or detail-type")
	}
	if env.ID == "" {
		return Event{}, reject(ReasonMalformed, "no id")
	}
	if env.Version != "" && env.Version != "0" {
		return Event{}, reject(ReasonUnsupported, "envelope version %q", env.Version)
	}
	// From here on a rejected event keeps its identity, for the dead-letter record.
	known := Event{ID: env.ID, Kind: KindUnknown, Source: env.Source, DetailType: env.DetailType, Account: env.Account, Region: env.Region}
	k := key{env.Source, env.DetailType}
	p, ok := awsParsers[k]
	if !ok && own {
		p, ok = ownParsers[k]
	}
	switch {
	case !ok && env.Source == SourceHealthRouter:
		return known, reject(ReasonUnknownKind, "source %q detail-type %q is the router's own (its instance-status poller builds it), never received from the queue: this one is forged or misrouted", env.Source, env.DetailType)
	case !ok:
		return known, reject(ReasonUnknownKind, "no parser for source %q detail-type %q", env.Source, env.DetailType)
	}
	t, err := time.Parse(time.RFC3339, env.Time)
	if err != nil {
		return known, reject(ReasonInvalid, "time %q is not RFC 3339", env.Time)
	}
	if len(env.Detail) == 0 || env.Detail[0] != '{' {
		return known, reject(ReasonMalformed, "detail is not an object")
	}
	if _, err := resources(env.Resources); err != nil {
		return known, err
	}
	ev := known
	ev.Time, ev.Body, ev.Kind = t.UTC(), body, ""
	if err := p(env, &ev); err != nil {
		return known, err
	}
	return ev, nil
}

// CheckOrigin rejects an event about another account or region than the router serves; an
// empty expectation matches anything. An AWS Health event of the organizational view is about
// its detail.affectedAccount and detail.eventRegion, not the management account and region it
// was delivered to (OriginAccount, OriginRegion).
func CheckOrigin(ev Event, account, region string) error {
	if got := ev.OriginAccount(); account != "" && got != account {
		return reject(ReasonForeign, "account %q, the router serves %q", got, account)
	}
	if got := ev.OriginRegion(); region != "" && got != region {
		return reject(ReasonForeign, "region %q, the router serves %q", got, region)
	}
	return nil
}

// resources accepts the documented array, or the single string of the capacity-reservation
// sample; anything else is ambiguous.
func resources(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	return nil, reject(ReasonMalformed, "resources is neither a list of strings nor a string")
}

var instanceIDPattern = regexp.MustCompile(`^i-[0-9a-f]{8}([0-9a-f]{9})?$`)

// IsInstanceID reports whether s is an EC2 instance ID (i- and 8 or 17 hex digits).
func IsInstanceID(s string) bool { return instanceIDPattern.MatchString(s) }

func instanceID(id string) ([]string, error) {
	if !IsInstanceID(id) {
		return nil, reject(ReasonInvalid, "instance-id %q is not an EC2 instance ID", id)
	}
	return []string{id}, nil
}

// healthTimeLayouts are the forms AWS Health uses: RFC 1123 with one- or two-digit days;
// RFC 3339 is accepted too, as the Health API returns it.
var healthTimeLayouts = []string{"Mon, 2 Jan 2006 15:04:05 MST", "Mon, 2 Jan 2006 15:04:05 -0700", time.RFC3339}

func parseHealthTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, l := range healthTimeLayouts {
		if t, err := time.Parse(l, strings.TrimSpace(s)); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, reject(ReasonInvalid, "%s %q is neither RFC 1123 nor RFC 3339", field, s)
}

func decodeDetail(env envelope, v any) error {
	if err := json.Unmarshal(env.Detail, v); err != nil {
		return reject(ReasonMalformed, "%s detail: %v", env.DetailType, err)
	}
	return nil
}
