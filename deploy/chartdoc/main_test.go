package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// chartDir is the health-router chart, from this package's directory.
var chartDir = filepath.Join("..", "charts", "health-router")

// TestREADMEUpToDate fails when the chart's values table differs from values.yaml: run
// `make chart-docs` after changing a value or its comment.
func TestREADMEUpToDate(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Render(readme, values)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(readme) {
		t.Errorf("%s/README.md is stale: run make chart-docs", chartDir)
	}
	// Every setting of the chart is in the table (a row is not silently dropped).
	for _, key := range []string{"settings.queueURL", "settings.featureGates.reservedCapacity", "serviceAccount.annotations", "affinity", "image.digest"} {
		if !strings.Contains(string(readme), "| "+key+" |") {
			t.Errorf("README.md has no row for %s", key)
		}
	}
}

func TestRows(t *testing.T) {
	for _, tt := range []struct {
		name   string
		values string
		want   []Row
		err    string
	}{
		{
			name: "documented keys, nested and hinted",
			values: `# file header

# -- the name
name: ""
image:
  # -- where from,
  # on two lines
  repository: example/x
  # -- (int) how many
  count: null
# -- a map kept whole
affinity:
  a: [1]
`,
			want: []Row{
				{"name", "string", `""`, "the name"},
				{"image.repository", "string", `"example/x"`, "where from, on two lines"},
				{"image.count", "int", "null", "how many"},
				{"affinity", "object", `{"a":[1]}`, "a map kept whole"},
			},
		},
		{name: "undocumented scalar", values: "# -- ok\na: 1\nb: true\n", err: "b has no `# --` comment"},
		{name: "undocumented in a map", values: "s:\n  # plain comment\n  x: 1\n", err: "s.x has no `# --` comment"},
	} {
		got, err := Rows([]byte(tt.values))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("%s: rows %+v, want %+v", tt.name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: row %d = %+v, want %+v", tt.name, i, got[i], tt.want[i])
			}
		}
	}
}
