// Package karpenter runs the router beside the real Karpenter: the AWS provider's controller
// (built by test/tools/karpenter-bin.sh, the version in go.mod) on envtest's kube-apiserver
// and moto_server. It proves with Karpenter's own outcomes (NodeClaim deleted by Karpenter,
// instance terminated in moto, Karpenter's metrics) that what the router signals makes
// Karpenter act, and when.
package karpenter

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
	"github.com/health-router/health-router/test/harness/inproc"
)

// stage is the one envtest + moto + Karpenter of the package.
var stage *harness.KarpenterStage

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	start := time.Now()
	bin := os.Getenv("KARPENTER_BIN")
	if bin == "" {
		// Outside `make test`, build (or find in the cache) the controller as make does.
		fmt.Fprintln(os.Stderr, "KARPENTER_BIN is not set: running test/tools/karpenter-bin.sh")
		cmd := exec.Command(filepath.Join("..", "tools", "karpenter-bin.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: the Karpenter suite needs Karpenter's controller, and building it failed: %v\n", err)
			return 1
		}
		bin = strings.TrimSpace(string(out))
	}
	dir, err := os.MkdirTemp("", "karpenter-suite-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	stage, err = harness.StartKarpenterStage(ctx, bin, dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: starting Karpenter beside envtest and moto: %v\n", err)
		tail(filepath.Join(dir, "karpenter.log"), 60)
		return 1
	}
	fmt.Fprintf(os.Stderr, "envtest, moto and Karpenter up in %s\n", time.Since(start).Round(100*time.Millisecond))
	code := m.Run()
	stage.Stop()
	if code != 0 {
		tail(stage.Log, 80)
	} else {
		os.RemoveAll(dir)
	}
	return code
}

// tail prints the end of Karpenter's log, to explain a failure.
func tail(path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	fmt.Fprintf(os.Stderr, "--- last %d lines of Karpenter's log (%s) ---\n%s\n", len(lines), path, strings.Join(lines, "\n"))
}

// queue creates an SQS queue in moto and returns its URL.
func queue(t testing.TB, name string) string {
	t.Helper()
	out, err := stage.SQS.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

// startRouter runs the router as in production (app.Run) on its own intake queue until the
// test ends, with opts applied to its options, and returns the intake queue's URL.
func startRouter(t testing.TB, name string, mode signal.Mode, opts ...func(*options.Run)) string {
	t.Helper()
	intake := queue(t, name+"-intake")
	o := options.Run{
		QueueURL: intake, DeadLetterQueueURL: queue(t, name+"-dlq"), Signal: mode, Workers: 10,
		Visibility: 10 * time.Second, WaitTime: time.Second, HandleTimeout: 5 * time.Second,
		Region: harness.Region, Account: options.OriginAny, AWSEndpointURL: stage.Moto, Gates: checks.NewFeatureGates(),
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", ShutdownTimeout: 10 * time.Second,
	}
	if mode == signal.ModeForward {
		o.KarpenterQueueURL = stage.QueueURL
	}
	for _, f := range opts {
		f(&o)
	}
	inproc.Router(t, o, stage.Rest)
	return intake
}

// send puts one EventBridge body on an intake queue, as an EventBridge rule target would.
func send(t testing.TB, queueURL, body string) time.Time {
	t.Helper()
	if !json.Valid([]byte(body)) {
		t.Fatalf("test body is not JSON: %s", body)
	}
	sent := time.Now()
	if _, err := stage.SQS.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(queueURL), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	return sent
}

// claimState is a NodeClaim as Karpenter left it: gone, being deleted, or there.
func claimState(t testing.TB, name string) (deleting, gone bool) {
	t.Helper()
	nc := &karpv1.NodeClaim{}
	err := stage.Kube.Get(context.Background(), client.ObjectKey{Name: name}, nc)
	if apierrors.IsNotFound(err) {
		return true, true
	}
	if err != nil {
		t.Fatal(err)
	}
	return !nc.DeletionTimestamp.IsZero(), false
}

// eventually polls cond every 100 ms until it holds or timeout passes.
func eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if err := stage.Exited(); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start)
}

// metric reads one of Karpenter's metrics, summed over the series matching labels.
func metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	v, err := stage.Metric(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// instanceState is the instance's state in moto.
func instanceState(t testing.TB, id string) string {
	t.Helper()
	s, err := stage.InstanceState(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
