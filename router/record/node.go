package record

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

// A Node Karpenter does not manage has no NodeClaim: what the router keeps of it (its own
// drain of the Node, router/nodedrain) is a HealthRecord of the Node, named NodeRecordName,
// with Spec.NodeName set and Spec.NodeClaim empty, owned by the Node (the garbage collector
// removes it with the Node).
const (
	// NodePrefix begins the name of a Node's HealthRecord. Karpenter names a NodeClaim after
	// its NodePool and a suffix joined by a dash, so in practice no NodeClaim's name begins so.
	NodePrefix = "node."
	// AnnotationNodeDrain held, on the Node, the router's drain of it before the store
	// (Memory.NodeDrain): adopted once at an upgrade (router/nodedrain's Adopt) and removed.
	AnnotationNodeDrain = "healthrouter.io/node-drain"
)

// NodeRecordName is the name of the HealthRecord of the Node named node: NodePrefix and the
// Node's name, or, where that would pass the 253 characters of an object's name, NodePrefix
// and a hash of the Node's name.
func NodeRecordName(node string) string { return prefixedName(NodePrefix, node) }

// prefixedName is prefix and name, or, where that would pass the 253 characters of an
// object's name, prefix and a hash of name.
func prefixedName(prefix, name string) string {
	if full := prefix + name; len(full) <= validation.DNS1123SubdomainMaxLength {
		return full
	}
	sum := sha256.Sum256([]byte(name))
	return prefix + "sha256-" + hex.EncodeToString(sum[:16])
}

// OfNode reports whether h is the record of a Node Karpenter does not manage, not a
// NodeClaim's: its readers that mean NodeClaims pass it by.
func (h *HealthRecord) OfNode() bool {
	return h.Spec.NodeClaim == "" && h.Spec.NodeName != "" && strings.HasPrefix(h.Name, NodePrefix)
}

// OfClaim reports whether h is the record of a NodeClaim: neither a Node's (OfNode) nor the
// shadow ledger (OfLedger).
func (h *HealthRecord) OfClaim() bool { return !h.OfNode() && !h.OfLedger() }

// OfClaims passes the HealthRecords of NodeClaims (OfClaim), not those of Nodes or the
// ledger, for the controllers that watch HealthRecords to reach NodeClaims.
func OfClaims() predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		hr, ok := o.(*HealthRecord)
		return !ok || hr.OfClaim()
	})
}

// NodeMemory returns the memory of the Node named node, as the cache has it.
func (s *Store) NodeMemory(ctx context.Context, node string) (Memory, error) {
	return Load(ctx, s.kube, NodeRecordName(node))
}

// FreshNodeMemory returns the memory of the Node named node as the API server has it now.
func (s *Store) FreshNodeMemory(ctx context.Context, node string) (Memory, error) {
	return Load(ctx, s.fresh, NodeRecordName(node))
}

// UpdateNode is Update for the Node n (read as the API server has it: n's UID binds the
// record to this Node). The record is read fresh, not from the cache, first: the drains of
// Nodes are few, and a decision to end one must not rest on a cache that has yet to show it.
// A record of an earlier Node of the same name (another UID) is removed first: its memory is
// not this Node's.
func (s *Store) UpdateNode(ctx context.Context, n *corev1.Node, mutate func(*Memory) (bool, error)) error {
	stale := func(hr *HealthRecord) bool {
		uid := hr.NodeUID()
		return n.UID != "" && uid != "" && uid != n.UID
	}
	return s.update(ctx, NodeRecordName(n.Name), "node "+n.Name, true, MaxBytes, func() *HealthRecord { return newNodeRecord(n) }, stale, mutate)
}

// DeleteNode removes the memory of the Node named node (it is gone).
func (s *Store) DeleteNode(ctx context.Context, node string) error {
	return s.Delete(ctx, NodeRecordName(node))
}

// NodeUID is the UID of the Node that owns h, or "".
func (h *HealthRecord) NodeUID() (uid types.UID) {
	for _, o := range h.OwnerReferences {
		if o.Kind == "Node" && o.APIVersion == "v1" {
			return o.UID
		}
	}
	return ""
}

// newNodeRecord is the HealthRecord of the Node n, owned by it.
func newNodeRecord(n *corev1.Node) *HealthRecord {
	hr := &HealthRecord{
		TypeMeta:   metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: Kind},
		ObjectMeta: metav1.ObjectMeta{Name: NodeRecordName(n.Name)},
		Spec:       HealthRecordSpec{NodeName: n.Name, InstanceID: instanceOfProvider(n.Spec.ProviderID)},
	}
	if n.UID != "" {
		hr.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID}}
	}
	return hr
}
