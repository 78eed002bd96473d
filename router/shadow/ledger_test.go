package shadow

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/record"
)

// oldLedger is the ConfigMap a router before the store kept the ledger in.
func oldLedger(t *testing.T, raw string) *corev1.ConfigMap {
	t.Helper()
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "health-router", Name: DefaultLedgerName, UID: "old-ledger"},
		Data: map[string]string{LedgerKey: raw}}
}

func encoded(t *testing.T, es ...Entry) string {
	t.Helper()
	b, err := json.Marshal(ledgerValue{Version: Version, Entries: es})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLedgerInStore: the ledger is the router's own HealthRecord, not a ConfigMap that anyone
// with update on ConfigMaps of the namespace writes (a router before the store kept it in one,
// and created it at its first flush).
func TestLedgerInStore(t *testing.T) {
	kube := newClient(t)
	l := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.Add(entry("kafka-1", "ev-1", now))
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(context.Background(), client.ObjectKey{Namespace: "health-router", Name: DefaultLedgerName}, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ledger wrote a ConfigMap: %v", err)
	}
	hr := &record.HealthRecord{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: record.LedgerRecordName(DefaultLedgerName)}, hr); err != nil {
		t.Fatalf("no ledger in the store: %v", err)
	}
	if hr.Status.Phase != record.PhaseShadow || hr.Status.Action != record.ActionLedger {
		t.Errorf("the ledger's summary: %+v", hr.Status.Summary)
	}
	got, err := ReadLedger(context.Background(), kube, "health-router", DefaultLedgerName)
	if err != nil || len(got) != 1 || got[0].NodeClaim != "kafka-1" || got[0].Adopted {
		t.Errorf("ReadLedger: %+v, %v", got, err)
	}
}

// TestLedgerAdopt: the leader moves an earlier router's ConfigMap into the store once, marks
// its entries unverified, keeps what the store has, and deletes the ConfigMap; what it cannot
// read or parse it leaves.
func TestLedgerAdopt(t *testing.T) {
	karp := now.Add(time.Minute)
	inStore := entry("kafka-1", "ev-1", now.Add(time.Second)) // also in the ConfigMap, older there
	inStore.Reason = "the store's"
	fromOld := entry("kafka-1", "ev-1", now)
	fromOld.KarpenterAt = karp
	fromOld.Reason = "the configmap's"
	tests := []struct {
		name      string
		objs      func(t *testing.T) []client.Object
		store     []Entry
		forbidden bool
		want      map[string]Entry // by NodeClaim: Reason, Adopted, KarpenterAt
		cmLeft    bool
	}{{
		name: "no ConfigMap: nothing to adopt",
		objs: func(*testing.T) []client.Object { return nil },
		want: map[string]Entry{},
	}, {
		name: "adopted, marked, merged with the store's, and deleted",
		objs: func(t *testing.T) []client.Object {
			return []client.Object{oldLedger(t, encoded(t, fromOld, entry("kafka-2", "ev-2", now)))}
		},
		store: []Entry{inStore},
		want: map[string]Entry{
			"kafka-1": {Reason: "the store's", KarpenterAt: karp}, // the store's entry, Karpenter's time from the ConfigMap
			"kafka-2": {Reason: "window", Adopted: true},
		},
	}, {
		name:   "a ConfigMap that does not parse is left",
		objs:   func(t *testing.T) []client.Object { return []client.Object{oldLedger(t, `{"entries":`)} },
		store:  []Entry{inStore},
		want:   map[string]Entry{"kafka-1": {Reason: "the store's"}},
		cmLeft: true,
	}, {
		name: "no grant to read it: left, and not asked again",
		objs: func(t *testing.T) []client.Object {
			return []client.Object{oldLedger(t, encoded(t, entry("kafka-2", "ev-2", now)))}
		},
		forbidden: true,
		want:      map[string]Entry{},
		cmLeft:    true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme, err := cluster.NewScheme()
			if err != nil {
				t.Fatal(err)
			}
			gets := 0
			kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.objs(t)...).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*corev1.ConfigMap); ok {
						gets++
						if tt.forbidden {
							return apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, key.Name, nil)
						}
					}
					return c.Get(ctx, key, obj, opts...)
				},
			}).Build()
			store := record.NewStore(kube, kube)
			l := NewLedger(store, kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if len(tt.store) > 0 {
				for _, e := range tt.store {
					l.Add(e)
				}
				if err := l.Flush(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			l.Adopt(context.Background())
			l.Adopt(context.Background()) // once only
			if gets != 1 {
				t.Errorf("the ConfigMap was read %d times, want once", gets)
			}
			mem, _, err := record.LoadLedger(context.Background(), kube, DefaultLedgerName)
			if err != nil {
				t.Fatal(err)
			}
			got, err := decodeLedger(mem.Ledger)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("entries %+v, want %d", got, len(tt.want))
			}
			for _, e := range got {
				w, ok := tt.want[e.NodeClaim]
				if !ok || e.Reason != w.Reason || e.Adopted != w.Adopted || !e.KarpenterAt.Equal(w.KarpenterAt) {
					t.Errorf("entry %s: reason %q adopted %t karpenter %v, want %+v", e.NodeClaim, e.Reason, e.Adopted, e.KarpenterAt, w)
				}
			}
			err = kube.Get(context.Background(), client.ObjectKey{Namespace: "health-router", Name: DefaultLedgerName}, &corev1.ConfigMap{})
			if left := err == nil; left != tt.cmLeft && !tt.forbidden {
				t.Errorf("ConfigMap left: %t, want %t (%v)", left, tt.cmLeft, err)
			}
		})
	}
}

// TestReadLedgerOfAnOldRouter: status --shadow against a router not yet upgraded reads its
// ConfigMap, each entry marked unverified in the table; with neither, ErrNoLedger.
func TestReadLedgerOfAnOldRouter(t *testing.T) {
	kube := newClient(t, oldLedger(t, encoded(t, entry("kafka-2", "ev-2", now))))
	got, err := ReadLedger(context.Background(), kube, "health-router", DefaultLedgerName)
	if err != nil || len(got) != 1 || !got[0].Adopted {
		t.Errorf("ReadLedger: %+v, %v", got, err)
	}
	if _, err := ReadLedger(context.Background(), kube, "elsewhere", DefaultLedgerName); !errors.Is(err, ErrNoLedger) {
		t.Errorf("another namespace: %v, want ErrNoLedger", err)
	}
}
