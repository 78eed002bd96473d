package terraform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/health-router/health-router/test/terraform/motoserver"
)

// Names in moto/main.tf: resource name prefixes (hr-<cluster_name>) of its two module
// instances, and the dispatcher instance's event bus.
const (
	e2ePrefix           = "hr-moto-e2e"
	e2eDispatcherPrefix = "hr-moto-disp"
	e2eDispatcherBus    = "health-router-moto-dispatcher"
)

// TestModuleAppliedToMoto applies moto/main.tf (the module, pointed at moto_server, once plain and
// once in dispatcher mode), checks the queues, rules and Lambda it made, puts real events through
// EventBridge, checks which reach the intake queue, then destroys everything and checks nothing
// is left. About 3 minutes: the AWS provider waits ~25 s on every SQS queue and queue policy.
func TestModuleAppliedToMoto(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skipping the terraform apply against moto (3 minutes)")
	}
	tf := terraformBinary()
	if tf == "" {
		t.Skip("SKIPPED LOUDLY: terraform is not installed; the module was NOT applied")
	}
	mirror := providerMirror()
	if mirror == "" {
		t.Skip("SKIPPED LOUDLY: no local provider mirror with registry.terraform.io/hashicorp/aws (set TF_PROVIDER_MIRROR); the module was NOT applied")
	}
	srv := motoserver.Start(t)
	ctx := context.Background()
	dir := e2eWorkdir(t, mirror)
	zip, err := filepath.Abs(filepath.Join(moduleDir, "tests", "fixtures", "dispatcher.zip"))
	if err != nil {
		t.Fatal(err)
	}
	vars := []string{"-var", "endpoint=" + srv.Endpoint, "-var", "dispatcher_zip_path=" + zip}

	terraform(t, tf, dir, "init", "-backend=false", "-input=false")
	terraform(t, tf, dir, append([]string{"apply", "-auto-approve", "-input=false"}, vars...)...)
	var out struct {
		QueueURL  struct{ Value string }            `json:"queue_url"`
		DLQURL    struct{ Value string }            `json:"dead_letter_queue_url"`
		RuleNames struct{ Value map[string]string } `json:"rule_names"`

		DispatcherFunctionARN struct{ Value string }            `json:"dispatcher_function_arn"`
		DispatcherQueueURL    struct{ Value string }            `json:"dispatcher_queue_url"`
		FailureQueueURL       struct{ Value string }            `json:"dispatcher_failure_queue_url"`
		DispatcherAlarms      struct{ Value map[string]string } `json:"dispatcher_alarm_names"`

		HelmValues           struct{ Value string } `json:"helm_values"`
		DispatcherHelmValues struct{ Value string } `json:"dispatcher_helm_values"`
	}
	if err := json.Unmarshal([]byte(terraform(t, tf, dir, "output", "-json")), &out); err != nil {
		t.Fatalf("terraform output: %v", err)
	}

	sqsc := sqs.NewFromConfig(srv.Config)
	events := eventbridge.NewFromConfig(srv.Config)
	cw := cloudwatch.NewFromConfig(srv.Config, motoserver.CloudWatchQuery)

	t.Run("queues", func(t *testing.T) { checkQueues(t, ctx, sqsc, out.QueueURL.Value, out.DLQURL.Value) })
	t.Run("rules", func(t *testing.T) { checkRules(t, ctx, events, out.RuleNames.Value) })
	t.Run("iam policies", func(t *testing.T) { checkRolePolicies(t, ctx, iam.NewFromConfig(srv.Config)) })
	t.Run("events", func(t *testing.T) { checkRouting(t, ctx, events, sqsc, out.QueueURL.Value) })
	t.Run("helm values", func(t *testing.T) {
		// Pod Identity, forward mode to Karpenter's queue.
		checkHelmValues(t, out.HelmValues.Value, map[string]string{
			"HEALTH_ROUTER_QUEUE_URL":             out.QueueURL.Value,
			"HEALTH_ROUTER_DEAD_LETTER_QUEUE_URL": out.DLQURL.Value,
			"HEALTH_ROUTER_KARPENTER_QUEUE_URL":   "https://sqs.us-east-1.amazonaws.com/123456789012/Karpenter-moto-e2e",
			"HEALTH_ROUTER_REGION":                "us-east-1",
			"HEALTH_ROUTER_ACCOUNT":               "123456789012",
			"HEALTH_ROUTER_CLUSTER_NAME":          "moto-e2e",
			"HEALTH_ROUTER_CLOUDWATCH_METRICS":    "true",
		}, "")
		// IRSA: the role ARN on the ServiceAccount; no Karpenter queue, so no forward setting.
		checkHelmValues(t, out.DispatcherHelmValues.Value, map[string]string{
			"HEALTH_ROUTER_REGION":              "us-east-1",
			"HEALTH_ROUTER_CLUSTER_NAME":        "moto-disp",
			"HEALTH_ROUTER_CLOUDWATCH_METRICS":  "true",
			"HEALTH_ROUTER_KARPENTER_QUEUE_URL": "",
		}, "arn:aws:iam::123456789012:role/"+e2eDispatcherPrefix+"-router")
		// And for real, as the README does it.
		installWithHelmValues(t, out.HelmValues.Value, out.QueueURL.Value)
	})
	t.Run("dispatcher", func(t *testing.T) {
		fn := out.DispatcherFunctionARN.Value
		if !strings.HasSuffix(fn, ":function:"+e2eDispatcherPrefix+"-dispatcher") {
			t.Errorf("dispatcher function ARN %q", fn)
		}
		rules, err := events.ListRules(ctx, &eventbridge.ListRulesInput{EventBusName: aws.String(e2eDispatcherBus)})
		if err != nil {
			t.Fatal(err)
		}
		if len(rules.Rules) != 7 { // one per kind: six of EC2 and Health, and Capacity Block expiration
			t.Errorf("%d dispatcher rules, want 7", len(rules.Rules))
		}
		// Issue 38, 1: the rules send to the dispatcher queue, never to the Lambda.
		dq, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(out.DispatcherQueueURL.Value), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
		if err != nil {
			t.Fatalf("the dispatcher queue %q: %v", out.DispatcherQueueURL.Value, err)
		}
		queueARN := dq.Attributes["QueueArn"]
		if !strings.HasSuffix(queueARN, ":"+e2eDispatcherPrefix+"-dispatcher") {
			t.Errorf("dispatcher queue ARN %q", queueARN)
		}
		var ruleARNs []string
		for _, r := range rules.Rules {
			ruleARNs = append(ruleARNs, aws.ToString(r.Arn))
			targets, err := events.ListTargetsByRule(ctx, &eventbridge.ListTargetsByRuleInput{Rule: r.Name, EventBusName: aws.String(e2eDispatcherBus)})
			if err != nil || len(targets.Targets) != 1 || aws.ToString(targets.Targets[0].Arn) != queueARN {
				t.Errorf("rule %s targets %+v (%v), want the dispatcher queue only", aws.ToString(r.Name), targets, err)
				continue
			}
			if dlq := targets.Targets[0].DeadLetterConfig; dlq == nil || !strings.HasSuffix(aws.ToString(dlq.Arn), ":"+e2eDispatcherPrefix+"-dispatcher-failures") {
				t.Errorf("rule %s: the queue target's dead-letter queue is %+v, want the failure queue", aws.ToString(r.Name), dlq)
			}
		}
		checkDispatcherQueue(t, dq.Attributes, ruleARNs)
		checkNoDirectInvoke(t, ctx, srv, fn, queueARN)
		failures, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(out.FailureQueueURL.Value), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
		if err != nil {
			t.Fatalf("the failure queue: %v", err)
		}
		if failures.Attributes["SqsManagedSseEnabled"] != "true" || !strings.Contains(failures.Attributes["Policy"], ":rule/"+e2eDispatcherBus+"/") {
			t.Errorf("failure queue not encrypted or not open to the dispatcher rules: %v", failures.Attributes)
		}
		// Its own intake queue is fed by the Lambda only: no rule may send to it.
		own, err := sqsc.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(e2eDispatcherPrefix)})
		if err != nil {
			t.Fatal(err)
		}
		policy, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: own.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNamePolicy}})
		if err != nil || !strings.Contains(policy.Attributes["Policy"], "DenyAllRules") || strings.Contains(policy.Attributes["Policy"], `"Allow"`) {
			t.Errorf("dispatcher-mode intake queue policy should deny every rule and allow nothing: %v %v", policy, err)
		}
		if _, ok := out.DispatcherAlarms.Value["dispatcher_failures"]; !ok {
			t.Errorf("no dispatcher_failures alarm: %v", out.DispatcherAlarms.Value)
		}
	})
	t.Run("observability", func(t *testing.T) {
		alarms, err := cw.DescribeAlarms(ctx, &cloudwatch.DescribeAlarmsInput{AlarmNamePrefix: aws.String(e2ePrefix)})
		if err != nil {
			t.Fatal(err)
		}
		if len(alarms.MetricAlarms) != 3 {
			t.Errorf("%d alarms, want 3 (dead letters, intake backlog, router silent)", len(alarms.MetricAlarms))
		}
		for _, a := range alarms.MetricAlarms {
			if aws.ToString(a.AlarmName) == e2ePrefix+"-router-silent" && aws.ToString(a.TreatMissingData) != "breaching" {
				t.Errorf("router-silent treats missing data as %q, want breaching", aws.ToString(a.TreatMissingData))
			}
		}
		dash, err := cw.GetDashboard(ctx, &cloudwatch.GetDashboardInput{DashboardName: aws.String(e2ePrefix)})
		if err != nil {
			t.Fatalf("GetDashboard: %v", err)
		}
		if !json.Valid([]byte(aws.ToString(dash.DashboardBody))) {
			t.Errorf("the applied dashboard body is not JSON")
		}
	})

	terraform(t, tf, dir, append([]string{"destroy", "-auto-approve", "-input=false"}, vars...)...)
	queues, err := sqsc.ListQueues(ctx, &sqs.ListQueuesInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(queues.QueueUrls) != 0 {
		t.Errorf("queues left after destroy: %v", queues.QueueUrls)
	}
	rules, err := events.ListRules(ctx, &eventbridge.ListRulesInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rules.Rules) != 0 {
		t.Errorf("%d rules left after destroy", len(rules.Rules))
	}
	buses, err := events.ListEventBuses(ctx, &eventbridge.ListEventBusesInput{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range buses.EventBuses {
		if aws.ToString(b.Name) != "default" {
			t.Errorf("event bus %s left after destroy", aws.ToString(b.Name))
		}
	}
	alarms, err := cw.DescribeAlarms(ctx, &cloudwatch.DescribeAlarmsInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms.MetricAlarms) != 0 {
		t.Errorf("%d alarms left after destroy", len(alarms.MetricAlarms))
	}
	if state := strings.TrimSpace(terraformMay(tf, dir, "state", "list")); state != "" {
		t.Errorf("terraform state not empty after destroy:\n%s", state)
	}
}

func checkQueues(t *testing.T, ctx context.Context, c *sqs.Client, queueURL, dlqURL string) {
	attrs := func(url string) map[string]string {
		out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll}})
		if err != nil {
			t.Fatalf("GetQueueAttributes %s: %v", url, err)
		}
		return out.Attributes
	}
	intake, dlq := attrs(queueURL), attrs(dlqURL)
	if intake["SqsManagedSseEnabled"] != "true" || dlq["SqsManagedSseEnabled"] != "true" {
		t.Errorf("SSE-SQS not on: intake %q, dlq %q", intake["SqsManagedSseEnabled"], dlq["SqsManagedSseEnabled"])
	}
	if intake["MessageRetentionPeriod"] != "1209600" {
		t.Errorf("intake retention %s, want 1209600", intake["MessageRetentionPeriod"])
	}
	var redrive struct {
		DeadLetterTargetArn string `json:"deadLetterTargetArn"`
	}
	if err := json.Unmarshal([]byte(intake["RedrivePolicy"]), &redrive); err != nil || redrive.DeadLetterTargetArn != dlq["QueueArn"] {
		t.Errorf("intake redrive policy %q does not target the DLQ %s", intake["RedrivePolicy"], dlq["QueueArn"])
	}
	policy := intake["Policy"]
	if !strings.Contains(policy, "aws:SourceArn") || !strings.Contains(policy, ":rule/"+e2ePrefix+"-spot-interruption") || !strings.Contains(policy, "aws:SecureTransport") {
		t.Errorf("intake queue policy is not scoped to the rules with a TLS deny: %s", policy)
	}
}

func checkRules(t *testing.T, ctx context.Context, c *eventbridge.Client, names map[string]string) {
	if len(names) != 7 { // one per kind: six of EC2 and Health, and Capacity Block expiration
		t.Errorf("%d rules in the outputs, want 7", len(names))
	}
	for kind, name := range names {
		rule, err := c.DescribeRule(ctx, &eventbridge.DescribeRuleInput{Name: aws.String(name)})
		if err != nil {
			t.Errorf("rule %s (%s): %v", name, kind, err)
			continue
		}
		if rule.State != ebtypes.RuleStateEnabled {
			t.Errorf("rule %s is %s", name, rule.State)
		}
		targets, err := c.ListTargetsByRule(ctx, &eventbridge.ListTargetsByRuleInput{Rule: aws.String(name)})
		if err != nil || len(targets.Targets) != 1 || !strings.HasSuffix(aws.ToString(targets.Targets[0].Arn), ":"+e2ePrefix) {
			t.Errorf("rule %s targets %+v (%v), want the intake queue only", name, targets, err)
		}
	}
}

// checkRouting puts every event of testdata/routed and testdata/filtered through EventBridge and
// checks that exactly the routed ones reach the intake queue, each once and intact.
func checkRouting(t *testing.T, ctx context.Context, events *eventbridge.Client, c *sqs.Client, queueURL string) {
	routed := putEvents(t, ctx, events, "routed")
	putEvents(t, ctx, events, "filtered")

	var got []map[string]json.RawMessage
	for empty := 0; empty < 2; {
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
		if err != nil {
			t.Fatalf("ReceiveMessage: %v", err)
		}
		if len(out.Messages) == 0 {
			empty++
		}
		for _, m := range out.Messages {
			var body map[string]json.RawMessage
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &body); err != nil {
				t.Fatalf("message body is not an event: %v", err)
			}
			got = append(got, body)
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}

	for name, ev := range routed {
		n := 0
		for _, body := range got {
			if string(body["detail-type"]) == fmt.Sprintf("%q", aws.ToString(ev.DetailType)) && sameJSON(body["detail"], []byte(aws.ToString(ev.Detail))) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s (%s) reached the intake queue %d times, want once", name, aws.ToString(ev.DetailType), n)
		}
	}
	if len(got) != len(routed) {
		var kinds []string
		for _, b := range got {
			kinds = append(kinds, string(b["source"])+" "+string(b["detail-type"])+" "+string(b["detail"]))
		}
		t.Errorf("%d messages in the intake queue, want %d (the filtered events must not arrive):\n%s", len(got), len(routed), strings.Join(kinds, "\n"))
	}
}

// putEvents sends every event in testdata/<dir> and returns them by file name.
func putEvents(t *testing.T, ctx context.Context, c *eventbridge.Client, dir string) map[string]ebtypes.PutEventsRequestEntry {
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no events in testdata/%s: %v", dir, err)
	}
	entries := map[string]ebtypes.PutEventsRequestEntry{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Source     string          `json:"source"`
			DetailType string          `json:"detail-type"`
			Time       time.Time       `json:"time"`
			Resources  []string        `json:"resources"`
			Detail     json.RawMessage `json:"detail"`
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var detail bytes.Buffer
		if err := json.Compact(&detail, ev.Detail); err != nil {
			t.Fatal(err)
		}
		entry := ebtypes.PutEventsRequestEntry{
			Source: aws.String(ev.Source), DetailType: aws.String(ev.DetailType), Detail: aws.String(detail.String()),
			Resources: ev.Resources, Time: aws.Time(ev.Time),
		}
		out, err := c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{entry}})
		if err != nil || out.FailedEntryCount != 0 {
			t.Fatalf("PutEvents %s: %v %+v", f, err, out)
		}
		entries[filepath.Base(f)] = entry
	}
	return entries
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// e2eWorkdir copies moto/main.tf to a temporary directory with the module source made absolute,
// and writes a CLI config that installs providers from mirror only, so nothing is written in the
// repository and nothing is downloaded.
func e2eWorkdir(t *testing.T, mirror string) string {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("moto", "main.tf"))
	if err != nil {
		t.Fatal(err)
	}
	module, err := filepath.Abs(moduleDir)
	if err != nil {
		t.Fatal(err)
	}
	main := strings.ReplaceAll(string(src), `"../../../terraform"`, fmt.Sprintf("%q", module))
	if main == string(src) {
		t.Fatal(`moto/main.tf no longer uses source = "../../../terraform"`)
	}
	rc := fmt.Sprintf("provider_installation {\n  filesystem_mirror {\n    path    = %q\n    include = [\"registry.terraform.io/hashicorp/*\"]\n  }\n}\n", mirror)
	for name, content := range map[string]string{"main.tf": main, "terraformrc": rc} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// terraform runs a terraform command in dir and fails the test with its output on error.
func terraform(t *testing.T, tf, dir string, args ...string) string {
	t.Helper()
	cmd := terraformCmd(tf, dir, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("terraform %s: %v\n%s\n%s", args[0], err, out, stderr.String())
	}
	return string(out)
}

// terraformMay runs a terraform command and returns its output, whatever happened.
func terraformMay(tf, dir string, args ...string) string {
	out, _ := terraformCmd(tf, dir, args...).CombinedOutput()
	return string(out)
}

func terraformCmd(tf, dir string, args ...string) *exec.Cmd {
	full := append([]string{"-chdir=" + dir}, args...)
	if args[0] != "state" {
		full = append(full, "-no-color")
	}
	cmd := exec.Command(tf, full...)
	cmd.Env = append(os.Environ(),
		"TF_CLI_CONFIG_FILE="+filepath.Join(dir, "terraformrc"),
		"TF_IN_AUTOMATION=1",
		"TF_PLUGIN_CACHE_DIR=",
		"CHECKPOINT_DISABLE=1",
	)
	return cmd
}

func terraformBinary() string {
	if p, err := exec.LookPath("terraform"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/local/bin/terraform"); err == nil {
		return "/usr/local/bin/terraform"
	}
	return ""
}

// providerMirror returns a filesystem mirror directory holding registry.terraform.io/hashicorp/aws:
// TF_PROVIDER_MIRROR (run.sh sets it from a search of the disk), or a usual place.
func providerMirror() string {
	home, _ := os.UserHomeDir()
	candidates := []string{os.Getenv("TF_PROVIDER_MIRROR"), "/opt/tf-plugins", "/usr/share/terraform/plugins",
		"/usr/local/share/terraform/plugins", filepath.Join(home, ".terraform.d", "plugins")}
	for _, dir := range slices.DeleteFunc(candidates, func(s string) bool { return s == "" }) {
		if _, err := os.Stat(filepath.Join(dir, "registry.terraform.io", "hashicorp", "aws")); err == nil {
			return dir
		}
	}
	return ""
}
