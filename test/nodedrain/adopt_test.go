package nodedrain

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/health-router/health-router/router/nodedrain"
)

// TestAdoptEndsAForgedDrain (issue 36): a router that starts beside a healthrouter.io/node-drain
// adopts it only while EC2 shows a reason to drain the instance. One on a Node whose instance
// runs with nothing scheduled (a forged one) ends: the key is removed, a Warning says so, the
// Node is left as it is (a cordon is never lifted on its word), and nothing is evicted then or after.
func TestAdoptEndsAForgedDrain(t *testing.T) {
	s := newSetup(t, nodedrain.Options{})
	const ns = "forged-adopt"
	newNamespace(t, ns)
	newNode(t, "forged-b", false)
	newPod(t, ns, "app", "forged-b", podOpts{})
	forged := fmt.Sprintf(`{"event_id":"forged-2","kind":"scheduled-change","started":%q}`, t0.Format(time.RFC3339))
	n := getNode(t, "forged-b")
	n.Annotations = map[string]string{nodedrain.AnnotationNodeDrain: forged}
	must(t, direct.Update(context.Background(), n))

	res, err := nodedrain.Adopt(s.ctx, direct, direct, runningEC2{}, s.recorder, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || res != (nodedrain.Adopted{Ended: 1}) {
		t.Fatalf("Adopt: %+v, %v; want one drain ended", res, err)
	}
	n = getNode(t, "forged-b")
	if _, ok := n.Annotations[nodedrain.AnnotationNodeDrain]; ok || n.Spec.Unschedulable || stored(t, "forged-b") != "" {
		t.Errorf("after the adoption: annotations %v, unschedulable %v, record %q", n.Annotations, n.Spec.Unschedulable, stored(t, "forged-b"))
	}
	if evs := s.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+nodedrain.ReasonNodeDrainNotAdopted+" ") {
		t.Errorf("events: %q, want one %s", evs, nodedrain.ReasonNodeDrainNotAdopted)
	}
	if left := s.pass(); left != 0 || podState(t, ns, "app") != "running" {
		t.Errorf("after the adoption a pass left %d draining, the pod %s", left, podState(t, ns, "app"))
	}
}

// runningEC2 answers that every instance runs with nothing scheduled.
type runningEC2 struct{}

func (runningEC2) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		out.InstanceStatuses = append(out.InstanceStatuses, ec2types.InstanceStatus{InstanceId: aws.String(id),
			InstanceState: &ec2types.InstanceState{Name: ec2types.InstanceStateNameRunning}})
	}
	return out, nil
}
