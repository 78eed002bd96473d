package signal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

func drainEvents(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// The instance Event budget: a burst of ten seconds' worth goes through, the rest is held and
// told per pool and reason by Summarise; the bucket refills with the clock.
func TestInstanceEventBudget(t *testing.T) {
	tests := []struct {
		name      string
		perSecond float64
		first     int           // instances ignored at once
		wait      time.Duration // then the clock advances
		second    int           // and as many more
		posted    int           // instances whose Events were posted (two each: Node and NodeClaim)
		held      map[string]int
	}{
		{name: "unbounded", perSecond: 0, first: 50, second: 50, posted: 100},
		{name: "within the burst", perSecond: 2, first: 20, posted: 20},
		{name: "over the burst", perSecond: 2, first: 25, posted: 20, held: map[string]int{ReasonIgnored: 5}},
		{name: "the bucket refills with time", perSecond: 2, first: 25, wait: 3 * time.Second, second: 10, posted: 26, held: map[string]int{ReasonIgnored: 9}},
		{name: "a full refill", perSecond: 2, first: 20, wait: time.Minute, second: 20, posted: 40},
	}
	pool := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-10-0-1-1.eu-west-1.compute.internal"}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, r := newRig(t, ModeDeleteNodeClaim)
			r.recorder = events.NewFakeRecorder(1000)
			s.recorder = r.recorder
			heldBy := map[string]int{}
			s.SetInstanceEventRate(tt.perSecond, func(reason string) { heldBy[reason]++ })
			ignore := func(n int) {
				for i := range n {
					res := r.resolved(t)
					res.NodePool, res.Node = pool, node
					ev := event.Event{ID: fmt.Sprintf("rb-%d", i), Kind: event.KindRebalance}
					if err := s.Ignore(context.Background(), ev, policy.Decision{InstanceID: res.InstanceID, Action: policy.ActionIgnore, Reason: "the pool ignores rebalance recommendations"}, res, false); err != nil {
						t.Fatal(err)
					}
				}
			}
			ignore(tt.first)
			r.clock.Step(tt.wait)
			ignore(tt.second)
			got := drainEvents(r.recorder)
			if len(got) != 2*tt.posted {
				t.Fatalf("%d Events posted, want %d (two per instance)", len(got), 2*tt.posted)
			}
			total := 0
			for reason, n := range tt.held {
				total += n
				if heldBy[reason] != n {
					t.Errorf("held %s: %d, want %d", reason, heldBy[reason], n)
				}
			}
			if s.HeldEvents() != total {
				t.Errorf("HeldEvents %d, want %d", s.HeldEvents(), total)
			}
			if told := s.Summarise(); told != total {
				t.Errorf("Summarise told %d instances, want %d", told, total)
			}
			summary := drainEvents(r.recorder)
			if total == 0 {
				if len(summary) != 0 {
					t.Errorf("a summary with nothing held: %v", summary)
				}
				return
			}
			want := fmt.Sprintf("Normal %s %d more instances of this pool since", ReasonIgnored, total)
			if len(summary) != 1 || !strings.HasPrefix(summary[0], want) || !strings.Contains(summary[0], "i-0a1b2c3d4e5f6000a: ") {
				t.Fatalf("summary %v, want one starting %q with an example", summary, want)
			}
			if s.HeldEvents() != 0 || s.Summarise() != 0 {
				t.Errorf("held Events told twice")
			}
		})
	}
}

// A held Warning makes the summary a Warning; a pool-less instance (a node Karpenter does not
// manage) is told of at once, never held: there is no pool to sum it up on (the simulation found
// held Events of the unmanaged node counted as told and posted nowhere).
func TestInstanceEventBudgetSummaryType(t *testing.T) {
	s, r := newRig(t, ModeDeleteNodeClaim)
	r.recorder = events.NewFakeRecorder(100)
	s.recorder = r.recorder
	s.SetInstanceEventRate(0.1, nil) // a burst of one
	pool := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka"}}
	res := r.resolved(t)
	res.NodePool = pool
	s.event(res, "Normal", ReasonDrained, "first")
	s.event(res, "Warning", ReasonDrained, "second, with a warning")
	s.event(res, "Normal", ReasonDrained, "third")
	noPool := r.resolved(t)
	noPool.NodeClaim.Labels = nil
	s.event(noPool, "Normal", ReasonDeferred, "no pool")
	if posted := drainEvents(r.recorder); len(posted) != 2 || !strings.Contains(posted[1], "no pool") {
		t.Fatalf("posted %q, want the first drain and the pool-less deferral (on the NodeClaim)", posted)
	}
	if told := s.Summarise(); told != 2 {
		t.Fatalf("told %d, want 2 (the two held drains)", told)
	}
	got := drainEvents(r.recorder)
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning "+ReasonDrained+" 2 more instances") || !strings.Contains(got[0], "second, with a warning") {
		t.Fatalf("summary %v, want one Warning for the two held drains, the first held as the example", got)
	}
}
