// Package eventwindow keeps an EC2 event window for each NodePool annotated
// healthrouter.io/event-window=true: AWS then schedules the new stop, reboot and retirement
// events of the pool's instances inside the pool's maintenance window, instead of the router
// deferring or moving them afterwards. The window is named and tagged by cluster and pool, its
// time ranges follow the pool's window (policy.Window.EC2Ranges), and it targets the instance
// tag healthrouter.io/event-window=<cluster>/<pool>, which the manager puts on each of the
// pool's instances as its NodeClaim appears: Karpenter's own karpenter.sh/nodepool tag is
// account-wide, and two clusters with a pool named default would share one window.
//
// EC2's refusals (a range it cannot hold, a target in another window, the 200 windows of a
// region) and its outages become a problem on the pool (a Warning Event, a metric) and a
// backoff, never a crash or a retry storm; the pool's deferral and reschedule apply as without
// a window. The manager runs on the leader only (SetupWithManager); Pass is one reconciliation
// of everything, for the simulation to call with its own clock.
package eventwindow

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/policy"
)

// Tags the router writes. TagInstance is on the pool's instances, value <cluster>/<pool>; the
// window carries TagCluster and TagNodePool, by which the manager finds its own windows.
const (
	TagInstance = policy.AnnotationEventWindow
	TagCluster  = policy.Prefix + "cluster"
	TagNodePool = policy.Prefix + "nodepool"
)

// Event reasons, on the NodePool.
const (
	// ReasonSynced (Normal): the pool's EC2 event window was created or changed.
	ReasonSynced = "HealthRouterEventWindowSynced"
	// ReasonProblem (Warning): the pool gets no EC2 event window, or not the one it asks for:
	// EC2 cannot express its window, refused a call, or does not answer.
	ReasonProblem = "HealthRouterEventWindowProblem"
)

// Results of health_router_event_windows_total.
const (
	ResultCreated       = "created"
	ResultModified      = "modified"
	ResultAssociated    = "associated"
	ResultDeleted       = "deleted"
	ResultStray         = "stray"         // a target the router did not associate, disassociated
	ResultInexpressible = "inexpressible" // the pool's window is one EC2 cannot hold
	ResultRefused       = "refused"       // EC2 answered no
	ResultUnavailable   = "unavailable"   // EC2 did not answer, throttled, or failed
)

// Timing of the manager.
const (
	// DescribeTTL is how long the windows EC2 holds are taken as the manager last read or wrote
	// them. Only this cluster's leader writes windows tagged with the cluster, so a re-read
	// finds only what someone else changed by hand: every ten minutes is enough, and a burst of
	// NodeClaims costs no DescribeInstanceEventWindows call.
	DescribeTTL = 10 * time.Minute
	// RetryBase and RetryMax bound the backoff of a pool whose calls EC2 refused or did not
	// answer: doubling from a minute to an hour, so that a refusal (the region's 200 windows)
	// is asked again a few times a day, not on every NodeClaim that appears.
	RetryBase = time.Minute
	RetryMax  = time.Hour
	// tagBatch is how many instances one CreateTags call names (EC2 takes up to 1,000
	// resource IDs a call, and recommends smaller batches).
	tagBatch = 200
	// cleanupTries bounds Cleanup's passes while EC2 does not answer (with the backoff, about
	// an hour): an endpoint that never serves the calls (an EC2 stand-in) is not asked forever.
	cleanupTries = 7
)

// What a failed call means; every error the manager's calls return wraps one of them.
var (
	// ErrRefused: EC2 answered and will not do it; asking again at once does not help.
	ErrRefused = errors.New("refused by EC2")
	// ErrUnavailable: no answer, throttling past the SDK's retries, or a fault on EC2's side.
	ErrUnavailable = errors.New("EC2 unavailable")
)

// ec2API is the part of EC2 the manager calls.
type ec2API interface {
	CreateInstanceEventWindow(context.Context, *ec2.CreateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.CreateInstanceEventWindowOutput, error)
	ModifyInstanceEventWindow(context.Context, *ec2.ModifyInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.ModifyInstanceEventWindowOutput, error)
	AssociateInstanceEventWindow(context.Context, *ec2.AssociateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.AssociateInstanceEventWindowOutput, error)
	DisassociateInstanceEventWindow(context.Context, *ec2.DisassociateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.DisassociateInstanceEventWindowOutput, error)
	DeleteInstanceEventWindow(context.Context, *ec2.DeleteInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.DeleteInstanceEventWindowOutput, error)
	DescribeInstanceEventWindows(context.Context, *ec2.DescribeInstanceEventWindowsInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceEventWindowsOutput, error)
	CreateTags(context.Context, *ec2.CreateTagsInput, ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
}

// window is one EC2 event window of this cluster, as the manager knows it.
type window struct {
	id      string
	ranges  []policy.WeeklyRange
	targets []string // associated instance tags, key=value
	// instances and hosts are the instance IDs and Dedicated Host IDs associated with the
	// window. The manager never associates either: they are someone else's doing.
	instances, hosts []string
}

// strays returns what w targets besides keep (the pool's instance tag): other tags, instance
// IDs, Dedicated Hosts. No IAM condition can keep a holder of the router's grant from
// associating the cluster's windows with any of them (AssociateInstanceEventWindow is
// authorized on the window alone), so the manager takes them off instead.
func (w window) strays(keep string) (tags, instances, hosts []string) {
	tags = slices.DeleteFunc(slices.Clone(w.targets), func(t string) bool { return t == keep })
	return tags, w.instances, w.hosts
}

// disassociation is the request that takes tags, instances and hosts off a window.
func disassociation(tags, instances, hosts []string) *ec2types.InstanceEventWindowDisassociationRequest {
	req := &ec2types.InstanceEventWindowDisassociationRequest{InstanceIds: instances, DedicatedHostIds: hosts}
	for _, t := range tags {
		k, v, _ := strings.Cut(t, "=")
		req.InstanceTags = append(req.InstanceTags, ec2types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	return req
}

// backoff is a pool's pause after a failure: next is when it is tried again, unless what it
// asks for (spec) changes first.
type backoff struct {
	spec     string
	failures int
	next     time.Time
}

// Manager keeps the EC2 event windows of the cluster's NodePools.
type Manager struct {
	kube     client.Reader
	ec2      ec2API
	recorder events.EventRecorder
	clk      clock.Clock
	log      *slog.Logger
	cluster  string
	results  *prometheus.CounterVec
	tagged   prometheus.Counter

	mu sync.Mutex
	// known are this cluster's windows, by pool, as last read (knownAt) and written since.
	known    map[string][]window
	knownAt  time.Time
	describe backoff // of DescribeInstanceEventWindows
	// describeErr is the last DescribeInstanceEventWindows failure (nil after a success), and
	// describeLevel the level it is logged at (a warning for Cleanup's).
	describeErr   error
	describeLevel slog.Level
	retry         map[string]backoff
	told          map[string]string // pool -> the problem last told in an Event
	// instances are the instances tagged so far, with the tag's value; missing the ones EC2
	// did not know yet, and when to try them again.
	instances map[string]string
	missing   map[string]time.Time
	tagRetry  backoff
	// inPlaceLead is how long before AWS's start a reboot in place empties the node
	// (WithInPlaceLead): a pool that reboots in place gets a window that leaves it.
	inPlaceLead time.Duration
}

// WithInPlaceLead sets how long before AWS's start a reboot in place empties the node
// (inplace.Options.PrepareLead): the EC2 window of a pool that reboots a type in place is
// shifted by it as well as by drain-lead, so that AWS never schedules a start that has the
// node emptied before the pool's window opens.
func (m *Manager) WithInPlaceLead(d time.Duration) *Manager {
	m.inPlaceLead = d
	return m
}

// New returns a Manager of the windows of cluster (its name, as the Terraform module's
// cluster_name: the IAM grant is scoped by it). kube reads NodePools and NodeClaims (the
// manager's cache); metrics are registered with reg.
func New(kube client.Reader, api ec2API, recorder events.EventRecorder, clk clock.Clock, log *slog.Logger, reg prometheus.Registerer, clusterName string) *Manager {
	m := &Manager{kube: kube, ec2: api, recorder: recorder, clk: clk, log: log, cluster: clusterName,
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metrics.EventWindows,
			Help: "Changes to the EC2 event windows of NodePools annotated healthrouter.io/event-window=true, and their failures, by result: created, modified, associated (with the pool's instance tag), deleted (the annotation or the pool gone, or its window no longer one EC2 can hold), stray (targets the router did not associate, another tag, instance IDs or Dedicated Hosts, taken off the pool's window), inexpressible (the pool's window is one EC2 cannot hold: no EC2 window), refused (EC2 refused a call), unavailable (EC2 did not answer). A failure is tried again with backoff (1m doubling to 1h)."},
			[]string{metrics.LabelResult}),
		tagged: prometheus.NewCounter(prometheus.CounterOpts{Name: metrics.EventWindowTagged,
			Help: "Instances the router tagged healthrouter.io/event-window=<cluster>/<pool>, the target of their pool's EC2 event window, as their NodeClaims appeared."}),
		known: map[string][]window{}, retry: map[string]backoff{}, told: map[string]string{}, describeLevel: slog.LevelError,
		instances: map[string]string{}, missing: map[string]time.Time{},
	}
	reg.MustRegister(m.results, m.tagged)
	return m
}

// Name is the name of a pool's window: for people; the manager finds its windows by tag.
func Name(clusterName, pool string) string { return "hr-" + clusterName + "-" + pool }

// TagValue is the value of TagInstance on a pool's instances, and the window's target.
func TagValue(clusterName, pool string) string { return clusterName + "/" + pool }

// wanted is what one pool asks for.
type wanted struct {
	pool   *karpv1.NodePool
	ranges []policy.WeeklyRange
	err    error // the window is one EC2 cannot hold
}

// Pass reconciles everything once: the windows of every pool that asks for one, the deletion
// of the windows no pool asks for any more, and the tags of the pools' instances. A pool in
// backoff is left alone until its time comes or its window changes. It returns an error only
// when it could not read the cluster; EC2's failures are the pools' problems, not Pass's.
func (m *Manager) Pass(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var pools karpv1.NodePoolList
	if err := m.kube.List(ctx, &pools); err != nil {
		return fmt.Errorf("listing NodePools: %w", err)
	}
	want := map[string]wanted{}
	for i := range pools.Items {
		np := &pools.Items[i]
		p := policy.FromAnnotations(np.Annotations)
		// A pool in shadow gets no window: a window changes when AWS acts, and in shadow the
		// router carries nothing out (its window, if it had one, is deleted as for a pool that
		// no longer asks).
		if !p.EventWindow || p.Shadow || !np.DeletionTimestamp.IsZero() {
			continue
		}
		ranges, err := p.Window.EC2Ranges(p.EC2Leads(m.inPlaceLead)...)
		want[np.Name] = wanted{pool: np, ranges: ranges, err: err}
	}
	// A pool that no longer asks is told afresh if it asks again.
	maps.DeleteFunc(m.told, func(pool, _ string) bool { _, ok := want[pool]; return !ok })
	if m.refresh(ctx) {
		m.windows(ctx, want)
	}
	return m.tagInstances(ctx, want)
}

// refresh reads this cluster's windows from EC2 when what the manager knows is older than
// DescribeTTL; it reports whether the manager knows them.
func (m *Manager) refresh(ctx context.Context) bool {
	now := m.clk.Now()
	if !m.knownAt.IsZero() && now.Sub(m.knownAt) < DescribeTTL {
		return true
	}
	if now.Before(m.describe.next) {
		return false
	}
	known := map[string][]window{}
	pages := ec2.NewDescribeInstanceEventWindowsPaginator(m.ec2, &ec2.DescribeInstanceEventWindowsInput{
		Filters: []ec2types.Filter{{Name: aws.String("tag:" + TagCluster), Values: []string{m.cluster}}},
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			err = classify(err)
			m.describeErr = err
			m.results.WithLabelValues(result(err)).Inc()
			m.describe = m.after(m.describe, "")
			m.log.Log(context.Background(), m.describeLevel, "describing the cluster's EC2 event windows", "err", err, "retry_at", m.describe.next)
			return false
		}
		for _, w := range page.InstanceEventWindows {
			if w.State == ec2types.InstanceEventWindowStateDeleting || w.State == ec2types.InstanceEventWindowStateDeleted {
				continue
			}
			pool := tag(w.Tags, TagNodePool)
			if pool == "" || tag(w.Tags, TagCluster) != m.cluster {
				continue
			}
			known[pool] = append(known[pool], fromEC2(w))
		}
	}
	m.known, m.knownAt, m.describe, m.describeErr = known, now, backoff{}, nil
	return true
}

// Cleanup is the manager of a router with the feature off (--event-windows=false, or
// --shadow): the windows an earlier router of this cluster created and left would keep AWS
// scheduling into the pools' windows with nobody keeping them in line with the pools. It
// deletes them (a warning, and health_router_event_windows_total{result="deleted"}), and ends
// once EC2 shows none, or refuses to show them (this router was never granted the feature, so
// no router of it created any; said once). A failure is tried again with the manager's backoff.
func (m *Manager) Cleanup(ctx context.Context) error {
	m.mu.Lock()
	m.describeLevel = slog.LevelWarn
	m.mu.Unlock()
	for try := 1; ; try++ {
		done := m.cleanupPass(ctx)
		if done || ctx.Err() != nil {
			return nil
		}
		if try == cleanupTries {
			m.log.Warn("event windows are off; the windows an earlier router of this cluster may have left could not be checked: EC2 did not answer; they are checked again at the next start", "tries", try)
			return nil
		}
		wait := m.clk.NewTimer(max(m.Next().Sub(m.clk.Now()), time.Second))
		select {
		case <-ctx.Done():
			wait.Stop()
			return nil
		case <-wait.C():
		}
	}
}

// cleanupPass deletes every window of this cluster once; it reports whether none is left.
func (m *Manager) cleanupPass(ctx context.Context) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.knownAt = time.Time{} // EC2 is asked each pass: nothing else keeps the windows now
	if !m.refresh(ctx) {
		if errors.Is(m.describeErr, ErrRefused) {
			m.log.Info("event windows are off; EC2 refuses to list event windows, so none was left by an earlier router of this cluster", "err", m.describeErr)
			return true
		}
		return false
	}
	if len(m.known) == 0 {
		return true
	}
	for _, pool := range slices.Sorted(maps.Keys(m.known)) {
		m.log.Warn("event windows are off (--event-windows=false, or --shadow): deleting the EC2 event window an earlier router created for the pool", "nodepool", pool, "windows", len(m.known[pool]))
	}
	m.windows(ctx, nil)
	return len(m.known) == 0
}

// windows brings EC2's windows in line with want.
func (m *Manager) windows(ctx context.Context, want map[string]wanted) {
	now := m.clk.Now()
	for _, pool := range slices.Sorted(maps.Keys(m.known)) {
		if w, ok := want[pool]; ok && w.err == nil {
			continue
		}
		// No longer asked for (the annotation or the pool gone), or no longer one EC2 can
		// hold: a window that no longer matches the pool's would have AWS schedule events
		// outside it. Deleted: AWS keeps its own timing, the router's deferral applies.
		if b, ok := m.retry[pool]; ok && b.spec == "" && now.Before(b.next) {
			continue
		}
		if err := m.deleteAll(ctx, pool, m.known[pool]); err != nil {
			m.failed(pool, "", want[pool].pool, fmt.Sprintf("the EC2 event window of the pool is not deleted: %s", brief(err)), err)
			continue
		}
		delete(m.retry, pool)
	}
	for _, pool := range slices.Sorted(maps.Keys(want)) {
		w := want[pool]
		if w.err != nil {
			m.problem(w.pool, ResultInexpressible, fmt.Sprintf("%s=true: no EC2 event window: EC2 cannot express the maintenance window: %v; AWS keeps its own timing, the router's deferral applies", policy.AnnotationEventWindow, w.err))
			continue
		}
		spec := policy.FormatRanges(w.ranges)
		if b, ok := m.retry[pool]; ok && b.spec == spec && now.Before(b.next) {
			continue
		}
		if err := m.ensure(ctx, w); err != nil {
			m.failed(pool, spec, w.pool, fmt.Sprintf("%s=true: the EC2 event window (%s) is not in place: %s; AWS keeps its own timing, the router's deferral applies", policy.AnnotationEventWindow, spec, brief(err)), err)
			continue
		}
		delete(m.retry, pool)
		delete(m.told, pool)
	}
}

// ensure makes the pool's one window hold its ranges and target its instance tag.
func (m *Manager) ensure(ctx context.Context, w wanted) error {
	pool := w.pool.Name
	target := TagInstance + "=" + TagValue(m.cluster, pool)
	wins := m.known[pool]
	if len(wins) > 1 {
		// More than one (a write EC2 had not shown yet when the manager last read): keep the
		// one that targets the pool's tag, else the first, and delete the others.
		keep := max(0, slices.IndexFunc(wins, func(x window) bool { return slices.Contains(x.targets, target) }))
		extra := slices.Delete(slices.Clone(wins), keep, keep+1)
		wins = wins[keep : keep+1]
		if err := m.deleteAll(ctx, pool, extra); err != nil {
			return err
		}
		m.known[pool] = wins
	}
	if len(wins) == 0 {
		out, err := m.ec2.CreateInstanceEventWindow(ctx, &ec2.CreateInstanceEventWindowInput{
			Name: aws.String(Name(m.cluster, pool)), TimeRanges: toEC2(w.ranges),
			TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstanceEventWindow, Tags: []ec2types.Tag{
				{Key: aws.String(TagCluster), Value: aws.String(m.cluster)}, {Key: aws.String(TagNodePool), Value: aws.String(pool)}}}},
		})
		if err != nil || out.InstanceEventWindow == nil {
			return callErr("creating the event window", cmp.Or(err, errors.New("no window in EC2's answer")))
		}
		created := fromEC2(*out.InstanceEventWindow)
		m.known[pool] = []window{created}
		m.results.WithLabelValues(ResultCreated).Inc()
		m.recorder.Eventf(w.pool, nil, corev1.EventTypeNormal, ReasonSynced, "CreateEventWindow",
			"EC2 event window %s created: %s, for the instances tagged %s", created.id, policy.FormatRanges(w.ranges), target)
		wins = m.known[pool]
	} else if !slices.Equal(sorted(wins[0].ranges), sorted(w.ranges)) {
		out, err := m.ec2.ModifyInstanceEventWindow(ctx, &ec2.ModifyInstanceEventWindowInput{
			InstanceEventWindowId: aws.String(wins[0].id), TimeRanges: toEC2(w.ranges)})
		if err != nil {
			return callErr("modifying event window "+wins[0].id, err)
		}
		was := wins[0].ranges
		wins[0].ranges = w.ranges
		if out.InstanceEventWindow != nil {
			wins[0] = fromEC2(*out.InstanceEventWindow)
		}
		m.results.WithLabelValues(ResultModified).Inc()
		m.recorder.Eventf(w.pool, nil, corev1.EventTypeNormal, ReasonSynced, "ModifyEventWindow",
			"EC2 event window %s changed from %s to %s (events AWS scheduled before keep their time)", wins[0].id, policy.FormatRanges(was), policy.FormatRanges(w.ranges))
	}
	if tags, instances, hosts := wins[0].strays(target); len(tags)+len(instances)+len(hosts) > 0 {
		// Before the association: EC2 holds one type of target a window, so instance IDs left
		// there would refuse the pool's tag.
		stray := slices.Concat(tags, instances, hosts)
		if _, err := m.ec2.DisassociateInstanceEventWindow(ctx, &ec2.DisassociateInstanceEventWindowInput{
			InstanceEventWindowId: aws.String(wins[0].id), AssociationTarget: disassociation(tags, instances, hosts)}); err != nil && !notFound(err) {
			return callErr(fmt.Sprintf("disassociating %s, which the router did not associate, from event window %s", strings.Join(stray, ", "), wins[0].id), err)
		}
		wins[0].targets = slices.DeleteFunc(wins[0].targets, func(t string) bool { return t != target })
		wins[0].instances, wins[0].hosts = nil, nil
		m.results.WithLabelValues(ResultStray).Inc()
		m.log.Warn("disassociated targets the router did not associate from the pool's EC2 event window", "nodepool", pool, "window", wins[0].id, "targets", stray)
		m.recorder.Eventf(w.pool, nil, corev1.EventTypeWarning, ReasonProblem, "DisassociateEventWindow",
			"EC2 event window %s also targeted %s, which the router did not associate: disassociated (the pool's window targets the instances tagged %s alone)", wins[0].id, strings.Join(stray, ", "), target)
	}
	if !slices.Contains(wins[0].targets, target) {
		out, err := m.ec2.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{
			InstanceEventWindowId: aws.String(wins[0].id),
			AssociationTarget:     &ec2types.InstanceEventWindowAssociationRequest{InstanceTags: []ec2types.Tag{{Key: aws.String(TagInstance), Value: aws.String(TagValue(m.cluster, pool))}}},
		})
		if err != nil {
			return callErr(fmt.Sprintf("associating event window %s with the instances tagged %s", wins[0].id, target), err)
		}
		wins[0].targets = append(wins[0].targets, target)
		if out.InstanceEventWindow != nil {
			wins[0] = fromEC2(*out.InstanceEventWindow)
		}
		m.results.WithLabelValues(ResultAssociated).Inc()
	}
	return nil
}

// deleteAll disassociates and deletes a pool's windows; the ones deleted leave what the
// manager knows.
func (m *Manager) deleteAll(ctx context.Context, pool string, wins []window) error {
	for _, w := range wins {
		if len(w.targets)+len(w.instances)+len(w.hosts) > 0 {
			if _, err := m.ec2.DisassociateInstanceEventWindow(ctx, &ec2.DisassociateInstanceEventWindowInput{
				InstanceEventWindowId: aws.String(w.id), AssociationTarget: disassociation(w.targets, w.instances, w.hosts)}); err != nil && !notFound(err) {
				return callErr("disassociating event window "+w.id, err)
			}
		}
		if _, err := m.ec2.DeleteInstanceEventWindow(ctx, &ec2.DeleteInstanceEventWindowInput{InstanceEventWindowId: aws.String(w.id)}); err != nil && !notFound(err) {
			return callErr("deleting event window "+w.id, err)
		}
		m.known[pool] = slices.DeleteFunc(m.known[pool], func(x window) bool { return x.id == w.id })
		if len(m.known[pool]) == 0 {
			delete(m.known, pool)
		}
		m.results.WithLabelValues(ResultDeleted).Inc()
		m.log.Info("deleted the EC2 event window of a pool that no longer asks for one", "nodepool", pool, "window", w.id)
	}
	return nil
}

// failed records a failed call for a pool: the backoff, the metric, the log, and an Event on
// the pool (np, nil when the pool is gone) when the problem is new.
func (m *Manager) failed(pool, spec string, np *karpv1.NodePool, msg string, err error) {
	m.results.WithLabelValues(result(err)).Inc()
	m.retry[pool] = m.after(m.retry[pool], spec)
	// What EC2 holds is read again when the pool is tried again (a call may have been carried
	// out though its answer was lost), not on every pass in between.
	if due := m.retry[pool].next.Add(-DescribeTTL); due.Before(m.knownAt) {
		m.knownAt = due
	}
	m.log.Error("EC2 event window", "nodepool", pool, "err", err, "retry_at", m.retry[pool].next)
	if np != nil {
		m.tell(np, msg)
	}
}

// problem tells a pool's problem that is no call's failure (a window EC2 cannot hold): the
// metric and the Event once per distinct problem, not once a pass.
func (m *Manager) problem(np *karpv1.NodePool, res, msg string) {
	if m.told[np.Name] == msg {
		return
	}
	m.results.WithLabelValues(res).Inc()
	m.log.Warn("EC2 event window", "nodepool", np.Name, "problem", msg)
	m.tell(np, msg)
}

// tell posts msg as a Warning Event on the pool unless it is the one last told.
func (m *Manager) tell(np *karpv1.NodePool, msg string) {
	if m.told[np.Name] == msg {
		return
	}
	m.told[np.Name] = msg
	m.recorder.Eventf(np, nil, corev1.EventTypeWarning, ReasonProblem, "EventWindow", "%s", msg)
}

// after returns the backoff following one more failure of b (a new spec starts over).
func (m *Manager) after(b backoff, spec string) backoff {
	if b.spec != spec {
		b = backoff{spec: spec}
	}
	b.failures++
	d := RetryBase << min(b.failures-1, 10)
	b.next = m.clk.Now().Add(min(d, RetryMax))
	return b
}

// tagInstances tags the instance of every NodeClaim of a pool that asks for a window (one EC2
// can hold) with the pool's TagInstance, once per instance.
func (m *Manager) tagInstances(ctx context.Context, want map[string]wanted) error {
	var claims karpv1.NodeClaimList
	if err := m.kube.List(ctx, &claims); err != nil {
		return fmt.Errorf("listing NodeClaims: %w", err)
	}
	now := m.clk.Now()
	seen := map[string]bool{}
	todo := map[string][]string{} // tag value -> instance IDs
	for _, nc := range claims.Items {
		id := cluster.InstanceID(nc.Status.ProviderID)
		pool := nc.Labels[karpv1.NodePoolLabelKey]
		if id == "" || pool == "" {
			continue
		}
		seen[id] = true
		if w, ok := want[pool]; !ok || w.err != nil {
			continue
		}
		value := TagValue(m.cluster, pool)
		if m.instances[id] == value || now.Before(m.missing[id]) {
			continue
		}
		todo[value] = append(todo[value], id)
	}
	// Forget the instances whose NodeClaims are gone: the memory stays the cluster's size.
	maps.DeleteFunc(m.instances, func(id, _ string) bool { return !seen[id] })
	maps.DeleteFunc(m.missing, func(id string, _ time.Time) bool { return !seen[id] })
	if len(todo) == 0 || now.Before(m.tagRetry.next) {
		return nil
	}
	for _, value := range slices.Sorted(maps.Keys(todo)) {
		ids := todo[value]
		slices.Sort(ids)
		for batch := range slices.Chunk(ids, tagBatch) {
			err := m.tag(ctx, batch, value)
			if err != nil && notFound(err) && len(batch) > 1 {
				// One instance EC2 does not know yet fails the batch: each on its own.
				for _, id := range batch {
					if err := m.tag(ctx, []string{id}, value); err != nil && !notFound(err) {
						return m.tagFailed(err)
					}
				}
				continue
			}
			if err != nil && !notFound(err) {
				return m.tagFailed(err)
			}
		}
	}
	m.tagRetry = backoff{}
	return nil
}

// tag puts value on ids; an instance EC2 does not know is tried again after RetryBase.
func (m *Manager) tag(ctx context.Context, ids []string, value string) error {
	_, err := m.ec2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: ids, Tags: []ec2types.Tag{{Key: aws.String(TagInstance), Value: aws.String(value)}}})
	if err != nil {
		if notFound(err) && len(ids) == 1 {
			m.missing[ids[0]] = m.clk.Now().Add(RetryBase)
		}
		return err
	}
	for _, id := range ids {
		m.instances[id] = value
		delete(m.missing, id)
	}
	m.tagged.Add(float64(len(ids)))
	return nil
}

// tagFailed backs the tagging off after a failure other than an unknown instance; the
// windows' part of the pass is not held by it.
func (m *Manager) tagFailed(err error) error {
	err = classify(err)
	m.results.WithLabelValues(result(err)).Inc()
	m.tagRetry = m.after(m.tagRetry, "")
	m.log.Error("tagging instances with their pool's EC2 event window target", "err", err, "retry_at", m.tagRetry.next)
	return nil
}

// Next returns when a pool or the tagging in backoff, or the re-read of EC2's windows, is due:
// when the controller runs Pass again if nothing in the cluster changes first.
func (m *Manager) Next() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := m.knownAt.Add(DescribeTTL)
	if m.knownAt.IsZero() {
		next = m.describe.next
	}
	for _, b := range m.retry {
		next = earliest(next, b.next)
	}
	next = earliest(next, m.tagRetry.next)
	for _, t := range m.missing {
		next = earliest(next, t)
	}
	return next
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// Problems returns the problem last told for each pool (for status and tests).
func (m *Manager) Problems() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.told)
}

func fromEC2(w ec2types.InstanceEventWindow) window {
	out := window{id: aws.ToString(w.InstanceEventWindowId)}
	for _, r := range w.TimeRanges {
		out.ranges = append(out.ranges, policy.WeeklyRange{StartDay: weekday(r.StartWeekDay), StartHour: int(aws.ToInt32(r.StartHour)),
			EndDay: weekday(r.EndWeekDay), EndHour: int(aws.ToInt32(r.EndHour))})
	}
	if w.AssociationTarget != nil {
		for _, t := range w.AssociationTarget.Tags {
			out.targets = append(out.targets, aws.ToString(t.Key)+"="+aws.ToString(t.Value))
		}
		out.instances, out.hosts = w.AssociationTarget.InstanceIds, w.AssociationTarget.DedicatedHostIds
	}
	return out
}

func toEC2(ranges []policy.WeeklyRange) []ec2types.InstanceEventWindowTimeRangeRequest {
	out := make([]ec2types.InstanceEventWindowTimeRangeRequest, len(ranges))
	for i, r := range ranges {
		out[i] = ec2types.InstanceEventWindowTimeRangeRequest{
			StartWeekDay: weekDays[r.StartDay], StartHour: aws.Int32(int32(r.StartHour)),
			EndWeekDay: weekDays[r.EndDay], EndHour: aws.Int32(int32(r.EndHour)),
		}
	}
	return out
}

var weekDays = [7]ec2types.WeekDay{ec2types.WeekDaySunday, ec2types.WeekDayMonday, ec2types.WeekDayTuesday, ec2types.WeekDayWednesday,
	ec2types.WeekDayThursday, ec2types.WeekDayFriday, ec2types.WeekDaySaturday}

func weekday(d ec2types.WeekDay) time.Weekday {
	return time.Weekday(max(0, slices.Index(weekDays[:], d)))
}

func sorted(r []policy.WeeklyRange) []policy.WeeklyRange {
	return slices.SortedFunc(slices.Values(r), func(a, b policy.WeeklyRange) int {
		return (int(a.StartDay)*24 + a.StartHour) - (int(b.StartDay)*24 + b.StartHour)
	})
}

func tag(tags []ec2types.Tag, key string) string {
	for _, t := range tags {
		if aws.ToString(t.Key) == key {
			return aws.ToString(t.Value)
		}
	}
	return ""
}

// notFound reports an error for a window or instance EC2 does not know (already deleted, or
// not yet visible).
func notFound(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && strings.HasSuffix(ae.ErrorCode(), ".NotFound")
}

// classify wraps err with ErrRefused or ErrUnavailable, in one place: a client error EC2
// answered (4xx: InvalidParameterValue for a range it cannot hold, a target already in
// another window; the region's limit of windows; UnauthorizedOperation) is a refusal;
// throttling, a server fault and no answer are unavailability.
func classify(err error) error {
	if errors.Is(err, ErrRefused) || errors.Is(err, ErrUnavailable) {
		return err
	}
	if awscalls.Unanswered(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrRefused, err)
}

// callError is a failed call: what the manager was doing, and EC2's error (classified).
type callError struct {
	what string
	err  error
}

func callErr(what string, err error) error { return &callError{what: what, err: classify(err)} }

func (e *callError) Error() string { return e.what + ": " + e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// brief says a failed call for an Event note: what was done, and EC2's answer without the
// SDK's wrapping ("EC2 refused (ResourceLimitExceeded: ...)").
func brief(err error) string {
	what := ""
	var ce *callError
	if errors.As(err, &ce) {
		what = ce.what + ": "
	}
	kind := "EC2 unavailable"
	if errors.Is(err, ErrRefused) {
		kind = "EC2 refused"
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return fmt.Sprintf("%s%s (%s: %s)", what, kind, ae.ErrorCode(), ae.ErrorMessage())
	}
	return fmt.Sprintf("%s%s (%v)", what, kind, err)
}

func result(err error) string {
	if errors.Is(err, ErrRefused) {
		return ResultRefused
	}
	return ResultUnavailable
}
