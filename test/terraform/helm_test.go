package terraform

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/test/harness"
)

// helmBinary is HELM_BIN, or the helm test/tools/helm-bin.sh builds and caches. No helm fails
// the test: the chart is what the Terraform output is for.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HELM_BIN"); p != "" {
		return p
	}
	out, err := exec.Command(filepath.Join(moduleDir, "..", "test", "tools", "helm-bin.sh")).Output()
	if err != nil {
		t.Fatalf("HELM_BIN is not set and test/tools/helm-bin.sh failed: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// checkHelmValues renders the chart with the module's helm_values output as it is (helm
// template -f), and checks the router's environment (a want of "" means: not set) and the
// ServiceAccount's IRSA annotation (roleARN "" means: none).
func checkHelmValues(t *testing.T, values string, want map[string]string, roleARN string) {
	t.Helper()
	if values == "" {
		t.Fatal("the helm_values output is empty")
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(moduleDir, "..", "deploy", "charts", "health-router")
	cmd := exec.Command(helmBinary(t), "template", "health-router", chart, "--namespace", "health-router", "-f", file)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template -f <helm_values>: %v\n%s\nvalues:\n%s", err, stderr.String(), values)
	}
	var deployment *appsv1.Deployment
	var sa *corev1.ServiceAccount
	dec := k8syaml.NewYAMLOrJSONDecoder(&stdout, 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		switch obj["kind"] {
		case "Deployment":
			deployment = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, deployment); err != nil {
				t.Fatal(err)
			}
		case "ServiceAccount":
			sa = &corev1.ServiceAccount{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, sa); err != nil {
				t.Fatal(err)
			}
		}
	}
	if deployment == nil || sa == nil {
		t.Fatalf("the chart rendered no Deployment or no ServiceAccount:\n%s", stdout.String())
	}
	env := map[string]string{}
	for _, e := range deployment.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	if got := sa.Annotations["eks.amazonaws.com/role-arn"]; got != roleARN {
		t.Errorf("ServiceAccount role-arn annotation %q, want %q", got, roleARN)
	}
	// The role trusts (IRSA) or is associated with (Pod Identity) health-router/health-router.
	if sa.Name != "health-router" || deployment.Spec.Template.Spec.ServiceAccountName != sa.Name {
		t.Errorf("ServiceAccount %q, Deployment runs as %q, want health-router", sa.Name, deployment.Spec.Template.Spec.ServiceAccountName)
	}
}

// installWithHelmValues is the README's install against envtest's kube-apiserver (with the
// Karpenter CRDs): `helm upgrade --install --create-namespace -f <helm_values>`, then the
// Deployment the API server stored must carry the intake queue.
func installWithHelmValues(t *testing.T, values, queueURL string) {
	t.Helper()
	// envtest logs through controller-runtime; without a logger it prints a stack trace.
	ctrl.SetLogger(logr.Discard())
	cfg := harness.KubeAPIServerBare(t) // the chart installs the router's own CRD
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(moduleDir, "..", "deploy", "charts", "health-router")
	cmd := exec.Command(helmBinary(t), "upgrade", "--install", "health-router", chart,
		"--namespace", "health-router", "--create-namespace", "-f", file, "--kubeconfig", kubeconfig)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir+"/cache", "HELM_CONFIG_HOME="+dir+"/config", "HELM_DATA_HOME="+dir+"/data")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm upgrade --install -f <helm_values>: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "health-router doctor") {
		t.Errorf("the install's notes give no doctor command:\n%s", out)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "health-router", Name: "health-router"}, d); err != nil {
		t.Fatalf("the installed Deployment: %v", err)
	}
	var got string
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "HEALTH_ROUTER_QUEUE_URL" {
			got = e.Value
		}
	}
	if got != queueURL {
		t.Errorf("installed HEALTH_ROUTER_QUEUE_URL = %q, want %q", got, queueURL)
	}
}
