package intake

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/health-router/health-router/test/harness"
)

// TestFirstReceived: the first receipt SQS stamps on a message (the wait of an urgent state
// change EC2 does not answer about is measured from it), read as it comes, and zero when SQS
// did not say.
func TestFirstReceived(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 0, 0, 123e6, time.UTC)
	for _, tc := range []struct {
		name, value string
		want        time.Time
	}{
		{"milliseconds since the epoch", strconv.FormatInt(at.UnixMilli(), 10), at},
		{"absent", "", time.Time{}},
		{"not a number", "soon", time.Time{}},
		{"zero", "0", time.Time{}},
	} {
		m := sqstypes.Message{Attributes: map[string]string{}}
		if tc.value != "" {
			m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)] = tc.value
		}
		if got := firstReceived(m); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestFirstReceivedOnTheWire: the attributes the intake asks for bring the first receipt back
// from SQS (moto), and it stays the first one on a later receive of the same message.
func TestFirstReceivedOnTheWire(t *testing.T) {
	if testing.Short() {
		t.Skip("moto")
	}
	moto := harness.Moto(t)
	ctx := context.Background()
	client := sqs.NewFromConfig(harness.AWSConfig(nil), func(o *sqs.Options) { o.BaseEndpoint = aws.String(moto) })
	q, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("hr-intake")})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Second)
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: q.QueueUrl, MessageBody: aws.String(`{}`)}); err != nil {
		t.Fatal(err)
	}
	receive := func() time.Time {
		t.Helper()
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, MessageSystemAttributeNames: receiveAttributes})
		if err != nil || len(out.Messages) != 1 {
			t.Fatalf("receive: %v, %d messages", err, len(out.Messages))
		}
		// Visible again at once, as a message whose handling failed is after its backoff.
		if _, err := client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: q.QueueUrl, ReceiptHandle: out.Messages[0].ReceiptHandle}); err != nil {
			t.Fatal(err)
		}
		return firstReceived(out.Messages[0])
	}
	first := receive()
	if first.Before(before) || first.After(time.Now().Add(time.Second)) {
		t.Fatalf("first receipt %v, want about now", first)
	}
	time.Sleep(20 * time.Millisecond)
	if again := receive(); !again.Equal(first) {
		t.Errorf("a later receive says %v, the first said %v", again, first)
	}
}
