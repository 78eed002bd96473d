package signal

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
)

// eventSink keeps Events as an API server would: a series patch of an Event leaves its note
// as it was created. Notes returns what `kubectl describe` would show.
type eventSink struct {
	mu     sync.Mutex
	events map[string]*eventsv1.Event
}

func (s *eventSink) Create(_ context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.events[e.Name]; ok {
		return nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, e.Name)
	}
	s.events[e.Name] = e.DeepCopy()
	return e, nil
}

func (s *eventSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return e, nil
}

func (s *eventSink) Patch(_ context.Context, e *eventsv1.Event, _ []byte) (*eventsv1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.events[e.Name]
	if !ok {
		return nil, apierrors.NewNotFound(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, e.Name)
	}
	cur.Series = e.Series.DeepCopy()
	return cur, nil
}

func (s *eventSink) notes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.events {
		out = append(out, e.Note)
	}
	return out
}

// TestPolicyProblemsAllVisible: every problem of a pool reaches its Events. The events.k8s.io
// recorder folds Events that differ only in their note into one series that keeps the first
// note, so one Event per problem (same reason, same action) showed one problem of several.
// This runs client-go's own broadcaster, which does the folding.
func TestPolicyProblemsAllVisible(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	sink := &eventSink{events: map[string]*eventsv1.Event{}}
	b := events.NewBroadcaster(sink)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	s := New(nil, nil, ModeDeleteNodeClaim, nil, "", b.NewRecorder(scheme, "health-router"), clocktesting.NewFakeClock(now))
	res := cluster.Resolved{NodePool: &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}}
	problems := []string{
		`healthrouter.io/action="Defer" ignored: want drain, defer or ignore`,
		`healthrouter.io/drain-lead="876000h" ignored: at most 72h`,
		`healthrouter.io/max-concurrent-drains="12.5%" ignored: want a whole number; pacing at 1`,
	}
	// Every decision for the pool reports its problems again.
	s.PolicyProblems(res, problems)
	s.PolicyProblems(res, problems)

	var notes []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		notes = sink.notes()
		if allIn(problems, notes) {
			break
		}
	}
	for _, p := range problems {
		if !allIn([]string{p}, notes) {
			t.Errorf("problem not visible on the NodePool: %s\nthe Events' notes: %q", p, notes)
		}
	}
}

func allIn(problems, notes []string) bool {
	for _, p := range problems {
		found := false
		for _, n := range notes {
			found = found || strings.Contains(n, p)
		}
		if !found {
			return false
		}
	}
	return true
}

// TestPolicyProblemsBounded: the API server refuses a note over 1,024 bytes (the whole Event
// is lost then): a pool with many or long problems still gets an Event, cut short and saying so.
func TestPolicyProblemsBounded(t *testing.T) {
	rec := events.NewFakeRecorder(100)
	s := New(nil, nil, ModeDeleteNodeClaim, nil, "", rec, clocktesting.NewFakeClock(now))
	res := cluster.Resolved{NodePool: &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}}
	var problems []string
	for i := range 12 {
		problems = append(problems, fmt.Sprintf("healthrouter.io/hold-while-alerts=%q ignored: alert name expression: missing closing )", strings.Repeat("Kafka(", 20)+fmt.Sprint(i)))
	}
	s.PolicyProblems(res, problems)
	if len(rec.Events) != 1 {
		t.Fatalf("%d Events, want one", len(rec.Events))
	}
	got := <-rec.Events
	note := strings.TrimPrefix(got, "Warning "+ReasonInvalidAnnotation+" ")
	if len(note) > noteLimit {
		t.Errorf("note of %d bytes, over the API server's %d", len(note), noteLimit)
	}
	if !strings.Contains(note, "12 problems") || !strings.Contains(note, "health-router status") {
		t.Errorf("a cut note must say how many problems there are and where to see them all: %q", note)
	}
	s.PolicyProblems(res, nil)
	if len(rec.Events) != 0 {
		t.Errorf("no problems, yet an Event: %q", <-rec.Events)
	}
}
