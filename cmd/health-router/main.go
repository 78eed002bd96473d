// Command health-router decides, per Karpenter NodePool, what to do with AWS events about
// EC2 instances: drain now, defer to a maintenance window, or ignore.
//
//	health-router run --queue-url URL --dead-letter-queue-url URL [--karpenter-queue-url URL] ...
//	health-router replay --cluster CLUSTER.yaml --events PATH [--aws AWS.yaml] [--now RFC3339] [-o table|json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
	_ "time/tzdata" // window schedules name zones (CRON_TZ=...); do not depend on the image's tzdata

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/replay"
)

const usage = `usage: health-router <command> [flags]

commands:
  run      consume the intake queue, decide, and signal Karpenter (in the cluster)
  doctor   check a live setup (queues, rules, Karpenter's own handling, RBAC, feature gates)
  replay   decide recorded events against a cluster snapshot (no AWS, no cluster needed)

Run "health-router <command> -h" for a command's flags. Every flag has an environment
fallback: --queue-url is also HEALTH_ROUTER_QUEUE_URL.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "health-router:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
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
		return runDoctor(ctx, o, stdout)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}
