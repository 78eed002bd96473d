package inplace

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/test/harness"
)

// t0 is the fake clock's start; start is when AWS acts in the events of the suite.
var (
	t0    = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	start = t0.Add(2 * time.Hour)
)

// evictRound bounds each eviction round in the suite: short, so that a round a budget
// blocks ends quickly, and long enough for the helper to see an evicted pod gone (it polls
// every second).
const evictRound = 3 * time.Second

// setup is one test's Runner over envtest and moto, with a fake clock, a recorder whose
// Events it reads, a count of the EC2 calls that reached moto, and the fallbacks called.
type setup struct {
	t        *testing.T
	ctx      context.Context
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	calls    *harness.Counter
	ec2      ec2Split
	status   *harness.EC2InstanceStatus
	log      *slog.Logger
	runner   *inplace.Runner

	mu        sync.Mutex
	fallbacks []string
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	if testing.Short() {
		t.Skip("envtest suite; run without -short")
	}
	if motoURL == "" {
		t.Skip("SKIPPED LOUDLY: moto_server is not on PATH; the reboot in place suite needs it (pip install 'moto[server]')")
	}
	ctx, cancel := context.WithCancel(background)
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	calls := &harness.Counter{}
	status, statusClient := harness.NewEC2InstanceStatus(t)
	s := &setup{t: t, ctx: ctx, clock: clocktesting.NewFakeClock(t0), calls: calls, log: log, status: status,
		ec2: ec2Split{Client: ec2.NewFromConfig(harness.AWSConfig(calls), func(o *ec2.Options) { o.BaseEndpoint = aws.String(motoURL) }), status: statusClient}}
	s.restart()
	return s
}

// restart replaces the Runner by a new one over the same API server and EC2: a router
// restarted, or another one elected.
func (s *setup) restart() {
	// client-go's fake recorder counts every Eventf call: a real broadcaster would fold
	// repeats into one series, and hide an Event posted twice.
	s.recorder = events.NewFakeRecorder(100)
	evictor := inplace.NewDrainEvictor(cs, s.log, inplace.WithClock(s.clock), inplace.WithMaxRound(evictRound))
	s.runner = inplace.New(direct, direct, evictor, s.ec2, s.clock, s.recorder, s.log, nil, s.fallback, inplace.Options{EvictRound: evictRound})
}

// ec2Split is the suite's EC2: moto for the instances and RebootInstances, and
// harness.EC2InstanceStatus for DescribeInstanceStatus (moto reports no scheduled events),
// with which the run confirms its maintenance before it reboots. With migration, the stand-in
// answers RebootInstances and DescribeInstances too: moto reports no reboot migration, and
// does not clear a system-reboot the owner's reboot migrates.
type ec2Split struct {
	*ec2.Client
	status    *ec2.Client
	migration bool
}

func (e ec2Split) RebootInstances(ctx context.Context, in *ec2.RebootInstancesInput, opts ...func(*ec2.Options)) (*ec2.RebootInstancesOutput, error) {
	if e.migration {
		return e.status.RebootInstances(ctx, in, opts...)
	}
	return e.Client.RebootInstances(ctx, in, opts...)
}

func (e ec2Split) DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	if e.migration {
		return e.status.DescribeInstances(ctx, in, opts...)
	}
	return e.Client.DescribeInstances(ctx, in, opts...)
}

func (e ec2Split) DescribeInstanceStatus(ctx context.Context, in *ec2.DescribeInstanceStatusInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error) {
	return e.status.DescribeInstanceStatus(ctx, in, opts...)
}

func (s *setup) fallback(_ context.Context, nc *karpv1.NodeClaim, st inplace.State, why string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fallbacks = append(s.fallbacks, nc.Name+": "+why)
	return nil
}

func (s *setup) fallbackCalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.fallbacks...)
}

// pass runs one Reconcile of the NodeClaim.
func (s *setup) pass(claim string) time.Duration {
	s.t.Helper()
	res, err := s.runner.Reconcile(s.ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: claim}})
	if err != nil {
		s.t.Fatalf("Reconcile: %v", err)
	}
	return res.RequeueAfter
}

// passTo runs passes until the run is at step, at most 10.
func (s *setup) passTo(claim string, step inplace.Step) {
	s.t.Helper()
	for range 10 {
		if state(s.t, claim).Step == step {
			return
		}
		s.pass(claim)
	}
	s.t.Fatalf("the run did not reach %s: %+v", step, state(s.t, claim))
}

// begin begins a run of ev on the claim; EC2 shows ev's maintenance for its instance.
func (s *setup) begin(claim string, ev event.Event) {
	s.t.Helper()
	for _, id := range ev.Instances {
		s.status.Add(id, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-" + ev.ID, Code: string(ev.Health.Scheduled),
			Description: "The instance is scheduled for " + string(ev.Health.Scheduled), NotBefore: ev.Deadline}}})
	}
	already, err := s.runner.Begin(s.ctx, getClaim(s.t, claim), ev)
	if err != nil || already {
		s.t.Fatalf("Begin(%s): already=%v err=%v", claim, already, err)
	}
}

// events returns the Events posted since the last call.
func (s *setup) events() []string {
	var out []string
	for {
		select {
		case e := <-s.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// reasons returns the reasons of the Events posted since the last call.
func (s *setup) reasons() []string {
	var out []string
	for _, e := range s.events() {
		if f := strings.Fields(e); len(f) > 1 {
			out = append(out, f[1])
		}
	}
	return out
}

// scheduled returns a scheduled event of typ for instance, starting at start.
func scheduled(id, instance string, typ event.ScheduledType) event.Event {
	return event.Event{ID: id, Kind: event.KindScheduledChange, Source: "aws.health", Instances: []string{instance}, Deadline: start,
		Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/" + id, TypeCode: "AWS_EC2_" + strings.ToUpper(string(typ)),
			Category: "scheduledChange", Status: event.HealthUpcoming, Scheduled: typ, Start: start}}
}

// instance launches an instance in moto and returns its ID.
func (s *setup) instance() string {
	s.t.Helper()
	images, err := s.ec2.DescribeImages(s.ctx, &ec2.DescribeImagesInput{Owners: []string{"amazon"}, Filters: []ec2types.Filter{
		{Name: aws.String("name"), Values: []string{"amzn2-ami-hvm-*"}}, {Name: aws.String("architecture"), Values: []string{"x86_64"}}}})
	if err != nil || len(images.Images) == 0 {
		s.t.Fatalf("finding an image in moto: %v", err)
	}
	out, err := s.ec2.RunInstances(s.ctx, &ec2.RunInstancesInput{ImageId: images.Images[0].ImageId, InstanceType: ec2types.InstanceTypeM5Large,
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1)})
	if err != nil {
		s.t.Fatalf("RunInstances: %v", err)
	}
	return aws.ToString(out.Instances[0].InstanceId)
}

// machine creates a NodeClaim (launched and registered, as Karpenter leaves it) and its
// Node, Ready with boot ID boot-1, for instance; both are deleted when the test ends.
func machine(t *testing.T, name, instance string) {
	t.Helper()
	ctx := background
	providerID := "aws:///eu-west-1a/" + instance
	labels := map[string]string{karpv1.NodePoolLabelKey: "kafka", corev1.LabelArchStable: "amd64"}
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"kafka"}}}}}
	must(t, direct.Create(ctx, claim))
	claim.Status.ProviderID, claim.Status.NodeName = providerID, name
	must(t, direct.Status().Update(ctx, claim))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels,
		// router/upcoming's marks: a run must leave them as they are.
		Annotations: map[string]string{"healthrouter.io/maintenance": `{"kind":"scheduled-change"}`}},
		Spec: corev1.NodeSpec{ProviderID: providerID,
			Taints: []corev1.Taint{{Key: "healthrouter.io/maintenance-upcoming", Value: "scheduled-change", Effect: corev1.TaintEffectPreferNoSchedule}}}}
	must(t, direct.Create(ctx, node))
	kubelet(t, name, corev1.ConditionTrue, t0.Add(-24*time.Hour), "boot-1")
	t.Cleanup(func() {
		for _, o := range []client.Object{claim, node} {
			if err := direct.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s: %v", o.GetName(), err)
			}
		}
	})
}

// kubelet sets the Node's Ready condition and boot ID through the status subresource, as
// the kubelet (or the node lifecycle controller) does.
func kubelet(t *testing.T, name string, status corev1.ConditionStatus, since time.Time, boot string) {
	t.Helper()
	n := getNode(t, name)
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.NewTime(since), LastTransitionTime: metav1.NewTime(since)}}
	n.Status.NodeInfo.BootID = boot
	must(t, direct.Status().Update(background, n))
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	must(t, direct.Get(background, client.ObjectKey{Name: name}, n))
	return n
}

func getClaim(t *testing.T, name string) *karpv1.NodeClaim {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	must(t, direct.Get(background, client.ObjectKey{Name: name}, nc))
	return nc
}

// state returns the NodeClaim's run as the API server holds it.
func state(t *testing.T, claim string) inplace.State {
	t.Helper()
	mem, err := record.Load(background, direct, claim)
	if err != nil {
		t.Fatal(err)
	}
	st, ok, err := inplace.Read(mem)
	if err != nil || !ok {
		t.Fatalf("the run of %s: ok=%v err=%v", claim, ok, err)
	}
	return st
}

// protection reports do-not-disrupt on the NodeClaim and on the Node, and the Node's cordon.
func protection(t *testing.T, name string) (claim, node, cordoned bool) {
	t.Helper()
	n := getNode(t, name)
	return getClaim(t, name).Annotations[karpv1.DoNotDisruptAnnotationKey] == "true", n.Annotations[karpv1.DoNotDisruptAnnotationKey] == "true", n.Spec.Unschedulable
}

// checkMarksKept fails when the run changed router/upcoming's marks on the Node.
func checkMarksKept(t *testing.T, name string) {
	t.Helper()
	n := getNode(t, name)
	// (The API server's admission adds node.kubernetes.io/not-ready to a new Node; no
	// controller runs here to remove it.)
	if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "healthrouter.io/maintenance-upcoming" }) ||
		n.Annotations["healthrouter.io/maintenance"] == "" {
		t.Errorf("the router's marks on node %s changed: taints %v, annotations %v", name, n.Spec.Taints, n.Annotations)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 50 ms until it holds, for at most 20 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(background, 50*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within 20s", what)
	}
}

func newNamespace(t *testing.T, name string) {
	t.Helper()
	must(t, direct.Create(background, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// newPod creates a pod bound to node and, playing the kubelet, reports it Running and
// Ready: the Eviction API checks budgets only for running pods, and counts only ready ones
// as healthy.
func newPod(t *testing.T, ns, name, node string, owner *metav1.OwnerReference, labels map[string]string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	must(t, direct.Create(background, p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()},
	}}
	must(t, direct.Status().Update(background, p))
}

// owner creates a ReplicaSet or DaemonSet (no controller runs: it creates no pods) and
// returns the owner reference of its pods.
func owner(t *testing.T, ns, name string, daemon bool, labels map[string]string) *metav1.OwnerReference {
	t.Helper()
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	sel := &metav1.LabelSelector{MatchLabels: labels}
	if daemon {
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: appsv1.DaemonSetSpec{Selector: sel, Template: tmpl}}
		must(t, direct.Create(background, ds))
		return metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))
	}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](3), Selector: sel, Template: tmpl}}
	must(t, direct.Create(background, rs))
	return metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))
}

// budget creates a PodDisruptionBudget with minAvailable and sets its status as the
// disruption controller would for healthy pods.
func budget(t *testing.T, ns, name string, labels map[string]string, minAvailable, healthy int32) *policyv1.PodDisruptionBudget {
	t.Helper()
	ma := intstr.FromInt32(minAvailable)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &ma, Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	must(t, direct.Create(background, pdb))
	setBudgetStatus(t, pdb, healthy)
	return pdb
}

// setBudgetStatus is the disruption controller's work: with healthy pods, disruptions
// allowed = healthy - minAvailable, observed at the budget's current generation.
func setBudgetStatus(t *testing.T, pdb *policyv1.PodDisruptionBudget, healthy int32) {
	t.Helper()
	must(t, direct.Get(background, client.ObjectKeyFromObject(pdb), pdb))
	desired := pdb.Spec.MinAvailable.IntVal
	allowed := max(0, healthy-desired)
	cond := metav1.ConditionTrue
	if allowed == 0 {
		cond = metav1.ConditionFalse
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
		CurrentHealthy: healthy, DesiredHealthy: desired, ExpectedPods: healthy,
		Conditions: []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition, Status: cond, Reason: policyv1.SufficientPodsReason,
			Message: "set by the test", LastTransitionTime: metav1.Now(), ObservedGeneration: pdb.Generation}}}
	must(t, direct.Status().Update(background, pdb))
}

// podKubelet plays the kubelet of a namespace's pods: a pod being deleted (evicted) is
// removed at once, and whether the Eviction API asked for it is kept.
type podKubelet struct {
	mu      sync.Mutex
	evicted map[string]bool
	stop    context.CancelFunc
	done    chan struct{}
}

func startPodKubelet(t *testing.T, ns string) *podKubelet {
	t.Helper()
	ctx, cancel := context.WithCancel(background)
	k := &podKubelet{evicted: map[string]bool{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		for ctx.Err() == nil {
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil {
						continue
					}
					byAPI := false
					for _, c := range p.Status.Conditions {
						byAPI = byAPI || (c.Type == corev1.DisruptionTarget && c.Reason == "EvictionByEvictionAPI")
					}
					if cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0),
						Preconditions: &metav1.Preconditions{UID: ptr.To(p.UID)}}) == nil {
						k.mu.Lock()
						k.evicted[p.Name] = byAPI
						k.mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { k.stop(); <-k.done })
	return k
}

// evictedByAPI reports whether the kubelet removed pod after the Eviction API (not a plain
// DELETE) asked for its deletion.
func (k *podKubelet) evictedByAPI(pod string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.evicted[pod]
}

// podState is a pod as the API server holds it: gone, terminating, or running.
func podState(t *testing.T, ns, name string) string {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(background, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "gone"
	case err != nil:
		t.Fatal(err)
	case p.DeletionTimestamp != nil:
		return "terminating"
	}
	return "running"
}
