package box

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// stopGrace is how long a component has to exit after SIGTERM before its process group is
// killed: the controller-manager and the scheduler stop their informers and exit in well under
// a second; kwok at once.
const stopGrace = 10 * time.Second

// process is one of the box's servers, in a process group of its own (so that a Ctrl-C at
// the terminal reaches the program that owns the box, which stops it in order, and never the
// server alone), its output in a file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit, once done is closed
}

// startProcess starts bin with args, its stdout and stderr appended to logPath.
func startProcess(name, logPath string, env []string, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error naming the process and the end of its log if it has exited, nil
// while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); the end of %s:\n%s", p.name, p.err, p.log, Tail(p.log, 20))
	default:
		return nil
	}
}

// stop sends SIGTERM to the process group, and SIGKILL after stopGrace.
func (p *process) stop() error {
	pgid := p.cmd.Process.Pid
	if err := p.exited(); err != nil {
		return nil // already gone; whoever cared saw it exit
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
	return fmt.Errorf("%s did not stop within %s of SIGTERM: killed", p.name, stopGrace)
}

// waitHealthy polls url until it answers 200, the process exits, or ctx ends. The components'
// serving certificates are self-signed (their --cert-dir), so the probe does not verify them.
func (p *process) waitHealthy(ctx context.Context, url string) error {
	hc := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // a loopback probe of a self-signed test server
	}
	defer hc.CloseIdleConnections()
	for {
		if err := p.exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy at %s: %w; the end of %s:\n%s", p.name, url, ctx.Err(), p.log, Tail(p.log, 20))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Tail returns the last n lines of a file, for an error that says why a component (or a
// process a test runs beside the box) failed.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stopAll stops the processes in reverse order of start.
func stopAll(procs []*process) error {
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		errs = append(errs, procs[i].stop())
	}
	return errors.Join(errs...)
}
