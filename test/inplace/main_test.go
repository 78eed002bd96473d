// Package inplace runs the reboot in place (router/inplace) on envtest's kube-apiserver and
// etcd with the Karpenter CRDs, and moto for EC2: real evictions through the Eviction API
// with the API server's PodDisruptionBudget checks (kubectl's drain helper, as the router
// runs it), real merge patches under resource versions, a real RebootInstances. envtest
// runs no kubelet and no controllers: the tests play the kubelet (pods Running and Ready, an
// evicted pod removed, the Node's Ready condition and boot ID through the status
// subresource) and the disruption controller (a budget's status).
package inplace

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/test/harness"
)

// The one envtest and moto of the package, and their clients.
var (
	cfg *rest.Config
	// direct reads and writes without a cache: the Runner reads fresh anyway, and what the
	// tests assert is what the API server holds.
	direct client.Client
	cs     kubernetes.Interface
	// motoURL is empty when moto_server is not on PATH: the tests skip, loudly.
	motoURL string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips itself under -short
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// controller-runtime prints a stack trace when it logs before a logger is set.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	start := time.Now()
	env, c, err := harness.StartEnvtest()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: the inplace suite needs envtest (kube-apiserver, etcd): %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	// The drain helper polls each evicted pod every second: client-go's default of 5
	// requests a second would make the rounds wait on the client, not the server.
	c.QPS, c.Burst = 100, 200
	cfg = c
	scheme, err := cluster.NewScheme()
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	if direct, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: client: %v\n", err)
		return 1
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: clientset: %v\n", err)
		return 1
	}
	if _, err := exec.LookPath("moto_server"); err == nil {
		url, stop, err := harness.StartMoto()
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			return 1
		}
		defer stop()
		motoURL = url
	}
	fmt.Fprintf(os.Stderr, "envtest and moto up in %s\n", time.Since(start).Round(100*time.Millisecond))
	return m.Run()
}

// background is the context of the suite's own calls.
var background = context.Background()
