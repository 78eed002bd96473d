package watchdog

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/record"
)

// ConditionEmpty is the NodeClaim condition Karpenter v0.3x set on a node with no workload
// pods (ConditionTypeEmpty of its v1beta1 API; its LastTransitionTime is when the node became
// empty). The v0.37.0 bug left NodeClaims with Empty=True that were never removed.
//
// Karpenter's v1 API module (sigs.k8s.io/karpenter v1.15.0 here) declares no such constant:
// Karpenter v1 no longer writes Empty (it writes Consolidatable, which in a WhenEmpty pool
// does not mean empty). The condition is spelled out, and this detector finds NodeClaims only
// where a pre-v1 controller still writes Empty and the router reads the NodeClaims through
// the v1 API (during a v1 migration). The v1 equivalent reads the pods of each node
// (stuckEmptyPods, below), when the router caches Pods.
const ConditionEmpty = "Empty"

// stuckEmpty returns the NodePools it checked (WhenEmpty, with a finite consolidateAfter,
// not static) and, per such pool, the NodeClaims whose Empty condition has been True for
// longer than consolidateAfter plus grace. NodeClaims already being deleted are on their
// way out and are not stuck.
func stuckEmpty(pools []karpv1.NodePool, claims []karpv1.NodeClaim, kept map[string]bool, now time.Time, grace time.Duration) (checked []string, found []StuckEmpty) {
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
		if !ok || !c.DeletionTimestamp.IsZero() || kept[c.Name] {
			continue // on its way out, or emptied on purpose by a reboot in place: not stuck
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
// keptThroughReboot returns the NodeClaims the router keeps through a reboot in place now
// (their HealthRecord holds a run in progress): emptied on purpose, not stuck. A list that
// fails is none.
func keptThroughReboot(ctx context.Context, r client.Reader) map[string]bool {
	var hrs record.HealthRecordList
	if err := r.List(ctx, &hrs); err != nil {
		return nil
	}
	kept := map[string]bool{}
	for _, hr := range hrs.Items {
		if _, running := hr.Status.Memory.RunInProgress(); running {
			kept[hr.Name] = true
		}
	}
	return kept
}

func condition(c *karpv1.NodeClaim, t string) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == t {
			cond := metav1.Condition(c.Status.Conditions[i])
			return &cond
		}
	}
	return nil
}

// Karpenter v1: empty from the pods. Karpenter v1 writes no Empty condition, so with Pods
// cached (Options.EmptyFromPods) the watchdog looks at what Karpenter looks at: a node whose
// only pods are DaemonSet and mirror pods (or terminal ones) is empty. How long it has been
// empty is not recorded anywhere in the API (the pods that left are gone), so the watchdog
// remembers, per node, the first scan that saw it empty, and forgets it when a pod lands
// or the node goes. After a restart (or a leader change) the clock starts again: a stuck
// node is flagged consolidateAfter plus grace after the new leader's first scan, never
// early.

// emptyTracker remembers since when each node has been seen empty.
type emptyTracker struct {
	since map[string]time.Time // node name -> first scan that saw it empty
}

func newEmptyTracker() *emptyTracker { return &emptyTracker{since: map[string]time.Time{}} }

// v1Pools returns the pools whose empty nodes Karpenter v1 removes: WhenEmpty or
// WhenEmptyOrUnderutilized, a finite consolidateAfter, not static.
func v1Pools(pools []karpv1.NodePool) map[string]time.Duration {
	after := map[string]time.Duration{}
	for _, p := range pools {
		d := p.Spec.Disruption
		if (d.ConsolidationPolicy != karpv1.ConsolidationPolicyWhenEmpty && d.ConsolidationPolicy != karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized) ||
			d.ConsolidateAfter.Duration == nil || p.Spec.Replicas != nil {
			continue
		}
		after[p.Name] = *d.ConsolidateAfter.Duration
	}
	return after
}

// stuckEmptyPods returns the pools it checked and, per pool, the NodeClaims (the node's
// name where no NodeClaim is found) of initialized nodes, neither being deleted, empty of
// workload pods for longer than consolidateAfter plus grace since first seen empty.
func (w *Watchdog) stuckEmptyPods(ctx context.Context, pools []karpv1.NodePool, claims []karpv1.NodeClaim, kept map[string]bool, now time.Time, grace time.Duration) ([]string, []StuckEmpty, error) {
	after := v1Pools(pools)
	checked := sortedKeys(after)
	byProvider := map[string]*karpv1.NodeClaim{}
	for i := range claims {
		if id := claims[i].Status.ProviderID; id != "" {
			byProvider[id] = &claims[i]
		}
	}
	var nodes corev1.NodeList
	if err := w.reader.List(ctx, &nodes); err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	seen := map[string]bool{}
	byPool := map[string]*StuckEmpty{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		pool := n.Labels[karpv1.NodePoolLabelKey]
		ca, ok := after[pool]
		if !ok || n.Labels[karpv1.NodeInitializedLabelKey] != "true" || !n.DeletionTimestamp.IsZero() {
			continue
		}
		claim := byProvider[n.Spec.ProviderID]
		if claim != nil && (!claim.DeletionTimestamp.IsZero() || kept[claim.Name]) {
			continue // on its way out, or emptied on purpose by a reboot in place: not stuck
		}
		var pods corev1.PodList
		if err := w.reader.List(ctx, &pods, client.MatchingFields{gates.IndexPodNode: n.Name}); err != nil {
			return nil, nil, fmt.Errorf("listing pods of node %s: %w", n.Name, err)
		}
		if slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return gates.Evicted(&p) && p.DeletionTimestamp.IsZero() }) {
			continue
		}
		seen[n.Name] = true
		since, ok := w.empty.since[n.Name]
		if !ok {
			since = now
			w.empty.since[n.Name] = now
		}
		if !now.After(since.Add(ca + grace)) {
			continue
		}
		name := n.Name
		if claim != nil {
			name = claim.Name
		}
		s := byPool[pool]
		if s == nil {
			s = &StuckEmpty{NodePool: pool, ConsolidateAfter: ca, Since: since}
			byPool[pool] = s
		}
		s.NodeClaims = append(s.NodeClaims, name)
		if since.Before(s.Since) {
			s.Since = since
		}
	}
	for name := range w.empty.since {
		if !seen[name] {
			delete(w.empty.since, name) // a pod landed, or the node is gone or going
		}
	}
	var found []StuckEmpty
	for _, pool := range sortedKeys(byPool) {
		found = append(found, *byPool[pool])
	}
	return checked, found, nil
}

// mergeStuckEmpty joins the findings of the Empty-condition and the pod paths: one entry
// per pool, each NodeClaim once.
func mergeStuckEmpty(a, b []StuckEmpty) []StuckEmpty {
	byPool := map[string]*StuckEmpty{}
	for _, s := range slices.Concat(a, b) {
		m := byPool[s.NodePool]
		if m == nil {
			c := s
			c.NodeClaims = slices.Clone(s.NodeClaims)
			byPool[s.NodePool] = &c
			continue
		}
		m.NodeClaims = append(m.NodeClaims, s.NodeClaims...)
		if s.Since.Before(m.Since) {
			m.Since = s.Since
		}
	}
	var out []StuckEmpty
	for _, pool := range sortedKeys(byPool) {
		s := byPool[pool]
		slices.Sort(s.NodeClaims)
		s.NodeClaims = slices.Compact(s.NodeClaims)
		out = append(out, *s)
	}
	return out
}
