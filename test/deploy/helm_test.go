package deploy_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/health-router/health-router/router/options"

	corev1 "k8s.io/api/core/v1"
)

// TestLint runs `helm lint --strict` with the defaults and with every chart-testing values set.
func TestLint(t *testing.T) {
	args := [][]string{nil}
	for _, name := range []string{"default", "irsa", "pod-identity", "servicemonitor", "custom-settings", "grafana-dashboard", "locked-down"} {
		args = append(args, []string{"-f", ciValues(t, name)})
	}
	for _, a := range args {
		out, _, err := runHelm(t, nil, append([]string{"lint", "--strict", chartDir(t)}, a...)...)
		if err != nil {
			t.Errorf("helm lint --strict %v: %v", a, err)
			continue
		}
		if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint --strict %v:\n%s", a, out)
		}
	}
}

// TestValuesSets renders each chart-testing values set and checks what it is for.
func TestValuesSets(t *testing.T) {
	t.Run("IRSA", func(t *testing.T) {
		m := decode(t, "-f", ciValues(t, "irsa"))
		if got := m.serviceAccount.Annotations["eks.amazonaws.com/role-arn"]; got != "arn:aws:iam::111122223333:role/hr-my-cluster-router" {
			t.Errorf("ServiceAccount role-arn annotation %q", got)
		}
		e := env(m.deployment.Spec.Template.Spec.Containers[0])
		if e["HEALTH_ROUTER_KARPENTER_QUEUE_URL"] != "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter-my-cluster" || e["HEALTH_ROUTER_REGION"] != "eu-west-1" {
			t.Errorf("environment %v", e)
		}
	})
	t.Run("Pod Identity", func(t *testing.T) {
		m := decode(t, "-f", ciValues(t, "pod-identity"), "--set", "fullnameOverride=hr")
		// The association names the ServiceAccount: its name holds whatever the fullname.
		if m.serviceAccount.Name != "health-router" || m.deployment.Spec.Template.Spec.ServiceAccountName != "health-router" {
			t.Errorf("ServiceAccount %q, Deployment runs as %q, want health-router", m.serviceAccount.Name, m.deployment.Spec.Template.Spec.ServiceAccountName)
		}
		if len(m.serviceAccount.Annotations) != 0 {
			t.Errorf("ServiceAccount annotations %v, want none (Pod Identity needs none)", m.serviceAccount.Annotations)
		}
		if m.clusterRoleBinding.Subjects[0].Name != "health-router" || m.roleBinding.Subjects[0].Name != "health-router" {
			t.Errorf("bindings name %q and %q", m.clusterRoleBinding.Subjects[0].Name, m.roleBinding.Subjects[0].Name)
		}
		if m.deployment.Name != "hr" {
			t.Errorf("Deployment %q, want the fullnameOverride hr", m.deployment.Name)
		}
	})
	t.Run("ServiceMonitor", func(t *testing.T) {
		if m := decode(t); m.serviceMonitor != nil {
			t.Error("the defaults render a ServiceMonitor")
		}
		m := decode(t, "-f", ciValues(t, "servicemonitor"))
		sm := m.serviceMonitor
		if sm == nil {
			t.Fatal("serviceMonitor.enabled renders no ServiceMonitor")
		}
		if sm.GetAPIVersion() != "monitoring.coreos.com/v1" || sm.GetLabels()["release"] != "prometheus" {
			t.Errorf("ServiceMonitor %s, labels %v", sm.GetAPIVersion(), sm.GetLabels())
		}
		eps, _, _ := unstructuredSlice(sm.Object, "spec", "endpoints")
		if len(eps) != 1 || eps[0]["port"] != "metrics" || eps[0]["interval"] != "30s" {
			t.Errorf("endpoints %v, want port metrics every 30s", eps)
		}
		sel, _, _ := unstructuredMap(sm.Object, "spec", "selector", "matchLabels")
		if len(sel) == 0 || !maps.Equal(sel, toAny(m.service.Labels, sel)) {
			t.Errorf("ServiceMonitor selects %v; the Service's labels are %v", sel, m.service.Labels)
		}
	})
	t.Run("Grafana dashboard", func(t *testing.T) {
		if m := decode(t); m.grafanaDashboard != nil {
			t.Error("the defaults render the Grafana dashboard's ConfigMap")
		}
		want, err := os.ReadFile(filepath.Join(chartDir(t), "dashboards", "health-router.json"))
		if err != nil {
			t.Fatal(err)
		}
		m := decode(t, "-f", ciValues(t, "grafana-dashboard"))
		cm := m.grafanaDashboard
		if cm == nil {
			t.Fatal("grafanaDashboard.enabled renders no ConfigMap")
		}
		// The kube-prometheus-stack sidecar's default label, the folder annotation, and the
		// chart's own labels.
		if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Karpenter" || cm.Labels["app.kubernetes.io/part-of"] != "health-router" {
			t.Errorf("ConfigMap %s: labels %v, annotations %v", cm.Name, cm.Labels, cm.Annotations)
		}
		if cm.Namespace != namespace {
			t.Errorf("ConfigMap in %q, want the release's %q", cm.Namespace, namespace)
		}
		got := cm.Data["health-router.json"]
		var a, b any
		if err := json.Unmarshal([]byte(got), &a); err != nil {
			t.Fatalf("the ConfigMap's health-router.json is not JSON: %v", err)
		}
		if err := json.Unmarshal(want, &b); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Error("the ConfigMap's dashboard differs from dashboards/health-router.json")
		}

		// Another sidecar label, and the sidecar's namespace.
		m = decode(t, "-f", ciValues(t, "default"), "--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=monitoring",
			"--set", "grafanaDashboard.labels.grafana_dashboard=null", "--set", "grafanaDashboard.labels.dashboards=health")
		if cm := m.grafanaDashboard; cm == nil || cm.Namespace != "monitoring" || cm.Labels["dashboards"] != "health" || cm.Labels["grafana_dashboard"] != "" {
			t.Errorf("ConfigMap %+v, want it in monitoring with the label dashboards=health only", cm)
		}
	})
	t.Run("custom settings", func(t *testing.T) {
		m := decode(t, "-f", ciValues(t, "custom-settings"))
		spec := m.deployment.Spec.Template.Spec
		ctr := spec.Containers[0]
		want := map[string]string{
			"HEALTH_ROUTER_QUEUE_URL":                "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-my-cluster",
			"HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL":    "https://sqs.eu-west-1.amazonaws.com/111122223333/hr-my-cluster-dlq",
			"HEALTH_ROUTER_KARPENTER_QUEUE_URL":      "https://sqs.eu-west-1.amazonaws.com/111122223333/Karpenter-my-cluster",
			"HEALTH_ROUTER_REGION":                   "eu-west-1",
			"HEALTH_ROUTER_CLUSTER_NAME":             "my-cluster",
			"HEALTH_ROUTER_ACCOUNT":                  "111122223333",
			"HEALTH_ROUTER_SENDER_IDS":               "AROAEXAMPLEDISPATCHER01,AROAEXAMPLEROUTER0001:ci",
			"HEALTH_ROUTER_SIGNAL":                   "forward",
			"HEALTH_ROUTER_KARPENTER_VERSION":        "1.9.3",
			"HEALTH_ROUTER_KARPENTER_ROLE_ARN":       "arn:aws:iam::111122223333:role/KarpenterController-my-cluster",
			"HEALTH_ROUTER_CLOUDWATCH_METRICS":       "false",
			"HEALTH_ROUTER_CLOUDWATCH_INTERVAL":      "2m",
			"HEALTH_ROUTER_WORKERS":                  "20",
			"HEALTH_ROUTER_RECEIVERS":                "4",
			"HEALTH_ROUTER_VISIBILITY_TIMEOUT":       "1m",
			"HEALTH_ROUTER_WAIT_TIME":                "10s",
			"HEALTH_ROUTER_HANDLE_TIMEOUT":           "90s",
			"HEALTH_ROUTER_SHUTDOWN_TIMEOUT":         "40s",
			"HEALTH_ROUTER_LEADER_ELECT":             "true",
			"HEALTH_ROUTER_LEADER_ELECTION_ID":       "hr-lease",
			"HEALTH_ROUTER_KUBE_CLIENT_QPS":          "50",
			"HEALTH_ROUTER_KUBE_CLIENT_BURST":        "100",
			"HEALTH_ROUTER_INSTANCE_STATUS_POLLER":   "true",
			"HEALTH_ROUTER_INSTANCE_STATUS_INTERVAL": "2m",
			"HEALTH_ROUTER_INSTANCE_PARALLELISM":     "32",
			"HEALTH_ROUTER_UNMANAGED_NODES":          "cordon-drain", "HEALTH_ROUTER_MAX_RECEIVES": "50",
			"HEALTH_ROUTER_NODE_MARKS": "false", "HEALTH_ROUTER_POD_EVENTS_PER_EVENT": "200", "HEALTH_ROUTER_INSTANCE_EVENTS_PER_SECOND": "5.5", "HEALTH_ROUTER_REBOOT_IN_PLACE": "true", "HEALTH_ROUTER_EVENT_WINDOWS": "true",
			"HEALTH_ROUTER_SHADOW": "true", "HEALTH_ROUTER_SHADOW_LEDGER": "health-router-shadow",
			"HEALTH_ROUTER_KARPENTER_NAMESPACE": "kube-system", "HEALTH_ROUTER_KARPENTER_DEPLOYMENT": "karpenter",
			"HEALTH_ROUTER_FORWARD_CONFIRM_TIMEOUT":   "30s",
			"HEALTH_ROUTER_ALERTMANAGER_URL":          "http://alertmanager.monitoring:9093",
			"HEALTH_ROUTER_AWS_ENDPOINT_URL":          "http://127.0.0.1:5000",
			"HEALTH_ROUTER_FEATURE_GATES":             "ReservedCapacity=false",
			"HEALTH_ROUTER_LOG_LEVEL":                 "debug",
			"HEALTH_ROUTER_METRICS_BIND_ADDRESS":      ":9090",
			"HEALTH_ROUTER_HEALTH_PROBE_BIND_ADDRESS": ":8081",
			"HEALTH_ROUTER_METRICS_SECURE":            "true",
			"HEALTH_ROUTER_CALENDAR_BIND_ADDRESS":     ":9092",
		}
		if got := env(ctr); !maps.Equal(got, want) {
			t.Errorf("environment:\n got %v\nwant %v", got, want)
		}
		// Every flag of `health-router run` is reachable from the chart: its environment
		// variable is rendered when every setting is set. --kubeconfig is the one exception:
		// in the cluster the router finds the API server itself.
		rendered := map[string]bool{}
		for _, e := range ctr.Env {
			rendered[e.Name] = true
		}
		for _, name := range options.RunFlagNames() {
			if name != "kubeconfig" && !rendered[options.EnvName(name)] {
				t.Errorf("--%s (%s) cannot be set through the chart", name, options.EnvName(name))
			}
		}
		if ctr.Image != "111122223333.dkr.ecr.eu-west-1.amazonaws.com/health-router:v0.2.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
			t.Errorf("image %q, want repository:tag@digest", ctr.Image)
		}
		// The values' list replaces the chart's default toleration: it is not merged into it.
		if spec.NodeSelector["eks.amazonaws.com/nodegroup"] != "system" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" {
			t.Errorf("nodeSelector %v tolerations %v, want the values' one toleration (key dedicated)", spec.NodeSelector, spec.Tolerations)
		}
		if port(t, ctr, m.service.Spec.Ports[0].TargetPort) != 9090 || m.service.Spec.Ports[0].Port != 9090 {
			t.Errorf("metrics.port 9090: Service %+v, container ports %+v", m.service.Spec.Ports, ctr.Ports)
		}
		for _, u := range m.all {
			if u.GetLabels()["team"] != "platform" || u.GetAnnotations()["owner"] != "platform@example.com" {
				t.Errorf("%s %s: labels %v annotations %v, want additionalLabels and additionalAnnotations", u.GetKind(), u.GetName(), u.GetLabels(), u.GetAnnotations())
			}
		}
	})
	t.Run("defaults keep off Karpenter's nodes", func(t *testing.T) {
		spec := decode(t).deployment.Spec.Template.Spec
		var found bool
		if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
			// Every term (they are ORed) must exclude NodePool nodes.
			found = len(terms) > 0
			for _, term := range terms {
				if !hasExpression(term, "karpenter.sh/nodepool", corev1.NodeSelectorOpDoesNotExist) {
					found = false
				}
			}
		}
		if !found {
			t.Errorf("the default affinity does not require karpenter.sh/nodepool DoesNotExist: %+v", spec.Affinity)
		}
		if spec.PriorityClassName != "system-cluster-critical" {
			t.Errorf("priorityClassName %q", spec.PriorityClassName)
		}
		// The Go runtime's soft limit follows the container's memory limit (the binary held
		// 68 MiB of heap and 334 MiB of RSS at 20,000 nodes with no limit set).
		var memLimit bool
		for _, e := range spec.Containers[0].Env {
			if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
				e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" && e.ValueFrom.ResourceFieldRef.ContainerName == spec.Containers[0].Name {
				memLimit = true
			}
		}
		if !memLimit {
			t.Errorf("no GOMEMLIMIT from the container's limits.memory in %+v", spec.Containers[0].Env)
		}
		noLimit := decode(t, "-f", ciValues(t, "default"), "--set", "resources.limits=null").deployment.Spec.Template.Spec.Containers[0]
		for _, e := range noLimit.Env {
			if e.Name == "GOMEMLIMIT" {
				t.Errorf("GOMEMLIMIT set without a memory limit: %+v", e)
			}
		}
	})
}

func hasExpression(term corev1.NodeSelectorTerm, key string, op corev1.NodeSelectorOperator) bool {
	for _, e := range term.MatchExpressions {
		if e.Key == key && e.Operator == op {
			return true
		}
	}
	return false
}

// TestRefused: values the chart must refuse, with a message that names the problem.
func TestRefused(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no queue", []string{"--set", "settings.deadLetterQueueURL=https://q/dlq", "--set", "settings.clusterName=c"}, "settings.queueURL is required"},
		{"no dead-letter queue", []string{"--set", "settings.queueURL=https://q/in", "--set", "settings.clusterName=c"}, "settings.deadLetterQueueURL is required"},
		{"CloudWatch without a cluster name", []string{"--set", "settings.queueURL=https://q/in", "--set", "settings.deadLetterQueueURL=https://q/dlq"}, "settings.clusterName is required with settings.cloudWatchMetrics"},
		{"forward without Karpenter's queue", []string{"-f", "DEFAULT", "--set", "settings.signal=forward"}, "settings.signal forward needs settings.karpenterQueueURL"},
		{"typo'd top-level key", []string{"-f", "DEFAULT", "--set", "replica=3"}, "additional properties 'replica' not allowed"},
		{"typo'd setting", []string{"-f", "DEFAULT", "--set", "settings.queueUrl=https://q/in"}, "additional properties 'queueUrl' not allowed"},
		{"typo'd feature gate", []string{"-f", "DEFAULT", "--set", "settings.featureGates.reservedCapacityy=true"}, "reservedCapacityy"},
		{"wrong type", []string{"-f", "DEFAULT", "--set-string", "replicas=two"}, "replicas"},
		{"workers out of range", []string{"-f", "DEFAULT", "--set", "settings.workers=500"}, "workers"},
		{"not a duration", []string{"-f", "DEFAULT", "--set", "settings.visibilityTimeout=30"}, "visibilityTimeout"},
		{"unknown signal", []string{"-f", "DEFAULT", "--set", "settings.signal=evict"}, "signal"},
		{"unknown log level", []string{"-f", "DEFAULT", "--set", "logLevel=verbose"}, "logLevel"},
		{"bad digest", []string{"-f", "DEFAULT", "--set", "image.digest=latest"}, "digest"},
		{"dashboard in a namespace that cannot be", []string{"-f", "DEFAULT", "--set", "grafanaDashboard.namespace=Monitoring"}, "grafanaDashboard/namespace"},
		{"calendar on the metrics port", []string{"-f", "DEFAULT", "--set", "calendar.enabled=true", "--set", "calendar.port=8080"}, "calendar.port must differ"},
		{"calendar on the health port", []string{"-f", "DEFAULT", "--set", "calendar.enabled=true", "--set", "calendar.port=8081"}, "calendar.port must differ"},
		{"calendar peers not a list", []string{"-f", "DEFAULT", "--set", "networkPolicy.calendar.from=everyone"}, "from"},
		{"metrics.secure not a bool", []string{"-f", "DEFAULT", "--set-string", "metrics.secure=yes"}, "secure"},
		{"not a SenderId", []string{"-f", "DEFAULT", "--set", "settings.senderIDs={events.amazonaws.com}"}, "senderIDs"},
		{"typo'd network policy key", []string{"-f", "DEFAULT", "--set", "networkPolicy.enable=true"}, "additional properties 'enable' not allowed"},
	} {
		args := make([]string, len(tt.args))
		for i, a := range tt.args {
			if a == "DEFAULT" {
				a = ciValues(t, "default")
			}
			args[i] = a
		}
		_, err := template(t, args...)
		if err == nil {
			t.Errorf("%s: helm template %v rendered, want an error containing %q", tt.name, tt.args, tt.want)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v\nwant an error containing %q", tt.name, err, tt.want)
		}
	}
}

// unstructuredSlice is a list of maps at a path of an unstructured object.
func unstructuredSlice(obj map[string]any, path ...string) ([]map[string]any, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	items, ok := cur.([]any)
	if !ok {
		return nil, false, nil
	}
	var out []map[string]any
	for _, i := range items {
		if m, ok := i.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out, true, nil
}

// unstructuredMap is the map at a path of an unstructured object.
func unstructuredMap(obj map[string]any, path ...string) (map[string]any, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[p]
	}
	m, ok := cur.(map[string]any)
	return m, ok, nil
}

// toAny is the entries of labels whose keys are in like, as map[string]any (the selector must
// be a subset of the Service's labels).
func toAny(labels map[string]string, like map[string]any) map[string]any {
	out := map[string]any{}
	for k := range like {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}
