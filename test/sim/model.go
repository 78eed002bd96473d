package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// The reference model: what the router has been told (only what it processed), and from it
// when a drain is allowed and when it is owed. It is written from the product's promise and
// the pools' annotations (PoolAnnotations), not from the router's code.

// Policy facts of the simulated pools, restated for the model.
const (
	drainLead     = time.Hour        // kafka's drain-lead
	restartGrace  = 15 * time.Minute // the default restart-grace
	impairedAfter = 2 * time.Minute  // the poller's ImpairedAfter
	kafkaLimit    = 1                // kafka's max-concurrent-drains
	webCutoff     = 1                // web's repair cut-off: 20% of 5 nodes, rounded up
	webUrgentMax  = 2                // web's urgent-drain breaker (urgent-drain-max)
	tick          = 10 * time.Minute // the router's loop while time advances
)

// windowOpen is kafka's window, "0 2 * * 6" for 6h: Saturdays 02:00 to 08:00 UTC.
func windowOpen(t time.Time) bool {
	t = t.UTC()
	return t.Weekday() == time.Saturday && t.Hour() >= 2 && t.Hour() < 8
}

const (
	stateActive     = "active"
	stateCancelled  = "cancelled"
	stateSuperseded = "superseded"
	stateInPlace    = "in-place" // the router emptied the node before AWS acts, and keeps it
	// stateTied: a close of the maintenance and a report of it under another key, sent no
	// earlier than the close, were decided by workers at once. The router ends it if the
	// report's record is written first, and keeps the report as a new maintenance if the close
	// is: either is its to choose. Nothing is owed for it, and a drain for it is allowed.
	stateTied = "tied"
)

// maintenance is one scheduled maintenance of one instance, as the router has been told it.
type maintenance struct {
	inst  string
	typ   event.ScheduledType // "" for an AWS Health code the router does not map
	start time.Time
	state string
	known time.Time // when the router first processed a report of it
	keys  map[string]bool
	// movedFrom are the starts the router moved it from: a report of one of them was sent before
	// the move, and is this maintenance, not a reschedule back.
	movedFrom []time.Time
	// joined is, for each key it is known under, when that key's report was sent and the
	// batch of workers at once that made it known (0: one message at a time).
	joined map[string]joinedBy
}

type joinedBy struct {
	sent  time.Time
	batch int
}

// live reports whether the router may hold the maintenance as one to drain for: it is active,
// or a close may or may not have ended it (tied).
func (mt *maintenance) live() bool { return mt.state == stateActive || mt.state == stateTied }

type stateChange struct {
	at    time.Time // the event's time
	state event.InstanceState
}

// instance is the model of one instance.
type instance struct {
	id, pool      string
	urgent        bool // a Spot warning was processed
	impairedSince time.Time
	impairedSeen  bool // a poll saw it impaired for impairedAfter
	changes       []stateChange
	drained       time.Time // when the router first signalled its drain (or began a reboot in place)
	drainReason   string
	spotOnly      bool      // drained with a Spot warning its only cause: an urgent drain for the breaker
	forwarded     time.Time // when the drain was last forwarded to Karpenter's queue (forward mode)
	forwardedBy   string    // the leadership (replica/election) that forwarded it last
	inPlace       bool      // a reboot in place runs: the node is out of service, and comes back
	gone          bool
}

type model struct {
	insts map[string]*instance
	// shadowActive: ShadowMode has the pool in shadow out of shadow now.
	shadowActive bool
	// cordonDrainOff are the spans a leader without --unmanaged-nodes=cordon-drain led (to
	// zero: still leading).
	cordonDrainOff []span
	maints         []*maintenance
	errs           []string
	// life counts the leaderships: a crash or a failover starts a new one, with a memory of
	// its own.
	life int
	// leaderships are the times a leadership began (a crash, a failover): the urgent-drain
	// breaker counts in a leader's memory, so each new one may let one more limit through.
	leaderships []time.Time
	// overlapping reports whether an old leader still acts beside the new one (its memory, and
	// so its breaker count, is its own); overlapEnds are the times such a leader stopped (its
	// drains of the minute before still count in no other memory).
	overlapping func() bool
	overlapEnds []time.Time
	// batch is the batch of messages workers decide at once while its reports are applied
	// (0: one message at a time); batches counts them.
	batch, batches int
}

func newModel() *model { return &model{insts: map[string]*instance{}} }

func (m *model) inst(id, pool string) *instance {
	in := m.insts[id]
	if in == nil {
		in = &instance{id: id, pool: pool}
		m.insts[id] = in
	}
	return in
}

func (m *model) fail(format string, args ...any) {
	m.errs = append(m.errs, fmt.Sprintf(format, args...))
}

// reported applies a processed report of a maintenance under a source's key (an AWS Health
// eventArn, EC2's instance-event ID): one key is one event across its updates. A report is the
// same maintenance as another source's when the instance, start and (known) type agree; a new
// start under the same key, or of the same known type from another source, is a reschedule;
// a closed report ends its key's maintenance and the same maintenance from the other source.
//
// A report is applied in two halves: what it makes known (a maintenance, a cause to drain)
// while the router processes it (ends false), what it ends (a close, the maintenance a
// reschedule replaces) once the router is done with it (ends true): the model never forgives
// more than the router knew, whether the processing fails (an outage) or not.
func (m *model) reported(key, inst string, typ event.ScheduledType, start time.Time, closed, ends bool, sent, now time.Time) {
	found := false
	for _, mt := range m.maints {
		if !closed && mt.state != stateActive && mt.keys[key] && mt.start.Equal(start) {
			return // a late duplicate of an event that ended: it does not bring it back
		}
	}
	for _, mt := range m.maints {
		// A maintenance a reboot in place takes care of is still the one the other source
		// reports: its report joins it, and does not make a new one the run never began for.
		// A tied one is reached by a close only.
		if mt.inst != inst || (mt.state != stateActive && mt.state != stateInPlace && (mt.state != stateTied || !closed)) {
			continue
		}
		same := (mt.start.Equal(start) || slices.ContainsFunc(mt.movedFrom, start.Equal)) && (mt.typ == typ || mt.typ == "" || typ == "")
		switch {
		case closed:
			if same || mt.keys[key] {
				mt.state = stateCancelled
				if m.tied(mt, key, sent) {
					mt.state = stateTied
					tiedCloses.Add(1)
				}
			}
		case same:
			mt.keys[key], found = true, true
			mt.join(key, sent, m.batch)
		case ends && mt.state == stateActive && (mt.keys[key] || (mt.typ != "" && mt.typ == typ && !mt.from(sourceOf(key)))):
			mt.state = stateSuperseded
		}
	}
	if !closed && !found {
		mt := &maintenance{inst: inst, typ: typ, start: start, state: stateActive, known: now, keys: map[string]bool{key: true}}
		mt.join(key, sent, m.batch)
		m.maints = append(m.maints, mt)
	}
}

// join notes a report of the maintenance under key, sent at sent, made known in batch.
func (mt *maintenance) join(key string, sent time.Time, batch int) {
	if mt.joined == nil {
		mt.joined = map[string]joinedBy{}
	}
	if j, ok := mt.joined[key]; !ok || sent.After(j.sent) || (batch != 0 && j.batch != batch) {
		mt.joined[key] = joinedBy{sent: sent, batch: batch}
	}
}

// tied reports whether a close of mt under key, sent at sent, was decided by workers at once
// with a report of mt under another key sent no earlier (to the second): the router's outcome
// depends on which of the two writes lands first (stateTied).
func (m *model) tied(mt *maintenance, key string, sent time.Time) bool {
	if m.batch == 0 || mt.state == stateInPlace {
		return false
	}
	for k, j := range mt.joined {
		if k != key && j.batch == m.batch && !j.sent.Truncate(time.Second).Before(sent.Truncate(time.Second)) {
			return true
		}
	}
	return false
}

// sourceOf is the source a report's key is of: an AWS Health eventArn, or EC2's instance-event ID.
func sourceOf(key string) string {
	if strings.HasPrefix(key, "arn:") {
		return "health"
	}
	return "ec2"
}

// from reports whether the maintenance is known under a key of source: another key of the
// same source is another event (EC2 lists two events of one type), not a reschedule of it.
func (mt *maintenance) from(source string) bool {
	for k := range mt.keys {
		if sourceOf(k) == source {
			return true
		}
	}
	return false
}

// moved applies a move of a maintenance the router made (EC2 accepted it): the maintenance of
// the instance and type that started at from starts at to, under EC2's key too. It keeps when
// the router first knew it: a move never excuses a late drain.
func (m *model) moved(key, inst string, typ event.ScheduledType, from, to, now time.Time) {
	if in := m.insts[inst]; in != nil && in.pool == PoolShadow {
		m.fail("%s: the router moved a %s maintenance of %s, a node of a pool in shadow, at EC2", now.Format(time.RFC3339), typ, inst)
		return
	}
	for _, mt := range m.maints {
		if mt.inst == inst && mt.live() && mt.start.Equal(from) && (mt.typ == typ || mt.typ == "") {
			mt.movedFrom = append(mt.movedFrom, mt.start)
			mt.start, mt.typ, mt.keys[key] = to, typ, true
			return
		}
	}
	m.fail("%s: the router moved a %s maintenance of %s from %s it was not told of", now.Format(time.RFC3339), typ, inst, from.Format(time.RFC3339))
}

// span is a time from..to; to zero is open.
type span struct{ from, to time.Time }

// cordonDrain notes a new leadership at at, with or without cordon-drain.
func (m *model) cordonDrain(at time.Time, off bool) {
	if n := len(m.cordonDrainOff); n > 0 && m.cordonDrainOff[n-1].to.IsZero() {
		if off {
			return
		}
		m.cordonDrainOff[n-1].to = at
		return
	}
	if off {
		m.cordonDrainOff = append(m.cordonDrainOff, span{from: at})
	}
}

// cordonDrainWasOff reports whether a leader without cordon-drain led at any time between from
// and to: a maintenance of the unmanaged node known then is not owed its cordon (a drain begun
// before is carried on, and checkUnmanaged still judges its end).
func (m *model) cordonDrainWasOff(from, to time.Time) bool {
	for _, s := range m.cordonDrainOff {
		if !s.from.After(to) && (s.to.IsZero() || !s.to.Before(from)) {
			return true
		}
	}
	return false
}

// running reports whether the latest processed state change of in says it runs after at.
func (in *instance) runningAfter(at time.Time) bool {
	for _, c := range in.changes {
		if c.state == event.StateRunning && c.at.After(at) {
			return true
		}
	}
	return false
}

// cause returns why a drain of in at now is allowed, or "" when nothing allows it.
func (m *model) cause(in *instance, now time.Time) string {
	if in.pool == PoolBatch {
		return ""
	}
	if in.pool == PoolShadow {
		// Karpenter's behaviour, which the router carries out for it (in shadow), or a
		// deferral to its window (active): web's causes bound both.
		return m.webCause(in)
	}
	if in.pool == "" {
		// The managed node group's node under --unmanaged-nodes=cordon-drain: Karpenter's
		// behaviour, as web's, without pacing or a repair cut-off.
		return m.webCause(in)
	}
	if in.urgent {
		return "spot"
	}
	for _, mt := range m.maints {
		if mt.inst != in.id || !mt.live() {
			continue
		}
		if in.pool == PoolWeb || windowOpen(now) || !now.Before(mt.start.Add(-drainLead)) {
			return "maintenance"
		}
	}
	for _, c := range in.changes {
		if (c.state == event.StateStopped || c.state == event.StateStopping) && !in.runningAfter(c.at) {
			if in.pool == PoolWeb || !now.Before(c.at.Add(restartGrace)) {
				return "stop"
			}
		}
	}
	if in.impairedSeen {
		return "impaired"
	}
	return ""
}

// drained checks one drain the router signalled, when it signalled it.
func (m *model) drained(in *instance, now time.Time) {
	if !in.drained.IsZero() {
		return // a fallback DELETE after a forward: the same drain
	}
	cause := m.cause(in, now)
	in.drained, in.drainReason = now, cause
	if in.pool == PoolShadow && !m.shadowActive {
		standInDrains.Add(1)
	}
	switch {
	case cause == "":
		m.fail("%s: %s drained at %s without cause (ignore pool, before its window and deadline minus drain-lead, a stop that ran again, or nothing told)", now.Format(time.RFC3339), in.id, in.pool)
	case in.pool == PoolKafka && cause != "spot" && !m.forced(in, now):
		if n := m.inFlight(PoolKafka, in.id, ""); n >= kafkaLimit*m.deciders(now) {
			m.fail("%s: %s drained with %d kafka drains in flight (max-concurrent-drains %d, %d leader(s) acting)", now.Format(time.RFC3339), in.id, n, kafkaLimit, m.deciders(now))
		}
	case cause == "spot" && in.pool == PoolWeb && m.spotOnly(in, now):
		in.spotOnly = true
		since := now.Add(-policy.UrgentWindow)
		leaders := 1
		if m.overlapping != nil && m.overlapping() {
			leaders++
		}
		for _, at := range slices.Concat(m.leaderships, m.overlapEnds) {
			if !at.Before(since) {
				leaders++
			}
		}
		n := 0
		for _, o := range m.insts {
			if o.pool == PoolWeb && o.id != in.id && o.spotOnly && o.drained.After(since) {
				n++
			}
		}
		if n >= webUrgentMax*leaders {
			m.fail("%s: %s drained for a Spot warning with %d of web's urgent drains within %s (urgent-drain-max %d, %d leadership(s))", now.Format(time.RFC3339), in.id, n, policy.UrgentWindow, webUrgentMax, leaders)
		}
	case cause == "impaired" && in.pool != PoolShadow: // its cut-off is of its own size
		if n := m.inFlight(in.pool, in.id, "impaired"); n >= webCutoff*m.deciders(now) {
			m.fail("%s: impaired %s replaced with %d repairs of %s in flight (cut-off %d)", now.Format(time.RFC3339), in.id, n, in.pool, webCutoff)
		}
	}
}

// spotOnly reports whether a Spot warning is in's only cause to drain at now: a node with
// another (a maintenance, a stop, an impairment) may be drained for that, which the breaker
// does not count.
func (m *model) spotOnly(in *instance, now time.Time) bool {
	in.urgent = false
	other := m.cause(in, now)
	in.urgent = true
	return other == ""
}

// deciders is how many leaders decide at now, each with its own memory of the drains it
// reserved: one, or two while an old leader that has not noticed the loss of its lease still
// acts (or stopped at this moment). Pacing and the repair cut-off count in flight what the
// cluster shows and what the deciding leader reserved, so two such leaders, each before the
// other's drain shows in its cache, may each let one through: the limit holds per leader.
func (m *model) deciders(now time.Time) int {
	if (m.overlapping != nil && m.overlapping()) || slices.ContainsFunc(m.overlapEnds, func(t time.Time) bool { return t.Equal(now) }) {
		return 2
	}
	return 1
}

// forwardedTo checks one drain the router forwarded to Karpenter's queue: a forward is a
// drain, and one leadership forwards a drain once, whatever redeliveries, duplicates and
// other events of the instance come. A new leadership may forward it again: delivery to
// Karpenter is at least once (a crash between the send and the stamp, or after both, leaves
// the send unknown, and a redelivered event is sent again; Karpenter ignores an interruption
// of a NodeClaim it is deleting).
//
// Leaderships may overlap: an old leader that has not noticed the loss of its lease still
// acts beside the new one, and each is a leadership of its own.
func (m *model) forwardedTo(in *instance, now time.Time, leadership string) {
	if !in.forwarded.IsZero() && in.forwardedBy == leadership {
		m.fail("%s: %s forwarded to Karpenter twice by one leader (%s; first at %s, drained at %s): one drain, two messages", now.Format(time.RFC3339), in.id, leadership, in.forwarded.Format(time.RFC3339), in.drained.Format(time.RFC3339))
	}
	in.forwarded, in.forwardedBy = now, leadership
	m.drained(in, now)
}

// inPlaceBegun checks a reboot in place the router began for a maintenance of in: as a drain,
// never early and paced; the node is out of service until the run ends, and the maintenance
// is taken care of (its pods are off the node before AWS acts).
func (m *model) inPlaceBegun(in *instance, typ event.ScheduledType, start, now time.Time) {
	if !in.drained.IsZero() {
		m.fail("%s: %s: a reboot in place begun while it is drained or rebooting already", now.Format(time.RFC3339), in.id)
		return
	}
	m.drained(in, now)
	in.inPlace = true
	for _, mt := range m.maints {
		if mt.inst == in.id && mt.live() && mt.start.Equal(start) && (mt.typ == typ || mt.typ == "") {
			mt.state = stateInPlace
		}
	}
}

// inPlaceOver: the run ended with the node kept; it serves again.
func (m *model) inPlaceOver(in *instance) {
	in.inPlace, in.drained, in.drainReason, in.forwarded = false, time.Time{}, "", time.Time{}
}

// forced reports whether a maintenance of in has reached deadline minus drain-lead: pacing
// gives way then.
func (m *model) forced(in *instance, now time.Time) bool {
	for _, mt := range m.maints {
		if mt.inst == in.id && mt.live() && !now.Before(mt.start.Add(-drainLead)) {
			return true
		}
	}
	for _, c := range in.changes {
		if (c.state == event.StateStopped || c.state == event.StateStopping) && !in.runningAfter(c.at) {
			return true // a stop has no deadline to pace against; its drain is not paced here
		}
	}
	return false
}

func (m *model) inFlight(pool, except, reason string) int {
	n := 0
	for _, in := range m.insts {
		if in.pool == pool && in.id != except && !in.drained.IsZero() && !in.gone && (reason == "" || in.drainReason == reason) {
			n++
		}
	}
	return n
}

// lost checks that every maintenance the router knew in time was drained before AWS acts.
func (m *model) lost(now time.Time) {
	for _, mt := range m.maints {
		in := m.insts[mt.inst]
		if mt.state != stateActive || in == nil || in.pool == PoolBatch || in.pool == "" || now.Before(mt.start) {
			continue
		}
		if mt.known.After(mt.start.Add(-drainLead - 2*tick)) {
			continue // told too late for the router's loop to act before AWS
		}
		if in.drained.IsZero() || in.drained.After(mt.start) {
			m.fail("%s: %s maintenance of %s (%s) at %s, known since %s, not drained before it", now.Format(time.RFC3339), mt.typ, in.id, in.pool, mt.start.Format(time.RFC3339), mt.known.Format(time.RFC3339))
			mt.state = stateCancelled // reported once
		}
	}
}

// maintenanceAt returns the maintenance of inst of type typ (or of an unmapped type) at start,
// the latest told, or nil.
func (m *model) maintenanceAt(inst string, typ event.ScheduledType, start time.Time) *maintenance {
	var found *maintenance
	for _, mt := range m.maints {
		if mt.inst == inst && mt.start.Equal(start) && (mt.typ == typ || mt.typ == "") {
			found = mt
		}
	}
	return found
}

// webCause is why a node of a pool with Karpenter's behaviour may be drained now.
func (m *model) webCause(in *instance) string {
	if in.urgent {
		return "spot"
	}
	for _, mt := range m.maints {
		if mt.inst == in.id && mt.live() {
			return "maintenance"
		}
	}
	for _, c := range in.changes {
		if (c.state == event.StateStopped || c.state == event.StateStopping) && !in.runningAfter(c.at) {
			return "stop"
		}
	}
	if in.impairedSeen {
		return "impaired"
	}
	return ""
}

// cordoned checks a drain of the unmanaged node the router began: it needs a cause.
func (m *model) cordoned(in *instance, now time.Time) {
	if m.webCause(in) == "" {
		m.fail("%s: unmanaged %s cordoned for a drain without cause", now.Format(time.RFC3339), in.id)
	}
}

// holdsCordon reports whether something the router was told still justifies the unmanaged
// node's cordon: a cause to drain, or a reboot-type maintenance not over yet (AWS's window,
// and the drainer's next passes).
func (m *model) holdsCordon(in *instance, now time.Time) bool {
	if in.urgent || in.impairedSeen {
		return true
	}
	for _, mt := range m.maints {
		if mt.inst != in.id || !mt.live() {
			continue
		}
		if mt.typ != event.ScheduledSystemReboot || now.Before(mt.start.Add(awsWindowModel+2*tick)) {
			return true
		}
	}
	for _, c := range in.changes {
		if (c.state == event.StateStopped || c.state == event.StateStopping) && !in.runningAfter(c.at) {
			return true
		}
	}
	return false
}

// awsWindowModel is how long after its start AWS may carry a scheduled event out (the Health
// events' end, the EC2 events' not-after).
const awsWindowModel = 2 * time.Hour
