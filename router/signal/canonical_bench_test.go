package signal

import (
	"fmt"
	"strings"
	"testing"

	"github.com/health-router/health-router/router/event"
)

// bulkHealthEvent is an AZ-wide maintenance naming n instances (4,000 fill EventBridge's
// 256 KiB).
func bulkHealthEvent(b *testing.B, n int) event.Event {
	b.Helper()
	var ids, entities []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("i-0a1b2c3d4%08x", i)
		ids = append(ids, fmt.Sprintf("%q", id))
		entities = append(entities, fmt.Sprintf(`{"entityValue":%q}`, id))
	}
	body := fmt.Sprintf(`{"version":"0","id":"az","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[%s],"detail":{"eventArn":"arn:aws:health:eu-west-1::event/EC2/M/1","service":"EC2","eventTypeCode":"AWS_EC2_SYSTEM_MAINTENANCE_EVENT","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":"Sat, 28 Nov 2026 10:00:00 GMT","affectedEntities":[%s]}}`,
		strings.Join(ids, ","), strings.Join(entities, ","))
	ev, err := event.Parse([]byte(body))
	if err != nil {
		b.Fatal(err)
	}
	return ev
}

// BenchmarkCanonicalBulk: the canonical bodies of every instance of a 4,000-instance event,
// parsing the event once (Canonicalizer, what the signaller does) against once per instance
// (Canonical). One op is the whole event.
func BenchmarkCanonicalBulk(b *testing.B) {
	for _, n := range []int{400, 4000} {
		ev := bulkHealthEvent(b, n)
		b.Run(fmt.Sprintf("parse-once/%d", n), func(b *testing.B) {
			for b.Loop() {
				c, err := NewCanonicalizer(ev)
				if err != nil {
					b.Fatal(err)
				}
				for _, id := range ev.Instances {
					if _, err := c.Body(id); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("parse-per-instance/%d", n), func(b *testing.B) {
			for b.Loop() {
				for _, id := range ev.Instances {
					if _, err := Canonical(ev, id); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
