package signal

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/health-router/health-router/router/event"
)

var update = flag.Bool("update", false, "rewrite the forwarded bodies of test/karpenter-versions/testdata from this run")

// forwardedDir is where the Karpenter version matrix (test/karpenter-versions: one module per
// Karpenter version, each importing only that version's interruption message parsers) reads
// every body the router forwards.
var forwardedDir = filepath.Join("..", "..", "test", "karpenter-versions", "testdata")

// forwardedBody is one entry of the matrix's manifest: a body the router forwards and what
// every Karpenter version must read in it.
type forwardedBody struct {
	File string `json:"file"`
	// RouterKind is the router's kind of the event; Via is how a drain of it is signalled
	// (forward mode, Karpenter of the newest version).
	RouterKind event.Kind `json:"routerKind"`
	Via        Mode       `json:"via"`
	// KarpenterKind is the kind Karpenter's message parser reads, and Instances the instance
	// IDs, from ParsedSince on; an older Karpenter has no parser for it (a no-op it deletes).
	// A body with no ParsedSince is parsed by no version.
	KarpenterKind string   `json:"karpenterKind,omitempty"`
	Instances     []string `json:"instances"`
	ParsedSince   string   `json:"parsedSince,omitempty"`
}

// karpenterKinds are the message kinds of Karpenter's parsers, by the router's kind (a state
// change is read as stopped or terminated by its state).
var karpenterKinds = map[event.Kind]string{
	event.KindSpotInterruption: "spot_interrupted", event.KindScheduledChange: "scheduled_change",
	event.KindRebalance: "rebalance_recommendation", event.KindCapacityReservation: "capacity_reservation_interrupted",
}

func karpenterKind(ev event.Event) string {
	if ev.Kind == event.KindStateChange {
		if ev.State == event.StateStopping || ev.State == event.StateStopped {
			return "instance_stopped"
		}
		return "instance_terminated"
	}
	return karpenterKinds[ev.Kind]
}

// TestForwardedBodiesMatchTheMatrix keeps the version matrix's bodies what the router forwards
// today: every input of testdata/canonical (each kind, each shape the parser tolerates), split
// per instance as the signaller splits a multi-instance event, and the manifest saying what
// each Karpenter version must read in it. -update rewrites them.
func TestForwardedBodiesMatchTheMatrix(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "canonical", "*.json"))
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	newest := &Signaller{mode: ModeForward}
	var manifest []forwardedBody
	want := map[string][]byte{}
	for _, in := range inputs {
		raw, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := event.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if ev.Kind == event.KindCapacityBlockExpiration {
			// It names its reservation: the pipeline finds the NodeClaims that carry it. The
			// body is kept in a deferral record only; no Karpenter version parses it.
			ev.Instances = []string{"i-0a1b2c3d4e5f60061"}
		}
		for _, id := range ev.Instances {
			body, err := Canonical(ev, id)
			if err != nil {
				t.Fatalf("%s %s: %v", in, id, err)
			}
			name := strings.TrimSuffix(filepath.Base(in), ".json")
			if len(ev.Instances) > 1 {
				name += "-" + id
			}
			name += ".json"
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, body, "", "  "); err != nil {
				t.Fatal(err)
			}
			want[name] = append(pretty.Bytes(), '\n')
			entry := forwardedBody{File: name, RouterKind: ev.Kind, Via: newest.Via(ev), Instances: []string{id}}
			if since, ok := KarpenterParsesSince(ev); ok {
				entry.KarpenterKind, entry.ParsedSince = karpenterKind(ev), since.String()
				// The newest version this module builds against must agree.
				md, msg := karpenterParse(t, body)
				if string(msg.Kind()) != entry.KarpenterKind || md.ID != ev.ID {
					t.Errorf("%s: Karpenter (go.mod's version) reads %s %s, the manifest says %s %s", name, msg.Kind(), md.ID, entry.KarpenterKind, ev.ID)
				}
			}
			manifest = append(manifest, entry)
		}
	}
	m, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want["manifest.json"] = append(m, '\n')

	if *update {
		old, _ := filepath.Glob(filepath.Join(forwardedDir, "*.json"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(forwardedDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range want {
			if err := os.WriteFile(filepath.Join(forwardedDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	have, err := filepath.Glob(filepath.Join(forwardedDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range have {
		if _, ok := want[filepath.Base(f)]; !ok {
			t.Errorf("%s is no longer a forwarded body: run go test ./router/signal -run %s -update", f, t.Name())
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		got, err := os.ReadFile(filepath.Join(forwardedDir, name))
		if err != nil || !bytes.Equal(got, want[name]) {
			t.Errorf("%s differs from what the router forwards (%v): run go test ./router/signal -run %s -update", name, err, t.Name())
		}
	}
}

func TestParseKarpenterVersion(t *testing.T) {
	tests := []struct {
		in   string
		want KarpenterVersion
		err  bool
	}{
		{"", KarpenterVersion{}, false},
		{"v1.9.3", KarpenterVersion{1, 9, 3}, false},
		{"1.10", KarpenterVersion{1, 10, 0}, false},
		{"1.15.1-rc.1", KarpenterVersion{1, 15, 1}, false},
		{"v0.37.0", KarpenterVersion{}, true}, // before the v1 API the router reads
		{"latest", KarpenterVersion{}, true},
		{"v1", KarpenterVersion{}, true},
	}
	for _, tt := range tests {
		got, err := ParseKarpenterVersion(tt.in)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("ParseKarpenterVersion(%q) = %v, %v; want %v, error %t", tt.in, got, err, tt.want, tt.err)
		}
	}
}
