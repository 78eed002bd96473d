// Command live runs the demo scenario through the live router on local stand-ins: moto_server
// for SQS, EventBridge and EC2, and envtest's kube-apiserver with the Karpenter CRDs for the
// cluster. It loads test/demo/cluster.yaml into the API server, puts the demo events through
// EventBridge rules that target the intake queue, runs `health-router run`'s wiring, prints
// what the router did and why, and cleans up. `make demo` runs it; with KEEP=1 (`make demo
// KEEP=1`) everything stays up, with the metrics port on, until Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	ossignal "os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/replay"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

const region = "eu-west-1"

// demoNow is the time the demo events were written for; they are shifted to now.
var demoNow = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

var rules = map[string]string{
	"health":      `{"source":["aws.health"],"detail-type":["AWS Health Event"],"detail":{"service":["EC2"],"eventTypeCategory":["scheduledChange"]}}`,
	"spot":        `{"source":["aws.ec2"],"detail-type":["EC2 Spot Instance Interruption Warning"]}`,
	"rebalance":   `{"source":["aws.ec2"],"detail-type":["EC2 Instance Rebalance Recommendation"]}`,
	"state":       `{"source":["aws.ec2"],"detail-type":["EC2 Instance State-change Notification"]}`,
	"reservation": `{"source":["aws.ec2"],"detail-type":["EC2 Capacity Reservation Instance Interruption Warning"]}`,
	"ami":         `{"source":["aws.ec2"],"detail-type":["EC2 AMI State Change"]}`,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// quietLogs routes controller-runtime's logs (envtest, the client, the cache) to w at warning
// level and above. Without a logger set before envtest and the first client exist,
// controller-runtime prints a stack trace ("log.SetLogger(...) was never called") 30 s
// after start, which on a cold machine is before the demo shows anything.
func quietLogs(w io.Writer) {
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// Where the kept demo serves what it prints: the router's metrics and probes.
const (
	keptMetrics = "127.0.0.1:8080"
	keptProbes  = "127.0.0.1:8081"
)

func run() error {
	quietLogs(os.Stderr)
	// Ctrl-C stops what the demo started: the router, envtest, moto_server.
	sigCtx, stop := ossignal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	keep := os.Getenv("KEEP") != "" && os.Getenv("KEEP") != "0"
	root, err := repoRoot()
	if err != nil {
		return err
	}
	if os.Getenv("KARPENTER") != "" && os.Getenv("KARPENTER") != "0" {
		if keep {
			fmt.Println("(KEEP=1 is for the demo on its own; with KARPENTER=1 everything stops at the end)")
		}
		return runWithKarpenter(root)
	}
	step("starting moto_server (SQS, EventBridge, EC2) on a loopback port")
	start := harness.StartMoto
	if keep {
		start = harness.StartMotoDetached // stopped after the router when Ctrl-C ends the demo
	}
	motoURL, stopMoto, err := start()
	if err != nil {
		return err
	}
	defer stopMoto()

	step("starting kube-apiserver and etcd (envtest) with the Karpenter CRDs (on a fresh machine they are built from the Go module proxy first and cached under ~/.cache/health-router, once: a first make demo on a 2-core machine took 7 minutes in all)")
	env, restCfg, err := harness.StartEnvtest()
	if err != nil {
		return err
	}
	defer env.Stop()
	// The demo's own deadline starts once its servers run: a first run spends most of its time
	// building them (issue 38 item 11: the deadline ran out building them, and the demo failed at
	// its first SQS call).
	ctx, cancel := context.WithTimeout(sigCtx, 10*time.Minute)
	if keep {
		ctx, cancel = context.WithCancel(sigCtx)
	}
	defer cancel()
	scheme, err := cluster.NewScheme()
	if err != nil {
		return err
	}
	kube, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	awsCfg := aws.Config{Region: region, Credentials: credentials.NewStaticCredentialsProvider("demo", "demo", "")}
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"} {
		os.Setenv(k, v)
	}
	sqsc := sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(motoURL) })
	ebc := eventbridge.NewFromConfig(awsCfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(motoURL) })
	ec2c := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(motoURL) })

	step("creating the intake and dead-letter queues and the EventBridge rules")
	intakeURL, err := createQueue(ctx, sqsc, "health-router-intake")
	if err != nil {
		return err
	}
	dlqURL, err := createQueue(ctx, sqsc, "health-router-dlq")
	if err != nil {
		return err
	}
	arn, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(intakeURL), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		return err
	}
	for name, pattern := range rules {
		if _, err := ebc.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String("health-router-" + name), EventPattern: aws.String(pattern)}); err != nil {
			return err
		}
		if _, err := ebc.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String("health-router-" + name), Targets: []ebtypes.Target{{Id: aws.String("intake"), Arn: aws.String(arn.Attributes["QueueArn"])}}}); err != nil {
			return err
		}
	}

	step("registering the demo's available AMIs in EC2 (moto); the NVIDIA image is still being built")
	images, err := registerImages(ctx, ec2c, filepath.Join(root, "test/demo/aws.yaml"))
	if err != nil {
		return err
	}
	step("loading test/demo/cluster.yaml into the API server")
	claims, err := loadCluster(ctx, kube, filepath.Join(root, "test/demo/cluster.yaml"), images)
	if err != nil {
		return err
	}
	step("adding a pool in shadow (" + shadowPool + ": healthrouter.io/mode=shadow; it would defer to Saturday's window)")
	shadowed, err := loadShadowPool(ctx, kube)
	if err != nil {
		return err
	}
	claims = append(claims, shadowed)

	step("running the router (delete-nodeclaim mode; ReservedCapacity gate off: moto has no reservation API)")
	gates := checks.NewFeatureGates()
	_ = gates.Set("ReservedCapacity=false")
	o := options.Run{
		QueueURL: intakeURL, DeadLetterQueueURL: dlqURL, Signal: signal.ModeDeleteNodeClaim, Workers: 4,
		Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 30 * time.Second, Region: region, Account: options.OriginAny, AWSEndpointURL: motoURL,
		Gates: gates, MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second,
	}
	var reg prometheus.Registerer = prometheus.NewRegistry()
	if keep {
		// The registry the manager serves on /metrics, as `health-router run` uses it.
		o.MetricsBindAddress, o.HealthProbeBindAddress, reg = keptMetrics, keptProbes, ctrlmetrics.Registry
	}
	routerCtx, stopRouter := context.WithCancel(sigCtx)
	defer stopRouter()
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- app.Run(routerCtx, o, restCfg, reg, log) }()
	stopped := func() error {
		stopRouter()
		if err := <-done; err != nil {
			return fmt.Errorf("router: %w", err)
		}
		return nil
	}

	step("putting the demo events through EventBridge (times shifted to now)")
	sent, poison, err := putEvents(ctx, ebc, sqsc, intakeURL, filepath.Join(root, "test/demo/events"))
	if err != nil {
		return err
	}
	if err := putShadowEvent(ctx, ebc, time.Now()); err != nil {
		return err
	}
	sent++
	fmt.Printf("    %d events through EventBridge (its rules drop the RDS Health event: EC2 scheduled changes only; one is the pool in shadow's retirement), %d poison messages straight into the queue\n", sent, poison)
	step("waiting for the intake queue to be quiet (nothing waiting, nothing in flight, for 2s)")
	waited, err := waitQuiet(ctx, sqsc, intakeURL, 2*time.Second, 250*time.Millisecond, 90*time.Second)
	if err != nil {
		if ctx.Err() != nil {
			return errors.Join(ctx.Err(), stopped())
		}
		fmt.Printf("    %v; the table shows what the router has done so far\n", err)
	} else {
		fmt.Printf("    quiet after %s\n", waited.Round(100*time.Millisecond))
	}
	// The report is read while the router still runs: its Events are all posted by now.
	if err := report(ctx, kube, sqsc, intakeURL, dlqURL, claims); err != nil {
		return errors.Join(err, stopped())
	}
	if err := shadowReport(ctx, kube, os.Stdout); err != nil {
		return errors.Join(err, stopped())
	}
	if keep {
		if err := kept(sigCtx, restCfg, motoURL, intakeURL); err != nil {
			return errors.Join(err, stopped())
		}
	}
	return stopped()
}

// kept prints how to look at the demo still running, and waits for Ctrl-C.
func kept(ctx context.Context, restCfg *rest.Config, motoURL, intakeURL string) error {
	dir, err := os.MkdirTemp("", "health-router-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, restCfg); err != nil {
		return err
	}
	fmt.Printf(`
The demo is still up (KEEP=1): moto_server, kube-apiserver and the router. Try, in another terminal:
    kubectl --kubeconfig %[1]s get nodeclaims,nodes
    kubectl --kubeconfig %[1]s get events --sort-by=.lastTimestamp
    go run ./cmd/health-router status --kubeconfig %[1]s
    go run ./cmd/health-router status --shadow --kubeconfig %[1]s
    kubectl --kubeconfig %[1]s get healthrecords
    curl -s http://%[2]s/metrics | grep ^health_router_
    curl -s http://%[3]s/readyz
    AWS_ENDPOINT_URL=%[4]s AWS_ACCESS_KEY_ID=demo AWS_SECRET_ACCESS_KEY=demo AWS_REGION=%[5]s aws sqs get-queue-attributes --queue-url %[6]s --attribute-names All
Ctrl-C stops everything the demo started.
`, kubeconfig, keptMetrics, keptProbes, motoURL, region, intakeURL)
	<-ctx.Done()
	fmt.Println("\nstopping the router, kube-apiserver and etcd, moto_server")
	return nil
}

// writeKubeconfig writes a kubeconfig for envtest's API server (its client certificate).
func writeKubeconfig(path string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["demo"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["demo"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["demo"] = &clientcmdapi.Context{Cluster: "demo", AuthInfo: "demo"}
	kc.CurrentContext = "demo"
	return clientcmd.WriteToFile(*kc, path)
}

func step(s string) { fmt.Printf("==> %s\n", s) }

func report(ctx context.Context, kube client.Client, sqsc *sqs.Client, intakeURL, dlqURL string, claims []string) error {
	fmt.Println()
	fmt.Println("What the router did, per NodeClaim, and why:")
	rows, err := readClaims(ctx, kube, claims)
	if err != nil {
		return err
	}
	if err := writeClaims(os.Stdout, rows); err != nil {
		return err
	}
	attrs, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(intakeURL), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"}})
	if err != nil {
		return err
	}
	fmt.Printf("\nIntake queue: %s waiting, %s in flight (deferred events are held on their NodeClaims, not in SQS)\n",
		attrs.Attributes["ApproximateNumberOfMessages"], attrs.Attributes["ApproximateNumberOfMessagesNotVisible"])
	fmt.Println("\nDead-letter queue:")
	for {
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlqURL), MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}})
		if err != nil {
			return err
		}
		if len(out.Messages) == 0 {
			break
		}
		for _, m := range out.Messages {
			fmt.Printf("    %-13s %s\n", aws.ToString(m.MessageAttributes[intake.AttrReason].StringValue), aws.ToString(m.MessageAttributes[intake.AttrDetail].StringValue))
			sqsc.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(dlqURL), ReceiptHandle: m.ReceiptHandle})
		}
	}
	fmt.Println("\nEvents the router left on the NodeClaims and Nodes: kubectl get events --field-selector reason=HealthEventDrained (and HealthEventDeferred, HealthEventIgnored, ...)")
	return nil
}

func createQueue(ctx context.Context, c *sqs.Client, name string) (string, error) {
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		return "", err
	}
	return aws.ToString(out.QueueUrl), nil
}

// registerImages registers the available images of aws.yaml in moto and maps their demo
// IDs to moto's.
func registerImages(ctx context.Context, c *ec2.Client, path string) (map[string]string, error) {
	af, err := replay.LoadAWS(path)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for _, im := range af.Images {
		if im.State != ec2types.ImageStateAvailable {
			continue
		}
		out, err := c.RegisterImage(ctx, &ec2.RegisterImageInput{Name: im.Name, Architecture: im.Architecture, RootDeviceName: aws.String("/dev/xvda")})
		if err != nil {
			return nil, err
		}
		ids[aws.ToString(im.ImageId)] = aws.ToString(out.ImageId)
	}
	return ids, nil
}

// loadCluster creates the snapshot's objects (with their status) and returns the NodeClaims.
func loadCluster(ctx context.Context, kube client.Client, path string, images map[string]string) ([]string, error) {
	s, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	objs, _, err := cluster.Load(s, f)
	if err != nil {
		return nil, err
	}
	var claims []string
	for _, o := range objs {
		switch obj := o.(type) {
		case *awsv1.EC2NodeClass:
			status := obj.Status.DeepCopy()
			for i := range status.AMIs {
				if id, ok := images[status.AMIs[i].ID]; ok {
					status.AMIs[i].ID = id
				}
			}
			if err := kube.Create(ctx, obj); err != nil {
				return nil, err
			}
			obj.Status = *status
			if err := kube.Status().Update(ctx, obj); err != nil {
				return nil, err
			}
		case *karpv1.NodeClaim:
			status := obj.Status.DeepCopy()
			obj.Finalizers = []string{"karpenter.sh/termination"} // Karpenter's: the claim stays while it drains
			if err := kube.Create(ctx, obj); err != nil {
				return nil, err
			}
			obj.Status = *status
			if err := kube.Status().Update(ctx, obj); err != nil {
				return nil, err
			}
			claims = append(claims, obj.Name)
		default:
			if err := kube.Create(ctx, o); err != nil {
				return nil, err
			}
		}
	}
	return claims, nil
}

// putEvents sends each demo event through EventBridge, shifted so that its times keep
// their distance from now; bodies that are not events go straight into the intake queue.
func putEvents(ctx context.Context, ebc *eventbridge.Client, sqsc *sqs.Client, intakeURL, dir string) (sent, poison int, err error) {
	shift := time.Since(demoNow)
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	sort.Strings(files)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			return 0, 0, err
		}
		var bodies []string
		if strings.HasSuffix(file, ".jsonl") {
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				bodies = append(bodies, line)
			}
		} else {
			bodies = []string{string(b)}
		}
		for _, body := range bodies {
			var ev struct {
				Source     string          `json:"source"`
				DetailType string          `json:"detail-type"`
				Time       string          `json:"time"`
				Resources  json.RawMessage `json:"resources"`
				Detail     map[string]any  `json:"detail"`
			}
			if json.Unmarshal([]byte(body), &ev) != nil || ev.Source == "" || ev.Source == "aws.autoscaling" {
				if _, err := sqsc.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(intakeURL), MessageBody: aws.String(body)}); err != nil {
					return 0, 0, err
				}
				poison++
				continue
			}
			t, _ := time.Parse(time.RFC3339, ev.Time)
			for _, k := range []string{"startTime", "endTime"} {
				if v, ok := ev.Detail[k].(string); ok {
					if ht, err := time.Parse("Mon, 2 Jan 2006 15:04:05 MST", v); err == nil {
						ev.Detail[k] = ht.Add(shift).UTC().Format(time.RFC1123)
					}
				}
			}
			if v, ok := ev.Detail["instance-termination-time"].(string); ok {
				if tt, err := time.Parse(time.RFC3339, v); err == nil {
					ev.Detail["instance-termination-time"] = tt.Add(shift).UTC().Format(time.RFC3339)
				}
			}
			detail, _ := json.Marshal(ev.Detail)
			var resources []string
			_ = json.Unmarshal(ev.Resources, &resources)
			out, err := ebc.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
				Source: aws.String(ev.Source), DetailType: aws.String(ev.DetailType), Detail: aws.String(string(detail)),
				Resources: resources, Time: aws.Time(t.Add(shift)),
			}}})
			if err != nil || out.FailedEntryCount > 0 {
				return 0, 0, fmt.Errorf("PutEvents %s: %v", file, err)
			}
			sent++
		}
	}
	return sent, poison, nil
}

func repoRoot() (string, error) { return harness.RepoRoot() }
