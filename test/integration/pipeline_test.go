package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// rules are the EventBridge patterns the Terraform module installs.
var rules = map[string]string{
	"health":      `{"source":["aws.health"],"detail-type":["AWS Health Event"],"detail":{"service":["EC2"],"eventTypeCategory":["scheduledChange"]}}`,
	"spot":        `{"source":["aws.ec2"],"detail-type":["EC2 Spot Instance Interruption Warning"]}`,
	"rebalance":   `{"source":["aws.ec2"],"detail-type":["EC2 Instance Rebalance Recommendation"]}`,
	"state":       `{"source":["aws.ec2"],"detail-type":["EC2 Instance State-change Notification"]}`,
	"reservation": `{"source":["aws.ec2"],"detail-type":["EC2 Capacity Reservation Instance Interruption Warning"]}`,
	"ami":         `{"source":["aws.ec2"],"detail-type":["EC2 AMI State Change"]}`,
	"block":       `{"source":["aws.ec2"],"detail-type":["Capacity Block Expiration Warning","Capacity Block Reservation Expiration Warning"]}`,
}

// stage is moto (SQS, EventBridge, EC2) and a kube-apiserver with the Karpenter CRDs,
// with the intake, dead-letter and Karpenter queues and the rules in place.
type stage struct {
	t                          *testing.T
	ctx                        context.Context
	moto                       string
	restCfg                    *rest.Config
	kube                       client.Client
	sqs                        *sqs.Client
	events                     *eventbridge.Client
	intakeURL, dlqURL, karpURL string
	image                      string
	// registry takes the metrics of the routers the stage starts when set (a test that reads
	// them); each router gets a registry of its own otherwise.
	registry *prometheus.Registry
}

func newStage(t *testing.T) *stage {
	t.Helper()
	if testing.Short() {
		t.Skip("moto and envtest suite")
	}
	return newStageWith(t, harness.KubeAPIServer(t))
}

func newStageWith(t *testing.T, restCfg *rest.Config) *stage {
	t.Helper()
	s := &stage{t: t, ctx: context.Background(), restCfg: restCfg}
	s.moto = harness.Moto(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "testing")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "testing")
	t.Setenv("AWS_REGION", harness.Region)
	cfg := harness.AWSConfig(nil)
	s.sqs = sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(s.moto) })
	s.events = eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(s.moto) })
	ec2c := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(s.moto) })
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if s.kube, err = client.New(s.restCfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	s.intakeURL = s.queue("health-router-intake")
	s.dlqURL = s.queue("health-router-dlq")
	s.karpURL = s.queue("karpenter-interruption")
	attrs, err := s.sqs.GetQueueAttributes(s.ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(s.intakeURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	for name, pattern := range rules {
		if _, err := s.events.PutRule(s.ctx, &eventbridge.PutRuleInput{Name: aws.String("health-router-" + name), EventPattern: aws.String(pattern)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.events.PutTargets(s.ctx, &eventbridge.PutTargetsInput{Rule: aws.String("health-router-" + name), Targets: []ebtypes.Target{{Id: aws.String("intake"), Arn: aws.String(attrs.Attributes["QueueArn"])}}}); err != nil {
			t.Fatal(err)
		}
	}
	img, err := ec2c.RegisterImage(s.ctx, &ec2.RegisterImageInput{Name: aws.String("al2023-x86_64"), Architecture: ec2types.ArchitectureValuesX8664, RootDeviceName: aws.String("/dev/xvda")})
	if err != nil {
		t.Fatal(err)
	}
	s.image = aws.ToString(img.ImageId)
	s.create(&awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: awsv1.EC2NodeClassSpec{
		Role: "KarpenterNodeRole-test", AMISelectorTerms: []awsv1.AMISelectorTerm{{Alias: "al2023@latest"}},
		SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
		SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "test"}}},
	}})
	nc := &awsv1.EC2NodeClass{}
	if err := s.kube.Get(s.ctx, client.ObjectKey{Name: "default"}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.AMIs = []awsv1.AMI{{ID: s.image, Requirements: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}
	if err := s.kube.Status().Update(s.ctx, nc); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *stage) queue(name string) string {
	out, err := s.sqs.CreateQueue(s.ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"MessageRetentionPeriod": "1209600"}})
	if err != nil {
		s.t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

func (s *stage) create(obj client.Object) {
	s.t.Helper()
	if err := s.kube.Create(s.ctx, obj); err != nil {
		s.t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// pool creates a NodePool with annotations.
func (s *stage) pool(name string, ann map[string]string) {
	s.create(&karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
		}}},
	})
}

// node creates an on-demand NodeClaim (held by a finalizer, as Karpenter's termination
// finalizer holds it while draining) and its Node, and returns the NodeClaim's name.
func (s *stage) node(pool, id string) string {
	return s.nodeOf(pool, id, karpv1.CapacityTypeOnDemand)
}

// spotNode is node for a Spot instance: the only kind a Spot interruption warning is taken
// at its word for (an urgent event is checked against its node's capacity type).
func (s *stage) spotNode(pool, id string) string {
	return s.nodeOf(pool, id, karpv1.CapacityTypeSpot)
}

func (s *stage) nodeOf(pool, id, capacityType string) string {
	name := pool + "-" + id[len(id)-6:]
	labels := map[string]string{karpv1.NodePoolLabelKey: pool, corev1.LabelArchStable: "amd64", karpv1.CapacityTypeLabelKey: capacityType}
	claim := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Finalizers: []string{"karpenter.sh/termination"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{pool}}},
		},
	}
	s.create(claim)
	claim.Status.ProviderID = "aws:///eu-west-1a/" + id
	if err := s.kube.Status().Update(s.ctx, claim); err != nil {
		s.t.Fatal(err)
	}
	s.create(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "ip-" + id[len(id)-8:], Labels: labels}, Spec: corev1.NodeSpec{ProviderID: "aws:///eu-west-1a/" + id}})
	return name
}

// router runs the router (the production wiring, app.Run) until the test ends.
func (s *stage) router(mode signal.Mode, opts ...func(*options.Run)) {
	s.t.Helper()
	stop := s.routerStoppable(mode, opts...)
	s.t.Cleanup(stop)
}

// routerStoppable runs the router until the returned stop is called.
func (s *stage) routerStoppable(mode signal.Mode, opts ...func(*options.Run)) (stop func()) {
	s.t.Helper()
	o := options.Run{
		QueueURL: s.intakeURL, DeadLetterQueueURL: s.dlqURL, Signal: mode, Workers: 4,
		Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 3 * time.Second, Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: s.moto,
		Gates: checks.NewFeatureGates(), MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second,
		KubeClientQPS: 200, KubeClientBurst: 300, InstanceParallelism: 16, ForwardConfirmTimeout: 20 * time.Second,
	}
	if mode == signal.ModeForward {
		o.KarpenterQueueURL = s.karpURL
	}
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{s.t}, nil))
	}
	restCfg := s.restCfg
	reg := s.registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	go func() { done <- app.Run(ctx, o, restCfg, reg, log) }()
	t := s.t
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("router: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("router did not stop within 30s")
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// put sends an event through moto's EventBridge, as AWS would.
func (s *stage) put(source, detailType string, detail any, resources ...string) time.Time {
	s.t.Helper()
	b, _ := json.Marshal(detail)
	out, err := s.events.PutEvents(s.ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		Source: aws.String(source), DetailType: aws.String(detailType), Detail: aws.String(string(b)), Resources: resources, Time: aws.Time(time.Now()),
	}}})
	if err != nil || out.FailedEntryCount != 0 {
		s.t.Fatalf("PutEvents: %v %+v", err, out)
	}
	return time.Now()
}

func (s *stage) putRaw(body string) {
	if _, err := s.sqs.SendMessage(s.ctx, &sqs.SendMessageInput{QueueUrl: aws.String(s.intakeURL), MessageBody: aws.String(body)}); err != nil {
		s.t.Fatal(err)
	}
}

func health(code string, start time.Time, status string, arn string, ids ...string) map[string]any {
	var entities []map[string]any
	for _, id := range ids {
		entities = append(entities, map[string]any{"entityValue": id, "tags": map[string]string{}})
	}
	return map[string]any{"eventArn": arn, "service": "EC2", "eventTypeCode": code, "eventTypeCategory": "scheduledChange",
		"statusCode": status, "startTime": start.UTC().Format(time.RFC1123), "endTime": start.UTC().Format(time.RFC1123), "affectedEntities": entities}
}

func (s *stage) claim(name string) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{}
	if err := s.kube.Get(s.ctx, client.ObjectKey{Name: name}, nc); err != nil {
		s.t.Fatalf("nodeclaim %s: %v", name, err)
	}
	return nc
}

// records is the router's memory of NodeClaim name: its records (none when it keeps none).
func (s *stage) records(name string) []record.Record {
	m, err := record.Load(s.ctx, s.kube, name)
	if err != nil {
		s.t.Fatalf("healthrecord %s: %v", name, err)
	}
	return m.Records
}

// memory is the router's memory of NodeClaim name.
func (s *stage) memory(name string) record.Memory {
	m, err := record.Load(s.ctx, s.kube, name)
	if err != nil {
		s.t.Fatalf("healthrecord %s: %v", name, err)
	}
	return m
}

func (s *stage) eventually(what string, timeout time.Duration, cond func() bool) {
	s.t.Helper()
	if err := wait.PollUntilContextTimeout(s.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		v, f := s.queueCounts(s.intakeURL)
		s.t.Fatalf("%s: not within %s (intake queue: %d visible, %d in flight)", what, timeout, v, f)
	}
}

// drain receives everything in a queue (the Karpenter queue, the DLQ) and deletes it.
func (s *stage) drain(url string) []sqstypes.Message {
	var all []sqstypes.Message
	for {
		out, err := s.sqs.ReceiveMessage(s.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 0})
		if err != nil {
			s.t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return all
		}
		for _, m := range out.Messages {
			s.sqs.DeleteMessage(s.ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
		}
		all = append(all, out.Messages...)
	}
}

func (s *stage) queueCounts(url string) (visible, inFlight int) {
	out, err := s.sqs.GetQueueAttributes(s.ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}})
	if err != nil {
		s.t.Fatal(err)
	}
	fmt.Sscan(out.Attributes["ApproximateNumberOfMessages"], &visible)
	fmt.Sscan(out.Attributes["ApproximateNumberOfMessagesNotVisible"], &inFlight)
	return visible, inFlight
}

func TestPipeline(t *testing.T) {
	s := newStage(t)

	t.Run("drain by deleting the NodeClaim", func(t *testing.T) {
		s.t = t
		s.pool("web", nil)
		claim := s.spotNode("web", "i-0a1b2c3d4e5f60001")
		s.router(signal.ModeDeleteNodeClaim)
		put := s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0a1b2c3d4e5f60001", "instance-action": "terminate"}, "arn:aws:ec2:eu-west-1:123456789012:instance/i-0a1b2c3d4e5f60001")
		s.eventually("nodeclaim deleted", 30*time.Second, func() bool { return !s.claim(claim).DeletionTimestamp.IsZero() })
		t.Logf("end-to-end latency, PutEvents -> NodeClaim deleted: %s", time.Since(put).Round(time.Millisecond))
		s.eventually("intake queue empty", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
		// A drain with no deferral to clear is the DELETE alone; the drain is told by its Event.
		s.eventually("a HealthEventDrained Event on the NodeClaim", 30*time.Second, func() bool {
			var evs eventsv1.EventList
			if err := s.kube.List(s.ctx, &evs); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == signal.ReasonDrained && e.Regarding.Name == claim {
					return true
				}
			}
			return false
		})
	})

	t.Run("forward restricted to the drained instance, duplicates once", func(t *testing.T) {
		s.t = t
		s.pool("kafka", map[string]string{"healthrouter.io/action.scheduled-change.instance-reboot": "ignore"})
		a := s.node("kafka", "i-0a1b2c3d4e5f60002")
		b := s.node("kafka", "i-0a1b2c3d4e5f60003")
		s.router(signal.ModeForward)
		start := time.Now().Add(72 * time.Hour)
		arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/1"
		put := s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start, "upcoming", arn, "i-0a1b2c3d4e5f60002"), "i-0a1b2c3d4e5f60002")
		// The same event delivered three times (EventBridge and SQS are at-least-once).
		var first []sqstypes.Message
		s.eventually("forwarded to Karpenter", 30*time.Second, func() bool { first = append(first, s.drain(s.karpURL)...); return len(first) > 0 })
		t.Logf("end-to-end latency, PutEvents -> forwarded to Karpenter: %s", time.Since(put).Round(time.Millisecond))
		body := aws.ToString(first[0].Body)
		if !strings.Contains(body, "i-0a1b2c3d4e5f60002") || strings.Contains(body, "i-0a1b2c3d4e5f60003") {
			t.Errorf("forwarded body: %s", body)
		}
		for i := 0; i < 2; i++ {
			s.putRaw(body)
		}
		// A reboot of the other instance is ignored by the pool: nothing forwarded.
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED", start, "upcoming", arn+"-reboot", "i-0a1b2c3d4e5f60003"), "i-0a1b2c3d4e5f60003")
		s.eventually("intake queue empty", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
		if extra := s.drain(s.karpURL); len(first)+len(extra) != 1 {
			t.Errorf("%d messages forwarded for one drain", len(first)+len(extra))
		}
		if s.memory(b).Drain != nil || s.memory(a).Drain == nil {
			t.Error("drain-signalled annotations wrong")
		}
	})

	t.Run("a forward Karpenter drops falls back to deleting the NodeClaim", func(t *testing.T) {
		s.t = t
		s.pool("drop", nil)
		claim := s.spotNode("drop", "i-0a1b2c3d4e5f60008")
		// A Karpenter that reads its queue and drops every message unread (as it does a body
		// it cannot parse): the router must not count the drain as done.
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		dropped := make(chan string, 10)
		go func() {
			for ctx.Err() == nil {
				out, err := s.sqs.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.karpURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
				if err != nil {
					continue
				}
				for _, m := range out.Messages {
					s.sqs.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.karpURL), ReceiptHandle: m.ReceiptHandle})
					dropped <- aws.ToString(m.Body)
				}
			}
		}()
		s.router(signal.ModeForward, func(o *options.Run) { o.ForwardConfirmTimeout = 3 * time.Second })
		s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0a1b2c3d4e5f60008", "instance-action": "terminate"}, "arn:aws:ec2:eu-west-1:123456789012:instance/i-0a1b2c3d4e5f60008")
		select {
		case body := <-dropped:
			if !strings.Contains(body, "i-0a1b2c3d4e5f60008") {
				t.Errorf("forwarded %s", body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("nothing forwarded")
		}
		s.eventually("NodeClaim deleted by the router after the confirmation bound", 30*time.Second, func() bool { return !s.claim(claim).DeletionTimestamp.IsZero() })
		s.eventually("the fallback recorded in the drain stamp", 10*time.Second, func() bool {
			var via string
			if d := s.memory(claim).Drain; d != nil {
				via = d.Via
			}
			return signal.Mode(via) == signal.ModeDeleteNodeClaim
		})
		s.eventually("a HealthEventForwardUnconfirmed Warning", 30*time.Second, func() bool {
			var evs eventsv1.EventList
			if err := s.kube.List(s.ctx, &evs); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == signal.ReasonForwardUnconfirmed && e.Regarding.Name == claim && e.Type == corev1.EventTypeWarning {
					return true
				}
			}
			return false
		})
	})

	t.Run("deferred event comes back at its time", func(t *testing.T) {
		s.t = t
		s.pool("db", map[string]string{"healthrouter.io/action": "defer", "healthrouter.io/drain-lead": "1h"})
		claim := s.node("db", "i-0a1b2c3d4e5f60004")
		s.router(signal.ModeDeleteNodeClaim)
		// Deadline one hour and eight seconds away: deferred until deadline - drain-lead.
		start := time.Now().Add(time.Hour + 8*time.Second)
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_STOP_SCHEDULED", start, "upcoming", "arn:aws:health:eu-west-1::event/EC2/STOP/4", "i-0a1b2c3d4e5f60004"), "i-0a1b2c3d4e5f60004")
		s.eventually("deferral recorded", 30*time.Second, func() bool {
			ds := s.records(claim)
			return len(ds) == 1 && ds[0].State == record.StateDeferred
		})
		if !s.claim(claim).DeletionTimestamp.IsZero() {
			t.Fatal("drained before its time")
		}
		// The deferral lives on the NodeClaim, with the event: nothing waits in SQS.
		s.eventually("intake message deleted once the deferral is recorded", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
		if d := s.records(claim)[0]; d.Hold != "deadline" || !strings.Contains(string(d.Event), "i-0a1b2c3d4e5f60004") {
			t.Errorf("record %+v", d)
		}
		s.eventually("drained at deadline - drain-lead", 40*time.Second, func() bool { return !s.claim(claim).DeletionTimestamp.IsZero() })
		if d := time.Until(start.Add(-time.Hour)); d > time.Second {
			t.Errorf("drained %s early", d)
		}
		if ds := s.records(claim); len(ds) != 0 {
			t.Errorf("deferral left after the drain: %+v", ds)
		}
	})

	t.Run("stop then start cancels the deferral", func(t *testing.T) {
		s.t = t
		s.pool("cache", map[string]string{"healthrouter.io/action.state-change": "defer", "healthrouter.io/restart-grace": "8s"})
		claim := s.node("cache", "i-0a1b2c3d4e5f60005")
		s.router(signal.ModeDeleteNodeClaim)
		s.put("aws.ec2", "EC2 Instance State-change Notification", map[string]string{"instance-id": "i-0a1b2c3d4e5f60005", "state": "stopping"})
		s.eventually("stop deferred", 30*time.Second, func() bool { return len(s.records(claim)) == 1 })
		s.put("aws.ec2", "EC2 Instance State-change Notification", map[string]string{"instance-id": "i-0a1b2c3d4e5f60005", "state": "running"})
		s.eventually("deferral cancelled", 30*time.Second, func() bool {
			ds := s.records(claim)
			return len(ds) == 1 && ds[0].State == record.StateCancelled
		})
		// After restart-grace the cancelled record is pruned, and nothing is drained.
		s.eventually("cancelled deferral pruned after restart-grace", 45*time.Second, func() bool { return len(s.records(claim)) == 0 })
		if !s.claim(claim).DeletionTimestamp.IsZero() {
			t.Error("drained although the instance ran again")
		}
		if v, f := s.queueCounts(s.intakeURL); v+f != 0 {
			t.Errorf("intake queue holds %d messages", v+f)
		}
	})

	t.Run("dashboard metrics published to CloudWatch", func(t *testing.T) {
		s.t = t
		s.pool("batch", nil)
		s.spotNode("batch", "i-0a1b2c3d4e5f60006")
		s.router(signal.ModeDeleteNodeClaim, func(o *options.Run) {
			o.CloudWatchMetrics, o.ClusterName, o.CloudWatchInterval = true, "prod-eu-west-1", 10*time.Second
		})
		s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0a1b2c3d4e5f60006", "instance-action": "terminate"})
		cw := cloudwatch.NewFromConfig(harness.AWSConfig(nil), func(o *cloudwatch.Options) {
			o.BaseEndpoint = aws.String(s.moto)
			o.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801)
		})
		s.eventually("Decisions and Heartbeat in CloudWatch", 40*time.Second, func() bool {
			out, err := cw.ListMetrics(s.ctx, &cloudwatch.ListMetricsInput{Namespace: aws.String(metrics.CloudWatchNamespace)})
			if err != nil {
				return false
			}
			var decision, heartbeat bool
			for _, m := range out.Metrics {
				dims := map[string]string{}
				for _, d := range m.Dimensions {
					dims[aws.ToString(d.Name)] = aws.ToString(d.Value)
				}
				switch aws.ToString(m.MetricName) {
				case metrics.CWDecisions:
					decision = decision || (dims["ClusterName"] == "prod-eu-west-1" && dims["Kind"] == "spot-interruption" && dims["Action"] == "drain")
				case metrics.CWHeartbeat:
					heartbeat = heartbeat || dims["ClusterName"] == "prod-eu-west-1"
				}
			}
			return decision && heartbeat
		})
	})

	t.Run("poison messages reach the dead-letter queue with reasons", func(t *testing.T) {
		s.t = t
		s.router(signal.ModeDeleteNodeClaim)
		s.putRaw("{not json")
		s.putRaw(`{"version":"0","id":"x1","detail-type":"EC2 Instance-terminate Lifecycle Action","source":"aws.autoscaling","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{}}`)
		s.putRaw(`{"version":"0","id":"x2","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"service":"RDS","eventTypeCategory":"scheduledChange","eventArn":"a","eventTypeCode":"AWS_RDS_X"}}`)
		var dead []sqstypes.Message
		s.eventually("three dead letters", 30*time.Second, func() bool { dead = append(dead, s.drain(s.dlqURL)...); return len(dead) >= 3 })
		reasons := map[string]bool{}
		for _, m := range dead {
			r := aws.ToString(m.MessageAttributes[intake.AttrReason].StringValue)
			reasons[r] = true
			if aws.ToString(m.MessageAttributes[intake.AttrDetail].StringValue) == "" || aws.ToString(m.MessageAttributes[intake.AttrSourceMessageID].StringValue) == "" {
				t.Errorf("dead letter without detail or source: %+v", m.MessageAttributes)
			}
		}
		for _, want := range []string{"malformed", "unknown-kind", "unsupported"} {
			if !reasons[want] {
				t.Errorf("no dead letter with reason %s (got %v)", want, reasons)
			}
		}
		s.eventually("intake queue empty", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
	})

	t.Run("a deferral of days is held on the NodeClaim and survives a restart", func(t *testing.T) {
		s.t = t
		s.pool("ledger", map[string]string{"healthrouter.io/action": "defer"})
		claim := s.node("ledger", "i-0a1b2c3d4e5f60007")
		stop := s.routerStoppable(signal.ModeDeleteNodeClaim)
		// Retirement in ten days: deferred until deadline - drain-lead. SQS could hide a
		// message 12 hours at most; the NodeClaim holds it as long as it takes.
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", time.Now().Add(240*time.Hour), "upcoming", "arn:aws:health:eu-west-1::event/EC2/RET/7", "i-0a1b2c3d4e5f60007"), "i-0a1b2c3d4e5f60007")
		s.eventually("deferral recorded", 30*time.Second, func() bool { return len(s.records(claim)) == 1 })
		s.eventually("intake queue empty", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
		stop()
		s.router(signal.ModeDeleteNodeClaim) // a restarted router finds the deferral where it was
		time.Sleep(3 * time.Second)
		ds := s.records(claim)
		if len(ds) != 1 || !ds[0].Active() || ds[0].Until.Before(time.Now().Add(238*time.Hour)) {
			t.Errorf("deferral after a restart: %+v", ds)
		}
		if !s.claim(claim).DeletionTimestamp.IsZero() {
			t.Error("drained ten days early")
		}
	})
}

// TestKubernetesOutage: with the kube-apiserver unreachable, a drain cannot be carried
// out; the message stays in the queue (retried with backoff, never deleted or
// dead-lettered), and once the API server is back the drain happens.
func TestKubernetesOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("moto and envtest suite")
	}
	cfg := harness.KubeAPIServer(t)
	s := newStageWith(t, cfg)
	s.pool("web", nil)
	claim := s.spotNode("web", "i-0a1b2c3d4e5f60101")
	// The router reaches the API server through a proxy that the test can cut.
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := harness.NewProxy(t, u.Host)
	routerCfg := rest.CopyConfig(cfg)
	routerCfg.Host = "https://" + proxy.Addr
	s.restCfg = routerCfg
	s.router(signal.ModeDeleteNodeClaim)
	s.restCfg = cfg
	time.Sleep(2 * time.Second) // the router's cache has synced

	proxy.Down()
	s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0a1b2c3d4e5f60101", "instance-action": "terminate"})
	time.Sleep(8 * time.Second) // past the handle timeout: the message is retried, with backoff
	visible, inFlight := s.queueCounts(s.intakeURL)
	if visible+inFlight != 1 {
		t.Fatalf("during the outage the message must stay in the queue: %d visible, %d in flight", visible, inFlight)
	}
	if dead := s.drain(s.dlqURL); len(dead) != 0 {
		t.Fatalf("dead-lettered during an outage: %d", len(dead))
	}
	proxy.Up()
	s.eventually("drained after the outage", 90*time.Second, func() bool {
		nc := &karpv1.NodeClaim{}
		return s.kube.Get(s.ctx, client.ObjectKey{Name: claim}, nc) == nil && !nc.DeletionTimestamp.IsZero()
	})
	s.eventually("intake queue empty", 30*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
}
