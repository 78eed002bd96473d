package watchdog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/aws/smithy-go"
	"github.com/awslabs/operatorpkg/status"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-base/featuregate"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/record/recordtest"
	"github.com/health-router/health-router/router/watchdog"
)

// fakeEC2 answers DescribeImages as EC2 does for ImageIds: every image known, or
// InvalidAMIID.NotFound for the whole call.
type fakeEC2 struct {
	mu     sync.Mutex
	states map[string]ec2types.ImageState
	err    error
	calls  int
}

func (f *fakeEC2) DescribeImages(_ context.Context, in *ec2.DescribeImagesInput, _ ...func(*ec2.Options)) (*ec2.DescribeImagesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	out := &ec2.DescribeImagesOutput{}
	for _, id := range in.ImageIds {
		st, ok := f.states[id]
		if !ok {
			return nil, &smithy.GenericAPIError{Code: "InvalidAMIID.NotFound", Message: fmt.Sprintf("The image id '[%s]' does not exist", id)}
		}
		out.Images = append(out.Images, ec2types.Image{ImageId: aws.String(id), State: st})
	}
	return out, nil
}

func (f *fakeEC2) set(id string, st ec2types.ImageState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.states[id] = st
}

func (f *fakeEC2) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// rig is a watchdog over a fake client, a fake clock, a fake recorder and a fresh registry.
type rig struct {
	t        *testing.T
	kube     client.Client
	ec2      *fakeEC2
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	reg      *prometheus.Registry
	wd       *watchdog.Watchdog
}

type rigOpts struct {
	gates  string // e.g. "ReservedCapacity=false"
	opts   watchdog.Options
	objs   []client.Object
	funcs  *interceptor.Funcs
	start  time.Time
	ec2    map[string]ec2types.ImageState
	ec2Err error
}

func newRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(o.objs...)
	if o.funcs != nil {
		b = b.WithInterceptorFuncs(*o.funcs)
	}
	if o.start.IsZero() {
		o.start = time.Now()
	}
	if o.ec2 == nil {
		o.ec2 = map[string]ec2types.ImageState{}
	}
	kube := b.Build()
	recordtest.FromAnnotations(t, kube)
	r := &rig{t: t, kube: kube, ec2: &fakeEC2{states: o.ec2, err: o.ec2Err}, clock: clocktesting.NewFakeClock(o.start),
		recorder: events.NewFakeRecorder(100), reg: prometheus.NewRegistry()}
	g := checks.NewFeatureGates()
	if o.gates != "" {
		if err := g.Set(o.gates); err != nil {
			t.Fatal(err)
		}
	}
	r.wd = watchdog.New(r.kube, r.ec2, r.recorder, featuregate.FeatureGate(g), r.clock, r.reg, o.opts)
	return r
}

// scan runs one scan that must succeed.
func (r *rig) scan() watchdog.Findings {
	r.t.Helper()
	f, err := r.wd.Scan(context.Background())
	if err != nil {
		r.t.Fatalf("Scan: %v", err)
	}
	return f
}

// events returns the Events posted since the last call.
func (r *rig) events() []string {
	var out []string
	for {
		select {
		case e := <-r.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// gauge returns the value of a watchdog gauge series, failing if it does not exist.
func (r *rig) gauge(name, label string) float64 {
	r.t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == label {
				return m.GetGauge().GetValue()
			}
		}
	}
	r.t.Fatalf("no series %s{%s}", name, label)
	return 0
}

// series returns the label values of a watchdog gauge's series.
func (r *rig) series(name string) []string {
	r.t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, mf := range families {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out = append(out, m.GetLabel()[0].GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

func (r *rig) update(obj client.Object) {
	r.t.Helper()
	if err := r.kube.Update(context.Background(), obj); err != nil {
		r.t.Fatalf("updating %s: %v", obj.GetName(), err)
	}
}

func nodePool(name string, policy karpv1.ConsolidationPolicy, after string) *karpv1.NodePool {
	return &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: karpv1.NodePoolSpec{Disruption: karpv1.Disruption{
		ConsolidationPolicy: policy, ConsolidateAfter: karpv1.MustParseNillableDuration(after),
	}}}
}

func cond(typ string, st metav1.ConditionStatus, since time.Time) status.Condition {
	return status.Condition{Type: typ, Status: st, Reason: typ, LastTransitionTime: metav1.NewTime(since)}
}

func nodeClaim(name, pool string, labels map[string]string, conds ...status.Condition) *karpv1.NodeClaim {
	l := map[string]string{karpv1.NodePoolLabelKey: pool}
	for k, v := range labels {
		l[k] = v
	}
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, UID: types.UID("uid-" + name)}, Status: karpv1.NodeClaimStatus{Conditions: conds}}
}

func TestStuckEmpty(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	whenEmpty := func(after string) *karpv1.NodePool {
		return nodePool("pool", karpv1.ConsolidationPolicyWhenEmpty, after)
	}
	static := whenEmpty("5m")
	static.Spec.Replicas = ptr.To[int64](3)
	deleting := nodeClaim("claim", "pool", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-time.Hour)))
	deleting.Finalizers = []string{"karpenter.sh/termination"}
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	// Emptied on purpose: a reboot in place runs on it (issue 25: flagged as stuck before).
	rebooting := emptyFor("pool", now, 48*time.Hour)
	rebooting.Annotations = map[string]string{inplace.Annotation: `{"version":1,"event_id":"ev-1","type":"system-reboot","step":"await"}`}
	for _, tc := range []struct {
		name   string
		pool   *karpv1.NodePool
		claim  *karpv1.NodeClaim
		grace  time.Duration
		stuck  bool
		series bool // whether the pool has a gauge series
	}{
		{"empty past consolidateAfter+grace", whenEmpty("5m"), emptyFor("pool", now, 15*time.Minute+time.Second), 0, true, true},
		{"empty exactly consolidateAfter+grace", whenEmpty("5m"), emptyFor("pool", now, 15*time.Minute), 0, false, true},
		{"empty within the grace", whenEmpty("5m"), emptyFor("pool", now, 14*time.Minute), 0, false, true},
		{"custom grace", whenEmpty("5m"), emptyFor("pool", now, 7*time.Minute), time.Minute, true, true},
		{"consolidateAfter 0s", whenEmpty("0s"), emptyFor("pool", now, 11*time.Minute), 0, true, true},
		{"consolidateAfter Never", whenEmpty("Never"), emptyFor("pool", now, 48*time.Hour), 0, false, false},
		{"WhenEmptyOrUnderutilized", nodePool("pool", karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized, "5m"), emptyFor("pool", now, 48*time.Hour), 0, false, false},
		{"static pool", static, emptyFor("pool", now, 48*time.Hour), 0, false, false},
		{"Empty False", whenEmpty("5m"), nodeClaim("claim", "pool", nil, cond(watchdog.ConditionEmpty, metav1.ConditionFalse, now.Add(-48*time.Hour))), 0, false, true},
		{"no Empty condition", whenEmpty("5m"), nodeClaim("claim", "pool", nil, cond(karpv1.ConditionTypeConsolidatable, metav1.ConditionTrue, now.Add(-48*time.Hour))), 0, false, true},
		{"being deleted", whenEmpty("5m"), deleting, 0, false, true},
		{"a reboot in place in progress", whenEmpty("5m"), rebooting, 0, false, true},
		{"another pool's claim", whenEmpty("5m"), emptyFor("other", now, 48*time.Hour), 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOpts{start: now, objs: []client.Object{tc.pool, tc.claim}, opts: watchdog.Options{EmptyGrace: tc.grace}})
			f := r.scan()
			if got := len(f.StuckEmpty) == 1; got != tc.stuck {
				t.Fatalf("stuck = %v, want %v: %+v", got, tc.stuck, f.StuckEmpty)
			}
			if !tc.series {
				if s := r.series(metrics.WatchdogStuckEmpty); len(s) != 0 {
					t.Errorf("series %v for an unchecked pool", s)
				}
				return
			}
			want := 0.0
			if tc.stuck {
				want = 1
				if s := f.StuckEmpty[0]; s.NodePool != "pool" || !slices.Equal(s.NodeClaims, []string{"claim"}) {
					t.Errorf("finding %+v", s)
				}
			}
			if got := r.gauge(metrics.WatchdogStuckEmpty, "pool"); got != want {
				t.Errorf("gauge = %v, want %v", got, want)
			}
			if got := f.Counts()[watchdog.FindingStuckEmpty]; got != int(want) {
				t.Errorf("Counts = %d, want %v", got, want)
			}
		})
	}
}

// emptyFor is a NodeClaim of pool whose Empty condition turned True d before now.
func emptyFor(pool string, now time.Time, d time.Duration) *karpv1.NodeClaim {
	return nodeClaim("claim", pool, nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-d)))
}

// TestStuckEmptyEvents posts an Event when a pool's set of stuck NodeClaims changes, not at
// every scan, and again when the problem recurs after clearing.
func TestStuckEmptyEvents(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	a := nodeClaim("batch-a", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-20*time.Minute)))
	b := nodeClaim("batch-b", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-5*time.Minute)))
	r := newRig(t, rigOpts{start: now, objs: []client.Object{nodePool("batch", karpv1.ConsolidationPolicyWhenEmpty, "5m"), a, b}})

	r.scan()
	ev := r.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonStuckEmpty+" ") || !strings.Contains(ev[0], "batch-a") || strings.Contains(ev[0], "batch-b") {
		t.Fatalf("events = %q", ev)
	}
	r.clock.Step(time.Minute)
	r.scan()
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("unchanged finding posted again: %q", ev)
	}
	// b passes consolidateAfter + grace: the finding changes.
	r.clock.Step(10 * time.Minute)
	f := r.scan()
	if ev := r.events(); len(ev) != 1 || !strings.Contains(ev[0], "batch-a, batch-b") {
		t.Fatalf("events = %q", ev)
	}
	if got := r.gauge(metrics.WatchdogStuckEmpty, "batch"); got != 2 {
		t.Errorf("gauge = %v, want 2", got)
	}
	if s := f.StuckEmpty[0]; !s.Since.Equal(now.Add(-20*time.Minute)) || s.ConsolidateAfter != 5*time.Minute {
		t.Errorf("finding %+v", s)
	}
	if got := r.wd.Findings(); got.At != f.At || len(got.StuckEmpty) != 1 {
		t.Errorf("Findings() = %+v, want the last scan's", got)
	}

	// Karpenter restarted and removed them: the finding clears, silently.
	for _, c := range []*karpv1.NodeClaim{a, b} {
		if err := r.kube.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	r.clock.Step(time.Minute)
	if f := r.scan(); len(f.StuckEmpty) != 0 || f.Counts()[watchdog.FindingStuckEmpty] != 0 {
		t.Fatalf("findings after fix: %+v", f)
	}
	if got := r.gauge(metrics.WatchdogStuckEmpty, "batch"); got != 0 {
		t.Errorf("gauge after fix = %v", got)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events after fix: %q", ev)
	}
	// It recurs: announced again.
	c := nodeClaim("batch-c", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, r.clock.Now().Add(-time.Hour)))
	c.UID = ""
	if err := r.kube.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	r.scan()
	if ev := r.events(); len(ev) != 1 || !strings.Contains(ev[0], "batch-c") {
		t.Fatalf("recurrence events = %q", ev)
	}
	// A pool that stops being WhenEmpty loses its series.
	pool := &karpv1.NodePool{}
	if err := r.kube.Get(context.Background(), client.ObjectKey{Name: "batch"}, pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Disruption.ConsolidationPolicy = karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized
	r.update(pool)
	r.scan()
	if s := r.series(metrics.WatchdogStuckEmpty); len(s) != 0 {
		t.Errorf("series after policy change: %v", s)
	}
}

func nodeClass(name string, ids ...string) *awsv1.EC2NodeClass {
	nc := &awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, id := range ids {
		nc.Status.AMIs = append(nc.Status.AMIs, awsv1.AMI{ID: id, Name: "name-" + id})
	}
	return nc
}

func TestUnavailableImages(t *testing.T) {
	r := newRig(t, rigOpts{
		objs: []client.Object{nodeClass("general", "ami-a", "ami-b"), nodeClass("gpu", "ami-a", "ami-c", "ami-d"), nodeClass("good", "ami-a", "ami-a"), nodeClass("unresolved")},
		ec2:  map[string]ec2types.ImageState{"ami-a": ec2types.ImageStateAvailable, "ami-b": ec2types.ImageStatePending, "ami-c": ec2types.ImageStateDisabled},
	})
	f := r.scan()
	for class, want := range map[string]float64{"general": 1, "gpu": 2, "good": 0, "unresolved": 0} {
		if got := r.gauge(metrics.WatchdogUnavailableImage, class); got != want {
			t.Errorf("gauge{%s} = %v, want %v", class, got, want)
		}
	}
	want := []watchdog.UnavailableImages{
		{NodeClass: "general", Images: []watchdog.ImageState{{ID: "ami-b", Name: "name-ami-b", State: "pending"}}},
		{NodeClass: "gpu", Images: []watchdog.ImageState{{ID: "ami-c", Name: "name-ami-c", State: "disabled"}, {ID: "ami-d", Name: "name-ami-d", State: watchdog.StateMissing}}},
	}
	if fmt.Sprint(f.UnavailableImages) != fmt.Sprint(want) {
		t.Fatalf("findings = %+v\nwant %+v", f.UnavailableImages, want)
	}
	if got := f.Counts()[watchdog.FindingUnavailableImage]; got != 3 {
		t.Errorf("Counts = %d, want 3", got)
	}
	ev := r.events()
	slices.Sort(ev)
	if len(ev) != 2 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonImageUnavailable) ||
		!strings.Contains(ev[0], "ami-b (name-ami-b): pending") ||
		!strings.Contains(ev[1], "ami-c (name-ami-c): disabled, ami-d (name-ami-d): missing") {
		t.Fatalf("events = %q", ev)
	}
	// One call for the set failed on the missing image, then one per image.
	calls := r.ec2.numCalls()
	if calls != 1+4 {
		t.Errorf("DescribeImages calls = %d, want 5", calls)
	}

	// Within the TTL: no call, no Event.
	r.ec2.set("ami-b", ec2types.ImageStateAvailable)
	r.clock.Step(time.Minute)
	if f := r.scan(); len(f.UnavailableImages) != 2 {
		t.Fatalf("cached findings = %+v", f.UnavailableImages)
	}
	if got := r.ec2.numCalls(); got != calls {
		t.Errorf("DescribeImages calls within the TTL = %d, want %d", got, calls)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events = %q", ev)
	}

	// An AMI State Change event invalidates one image: the next scan asks again.
	r.ec2.set("ami-c", ec2types.ImageStateAvailable)
	r.wd.InvalidateImage("ami-c")
	r.scan()
	if got := r.gauge(metrics.WatchdogUnavailableImage, "gpu"); got != 1 {
		t.Errorf("gauge{gpu} after invalidation = %v, want 1", got)
	}
	if ev := r.events(); len(ev) != 1 || !strings.Contains(ev[0], "ami-d (name-ami-d): missing") || strings.Contains(ev[0], "ami-c") {
		t.Fatalf("events after invalidation = %q", ev)
	}

	// Past the TTL, ami-b is available: general clears; gpu is unchanged, so no Event.
	r.clock.Step(5 * time.Minute)
	f = r.scan()
	if got := r.gauge(metrics.WatchdogUnavailableImage, "general"); got != 0 {
		t.Errorf("gauge{general} after fix = %v", got)
	}
	if len(f.UnavailableImages) != 1 || f.UnavailableImages[0].NodeClass != "gpu" {
		t.Fatalf("findings after fix = %+v", f.UnavailableImages)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events = %q", ev)
	}

	// A deleted EC2NodeClass loses its series.
	if err := r.kube.Delete(context.Background(), nodeClass("gpu")); err != nil {
		t.Fatal(err)
	}
	r.scan()
	if got := r.series(metrics.WatchdogUnavailableImage); !slices.Equal(got, []string{"general", "good", "unresolved"}) {
		t.Errorf("series = %v", got)
	}
}

// TestUnavailableImagesEC2Down keeps the last answer when EC2 does not answer, and says so.
func TestUnavailableImagesEC2Down(t *testing.T) {
	r := newRig(t, rigOpts{
		objs: []client.Object{nodeClass("general", "ami-a", "ami-b")},
		ec2:  map[string]ec2types.ImageState{"ami-a": ec2types.ImageStateAvailable, "ami-b": ec2types.ImageStatePending},
	})
	r.scan()
	r.events()
	r.ec2.mu.Lock()
	r.ec2.err = &smithy.GenericAPIError{Code: "RequestLimitExceeded", Message: "Request limit exceeded."}
	r.ec2.mu.Unlock()
	r.clock.Step(6 * time.Minute)
	f, err := r.wd.Scan(context.Background())
	if err == nil || !strings.Contains(err.Error(), "RequestLimitExceeded") {
		t.Fatalf("Scan error = %v, want the throttling error", err)
	}
	if len(f.UnavailableImages) != 1 || f.UnavailableImages[0].Images[0].ID != "ami-b" {
		t.Fatalf("findings = %+v, want the last answer kept", f.UnavailableImages)
	}
	if got := r.gauge(metrics.WatchdogUnavailableImage, "general"); got != 1 {
		t.Errorf("gauge = %v, want 1 (kept)", got)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events = %q", ev)
	}
	// A missing image is an answer, not an outage.
	r2 := newRig(t, rigOpts{objs: []client.Object{nodeClass("general", "ami-gone")}})
	if f := r2.scan(); len(f.UnavailableImages) != 1 || f.UnavailableImages[0].Images[0].State != watchdog.StateMissing {
		t.Fatalf("findings = %+v", f.UnavailableImages)
	}
}

// reservedClaim is a NodeClaim launched into a capacity reservation, Drifted, held by
// Karpenter's termination finalizer.
func reservedClaim(name, pool string, deletedAt *time.Time) *karpv1.NodeClaim {
	c := nodeClaim(name, pool, map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeReserved, awsv1.LabelCapacityReservationID: "cr-0123456789abcdef0"},
		cond(karpv1.ConditionTypeDrifted, metav1.ConditionTrue, time.Now().Add(-time.Hour)))
	c.Finalizers = []string{"karpenter.sh/termination"}
	if deletedAt != nil {
		c.DeletionTimestamp = &metav1.Time{Time: *deletedAt}
	}
	return c
}

func TestReservationDrift(t *testing.T) {
	// The router's clock is a day behind the API server here, so every deletion counts
	// from the scan that first sees it: the test steps time between deletions.
	r := newRig(t, rigOpts{gates: "ReservedCapacity=false", start: time.Now().Add(-24 * time.Hour),
		objs: []client.Object{nodePool("db", karpv1.ConsolidationPolicyWhenEmpty, "Never"), nodePool("web", karpv1.ConsolidationPolicyWhenEmpty, "Never")}})
	ctx := context.Background()
	create := func(c *karpv1.NodeClaim) {
		t.Helper()
		if err := r.kube.Create(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	replace := func(c *karpv1.NodeClaim) {
		t.Helper()
		create(c)
		if err := r.kube.Delete(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Not counted: on-demand and drifted; reserved and deleted but not drifted; reserved,
	// drifted, not deleted.
	onDemand := nodeClaim("db-od", "db", map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeOnDemand}, cond(karpv1.ConditionTypeDrifted, metav1.ConditionTrue, time.Now()))
	onDemand.Finalizers = []string{"karpenter.sh/termination"}
	replace(onDemand)
	notDrifted := reservedClaim("db-nd", "db", nil)
	notDrifted.Status.Conditions = nil
	replace(notDrifted)
	create(reservedClaim("db-live", "db", nil))

	replace(reservedClaim("db-1", "db", nil))
	r.scan()
	r.clock.Step(10 * time.Minute)
	// Only the reservation-id label: counted too.
	byID := reservedClaim("db-2", "db", nil)
	delete(byID.Labels, karpv1.CapacityTypeLabelKey)
	replace(byID)
	f := r.scan()
	if got := r.gauge(metrics.WatchdogReservationDrift, "db"); got != 2 {
		t.Fatalf("gauge{db} = %v, want 2", got)
	}
	if got := r.gauge(metrics.WatchdogReservationDrift, "web"); got != 0 {
		t.Errorf("gauge{web} = %v, want 0", got)
	}
	if len(f.ReservationDrift) != 0 || len(r.events()) != 0 {
		t.Fatalf("flagged below the threshold: %+v", f.ReservationDrift)
	}
	// The first replacement finishes: its NodeClaim vanishes, its count stays.
	for _, name := range []string{"db-1"} {
		c := &karpv1.NodeClaim{}
		if err := r.kube.Get(ctx, client.ObjectKey{Name: name}, c); err != nil {
			t.Fatal(err)
		}
		c.Finalizers = nil
		r.update(c)
	}
	r.clock.Step(10 * time.Minute)
	replace(reservedClaim("db-3", "db", nil))
	f = r.scan()
	if len(f.ReservationDrift) != 1 || f.ReservationDrift[0] != (watchdog.ReservationDrift{NodePool: "db", Replacements: 3, Window: time.Hour}) {
		t.Fatalf("findings = %+v", f.ReservationDrift)
	}
	if got := f.Counts()[watchdog.FindingReservationDrift]; got != 3 {
		t.Errorf("Counts = %d", got)
	}
	ev := r.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonReservationDriftLoop+" 3 NodeClaim(s)") {
		t.Fatalf("events = %q", ev)
	}
	// A fourth replacement: the gauge follows, but the loop was already announced.
	r.clock.Step(10 * time.Minute)
	replace(reservedClaim("db-4", "db", nil))
	r.scan()
	if got := r.gauge(metrics.WatchdogReservationDrift, "db"); got != 4 {
		t.Errorf("gauge{db} = %v, want 4", got)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events = %q", ev)
	}
	// The window slides: db-1 and db-2 (recorded 30 and 20 minutes ago) leave it within
	// another 45 minutes; the count falls below the threshold and the finding clears.
	r.clock.Step(45 * time.Minute)
	f = r.scan()
	if got := r.gauge(metrics.WatchdogReservationDrift, "db"); got != 2 {
		t.Errorf("gauge{db} = %v, want 2", got)
	}
	if len(f.ReservationDrift) != 0 {
		t.Fatalf("findings after the window = %+v", f.ReservationDrift)
	}
	r.clock.Step(time.Hour)
	r.scan()
	if got := r.gauge(metrics.WatchdogReservationDrift, "db"); got != 0 {
		t.Errorf("gauge{db} after the window = %v, want 0", got)
	}
}

// TestReservationDriftDeletionTime counts from the NodeClaim's deletion time: a replacement
// that started before the window does not count, even when first seen now.
func TestReservationDriftDeletionTime(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) *time.Time { t := now.Add(-d); return &t }
	r := newRig(t, rigOpts{gates: "ReservedCapacity=false", start: now, opts: watchdog.Options{DriftWindow: 30 * time.Minute, DriftThreshold: 2},
		objs: []client.Object{
			reservedClaim("a", "db", at(2*time.Hour)), reservedClaim("b", "db", at(40*time.Minute)),
			reservedClaim("c", "db", at(10*time.Minute)), reservedClaim("d", "db", at(time.Minute)),
		}})
	f := r.scan()
	if len(f.ReservationDrift) != 1 || f.ReservationDrift[0].Replacements != 2 || f.ReservationDrift[0].Window != 30*time.Minute {
		t.Fatalf("findings = %+v", f.ReservationDrift)
	}
	// Seen again at the next scan: counted once.
	r.clock.Step(time.Minute)
	r.scan()
	if got := r.gauge(metrics.WatchdogReservationDrift, "db"); got != 2 {
		t.Errorf("gauge = %v, want 2", got)
	}
}

// TestReservationDriftGateOn reports nothing: with the gate on Karpenter has no such loop.
func TestReservationDriftGateOn(t *testing.T) {
	now := time.Now()
	r := newRig(t, rigOpts{start: now, opts: watchdog.Options{DriftThreshold: 1},
		objs: []client.Object{nodePool("db", karpv1.ConsolidationPolicyWhenEmpty, "Never"), reservedClaim("a", "db", &now), reservedClaim("b", "db", &now)}})
	f := r.scan()
	if len(f.ReservationDrift) != 0 || f.Counts()[watchdog.FindingReservationDrift] != 0 {
		t.Fatalf("findings = %+v", f.ReservationDrift)
	}
	if n := testutil.CollectAndCount(r.reg, metrics.WatchdogReservationDrift); n != 0 {
		t.Errorf("%d reservation-drift series with the gate on", n)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("events = %q", ev)
	}
}

// TestScanListError keeps a detector's findings when the cache cannot be read.
func TestScanListError(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	var fail bool
	funcs := &interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
		if _, ok := l.(*karpv1.NodeClaimList); ok && fail {
			return errors.New("cache not started")
		}
		return c.List(ctx, l, opts...)
	}}
	r := newRig(t, rigOpts{start: now, funcs: funcs, objs: []client.Object{nodePool("batch", karpv1.ConsolidationPolicyWhenEmpty, "5m"), emptyFor("batch", now, time.Hour)}})
	r.scan()
	if len(r.events()) != 1 {
		t.Fatal("no event for the stuck NodeClaim")
	}
	fail = true
	f, err := r.wd.Scan(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cache not started") {
		t.Fatalf("Scan error = %v", err)
	}
	if len(f.StuckEmpty) != 1 || r.gauge(metrics.WatchdogStuckEmpty, "batch") != 1 {
		t.Fatalf("findings = %+v, want the last kept", f.StuckEmpty)
	}
	if ev := r.events(); len(ev) != 0 {
		t.Fatalf("kept finding announced again: %q", ev)
	}
}

// TestStart scans at once, then every interval, on the leader only, until cancelled.
func TestStart(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	r := newRig(t, rigOpts{start: now, opts: watchdog.Options{Interval: 30 * time.Second}})
	if !r.wd.NeedLeaderElection() {
		t.Error("NeedLeaderElection = false: every replica would post Events")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.wd.Start(ctx) }()
	waitFor(t, func() bool { return r.wd.Findings().At.Equal(now) })
	waitFor(t, r.clock.HasWaiters)
	r.clock.Step(29 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if !r.wd.Findings().At.Equal(now) {
		t.Fatal("scanned before the interval")
	}
	r.clock.Step(time.Second)
	waitFor(t, func() bool { return r.wd.Findings().At.Equal(now.Add(30 * time.Second)) })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Start = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after cancel")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// TestEventNoteBounded cuts an Event note to the 1 kB the API server accepts, listing the
// first images and how many more.
func TestEventNoteBounded(t *testing.T) {
	var ids []string
	states := map[string]ec2types.ImageState{}
	for i := range 30 {
		id := fmt.Sprintf("ami-%017d", i)
		ids = append(ids, id)
		states[id] = ec2types.ImageStateDeregistered
	}
	nc := nodeClass("general", ids...)
	for i := range nc.Status.AMIs {
		nc.Status.AMIs[i].Name = strings.Repeat("bottlerocket-aws-k8s-1.37-nvidia-x86_64-", 2)
	}
	r := newRig(t, rigOpts{objs: []client.Object{nc}, ec2: states})
	if f := r.scan(); f.Counts()[watchdog.FindingUnavailableImage] != 30 {
		t.Fatalf("counts = %v", f.Counts())
	}
	ev := r.events()
	if len(ev) != 1 {
		t.Fatalf("events = %q", ev)
	}
	note := strings.TrimPrefix(ev[0], "Warning "+watchdog.ReasonImageUnavailable+" ")
	if len(note) > 1024 || !strings.HasSuffix(note, "...") || !strings.HasPrefix(note, "status.amis names 30 image(s)") || !strings.Contains(note, ids[0]+" (") {
		t.Errorf("note (%d bytes) = %q", len(note), note)
	}
}
