package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/policy"
)

var demoNow = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func replayDemo(t *testing.T, aws string, gates ...string) []Row {
	t.Helper()
	g := checks.NewFeatureGates()
	for _, s := range gates {
		if err := g.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	var out, errw bytes.Buffer
	err := Run(context.Background(), Options{
		ClusterFile: "../../test/demo/cluster.yaml", EventsPath: "../../test/demo/events", AWSFile: aws,
		Now: demoNow, Gates: g, Output: "json",
	}, &out, &errw)
	if err != nil {
		t.Fatal(err)
	}
	var rows []Row
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r Row
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	return rows
}

func find(t *testing.T, rows []Row, event, instance string) Row {
	t.Helper()
	for _, r := range rows {
		if strings.HasPrefix(r.EventID, event) && r.InstanceID == instance {
			return r
		}
	}
	t.Fatalf("no row for event %s instance %s", event, instance)
	return Row{}
}

func TestReplayDemo(t *testing.T) {
	rows := replayDemo(t, "../../test/demo/aws.yaml")
	files, _ := filepath.Glob("../../test/demo/events/*.json")
	if len(rows) < len(files) {
		t.Fatalf("%d rows for %d event files", len(rows), len(files))
	}
	tests := []struct {
		event, instance string
		action          policy.Action
		until           string
		reason          string
	}{
		{"6f1c0e52", "i-07c3e1d2b4a596870", policy.ActionIgnore, "", "instance-reboot=ignore"},
		{"6f1c0e52", "i-0a1b2c3d4e5f60718", policy.ActionDrain, "", "Karpenter's behaviour"},
		{"8a2d1f63", "i-0fedcba9876543210", policy.ActionDefer, "2026-11-28T02:00:00Z", "maintenance window"},
		{"9b3e2a74", "i-07c3e1d2b4a596870", policy.ActionDefer, "2026-11-22T08:00:00Z", "opens after deadline"},
		{"ac4f3b85", "i-0fedcba9876543210", policy.ActionDrain, "", "system-maintenance=drain"},
		{"ac4f3b85", "i-01234abcd5678ef90", policy.ActionDefer, "2026-11-29T23:00:00Z", "max-concurrent-drains 1 (1 of 3 nodes, 1 in flight) until a drain finishes"},
		{"ac4f3b85", "i-0aa11bb22cc33dd44", policy.ActionDefer, "2026-11-21T12:05:00Z", "ami-0e1f2a3b4c5d6e7f8 is pending"},
		{"bd5a4c96", "i-0d4c3b2a190817263", policy.ActionDefer, "", "cr-0a1b2c3d4e5f60718 has no room"},
		{"1e5527d7", "i-0b662ef9931388ba0", policy.ActionDrain, "", "two-minute notice"},
		{"2f6638e8", "i-0123456789abcdef0", policy.ActionIgnore, "", "action=ignore"},
		{"3a7749f9", "i-0b662ef9931388ba0", policy.ActionIgnore, "", "recorded only"},
		{"5c996b1b", "i-01234abcd5678ef90", policy.ActionDefer, "2026-11-21T12:05:00Z", "restart-grace"},
		{"6da07c2c", "i-01234abcd5678ef90", policy.ActionIgnore, "", "cancelled"},
		{"7eb18d3d", "i-0d4c3b2a190817263", policy.ActionDrain, "", "two-minute notice"},
		{"8f29ae4e", "i-01234abcd5678ef90", policy.ActionIgnore, "", "closed"},
		{"903abf5f", "", policy.ActionIgnore, "", "ami-0e1f2a3b4c5d6e7f8 is now available"},
		{"a14bc060", "i-0999888777666555a", policy.ActionSkip, "", "not a node"},
		{"b25cd171", "", policy.ActionDeadLetter, "", `service "RDS"`},
		{"d47ef393", "", policy.ActionDeadLetter, "", "unknown-kind"},
		// The organizational view (issue 27, 4): decided on the affected account's instance;
		// its RESOLVED entity has no row.
		{"c3e8f0a1", "i-0123456789abcdef0", policy.ActionIgnore, "", "action=ignore"},
		// A Capacity Block's expiration (issue 27, 5): the NodeClaim that carries the
		// reservation, drained at once.
		{"e58f04a4", "i-0d4c3b2a190817263", policy.ActionDrain, "", "Capacity Block cr-0a1b2c3d4e5f60718 ends; EC2 terminates its instances from 2026-11-21T12:00:00Z"},
	}
	for _, tt := range tests {
		r := find(t, rows, tt.event, tt.instance)
		if r.Action != tt.action {
			t.Errorf("%s/%s: action %s (%s), want %s", tt.event, tt.instance, r.Action, r.Reason, tt.action)
		}
		if tt.until != "" && (r.Until == nil || r.Until.Format(time.RFC3339) != tt.until) {
			t.Errorf("%s/%s: until %v, want %s", tt.event, tt.instance, r.Until, tt.until)
		}
		if !strings.Contains(r.Reason, tt.reason) {
			t.Errorf("%s/%s: reason %q does not mention %q", tt.event, tt.instance, r.Reason, tt.reason)
		}
	}
	for _, r := range rows {
		if strings.HasPrefix(r.EventID, "c3e8f0a1") && r.InstanceID == "i-0b662ef9931388ba0" {
			t.Errorf("the organizational-view event's RESOLVED entity was decided: %+v", r)
		}
	}
	// The capacity-reservation interruption drains anyway and says why it is risky.
	cr := find(t, rows, "7eb18d3d", "i-0d4c3b2a190817263")
	if len(cr.Checks) != 2 || cr.Checks[1].Evidence["available"] != "0" || len(cr.Warnings) == 0 {
		t.Errorf("capacity reservation row: %+v", cr)
	}
	// The malformed line is dead-lettered, not dropped.
	var malformed int
	for _, r := range rows {
		if r.Action == policy.ActionDeadLetter && strings.HasPrefix(r.Reason, "malformed") {
			malformed++
		}
	}
	if malformed != 1 {
		t.Errorf("%d malformed rows, want 1", malformed)
	}
}

// With the ReservedCapacity gate off, reservation data touches no decision: the reserved
// node's drain is not held, and no capacity-reservation check appears anywhere.
func TestReplayReservedCapacityGateOff(t *testing.T) {
	rows := replayDemo(t, "../../test/demo/aws.yaml", "ReservedCapacity=false")
	r := find(t, rows, "bd5a4c96", "i-0d4c3b2a190817263")
	if r.Action != policy.ActionDrain {
		t.Errorf("reserved node with the gate off: %s (%s)", r.Action, r.Reason)
	}
	for _, r := range rows {
		for _, c := range r.Checks {
			if c.Name == checks.NameCapacityReservation {
				t.Errorf("capacity-reservation check ran with the gate off: %+v", r)
			}
		}
	}
}

func TestReplayWithoutAWSFileRunsNoCheck(t *testing.T) {
	rows := replayDemo(t, "")
	for _, r := range rows {
		if len(r.Checks) != 0 {
			t.Fatalf("checks without --aws: %+v", r)
		}
	}
	if r := find(t, rows, "ac4f3b85", "i-0aa11bb22cc33dd44"); r.Action != policy.ActionDrain {
		t.Errorf("gpu node without checks: %s", r.Action)
	}
}

func TestReplayTable(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), Options{
		ClusterFile: "../../test/demo/cluster.yaml", EventsPath: "../../test/demo/events/06-spot-interruption.json",
		Now: demoNow, Gates: checks.NewFeatureGates(), Output: "table",
	}, &out, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "EVENT") || !strings.Contains(out.String(), "i-0b662ef9931388ba0") || !strings.Contains(out.String(), "pre-signal checks not run") {
		t.Errorf("table:\n%s", out.String())
	}
}

func TestReplayJSONLines(t *testing.T) {
	dir := t.TempDir()
	a, _ := os.ReadFile("../../test/demo/events/06-spot-interruption.json")
	b, _ := os.ReadFile("../../test/demo/events/08-rebalance.json")
	compact := func(in []byte) string {
		var buf bytes.Buffer
		if err := json.Compact(&buf, in); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	path := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(path, []byte(compact(a)+"\n\n"+compact(b)+"\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), Options{ClusterFile: "../../test/demo/cluster.yaml", EventsPath: path, Now: demoNow, Gates: checks.NewFeatureGates(), Output: "json"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], `"dead-letter"`) || !strings.Contains(lines[2], "events.jsonl:4") {
		t.Errorf("jsonl rows:\n%s", out.String())
	}
}

func TestLoadAWSFileStrict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "aws.yaml")
	os.WriteFile(path, []byte("images:\n  - id: ami-1\n    stat: available\n"), 0o644)
	if _, err := LoadAWS(path); err == nil {
		t.Error("a misspelt field was accepted")
	}
}

// TestReplayReschedule: with the kafka pool annotated reschedule=true and the instance's
// scheduled event in --aws (as describe-instance-status prints it), replay shows the move
// as a what-if and decides the event as it would stand once moved; without the event in
// --aws, it says why nothing would move.
func TestReplayReschedule(t *testing.T) {
	dir := t.TempDir()
	cl, err := os.ReadFile("../../test/demo/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	annotated := strings.Replace(string(cl), "      healthrouter.io/drain-lead: 2h\n", "      healthrouter.io/drain-lead: 2h\n      healthrouter.io/reschedule: \"true\"\n", 1)
	if annotated == string(cl) {
		t.Fatal("the demo's kafka pool has no drain-lead line to annotate after")
	}
	clusterFile := filepath.Join(dir, "cluster.yaml")
	awsDir := filepath.Join(dir, "aws")
	if err := os.Mkdir(awsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	demoAWS, err := os.ReadFile("../../test/demo/aws.yaml")
	if err != nil {
		t.Fatal(err)
	}
	status := `{"InstanceStatuses": [{"InstanceId": "i-01234abcd5678ef90", "AvailabilityZone": "eu-west-1a",
  "InstanceState": {"Code": 16, "Name": "running"},
  "Events": [{"InstanceEventId": "instance-event-0d59937288b749b32", "Code": "instance-retirement", "Description": "The instance is running on degraded hardware",
    "NotBefore": "2026-12-02T15:00:00+00:00", "NotBeforeDeadline": "2026-12-09T15:00:00+00:00"}]}]}`
	for name, body := range map[string]string{"aws.yaml": string(demoAWS), "describe-instance-status.json": status} {
		if err := os.WriteFile(filepath.Join(awsDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(clusterFile, []byte(annotated), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(aws string) Row {
		var out bytes.Buffer
		if err := Run(context.Background(), Options{ClusterFile: clusterFile, EventsPath: "../../test/demo/events/02-health-retirement.json", AWSFile: aws,
			Now: demoNow, Gates: checks.NewFeatureGates(), Output: "json"}, &out, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var r Row
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			if r.InstanceID == "i-01234abcd5678ef90" {
				return r
			}
		}
		t.Fatalf("no row for the kafka instance:\n%s", out.String())
		return Row{}
	}
	r := run(awsDir)
	want := "what-if: rescheduled instance-event-0d59937288b749b32 moved from 2026-12-02T15:00:00Z to 2026-11-28T04:00:00Z"
	if r.Action != policy.ActionDefer || !strings.HasPrefix(r.Reason, want) || r.Until == nil || !r.Until.Equal(time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)) ||
		r.Deadline == nil || !r.Deadline.Equal(time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("row %+v\nwant a deferral to the window opening, the deadline moved, the reason starting %q", r, want)
	}
	r = run("../../test/demo/aws.yaml")
	if !strings.HasPrefix(r.Reason, "not rescheduled: EC2 reports no open instance-retirement event") || r.Deadline == nil || !r.Deadline.Equal(time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)) {
		t.Errorf("without the event in --aws: %+v", r)
	}
}

// TestReplayRebootInPlace: a pool that keeps its nodes through instance reboots shows the
// deferral to the window, and at a time when it is due the in-place steps (as a what-if).
func TestReplayRebootInPlace(t *testing.T) {
	cl, err := os.ReadFile("../../test/demo/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	annotated := strings.Replace(string(cl), "healthrouter.io/action.scheduled-change.instance-reboot: ignore", "healthrouter.io/action.scheduled-change.instance-reboot: reboot-in-place", 1)
	if annotated == string(cl) {
		t.Fatal("the demo's kafka pool no longer ignores instance reboots")
	}
	clusterFile := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := os.WriteFile(clusterFile, []byte(annotated), 0o644); err != nil {
		t.Fatal(err)
	}
	row := func(now time.Time) Row {
		var out bytes.Buffer
		if err := Run(context.Background(), Options{ClusterFile: clusterFile, EventsPath: "../../test/demo/events/01-health-instance-reboot.json",
			Now: now, Gates: checks.NewFeatureGates(), Output: "json"}, &out, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var r Row
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatal(err)
			}
			if r.InstanceID == "i-07c3e1d2b4a596870" {
				return r
			}
		}
		t.Fatalf("no kafka row:\n%s", out.String())
		return Row{}
	}
	// The demo's now: the reboot is Thursday 03:00, the window Saturday: deadline minus
	// drain-lead (2h) comes first.
	if r := row(demoNow); r.Action != policy.ActionDefer || r.Until == nil || !r.Until.Equal(time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)) {
		t.Errorf("before: %+v", r)
	}
	due := time.Date(2026, 11, 26, 1, 30, 0, 0, time.UTC)
	if r := row(due); r.Action != policy.ActionRebootInPlace || !strings.Contains(r.Reason, "what-if steps: cordon → evict → reboot → await → ready → uncordon → done") {
		t.Errorf("due: %+v", r)
	}
}

// TestReplayStrict: a pool's annotation problems are printed either way; --strict fails the
// run on them (after the rows), so a CI job that replays a snapshot catches a bad annotation.
func TestReplayStrict(t *testing.T) {
	for _, strict := range []bool{false, true} {
		var out, errw bytes.Buffer
		err := Run(context.Background(), Options{
			ClusterFile: "testdata/problems/cluster.yaml", EventsPath: "../../test/demo/events/06-spot-interruption.json",
			Now: demoNow, Gates: checks.NewFeatureGates(), Output: "table", Strict: strict,
		}, &out, &errw)
		if !strings.Contains(errw.String(), "NodePool kafka: ") || !strings.Contains(errw.String(), "12.5%") || strings.Contains(errw.String(), "NodePool web") {
			t.Errorf("strict=%v: stderr %q, want kafka's problem only", strict, errw.String())
		}
		if got := errors.Is(err, ErrPoolProblems); got != strict {
			t.Errorf("strict=%v: err %v", strict, err)
		}
		if !strings.Contains(out.String(), "EVENT") {
			t.Errorf("strict=%v: no table written:\n%s", strict, out.String())
		}
	}
	var errw bytes.Buffer
	if err := Run(context.Background(), Options{ClusterFile: "../../test/demo/cluster.yaml", EventsPath: "../../test/demo/events/06-spot-interruption.json",
		Now: demoNow, Gates: checks.NewFeatureGates(), Output: "json", Strict: true}, &bytes.Buffer{}, &errw); err != nil {
		t.Errorf("the demo's pools under --strict: %v (%s)", err, errw.String())
	}
}

// Inputs that would print an empty or meaningless table are refused, each naming what is
// missing: an events directory with no event files, event files with no event, and a
// cluster snapshot with no Nodes (every event would resolve to nothing).
func TestReplayRefusesEmptyInputs(t *testing.T) {
	empty, other, blank := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(other, "README.md"), []byte("not events"), 0o644)
	os.WriteFile(filepath.Join(blank, "storm.jsonl"), []byte("\n\n"), 0o644)
	noNodes := filepath.Join(t.TempDir(), "cluster.yaml")
	os.WriteFile(noNodes, []byte("apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata:\n  name: default\n"), 0o644)
	for _, tc := range []struct {
		name            string
		cluster, events string
		want            string
	}{
		{"empty directory", "../../test/demo/cluster.yaml", empty, "--events: " + empty + ": no .json, .jsonl or .ndjson files"},
		{"no event files", "../../test/demo/cluster.yaml", other, "no .json, .jsonl or .ndjson files"},
		{"empty files", "../../test/demo/cluster.yaml", blank, "--events: " + blank + ": no events"},
		{"no Nodes", noNodes, "../../test/demo/events", "--cluster " + noNodes + ": no Nodes in the snapshot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Run(context.Background(), Options{ClusterFile: tc.cluster, EventsPath: tc.events, Now: demoNow, Gates: checks.NewFeatureGates(), Output: "table"}, &out, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("a table was written:\n%s", out.String())
			}
		})
	}
}

var update = flag.Bool("update", false, "rewrite testdata/*.golden from this run")

// The demo's table, with its SOURCE column (the file, and the line of a JSON-lines file, of
// each row), checks, gates and warnings, is the golden file: `go test ./router/replay -update`
// rewrites it after a deliberate change.
func TestReplayDemoTableGolden(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), Options{
		ClusterFile: "../../test/demo/cluster.yaml", EventsPath: "../../test/demo/events", AWSFile: "../../test/demo/aws.yaml",
		Now: demoNow, Gates: checks.NewFeatureGates(), Output: "table",
	}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "demo-table.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if out.String() != string(want) {
		t.Errorf("the demo's table differs from %s (-update rewrites it):\n%s", golden, out.String())
	}
	for _, source := range []string{"06-spot-interruption.json ", "17-malformed.jsonl:2 "} {
		if !strings.Contains(out.String(), "\n"+source) {
			t.Errorf("no row starts with source %q", source)
		}
	}
}
