package metrics

import "testing"

// TestCloudWatchMetricsDocumented: the reference lists every CloudWatch metric the router and
// the Lambda publish, and no other.
func TestCloudWatchMetricsDocumented(t *testing.T) {
	seen := map[string]bool{}
	for _, m := range CloudWatchMetrics() {
		if _, ok := CloudWatchDimensions[m.Name]; !ok {
			t.Errorf("%s is documented but not in CloudWatchDimensions", m.Name)
		}
		if seen[m.Name] || m.Unit == "" || m.Doc == "" {
			t.Errorf("%s: documented twice, or without unit or doc", m.Name)
		}
		seen[m.Name] = true
	}
	for name := range CloudWatchDimensions {
		if !seen[name] {
			t.Errorf("%s is published but not documented: add it to CloudWatchMetrics, then run make docs", name)
		}
	}
}
