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
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// LedgerKey is the key of the ConfigMap where routers before the store kept the ledger (JSON):
// adopted once at an upgrade (Ledger.Start), then deleted.
const LedgerKey = "ledger.json"

// DefaultLedgerName is the ledger's name (--shadow-ledger): its HealthRecord is
// record.LedgerRecordName of it, and the ConfigMap of routers before the store had the name.
const DefaultLedgerName = "health-router-shadow"

// MaxEntries bounds the ledger: the newest are kept, within record.LedgerMaxBytes.
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
	// Adopted marks an entry carried over from the ConfigMap of a router before the store,
	// which anyone with update on ConfigMaps of its namespace could have written: the report
	// says so beside it.
	Adopted bool `json:"adopted,omitempty"`
}

type ledgerValue struct {
	Version int     `json:"version"`
	Entries []Entry `json:"entries"`
}

// Ledger keeps the would-be outcomes of shadow pools, and when Karpenter drained each
// NodeClaim, in the router's store: a HealthRecord of its own (record.LedgerRecordName), which
// only the router writes, and which outlives the NodeClaims Karpenter deletes. Additions are
// gathered in memory and written once per FlushInterval by the leader (Start), merged into
// what is there under its resource version: an old leader still flushing beside a new one
// loses neither's entries. Nothing the router decides reads it: it is a report.
type Ledger struct {
	store *record.Store
	// kube reads and deletes the ConfigMap namespace/name of a router before the store.
	kube      client.Client
	namespace string
	name      string
	clock     clock.WithTicker
	log       *slog.Logger

	mu      sync.Mutex
	pending []Entry
	acted   map[string]time.Time // NodeClaim -> when it began deleting
	adopted bool                 // the old ConfigMap was looked for and, if there, adopted
}

// NewLedger returns the ledger called name, kept in store; kube and namespace find the
// ConfigMap an earlier router kept it in (adopted once by the leader).
func NewLedger(store *record.Store, kube client.Client, namespace, name string, clk clock.WithTicker, log *slog.Logger) *Ledger {
	return &Ledger{store: store, kube: kube, namespace: namespace, name: name, clock: clk, log: log, acted: map[string]time.Time{}}
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

// Start adopts the ConfigMap of an earlier router, then flushes every FlushInterval until ctx
// ends, and once more then.
func (l *Ledger) Start(ctx context.Context) error {
	l.Adopt(ctx)
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
			l.Adopt(ctx)
			if err := l.Flush(ctx); err != nil {
				l.log.Warn("shadow ledger: flush failed; retried at the next", "error", err)
			}
		}
	}
}

// Adopt moves the ledger a router before the store kept in its ConfigMap into the store, once,
// and deletes the ConfigMap: the report of weeks in shadow survives the upgrade. Its entries
// are a report, never an order (anyone with update on ConfigMaps of the namespace could have
// written them). An entry the store already has is kept as the store has it. A ConfigMap that
// cannot be read or written now is tried again at the next flush; one that does not parse is
// left, with a warning.
func (l *Ledger) Adopt(ctx context.Context) {
	l.mu.Lock()
	done := l.adopted
	l.mu.Unlock()
	if done || l.kube == nil {
		return
	}
	finish := func() {
		l.mu.Lock()
		l.adopted = true
		l.mu.Unlock()
	}
	cm := &corev1.ConfigMap{}
	err := l.kube.Get(ctx, client.ObjectKey{Namespace: l.namespace, Name: l.name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		finish()
		return
	case apierrors.IsForbidden(err):
		l.log.Info("shadow ledger: the ConfigMap of an earlier router cannot be read (no grant): not adopted", "configmap", l.namespace+"/"+l.name)
		finish()
		return
	case err != nil:
		l.log.Warn("shadow ledger: reading the ConfigMap of an earlier router failed; tried again", "configmap", l.namespace+"/"+l.name, "error", err)
		return
	}
	old, err := decodeLedger([]byte(cm.Data[LedgerKey]))
	for i := range old {
		old[i].Adopted = true
	}
	if err != nil {
		l.log.Warn("shadow ledger: the ConfigMap of an earlier router does not parse: left as it is", "configmap", l.namespace+"/"+l.name, "error", err)
		finish()
		return
	}
	err = l.store.UpdateLedger(ctx, l.name, func(m *record.Memory) (bool, error) {
		entries, err := decodeLedger(m.Ledger)
		if err != nil {
			return false, err
		}
		merged, _ := merge(old, entries, nil) // the store's entries replace the ConfigMap's
		if m.Ledger, err = encodeLedger(merged); err != nil {
			return false, err
		}
		return true, nil
	})
	if err != nil {
		l.log.Warn("shadow ledger: adopting the ConfigMap of an earlier router failed; tried again", "configmap", l.namespace+"/"+l.name, "error", err)
		return
	}
	err = l.kube.Delete(ctx, cm, client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		// Adopted, and adopting again merges the same entries: the next start tries again.
		l.log.Warn("shadow ledger: the adopted ConfigMap of an earlier router was not deleted", "configmap", l.namespace+"/"+l.name, "error", err)
	} else {
		l.log.Info("shadow ledger: adopted the ConfigMap of an earlier router into the store, and deleted it", "configmap", l.namespace+"/"+l.name, "entries", len(old))
	}
	finish()
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
	err := l.store.UpdateLedger(ctx, l.name, func(m *record.Memory) (bool, error) {
		entries, err := decodeLedger(m.Ledger)
		if err != nil {
			return false, err
		}
		entries, unmatched = merge(entries, pending, acted)
		if m.Ledger, err = encodeLedger(entries); err != nil {
			return false, err
		}
		return true, nil
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
		return fmt.Errorf("writing the shadow ledger %s: %w", record.LedgerRecordName(l.name), err)
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
			if e.KarpenterAt.IsZero() {
				e.KarpenterAt = entries[i].KarpenterAt
			}
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

// ledgerBudget is what the entries may take of record.LedgerMaxBytes: the memory's other
// fields and the summary are small.
const ledgerBudget = record.LedgerMaxBytes - 4<<10

// encodeLedger encodes entries (oldest first), dropping the oldest until they fit
// ledgerBudget.
func encodeLedger(entries []Entry) (json.RawMessage, error) {
	for {
		raw, err := json.Marshal(ledgerValue{Version: Version, Entries: entries})
		if err != nil || len(raw) <= ledgerBudget || len(entries) == 0 {
			return raw, err
		}
		entries = entries[max(1, len(entries)/16):]
	}
}

func decodeLedger(v []byte) ([]Entry, error) {
	if len(v) == 0 {
		return nil, nil
	}
	var lv ledgerValue
	if err := json.Unmarshal(v, &lv); err != nil {
		return nil, fmt.Errorf("%w: the ledger: %v", ErrUnreadable, err)
	}
	if lv.Version != Version {
		return nil, fmt.Errorf("%w: the ledger has version %d, this router writes %d", ErrUnreadable, lv.Version, Version)
	}
	return lv.Entries, nil
}

// ErrNoLedger marks a ledger that does not exist: no router keeps one by that name
// (--shadow-ledger; another release), or the router has recorded no would-be outcome yet.
var ErrNoLedger = errors.New("no shadow ledger")

// ReadLedger reads the ledger's entries: its HealthRecord, or, where there is none, the
// ConfigMap namespace/name a router before the store kept (a router not upgraded yet). None
// is an error wrapping ErrNoLedger: a reader that takes it as "no outcomes" says so itself.
func ReadLedger(ctx context.Context, r client.Reader, namespace, name string) ([]Entry, error) {
	mem, found, err := record.LoadLedger(ctx, r, name)
	if err != nil {
		return nil, fmt.Errorf("reading the shadow ledger %s: %w", record.LedgerRecordName(name), err)
	}
	if found {
		return decodeLedger(mem.Ledger)
	}
	cm := &corev1.ConfigMap{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("%w: neither healthrecord %s nor (a router before the store's) ConfigMap %s/%s", ErrNoLedger, record.LedgerRecordName(name), namespace, name)
		}
		return nil, fmt.Errorf("reading the shadow ledger %s/%s: %w", namespace, name, err)
	}
	es, err := decodeLedger([]byte(cm.Data[LedgerKey]))
	for i := range es {
		es[i].Adopted = true // anyone with update on ConfigMaps there could have written it
	}
	return es, err
}
