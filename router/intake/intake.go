// Package intake is the SQS loop: receive (long poll, batches of 10), keep messages
// invisible while they are worked on (heartbeat), decide, act, and only then delete. A
// deferred event stays in the queue, invisible until its time; a poison message goes to the
// dead-letter queue with its reason; a transient failure leaves the message for redelivery
// with backoff. Nothing is dropped.
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/signal"
)

const (
	// maxVisibility is the longest a deferred message is hidden at a time. SQS refuses a
	// visibility that ends more than 12 hours after the receive (AWS) or after the send
	// (moto's reading); the step honours the stricter of the two, with room for the work on
	// the message. A longer deferral takes several steps, or a re-send when the message is
	// too old for another step.
	maxVisibility = 12*time.Hour - 10*time.Minute
	// minVisibilityStep is the shortest step worth taking; below it the message is re-sent.
	minVisibilityStep = time.Minute
	// retentionMargin is how long before SQS would expire a deferred message that the router
	// re-sends it as a new message.
	retentionMargin = time.Hour
	// reenqueueAfterReceives re-sends a message received this many times, so that a long
	// deferral (many 12-hour hops, or minutes of drain pacing) never reaches the queue's
	// redrive maxReceiveCount and lands in the dead-letter queue by mistake.
	reenqueueAfterReceives = 40
	// maxRetryBackoff caps the redelivery delay of a message that failed transiently.
	maxRetryBackoff = 5 * time.Minute
	// maxDelaySeconds is SQS's limit on a message's delivery delay.
	maxDelaySeconds = 900
)

// Message attribute names on dead-lettered and re-sent messages.
const (
	AttrReason           = "healthrouter.reason"
	AttrDetail           = "healthrouter.detail"
	AttrSourceMessageID  = "healthrouter.source-message-id"
	AttrReceiveCount     = "healthrouter.receive-count"
	AttrReenqueuedReason = "healthrouter.reenqueued"
)

// sqsAPI is the part of SQS the intake uses.
type sqsAPI interface {
	ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(context.Context, *sqs.DeleteMessageInput, ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
	SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// Config is what the intake needs to know of its queues and its cluster.
type Config struct {
	QueueURL           string
	DeadLetterQueueURL string
	// Account and Region, when set, reject events from elsewhere as foreign.
	Account, Region string
	Workers         int
	// Visibility is how long a received message stays invisible between heartbeats.
	Visibility time.Duration
	// WaitTime is the long-poll wait (SQS allows 20 s at most).
	WaitTime time.Duration
	// HandleTimeout bounds the work on one message (cluster reads and writes, AWS calls):
	// past it the message is retried later rather than holding a worker forever.
	HandleTimeout time.Duration
}

// Intake consumes the intake queue.
type Intake struct {
	cfg       Config
	sqs       sqsAPI
	engine    *engine.Engine
	signal    *signal.Signaller
	metrics   *metrics.Router
	clock     clock.WithTicker
	log       *slog.Logger
	backoff   *retry.ExponentialJitterBackoff
	retention time.Duration
	holds     *Holds
	publisher Publisher
}

// Publisher receives the figures the CloudWatch dashboards show; nil-safe NopPublisher
// when CloudWatch publishing is off.
type Publisher interface {
	Decision(kind, action string)
	DeadLettered()
	Latency(d time.Duration)
}

type nopPublisher struct{}

func (nopPublisher) Decision(string, string) {}
func (nopPublisher) DeadLettered()           {}
func (nopPublisher) Latency(time.Duration)   {}

// New returns an Intake. publisher may be nil.
func New(cfg Config, sqsClient sqsAPI, eng *engine.Engine, sig *signal.Signaller, m *metrics.Router, publisher Publisher, clk clock.WithTicker, log *slog.Logger) *Intake {
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.Visibility <= 0 {
		cfg.Visibility = 30 * time.Second
	}
	if cfg.HandleTimeout <= 0 {
		cfg.HandleTimeout = 2 * time.Minute
	}
	if publisher == nil {
		publisher = nopPublisher{}
	}
	return &Intake{cfg: cfg, sqs: sqsClient, engine: eng, signal: sig, metrics: m, clock: clk, log: log,
		backoff: retry.NewExponentialJitterBackoff(maxRetryBackoff), holds: NewHolds(), publisher: publisher}
}

// Holds returns the registry of messages waiting on live state (pool drains, images), so
// that a watcher can release them early.
func (in *Intake) Holds() *Holds { return in.holds }

// NeedLeaderElection makes only the leader consume: one active consumer per cluster.
func (in *Intake) NeedLeaderElection() bool { return true }

// Start consumes until ctx is done, then stops receiving, lets in-flight messages finish
// (or releases them), and returns. It implements manager.Runnable.
func (in *Intake) Start(ctx context.Context) error {
	if err := in.loadRetention(ctx); err != nil {
		return err
	}
	in.log.Info("intake started", "queue", in.cfg.QueueURL, "workers", in.cfg.Workers, "retention", in.retention)
	// Work runs on its own context: a shutdown stops receiving at once, but a message being
	// worked on is finished (bounded by the manager's graceful shutdown timeout).
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	slots := make(chan struct{}, in.cfg.Workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		free := cap(slots) - len(slots)
		if free == 0 {
			select { // wait for a worker; never receive what cannot be worked on at once
			case slots <- struct{}{}:
				<-slots
			case <-ctx.Done():
			}
			continue
		}
		// The receive is not cancelled by a shutdown: a long poll abandoned by the client
		// still takes messages on the server, which would then stay invisible for the
		// visibility timeout. It ends within WaitTime, and what it brings after a shutdown
		// began is released at once.
		out, err := in.sqs.ReceiveMessage(work, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(in.cfg.QueueURL), MaxNumberOfMessages: int32(min(free, 10)),
			WaitTimeSeconds: int32(in.cfg.WaitTime / time.Second), VisibilityTimeout: int32(in.cfg.Visibility / time.Second),
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameApproximateReceiveCount, sqstypes.MessageSystemAttributeNameSentTimestamp},
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			// The SDK has retried already; an SQS outage keeps the loop waiting, not crashing.
			in.log.Error("receiving from the intake queue", "err", err)
			select {
			case <-in.clock.After(5 * time.Second):
			case <-ctx.Done():
			}
			continue
		}
		if ctx.Err() != nil {
			in.release(work, out.Messages)
			break
		}
		for _, m := range out.Messages {
			slots <- struct{}{}
			wg.Add(1)
			go func(m sqstypes.Message) {
				defer wg.Done()
				defer func() { <-slots }()
				in.process(work, m)
			}(m)
		}
	}
	in.log.Info("intake stopping: finishing in-flight messages")
	return nil
}

// release makes received messages visible again at once, for another consumer.
func (in *Intake) release(ctx context.Context, msgs []sqstypes.Message) {
	for _, m := range msgs {
		if err := in.visibility(ctx, m, 0); err != nil {
			in.log.Error("releasing message at shutdown", "message", aws.ToString(m.MessageId), "err", err)
		}
	}
}

func (in *Intake) loadRetention(ctx context.Context) error {
	out, err := in.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(in.cfg.QueueURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameMessageRetentionPeriod},
	})
	if err != nil {
		return fmt.Errorf("reading the intake queue's attributes (%s): %w", in.cfg.QueueURL, err)
	}
	secs, err := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameMessageRetentionPeriod)])
	if err != nil {
		return fmt.Errorf("intake queue retention %q: %w", out.Attributes[string(sqstypes.QueueAttributeNameMessageRetentionPeriod)], err)
	}
	in.retention = time.Duration(secs) * time.Second
	return nil
}

// process works on one message, keeping it invisible until it is done.
func (in *Intake) process(ctx context.Context, m sqstypes.Message) {
	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	var hb sync.WaitGroup
	hb.Add(1)
	go func() { defer hb.Done(); in.heartbeat(hbCtx, m) }()
	hctx, cancel := context.WithTimeout(ctx, in.cfg.HandleTimeout)
	fin := in.handle(hctx, m)
	cancel()
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
	ev, err := event.Parse(body)
	if err == nil {
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
	log := in.log.With("event_id", ev.ID, "kind", ev.Kind)
	now := in.clock.Now()
	outs, err := in.engine.Decide(ctx, ev, now)
	if err != nil {
		log.Error("deciding; the message will be retried", "err", err)
		return in.retry(m)
	}
	var until time.Time // the earliest time a deferred instance of this event is due
	for _, o := range outs {
		d := o.Decision
		ilog := log.With("instance", d.InstanceID, "node", d.Node, "nodepool", d.NodePool, "action", d.Action)
		// A deferral of this event that a later event ended (the instance ran again, the
		// Health event closed or was updated) is done: the message is deleted.
		if st := signal.DeferralState(o.Resolved.NodeClaim, ev); st == signal.StateCancelled || st == signal.StateSuperseded {
			ilog.Info("deferral ended by a later event", "state", st)
			continue
		}
		in.metrics.Decisions.WithLabelValues(string(ev.Kind), string(d.Action), d.NodePool).Inc()
		in.publisher.Decision(string(ev.Kind), string(d.Action))
		for _, c := range d.Checks {
			in.metrics.CheckResults.WithLabelValues(c.Name, checkResult(c)).Inc()
		}
		in.signal.PolicyProblems(o.Resolved, o.Problems)
		var err error
		switch d.Action {
		case policy.ActionDrain:
			var already bool
			already, err = in.signal.Drain(ctx, ev, d, o.Resolved)
			if err == nil {
				ilog.Info("drain signalled", "reason", d.Reason, "already_draining", already, "mode", in.signal.Mode())
			}
		case policy.ActionDefer:
			_, err = in.signal.Defer(ctx, ev, d, o.Resolved)
			if err == nil {
				ilog.Info("deferred", "until", d.Until, "reason", d.Reason)
				if until.IsZero() || d.Until.Before(until) {
					until = d.Until
				}
				in.hold(m, ev, d, o)
			}
		case policy.ActionIgnore:
			err = in.signal.Ignore(ctx, ev, d, o.Resolved)
			if err == nil {
				ilog.Info("ignored", "reason", d.Reason)
			}
		case policy.ActionSkip:
			ilog.Info("skipped", "reason", d.Reason)
		}
		if err != nil {
			in.metrics.SignalErrors.WithLabelValues(string(in.signal.Mode())).Inc()
			ilog.Error("carrying out the decision; the message will be retried", "err", err)
			return in.retry(m)
		}
	}
	if !until.IsZero() {
		return func(ctx context.Context) error { return in.deferMessage(ctx, m, until) }
	}
	if ev.Kind != event.KindAMIStateChange {
		lat := in.clock.Since(ev.Time)
		in.metrics.Latency.Observe(lat.Seconds())
		in.publisher.Latency(lat)
	} else if ev.Image.State == "available" {
		in.holds.Release(ctx, in.sqs, in.cfg.QueueURL, ImageKey(ev.Image.ID))
	}
	return in.delete(m)
}

// hold registers a message waiting on live state, to be released early when it changes.
func (in *Intake) hold(m sqstypes.Message, ev event.Event, d policy.Decision, o engine.Outcome) {
	for _, c := range d.Checks {
		if c.Name == "ami" && !c.Passed && c.Evidence["image"] != "" {
			in.holds.Add(ImageKey(c.Evidence["image"]), aws.ToString(m.ReceiptHandle))
			return
		}
	}
	if d.NodePool != "" && len(d.Checks) == 0 && d.Until.Sub(in.clock.Now()) <= policy.PacingRecheck {
		in.holds.Add(PoolKey(d.NodePool), aws.ToString(m.ReceiptHandle))
	}
}

func checkResult(c policy.Check) string {
	switch {
	case c.Passed:
		return "passed"
	case c.Unavailable:
		return "unavailable"
	}
	return "failed"
}

func (in *Intake) delete(m sqstypes.Message) finish {
	return func(ctx context.Context) error {
		_, err := in.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(in.cfg.QueueURL), ReceiptHandle: m.ReceiptHandle})
		if err != nil {
			return fmt.Errorf("deleting message %s: %w", aws.ToString(m.MessageId), err)
		}
		return nil
	}
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

// deferMessage keeps the message in the queue until the deferral is due, in steps of at
// most 12 hours; it re-sends the message as a new one before SQS would expire it, or before
// its receive count nears the redrive limit.
func (in *Intake) deferMessage(ctx context.Context, m sqstypes.Message, until time.Time) error {
	now := in.clock.Now()
	wait := min(max(until.Sub(now), time.Second), maxVisibility)
	sent := sentTime(m)
	expires := sent.Add(in.retention - retentionMargin)
	tooOld := false
	if !sent.IsZero() {
		if left := maxVisibility - now.Sub(sent); left < wait {
			wait = max(left, 0)
			tooOld = wait < minVisibilityStep && until.Sub(now) > wait
		}
	}
	if tooOld || (!sent.IsZero() && now.Add(wait).After(expires)) || receiveCount(m) >= reenqueueAfterReceives {
		wait = min(max(until.Sub(now), time.Second), maxVisibility)
		delay := min(int32(wait/time.Second), maxDelaySeconds)
		_, err := in.sqs.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl: aws.String(in.cfg.QueueURL), MessageBody: m.Body, DelaySeconds: delay,
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				AttrSourceMessageID:  str(aws.ToString(m.MessageId)),
				AttrReenqueuedReason: str("deferral outlives the message's visibility, retention or receive limit"),
			},
		})
		if err != nil {
			return fmt.Errorf("re-sending deferred message %s: %w", aws.ToString(m.MessageId), err)
		}
		return in.delete(m)(ctx)
	}
	return in.visibility(ctx, m, wait)
}

// deadLetter sends the message to the dead-letter queue with its reason, then deletes it.
func (in *Intake) deadLetter(ctx context.Context, m sqstypes.Message, re *event.RejectError) error {
	detail := re.Detail
	if len(detail) > 1024 {
		detail = detail[:1024]
	}
	body := aws.ToString(m.Body)
	if body == "" {
		body = "(empty message)" // SQS refuses an empty body
	}
	_, err := in.sqs.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(in.cfg.DeadLetterQueueURL), MessageBody: aws.String(body),
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			AttrReason:          str(string(re.Reason)),
			AttrDetail:          str(detail),
			AttrSourceMessageID: str(aws.ToString(m.MessageId)),
			AttrReceiveCount:    {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(receiveCount(m)))},
		},
	})
	if err != nil {
		// Not deleted: the message comes back and is dead-lettered then.
		return fmt.Errorf("dead-lettering message %s (%s): %w", aws.ToString(m.MessageId), re, err)
	}
	in.metrics.DeadLettered.WithLabelValues(string(re.Reason)).Inc()
	in.publisher.DeadLettered()
	in.log.Warn("dead-lettered", "message", aws.ToString(m.MessageId), "reason", re.Reason, "detail", re.Detail)
	return in.delete(m)(ctx)
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

func receiveCount(m sqstypes.Message) int {
	n, _ := strconv.Atoi(m.Attributes[string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount)])
	return n
}

func sentTime(m sqstypes.Message) time.Time {
	ms, err := strconv.ParseInt(m.Attributes[string(sqstypes.MessageSystemAttributeNameSentTimestamp)], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

func str(s string) sqstypes.MessageAttributeValue {
	if s == "" {
		s = "-"
	}
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
}
