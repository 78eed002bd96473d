// Package app wires the live router: AWS clients, the controller-runtime manager (cache,
// leader election, probes, metrics), the engine, the signaller and the intake.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/aws/smithy-go/middleware"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/calendar"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/cwmetrics"
	"github.com/health-router/health-router/router/deferral"
	"github.com/health-router/health-router/router/engine"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/gates"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/nodedrain"
	"github.com/health-router/health-router/router/notify"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/pipeline"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/poller"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/reschedule"
	"github.com/health-router/health-router/router/shadow"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/status"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/router/version"
	"github.com/health-router/health-router/router/watchdog"
)

// Run runs the router against the cluster at restCfg until ctx is done. Metrics are
// registered with reg (controller-runtime's metrics.Registry in production, which the
// manager serves on /metrics).
func Run(ctx context.Context, o options.Run, restCfg *rest.Config, reg prometheus.Registerer, log *slog.Logger) error {
	// A malformed queue URL is a mistake in the pod's spec: refused at once, with the flag
	// named, rather than retried (before anything is set up, the process-wide loggers included:
	// controller-runtime takes the first logger it is given).
	for _, q := range []struct{ flag, url string }{{"--queue-url", o.QueueURL}, {"--dead-letter-queue-url", o.DeadLetterQueueURL}, {"--karpenter-queue-url", o.KarpenterQueueURL}} {
		if q.url == "" {
			continue
		}
		if _, err := awscalls.ParseQueueURL(q.url); err != nil {
			return fmt.Errorf("%s: %w", q.flag, err)
		}
	}
	routeLogs(ctx, log)
	scheme, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	calls := awscalls.NewCounter(reg)
	// The CloudWatch publisher exists before the AWS clients so that they report failed calls
	// to it; it stays nil (its methods no-ops) unless --cloudwatch-metrics is on.
	var publisher *cwmetrics.Publisher
	loaders := []func(*config.LoadOptions) error{
		config.WithAPIOptions([]func(*middleware.Stack) error{awscalls.Middleware(calls, func(api string) { publisher.AWSCallError(api) })}),
		config.WithRetryMaxAttempts(5),
	}
	if o.Region != "" && o.Region != options.OriginAny {
		loaders = append(loaders, config.WithRegion(o.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loaders...)
	if err != nil {
		return fmt.Errorf("loading AWS configuration: %w", err)
	}
	if o.AWSEndpointURL != "" {
		awsCfg.BaseEndpoint = aws.String(o.AWSEndpointURL)
	}
	sqsClient, ec2Client := sqs.NewFromConfig(awsCfg), ec2.NewFromConfig(awsCfg)
	// The account and region events must come from: a guard against misconfiguration.
	account, region, err := intake.ResolveOrigin(ctx, sts.NewFromConfig(awsCfg), o.Account, o.Region, awsCfg.Region)
	if err != nil {
		return err
	}
	log.Info("accepting events of", "account", cmp.Or(account, "any"), "region", cmp.Or(region, "any"))
	clk := clock.RealClock{}
	if o.CloudWatchMetrics {
		cw := cloudwatch.NewFromConfig(awsCfg, func(co *cloudwatch.Options) {
			if o.AWSEndpointURL != "" {
				// Local stand-ins (moto) speak CloudWatch's Query protocol only, not the
				// CBOR protocol the SDK uses with AWS.
				co.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801)
			}
		})
		publisher = cwmetrics.New(cw, o.ClusterName, clk, log)
	}

	// Every client the manager makes (the cache, writes, Events) shares this limit, however
	// the kubeconfig was found: controller-runtime turns client-side limiting off for
	// in-cluster configs, client-go defaults to 5/s for kubeconfig files.
	restCfg = rest.CopyConfig(restCfg)
	restCfg.QPS, restCfg.Burst, restCfg.RateLimiter = float32(o.KubeClientQPS), o.KubeClientBurst, nil
	if o.KubeClientQPS <= 0 || o.KubeClientBurst <= 0 { // an Options built in code, not parsed
		restCfg.QPS, restCfg.Burst = options.DefaultKubeClientQPS, options.DefaultKubeClientBurst
	}
	trim := cluster.NewTrimmer()
	ns := Namespace(cmp.Or(o.LeaderElectionNamespace, o.PodNamespace))
	// Uncached: the shadow ledger is one HealthRecord, read and written a few times a minute,
	// and the ConfigMap an earlier router kept it in (a cache would watch every ConfigMap).
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	metricsOpts := metricsserver.Options{BindAddress: o.MetricsBindAddress}
	if o.MetricsSecure {
		// The shadow report names nodes and events: only behind the authorization of
		// --metrics-secure (the metrics-reader ClusterRole grants GET on it), else on the
		// calendar's own listener.
		metricsOpts.ExtraHandlers = map[string]http.Handler{shadow.Path: shadow.Handler(direct, ns, cmp.Or(o.ShadowLedger, shadow.DefaultLedgerName),
			shadow.HandlerOptions{Log: log.With("component", "shadow"), Clock: clk})}
		// HTTPS (a self-signed certificate unless one is given), and a caller the API server
		// authenticates (TokenReview) and authorizes for GET /metrics (SubjectAccessReview):
		// Karpenter's and kubebuilder's scaffold.
		metricsOpts.SecureServing = true
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Logger: logr.New(shutdownSink{LogSink: logr.FromSlogHandler(log.Handler()).GetSink(), ctx: ctx}),
		Scheme: scheme,
		Cache:  CacheOptions(scheme, trim),
		// Pods are read per node when a gate or the watchdog needs them (a field selector on
		// spec.nodeName), never cached: a cache of every Pod grows with the cluster's workload.
		Client:                        client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Pod{}}}},
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		// Nothing but /metrics: the calendar names nodes and events, and has a listener of its
		// own, off unless --calendar-bind-address asks for it.
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  o.HealthProbeBindAddress,
		GracefulShutdownTimeout: &o.ShutdownTimeout,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	// The router's memory is its HealthRecords: without the CRD it could record nothing (every
	// deferral and drain would fail and be retried, then dead-lettered). Said once, at start.
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: record.Group, Kind: record.Kind}, record.APIVersion); err != nil {
		return fmt.Errorf("the API server does not serve %s, the router's memory (install or upgrade the chart, which installs the CRD): %w", record.CRDName, err)
	}
	if o.CalendarBindAddress != "" {
		// Every replica serves it, from its own cache (read on each request).
		clog := log.With("component", "calendar")
		mux := http.NewServeMux()
		mux.Handle("/", calendar.Handler(mgr.GetClient(), clk, calendar.HandlerOptions{Log: clog}))
		if !o.MetricsSecure {
			// Under --metrics-secure the report is served behind /metrics' authorization only:
			// the calendar's listener has none.
			mux.Handle("GET "+shadow.Path, shadow.Handler(direct, ns, cmp.Or(o.ShadowLedger, shadow.DefaultLedgerName),
				shadow.HandlerOptions{Log: clog, Clock: clk}))
		}
		h := mux
		if err := mgr.Add(calendar.NewServer(o.CalendarBindAddress, h, clog)); err != nil {
			return err
		}
	}
	if err := cluster.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	checker := checks.NewChecker(checks.NewAMI(ec2Client, clk), checks.NewReservations(ec2Client, clk), o.Gates)
	// The watchdog reads through the manager's client: cached, but for Pods (read per node).
	wd := watchdog.New(mgr.GetClient(), ec2Client, mgr.GetEventRecorder("health-router"), o.Gates, clk, reg, watchdog.Options{Log: log, EmptyFromPods: true})
	if err := mgr.Add(wd); err != nil { // leader only; scans after the cache syncs
		return err
	}
	var alerts interface {
		Check(context.Context, *policy.AlertMatcher, string) policy.Gate
	} = gates.NoAlertmanager{}
	if o.AlertmanagerURL != "" {
		alerts = gates.NewAlerts(o.AlertmanagerURL, &http.Client{}, clk)
	}
	var deferrals *deferral.Controller // built below: it releases drains held on an image
	eng := engine.New(cluster.New(mgr.GetClient()), checker, engine.WithGates(gates.NewPDB(mgr.GetClient()), alerts), engine.WithSettle(mgr.GetClient()),
		engine.WithUnmanaged(o.UnmanagedNodes),
		engine.WithImageListener(func(_ context.Context, id, _ string) { wd.InvalidateImage(id) }),
		engine.WithImageListener(func(ctx context.Context, id, state string) { deferrals.ImageChanged(ctx, id, state) }))
	sig := signal.New(mgr.GetClient(), mgr.GetAPIReader(), o.Signal, sqsClient, o.KarpenterQueueURL, mgr.GetEventRecorder("health-router"), clk)
	m := metrics.NewRouter(reg, func() float64 { return deferrals.Deferred() })
	sig.OnUnreadable(m.RecordsUnreadable.Inc)
	sig.SetKarpenterVersion(o.KarpenterVersion)
	sig.SetInstanceEventRate(o.InstanceEventsPerSecond, func(reason string) { m.EventsHeld.WithLabelValues(reason).Inc() })
	if err := mgr.Add(leaderRunnable(func(ctx context.Context) error {
		t := clk.NewTicker(signal.SummaryInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				sig.Summarise() // what was held back is told before the process ends
				return nil
			case <-t.C():
				sig.Summarise()
			}
		}
	})); err != nil {
		return err
	}
	// An upgrade from a router before the store: its memory on NodeClaims and Nodes is adopted
	// once (what EC2 confirms) and the old keys removed; retried while EC2 or the API server
	// fail.
	if err := mgr.Add(leaderRunnable(func(ctx context.Context) error {
		backoff := time.Second
		for {
			res, err := record.Adopt(ctx, mgr.GetClient(), mgr.GetAPIReader(), ec2Client, clk, log.With("component", "adopt"))
			var runs inplace.Adopted
			if err == nil {
				runs, err = inplace.AdoptRuns(ctx, mgr.GetClient(), mgr.GetAPIReader(), ec2Client, clk, log.With("component", "adopt"))
			}
			var drains nodedrain.Adopted
			if err == nil {
				drains, err = nodedrain.Adopt(ctx, mgr.GetClient(), mgr.GetAPIReader(), ec2Client, mgr.GetEventRecorder("health-router"), log.With("component", "adopt"))
			}
			if err == nil {
				if res.Removed > 0 || runs != (inplace.Adopted{}) || drains != (nodedrain.Adopted{}) {
					log.Info("adopted the memory of the router before the store", "deferrals_adopted", res.Adopted, "deferrals_not_adopted", res.Ended,
						"runs_kept", runs.Kept, "runs_restarted", runs.Restarted, "runs_ended", runs.Ended, "nodeclaims_cleaned", res.Removed+runs.Removed,
						"node_drains_kept", drains.Kept, "node_drains_ended", drains.Ended, "nodes_cleaned", drains.Removed)
				}
				return nil
			}
			log.Warn("adopting the memory of the router before the store: retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-clk.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Minute)
		}
	})); err != nil {
		return err
	}
	var pub intake.Publisher
	var decisions pipeline.Publisher
	if publisher != nil {
		pub, decisions = publisher, publisher
		// Only the leader publishes: the "router silent" alarm watches one Heartbeat.
		if err := mgr.Add(leaderRunnable(func(ctx context.Context) error {
			go func() {
				t := clk.NewTicker(o.CloudWatchInterval)
				defer t.Stop()
				for {
					publisher.SetDeferred(int(deferrals.Deferred()))
					publisher.SetWatchdog(wd.Findings().Counts())
					select {
					case <-ctx.Done():
						return
					case <-t.C():
					}
				}
			}()
			return publisher.Run(ctx, o.CloudWatchInterval)
		})); err != nil {
			return err
		}
	}
	// Scheduled events of pools annotated healthrouter.io/reschedule=true move into their window
	// (refused without ec2:ModifyInstanceEventStartTime: the ordinary policy applies).
	// An urgent state change (shutting-down, terminated) is confirmed with EC2's
	// DescribeInstanceStatus before the node is drained at once.
	pipe := pipeline.New(eng, sig, m, decisions, clk, log, o.InstanceParallelism).WithRescheduler(reschedule.NewEvents(ec2Client)).
		WithFreshReads(mgr.GetAPIReader()).WithStateConfirmation(ec2Client)
	// Shadow: the pools annotated healthrouter.io/mode=shadow (every pool under --shadow) have
	// their would-be outcomes recorded, beside what Karpenter did, in the ledger.
	// Its HealthRecord is read and written uncached, as one object a few times a minute; direct
	// also reads (and deletes, once adopted) the ConfigMap an earlier router kept it in.
	ledger := shadow.NewLedger(record.NewStore(direct, direct), direct, ns, cmp.Or(o.ShadowLedger, shadow.DefaultLedgerName), clk, log.With("component", "shadow"))
	if err := mgr.Add(ledger); err != nil { // leader only
		return err
	}
	if err := shadow.NewWatcher(mgr.GetClient(), ledger, m.ShadowKarpenter).SetupWithManager(mgr); err != nil {
		return err
	}
	pipe.WithShadow(o.Shadow, ledger)
	if o.Shadow {
		log.Info("shadow mode: every outcome is decided and recorded, none carried out (--shadow)")
	}
	// Evictions (kubectl's drain helper): cordon-drain, and the reboot in place, whose runner
	// runs whether the flag is on or not (below).
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("creating the clientset of the evictions: %w", err)
	}
	// The reboot in place's runner always runs: with --reboot-in-place=false it begins no run,
	// but carries a run a router with the flag on left (a restart with the flag turned off) to
	// its end, so that no Node stays cordoned and do-not-disrupt, and no pacing slot held, for
	// good. A run that falls back replaces the node: Karpenter drains it (its pods left are
	// evicted with their budgets) and launches another.
	fallback := func(ctx context.Context, nc *karpv1.NodeClaim, _ inplace.State, _ string) error {
		return sig.Replace(ctx, nc)
	}
	runner := inplace.New(mgr.GetClient(), mgr.GetAPIReader(), inplace.NewDrainEvictor(cs, log.With("component", "inplace")), ec2Client, clk,
		mgr.GetEventRecorder("health-router"), log.With("component", "inplace"), reg, fallback, inplace.Options{})
	if err := runner.SetupWithManager(mgr); err != nil { // leader only
		return err
	}
	if o.RebootInPlace {
		pipe.WithInPlace(runner)
	} else {
		pipe.WithInPlaceHeld(runner)
	}
	if o.EventWindows && o.Shadow {
		// A window changes when AWS acts: in shadow nothing is carried out, windows included.
		log.Warn("--event-windows is ignored under --shadow: no EC2 event window is kept while the router only records")
	}
	ew := eventwindow.New(mgr.GetClient(), ec2Client, mgr.GetEventRecorder("health-router"), clk, log.With("component", "eventwindow"), reg, o.ClusterName).
		WithInPlaceLead(inplace.Options{}.PrepareLead())
	if o.EventWindows && !o.Shadow {
		// Pools annotated healthrouter.io/event-window=true get an EC2 event window of their
		// maintenance window; their instances are tagged as their NodeClaims appear (leader only).
		if err := ew.SetupWithManager(mgr); err != nil {
			return err
		}
	} else if err := mgr.Add(leaderRunnable(ew.Cleanup)); err != nil {
		// The feature off still owns what it left: the windows an earlier router created are
		// deleted, not left in EC2 with nobody keeping them.
		return err
	}
	// The drainer always runs: with --unmanaged-nodes other than cordon-drain no drain begins,
	// but one an earlier router began is carried to its end (a close still ends it).
	drainer := nodedrain.New(mgr.GetClient(), mgr.GetAPIReader(), cs, clk, mgr.GetEventRecorder("health-router"), log.With("component", "nodedrain"),
		nodedrain.Options{Off: o.UnmanagedNodes != policy.UnmanagedCordonDrain})
	if err := mgr.Add(drainer); err != nil { // leader only
		return err
	}
	if o.UnmanagedNodes == policy.UnmanagedCordonDrain {
		pipe.WithNodeDrainer(drainer)
	} else {
		pipe.WithNodeDrainerHeld(drainer)
	}
	if o.WebhookURL != "" {
		n, err := notify.New(notify.Options{URL: o.WebhookURL, Template: o.WebhookTemplate, Headers: o.WebhookHeaders, Cluster: o.ClusterName},
			&http.Client{}, clk, log.With("component", "notify"), reg)
		if err != nil {
			return err
		}
		if err := mgr.Add(n); err != nil { // leader only
			return err
		}
		pipe.WithNotifier(n, o.ClusterName)
	}
	if o.PodEventsPerEvent > 0 {
		// Pods are read uncached, per node (the manager's client reads Pods from the API server).
		pn := podnotice.New(mgr.GetClient(), mgr.GetEventRecorder("health-router"), clk, log.With("component", "podnotice"), reg,
			podnotice.Options{PerEvent: o.PodEventsPerEvent})
		if err := mgr.Add(pn); err != nil { // every replica: the one that decides tells
			return err
		}
		pipe.WithPodNotifier(pn)
	}
	if o.NodeMarks {
		if err := upcoming.New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetClient(), log.With("component", "upcoming"), reg).SetupWithManager(mgr); err != nil {
			return err
		}
	}
	gauges := calendar.NewGauges(reg, 0)
	if err := mgr.Add(leaderRunnable(func(ctx context.Context) error {
		t := clk.NewTicker(time.Minute)
		defer t.Stop()
		for {
			if rep, err := status.Read(ctx, mgr.GetClient(), clk.Now(), ""); err == nil {
				gauges.Update(rep)
			} else {
				log.Error("reading planned maintenance for its gauges", "err", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C():
			}
		}
	})); err != nil {
		return err
	}
	deferrals = deferral.New(mgr.GetClient(), pipe, eng, sig, m, clk, log, o.ForwardConfirmTimeout)
	if err := deferrals.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.Add(deferrals.NewRechecker(mgr.GetClient(), policy.PacingRecheck/10)); err != nil {
		return err
	}
	if o.InstanceStatusPoller {
		// Karpenter's own poller is off (its role is denied ec2:DescribeInstanceStatus): the
		// router polls instead, and its findings take the same pipeline as the queue's events.
		p := poller.New(ec2Client, poller.NewClusterInstances(mgr.GetCache()), pipe, clk, log.With("component", "poller"), reg,
			poller.Options{Interval: o.InstanceStatusInterval, Account: account, Region: awsCfg.Region}).WithHeldImpaired(deferrals).
			WithImpairedReport(eng.ReportImpaired) // the repair cut-off counts every impaired instance
		p.WithHeldImpaired(drainer)        // an unmanaged Node cordoned for its impairment
		if err := mgr.Add(p); err != nil { // leader only
			return err
		}
	}
	// Readiness waits for every queue to be found usable (every replica checks), and fails
	// while the leader's receives meet an error no retry mends; a missing or denied queue
	// is logged and checked again with backoff, never a crash loop (docs/running.md).
	ready := intake.NewReadiness(clk)
	if o.PodName != "" && o.PodNamespace != "" {
		ready.OnChange(podEvents(ctx, mgr.GetAPIReader(), mgr.GetEventRecorder("health-router"), o.PodNamespace, o.PodName, log.With("component", "queues")))
	}
	if err := mgr.Add(intake.NewQueueCheck(sqsClient, []intake.Queue{
		{Role: intake.RoleIntake, URL: o.QueueURL}, {Role: intake.RoleDeadLetter, URL: o.DeadLetterQueueURL}, {Role: intake.RoleKarpenter, URL: o.KarpenterQueueURL},
	}, ready, clk, log.With("component", "queues"))); err != nil {
		return err
	}
	in := intake.New(intake.Config{
		QueueURL: o.QueueURL, DeadLetterQueueURL: o.DeadLetterQueueURL, Account: account, Region: region, SenderIDs: o.SenderIDs,
		Workers: o.Workers, Receivers: o.Receivers, Visibility: o.Visibility, WaitTime: o.WaitTime, HandleTimeout: o.HandleTimeout, MaxReceives: o.MaxReceives,
	}, sqsClient, pipe, m, pub, clk, log).WithReadiness(ready)
	if err := mgr.Add(in); err != nil {
		return err
	}
	// Start every informer the model reads at once, not on first use: decisions are then
	// made from the cache even while the API server is unreachable, and readiness means
	// the whole model is synced.
	for _, obj := range []client.Object{&corev1.Node{}, &karpv1.NodePool{}, &awsv1.EC2NodeClass{}, &policyv1.PodDisruptionBudget{}} {
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	// Drains held by pacing are released as soon as one of their pool's NodeClaims is gone.
	informer, err := mgr.GetCache().GetInformer(ctx, &karpv1.NodeClaim{})
	if err != nil {
		return err
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if nc, ok := obj.(*karpv1.NodeClaim); ok && nc.Labels[karpv1.NodePoolLabelKey] != "" {
			deferrals.DrainFinished(ctx, nc.Labels[karpv1.NodePoolLabelKey], nc.Name)
		}
	}}); err != nil {
		return err
	}
	// Drains held by a PodDisruptionBudget are released as soon as it allows a disruption.
	pdbInformer, err := mgr.GetCache().GetInformer(ctx, &policyv1.PodDisruptionBudget{})
	if err != nil {
		return err
	}
	releasePDB := func(old, updated *policyv1.PodDisruptionBudget) {
		if p := cmp.Or(updated, old); p != nil && gates.PDBReleased(old, updated) {
			if err := deferrals.ReleasePDB(ctx, p.Namespace, p.Name); err != nil {
				log.Error("releasing drains held by a PodDisruptionBudget", "pdb", p.Namespace+"/"+p.Name, "err", err)
			}
		}
	}
	if _, err := pdbInformer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			old, _ := o.(*policyv1.PodDisruptionBudget)
			nw, _ := n.(*policyv1.PodDisruptionBudget)
			releasePDB(old, nw)
		},
		DeleteFunc: func(o any) {
			if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			old, _ := o.(*policyv1.PodDisruptionBudget)
			releasePDB(old, nil)
		},
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(r *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(r.Context()) {
			return fmt.Errorf("cache not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("queues", ready.Check); err != nil {
		return err
	}
	build := version.Get()
	log.Info("starting", "version", build.Version, "commit", build.Commit, "signal", o.Signal, "karpenter_version", o.KarpenterVersion.String(), "queue", o.QueueURL, "leader_elect", o.LeaderElect, "reserved_capacity", o.Gates.Enabled(checks.ReservedCapacity))
	return mgr.Start(ctx)
}

// RouteLogs sends what the libraries log to log: controller-runtime's logger and klog's,
// through which client-go and its leader election log ("attempting to acquire leader lease"),
// so that every line of the process is JSON like the router's own. Both are process-wide.
func RouteLogs(log *slog.Logger) { routeLogs(context.Background(), log) }

// routeLogs is RouteLogs for a run that ends with ctx: once it is done, the libraries' errors
// of the shutdown itself are Info (shutdownSink), as the manager's are.
func routeLogs(ctx context.Context, log *slog.Logger) {
	ctrl.SetLogger(logr.New(shutdownSink{LogSink: logr.FromSlogHandler(log.Handler()).GetSink(), ctx: ctx}))
	klog.SetSlogLogger(log)
}

// errLeaderElectionLost is the text of the error controller-runtime's manager reports when
// its leader election ends (manager/internal.go, an errors.New of its own).
const errLeaderElectionLost = "leader election lost"

// shutdownSink is the manager's logger: every line goes to the router's log, but for the one
// error the manager logs on every shutdown of a run with leader election. Cancelling the
// election, the manager's last step, calls its OnStoppedLeading, which reports "leader
// election lost" into the stop sequence, logged at ERROR as "error received after stop
// sequence was engaged" (controller-runtime#3535): once ctx is done, the election ended
// because it was asked to, and the line is Info. A lease lost while running (ctx not done)
// stays an error, and ends run with it.
type shutdownSink struct {
	logr.LogSink
	ctx context.Context
}

func (s shutdownSink) Error(err error, msg string, kv ...any) {
	if s.ctx.Err() != nil && err != nil && err.Error() == errLeaderElectionLost {
		if s.LogSink.Enabled(0) {
			s.LogSink.Info(0, "leader election ended with the shutdown", kv...)
		}
		return
	}
	// A call cut short by the shutdown itself (the Event broadcaster's last write, "Unable to
	// write event ... context canceled") is part of stopping, not an error of the run.
	if s.ctx.Err() != nil && err != nil && (errors.Is(err, context.Canceled) || strings.Contains(err.Error(), context.Canceled.Error())) {
		if s.LogSink.Enabled(0) {
			s.LogSink.Info(0, msg+" (cut short by the shutdown)", append(kv, "err", err.Error())...)
		}
		return
	}
	s.LogSink.Error(err, msg, kv...)
}

func (s shutdownSink) WithValues(kv ...any) logr.LogSink {
	return shutdownSink{LogSink: s.LogSink.WithValues(kv...), ctx: s.ctx}
}

func (s shutdownSink) WithName(name string) logr.LogSink {
	return shutdownSink{LogSink: s.LogSink.WithName(name), ctx: s.ctx}
}

// leaderRunnable is a manager runnable that runs only on the elected leader.
type leaderRunnable func(context.Context) error

func (f leaderRunnable) Start(ctx context.Context) error { return f(ctx) }
func (f leaderRunnable) NeedLeaderElection() bool        { return true }

// CacheOptions are the options of the router's cache: it caches what it reads, not what
// Kubernetes stores (see router/cluster). The live bench (test/bench/live) builds the same
// cache for its reference of the router's watches alone.
func CacheOptions(scheme *runtime.Scheme, trim *cluster.Trimmer) cache.Options {
	return cache.Options{
		Scheme:           scheme,
		DefaultTransform: cluster.DropManagedFields,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Node{}:                  {Transform: trim.Node},
			&karpv1.NodeClaim{}:             {Transform: trim.NodeClaim},
			&policyv1.PodDisruptionBudget{}: {Transform: gates.TrimPDB},
		},
	}
}

// serviceAccountNamespace is where Kubernetes mounts the pod's namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Namespace is the router's namespace: the leader election's when given, else the pod's, else
// health-router (out of a cluster, as the chart installs it).
func Namespace(leaderElection string) string {
	if leaderElection != "" {
		return leaderElection
	}
	if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b))
	}
	return "health-router"
}
