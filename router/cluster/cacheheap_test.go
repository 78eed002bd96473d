package cluster_test

import (
	"testing"
	"time"

	"github.com/health-router/health-router/test/bench/realistic"
)

// cacheBudget is what the cache may hold per node (Node + NodeClaim, indexed): issue 16's
// 2 KiB, so that 100,000 nodes fit in 200 MiB.
const cacheBudget = 2048

// TestCacheHeapPerNode weighs the router's cache as the live bench does (realistic objects
// decoded from JSON as a watch does, through the cache transforms, in client-go indexers with
// the router's indexes), at 100,000 nodes (10,000 with -short), without servers.
func TestCacheHeapPerNode(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	perNode, err := realistic.CacheHeap(n, true, nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes: %.2f KiB per node (%.0f MiB in all)", n, perNode/1024, perNode*float64(n)/(1<<20))
	if perNode > cacheBudget {
		t.Errorf("the cache holds %.0f bytes per node, over the budget of %d", perNode, cacheBudget)
	}
}
