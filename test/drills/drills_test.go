// Package drills runs the router as a process, as it runs in a cluster, and breaks things
// around it: SIGKILL mid-burst, two replicas at once, poison mixed into real traffic. Each
// drill checks that every event ends with exactly one outcome and nothing is lost.
package drills

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	awsv1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/test/harness"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// routerBinary builds cmd/health-router once per test run.
func routerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "health-router-drills")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "health-router")
		out, err := exec.Command("go", "build", "-o", binary, "github.com/health-router/health-router/cmd/health-router").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// kubeconfig writes a kubeconfig for cfg (envtest's admin user) and returns its path.
func kubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

type drill struct {
	t                          *testing.T
	ctx                        context.Context
	moto                       string
	restCfg                    *rest.Config
	kubeconfig                 string
	kube                       client.Client
	sqs                        *sqs.Client
	intakeURL, dlqURL, karpURL string
}

func newDrill(t *testing.T) *drill {
	if testing.Short() {
		t.Skip("drills run the router as a process against moto and envtest")
	}
	// Each drill has its own moto, API server and router, and spends most of its time waiting
	// (a minute of SQS outage, a Lease running out, retries backing off): two at a time (go
	// test's -parallel, GOMAXPROCS by default) halve the package's wall time.
	t.Parallel()
	d := &drill{t: t, ctx: context.Background()}
	d.moto = harness.Moto(t)
	cfg := harness.KubeAPIServer(t)
	d.restCfg = cfg
	d.kubeconfig = kubeconfig(t, cfg)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if d.kube, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		t.Fatal(err)
	}
	d.sqs = sqs.NewFromConfig(harness.AWSConfig(nil), func(o *sqs.Options) { o.BaseEndpoint = aws.String(d.moto) })
	d.intakeURL, d.dlqURL, d.karpURL = d.queue("intake"), d.queue("dlq"), d.queue("karpenter")
	// The EC2NodeClass the pool's nodes use, with the image the AMI check looks up (the image
	// is not in EC2: drains of non-urgent events wait, urgent ones go ahead with a warning).
	nodeClass := &awsv1.EC2NodeClass{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: awsv1.EC2NodeClassSpec{
		Role: "KarpenterNodeRole-drill", AMISelectorTerms: []awsv1.AMISelectorTerm{{Alias: "al2023@latest"}},
		SubnetSelectorTerms:        []awsv1.SubnetSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "drill"}}},
		SecurityGroupSelectorTerms: []awsv1.SecurityGroupSelectorTerm{{Tags: map[string]string{"karpenter.sh/discovery": "drill"}}},
	}}
	if err := d.kube.Create(d.ctx, nodeClass); err != nil {
		t.Fatal(err)
	}
	nodeClass.Status.AMIs = []awsv1.AMI{{ID: "ami-0c55b159cbfafe1f0", Requirements: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}}}}
	if err := d.kube.Status().Update(d.ctx, nodeClass); err != nil {
		t.Fatal(err)
	}
	if err := d.kube.Create(d.ctx, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "burst"}, Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
		NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
		Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
	}}}}); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *drill) queue(name string) string {
	out, err := d.sqs.CreateQueue(d.ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		d.t.Fatal(err)
	}
	return aws.ToString(out.QueueUrl)
}

func instance(i int) string { return fmt.Sprintf("i-0d1e2f3a4b5c%05x", i) }

// nodes creates n NodeClaims (held by Karpenter's finalizer) in pool "burst".
func (d *drill) nodes(n int) {
	for i := 0; i < n; i++ {
		nc := &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%04d", i), Labels: map[string]string{karpv1.NodePoolLabelKey: "burst", corev1.LabelArchStable: "amd64"}, Finalizers: []string{"karpenter.sh/termination"}},
			Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"burst"}}}},
		}
		if err := d.kube.Create(d.ctx, nc); err != nil {
			d.t.Fatal(err)
		}
		nc.Status.ProviderID = "aws:///eu-west-1a/" + instance(i)
		if err := d.kube.Status().Update(d.ctx, nc); err != nil {
			d.t.Fatal(err)
		}
	}
}

// spot returns a Spot interruption warning body for instance i.
func spot(i int) string {
	b, _ := json.Marshal(map[string]any{
		"version": "0", "id": fmt.Sprintf("5b1d0c2e-0000-4000-8000-%012d", i), "detail-type": "EC2 Spot Instance Interruption Warning",
		"source": "aws.ec2", "account": "123456789012", "time": time.Now().UTC().Format(time.RFC3339), "region": harness.Region,
		"resources": []string{"arn:aws:ec2:eu-west-1:123456789012:instance/" + instance(i)},
		"detail":    map[string]string{"instance-id": instance(i), "instance-action": "terminate"},
	})
	return string(b)
}

func (d *drill) send(bodies []string) {
	for start := 0; start < len(bodies); start += 10 {
		var entries []sqstypes.SendMessageBatchRequestEntry
		for i, b := range bodies[start:min(start+10, len(bodies))] {
			entries = append(entries, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), MessageBody: aws.String(b)})
		}
		out, err := d.sqs.SendMessageBatch(d.ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(d.intakeURL), Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			d.t.Fatalf("SendMessageBatch: %v %+v", err, out)
		}
	}
}

// drillWorkers is the routers' --workers: the most messages one router works on at once,
// so the most a kill can leave forwarded but not deleted from the intake queue.
const drillWorkers = 4

// router starts the router process; it is killed when the test ends.
func (d *drill) router(extraEnv ...string) *exec.Cmd {
	d.t.Helper()
	cmd := exec.Command(routerBinary(d.t), "run")
	cmd.Env = append(os.Environ(),
		"AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing",
		"HEALTH_ROUTER_QUEUE_URL="+d.intakeURL, "HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL="+d.dlqURL,
		"HEALTH_ROUTER_KARPENTER_QUEUE_URL="+d.karpURL, "HEALTH_ROUTER_REGION="+harness.Region,
		"HEALTH_ROUTER_AWS_ENDPOINT_URL="+d.moto, "HEALTH_ROUTER_KUBECONFIG="+d.kubeconfig,
		"HEALTH_ROUTER_WAIT_TIME=1s", "HEALTH_ROUTER_VISIBILITY_TIMEOUT=10s", "HEALTH_ROUTER_WORKERS="+strconv.Itoa(drillWorkers),
		"HEALTH_ROUTER_METRICS_BIND_ADDRESS=0", "HEALTH_ROUTER_HEALTH_PROBE_BIND_ADDRESS=0",
		"HEALTH_ROUTER_LEADER_ELECTION_NAMESPACE=default", "HEALTH_ROUTER_LOG_LEVEL=warn",
	)
	cmd.Env = append(cmd.Env, extraEnv...)
	log, err := os.Create(filepath.Join(d.t.TempDir(), "router.log"))
	if err != nil {
		d.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); log.Close(); d.dumpErrors(log.Name()) })
	return cmd
}

// supervised runs the router as the Deployment's kubelet would: started again whenever it
// exits (a leader that cannot renew its Lease during an API outage exits on purpose). It
// returns a function that reports how many times it was restarted.
func (d *drill) supervised(extraEnv ...string) func() int {
	d.t.Helper()
	var mu sync.Mutex
	restarts := 0
	stop := make(chan struct{})
	cmd := d.router(extraEnv...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_ = cmd.Wait()
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			mu.Lock()
			restarts++
			mu.Unlock()
			cmd = d.router(extraEnv...)
		}
	}()
	d.t.Cleanup(func() { close(stop); _ = cmd.Process.Kill(); <-done })
	return func() int { mu.Lock(); defer mu.Unlock(); return restarts }
}

func (d *drill) dumpErrors(path string) {
	b, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) {
			d.t.Logf("router: %s", line)
		}
	}
}

// forwarded drains Karpenter's queue and counts the messages per instance.
func (d *drill) forwarded(counts map[string]int) {
	for {
		out, err := d.sqs.ReceiveMessage(d.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(d.karpURL), MaxNumberOfMessages: 10})
		if err != nil {
			d.t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			return
		}
		for _, m := range out.Messages {
			var ev struct {
				Detail struct {
					InstanceID string `json:"instance-id"`
				} `json:"detail"`
			}
			_ = json.Unmarshal([]byte(aws.ToString(m.Body)), &ev)
			counts[ev.Detail.InstanceID]++
			d.sqs.DeleteMessage(d.ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.karpURL), ReceiptHandle: m.ReceiptHandle})
		}
	}
}

func (d *drill) empty(url string) bool {
	out, err := d.sqs.GetQueueAttributes(d.ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"}})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, v := range out.Attributes {
		if v != "0" {
			return false
		}
	}
	return true
}

func (d *drill) signalled(n int) int {
	var claims karpv1.NodeClaimList
	if err := d.kube.List(d.ctx, &claims); err != nil {
		d.t.Fatal(err)
	}
	c := 0
	for _, nc := range claims.Items {
		if m, err := record.Load(d.ctx, d.kube, nc.Name); err == nil && m.Drain != nil {
			c++
		}
	}
	return c
}

func (d *drill) until(what string, timeout time.Duration, cond func() bool) {
	d.t.Helper()
	if err := wait.PollUntilContextTimeout(d.ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		d.t.Fatalf("%s: not within %s", what, timeout)
	}
}

// TestKillMidBurst: the router is SIGKILLed three times while it works through a burst of
// Spot interruptions, and restarted each time. Every event must be signalled, nothing
// dead-lettered, the queue must end empty. A kill between forwarding a message to
// Karpenter and recording it on the NodeClaim can forward it twice (Karpenter ignores an
// interruption for a NodeClaim already deleting); that window is bounded here by the
// workers in flight at each kill, and the drill reports what it saw.
func TestKillMidBurst(t *testing.T) {
	d := newDrill(t)
	const n, kills, workers = 120, 3, drillWorkers
	d.nodes(n)
	var bodies []string
	for i := 0; i < n; i++ {
		bodies = append(bodies, spot(i))
	}
	d.send(bodies)
	counts := map[string]int{}
	for k := 0; k < kills; k++ {
		cmd := d.router()
		target := (k + 1) * n / (kills + 1)
		d.until(fmt.Sprintf("kill %d: %d signalled", k+1, target), 90*time.Second, func() bool { return d.signalled(n) >= target })
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		t.Logf("kill %d at %d of %d signalled", k+1, d.signalled(n), n)
	}
	d.router()
	d.until("every instance signalled", 120*time.Second, func() bool { return d.signalled(n) == n })
	d.until("intake queue empty", 60*time.Second, func() bool { return d.empty(d.intakeURL) })
	d.forwarded(counts)
	dupes := 0
	for i := 0; i < n; i++ {
		switch c := counts[instance(i)]; {
		case c == 0:
			t.Errorf("instance %s never forwarded to Karpenter", instance(i))
		case c > 1:
			dupes += c - 1
		}
	}
	if dupes > kills*workers {
		t.Errorf("%d duplicate forwards, more than the %d messages that can be in flight at %d kills", dupes, kills*workers, kills)
	}
	if !d.empty(d.dlqURL) {
		t.Error("messages dead-lettered")
	}
	t.Logf("%d events, %d kills: all signalled, %d duplicate forwards", n, kills, dupes)
}

// TestTwoReplicas: two routers with leader election; only the leader consumes, so no event
// reaches Karpenter from both while both live; when the leader is killed the standby takes
// over and finishes, sending again at most what the dead leader was working on.
func TestTwoReplicas(t *testing.T) {
	d := newDrill(t)
	const n = 40
	d.nodes(n)
	a := d.router("HEALTH_ROUTER_LEADER_ELECT=true")
	d.router("HEALTH_ROUTER_LEADER_ELECT=true")
	var bodies []string
	for i := 0; i < n/2; i++ {
		bodies = append(bodies, spot(i))
	}
	d.send(bodies)
	d.until("first half signalled", 90*time.Second, func() bool { return d.signalled(n) == n/2 })
	// Kill one replica (the leader or the standby: either way the other must carry on).
	_ = a.Process.Signal(syscall.SIGKILL)
	_ = a.Wait()
	bodies = bodies[:0]
	for i := n / 2; i < n; i++ {
		bodies = append(bodies, spot(i))
	}
	d.send(bodies)
	d.until("second half signalled after a replica died", 120*time.Second, func() bool { return d.signalled(n) == n })
	d.until("intake queue empty", 60*time.Second, func() bool { return d.empty(d.intakeURL) })
	counts := map[string]int{}
	d.forwarded(counts)
	// The killed replica, if it was the leader, may have forwarded messages it had not yet
	// deleted from the intake queue: the one that takes over finds their stamps and sends them
	// again (a stamp does not tell whether its send went out). That is at most the messages
	// one replica works on at once, all sent before the kill; what is sent after it goes to
	// one replica only and is forwarded once.
	dupes := 0
	for i := 0; i < n; i++ {
		switch c := counts[instance(i)]; {
		case c == 0:
			t.Errorf("instance %s never forwarded to Karpenter", instance(i))
		case c > 1 && i >= n/2:
			t.Errorf("instance %s, sent after the kill, forwarded %d times, want 1", instance(i), c)
		case c > 1:
			dupes += c - 1
		}
	}
	if dupes > drillWorkers {
		t.Errorf("%d duplicate forwards of the events sent before the kill, more than the %d messages a replica works on at once", dupes, drillWorkers)
	}
	if !d.empty(d.dlqURL) {
		t.Error("messages dead-lettered")
	}
	t.Logf("%d events, one replica killed: all signalled, %d duplicate forwards", n, dupes)
}
