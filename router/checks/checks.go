// Package checks runs the pre-signal checks: before the router tells Karpenter to drain a
// node, it checks that the node Karpenter launches in its place will be sound. Each check
// answers with a policy.Check; a check that cannot get an answer says so (fail-safe).
package checks

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/smithy-go"
	"k8s.io/component-base/featuregate"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
)

// Check names, as they appear in decisions and metrics.
const (
	NameAMI                 = "ami"
	NameCapacityReservation = "capacity-reservation"
)

// ReservedCapacity is Karpenter's feature gate for capacity reservations. With it off the
// router neither calls the reservation API nor lets reservation data touch a decision:
// Karpenter's replacement loop came from reservation logic gated only at its entry.
const ReservedCapacity featuregate.Feature = "ReservedCapacity"

// NewFeatureGates returns the router's feature gates with Karpenter's defaults
// (ReservedCapacity on, as in current Karpenter); set them with Set("ReservedCapacity=false").
func NewFeatureGates() featuregate.MutableFeatureGate {
	g := featuregate.NewFeatureGate()
	// Add only fails on a conflicting re-registration, which cannot happen on a new gate.
	_ = g.Add(map[featuregate.Feature]featuregate.FeatureSpec{
		ReservedCapacity: {Default: true, PreRelease: featuregate.Beta},
	})
	return g
}

// Checker runs every enabled check for a target.
type Checker struct {
	ami          *AMI
	reservations *Reservations // nil when the ReservedCapacity gate is off
}

// NewChecker returns a Checker; reservations is ignored unless the gate is on.
func NewChecker(ami *AMI, reservations *Reservations, gates featuregate.FeatureGate) *Checker {
	c := &Checker{ami: ami}
	if gates.Enabled(ReservedCapacity) {
		c.reservations = reservations
	}
	return c
}

// Run returns the outcome of each check that applies to the resolved instance.
func (c *Checker) Run(ctx context.Context, res cluster.Resolved) []policy.Check {
	var out []policy.Check
	if c.ami != nil {
		out = append(out, c.ami.Check(ctx, res))
	}
	if c.reservations != nil {
		if chk, ok := c.reservations.Check(ctx, res); ok {
			out = append(out, chk)
		}
	}
	return out
}

// InvalidateImage drops what is known of an image, so the next check asks EC2 again
// (an EC2 AMI State Change event arrived for it).
func (c *Checker) InvalidateImage(id string) {
	if c.ami != nil {
		c.ami.Invalidate(id)
	}
}

// errNotFound marks an EC2 answer that the thing asked for does not exist: a real answer,
// unlike throttling or an outage.
var errNotFound = errors.New("not found")

// classify sorts EC2 errors, in one place: "not found" codes are answers; everything else
// (throttling past the SDK's retries, outages, access denied) leaves the check unavailable.
func classify(err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "InvalidAMIID.Malformed",
			"InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed":
			return fmt.Errorf("%w: %s", errNotFound, ae.ErrorMessage())
		}
	}
	return err
}

func unavailable(name string, err error) policy.Check {
	return policy.Check{Name: name, Unavailable: true, Reason: fmt.Sprintf("check unavailable: %v", err)}
}
