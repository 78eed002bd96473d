package signal

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// TestImplausible: an urgent event is trusted only where it fits the NodeClaim it names. A
// Capacity Block expiration (issue 38, 2) is trusted only for a NodeClaim of a Capacity Block
// (karpenter.k8s.aws/capacity-reservation-type=capacity-block) and for an end within the
// warning's documented lead; a forged one for an ordinary reservation, or naming an end a
// month away, drained every node of the reservation at once, past pacing.
func TestImplausible(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	claim := func(labels map[string]string) *karpv1.NodeClaim {
		return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: labels}}
	}
	block := func(end time.Time) event.Event {
		ev := event.Event{Kind: event.KindCapacityBlockExpiration, Source: "aws.ec2", Time: at, Reservation: "cr-0123456789abcdef0"}
		ev.Deadline = at.Add(event.CapacityBlockWarning - event.CapacityBlockTerminationLead)
		if !end.IsZero() {
			ev.Deadline = end.Add(-event.CapacityBlockTerminationLead)
		}
		return ev
	}
	reserved := map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeReserved}
	withType := func(typ string) map[string]string {
		return map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeReserved, awsv1.LabelCapacityReservationType: typ}
	}
	for _, tc := range []struct {
		name   string
		ev     event.Event
		labels map[string]string
		want   bool // implausible
	}{
		{"Spot warning, spot node", event.Event{Kind: event.KindSpotInterruption}, map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeSpot}, false},
		{"Spot warning, on-demand node", event.Event{Kind: event.KindSpotInterruption}, map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeOnDemand}, true},
		{"Spot warning, no capacity type: taken at its word", event.Event{Kind: event.KindSpotInterruption}, nil, false},
		{"reservation interruption, reserved node", event.Event{Kind: event.KindCapacityReservation}, reserved, false},
		{"reservation interruption, spot node", event.Event{Kind: event.KindCapacityReservation}, map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeSpot}, true},
		{"Capacity Block expiry, a block's node, its end in 40 min", block(at.Add(40 * time.Minute)), withType(string(awsv1.CapacityReservationTypeCapacityBlock)), false},
		{"Capacity Block expiry, no end-date", block(time.Time{}), withType(string(awsv1.CapacityReservationTypeCapacityBlock)), false},
		{"Capacity Block expiry, an ordinary reservation's node", block(at.Add(40 * time.Minute)), withType(string(awsv1.CapacityReservationTypeDefault)), true},
		{"Capacity Block expiry, an on-demand node", block(at.Add(40 * time.Minute)), map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeOnDemand}, true},
		{"Capacity Block expiry, an end a month away", block(at.Add(30 * 24 * time.Hour)), withType(string(awsv1.CapacityReservationTypeCapacityBlock)), true},
		{"Capacity Block expiry, an end already past", block(at.Add(-time.Hour)), withType(string(awsv1.CapacityReservationTypeCapacityBlock)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Implausible(tc.ev, claim(tc.labels))
			if (got != "") != tc.want {
				t.Errorf("Implausible = %q, want implausible: %t", got, tc.want)
			}
		})
	}
}
