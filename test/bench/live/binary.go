package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// routerProc is the health-router binary, run as in production (`health-router run
// --kubeconfig`): its RSS and heap are its own, and killing it is a crash mid-work.
type routerProc struct {
	cmd            *exec.Cmd
	metrics, probe int
	done           chan error
}

// buildRouter builds bin/health-router's command into dir.
func buildRouter(root, dir string) (string, error) {
	bin := filepath.Join(dir, "health-router")
	build := exec.Command("go", "build", "-o", bin, "./cmd/health-router")
	build.Dir, build.Stderr = root, os.Stderr
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("building the router: %w", err)
	}
	return bin, nil
}

func startRouter(ctx context.Context, bin, kubeconfig, queueURL, dlqURL, motoURL string, f flags) (*routerProc, error) {
	p := &routerProc{metrics: freePort(), probe: freePort(), done: make(chan error, 1)}
	p.cmd = exec.CommandContext(ctx, bin, "run",
		"--queue-url", queueURL, "--dead-letter-queue-url", dlqURL, "--signal", "delete-nodeclaim",
		"--kubeconfig", kubeconfig, "--leader-elect=false", "--aws-endpoint-url", motoURL, "--region", "eu-west-1", "--account", "any",
		"--feature-gates", "ReservedCapacity=false", "--wait-time", "1s", "--visibility-timeout", "10s", "--log-level", "error",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", p.metrics), "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", p.probe),
		"--kube-client-qps", fmt.Sprint(f.qps), "--kube-client-burst", fmt.Sprint(f.burst), "--instance-parallelism", fmt.Sprint(f.parallel))
	p.cmd.Stderr = os.Stderr
	p.cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench")
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the router: %w", err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	if err := waitReady(ctx, p.probe, p.done); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// kill ends the router at once (SIGKILL): a crash, an eviction; nothing is finished.
func (p *routerProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// rss returns the process's resident set, in bytes.
func (p *routerProc) rss() uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// metric sums the samples of name on /metrics whose labels include every one of labels
// (given as `key="value"`).
func (p *routerProc) metric(name string, labels ...string) (float64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.metrics))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(line, l) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			total += v
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return total, sc.Err()
}

// settle waits for the router's heap to settle after the cache filled, then reads RSS and
// the Go heap in use.
func (p *routerProc) weigh() (rss, heap uint64) {
	time.Sleep(5 * time.Second)
	h, _ := p.metric("go_memstats_heap_alloc_bytes")
	return p.rss(), uint64(h)
}
