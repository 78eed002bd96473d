package metrics

import (
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/version"
)

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

// TestBuildInfo: the registry the router's collectors go to serves health_router_build_info,
// one series at 1 whose labels are the running build's.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewRouter(reg, func() float64 { return 0 })
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := version.Get()
	for _, f := range families {
		if f.GetName() != BuildInfo {
			continue
		}
		if len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != 1 {
			t.Fatalf("%s: %v, want one series at 1", BuildInfo, f.GetMetric())
		}
		labels := map[string]string{}
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for name, value := range map[string]string{LabelVersion: want.Version, LabelCommit: want.Commit, LabelGoVersion: runtime.Version(), LabelKarpenterVersion: want.KarpenterVersion} {
			if labels[name] != value || value == "" {
				t.Errorf("label %s = %q, want %q", name, labels[name], value)
			}
		}
		if len(labels) != 4 {
			t.Errorf("labels %v, want version, commit, go_version, karpenter_version", labels)
		}
		return
	}
	t.Fatalf("%s is not registered", BuildInfo)
}
