package integration

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// orgViewHealth is an AWS Health event as the organizational view delivers it: to the
// management (or delegated-admin) account 999988887777 in us-east-1, about instances of the
// affected account (detail.affectedAccount) in the impacted region (detail.eventRegion).
// entities maps an instance to its entity status ("" for none).
func orgViewHealth(id, communication, arn string, start time.Time, entities [][2]string) string {
	var list []map[string]string
	for _, e := range entities {
		m := map[string]string{"entityValue": e[0], "lastUpdatedTime": "Sat, 21 Nov 2026 10:00:00 GMT"}
		if e[1] != "" {
			m["status"] = e[1]
		}
		list = append(list, m)
	}
	ents, _ := json.Marshal(list)
	return fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"AWS Health Event","source":"aws.health","account":"999988887777","time":%q,"region":"us-east-1","resources":[],"detail":{"eventArn":%q,"service":"EC2","eventScopeCode":"ACCOUNT_SPECIFIC","communicationId":%q,"affectedAccount":"123456789012","eventTypeCode":"AWS_EC2_INSTANCE_STOP_SCHEDULED","eventTypeCategory":"scheduledChange","eventRegion":%q,"statusCode":"upcoming","startTime":%q,"endTime":%q,"eventDescription":[{"language":"en_US","latestDescription":"stop"}],"affectedEntities":%s}}`,
		id, time.Now().UTC().Format(time.RFC3339), arn, communication, harness.Region, start.UTC().Format(time.RFC1123), start.Add(time.Hour).UTC().Format(time.RFC1123), ents)
}

// TestHealthOrganizationalView (issue 27, 4): a router that serves account 123456789012 in
// eu-west-1 acts on an organizational-view event whose top-level account and region are the
// management account's (on 13eb164 it was dead-lettered as foreign); a second copy of the same
// communication (another EventBridge id, the same communicationId) is decided once (on 13eb164
// it superseded the first's deferral with its own); an entity whose status is RESOLVED is not
// acted on.
func TestHealthOrganizationalView(t *testing.T) {
	s := newStage(t)
	s.pool("org", map[string]string{"healthrouter.io/action": "defer", "healthrouter.io/drain-lead": "1h"})
	a := s.node("org", "i-0a1b2c3d4e5f62711")
	b := s.node("org", "i-0a1b2c3d4e5f62712")
	c := s.node("org", "i-0a1b2c3d4e5f62713")
	s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) { o.Account, o.Region = "123456789012", harness.Region })
	start := time.Now().Add(3 * time.Hour)
	arn := "arn:aws:health:" + harness.Region + "::event/EC2/AWS_EC2_INSTANCE_STOP_SCHEDULED/AWS_EC2_INSTANCE_STOP_SCHEDULED_ORG1"

	s.putRaw(orgViewHealth("0b1e3c55-0000-4000-8000-000000002711", "c0ffee01-1", arn, start, [][2]string{{"i-0a1b2c3d4e5f62711", ""}}))
	s.eventually("the organizational-view event deferred on its instance", 30*time.Second, func() bool {
		ds := s.records(a)
		return len(ds) == 1 && ds[0].State == record.StateDeferred
	})
	if dl := s.drain(s.dlqURL); len(dl) != 0 {
		t.Fatalf("dead-lettered: %v", dl[0].MessageAttributes)
	}

	// The same communication again, with another EventBridge id (a second delivery path).
	s.putRaw(orgViewHealth("0b1e3c55-0000-4000-8000-000000002799", "c0ffee01-1", arn, start, [][2]string{{"i-0a1b2c3d4e5f62711", ""}}))
	// A page of the same event, of another communication: one entity resolved, one not.
	s.putRaw(orgViewHealth("0b1e3c55-0000-4000-8000-000000002712", "c0ffee02-1", arn, start, [][2]string{{"i-0a1b2c3d4e5f62712", "RESOLVED"}, {"i-0a1b2c3d4e5f62713", "PENDING"}}))
	s.eventually("the page's open entity deferred", 30*time.Second, func() bool { return len(s.records(c)) == 1 })
	s.eventually("every message handled", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })

	ds := s.records(a)
	if len(ds) != 1 || ds[0].EventID != "0b1e3c55-0000-4000-8000-000000002711" || ds[0].State != record.StateDeferred {
		t.Errorf("records after a duplicate communication: %+v, want the first copy's deferral alone", ds)
	}
	// The resolved entity is not acted on: its report is a close of the event for it (issue 36,
	// defect 3), which leaves only the close's mark (a later report older than it is late).
	if ds := s.records(b); slices.ContainsFunc(ds, func(r record.Record) bool { return r.State != record.StateClosed }) || !s.claim(b).DeletionTimestamp.IsZero() {
		t.Errorf("the resolved entity was acted on: records %+v, deleting %t", ds, !s.claim(b).DeletionTimestamp.IsZero())
	}
	if dl := s.drain(s.dlqURL); len(dl) != 0 {
		t.Errorf("dead-lettered %d messages", len(dl))
	}
}
