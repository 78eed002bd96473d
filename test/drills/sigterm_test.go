package drills

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestSIGTERM: the leader, busy with a burst, gets the SIGTERM of a rolling update: the
// process exits 0, and what it wrote is JSON lines (klog's leader election among them) with
// none at level ERROR.
func TestSIGTERM(t *testing.T) {
	d := newDrill(t)
	const n = 10
	d.nodes(n)
	cmd := d.router("HEALTH_ROUTER_LEADER_ELECT=true", "HEALTH_ROUTER_LOG_LEVEL=info")
	d.until("leading", 60*time.Second, func() bool {
		lease := &coordinationv1.Lease{}
		err := d.kube.Get(d.ctx, client.ObjectKey{Namespace: "default", Name: "health-router.healthrouter.io"}, lease)
		return err == nil && lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
	})
	var bodies []string
	for i := range n {
		bodies = append(bodies, spot(i))
	}
	d.send(bodies)
	d.until("some signalled", 60*time.Second, func() bool { return d.signalled(n) > 0 })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if errors.As(err, &exit) || err != nil {
			t.Errorf("the router exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the router did not exit within 60s of SIGTERM")
	}

	b, err := os.ReadFile(cmd.Stderr.(*os.File).Name())
	if err != nil {
		t.Fatal(err)
	}
	leaderLines := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Errorf("not a JSON line: %q", line)
			continue
		}
		if m["level"] == "ERROR" {
			t.Errorf("an ERROR line on SIGTERM: %s", line)
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, "leader lease") {
			leaderLines++
		}
	}
	if leaderLines == 0 {
		t.Errorf("no JSON line of the leader election (klog):\n%s", b)
	}
}
