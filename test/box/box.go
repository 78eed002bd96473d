// Package box is the cluster in a box: a real Kubernetes control plane on loopback ports, with
// kwok playing every kubelet, for the tests, the demo and the soak that need more of a cluster
// than an API server.
//
// It runs etcd and kube-apiserver (envtest's, with the Karpenter and the router's CRDs, as
// test/harness starts them), kube-controller-manager (the disruption, StatefulSet, ReplicaSet,
// Deployment, Job, node lifecycle, taint eviction, garbage collector, pod garbage collector
// and namespace controllers) and kube-scheduler, all built from one Kubernetes release
// (test/tools/envtest-bins.sh, world-bins.sh), and kwok (test/tools/kwok-bin.sh). So a
// PodDisruptionBudget's status is the disruption controller's, an eviction is judged against
// it by the API server, an evicted pod is recreated by its controller and placed by the
// scheduler, and a Node's lease lapses as a stopped kubelet's would.
//
// kwok plays the kubelet of every Node labelled LabelKubelet=kwok, by the stages in
// stages.yaml: a Node goes Ready when its kubelet starts, and keeps a lease and a heartbeat; a
// pod bound to it goes Running and Ready (after its box.healthrouter.io/start-delay, if any);
// a pod being deleted is removed. A kubelet that stops (SetNotReady, Reboot) is the label taken
// off: kwok's watch of labelled Nodes then drops the Node, so it stops renewing the lease and
// playing that Node's pods (a pod deleted meanwhile stays Terminating, as on a dead node). The
// node lifecycle controller does the rest, as in a cluster: 50 s later the Node is Unknown,
// tainted, and its pods marked not ready. Starting the kubelet again is the label put back; a
// reboot first writes what the kubelet reports on starting after one: a new boot ID, and its
// pods' containers stopped, which kwok then starts again. (A label and not kwok's usual
// annotation: kwok matches a label selector in its watch, on the server, so a Node that loses
// the label is deleted from kwok's view; an annotation selector is matched in kwok, and a Node
// that stops matching is still played. Nor a status patch alone: kwok's start stage would set
// the Node Ready again at once.)
//
// Each component logs to a file in the box's directory and runs in a process group of its
// own, stopped by Stop.
package box

import (
	"context"
	_ "embed" // stages.yaml
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/test/harness"
)

// LabelKubelet marks a Node whose kubelet kwok plays: "kwok" while it runs. A Node without
// it has no kubelet (stopped, or not yet started).
const LabelKubelet = "box.healthrouter.io/kubelet"

// startTimeout bounds a warm start (the binaries cached): envtest takes about 5 s, each
// component a second or two. A cold start builds the binaries first, outside this bound.
const startTimeout = 2 * time.Minute

// Controllers are the kube-controller-manager controllers the box runs: what a workload's
// availability through a node's maintenance depends on. Not the service-account token
// controller: envtest's API server runs without the ServiceAccount admission plugin, and
// kwok's pods mount nothing.
var Controllers = []string{
	"disruption-controller", "statefulset-controller", "replicaset-controller", "deployment-controller",
	"job-controller", "node-lifecycle-controller", "taint-eviction-controller", "garbage-collector-controller",
	"pod-garbage-collector-controller", "namespace-controller",
}

//go:embed stages.yaml
var stages []byte

// Options configure a box.
type Options struct {
	// Dir holds the logs, kubeconfigs and certificates; it must exist.
	Dir string
	// Log receives a line per component started and stopped; nil discards them.
	Log *slog.Logger
}

// Box is a running cluster in a box.
type Box struct {
	dir        string
	log        *slog.Logger
	env        *envtest.Environment
	cfg        *rest.Config
	client     client.Client
	kubeconfig string
	procs      []*process
	// stops stop what was started in the box after it was up (Karpenter), last first, before
	// the box's own components.
	stops []func() error
}

// New starts a box for a test and stops it when the test ends. Its directory is removed then,
// unless the test failed: then it is kept, and the test logs where each component's log is.
func New(t testing.TB) *Box {
	t.Helper()
	dir, err := os.MkdirTemp("", "box-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+20*time.Minute) // a cold start builds
	defer cancel()
	b, err := Start(ctx, Options{Dir: dir})
	if err != nil {
		t.Fatalf("starting the box (logs kept in %s): %v", dir, err)
	}
	t.Cleanup(func() {
		failed := t.Failed()
		if failed {
			for _, p := range b.procs {
				t.Logf("box: %s's log: %s", p.name, p.log)
			}
		}
		if err := b.Stop(); err != nil {
			t.Errorf("stopping the box: %v", err)
		}
		if !failed {
			os.RemoveAll(dir)
		}
	})
	return b
}

// Start builds what it needs (once per machine: test/tools' scripts, their progress on
// stderr), starts the control plane and kwok, and returns once all of them answer. On error
// everything started is stopped.
func Start(ctx context.Context, o Options) (_ *Box, err error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Box{dir: o.Dir, log: log}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Stop())
		}
	}()

	// envtest first: on a fresh machine its build compiles most of what the controller-manager
	// and the scheduler share with kube-apiserver.
	started := time.Now()
	if b.env, b.cfg, err = harness.StartEnvtest(); err != nil {
		return nil, err
	}
	log.Info("box: kube-apiserver and etcd up", "took", time.Since(started).Round(time.Millisecond))
	world, err := tool(ctx, "WORLD_BINS", "world-bins.sh")
	if err != nil {
		return nil, err
	}
	kwok, err := tool(ctx, "KWOK_BIN", "kwok-bin.sh")
	if err != nil {
		return nil, err
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	if b.client, err = client.New(b.cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, err
	}
	if b.kubeconfig, err = b.writeKubeconfig("admin", "box-admin"); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := b.startControllerManager(ctx, filepath.Join(world, "kube-controller-manager")); err != nil {
		return nil, err
	}
	if err := b.startScheduler(ctx, filepath.Join(world, "kube-scheduler")); err != nil {
		return nil, err
	}
	if err := b.startKwok(ctx, kwok); err != nil {
		return nil, err
	}
	log.Info("box: up", "took", time.Since(started).Round(time.Millisecond), "kubeconfig", b.kubeconfig)
	return b, nil
}

// startControllerManager runs kube-controller-manager with its own identity, without leader
// election (one per box), serving its health on a free loopback port.
func (b *Box) startControllerManager(ctx context.Context, bin string) error {
	kc, err := b.writeKubeconfig("kube-controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	return b.start(ctx, "kube-controller-manager", fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil, bin,
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false",
		"--controllers="+strings.Join(Controllers, ","),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir="+filepath.Join(b.dir, "kube-controller-manager-certs"),
		"--v=2")
}

// startScheduler runs kube-scheduler with its own identity, without leader election.
func (b *Box) startScheduler(ctx context.Context, bin string) error {
	kc, err := b.writeKubeconfig("kube-scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	return b.start(ctx, "kube-scheduler", fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil, bin,
		"--kubeconfig="+kc, "--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--leader-elect=false",
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir="+filepath.Join(b.dir, "kube-scheduler-certs"),
		"--v=2")
}

// startKwok runs kwok for the Nodes labelled LabelKubelet=kwok, with the box's stages. Its
// HOME is the box's directory, so a ~/.kwok/kwok.yaml on the machine is not read.
func (b *Box) startKwok(ctx context.Context, bin string) error {
	kc, err := b.writeKubeconfig("kwok", "system:node:kwok")
	if err != nil {
		return err
	}
	config := filepath.Join(b.dir, "kwok-stages.yaml")
	if err := os.WriteFile(config, stages, 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return b.start(ctx, "kwok", "http://"+addr+"/healthz", []string{"HOME=" + b.dir}, bin,
		"--kubeconfig="+kc, "--config="+config,
		"--manage-nodes-with-label-selector="+LabelKubelet+"=kwok",
		// kwok's default pod range is a /24: 254 pods in all.
		"--cidr=10.0.0.0/16",
		// A lease per Node, renewed every 10 s, as a kubelet's: kwok keeps none unless asked,
		// and the node lifecycle controller would see every Node's status stale after 50 s.
		"--node-lease-duration-seconds=40",
		"--server-address="+addr)
}

// start starts one component, logging to DIR/NAME.log, and waits until healthz answers.
func (b *Box) start(ctx context.Context, name, healthz string, env []string, bin string, args ...string) error {
	started := time.Now()
	p, err := startProcess(name, filepath.Join(b.dir, name+".log"), env, bin, args...)
	if err != nil {
		return err
	}
	b.procs = append(b.procs, p)
	if err := p.waitHealthy(ctx, healthz); err != nil {
		return err
	}
	b.log.Info("box: "+name+" up", "took", time.Since(started).Round(time.Millisecond), "log", p.log)
	return nil
}

// writeKubeconfig writes DIR/NAME.kubeconfig for a user of the given name in system:masters
// (envtest's API server authenticates it by a client certificate): each component its own
// identity, as in a cluster, with every right.
func (b *Box) writeKubeconfig(name, user string) (string, error) {
	u, err := b.env.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("user %s: %w", user, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(b.dir, name+".kubeconfig")
	return path, os.WriteFile(path, kc, 0o600)
}

// Stop stops what was started in the box (Karpenter), then kwok, the scheduler and the
// controller-manager, then the API server and etcd.
func (b *Box) Stop() error {
	var err error
	for i := len(b.stops) - 1; i >= 0; i-- {
		err = errors.Join(err, b.stops[i]())
	}
	b.stops = nil
	err = errors.Join(err, stopAll(b.procs))
	b.procs = nil
	if b.env != nil {
		err = errors.Join(err, b.env.Stop())
		b.env = nil
	}
	return err
}

// Client returns a client of the box's API server as an administrator, with the router's
// scheme (the core, Karpenter and router types).
func (b *Box) Client() client.Client { return b.client }

// Config returns the administrator's REST config.
func (b *Box) Config() *rest.Config { return rest.CopyConfig(b.cfg) }

// Kubeconfig returns the path of the administrator's kubeconfig (for kubectl, the router,
// Karpenter).
func (b *Box) Kubeconfig() string { return b.kubeconfig }

// Dir returns the box's directory: the components' logs (NAME.log) and kubeconfigs.
func (b *Box) Dir() string { return b.dir }

// tool returns the value of env if set, or else what the build script prints: a path. Its
// progress (a first build's) goes to stderr.
func tool(ctx context.Context, env, script string) (string, error) {
	if v := os.Getenv(env); v != "" {
		return v, nil
	}
	root, err := harness.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "test", "tools", script))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("test/tools/%s: %w", script, err)
	}
	return strings.TrimSpace(string(out)), nil
}
