package nodedrain

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

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

	"github.com/health-router/health-router/router/nodedrain"
	store "github.com/health-router/health-router/router/record"
)

// t0 is the fake clock's start.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// evictTimeout bounds each node's eviction round in the suite: short, so that a round a
// budget blocks ends quickly, and long enough for the helper to poll an evicted pod (every
// second) and see it gone.
const evictTimeout = 3 * time.Second

// setup is one test's drainer with a fake clock, and a recorder whose Events it reads.
type setup struct {
	t        *testing.T
	ctx      context.Context
	clock    *clocktesting.FakeClock
	recorder *events.FakeRecorder
	drainer  *nodedrain.Drainer
}

func newSetup(t *testing.T, opts nodedrain.Options) *setup {
	t.Helper()
	if testing.Short() {
		t.Skip("envtest suite; run without -short")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.EvictTimeout == 0 {
		opts.EvictTimeout = evictTimeout
	}
	clk := clocktesting.NewFakeClock(t0)
	// client-go's fake recorder counts every Eventf call: a real broadcaster would fold
	// repeats into one series, and hide a Warning posted twice.
	rec := events.NewFakeRecorder(100)
	return &setup{t: t, ctx: ctx, clock: clk, recorder: rec, drainer: nodedrain.New(kube, direct, cs, clk, rec, log, opts)}
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

// pass runs one Pass and returns the number of Nodes left draining.
func (s *setup) pass() int {
	s.t.Helper()
	n, err := s.drainer.Pass(s.ctx)
	if err != nil {
		s.t.Fatalf("Pass: %v", err)
	}
	return n
}

// begin begins a drain of node, and waits until the cache (which Pass reads) shows it.
func (s *setup) begin(node, eventID string, deadline time.Time) {
	s.t.Helper()
	already, err := s.drainer.Begin(s.ctx, getNode(s.t, node), nodedrain.Drain{EventID: eventID, Kind: "spot-interruption", Deadline: deadline})
	if err != nil || already {
		s.t.Fatalf("Begin(%s): already=%v err=%v", node, already, err)
	}
	eventually(s.t, "the cache shows the drain of "+node, func() bool { return cachedStored(s.t, node) != "" })
}

// record returns a Node's drain record as the API server holds it.
func record(t *testing.T, node string) (nodedrain.Record, bool) {
	t.Helper()
	rec, ok, err := freshRecord(t, node)
	if err != nil {
		t.Fatal(err)
	}
	return rec, ok
}

// freshRecord returns a Node's drain record as the API server holds it (in the Node's
// HealthRecord; a record of an earlier Node of the same name is none).
func freshRecord(t *testing.T, node string) (nodedrain.Record, bool, error) {
	t.Helper()
	return nodedrain.Of(nodeMemory(t, direct, node))
}

// cachedRecord is freshRecord through the cache, as Pass reads it.
func cachedRecord(t *testing.T, node string) (nodedrain.Record, bool, error) {
	t.Helper()
	return nodedrain.Of(nodeMemory(t, kube, node))
}

// stored is a Node's drain record as the API server holds it, in JSON ("" for none).
func stored(t *testing.T, node string) string {
	t.Helper()
	return string(nodeMemory(t, direct, node).NodeDrain)
}

// cachedStored is stored through the cache.
func cachedStored(t *testing.T, node string) string {
	t.Helper()
	return string(nodeMemory(t, kube, node).NodeDrain)
}

// nodeMemory reads the memory of the Node named node through r: none if the Node is gone,
// or if the HealthRecord is an earlier Node's of the same name (envtest runs no garbage
// collector).
func nodeMemory(t *testing.T, r client.Reader, node string) store.Memory {
	t.Helper()
	hr := &store.HealthRecord{}
	err := r.Get(context.Background(), client.ObjectKey{Name: store.NodeRecordName(node)}, hr)
	if apierrors.IsNotFound(err) {
		return store.Memory{}
	}
	must(t, err)
	n := &corev1.Node{}
	if err := r.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil || (hr.NodeUID() != "" && hr.NodeUID() != n.UID) {
		return store.Memory{}
	}
	m, err := hr.Memory()
	must(t, err)
	return m
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
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within 20s", what)
	}
}

// getNode reads a Node from the API server, not the cache.
func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	must(t, direct.Get(context.Background(), client.ObjectKey{Name: name}, n))
	return n
}

// newNode creates a Node that Karpenter does not manage (no NodeClaim, as in a managed node
// group), deleted when the test ends: once the cache no longer shows it, the next test's
// passes cannot come upon it.
func newNode(t *testing.T, name string, cordoned bool) {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"eks.amazonaws.com/nodegroup": "system"}},
		Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0", Unschedulable: cordoned}}
	must(t, direct.Create(ctx, n))
	t.Cleanup(func() {
		if err := direct.Delete(ctx, n); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting node %s: %v", name, err)
		}
		// The garbage collector's work (envtest runs none): the Node's record goes with it.
		hr := &store.HealthRecord{ObjectMeta: metav1.ObjectMeta{Name: store.NodeRecordName(name)}}
		if err := direct.Delete(ctx, hr); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the record of node %s: %v", name, err)
		}
		eventually(t, "the cache forgets node "+name, func() bool {
			return apierrors.IsNotFound(kube.Get(ctx, client.ObjectKey{Name: name}, &corev1.Node{}))
		})
	})
}

func newNamespace(t *testing.T, name string) {
	t.Helper()
	must(t, direct.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// podOpts describe a pod of the fixture.
type podOpts struct {
	owner    *metav1.OwnerReference // the controller, if any
	labels   map[string]string
	mirror   bool // a static pod's mirror
	emptyDir bool
}

// newPod creates a pod bound to node and, playing the kubelet, reports it Running and
// Ready: the Eviction API checks budgets only for running pods, and counts only ready ones
// as healthy.
func newPod(t *testing.T, ns, name, node string, o podOpts) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: o.labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	if o.owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*o.owner}
	}
	if o.mirror {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "0123456789abcdef"}
	}
	if o.emptyDir {
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	}
	must(t, direct.Create(ctx, p))
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()},
	}}
	must(t, direct.Status().Update(ctx, p))
	return p
}

// replicaSet creates a ReplicaSet (no controller runs: it creates no pods) and returns the
// owner reference of its pods.
func replicaSet(t *testing.T, ns, name string, labels map[string]string) *metav1.OwnerReference {
	t.Helper()
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}}}
	must(t, direct.Create(context.Background(), rs))
	return metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))
}

// daemonSet creates a DaemonSet and returns the owner reference of its pods (the drain
// helper looks the DaemonSet up: an orphan would be evicted).
func daemonSet(t *testing.T, ns, name string) *metav1.OwnerReference {
	t.Helper()
	labels := map[string]string{"app": name}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}}}
	must(t, direct.Create(context.Background(), ds))
	return metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))
}

// budget creates a PodDisruptionBudget and sets its status as the disruption controller
// would for healthy pods and maxUnavailable (which envtest's lack of a controller leaves to
// the test).
func budget(t *testing.T, ns, name string, labels map[string]string, maxUnavailable int32, healthy int32) *policyv1.PodDisruptionBudget {
	t.Helper()
	mu := intstr.FromInt32(maxUnavailable)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &mu, Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	must(t, direct.Create(context.Background(), pdb))
	setBudgetStatus(t, pdb, healthy)
	return pdb
}

// setBudgetStatus is the disruption controller's work: disruptions allowed = maxUnavailable
// (all pods healthy), observed at the budget's current generation.
func setBudgetStatus(t *testing.T, pdb *policyv1.PodDisruptionBudget, healthy int32) {
	t.Helper()
	ctx := context.Background()
	must(t, direct.Get(ctx, client.ObjectKeyFromObject(pdb), pdb))
	allowed := pdb.Spec.MaxUnavailable.IntVal
	cond := metav1.ConditionTrue
	if allowed == 0 {
		cond = metav1.ConditionFalse
	}
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
		CurrentHealthy: healthy, DesiredHealthy: healthy - allowed, ExpectedPods: healthy,
		Conditions: []metav1.Condition{{Type: policyv1.DisruptionAllowedCondition, Status: cond, Reason: policyv1.SufficientPodsReason,
			Message: "set by the test", LastTransitionTime: metav1.Now(), ObservedGeneration: pdb.Generation}}}
	must(t, direct.Status().Update(ctx, pdb))
}

// kubelet plays the kubelet of a namespace's pods: a pod being deleted (evicted) is removed
// at once, after its conditions are kept (the Eviction API marks the pod DisruptionTarget).
type kubelet struct {
	mu      sync.Mutex
	removed map[string][]corev1.PodCondition
	stop    context.CancelFunc
	done    chan struct{}
}

func startKubelet(t *testing.T, ns string) *kubelet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubelet{removed: map[string][]corev1.PodCondition{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		for ctx.Err() == nil {
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, p := range pods.Items {
					if p.DeletionTimestamp == nil {
						continue
					}
					err := cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0),
						Preconditions: &metav1.Preconditions{UID: ptr.To(p.UID)}})
					if err == nil {
						k.mu.Lock()
						k.removed[p.Name] = p.Status.Conditions
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
	t.Cleanup(k.halt)
	return k
}

// halt stops the kubelet: evicted pods now stay terminating.
func (k *kubelet) halt() {
	k.stop()
	<-k.done
}

// evictedByAPI reports whether the kubelet removed pod after the Eviction API (not a plain
// DELETE) asked for its deletion.
func (k *kubelet) evictedByAPI(pod string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.removed[pod] {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == "EvictionByEvictionAPI" {
			return true
		}
	}
	return false
}

// podState is a pod as the API server holds it: gone, terminating, or there.
func podState(t *testing.T, ns, name string) string {
	t.Helper()
	p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
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

// cached reads a Node through the cache, as Pass does.
func cached(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	must(t, kube.Get(context.Background(), client.ObjectKey{Name: name}, n))
	return n
}
