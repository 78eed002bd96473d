package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/version"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// noEnv is a process environment with no HEALTH_ROUTER_* variable, at a fixed time.
var noEnv = env{getenv: func(string) string { return "" }, now: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)}

// call runs the command line args as `name`, and returns its exit code, stdout and stderr.
func call(name string, e env, args ...string) (int, string, string) {
	var out, errw bytes.Buffer
	code := execute(context.Background(), name, args, e, &out, &errw)
	return code, out.String(), errw.String()
}

// golden compares got with testdata/<name>.golden; -update rewrites the file.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n%s", name, path, got)
	}
}

// TestHelp: help is on stdout, exit 0, nothing on stderr; each command's help has its usage,
// examples and every flag with its environment variable.
func TestHelp(t *testing.T) {
	for _, tt := range []struct {
		golden string
		args   []string
	}{
		{"root-help", []string{"--help"}},
		{"run-help", []string{"run", "--help"}},
		{"replay-help", []string{"replay", "--help"}},
	} {
		code, out, errw := call("health-router", noEnv, tt.args...)
		if code != 0 || errw != "" {
			t.Errorf("%v: exit %d, stderr %q; want 0 and nothing", tt.args, code, errw)
		}
		golden(t, tt.golden, out)
	}
	// The other ways to ask agree.
	for _, args := range [][]string{{"run", "-h"}, {"help", "run"}} {
		code, out, _ := call("health-router", noEnv, args...)
		_, want, _ := call("health-router", noEnv, "run", "--help")
		if code != 0 || out != want {
			t.Errorf("%v: exit %d, and not the help of run --help", args, code)
		}
	}
	if code, out, _ := call("health-router", noEnv); code != 0 || !strings.Contains(out, "Commands:") {
		t.Errorf("no arguments: exit %d, want 0 and the help:\n%s", code, out)
	}
}

// TestHelpFlags: every flag of every command ends with its environment variable, and the
// required ones come first.
func TestHelpFlags(t *testing.T) {
	envLine := regexp.MustCompile(`\(env HEALTH_ROUTER_[A-Z_]+\)$`)
	flagLine := regexp.MustCompile(`^(  -[a-z], |      )--[a-z]`)
	for _, command := range []string{"run", "doctor", "replay", "status", "version"} {
		_, out, _ := call("health-router", noEnv, command, "--help")
		_, flags, ok := strings.Cut(out, "\nFlags:\n")
		if !ok {
			t.Fatalf("%s --help has no flags:\n%s", command, out)
		}
		var names []string
		var last string
		for _, line := range strings.Split(strings.TrimRight(flags, "\n")+"\n      --end", "\n") {
			if flagLine.MatchString(line) {
				if last != "" && !envLine.MatchString(last) && !strings.Contains(names[len(names)-1], "--help") {
					t.Errorf("%s: the help of %s does not end with its environment variable: %q", command, names[len(names)-1], last)
				}
				names = append(names, strings.TrimSpace(line))
			}
			last = strings.TrimSpace(line)
		}
		names = names[:len(names)-1] // the end marker
		if len(names) < 2 || !strings.HasPrefix(names[len(names)-1], "-h, --help") {
			t.Fatalf("%s: flags %q, want -h, --help last", command, names)
		}
		switch command {
		case "run", "doctor":
			if !strings.HasPrefix(names[0], "--queue-url") || !strings.HasPrefix(names[1], "--dead-letter-queue-url") {
				t.Errorf("%s: flags begin %v, want the required --queue-url, --dead-letter-queue-url", command, names[:2])
			}
		case "replay":
			if !strings.HasPrefix(names[0], "--cluster") || !strings.HasPrefix(names[1], "--events") {
				t.Errorf("replay: flags begin %v, want the required --cluster, --events", names[:2])
			}
		}
	}
}

// TestMistakes: a mistake on the command line is one line on stderr and the way to the help,
// exit 2, nothing on stdout and no usage dump.
func TestMistakes(t *testing.T) {
	for _, tt := range []struct {
		golden string
		args   []string
	}{
		{"run-bad-flag", []string{"run", "--queue-ur", "x"}},
		{"run-bad-duration", []string{"run", "--queue-url", "q", "--dead-letter-queue-url", "d", "--visibility-timeout", "30"}},
		{"unknown-command", []string{"stauts"}},
	} {
		code, out, errw := call("health-router", noEnv, tt.args...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d, stdout %q; want 2 and nothing", tt.args, code, out)
		}
		if n := strings.Count(errw, "\n"); n != 2 {
			t.Errorf("%v: %d lines on stderr, want the error and the way to the help:\n%s", tt.args, n, errw)
		}
		golden(t, tt.golden, errw)
	}
	for args, want := range map[string]string{
		"run":                      "health-router run: --queue-url and --dead-letter-queue-url are required\nSee 'health-router run --help'.\n",
		"help nonsense":            "health-router help: unknown help topic \"nonsense\"\nSee 'health-router --help'.\n",
		"help stauts":              "health-router help: unknown help topic \"stauts\" (did you mean status?)\n",
		"-v":                       "health-router: unknown flag -v (did you mean --version?)\n",
		"run -queue-url x":         "health-router run: unknown flag -queue-url (did you mean --queue-url?)\nSee 'health-router run --help'.\n",
		"replay --events x":        "health-router replay: --cluster is required\n",
		"status kafka":             "health-router status: unexpected argument \"kafka\"",
		"status -o yaml":           "health-router status: --output \"yaml\": want table or json\n",
		"version --output=yaml":    "health-router version: --output \"yaml\": want text or json\n",
		"run --workers":            "health-router run: --workers needs a value\n",
		"doctor --frobnicate":      "health-router doctor: unknown flag --frobnicate\nSee 'health-router doctor --help'.\n",
		"--queue-url x":            "health-router: unknown flag --queue-url\n",
		"replay --now tomorrow -o": "health-router replay: -o/--output needs a value\n",
	} {
		code, _, errw := call("health-router", noEnv, strings.Fields(args)...)
		if code != 2 || !strings.Contains(errw, want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", args, code, errw, want)
		}
	}
	// From the environment, the same: the variable named.
	e := noEnv
	e.getenv = func(k string) string {
		return map[string]string{"HEALTH_ROUTER_QUEUE_URL": "q", "HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL": "d", "HEALTH_ROUTER_WAIT_TIME": "20"}[k]
	}
	code, _, errw := call("health-router", e, "run")
	if want := "health-router run: HEALTH_ROUTER_WAIT_TIME=\"20\" (for --wait-time): want a duration such as 30s"; code != 2 || !strings.Contains(errw, want) {
		t.Errorf("bad variable: exit %d, stderr %q; want 2 and %q", code, errw, want)
	}
}

func TestRunReplayDemo(t *testing.T) {
	code, out, errw := call("health-router", noEnv, "replay", "--cluster", "../../test/demo/cluster.yaml", "--events", "../../test/demo/events",
		"--aws", "../../test/demo/aws.yaml", "--now", "2026-11-21T12:00:00Z")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errw)
	}
	for _, want := range []string{"ACTION", "drain", "defer", "ignore", "skip", "dead-letter", "2026-11-28 02:00"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// A command that runs and fails is exit 1, without the way to the help.
	code, _, errw = call("health-router", noEnv, "replay", "--cluster", "nonexistent.yaml", "--events", "../../test/demo/events")
	if code != 1 || !strings.HasPrefix(errw, "health-router replay: ") || strings.Contains(errw, "--help") {
		t.Errorf("a missing snapshot: exit %d, stderr %q; want 1 and one line", code, errw)
	}
}

func TestProgramName(t *testing.T) {
	for arg0, want := range map[string]string{
		"/usr/local/bin/kubectl-health_router": "kubectl health-router",
		"kubectl-health_router.exe":            "kubectl health-router",
		"/usr/local/bin/health-router":         "health-router",
		"./bin/health-router":                  "health-router",
	} {
		if got := programName(arg0); got != want {
			t.Errorf("programName(%q) = %q, want %q", arg0, got, want)
		}
	}
	_, out, _ := call("kubectl health-router", noEnv, "help")
	if !strings.Contains(out, "  kubectl health-router <command> [flags]") || !strings.Contains(out, "Run 'kubectl health-router <command> --help'") {
		t.Errorf("usage:\n%s", out)
	}
	_, out, _ = call("kubectl health-router", noEnv, "status", "--help")
	if !strings.Contains(out, "  kubectl health-router status [flags]") {
		t.Errorf("status usage:\n%s", out)
	}
	_, _, errw := call("kubectl health-router", noEnv, "status", "--nodepol", "x")
	if want := "kubectl health-router status: unknown flag --nodepol (did you mean --nodepool?)\nSee 'kubectl health-router status --help'.\n"; errw != want {
		t.Errorf("error %q, want %q", errw, want)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := call("health-router", noEnv, "version")
	v := version.Get()
	if code != 0 || !strings.Contains(out, "version:    "+v.Version+"\n") || !strings.Contains(out, "go:         "+v.GoVersion+"\n") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	code, out, _ = call("health-router", noEnv, "version", "-o", "json")
	var got version.Info
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || got != v {
		t.Errorf("exit %d, %v: %+v, want %+v", code, err, got, v)
	}
	if code, out, _ := call("health-router", noEnv, "--version"); code != 0 || out != "health-router "+v.Version+"\n" {
		t.Errorf("--version: exit %d, %q", code, out)
	}
}

// TestBuildStampsVersion builds the binary as `make build` does, with VERSION and REVISION
// given, and runs its version command: the -X values are what it prints, and the Karpenter
// API version is the one go.mod requires.
func TestBuildStampsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	bin := filepath.Join(t.TempDir(), "health-router")
	build := exec.Command("make", "--no-print-directory", "-C", "../..", "build", "BIN="+bin, "VERSION=v9.8.7-test", "REVISION=0123456789abcdef0123456789abcdef01234567")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got version.Info
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/karpenter (v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod requires no sigs.k8s.io/karpenter")
	}
	if got.Version != "v9.8.7-test" || got.Commit != "0123456789abcdef0123456789abcdef01234567" || got.KarpenterVersion != string(m[1]) || !strings.HasPrefix(got.GoVersion, "go1.") {
		t.Errorf("version of the built binary: %+v; want v9.8.7-test, the commit given, Karpenter %s", got, m[1])
	}
}

// TestNoCluster: outside a cluster with no kubeconfig, status and handback say so in one line
// and exit 1, without controller-runtime's in-cluster ERROR line; doctor runs the checks that
// need no cluster and says what it could not check (issue 38, 12).
func TestNoCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for _, args := range [][]string{{"status"}, {"status", "--shadow"}, {"handback", "--pending", "drop", "--dry-run"}} {
		code, out, errw := call("health-router", noEnv, args...)
		want := "health-router " + args[0] + ": no cluster to talk to: no kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config) and not in a Pod\n"
		if code != 1 || out != "" || errw != want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 1 and %q", args, code, out, errw, want)
		}
	}
	// AWS unreachable too (a closed port): the credentials fail, and the cluster's checks are
	// told as not made, not the in-cluster error.
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_REGION", "eu-west-1")
	t.Setenv("AWS_MAX_ATTEMPTS", "1")
	code, out, errw := call("health-router", noEnv, "doctor", "--queue-url", "https://sqs.eu-west-1.amazonaws.com/111122223333/intake",
		"--dead-letter-queue-url", "https://sqs.eu-west-1.amazonaws.com/111122223333/dlq", "--aws-endpoint-url", "http://127.0.0.1:1")
	if code != 1 || !strings.Contains(out, "[?   ] RBAC: no cluster connection") || !strings.Contains(out, "[FAIL] AWS credentials") || strings.Contains(errw, "in-cluster") {
		t.Errorf("doctor: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errw)
	}
}

// TestDemoEventCount: docs/commands.md counts the demo's events as they are (it said 18 of 20,
// issue 38, 15): a file is one event, a .jsonl file one a line.
func TestDemoEventCount(t *testing.T) {
	entries, err := os.ReadDir("../../test/demo/events")
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".jsonl") {
			events++
			continue
		}
		b, err := os.ReadFile(filepath.Join("../../test/demo/events", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(line) != "" {
				events++
			}
		}
	}
	doc, err := os.ReadFile("../../docs/commands.md")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("and %d events of every kind in %d files", events, len(entries))
	if !strings.Contains(string(doc), want) {
		t.Errorf("docs/commands.md does not say %q", want)
	}
}
