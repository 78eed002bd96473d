package event

import (
	"encoding/json"
	"fmt"
	"time"
)

// Moved returns ev as it reads once its scheduled maintenance starts at start instead: the
// router moved it (EC2 ModifyInstanceEventStartTime). The body is rewritten (an AWS Health
// event's detail.startTime, a poller finding's not-before; the end moves by as much) and parsed
// again, so the record of the decision, the match of the same maintenance reported by the
// other source, and the body forwarded to Karpenter all carry the new start. The event keeps
// its ID.
func Moved(ev Event, start time.Time) (Event, error) {
	if ev.Kind != KindScheduledChange || ev.Deadline.IsZero() {
		return Event{}, fmt.Errorf("event %s: only a scheduled change with a start can move", ev.ID)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(ev.Body, &env); err != nil {
		return Event{}, fmt.Errorf("event %s: %w", ev.ID, err)
	}
	var detail map[string]any
	if err := json.Unmarshal(env["detail"], &detail); err != nil {
		return Event{}, fmt.Errorf("event %s: detail: %w", ev.ID, err)
	}
	start = start.UTC().Truncate(time.Second)
	shift := start.Sub(ev.Deadline)
	if ev.Source == SourceHealthRouter {
		detail["not-before"] = stampUTC(start)
		if na, ok := detail["not-after"].(string); ok && na != "" {
			if t, err := time.Parse(time.RFC3339, na); err == nil {
				detail["not-after"] = stampUTC(t.Add(shift))
			}
		}
	} else {
		detail["startTime"] = start.Format(healthTimeLayout)
		if ev.Health != nil && !ev.Health.End.IsZero() {
			detail["endTime"] = ev.Health.End.Add(shift).UTC().Format(healthTimeLayout)
		}
	}
	raw, err := json.Marshal(detail)
	if err != nil {
		return Event{}, fmt.Errorf("event %s: %w", ev.ID, err)
	}
	env["detail"] = raw
	body, err := json.Marshal(env)
	if err != nil {
		return Event{}, fmt.Errorf("event %s: %w", ev.ID, err)
	}
	moved, err := Parse(body)
	if err != nil {
		return Event{}, err
	}
	moved.MovedFrom = ev.MovedFrom
	if moved.MovedFrom.IsZero() && !start.Equal(ev.Deadline.UTC().Truncate(time.Second)) {
		moved.MovedFrom = ev.Deadline.UTC().Truncate(time.Second)
	}
	return moved, nil
}

// healthTimeLayout is how AWS Health writes its times ("Sat, 05 Dec 2026 02:00:00 GMT").
const healthTimeLayout = "Mon, 02 Jan 2006 15:04:05 GMT"
