package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/test/harness"
)

// lockedBuffer is a bytes.Buffer that the router's goroutines may write at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestShutdownQuiet: a SIGTERM (the context of run cancelled) to a leader busy with its
// sources ends app.Run with no error (exit 0) and no line at level ERROR: a rolling update
// must not page anyone. Every line, klog's (leader election) included, is JSON.
func TestShutdownQuiet(t *testing.T) {
	s := newStage(t)
	// The production defaults, as `health-router run` parses them: leader election, the
	// poller, node marks, pod Events.
	o, err := options.ParseRun([]string{
		"--queue-url", s.intakeURL, "--dead-letter-queue-url", s.dlqURL, "--region", harness.Region, "--account", options.OriginAny,
		"--aws-endpoint-url", s.moto, "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--leader-election-namespace", "default", "--wait-time", "1s", "--instance-status-interval", "10s",
	}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: o.LogLevel}))
	s.pool("default", nil)
	// Three runs, each stopped once it leads: the manager's stop sequence logs its error or
	// not depending on which of two ready channels it reads first.
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- app.Run(ctx, o, s.restCfg, prometheus.NewRegistry(), log) }()

		// Leading, with an event through the queue.
		if err := wait.PollUntilContextTimeout(s.ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			lease := &coordinationv1.Lease{}
			err := s.kube.Get(ctx, client.ObjectKey{Namespace: "default", Name: o.LeaderElectionID}, lease)
			return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "", nil
		}); err != nil {
			cancel()
			t.Fatalf("run %d did not lead: %v\n%s", i, err, logs.String())
		}
		id := fmt.Sprintf("i-0a1b2c3d4e5f6000%d", i)
		s.node("default", id)
		s.put("aws.ec2", "EC2 Instance Rebalance Recommendation", map[string]string{"instance-id": id}, "arn:aws:ec2:eu-west-1:123456789012:instance/"+id)
		time.Sleep(2 * time.Second) // a receive loop, the poller and the controllers at work

		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run %d ended with %v, want nil (exit 0)", i, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("run %d did not end within 60s of its context\n%s", i, logs.String())
		}
	}

	if testing.Verbose() {
		t.Log(logs.String())
	}
	var klogLines int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		if m["level"] == "ERROR" {
			t.Errorf("an ERROR line on a normal shutdown: %s", line)
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, "leader lease") {
			klogLines++ // client-go's leader election logs through klog
		}
	}
	if klogLines == 0 {
		t.Errorf("no line of the leader election (klog) among the router's:\n%s", logs.String())
	}
}
