package intake

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
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

// TestHandleRefusesInternalKinds: the router's own kind (source healthrouter.io, the finding
// its instance-status poller builds) never comes from the queue: one received there is forged
// or misrouted, and anyone who can send to the queue could otherwise report instances impaired.
// It is dead-lettered with its reason and deleted, never handed to the pipeline (nil here: a
// body that reaches it panics), even from the router's own account and region; the poller's
// and the deferral records' path, event.Parse, still reads the same body.
func TestHandleRefusesInternalKinds(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	findings := map[string]event.StatusFinding{
		"impaired": {InstanceID: "i-0a1b2c3d4e5f60718", Finding: event.FindingImpaired, Time: now, Account: "111122223333", Region: "eu-west-1",
			InstanceStatus: "impaired", SystemStatus: "ok", ImpairedSince: now.Add(-3 * time.Minute)},
		"recovered": {InstanceID: "i-0a1b2c3d4e5f60718", Finding: event.FindingRecovered, Time: now, Account: "111122223333", Region: "eu-west-1",
			InstanceStatus: "ok", SystemStatus: "ok"},
		"scheduled": {InstanceID: "i-0a1b2c3d4e5f60718", Finding: event.FindingScheduledEvent, Time: now, Account: "111122223333", Region: "eu-west-1",
			Code: event.ScheduledSystemReboot, EventID: "instance-event-0d59937288b749b32", NotBefore: now.Add(72 * time.Hour)},
	}
	for name, f := range findings {
		body, built, err := f.Event() // the poller's construction
		if err != nil {
			t.Fatalf("%s: the poller's finding does not build: %v", name, err)
		}
		if again, err := event.Parse(body); err != nil || again.ID != built.ID || again.Kind != built.Kind {
			t.Errorf("%s: event.Parse, as Redecide reads a record, = %s %s, %v; want %s %s", name, again.ID, again.Kind, err, built.ID, built.Kind)
		}

		in, sqsFake, clk := newTestIntake(t)
		in.cfg.Account, in.cfg.Region = f.Account, f.Region
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: the queued finding reached the pipeline: %v", name, r)
				}
			}()
			if err := in.handle(context.Background(), messageWithBody(clk.Now(), 1, string(body)))(context.Background()); err != nil {
				t.Fatal(err)
			}
		}()
		if len(sqsFake.sends) != 1 || sqsFake.deleted != 1 {
			t.Errorf("%s: dead-lettered %d, deleted %d; want 1 and 1", name, len(sqsFake.sends), sqsFake.deleted)
			continue
		}
		a := sqsFake.sends[0].MessageAttributes
		if reason, detail := aws.ToString(a[AttrReason].StringValue), aws.ToString(a[AttrDetail].StringValue); reason != string(event.ReasonUnknownKind) || !strings.Contains(detail, event.SourceHealthRouter) {
			t.Errorf("%s: dead-lettered with reason %q, detail %q; want %s naming %s", name, reason, detail, event.ReasonUnknownKind, event.SourceHealthRouter)
		}
		if got := testutil.ToFloat64(in.metrics.DeadLettered.WithLabelValues(string(event.ReasonUnknownKind))); got != 1 {
			t.Errorf("%s: dead-lettered{reason=unknown-kind} = %g, want 1", name, got)
		}
	}
}
