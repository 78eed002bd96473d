package poller

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// ClusterInstances lists the cluster's instances: the provider IDs of Karpenter's NodeClaims
// (status.providerID, set once launched) and of Nodes (spec.providerID), so that an instance
// is polled from launch until both are gone.
type ClusterInstances struct {
	reader client.Reader
}

// NewClusterInstances returns a lister reading through reader (the manager's cache).
func NewClusterInstances(reader client.Reader) *ClusterInstances {
	return &ClusterInstances{reader: reader}
}

// InstanceIDs returns the cluster's EC2 instance IDs, sorted, without duplicates.
func (c *ClusterInstances) InstanceIDs(ctx context.Context) ([]string, error) {
	var claims karpv1.NodeClaimList
	// Read-only walk over the cache: no copy of every object each minute.
	if err := c.reader.List(ctx, &claims, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing NodeClaims: %w", err)
	}
	var nodes corev1.NodeList
	if err := c.reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	ids := make([]string, 0, len(claims.Items)+len(nodes.Items))
	for i := range claims.Items {
		if id := cluster.InstanceID(claims.Items[i].Status.ProviderID); id != "" {
			ids = append(ids, id)
		}
	}
	for i := range nodes.Items {
		if id := cluster.InstanceID(nodes.Items[i].Spec.ProviderID); id != "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}
