package event

import "strings"

// ScheduledTypeOf maps AWS Health EC2 scheduled-change codes to the EC2 scheduled-event
// type of the same maintenance. Codes not listed here still parse, with no type, and are
// decided by the pool's scheduled-change (or default) action.
var ScheduledTypeOf = map[string]ScheduledType{
	"AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED":        ScheduledInstanceReboot,
	"AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED":          ScheduledSystemReboot,
	"AWS_EC2_INSTANCE_STOP_SCHEDULED":                      ScheduledInstanceStop,
	"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED":                ScheduledInstanceRetirement,
	"AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED":     ScheduledInstanceRetirement,
	"AWS_EC2_SYSTEM_MAINTENANCE_EVENT":                     ScheduledSystemMaintenance,
	"AWS_EC2_MAINTENANCE_SCHEDULED":                        ScheduledSystemMaintenance,
	"AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED":       ScheduledSystemMaintenance,
	"AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED":         ScheduledSystemMaintenance,
	"AWS_EC2_DEDICATED_HOST_NETWORK_MAINTENANCE_SCHEDULED": ScheduledSystemMaintenance,
	"AWS_EC2_DEDICATED_HOST_POWER_MAINTENANCE_SCHEDULED":   ScheduledSystemMaintenance,
}

type healthDetail struct {
	EventARN         string `json:"eventArn"`
	CommunicationID  string `json:"communicationId"`
	AffectedAccount  string `json:"affectedAccount"`
	EventRegion      string `json:"eventRegion"`
	Service          string `json:"service"`
	TypeCode         string `json:"eventTypeCode"`
	Category         string `json:"eventTypeCategory"`
	StatusCode       string `json:"statusCode"`
	StartTime        string `json:"startTime"`
	EndTime          string `json:"endTime"`
	AffectedEntities []struct {
		EntityValue string `json:"entityValue"`
		Status      string `json:"status"`
	} `json:"affectedEntities"`
}

// EntityResolved is the status of an affected entity that the event no longer affects (AWS
// Health's entity status codes: IMPAIRED, UNIMPAIRED, UNKNOWN, PENDING, RESOLVED).
const EntityResolved = "RESOLVED"

func parseHealth(env envelope, ev *Event) error {
	var d healthDetail
	if err := decodeDetail(env, &d); err != nil {
		return err
	}
	// Unfiltered Health rules deliver every service's events; NTH crash-looped on them.
	if d.Service != "EC2" {
		return reject(ReasonUnsupported, "AWS Health event for service %q; the router acts on EC2 only", d.Service)
	}
	if d.Category != "scheduledChange" {
		return reject(ReasonUnsupported, "AWS Health EC2 event of category %q (%s); the router acts on scheduledChange only", d.Category, d.TypeCode)
	}
	if d.EventARN == "" || d.TypeCode == "" {
		return reject(ReasonInvalid, "AWS Health event without eventArn or eventTypeCode")
	}
	switch d.StatusCode {
	case "", HealthUpcoming, HealthOpen, HealthClosed:
	default:
		return reject(ReasonInvalid, "AWS Health statusCode %q", d.StatusCode)
	}
	start, err := parseHealthTime("startTime", d.StartTime)
	if err != nil {
		return err
	}
	end, err := parseHealthTime("endTime", d.EndTime)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var resolved []string
	for _, e := range d.AffectedEntities {
		v := strings.TrimSpace(e.EntityValue)
		if !IsInstanceID(v) || seen[v] {
			continue
		}
		seen[v] = true
		// A resolved entity is not acted on while the event is still upcoming or open: the
		// maintenance is over for it, and its report ends what was decided for it (Resolved); a
		// close names it still, since a close ends what was decided for it.
		if strings.EqualFold(strings.TrimSpace(e.Status), EntityResolved) && d.StatusCode != HealthClosed {
			resolved = append(resolved, v)
			continue
		}
		ev.Instances = append(ev.Instances, v)
	}
	// A resolved entity ends what was decided for it (Event.ResolvedClose): a report that
	// resolves every instance is a close for them all, not nothing.
	ev.Resolved = resolved
	if len(ev.Instances) == 0 && len(resolved) == 0 {
		return reject(ReasonInvalid, "AWS Health event %s names no EC2 instance in affectedEntities", d.EventARN)
	}
	ev.Kind = KindScheduledChange
	ev.Deadline = start
	ev.Health = &Health{
		EventARN: d.EventARN, TypeCode: d.TypeCode, Category: d.Category, Status: d.StatusCode,
		Scheduled: ScheduledTypeOf[d.TypeCode], Start: start, End: end,
		CommunicationID: d.CommunicationID, AffectedAccount: d.AffectedAccount, EventRegion: d.EventRegion,
	}
	return nil
}
