package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/terraform/motoserver"
)

// world is moto with two clusters' nodes, one untagged instance, and the two intake queues.
type world struct {
	ec2      *ec2.Client
	sqs      *sqs.Client
	cw       *cloudwatch.Client
	alpha    string // instance tagged eks:eks-cluster-name=alpha (as Karpenter tags)
	beta     string // instance tagged kubernetes.io/cluster/beta=owned
	unowned  string // instance with no cluster tag
	queues   Queues
	failures string // the failure queue's URL
	describe *countingEC2
	clock    *clocktesting.FakeClock
}

func newWorld(t *testing.T) *world {
	t.Helper()
	srv := motoserver.Start(t)
	ctx := context.Background()
	w := &world{
		ec2:   ec2.NewFromConfig(srv.Config),
		sqs:   sqs.NewFromConfig(srv.Config),
		cw:    cloudwatch.NewFromConfig(srv.Config, motoserver.CloudWatchQuery),
		clock: clocktesting.NewFakeClock(time.Date(2026, 11, 20, 9, 15, 0, 0, time.UTC)),
	}
	w.describe = &countingEC2{api: w.ec2}
	w.alpha = w.runInstance(t, ctx, map[string]string{"eks:eks-cluster-name": "alpha", "karpenter.sh/nodepool": "kafka"})
	w.beta = w.runInstance(t, ctx, map[string]string{"kubernetes.io/cluster/beta": "owned", "Name": "beta-node"})
	w.unowned = w.runInstance(t, ctx, map[string]string{"Name": "bastion"})
	w.queues = Queues{"alpha": w.createQueue(t, ctx, "hr-alpha"), "beta": w.createQueue(t, ctx, "hr-beta")}
	w.failures = w.createQueue(t, ctx, "hr-dispatcher-failures")
	return w
}

func (w *world) runInstance(t *testing.T, ctx context.Context, tags map[string]string) string {
	t.Helper()
	var ts []ec2types.Tag
	for k, v := range tags {
		ts = append(ts, ec2types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	out, err := w.ec2.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: aws.String("ami-03cf127a"), InstanceType: ec2types.InstanceTypeM5Large,
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstance, Tags: ts}},
	})
	if err != nil {
		t.Fatalf("RunInstances: %v", err)
	}
	return aws.ToString(out.Instances[0].InstanceId)
}

func (w *world) createQueue(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	out, err := w.sqs.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatalf("CreateQueue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

func (w *world) dispatcher(queues Queues) *Dispatcher {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(NewOwnerCache(w.describe, w.clock), w.sqs, w.cw, queues, w.failures, log)
}

// received drains a queue and returns the bodies.
func (w *world) received(t *testing.T, url string) []string {
	t.Helper()
	out, err := w.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10})
	if err != nil {
		t.Fatalf("ReceiveMessage: %v", err)
	}
	var bodies []string
	for _, m := range out.Messages {
		bodies = append(bodies, aws.ToString(m.Body))
	}
	return bodies
}

// metricSum is the sum of a HealthRouter metric over the last day, as moto's CloudWatch has it.
func (w *world) metricSum(t *testing.T, name string, dims ...cwtypes.Dimension) float64 {
	t.Helper()
	now := time.Now()
	out, err := w.cw.GetMetricStatistics(context.Background(), &cloudwatch.GetMetricStatisticsInput{
		Namespace: aws.String(metrics.CloudWatchNamespace), MetricName: aws.String(name), Dimensions: dims,
		StartTime: aws.Time(now.Add(-24 * time.Hour)), EndTime: aws.Time(now.Add(time.Hour)),
		Period: aws.Int32(86400), Statistics: []cwtypes.Statistic{cwtypes.StatisticSum},
	})
	if err != nil {
		t.Fatalf("GetMetricStatistics %s: %v", name, err)
	}
	var sum float64
	for _, dp := range out.Datapoints {
		sum += aws.ToFloat64(dp.Sum)
	}
	return sum
}

func cluster(name string) cwtypes.Dimension {
	return cwtypes.Dimension{Name: aws.String(metrics.DimClusterName), Value: aws.String(name)}
}

// fixture reads testdata/name with the placeholders replaced.
func fixture(t *testing.T, name string, replace ...string) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return json.RawMessage(strings.NewReplacer(replace...).Replace(string(b)))
}

// countingEC2 counts DescribeInstances calls and the instance IDs asked for.
type countingEC2 struct {
	api   instancesAPI
	calls atomic.Int32
	asked [][]string
}

func (c *countingEC2) DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	c.calls.Add(1)
	for _, f := range in.Filters {
		c.asked = append(c.asked, f.Values)
	}
	return c.api.DescribeInstances(ctx, in, opts...)
}

type healthBody struct {
	ID        string   `json:"id"`
	Resources []string `json:"resources"`
	Detail    struct {
		EventTypeCode    string `json:"eventTypeCode"`
		StartTime        string `json:"startTime"`
		AffectedEntities []struct {
			EntityValue string            `json:"entityValue"`
			Tags        map[string]string `json:"tags"`
		} `json:"affectedEntities"`
	} `json:"detail"`
}

func TestHealthEventSpanningClustersIsSplit(t *testing.T) {
	w := newWorld(t)
	ev := fixture(t, "health-scheduled-change.json", "INSTANCE_ALPHA", w.alpha, "INSTANCE_BETA", w.beta, "INSTANCE_UNOWNED", w.unowned)

	if err := w.dispatcher(w.queues).Handle(context.Background(), ev); err != nil {
		t.Fatalf("Handle: %v", err)
	}

	for name, want := range map[string]string{"alpha": w.alpha, "beta": w.beta} {
		bodies := w.received(t, w.queues[name])
		if len(bodies) != 1 {
			t.Fatalf("cluster %s got %d messages, want 1", name, len(bodies))
		}
		var got healthBody
		if err := json.Unmarshal([]byte(bodies[0]), &got); err != nil {
			t.Fatalf("cluster %s body is not JSON: %v", name, err)
		}
		if len(got.Detail.AffectedEntities) != 1 || got.Detail.AffectedEntities[0].EntityValue != want {
			t.Errorf("cluster %s affectedEntities = %+v, want only %s", name, got.Detail.AffectedEntities, want)
		}
		if !slices.Equal(got.Resources, []string{want}) {
			t.Errorf("cluster %s resources = %v, want [%s]", name, got.Resources, want)
		}
		// The envelope is kept: same event ID, same Health details, the entity's tags.
		if got.ID != "1d7c5b9a-3f2e-4c61-8a0b-5e9f2d4c7a18" || got.Detail.EventTypeCode != "AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED" || got.Detail.StartTime != "Thu, 3 Dec 2026 02:00:00 GMT" {
			t.Errorf("cluster %s envelope changed: %+v", name, got)
		}
		if len(got.Detail.AffectedEntities) == 1 && got.Detail.AffectedEntities[0].Tags == nil {
			t.Errorf("cluster %s lost the entity's tags", name)
		}
	}
	if n := w.describe.calls.Load(); n != 1 {
		t.Errorf("DescribeInstances called %d times for one event, want 1 batched call", n)
	}
	if got := w.metricSum(t, metrics.CWDispatcherRouted, cluster("alpha")); got != 1 {
		t.Errorf("DispatcherRouted{alpha} = %v, want 1", got)
	}
	if got := w.metricSum(t, metrics.CWDispatcherDropped); got != 1 {
		t.Errorf("DispatcherDropped = %v, want 1 (the untagged instance)", got)
	}
}

func TestEventForUnownedInstanceIsDroppedAndCounted(t *testing.T) {
	w := newWorld(t)
	ev := fixture(t, "spot-interruption.json", "INSTANCE", w.unowned)

	if err := w.dispatcher(w.queues).Handle(context.Background(), ev); err != nil {
		t.Fatalf("Handle: %v (dropping is not a failure)", err)
	}
	for name, url := range w.queues {
		if bodies := w.received(t, url); len(bodies) != 0 {
			t.Errorf("cluster %s got %d messages for an instance it does not own", name, len(bodies))
		}
	}
	if got := w.metricSum(t, metrics.CWDispatcherDropped); got != 1 {
		t.Errorf("DispatcherDropped = %v, want 1", got)
	}
}

// TestOrganizationalViewRoutesByTheAffectedAccount (issue 27, 4): an AWS Health event of the
// organizational view (received by the management account 999988887777) is about its
// detail.affectedAccount and detail.eventRegion. One about the account the dispatcher serves
// is routed as any other; one about another member account is dropped and counted without a
// DescribeInstances call (on 469be7e it was routed to the clusters owning instances of the
// same IDs here).
func TestOrganizationalViewRoutesByTheAffectedAccount(t *testing.T) {
	w := newWorld(t)
	d := w.dispatcher(w.queues).WithOrigin("111122223333", "us-east-1")
	ids := []string{"INSTANCE_ALPHA", w.alpha, "INSTANCE_BETA", w.beta, "INSTANCE_UNOWNED", w.unowned}

	ours := fixture(t, "health-org-view.json", append(ids, "AFFECTED", "111122223333")...)
	if err := d.Handle(context.Background(), ours); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	for _, c := range []string{"alpha", "beta"} {
		if got := w.received(t, w.queues[c]); len(got) != 1 {
			t.Errorf("cluster %s got %d messages of an event about its account, want 1", c, len(got))
		}
	}

	calls := w.describe.calls.Load()
	theirs := fixture(t, "health-org-view.json", append(ids, "AFFECTED", "444455556666")...)
	if err := d.Handle(context.Background(), theirs); err != nil {
		t.Fatalf("Handle: %v (dropping is not a failure)", err)
	}
	for c, url := range w.queues {
		if got := w.received(t, url); len(got) != 0 {
			t.Errorf("cluster %s got %d messages of an event about another account", c, len(got))
		}
	}
	if n := w.describe.calls.Load() - calls; n != 0 {
		t.Errorf("%d DescribeInstances calls for another account's instances", n)
	}
	otherRegion := fixture(t, "health-org-view.json", append(ids, "AFFECTED", "111122223333", `"eventRegion": "us-east-1"`, `"eventRegion": "eu-west-1"`)...)
	if err := d.Handle(context.Background(), otherRegion); err != nil {
		t.Fatal(err)
	}
	for c, url := range w.queues {
		if got := w.received(t, url); len(got) != 0 {
			t.Errorf("cluster %s got %d messages of an event about another region", c, len(got))
		}
	}
	// The unowned instance of the first event, and the three of each dropped one.
	if got := w.metricSum(t, metrics.CWDispatcherDropped); got != 7 {
		t.Errorf("DispatcherDropped = %v, want 7", got)
	}
}

func TestSingleInstanceEventGoesUnchangedToItsCluster(t *testing.T) {
	w := newWorld(t)
	ev := fixture(t, "capacity-reservation-interruption.json", "INSTANCE", w.beta)

	if err := w.dispatcher(w.queues).Handle(context.Background(), ev); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if got := w.received(t, w.queues["beta"]); len(got) != 1 || got[0] != string(ev) {
		t.Errorf("beta got %q, want the event unchanged", got)
	}
	if got := w.received(t, w.queues["alpha"]); len(got) != 0 {
		t.Errorf("alpha got %d messages for beta's instance", len(got))
	}
}

func TestAMIStateChangeIsBroadcast(t *testing.T) {
	// A Capacity Block's expiration names its reservation, not its instances: each router
	// finds the NodeClaims that carry it.
	for _, file := range []string{"ami-state-change.json", "capacity-block-expiration.json"} {
		t.Run(file, func(t *testing.T) {
			w := newWorld(t)
			ev := fixture(t, file)

			if err := w.dispatcher(w.queues).Handle(context.Background(), ev); err != nil {
				t.Fatalf("Handle: %v", err)
			}
			for name, url := range w.queues {
				if got := w.received(t, url); len(got) != 1 || got[0] != string(ev) {
					t.Errorf("cluster %s got %q, want the event once, unchanged", name, got)
				}
			}
			if n := w.describe.calls.Load(); n != 0 {
				t.Errorf("the event needs no instance lookup; DescribeInstances called %d times", n)
			}
			if got := w.metricSum(t, metrics.CWDispatcherRouted, cluster("beta")); got != 1 {
				t.Errorf("DispatcherRouted{beta} = %v, want 1", got)
			}
		})
	}
}

// failed is one message of the failure queue.
type failed struct {
	body  string
	attrs map[string]string
}

// failures drains the failure queue.
func (w *world) failed(t *testing.T) []failed {
	t.Helper()
	out, err := w.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(w.failures), MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"},
	})
	if err != nil {
		t.Fatalf("ReceiveMessage: %v", err)
	}
	var got []failed
	for _, m := range out.Messages {
		f := failed{body: aws.ToString(m.Body), attrs: map[string]string{}}
		for k, v := range m.MessageAttributes {
			f.attrs[k] = aws.ToString(v.StringValue)
		}
		got = append(got, f)
	}
	slices.SortFunc(got, func(a, b failed) int { return strings.Compare(a.attrs[AttrCluster], b.attrs[AttrCluster]) })
	return got
}

// routedQueue sends to the queues in down through a client whose endpoint nobody listens on
// (a transient failure, as an outage is), and to the others through moto.
type routedQueue struct {
	up, down queueAPI
	downURLs []string
}

func (r routedQueue) SendMessage(ctx context.Context, in *sqs.SendMessageInput, opts ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	if slices.Contains(r.downURLs, aws.ToString(in.QueueUrl)) {
		return r.down.SendMessage(ctx, in, opts...)
	}
	return r.up.SendMessage(ctx, in, opts...)
}

// A failed delivery to one cluster is recorded in the failure queue, for that cluster only,
// with its reason; it does not fail the invocation, whose retry would deliver again to the
// clusters that got the event. A permanent error (no such queue, access denied) is never
// retried. Only when nothing was delivered and every error may pass is the invocation failed,
// for Lambda to retry without a duplicate.
func TestFailedDeliveriesGoToTheFailureQueuePerCluster(t *testing.T) {
	type want struct {
		err      bool
		alpha    int      // messages alpha gets
		failures []string // per failure-queue message: cluster/reason
	}
	for _, tc := range []struct {
		name            string
		missing, downed []string // clusters whose queue does not exist / cannot be reached
		noFailureQueue  bool
		event           string // "" for the AMI broadcast
		want            want
	}{
		{name: "no such queue for one cluster", missing: []string{"beta"},
			want: want{alpha: 1, failures: []string{"beta/" + string(reasonPermanent)}}},
		{name: "no such queue for every cluster", missing: []string{"alpha", "beta"},
			want: want{failures: []string{"alpha/" + string(reasonPermanent), "beta/" + string(reasonPermanent)}}},
		{name: "one cluster's queue unreachable after another got it", downed: []string{"beta"},
			want: want{alpha: 1, failures: []string{"beta/" + string(reasonTransient)}}},
		{name: "every queue unreachable: Lambda retries, nothing was delivered twice", downed: []string{"alpha", "beta"},
			want: want{err: true}},
		{name: "missing and unreachable", missing: []string{"alpha"}, downed: []string{"beta"},
			want: want{failures: []string{"alpha/" + string(reasonPermanent), "beta/" + string(reasonTransient)}}},
		{name: "unroutable event is not retried", event: `{"id":"x","source":"aws.autoscaling","detail-type":"EC2 Instance-terminate Lifecycle Action","detail":{}}`,
			want: want{failures: []string{"/" + string(reasonUnroutable)}}},
		{name: "failure queue unreachable: the invocation fails, nothing is lost", missing: []string{"beta"}, noFailureQueue: true,
			want: want{err: true, alpha: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			queues := maps.Clone(w.queues)
			for _, c := range tc.missing {
				queues[c] = strings.Replace(queues[c], "hr-"+c, "hr-deleted-"+c, 1)
			}
			down := sqs.NewFromConfig(aws.Config{Region: motoserver.Region, Credentials: w.sqs.Options().Credentials, RetryMaxAttempts: 1},
				func(o *sqs.Options) { o.BaseEndpoint = aws.String("http://127.0.0.1:1") })
			rq := routedQueue{up: w.sqs, down: down}
			for _, c := range tc.downed {
				rq.downURLs = append(rq.downURLs, queues[c])
			}
			failures := w.failures
			if tc.noFailureQueue {
				failures = strings.Replace(failures, "hr-dispatcher-failures", "hr-deleted-failures", 1)
			}
			d := New(NewOwnerCache(w.describe, w.clock), rq, w.cw, queues, failures, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ev := fixture(t, "ami-state-change.json")
			if tc.event != "" {
				ev = json.RawMessage(tc.event)
			}

			err := d.Handle(context.Background(), ev)
			if (err != nil) != tc.want.err {
				t.Fatalf("Handle = %v, want error: %v", err, tc.want.err)
			}
			if got := w.received(t, w.queues["alpha"]); len(got) != tc.want.alpha {
				t.Errorf("alpha got %d messages, want %d", len(got), tc.want.alpha)
			}
			var got []string
			for _, f := range w.failed(t) {
				got = append(got, f.attrs[AttrCluster]+"/"+f.attrs[AttrReason])
				if f.body != string(ev) {
					t.Errorf("failure record body = %.80q, want the event to re-send", f.body)
				}
				if f.attrs[AttrDetail] == "" || f.attrs[AttrEventID] == "" {
					t.Errorf("failure record has no detail or event ID: %v", f.attrs)
				}
				if c := f.attrs[AttrCluster]; c != "" && f.attrs[AttrQueueURL] != queues[c] {
					t.Errorf("failure record for %s names queue %q, want %q", c, f.attrs[AttrQueueURL], queues[c])
				}
				if f.attrs[AttrReason] == string(reasonPermanent) && !strings.Contains(f.attrs[AttrErrorCode], "NonExistentQueue") && !strings.Contains(f.attrs[AttrErrorCode], "QueueDoesNotExist") {
					t.Errorf("permanent failure's error code = %q, want the queue's absence", f.attrs[AttrErrorCode])
				}
			}
			if !slices.Equal(got, tc.want.failures) {
				t.Errorf("failure queue holds %v, want %v", got, tc.want.failures)
			}
		})
	}
}

// isPermanent is table-tested on the codes SQS and EC2 answer with, in both SQS protocols.
func TestPermanentErrors(t *testing.T) {
	for code, want := range map[string]bool{
		"AWS.SimpleQueueService.NonExistentQueue": true,
		"QueueDoesNotExist":                       true,
		"AccessDenied":                            true,
		"AccessDeniedException":                   true,
		"InvalidMessageContents":                  true,
		"KMS.AccessDeniedException":               true,
		"KmsAccessDenied":                         true,
		"KmsDisabled":                             true,
		"UnauthorizedOperation":                   true,
		"RequestThrottled":                        false,
		"ThrottlingException":                     false,
		"KmsThrottled":                            false,
		"InternalError":                           false,
		"ServiceUnavailable":                      false,
	} {
		err := fmt.Errorf("sending: %w", &smithy.GenericAPIError{Code: code, Message: "m"})
		if got := isPermanent(err); got != want {
			t.Errorf("isPermanent(%s) = %v, want %v", code, got, want)
		}
	}
	if isPermanent(errors.New("dial tcp 127.0.0.1:1: connection refused")) {
		t.Error("a connection error is permanent, want transient")
	}
}

func TestEC2FailureReturnsError(t *testing.T) {
	w := newWorld(t)
	// An EC2 endpoint nobody listens on: the call fails as a real outage would.
	down := ec2.NewFromConfig(aws.Config{Region: motoserver.Region, Credentials: w.ec2.Options().Credentials, RetryMaxAttempts: 1},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String("http://127.0.0.1:1") })
	d := New(NewOwnerCache(down, w.clock), w.sqs, w.cw, w.queues, w.failures, slog.New(slog.NewTextHandler(io.Discard, nil)))
	err := d.Handle(context.Background(), fixture(t, "spot-interruption.json", "INSTANCE", w.alpha))
	if err == nil || !strings.Contains(err.Error(), "describing instances") {
		t.Fatalf("Handle = %v, want the DescribeInstances error", err)
	}
	if got := w.received(t, w.queues["alpha"]); len(got) != 0 {
		t.Errorf("alpha got %d messages although its owner was unknown", len(got))
	}
}

// An event the dispatcher cannot route is recorded in the failure queue at once, not retried;
// without a failure queue it fails the invocation, for Lambda's on-failure destination.
func TestUnroutableEventsAreRecordedNotRetried(t *testing.T) {
	w := newWorld(t)
	events := map[string]json.RawMessage{
		"not json":      json.RawMessage(`{"id":`),
		"asg lifecycle": fixture(t, "asg-lifecycle.json", "INSTANCE", w.alpha),
		"no instance":   json.RawMessage(`{"id":"x","source":"aws.ec2","detail-type":"EC2 Instance Rebalance Recommendation","detail":{}}`),
	}
	d := w.dispatcher(w.queues)
	for name, ev := range events {
		if err := d.Handle(context.Background(), ev); err != nil {
			t.Errorf("%s: Handle = %v, want it recorded in the failure queue and no retry", name, err)
		}
	}
	got := w.failed(t)
	if len(got) != len(events) {
		t.Errorf("failure queue holds %d records, want %d", len(got), len(events))
	}
	for _, f := range got {
		if f.attrs[AttrReason] != string(reasonUnroutable) {
			t.Errorf("record of %.40q has reason %q, want %s", f.body, f.attrs[AttrReason], reasonUnroutable)
		}
	}

	noFailureQueue := New(NewOwnerCache(w.describe, w.clock), w.sqs, w.cw, w.queues, "", slog.New(slog.NewTextHandler(io.Discard, nil)))
	for name, ev := range events {
		if err := noFailureQueue.Handle(context.Background(), ev); err == nil {
			t.Errorf("%s without a failure queue: Handle = nil, want an error so the event reaches the on-failure destination", name)
		}
	}
	for name, url := range w.queues {
		if got := w.received(t, url); len(got) != 0 {
			t.Errorf("cluster %s got %d messages from unroutable events", name, len(got))
		}
	}
}

func TestOwnersAreCachedForTheTTL(t *testing.T) {
	w := newWorld(t)
	d := w.dispatcher(w.queues)
	ctx := context.Background()
	spot := fixture(t, "spot-interruption.json", "INSTANCE", w.alpha)
	state := json.RawMessage(`{"id":"f0e1d2c3-0000-4000-8000-000000000001","source":"aws.ec2","detail-type":"EC2 Instance State-change Notification","detail":{"instance-id":"` + w.alpha + `","state":"shutting-down"}}`)

	for _, ev := range []json.RawMessage{spot, state} {
		if err := d.Handle(ctx, ev); err != nil {
			t.Fatalf("Handle: %v", err)
		}
	}
	if n := w.describe.calls.Load(); n != 1 {
		t.Errorf("DescribeInstances called %d times for two events about one instance within the TTL, want 1", n)
	}
	w.clock.Step(OwnerTTL + time.Second)
	if err := d.Handle(ctx, spot); err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if n := w.describe.calls.Load(); n != 2 {
		t.Errorf("DescribeInstances called %d times after the TTL expired, want 2", n)
	}
	if got := w.received(t, w.queues["alpha"]); len(got) != 3 {
		t.Errorf("alpha got %d messages, want 3", len(got))
	}
}
