package options

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// twoClusters is a kubeconfig of two contexts, the current one "staging".
const twoClusters = `apiVersion: v1
kind: Config
clusters:
- name: staging
  cluster: {server: "https://staging.example:6443"}
- name: prod
  cluster: {server: "https://prod.example:6443"}
users:
- name: me
  user: {token: t}
contexts:
- name: staging
  context: {cluster: staging, user: me}
- name: prod
  context: {cluster: prod, user: me}
current-context: staging
`

// TestRESTConfig: the cluster is found as kubectl finds it (--kubeconfig, $KUBECONFIG,
// --context), and outside a Pod with no kubeconfig the answer is ErrNoCluster, one line, not
// controller-runtime's in-cluster ERROR nor client-go's made-up http://localhost:8080
// (issue 38, 12).
func TestRESTConfig(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "config")
	if err := os.WriteFile(kubeconfig, []byte(twoClusters), 0o600); err != nil {
		t.Fatal(err)
	}
	// Not in a Pod, whatever runs the test.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for _, tt := range []struct {
		name                 string
		env                  string // $KUBECONFIG; a missing file stands for none (and keeps ~/.kube/config out)
		kubeconfig, kcontext string
		host                 string
		err                  error
		errText              string
	}{
		{name: "no kubeconfig, not in a Pod", env: filepath.Join(dir, "none"), err: ErrNoCluster},
		{name: "no kubeconfig, a context asked for", env: filepath.Join(dir, "none"), kcontext: "prod", err: ErrNoCluster, errText: "--context prod"},
		{name: "$KUBECONFIG, its current context", env: kubeconfig, host: "https://staging.example:6443"},
		{name: "--context", env: kubeconfig, kcontext: "prod", host: "https://prod.example:6443"},
		{name: "--kubeconfig wins over $KUBECONFIG", env: filepath.Join(dir, "none"), kubeconfig: kubeconfig, kcontext: "prod", host: "https://prod.example:6443"},
		{name: "--kubeconfig that does not exist", kubeconfig: filepath.Join(dir, "missing"), errText: "--kubeconfig " + filepath.Join(dir, "missing")},
		{name: "--context that does not exist", env: kubeconfig, kcontext: "dev", errText: "--context dev"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.env)
			cfg, err := RESTConfig(tt.kubeconfig, tt.kcontext)
			if tt.err != nil || tt.errText != "" {
				if err == nil || (tt.err != nil && !errors.Is(err, tt.err)) || !strings.Contains(err.Error(), tt.errText) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %v, want one line: %v %q", err, tt.err, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tt.host {
				t.Errorf("host %s, want %s", cfg.Host, tt.host)
			}
		})
	}
}

// TestKubeFlags: the commands that talk to the cluster take kubectl's --kubeconfig, --context
// and -n/--namespace, each with its environment variable, and -n keeps the router's namespace
// as its default.
func TestKubeFlags(t *testing.T) {
	args := []string{"--kubeconfig", "/k", "--context", "prod", "-n", "platform"}
	st, err := ParseStatus(args, env(nil), time.Now())
	if err != nil || st.Kubeconfig != "/k" || st.Context != "prod" || st.Namespace != "platform" {
		t.Errorf("status: %+v, %v", st, err)
	}
	dr, err := ParseDoctor(append(args, "--queue-url", "q", "--dead-letter-queue-url", "d"), env(nil))
	if err != nil || dr.Kubeconfig != "/k" || dr.Context != "prod" || dr.Namespace != "platform" {
		t.Errorf("doctor: %+v, %v", dr, err)
	}
	hb, err := NewHandback().Parse(append(args, "--pending", "drop"), env(nil))
	if err != nil || hb.Kubeconfig != "/k" || hb.Context != "prod" || hb.Namespace != "platform" {
		t.Errorf("handback: %+v, %v", hb, err)
	}
	dr, err = ParseDoctor([]string{"--queue-url", "q", "--dead-letter-queue-url", "d"}, env(map[string]string{"HEALTH_ROUTER_CONTEXT": "prod", "HEALTH_ROUTER_KUBECONFIG": "/e"}))
	if err != nil || dr.Context != "prod" || dr.Kubeconfig != "/e" || dr.Namespace != "health-router" {
		t.Errorf("doctor from the environment: %+v, %v", dr, err)
	}
}
