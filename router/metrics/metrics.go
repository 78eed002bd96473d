// Package metrics names the router's metrics: the Prometheus series it serves on /metrics
// and the CloudWatch metrics it publishes for the dashboards and alarms. Names and label
// (dimension) keys are constants so that the Terraform dashboard can be checked against them.
package metrics

// Prometheus metric names: health_router_<subsystem>_<name>_<unit|total>.
const (
	MessagesReceived     = "health_router_intake_messages_received_total"      // labels: kind
	MessagesDeadLettered = "health_router_intake_messages_dead_lettered_total" // labels: reason
	EventLatency         = "health_router_intake_event_latency_seconds"        // histogram: event time -> outcome done
	Decisions            = "health_router_decisions_total"                     // labels: kind, action, nodepool
	DeferredEvents       = "health_router_decision_deferred_events"            // gauge
	SignalErrors         = "health_router_signal_errors_total"                 // labels: mode
	AWSCalls             = "health_router_aws_calls_total"                     // labels: api, result
	CheckResults         = "health_router_checks_results_total"                // labels: check, result
	AlreadyRecorded      = "health_router_decision_already_recorded_total"     // instances of a redelivered event whose outcome was recorded
	ForwardUnconfirmed   = "health_router_signal_forward_unconfirmed_total"    // forwards Karpenter did not act on; the NodeClaim was deleted instead
	Redecisions          = "health_router_deferral_redecisions_total"          // labels: hold
	GateHolds            = "health_router_gates_holds_total"                   // labels: gate (pdb, alerts, repair-cutoff, urgent-breaker); drains a gate held
	Unmanaged            = "health_router_decision_unmanaged_total"            // labels: kind, action; events for nodes Karpenter does not manage
	Implausible          = "health_router_decision_implausible_total"          // labels: kind; urgent events that do not fit their node (a Spot warning for an on-demand node), decided as ordinary drains
	Reschedules          = "health_router_reschedules_total"                   // label: result; scheduled events moved into a pool's window
	StateConfirmations   = "health_router_decision_state_confirmations_total"  // label: result (confirmed, contradicted, unavailable); urgent state changes checked against EC2
	CloseConfirmations   = "health_router_decision_close_confirmations_total"  // label: result (confirmed, contradicted, unavailable); AWS Health closes checked against EC2
	RecordsUnreadable    = "health_router_records_unreadable_total"            // NodeClaim records this router cannot read (kept as they are)
	WakesDropped         = "health_router_deferral_wakes_dropped_total"        // releases not queued (the wake queue was full); the recheck covers them
	EventsHeld           = "health_router_instance_events_held_total"          // label: reason; instances whose decision Events were summed up per pool
	ShadowDecisions      = "health_router_shadow_decisions_total"              // labels: kind, action, nodepool; would-be outcomes of shadow pools, nothing carried out
	ShadowKarpenter      = "health_router_shadow_karpenter_drains_total"       // labels: nodepool; NodeClaims with a would-be outcome that Karpenter drained meanwhile
	BuildInfo            = "health_router_build_info"                          // gauge, always 1; labels: version, commit, go_version, karpenter_version

	// Watchdog gauges: Karpenter states users otherwise find by accident.
	WatchdogStuckEmpty       = "health_router_watchdog_stuck_empty_nodeclaims"         // labels: nodepool
	WatchdogUnavailableImage = "health_router_watchdog_unavailable_images"             // labels: nodeclass
	WatchdogReservationDrift = "health_router_watchdog_reservation_drift_replacements" // labels: nodepool

	// Instance-status poller (DescribeInstanceStatus, as Karpenter's own poller).
	PollerPolls     = "health_router_poller_polls_total"    // labels: result (success, describe-error, handle-error)
	PollerFindings  = "health_router_poller_findings_total" // labels: finding (scheduled-event, impaired); each handed over once
	PollerInstances = "health_router_poller_instances"      // gauge: cluster instances asked about at the last poll

	// Planned maintenance (router/calendar): the drains deferred now, at their until-times.
	MaintenancePlanned         = "health_router_maintenance_planned_timestamp_seconds" // gauge, labels: nodepool, node, kind; at most calendar.DefaultSeriesLimit series, the earliest
	MaintenancePlannedOverflow = "health_router_maintenance_planned_overflow"          // gauge: planned drains left out of MaintenancePlanned by its bound
	// Webhook notifications (router/notify).
	NotifySent        = "health_router_notify_sent_total"     // notices the receiver accepted (2xx)
	NotifyFailures    = "health_router_notify_failures_total" // labels: reason (http-status, network, dropped-queue-full, gave-up)
	NotifyQueueLength = "health_router_notify_queue_length"   // gauge: notices waiting to be sent
	// Reboots in place (router/inplace).
	InPlaceRuns       = "health_router_inplace_runs_total"       // labels: outcome (done, fallback); runs ended
	InPlaceInProgress = "health_router_inplace_runs_in_progress" // gauge: runs this router (the leader) carries out
	InPlaceRefused    = "health_router_inplace_refused_total"    // runs refused: their record names another instance or node than their NodeClaim's, or EC2 does not show their maintenance
	// EC2 event windows of NodePools (router/eventwindow).
	EventWindows      = "health_router_event_windows_total"                 // labels: result (created, modified, associated, deleted, stray, inexpressible, refused, unavailable)
	EventWindowTagged = "health_router_event_window_tagged_instances_total" // instances tagged with their pool's event-window target
)

// Prometheus label names.
const (
	LabelKind      = "kind"
	LabelAction    = "action"
	LabelNodePool  = "nodepool"
	LabelReason    = "reason"
	LabelMode      = "mode"
	LabelAPI       = "api"
	LabelResult    = "result"
	LabelCheck     = "check"
	LabelNodeClass = "nodeclass"
	LabelHold      = "hold"
	LabelFinding   = "finding"
	LabelGate      = "gate"
	LabelNode      = "node"
	LabelOutcome   = "outcome"

	// Labels of BuildInfo (router/version).
	LabelVersion          = "version"
	LabelCommit           = "commit"
	LabelGoVersion        = "go_version"
	LabelKarpenterVersion = "karpenter_version"
)

// CloudWatchNamespace is the namespace of every CloudWatch metric the router and the
// dispatcher Lambda publish.
const CloudWatchNamespace = "HealthRouter"

// CloudWatch metric names. Every router metric carries the ClusterName dimension.
const (
	CWDecisions      = "Decisions"        // Count; dimensions: ClusterName, Kind, Action
	CWDeferredEvents = "DeferredEvents"   // Count (gauge, the latest value); dimensions: ClusterName
	CWDeadLettered   = "DeadLettered"     // Count; dimensions: ClusterName
	CWEventLatency   = "EventLatency"     // Milliseconds; dimensions: ClusterName
	CWAWSCallErrors  = "AWSCallErrors"    // Count; dimensions: ClusterName, API
	CWHeartbeat      = "Heartbeat"        // Count, 1 per publish interval; dimensions: ClusterName
	CWWatchdog       = "WatchdogFindings" // Count (gauge, the latest value); dimensions: ClusterName, Finding

	// Published by the dispatcher Lambda.
	CWDispatcherRouted  = "DispatcherRouted"  // Count; dimensions: ClusterName
	CWDispatcherDropped = "DispatcherDropped" // Count; no dimension
)

// CloudWatch dimension names.
const (
	DimClusterName = "ClusterName"
	DimKind        = "Kind"
	DimAction      = "Action"
	DimAPI         = "API"
	DimFinding     = "Finding" // stuck-empty, unavailable-image, reservation-drift
)

// CloudWatchDimensions lists, for each CloudWatch metric, the dimension names it is
// published with, in order. The dashboard and alarms must use exactly these.
var CloudWatchDimensions = map[string][]string{
	CWDecisions:         {DimClusterName, DimKind, DimAction},
	CWDeferredEvents:    {DimClusterName},
	CWDeadLettered:      {DimClusterName},
	CWEventLatency:      {DimClusterName},
	CWAWSCallErrors:     {DimClusterName, DimAPI},
	CWHeartbeat:         {DimClusterName},
	CWWatchdog:          {DimClusterName, DimFinding},
	CWDispatcherRouted:  {DimClusterName},
	CWDispatcherDropped: {},
}

// CloudWatchMetric documents one CloudWatch metric, for the reference (docs/reference.md).
type CloudWatchMetric struct {
	Name, Unit string
	// Prometheus names the Prometheus series it is published from; empty for none.
	Prometheus string
	Doc        string
}

// CloudWatchMetrics documents every metric of CloudWatchDimensions, in the order the
// reference lists them; a test fails when one is missing.
func CloudWatchMetrics() []CloudWatchMetric {
	return []CloudWatchMetric{
		{Name: CWDecisions, Unit: "Count", Prometheus: Decisions, Doc: "decisions, by kind and action"},
		{Name: CWDeferredEvents, Unit: "Count (the latest value)", Prometheus: DeferredEvents, Doc: "deferrals held now"},
		{Name: CWDeadLettered, Unit: "Count", Prometheus: MessagesDeadLettered, Doc: "messages the router dead-lettered"},
		{Name: CWEventLatency, Unit: "Milliseconds", Prometheus: EventLatency, Doc: "event time to outcome done, events not deferred"},
		{Name: CWAWSCallErrors, Unit: "Count", Prometheus: AWSCalls, Doc: "AWS calls that failed after the SDK's retries, by API"},
		{Name: CWWatchdog, Unit: "Count (the latest value)", Prometheus: WatchdogStuckEmpty + ", " + WatchdogUnavailableImage + ", " + WatchdogReservationDrift,
			Doc: "watchdog findings, by finding (stuck-empty, unavailable-image, reservation-drift)"},
		{Name: CWHeartbeat, Unit: "Count", Doc: "1 per publish interval, from the leader: the \"router silent\" alarm"},
		{Name: CWDispatcherRouted, Unit: "Count", Doc: "events the dispatcher Lambda sent to a cluster's intake queue, by cluster"},
		{Name: CWDispatcherDropped, Unit: "Count", Doc: "instances the dispatcher Lambda dropped: no configured cluster owns them"},
	}
}
