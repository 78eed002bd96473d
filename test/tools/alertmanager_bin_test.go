package tools

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeGoMod extends fakeGo with `go mod download -json`, answering a module directory
// ($FAKE_MOD_DIR) as the go command prints it.
const fakeGoMod = `#!/bin/sh
echo "$*" >>"$FAKE_GO_LOG"
if [ "$1" = mod ]; then
  printf '{\n\t"Path": "github.com/prometheus/alertmanager",\n\t"Dir": "%s",\n\t"Sum": "h1:x"\n}\n' "$FAKE_MOD_DIR"
  exit 0
fi
if [ "$1" = build ]; then
  [ -f ui/app/dist/index.html ] || { echo "no placeholder UI" >&2; exit 1; }
  sleep 1
  while [ $# -gt 0 ]; do
    if [ "$1" = -o ]; then shift; printf '#!/bin/sh\n' >"$1"; chmod +x "$1"; fi
    shift
  done
fi
`

// TestAlertmanagerBinFirstBuild checks what the first build says, that it builds from a
// copy of the module with the placeholder UI the module zip lacks, that concurrent callers
// share one build, and that a second run reuses the cached binary.
func TestAlertmanagerBinFirstBuild(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	mod := filepath.Join(dir, "mod")
	for _, d := range []string{bin, filepath.Join(mod, "cmd", "alertmanager"), filepath.Join(mod, "ui", "app")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(fakeGoMod), 0o755); err != nil {
		t.Fatal(err)
	}
	// The module cache is read-only, as the go command leaves it.
	if err := os.Chmod(filepath.Join(mod, "ui", "app"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(mod, "ui", "app"), 0o755) })
	cacheRoot := filepath.Join(dir, "cache")
	logPath := filepath.Join(dir, "go.log")
	run := func() (string, string) {
		cmd := exec.Command("./alertmanager-bin.sh")
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
			"HEALTH_ROUTER_CACHE="+cacheRoot, "FAKE_GO_LOG="+logPath, "FAKE_MOD_DIR="+mod)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("alertmanager-bin.sh: %v\n%s", err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	want := filepath.Join(cacheRoot, "alertmanager", "v0.34.2", "alertmanager")

	var wg sync.WaitGroup
	outs, errs := make([]string, 2), make([]string, 2)
	for i := range 2 {
		wg.Go(func() { outs[i], errs[i] = run() })
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
	for _, s := range []string{"first run on this machine", "alertmanager v0.34.2", "fetching github.com/prometheus/alertmanager@v0.34.2", "compiling alertmanager", "done: cached in"} {
		if !strings.Contains(builder, s) {
			t.Errorf("the build's stderr lacks %q:\n%s", s, builder)
		}
	}
	if !strings.Contains(waiter, "another process is building alertmanager") || strings.Contains(waiter, "compiling") {
		t.Errorf("the second caller's stderr:\n%s", waiter)
	}
	if fi, err := os.Stat(want); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("no executable at %s: %v", want, err)
	}
	log, _ := os.ReadFile(logPath)
	if n := strings.Count(string(log), "build "); n != 1 {
		t.Errorf("%d builds, want 1:\n%s", n, log)
	}
	if _, err := os.Stat(filepath.Join(mod, "ui", "app", "dist")); err == nil {
		t.Error("the placeholder UI was written into the module cache")
	}

	// Cached: no go call at all.
	before := len(log)
	out, stderr := run()
	log, _ = os.ReadFile(logPath)
	if strings.TrimSpace(out) != want || stderr != "" || len(log) != before {
		t.Errorf("second run: stdout %q stderr %q, go called: %v", out, stderr, len(log) != before)
	}
}
