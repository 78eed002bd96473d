// Package intake is the SQS loop: receive (long poll, batches of up to 10, from one or more
// receive loops sharing the workers), keep messages invisible while they are worked on
// (heartbeat), decide and act through the pipeline, and only then delete (in batches). A
// deferred instance is recorded on its NodeClaim (router/deferral holds it from there), so a
// message is deleted as soon as every instance's outcome is recorded;
// a poison message goes to the dead-letter queue with its reason; a transient failure leaves
// the message for redelivery with backoff, and the redelivery skips the instances recorded
// meanwhile. Nothing is dropped.
package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

const (
	// maxRetryBackoff caps the redelivery delay of a message that failed transiently.
	maxRetryBackoff = 5 * time.Minute
	// perInstanceBudget is added to the handle timeout for each instance an event names: an
	// AZ-wide maintenance naming 4,000 instances gets the time its writes take under the
	// client's rate limit. A retry after a timeout skips what was recorded, so even a
	// budget too short makes progress.
	perInstanceBudget = 25 * time.Millisecond
)

// Message attribute names on dead-lettered and re-sent messages.
const (
	AttrReason          = "healthrouter.reason"
	AttrDetail          = "healthrouter.detail"
	AttrSourceMessageID = "healthrouter.source-message-id"
	AttrReceiveCount    = "healthrouter.receive-count"
	// AttrOriginalSize and AttrBodySHA256 are set on a dead letter whose body was truncated
	// to fit SQS's size limit: the size and the SHA-256 (hex) of the body as received.
	AttrOriginalSize = "healthrouter.original-size"
	AttrBodySHA256   = "healthrouter.body-sha256"
)

// maxMessageSize is SQS's limit of one message, its body and its attributes together: the
// MaximumMessageSize of the Terraform module's queues (the AWS provider's default). SQS
// allows more on a queue configured for it, never less, so a dead letter within it fits.
const maxMessageSize = 256 * 1024

// sqsAPI is the part of SQS the intake uses.
type sqsAPI interface {
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// Config is what the intake needs to know of its queues and its cluster.
type Config struct {
	QueueURL           string
	DeadLetterQueueURL string
	// Account and Region, when set, reject events from elsewhere as foreign.
	Account, Region string
	// SenderIDs, when set, are the only senders whose messages the intake acts on (SQS's
	// SenderId: an IAM user's ID, or a role's ID, AROA..., which stands for every session of
	// the role); a message of another sender is dead-lettered as foreign-sender.
	SenderIDs []string
	// Workers is how many messages are worked on at once.
	Workers int
	// Receivers is how many receive loops fill the workers: each has one ReceiveMessage in
	// flight at a time, so one loop brings at most ten messages per round trip to SQS.
	Receivers int
	// Visibility is how long a received message stays invisible between heartbeats.
	Visibility time.Duration
	// WaitTime is the long-poll wait (SQS allows 20 s at most).
	WaitTime time.Duration
	// MaxReceives is how many deliveries a message that keeps failing gets before the router
	// dead-letters it itself, with its last error as the reason's detail (0: never; SQS's
	// redrive is then the only bound, and it gives no reason). Keep it below the queue's
	// maxReceiveCount.
	MaxReceives int
	// HandleTimeout bounds the work on one message (cluster reads and writes, AWS calls),
	// plus perInstanceBudget per instance it names: past it the message is retried later
	// rather than holding a worker forever.
	HandleTimeout time.Duration
}

// Intake consumes the intake queue.
type Intake struct {
	cfg       Config
	sqs       sqsAPI
	pipeline  *pipeline.Pipeline
	metrics   *metrics.Router
	clock     clock.WithTicker
	log       *slog.Logger
	backoff   *retry.ExponentialJitterBackoff
	publisher Publisher
	deleter   *deleter
	ready     *Readiness // nil: receives tell no readiness probe
}

// Publisher receives the figures the CloudWatch dashboards show; nil-safe NopPublisher
// when CloudWatch publishing is off.
type Publisher interface {
	DeadLettered()
	Latency(d time.Duration)
}

type nopPublisher struct{}

func (nopPublisher) DeadLettered()         {}
func (nopPublisher) Latency(time.Duration) {}

// New returns an Intake. publisher may be nil.
func New(cfg Config, sqsClient sqsAPI, p *pipeline.Pipeline, m *metrics.Router, publisher Publisher, clk clock.WithTicker, log *slog.Logger) *Intake {
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	// More loops than workers would only hold slots with nothing to work on.
	cfg.Receivers = min(max(cfg.Receivers, 1), cfg.Workers)
	if cfg.Visibility <= 0 {
		cfg.Visibility = 30 * time.Second
	}
	if cfg.HandleTimeout <= 0 {
		cfg.HandleTimeout = 2 * time.Minute
	}
	if publisher == nil {
		publisher = nopPublisher{}
	}
	return &Intake{cfg: cfg, sqs: sqsClient, pipeline: p, metrics: m, clock: clk, log: log,
		backoff: retry.NewExponentialJitterBackoff(maxRetryBackoff), publisher: publisher, deleter: newDeleter(sqsClient, cfg.QueueURL)}
}

// WithReadiness has each receive tell ready whether the intake queue is usable: a receive
// failing with an error no retry mends (the queue deleted, the role denied, the credentials
// refused) makes the router NotReady until a receive succeeds again.
func (in *Intake) WithReadiness(ready *Readiness) *Intake {
	in.ready = ready
	return in
}

// NeedLeaderElection makes only the leader consume: one active consumer per cluster.
func (in *Intake) NeedLeaderElection() bool { return true }

// Start consumes until ctx is done, then stops receiving, lets in-flight messages finish
// (or releases them), and returns. It implements manager.Runnable.
func (in *Intake) Start(ctx context.Context) error {
	in.log.Info("intake started", "queue", in.cfg.QueueURL, "workers", in.cfg.Workers, "receivers", in.cfg.Receivers)
	// Work runs on its own context: a shutdown stops receiving at once, but a message being
	// worked on is finished (bounded by the manager's graceful shutdown timeout).
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	slots := make(chan struct{}, in.cfg.Workers)
	var workers, loops sync.WaitGroup
	defer workers.Wait()
	// Each loop asks for its share of the workers, so that one loop's long poll on an empty
	// queue does not hold every free worker while another's receive brings a burst.
	share := min((in.cfg.Workers+in.cfg.Receivers-1)/in.cfg.Receivers, maxReceive)
	for range in.cfg.Receivers {
		loops.Go(func() { in.receive(ctx, work, slots, share, &workers) })
	}
	loops.Wait()
	in.log.Info("intake stopping: finishing in-flight messages")
	return nil
}

// maxReceive is SQS's limit of messages per ReceiveMessage.
const maxReceive = 10

// receive is one receive loop. It reserves worker slots before it receives (one, waiting
// for it, then up to share that are free): never receive what cannot be worked on at once.
func (in *Intake) receive(ctx, work context.Context, slots chan struct{}, share int, workers *sync.WaitGroup) {
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 1
	reserve:
		for n < share {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break reserve
			}
		}
		// The receive is not cancelled by a shutdown: a long poll abandoned by the client
		// still takes messages on the server, which would then stay invisible for the
		// visibility timeout. It ends within WaitTime, and what it brings after a shutdown
		// began is released at once.
		out, err := in.sqs.ReceiveMessage(work, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(in.cfg.QueueURL), MaxNumberOfMessages: int32(n),
			WaitTimeSeconds: int32(in.cfg.WaitTime / time.Second), VisibilityTimeout: int32(in.cfg.Visibility / time.Second),
			MessageSystemAttributeNames: receiveAttributes,
			MessageAttributeNames:       []string{"All"},
		})
		var msgs []sqstypes.Message
		if err == nil {
			msgs = out.Messages
			if in.ready != nil && in.ready.Usable(in.cfg.QueueURL) {
				in.log.Info("receiving from the intake queue again", "queue", in.cfg.QueueURL)
			}
		}
		for range n - len(msgs) { // the slots nothing came for
			<-slots
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The SDK has retried already; an SQS outage keeps the loop waiting, not crashing.
			// An error no retry mends (the queue gone, access denied) also fails readiness.
			if in.ready != nil && in.ready.Failed(RoleIntake, in.cfg.QueueURL, err) {
				in.log.Error("receiving from the intake queue: the router is NotReady until a receive succeeds", "queue", in.cfg.QueueURL, "problem", awscalls.Classify(err), "err", err)
			} else {
				in.log.Error("receiving from the intake queue", "err", err)
			}
			select {
			case <-in.clock.After(5 * time.Second):
			case <-ctx.Done():
			}
			continue
		}
		if ctx.Err() != nil {
			in.release(work, msgs)
			for range msgs {
				<-slots
			}
			return
		}
		for _, m := range msgs {
			workers.Go(func() {
				defer func() { <-slots }()
				in.process(work, m)
			})
		}
	}
}

// release makes received messages visible again at once, for another consumer.
func (in *Intake) release(ctx context.Context, msgs []sqstypes.Message) {
	for _, m := range msgs {
		if err := in.visibility(ctx, m, 0); err != nil {
			in.log.Error("releasing message at shutdown", "message", aws.ToString(m.MessageId), "err", err)
		}
	}
}

// Process works on one received message, as a worker does: the simulation (test/sim) drives
// the intake one message at a time through it, in an order of its choosing.
func (in *Intake) Process(ctx context.Context, m sqstypes.Message) { in.process(ctx, m) }

// process works on one message, keeping it invisible until it is done.
func (in *Intake) process(ctx context.Context, m sqstypes.Message) {
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	var hb sync.WaitGroup
	hb.Add(1)
	go func() { defer hb.Done(); in.heartbeat(hbCtx, m) }()
	fin := in.handle(ctx, m)
	stopHeartbeat()
	hb.Wait()
	if err := fin(ctx); err != nil {
		in.log.Error("finishing message", "message", aws.ToString(m.MessageId), "err", err)
	}
}

// heartbeat extends the message's invisibility while it is worked on, so that no other
// consumer gets it (NTH's long drains outlived a 20 s visibility and ran twice).
func (in *Intake) heartbeat(ctx context.Context, m sqstypes.Message) {
	t := in.clock.NewTicker(in.cfg.Visibility / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if err := in.visibility(ctx, m, in.cfg.Visibility); err != nil && ctx.Err() == nil {
				in.log.Error("extending message visibility", "message", aws.ToString(m.MessageId), "err", err)
			}
		}
	}
}

// finish is what to do with a message once it is handled: delete it, keep it invisible
// until a time, dead-letter it, or leave it for a retry.
type finish func(context.Context) error

// handle decides a message and carries the decisions out; it returns how to finish it.
func (in *Intake) handle(ctx context.Context, m sqstypes.Message) finish {
	body := []byte(aws.ToString(m.Body))
	// A queue message is a claim from whoever could send it: ParseReceived knows only the
	// kinds AWS sends, and refuses the router's own (a forged "impaired" finding would have
	// the instance it names drained).
	ev, err := event.ParseReceived(body)
	if sender := m.Attributes[string(sqstypes.MessageSystemAttributeNameSenderId)]; !in.senderAllowed(sender) {
		err = &event.RejectError{Reason: event.ReasonForeignSender, Detail: fmt.Sprintf("sent by %q, not one of --sender-ids", sender)}
	} else if err == nil {
		err = event.CheckOrigin(ev, in.cfg.Account, in.cfg.Region)
	}
	kind := string(ev.Kind)
	if kind == "" {
		kind = string(event.KindUnknown)
	}
	in.metrics.Received.WithLabelValues(kind).Inc()
	if err != nil {
		var re *event.RejectError
		errors.As(err, &re)
		return func(ctx context.Context) error { return in.deadLetter(ctx, m, re) }
	}
	ev.FirstReceived = firstReceived(m)
	ctx, cancel := context.WithTimeout(ctx, in.cfg.HandleTimeout+time.Duration(len(ev.Instances))*perInstanceBudget)
	defer cancel()
	res, err := in.pipeline.Process(ctx, ev)
	switch {
	case err != nil && errors.Is(err, record.ErrTooLarge):
		re := &event.RejectError{Reason: event.ReasonUnrecordable, Detail: err.Error()}
		return func(ctx context.Context) error { return in.deadLetter(ctx, m, re) }
	case err != nil && in.cfg.MaxReceives > 0 && receiveCount(m) >= in.cfg.MaxReceives:
		re := &event.RejectError{Reason: event.ReasonRetriesExhausted, Detail: fmt.Sprintf("failed on %d deliveries; last: %v", receiveCount(m), err)}
		return func(ctx context.Context) error { return in.deadLetter(ctx, m, re) }
	}
	if err != nil {
		in.log.Error("carrying out the event; the message will be retried (instances recorded are not decided again)",
			"event_id", ev.ID, "kind", ev.Kind, "err", err)
		return in.retry(m)
	}
	if res.Actions[policy.ActionDefer] == 0 && ev.Kind != event.KindAMIStateChange {
		lat := in.clock.Since(ev.Time)
		in.metrics.Latency.Observe(lat.Seconds())
		in.publisher.Latency(lat)
	}
	return in.delete(m)
}

// senderAllowed says whether a message's SenderId is one of Config.SenderIDs (any, when
// none are set). An ID without a colon (an IAM user's, or a role's) matches the sender itself
// and every session of it (<role ID>:<session name>): the dispatcher's sessions are named
// after the Lambda, a redrive's after whoever ran it.
func (in *Intake) senderAllowed(sender string) bool {
	if len(in.cfg.SenderIDs) == 0 {
		return true
	}
	principal, _, _ := strings.Cut(sender, ":")
	return sender != "" && (slices.Contains(in.cfg.SenderIDs, sender) || slices.Contains(in.cfg.SenderIDs, principal))
}

// delete deletes the message, sharing a DeleteMessageBatch with the messages finished at the
// same time.
func (in *Intake) delete(m sqstypes.Message) finish {
	return func(ctx context.Context) error { return in.deleter.delete(ctx, m) }
}

// retry leaves the message for redelivery after a backoff that grows with its receives.
func (in *Intake) retry(m sqstypes.Message) finish {
	return func(ctx context.Context) error {
		n := receiveCount(m)
		delay, _ := in.backoff.BackoffDelay(n, nil)
		delay = max(delay, time.Second)
		return in.visibility(ctx, m, delay)
	}
}

// deadLetter sends the message to the dead-letter queue with its reason, then deletes it.
func (in *Intake) deadLetter(ctx context.Context, m sqstypes.Message, re *event.RejectError) error {
	body, attrs := deadLetterMessage(m, re)
	_, err := in.sqs.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(in.cfg.DeadLetterQueueURL), MessageBody: aws.String(body), MessageAttributes: attrs,
	})
	if err != nil {
		// Not deleted: the message comes back and is dead-lettered then.
		return fmt.Errorf("dead-lettering message %s (%s): %w", aws.ToString(m.MessageId), re, err)
	}
	in.metrics.DeadLettered.WithLabelValues(string(re.Reason)).Inc()
	in.publisher.DeadLettered()
	in.log.Warn("dead-lettered", "message", aws.ToString(m.MessageId), "reason", re.Reason, "detail", aws.ToString(attrs[AttrDetail].StringValue))
	return in.delete(m)(ctx)
}

// deadLetterMessage is the dead letter of m: its body and the reason's attributes. SQS counts
// the attributes in its size limit, so a body that fitted the intake queue alone may not fit
// beside them; it is then truncated (at a character boundary) to fit, and the attributes give
// its original size and digest, and the detail says so: a dead letter SQS refused would leave
// the message to churn until the redrive, which gives no reason.
func deadLetterMessage(m sqstypes.Message, re *event.RejectError) (string, map[string]sqstypes.MessageAttributeValue) {
	detail := re.Detail
	if len(detail) > 1024 {
		detail = strings.ToValidUTF8(detail[:1024], "")
	}
	body := aws.ToString(m.Body)
	if body == "" {
		body = "(empty message)" // SQS refuses an empty body
	}
	attrs := map[string]sqstypes.MessageAttributeValue{
		AttrReason:          str(string(re.Reason)),
		AttrDetail:          str(detail),
		AttrSourceMessageID: str(aws.ToString(m.MessageId)),
		AttrReceiveCount:    {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(receiveCount(m)))},
	}
	if len(body)+attributesSize(attrs) <= maxMessageSize {
		return body, attrs
	}
	sum := sha256.Sum256([]byte(body))
	attrs[AttrOriginalSize] = sqstypes.MessageAttributeValue{DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(len(body)))}
	attrs[AttrBodySHA256] = str(hex.EncodeToString(sum[:]))
	attrs[AttrDetail] = str(fmt.Sprintf("body truncated to fit SQS's size limit (original %d bytes, SHA-256 in %s); %s", len(body), AttrBodySHA256, detail))
	n := maxMessageSize - attributesSize(attrs)
	for n > 0 && !utf8.RuneStart(body[n]) {
		n--
	}
	return body[:n], attrs
}

// attributesSize is what message attributes count towards SQS's size limit: each one's
// name, data type and value.
func attributesSize(attrs map[string]sqstypes.MessageAttributeValue) int {
	size := 0
	for name, a := range attrs {
		size += len(name) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
	}
	return size
}

func (in *Intake) visibility(ctx context.Context, m sqstypes.Message, d time.Duration) error {
	_, err := in.sqs.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(in.cfg.QueueURL), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: int32(d / time.Second),
	})
	if err != nil {
		return fmt.Errorf("changing visibility of message %s: %w", aws.ToString(m.MessageId), err)
	}
	return nil
}

// receiveAttributes are the system attributes the intake reads of a message: the receive
// count (backoff, --max-receives), the first receipt (firstReceived), the send time (latency)
// and the sender (--sender-ids).
var receiveAttributes = []sqstypes.MessageSystemAttributeName{
	sqstypes.MessageSystemAttributeNameApproximateReceiveCount, sqstypes.MessageSystemAttributeNameApproximateFirstReceiveTimestamp,
	sqstypes.MessageSystemAttributeNameSentTimestamp, sqstypes.MessageSystemAttributeNameSenderId,
}

// firstReceived is when SQS first delivered m (zero when SQS did not say).
func firstReceived(m sqstypes.Message) time.Time {
	ms, err := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)], 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func receiveCount(m sqstypes.Message) int {
	n, _ := strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)])
	return n
}

func str(s string) sqstypes.MessageAttributeValue {
	if s == "" {
		s = "-"
	}
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
}
