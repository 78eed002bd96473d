package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/health-router/health-router/test/harness"
)

// deniedSQS answers every SQS call (JSON protocol) as SQS answers a caller its policies do
// not allow: moto, without its IAM authorisation on, allows everything.
func deniedSQS(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("X-Amzn-Query-Error", "AccessDenied;Sender")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazon.coral.service#AccessDeniedException",
			"message": "User: arn:aws:sts::123456789012:assumed-role/hr/x is not authorized to perform: sqs:getqueueattributes"})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func sqsAt(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{Region: harness.Region, BaseEndpoint: aws.String(endpoint), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider("testing", "testing", "")})
}

// TestQueueProblems: doctor tells a malformed queue URL (no call made) from an unreachable
// endpoint, a missing queue and a denied one, each with its own fix, through the real SDK
// client against moto, an SQS that denies, and endpoints that do not answer.
func TestQueueProblems(t *testing.T) {
	if testing.Short() {
		t.Skip("moto")
	}
	ctx := context.Background()
	moto := harness.Moto(t)
	out, err := sqsAt(moto).CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("hr-intake"), Attributes: map[string]string{"SqsManagedSseEnabled": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	good := aws.ToString(out.QueueUrl)
	missing := strings.Replace(good, "hr-intake", "hr-gone", 1)
	closed := fmt.Sprintf("http://127.0.0.1:%d", harness.FreePort(t))
	for _, tc := range []struct {
		name, endpoint, url string
		status              Status
		detail, fix         string
	}{
		{"usable", moto, good, OK, "is reachable", ""},
		{"missing", moto, missing, Fail, "does not exist", "create it"},
		{"denied", deniedSQS(t), good, Fail, "access denied", "sqs:GetQueueAttributes"},
		{"connection refused", closed, good, Fail, "unreachable", "--aws-endpoint-url"},
		{"name does not resolve", "http://sqs.doctor-test.invalid", good, Fail, "unreachable", "DNS"},
		{"an ARN", moto, "arn:aws:sqs:eu-west-1:123456789012:hr-intake", Fail, "malformed", "https://sqs.<region>.amazonaws.com/<account>/<name>"},
		{"no account", moto, "https://sqs.eu-west-1.amazonaws.com/hr-intake", Fail, "malformed", "queue URL outputs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Report
			(&Doctor{sqs: sqsAt(tc.endpoint)}).queue(ctx, &r, CheckIntakeQueue, tc.url, false)
			if len(r) == 0 || r[0].Check != CheckIntakeQueue || r[0].Status != tc.status || !strings.Contains(r[0].Detail, tc.detail) || !strings.Contains(r[0].Fix, tc.fix) {
				t.Fatalf("report %+v, want %s mentioning %q, fix %q", r, tc.status, tc.detail, tc.fix)
			}
			for _, other := range []string{"malformed", "unreachable", "does not exist", "access denied"} {
				if other != tc.detail && strings.Contains(r[0].Detail, other) {
					t.Errorf("detail %q also says %q", r[0].Detail, other)
				}
			}
		})
	}
}

// refusingSTS answers GetCallerIdentity as STS answers a key it does not know, in its
// Query protocol: moto, with its authorisation on, refuses in a form the SDK cannot read
// (EC2's <Errors> wrapper), so its code would be lost.
func refusingSTS(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "GetCallerIdentity" {
			http.Error(w, "not served", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/xml")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>InvalidClientTokenId</Code><Message>The security token included in the request is invalid.</Message></Error><RequestId>r-1</RequestId></ErrorResponse>`)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCredentialsFirst: doctor asks STS who the credentials are before anything else. Known
// credentials (moto's) are named by their ARN and the checks go on against moto; refused
// ones (InvalidClientTokenId) are said to be refused, plainly, and no other AWS call is
// made, while a malformed queue URL, which needs no call, is still named.
func TestCredentialsFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("moto")
	}
	ctx := context.Background()
	moto := harness.Moto(t)
	intake, err := sqsAt(moto).CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("hr-intake")})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{QueueURL: aws.ToString(intake.QueueUrl), DeadLetterQueueURL: "hr-dlq", InstanceStatusPoller: true}
	run := func(stsEndpoint string) (Report, *harness.Counter) {
		counter := &harness.Counter{}
		c := harness.AWSConfig(counter)
		c.RetryMaxAttempts = 1
		at := aws.String(moto)
		d := New(sqs.NewFromConfig(c, func(o *sqs.Options) { o.BaseEndpoint = at }), eventbridge.NewFromConfig(c, func(o *eventbridge.Options) { o.BaseEndpoint = at }),
			ec2.NewFromConfig(c, func(o *ec2.Options) { o.BaseEndpoint = at }), nil, sts.NewFromConfig(c, func(o *sts.Options) { o.BaseEndpoint = aws.String(stsEndpoint) }), nil)
		return d.Run(ctx, cfg), counter
	}
	find := func(r Report, check string) Item {
		for _, i := range r {
			if i.Check == check {
				return i
			}
		}
		t.Fatalf("no %q in %+v", check, r)
		return Item{}
	}

	r, calls := run(moto)
	if i := find(r, CheckCredentials); i.Status != OK || !strings.Contains(i.Detail, "arn:aws:") || !strings.Contains(i.Detail, "123456789012") {
		t.Errorf("known credentials: %+v", i)
	}
	if calls.Calls("AmazonSQS.GetQueueAttributes") == 0 {
		t.Error("with working credentials, the queues were not asked about")
	}

	r, calls = run(refusingSTS(t))
	if i := find(r, CheckCredentials); i.Status != Fail || !strings.Contains(i.Detail, "AWS refuses these credentials") || !strings.Contains(i.Detail, "InvalidClientTokenId") || !strings.Contains(i.Fix, "IRSA") {
		t.Errorf("refused credentials: %+v", i)
	}
	if i := find(r, CheckSkipped); i.Status != Unknown {
		t.Errorf("skipped checks: %+v", i)
	}
	if i := find(r, CheckDeadLetterQueue); i.Status != Fail || !strings.Contains(i.Detail, "malformed") {
		t.Errorf("a malformed URL is still named without credentials: %+v", i)
	}
	for _, call := range []string{"AmazonSQS.GetQueueAttributes", "AWSEvents.ListRuleNamesByTarget", "DescribeInstanceStatus"} {
		if n := calls.Calls(call); n != 0 {
			t.Errorf("%s called %d times with refused credentials", call, n)
		}
	}
	if n := calls.Calls("GetCallerIdentity"); n != 1 {
		t.Errorf("GetCallerIdentity called %d times", n)
	}
	if !r.Failed() {
		t.Error("the report passed")
	}
}

// TestCredentialsUnreachable: an STS that does not answer is said to be unreachable, not
// the credentials refused.
func TestCredentialsUnreachable(t *testing.T) {
	c := sts.New(sts.Options{Region: harness.Region, BaseEndpoint: aws.String(fmt.Sprintf("http://127.0.0.1:%d", harness.FreePort(t))), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider("testing", "testing", "")})
	var r Report
	if (&Doctor{sts: c}).credentials(context.Background(), &r) || len(r) != 1 || r[0].Status != Fail || !strings.Contains(r[0].Detail, "STS does not answer") {
		t.Fatalf("report %+v", r)
	}
}
