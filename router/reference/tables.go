package reference

import (
	"fmt"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/router/watchdog"
)

// Written is one key the router writes on an object it does not own: an annotation or label
// on a NodeClaim or Node, or an attribute of a message it sends. Text is Markdown.
type Written struct {
	Key string
	// On is where: "NodeClaim annotation", "Node label", ...
	On  string
	Doc string
}

// WrittenKeys documents every annotation and label the router writes, and the attributes of
// the messages it dead-letters. A test fails when the code declares a healthrouter.io/ key
// that neither this table nor policy.NodePoolAnnotations documents: a new one is one entry.
func WrittenKeys() []Written {
	return []Written{
		{Key: record.Resource + "." + record.Group, On: "custom resource (`HealthRecord`, cluster-scoped, one per NodeClaim, and one per Node Karpenter does not manage that the router drains)",
			Doc: fmt.Sprintf("the router's memory of a NodeClaim (`router/record`), named as the NodeClaim, owned by it (the garbage collector removes it with the NodeClaim; the router sweeps what it misses), written by the router's ServiceAccount only (the chart grants no one else a write; `view` reads it): `spec` names the NodeClaim, its instance, Node and pool; `status` holds `version` (%d), the `records` (`[{event_id, key, kind, until, reason, state, hold, image, pdbs, match, event_time, event, communication, moved_from, start}]`: a deferred event is held there, restricted to this instance, with its until-time and hold, and the leader's deferral controller decides it again when due; ended records (`%s`, `%s`, `%s`, `%s`) keep no event body, at most the %d newest), `running` (the last `running` state change handled), `drain` (`{eventID, at, via}`: the drain the router signalled Karpenter, `via` `forward` or `delete-nodeclaim`; past the confirmation bound the router deletes the NodeClaim), `nodeDrain` (the router's own drain of a Node Karpenter does not manage: see `%s`; only in the Node's record, named `%s<node>`, with `spec.nodeName` and the instance but no NodeClaim, owned by the Node, so that the garbage collector removes it with the Node; its summary: `%s` with action `%s` while pods are evicted, `%s` with action `%s` once done and held for AWS's reboot), and a summary for `kubectl get healthrecords` (`phase`: `%s`, `%s`, `%s` or `%s`; `event`, `kind`, `start`, `action`, `when`). Bounded to %d KiB. A record of a newer format is kept as it is. Nothing on the NodeClaim is read as this memory: the keys routers before it used (`%s`, `%s`) are adopted once at an upgrade (a deferral only when EC2 still schedules its maintenance, and then decided again at once; never a stamp or a tombstone) and removed",
				record.Version, record.StateCancelled, record.StateSuperseded, record.StateDrained, record.StateClosed, record.EndedKept,
				nodedrain.AnnotationNodeDrain, record.NodePrefix, record.PhaseDraining, record.ActionCordonDrain, record.PhaseIdle, record.ActionHoldUntilRelease,
				record.PhaseDraining, record.PhaseInPlace, record.PhaseDeferred, record.PhaseIdle, record.MaxBytes>>10, record.Annotation, record.AnnotationDrainSignalled)},
		{Key: record.Annotation, On: "NodeClaim annotation (routers before the store; no longer written)",
			Doc: "the records routers before the `healthrecords` store kept on the NodeClaim: never read as the router's memory; adopted once at an upgrade (see `healthrecords.healthrouter.io`) and removed"},
		{Key: record.AnnotationDrainSignalled, On: "NodeClaim annotation (routers before the store; no longer written)",
			Doc: "the drain stamp routers before the store kept on the NodeClaim: never read, never adopted (it would delete the NodeClaim); removed at an upgrade"},
		{Key: nodedrain.AnnotationNodeDrain, On: "HealthRecord `status.nodeDrain` of the Node's record (a Node annotation in routers before the store: no longer read or written; adopted once at an upgrade as EC2 confirms it, and removed)",
			Doc: "the record (JSON: event, its key and maintenance, kind, start, bound, release, done, attempts, last error, whether the router cordoned, and `also`: the other scheduled maintenances AWS reported while the drain was on, each with its keys and release: the drain holds the Node until the last of them is over, and a close of its own event hands it to the next) of a drain the router carries out itself on a Node Karpenter does not manage (`--unmanaged-nodes=cordon-drain`); it lives in the Node's `HealthRecord` (`node.<node>`), which only the router writes, so a restarted or newly elected router resumes it, and nothing anyone writes on the Node is an order to drain it. The annotation routers before the store kept it in is not read: a router that starts beside one adopts it once, only while EC2 schedules an event for the instance or the instance is not running, and removes it; otherwise the drain ends (a Warning `HealthEventNodeDrainNotAdopted` on the Node, which is left as it is: a cordon stays, as the annotation cannot say who set it). The router also cordons the Node (`spec.unschedulable`, decided on the Node read fresh; the record is written first, and the cordon goes before the record) and uncordons only what it cordoned: when the maintenance closes, when the instance runs again after the stop it was drained for, or after a reboot AWS kept the instance through (past the release, the Node Ready). A `running` handled with no drain in progress is kept in it (`running: true`, nothing cordoned), so that an older stop arriving late begins no drain; so is a close of a maintenance the Node has no drain for (`closed: true`, nothing cordoned), so that an older report of the same event or maintenance arriving late begins none"},
		{Key: inplace.Annotation, On: "HealthRecord `status.run` (a NodeClaim annotation in routers before the store: adopted once at an upgrade as EC2 confirms it, a step that reboots or empties started again from the cordon, and removed)",
			Doc: fmt.Sprintf("the run of a reboot in place (pool action `reboot-in-place`; `router/inplace`): versioned JSON (`\"version\": %d`) `{event_id, event_arn, type, instance, node, start, end, moved_from, step, began, step_since, attempts, last_error, cordoned, protected, node_protected, repair_vetoed, node_repair_vetoed, node_changes, node_uid, boot_id, rebooted, reboot_asked, not_ready_since, migration, migration_why, why, outcome}`; `step` is one of `%s`, `%s`, `%s`, `%s`, `%s`, `%s`, `%s`, `%s`, `%s`, `%s`, `%s` (`wait`: the Node serves until shortly before AWS's start; `release`: a postponed maintenance gives an emptied Node back; `confirm`: after the router's reboot of a `system-reboot` for reboot migration, EC2 is asked that the event is gone; `migration`: `on`/`off`, whether a `system-reboot` is rebooted by the router; `moved_from`: the start the router moved the maintenance from, whose close ends the run too). The leader resumes a run from it, and acts only if its `instance` and `node` are the NodeClaim's own. When the run ends it stays as a tombstone with `outcome` (`done`, `done: <note>` or `fallback: <why>`), so that the same event at the same start does not start it again; a run of another event, or of the same one at a new start, replaces it; a close of its maintenance before the reboot ends it. While the run is in progress the router also puts `karpenter.sh/do-not-disrupt: \"true\"` and `karpenter.sh/do-not-repair: \"true\"` on the NodeClaim (`protected`, `repair_vetoed`: it added them, and removes only those)",
				inplace.Version, inplace.StepWait, inplace.StepRelease, inplace.StepCordon, inplace.StepEvict, inplace.StepReboot, inplace.StepAwait, inplace.StepReady, inplace.StepConfirm, inplace.StepUncordon, inplace.StepDone, inplace.StepFallback)},
		{Key: shadow.Annotation, On: "NodeClaim annotation",
			Doc: fmt.Sprintf("the would-be outcomes of a pool in shadow (`router/shadow`): versioned JSON `{\"version\": %d, \"outcomes\": [{event_id, key, match, kind, state: \"%s\", action, at, hold, reason, decided}]}`, the %d newest. Apart from the records: nothing the router acts on reads it, so a pool taken out of shadow decides its next events as if it had never been in shadow. The same outcomes, with when Karpenter drained each NodeClaim, are kept in the shadow ledger, the HealthRecord `ledger.<fullname>-shadow` (`--shadow-ledger`; `status.ledger`, the %d newest within %d KiB), read by `health-router status --shadow`; routers before the store kept it in the ConfigMap `<fullname>-shadow` of the router's namespace (key `%s`), which the leader adopts once (its entries marked as unverified in the report) and deletes",
				shadow.Version, shadow.State, shadow.Kept, shadow.MaxEntries, record.LedgerMaxBytes>>10, shadow.LedgerKey)},
		{Key: inplace.Annotation, On: "Node annotation",
			Doc: "during a reboot in place, what the run changed on the Node, JSON `{event_id, cordoned, protected, repair_vetoed}`, written in the same patch as the change, for people to read: the cordon (`spec.unschedulable`), `karpenter.sh/do-not-disrupt` and `karpenter.sh/do-not-repair` (which Karpenter reads on a registered node, not on its NodeClaim: v1.15's node repair is not stopped by do-not-disrupt, and the reboot makes the Node NotReady on purpose). Never read back (anyone with `patch nodes` writes it): what the run changes is recorded in its HealthRecord (`node_changes`, read from the Node before the cordon's patch, then `cordoned`, `node_protected`, `node_repair_vetoed`), and the undo lifts the cordon and removes the vetoes only where that record says the run set them; after a fallback the Node stays cordoned. Removed with the undo; `handback` removes one no NodeClaim's run holds and leaves the Node's cordon and vetoes as they are"},
		{Key: upcoming.LabelMaintenanceAt, On: "Node label",
			Doc: "the planned time (Unix seconds) of the node's earliest pending outcome (a deferral to the window or to deadline minus drain-lead, a drain held by pacing, a check or a gate), as GKE's `cloud.google.com/scheduled-maintenance-time`; removed when nothing is pending any more (`--node-marks`)"},
		{Key: upcoming.AnnotationMaintenance, On: "Node annotation",
			Doc: "what is pending on the node, JSON `{kind, event, decision, hold, until, records}` (the earliest active record, and how many there are); removed with the label"},
		{Key: upcoming.TaintKey, On: "Node taint (`PreferNoSchedule`, value: the event kind)",
			Doc: "in a pool annotated `" + policy.AnnotationTaintUpcoming + "=true`, while the node has a pending outcome: new pods prefer other nodes, nothing is evicted for it; removed with the label"},
		{Key: eventwindow.TagInstance, On: "EC2 instance tag",
			Doc: "`<cluster>/<pool>` (`--cluster-name`, the NodeClaim's `karpenter.sh/nodepool`): on each instance of a pool annotated `" + policy.AnnotationEventWindow + "=true`, put as its NodeClaim appears (`--event-windows`); the target of the pool's EC2 event window. Karpenter's own `karpenter.sh/nodepool` tag is account-wide: two clusters with a pool of the same name would share a window. Left on the instance when the window goes"},
		{Key: eventwindow.TagCluster, On: "EC2 event window tag", Doc: "the cluster (`--cluster-name`) whose router keeps the window; the router finds its windows by it, and the Terraform module's grant lets it change only windows that carry it"},
		{Key: eventwindow.TagNodePool, On: "EC2 event window tag", Doc: "the NodePool the window is kept for (named `hr-<cluster>-<pool>`)"},
		{Key: intake.AttrReason, On: "dead-letter message attribute",
			Doc: "why the router could not act on the message: the parser's reason (`malformed`, `unknown-kind`, `unsupported`, `invalid`, `foreign`, `oversized`), `unrecordable`, `retries-exhausted`, or `foreign-sender` (a SenderId not in `--sender-ids`)"},
		{Key: intake.AttrDetail, On: "dead-letter message attribute", Doc: "the reason in words (for `retries-exhausted`, the last error); it begins `body truncated` when the body was cut to fit SQS's size limit"},
		{Key: intake.AttrSourceMessageID, On: "dead-letter message attribute", Doc: "the SQS message ID of the message in the intake queue"},
		{Key: intake.AttrReceiveCount, On: "dead-letter message attribute", Doc: "how many times the intake queue delivered it"},
		{Key: intake.AttrOriginalSize, On: "dead-letter message attribute", Doc: "only when the body was truncated (body and attributes must fit SQS's 256 KiB): the size in bytes of the body as received"},
		{Key: intake.AttrBodySHA256, On: "dead-letter message attribute", Doc: "only when the body was truncated: the SHA-256 (hex) of the body as received"},
	}
}

// Event is one Kubernetes Event reason the router posts. Text is Markdown.
type Event struct {
	Reason string
	// On names the objects it is posted on; Type is Normal, Warning, or both.
	On, Type string
	Doc      string
}

// Events documents every Kubernetes Event reason the router posts (events.k8s.io). A test
// fails when the code declares a Reason constant this table lacks: a new one is one entry.
func Events() []Event {
	const perInstance = "Node and NodeClaim; for an event naming more than 10 instances, one on the NodePool per action instead"
	const normalOrWarning = "Normal (Warning when the decision carries warnings)"
	return []Event{
		{Reason: signal.ReasonDrained, On: perInstance, Type: normalOrWarning, Doc: "the router drained the instance: signalled Karpenter (forwarded, or the NodeClaim deleted)"},
		{Reason: signal.ReasonDeferred, On: perInstance, Type: normalOrWarning, Doc: "the router deferred the event for the instance: until-time and why"},
		{Reason: signal.ReasonIgnored, On: perInstance, Type: normalOrWarning, Doc: "the pool ignores this event: AWS acts, or nothing needs doing"},
		{Reason: signal.ReasonDeferralCancelled, On: "Node and NodeClaim", Type: "Normal", Doc: "an event cancelled deferrals of the instance: a `running` state change, a closed Health event, a `[Completed]`/`[Canceled]` scheduled event"},
		{Reason: signal.ReasonForwardUnconfirmed, On: "NodeClaim", Type: "Warning", Doc: "Karpenter did not start deleting a NodeClaim whose drain was forwarded within `--forward-confirm-timeout`: the router deleted it itself"},
		{Reason: signal.ReasonDeferralDropped, On: "NodeClaim", Type: "Warning", Doc: "a record whose event no longer parses (edited by hand, for example) was dropped"},
		{Reason: signal.ReasonRecordUnreadable, On: "NodeClaim", Type: "Warning", Doc: "the NodeClaim's records are a newer router's, or damaged: kept as they are, and the write refused"},
		{Reason: signal.ReasonRescheduled, On: "Node and NodeClaim", Type: "Normal", Doc: "the router moved the instance's scheduled event into its pool's window (`healthrouter.io/reschedule`): the EC2 event, its former and new start, the window opening and drain-lead"},
		{Reason: app.ReasonQueueUnusable, On: "the router's Pod", Type: "Warning", Doc: "a queue makes the router NotReady (missing, denied, or the credentials refused): which queue and AWS's error; the router keeps checking with backoff (`--pod-name`/`--pod-namespace`, set by the chart)"},
		{Reason: app.ReasonQueueUsable, On: "the router's Pod", Type: "Normal", Doc: "every queue is usable again: the router is ready"},
		{Reason: signal.ReasonShadow, On: "Node and NodeClaim", Type: "Normal", Doc: "a pool in shadow (`healthrouter.io/mode=shadow`, or `--shadow`): what the router would have done with the event (drain, deferral until when, reboot in place, ignore) and why; nothing was carried out"},
		{Reason: signal.ReasonNotManaged, On: "Node", Type: "Warning", Doc: "an event for a node Karpenter does not manage (no NodeClaim), and what `--unmanaged-nodes` did about it"},
		{Reason: signal.ReasonInvalidAnnotation, On: "NodePool", Type: "Warning", Doc: "`healthrouter.io/` annotations of the pool were ignored (invalid or out-of-range values, unknown keys): one Event listing every problem and what applies instead, cut at the API server's 1,024 bytes (`health-router status` lists them all)"},
		{Reason: signal.ReasonUrgentDrainsHeld, On: "NodePool", Type: "Warning", Doc: "the pool's urgent-drain breaker (`healthrouter.io/urgent-drain-max`) holds an urgent drain: how many of the pool's nodes were drained for urgent events within the minute, and the breaker's limit (health_router_gates_holds_total{gate=\"urgent-breaker\"})"},
		{Reason: signal.ReasonReplacementUnsound, On: "EC2NodeClass", Type: "Warning", Doc: "an urgent drain went ahead although a pre-signal check found the replacement unsound"},
		{Reason: podnotice.ReasonDeferred, On: "Pod (each pod a drain would evict; at most 110 per node and `--pod-events-per-event` per event)", Type: "Normal",
			Doc: "the pod's node will be drained for an event: when (the planned time), why (the hold), and when AWS acts; for the workload's owner (`kubectl describe pod`, `kubectl get events -n team`)"},
		{Reason: podnotice.ReasonDrain, On: "Pod (same bounds)", Type: "Normal", Doc: "the pod's node is being drained now: the pod will be evicted and rescheduled elsewhere"},
		{Reason: podnotice.ReasonSummary, On: "Namespace (in the namespace)", Type: "Normal",
			Doc: "the pods of the namespace past the bounds of pod Events, counted (pods, nodes), with one example of the decision"},
		{Reason: nodedrain.ReasonNodeDrained, On: "Node", Type: "Normal", Doc: "the router's own drain of an unmanaged node is done: no evictable pod is left"},
		{Reason: nodedrain.ReasonNodeDrainBlocked, On: "Node", Type: "Warning", Doc: "a PodDisruptionBudget still refuses an eviction past the drain's deadline; the router keeps trying and never overrides the budget"},
		{Reason: nodedrain.ReasonNodeDrainEnded, On: "Node", Type: "Normal", Doc: "the drain ended without the instance going away: its maintenance was cancelled, or AWS's reboot is over and the Node Ready; the Node is uncordoned where the router cordoned it"},
		{Reason: nodedrain.ReasonNodeDrainNotAdopted, On: "Node", Type: "Warning", Doc: "at an upgrade, a drain routers before the store kept on the Node (`healthrouter.io/node-drain`) was not adopted: EC2 schedules nothing for the instance and it runs (a forged or stale annotation); the annotation is removed and the Node left as it is: a cordon stays (the annotation, which anyone with `patch nodes` writes, cannot say who cordoned it; the Event names `kubectl uncordon`)"},
		{Reason: nodedrain.ReasonNodeDrainFeatureOff, On: "Node", Type: "Warning", Doc: "the router runs without `--unmanaged-nodes=cordon-drain`, and the Node carries a drain an earlier router began: it is carried to its end (a close still ends it); no new one begins. Once per drain and process"},
		{Reason: inplace.ReasonBegun, On: "Node and NodeClaim", Type: "Normal", Doc: "a reboot in place began: the plan (cordon, evict by start minus margin, then the router's reboot or AWS's at the start) and when AWS acts"},
		{Reason: inplace.ReasonRebooting, On: "Node and NodeClaim", Type: "Normal", Doc: "the pods are evicted and the router rebooted the instance (EC2 `RebootInstances`), or, for a system event, the Node went NotReady after the start: AWS's maintenance is under way"},
		{Reason: inplace.ReasonRebootFailed, On: "Node and NodeClaim", Type: "Warning", Doc: "`RebootInstances` kept failing (the last error): AWS reboots the instance at the event's start, and the run waits for that with the Node cordoned and empty"},
		{Reason: inplace.ReasonDone, On: "Node and NodeClaim", Type: "Normal", Doc: "the Node is Ready again after the reboot (or stayed Ready through a maintenance with no visible effect): uncordoned, do-not-disrupt and do-not-repair removed where the router set them; the node was kept"},
		{Reason: inplace.ReasonFallback, On: "Node and NodeClaim", Type: "Warning", Doc: "the reboot in place gave up (pods not evicted by the start minus margin, the Node not Ready again within the ready timeout, no reboot seen, the Node gone): the node is replaced through the pool's ordinary drain; it stays cordoned, do-not-disrupt and do-not-repair removed"},
		{Reason: inplace.ReasonMigrated, On: "Node and NodeClaim", Type: "Normal", Doc: "the router's reboot of a `system-reboot` moved the instance to new hardware (reboot migration, `rebootMigration` default): EC2's `DescribeInstanceStatus` no longer shows the event; the node goes back into service in the pool's window instead of waiting for AWS's start"},
		{Reason: inplace.ReasonNotMigrated, On: "Node and NodeClaim", Type: "Warning", Doc: "EC2 still shows the `system-reboot` after the router's reboot (the migration did not happen, EC2 rebooted in place): AWS reboots the instance at the start; the Node serves until the run prepares for that, or, with the start nearer than the preparation, stays out of service until then"},
		{Reason: inplace.ReasonCancelled, On: "NodeClaim", Type: "Normal", Doc: "the maintenance of a reboot in place was cancelled before the reboot: the Node goes back into service (uncordoned, do-not-disrupt removed where the router set them)"},
		{Reason: inplace.ReasonRefused, On: "NodeClaim (and Node, for a reboot not made)", Type: "Warning", Doc: "a reboot-in-place record names another instance or Node than its NodeClaim's own: left alone, nothing rebooted, cordoned or evicted; or, before the router's `RebootInstances`, EC2's `DescribeInstanceStatus` does not show the maintenance the run is for (an open event of its type, with its EC2 event ID or start): not rebooted, the Node given back, the run ends (health_router_inplace_refused_total)"},
		{Reason: eventwindow.ReasonSynced, On: "NodePool", Type: "Normal", Doc: "the pool's EC2 event window was created, or its time ranges changed with the pool's window (`healthrouter.io/event-window`): the window, its ranges in UTC and its instance tag"},
		{Reason: eventwindow.ReasonProblem, On: "NodePool", Type: "Warning", Doc: "the pool gets no EC2 event window, or not the one it asks for: EC2 cannot express its window (the reason), or refused a call (its 200 windows a region, the tag already another window's target, a denial) or did not answer; tried again with backoff (1m doubling to 1h), told once per problem. Also when the pool's window targeted something the router did not associate (another tag, instance IDs, Dedicated Hosts): taken off, and named. AWS keeps its own timing; the deferral applies (health_router_event_windows_total)"},
		{Reason: watchdog.ReasonStuckEmpty, On: "NodePool", Type: "Warning", Doc: "watchdog: nodes of the pool have been empty past `consolidateAfter` and Karpenter does not remove them"},
		{Reason: watchdog.ReasonImageUnavailable, On: "EC2NodeClass", Type: "Warning", Doc: "watchdog: images in `status.amis` that EC2 does not report `available`"},
		{Reason: watchdog.ReasonReservationDriftLoop, On: "NodePool", Type: "Warning", Doc: "watchdog: reserved NodeClaims replaced as drifted again and again with the `ReservedCapacity` gate off (Karpenter's replacement loop)"},
	}
}
