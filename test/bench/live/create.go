package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/test/bench/realistic"
)

// create makes objects i in [from, to) with workers in parallel: the Node as the kubelet
// registers it, Karpenter's label patch, the NodeClaim and its status.
func createNodes(ctx context.Context, c client.Client, from, to, workers int, pool func(int) (string, types.UID), withNode bool, now time.Time) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := createOne(ctx, c, i, pool, withNode, now); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func createOne(ctx context.Context, c client.Client, i int, pool func(int) (string, types.UID), withNode bool, now time.Time) error {
	name, uid := pool(i)
	spot := spotPool(name)
	if withNode {
		n := realistic.Node(i, name, now)
		if spot {
			n.Labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeSpot
		}
		if err := c.Create(ctx, n, client.FieldOwner("kubelet")); err != nil {
			return fmt.Errorf("creating node %d: %w", i, err)
		}
		patch := []byte(`{"metadata":{"labels":{"karpenter.sh/registered":"true","karpenter.sh/initialized":"true"}}}`)
		if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch), client.FieldOwner("karpenter")); err != nil {
			return fmt.Errorf("labelling node %d: %w", i, err)
		}
	}
	nc := realistic.NodeClaim(i, name, uid, amiAMD64, now)
	if spot {
		nc.Labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeSpot
	}
	st := nc.Status
	if err := c.Create(ctx, nc, client.FieldOwner("karpenter")); err != nil {
		return fmt.Errorf("creating nodeclaim %d: %w", i, err)
	}
	nc.Status = st
	if err := c.Status().Update(ctx, nc, client.FieldOwner("karpenter")); err != nil {
		return fmt.Errorf("nodeclaim %d status: %w", i, err)
	}
	return nil
}

// spotPool reports whether the bench's pool is a Spot pool, whose nodes are all spot: the
// pools the Spot interruption warnings are sent to (the live bench's Spot pool, the burst's
// drain pools). The router trusts a Spot warning only for a spot NodeClaim: realistic objects
// alternate on-demand and spot, and half the burst's warnings were rightly implausible.
func spotPool(name string) bool { return name == poolSpot || strings.HasPrefix(name, burstDrainPool) }

// amiAMD64 is replaced by the image moto registers (the AMI check asks EC2 for its state).
var amiAMD64 = realistic.AMI
