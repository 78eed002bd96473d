package doctor

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
)

// TestPools: doctor lists each NodePool whose annotations have a problem, one line each with
// every problem of the pool, and says so once when none has.
func TestPools(t *testing.T) {
	pool := func(name string, ann map[string]string) client.Object {
		return &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
	}
	tests := []struct {
		name  string
		pools []client.Object
		want  []Item // Status and Check; Detail holds a substring
	}{
		{"none annotated", []client.Object{pool("web", nil)}, []Item{{Status: OK, Check: CheckPoolAnnotations, Detail: "1 NodePool(s), none with a problem"}}},
		{"valid", []client.Object{pool("kafka", map[string]string{policy.AnnotationAction: "defer", policy.AnnotationMaxConcurrentDrains: "20%"})},
			[]Item{{Status: OK, Check: CheckPoolAnnotations}}},
		{"two problems in one pool, one good pool", []client.Object{
			pool("kafka", map[string]string{policy.AnnotationMaxConcurrentDrains: "12.5%", policy.AnnotationDrainLead: "876000h"}),
			pool("web", map[string]string{policy.AnnotationAction: "drain"})},
			[]Item{{Status: Warn, Check: CheckPoolAnnotations + ": kafka", Detail: "12.5%"}}},
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Doctor{kube: fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.pools...).Build()}
			var all, r Report
			d.pools(context.Background(), &all, false)
			for _, it := range all {
				if it.Check != CheckMode {
					r = append(r, it)
				}
			}
			if len(r) != len(tt.want) {
				t.Fatalf("report %+v, want %d item(s)", r, len(tt.want))
			}
			for i, w := range tt.want {
				if r[i].Status != w.Status || r[i].Check != w.Check || !strings.Contains(r[i].Detail, w.Detail) {
					t.Errorf("item %d: %+v, want %+v", i, r[i], w)
				}
			}
			if tt.name == "two problems in one pool, one good pool" && !strings.Contains(r[0].Detail, "876000h") {
				t.Errorf("not every problem of the pool: %q", r[0].Detail)
			}
		})
	}
}

// TestMode: doctor says which mode the router is in, and fails where a pool in shadow has
// nobody acting on its events (Karpenter's own handling off).
func TestMode(t *testing.T) {
	karpenterOn := Report{{Status: Fail, Check: CheckKarpenterRules}, {Status: Fail, Check: CheckKarpenterInstanceStatus}}
	karpenterOff := Report{{Status: OK, Check: CheckKarpenterRules}, {Status: OK, Check: CheckKarpenterInstanceStatus}}
	rulesOnly := Report{{Status: OK, Check: CheckKarpenterRules}, {Status: Fail, Check: CheckKarpenterInstanceStatus}}
	tests := []struct {
		name         string
		before       Report
		routerShadow bool
		inShadow     []string
		want         Status
		detail       string
	}{
		{"active, nothing in shadow", karpenterOff, false, nil, OK, "active"},
		{"--shadow beside Karpenter: the adoption", karpenterOn, true, nil, OK, "shadow (--shadow)"},
		{"--shadow with Karpenter's handling off: events lost", karpenterOff, true, nil, Fail, "lost"},
		{"--shadow with only Karpenter's rules gone", rulesOnly, true, nil, Fail, "lost"},
		{"a pool in shadow beside Karpenter", karpenterOn, false, []string{"kafka"}, OK, "kafka"},
		// After the takeover the router carries out Karpenter's behaviour for it (defect 14:
		// "their events are lost", and they were).
		{"a pool in shadow after the takeover", karpenterOff, false, []string{"kafka"}, OK, "Karpenter's behaviour carried out by the router"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mode(tt.before, tt.routerShadow, tt.inShadow, 3)
			if got.Status != tt.want || !strings.Contains(got.Detail, tt.detail) {
				t.Errorf("%+v, want %s with %q", got, tt.want, tt.detail)
			}
		})
	}
}

// TestTakeoverInShadow: in shadow the takeover is not due, and doctor passes it; a takeover
// begun under a router in shadow fails.
func TestTakeoverInShadow(t *testing.T) {
	on := Report{{Status: Fail, Check: CheckKarpenterRules}, {Status: Fail, Check: CheckKarpenterInstanceStatus}, {Status: OK, Check: CheckRouterInstanceStatus}}
	r := append(Report{}, on...)
	takeover(&r, true)
	if last := r[len(r)-1]; last.Check != CheckTakeover || last.Status != OK {
		t.Errorf("in shadow beside Karpenter: %+v", last)
	}
	r = append(Report{}, on...)
	takeover(&r, false)
	if last := r[len(r)-1]; last.Status != Warn || !strings.Contains(last.Detail, "in progress") {
		t.Errorf("active beside Karpenter's handling (runbook step 4b): %+v, want the takeover in progress", last)
	}
	r = Report{{Status: Fail, Check: CheckKarpenterRules}, {Status: OK, Check: CheckKarpenterInstanceStatus}, {Status: Fail, Check: CheckRouterInstanceStatus}}
	takeover(&r, false)
	if last := r[len(r)-1]; last.Status != Fail {
		t.Errorf("active, Karpenter's poller denied and the router's off: %+v, want lossy", last)
	}
	r = Report{{Status: OK, Check: CheckKarpenterRules}, {Status: Fail, Check: CheckKarpenterInstanceStatus}}
	takeover(&r, true)
	if last := r[len(r)-1]; last.Status != Fail {
		t.Errorf("a takeover begun in shadow: %+v", last)
	}
	// Issue 38 item 10: with failing credentials nothing of Karpenter's was checked; doctor
	// said [ok] for it.
	r = Report{{Status: Fail, Check: CheckCredentials}, {Status: Unknown, Check: CheckSkipped}}
	takeover(&r, true)
	if last := r[len(r)-1]; last.Status != Unknown {
		t.Errorf("in shadow with nothing of Karpenter's checked: %+v, want unknown", last)
	}
}

// TestShadowExpectsKarpenter (issue 38, item 9): in shadow, Karpenter's rules and its
// instance-status poller are what acts on the events, as the runbook says until step 4: doctor
// passes them (it failed them, said "delete those rules" and exited 1); either gone fails.
func TestShadowExpectsKarpenter(t *testing.T) {
	tests := []struct {
		name   string
		shadow bool
		rules  Status // as the check found Karpenter's rules: Fail when they still feed its queue
		want   Status
		detail string
	}{
		{"shadow, Karpenter's rules there", true, Fail, OK, "as it should be while the router is in shadow: rules feed Karpenter's queue: Karpenter-prod-ScheduledChangeRule"},
		{"shadow, Karpenter's rules gone", true, OK, Fail, "nobody acts"},
		// The takeover in progress (runbook step 4a): a warning, not a failure (doctor exited 1).
		{"active, Karpenter's rules there", false, Fail, Warn, "the takeover is in progress: rules still feed"},
		{"active, Karpenter's rules gone", false, OK, OK, "only the router"},
		{"shadow, rules not checked", true, Unknown, Unknown, "not checked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			detail := map[Status]string{Fail: rulesFeedKarpenter + "Karpenter-prod-ScheduledChangeRule", OK: "no rule feeds Karpenter's queue directly: only the router does", Unknown: "not checked"}[tt.rules]
			r := besideKarpenter(Report{{Status: tt.rules, Check: CheckKarpenterRules, Detail: detail}, {Status: OK, Check: CheckIntakeQueue}}, tt.shadow)
			if r[0].Status != tt.want || !strings.Contains(r[0].Detail, tt.detail) || r[1].Status != OK {
				t.Errorf("%+v, want %s with %q", r, tt.want, tt.detail)
			}
			// In shadow Karpenter acting is what should happen, not something behind anyone's back.
			if tt.shadow && strings.Contains(r[0].Detail, "behind the router's back") {
				t.Errorf("in shadow: %q", r[0].Detail)
			}
		})
	}
}
