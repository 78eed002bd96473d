package upcoming

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

var t0 = time.Date(2026, 12, 5, 2, 0, 0, 0, time.UTC)

func rec(id string, state string, until time.Time, hold policy.Hold) record.Record {
	return record.Record{EventID: id, Kind: event.KindScheduledChange, State: state, Until: until, Hold: hold}
}

func TestDesired(t *testing.T) {
	tests := []struct {
		name      string
		set       record.Set
		taint     bool
		wantAt    string
		wantEvent string
		wantHold  string
		wantN     int
	}{
		{name: "no records", set: record.Set{}},
		{name: "only ended records", set: record.Set{Records: []record.Record{rec("a", record.StateDrained, t0, ""), rec("b", record.StateCancelled, t0, "")}}},
		{name: "one deferral to the window", set: record.Set{Records: []record.Record{rec("a", record.StateDeferred, t0, policy.HoldWindow)}},
			wantAt: "1796436000", wantEvent: "a", wantHold: "window", wantN: 1},
		{name: "the earliest of two active records, an ended earlier one ignored", taint: true,
			set: record.Set{Records: []record.Record{rec("late", record.StateDeferred, t0.Add(48*time.Hour), policy.HoldDeadline),
				rec("gone", record.StateSuperseded, t0.Add(-time.Hour), ""), rec("soon", record.StateDeferred, t0, policy.HoldPacing)}},
			wantAt: "1796436000", wantEvent: "soon", wantHold: "pacing", wantN: 2},
		{name: "equal times: the lower event ID, whatever the order", set: record.Set{Records: []record.Record{rec("b", record.StateDeferred, t0, ""), rec("a", record.StateDeferred, t0, "")}},
			wantAt: "1796436000", wantEvent: "a", wantN: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Desired(tt.set, tt.taint)
			if tt.wantAt == "" {
				if !m.None() {
					t.Fatalf("marks %+v, want none", m)
				}
				return
			}
			if m.At != tt.wantAt {
				t.Errorf("label %q, want %q", m.At, tt.wantAt)
			}
			var p Pending
			if err := json.Unmarshal([]byte(m.Annotation), &p); err != nil {
				t.Fatal(err)
			}
			if p.Event != tt.wantEvent || p.Hold != tt.wantHold || p.Records != tt.wantN || p.Decision != "defer" || p.Kind != string(event.KindScheduledChange) || strconv.FormatInt(p.Until.Unix(), 10) != tt.wantAt {
				t.Errorf("annotation %+v", p)
			}
			if (m.Taint != "") != tt.taint {
				t.Errorf("taint %q with taint-upcoming=%v", m.Taint, tt.taint)
			}
		})
	}
}

func TestApply(t *testing.T) {
	other := corev1.Taint{Key: "dedicated", Value: "kafka", Effect: corev1.TaintEffectNoSchedule}
	marked := Marks{At: "1796436000", Annotation: `{"kind":"scheduled-change"}`, Taint: "scheduled-change"}
	tests := []struct {
		name        string
		node        corev1.Node
		marks       Marks
		wantChanged bool
		wantTaints  int
	}{
		{name: "marks a bare node", node: corev1.Node{}, marks: marked, wantChanged: true, wantTaints: 1},
		{name: "keeps other labels, annotations and taints", node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"x": "y"}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{other}}}, marks: marked, wantChanged: true, wantTaints: 2},
		{name: "already marked: no write", node: node(marked, other), marks: marked, wantChanged: false, wantTaints: 2},
		{name: "clears every mark, keeps the rest", node: node(marked, other), marks: Marks{}, wantChanged: true, wantTaints: 1},
		{name: "drops the taint when the pool turns it off", node: node(marked), marks: Marks{At: marked.At, Annotation: marked.Annotation}, wantChanged: true},
		{name: "replaces a hand-made taint of the key with another effect", node: corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: TaintKey, Effect: corev1.TaintEffectNoSchedule}}}},
			marks: Marks{}, wantChanged: true},
		{name: "nothing to clear", node: corev1.Node{}, marks: Marks{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := tt.node.DeepCopy()
			if got := Apply(n, tt.marks); got != tt.wantChanged {
				t.Errorf("changed = %v, want %v", got, tt.wantChanged)
			}
			if Current(n) != tt.marks {
				t.Errorf("node carries %+v, want %+v", Current(n), tt.marks)
			}
			if len(n.Spec.Taints) != tt.wantTaints {
				t.Errorf("taints %v", n.Spec.Taints)
			}
			if tt.node.Labels["team"] != "" && (n.Labels["team"] != "a" || n.Annotations["x"] != "y") {
				t.Errorf("other metadata lost: %v %v", n.Labels, n.Annotations)
			}
		})
	}
}

func node(m Marks, taints ...corev1.Taint) corev1.Node {
	n := corev1.Node{Spec: corev1.NodeSpec{Taints: taints}}
	Apply(&n, m)
	return n
}

// TestDesiredForARun: issue 25. The marks stay through a reboot in place (its records ended
// when it began) and go after it, as they go after a drain; a run that is over marks nothing.
func TestDesiredForARun(t *testing.T) {
	ended := record.Set{Records: []record.Record{rec("a", record.StateInPlace, t0, "")}}
	run := func(step, outcome string) record.Memory {
		return record.Memory{Records: ended.Records, Run: json.RawMessage(`{"version":1,"event_id":"a","type":"system-reboot","step":"` +
			step + `","start":"2026-12-05T03:00:00Z","outcome":"` + outcome + `"}`)}
	}
	m := DesiredFor(run("evict", ""), true)
	var p Pending
	if err := json.Unmarshal([]byte(m.Annotation), &p); err != nil {
		t.Fatalf("marks %+v: %v", m, err)
	}
	if p.Event != "a" || p.Decision != string(policy.ActionRebootInPlace) || !p.Until.Equal(t0.Add(time.Hour)) || m.Taint == "" {
		t.Errorf("during the run: %+v, %+v", m, p)
	}
	if m := DesiredFor(run("done", "done"), true); !m.None() {
		t.Errorf("after the run: %+v", m)
	}
	if m := DesiredFor(record.Memory{Records: ended.Records}, true); !m.None() {
		t.Errorf("no run: %+v", m)
	}
}

// TestTaints: a pool taints its nodes with an upcoming maintenance only when it asks and is
// not in shadow (its policy is then only recorded; the router acts for it as Karpenter would).
func TestTaints(t *testing.T) {
	tests := []struct {
		name string
		ann  map[string]string
		want bool
	}{
		{"no annotation", nil, false},
		{"taint-upcoming", map[string]string{policy.AnnotationTaintUpcoming: "true"}, true},
		{"taint-upcoming in shadow", map[string]string{policy.AnnotationTaintUpcoming: "true", policy.AnnotationMode: policy.ModeShadow}, false},
		{"taint-upcoming, mode active", map[string]string{policy.AnnotationTaintUpcoming: "true", policy.AnnotationMode: policy.ModeActive}, true},
	}
	for _, tt := range tests {
		if got := Taints(tt.ann); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
