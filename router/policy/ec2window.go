package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// WeeklyRange is one time range of an EC2 event window, in UTC: from StartDay at StartHour:00
// to EndDay at EndHour:00 (EC2's InstanceEventWindowTimeRangeRequest: StartWeekDay, StartHour,
// EndWeekDay, EndHour). The week runs from Sunday, as EC2's WeekDay values and cron's 0-6 do.
type WeeklyRange struct {
	StartDay  time.Weekday
	StartHour int
	EndDay    time.Weekday
	EndHour   int
}

// Hours is how long the range lasts.
func (r WeeklyRange) Hours() int {
	return (int(r.EndDay)*24 + r.EndHour) - (int(r.StartDay)*24 + r.StartHour)
}

func (r WeeklyRange) String() string {
	return fmt.Sprintf("%s %02d:00-%s %02d:00 UTC", r.StartDay.String()[:3], r.StartHour, r.EndDay.String()[:3], r.EndHour)
}

// EC2's bounds of an event window (Amazon EC2 User Guide, "Define event windows for scheduled
// events", Considerations; API reference, CreateInstanceEventWindow): all times are in UTC,
// each time range lasts at least 2 hours, and the ranges of a window total at least 4 hours
// a week. InstanceEventWindowTimeRangeRequest takes whole hours (StartHour and EndHour, 0 to
// 23) and a weekday each.
const (
	MinEC2RangeHours = 2
	MinEC2WeekHours  = 4
	hoursPerWeek     = 7 * 24
	// lastEndHour is the latest end a range can have in the week: Saturday 23:00. EndHour
	// stops at 23, and this converter never writes a range that runs from Saturday into
	// Sunday (whether EC2 takes one is not documented): a range through the week's end is
	// cut there, so the window AWS gets lies within the pool's, never outside it.
	lastEndHour = hoursPerWeek - 1
	// weeksProbed is how many weeks of a reference year the schedule is laid out over to show
	// that it repeats weekly in UTC: a year, so that days of the month, months and daylight
	// saving all show.
	weeksProbed = 53
)

// ec2Reference is the Sunday the weeks the conversion lays the window out over begin: fixed,
// so that EC2Ranges is a pure function of the window.
var ec2Reference = time.Date(2026, time.January, 4, 0, 0, 0, 0, time.UTC)

// EC2Ranges converts the window to the time ranges of an EC2 event window: the hours of the
// week, in UTC, that the window is open in every week. It refuses, with the reason, what EC2
// cannot hold: a window that does not repeat weekly in UTC (days of the month or months in
// the schedule; a CRON_TZ zone that observes daylight saving, which moves the window against
// UTC twice a year), a start or a duration not on a whole hour (EC2's ranges are whole hours;
// a zone such as Asia/Kolkata, UTC+5:30, puts every start on a half hour), a range under 2
// hours, or under 4 hours a week in all. Overlapping and adjacent openings merge into one
// range. A range that runs through the week's end (Saturday into Sunday, UTC) is cut at
// Saturday 23:00 (lastEndHour); the part after midnight is a range of its own.
//
// EC2's other form, a cron expression of hours and weekdays, is not used: it says no more
// than the ranges do, and its hour ranges count their end differently from cron's (EC2's own
// example counts 0-2 as two hours, where cron's 0-2 runs to 02:59).
//
// leads are how long before AWS's start the router acts on an event of the pool (drain-lead
// for a drain; for a reboot in place, how long before the start it empties the node). AWS
// schedules an event's start inside the EC2 window, so the EC2 window is the pool's shifted
// later: a start S in it puts S minus every lead inside the pool's window (from the opening
// plus the longest lead to the close plus the shortest), narrowed to whole hours. With no
// lead it is the pool's window itself.
func (w *Window) EC2Ranges(leads ...time.Duration) ([]WeeklyRange, error) {
	if w == nil || w.sched == nil {
		return nil, fmt.Errorf("no maintenance window")
	}
	if w.Duration <= 0 || w.Duration%time.Hour != 0 {
		return nil, fmt.Errorf("the window lasts %s: EC2's time ranges are whole hours", short(w.Duration))
	}
	var from, to time.Duration // the shift of each opening's start and end
	for i, l := range leads {
		if i == 0 || l > from {
			from = l
		}
		if i == 0 || l < to {
			to = l
		}
	}
	if from < 0 || to < 0 {
		return nil, fmt.Errorf("a negative lead %s", short(min(from, to)))
	}
	var first [hoursPerWeek]bool
	for week := range weeksProbed {
		begin := ec2Reference.AddDate(0, 0, 7*week)
		open, err := w.weekHours(begin, from, to)
		if err != nil {
			return nil, err
		}
		if week == 0 {
			first = open
			continue
		}
		if open != first {
			if zone, ok := daylightSaving(w.sched); ok {
				return nil, fmt.Errorf("CRON_TZ zone %s observes daylight saving time: the window moves an hour against UTC twice a year, and EC2's windows are fixed in UTC", zone)
			}
			return nil, fmt.Errorf("the schedule does not open at the same hours every week (days of the month, months): EC2's windows recur weekly")
		}
	}
	var ranges []WeeklyRange
	total := 0
	for h := 0; h < hoursPerWeek; {
		if !first[h] {
			h++
			continue
		}
		e := h
		for e < hoursPerWeek && first[e] {
			e++
		}
		end := min(e, lastEndHour)
		r := WeeklyRange{StartDay: time.Weekday(h / 24), StartHour: h % 24, EndDay: time.Weekday(end / 24), EndHour: end % 24}
		if end-h < MinEC2RangeHours {
			if e == hoursPerWeek {
				return nil, fmt.Errorf("the window's hours before the week's end (%s 00:00 UTC) are %d h once cut at Saturday 23:00, the last end EC2's ranges take: EC2's ranges last %d h at least", time.Sunday, end-h, MinEC2RangeHours)
			}
			return nil, fmt.Errorf("the window is open %d h from %s %02d:00 UTC: EC2's ranges last %d h at least", end-h, r.StartDay, r.StartHour, MinEC2RangeHours)
		}
		ranges = append(ranges, r)
		total += end - h
		h = e
	}
	if total < MinEC2WeekHours {
		return nil, fmt.Errorf("the window is open %d h a week: EC2's windows are open %d h a week at least", total, MinEC2WeekHours)
	}
	return ranges, nil
}

// weekHours marks the whole hours of the week from begin (a Sunday, 00:00 UTC) that lie in an
// opening of the window shifted later by from at its start and by to at its end, counting the
// openings of the week before that last into it.
func (w *Window) weekHours(begin time.Time, from, to time.Duration) ([hoursPerWeek]bool, error) {
	var open [hoursPerWeek]bool
	end := begin.Add(hoursPerWeek * time.Hour)
	for s := w.sched.Next(begin.Add(-w.Duration - to)); !s.IsZero() && s.Add(from).Before(end); s = w.sched.Next(s) {
		u := s.UTC()
		if u.Minute() != 0 || u.Second() != 0 {
			return open, fmt.Errorf("the window opens at %s UTC: EC2's time ranges start on the hour", u.Format("15:04"))
		}
		first := max(0, ceilHours(u.Add(from).Sub(begin)))
		last := min(hoursPerWeek, int(u.Add(w.Duration+to).Sub(begin)/time.Hour)) // floor: the shift keeps within
		for h := first; h < last; h++ {
			open[h] = true
		}
	}
	return open, nil
}

// ceilHours is d in whole hours, rounded up (d may be negative: an opening of the week before).
func ceilHours(d time.Duration) int {
	h := int(d / time.Hour)
	if d > 0 && d%time.Hour != 0 {
		h++
	}
	return h
}

// daylightSaving reports the schedule's zone when its offset from UTC changes within the
// reference year.
func daylightSaving(s cron.Schedule) (string, bool) {
	spec, ok := s.(*cron.SpecSchedule)
	if !ok || spec.Location == nil {
		return "", false
	}
	_, first := ec2Reference.In(spec.Location).Zone()
	for d := 1; d < 366; d++ {
		if _, off := ec2Reference.AddDate(0, 0, d).In(spec.Location).Zone(); off != first {
			return spec.Location.String(), true
		}
	}
	return "", false
}

// FormatRanges writes ranges for people: "Sat 02:00-Sat 06:00 UTC, Sun 02:00-Sun 04:00 UTC".
func FormatRanges(ranges []WeeklyRange) string {
	s := make([]string, len(ranges))
	for i, r := range ranges {
		s[i] = r.String()
	}
	return strings.Join(s, ", ")
}
