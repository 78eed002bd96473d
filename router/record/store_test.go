package record

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

func storeClient(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	gv := schema.GroupVersion{Group: "karpenter.sh", Version: "v1"}
	metav1.AddToGroupVersion(s, gv)
	s.AddKnownTypes(gv, &karpv1.NodeClaim{}, &karpv1.NodeClaimList{})
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
}

func claim() *karpv1.NodeClaim {
	return &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "nc-1", UID: "uid-1", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}},
		Status:     karpv1.NodeClaimStatus{ProviderID: "aws:///us-east-1a/i-0abc", NodeName: "node-1"},
	}
}

// The store's life of one NodeClaim's memory: created on the first write (named, labelled and
// owned as the NodeClaim), changed under an optimistic lock, and deleted once empty.
func TestStoreLifecycle(t *testing.T) {
	ctx := context.Background()
	c := storeClient(t, interceptor.Funcs{})
	st := NewStore(c, c)
	nc := claim()
	if m, err := st.Get(ctx, nc.Name); err != nil || !m.Empty() {
		t.Fatalf("memory of a NodeClaim with none: %+v, %v", m, err)
	}
	// A mutate that changes nothing writes nothing.
	if err := st.Update(ctx, nc, func(*Memory) (bool, error) { return false, nil }); err != nil {
		t.Fatal(err)
	}
	var hrs HealthRecordList
	if err := c.List(ctx, &hrs); err != nil || len(hrs.Items) != 0 {
		t.Fatalf("a write of nothing created %d records (%v)", len(hrs.Items), err)
	}
	until := t0.Add(48 * time.Hour)
	put := func(m *Memory) (bool, error) {
		s := m.Set()
		s.Put(Record{EventID: "e1", Key: "e1", Kind: event.KindScheduledChange, State: StateDeferred, Until: until, Hold: policy.HoldWindow, Start: t0.Add(72 * time.Hour)})
		m.SetSet(s)
		return true, nil
	}
	if err := st.Update(ctx, nc, put); err != nil {
		t.Fatal(err)
	}
	hr := &HealthRecord{}
	if err := c.Get(ctx, client.ObjectKey{Name: nc.Name}, hr); err != nil {
		t.Fatal(err)
	}
	if hr.Spec != (HealthRecordSpec{NodeClaim: "nc-1", InstanceID: "i-0abc", NodeName: "node-1", NodePool: "kafka"}) {
		t.Errorf("spec %+v", hr.Spec)
	}
	if len(hr.OwnerReferences) != 1 || hr.OwnerReferences[0].UID != "uid-1" || hr.OwnerReferences[0].Kind != "NodeClaim" {
		t.Errorf("owner %+v", hr.OwnerReferences)
	}
	if hr.Labels[karpv1.NodePoolLabelKey] != "kafka" {
		t.Errorf("labels %v", hr.Labels)
	}
	if hr.Status.Phase != PhaseDeferred || hr.Status.Event != "e1" || hr.Status.When == nil || !hr.Status.When.Time.Equal(until) || hr.Status.Version != Version {
		t.Errorf("status %+v", hr.Status)
	}
	// The drain ends the records and is the phase.
	if err := st.Update(ctx, nc, func(m *Memory) (bool, error) {
		s := m.Set()
		s.Drained("e2", "e2")
		m.SetSet(s)
		m.Drain = &Drain{EventID: "e2", At: t0, Via: "forward"}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Fresh(ctx, nc.Name)
	if err != nil || m.Drain == nil || m.Drain.EventID != "e2" || len(m.Set().Active()) != 0 {
		t.Fatalf("after the drain: %+v, %v", m, err)
	}
	// Emptied, the record goes.
	if err := st.Update(ctx, nc, func(m *Memory) (bool, error) { *m = Memory{}; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: nc.Name}, hr); !apierrors.IsNotFound(err) {
		t.Errorf("an empty memory is kept: %v", err)
	}
}

// A conflict (another writer first) is read fresh and mutate applied again; a memory of a
// newer format is never given to mutate; a memory past the bound is refused before a write.
func TestStoreConflictsAndBounds(t *testing.T) {
	ctx := context.Background()
	nc := claim()
	conflicts := 0
	c := storeClient(t, interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if conflicts == 0 {
			conflicts++
			return apierrors.NewAlreadyExists(GroupVersion.WithResource(Resource).GroupResource(), obj.GetName())
		}
		return c.Create(ctx, obj, opts...)
	}})
	st := NewStore(c, c)
	calls := 0
	if err := st.Update(ctx, nc, func(m *Memory) (bool, error) {
		calls++
		m.Running = t0
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if calls != 2 || conflicts != 1 {
		t.Errorf("mutate called %d times over %d conflicts, want 2 over 1", calls, conflicts)
	}
	if m, _ := st.Get(ctx, nc.Name); !m.Running.Equal(t0) {
		t.Errorf("running %v", m.Running)
	}

	newer := &HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: "nc-2"}, Status: HealthRecordStatus{Version: Version + 1}}
	c2 := storeClient(t, interceptor.Funcs{}, newer)
	st2 := NewStore(c2, c2)
	err := st2.Update(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-2"}}, func(*Memory) (bool, error) {
		t.Error("mutate was given a newer router's memory")
		return true, nil
	})
	if !errors.Is(err, ErrUnreadable) {
		t.Errorf("a newer format: %v, want ErrUnreadable", err)
	}
	if _, err := st2.Get(ctx, "nc-2"); !errors.Is(err, ErrUnreadable) {
		t.Errorf("get of a newer format: %v", err)
	}

	big := func(m *Memory) (bool, error) {
		for i := range EndedKept + 200 {
			m.Records = append(m.Records, Record{EventID: strings.Repeat("x", 400) + string(rune('a'+i%26)), State: StateDeferred})
		}
		return true, nil
	}
	if err := NewStore(c2, c2).Update(ctx, claim(), big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("past the bound: %v, want ErrTooLarge", err)
	}
}

func TestSummarize(t *testing.T) {
	until := t0.Add(time.Hour)
	tests := []struct {
		name  string
		mem   Memory
		phase string
		event string
	}{
		{"nothing", Memory{}, PhaseIdle, ""},
		{"tombstones only", Memory{Records: []Record{{EventID: "a", State: StateCancelled}}}, PhaseIdle, ""},
		{"the earliest deferral", Memory{Records: []Record{{EventID: "late", State: StateDeferred, Until: until.Add(time.Hour)}, {EventID: "soon", State: StateDeferred, Until: until}}}, PhaseDeferred, "soon"},
		{"a reboot in place", Memory{Records: []Record{{EventID: "r", State: StateInPlace}, {EventID: "d", State: StateDeferred, Until: until}}}, PhaseInPlace, "r"},
		{"a drain wins", Memory{Records: []Record{{EventID: "d", State: StateDeferred, Until: until}}, Drain: &Drain{EventID: "x", At: t0, Via: "forward"}}, PhaseDraining, "x"},
		{"a run in progress", Memory{Run: []byte(`{"version":1,"event_id":"run-1","type":"system-reboot","step":"evict"}`), Records: []Record{{EventID: "d", State: StateDeferred, Until: until}}}, PhaseInPlace, "run-1"},
		{"a run over", Memory{Run: []byte(`{"version":1,"event_id":"run-1","step":"done","outcome":"done"}`)}, PhaseIdle, ""},
		{"a run that does not parse", Memory{Run: []byte(`{"event_id":`)}, PhaseIdle, ""},
		{"shadow outcomes only", Memory{Shadow: []byte(`{"version":1}`)}, PhaseShadow, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Summarize(tt.mem)
			if s.Phase != tt.phase || s.Event != tt.event {
				t.Errorf("summary %+v, want phase %s event %q", s, tt.phase, tt.event)
			}
			// The pacer counts a node out of service in exactly these two phases.
			if out := tt.mem.OutOfService(); out != (tt.phase == PhaseDraining || tt.phase == PhaseInPlace) {
				t.Errorf("OutOfService %v in phase %s", out, tt.phase)
			}
		})
	}
}
