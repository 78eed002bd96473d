package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestSplitNote(t *testing.T) {
	for _, tc := range []struct{ note, event, why string }{
		{"spot-interruption (d36a75fd-0000-4000-8000-000000000000): drain (no annotation: Karpenter's behaviour)", "spot-interruption d36a75fd", "drain (no annotation: Karpenter's behaviour)"},
		{"scheduled-change (dfba9658-e2df) deferred until 2026-11-28T02:00:00Z: waiting for the maintenance window", "scheduled-change dfba9658", "deferred until 2026-11-28T02:00:00Z: waiting for the maintenance window"},
		{"drained i-1 for spot-interruption", "-", "drained i-1 for spot-interruption"},
	} {
		if ev, why := splitNote(tc.note); ev != tc.event || why != tc.why {
			t.Errorf("splitNote(%q) = %q, %q; want %q, %q", tc.note, ev, why, tc.event, tc.why)
		}
	}
}

// The demo's table has a REASON column, one line per decision of a NodeClaim with its name,
// pool and state on the first, and says so when no event named a NodeClaim.
func TestWriteClaims(t *testing.T) {
	var out bytes.Buffer
	err := writeClaims(&out, []claimRow{
		{Name: "default-m4q9z", Pool: "default", State: "DELETED (Karpenter drains it)", Outcomes: []outcome{
			{Event: "spot-interruption d36a75fd", Action: "Drain", Reason: "drain (no annotation: Karpenter's behaviour)"}}},
		{Name: "kafka-p9d4f", Pool: "kafka", State: "deferred to 11-28 02:00 (window)", Outcomes: []outcome{
			{Event: "state-change a2fd9a1d", Action: "Defer", Reason: "deferred until 2026-11-27T08:25:51Z: restart-grace"},
			{Event: "state-change fc133ab2", Action: "CancelDeferral", Reason: "instance is running"}}},
		{Name: "web-1", Pool: "web", State: "running"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `NODECLAIM      NODEPOOL  STATE                             EVENT                       OUTCOME         REASON
default-m4q9z  default   DELETED (Karpenter drains it)     spot-interruption d36a75fd  Drain           drain (no annotation: Karpenter's behaviour)
kafka-p9d4f    kafka     deferred to 11-28 02:00 (window)  state-change a2fd9a1d       Defer           deferred until 2026-11-27T08:25:51Z: restart-grace
                                                           state-change fc133ab2       CancelDeferral  instance is running
web-1          web       running                           -                           -               no event named its instance
`
	if got := out.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if !strings.HasPrefix(out.String(), "NODECLAIM") {
		t.Error("no header")
	}
}
