// Package poller takes over Karpenter's instance-status poller: on the elected leader it asks
// EC2 DescribeInstanceStatus about the cluster's instances every minute, as Karpenter (v1.12+)
// does, and hands what it finds to the router's pipeline as events, so that the router, not
// Karpenter, decides them with NodePool policy:
//
//   - a scheduled event (instance-reboot, system-reboot, system-maintenance,
//     instance-retirement, instance-stop) that is not [Completed] or [Canceled] becomes a
//     scheduled-change event shaped as the AWS Health event of the same maintenance, so the
//     pipeline decides it once whether EventBridge, the poller, or both report it;
//   - an instance whose instance or system status has been impaired for ImpairedAfter (two
//     minutes, after which Karpenter v1.13+ force-terminates it) becomes an instance-status
//     event, once per impairment.
//
// A finding is handed over once: the poller remembers, per instance, what the handler took,
// hands a finding again only when the handler failed, and forgets instances that leave the
// cluster. Karpenter's poller must be switched off by denying its role
// ec2:DescribeInstanceStatus; doctor checks both sides.
package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/metrics"
)

// Defaults of Options.
const (
	// DefaultInterval is Karpenter's: its instance-status controller polls every minute.
	DefaultInterval = time.Minute
	// DefaultImpairedAfter is how long Karpenter v1.13 lets a status check stay impaired
	// before it force-terminates the instance.
	DefaultImpairedAfter = 2 * time.Minute
	// DefaultParallelCalls bounds the DescribeInstanceStatus calls in flight: a few, so that
	// a large cluster is asked quickly without spending EC2's request-rate budget, which the
	// pre-signal checks share.
	DefaultParallelCalls = 4
)

// DescribeBatch is how many instance IDs one DescribeInstanceStatus call names: EC2's limit.
const DescribeBatch = 100

// notFoundRetries is how often a batch is asked again without the instances EC2 says do not
// exist (terminated a while ago, or gone between the list and the call).
const notFoundRetries = 2

// Results of a poll (the result label of health_router_poller_polls_total).
const (
	ResultSuccess       = "success"
	ResultListError     = "list-error"     // the cluster's instances could not be listed
	ResultDescribeError = "describe-error" // some DescribeInstanceStatus batch failed
	ResultHandleError   = "handle-error"   // the handler failed some finding (handed again next poll)
)

// Options tunes the poller; a zero field takes its default.
type Options struct {
	Interval      time.Duration
	ImpairedAfter time.Duration
	ParallelCalls int
	// Account and Region are the router's (--account, the AWS region), stamped on findings so
	// that they pass the pipeline's origin check; either may be empty.
	Account, Region string
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.ImpairedAfter <= 0 {
		o.ImpairedAfter = DefaultImpairedAfter
	}
	if o.ParallelCalls <= 0 {
		o.ParallelCalls = DefaultParallelCalls
	}
	return o
}

// instanceStatusAPI is the part of EC2 the poller uses.
type instanceStatusAPI interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// instanceLister returns the EC2 instance IDs of the cluster's nodes.
type instanceLister interface {
	InstanceIDs(ctx context.Context) ([]string, error)
}

// heldLister returns the instances whose repair the router holds (the repair cut-off): the
// poller tells the pipeline when one of them passes its checks again.
type heldLister interface {
	HeldImpaired(ctx context.Context) ([]string, error)
}

// Handler decides an event for its instance and carries the decision out; the router's
// pipeline implements it (and recognises a maintenance already decided from AWS Health).
type Handler interface {
	Handle(ctx context.Context, ev event.Event) error
}

// Poller polls DescribeInstanceStatus. Poll does one pass; Start polls every Options.Interval
// on the elected leader.
type Poller struct {
	api       instanceStatusAPI
	instances instanceLister
	handler   Handler
	clock     clock.WithTicker
	log       *slog.Logger
	opts      Options

	polls, findings *prometheus.CounterVec
	asked           prometheus.Gauge

	mu sync.Mutex // one poll at a time; guards the state below
	// handed holds, per instance, the IDs of the scheduled-event findings the handler took
	// and that EC2 still reports.
	handed   map[string]map[string]bool
	impaired map[string]*impairment
	held     []heldLister // none: no repairs are held
	// report is told, at every poll, every instance EC2 shows impaired now (WithImpairedReport);
	// reported is the last set told, kept for the instances whose batch failed.
	report   func([]string)
	reported map[string]bool
}

// WithImpairedReport has the poller tell report, at every poll and before it hands its
// findings over, every instance EC2 shows impaired now, decided or not, however briefly
// (engine.Engine.ReportImpaired: the repair cut-off counts them all). An instance whose batch
// got no answer keeps what the last poll said of it.
func (p *Poller) WithImpairedReport(report func([]string)) *Poller {
	p.report = report
	return p
}

// WithHeldImpaired adds a source of the instances whose repair the router holds (a repair
// held by the cut-off on a NodeClaim; an unmanaged Node cordoned for its impairment), read
// from the cluster at every poll (so a restart forgets none): one that passes its checks again
// is handed over as recovered, which cancels the held repair or ends the Node's drain.
func (p *Poller) WithHeldImpaired(l heldLister) *Poller {
	p.held = append(p.held, l)
	return p
}

// impairment is an instance seen impaired at every poll since `since`.
type impairment struct {
	since  time.Time
	handed bool
}

// New returns a Poller asking api about the instances lister lists, handing findings to
// handler, with its metrics registered with reg.
func New(api instanceStatusAPI, instances instanceLister, handler Handler, clk clock.WithTicker, log *slog.Logger, reg prometheus.Registerer, opts Options) *Poller {
	p := &Poller{
		api: api, instances: instances, handler: handler, clock: clk, log: log, opts: opts.withDefaults(),
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.PollerPolls, Help: "Instance-status polls, by result (success, list-error, describe-error, handle-error).",
		}, []string{metrics.LabelResult}),
		findings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.PollerFindings, Help: "Instance-status findings handed to the pipeline, each once, by finding (scheduled-event, impaired).",
		}, []string{metrics.LabelFinding}),
		asked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metrics.PollerInstances, Help: "Cluster instances the last instance-status poll asked EC2 about.",
		}),
		handed:   map[string]map[string]bool{},
		impaired: map[string]*impairment{},
	}
	reg.MustRegister(p.polls, p.findings, p.asked)
	return p
}

// NeedLeaderElection makes the poller run on the leader only, as the intake does.
func (p *Poller) NeedLeaderElection() bool { return true }

// Start polls at once and then every Options.Interval until ctx is done. Polls never
// overlap: a tick that comes during a poll is dropped.
func (p *Poller) Start(ctx context.Context) error {
	t := p.clock.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		if err := p.Poll(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("instance-status poll incomplete; retried at the next poll", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// Poll asks EC2 about the cluster's instances once and hands every new finding to the handler.
func (p *Poller) Poll(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids, err := p.instances.InstanceIDs(ctx)
	if err != nil {
		p.polls.WithLabelValues(ResultListError).Inc()
		return fmt.Errorf("listing the cluster's instances: %w", err)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	p.asked.Set(float64(len(ids)))
	p.forgetOthers(ids)

	statuses, failed, describeErr := p.describe(ctx, ids)
	now := p.clock.Now()
	held := map[string]bool{}
	for _, l := range p.held {
		hs, err := l.HeldImpaired(ctx)
		if err != nil {
			describeErr = errors.Join(describeErr, fmt.Errorf("listing held repairs: %w", err))
		}
		for _, id := range hs {
			held[id] = true
		}
	}
	if p.report != nil {
		now := map[string]bool{}
		for _, id := range ids {
			if failed[id] && p.reported[id] || !failed[id] && impairedStatus(statuses[id]) {
				now[id] = true
			}
		}
		p.reported = now
		p.report(slices.Sorted(maps.Keys(now)))
	}
	var todo []event.StatusFinding
	for _, id := range ids {
		if failed[id] {
			continue // no answer: keep what is known, ask again next poll
		}
		todo = append(todo, p.scheduled(id, statuses[id], now)...)
		if f, ok := p.impairedFinding(id, statuses[id], now); ok {
			todo = append(todo, f)
		} else if held[id] && !impairedStatus(statuses[id]) {
			st := statuses[id]
			todo = append(todo, event.StatusFinding{InstanceID: id, Finding: event.FindingRecovered, Time: now, Account: p.opts.Account, Region: p.opts.Region,
				InstanceStatus: summary(st.InstanceStatus), SystemStatus: summary(st.SystemStatus)})
		}
	}
	handleErr := p.handle(ctx, todo)
	switch {
	case describeErr != nil:
		p.polls.WithLabelValues(ResultDescribeError).Inc()
	case handleErr != nil:
		p.polls.WithLabelValues(ResultHandleError).Inc()
	default:
		p.polls.WithLabelValues(ResultSuccess).Inc()
	}
	return errors.Join(describeErr, handleErr)
}

// forgetOthers drops what is known of instances no longer in the cluster.
func (p *Poller) forgetOthers(ids []string) {
	for id := range p.handed {
		if _, ok := slices.BinarySearch(ids, id); !ok {
			delete(p.handed, id)
		}
	}
	for id := range p.impaired {
		if _, ok := slices.BinarySearch(ids, id); !ok {
			delete(p.impaired, id)
		}
	}
}

// describe asks EC2 about ids in batches, a few at once. It returns each answered instance's
// status (absent: EC2 reports nothing for it), and the instances of batches that failed.
func (p *Poller) describe(ctx context.Context, ids []string) (map[string]ec2types.InstanceStatus, map[string]bool, error) {
	// A hung call must not stop the poller: the next poll asks again.
	ctx, cancel := context.WithTimeout(ctx, p.opts.Interval)
	defer cancel()
	var (
		mu       sync.Mutex
		statuses = map[string]ec2types.InstanceStatus{}
		failed   = map[string]bool{}
		errs     []error
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.opts.ParallelCalls)
	for batch := range slices.Chunk(ids, DescribeBatch) {
		g.Go(func() error {
			out, err := p.describeBatch(gctx, batch)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				for _, id := range batch {
					failed[id] = true
				}
				return nil // the other batches still count
			}
			for _, s := range out {
				statuses[aws.ToString(s.InstanceId)] = s
			}
			return nil
		})
	}
	_ = g.Wait() // batches report through errs
	return statuses, failed, errors.Join(errs...)
}

// describeBatch pages through DescribeInstanceStatus for one batch. IncludeAllInstances
// reports instances that are not running too, as Karpenter asks.
func (p *Poller) describeBatch(ctx context.Context, ids []string) ([]ec2types.InstanceStatus, error) {
	for attempt := 0; ; attempt++ {
		var out []ec2types.InstanceStatus
		pages := ec2.NewDescribeInstanceStatusPaginator(p.api, &ec2.DescribeInstanceStatusInput{InstanceIds: ids, IncludeAllInstances: aws.Bool(true)})
		var err error
		for pages.HasMorePages() {
			var page *ec2.DescribeInstanceStatusOutput
			if page, err = pages.NextPage(ctx); err != nil {
				break
			}
			out = append(out, page.InstanceStatuses...)
		}
		if err == nil {
			return out, nil
		}
		// One unknown ID fails the whole call; EC2 names the missing ones in the message.
		missing := notFound(err)
		if len(missing) == 0 || attempt == notFoundRetries {
			return nil, fmt.Errorf("describing instance status of %s: %w", span(ids), err)
		}
		ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return slices.Contains(missing, id) })
		if len(ids) == 0 {
			return nil, nil
		}
	}
}

var instanceIDs = regexp.MustCompile(`i-[0-9a-f]{8,17}`)

// notFound returns the instance IDs an InvalidInstanceID.NotFound error names.
func notFound(err error) []string {
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "InvalidInstanceID.NotFound" {
		return nil
	}
	return instanceIDs.FindAllString(ae.ErrorMessage(), -1)
}

func span(ids []string) string {
	if len(ids) == 1 {
		return ids[0]
	}
	return fmt.Sprintf("%d instances (%s to %s)", len(ids), ids[0], ids[len(ids)-1])
}

// scheduled returns the new scheduled-event findings of one instance and forgets those EC2
// no longer reports. Karpenter's poller drains on [Completed] and [Canceled] events too; the
// router hands them over as closing the maintenance (once each): the pipeline cancels what it
// deferred for it, whichever source reported it.
func (p *Poller) scheduled(id string, st ec2types.InstanceStatus, now time.Time) []event.StatusFinding {
	var out []event.StatusFinding
	current := map[string]bool{}
	for _, e := range st.Events {
		desc := aws.ToString(e.Description)
		code := event.ScheduledType(e.Code)
		if !slices.Contains(event.ScheduledTypes, code) || e.NotBefore == nil {
			p.log.Warn("scheduled event not understood; not acted on", "instance", id, "code", string(e.Code), "event_id", aws.ToString(e.InstanceEventId), "description", desc)
			continue
		}
		f := event.StatusFinding{
			InstanceID: id, Finding: event.FindingScheduledEvent, Time: now, Account: p.opts.Account, Region: p.opts.Region,
			Code: code, EventID: aws.ToString(e.InstanceEventId), NotBefore: aws.ToTime(e.NotBefore), NotAfter: aws.ToTime(e.NotAfter), Description: desc,
		}
		current[f.ID()] = true
		if !p.handed[id][f.ID()] {
			out = append(out, f)
		}
	}
	for key := range p.handed[id] {
		if !current[key] {
			delete(p.handed[id], key)
		}
	}
	return out
}

// impairedFinding tracks how long an instance has been impaired and returns a finding once
// it has been for Options.ImpairedAfter, once per impairment. The impairment starts at EC2's
// impairedSince when it reports one, else at the first poll that saw it.
func (p *Poller) impairedFinding(id string, st ec2types.InstanceStatus, now time.Time) (event.StatusFinding, bool) {
	inst, sys := summary(st.InstanceStatus), summary(st.SystemStatus)
	if inst != event.StatusImpaired && sys != event.StatusImpaired {
		delete(p.impaired, id) // recovered (or never impaired): a later impairment is new
		return event.StatusFinding{}, false
	}
	imp := p.impaired[id]
	if imp == nil {
		imp = &impairment{since: now}
		p.impaired[id] = imp
	}
	for _, s := range []*ec2types.InstanceStatusSummary{st.InstanceStatus, st.SystemStatus} {
		if s == nil || s.Status != ec2types.SummaryStatusImpaired {
			continue
		}
		for _, d := range s.Details {
			if d.ImpairedSince != nil && d.ImpairedSince.Before(imp.since) {
				imp.since = *d.ImpairedSince
			}
		}
	}
	if imp.handed || now.Sub(imp.since) < p.opts.ImpairedAfter {
		return event.StatusFinding{}, false
	}
	return event.StatusFinding{
		InstanceID: id, Finding: event.FindingImpaired, Time: now, Account: p.opts.Account, Region: p.opts.Region,
		InstanceStatus: inst, SystemStatus: sys, ImpairedSince: imp.since,
	}, true
}

func impairedStatus(st ec2types.InstanceStatus) bool {
	return summary(st.InstanceStatus) == event.StatusImpaired || summary(st.SystemStatus) == event.StatusImpaired
}

func summary(s *ec2types.InstanceStatusSummary) string {
	if s == nil {
		return ""
	}
	return string(s.Status)
}

// handle hands each finding to the handler and remembers those it took.
func (p *Poller) handle(ctx context.Context, findings []event.StatusFinding) error {
	failed := 0
	for _, f := range findings {
		_, ev, err := f.Event()
		if err == nil {
			err = p.handler.Handle(ctx, ev)
		}
		if err != nil {
			failed++
			p.log.Error("instance-status finding not handed over; retried at the next poll", "instance", f.InstanceID, "event_id", f.ID(), "kind", string(ev.Kind), "error", err)
			continue
		}
		p.log.Info("instance-status finding handed over", "instance", f.InstanceID, "event_id", ev.ID, "kind", string(ev.Kind), "finding", f.Finding)
		p.findings.WithLabelValues(f.Finding).Inc()
		if f.Finding == event.FindingRecovered {
			continue // handed at every poll until the held repair is cancelled
		}
		if f.Finding == event.FindingImpaired {
			if imp := p.impaired[f.InstanceID]; imp != nil {
				imp.handed = true
			}
			continue
		}
		if p.handed[f.InstanceID] == nil {
			p.handed[f.InstanceID] = map[string]bool{}
		}
		p.handed[f.InstanceID][f.ID()] = true
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d instance-status findings not handed over", failed, len(findings))
	}
	return nil
}
