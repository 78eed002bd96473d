package signal

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/capacityreservationinterruption"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/rebalancerecommendation"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/scheduledchange"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/spotinterruption"
	"github.com/aws/karpenter-provider-aws/pkg/controllers/interruption/messages/statechange"

	"github.com/health-router/health-router/router/event"
)

// karpenterParse parses a body as Karpenter's interruption controller does (its EventParser):
// decode messages.Metadata, pick the parser by (version, source, detail-type), parse. A body
// with no parser, or that a parser ignores, is Karpenter's no-op and fails the test.
func karpenterParse(t *testing.T, body []byte) (messages.Metadata, messages.Message) {
	t.Helper()
	var md messages.Metadata
	if err := json.Unmarshal(body, &md); err != nil {
		t.Fatalf("Karpenter cannot decode the metadata of %s: %v", body, err)
	}
	parsers := []messages.Parser{
		statechange.Parser{}, spotinterruption.Parser{}, scheduledchange.Parser{},
		rebalancerecommendation.Parser{}, capacityreservationinterruption.Parser{},
	}
	i := slices.IndexFunc(parsers, func(p messages.Parser) bool {
		return p.Version() == md.Version && p.Source() == md.Source && p.DetailType() == md.DetailType
	})
	if i < 0 {
		t.Fatalf("Karpenter has no parser for version %q source %q detail-type %q: a no-op", md.Version, md.Source, md.DetailType)
	}
	msg, err := parsers[i].Parse(string(body))
	if err != nil {
		t.Fatalf("Karpenter's parser rejects %s: %v", body, err)
	}
	if msg == nil {
		t.Fatalf("Karpenter's parser ignores %s: a no-op", body)
	}
	return md, msg
}

func TestCanonicalIsWhatKarpenterParses(t *testing.T) {
	tests := []struct {
		file     string
		instance string
		kind     messages.Kind
		// resource is the ARN the body must name: the input's, or the one built from it.
		resource string
	}{
		{"spot.json", "i-0a1b2c3d4e5f60001", messages.SpotInterruptionKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60001"},
		{"spot-no-version.json", "i-0a1b2c3d4e5f60002", messages.SpotInterruptionKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60002"},
		{"health-multi.json", "i-0a1b2c3d4e5f60011", messages.ScheduledChangeKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60011"},
		{"health-multi.json", "i-0a1b2c3d4e5f60012", messages.ScheduledChangeKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60012"},
		{"health-multi.json", "i-0a1b2c3d4e5f60013", messages.ScheduledChangeKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60013"},
		{"state-stopping.json", "i-0a1b2c3d4e5f60021", messages.InstanceStoppedKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60021"},
		{"state-stopped.json", "i-0a1b2c3d4e5f60021", messages.InstanceStoppedKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60021"},
		{"state-shutting-down.json", "i-0a1b2c3d4e5f60021", messages.InstanceTerminatedKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60021"},
		{"state-terminated.json", "i-0a1b2c3d4e5f60021", messages.InstanceTerminatedKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60021"},
		{"capacity-reservation-array.json", "i-0a1b2c3d4e5f60031", messages.CapacityReservationInterruptionKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60031"},
		{"capacity-reservation-string.json", "i-0a1b2c3d4e5f60032", messages.CapacityReservationInterruptionKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60032"},
		{"rebalance.json", "i-0a1b2c3d4e5f60041", messages.RebalanceRecommendationKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60041"},
		// The organizational view: the ARN in the affected account and the event's region, not
		// the management account's and the region it was delivered to; the RESOLVED entity is
		// not among the instances.
		{"health-org-view.json", "i-0a1b2c3d4e5f60051", messages.ScheduledChangeKind, "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60051"},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSuffix(tt.file, ".json")+"/"+tt.instance, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "canonical", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := event.Parse(raw)
			if err != nil {
				t.Fatalf("the router's parser rejects the input: %v", err)
			}
			body, err := Canonical(ev, tt.instance)
			if err != nil {
				t.Fatalf("Canonical: %v", err)
			}
			md, msg := karpenterParse(t, body)
			if msg.Kind() != tt.kind {
				t.Errorf("Karpenter reads kind %q, want %q", msg.Kind(), tt.kind)
			}
			if got := msg.EC2InstanceIDs(); !slices.Equal(got, []string{tt.instance}) {
				t.Errorf("Karpenter reads instances %v, want exactly [%s]", got, tt.instance)
			}
			if md.Version != "0" || md.ID != ev.ID || md.Account != ev.Account || md.Region != ev.Region {
				t.Errorf("metadata %+v does not carry the event's version 0, id %s, account %s, region %s", md, ev.ID, ev.Account, ev.Region)
			}
			if !md.Time.Equal(ev.Time) {
				t.Errorf("time %s, want the event's %s", md.Time, ev.Time)
			}
			if !slices.Equal(md.Resources, []string{tt.resource}) {
				t.Errorf("resources %v, want [%s]", md.Resources, tt.resource)
			}
			// The canonical body is itself an input the router accepts, naming the one instance:
			// a body forwarded twice (a replay, a re-drive) is still the same event.
			again, err := event.Parse(body)
			if err != nil {
				t.Fatalf("the router's parser rejects the canonical body: %v", err)
			}
			if again.ID != ev.ID || again.Kind != ev.Kind || !slices.Equal(again.Instances, []string{tt.instance}) {
				t.Errorf("the canonical body parses as %s %s %v, want %s %s [%s]", again.ID, again.Kind, again.Instances, ev.ID, ev.Kind, tt.instance)
			}
		})
	}
}

func TestCanonicalKeepsTheDetail(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "canonical", "health-multi.json"))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := event.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	body, err := Canonical(ev, "i-0a1b2c3d4e5f60012")
	if err != nil {
		t.Fatal(err)
	}
	_, msg := karpenterParse(t, body)
	d := msg.(scheduledchange.Message).Detail
	if d.EventTypeCode != "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED" || d.StartTime != "Sat, 28 Nov 2026 15:00:00 GMT" ||
		d.EventARN != ev.Health.EventARN || len(d.EventDescription) != 1 {
		t.Errorf("the restricted detail lost fields of the input: %+v", d)
	}
	if ev.Time.Format(time.RFC3339) != "2026-11-21T12:00:00Z" {
		t.Errorf("event time %s", ev.Time)
	}
}

func TestCanonicalRefuses(t *testing.T) {
	tests := []struct {
		name     string
		file     string
		body     string
		instance string
		want     string
	}{
		{name: "an instance the event does not name", file: "spot.json", instance: "i-0a1b2c3d4e5f69999", want: "does not name instance"},
		{name: "an instance the Health event does not name", file: "health-multi.json", instance: "i-0a1b2c3d4e5f60001", want: "does not name instance"},
		{name: "an event about no instance", body: `{"version":"0","id":"a1b2c3d4-9f07-51db-246b-d8b8441bcdf0","detail-type":"EC2 AMI State Change","source":"aws.ec2","account":"123456789012","time":"2026-11-21T07:30:00Z","region":"us-east-2","resources":["arn:aws:ec2:us-east-2::image/ami-0c55b159cbfafe1f0"],"detail":{"ImageId":"ami-0c55b159cbfafe1f0","State":"available"}}`, instance: "i-0a1b2c3d4e5f60001", want: "does not name instance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := []byte(tt.body)
			if tt.file != "" {
				var err error
				if raw, err = os.ReadFile(filepath.Join("testdata", "canonical", tt.file)); err != nil {
					t.Fatal(err)
				}
			}
			ev, err := event.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Canonical(ev, tt.instance); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Canonical: %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

func TestCanonicalBuildsTheARNInThePartition(t *testing.T) {
	for region, want := range map[string]string{
		"us-east-2":     "arn:aws:ec2:us-east-2:123456789012:instance/i-0a1b2c3d4e5f60001",
		"cn-north-1":    "arn:aws-cn:ec2:cn-north-1:123456789012:instance/i-0a1b2c3d4e5f60001",
		"us-gov-west-1": "arn:aws-us-gov:ec2:us-gov-west-1:123456789012:instance/i-0a1b2c3d4e5f60001",
	} {
		ev := event.Event{
			ID: "e1", Kind: event.KindSpotInterruption, Source: "aws.ec2", DetailType: "EC2 Spot Instance Interruption Warning",
			Account: "123456789012", Region: region, Time: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
			Instances: []string{"i-0a1b2c3d4e5f60001"},
			Body:      []byte(`{"detail":{"instance-id":"i-0a1b2c3d4e5f60001","instance-action":"terminate"}}`),
		}
		body, err := Canonical(ev, "i-0a1b2c3d4e5f60001")
		if err != nil {
			t.Fatal(err)
		}
		md, _ := karpenterParse(t, body)
		if !slices.Equal(md.Resources, []string{want}) {
			t.Errorf("%s: resources %v, want [%s]", region, md.Resources, want)
		}
	}
}

// TestCanonicalTrimsEntityValue (issue 15, 8d): the parser trims an affected entity's value;
// the canonical body must find the same instance (on 351c311 it failed "not among the affected
// entities", and the drain or deferral of that instance was retried to the dead-letter queue).
func TestCanonicalTrimsEntityValue(t *testing.T) {
	body := `{"version":"0","id":"h1","detail-type":"AWS Health Event","source":"aws.health","account":"111122223333","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/X/1","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":"Sat, 28 Nov 2026 10:00:00 GMT","affectedEntities":[{"entityValue":" i-0a1b2c3d4e5f6000a "}]}}`
	ev, err := event.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Canonical(ev, "i-0a1b2c3d4e5f6000a")
	if err != nil || !strings.Contains(string(out), "i-0a1b2c3d4e5f6000a") {
		t.Fatalf("%s %v", out, err)
	}
}

// TestCanonicalIsBuiltForTheInstance: the body forwarded for a deferral record is the record's
// event bound to the NodeClaim's own instance (Redecide rebinds ev.Instances). Its detail is
// built from the router's event model for that instance, never copied from the stored body: a
// record forged on one NodeClaim whose detail names another instance (issue 36, defect 8)
// would otherwise have Karpenter's parser, which reads detail.instance-id, delete that other
// node, in any pool, past pacing.
func TestCanonicalIsBuiltForTheInstance(t *testing.T) {
	const own = "i-0a1b2c3d4e5f6ffff" // the NodeClaim the forged record sits on
	tests := []struct {
		file   string
		victim string // the instance the stored body names
		kind   messages.Kind
	}{
		{"spot.json", "i-0a1b2c3d4e5f60001", messages.SpotInterruptionKind},
		{"state-shutting-down.json", "i-0a1b2c3d4e5f60021", messages.InstanceTerminatedKind},
		{"capacity-reservation-array.json", "i-0a1b2c3d4e5f60031", messages.CapacityReservationInterruptionKind},
		{"rebalance.json", "i-0a1b2c3d4e5f60041", messages.RebalanceRecommendationKind},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSuffix(tt.file, ".json"), func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", "canonical", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			ev, err := event.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			ev.Instances = []string{own} // as Pipeline.Redecide binds a record to its NodeClaim
			body, err := Canonical(ev, own)
			if err != nil {
				t.Fatalf("Canonical: %v", err)
			}
			if strings.Contains(string(body), tt.victim) {
				t.Errorf("the body forwarded for %s still names %s: %s", own, tt.victim, body)
			}
			_, msg := karpenterParse(t, body)
			if got := msg.EC2InstanceIDs(); !slices.Equal(got, []string{own}) || msg.Kind() != tt.kind {
				t.Errorf("Karpenter reads %s %v, want %s [%s]", msg.Kind(), got, tt.kind, own)
			}
			again, err := event.Parse(body)
			if err != nil {
				t.Fatalf("the router's parser rejects the body it built: %v", err)
			}
			if again.Kind != ev.Kind || again.State != ev.State || again.InstanceAction != ev.InstanceAction || !again.Deadline.Equal(ev.Deadline) {
				t.Errorf("the body built parses as %+v, want the model %+v", again, ev)
			}
		})
	}
}
