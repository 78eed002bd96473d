package event

import (
	"strings"
	"testing"
	"time"
)

var found = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func scheduledFinding(code ScheduledType) StatusFinding {
	return StatusFinding{
		InstanceID: "i-0a1b2c3d4e5f60718", Finding: FindingScheduledEvent, Time: found, Account: "111122223333", Region: "eu-west-1",
		Code: code, EventID: "instance-event-0d59937288b749b32",
		// EC2 reports times to the second; a fraction must not change the identity.
		NotBefore: time.Date(2026, 12, 5, 2, 0, 0, 400, time.FixedZone("CET", 3600)), NotAfter: time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC),
		Description: "scheduled " + string(code),
	}
}

func TestStatusFindingScheduledRoundTrip(t *testing.T) {
	start := time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC) // 02:00 CET
	health := map[ScheduledType]string{}
	for code, typ := range ScheduledTypeOf {
		health[typ] = code
	}
	for _, code := range ScheduledTypes {
		t.Run(string(code), func(t *testing.T) {
			body, ev, err := scheduledFinding(code).Event()
			if err != nil {
				t.Fatal(err)
			}
			again, err := Parse(body)
			if err != nil {
				t.Fatalf("stored body does not parse again: %v", err)
			}
			if again.ID != ev.ID || !again.Deadline.Equal(ev.Deadline) || *again.Health != *ev.Health {
				t.Errorf("round trip changed the event: %+v / %+v", again, ev)
			}
			if ev.Kind != KindScheduledChange || ev.Source != SourceHealthRouter || ev.DetailType != DetailTypeInstanceStatus {
				t.Errorf("kind %q source %q detail-type %q", ev.Kind, ev.Source, ev.DetailType)
			}
			if len(ev.Instances) != 1 || ev.Instances[0] != "i-0a1b2c3d4e5f60718" {
				t.Errorf("instances = %v", ev.Instances)
			}
			h := ev.Health
			if h.Scheduled != code || h.Status != HealthUpcoming || h.Category != "scheduledChange" {
				t.Errorf("health = %+v", h)
			}
			if !ev.Deadline.Equal(start) || !h.Start.Equal(start) || ev.Deadline.Location() != time.UTC {
				t.Errorf("deadline %v start %v, want %v UTC", ev.Deadline, h.Start, start)
			}
			if h.TypeCode != "EC2_INSTANCE_STATUS_"+strings.ToUpper(strings.ReplaceAll(string(code), "-", "_")) {
				t.Errorf("type code %q", h.TypeCode)
			}
			if h.EventARN != "instance-event-0d59937288b749b32" {
				t.Errorf("event key %q: want EC2's event ID", h.EventARN)
			}
			if CheckOrigin(ev, "111122223333", "eu-west-1") != nil {
				t.Error("the router's own finding fails its origin check")
			}
			// The same maintenance as AWS Health reports it: same type, same deadline.
			hb := strings.NewReplacer("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", health[code],
				"Sat, 5 Dec 2026 02:00:00 GMT", "Sat, 5 Dec 2026 01:00:00 GMT").Replace(string(mustRead(t, "health-reboot.json")))
			hev, err := Parse([]byte(hb))
			if err != nil {
				t.Fatal(err)
			}
			if hev.Health.Scheduled != h.Scheduled || !hev.Deadline.Equal(ev.Deadline) {
				t.Errorf("Health event (%s, %v) and finding (%s, %v) are not the same maintenance", hev.Health.Scheduled, hev.Deadline, h.Scheduled, ev.Deadline)
			}
		})
	}
}

func TestStatusFindingImpaired(t *testing.T) {
	since := found.Add(-3 * time.Minute)
	f := StatusFinding{InstanceID: "i-0a1b2c3d4e5f60718", Finding: FindingImpaired, Time: found, InstanceStatus: "ok", SystemStatus: "impaired", ImpairedSince: since}
	body, ev, err := f.Event()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != ev.ID || *again.Status != *ev.Status {
		t.Errorf("round trip changed the event")
	}
	if ev.Kind != KindInstanceStatus || !ev.Deadline.IsZero() || ev.Health != nil || ev.Urgent() {
		t.Errorf("kind %q deadline %v health %v urgent %v", ev.Kind, ev.Deadline, ev.Health, ev.Urgent())
	}
	if ev.Status.SystemStatus != "impaired" || ev.Status.InstanceStatus != "ok" || !ev.Status.ImpairedSince.Equal(since) {
		t.Errorf("status = %+v", ev.Status)
	}
	// A new impairment after a recovery is a new event.
	f.ImpairedSince = found
	if f.ID() == ev.ID {
		t.Error("a later impairment has the same ID")
	}
}

func TestStatusFindingIDs(t *testing.T) {
	a := scheduledFinding(ScheduledSystemReboot)
	b := a
	b.Time = found.Add(time.Hour) // found again at a later poll
	if a.ID() != b.ID() {
		t.Error("the same finding at a later poll has another ID")
	}
	b.NotBefore = a.NotBefore.Add(24 * time.Hour) // rescheduled
	if a.ID() == b.ID() {
		t.Error("a rescheduled event has the same ID")
	}
}

func TestStatusFindingRejects(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(f *StatusFinding)
		detail string
	}{
		{"bad instance", func(f *StatusFinding) { f.InstanceID = "i-XYZ" }, "i-XYZ"},
		{"unknown finding", func(f *StatusFinding) { f.Finding = "degraded" }, `"degraded"`},
		{"unknown code", func(f *StatusFinding) { f.Code = "instance-hibernate" }, "instance-hibernate"},
		{"no event id", func(f *StatusFinding) { f.EventID = "" }, "event-id"},
		{"no not-before", func(f *StatusFinding) { f.NotBefore = time.Time{} }, "not-before"},
		{"not-after before not-before", func(f *StatusFinding) { f.NotAfter = f.NotBefore.Add(-time.Hour) }, "before"},
		{"impaired nothing impaired", func(f *StatusFinding) {
			*f = StatusFinding{InstanceID: f.InstanceID, Finding: FindingImpaired, Time: found, InstanceStatus: "ok", SystemStatus: "ok", ImpairedSince: found}
		}, "neither is impaired"},
		{"impaired bad status", func(f *StatusFinding) {
			*f = StatusFinding{InstanceID: f.InstanceID, Finding: FindingImpaired, Time: found, InstanceStatus: "impaired", SystemStatus: "broken", ImpairedSince: found}
		}, `"broken"`},
		{"impaired no since", func(f *StatusFinding) {
			*f = StatusFinding{InstanceID: f.InstanceID, Finding: FindingImpaired, Time: found, InstanceStatus: "impaired"}
		}, "impaired-since"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := scheduledFinding(ScheduledInstanceStop)
			tt.edit(&f)
			_, _, err := f.Event()
			if RejectReason(err) != ReasonInvalid {
				t.Fatalf("err = %v, want invalid", err)
			}
			if !strings.Contains(err.Error(), tt.detail) {
				t.Errorf("error %q does not mention %q", err, tt.detail)
			}
		})
	}
	// Hand-written bodies: bad times are rejected too.
	body, _, err := scheduledFinding(ScheduledInstanceStop).Event()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]string{
		"not-before not RFC 3339":  strings.Replace(string(body), `"not-before":"2026-12-05T01:00:00Z"`, `"not-before":"Sat, 5 Dec 2026 01:00:00 GMT"`, 1),
		"instance-id not a string": strings.Replace(string(body), `"detail":{`, `"detail":{"instance-id":4,`, 1),
	} {
		if _, err := Parse([]byte(b)); err == nil || b == string(body) {
			t.Errorf("%s: accepted (or the edit did not apply)", name)
		}
	}
}

func TestStatusFindingFixtures(t *testing.T) {
	for file, kind := range map[string]Kind{"instance-status-scheduled.json": KindScheduledChange, "instance-status-impaired.json": KindInstanceStatus} {
		ev, err := Parse(mustRead(t, file))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if ev.Kind != kind {
			t.Errorf("%s: kind %q, want %q", file, ev.Kind, kind)
		}
	}
}
