// Command health-router decides, per Karpenter NodePool, what to do with AWS events about
// EC2 instances: drain now, defer to a maintenance window, or ignore.
//
//	health-router run --queue-url URL --dead-letter-queue-url URL [--karpenter-queue-url URL] ...
//	health-router replay --cluster CLUSTER.yaml --events PATH [--aws AWS.yaml] [--now RFC3339] [-o table|json]
//	health-router status [--nodepool NAME] [-o table|json | --ics]
//
// Installed as kubectl-health_router (a copy or a symlink), it is a kubectl plugin:
// kubectl health-router status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // window schedules name zones (CRON_TZ=...); do not depend on the image's tzdata

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/replay"
)

const usage = `usage: %[1]s <command> [flags]

commands:
  run      consume the intake queue, decide, and signal Karpenter (in the cluster)
  doctor   check a live setup (queues, rules, Karpenter's own handling, RBAC, feature gates)
  replay   decide recorded events against a cluster snapshot (no AWS, no cluster needed)
  status   per NodePool: policy, window, deferred events, drains in flight, check holds

Run "%[1]s <command> -h" for a command's flags. Every flag has an environment
fallback: --queue-url is also HEALTH_ROUTER_QUEUE_URL.
`

// pluginBinary is the name kubectl looks for to run "kubectl health-router".
const pluginBinary = "kubectl-health_router"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, programName(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "health-router:", err)
		os.Exit(2)
	}
}

// programName is how the user called us: "kubectl health-router" through the plugin binary.
func programName(arg0 string) string {
	if strings.TrimSuffix(filepath.Base(arg0), ".exe") == pluginBinary {
		return "kubectl health-router"
	}
	return "health-router"
}

func run(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintf(stderr, usage, name)
		return errors.New("no command")
	}
	switch args[0] {
	case "replay":
		o, err := options.ParseReplay(args[1:], os.Getenv, time.Now().UTC())
		if err != nil {
			return err
		}
		return replay.Run(ctx, o, stdout, stderr)
	case "run":
		o, err := options.ParseRun(args[1:], os.Getenv)
		if err != nil {
			return err
		}
		return runRouter(ctx, o, stderr)
	case "doctor":
		o, err := options.ParseDoctor(args[1:], os.Getenv)
		if err != nil {
			return err
		}
		return runDoctor(ctx, o, stdout, stderr)
	case "status":
		o, err := options.ParseStatus(args[1:], os.Getenv, time.Now().UTC())
		if err != nil {
			return err
		}
		return runStatus(ctx, o, stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintf(stdout, usage, name)
		return nil
	}
	fmt.Fprintf(stderr, usage, name)
	return fmt.Errorf("unknown command %q", args[0])
}
