package sim

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
)

// moves counts the scheduled events EC2 moved at the router's request, over all runs.
var moves atomic.Int64

// inPlaces counts the reboots in place the router began, over all runs.
var inPlaces atomic.Int64

// eventsSummarised counts the instances whose Events were held back and told in a summary,
// over all runs.
var eventsSummarised atomic.Int64

// The harsher world is driven, not only possible: stale reads the router's cache served,
// batches decided by workers at once, failovers where the old leader overlapped the new, AWS
// reboots that found a kept node out of service, drains of the unmanaged node begun.
var staleReads, concurrentBatches, overlaps, awsOutOfService, awsUnmanaged, unmanagedCordons, urgentHolds, contradicted, shadowOutcomes atomic.Int64

// forgedWrites counts the writes of the router's old memory keys onto NodeClaims by someone
// else (ForgedWrite): none may become a drain the model did not owe.
var forgedWrites atomic.Int64

// ledgerEntriesChecked counts the shadow ledger's entries checkLedger judged (each check).
var ledgerEntriesChecked atomic.Int64

// migrations counts the router's reboots that migrated an instance and cleared its
// system-reboot; sqsFailures the batches whose deletes and sends SQS failed after it handed
// them out.
var migrations, sqsFailures atomic.Int64

// cordonDrainOffRestarts counts the leaders restarted without --unmanaged-nodes=cordon-drain.
var cordonDrainOffRestarts atomic.Int64

// modeSwitches counts the shadow pool's switches between shadow and active; standInDrains
// the drains the router carried out for it in shadow, as Karpenter would.
var modeSwitches, standInDrains atomic.Int64

// tiedCloses counts the closes decided at once with a report of their maintenance under
// another key, sent no earlier (the model's stateTied).
var tiedCloses atomic.Int64

// resolvedUpdates counts the closes sent as an open AWS Health update whose entity for the
// instance is RESOLVED.
var resolvedUpdates atomic.Int64

// windowsKept: kafka's EC2 event window was seen over the run.
var windowsKept atomic.Bool

// checks is rapid's -rapid.checks.
func checks() *int {
	n := 0
	if f := flag.Lookup("rapid.checks"); f != nil {
		n, _ = strconv.Atoi(f.Value.String())
	}
	return &n
}

// steps is how many actions one seed runs; `make sim` raises the seeds (-rapid.checks).
var steps = flag.Int("sim.steps", 60, "actions per simulated run")

// machine drives a world and checks it against the model after every action.
type machine struct {
	mu  sync.Mutex // the model, as the router's hooks reach it from concurrent workers
	w   *world
	m   *model
	ctx context.Context
	// effects are what the router learns from a message: a cause to drain is known while it
	// is processed (before), an ending (a closed maintenance, a running instance) once the
	// message is done with (after), so that the model never forgives more than the router knew.
	effects map[string]effect
	sent    []sentBody        // bodies sent, for duplicates
	polled  map[string]effect // EC2's events the next successful poll tells the router of, by event ID: what EC2 then holds
	horizon time.Time         // the latest maintenance the run made
	evSeq   int
	pollIDs map[string]string // instance/type -> EC2 instance-event ID
	// healthARNs is the AWS Health event of each instance and code: a report after the
	// event's close is of a new event (AWS Health does not reopen a closed event), under a
	// new ARN.
	healthARNs map[string]healthARN
	// shadowSeen is how many would-be outcomes each NodeClaim of the shadow pool showed last.
	shadowSeen map[string]int
	plans      map[string]awsReboot
	goBase     int
	// reboots are the maintenances (instance/event ID/start) the router rebooted an instance
	// for; migrated the instances whose reboot migration cleared their system-reboot, and when.
	reboots  map[string]bool
	migrated map[string]time.Time
}

func newMachine(t *rapid.T) *machine {
	mode := rapid.SampledFrom([]signal.Mode{signal.ModeDeleteNodeClaim, signal.ModeForward}).Draw(t, "mode")
	m := &machine{m: newModel(), ctx: context.Background(), effects: map[string]effect{}, pollIDs: map[string]string{}, healthARNs: map[string]healthARN{}, polled: map[string]effect{}, plans: map[string]awsReboot{},
		shadowSeen: map[string]int{}, reboots: map[string]bool{}, migrated: map[string]time.Time{}}
	w, err := newWorldHooked(mode, m)
	if err != nil {
		t.Fatal(err)
	}
	m.w = w
	w.lead(w.leader)
	m.goBase = runtime.NumGoroutine()
	return m
}

// newWorldHooked builds the world with the model observing it from the first node on.
func newWorldHooked(mode signal.Mode, m *machine) (*world, error) {
	w, err := newWorldWith(mode, func(id, pool string) { m.m.inst(id, pool) })
	if err != nil {
		return nil, err
	}
	m.m.inst(UnmanagedInstance, "")
	m.m.overlapping = func() bool { return w.zombie != nil }
	w.onOverlapEnd = func() { m.m.overlapEnds = append(m.m.overlapEnds, w.clock.Now()) }
	w.onDrain = func(id string) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		if in := m.m.insts[id]; in != nil {
			m.m.drained(in, w.clock.Now())
		}
	}
	w.queues.onForward = func(id, leadership string) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		if in := m.m.insts[id]; in != nil {
			m.m.forwardedTo(in, w.clock.Now(), leadership)
		}
	}
	w.onInPlace = func(inst string, ev event.Event) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		inPlaces.Add(1)
		if in := m.m.insts[inst]; in != nil && ev.Health != nil {
			m.m.inPlaceBegun(in, ev.Health.Scheduled, ev.Deadline, w.clock.Now())
		}
	}
	w.onCordon = func(inst string) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		unmanagedCordons.Add(1)
		if in := m.m.insts[inst]; in != nil {
			m.m.cordoned(in, w.clock.Now())
		}
	}
	w.ec2.onMove = func(inst, eid string, typ event.ScheduledType, from, to time.Time) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		moves.Add(1)
		m.m.moved(eid, inst, typ, from, to, w.clock.Now())
		m.horizon = maxTime(m.horizon, to)
	}
	w.ec2.onReboot = func(c rebootCall) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.rebooted(c)
	}
	w.onGone = func(id string) {
		m.mu.Lock() // the intake's workers may call at once
		defer m.mu.Unlock()
		if in := m.m.insts[id]; in != nil {
			in.gone = true
		}
	}
	return w, nil
}

func (m *machine) now() time.Time { return m.w.clock.Now() }

// live returns the instances of the cluster now (managed and not), sorted.
func (m *machine) live() []string {
	var ids []string
	for id, in := range m.m.insts {
		// A node kept through a reboot in place still gets reports: a close, a postponement,
		// another maintenance, a Spot warning.
		if !in.gone && (in.drained.IsZero() || in.inPlace) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

func (m *machine) pick(t *rapid.T, label string) string {
	return rapid.SampledFrom(m.live()).Draw(t, label)
}

// sentBody is a message body and when it was sent.
type sentBody struct {
	body string
	at   time.Time
}

// duplicateWithin is how late a duplicate arrives: EventBridge delivers at least once, the
// duplicate close behind the first.
const duplicateWithin = 5 * time.Minute

// effect is what the router learns from one report.
type effect struct {
	before, after func(now time.Time)
}

func (m *machine) send(body string, e effect) {
	m.effects[body] = e
	m.sent = append(m.sent, sentBody{body: body, at: m.now()})
	m.w.queues.send(body)
}

func (m *machine) id() string { m.evSeq++; return fmt.Sprintf("ev-%04d", m.evSeq) }

func envelope(id, source, detailType, instance string, at time.Time, detail any) string {
	d, _ := json.Marshal(detail)
	b, _ := json.Marshal(event.Envelope{Version: "0", ID: id, DetailType: detailType, Source: source, Account: "111122223333",
		Time: at.UTC().Format(time.RFC3339), Region: "eu-west-1", Resources: []string{"arn:aws:ec2:eu-west-1:111122223333:instance/" + instance}, Detail: d})
	return string(b)
}

var healthCodes = map[event.ScheduledType]string{
	event.ScheduledSystemReboot:       "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED",
	event.ScheduledInstanceRetirement: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
	"":                                "AWS_EC2_SOMETHING_NEW_SCHEDULED", // a code the router does not map
}

// Health sends an AWS Health scheduled change (upcoming, or closed) for one instance. A close
// comes as a closed report, or as an open update that marks the instance's entity RESOLVED
// (the event goes on for others): either ends the maintenance for the instance.
func (m *machine) Health(t *rapid.T) {
	inst := m.pick(t, "instance")
	typ := rapid.SampledFrom([]event.ScheduledType{event.ScheduledSystemReboot, event.ScheduledInstanceRetirement, ""}).Draw(t, "type")
	start := m.now().Add(rapid.SampledFrom([]time.Duration{90 * time.Minute, 5 * time.Hour, 30 * time.Hour, 3 * 24 * time.Hour, 9 * 24 * time.Hour}).Draw(t, "start")).Truncate(time.Minute)
	closed := rapid.Bool().Draw(t, "closed")
	resolved := closed && rapid.Bool().Draw(t, "resolved in an open update")
	m.health(t, inst, typ, start, closed, resolved)
}

// health sends AWS Health's report of a maintenance of inst (EC2 holds it too); resolved sends
// a close as an open update whose entity for inst is RESOLVED.
func (m *machine) health(t *rapid.T, inst string, typ event.ScheduledType, start time.Time, closed, resolved bool) {
	status := event.HealthUpcoming
	entity := map[string]string{"entityValue": inst}
	switch {
	case resolved:
		status, entity["status"] = event.HealthOpen, event.EntityResolved
		resolvedUpdates.Add(1)
	case closed:
		status = event.HealthClosed
	}
	arn := m.healthARN(inst, typ, closed)
	effect := reportEffect(m.m, arn, inst, typ, start, closed, m.now())
	if typ != "" {
		// AWS Health and EC2 tell of one maintenance: EC2 holds it too (the router reads it
		// there before it moves it, and its poller finds it there), and a closed Health event
		// carries the start EC2 holds. A code EC2 has no event type for is Health's alone.
		start, effect = m.ec2View(t, arn, inst, typ, start, closed)
	}
	detail := map[string]any{"eventArn": arn, "service": "EC2",
		"eventTypeCode": healthCodes[typ], "eventTypeCategory": "scheduledChange", "statusCode": status,
		"startTime": start.Format(time.RFC1123), "endTime": start.Add(awsWindow).Format(time.RFC1123), "affectedEntities": []map[string]string{entity}}
	body := envelope(m.id(), "aws.health", "AWS Health Event", inst, m.now(), detail)
	m.send(body, effect)
	m.horizon = maxTime(m.horizon, start)
}

// healthARN is one instance's AWS Health event of a code: its generation, and whether a
// close of it was sent.
type healthARN struct {
	gen    int
	closed bool
}

// healthARN returns the ARN of the AWS Health event a report of inst's maintenance of typ is
// an update of: the same event until it is closed; an upcoming report after a close is a new
// event, with a new ARN (a close sent again keeps the ARN it closed).
func (m *machine) healthARN(inst string, typ event.ScheduledType, closed bool) string {
	base := "arn:aws:health:eu-west-1::event/EC2/" + healthCodes[typ] + "/" + inst
	h := m.healthARNs[base]
	if h.closed && !closed {
		h = healthARN{gen: h.gen + 1}
	}
	h.closed = h.closed || closed
	m.healthARNs[base] = h
	if h.gen == 0 {
		return base
	}
	return fmt.Sprintf("%s-%d", base, h.gen)
}

// ec2View sets EC2's event of an instance's maintenance as AWS Health reports it (a new
// start: AWS scheduled or moved it; closed: cancelled at the start EC2 holds), and returns the
// start the Health report carries and its effect on the model: when the router processes it,
// the maintenance is the one EC2 then holds (the router may have moved it meanwhile).
func (m *machine) ec2View(t *rapid.T, arn, inst string, typ event.ScheduledType, start time.Time, closed bool) (time.Time, effect) {
	eid, sent := m.pollID(inst, typ), m.now()
	m.w.ec2.mu.Lock()
	defer m.w.ec2.mu.Unlock()
	if cur, ok := m.w.ec2.current(inst, eid); ok && closed {
		start = cur
	}
	desc := "The instance is scheduled for " + string(typ)
	if closed {
		desc = "[Canceled] " + desc
	}
	m.migrationOf(t, inst, typ)
	evs := filterEvents(m.w.ec2.events[inst], eid)
	m.w.ec2.events[inst] = append(evs, ec2types.InstanceStatusEvent{InstanceEventId: aws.String(eid), Code: ec2types.EventCode(typ), Description: aws.String(desc),
		NotBefore: aws.Time(start), NotAfter: aws.Time(start.Add(2 * time.Hour)), NotBeforeDeadline: aws.Time(start.Add(7 * 24 * time.Hour))})
	// The next poll tells the router of EC2's event too.
	m.polled[eid] = m.pollReport(inst, eid, typ, start, closed)
	at := func(ends bool) func(time.Time) {
		return func(now time.Time) {
			s := start
			m.w.ec2.mu.Lock()
			if cur, ok := m.w.ec2.held(inst, eid); ok && !closed {
				// The maintenance EC2 holds now (the router may have moved it), or held last
				// when it was cancelled, completed or cleared since: a late copy of this
				// report is of that one, not a move back to the start it first carried.
				s = cur
			}
			m.w.ec2.mu.Unlock()
			m.m.reported(arn, inst, typ, s, closed, ends, sent, now)
		}
	}
	if closed {
		return start, effect{after: at(true)}
	}
	return start, effect{before: at(false), after: at(true)}
}

// pollReport is what the next poll tells the router of EC2's event eid: what EC2 holds when it
// polls (the router may have moved the event since it changed).
func (m *machine) pollReport(inst, eid string, typ event.ScheduledType, start time.Time, cancel bool) effect {
	report := func(ends bool) func(time.Time) {
		return func(now time.Time) {
			s := start
			if !cancel && !ends { // a report before the poll: poll holds ec2.mu
				if cur, ok := m.w.ec2.current(inst, eid); ok {
					s = cur
				}
			}
			if !cancel && ends { // after the poll: what EC2 held when it polled
				m.w.ec2.mu.Lock()
				if cur, ok := m.w.ec2.current(inst, eid); ok {
					s = cur
				}
				m.w.ec2.mu.Unlock()
			}
			m.m.reported(eid, inst, typ, s, cancel, ends, now, now) // the poller's finding is of the poll's time
		}
	}
	if cancel {
		return effect{after: report(true)}
	}
	return effect{before: report(false), after: report(true)}
}

// pollID is EC2's instance-event ID of an instance's event of a type: EC2 schedules one at a time.
func (m *machine) pollID(inst string, typ event.ScheduledType) string {
	key := inst + "/" + string(typ)
	eid, ok := m.pollIDs[key]
	if !ok {
		eid = fmt.Sprintf("instance-event-%017d", len(m.pollIDs))
		m.pollIDs[key] = eid
	}
	return eid
}

// Poller makes EC2 report a scheduled event (new, rescheduled or cancelled) for one instance;
// the router learns it at its next poll.
func (m *machine) Poller(t *rapid.T) {
	inst := m.pick(t, "instance")
	typ := rapid.SampledFrom([]event.ScheduledType{event.ScheduledSystemReboot, event.ScheduledInstanceRetirement}).Draw(t, "type")
	start := m.now().Add(rapid.SampledFrom([]time.Duration{90 * time.Minute, 5 * time.Hour, 30 * time.Hour, 3 * 24 * time.Hour}).Draw(t, "start")).Truncate(time.Minute)
	cancel := rapid.Bool().Draw(t, "canceled")
	eid := m.pollID(inst, typ)
	desc := "The instance is scheduled for " + string(typ)
	if cancel {
		desc = "[Canceled] " + desc
	}
	deadline := rapid.SampledFrom([]time.Duration{0, 4 * 24 * time.Hour}).Draw(t, "deadline")
	m.w.ec2.mu.Lock()
	if cur, ok := m.w.ec2.current(inst, eid); ok && cancel {
		start = cur // EC2 cancels the event it holds
	}
	m.migrationOf(t, inst, typ)
	evs := m.w.ec2.events[inst]
	evs = append(evs[:0:0], filterEvents(evs, eid)...)
	ev := ec2types.InstanceStatusEvent{InstanceEventId: aws.String(eid), Code: ec2types.EventCode(typ), Description: aws.String(desc),
		NotBefore: aws.Time(start), NotAfter: aws.Time(start.Add(2 * time.Hour))}
	if deadline > 0 {
		ev.NotBeforeDeadline = aws.Time(start.Add(deadline))
	}
	m.w.ec2.events[inst] = append(evs, ev)
	m.w.ec2.mu.Unlock()
	m.polled[eid] = m.pollReport(inst, eid, typ, start, cancel)
	m.horizon = maxTime(m.horizon, start)
}

func reportEffect(md *model, key, inst string, typ event.ScheduledType, start time.Time, closed bool, sent time.Time) effect {
	f := func(ends bool) func(time.Time) {
		return func(now time.Time) { md.reported(key, inst, typ, start, closed, ends, sent, now) }
	}
	if closed {
		return effect{after: f(true)}
	}
	return effect{before: f(false), after: f(true)}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func filterEvents(evs []ec2types.InstanceStatusEvent, drop string) []ec2types.InstanceStatusEvent {
	var out []ec2types.InstanceStatusEvent
	for _, e := range evs {
		if aws.ToString(e.InstanceEventId) != drop {
			out = append(out, e)
		}
	}
	return out
}

// StopStart sends an instance's stop and its start again, in either order (a standard queue
// and retries reorder them).
func (m *machine) StopStart(t *rapid.T) {
	inst := m.pick(t, "instance")
	stopAt, runAt := m.now().Add(-3*time.Minute), m.now().Add(-time.Minute)
	state := func(st event.InstanceState, at time.Time) string {
		return envelope(m.id(), "aws.ec2", "EC2 Instance State-change Notification", inst, at, map[string]string{"instance-id": inst, "state": string(st)})
	}
	stop := state(event.StateStopped, stopAt)
	run := state(event.StateRunning, runAt)
	effect := func(st event.InstanceState, at time.Time) effect {
		f := func(time.Time) {
			in := m.m.insts[inst]
			in.changes = append(in.changes, stateChange{at: at, state: st})
		}
		if st == event.StateRunning {
			return effect{after: f}
		}
		return effect{before: f}
	}
	withRun := rapid.Bool().Draw(t, "runs again")
	// EC2 shows what happened by now, whatever order the messages come in: a stop/start runs
	// (the stop, read after it, is over), a stop alone is stopped.
	m.w.ec2.mu.Lock()
	if m.w.ec2.stopped == nil {
		m.w.ec2.stopped = map[string]bool{}
	}
	m.w.ec2.stopped[inst] = !withRun
	m.w.ec2.mu.Unlock()
	if rapid.Bool().Draw(t, "running first") && withRun {
		m.send(run, effect(event.StateRunning, runAt))
		m.send(stop, effect(event.StateStopped, stopAt))
		return
	}
	m.send(stop, effect(event.StateStopped, stopAt))
	if withRun {
		m.send(run, effect(event.StateRunning, runAt))
	}
}

// Spot sends a Spot interruption warning.
func (m *machine) Spot(t *rapid.T) {
	inst := m.pick(t, "instance")
	body := envelope(m.id(), "aws.ec2", "EC2 Spot Instance Interruption Warning", inst, m.now(), map[string]string{"instance-id": inst, "instance-action": "terminate"})
	m.send(body, effect{before: func(time.Time) { m.m.insts[inst].urgent = true }})
}

// Forged sends a shutting-down state change for a running instance, as a sender who may
// write to the queue would: EC2 shows it running, so the router takes it as the pool takes a
// stop (web's drain, kafka's after its restart-grace and paced, never batch's), not as an
// urgent drain past pacing.
func (m *machine) Forged(t *rapid.T) {
	inst := m.pick(t, "instance")
	at := m.now()
	body := envelope(m.id(), "aws.ec2", "EC2 Instance State-change Notification", inst, at, map[string]string{"instance-id": inst, "state": string(event.StateShuttingDown)})
	m.send(body, effect{before: func(time.Time) {
		in := m.m.insts[inst]
		in.changes = append(in.changes, stateChange{at: at, state: event.StateStopping})
	}})
}

// ForgedWrite writes, as anyone with `patch nodeclaims` can, the keys routers before the
// store kept their memory in onto a live NodeClaim: a deferral due now of a Spot warning for
// its own instance, a drain stamp, and a reboot in place of its own instance at its reboot;
// and, as anyone with `patch nodes` can, an unfinished drain (healthrouter.io/node-drain) onto
// that NodeClaim's Node and onto the managed node group's node, and a reboot in place's mark
// (healthrouter.io/in-place) onto the NodeClaim's Node. The router reads none of
// them: nothing is owed, and the model fails any drain, reboot, delete, cordon or eviction
// that follows from them.
func (m *machine) ForgedWrite(t *rapid.T) {
	inst := m.pick(t, "instance")
	var claims karpv1.NodeClaimList
	if err := m.w.store.List(m.ctx, &claims); err != nil {
		t.Fatal(err)
	}
	for i := range claims.Items {
		nc := &claims.Items[i]
		if cluster.InstanceID(nc.Status.ProviderID) != inst || !nc.DeletionTimestamp.IsZero() {
			continue
		}
		at := m.now()
		body := envelope(m.id(), "aws.ec2", "EC2 Spot Instance Interruption Warning", inst, at, map[string]string{"instance-id": inst, "instance-action": "terminate"})
		recs := []record.Record{{EventID: "forged-" + inst, Key: "forged-" + inst, Kind: event.KindSpotInterruption, Until: at, Reason: "forged", State: record.StateDeferred, Event: json.RawMessage(body)}}
		v, err := record.Encode(record.Set{Records: recs})
		if err != nil {
			t.Fatal(err)
		}
		// A reboot in place of its own instance and Node, at the step that reboots it.
		run := fmt.Sprintf(`{"version":1,"event_id":"forged-%s","type":"instance-reboot","instance":%q,"node":%q,"start":%q,"step":"reboot","began":%q,"step_since":%q}`,
			inst, inst, nc.Status.NodeName, at.Add(time.Hour).Format(time.RFC3339), at.Format(time.RFC3339), at.Format(time.RFC3339))
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q,%q:%q,%q:%q}}}`, record.Annotation, v, record.AnnotationDrainSignalled,
			record.DrainStamp("forged-"+inst, at.Add(-time.Hour), "forward"), record.AnnotationRun, run)
		if err := m.w.store.Patch(m.ctx, nc, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
		// An unfinished drain, as a router before the store wrote it, that says it cordoned.
		drain := fmt.Sprintf(`{"event_id":"forged-%s","kind":"spot-interruption","started":%q,"cordoned":true}`, inst, at.Format(time.RFC3339))
		for _, name := range []string{nc.Status.NodeName, UnmanagedNode} {
			if name == "" {
				continue
			}
			patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, nodedrain.AnnotationNodeDrain, drain)
			if name == nc.Status.NodeName {
				// And a reboot in place's mark saying the run cordoned and vetoed the Node: never
				// read (what a run undoes is in its HealthRecord).
				mark := fmt.Sprintf(`{"event_id":"forged-%s","cordoned":true,"protected":true,"repair_vetoed":true}`, inst)
				patch = fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q,%q:%q}}}`, nodedrain.AnnotationNodeDrain, drain, inplace.Annotation, mark)
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if err := m.w.store.Patch(m.ctx, n, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
		}
		// The shadow ledger's ConfigMap of routers before the store, as anyone with update on
		// ConfigMaps of the router's namespace writes it: a would-be outcome the router never
		// decided. A router adopts it once into its report, marked unverified, never as its own.
		forged, err := json.Marshal(map[string]any{"version": shadow.Version, "entries": []shadow.Entry{{NodePool: PoolShadow, NodeClaim: nc.Name,
			Instance: inst, Kind: event.KindScheduledChange, EventID: "forged-" + inst, Decided: at, Would: policy.ActionDrain, WouldAt: at, Reason: "forged"}}})
		if err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "health-router", Name: shadow.DefaultLedgerName}, Data: map[string]string{shadow.LedgerKey: string(forged)}}
		if err := m.w.store.Create(m.ctx, cm); apierrors.IsAlreadyExists(err) {
			err = m.w.store.Update(m.ctx, cm)
		} else if err != nil {
			t.Fatal(err)
		}
		forgedWrites.Add(1)
		return
	}
}

// ShadowMode takes the pool in shadow out of shadow (an active policy of its own) or puts it
// back, as its owner trying a policy does: what the router holds for it carries over both ways
// (a deferral of the active time comes due in shadow and is carried out as Karpenter would; a
// close in shadow ends it, and it is not drained once active again).
func (m *machine) ShadowMode(t *rapid.T) {
	active := rapid.Bool().Draw(t, "active")
	ann := PoolAnnotations[PoolShadow]
	if active {
		ann = PoolShadowActive
	}
	np := &karpv1.NodePool{}
	if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: PoolShadow}, np); err != nil {
		t.Fatal(err)
	}
	if m.m.shadowActive != active {
		modeSwitches.Add(1)
	}
	np.Annotations = maps.Clone(ann)
	if err := m.w.store.Update(m.ctx, np); err != nil {
		t.Fatal(err)
	}
	m.m.shadowActive = active
}

// Storm sends Spot warnings for every live node of one pool at once, as a Spot capacity
// pool's reclaim does (or a sender forging them): web's urgent-drain breaker holds what is
// over its limit.
func (m *machine) Storm(t *rapid.T) {
	pool := rapid.SampledFrom([]string{PoolWeb, PoolKafka}).Draw(t, "pool")
	for _, inst := range m.live() {
		if m.m.insts[inst].pool != pool {
			continue
		}
		body := envelope(m.id(), "aws.ec2", "EC2 Spot Instance Interruption Warning", inst, m.now(), map[string]string{"instance-id": inst, "instance-action": "terminate"})
		m.send(body, effect{before: func(time.Time) { m.m.insts[inst].urgent = true }})
	}
}

// Impair makes an instance's system status impaired, or recovers one; the router learns it
// at its polls (poll).
func (m *machine) Impair(t *rapid.T) {
	inst := m.pick(t, "instance")
	m.w.ec2.mu.Lock()
	defer m.w.ec2.mu.Unlock()
	if _, ok := m.w.ec2.impaired[inst]; ok {
		delete(m.w.ec2.impaired, inst)
		return
	}
	m.w.ec2.impaired[inst] = m.now()
}

// Duplicate sends a message again (EventBridge delivers at least once).
func (m *machine) Duplicate(t *rapid.T) {
	var recent []string
	for _, s := range m.sent {
		if m.now().Sub(s.at) <= duplicateWithin {
			recent = append(recent, s.body)
		}
	}
	if len(recent) == 0 {
		t.Skip("nothing sent in the last minutes")
	}
	m.w.queues.send(rapid.SampledFrom(recent).Draw(t, "body"))
}

// Deliver lets the leader's intake take up to n messages.
func (m *machine) Deliver(t *rapid.T) {
	m.deliver(t, rapid.IntRange(1, 5).Draw(t, "n"))
}

// lag lets the router's cache catch up with its own writes, or not: a drawn moment (the
// informer's lag is milliseconds, and a decision is as quick).
func (m *machine) lag(t *rapid.T, label string) {
	if rapid.IntRange(0, 2).Draw(t, label) > 0 || m.w.cache.overdue(m.now()) {
		m.w.cache.sync()
	}
}

func (m *machine) deliver(t *rapid.T, n int) {
	out, err := m.w.queues.ReceiveMessage(m.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: int32(n), VisibilityTimeout: 30})
	if err != nil {
		return
	}
	// Which replica's intake takes each message: the leader's, or, while an old leader has
	// not noticed it lost the lease, either.
	intakes := make([]*replica, len(out.Messages))
	for i := range out.Messages {
		intakes[i] = m.w.leader
		if m.w.zombie != nil && rapid.Bool().Draw(t, "the old leader takes it") {
			intakes[i] = m.w.zombie
		}
	}
	if len(out.Messages) > 1 && rapid.IntRange(0, 2).Draw(t, "workers at once") == 0 {
		// The intake's workers decide the messages of one batch at once: every cause is known
		// from the start, every ending once all are done with.
		m.m.batches++
		m.m.batch = m.m.batches
		defer func() { m.m.batch = 0 }()
		for _, msg := range out.Messages {
			if e := m.effects[aws.ToString(msg.Body)]; e.before != nil {
				e.before(m.now())
			}
		}
		var wg sync.WaitGroup
		for i, msg := range out.Messages {
			wg.Go(func() { intakes[i].intake.Process(m.ctx, msg) })
		}
		wg.Wait()
		concurrentBatches.Add(1)
		for _, msg := range out.Messages {
			if e := m.effects[aws.ToString(msg.Body)]; m.w.queues.find(msg.ReceiptHandle) == nil && e.after != nil {
				e.after(m.now())
			}
		}
		return
	}
	for i, msg := range out.Messages {
		if i > 0 {
			m.lag(t, "cache between messages")
		}
		e := m.effects[aws.ToString(msg.Body)]
		if e.before != nil {
			e.before(m.now())
		}
		intakes[i].intake.Process(m.ctx, msg)
		if m.w.queues.find(msg.ReceiptHandle) == nil && e.after != nil { // deleted or dead-lettered: done with
			e.after(m.now())
		}
	}
}

// Poll runs the leader's instance-status poller once.
func (m *machine) Poll(*rapid.T) { m.poll() }

func (m *machine) poll() {
	now := m.now()
	ids := make([]string, 0, len(m.polled))
	for id := range m.polled {
		ids = append(ids, id)
	}
	sort.Strings(ids) // one seed, one sequence
	m.w.ec2.mu.Lock()
	for _, id := range ids {
		if e := m.polled[id]; e.before != nil {
			e.before(now)
		}
	}
	impaired := map[string]bool{}
	for id, since := range m.w.ec2.impaired {
		impaired[id] = true
		if in := m.m.insts[id]; in != nil && !now.Before(since.Add(impairedAfter)) {
			in.impairedSeen = true // a cause from this poll on
		}
	}
	m.w.ec2.mu.Unlock()
	if err := m.w.leader.poller.Poll(m.ctx); err != nil {
		return // handed again at the next poll
	}
	for _, id := range ids {
		if e := m.polled[id]; e.after != nil {
			e.after(now)
		}
	}
	clear(m.polled)
	for _, in := range m.m.insts {
		if !impaired[in.id] {
			in.impairedSeen = false // recovered, as this poll told the router
		}
	}
}

// Faults makes the API server fail (an outage, or conflicting writes), and sometimes SQS once
// it has handed the batch out, while the leader takes one batch of messages.
func (m *machine) Faults(t *rapid.T) {
	outage := rapid.Bool().Draw(t, "outage")
	m.w.faults.mu.Lock()
	m.w.faults.apiDown = outage
	m.w.faults.conflict = rapid.IntRange(0, 3).Draw(t, "conflicts")
	m.w.faults.mu.Unlock()
	sqsFails := rapid.IntRange(0, 2).Draw(t, "SQS fails after the receive") == 0
	m.w.queues.mu.Lock()
	m.w.queues.failAfterReceive = sqsFails
	m.w.queues.mu.Unlock()
	m.deliver(t, 3)
	m.w.faults.mu.Lock()
	m.w.faults.apiDown, m.w.faults.conflict = false, 0
	m.w.faults.mu.Unlock()
	m.w.queues.mu.Lock()
	if m.w.queues.down {
		sqsFailures.Add(1)
	}
	m.w.queues.failAfterReceive, m.w.queues.down = false, false
	m.w.queues.mu.Unlock()
}

// Karpenter acts on forwards (or drops them: the router's fallback must then delete) and
// replaces what is deleted.
func (m *machine) Karpenter(t *rapid.T) {
	if err := m.w.karpenter(m.ctx, rapid.IntRange(0, 9).Draw(t, "drop") == 0); err != nil {
		t.Fatal(err)
	}
}

// Advance moves time on with the router running: at every tick the leader takes its
// messages, polls, reconciles its deferrals, and Karpenter acts.
func (m *machine) Advance(t *rapid.T) {
	d := rapid.SampledFrom([]time.Duration{time.Minute, tick, time.Hour, 6 * time.Hour, 24 * time.Hour}).Draw(t, "for")
	m.advance(t, d)
}

func (m *machine) advance(t *rapid.T, d time.Duration) {
	for end := m.now().Add(d); m.now().Before(end); {
		step := min(tick, end.Sub(m.now()))
		m.w.clock.Step(step)
		m.lag(t, "cache at the tick")
		m.deliver(t, 10)
		m.lag(t, "cache before the poll")
		m.poll()
		m.lag(t, "cache before the controllers")
		if err := m.w.reconcile(m.ctx); err != nil {
			t.Fatal(err)
		}
		m.awsActs(t)
		if err := m.w.karpenter(m.ctx, false); err != nil {
			t.Fatal(err)
		}
		m.lag(t, "cache after Karpenter")
		m.deliver(t, 10)
		m.m.lost(m.now())
		// The marks catch up at the next pass of their controller: no mark outlives its outcome
		// by more than that, none appears without one.
		if err := m.w.reconcileMarks(m.ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.w.checkMarks(m.ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.w.checkInPlace(m.ctx); err != nil {
			t.Fatal(err)
		}
		m.checkUnmanaged(t)
		m.checkMigrated(t)
		m.inPlaceOver()
		m.w.endOverlap()          // a lease period is shorter than a tick
		m.w.summarise(m.w.leader) // the summary loop runs every 30s; a tick is longer
		if err := m.w.checkEvents(); err != nil {
			t.Fatal(err)
		}
	}
}

// awsWindow is how long after its start AWS may carry a scheduled event out.
const awsWindow = awsWindowModel

// checkUnmanaged: the managed node group's node is cordoned only while something the router
// was told justifies it: a close, or the end of AWS's reboot, gives it back (no cordon left
// behind).
func (m *machine) checkUnmanaged(t *rapid.T) {
	var n corev1.Node
	if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: UnmanagedNode}, &n); err != nil {
		t.Fatal(err)
	}
	mem, err := record.Load(m.ctx, m.w.store, record.NodeRecordName(UnmanagedNode))
	if err != nil {
		t.Fatal(err)
	}
	holds := m.m.holdsCordon(m.m.insts[UnmanagedInstance], m.now())
	if n.Spec.Unschedulable && !holds {
		t.Fatalf("%s: unmanaged node %s left cordoned with nothing to drain it for (record %s)", m.now().Format(time.RFC3339), n.Name, mem.NodeDrain)
	}
	// A drain unfinished in the store is one the next pass evicts the pods of.
	if rec, ok, _ := nodedrain.Of(mem); ok && !rec.Finished() && !rec.Closed && !rec.Running && !holds {
		t.Fatalf("%s: unmanaged node %s has a drain in progress with nothing to drain it for (record %s)", m.now().Format(time.RFC3339), n.Name, mem.NodeDrain)
	}
	// The router drains a managed node through Karpenter, never itself: no Node of a live
	// NodeClaim has a drain of the router's own (a forged healthrouter.io/node-drain on it
	// is not one).
	var claims karpv1.NodeClaimList
	if err := m.w.store.List(m.ctx, &claims); err != nil {
		t.Fatal(err)
	}
	for i := range claims.Items {
		nc := &claims.Items[i]
		if nc.Status.NodeName == "" || !nc.DeletionTimestamp.IsZero() {
			continue
		}
		mem, err := record.Load(m.ctx, m.w.store, record.NodeRecordName(nc.Status.NodeName))
		if err != nil {
			t.Fatal(err)
		}
		if rec, ok, _ := nodedrain.Of(mem); ok && !rec.Finished() {
			t.Fatalf("%s: node %s of nodeclaim %s has a drain of the router's own (record %s)", m.now().Format(time.RFC3339), nc.Status.NodeName, nc.Name, mem.NodeDrain)
		}
	}
}

// awsActs lets AWS carry out the system reboots of the kafka nodes and the unmanaged node whose
// time has come, each at a moment drawn within its window (sometimes with no trace on the
// Node), and checks each against the model: a maintenance the router was told of in time finds
// its node out of service (cordoned; a kafka node's reboot in place in progress), never
// serving pods.
func (m *machine) awsActs(t *rapid.T) {
	acts, err := m.w.awsActs(m.ctx, func(inst, eid string) awsReboot {
		key := inst + "/" + eid
		p, ok := m.plans[key]
		if !ok {
			p = awsReboot{after: time.Duration(rapid.IntRange(0, int(awsWindow/tick)-1).Draw(t, "AWS reboots after")) * tick,
				visible: rapid.IntRange(0, 4).Draw(t, "AWS's reboot shows") > 0}
			m.plans[key] = p
		}
		return p
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acts {
		delete(m.plans, a.instance+"/"+a.eventID)
		if a.outOfService && a.instance == UnmanagedInstance {
			awsUnmanaged.Add(1)
			continue
		}
		if mt := m.m.maintenanceAt(a.instance, event.ScheduledSystemReboot, a.start); a.instance == UnmanagedInstance && mt != nil && m.m.cordonDrainWasOff(mt.known, a.start) {
			continue // a leader without cordon-drain begins no drain of it: not owed
		}
		if a.outOfService {
			awsOutOfService.Add(1)
			continue
		}
		if mt := m.m.maintenanceAt(a.instance, event.ScheduledSystemReboot, a.start); mt != nil && mt.state != stateCancelled && mt.state != stateSuperseded && mt.state != stateTied &&
			!mt.known.After(a.start.Add(-drainLead-2*tick)) {
			t.Fatalf("%s: AWS rebooted %s for its system reboot at %s, known since %s, with the node in service (%s)",
				m.now().Format(time.RFC3339), a.instance, a.start.Format(time.RFC3339), mt.known.Format(time.RFC3339), a.why)
		}
	}
}

// rebooted checks a reboot the router asked EC2 for (RebootInstances): only for a maintenance
// EC2 shows (open, of a type AWS reboots for), only of a node out of service (cordoned, its
// reboot in place in progress), and once per maintenance. A reboot migration that cleared the
// event gives the node back (checkMigrated).
func (m *machine) rebooted(c rebootCall) {
	now := m.now().Format(time.RFC3339)
	if len(c.open) == 0 {
		m.m.fail("%s: the router rebooted %s with no maintenance EC2 shows for it", now, c.instance)
	}
	for _, ev := range c.open {
		key := c.instance + "/" + aws.ToString(ev.InstanceEventId) + "/" + aws.ToTime(ev.NotBefore).Format(time.RFC3339)
		if m.reboots[key] {
			m.m.fail("%s: the router rebooted %s a second time for its %s at %s", now, c.instance, ev.Code, aws.ToTime(ev.NotBefore).Format(time.RFC3339))
		}
		m.reboots[key] = true
	}
	claims, err := cluster.InstanceClaims(m.ctx, m.w.store, c.instance)
	if err != nil || len(claims) == 0 {
		m.m.fail("%s: the router rebooted %s, which has no NodeClaim (%v)", now, c.instance, err)
		return
	}
	var n corev1.Node
	if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: claims[0].Status.NodeName}, &n); err != nil {
		m.m.fail("%s: the router rebooted %s, whose Node cannot be read: %v", now, c.instance, err)
		return
	}
	mem, _ := record.Load(m.ctx, m.w.store, claims[0].Name)
	if !n.Spec.Unschedulable || !inplace.Active(mem) {
		m.m.fail("%s: the router rebooted %s with its node in service (cordoned %v, run %s)", now, c.instance, n.Spec.Unschedulable, mem.Run)
	}
	if c.migrated != "" {
		migrations.Add(1)
		m.migrated[c.instance] = m.now()
		// EC2 gives the instance's next system-reboot an ID of its own.
		delete(m.pollIDs, c.instance+"/"+string(event.ScheduledSystemReboot))
	}
}

// migrationBack is how soon a node whose reboot migration cleared its maintenance is back in
// service: the Node's reboot, EC2's word that the event is gone, the uncordon,
// each a pass of the run (a tick here), and a failover between them.
const migrationBack = time.Hour

// checkMigrated: a node whose reboot migration cleared its system-reboot is back in service
// within migrationBack of the migration, unless EC2 shows it another reboot-type maintenance
// since, or the node is being replaced.
func (m *machine) checkMigrated(t *rapid.T) {
	insts := make([]string, 0, len(m.migrated))
	for inst := range m.migrated {
		insts = append(insts, inst)
	}
	sort.Strings(insts)
	for _, inst := range insts {
		m.w.ec2.mu.Lock()
		again := false
		for _, ev := range m.w.ec2.events[inst] {
			again = again || (!strings.HasPrefix(aws.ToString(ev.Description), "[") && policy.RebootsInPlace(event.ScheduledType(ev.Code)))
		}
		m.w.ec2.mu.Unlock()
		claims, err := cluster.InstanceClaims(m.ctx, m.w.store, inst)
		if err != nil {
			t.Fatal(err)
		}
		if again || len(claims) == 0 || !claims[0].DeletionTimestamp.IsZero() {
			delete(m.migrated, inst)
			continue
		}
		var n corev1.Node
		if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: claims[0].Status.NodeName}, &n); err != nil {
			delete(m.migrated, inst)
			continue
		}
		if !n.Spec.Unschedulable && n.Annotations[karpv1.DoNotDisruptAnnotationKey] == "" {
			delete(m.migrated, inst)
			continue
		}
		if at := m.migrated[inst]; m.now().After(at.Add(migrationBack)) {
			t.Fatalf("%s: %s's reboot migration cleared its system-reboot at %s, and its node is still out of service (run %s)",
				m.now().Format(time.RFC3339), inst, at.Format(time.RFC3339), m.runOf(claims[0].Name))
		}
	}
}

// Migration is the owner of a kafka instance setting its reboot migration
// (ModifyInstanceMaintenanceOptions: "default", "disabled", or an instance type without it), at
// any time, a reboot in place of it in progress or not; with it is drawn how EC2's migration
// of the instance goes.
func (m *machine) Migration(t *rapid.T) {
	var kafka []string
	for _, id := range m.live() {
		if m.m.insts[id].pool == PoolKafka {
			kafka = append(kafka, id)
		}
	}
	if len(kafka) == 0 {
		t.Skip("no kafka instance")
	}
	inst := rapid.SampledFrom(kafka).Draw(t, "instance")
	m.w.ec2.mu.Lock()
	m.w.ec2.migration[inst] = drawMigration(t)
	m.w.ec2.mu.Unlock()
}

func drawMigration(t *rapid.T) migrationOpt {
	return migrationOpt{state: rapid.SampledFrom([]ec2types.InstanceRebootMigrationState{ec2types.InstanceRebootMigrationStateDefault,
		ec2types.InstanceRebootMigrationStateDefault, ec2types.InstanceRebootMigrationStateDefault, ec2types.InstanceRebootMigrationStateDisabled, ""}).Draw(t, "rebootMigration"),
		fails: rapid.IntRange(0, 3).Draw(t, "migration not possible") == 0, completed: rapid.Bool().Draw(t, "cleared shows [Completed]")}
}

// migrationOf draws a kafka instance's reboot-migration setting when EC2 first schedules it a
// system-reboot (ec2.mu held): before the run the event begins asks for it.
func (m *machine) migrationOf(t *rapid.T, inst string, typ event.ScheduledType) {
	if _, ok := m.w.ec2.migration[inst]; ok || typ != event.ScheduledSystemReboot || m.m.insts[inst].pool != PoolKafka {
		return
	}
	m.w.ec2.migration[inst] = drawMigration(t)
}

// inPlaceOver tells the model of the reboots in place that ended with the node kept.
func (m *machine) inPlaceOver() {
	var claims karpv1.NodeClaimList
	if err := m.w.store.List(m.ctx, &claims); err != nil {
		return
	}
	for i := range claims.Items {
		nc := &claims.Items[i]
		in := m.m.insts[cluster.InstanceID(nc.Status.ProviderID)]
		if in != nil && in.inPlace && nc.DeletionTimestamp.IsZero() && !inplace.Active(m.memOf(nc.Name)) {
			m.m.inPlaceOver(in)
		}
	}
}

// Crash restarts the leader with empty memory, sometimes without
// --unmanaged-nodes=cordon-drain (a feature turned off at a restart), or with it on again.
func (m *machine) Crash(t *rapid.T) {
	m.w.cordonDrainOff = rapid.IntRange(0, 3).Draw(t, "restarted without cordon-drain") == 0
	if m.w.cordonDrainOff {
		cordonDrainOffRestarts.Add(1)
	}
	m.w.crash()
	m.newLeadership()
}

// newLeadership tells the model a leadership began.
func (m *machine) newLeadership() {
	m.m.life++
	m.m.leaderships = append(m.m.leaderships, m.now())
	m.m.cordonDrain(m.now(), m.w.leader.cordonDrainOff)
}

// Failover hands the lease to the standby that has been running all along; sometimes the
// old leader keeps acting beside it for the rest of the tick (it has not noticed yet).
func (m *machine) Failover(t *rapid.T) {
	overlap := rapid.Bool().Draw(t, "the old leader overlaps")
	m.w.failover(overlap)
	if overlap {
		overlaps.Add(1)
	}
	m.newLeadership()
}

// Check runs after every action: the model's verdicts, and what the cluster shows.
func (m *machine) Check(t *rapid.T) {
	if len(m.m.errs) > 0 {
		t.Fatalf("%s", strings.Join(m.m.errs, "\n"))
	}
	// The standby's memory and goroutines stay bounded: it queues no release. An old leader
	// that has not noticed its lost lease yet still holds what it held as leader; it is
	// started again as a fresh standby when the overlap ends.
	if released, queued := m.w.standby.ctrl.Pending(); m.w.standby != m.w.zombie && (released != 0 || queued != 0) {
		t.Fatalf("standby holds %d releases and %d queued wakes", released, queued)
	}
	if n := runtime.NumGoroutine(); n > m.goBase+200 {
		t.Fatalf("%d goroutines (started with %d)", n, m.goBase)
	}
	// Receives are bounded: a message past --max-receives is dead-lettered, not retried.
	m.w.queues.mu.Lock()
	for _, msg := range m.w.queues.intake {
		if msg.receives > maxReceives {
			m.w.queues.mu.Unlock()
			t.Fatalf("message %s received %d times (max %d)", msg.id, msg.receives, maxReceives)
		}
	}
	for _, msg := range m.w.queues.dlq {
		if aws.ToString(msg.attributes["healthrouter.reason"].StringValue) == "" {
			m.w.queues.mu.Unlock()
			t.Fatalf("dead-lettered without a reason: %s", msg.body)
		}
	}
	m.w.queues.mu.Unlock()
	m.checkRecords(t)
	m.checkShadow(t)
	m.checkLedger(t)
	m.checkWindows(t, false)
}

// checkWindows: the EC2 event windows tagged with the cluster are kafka's only (the pool that
// asks; the pool in shadow, which asks too, never gets one), each targeting kafka's instance tag
// and no other; settled (after a healthy pass) there is exactly one, and every live kafka instance
// carries the tag.
func (m *machine) checkWindows(t *rapid.T, settled bool) {
	kafka := 0
	for _, win := range m.w.windows.Windows() {
		if win.Tags[eventwindow.TagCluster] != simCluster {
			continue
		}
		pool := win.Tags[eventwindow.TagNodePool]
		if pool != PoolKafka {
			t.Fatalf("EC2 event window %s (%s) for pool %s, which does not ask for one (or is in shadow)", win.ID, win.Name, pool)
		}
		kafka++
		want := eventwindow.TagInstance + "=" + eventwindow.TagValue(simCluster, PoolKafka)
		for _, tg := range win.TargetTags {
			if tg != want {
				t.Fatalf("EC2 event window %s targets %s, want %s only", win.ID, tg, want)
			}
		}
		if settled && (len(win.TargetTags) != 1 || len(win.Ranges) == 0) {
			t.Fatalf("settled: kafka's EC2 event window %s targets %v with %d ranges", win.ID, win.TargetTags, len(win.Ranges))
		}
	}
	if kafka > 0 {
		windowsKept.Store(true)
	}
	if !settled {
		return
	}
	if kafka != 1 {
		t.Fatalf("settled: %d EC2 event windows for kafka, want 1", kafka)
	}
	for id, in := range m.m.insts {
		if in.pool != PoolKafka || in.gone {
			continue
		}
		if v := m.w.windows.InstanceTags(id)[eventwindow.TagInstance]; v != eventwindow.TagValue(simCluster, PoolKafka) {
			t.Fatalf("settled: kafka instance %s carries %s=%q", id, eventwindow.TagInstance, v)
		}
	}
	for id, in := range m.m.insts {
		if in.pool == PoolShadow && m.w.windows.InstanceTags(id)[eventwindow.TagInstance] != "" {
			t.Fatalf("instance %s of the pool in shadow was tagged for an event window", id)
		}
	}
}

// checkShadow: what the router carries out for the pool in shadow is Karpenter's behaviour, in
// either mode it is in now or was: its memory never holds a reboot in place, and a deferral
// only by a gate or, while active, its window (whatever anyone wrote on the NodeClaims
// themselves: ForgedWrite); its Nodes are never cordoned, tainted or rebooted in place (the
// model judges its drains, and fails any move at EC2). Its would-be outcomes are counted.
func (m *machine) checkShadow(t *rapid.T) {
	var claims karpv1.NodeClaimList
	if err := m.w.store.List(m.ctx, &claims); err != nil {
		t.Fatal(err)
	}
	for _, nc := range claims.Items {
		if nc.Labels[karpv1.NodePoolLabelKey] != PoolShadow {
			continue
		}
		mem, err := record.Load(m.ctx, m.w.store, nc.Name)
		if err != nil || inplace.Active(mem) {
			t.Fatalf("nodeclaim %s of the pool in shadow has a reboot in place: %+v (%v)", nc.Name, mem, err)
		}
		for _, r := range mem.Set().Active() {
			switch r.Hold {
			case policy.HoldPDB, policy.HoldAlerts, policy.HoldUrgentBreaker, policy.HoldRepairCutoff, policy.HoldWindow, policy.HoldDeadline, policy.HoldRestartGrace:
			default:
				t.Fatalf("nodeclaim %s of the pool in shadow holds %s by %q", nc.Name, r.EventID, r.Hold)
			}
		}
		if outs, err := shadow.Read(m.memOf(nc.Name)); err != nil {
			t.Fatalf("nodeclaim %s: %v", nc.Name, err)
		} else {
			shadowOutcomes.Add(int64(len(outs) - m.shadowSeen[nc.Name]))
			m.shadowSeen[nc.Name] = len(outs)
		}
		var n corev1.Node
		if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: nc.Status.NodeName}, &n); err != nil {
			continue
		}
		mark := n.Annotations[inplace.Annotation]
		if n.Spec.Unschedulable || upcoming.Current(&n).Taint != "" || (mark != "" && !strings.Contains(mark, `"forged-`)) {
			t.Fatalf("node %s of the pool in shadow is cordoned, tainted or rebooted in place: %v %v", n.Name, n.Spec.Unschedulable, n.Annotations)
		}
	}
}

// checkLedger: the shadow ledger is the router's own HealthRecord, with no owner (it outlives
// the NodeClaims it names) and readable; an outcome the router never decided (ForgedWrite's, in
// the ConfigMap of routers before the store) is in it only marked unverified, never as the
// router's own; and no NodeClaim's record is taken for it.
func (m *machine) checkLedger(t *rapid.T) {
	hr := &record.HealthRecord{}
	err := m.w.store.Get(m.ctx, client.ObjectKey{Name: record.LedgerRecordName(shadow.DefaultLedgerName)}, hr)
	if apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	if !hr.OfLedger() || hr.OfClaim() || len(hr.OwnerReferences) > 0 {
		t.Fatalf("the ledger's record %s: ledger %t, a NodeClaim's %t, owners %v", hr.Name, hr.OfLedger(), hr.OfClaim(), hr.OwnerReferences)
	}
	entries, err := shadow.ReadLedger(m.ctx, m.w.store, "health-router", shadow.DefaultLedgerName)
	if err != nil {
		t.Fatalf("the ledger does not read: %v", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.EventID, "forged-") != e.Adopted {
			t.Fatalf("ledger entry %s of %s: adopted %t (a forged entry must be marked, and only it)", e.EventID, e.NodeClaim, e.Adopted)
		}
		ledgerEntriesChecked.Add(1)
	}
}

// checkRecords: a cancelled or superseded maintenance leaves no active record, whichever
// source saw it first; a record is never one the router cannot read.
func (m *machine) checkRecords(t *rapid.T) {
	var claims karpv1.NodeClaimList
	if err := m.w.store.List(m.ctx, &claims); err != nil {
		t.Fatal(err)
	}
	for _, nc := range claims.Items {
		mem, err := record.Load(m.ctx, m.w.store, nc.Name)
		if err != nil {
			t.Fatalf("nodeclaim %s: %v", nc.Name, err)
		}
		set := mem.Set()
		inst := cluster.InstanceID(nc.Status.ProviderID)
		for _, r := range set.Active() {
			if r.Kind != event.KindScheduledChange || !nc.DeletionTimestamp.IsZero() {
				continue
			}
			if !m.activeMaintenance(inst, r.Match) {
				t.Fatalf("nodeclaim %s (%s) holds an active record %s (%s) of a maintenance that is cancelled or superseded", nc.Name, inst, r.EventID, r.Match)
			}
		}
	}
}

func (m *machine) activeMaintenance(inst, match string) bool {
	typ, at, _ := strings.Cut(match, "@")
	start, err := time.Parse(time.RFC3339, at)
	if err != nil {
		return false
	}
	for _, mt := range m.m.maints {
		// A record of a start the router moved the maintenance from is of it too: a report of
		// that start decided before the move was written (two workers at once).
		if mt.inst == inst && (mt.start.Equal(start) || slices.ContainsFunc(mt.movedFrom, start.Equal)) && (string(mt.typ) == typ || mt.typ == "" || typ == "") && mt.live() {
			return true
		}
	}
	return false
}

// finish lets the router run, healthy, until every deadline the run made has passed, then
// checks that nothing was lost and every message was done with.
func (m *machine) finish(t *rapid.T) {
	m.advance(t, max(m.horizon.Sub(m.now())+tick, time.Hour))
	m.Check(t)
	// Healthy for longer than the event windows' longest backoff and their re-read: settled.
	m.advance(t, eventwindow.RetryMax+eventwindow.DescribeTTL)
	m.checkWindows(t, true)
	m.checkNoOrphans(t)
	eventsSummarised.Add(int64(m.w.told))
	m.w.queues.mu.Lock()
	defer m.w.queues.mu.Unlock()
	if n := len(m.w.queues.intake); n > 0 {
		t.Fatalf("%d messages neither deleted nor dead-lettered after the run (first: %s)", n, m.w.queues.intake[0].body)
	}
}

// memOf is the router's memory of NodeClaim name, as the API server holds it (empty when
// it cannot be read).
func (m *machine) memOf(name string) record.Memory {
	mem, _ := record.Load(m.ctx, m.w.store, name)
	return mem
}

// runOf is the reboot in place's run in the router's memory of NodeClaim name, for a message.
func (m *machine) runOf(name string) string { return string(m.memOf(name).Run) }

// checkNoOrphans: after a healthy pass, no HealthRecord is left of a NodeClaim that is gone
// (the deferral controller's sweep; the simulation's API server has no garbage collector).
func (m *machine) checkNoOrphans(t *rapid.T) {
	var hrs record.HealthRecordList
	if err := m.w.store.List(m.ctx, &hrs); err != nil {
		t.Fatal(err)
	}
	for _, hr := range hrs.Items {
		if hr.OfLedger() {
			continue // the shadow ledger outlives the NodeClaims it names (checkLedger)
		}
		if hr.OfNode() {
			// A Node's record (the unmanaged drain): owned by its Node, which stays.
			if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: hr.Spec.NodeName}, &corev1.Node{}); apierrors.IsNotFound(err) {
				t.Fatalf("healthrecord %s is left after its node is gone: %+v", hr.Name, hr.Status)
			}
			continue
		}
		nc := &karpv1.NodeClaim{}
		if err := m.w.store.Get(m.ctx, client.ObjectKey{Name: hr.Name}, nc); apierrors.IsNotFound(err) {
			t.Fatalf("healthrecord %s is left after its nodeclaim is gone: %+v", hr.Name, hr.Status)
		}
	}
}

// TestSimulation runs the state machine: `go test ./test/sim` runs rapid's default 100 seeds,
// `make sim SEEDS=N` more (rapid shrinks a failure to a minimal sequence and prints its seed).
func TestSimulation(t *testing.T) {
	defer func() {
		// The state the features add is driven, not only possible: over make test's fixed
		// sequence, kafka's scheduled events are moved into its window.
		if *checks() >= 20 && moves.Load() == 0 {
			t.Error("no scheduled event was moved into kafka's window over the run")
		}
		if *checks() >= 20 && inPlaces.Load() == 0 {
			t.Error("no kafka node was kept through a reboot over the run")
		}
		if *checks() >= 20 && !windowsKept.Load() {
			t.Error("kafka never had an EC2 event window over the run")
		}
		if *checks() >= 20 && eventsSummarised.Load() == 0 {
			t.Error("no instance's Events were held back and told in a summary over the run")
		}
		for name, n := range map[string]int64{"stale reads from the router's cache": staleReads.Load(), "batches decided by workers at once": concurrentBatches.Load(),
			"failovers with the old leader still acting": overlaps.Load(),
			"drains of the unmanaged node":               unmanagedCordons.Load(), "urgent drains held by web's breaker": urgentHolds.Load(),
			"forged shutting-downs EC2 contradicted": contradicted.Load(), "would-be outcomes of the pool in shadow": shadowOutcomes.Load(), "shadow ledger entries checked": ledgerEntriesChecked.Load(),
			"batches SQS failed after handing them out": sqsFailures.Load(), "closes sent as an open update resolving the instance": resolvedUpdates.Load(),
			"forged writes of the old memory keys": forgedWrites.Load(), "switches of the pool in shadow to active and back": modeSwitches.Load(),
			"drains carried out for the pool in shadow, as Karpenter would": standInDrains.Load(),
			"restarts without cordon-drain":                                 cordonDrainOffRestarts.Load()} {
			if *checks() >= 20 && n == 0 {
				t.Errorf("no %s over the run", name)
			}
			t.Logf("%s: %d", name, n)
		}
		// The reboots of a kept node are drawn by few runs (make test's 20 draw 0 to 5 of each
		// kind): TestKeptReboots drives each kind every time.
		t.Logf("AWS reboots of a kept node, out of service: %d; reboot migrations that cleared the event: %d; AWS reboots of the unmanaged node, cordoned: %d",
			awsOutOfService.Load(), migrations.Load(), awsUnmanaged.Load())
		t.Logf("closes tied with a report of their maintenance, decided at once: %d", tiedCloses.Load())
	}()
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		defer func() { urgentHolds.Add(m.w.urgentHolds.Load()); contradicted.Add(m.w.contradicted.Load()) }() // after the stops below
		defer m.w.stopWindows()
		defer m.w.stop(m.w.leader)
		defer m.w.endOverlap()
		defer func() { staleReads.Add(int64(m.w.cache.staleReads())) }()
		actions := map[string]func(*rapid.T){
			"Health": m.Health, "Poller": m.Poller, "StopStart": m.StopStart, "Spot": m.Spot, "Storm": m.Storm, "Forged": m.Forged, "ForgedWrite": m.ForgedWrite, "Impair": m.Impair,
			"Duplicate": m.Duplicate, "Deliver": m.Deliver, "Poll": m.Poll, "Faults": m.Faults, "Karpenter": m.Karpenter,
			"Advance": m.Advance, "Crash": m.Crash, "Failover": m.Failover, "Migration": m.Migration, "ShadowMode": m.ShadowMode,
		}
		names := make([]string, 0, len(actions))
		for n := range actions {
			names = append(names, n)
		}
		sort.Strings(names)
		for i := 0; i < *steps; i++ {
			name := rapid.SampledFrom(names).Draw(t, "action")
			m.lag(t, "cache")
			actions[name](t)
			m.Check(t)
		}
		m.finish(t)
	})
}

// TestKeptReboots drives, through the same machine and invariants, the reboots of a kept kafka
// node that random runs reach only now and then: AWS schedules a system reboot on Saturday
// morning, the router moves it into kafka's window and keeps the node through it. With
// migration, the router reboots the instance in the window, EC2 clears the event and the node
// is back in service; where the migration is not possible, or is disabled, AWS reboots it at
// the start, and finds it out of service.
func TestKeptReboots(t *testing.T) {
	tests := []struct {
		name    string
		opt     migrationOpt
		counter *atomic.Int64
		what    string
	}{
		{name: "migrated", opt: migrationOpt{state: ec2types.InstanceRebootMigrationStateDefault}, counter: &migrations, what: "migration"},
		{name: "migrated, shown completed", opt: migrationOpt{state: ec2types.InstanceRebootMigrationStateDefault, completed: true}, counter: &migrations, what: "migration"},
		{name: "migration not possible", opt: migrationOpt{state: ec2types.InstanceRebootMigrationStateDefault, fails: true}, counter: &awsOutOfService, what: "AWS reboot of the node out of service"},
		{name: "migration disabled", opt: migrationOpt{state: ec2types.InstanceRebootMigrationStateDisabled}, counter: &awsOutOfService, what: "AWS reboot of the node out of service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				m := newMachine(rt)
				defer m.w.stopWindows()
				defer m.w.stop(m.w.leader)
				defer m.w.endOverlap()
				var kafka []string
				for _, id := range m.live() {
					if m.m.insts[id].pool == PoolKafka {
						kafka = append(kafka, id)
					}
				}
				inst := kafka[0]
				m.w.ec2.mu.Lock()
				m.w.ec2.migration[inst] = tt.opt
				m.w.ec2.mu.Unlock()
				before := tt.counter.Load()
				// Saturday 21 November, 10:00: the window opens at 02:00, the event moves to 03:00.
				m.health(rt, inst, event.ScheduledSystemReboot, time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC), false, false)
				m.advance(rt, 20*time.Hour)
				m.Check(rt)
				if tt.counter.Load() == before {
					rt.Fatalf("%s: no %s for %s's system reboot", tt.name, tt.what, inst)
				}
				var claims karpv1.NodeClaimList
				if err := m.w.store.List(m.ctx, &claims); err != nil {
					rt.Fatal(err)
				}
				kept := false
				for i := range claims.Items {
					nc := &claims.Items[i]
					if cluster.InstanceID(nc.Status.ProviderID) != inst {
						continue
					}
					// The node is kept: the run ended done (not fallen back to a replacement).
					st, ok, err := inplace.Read(m.memOf(nc.Name))
					if err != nil || !ok || !st.Over() || !strings.HasPrefix(st.Outcome, "done") || !nc.DeletionTimestamp.IsZero() {
						rt.Fatalf("%s: the run on %s did not end with the node kept: %s", tt.name, inst, m.runOf(nc.Name))
					}
					kept = true
				}
				if !kept {
					rt.Fatalf("%s: %s's NodeClaim is gone: the node was replaced, not kept", tt.name, inst)
				}
			})
		})
	}
}

// defaultChecks and defaultSeed are what `make test` runs: a fixed sequence of 20 runs, the same
// on every machine, so CI is never red by the draw; `make sim SEEDS=N` runs N from a random seed
// (rapid prints it), to look further.
const (
	defaultChecks = "20"
	defaultSeed   = "20261124"
)

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" || f.Name == "rapid.seed" })
	if !set {
		_ = flag.Set("rapid.checks", defaultChecks)
		_ = flag.Set("rapid.seed", defaultSeed)
	}
	os.Exit(m.Run())
}
