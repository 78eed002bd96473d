package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
)

func TestGateAnnotations(t *testing.T) {
	p := FromAnnotations(nil)
	if !p.RespectPDB || p.HoldWhileAlerts != nil || p.AlertsUnreachable != UnreachableHold || p.DrainSettle != (Settle{}) {
		t.Errorf("defaults: %+v", p)
	}
	p = FromAnnotations(map[string]string{
		AnnotationRespectPDB:                 "false",
		AnnotationHoldWhileAlerts:            `KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`,
		AnnotationHoldWhileAlertsUnreachable: "drain",
		AnnotationDrainSettle:                "ready",
	})
	if len(p.Problems) != 0 || p.RespectPDB || p.HoldWhileAlerts == nil || p.AlertsUnreachable != UnreachableDrain || !p.DrainSettle.Ready {
		t.Errorf("set: %+v", p)
	}
	if s := FromAnnotations(map[string]string{AnnotationDrainSettle: "10m"}).DrainSettle; s.Duration != 10*time.Minute || s.Ready {
		t.Errorf("settle 10m: %+v", s)
	}
	for _, tt := range []struct{ key, value, problem string }{
		{AnnotationRespectPDB, "maybe", "want true or false"},
		{AnnotationHoldWhileAlerts, "Kafka(", "alert name expression"},
		{AnnotationHoldWhileAlerts, `Kafka.*{severity=critical}`, "double-quoted"},
		{AnnotationHoldWhileAlerts, `Kafka.*{severity="critical"`, "closing brace"},
		{AnnotationHoldWhileAlerts, `Kafka.*{cluster=~"prod-("}`, "label cluster"},
		{AnnotationHoldWhileAlerts, `Kafka.*{a="1" b="2"}`, "comma"},
		{AnnotationHoldWhileAlerts, " ", "empty"},
		{AnnotationHoldWhileAlertsUnreachable, "ignore", "want hold or drain"},
		{AnnotationDrainSettle, "soon", "or ready"},
		{AnnotationDrainSettle, "-1m", "or ready"},
	} {
		p := FromAnnotations(map[string]string{tt.key: tt.value})
		if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], tt.problem) || !strings.Contains(p.Problems[0], tt.key) {
			t.Errorf("%s=%q: problems %q, want one naming %q", tt.key, tt.value, p.Problems, tt.problem)
		}
	}
	if bad := FromAnnotations(map[string]string{AnnotationRespectPDB: "maybe"}); !bad.RespectPDB {
		t.Error("an invalid respect-pdb must leave the default (true)")
	}
}

func TestParseAlertMatcher(t *testing.T) {
	labels := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	// matches is how a gate evaluates the matcher (router/gates does the same).
	matches := func(m *AlertMatcher, name string, ls map[string]string) bool {
		if !m.Names.MatchString(name) {
			return false
		}
		for _, lm := range m.Labels {
			if !lm.Matches(ls[lm.Name]) {
				return false
			}
		}
		return true
	}
	tests := []struct {
		expr   string
		name   string
		labels map[string]string
		want   bool
	}{
		{"KafkaUnderReplicated.*", "KafkaUnderReplicatedPartitions", nil, true},
		{"KafkaUnderReplicated.*", "XKafkaUnderReplicated", nil, false}, // anchored
		{"Kafka|Zookeeper", "ZookeeperDown", nil, false},
		{`KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`, "ZookeeperDown", labels("severity", "critical", "cluster", "prod-eu"), true},
		{`KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`, "KafkaUnderReplicatedPartitions", labels("severity", "critical", "cluster", "prod-eu"), true},
		{`KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`, "ZookeeperDown", labels("severity", "warning", "cluster", "prod-eu"), false},
		{`KafkaUnderReplicated.*|Zookeeper.*{severity="critical",cluster=~"prod-.*"}`, "ZookeeperDown", labels("severity", "critical", "cluster", "xprod-eu"), false},
		{`Kafka.*{severity!="info", team!~"data|ml"}`, "KafkaDown", labels("severity", "warning", "team", "infra"), true},
		{`Kafka.*{severity!="info", team!~"data|ml"}`, "KafkaDown", labels("severity", "warning", "team", "ml"), false},
		{`Kafka.*{env="prod"}`, "KafkaDown", nil, false}, // absent label is empty
		{`Kafka.*{env!="prod"}`, "KafkaDown", nil, true},
		{`{severity="critical"}`, "Anything", labels("severity", "critical"), true},
		{`Dis{2}k`, "Dissk", nil, true}, // a quantifier is part of the name expression
		{`Kafka.*{msg="a \"quoted\", value"}`, "KafkaX", labels("msg", `a "quoted", value`), true},
	}
	for _, tt := range tests {
		m, err := ParseAlertMatcher(tt.expr)
		if err != nil {
			t.Errorf("%s: %v", tt.expr, err)
			continue
		}
		if got := matches(m, tt.name, tt.labels); got != tt.want {
			t.Errorf("%s on %s %v: %v, want %v", tt.expr, tt.name, tt.labels, got, tt.want)
		}
		if m.String() != tt.expr {
			t.Errorf("String() %q, want the source %q", m.String(), tt.expr)
		}
	}
}

func TestApplyGates(t *testing.T) {
	week := now.Add(7 * 24 * time.Hour)
	p := FromAnnotations(nil)
	open := Gate{Name: GatePDB, Reason: "no PodDisruptionBudget at zero"}
	pdb := Gate{Name: GatePDB, Held: true, Reason: "PodDisruptionBudget kafka/kafka-pdb allows no disruption", Evidence: map[string]string{"pdb": "kafka/kafka-pdb"}}
	since := now.Add(-20 * time.Minute)
	alerts := Gate{Name: GateAlerts, Held: true, Reason: "firing: KafkaUnderReplicatedPartitions", Since: since}
	unreachable := Gate{Name: GateAlerts, Held: true, Reason: "Alertmanager unreachable (hold-while-alerts-unreachable=hold): connection refused"}
	retire := func(deadline time.Time) event.Event { return scheduled(event.ScheduledInstanceRetirement, deadline) }
	spot := instanceEvent(event.KindSpotInterruption, "")
	noDeadline := instanceEvent(event.KindRebalance, "")
	rebalanceTarget := target(map[string]string{ActionKey(event.KindRebalance): "drain"})
	stopped := event.Event{ID: "ev-3", Kind: event.KindStateChange, State: event.StateStopped, Time: now.Add(-time.Hour)}
	stopTarget := target(map[string]string{ActionKey(event.KindStateChange): "drain"})
	impaired := event.Event{ID: "ev-4", Kind: event.KindInstanceStatus, Time: now.Add(-time.Minute)}
	// A terminated EC2 contradicts (it shows the instance running): a forged claim, decided as
	// an ordinary drain (issue 36, defect 7). The instance serves: the gates hold it.
	contradicted := event.Event{ID: "ev-5", Kind: event.KindStateChange, State: event.StateTerminated, Time: now.Add(-time.Minute),
		Implausible: "a terminated state change for an instance EC2 shows running"}
	tests := []struct {
		name    string
		ev      event.Event
		tg      Target
		gates   []Gate
		action  Action
		hold    Hold
		until   time.Time
		reason  string
		warning string
	}{
		{name: "open gates drain", ev: retire(week), tg: target(nil), gates: []Gate{open}, action: ActionDrain},
		{name: "pdb at zero holds a minute", ev: retire(week), tg: target(nil), gates: []Gate{pdb}, action: ActionDefer, hold: HoldPDB, until: now.Add(GateRecheck), reason: "kafka/kafka-pdb"},
		{name: "alert holds", ev: retire(week), tg: target(nil), gates: []Gate{open, alerts}, action: ActionDefer, hold: HoldAlerts, until: now.Add(GateRecheck), reason: "KafkaUnderReplicatedPartitions"},
		{name: "first holding gate names the hold", ev: retire(week), tg: target(nil), gates: []Gate{pdb, alerts}, action: ActionDefer, hold: HoldPDB, reason: "gate alerts"},
		{name: "unreachable held says so", ev: retire(week), tg: target(nil), gates: []Gate{unreachable}, action: ActionDefer, hold: HoldAlerts, reason: "Alertmanager unreachable"},
		{name: "capped at deadline minus drain-lead", ev: retire(now.Add(time.Hour + 30*time.Second)), tg: target(nil), gates: []Gate{pdb}, action: ActionDefer, hold: HoldPDB, until: now.Add(30 * time.Second)},
		{name: "at deadline minus drain-lead drains with a warning", ev: retire(now.Add(time.Hour)), tg: target(nil), gates: []Gate{pdb}, action: ActionDrain, warning: "gate pdb"},
		{name: "after deadline minus drain-lead drains", ev: retire(now.Add(30 * time.Minute)), tg: target(nil), gates: []Gate{alerts}, action: ActionDrain, warning: "deadline minus drain-lead is reached: gate alerts"},
		{name: "urgent never waits", ev: spot, tg: target(nil), gates: []Gate{pdb, alerts}, action: ActionDrain, warning: "gate pdb"},
		{name: "no deadline: rechecked", ev: noDeadline, tg: rebalanceTarget, gates: []Gate{alerts}, action: ActionDefer, hold: HoldAlerts, until: now.Add(GateRecheck)},
		{name: "stopped instance never waits", ev: stopped, tg: stopTarget, gates: []Gate{pdb}, action: ActionDrain, warning: "instance is stopped past restart-grace: not serving"},
		{name: "impaired instance never waits", ev: impaired, tg: target(nil), gates: []Gate{pdb}, action: ActionDrain, warning: "impaired: not serving"},
		{name: "a terminated EC2 contradicts waits for the pdb", ev: contradicted, tg: target(nil), gates: []Gate{pdb}, action: ActionDefer, hold: HoldPDB, until: now.Add(GateRecheck), reason: "kafka/kafka-pdb", warning: "not trusted as urgent"},
		{name: "and for an alert", ev: contradicted, tg: target(nil), gates: []Gate{alerts}, action: ActionDefer, hold: HoldAlerts, until: now.Add(GateRecheck), warning: "not trusted as urgent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d0 := Decide(tt.ev, tt.tg, now)
			if d0.Action != ActionDrain {
				t.Fatalf("setup: %s: %s", d0.Action, d0.Reason)
			}
			d := ApplyGates(d0, tt.ev, p, tt.gates, now)
			if d.Action != tt.action || d.Hold != tt.hold {
				t.Errorf("%s hold %q, want %s hold %q (%s)", d.Action, d.Hold, tt.action, tt.hold, d.Reason)
			}
			if !tt.until.IsZero() && !d.Until.Equal(tt.until) {
				t.Errorf("until %s, want %s", d.Until, tt.until)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q lacks %q", d.Reason, tt.reason)
			}
			if tt.warning != "" && !strings.Contains(strings.Join(d.Warnings, "|"), tt.warning) {
				t.Errorf("warnings %q lack %q", d.Warnings, tt.warning)
			}
			if tt.warning == "" && len(d.Warnings) != 0 {
				t.Errorf("unexpected warnings %q", d.Warnings)
			}
			if len(d.Gates) != len(tt.gates) {
				t.Errorf("gates recorded %d, want %d", len(d.Gates), len(tt.gates))
			}
		})
	}
	ign := Decide(instanceEvent(event.KindRebalance, ""), target(nil), now)
	if d := ApplyGates(ign, instanceEvent(event.KindRebalance, ""), p, []Gate{pdb}, now); d.Action != ActionIgnore || len(d.Gates) != 1 {
		t.Errorf("gates changed a non-drain: %+v", d)
	}
	deferred := Decide(retire(week), target(map[string]string{AnnotationAction: "defer"}), now)
	if d := ApplyGates(deferred, retire(week), p, []Gate{pdb}, now); d.Action != ActionDefer || d.Hold != HoldDeadline {
		t.Errorf("gates changed a deferral's hold: %+v", d)
	}
}

func TestGated(t *testing.T) {
	off := FromAnnotations(map[string]string{AnnotationRespectPDB: "false"})
	alerts := FromAnnotations(map[string]string{AnnotationRespectPDB: "false", AnnotationHoldWhileAlerts: "Kafka.*"})
	week := now.Add(7 * 24 * time.Hour)
	for _, tt := range []struct {
		name string
		ev   event.Event
		p    Policy
		want bool
	}{
		{"default pdb gate", scheduled(event.ScheduledInstanceRetirement, week), FromAnnotations(nil), true},
		{"no gate on", scheduled(event.ScheduledInstanceRetirement, week), off, false},
		{"alert gate only", scheduled(event.ScheduledInstanceRetirement, week), alerts, true},
		{"urgent", instanceEvent(event.KindSpotInterruption, ""), alerts, false},
		{"rebalance", instanceEvent(event.KindRebalance, ""), alerts, true},
		{"stopped past restart-grace", event.Event{Kind: event.KindStateChange, State: event.StateStopped, Time: now.Add(-DefaultRestartGrace)}, alerts, false},
		{"stopped within restart-grace: it may serve again", event.Event{Kind: event.KindStateChange, State: event.StateStopped, Time: now.Add(-time.Minute)}, alerts, true},
		{"terminated", event.Event{Kind: event.KindStateChange, State: event.StateTerminated, Time: now}, alerts, false},
		{"terminated, contradicted by EC2", event.Event{Kind: event.KindStateChange, State: event.StateTerminated, Time: now, Implausible: "EC2 shows it running"}, alerts, true},
		{"running", event.Event{Kind: event.KindStateChange, State: event.StateRunning, Time: now.Add(-time.Hour)}, alerts, true},
		{"impaired", event.Event{Kind: event.KindInstanceStatus}, alerts, false},
	} {
		if got := Gated(tt.ev, tt.p, now); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
