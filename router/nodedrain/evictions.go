package nodedrain

import (
	"context"
	"sync"

	policy "k8s.io/api/policy/v1"
	"k8s.io/client-go/kubernetes"
	policyv1 "k8s.io/client-go/kubernetes/typed/policy/v1"
)

// observer notes, for one eviction round, which pods a PodDisruptionBudget refused to let go
// and why. The drain helper retries a refusal until its timeout and reports only "timeout
// reached"; the answers themselves pass through the client it is given, so they are read
// there rather than parsed back out of the helper's messages.
type observer struct {
	mu      sync.Mutex
	refused map[string]string // "namespace/pod" -> the API server's explanation
}

func (o *observer) note(namespace, pod string, err error) {
	key := namespace + "/" + pod
	o.mu.Lock()
	defer o.mu.Unlock()
	if why, ok := budgetRefusal(err); ok {
		o.refused[key] = why
		return
	}
	// Evicted since (or refused for another reason, which the helper reports itself).
	delete(o.refused, key)
}

// snapshot returns the pods still refused at the end of the round.
func (o *observer) snapshot() map[string]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]string, len(o.refused))
	for k, v := range o.refused {
		out[k] = v
	}
	return out
}

// observed is the clientset the drain helper gets: the real one, with policy/v1 evictions
// passing their answers to an observer on the way back.
type observed struct {
	kubernetes.Interface
	obs *observer
}

func (c observed) PolicyV1() policyv1.PolicyV1Interface {
	return observedPolicy{PolicyV1Interface: c.Interface.PolicyV1(), obs: c.obs}
}

type observedPolicy struct {
	policyv1.PolicyV1Interface
	obs *observer
}

func (p observedPolicy) Evictions(namespace string) policyv1.EvictionInterface {
	return observedEvictions{EvictionInterface: p.PolicyV1Interface.Evictions(namespace), obs: p.obs}
}

type observedEvictions struct {
	policyv1.EvictionInterface
	obs *observer
}

func (e observedEvictions) Evict(ctx context.Context, eviction *policy.Eviction) error {
	err := e.EvictionInterface.Evict(ctx, eviction)
	e.obs.note(eviction.Namespace, eviction.Name, err)
	return err
}
