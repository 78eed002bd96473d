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

// TestBoxBins checks the scripts that build what the cluster in a box runs besides envtest
// (test/box), with the go command faked as in TestEnvtestBinsFirstBuild: what each prints, its
// progress on stderr, one build for two callers at once, and nothing built once cached.
func TestBoxBins(t *testing.T) {
	for _, tc := range []struct {
		script string
		want   func(cache string) string // stdout: the directory or the binary
		gets   []string                  // in the one `go get`
		builds []string                  // the packages `go build` compiles, in order
		stderr []string
	}{{
		script: "world-bins.sh",
		want:   func(cache string) string { return filepath.Join(cache, "world", "v1.37.0") },
		gets:   []string{"k8s.io/kubernetes/cmd/kube-controller-manager@v1.37.0", "k8s.io/kubernetes/cmd/kube-scheduler@v1.37.0"},
		builds: []string{"k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kube-scheduler"},
		stderr: []string{"kube-controller-manager and kube-scheduler v1.37.0 into", "s] fetching modules (k8s.io/kubernetes v1.37.0)",
			"compiling kube-controller-manager", "compiling kube-scheduler", "done: cached in"},
	}, {
		script: "kwok-bin.sh",
		want:   func(cache string) string { return filepath.Join(cache, "kwok", "v0.8.0", "kwok") },
		gets:   []string{"sigs.k8s.io/kwok/cmd/kwok@v0.8.0"},
		builds: []string{"sigs.k8s.io/kwok/cmd/kwok"},
		stderr: []string{"building kwok v0.8.0 from source", "s] fetching modules (sigs.k8s.io/kwok v0.8.0)", "compiling kwok", "done: cached in"},
	}} {
		t.Run(tc.script, func(t *testing.T) {
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
				cmd := exec.Command("./" + tc.script)
				cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
					"HEALTH_ROUTER_CACHE="+cacheRoot, "FAKE_GO_LOG="+logPath)
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Run(); err != nil {
					t.Errorf("%s: %v\n%s", tc.script, err, stderr.String())
				}
				return stdout.String(), stderr.String()
			}
			want := tc.want(cacheRoot)

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
			if !regexp.MustCompile(`\[ *[0-9]+m[0-9]{2}s\] fetching modules`).MatchString(builder) {
				t.Errorf("the build's stderr lacks the timed progress line:\n%s", builder)
			}
			for _, s := range tc.stderr {
				if !strings.Contains(builder, s) {
					t.Errorf("the build's stderr lacks %q:\n%s", s, builder)
				}
			}
			if !strings.Contains(waiter, "waiting for it") || strings.Contains(waiter, "compiling") {
				t.Errorf("the second caller's stderr:\n%s", waiter)
			}
			b, err := os.ReadFile(logPath)
			if err != nil {
				t.Fatal(err)
			}
			var gets, builds []string
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				f := strings.Fields(l)
				switch {
				case len(f) > 0 && f[0] == "get":
					gets = append(gets, l)
				case len(f) > 0 && f[0] == "build":
					builds = append(builds, f[len(f)-1])
				}
			}
			// One go get for everything (inside a copy of go.mod: -modfile), one build per binary.
			if len(gets) != 1 || !strings.Contains(gets[0], "-modfile=") {
				t.Errorf("go get calls %q, want one with -modfile", gets)
			} else {
				for _, g := range tc.gets {
					if !strings.Contains(gets[0], g) {
						t.Errorf("go get %q lacks %s", gets[0], g)
					}
				}
			}
			if strings.Join(builds, " ") != strings.Join(tc.builds, " ") {
				t.Errorf("go build compiled %q, want %q once each", builds, tc.builds)
			}

			// Cached: the path at once, nothing on stderr, nothing built.
			out, errOut := run()
			if strings.TrimSpace(out) != want || errOut != "" {
				t.Errorf("cached run: stdout %q, stderr %q", out, errOut)
			}
			if b2, _ := os.ReadFile(logPath); !bytes.Equal(b2, b) {
				t.Errorf("the cached run called go:\n%s", b2[len(b):])
			}
		})
	}
}
