package notify_test

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/policy"
)

// The default body of a scheduled retirement, on receipt and once deferred to the pool's
// maintenance window.
func ExampleNotifier_Body() {
	n, err := notify.New(notify.Options{URL: "https://hooks.slack.com/services/T000/B000/XXXX", Cluster: "prod-eu"},
		nil, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		panic(err)
	}
	at := time.Date(2026, 11, 21, 9, 14, 0, 0, time.UTC)
	ev := event.Event{
		ID: "6e6c0f8a-3b1c-4d59-9a57-1f8e2b7c0d11", Kind: event.KindScheduledChange, Time: at,
		Instances: []string{"i-0a1b2c3d4e5f60718"}, Deadline: time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC),
		Health: &event.Health{TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Status: event.HealthUpcoming,
			Scheduled: event.ScheduledInstanceRetirement, Start: time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC)},
	}
	d := policy.Decision{
		EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Node: "ip-10-0-12-34.eu-west-1.compute.internal", NodePool: "general",
		Action: policy.ActionDefer, Until: time.Date(2026, 11, 22, 2, 0, 0, 0, time.UTC), Hold: policy.HoldWindow, Deadline: ev.Deadline,
		Reason: `healthrouter.io/action.scheduled-change=defer: the maintenance window "Sat 02:00-04:00" opens before the deadline`,
	}
	for _, nt := range []notify.Notice{notify.Received(ev, ""), notify.FromDecision(ev, d, "")} {
		body, err := n.Body(nt)
		if err != nil {
			panic(err)
		}
		fmt.Println(string(body))
	}
	// Output:
	// {"text": "[prod-eu] Received scheduled-change of i-0a1b2c3d4e5f60718\nAWS Health AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED (upcoming): instance-retirement, from 2026-12-05T01:00:00Z\nAWS acts at 2026-12-05T01:00:00Z\nEvent 6e6c0f8a-3b1c-4d59-9a57-1f8e2b7c0d11"}
	// {"text": "[prod-eu] Decided defer: scheduled-change of i-0a1b2c3d4e5f60718 (node ip-10-0-12-34.eu-west-1.compute.internal, nodepool general)\nAWS Health AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED (upcoming): instance-retirement, from 2026-12-05T01:00:00Z\nAWS acts at 2026-12-05T01:00:00Z\nDecided again by 2026-11-22T02:00:00Z\nWhy: healthrouter.io/action.scheduled-change=defer: the maintenance window \"Sat 02:00-04:00\" opens before the deadline\nEvent 6e6c0f8a-3b1c-4d59-9a57-1f8e2b7c0d11"}
}
