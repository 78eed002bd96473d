package options

import (
	"fmt"
	"time"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/handback"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
)

// Handback is the configuration of `health-router handback`.
type Handback struct {
	Pending handback.Pending
	DryRun  bool
	// Kubeconfig and Context find the cluster (RESTConfig).
	Kubeconfig string
	Context    string
	// Namespace is the router's: its leader Lease and shadow ledger are there.
	Namespace        string
	LeaderElectionID string
	ShadowLedger     string
	// KarpenterQueueURL: pending events are forwarded there (--pending=drain); empty: their
	// NodeClaims are deleted.
	KarpenterQueueURL string
	ConfirmTimeout    time.Duration
	// KarpenterVersion is the router's --karpenter-version: a pending event this Karpenter
	// has no parser for deletes its NodeClaim instead of a forward it would drop.
	KarpenterVersion signal.KarpenterVersion
	Region           string
	AWSEndpointURL   string
	Output           string
}

// NewHandback returns the parser of `health-router handback`.
func NewHandback() *Parser[Handback] {
	o := &Handback{}
	fs := newFlagSet("handback")
	pending := fs.String("pending", "", "what becomes of the events still pending (required): drain (now, as the router would have at their time: forwarded to Karpenter, or the NodeClaim deleted) or drop (each listed; Karpenter's poller finds the scheduled ones again once it may call DescribeInstanceStatus)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "list what would be done, change nothing")
	o.Namespace = "health-router"
	kubeFlags(fs, &o.Kubeconfig, &o.Context, &o.Namespace, "`namespace` of the router: its leader Lease (handback refuses while it is held) and the ConfigMap of an earlier router's shadow ledger")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "health-router.healthrouter.io", "`name` of the router's leader election Lease")
	fs.StringVar(&o.ShadowLedger, "shadow-ledger", shadow.DefaultLedgerName, "`name` of the ConfigMap where a router before the store kept its shadow ledger, deleted with the rest (the ledger's HealthRecords are deleted whatever their name)")
	fs.StringVar(&o.KarpenterQueueURL, "karpenter-queue-url", "", "`URL` of Karpenter's interruption queue: --pending=drain forwards each pending event there, as the router's forward mode; empty: the NodeClaim is deleted")
	fs.DurationVar(&o.ConfirmTimeout, "forward-confirm-timeout", handback.DefaultConfirmTimeout, "how long Karpenter has to start deleting a NodeClaim whose drain was forwarded; past it the NodeClaim is deleted")
	fs.Var(karpenterVersionValue{&o.KarpenterVersion}, "karpenter-version", "the router's --karpenter-version (the same environment variable): a pending event this Karpenter has no parser for (a capacity-reservation interruption below v1.10) deletes its NodeClaim instead of being forwarded; empty: unknown, taken as the newest")
	fs.StringVar(&o.Region, "region", "", "AWS `region` of Karpenter's queue (default: the AWS SDK's)")
	fs.StringVar(&o.AWSEndpointURL, "aws-endpoint-url", "", "AWS endpoint `URL` (local stand-ins such as moto)")
	fs.StringVarP(&o.Output, "output", "o", "table", "output: table (for people) or json")
	return newParser(fs, func() (Handback, error) {
		o.Pending = handback.Pending(*pending)
		switch {
		case *pending == "":
			return *o, fmt.Errorf("--pending is required: drain or drop (add --dry-run to see what each would do)")
		case o.Pending != handback.PendingDrain && o.Pending != handback.PendingDrop:
			return *o, fmt.Errorf("--pending %q: want drain or drop", *pending)
		case o.Output != "table" && o.Output != "json":
			return *o, fmt.Errorf("--output %q: want table or json", o.Output)
		case o.ConfirmTimeout <= 0:
			return *o, fmt.Errorf("--forward-confirm-timeout %s: want a duration such as 20s", o.ConfirmTimeout)
		}
		if o.KarpenterQueueURL != "" {
			if _, err := awscalls.ParseQueueURL(o.KarpenterQueueURL); err != nil {
				return *o, fmt.Errorf("--karpenter-queue-url: %w", err)
			}
		}
		return *o, nil
	})
}
