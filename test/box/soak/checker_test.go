package soak

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/test/harness"
)

// checkEvery is how often the checker samples the cluster and the EC2 stand-in.
const checkEvery = time.Second

// Slack of the checker's judgements, for what it sees a sample late or on a second's grain
// (a deletionTimestamp has whole seconds):
const (
	// seenSlack: a maintenance counts from when the stand-in first showed it, less this.
	seenSlack = 5 * time.Second
	// edgeSlack: a drain begun this close to the window's edges counts as in it. The checker
	// sees a drain begin when Karpenter deletes the NodeClaim, which follows the router's
	// forward by about 0.3 s (docs/testing.md).
	edgeSlack = 5 * time.Second
	// closeSlack: a maintenance AWS cancelled still counts for this long after, the time its
	// closed Health event takes to reach a router that may have been killed just then (it
	// waits for its Lease, about 15 s, before it reads the queue again).
	closeSlack = 30 * time.Second
	// awsSlack: a pod lost this long after AWS acted on its node is AWS's doing (a reboot
	// keeps the node down for rebootDown).
	awsSlack = rebootDown + 2*time.Minute
)

// settleTimeout bounds the wait at the end for the world to be at rest: every NodeClaim
// settled and both workloads at full strength.
const settleTimeout = 4 * time.Minute

// The invariants, as the table names them.
const (
	invWindow     = "kafka disrupted only in its window, or at AWS's start less drain-lead"
	invKafkaPDB   = "kafka: at least 2 of 3 brokers Ready (its PDB)"
	invWebPDB     = "web: at least 2 of 3 replicas Ready (its PDB)"
	invActed      = "each maintenance acted on (node emptied) before AWS's start"
	invFull       = "at the end: both workloads back at full strength"
	invCordoned   = "at the end: no node cordoned or do-not-disrupt with nothing pending"
	invRecordGone = "at the end: no HealthRecord of a NodeClaim or Node that is gone"
)

var invariants = []string{invWindow, invKafkaPDB, invWebPDB, invActed, invFull, invCordoned, invRecordGone}

// checker is the outside checker. It reads only the cluster (pods, Nodes, NodeClaims, PDBs'
// pods, HealthRecords as kubectl shows them) and the EC2 stand-in (its scheduled events, and
// what AWS carried out), never the router's memory or logs, every checkEvery, and judges at the
// workloads' level what the router promises their owners (issue 37). Its window arithmetic is
// its own (windowEvery, windowLength, drainLead), not the router's parser. Each violation is a
// test error with the time and what was seen.
type checker struct {
	w   *world
	aws *cloud

	mu      sync.Mutex
	pods    map[types.UID]*podSeen
	nodes   map[string]*nodeSeen  // by Node name, kept after the Node is gone
	events  map[string]*eventSeen // by instance/event ID
	onNode  map[string][]string   // the workload pods (not being deleted) on each node, at the previous sample
	tallies map[string]*tally
	counts  map[string]int // disruptions by workload and cause
	samples int
	errs    int
}

type podSeen struct {
	name, app, node string
	restarts        int32
	disrupted       bool
}

type nodeSeen struct {
	instance, pool, claim string
	claimDeleting         time.Time // when Karpenter began deleting its NodeClaim: the drain
}

type eventSeen struct {
	instance, id, code string
	start              time.Time // AWS's start, as the stand-in last showed it
	first              time.Time // first seen in the stand-in
	closed             time.Time // first seen cancelled or completed
	judged             bool
}

type tally struct{ checked, violations int }

func newChecker(w *world, aws *cloud) *checker {
	c := &checker{w: w, aws: aws, pods: map[types.UID]*podSeen{}, nodes: map[string]*nodeSeen{}, events: map[string]*eventSeen{},
		onNode: map[string][]string{}, tallies: map[string]*tally{}, counts: map[string]int{}}
	for _, inv := range invariants {
		c.tallies[inv] = &tally{}
	}
	return c
}

// run samples until ctx ends.
func (c *checker) run(ctx context.Context) {
	for {
		if err := c.sample(ctx); err != nil && ctx.Err() == nil {
			c.mu.Lock()
			c.errs++
			c.mu.Unlock()
			c.w.t.Logf("%s checker: %v", stamp(time.Now()), err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(checkEvery):
		}
	}
}

// sample reads the cluster and the stand-in once and judges what changed since the last.
func (c *checker) sample(ctx context.Context) error {
	now := time.Now()
	pods := &corev1.PodList{}
	if err := c.w.kube.List(ctx, pods, client.InNamespace(namespace)); err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	nodes := &corev1.NodeList{}
	if err := c.w.kube.List(ctx, nodes); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	claims := &karpv1.NodeClaimList{}
	if err := c.w.kube.List(ctx, claims); err != nil {
		return fmt.Errorf("listing nodeclaims: %w", err)
	}
	ec2 := c.w.ec2.Snapshot()
	acts := c.aws.actions()

	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples++
	c.seeNodes(nodes.Items, claims.Items)
	c.seeEvents(ec2, now)

	// The pods: disruptions, and the Ready count of each workload.
	present := map[types.UID]bool{}
	ready := map[string]int{}
	onNode := map[string][]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		app := p.Labels["app"]
		if p.Spec.NodeName == "" || (app != "kafka" && app != "web") {
			continue
		}
		present[p.UID] = true
		ps := c.pods[p.UID]
		if ps == nil {
			ps = &podSeen{name: p.Name, app: app, node: p.Spec.NodeName, restarts: restarts(p)}
			c.pods[p.UID] = ps
		}
		switch {
		case p.DeletionTimestamp != nil && !ps.disrupted:
			c.disrupted(ps, p.DeletionTimestamp.Time, "deleted", now, acts)
		case restarts(p) > ps.restarts:
			ps.restarts = restarts(p)
			c.disrupted(ps, now, "restarted in place", now, acts)
			ps.disrupted = false // restarted, it serves again and can be disrupted again
		}
		if podReady(p) {
			ready[app]++
		}
		if p.DeletionTimestamp == nil {
			onNode[p.Spec.NodeName] = append(onNode[p.Spec.NodeName], p.Name)
		}
	}
	for uid, ps := range c.pods {
		if present[uid] {
			continue
		}
		if !ps.disrupted {
			c.disrupted(ps, time.Time{}, "gone between two samples", now, acts)
		}
		delete(c.pods, uid)
	}

	// The PDBs: the router's drains go through Karpenter's evictions, which the PDBs bound;
	// AWS's own acts do not (and each is a violation of its own, below).
	for app, inv := range map[string]string{"kafka": invKafkaPDB, "web": invWebPDB} {
		if ready[app] >= minReady {
			c.tallies[inv].checked++
			continue
		}
		if _, ok := recentAct(acts, now); ok {
			c.counts[app+": samples below its PDB after AWS acted"]++
			continue
		}
		c.violate(inv, now, "%d of %d %s pods Ready, below the PDB's %d; no AWS act in the last %s", ready[app], replicas, app, minReady, awsSlack)
	}

	// Each maintenance whose start has come: was its node emptied, at the last sample before?
	for _, es := range c.events {
		if es.judged || now.Before(es.start) {
			continue
		}
		es.judged = true
		if !es.closed.IsZero() && es.closed.Before(es.start) {
			continue // cancelled: nothing to act on
		}
		node := c.nodeOfInstance(es.instance)
		if left := c.onNode[node]; node != "" && len(left) > 0 {
			c.violate(invActed, now, "%s of %s (node %s) starts at %s and the node still ran %v", es.code, es.instance, node, stamp(es.start), left)
			continue
		}
		c.tallies[invActed].checked++
	}
	c.onNode = onNode
	return nil
}

// seeNodes remembers each Node's instance, pool and NodeClaim, and when its NodeClaim began
// deleting.
func (c *checker) seeNodes(nodes []corev1.Node, claims []karpv1.NodeClaim) {
	byInstance := map[string]*karpv1.NodeClaim{}
	for i := range claims {
		byInstance[instanceOf(claims[i].Status.ProviderID)] = &claims[i]
	}
	for _, n := range nodes {
		ns := c.nodes[n.Name]
		if ns == nil {
			ns = &nodeSeen{instance: instanceOf(n.Spec.ProviderID), pool: n.Labels[karpv1.NodePoolLabelKey]}
			c.nodes[n.Name] = ns
		}
	}
	for _, ns := range c.nodes {
		nc := byInstance[ns.instance]
		if nc == nil {
			continue
		}
		ns.claim = nc.Name
		if !nc.DeletionTimestamp.IsZero() && ns.claimDeleting.IsZero() {
			ns.claimDeleting = nc.DeletionTimestamp.Time
		}
	}
}

// seeEvents remembers each scheduled event the stand-in shows: its start, when it was first
// seen, and when it was first seen cancelled or completed.
func (c *checker) seeEvents(instances map[string]harness.Instance, now time.Time) {
	for id, in := range instances {
		for _, e := range in.Events {
			key := id + "/" + e.ID
			es := c.events[key]
			if es == nil {
				es = &eventSeen{instance: id, id: e.ID, code: e.Code, first: now}
				c.events[key] = es
			}
			es.start = e.NotBefore
			if es.closed.IsZero() && (strings.HasPrefix(e.Description, "[Canceled]") || strings.HasPrefix(e.Description, "[Completed]")) {
				es.closed = now
			}
		}
	}
}

// disrupted judges the disruption of a workload pod: when its node's drain began (the
// NodeClaim deleting), else when it was deleted, restarted or found gone. A pod lost on a node
// AWS acted on is AWS's doing; a kafka pod's disruption outside its window must be for an AWS
// start that the next window opens too late for (later than the start less drain-lead), and no
// earlier than that start less drain-lead: the rule the pool's annotations give
// (docs/reference.md, drain-lead: held to the window, and never past the deadline minus
// drain-lead; pacing and gates only delay).
func (c *checker) disrupted(ps *podSeen, deleted time.Time, how string, now time.Time, acts []act) {
	ps.disrupted = true
	at := now
	if !deleted.IsZero() {
		at = deleted
	}
	ns := c.nodes[ps.node]
	if ns == nil {
		ns = &nodeSeen{}
	}
	if !ns.claimDeleting.IsZero() && ns.claimDeleting.Before(at) {
		at, how = ns.claimDeleting, "its node drained (NodeClaim "+ns.claim+" deleting)"
	}
	for _, a := range acts {
		if a.node == ps.node && slices.Contains(a.pods, ps.name) && !a.at.After(now.Add(time.Second)) && at.Sub(a.at) < awsSlack {
			c.counts[ps.app+": lost to AWS's act"]++
			return
		}
	}
	if ps.app != "kafka" {
		c.counts[ps.app+": disrupted"]++
		return
	}
	if inWindow(at) {
		c.counts["kafka: disrupted in its window"]++
		c.tallies[invWindow].checked++
		return
	}
	next := nextOpen(at)
	var seen []string
	for _, es := range c.events {
		if es.instance != ns.instance {
			continue
		}
		seen = append(seen, fmt.Sprintf("%s %s start %s seen %s closed %s", es.code, es.id, stamp(es.start), stamp(es.first), stampOr(es.closed)))
		open := !es.first.After(at.Add(seenSlack)) && (es.closed.IsZero() || !es.closed.Add(closeSlack).Before(at))
		latest := es.start.Add(-drainLead)
		if open && next.After(latest.Add(-edgeSlack)) && !at.Before(latest.Add(-edgeSlack)) {
			c.counts["kafka: disrupted at AWS's start less drain-lead (the window too late)"]++
			c.tallies[invWindow].checked++
			return
		}
	}
	slices.Sort(seen)
	c.violate(invWindow, at, "kafka pod %s on %s (%s) %s at %s, outside its window (next opens %s), and not at an AWS start less drain-lead %s that the window opens too late for; events of the instance: %v",
		ps.name, ps.node, ns.instance, how, stamp(at), stamp(next), drainLead, seen)
}

// nodeOfInstance returns the name of the Node of an instance, as last seen, or "".
func (c *checker) nodeOfInstance(instance string) string {
	for name, ns := range c.nodes {
		if ns.instance == instance {
			return name
		}
	}
	return ""
}

func (c *checker) violate(inv string, at time.Time, format string, args ...any) {
	c.tallies[inv].checked++
	c.tallies[inv].violations++
	c.w.t.Errorf("%s VIOLATION [%s]: %s", stamp(at), inv, fmt.Sprintf(format, args...))
}

// settle waits, sampling on, until the world is at rest: no NodeClaim deleting, and both
// workloads Ready on their three nodes each.
func (c *checker) settle(ctx context.Context) {
	deadline := time.Now().Add(settleTimeout)
	var state string
	for time.Now().Before(deadline) {
		claims := &karpv1.NodeClaimList{}
		kafka, web, err := c.w.readyPods(ctx)
		if err == nil {
			err = c.w.kube.List(ctx, claims)
		}
		deleting := 0
		for _, nc := range claims.Items {
			if !nc.DeletionTimestamp.IsZero() {
				deleting++
			}
		}
		state = fmt.Sprintf("kafka Ready on %v, web Ready on %v, %d nodeclaims deleting (error %v)", kafka, web, deleting, err)
		if err == nil && len(kafka) == replicas && len(web) == replicas && deleting == 0 {
			c.mu.Lock()
			c.tallies[invFull].checked++
			c.mu.Unlock()
			return
		}
		time.Sleep(2 * time.Second)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violate(invFull, time.Now(), "not at rest within %s of the end: %s", settleTimeout, state)
}

// final checks what the world must not be left with: a Node cordoned or protected from
// Karpenter (karpenter.sh/do-not-disrupt, on the Node or its NodeClaim) with nothing pending
// for it (its NodeClaim not deleting, no maintenance of its instance still to come), and a
// HealthRecord whose NodeClaim or Node is gone (given a minute for the garbage collector).
func (c *checker) final(ctx context.Context) {
	nodes := &corev1.NodeList{}
	claims := &karpv1.NodeClaimList{}
	if err := c.w.kube.List(ctx, nodes); err != nil {
		c.w.t.Errorf("final check: listing nodes: %v", err)
		return
	}
	if err := c.w.kube.List(ctx, claims); err != nil {
		c.w.t.Errorf("final check: listing nodeclaims: %v", err)
		return
	}
	byInstance := map[string]karpv1.NodeClaim{}
	for _, nc := range claims.Items {
		byInstance[instanceOf(nc.Status.ProviderID)] = nc
	}
	now := time.Now()
	c.mu.Lock()
	for _, n := range nodes.Items {
		id := instanceOf(n.Spec.ProviderID)
		nc, hasClaim := byInstance[id]
		protected := n.Annotations[karpv1.DoNotDisruptAnnotationKey] == "true" || (hasClaim && nc.Annotations[karpv1.DoNotDisruptAnnotationKey] == "true")
		pending := hasClaim && !nc.DeletionTimestamp.IsZero()
		for _, es := range c.events {
			if es.instance == id && es.closed.IsZero() && now.Before(es.start) {
				pending = true
			}
		}
		if (n.Spec.Unschedulable || protected) && !pending {
			c.violate(invCordoned, now, "node %s (%s): cordoned %v, do-not-disrupt %v, with nothing pending", n.Name, id, n.Spec.Unschedulable, protected)
			continue
		}
		c.tallies[invCordoned].checked++
	}
	c.mu.Unlock()

	var gone []string
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		gone, err = c.goneRecords(ctx)
		if err != nil {
			c.w.t.Errorf("final check: listing healthrecords: %v", err)
			return
		}
		if len(gone) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range gone {
		c.violate(invRecordGone, time.Now(), "%s, a minute after the end", g)
	}
	c.tallies[invRecordGone].checked++
}

// goneRecords lists the HealthRecords (as kubectl get healthrecords does: their spec only) whose
// NodeClaim, or for a Node's own record its Node, is gone.
func (c *checker) goneRecords(ctx context.Context) ([]string, error) {
	records := &unstructured.UnstructuredList{}
	records.SetGroupVersionKind(schema.GroupVersionKind{Group: "healthrouter.io", Version: "v1alpha1", Kind: "HealthRecordList"})
	if err := c.w.kube.List(ctx, records); err != nil {
		return nil, err
	}
	var gone []string
	for _, r := range records.Items {
		claim, _, _ := unstructured.NestedString(r.Object, "spec", "nodeClaim")
		node, _, _ := unstructured.NestedString(r.Object, "spec", "nodeName")
		var obj client.Object = &karpv1.NodeClaim{}
		key, what := claim, "NodeClaim"
		if claim == "" {
			obj, key, what = &corev1.Node{}, node, "Node"
		}
		if key == "" {
			continue // of neither: not what this invariant is about (the shadow ledger's record, on newer routers)
		}
		err := c.w.kube.Get(ctx, client.ObjectKey{Name: key}, obj)
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		if err != nil {
			gone = append(gone, fmt.Sprintf("healthrecord %s of %s %s, which is gone", r.GetName(), what, key))
		}
	}
	return gone, nil
}

// inWindow reports whether t falls in one of the kafka pool's windows, give or take edgeSlack.
func inWindow(t time.Time) bool {
	opened := t.Truncate(windowEvery) // "*/3 * * * *": the openings are the multiples of 3 minutes
	return t.Sub(opened) < windowLength+edgeSlack || nextOpen(t).Sub(t) <= edgeSlack
}

// nextOpen returns the kafka pool's next window opening after t.
func nextOpen(t time.Time) time.Time { return t.Truncate(windowEvery).Add(windowEvery) }

// recentAct returns the latest act of AWS within awsSlack before now on a node that ran
// workload pods.
func recentAct(acts []act, now time.Time) (act, bool) {
	for i := len(acts) - 1; i >= 0; i-- {
		if now.Sub(acts[i].at) < awsSlack && len(acts[i].pods) > 0 {
			return acts[i], true
		}
	}
	return act{}, false
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n
}

func stampOr(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return stamp(t)
}
