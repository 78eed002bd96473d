package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/health-router/health-router/test/harness"
)

// waitQuiet, on moto, returns only once nothing is waiting and nothing is in flight: a
// message received and not yet deleted (ApproximateNumberOfMessagesNotVisible) keeps the
// queue busy as much as one waiting; and it gives up, with the counts, on a queue that does
// not quieten.
func TestWaitQuiet(t *testing.T) {
	if testing.Short() {
		t.Skip("moto")
	}
	ctx := context.Background()
	moto := harness.Moto(t)
	c := sqs.NewFromConfig(harness.AWSConfig(nil), func(o *sqs.Options) { o.BaseEndpoint = aws.String(moto) })
	q, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("quiet")})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(q.QueueUrl)
	send := func() {
		if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: q.QueueUrl, MessageBody: aws.String("{}")}); err != nil {
			t.Fatal(err)
		}
	}

	if waited, err := waitQuiet(ctx, c, url, 300*time.Millisecond, 50*time.Millisecond, 10*time.Second); err != nil || waited > 2*time.Second {
		t.Fatalf("an empty queue: waited %s, %v", waited, err)
	}

	// One message waiting, then received (in flight for 1.5 s), then deleted.
	send()
	const inFlight = 1500 * time.Millisecond
	deletedAt := make(chan time.Time, 1)
	go func() {
		defer close(deletedAt)
		time.Sleep(500 * time.Millisecond)
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, VisibilityTimeout: 30})
		if err != nil || len(out.Messages) != 1 {
			t.Errorf("receive: %v", err)
			return
		}
		time.Sleep(inFlight)
		deletedAt <- time.Now()
		if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: q.QueueUrl, ReceiptHandle: out.Messages[0].ReceiptHandle}); err != nil {
			t.Error(err)
		}
	}()
	start := time.Now()
	waited, err := waitQuiet(ctx, c, url, 300*time.Millisecond, 50*time.Millisecond, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	deleted := <-deletedAt
	if deleted.IsZero() || time.Since(deleted) < 300*time.Millisecond || waited < 2*time.Second {
		t.Fatalf("returned after %s, while the message was waiting or in flight (deleted %s after the start)", waited, deleted.Sub(start))
	}

	// A message nobody receives: not quiet, and the error says what is left.
	send()
	_, err = waitQuiet(ctx, c, url, 300*time.Millisecond, 50*time.Millisecond, time.Second)
	if err == nil || !strings.Contains(err.Error(), "1 waiting, 0 in flight") {
		t.Fatalf("a queue with a message waiting: %v", err)
	}
}
