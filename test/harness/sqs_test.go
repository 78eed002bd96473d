package harness

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

func newSQSClient(t *testing.T) (*SQS, *sqs.Client, string) {
	t.Helper()
	s := NewSQS()
	t.Cleanup(s.Close)
	c := sqs.NewFromConfig(AWSConfig(nil), func(o *sqs.Options) { o.BaseEndpoint = aws.String(s.URL) })
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String("intake"),
		Attributes: map[string]string{"VisibilityTimeout": "30"}})
	if err != nil {
		t.Fatal(err)
	}
	return s, c, aws.ToString(out.QueueUrl)
}

func depth(t *testing.T, c *sqs.Client, url string) (visible, inFlight, delayed int) {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		t.Fatal(err)
	}
	n := func(k string) int { v, _ := strconv.Atoi(out.Attributes[k]); return v }
	return n("ApproximateNumberOfMessages"), n("ApproximateNumberOfMessagesNotVisible"), n("ApproximateNumberOfMessagesDelayed")
}

func receive(t *testing.T, c *sqs.Client, url string, max, wait int32, vis *int32) []sqstypes.Message {
	t.Helper()
	out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: max,
		WaitTimeSeconds: wait, VisibilityTimeout: aws.ToInt32(vis),
		MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameApproximateReceiveCount},
		MessageAttributeNames:       []string{"All"}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Messages
}

// The SDK's own checks (body MD5s of sends and receives) pass, and messages flow through
// send, receive (hidden for the visibility timeout), and delete.
func TestSQSSendReceiveDelete(t *testing.T) {
	ctx := context.Background()
	_, c, url := newSQSClient(t)
	var entries []sqstypes.SendMessageBatchRequestEntry
	for i := range 12 {
		if i < 10 {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(fmt.Sprintf("m%d", i))})
		}
	}
	out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	if err != nil || len(out.Successful) != 10 || len(out.Failed) != 0 {
		t.Fatalf("SendMessageBatch: %v %+v", err, out)
	}
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("m10"),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{"reason": {DataType: aws.String("String"), StringValue: aws.String("malformed")}}}); err != nil {
		t.Fatal(err)
	}
	if v, f, _ := depth(t, c, url); v != 11 || f != 0 {
		t.Fatalf("depth %d visible %d in flight, want 11, 0", v, f)
	}
	first := receive(t, c, url, 10, 0, nil)
	if len(first) != 10 || aws.ToString(first[0].Body) != "m0" || first[0].Attributes["ApproximateReceiveCount"] != "1" {
		t.Fatalf("first receive: %d messages, first %+v", len(first), first[0])
	}
	rest := receive(t, c, url, 10, 0, nil)
	if len(rest) != 1 || aws.ToString(rest[0].MessageAttributes["reason"].StringValue) != "malformed" {
		t.Fatalf("second receive: %+v, want m10 with its attribute", rest)
	}
	if got := receive(t, c, url, 10, 0, nil); len(got) != 0 {
		t.Fatalf("in-flight messages received again: %d", len(got))
	}
	var del []sqstypes.DeleteMessageBatchRequestEntry
	for i, m := range first {
		del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle})
	}
	del[9].ReceiptHandle = aws.String("not-a-handle")
	dout, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del})
	if err != nil || len(dout.Successful) != 9 || len(dout.Failed) != 1 || aws.ToString(dout.Failed[0].Code) != "ReceiptHandleIsInvalid" {
		t.Fatalf("DeleteMessageBatch: %v %+v", err, dout)
	}
	// Deleting again succeeds, as SQS's does.
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: first[0].ReceiptHandle}); err != nil {
		t.Fatalf("deleting a deleted message: %v", err)
	}
	if v, f, _ := depth(t, c, url); v != 0 || f != 2 {
		t.Fatalf("depth %d visible %d in flight, want 0, 2", v, f)
	}
}

// A visibility change to 0 makes a message receivable at once, with a new receipt handle and
// its receive count up; the old handle has expired for visibility changes but still deletes.
func TestSQSVisibility(t *testing.T) {
	ctx := context.Background()
	_, c, url := newSQSClient(t)
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("x")}); err != nil {
		t.Fatal(err)
	}
	m := receive(t, c, url, 1, 0, aws.Int32(60))[0]
	if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
		t.Fatal(err)
	}
	again := receive(t, c, url, 1, 0, nil)
	if len(again) != 1 || aws.ToString(again[0].ReceiptHandle) == aws.ToString(m.ReceiptHandle) || again[0].Attributes["ApproximateReceiveCount"] != "2" {
		t.Fatalf("after a visibility of 0: %+v", again)
	}
	_, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 10})
	if code := apiCode(err); code != "InvalidParameterValue" {
		t.Fatalf("visibility change with an expired handle: %v (code %q), want InvalidParameterValue", err, code)
	}
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
		t.Fatalf("delete with an earlier handle: %v", err)
	}
	if v, f, _ := depth(t, c, url); v+f != 0 {
		t.Fatalf("queue not empty after the delete: %d visible, %d in flight", v, f)
	}
	// A short visibility ends by itself.
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("y")}); err != nil {
		t.Fatal(err)
	}
	receive(t, c, url, 1, 0, aws.Int32(1))
	start := time.Now()
	if got := receive(t, c, url, 1, 5, nil); len(got) != 1 || time.Since(start) > 3*time.Second {
		t.Fatalf("a long poll did not get the message whose visibility ended: %d after %s", len(got), time.Since(start))
	}
}

// A long poll returns as soon as a message is sent, and empty at its end otherwise.
func TestSQSLongPoll(t *testing.T) {
	ctx := context.Background()
	_, c, url := newSQSClient(t)
	start := time.Now()
	if got := receive(t, c, url, 10, 1, nil); len(got) != 0 || time.Since(start) < 900*time.Millisecond {
		t.Fatalf("an empty long poll of 1 s returned %d after %s", len(got), time.Since(start))
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, _ = c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("late")})
	}()
	start = time.Now()
	got := receive(t, c, url, 10, 20, nil)
	if len(got) != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("the long poll got %d after %s, want the message sent after 200 ms", len(got), time.Since(start))
	}
}

func TestSQSRefusals(t *testing.T) {
	ctx := context.Background()
	_, c, url := newSQSClient(t)
	tests := []struct {
		name string
		call func() error
		code string
	}{
		{"unknown queue", func() error {
			_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url + "-missing"), MessageBody: aws.String("x")})
			return err
		}, "AWS.SimpleQueueService.NonExistentQueue"},
		{"unknown receipt handle", func() error {
			_, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: aws.String("nope")})
			return err
		}, "ReceiptHandleIsInvalid"},
		{"eleven entries", func() error {
			var e []sqstypes.SendMessageBatchRequestEntry
			for i := range 11 {
				e = append(e, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String("x")})
			}
			_, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: e})
			return err
		}, "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"},
		{"visibility of a message not in flight", func() error {
			if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("v")}); err != nil {
				return err
			}
			m := receive(t, c, url, 1, 0, nil)[0]
			if _, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}); err != nil {
				return err
			}
			_, err := c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 5})
			return err
		}, "AWS.SimpleQueueService.MessageNotInflight"},
		{"body and attributes over the size limit", func() error {
			_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(strings.Repeat("x", MaxMessageSize-10)),
				MessageAttributes: map[string]sqstypes.MessageAttributeValue{"reason": {DataType: aws.String("String"), StringValue: aws.String("malformed")}}})
			return err
		}, "InvalidParameterValue"},
		{"wait over 20 s", func() error {
			_, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), WaitTimeSeconds: 21})
			return err
		}, "InvalidParameterValue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if code := apiCode(err); code != tt.code {
				t.Fatalf("error %v (code %q), want code %q", err, code, tt.code)
			}
		})
	}
	var missing *sqstypes.QueueDoesNotExist
	_, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("missing")})
	if !errors.As(err, &missing) {
		t.Fatalf("GetQueueUrl of a missing queue: %v, want the SDK's QueueDoesNotExist", err)
	}
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// OnSend sees every accepted message, single and batched, with its queue and body, and none
// that SQS refused.
func TestSQSOnSend(t *testing.T) {
	ctx := context.Background()
	s, c, url := newSQSClient(t)
	var seen []string
	s.OnSend(func(queue, body string, at time.Time) {
		if at.IsZero() {
			t.Errorf("message %q seen with no time", body)
		}
		seen = append(seen, queue+":"+body)
	})
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("one")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: []sqstypes.SendMessageBatchRequestEntry{
		{Id: aws.String("a"), MessageBody: aws.String("two")}, {Id: aws.String("b"), MessageBody: aws.String("three")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("late"), DelaySeconds: 901}); err == nil {
		t.Fatal("a delay over 900 s was accepted")
	}
	want := "intake:one intake:two intake:three"
	if got := strings.Join(seen, " "); got != want {
		t.Errorf("seen %q, want %q", got, want)
	}
}
