package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

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

// TestDemo runs `make demo`'s program (moto_server and envtest for real, about 25 s with
// the envtest binaries built) and checks that a newcomer sees the report and no stack trace.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs moto_server and envtest (about 25 s)")
	}
	cmd := exec.Command("go", "run", ".")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	all := stdout.String() + stderr.String()
	for _, bad := range []string{"was never called", "Detected at:", "goroutine ", "panic"} {
		if strings.Contains(all, bad) {
			t.Errorf("demo output contains %q:\n%s", bad, all)
		}
	}
	for _, want := range []string{"==> starting moto_server", "What the router did, per NodeClaim:", "NODECLAIM", "DELETED (Karpenter drains it)", "deferred", "Dead-letter queue:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, stdout.String())
		}
	}
	if testing.Verbose() {
		os.Stdout.Write(stdout.Bytes())
	}
}
