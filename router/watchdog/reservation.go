package watchdog

import (
	"slices"
	"time"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// maxDeletions bounds the memory of observed replacements. It is far above any real rate (a
// loop replaces a node every few minutes); past it, the oldest observations are dropped.
const maxDeletions = 10000

// deletion is a reserved NodeClaim seen being deleted while Drifted.
type deletion struct {
	pool string
	at   time.Time
}

// deletions remembers replacements after their NodeClaims are gone, keyed by UID so that a
// NodeClaim seen at several scans counts once. It holds the deletions of the window and
// the NodeClaims still terminating: bounded by the cluster's size and the replacement rate,
// and by maxDeletions.
type deletions struct {
	byUID map[types.UID]deletion
}

func newDeletions() *deletions { return &deletions{byUID: map[types.UID]deletion{}} }

// record remembers a deletion the first time it is seen.
func (d *deletions) record(uid types.UID, pool string, at time.Time) {
	if _, ok := d.byUID[uid]; ok {
		return
	}
	if len(d.byUID) >= maxDeletions {
		oldest := uid
		for u, del := range d.byUID {
			if oldest == uid || del.at.Before(d.byUID[oldest].at) {
				oldest = u
			}
		}
		delete(d.byUID, oldest)
	}
	d.byUID[uid] = deletion{pool: pool, at: at}
}

// forget drops the deletions before t whose NodeClaims are gone. One still terminating is
// kept, so that it is not recorded again (and counted again) at the next scan.
func (d *deletions) forget(t time.Time, present map[types.UID]bool) {
	for u, del := range d.byUID {
		if del.at.Before(t) && !present[u] {
			delete(d.byUID, u)
		}
	}
}

func (d *deletions) clear() { d.byUID = map[types.UID]deletion{} }

// counts returns the number of deletions at or after t, per NodePool.
func (d *deletions) counts(t time.Time) map[string]int {
	c := map[string]int{}
	for _, del := range d.byUID {
		if !del.at.Before(t) {
			c[del.pool]++
		}
	}
	return c
}

// reservationDrift records the reserved NodeClaims being deleted while Drifted, counts them
// per NodePool over the window, sets the gauge, and returns the pools at the threshold.
// With the ReservedCapacity gate on it reports nothing: Karpenter's loop needs the gate off.
//
// Karpenter deletes a drifted NodeClaim and its finalizer holds it through the node's
// drain and the instance's termination, minutes at least, so a scan every minute sees
// nearly every replacement. A NodeClaim deleted and gone between two scans (its finalizer
// removed within the interval) is missed, and the count is then a lower bound. A restarted
// or newly elected router starts from what is still terminating.
func (w *Watchdog) reservationDrift(pools []karpv1.NodePool, claims []karpv1.NodeClaim, now time.Time) []ReservationDrift {
	if w.reservedCapacity {
		w.deletions.clear()
		w.driftGauge.set(nil, nil)
		return nil
	}
	present := map[types.UID]bool{}
	for i := range claims {
		c := &claims[i]
		present[c.UID] = true
		pool := c.Labels[karpv1.NodePoolLabelKey]
		if pool == "" || c.DeletionTimestamp.IsZero() || !reserved(c) {
			continue
		}
		if cond := condition(c, karpv1.ConditionTypeDrifted); cond == nil || cond.Status != metav1.ConditionTrue {
			continue
		}
		// The deletion time is the API server's; a clock behind it must not count a deletion
		// as in the future, where it would never leave the window.
		at := c.DeletionTimestamp.Time
		if at.After(now) {
			at = now
		}
		w.deletions.record(c.UID, pool, at)
	}
	start := now.Add(-w.opts.DriftWindow)
	w.deletions.forget(start, present)
	counts := w.deletions.counts(start)
	checked := make([]string, 0, len(pools)+len(counts))
	for _, p := range pools {
		checked = append(checked, p.Name)
	}
	for pool := range counts {
		checked = append(checked, pool) // the NodePool itself may be gone
	}
	slices.Sort(checked)
	checked = slices.Compact(checked)
	w.driftGauge.set(checked, func(pool string) float64 { return float64(counts[pool]) })
	var found []ReservationDrift
	for _, pool := range sortedKeys(counts) {
		if counts[pool] >= w.opts.DriftThreshold {
			found = append(found, ReservationDrift{NodePool: pool, Replacements: counts[pool], Window: w.opts.DriftWindow})
		}
	}
	return found
}

// reserved reports whether a NodeClaim was launched into a capacity reservation.
func reserved(c *karpv1.NodeClaim) bool {
	return c.Labels[karpv1.CapacityTypeLabelKey] == karpv1.CapacityTypeReserved || c.Labels[awsv1.LabelCapacityReservationID] != ""
}
