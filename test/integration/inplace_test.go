package integration

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// instance launches an instance in moto (the stage's image) and returns its ID: a reboot in
// place calls RebootInstances on it, which moto answers only for an instance it has.
func (s *stage) instance() string {
	s.t.Helper()
	c := ec2.NewFromConfig(harness.AWSConfig(nil), func(o *ec2.Options) { o.BaseEndpoint = aws.String(s.moto) })
	out, err := c.RunInstances(s.ctx, &ec2.RunInstancesInput{ImageId: aws.String(s.image), InstanceType: ec2types.InstanceTypeM5Large,
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1)})
	if err != nil {
		s.t.Fatalf("RunInstances: %v", err)
	}
	return aws.ToString(out.Instances[0].InstanceId)
}

// instanceState is the instance's state in moto.
func (s *stage) instanceState(id string) string {
	s.t.Helper()
	c := ec2.NewFromConfig(harness.AWSConfig(nil), func(o *ec2.Options) { o.BaseEndpoint = aws.String(s.moto) })
	out, err := c.DescribeInstances(s.ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil || len(out.Reservations) == 0 || len(out.Reservations[0].Instances) == 0 {
		s.t.Fatalf("describing instance %s: %v", id, err)
	}
	return string(out.Reservations[0].Instances[0].State.Name)
}

// machine creates a NodeClaim of pool for instance id as Karpenter leaves a registered one
// (provider ID and node name in its status, held by Karpenter's termination finalizer so that
// a deletion shows), and its Node, Ready with boot ID boot-1. It returns both names.
func (s *stage) machine(pool, id string) (claim, node string) {
	s.t.Helper()
	claim, node = pool+"-"+id[len(id)-6:], nodeName(id)
	providerID := "aws:///eu-west-1a/" + id
	labels := map[string]string{karpv1.NodePoolLabelKey: pool, corev1.LabelArchStable: "amd64", karpv1.CapacityTypeLabelKey: "on-demand"}
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Labels: labels, Finalizers: []string{"karpenter.sh/termination"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{pool}}},
		},
	}
	s.create(nc)
	nc.Status.ProviderID, nc.Status.NodeName = providerID, node
	if err := s.kube.Status().Update(s.ctx, nc); err != nil {
		s.t.Fatal(err)
	}
	s.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: providerID}})
	s.kubelet(node, corev1.ConditionTrue, "boot-1")
	return claim, node
}

// kubelet reports the Node's Ready condition (changed now) and boot ID through the status
// subresource, as the kubelet does. A merge patch: the router writes the Node's spec meanwhile.
func (s *stage) kubelet(node string, ready corev1.ConditionStatus, boot string) {
	s.t.Helper()
	n := s.nodeObj(node)
	base := n.DeepCopy()
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	n.Status.NodeInfo.BootID = boot
	if err := s.kube.Status().Patch(s.ctx, n, client.MergeFrom(base)); err != nil {
		s.t.Fatalf("node %s status: %v", node, err)
	}
}

// runningPod creates a bare pod on node and reports it Running and Ready, as its kubelet
// would: the Eviction API checks budgets only for running pods, and counts ready ones.
func (s *stage) runningPod(ns, name, node string, labels map[string]string) {
	s.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}}}
	s.create(p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
	if err := s.kube.Status().Update(s.ctx, p); err != nil {
		s.t.Fatal(err)
	}
}

// budgetStatus plays the disruption controller (envtest runs none): healthy pods of a budget
// with minAvailable, observed at its generation.
func (s *stage) budgetStatus(ns, name string, healthy int32) {
	s.t.Helper()
	pdb := &policyv1.PodDisruptionBudget{}
	if err := s.kube.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: name}, pdb); err != nil {
		s.t.Fatal(err)
	}
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
	if err := s.kube.Status().Update(s.ctx, pdb); err != nil {
		s.t.Fatal(err)
	}
}

// podState is a pod as the API server holds it: gone, terminating or running.
func (s *stage) podState(ns, name string) string {
	s.t.Helper()
	p := &corev1.Pod{}
	err := s.kube.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: name}, p)
	switch {
	case apierrors.IsNotFound(err):
		return "gone"
	case err != nil:
		s.t.Fatal(err)
	case p.DeletionTimestamp != nil:
		return "terminating"
	}
	return "running"
}

// podKubelet plays the kubelet of a namespace's pods: a pod being deleted is removed at once,
// noting whether the Eviction API (not a plain DELETE) asked for it.
type podKubelet struct {
	mu      sync.Mutex
	evicted map[string]bool
}

func (s *stage) startPodKubelet(ns string) *podKubelet {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	k := &podKubelet{evicted: map[string]bool{}}
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var pods corev1.PodList
			if s.kube.List(ctx, &pods, client.InNamespace(ns)) == nil {
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil {
						continue
					}
					byAPI := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
						return c.Type == corev1.DisruptionTarget && c.Reason == "EvictionByEvictionAPI"
					})
					if s.kube.Delete(ctx, &p, client.GracePeriodSeconds(0), client.Preconditions{UID: ptr.To(p.UID)}) == nil {
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
	s.t.Cleanup(func() { cancel(); <-done })
	return k
}

func (k *podKubelet) evictedByAPI(pod string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.evicted[pod]
}

// run returns the NodeClaim's reboot in place as the API server holds it.
func (s *stage) run(claim string) (inplace.State, bool) {
	s.t.Helper()
	st, ok, err := inplace.Read(s.memory(claim))
	if err != nil {
		s.t.Fatalf("the run of %s: %v", claim, err)
	}
	return st, ok
}

// regarding returns the reasons of the Events about the object named name, in order.
func (s *stage) regarding(name string) []string {
	s.t.Helper()
	var evs eventsv1.EventList
	if err := s.kube.List(s.ctx, &evs); err != nil {
		s.t.Fatal(err)
	}
	slices.SortFunc(evs.Items, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestRebootInPlace runs the reboot in place through the live router (app.Run with
// --reboot-in-place) on moto and envtest, from the AWS Health event to the node kept: the
// event deferred to deadline - drain-lead, then handed to the Runner, which cordons and
// protects the node, evicts its pods through the Eviction API (a budget refusing one until
// another replica is Ready), reboots the instance in moto, waits for the Node to come back
// (the test plays the kubelet), and undoes what it did. The NodeClaim is never deleted.
//
// The fallback when the Node never comes back Ready (after Options.ReadyTimeout, 15 min in
// the router) is test/inplace's TestNotReadyFallsBack, on a fake clock: the router has no
// flag for the timeout, and none is added for a test.
func TestRebootInPlace(t *testing.T) {
	s := newStage(t)
	const pool, ns = "kafka", "kafka"
	s.pool(pool, map[string]string{
		policy.ScheduledActionKey(event.ScheduledInstanceReboot): string(policy.ActionRebootInPlace),
		policy.AnnotationDrainLead:                               "1h",
	})
	id := s.instance()
	claim, node := s.machine(pool, id)
	s.namespace(ns)
	s.runningPod(ns, "web-0", node, map[string]string{"app": "web"})
	// Two replicas of db on the node, minAvailable 1: the router's PDB gate lets the run begin
	// (the budget allows one disruption), the first eviction uses it up, and the API server
	// refuses the other until a replica elsewhere is Ready. (With a single replica the budget
	// is at zero from the start, and the gate holds the run before it begins: see TestGates.)
	db := map[string]string{"app": "db"}
	s.runningPod(ns, "db-0", node, db)
	s.runningPod(ns, "db-1", node, db)
	s.create(&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: db}}})
	s.budgetStatus(ns, "db", 2)
	k := s.startPodKubelet(ns)
	// AWS reboots the instance in one hour and eight seconds: deferred until deadline -
	// drain-lead, a few seconds away, then carried out in place. EC2 shows the event (served
	// by the stand-in: moto reports no scheduled events): the run confirms it before it
	// reboots.
	start := time.Now().Add(time.Hour + 8*time.Second)
	ec2s, _ := harness.NewEC2InstanceStatus(t)
	ec2s.Add(id, &harness.Instance{Events: []harness.ScheduledEvent{{ID: "instance-event-0c1d2e3f4a5b60001", Code: string(event.ScheduledInstanceReboot),
		Description: "The instance is scheduled for a reboot", NotBefore: start.UTC().Truncate(time.Second)}}})
	endpoint := s.splitEC2(ec2s)
	s.router(signal.ModeForward, func(o *options.Run) { o.RebootInPlace, o.AWSEndpointURL = true, endpoint })
	arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED/inplace-1"
	s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", start, "upcoming", arn, id), id)
	s.eventually("the event deferred to deadline - drain-lead", 30*time.Second, func() bool {
		rec, ok := s.activeRecord(claim)
		return ok && rec.Hold == policy.HoldDeadline
	})
	if _, ok := s.run(claim); ok {
		t.Fatal("the run began before deadline - drain-lead")
	}

	var st inplace.State
	s.eventually("the run recorded on the NodeClaim", 30*time.Second, func() bool {
		var ok bool
		st, ok = s.run(claim)
		return ok
	})
	if st.Instance != id || st.Node != node || st.Type != event.ScheduledInstanceReboot || !st.Start.Equal(start.UTC().Truncate(time.Second)) {
		t.Errorf("the run: %+v; want instance %s, node %s, instance-reboot at %s", st, id, node, start.UTC().Truncate(time.Second))
	}
	// The deferral is over (the pipeline ends it right after the Runner's Begin): ended as
	// handed to the reboot in place, not left to fire again.
	s.eventually("the deferral ended as in-place", 10*time.Second, func() bool {
		set := s.memory(claim).Set()
		return len(set.Active()) == 0 &&
			slices.ContainsFunc(set.Records, func(r record.Record) bool { return r.Key == arn && r.State == record.StateInPlace })
	})
	s.eventually("the node cordoned, do-not-disrupt on the NodeClaim and the Node", 20*time.Second, func() bool {
		n := s.nodeObj(node)
		return n.Spec.Unschedulable && n.Annotations[karpv1.DoNotDisruptAnnotationKey] == "true" &&
			s.claim(claim).Annotations[karpv1.DoNotDisruptAnnotationKey] == "true"
	})

	// The drain asks for both db pods at once: either may take the one disruption allowed.
	var kept string
	s.eventually("web-0 and one db pod evicted", 20*time.Second, func() bool {
		switch {
		case s.podState(ns, "web-0") != "gone":
			return false
		case s.podState(ns, "db-0") == "gone":
			kept = "db-1"
		case s.podState(ns, "db-1") == "gone":
			kept = "db-0"
		default:
			return false
		}
		return true
	})
	// The budget is used up: the other stays, however often the drain asks.
	for range 30 {
		if got := s.podState(ns, kept); got != "running" {
			t.Fatalf("%s %s while its budget allows no disruption", kept, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, _ := s.run(claim); st.Step != inplace.StepEvict {
		t.Fatalf("the run went on with %s on the node: %+v", kept, st)
	}
	s.runningPod(ns, "db-2", "elsewhere", db)
	s.budgetStatus(ns, "db", 2) // the one left on the node and db-2
	s.eventually(kept+" evicted once the budget allows", 40*time.Second, func() bool { return s.podState(ns, kept) == "gone" })
	for _, p := range []string{"web-0", "db-0", "db-1"} {
		if !k.evictedByAPI(p) {
			t.Errorf("pod %s was not removed through the Eviction API", p)
		}
	}
	if got := s.podState(ns, "db-2"); got != "running" {
		t.Errorf("db-2, on another node, is %s", got)
	}

	// RebootInstances against moto: Rebooted is set only when the call succeeded.
	s.eventually("the instance rebooted", 20*time.Second, func() bool {
		st, _ = s.run(claim)
		return st.Step == inplace.StepAwait && !st.Rebooted.IsZero()
	})
	if st.BootID != "boot-1" {
		t.Errorf("boot ID before the reboot: %q", st.BootID)
	}
	if got := s.instanceState(id); got != "running" {
		t.Errorf("instance %s is %s after its reboot", id, got)
	}

	// The kubelet: NotReady while the instance reboots, then Ready with a new boot.
	s.kubelet(node, corev1.ConditionFalse, "boot-1")
	s.eventually("the run sees the Node NotReady", 30*time.Second, func() bool { st, _ = s.run(claim); return st.Step == inplace.StepReady })
	if n := s.nodeObj(node); !n.Spec.Unschedulable {
		t.Error("uncordoned while NotReady")
	}
	s.kubelet(node, corev1.ConditionTrue, "boot-2")
	s.eventually("the run done", 30*time.Second, func() bool { st, _ = s.run(claim); return st.Over() })
	if st.Outcome != inplace.OutcomeDone || st.Step != inplace.StepDone {
		t.Errorf("outcome %q at step %s, want done", st.Outcome, st.Step)
	}
	n := s.nodeObj(node)
	nc := s.claim(claim)
	if n.Spec.Unschedulable || n.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" || nc.Annotations[karpv1.DoNotDisruptAnnotationKey] != "" {
		t.Errorf("after the run: cordoned %v, do-not-disrupt on the Node %q, on the NodeClaim %q; want none", n.Spec.Unschedulable,
			n.Annotations[karpv1.DoNotDisruptAnnotationKey], nc.Annotations[karpv1.DoNotDisruptAnnotationKey])
	}
	if _, ok := n.Annotations[inplace.Annotation]; ok {
		t.Error("the run's mark left on the Node")
	}
	if !nc.DeletionTimestamp.IsZero() {
		t.Error("the NodeClaim was deleted: the node was replaced, not kept")
	}
	if set := s.memory(nc.Name).Set(); len(set.Active()) != 0 {
		t.Errorf("active records after the run: %+v", set.Active())
	}
	if v, f := s.queueCounts(s.karpURL); v+f != 0 {
		t.Errorf("%d messages sent to Karpenter's queue for a node kept", v+f)
	}
	s.eventually("the run's Events on the NodeClaim", 10*time.Second, func() bool {
		got := strings.Join(s.regarding(claim), ",")
		return strings.Contains(got, inplace.ReasonBegun) && strings.Contains(got, inplace.ReasonRebooting) && strings.Contains(got, inplace.ReasonDone)
	})
	if got := s.regarding(claim); slices.Contains(got, inplace.ReasonFallback) {
		t.Errorf("Events on the NodeClaim: %v", got)
	}
}
