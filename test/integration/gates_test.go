package integration

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// TestGates runs the gates end to end: the router's production wiring (app.Run) on envtest
// with Pods and PodDisruptionBudgets, and a real Alertmanager (ALERTMANAGER_BIN, built by
// test/tools/alertmanager-bin.sh).
func TestGates(t *testing.T) {
	s := newStage(t)
	am, err := harness.StartAlertmanager(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(am.Stop)
	s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) { o.AlertmanagerURL = am.URL })

	// A broker pod on each node, and a PodDisruptionBudget over them.
	pod := func(name, node string) {
		s.create(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "kafka"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "broker", Image: "kafka"}}}})
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &intstr.IntOrString{IntVal: 1}, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kafka"}}}}
	s.create(pdb)
	setAllowed := func(n int32) {
		t.Helper()
		pdb.Status = policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: n, ExpectedPods: 3, CurrentHealthy: 3 - 1 + n, DesiredHealthy: 2, ObservedGeneration: pdb.Generation}
		if err := s.kube.Status().Update(s.ctx, pdb); err != nil {
			t.Fatal(err)
		}
	}
	setAllowed(0) // a broker is catching up: no disruption allowed
	s.pool("kafka", nil)
	held := s.node("kafka", "i-0a1b2c3d4e5f60201")
	pod("broker-0", "ip-e5f60201")
	late := s.node("kafka", "i-0a1b2c3d4e5f60202")
	pod("broker-1", "ip-e5f60202")
	spotted := s.spotNode("kafka", "i-0a1b2c3d4e5f60203")
	pod("broker-2", "ip-e5f60203")

	retire := func(id string, start time.Time) {
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start, "upcoming", "arn:aws:health:eu-west-1::event/EC2/RET/"+id, id), id)
	}
	holdOf := func(claim string) policy.Hold {
		for _, d := range s.records(claim) {
			if d.Active() {
				return d.Hold
			}
		}
		return ""
	}

	t.Run("a PDB at zero holds a retirement; it goes when the PDB allows a disruption", func(t *testing.T) {
		s.t = t
		retire("i-0a1b2c3d4e5f60201", time.Now().Add(72*time.Hour))
		s.eventually("held by the PDB", 30*time.Second, func() bool { return holdOf(held) == policy.HoldPDB })
		ds := s.records(held)
		if len(ds) != 1 || len(ds[0].PDBs) != 1 || ds[0].PDBs[0] != "default/kafka" || !strings.Contains(ds[0].Reason, "default/kafka") {
			t.Errorf("record %+v", ds)
		}
		time.Sleep(2 * time.Second)
		if !s.claim(held).DeletionTimestamp.IsZero() {
			t.Fatal("drained while the PDB allowed no disruption")
		}
		setAllowed(1)
		s.eventually("released when the PDB recovers", 20*time.Second, func() bool { return !s.claim(held).DeletionTimestamp.IsZero() })
	})

	t.Run("a gate gives way at deadline minus drain-lead", func(t *testing.T) {
		s.t = t
		setAllowed(0)
		// Deadline one hour and ten seconds away: drain-lead 1h leaves ten seconds.
		start := time.Now().Add(time.Hour + 10*time.Second)
		retire("i-0a1b2c3d4e5f60202", start)
		s.eventually("held by the PDB", 30*time.Second, func() bool { return holdOf(late) == policy.HoldPDB })
		s.eventually("drained at deadline minus drain-lead", 40*time.Second, func() bool { return !s.claim(late).DeletionTimestamp.IsZero() })
		if early := time.Until(start.Add(-time.Hour)); early > 2*time.Second {
			t.Errorf("drained %s before deadline minus drain-lead", early)
		}
	})

	t.Run("urgent kinds pass every gate", func(t *testing.T) {
		s.t = t
		s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0a1b2c3d4e5f60203", "instance-action": "terminate"})
		s.eventually("spot drained although the PDB is at zero", 30*time.Second, func() bool { return !s.claim(spotted).DeletionTimestamp.IsZero() })
	})

	t.Run("an alert holds a retirement until it resolves", func(t *testing.T) {
		s.t = t
		s.pool("zk", map[string]string{policy.AnnotationRespectPDB: "false", policy.AnnotationHoldWhileAlerts: `ZookeeperQuorumAtRisk{severity="critical"}`})
		claim := s.node("zk", "i-0a1b2c3d4e5f60204")
		firing := harness.PostedAlert{Labels: map[string]string{"alertname": "ZookeeperQuorumAtRisk", "severity": "critical"}, StartsAt: time.Now().Add(-time.Minute)}
		if err := am.Post(firing); err != nil {
			t.Fatal(err)
		}
		retire("i-0a1b2c3d4e5f60204", time.Now().Add(72*time.Hour))
		s.eventually("held by the alert", 30*time.Second, func() bool { return holdOf(claim) == policy.HoldAlerts })
		if ds := s.records(claim); !strings.Contains(ds[0].Reason, "ZookeeperQuorumAtRisk") {
			t.Errorf("reason %q", ds[0].Reason)
		}
		firing.EndsAt = time.Now().Add(-time.Second) // resolved
		if err := am.Post(firing); err != nil {
			t.Fatal(err)
		}
		// Re-decided within policy.GateRecheck (1 min), plus the gate's 15 s cache.
		s.eventually("released once the alert resolved", 100*time.Second, func() bool { return !s.claim(claim).DeletionTimestamp.IsZero() })
	})
}
