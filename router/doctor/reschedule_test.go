package doctor

import (
	"context"
	"strings"
	"testing"

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
		{"allowed", func(*harness.EC2InstanceStatus) {}, OK, "may move scheduled events", "DryRunOperation"},
		{"denied", func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"ModifyInstanceEventStartTime": true} }, Fail, "denied", "UnauthorizedOperation"},
		{"stand-in that ignores DryRun", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "ignored DryRun", "InvalidInstanceID.NotFound"},
		{"EC2 fails", func(s *harness.EC2InstanceStatus) { s.Fail = 1 }, Unknown, "cannot tell", "InternalError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, client := harness.NewEC2InstanceStatus(t)
			tt.setup(srv)
			d := &Doctor{ec2: client}
			var r Report
			d.routerReschedule(context.Background(), &r)
			if len(r) != 1 || r[0].Check != CheckRouterReschedule || r[0].Status != tt.status || !strings.Contains(r[0].Detail, tt.detail) {
				t.Fatalf("report %+v, want one %s item mentioning %q", r, tt.status, tt.detail)
			}
			if tt.status != OK && !strings.Contains(r[0].Fix, "enable_reschedule") {
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
		r := New(nil, nil, client, nil, nil).Run(context.Background(), Config{Reschedule: on})
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
		{"allowed", func(*harness.EC2InstanceStatus) {}, OK, "may reboot", "DryRunOperation"},
		{"denied", func(s *harness.EC2InstanceStatus) { s.Denied = map[string]bool{"RebootInstances": true} }, Fail, "denied", "UnauthorizedOperation"},
		{"stand-in that ignores DryRun", func(s *harness.EC2InstanceStatus) { s.IgnoreDryRun = true }, OK, "ignored DryRun", "InvalidInstanceID.NotFound"},
		{"EC2 fails", func(s *harness.EC2InstanceStatus) { s.Fail = 1 }, Unknown, "cannot tell", "InternalError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, client := harness.NewEC2InstanceStatus(t)
			tt.setup(srv)
			var r Report
			(&Doctor{ec2: client}).routerReboot(context.Background(), &r)
			if len(r) != 1 || r[0].Check != CheckRouterReboot || r[0].Status != tt.status || !strings.Contains(r[0].Detail, tt.detail) {
				t.Fatalf("report %+v, want one %s item mentioning %q", r, tt.status, tt.detail)
			}
			if tt.status != OK && !strings.Contains(r[0].Fix, "enable_reboot_in_place") {
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
		New(nil, nil, client, nil, nil).Run(context.Background(), Config{RebootInPlace: on})
		if want := map[bool]int{false: 0, true: 1}[on]; len(srv.Reboots()) != want {
			t.Errorf("RebootInPlace %v: %d calls, want %d", on, len(srv.Reboots()), want)
		}
	}
}
