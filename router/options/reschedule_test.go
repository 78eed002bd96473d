package options

import "testing"

// TestDoctorRescheduleFlag: doctor's --reschedule, off by default, with its environment
// fallback HEALTH_ROUTER_RESCHEDULE; the command line wins.
func TestDoctorRescheduleFlag(t *testing.T) {
	base := []string{"--queue-url", "q", "--dead-letter-queue-url", "d"}
	tests := []struct {
		args []string
		env  string
		want bool
	}{
		{nil, "", false},
		{nil, "true", true},
		{[]string{"--reschedule"}, "", true},
		{[]string{"--reschedule=false"}, "true", false},
	}
	for _, tt := range tests {
		o, err := ParseDoctor(append(append([]string{}, base...), tt.args...), func(k string) string {
			if k == EnvName("reschedule") {
				return tt.env
			}
			return ""
		})
		if err != nil {
			t.Fatal(err)
		}
		if o.Reschedule != tt.want {
			t.Errorf("%v, HEALTH_ROUTER_RESCHEDULE=%q: %v, want %v", tt.args, tt.env, o.Reschedule, tt.want)
		}
	}
	if _, err := ParseDoctor(base, func(k string) string {
		if k == "HEALTH_ROUTER_RESCHEDULE" {
			return "sometimes"
		}
		return ""
	}); err == nil {
		t.Error("an invalid HEALTH_ROUTER_RESCHEDULE must fail, naming the flag")
	}
}
