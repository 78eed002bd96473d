// Package dispatch is the logic of the dispatcher Lambda: for an account with several EKS
// clusters, one regional set of EventBridge rules sends to the dispatcher queue, which feeds
// the Lambda (HandleBatch), and the Lambda sends each event to the intake queue of the cluster
// that owns the instances it names. Ownership comes from the
// instances' tags. A Health event naming instances of several clusters is split into one event
// per cluster; an AMI state change and a Capacity Block's expiration, which name no instance,
// go to every cluster; an event for instances no configured cluster owns is dropped and
// counted. A delivery that fails is recorded, for its cluster alone, in the failure queue.
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/health-router/health-router/router/metrics"
)

// QueuesEnv is the environment variable holding the cluster => intake queue URL map as JSON;
// Terraform sets it.
const QueuesEnv = "HEALTH_ROUTER_CLUSTER_QUEUES"

// queueAPI is the part of SQS the dispatcher uses.
type queueAPI interface {
	SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
}

// metricsAPI is the part of CloudWatch the dispatcher uses.
type metricsAPI interface {
	PutMetricData(context.Context, *cloudwatch.PutMetricDataInput, ...func(*cloudwatch.Options)) (*cloudwatch.PutMetricDataOutput, error)
}

// ownerLookup says which cluster owns each instance ("" for none).
type ownerLookup interface {
	Owners(ctx context.Context, ids []string) (map[string]string, error)
}

// Queues maps a cluster name to the URL of its intake queue.
type Queues map[string]string

// ParseQueues reads the JSON cluster => queue URL map of QueuesEnv.
func ParseQueues(s string) (Queues, error) {
	if s == "" {
		return nil, fmt.Errorf("%s is empty: it must map each cluster name to its intake queue URL", QueuesEnv)
	}
	var q Queues
	if err := json.Unmarshal([]byte(s), &q); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", QueuesEnv, err)
	}
	if len(q) == 0 {
		return nil, fmt.Errorf("%s names no cluster", QueuesEnv)
	}
	for cluster, url := range q {
		if cluster == "" || url == "" {
			return nil, fmt.Errorf("%s: cluster %q has queue URL %q; both must be set", QueuesEnv, cluster, url)
		}
	}
	return q, nil
}

// FailureQueueEnv is the environment variable holding the URL of the failure queue, where the
// dispatcher records each delivery it could not make; Terraform sets it.
const FailureQueueEnv = "HEALTH_ROUTER_FAILURE_QUEUE"

// Dispatcher routes one EventBridge event to the clusters' intake queues.
type Dispatcher struct {
	owners   ownerLookup
	queue    queueAPI
	metrics  metricsAPI
	queues   Queues
	failures string
	log      *slog.Logger
	// account and region, when set, are the ones the dispatcher serves (WithOrigin).
	account, region string
}

// AccountEnv is the environment variable holding the account the dispatcher serves; Terraform
// sets it. The region is the Lambda's own (AWS_REGION).
const AccountEnv = "HEALTH_ROUTER_ACCOUNT"

// WithOrigin makes the dispatcher route only events about account and region ("": any): an
// AWS Health event of the organizational view is about its detail.affectedAccount and
// detail.eventRegion, not the management account and region that received it. An event about
// another account or region is dropped and counted before its instances are looked up: this
// account's DescribeInstances cannot see them, and they are another dispatcher's.
func (d *Dispatcher) WithOrigin(account, region string) *Dispatcher {
	d.account, d.region = account, region
	return d
}

// foreign says why ev is about another account or region than the dispatcher serves, or "".
func (d *Dispatcher) foreign(ev envelope) string {
	switch {
	case d.account != "" && ev.account != d.account:
		return fmt.Sprintf("account %q, the dispatcher serves %q", ev.account, d.account)
	case d.region != "" && ev.region != d.region:
		return fmt.Sprintf("region %q, the dispatcher serves %q", ev.region, d.region)
	}
	return ""
}

// New returns a Dispatcher that finds owners with owners, sends with queue, counts with
// metrics, knows the clusters in queues, and records what it could not deliver in the
// failures queue ("": none, every failure fails the event, for SQS to retry it).
func New(owners ownerLookup, queue queueAPI, metrics metricsAPI, queues Queues, failures string, log *slog.Logger) *Dispatcher {
	return &Dispatcher{owners: owners, queue: queue, metrics: metrics, queues: queues, failures: failures, log: log}
}

// delivery is one message for one cluster's queue.
type delivery struct {
	cluster string
	body    []byte
}

// Handle routes one event. A delivery that fails is recorded in the failure queue, for its
// cluster alone, with the reason and the body to re-send; the event still succeeds, since a
// retry of it would deliver again to every cluster that got it. A permanent error (no such
// queue, access denied, a KMS key refused, an unroutable event) is recorded at once: retrying
// cannot mend it. Handle returns an error, for SQS to retry the record (HandleBatch) and
// finally move it to its dead-letter queue (the same failure queue), only when a retry
// duplicates nothing and may succeed (nothing was delivered and every error may pass: an SQS
// or EC2 outage), when there is no failure queue, or when recording in it failed: then a
// retry may deliver again to clusters that already got the event, no worse than EventBridge
// and standard SQS queues, which deliver at least once. Events for instances no configured
// cluster owns are dropped and counted, not failed: nothing can give them an owner.
func (d *Dispatcher) Handle(ctx context.Context, body json.RawMessage) error {
	ev, err := parseEnvelope(body)
	if err != nil {
		return d.recordAll(ctx, ev, body, reasonUnroutable, fmt.Errorf("unroutable event: %w", err))
	}
	log := d.log.With("event_id", ev.id, "kind", string(ev.kind))
	if why := d.foreign(ev); why != "" && ev.kind != kindUnknown {
		log.Info("dropping an event about another account or region", "reason", why)
		d.count(ctx, log, nil, max(1, len(ev.instances())))
		return nil
	}

	deliveries, dropped, err := d.plan(ctx, ev)
	if err != nil {
		err = fmt.Errorf("routing event %s: %w", ev.id, err)
		var u unroutableError
		switch {
		case errors.As(err, &u):
			return d.recordAll(ctx, ev, body, reasonUnroutable, err)
		case isPermanent(err):
			return d.recordAll(ctx, ev, body, reasonPermanent, err)
		}
		return err // nothing was delivered: Lambda's retry duplicates nothing
	}
	for _, id := range dropped {
		log.Info("dropping instance no configured cluster owns", "instance", id)
	}

	routed := map[string]int{}
	var failed []failedDelivery
	for _, dl := range deliveries {
		_, err := d.queue.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl:    aws.String(d.queues[dl.cluster]),
			MessageBody: aws.String(string(dl.body)),
		})
		if err != nil {
			failed = append(failed, failedDelivery{delivery: dl, err: fmt.Errorf("sending event %s to cluster %s: %w", ev.id, dl.cluster, err)})
			continue
		}
		routed[dl.cluster]++
		log.Info("routed", "cluster", dl.cluster)
	}
	d.count(ctx, log, routed, len(dropped))
	if len(failed) == 0 {
		return nil
	}
	allTransient := !slices.ContainsFunc(failed, func(f failedDelivery) bool { return isPermanent(f.err) })
	if d.failures == "" || (len(routed) == 0 && allTransient) {
		var errs []error
		for _, f := range failed {
			errs = append(errs, f.err)
		}
		return errors.Join(errs...)
	}
	var errs []error
	for _, f := range failed {
		r := reasonTransient
		if isPermanent(f.err) {
			r = reasonPermanent
		}
		if err := d.record(ctx, ev, f.cluster, f.body, r, f.err); err != nil {
			errs = append(errs, f.err, err)
			continue
		}
		log.Warn("delivery failed; recorded in the failure queue", "cluster", f.cluster, "reason", r, "error", f.err)
	}
	return errors.Join(errs...)
}

// failedDelivery is a delivery SQS refused or did not answer.
type failedDelivery struct {
	delivery
	err error
}

// recordAll records an event that reached no cluster; without a failure queue it returns
// cause, for SQS to retry the record and then dead-letter it.
func (d *Dispatcher) recordAll(ctx context.Context, ev envelope, body []byte, r reason, cause error) error {
	if d.failures == "" {
		return cause
	}
	if err := d.record(ctx, ev, "", body, r, cause); err != nil {
		return errors.Join(cause, err)
	}
	d.log.Warn("event not routed; recorded in the failure queue", "event_id", ev.id, "reason", r, "error", cause)
	return nil
}

// maxDetail bounds the error text in a failure record (SQS counts attributes in its 256 KiB).
const maxDetail = 1024

// record sends body, which cluster ("" for none) did not get, to the failure queue with the
// reason: an operator re-sends the body to the queue named in AttrQueueURL.
func (d *Dispatcher) record(ctx context.Context, ev envelope, cluster string, body []byte, r reason, cause error) error {
	detail := cause.Error()
	if len(detail) > maxDetail {
		detail = detail[:maxDetail]
	}
	attrs := map[string]sqstypes.MessageAttributeValue{
		AttrReason:  attr(string(r)),
		AttrDetail:  attr(detail),
		AttrEventID: attr(ev.id),
	}
	var ae smithy.APIError
	if errors.As(cause, &ae) {
		attrs[AttrErrorCode] = attr(ae.ErrorCode())
	}
	if cluster != "" {
		attrs[AttrCluster] = attr(cluster)
		attrs[AttrQueueURL] = attr(d.queues[cluster])
	}
	if len(body) == 0 {
		body = []byte("(empty event)") // SQS refuses an empty body
	}
	_, err := d.queue.SendMessage(ctx, &sqs.SendMessageInput{
		QueueUrl: aws.String(d.failures), MessageBody: aws.String(string(body)), MessageAttributes: attrs,
	})
	if err != nil {
		return fmt.Errorf("recording event %s in the failure queue: %w", ev.id, err)
	}
	return nil
}

func attr(s string) sqstypes.MessageAttributeValue {
	if s == "" {
		s = "-" // SQS refuses an empty attribute value
	}
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(s)}
}

// unroutableError is an event the dispatcher cannot route, whatever it retries.
type unroutableError struct{ err error }

func (e unroutableError) Error() string { return e.err.Error() }
func (e unroutableError) Unwrap() error { return e.err }

// plan decides which cluster gets which body, and which instances nobody owns.
func (d *Dispatcher) plan(ctx context.Context, ev envelope) ([]delivery, []string, error) {
	switch ev.kind {
	case kindAMIStateChange, kindCapacityBlock:
		// An image may back nodes of any cluster; each router checks its own NodeClasses. A
		// Capacity Block's expiration names the reservation, not its instances: each router
		// finds its NodeClaims that carry it.
		var out []delivery
		for _, cluster := range slices.Sorted(maps.Keys(d.queues)) {
			out = append(out, delivery{cluster: cluster, body: ev.raw})
		}
		return out, nil, nil
	case kindUnknown:
		return nil, nil, unroutableError{fmt.Errorf("no route for source %q detail-type %q", ev.source, ev.detailType)}
	}

	ids := ev.instances()
	if len(ids) == 0 {
		return nil, nil, unroutableError{fmt.Errorf("%s event names no instance", ev.kind)}
	}
	owners, err := d.owners.Owners(ctx, ids)
	if err != nil {
		return nil, nil, err
	}
	byCluster := map[string][]string{}
	var dropped []string
	for _, id := range ids {
		cluster := owners[id]
		if _, ok := d.queues[cluster]; !ok {
			dropped = append(dropped, id)
			continue
		}
		byCluster[cluster] = append(byCluster[cluster], id)
	}

	var out []delivery
	for _, cluster := range slices.Sorted(maps.Keys(byCluster)) {
		body := ev.raw
		if len(byCluster) > 1 || len(dropped) > 0 {
			if body, err = ev.restrictTo(byCluster[cluster]); err != nil {
				return nil, nil, unroutableError{err}
			}
		}
		out = append(out, delivery{cluster: cluster, body: body})
	}
	return out, dropped, nil
}

// count publishes DispatcherRouted per cluster and DispatcherDropped. A failure is logged, not
// returned: retrying the event for a metric would deliver the event twice.
func (d *Dispatcher) count(ctx context.Context, log *slog.Logger, routed map[string]int, dropped int) {
	var data []cwtypes.MetricDatum
	for _, cluster := range slices.Sorted(maps.Keys(routed)) {
		data = append(data, cwtypes.MetricDatum{
			MetricName: aws.String(metrics.CWDispatcherRouted),
			Dimensions: []cwtypes.Dimension{{Name: aws.String(metrics.DimClusterName), Value: aws.String(cluster)}},
			Unit:       cwtypes.StandardUnitCount,
			Value:      aws.Float64(float64(routed[cluster])),
		})
	}
	if dropped > 0 {
		data = append(data, cwtypes.MetricDatum{
			MetricName: aws.String(metrics.CWDispatcherDropped),
			Unit:       cwtypes.StandardUnitCount,
			Value:      aws.Float64(float64(dropped)),
		})
	}
	if len(data) == 0 {
		return
	}
	_, err := d.metrics.PutMetricData(ctx, &cloudwatch.PutMetricDataInput{
		Namespace:  aws.String(metrics.CloudWatchNamespace),
		MetricData: data,
	})
	if err != nil {
		log.Warn("publishing dispatcher metrics failed", "error", err)
	}
}

// Message attributes of a failure record.
const (
	AttrReason    = "healthrouter.reason"
	AttrDetail    = "healthrouter.detail"
	AttrErrorCode = "healthrouter.error-code"
	AttrCluster   = "healthrouter.cluster"
	AttrQueueURL  = "healthrouter.queue-url"
	AttrEventID   = "healthrouter.event-id"
)

// reason says why a delivery is in the failure queue.
type reason string

const (
	reasonUnroutable reason = "unroutable"
	reasonPermanent  reason = "permanent-error"
	reasonTransient  reason = "transient-error"
)

// permanentCodes are the SQS and EC2 error codes (in both of SQS's protocols) that a retry
// does not mend: the queue is gone, the role may not send or describe, the body is refused.
var permanentCodes = map[string]bool{
	"AWS.SimpleQueueService.NonExistentQueue": true,
	"QueueDoesNotExist":                       true,
	"AccessDenied":                            true,
	"AccessDeniedException":                   true,
	"InvalidMessageContents":                  true,
	"InvalidParameterValue":                   true, // a body over the size limit
	"InvalidAddress":                          true,
	"InvalidSecurity":                         true,
	"UnsupportedOperation":                    true,
	"UnauthorizedOperation":                   true, // EC2
	"AuthFailure":                             true, // EC2
}

// isPermanent says whether err is an AWS error a retry does not mend. A KMS error is one
// (the key policy or the key's state refuses), unless it is throttling. An error with no AWS
// code (no answer, a timeout) may pass.
func isPermanent(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	code := ae.ErrorCode()
	if strings.HasPrefix(code, "KMS.") || strings.HasPrefix(code, "Kms") {
		return !strings.Contains(code, "Throttl")
	}
	return permanentCodes[code]
}
