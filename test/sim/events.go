package sim

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// instanceEventsPerSecond is the replicas' --instance-events-per-second: low (a burst of one,
// six instances a tick), so that the runs hold Events back and tell them in summaries.
const instanceEventsPerSecond = 0.01

// summaryRecorder is the Event sink of the simulated API server: it keeps the count of
// instances the summaries on NodePools told of (signal.Summarise's "%d more instances of this
// pool"), and drops the rest, as a FakeRecorder without a channel does.
type summaryRecorder struct {
	mu   sync.Mutex
	told int
}

func (r *summaryRecorder) Eventf(regarding, _ runtime.Object, _, _, _, note string, args ...any) {
	if _, ok := regarding.(*karpv1.NodePool); !ok || !strings.HasPrefix(note, "%d more instances of this pool") || len(args) == 0 {
		return
	}
	if n, ok := args[0].(int); ok {
		r.mu.Lock()
		r.told += n
		r.mu.Unlock()
	}
}

func (r *summaryRecorder) summarised() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.told
}

// summarise is the router's summary loop (every signal.SummaryInterval, and at a graceful
// stop) on one replica.
func (w *world) summarise(r *replica) {
	n := r.sig.Summarise()
	r.told += n
	w.told += n
}

// checkEvents: no instance's Events are lost. Every instance a replica held back is told in a
// summary or still waits for the next (its count never runs ahead or behind), and every
// summary told reached a NodePool (every simulated node has its pool).
func (w *world) checkEvents() error {
	for _, r := range []*replica{w.leader, w.standby} {
		r.mu.Lock()
		held := r.held
		r.mu.Unlock()
		if pending := r.sig.HeldEvents(); held != r.told+pending {
			return fmt.Errorf("replica %s held back the Events of %d instances, told %d and has %d pending", r.name, held, r.told, pending)
		}
	}
	if got := w.recorder.summarised(); got != w.told {
		return fmt.Errorf("summaries on NodePools told of %d instances, the replicas told %d", got, w.told)
	}
	return nil
}
