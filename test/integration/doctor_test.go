package integration

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/doctor"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/test/harness"
)

func item(t *testing.T, r doctor.Report, check string) doctor.Item {
	t.Helper()
	for _, i := range r {
		if i.Check == check {
			return i
		}
	}
	var buf bytes.Buffer
	r.Print(&buf)
	t.Fatalf("no check %q in:\n%s", check, buf.String())
	return doctor.Item{}
}

// TestDoctor checks a setup on moto and envtest: a good intake queue, rules for some
// kinds, a rule still feeding Karpenter's queue, RBAC for an admin and for a bare service
// account, and feature gates that differ from Karpenter's.
func TestDoctor(t *testing.T) {
	if testing.Short() {
		t.Skip("moto and envtest suite")
	}
	ctx := context.Background()
	url := harness.Moto(t)
	restCfg := harness.KubeAPIServer(t)
	cfg := harness.AWSConfig(nil)
	sqsc := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(url) })
	ebc := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(url) })
	mk := func(name string, attrs map[string]string) (string, string) {
		out, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
		if err != nil {
			t.Fatal(err)
		}
		a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: out.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{"QueueArn"}})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.QueueUrl), a.Attributes["QueueArn"]
	}
	dlqURL, dlqARN := mk("hr-dlq", map[string]string{"SqsManagedSseEnabled": "true"})
	intakeURL, intakeARN := mk("hr-intake", map[string]string{"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": "1209600",
		"RedrivePolicy": `{"deadLetterTargetArn":"` + dlqARN + `","maxReceiveCount":"100"}`})
	plainURL, _ := mk("hr-plain", map[string]string{"SqsManagedSseEnabled": "false", "MessageRetentionPeriod": "300", "RedrivePolicy": `{"deadLetterTargetArn":"` + dlqARN + `","maxReceiveCount":"5"}`})
	karpURL, karpARN := mk("Karpenter-prod", map[string]string{"SqsManagedSseEnabled": "true"})
	rule := func(name, pattern, target string) {
		if _, err := ebc.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventPattern: aws.String(pattern)}); err != nil {
			t.Fatal(err)
		}
		if _, err := ebc.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), Targets: []ebtypes.Target{{Id: aws.String("t"), Arn: aws.String(target)}}}); err != nil {
			t.Fatal(err)
		}
	}
	rule("hr-health", rules["health"], intakeARN)
	rule("hr-spot", rules["spot"], intakeARN)
	rule("Karpenter-prod-SpotInterruption", rules["spot"], karpARN)

	scheme, _ := cluster.NewScheme()
	admin, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "karpenter", Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/name": "karpenter"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "karpenter"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "karpenter"}}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "controller", Image: "public.ecr.aws/karpenter/controller:1.15.0",
				Env: []corev1.EnvVar{{Name: "FEATURE_GATES", Value: "SpotToSpotConsolidation=true,ReservedCapacity=false"}},
			}}}},
		},
	}); err != nil {
		t.Fatal(err)
	}

	run := func(kube client.Client, queue string, gates ...string) doctor.Report {
		g := checks.NewFeatureGates()
		for _, s := range gates {
			if err := g.Set(s); err != nil {
				t.Fatal(err)
			}
		}
		return doctor.New(sqsc, ebc, ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) }), nil,
			sts.NewFromConfig(cfg, func(o *sts.Options) { o.BaseEndpoint = aws.String(url) }), kube).Run(ctx, doctor.Config{
			QueueURL: queue, DeadLetterQueueURL: dlqURL, KarpenterQueueURL: karpURL,
			KarpenterNamespace: "kube-system", Namespace: "health-router", Gates: g,
		})
	}

	r := run(admin, intakeURL)
	if i := item(t, r, doctor.CheckCredentials); i.Status != doctor.OK || !strings.Contains(i.Detail, "123456789012") {
		t.Errorf("credentials: %s (%s), want ok naming moto's account", i.Status, i.Detail)
	}
	for check, want := range map[string]doctor.Status{
		"intake queue":                           doctor.OK,
		"intake queue encryption":                doctor.OK,
		"intake queue redrive":                   doctor.OK,
		"EventBridge rules":                      doctor.Warn, // only two kinds routed
		"Karpenter's EventBridge rules":          doctor.Warn, // a rule still feeds Karpenter's queue: the takeover in progress
		"Karpenter's ec2:DescribeInstanceStatus": doctor.Unknown,
		"RBAC":                                   doctor.OK,
		"feature gate ReservedCapacity":          doctor.Fail, // router true, Karpenter false
		"Karpenter version":                      doctor.OK,   // unknown, taken as the newest; Karpenter's image says 1.15.0
	} {
		if got := item(t, r, check); got.Status != want {
			t.Errorf("%s: %s (%s), want %s", check, got.Status, got.Detail, want)
		}
	}
	if i := item(t, r, "EventBridge rules"); !strings.Contains(i.Detail, "state-change") || strings.Contains(i.Detail, "spot-interruption") {
		t.Errorf("missing kinds: %s", i.Detail)
	}
	if i := item(t, r, "Karpenter's EventBridge rules"); !strings.Contains(i.Detail, "Karpenter-prod-SpotInterruption") {
		t.Errorf("Karpenter rule not named: %s", i.Detail)
	}
	if !r.Failed() {
		t.Error("report with failures says it passed")
	}
	// Issue 27, 2: a router told Karpenter v1.9.3 in front of Karpenter 1.15.0 would delete
	// the reservation interruptions Karpenter parses.
	old := doctor.New(sqsc, ebc, ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) }), nil,
		sts.NewFromConfig(cfg, func(o *sts.Options) { o.BaseEndpoint = aws.String(url) }), admin).Run(ctx, doctor.Config{QueueURL: intakeURL, DeadLetterQueueURL: dlqURL,
		KarpenterNamespace: "kube-system", Namespace: "health-router", Gates: checks.NewFeatureGates(), KarpenterVersion: signal.KarpenterVersion{Major: 1, Minor: 9, Patch: 3}})
	if i := item(t, old, "Karpenter version"); i.Status != doctor.Fail || !strings.Contains(i.Detail, "v1.9.3") || !strings.Contains(i.Detail, "v1.15.0") || !strings.Contains(i.Fix, "--karpenter-version v1.15.0") {
		t.Errorf("Karpenter version: %s (%s; %s), want a failure naming both versions and the fix", i.Status, i.Detail, i.Fix)
	}

	// Matching gates, an unencrypted queue with a short redrive, a service account with no RBAC.
	bare := rest.CopyConfig(restCfg)
	bare.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:health-router:health-router"}
	bareClient, err := client.New(bare, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	r = run(bareClient, plainURL, "ReservedCapacity=false")
	for check, want := range map[string]doctor.Status{
		"intake queue encryption":       doctor.Fail,
		"intake queue retention":        doctor.Warn,
		"intake queue redrive":          doctor.Fail,
		"RBAC":                          doctor.Fail,
		"feature gate ReservedCapacity": doctor.Unknown, // the bare account cannot read Deployments
	} {
		if got := item(t, r, check); got.Status != want {
			t.Errorf("bare: %s: %s (%s), want %s", check, got.Status, got.Detail, want)
		}
	}
	if got := item(t, run(admin, intakeURL, "ReservedCapacity=false"), "feature gate ReservedCapacity"); got.Status != doctor.OK {
		t.Errorf("matching gates: %s (%s)", got.Status, got.Detail)
	}
}
