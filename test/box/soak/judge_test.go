package soak

import (
	"math"
	"testing"
	"time"
)

// TestWindowArithmetic checks the checker's own window arithmetic against the kafka pool's
// schedule ("*/3 * * * *", one minute long), so that a soak that passes does so because the
// router kept to the windows, not because the checker judged every time to be in one.
func TestWindowArithmetic(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.TimeOnly, s)
		if err != nil {
			t.Fatal(err)
		}
		return time.Date(2026, 12, 7, v.Hour(), v.Minute(), v.Second(), 0, time.UTC)
	}
	for _, tc := range []struct {
		t        string
		in       bool
		nextOpen string
	}{
		{"23:12:00", true, "23:15:00"},
		{"23:12:59", true, "23:15:00"},
		{"23:13:04", true, "23:15:00"}, // within edgeSlack of the close
		{"23:13:06", false, "23:15:00"},
		{"23:14:00", false, "23:15:00"},
		{"23:14:56", true, "23:15:00"}, // within edgeSlack of the opening
		{"23:14:54", false, "23:15:00"},
		{"23:59:30", false, "00:00:00"},
	} {
		if got := inWindow(at(tc.t)); got != tc.in {
			t.Errorf("inWindow(%s) = %v, want %v", tc.t, got, tc.in)
		}
		if got := stamp(nextOpen(at(tc.t))); got != tc.nextOpen {
			t.Errorf("nextOpen(%s) = %s, want %s", tc.t, got, tc.nextOpen)
		}
	}
}

// TestSlope checks the least-squares slope the resource curves are judged by.
func TestSlope(t *testing.T) {
	xs := []float64{0, 1, 2, 3, 4}
	b, mean := slope(xs, []float64{10, 12, 14, 16, 18})
	if math.Abs(b-2) > 1e-9 || math.Abs(mean-14) > 1e-9 {
		t.Errorf("slope of a line of slope 2 = %v (mean %v), want 2 (mean 14)", b, mean)
	}
	if b, _ := slope(xs, []float64{5, 7, 5, 7, 5}); math.Abs(b) > 1e-9 {
		t.Errorf("slope of a flat, noisy series = %v, want 0", b)
	}
}
