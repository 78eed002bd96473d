package options

import (
	"strings"
	"testing"
	"time"
)

func TestParseStatus(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want Status
		err  string
	}{
		{name: "defaults", want: Status{Now: now, Output: "table"}},
		{name: "flags", args: []string{"--kubeconfig", "/k", "--nodepool", "kafka", "--now", "2026-11-28T02:30:00Z", "-o", "json"},
			want: Status{Kubeconfig: "/k", NodePool: "kafka", Now: time.Date(2026, 11, 28, 2, 30, 0, 0, time.UTC), Output: "json"}},
		{name: "environment, the command line wins", args: []string{"--nodepool", "web"},
			env:  map[string]string{"HEALTH_ROUTER_KUBECONFIG": "/env", "HEALTH_ROUTER_NODEPOOL": "kafka", "HEALTH_ROUTER_NOW": "2026-11-22T00:00:00Z", "HEALTH_ROUTER_O": "json"},
			want: Status{Kubeconfig: "/env", NodePool: "web", Now: now.Add(12 * time.Hour), Output: "json"}},
		{name: "a calendar", args: []string{"--ics", "--nodepool", "kafka"}, want: Status{NodePool: "kafka", Now: now, Output: "table", ICS: true}},
		{name: "a calendar from the environment", env: map[string]string{"HEALTH_ROUTER_ICS": "true"}, want: Status{Now: now, Output: "table", ICS: true}},
		{name: "the command line turns the environment's calendar off", args: []string{"--ics=false"}, env: map[string]string{"HEALTH_ROUTER_ICS": "true"}, want: Status{Now: now, Output: "table"}},
		{name: "a calendar and json", args: []string{"--ics", "-o", "json"}, err: "--ics"},
		{name: "a calendar and json from the environment", args: []string{"--ics"}, env: map[string]string{"HEALTH_ROUTER_O": "json"}, err: "--ics"},
		{name: "bad calendar flag from the environment", env: map[string]string{"HEALTH_ROUTER_ICS": "yes please"}, err: "--ics"},
		{name: "bad output", args: []string{"-o", "yaml"}, err: "--output"},
		{name: "--output, the long name of -o", args: []string{"--output", "json"}, want: Status{Now: now, Output: "json"}},
		{name: "HEALTH_ROUTER_OUTPUT before HEALTH_ROUTER_O", env: map[string]string{"HEALTH_ROUTER_OUTPUT": "json", "HEALTH_ROUTER_O": "yaml"}, want: Status{Now: now, Output: "json"}},
		{name: "bad now", args: []string{"--now", "saturday"}, err: "--now"},
		{name: "bad now from the environment", env: map[string]string{"HEALTH_ROUTER_NOW": "saturday"}, err: "--now"},
		{name: "an argument", args: []string{"kafka"}, err: "unexpected argument"},
		{name: "the shadow report", args: []string{"--shadow", "-n", "platform", "--nodepool", "kafka"},
			want: Status{NodePool: "kafka", Now: now, Output: "table", Shadow: true, Namespace: "platform"}},
		{name: "the shadow report and a calendar", args: []string{"--shadow", "--ics"}, err: "--shadow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStatus(tc.args, env(tc.env), now)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Namespace == "" {
				tc.want.Namespace = "health-router"
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}
