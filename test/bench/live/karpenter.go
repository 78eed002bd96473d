package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// karpenter is Karpenter as the bench plays it for a paced pool, the same in the bare loop's
// run and the router's: a NodeClaim that starts deleting gets a replacement at once (the pool
// keeps its size, so a percentage limit keeps its value), is drained in delay, then its
// finalizer goes. Its requests are counted apart from the router's and the bare loop's.
type karpenter struct {
	kube     client.Client
	reqs     *requests
	delay    time.Duration
	base     int // index of the first replacement (realistic.ClaimName)
	replaced atomic.Int64
	wg       sync.WaitGroup
}

func newKarpenter(cfg *rest.Config, delay time.Duration, base int) (*karpenter, error) {
	k := &karpenter{reqs: newRequests(), delay: delay, base: base}
	var err error
	if k.kube, err = limited(k.reqs.config(cfg), float64(cfg.QPS), cfg.Burst); err != nil {
		return nil, err
	}
	return k, nil
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
