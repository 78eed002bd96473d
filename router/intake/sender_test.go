package intake

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/harness"
)

// With --sender-ids, a message whose SenderId is not listed is dead-lettered as
// foreign-sender, whatever its body; a listed one goes on to the parser. A role's ID (AROA...)
// lists every session of the role (SenderId is <role ID>:<session>).
func TestSenderIDs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ids    []string
		sender string
		want   string
	}{
		{"not listed", []string{"AIDAEVENTBRIDGE", "AROADISPATCHER"}, "AROAINTRUDER:session", "foreign-sender"},
		{"no sender", []string{"AIDAEVENTBRIDGE"}, "", "foreign-sender"},
		{"a user listed", []string{"AIDAEVENTBRIDGE", "AROADISPATCHER"}, "AIDAEVENTBRIDGE", "malformed"},
		{"a role's session", []string{"AIDAEVENTBRIDGE", "AROADISPATCHER"}, "AROADISPATCHER:hr-prod-dispatcher", "malformed"},
		{"one session listed, another sends", []string{"AROADISPATCHER:one"}, "AROADISPATCHER:other", "foreign-sender"},
		{"a prefix is not the role", []string{"AROADISP"}, "AROADISPATCHER:s", "foreign-sender"},
		{"off", nil, "AROAINTRUDER:session", "malformed"},
	} {
		in, f, clk := newTestIntake(t)
		in.cfg.SenderIDs = tc.ids
		m := messageWithBody(clk.Now(), 1, "{not json")
		if tc.sender != "" {
			m.Attributes[string(sqstypes.MessageSystemAttributeNameSenderId)] = tc.sender
		}
		if err := in.handle(context.Background(), m)(context.Background()); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(f.sends) != 1 {
			t.Fatalf("%s: %d dead letters, want 1", tc.name, len(f.sends))
		}
		a := f.sends[0].MessageAttributes
		if got := aws.ToString(a[AttrReason].StringValue); got != tc.want {
			t.Errorf("%s: reason %q, want %q", tc.name, got, tc.want)
		}
		if tc.want == "foreign-sender" && tc.sender != "" && !strings.Contains(aws.ToString(a[AttrDetail].StringValue), tc.sender) {
			t.Errorf("%s: detail %q does not name the sender", tc.name, aws.ToString(a[AttrDetail].StringValue))
		}
	}
}

// The intake asks SQS for SenderId: on an SQS that serves it, a listed sender passes.
func TestSenderIDIsRequested(t *testing.T) {
	srv := harness.NewSQS()
	t.Cleanup(srv.Close)
	ctx := context.Background()
	client := sqs.New(sqs.Options{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""), RetryMaxAttempts: 1})
	url := func(name string) string {
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.QueueUrl)
	}
	intakeURL, dlqURL := url("intake"), url("dlq")
	if _, err := client.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(intakeURL), MessageBody: aws.String("{not json")}); err != nil {
		t.Fatal(err)
	}
	m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
	in := New(Config{QueueURL: intakeURL, DeadLetterQueueURL: dlqURL, WaitTime: time.Second, SenderIDs: []string{"AIDAHEALTHROUTERTEST"}},
		client, nil, m, nil, clock.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	run, cancel := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- in.Start(run) }()
	var dead []sqstypes.Message
	waitFor(t, func() bool {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlqURL), MessageAttributeNames: []string{"All"}})
		if err == nil {
			dead = append(dead, out.Messages...)
		}
		return len(dead) > 0
	})
	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := aws.ToString(dead[0].MessageAttributes[AttrReason].StringValue); got != "malformed" {
		t.Errorf("reason %q, want malformed: the listed sender was not recognised (was SenderId asked for?)", got)
	}
}
