package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/health-router/health-router/router/calendar"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// TestCalendarExposure: the calendar names nodes (their private DNS names, so their IPs),
// event ARNs and drain times; nobody reaches it without the operator asking for it. Abuse
// case: a GET of /calendar.ics on the metrics port, with no credentials, from anywhere the
// port is reachable (every replica, every pod of the cluster without a NetworkPolicy); it
// answered the calendar until the calendar got a listener of its own, off by default. Then,
// asked for: the calendar on its port, and /metrics only to callers the API server
// authenticates and authorizes (--metrics-secure).
func TestCalendarExposure(t *testing.T) {
	s := newStage(t)
	ann, _ := windowPool(time.Now(), false)
	s.pool("kafka", ann)
	claim := s.node("kafka", "i-0c1d2e3f4a5b60101")
	node := nodeName("i-0c1d2e3f4a5b60101")
	// Karpenter records the Node's name on its NodeClaim once it registers.
	nc := s.claim(claim)
	nc.Status.NodeName = node
	if err := s.kube.Status().Update(s.ctx, nc); err != nil {
		t.Fatal(err)
	}
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	stop := s.routerStoppable(signal.ModeDeleteNodeClaim, func(o *options.Run) { o.MetricsBindAddress = metricsAddr })

	arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/calendar-1"
	s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", time.Now().Add(10*24*time.Hour), "upcoming", arn, "i-0c1d2e3f4a5b60101"))
	s.eventually("a window deferral of "+claim, 60*time.Second, func() bool { _, ok := s.activeRecord(claim); return ok })
	s.eventually("the metrics server up", 30*time.Second, func() bool {
		code, _ := get(t, "http://"+metricsAddr+"/metrics")
		return code == http.StatusOK
	})

	code, body := get(t, "http://"+metricsAddr+"/calendar.ics")
	if code != http.StatusNotFound || strings.Contains(body, node) || strings.Contains(body, claim) {
		t.Errorf("GET /calendar.ics on the metrics port, no credentials: %d, naming node %s: %v, NodeClaim %s: %v; want 404 and neither; it read:\n%s",
			code, node, strings.Contains(body, node), claim, strings.Contains(body, claim), summaries(body))
	}
	stop()

	// Asked for: the calendar on its own port, and /metrics behind the API server's
	// authentication and authorization (--metrics-secure).
	calendarAddr := fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	metricsAddr = fmt.Sprintf("127.0.0.1:%d", harness.FreePort(t))
	s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) {
		o.MetricsBindAddress, o.MetricsSecure, o.CalendarBindAddress = metricsAddr, true, calendarAddr
	})
	s.eventually("the calendar on its own port", 30*time.Second, func() bool {
		code, body = get(t, "http://"+calendarAddr+calendar.Path)
		return code == http.StatusOK
	})
	if !strings.Contains(body, node) {
		t.Errorf("the calendar on --calendar-bind-address does not name node %s:\n%s", node, summaries(body))
	}

	reader, stranger := s.token("metrics-reader", true), s.token("stranger", false)
	tlsGet := func(path, token string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, "https://"+metricsAddr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		// The router's certificate is self-signed: what is checked here is who may read.
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	s.eventually("the secure metrics server up", 30*time.Second, func() bool { code, _ := tlsGet("/metrics", reader); return code == http.StatusOK })
	for _, tt := range []struct {
		name, path, token string
		code              int
	}{
		{"no credentials", "/metrics", "", http.StatusUnauthorized},
		// controller-runtime's filter answers a token the TokenReview rejects with 500
		// "Authentication failed" (its error path), not 401: refused all the same.
		{"a token the API server does not know", "/metrics", "not-a-token", http.StatusInternalServerError},
		{"a ServiceAccount without get on /metrics", "/metrics", stranger, http.StatusForbidden},
		{"a ServiceAccount with get on /metrics", "/metrics", reader, http.StatusOK},
		{"the calendar on the metrics port, authenticated", calendar.Path, reader, http.StatusNotFound},
	} {
		code, body := tlsGet(tt.path, tt.token)
		// The metrics themselves to the reader only; the node to nobody on this port.
		served := strings.Contains(body, "# TYPE ") // the exposition format: controller-runtime's own series (the stage gives the router a registry of its own)
		if code != tt.code || strings.Contains(body, node) || served != (tt.code == http.StatusOK) {
			t.Errorf("%s: GET https://%s%s: %d, want %d (metrics served: %v; naming node %s: %v):\n%.300s",
				tt.name, metricsAddr, tt.path, code, tt.code, served, node, strings.Contains(body, node), body)
		}
	}
	if code, _ := get(t, "http://"+metricsAddr+"/metrics"); code == http.StatusOK {
		t.Error("--metrics-secure still answers /metrics over plain HTTP")
	}
}

// token returns a token of a new ServiceAccount in default, bound to a ClusterRole allowing
// GET /metrics when canRead (the chart's metrics-reader role).
func (s *stage) token(name string, canRead bool) string {
	s.t.Helper()
	s.create(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}})
	if canRead {
		s.create(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}})
		s.create(&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: name}}})
	}
	cs, err := kubernetes.NewForConfig(s.restCfg)
	if err != nil {
		s.t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(s.ctx, name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		s.t.Fatalf("a token of ServiceAccount %s: %v", name, err)
	}
	return tr.Status.Token
}

// get GETs url with no credentials and returns the status and the body (0 when nothing
// answered).
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// summaries are the SUMMARY and DESCRIPTION lines of a calendar (unfolded), for a failure's
// message.
func summaries(ics string) string {
	var out []string
	for _, l := range strings.Split(strings.ReplaceAll(ics, "\r\n ", ""), "\r\n") {
		if strings.HasPrefix(l, "SUMMARY:") || strings.HasPrefix(l, "DESCRIPTION:") {
			out = append(out, "  "+l)
		}
	}
	return strings.Join(out, "\n")
}
