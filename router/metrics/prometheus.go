package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/version"
)

// Router holds the router's Prometheus collectors.
type Router struct {
	Received     *prometheus.CounterVec
	DeadLettered *prometheus.CounterVec
	Latency      prometheus.Histogram
	Decisions    *prometheus.CounterVec
	SignalErrors *prometheus.CounterVec
	CheckResults *prometheus.CounterVec
	// AlreadyRecorded counts instances skipped on a redelivery: their outcome was recorded
	// before (progress that survives a retry).
	AlreadyRecorded    prometheus.Counter
	ForwardUnconfirmed prometheus.Counter
	Redecisions        *prometheus.CounterVec
	// GateHolds counts drains held by a gate (policy.ApplyGates returned a defer with Hold
	// pdb or alerts), by gate.
	GateHolds *prometheus.CounterVec
	// Unmanaged counts events for nodes Karpenter does not manage, by kind and action.
	Unmanaged *prometheus.CounterVec
	// ShadowDecisions counts the would-be outcomes of shadow pools; ShadowKarpenter the
	// NodeClaims among them Karpenter drained meanwhile.
	ShadowDecisions *prometheus.CounterVec
	ShadowKarpenter *prometheus.CounterVec
	// Implausible counts urgent events that do not fit their node, by kind.
	Implausible *prometheus.CounterVec
	// StateConfirmations counts urgent state changes checked against EC2, by result.
	StateConfirmations *prometheus.CounterVec
	// CloseConfirmations counts closed AWS Health reports checked against EC2, by result.
	CloseConfirmations *prometheus.CounterVec
	RecordsUnreadable  prometheus.Counter
	WakesDropped       prometheus.Counter
	// EventsHeld counts the instances whose decision Events went over
	// --instance-events-per-second, by Event reason; they are told in a summary per pool.
	EventsHeld *prometheus.CounterVec
	// Reschedules counts the attempts to move a scheduled event into its pool's window
	// (healthrouter.io/reschedule), by result.
	Reschedules *prometheus.CounterVec
}

// NewRouter creates the collectors and registers them with reg. deferred reports the
// number of deferrals held now (read from the cluster, so that it survives restarts).
func NewRouter(reg prometheus.Registerer, deferred func() float64) *Router {
	m := &Router{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MessagesReceived, Help: "Intake messages received, by event kind (unknown for those that do not parse).",
		}, []string{LabelKind}),
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MessagesDeadLettered, Help: "Intake messages sent to the dead-letter queue, by reason (the parser's, plus unrecordable, retries-exhausted and foreign-sender).",
		}, []string{LabelReason}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: EventLatency, Help: "Seconds from the event's time to its outcome being done (signalled, ignored, skipped), for events not deferred.",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Decisions, Help: "Decisions, one per event and instance, by kind, action and NodePool.",
		}, []string{LabelKind, LabelAction, LabelNodePool}),
		SignalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: SignalErrors, Help: "Failures to carry out a decision (signal Karpenter, record a deferral), by signalling mode (forward, delete-nodeclaim).",
		}, []string{LabelMode}),
		CheckResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: CheckResults, Help: "Pre-signal check outcomes, by check and result (passed, failed, unavailable).",
		}, []string{LabelCheck, LabelResult}),
		AlreadyRecorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: AlreadyRecorded, Help: "Instances of a redelivered event (or of a maintenance reported by both AWS Health and EC2's instance status) not decided again: their outcome is recorded on the NodeClaim.",
		}),
		ForwardUnconfirmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: ForwardUnconfirmed, Help: "Drains forwarded to Karpenter's queue that Karpenter did not act on within the confirmation bound; the router deleted the NodeClaim instead.",
		}),
		Redecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Redecisions, Help: "Deferrals decided again when due or released, by what they waited for (hold).",
		}, []string{LabelHold}),
		GateHolds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: GateHolds, Help: "Drains held by a gate (a PodDisruptionBudget at zero, a matching alert firing or Alertmanager unreachable under hold, an impaired-instance repair over the pool's cut-off, an urgent drain over the pool's urgent-drain breaker), by gate (pdb, alerts, repair-cutoff, urgent-breaker).",
		}, []string{LabelGate}),
		ShadowDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ShadowDecisions, Help: "Would-be outcomes of pools in shadow (healthrouter.io/mode=shadow, or --shadow), by kind, action and nodepool: decided and recorded; under --shadow nothing is carried out, a pool in shadow on an active router gets Karpenter's behaviour.",
		}, []string{LabelKind, LabelAction, LabelNodePool}),
		ShadowKarpenter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ShadowKarpenter, Help: "NodeClaims with a would-be outcome of a pool in shadow that began deleting meanwhile (Karpenter's own handling drained them), by nodepool: health-router status --shadow pairs each with what the router would have done.",
		}, []string{LabelNodePool}),
		Implausible: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Implausible, Help: "Urgent events that do not fit the node they name (a Spot interruption warning for a node that is not Spot, a capacity-reservation interruption for one that is not reserved), by kind: decided as ordinary drains, paced and gated, and never forwarded to Karpenter.",
		}, []string{LabelKind}),
		CloseConfirmations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: CloseConfirmations, Help: "Closed AWS Health reports of a maintenance EC2 schedules, checked against EC2's DescribeInstanceStatus before they end what holds it (deferrals, runs, drains), by result: confirmed (EC2 shows the event closed, at another start, or not at all), contradicted (EC2 still schedules it: kept, with a warning) or unavailable (EC2 did not answer: the message is tried again, the deferral kept meanwhile).",
		}, []string{LabelResult}),
		StateConfirmations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: StateConfirmations, Help: "Instance state changes (shutting-down, terminated; stopping, stopped) checked against EC2's DescribeInstanceStatus before they are trusted, by result: confirmed (EC2 shows the instance not running, or no longer knows it), contradicted (EC2 shows it running or pending: an urgent one is decided as an ordinary drain, counted in health_router_decision_implausible_total too; a stop is over and ignored) or unavailable (EC2 did not answer: an urgent one is tried again for 90 s, then acted on as claimed with a warning; each try counts).",
		}, []string{LabelResult}),
		Unmanaged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Unmanaged, Help: "Decisions for nodes Karpenter does not manage (a Node without a NodeClaim), by kind and action (skip under --unmanaged-nodes=ignore, drain under cordon-drain).",
		}, []string{LabelKind, LabelAction}),
		RecordsUnreadable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: RecordsUnreadable, Help: "Writes refused because a NodeClaim's records cannot be read by this router (a newer router's, or damaged): the records are kept as they are.",
		}),
		WakesDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: WakesDropped, Help: "Releases of held deferrals not queued because the wake queue was full; the periodic recheck and each record's own time cover them.",
		}),
		EventsHeld: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: EventsHeld, Help: "Instances whose decision Events (on the Node and the NodeClaim) went over --instance-events-per-second, by Event reason: they are told in one Event per NodePool and reason every 30s, and their records stay on their NodeClaims.",
		}, []string{LabelReason}),
		Reschedules: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Reschedules, Help: "Scheduled events of pools annotated healthrouter.io/reschedule=true the router tried to move into the pool's window, by result: moved, in-window (already there), not-moved (no deadline, too close, no opening before the deadline, no open event), refused (EC2 refused the call) or unavailable (EC2 did not answer; the ordinary policy applied, or, for a report that would put an active record's maintenance later, the message is retried).",
		}, []string{LabelResult}),
	}
	// Which build is running, as Prometheus exporters say it: one series at 1, the build in
	// its labels, so that a query can join it (group_left) or count the versions of a fleet.
	v := version.Get()
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: BuildInfo, Help: "Always 1; the labels say which build of the router is running: its version and commit, the Go version and the Karpenter API (sigs.k8s.io/karpenter) version it is built with.",
	}, []string{LabelVersion, LabelCommit, LabelGoVersion, LabelKarpenterVersion})
	build.WithLabelValues(v.Version, v.Commit, v.GoVersion, v.KarpenterVersion).Set(1)
	reg.MustRegister(build, m.Received, m.DeadLettered, m.Latency, m.Decisions, m.SignalErrors, m.CheckResults, m.AlreadyRecorded, m.ForwardUnconfirmed, m.Redecisions, m.GateHolds, m.Unmanaged, m.Implausible, m.ShadowDecisions, m.ShadowKarpenter, m.StateConfirmations, m.CloseConfirmations, m.RecordsUnreadable, m.WakesDropped, m.EventsHeld, m.Reschedules,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: DeferredEvents, Help: "Deferrals held now: the active records on NodeClaims, as the leader's deferral controller holds them."}, deferred))
	return m
}
