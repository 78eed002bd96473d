package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTemplateUpToDate fails when router/policy's annotations changed and the chart's
// admission policy was not regenerated.
func TestTemplateUpToDate(t *testing.T) {
	if err := run(filepath.Join("..", "charts", "health-router"), true); err != nil {
		t.Fatal(err)
	}
}

// TestEveryKeyHasARule: the generator refuses a key of the router's table it has no rule for,
// and the template validates every key (a dropped rule would admit anything for its key).
func TestEveryKeyHasARule(t *testing.T) {
	if _, err := grammars(); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join("..", "charts", "health-router", templateFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("empty template")
	}
}
