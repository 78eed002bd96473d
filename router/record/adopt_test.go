package record

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// scheduledEC2 answers DescribeInstanceStatus with the events it holds per instance.
type scheduledEC2 struct {
	events map[string][]ec2types.InstanceStatusEvent
	err    error
	calls  int
}

func (f *scheduledEC2) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		out.InstanceStatuses = append(out.InstanceStatuses, ec2types.InstanceStatus{InstanceId: aws.String(id), Events: f.events[id]})
	}
	return out, nil
}

// TestAdopt: an upgrade adopts from the old annotations only what EC2 confirms (a deferral of
// a maintenance it still schedules, due at once), never a stamp or a tombstone, and removes
// the old keys; a NodeClaim with a HealthRecord keeps it as it is; an EC2 that does not answer
// adopts nothing and keeps the keys.
func TestAdopt(t *testing.T) {
	start := t0.Add(72 * time.Hour)
	match := "instance-retirement@" + start.UTC().Format(time.RFC3339)
	deferral := Record{EventID: "h1", Key: "arn:1", Kind: event.KindScheduledChange, State: StateDeferred, Until: start.Add(-time.Hour), Hold: policy.HoldWindow, Match: match}
	old := func(name, id string, recs []Record, stamp string) *karpv1.NodeClaim {
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"keep": "me"}},
			Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + id}}
		if recs != nil {
			v, err := Encode(Set{Records: recs})
			if err != nil {
				t.Fatal(err)
			}
			nc.Annotations[Annotation] = v
		}
		if stamp != "" {
			nc.Annotations[AnnotationDrainSignalled] = stamp
		}
		return nc
	}
	scheduled := []ec2types.InstanceStatusEvent{{Code: ec2types.EventCodeInstanceRetirement, NotBefore: aws.Time(start), InstanceEventId: aws.String("instance-event-1")}}
	tests := []struct {
		name    string
		claim   *karpv1.NodeClaim
		before  *HealthRecord
		ec2     map[string][]ec2types.InstanceStatusEvent
		ec2Err  error
		wantErr bool
		// want is the memory after (nil: no HealthRecord); kept whether the old keys stay.
		want *Memory
		kept bool
	}{
		{name: "a deferral EC2 still schedules: adopted, due at once", claim: old("a", "i-1", []Record{deferral}, ""),
			ec2: map[string][]ec2types.InstanceStatusEvent{"i-1": scheduled}, want: &Memory{Records: []Record{{EventID: "h1", Until: t0}}}},
		{name: "a deferral EC2 no longer shows: ended", claim: old("a", "i-1", []Record{deferral}, ""), ec2: map[string][]ec2types.InstanceStatusEvent{}},
		{name: "a deferral of a maintenance EC2 completed: ended", claim: old("a", "i-1", []Record{deferral}, ""),
			ec2: map[string][]ec2types.InstanceStatusEvent{"i-1": {{Code: ec2types.EventCodeInstanceRetirement, NotBefore: aws.Time(start), Description: aws.String("[Completed] retired")}}}},
		{name: "a drain stamp: never adopted (it would delete the NodeClaim)", claim: old("a", "i-1", nil, "spot-1 2026-11-21T12:00:00Z forward"),
			ec2: map[string][]ec2types.InstanceStatusEvent{"i-1": scheduled}},
		{name: "a tombstone: not adopted (it could hide a real event)", claim: old("a", "i-1", []Record{{EventID: "c", Key: "arn:1", State: StateClosed, Match: match}}, ""),
			ec2: map[string][]ec2types.InstanceStatusEvent{"i-1": scheduled}},
		{name: "a Spot warning recorded: not adopted", claim: old("a", "i-1", []Record{{EventID: "s", Key: "s", Kind: event.KindSpotInterruption, State: StateDeferred, Until: t0}}, ""),
			ec2: map[string][]ec2types.InstanceStatusEvent{"i-1": scheduled}},
		{name: "a HealthRecord already: kept as it is, the keys removed", claim: old("a", "i-1", []Record{deferral}, "x 2026-11-21T12:00:00Z forward"),
			before: &HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: HealthRecordStatus{Version: Version, Memory: Memory{Running: t0}}},
			ec2:    map[string][]ec2types.InstanceStatusEvent{"i-1": scheduled}, want: &Memory{Running: t0}},
		{name: "EC2 does not answer: nothing adopted, the keys kept", claim: old("a", "i-1", []Record{deferral}, ""), ec2Err: errors.New("throttled"), wantErr: true, kept: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []client.Object{tt.claim}
			if tt.before != nil {
				objs = append(objs, tt.before)
			}
			s := storeClient(t, interceptor.Funcs{}, objs...)
			api := &scheduledEC2{events: tt.ec2, err: tt.ec2Err}
			_, err := Adopt(context.Background(), s, s, api, clocktesting.NewFakeClock(t0), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, want an error %t", err, tt.wantErr)
			}
			nc := &karpv1.NodeClaim{}
			if err := s.Get(context.Background(), client.ObjectKey{Name: "a"}, nc); err != nil {
				t.Fatal(err)
			}
			_, hasRecords := nc.Annotations[Annotation]
			_, hasStamp := nc.Annotations[AnnotationDrainSignalled]
			if kept := hasRecords || hasStamp; kept != tt.kept {
				t.Errorf("old keys kept %t, want %t (%v)", kept, tt.kept, nc.Annotations)
			}
			if nc.Annotations["keep"] != "me" {
				t.Error("another annotation was removed")
			}
			hr := &HealthRecord{}
			err = s.Get(context.Background(), client.ObjectKey{Name: "a"}, hr)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("a HealthRecord was made: %+v", hr.Status)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := hr.Status.Memory
			if got.Drain != nil || !got.Running.Equal(tt.want.Running) || len(got.Records) != len(tt.want.Records) {
				t.Fatalf("memory %+v, want %+v", got, tt.want)
			}
			for i, r := range tt.want.Records {
				if g := got.Records[i]; g.EventID != r.EventID || !g.Until.Equal(r.Until) || !g.Active() || g.Hold != "" {
					t.Errorf("record %+v, want %s due at %s", g, r.EventID, r.Until)
				}
			}
		})
	}
}
