package options

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/checks"
	"github.com/spf13/pflag"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseReplay(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, err := ParseReplay([]string{"--cluster", "c.yaml", "--events", "ev", "--now", "2026-11-22T00:00:00Z", "--feature-gates", "ReservedCapacity=false", "-o", "json"}, env(nil), now)
	if err != nil {
		t.Fatal(err)
	}
	if o.ClusterFile != "c.yaml" || o.EventsPath != "ev" || o.Output != "json" || !o.Now.Equal(now.Add(12*time.Hour)) || o.Gates.Enabled(checks.ReservedCapacity) {
		t.Errorf("options: %+v", o)
	}
	// Environment fallbacks; the command line wins.
	o, err = ParseReplay([]string{"--events", "flag-ev"}, env(map[string]string{"HEALTH_ROUTER_CLUSTER": "env.yaml", "HEALTH_ROUTER_EVENTS": "env-ev"}), now)
	if err != nil {
		t.Fatal(err)
	}
	if o.ClusterFile != "env.yaml" || o.EventsPath != "flag-ev" || !o.Now.Equal(now) || !o.Gates.Enabled(checks.ReservedCapacity) {
		t.Errorf("fallbacks: %+v", o)
	}
}

func TestParseReplayErrorsNameTheFlag(t *testing.T) {
	now := time.Now()
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--events", "ev"}, nil, "--cluster"},
		{[]string{"--cluster", "c"}, nil, "--events"},
		{[]string{"--cluster", "c", "--events", "e", "-o", "yaml"}, nil, "--output"},
		{[]string{"--cluster", "c", "--events", "e", "--now", "tomorrow"}, nil, "--now"},
		{[]string{"--cluster", "c", "--events", "e", "--feature-gates", "Bogus=true"}, nil, "--feature-gates"},
		{[]string{"--cluster", "c", "--events", "e", "extra"}, nil, "unexpected argument"},
		{[]string{"--cluster", "c", "--events", "e"}, map[string]string{"HEALTH_ROUTER_NOW": ""}, ""},
	} {
		_, err := ParseReplay(tt.args, env(tt.env), now)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tt.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one naming %s", tt.args, err, tt.want)
		}
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("queue-url"); got != "HEALTH_ROUTER_QUEUE_URL" {
		t.Errorf("EnvName = %s", got)
	}
}

func TestParseRun(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	o, err := ParseRun(req, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.KubeClientQPS != 200 || o.KubeClientBurst != 300 || o.InstanceParallelism != 16 || o.ForwardConfirmTimeout != 20*time.Second || o.Signal != "delete-nodeclaim" ||
		!o.InstanceStatusPoller || o.InstanceStatusInterval != time.Minute || !o.NodeMarks || o.PodEventsPerEvent != 1000 {
		t.Errorf("defaults: %+v", o)
	}
	o, err = ParseRun(append(req, "--node-marks=false"), env(map[string]string{"HEALTH_ROUTER_POD_EVENTS_PER_EVENT": "0"}))
	if err != nil || o.NodeMarks || o.PodEventsPerEvent != 0 {
		t.Errorf("node marks and pod Events off: %+v, %v", o, err)
	}
	o, err = ParseRun(append(req, "--karpenter-queue-url", "k", "--kube-client-qps", "50"), env(map[string]string{"HEALTH_ROUTER_KUBE_CLIENT_BURST": "75", "HEALTH_ROUTER_KUBE_CLIENT_QPS": "9"}))
	if err != nil {
		t.Fatal(err)
	}
	if o.KubeClientQPS != 50 || o.KubeClientBurst != 75 || o.Signal != "forward" {
		t.Errorf("flags and fallbacks: %+v", o)
	}
}

// TestParseRunExposure: the calendar is off and /metrics unauthenticated unless asked for,
// from the command line or the environment.
func TestParseRunExposure(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	for _, tt := range []struct {
		name     string
		args     []string
		env      map[string]string
		calendar string
		secure   bool
	}{
		{name: "defaults", args: req},
		{name: "the calendar on its port", args: append(req, "--calendar-bind-address", ":8082"), calendar: ":8082"},
		{name: "the calendar on loopback", args: append(req, "--calendar-bind-address", "127.0.0.1:8082"), calendar: "127.0.0.1:8082"},
		{name: "from the environment", args: req, env: map[string]string{"HEALTH_ROUTER_CALENDAR_BIND_ADDRESS": ":9000", "HEALTH_ROUTER_METRICS_SECURE": "true"}, calendar: ":9000", secure: true},
		{name: "metrics secure", args: append(req, "--metrics-secure"), secure: true},
	} {
		o, err := ParseRun(tt.args, env(tt.env))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if o.CalendarBindAddress != tt.calendar || o.MetricsSecure != tt.secure {
			t.Errorf("%s: calendar %q, metrics secure %v; want %q, %v", tt.name, o.CalendarBindAddress, o.MetricsSecure, tt.calendar, tt.secure)
		}
	}
}

func TestParseRunErrorsNameTheFlag(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--dead-letter-queue-url", "dlq"}, "--queue-url"},
		{[]string{"--queue-url", "q"}, "--dead-letter-queue-url"},
		{[]string{"--queue-url", "q", "--dead-letter-queue-url", "q"}, "must differ"},
		{append(req, "--kube-client-qps", "0"), "--kube-client-qps"},
		{append(req, "--kube-client-burst", "0"), "--kube-client-burst"},
		{append(req, "--instance-parallelism", "0"), "--instance-parallelism"},
		{append(req, "--forward-confirm-timeout", "10ms"), "--forward-confirm-timeout"},
		{append(req, "--instance-status-interval", "1s"), "--instance-status-interval"},
		{append(req, "--alertmanager-url", "alertmanager:9093"), "--alertmanager-url"},
		{append(req, "--signal", "forward"), "--karpenter-queue-url"},
		{append(req, "--signal", "smoke"), "--signal"},
		{append(req, "--workers", "0"), "--workers"},
		{append(req, "--receivers", "0"), "--receivers"},
		{append(req, "--workers", "4", "--receivers", "5"), "--receivers"},
		{append(req, "--pod-events-per-event", "-1"), "--pod-events-per-event"},
		{append(req, "--log-level", "loud"), "--log-level"},
		{append(req, "--calendar-bind-address", "8082"), "--calendar-bind-address"},
		{append(req, "--calendar-bind-address", ":http-alt"), "--calendar-bind-address"},
		{append(req, "--calendar-bind-address", ":8080"), "--metrics-bind-address"},
		{append(req, "--calendar-bind-address", ":8081"), "--health-probe-bind-address"},
	} {
		_, err := ParseRun(tt.args, env(nil))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one naming %s", tt.args, err, tt.want)
		}
	}
}

func TestParseReplayAlerts(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, err := ParseReplay([]string{"--cluster", "c.yaml", "--events", "ev", "--alerts", "alerts.json"}, env(nil), now)
	if err != nil || o.AlertsFile != "alerts.json" {
		t.Errorf("--alerts: %+v, %v", o, err)
	}
	o, err = ParseReplay([]string{"--cluster", "c.yaml", "--events", "ev"}, env(map[string]string{"HEALTH_ROUTER_ALERTS": "env.json"}), now)
	if err != nil || o.AlertsFile != "env.json" {
		t.Errorf("HEALTH_ROUTER_ALERTS: %+v, %v", o, err)
	}
}

// TestFlagSets: the reference is generated from FlagSets, so it must hold every command, and
// every flag must say what it does.
func TestFlagSets(t *testing.T) {
	var names []string
	for _, fs := range FlagSets() {
		names = append(names, fs.Name())
		n := 0
		fs.VisitAll(func(f *pflag.Flag) {
			n++
			if strings.TrimSpace(f.Usage) == "" {
				t.Errorf("%s --%s has no usage", fs.Name(), f.Name)
			}
		})
		if n == 0 {
			t.Errorf("%s has no flags", fs.Name())
		}
	}
	if got := strings.Join(names, " "); got != "run doctor replay status handback version" {
		t.Errorf("commands %q, want run doctor replay status handback version", got)
	}
}

// --account is a 12-digit ID, any (the check off), or empty (the router's own, from STS): a
// typo would otherwise dead-letter every event as foreign.
func TestRunAccount(t *testing.T) {
	for account, ok := range map[string]bool{"": true, "any": true, "111122223333": true, "11112222333": false, "prod": false} {
		_, err := ParseRun([]string{"--queue-url", "q", "--dead-letter-queue-url", "d", "--account", account}, func(string) string { return "" })
		if (err == nil) != ok || (err != nil && !strings.Contains(err.Error(), "--account")) {
			t.Errorf("--account %q: %v, want accepted: %v", account, err, ok)
		}
	}
}

func TestRunSenderIDs(t *testing.T) {
	for value, want := range map[string][]string{
		"":                                 nil,
		"AIDAEVENTBRIDGE":                  {"AIDAEVENTBRIDGE"},
		"AIDAEVENTBRIDGE, AROADISPATCHER":  {"AIDAEVENTBRIDGE", "AROADISPATCHER"},
		"AROADISPATCHER:hr-prod-dispatch1": {"AROADISPATCHER:hr-prod-dispatch1"},
	} {
		o, err := ParseRun([]string{"--queue-url", "q", "--dead-letter-queue-url", "d"}, func(k string) string {
			if k == "HEALTH_ROUTER_SENDER_IDS" {
				return value
			}
			return ""
		})
		if err != nil || !slices.Equal(o.SenderIDs, want) {
			t.Errorf("HEALTH_ROUTER_SENDER_IDS=%q: %v %v, want %v", value, o.SenderIDs, err, want)
		}
	}
	for _, bad := range []string{"AIDA,,AROA", "arn:aws:iam::111122223333:role/x", "AIDA X"} {
		if _, err := ParseRun([]string{"--queue-url", "q", "--dead-letter-queue-url", "d", "--sender-ids", bad}, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "sender-ids") {
			t.Errorf("--sender-ids %q: %v, want an error naming the flag", bad, err)
		}
	}
}
