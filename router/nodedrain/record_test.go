package nodedrain

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/health-router/health-router/router/record"
)

var (
	t0   = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	done = t0.Add(90 * time.Second)
)

func node(annotations map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-0-1", Annotations: annotations}}
}

func TestRecordRoundTrip(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	for _, tc := range []struct {
		name string
		rec  Record
		want string // the record, exactly: it is the record's contract with people and other routers
	}{
		{"new, no deadline", Record{EventID: "e1", Kind: "spot-interruption", Started: t0},
			`{"event_id":"e1","kind":"spot-interruption","started":"2026-03-01T12:00:00Z"}`},
		{"deadline, stored in UTC", Record{EventID: "e2", Kind: "scheduled-change", Started: t0.In(cet), Deadline: t0.Add(time.Hour).In(cet), Cordoned: true},
			`{"event_id":"e2","kind":"scheduled-change","started":"2026-03-01T12:00:00Z","deadline":"2026-03-01T13:00:00Z","cordoned":true}`},
		{"blocked, warned", Record{EventID: "e3", Kind: "k", Started: t0, Deadline: t0, Attempts: 4, LastError: "1 pod(s) left", Warned: true},
			`{"event_id":"e3","kind":"k","started":"2026-03-01T12:00:00Z","deadline":"2026-03-01T12:00:00Z","attempts":4,"last_error":"1 pod(s) left","warned":true}`},
		{"done", Record{EventID: "e4", Kind: "k", Started: t0, Done: &done, Attempts: 1},
			`{"event_id":"e4","kind":"k","started":"2026-03-01T12:00:00Z","done":"2026-03-01T12:01:30Z","attempts":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := encode(tc.rec)
			if got != tc.want {
				t.Fatalf("encode:\n got %s\nwant %s", got, tc.want)
			}
			back, ok, err := Of(record.Memory{NodeDrain: json.RawMessage(got)})
			if err != nil || !ok {
				t.Fatalf("Of: ok=%v err=%v", ok, err)
			}
			if ann, ok, err := FromAnnotation(node(map[string]string{AnnotationNodeDrain: got})); err != nil || !ok || !reflect.DeepEqual(ann, back) {
				t.Errorf("FromAnnotation: %+v ok=%v err=%v, want the record Of reads", ann, ok, err)
			}
			if !back.Started.Equal(tc.rec.Started) || !back.Deadline.Equal(tc.rec.Deadline) || (back.Done == nil) != (tc.rec.Done == nil) ||
				(back.Done != nil && !back.Done.Equal(*tc.rec.Done)) {
				t.Errorf("times changed: got %+v, want %+v", back, tc.rec)
			}
			back.Started, back.Deadline, back.Done = time.Time{}, time.Time{}, nil
			want := tc.rec
			want.Started, want.Deadline, want.Done = time.Time{}, time.Time{}, nil
			if !reflect.DeepEqual(back, want) {
				t.Errorf("round trip: got %+v, want %+v", back, want)
			}
		})
	}
}

// TestOf: a Node's drain is read from its memory in the store, never from the Node: an
// annotation on the Node, however well formed, is no record (issue 36).
func TestOf(t *testing.T) {
	const valid = `{"event_id":"x","kind":"k","started":"2026-03-01T12:00:00Z"}`
	for _, tc := range []struct {
		name    string
		mem     record.Memory
		ok      bool
		wantErr string
		eventID string
	}{
		{"no memory", record.Memory{}, false, "", ""},
		{"other memory only", record.Memory{Shadow: json.RawMessage(`{"outcomes":[]}`)}, false, "", ""},
		{"a record", record.Memory{NodeDrain: json.RawMessage(valid)}, true, "", "x"},
		{"unknown fields ignored (a newer router's record)", record.Memory{NodeDrain: json.RawMessage(`{"event_id":"x","future":1}`)}, true, "", "x"},
		{"not JSON", record.Memory{NodeDrain: json.RawMessage(`draining`)}, false, "the node drain record", ""},
		{"no event", record.Memory{NodeDrain: json.RawMessage(`{}`)}, false, "no event_id", ""},
		{"bad time", record.Memory{NodeDrain: json.RawMessage(`{"event_id":"x","started":"yesterday"}`)}, false, "cannot parse", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, ok, err := Of(tc.mem)
			if ok != tc.ok {
				t.Errorf("ok = %v, want %v", ok, tc.ok)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if rec.EventID != tc.eventID {
				t.Errorf("event ID %q, want %q", rec.EventID, tc.eventID)
			}
		})
	}
}

// TestFromAnnotation: the key routers before the store wrote, read by the upgrade's adoption
// only.
func TestFromAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		ok      bool
		wantErr string
		eventID string
	}{
		{"no annotations", nil, false, "", ""},
		{"other annotations", map[string]string{"a": "b"}, false, "", ""},
		{"a record", map[string]string{AnnotationNodeDrain: `{"event_id":"x","kind":"k","started":"2026-03-01T12:00:00Z"}`}, true, "", "x"},
		{"not JSON", map[string]string{AnnotationNodeDrain: `draining`}, false, "healthrouter.io/node-drain of node ip-10-0-0-1", ""},
		{"empty", map[string]string{AnnotationNodeDrain: ``}, false, "unexpected end of JSON", ""},
		{"no event", map[string]string{AnnotationNodeDrain: `{}`}, false, "no event_id", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, ok, err := FromAnnotation(node(tc.ann))
			if ok != tc.ok {
				t.Errorf("ok = %v, want %v", ok, tc.ok)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if rec.EventID != tc.eventID {
				t.Errorf("event ID %q, want %q", rec.EventID, tc.eventID)
			}
		})
	}
}

func TestOverdueAndFinished(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rec      Record
		now      time.Time
		overdue  bool
		finished bool
	}{
		{"no deadline never overdue", Record{}, t0.Add(1000 * time.Hour), false, false},
		{"before the deadline", Record{Deadline: t0}, t0.Add(-time.Nanosecond), false, false},
		{"at the deadline", Record{Deadline: t0}, t0, true, false},
		{"after, done", Record{Deadline: t0, Done: &done}, done, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rec.Overdue(tc.now); got != tc.overdue {
				t.Errorf("Overdue = %v, want %v", got, tc.overdue)
			}
			if got := tc.rec.Finished(); got != tc.finished {
				t.Errorf("Finished = %v, want %v", got, tc.finished)
			}
		})
	}
}

func TestOrder(t *testing.T) {
	p := func(name string, deadline time.Time) pending {
		return pending{node: name, rec: Record{Deadline: deadline}}
	}
	for _, tc := range []struct {
		name      string
		in        []pending
		lastTried map[string]time.Time
		want      []string
	}{
		{"nearest deadline first, none last, then by name",
			[]pending{p("d", time.Time{}), p("c", t0.Add(time.Hour)), p("b", t0), p("a", time.Time{})}, nil,
			[]string{"b", "c", "a", "d"}},
		{"never tried before tried, least recently tried first, whatever the deadline",
			[]pending{p("old", t0), p("recent", t0), p("new", t0.Add(time.Hour))},
			map[string]time.Time{"old": t0, "recent": t0.Add(time.Minute)},
			[]string{"new", "old", "recent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order(tc.in, tc.lastTried)
			var got []string
			for _, x := range tc.in {
				got = append(got, x.node)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("order = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBudgetRefusal(t *testing.T) {
	pods := schema.GroupResource{Resource: "pods"}
	withCause := func(err *apierrors.StatusError, typ metav1.CauseType, msg string) error {
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: typ, Message: msg})
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
		ok   bool
	}{
		{"nil", nil, "", false},
		{"not an API error", errors.New("connection refused"), "", false},
		{"429 from a budget at zero", withCause(apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0),
			policyv1.DisruptionBudgetCause, "The disruption budget web needs 2 healthy pods and has 2 currently"), "The disruption budget web needs 2 healthy pods and has 2 currently", true},
		{"403 from a budget in a bad state", withCause(apierrors.NewForbidden(schema.GroupResource{Group: "policy", Resource: "poddisruptionbudget"}, "web", errors.New("negative")),
			policyv1.DisruptionBudgetCause, "The disruption budget web does not allow evicting pods currently"), "The disruption budget web does not allow evicting pods currently", true},
		{"429 for another reason (API priority and fairness)", apierrors.NewTooManyRequests("too many requests", 1), "", false},
		{"wrapped", fmt.Errorf("evicting: %w", withCause(apierrors.NewTooManyRequests("x", 0), policyv1.DisruptionBudgetCause, "budget b")), "budget b", true},
		{"not found", apierrors.NewNotFound(pods, "p"), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := budgetRefusal(tc.err)
			if got != tc.want || ok != tc.ok {
				t.Errorf("budgetRefusal = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestObserver(t *testing.T) {
	refusal := apierrors.NewTooManyRequests("x", 0)
	refusal.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause, Message: "budget web"}}
	o := &observer{refused: map[string]string{}}
	o.note("shop", "web-0", refusal)
	o.note("shop", "web-1", refusal)
	o.note("shop", "api-0", nil)
	o.note("shop", "web-1", nil) // refused, then let go within the same round
	o.note("shop", "db-0", apierrors.NewInternalError(errors.New("etcd")))
	want := map[string]string{"shop/web-0": "budget web"}
	if got := o.snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("refused = %v, want %v", got, want)
	}
}

func TestBlockedNote(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refused map[string]string
		want    string
	}{
		{"one", map[string]string{"a/p": "budget x"}, "a/p: budget x"},
		{"sorted", map[string]string{"b/q": "y", "a/p": "x"}, "a/p: x; b/q: y"},
		{"at most five", map[string]string{"n/1": "x", "n/2": "x", "n/3": "x", "n/4": "x", "n/5": "x", "n/6": "x", "n/7": "x"},
			"n/1: x; n/2: x; n/3: x; n/4: x; n/5: x; and 2 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := BlockedNote(tc.refused); got != tc.want {
				t.Errorf("BlockedNote = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short", "abc", 10, "abc"},
		{"exact", "abcdef", 6, "abcdef"},
		{"cut", "abcdefghij", 8, "abcd …"},
		{"not inside a rune", "ééééé", 8, "éé …"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in, tc.n)
			if got != tc.want {
				t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
			if len(got) > tc.n || !utf8.ValidString(got) {
				t.Errorf("truncate(%q, %d) = %q: %d bytes, valid UTF-8 %v", tc.in, tc.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
}

func TestOptionsDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Options
		want Options
	}{
		{"zero", Options{}, Options{Interval: DefaultInterval, EvictTimeout: DefaultEvictTimeout, PerPass: DefaultPerPass}},
		{"negative", Options{Interval: -1, EvictTimeout: -1, PerPass: -1}, Options{Interval: DefaultInterval, EvictTimeout: DefaultEvictTimeout, PerPass: DefaultPerPass}},
		{"set", Options{Interval: time.Second, EvictTimeout: 2 * time.Second, PerPass: 3}, Options{Interval: time.Second, EvictTimeout: 2 * time.Second, PerPass: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.withDefaults(); got != tc.want {
				t.Errorf("withDefaults = %+v, want %+v", got, tc.want)
			}
		})
	}
}
