// Package cluster resolves an EC2 instance ID to the Kubernetes objects Karpenter keeps for
// it: Node (spec.providerID) -> NodeClaim (status.providerID) -> NodePool (the
// karpenter.sh/nodepool label) -> EC2NodeClass (spec.nodeClassRef). Lookups go through
// field indexes, over a live controller-runtime cache or over a snapshot file alike.
package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// Field indexes the model needs on its reader.
const (
	// IndexInstanceID indexes Nodes and NodeClaims by the bucket of the EC2 instance ID of
	// their provider ID (InstanceBucket); read it through InstanceNodes and InstanceClaims.
	IndexInstanceID = "healthrouter.io/instance-id"
	// IndexNodePool indexes NodeClaims by their NodePool.
	IndexNodePool = "healthrouter.io/nodepool"
)

// NewScheme returns a scheme with the core, Karpenter and Karpenter AWS types.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	// The Karpenter API packages register themselves only into client-go's global scheme;
	// this scheme is the router's own.
	karpGV := schema.GroupVersion{Group: "karpenter.sh", Version: "v1"}
	metav1.AddToGroupVersion(s, karpGV)
	s.AddKnownTypes(karpGV, &karpv1.NodePool{}, &karpv1.NodePoolList{}, &karpv1.NodeClaim{}, &karpv1.NodeClaimList{})
	awsGV := schema.GroupVersion{Group: "karpenter.k8s.aws", Version: "v1"}
	metav1.AddToGroupVersion(s, awsGV)
	s.AddKnownTypes(awsGV, &awsv1.EC2NodeClass{}, &awsv1.EC2NodeClassList{})
	if err := record.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// InstanceID returns the instance ID of an AWS provider ID (aws:///eu-west-1a/i-0123...),
// or "" if it is not one.
func InstanceID(providerID string) string {
	rest, ok := strings.CutPrefix(providerID, "aws://")
	if !ok {
		return ""
	}
	id := rest[strings.LastIndex(rest, "/")+1:]
	if !strings.HasPrefix(id, "i-") {
		return ""
	}
	return id
}

// instanceBucketDigits makes the IndexInstanceID values: the last three hex digits of an
// instance ID. client-go's indexer keeps a set per value (~300 bytes for a set of one), so an
// index by whole instance ID cost two sets per node, a fifth of the cache; at 100,000 nodes a
// bucket holds ~25 objects, which a lookup reads (without deep copies where it asks) and filters.
const instanceBucketDigits = 3

// InstanceBucket returns the IndexInstanceID value of an instance ID.
func InstanceBucket(instanceID string) string {
	return instanceID[max(0, len(instanceID)-instanceBucketDigits):]
}

// InstanceNodes returns the Nodes of an instance, read through IndexInstanceID.
func InstanceNodes(ctx context.Context, r client.Reader, instanceID string, opts ...client.ListOption) ([]corev1.Node, error) {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes, append(opts, client.MatchingFields{IndexInstanceID: InstanceBucket(instanceID)})...); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(nodes.Items, func(n corev1.Node) bool { return InstanceID(n.Spec.ProviderID) != instanceID }), nil
}

// InstanceClaims returns the NodeClaims of an instance, read through IndexInstanceID.
func InstanceClaims(ctx context.Context, r client.Reader, instanceID string, opts ...client.ListOption) ([]karpv1.NodeClaim, error) {
	var claims karpv1.NodeClaimList
	if err := r.List(ctx, &claims, append(opts, client.MatchingFields{IndexInstanceID: InstanceBucket(instanceID)})...); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(claims.Items, func(nc karpv1.NodeClaim) bool { return InstanceID(nc.Status.ProviderID) != instanceID }), nil
}

// Index is one field index: the object type it applies to, its name, and its function.
type Index struct {
	Object  client.Object
	Field   string
	Extract client.IndexerFunc
}

// Indexes returns the field indexes Model reads through.
func Indexes() []Index {
	return []Index{
		{&corev1.Node{}, IndexInstanceID, func(o client.Object) []string {
			return instanceBucket(o.(*corev1.Node).Spec.ProviderID)
		}},
		{&karpv1.NodeClaim{}, IndexInstanceID, func(o client.Object) []string {
			return instanceBucket(o.(*karpv1.NodeClaim).Status.ProviderID)
		}},
		{&karpv1.NodeClaim{}, IndexNodePool, func(o client.Object) []string {
			return nonEmpty(o.GetLabels()[karpv1.NodePoolLabelKey])
		}},
	}
}

// SetupIndexes registers Indexes on a live cache (a manager's field indexer).
func SetupIndexes(ctx context.Context, fi client.FieldIndexer) error {
	for _, ix := range Indexes() {
		if err := fi.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	return nil
}

// instanceBucket is the IndexInstanceID value of a provider ID: none if it names no instance.
func instanceBucket(providerID string) []string {
	if id := InstanceID(providerID); id != "" {
		return []string{InstanceBucket(id)}
	}
	return nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// Model answers the router's questions about the cluster.
type Model struct {
	reader client.Reader
}

// New returns a Model that reads through r, which must have Indexes registered.
func New(r client.Reader) *Model { return &Model{reader: r} }

// Resolved is everything the cluster knows about one instance; any part may be nil. The
// objects are the reader's own (read without a deep copy, which dominated the cost of a
// decision): read them, never change them; DeepCopy first.
type Resolved struct {
	InstanceID string
	Node       *corev1.Node
	NodeClaim  *karpv1.NodeClaim
	NodePool   *karpv1.NodePool
	NodeClass  *awsv1.EC2NodeClass
	// Memory, when set, is the router's memory of the NodeClaim as read fresh (a decision
	// made again before a destructive action); nil: read from the cache when needed.
	Memory *record.Memory
}

// Found reports whether the instance is a node of this cluster.
func (r Resolved) Found() bool { return r.Node != nil || r.NodeClaim != nil }

// PoolName returns the NodePool name from the NodeClaim, or else the Node, label.
func (r Resolved) PoolName() string {
	if r.NodeClaim != nil && r.NodeClaim.Labels[karpv1.NodePoolLabelKey] != "" {
		return r.NodeClaim.Labels[karpv1.NodePoolLabelKey]
	}
	if r.Node != nil {
		return r.Node.Labels[karpv1.NodePoolLabelKey]
	}
	return ""
}

// Resolve looks an instance up. Not finding it is not an error; failing to read is.
func (m *Model) Resolve(ctx context.Context, instanceID string) (Resolved, error) {
	res := Resolved{InstanceID: instanceID}
	nodes, err := InstanceNodes(ctx, m.reader, instanceID, client.UnsafeDisableDeepCopy)
	if err != nil {
		return res, fmt.Errorf("listing nodes of instance %s: %w", instanceID, err)
	}
	if len(nodes) > 0 {
		res.Node = &nodes[0]
	}
	claims, err := InstanceClaims(ctx, m.reader, instanceID, client.UnsafeDisableDeepCopy)
	if err != nil {
		return res, fmt.Errorf("listing nodeclaims of instance %s: %w", instanceID, err)
	}
	if len(claims) > 0 {
		res.NodeClaim = &claims[0]
	}
	if pool := res.PoolName(); pool != "" {
		np := &karpv1.NodePool{}
		if err := m.get(ctx, pool, np); err != nil {
			return res, err
		} else if np.Name != "" {
			res.NodePool = np
		}
	}
	if res.NodeClaim != nil && res.NodeClaim.Spec.NodeClassRef != nil && res.NodeClaim.Spec.NodeClassRef.Kind == "EC2NodeClass" {
		nc := &awsv1.EC2NodeClass{}
		if err := m.get(ctx, res.NodeClaim.Spec.NodeClassRef.Name, nc); err != nil {
			return res, err
		} else if nc.Name != "" {
			res.NodeClass = nc
		}
	}
	return res, nil
}

// ReservationInstances returns the instance IDs of the NodeClaims that carry a capacity
// reservation (Karpenter's karpenter.k8s.aws/capacity-reservation-id label), sorted: the
// instances of a Capacity Block, whose expiration warning names the reservation only. A
// NodeClaim without an instance yet (launching) is left out: there is nothing to drain.
func (m *Model) ReservationInstances(ctx context.Context, reservationID string) ([]string, error) {
	var claims karpv1.NodeClaimList
	if err := m.reader.List(ctx, &claims, client.MatchingLabels{awsv1.LabelCapacityReservationID: reservationID}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodeclaims of capacity reservation %s: %w", reservationID, err)
	}
	var ids []string
	for _, nc := range claims.Items {
		if id := InstanceID(nc.Status.ProviderID); id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Get reads a cluster-scoped object (a NodePool, an EC2NodeClass) from the model's reader;
// a missing object leaves obj empty without error.
func (m *Model) Get(ctx context.Context, name string, obj client.Object) error {
	return m.get(ctx, name, obj)
}

// get reads a cluster-scoped object; a missing object leaves obj empty without error.
func (m *Model) get(ctx context.Context, name string, obj client.Object) error {
	err := m.reader.Get(ctx, client.ObjectKey{Name: name}, obj, client.UnsafeDisableDeepCopy)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("getting %T %s: %w", obj, name, err)
	}
	return nil
}

// PoolState counts a NodePool's NodeClaims and those being drained: deleted, or signalled
// by the router and not yet gone.
func (m *Model) PoolState(ctx context.Context, pool string) (nodes, inFlight int, err error) {
	members, err := m.PoolMembers(ctx, pool)
	if err != nil {
		return 0, 0, err
	}
	for _, draining := range members {
		if draining {
			inFlight++
		}
	}
	return len(members), inFlight, nil
}

// PoolMembers returns a NodePool's NodeClaims by name, each with whether it is being
// drained (deleted, or signalled by the router and not yet gone).
func (m *Model) PoolMembers(ctx context.Context, pool string) (map[string]bool, error) {
	var claims karpv1.NodeClaimList
	if err := m.reader.List(ctx, &claims, client.MatchingFields{IndexNodePool: pool}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodeclaims of nodepool %s: %w", pool, err)
	}
	mems, err := m.PoolMemories(ctx, pool)
	if err != nil {
		return nil, err
	}
	members := make(map[string]bool, len(claims.Items))
	for i := range claims.Items {
		members[claims.Items[i].Name] = Draining(&claims.Items[i], mems[claims.Items[i].Name])
	}
	return members, nil
}

// PoolMemories returns the router's memory (router/record's HealthRecords) of a NodePool's
// NodeClaims, by NodeClaim name: the reader's own objects (read them, never change them).
// A NodeClaim the router keeps nothing for has none.
func (m *Model) PoolMemories(ctx context.Context, pool string) (map[string]record.Memory, error) {
	var hrs record.HealthRecordList
	if err := m.reader.List(ctx, &hrs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}, client.UnsafeDisableDeepCopy); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing healthrecords of nodepool %s: %w", pool, err)
	}
	out := make(map[string]record.Memory, len(hrs.Items))
	for i := range hrs.Items {
		out[hrs.Items[i].Name] = hrs.Items[i].Status.Memory
	}
	return out, nil
}

// Memory returns the router's memory of the NodeClaim named name, from the reader (empty
// when it keeps none; unreadable: empty, see record.Store.Get).
func (m *Model) Memory(ctx context.Context, name string) record.Memory {
	mem, _ := record.Load(ctx, m.reader, name)
	return mem
}

// PoolClaims returns a NodePool's NodeClaims: the reader's own objects (read them, never
// change them).
func (m *Model) PoolClaims(ctx context.Context, pool string) ([]*karpv1.NodeClaim, error) {
	var claims karpv1.NodeClaimList
	if err := m.reader.List(ctx, &claims, client.MatchingFields{IndexNodePool: pool}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodeclaims of nodepool %s: %w", pool, err)
	}
	out := make([]*karpv1.NodeClaim, len(claims.Items))
	for i := range claims.Items {
		out[i] = &claims.Items[i]
	}
	return out, nil
}

// Draining reports whether a NodeClaim is being drained: deleted, or signalled by the
// router (its memory holds the drain) and not yet gone.
func Draining(nc *karpv1.NodeClaim, mem record.Memory) bool {
	return !nc.DeletionTimestamp.IsZero() || mem.Drain != nil
}
