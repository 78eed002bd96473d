package engine

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
)

// poolStateTTL is how long a pool's state read from the cluster answers for pacing. Reading it
// lists the pool's NodeClaims (thousands in a large pool): once per TTL, not once per instance
// of a bulk event. Drains decided here in the meantime are counted through reservations, and
// a finished drain invalidates the state at once, so the TTL only delays seeing drains that
// others (Karpenter's consolidation) start.
const poolStateTTL = time.Second

// pacer counts each NodePool's drains in flight: those the cluster shows (NodeClaims deleted
// or signalled) and those this process decided that the cluster does not show yet
// (reservations). Deciding and reserving happen under the pool's lock, so instances decided
// in parallel never exceed the pool's max-concurrent-drains.
type pacer struct {
	model *cluster.Model
	pods  client.Reader // the pods of a node, for drain-settle "ready"; nil: not read
	mu    sync.Mutex
	pools map[string]*poolPace
}

type poolPace struct {
	mu       sync.Mutex
	read     time.Time       // when members was read; zero: read again
	members  map[string]bool // NodeClaim name -> draining, as the cluster showed it
	reserved map[string]bool // keys of drains decided here that members may not show yet
	// settles are the drains of a pool with drain-settle, by NodeClaim: noted when decided,
	// settling once the NodeClaim is gone, and counted in flight until settled. Kept in
	// memory: after a restart a settling drain is no longer counted.
	settles map[string]*settle
}

// settle is one drain's drain-settle: how it settles, and since when its NodeClaim is gone.
type settle struct {
	policy policy.Settle
	node   string
	owners []gates.Owner
	gone   time.Time // zero while the NodeClaim exists
}

func newPacer(model *cluster.Model) *pacer {
	return &pacer{model: model, pools: map[string]*poolPace{}}
}

func (p *pacer) pool(name string) *poolPace {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pools[name]
	if pp == nil {
		pp = &poolPace{reserved: map[string]bool{}, settles: map[string]*settle{}}
		p.pools[name] = pp
	}
	return pp
}

// refresh reads the pool's members when the last read is older than poolStateTTL, and drops
// the reservations the cluster now shows (draining, or gone). The caller holds pp.mu.
func (p *pacer) refresh(ctx context.Context, pool string, pp *poolPace, now time.Time) error {
	if !pp.read.IsZero() && now.Sub(pp.read) < poolStateTTL && !now.Before(pp.read) {
		return nil
	}
	members, err := p.model.PoolMembers(ctx, pool)
	if err != nil {
		return err
	}
	pp.members, pp.read = members, now
	for key := range pp.reserved {
		if draining, present := members[key]; draining || !present {
			delete(pp.reserved, key)
		}
	}
	for key, st := range pp.settles {
		if _, present := members[key]; present || st.gone.IsZero() {
			continue // still draining: counted as a member
		}
		if p.settled(ctx, st, now) {
			delete(pp.settles, key)
		}
	}
	return nil
}

// settled reports whether a gone drain has settled: its settle time has passed, or (ready)
// every pod of the owners it evicted is Ready again elsewhere. A read that fails is not
// settled: it is asked again at the next read of the pool.
func (p *pacer) settled(ctx context.Context, st *settle, now time.Time) bool {
	if !st.policy.Ready {
		return !now.Before(st.gone.Add(st.policy.Duration))
	}
	if p.pods == nil {
		return true
	}
	ok, _, err := gates.Settled(ctx, p.pods, st.owners, st.node)
	return err == nil && ok
}

// inFlight counts the pool's drains in flight, leaving out key itself: draining, reserved,
// and gone but not settled (drain-settle). The caller holds pp.mu.
func (pp *poolPace) inFlight(key string) int {
	n := 0
	for name, st := range pp.settles {
		if _, member := pp.members[name]; !member && !st.gone.IsZero() && name != key {
			n++
		}
	}
	for name, draining := range pp.members {
		if draining && name != key && !pp.reserved[name] {
			n++
		}
	}
	for k := range pp.reserved {
		if k != key {
			n++
		}
	}
	return n
}

// decide runs decide with the pool's size and drains in flight, under the pool's lock, and
// reserves a slot for key (a NodeClaim name; "" reserves nothing) when decide drains. It
// reports whether it reserved.
func (p *pacer) decide(ctx context.Context, pool, key string, now time.Time, decide func(nodes, inFlight int) bool) (bool, error) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if err := p.refresh(ctx, pool, pp, now); err != nil {
		return false, err
	}
	nodes := len(pp.members)
	if _, member := pp.members[key]; !member {
		nodes++ // a NodeClaim the cache does not show yet still counts towards the pool's size
	}
	if !decide(nodes, pp.inFlight(key)) || key == "" {
		return false, nil
	}
	pp.reserved[key] = true
	return true, nil
}

// unreserve gives a reserved slot back: the drain was not signalled after all.
func (p *pacer) unreserve(pool, key string) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	delete(pp.reserved, key)
	delete(pp.settles, key)
}

// noteSettle remembers how a drain decided in pool settles.
func (p *pacer) noteSettle(pool, key string, st *settle) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.settles[key] = st
}

// finished makes the next decision in pool read the cluster again (a drain finished: its
// NodeClaim is gone); a drain with drain-settle starts settling.
func (p *pacer) finished(pool, key string, now time.Time) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.read = time.Time{}
	if st := pp.settles[key]; st != nil && st.gone.IsZero() {
		st.gone = now
	}
}

// free returns how many more drains the pool's limit allows now.
func (p *pacer) free(ctx context.Context, pool string, now time.Time, limit func(nodes int) (int, bool)) (int, error) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if err := p.refresh(ctx, pool, pp, now); err != nil {
		return 0, err
	}
	n, limited := limit(len(pp.members))
	if !limited {
		return len(pp.members), nil
	}
	return max(n-pp.inFlight(""), 0), nil
}
