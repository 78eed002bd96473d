package options

import (
	"slices"
	"testing"
	"time"
)

// TestFlagErrors: a mistake on the command line is one line that names the flag and says what
// it wants, and a typo of a flag names the flag meant.
func TestFlagErrors(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{append(req, "--visibility-timeout", "soon"), `--visibility-timeout "soon": want a duration such as 30s, 2m or 1h30m`},
		{append(req, "--visibility-timeout", "30"), `--visibility-timeout "30": want a duration such as 30s, 2m or 1h30m`},
		{append(req, "--workers", "many"), `--workers "many": want a whole number`},
		{append(req, "--kube-client-qps", "fast"), `--kube-client-qps "fast": want a number`},
		{append(req, "--leader-elect=maybe"), `--leader-elect "maybe": want true or false`},
		{append(req, "--sender-ids", "arn:aws:iam::1:role/x"), `--sender-ids "arn:aws:iam::1:role/x": "arn:aws:iam::1:role/x" is not an SQS SenderId (AIDA..., AROA... or AROA...:session)`},
		{[]string{"--queue-ur", "x"}, "unknown flag --queue-ur (did you mean --queue-url?)"},
		{[]string{"--wokers", "4"}, "unknown flag --wokers (did you mean --workers?)"},
		{[]string{"--frobnicate"}, "unknown flag --frobnicate"},
		{append(req, "--workers"), "--workers needs a value"},
		// A long flag with one dash is not pflag's bare "unknown shorthand flag: 'q' in -queue-url"
		// (issue 38, 15).
		{[]string{"-queue-url", "q"}, "unknown flag -queue-url (did you mean --queue-url?)"},
		{[]string{"-queue-url=q"}, "unknown flag -queue-url (did you mean --queue-url?)"},
		{[]string{"-wokers", "4"}, "unknown flag -wokers (did you mean --workers?)"},
		{[]string{"-frobnicate"}, "unknown flag -frobnicate (a long flag takes two dashes)"},
		{[]string{"-x"}, "unknown flag -x"},
		// Neither queue: both named, not the first alone (issue 38, 15).
		{nil, "--queue-url and --dead-letter-queue-url are required"},
		{[]string{"--queue-url", "q"}, "--dead-letter-queue-url is required"},
		{[]string{"--dead-letter-queue-url", "dlq"}, "--queue-url is required"},
	} {
		_, err := ParseRun(tt.args, env(nil))
		if err == nil || err.Error() != tt.want {
			t.Errorf("%v: error %v, want %q", tt.args, err, tt.want)
		}
	}
	if _, err := ParseStatus([]string{"-o"}, env(nil), time.Now()); err == nil || err.Error() != "-o/--output needs a value" {
		t.Errorf("-o without a value: %v", err)
	}
	if _, err := ParseDoctor(nil, env(nil)); err == nil || err.Error() != "--queue-url and --dead-letter-queue-url are required" {
		t.Errorf("doctor with neither queue: %v", err)
	}
}

// TestEnvErrors: a bad value from the environment names the variable and the flag, and says
// what it wants, as on the command line.
func TestEnvErrors(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	_, err := ParseRun(req, env(map[string]string{"HEALTH_ROUTER_WAIT_TIME": "20"}))
	want := `HEALTH_ROUTER_WAIT_TIME="20" (for --wait-time): want a duration such as 30s, 2m or 1h30m`
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	// The command line wins: the bad variable is not read.
	if _, err := ParseRun(append(req, "--wait-time", "5s"), env(map[string]string{"HEALTH_ROUTER_WAIT_TIME": "20"})); err != nil {
		t.Errorf("--wait-time given, a bad HEALTH_ROUTER_WAIT_TIME: %v", err)
	}
}

func TestEnvNames(t *testing.T) {
	p := NewStatus(time.Now())
	if got := EnvNames(p.Flags.Lookup("output")); !slices.Equal(got, []string{"HEALTH_ROUTER_OUTPUT", "HEALTH_ROUTER_O"}) {
		t.Errorf("--output: %v", got)
	}
	if got := EnvNames(NewRun().Flags.Lookup("queue-url")); !slices.Equal(got, []string{"HEALTH_ROUTER_QUEUE_URL"}) {
		t.Errorf("--queue-url: %v", got)
	}
}

func TestDefault(t *testing.T) {
	fs := NewRun().Flags
	for name, want := range map[string]string{
		"handle-timeout": "2m", "visibility-timeout": "30s", "workers": "10", "leader-elect": "true",
		"metrics-secure": "", "queue-url": "", "unmanaged-nodes": "ignore", "kube-client-qps": "200",
	} {
		if got := Default(fs.Lookup(name)); got != want {
			t.Errorf("--%s: default %q, want %q", name, got, want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{{"", "abc", 3}, {"workers", "workers", 0}, {"wokers", "workers", 1}, {"stauts", "status", 2}, {"kitten", "sitting", 3}} {
		if got := distance(tt.a, tt.b); got != tt.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
