package watchdog

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// ConditionEmpty is the NodeClaim condition Karpenter v0.3x set on a node with no workload
// pods (ConditionTypeEmpty of its v1beta1 API; its LastTransitionTime is when the node became
// empty). The v0.37.0 bug left NodeClaims with Empty=True that were never removed.
//
// Karpenter's v1 API module (sigs.k8s.io/karpenter v1.15.0 here) declares no such constant:
// Karpenter v1 no longer writes Empty (it writes Consolidatable, which in a WhenEmpty pool
// does not mean empty). The condition is spelled out, and this detector finds NodeClaims only
// where a pre-v1 controller still writes Empty and the router reads the NodeClaims through
// the v1 API (during a v1 migration). A v1 equivalent would need the pods of each node,
// which the router does not watch.
const ConditionEmpty = "Empty"

// stuckEmpty returns the NodePools it checked (WhenEmpty, with a finite consolidateAfter,
// not static) and, per such pool, the NodeClaims whose Empty condition has been True for
// longer than consolidateAfter plus grace. NodeClaims already being deleted are on their
// way out and are not stuck.
func stuckEmpty(pools []karpv1.NodePool, claims []karpv1.NodeClaim, now time.Time, grace time.Duration) (checked []string, found []StuckEmpty) {
	after := map[string]time.Duration{}
	for _, p := range pools {
		d := p.Spec.Disruption
		if d.ConsolidationPolicy != karpv1.ConsolidationPolicyWhenEmpty || d.ConsolidateAfter.Duration == nil || p.Spec.Replicas != nil {
			continue // another policy, consolidateAfter: Never, or a static pool
		}
		after[p.Name] = *d.ConsolidateAfter.Duration
		checked = append(checked, p.Name)
	}
	slices.Sort(checked)
	byPool := map[string]*StuckEmpty{}
	for i := range claims {
		c := &claims[i]
		pool := c.Labels[karpv1.NodePoolLabelKey]
		ca, ok := after[pool]
		if !ok || !c.DeletionTimestamp.IsZero() {
			continue
		}
		cond := condition(c, ConditionEmpty)
		if cond == nil || cond.Status != metav1.ConditionTrue {
			continue
		}
		since := cond.LastTransitionTime.Time
		if !now.After(since.Add(ca + grace)) {
			continue
		}
		s := byPool[pool]
		if s == nil {
			s = &StuckEmpty{NodePool: pool, ConsolidateAfter: ca, Since: since}
			byPool[pool] = s
		}
		s.NodeClaims = append(s.NodeClaims, c.Name)
		if since.Before(s.Since) {
			s.Since = since
		}
	}
	for _, pool := range sortedKeys(byPool) {
		s := byPool[pool]
		slices.Sort(s.NodeClaims)
		found = append(found, *s)
	}
	return checked, found
}

// condition returns the NodeClaim's condition of type t, or nil.
func condition(c *karpv1.NodeClaim, t string) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == t {
			cond := metav1.Condition(c.Status.Conditions[i])
			return &cond
		}
	}
	return nil
}
