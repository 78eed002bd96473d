// Package watchdog_test runs the Karpenter watchdog against a real kube-apiserver with the
// Karpenter CRDs (envtest) and moto's EC2: the objects are created, updated and deleted
// through the API server as Karpenter would, and the watchdog reads them through a
// controller-runtime cache, as in the router.
package watchdog_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/awslabs/operatorpkg/status"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/watchdog"
	"github.com/health-router/health-router/test/harness"
)

// kube is a kube-apiserver with the Karpenter CRDs, a client that writes to it and a cache
// that reads from it.
type kube struct {
	t      *testing.T
	ctx    context.Context
	cfg    *rest.Config
	client client.Client
	cache  cache.Cache
}

func newKube(t *testing.T) *kube {
	t.Helper()
	if testing.Short() {
		t.Skip("envtest suite; run without -short")
	}
	ctrl.SetLogger(logr.Discard())
	k := &kube{t: t, cfg: harness.KubeAPIServer(t)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	k.ctx = ctx
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if k.client, err = client.New(k.cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	if k.cache, err = cache.New(k.cfg, cache.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.cache.Start(ctx) }()
	if !k.cache.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return k
}

func (k *kube) create(obj client.Object) {
	k.t.Helper()
	if err := k.client.Create(k.ctx, obj); err != nil {
		k.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func (k *kube) updateStatus(obj client.Object) {
	k.t.Helper()
	if err := k.client.Status().Update(k.ctx, obj); err != nil {
		k.t.Fatalf("status of %T %s: %v", obj, obj.GetName(), err)
	}
}

func (k *kube) nodeClass(name string) {
	k.create(&awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: awsv1.EC2NodeClassSpec{
		Role: "KarpenterNodeRole-test", AMISelectorTerms: []awsv1.AMISelectorTerm{{Alias: "al2023@latest"}},
		SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
		SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
	}})
}

// setAMIs sets an EC2NodeClass's status.amis, as Karpenter does when it resolves images.
func (k *kube) setAMIs(name string, ids ...string) {
	k.t.Helper()
	nc := &awsv1.EC2NodeClass{}
	if err := k.client.Get(k.ctx, client.ObjectKey{Name: name}, nc); err != nil {
		k.t.Fatal(err)
	}
	nc.Status.AMIs = nil
	for _, id := range ids {
		nc.Status.AMIs = append(nc.Status.AMIs, awsv1.AMI{ID: id, Requirements: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}})
	}
	k.updateStatus(nc)
}

func (k *kube) nodePool(name string, policy karpv1.ConsolidationPolicy, after string) {
	k.create(&karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
			}},
			Disruption: karpv1.Disruption{ConsolidationPolicy: policy, ConsolidateAfter: karpv1.MustParseNillableDuration(after)},
		},
	})
}

// nodeClaim creates a NodeClaim held by Karpenter's termination finalizer, then sets its
// status conditions through the status subresource.
func (k *kube) nodeClaim(name, pool string, labels map[string]string, conds ...status.Condition) *karpv1.NodeClaim {
	k.t.Helper()
	l := map[string]string{karpv1.NodePoolLabelKey: pool, corev1.LabelArchStable: "amd64"}
	for key, v := range labels {
		l[key] = v
	}
	c := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Finalizers: []string{"karpenter.sh/termination"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{pool}}},
		},
	}
	k.create(c)
	c.Status.Conditions = conds
	k.updateStatus(c)
	return c
}

func (k *kube) setConditions(name string, conds ...status.Condition) {
	k.t.Helper()
	c := &karpv1.NodeClaim{}
	if err := k.client.Get(k.ctx, client.ObjectKey{Name: name}, c); err != nil {
		k.t.Fatal(err)
	}
	c.Status.Conditions = conds
	k.updateStatus(c)
}

func (k *kube) deleteClaim(name string) {
	k.t.Helper()
	if err := k.client.Delete(k.ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		k.t.Fatal(err)
	}
}

// release removes a NodeClaim's finalizer: Karpenter finished terminating it, and it is gone.
func (k *kube) release(name string) {
	k.t.Helper()
	c := &karpv1.NodeClaim{}
	if err := k.client.Get(k.ctx, client.ObjectKey{Name: name}, c); err != nil {
		k.t.Fatal(err)
	}
	c.Finalizers = nil
	if err := k.client.Update(k.ctx, c); err != nil {
		k.t.Fatal(err)
	}
}

func cond(typ string, st metav1.ConditionStatus, since time.Time) status.Condition {
	return status.Condition{Type: typ, Status: st, Reason: typ + string(st), Message: "", LastTransitionTime: metav1.NewTime(since)}
}

// eventually polls cond until it holds, within 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within 20s", what)
	}
}

// scanUntil scans until cond holds for the findings (the cache follows the API server
// shortly after each write) and returns them.
func scanUntil(t *testing.T, wd *watchdog.Watchdog, what string, cond func(watchdog.Findings) bool) watchdog.Findings {
	t.Helper()
	var f watchdog.Findings
	eventually(t, what, func() bool {
		var err error
		f, err = wd.Scan(context.Background())
		if err != nil {
			t.Logf("scan: %v", err)
			return false
		}
		return cond(f)
	})
	return f
}

// gauge returns a watchdog gauge's series as label value -> value.
func gauge(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range families {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func drain(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			slices.Sort(out)
			return out
		}
	}
}

// TestStuckEmptyUnderManager runs the watchdog as the router does, a leader runnable of a
// controller-runtime manager reading the manager's cache, with a fake clock driving scans.
func TestStuckEmptyUnderManager(t *testing.T) {
	k := newKube(t)
	now := time.Now()
	k.nodeClass("default")
	k.nodePool("batch", karpv1.ConsolidationPolicyWhenEmpty, "1m")
	k.nodePool("web", karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized, "1m")
	k.nodePool("never", karpv1.ConsolidationPolicyWhenEmpty, "Never")
	// Empty for 20 minutes: past consolidateAfter (1m) + grace (10m). Another empty for 2
	// minutes, one not empty, and empty ones in pools the detector does not apply to.
	k.nodeClaim("batch-stuck", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-20*time.Minute)))
	k.nodeClaim("batch-fresh", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-2*time.Minute)))
	k.nodeClaim("batch-busy", "batch", nil, cond(watchdog.ConditionEmpty, metav1.ConditionFalse, now.Add(-time.Hour)))
	k.nodeClaim("web-empty", "web", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-time.Hour)))
	k.nodeClaim("never-empty", "never", nil, cond(watchdog.ConditionEmpty, metav1.ConditionTrue, now.Add(-time.Hour)))

	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(k.cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(now)
	reg := prometheus.NewRegistry()
	recorder := events.NewFakeRecorder(100)
	wd := watchdog.New(mgr.GetCache(), &ec2.Client{}, recorder, checks.NewFeatureGates(), clk, reg, watchdog.Options{Interval: time.Second})
	if err := mgr.Add(wd); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(k.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("manager did not stop within 30s")
		}
	})
	// tick lets the watchdog's next scan run (it waits one fake second between scans).
	tick := func() {
		if clk.HasWaiters() {
			clk.Step(time.Second)
		}
	}

	eventually(t, "stuck NodeClaim flagged", func() bool {
		tick()
		f := wd.Findings()
		return len(f.StuckEmpty) == 1 && slices.Equal(f.StuckEmpty[0].NodeClaims, []string{"batch-stuck"})
	})
	if got := gauge(t, reg, metrics.WatchdogStuckEmpty); len(got) != 1 || got["batch"] != 1 {
		t.Errorf("gauge = %v, want batch=1 only (web and never are not WhenEmpty with a consolidateAfter)", got)
	}
	if got := wd.Findings().Counts(); got[watchdog.FindingStuckEmpty] != 1 || got[watchdog.FindingUnavailableImage] != 0 || got[watchdog.FindingReservationDrift] != 0 {
		t.Errorf("Counts = %v", got)
	}
	// Several scans, one Event.
	for range 3 {
		at := wd.Findings().At
		eventually(t, "another scan", func() bool { tick(); return wd.Findings().At.After(at) })
	}
	ev := drain(recorder)
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonStuckEmpty+" 1 NodeClaim(s)") || !strings.Contains(ev[0], "batch-stuck") {
		t.Fatalf("events = %q", ev)
	}

	// Karpenter, restarted, notices the node is no longer empty (or removes it): cleared.
	k.setConditions("batch-stuck", cond(watchdog.ConditionEmpty, metav1.ConditionFalse, now))
	eventually(t, "finding cleared", func() bool {
		tick()
		return len(wd.Findings().StuckEmpty) == 0
	})
	if got := gauge(t, reg, metrics.WatchdogStuckEmpty); got["batch"] != 0 {
		t.Errorf("gauge after fix = %v", got)
	}
	if ev := drain(recorder); len(ev) != 0 {
		t.Fatalf("events after fix = %q", ev)
	}
}

// TestUnavailableImagesMoto asks moto's EC2 for the images of EC2NodeClasses; a
// deregistered image is missing.
func TestUnavailableImagesMoto(t *testing.T) {
	k := newKube(t)
	url := harness.Moto(t)
	counter := &harness.Counter{}
	ec2c := ec2.NewFromConfig(harness.AWSConfig(counter), func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) })
	register := func(name string) string {
		out, err := ec2c.RegisterImage(k.ctx, &ec2.RegisterImageInput{Name: aws.String(name), Architecture: ec2types.ArchitectureValuesX8664, RootDeviceName: aws.String("/dev/xvda")})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.ImageId)
	}
	current, old := register("al2023-current"), register("al2023-old")
	if _, err := ec2c.DeregisterImage(k.ctx, &ec2.DeregisterImageInput{ImageId: aws.String(old)}); err != nil {
		t.Fatal(err)
	}
	k.nodeClass("general")
	k.setAMIs("general", current, old)
	k.nodeClass("fine")
	k.setAMIs("fine", current)
	k.nodeClass("unresolved")

	clk := clocktesting.NewFakeClock(time.Now())
	reg := prometheus.NewRegistry()
	recorder := events.NewFakeRecorder(100)
	wd := watchdog.New(k.cache, ec2c, recorder, checks.NewFeatureGates(), clk, reg, watchdog.Options{})
	before := counter.Calls("DescribeImages")
	f := scanUntil(t, wd, "three EC2NodeClasses with their images", func(watchdog.Findings) bool {
		return len(gauge(t, reg, metrics.WatchdogUnavailableImage)) == 3 && len(wd.Findings().UnavailableImages) == 1
	})
	if got := gauge(t, reg, metrics.WatchdogUnavailableImage); got["general"] != 1 || got["fine"] != 0 || got["unresolved"] != 0 {
		t.Errorf("gauge = %v", got)
	}
	want := watchdog.UnavailableImages{NodeClass: "general", Images: []watchdog.ImageState{{ID: old, State: watchdog.StateMissing}}}
	if len(f.UnavailableImages) != 1 || f.UnavailableImages[0].NodeClass != want.NodeClass || !slices.Equal(f.UnavailableImages[0].Images, want.Images) {
		t.Fatalf("findings = %+v, want %+v", f.UnavailableImages, want)
	}
	if got := f.Counts()[watchdog.FindingUnavailableImage]; got != 1 {
		t.Errorf("Counts = %d, want 1", got)
	}
	ev := drain(recorder)
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonImageUnavailable) || !strings.Contains(ev[0], old+": missing") || strings.Contains(ev[0], current) {
		t.Fatalf("events = %q", ev)
	}
	calls := counter.Calls("DescribeImages") - before
	if calls == 0 {
		t.Fatal("no DescribeImages call reached moto")
	}

	// Scans within the TTL cost no call.
	for range 3 {
		clk.Step(time.Minute)
		if _, err := wd.Scan(k.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter.Calls("DescribeImages") - before; got != calls {
		t.Errorf("DescribeImages calls = %d after cached scans, want %d", got, calls)
	}
	if ev := drain(recorder); len(ev) != 0 {
		t.Fatalf("events on unchanged findings = %q", ev)
	}

	// Karpenter resolves the selector again: the old image is gone from status.amis.
	k.setAMIs("general", current)
	scanUntil(t, wd, "finding cleared", func(f watchdog.Findings) bool { return len(f.UnavailableImages) == 0 })
	if got := gauge(t, reg, metrics.WatchdogUnavailableImage); got["general"] != 0 {
		t.Errorf("gauge after fix = %v", got)
	}
	if ev := drain(recorder); len(ev) != 0 {
		t.Fatalf("events after fix = %q", ev)
	}
}

// TestReservationDriftEnvtest replaces reserved NodeClaims as Drifted through the API
// server, with Karpenter's termination finalizer, as Karpenter's loop does.
func TestReservationDriftEnvtest(t *testing.T) {
	k := newKube(t)
	k.nodeClass("default")
	k.nodePool("db", karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized, "1m")
	clk := clocktesting.NewFakeClock(time.Now())
	gates := checks.NewFeatureGates()
	if err := gates.Set(string(checks.ReservedCapacity) + "=false"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	recorder := events.NewFakeRecorder(100)
	wd := watchdog.New(k.cache, &ec2.Client{}, recorder, gates, clk, reg, watchdog.Options{})
	// The same cluster seen with the gate on: nothing to report.
	regOn := prometheus.NewRegistry()
	recorderOn := events.NewFakeRecorder(100)
	wdOn := watchdog.New(k.cache, &ec2.Client{}, recorderOn, checks.NewFeatureGates(), clk, regOn, watchdog.Options{})

	reserved := map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeReserved, "karpenter.k8s.aws/capacity-reservation-id": "cr-0123456789abcdef0"}
	drifted := cond(karpv1.ConditionTypeDrifted, metav1.ConditionTrue, time.Now())
	// Not replacements in the loop: an on-demand drifted node, a reserved node deleted
	// without drift, a reserved drifted node still running.
	k.nodeClaim("db-on-demand", "db", map[string]string{karpv1.CapacityTypeLabelKey: karpv1.CapacityTypeOnDemand}, drifted)
	k.deleteClaim("db-on-demand")
	k.nodeClaim("db-scaled-down", "db", reserved)
	k.deleteClaim("db-scaled-down")
	k.nodeClaim("db-running", "db", reserved, drifted)

	for i, name := range []string{"db-1", "db-2"} {
		k.nodeClaim(name, "db", reserved, drifted)
		k.deleteClaim(name)
		scanUntil(t, wd, name+" counted", func(watchdog.Findings) bool {
			return gauge(t, reg, metrics.WatchdogReservationDrift)["db"] == float64(i+1)
		})
		clk.Step(time.Minute)
	}
	if f := wd.Findings(); len(f.ReservationDrift) != 0 {
		t.Fatalf("flagged below the threshold: %+v", f.ReservationDrift)
	}
	// db-1 finishes terminating and vanishes: still remembered.
	k.release("db-1")
	k.nodeClaim("db-3", "db", reserved, drifted)
	k.deleteClaim("db-3")
	f := scanUntil(t, wd, "loop flagged", func(f watchdog.Findings) bool { return len(f.ReservationDrift) == 1 })
	if f.ReservationDrift[0] != (watchdog.ReservationDrift{NodePool: "db", Replacements: 3, Window: time.Hour}) {
		t.Fatalf("finding = %+v", f.ReservationDrift[0])
	}
	eventually(t, "db-1 gone from the cache", func() bool {
		err := k.cache.Get(k.ctx, client.ObjectKey{Name: "db-1"}, &karpv1.NodeClaim{})
		return err != nil
	})
	if f, err := wd.Scan(k.ctx); err != nil || len(f.ReservationDrift) != 1 || f.ReservationDrift[0].Replacements != 3 {
		t.Fatalf("after db-1 vanished: %+v, %v", f.ReservationDrift, err)
	}
	if got := f.Counts()[watchdog.FindingReservationDrift]; got != 3 {
		t.Errorf("Counts = %d, want 3", got)
	}
	ev := drain(recorder)
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+watchdog.ReasonReservationDriftLoop+" 3 NodeClaim(s)") {
		t.Fatalf("events = %q", ev)
	}

	// With the gate on: no finding, no series, no Event.
	if f, err := wdOn.Scan(k.ctx); err != nil || len(f.ReservationDrift) != 0 {
		t.Fatalf("gate on: %+v, %v", f.ReservationDrift, err)
	}
	if n := testutil.CollectAndCount(regOn, metrics.WatchdogReservationDrift); n != 0 {
		t.Errorf("gate on: %d series", n)
	}
	if ev := drain(recorderOn); len(ev) != 0 {
		t.Fatalf("gate on: events = %q", ev)
	}

	// An hour later without another replacement: the window is empty and the finding clears.
	clk.Step(time.Hour)
	f = scanUntil(t, wd, "finding cleared", func(f watchdog.Findings) bool { return len(f.ReservationDrift) == 0 })
	if got := gauge(t, reg, metrics.WatchdogReservationDrift); got["db"] != 0 {
		t.Errorf("gauge after the window = %v", got)
	}
	if ev := drain(recorder); len(ev) != 0 {
		t.Fatalf("events after the window = %q", ev)
	}
}
