// Package terraform holds the tests of the AWS side: the dashboard and alarms checked against the
// router's metric names, and the module applied to moto_server with real events put through its
// EventBridge rules. test/terraform/run.sh runs them with the Terraform checks.
package terraform

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"text/template"

	"github.com/health-router/health-router/router/metrics"
)

// moduleDir is the Terraform module, relative to this package.
const moduleDir = "../../terraform"

// metricRef is one reference to a CloudWatch metric, in the dashboard or an alarm.
type metricRef struct {
	where      string
	namespace  string
	name       string
	dimensions []string // names only
	values     map[string]string
}

var (
	tfDirective = regexp.MustCompile(`%\{~?\s*(if\s+(\w+)|endif)\s*~?\}`)
	tfInterp    = regexp.MustCompile(`\$\{(\w+)\}`)
	searchExpr  = regexp.MustCompile(`SEARCH\('\{([^}]*)\}\s*MetricName="([^"]+)"`)
)

// renderDashboard renders templates/dashboard.json.tftpl as templatefile() would, for the
// subset of the template language it uses: ${var}, $${ (a literal ${), %{ if var } and %{ endif }.
func renderDashboard(t *testing.T, vars map[string]any) []byte {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(moduleDir, "templates", "dashboard.json.tftpl"))
	if err != nil {
		t.Fatal(err)
	}
	const literal = "\x00LITERAL\x00"
	s := strings.ReplaceAll(string(src), "$${", literal)
	s = tfDirective.ReplaceAllStringFunc(s, func(m string) string {
		if sub := tfDirective.FindStringSubmatch(m); sub[2] != "" {
			return "{{if ." + sub[2] + "}}"
		}
		return "{{end}}"
	})
	s = tfInterp.ReplaceAllString(s, "{{.$1}}")
	s = strings.ReplaceAll(s, literal, "${")
	tmpl, err := template.New("dashboard").Option("missingkey=error").Parse(s)
	if err != nil {
		t.Fatalf("converting the dashboard template: %v", err)
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, vars); err != nil {
		t.Fatalf("rendering the dashboard template (a variable the test does not know?): %v", err)
	}
	return []byte(b.String())
}

// dashboardMetrics returns every metric the dashboard body references.
func dashboardMetrics(t *testing.T, body []byte) []metricRef {
	t.Helper()
	var dash struct {
		Widgets []struct {
			Properties struct {
				Title   string            `json:"title"`
				Metrics []json.RawMessage `json:"metrics"`
			} `json:"properties"`
		} `json:"widgets"`
	}
	if err := json.Unmarshal(body, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v\n%s", err, body)
	}
	var refs []metricRef
	for _, w := range dash.Widgets {
		for _, raw := range w.Properties.Metrics {
			var items []json.RawMessage
			if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
				t.Fatalf("widget %q: metric %s is not a non-empty array", w.Properties.Title, raw)
			}
			var expr struct {
				Expression string `json:"expression"`
			}
			if json.Unmarshal(items[0], &expr) == nil && expr.Expression != "" {
				m := searchExpr.FindStringSubmatch(expr.Expression)
				if m == nil {
					t.Fatalf("widget %q: expression %q is not a SEARCH the test understands", w.Properties.Title, expr.Expression)
				}
				schema := strings.Split(m[1], ",")
				for i := range schema {
					schema[i] = strings.TrimSpace(schema[i])
				}
				refs = append(refs, metricRef{where: "dashboard widget " + w.Properties.Title, namespace: schema[0], name: m[2], dimensions: schema[1:]})
				continue
			}
			var strs []string
			for _, it := range items {
				var s string
				if json.Unmarshal(it, &s) != nil {
					break // the trailing options object
				}
				strs = append(strs, s)
			}
			if len(strs) < 2 || len(strs)%2 != 0 {
				t.Fatalf("widget %q: metric %s is not [namespace, name, dim, value, ...]; the \".\" shorthand is not allowed here", w.Properties.Title, raw)
			}
			ref := metricRef{where: "dashboard widget " + w.Properties.Title, namespace: strs[0], name: strs[1], values: map[string]string{}}
			for i := 2; i < len(strs); i += 2 {
				ref.dimensions = append(ref.dimensions, strs[i])
				ref.values[strs[i]] = strs[i+1]
			}
			refs = append(refs, ref)
		}
	}
	return refs
}

var (
	alarmHeader = regexp.MustCompile(`resource\s+"aws_cloudwatch_metric_alarm"\s+"(\w+)"\s*\{`)
	hclString   = func(attr string) *regexp.Regexp { return regexp.MustCompile(`(?m)^\s*` + attr + `\s*=\s*"([^"]*)"`) }
	hclDims     = regexp.MustCompile(`(?m)^\s*dimensions\s*=\s*\{([^}]*)\}`)
	hclKey      = regexp.MustCompile(`(\w+)\s*=`)
)

// alarmMetrics returns the metric of every aws_cloudwatch_metric_alarm in the module's .tf files.
// Alarms must name their namespace and metric as literals, so that this test can see them.
func alarmMetrics(t *testing.T) []metricRef {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(moduleDir, "*.tf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .tf files in %s: %v", moduleDir, err)
	}
	var refs []metricRef
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, loc := range alarmHeader.FindAllStringSubmatchIndex(src, -1) {
			name := src[loc[2]:loc[3]]
			block := braceBlock(t, src, loc[1]-1)
			ns, metric := hclString("namespace").FindStringSubmatch(block), hclString("metric_name").FindStringSubmatch(block)
			if ns == nil || metric == nil {
				t.Fatalf("%s: alarm %s has no literal namespace and metric_name", f, name)
			}
			ref := metricRef{where: fmt.Sprintf("alarm %s (%s)", name, filepath.Base(f)), namespace: ns[1], name: metric[1]}
			if d := hclDims.FindStringSubmatch(block); d != nil {
				for _, k := range hclKey.FindAllStringSubmatch(d[1], -1) {
					ref.dimensions = append(ref.dimensions, k[1])
				}
			}
			refs = append(refs, ref)
		}
	}
	return refs
}

// braceBlock returns src from the brace at open to its matching close.
func braceBlock(t *testing.T, src string, open int) string {
	depth := 0
	for i := open; i < len(src); i++ {
		switch src[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[open : i+1]
			}
		}
	}
	t.Fatalf("unbalanced braces after offset %d", open)
	return ""
}

// checkRouterMetrics asserts every HealthRouter reference names a router metric with exactly its
// dimensions, and returns the names seen.
func checkRouterMetrics(t *testing.T, refs []metricRef, clusterName string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for _, r := range refs {
		if r.namespace != metrics.CloudWatchNamespace {
			if strings.EqualFold(r.namespace, metrics.CloudWatchNamespace) || strings.HasPrefix(r.namespace, "Health") {
				t.Errorf("%s: namespace %q is not %q", r.where, r.namespace, metrics.CloudWatchNamespace)
			}
			continue
		}
		want, ok := metrics.CloudWatchDimensions[r.name]
		if !ok {
			t.Errorf("%s: %s/%s is not a metric in router/metrics", r.where, r.namespace, r.name)
			continue
		}
		got := slices.Sorted(slices.Values(r.dimensions))
		if !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("%s: %s has dimensions %v, router/metrics publishes it with %v", r.where, r.name, r.dimensions, want)
		}
		if v, ok := r.values[metrics.DimClusterName]; ok && v != clusterName {
			t.Errorf("%s: %s has ClusterName %q, want the cluster_name %q", r.where, r.name, v, clusterName)
		}
		seen[r.name] = true
	}
	return seen
}

func TestDashboardMatchesRouterMetrics(t *testing.T) {
	vars := map[string]any{
		"region": "eu-west-1", "cluster_name": "prod-eu", "queue_name": "hr-prod-eu", "dlq_name": "hr-prod-eu-dlq",
		"function_name": "hr-prod-eu-dispatcher", "failure_queue_name": "hr-prod-eu-dispatcher-failures",
	}
	seen := map[string]bool{}
	for _, dispatcher := range []bool{false, true} {
		vars["dispatcher_enabled"] = dispatcher
		refs := dashboardMetrics(t, renderDashboard(t, vars))
		if len(refs) == 0 {
			t.Fatal("the dashboard references no metric")
		}
		for name := range checkRouterMetrics(t, refs, "prod-eu") {
			seen[name] = true
		}
	}
	// Every metric the router and the dispatcher publish has a place on the dashboard.
	for name := range metrics.CloudWatchDimensions {
		if !seen[name] {
			t.Errorf("router/metrics publishes %s but no dashboard widget shows it", name)
		}
	}
}

func TestAlarmsMatchRouterMetrics(t *testing.T) {
	refs := alarmMetrics(t)
	seen := checkRouterMetrics(t, refs, "")
	if !seen[metrics.CWHeartbeat] {
		t.Errorf("no alarm on %s: the router-silent alarm is missing or not parsed (found %d alarms)", metrics.CWHeartbeat, len(refs))
	}
	if len(refs) < 3 {
		t.Errorf("found %d alarms, want at least dead letters, intake backlog and router silent", len(refs))
	}
}
