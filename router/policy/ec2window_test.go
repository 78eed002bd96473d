package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEC2Ranges: the conversion of a pool's window to EC2's weekly time ranges, and each of
// its refusals with its reason.
func TestEC2Ranges(t *testing.T) {
	rng := func(sd time.Weekday, sh int, ed time.Weekday, eh int) WeeklyRange {
		return WeeklyRange{StartDay: sd, StartHour: sh, EndDay: ed, EndHour: eh}
	}
	tests := []struct {
		name, schedule, duration string
		want                     []WeeklyRange
		refused                  string // a substring of the reason; "" when converted
	}{
		{"Saturday 02:00 for 4h", "0 2 * * 6", "4h", []WeeklyRange{rng(time.Saturday, 2, time.Saturday, 6)}, ""},
		{"day names", "0 2 * * sat", "4h", []WeeklyRange{rng(time.Saturday, 2, time.Saturday, 6)}, ""},
		{"across midnight", "0 22 * * 1", "6h", []WeeklyRange{rng(time.Monday, 22, time.Tuesday, 4)}, ""},
		{"daily, 2h each", "0 3 * * *", "2h", []WeeklyRange{
			rng(time.Sunday, 3, time.Sunday, 5), rng(time.Monday, 3, time.Monday, 5), rng(time.Tuesday, 3, time.Tuesday, 5), rng(time.Wednesday, 3, time.Wednesday, 5),
			rng(time.Thursday, 3, time.Thursday, 5), rng(time.Friday, 3, time.Friday, 5), rng(time.Saturday, 3, time.Saturday, 5)}, ""},
		{"@weekly (Sunday 00:00)", "@weekly", "4h", []WeeklyRange{rng(time.Sunday, 0, time.Sunday, 4)}, ""},
		{"overlapping openings merge", "0 2,4 * * 3", "3h", []WeeklyRange{rng(time.Wednesday, 2, time.Wednesday, 7)}, ""},
		{"adjacent openings merge", "0 2,4 * * 3", "2h", []WeeklyRange{rng(time.Wednesday, 2, time.Wednesday, 6)}, ""},
		{"two days", "0 1 * * 2,4", "2h", []WeeklyRange{rng(time.Tuesday, 1, time.Tuesday, 3), rng(time.Thursday, 1, time.Thursday, 3)}, ""},
		{"days long", "0 0 * * 1", "120h", []WeeklyRange{rng(time.Monday, 0, time.Saturday, 0)}, ""},
		{"a fixed-offset zone converts to UTC", "CRON_TZ=Asia/Tokyo 0 2 * * 6", "4h", []WeeklyRange{rng(time.Friday, 17, time.Friday, 21)}, ""},
		{"UTC named", "CRON_TZ=UTC 0 2 * * 6", "4h", []WeeklyRange{rng(time.Saturday, 2, time.Saturday, 6)}, ""},
		{"through the week's end: cut at Saturday 23:00", "0 20 * * 6", "6h", []WeeklyRange{rng(time.Sunday, 0, time.Sunday, 2), rng(time.Saturday, 20, time.Saturday, 23)}, ""},
		{"ends at the week's end: cut at Saturday 23:00", "0 18 * * 6", "6h", []WeeklyRange{rng(time.Saturday, 18, time.Saturday, 23)}, ""},

		{"a daylight-saving zone", "CRON_TZ=Europe/Paris 0 2 * * sat", "4h", nil, "daylight saving"},
		{"a half-hour zone", "CRON_TZ=Asia/Kolkata 0 2 * * 6", "4h", nil, "opens at 20:30 UTC"},
		{"minutes not on the hour", "30 2 * * 6", "4h", nil, "opens at 02:30 UTC"},
		{"a duration not in whole hours", "0 2 * * 6", "90m", nil, "whole hours"},
		{"a range under 2h", "0 2 * * 6,0", "1h", nil, "open 1 h from Sunday 02:00"},
		{"under 4h a week", "0 2 * * 6", "3h", nil, "open 3 h a week"},
		{"days of the month", "0 2 1,15 * *", "4h", nil, "every week"},
		{"months", "0 2 * 1 6", "4h", nil, "every week"},
		{"too little before the week's end", "0 22 * * 6", "4h", nil, "once cut at Saturday 23:00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := NewWindow(tt.schedule, tt.duration)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.EC2Ranges()
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("EC2Ranges = %v, %v; want refused with %q", got, err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			slices.SortFunc(got, func(a, b WeeklyRange) int {
				return (int(a.StartDay)*24 + a.StartHour) - (int(b.StartDay)*24 + b.StartHour)
			})
			slices.SortFunc(tt.want, func(a, b WeeklyRange) int {
				return (int(a.StartDay)*24 + a.StartHour) - (int(b.StartDay)*24 + b.StartHour)
			})
			if !slices.Equal(got, tt.want) {
				t.Errorf("EC2Ranges = %s\nwant        %s", FormatRanges(got), FormatRanges(tt.want))
			}
			// What EC2 holds: every range within the week, whole hours 0-23, 2h or more;
			// and the window AWS gets is within the pool's own: every hour of every range is
			// an hour the pool's window is open.
			for _, r := range got {
				if r.Hours() < MinEC2RangeHours || r.StartHour < 0 || r.StartHour > 23 || r.EndHour < 0 || r.EndHour > 23 {
					t.Errorf("range %s: not one EC2 takes", r)
				}
				for h := 0; h < r.Hours(); h++ {
					at := ec2Reference.AddDate(0, 0, 14).Add(time.Duration(int(r.StartDay)*24+r.StartHour+h)*time.Hour + 30*time.Minute)
					if !w.Open(at) {
						t.Errorf("range %s: the pool's window is closed at %s", r, at)
					}
				}
			}
		})
	}
	if _, err := (*Window)(nil).EC2Ranges(); err == nil {
		t.Error("no window converted")
	}
}

// TestEC2RangesLeaveTheLeads: the EC2 window is the pool's shifted by the leads of what the
// router does before AWS's start, so that AWS, scheduling a start inside it, never has the
// router act before the pool's window opens (issue 36, defect 6: the EC2 window was the pool's
// own, and a retirement AWS scheduled at its opening was drained drain-lead before it; a
// reboot in place emptied the node 2h10m before it).
func TestEC2RangesLeaveTheLeads(t *testing.T) {
	rng := func(sd time.Weekday, sh int, ed time.Weekday, eh int) WeeklyRange {
		return WeeklyRange{StartDay: sd, StartHour: sh, EndDay: ed, EndHour: eh}
	}
	tests := []struct {
		name, schedule, duration string
		leads                    []time.Duration
		want                     []WeeklyRange
		refused                  string
	}{
		{"drain-lead 1h", "0 2 * * 6", "4h", []time.Duration{time.Hour}, []WeeklyRange{rng(time.Saturday, 3, time.Saturday, 7)}, ""},
		{"drain-lead 90m: narrowed to whole hours", "0 2 * * 6", "6h", []time.Duration{90 * time.Minute}, []WeeklyRange{rng(time.Saturday, 4, time.Saturday, 9)}, ""},
		{"a drain and a reboot in place emptied 2h10m ahead", "0 2 * * 6", "6h", []time.Duration{time.Hour, 130 * time.Minute}, []WeeklyRange{rng(time.Saturday, 5, time.Saturday, 9)}, ""},
		{"shifted across midnight", "0 22 * * 1", "6h", []time.Duration{3 * time.Hour}, []WeeklyRange{rng(time.Tuesday, 1, time.Tuesday, 7)}, ""},
		{"shifted past the week's end", "0 20 * * 6", "4h", []time.Duration{2 * time.Hour}, []WeeklyRange{rng(time.Saturday, 22, time.Saturday, 23), rng(time.Sunday, 0, time.Sunday, 2)}, "once cut at Saturday 23:00"},
		{"too little left once the leads differ", "0 2 * * 6", "4h", []time.Duration{time.Hour, 130 * time.Minute}, nil, "open 2 h a week"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := NewWindow(tt.schedule, tt.duration)
			if err != nil {
				t.Fatal(err)
			}
			got, err := w.EC2Ranges(tt.leads...)
			if tt.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("EC2Ranges = %v, %v; want refused with %q", got, err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("EC2Ranges = %s\nwant        %s", FormatRanges(got), FormatRanges(tt.want))
			}
			// Every start AWS may choose in the EC2 window puts every lead's action inside the
			// pool's window.
			for _, r := range got {
				for m := 0; m < r.Hours()*60; m += 10 {
					start := ec2Reference.AddDate(0, 0, 14).Add(time.Duration(int(r.StartDay)*24+r.StartHour)*time.Hour + time.Duration(m)*time.Minute)
					for _, l := range tt.leads {
						if !w.Open(start.Add(-l)) {
							t.Errorf("a start at %s in range %s acts at %s (lead %s), outside the pool's window", start, r, start.Add(-l), l)
						}
					}
				}
			}
		})
	}
}
