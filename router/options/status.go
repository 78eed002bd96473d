package options

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"
)

// Status is the configuration of `health-router status` (also `kubectl health-router status`).
type Status struct {
	// Kubeconfig and Context find the cluster (RESTConfig).
	Kubeconfig string
	Context    string
	NodePool   string
	Now        time.Time
	Output     string
	// ICS prints the calendar of planned maintenance (router/calendar) instead of the report.
	ICS bool
	// Shadow prints the shadow report (router/shadow) instead: the would-be outcomes of the
	// pools in shadow beside what Karpenter did, read from the ledger's HealthRecord
	// (ledger.ShadowLedger), or the ConfigMap Namespace/ShadowLedger of a router before the store.
	Shadow       bool
	Namespace    string
	ShadowLedger string
}

// statusFlags defines the flags of `health-router status` on o; now is parsed further by
// ParseStatus.
func statusFlags(o *Status) (fs *pflag.FlagSet, now *string) {
	fs = newFlagSet("status")
	fs.StringVar(&o.NodePool, "nodepool", "", "show this NodePool (by `name`) only, an error if it does not exist (default: every NodePool)")
	now = fs.String("now", "", "the `time` to report at, RFC 3339 (default: the current time): for the window and the until-times")
	fs.StringVarP(&o.Output, "output", "o", "table", "output: table (for people) or json")
	fs.BoolVar(&o.ICS, "ics", false, "print the planned maintenance as an iCalendar (.ics) feed instead: deferred drains and the pools' windows of the next 14 days; not with -o json")
	fs.BoolVar(&o.Shadow, "shadow", false, "print the shadow report instead: per NodePool in shadow, each event with what the router would have done and when, beside when Karpenter drained the node")
	o.Namespace = "health-router"
	kubeFlags(fs, &o.Kubeconfig, &o.Context, &o.Namespace, "`namespace` of the router (where a router before the store kept its shadow ledger)")
	fs.StringVar(&o.ShadowLedger, "shadow-ledger", "", "`name` of the shadow ledger, whose HealthRecord is ledger.NAME (default: the chart's, <release>-shadow with release health-router: health-router-shadow)")
	return fs, now
}

// NewStatus returns the parser of `health-router status`; now is the default of --now.
func NewStatus(now time.Time) *Parser[Status] {
	o := &Status{Now: now}
	fs, nowFlag := statusFlags(o)
	return newParser(fs, func() (Status, error) { return finishStatus(*o, *nowFlag) })
}

// ParseStatus parses `health-router status` flags; now is the default of --now.
func ParseStatus(args []string, getenv func(string) string, now time.Time) (Status, error) {
	return NewStatus(now).Parse(args, getenv)
}

func finishStatus(o Status, nowFlag string) (Status, error) {
	if o.Output != "table" && o.Output != "json" {
		return o, fmt.Errorf("--output %q: want table or json", o.Output)
	}
	if o.ICS && o.Output == "json" {
		return o, fmt.Errorf("--ics prints a calendar, --output json a report: choose one")
	}
	if o.ICS && o.Shadow {
		return o, fmt.Errorf("--ics prints a calendar, --shadow the shadow report: choose one")
	}
	if nowFlag != "" {
		t, err := time.Parse(time.RFC3339, nowFlag)
		if err != nil {
			return o, fmt.Errorf("--now %q: want RFC 3339, such as 2026-11-21T12:00:00Z", nowFlag)
		}
		o.Now = t
	}
	return o, nil
}
