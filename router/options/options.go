// Package options parses the command line of each health-router command. Every flag has an
// environment fallback (--queue-url / HEALTH_ROUTER_QUEUE_URL); a flag on the command line
// wins. Parsing validates and fails fast with a message that names the flag.
package options

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/replay"
)

// EnvPrefix prefixes the environment fallback of every flag.
const EnvPrefix = "HEALTH_ROUTER_"

// EnvName returns the environment variable of a flag: --queue-url -> HEALTH_ROUTER_QUEUE_URL.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args, then fills every flag not given from its environment variable.
func parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v := getenv(EnvName(f.Name)); v != "" {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q (for --%s): %v", EnvName(f.Name), v, f.Name, e)
			}
		}
	})
	return err
}

// ParseReplay parses `health-router replay` flags.
func ParseReplay(args []string, getenv func(string) string, now time.Time) (replay.Options, error) {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	gates := checks.NewFeatureGates()
	o := replay.Options{Gates: gates}
	fs.StringVar(&o.ClusterFile, "cluster", "", "cluster snapshot: `kubectl get nodes,nodeclaims,nodepools,ec2nodeclasses -o yaml` output, or multi-document YAML (required)")
	fs.StringVar(&o.EventsPath, "events", "", "events: a JSON file, a JSON-lines file (.jsonl), or a directory of them (required)")
	fs.StringVar(&o.AWSFile, "aws", "", "YAML of what EC2 answers the pre-signal checks (images, capacity reservations); without it no check runs")
	nowFlag := fs.String("now", "", "the time to decide at, RFC 3339 (default: the current time)")
	gateFlag := fs.String("feature-gates", "", "feature gates, as Karpenter's: ReservedCapacity=true|false")
	fs.StringVar(&o.Output, "o", "table", "output: table or json (one object per event and instance)")
	if err := parse(fs, args, getenv); err != nil {
		return o, err
	}
	switch {
	case o.ClusterFile == "":
		return o, fmt.Errorf("--cluster is required")
	case o.EventsPath == "":
		return o, fmt.Errorf("--events is required")
	case o.Output != "table" && o.Output != "json":
		return o, fmt.Errorf("-o %q: want table or json", o.Output)
	}
	o.Now = now
	if *nowFlag != "" {
		t, err := time.Parse(time.RFC3339, *nowFlag)
		if err != nil {
			return o, fmt.Errorf("--now %q: want RFC 3339, such as 2026-11-21T12:00:00Z", *nowFlag)
		}
		o.Now = t
	}
	if *gateFlag != "" {
		if err := gates.Set(*gateFlag); err != nil {
			return o, fmt.Errorf("--feature-gates: %v", err)
		}
	}
	return o, nil
}
