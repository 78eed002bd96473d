// Package inproc runs the router in the test's process, as in production (app.Run), for the
// suites that need all of it beside other parts (the real Karpenter, the cluster in a box). It
// is apart from test/harness, which the router's own packages' tests import.
package inproc

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/test/harness"
)

// Router runs the router as in production (app.Run, with its own metrics registry) on the
// API server of cfg, with o, until stop is called or the test ends; stop reports the router's
// error as the test's, and says so when it does not stop within 30 s. AWS credentials for the
// local stand-ins are set in the test's environment. Its log is shown with go test -v.
func Router(t testing.TB, o options.Run, cfg *rest.Config) (stop func()) {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", "testing")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testing")
	t.Setenv("AWS_REGION", harness.Region)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o, cfg, prometheus.NewRegistry(), log) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("router: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("router did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	return stop
}
