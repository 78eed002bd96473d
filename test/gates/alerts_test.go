// Package gates tests the drain gates on real servers: the alert gate against a real
// Alertmanager built by test/tools/alertmanager-bin.sh.
package gates

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/harness"
)

// countingTransport counts the requests that reach Alertmanager.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

func matcher(t *testing.T, expr string) *policy.AlertMatcher {
	t.Helper()
	m, err := policy.ParseAlertMatcher(expr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func startAlertmanager(t *testing.T) *harness.Alertmanager {
	t.Helper()
	am, err := harness.StartAlertmanager(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(am.Stop)
	return am
}

// TestAlertGate: the gate holds while a matching alert fires and releases when it resolves,
// filters by name and labels, and does not count silenced alerts.
func TestAlertGate(t *testing.T) {
	am := startAlertmanager(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	rt := &countingTransport{}
	g := gates.NewAlerts(am.URL+"/", &http.Client{Transport: rt}, clk)
	ctx := context.Background()
	expire := func() { clk.SetTime(clk.Now().Add(16 * time.Second)) } // past alertsTTL

	kafka := matcher(t, `KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`)
	if gate := g.Check(ctx, kafka, policy.UnreachableHold); gate.Held || gate.Name != policy.GateAlerts || !strings.Contains(gate.Reason, "no alert matching") {
		t.Fatalf("no alerts yet: %+v", gate)
	}

	started := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	under := harness.PostedAlert{Labels: map[string]string{"alertname": "KafkaUnderReplicatedPartitions", "severity": "critical", "cluster": "prod-eu"}, StartsAt: started}
	zkWarn := harness.PostedAlert{Labels: map[string]string{"alertname": "ZookeeperDown", "severity": "warning", "cluster": "prod-eu"}, StartsAt: started.Add(-time.Hour)}
	staging := harness.PostedAlert{Labels: map[string]string{"alertname": "KafkaUnderReplicatedPartitions", "severity": "critical", "cluster": "staging"}, StartsAt: started.Add(-2 * time.Hour)}
	if err := am.Post(under, zkWarn, staging); err != nil {
		t.Fatal(err)
	}
	if gate := g.Check(ctx, kafka, policy.UnreachableHold); gate.Held {
		t.Errorf("the answer is cached for alertsTTL, yet a fresh one was used: %+v", gate)
	}
	expire()
	gate := g.Check(ctx, kafka, policy.UnreachableHold)
	if !gate.Held || gate.Evidence[gates.EvidenceAlerts] != "KafkaUnderReplicatedPartitions" || !gate.Since.Equal(started) {
		t.Errorf("firing alert: %+v (want since %s: the prod alert only, the warning and staging ones filtered out)", gate, started)
	}
	if !strings.Contains(gate.Reason, "KafkaUnderReplicatedPartitions") || !strings.Contains(gate.Reason, kafka.Source) {
		t.Errorf("reason names neither the alert nor the matcher: %q", gate.Reason)
	}

	for _, tt := range []struct {
		expr   string
		held   bool
		alerts string
	}{
		{"Zookeeper.*", true, "ZookeeperDown"},
		{`Zookeeper.*{severity="critical"}`, false, ""},
		{`.*{cluster="staging"}`, true, "KafkaUnderReplicatedPartitions"},
		{`Kafka.*|Zookeeper.*{cluster=~"prod-.*"}`, true, "KafkaUnderReplicatedPartitions,ZookeeperDown"},
		{"KafkaOffline", false, ""},
	} {
		gate := g.Check(ctx, matcher(t, tt.expr), policy.UnreachableHold)
		if gate.Held != tt.held || gate.Evidence[gates.EvidenceAlerts] != tt.alerts {
			t.Errorf("%s: %+v, want held=%v alerts=%q", tt.expr, gate, tt.held, tt.alerts)
		}
	}

	// A silenced alert does not fire.
	if err := am.Silence("alertname", "ZookeeperDown"); err != nil {
		t.Fatal(err)
	}
	expire()
	if gate := g.Check(ctx, matcher(t, "Zookeeper.*"), policy.UnreachableHold); gate.Held {
		t.Errorf("silenced alert held the drain: %+v", gate)
	}

	// Resolved (endsAt in the past): the gate releases.
	under.EndsAt = time.Now().Add(-time.Second)
	staging.EndsAt = under.EndsAt
	if err := am.Post(under, staging); err != nil {
		t.Fatal(err)
	}
	expire()
	if gate := g.Check(ctx, kafka, policy.UnreachableHold); gate.Held {
		t.Errorf("resolved alert still holds: %+v", gate)
	}

	// One request answers many concurrent gates (a window opening over many drains).
	expire()
	before := rt.n.Load()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { g.Check(ctx, kafka, policy.UnreachableHold) })
	}
	wg.Wait()
	if n := rt.n.Load() - before; n != 1 {
		t.Errorf("50 concurrent checks made %d requests, want 1", n)
	}
}

// TestAlertGateUnreachable: with Alertmanager down, each pool fails safe as it asks, the
// decision says so, and the failure answers for alertsTTL too.
func TestAlertGateUnreachable(t *testing.T) {
	am := startAlertmanager(t)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	rt := &countingTransport{}
	g := gates.NewAlerts(am.URL, &http.Client{Transport: rt}, clk)
	ctx := context.Background()
	m := matcher(t, "Kafka.*")
	if gate := g.Check(ctx, m, policy.UnreachableHold); gate.Held {
		t.Fatalf("up and quiet: %+v", gate)
	}
	am.Stop()
	clk.SetTime(clk.Now().Add(16 * time.Second))

	hold := g.Check(ctx, m, policy.UnreachableHold)
	if !hold.Held || !strings.Contains(hold.Reason, "Alertmanager unreachable") || !strings.Contains(hold.Reason, "hold") {
		t.Errorf("unreachable, hold: %+v", hold)
	}
	drain := g.Check(ctx, m, policy.UnreachableDrain)
	if drain.Held || !strings.Contains(drain.Reason, "Alertmanager unreachable") || !strings.Contains(drain.Reason, "lets the drain go") {
		t.Errorf("unreachable, drain: %+v", drain)
	}
	if n := rt.n.Load(); n != 2 {
		t.Errorf("requests %d, want 2 (the failure is cached for alertsTTL)", n)
	}
	if _, err := g.Firing(ctx); err == nil {
		t.Error("Firing answered without error from a stopped server")
	}

	// Through policy: a held scheduled drain waits with Hold alerts and says why.
	week := clk.Now().Add(7 * 24 * time.Hour)
	ev := eventRetirement(clk.Now(), week)
	p := policy.FromAnnotations(map[string]string{policy.AnnotationHoldWhileAlerts: "Kafka.*"})
	d := policy.ApplyGates(policy.Decision{Action: policy.ActionDrain, Reason: "drain"}, ev, p, []policy.Gate{hold}, clk.Now())
	if d.Action != policy.ActionDefer || d.Hold != policy.HoldAlerts || !strings.Contains(d.Reason, "Alertmanager unreachable") {
		t.Errorf("decision: %+v", d)
	}
}
