// Package tools holds the scripts that build the test tools; its test checks what the
// envtest build tells a newcomer, and that concurrent callers share one build.
package tools

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// fakeGo stands in for the go command so that the script's messages, cache and lock can be
// checked in a second rather than a 15-minute compile: `go build -o F` writes an executable
// F after a pause, and every call is logged.
const fakeGo = `#!/bin/sh
echo "$*" >>"$FAKE_GO_LOG"
if [ "$1" = build ]; then
  sleep 1
  while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then shift; printf '#!/bin/sh\n' >"$1"; chmod +x "$1"; fi
    shift
  done
fi
`

func TestEnvtestBinsFirstBuild(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}
	cacheRoot := filepath.Join(dir, "cache")
	logPath := filepath.Join(dir, "go.log")
	run := func() (string, string) {
		cmd := exec.Command("./envtest-bins.sh")
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
			"HEALTH_ROUTER_CACHE="+cacheRoot, "FAKE_GO_LOG="+logPath)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("envtest-bins.sh: %v\n%s", err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	want := filepath.Join(cacheRoot, "envtest", "v1.37.0-etcdv3.7.3")

	// Two callers at once (make demo while make test builds): one builds, one waits.
	var wg sync.WaitGroup
	outs, errs := make([]string, 2), make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); outs[i], errs[i] = run() }()
	}
	wg.Wait()
	for i := range 2 {
		if strings.TrimSpace(outs[i]) != want {
			t.Errorf("caller %d: stdout %q, want only %s", i, outs[i], want)
		}
	}
	builder, waiter := errs[0], errs[1]
	if strings.Contains(builder, "waiting for it") {
		builder, waiter = waiter, builder
	}
	// The progress line's elapsed time ("[  0m00s]") is whatever the machine's load makes it:
	// only its form is checked.
	if !regexp.MustCompile(`\[ *[0-9]+m[0-9]{2}s\] fetching modules`).MatchString(builder) {
		t.Errorf("the build's stderr lacks the timed progress line:\n%s", builder)
	}
	for _, s := range []string{
		"first run on this machine", "kube-apiserver v1.37.0 and etcd v3.7.3 into " + want,
		"later runs reuse the cached binaries", "s] fetching modules", "compiling kube-apiserver", "compiling etcd",
		"done: cached in " + want,
	} {
		if !strings.Contains(builder, s) {
			t.Errorf("the build's stderr lacks %q:\n%s", s, builder)
		}
	}
	if !strings.Contains(waiter, "another process is building kube-apiserver and etcd into "+want+"; waiting for it") || strings.Contains(waiter, "compiling") {
		t.Errorf("the second caller's stderr:\n%s", waiter)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "build "); n != 2 {
		t.Errorf("%d go builds for two callers, want 2 (kube-apiserver and etcd, once):\n%s", n, log)
	}

	// Cached: the directory at once, nothing on stderr, nothing built.
	out, errOut := run()
	if strings.TrimSpace(out) != want || errOut != "" {
		t.Errorf("cached run: stdout %q, stderr %q", out, errOut)
	}
	if log2, _ := os.ReadFile(logPath); !bytes.Equal(log2, log) {
		t.Errorf("the cached run called go:\n%s", log2[len(log):])
	}
}
