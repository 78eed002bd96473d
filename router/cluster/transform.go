package cluster

import (
	"slices"
	"strings"
	"sync"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/record"
)

// What the cache keeps: the router's memory grows with what it reads, not with what
// Kubernetes stores. A Node in a real cluster carries ~40 status.images, conditions,
// addresses, managedFields and annotations the router never reads (together several KiB);
// the router reads a Node's name, labels and provider ID, and a NodeClaim's metadata,
// provider ID, NodeClass reference and conditions (the watchdog).

// labelPrefixes are the labels the router reads on a NodeClaim: Karpenter's own (the NodePool,
// the capacity type), kubernetes.io/ (arch, OS), and of the AWS provider's labels those an
// image requirement in EC2NodeClass status.amis names (GPU and accelerator counts and kinds)
// and the capacity reservation's. The instance type and zone help a person reading a decision.
// Karpenter's other shape labels (CPU, memory, family, network, ...) and a node's custom labels
// are dropped: about 30 of them per node otherwise.
var labelPrefixes = []string{"karpenter.sh/", "kubernetes.io/", "node.kubernetes.io/instance-type", "node.kubernetes.io/windows-build",
	"topology.kubernetes.io/zone", "karpenter.k8s.aws/instance-gpu-", "karpenter.k8s.aws/instance-accelerator-", "karpenter.k8s.aws/capacity-reservation-"}

func keepLabel(k string) bool {
	for _, p := range labelPrefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// maxStrings bounds the strings a Trimmer interns; past it the table starts again, as the
// shared tables do (maxShared).
const maxStrings = 16384

// intern returns the Trimmer's one copy of s: the label keys and values and annotation keys
// of 100,000 nodes are a few hundred strings. The table holds its strings itself: Go's unique
// package drops a string from its pool once no handle to it is live, so after a garbage
// collection it hands out a new copy of a string the cache already holds.
func (t *Trimmer) intern(s string) string {
	t.smu.Lock()
	defer t.smu.Unlock()
	return shared(t.strs, s, maxStrings, func() string { return strings.Clone(s) })
}

// shared returns table's value for k, made by mk and kept when absent. A table at bound
// starts again: objects given earlier values keep them, later ones share new ones. The
// caller holds the table's lock.
func shared[K comparable, V any](table map[K]V, k K, bound int, mk func() V) V {
	if v, ok := table[k]; ok {
		return v
	}
	if len(table) >= bound {
		clear(table)
	}
	v := mk()
	table[k] = v
	return v
}

// trimLabels returns a new map of the labels the router reads, keys and values interned: a
// Go map does not shrink when keys are deleted, so the old one is dropped whole.
func (t *Trimmer) trimLabels(labels map[string]string, keep func(string) bool) map[string]string {
	n := 0
	for k := range labels {
		if keep(k) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for k, v := range labels {
		if keep(k) {
			out[t.intern(k)] = t.intern(v)
		}
	}
	return out
}

// keepNodeLabel: a Node keeps only Karpenter's own labels (its NodePool, initialized) and its
// architecture and OS; the shape labels the AMI check reads are kept once, on the NodeClaim
// (Karpenter copies them from there onto the Node).
func keepNodeLabel(k string) bool {
	return strings.HasPrefix(k, "karpenter.sh/") || strings.HasPrefix(k, routerPrefix) || k == corev1.LabelArchStable || k == corev1.LabelOSStable
}

// conditionsRead are the NodeClaim conditions the router reads (the watchdog): Empty (written
// by Karpenter before v1) and Drifted.
var conditionsRead = map[string]bool{"Empty": true, karpv1.ConditionTypeDrifted: true}

// routerPrefix prefixes what the router writes: its annotations and labels (records, the
// upcoming maintenance on a Node) and its taint.
const routerPrefix = "healthrouter.io/"

// routerAnnotations returns the annotations the router writes and reads on a NodeClaim
// (healthrouter.io/*: a shadow outcome); Karpenter's own hashes and the rest are dropped,
// and so are the keys routers before the store kept their memory in (record.Annotation,
// record.AnnotationDrainSignalled, record.AnnotationRun on NodeClaims,
// record.AnnotationNodeDrain on Nodes): the router never reads them as its memory, and the
// upgrade's adoption reads them from the API server.
func (t *Trimmer) routerAnnotations(a map[string]string) map[string]string {
	var out map[string]string
	for k, v := range a {
		if strings.HasPrefix(k, routerPrefix) && k != record.Annotation && k != record.AnnotationDrainSignalled && k != record.AnnotationRun && k != record.AnnotationNodeDrain {
			if out == nil {
				out = map[string]string{}
			}
			out[t.intern(k)] = v
		}
	}
	return out
}

// maxShared bounds the label sets and NodeClass references a Trimmer shares. A cluster has a
// few hundred (its pools by capacity type, zone, instance type, ...); past the bound the table
// starts again, so an odd churn of shapes costs sharing, never unbounded memory.
const maxShared = 4096

// Trimmer holds the cache transforms of Nodes and NodeClaims (Node, NodeClaim). Objects with
// the same kept labels share one labels map, and NodeClaims with the same NodeClass one
// reference: at 100,000 nodes a map per object was a third of the cache. Sharing is safe
// because the cache's objects are never changed in place (a Get or List copies them, and a
// read without a copy must not write: see Resolved).
type Trimmer struct {
	mu     sync.Mutex
	labels map[string]map[string]string
	refs   map[karpv1.NodeClassReference]*karpv1.NodeClassReference
	smu    sync.Mutex // guards strs, apart from mu: sharedLabels interns while holding mu
	strs   map[string]string
}

// NewTrimmer returns a Trimmer with empty tables.
func NewTrimmer() *Trimmer {
	return &Trimmer{labels: map[string]map[string]string{}, refs: map[karpv1.NodeClassReference]*karpv1.NodeClassReference{}, strs: map[string]string{}}
}

// sharedLabels returns the kept labels of an object, shared with every object that keeps
// the same ones; labels the router writes (its marks, a per-event time) are never shared.
func (t *Trimmer) sharedLabels(labels map[string]string, keep func(string) bool) map[string]string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		if keep(k) {
			if strings.HasPrefix(k, routerPrefix) {
				return t.trimLabels(labels, keep)
			}
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(labels[k])
		b.WriteByte(0)
	}
	id := b.String()
	t.mu.Lock()
	defer t.mu.Unlock()
	return shared(t.labels, id, maxShared, func() map[string]string { return t.trimLabels(labels, keep) })
}

// sharedRef returns a NodeClass reference equal to ref, shared by every NodeClaim with it.
func (t *Trimmer) sharedRef(ref *karpv1.NodeClassReference) *karpv1.NodeClassReference {
	if ref == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return shared(t.refs, *ref, maxShared, func() *karpv1.NodeClassReference {
		return &karpv1.NodeClassReference{Group: t.intern(ref.Group), Kind: t.intern(ref.Kind), Name: t.intern(ref.Name)}
	})
}

// Node is the cache transform of Nodes: name, Karpenter's labels and the architecture and
// OS, provider ID, deletion timestamp, the router's marks. It changes obj in place (the
// informer's own copy) and returns it.
func (t *Trimmer) Node(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	n.ManagedFields = nil
	n.Annotations = t.routerAnnotations(n.Annotations)
	n.OwnerReferences = nil
	n.Finalizers = nil
	n.Labels = t.sharedLabels(n.Labels, keepNodeLabel)
	var taints []corev1.Taint
	for _, tn := range n.Spec.Taints {
		if strings.HasPrefix(tn.Key, routerPrefix) {
			taints = append(taints, tn)
		}
	}
	n.Spec = corev1.NodeSpec{ProviderID: n.Spec.ProviderID, Taints: taints}
	n.Status = corev1.NodeStatus{}
	return n, nil
}

// NodeClaim is the cache transform of NodeClaims: metadata with only the router's own
// annotations (its records), the labels the router reads, the NodeClass reference, provider
// ID, the Node's name (what status, the calendar and the planned-drain gauges name; a few
// dozen bytes) and the conditions the watchdog reads (Empty, Drifted: type, status, times). Finalizers,
// owners and Karpenter's annotations are dropped: the router never writes them back (its
// writes are merge patches of its own annotations, and deletes).
func (t *Trimmer) NodeClaim(obj any) (any, error) {
	nc, ok := obj.(*karpv1.NodeClaim)
	if !ok {
		return obj, nil
	}
	nc.ManagedFields = nil
	nc.OwnerReferences = nil
	nc.Finalizers = nil
	nc.Annotations = t.routerAnnotations(nc.Annotations)
	nc.Labels = t.sharedLabels(nc.Labels, keepLabel)
	nc.Spec = karpv1.NodeClaimSpec{NodeClassRef: t.sharedRef(nc.Spec.NodeClassRef)}
	var conds []status.Condition
	for _, c := range nc.Status.Conditions {
		if conditionsRead[c.Type] {
			c.Message = ""
			conds = append(conds, c)
		}
	}
	nc.Status = karpv1.NodeClaimStatus{ProviderID: nc.Status.ProviderID, NodeName: nc.Status.NodeName, Conditions: conds}
	return nc, nil
}

// DropManagedFields is the cache transform of every other object the router caches.
func DropManagedFields(obj any) (any, error) {
	if o, ok := obj.(metav1.Object); ok {
		o.SetManagedFields(nil)
	}
	return obj, nil
}
