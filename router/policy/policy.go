// Package policy turns NodePool annotations into a Policy and decides, as a pure function
// of (event, target, now), what the router does with an event for one instance.
package policy

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// Annotation keys on a Karpenter NodePool. They are the router's public API.
const (
	Prefix                        = "healthrouter.io/"
	AnnotationAction              = Prefix + "action"
	AnnotationMaxConcurrentDrains = Prefix + "max-concurrent-drains"
	AnnotationWindowSchedule      = Prefix + "window-schedule"
	AnnotationWindowDuration      = Prefix + "window-duration"
	AnnotationDrainLead           = Prefix + "drain-lead"
	AnnotationRestartGrace        = Prefix + "restart-grace"
	// AnnotationRepairMaxUnhealthy is the impaired-instance repair cut-off: while more of the
	// pool's nodes than this (a percentage, rounded up, or a count) are impaired, the router
	// replaces none of them (Karpenter's node repair stops at 20%; Cluster API's maxUnhealthy).
	AnnotationRepairMaxUnhealthy = Prefix + "repair-max-unhealthy"
	// AnnotationRepairMaxUnhealthyCap caps the cut-off in large pools (a count).
	AnnotationRepairMaxUnhealthyCap = Prefix + "repair-max-unhealthy-cap"
	// AnnotationTaintUpcoming (bool, default false) puts a PreferNoSchedule taint on a node
	// while it has a pending outcome (deferred, held), so that new pods prefer other nodes;
	// nothing is evicted for it.
	AnnotationTaintUpcoming = Prefix + "taint-upcoming"
	// AnnotationReschedule (bool, default false) lets the router move a scheduled event that
	// has a deadline into the pool's maintenance window (EC2 ModifyInstanceEventStartTime).
	// It needs a maintenance window: without one it is ignored, and listed in Problems.
	AnnotationReschedule = Prefix + "reschedule"
	// AnnotationEventWindow (bool, default false) has the router keep an EC2 event window for
	// the pool (router/eventwindow): AWS then schedules new stop, reboot and retirement events
	// of the pool's instances inside the pool's maintenance window. It needs a maintenance
	// window: without one it is ignored, and listed in Problems. Whether EC2 can express the
	// window (Window.EC2Ranges) is the manager's to tell.
	AnnotationEventWindow = Prefix + "event-window"
	// AnnotationUrgentDrainMax is the pool's urgent-drain breaker: once this many of the
	// pool's nodes (a percentage, rounded up, or a count) were drained for urgent events (Spot
	// and capacity-reservation interruptions, shutting-down or terminated instances) within
	// UrgentWindow, the pool's further urgent drains are held. Unset: no breaker.
	AnnotationUrgentDrainMax = Prefix + "urgent-drain-max"
	// AnnotationMode is ModeActive (the default) or ModeShadow: in shadow the pool's events are
	// decided as usual and their would-be outcomes recorded (router/shadow), and nothing is
	// carried out, while Karpenter keeps its own handling.
	AnnotationMode = Prefix + "mode"
)

// Modes of a NodePool (AnnotationMode).
const (
	ModeActive = "active"
	ModeShadow = "shadow"
)

// RecommendedUrgentDrainMax is the urgent-drain breaker a pool gets for an invalid
// urgent-drain-max (the owner asked for a breaker: none would be "unlimited"), and the value
// the docs recommend for pools whose nodes are not Spot.
var RecommendedUrgentDrainMax = intstr.FromString("20%")

// UrgentWindow is how far back the urgent-drain breaker counts a pool's urgent drains: AWS's
// warnings come two minutes ahead, so a storm of them shows within a minute.
const UrgentWindow = time.Minute

// Defaults of the repair cut-off: Karpenter's 20%, and at most 10 nodes of any one pool.
var (
	DefaultRepairMaxUnhealthy = intstr.FromString("20%")
)

// DefaultRepairMaxUnhealthyCap caps the default cut-off: an AZ-wide impairment of a
// 1,000-node pool replaces at most 10 nodes at once.
const DefaultRepairMaxUnhealthyCap = 10

// Defaults of the timing annotations.
const (
	DefaultDrainLead    = time.Hour
	DefaultRestartGrace = 15 * time.Minute
)

// Bounds of the duration annotations. A value past its bound is a problem and the default
// applies: an unbounded duration is as unsafe as an unparsable one.
const (
	// MaxDrainLead bounds drain-lead. The lead is what a drain needs before AWS acts: hours, a
	// day for the slowest (Karpenter's terminationGracePeriod); three days cover that with room.
	// AWS announces a scheduled event days to two weeks ahead: with a longer lead, deadline minus
	// drain-lead would already be past for most events, and every deferral a drain now, over the
	// pool's pacing (876000h did exactly that).
	MaxDrainLead = 72 * time.Hour
	// MaxRestartGrace bounds restart-grace. A stop/start takes minutes, and a day covers a stop
	// over a working day; past it the pods of a stopped instance would stay bound to it, not
	// running, for days.
	MaxRestartGrace = 24 * time.Hour
	// MaxWindowDuration bounds window-duration: a weekly window must stay closed a day at least
	// (six days is Monday to Saturday). A window that never closes is no window: every deferral
	// to it would be a drain now.
	MaxWindowDuration = 6 * 24 * time.Hour
	// MaxDrainSettle bounds drain-settle. Replacement pods are Ready within minutes (`ready` is
	// bounded at SettleReadyBound); past an hour a finished drain would keep its pacing slot long
	// after it is over, and the pool's drains would wait on nothing. A longer value settles at
	// the bound rather than at the default: for pacing, the longer settle is the safe side.
	MaxDrainSettle = time.Hour
)

// FallbackWindowDuration is the window's length when window-duration is missing, invalid or
// out of range and window-schedule is valid: the schedule is kept, so that deferrals still wait
// for its openings (without a window an event with no deadline would drain now), with the
// shortest window pools commonly set.
const FallbackWindowDuration = time.Hour

// windowProbe is how many openings of a schedule the check that a window closes between two
// of them looks at: enough for a year of a daily schedule, and a bound on the work for a
// schedule that fires every minute.
const windowProbe = 400

// quoteLimit is how much of an invalid value a problem quotes: enough to recognise it, short
// enough that several problems fit one Event note (1,024 bytes).
const quoteLimit = 64

// Action is what the router does with an event for one instance.
type Action string

const (
	ActionDrain      Action = "drain"       // signal Karpenter now
	ActionDefer      Action = "defer"       // hold the event until Decision.Until
	ActionIgnore     Action = "ignore"      // let AWS act; record it
	ActionSkip       Action = "skip"        // the instance is not a node of this cluster
	ActionDeadLetter Action = "dead-letter" // the message cannot be acted on
	// ActionRebootInPlace keeps the node through a reboot-type scheduled event
	// (RebootsInPlace): in the pool's window the router cordons it, evicts its pods, lets
	// AWS reboot it (or reboots it itself, for instance-reboot) and uncordons it once Ready
	// (router/inplace). Only healthrouter.io/action.scheduled-change.<type> takes it.
	ActionRebootInPlace Action = "reboot-in-place"
)

// RebootsInPlace reports whether AWS keeps the instance through a scheduled event of type t
// (its instance store, EBS volumes and IP): the types reboot-in-place applies to.
func RebootsInPlace(t event.ScheduledType) bool {
	return t == event.ScheduledInstanceReboot || t == event.ScheduledSystemReboot || t == event.ScheduledSystemMaintenance
}

// Policy is a NodePool's configuration, read from its annotations.
type Policy struct {
	// Default is healthrouter.io/action; empty means Karpenter's behaviour per kind.
	Default   Action
	Kinds     map[event.Kind]Action
	Scheduled map[event.ScheduledType]Action
	// MaxConcurrentDrains is nil for unlimited.
	MaxConcurrentDrains *intstr.IntOrString
	Window              *Window
	DrainLead           time.Duration
	RestartGrace        time.Duration
	// RespectPDB (default true) holds non-urgent drains on PodDisruptionBudgets at zero.
	RespectPDB bool
	// HoldWhileAlerts is nil when no alert gate is set.
	HoldWhileAlerts *AlertMatcher
	// AlertsUnreachable is UnreachableHold or UnreachableDrain.
	AlertsUnreachable string
	DrainSettle       Settle
	// RepairMaxUnhealthy and RepairMaxUnhealthyCap are the impaired-instance repair cut-off.
	RepairMaxUnhealthy    intstr.IntOrString
	RepairMaxUnhealthyCap int
	// UrgentDrainMax is the urgent-drain breaker; nil: none.
	UrgentDrainMax *intstr.IntOrString
	// TaintUpcoming is healthrouter.io/taint-upcoming.
	TaintUpcoming bool
	// Shadow is healthrouter.io/mode=shadow: decide, record the would-be outcome, carry
	// nothing out.
	Shadow bool
	// Reschedule is healthrouter.io/reschedule: move scheduled events into Window. It is
	// true only with a Window the owner set in full, not one on FallbackWindowDuration.
	Reschedule bool
	// EventWindow is healthrouter.io/event-window: keep an EC2 event window of Window for the
	// pool's instances. Like Reschedule, it is true only with a Window the owner set in full.
	EventWindow bool
	// Problems lists the annotations that were ignored, why, and what applies instead.
	Problems []string

	// invalidActions are the action keys whose value is not a known action: their events
	// decide on the safe side (ActionFor).
	invalidActions map[string]bool
	// windowInvalid: window annotations are set but make no window; a deferral with nothing
	// else to wait for waits for them to be fixed rather than drain now (Decide).
	windowInvalid bool
	// alertsInvalid: hold-while-alerts is set but does not parse; the alert gate holds as when
	// Alertmanager cannot be reached (ApplyGates).
	alertsInvalid bool
}

// Window is a recurring maintenance window: a cron schedule of start times and a duration.
type Window struct {
	Schedule string
	Duration time.Duration
	sched    cron.Schedule
}

// ActionKey returns the annotation key of a per-kind action.
func ActionKey(k event.Kind) string { return AnnotationAction + "." + string(k) }

// ScheduledActionKey returns the annotation key of a per-scheduled-type action.
func ScheduledActionKey(t event.ScheduledType) string {
	return ActionKey(event.KindScheduledChange) + "." + string(t)
}

// FromAnnotations reads a Policy. It never fails: an invalid value is recorded in Problems,
// with what applies instead, and the pool gets the conservative setting, never "unlimited" or
// "drain now": the default where the default is safe, pacing at one drain for an invalid
// max-concurrent-drains, a deferral for an action that is not one of the known ones.
func FromAnnotations(annotations map[string]string) Policy {
	p := Policy{DrainLead: DefaultDrainLead, RestartGrace: DefaultRestartGrace, RespectPDB: true, AlertsUnreachable: UnreachableHold,
		RepairMaxUnhealthy: DefaultRepairMaxUnhealthy, RepairMaxUnhealthyCap: DefaultRepairMaxUnhealthyCap}
	kindKeys := map[string]event.Kind{}
	for _, k := range event.InstanceKinds {
		kindKeys[ActionKey(k)] = k
	}
	typeKeys := map[string]event.ScheduledType{}
	for _, t := range event.ScheduledTypes {
		typeKeys[ScheduledActionKey(t)] = t
	}
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		if strings.HasPrefix(k, Prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys) // problems in a stable order
	var schedule, duration string
	for _, key := range keys {
		v := strings.TrimSpace(annotations[key])
		// invalid records that the value is refused, why, and what the pool gets instead.
		invalid := func(why, instead string) {
			p.Problems = append(p.Problems, fmt.Sprintf("%s=%s ignored: %s; %s", key, quote(annotations[key]), why, instead))
		}
		switch {
		case key == AnnotationAction:
			p.Default = p.readAction(key, v, "", invalid)
		case kindKeys[key] != "":
			if p.Kinds == nil {
				p.Kinds = map[event.Kind]Action{}
			}
			p.Kinds[kindKeys[key]] = p.readAction(key, v, "", invalid)
		case typeKeys[key] != "":
			if p.Scheduled == nil {
				p.Scheduled = map[event.ScheduledType]Action{}
			}
			p.Scheduled[typeKeys[key]] = p.readAction(key, v, typeKeys[key], invalid)
		case key == AnnotationMaxConcurrentDrains:
			n, err := parseCountOrPercent(v)
			if err != nil {
				invalid(err.Error(), "pacing at 1 drain at a time, the most conservative, until it is fixed")
				n = intstr.FromInt32(1)
			}
			p.MaxConcurrentDrains = &n
		case key == AnnotationWindowSchedule:
			schedule = v
		case key == AnnotationWindowDuration:
			duration = v
		case key == AnnotationDrainLead:
			p.DrainLead = readDuration(v, MaxDrainLead, DefaultDrainLead, invalid)
		case key == AnnotationRestartGrace:
			p.RestartGrace = readDuration(v, MaxRestartGrace, DefaultRestartGrace, invalid)
		case key == AnnotationTaintUpcoming:
			if b, err := strconv.ParseBool(v); err == nil {
				p.TaintUpcoming = b
			} else {
				invalid("want true or false", "no taint (the default)")
			}
		case key == AnnotationRespectPDB:
			if b, err := strconv.ParseBool(v); err == nil {
				p.RespectPDB = b
			} else {
				invalid("want true or false", "PodDisruptionBudgets are respected (the default)")
			}
		case key == AnnotationHoldWhileAlerts:
			if m, err := ParseAlertMatcher(v); err == nil {
				p.HoldWhileAlerts = m
			} else {
				p.alertsInvalid = true
				invalid(err.Error(), fmt.Sprintf("the gate cannot tell whether an alert fires, so it does what %s says (hold by default), as when Alertmanager cannot be reached", AnnotationHoldWhileAlertsUnreachable))
			}
		case key == AnnotationHoldWhileAlertsUnreachable:
			if v == UnreachableHold || v == UnreachableDrain {
				p.AlertsUnreachable = v
			} else {
				invalid(fmt.Sprintf("want %s or %s", UnreachableHold, UnreachableDrain), UnreachableHold+" (the default)")
			}
		case key == AnnotationRepairMaxUnhealthy:
			if n, err := parseCountOrPercent(v); err == nil {
				p.RepairMaxUnhealthy = n
			} else {
				invalid(err.Error(), fmt.Sprintf("the default cut-off %s applies", DefaultRepairMaxUnhealthy.String()))
			}
		case key == AnnotationRepairMaxUnhealthyCap:
			if n, err := parseCount(v); err == nil {
				p.RepairMaxUnhealthyCap = n
			} else {
				invalid("want a whole number of nodes, 0 or more", fmt.Sprintf("the default cap %d applies", DefaultRepairMaxUnhealthyCap))
			}
		case key == AnnotationUrgentDrainMax:
			n, err := parseCountOrPercent(v)
			if err != nil {
				invalid(err.Error(), fmt.Sprintf("the breaker holds urgent drains past %s of the pool, the recommended value (no breaker would be unlimited)", RecommendedUrgentDrainMax.String()))
				n = RecommendedUrgentDrainMax
			}
			p.UrgentDrainMax = &n
		case key == AnnotationMode:
			switch v {
			case ModeActive:
			case ModeShadow:
				p.Shadow = true
			default:
				// Active, not shadow: a pool in shadow while Karpenter's handling is switched
				// off would lose its events; acting beside Karpenter loses none.
				invalid(fmt.Sprintf("want %s or %s", ModeActive, ModeShadow), "the pool is active (its outcomes are carried out), as without the annotation")
			}
		case key == AnnotationReschedule:
			if b, err := strconv.ParseBool(v); err == nil {
				p.Reschedule = b
			} else {
				invalid("want true or false", "no rescheduling (the default)")
			}
		case key == AnnotationEventWindow:
			if b, err := strconv.ParseBool(v); err == nil {
				p.EventWindow = b
			} else {
				invalid("want true or false", "no EC2 event window (the default): AWS keeps its own timing, and the router's deferral still applies")
			}
		case key == AnnotationDrainSettle:
			s, err := parseSettle(v)
			if err != nil {
				instead := "the default 0 applies"
				if s.Duration > 0 {
					instead = "settling for " + short(s.Duration) + ", the longest (for pacing, the conservative side)"
				}
				invalid(err.Error(), instead)
			}
			p.DrainSettle = s
		default:
			p.Problems = append(p.Problems, fmt.Sprintf("%s=%s ignored: unknown annotation", key, quote(annotations[key])))
		}
	}
	fallback := false
	if schedule != "" || duration != "" {
		var problems []string
		p.Window, fallback, problems = readWindow(schedule, duration)
		p.windowInvalid = p.Window == nil
		p.Problems = append(p.Problems, problems...)
	}
	if p.Reschedule && (p.Window == nil || fallback) {
		// Nothing sure to move the events into: moving an AWS event rests on a window the
		// owner set, not on a guessed one. The pool's ordinary policy applies, as if unset.
		p.Reschedule = false
		p.Problems = append(p.Problems, fmt.Sprintf("%s=%s ignored: the pool has no valid maintenance window (%s and %s) to move events into",
			AnnotationReschedule, quote(annotations[AnnotationReschedule]), AnnotationWindowSchedule, AnnotationWindowDuration))
	}
	if p.EventWindow && (p.Window == nil || fallback) {
		// An EC2 event window is the owner's window handed to AWS: never a guessed one.
		p.EventWindow = false
		p.Problems = append(p.Problems, fmt.Sprintf("%s=%s ignored: the pool has no valid maintenance window (%s and %s) to hand to EC2; AWS keeps its own timing",
			AnnotationEventWindow, quote(annotations[AnnotationEventWindow]), AnnotationWindowSchedule, AnnotationWindowDuration))
	}
	return p
}

// readAction reads an action annotation (of scheduled-event type t, or "" for the pool-wide and
// per-kind keys). A value that is not exactly a known action is a problem, and the key's
// events are deferred: held to the window or deadline minus drain-lead and paced, never drained
// at once for a typo (ActionFor records rebalance recommendations only).
func (p *Policy) readAction(key, v string, t event.ScheduledType, invalid func(why, instead string)) Action {
	if a, ok := parseAction(v); ok {
		return a
	}
	if Action(v) == ActionRebootInPlace && t != "" && RebootsInPlace(t) {
		return ActionRebootInPlace
	}
	why := "want drain, defer or ignore, in lower case"
	switch {
	case Action(v) == ActionRebootInPlace && t != "":
		why = fmt.Sprintf("reboot-in-place applies to %s, %s and %s only: AWS replaces the instance for %s", event.ScheduledInstanceReboot, event.ScheduledSystemReboot, event.ScheduledSystemMaintenance, t)
	case t != "" && RebootsInPlace(t):
		why = "want drain, defer, ignore or reboot-in-place, in lower case"
	}
	instead := "its events are deferred, the safe side (held to the maintenance window or deadline minus drain-lead, and paced)"
	if key == AnnotationAction || key == ActionKey(event.KindRebalance) {
		instead += "; rebalance recommendations are recorded only, as Karpenter does"
	}
	invalid(why, instead)
	if p.invalidActions == nil {
		p.invalidActions = map[string]bool{}
	}
	p.invalidActions[key] = true
	return ActionDefer
}

func parseAction(v string) (Action, bool) {
	switch a := Action(v); a {
	case ActionDrain, ActionDefer, ActionIgnore:
		return a, true
	}
	return "", false
}

// readDuration reads a duration annotation bounded by max; an invalid one is a problem and
// def applies.
func readDuration(v string, max, def time.Duration, invalid func(why, instead string)) time.Duration {
	d, err := parseDuration(v, max)
	if err != nil {
		invalid(err.Error(), "the default "+short(def)+" applies")
		return def
	}
	return d
}

// parseDuration parses a Go duration from 0 to max.
func parseDuration(v string, max time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, fmt.Errorf("not a duration such as 1h or 90m")
	case d < 0:
		return 0, fmt.Errorf("negative")
	case d > max:
		return 0, fmt.Errorf("at most %s", short(max))
	}
	return d, nil
}

// parseCount parses a count of nodes: digits only, no sign, within int32 (what an IntOrString
// holds).
func parseCount(v string) (int, error) {
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, fmt.Errorf("not a whole number")
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("too large")
	}
	return int(n), nil
}

// parseCountOrPercent parses a count of nodes or a whole percentage of them, 0% to 100%: the
// value of max-concurrent-drains and repair-max-unhealthy. Nothing else passes (12.5%, 1e1%,
// -3): intstr would take them, and scale them to an error that meant "unlimited".
func parseCountOrPercent(v string) (intstr.IntOrString, error) {
	const want = "want a whole number of nodes (0 or more) or a whole percentage of them, 0% to 100%"
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		n, err := parseCount(pct)
		if err != nil || n > 100 {
			return intstr.IntOrString{}, fmt.Errorf("%s", want)
		}
		return intstr.FromString(strconv.Itoa(n) + "%"), nil
	}
	n, err := parseCount(v)
	if err != nil {
		return intstr.IntOrString{}, fmt.Errorf("%s", want)
	}
	return intstr.FromInt32(int32(n)), nil
}

// quote quotes an annotation's value for a problem, cut at quoteLimit bytes.
func quote(v string) string {
	if len(v) <= quoteLimit {
		return strconv.Quote(v)
	}
	cut := quoteLimit
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return strconv.Quote(v[:cut]) + "…"
}

// readWindow makes the maintenance window of window-schedule and window-duration, and says
// what was wrong with them. A valid schedule is kept whatever the duration: with a duration
// that is missing, invalid, out of range or that would never let the window close, the window
// is FallbackWindowDuration long (fallback). No window comes of an invalid schedule, or of one
// that opens too often for even the fallback window to close.
func readWindow(schedule, duration string) (w *Window, fallback bool, problems []string) {
	if schedule == "" {
		return nil, false, []string{fmt.Sprintf("maintenance window ignored: %s=%s is set without %s; a deferral with no deadline waits for the window to be fixed",
			AnnotationWindowDuration, quote(duration), AnnotationWindowSchedule)}
	}
	sched, err := parseSchedule(schedule)
	if err != nil {
		return nil, false, []string{fmt.Sprintf("maintenance window ignored: %s %s: %v; a deferral with no deadline waits for the window to be fixed", AnnotationWindowSchedule, quote(schedule), err)}
	}
	d, err := parseWindowDuration(duration)
	if err == nil && neverCloses(sched, d) {
		err = fmt.Errorf("the window never closes between two openings of %s", quote(schedule))
	}
	switch {
	case err == nil:
		return &Window{Schedule: schedule, Duration: d, sched: sched}, false, nil
	case neverCloses(sched, FallbackWindowDuration):
		return nil, false, []string{fmt.Sprintf("maintenance window ignored: %s=%s: %v, and %s %s opens too often for even a %s window to close; a deferral with no deadline waits for the window to be fixed",
			AnnotationWindowDuration, quote(duration), err, AnnotationWindowSchedule, quote(schedule), short(FallbackWindowDuration))}
	}
	return &Window{Schedule: schedule, Duration: FallbackWindowDuration, sched: sched}, true,
		[]string{fmt.Sprintf("%s=%s ignored: %v; the schedule is kept with a %s window", AnnotationWindowDuration, quote(duration), err, short(FallbackWindowDuration))}
}

// NewWindow parses a window. The schedule is a standard five-field cron expression in UTC,
// unless it starts with CRON_TZ= (or TZ=) and a zone name, as in Karpenter's budgets. It takes
// any positive duration: the bounds of a pool's window are FromAnnotations' (readWindow).
func NewWindow(schedule, duration string) (*Window, error) {
	if schedule == "" || duration == "" {
		return nil, fmt.Errorf("%s and %s must be set together", AnnotationWindowSchedule, AnnotationWindowDuration)
	}
	sched, err := parseSchedule(schedule)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %v", AnnotationWindowSchedule, schedule, err)
	}
	d, err := time.ParseDuration(duration)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("%s %q: want a positive duration such as 4h", AnnotationWindowDuration, duration)
	}
	return &Window{Schedule: schedule, Duration: d, sched: sched}, nil
}

func parseSchedule(schedule string) (cron.Schedule, error) {
	spec := schedule
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		spec = "TZ=UTC " + spec
	}
	return cron.ParseStandard(spec)
}

func parseWindowDuration(duration string) (time.Duration, error) {
	if duration == "" {
		return 0, fmt.Errorf("not set")
	}
	d, err := time.ParseDuration(duration)
	switch {
	case err != nil || d <= 0:
		return 0, fmt.Errorf("want a positive duration such as 4h")
	case d > MaxWindowDuration:
		return 0, fmt.Errorf("at most %s", short(MaxWindowDuration))
	}
	return d, nil
}

// neverCloses reports whether a window of duration d would stay open from one opening of
// sched to the next, over the first windowProbe openings after a fixed time (so that
// FromAnnotations stays a pure function of the annotations): always open, it would drain
// everything at once. A schedule that never fires closes.
func neverCloses(sched cron.Schedule, d time.Duration) bool {
	prev := sched.Next(time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC))
	if prev.IsZero() {
		return false
	}
	for range windowProbe {
		next := sched.Next(prev)
		if next.IsZero() || next.Sub(prev) > d {
			return false
		}
		prev = next
	}
	return true
}

// Open reports whether now falls in a window: some start s with s <= now < s+duration.
// This is Karpenter's budget test: the next start after now-duration is not after now.
func (w *Window) Open(now time.Time) bool {
	next := w.sched.Next(now.Add(-w.Duration))
	return !next.IsZero() && !next.After(now) && now.Before(next.Add(w.Duration))
}

// Next returns the next window start after now; zero if the schedule never fires.
func (w *Window) Next(now time.Time) time.Time { return w.sched.Next(now).UTC() }

// ActionFor returns the configured action for an event and the annotation it came from
// ("" for none); the most specific key wins, and with none the router does what Karpenter does.
// A key whose value is invalid defers its events (see Invalid); a rebalance recommendation,
// which has no deadline to hold it to, is then recorded only, as without the annotation.
func (p Policy) ActionFor(ev event.Event) (Action, string) {
	a, key := p.configured(ev)
	if p.invalidActions[key] && ev.Kind == event.KindRebalance {
		return ActionIgnore, key
	}
	return a, key
}

// EC2Leads are how long before AWS's start the router acts on the pool's scheduled events, for
// its EC2 event window (Window.EC2Ranges): drain-lead, and inPlace (how long before the start
// a reboot in place empties the node) when the pool reboots a type in place.
func (p Policy) EC2Leads(inPlace time.Duration) []time.Duration {
	leads := []time.Duration{p.DrainLead}
	for _, a := range p.Scheduled {
		if a == ActionRebootInPlace {
			return append(leads, inPlace)
		}
	}
	return leads
}

// Invalid reports whether the action annotation key has a value FromAnnotations refused.
func (p Policy) Invalid(key string) bool { return p.invalidActions[key] }

func (p Policy) configured(ev event.Event) (Action, string) {
	if ev.Health != nil && ev.Health.Scheduled != "" {
		if a, ok := p.Scheduled[ev.Health.Scheduled]; ok {
			return a, ScheduledActionKey(ev.Health.Scheduled)
		}
	}
	if a, ok := p.Kinds[ev.Kind]; ok {
		return a, ActionKey(ev.Kind)
	}
	if p.Default != "" {
		return p.Default, AnnotationAction
	}
	if ev.Kind == event.KindRebalance {
		return ActionIgnore, "" // Karpenter records rebalance recommendations only
	}
	return ActionDrain, ""
}

// DrainLimit returns how many drains the pool may have in flight, and false if unlimited.
// A percentage rounds up, as Karpenter's disruption budgets do.
func (p Policy) DrainLimit(poolNodes int) (int, bool) {
	if p.MaxConcurrentDrains == nil {
		return 0, false
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(p.MaxConcurrentDrains, poolNodes, true)
	if err != nil {
		// Unreachable from FromAnnotations, which takes whole counts and percentages only; a
		// Policy built otherwise fails safe: one drain at a time.
		return 1, true
	}
	return n, true
}

// UrgentLimit returns how many of a pool's nodes may be drained for urgent events within
// UrgentWindow before the breaker holds the next: UrgentDrainMax of poolNodes (a percentage
// rounds up); on is false when the pool has no breaker.
func (p Policy) UrgentLimit(poolNodes int) (n int, on bool) {
	if p.UrgentDrainMax == nil {
		return 0, false
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(p.UrgentDrainMax, poolNodes, true)
	if err != nil {
		// Unreachable from FromAnnotations; a Policy built otherwise gets the recommended value.
		def := RecommendedUrgentDrainMax
		n, _ = intstr.GetScaledValueFromIntOrPercent(&def, poolNodes, true)
	}
	return n, true
}

// RepairLimit returns how many of a pool's nodes may be impaired before the router stops
// replacing them, and what set it: the stricter of the pool's repair-max-unhealthy
// (RepairCutoff) and its disruption budgets that name the reason Unhealthy, active at now, as
// Karpenter reads them (GetAllowedDisruptions: nodes as a count or a percentage rounded up; a
// budget with a schedule counts only within schedule..schedule+duration). Both say how many
// of the pool's nodes may be taken out at once for being unhealthy, so neither may be
// exceeded: the stricter wins. A budget without reasons is Karpenter's pacing of every
// voluntary disruption; the router does not read it as a repair bound (a pool's catch-all
// budget of "0", set to stop consolidation, would stop every repair of an impaired instance):
// an owner who wants the router paced by the pool's budget names Unhealthy in it. A budget
// Karpenter cannot evaluate (an invalid schedule) counts as 0, as Karpenter fails closed.
func RepairLimit(p Policy, budgets []karpv1.Budget, poolNodes int, now time.Time) (int, string) {
	n := p.RepairCutoff(poolNodes)
	by := fmt.Sprintf("%s %s of the pool, at most %d", AnnotationRepairMaxUnhealthy, p.RepairMaxUnhealthy.String(), p.RepairMaxUnhealthyCap)
	at := fixedClock{now: now}
	for _, b := range budgets {
		if !slices.Contains(b.Reasons, karpv1.DisruptionReasonUnhealthy) {
			continue
		}
		allowed, err := b.GetAllowedDisruptions(at, poolNodes)
		what := fmt.Sprintf("the NodePool's Unhealthy disruption budget nodes=%s", b.Nodes)
		if b.Schedule != nil && b.Duration != nil {
			what += fmt.Sprintf(" (schedule %q for %s)", *b.Schedule, b.Duration.Duration)
		}
		if err != nil {
			allowed, what = 0, what+" that Karpenter cannot evaluate ("+err.Error()+"): none"
		}
		if allowed < n {
			n, by = allowed, what
		}
	}
	return n, by
}

// fixedClock is a clock.Clock that reads now: a budget's schedule is evaluated at the
// decision's time (Karpenter's Budget.IsActive reads only Now).
type fixedClock struct {
	clock.Clock
	now time.Time
}

func (c fixedClock) Now() time.Time                  { return c.now }
func (c fixedClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

// RepairCutoff returns how many of a pool's nodes may be impaired before the router stops
// replacing them: RepairMaxUnhealthy of poolNodes (a percentage rounds up), at most
// RepairMaxUnhealthyCap.
func (p Policy) RepairCutoff(poolNodes int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&p.RepairMaxUnhealthy, poolNodes, true)
	if err != nil {
		// Unreachable from FromAnnotations; a Policy built otherwise gets the default cut-off.
		def := DefaultRepairMaxUnhealthy
		n, _ = intstr.GetScaledValueFromIntOrPercent(&def, poolNodes, true)
	}
	return min(n, p.RepairMaxUnhealthyCap)
}
