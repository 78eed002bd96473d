// Package nodedrain runs the router's own drain of Nodes Karpenter does not manage
// (router/nodedrain) on envtest's kube-apiserver and etcd: real evictions, real
// PodDisruptionBudget checks by the API server. envtest runs no kubelet and no controllers:
// the test plays the kubelet (pods Running and Ready; a pod evicted is deleted at once) and
// the disruption controller (a budget's status).
package nodedrain

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/test/harness"
)

// The one envtest of the package, and its clients.
var (
	// kube reads through a cache, as the router's manager client does, and writes directly.
	kube client.Client
	// direct reads without the cache: what the test asserts is what the API server holds.
	direct client.Client
	cs     kubernetes.Interface
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test skips itself under -short; no envtest is started.
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// controller-runtime prints a stack trace when it logs before a logger is set.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	start := time.Now()
	// Without KUBEBUILDER_ASSETS the binaries are built (or found in the cache) by
	// test/tools/envtest-bins.sh, as `make test` does; failing that, the suite fails.
	env, cfg, err := harness.StartEnvtest()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the nodedrain suite needs envtest (kube-apiserver, etcd): %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	// The drain helper polls each evicted pod every second: client-go's default of 5
	// requests a second would make the test's rounds wait on the client, not the server.
	cfg.QPS, cfg.Burst = 100, 200
	// The cache's watches end before envtest stops: an open watch holds kube-apiserver's
	// shutdown until envtest gives up on it.
	stopCache, err := clients(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	defer stopCache()
	fmt.Fprintf(os.Stderr, "envtest up in %s\n", time.Since(start).Round(100*time.Millisecond))
	return m.Run()
}

// clients sets the package's clients up and returns what stops the cache (and waits for it).
func clients(cfg *rest.Config) (stop func(), err error) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	if kube, err = client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: c}}); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if direct, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Start(ctx)
	}()
	return func() { cancel(); <-done }, nil
}
