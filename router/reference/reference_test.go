package reference

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/policy"
)

// root is the module's root, from this package's directory.
var root = filepath.Join("..", "..")

// TestReferenceUpToDate fails when docs/reference.md differs from what the code's tables
// render: run `make docs` after changing an annotation, a written key, an Event, a flag or a
// metric.
func TestReferenceUpToDate(t *testing.T) {
	want, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, Path))
	if err != nil {
		t.Fatalf("%v: run make docs", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s is stale: run make docs", Path)
	}
}

// TestRender: what the reference is for is there — a sample of each table.
func TestRender(t *testing.T) {
	b, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		"| `healthrouter.io/action` |", "| `healthrouter.io/action.scheduled-change.<type>` |",
		"| `healthrecords.healthrouter.io` | custom resource (`HealthRecord`, cluster-scoped, one per NodeClaim, and one per Node Karpenter does not manage that the router drains) |", "| `HealthEventDrained` |",
		"### `health-router run`", "| `--queue-url` | `HEALTH_ROUTER_QUEUE_URL` |", "| `-o`, `--output` | `HEALTH_ROUTER_OUTPUT` or `HEALTH_ROUTER_O` | `table` |", "### `health-router version`",
		"| `--visibility-timeout` | `HEALTH_ROUTER_VISIBILITY_TIMEOUT` | `30s` |",
		"| `" + metrics.Decisions + "` | counter | `kind`, `action`, `nodepool` |",
		"| `" + metrics.EventLatency + "` | histogram |", "| `" + metrics.DeferredEvents + "` | gauge |",
		"| `Decisions` | Count | ClusterName, Kind, Action |",
		// handback was missing (issue 38, 15); the cluster commands take kubectl's flags (item 12).
		"### `health-router handback`", "| `--pending` | `HEALTH_ROUTER_PENDING` |", "| `--context` | `HEALTH_ROUTER_CONTEXT` |",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the reference lacks %q", want)
		}
	}
}

func TestMetrics(t *testing.T) {
	ms, err := Metrics()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Metric{}
	for _, m := range ms {
		if m.Help == "" || !strings.HasPrefix(m.Name, "health_router_") {
			t.Errorf("%+v: want a health_router_ name and help", m)
		}
		byName[m.Name] = m
		// health_router_<subsystem>_<name>: the name does not say the subsystem again
		// (health_router_decision_decisions_total, issue 38, 15).
		if parts := strings.Split(strings.TrimPrefix(m.Name, "health_router_"), "_"); len(parts) > 2 && strings.TrimSuffix(parts[1], "s") == strings.TrimSuffix(parts[0], "s") {
			t.Errorf("%s: the subsystem %q said twice", m.Name, parts[0])
		}
	}
	for name, want := range map[string]Metric{
		metrics.Decisions:          {Type: "counter", Labels: []string{"kind", "action", "nodepool"}},
		metrics.EventLatency:       {Type: "histogram"},
		metrics.DeferredEvents:     {Type: "gauge"},
		metrics.PollerInstances:    {Type: "gauge"},
		metrics.NotifyQueueLength:  {Type: "gauge"},
		metrics.WatchdogStuckEmpty: {Type: "gauge", Labels: []string{"nodepool"}},
		metrics.AlreadyRecorded:    {Type: "counter"},
	} {
		got, ok := byName[name]
		if !ok || got.Type != want.Type || !slices.Equal(got.Labels, want.Labels) {
			t.Errorf("%s: got %+v, want type %s labels %v", name, got, want.Type, want.Labels)
		}
	}
}

func TestCell(t *testing.T) {
	for in, want := range map[string]string{
		"a | b":                   `a \| b`,
		"Bearer <token>":          "Bearer &lt;token&gt;",
		"`<kind>` and <x>":        "`<kind>` and &lt;x&gt;",
		"`true` | `false`":        "`true` \\| `false`",
		"two\nlines":              "two lines",
		"`a|b` stays escaped too": "`a\\|b` stays escaped too",
	} {
		if got := cell(in); got != want {
			t.Errorf("cell(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"2m0s": "`2m`", "1h0m0s": "`1h`", "30s": "`30s`", "1h30m0s": "`1h30m`", "": "", "true": "`true`"} {
		if got := flagDefault(in); got != want {
			t.Errorf("flagDefault(%q) = %q, want %q", in, got, want)
		}
	}
}

// notKeys are healthrouter.io/ strings in the code that are neither annotations nor labels on
// an object, so neither table documents them.
var notKeys = map[string]string{
	"healthrouter.io/instance-id": "a field index of the cache (cluster.IndexInstanceID)",
	"healthrouter.io/nodepool":    "a field index of the cache (cluster.IndexNodePool)",
	"healthrouter.io/held-on":     "a field index of the cache (deferral.IndexHeldOn)",
}

// attribute matches the router's SQS message attributes (healthrouter.reason).
var attribute = regexp.MustCompile(`^healthrouter\.[a-z][a-z-]*$`)

// TestEveryKeyDocumented fails when the code declares a healthrouter.io/ key (or a
// healthrouter.* message attribute) that neither policy.NodePoolAnnotations (what the router
// reads on a NodePool) nor WrittenKeys (what it writes) documents.
func TestEveryKeyDocumented(t *testing.T) {
	documented := map[string]bool{}
	for _, k := range policy.Annotations() {
		documented[k] = true
	}
	for _, w := range WrittenKeys() {
		documented[w.Key] = true
	}
	n := 0
	for _, c := range scanConsts(t) {
		isKey := strings.HasPrefix(c.value, policy.Prefix) && !strings.HasSuffix(c.value, "/") && !strings.HasSuffix(c.value, ".")
		if !isKey && !(attribute.MatchString(c.value) && c.value != "healthrouter.io") {
			continue
		}
		n++
		if documented[c.value] || notKeys[c.value] != "" {
			continue
		}
		t.Errorf("%s (%s.%s) is not documented: add it to policy.NodePoolAnnotations if the router reads it on a NodePool, else to WrittenKeys (router/reference/tables.go); then run make docs", c.value, c.pkg, c.name)
	}
	if n < 10 {
		t.Fatalf("the scan found %d keys: it no longer sees the constants", n)
	}
}

// eventReason matches a Kubernetes Event reason: CamelCase.
var eventReason = regexp.MustCompile(`^[A-Z][a-zA-Z]+$`)

// TestEveryEventDocumented fails when the code declares an Event reason (a Reason... constant
// in CamelCase) that Events does not document.
func TestEveryEventDocumented(t *testing.T) {
	documented := map[string]bool{}
	for _, e := range Events() {
		if documented[e.Reason] || e.On == "" || e.Type == "" || e.Doc == "" {
			t.Errorf("%s: documented twice, or without on, type or doc", e.Reason)
		}
		documented[e.Reason] = true
	}
	n := 0
	for _, c := range scanConsts(t) {
		if !strings.HasPrefix(c.name, "Reason") || !eventReason.MatchString(c.value) {
			continue
		}
		n++
		if !documented[c.value] {
			t.Errorf("Event reason %s (%s.%s) is not documented: add it to Events (router/reference/tables.go), then run make docs", c.value, c.pkg, c.name)
		}
	}
	if n < len(documented) {
		t.Fatalf("the scan found %d Event reasons, the table documents %d: it no longer sees the constants", n, len(documented))
	}
}

// TestEveryRegistrarListed fails when a package registers Prometheus collectors and Metrics
// does not build them: add the package's constructor to registrars.
func TestEveryRegistrarListed(t *testing.T) {
	listed := map[string]bool{}
	for _, r := range registrars() {
		listed[r.pkg] = true
	}
	found := map[string]bool{}
	walkSource(t, func(pkg string, f *ast.File) {
		if pkg == "router/reference" {
			return
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); (ok && x.Name == "promauto") || sel.Sel.Name == "MustRegister" || sel.Sel.Name == "Register" {
				found[pkg] = true
			}
			return true
		})
	})
	for pkg := range found {
		if !listed[pkg] {
			t.Errorf("%s registers Prometheus collectors, but the reference does not build them: add its constructor to registrars (router/reference/metrics.go), then run make docs", pkg)
		}
	}
	for pkg := range listed {
		if !found[pkg] {
			t.Errorf("%s is in registrars but registers nothing", pkg)
		}
	}
}

// constant is a package-level string constant of the code.
type constant struct{ pkg, name, value string }

// scanConsts evaluates the package-level string constants of every non-test file under
// router/ and cmd/: literals, concatenations, and references to constants of the same or
// another package (by the package's name).
func scanConsts(t *testing.T) []constant {
	t.Helper()
	type key struct{ pkg, name string }
	exprs := map[key]ast.Expr{}
	byName := map[string]string{} // package name -> directory
	walkSource(t, func(pkg string, f *ast.File) {
		byName[f.Name.Name] = pkg
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						exprs[key{pkg, name.Name}] = vs.Values[i]
					}
				}
			}
		}
	})
	values := map[key]string{}
	var eval func(pkg string, e ast.Expr) (string, bool)
	eval = func(pkg string, e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.Ident:
			v, ok := values[key{pkg, e.Name}]
			return v, ok
		case *ast.SelectorExpr:
			x, ok := e.X.(*ast.Ident)
			if !ok || byName[x.Name] == "" {
				return "", false
			}
			v, ok := values[key{byName[x.Name], e.Sel.Name}]
			return v, ok
		case *ast.ParenExpr:
			return eval(pkg, e.X)
		case *ast.CallExpr: // a conversion: Reason("malformed")
			if len(e.Args) == 1 {
				return eval(pkg, e.Args[0])
			}
		case *ast.BinaryExpr:
			if e.Op == token.ADD {
				x, okx := eval(pkg, e.X)
				y, oky := eval(pkg, e.Y)
				return x + y, okx && oky
			}
		}
		return "", false
	}
	for changed := true; changed; {
		changed = false
		for k, e := range exprs {
			if _, done := values[k]; done {
				continue
			}
			if v, ok := eval(k.pkg, e); ok {
				values[k], changed = v, true
			}
		}
	}
	var out []constant
	for k, v := range values {
		out = append(out, constant{k.pkg, k.name, v})
	}
	slices.SortFunc(out, func(a, b constant) int { return strings.Compare(a.pkg+"."+a.name, b.pkg+"."+b.name) })
	return out
}

// walkSource parses every non-test Go file under router/ and cmd/ and calls fn with its
// directory relative to the module root (router/policy) and the file.
func walkSource(t *testing.T, fn func(pkg string, f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	for _, top := range []string{"router", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			fn(filepath.ToSlash(rel), f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
