package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestNodePoolAnnotationsAreRead: every key the table documents is one FromAnnotations reads
// (a documented key that the parser calls unknown would be a lie in the reference).
func TestNodePoolAnnotationsAreRead(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range NodePoolAnnotations() {
		if d.Values == "" || d.Default == "" || d.Doc == "" {
			t.Errorf("%s: want values, default and doc: %+v", d.Key, d)
		}
		for _, key := range d.Keys() {
			if seen[key] {
				t.Errorf("%s is documented twice", key)
			}
			seen[key] = true
			p := FromAnnotations(map[string]string{key: "\x00not-a-value"})
			for _, problem := range p.Problems {
				if strings.Contains(problem, "unknown annotation") {
					t.Errorf("%s is documented but FromAnnotations does not read it: %s", key, problem)
				}
			}
		}
	}
	if !seen[ActionKey("instance-status")] || !seen[ScheduledActionKey("instance-reboot")] {
		t.Errorf("the per-kind and per-type families are not expanded: %v", Annotations())
	}
}

// TestEveryAnnotationDocumented fails when this package's code names a NodePool annotation
// (a constant or an expression Prefix + "name", or a "healthrouter.io/..." literal) that
// NodePoolAnnotations does not document: add its entry there, then run make docs.
func TestEveryAnnotationDocumented(t *testing.T) {
	documented := map[string]bool{}
	for _, k := range Annotations() {
		documented[k] = true
	}
	found := annotationKeysInSource(t)
	if len(found) < 10 {
		t.Fatalf("the scan of this package's source found only %v: it no longer sees the constants", found)
	}
	for _, key := range found {
		if !documented[key] {
			t.Errorf("%s is read by the router but not documented: add it to NodePoolAnnotations (router/policy/annotations.go), then run make docs", key)
		}
	}
}

// annotationKeysInSource evaluates the string constants of this package's non-test files and
// returns every value under Prefix they hold or build, besides Prefix itself.
func annotationKeysInSource(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	// Package-level string constants, evaluated until nothing changes (a constant may use
	// one declared later or in another file).
	consts := map[string]ast.Expr{}
	for _, af := range parsed {
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						consts[name.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	values := map[string]string{}
	var eval func(ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.Ident:
			v, ok := values[e.Name]
			return v, ok
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", false
			}
			x, okx := eval(e.X)
			y, oky := eval(e.Y)
			return x + y, okx && oky
		}
		return "", false
	}
	for changed := true; changed; {
		changed = false
		for name, e := range consts {
			if _, done := values[name]; done {
				continue
			}
			if v, ok := eval(e); ok {
				values[name], changed = v, true
			}
		}
	}
	var keys []string
	// A value ending in "." is the stem of a family (ActionKey builds on it), not a key.
	add := func(v string) {
		if strings.HasPrefix(v, Prefix) && v != Prefix && !strings.HasSuffix(v, ".") && !slices.Contains(keys, v) {
			keys = append(keys, v)
		}
	}
	for _, v := range values {
		add(v)
	}
	// Keys spelled out in code rather than declared: "healthrouter.io/x", Prefix + "x".
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				if v, ok := eval(n); ok {
					add(v)
				}
			case *ast.BinaryExpr:
				if v, ok := eval(n); ok {
					add(v)
				}
			}
			return true
		})
	}
	slices.Sort(keys)
	return keys
}
