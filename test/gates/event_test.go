package gates

import (
	"time"

	"github.com/health-router/health-router/router/event"
)

func eventRetirement(now, start time.Time) event.Event {
	return event.Event{ID: "ev-1", Kind: event.KindScheduledChange, Time: now.Add(-time.Hour), Deadline: start,
		Health: &event.Health{TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Status: event.HealthUpcoming, Scheduled: event.ScheduledInstanceRetirement, Start: start}}
}
