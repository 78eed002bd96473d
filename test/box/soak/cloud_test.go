package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/test/harness"
)

// account is the AWS account the soak's events come from.
const account = "111122223333"

// closeShare is the share of maintenances AWS cancels before their start, and postponeShare
// the share of the others it postpones (by one to two minutes, the event's ID kept, and a Health
// event of the same eventArn with the new start).
const (
	closeShare    = 0.25
	postponeShare = 0.2
)

// rebootDown is how long an instance AWS reboots stays down: past the node lifecycle
// controller's grace period (50 s), so that the Node goes NotReady as after a real reboot.
const rebootDown = 60 * time.Second

// kind is a kind of scheduled maintenance: its EC2 event code, the AWS Health code of the same
// maintenance, and whether AWS takes the instance away at its start (a retirement, a stop) or
// reboots it.
type kind struct {
	code, health, description string
	takesAway                 bool
}

// kinds are the maintenances AWS draws, each as likely.
var kinds = []kind{
	{code: "instance-reboot", health: "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", description: "The instance is scheduled for a reboot"},
	{code: "system-reboot", health: "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", description: "The instance is scheduled for a system reboot"},
	{code: "system-maintenance", health: "AWS_EC2_SYSTEM_MAINTENANCE_EVENT", description: "The instance is scheduled for system maintenance"},
	{code: "instance-retirement", health: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", description: "The instance is running on degraded hardware", takesAway: true},
	{code: "instance-stop", health: "AWS_EC2_INSTANCE_STOP_SCHEDULED", description: "The instance is running on degraded hardware", takesAway: true},
}

// maintenance is one scheduled event AWS drew.
type maintenance struct {
	kind     kind
	pool     string
	instance string
	eventID  string // EC2's instance-event ID
	arn      string // AWS Health's eventArn
	drawn    time.Time
	start    time.Time
	closeAt  time.Time // when AWS cancels it; zero: it does not
	closed   bool
	// postponeAt is when AWS postpones it by postponeBy; zero: it does not.
	postponeAt time.Time
	postponeBy time.Duration
	postponed  bool
	done       bool   // its start has come
	outcome    string // what AWS did at its start
}

// act is something AWS carried out on an instance: a reboot or a take-away.
type act struct {
	at       time.Time
	instance string
	node     string
	kind     string
	pods     []string // the workload pods on the node when AWS acted
}

// cloud is the EC2 that acts like AWS. It draws scheduled maintenance for the pools'
// instances from its seeded generator, puts each into the EC2 stand-in (what
// DescribeInstanceStatus reports) and sends the matching AWS Health event, in EventBridge's
// shape, to the router's intake queue; it cancels some before their start (the stand-in shows
// them [Canceled], and a closed Health event follows); and at a maintenance's start, if
// nothing took the instance away meanwhile, it carries it out: a reboot stops the Node's
// kubelet for rebootDown and brings it back with a new boot ID, a retirement or a stop
// terminates the instance in moto, deletes its pods without eviction and deletes the Node.
// It also keeps the stand-in's instances those Karpenter launched, in the state moto shows.
type cloud struct {
	w         *world
	rng       *rand.Rand // the draw loop's alone
	lastStart time.Time  // no maintenance starts later
	gap       time.Duration

	acting sync.WaitGroup // the maintenances being carried out

	mu        sync.Mutex
	known     map[string]string // instance -> its state in the stand-in
	maints    []*maintenance
	acts      []act
	drawn     map[string]int // by kind code
	skips     int            // draws that found no instance to schedule on
	closes    int
	postponed int
	errs      int // calls to AWS or the cluster that failed (each logged)
	seq       int
}

func newCloud(w *world, rng *rand.Rand, lastStart time.Time, gap time.Duration) *cloud {
	return &cloud{w: w, rng: rng, lastStart: lastStart, gap: gap, known: map[string]string{}, drawn: map[string]int{}}
}

// draw draws a maintenance every gap on average (exponentially), as long as one drawn now can
// start before lastStart. Every random number of a draw is taken before the cluster is read,
// so the sequence of draws is the seed's whatever the cluster looks like.
func (c *cloud) draw(ctx context.Context) {
	for {
		wait := time.Duration(c.rng.ExpFloat64() * float64(c.gap))
		k := kinds[c.rng.IntN(len(kinds))]
		pool := []string{"kafka", "web"}[c.rng.IntN(2)]
		pick := c.rng.IntN(1 << 30)
		aheadFrac, closeFrac, postponeFrac := c.rng.Float64(), c.rng.Float64(), c.rng.Float64()
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		now := time.Now()
		room := min(aheadMax, c.lastStart.Sub(now))
		if room < aheadMin {
			return
		}
		ahead := aheadMin + time.Duration(aheadFrac*float64(room-aheadMin))
		c.schedule(ctx, now, pool, k, ahead, pick, closeFrac, postponeFrac)
	}
}

// schedule schedules a maintenance of kind k for one of pool's instances (the pick-th of
// those that run a Node and have no maintenance of ours pending), ahead from now.
func (c *cloud) schedule(ctx context.Context, now time.Time, pool string, k kind, ahead time.Duration, pick int, closeFrac, postponeFrac float64) {
	claims := &karpv1.NodeClaimList{}
	if err := c.w.kube.List(ctx, claims, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		c.fail("listing nodeclaims", err)
		return
	}
	c.mu.Lock()
	pending := map[string]bool{}
	for _, m := range c.maints {
		if !m.closed && !m.done {
			pending[m.instance] = true
		}
	}
	c.mu.Unlock()
	var candidates []string
	for _, nc := range claims.Items {
		id := instanceOf(nc.Status.ProviderID)
		if id == "" || !nc.DeletionTimestamp.IsZero() || !nc.StatusConditions().Get(karpv1.ConditionTypeInitialized).IsTrue() || pending[id] {
			continue
		}
		candidates = append(candidates, id)
	}
	sort.Strings(candidates)
	c.mu.Lock()
	if len(candidates) == 0 {
		c.skips++
		c.mu.Unlock()
		return
	}
	c.seq++
	seq := c.seq
	if _, ok := c.known[candidates[pick%len(candidates)]]; !ok {
		c.skips++ // not yet in the stand-in: the mirror adds it within seconds
		c.mu.Unlock()
		return
	}
	m := &maintenance{
		kind: k, pool: pool, instance: candidates[pick%len(candidates)], drawn: now,
		start:   now.Add(ahead).Truncate(time.Second),
		eventID: fmt.Sprintf("instance-event-%017x", 0x50a4000+seq),
	}
	m.arn = fmt.Sprintf("arn:aws:health:%s::event/EC2/%s/%s_%s", harness.Region, k.health, k.health, uuid(seq, 0))
	if closeFrac < closeShare {
		// Cancelled somewhere between 15 s after the draw and 30 s before the start.
		span := m.start.Add(-30 * time.Second).Sub(now.Add(15 * time.Second))
		m.closeAt = now.Add(15*time.Second + time.Duration(closeFrac/closeShare*float64(max(span, 0))))
	} else if f := (closeFrac - closeShare) / (1 - closeShare); f < postponeShare {
		// Postponed by one to two minutes (never past lastStart), half way to its start.
		m.postponeBy = min(time.Minute+time.Duration(f/postponeShare*float64(time.Minute)), c.lastStart.Sub(m.start)).Truncate(time.Second)
		if m.postponeBy > 0 {
			m.postponeAt = now.Add(m.start.Sub(now) / 2)
		}
	}
	c.maints = append(c.maints, m)
	c.drawn[k.code]++
	c.mu.Unlock()

	notAfter := time.Time{}
	if !k.takesAway {
		notAfter = m.start.Add(2 * time.Hour)
	}
	c.w.ec2.Set(m.instance, func(in *harness.Instance) {
		in.Events = append(in.Events, harness.ScheduledEvent{ID: m.eventID, Code: k.code, Description: k.description, NotBefore: m.start, NotAfter: notAfter})
	})
	c.send(ctx, healthBody(m, "upcoming", uuid(seq, 1), now))
	c.w.t.Logf("%s AWS: %s for %s (%s), starting %s (in %s)%s", stamp(now), k.code, m.instance, pool, stamp(m.start), ahead.Round(time.Second),
		map[bool]string{true: fmt.Sprintf(", to be cancelled at %s", stamp(m.closeAt)), false: ""}[!m.closeAt.IsZero()]+
			map[bool]string{true: fmt.Sprintf(", to be postponed by %s at %s", m.postponeBy, stamp(m.postponeAt)), false: ""}[!m.postponeAt.IsZero()])
}

// carryOut cancels the maintenances whose time to be cancelled has come, and carries out
// those whose start has come.
func (c *cloud) carryOut(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		now := time.Now()
		var toClose, toPostpone, toStart []*maintenance
		c.mu.Lock()
		for _, m := range c.maints {
			switch {
			case m.closed || m.done:
			case !m.closeAt.IsZero() && !now.Before(m.closeAt):
				m.closed = true
				c.closes++
				toClose = append(toClose, m)
			case !m.postponeAt.IsZero() && !m.postponed && !now.Before(m.postponeAt):
				m.postponed = true
				m.start = m.start.Add(m.postponeBy)
				c.postponed++
				toPostpone = append(toPostpone, m)
			case !now.Before(m.start):
				m.done = true
				toStart = append(toStart, m)
			}
		}
		c.mu.Unlock()
		for _, m := range toClose {
			c.mark(m, "[Canceled] ")
			c.send(ctx, healthBody(m, "closed", uuid(c.next(), 1), now))
			c.w.t.Logf("%s AWS: %s for %s cancelled", stamp(now), m.kind.code, m.instance)
		}
		for _, m := range toPostpone {
			c.w.ec2.Set(m.instance, func(in *harness.Instance) {
				for i := range in.Events {
					if e := &in.Events[i]; e.ID == m.eventID {
						e.NotBefore = m.start
						if !e.NotAfter.IsZero() {
							e.NotAfter = e.NotAfter.Add(m.postponeBy)
						}
					}
				}
			})
			c.send(ctx, healthBody(m, "upcoming", uuid(c.next(), 1), now))
			c.w.t.Logf("%s AWS: %s for %s postponed by %s, to %s", stamp(now), m.kind.code, m.instance, m.postponeBy, stamp(m.start))
		}
		for _, m := range toStart {
			c.acting.Go(func() { c.start(ctx, m) })
		}
	}
}

// wait returns once every maintenance being carried out is done (or given up, its context
// ended).
func (c *cloud) wait() { c.acting.Wait() }

// start carries a maintenance out at its start, if the instance still runs.
func (c *cloud) start(ctx context.Context, m *maintenance) {
	state, err := c.w.stage.InstanceState(ctx, m.instance)
	if err != nil || state != "running" {
		c.outcome(m, fmt.Sprintf("nothing to do: the instance is %s", orGone(state, err)))
		c.mark(m, "[Completed] ")
		return
	}
	node, pods, err := c.nodeOf(ctx, m.instance)
	if err != nil {
		c.fail("finding the node of "+m.instance, err)
	}
	c.mu.Lock()
	c.acts = append(c.acts, act{at: time.Now(), instance: m.instance, node: node, kind: m.kind.code, pods: pods})
	c.mu.Unlock()
	c.w.t.Logf("%s AWS: carrying out %s on %s (node %q, pods %v): nothing moved it and the instance still runs", stamp(time.Now()), m.kind.code, m.instance, node, pods)
	if m.kind.takesAway {
		c.outcome(m, "instance taken away")
		c.takeAway(ctx, m.instance, node)
	} else {
		c.outcome(m, "instance rebooted")
		if node != "" {
			if _, err := c.w.box.Reboot(ctx, node, rebootDown); err != nil && ctx.Err() == nil {
				c.fail("rebooting node "+node, err)
			}
		}
	}
	c.mark(m, "[Completed] ")
}

// takeAway is a retirement's or a stop's end: the instance terminated (in moto, and so in
// the stand-in at the next mirror), its pods gone without an eviction, its Node deleted.
func (c *cloud) takeAway(ctx context.Context, instance, node string) {
	if _, err := c.w.stage.EC2.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{instance}}); err != nil {
		c.fail("terminating "+instance, err)
	}
	if node == "" {
		return
	}
	pods := &corev1.PodList{}
	if err := c.w.kube.List(ctx, pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		c.fail("listing the pods of "+node, err)
	}
	for i := range pods.Items {
		if err := c.w.kube.Delete(ctx, &pods.Items[i], client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			c.fail("deleting pod "+pods.Items[i].Name, err)
		}
	}
	if err := c.w.kube.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); client.IgnoreNotFound(err) != nil {
		c.fail("deleting node "+node, err)
	}
}

// nodeOf returns the Node of an instance and the workload pods on it, or "" when it has none.
func (c *cloud) nodeOf(ctx context.Context, instance string) (string, []string, error) {
	nodes := &corev1.NodeList{}
	if err := c.w.kube.List(ctx, nodes); err != nil {
		return "", nil, err
	}
	for _, n := range nodes.Items {
		if instanceOf(n.Spec.ProviderID) != instance {
			continue
		}
		pods := &corev1.PodList{}
		if err := c.w.kube.List(ctx, pods, client.InNamespace(namespace), client.MatchingFields{"spec.nodeName": n.Name}); err != nil {
			return n.Name, nil, err
		}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				names = append(names, p.Name)
			}
		}
		return n.Name, names, nil
	}
	return "", nil, nil
}

// mark prefixes the maintenance's event in the stand-in as EC2 does once it is cancelled or
// completed.
func (c *cloud) mark(m *maintenance, prefix string) {
	c.w.ec2.Set(m.instance, func(in *harness.Instance) {
		for i := range in.Events {
			if in.Events[i].ID == m.eventID && !strings.HasPrefix(in.Events[i].Description, "[") {
				in.Events[i].Description = prefix + in.Events[i].Description
			}
		}
	})
}

// mirror keeps the stand-in's instances those of the cluster's NodeClaims, each in the state
// moto shows, every two seconds: the router asks the stand-in about every instance it knows.
func (c *cloud) mirror(ctx context.Context) {
	for {
		c.mirrorOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

func (c *cloud) mirrorOnce(ctx context.Context) {
	claims := &karpv1.NodeClaimList{}
	if err := c.w.kube.List(ctx, claims); err != nil {
		if ctx.Err() == nil {
			c.fail("listing nodeclaims", err)
		}
		return
	}
	for _, nc := range claims.Items {
		id := instanceOf(nc.Status.ProviderID)
		c.mu.Lock()
		_, ok := c.known[id]
		if id != "" && !ok {
			c.known[id] = "running"
			c.w.ec2.Add(id, &harness.Instance{})
		}
		c.mu.Unlock()
	}
	states := map[string]string{}
	pages := ec2.NewDescribeInstancesPaginator(c.w.stage.EC2, &ec2.DescribeInstancesInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.fail("describing moto's instances", err)
			}
			return
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				if in.State != nil {
					states[aws.ToString(in.InstanceId)] = string(in.State.Name)
				}
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, was := range c.known {
		if now, ok := states[id]; ok && now != was {
			c.known[id] = now
			c.w.ec2.Set(id, func(in *harness.Instance) { in.State = now })
		}
	}
}

// send puts an EventBridge event on the router's intake queue, as the rule that feeds it.
func (c *cloud) send(ctx context.Context, body string) {
	var err error
	for range 5 {
		if _, err = c.w.stage.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(c.w.intake), MessageBody: aws.String(body)}); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	c.fail("sending an event to the intake queue", err)
}

func (c *cloud) outcome(m *maintenance, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m.outcome = what
}

func (c *cloud) next() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	return c.seq
}

func (c *cloud) fail(what string, err error) {
	c.mu.Lock()
	c.errs++
	c.mu.Unlock()
	c.w.t.Logf("%s AWS stand-in: %s: %v", stamp(time.Now()), what, err)
}

// actions returns what AWS carried out so far.
func (c *cloud) actions() []act {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.acts)
}

// healthBody is AWS Health's event for m, in EventBridge's shape (test/demo/events), with the
// given status: upcoming when it is scheduled, closed when it is cancelled.
func healthBody(m *maintenance, status, id string, now time.Time) string {
	start := m.start.UTC().Format(http.TimeFormat)
	b, _ := json.Marshal(map[string]any{
		"version": "0", "id": id, "detail-type": "AWS Health Event", "source": "aws.health", "account": account,
		"time": now.UTC().Format(time.RFC3339), "region": harness.Region, "resources": []string{m.instance},
		"detail": map[string]any{
			"eventArn": m.arn, "service": "EC2", "eventTypeCode": m.kind.health, "eventTypeCategory": "scheduledChange",
			"statusCode": status, "startTime": start, "endTime": start,
			"eventDescription": []map[string]string{{"language": "en_US", "latestDescription": m.kind.description}},
			"affectedEntities": []map[string]any{{"entityValue": m.instance, "tags": map[string]string{}}},
		},
	})
	return string(b)
}

// uuid returns a UUID-shaped ID, distinct for each (seq, n).
func uuid(seq, n int) string {
	return fmt.Sprintf("50a4c0de-%04x-4%03x-8000-%012x", n, seq>>12&0xfff, seq)
}

func orGone(state string, err error) string {
	if err != nil {
		return "gone (" + err.Error() + ")"
	}
	return state
}

// stamp is a time as the soak's log lines show it.
func stamp(t time.Time) string { return t.UTC().Format("15:04:05") }
