package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// splitEC2 returns the endpoint of harness.SplitEC2 in front of the stage's moto.
func (s *stage) splitEC2(ec2s *harness.EC2InstanceStatus) string {
	s.t.Helper()
	return harness.SplitEC2(s.t, s.moto, ec2s)
}

// metricOf sums the samples of a metric in reg whose labels include labels.
func metricOf(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range labels {
				match = match && have[k] == v
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// reschedulePool returns a pool's annotations that defer scheduled changes to a daily
// one-hour window about twelve hours away, drain 30 minutes before AWS acts, and move
// events into the window; and the window's next opening.
func reschedulePool(now time.Time) (map[string]string, time.Time) {
	ann, window := windowPool(now, false)
	ann[policy.AnnotationDrainLead] = "30m"
	ann[policy.AnnotationReschedule] = "true"
	return ann, window
}

// TestReschedule runs the reschedule through the live router (app.Run) on moto and envtest,
// with EC2's scheduled events and ModifyInstanceEventStartTime served by
// harness.EC2InstanceStatus behind a proxy: an AWS Health event of a pool annotated
// healthrouter.io/reschedule=true moves the instance's event to the window opening plus
// drain-lead, and the router's own poller, seeing the moved event, does not defer it twice.
func TestReschedule(t *testing.T) {
	s := newStage(t)
	ec2s, _ := harness.NewEC2InstanceStatus(t)
	endpoint := s.splitEC2(ec2s)
	const lead = 30 * time.Minute

	t.Run("moved to the window opening plus drain-lead", func(t *testing.T) {
		s.t = t
		const id, evID = "i-0e1f2a3b4c5d60001", "instance-event-0d59937288b749b31"
		ann, window := reschedulePool(time.Now())
		s.pool("kafka", ann)
		claim := s.node("kafka", id)
		// No event yet: the poller's first poll (at once when the router starts) finds nothing,
		// so that the AWS Health event is the one that finds the event and moves it.
		ec2s.Add(id, &harness.Instance{})
		reg := prometheus.NewRegistry()
		s.registry = reg
		s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) {
			o.AWSEndpointURL, o.InstanceStatusPoller, o.InstanceStatusInterval = endpoint, true, 10*time.Second
		})
		s.registry = nil
		polled := map[string]string{metrics.LabelResult: poller.ResultSuccess}
		s.eventually("the poller's first poll", 30*time.Second, func() bool { return metricOf(t, reg, metrics.PollerPolls, polled) >= 1 })

		// AWS's system reboot, three days after the window at an hour outside it; EC2 lets it
		// move until two days later.
		start := window.Add(78 * time.Hour)
		ec2s.Set(id, func(in *harness.Instance) {
			in.Events = []harness.ScheduledEvent{{ID: evID, Code: "system-reboot", Description: "scheduled reboot",
				NotBefore: start, NotAfter: start.Add(2 * time.Hour), NotBeforeDeadline: start.Add(48 * time.Hour)}}
		})
		arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED/resched-1"
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", start, "upcoming", arn, id), id)

		moved := window.Add(lead)
		var rec record.Record
		s.eventually("a deferral of the moved event", 30*time.Second, func() bool {
			var ok bool
			rec, ok = s.activeRecord(claim)
			return ok
		})
		moves := ec2s.Moves()
		if len(moves) != 1 || moves[0].InstanceID != id || moves[0].EventID != evID || !moves[0].NotBefore.Equal(moved) || moves[0].Error != "" || moves[0].DryRun {
			t.Fatalf("ModifyInstanceEventStartTime calls: %+v; want one moving %s of %s to %s", moves, evID, id, moved)
		}
		if e, _ := ec2s.Event(id, evID); !e.NotBefore.Equal(moved) {
			t.Errorf("EC2 holds the event at %s, want %s", e.NotBefore, moved)
		}
		if want := "system-reboot@" + moved.UTC().Format(time.RFC3339); rec.Match != want || rec.Key != arn {
			t.Errorf("record matches %q under key %q, want %q under %q", rec.Match, rec.Key, want, arn)
		}
		if rec.Hold != policy.HoldWindow || !rec.Until.Equal(window) {
			t.Errorf("deferred with hold %q until %s, want the window at %s", rec.Hold, rec.Until, window)
		}
		how := "rescheduled " + evID + " moved from " + start.UTC().Format(time.RFC3339) + " to " + moved.UTC().Format(time.RFC3339)
		if !strings.HasPrefix(rec.Reason, how) {
			t.Errorf("reason %q, want it to begin %q", rec.Reason, how)
		}
		s.eventually("a HealthEventRescheduled Event on the NodeClaim", 10*time.Second, func() bool {
			for _, e := range s.eventsOf("", signal.ReasonRescheduled) {
				if e.Regarding.Name == claim && strings.Contains(e.Note, how) {
					return true
				}
			}
			return false
		})

		if got := metricOf(t, reg, metrics.Reschedules, map[string]string{metrics.LabelResult: reschedule.ResultMoved}); got != 1 {
			t.Errorf("%s{result=moved} = %v, want 1", metrics.Reschedules, got)
		}
		// The poller's next poll reports the moved event under EC2's ID (its success is
		// counted once its findings are handled): the same maintenance, recorded already.
		polls := metricOf(t, reg, metrics.PollerPolls, polled)
		scheduledFinding := map[string]string{metrics.LabelFinding: event.FindingScheduledEvent}
		s.eventually("the poller hands the moved event over", 30*time.Second, func() bool {
			return metricOf(t, reg, metrics.PollerFindings, scheduledFinding) == 1 && metricOf(t, reg, metrics.PollerPolls, polled) > polls
		})
		if got := metricOf(t, reg, metrics.AlreadyRecorded, nil); got < 1 {
			t.Errorf("%s = %v: the poller's report of the moved event was not found recorded", metrics.AlreadyRecorded, got)
		}
		set := s.memory(claim).Set()
		if len(set.Records) != 1 || len(set.Active()) != 1 || !record.Same(set.Active()[0], rec) {
			t.Errorf("records after the poller saw the moved event: %+v, want only %+v", set.Records, rec)
		}
		if n := len(ec2s.Moves()); n != 1 {
			t.Errorf("%d ModifyInstanceEventStartTime calls, want 1", n)
		}
	})

	t.Run("an event without a deadline stays, deferred to the window", func(t *testing.T) {
		s.t = t
		const id, evID = "i-0e1f2a3b4c5d60002", "instance-event-0d59937288b749b32"
		ann, window := reschedulePool(time.Now())
		s.pool("ledger", ann)
		claim := s.node("ledger", id)
		start := window.Add(78 * time.Hour)
		ec2s.Add(id, &harness.Instance{Events: []harness.ScheduledEvent{{ID: evID, Code: "system-reboot", Description: "scheduled reboot",
			NotBefore: start, NotAfter: start.Add(2 * time.Hour)}}})
		movesBefore := len(ec2s.Moves())
		_, _, askedBefore, _ := ec2s.Stats()
		s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) { o.AWSEndpointURL = endpoint })
		arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED/resched-2"
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", start, "upcoming", arn, id), id)

		var rec record.Record
		s.eventually("a deferral", 30*time.Second, func() bool {
			var ok bool
			rec, ok = s.activeRecord(claim)
			return ok
		})
		if !strings.HasPrefix(rec.Reason, "not rescheduled: the event has no deadline") {
			t.Errorf("reason %q, want it to say the event was not rescheduled for want of a deadline", rec.Reason)
		}
		if rec.Hold != policy.HoldWindow || !rec.Until.Equal(window) || rec.Match != "system-reboot@"+start.UTC().Format(time.RFC3339) {
			t.Errorf("deferred with hold %q until %s matching %q; want the window at %s, the event where it was", rec.Hold, rec.Until, rec.Match, window)
		}
		// The router asked EC2 (the reason is EC2's answer, not a guess) and moved nothing.
		_, _, asked, _ := ec2s.Stats()
		found := false
		for _, ids := range asked[len(askedBefore):] {
			found = found || (len(ids) == 1 && ids[0] == id)
		}
		if !found {
			t.Errorf("DescribeInstanceStatus not asked about %s: %v", id, asked[len(askedBefore):])
		}
		if moves := ec2s.Moves(); len(moves) != movesBefore {
			t.Errorf("ModifyInstanceEventStartTime called for an event without a deadline: %+v", moves[movesBefore:])
		}
		if e, _ := ec2s.Event(id, evID); !e.NotBefore.Equal(start) {
			t.Errorf("the event moved to %s", e.NotBefore)
		}
		for _, e := range s.eventsOf("", signal.ReasonRescheduled) {
			if e.Regarding.Name == claim {
				t.Errorf("a HealthEventRescheduled Event for an event not moved: %s", e.Note)
			}
		}
	})
}
