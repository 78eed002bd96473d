package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/health-router/health-router/test/box"
	"github.com/health-router/health-router/test/harness"
)

// sampleEvery is how often the router's resources are sampled.
const sampleEvery = 5 * time.Second

// stopGrace is how long the router has to stop on SIGTERM at the end (its --shutdown-timeout
// is 10 s).
const stopGrace = 20 * time.Second

// routerProc is the router as a separate process, built from cmd/health-router, with flags
// equivalent to TestBoxRouterInFront's options: forward mode in front of Karpenter's queue,
// the box's kubeconfig, and every AWS call through the endpoint that sends scheduled events
// to the EC2 stand-in and the rest to moto. It is started again after each kill, as its
// Deployment would, and stopped with SIGTERM at the end.
type routerProc struct {
	t          *testing.T
	bin        string
	args       []string
	metricsURL string
	dir        string

	mu       sync.Mutex
	cur      *lifetime
	lives    []*lifetime
	stopping bool
}

// lifetime is one router process, from its start to its end, and the samples of its resources.
type lifetime struct {
	n        int
	pid      int
	started  time.Time
	ended    time.Time
	end      string // how it ended
	expected bool   // its end was the soak's doing (a kill, the stop)
	log      string
	done     chan struct{}
	samples  []sample
}

// sample is one reading of the router's resources: from /proc (RSS, open files) and from its
// /metrics (goroutines, heap, the API requests counted so far).
type sample struct {
	at                                  time.Time
	rss, fds, goroutines, heap, request float64
}

// startRouter builds the router and starts it, and returns once it serves /metrics.
func startRouter(t *testing.T, w *world) *routerProc {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "health-router")
	build := exec.Command("go", "build", "-o", bin, "./cmd/health-router")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	metrics, probe := harness.FreePort(t), harness.FreePort(t)
	r := &routerProc{
		t: t, bin: bin, dir: w.box.Dir(),
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics),
		args: []string{"run",
			"--queue-url=" + w.intake, "--dead-letter-queue-url=" + w.dlq,
			"--signal=forward", "--karpenter-queue-url=" + w.stage.QueueURL,
			"--workers=10", "--visibility-timeout=10s", "--wait-time=1s", "--handle-timeout=5s",
			"--region=" + harness.Region, "--account=any", "--aws-endpoint-url=" + w.endpoint,
			"--kubeconfig=" + w.box.Kubeconfig(),
			"--leader-elect=true", "--leader-election-namespace=default",
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
			fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
			"--shutdown-timeout=10s", "--node-marks=true",
			// The poller's shortest interval: time is compressed, and it is the router's second
			// source of every maintenance (EC2's own report).
			"--instance-status-interval=10s",
		},
	}
	t.Cleanup(r.stop)
	r.launch()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := r.scrape(); err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router does not serve %s within a minute; its log: %s", r.metricsURL, r.current().log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// launch starts a router process. A process that ends without the soak's doing is a finding:
// the test fails with the end of its log, and it is started again a second later.
func (r *routerProc) launch() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	n := len(r.lives) + 1
	l := &lifetime{n: n, log: filepath.Join(r.dir, fmt.Sprintf("router-%d.log", n)), done: make(chan struct{})}
	f, err := os.Create(l.log)
	if err != nil {
		r.t.Errorf("router log: %v", err)
		return
	}
	cmd := exec.Command(r.bin, r.args...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing", "AWS_REGION="+harness.Region, "AWS_EC2_METADATA_DISABLED=true")
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		r.t.Errorf("starting the router: %v", err)
		return
	}
	l.pid, l.started = cmd.Process.Pid, time.Now()
	r.lives = append(r.lives, l)
	r.cur = l
	go func() {
		err := cmd.Wait()
		f.Close()
		r.mu.Lock()
		l.ended = time.Now()
		if l.end == "" {
			l.end = fmt.Sprintf("exited on its own: %v", err)
		}
		expected, stopping := l.expected, r.stopping
		r.mu.Unlock()
		close(l.done)
		if !expected && !stopping {
			r.t.Errorf("%s router %d (pid %d) %s; the end of %s:\n%s", stamp(time.Now()), l.n, l.pid, l.end, l.log, box.Tail(l.log, 15))
			time.Sleep(time.Second)
			r.launch()
		}
	}()
}

// kill SIGKILLs the router and starts it again after pause.
func (r *routerProc) kill(pause time.Duration) {
	r.mu.Lock()
	l := r.cur
	if r.stopping || l == nil {
		r.mu.Unlock()
		return
	}
	l.expected, l.end = true, "SIGKILL"
	r.mu.Unlock()
	_ = syscall.Kill(l.pid, syscall.SIGKILL)
	<-l.done
	r.t.Logf("%s fault: router %d (pid %d) SIGKILLed after %s; started again in %s", stamp(time.Now()), l.n, l.pid, l.ended.Sub(l.started).Round(time.Second), pause)
	time.Sleep(pause)
	r.launch()
}

// current returns the running process's lifetime.
func (r *routerProc) current() *lifetime {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// ensureRunning fails the test unless a router process runs now.
func (r *routerProc) ensureRunning() {
	l := r.current()
	select {
	case <-l.done:
		r.t.Errorf("no router runs at the end of the run (the last ended: %s)", l.end)
	default:
	}
}

// stop stops the router with SIGTERM, as a rollout would, and fails the test when it does not
// exit within stopGrace.
func (r *routerProc) stop() {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	r.stopping = true
	l := r.cur
	if l != nil && l.end == "" {
		l.expected, l.end = true, "SIGTERM at the end"
	}
	r.mu.Unlock()
	if l == nil {
		return
	}
	_ = syscall.Kill(l.pid, syscall.SIGTERM)
	select {
	case <-l.done:
	case <-time.After(stopGrace):
		r.t.Errorf("router %d did not exit within %s of SIGTERM: killed", l.n, stopGrace)
		_ = syscall.Kill(l.pid, syscall.SIGKILL)
		<-l.done
	}
}

// sample reads the running router's resources every sampleEvery until ctx ends.
func (r *routerProc) sample(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(sampleEvery):
		}
		l := r.current()
		s, err := r.read(l.pid)
		if err != nil {
			continue // starting, or just killed: the next sample
		}
		r.mu.Lock()
		if l.ended.IsZero() {
			l.samples = append(l.samples, s)
		}
		r.mu.Unlock()
	}
}

// read takes one sample of process pid.
func (r *routerProc) read(pid int) (sample, error) {
	s := sample{at: time.Now()}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return s, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			s.rss = kb * 1024
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = float64(len(fds))
	m, err := r.scrape()
	if err != nil {
		return s, err
	}
	s.goroutines, s.heap, s.request = m["go_goroutines"], m["go_memstats_heap_alloc_bytes"], m["rest_client_requests_total"]
	return s, nil
}

// scrape reads the router's /metrics: each metric's samples summed over their labels.
func (r *routerProc) scrape() (map[string]float64, error) {
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(r.metricsURL)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", r.metricsURL, resp.Status)
	}
	return sumMetrics(resp.Body)
}

// sumMetrics sums each metric of the Prometheus text format over its series.
func sumMetrics(body io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if i := strings.LastIndex(line, "}"); i >= 0 {
			rest = line[i+1:]
		} else {
			rest = line[len(name):]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[name] += v
	}
	return out, sc.Err()
}

// outage is how long EC2 stays dark, or moto out of the router's reach, in one fault.
const outage = time.Minute

// The faults, as the table names them.
const (
	faultKill   = "router SIGKILLed and restarted"
	faultEC2    = "EC2 dark for a minute (DescribeInstanceStatus, ModifyInstanceEventStartTime: InternalError)"
	faultMotoUp = "SQS and moto's EC2 out of the router's reach for a minute"
)

var faultKinds = []string{faultKill, faultEC2, faultMotoUp}

// faults injects the soak's faults at random times (exponentially, mean apart): most often the
// router SIGKILLed and started again after one to five seconds, as its Deployment would; else
// EC2's scheduled-event calls failing for a minute (the stand-in answers InternalError), or
// SQS and the rest of moto cut off from the router for a minute (its proxy down).
type faults struct {
	w    *world
	r    *routerProc
	rng  *rand.Rand
	mean time.Duration
	done chan struct{}

	mu     sync.Mutex
	counts map[string]int
}

// newFaults spaces the faults so that a run sees about six (in the part of it that has faults),
// at least 30 s apart on average and at most 40 minutes.
func newFaults(w *world, r *routerProc, rng *rand.Rand, duration time.Duration) *faults {
	return &faults{w: w, r: r, rng: rng, mean: min(max(duration/10, 30*time.Second), 40*time.Minute), done: make(chan struct{}), counts: map[string]int{}}
}

// run injects faults until the next would come after until. The first is a kill, so that
// every run has one, within the first half of the time it has.
func (f *faults) run(ctx context.Context, until time.Time) {
	defer close(f.done)
	for first := true; ; first = false {
		wait := time.Duration(f.rng.ExpFloat64() * float64(f.mean))
		pause := time.Second + time.Duration(f.rng.Int64N(int64(4*time.Second)))
		which := faultKinds[max(f.rng.IntN(5)-2, 0)] // a kill three times in five, else one of the others
		if first {
			wait, which = time.Duration(f.rng.Float64()*float64(time.Until(until)/2)), faultKill
		}
		if time.Now().Add(wait).After(until) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		switch which {
		case faultKill:
			f.r.kill(pause)
		case faultEC2:
			f.w.t.Logf("%s fault: EC2 dark for %s", stamp(time.Now()), outage)
			f.w.ec2.SetFail(1 << 30)
			sleep(ctx, outage)
			f.w.ec2.SetFail(0)
		case faultMotoUp:
			f.w.t.Logf("%s fault: SQS and moto's EC2 out of the router's reach for %s", stamp(time.Now()), outage)
			f.w.moto.Down()
			sleep(ctx, outage)
			f.w.moto.Up()
		}
		f.mu.Lock()
		f.counts[which]++
		f.mu.Unlock()
	}
}

// wait returns once run has returned.
func (f *faults) wait() { <-f.done }

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
