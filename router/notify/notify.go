// Package notify sends webhook notifications of the events the router receives and of what it
// decides, to a chat channel (Slack-compatible by default) or any HTTP receiver, as
// aws-node-termination-handler's webhook does, but on receipt and on each decision rather
// than after the drain.
//
// Notify never blocks the pipeline: it puts the notice in a bounded queue (a full queue drops
// it, counted), and one worker, on the leader only, sends the queue in order, retrying a
// failure with exponential backoff on the injected clock. A notice is sent at most once per
// (phase, event, instances, action, hold, until): a redelivered event or a re-decision that
// changed nothing is not sent again. The until-time of a hold that is only a recheck (pacing,
// the repair cut-off, a check, a gate) is left out: it moves at every recheck.
package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/metrics"
)

// Defaults of Options.
const (
	DefaultQueueSize   = 1000
	DefaultTimeout     = 5 * time.Second
	DefaultMaxAttempts = 5
)

// DefaultBackoff is the wait between attempts: 1s, 2s, 4s, 8s... up to a minute, each plus up
// to 20% jitter (wait.Backoff draws it from math/rand; a simulation sets Jitter to 0).
var DefaultBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.2, Steps: 10, Cap: time.Minute}

// dedupKeys bounds the memory of notices already queued. One bulk event of 200 instances
// takes 201 keys (its receipt and each decision), plus one per changed re-decision; 4096 keys
// (well under a megabyte; at most about 20 MiB were every key at its notice's caps) cover the
// redeliveries of the last several such events, which is what deduplication is for.
const dedupKeys = 4096

// maxRetryAfter caps a receiver's Retry-After: one worker sends the queue in order, so a long
// wait would hold every notice behind it.
const maxRetryAfter = time.Minute

// Reasons of health_router_notify_failures_total.
const (
	ReasonHTTPStatus = "http-status"        // the receiver answered other than 2xx
	ReasonNetwork    = "network"            // no answer: connection refused, DNS, timeout
	ReasonQueueFull  = "dropped-queue-full" // Notify found the queue full
	ReasonGaveUp     = "gave-up"            // a notice not delivered after MaxAttempts (or a 3xx, a permanent 4xx)
	ReasonTemplate   = "template"           // the template failed to render this notice
)

// Options configure a Notifier. Zero values take the defaults.
type Options struct {
	// URL receives each notice as a POST (required). It often embeds a token (Slack's
	// does): it is never logged whole.
	URL string
	// Template is a text/template of the request body, rendered with a Notice; empty:
	// DefaultTemplate. See funcs for the functions it may call.
	Template string
	// Headers are set on every request (Content-Type defaults to application/json).
	Headers     map[string]string
	QueueSize   int
	Timeout     time.Duration // of one attempt
	MaxAttempts int
	Backoff     wait.Backoff
	// Cluster fills Notice.Cluster when the notice has none.
	Cluster string
}

// Notifier queues notices and sends them to the webhook.
type Notifier struct {
	opts   Options
	tmpl   *template.Template
	client *http.Client
	clk    clock.WithTicker
	log    *slog.Logger
	queue  chan Notice

	mu   sync.Mutex // guards seen
	seen *keySet

	sent     prometheus.Counter
	failures *prometheus.CounterVec
}

// New builds a Notifier. The URL, template and headers are checked here, so that a bad
// configuration fails at start-up with a message naming the flag. A nil httpClient is
// http.DefaultClient; either way the notifier sends through a copy that follows no redirect.
func New(opts Options, httpClient *http.Client, clk clock.WithTicker, log *slog.Logger, reg prometheus.Registerer) (*Notifier, error) {
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = DefaultMaxAttempts
	}
	if opts.Backoff == (wait.Backoff{}) {
		opts.Backoff = DefaultBackoff
	}
	switch {
	case !validURL(opts.URL):
		// Not the URL itself: it may hold a token.
		return nil, errors.New("--webhook-url: want an http or https URL")
	case opts.QueueSize < 1 || opts.Timeout < 0 || opts.MaxAttempts < 1:
		return nil, fmt.Errorf("notify: queue size %d, timeout %s and max attempts %d: want positive values", opts.QueueSize, opts.Timeout, opts.MaxAttempts)
	}
	tmpl, err := ParseTemplate(opts.Template)
	if err != nil {
		return nil, fmt.Errorf("--webhook-template: %w", err)
	}
	if err := checkHeaders(opts.Headers); err != nil {
		return nil, fmt.Errorf("--webhook-headers: %w", err)
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	// A copy, so that the caller's client (http.DefaultClient, shared by the process) keeps
	// its own redirect policy.
	client := *httpClient
	client.CheckRedirect = noRedirects
	n := &Notifier{
		opts: opts, tmpl: tmpl, client: &client, clk: clk, log: log,
		queue: make(chan Notice, opts.QueueSize), seen: newKeySet(dedupKeys),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metrics.NotifySent, Help: "Webhook notices the receiver accepted (2xx).",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NotifyFailures, Help: "Webhook failures, by reason: each failed attempt (http-status, network), each notice dropped on a full queue (dropped-queue-full) or given up after its last attempt (gave-up), each notice the template failed to render (template).",
		}, []string{metrics.LabelReason}),
	}
	reg.MustRegister(n.sent, n.failures, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.NotifyQueueLength, Help: "Webhook notices waiting to be sent.",
	}, func() float64 { return float64(len(n.queue)) }))
	return n, nil
}

// Notify queues a notice and returns at once. A notice already queued once (same phase,
// event, instances, action, hold and, unless the hold is a recheck, until) is not queued
// again; on a full queue the notice is
// dropped and counted. Notify on a nil Notifier does nothing, so that a router without a
// webhook can call it.
func (n *Notifier) Notify(nt Notice) {
	if n == nil {
		return
	}
	if nt.Cluster == "" {
		nt.Cluster = n.opts.Cluster
	}
	nt = nt.capped()
	key := nt.key()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen.contains(key) {
		return
	}
	select {
	case n.queue <- nt:
		// Remembered only once queued: a dropped notice may be sent on the event's redelivery.
		n.seen.add(key)
	default:
		n.failures.WithLabelValues(ReasonQueueFull).Inc()
		n.log.Debug("webhook queue full: notice dropped", "event_id", nt.EventID, "kind", nt.Kind, "action", nt.Action)
	}
}

// NeedLeaderElection makes the notifier send on the leader only: one message per notice.
func (n *Notifier) NeedLeaderElection() bool { return true }

// Start sends the queued notices, one at a time and in order, until ctx is done. Notices
// still queued then are not sent.
func (n *Notifier) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			if left := len(n.queue); left > 0 {
				n.log.Info("shutting down: webhook notices not sent", "count", left)
			}
			return nil
		case nt := <-n.queue:
			n.deliver(ctx, nt)
		}
	}
}

// deliver sends one notice, retrying until it is accepted, MaxAttempts are spent, the
// receiver refuses it for good (a 3xx, a 4xx other than 408, 425 or 429) or ctx is done.
func (n *Notifier) deliver(ctx context.Context, nt Notice) {
	log := n.log.With("event_id", nt.EventID, "kind", nt.Kind, "phase", nt.Phase, "action", nt.Action)
	body, err := n.Body(nt)
	if err != nil {
		n.failures.WithLabelValues(ReasonTemplate).Inc()
		log.Error("webhook template failed to render a notice", "error", err)
		return
	}
	backoff := n.opts.Backoff
	for attempt := 1; ; attempt++ {
		err := n.post(ctx, body)
		if err == nil {
			n.sent.Inc()
			return
		}
		if ctx.Err() != nil {
			return // shutting down: not the receiver's failure
		}
		var se *sendError
		errors.As(err, &se)
		n.failures.WithLabelValues(se.reason).Inc()
		if se.permanent || attempt >= n.opts.MaxAttempts {
			n.failures.WithLabelValues(ReasonGaveUp).Inc()
			log.Warn("webhook notice not delivered", "attempts", attempt, "error", err)
			return
		}
		delay := max(backoff.Step(), se.retryAfter)
		log.Debug("webhook attempt failed, retrying", "attempt", attempt, "in", delay, "error", err)
		select {
		case <-ctx.Done():
			return
		case <-n.clk.After(delay):
		}
	}
}

// Body is the request body of a notice, as the template renders it from the notice within
// its caps; a body over maxBodyBytes is an error.
func (n *Notifier) Body(nt Notice) ([]byte, error) {
	if nt.Cluster == "" {
		nt.Cluster = n.opts.Cluster
	}
	return render(n.tmpl, nt.capped())
}

// sendError is a failed attempt.
type sendError struct {
	reason     string
	permanent  bool
	retryAfter time.Duration
	err        error
}

func (e *sendError) Error() string { return e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// post makes one attempt; the error is a *sendError.
func (n *Notifier) post(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.opts.URL, bytes.NewReader(body))
	if err != nil {
		return &sendError{reason: ReasonNetwork, permanent: true, err: redact(err, n.opts.URL)}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "health-router")
	for k, v := range n.opts.Headers {
		req.Header.Set(k, v)
	}
	resp, err := n.client.Do(req)
	if err != nil {
		return &sendError{reason: ReasonNetwork, err: redact(err, n.opts.URL)}
	}
	// Drained so that the connection is reused; bounded, as a receiver's error page may be large.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		to := "with no Location"
		if loc, err := resp.Location(); err == nil {
			to = "to " + redactedURL(loc.String())
		}
		// Permanent: the same URL redirects again.
		return &sendError{reason: ReasonHTTPStatus, permanent: true, err: fmt.Errorf(
			"receiver answered %s, redirecting %s: redirects are not followed (they would carry the webhook's headers and body to another URL); set --webhook-url to the final URL", resp.Status, to)}
	}
	se := &sendError{reason: ReasonHTTPStatus, err: fmt.Errorf("receiver answered %s", resp.Status)}
	switch c := resp.StatusCode; {
	case c == http.StatusTooManyRequests || c == http.StatusServiceUnavailable:
		se.retryAfter = retryAfter(resp.Header.Get("Retry-After"))
	case c == http.StatusRequestTimeout || c == http.StatusTooEarly:
	case c >= 400 && c < 500:
		// The same body to the same URL is refused again (Slack's invalid_payload,
		// no_service): retrying only delays the notices behind it.
		se.permanent = true
	}
	return se
}

// retryAfter is a Retry-After header in seconds (the form Slack sends), capped; 0 when absent
// or an HTTP date.
func retryAfter(v string) time.Duration {
	s, err := strconv.Atoi(v)
	if err != nil || s <= 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, maxRetryAfter)
}

// redact replaces the URL in an error (net/http puts it in every *url.Error) by its scheme and
// host: the path and query of a webhook URL are often its token.
func redact(err error, raw string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = redactedURL(raw)
	}
	return err
}

func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<webhook URL>"
	}
	return u.Scheme + "://" + u.Host + "/<redacted>"
}

// noRedirects is the notifier's redirect policy: none is followed. A redirect would carry the
// configured headers (an X-Api-Key, a token: net/http drops only Authorization,
// WWW-Authenticate and Cookie, and only to another domain) and the notice to a URL nobody
// configured; the 3xx itself is returned, and post fails it.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func validURL(v string) bool {
	u, err := url.Parse(v)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
