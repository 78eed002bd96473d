package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/health-router/health-router/router/event"
)

// AnnotationDoc documents one NodePool annotation the router reads, or a family of them
// (healthrouter.io/action.<kind>: one key per event kind). Text is Markdown.
type AnnotationDoc struct {
	// Key is the annotation, or the pattern of a family.
	Key string
	// Family lists the keys of a family; nil for a single annotation.
	Family []string
	// Values says what the annotation takes; Default what the router does without it.
	Values, Default string
	// Doc says what it does.
	Doc string
}

// Keys returns the annotation keys d documents.
func (d AnnotationDoc) Keys() []string {
	if d.Family != nil {
		return d.Family
	}
	return []string{d.Key}
}

// NodePoolAnnotations documents every NodePool annotation FromAnnotations reads, in the order
// the reference lists them. docs/reference.md is generated from it (make docs), and a test
// fails when the parser reads a key this table lacks: a new annotation is one entry here.
func NodePoolAnnotations() []AnnotationDoc {
	actions := fmt.Sprintf("`%s` | `%s` | `%s`", ActionDrain, ActionDefer, ActionIgnore)
	var kindKeys, typeKeys, kinds, types []string
	for _, k := range event.InstanceKinds {
		kindKeys = append(kindKeys, ActionKey(k))
		kinds = append(kinds, "`"+string(k)+"`")
	}
	for _, t := range event.ScheduledTypes {
		typeKeys = append(typeKeys, ScheduledActionKey(t))
		types = append(types, "`"+string(t)+"`")
	}
	return []AnnotationDoc{
		{Key: AnnotationMode, Values: "`" + ModeActive + "` | `" + ModeShadow + "`", Default: "`" + ModeActive + "`",
			Doc: "`" + ModeShadow + "`: the pool's events are decided as usual and each would-be outcome recorded (in the NodeClaim's HealthRecord, an Event, `health_router_shadow_decisions_total`, `health-router status --shadow`), beside what Karpenter did; none of the pool's policy is carried out (no deferral to a window, move at EC2, reboot in place, taint or pod notice). On an active router, after the takeover, Karpenter's rules no longer feed it, so the router carries out Karpenter's behaviour for the pool (as for a pool with no annotation: a drain at once, with the replacement checks and the PodDisruptionBudget gate); under `--shadow` it carries out nothing. Any other value is a problem and the pool is active"},
		{Key: AnnotationAction, Values: actions + " (exactly, in lower case)", Default: "Karpenter's behaviour",
			Doc: "the pool's action for every event kind. Without it (and without a per-kind or per-type key) the router does what Karpenter does: drain everything actionable, record rebalance recommendations only. Any other value (`Defer`, a typo) is a problem and the safe side applies: the key's events are deferred (held to the window or deadline minus drain-lead, and paced), rebalance recommendations recorded only"},
		{Key: ActionKey("<kind>"), Family: kindKeys, Values: "same", Default: "—",
			Doc: "per kind: " + strings.Join(kinds, ", ") + ". Wins over `" + AnnotationAction + "`; an invalid value defers, as there"},
		{Key: ScheduledActionKey("<type>"), Family: typeKeys, Values: "same; or `" + string(ActionRebootInPlace) + "` for `instance-reboot`, `system-reboot`, `system-maintenance`", Default: "—",
			Doc: "per EC2 scheduled-event type: " + strings.Join(types, ", ") + ". The most specific key wins: this, then `" + ActionKey("<kind>") + "`, then `" + AnnotationAction + "`. `" + string(ActionRebootInPlace) +
				"` keeps the node through the reboot: in the window (or at deadline minus drain-lead), paced and gated as a drain, the router cordons it, evicts its pods (PDBs respected), lets AWS reboot it (reboots it itself for `instance-reboot`), and uncordons it once Ready; replaced if it is not Ready in time"},
		{Key: AnnotationWindowSchedule, Values: "cron, 5 fields", Default: "none",
			Doc: "maintenance window starts; UTC unless prefixed `CRON_TZ=Zone/Name ` (as Karpenter's budgets)"},
		{Key: AnnotationWindowDuration, Values: fmt.Sprintf("Go duration (`4h`), at most `%s`", short(MaxWindowDuration)), Default: "none",
			Doc: fmt.Sprintf("window length; set both `%s` and this, or neither. The window must close between two openings of the schedule. With a valid schedule, a duration that is missing, invalid or out of range is a problem and the window is `%s` long (no event is rescheduled into it); invalid window annotations that make no window hold a deferral with no deadline until they are fixed, rather than drain it now",
				AnnotationWindowSchedule, short(FallbackWindowDuration))},
		{Key: AnnotationDrainLead, Values: fmt.Sprintf("duration, at most `%s`", short(MaxDrainLead)), Default: "`" + short(DefaultDrainLead) + "`",
			Doc: "a deferred event drains no later than its deadline minus this, window or not. An invalid or longer value is a problem, and the default applies"},
		{Key: AnnotationRestartGrace, Values: fmt.Sprintf("duration, at most `%s`", short(MaxRestartGrace)), Default: "`" + short(DefaultRestartGrace) + "`",
			Doc: "a deferred `stopping`/`stopped` waits this long for the instance to be `running` again. An invalid or longer value is a problem, and the default applies"},
		{Key: AnnotationMaxConcurrentDrains, Values: "whole number, or whole `N%` (0–100) of the pool's nodes (rounded up)", Default: "unlimited",
			Doc: "drain pacing for non-urgent drains: a drain over the limit is held until one of the pool's drains finishes. Any other value (`12.5%`, `-3`) is a problem and paces at 1, the most conservative"},
		{Key: AnnotationRespectPDB, Values: "`true` | `false`", Default: "`true`",
			Doc: "gate: hold a non-urgent drain while a PodDisruptionBudget selecting a pod on the node allows no disruption"},
		{Key: AnnotationHoldWhileAlerts, Values: "alert-name regular expression, optionally `{label matchers}`", Default: "none",
			Doc: "gate: hold a non-urgent drain while a matching alert fires in Alertmanager (`--alertmanager-url`). An invalid expression is a problem, and the gate does what `" + AnnotationHoldWhileAlertsUnreachable + "` says, as when Alertmanager cannot be reached"},
		{Key: AnnotationHoldWhileAlertsUnreachable, Values: "`" + UnreachableHold + "` | `" + UnreachableDrain + "`", Default: "`" + UnreachableHold + "`",
			Doc: "what the alert gate does when Alertmanager cannot be reached"},
		{Key: AnnotationDrainSettle, Values: fmt.Sprintf("duration (at most `%s`), or `ready`", short(MaxDrainSettle)), Default: "`0`",
			Doc: fmt.Sprintf("how long a drain still counts as in flight for `%s` after its NodeClaim is gone; `ready`: until every pod that ran on the node (by owner) is Ready again elsewhere, at most %s (an owner whose pods never come back, a completed Job or a ReplicaSet scaled to zero, no longer holds the slot for ever). A longer duration is a problem and settles at `%s`", AnnotationMaxConcurrentDrains, longDuration(SettleReadyBound), short(MaxDrainSettle))},
		{Key: AnnotationRepairMaxUnhealthy, Values: "whole number, or whole `N%` (0–100) of the pool's nodes (rounded up)", Default: "`" + DefaultRepairMaxUnhealthy.String() + "`",
			Doc: "the impaired-instance repair cut-off: while more of the pool than this is impaired (held or being replaced for an impaired status), the router replaces none of it, as Karpenter's node repair stops at 20% and Cluster API at `maxUnhealthy`. Where the NodePool has a disruption budget naming the reason `Unhealthy` (Karpenter v1.15's node repair), the stricter of the two applies (the budget as Karpenter reads it: a count or a percentage rounded up, within its schedule; one Karpenter cannot evaluate allows none); a budget without reasons is not read. Any other value is a problem, and the default applies"},
		{Key: AnnotationRepairMaxUnhealthyCap, Values: "integer", Default: fmt.Sprintf("`%d`", DefaultRepairMaxUnhealthyCap),
			Doc: fmt.Sprintf("caps the cut-off in large pools: an AZ-wide impairment of a 1,000-node pool replaces at most %d nodes at once", DefaultRepairMaxUnhealthyCap)},
		{Key: AnnotationUrgentDrainMax, Values: "whole number, or whole `N%` (0–100) of the pool's nodes (rounded up)", Default: "none (no breaker)",
			Doc: fmt.Sprintf("the urgent-drain breaker: once this many of the pool's nodes were drained for urgent events (Spot and capacity-reservation interruptions, `shutting-down`/`terminated`) within %s, the pool's further urgent drains are held (`urgent-breaker`, re-checked every %s), with a Warning on the NodePool. Off by default: a genuine Spot reclaim can take many nodes of a pool at once, and a held warning drains nothing before the instance goes. `%s` is recommended for pools that are not Spot. Any other value is a problem, and the breaker holds at `%s`",
				short(UrgentWindow), short(UrgentRecheck), RecommendedUrgentDrainMax.String(), RecommendedUrgentDrainMax.String())},
		{Key: AnnotationTaintUpcoming, Values: "`true` | `false`", Default: "`false`",
			Doc: "while a node of the pool has a pending outcome (deferred, held), it carries the taint `healthrouter.io/maintenance-upcoming=<kind>:PreferNoSchedule`: new pods prefer other nodes, nothing is evicted for it; removed with the outcome (needs `--node-marks`, on by default)"},
		{Key: AnnotationReschedule, Values: "`true` | `false`", Default: "`false`",
			Doc: "move a scheduled event that has a deadline into the pool's maintenance window (EC2 `ModifyInstanceEventStartTime`: the window's opening plus drain-lead, at least an hour ahead, before the event's `NotBeforeDeadline`); where it cannot move, the pool's ordinary policy applies and the decision says why. Needs a window (ignored, with a problem, without one) and the Terraform module's `enable_reschedule`"},
		{Key: AnnotationEventWindow, Values: "`true` | `false`", Default: "`false`",
			Doc: "keep an EC2 event window of the pool's maintenance window (the router's `--event-windows` and the Terraform module's `enable_event_windows`): AWS then schedules new stop, reboot and retirement events of the pool's instances inside it (not expedited or network-maintenance events, nor automatic recovery). The router tags each instance `" + AnnotationEventWindow + "=<cluster>/<pool>` as its NodeClaim appears and associates the window with that tag; the window is deleted when the annotation goes. Needs a window EC2 can express (whole UTC hours, ranges of 2 h or more, 4 h a week or more, no daylight-saving zone): one it cannot is a problem on the pool (a Warning Event, `health-router doctor`) and gets no EC2 window. Without a window this is ignored, with a problem. Events AWS scheduled before keep `" + AnnotationReschedule + "` and the deferral"},
	}
}

// Annotations returns every annotation key the router reads on a NodePool: the keys
// NodePoolAnnotations documents.
func Annotations() []string {
	var keys []string
	for _, d := range NodePoolAnnotations() {
		keys = append(keys, d.Keys()...)
	}
	return keys
}

// Short writes a duration as an annotation would: 1h, 15m, 90s (the admission policy's
// generator writes its bounds with it too).
func Short(d time.Duration) string { return short(d) }

// short writes a duration as an annotation would: 1h, 15m, 90s.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// longDuration writes a whole number of minutes in words: 10 minutes.
func longDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%d minutes", int(d/time.Minute))
	}
	return short(d)
}
