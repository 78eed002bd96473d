package gates

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/policy"
)

// alertsTTL is how long one answer of Alertmanager (or its failure) serves every pool's
// gate: a window opening over hundreds of deferred drains asks Alertmanager once, not once
// per drain, and a drain waits at most this much longer for a resolved alert. Alertmanager
// itself learns of alerts at Prometheus's evaluation interval (15 s to 1 min), so a
// fresher answer would not be much fresher.
const alertsTTL = 15 * time.Second

// alertsTimeout bounds one request to Alertmanager: a gate that cannot answer in this time
// fails safe per pool rather than stall the decision.
const alertsTimeout = 5 * time.Second

// Evidence keys of the alert gate.
const (
	EvidenceAlerts  = "alerts"
	EvidenceMatcher = "matcher"
)

// Alert is one alert as Alertmanager's API v2 returns it (the fields the gate reads).
type Alert struct {
	Labels   map[string]string `json:"labels"`
	StartsAt time.Time         `json:"startsAt"`
	EndsAt   time.Time         `json:"endsAt,omitzero"`
	Status   struct {
		State string `json:"state"` // active, suppressed, unprocessed
	} `json:"status"`
}

// Name is the alert's alertname label.
func (a Alert) Name() string { return a.Labels["alertname"] }

// ParseAlerts reads a GET /api/v2/alerts response body (a JSON array of alerts).
func ParseAlerts(body []byte) ([]Alert, error) {
	var alerts []Alert
	if err := json.Unmarshal(body, &alerts); err != nil {
		return nil, fmt.Errorf("decoding alerts (want Alertmanager's GET /api/v2/alerts JSON array): %w", err)
	}
	return alerts, nil
}

// Alerts is the alert gate: it asks Alertmanager which alerts fire, once per alertsTTL
// for all pools, and matches each pool's hold-while-alerts against the answer.
type Alerts struct {
	url   string
	hc    *http.Client
	clock clock.PassiveClock
	group singleflight.Group

	mu     sync.Mutex
	at     time.Time // when the cached answer was fetched; zero for none
	alerts []Alert
	err    error
}

// NewAlerts returns the gate for the Alertmanager at baseURL (with any route prefix, e.g.
// http://alertmanager.monitoring:9093).
func NewAlerts(baseURL string, hc *http.Client, clk clock.PassiveClock) *Alerts {
	return &Alerts{url: strings.TrimSuffix(baseURL, "/") + "/api/v2/alerts?active=true&silenced=false&inhibited=false", hc: hc, clock: clk}
}

// Firing returns the alerts that fire now (active, neither silenced nor inhibited). The
// answer, or the failure to get one, is cached for alertsTTL; concurrent callers share one
// request.
func (a *Alerts) Firing(ctx context.Context) ([]Alert, error) {
	a.mu.Lock()
	if !a.at.IsZero() && a.clock.Since(a.at) < alertsTTL {
		alerts, err := a.alerts, a.err
		a.mu.Unlock()
		return alerts, err
	}
	a.mu.Unlock()
	type answer struct {
		alerts []Alert
		err    error
	}
	v, _, _ := a.group.Do("alerts", func() (any, error) {
		// Detached from the first caller's context: its cancellation must not become the
		// answer every other caller shares for alertsTTL.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), alertsTimeout)
		defer cancel()
		alerts, err := a.fetch(fctx)
		a.mu.Lock()
		a.at, a.alerts, a.err = a.clock.Now(), alerts, err
		a.mu.Unlock()
		return answer{alerts, err}, nil
	})
	ans := v.(answer)
	return ans.alerts, ans.err
}

func (a *Alerts) fetch(ctx context.Context) ([]Alert, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		return nil, fmt.Errorf("asking alertmanager: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking alertmanager: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading alertmanager's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("asking alertmanager: %s: %s", resp.Status, strings.TrimSpace(string(body[:min(len(body), 200)])))
	}
	return ParseAlerts(body)
}

// Check answers the alert gate for a pool's matcher. onUnreachable is the pool's
// hold-while-alerts-unreachable: when Alertmanager cannot be reached the gate holds
// (policy.UnreachableHold) or lets the drain go (policy.UnreachableDrain), and says so.
func (a *Alerts) Check(ctx context.Context, m *policy.AlertMatcher, onUnreachable string) policy.Gate {
	alerts, err := a.Firing(ctx)
	return Evaluate(alerts, err, m, onUnreachable)
}

// Evaluate is the alert gate's answer for the alerts Alertmanager returned (or err, when it
// could not be asked). It is pure: replay evaluates recorded alerts with it.
func Evaluate(alerts []Alert, err error, m *policy.AlertMatcher, onUnreachable string) policy.Gate {
	gate := policy.Gate{Name: policy.GateAlerts, Evidence: map[string]string{EvidenceMatcher: m.Source}}
	if err != nil {
		if onUnreachable == policy.UnreachableDrain {
			gate.Reason = fmt.Sprintf("Alertmanager unreachable, and %s=%s lets the drain go: %v", policy.AnnotationHoldWhileAlertsUnreachable, policy.UnreachableDrain, err)
			return gate
		}
		gate.Held = true
		gate.Reason = fmt.Sprintf("Alertmanager unreachable, held as %s=%s: %v", policy.AnnotationHoldWhileAlertsUnreachable, policy.UnreachableHold, err)
		return gate
	}
	var names []string
	var since time.Time
	for _, al := range alerts {
		if !Matches(m, al) {
			continue
		}
		if !slices.Contains(names, al.Name()) {
			names = append(names, al.Name())
		}
		if since.IsZero() || al.StartsAt.Before(since) {
			since = al.StartsAt
		}
	}
	if len(names) == 0 {
		gate.Reason = fmt.Sprintf("no alert matching %s fires", m.Source)
		return gate
	}
	slices.Sort(names)
	gate.Held, gate.Since = true, since
	gate.Evidence[EvidenceAlerts] = strings.Join(names, ",")
	gate.Reason = fmt.Sprintf("alert %s matching %s firing since %s", abbreviate(names), m.Source, since.UTC().Format(time.RFC3339))
	return gate
}

// Matches reports whether al fires and matches m: its alertname fully matches the name
// expression and every label matcher holds (an absent label is the empty string, as in
// Prometheus). Alerts that Alertmanager reports silenced or inhibited (state suppressed)
// do not fire.
func Matches(m *policy.AlertMatcher, al Alert) bool {
	if al.Status.State != "" && al.Status.State != "active" {
		return false
	}
	if !m.Names.MatchString(al.Name()) {
		return false
	}
	for _, lm := range m.Labels {
		if !lm.Matches(al.Labels[lm.Name]) {
			return false
		}
	}
	return true
}

// StaticAlerts answers the alert gate from a fixed list of alerts (replay's --alerts file),
// as Alerts answers it from Alertmanager.
type StaticAlerts []Alert

// Check is Alerts.Check over the fixed list (always reachable).
func (s StaticAlerts) Check(_ context.Context, m *policy.AlertMatcher, onUnreachable string) policy.Gate {
	return Evaluate(s, nil, m, onUnreachable)
}

// NoAlertmanager is the alert gate of a router with no --alertmanager-url: a pool that asks
// for the alert gate finds Alertmanager unreachable, and its hold-while-alerts-unreachable
// setting decides (hold, by default), with the reason saying so.
type NoAlertmanager struct{}

// Check answers as an unreachable Alertmanager.
func (NoAlertmanager) Check(_ context.Context, m *policy.AlertMatcher, onUnreachable string) policy.Gate {
	return Evaluate(nil, errors.New("no --alertmanager-url is configured"), m, onUnreachable)
}
