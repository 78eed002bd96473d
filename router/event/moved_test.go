package event

import (
	"fmt"
	"testing"
	"time"
)

func TestMoved(t *testing.T) {
	start := time.Date(2026, 12, 9, 14, 0, 0, 0, time.UTC)
	to := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	health := fmt.Sprintf(`{"version":"0","id":"h-1","detail-type":"AWS Health Event","source":"aws.health","account":"111122223333","time":"2026-11-24T10:00:00Z","region":"eu-west-1","resources":["i-0123456789abcdef0"],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/SYSTEM_REBOOT/x","service":"EC2","eventTypeCode":"AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"endTime":%q,"affectedEntities":[{"entityValue":"i-0123456789abcdef0"}]}}`,
		start.Format(time.RFC1123), start.Add(2*time.Hour).Format(time.RFC1123))
	finding := StatusFinding{InstanceID: "i-0123456789abcdef0", Finding: FindingScheduledEvent, Time: start.Add(-72 * time.Hour), Account: "111122223333", Region: "eu-west-1",
		Code: ScheduledSystemReboot, EventID: "instance-event-0abc", NotBefore: start, NotAfter: start.Add(2 * time.Hour)}
	_, polled, err := finding.Event()
	if err != nil {
		t.Fatal(err)
	}
	fromHealth, err := Parse([]byte(health))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		ev   Event
	}{{"AWS Health", fromHealth}, {"poller finding", polled}} {
		t.Run(tt.name, func(t *testing.T) {
			moved, err := Moved(tt.ev, to)
			if err != nil {
				t.Fatal(err)
			}
			if moved.ID != tt.ev.ID || !moved.Deadline.Equal(to) || moved.Kind != KindScheduledChange || len(moved.Instances) != 1 {
				t.Errorf("moved: id %s deadline %s kind %s instances %v", moved.ID, moved.Deadline, moved.Kind, moved.Instances)
			}
			if moved.Health.Scheduled != ScheduledSystemReboot || !moved.Health.Start.Equal(to) {
				t.Errorf("health part %+v", moved.Health)
			}
			if tt.ev.Health.End.IsZero() == false && !moved.Health.End.Equal(to.Add(2*time.Hour)) {
				t.Errorf("end %s, want it moved by as much as the start", moved.Health.End)
			}
			again, err := Parse(moved.Body)
			if err != nil || !again.Deadline.Equal(to) {
				t.Errorf("the body does not carry the new start: %v %s", err, again.Deadline)
			}
		})
	}
	if _, err := Moved(Event{ID: "spot", Kind: KindSpotInterruption}, to); err == nil {
		t.Error("a Spot warning moved")
	}
}
