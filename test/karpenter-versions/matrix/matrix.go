// Package matrix checks every body the router forwards to Karpenter against the interruption
// message parsers of one Karpenter version. Each version is a module of its own beside this
// one (v1_0, v1_10, v1_15), which requires that Karpenter release, imports only its
// pkg/controllers/interruption/messages packages and hands Check a Parse made of them: the
// main module can build against one Karpenter only. The bodies and what each version must read
// in them are ../testdata, written by the router's own test (router/signal,
// TestForwardedBodiesMatchTheMatrix -update), so the matrix checks what the router forwards
// today. This package imports nothing but the standard library.
package matrix

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// KarpenterModule is the module whose parsers a version module hands in.
const KarpenterModule = "github.com/aws/karpenter-provider-aws"

// Read is what a Karpenter version reads in one body, as its interruption controller does:
// Parsed is false when it has no parser for the body's (version, source, detail-type), which
// it deletes as a no-op; Err is a parser's error (Karpenter deletes that message too).
type Read struct {
	Parsed    bool
	Kind      string
	Instances []string
	Err       error
}

// Parse reads one body with a Karpenter version's parsers.
type Parse func(body []byte) Read

// body is one entry of testdata/manifest.json (router/signal's forwardedBody).
type body struct {
	File          string   `json:"file"`
	RouterKind    string   `json:"routerKind"`
	Via           string   `json:"via"`
	KarpenterKind string   `json:"karpenterKind"`
	Instances     []string `json:"instances"`
	ParsedSince   string   `json:"parsedSince"`
}

// Dir is the bodies' directory, from a version module's directory.
var Dir = filepath.Join("..", "testdata")

// Check reads every forwarded body with parse, the parsers of the Karpenter release this
// test binary is built with, and fails where it reads something else than the manifest says:
// the kind and exactly the one instance from the version the body is parsed since, no parser
// at all before it (or for a body no version parses).
func Check(t *testing.T, parse Parse) {
	t.Helper()
	version := karpenterVersion(t)
	raw, err := os.ReadFile(filepath.Join(Dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var bodies []body
	if err := json.Unmarshal(raw, &bodies); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(bodies) == 0 {
		t.Fatal("manifest.json lists no body")
	}
	for _, b := range bodies {
		t.Run(b.File, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(Dir, b.File))
			if err != nil {
				t.Fatal(err)
			}
			got := parse(data)
			want := b.ParsedSince != "" && !older(t, version, b.ParsedSince)
			t.Logf("karpenter %s | %s (%s, via %s) | %s", version, b.File, b.RouterKind, b.Via, got)
			switch {
			case got.Err != nil:
				t.Errorf("Karpenter %s refuses it (and deletes the message): %v", version, got.Err)
			case want && !got.Parsed:
				t.Errorf("Karpenter %s has no parser for it, want %s (parsed since %s)", version, b.KarpenterKind, b.ParsedSince)
			case !want && got.Parsed:
				t.Errorf("Karpenter %s reads %s, want no parser (parsed since %q): the router's KarpenterParsesSince is out of date", version, got.Kind, b.ParsedSince)
			case want && (got.Kind != b.KarpenterKind || !slices.Equal(got.Instances, b.Instances)):
				t.Errorf("Karpenter %s reads %s %v, want %s %v", version, got.Kind, got.Instances, b.KarpenterKind, b.Instances)
			}
		})
	}
}

// String is one cell of the matrix.
func (r Read) String() string {
	switch {
	case r.Err != nil:
		return "refused: " + r.Err.Error()
	case !r.Parsed:
		return "no parser (no-op, deleted)"
	}
	return fmt.Sprintf("%s %v", r.Kind, r.Instances)
}

// karpenterVersion is the version of KarpenterModule the version module requires, from its
// go.mod (a test binary's build info lists no dependencies).
func karpenterVersion(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(KarpenterModule) + `\s+(v\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatalf("go.mod does not require %s", KarpenterModule)
	}
	return string(m[1])
}

var versionPattern = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)`)

// older reports whether version a is older than b (both vMAJOR.MINOR.PATCH).
func older(t *testing.T, a, b string) bool {
	t.Helper()
	pa, pb := versionPattern.FindStringSubmatch(a), versionPattern.FindStringSubmatch(b)
	if pa == nil || pb == nil {
		t.Fatalf("versions %q and %q: want vMAJOR.MINOR.PATCH", a, b)
	}
	for i := 1; i <= 3; i++ {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if x != y {
			return x < y
		}
	}
	return false
}
