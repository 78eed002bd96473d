package event

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustRead(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file      string
		kind      Kind
		instances []string
		deadline  time.Time
		check     func(t *testing.T, ev Event)
	}{
		{
			file: "health-reboot.json", kind: KindScheduledChange,
			instances: []string{"i-0a1b2c3d4e5f60718", "i-0fedcba9876543210"}, // the duplicate entity is dropped
			deadline:  time.Date(2026, 12, 5, 2, 0, 0, 0, time.UTC),
			check: func(t *testing.T, ev Event) {
				if ev.Health.Scheduled != ScheduledInstanceReboot || ev.Health.Status != HealthUpcoming {
					t.Errorf("health = %+v", ev.Health)
				}
				if !ev.Health.End.Equal(time.Date(2026, 12, 5, 4, 0, 0, 0, time.UTC)) {
					t.Errorf("end = %v", ev.Health.End)
				}
			},
		},
		{
			file: "health-retirement.json", kind: KindScheduledChange,
			instances: []string{"i-07c3e1d2b4a596870"},
			deadline:  time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC),
			check: func(t *testing.T, ev Event) {
				if ev.Health.Scheduled != ScheduledInstanceRetirement {
					t.Errorf("scheduled = %q", ev.Health.Scheduled)
				}
			},
		},
		{
			file: "spot.json", kind: KindSpotInterruption, instances: []string{"i-0b662ef9931388ba0"},
			deadline: time.Date(2026, 11, 21, 10, 17, 0, 0, time.UTC),
		},
		{file: "rebalance.json", kind: KindRebalance, instances: []string{"i-0b662ef9931388ba0"}},
		{
			file: "state-stopping.json", kind: KindStateChange, instances: []string{"i-0123456789abcdef0"},
			check: func(t *testing.T, ev Event) {
				if ev.State != StateStopping {
					t.Errorf("state = %q", ev.State)
				}
			},
		},
		{
			// resources as a string, as in the documented sample.
			file: "capacity-reservation.json", kind: KindCapacityReservation, instances: []string{"i-0d4c3b2a190817263"},
			deadline: time.Date(2026, 11, 21, 11, 2, 0, 0, time.UTC),
		},
		{
			file: "ami-available.json", kind: KindAMIStateChange,
			check: func(t *testing.T, ev Event) {
				if ev.Image == nil || ev.Image.ID != "ami-0c55b159cbfafe1f0" || ev.Image.State != "available" {
					t.Errorf("image = %+v", ev.Image)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body := mustRead(t, tt.file)
			ev, err := Parse(body)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if ev.Kind != tt.kind {
				t.Errorf("kind = %q, want %q", ev.Kind, tt.kind)
			}
			if !slices.Equal(ev.Instances, tt.instances) {
				t.Errorf("instances = %v, want %v", ev.Instances, tt.instances)
			}
			if !ev.Deadline.Equal(tt.deadline) {
				t.Errorf("deadline = %v, want %v", ev.Deadline, tt.deadline)
			}
			if string(ev.Body) != string(body) {
				t.Error("body not kept for forwarding")
			}
			if tt.check != nil {
				tt.check(t, ev)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	valid := string(mustRead(t, "spot.json"))
	tests := []struct {
		name   string
		body   string
		reason Reason
		detail string
	}{
		{"not json", "{nope", ReasonMalformed, "not an EventBridge event"},
		{"empty", "", ReasonMalformed, ""},
		{"json array", "[1,2]", ReasonMalformed, ""},
		{"trailing", valid + "{}", ReasonMalformed, "trailing"},
		{"no source", `{"id":"x","detail-type":"EC2 Spot Instance Interruption Warning","detail":{}}`, ReasonMalformed, "source"},
		{"no id", strings.Replace(valid, `"id":"1e5527d7-bb36-4607-3370-4164db56a40e",`, "", 1), ReasonMalformed, "no id"},
		{"asg lifecycle", string(mustRead(t, "asg-lifecycle.json")), ReasonUnknownKind, "aws.autoscaling"},
		{"rds health", string(mustRead(t, "health-rds.json")), ReasonUnsupported, `"RDS"`},
		{"health notification", string(mustRead(t, "health-odcr-notification.json")), ReasonUnsupported, "accountNotification"},
		{"empty state", string(mustRead(t, "state-empty.json")), ReasonInvalid, `state ""`},
		{"substring state", strings.Replace(string(mustRead(t, "state-stopping.json")), `"stopping"`, `"stop"`, 1), ReasonInvalid, `"stop"`},
		{"bad instance", strings.Replace(valid, `"instance-id":"i-0b662ef9931388ba0"`, `"instance-id":"i-XXXX"`, 1), ReasonInvalid, "i-XXXX"},
		{"bad time", strings.Replace(valid, "2026-11-21T10:15:00Z", "yyyy-mm-ddThh:mm:ssZ", 1), ReasonInvalid, "RFC 3339"},
		{"bad version", strings.Replace(valid, `"version":"0"`, `"version":"2"`, 1), ReasonUnsupported, "version"},
		{"detail not object", strings.Replace(valid, `"detail":{"instance-id":"i-0b662ef9931388ba0","instance-action":"terminate"}`, `"detail":"x"`, 1), ReasonMalformed, "detail"},
		{"resources number", strings.Replace(valid, `"resources":["arn:aws:ec2:eu-west-1b:instance/i-0b662ef9931388ba0"]`, `"resources":42`, 1), ReasonMalformed, "resources"},
		{"health bad start", strings.Replace(string(mustRead(t, "health-reboot.json")), "Sat, 5 Dec 2026 02:00:00 GMT", "next saturday", 1), ReasonInvalid, "startTime"},
		{"health bad status", strings.Replace(string(mustRead(t, "health-reboot.json")), `"upcoming"`, `"pending"`, 1), ReasonInvalid, "statusCode"},
		{"health no instance", strings.NewReplacer(`"i-0a1b2c3d4e5f60718"`, `"h-0a1b2c3d4e5f60718"`, `"i-0fedcba9876543210"`, `"h-0fedcba9876543210"`).Replace(string(mustRead(t, "health-reboot.json"))), ReasonInvalid, "names no EC2 instance"},
		{"ami bad state", strings.Replace(string(mustRead(t, "ami-available.json")), `"State":"available"`, `"State":"shiny"`, 1), ReasonInvalid, "shiny"},
		{"oversized", `{"id":"x","pad":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, ReasonOversized, "bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.body))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if got := RejectReason(err); got != tt.reason {
				t.Errorf("reason = %q (%v), want %q", got, err, tt.reason)
			}
			if !strings.Contains(err.Error(), tt.detail) {
				t.Errorf("error %q does not mention %q", err, tt.detail)
			}
		})
	}
}

func TestParseMissingVersionTolerated(t *testing.T) {
	// state-stopping.json has no version, like the documented sample.
	if _, err := Parse(mustRead(t, "state-stopping.json")); err != nil {
		t.Fatal(err)
	}
}

func TestCheckOrigin(t *testing.T) {
	ev, err := Parse(mustRead(t, "spot.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckOrigin(ev, "111122223333", "eu-west-1"); err != nil {
		t.Errorf("own origin rejected: %v", err)
	}
	if err := CheckOrigin(ev, "", ""); err != nil {
		t.Errorf("no expectation rejected: %v", err)
	}
	if RejectReason(CheckOrigin(ev, "999999999999", "")) != ReasonForeign {
		t.Error("other account accepted")
	}
	if RejectReason(CheckOrigin(ev, "", "us-east-1")) != ReasonForeign {
		t.Error("other region accepted")
	}
}

// TestOrganizationalView (issue 27, 4): an AWS Health event of the organizational view is
// about detail.affectedAccount in detail.eventRegion, not the management account and region
// that received it; a RESOLVED entity is not acted on, unless the event closes.
func TestOrganizationalView(t *testing.T) {
	body := mustRead(t, "health-org-view.json")
	ev, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ev.Instances, []string{"i-0a1b2c3d4e5f62721"}) {
		t.Errorf("instances %v, want the PENDING entity alone", ev.Instances)
	}
	if ev.OriginAccount() != "111122223333" || ev.OriginRegion() != "eu-west-1" || ev.Account != "999988887777" {
		t.Errorf("origin %s %s (envelope %s), want 111122223333 eu-west-1", ev.OriginAccount(), ev.OriginRegion(), ev.Account)
	}
	if ev.Health.CommunicationID != "4a1c2e9b7d0f3c5e8a6b1d2c3e4f5a6b7c8d9e0f-1" {
		t.Errorf("communicationId %q", ev.Health.CommunicationID)
	}
	if err := CheckOrigin(ev, "111122223333", "eu-west-1"); err != nil {
		t.Errorf("the affected account and region rejected: %v", err)
	}
	if RejectReason(CheckOrigin(ev, "999988887777", "")) != ReasonForeign {
		t.Error("the management account that received it taken as the origin")
	}
	if RejectReason(CheckOrigin(ev, "", "us-east-1")) != ReasonForeign {
		t.Error("the region it was delivered to taken as the origin")
	}

	closed := strings.Replace(string(body), `"statusCode": "upcoming"`, `"statusCode": "closed"`, 1)
	if ev, err := Parse([]byte(closed)); err != nil || len(ev.Instances) != 2 {
		t.Errorf("a close names its resolved entities too: %v %v", ev.Instances, err)
	}
	// Every entity resolved: the report is a close for them all (ResolvedClose), not a message
	// to dead-letter, since their deferrals must end (issue 36, defect 3).
	allResolved := strings.Replace(string(body), `"status": "PENDING"`, `"status": "resolved"`, 1)
	ev, err = Parse([]byte(allResolved))
	if err != nil || len(ev.Instances) != 0 || len(ev.Resolved) != 2 {
		t.Fatalf("every entity resolved: instances %v, resolved %v (%v), want none and both", ev.Instances, ev.Resolved, err)
	}
	c, ok := ev.ResolvedClose()
	if !ok || c.Health.Status != HealthClosed || len(c.Instances) != 2 || c.Health.EventARN != ev.Health.EventARN || !c.Deadline.Equal(ev.Deadline) || ev.Health.Status == HealthClosed {
		t.Errorf("its close: %+v (%t), the report's status %s", c, ok, ev.Health.Status)
	}
}

// TestCapacityBlockExpiration (issue 27, 5): Capacity Block Expiration Warning names a
// reservation; its deadline is the first terminations, 30 minutes before the block's end.
func TestCapacityBlockExpiration(t *testing.T) {
	body := mustRead(t, "capacity-block-expiration.json")
	ev, err := ParseReceived(body)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Kind != KindCapacityBlockExpiration || ev.Reservation != "cr-0a1b2c3d4e5f60901" || len(ev.Instances) != 0 || !ev.Urgent() {
		t.Errorf("parsed %s %q %v urgent %t", ev.Kind, ev.Reservation, ev.Instances, ev.Urgent())
	}
	if want := time.Date(2026, 11, 21, 11, 30, 0, 0, time.UTC); !ev.Deadline.Equal(want) {
		t.Errorf("deadline %s, want %s (end - 30 min)", ev.Deadline, want)
	}
	noEnd := strings.Replace(string(body), `"end-date": "2026-11-21T12:00:00Z"`, `"end-date": ""`, 1)
	if ev, err := Parse([]byte(noEnd)); err != nil || !ev.Deadline.Equal(ev.Time.Add(10*time.Minute)) {
		t.Errorf("without end-date: deadline %s %v, want the warning + 10 min", ev.Deadline, err)
	}
	for name, bad := range map[string]string{
		"reservation": strings.Replace(string(body), `"capacity-reservation-id": "cr-0a1b2c3d4e5f60901"`, `"capacity-reservation-id": "i-0a1b2c3d4e5f60901"`, 1),
		"end-date":    strings.Replace(string(body), `"end-date": "2026-11-21T12:00:00Z"`, `"end-date": "Sat, 21 Nov 2026 12:00:00 GMT"`, 1),
	} {
		if _, err := Parse([]byte(bad)); RejectReason(err) != ReasonInvalid {
			t.Errorf("bad %s: %v, want invalid", name, err)
		}
	}
}

// TestCapacityBlockDetailTypes: EC2 names its Capacity Block warning "Capacity Block Expiration
// Warning" (EventBridge's reference of EC2's events), and "Capacity Block Reservation
// Expiration Warning" in some of its user guide's samples; no AWS page names the "EC2 Capacity
// Block Expiration Warning" the router parsed (and the Terraform module's rule matched) before,
// so a real warning never reached it. Both documented names parse; the invented one is an
// unknown kind.
func TestCapacityBlockDetailTypes(t *testing.T) {
	body := string(mustRead(t, "capacity-block-expiration.json"))
	for dt, want := range map[string]Kind{
		"Capacity Block Expiration Warning":             KindCapacityBlockExpiration,
		"Capacity Block Reservation Expiration Warning": KindCapacityBlockExpiration,
		"EC2 Capacity Block Expiration Warning":         "",
	} {
		b := strings.Replace(body, `"detail-type": "Capacity Block Expiration Warning"`, `"detail-type": "`+dt+`"`, 1)
		if !strings.Contains(b, dt) {
			t.Fatalf("the sample's detail-type was not replaced by %q", dt)
		}
		ev, err := ParseReceived([]byte(b))
		switch {
		case want == "" && RejectReason(err) != ReasonUnknownKind:
			t.Errorf("%q: %v, want an unknown kind", dt, err)
		case want != "" && (err != nil || ev.Kind != want):
			t.Errorf("%q: kind %q, err %v; want %s", dt, ev.Kind, err, want)
		}
	}
}

func TestUrgent(t *testing.T) {
	tests := []struct {
		ev   Event
		want bool
	}{
		{Event{Kind: KindSpotInterruption}, true},
		{Event{Kind: KindCapacityReservation}, true},
		{Event{Kind: KindStateChange, State: StateTerminated}, true},
		{Event{Kind: KindStateChange, State: StateShuttingDown}, true},
		{Event{Kind: KindStateChange, State: StateStopping}, false},
		{Event{Kind: KindScheduledChange}, false},
		{Event{Kind: KindRebalance}, false},
	}
	for _, tt := range tests {
		if got := tt.ev.Urgent(); got != tt.want {
			t.Errorf("%s/%s: Urgent = %v", tt.ev.Kind, tt.ev.State, got)
		}
	}
}

// FuzzParse checks that no body makes Parse panic, and that whatever it accepts is
// consistent: a known kind, valid instance IDs, and an error only as a *RejectError; and
// that ParseReceived never accepts the router's own kind.
// The seed corpus is testdata/*.json plus testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, file := range files {
		f.Add(mustRead(f, filepath.Base(file)))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if rev, err := ParseReceived(body); err == nil && rev.Source == SourceHealthRouter {
			t.Fatalf("ParseReceived accepted the router's own kind %q", rev.DetailType)
		}
		ev, err := Parse(body)
		if err != nil {
			if RejectReason(err) == "" {
				t.Fatalf("error is not a rejection: %v", err)
			}
			return
		}
		if ev.Kind == KindUnknown || ev.Kind == "" {
			t.Fatalf("accepted with kind %q", ev.Kind)
		}
		if ev.Kind != KindAMIStateChange && ev.Kind != KindCapacityBlockExpiration && len(ev.Instances) == 0 {
			t.Fatalf("accepted %s naming no instance", ev.Kind)
		}
		if ev.Kind == KindCapacityBlockExpiration && (ev.Reservation == "" || len(ev.Instances) != 0) {
			t.Fatalf("accepted a Capacity Block's expiration naming reservation %q and instances %v", ev.Reservation, ev.Instances)
		}
		for _, id := range ev.Instances {
			if !IsInstanceID(id) {
				t.Fatalf("accepted instance %q", id)
			}
		}
	})
}

// TestParseReceived: the intake's parser reads every AWS body as Parse does, and refuses the
// router's own kind (a poller finding, which no AWS service sends) as a kind it has no parser
// for, naming the source; Parse, which reads the poller's findings and the deferral records,
// still accepts it.
func TestParseReceived(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	internal := 0
	for _, file := range files {
		body := mustRead(t, filepath.Base(file))
		want, wantErr := Parse(body)
		got, err := ParseReceived(body)
		if want.Source == SourceHealthRouter && wantErr == nil {
			internal++
			if RejectReason(err) != ReasonUnknownKind || !strings.Contains(err.Error(), SourceHealthRouter) {
				t.Errorf("%s: ParseReceived = %v, want %s naming %s", file, err, ReasonUnknownKind, SourceHealthRouter)
			}
			if got.ID != want.ID || got.Kind != KindUnknown {
				t.Errorf("%s: refused as %q of kind %q, want its ID %q and kind %q for the dead-letter record", file, got.ID, got.Kind, want.ID, KindUnknown)
			}
			continue
		}
		if RejectReason(err) != RejectReason(wantErr) || got.ID != want.ID || got.Kind != want.Kind || len(got.Instances) != len(want.Instances) {
			t.Errorf("%s: ParseReceived = %s %s, %v; Parse = %s %s, %v", file, got.ID, got.Kind, err, want.ID, want.Kind, wantErr)
		}
	}
	if internal != 2 {
		t.Errorf("%d fixtures of the router's own kind parsed, want 2 (instance-status-*.json)", internal)
	}
}
