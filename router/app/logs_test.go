package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// TestRouteLogs: what client-go (leader election) and controller-runtime log through klog and
// logr comes out as the router's JSON lines, at their level.
func TestRouteLogs(t *testing.T) {
	var buf bytes.Buffer
	RouteLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(klog.ClearLogger)
	klog.Infof("attempting to acquire leader lease %s...", "health-router/health-router.healthrouter.io")
	klog.ErrorS(nil, "error retrieving resource lock", "lock", "health-router.healthrouter.io")
	klog.V(4).InfoS("below the level: not written")
	ctrl.Log.WithName("manager").Info("Stopping and waiting for caches")
	klog.Flush()

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q (%v)", line, err)
		}
		lines = append(lines, m)
	}
	want := []struct{ level, msg string }{
		{"INFO", "attempting to acquire leader lease health-router/health-router.healthrouter.io..."},
		{"ERROR", "error retrieving resource lock"},
		{"INFO", "Stopping and waiting for caches"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if lines[i]["level"] != w.level || lines[i]["msg"] != w.msg {
			t.Errorf("line %d: %v, want level %s msg %q", i, lines[i], w.level, w.msg)
		}
	}
	if lines[1]["lock"] != "health-router.healthrouter.io" {
		t.Errorf("klog's key-value pairs are lost: %v", lines[1])
	}
}

// TestShutdownSink: the manager's "leader election lost", reported on every shutdown of a run
// with leader election, is an error while the router runs and Info once it is stopping.
func TestShutdownSink(t *testing.T) {
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	log := logr.New(shutdownSink{LogSink: logr.FromSlogHandler(slog.NewJSONHandler(&buf, nil)).GetSink(), ctx: ctx}).WithName("manager").WithValues("k", "v")
	lost := errors.New("leader election lost")

	cut := fmt.Errorf("Post \"https://127.0.0.1/apis/events.k8s.io/v1/namespaces/default/events\": %w", context.Canceled)
	log.Error(lost, "error received after stop sequence was engaged")  // running: the lease was lost
	log.Error(cut, "Unable to write event (may retry after sleeping)") // running: a cancelled call is an error
	cancel()
	log.Error(lost, "error received after stop sequence was engaged")               // stopping: asked for
	log.Error(errors.New("boom"), "error received after stop sequence was engaged") // stopping, another error
	log.Error(cut, "Unable to write event (may retry after sleeping)")              // stopping: the Event broadcaster's last write, cut short

	var levels, msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if m["k"] != "v" {
			t.Errorf("values lost: %v", m)
		}
		levels, msgs = append(levels, m["level"].(string)), append(msgs, m["msg"].(string))
	}
	if want := []string{"ERROR", "ERROR", "INFO", "ERROR", "INFO"}; !slices.Equal(levels, want) {
		t.Errorf("levels %v, want %v (%v)", levels, want, msgs)
	}
	if msgs[2] != "leader election ended with the shutdown" || !strings.HasPrefix(msgs[4], "Unable to write event") {
		t.Errorf("messages %q", msgs)
	}
}
