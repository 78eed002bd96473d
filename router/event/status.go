package event

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The router's own EventBridge-shaped event for what its instance-status poller finds in
// EC2 DescribeInstanceStatus. No AWS service sends it: the poller builds it (StatusFinding.Event),
// the router keeps it in its deferral records and parses it again like any other body, so it
// goes through Parse exactly as an EventBridge event does. ParseReceived, the intake's parser,
// refuses it: from the queue it can only be forged.
//
//	{
//	  "version": "0",
//	  "id": "healthrouter.io/instance-status/i-0a1b2c3d4e5f60718/instance-event-0d59937288b749b32/2026-12-05T02:00:00Z",
//	  "detail-type": "EC2 Instance Status Finding",
//	  "source": "healthrouter.io",
//	  "account": "111122223333",
//	  "time": "2026-11-21T12:00:00Z",               // when the poller found it
//	  "region": "eu-west-1",
//	  "resources": ["arn:aws:ec2:eu-west-1:111122223333:instance/i-0a1b2c3d4e5f60718"],
//	  "detail": {
//	    "instance-id": "i-0a1b2c3d4e5f60718",
//	    "finding": "scheduled-event",              // or "impaired"
//	    // scheduled-event: EC2's event, as DescribeInstanceStatus reports it
//	    "code": "system-reboot",                   // instance-reboot | system-reboot | system-maintenance | instance-retirement | instance-stop
//	    "event-id": "instance-event-0d59937288b749b32",
//	    "not-before": "2026-12-05T02:00:00Z",
//	    "not-after": "2026-12-05T04:00:00Z",         // optional
//	    "description": "scheduled reboot",         // optional
//	    // impaired: the status checks, and since when (EC2's impairedSince, else first seen)
//	    "instance-status": "impaired",              // ok | impaired | insufficient-data | not-applicable | initializing
//	    "system-status": "ok",
//	    "impaired-since": "2026-11-21T11:57:00Z"
//	  }
//	}
//
// A scheduled-event finding parses into a scheduled-change Event shaped as the AWS Health
// event of the same maintenance would be (Health.Scheduled the code, Health.Start and
// Deadline the not-before, status upcoming), so that NodePool policy decides it the same
// way and the router recognises one maintenance reported by both (same instance, same
// Health.Scheduled, same Deadline to the second). An impaired finding parses into an
// instance-status Event with no deadline: AWS does not act on an impaired instance.
const (
	SourceHealthRouter       = "healthrouter.io"
	DetailTypeInstanceStatus = "EC2 Instance Status Finding"
	FindingScheduledEvent    = "scheduled-event"
	FindingImpaired          = "impaired"
	// FindingRecovered: an instance the poller reported impaired passes its checks again; it
	// cancels a repair the router holds (the repair cut-off).
	FindingRecovered           = "recovered"
	StatusImpaired             = "impaired"
	instanceStatusIDPrefix     = SourceHealthRouter + "/instance-status/"
	instanceStatusTypeCodeBase = "EC2_INSTANCE_STATUS_"
)

// statusValues are the summary statuses DescribeInstanceStatus reports.
var statusValues = []string{"ok", "impaired", "insufficient-data", "not-applicable", "initializing"}

// InstanceStatus is the impaired part of an instance-status Event.
type InstanceStatus struct {
	InstanceStatus string    `json:"instanceStatus,omitempty"`
	SystemStatus   string    `json:"systemStatus,omitempty"`
	ImpairedSince  time.Time `json:"impairedSince,omitzero"`
	// Recovered is set when the instance passes its checks again.
	Recovered bool `json:"recovered,omitempty"`
}

// StatusFinding is one thing the instance-status poller found for one instance.
type StatusFinding struct {
	InstanceID string
	// Finding is FindingScheduledEvent or FindingImpaired.
	Finding string
	// Time is when the poller found it; Account and Region are the router's, so that the
	// event passes CheckOrigin (either may be empty).
	Time            time.Time
	Account, Region string

	// A scheduled event: EC2's code, InstanceEventId, window and description.
	Code        ScheduledType
	EventID     string
	NotBefore   time.Time
	NotAfter    time.Time
	Description string

	// Impaired: the two summary statuses and since when the instance is impaired.
	InstanceStatus string
	SystemStatus   string
	ImpairedSince  time.Time
}

// statusDetail is the detail of the router's instance-status finding body.
type statusDetail struct {
	InstanceID     string `json:"instance-id"`
	Finding        string `json:"finding"`
	Code           string `json:"code,omitempty"`
	EventID        string `json:"event-id,omitempty"`
	NotBefore      string `json:"not-before,omitempty"`
	NotAfter       string `json:"not-after,omitempty"`
	Description    string `json:"description,omitempty"`
	InstanceStatus string `json:"instance-status,omitempty"`
	SystemStatus   string `json:"system-status,omitempty"`
	ImpairedSince  string `json:"impaired-since,omitempty"`
}

// ID returns the finding's event ID. It is the same for the same finding at every poll and
// across restarts (the instance, EC2's event ID and not-before; or the instance and since
// when it is impaired), and changes when EC2 reschedules the event.
func (f StatusFinding) ID() string {
	switch f.Finding {
	case FindingImpaired:
		return instanceStatusIDPrefix + f.InstanceID + "/impaired/" + stampUTC(f.ImpairedSince)
	case FindingRecovered:
		return instanceStatusIDPrefix + f.InstanceID + "/recovered/" + stampUTC(f.Time)
	}
	if ClosedDescription(f.Description) {
		// A completed or cancelled event is another message about the same maintenance.
		return instanceStatusIDPrefix + f.InstanceID + "/" + f.EventID + "/" + stampUTC(f.NotBefore) + "/closed"
	}
	return instanceStatusIDPrefix + f.InstanceID + "/" + f.EventID + "/" + stampUTC(f.NotBefore)
}

// TypeCode is the synthetic Health eventTypeCode of a scheduled-event finding, such as
// EC2_INSTANCE_STATUS_SYSTEM_REBOOT; it names the source in decisions and Events.
func TypeCode(code ScheduledType) string {
	return instanceStatusTypeCodeBase + strings.ToUpper(strings.ReplaceAll(string(code), "-", "_"))
}

// Event returns the finding's body and the Event it parses into. The body is what the
// router stores and re-parses; the error is a *RejectError when a field is invalid.
func (f StatusFinding) Event() ([]byte, Event, error) {
	d := statusDetail{InstanceID: f.InstanceID, Finding: f.Finding}
	switch f.Finding {
	case FindingScheduledEvent:
		d.Code, d.EventID, d.Description = string(f.Code), f.EventID, f.Description
		d.NotBefore, d.NotAfter = stampUTC(f.NotBefore), stampUTC(f.NotAfter)
	case FindingImpaired:
		d.InstanceStatus, d.SystemStatus, d.ImpairedSince = f.InstanceStatus, f.SystemStatus, stampUTC(f.ImpairedSince)
	case FindingRecovered:
		d.InstanceStatus, d.SystemStatus = f.InstanceStatus, f.SystemStatus
	}
	detail, err := json.Marshal(d)
	if err != nil {
		return nil, Event{}, fmt.Errorf("encoding instance-status finding: %w", err)
	}
	body, err := json.Marshal(Envelope{"0", f.ID(), DetailTypeInstanceStatus, SourceHealthRouter, f.Account, f.Time.UTC().Format(time.RFC3339), f.Region,
		[]string{fmt.Sprintf("arn:aws:ec2:%s:%s:instance/%s", f.Region, f.Account, f.InstanceID)}, detail})
	if err != nil {
		return nil, Event{}, fmt.Errorf("encoding instance-status finding: %w", err)
	}
	ev, err := Parse(body)
	if err != nil {
		return nil, Event{}, err
	}
	return body, ev, nil
}

// FindingDetail returns the detail of an instance-status finding bound to instanceID: the
// finding's own fields only (decoded into its type, so nothing else is carried), with the
// instance replaced.
func FindingDetail(detail json.RawMessage, instanceID string) (json.RawMessage, error) {
	var d statusDetail
	if err := json.Unmarshal(detail, &d); err != nil {
		return nil, fmt.Errorf("instance-status finding detail: %w", err)
	}
	d.InstanceID = instanceID
	out, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encoding instance-status finding: %w", err)
	}
	return out, nil
}

// stampUTC formats t in RFC 3339 UTC to the second ("" for zero): EC2 reports event times
// to the second, and the router matches a poller finding with an AWS Health event by it.
func stampUTC(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Truncate(time.Second).Format(time.RFC3339)
}

func parseStatusTime(field, s string, required bool) (time.Time, error) {
	if s == "" {
		if required {
			return time.Time{}, reject(ReasonInvalid, "instance-status finding without %s", field)
		}
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, reject(ReasonInvalid, "%s %q is not RFC 3339", field, s)
	}
	return t.UTC().Truncate(time.Second), nil
}

func parseInstanceStatus(env envelope, ev *Event) error {
	var d statusDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	ids, err := instanceID(d.InstanceID)
	if err != nil {
		return err
	}
	ev.Instances = ids
	switch d.Finding {
	case FindingScheduledEvent:
		code := ScheduledType(d.Code)
		if !slices.Contains(ScheduledTypes, code) {
			return reject(ReasonInvalid, "scheduled-event code %q is not an EC2 scheduled event code", d.Code)
		}
		if d.EventID == "" {
			return reject(ReasonInvalid, "scheduled-event finding without event-id")
		}
		start, err := parseStatusTime("not-before", d.NotBefore, true)
		if err != nil {
			return err
		}
		end, err := parseStatusTime("not-after", d.NotAfter, false)
		if err != nil {
			return err
		}
		if !end.IsZero() && end.Before(start) {
			return reject(ReasonInvalid, "not-after %s is before not-before %s", d.NotAfter, d.NotBefore)
		}
		ev.Kind, ev.Deadline = KindScheduledChange, start
		// EventARN carries EC2's event ID: it stays when EC2 reschedules the event, so a
		// rescheduled event supersedes the earlier one as an updated Health event does. A
		// completed or cancelled event closes it, as a closed Health event does.
		status := HealthUpcoming
		if ClosedDescription(d.Description) {
			status = HealthClosed
		}
		ev.Health = &Health{
			EventARN: d.EventID, TypeCode: TypeCode(code), Category: "scheduledChange", Status: status,
			Scheduled: code, Start: start, End: end,
		}
	case FindingImpaired:
		for _, f := range [][2]string{{"instance-status", d.InstanceStatus}, {"system-status", d.SystemStatus}} {
			if f[1] != "" && !slices.Contains(statusValues, f[1]) {
				return reject(ReasonInvalid, "%s %q is not an EC2 status", f[0], f[1])
			}
		}
		if d.InstanceStatus != StatusImpaired && d.SystemStatus != StatusImpaired {
			return reject(ReasonInvalid, "impaired finding with instance-status %q and system-status %q: neither is impaired", d.InstanceStatus, d.SystemStatus)
		}
		since, err := parseStatusTime("impaired-since", d.ImpairedSince, true)
		if err != nil {
			return err
		}
		ev.Kind = KindInstanceStatus // no Deadline: AWS does not act on an impaired instance
		ev.Status = &InstanceStatus{InstanceStatus: d.InstanceStatus, SystemStatus: d.SystemStatus, ImpairedSince: since}
	case FindingRecovered:
		if d.InstanceStatus == StatusImpaired || d.SystemStatus == StatusImpaired {
			return reject(ReasonInvalid, "recovered finding with an impaired status")
		}
		ev.Kind = KindInstanceStatus
		ev.Status = &InstanceStatus{InstanceStatus: d.InstanceStatus, SystemStatus: d.SystemStatus, Recovered: true}
	default:
		return reject(ReasonInvalid, "instance-status finding %q: want %s, %s or %s", d.Finding, FindingScheduledEvent, FindingImpaired, FindingRecovered)
	}
	return nil
}

// ClosedDescription reports whether EC2 describes a scheduled event as over: it prefixes the
// description of a completed or cancelled event.
func ClosedDescription(desc string) bool {
	return strings.HasPrefix(desc, "[Completed]") || strings.HasPrefix(desc, "[Canceled]")
}

// ImpairedFindingID reports whether an event ID is the router's impaired finding's.
func ImpairedFindingID(id string) bool {
	return strings.HasPrefix(id, instanceStatusIDPrefix) && strings.Contains(id, "/impaired/")
}
