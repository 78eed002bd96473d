package integration

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// TestReservationInterruptionToOldKarpenter (issue 27, 2): Karpenter before v1.10 has no parser
// for a capacity-reservation interruption and deletes the forward as a no-op; the router told
// --karpenter-version v1.9.3 deletes the NodeClaim at once and forwards nothing. On 56e5326 it
// forwarded the warning and deleted the NodeClaim only when the 20 s confirm-or-fallback ran
// out: 20 s of a two-minute notice.
func TestReservationInterruptionToOldKarpenter(t *testing.T) {
	s := newStage(t)
	s.pool("gpu", nil)
	name := s.nodeOf("gpu", "i-0a1b2c3d4e5f62701", karpv1.CapacityTypeReserved)
	s.router(signal.ModeForward, func(o *options.Run) { o.KarpenterVersion = signal.KarpenterVersion{Major: 1, Minor: 9, Patch: 3} })
	start := s.put("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning",
		map[string]any{"instance-id": "i-0a1b2c3d4e5f62701", "instance-action": "terminate"},
		"arn:aws:ec2:"+harness.Region+":123456789012:instance/i-0a1b2c3d4e5f62701")
	// Well inside the 20 s confirmation bound: only a deletion at once meets it.
	s.eventually("the NodeClaim deleting", 8*time.Second, func() bool { return !s.claim(name).DeletionTimestamp.IsZero() })
	t.Logf("NodeClaim deleting %s after the event", time.Since(start).Round(100*time.Millisecond))
	if msgs := s.drain(s.karpURL); len(msgs) != 0 {
		t.Errorf("forwarded %d messages to a Karpenter with no parser for them: %s", len(msgs), aws.ToString(msgs[0].Body))
	}
}
