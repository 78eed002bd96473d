package integration

import (
	"fmt"
	"testing"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// blockNode is a reserved node of a Capacity Block: its NodeClaim carries the reservation.
func (s *stage) blockNode(pool, id, reservation string) string {
	s.t.Helper()
	name := s.nodeOf(pool, id, karpv1.CapacityTypeReserved)
	nc := s.claim(name)
	nc.Labels[awsv1.LabelCapacityReservationID] = reservation
	if err := s.kube.Update(s.ctx, nc); err != nil {
		s.t.Fatal(err)
	}
	return name
}

// TestCapacityBlockExpiration (issue 27, 5): Capacity Block Expiration Warning names a
// reservation; the router finds the NodeClaims that carry it and decides each per pool as
// capacity-block-expiration: drained at once by default (the NodeClaim deleted: Karpenter has
// no parser for the event, so nothing goes to its queue), kept until deadline minus drain-lead
// where the pool's action for it is defer; a node of another reservation is untouched.
func TestCapacityBlockExpiration(t *testing.T) {
	s := newStage(t)
	s.pool("train", nil)
	s.pool("checkpoint", map[string]string{"healthrouter.io/action.capacity-block-expiration": "defer", "healthrouter.io/drain-lead": "5m"})
	const block = "cr-0a1b2c3d4e5f62751"
	train := s.blockNode("train", "i-0a1b2c3d4e5f62751", block)
	kept := s.blockNode("checkpoint", "i-0a1b2c3d4e5f62752", block)
	other := s.blockNode("train", "i-0a1b2c3d4e5f62753", "cr-0a1b2c3d4e5f62759")
	s.router(signal.ModeForward)

	now := time.Now().UTC().Truncate(time.Second)
	end := now.Add(40 * time.Minute)
	// Through EventBridge, under the detail-type EC2 sends (no "EC2 " prefix) and the module's
	// rule matches.
	s.put("aws.ec2", "Capacity Block Expiration Warning", map[string]string{"capacity-reservation-id": block, "end-date": end.Format(time.RFC3339)},
		fmt.Sprintf("arn:aws:ec2:%s:123456789012:capacity-reservation/%s", harness.Region, block))

	s.eventually("the block's node in the default pool deleting", 30*time.Second, func() bool { return !s.claim(train).DeletionTimestamp.IsZero() })
	s.eventually("the checkpoint pool's node deferred", 30*time.Second, func() bool { return len(s.records(kept)) == 1 })
	d := s.records(kept)[0]
	// Deadline: the first terminations, end - 30 min; minus the pool's drain-lead of 5 min.
	if want := end.Add(-35 * time.Minute); d.State != record.StateDeferred || !d.Until.Equal(want) || d.Kind != "capacity-block-expiration" {
		t.Errorf("record %+v, want deferred until %s", d, want)
	}
	if !s.claim(kept).DeletionTimestamp.IsZero() {
		t.Error("the deferred node was drained")
	}
	if !s.claim(other).DeletionTimestamp.IsZero() || len(s.records(other)) != 0 {
		t.Error("a node of another reservation was acted on")
	}
	if msgs := s.drain(s.karpURL); len(msgs) != 0 {
		t.Errorf("forwarded %d messages to Karpenter, which has no parser for the event", len(msgs))
	}
	if dl := s.drain(s.dlqURL); len(dl) != 0 {
		t.Errorf("dead-lettered: %v", dl[0].MessageAttributes)
	}
}
