package signal

import (
	"fmt"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
)

// RecordEvent is the event a deferral record holds, bound to its NodeClaim's own instance: the
// one way the deferral controller (Pipeline.Redecide) and handback read a stored body. The body
// is a claim someone may have written, not an order: only the event's kind and times are taken
// from it; the instance is the NodeClaim's (its provider ID; the event's single instance only
// when the NodeClaim has none yet), and the body forwarded for it is built again for that
// instance (Canonical). It fails for a body that does not parse.
func RecordEvent(body []byte, nc *karpv1.NodeClaim) (event.Event, string, error) {
	ev, err := event.Parse(body)
	if err != nil {
		return event.Event{}, "", err
	}
	id := cluster.InstanceID(nc.Status.ProviderID)
	if id == "" && len(ev.Instances) == 1 {
		id = ev.Instances[0]
	}
	if id == "" {
		return event.Event{}, "", fmt.Errorf("nodeclaim %s has no instance to bind the record's event to", nc.Name)
	}
	ev.Instances = []string{id}
	return ev, id, nil
}

// Implausible says why an urgent event does not fit the NodeClaim it names ("" when it fits):
// a Spot interruption warning for a NodeClaim whose capacity type is not spot, a
// capacity-reservation interruption for one that is not reserved, a Capacity Block expiration
// for one that is not of a Capacity Block or ending later than the warning's lead. A NodeClaim
// without the label (launched before Karpenter set it) is taken at its word.
func Implausible(ev event.Event, nc *karpv1.NodeClaim) string {
	if nc == nil {
		return ""
	}
	ct := nc.Labels[karpv1.CapacityTypeLabelKey]
	if ev.Kind == event.KindCapacityBlockExpiration {
		return implausibleBlockExpiry(ev, ct, nc.Labels[awsv1.LabelCapacityReservationType])
	}
	switch {
	case ct == "":
	case ev.Kind == event.KindSpotInterruption && ct != karpv1.CapacityTypeSpot:
		return fmt.Sprintf("a Spot interruption warning for a %s node", ct)
	case ev.Kind == event.KindCapacityReservation && ct != karpv1.CapacityTypeReserved:
		return fmt.Sprintf("a capacity-reservation interruption for a %s node", ct)
	}
	return ""
}

// capacityBlockSlack is how much later than the warning's documented lead a Capacity Block's
// end may be and still be believed: EventBridge's time is when EC2 emitted the warning, and
// the block ends CapacityBlockWarning after it.
const capacityBlockSlack = 10 * time.Minute

// implausibleBlockExpiry says why a Capacity Block Expiration Warning does not fit a NodeClaim
// of the reservation it names: a node that is not of a Capacity Block (Karpenter's
// capacity-reservation-type label, where it sets one, and its capacity type), or an end further
// than the warning's lead (EC2 warns 40 minutes before a block ends): a forged warning for an
// ordinary reservation, or one ending a month away, would drain every node of the reservation
// at once, past pacing.
func implausibleBlockExpiry(ev event.Event, capacityType, reservationType string) string {
	switch {
	case reservationType != "" && reservationType != string(awsv1.CapacityReservationTypeCapacityBlock):
		return fmt.Sprintf("a Capacity Block expiration for a node of a %s capacity reservation", reservationType)
	case capacityType != "" && capacityType != karpv1.CapacityTypeReserved:
		return fmt.Sprintf("a Capacity Block expiration for a %s node", capacityType)
	case !ev.Deadline.IsZero() && ev.Deadline.Sub(ev.Time) > event.CapacityBlockWarning-event.CapacityBlockTerminationLead+capacityBlockSlack:
		return fmt.Sprintf("a Capacity Block expiration whose block ends at %s, %s after the warning (EC2 warns %s before the end)",
			ev.Deadline.Add(event.CapacityBlockTerminationLead).UTC().Format(time.RFC3339), ev.Deadline.Add(event.CapacityBlockTerminationLead).Sub(ev.Time).Round(time.Minute), event.CapacityBlockWarning)
	}
	return ""
}

// Forwarded reports whether a drain of ev goes to Karpenter's queue in forward mode, for
// Karpenter v (zero: unknown, taken as the newest): only what Karpenter's interruption
// controller acts on (Spot and capacity-reservation interruptions, AWS Health scheduled
// changes, state changes), that v has a parser for, and that the router found plausible. An
// implausible event is not passed on: Karpenter would act on it at once (and mark a Spot
// offering unavailable) on the strength of a claim the router did not trust.
func Forwarded(ev event.Event, v KarpenterVersion) bool {
	if ev.Implausible != "" {
		return false
	}
	acted := ev.Source == "aws.ec2" && (ev.Kind == event.KindSpotInterruption || ev.Kind == event.KindCapacityReservation || ev.Kind == event.KindStateChange) ||
		ev.Source == "aws.health" && ev.Kind == event.KindScheduledChange
	return acted && v.Parses(ev)
}
