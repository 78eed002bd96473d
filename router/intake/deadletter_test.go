package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/harness"
)

// A message near SQS's size limit is dead-lettered whole when body and attributes fit, and
// truncated when they do not, with its original size and digest: before, SQS refused the dead
// letter (the attributes count in the limit), and the message churned until the redrive, which
// gives no reason. The SQS here counts attributes as SQS does.
func TestDeadLetterNearTheSizeLimit(t *testing.T) {
	for _, size := range []int{
		1000,                          // far below: whole
		harness.MaxMessageSize - 2048, // fits with the reason's attributes: whole
		harness.MaxMessageSize - 1,
		harness.MaxMessageSize, // the largest body SQS accepts with no attributes
	} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			srv := harness.NewSQS()
			t.Cleanup(srv.Close)
			ctx := context.Background()
			client := sqs.New(sqs.Options{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
				Credentials: credentials.NewStaticCredentialsProvider("k", "s", "")})
			queue := func(name string) string {
				// A receive leaves the message visible: a receive whose answer was lost on
				// the loopback (the SDK retries it) would otherwise hide it from the retry.
				out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name),
					Attributes: map[string]string{"VisibilityTimeout": "0"}})
				if err != nil {
					t.Fatal(err)
				}
				return aws.ToString(out.QueueUrl)
			}
			intakeURL, dlqURL := queue("intake"), queue("dlq")
			// Not an event: dead-lettered as malformed. Multi-byte runes, so that a cut
			// inside one would be caught.
			body := "{" + strings.Repeat("é", size)[:size-1]
			body = strings.ToValidUTF8(body, "")
			body += strings.Repeat("x", size-len(body))
			if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(intakeURL), MessageBody: aws.String(body)}); err != nil {
				t.Fatalf("sending the %d-byte message: %v", size, err)
			}
			got, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(intakeURL),
				MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			if len(got.Messages) != 1 {
				t.Fatalf("receive: %d messages, want 1", len(got.Messages))
			}
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
			m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
			in := New(Config{QueueURL: intakeURL, DeadLetterQueueURL: dlqURL}, client, nil, m, nil, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))

			if err := in.handle(ctx, got.Messages[0])(ctx); err != nil {
				t.Fatalf("dead-lettering a %d-byte body: %v", size, err)
			}

			dl, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlqURL), MessageAttributeNames: []string{"All"}})
			if err != nil {
				t.Fatalf("the dead-letter queue: %v", err)
			}
			if len(dl.Messages) != 1 {
				t.Fatalf("the dead-letter queue: %d messages, want 1", len(dl.Messages))
			}
			attrs := dl.Messages[0].MessageAttributes
			dead := aws.ToString(dl.Messages[0].Body)
			if aws.ToString(attrs[AttrReason].StringValue) != "malformed" {
				t.Errorf("reason = %q, want malformed", aws.ToString(attrs[AttrReason].StringValue))
			}
			sum := sha256.Sum256([]byte(body))
			truncated := dead != body
			switch {
			case size <= harness.MaxMessageSize-2048 && truncated:
				t.Errorf("a %d-byte body that fits was truncated to %d bytes", size, len(dead))
			case truncated:
				if !strings.HasPrefix(body, dead) {
					t.Errorf("the dead letter's body is not a prefix of the message's")
				}
				if aws.ToString(attrs[AttrOriginalSize].StringValue) != strconv.Itoa(size) {
					t.Errorf("%s = %q, want %d", AttrOriginalSize, aws.ToString(attrs[AttrOriginalSize].StringValue), size)
				}
				if aws.ToString(attrs[AttrBodySHA256].StringValue) != hex.EncodeToString(sum[:]) {
					t.Errorf("%s = %q, want the full body's", AttrBodySHA256, aws.ToString(attrs[AttrBodySHA256].StringValue))
				}
				if d := aws.ToString(attrs[AttrDetail].StringValue); !strings.Contains(d, "truncated") {
					t.Errorf("detail %q does not say the body was truncated", d)
				}
			}
			if left, _ := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(intakeURL)}); len(left.Messages) != 0 {
				t.Errorf("the message is still in the intake queue")
			}
		})
	}
}
