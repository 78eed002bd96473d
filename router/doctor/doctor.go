// Package doctor checks a live setup from the router's own credentials and prints a
// checklist with fixes: the credentials themselves first (sts:GetCallerIdentity), the queues
// (a malformed URL, an unreachable endpoint, a missing queue and a denied one each told
// apart), the EventBridge rules, whether Karpenter can still act on the same events behind
// the router's back, the router's RBAC, and the feature gates.
package doctor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	iamtypes "github.com/aws/aws-sdk-go-v2/service/iam/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/component-base/featuregate"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
)

// Status of one check.
type Status string

const (
	OK      Status = "ok"
	Warn    Status = "warn"
	Fail    Status = "FAIL"
	Unknown Status = "?" // the check could not be made (permissions, not configured)
)

// Item is one line of the checklist.
type Item struct {
	Status Status
	Check  string
	Detail string
	Fix    string
}

// Report is the checklist.
type Report []Item

// Failed reports whether any check failed.
func (r Report) Failed() bool {
	return slices.ContainsFunc(r, func(i Item) bool { return i.Status == Fail })
}

// Print writes the checklist for people.
func (r Report) Print(w io.Writer) {
	for _, i := range r {
		fmt.Fprintf(w, "[%-4s] %s: %s\n", i.Status, i.Check, i.Detail)
		if i.Fix != "" && i.Status != OK {
			fmt.Fprintf(w, "       fix: %s\n", i.Fix)
		}
	}
}

// stsAPI is what doctor asks STS: who the credentials are, before anything else.
type stsAPI interface {
	GetCallerIdentity(context.Context, *sts.GetCallerIdentityInput, ...func(*sts.Options)) (*sts.GetCallerIdentityOutput, error)
}

type sqsAPI interface {
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

type eventsAPI interface {
	ListRuleNamesByTarget(context.Context, *eventbridge.ListRuleNamesByTargetInput, ...func(*eventbridge.Options)) (*eventbridge.ListRuleNamesByTargetOutput, error)
	DescribeRule(context.Context, *eventbridge.DescribeRuleInput, ...func(*eventbridge.Options)) (*eventbridge.DescribeRuleOutput, error)
}

// ec2API is what doctor asks EC2: whether the router's credentials may poll instance status
// and move scheduled events (DryRun calls).
type ec2API interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
	ModifyInstanceEventStartTime(context.Context, *ec2.ModifyInstanceEventStartTimeInput, ...func(*ec2.Options)) (*ec2.ModifyInstanceEventStartTimeOutput, error)
	RebootInstances(context.Context, *ec2.RebootInstancesInput, ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error)
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	eventWindowsAPI
}

type iamAPI interface {
	SimulatePrincipalPolicy(context.Context, *iam.SimulatePrincipalPolicyInput, ...func(*iam.Options)) (*iam.SimulatePrincipalPolicyOutput, error)
}

// Config is what doctor checks.
type Config struct {
	QueueURL, DeadLetterQueueURL, KarpenterQueueURL string
	// KarpenterRoleARN, when set, is checked for ec2:DescribeInstanceStatus.
	KarpenterRoleARN string
	// KarpenterNamespace and KarpenterDeployment name Karpenter's Deployment, for its feature
	// gates and version. KarpenterDeployment empty: "karpenter", the name its chart gives.
	KarpenterNamespace, KarpenterDeployment string
	// Namespace is the router's, for the leader election Lease permissions.
	Namespace string
	Gates     featuregate.FeatureGate
	// KarpenterVersion is the router's --karpenter-version (zero: unknown), compared with
	// what Karpenter's Deployment shows.
	KarpenterVersion signal.KarpenterVersion
	// InstanceStatusPoller is whether the router runs its instance-status poller
	// (--instance-status-poller), the half of the takeover that replaces Karpenter's.
	InstanceStatusPoller bool
	// Reschedule is whether NodePools use healthrouter.io/reschedule=true (--reschedule):
	// the router then needs ec2:ModifyInstanceEventStartTime.
	Reschedule bool
	// RebootInPlace is the router's --reboot-in-place: doctor checks that it may call
	// ec2:RebootInstances (an instance-reboot kept in place is rebooted by the router) and
	// ec2:DescribeInstances (a system-reboot run reads the instance's reboot migration).
	RebootInPlace bool
	// Shadow is the router's --shadow: every pool in shadow, Karpenter's own handling to stay.
	Shadow bool
	// EventWindows is the router's --event-windows: doctor checks the event-window calls and
	// ec2:CreateTags with DryRun, and lists the pools whose window EC2 cannot express.
	EventWindows bool
	// ClusterName is the router's --cluster-name: the tag the event-window grant is scoped by.
	ClusterName string
}

// Doctor runs the checks.
type Doctor struct {
	sqs    sqsAPI
	events eventsAPI
	ec2    ec2API
	iam    iamAPI        // may be nil
	sts    stsAPI        // may be nil: the credentials are then not checked first
	kube   client.Client // may be nil: the cluster checks then say they could not be made
}

// New returns a Doctor.
func New(sqsClient sqsAPI, events eventsAPI, ec2Client ec2API, iamClient iamAPI, stsClient stsAPI, kube client.Client) *Doctor {
	return &Doctor{sqs: sqsClient, events: events, ec2: ec2Client, iam: iamClient, sts: stsClient, kube: kube}
}

// kinds maps each detail-type the router handles to the kind people know it by.
var kinds = map[string]string{
	"AWS Health Event":                                       "scheduled-change",
	"EC2 Spot Instance Interruption Warning":                 "spot-interruption",
	"EC2 Instance Rebalance Recommendation":                  "rebalance-recommendation",
	"EC2 Instance State-change Notification":                 "state-change",
	"EC2 Capacity Reservation Instance Interruption Warning": "capacity-reservation-interruption",
	"EC2 AMI State Change":                                   "ami-state-change",
	"Capacity Block Expiration Warning":                      "capacity-block-expiration",
	"Capacity Block Reservation Expiration Warning":          "capacity-block-expiration",
}

// Run checks everything and returns the checklist.
func (d *Doctor) Run(ctx context.Context, c Config) Report {
	var r Report
	// Credentials first: when they do not work, every AWS check below would fail the same
	// way, and the list of failures would hide the one cause.
	if !d.credentials(ctx, &r) {
		for _, q := range []struct{ name, url string }{{CheckIntakeQueue, c.QueueURL}, {CheckDeadLetterQueue, c.DeadLetterQueueURL}, {CheckKarpenterQueue, c.KarpenterQueueURL}} {
			if q.url != "" || q.name != CheckKarpenterQueue {
				d.queueURL(&r, q.name, q.url) // needs no AWS call
			}
		}
		r = append(r, Item{Unknown, CheckSkipped, "the queues, EventBridge rules, Karpenter's role and the router's EC2 permissions were not checked: they would fail as the credentials did", "fix the credentials (above) and run doctor again"})
		if !c.InstanceStatusPoller {
			d.routerInstanceStatus(ctx, &r, false) // off: no AWS call needed to say so
		}
	} else {
		d.aws(ctx, &r, c)
	}
	takeover(&r, c.Shadow)
	if d.kube == nil {
		r = append(r, Item{Unknown, "RBAC", "no cluster connection", "run doctor with a kubeconfig (--kubeconfig, --context) or in the router's pod"},
			Item{Unknown, "feature gate ReservedCapacity", "no cluster connection", "run doctor with a kubeconfig (--kubeconfig, --context) or in the router's pod"},
			Item{Unknown, CheckKarpenterVersion, "no cluster connection; the router assumes Karpenter " + c.KarpenterVersion.String(), "run doctor with a kubeconfig (--kubeconfig, --context) or in the router's pod"})
		return besideKarpenter(r, c.Shadow)
	}
	d.cluster(ctx, &r, c)
	return besideKarpenter(r, c.Shadow)
}

// cluster runs the checks that ask the API server: the router's RBAC, its store, the feature
// gates, Karpenter's version and the NodePools.
func (d *Doctor) cluster(ctx context.Context, r *Report, c Config) {
	// The API server first, as the credentials for AWS: when it does not answer, every
	// cluster check below would fail the same way, and each fix would point elsewhere (an RBAC
	// grant for a refused connection).
	if !d.apiServer(ctx, r) {
		*r = append(*r, Item{Unknown, CheckClusterSkipped, "RBAC, the store, the feature gates, Karpenter's version and the NodePools were not checked: they would fail as the API server did", "fix the connection (above) and run doctor again"})
		return
	}
	d.rbac(ctx, r, c.Namespace)
	d.store(ctx, r)
	d.gates(ctx, r, c)
	d.karpenterVersion(ctx, r, c)
	d.pools(ctx, r, c.Shadow)
	d.eventWindowPools(ctx, r, c)
}

// The words of Karpenter's own handling found on, as the takeover reads it (besideKarpenter
// says them otherwise in shadow).
const (
	rulesFeedKarpenter = "rules still feed Karpenter's queue directly, so Karpenter acts on events behind the router's back: "
	karpenterMayPoll   = " may call it: Karpenter acts on scheduled events by itself, whatever the router decides"
)

// besideKarpenter judges Karpenter's own handling as the router's mode needs it (after
// takeover and mode have read the items as the takeover's steps). In shadow, Karpenter's rules
// feeding its queue and its instance-status poller are what acts on the events until the
// takeover (docs/runbook.md steps 1-3), so they pass; either gone fails, as nobody acts on
// what it would have.
//
// An active router beside Karpenter's own handling is the takeover in progress (step 4a, 4b):
// both act on each event Karpenter still gets, and a drain twice is one drain, so nothing is
// lost: a warning, as the takeover's row says, not a failure (doctor failed it, exit 1, where
// the runbook says "a warning"). What loses events still fails: the takeover's row does.
func besideKarpenter(r Report, shadow bool) Report {
	for i, it := range r {
		if it.Check != CheckKarpenterRules && it.Check != CheckKarpenterInstanceStatus {
			continue
		}
		if !shadow {
			if it.Status == Fail {
				r[i] = Item{Warn, it.Check, "the takeover is in progress: " + it.Detail, "finish the takeover (docs/runbook.md step 4): " + it.Fix}
			}
			continue
		}
		switch it.Status {
		case Fail:
			// The item's words are the takeover's ("behind the router's back"): said as what
			// they are in shadow.
			detail := it.Detail
			if names, ok := strings.CutPrefix(detail, rulesFeedKarpenter); ok {
				detail = "rules feed Karpenter's queue: " + names
			}
			if role, ok := strings.CutSuffix(detail, karpenterMayPoll); ok {
				detail = role + " may call it (Karpenter's own instance-status poller)"
			}
			r[i] = Item{OK, it.Check, "Karpenter's own handling is on, as it should be while the router is in shadow: " + detail, ""}
		case OK:
			r[i] = Item{Fail, it.Check, "Karpenter's own handling is (partly) off while the router is in shadow, so nobody acts on the events it would have: " + it.Detail,
				"take the router out of shadow first, then finish the takeover (docs/runbook.md step 4), or give Karpenter its rules and ec2:DescribeInstanceStatus back"}
		}
	}
	return r
}

// Check names of the credentials and the queues.
const (
	CheckCredentials     = "AWS credentials"
	CheckSkipped         = "AWS checks"
	CheckIntakeQueue     = "intake queue"
	CheckDeadLetterQueue = "dead-letter queue"
	CheckKarpenterQueue  = "Karpenter's interruption queue"
)

// credentials asks STS who the credentials are (sts:GetCallerIdentity, which no policy can
// deny): it reports whether they work. Without an STS client it says nothing and trusts them.
func (d *Doctor) credentials(ctx context.Context, r *Report) bool {
	if d.sts == nil {
		return true
	}
	out, err := d.sts.GetCallerIdentity(ctx, &sts.GetCallerIdentityInput{})
	if err == nil {
		*r = append(*r, Item{OK, CheckCredentials, fmt.Sprintf("%s (account %s)", aws.ToString(out.Arn), aws.ToString(out.Account)), ""})
		return true
	}
	f := awscalls.Classify(err)
	detail, fix := "", ""
	switch f {
	case awscalls.Credentials:
		detail = "AWS refuses these credentials (invalid, expired, or no credentials found)"
		fix = "in the pod: check the ServiceAccount's IRSA annotation or Pod Identity association; on a workstation: AWS_PROFILE, or log in again (aws sso login)"
	case awscalls.Unreachable:
		detail = "STS does not answer (the endpoint's name does not resolve, or the connection is refused)"
		fix = "check --region and --aws-endpoint-url, and the network path to STS (a VPC endpoint in a private cluster)"
	default:
		detail = "STS could not say who these credentials are"
		fix = "run doctor again; if it persists, check the region and the network path to STS"
	}
	*r = append(*r, Item{Fail, CheckCredentials, fmt.Sprintf("%s: %v", detail, err), fix})
	return false
}

// aws runs the checks that ask AWS: the queues and their rules, Karpenter's role, and the
// router's own EC2 permissions.
func (d *Doctor) aws(ctx context.Context, r *Report, c Config) {
	intakeARN := d.queue(ctx, r, CheckIntakeQueue, c.QueueURL, true)
	d.queue(ctx, r, CheckDeadLetterQueue, c.DeadLetterQueueURL, false)
	if intakeARN != "" {
		d.rules(ctx, r, intakeARN)
	}
	if c.KarpenterQueueURL != "" {
		if arn := d.queue(ctx, r, CheckKarpenterQueue, c.KarpenterQueueURL, false); arn != "" {
			d.karpenterRules(ctx, r, arn)
		}
	} else {
		*r = append(*r, Item{Unknown, CheckKarpenterRules, "no --karpenter-queue-url given", "pass Karpenter's --interruption-queue URL to check that no rule feeds it directly"})
	}
	d.describeInstanceStatus(ctx, r, c.KarpenterRoleARN)
	d.routerInstanceStatus(ctx, r, c.InstanceStatusPoller)
	var sample scopeSample
	if c.Reschedule || c.RebootInPlace || c.EventWindows {
		sample = d.sample(ctx)
	}
	if c.Reschedule {
		d.routerReschedule(ctx, r, sample)
	}
	if c.RebootInPlace {
		d.routerReboot(ctx, r, sample)
		d.routerMigration(ctx, r)
	}
	if c.EventWindows {
		d.routerEventWindows(ctx, r, c, sample)
	}
}

// Check names of the cluster connection.
const (
	CheckAPIServer      = "Kubernetes API server"
	CheckClusterSkipped = "cluster checks"
)

// apiServer asks the API server a question every authenticated caller may ask (a
// SelfSubjectAccessReview), and reports whether it answered: any answer of the server's, a
// denial too, means the cluster checks below can be made.
func (d *Doctor) apiServer(ctx context.Context, r *Report) bool {
	ssar := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authv1.ResourceAttributes{Verb: "list", Resource: "nodes"}}}
	err := d.kube.Create(ctx, ssar)
	if err == nil || answered(err) {
		return true
	}
	*r = append(*r, Item{Fail, CheckAPIServer, fmt.Sprintf("no answer: %v", err),
		"check --kubeconfig and --context (kubectl cluster-info asks the same server), and the network path to the API server"})
	return false
}

// answered says whether err is the API server's own answer (a status, or a kind it does not
// serve), not a failure to reach it.
func answered(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) || meta.IsNoMatchError(err)
}

// CheckPoolAnnotations names the check of the NodePools' healthrouter.io/ annotations.
const CheckPoolAnnotations = "NodePool annotations"

// pools lists every NodePool whose annotations have problems: such a pool decides on the safe
// side (held to deadline minus drain-lead, paced), not as its owner meant.
func (d *Doctor) pools(ctx context.Context, r *Report, routerShadow bool) {
	var pools karpv1.NodePoolList
	if err := d.kube.List(ctx, &pools); err != nil {
		fix := ""
		if apierrors.IsForbidden(err) {
			fix = "grant the router get/list on nodepools (the chart does)"
		}
		*r = append(*r, Item{Unknown, CheckPoolAnnotations, fmt.Sprintf("cannot list NodePools: %v", err), fix})
		return
	}
	var inShadow []string
	for _, np := range pools.Items {
		if policy.FromAnnotations(np.Annotations).Shadow {
			inShadow = append(inShadow, np.Name)
		}
	}
	*r = append(*r, mode(*r, routerShadow, inShadow, len(pools.Items)))
	bad := 0
	for _, np := range pools.Items {
		if ps := policy.FromAnnotations(np.Annotations).Problems; len(ps) > 0 {
			bad++
			*r = append(*r, Item{Warn, CheckPoolAnnotations + ": " + np.Name, strings.Join(ps, "; "),
				"correct the annotations (docs/reference.md lists every key and value); until then the pool decides on the safe side"})
		}
	}
	if bad == 0 {
		*r = append(*r, Item{OK, CheckPoolAnnotations, fmt.Sprintf("%d NodePool(s), none with a problem", len(pools.Items)), ""})
	}
}

// Check names of the takeover from Karpenter's own handling.
const (
	CheckKarpenterRules          = "Karpenter's EventBridge rules"
	CheckKarpenterInstanceStatus = "Karpenter's ec2:DescribeInstanceStatus"
	CheckRouterInstanceStatus    = "router's instance-status poller"
	CheckTakeover                = "takeover from Karpenter"
)

// routerInstanceStatus checks that the router polls instance status itself: the poller is
// on and the caller's credentials (the router's) may call ec2:DescribeInstanceStatus. It
// asks EC2 with DryRun, which answers DryRunOperation when allowed and
// UnauthorizedOperation when not, without describing anything.
func (d *Doctor) routerInstanceStatus(ctx context.Context, r *Report, enabled bool) {
	if !enabled {
		*r = append(*r, Item{Fail, CheckRouterInstanceStatus, "off (--instance-status-poller=false): nobody acts on scheduled events EventBridge misses or on impaired instances once Karpenter's role is denied",
			"run the router with --instance-status-poller=true (the default)"})
		return
	}
	_, err := d.ec2.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{DryRun: aws.Bool(true), IncludeAllInstances: aws.Bool(true)})
	allowed, denied := dryRun(err)
	switch {
	case allowed:
		*r = append(*r, Item{OK, CheckRouterInstanceStatus, "on, and the router's credentials may call ec2:DescribeInstanceStatus", ""})
	case denied:
		*r = append(*r, Item{Fail, CheckRouterInstanceStatus, fmt.Sprintf("on, but ec2:DescribeInstanceStatus is denied to the router's credentials: %v", err),
			"grant the router's role ec2:DescribeInstanceStatus (terraform: statement InstanceStatusPoller)"})
	default:
		*r = append(*r, Item{Unknown, CheckRouterInstanceStatus, fmt.Sprintf("cannot tell whether the router may call ec2:DescribeInstanceStatus: %v", err), ""})
	}
}

// CheckRouterReschedule is the check of the router's permission to move scheduled events.
const CheckRouterReschedule = "router's ec2:ModifyInstanceEventStartTime"

// The reschedule check's DryRun call names an instance and an event that do not exist, and a
// start in the past, so that a stand-in that ignores DryRun moves nothing.
const (
	placeholderInstance = "i-00000000000000000"
	placeholderEvent    = "instance-event-00000000000000000"
)

var placeholderStart = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// scopeSample is what doctor proves the scope of the EC2 writes with: an instance of this
// cluster's Karpenter (a NodeClaim's: the Terraform module's grant covers it) and one outside
// it (a Node with no NodeClaim, such as a managed node group's: the grant must refuse it).
// Real instances are named only when the endpoint honours DryRun (honoured): a stand-in that
// ignored it would carry the call out.
type scopeSample struct {
	tagged, taggedBy     string // instance ID, and its NodeClaim
	untagged, untaggedBy string // instance ID, and its Node
	honoured             bool
}

// sample picks the instances the scope is proved with. Without a cluster connection, or an
// endpoint that honours DryRun, it names none: the checks fall back to a placeholder.
func (d *Doctor) sample(ctx context.Context) scopeSample {
	var s scopeSample
	if d.kube == nil {
		return s
	}
	_, err := d.ec2.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{DryRun: aws.Bool(true)})
	var ae smithy.APIError
	s.honoured = errors.As(err, &ae) && (ae.ErrorCode() == "DryRunOperation" || ae.ErrorCode() == "UnauthorizedOperation")
	if !s.honoured {
		return s
	}
	var claims karpv1.NodeClaimList
	var nodes corev1.NodeList
	if d.kube.List(ctx, &claims) != nil || d.kube.List(ctx, &nodes) != nil {
		return scopeSample{}
	}
	karpenter := map[string]bool{}
	for _, nc := range claims.Items {
		if id := cluster.InstanceID(nc.Status.ProviderID); id != "" {
			karpenter[id] = true
			if s.tagged == "" {
				s.tagged, s.taggedBy = id, nc.Name
			}
		}
	}
	for _, n := range nodes.Items {
		if id := cluster.InstanceID(n.Spec.ProviderID); id != "" && !karpenter[id] && n.Labels[karpv1.NodePoolLabelKey] == "" {
			s.untagged, s.untaggedBy = id, n.Name
			break
		}
	}
	return s
}

// write is one EC2 write the router makes, checked with DryRun calls.
type write struct {
	check, fix string
	allowed    string // the ok line's detail
	denied     string // what a denial costs
	call       func(ctx context.Context, instance string) error
	notFound   []string // what a stand-in that ignores DryRun answers for the placeholder
}

// scopedWrite checks that the router's credentials may make w on this cluster's Karpenter
// instances, and only on them (the Terraform module scopes both EC2 writes by tag, as
// Karpenter scopes its own TerminateInstances): a DryRun call on an instance of a NodeClaim
// must be allowed, one on an instance outside Karpenter refused. Without such instances (no
// cluster connection, or an endpoint that ignores DryRun) it asks about a placeholder
// instance, which a scoped grant refuses as well: a denial then cannot tell a missing grant
// from a scoped one, and an allowance means the grant is not scoped.
func (d *Doctor) scopedWrite(ctx context.Context, r *Report, w write, s scopeSample) {
	if s.tagged == "" {
		err := w.call(ctx, placeholderInstance)
		allowed, denied := dryRun(err)
		var ae smithy.APIError
		switch {
		case errors.As(err, &ae) && slices.Contains(w.notFound, ae.ErrorCode()):
			*r = append(*r, Item{OK, w.check, fmt.Sprintf("the endpoint ignored DryRun and looked the placeholder up (%s): the call was authorised", ae.ErrorCode()), ""})
		case allowed:
			*r = append(*r, Item{Warn, w.check, "allowed on a placeholder instance that is no Karpenter instance of this cluster: the grant is not scoped to this cluster's instances",
				"scope the grant by tag and region, as the Terraform module does (kubernetes.io/cluster/<cluster>=owned, karpenter.sh/nodepool)"})
		case denied:
			*r = append(*r, Item{Unknown, w.check, fmt.Sprintf("denied on a placeholder instance, which a grant scoped to this cluster's instances denies too: run doctor with a cluster connection to try one of its NodeClaims' instances: %v", err), w.fix})
		default:
			*r = append(*r, Item{Unknown, w.check, fmt.Sprintf("cannot tell whether the router may call it: %v", err), w.fix})
		}
		return
	}
	err := w.call(ctx, s.tagged)
	allowed, denied := dryRun(err)
	switch {
	case allowed:
		*r = append(*r, Item{OK, w.check, fmt.Sprintf("%s (DryRun on %s, NodeClaim %s)", w.allowed, s.tagged, s.taggedBy), ""})
	case denied:
		*r = append(*r, Item{Fail, w.check, fmt.Sprintf("denied on %s (NodeClaim %s): %s: %v", s.tagged, s.taggedBy, w.denied, err), w.fix})
	default:
		*r = append(*r, Item{Unknown, w.check, fmt.Sprintf("cannot tell whether the router may call it: %v", err), w.fix})
	}
	scope := w.check + " scope"
	if s.untagged == "" {
		*r = append(*r, Item{Unknown, scope, "no instance outside Karpenter in the cluster to prove the grant refuses one", ""})
		return
	}
	err = w.call(ctx, s.untagged)
	allowed, denied = dryRun(err)
	switch {
	case denied:
		*r = append(*r, Item{OK, scope, fmt.Sprintf("refused on %s (Node %s, not a Karpenter instance of this cluster)", s.untagged, s.untaggedBy), ""})
	case allowed:
		*r = append(*r, Item{Warn, scope, fmt.Sprintf("allowed on %s (Node %s, not a Karpenter instance of this cluster): the grant reaches instances the router never acts on", s.untagged, s.untaggedBy),
			"scope the grant by tag and region, as the Terraform module does (kubernetes.io/cluster/<cluster>=owned, karpenter.sh/nodepool)"})
	default:
		*r = append(*r, Item{Unknown, scope, fmt.Sprintf("cannot tell: %v", err), ""})
	}
}

// routerReschedule checks ec2:ModifyInstanceEventStartTime, which pools annotated
// healthrouter.io/reschedule=true need (scopedWrite). The call names an event that does not
// exist and a start in the past: nothing can move, whatever the endpoint does with DryRun.
func (d *Doctor) routerReschedule(ctx context.Context, r *Report, s scopeSample) {
	d.scopedWrite(ctx, r, write{
		check:   CheckRouterReschedule,
		fix:     "grant the router's role ec2:ModifyInstanceEventStartTime (terraform: enable_reschedule = true, statement RescheduleEvents)",
		allowed: "the router's credentials may move scheduled events of this cluster's instances into maintenance windows",
		denied:  fmt.Sprintf("pools with %s=true keep their events where AWS put them (their ordinary policy applies)", policy.AnnotationReschedule),
		call: func(ctx context.Context, instance string) error {
			_, err := d.ec2.ModifyInstanceEventStartTime(ctx, &ec2.ModifyInstanceEventStartTimeInput{
				DryRun: aws.Bool(true), InstanceId: aws.String(instance), InstanceEventId: aws.String(placeholderEvent), NotBefore: aws.Time(placeholderStart)})
			return err
		},
		notFound: []string{"InvalidInstanceID.NotFound", "InvalidInstanceEventIDNotFound"},
	}, s)
}

// CheckRouterReboot is the check of the router's permission to reboot instances it keeps.
const CheckRouterReboot = "router's ec2:RebootInstances"

// routerReboot checks ec2:RebootInstances, which a reboot in place of an instance-reboot
// event needs (scopedWrite). A real instance is named only to an endpoint that honours DryRun.
func (d *Doctor) routerReboot(ctx context.Context, r *Report, s scopeSample) {
	d.scopedWrite(ctx, r, write{
		check:   CheckRouterReboot,
		fix:     "grant the router's role ec2:RebootInstances (terraform: enable_reboot_in_place = true, statement RebootInPlace)",
		allowed: "the router's credentials may reboot this cluster's instances it keeps through an instance-reboot",
		denied:  "an instance-reboot kept in place waits for AWS to reboot at its start instead",
		call: func(ctx context.Context, instance string) error {
			_, err := d.ec2.RebootInstances(ctx, &ec2.RebootInstancesInput{DryRun: aws.Bool(true), InstanceIds: []string{instance}})
			return err
		},
		notFound: []string{"InvalidInstanceID.NotFound"},
	}, s)
}

// CheckRouterMigration is the check of the router's permission to read an instance's reboot
// migration.
const CheckRouterMigration = "router's ec2:DescribeInstances"

// routerMigration checks ec2:DescribeInstances, with which a system-reboot run reads the
// instance's reboot migration (router/inplace): where it is on, the router reboots the
// instance itself once it is empty, and the migration may clear the event; denied, the run
// takes it as off and waits for AWS at the event's start. A read: no instance is named, and a
// stand-in that ignores DryRun only lists.
func (d *Doctor) routerMigration(ctx context.Context, r *Report) {
	_, err := d.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{DryRun: aws.Bool(true), MaxResults: aws.Int32(5)})
	allowed, denied := dryRun(err)
	switch {
	case allowed:
		*r = append(*r, Item{OK, CheckRouterMigration, "the router's credentials may read an instance's reboot migration: a system-reboot run reboots an instance whose migration is on itself, once it is empty", ""})
	case denied:
		*r = append(*r, Item{Warn, CheckRouterMigration, fmt.Sprintf("denied to the router's credentials (%v): a system-reboot run takes reboot migration as off: the node is emptied 2 h 10 min before AWS's start and AWS reboots it then, where the router could have rebooted it in the window and cleared the event", err),
			"grant the router's role ec2:DescribeInstances (terraform: enable_reboot_in_place = true, statement RebootMigration)"})
	default:
		*r = append(*r, Item{Unknown, CheckRouterMigration, fmt.Sprintf("cannot tell whether the router may call ec2:DescribeInstances: %v", err),
			"grant the router's role ec2:DescribeInstances (terraform: enable_reboot_in_place = true, statement RebootMigration)"})
	}
}

// dryRun reads the answer to a DryRun call. Local stand-ins (moto) ignore DryRun and answer;
// an answer means allowed too.
func dryRun(err error) (allowed, denied bool) {
	if err == nil {
		return true, false
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false, false
	}
	switch ae.ErrorCode() {
	case "DryRunOperation":
		return true, false
	case "UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure":
		return false, true
	}
	return false, false
}

// CheckMode is the check of the router's mode: active, or shadow (router/shadow).
const CheckMode = "mode"

// mode says which pools are in shadow, and fails where a pool in shadow has nobody acting on
// its events: Karpenter's own handling is off (its rules gone or its DescribeInstanceStatus
// denied, as the takeover leaves it).
func mode(r Report, routerShadow bool, inShadow []string, pools int) Item {
	status := map[string]Status{}
	for _, i := range r {
		status[i.Check] = i.Status
	}
	karpenterOff := status[CheckKarpenterRules] == OK || status[CheckKarpenterInstanceStatus] == OK
	switch {
	case routerShadow && karpenterOff:
		return Item{Fail, CheckMode, "shadow (--shadow) while Karpenter's own handling is off: the router carries nothing out and Karpenter is not told, so every event is lost",
			"either take the router out of shadow (the takeover: docs/runbook.md step 4), or give Karpenter its rules and ec2:DescribeInstanceStatus back"}
	case routerShadow:
		return Item{OK, CheckMode, "shadow (--shadow): every pool's events are decided and recorded, none carried out; Karpenter acts. Compare with health-router status --shadow", ""}
	case len(inShadow) > 0 && karpenterOff:
		return Item{OK, CheckMode, fmt.Sprintf("active; in shadow (healthrouter.io/mode=shadow): %s (their policy recorded as would-be, Karpenter's behaviour carried out by the router, since Karpenter's own handling is off: health-router status --shadow)", strings.Join(inShadow, ", ")), ""}
	case len(inShadow) > 0:
		return Item{OK, CheckMode, fmt.Sprintf("active; in shadow (healthrouter.io/mode=shadow): %s (their policy recorded as would-be, Karpenter's behaviour carried out by the router and by Karpenter while its own handling is on: health-router status --shadow)", strings.Join(inShadow, ", ")), ""}
	}
	return Item{OK, CheckMode, fmt.Sprintf("active: the router carries out the outcomes of all %d NodePool(s)", pools), ""}
}

// takeover sums up the takeover from Karpenter's own handling, from the items above: it is
// complete when Karpenter's rules no longer feed its queue, Karpenter's role is denied
// ec2:DescribeInstanceStatus, and the router polls instance status itself. In shadow the
// takeover is not due: Karpenter keeps its own handling, and the item says so.
func takeover(r *Report, shadow bool) {
	status := map[string]Status{}
	for _, i := range *r {
		status[i.Check] = i.Status
	}
	rules, karpenter, router := status[CheckKarpenterRules], status[CheckKarpenterInstanceStatus], status[CheckRouterInstanceStatus]
	if shadow {
		if rules == OK || karpenter == OK {
			*r = append(*r, Item{Fail, CheckTakeover, "begun while the router is in shadow: Karpenter's own handling is (partly) off and the router acts on nothing",
				"finish the takeover and take the router out of shadow, or give Karpenter its rules and ec2:DescribeInstanceStatus back (docs/runbook.md)"})
			return
		}
		if rules != Fail || karpenter != Fail {
			// Not both seen on (the credentials failed, or a flag is missing): not checked, and
			// not said to pass.
			*r = append(*r, Item{Unknown, CheckTakeover, "cannot tell whether Karpenter keeps its own handling, as it must in shadow: Karpenter's rules or its role were not checked (above)",
				"fix what stopped the checks above, and pass --karpenter-queue-url and --karpenter-role-arn"})
			return
		}
		*r = append(*r, Item{OK, CheckTakeover, "not yet, as it should be in shadow: Karpenter keeps its rules and its instance-status poller", ""})
		return
	}
	switch {
	case rules == OK && karpenter == OK && router == OK:
		*r = append(*r, Item{OK, CheckTakeover, "complete: only the router decides queue events, scheduled events and impaired instances, and Karpenter acts on what it sends", ""})
	case karpenter == OK && router == Fail:
		*r = append(*r, Item{Fail, CheckTakeover, "lossy: Karpenter no longer polls instance status and the router does not either, so impaired instances are not replaced and scheduled events EventBridge misses are not acted on",
			"fix the router's instance-status poller (above)"})
	case router == Fail:
		*r = append(*r, Item{Fail, CheckTakeover, "incomplete: the router does not poll instance status (above)", "fix the router's instance-status poller, then deny Karpenter's role ec2:DescribeInstanceStatus and remove its rules"})
	case rules == Fail || karpenter == Fail:
		// Both act on each event Karpenter still gets: a drain twice is one drain, and nothing
		// is acted on by neither (docs/runbook.md step 4 orders it so).
		*r = append(*r, Item{Warn, CheckTakeover, "in progress: Karpenter's own handling still acts beside the router (its rules or its instance-status poller, above), so it drains at once what it gets, whatever the pools' policies say",
			"finish the takeover: deny Karpenter's role ec2:DescribeInstanceStatus, then remove its rules (docs/runbook.md step 4)"})
	default:
		*r = append(*r, Item{Unknown, CheckTakeover, "cannot tell: some checks above could not be made", "pass --karpenter-queue-url and --karpenter-role-arn"})
	}
}

// queue checks a queue is reachable, encrypted, and (for the intake) keeps messages long
// enough and redrives to a dead-letter queue. It returns the queue's ARN.
func (d *Doctor) queue(ctx context.Context, r *Report, name, url string, intake bool) string {
	if !d.queueURL(r, name, url) {
		return ""
	}
	out, err := d.sqs.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
	if err != nil {
		*r = append(*r, queueFailure(name, url, err))
		return ""
	}
	a := out.Attributes
	*r = append(*r, Item{OK, name, url + " is reachable", ""})
	if a["SqsManagedSseEnabled"] == "true" || a["KmsMasterKeyId"] != "" {
		*r = append(*r, Item{OK, name + " encryption", "server-side encryption on", ""})
	} else {
		*r = append(*r, Item{Fail, name + " encryption", "server-side encryption is off", "enable SSE-SQS or SSE-KMS (the Terraform module does)"})
	}
	if !intake {
		return a["QueueArn"]
	}
	if secs, _ := strconv.Atoi(a["MessageRetentionPeriod"]); secs < 4*24*3600 {
		*r = append(*r, Item{Warn, name + " retention", fmt.Sprintf("%ds: an event retried through a long outage (Kubernetes API, EC2) expires sooner", secs), "set 1209600 (14 days), the SQS maximum"})
	} else {
		*r = append(*r, Item{OK, name + " retention", a["MessageRetentionPeriod"] + "s", ""})
	}
	var redrive struct {
		DeadLetterTargetArn string `json:"deadLetterTargetArn"`
		MaxReceiveCount     any    `json:"maxReceiveCount"`
	}
	if a["RedrivePolicy"] == "" || json.Unmarshal([]byte(a["RedrivePolicy"]), &redrive) != nil {
		*r = append(*r, Item{Warn, name + " redrive", "no redrive policy: a message that crashes the router is retried forever", "add a redrive policy to the dead-letter queue with maxReceiveCount 100"})
	} else if n, _ := strconv.Atoi(fmt.Sprint(redrive.MaxReceiveCount)); n < 50 {
		*r = append(*r, Item{Fail, name + " redrive", fmt.Sprintf("maxReceiveCount %d: an event retried through an outage (each retry is a receive, backed off up to 5 min) would be moved to the dead-letter queue by SQS before it is carried out", n), "set maxReceiveCount to 100"})
	} else {
		*r = append(*r, Item{OK, name + " redrive", fmt.Sprintf("to %s after %d receives", redrive.DeadLetterTargetArn, n), ""})
	}
	return a["QueueArn"]
}

// queueURL checks that url is an SQS queue URL (no AWS call): a malformed one is told apart
// from one that does not answer. It reports whether the URL can be asked about.
func (d *Doctor) queueURL(r *Report, name, url string) bool {
	if url == "" {
		*r = append(*r, Item{Fail, name, "no URL given", "set the flag from the Terraform outputs"})
		return false
	}
	if _, err := awscalls.ParseQueueURL(url); err != nil {
		*r = append(*r, Item{Fail, name, "malformed: " + err.Error(), "give the queue's URL, https://sqs.<region>.amazonaws.com/<account>/<name> (the Terraform module's queue URL outputs)"})
		return false
	}
	return true
}

// queueFailure is the item of a queue SQS did not describe: unreachable, missing, denied, or
// refused credentials, each with its own fix.
func queueFailure(name, url string, err error) Item {
	switch awscalls.Classify(err) {
	case awscalls.Unreachable:
		return Item{Fail, name, fmt.Sprintf("%s is unreachable: no answer from SQS (%v)", url, err),
			"check --region and --aws-endpoint-url, DNS and the network path to SQS (a VPC endpoint in a private cluster)"}
	case awscalls.NotFound:
		return Item{Fail, name, fmt.Sprintf("%s does not exist (%v)", url, err),
			"create it (the Terraform module), or correct the URL: its account, region and name"}
	case awscalls.Denied:
		return Item{Fail, name, fmt.Sprintf("%s: access denied to these credentials (%v)", url, err),
			"grant the router's role sqs:GetQueueAttributes on it (and the queue policy, and kms:Decrypt on its key when SSE-KMS)"}
	case awscalls.Credentials:
		return Item{Fail, name, fmt.Sprintf("%s: AWS refused the credentials (%v)", url, err), "check the router's IRSA or Pod Identity role"}
	}
	return Item{Fail, name, fmt.Sprintf("%s could not be read, a transient error (%v)", url, err), "run doctor again"}
}

// rules checks that enabled EventBridge rules feed the intake queue with every kind.
func (d *Doctor) rules(ctx context.Context, r *Report, queueARN string) {
	names, err := d.ruleNames(ctx, queueARN)
	if err != nil {
		*r = append(*r, Item{Unknown, "EventBridge rules", fmt.Sprintf("cannot list rules: %v", err), "grant the router role events:ListRuleNamesByTarget and events:DescribeRule (read-only)"})
		return
	}
	covered := map[string]bool{}
	for _, n := range names {
		rule, err := d.events.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: aws.String(n)})
		if err != nil {
			*r = append(*r, Item{Unknown, "EventBridge rule " + n, err.Error(), ""})
			continue
		}
		if rule.State != "ENABLED" {
			*r = append(*r, Item{Fail, "EventBridge rule " + n, "targets the intake queue but is " + string(rule.State), "enable it"})
			continue
		}
		for _, dt := range detailTypes(aws.ToString(rule.EventPattern)) {
			if k, ok := kinds[dt]; ok {
				covered[k] = true
			}
		}
	}
	var missing []string
	for _, k := range kinds {
		if !covered[k] {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	missing = slices.Compact(missing) // a kind AWS sends under two names is missing once
	if len(missing) == 0 {
		*r = append(*r, Item{OK, "EventBridge rules", fmt.Sprintf("%d enabled rules feed the intake queue with every kind", len(names)), ""})
	} else {
		*r = append(*r, Item{Warn, "EventBridge rules", "no enabled rule feeds the intake queue with " + strings.Join(missing, ", "), "enable the kinds in the Terraform module's rules variable"})
	}
}

// karpenterRules warns when EventBridge rules still feed Karpenter's queue directly: Karpenter
// would then act on events the router defers or ignores.
func (d *Doctor) karpenterRules(ctx context.Context, r *Report, queueARN string) {
	names, err := d.ruleNames(ctx, queueARN)
	if err != nil {
		*r = append(*r, Item{Unknown, CheckKarpenterRules, fmt.Sprintf("cannot list rules: %v", err), "grant events:ListRuleNamesByTarget"})
		return
	}
	if len(names) == 0 {
		*r = append(*r, Item{OK, CheckKarpenterRules, "no rule feeds Karpenter's queue directly: only the router does", ""})
		return
	}
	*r = append(*r, Item{Fail, CheckKarpenterRules, rulesFeedKarpenter + strings.Join(names, ", "),
		"delete those rules, or re-point them at the router's intake queue (terraform/README.md, Karpenter side)"})
}

func (d *Doctor) ruleNames(ctx context.Context, arn string) ([]string, error) {
	var names []string
	p := eventbridge.ListRuleNamesByTargetInput{TargetArn: aws.String(arn)}
	for {
		out, err := d.events.ListRuleNamesByTarget(ctx, &p)
		if err != nil {
			return nil, err
		}
		names = append(names, out.RuleNames...)
		if aws.ToString(out.NextToken) == "" {
			return names, nil
		}
		p.NextToken = out.NextToken
	}
}

// describeInstanceStatus warns when Karpenter's role may still poll scheduled events.
func (d *Doctor) describeInstanceStatus(ctx context.Context, r *Report, roleARN string) {
	const check = CheckKarpenterInstanceStatus
	if roleARN == "" || d.iam == nil {
		*r = append(*r, Item{Unknown, check, "no --karpenter-role-arn given", "Karpenter v1.12+ polls scheduled events with DescribeInstanceStatus; deny it to its controller role (terraform: create_karpenter_deny_policy)"})
		return
	}
	out, err := d.iam.SimulatePrincipalPolicy(ctx, &iam.SimulatePrincipalPolicyInput{PolicySourceArn: aws.String(roleARN), ActionNames: []string{"ec2:DescribeInstanceStatus"}})
	if err != nil {
		*r = append(*r, Item{Unknown, check, fmt.Sprintf("cannot simulate %s: %v", roleARN, err), "run doctor with credentials allowed iam:SimulatePrincipalPolicy"})
		return
	}
	for _, res := range out.EvaluationResults {
		if res.EvalDecision == iamtypes.PolicyEvaluationDecisionTypeAllowed {
			*r = append(*r, Item{Fail, check, roleARN + karpenterMayPoll, "attach the deny policy (terraform: create_karpenter_deny_policy)"})
			return
		}
	}
	*r = append(*r, Item{OK, check, "denied to " + roleARN, ""})
}

// rbacNeeds are the verbs the router uses, as the chart grants them (deploy/charts/health-router/templates/clusterrole.yaml).
var rbacNeeds = []authv1.ResourceAttributes{
	{Verb: "list", Resource: "nodes"}, {Verb: "watch", Resource: "nodes"},
	{Verb: "list", Group: "karpenter.sh", Resource: "nodeclaims"}, {Verb: "watch", Group: "karpenter.sh", Resource: "nodeclaims"},
	{Verb: "get", Group: "karpenter.sh", Resource: "nodeclaims"}, {Verb: "patch", Group: "karpenter.sh", Resource: "nodeclaims"},
	{Verb: "delete", Group: "karpenter.sh", Resource: "nodeclaims"},
	{Verb: "list", Group: "karpenter.sh", Resource: "nodepools"}, {Verb: "watch", Group: "karpenter.sh", Resource: "nodepools"},
	{Verb: "list", Group: "karpenter.k8s.aws", Resource: "ec2nodeclasses"}, {Verb: "watch", Group: "karpenter.k8s.aws", Resource: "ec2nodeclasses"},
	{Verb: "list", Resource: "pods"},
	{Verb: "list", Group: "policy", Resource: "poddisruptionbudgets"}, {Verb: "watch", Group: "policy", Resource: "poddisruptionbudgets"},
	{Verb: "create", Group: "events.k8s.io", Resource: "events"},
	{Verb: "list", Group: record.Group, Resource: record.Resource}, {Verb: "watch", Group: record.Group, Resource: record.Resource},
	{Verb: "create", Group: record.Group, Resource: record.Resource}, {Verb: "update", Group: record.Group, Resource: record.Resource},
	{Verb: "delete", Group: record.Group, Resource: record.Resource},
}

// store checks that the API server serves the router's memory (the HealthRecord CRD, which the
// chart installs and upgrades): without it the router can record nothing, and refuses to run.
func (d *Doctor) store(ctx context.Context, r *Report) {
	var hrs record.HealthRecordList
	err := d.kube.List(ctx, &hrs, client.Limit(1))
	switch {
	case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
		*r = append(*r, Item{Fail, "store", "the API server does not serve " + record.CRDName + ": the router can record nothing", "install or upgrade the chart (deploy/charts/health-router), which installs the CRD"})
	case err != nil:
		*r = append(*r, Item{Unknown, "store", fmt.Sprintf("cannot list %s: %v", record.CRDName, err), ""})
	default:
		*r = append(*r, Item{OK, "store", record.CRDName + " is served (kubectl get healthrecords)", ""})
	}
}

// rbac asks the API server, as the router, whether it may do what it does.
func (d *Doctor) rbac(ctx context.Context, r *Report, namespace string) {
	needs := slices.Clone(rbacNeeds)
	if namespace != "" {
		needs = append(needs, authv1.ResourceAttributes{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace})
	}
	var missing []string
	for _, n := range needs {
		ra := n
		ssar := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}
		if err := d.kube.Create(ctx, ssar); err != nil {
			*r = append(*r, Item{Unknown, "RBAC", fmt.Sprintf("cannot review access: %v", err), ""})
			return
		}
		if !ssar.Status.Allowed {
			missing = append(missing, fmt.Sprintf("%s %s", n.Verb, qualified(n)))
		}
	}
	if len(missing) > 0 {
		*r = append(*r, Item{Fail, "RBAC", "the router may not " + strings.Join(missing, ", "), "install the chart (deploy/charts/health-router), whose RBAC grants them"})
		return
	}
	*r = append(*r, Item{OK, "RBAC", fmt.Sprintf("all %d permissions the router uses are granted", len(needs)), ""})
}

func qualified(a authv1.ResourceAttributes) string {
	if a.Group == "" {
		return a.Resource
	}
	return a.Resource + "." + a.Group
}

// gates compares the router's ReservedCapacity gate with Karpenter's (its FEATURE_GATES env).
func (d *Doctor) gates(ctx context.Context, r *Report, c Config) {
	const check = "feature gate ReservedCapacity"
	mine := c.Gates.Enabled(checks.ReservedCapacity)
	dep, problem := d.karpenterDeployment(ctx, c)
	if dep == nil {
		*r = append(*r, Item{Unknown, check, problem, "compare --feature-gates with Karpenter's settings.featureGates by hand, or " + deploymentFix})
		return
	}
	theirs := true // Karpenter's default
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		for _, e := range ctr.Env {
			if e.Name == "FEATURE_GATES" {
				for _, kv := range strings.Split(e.Value, ",") {
					if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k == string(checks.ReservedCapacity) {
						theirs, _ = strconv.ParseBool(v)
					}
				}
			}
		}
	}
	if mine != theirs {
		*r = append(*r, Item{Fail, check, fmt.Sprintf("router %v, Karpenter %v", mine, theirs), fmt.Sprintf("run the router with --feature-gates ReservedCapacity=%v", theirs)})
		return
	}
	*r = append(*r, Item{OK, check, fmt.Sprintf("%v, as Karpenter's", mine), ""})
}

// CheckKarpenterVersion compares the router's --karpenter-version with Karpenter's Deployment.
const CheckKarpenterVersion = "Karpenter version"

// karpenterVersion prints the Karpenter version the router assumes and compares it with what
// Karpenter's Deployment shows (its app.kubernetes.io/version label, else its controller's
// image tag), best-effort: the router does not read it itself, since a label or a tag may be
// missing, or a digest, or a mirror's own. It fails where the two fall on either side of a
// parser Karpenter gained (a capacity-reservation interruption, from v1.10): the router would
// then forward what Karpenter drops, or delete what it would parse.
func (d *Doctor) karpenterVersion(ctx context.Context, r *Report, c Config) {
	mine := c.KarpenterVersion
	fix := "set --karpenter-version (chart settings.karpenterVersion) to Karpenter's version"
	dep, problem := d.karpenterDeployment(ctx, c)
	if dep == nil {
		*r = append(*r, Item{Unknown, CheckKarpenterVersion, fmt.Sprintf("the router assumes Karpenter %s; %s", mine, problem), fix + ", or " + deploymentFix})
		return
	}
	theirs, from := deployedKarpenter(*dep)
	switch {
	case theirs.IsZero():
		*r = append(*r, Item{Unknown, CheckKarpenterVersion, fmt.Sprintf("the router assumes Karpenter %s; Karpenter's Deployment shows no version (%s)", mine, from), fix})
	case mine == theirs:
		*r = append(*r, Item{OK, CheckKarpenterVersion, fmt.Sprintf("%s, as Karpenter's %s", mine, from), ""})
	case signal.SameParsers(mine, theirs):
		*r = append(*r, Item{OK, CheckKarpenterVersion, fmt.Sprintf("the router assumes %s, Karpenter's %s says %s: the same interruption parsers", mine, from, theirs), ""})
	default:
		*r = append(*r, Item{Fail, CheckKarpenterVersion, fmt.Sprintf("the router assumes %s, Karpenter's %s says %s: they parse different kinds (a capacity-reservation interruption from v1.10)", mine, from, theirs),
			"run the router with --karpenter-version " + theirs.String()})
	}
}

// deploymentFix is what to do when doctor cannot find Karpenter's Deployment.
const deploymentFix = "pass --karpenter-namespace and --karpenter-deployment (chart settings.karpenterNamespace, settings.karpenterDeployment)"

// karpenterLabel is the label Karpenter's chart puts on its Deployment.
var karpenterLabel = client.MatchingLabels{"app.kubernetes.io/name": "karpenter"}

// karpenterDeployment reads Karpenter's Deployment: by its name first (the chart grants the
// router's ServiceAccount `get` on that one Deployment only, so that doctor in the router's pod
// can read it), then, where no Deployment has that name or the name cannot be read, the first
// one labelled as Karpenter's chart labels it (a user running doctor with wider rights, a
// Deployment named otherwise). nil, with what went wrong, when neither finds it.
func (d *Doctor) karpenterDeployment(ctx context.Context, c Config) (*appsv1.Deployment, string) {
	name := cmp.Or(c.KarpenterDeployment, "karpenter")
	dep := &appsv1.Deployment{}
	getErr := d.kube.Get(ctx, client.ObjectKey{Namespace: c.KarpenterNamespace, Name: name}, dep)
	if getErr == nil {
		return dep, ""
	}
	byName := "no Deployment " + c.KarpenterNamespace + "/" + name
	if !apierrors.IsNotFound(getErr) {
		byName = fmt.Sprintf("cannot read Karpenter's Deployment %s/%s (%v)", c.KarpenterNamespace, name, getErr)
	}
	var deps appsv1.DeploymentList
	if err := d.kube.List(ctx, &deps, client.InNamespace(c.KarpenterNamespace), karpenterLabel); err != nil {
		return nil, fmt.Sprintf("%s, nor list those labelled app.kubernetes.io/name=karpenter (%v)", byName, err)
	}
	if len(deps.Items) == 0 {
		return nil, fmt.Sprintf("%s, and none labelled app.kubernetes.io/name=karpenter in %s", byName, c.KarpenterNamespace)
	}
	return &deps.Items[0], ""
}

// deployedKarpenter reads the version of Karpenter's Deployment and says where it read it.
func deployedKarpenter(dep appsv1.Deployment) (signal.KarpenterVersion, string) {
	if l := dep.Labels["app.kubernetes.io/version"]; l != "" {
		if v, err := signal.ParseKarpenterVersion(l); err == nil {
			return v, "label app.kubernetes.io/version " + l
		}
	}
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		image, _, _ := strings.Cut(ctr.Image, "@") // a digest names no version
		if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
			if v, err := signal.ParseKarpenterVersion(image[i+1:]); err == nil {
				return v, "image " + image
			}
		}
	}
	return signal.KarpenterVersion{}, "neither a version label nor a versioned image tag"
}

// detailTypes reads the detail-type list of an EventBridge pattern.
func detailTypes(pattern string) []string {
	var p struct {
		DetailType []string `json:"detail-type"`
	}
	if err := json.Unmarshal([]byte(pattern), &p); err != nil {
		return nil
	}
	return p.DetailType
}
