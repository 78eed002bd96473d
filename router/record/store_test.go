package record

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
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
		{"a node drain in progress", Memory{NodeDrain: []byte(`{"event_id":"n1","kind":"spot-interruption","started":"2026-03-01T12:00:00Z"}`)}, PhaseDraining, "n1"},
		{"a node drain done, held until AWS's release", Memory{NodeDrain: []byte(`{"event_id":"n1","kind":"scheduled-change","started":"2026-03-01T12:00:00Z","done":"2026-03-01T12:01:00Z","release":"2026-03-01T15:00:00Z"}`)}, PhaseIdle, "n1"},
		{"a node drain done, its instance ends", Memory{NodeDrain: []byte(`{"event_id":"n1","kind":"spot-interruption","started":"2026-03-01T12:00:00Z","done":"2026-03-01T12:01:00Z"}`)}, PhaseIdle, ""},
		{"a close kept for a node", Memory{NodeDrain: []byte(`{"event_id":"c1","started":"2026-03-01T12:00:00Z","done":"2026-03-01T12:00:00Z","closed":true}`)}, PhaseIdle, ""},
		{"a node drain that does not parse", Memory{NodeDrain: []byte(`{"event_id":`)}, PhaseIdle, ""},
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

// The store's life of a Node's memory (a Node Karpenter does not manage): created on the
// first write, named after the Node and owned by it, with no NodeClaim; read fresh; deleted
// once empty; a record of an earlier Node of the same name is replaced, not inherited.
func TestStoreNode(t *testing.T) {
	ctx := context.Background()
	c := storeClient(t, interceptor.Funcs{})
	st := NewStore(c, c)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", UID: "node-uid-1"}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/i-0abc"}}
	drain := json.RawMessage(`{"event_id":"e1","kind":"spot-interruption","started":"2026-03-01T12:00:00Z"}`)
	put := func(v json.RawMessage) func(*Memory) (bool, error) {
		return func(m *Memory) (bool, error) { m.NodeDrain = v; return true, nil }
	}
	if err := st.UpdateNode(ctx, n, put(drain)); err != nil {
		t.Fatal(err)
	}
	hr := &HealthRecord{}
	if err := c.Get(ctx, client.ObjectKey{Name: "node.ip-10-0-0-1"}, hr); err != nil {
		t.Fatal(err)
	}
	if hr.Spec != (HealthRecordSpec{NodeName: "ip-10-0-0-1", InstanceID: "i-0abc"}) || !hr.OfNode() || hr.NodeUID() != "node-uid-1" {
		t.Errorf("spec %+v, owners %+v", hr.Spec, hr.OwnerReferences)
	}
	if o := hr.OwnerReferences; len(o) != 1 || o[0].APIVersion != "v1" || o[0].Kind != "Node" || o[0].Name != n.Name {
		t.Errorf("owner %+v", o)
	}
	if hr.Status.Phase != PhaseDraining || hr.Status.Action != ActionCordonDrain {
		t.Errorf("summary %+v", hr.Status.Summary)
	}
	if m, err := st.NodeMemory(ctx, n.Name); err != nil || string(m.NodeDrain) != string(drain) {
		t.Errorf("NodeMemory: %s, %v", m.NodeDrain, err)
	}
	if m, err := st.FreshNodeMemory(ctx, n.Name); err != nil || string(m.NodeDrain) != string(drain) {
		t.Errorf("FreshNodeMemory: %s, %v", m.NodeDrain, err)
	}
	// A NodeClaim's memory of the same short name is another record.
	if m, err := st.Get(ctx, n.Name); err != nil || !m.Empty() {
		t.Errorf("a NodeClaim named as the Node sees %+v, %v", m, err)
	}

	// A Node of the same name, made again: the old record is not its memory.
	again := n.DeepCopy()
	again.UID = "node-uid-2"
	var seen Memory
	if err := st.UpdateNode(ctx, again, func(m *Memory) (bool, error) { seen = *m; m.NodeDrain = drain; return true, nil }); err != nil {
		t.Fatal(err)
	}
	if !seen.Empty() {
		t.Errorf("the new Node inherited the old one's memory: %s", seen.NodeDrain)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "node.ip-10-0-0-1"}, hr); err != nil || hr.NodeUID() != "node-uid-2" {
		t.Errorf("record after the Node was made again: owner %s, %v", hr.NodeUID(), err)
	}

	// Empty: the record goes.
	if err := st.UpdateNode(ctx, again, put(nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: "node.ip-10-0-0-1"}, hr); !apierrors.IsNotFound(err) {
		t.Errorf("an empty memory was kept: %v", err)
	}
}

func TestNodeRecordName(t *testing.T) {
	if got := NodeRecordName("ip-10-0-0-1.eu-west-1.compute.internal"); got != "node.ip-10-0-0-1.eu-west-1.compute.internal" {
		t.Errorf("NodeRecordName = %s", got)
	}
	long := strings.Repeat("a", 253)
	got := NodeRecordName(long)
	if len(got) > 253 || !strings.HasPrefix(got, NodePrefix) || got == NodeRecordName(strings.Repeat("b", 253)) || got != NodeRecordName(long) {
		t.Errorf("NodeRecordName of a 253-character name = %s (%d characters)", got, len(got))
	}
	// The predicate of the controllers that mean NodeClaims passes a NodeClaim's record only.
	claims := OfClaims()
	nodeRec := &HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: "node.a"}, Spec: HealthRecordSpec{NodeName: "a"}}
	claimRec := &HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: "nc-1"}, Spec: HealthRecordSpec{NodeClaim: "nc-1", NodeName: "a"}}
	if claims.Generic(ctrlevent.GenericEvent{Object: nodeRec}) || !claims.Generic(ctrlevent.GenericEvent{Object: claimRec}) {
		t.Error("OfClaims passes a Node's record, or holds a NodeClaim's back")
	}
}
