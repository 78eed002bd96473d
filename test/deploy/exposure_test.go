package deploy_test

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// What the chart exposes, and to whom: the calendar (names nodes, events, drain times) only
// when asked for, /metrics behind the API server's authentication when asked for, and a
// NetworkPolicy that keeps each port to its readers.

// TestCalendarValues: the calendar's port is on the container and the Service, and its
// listener configured, only with calendar.enabled.
func TestCalendarValues(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  []string
		port int32 // 0: none anywhere
	}{
		{"off by default", nil, 0},
		{"on", []string{"--set", "calendar.enabled=true"}, 8082},
		{"on, another port", []string{"--set", "calendar.enabled=true", "--set", "calendar.port=9000"}, 9000},
		{"a port but off", []string{"--set", "calendar.port=9000"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := decode(t, append([]string{"-f", ciValues(t, "default")}, tt.set...)...)
			ctr := m.deployment.Spec.Template.Spec.Containers[0]
			addr, hasEnv := env(ctr)["HEALTH_ROUTER_CALENDAR_BIND_ADDRESS"]
			ctrPort := port(t, ctr, intstr.FromString("calendar"))
			var svcPort *corev1.ServicePort
			for i, p := range m.service.Spec.Ports {
				if p.Name == "calendar" {
					svcPort = &m.service.Spec.Ports[i]
				}
			}
			if tt.port == 0 {
				if hasEnv || ctrPort != 0 || svcPort != nil {
					t.Errorf("calendar off: environment %q (set %v), container port %d, Service port %+v; want none", addr, hasEnv, ctrPort, svcPort)
				}
				return
			}
			if want := ":" + itoa(tt.port); addr != want {
				t.Errorf("HEALTH_ROUTER_CALENDAR_BIND_ADDRESS %q, want %q", addr, want)
			}
			if ctrPort != tt.port {
				t.Errorf("container port calendar %d, want %d", ctrPort, tt.port)
			}
			if svcPort == nil || svcPort.Port != tt.port || port(t, ctr, svcPort.TargetPort) != tt.port {
				t.Errorf("Service port calendar %+v, want %d to the container's %d", svcPort, tt.port, tt.port)
			}
			if m.service.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Errorf("Service type %s: the calendar is never exposed outside the cluster", m.service.Spec.Type)
			}
		})
	}
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestNetworkPolicy: off by default; on, ingress only (egress left open: the API server and
// AWS endpoints move), the metrics port from the monitoring namespace, the calendar port from
// the listed peers only (none: closed), the health port for the kubelet, nothing else.
func TestNetworkPolicy(t *testing.T) {
	if m := decode(t); m.networkPolicy != nil {
		t.Fatal("the defaults render a NetworkPolicy")
	}
	relay := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "calendar-relay"}}}
	monitoring := &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}
	for _, tt := range []struct {
		name          string
		args          []string
		metricsFrom   networkingv1.NetworkPolicyPeer
		calendarPeers []networkingv1.NetworkPolicyPeer // nil: no rule opens the calendar port
	}{
		{
			name:        "on, the defaults",
			args:        []string{"-f", ciValues(t, "default"), "--set", "networkPolicy.enabled=true"},
			metricsFrom: networkingv1.NetworkPolicyPeer{NamespaceSelector: monitoring, PodSelector: &metav1.LabelSelector{}},
		},
		{
			name:        "the calendar on but no peer: closed",
			args:        []string{"-f", ciValues(t, "default"), "--set", "networkPolicy.enabled=true", "--set", "calendar.enabled=true"},
			metricsFrom: networkingv1.NetworkPolicyPeer{NamespaceSelector: monitoring, PodSelector: &metav1.LabelSelector{}},
		},
		{
			name: "peers but the calendar off: no rule",
			args: []string{"-f", ciValues(t, "default"), "--set", "networkPolicy.enabled=true",
				"--set", "networkPolicy.calendar.from[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=calendar-relay"},
			metricsFrom: networkingv1.NetworkPolicyPeer{NamespaceSelector: monitoring, PodSelector: &metav1.LabelSelector{}},
		},
		{
			name: "locked down: Prometheus's pods, the relay",
			args: []string{"-f", ciValues(t, "locked-down")},
			metricsFrom: networkingv1.NetworkPolicyPeer{NamespaceSelector: monitoring,
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "prometheus"}}},
			calendarPeers: []networkingv1.NetworkPolicyPeer{relay},
		},
		{
			name: "another monitoring namespace",
			args: []string{"-f", ciValues(t, "default"), "--set", "networkPolicy.enabled=true",
				"--set", "networkPolicy.metrics.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=observability"},
			metricsFrom: networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "observability"}},
				PodSelector:       &metav1.LabelSelector{}},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := decode(t, tt.args...)
			np := m.networkPolicy
			if np == nil {
				t.Fatal("networkPolicy.enabled renders no NetworkPolicy")
			}
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(m.deployment.Spec.Template.Labels)) {
				t.Errorf("podSelector %v does not select the router's pods %v", np.Spec.PodSelector, m.deployment.Spec.Template.Labels)
			}
			if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Egress) > 0 {
				t.Errorf("policyTypes %v, egress %v; want Ingress only (egress open)", np.Spec.PolicyTypes, np.Spec.Egress)
			}
			ctr := m.deployment.Spec.Template.Spec.Containers[0]
			// Each rule's ports, resolved to the container's; a rule with no from is open to all.
			from := map[string][][]networkingv1.NetworkPolicyPeer{}
			for i, r := range np.Spec.Ingress {
				if len(r.Ports) == 0 {
					t.Errorf("rule %d opens every port", i)
				}
				for _, p := range r.Ports {
					if p.Port == nil || port(t, ctr, *p.Port) == 0 {
						t.Errorf("rule %d: port %v is none of the container's %+v", i, p.Port, ctr.Ports)
						continue
					}
					from[p.Port.String()] = append(from[p.Port.String()], r.From)
				}
			}
			if got := slices.Sorted(maps.Keys(from)); !slices.Equal(got, wantPorts(tt.calendarPeers != nil)) {
				t.Errorf("ports opened %v, want %v", got, wantPorts(tt.calendarPeers != nil))
			}
			if f := from["metrics"]; len(f) != 1 || len(f[0]) != 1 || !peerEqual(f[0][0], tt.metricsFrom) {
				t.Errorf("metrics from %+v, want only %+v", f, tt.metricsFrom)
			}
			if f := from["health"]; len(f) != 1 || len(f[0]) != 0 {
				t.Errorf("health from %+v, want everyone (the kubelet's probes)", f)
			}
			if tt.calendarPeers != nil {
				if f := from["calendar"]; len(f) != 1 || len(f[0]) != len(tt.calendarPeers) || !peerEqual(f[0][0], tt.calendarPeers[0]) {
					t.Errorf("calendar from %+v, want only %+v", f, tt.calendarPeers)
				}
			}
		})
	}
}

func wantPorts(calendar bool) []string {
	if calendar {
		return []string{"calendar", "health", "metrics"}
	}
	return []string{"health", "metrics"}
}

// peerEqual compares two peers' selectors (a nil and an empty selector differ: nil is "no
// such constraint", empty "everything").
func peerEqual(a, b networkingv1.NetworkPolicyPeer) bool {
	sel := func(x, y *metav1.LabelSelector) bool {
		if x == nil || y == nil {
			return x == y
		}
		return maps.Equal(x.MatchLabels, y.MatchLabels) && len(x.MatchExpressions) == 0 && len(y.MatchExpressions) == 0
	}
	return sel(a.PodSelector, b.PodSelector) && sel(a.NamespaceSelector, b.NamespaceSelector) && a.IPBlock == nil && b.IPBlock == nil
}

// TestMetricsAuth: with metrics.secure the router may ask the API server who a scraper is and
// what it may do, a ClusterRole lets a scraper get /metrics, and the ServiceMonitor scrapes
// over HTTPS with its token; without it, none of that.
func TestMetricsAuth(t *testing.T) {
	reviews := func(m manifests) []string {
		var out []string
		for _, r := range m.clusterRole.Rules {
			for _, res := range r.Resources {
				if res == "tokenreviews" || res == "subjectaccessreviews" {
					out = append(out, r.APIGroups[0]+"/"+res+":"+r.Verbs[0])
				}
			}
		}
		slices.Sort(out)
		return out
	}
	off := decode(t, "-f", ciValues(t, "servicemonitor"))
	if got := reviews(off); len(got) > 0 || off.metricsReader != nil {
		t.Errorf("metrics.secure off: reviews granted %v, metrics-reader %v; want neither", got, off.metricsReader)
	}
	if _, ok := env(off.deployment.Spec.Template.Spec.Containers[0])["HEALTH_ROUTER_METRICS_SECURE"]; ok {
		t.Error("metrics.secure off sets HEALTH_ROUTER_METRICS_SECURE")
	}
	eps, _, _ := unstructuredSlice(off.serviceMonitor.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0]["scheme"] != nil || eps[0]["bearerTokenFile"] != nil {
		t.Errorf("metrics.secure off: ServiceMonitor endpoints %v, want plain HTTP", eps)
	}

	on := decode(t, "-f", ciValues(t, "locked-down"))
	if got, want := reviews(on), []string{"authentication.k8s.io/tokenreviews:create", "authorization.k8s.io/subjectaccessreviews:create"}; !slices.Equal(got, want) {
		t.Errorf("metrics.secure: reviews granted %v, want %v", got, want)
	}
	// Exactly the create of the two reviews beyond the usual allowlist.
	allow := maps.Clone(clusterRoleAllowlist)
	allow[groupResource{"authentication.k8s.io", "tokenreviews"}] = []string{"create"}
	allow[groupResource{"authorization.k8s.io", "subjectaccessreviews"}] = []string{"create"}
	for _, p := range ruleProblems(on.clusterRole.Rules, allow) {
		t.Errorf("ClusterRole %s with metrics.secure: %s", on.clusterRole.Name, p)
	}
	if got := env(on.deployment.Spec.Template.Spec.Containers[0])["HEALTH_ROUTER_METRICS_SECURE"]; got != "true" {
		t.Errorf("HEALTH_ROUTER_METRICS_SECURE %q, want true", got)
	}
	r := on.metricsReader
	if r == nil {
		t.Fatal("metrics.secure renders no metrics-reader ClusterRole")
	}
	want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
	if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].NonResourceURLs, want[0].NonResourceURLs) || !slices.Equal(r.Rules[0].Verbs, want[0].Verbs) ||
		len(r.Rules[0].Resources) > 0 || len(r.Rules[0].APIGroups) > 0 {
		t.Errorf("metrics-reader rules %+v, want only %+v", r.Rules, want)
	}
	if r.Name != on.clusterRole.Name+"-metrics-reader" {
		t.Errorf("metrics-reader named %q", r.Name)
	}
	// The shadow report on the metrics port: its own reader role, GET /shadow only.
	if sr := on.shadowReader; sr == nil || len(sr.Rules) != 1 || !slices.Equal(sr.Rules[0].NonResourceURLs, []string{"/shadow"}) ||
		!slices.Equal(sr.Rules[0].Verbs, []string{"get"}) || len(sr.Rules[0].Resources) > 0 {
		t.Errorf("metrics.secure: shadow-reader %+v, want GET /shadow only", sr)
	}
	if off.shadowReader != nil {
		t.Error("metrics.secure off renders a shadow-reader: /shadow is not served on the metrics port then")
	}
	eps, _, _ = unstructuredSlice(on.serviceMonitor.Object, "spec", "endpoints")
	if len(eps) != 1 || eps[0]["scheme"] != "https" || eps[0]["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" {
		t.Errorf("metrics.secure: ServiceMonitor endpoints %v, want https with the scraper's token", eps)
	} else if tc, ok := eps[0]["tlsConfig"].(map[string]any); !ok || tc["insecureSkipVerify"] != true {
		t.Errorf("metrics.secure: ServiceMonitor tlsConfig %v, want insecureSkipVerify (the router's certificate is self-signed)", eps[0]["tlsConfig"])
	}
}
