// Command health-router decides, per Karpenter NodePool, what to do with AWS events about
// EC2 instances: drain now, defer to a maintenance window, or ignore.
//
//	health-router run --queue-url URL --dead-letter-queue-url URL [--karpenter-queue-url URL] ...
//	health-router doctor --queue-url URL --dead-letter-queue-url URL ...
//	health-router replay --cluster CLUSTER.yaml --events PATH [--aws AWS.yaml] [--now RFC3339] [-o table|json]
//	health-router status [--nodepool NAME] [-o table|json | --ics]
//	health-router version [-o json]
//
// `health-router <command> --help` prints a command's flags and examples. Installed as
// kubectl-health_router (a copy or a symlink), it is a kubectl plugin: kubectl health-router
// status.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // window schedules name zones (CRON_TZ=...); do not depend on the image's tzdata
)

// pluginBinary is the name kubectl looks for to run "kubectl health-router".
const pluginBinary = "kubectl-health_router"

// Exit codes: a mistake on the command line (a flag, a value, a command) is 2, as for the
// shell's builtins and Go's flag package; a command that ran and failed is 1.
const (
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, programName(os.Args[0]), os.Args[1:], env{getenv: os.Getenv, now: time.Now().UTC()}, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env is what a command reads from the process besides its arguments.
type env struct {
	getenv func(string) string
	now    time.Time
}

// programName is how the user called us: "kubectl health-router" through the plugin binary.
func programName(arg0 string) string {
	if strings.TrimSuffix(filepath.Base(arg0), ".exe") == pluginBinary {
		return "kubectl health-router"
	}
	return "health-router"
}

// usageError is a mistake on the command line: it is told in one line, with where to find
// the command's help.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// execute runs the command args name, and returns the process's exit code. Help goes to
// stdout; a mistake is one line on stderr and the way to the help.
func execute(ctx context.Context, name string, args []string, e env, stdout, stderr io.Writer) int {
	root := newRoot(name, e, stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	if cmd == nil {
		cmd = root
	}
	if errors.As(err, new(usageError)) {
		help := cmd
		if cmd.Name() == "help" && cmd.HasParent() {
			help = cmd.Parent() // the help of `help` is not where the topics are
		}
		fmt.Fprintf(stderr, "%s: %v\nSee '%s --help'.\n", cmd.CommandPath(), err, help.CommandPath())
		return exitUsage
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	return exitFailed
}
