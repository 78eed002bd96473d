// Package sim is a deterministic simulation of the whole router: the real pipeline, engine,
// pacer, signaller, deferral controller, poller and intake, on a fake clock, over
// controller-runtime's in-memory API server (the fake client, with faults injected at the
// client's interceptor) and in-memory AWS stand-ins at the SDK interfaces the router already
// has (SQS for the intake, Karpenter's queue and the dead-letter queue; EC2's
// DescribeInstanceStatus for the poller). A rapid state machine drives it from one seeded
// random sequence: AWS Health and poller reports of one maintenance in any order, reschedules
// and cancellations, state changes out of order, Spot warnings, impaired and recovered
// instances, redeliveries, API faults, Karpenter replacing NodeClaims, crashes and leader
// changes, and time jumping across windows and deadlines. After every step the invariants
// are checked against a reference model (model.go) written apart from the code under test.
package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/deferral"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/test/harness"
)

// Start is the simulation's epoch: a Friday, so windows (Saturday 02:00) come within a day.
var Start = time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC)

// Pools of the simulated cluster and their policies.
const (
	PoolKafka = "kafka" // defer to a Saturday window, one drain at a time; scheduled events moved into the window; system reboots kept in place
	PoolWeb   = "web"   // Karpenter's behaviour; repair cut-off 20%
	PoolBatch = "batch" // ignore everything
	// PoolShadow has kafka's policy in shadow (healthrouter.io/mode=shadow) on the active
	// router: everything is decided and recorded as would-be, and Karpenter's behaviour carried
	// out for it (Karpenter's rules no longer feed it): no deferral to the window, move at EC2,
	// reboot in place, taint or cordon, ever; drains as web's. ShadowMode switches it to an
	// active policy of its own (PoolShadowActive) and back.
	PoolShadow = "shadow"
)

// simCluster is the cluster name the router's EC2 event windows carry.
const simCluster = "sim"

// shadowPoolSize is the shadow pool's nodes: few, it only has to be reached.
const shadowPoolSize = 2

// PoolAnnotations are the NodePools' annotations. kafka's window is 6 h: its EC2 event window
// leaves the leads of what the router does before AWS's start (drain-lead 1h, a reboot in place
// emptied 2h10m ahead), and from a 4 h window that left EC2 2 h a week, under its 4 h.
var PoolAnnotations = map[string]map[string]string{
	PoolKafka: {policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "6h",
		policy.AnnotationMaxConcurrentDrains: "1", policy.AnnotationDrainLead: "1h", policy.AnnotationTaintUpcoming: "true", policy.AnnotationReschedule: "true",
		policy.ScheduledActionKey(event.ScheduledSystemReboot): string(policy.ActionRebootInPlace), policy.AnnotationEventWindow: "true"},
	PoolWeb:   {policy.AnnotationUrgentDrainMax: "2"},
	PoolBatch: {policy.AnnotationAction: "ignore"},
	PoolShadow: {policy.AnnotationMode: policy.ModeShadow, policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "6h",
		policy.AnnotationMaxConcurrentDrains: "1", policy.AnnotationDrainLead: "1h", policy.AnnotationTaintUpcoming: "true", policy.AnnotationReschedule: "true",
		policy.ScheduledActionKey(event.ScheduledSystemReboot): string(policy.ActionRebootInPlace), policy.AnnotationEventWindow: "true"},
}

// PoolShadowActive is the shadow pool's annotations while ShadowMode has it active: a deferral
// to the window, nothing kafka's policy does at EC2 or in place (the model judges the pool's
// drains as web's in either mode: a maintenance, a Spot warning, a stop or an impairment
// allows one, a closed maintenance never).
var PoolShadowActive = map[string]string{policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "6h",
	policy.AnnotationDrainLead: "1h"}

// PoolSize is the number of nodes each pool keeps (Karpenter replaces what it drains).
const PoolSize = 5

const (
	queueURL     = "https://sqs.eu-west-1.amazonaws.com/111122223333/intake"
	dlqURL       = "https://sqs.eu-west-1.amazonaws.com/111122223333/intake-dlq"
	karpenterURL = "https://sqs.eu-west-1.amazonaws.com/111122223333/karpenter"
	// UnmanagedNode is a managed node group's node: a Node with no NodeClaim.
	UnmanagedNode     = "ng-node-0"
	UnmanagedInstance = "i-0ffffffffffff0001"
	maxReceives       = 8
)

// message is one SQS message of the stand-in queue.
type message struct {
	id, body   string
	receives   int
	visibleAt  time.Time
	handle     string
	attributes map[string]sqstypes.MessageAttributeValue
}

// queues is the in-memory SQS: the intake queue, its dead-letter queue and Karpenter's
// queue, with visibility and receive counts on the fake clock.
type queues struct {
	mu        sync.Mutex
	clock     *clocktesting.FakeClock
	intake    []*message
	dlq       []*message
	karpenter []string
	seq       int
	down      bool // SQS unreachable
	// failAfterReceive: SQS becomes unreachable once it has handed a batch out (the deletes,
	// dead letters and forwards of that batch fail; its messages come back).
	failAfterReceive bool
	onForward        func(instance, leadership string)
}

func (q *queues) ReceiveMessage(_ context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	now := q.clock.Now()
	var out []sqstypes.Message
	for _, m := range q.intake {
		if len(out) == int(in.MaxNumberOfMessages) {
			break
		}
		if now.Before(m.visibleAt) {
			continue
		}
		m.receives++
		q.seq++
		m.handle = m.id + "/" + strconv.Itoa(q.seq)
		m.visibleAt = now.Add(time.Duration(in.VisibilityTimeout) * time.Second)
		out = append(out, sqstypes.Message{MessageId: aws.String(m.id), Body: aws.String(m.body), ReceiptHandle: aws.String(m.handle),
			Attributes: map[string]string{string(sqstypes.MessageSystemAttributeNameApproximateReceiveCount): strconv.Itoa(m.receives)}})
	}
	q.down = q.failAfterReceive && len(out) > 0
	return &sqs.ReceiveMessageOutput{Messages: out}, nil
}

func (q *queues) find(handle *string) *message {
	for _, m := range q.intake {
		if m.handle == aws.ToString(handle) {
			return m
		}
	}
	return nil
}

func (q *queues) DeleteMessage(_ context.Context, in *sqs.DeleteMessageInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	for i, m := range q.intake {
		if m.handle == aws.ToString(in.ReceiptHandle) {
			q.intake = append(q.intake[:i], q.intake[i+1:]...)
			return &sqs.DeleteMessageOutput{}, nil
		}
	}
	return nil, fmt.Errorf("receipt handle %s is stale", aws.ToString(in.ReceiptHandle))
}

func (q *queues) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	q.mu.Lock()
	down := q.down
	q.mu.Unlock()
	if down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	out := &sqs.DeleteMessageBatchOutput{}
	for _, e := range in.Entries {
		if _, err := q.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: in.QueueUrl, ReceiptHandle: e.ReceiptHandle}); err != nil {
			out.Failed = append(out.Failed, sqstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("ReceiptHandleIsInvalid"), Message: aws.String(err.Error()), SenderFault: true})
			continue
		}
		out.Successful = append(out.Successful, sqstypes.DeleteMessageBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

func (q *queues) ChangeMessageVisibility(_ context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	if m := q.find(in.ReceiptHandle); m != nil {
		m.visibleAt = q.clock.Now().Add(time.Duration(in.VisibilityTimeout) * time.Second)
		return &sqs.ChangeMessageVisibilityOutput{}, nil
	}
	return nil, fmt.Errorf("receipt handle %s is stale", aws.ToString(in.ReceiptHandle))
}

func (q *queues) SendMessage(_ context.Context, in *sqs.SendMessageInput, _ ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	if aws.ToString(in.QueueUrl) != dlqURL {
		return nil, fmt.Errorf("the router sends to the dead-letter queue only, not %s", aws.ToString(in.QueueUrl))
	}
	q.dlq = append(q.dlq, &message{body: aws.ToString(in.MessageBody), attributes: in.MessageAttributes})
	return &sqs.SendMessageOutput{MessageId: aws.String("dlq")}, nil
}

// sender is one replica's SQS client for Karpenter's queue: its forwards are told with the
// leadership that sent them.
type sender struct {
	q *queues
	r *replica
}

func (s sender) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	return s.q.sendBatch(in, s.r.name+"/"+strconv.Itoa(int(s.r.leads.Load())))
}

func (q *queues) sendBatch(in *sqs.SendMessageBatchInput, leadership string) (*sqs.SendMessageBatchOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		return nil, fmt.Errorf("sqs unreachable")
	}
	out := &sqs.SendMessageBatchOutput{}
	for _, e := range in.Entries {
		q.karpenter = append(q.karpenter, aws.ToString(e.MessageBody))
		if q.onForward != nil {
			q.onForward(instanceOf(aws.ToString(e.MessageBody)), leadership)
		}
		out.Successful = append(out.Successful, sqstypes.SendMessageBatchResultEntry{Id: e.Id, MessageId: e.Id})
	}
	return out, nil
}

func (q *queues) send(body string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	q.intake = append(q.intake, &message{id: "m" + strconv.Itoa(q.seq), body: body})
}

// ec2Status is the in-memory EC2 DescribeInstanceStatus (scheduled events and impairments) and
// ModifyInstanceEventStartTime (EC2's bounds: a deadline, not within 5 minutes of the start,
// the new start an hour ahead at least and not past the deadline).
type ec2Status struct {
	mu       sync.Mutex
	clock    *clocktesting.FakeClock
	events   map[string][]ec2types.InstanceStatusEvent
	impaired map[string]time.Time
	// stopped is each instance a stop (with no start after it) left stopped: EC2 shows it
	// stopped; every other instance runs.
	stopped  map[string]bool
	down     bool
	rebooted []string // instances RebootInstances asked for, since the last pass
	// onMove observes every move EC2 accepted (mu held).
	onMove func(instance, eventID string, code event.ScheduledType, from, to time.Time)
	// migration is each instance's reboot-migration setting and how EC2's migration of it goes
	// (none: EC2 shows no rebootMigration, the instance does not support it).
	migration map[string]migrationOpt
	// cleared is the start each event a reboot migration cleared had, by event ID.
	cleared map[string]time.Time
	// onReboot observes every RebootInstances EC2 carried out (mu not held).
	onReboot func(rebootCall)
}

// migrationOpt is an instance's maintenanceOptions.rebootMigration, which its owner may change
// at any time (ModifyInstanceMaintenanceOptions), and how a migration of it goes: EC2's
// documentation says that, with "default", a reboot the owner starts with a system-reboot
// scheduled moves the instance to new hardware and clears the event, and that when the
// migration is not possible the reboot is in place and the event remains.
type migrationOpt struct {
	state ec2types.InstanceRebootMigrationState // "": EC2 shows none
	fails bool                                  // the migration is not possible: the event remains
	// completed: a cleared event shows as [Completed] for a while, rather than going from
	// DescribeInstanceStatus at once.
	completed bool
}

// rebootCall is one instance EC2 rebooted at the router's request: the open reboot-type
// events EC2 showed for it at the call, and the one the reboot migration cleared ("" none).
type rebootCall struct {
	instance string
	open     []ec2types.InstanceStatusEvent
	migrated string
}

func (e *ec2Status) ModifyInstanceEventStartTime(_ context.Context, in *ec2.ModifyInstanceEventStartTimeInput, _ ...func(*ec2.Options)) (*ec2.ModifyInstanceEventStartTimeOutput, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		return nil, fmt.Errorf("RequestLimitExceeded")
	}
	id, eid, to := aws.ToString(in.InstanceId), aws.ToString(in.InstanceEventId), aws.ToTime(in.NotBefore)
	now := e.clock.Now()
	for i, ev := range e.events[id] {
		if aws.ToString(ev.InstanceEventId) != eid {
			continue
		}
		from := aws.ToTime(ev.NotBefore)
		switch {
		case ev.NotBeforeDeadline == nil, strings.HasPrefix(aws.ToString(ev.Description), "["), !from.After(now.Add(5 * time.Minute)),
			to.Before(now.Add(time.Hour)), to.After(aws.ToTime(ev.NotBeforeDeadline)):
			return nil, &smithy.GenericAPIError{Code: "InvalidInstanceEventStartTime", Message: "the event cannot move there"}
		}
		ev.NotBefore = aws.Time(to)
		if ev.NotAfter != nil {
			ev.NotAfter = aws.Time(aws.ToTime(ev.NotAfter).Add(to.Sub(from)))
		}
		e.events[id][i] = ev
		if e.onMove != nil {
			e.onMove(id, eid, event.ScheduledType(ev.Code), from, to)
		}
		return &ec2.ModifyInstanceEventStartTimeOutput{Event: &ev}, nil
	}
	return nil, &smithy.GenericAPIError{Code: "InvalidInstanceEventIDNotFound", Message: "no such event"}
}

// current returns the start EC2 holds for an instance's open event eid (mu held).
func (e *ec2Status) current(instance, eid string) (time.Time, bool) {
	for _, ev := range e.events[instance] {
		if aws.ToString(ev.InstanceEventId) == eid && !strings.HasPrefix(aws.ToString(ev.Description), "[") {
			return aws.ToTime(ev.NotBefore), true
		}
	}
	return time.Time{}, false
}

// held returns the start EC2 holds, or held last, for an instance's event eid, open or not:
// a cancelled or completed event keeps its start, a cleared one (a reboot migration) the
// start it had (mu held).
func (e *ec2Status) held(instance, eid string) (time.Time, bool) {
	for _, ev := range e.events[instance] {
		if aws.ToString(ev.InstanceEventId) == eid {
			return aws.ToTime(ev.NotBefore), true
		}
	}
	at, ok := e.cleared[eid]
	return at, ok
}

func (e *ec2Status) DescribeInstanceStatus(_ context.Context, in *ec2.DescribeInstanceStatusInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		return nil, fmt.Errorf("RequestLimitExceeded")
	}
	out := &ec2.DescribeInstanceStatusOutput{}
	for _, id := range in.InstanceIds {
		st := ec2types.InstanceStatus{InstanceId: aws.String(id), Events: e.events[id],
			InstanceStatus: &ec2types.InstanceStatusSummary{Status: ec2types.SummaryStatusOk},
			SystemStatus:   &ec2types.InstanceStatusSummary{Status: ec2types.SummaryStatusOk}}
		if aws.ToBool(in.IncludeAllInstances) {
			// Every instance the simulation names runs, but for one a stop left stopped: a
			// shutting-down it is sent is forged, and a stop followed by a start is over.
			st.InstanceState = &ec2types.InstanceState{Name: ec2types.InstanceStateNameRunning}
			if e.stopped[id] {
				st.InstanceState.Name = ec2types.InstanceStateNameStopped
			}
		}
		if since, ok := e.impaired[id]; ok {
			st.SystemStatus = &ec2types.InstanceStatusSummary{Status: ec2types.SummaryStatusImpaired,
				Details: []ec2types.InstanceStatusDetails{{Name: ec2types.StatusNameReachability, Status: ec2types.StatusTypeFailed, ImpairedSince: aws.Time(since)}}}
		}
		out.InstanceStatuses = append(out.InstanceStatuses, st)
	}
	return out, nil
}

// faults makes the API server fail the router's requests while on.
type faults struct {
	mu       sync.Mutex
	apiDown  bool
	conflict int // the next n writes conflict
}

func (f *faults) check(write bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.apiDown {
		return apierrors.NewServiceUnavailable("simulated API outage")
	}
	if write && f.conflict > 0 {
		f.conflict--
		return apierrors.NewConflict(schema.GroupResource{Group: "karpenter.sh", Resource: "nodeclaims"}, "simulated", fmt.Errorf("the object has been modified"))
	}
	return nil
}

// replica is one router process: its own in-memory state over the shared API and AWS.
type replica struct {
	name string
	// cordonDrainOff: started without --unmanaged-nodes=cordon-drain (world.cordonDrainOff).
	cordonDrainOff bool
	counted        bool // its breaker holds are in world.urgentHolds
	pipeline       *pipeline.Pipeline
	ctrl           *deferral.Controller
	marks          *upcoming.Controller
	inPlace        *inplace.Runner
	drainer        *nodedrain.Drainer
	poller         *poller.Poller
	intake         *intake.Intake
	metrics        *metrics.Router
	cancel         context.CancelFunc
	due            map[string]time.Time // NodeClaim -> when the controller's workqueue hands it back
	seen           map[string]string    // NodeClaim -> the resourceVersion last reconciled (the watch)
	marked         map[string]string    // NodeClaim -> its and its Node's resourceVersions at the marks' last pass
	sig            *signal.Signaller
	ledger         *shadow.Ledger
	windows        *eventwindow.Manager
	watcher        *shadow.Watcher
	mu             sync.Mutex
	held           int // instances whose Events this replica held back (its metric)
	// leads counts the times this process became the leader: one leadership is this process
	// between its election and its loss of the lease.
	leads atomic.Int64
	told  int // of them, told in its summaries
}

// world is the simulated cluster, AWS and router replicas.
type world struct {
	// urgentHolds counts the urgent drains the stopped replicas' breakers held; contradicted
	// the urgent state changes EC2 contradicted.
	urgentHolds, contradicted atomic.Int64
	// cordonDrainOff is how the next replica is started: without
	// --unmanaged-nodes=cordon-drain (it begins no drain of the unmanaged node, and carries on
	// the one an earlier leader began).
	cordonDrainOff bool
	clock          *clocktesting.FakeClock
	store          client.Client // the API server as the world (the kubelet, Karpenter) sees it
	router         client.Client // the router's cache and writes: lagging, trimmed, faults injected
	direct         client.Client // the router's reads from the API server itself: faults injected
	cache          *lagCache
	faults         *faults
	queues         *queues
	ec2            *ec2Status
	// windows is EC2's event windows and instance tags (test/harness's stand-in, EC2's Query
	// protocol through the real SDK client windowsAPI); stopWindows closes it.
	windows     *harness.EC2EventWindows
	windowsAPI  *ec2.Client
	stopWindows func()
	mode        signal.Mode
	leader      *replica
	standby     *replica
	// zombie is the old leader after a failover, still acting until it notices it lost the
	// lease (endOverlap): its intake and controllers run beside the new leader's.
	zombie   *replica
	budgets  *budgets
	recorder *summaryRecorder
	told     int // instances the replicas' summaries told of, over the run
	log      *slog.Logger
	nextInst int
	// onOverlapEnd observes an old leader that acted beside the new one stopping.
	onOverlapEnd func()
	// onDrain observes every drain the router signals (a NodeClaim DELETE, or a forward);
	// onGone every instance Karpenter terminated; onLaunch every node it launched.
	onDrain  func(instance string)
	onGone   func(instance string)
	onLaunch func(instance, pool string)
	// onInPlace observes every reboot in place the router begins; onCordon every drain of the
	// unmanaged node it begins.
	onInPlace func(instance string, ev event.Event)
	onCordon  func(instance string)
	boots     int
}

// stamped reports whether the API server's HealthRecord that obj writes holds the router's
// drain (false for other objects).
func (w *world) stamped(ctx context.Context, c client.Client, obj client.Object) bool {
	if _, ok := obj.(*record.HealthRecord); !ok {
		return false
	}
	m, err := record.Load(ctx, c, obj.GetName())
	return err == nil && m.Drain != nil
}

// noteStamp tells of a drain the router stamped on a NodeClaim (had: stamped before the
// write): the stamp commits the drain (write-ahead), and the router's fallback deletes the
// NodeClaim past the confirmation bound if the send or the DELETE after it failed, so the drain
// is judged when it is stamped, not when the fallback carries it out.
func (w *world) noteStamp(ctx context.Context, c client.Client, obj client.Object, had bool) {
	if had || w.onDrain == nil || !w.stamped(ctx, c, obj) {
		return
	}
	cur := &karpv1.NodeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Name: obj.GetName()}, cur); err == nil {
		w.onDrain(cluster.InstanceID(cur.Status.ProviderID))
	}
}

// newWorldWith builds the cluster and the two replicas; onLaunch sees every node from the first.
func newWorldWith(mode signal.Mode, onLaunch func(instance, pool string)) (*world, error) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	clk := clocktesting.NewFakeClock(Start)
	w := &world{clock: clk, faults: &faults{}, queues: &queues{clock: clk}, mode: mode, cache: newLagCache(clk),
		ec2:      &ec2Status{clock: clk, events: map[string][]ec2types.InstanceStatusEvent{}, impaired: map[string]time.Time{}, migration: map[string]migrationOpt{}, cleared: map[string]time.Time{}},
		recorder: &summaryRecorder{}, log: simLog(), onLaunch: onLaunch}
	w.windows, w.windowsAPI, w.stopWindows = harness.StartEC2EventWindows()
	b := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&karpv1.NodeClaim{})
	for _, ix := range cluster.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	b = b.WithIndex(&record.HealthRecord{}, deferral.IndexHeldOn, deferral.HeldOn)
	w.store = b.Build()
	// Two views of one API server for the router: its cache (lagging, trimmed) and its
	// direct reads; faults are injected in both.
	write := func(ctx context.Context, c client.WithWatch, obj client.Object) error {
		if err := w.faults.check(true); err != nil {
			return err
		}
		w.cache.written(ctx, c, obj)
		return nil
	}
	w.router = interceptor.NewClient(w.store.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := w.faults.check(false); err != nil {
				return err
			}
			return w.cache.get(ctx, c, key, obj)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := w.faults.check(false); err != nil {
				return err
			}
			return w.cache.list(ctx, c, list, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := write(ctx, c, obj); err != nil {
				return err
			}
			had := w.stamped(ctx, c, obj)
			if err := c.Patch(ctx, obj, patch, opts...); err != nil {
				return err
			}
			w.noteStamp(ctx, c, obj, had)
			return nil
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := write(ctx, c, obj); err != nil {
				return err
			}
			had := w.stamped(ctx, c, obj)
			if err := c.Update(ctx, obj, opts...); err != nil {
				return err
			}
			w.noteStamp(ctx, c, obj, had)
			return nil
		},
		// The router's memory is a HealthRecord, created on its first write: its drain is the
		// stamp (updates go through Update above).
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := write(ctx, c, obj); err != nil {
				return err
			}
			if err := c.Create(ctx, obj, opts...); err != nil {
				return err
			}
			w.noteStamp(ctx, c, obj, false)
			return nil
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if err := write(ctx, c, obj); err != nil {
				return err
			}
			if nc, ok := obj.(*karpv1.NodeClaim); ok && w.onDrain != nil {
				cur := &karpv1.NodeClaim{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(nc), cur); err == nil && cur.DeletionTimestamp.IsZero() {
					w.onDrain(cluster.InstanceID(cur.Status.ProviderID))
				}
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	w.direct = interceptor.NewClient(w.store.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := w.faults.check(false); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := w.faults.check(false); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
	})
	ctx := context.Background()
	for _, pool := range []string{PoolKafka, PoolWeb, PoolBatch, PoolShadow} {
		if err := w.store.Create(ctx, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: pool, Annotations: PoolAnnotations[pool]}}); err != nil {
			return nil, err
		}
		size := PoolSize
		if pool == PoolShadow {
			size = shadowPoolSize
		}
		for i := 0; i < size; i++ {
			if _, err := w.addNode(ctx, pool); err != nil {
				return nil, err
			}
		}
	}
	if err := w.store.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: UnmanagedNode, Labels: map[string]string{"eks.amazonaws.com/nodegroup": "system"}},
		Spec:   corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + UnmanagedInstance},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}); err != nil {
		return nil, err
	}
	w.budgets = &budgets{w: w, refuses: map[string]int{}}
	w.leader = w.newReplica("a")
	w.standby = w.newReplica("b")
	return w, nil
}

// addNode is Karpenter launching a node of pool: a NodeClaim and its Node.
func (w *world) addNode(ctx context.Context, pool string) (string, error) {
	w.nextInst++
	id := fmt.Sprintf("i-0a1b2c3d4e5f%05x", w.nextInst)
	name := fmt.Sprintf("%s-%d", pool, w.nextInst)
	pid := "aws:///eu-west-1a/" + id
	labels := map[string]string{karpv1.NodePoolLabelKey: pool}
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Finalizers: []string{"karpenter.sh/termination"}}}
	if err := w.store.Create(ctx, nc); err != nil {
		return "", err
	}
	nc.Status = karpv1.NodeClaimStatus{ProviderID: pid, NodeName: name}
	if err := w.store.Status().Update(ctx, nc); err != nil {
		return "", err
	}
	if err := w.store.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid},
		Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: "boot-0"},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(w.clock.Now())}}}}); err != nil {
		return "", err
	}
	w.windows.AddInstance(id, map[string]string{karpv1.NodePoolLabelKey: pool})
	if w.onLaunch != nil {
		w.onLaunch(id, pool)
	}
	return id, nil
}

// newReplica builds a router process's components over the shared API and AWS, as app.Run
// wires them (one instance-parallelism so that one seed is one interleaving).
func (w *world) newReplica(name string) *replica {
	reg := prometheus.NewRegistry()
	r := &replica{name: name, due: map[string]time.Time{}, seen: map[string]string{}, marked: map[string]string{}}
	r.metrics = metrics.NewRouter(reg, func() float64 { return r.ctrl.Deferred() })
	unmanaged := policy.UnmanagedCordonDrain
	if w.cordonDrainOff {
		unmanaged = policy.UnmanagedIgnore
	}
	r.cordonDrainOff = w.cordonDrainOff
	eng := engine.New(cluster.New(w.router), nil, engine.WithUnmanaged(unmanaged))
	sig := signal.New(w.router, w.direct, w.mode, sender{w.queues, r}, karpenterURL, w.recorder, w.clock)
	sig.OnUnreadable(r.metrics.RecordsUnreadable.Inc)
	sig.SetInstanceEventRate(instanceEventsPerSecond, func(string) { r.mu.Lock(); r.held++; r.mu.Unlock() })
	r.sig = sig
	r.inPlace = inplace.New(w.router, w.direct, w.budgets, w.ec2, w.clock, w.recorder, w.log, nil,
		func(ctx context.Context, nc *karpv1.NodeClaim, _ inplace.State, _ string) error {
			return sig.Replace(ctx, nc)
		}, inplace.Options{})
	r.pipeline = pipeline.New(eng, sig, r.metrics, nil, w.clock, w.log, 1).WithRescheduler(reschedule.NewEvents(w.ec2)).WithInPlace(beginHook{r.inPlace, w}).
		WithFreshReads(w.direct).WithStateConfirmation(w.ec2)
	// The managed node group's node is cordoned and drained by the router itself
	// (--unmanaged-nodes=cordon-drain); it runs no pods here (the evictions are the real
	// drain helper's, over a clientset that holds none).
	// Without it (a restart with the feature off) no drain begins, and one an earlier leader
	// began is carried to its end.
	r.drainer = nodedrain.New(w.router, w.direct, k8sfake.NewSimpleClientset(), w.clock, w.recorder, w.log, nodedrain.Options{Off: r.cordonDrainOff})
	if r.cordonDrainOff {
		r.pipeline.WithNodeDrainerHeld(drainHook{r.drainer, w})
	} else {
		r.pipeline.WithNodeDrainer(drainHook{r.drainer, w})
	}
	r.ledger = shadow.NewLedger(record.NewStore(w.direct, w.direct), w.direct, "health-router", shadow.DefaultLedgerName, w.clock, w.log)
	r.watcher = shadow.NewWatcher(w.direct, r.ledger, r.metrics.ShadowKarpenter)
	r.pipeline.WithShadow(false, r.ledger)
	r.windows = eventwindow.New(w.router, w.windowsAPI, w.recorder, w.clock, w.log, reg, simCluster).WithInPlaceLead(inplace.Options{}.PrepareLead())
	r.ctrl = deferral.New(w.router, r.pipeline, eng, sig, r.metrics, w.clock, w.log, 20*time.Second)
	r.marks = upcoming.New(w.router, w.direct, w.router, w.log, nil)
	r.poller = poller.New(w.ec2, poller.NewClusterInstances(w.router), r.pipeline, w.clock, w.log, reg, poller.Options{Account: "111122223333", Region: "eu-west-1"}).WithHeldImpaired(r.ctrl).WithHeldImpaired(r.drainer).WithImpairedReport(eng.ReportImpaired)
	r.intake = intake.New(intake.Config{QueueURL: queueURL, DeadLetterQueueURL: dlqURL, Account: "111122223333", Region: "eu-west-1",
		Workers: 1, Visibility: 30 * time.Second, HandleTimeout: time.Minute, MaxReceives: maxReceives}, w.queues, r.pipeline, r.metrics, nil, w.clock, w.log)
	return r
}

// lead makes r the elected leader (its controller's Start runs until it loses the lease).
func (w *world) lead(r *replica) {
	r.leads.Add(1)
	clear(r.marked) // a new leader's controllers start from a full list
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	started := make(chan struct{})
	go func() {
		close(started)
		_ = r.ctrl.Start(ctx)
	}()
	<-started
	for !r.ctrl.Leading() {
		time.Sleep(time.Millisecond)
	}
}

func (w *world) stop(r *replica) {
	if r.cancel != nil {
		r.cancel()
		for r.ctrl.Leading() {
			time.Sleep(time.Millisecond)
		}
	}
	if !r.counted && r.metrics != nil {
		r.counted = true
		w.urgentHolds.Add(int64(testutil.ToFloat64(r.metrics.GateHolds.WithLabelValues(string(policy.HoldUrgentBreaker)))))
		w.contradicted.Add(int64(testutil.ToFloat64(r.metrics.StateConfirmations.WithLabelValues(pipeline.StateContradicted))))
	}
}

// deliver receives up to n messages and processes them one at a time, as the intake's
// workers do.
func (w *world) deliver(ctx context.Context, n int) (int, error) {
	out, err := w.queues.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: int32(n), VisibilityTimeout: 30})
	if err != nil {
		return 0, nil // an SQS outage: nothing received, the loop waits and tries again
	}
	for _, m := range out.Messages {
		w.leader.intake.Process(ctx, m)
	}
	return len(out.Messages), nil
}

// reconcile plays controller-runtime's workqueue for the leader's deferral controller: every
// NodeClaim the controller watches (a record or a stamp) whose requeue time has come, and
// every NodeClaim a release woke; then the periodic recheck of paced pools.
func (w *world) reconcile(ctx context.Context) error {
	if z := w.zombie; z != nil {
		// The old leader has not noticed yet that it lost the lease: its controllers act
		// once more, beside the new leader's.
		if err := w.reconcileReplica(ctx, z); err != nil {
			return err
		}
	}
	if err := w.reconcileReplica(ctx, w.leader); err != nil {
		return err
	}
	return w.reconcileMarks(ctx)
}

// reconcileReplica plays one replica's leader-only controllers: deferrals, releases, reboots
// in place, drains of unmanaged nodes.
func (w *world) reconcileReplica(ctx context.Context, r *replica) error {
	woken := map[string]bool{}
	for drained := false; !drained; {
		select {
		case ev := <-r.ctrl.Wakes():
			woken[ev.Object.GetName()] = true
		default:
			drained = true
		}
	}
	// The controller watches the HealthRecords (and its NodeClaim's deletion, which the
	// version of the pair shows).
	var hrs record.HealthRecordList
	if err := w.store.List(ctx, &hrs); err != nil {
		return err
	}
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	claimVersion := map[string]string{}
	for _, nc := range claims.Items {
		claimVersion[nc.Name] = nc.ResourceVersion
		if !nc.DeletionTimestamp.IsZero() {
			claimVersion[nc.Name] += "/deleting"
		}
	}
	now := w.clock.Now()
	names := make([]string, 0, len(hrs.Items))
	versions := map[string]string{}
	for _, hr := range hrs.Items {
		if !hr.OfClaim() {
			continue // the watch's predicate (record.OfClaims): a Node's record or the ledger is not a NodeClaim's
		}
		v := hr.ResourceVersion + "/" + claimVersion[hr.Name]
		versions[hr.Name] = v
		// The watch hands a changed record over at once; otherwise its requeue time decides.
		if at, ok := r.due[hr.Name]; ok && now.Before(at) && !woken[hr.Name] && r.seen[hr.Name] == v {
			continue
		}
		names = append(names, hr.Name)
	}
	sort.Strings(names)
	for _, name := range names {
		r.seen[name] = versions[name]
		res, err := r.ctrl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		switch {
		case err != nil:
			r.due[name] = now.Add(time.Second) // the workqueue's rate-limited retry
		case res.RequeueAfter > 0:
			r.due[name] = now.Add(res.RequeueAfter)
		default:
			delete(r.due, name)
		}
	}
	if err := r.ctrl.ReleasePool(ctx, PoolKafka); err != nil && !apierrors.IsServiceUnavailable(err) {
		return err
	}
	if err := w.reconcileInPlace(ctx, r); err != nil {
		return err
	}
	// The shadow ledger: what Karpenter did with the NodeClaims of would-be outcomes, and
	// the leader's flush (a failed one keeps its notes for the next).
	for i := range claims.Items {
		mem, _ := record.Load(ctx, w.store, claims.Items[i].Name)
		r.watcher.Observe(&claims.Items[i], mem)
	}
	r.ledger.Adopt(ctx) // the leader's start: once per router (an earlier router's ConfigMap)
	_ = r.ledger.Flush(ctx)
	// The EC2 event windows of the pools that ask, and their instances' tags (an error is a
	// read of the cluster that failed: the next pass tries again).
	_ = r.windows.Pass(ctx)
	if _, err := r.drainer.Pass(ctx); err != nil && !apierrors.IsServiceUnavailable(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// budgets is the eviction of the simulation's nodes for a reboot in place: each node's pod is
// held by its PodDisruptionBudget for a few rounds (0 to 3, fixed by the node's name and boot,
// so that one seed is one sequence), then evicted.
type budgets struct {
	mu      sync.Mutex
	w       *world
	refuses map[string]int // node/boot -> rounds still refused
}

func (b *budgets) Evict(ctx context.Context, node string, _ time.Time) (int, map[string]string, error) {
	var n corev1.Node
	if err := b.w.store.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return 0, nil, err
	}
	key := node + "/" + n.Status.NodeInfo.BootID
	b.mu.Lock()
	defer b.mu.Unlock()
	left, ok := b.refuses[key]
	if !ok {
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		left = int(h.Sum32() % 4)
	}
	if left == 0 {
		b.refuses[key] = 0
		return 0, nil, nil
	}
	b.refuses[key] = left - 1
	return 1, map[string]string{"kafka/broker-0": "Cannot evict pod as it would violate the pod's disruption budget."}, nil
}

// RebootInstances is EC2's reboot of an instance: its Node comes back with a new boot ID (at
// the next pass of reconcileInPlace). An instance whose rebootMigration is "default" and
// whose migration is possible moves to new hardware: its system-reboot is cleared.
func (e *ec2Status) RebootInstances(_ context.Context, in *ec2.RebootInstancesInput, _ ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error) {
	e.mu.Lock()
	if e.down {
		e.mu.Unlock()
		return nil, fmt.Errorf("RequestLimitExceeded")
	}
	e.rebooted = append(e.rebooted, in.InstanceIds...)
	var calls []rebootCall
	for _, id := range in.InstanceIds {
		c := rebootCall{instance: id}
		var kept []ec2types.InstanceStatusEvent
		for _, ev := range e.events[id] {
			open := !strings.HasPrefix(aws.ToString(ev.Description), "[")
			if open && policy.RebootsInPlace(event.ScheduledType(ev.Code)) {
				c.open = append(c.open, ev)
			}
			opt := e.migration[id]
			if open && ev.Code == ec2types.EventCode(event.ScheduledSystemReboot) && opt.state == ec2types.InstanceRebootMigrationStateDefault && !opt.fails {
				c.migrated = aws.ToString(ev.InstanceEventId)
				if !opt.completed {
					e.cleared[c.migrated] = aws.ToTime(ev.NotBefore)
					continue // cleared: gone from the list
				}
				ev.Description = aws.String("[Completed] " + aws.ToString(ev.Description))
			}
			kept = append(kept, ev)
		}
		e.events[id] = kept
		calls = append(calls, c)
	}
	hook := e.onReboot
	e.mu.Unlock()
	if hook != nil {
		for _, c := range calls {
			hook(c)
		}
	}
	return &ec2.RebootInstancesOutput{}, nil
}

// DescribeInstances shows each instance running, with its reboot-migration setting
// (maintenanceOptions.rebootMigration; none where the instance does not support it).
func (e *ec2Status) DescribeInstances(_ context.Context, in *ec2.DescribeInstancesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		return nil, fmt.Errorf("RequestLimitExceeded")
	}
	var res ec2types.Reservation
	for _, id := range in.InstanceIds {
		inst := ec2types.Instance{InstanceId: aws.String(id), State: &ec2types.InstanceState{Name: ec2types.InstanceStateNameRunning}}
		if opt := e.migration[id]; opt.state != "" {
			inst.MaintenanceOptions = &ec2types.InstanceMaintenanceOptions{RebootMigration: opt.state}
		}
		res.Instances = append(res.Instances, inst)
	}
	return &ec2.DescribeInstancesOutput{Reservations: []ec2types.Reservation{res}}, nil
}

// drainHook tells the world of each drain of an unmanaged node the pipeline begins.
type drainHook struct {
	d *nodedrain.Drainer
	w *world
}

func (h drainHook) Begin(ctx context.Context, node *corev1.Node, dr nodedrain.Drain) (bool, error) {
	already, err := h.d.Begin(ctx, node, dr)
	if err == nil && !already && h.w.onCordon != nil {
		h.w.onCordon(cluster.InstanceID(node.Spec.ProviderID))
	}
	return already, err
}

func (h drainHook) Cancel(ctx context.Context, node string, dr nodedrain.Drain) (bool, error) {
	return h.d.Cancel(ctx, node, dr)
}

// beginHook tells the world of each reboot in place the pipeline begins.
type beginHook struct {
	r *inplace.Runner
	w *world
}

func (b beginHook) Cancel(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (bool, error) {
	return b.r.Cancel(ctx, nc, ev)
}

func (b beginHook) Begin(ctx context.Context, nc *karpv1.NodeClaim, ev event.Event) (bool, error) {
	already, err := b.r.Begin(ctx, nc, ev)
	if err == nil && !already && b.w.onInPlace != nil {
		b.w.onInPlace(cluster.InstanceID(nc.Status.ProviderID), ev)
	}
	return already, err
}

// awsReboot is AWS carrying out a system reboot it scheduled: when, within the event's window,
// and whether the Node shows it.
type awsReboot struct {
	after   time.Duration // after the event's start (within its two-hour window)
	visible bool          // false: AWS's maintenance leaves no trace on the Node
}

// awsAct is one scheduled reboot AWS carried out: the instance, and whether its Node was out of
// service then (cordoned, its reboot in place in progress), for the machine to check.
type awsAct struct {
	instance, eventID string
	start             time.Time
	outOfService      bool
	why               string
}

// awsActs plays AWS carrying out the system reboots EC2 holds for the kafka instances, and the
// managed node group's, whose time has come, each at a drawn moment within its window (plan), and marks the event
// completed. It returns what it did.
func (w *world) awsActs(ctx context.Context, plan func(instance, eventID string) awsReboot) ([]awsAct, error) {
	now := w.clock.Now()
	type due struct {
		inst, eid string
		start     time.Time
	}
	var todo []due
	w.ec2.mu.Lock()
	insts := make([]string, 0, len(w.ec2.events))
	for id := range w.ec2.events {
		insts = append(insts, id)
	}
	sort.Strings(insts)
	for _, id := range insts {
		for _, ev := range w.ec2.events[id] {
			if ev.Code == ec2types.EventCode(event.ScheduledSystemReboot) && !strings.HasPrefix(aws.ToString(ev.Description), "[") && !now.Before(aws.ToTime(ev.NotBefore)) {
				todo = append(todo, due{id, aws.ToString(ev.InstanceEventId), aws.ToTime(ev.NotBefore)})
			}
		}
	}
	w.ec2.mu.Unlock()
	var acts []awsAct
	for _, d := range todo {
		p := plan(d.inst, d.eid)
		if now.Before(d.start.Add(p.after)) {
			continue
		}
		w.ec2.mu.Lock()
		for i, ev := range w.ec2.events[d.inst] {
			if aws.ToString(ev.InstanceEventId) == d.eid {
				ev.Description = aws.String("[Completed] " + aws.ToString(ev.Description))
				w.ec2.events[d.inst][i] = ev
			}
		}
		w.ec2.mu.Unlock()
		claims, err := cluster.InstanceClaims(ctx, w.store, d.inst)
		if err != nil {
			return nil, err
		}
		if len(claims) == 0 && d.inst == UnmanagedInstance {
			// The managed node group's node, drained by the router under cordon-drain: out of
			// service when cordoned.
			var n corev1.Node
			if err := w.store.Get(ctx, client.ObjectKey{Name: UnmanagedNode}, &n); err != nil {
				return nil, err
			}
			mem, err := record.Load(ctx, w.store, record.NodeRecordName(UnmanagedNode))
			if err != nil {
				return nil, err
			}
			acts = append(acts, awsAct{instance: d.inst, eventID: d.eid, start: d.start, outOfService: n.Spec.Unschedulable, why: fmt.Sprintf("cordoned %v, record %s", n.Spec.Unschedulable, mem.NodeDrain)})
			if p.visible {
				if err := w.reboot(ctx, UnmanagedNode); err != nil {
					return nil, err
				}
			}
			continue
		}
		if len(claims) == 0 {
			continue // the instance is gone
		}
		nc := &claims[0]
		if nc.Labels[karpv1.NodePoolLabelKey] != PoolKafka || !nc.DeletionTimestamp.IsZero() {
			continue // drained or replaced: the model's deadline check speaks for it
		}
		var n corev1.Node
		if err := w.store.Get(ctx, client.ObjectKey{Name: nc.Status.NodeName}, &n); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		mem, _ := record.Load(ctx, w.store, nc.Name)
		st, ok, _ := inplace.Read(mem)
		act := awsAct{instance: d.inst, eventID: d.eid, start: d.start, outOfService: n.Spec.Unschedulable && ok && !st.Over()}
		act.why = fmt.Sprintf("cordoned %v, run %s", n.Spec.Unschedulable, encodeRun(st, ok))
		acts = append(acts, act)
		if p.visible {
			if err := w.reboot(ctx, nc.Status.NodeName); err != nil {
				return nil, err
			}
		}
	}
	return acts, nil
}

func encodeRun(st inplace.State, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s of %s at %s (%s)", st.Step, st.EventID, st.Start.Format(time.RFC3339), st.Outcome)
}

// reconcileInPlace plays the leader's reboot-in-place controller over the NodeClaims that hold
// a run (up to a few passes each: its waits are seconds, the simulation's tick minutes), and
// EC2 rebooting the instances the router rebooted (RebootInstances): the Node comes back
// Ready with a new boot ID. AWS's own reboots are awsActs.
func (w *world) reconcileInPlace(ctx context.Context, r *replica) error {
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	w.ec2.mu.Lock()
	rebooted := w.ec2.rebooted
	w.ec2.rebooted = nil
	w.ec2.mu.Unlock()
	for i := range claims.Items {
		nc := &claims.Items[i]
		mem, err := record.Load(ctx, w.store, nc.Name)
		if err != nil {
			return err
		}
		st, ok, err := inplace.Read(mem)
		if err != nil || !ok || st.Over() {
			continue
		}
		if id := cluster.InstanceID(nc.Status.ProviderID); slices.Contains(rebooted, id) {
			if err := w.reboot(ctx, nc.Status.NodeName); err != nil {
				return err
			}
		}
		for range 4 {
			res, err := r.inPlace.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: nc.Name}})
			if err != nil {
				if apierrors.IsServiceUnavailable(err) || apierrors.IsConflict(err) {
					break
				}
				return err
			}
			if res.RequeueAfter > time.Minute {
				break
			}
		}
	}
	return nil
}

// reboot is the kubelet coming back after a reboot: Ready, a new boot ID.
func (w *world) reboot(ctx context.Context, node string) error {
	var n corev1.Node
	if err := w.store.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return client.IgnoreNotFound(err)
	}
	w.boots++
	n.Status.NodeInfo.BootID = fmt.Sprintf("boot-%d", w.boots)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(w.clock.Now())}}
	// Through the status subresource: the fake API server, as a real one, ignores a Node's
	// status in a plain Update (before this, no reboot ever showed on a Node).
	return w.store.Status().Update(ctx, &n)
}

// checkInPlace: no Node is cordoned or protected from Karpenter, and no NodeClaim protected,
// unless a reboot in place runs on it (or its NodeClaim is being replaced after a fallback).
func (w *world) checkInPlace(ctx context.Context) error {
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	for i := range claims.Items {
		nc := &claims.Items[i]
		mem, err := record.Load(ctx, w.store, nc.Name)
		if err != nil {
			return err
		}
		running := inplace.Active(mem) || !nc.DeletionTimestamp.IsZero()
		if nc.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" && !running {
			return fmt.Errorf("nodeclaim %s is protected from Karpenter with no reboot in place running", nc.Name)
		}
		var n corev1.Node
		if err := w.store.Get(ctx, client.ObjectKey{Name: nc.Status.NodeName}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		if (n.Spec.Unschedulable || n.Annotations[karpv1.DoNotDisruptAnnotationKey] != "") && !running {
			return fmt.Errorf("node %s is cordoned (%v) or protected from Karpenter (%q) with no reboot in place running", n.Name, n.Spec.Unschedulable, n.Annotations[karpv1.DoNotDisruptAnnotationKey])
		}
	}
	return nil
}

// reconcileMarks plays the leader's node-marks controller: its watch hands every changed
// NodeClaim and Node over; here it goes over all of them (a dozen). A fault leaves the
// NodeClaim to the next pass, as the workqueue's retry would.
func (w *world) reconcileMarks(ctx context.Context) error {
	// A pass is started by a watch event of the router's own cache: the cache holds at least
	// the change that starts it (a pass started on the API server's word, reading a cache that
	// has not caught up, would mark on what the change replaced and never be started again).
	w.cache.sync()
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	var nodes corev1.NodeList
	if err := w.store.List(ctx, &nodes); err != nil {
		return err
	}
	nodeVersion := map[string]string{}
	for _, n := range nodes.Items {
		nodeVersion[n.Name] = n.ResourceVersion
	}
	var hrs record.HealthRecordList
	if err := w.store.List(ctx, &hrs); err != nil {
		return err
	}
	recordVersion := map[string]string{}
	for _, hr := range hrs.Items {
		recordVersion[hr.Name] = hr.ResourceVersion
	}
	var pools karpv1.NodePoolList
	if err := w.store.List(ctx, &pools); err != nil {
		return err
	}
	taints := map[string]bool{}
	for _, np := range pools.Items {
		taints[np.Name] = upcoming.Taints(np.Annotations)
	}
	r := w.leader
	for _, nc := range claims.Items {
		// The watch: only a NodeClaim, its HealthRecord or its Node that changed since its
		// last pass, or its pool's taint setting (a new leader starts with none seen, as its
		// informers list everything).
		version := nc.ResourceVersion + "/" + recordVersion[nc.Name] + "/" + nodeVersion[nc.Status.NodeName] + "/" + strconv.FormatBool(taints[nc.Labels[karpv1.NodePoolLabelKey]])
		if r.marked[nc.Name] == version {
			continue
		}
		_, err := r.marks.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: nc.Name}})
		switch {
		case err == nil:
			r.marked[nc.Name] = version
		case apierrors.IsServiceUnavailable(err) || apierrors.IsConflict(err):
			delete(r.marked, nc.Name) // the workqueue's retry
		default:
			return err
		}
	}
	return nil
}

// checkMarks: every Node carries exactly the marks its NodeClaim's records call for (none
// when nothing is pending), with the taint only in a pool that asks for it.
func (w *world) checkMarks(ctx context.Context) error {
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	owned := map[string]bool{}
	for i := range claims.Items {
		nc := &claims.Items[i]
		owned[nc.Status.NodeName] = true
		var n corev1.Node
		if err := w.store.Get(ctx, client.ObjectKey{Name: nc.Status.NodeName}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		mem, err := record.Load(ctx, w.store, nc.Name)
		if err != nil {
			return err
		}
		np := &karpv1.NodePool{}
		if err := w.store.Get(ctx, client.ObjectKey{Name: nc.Labels[karpv1.NodePoolLabelKey]}, np); err != nil {
			return err
		}
		want := upcoming.DesiredFor(mem, upcoming.Taints(np.Annotations))
		if !nc.DeletionTimestamp.IsZero() {
			want = upcoming.Marks{}
		}
		if got := upcoming.Current(&n); got != want {
			return fmt.Errorf("node %s (pool %s) carries %+v, its records call for %+v", n.Name, np.Name, got, want)
		}
	}
	var nodes corev1.NodeList
	if err := w.store.List(ctx, &nodes); err != nil {
		return err
	}
	for _, n := range nodes.Items {
		if !owned[n.Name] && !upcoming.Current(&n).None() {
			return fmt.Errorf("node %s has no NodeClaim and carries %+v", n.Name, upcoming.Current(&n))
		}
	}
	return nil
}

// karpenter plays Karpenter: it acts on the forwarded messages (deletes the NodeClaims they
// name), finishes the deletion of every deleting NodeClaim (drained, terminated: the
// NodeClaim and its Node gone), and launches a replacement in the same pool. Every replica's
// informer sees the deletion.
func (w *world) karpenter(ctx context.Context, drop bool) error {
	w.queues.mu.Lock()
	forwards := w.queues.karpenter
	w.queues.karpenter = nil
	w.queues.mu.Unlock()
	if !drop {
		for _, body := range forwards {
			id := instanceOf(body)
			claims, err := cluster.InstanceClaims(ctx, w.store, id)
			if err != nil {
				return err
			}
			for i := range claims {
				if err := w.store.Delete(ctx, &claims[i]); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
		}
	}
	var claims karpv1.NodeClaimList
	if err := w.store.List(ctx, &claims); err != nil {
		return err
	}
	for i := range claims.Items {
		nc := &claims.Items[i]
		if nc.DeletionTimestamp.IsZero() {
			continue
		}
		pool := nc.Labels[karpv1.NodePoolLabelKey]
		if w.onGone != nil {
			w.onGone(cluster.InstanceID(nc.Status.ProviderID))
		}
		nc.Finalizers = nil
		if err := w.store.Update(ctx, nc); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if err := w.store.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nc.Status.NodeName}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		for _, r := range []*replica{w.leader, w.standby} {
			r.ctrl.DrainFinished(ctx, pool, nc.Name)
		}
		if _, err := w.addNode(ctx, pool); err != nil {
			return err
		}
	}
	return nil
}

// crash restarts the leader: a new process with empty memory, over the same cluster and queues.
func (w *world) crash() {
	w.endOverlap()
	w.stop(w.leader)
	w.leader = w.newReplica(w.leader.name + "'")
	w.lead(w.leader)
}

// failover hands the lease to the standby, which has been running all along; the old
// leader becomes the standby. With overlap the old leader has not noticed yet: it keeps
// acting beside the new one until endOverlap (up to a lease period: the rest of this tick).
func (w *world) failover(overlap bool) {
	w.endOverlap()
	old := w.leader
	if !overlap {
		w.stop(old)
		w.summarise(old) // a graceful stop tells what it held back
	}
	w.leader, w.standby = w.standby, old
	w.lead(w.leader)
	if overlap {
		w.zombie = old
	}
}

// endOverlap stops the old leader that kept acting after a failover: it notices the loss of
// its lease and exits (controller-runtime's manager ends the process), and is started again as
// the standby, with empty memory.
func (w *world) endOverlap() {
	if z := w.zombie; z != nil {
		w.zombie = nil
		if w.onOverlapEnd != nil {
			w.onOverlapEnd()
		}
		w.stop(z)
		w.summarise(z)
		if w.standby == z {
			w.standby = w.newReplica(z.name + "'")
		}
	}
}

// instanceOf is the instance a forwarded body names (its one resource ARN).
func instanceOf(body string) string {
	var env struct {
		Resources []string `json:"resources"`
	}
	if json.Unmarshal([]byte(body), &env) != nil || len(env.Resources) != 1 {
		return ""
	}
	r := env.Resources[0]
	return r[strings.LastIndex(r, "/")+1:]
}

// simLog is the router's logger in the simulation: silent, or with SIM_LOG=1 every line (to
// follow a failing seed).
func simLog() *slog.Logger {
	if os.Getenv("SIM_LOG") == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
