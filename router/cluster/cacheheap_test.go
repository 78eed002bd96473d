package cluster_test

import (
	"testing"
	"time"

	"github.com/health-router/health-router/test/bench/realistic"
)

// cacheBudget is what the cache may hold per node (Node + NodeClaim, indexed) at 100,000
// nodes: issue 16's 2 KiB, so that they fit in 200 MiB. shortBudget is the bound at 10,000
// (-short): there the instance-ID buckets hold 2 or 3 objects, not 25, and cost more per node.
const (
	cacheBudget = 2048
	shortBudget = 2304
)

// TestCacheHeapPerNode weighs the router's cache as the live bench does (realistic objects
// decoded from JSON as a watch does, through the cache transforms, in client-go indexers with
// the router's indexes), at 100,000 nodes (10,000 with -short), without servers.
func TestCacheHeapPerNode(t *testing.T) {
	n, budget := 100_000, cacheBudget
	if testing.Short() {
		n, budget = 10_000, shortBudget
	}
	perNode, err := realistic.CacheHeap(n, true, nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes: %.2f KiB per node (%.0f MiB in all)", n, perNode/1024, perNode*float64(n)/(1<<20))
	if perNode > float64(budget) {
		t.Errorf("the cache holds %.0f bytes per node, over the budget of %d", perNode, budget)
	}
}
