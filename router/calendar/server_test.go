package calendar

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// TestServer: the Server is a manager Runnable of every replica that serves the calendar on
// its own listener until its context ends, and only the calendar.
func TestServer(t *testing.T) {
	s := NewServer("127.0.0.1:0", Handler(cluster(t), clocktesting.NewFakeClock(now), HandlerOptions{}), slog.New(slog.DiscardHandler))
	var _ manager.LeaderElectionRunnable = s
	if s.NeedLeaderElection() {
		t.Error("the calendar's server waits for the Lease: only the leader would serve it")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	addrCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	addr := s.Addr(addrCtx)
	if addr == nil {
		t.Fatal("the server did not listen within 10s")
	}
	for _, tt := range []struct {
		path string
		code int
		has  string
	}{
		{Path, http.StatusOK, "ip-10-0-1-3"},
		{"/metrics", http.StatusNotFound, "404 page not found"},
		{"/", http.StatusNotFound, "404 page not found"},
	} {
		resp, err := http.Get("http://" + addr.String() + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.has) {
			t.Errorf("GET %s: %s, want %d and %q in:\n%s", tt.path, resp.Status, tt.code, tt.has, b)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v, want nil once its context is done", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not stop within 10s of its context")
	}
	if _, err := http.Get("http://" + addr.String() + Path); err == nil {
		t.Error("the listener still answers after the server stopped")
	}
}

// TestServerAddressInUse: a listener that cannot be bound fails Start (and so the manager)
// with the address in the message.
func TestServerAddressInUse(t *testing.T) {
	first := NewServer("127.0.0.1:0", http.NotFoundHandler(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = first.Start(ctx) }()
	addr := first.Addr(ctx).String()
	err := NewServer(addr, http.NotFoundHandler(), slog.New(slog.DiscardHandler)).Start(ctx)
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Errorf("Start on %s in use: %v, want an error naming it", addr, err)
	}
}
