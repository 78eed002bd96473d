// Package options parses the command line of each health-router command. Every flag has an
// environment fallback (--queue-url / HEALTH_ROUTER_QUEUE_URL); a flag on the command line
// wins. Parsing validates and fails fast with a message that names the flag.
package options

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/replay"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
)

// EnvPrefix prefixes the environment fallback of every flag.
const EnvPrefix = "HEALTH_ROUTER_"

// EnvName returns the environment variable of a flag: --queue-url -> HEALTH_ROUTER_QUEUE_URL.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// replayFlags defines the flags of `health-router replay` on o; now and gates are parsed
// further by ParseReplay.
func replayFlags(o *replay.Options) (fs *pflag.FlagSet, now, gates *string) {
	fs = newFlagSet("replay")
	fs.StringVar(&o.ClusterFile, "cluster", "", "`path` of the cluster snapshot (required): what kubectl get nodes,nodeclaims,nodepools,ec2nodeclasses -o yaml prints (a List), or multi-document YAML or JSON of those objects; add pods,poddisruptionbudgets -A for the PodDisruptionBudget gate (without Pods it is not run, and the table says so); other kinds are left out with a note on stderr")
	fs.StringVar(&o.EventsPath, "events", "", "`path` of the events (required): a JSON file (one event), a JSON-lines file (.jsonl or .ndjson, one event per line), or a directory of both, read in name order")
	fs.StringVar(&o.AWSFile, "aws", "", "`path` of what EC2 answers the pre-signal checks (and the scheduled events of pools that move them, a what-if): the JSON that aws ec2 describe-images, describe-capacity-reservations and describe-instance-status --output json print, or the short YAML; a file or a directory of them; without it no check runs")
	fs.StringVar(&o.AlertsFile, "alerts", "", "`path` of what Alertmanager answered (curl $ALERTMANAGER/api/v2/alerts?active=true&silenced=false&inhibited=false: its JSON array, unedited: labels, startsAt and status.state are read), for the pools' hold-while-alerts gate; without it the alert gate is not run, and the table says so")
	now = fs.String("now", "", "the `time` to decide at, RFC 3339 (default: the current time)")
	gates = fs.String("feature-gates", "", "feature `gates`, as Karpenter's: ReservedCapacity=true|false")
	fs.StringVarP(&o.Output, "output", "o", "table", "output: table (for people) or json (one object per event and instance)")
	fs.BoolVar(&o.Strict, "strict", false, "exit non-zero when a NodePool of the snapshot has annotation problems (each is printed on stderr either way): a pool with one decides on the safe side, not as its owner meant")
	return fs, now, gates
}

// NewReplay returns the parser of `health-router replay`; now is the default of --now.
func NewReplay(now time.Time) *Parser[replay.Options] {
	gates := checks.NewFeatureGates()
	o := &replay.Options{Gates: gates}
	fs, nowFlag, gateFlag := replayFlags(o)
	return newParser(fs, func() (replay.Options, error) { return finishReplay(*o, gates, now, *nowFlag, *gateFlag) })
}

// ParseReplay parses `health-router replay` flags.
func ParseReplay(args []string, getenv func(string) string, now time.Time) (replay.Options, error) {
	return NewReplay(now).Parse(args, getenv)
}

func finishReplay(o replay.Options, gates featuregate.MutableFeatureGate, now time.Time, nowFlag, gateFlag string) (replay.Options, error) {
	switch {
	case o.ClusterFile == "":
		return o, fmt.Errorf("--cluster is required")
	case o.EventsPath == "":
		return o, fmt.Errorf("--events is required")
	case o.Output != "table" && o.Output != "json":
		return o, fmt.Errorf("--output %q: want table or json", o.Output)
	}
	o.Now = now
	if nowFlag != "" {
		t, err := time.Parse(time.RFC3339, nowFlag)
		if err != nil {
			return o, fmt.Errorf("--now %q: want RFC 3339, such as 2026-11-21T12:00:00Z", nowFlag)
		}
		o.Now = t
	}
	if gateFlag != "" {
		if err := gates.Set(gateFlag); err != nil {
			return o, fmt.Errorf("--feature-gates: %v", err)
		}
	}
	return o, nil
}

// Defaults of the Kubernetes client limits: Karpenter's own.
const (
	DefaultKubeClientQPS   = 200
	DefaultKubeClientBurst = 300
)

// Defaults of the intake: messages worked on at once, and the receive loops filling them.
const (
	DefaultWorkers   = 10
	DefaultReceivers = 1
)

// OriginAny, as --account or --region, switches that half of the origin check off (the
// intake's OriginAny).
const OriginAny = "any"

// senderID is an SQS SenderId: an IAM user's or role's unique ID, or a role's with a session.
var senderID = regexp.MustCompile(`^[A-Z0-9]{4,128}(:[\w+=,.@-]{1,64})?$`)

// accountID is an AWS account ID.
var accountID = regexp.MustCompile(`^[0-9]{12}$`)

// Run is the configuration of `health-router run`.
type Run struct {
	QueueURL           string
	DeadLetterQueueURL string
	KarpenterQueueURL  string
	Signal             signal.Mode
	// KarpenterVersion is the version of the Karpenter the router signals (zero: unknown,
	// taken as the newest); below v1.10 a capacity-reservation interruption deletes the
	// NodeClaim, since that Karpenter has no parser for the forward.
	KarpenterVersion signal.KarpenterVersion
	Workers          int
	// Receivers is how many SQS receive loops fill the Workers (intake.Config.Receivers).
	Receivers     int
	Visibility    time.Duration
	WaitTime      time.Duration
	HandleTimeout time.Duration
	Region        string
	Account       string
	// SenderIDs are the only SQS senders the intake acts on (intake.Config.SenderIDs).
	SenderIDs      []string
	AWSEndpointURL string
	Gates          featuregate.MutableFeatureGate
	Kubeconfig     string

	LeaderElect             bool
	LeaderElectionNamespace string
	LeaderElectionID        string
	MetricsBindAddress      string
	// MetricsSecure serves /metrics over HTTPS to callers the API server authenticates
	// (TokenReview) and authorizes for GET /metrics (SubjectAccessReview), as Karpenter's and
	// kubebuilder's scaffolds do; off, over plain HTTP to anyone who reaches the port.
	MetricsSecure bool
	// CalendarBindAddress is where the maintenance calendar (router/calendar) is served, on a
	// listener of its own; empty: it is not served.
	CalendarBindAddress    string
	HealthProbeBindAddress string
	ShutdownTimeout        time.Duration
	// PodName and PodNamespace name the router's own Pod (the downward API's metadata.name
	// and metadata.namespace), on which it posts a Warning Event when a queue makes it
	// NotReady and a Normal one when it is usable again; empty: no such Event (the reason is
	// in the log).
	PodName, PodNamespace string

	CloudWatchMetrics  bool
	CloudWatchInterval time.Duration
	ClusterName        string
	LogLevel           slog.Level

	// KubeClientQPS and KubeClientBurst limit every Kubernetes client the router makes (the
	// cache, writes, Events), however it finds its kubeconfig.
	KubeClientQPS   float64
	KubeClientBurst int
	// InstanceParallelism is how many instances of one event are carried out at once.
	InstanceParallelism int
	// ForwardConfirmTimeout is how long Karpenter has to act on a forwarded drain.
	ForwardConfirmTimeout time.Duration
	// InstanceStatusPoller runs the router's DescribeInstanceStatus poller (Karpenter's own is
	// switched off by denying the call to its role); InstanceStatusInterval is its period.
	InstanceStatusPoller   bool
	InstanceStatusInterval time.Duration
	// AlertmanagerURL is the Alertmanager the alert gate asks (API v2); empty: none.
	AlertmanagerURL string
	// UnmanagedNodes is what the router does for nodes Karpenter does not manage:
	// policy.UnmanagedIgnore or policy.UnmanagedCordonDrain.
	UnmanagedNodes string
	// NodeMarks has the router show each node's pending outcome on the Node (router/upcoming):
	// the healthrouter.io/maintenance-at label, the healthrouter.io/maintenance annotation,
	// and the taint of pools that ask for it. It needs permission to patch Nodes.
	NodeMarks bool
	// PodEventsPerEvent bounds the pod Events of one event (router/podnotice); 0: none.
	PodEventsPerEvent int
	// InstanceEventsPerSecond bounds the decision Events on Nodes and NodeClaims, in
	// instances a second (signal.SetInstanceEventRate); 0: unbounded.
	InstanceEventsPerSecond float64
	// RebootInPlace runs the reboot in place (router/inplace) for the pools that ask for it;
	// off, their nodes are replaced. It needs permission to patch Nodes, evict pods, read
	// DaemonSets and (for instance-reboot) ec2:RebootInstances.
	RebootInPlace bool
	// EventWindows keeps an EC2 event window for each pool annotated
	// healthrouter.io/event-window=true (router/eventwindow), named and tagged by ClusterName;
	// it needs the EC2 event-window calls and ec2:CreateTags on the cluster's instances.
	EventWindows bool
	// Shadow puts every pool (and every node Karpenter does not manage) in shadow: each
	// outcome is decided and recorded (router/shadow), none carried out.
	Shadow bool
	// ShadowLedger names the shadow ledger, the HealthRecord (record.LedgerRecordName) that
	// keeps the would-be outcomes beside what Karpenter did (health-router status --shadow),
	// and the ConfigMap of the router's namespace where routers before the store kept it.
	ShadowLedger string
	// MaxReceives is how many deliveries a failing message gets before the router
	// dead-letters it itself, with its last error (0: never).
	MaxReceives int

	// WebhookURL receives notifications (router/notify); empty: none are sent. It often
	// embeds a token: never print it.
	WebhookURL string
	// WebhookTemplate is the text of the body template (read from the file when the flag
	// was @path); empty: notify.DefaultTemplate.
	WebhookTemplate string
	// WebhookHeaders are set on every webhook request (usually Authorization).
	WebhookHeaders map[string]string
}

// runFlags defines the flags of `health-router run` on o; mode, gateFlag and level are parsed
// further by ParseRun.
func runFlags(o *Run) (fs *pflag.FlagSet, mode, gateFlag, level, headers *string) {
	fs = newFlagSet("run")
	fs.StringVar(&o.QueueURL, "queue-url", "", "`URL` of the SQS intake queue the EventBridge rules feed (required)")
	fs.StringVar(&o.DeadLetterQueueURL, "dead-letter-queue-url", "", "`URL` of the SQS dead-letter queue for messages the router cannot act on (required)")
	fs.StringVar(&o.KarpenterQueueURL, "karpenter-queue-url", "", "`URL` of Karpenter's interruption queue (its --interruption-queue); drains are forwarded there (signal mode forward)")
	fs.Var(karpenterVersionValue{&o.KarpenterVersion}, "karpenter-version", "`version` of the Karpenter the router signals, as its chart or image tag says (v1.9.3): below v1.10 Karpenter has no parser for a capacity-reservation interruption, which the router then signals by deleting the NodeClaim at once; empty: unknown, taken as the newest (forward, then the confirm-or-fallback)")
	mode = fs.String("signal", "", "how a drain is signalled (`mode`): forward (to --karpenter-queue-url) or delete-nodeclaim (default: forward when --karpenter-queue-url is set, else delete-nodeclaim)")
	fs.IntVar(&o.Workers, "workers", DefaultWorkers, "messages worked on at once (1 to 100)")
	fs.IntVar(&o.Receivers, "receivers", DefaultReceivers, "SQS receive loops filling the workers, each with one long poll in flight and its share of the free workers (1 to --workers): one loop brings at most 10 messages per round trip to SQS")
	fs.DurationVar(&o.Visibility, "visibility-timeout", 30*time.Second, "how long a received message stays invisible between heartbeats (10s to 12h)")
	fs.DurationVar(&o.WaitTime, "wait-time", 20*time.Second, "SQS long-poll wait (0s to 20s)")
	fs.DurationVar(&o.HandleTimeout, "handle-timeout", 2*time.Minute, "longest work on one message (Kubernetes and AWS calls), plus 25 ms per instance it names; past it the message is retried with backoff, and the retry skips the instances whose outcome is recorded")
	fs.StringVar(&o.Region, "region", "", "AWS `region` (default: the AWS SDK's, from AWS_REGION or the profile); events of other regions are dead-lettered as foreign, a guard against misconfiguration, not authentication; any: accept every region")
	fs.StringVar(&o.Account, "account", "", "AWS `account` ID (default: the router's own, from sts:GetCallerIdentity, which needs no permission); events of other accounts are dead-lettered as foreign, a guard against misconfiguration, not authentication; any: accept every account")
	fs.Func("sender-ids", "comma-separated SQS SenderIds (`ids`) the intake acts on; a message of another sender is dead-lettered as foreign-sender (default: any sender, the queue policy decides). A role's ID (AROA..., from aws iam get-role) stands for every session of the role; see running.md for EventBridge's", func(v string) error {
		o.SenderIDs = nil
		for _, id := range strings.Split(v, ",") {
			id = strings.TrimSpace(id)
			if !senderID.MatchString(id) {
				return fmt.Errorf("%q is not an SQS SenderId (AIDA..., AROA... or AROA...:session)", id)
			}
			o.SenderIDs = append(o.SenderIDs, id)
		}
		return nil
	})
	fs.StringVar(&o.AWSEndpointURL, "aws-endpoint-url", "", "send every AWS call to this `URL` (local stand-ins such as moto_server); empty for AWS")
	gateFlag = fs.String("feature-gates", "", "feature `gates`, as Karpenter's: ReservedCapacity=true|false (default true); keep them equal to Karpenter's")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig `path` (default: $KUBECONFIG, else ~/.kube/config, else the Pod's service account)")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader among replicas: only the leader consumes the queue; a standby takes over")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's namespace)")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "health-router.healthrouter.io", "name of the leader election Lease")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", ":8080", "`address` of the Prometheus /metrics endpoint; 0 to disable")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", false, "serve /metrics over HTTPS (a self-signed certificate) to callers the API server authenticates (TokenReview) and authorizes for GET on the non-resource URL /metrics (SubjectAccessReview); needs create on tokenreviews and subjectaccessreviews. Off: plain HTTP, no authentication")
	fs.StringVar(&o.CalendarBindAddress, "calendar-bind-address", "", "`address` (host:port) of the maintenance calendar, GET /calendar.ics, on a listener of its own with no authentication: it names nodes, events and drain times, so keep it inside the cluster (a NetworkPolicy) and never expose it publicly; empty: not served")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "`address` of /healthz and /readyz (ready once the cache of Nodes, NodeClaims, NodePools, EC2NodeClasses and PodDisruptionBudgets is synced)")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a shutdown waits for in-flight messages")
	fs.BoolVar(&o.CloudWatchMetrics, "cloudwatch-metrics", false, "publish the dashboard metrics to CloudWatch (namespace HealthRouter), from the leader only")
	fs.DurationVar(&o.CloudWatchInterval, "cloudwatch-interval", time.Minute, "how often CloudWatch metrics are published (at least 10s); each publish sends a Heartbeat, for the \"router silent\" alarm")
	fs.StringVar(&o.ClusterName, "cluster-name", "", "cluster name, the ClusterName dimension of the CloudWatch metrics (required with --cloudwatch-metrics) and the name the EC2 event windows and their instance tag carry (required with --event-windows)")
	level = fs.String("log-level", "info", "log `level`: debug, info, warn or error (JSON logs; keys event_id, kind, instance, node, nodepool, action)")
	fs.Float64Var(&o.KubeClientQPS, "kube-client-qps", DefaultKubeClientQPS, "requests per second each Kubernetes client the router makes (the cache, writes, Events) may make, however the kubeconfig is found (Karpenter's default)")
	fs.IntVar(&o.KubeClientBurst, "kube-client-burst", DefaultKubeClientBurst, "burst of requests each Kubernetes client may make above --kube-client-qps")
	fs.IntVar(&o.InstanceParallelism, "instance-parallelism", 16, "instances of one event decided and carried out at once (1-256)")
	fs.BoolVar(&o.InstanceStatusPoller, "instance-status-poller", true, "poll ec2:DescribeInstanceStatus for the cluster's instances (scheduled events, impaired status) as the leader, taking over Karpenter's own poller (Karpenter v1.12+); needs the permission")
	fs.StringVar(&o.AlertmanagerURL, "alertmanager-url", "", "base `URL` of the Alertmanager (API v2, with any route prefix) the pools' hold-while-alerts gate asks, e.g. http://alertmanager.monitoring:9093; empty: a pool asking for the gate finds it unreachable")
	fs.DurationVar(&o.InstanceStatusInterval, "instance-status-interval", time.Minute, "how often the instance-status poller runs (at least 10s; Karpenter's interval is 1m)")
	fs.DurationVar(&o.ForwardConfirmTimeout, "forward-confirm-timeout", 20*time.Second, "how long Karpenter has to start deleting a NodeClaim whose drain was forwarded; past it the router deletes the NodeClaim itself")
	fs.StringVar(&o.UnmanagedNodes, "unmanaged-nodes", policy.UnmanagedIgnore, "what (`mode`) the router does for nodes Karpenter does not manage (no NodeClaim: managed node groups, self-managed nodes): ignore (a clear \"not managed by Karpenter\" outcome: an Event on the Node and a metric; the message is deleted, nothing retried) or cordon-drain (cordon, and evict the pods through the Eviction API with PDBs respected, as aws-node-termination-handler would: one router for every node of the cluster). A drain an earlier router began with cordon-drain is carried to its end whatever the mode (a close still ends it), with a Warning Event on the Node")
	fs.BoolVar(&o.NodeMarks, "node-marks", true, "show each node's pending outcome (deferred, held) on its Node: the label healthrouter.io/maintenance-at (Unix seconds), the annotation healthrouter.io/maintenance, and in pools annotated healthrouter.io/taint-upcoming=true a PreferNoSchedule taint; needs permission to patch Nodes")
	fs.BoolVar(&o.RebootInPlace, "reboot-in-place", false, "keep nodes through reboot-type scheduled events for the pools annotated healthrouter.io/action.scheduled-change.<type>=reboot-in-place: cordon, evict (PDBs respected), let AWS reboot (or RebootInstances for instance-reboot), uncordon once Ready; off, those nodes are replaced, and a run an earlier router began is carried to its end. Needs permission to patch Nodes, create pods/eviction and get DaemonSets, ec2:RebootInstances, and ec2:DescribeInstances for a system-reboot's reboot migration")
	fs.BoolVar(&o.EventWindows, "event-windows", false, "keep an EC2 event window for each NodePool annotated healthrouter.io/event-window=true, so that AWS schedules new stop, reboot and retirement events of its instances inside the pool's maintenance window; the router tags each instance healthrouter.io/event-window=<cluster>/<pool> and targets that tag. Needs --cluster-name, the EC2 event-window calls and ec2:CreateTags on the cluster's instances (terraform: enable_event_windows). Off (or under --shadow), the windows an earlier router of the cluster created are deleted at start, with a warning")
	fs.IntVar(&o.PodEventsPerEvent, "pod-events-per-event", podnotice.DefaultPerEvent, "Kubernetes Events written on the pods of the nodes an event drains or defers, at most this many per event (and 110 per node); the pods past it are counted in one summary Event per namespace; 0: no pod Events")
	fs.Float64Var(&o.InstanceEventsPerSecond, "instance-events-per-second", signal.DefaultInstanceEventsPerSecond, "instances a second whose decision gets its Kubernetes Events (on the Node and the NodeClaim), with a burst of ten seconds' worth; past it the instances are counted and told in one Event per NodePool and reason every 30s (their records stay on their NodeClaims), so that a burst of 1,000 Spot warnings does not write 2,000 Events while Karpenter launches replacements; 0: no bound")
	fs.IntVar(&o.MaxReceives, "max-receives", 90, "deliveries a message that keeps failing gets before the router dead-letters it with its last error (reason retries-exhausted); keep it below the queue's maxReceiveCount (the Terraform module's default is 100); 0: never")
	fs.StringVar(&o.WebhookURL, "webhook-url", "", "`URL` that receives a POST for each event received and each decision (Slack-compatible by default); empty: no notifications. Often holds a token: set it from a Secret")
	fs.StringVar(&o.WebhookTemplate, "webhook-template", "", "Go text/template of the webhook body, rendered with a notice; @path reads it from a file. Empty: a Slack-compatible {\"text\": ...}")
	headers = fs.String("webhook-headers", "", "headers of every webhook request, name=value,name=value (e.g. Authorization=Bearer <token>); values cannot contain commas")
	fs.BoolVar(&o.Shadow, "shadow", false, "shadow mode for every NodePool (and every node Karpenter does not manage): each event is decided and its would-be outcome recorded (in the store, as an Event, in a metric and in the shadow ledger beside what Karpenter did), nothing carried out; for one pool: the NodePool annotation healthrouter.io/mode=shadow")
	fs.StringVar(&o.ShadowLedger, "shadow-ledger", shadow.DefaultLedgerName, "`name` of the shadow ledger: the HealthRecord ledger.NAME keeps the would-be outcomes of pools in shadow beside when Karpenter drained each NodeClaim (health-router status --shadow); the ConfigMap NAME in the router's namespace, where routers before the store kept it, is adopted once and deleted")
	fs.StringVar(&o.PodName, "pod-name", "", "`name` of the router's own Pod (the chart sets it from the downward API): a queue that makes the router NotReady is told in a Warning Event on it; empty: in the log only")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "`namespace` of the router's own Pod (the chart sets it from the downward API); also where the ConfigMap of an earlier router's shadow ledger is looked for when --leader-election-namespace is empty")
	return fs, mode, gateFlag, level, headers
}

// validBindAddress says whether v is host:port with a port (the host may be empty: every
// interface).
func validBindAddress(v string) bool {
	_, port, err := net.SplitHostPort(v)
	if err != nil || port == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}

func validHTTPURL(v string) bool {
	u, err := url.Parse(v)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// RunFlagNames lists the flags of `health-router run`, for the chart's test that every one is
// reachable from its values.
func RunFlagNames() []string {
	var names []string
	NewRun().Flags.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	return names
}

// NewRun returns the parser of `health-router run`.
func NewRun() *Parser[Run] {
	o := &Run{Gates: checks.NewFeatureGates()}
	fs, mode, gateFlag, level, headers := runFlags(o)
	return newParser(fs, func() (Run, error) { return finishRun(*o, *mode, *gateFlag, *level, *headers) })
}

// ParseRun parses `health-router run` flags and validates them.
func ParseRun(args []string, getenv func(string) string) (Run, error) {
	return NewRun().Parse(args, getenv)
}

func finishRun(o Run, mode, gateFlag, level, headers string) (Run, error) {
	switch {
	case o.KubeClientQPS <= 0:
		return o, fmt.Errorf("--kube-client-qps %g: want a positive rate", o.KubeClientQPS)
	case o.KubeClientBurst < 1:
		return o, fmt.Errorf("--kube-client-burst %d: want at least 1", o.KubeClientBurst)
	case o.InstanceParallelism < 1 || o.InstanceParallelism > 256:
		return o, fmt.Errorf("--instance-parallelism %d: want 1 to 256", o.InstanceParallelism)
	case o.ForwardConfirmTimeout < time.Second:
		return o, fmt.Errorf("--forward-confirm-timeout %s: want at least 1s", o.ForwardConfirmTimeout)
	case o.InstanceStatusInterval < 10*time.Second:
		return o, fmt.Errorf("--instance-status-interval %s: want at least 10s", o.InstanceStatusInterval)
	case o.UnmanagedNodes != policy.UnmanagedIgnore && o.UnmanagedNodes != policy.UnmanagedCordonDrain:
		return o, fmt.Errorf("--unmanaged-nodes %q: want %s or %s", o.UnmanagedNodes, policy.UnmanagedIgnore, policy.UnmanagedCordonDrain)
	case o.PodEventsPerEvent < 0:
		return o, fmt.Errorf("--pod-events-per-event %d: want 0 (none) or more", o.PodEventsPerEvent)
	case o.InstanceEventsPerSecond < 0:
		return o, fmt.Errorf("--instance-events-per-second %g: want 0 (no bound) or more", o.InstanceEventsPerSecond)
	case o.MaxReceives < 0:
		return o, fmt.Errorf("--max-receives %d: want 0 (never) or more", o.MaxReceives)
	case o.AlertmanagerURL != "" && !validHTTPURL(o.AlertmanagerURL):
		return o, fmt.Errorf("--alertmanager-url %q: want an http or https URL", o.AlertmanagerURL)
	case o.Account != "" && o.Account != OriginAny && !accountID.MatchString(o.Account):
		return o, fmt.Errorf("--account %q: want a 12-digit AWS account ID, %s, or empty for the router's own", o.Account, OriginAny)
	case o.QueueURL == "" && o.DeadLetterQueueURL == "":
		return o, fmt.Errorf("--queue-url and --dead-letter-queue-url are required")
	case o.QueueURL == "":
		return o, fmt.Errorf("--queue-url is required")
	case o.DeadLetterQueueURL == "":
		return o, fmt.Errorf("--dead-letter-queue-url is required")
	case o.DeadLetterQueueURL == o.QueueURL:
		return o, fmt.Errorf("--dead-letter-queue-url must differ from --queue-url")
	case o.Workers < 1 || o.Workers > 100:
		return o, fmt.Errorf("--workers %d: want 1 to 100", o.Workers)
	case o.Receivers < 1 || o.Receivers > o.Workers:
		return o, fmt.Errorf("--receivers %d: want 1 to --workers (%d)", o.Receivers, o.Workers)
	case o.Visibility < 10*time.Second || o.Visibility > 12*time.Hour:
		return o, fmt.Errorf("--visibility-timeout %s: want 10s to 12h", o.Visibility)
	case o.WaitTime < 0 || o.WaitTime > 20*time.Second:
		return o, fmt.Errorf("--wait-time %s: want 0s to 20s", o.WaitTime)
	case o.CloudWatchMetrics && o.ClusterName == "":
		return o, fmt.Errorf("--cluster-name is required with --cloudwatch-metrics")
	case o.EventWindows && o.ClusterName == "":
		return o, fmt.Errorf("--cluster-name is required with --event-windows: the windows and the instance tag are named by cluster")
	case o.CloudWatchInterval < 10*time.Second:
		return o, fmt.Errorf("--cloudwatch-interval %s: want at least 10s", o.CloudWatchInterval)
	case o.HandleTimeout < time.Second:
		return o, fmt.Errorf("--handle-timeout %s: want at least 1s", o.HandleTimeout)
	case o.ShutdownTimeout <= 0:
		return o, fmt.Errorf("--shutdown-timeout %s: want a positive duration", o.ShutdownTimeout)
	case o.CalendarBindAddress != "" && !validBindAddress(o.CalendarBindAddress):
		return o, fmt.Errorf("--calendar-bind-address %q: want host:port, such as :8082", o.CalendarBindAddress)
	case o.CalendarBindAddress != "" && o.CalendarBindAddress == o.MetricsBindAddress:
		return o, fmt.Errorf("--calendar-bind-address %q: the calendar has a listener of its own, apart from --metrics-bind-address", o.CalendarBindAddress)
	case o.CalendarBindAddress != "" && o.CalendarBindAddress == o.HealthProbeBindAddress:
		return o, fmt.Errorf("--calendar-bind-address %q: the calendar has a listener of its own, apart from --health-probe-bind-address", o.CalendarBindAddress)
	}
	switch signal.Mode(mode) {
	case "":
		o.Signal = signal.ModeDeleteNodeClaim
		if o.KarpenterQueueURL != "" {
			o.Signal = signal.ModeForward
		}
	case signal.ModeForward:
		if o.KarpenterQueueURL == "" {
			return o, fmt.Errorf("--signal forward needs --karpenter-queue-url")
		}
		o.Signal = signal.ModeForward
	case signal.ModeDeleteNodeClaim:
		o.Signal = signal.ModeDeleteNodeClaim
	default:
		return o, fmt.Errorf("--signal %q: want forward or delete-nodeclaim", mode)
	}
	if gateFlag != "" {
		if err := o.Gates.Set(gateFlag); err != nil {
			return o, fmt.Errorf("--feature-gates: %v", err)
		}
	}
	if err := o.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return o, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if err := parseWebhook(&o, headers); err != nil {
		return o, err
	}
	return o, nil
}

// parseWebhook checks the --webhook-* flags, reads an @path template and parses the headers.
// Messages never show the URL or a header value: either may be a credential.
func parseWebhook(o *Run, headers string) error {
	if o.WebhookURL == "" {
		switch {
		case o.WebhookTemplate != "":
			return fmt.Errorf("--webhook-template needs --webhook-url")
		case headers != "":
			return fmt.Errorf("--webhook-headers needs --webhook-url")
		}
		return nil
	}
	if !validHTTPURL(o.WebhookURL) {
		return fmt.Errorf("--webhook-url: want an http or https URL")
	}
	if path, ok := strings.CutPrefix(o.WebhookTemplate, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("--webhook-template: reading the template: %v", err)
		}
		o.WebhookTemplate = string(b)
	}
	if _, err := notify.ParseTemplate(o.WebhookTemplate); err != nil {
		return fmt.Errorf("--webhook-template: %v", err)
	}
	h, err := notify.ParseHeaders(headers)
	if err != nil {
		return fmt.Errorf("--webhook-headers: %v", err)
	}
	o.WebhookHeaders = h
	return nil
}

// Doctor is the configuration of `health-router doctor`.
type Doctor struct {
	QueueURL           string
	DeadLetterQueueURL string
	KarpenterQueueURL  string
	KarpenterRoleARN   string
	KarpenterNamespace string
	// KarpenterDeployment is the name of Karpenter's Deployment in KarpenterNamespace.
	KarpenterDeployment string
	// KarpenterVersion is the router's --karpenter-version (the same environment variable).
	KarpenterVersion signal.KarpenterVersion
	Namespace        string
	Region           string
	AWSEndpointURL   string
	// Kubeconfig and Context find the cluster (RESTConfig); without one doctor runs the
	// checks that need none.
	Kubeconfig string
	Context    string
	Gates      featuregate.MutableFeatureGate
	// InstanceStatusPoller is the router's --instance-status-poller (same environment
	// variable), for the takeover check.
	InstanceStatusPoller bool
	// Reschedule says NodePools use healthrouter.io/reschedule=true: doctor checks that the
	// router may call ec2:ModifyInstanceEventStartTime.
	Reschedule bool
	// RebootInPlace is the router's --reboot-in-place (the same environment variable): doctor
	// checks that the router may call ec2:RebootInstances.
	RebootInPlace bool
	// Shadow is the router's --shadow (the same environment variable).
	Shadow bool
	// EventWindows is the router's --event-windows (the same environment variable): doctor
	// checks the EC2 event-window calls and lists the pools whose window EC2 cannot express.
	EventWindows bool
	// ClusterName is the router's --cluster-name (the same environment variable), the tag the
	// event-window grant is scoped by.
	ClusterName string
}

// doctorFlags defines the flags of `health-router doctor` on o; gates is parsed further by
// ParseDoctor.
func doctorFlags(o *Doctor) (fs *pflag.FlagSet, gates *string) {
	fs = newFlagSet("doctor")
	fs.StringVar(&o.QueueURL, "queue-url", "", "`URL` of the SQS intake queue (required)")
	fs.StringVar(&o.DeadLetterQueueURL, "dead-letter-queue-url", "", "`URL` of the dead-letter queue (required)")
	fs.StringVar(&o.KarpenterQueueURL, "karpenter-queue-url", "", "`URL` of Karpenter's interruption queue, to check that no rule feeds it directly")
	fs.StringVar(&o.KarpenterRoleARN, "karpenter-role-arn", "", "`ARN` of Karpenter's controller role, to check it cannot call ec2:DescribeInstanceStatus (needs iam:SimulatePrincipalPolicy)")
	fs.StringVar(&o.KarpenterNamespace, "karpenter-namespace", "kube-system", "`namespace` of Karpenter's Deployment, for its feature gates and version")
	fs.StringVar(&o.KarpenterDeployment, "karpenter-deployment", "karpenter", "`name` of Karpenter's Deployment (else the first labelled app.kubernetes.io/name=karpenter in --karpenter-namespace)")
	fs.Var(karpenterVersionValue{&o.KarpenterVersion}, "karpenter-version", "the router's --karpenter-version (the same environment variable), to print and compare with what Karpenter's Deployment shows")
	o.Namespace = "health-router"
	kubeFlags(fs, &o.Kubeconfig, &o.Context, &o.Namespace, "the router's `namespace`, for its leader election permissions")
	fs.StringVar(&o.Region, "region", "", "AWS `region` (default: from the AWS SDK's environment)")
	fs.StringVar(&o.AWSEndpointURL, "aws-endpoint-url", "", "send every AWS call to this `URL` (local stand-ins)")
	gates = fs.String("feature-gates", "", "the router's feature `gates`, to compare with Karpenter's")
	fs.BoolVar(&o.InstanceStatusPoller, "instance-status-poller", true, "whether the router runs its instance-status poller, as its --instance-status-poller (the same environment variable), for the takeover check")
	fs.BoolVar(&o.Reschedule, "reschedule", false, "whether NodePools use "+policy.AnnotationReschedule+"=true, to check that the router may call ec2:ModifyInstanceEventStartTime")
	fs.BoolVar(&o.RebootInPlace, "reboot-in-place", false, "whether the router runs with --reboot-in-place (the same environment variable), to check that it may call ec2:RebootInstances")
	fs.BoolVar(&o.Shadow, "shadow", false, "whether the router runs with --shadow (the same environment variable): doctor then expects Karpenter's own handling to be on, and fails where nobody would act on the events")
	fs.StringVar(&o.ClusterName, "cluster-name", "", "the router's --cluster-name (the same environment variable), for the event-window checks: the windows and the grant are scoped by it")
	fs.BoolVar(&o.EventWindows, "event-windows", false, "whether the router runs with --event-windows (the same environment variable), to check the EC2 event-window calls and ec2:CreateTags (DryRun), and list the NodePools whose window EC2 cannot express")
	return fs, gates
}

// NewDoctor returns the parser of `health-router doctor`.
func NewDoctor() *Parser[Doctor] {
	o := &Doctor{Gates: checks.NewFeatureGates()}
	fs, gateFlag := doctorFlags(o)
	return newParser(fs, func() (Doctor, error) { return finishDoctor(*o, *gateFlag) })
}

// ParseDoctor parses `health-router doctor` flags.
func ParseDoctor(args []string, getenv func(string) string) (Doctor, error) {
	return NewDoctor().Parse(args, getenv)
}

func finishDoctor(o Doctor, gateFlag string) (Doctor, error) {
	switch {
	case o.QueueURL == "" && o.DeadLetterQueueURL == "":
		return o, fmt.Errorf("--queue-url and --dead-letter-queue-url are required")
	case o.QueueURL == "":
		return o, fmt.Errorf("--queue-url is required")
	case o.DeadLetterQueueURL == "":
		return o, fmt.Errorf("--dead-letter-queue-url is required")
	}
	if gateFlag != "" {
		if err := o.Gates.Set(gateFlag); err != nil {
			return o, fmt.Errorf("--feature-gates: %v", err)
		}
	}
	return o, nil
}

// FlagSets returns the flags of every command, one FlagSet named after its command, as the
// command defines them: the reference (docs/reference.md) is generated from them.
func FlagSets() []*pflag.FlagSet {
	return []*pflag.FlagSet{NewRun().Flags, NewDoctor().Flags, NewReplay(time.Time{}).Flags, NewStatus(time.Time{}).Flags, NewHandback().Flags, NewVersion().Flags}
}

// karpenterVersionValue is --karpenter-version as a flag value: parsed when set, so that a
// bad version fails with the flag's name.
type karpenterVersionValue struct{ v *signal.KarpenterVersion }

func (k karpenterVersionValue) String() string {
	if k.v == nil || k.v.IsZero() {
		return ""
	}
	return k.v.String()
}

func (k karpenterVersionValue) Set(s string) error {
	v, err := signal.ParseKarpenterVersion(s)
	if err != nil {
		return err
	}
	*k.v = v
	return nil
}

func (karpenterVersionValue) Type() string { return "version" }
