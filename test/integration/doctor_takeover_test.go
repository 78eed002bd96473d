package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/health-router/health-router/router/doctor"
	"github.com/health-router/health-router/test/harness"
)

// iamSimulator serves SimulatePrincipalPolicy in IAM's Query protocol, answering for
// ec2:DescribeInstanceStatus with the decision set per role: moto has no policy simulator.
type iamSimulator map[string]string // role ARN -> allowed | explicitDeny | implicitDeny

func (s iamSimulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Form.Get("Action") != "SimulatePrincipalPolicy" || r.Form.Get("ActionNames.member.1") != "ec2:DescribeInstanceStatus" {
		http.Error(w, "unsupported", http.StatusBadRequest)
		return
	}
	decision, ok := s[r.Form.Get("PolicySourceArn")]
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type><Code>NoSuchEntity</Code><Message>The role cannot be found.</Message></Error><RequestId>x</RequestId></ErrorResponse>`)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<SimulatePrincipalPolicyResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><SimulatePrincipalPolicyResult><IsTruncated>false</IsTruncated><EvaluationResults><member><EvalActionName>ec2:DescribeInstanceStatus</EvalActionName><EvalResourceName>*</EvalResourceName><EvalDecision>%s</EvalDecision></member></EvaluationResults></SimulatePrincipalPolicyResult><ResponseMetadata><RequestId>y</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>`, decision)
}

// TestDoctorTakeover: doctor says whether the takeover from Karpenter is complete. moto runs
// with IAM authorisation on, so that the router's DescribeInstanceStatus (a DryRun) is
// allowed or denied by real policies: one user may call it, the other is denied it.
func TestDoctorTakeover(t *testing.T) {
	ctx := context.Background()
	url := harness.Moto(t)
	cfg := harness.AWSConfig(nil)
	iamc := iam.NewFromConfig(cfg, func(o *iam.Options) { o.BaseEndpoint = aws.String(url) })
	sqsc := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(url) })
	mkQueue := func(name string) string {
		out, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: map[string]string{"SqsManagedSseEnabled": "true"}})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.QueueUrl)
	}
	intake, dlq, karpenter := mkQueue("hr-intake"), mkQueue("hr-dlq"), mkQueue("Karpenter-prod")
	user := func(name, policy string) aws.CredentialsProvider {
		if _, err := iamc.CreateUser(ctx, &iam.CreateUserInput{UserName: aws.String(name)}); err != nil {
			t.Fatal(err)
		}
		if _, err := iamc.PutUserPolicy(ctx, &iam.PutUserPolicyInput{UserName: aws.String(name), PolicyName: aws.String("router"), PolicyDocument: aws.String(policy)}); err != nil {
			t.Fatal(err)
		}
		key, err := iamc.CreateAccessKey(ctx, &iam.CreateAccessKeyInput{UserName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		return credentials.NewStaticCredentialsProvider(aws.ToString(key.AccessKey.AccessKeyId), aws.ToString(key.AccessKey.SecretAccessKey), "")
	}
	base := `{"Effect":"Allow","Action":["sqs:GetQueueAttributes","events:ListRuleNamesByTarget","events:DescribeRule"],"Resource":"*"}`
	allowed := user("router-allowed", `{"Version":"2012-10-17","Statement":[`+base+`,{"Effect":"Allow","Action":"ec2:DescribeInstanceStatus","Resource":"*"}]}`)
	// Allowed every EC2 read but DescribeInstanceStatus, by an explicit deny.
	denied := user("router-denied", `{"Version":"2012-10-17","Statement":[`+base+`,{"Effect":"Allow","Action":"ec2:Describe*","Resource":"*"},{"Effect":"Deny","Action":"ec2:DescribeInstanceStatus","Resource":"*"}]}`)
	// From here on moto checks every request against the caller's IAM policies.
	resp, err := http.Post(url+"/moto-api/reset-auth", "text/plain", strings.NewReader("0"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	sim := httptest.NewServer(iamSimulator{
		"arn:aws:iam::123456789012:role/KarpenterController-denied":  "explicitDeny",
		"arn:aws:iam::123456789012:role/KarpenterController-allowed": "allowed",
	})
	t.Cleanup(sim.Close)
	run := func(creds aws.CredentialsProvider, poller bool, karpenterRole string) doctor.Report {
		c := cfg
		c.Credentials = creds
		d := doctor.New(
			sqs.NewFromConfig(c, func(o *sqs.Options) { o.BaseEndpoint = aws.String(url) }),
			eventbridge.NewFromConfig(c, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(url) }),
			ec2.NewFromConfig(c, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) }),
			iam.NewFromConfig(c, func(o *iam.Options) { o.BaseEndpoint = aws.String(sim.URL) }),
			nil, // no STS: moto, authorising every call, would deny GetCallerIdentity, which AWS never does
			nil, // no cluster: the Kubernetes checks are not what this test is about
		)
		return d.Run(ctx, doctor.Config{QueueURL: intake, DeadLetterQueueURL: dlq, KarpenterQueueURL: karpenter, KarpenterRoleARN: karpenterRole, InstanceStatusPoller: poller})
	}
	const karpDenied, karpAllowed = "arn:aws:iam::123456789012:role/KarpenterController-denied", "arn:aws:iam::123456789012:role/KarpenterController-allowed"
	tests := []struct {
		name                         string
		creds                        aws.CredentialsProvider
		poller                       bool
		role                         string
		router, takeover             doctor.Status
		routerDetail, takeoverDetail string
	}{
		{"complete", allowed, true, karpDenied, doctor.OK, doctor.OK, "may call", "complete"},
		{"router denied the call", denied, true, karpDenied, doctor.Fail, doctor.Fail, "denied", "lossy"},
		{"poller off", allowed, false, karpDenied, doctor.Fail, doctor.Fail, "off", "lossy"},
		{"Karpenter still polls (runbook step 4a)", allowed, true, karpAllowed, doctor.OK, doctor.Warn, "may call", "in progress"},
		{"Karpenter's role unknown", allowed, true, "", doctor.OK, doctor.Unknown, "may call", "cannot tell"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(tt.creds, tt.poller, tt.role)
			if i := item(t, r, "intake queue"); i.Status != doctor.OK {
				t.Fatalf("moto refused the router's own queue read: %s", i.Detail) // the policies work
			}
			if i := item(t, r, doctor.CheckRouterInstanceStatus); i.Status != tt.router || !strings.Contains(i.Detail, tt.routerDetail) {
				t.Errorf("router poller: %s (%s), want %s mentioning %q", i.Status, i.Detail, tt.router, tt.routerDetail)
			}
			if i := item(t, r, doctor.CheckTakeover); i.Status != tt.takeover || !strings.Contains(i.Detail, tt.takeoverDetail) {
				t.Errorf("takeover: %s (%s), want %s mentioning %q", i.Status, i.Detail, tt.takeover, tt.takeoverDetail)
			}
		})
	}
}
