package signal

import (
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/flowcontrol"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// DefaultInstanceEventsPerSecond is how many instances a second get their decision Events
// (on the Node and the NodeClaim), after a burst of 50, before the rest are summed up per
// pool. A burst of 1,000 Spot warnings otherwise writes 2,000 Events into the API server
// while Karpenter launches 1,000 replacements through it: the burst bench measured the Events
// at two thirds of the router's requests, the API server at more than a core, and p99 from
// send to outcome at 1.3 s unbounded, 1.4 s at 20 a second and 0.6 s at 5 (forward mode).
// An event naming many instances is summed up per pool anyway (Signaller.Summary); Karpenter
// rate-limits its own high-volume Events the same way.
const DefaultInstanceEventsPerSecond = 5

// SummaryInterval is how often the instances whose Events were held back are told, one
// Event per pool and reason.
const SummaryInterval = 30 * time.Second

// eventBudget lets per-instance Events through a token bucket (a burst of ten seconds' worth)
// and counts the rest per NodePool and reason until Summarise tells them. Nothing is lost
// that a decision rests on: each instance's record stays on its NodeClaim.
type eventBudget struct {
	limiter flowcontrol.RateLimiter
	perSec  float64
	mu      sync.Mutex
	held    map[heldKey]*heldEvents
	onHeld  func(reason string)
}

type heldKey struct{ pool, reason string }

type heldEvents struct {
	n       int
	warning bool
	since   time.Time
	example string // one instance's Event message
	pool    *karpv1.NodePool
}

// SetInstanceEventRate bounds the per-instance decision Events to perSecond instances a
// second, with a burst of ten seconds' worth; 0 lifts the bound. onHeld (may be nil) counts
// each instance whose Events were held back, by reason.
func (s *Signaller) SetInstanceEventRate(perSecond float64, onHeld func(reason string)) {
	if perSecond <= 0 {
		s.budget = nil
		return
	}
	burst := max(int(perSecond*10), 1)
	s.budget = &eventBudget{limiter: flowcontrol.NewTokenBucketRateLimiterWithClock(float32(perSecond), burst, s.clock),
		perSec: perSecond, held: map[heldKey]*heldEvents{}, onHeld: onHeld}
}

// allow takes a token for one instance's Events, or holds them back and counts them.
func (b *eventBudget) allow(res cluster.Resolved, typ, reason, message string, now time.Time) bool {
	if b == nil || res.NodePool == nil || b.limiter.TryAccept() {
		// A node of no NodePool (one Karpenter does not manage) is told of on its own: its
		// Events held back would have no pool to be summed up on, and such nodes are few.
		return true
	}
	b.mu.Lock()
	k := heldKey{res.PoolName(), reason}
	h := b.held[k]
	if h == nil {
		h = &heldEvents{since: now, example: message}
		b.held[k] = h
	}
	h.n++
	h.warning = h.warning || typ == corev1.EventTypeWarning
	if res.NodePool != nil {
		h.pool = res.NodePool
	}
	b.mu.Unlock()
	if b.onHeld != nil {
		b.onHeld(reason)
	}
	return false
}

// Summarise posts one Event per NodePool and reason for the instances whose Events were held
// back since the last call, and forgets them; it returns how many instances it told of. The
// router calls it every SummaryInterval.
func (s *Signaller) Summarise() int {
	b := s.budget
	if b == nil {
		return 0
	}
	b.mu.Lock()
	held := b.held
	b.held = map[heldKey]*heldEvents{}
	b.mu.Unlock()
	keys := make([]heldKey, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].pool < keys[j].pool || (keys[i].pool == keys[j].pool && keys[i].reason < keys[j].reason)
	})
	told := 0
	for _, k := range keys {
		h := held[k]
		told += h.n
		if h.pool == nil {
			continue // no NodePool to post on: the count is in the metric
		}
		typ := corev1.EventTypeNormal
		if h.warning {
			typ = corev1.EventTypeWarning
		}
		s.recorder.Eventf(h.pool, nil, typ, k.reason, actions[k.reason],
			"%d more instances of this pool since %s, their Events held back (over %g instances a second; each instance's record is on its NodeClaim); for example: %s",
			h.n, h.since.UTC().Format(time.RFC3339), b.perSec, h.example)
	}
	return told
}

// HeldEvents is how many instances' Events wait for the next Summarise (for tests and the
// simulation).
func (s *Signaller) HeldEvents() int {
	b := s.budget
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, h := range b.held {
		n += h.n
	}
	return n
}
