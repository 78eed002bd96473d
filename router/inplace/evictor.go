package inplace

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/nodedrain"
)

// Evictor evicts the pods of a Node: one bounded round, ending by deadline. It returns how
// many pods are left to evict and, for each a PodDisruptionBudget refused ("namespace/pod"),
// the API server's explanation.
type Evictor interface {
	Evict(ctx context.Context, node string, deadline time.Time) (remaining int, refused map[string]string, err error)
}

// minRound is the shortest eviction round the drain evictor runs, even with its deadline
// passed: long enough for the helper to ask once and see an evicted pod gone.
const minRound = 2 * time.Second

// drainEvictor is the Evictor of the router: router/nodedrain's EvictRound, kubectl's drain
// helper with budgets respected and evictions only (DaemonSet and mirror pods stay).
type drainEvictor struct {
	cs       kubernetes.Interface
	log      *slog.Logger
	clock    clock.PassiveClock
	maxRound time.Duration
}

// DrainOption configures NewDrainEvictor.
type DrainOption func(*drainEvictor)

// WithClock sets the clock a round's deadline is read against (the Runner's: a test with a
// fake clock passes the same one). The default is the real clock.
func WithClock(c clock.PassiveClock) DrainOption { return func(e *drainEvictor) { e.clock = c } }

// WithMaxRound bounds every round, whatever its deadline.
func WithMaxRound(d time.Duration) DrainOption { return func(e *drainEvictor) { e.maxRound = d } }

// NewDrainEvictor returns the Evictor that evicts through the Eviction API with cs.
func NewDrainEvictor(cs kubernetes.Interface, log *slog.Logger, opts ...DrainOption) Evictor {
	e := &drainEvictor{cs: cs, log: log, clock: clock.RealClock{}}
	for _, o := range opts {
		o(e)
	}
	return e
}

func (e *drainEvictor) Evict(ctx context.Context, node string, deadline time.Time) (int, map[string]string, error) {
	timeout := deadline.Sub(e.clock.Now())
	if e.maxRound > 0 {
		timeout = min(timeout, e.maxRound)
	}
	round, err := nodedrain.EvictRound(ctx, e.cs, node, max(timeout, minRound), e.log.With("node", node))
	return len(round.Left), round.Refused, err
}
