package dispatch

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

func TestInstances(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		repl []string
		kind kind
		want []string
	}{
		{
			name: "health entities and resources, deduplicated", file: "health-scheduled-change.json",
			repl: []string{"INSTANCE_ALPHA", "i-0a1b2c3d4e5f60718", "INSTANCE_BETA", "i-0f9e8d7c6b5a43210", "INSTANCE_UNOWNED", "i-0a1b2c3d4e5f60718"},
			kind: kindScheduledChange, want: []string{"i-0a1b2c3d4e5f60718", "i-0f9e8d7c6b5a43210"},
		},
		{
			name: "spot", file: "spot-interruption.json", repl: []string{"INSTANCE", "i-0b662ef9931388ba0"},
			kind: kindSpotInterruption, want: []string{"i-0b662ef9931388ba0"},
		},
		{
			name: "capacity reservation with resources as a string", file: "capacity-reservation-interruption.json",
			repl: []string{"INSTANCE", "i-0123456789abcdef0"}, kind: kindCapacityReservation, want: []string{"i-0123456789abcdef0"},
		},
		{name: "AMI names no instance", file: "ami-state-change.json", kind: kindAMIStateChange},
		{name: "ASG lifecycle is not ours", file: "asg-lifecycle.json", repl: []string{"INSTANCE", "i-0123456789abcdef0"}, kind: kindUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := parseEnvelope(fixture(t, tc.file, tc.repl...))
			if err != nil {
				t.Fatal(err)
			}
			if ev.kind != tc.kind {
				t.Errorf("kind = %s, want %s", ev.kind, tc.kind)
			}
			if tc.kind == kindUnknown {
				return
			}
			if got := ev.instances(); !slices.Equal(got, tc.want) {
				t.Errorf("instances = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRestrictToKeepsOnlyTheClustersInstances(t *testing.T) {
	ev, err := parseEnvelope(json.RawMessage(`{"id":"e1","source":"aws.health","detail-type":"AWS Health Event","x-unknown":{"kept":true},
		"resources":["arn:aws:ec2:us-east-1:111122223333:instance/i-0aaaaaaaaaaaaaaa1","i-0bbbbbbbbbbbbbbb2"],
		"detail":{"service":"EC2","affectedEntities":[{"entityValue":"i-0aaaaaaaaaaaaaaa1"},{"entityValue":"i-0bbbbbbbbbbbbbbb2"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := ev.restrictTo([]string{"i-0aaaaaaaaaaaaaaa1"})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID        string          `json:"id"`
		Unknown   json.RawMessage `json:"x-unknown"`
		Resources []string        `json:"resources"`
		Detail    struct {
			Service          string `json:"service"`
			AffectedEntities []struct {
				EntityValue string `json:"entityValue"`
			} `json:"affectedEntities"`
		} `json:"detail"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Resources, []string{"arn:aws:ec2:us-east-1:111122223333:instance/i-0aaaaaaaaaaaaaaa1"}) {
		t.Errorf("resources = %v", got.Resources)
	}
	if len(got.Detail.AffectedEntities) != 1 || got.Detail.AffectedEntities[0].EntityValue != "i-0aaaaaaaaaaaaaaa1" {
		t.Errorf("affectedEntities = %+v", got.Detail.AffectedEntities)
	}
	if got.ID != "e1" || got.Detail.Service != "EC2" || string(got.Unknown) != `{"kept":true}` {
		t.Errorf("envelope fields lost: %s", b)
	}
}

func TestClusterOf(t *testing.T) {
	tag := func(k, v string) ec2types.Tag { return ec2types.Tag{Key: aws.String(k), Value: aws.String(v)} }
	for _, tc := range []struct {
		name string
		tags []ec2types.Tag
		want string
	}{
		{"karpenter tag", []ec2types.Tag{tag("eks:eks-cluster-name", "alpha"), tag("kubernetes.io/cluster/alpha", "owned")}, "alpha"},
		{"managed node group tag", []ec2types.Tag{tag("eks:cluster-name", "beta")}, "beta"},
		{"kubernetes.io/cluster tag", []ec2types.Tag{tag("kubernetes.io/cluster/gamma", "owned")}, "gamma"},
		{"shared cluster tag", []ec2types.Tag{tag("kubernetes.io/cluster/gamma", "shared")}, "gamma"},
		{"cluster tag with another value", []ec2types.Tag{tag("kubernetes.io/cluster/gamma", "nope")}, ""},
		{"two cluster tags are ambiguous", []ec2types.Tag{tag("kubernetes.io/cluster/a", "owned"), tag("kubernetes.io/cluster/b", "owned")}, ""},
		{"eks tag wins over cluster tags", []ec2types.Tag{tag("kubernetes.io/cluster/a", "owned"), tag("kubernetes.io/cluster/b", "owned"), tag("eks:eks-cluster-name", "b")}, "b"},
		{"no tags", nil, ""},
	} {
		if got := clusterOf(tc.tags); got != tc.want {
			t.Errorf("%s: clusterOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestParseQueues(t *testing.T) {
	q, err := ParseQueues(`{"alpha":"https://sqs.us-east-1.amazonaws.com/111122223333/hr-alpha","beta":"https://sqs.us-east-1.amazonaws.com/111122223333/hr-beta"}`)
	if err != nil || len(q) != 2 || q["beta"] != "https://sqs.us-east-1.amazonaws.com/111122223333/hr-beta" {
		t.Errorf("ParseQueues = %v, %v", q, err)
	}
	for _, bad := range []string{"", "{}", "[]", `{"alpha":""}`, `{"":"https://x"}`, "not json"} {
		if _, err := ParseQueues(bad); err == nil {
			t.Errorf("ParseQueues(%q) = nil error, want one", bad)
		}
	}
}
