package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/featuregate"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/harness"
)

// fastRetries keeps the SDK's real retry logic with short backoffs, so throttling tests
// exercise it without waiting seconds.
func fastRetries() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxBackoff = 20 * time.Millisecond })
}

func ec2Client(cfg aws.Config, url string) *ec2.Client {
	cfg.Retryer = fastRetries
	return ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) })
}

// registerImages registers AMIs in moto and returns their IDs by name.
func registerImages(t *testing.T, c *ec2.Client, names map[string]ec2types.ArchitectureValues) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for name, arch := range names {
		out, err := c.RegisterImage(context.Background(), &ec2.RegisterImageInput{
			Name: aws.String(name), Architecture: arch, RootDeviceName: aws.String("/dev/xvda"),
			BlockDeviceMappings: []ec2types.BlockDeviceMapping{{DeviceName: aws.String("/dev/xvda"), Ebs: &ec2types.EbsBlockDevice{VolumeSize: aws.Int32(20)}}},
		})
		if err != nil {
			t.Fatalf("RegisterImage %s: %v", name, err)
		}
		ids[name] = aws.ToString(out.ImageId)
	}
	return ids
}

func req(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

// synthetic builds a cluster of n nodes over classes EC2NodeClasses, each with a three-image
// alias (x86, arm, x86 NVIDIA); every third node sits in one of reservations reservations.
func synthetic(t testing.TB, n, classes int, images map[string]string, reservations []string) *cluster.Model {
	t.Helper()
	var objs []client.Object
	for c := 0; c < classes; c++ {
		objs = append(objs, &awsv1.EC2NodeClass{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("class-%d", c)},
			Status: awsv1.EC2NodeClassStatus{AMIs: []awsv1.AMI{
				{ID: images["nvidia-x86"], Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpExists)}},
				{ID: images["standard-x86"], Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "amd64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
				{ID: images["standard-arm"], Requirements: []corev1.NodeSelectorRequirement{req(corev1.LabelArchStable, corev1.NodeSelectorOpIn, "arm64"), req(awsv1.LabelInstanceGPUCount, corev1.NodeSelectorOpDoesNotExist)}},
			}},
		})
		objs = append(objs, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pool-%d", c)}})
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("i-%017x", 0x0a0000000000000+i)
		pool := fmt.Sprintf("pool-%d", i%classes)
		labels := map[string]string{karpv1.NodePoolLabelKey: pool, corev1.LabelArchStable: []string{"amd64", "arm64"}[i%2], karpv1.CapacityTypeLabelKey: "on-demand"}
		if i%5 == 0 && i%2 == 0 {
			labels[awsv1.LabelInstanceGPUCount] = "1"
		}
		if len(reservations) > 0 && i%3 == 0 {
			labels[karpv1.CapacityTypeLabelKey] = karpv1.CapacityTypeReserved
			labels[awsv1.LabelCapacityReservationID] = reservations[(i/3)%len(reservations)]
		}
		pid := "aws:///eu-west-1a/" + id
		objs = append(objs,
			&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Labels: labels},
				Spec:   karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: fmt.Sprintf("class-%d", i%classes)}},
				Status: karpv1.NodeClaimStatus{ProviderID: pid}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i), Labels: labels}, Spec: corev1.NodeSpec{ProviderID: pid}},
		)
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := cluster.NewSnapshot(scheme, objs...)
	if err != nil {
		t.Fatal(err)
	}
	return cluster.New(snap)
}

func instance(i int) string { return fmt.Sprintf("i-%017x", 0x0a0000000000000+i) }

func retirement(i int, now time.Time) event.Event {
	return event.Event{ID: fmt.Sprintf("ev-%d", i), Kind: event.KindScheduledChange, Time: now, Instances: []string{instance(i)}, Deadline: now.Add(72 * time.Hour),
		Health: &event.Health{EventARN: "arn", TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Scheduled: event.ScheduledInstanceRetirement, Start: now.Add(72 * time.Hour)}}
}

func gates(t *testing.T, set string) featuregate.FeatureGate {
	g := checks.NewFeatureGates()
	if err := g.Set(set); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestAMICheckMoto asks moto's EC2 for the states of images selected by node shape.
func TestAMICheckMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("moto suite")
	}
	url := harness.Moto(t)
	counter := &harness.Counter{}
	c := ec2Client(harness.AWSConfig(counter), url)
	images := registerImages(t, c, map[string]ec2types.ArchitectureValues{"standard-x86": "x86_64", "standard-arm": "arm64", "nvidia-x86": "x86_64"})
	model := synthetic(t, 10, 1, images, nil)
	ami := checks.NewAMI(c, clock.RealClock{})
	ctx := context.Background()

	check := func(i int) policy.Check {
		res, err := model.Resolve(ctx, instance(i))
		if err != nil {
			t.Fatal(err)
		}
		return ami.Check(ctx, res)
	}
	// Node 0: amd64 with a GPU; node 1: arm64; node 2: amd64 without a GPU.
	for i, want := range map[int]string{0: images["nvidia-x86"], 1: images["standard-arm"], 2: images["standard-x86"]} {
		got := check(i)
		if !got.Passed || got.Evidence["image"] != want || got.Evidence["state"] != "available" {
			t.Errorf("node %d: %+v, want %s available", i, got, want)
		}
	}
	if n := counter.Calls("DescribeImages"); n != 1 {
		t.Errorf("DescribeImages calls = %d, want 1 (one per image set per TTL)", n)
	}

	// Deregistered: EC2 no longer knows the image. After the AMI State Change event
	// invalidates the cache, the check asks again and fails, naming the image.
	if _, err := c.DeregisterImage(ctx, &ec2.DeregisterImageInput{ImageId: aws.String(images["standard-arm"])}); err != nil {
		t.Fatal(err)
	}
	if got := check(1); !got.Passed {
		t.Errorf("cached answer should still hold before invalidation: %+v", got)
	}
	ami.Invalidate(images["standard-arm"])
	got := check(1)
	if got.Passed || got.Unavailable || !strings.Contains(got.Reason, images["standard-arm"]) {
		t.Errorf("deregistered image: %+v", got)
	}
	// The other images of the set were still answered.
	if got := check(2); !got.Passed {
		t.Errorf("x86 image after arm deregistration: %+v", got)
	}
}

// ec2Query serves DescribeCapacityReservations in EC2's Query protocol, as EC2 does: form
// POST in, XML out, RequestLimitExceeded as a 503 error document. Moto has no such API.
type ec2Query struct {
	mu       sync.Mutex
	rsv      map[string]ec2types.CapacityReservation
	throttle atomic.Int32 // answer this many more requests with RequestLimitExceeded
	requests atomic.Int32
}

func (s *ec2Query) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "DescribeCapacityReservations" {
		http.Error(w, "unsupported", http.StatusBadRequest)
		return
	}
	if s.throttle.Load() > 0 {
		s.throttle.Add(-1)
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>5e1f6b0c-1111-4a2b-9c3d-000000000001</RequestID></Response>`)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var items strings.Builder
	for k, v := range r.Form {
		if !strings.HasPrefix(k, "CapacityReservationId.") {
			continue
		}
		cr, ok := s.rsv[v[0]]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InvalidCapacityReservationId.NotFound</Code><Message>The capacity reservation ID '%s' does not exist</Message></Error></Errors><RequestID>x</RequestID></Response>`, v[0])
			return
		}
		fmt.Fprintf(&items, `<item><capacityReservationId>%s</capacityReservationId><instanceType>m7i.2xlarge</instanceType><state>%s</state><totalInstanceCount>%d</totalInstanceCount><availableInstanceCount>%d</availableInstanceCount></item>`,
			aws.ToString(cr.CapacityReservationId), cr.State, aws.ToInt32(cr.TotalInstanceCount), aws.ToInt32(cr.AvailableInstanceCount))
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><DescribeCapacityReservationsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>5e1f6b0c-2222-4a2b-9c3d-000000000002</requestId><capacityReservationSet>%s</capacityReservationSet></DescribeCapacityReservationsResponse>`, items.String())
}

func reservationServer(t *testing.T, rsv ...ec2types.CapacityReservation) (*ec2Query, *ec2.Client) {
	s := &ec2Query{rsv: map[string]ec2types.CapacityReservation{}}
	for _, r := range rsv {
		s.rsv[aws.ToString(r.CapacityReservationId)] = r
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, ec2Client(harness.AWSConfig(nil), srv.URL)
}

func rsv(id string, state ec2types.CapacityReservationState, total, avail int32) ec2types.CapacityReservation {
	return ec2types.CapacityReservation{CapacityReservationId: aws.String(id), State: state, TotalInstanceCount: aws.Int32(total), AvailableInstanceCount: aws.Int32(avail)}
}

func TestCapacityReservationCheck(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	srv, c := reservationServer(t, rsv("cr-0a1b2c3d4e5f60718", "active", 4, 1), rsv("cr-0b2c3d4e5f6071829", "active", 4, 0), rsv("cr-0c3d4e5f607182930", "expired", 4, 4))
	reservations := []string{"cr-0a1b2c3d4e5f60718", "cr-0b2c3d4e5f6071829", "cr-0c3d4e5f607182930", "cr-0d4e5f60718293a41"}
	model := synthetic(t, 12, 1, map[string]string{}, reservations)
	eng := engine.New(model, checks.NewChecker(nil, checks.NewReservations(c, clock.RealClock{}), gates(t, "ReservedCapacity=true")))

	// Nodes 0, 3, 6, 9 are reserved in reservations 0, 1, 2, 3.
	want := map[int]struct {
		action policy.Action
		reason string
	}{
		0: {policy.ActionDrain, ""},
		3: {policy.ActionDefer, "no room"},
		6: {policy.ActionDefer, "expired, not active"},
		9: {policy.ActionDefer, "does not exist"},
		1: {policy.ActionDrain, ""}, // not in a reservation: no check
	}
	for i, w := range want {
		outs, err := eng.Decide(ctx, retirement(i, now), now)
		if err != nil {
			t.Fatal(err)
		}
		d := outs[0]
		if d.Action != w.action || !strings.Contains(d.Reason, w.reason) {
			t.Errorf("node %d: %s (%s), want %s mentioning %q", i, d.Action, d.Reason, w.action, w.reason)
		}
		if i%3 != 0 && len(d.Checks) != 0 {
			t.Errorf("node %d is not reserved but was checked: %+v", i, d.Checks)
		}
	}

	// Throttling: the SDK retries RequestLimitExceeded with backoff and the check passes.
	srv2, c2 := reservationServer(t, rsv("cr-0a1b2c3d4e5f60718", "active", 4, 2))
	srv2.throttle.Store(2)
	eng2 := engine.New(model, checks.NewChecker(nil, checks.NewReservations(c2, clock.RealClock{}), gates(t, "ReservedCapacity=true")))
	outs, err := eng2.Decide(ctx, retirement(0, now), now)
	if err != nil {
		t.Fatal(err)
	}
	if outs[0].Action != policy.ActionDrain || srv2.requests.Load() != 3 {
		t.Errorf("after two throttles: %s (%s), %d requests", outs[0].Action, outs[0].Reason, srv2.requests.Load())
	}

	// Throttled past the retries: a non-urgent drain waits, "check unavailable"; an urgent one drains.
	srv3, c3 := reservationServer(t, rsv("cr-0a1b2c3d4e5f60718", "active", 4, 2))
	srv3.throttle.Store(1000)
	eng3 := engine.New(model, checks.NewChecker(nil, checks.NewReservations(c3, clock.RealClock{}), gates(t, "ReservedCapacity=true")))
	outs, err = eng3.Decide(ctx, retirement(0, now), now)
	if err != nil {
		t.Fatal(err)
	}
	if outs[0].Action != policy.ActionDefer || !strings.Contains(outs[0].Reason, "check unavailable") || !outs[0].Checks[0].Unavailable {
		t.Errorf("throttled non-urgent: %s (%s)", outs[0].Action, outs[0].Reason)
	}
	// The failure answers for itself for a while: the urgent drain that follows does not wait
	// through the SDK's retries again (no new request), it drains with the warning at once.
	before := srv3.requests.Load()
	spot := event.Event{ID: "spot", Kind: event.KindSpotInterruption, Time: now, Instances: []string{instance(0)}, Deadline: now.Add(2 * time.Minute)}
	outs, err = eng3.Decide(ctx, spot, now)
	if err != nil {
		t.Fatal(err)
	}
	if outs[0].Action != policy.ActionDrain || len(outs[0].Warnings) == 0 {
		t.Errorf("throttled urgent: %s (%s)", outs[0].Action, outs[0].Reason)
	}
	if got := srv3.requests.Load(); got != before {
		t.Errorf("%d more requests to a throttling EC2 within the failure's TTL", got-before)
	}
	_ = srv
}

// TestReservedCapacityGateOff: with the gate off no reservation API call is made and a
// node that happens to sit in an open reservation is decided like any other (Karpenter's
// replacement-loop bug came from reservation data leaking past the gate).
func TestReservedCapacityGateOff(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	srv, c := reservationServer(t, rsv("cr-0b2c3d4e5f6071829", "active", 4, 0))
	model := synthetic(t, 12, 1, map[string]string{}, []string{"cr-0b2c3d4e5f6071829"})
	eng := engine.New(model, checks.NewChecker(nil, checks.NewReservations(c, clock.RealClock{}), gates(t, "ReservedCapacity=false")))
	for i := 0; i < 12; i++ {
		outs, err := eng.Decide(ctx, retirement(i, now), now)
		if err != nil {
			t.Fatal(err)
		}
		if outs[0].Action != policy.ActionDrain || len(outs[0].Checks) != 0 {
			t.Errorf("node %d with the gate off: %s (%s) checks %+v", i, outs[0].Action, outs[0].Reason, outs[0].Checks)
		}
	}
	if n := srv.requests.Load(); n != 0 {
		t.Errorf("%d reservation API calls with the gate off, want 0", n)
	}
	// The same cluster with the gate on does call, and the full reservation holds drains.
	eng = engine.New(model, checks.NewChecker(nil, checks.NewReservations(c, clock.RealClock{}), gates(t, "ReservedCapacity=true")))
	outs, _ := eng.Decide(ctx, retirement(0, now), now)
	if outs[0].Action != policy.ActionDefer || srv.requests.Load() == 0 {
		t.Errorf("gate on: %s, %d calls", outs[0].Action, srv.requests.Load())
	}
}

// TestCheckCallEconomy: a burst of 1,000 events decided concurrently costs one
// DescribeImages per distinct image set and one DescribeCapacityReservations per
// reservation, not one per event.
func TestCheckCallEconomy(t *testing.T) {
	if testing.Short() {
		t.Skip("moto suite")
	}
	ctx := context.Background()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	url := harness.Moto(t)
	counter := &harness.Counter{}
	c := ec2Client(harness.AWSConfig(counter), url)
	images := registerImages(t, c, map[string]ec2types.ArchitectureValues{"standard-x86": "x86_64", "standard-arm": "arm64", "nvidia-x86": "x86_64"})
	reservations := []string{"cr-0a1b2c3d4e5f60718", "cr-0b2c3d4e5f6071829", "cr-0c3d4e5f607182930"}
	srv, rc := reservationServer(t, rsv(reservations[0], "active", 400, 100), rsv(reservations[1], "active", 400, 100), rsv(reservations[2], "active", 400, 100))
	const n, classes = 1000, 2
	model := synthetic(t, n, classes, images, reservations)
	// Two node classes share one image set: the set is the cache and collapse key.
	eng := engine.New(model, checks.NewChecker(checks.NewAMI(c, clock.RealClock{}), checks.NewReservations(rc, clock.RealClock{}), gates(t, "ReservedCapacity=true")))

	var wg sync.WaitGroup
	var drains, failures atomic.Int32
	sem := make(chan struct{}, 32)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			outs, err := eng.Decide(ctx, retirement(i, now), now)
			if err != nil {
				failures.Add(1)
				return
			}
			if outs[0].Action == policy.ActionDrain {
				drains.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if failures.Load() != 0 || drains.Load() != n {
		t.Fatalf("%d failures, %d drains of %d", failures.Load(), drains.Load(), n)
	}
	images1 := counter.Calls("DescribeImages")
	if images1 < 1 || images1 > 1 {
		t.Errorf("DescribeImages calls = %d for %d events, want 1 (one image set)", images1, n)
	}
	if got := srv.requests.Load(); got < 1 || int(got) > len(reservations) {
		t.Errorf("DescribeCapacityReservations calls = %d for %d events, want at most %d", got, n, len(reservations))
	}
	t.Logf("%d events: %d DescribeImages, %d DescribeCapacityReservations", n, images1, srv.requests.Load())
}

// TestAWSCallMetric: every EC2 call the checks make is counted by API and result, once per
// operation after the SDK's retries.
func TestAWSCallMetric(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	calls := awscalls.NewCounter(reg)
	s := &ec2Query{rsv: map[string]ec2types.CapacityReservation{"cr-0a1b2c3d4e5f60718": rsv("cr-0a1b2c3d4e5f60718", "active", 4, 2)}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	cfg := harness.AWSConfig(nil)
	cfg.Retryer = fastRetries
	cfg.APIOptions = append(cfg.APIOptions, awscalls.Middleware(calls, nil))
	c := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(srv.URL) })

	model := synthetic(t, 12, 1, map[string]string{}, []string{"cr-0a1b2c3d4e5f60718", "cr-0b2c3d4e5f6071829"})
	eng := engine.New(model, checks.NewChecker(nil, checks.NewReservations(c, clock.RealClock{}), gates(t, "ReservedCapacity=true")))
	s.throttle.Store(1) // one throttle, retried by the SDK: still one successful operation
	if _, err := eng.Decide(ctx, retirement(0, now), now); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Decide(ctx, retirement(3, now), now); err != nil { // cr-0b2c...: not found
		t.Fatal(err)
	}
	s.throttle.Store(1000)
	eng = engine.New(model, checks.NewChecker(nil, checks.NewReservations(c, clock.RealClock{}), gates(t, "ReservedCapacity=true")))
	if _, err := eng.Decide(ctx, retirement(0, now), now); err != nil {
		t.Fatal(err)
	}
	for result, want := range map[string]float64{"success": 1, "InvalidCapacityReservationId.NotFound": 1, "RequestLimitExceeded": 1} {
		if got := testutil.ToFloat64(calls.WithLabelValues("DescribeCapacityReservations", result)); got != want {
			t.Errorf("calls{DescribeCapacityReservations,%s} = %v, want %v", result, got, want)
		}
	}
}
