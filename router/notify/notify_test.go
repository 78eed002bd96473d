package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/policy"
)

// receiver is an httptest webhook receiver whose answer to each request is scripted.
type receiver struct {
	srv *httptest.Server
	// answer gives the answer to the n-th request (1-based): a status, or 0 to hang until
	// the request is cancelled.
	answer func(n int) int

	mu       sync.Mutex
	requests int
	accepted map[string]int // 2xx bodies, by notice key
	headers  []http.Header
	arrived  chan int // the number of each request, as it arrives
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	r := &receiver{answer: answer, accepted: map[string]int{}, arrived: make(chan int, 100_000)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.requests++
		n := r.requests
		r.headers = append(r.headers, req.Header.Clone())
		r.mu.Unlock()
		r.arrived <- n
		status := r.answer(n)
		if status == 0 {
			<-req.Context().Done()
			return
		}
		if status/100 == 2 {
			// The notifier under test renders {{json .}}: the body is the Notice.
			var nt Notice
			if err := json.Unmarshal(body, &nt); err != nil {
				t.Errorf("request %d: body %s: %v", n, body, err)
			}
			r.mu.Lock()
			r.accepted[nt.key()]++
			r.mu.Unlock()
		}
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "30")
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// waitRequest waits (in real time: the HTTP exchange is real) for request n to arrive.
func (r *receiver) waitRequest(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-r.arrived:
			if got == n {
				return
			}
			if got > n {
				t.Fatalf("request %d arrived while waiting for request %d", got, n)
			}
		case <-deadline:
			t.Fatalf("request %d did not arrive", n)
		}
	}
}

// noRequest fails if a request arrives within a short real-time window.
func (r *receiver) noRequest(t *testing.T) {
	t.Helper()
	select {
	case n := <-r.arrived:
		t.Fatalf("request %d arrived, want none", n)
	case <-time.After(50 * time.Millisecond):
	}
}

type fixture struct {
	n   *Notifier
	clk *clocktesting.FakeClock
	reg *prometheus.Registry
	rcv *receiver
}

// start builds a Notifier posting {{json .}} to a receiver, with a backoff of 1s, 2s, 4s...
// without jitter, and runs it until the test ends.
func start(t *testing.T, answer func(int) int, opts Options) *fixture {
	t.Helper()
	f := &fixture{clk: clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)), reg: prometheus.NewRegistry(), rcv: newReceiver(t, answer)}
	opts.URL = f.rcv.srv.URL + "/services/T0KEN"
	opts.Template = `{{json .}}`
	opts.Backoff = wait.Backoff{Duration: time.Second, Factor: 2, Steps: 10, Cap: time.Minute}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	n, err := New(opts, f.rcv.srv.Client(), f.clk, slog.New(slog.DiscardHandler), f.reg)
	if err != nil {
		t.Fatal(err)
	}
	f.n = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- n.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	return f
}

// waitBackoff waits until the sender waits on the fake clock, then steps it by d.
func (f *fixture) waitBackoff(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f.clk.HasWaiters(); {
		if time.Now().After(deadline) {
			t.Fatal("the sender is not waiting on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitSent waits (in real time) until n notices are accepted: the last request's answer has
// been read.
func (f *fixture) waitSent(t *testing.T, n float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(f.n.sent) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("sent = %g, want %g", testutil.ToFloat64(f.n.sent), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// value reads a series from the registry by name and reason ("" for none).
func (f *fixture) value(t *testing.T, name, reason string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == metrics.LabelReason {
					got = l.GetValue()
				}
			}
			if got != reason {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func sampleDecision(i int) (event.Event, policy.Decision) {
	ev := event.Event{ID: fmt.Sprintf("event-%d", i), Kind: event.KindScheduledChange, Instances: []string{fmt.Sprintf("i-%017d", i)}, Time: time.Unix(0, 0)}
	return ev, policy.Decision{EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Action: policy.ActionDefer, Until: time.Unix(3600, 0), Reason: "window"}
}

// TestNotifyNeverBlocks: while the receiver hangs, 10,000 notices are queued or dropped at
// once: exactly QueueSize wait, the rest are counted as dropped.
func TestNotifyNeverBlocks(t *testing.T) {
	f := start(t, func(int) int { return 0 }, Options{QueueSize: 100, Timeout: time.Hour})
	ev, d := sampleDecision(0)
	f.n.Notify(FromDecision(ev, d, ""))
	f.rcv.waitRequest(t, 1) // the sender holds the first notice, the receiver hangs

	begin := time.Now()
	for i := 1; i <= 10_000; i++ {
		ev, d := sampleDecision(i)
		f.n.Notify(FromDecision(ev, d, ""))
	}
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("10,000 Notify calls took %s while the receiver hangs", took)
	}
	if got := f.value(t, metrics.NotifyFailures, ReasonQueueFull); got != 9900 {
		t.Errorf("dropped-queue-full = %g, want 9900 (10,000 less a queue of 100)", got)
	}
	if got := f.value(t, metrics.NotifyQueueLength, ""); got != 100 {
		t.Errorf("queue length = %g, want 100", got)
	}
	// A dropped notice is not remembered: queued again once there is room, it is not
	// mistaken for a duplicate. (The queue is full: it is dropped again, and counted.)
	ev, d = sampleDecision(10_000)
	f.n.Notify(FromDecision(ev, d, ""))
	if got := f.value(t, metrics.NotifyFailures, ReasonQueueFull); got != 9901 {
		t.Errorf("dropped-queue-full = %g after a dropped notice was notified again, want 9901", got)
	}
}

// TestFailSlowRecover: the receiver answers 500, then hangs past the timeout, then accepts.
// The notice is retried after 1s and then 2s on the fake clock (not before), delivered once,
// and the duplicates notified meanwhile are not sent.
func TestFailSlowRecover(t *testing.T) {
	f := start(t, func(n int) int {
		switch n {
		case 1:
			return http.StatusInternalServerError
		case 2:
			return 0 // hangs: the attempt times out
		}
		return http.StatusOK
	}, Options{Timeout: 200 * time.Millisecond, Headers: map[string]string{"Authorization": "Bearer s3cret"}, Cluster: "prod"})

	ev, d := sampleDecision(1)
	decided := FromDecision(ev, d, "")
	received := Received(ev, "")
	f.n.Notify(decided)
	f.rcv.waitRequest(t, 1) // 500

	f.waitBackoff(t)
	f.n.Notify(decided) // a redelivery while the first is being retried
	f.n.Notify(received)
	f.n.Notify(received)
	f.clk.Step(999 * time.Millisecond)
	f.rcv.noRequest(t)
	if !f.clk.HasWaiters() {
		t.Fatal("the first retry is not waiting for 1s")
	}
	f.clk.Step(time.Millisecond)
	f.rcv.waitRequest(t, 2) // hangs past the 200ms timeout

	f.waitBackoff(t)
	f.clk.Step(1999 * time.Millisecond)
	f.rcv.noRequest(t)
	f.clk.Step(time.Millisecond)
	f.rcv.waitRequest(t, 3) // 200: the decision
	f.rcv.waitRequest(t, 4) // 200: the receipt, with no wait

	f.n.Notify(decided) // a later redelivery
	d.Until = d.Until.Add(time.Hour)
	f.n.Notify(FromDecision(ev, d, "")) // a re-decision that changed the until-time
	f.rcv.waitRequest(t, 5)
	f.waitSent(t, 3)
	f.rcv.noRequest(t)

	f.rcv.mu.Lock()
	defer f.rcv.mu.Unlock()
	decided.Cluster, received.Cluster = "prod", "prod"
	for key, want := range map[string]int{decided.key(): 1, received.key(): 1} {
		if f.rcv.accepted[key] != want {
			t.Errorf("notice %q accepted %d times, want %d", key, f.rcv.accepted[key], want)
		}
	}
	if len(f.rcv.accepted) != 3 {
		t.Errorf("accepted %d distinct notices, want 3 (the decision, the receipt, the changed decision)", len(f.rcv.accepted))
	}
	if h := f.rcv.headers[0]; h.Get("Authorization") != "Bearer s3cret" || h.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v, want the configured Authorization and JSON", h)
	}
	for name, want := range map[string]float64{
		metrics.NotifySent: 3, metrics.NotifyFailures + " " + ReasonHTTPStatus: 1, metrics.NotifyFailures + " " + ReasonNetwork: 1,
		metrics.NotifyFailures + " " + ReasonGaveUp: 0,
	} {
		series, reason, _ := strings.Cut(name, " ")
		if got := f.value(t, series, reason); got != want {
			t.Errorf("%s = %g, want %g", name, got, want)
		}
	}
}

// TestGiveUp: a receiver that always fails gets MaxAttempts attempts, then the notice is
// counted as given up and the next one is sent; a 400 is not retried.
func TestGiveUp(t *testing.T) {
	f := start(t, func(n int) int {
		switch {
		case n <= 3:
			return http.StatusBadGateway
		case n == 4:
			return http.StatusBadRequest
		}
		return http.StatusNoContent
	}, Options{MaxAttempts: 3})
	for i := 1; i <= 3; i++ {
		ev, d := sampleDecision(i)
		f.n.Notify(FromDecision(ev, d, ""))
	}
	f.rcv.waitRequest(t, 1)
	f.waitBackoff(t)
	f.clk.Step(time.Second)
	f.rcv.waitRequest(t, 2)
	f.waitBackoff(t)
	f.clk.Step(2 * time.Second)
	f.rcv.waitRequest(t, 3) // the third attempt fails: given up
	f.rcv.waitRequest(t, 4) // the second notice, at once: 400, given up at once
	f.rcv.waitRequest(t, 5) // the third notice, at once: 204
	f.waitSent(t, 1)
	for reason, want := range map[string]float64{ReasonHTTPStatus: 4, ReasonGaveUp: 2, ReasonNetwork: 0} {
		if got := testutil.ToFloat64(f.n.failures.WithLabelValues(reason)); got != want {
			t.Errorf("failures{reason=%s} = %g, want %g", reason, got, want)
		}
	}
}

// TestRetryAfter: a 429's Retry-After (the receiver sends 30) lengthens the wait beyond the backoff.
func TestRetryAfter(t *testing.T) {
	f := start(t, func(n int) int {
		if n == 1 {
			return http.StatusTooManyRequests
		}
		return http.StatusOK
	}, Options{})
	ev, d := sampleDecision(1)
	f.n.Notify(FromDecision(ev, d, ""))
	f.rcv.waitRequest(t, 1)
	f.waitBackoff(t)
	f.clk.Step(29 * time.Second)
	f.rcv.noRequest(t)
	f.clk.Step(time.Second)
	f.rcv.waitRequest(t, 2)
	f.waitSent(t, 1)
}

func TestNeedLeaderElection(t *testing.T) {
	n, err := New(Options{URL: "https://hooks.example.com/x"}, nil, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if !n.NeedLeaderElection() {
		t.Error("NeedLeaderElection = false: every replica would send each notice")
	}
	var none *Notifier
	none.Notify(Notice{}) // a router without a webhook: no panic
}

// TestErrorsHideURL: a network error names the receiver's host, not the token in its path.
func TestErrorsHideURL(t *testing.T) {
	raw := "https://hooks.slack.com/services/T0KEN"
	err := redact(&url.Error{Op: "Post", URL: raw, Err: errors.New("refused")}, raw)
	if got := err.Error(); got != `Post "https://hooks.slack.com/<redacted>": refused` {
		t.Errorf("redacted error %q", got)
	}
}

// idle is a Notifier that is never started: what Notify queues stays in its queue.
func idle(t *testing.T) *Notifier {
	t.Helper()
	n, err := New(Options{URL: "https://hooks.example.com/x"}, nil, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRecheckNotResent: a deferral decided again at each recheck of the same hold, its Until
// moved (pacing every 10 min, the repair cut-off every minute, a check or a gate at each look),
// is queued once: a 20-node repair storm is not 20 posts a minute. A new Until of a window or a
// deadline is news and is queued again, and so is a change of hold.
func TestRecheckNotResent(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		hold policy.Hold
		step time.Duration
		want int
	}{
		{policy.HoldPacing, policy.PacingRecheck, 1},
		{policy.HoldRepairCutoff, policy.RepairRecheck, 1},
		{policy.HoldCheck, policy.CheckRecheck, 1},
		{policy.HoldPDB, time.Minute, 1},
		{policy.HoldAlerts, time.Minute, 1},
		{policy.HoldInPlace, policy.InPlaceRecheck, 1},
		{policy.HoldWindow, 7 * 24 * time.Hour, 3},
		{policy.HoldDeadline, time.Hour, 3},
	} {
		n := idle(t)
		for i := range 20 { // a storm of 20 nodes, each decided again 3 times
			ev, d := sampleDecision(i)
			d.Hold = tt.hold
			for r := range 3 {
				d.Until = at.Add(time.Duration(r) * tt.step)
				n.Notify(FromDecision(ev, d, ""))
			}
		}
		if got := len(n.queue); got != 20*tt.want {
			t.Errorf("hold %s: 20 instances decided 3 times with a moved Until queued %d notices, want %d", tt.hold, got, 20*tt.want)
		}
	}

	n := idle(t)
	ev, d := sampleDecision(1)
	d.Hold, d.Until = policy.HoldPacing, at
	n.Notify(FromDecision(ev, d, ""))
	d.Hold, d.Until = policy.HoldPDB, at.Add(time.Minute)
	n.Notify(FromDecision(ev, d, ""))
	d.Action, d.Hold, d.Until = policy.ActionDrain, "", time.Time{}
	n.Notify(FromDecision(ev, d, ""))
	if got := len(n.queue); got != 3 {
		t.Errorf("pacing, then a PDB, then the drain: queued %d notices, want 3", got)
	}
}

// TestNoRedirects: a receiver that redirects does not get the notice, its headers and body
// carried to another host: the 3xx is a failed send, given up at once, saying why; neither the
// client passed in nor http.DefaultClient is changed for it.
func TestNoRedirects(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		mu.Lock()
		leaked = append(leaked, fmt.Sprintf("X-Api-Key %q, body %q", req.Header.Get("X-Api-Key"), body))
		mu.Unlock()
	}))
	t.Cleanup(elsewhere.Close)
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		http.Redirect(w, req, elsewhere.URL+"/collect/T0KEN", http.StatusTemporaryRedirect) // 307: method and body kept
	}))
	t.Cleanup(redirecting.Close)

	own := &http.Client{}
	for _, client := range []*http.Client{nil, own} {
		reg := prometheus.NewRegistry()
		n, err := New(Options{URL: redirecting.URL + "/hook", Headers: map[string]string{"X-Api-Key": "s3cret"}},
			client, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), reg)
		if err != nil {
			t.Fatal(err)
		}
		ev, d := sampleDecision(1)
		err = n.post(context.Background(), []byte(`{"text": "notice"}`))
		var se *sendError
		if !errors.As(err, &se) || !se.permanent || !strings.Contains(err.Error(), "redirect") || strings.Contains(err.Error(), "T0KEN") {
			t.Errorf("post to a redirecting receiver: %v, want a permanent failure that says redirect (and not the token)", err)
		}
		n.deliver(context.Background(), FromDecision(ev, d, ""))
		if got := testutil.ToFloat64(n.failures.WithLabelValues(ReasonGaveUp)); got != 1 {
			t.Errorf("gave-up = %g after a redirect, want 1 (not retried)", got)
		}
		if got := testutil.ToFloat64(n.sent); got != 0 {
			t.Errorf("sent = %g, want 0", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) != 0 {
		t.Errorf("the redirect target got %d requests: %v", len(leaked), leaked)
	}
	if own.CheckRedirect != nil || http.DefaultClient.CheckRedirect != nil {
		t.Error("New changed the client it was given")
	}
}
