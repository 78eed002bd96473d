package options

import "testing"

// TestDoctorPollerFlag: doctor reads the router's --instance-status-poller, with the same
// environment variable, so that doctor run in the router's pod sees the router's setting.
func TestDoctorPollerFlag(t *testing.T) {
	args := []string{"--queue-url", "q", "--dead-letter-queue-url", "d"}
	for env, want := range map[string]bool{"": true, "false": false, "true": true} {
		o, err := ParseDoctor(args, func(k string) string {
			if k == EnvName("instance-status-poller") {
				return env
			}
			return ""
		})
		if err != nil {
			t.Fatal(err)
		}
		if o.InstanceStatusPoller != want {
			t.Errorf("HEALTH_ROUTER_INSTANCE_STATUS_POLLER=%q: %v, want %v", env, o.InstanceStatusPoller, want)
		}
	}
}
