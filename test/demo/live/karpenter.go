package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

// demoPool is one NodePool of the demo with Karpenter: its annotations (as in
// test/demo/cluster.yaml), and the event each of its nodes gets.
type demoPool struct {
	name        string
	annotations map[string]string
	event       func(id string) string
	expect      string
}

// runWithKarpenter is `make demo KARPENTER=1`: the real Karpenter (its controller, the go.mod
// version, built from the module proxy and cached) launches the demo pools' nodes through
// moto, the router runs in forward mode in front of it, and the summary shows what Karpenter
// did with what the router sent.
func runWithKarpenter(root string) error {
	step("building (first run only) or finding Karpenter's controller, " + "test/tools/karpenter-bin.sh")
	build := exec.Command(filepath.Join(root, "test/tools/karpenter-bin.sh"))
	build.Stderr = os.Stderr
	out, err := build.Output()
	if err != nil {
		return fmt.Errorf("building Karpenter: %w", err)
	}
	dir, err := os.MkdirTemp("", "health-router-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	step("starting envtest, moto_server and Karpenter's controller (AWS_ENDPOINT_URL=moto, ISOLATED_VPC=true)")
	// The deadline starts after Karpenter's build, and leaves the control plane its first build
	// (issue 38 item 11: a cold demo ran out of its deadline building).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	stage, err := harness.StartKarpenterStage(ctx, strings.TrimSpace(string(out)), dir)
	if err != nil {
		return fmt.Errorf("starting Karpenter: %w", err)
	}
	defer stage.Stop()

	retirement := func(id string) string {
		start := time.Now().Add(240 * time.Hour).UTC().Format(time.RFC1123)
		return fmt.Sprintf(`{"version":"0","id":"demo-ret-%s","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":%q,"region":%q,"resources":[%q],"detail":{"eventArn":"arn:aws:health:%s::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/%s","service":"EC2","eventTypeCode":"AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED","eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"affectedEntities":[{"entityValue":%q}]}}`,
			id, time.Now().UTC().Format(time.RFC3339), harness.Region, id, harness.Region, id, start, id)
	}
	pools := []demoPool{
		{"default", nil, func(id string) string {
			return fmt.Sprintf(`{"version":"0","id":"demo-spot-%s","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":%q,"region":%q,"resources":["arn:aws:ec2:%s:123456789012:instance/%s"],"detail":{"instance-id":%q,"instance-action":"terminate"}}`,
				id, time.Now().UTC().Format(time.RFC3339), harness.Region, harness.Region, id, id)
		}, "Spot interruption: forwarded, Karpenter drains and terminates"},
		{"kafka", map[string]string{"healthrouter.io/action": "defer", "healthrouter.io/window-schedule": "0 2 * * 6", "healthrouter.io/window-duration": "4h", "healthrouter.io/max-concurrent-drains": "1"},
			retirement, "retirement in 10 days: deferred to the Saturday window, Karpenter does nothing"},
		{"ci-runners", map[string]string{"healthrouter.io/action": "ignore"}, retirement, "retirement: ignored, Karpenter does nothing"},
		{"gpu", map[string]string{"healthrouter.io/action.rebalance-recommendation": "drain"}, func(id string) string {
			return fmt.Sprintf(`{"version":"0","id":"demo-rb-%s","detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","account":"123456789012","time":%q,"region":%q,"resources":["arn:aws:ec2:%s:123456789012:instance/%s"],"detail":{"instance-id":%q}}`,
				id, time.Now().UTC().Format(time.RFC3339), harness.Region, harness.Region, id, id)
		}, "rebalance, pool asks to drain: the NodeClaim is deleted (Karpenter alone only records it)"},
	}
	step("creating the demo NodePools and letting Karpenter launch one node in each (moto's CreateFleet; the demo plays the kubelet)")
	nodes := map[string]harness.Node{}
	for _, p := range pools {
		if err := stage.NodePool(ctx, p.name, p.annotations); err != nil {
			return err
		}
		launched, err := stage.Launch(ctx, p.name, 1)
		if err != nil {
			return fmt.Errorf("launching a node in %s: %w", p.name, err)
		}
		nodes[p.name] = launched[0]
	}

	step("running the router in forward mode, in front of Karpenter's interruption queue")
	intake, err := stage.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("demo-intake")})
	if err != nil {
		return err
	}
	dlq, err := stage.SQS.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("demo-dlq")})
	if err != nil {
		return err
	}
	o := options.Run{
		QueueURL: aws.ToString(intake.QueueUrl), DeadLetterQueueURL: aws.ToString(dlq.QueueUrl), KarpenterQueueURL: stage.QueueURL, Signal: signal.ModeForward,
		Workers: 4, Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 10 * time.Second, Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: stage.Moto,
		Gates: checks.NewFeatureGates(), MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second,
	}
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": harness.Region} {
		os.Setenv(k, v) // moto's credentials for the router's SDK
	}
	routerCtx, stopRouter := context.WithCancel(ctx)
	defer stopRouter()
	done := make(chan error, 1)
	go func() {
		done <- app.Run(routerCtx, o, stage.Rest, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()

	step("sending one event per node to the router's intake queue")
	for _, p := range pools {
		body := p.event(nodes[p.name].Instance)
		if _, err := stage.SQS.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: intake.QueueUrl, MessageBody: aws.String(body)}); err != nil {
			return err
		}
	}
	time.Sleep(20 * time.Second) // the router decides; Karpenter drains and terminates what it was sent
	stopRouter()
	if err := <-done; err != nil {
		return fmt.Errorf("router: %w", err)
	}

	fmt.Println()
	fmt.Println("What Karpenter did:")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODEPOOL\tINSTANCE\tEVENT -> EXPECTED\tNODECLAIM\tINSTANCE IN EC2\tROUTER'S RECORD")
	for _, p := range pools {
		n := nodes[p.name]
		claim := "running"
		nc := &karpv1.NodeClaim{}
		switch err := stage.Kube.Get(ctx, client.ObjectKey{Name: n.NodeClaim}, nc); {
		case apierrors.IsNotFound(err):
			claim = "gone (Karpenter terminated it)"
		case err != nil:
			return err
		case !nc.DeletionTimestamp.IsZero():
			claim = "being deleted by Karpenter"
		}
		state, err := stage.InstanceState(ctx, n.Instance)
		if err != nil {
			state = "?"
		}
		rec := "-"
		mem, _ := record.Load(ctx, stage.Kube, n.NodeClaim)
		for _, d := range mem.Records {
			if d.Active() {
				rec = fmt.Sprintf("deferred until %s (%s)", d.Until.Format("2006-01-02 15:04"), d.Hold)
			} else {
				rec = d.State
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.name, n.Instance, p.expect, claim, state, rec)
	}
	tw.Flush()
	received, _ := stage.Metric("karpenter_interruption_received_messages_total", nil)
	disrupted, _ := stage.Metric("karpenter_nodeclaims_disrupted_total", nil)
	fmt.Printf("\nKarpenter's own metrics: karpenter_interruption_received_messages_total %g, karpenter_nodeclaims_disrupted_total %g\n", received, disrupted)
	return nil
}
