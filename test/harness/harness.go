// Package harness starts the real servers the integration suites run against, on loopback
// ports, and stops them when the test ends: moto_server for AWS APIs, and envtest's
// kube-apiserver and etcd with the Karpenter CRDs for Kubernetes.
package harness

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Region is the region every suite uses.
const Region = "eu-west-1"

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Moto starts moto_server on a free loopback port and returns its URL; it is stopped when
// the test ends. Without moto_server on PATH the test is skipped, loudly; CI machines have it.
func Moto(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("moto_server"); err != nil {
		t.Skip("SKIPPED LOUDLY: moto_server is not on PATH; the AWS integration tests need it (pip install 'moto[server]')")
	}
	url, stop, err := StartMoto()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return url
}

// StartMoto starts moto_server on a free loopback port, waits until it answers, and returns
// its URL and a function that stops it (for programs: the demo and the load harness).
func StartMoto() (string, func(), error) { return startMoto(false) }

// StartMotoDetached is StartMoto with moto_server in a process group of its own, so that a
// Ctrl-C at the terminal reaches the program and not moto_server: the program stops what
// uses moto (the router, whose receive would otherwise retry against a dead SQS through its
// whole shutdown grace period) before it stops moto. The program must call the stop function.
func StartMotoDetached() (string, func(), error) { return startMoto(true) }

func startMoto(detached bool) (string, func(), error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return "", nil, fmt.Errorf("moto_server is not on PATH (pip install 'moto[server]'): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	if detached {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting moto_server: %w", err)
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if resp, err := http.Get(url + "/moto-api/"); err == nil {
			resp.Body.Close()
			return url, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("moto_server did not answer on %s within 60s", url)
}

// AWSConfig returns an SDK config with static test credentials whose requests go through
// counter (which may be nil).
func AWSConfig(counter *Counter) aws.Config {
	cfg := aws.Config{
		Region:      Region,
		Credentials: credentials.NewStaticCredentialsProvider("testing", "testing", ""),
	}
	if counter != nil {
		cfg.HTTPClient = &http.Client{Transport: counter}
	}
	return cfg
}

// Counter is an http.RoundTripper that counts the requests that reach the wire, by the
// Query-protocol Action or JSON-protocol X-Amz-Target, so that tests can assert how many
// AWS calls the code made (retries included).
type Counter struct {
	mu    sync.Mutex
	calls map[string]int
}

// RoundTrip implements http.RoundTripper.
func (c *Counter) RoundTrip(r *http.Request) (*http.Response, error) {
	name := r.Header.Get("X-Amz-Target")
	if name == "" && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		if form, err := url.ParseQuery(string(body)); err == nil {
			name = form.Get("Action")
		}
	}
	c.mu.Lock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[name]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// Calls returns how many requests named name were sent.
func (c *Counter) Calls(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[name]
}

// KubeAPIServer starts envtest with the Karpenter and Karpenter AWS CRDs from the module
// cache, with binaries from test/tools/envtest-bins.sh (KUBEBUILDER_ASSETS, set by
// `make test`; built here when unset).
func KubeAPIServer(t testing.TB) *rest.Config {
	t.Helper()
	return KubeEnv(t).Config
}

// KubeAPIServerBare is KubeAPIServer without the router's own CRD (HealthRecord), for the
// suites that install it as the chart does.
func KubeAPIServerBare(t testing.TB) *rest.Config {
	t.Helper()
	return kubeEnv(t, false).Config
}

// KubeEnv is KubeAPIServer, returning the whole environment.
func KubeEnv(t testing.TB) *envtest.Environment {
	t.Helper()
	return kubeEnv(t, true)
}

func kubeEnv(t testing.TB, records bool) *envtest.Environment {
	t.Helper()
	// controller-runtime prints a stack trace when it logs before a logger is set (envtest
	// logs as it starts): give it one, warnings and errors only.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	// The binaries' directory goes to envtest itself, not through the process's environment:
	// tests that run in parallel (the drills) start envtests at once.
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		bins := exec.Command(repoPath("test/tools/envtest-bins.sh"))
		bins.Stderr = os.Stderr // the first build's progress
		out, err := bins.Output()
		if err != nil {
			t.Fatalf("building envtest binaries: %v", err)
		}
		assets = strings.TrimSpace(string(out))
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{crdDir(t, "sigs.k8s.io/karpenter"), crdDir(t, "github.com/aws/karpenter-provider-aws")},
		ErrorIfCRDPathMissing: true,
	}
	if records {
		path, err := recordsCRDFile()
		if err != nil {
			t.Fatal(err)
		}
		env.CRDDirectoryPaths = append(env.CRDDirectoryPaths, path)
	}
	if _, err := env.Start(); err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stopping envtest: %v", err)
		}
	})
	return env
}

func crdDir(t testing.TB, module string) string {
	t.Helper()
	dir, err := CRDDir(module)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// StartEnvtest starts envtest's kube-apiserver and etcd with the Karpenter CRDs, outside a
// test (the demo, the live bench): the binaries are built once by test/tools/envtest-bins.sh
// (its progress on stderr) unless KUBEBUILDER_ASSETS names them. Stop the returned
// environment when done.
func StartEnvtest() (*envtest.Environment, *rest.Config, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, nil, err
		}
		bins := exec.Command(filepath.Join(root, "test/tools/envtest-bins.sh"))
		bins.Stderr = os.Stderr // the first build's progress
		out, err := bins.Output()
		if err != nil {
			return nil, nil, fmt.Errorf("envtest binaries: %w", err)
		}
		os.Setenv("KUBEBUILDER_ASSETS", strings.TrimSpace(string(out)))
	}
	var dirs []string
	for _, m := range []string{"sigs.k8s.io/karpenter", "github.com/aws/karpenter-provider-aws"} {
		dir, err := CRDDir(m)
		if err != nil {
			return nil, nil, err
		}
		dirs = append(dirs, dir)
	}
	path, err := recordsCRDFile()
	if err != nil {
		return nil, nil, err
	}
	dirs = append(dirs, path)
	env := &envtest.Environment{CRDDirectoryPaths: dirs, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("starting envtest: %w", err)
	}
	return env, cfg, nil
}

// RecordsCRD is the router's own CRD (router/record's HealthRecord), as the chart ships it,
// relative to the repository's root.
const RecordsCRD = "deploy/charts/health-router/templates/healthrecords-crd.yaml"

// recordsCRDFile writes the chart's CRD as envtest installs it: the template's lines that
// only carry the release's labels and annotations (the `{{ }}` lines) left out. The rest of
// the file is plain YAML, the CRD as every release installs it.
func recordsCRDFile() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, RecordsCRD))
	if err != nil {
		return "", err
	}
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "{{") {
			keep = append(keep, l)
		}
	}
	dir, err := os.MkdirTemp("", "health-router-crd-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "healthrecords-crd.yaml")
	return path, os.WriteFile(path, []byte(strings.Join(keep, "\n")), 0o644)
}

// CRDDir returns the directory of a module's CRDs (pkg/apis/crds) in the module cache: the
// Karpenter CRDs the suites, the demo and the bench load into envtest.
func CRDDir(module string) (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		return "", fmt.Errorf("locating module %s: %w", module, err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "apis", "crds")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("CRDs of %s: %w", module, err)
	}
	return dir, nil
}

// RepoRoot returns the repository's root: the first directory above the working directory
// that holds go.mod.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; dir != "/"; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("not inside the repository (no go.mod above %s)", wd)
}

// repoPath returns a path inside the repository from this file's package directory.
func repoPath(rel string) string {
	root, err := RepoRoot()
	if err != nil {
		return rel
	}
	return filepath.Join(root, rel)
}

// Proxy forwards TCP connections to a server, and can cut it off: an outage as the
// client sees it (connections dropped, new ones refused), without stopping the server.
type Proxy struct {
	Addr   string
	target string
	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]bool
}

// NewProxy listens on a loopback port and forwards to target (host:port).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: l.Addr().String(), target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { l.Close(); p.Down() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *Proxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

// Down drops every connection and refuses new ones.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// Up lets connections through again.
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
