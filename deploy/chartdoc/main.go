// Command chartdoc writes the values table of a Helm chart's README.md from the `# --` comments
// of its values.yaml, as helm-docs does: one row per documented key (key, type, default,
// description), between the README's `<!-- values:start -->` and `<!-- values:end -->` markers.
// A value without a `# --` comment is an error, so that every value is documented.
//
//	go run ./deploy/chartdoc deploy/charts/health-router           # rewrite README.md
//	go run ./deploy/chartdoc -check deploy/charts/health-router    # fail if README.md is stale
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

const (
	startMarker = "<!-- values:start -->"
	endMarker   = "<!-- values:end -->"
)

func main() {
	check := flag.Bool("check", false, "do not write: fail if README.md differs from what would be written")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chartdoc [-check] CHART_DIR")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *check); err != nil {
		fmt.Fprintln(os.Stderr, "chartdoc:", err)
		os.Exit(1)
	}
}

func run(chart string, check bool) error {
	readme := filepath.Join(chart, "README.md")
	current, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		return err
	}
	want, err := Render(current, values)
	if err != nil {
		return err
	}
	if bytes.Equal(current, want) {
		return nil
	}
	if check {
		return fmt.Errorf("%s is stale: run make chart-docs", readme)
	}
	return os.WriteFile(readme, want, 0o644)
}

// Render returns readme with the values table between its markers replaced by the one values
// documents.
func Render(readme, values []byte) ([]byte, error) {
	before, rest, ok := bytes.Cut(readme, []byte(startMarker))
	if !ok {
		return nil, fmt.Errorf("README has no %s marker", startMarker)
	}
	_, after, ok := bytes.Cut(rest, []byte(endMarker))
	if !ok {
		return nil, fmt.Errorf("README has no %s marker", endMarker)
	}
	rows, err := Rows(values)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Write(before)
	b.WriteString(startMarker + "\n")
	b.WriteString("| Key | Type | Default | Description |\n|-----|------|---------|-------------|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.Key, r.Type, cell("`"+r.Default+"`"), cell(r.Description))
	}
	b.WriteString(endMarker)
	b.Write(after)
	return b.Bytes(), nil
}

// cell escapes what would end a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// Row is one documented value.
type Row struct {
	Key, Type, Default, Description string
}

// typeHint is helm-docs' `# -- (int) description`: the type of a value whose default (null)
// does not show it.
var typeHint = regexp.MustCompile(`^\(([a-z]+)\)\s*`)

// Rows returns a row per documented key of values, in file order. A key with a `# --` comment
// is a row (a documented map is not descended into); an undocumented map is descended into; an
// undocumented scalar or list is an error.
func Rows(values []byte) ([]Row, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("values.yaml: want a mapping")
	}
	var rows []Row
	var errs []error
	var walk func(prefix string, m *yaml.Node)
	walk = func(prefix string, m *yaml.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := prefix + k.Value
			desc, documented := description(k.HeadComment)
			if !documented {
				if v.Kind == yaml.MappingNode && len(v.Content) > 0 {
					walk(key+".", v)
					continue
				}
				errs = append(errs, fmt.Errorf("values.yaml line %d: %s has no `# --` comment", k.Line, key))
				continue
			}
			typ, def, err := typeAndDefault(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("values.yaml line %d: %s: %w", k.Line, key, err))
				continue
			}
			if m := typeHint.FindStringSubmatch(desc); m != nil {
				typ, desc = m[1], desc[len(m[0]):]
			}
			rows = append(rows, Row{Key: key, Type: typ, Default: def, Description: desc})
		}
	}
	walk("", doc.Content[0])
	return rows, errors.Join(errs...)
}

// description returns the text of the last `# --` comment in a head comment, with its
// continuation lines (`# more text`) joined.
func description(head string) (string, bool) {
	lines := strings.Split(head, "\n")
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "# --") {
			start = i
		}
	}
	if start < 0 {
		return "", false
	}
	var parts []string
	for i, l := range lines[start:] {
		l = strings.TrimSpace(l)
		if i == 0 {
			l = strings.TrimPrefix(l, "# --")
		} else if !strings.HasPrefix(l, "#") {
			break
		} else {
			l = strings.TrimPrefix(l, "#")
		}
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " "), true
}

// typeAndDefault is a value's helm-docs type and its default as compact JSON.
func typeAndDefault(v *yaml.Node) (string, string, error) {
	var x any
	if err := v.Decode(&x); err != nil {
		return "", "", err
	}
	typ := "string"
	switch x.(type) {
	case map[string]any:
		typ = "object"
	case []any:
		typ = "list"
	case bool:
		typ = "bool"
	case int:
		typ = "int"
	case float64:
		typ = "float"
	}
	b, err := json.Marshal(x)
	if err != nil {
		return "", "", err
	}
	return typ, string(b), nil
}
