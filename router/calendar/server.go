package calendar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Timeouts of the calendar's listener: a client that opens a connection and trickles its
// request, or never reads the answer, holds a connection no longer than these.
const (
	serverReadHeaderTimeout = 5 * time.Second
	serverReadTimeout       = 10 * time.Second
	serverWriteTimeout      = 30 * time.Second
	serverIdleTimeout       = 60 * time.Second
	serverMaxHeaderBytes    = 16 << 10
	// serverShutdownTimeout is how long a stopping router waits for answers in flight.
	serverShutdownTimeout = 5 * time.Second
)

// Server serves a Handler on a listener of its own, apart from the metrics server, so that
// the calendar is off unless asked for and reachable only where its port is. It is a
// controller-runtime manager Runnable on every replica (NeedLeaderElection false): the
// manager starts it once its cache is synced and stops it with the others.
type Server struct {
	addr    string
	handler http.Handler
	log     *slog.Logger
	// listening receives the listener's address once it is bound (for tests that bind :0).
	listening chan net.Addr
}

// NewServer returns a Server of handler on addr (host:port).
func NewServer(addr string, handler http.Handler, log *slog.Logger) *Server {
	return &Server{addr: addr, handler: handler, log: log, listening: make(chan net.Addr, 1)}
}

// Addr is the listener's address once it is bound, or nil while ctx is not done.
func (s *Server) Addr(ctx context.Context) net.Addr {
	select {
	case a := <-s.listening:
		s.listening <- a
		return a
	case <-ctx.Done():
		return nil
	}
}

// NeedLeaderElection is false: every replica serves the calendar, which it reads from its
// own cache.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx is done, then shuts down gracefully.
func (s *Server) Start(ctx context.Context) error {
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listening for the calendar on %s: %w", s.addr, err)
	}
	s.listening <- l.Addr()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: serverReadHeaderTimeout,
		ReadTimeout:       serverReadTimeout,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       serverIdleTimeout,
		MaxHeaderBytes:    serverMaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	s.log.Info("serving the calendar", "address", l.Addr().String(), "path", Path)
	select {
	case err := <-done:
		return fmt.Errorf("serving the calendar: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serverShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Answers still in flight past the bound are cut: the router is stopping.
		_ = srv.Close()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("stopping the calendar's server: %w", err)
		}
	}
	return nil
}
