// Package gates answers the gates a non-urgent drain waits on: a PodDisruptionBudget of a
// pod on the node that allows no disruption, and a matching alert firing in Alertmanager.
// Each gate answers with a policy.Gate; policy.ApplyGates folds the answers into the
// decision.
package gates

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
)

// IndexPodNode is how the PDB gate and the stuck-empty watchdog select the pods of one node:
// the field selector the API server serves for Pods (the live router reads Pods uncached: a
// cache of every Pod would grow with the cluster's workload, not with its nodes), and the
// name of the same index over a cache or a snapshot (tests, replay).
const IndexPodNode = "spec.nodeName"

// AnnotationMirror marks a static pod's mirror in the API server; the kubelet owns it and
// no eviction applies to it.
const AnnotationMirror = corev1.MirrorPodAnnotationKey

// Evidence keys of the PDB gate.
const (
	// EvidencePDBs lists the PDBs at zero, as "namespace/name" separated by commas.
	EvidencePDBs = "pdbs"
	EvidencePods = "pods"
)

// Indexes returns the field indexes the gates read through (register them on the cache
// as cluster.SetupIndexes does).
func Indexes() []cluster.Index {
	return []cluster.Index{
		{Object: &corev1.Pod{}, Field: IndexPodNode, Extract: func(o client.Object) []string {
			if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
				return []string{n}
			}
			return nil
		}},
	}
}

// PDBKey is the release key of a drain held on a PodDisruptionBudget ("pdb/<ns>/<name>"):
// when that PDB changes, the drains held on it are decided again.
func PDBKey(namespace, name string) string { return "pdb/" + namespace + "/" + name }

// HeldPDBs returns the "namespace/name" of each PDB that holds d (empty unless the PDB gate
// holds it), for the release keys of its deferral.
func HeldPDBs(d policy.Decision) []string {
	for _, g := range d.Gates {
		if g.Name == policy.GatePDB && g.Held && g.Evidence[EvidencePDBs] != "" {
			return strings.Split(g.Evidence[EvidencePDBs], ",")
		}
	}
	return nil
}

// Evicted reports whether a drain evicts p: not a DaemonSet's pod (Karpenter leaves them),
// not a mirror pod, not a pod already terminal.
func Evicted(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[AnnotationMirror]; mirror {
		return false
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return false
		}
	}
	return true
}

// PDB is the PodDisruptionBudget gate. It reads Pods (indexed by IndexPodNode) and PDBs
// from the cache: no API call per decision.
type PDB struct {
	reader client.Reader
}

// NewPDB returns the gate; r must have Indexes registered and cache Pods and PDBs.
func NewPDB(r client.Reader) *PDB { return &PDB{reader: r} }

// Check answers the gate for a drain of node: held when a PDB selecting one of the pods a
// drain would evict has status.disruptionsAllowed == 0. An eviction of such a pod would be
// refused, and Karpenter would wait until the NodeClaim's terminationGracePeriod and then
// delete the pods anyway.
func (g *PDB) Check(ctx context.Context, node string) (policy.Gate, error) {
	gate := policy.Gate{Name: policy.GatePDB}
	// PDBs are cached, pods are not: only when some PDB allows no disruption are the node's
	// pods read. In steady state (every PDB allows one) a drain costs no request here.
	var all policyv1.PodDisruptionBudgetList
	if err := g.reader.List(ctx, &all); err != nil {
		return gate, fmt.Errorf("listing poddisruptionbudgets: %w", err)
	}
	if !slices.ContainsFunc(all.Items, func(p policyv1.PodDisruptionBudget) bool { return p.Status.DisruptionsAllowed <= 0 }) {
		gate.Reason = "no PodDisruptionBudget is at zero"
		return gate, nil
	}
	var pods corev1.PodList
	if err := g.reader.List(ctx, &pods, client.MatchingFields{IndexPodNode: node}); err != nil {
		return gate, fmt.Errorf("listing pods of node %s: %w", node, err)
	}
	byNS := map[string][]*corev1.Pod{}
	for i := range pods.Items {
		if p := &pods.Items[i]; Evicted(p) {
			byNS[p.Namespace] = append(byNS[p.Namespace], p)
		}
	}
	var blocked, blockedPods, why []string
	var since time.Time
	for _, ns := range sortedKeys(byNS) {
		var pdbs policyv1.PodDisruptionBudgetList
		if err := g.reader.List(ctx, &pdbs, client.InNamespace(ns)); err != nil {
			return gate, fmt.Errorf("listing poddisruptionbudgets in %s: %w", ns, err)
		}
		for i := range pdbs.Items {
			pdb := &pdbs.Items[i]
			if pdb.Status.DisruptionsAllowed > 0 {
				continue
			}
			sel, err := selector(pdb)
			if err != nil || sel == nil {
				continue // a selector the API server would refuse, or nil: selects nothing
			}
			var covered []string
			for _, p := range byNS[ns] {
				if sel.Matches(labels.Set(p.Labels)) {
					covered = append(covered, p.Name)
				}
			}
			if len(covered) == 0 {
				continue
			}
			name := ns + "/" + pdb.Name
			blocked = append(blocked, name)
			for _, p := range covered {
				blockedPods = append(blockedPods, ns+"/"+p)
			}
			why = append(why, fmt.Sprintf("PodDisruptionBudget %s allows no disruption (%d healthy, %d desired) and selects %s",
				name, pdb.Status.CurrentHealthy, pdb.Status.DesiredHealthy, abbreviate(covered)))
			if c := disruptionAllowed(pdb); c != nil && c.Status == metav1.ConditionFalse && (since.IsZero() || c.LastTransitionTime.Time.Before(since)) {
				since = c.LastTransitionTime.Time
			}
		}
	}
	if len(blocked) == 0 {
		gate.Reason = fmt.Sprintf("no PodDisruptionBudget at zero covers the %d pod(s) a drain of %s evicts", count(byNS), node)
		return gate, nil
	}
	gate.Held, gate.Since = true, since
	gate.Reason = strings.Join(why, "; ")
	gate.Evidence = map[string]string{EvidencePDBs: strings.Join(blocked, ","), EvidencePods: abbreviate(blockedPods)}
	return gate, nil
}

func selector(pdb *policyv1.PodDisruptionBudget) (labels.Selector, error) {
	if pdb.Spec.Selector == nil {
		return nil, nil
	}
	// policy/v1: an empty selector selects every pod of the namespace.
	return metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
}

func disruptionAllowed(pdb *policyv1.PodDisruptionBudget) *metav1.Condition {
	for i := range pdb.Status.Conditions {
		if pdb.Status.Conditions[i].Type == policyv1.DisruptionAllowedCondition {
			return &pdb.Status.Conditions[i]
		}
	}
	return nil
}

func count(m map[string][]*corev1.Pod) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// abbreviate joins names, at most five of them, so that a reason stays readable.
func abbreviate(names []string) string {
	const most = 5
	if len(names) <= most {
		return strings.Join(names, ",")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:most], ","), len(names)-most)
}

// PDBReleased reports whether a PodDisruptionBudget's update can release the drains held on
// it: it allowed no disruption and now allows some (or it is gone: deleted is nil). The
// live router then decides the drains held on PDBKey(namespace, name) again.
func PDBReleased(old, updated *policyv1.PodDisruptionBudget) bool {
	if old == nil || old.Status.DisruptionsAllowed > 0 {
		return false
	}
	return updated == nil || updated.Status.DisruptionsAllowed > 0
}
