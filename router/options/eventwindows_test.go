package options

import (
	"strings"
	"testing"
)

// TestEventWindowsFlag: run's --event-windows, off by default, with its environment fallback
// HEALTH_ROUTER_EVENT_WINDOWS (the command line wins), needs --cluster-name; doctor reads the
// same variable.
func TestEventWindowsFlag(t *testing.T) {
	base := []string{"--queue-url", "q", "--dead-letter-queue-url", "d"}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "HEALTH_ROUTER_EVENT_WINDOWS" {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		args []string
		env  string
		want bool
		err  string
	}{
		{nil, "", false, ""},
		{[]string{"--cluster-name", "prod"}, "true", true, ""},
		{[]string{"--event-windows", "--cluster-name", "prod"}, "", true, ""},
		{[]string{"--event-windows=false"}, "true", false, ""},
		{[]string{"--event-windows"}, "", false, "--cluster-name is required with --event-windows"},
		{nil, "sometimes", false, "event-windows"},
	}
	for _, tt := range tests {
		o, err := ParseRun(append(append([]string{}, base...), tt.args...), env(tt.env))
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%v, env %q: %v, want an error naming %q", tt.args, tt.env, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%v, env %q: %v", tt.args, tt.env, err)
		case tt.err == "" && o.EventWindows != tt.want:
			t.Errorf("%v, env %q: EventWindows %v, want %v", tt.args, tt.env, o.EventWindows, tt.want)
		}
	}
	o, err := ParseDoctor(base, env("true"))
	if err != nil || !o.EventWindows {
		t.Errorf("doctor with HEALTH_ROUTER_EVENT_WINDOWS=true: %+v, %v", o.EventWindows, err)
	}
}
