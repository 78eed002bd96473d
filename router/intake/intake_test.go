package intake

import (
	"context"
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

// recordingSQS records the calls the intake makes; moto cannot step time or count calls
// per message, so these unit tests use it (the integration suite runs on moto).
type recordingSQS struct {
	visibility []int32
	sends      []*sqs.SendMessageInput
	deleted    int
}

func (f *recordingSQS) ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	return &sqs.ReceiveMessageOutput{}, nil
}

func (f *recordingSQS) DeleteMessageBatch(_ context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	f.deleted += len(in.Entries)
	return &sqs.DeleteMessageBatchOutput{}, nil
}

func (f *recordingSQS) ChangeMessageVisibility(_ context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	f.visibility = append(f.visibility, in.VisibilityTimeout)
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

func (f *recordingSQS) SendMessage(_ context.Context, in *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	f.sends = append(f.sends, in)
	return &sqs.SendMessageOutput{MessageId: aws.String("new")}, nil
}

func newTestIntake(t *testing.T) (*Intake, *recordingSQS, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	f := &recordingSQS{}
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	in := New(Config{QueueURL: "intake", DeadLetterQueueURL: "dlq", HandleTimeout: 2 * time.Minute}, f, nil, m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return in, f, clk
}

func message(sent time.Time, receives int) sqstypes.Message {
	return messageWithBody(sent, receives, `{"id":"e1"}`)
}

func messageWithBody(sent time.Time, receives int, body string) sqstypes.Message {
	return sqstypes.Message{MessageId: aws.String("m1"), ReceiptHandle: aws.String("r1"), Body: aws.String(body), Attributes: map[string]string{
		string(sqstypes.MessageSystemAttributeNameSentTimestamp):           strconv.FormatInt(sent.UnixMilli(), 10),
		string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount): strconv.Itoa(receives),
	}}
}

// TestHandleRejects: what the router cannot act on is dead-lettered with its reason and
// deleted, never retried and never silently dropped.
func TestHandleRejects(t *testing.T) {
	for _, tt := range []struct {
		body, reason string
	}{
		{"{not json", "malformed"},
		{`{"version":"0","id":"x1","detail-type":"EC2 Instance-terminate Lifecycle Action","source":"aws.autoscaling","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{}}`, "unknown-kind"},
		{"", "malformed"},
	} {
		in, f, clk := newTestIntake(t)
		if err := in.handle(context.Background(), messageWithBody(clk.Now(), 1, tt.body))(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(f.sends) != 1 || f.deleted != 1 || aws.ToString(f.sends[0].MessageAttributes[AttrReason].StringValue) != tt.reason {
			t.Errorf("%q: sent %d, deleted %d, attributes %v", tt.body, len(f.sends), f.deleted, f.sends)
		}
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
