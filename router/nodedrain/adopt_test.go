package nodedrain

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/health-router/health-router/router/record"
)

// statusEC2 answers DescribeInstanceStatus with the events and state it holds per instance
// (an instance it does not hold: InvalidInstanceID.NotFound).
type statusEC2 struct {
	events map[string][]ec2types.InstanceStatusEvent
	states map[string]ec2types.InstanceStateName
	err    error
}

func (f *statusEC2) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	if f.err != nil {
		return nil, f.err
	}
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		st, ok := f.states[id]
		if !ok {
			return nil, errors.New("api error InvalidInstanceID.NotFound: The instance ID '" + id + "' does not exist")
		}
		out.InstanceStatuses = append(out.InstanceStatuses, ec2types.InstanceStatus{InstanceId: aws.String(id), Events: f.events[id],
			InstanceState: &ec2types.InstanceState{Name: st}})
	}
	return out, nil
}

// TestAdopt: an upgrade adopts a drain from the old annotation only where EC2 confirms a
// reason for it (an event scheduled for the instance, or the instance not running); a drain
// EC2 confirms nothing for (a forged one) ends with a Warning, the Node left as it is (on
// 1dd416f a forged record saying the router cordoned had an operator's cordon lifted); the key
// goes in every case but an EC2 that does not answer.
func TestAdopt(t *testing.T) {
	const id = "i-0123456789abcdef0"
	unfinished := Record{EventID: "ev-1", Kind: "scheduled-change", Started: t0, Cordoned: true}
	scheduled := map[string][]ec2types.InstanceStatusEvent{id: {{Code: ec2types.EventCodeSystemReboot, NotBefore: aws.Time(t0.Add(5 * time.Hour))}}}
	running := map[string]ec2types.InstanceStateName{id: ec2types.InstanceStateNameRunning}
	tests := []struct {
		name     string
		ann      string // the old annotation ("": a Record in rec)
		rec      Record
		cordoned bool
		before   *Record // a drain in the store already
		events   map[string][]ec2types.InstanceStatusEvent
		states   map[string]ec2types.InstanceStateName
		ec2Err   error
		wantErr  bool
		// want is the drain in the store after (nil: none); kept whether the key stays.
		want         *Record
		kept         bool
		wantCordoned bool
		warned       bool
	}{
		{name: "EC2 schedules an event: adopted, the cordon kept", rec: unfinished, cordoned: true, events: scheduled, states: running,
			want: &unfinished, wantCordoned: true},
		{name: "the instance stops: adopted", rec: unfinished, cordoned: true, states: map[string]ec2types.InstanceStateName{id: ec2types.InstanceStateNameStopping},
			want: &unfinished, wantCordoned: true},
		{name: "forged, saying the router cordoned: ended, and the cordon (an operator's, perhaps) stays", rec: unfinished, cordoned: true, states: running,
			wantCordoned: true, warned: true},
		{name: "forged on a node cordoned by someone else: ended, the cordon stays", rec: Record{EventID: "ev-1", Kind: "spot-interruption", Started: t0}, cordoned: true,
			states: running, wantCordoned: true, warned: true},
		{name: "forged on a node not cordoned: nothing cordoned, nothing evicted", rec: unfinished, states: running, warned: true},
		{name: "an event EC2 completed: ended", rec: unfinished, cordoned: true, states: running,
			events:       map[string][]ec2types.InstanceStatusEvent{id: {{Code: ec2types.EventCodeSystemReboot, NotBefore: aws.Time(t0), Description: aws.String("[Completed] done")}}},
			wantCordoned: true, warned: true},
		{name: "an instance EC2 does not know: ended", rec: unfinished, cordoned: true, states: map[string]ec2types.InstanceStateName{}, wantCordoned: true, warned: true},
		{name: "a close kept: not adopted, nothing undone", rec: Record{EventID: "c", Kind: "scheduled-change", Started: t0, Done: &t0, Closed: true}, cordoned: true,
			events: scheduled, states: running, wantCordoned: true},
		{name: "not JSON: removed, the cordon left", ann: "draining", cordoned: true, states: running, wantCordoned: true},
		{name: "a drain in the store already: kept as it is, the key removed", rec: unfinished, cordoned: true, before: &Record{EventID: "ev-0", Kind: "k", Started: t0, Cordoned: true},
			events: scheduled, states: running, want: &Record{EventID: "ev-0"}, wantCordoned: true},
		{name: "EC2 does not answer: nothing adopted, the key kept", rec: unfinished, cordoned: true, ec2Err: errors.New("throttled"), wantErr: true, kept: true, wantCordoned: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ann := tt.ann
			if ann == "" {
				ann = encode(tt.rec)
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ng-1", UID: "uid-1", Annotations: map[string]string{AnnotationNodeDrain: ann, "keep": "me"}},
				Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + id, Unschedulable: tt.cordoned}}
			c := adoptClient(t, n)
			if tt.before != nil {
				if err := record.NewStore(c, c).UpdateNode(context.Background(), n, func(m *record.Memory) (bool, error) {
					put(m, *tt.before)
					return true, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			rec := events.NewFakeRecorder(10)
			_, err := Adopt(context.Background(), c, c, &statusEC2{events: tt.events, states: tt.states, err: tt.ec2Err}, rec, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want an error %t", err, tt.wantErr)
			}
			after := &corev1.Node{}
			if err := c.Get(context.Background(), client.ObjectKey{Name: "ng-1"}, after); err != nil {
				t.Fatal(err)
			}
			if _, kept := after.Annotations[AnnotationNodeDrain]; kept != tt.kept {
				t.Errorf("old key kept %t, want %t", kept, tt.kept)
			}
			if after.Annotations["keep"] != "me" {
				t.Error("another annotation was removed")
			}
			if after.Spec.Unschedulable != tt.wantCordoned {
				t.Errorf("unschedulable %t, want %t", after.Spec.Unschedulable, tt.wantCordoned)
			}
			mem, err := record.Load(context.Background(), c, record.NodeRecordName("ng-1"))
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := Of(mem)
			switch {
			case err != nil:
				t.Fatal(err)
			case tt.want == nil && ok:
				t.Errorf("a drain was adopted: %+v", got)
			case tt.want != nil && (!ok || got.EventID != tt.want.EventID):
				t.Errorf("drain in the store %+v (ok=%t), want %s", got, ok, tt.want.EventID)
			}
			var warned bool
			select {
			case e := <-rec.Events:
				warned = strings.HasPrefix(e, "Warning "+ReasonNodeDrainNotAdopted)
			default:
			}
			if warned != tt.warned {
				t.Errorf("warned %t, want %t", warned, tt.warned)
			}
		})
	}
}

func adoptClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := record.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
}

// TestSummarizeNodeDrain: a Node's HealthRecord shows its drain: Draining while pods are
// evicted, a hold until the release once done, idle once only a close or a running is kept.
func TestSummarizeNodeDrain(t *testing.T) {
	release := t0.Add(3 * time.Hour)
	for _, tc := range []struct {
		name          string
		rec           Record
		phase, action string
		when          time.Time
	}{
		{"unfinished", Record{EventID: "e1", Kind: "spot-interruption", Started: t0}, record.PhaseDraining, record.ActionCordonDrain, t0},
		{"done, held for AWS's reboot", Record{EventID: "e1", Kind: "scheduled-change", Started: t0, Done: &done, Release: release}, record.PhaseIdle, record.ActionHoldUntilRelease, release},
		{"done, the instance ends", Record{EventID: "e1", Kind: "spot-interruption", Started: t0, Done: &done}, record.PhaseIdle, "", time.Time{}},
		{"a close kept", Record{EventID: "c", Kind: "scheduled-change", Started: t0, Done: &done, Closed: true}, record.PhaseIdle, "", time.Time{}},
		{"a running kept", Record{EventID: "r", Kind: "state-change", Started: t0, Done: &done, Running: true}, record.PhaseIdle, "", time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m record.Memory
			put(&m, tc.rec)
			s := record.Summarize(m)
			var when time.Time
			if s.When != nil {
				when = s.When.Time
			}
			if s.Phase != tc.phase || s.Action != tc.action || !when.Equal(tc.when) {
				t.Errorf("summary %+v, want phase %s, action %q, when %s", s, tc.phase, tc.action, tc.when)
			}
			if tc.phase == record.PhaseDraining && (s.Event != tc.rec.EventID || s.Kind != tc.rec.Kind) {
				t.Errorf("summary %+v names another event", s)
			}
		})
	}
}
