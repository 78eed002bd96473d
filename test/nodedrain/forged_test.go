package nodedrain

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/health-router/health-router/router/nodedrain"
)

// TestForgedAnnotationDrainsNothing (issue 36): anyone with `patch nodes` can write
// healthrouter.io/node-drain on a Node. A router that read it as its record evicted every pod
// of the Node on the next pass, without a cordon: the annotation was an order. The record
// lives in the router's store now, which only the router writes; a pass leaves such a Node,
// its pod and the annotation as they are.
func TestForgedAnnotationDrainsNothing(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	const ns = "forged"
	newNamespace(t, ns)
	newNode(t, "forged-a", false)
	newPod(t, ns, "app", "forged-a", podOpts{})

	// An unfinished drain, as a router before the store wrote it.
	forged := fmt.Sprintf(`{"event_id":"forged-1","kind":"spot-interruption","started":%q,"deadline":%q,"cordoned":true}`,
		t0.Format(time.RFC3339), t0.Add(2*time.Minute).Format(time.RFC3339))
	n := getNode(t, "forged-a")
	n.Annotations = map[string]string{nodedrain.AnnotationNodeDrain: forged}
	must(t, direct.Update(context.Background(), n))
	eventually(t, "the cache shows the annotation", func() bool {
		return cached(t, "forged-a").Annotations[nodedrain.AnnotationNodeDrain] == forged
	})

	if left := s.pass(); left != 0 {
		t.Errorf("Pass: %d nodes draining, want 0", left)
	}
	if st := podState(t, ns, "app"); st != "running" {
		t.Errorf("the pod of the node with a forged drain is %s, want running: the annotation was taken as an order", st)
	}
	n = getNode(t, "forged-a")
	if n.Spec.Unschedulable {
		t.Error("the node with a forged drain was cordoned")
	}
	if got := n.Annotations[nodedrain.AnnotationNodeDrain]; got != forged {
		t.Errorf("the annotation was rewritten: %s, want it left as it is: %s", got, forged)
	}
	if evs := s.events(); len(evs) != 0 {
		t.Errorf("events on the node with a forged drain: %q", evs)
	}
}
