package intake

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
)

// limitedSQS records calls and enforces SQS's rule that a message is hidden at most 12
// hours counted from its receive (AWS) and from its send (moto's reading) — moto does not
// let a test step time, so this part needs a fake.
type limitedSQS struct {
	clock      *clocktesting.FakeClock
	received   time.Time
	sent       time.Time
	visibility []int32
	sends      []*sqs.SendMessageInput
	deleted    int
}

func (f *limitedSQS) ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	return &sqs.ReceiveMessageOutput{}, nil
}

func (f *limitedSQS) DeleteMessage(context.Context, *sqs.DeleteMessageInput, ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error) {
	f.deleted++
	return &sqs.DeleteMessageOutput{}, nil
}

func (f *limitedSQS) ChangeMessageVisibility(_ context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	end := time.Duration(in.VisibilityTimeout) * time.Second
	if f.clock.Since(f.received)+end > 12*time.Hour || (!f.sent.IsZero() && f.clock.Since(f.sent)+end > 12*time.Hour) {
		return nil, fmt.Errorf("InvalidParameterValue: Total VisibilityTimeout for the message is beyond the limit [43200 seconds]")
	}
	f.visibility = append(f.visibility, in.VisibilityTimeout)
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

func (f *limitedSQS) SendMessage(_ context.Context, in *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	f.sends = append(f.sends, in)
	return &sqs.SendMessageOutput{MessageId: aws.String("new")}, nil
}

func (f *limitedSQS) GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	return &sqs.GetQueueAttributesOutput{Attributes: map[string]string{"MessageRetentionPeriod": "1209600"}}, nil
}

func newTestIntake(t *testing.T) (*Intake, *limitedSQS, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	f := &limitedSQS{clock: clk, received: clk.Now()}
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	in := New(Config{QueueURL: "intake", DeadLetterQueueURL: "dlq", HandleTimeout: 2 * time.Minute}, f, nil, nil, m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
	in.retention = 14 * 24 * time.Hour
	return in, f, clk
}

func message(sent time.Time, receives int) sqstypes.Message {
	return sqstypes.Message{MessageId: aws.String("m1"), ReceiptHandle: aws.String("r1"), Body: aws.String(`{"id":"e1"}`), Attributes: map[string]string{
		string(sqstypes.MessageSystemAttributeNameSentTimestamp):           strconv.FormatInt(sent.UnixMilli(), 10),
		string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount): strconv.Itoa(receives),
	}}
}

func TestDeferLongerThanTwelveHoursAfterSlowWork(t *testing.T) {
	in, f, clk := newTestIntake(t)
	m := message(clk.Now(), 1)
	clk.Step(90 * time.Second) // the message was worked on for 90 s (slow API, checks)
	if err := in.deferMessage(context.Background(), m, clk.Now().Add(10*24*time.Hour)); err != nil {
		t.Fatalf("deferring ten days: %v", err)
	}
	if len(f.visibility) != 1 || time.Duration(f.visibility[0])*time.Second > 12*time.Hour-90*time.Second {
		t.Errorf("visibility steps %v", f.visibility)
	}
	if f.deleted != 0 || len(f.sends) != 0 {
		t.Error("a deferral within retention was re-sent")
	}
}

func TestDeferOfAMessageSentLongAgo(t *testing.T) {
	// Sent 11 hours ago (it waited in the queue): the step ends 12 hours after the send.
	in, f, clk := newTestIntake(t)
	f.sent = clk.Now().Add(-11 * time.Hour)
	if err := in.deferMessage(context.Background(), message(f.sent, 1), clk.Now().Add(3*24*time.Hour)); err != nil {
		t.Fatalf("deferring: %v", err)
	}
	if len(f.visibility) != 1 || len(f.sends) != 0 {
		t.Fatalf("visibility %v, re-sent %d", f.visibility, len(f.sends))
	}
	// Sent 11 h 55 m ago: no step is left; the message is re-sent as a new one.
	in, f, clk = newTestIntake(t)
	f.sent = clk.Now().Add(-(11*time.Hour + 55*time.Minute))
	if err := in.deferMessage(context.Background(), message(f.sent, 1), clk.Now().Add(3*24*time.Hour)); err != nil {
		t.Fatalf("deferring: %v", err)
	}
	if len(f.visibility) != 0 || len(f.sends) != 1 || f.deleted != 1 {
		t.Errorf("visibility %v, re-sent %d, deleted %d", f.visibility, len(f.sends), f.deleted)
	}
}

func TestDeferShort(t *testing.T) {
	in, f, clk := newTestIntake(t)
	if err := in.deferMessage(context.Background(), message(clk.Now(), 1), clk.Now().Add(5*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if len(f.visibility) != 1 || f.visibility[0] != 300 {
		t.Errorf("visibility %v, want [300]", f.visibility)
	}
}

func TestDeferReenqueuesBeforeRetentionOrRedrive(t *testing.T) {
	// Sent 13 days 20 hours ago: the next 12-hour step would outlive 14 days of retention.
	in, f, clk := newTestIntake(t)
	if err := in.deferMessage(context.Background(), message(clk.Now().Add(-(13*24+20)*time.Hour), 30), clk.Now().Add(3*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if len(f.sends) != 1 || f.deleted != 1 || aws.ToString(f.sends[0].QueueUrl) != "intake" || aws.ToString(f.sends[0].MessageBody) != `{"id":"e1"}` {
		t.Fatalf("not re-sent as a new message: sent %d, deleted %d", len(f.sends), f.deleted)
	}
	if f.sends[0].DelaySeconds != maxDelaySeconds || aws.ToString(f.sends[0].MessageAttributes[AttrSourceMessageID].StringValue) != "m1" {
		t.Errorf("re-sent message: delay %d, attributes %v", f.sends[0].DelaySeconds, f.sends[0].MessageAttributes)
	}
	// Received 40 times (drain pacing rechecks): re-sent before SQS's redrive limit.
	in, f, clk = newTestIntake(t)
	if err := in.deferMessage(context.Background(), message(clk.Now(), reenqueueAfterReceives), clk.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if len(f.sends) != 1 || f.deleted != 1 {
		t.Errorf("not re-sent after %d receives", reenqueueAfterReceives)
	}
}

func TestDeadLetterCarriesTheReason(t *testing.T) {
	in, f, clk := newTestIntake(t)
	err := in.deadLetter(context.Background(), message(clk.Now(), 3), &event.RejectError{Reason: event.ReasonMalformed, Detail: "not an EventBridge event"})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.sends) != 1 || aws.ToString(f.sends[0].QueueUrl) != "dlq" || f.deleted != 1 {
		t.Fatalf("dead letter: sent %d, deleted %d", len(f.sends), f.deleted)
	}
	a := f.sends[0].MessageAttributes
	if aws.ToString(a[AttrReason].StringValue) != "malformed" || aws.ToString(a[AttrDetail].StringValue) != "not an EventBridge event" || aws.ToString(a[AttrReceiveCount].StringValue) != "3" {
		t.Errorf("attributes %v", a)
	}
	if got := testutil.ToFloat64(in.metrics.DeadLettered.WithLabelValues("malformed")); got != 1 {
		t.Errorf("dead-lettered metric %v", got)
	}
}

func TestRetryBacksOffWithReceives(t *testing.T) {
	var first, later time.Duration
	for i := 0; i < 20; i++ { // jittered: compare the largest of several draws
		in, f, clk := newTestIntake(t)
		_ = in.retry(message(clk.Now(), 1))(context.Background())
		_ = in.retry(message(clk.Now(), 8))(context.Background())
		first, later = max(first, time.Duration(f.visibility[0])*time.Second), max(later, time.Duration(f.visibility[1])*time.Second)
	}
	if first > 4*time.Second || later <= first || later > maxRetryBackoff {
		t.Errorf("backoff after 1 receive %s, after 8 receives %s", first, later)
	}
}
