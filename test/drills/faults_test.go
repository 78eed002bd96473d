package drills

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/intake"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/test/bench/gen"
	"github.com/health-router/health-router/test/harness"
)

// TestPoisonMixedIntoTraffic: 1,000 malformed, foreign and unknown messages mixed into 100
// real interruptions. Every poison message reaches the dead-letter queue with its reason,
// every real event is signalled, nothing is left.
func TestPoisonMixedIntoTraffic(t *testing.T) {
	d := newDrill(t)
	const real, poison = 100, 1000
	d.nodes(real)
	var bodies []string
	reasons := map[string]int{}
	for i := 0; i < poison; i++ {
		switch i % 4 {
		case 0:
			bodies = append(bodies, fmt.Sprintf(`{"version":"0","id":"p%d","detail-type":"EC2 Spot Instance`, i)) // cut short
			reasons["malformed"]++
		case 1:
			b := strings.Replace(spot(i%real), `"account":"123456789012"`, `"account":"999999999999"`, 1)
			bodies = append(bodies, strings.Replace(b, `"id":"5b1d0c2e`, `"id":"f0re1gn0`, 1))
			reasons["foreign"]++
		case 2:
			bodies = append(bodies, fmt.Sprintf(`{"version":"0","id":"u%d","detail-type":"EC2 Instance-launch Lifecycle Action","source":"aws.autoscaling","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{}}`, i))
			reasons["unknown-kind"]++
		case 3:
			bodies = append(bodies, fmt.Sprintf(`{"version":"0","id":"h%d","detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"service":"EC2","eventTypeCategory":"accountNotification","eventArn":"a","eventTypeCode":"AWS_EC2_ODCR_UNDERUTILIZATION_NOTIFICATION"}}`, i))
			reasons["unsupported"]++
		}
		if i%10 == 0 {
			bodies = append(bodies, spot(i/10))
		}
	}
	d.send(bodies)
	d.router("HEALTH_ROUTER_ACCOUNT=123456789012")
	d.until("every real event signalled", 4*time.Minute, func() bool { return d.signalled(real) == real })
	d.until("intake queue empty", 2*time.Minute, func() bool { return d.empty(d.intakeURL) })
	// Count each poison message once (by its source message ID): a message whose visibility
	// lapsed under load before its delete can be dead-lettered twice (at least once, never lost).
	seen := map[string]bool{}
	got := map[string]int{}
	dupes := 0
	for {
		out, err := d.sqs.ReceiveMessage(d.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(d.dlqURL), MaxNumberOfMessages: 10, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			break
		}
		for _, m := range out.Messages {
			src := aws.ToString(m.MessageAttributes[intake.AttrSourceMessageID].StringValue)
			if src == "" {
				t.Errorf("dead letter without its source message ID: %v", m.MessageAttributes)
			}
			if seen[src] {
				dupes++
			} else {
				seen[src] = true
				got[aws.ToString(m.MessageAttributes[intake.AttrReason].StringValue)]++
			}
			d.sqs.DeleteMessage(d.ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(d.dlqURL), ReceiptHandle: m.ReceiptHandle})
		}
	}
	t.Logf("%d poison messages dead-lettered twice (visibility lapsed under load)", dupes)
	if dupes > len(seen)/20 {
		t.Errorf("%d of %d dead letters are duplicates", dupes, len(seen))
	}
	for r, n := range reasons {
		if got[r] != n {
			t.Errorf("dead letters with reason %s: %d, want %d (all: %v)", r, got[r], n, got)
		}
	}
	counts := map[string]int{}
	d.forwarded(counts)
	for i := 0; i < real; i++ {
		if counts[instance(i)] != 1 {
			t.Errorf("instance %s forwarded %d times", instance(i), counts[instance(i)])
		}
	}
}

// ec2Throttler sends EC2 calls a RequestLimitExceeded, as EC2 does under throttling, and
// passes every other call (SQS) through to moto.
func ec2Throttler(t *testing.T, moto string) (*httptest.Server, *atomic.Int64) {
	target, _ := url.Parse(moto)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var throttled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if strings.Contains(string(body), "Action=DescribeImages") || strings.Contains(string(body), "Action=DescribeCapacityReservations") {
			throttled.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>5e1f6b0c-0000-4a2b-9c3d-000000000001</RequestID></Response>`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &throttled
}

// TestEC2ThrottledForTheWholeBurst: with every EC2 check throttled past the SDK's retries,
// urgent interruptions still drain (with a warning) and non-urgent retirements wait with
// "check unavailable" recorded on the NodeClaim; nothing is dead-lettered or lost.
func TestEC2ThrottledForTheWholeBurst(t *testing.T) {
	d := newDrill(t)
	const n = 40
	d.nodes(n)
	srv, throttled := ec2Throttler(t, d.moto)
	var bodies []string
	for i := 0; i < n; i++ {
		if i%2 == 0 {
			bodies = append(bodies, spot(i))
		} else {
			// The account of moto (the router's own, from STS): another is foreign.
			body := gen.HealthBody(fmt.Sprintf("9c1d0c2e-0000-4000-8000-%012d", i), "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", time.Now(), time.Now().Add(96*time.Hour), []string{instance(i)})
			bodies = append(bodies, strings.Replace(body, `"account":"111122223333"`, `"account":"123456789012"`, 1))
		}
	}
	d.send(bodies)
	d.router("HEALTH_ROUTER_AWS_ENDPOINT_URL=" + srv.URL)
	d.until("every interruption signalled", 3*time.Minute, func() bool { return d.signalled(n) == n/2 })
	d.until("every retirement deferred", 3*time.Minute, func() bool {
		var claims karpv1.NodeClaimList
		if err := d.kube.List(d.ctx, &claims); err != nil {
			t.Fatal(err)
		}
		deferred := 0
		for i := range claims.Items {
			mem, _ := record.Load(d.ctx, d.kube, claims.Items[i].Name)
			for _, df := range mem.Records {
				if df.State == record.StateDeferred && strings.Contains(df.Reason, "check unavailable") {
					deferred++
				}
			}
		}
		return deferred == n/2
	})
	if d.signalled(n) != n/2 {
		t.Errorf("%d signalled: a retirement drained although its checks could not run", d.signalled(n))
	}
	if !d.empty(d.dlqURL) {
		t.Error("dead-lettered under throttling")
	}
	if throttled.Load() == 0 {
		t.Error("the throttler saw no EC2 call")
	}
	// The retirements wait on their NodeClaims, not in SQS: every message is gone.
	d.until("intake queue empty", time.Minute, func() bool { return d.empty(d.intakeURL) })
}

// TestSQSUnreachableForAMinute: the router's SQS endpoint drops every connection for a
// minute mid-burst. The router keeps running, and every event is signalled once it is back.
func TestSQSUnreachableForAMinute(t *testing.T) {
	d := newDrill(t)
	const n = 60
	d.nodes(n)
	u, _ := url.Parse(d.moto)
	proxy := harness.NewProxy(t, u.Host)
	var bodies []string
	for i := 0; i < n; i++ {
		bodies = append(bodies, spot(i))
	}
	d.send(bodies[:n/2])
	cmd := d.router("HEALTH_ROUTER_AWS_ENDPOINT_URL=http://" + proxy.Addr)
	d.until("first half signalled", 2*time.Minute, func() bool { return d.signalled(n) == n/2 })
	proxy.Down()
	d.send(bodies[n/2:]) // the test still reaches moto directly
	time.Sleep(time.Minute)
	if d.signalled(n) != n/2 {
		t.Fatalf("signalled while SQS was unreachable: %d", d.signalled(n))
	}
	if cmd.ProcessState != nil {
		t.Fatal("the router exited during the SQS outage")
	}
	proxy.Up()
	d.until("second half signalled after the outage", 3*time.Minute, func() bool { return d.signalled(n) == n })
	d.until("intake queue empty", time.Minute, func() bool { return d.empty(d.intakeURL) })
}

// TestKubernetesAPIDownMidBurst: the router's connection to the kube-apiserver is cut for
// 20 seconds mid-burst. Messages wait and are retried with backoff; the leader, unable to
// renew its Lease, exits and is started again (as the Deployment would); all events are
// signalled once the API is back, none dead-lettered.
func TestKubernetesAPIDownMidBurst(t *testing.T) {
	d := newDrill(t)
	const n = 60
	d.nodes(n)
	u, _ := url.Parse(d.restCfg.Host)
	proxy := harness.NewProxy(t, u.Host)
	viaProxy := rest.CopyConfig(d.restCfg)
	viaProxy.Host = "https://" + proxy.Addr
	var bodies []string
	for i := 0; i < n; i++ {
		bodies = append(bodies, spot(i))
	}
	restarts := d.supervised("HEALTH_ROUTER_KUBECONFIG="+kubeconfig(t, viaProxy), "HEALTH_ROUTER_HANDLE_TIMEOUT=5s")
	d.send(bodies)
	d.until("some signalled", 2*time.Minute, func() bool { return d.signalled(n) >= 10 })
	proxy.Down()
	time.Sleep(20 * time.Second)
	proxy.Up()
	d.until("intake queue empty after the outage", 4*time.Minute, func() bool { return d.empty(d.intakeURL) })
	t.Logf("router restarted %d times", restarts())
	counts := map[string]int{}
	d.forwarded(counts)
	// A stamp whose answer the cut lost went through: the retry finds it and sends again, or,
	// when the send itself failed (the leader stopping), the deferral controller deletes the
	// NodeClaim once the confirmation bound (20 s) has passed without Karpenter acting
	// (confirm-or-fallback). Such a drain is not a forward, but it is not lost: the NodeClaim
	// is deleting (no Karpenter runs here, so only the router deletes) and stamped for the
	// instance's own event.
	fallback := func(i int) (bool, string) {
		var nc karpv1.NodeClaim
		if err := d.kube.Get(d.ctx, client.ObjectKey{Name: fmt.Sprintf("burst-%04d", i)}, &nc); err != nil {
			return false, err.Error()
		}
		m, err := record.Load(d.ctx, d.kube, nc.Name)
		if err != nil || m.Drain == nil {
			return false, fmt.Sprint("no drain recorded ", err)
		}
		return !nc.DeletionTimestamp.IsZero() && m.Drain.EventID == fmt.Sprintf("5b1d0c2e-0000-4000-8000-%012d", i), fmt.Sprintf("%+v", *m.Drain)
	}
	_ = wait.PollUntilContextTimeout(d.ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		d.forwarded(counts)
		for i := 0; i < n; i++ {
			if ok, _ := fallback(i); counts[instance(i)] == 0 && !ok {
				return false, nil
			}
		}
		return true, nil
	})
	dupes := 0
	for i := 0; i < n; i++ {
		if counts[instance(i)] == 0 {
			if ok, stamp := fallback(i); !ok {
				t.Errorf("instance %s never forwarded, nor its NodeClaim deleted by the router's fallback (stamp %q)", instance(i), stamp)
				continue
			}
			t.Logf("instance %s: not forwarded; its NodeClaim deleted by the router's fallback past the confirmation bound", instance(i))
		}
		dupes += max(counts[instance(i)]-1, 0)
	}
	// A drain forwarded just before the cut whose stamp failed (an urgent forward does not
	// wait for its stamp until a stamp has failed), or before the leader exited, may be
	// forwarded again by the next leader; Karpenter ignores it for a NodeClaim already
	// deleting.
	if dupes > drillWorkers {
		t.Errorf("%d duplicate forwards, more than the %d messages in flight when the cut began", dupes, drillWorkers)
	}
	t.Logf("%d duplicate forwards", dupes)
	if !d.empty(d.dlqURL) {
		t.Error("dead-lettered during a Kubernetes outage")
	}
}
