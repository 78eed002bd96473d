package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/replay"
	"github.com/health-router/health-router/router/version"
)

// newRoot builds the command tree. name is the program's name as the user typed it
// ("kubectl health-router" through the plugin binary). The flags of each command are
// options' own (router/options), so parsing, environment fallbacks and validation stay there.
func newRoot(name string, e env, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "health-router",
		Short: "Route AWS events about EC2 instances by Karpenter NodePool",
		Long: `health-router decides, per Karpenter NodePool, what to do with AWS events about EC2
instances: drain now, defer to a maintenance window, or ignore.

Every flag has an environment fallback: --queue-url is also HEALTH_ROUTER_QUEUE_URL; a flag
on the command line wins.`,
		Example: `  # What the router would decide on the demo scenario: no AWS account, no cluster
  health-router replay --cluster test/demo/cluster.yaml --events test/demo/events --aws test/demo/aws.yaml

  # What the router is doing, per NodePool
  kubectl health-router status`,
		Version: version.Get().Version,
		Args:    cobra.ArbitraryArgs, // told apart in RunE: an unknown command is a usage error
		// A typo two edits away is suggested ("stauts": status); cobra's default, which
		// SuggestionsFor does not apply itself.
		SuggestionsMinimumDistance: 2,
		SilenceErrors:              true,
		SilenceUsage:               true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
			}
			return usageError{fmt.Errorf("%s", msg)}
		},
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: name},
	}
	// --version has no -v: in kubectl, whose plugin this is, -v is the log verbosity.
	root.Flags().Bool("version", false, "print the version")
	root.SetHelpCommand(helpCommand())
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetHelpFunc(writeHelp)
	root.SetUsageFunc(func(cmd *cobra.Command) error { return writeUsage(cmd.OutOrStderr(), cmd) })
	root.SetVersionTemplate("{{.DisplayName}} {{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{options.FlagError(cmd.Flags(), err)}
	})
	// `completion bash|zsh|fish|powershell` works, unlisted: the list is for the router's work.
	root.CompletionOptions.HiddenDefaultCmd = true
	root.AddCommand(runCommand(e, stderr), doctorCommand(e, stdout, stderr), replayCommand(e, stdout, stderr), statusCommand(e, stdout, stderr), handbackCommand(e, stdout, stderr), versionCommand(e, stdout))
	return root
}

// helpCommand is `help [command]`: the help of a command, the root's without one; a topic
// that is no command is a mistake, with a suggestion (cobra's own printed the root's help and
// exited 0).
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			cmd, rest, err := root.Find(args)
			if err == nil && len(rest) == 0 {
				cmd.InitDefaultHelpFlag() // as --help shows it: cobra adds it when a command runs
				return cmd.Help()
			}
			topic := strings.Join(args, " ")
			if len(rest) > 0 {
				topic = rest[0]
			}
			msg := fmt.Sprintf("unknown help topic %q", topic)
			if s := root.SuggestionsFor(topic); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
			}
			return usageError{fmt.Errorf("%s", msg)}
		},
	}
}

// commandOrder is the order help lists the commands in: the router, then the tools around it.
var commandOrder = []string{"run", "doctor", "replay", "status", "handback", "version"}

// command makes a command whose flags are p's: the command line is parsed by cobra into
// them, then p completes the options (environment fallbacks, validation) and run runs.
func command[T any](p *options.Parser[T], getenv func(string) string, c *cobra.Command, run func(*cobra.Command, T) error) *cobra.Command {
	c.Flags().SortFlags = false // as defined: required flags first
	c.Flags().AddFlagSet(p.Flags)
	c.Args = noArgs
	c.RunE = func(cmd *cobra.Command, _ []string) error {
		o, err := p.Complete(getenv)
		if err != nil {
			return usageError{err}
		}
		return run(cmd, o)
	}
	return c
}

// noArgs refuses positional arguments: every command takes flags only.
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q: this command takes flags only", args[0])}
	}
	return nil
}

func runCommand(e env, stderr io.Writer) *cobra.Command {
	return command(options.NewRun(), e.getenv, &cobra.Command{
		Use:   "run --queue-url URL --dead-letter-queue-url URL",
		Short: "Consume the intake queue, decide, and signal Karpenter (in the cluster)",
		Long: `Run the router: consume the SQS intake queue the EventBridge rules feed, decide per NodePool
what to do with each event (drain now, defer to a window, ignore), and signal Karpenter.
Deploy it with the Helm chart (deploy/charts/health-router), which sets every flag from its
values as HEALTH_ROUTER_* variables. Logs are JSON on stderr.`,
		Example: `  # In the cluster, as the chart runs it
  health-router run \
    --queue-url https://sqs.eu-west-1.amazonaws.com/111122223333/health-router-intake \
    --dead-letter-queue-url https://sqs.eu-west-1.amazonaws.com/111122223333/health-router-dlq

  # Forward drains to Karpenter's interruption queue instead of deleting NodeClaims
  health-router run --queue-url "$INTAKE_URL" --dead-letter-queue-url "$DLQ_URL" \
    --karpenter-queue-url "$KARPENTER_QUEUE_URL"

  # On a laptop, against local stand-ins and one replica
  health-router run --queue-url "$INTAKE_URL" --dead-letter-queue-url "$DLQ_URL" \
    --aws-endpoint-url http://127.0.0.1:5000 --kubeconfig ~/.kube/config --leader-elect=false`,
	}, func(cmd *cobra.Command, o options.Run) error { return runRouter(cmd.Context(), o, stderr) })
}

func doctorCommand(e env, stdout, stderr io.Writer) *cobra.Command {
	return command(options.NewDoctor(), e.getenv, &cobra.Command{
		Use:   "doctor --queue-url URL --dead-letter-queue-url URL",
		Short: "Check a live setup: queues, rules, Karpenter's own handling, RBAC, feature gates",
		Long: `Check a live setup with the router's own credentials and print a checklist with fixes: the
queues, the EventBridge rules, whether Karpenter still acts behind the router's back, the
router's RBAC and feature gates. Exits 1 when a check fails.`,
		Example: `  health-router doctor --namespace health-router \
    --queue-url https://sqs.eu-west-1.amazonaws.com/111122223333/health-router-intake \
    --dead-letter-queue-url https://sqs.eu-west-1.amazonaws.com/111122223333/health-router-dlq

  # Also check that Karpenter's role cannot poll instance status itself
  health-router doctor --queue-url "$INTAKE_URL" --dead-letter-queue-url "$DLQ_URL" \
    --karpenter-role-arn arn:aws:iam::111122223333:role/KarpenterController`,
	}, func(cmd *cobra.Command, o options.Doctor) error { return runDoctor(cmd.Context(), o, stdout, stderr) })
}

func replayCommand(e env, stdout, stderr io.Writer) *cobra.Command {
	return command(options.NewReplay(e.now), e.getenv, &cobra.Command{
		Use:   "replay --cluster CLUSTER.yaml --events PATH",
		Short: "Decide recorded events against a cluster snapshot (no AWS, no cluster needed)",
		Long: `Decide recorded events against a snapshot of the cluster, as the router would, and print one
line per event and instance: the what-if tool, and the demo. No AWS account, no cluster.`,
		Example: `  # The demo scenario (test/demo)
  health-router replay --cluster test/demo/cluster.yaml --events test/demo/events \
    --aws test/demo/aws.yaml --now 2026-11-21T12:00:00Z

  # Your cluster, your events, as JSON
  kubectl get nodes,nodeclaims,nodepools,ec2nodeclasses -o yaml > cluster.yaml
  health-router replay --cluster cluster.yaml --events events/ -o json`,
	}, func(cmd *cobra.Command, o replay.Options) error { return replay.Run(cmd.Context(), o, stdout, stderr) })
}

func statusCommand(e env, stdout, stderr io.Writer) *cobra.Command {
	return command(options.NewStatus(e.now), e.getenv, &cobra.Command{
		Use:   "status",
		Short: "Show per NodePool: policy, window, deferred events, drains in flight, check holds",
		Long: `Show what the router is doing, per NodePool: its policy as the router reads it, its window,
the drains in flight against its pacing limit, and the deferred events with what holds them.
Read from the cluster (no AWS call).`,
		Example: `  kubectl health-router status
  health-router status --nodepool kafka -o json

  # The planned maintenance of the next 14 days, for a calendar
  health-router status --ics > maintenance.ics`,
	}, func(cmd *cobra.Command, o options.Status) error { return runStatus(cmd.Context(), o, stdout, stderr) })
}

func handbackCommand(e env, stdout, stderr io.Writer) *cobra.Command {
	return command(options.NewHandback(), e.getenv, &cobra.Command{
		Use:   "handback --pending drain|drop",
		Short: "Give the handling of AWS events back to Karpenter: end every piece of the router's state",
		Long: `Give the handling of AWS events back to Karpenter (the rollback of docs/runbook.md). With the
router stopped, end every piece of state it keeps in the cluster, with a report of each: the
events still pending (deferred, held, a reboot in place in progress) are drained now or
dropped; the records on NodeClaims, the node marks, the drains of unmanaged nodes and the
shadow ledger go. Refuses while the router's leader Lease is held. Then restore Karpenter's
EventBridge rules and its ec2:DescribeInstanceStatus (Terraform: takeover = false).`,
		Example: `  # What it would do
  health-router handback --pending drain --dry-run

  # Drain what is pending through Karpenter's queue, as the router would have
  helm -n health-router uninstall health-router
  health-router handback --pending drain --karpenter-queue-url "$KARPENTER_QUEUE_URL"`,
	}, func(cmd *cobra.Command, o options.Handback) error {
		return runHandback(cmd.Context(), o, stdout, stderr)
	})
}

func versionCommand(e env, stdout io.Writer) *cobra.Command {
	return command(options.NewVersion(), e.getenv, &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit, and the Go and Karpenter API versions built with",
		Example: `  health-router version
  health-router version -o json`,
	}, func(_ *cobra.Command, o options.Version) error {
		if o.Output == "json" {
			return version.Get().WriteJSON(stdout)
		}
		return version.Get().WriteText(stdout)
	})
}
