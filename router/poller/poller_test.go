package poller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/harness"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

// recorder is the pipeline in these tests: it records what it is handed and fails the
// instances told to, once each.
type recorder struct {
	mu     sync.Mutex
	events []event.Event
	failOn map[string]int
}

func (r *recorder) Handle(_ context.Context, ev event.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failOn[ev.Instances[0]] > 0 {
		r.failOn[ev.Instances[0]]--
		return errors.New("API server unreachable")
	}
	r.events = append(r.events, ev)
	return nil
}

func (r *recorder) take() []event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

type lister struct {
	mu  sync.Mutex
	ids []string
	err error
}

func (l *lister) InstanceIDs(context.Context) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids), l.err
}

func (l *lister) set(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = ids
}

func id(i int) string { return fmt.Sprintf("i-%017x", 0xa000+i) }

type fixture struct {
	ec2   *harness.EC2InstanceStatus
	list  *lister
	rec   *recorder
	clock *clocktesting.FakeClock
	reg   *prometheus.Registry
	p     *Poller
}

func newFixture(t *testing.T, opts Options) *fixture {
	s, c := harness.NewEC2InstanceStatus(t)
	f := &fixture{ec2: s, list: &lister{}, rec: &recorder{failOn: map[string]int{}}, clock: clocktesting.NewFakeClock(t0), reg: prometheus.NewRegistry()}
	opts.Account, opts.Region = "111122223333", "eu-west-1"
	f.p = New(c, f.list, f.rec, f.clock, slog.New(slog.NewTextHandler(io.Discard, nil)), f.reg, opts)
	return f
}

func (f *fixture) poll(t *testing.T) error {
	t.Helper()
	return f.p.Poll(context.Background())
}

func byInstance(evs []event.Event) map[string]event.Event {
	m := map[string]event.Event{}
	for _, ev := range evs {
		m[ev.Instances[0]] = ev
	}
	return m
}

// TestPollScheduledEvents: 250 cluster instances (three batches, the first two paged),
// one scheduled event of each type, a [Completed] and a [Canceled] one, and instances of
// other clusters that must never be asked about.
func TestPollScheduledEvents(t *testing.T) {
	f := newFixture(t, Options{})
	f.ec2.PageSize = 40
	var cluster []string
	for i := range 250 {
		f.ec2.Add(id(i), &harness.Instance{})
		cluster = append(cluster, id(i))
	}
	for i := 1000; i < 1010; i++ {
		f.ec2.Add(id(i), &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0other", Code: "instance-stop", NotBefore: t0.Add(time.Hour)}}})
	}
	f.list.set(cluster...)
	week := t0.Add(7 * 24 * time.Hour)
	want := map[string]event.ScheduledType{}
	for i, code := range event.ScheduledTypes {
		inst := id(10 + 50*i) // spread over the batches
		want[inst] = code
		f.ec2.Set(inst, func(in *harness.Instance) {
			in.Events = []harness.ScheduledEvent{{ID: fmt.Sprintf("instance-event-%017x", i), Code: string(code), Description: "The instance is scheduled for " + string(code), NotBefore: week.Add(time.Duration(i) * time.Hour), NotAfter: week.Add(time.Duration(i+2) * time.Hour)}}
		})
	}
	f.ec2.Set(id(3), func(in *harness.Instance) {
		in.Events = []harness.ScheduledEvent{{ID: "instance-event-0completed", Code: "system-reboot", Description: "[Completed] The instance is running on degraded hardware", NotBefore: t0.Add(-time.Hour)}}
	})
	f.ec2.Set(id(4), func(in *harness.Instance) {
		in.Events = []harness.ScheduledEvent{{ID: "instance-event-0canceled", Code: "instance-retirement", Description: "[Canceled] The instance is running on degraded hardware", NotBefore: week}}
	})

	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	got := byInstance(f.rec.take())
	if len(got) != len(want)+2 {
		t.Errorf("%d findings, want %d (one per type, plus the completed and the canceled event as closing theirs)", len(got), len(want)+2)
	}
	for i, code := range event.ScheduledTypes {
		inst := id(10 + 50*i)
		ev, ok := got[inst]
		if !ok {
			t.Errorf("no finding for the %s of %s", code, inst)
			continue
		}
		notBefore := week.Add(time.Duration(i) * time.Hour)
		if ev.Kind != event.KindScheduledChange || ev.Health == nil || ev.Health.Scheduled != code || !ev.Deadline.Equal(notBefore) ||
			!ev.Health.Start.Equal(notBefore) || !ev.Health.End.Equal(notBefore.Add(2*time.Hour)) || ev.Health.Status != event.HealthUpcoming {
			t.Errorf("%s: %+v health %+v", code, ev, ev.Health)
		}
		if ev.Account != "111122223333" || ev.Region != "eu-west-1" || event.CheckOrigin(ev, "111122223333", "eu-west-1") != nil {
			t.Errorf("%s: origin %s/%s", code, ev.Account, ev.Region)
		}
		// What the pipeline stores parses into the same event.
		again, err := event.Parse(ev.Body)
		if err != nil || again.ID != ev.ID || !again.Deadline.Equal(ev.Deadline) {
			t.Errorf("%s: stored body does not round-trip: %v", code, err)
		}
	}
	// A completed or canceled event closes its maintenance (it cancels what the router
	// deferred for it, whichever source reported it); on main 351c311 it was skipped, and a
	// deferral recorded from the poller outlived its cancelled maintenance.
	for _, closed := range []string{id(3), id(4)} {
		if ev, ok := got[closed]; !ok || ev.Health == nil || ev.Health.Status != event.HealthClosed {
			t.Errorf("%s: a completed or canceled event was not handed over as closed: %+v", closed, ev)
		}
	}

	// Call economy: batches of 100 (100, 100, 50), each paged by 40: 3+3+2 calls, at most
	// DefaultParallelCalls at once, every one with IncludeAllInstances, only cluster instances.
	calls, maxFlight, asked, includeAll := f.ec2.Stats()
	if calls != 8 {
		t.Errorf("%d DescribeInstanceStatus calls, want 8", calls)
	}
	if maxFlight > DefaultParallelCalls || maxFlight < 2 {
		t.Errorf("%d calls in flight at most, want 2 to %d", maxFlight, DefaultParallelCalls)
	}
	seen := map[string]bool{}
	for i, ids := range asked {
		if len(ids) > DescribeBatch {
			t.Errorf("call %d names %d instances, more than EC2's %d", i, len(ids), DescribeBatch)
		}
		if !includeAll[i] {
			t.Errorf("call %d without IncludeAllInstances", i)
		}
		for _, x := range ids {
			if !slices.Contains(cluster, x) {
				t.Errorf("call %d asks about %s, not an instance of the cluster", i, x)
			}
			seen[x] = true
		}
	}
	if len(seen) != len(cluster) {
		t.Errorf("%d instances asked about, want %d", len(seen), len(cluster))
	}

	// The next polls hand nothing again.
	for range 3 {
		f.clock.Step(time.Minute)
		if err := f.poll(t); err != nil {
			t.Fatal(err)
		}
	}
	if again := f.rec.take(); len(again) != 0 {
		t.Errorf("%d findings handed again", len(again))
	}
	// A rescheduled event is a new finding.
	f.ec2.Set(id(10), func(in *harness.Instance) {
		in.Events[0].NotBefore, in.Events[0].NotAfter = in.Events[0].NotBefore.Add(48*time.Hour), in.Events[0].NotAfter.Add(48*time.Hour)
	})
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if evs := f.rec.take(); len(evs) != 1 || evs[0].Instances[0] != id(10) || !evs[0].Deadline.Equal(week.Add(48*time.Hour)) {
		t.Errorf("rescheduled event: %v", evs)
	}

	if n := testutil.ToFloat64(f.p.findings.WithLabelValues(event.FindingScheduledEvent)); n != 8 {
		t.Errorf("%s{scheduled-event} = %v, want 8", metrics.PollerFindings, n)
	}
	if n := testutil.ToFloat64(f.p.polls.WithLabelValues(ResultSuccess)); n != 5 {
		t.Errorf("%s{success} = %v, want 5", metrics.PollerPolls, n)
	}
	if n := testutil.ToFloat64(f.p.asked); n != 250 {
		t.Errorf("%s = %v, want 250", metrics.PollerInstances, n)
	}
}

// TestPollImpaired: an impaired instance is handed over once it has been impaired for two
// minutes, once; again only after it recovers and is impaired again.
func TestPollImpaired(t *testing.T) {
	f := newFixture(t, Options{})
	a, b, c := id(1), id(2), id(3)
	f.ec2.Add(a, &harness.Instance{InstanceStatus: "impaired"})                                        // no ImpairedSince: from the first poll that sees it
	f.ec2.Add(b, &harness.Instance{SystemStatus: "impaired", ImpairedSince: t0.Add(-5 * time.Minute)}) // impaired for 5 minutes already
	f.ec2.Add(c, &harness.Instance{})
	f.list.set(a, b, c)

	step := func(d time.Duration) []event.Event {
		t.Helper()
		f.clock.Step(d)
		if err := f.poll(t); err != nil {
			t.Fatal(err)
		}
		return f.rec.take()
	}
	evs := step(0)
	if len(evs) != 1 || evs[0].Instances[0] != b {
		t.Fatalf("first poll: %v, want only %s (impaired since 5 minutes)", evs, b)
	}
	if ev := evs[0]; ev.Kind != event.KindInstanceStatus || !ev.Deadline.IsZero() || ev.Status.SystemStatus != "impaired" || ev.Status.InstanceStatus != "ok" || !ev.Status.ImpairedSince.Equal(t0.Add(-5*time.Minute)) {
		t.Errorf("finding %+v status %+v", ev, ev.Status)
	}
	if evs := step(time.Minute); len(evs) != 0 {
		t.Errorf("after 1 minute: %v", evs)
	}
	if evs := step(59 * time.Second); len(evs) != 0 {
		t.Errorf("after 1m59s: %v", evs)
	}
	evs = step(time.Second)
	if len(evs) != 1 || evs[0].Instances[0] != a || !evs[0].Status.ImpairedSince.Equal(t0) || evs[0].Status.InstanceStatus != "impaired" {
		t.Fatalf("after 2 minutes: %v, want %s impaired since %v", evs, a, t0)
	}
	first := evs[0].ID
	for range 3 {
		if evs := step(time.Minute); len(evs) != 0 {
			t.Errorf("still impaired, handed again: %v", evs)
		}
	}
	// a recovers, then is impaired again: a new impairment, a new finding after two minutes.
	f.ec2.Set(a, func(in *harness.Instance) { in.InstanceStatus = "ok" })
	step(time.Minute)
	f.ec2.Set(a, func(in *harness.Instance) { in.InstanceStatus = "impaired" })
	if evs := step(time.Minute); len(evs) != 0 {
		t.Errorf("impaired again, at once: %v", evs)
	}
	evs = step(2 * time.Minute)
	if len(evs) != 1 || evs[0].Instances[0] != a || evs[0].ID == first {
		t.Errorf("impaired again after 2 minutes: %v (first %s)", evs, first)
	}
	if n := testutil.ToFloat64(f.p.findings.WithLabelValues(event.FindingImpaired)); n != 3 {
		t.Errorf("%s{impaired} = %v, want 3", metrics.PollerFindings, n)
	}
}

// TestPollHandlerError: a finding the handler fails is handed again at the next poll, and
// only until it is taken.
func TestPollHandlerError(t *testing.T) {
	f := newFixture(t, Options{})
	a, b := id(1), id(2)
	for _, x := range []string{a, b} {
		f.ec2.Add(x, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0" + x[2:], Code: "instance-retirement", NotBefore: t0.Add(72 * time.Hour)}}})
	}
	f.list.set(a, b)
	f.rec.failOn[a] = 2
	err := f.poll(t)
	if err == nil || !strings.Contains(err.Error(), "1 of 2") {
		t.Errorf("poll error = %v", err)
	}
	if evs := f.rec.take(); len(evs) != 1 || evs[0].Instances[0] != b {
		t.Errorf("first poll handed %v", evs)
	}
	f.clock.Step(time.Minute)
	if err := f.poll(t); err == nil {
		t.Error("second failure not reported")
	}
	if evs := f.rec.take(); len(evs) != 0 {
		t.Errorf("second poll handed %v", evs)
	}
	f.clock.Step(time.Minute)
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if evs := f.rec.take(); len(evs) != 1 || evs[0].Instances[0] != a {
		t.Errorf("third poll handed %v, want the retried %s", evs, a)
	}
	f.clock.Step(time.Minute)
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if evs := f.rec.take(); len(evs) != 0 {
		t.Errorf("fourth poll handed %v", evs)
	}
	for result, want := range map[string]float64{ResultHandleError: 2, ResultSuccess: 2} {
		if n := testutil.ToFloat64(f.p.polls.WithLabelValues(result)); n != want {
			t.Errorf("polls{%s} = %v, want %v", result, n, want)
		}
	}
}

// TestPollDescribeErrors: a failed call leaves its batch for the next poll; instances EC2
// does not know are dropped from the batch and the rest still answered; instances that
// leave the cluster are forgotten.
func TestPollDescribeErrors(t *testing.T) {
	f := newFixture(t, Options{})
	a, b, gone := id(1), id(2), id(3)
	f.ec2.Add(a, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0a", Code: "system-maintenance", NotBefore: t0.Add(time.Hour)}}})
	f.ec2.Add(b, &harness.Instance{})
	f.list.set(a, b, gone) // gone: a NodeClaim whose instance EC2 no longer knows
	f.ec2.Fail = 1
	if err := f.poll(t); err == nil || !strings.Contains(err.Error(), "InternalError") {
		t.Errorf("poll error = %v", err)
	}
	if evs := f.rec.take(); len(evs) != 0 {
		t.Errorf("handed %v without an answer", evs)
	}
	calls, _, _, _ := f.ec2.Stats()
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if evs := f.rec.take(); len(evs) != 1 || evs[0].Instances[0] != a {
		t.Errorf("after the error: %v", evs)
	}
	after, _, asked, _ := f.ec2.Stats()
	if after-calls != 2 || slices.Contains(asked[len(asked)-1], gone) {
		t.Errorf("%d calls, last asked %v: want the batch asked again once without %s", after-calls, asked[len(asked)-1], gone)
	}
	if n := testutil.ToFloat64(f.p.polls.WithLabelValues(ResultDescribeError)); n != 1 {
		t.Errorf("polls{describe-error} = %v", n)
	}

	// a leaves the cluster: forgotten.
	f.list.set(b)
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.p.handed[a]; ok {
		t.Errorf("state of %s kept after it left the cluster", a)
	}
	f.list.err = errors.New("cache not synced")
	if err := f.poll(t); err == nil || testutil.ToFloat64(f.p.polls.WithLabelValues(ResultListError)) != 1 {
		t.Errorf("list error: %v", err)
	}
}

// TestStart: the poller polls at once, then every interval of the clock, and stops with its
// context.
func TestStart(t *testing.T) {
	f := newFixture(t, Options{Interval: time.Minute})
	f.ec2.Add(id(1), &harness.Instance{})
	f.list.set(id(1))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- f.p.Start(ctx) }()
	waitCalls := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if calls, _, _, _ := f.ec2.Stats(); calls >= n && f.clock.HasWaiters() {
				return
			}
		}
		calls, _, _, _ := f.ec2.Stats()
		t.Fatalf("%d calls, want %d", calls, n)
	}
	waitCalls(1)
	f.clock.Step(59 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if calls, _, _, _ := f.ec2.Stats(); calls != 1 {
		t.Errorf("%d calls before the interval", calls)
	}
	f.clock.Step(time.Second)
	waitCalls(2)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return")
	}
	if !f.p.NeedLeaderElection() {
		t.Error("the poller must run on the leader only")
	}
}

// TestPollCallsCounted: the poller's calls are counted by the router's AWS call middleware
// (as for every client app.Run builds), one per batch of 100 instances, a few at once.
func TestPollCallsCounted(t *testing.T) {
	srv, _ := harness.NewEC2InstanceStatus(t)
	srv.Latency = 20 * time.Millisecond
	reg := prometheus.NewRegistry()
	calls := awscalls.NewCounter(reg)
	cfg := harness.AWSConfig(nil)
	cfg.APIOptions = append(cfg.APIOptions, awscalls.Middleware(calls, nil))
	c := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(srv.URL) })
	var ids []string
	for i := range 1000 {
		srv.Add(id(i), &harness.Instance{})
		ids = append(ids, id(i))
	}
	list := &lister{ids: ids}
	timed := func(parallel int) time.Duration {
		p := New(c, list, &recorder{}, clocktesting.NewFakeClock(t0), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry(), Options{ParallelCalls: parallel})
		start := time.Now()
		if err := p.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	one, four := timed(1), timed(DefaultParallelCalls)
	if n := testutil.ToFloat64(calls.WithLabelValues("DescribeInstanceStatus", awscalls.ResultSuccess)); n != 20 {
		t.Errorf("health_router_aws_calls_total{DescribeInstanceStatus,success} = %v for two polls of 1000 instances, want 20", n)
	}
	if calls, maxFlight, _, _ := srv.Stats(); calls != 20 || maxFlight > DefaultParallelCalls {
		t.Errorf("%d calls, %d at once", calls, maxFlight)
	}
	t.Logf("1000 instances, 10 calls of %s: one at a time %s, %d at a time %s (%.1fx)", srv.Latency, one, DefaultParallelCalls, four, float64(one)/float64(four))
}

// TestPollReportsEveryImpaired: every poll tells the engine of every instance EC2 shows
// impaired now, before any finding is handed over and whether or not it has been impaired two
// minutes (issue 36, defect 13: the repair cut-off counted only what it had decided). An
// instance recovered is left out at the next poll.
func TestPollReportsEveryImpaired(t *testing.T) {
	f := newFixture(t, Options{})
	a, b, c := id(1), id(2), id(3)
	f.ec2.Add(a, &harness.Instance{InstanceStatus: "impaired"})
	f.ec2.Add(b, &harness.Instance{SystemStatus: "impaired", ImpairedSince: t0.Add(-5 * time.Minute)})
	f.ec2.Add(c, &harness.Instance{})
	f.list.set(a, b, c)
	var got [][]string
	f.p.WithImpairedReport(func(ids []string) {
		if n := len(f.rec.take()); n != 0 {
			t.Errorf("told after %d findings were handed over, want before", n)
		}
		got = append(got, ids)
	})
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if evs := f.rec.take(); len(evs) != 1 || evs[0].Instances[0] != b {
		t.Fatalf("first poll handed %v, want b's finding", evs)
	}
	f.ec2.Set(a, func(in *harness.Instance) { in.InstanceStatus = "ok" })
	f.clock.Step(time.Minute)
	if err := f.poll(t); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{a, b}, {b}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("told %v, want %v", got, want)
	}
}
