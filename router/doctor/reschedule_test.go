package doctor

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"

	"github.com/health-router/health-router/test/harness"
)

// TestRouterReschedule: the DryRun check of ec2:ModifyInstanceEventStartTime, against the EC2
// stand-in speaking EC2's wire protocol through the real SDK client. Whatever the answer,
// nothing is moved: the call names no real instance or event.
func TestRouterReschedule(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(*harness.EC2InstanceStatus)
		status Status
		detail string // a substring of the item's detail
		answer string // the error code the stand-in answered
	}{
		// On a placeholder instance (no cluster connection): an allowance means the grant is
		// not scoped to this cluster's instances; a denial cannot tell a missing grant from a
		// scoped one.
		{"allowed, unscoped", func(*harness.EC2InstanceStatus) {}, Warn, "not scoped", "DryRunOperation"},
		{"denied", func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"ModifyInstanceEventStartTime": true} }, Unknown, "denied on a placeholder", "UnauthorizedOperation"},
		{"scoped", func(s *harness.EC2InstanceStatus) { s.Scope = map[string]bool{} }, Unknown, "denied on a placeholder", "UnauthorizedOperation"},
		{"stand-in that ignores DryRun", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "ignored DryRun", "InvalidInstanceID.NotFound"},
		{"EC2 fails", func(s *harness.EC2InstanceStatus) { s.Fail = 1 }, Unknown, "cannot tell", "InternalError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, client := harness.NewEC2InstanceStatus(t)
			tt.setup(srv)
			d := &Doctor{ec2: client}
			var r Report
			d.routerReschedule(context.Background(), &r, scopeSample{})
			if len(r) != 1 || r[0].Check != CheckRouterReschedule || r[0].Status != tt.status || !strings.Contains(r[0].Detail, tt.detail) {
				t.Fatalf("report %+v, want one %s item mentioning %q", r, tt.status, tt.detail)
			}
			if (tt.status == Fail || tt.status == Unknown) && !strings.Contains(r[0].Fix, "enable_reschedule") {
				t.Errorf("fix %q: want the Terraform variable named", r[0].Fix)
			}
			moves := srv.Moves()
			if len(moves) != 1 || !moves[0].DryRun || moves[0].Error != tt.answer || moves[0].InstanceID != placeholderInstance || moves[0].EventID != placeholderEvent {
				t.Errorf("EC2 was asked %+v, want one DryRun call for the placeholders answered %s", moves, tt.answer)
			}
		})
	}
}

// TestRunReschedule: Run makes the check only when reschedule is in use (--reschedule).
// Nothing else is configured, so no other check calls AWS or the cluster.
func TestRunReschedule(t *testing.T) {
	for _, on := range []bool{false, true} {
		srv, client := harness.NewEC2InstanceStatus(t)
		r := New(nil, nil, client, nil, nil, nil).Run(context.Background(), Config{Reschedule: on})
		n := 0
		for _, i := range r {
			if i.Check == CheckRouterReschedule {
				n++
			}
		}
		if want := map[bool]int{false: 0, true: 1}[on]; n != want || len(srv.Moves()) != want {
			t.Errorf("Reschedule %v: %d items, %d calls, want %d", on, n, len(srv.Moves()), want)
		}
	}
}

// TestRouterReboot: the DryRun check of ec2:RebootInstances (--reboot-in-place), against the
// EC2 stand-in through the real SDK client; nothing is rebooted.
func TestRouterReboot(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(*harness.EC2InstanceStatus)
		status Status
		detail string
		answer string
	}{
		{"allowed, unscoped", func(*harness.EC2InstanceStatus) {}, Warn, "not scoped", "DryRunOperation"},
		{"denied", func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"RebootInstances": true} }, Unknown, "denied on a placeholder", "UnauthorizedOperation"},
		{"scoped", func(s *harness.EC2InstanceStatus) { s.Scope = map[string]bool{} }, Unknown, "denied on a placeholder", "UnauthorizedOperation"},
		{"stand-in that ignores DryRun", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "ignored DryRun", "InvalidInstanceID.NotFound"},
		{"EC2 fails", func(s *harness.EC2InstanceStatus) { s.Fail = 1 }, Unknown, "cannot tell", "InternalError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, client := harness.NewEC2InstanceStatus(t)
			tt.setup(srv)
			var r Report
			(&Doctor{ec2: client}).routerReboot(context.Background(), &r, scopeSample{})
			if len(r) != 1 || r[0].Check != CheckRouterReboot || r[0].Status != tt.status || !strings.Contains(r[0].Detail, tt.detail) {
				t.Fatalf("report %+v, want one %s item mentioning %q", r, tt.status, tt.detail)
			}
			if (tt.status == Fail || tt.status == Unknown) && !strings.Contains(r[0].Fix, "enable_reboot_in_place") {
				t.Errorf("fix %q: want the Terraform variable named", r[0].Fix)
			}
			rb := srv.Reboots()
			if len(rb) != 1 || !rb[0].DryRun || rb[0].Error != tt.answer || len(rb[0].InstanceIDs) != 1 || rb[0].InstanceIDs[0] != placeholderInstance {
				t.Errorf("EC2 was asked %+v, want one DryRun reboot of the placeholder answered %s", rb, tt.answer)
			}
		})
	}
	for _, on := range []bool{false, true} {
		srv, client := harness.NewEC2InstanceStatus(t)
		New(nil, nil, client, nil, nil, nil).Run(context.Background(), Config{RebootInPlace: on})
		if want := map[bool]int{false: 0, true: 1}[on]; len(srv.Reboots()) != want {
			t.Errorf("RebootInPlace %v: %d calls, want %d", on, len(srv.Reboots()), want)
		}
	}
}

// TestScopeProof: with a cluster connection and an endpoint that honours DryRun, doctor proves
// the scope of both EC2 writes on real instances: allowed on a NodeClaim's instance, refused on
// a Node's outside Karpenter (a managed node group's). An endpoint that ignores DryRun is never
// sent a real instance: it would reboot it.
func TestScopeProof(t *testing.T) {
	const tagged, untagged = "i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2"
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube := func() client.Client {
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kafka-a"}, Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + tagged}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kafka-node", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + tagged}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ng-node"}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + untagged}},
		).Build()
	}
	tests := []struct {
		name        string
		setup       func(*harness.EC2InstanceStatus)
		grant       Status // the write's own item
		scope       Status // its scope item ("" when none)
		realAsked   bool
		scopeDetail string
	}{
		{"scoped as the Terraform module scopes it", func(s *harness.EC2InstanceStatus) { s.Scope = map[string]bool{tagged: true} }, OK, OK, true, "refused on " + untagged},
		{"granted on every instance", func(*harness.EC2InstanceStatus) {}, OK, Warn, true, "allowed on " + untagged},
		{"not granted", func(s *harness.EC2InstanceStatus) {
			s.Denied = map[string]bool{"RebootInstances": true, "ModifyInstanceEventStartTime": true}
		}, Fail, OK, true, "refused on"},
		{"a stand-in that ignores DryRun", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, ec2Client := harness.NewEC2InstanceStatus(t)
			srv.Add(tagged, &harness.Instance{})
			srv.Add(untagged, &harness.Instance{})
			tt.setup(srv)
			r := New(nil, nil, ec2Client, nil, nil, kube()).Run(context.Background(), Config{RebootInPlace: true, Reschedule: true, Gates: checks.NewFeatureGates()})
			for _, check := range []string{CheckRouterReboot, CheckRouterReschedule} {
				var own, scope *Item
				for i := range r {
					switch r[i].Check {
					case check:
						own = &r[i]
					case check + " scope":
						scope = &r[i]
					}
				}
				if own == nil || own.Status != tt.grant {
					t.Errorf("%s: %+v, want %s", check, own, tt.grant)
				}
				switch {
				case tt.scope == "" && scope != nil:
					t.Errorf("%s: a scope item %+v from an endpoint that ignores DryRun", check, scope)
				case tt.scope != "" && (scope == nil || scope.Status != tt.scope || !strings.Contains(scope.Detail, tt.scopeDetail)):
					t.Errorf("%s scope: %+v, want %s mentioning %q", check, scope, tt.scope, tt.scopeDetail)
				}
			}
			for _, rb := range srv.Reboots() {
				real := slices.Contains(rb.InstanceIDs, tagged) || slices.Contains(rb.InstanceIDs, untagged)
				if real && (!tt.realAsked || !rb.DryRun) {
					t.Errorf("RebootInstances %+v: a real instance named where it must not be", rb)
				}
			}
			for _, rb := range srv.Reboots() {
				if rb.Error == "" {
					t.Errorf("an instance was rebooted: %+v", rb)
				}
			}
		})
	}
}

// TestRouterMigration: the DryRun check of ec2:DescribeInstances (--reboot-in-place: a
// system-reboot run reads the instance's reboot migration), against the EC2 stand-in through
// the real SDK client.
func TestRouterMigration(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(*harness.EC2InstanceStatus)
		status Status
		detail string
	}{
		{"allowed", func(*harness.EC2InstanceStatus) {}, OK, "reboots an instance whose migration is on itself"},
		{"denied", func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"DescribeInstances": true} }, Warn, "takes reboot migration as off"},
		{"stand-in that ignores DryRun: it lists", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "reboots an instance"},
		{"EC2 fails", func(s *harness.EC2InstanceStatus) { s.Fail = 1 }, Unknown, "cannot tell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, client := harness.NewEC2InstanceStatus(t)
			tt.setup(srv)
			var r Report
			(&Doctor{ec2: client}).routerMigration(context.Background(), &r)
			if len(r) != 1 || r[0].Check != CheckRouterMigration || r[0].Status != tt.status || !strings.Contains(r[0].Detail, tt.detail) {
				t.Fatalf("report %+v, want one %s item mentioning %q", r, tt.status, tt.detail)
			}
			if tt.status != OK && !strings.Contains(r[0].Fix, "RebootMigration") {
				t.Errorf("fix %q: want the Terraform statement named", r[0].Fix)
			}
		})
	}
	for _, on := range []bool{false, true} {
		_, client := harness.NewEC2InstanceStatus(t)
		r := New(nil, nil, client, nil, nil, nil).Run(context.Background(), Config{RebootInPlace: on})
		found := slices.ContainsFunc(r, func(i Item) bool { return i.Check == CheckRouterMigration })
		if found != on {
			t.Errorf("RebootInPlace %v: the migration check made %v", on, found)
		}
	}
}
