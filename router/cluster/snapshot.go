package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/health-router/health-router/router/record"
)

// Snapshot is a read-only client.Reader over a fixed set of objects, with the same field
// indexes as the live cache (client-go indexers), so that Model works over a file as it
// does over a cluster.
type Snapshot struct {
	scheme *runtime.Scheme
	stores map[schema.GroupVersionKind]cache.Indexer
}

var _ client.Reader = (*Snapshot)(nil)

// NewSnapshot indexes objs, whose types must be in scheme, with Indexes.
func NewSnapshot(scheme *runtime.Scheme, objs ...client.Object) (*Snapshot, error) {
	return NewSnapshotIndexed(scheme, Indexes(), objs...)
}

// NewSnapshotIndexed indexes objs with the given indexes (Indexes and, for the gates,
// gates.Indexes: the pods of a node).
func NewSnapshotIndexed(scheme *runtime.Scheme, indexes []Index, objs ...client.Object) (*Snapshot, error) {
	s := &Snapshot{scheme: scheme, stores: map[schema.GroupVersionKind]cache.Indexer{}}
	indexers := map[schema.GroupVersionKind]cache.Indexers{}
	for _, ix := range indexes {
		gvk, err := apiutil.GVKForObject(ix.Object, scheme)
		if err != nil {
			return nil, err
		}
		if indexers[gvk] == nil {
			indexers[gvk] = cache.Indexers{}
		}
		extract := ix.Extract
		indexers[gvk][ix.Field] = func(o any) ([]string, error) { return extract(o.(client.Object)), nil }
	}
	for _, o := range objs {
		gvk, err := apiutil.GVKForObject(o, scheme)
		if err != nil {
			return nil, err
		}
		store := s.stores[gvk]
		if store == nil {
			store = cache.NewIndexer(cache.MetaNamespaceKeyFunc, indexers[gvk])
			s.stores[gvk] = store
		}
		if err := store.Add(o); err != nil {
			return nil, fmt.Errorf("indexing %s %s: %w", gvk.Kind, o.GetName(), err)
		}
	}
	return s, nil
}

// Get implements client.Reader. Like the live cache, it hands out copies unless asked
// not to with client.UnsafeDisableDeepCopy.
func (s *Snapshot) Get(_ context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, s.scheme)
	if err != nil {
		return err
	}
	k := key.Name
	if key.Namespace != "" {
		k = key.Namespace + "/" + key.Name
	}
	var found any
	var ok bool
	if store := s.stores[gvk]; store != nil {
		found, ok, _ = store.GetByKey(k)
	}
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind)}, key.Name)
	}
	src := found.(runtime.Object)
	if go_ := (&client.GetOptions{}).ApplyOptions(opts); go_.UnsafeDisableDeepCopy == nil || !*go_.UnsafeDisableDeepCopy {
		src = src.DeepCopyObject()
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(src).Elem())
	return nil
}

// List implements client.Reader. A field selector must be one exact match on an index.
func (s *Snapshot) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, err := apiutil.GVKForObject(list, s.scheme)
	if err != nil {
		return err
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	store := s.stores[gvk]
	var items []any
	switch {
	case store == nil:
	case lo.FieldSelector != nil && !lo.FieldSelector.Empty():
		field, value, err := exactMatch(lo.FieldSelector)
		if err != nil {
			return err
		}
		if items, err = store.ByIndex(field, value); err != nil {
			return fmt.Errorf("listing %s by %s: %w", gvk.Kind, field, err)
		}
	default:
		items = store.List()
	}
	objs := make([]runtime.Object, 0, len(items))
	for _, it := range items {
		o := it.(client.Object)
		if lo.LabelSelector != nil && !lo.LabelSelector.Matches(labels.Set(o.GetLabels())) {
			continue
		}
		if lo.Namespace != "" && o.GetNamespace() != lo.Namespace {
			continue
		}
		if lo.UnsafeDisableDeepCopy != nil && *lo.UnsafeDisableDeepCopy {
			objs = append(objs, o)
		} else {
			objs = append(objs, o.DeepCopyObject())
		}
	}
	return meta.SetList(list, objs)
}

func exactMatch(sel fields.Selector) (string, string, error) {
	reqs := sel.Requirements()
	if len(reqs) != 1 || (reqs[0].Operator != selection.Equals && reqs[0].Operator != selection.DoubleEquals) {
		return "", "", fmt.Errorf("field selector %q: only one exact match on an index is supported", sel)
	}
	return reqs[0].Field, reqs[0].Value, nil
}

// modelKinds are the kinds the model and the gates read; Load leaves out the others.
var modelKinds = map[schema.GroupKind]bool{
	{Group: "", Kind: "Node"}:                          true,
	{Group: "", Kind: "Pod"}:                           true,
	{Group: "policy", Kind: "PodDisruptionBudget"}:     true,
	{Group: "karpenter.sh", Kind: "NodeClaim"}:         true,
	{Group: "karpenter.sh", Kind: "NodePool"}:          true,
	{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass"}: true,
	{Group: record.Group, Kind: record.Kind}:           true,
}

// Load decodes objects from what `kubectl get nodes,nodeclaims,nodepools,ec2nodeclasses
// -o yaml` prints (a List; add pods,poddisruptionbudgets -A for the gates), or from multi-document YAML or JSON of the objects. It returns
// the objects of the kinds the model reads, and the kinds it left out.
func Load(scheme *runtime.Scheme, r io.Reader) (objs []client.Object, ignored []string, err error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	seen := map[string]bool{}
	var add func(u *unstructured.Unstructured) error
	add = func(u *unstructured.Unstructured) error {
		if u.IsList() {
			return u.EachListItem(func(o runtime.Object) error { return add(o.(*unstructured.Unstructured)) })
		}
		gvk := u.GroupVersionKind()
		if gvk.Kind == "" {
			return fmt.Errorf("object %q has no kind", u.GetName())
		}
		typed, err := scheme.New(gvk)
		if err != nil || !modelKinds[gvk.GroupKind()] {
			if !seen[gvk.String()] {
				seen[gvk.String()] = true
				ignored = append(ignored, gvk.String())
			}
			return nil
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, typed); err != nil {
			return fmt.Errorf("decoding %s %s: %w", gvk.Kind, u.GetName(), err)
		}
		objs = append(objs, typed.(client.Object))
		return nil
	}
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, ignored, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("decoding cluster objects: %w", err)
		}
		if len(u.Object) == 0 {
			continue // an empty document
		}
		if err := add(u); err != nil {
			return nil, nil, err
		}
	}
}
