package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Alertmanager is a real Prometheus Alertmanager on a loopback port, built by
// test/tools/alertmanager-bin.sh (ALERTMANAGER_BIN).
type Alertmanager struct {
	URL string
	cmd *exec.Cmd
}

// alertmanagerConfig routes every alert to a receiver that notifies nobody: the tests
// read alerts through the API only.
const alertmanagerConfig = `route:
  receiver: "null"
receivers:
  - name: "null"
`

// StartAlertmanager starts Alertmanager with its data in dir: ALERTMANAGER_BIN, or the binary
// test/tools/alertmanager-bin.sh builds and caches (waiting for a build under way, as make
// test's background build). It fails when neither gives an executable: the gate's tests need
// the real server.
func StartAlertmanager(dir string) (*Alertmanager, error) {
	bin := os.Getenv("ALERTMANAGER_BIN")
	if bin == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		build := exec.Command(filepath.Join(root, "test/tools/alertmanager-bin.sh"))
		build.Stderr = os.Stderr
		out, err := build.Output()
		if err != nil {
			return nil, fmt.Errorf("ALERTMANAGER_BIN is not set and test/tools/alertmanager-bin.sh failed: %w", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("ALERTMANAGER_BIN=%s is not an executable (build it with test/tools/alertmanager-bin.sh)", bin)
	}
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte(alertmanagerConfig), 0o600); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting alertmanager: %w", err)
	}
	am := &Alertmanager{URL: "http://" + addr, cmd: cmd}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(am.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return am, nil
			}
		}
	}
	am.Stop()
	return nil, fmt.Errorf("alertmanager did not become ready on %s within 30s", addr)
}

// Stop kills the server; its address then refuses connections.
func (a *Alertmanager) Stop() {
	if a.cmd.ProcessState == nil {
		_ = a.cmd.Process.Kill()
		_ = a.cmd.Wait()
	}
}

// PostedAlert is an alert as POST /api/v2/alerts takes it.
type PostedAlert struct {
	Labels   map[string]string `json:"labels"`
	StartsAt time.Time         `json:"startsAt,omitzero"`
	EndsAt   time.Time         `json:"endsAt,omitzero"`
}

// Post sends alerts as Prometheus does. An alert with EndsAt in the past resolves it.
func (a *Alertmanager) Post(alerts ...PostedAlert) error {
	body, err := json.Marshal(alerts)
	if err != nil {
		return err
	}
	resp, err := http.Post(a.URL+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("posting alerts: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("posting alerts: %s", resp.Status)
	}
	return nil
}

// Silence silences alerts whose label name equals value for an hour.
func (a *Alertmanager) Silence(name, value string) error {
	now := time.Now().UTC()
	body, _ := json.Marshal(map[string]any{
		"matchers": []map[string]any{{"name": name, "value": value, "isRegex": false, "isEqual": true}},
		"startsAt": now.Add(-time.Minute), "endsAt": now.Add(time.Hour), "createdBy": "health-router tests", "comment": "test",
	})
	resp, err := http.Post(a.URL+"/api/v2/silences", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("posting a silence: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("posting a silence: %s", resp.Status)
	}
	return nil
}
