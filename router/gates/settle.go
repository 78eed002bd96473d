package gates

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Owner is the controller of pods that ran on a drained node: drain-settle "ready" waits
// until every pod of each such owner is Ready again, elsewhere. Record the owners when the
// drain is signalled (the node and its pods are gone by the time it matters).
type Owner struct {
	Namespace string    `json:"namespace"`
	Kind      string    `json:"kind"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
}

func (o Owner) String() string { return o.Namespace + "/" + strings.ToLower(o.Kind) + "/" + o.Name }

// Owners returns the controllers of the pods a drain of node evicts (Evicted), sorted and
// each once. Pods without a controller are left out: nothing recreates them, so nothing
// can become Ready again.
func Owners(ctx context.Context, r client.Reader, node string) ([]Owner, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{IndexPodNode: node}); err != nil {
		return nil, fmt.Errorf("listing pods of node %s: %w", node, err)
	}
	var out []Owner
	for i := range pods.Items {
		p := &pods.Items[i]
		if !Evicted(p) {
			continue
		}
		for _, ref := range p.OwnerReferences {
			if ref.Controller != nil && *ref.Controller {
				o := Owner{Namespace: p.Namespace, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}
				if !slices.Contains(out, o) {
					out = append(out, o)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Owner) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

// Settled reports whether every pod of the owners is Ready and none runs on node (the
// drained node, or "" when it is gone): a drain with drain-settle "ready" is in flight until
// then. The reason names what is still waited for. An owner with no pod at all is not
// settled (its pods are not recreated yet). A Deployment's pods are owned by its ReplicaSet:
// record the ReplicaSet, as Owners does.
func Settled(ctx context.Context, r client.Reader, owners []Owner, node string) (bool, string, error) {
	byNS := map[string][]Owner{}
	for _, o := range owners {
		byNS[o.Namespace] = append(byNS[o.Namespace], o)
	}
	var waiting []string
	for _, ns := range sortedKeys(byNS) {
		var pods corev1.PodList
		if err := r.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, "", fmt.Errorf("listing pods in %s: %w", ns, err)
		}
		for _, o := range byNS[ns] {
			total, ready := 0, 0
			for i := range pods.Items {
				p := &pods.Items[i]
				if !ownedBy(p, o.UID) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
					continue
				}
				total++
				if podReady(p) && p.DeletionTimestamp.IsZero() && (node == "" || p.Spec.NodeName != node) {
					ready++
				}
			}
			if total == 0 || ready < total {
				waiting = append(waiting, fmt.Sprintf("%s (%d of %d pods Ready elsewhere)", o, ready, total))
			}
		}
	}
	if len(waiting) > 0 {
		return false, "waiting for " + abbreviate(waiting), nil
	}
	return true, fmt.Sprintf("every pod of %d owner(s) is Ready again", len(owners)), nil
}

func ownedBy(p *corev1.Pod, uid types.UID) bool {
	for _, ref := range p.OwnerReferences {
		if ref.UID == uid && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
