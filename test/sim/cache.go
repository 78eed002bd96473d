package sim

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// lagCache is the router's informer cache in the simulation. Reads of Nodes and NodeClaims
// are served as the live cache serves them: trimmed by the router's own cluster.Trimmer (no
// spec.unschedulable or status on Nodes, no status.nodeName on NodeClaims), and behind the
// router's own writes: a Node or NodeClaim the router wrote is read as it was before that
// write until the cache syncs (a drawn moment: before the next decision, or not), so that a
// decision and its action, two messages of one batch, or a release and a close, can each see
// the world before the other's write. Writes go to the API server at once. Readers that are
// the API server's own in the live router (the signaller's fresh reads, the pipeline's before
// a destructive action, the reboot in place's, the marks') read past it.
type lagCache struct {
	mu     sync.Mutex
	trim   *cluster.Trimmer
	before map[string]client.Object // kind/name -> the object before the unsynced writes; nil: it did not exist
	lagged int                      // reads served a stale copy, over the run
	// since is when the oldest unsynced write was made (zero: none), on clock.
	since time.Time
	clock clock.PassiveClock
}

// lagMax bounds the lag: an informer whose watch shows the router's own write a minute late is
// a broken one, and the router's in-memory notes of its decisions (the pacer's reservations
// last two minutes) are sized for a watch that works. A sync is drawn at every lag point; past
// lagMax it is not drawn, it happens.
const lagMax = time.Minute

// overdue reports whether the oldest unsynced write is lagMax old at now.
func (l *lagCache) overdue(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.before) > 0 && !now.Before(l.since.Add(lagMax))
}

func newLagCache(clk clock.PassiveClock) *lagCache {
	return &lagCache{trim: cluster.NewTrimmer(), before: map[string]client.Object{}, clock: clk}
}

func cacheKey(obj client.Object) (string, bool) {
	switch o := obj.(type) {
	case *karpv1.NodeClaim:
		return "NodeClaim/" + obj.GetName(), true
	case *corev1.Node:
		return "Node/" + obj.GetName(), true
	case *metav1.PartialObjectMetadata: // the signaller's metadata-only patches
		switch o.GroupVersionKind().Kind {
		case "NodeClaim":
			return "NodeClaim/" + obj.GetName(), true
		case "Node":
			return "Node/" + obj.GetName(), true
		}
	}
	return "", false
}

// typed returns an empty object of the kind a cache key names.
func typed(key string) client.Object {
	if key[:len("Node/")] == "Node/" {
		return &corev1.Node{}
	}
	return &karpv1.NodeClaim{}
}

// written notes a write of the router, before it reaches the API server: the object as the
// API server holds it now is what the cache keeps showing until it syncs.
func (l *lagCache) written(ctx context.Context, store client.Client, obj client.Object) {
	key, ok := cacheKey(obj)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.before[key]; ok {
		return // the first unsynced write's pre-image stands
	}
	if len(l.before) == 0 && l.clock != nil {
		l.since = l.clock.Now()
	}
	cur := typed(key)
	if err := store.Get(ctx, client.ObjectKey{Name: obj.GetName()}, cur); err != nil {
		l.before[key] = nil
		return
	}
	l.before[key] = cur
}

// sync is the informer catching up: every write is seen from now on.
func (l *lagCache) sync() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.before)
	l.since = time.Time{}
}

// staleReads is how many reads the cache served a stale copy for.
func (l *lagCache) staleReads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lagged
}

// pending is how many objects the cache shows behind the API server.
func (l *lagCache) pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.before)
}

// get serves a Get: the stale copy if there is one, and trimmed.
func (l *lagCache) get(ctx context.Context, store client.Client, key client.ObjectKey, obj client.Object) error {
	k, lags := cacheKey(obj)
	l.mu.Lock()
	pre, stale := l.before[k]
	if stale {
		l.lagged++
	}
	l.mu.Unlock()
	switch {
	case lags && stale && pre == nil:
		return apierrors.NewNotFound(schema.GroupResource{Resource: k}, key.Name)
	case lags && stale:
		copyInto(pre, obj)
	default:
		if err := store.Get(ctx, key, obj); err != nil {
			return err
		}
	}
	return l.trimmed(obj)
}

// list serves a List: stale copies in place of the objects written since the last sync (the
// store's own filter chose the items: labels and indexed fields the router never changes).
func (l *lagCache) list(ctx context.Context, store client.Client, list client.ObjectList, opts ...client.ListOption) error {
	if err := store.List(ctx, list, opts...); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch v := list.(type) {
	case *karpv1.NodeClaimList:
		items := v.Items[:0]
		for i := range v.Items {
			it := v.Items[i]
			if pre, ok := l.before["NodeClaim/"+it.Name]; ok {
				l.lagged++
				if pre == nil {
					continue // created since the last sync
				}
				it = *pre.(*karpv1.NodeClaim).DeepCopy()
			}
			if t, err := l.trim.NodeClaim(&it); err == nil {
				it = *t.(*karpv1.NodeClaim)
			}
			items = append(items, it)
		}
		v.Items = items
	case *corev1.NodeList:
		items := v.Items[:0]
		for i := range v.Items {
			it := v.Items[i]
			if pre, ok := l.before["Node/"+it.Name]; ok {
				l.lagged++
				if pre == nil {
					continue
				}
				it = *pre.(*corev1.Node).DeepCopy()
			}
			if t, err := l.trim.Node(&it); err == nil {
				it = *t.(*corev1.Node)
			}
			items = append(items, it)
		}
		v.Items = items
	}
	return nil
}

// trimmed applies the live cache's transform to obj in place.
func (l *lagCache) trimmed(obj client.Object) error {
	var out any
	var err error
	switch o := obj.(type) {
	case *karpv1.NodeClaim:
		out, err = l.trim.NodeClaim(o.DeepCopy())
	case *corev1.Node:
		out, err = l.trim.Node(o.DeepCopy())
	default:
		return nil
	}
	if err != nil {
		return err
	}
	copyInto(out.(client.Object), obj)
	return nil
}

func copyInto(from, to client.Object) {
	switch f := from.(type) {
	case *karpv1.NodeClaim:
		f.DeepCopyInto(to.(*karpv1.NodeClaim))
	case *corev1.Node:
		f.DeepCopyInto(to.(*corev1.Node))
	}
}
