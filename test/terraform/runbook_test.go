package terraform

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/health-router/health-router/router/app"
	"github.com/health-router/health-router/router/doctor"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/test/harness"
	"github.com/health-router/health-router/test/terraform/motoserver"
)

// The runbook's names (docs/runbook.md, step 1), in moto's account.
const (
	runbookRegion    = "eu-west-1"
	runbookCluster   = "prod-eu"
	runbookAccount   = "123456789012" // moto's
	karpenterQueue   = "Karpenter-prod-eu"
	karpenterRole    = "KarpenterController-prod-eu"
	runbookNamespace = "health-router"
)

// karpenterRules are the EventBridge rules Karpenter's own install (its CloudFormation stack)
// makes, each feeding its interruption queue.
var karpenterRules = map[string]string{
	karpenterQueue + "-ScheduledChangeRule":     `{"source":["aws.health"],"detail-type":["AWS Health Event"]}`,
	karpenterQueue + "-SpotInterruptionRule":    `{"source":["aws.ec2"],"detail-type":["EC2 Spot Instance Interruption Warning"]}`,
	karpenterQueue + "-RebalanceRule":           `{"source":["aws.ec2"],"detail-type":["EC2 Instance Rebalance Recommendation"]}`,
	karpenterQueue + "-InstanceStateChangeRule": `{"source":["aws.ec2"],"detail-type":["EC2 Instance State-change Notification"]}`,
}

// TestRunbook follows docs/runbook.md's way in, steps 1-4, on moto and envtest: the example's
// apply without the takeover, the chart installed in shadow, doctor; then step 4's commands
// in the order the document gives them (read from it), doctor where the document runs it,
// each time asserting the mode and takeover rows and the exit status the document promises.
// Last, the failure it names: a router in shadow once Karpenter's handling is gone.
// Two terraform applies, one moto, one envtest: about three minutes on 2 cores, most of it
// the first apply (the AWS provider waits on each SQS queue and queue policy).
func TestRunbook(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the runbook (two terraform applies against moto)")
	}
	tf := terraformBinary()
	if tf == "" {
		t.Skip("SKIPPED LOUDLY: terraform is not installed; the runbook was NOT followed")
	}
	mirror := providerMirror()
	if mirror == "" {
		t.Skip("SKIPPED LOUDLY: no local provider mirror with registry.terraform.io/hashicorp/aws (set TF_PROVIDER_MIRROR); the runbook was NOT followed")
	}
	steps := takeoverSteps(t)
	if got, want := kinds(steps), []string{"(a)", "leave shadow", "doctor", "(b)", "deny", "values", "(c)", "doctor"}; !slices.Equal(got, want) {
		t.Fatalf("docs/runbook.md step 4 reads, in its order,\n  %q\nthe test follows\n  %q\nchange the test with the runbook: the order is what keeps every event acted on", got, want)
	}

	start := time.Now()
	srv := motoserver.Start(t)
	ctx := context.Background()
	cfg := srv.Config.Copy()
	cfg.Region = runbookRegion
	endpoint := harness.IAMSimulator(t, srv.Endpoint, cfg)
	// doctor's AWS configuration comes from the environment, as in the pod.
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull, "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "", "AWS_DEFAULT_REGION": ""} {
		t.Setenv(k, v)
	}
	karpenterInstall(t, ctx, cfg, srv.Endpoint)

	ctrl.SetLogger(logr.Discard())
	kube := harness.KubeAPIServerBare(t) // the chart installs the router's own CRD
	h := newHelm(t, kube, endpoint)
	dir := runbookWorkdir(t, mirror, srv.Endpoint)
	vars := []string{"-var", "region=" + runbookRegion, "-var", "cluster_name=" + runbookCluster,
		"-var", "karpenter_queue_arn=arn:aws:sqs:" + runbookRegion + ":" + runbookAccount + ":" + karpenterQueue,
		"-var", "karpenter_controller_role_name=" + karpenterRole}
	terraform(t, tf, dir, "init", "-backend=false", "-input=false")
	t.Logf("moto, envtest, init: %s", time.Since(start).Round(time.Second))

	// 1. The AWS side, without the takeover.
	terraform(t, tf, dir, append([]string{"apply", "-auto-approve", "-input=false"}, append(vars, "-var", "takeover=false")...)...)
	values := terraform(t, tf, dir, "output", "-raw", "helm_values")
	if shadow, ok := helmSettings(t, values)["shadow"]; shadow != true || !ok {
		t.Errorf("step 1: helm_values does not say settings.shadow: true:\n%s", values)
	}
	if got := strings.TrimSpace(terraform(t, tf, dir, "output", "karpenter_deny_attached_role")); got != `""` {
		t.Errorf("step 1: karpenter_deny_attached_role = %s, want \"\": Karpenter keeps its poller", got)
	}
	t.Logf("step 1 applied: %s", time.Since(start).Round(time.Second))

	// 2. The router, in shadow.
	h.run(t, "upgrade", "--install", "health-router", h.chart, "-n", runbookNamespace, "--create-namespace", "-f", h.values(t, values), "-f", h.endpointValues)

	// 3. doctor.
	r := h.doctor(t, ctx, kube, "step 3, in shadow")
	expectRow(t, r, doctor.CheckMode, doctor.OK, "shadow (--shadow)")
	expectRow(t, r, doctor.CheckTakeover, doctor.OK, "not yet, as it should be in shadow")
	expectRow(t, r, doctor.CheckKarpenterRules, doctor.OK, "as it should be while the router is in shadow")
	expectRow(t, r, doctor.CheckKarpenterInstanceStatus, doctor.OK, "as it should be while the router is in shadow")
	expectPass(t, r, true, "step 3")

	// 4. The takeover, in the document's order.
	for _, s := range steps {
		switch s.kind {
		case "(a)", "(b)":
			t.Logf("step 4%s %s", s.kind, s.text)
		case "leave shadow":
			h.run(t, strings.Fields(strings.TrimPrefix(s.text, "helm "))...)
			if env := h.env(t, ctx); env["HEALTH_ROUTER_SHADOW"] != "false" || env["HEALTH_ROUTER_QUEUE_URL"] == "" {
				t.Errorf("step 4a: --reuse-values --set settings.shadow=false left HEALTH_ROUTER_SHADOW=%q, HEALTH_ROUTER_QUEUE_URL=%q", env["HEALTH_ROUTER_SHADOW"], env["HEALTH_ROUTER_QUEUE_URL"])
			}
		case "deny":
			terraform(t, tf, dir, append([]string{"apply", "-auto-approve", "-input=false"}, append(vars, "-var", "takeover=true")...)...)
			if got := strings.TrimSpace(terraform(t, tf, dir, "output", "karpenter_deny_attached_role")); got != fmt.Sprintf("%q", karpenterRole) {
				t.Errorf("step 4b: karpenter_deny_attached_role = %s, want %q", got, karpenterRole)
			}
			r := h.doctor(t, ctx, kube, "step 4b, the deny attached")
			expectRow(t, r, doctor.CheckKarpenterInstanceStatus, doctor.OK, "denied to arn:aws:iam::"+runbookAccount+":role/"+karpenterRole)
			expectRow(t, r, doctor.CheckTakeover, doctor.Warn, "in progress")
			expectPass(t, r, true, "step 4b")
		case "values":
			v := terraform(t, tf, dir, "output", "-raw", "helm_values")
			if _, ok := helmSettings(t, v)["shadow"]; ok {
				t.Errorf("step 4b: helm_values after the takeover still sets shadow, not what (a) set:\n%s", v)
			}
		case "(c)":
			t.Logf("step 4(c) %s", s.text)
			removeKarpenterRules(t, ctx, cfg, srv.Endpoint)
		case "doctor":
			r := h.doctor(t, ctx, kube, "step 4 "+s.text)
			status, detail, pass := s.promise(t)
			expectRow(t, r, doctor.CheckMode, doctor.OK, "active")
			expectRow(t, r, doctor.CheckTakeover, status, detail)
			expectPass(t, r, pass, "step 4, "+s.text)
		default:
			t.Fatalf("no action for %q", s.text)
		}
	}

	// Never the other way round: a router put back in shadow once Karpenter's rules are gone
	// and its poller denied acts on nothing; doctor fails.
	h.run(t, "upgrade", "health-router", h.chart, "-n", runbookNamespace, "--reuse-values", "--set", "settings.shadow=true")
	r = h.doctor(t, ctx, kube, "in shadow after the takeover")
	expectRow(t, r, doctor.CheckMode, doctor.Fail, "shadow (--shadow) while Karpenter's own handling is off")
	expectRow(t, r, doctor.CheckTakeover, doctor.Fail, "begun while the router is in shadow")
	expectRow(t, r, doctor.CheckKarpenterRules, doctor.Fail, "nobody acts")
	expectPass(t, r, false, "in shadow after the takeover")
	t.Logf("runbook followed in %s", time.Since(start).Round(time.Second))
}

// helmSettings reads the settings of a helm_values output.
func helmSettings(t *testing.T, values string) map[string]any {
	t.Helper()
	var v struct {
		Settings map[string]any `json:"settings"`
	}
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		t.Fatalf("helm_values: %v\n%s", err, values)
	}
	return v.Settings
}

// runbookStep is one line of step 4's shell block: a step's letter "(a)", or a command.
type runbookStep struct {
	kind string // "(a)".."(c)", "leave shadow", "deny", "values", "doctor"
	text string // the marker's words, or the command with its comment
}

// takeoverSteps reads the shell block under "**4. The takeover**" in docs/runbook.md.
func takeoverSteps(t *testing.T) []runbookStep {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleDir, "..", "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "**4. The takeover**")
	if !ok {
		t.Fatal(`docs/runbook.md has no "**4. The takeover**"`)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/runbook.md step 4 has no ```sh block")
	}
	marker := regexp.MustCompile(`^# (\([a-z]\)) (.*)$`)
	var steps []runbookStep
	sc := bufio.NewScanner(strings.NewReader(block))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		command, _, _ := strings.Cut(line, "#")
		command = strings.TrimSpace(command)
		switch m := marker.FindStringSubmatch(line); {
		case line == "":
		case m != nil:
			steps = append(steps, runbookStep{m[1], m[2]})
		case strings.HasPrefix(command, "helm upgrade ") && strings.Contains(command, "--reuse-values") && strings.Contains(command, "settings.shadow=false"):
			steps = append(steps, runbookStep{"leave shadow", command})
		case strings.HasPrefix(command, "terraform apply ") && strings.Contains(command, "-var takeover=true"):
			steps = append(steps, runbookStep{"deny", command})
		case command == "terraform output -raw helm_values > values.yaml":
			steps = append(steps, runbookStep{"values", command})
		case strings.HasSuffix(command, "-- health-router doctor"):
			steps = append(steps, runbookStep{"doctor", line})
		default:
			steps = append(steps, runbookStep{"unknown", line})
		}
	}
	return steps
}

func kinds(steps []runbookStep) []string {
	var k []string
	for _, s := range steps {
		k = append(k, s.kind)
	}
	return k
}

// promise reads what the runbook says a doctor line shows: "# takeover: in progress (a
// warning)" is a warning and a pass, "# takeover: complete" an ok.
func (s runbookStep) promise(t *testing.T) (doctor.Status, string, bool) {
	t.Helper()
	_, comment, _ := strings.Cut(s.text, "#")
	words, ok := strings.CutPrefix(strings.TrimSpace(comment), "takeover: ")
	if !ok {
		t.Fatalf("the runbook's doctor line %q promises no takeover row", s.text)
	}
	detail, qualifier, _ := strings.Cut(words, " (")
	switch qualifier {
	case "":
		return doctor.OK, detail, true
	case "a warning)":
		return doctor.Warn, detail, true
	}
	t.Fatalf("the runbook's doctor line %q: the test does not know what %q promises", s.text, qualifier)
	return "", "", false
}

// karpenterInstall makes on moto what Karpenter's own install has: its interruption queue, its
// EventBridge rules feeding it, and its controller role, which may call
// ec2:DescribeInstanceStatus.
func karpenterInstall(t *testing.T, ctx context.Context, cfg aws.Config, endpoint string) {
	t.Helper()
	sqsc := sqs.NewFromConfig(cfg, func(o *sqs.Options) { o.BaseEndpoint = aws.String(endpoint) })
	q, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(karpenterQueue), Attributes: map[string]string{"SqsManagedSseEnabled": "true"}})
	if err != nil {
		t.Fatalf("Karpenter's queue: %v", err)
	}
	attrs, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	events := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(endpoint) })
	for name, pattern := range karpenterRules {
		if _, err := events.PutRule(ctx, &eventbridge.PutRuleInput{Name: aws.String(name), EventPattern: aws.String(pattern)}); err != nil {
			t.Fatalf("Karpenter's rule %s: %v", name, err)
		}
		if _, err := events.PutTargets(ctx, &eventbridge.PutTargetsInput{Rule: aws.String(name), Targets: []ebtypes.Target{{Id: aws.String("KarpenterInterruptionQueueTarget"), Arn: aws.String(attrs.Attributes["QueueArn"])}}}); err != nil {
			t.Fatalf("Karpenter's rule %s target: %v", name, err)
		}
	}
	iamc := iam.NewFromConfig(cfg, func(o *iam.Options) { o.BaseEndpoint = aws.String(endpoint) })
	trust := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"pods.eks.amazonaws.com"},"Action":["sts:AssumeRole","sts:TagSession"]}]}`
	if _, err := iamc.CreateRole(ctx, &iam.CreateRoleInput{RoleName: aws.String(karpenterRole), AssumeRolePolicyDocument: aws.String(trust)}); err != nil {
		t.Fatalf("Karpenter's role: %v", err)
	}
	// The part of Karpenter's controller policy that matters here (its AllowRegionalReadActions).
	policy := `{"Version":"2012-10-17","Statement":[{"Sid":"AllowRegionalReadActions","Effect":"Allow","Action":["ec2:DescribeAvailabilityZones","ec2:DescribeImages","ec2:DescribeInstances","ec2:DescribeInstanceStatus","ec2:DescribeInstanceTypeOfferings","ec2:DescribeInstanceTypes"],"Resource":"*"}]}`
	if _, err := iamc.PutRolePolicy(ctx, &iam.PutRolePolicyInput{RoleName: aws.String(karpenterRole), PolicyName: aws.String("KarpenterControllerPolicy"), PolicyDocument: aws.String(policy)}); err != nil {
		t.Fatalf("Karpenter's policy: %v", err)
	}
}

// removeKarpenterRules is step 4(c): Karpenter's own EventBridge rules removed, its queue kept.
func removeKarpenterRules(t *testing.T, ctx context.Context, cfg aws.Config, endpoint string) {
	t.Helper()
	events := eventbridge.NewFromConfig(cfg, func(o *eventbridge.Options) { o.BaseEndpoint = aws.String(endpoint) })
	for name := range karpenterRules {
		if _, err := events.RemoveTargets(ctx, &eventbridge.RemoveTargetsInput{Rule: aws.String(name), Ids: []string{"KarpenterInterruptionQueueTarget"}}); err != nil {
			t.Fatalf("removing the target of %s: %v", name, err)
		}
		if _, err := events.DeleteRule(ctx, &eventbridge.DeleteRuleInput{Name: aws.String(name)}); err != nil {
			t.Fatalf("deleting %s: %v", name, err)
		}
	}
}

// runbookWorkdir copies terraform/examples/basic to a temporary directory with the module
// source made absolute, and an override file that points the provider at moto. The override
// also turns off the example's EKS Pod Identity association: moto has no Pod Identity API,
// and nothing in the runbook reads it.
func runbookWorkdir(t *testing.T, mirror, endpoint string) string {
	t.Helper()
	dir := t.TempDir()
	example := filepath.Join(moduleDir, "examples", "basic")
	files, err := filepath.Glob(filepath.Join(example, "*.tf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no .tf files in %s: %v", example, err)
	}
	module, err := filepath.Abs(moduleDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := strings.ReplaceAll(string(b), `source = "../.."`, fmt.Sprintf("source = %q", module))
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if main, _ := os.ReadFile(filepath.Join(dir, "main.tf")); !bytes.Contains(main, []byte(module)) {
		t.Fatal(`examples/basic/main.tf no longer uses source = "../.."`)
	}
	override := fmt.Sprintf(`provider "aws" {
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true

  endpoints {
    sqs        = %[1]q
    events     = %[1]q
    iam        = %[1]q
    sts        = %[1]q
    cloudwatch = %[1]q
    eks        = %[1]q
    logs       = %[1]q
    lambda     = %[1]q
  }
}

module "health_router" {
  create_pod_identity_association = false
}
`, endpoint)
	rc := fmt.Sprintf("provider_installation {\n  filesystem_mirror {\n    path    = %q\n    include = [\"registry.terraform.io/hashicorp/*\"]\n  }\n}\n", mirror)
	for name, content := range map[string]string{"moto_override.tf": override, "terraformrc": rc} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// helmRun runs helm against envtest's API server, from the repository's root so that the
// runbook's own chart path (deploy/charts/health-router) works.
type helmRun struct {
	bin, kubeconfig, home, chart string
	endpointValues               string // settings.awsEndpointURL: the pod's way to "AWS"
	kube                         client.Client
}

func newHelm(t *testing.T, cfg *rest.Config, endpoint string) *helmRun {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	kc.CurrentContext = "envtest"
	dir := t.TempDir()
	h := &helmRun{bin: helmBinary(t), kubeconfig: filepath.Join(dir, "kubeconfig"), home: dir, chart: "deploy/charts/health-router",
		endpointValues: filepath.Join(dir, "endpoint.yaml")}
	if err := clientcmd.WriteToFile(*kc, h.kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.endpointValues, []byte(fmt.Sprintf("settings:\n  awsEndpointURL: %q\n", endpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.kube = c
	return h
}

func (h *helmRun) values(t *testing.T, values string) string {
	t.Helper()
	f := filepath.Join(h.home, "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func (h *helmRun) run(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	cmd.Dir = filepath.Join(moduleDir, "..")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+h.home+"/cache", "HELM_CONFIG_HOME="+h.home+"/config", "HELM_DATA_HOME="+h.home+"/data")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// env is the router container's environment as the API server holds the chart's Deployment.
func (h *helmRun) env(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := h.kube.Get(ctx, client.ObjectKey{Namespace: runbookNamespace, Name: "health-router"}, d); err != nil {
		t.Fatalf("the installed Deployment: %v", err)
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	return env
}

// doctor is `kubectl -n health-router exec deploy/health-router -- health-router doctor`:
// doctor's options from the environment the chart gave the router's container, its
// Kubernetes calls as the router's ServiceAccount (the chart's RBAC), its AWS calls to moto
// through the IAM simulator (the chart's settings.awsEndpointURL).
func (h *helmRun) doctor(t *testing.T, ctx context.Context, cfg *rest.Config, when string) doctor.Report {
	t.Helper()
	env := h.env(t, ctx)
	o, err := options.ParseDoctor(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("%s: doctor's options from the chart's environment: %v", when, err)
	}
	asRouter := rest.CopyConfig(cfg)
	asRouter.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + runbookNamespace + ":health-router",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + runbookNamespace, "system:authenticated"},
	}
	r, err := app.Doctor(ctx, o, asRouter)
	if err != nil {
		t.Fatalf("%s: doctor: %v", when, err)
	}
	var out bytes.Buffer
	r.Print(&out)
	exit := 0
	if r.Failed() {
		exit = 1
	}
	t.Logf("doctor, %s (exit %d):\n%s", when, exit, out.String())
	return r
}

func expectRow(t *testing.T, r doctor.Report, check string, status doctor.Status, detail string) {
	t.Helper()
	i := slices.IndexFunc(r, func(i doctor.Item) bool { return i.Check == check })
	if i < 0 {
		t.Errorf("doctor printed no %q row", check)
		return
	}
	if r[i].Status != status || !strings.Contains(r[i].Detail, detail) {
		t.Errorf("doctor's %q row: [%s] %s\nwant [%s] with %q", check, r[i].Status, r[i].Detail, status, detail)
	}
}

func expectPass(t *testing.T, r doctor.Report, pass bool, when string) {
	t.Helper()
	if r.Failed() == pass {
		var failed []string
		for _, i := range r {
			if i.Status == doctor.Fail {
				failed = append(failed, i.Check+": "+i.Detail)
			}
		}
		t.Errorf("%s: doctor exits %d, want %d; FAIL rows:\n  %s", when, map[bool]int{true: 1, false: 0}[r.Failed()], map[bool]int{true: 0, false: 1}[pass], strings.Join(failed, "\n  "))
	}
}
