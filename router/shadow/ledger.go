package shadow

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// LedgerKey is the ConfigMap key holding the ledger (JSON).
const LedgerKey = "ledger.json"

// DefaultLedgerName is the ConfigMap's name (in the router's namespace).
const DefaultLedgerName = "health-router-shadow"

// MaxEntries bounds the ledger: the newest are kept. 500 entries of about 500 bytes stay far
// under a ConfigMap's 1 MiB.
const MaxEntries = 500

// FlushInterval is how often the ledger's new entries are written: one write per interval,
// however many events a storm brings.
const FlushInterval = 2 * time.Second

// Entry is one would-be outcome, beside what Karpenter did with the same NodeClaim.
type Entry struct {
	NodePool  string     `json:"nodepool"`
	NodeClaim string     `json:"nodeclaim,omitempty"`
	Node      string     `json:"node,omitempty"`
	Instance  string     `json:"instance"`
	Kind      event.Kind `json:"kind"`
	EventID   string     `json:"event_id"`
	// Start is when AWS acts (the event's deadline or start); zero when it does not say.
	Start time.Time `json:"start,omitzero"`

	Decided time.Time     `json:"decided"`
	Would   policy.Action `json:"would"`
	WouldAt time.Time     `json:"would_at"`
	Hold    policy.Hold   `json:"hold,omitempty"`
	Reason  string        `json:"reason"`

	// KarpenterAt is when the NodeClaim began deleting (Karpenter's own handling drained it);
	// zero while it has not.
	KarpenterAt time.Time `json:"karpenter_at,omitzero"`
}

type ledgerValue struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// Ledger keeps the would-be outcomes of shadow pools, and when Karpenter drained each
// NodeClaim, in a ConfigMap: it outlives the NodeClaims, which Karpenter deletes. Additions
// are gathered in memory and written once per FlushInterval by the leader (Start), merged
// into what is there under its resource version: an old leader still flushing beside a new
// one loses neither's entries.
type Ledger struct {
	kube      client.Client
	namespace string
	name      string
	clock     clock.WithTicker
	log       *slog.Logger

	mu      sync.Mutex
	pending []Entry
	acted   map[string]time.Time // NodeClaim -> when it began deleting
}

// NewLedger returns the ledger in the ConfigMap namespace/name.
func NewLedger(kube client.Client, namespace, name string, clk clock.WithTicker, log *slog.Logger) *Ledger {
	return &Ledger{kube: kube, namespace: namespace, name: name, clock: clk, log: log, acted: map[string]time.Time{}}
}

// Add notes an entry, written at the next flush.
func (l *Ledger) Add(e Entry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, e)
}

// KarpenterActed notes that the NodeClaim began deleting at at.
func (l *Ledger) KarpenterActed(nodeClaim string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.acted[nodeClaim]; !ok || at.Before(cur) {
		l.acted[nodeClaim] = at.UTC()
	}
}

// NeedLeaderElection: only the leader writes the ledger.
func (l *Ledger) NeedLeaderElection() bool { return true }

// Start flushes every FlushInterval until ctx ends, and once more then.
func (l *Ledger) Start(ctx context.Context) error {
	t := l.clock.NewTicker(FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := l.Flush(fctx); err != nil {
				l.log.Warn("shadow ledger: last flush failed", "error", err)
			}
			return nil
		case <-t.C():
			if err := l.Flush(ctx); err != nil {
				l.log.Warn("shadow ledger: flush failed; retried at the next", "error", err)
			}
		}
	}
}

// Flush writes what was noted since the last flush. On failure the notes are kept for the next.
func (l *Ledger) Flush(ctx context.Context) error {
	l.mu.Lock()
	pending, acted := l.pending, l.acted
	l.pending, l.acted = nil, map[string]time.Time{}
	l.mu.Unlock()
	if len(pending) == 0 && len(acted) == 0 {
		return nil
	}
	var unmatched map[string]time.Time
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		err := l.kube.Get(ctx, client.ObjectKey{Namespace: l.namespace, Name: l.name}, cm)
		create := apierrors.IsNotFound(err)
		if err != nil && !create {
			return err
		}
		var entries []Entry
		if !create {
			if entries, err = decodeLedger(cm.Data[LedgerKey]); err != nil {
				return err
			}
		}
		entries, unmatched = merge(entries, pending, acted)
		raw, err := json.Marshal(ledgerValue{Version: Version, Entries: entries})
		if err != nil {
			return err
		}
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: l.namespace, Name: l.name,
				Labels: map[string]string{"app.kubernetes.io/name": "health-router", "app.kubernetes.io/component": "shadow-ledger"}},
				Data: map[string]string{LedgerKey: string(raw)}}
			err := l.kube.Create(ctx, cm)
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), l.name, err) // created meanwhile: merge into it
			}
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[LedgerKey] = string(raw)
		return l.kube.Update(ctx, cm)
	})
	if err != nil {
		l.mu.Lock()
		l.pending = append(pending, l.pending...)
		for k, v := range acted {
			if cur, ok := l.acted[k]; !ok || v.Before(cur) {
				l.acted[k] = v
			}
		}
		l.mu.Unlock()
		return fmt.Errorf("writing the shadow ledger %s/%s: %w", l.namespace, l.name, err)
	}
	// A deletion seen before its entry was written (by another leader, or not flushed yet)
	// waits for it, for ActedKept.
	l.mu.Lock()
	for k, v := range unmatched {
		if l.clock.Since(v) < ActedKept {
			if cur, ok := l.acted[k]; !ok || v.Before(cur) {
				l.acted[k] = v
			}
		}
	}
	l.mu.Unlock()
	return nil
}

// ActedKept is how long a NodeClaim's deletion with no entry in the ledger yet waits for one.
const ActedKept = time.Hour

// merge adds pending to entries (an entry of the same NodeClaim or instance and event
// replaces the older), marks the entries of the NodeClaims acted on, and keeps the newest
// MaxEntries. It returns the deletions that matched no entry.
func merge(entries, pending []Entry, acted map[string]time.Time) ([]Entry, map[string]time.Time) {
	key := func(e Entry) string { return cmp.Or(e.NodeClaim, e.Instance) + "/" + e.EventID }
	at := map[string]int{}
	for i, e := range entries {
		at[key(e)] = i
	}
	for _, e := range pending {
		if i, ok := at[key(e)]; ok {
			e.KarpenterAt = entries[i].KarpenterAt
			entries[i] = e
			continue
		}
		at[key(e)] = len(entries)
		entries = append(entries, e)
	}
	matched := map[string]bool{}
	for i := range entries {
		if t, ok := acted[entries[i].NodeClaim]; ok && entries[i].NodeClaim != "" {
			matched[entries[i].NodeClaim] = true
			if entries[i].KarpenterAt.IsZero() {
				entries[i].KarpenterAt = t
			}
		}
	}
	unmatched := map[string]time.Time{}
	for k, v := range acted {
		if !matched[k] {
			unmatched[k] = v
		}
	}
	slices.SortStableFunc(entries, func(a, b Entry) int { return a.Decided.Compare(b.Decided) })
	if len(entries) > MaxEntries {
		entries = entries[len(entries)-MaxEntries:]
	}
	return entries, unmatched
}

func decodeLedger(v string) ([]Entry, error) {
	if v == "" {
		return nil, nil
	}
	var lv ledgerValue
	if err := json.Unmarshal([]byte(v), &lv); err != nil {
		return nil, fmt.Errorf("%w: the ledger: %v", ErrUnreadable, err)
	}
	if lv.Version != Version {
		return nil, fmt.Errorf("%w: the ledger has version %d, this router writes %d", ErrUnreadable, lv.Version, Version)
	}
	return lv.Entries, nil
}

// ErrNoLedger marks a ledger ConfigMap that does not exist: no router keeps one there (another
// namespace or --shadow-ledger), or the router has recorded no would-be outcome yet.
var ErrNoLedger = errors.New("no shadow ledger")

// ReadLedger reads the ledger's entries. A ConfigMap that does not exist is an error wrapping
// ErrNoLedger: a reader that takes it as "no outcomes" says so itself.
func ReadLedger(ctx context.Context, r client.Reader, namespace, name string) ([]Entry, error) {
	cm := &corev1.ConfigMap{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: ConfigMap %s/%s not found", ErrNoLedger, namespace, name)
		}
		return nil, fmt.Errorf("reading the shadow ledger %s/%s: %w", namespace, name, err)
	}
	return decodeLedger(cm.Data[LedgerKey])
}
