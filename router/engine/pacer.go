package engine

import (
	"context"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
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
	// reported are the instances EC2's last instance-status answer showed impaired
	// (ReportImpaired), decided or not: the repair cut-off counts them. Guarded by mu.
	reported map[string]bool
}

type poolPace struct {
	mu       sync.Mutex
	read     time.Time       // when members was read; zero: read again
	members  map[string]bool // NodeClaim name -> draining, as the cluster showed it
	impaired map[string]bool // NodeClaims held or drained as impaired, as the cluster showed it
	// instances are the pool's NodeClaims' instances (NodeClaim name -> instance ID), to count
	// the ones EC2 reports impaired.
	instances map[string]string
	// reserved are the drains decided here that members may not show yet, with when: a
	// reservation the cluster never shows (a forward Karpenter dropped, whose stamp failed)
	// is given back after reservationBound.
	reserved map[string]time.Time
	// holds counts the decisions holding each reservation: a NodeClaim decided twice (its
	// drain signalled, then a second event of it decided and given back) keeps its slot until
	// the last is given back or the cluster shows the drain.
	holds   map[string]int
	repairs map[string]bool // reserved keys that are impaired-instance repairs
	// urgent are the pool's urgent drains decided here within policy.UrgentWindow, by
	// NodeClaim, for the urgent-drain breaker. Kept in memory (the leader alone decides): a
	// restarted or newly elected router starts counting afresh, which lets at most one more
	// breaker's worth through.
	urgent map[string]time.Time
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

// reservationBound is how long a drain decided here counts without the cluster showing it:
// longer than a signal takes to show (a write, the cache's watch), shorter than a pacing
// recheck, so that a slot is never held for good by a drain that did not land.
const reservationBound = 2 * time.Minute

func newPacer(model *cluster.Model) *pacer {
	return &pacer{model: model, pools: map[string]*poolPace{}}
}

func (p *pacer) pool(name string) *poolPace {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.pools[name]
	if pp == nil {
		pp = &poolPace{reserved: map[string]time.Time{}, holds: map[string]int{}, repairs: map[string]bool{}, settles: map[string]*settle{}, urgent: map[string]time.Time{}}
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
	claims, err := p.model.PoolClaims(ctx, pool)
	if err != nil {
		return err
	}
	mems, err := p.model.PoolMemories(ctx, pool)
	if err != nil {
		return err
	}
	members := make(map[string]bool, len(claims))
	impaired := map[string]bool{}
	instances := make(map[string]string, len(claims))
	for _, nc := range claims {
		instances[nc.Name] = cluster.InstanceID(nc.Status.ProviderID)
		// A node kept through a reboot (a run in progress) is out of service as a drained one is.
		mem := mems[nc.Name]
		members[nc.Name] = !nc.DeletionTimestamp.IsZero() || mem.OutOfService()
		if Impaired(mem) {
			impaired[nc.Name] = true
		}
	}
	pp.members, pp.impaired, pp.instances, pp.read = members, impaired, instances, now
	for key, at := range pp.reserved {
		if draining, present := members[key]; draining || !present || now.Sub(at) > reservationBound {
			delete(pp.reserved, key)
			delete(pp.holds, key)
			delete(pp.repairs, key)
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
	if !now.Before(st.gone.Add(policy.SettleReadyBound)) {
		// An owner whose pods never come back (a Job that completed, a ReplicaSet scaled to
		// zero by a rollout, a deleted owner) must not hold the pool's slot for ever.
		return true
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
		if _, reserved := pp.reserved[name]; draining && name != key && !reserved {
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

// impairedOthers counts the pool's nodes impaired, leaving out key: held or replaced as
// impaired as the cluster shows them, the repairs reserved here, and every other node whose
// instance EC2 reports impaired now (reported), decided or not: an impairment that reaches a
// pool over several polls is counted whole, as Karpenter's node repair counts every unhealthy
// node. The caller holds pp.mu.
func (pp *poolPace) impairedOthers(key string, reported map[string]bool) int {
	n := 0
	for name := range pp.members {
		if name != key && (pp.impaired[name] || pp.repairs[name] || reported[pp.instances[name]]) {
			n++
		}
	}
	for name := range pp.repairs {
		if _, member := pp.members[name]; !member && name != key {
			n++ // reserved here, not shown by the cluster yet
		}
	}
	return n
}

// reportImpaired sets the instances EC2 reports impaired now.
func (p *pacer) reportImpaired(ids []string) {
	r := make(map[string]bool, len(ids))
	for _, id := range ids {
		r[id] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reported = r
}

func (p *pacer) reportedImpaired() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reported
}

// Impaired reports whether the router holds or drains a NodeClaim (its memory) as an impaired
// instance: an active instance-status record, or a drain signalled for an impaired finding.
func Impaired(mem record.Memory) bool {
	if mem.Drain != nil {
		return event.ImpairedFindingID(mem.Drain.EventID)
	}
	for _, r := range mem.Records {
		if r.Active() && r.Kind == event.KindInstanceStatus {
			return true
		}
	}
	return false
}

// poolView is what a pacing decision reads of its pool.
type poolView struct {
	Nodes, InFlight, Impaired int
	// Urgent counts the pool's other urgent drains within policy.UrgentWindow.
	Urgent int
}

// drainKind is what a drain decided under the pool's lock counts as.
type drainKind int

const (
	drainPaced  drainKind = iota
	drainRepair           // an impaired-instance repair: counted for the repair cut-off
	drainUrgent           // an urgent drain: counted for the urgent-drain breaker
)

// urgentOthers counts the pool's urgent drains within policy.UrgentWindow of now, other than
// key's, and forgets the older ones. The caller holds pp.mu.
func (pp *poolPace) urgentOthers(key string, now time.Time) int {
	n := 0
	for k, at := range pp.urgent {
		switch {
		case now.Sub(at) >= policy.UrgentWindow:
			delete(pp.urgent, k)
		case k != key:
			n++
		}
	}
	return n
}

// decide runs decide with the pool's size and drains in flight, under the pool's lock, and
// reserves a slot for key (a NodeClaim name; "" reserves nothing) when decide drains. It
// reports whether it reserved.
func (p *pacer) decide(ctx context.Context, pool, key string, kind drainKind, now time.Time, decide func(poolView) bool) (bool, error) {
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
	if !decide(poolView{Nodes: nodes, InFlight: pp.inFlight(key), Impaired: pp.impairedOthers(key, p.reportedImpaired()), Urgent: pp.urgentOthers(key, now)}) || key == "" {
		return false, nil
	}
	pp.reserved[key] = now
	pp.holds[key]++
	switch kind {
	case drainRepair:
		pp.repairs[key] = true
	case drainUrgent:
		pp.urgent[key] = now
	}
	return true, nil
}

// take counts a drain decided outside the limit (an urgent one) as in flight from now.
func (p *pacer) take(pool, key string, now time.Time) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	pp.reserved[key] = now
	pp.holds[key]++
}

// unreserve gives a reserved slot back: the drain was not signalled after all.
func (p *pacer) unreserve(pool, key string) {
	pp := p.pool(pool)
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.holds[key] > 1 {
		pp.holds[key]-- // another decision of the NodeClaim holds it: its drain may be signalled
		return
	}
	delete(pp.holds, key)
	delete(pp.reserved, key)
	delete(pp.repairs, key)
	delete(pp.settles, key)
	// pp.urgent keeps key: an earlier urgent drain of the same NodeClaim may have been
	// signalled (a second urgent event of a node drained already is decided and given back),
	// and forgetting it would let one more node through the breaker. An urgent drain decided
	// and not signalled is counted for the rest of its minute: the breaker errs on the side of
	// holding.
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
