package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/policy"
)

func runGated(t *testing.T, alerts, output string) (string, []Row) {
	t.Helper()
	var out, errw bytes.Buffer
	err := Run(context.Background(), Options{
		ClusterFile: "testdata/gates/cluster.yaml", EventsPath: "testdata/gates/events.jsonl", AlertsFile: alerts,
		Now: demoNow, Gates: checks.NewFeatureGates(), Output: output,
	}, &out, &errw)
	if err != nil {
		t.Fatal(err)
	}
	if errw.Len() != 0 {
		t.Errorf("warnings about the inputs: %s", errw.String())
	}
	if output != "json" {
		return out.String(), nil
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
	return out.String(), rows
}

func gateNamed(r Row, name string) *policy.Gate {
	for i := range r.Gates {
		if r.Gates[i].Name == name {
			return &r.Gates[i]
		}
	}
	return nil
}

func TestReplayGates(t *testing.T) {
	_, rows := runGated(t, "testdata/gates/alerts.json", "json")
	const kafkaA, kafkaB, webA = "i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2", "i-0ccccccccccccccc3"

	a := find(t, rows, "c0ffee01", kafkaA)
	if a.Action != policy.ActionDefer || a.Until == nil || !a.Until.Equal(demoNow.Add(policy.GateRecheck)) || !strings.Contains(a.Reason, "kafka/kafka-pdb allows no disruption") {
		t.Errorf("kafka-a (PDB at zero): %s until %v: %s", a.Action, a.Until, a.Reason)
	}
	if g := gateNamed(a, policy.GatePDB); g == nil || !g.Held || !g.Since.Equal(time.Date(2026, 11, 21, 11, 30, 0, 0, time.UTC)) || g.Evidence["pdbs"] != "kafka/kafka-pdb" {
		t.Errorf("kafka-a pdb gate: %+v", g)
	}
	if g := gateNamed(a, policy.GateAlerts); g == nil || !g.Held {
		t.Errorf("kafka-a alert gate: %+v", g)
	}

	b := find(t, rows, "c0ffee01", kafkaB)
	if b.Action != policy.ActionDefer || !strings.Contains(b.Reason, "KafkaUnderReplicatedPartitions") {
		t.Errorf("kafka-b (alert firing): %s: %s", b.Action, b.Reason)
	}
	if g := gateNamed(b, policy.GatePDB); g == nil || g.Held {
		t.Errorf("kafka-b pdb gate (zk-pdb allows one; the DaemonSet pod under kafka-pdb is not evicted): %+v", g)
	}
	if g := gateNamed(b, policy.GateAlerts); g == nil || !g.Held || !g.Since.Equal(time.Date(2026, 11, 21, 11, 42, 0, 0, time.UTC)) || g.Evidence["alerts"] != "KafkaUnderReplicatedPartitions" {
		t.Errorf("kafka-b alert gate (prod-eu only, since 11:42): %+v", g)
	}

	w := find(t, rows, "c0ffee01", webA)
	if w.Action != policy.ActionDrain || len(w.Gates) != 1 || w.Gates[0].Held {
		t.Errorf("web-a (default PDB gate, open): %s %+v", w.Action, w.Gates)
	}

	soon := find(t, rows, "c0ffee02", kafkaA)
	if soon.Action != policy.ActionDrain || !strings.Contains(strings.Join(soon.Warnings, "|"), "deadline minus drain-lead is reached: gate pdb") {
		t.Errorf("past deadline minus drain-lead: %s %q", soon.Action, soon.Warnings)
	}

	spot := find(t, rows, "c0ffee03", kafkaA)
	if spot.Action != policy.ActionDrain || len(spot.Gates) != 0 {
		t.Errorf("spot interruption passes every gate: %s %+v", spot.Action, spot.Gates)
	}

	// Without --alerts: the alert gate is not run, and kafka-b drains.
	table, _ := runGated(t, "", "table")
	if !strings.Contains(table, "alert gate not run") || !strings.Contains(table, "gate pdb HELD: PodDisruptionBudget kafka/kafka-pdb") || !strings.Contains(table, "(since 2026-11-21T11:30:00Z)") {
		t.Errorf("table:\n%s", table)
	}
	_, rows = runGated(t, "", "json")
	if b := find(t, rows, "c0ffee01", kafkaB); b.Action != policy.ActionDrain || gateNamed(b, policy.GateAlerts) != nil {
		t.Errorf("kafka-b without --alerts: %s %+v", b.Action, b.Gates)
	}
}

func TestReplayAlertsFileInvalid(t *testing.T) {
	err := Run(context.Background(), Options{
		ClusterFile: "testdata/gates/cluster.yaml", EventsPath: "testdata/gates/events.jsonl", AlertsFile: "testdata/gates/cluster.yaml",
		Now: demoNow, Gates: checks.NewFeatureGates(), Output: "json",
	}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--alerts") || !strings.Contains(err.Error(), "/api/v2/alerts") {
		t.Errorf("a YAML file as --alerts: %v", err)
	}
}
