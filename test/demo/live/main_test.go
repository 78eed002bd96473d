package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// TestQuietLogsFulfilsControllerRuntime checks that the demo's logger setup is the one
// controller-runtime uses: without it, controller-runtime's root logger stays a promise and
// prints a stack trace once 30 s have passed.
func TestQuietLogsFulfilsControllerRuntime(t *testing.T) {
	var buf bytes.Buffer
	quietLogs(&buf)
	ctrl.Log.WithName("envtest").Info("informational, not shown")
	ctrl.Log.WithName("envtest").Error(errors.New("probe"), "a failure the demo shows")
	out := buf.String()
	if !strings.Contains(out, "a failure the demo shows") || !strings.Contains(out, "probe") {
		t.Errorf("controller-runtime's error did not reach the demo's logger: %q", out)
	}
	if strings.Contains(out, "informational") {
		t.Errorf("info-level logs are shown, want warnings and errors only: %q", out)
	}
}

// TestDemo runs `make demo KEEP=1`'s program (moto_server and envtest for real, about 25 s
// with the envtest binaries built): a newcomer sees the report with its reasons and no stack
// trace; while it is kept up, the metrics, the readiness probe and `health-router status`
// through the printed kubeconfig answer; and Ctrl-C stops everything it started (moto_server's
// port is closed, the kubeconfig removed).
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs moto_server and envtest (about 25 s)")
	}
	bin := filepath.Join(t.TempDir(), "demo")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "KEEP=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var stdout bytes.Buffer
	lines := bufio.NewScanner(pipe)
	up := false
	for lines.Scan() {
		stdout.WriteString(lines.Text() + "\n")
		if strings.HasPrefix(lines.Text(), "Ctrl-C stops everything") {
			up = true
			break
		}
	}
	if !up {
		cmd.Wait()
		t.Fatalf("the demo ended before it was kept up\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"==> starting moto_server", "==> waiting for the intake queue to be quiet", "quiet after", "What the router did, per NodeClaim, and why:",
		"NODECLAIM", "REASON", "DELETED (Karpenter drains it)", "deferred", "drain (no annotation: Karpenter's behaviour)", "Dead-letter queue:", "The demo is still up (KEEP=1)",
		"The pool in shadow (" + shadowPool, shadowClaim, "pool in shadow: Karpenter's behaviour, carried out by the router"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	kubeconfig := regexp.MustCompile(`kubectl --kubeconfig (\S+) get nodeclaims`).FindStringSubmatch(out)
	moto := regexp.MustCompile(`AWS_ENDPOINT_URL=(\S+) `).FindStringSubmatch(out)
	if kubeconfig == nil || moto == nil {
		t.Fatalf("no kubeconfig or moto URL printed:\n%s", out)
	}
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			t.Errorf("GET %s: %v", url, err)
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s\n%s", url, resp.Status, b)
		}
		return string(b)
	}
	if m := get("http://" + keptMetrics + "/metrics"); !strings.Contains(m, "health_router_") {
		t.Errorf("no health_router_ metrics on %s", keptMetrics)
	}
	get("http://" + keptProbes + "/readyz")
	status := exec.Command("go", "run", "../../../cmd/health-router", "status", "--kubeconfig", kubeconfig[1])
	if b, err := status.CombinedOutput(); err != nil || !strings.Contains(string(b), "kafka") {
		t.Errorf("health-router status through the printed kubeconfig: %v\n%s", err, b)
	}
	// Issue 38 item 14: shadow tried locally. The pool in shadow's retirement would have been
	// deferred; the router drained it as Karpenter would (the takeover is done in the demo).
	shadowStatus := exec.Command("go", "run", "../../../cmd/health-router", "status", "--shadow", "--kubeconfig", kubeconfig[1])
	if b, err := shadowStatus.CombinedOutput(); err != nil || !strings.Contains(string(b), shadowPool) || !strings.Contains(string(b), shadowClaim) {
		t.Errorf("health-router status --shadow through the printed kubeconfig: %v\n%s", err, b)
	} else {
		t.Logf("status --shadow:\n%s", b)
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { io.Copy(&stdout, pipe); exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the demo after Ctrl-C: %v\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the demo did not stop within 60s of Ctrl-C")
	}
	if _, err := os.Stat(kubeconfig[1]); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig is left behind: %v", err)
	}
	if resp, err := http.Get(moto[1] + "/moto-api/"); err == nil {
		resp.Body.Close()
		t.Errorf("moto_server still answers on %s after Ctrl-C", moto[1])
	}
	all := stdout.String() + stderr.String()
	for _, bad := range []string{"was never called", "Detected at:", "goroutine ", "panic"} {
		if strings.Contains(all, bad) {
			t.Errorf("demo output contains %q:\n%s", bad, all)
		}
	}
	if testing.Verbose() {
		os.Stdout.Write(stdout.Bytes())
	}
}
