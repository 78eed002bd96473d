package options

import (
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/handback"
)

func TestParseHandback(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want func(Handback) bool
		err  string
	}{
		{name: "pending is required: the user chooses", err: "--pending is required"},
		{name: "drain", args: []string{"--pending", "drain"}, want: func(o Handback) bool {
			return o.Pending == handback.PendingDrain && o.Namespace == "health-router" && o.LeaderElectionID == "health-router.healthrouter.io" && o.ConfirmTimeout == 20*time.Second && !o.DryRun
		}},
		{name: "drop, a dry run, from the environment", env: map[string]string{"HEALTH_ROUTER_PENDING": "drop", "HEALTH_ROUTER_DRY_RUN": "true"},
			want: func(o Handback) bool { return o.Pending == handback.PendingDrop && o.DryRun }},
		{name: "an unknown choice", args: []string{"--pending", "later"}, err: "want drain or drop"},
		{name: "a malformed Karpenter queue", args: []string{"--pending", "drain", "--karpenter-queue-url", "Karpenter-prod"}, err: "--karpenter-queue-url"},
		{name: "a bad timeout", args: []string{"--pending", "drain", "--forward-confirm-timeout", "soon"}, err: "forward-confirm-timeout"},
		{name: "json", args: []string{"--pending", "drop", "-o", "json"}, want: func(o Handback) bool { return o.Output == "json" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NewHandback().Parse(tc.args, env(tc.env))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(got) {
				t.Errorf("got %+v", got)
			}
		})
	}
}
