package intake

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/awscalls"
)

// Queue roles, as readiness reasons and logs name them.
const (
	RoleIntake     = "intake queue"
	RoleDeadLetter = "dead-letter queue"
	RoleKarpenter  = "Karpenter's interruption queue"
)

// Readiness is what the router's queues make of its readiness probe: not ready while a queue
// has not been found usable yet at start (QueueCheck), or while the intake's receives fail
// with an error no retry mends (the queue deleted, the role denied, the credentials refused).
// Transient errors (throttling, 5xx, timeouts, no answer) leave it as it is: the SDK and the
// receive loop retry them, and a pod taken out of service for them would only make a
// rollout stall on an AWS blip.
type Readiness struct {
	mu       sync.Mutex
	clock    clock.PassiveClock
	pending  map[string]pending // by URL: not yet found usable, with the last attempt's error
	problems map[string]problem // by URL: failing with a permanent error
	onChange func(ready bool, reason string)
}

type pending struct {
	role string
	err  error
}

type problem struct {
	role  string
	err   error
	since time.Time
}

// NewReadiness returns a Readiness with no queue pending: ready.
func NewReadiness(clk clock.PassiveClock) *Readiness {
	return &Readiness{clock: clk, pending: map[string]pending{}, problems: map[string]problem{}}
}

// OnChange has f called (outside the lock) each time the queues' permanent problems change:
// a queue found missing or denied (at start or by a receive), or all of them usable again
// (ready true, reason ""). A transient error, or one more attempt meeting the same problem,
// calls nothing. It is the hook of the Kubernetes Event a platform engineer sees on the pod;
// set it before the queues are checked.
func (r *Readiness) OnChange(f func(ready bool, reason string)) { r.onChange = f }

// Check is the readiness check (controller-runtime's healthz.Checker): nil when ready, else
// an error naming each queue and what is wrong with it.
func (r *Readiness) Check(*http.Request) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if reason := r.reason(); reason != "" {
		return fmt.Errorf("%s", reason)
	}
	return nil
}

// reason is why the router is not ready, "" when it is. Called with r.mu held.
func (r *Readiness) reason() string {
	var rs []string
	for url, p := range r.problems {
		rs = append(rs, fmt.Sprintf("%s %s: %s (since %s)", p.role, url, awscalls.Describe(p.err), p.since.UTC().Format(time.RFC3339)))
	}
	for url, p := range r.pending {
		why := "not checked yet"
		if p.err != nil {
			why = "not found usable yet: " + awscalls.Describe(p.err)
		}
		rs = append(rs, fmt.Sprintf("%s %s: %s", p.role, url, why))
	}
	slices.Sort(rs)
	return strings.Join(rs, "; ")
}

// update applies f under the lock and calls OnChange when the permanent problems changed.
func (r *Readiness) update(f func()) {
	r.mu.Lock()
	before, _ := r.permanent()
	f()
	after, reason := r.permanent()
	r.mu.Unlock()
	if before != after && r.onChange != nil {
		r.onChange(after == "", reason)
	}
}

// permanent names each queue failing with a permanent error and the kind of error (what
// OnChange tells about: its key), and the same with the errors (its reason). Called with
// r.mu held.
func (r *Readiness) permanent() (key, reason string) {
	var ks, rs []string
	add := func(role, url string, err error) {
		ks = append(ks, role+" "+url+": "+awscalls.Classify(err).String())
		rs = append(rs, role+" "+url+": "+awscalls.Describe(err))
	}
	for url, p := range r.problems {
		add(p.role, url, p.err)
	}
	for url, p := range r.pending {
		if p.err != nil && awscalls.Classify(p.err).Permanent() {
			add(p.role, url, p.err)
		}
	}
	slices.Sort(ks)
	slices.Sort(rs)
	return strings.Join(ks, "; "), strings.Join(rs, "; ")
}

// expect makes the queue pending: not ready until Usable says it is.
func (r *Readiness) expect(role, url string) {
	r.update(func() { r.pending[url] = pending{role: role} })
}

// Failed records a failed call on the queue: not ready while err is permanent
// (awscalls.Failure.Permanent), or while the queue is still pending (the error is kept as
// its reason). A transient error of a queue found usable changes nothing. It reports whether
// err is permanent.
func (r *Readiness) Failed(role, url string, err error) bool {
	permanent := awscalls.Classify(err).Permanent()
	r.update(func() {
		if p, ok := r.pending[url]; ok {
			p.err = err
			r.pending[url] = p
			return
		}
		if !permanent {
			return
		}
		since := r.clock.Now()
		if p, ok := r.problems[url]; ok {
			since = p.since
		}
		r.problems[url] = problem{role: role, err: err, since: since}
	})
	return permanent
}

// Usable records a call on the queue that succeeded. It reports whether the queue was
// failing (or pending) until then.
func (r *Readiness) Usable(url string) bool {
	was := false
	r.update(func() {
		_, p := r.pending[url]
		_, q := r.problems[url]
		was = p || q
		delete(r.pending, url)
		delete(r.problems, url)
	})
	return was
}

// queueCheckMaxBackoff caps the wait between two checks of a queue not found usable at start:
// a queue created, or a grant added, is seen within it.
const queueCheckMaxBackoff = 2 * time.Minute

// attributesAPI is the part of SQS the queue check uses.
type attributesAPI interface {
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// Queue is a queue the router uses: its role and URL.
type Queue struct{ Role, URL string }

// QueueCheck checks at start that each of the router's queues exists and may be used by its
// credentials (sqs:GetQueueAttributes), and keeps readiness false until they do. A queue
// missing or denied is logged as the error it is and checked again with backoff: the pod
// stays NotReady, with the reason in its log and on /readyz, rather than crash-looping, so
// that creating the queue or granting the role mends it without a restart. Every replica
// runs it (it needs no leader).
type QueueCheck struct {
	sqs     attributesAPI
	queues  []Queue
	ready   *Readiness
	clock   clock.Clock
	log     *slog.Logger
	backoff *retry.ExponentialJitterBackoff
}

// NewQueueCheck returns a QueueCheck of queues (those with a URL), and makes them pending
// on ready at once: the readiness probe fails until each is found usable.
func NewQueueCheck(sqsClient attributesAPI, queues []Queue, ready *Readiness, clk clock.Clock, log *slog.Logger) *QueueCheck {
	var qs []Queue
	for _, q := range queues {
		if q.URL != "" {
			qs = append(qs, q)
			ready.expect(q.Role, q.URL)
		}
	}
	return &QueueCheck{sqs: sqsClient, queues: qs, ready: ready, clock: clk, log: log, backoff: retry.NewExponentialJitterBackoff(queueCheckMaxBackoff)}
}

// NeedLeaderElection is false: every replica's readiness says whether it could consume.
func (c *QueueCheck) NeedLeaderElection() bool { return false }

// Start checks the queues until each is usable or ctx is done. It implements
// manager.Runnable, and never fails the manager: a queue problem is the owner's to mend.
func (c *QueueCheck) Start(ctx context.Context) error {
	todo := slices.Clone(c.queues)
	for attempt := 1; len(todo) > 0; attempt++ {
		todo = slices.DeleteFunc(todo, func(q Queue) bool { return c.check(ctx, q) })
		if len(todo) == 0 || ctx.Err() != nil {
			return nil
		}
		delay, _ := c.backoff.BackoffDelay(attempt, nil)
		delay = max(delay, time.Second)
		for _, q := range todo {
			c.log.Info("checking the queue again", "role", q.Role, "queue", q.URL, "in", delay.Round(time.Second))
		}
		select {
		case <-c.clock.After(delay):
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// check asks SQS about one queue; it reports whether the queue is usable.
func (c *QueueCheck) check(ctx context.Context, q Queue) bool {
	_, err := c.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(q.URL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn},
	})
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		c.ready.Failed(q.Role, q.URL, err)
		msg := "the queue cannot be read; the router stays NotReady and checks it again"
		if f := awscalls.Classify(err); f.Permanent() {
			msg = fmt.Sprintf("the queue %s; the router stays NotReady until it is mended (%s)", f, fix(f))
		}
		c.log.Error(msg, "role", q.Role, "queue", q.URL, "err", err)
		return false
	}
	c.ready.Usable(q.URL)
	c.log.Info("queue usable", "role", q.Role, "queue", q.URL)
	return true
}

// fix says what mends a permanent failure of a queue call.
func fix(f awscalls.Failure) string {
	switch f {
	case awscalls.NotFound:
		return "create it, or correct the URL: the Terraform module's outputs name it"
	case awscalls.Denied:
		return "grant the router's role sqs:GetQueueAttributes, sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility and sqs:SendMessage on it, and kms:Decrypt/kms:GenerateDataKey on its key"
	case awscalls.Credentials:
		return "the router's AWS credentials are refused: check the service account's IRSA or Pod Identity role"
	}
	return ""
}
