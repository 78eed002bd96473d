package realistic

import (
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/deferral"
)

// CacheHeap stores n realistic Nodes and NodeClaims in client-go indexers with the router's
// indexes, each decoded from JSON as an informer decodes what the API server sends
// (managedFields as given: the live bench copies those an API server wrote), through the
// router's cache transforms or not, and returns the heap they hold per node (Node +
// NodeClaim). It reads the heap after a GC before and after: run it alone.
func CacheHeap(n int, trimmed bool, nodeFields, claimFields []metav1.ManagedFieldsEntry, now time.Time) (perNode float64, err error) {
	nodes := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, indexers(&corev1.Node{}))
	claims := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, indexers(&karpv1.NodeClaim{}))
	trim := cluster.NewTrimmer()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < n; i++ {
		node := Node(i, "default", now)
		node.ManagedFields = nodeFields
		claim := NodeClaim(i, "default", "6c0ad1b1-5d53-4f0e-9a57-1d2c3b4a5f60", AMI, now)
		claim.ManagedFields = claimFields
		claim.UID, node.UID = types.UID(fmt.Sprintf("d7c9e1a0-0000-4000-8000-%012d", i)), types.UID(fmt.Sprintf("a1b2c3d4-0000-4000-8000-%012d", i))
		claim.ResourceVersion, node.ResourceVersion = fmt.Sprint(1000000+2*i), fmt.Sprint(1000001+2*i)
		var dn corev1.Node
		var dc karpv1.NodeClaim
		if err := roundTrip(node, &dn); err != nil {
			return 0, err
		}
		if err := roundTrip(claim, &dc); err != nil {
			return 0, err
		}
		var on, oc any = &dn, &dc
		if trimmed {
			if on, err = trim.Node(on); err != nil {
				return 0, err
			}
			if oc, err = trim.NodeClaim(oc); err != nil {
				return 0, err
			}
		}
		if err := nodes.Add(on); err != nil {
			return 0, err
		}
		if err := claims.Add(oc); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(nodes)
	runtime.KeepAlive(claims)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n), nil
}

// roundTrip decodes obj's JSON into out: every string its own allocation, as after a watch.
func roundTrip(obj, out any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// indexers are the field indexes the router registers on its cache, as controller-runtime
// stores them ("field:<name>" over "__all_namespaces/<value>").
func indexers(obj client.Object) toolscache.Indexers {
	ix := toolscache.Indexers{}
	add := func(field string, extract func(client.Object) []string) {
		ix["field:"+field] = func(o any) ([]string, error) {
			co, ok := o.(client.Object)
			if !ok {
				return nil, nil
			}
			var out []string
			for _, v := range extract(co) {
				out = append(out, "__all_namespaces/"+v)
			}
			return out, nil
		}
	}
	for _, x := range cluster.Indexes() {
		if fmt.Sprintf("%T", x.Object) == fmt.Sprintf("%T", obj) {
			add(x.Field, x.Extract)
		}
	}
	if _, ok := obj.(*karpv1.NodeClaim); ok {
		add(deferral.IndexHeldOn, deferral.HeldOn)
	}
	return ix
}
