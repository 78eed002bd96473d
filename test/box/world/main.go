// Command world starts the cluster in a box (test/box) with NODES kwok nodes (default 3) and
// keeps it up until Ctrl-C, printing its kubeconfig: `make world`. On a fresh machine it first
// builds what the box runs (test/tools' scripts, cached afterwards).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	ossignal "os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/health-router/health-router/test/box"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "world:", err)
		os.Exit(1)
	}
}

func run() error {
	// controller-runtime prints a stack trace if it logs before a logger is set (envtest does).
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	nodes := 3
	if v := os.Getenv("NODES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("NODES=%q: want a number of nodes", v)
		}
		nodes = n
	}
	// Ctrl-C reaches this program, not the box's components (each in a process group of its
	// own): the box is stopped in order.
	ctx, stop := ossignal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dir, err := os.MkdirTemp("", "health-router-world-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	b, err := box.Start(ctx, box.Options{Dir: dir, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		return err
	}
	stopped := func() error {
		fmt.Println("\nstopping kwok, kube-scheduler, kube-controller-manager, kube-apiserver and etcd")
		return b.Stop()
	}
	// At once: each waits for the node lifecycle controller's next pass (5 s) to know its Node.
	g, gctx := errgroup.WithContext(ctx)
	for i := range nodes {
		g.Go(func() error {
			_, err := b.AddNode(gctx, box.NodeSpec{Name: fmt.Sprintf("box-%d", i+1)})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return errors.Join(err, stopped())
	}
	fmt.Printf(`
The box is up (%s): etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and kwok
playing the kubelets of %d nodes. Try, in another terminal:
    export KUBECONFIG=%s
    kubectl get nodes -o wide
    kubectl create deployment web --image=web --replicas=3 && kubectl get pods -o wide -w
The components' logs are in %s.
Ctrl-C stops everything the box started.
`, time.Since(start).Round(time.Second), nodes, b.Kubeconfig(), b.Dir())
	<-ctx.Done()
	return stopped()
}
