// Package dispatch is the logic of the dispatcher Lambda: for an account with several EKS
// clusters, one regional set of EventBridge rules invokes the Lambda, which sends each event to
// the intake queue of the cluster that owns the instances it names. Ownership comes from the
// instances' tags. A Health event naming instances of several clusters is split into one event
// per cluster; an AMI state change, which names no instance, goes to every cluster; an event for
// instances no configured cluster owns is dropped and counted.
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

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

// Dispatcher routes one EventBridge event to the clusters' intake queues.
type Dispatcher struct {
	owners  ownerLookup
	queue   queueAPI
	metrics metricsAPI
	queues  Queues
	log     *slog.Logger
}

// New returns a Dispatcher that finds owners with owners, sends with queue, counts with
// metrics, and knows the clusters in queues.
func New(owners ownerLookup, queue queueAPI, metrics metricsAPI, queues Queues, log *slog.Logger) *Dispatcher {
	return &Dispatcher{owners: owners, queue: queue, metrics: metrics, queues: queues, log: log}
}

// delivery is one message for one cluster's queue.
type delivery struct {
	cluster string
	body    []byte
}

// Handle routes one event. It returns an error when a delivery failed or the owners could not
// be found, so that Lambda retries the invocation and finally sends the event to the failure
// destination. A retry may deliver again to clusters that already got the event: no worse than
// EventBridge and standard SQS queues, which deliver at least once, so the router must treat a
// repeated event ID as one event anyway. Events for instances no configured
// cluster owns are dropped and counted, not failed: retrying cannot give them an owner.
func (d *Dispatcher) Handle(ctx context.Context, body json.RawMessage) error {
	ev, err := parseEnvelope(body)
	if err != nil {
		return fmt.Errorf("unroutable event: %w", err)
	}
	log := d.log.With("event_id", ev.id, "kind", string(ev.kind))

	deliveries, dropped, err := d.plan(ctx, ev)
	if err != nil {
		return fmt.Errorf("routing event %s: %w", ev.id, err)
	}
	for _, id := range dropped {
		log.Info("dropping instance no configured cluster owns", "instance", id)
	}

	routed := map[string]int{}
	var errs []error
	for _, dl := range deliveries {
		_, err := d.queue.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl:    aws.String(d.queues[dl.cluster]),
			MessageBody: aws.String(string(dl.body)),
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("sending event %s to cluster %s: %w", ev.id, dl.cluster, err))
			continue
		}
		routed[dl.cluster]++
		log.Info("routed", "cluster", dl.cluster)
	}
	d.count(ctx, log, routed, len(dropped))
	return errors.Join(errs...)
}

// plan decides which cluster gets which body, and which instances nobody owns.
func (d *Dispatcher) plan(ctx context.Context, ev envelope) ([]delivery, []string, error) {
	switch ev.kind {
	case kindAMIStateChange:
		// An image may back nodes of any cluster; each router checks its own NodeClasses.
		var out []delivery
		for _, cluster := range slices.Sorted(maps.Keys(d.queues)) {
			out = append(out, delivery{cluster: cluster, body: ev.raw})
		}
		return out, nil, nil
	case kindUnknown:
		return nil, nil, fmt.Errorf("no route for source %q detail-type %q", ev.source, ev.detailType)
	}

	ids := ev.instances()
	if len(ids) == 0 {
		return nil, nil, fmt.Errorf("%s event names no instance", ev.kind)
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
				return nil, nil, err
			}
		}
		out = append(out, delivery{cluster: cluster, body: body})
	}
	return out, dropped, nil
}

// count publishes DispatcherRouted per cluster and DispatcherDropped. A failure is logged, not
// returned: retrying the invocation for a metric would deliver the event twice.
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
