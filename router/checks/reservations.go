package checks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
)

// reservationTTL is how long a reservation's state and free count are trusted. The free
// count moves as instances launch and stop, so it is kept short; a burst of events for the
// nodes of one reservation still costs a single call.
const reservationTTL = 30 * time.Second

// reservationsAPI is the part of EC2 the capacity-reservation check uses.
type reservationsAPI interface {
	DescribeCapacityReservations(context.Context, *ec2.DescribeCapacityReservationsInput, ...func(*ec2.Options)) (*ec2.DescribeCapacityReservationsOutput, error)
}

// Reservations checks that the capacity reservation a node sits in can take its replacement.
type Reservations struct {
	api      reservationsAPI
	known    *cache.Expiring // reservation ID -> reservation (nil when EC2 does not know it)
	failures *cache.Expiring // reservation ID -> the error describing it (see unavailableTTL)
	group    singleflight.Group
}

// NewReservations returns a capacity-reservation check over api, caching with clk.
func NewReservations(api reservationsAPI, clk clock.Clock) *Reservations {
	return &Reservations{api: api, known: cache.NewExpiringWithClock(clk), failures: cache.NewExpiringWithClock(clk)}
}

type reservation struct {
	state     string
	available int32
	total     int32
}

// Check reports on the node's reservation; ok is false when the node is not in one.
func (r *Reservations) Check(ctx context.Context, res cluster.Resolved) (policy.Check, bool) {
	labels := nodeLabels(res)
	id := labels[awsv1.LabelCapacityReservationID]
	if labels[karpv1.CapacityTypeLabelKey] != karpv1.CapacityTypeReserved || id == "" {
		return policy.Check{}, false
	}
	evidence := map[string]string{"reservation": id}
	rv, err := r.get(ctx, id)
	if err != nil {
		c := unavailable(NameCapacityReservation, err)
		c.Evidence = evidence
		return c, true
	}
	if rv == nil {
		evidence["state"] = "missing"
		return policy.Check{Name: NameCapacityReservation, Reason: fmt.Sprintf("capacity reservation %s does not exist", id), Evidence: evidence}, true
	}
	evidence["state"] = rv.state
	evidence["available"] = strconv.Itoa(int(rv.available))
	evidence["total"] = strconv.Itoa(int(rv.total))
	switch {
	case rv.state != string(ec2types.CapacityReservationStateActive):
		return policy.Check{Name: NameCapacityReservation, Reason: fmt.Sprintf("capacity reservation %s is %s, not active", id, rv.state), Evidence: evidence}, true
	case rv.available < 1:
		return policy.Check{Name: NameCapacityReservation, Reason: fmt.Sprintf("capacity reservation %s has no room for the replacement (0 of %d available)", id, rv.total), Evidence: evidence}, true
	}
	return policy.Check{Name: NameCapacityReservation, Passed: true, Reason: fmt.Sprintf("capacity reservation %s is active with %d of %d available", id, rv.available, rv.total), Evidence: evidence}, true
}

func (r *Reservations) get(ctx context.Context, id string) (*reservation, error) {
	if v, ok := r.known.Get(id); ok {
		return v.(*reservation), nil
	}
	if err, ok := r.failures.Get(id); ok {
		return nil, err.(error)
	}
	v, err, _ := r.group.Do(id, func() (any, error) {
		if v, ok := r.known.Get(id); ok {
			return v, nil // answered by a call that ended after this caller's lookup
		}
		out, err := r.api.DescribeCapacityReservations(ctx, &ec2.DescribeCapacityReservationsInput{CapacityReservationIds: []string{id}})
		if err != nil {
			if err := classify(err); errors.Is(err, errNotFound) {
				r.known.Set(id, (*reservation)(nil), reservationTTL)
				return (*reservation)(nil), nil
			}
			err = fmt.Errorf("describing capacity reservation %s: %w", id, err)
			r.failures.Set(id, err, unavailableTTL)
			return nil, err
		}
		var rv *reservation
		for _, c := range out.CapacityReservations {
			if aws.ToString(c.CapacityReservationId) == id {
				rv = &reservation{state: string(c.State), available: aws.ToInt32(c.AvailableInstanceCount), total: aws.ToInt32(c.TotalInstanceCount)}
			}
		}
		r.known.Set(id, rv, reservationTTL)
		return rv, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*reservation), nil
}
