package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// karpenter is Karpenter as the bench plays it for a paced pool, the same in the bare loop's
// run and the router's: like Karpenter it watches every NodeClaim through an informer of
// whole objects (a custom resource comes as JSON, so the API server encodes each change for
// Karpenter as it does for the router: in a cluster the router's watch shares that encoding);
// a NodeClaim of its pool that starts deleting gets a replacement at once (the pool keeps its
// size, so a percentage limit keeps its value), is drained in delay, then its finalizer goes.
// Its requests are counted apart from the router's and the bare loop's.
type karpenter struct {
	kube     client.Client
	cfg      *rest.Config
	reqs     *requests
	delay    time.Duration
	base     int // index of the first replacement (realistic.ClaimName)
	replaced atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	seen     map[string]bool // NodeClaims whose deletion it acted on
}

func newKarpenter(cfg *rest.Config, delay time.Duration, base int) (*karpenter, error) {
	k := &karpenter{reqs: newRequests(), delay: delay, base: base, seen: map[string]bool{}}
	k.cfg = k.reqs.config(cfg)
	var err error
	if k.kube, err = limited(k.cfg, float64(cfg.QPS), cfg.Burst); err != nil {
		return nil, err
	}
	return k, nil
}

// watch starts Karpenter's NodeClaim informer until ctx is done, and waits for its sync;
// onDeleting is called once for each NodeClaim of pool seen deleting.
func (k *karpenter) watch(ctx context.Context, pool string, onDeleting func(name string)) error {
	s, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	c, err := crcache.New(k.cfg, crcache.Options{Scheme: s})
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, &karpv1.NodeClaim{})
	if err != nil {
		return err
	}
	seen := func(obj any) {
		nc, ok := obj.(*karpv1.NodeClaim)
		if !ok || nc.DeletionTimestamp.IsZero() || nc.Labels[karpv1.NodePoolLabelKey] != pool {
			return
		}
		k.mu.Lock()
		first := !k.seen[nc.Name]
		k.seen[nc.Name] = true
		k.mu.Unlock()
		if first {
			onDeleting(nc.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		return err
	}
	_, err = startCache(ctx, c, "karpenter's (played) NodeClaim informer") // ends with ctx
	return err
}

// drain plays the drain of the NodeClaim name of pool; done, when set, is called once it is
// gone.
func (k *karpenter) drain(ctx context.Context, name, pool string, uid types.UID, now time.Time, done func()) {
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		i := k.base + int(k.replaced.Add(1))
		if err := createOne(ctx, k.kube, i, func(int) (string, types.UID) { return pool, uid }, false, now); err != nil && ctx.Err() == nil {
			progress("karpenter (played): replacing %s: %v", name, err)
		}
		time.Sleep(k.delay)
		nc := &karpv1.NodeClaim{}
		nc.Name = name
		_ = k.kube.Patch(ctx, nc, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		if done != nil {
			done()
		}
	}()
}

// replacements is the index range [base, base+n] of the replacements made so far.
func (k *karpenter) replacements() (from, to int) {
	return k.base + 1, k.base + int(k.replaced.Load()) + 1
}

// requests is what it asked of the API server so far.
func (k *karpenter) requests() int {
	_, total, _ := since(k.reqs.snapshot(), nil)
	return total
}
