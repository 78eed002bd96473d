package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunReplayDemo(t *testing.T) {
	var out, errw bytes.Buffer
	err := run(context.Background(), "health-router", []string{"replay", "--cluster", "../../test/demo/cluster.yaml", "--events", "../../test/demo/events",
		"--aws", "../../test/demo/aws.yaml", "--now", "2026-11-21T12:00:00Z"}, &out, &errw)
	if err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	for _, want := range []string{"ACTION", "drain", "defer", "ignore", "skip", "dead-letter", "2026-11-28 02:00"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}

func TestRunErrors(t *testing.T) {
	for args, want := range map[string]string{
		"":                  "no command",
		"frobnicate":        "unknown command",
		"replay --events x": "--cluster",
	} {
		var a []string
		if args != "" {
			a = strings.Fields(args)
		}
		err := run(context.Background(), "health-router", a, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", args, err, want)
		}
	}
}

func TestProgramName(t *testing.T) {
	for arg0, want := range map[string]string{
		"/usr/local/bin/kubectl-health_router": "kubectl health-router",
		"kubectl-health_router.exe":            "kubectl health-router",
		"/usr/local/bin/health-router":         "health-router",
		"./bin/health-router":                  "health-router",
	} {
		if got := programName(arg0); got != want {
			t.Errorf("programName(%q) = %q, want %q", arg0, got, want)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), "kubectl health-router", []string{"help"}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "usage: kubectl health-router <command>") || !strings.Contains(out.String(), "status ") {
		t.Errorf("usage:\n%s", out.String())
	}
}
