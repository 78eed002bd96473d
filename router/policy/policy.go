// Package policy turns NodePool annotations into a Policy and decides, as a pure function
// of (event, target, now), what the router does with an event for one instance.
package policy

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/util/intstr"

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
)

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
	// TaintUpcoming is healthrouter.io/taint-upcoming.
	TaintUpcoming bool
	// Reschedule is healthrouter.io/reschedule: move scheduled events into Window. It is
	// true only with a Window.
	Reschedule bool
	// Problems lists the annotations that were ignored, and why.
	Problems []string
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

// FromAnnotations reads a Policy. It never fails: an invalid value is ignored, as if the
// annotation were absent, and recorded in Problems so that decisions and Events say why.
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
		problem := func(format string, args ...any) {
			p.Problems = append(p.Problems, fmt.Sprintf("%s=%q ignored: %s", key, annotations[key], fmt.Sprintf(format, args...)))
		}
		switch {
		case key == AnnotationAction:
			if a, ok := parseAction(v); ok {
				p.Default = a
			} else {
				problem("want drain, defer or ignore")
			}
		case kindKeys[key] != "":
			if a, ok := parseAction(v); ok {
				if p.Kinds == nil {
					p.Kinds = map[event.Kind]Action{}
				}
				p.Kinds[kindKeys[key]] = a
			} else {
				problem("want drain, defer or ignore")
			}
		case typeKeys[key] != "":
			a, ok := parseAction(v)
			inPlace := Action(v) == ActionRebootInPlace && RebootsInPlace(typeKeys[key])
			switch {
			case ok || inPlace:
				if inPlace {
					a = ActionRebootInPlace
				}
				if p.Scheduled == nil {
					p.Scheduled = map[event.ScheduledType]Action{}
				}
				p.Scheduled[typeKeys[key]] = a
			case Action(v) == ActionRebootInPlace:
				problem("reboot-in-place applies to %s, %s and %s only: AWS replaces the instance for %s", event.ScheduledInstanceReboot, event.ScheduledSystemReboot, event.ScheduledSystemMaintenance, typeKeys[key])
			case RebootsInPlace(typeKeys[key]):
				problem("want drain, defer, ignore or reboot-in-place")
			default:
				problem("want drain, defer or ignore")
			}
		case key == AnnotationMaxConcurrentDrains:
			if n, err := parseDrainLimit(v); err == nil {
				p.MaxConcurrentDrains = &n
			} else {
				problem("%v", err)
			}
		case key == AnnotationWindowSchedule:
			schedule = v
		case key == AnnotationWindowDuration:
			duration = v
		case key == AnnotationDrainLead:
			if d, err := parseNonNegative(v); err == nil {
				p.DrainLead = d
			} else {
				problem("%v", err)
			}
		case key == AnnotationRestartGrace:
			if d, err := parseNonNegative(v); err == nil {
				p.RestartGrace = d
			} else {
				problem("%v", err)
			}
		case key == AnnotationTaintUpcoming:
			if b, err := strconv.ParseBool(v); err == nil {
				p.TaintUpcoming = b
			} else {
				problem("want true or false")
			}
		case key == AnnotationRespectPDB:
			if b, err := strconv.ParseBool(v); err == nil {
				p.RespectPDB = b
			} else {
				problem("want true or false")
			}
		case key == AnnotationHoldWhileAlerts:
			if m, err := ParseAlertMatcher(v); err == nil {
				p.HoldWhileAlerts = m
			} else {
				problem("%v", err)
			}
		case key == AnnotationHoldWhileAlertsUnreachable:
			if v == UnreachableHold || v == UnreachableDrain {
				p.AlertsUnreachable = v
			} else {
				problem("want %s or %s", UnreachableHold, UnreachableDrain)
			}
		case key == AnnotationRepairMaxUnhealthy:
			if n, err := parseDrainLimit(v); err == nil {
				p.RepairMaxUnhealthy = n
			} else {
				problem("%v", err)
			}
		case key == AnnotationRepairMaxUnhealthyCap:
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				p.RepairMaxUnhealthyCap = n
			} else {
				problem("want a whole number of nodes, 0 or more")
			}
		case key == AnnotationReschedule:
			if b, err := strconv.ParseBool(v); err == nil {
				p.Reschedule = b
			} else {
				problem("want true or false")
			}
		case key == AnnotationDrainSettle:
			if s, err := parseSettle(v); err == nil {
				p.DrainSettle = s
			} else {
				problem("%v", err)
			}
		default:
			problem("unknown annotation")
		}
	}
	if schedule != "" || duration != "" {
		w, err := NewWindow(schedule, duration)
		if err != nil {
			p.Problems = append(p.Problems, fmt.Sprintf("maintenance window ignored: %v", err))
		} else {
			p.Window = w
		}
	}
	if p.Reschedule && p.Window == nil {
		// Nothing to move the events into: the pool's ordinary policy applies, as if unset.
		p.Reschedule = false
		p.Problems = append(p.Problems, fmt.Sprintf("%s=%q ignored: the pool has no valid maintenance window (%s and %s) to move events into",
			AnnotationReschedule, annotations[AnnotationReschedule], AnnotationWindowSchedule, AnnotationWindowDuration))
	}
	return p
}

func parseAction(v string) (Action, bool) {
	switch a := Action(v); a {
	case ActionDrain, ActionDefer, ActionIgnore:
		return a, true
	}
	return "", false
}

func parseNonNegative(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("not a duration such as 1h or 90m")
	}
	if d < 0 {
		return 0, fmt.Errorf("negative")
	}
	return d, nil
}

func parseDrainLimit(v string) (intstr.IntOrString, error) {
	n := intstr.Parse(v)
	if n.Type == intstr.Int {
		if n.IntVal < 0 {
			return n, fmt.Errorf("negative")
		}
		return n, nil
	}
	pct, ok := strings.CutSuffix(v, "%")
	var f float64
	if _, err := fmt.Sscanf(pct, "%g", &f); !ok || err != nil || f < 0 || f > 100 || math.IsNaN(f) {
		return n, fmt.Errorf("want a non-negative integer or a percentage such as 20%%")
	}
	return n, nil
}

// NewWindow parses a window. The schedule is a standard five-field cron expression in UTC,
// unless it starts with CRON_TZ= (or TZ=) and a zone name, as in Karpenter's budgets.
func NewWindow(schedule, duration string) (*Window, error) {
	if schedule == "" || duration == "" {
		return nil, fmt.Errorf("%s and %s must be set together", AnnotationWindowSchedule, AnnotationWindowDuration)
	}
	spec := schedule
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		spec = "TZ=UTC " + spec
	}
	sched, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %v", AnnotationWindowSchedule, schedule, err)
	}
	d, err := time.ParseDuration(duration)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("%s %q: want a positive duration such as 4h", AnnotationWindowDuration, duration)
	}
	return &Window{Schedule: schedule, Duration: d, sched: sched}, nil
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
func (p Policy) ActionFor(ev event.Event) (Action, string) {
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
		return 0, false // unreachable: validated in FromAnnotations
	}
	return n, true
}

// RepairCutoff returns how many of a pool's nodes may be impaired before the router stops
// replacing them: RepairMaxUnhealthy of poolNodes (a percentage rounds up), at most
// RepairMaxUnhealthyCap.
func (p Policy) RepairCutoff(poolNodes int) int {
	n, err := intstr.GetScaledValueFromIntOrPercent(&p.RepairMaxUnhealthy, poolNodes, true)
	if err != nil {
		n = 0 // unreachable: validated in FromAnnotations
	}
	return min(n, p.RepairMaxUnhealthyCap)
}
