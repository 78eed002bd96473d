package terraform

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
)

// statement is one statement of an identity policy, its condition kept as written.
type statement struct {
	Sid       string
	Effect    string
	Action    any
	Resource  any
	Condition json.RawMessage
}

// rolePolicy reads back the inline policy name of role as IAM holds it: what was applied, not
// what Terraform planned. IAM answers with the document URL-encoded; moto as it was put.
func rolePolicy(t *testing.T, ctx context.Context, c *iam.Client, role, name string) map[string]statement {
	t.Helper()
	out, err := c.GetRolePolicy(ctx, &iam.GetRolePolicyInput{RoleName: aws.String(role), PolicyName: aws.String(name)})
	if err != nil {
		t.Fatalf("GetRolePolicy %s/%s: %v", role, name, err)
	}
	doc := aws.ToString(out.PolicyDocument)
	if !strings.HasPrefix(strings.TrimSpace(doc), "{") {
		if doc, err = url.QueryUnescape(doc); err != nil {
			t.Fatalf("policy %s/%s: %v", role, name, err)
		}
	}
	var policy struct{ Statement []statement }
	if err := json.Unmarshal([]byte(doc), &policy); err != nil {
		t.Fatalf("policy %s/%s is not a policy document: %v\n%s", role, name, err, doc)
	}
	bySid := map[string]statement{}
	for _, s := range policy.Statement {
		bySid[s.Sid] = s
	}
	return bySid
}

// checkConditions asserts that each named statement is an Allow with exactly the condition
// given (JSON), and that every statement on Resource "*" is held to region.
func checkConditions(t *testing.T, what string, got map[string]statement, want map[string]string, region string) {
	t.Helper()
	for sid, cond := range want {
		s, ok := got[sid]
		if !ok {
			t.Errorf("%s: no statement %s", what, sid)
			continue
		}
		if s.Effect != "Allow" || !sameJSON(s.Condition, []byte(cond)) {
			t.Errorf("%s: statement %s is %s with condition %s, want Allow with %s", what, sid, s.Effect, s.Condition, cond)
		}
	}
	for sid, s := range got {
		if s.Resource != "*" {
			continue
		}
		var c map[string]map[string]any
		if err := json.Unmarshal(s.Condition, &c); err != nil || c["StringEquals"]["aws:RequestedRegion"] != region {
			t.Errorf("%s: statement %s on Resource \"*\" is not held to %s (aws:RequestedRegion): %s", what, sid, region, s.Condition)
		}
	}
}

// checkRolePolicies reads back the policies of the router's role (moto-e2e, with every optional
// statement) and of the dispatcher's role (moto-disp), and checks the conditions that hold them
// to this cluster and region (issue 38, item 7): the event windows created only with the
// cluster's and a pool's tags and no other, changed only when they carry both; reads and metrics
// held to the region; the dispatcher's queue keys used through SQS only.
func checkRolePolicies(t *testing.T, ctx context.Context, c *iam.Client) {
	const region = `"aws:RequestedRegion": "us-east-1"`
	windowTags := `"StringEquals": {"aws:RequestTag/healthrouter.io/cluster": "moto-e2e"%s},
		"StringLike": {"aws:RequestTag/healthrouter.io/nodepool": "?*"},
		"ForAllValues:StringEquals": {"aws:TagKeys": ["healthrouter.io/cluster", "healthrouter.io/nodepool"]}`
	karpenter := `"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/moto-e2e": "owned"}, "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"}`
	checkConditions(t, "router role", rolePolicy(t, ctx, c, e2ePrefix+"-router", "health-router"), map[string]string{
		"EventWindowsCreate":      `{` + strings.Replace(windowTags, "%s", "", 1) + `}`,
		"EventWindowsTagOnCreate": `{` + strings.Replace(windowTags, "%s", `, "ec2:CreateAction": "CreateInstanceEventWindow"`, 1) + `}`,
		"EventWindowsManage":      `{"StringEquals": {"aws:ResourceTag/healthrouter.io/cluster": "moto-e2e"}, "StringLike": {"aws:ResourceTag/healthrouter.io/nodepool": "?*"}}`,
		"EventWindowsDescribe":    `{"StringEquals": {` + region + `}}`,
		"EventWindowsTagInstances": `{"StringEquals": {"aws:ResourceTag/kubernetes.io/cluster/moto-e2e": "owned"},
			"StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*", "aws:RequestTag/healthrouter.io/event-window": "moto-e2e/*"},
			"ForAllValues:StringEquals": {"aws:TagKeys": ["healthrouter.io/event-window"]}}`,
		"RescheduleEvents":     `{` + karpenter + `}`,
		"RebootInPlace":        `{` + karpenter + `}`,
		"RebootMigration":      `{"StringEquals": {` + region + `}}`,
		"PreDrainChecks":       `{"StringEquals": {` + region + `}}`,
		"InstanceStatusPoller": `{"StringEquals": {` + region + `}}`,
		"InspectRules":         `{"StringEquals": {` + region + `}}`,
		"Metrics":              `{"StringEquals": {"cloudwatch:namespace": "HealthRouter", ` + region + `}}`,
	}, "us-east-1")
	checkConditions(t, "dispatcher role", rolePolicy(t, ctx, c, e2eDispatcherPrefix+"-dispatcher", "dispatcher"), map[string]string{
		"FindOwners": `{"StringEquals": {` + region + `}}`,
		"Metrics":    `{"StringEquals": {"cloudwatch:namespace": "HealthRouter", ` + region + `}}`,
		"QueueKeys":  `{"StringEquals": {"kms:ViaService": ["sqs.us-east-1.amazonaws.com"]}}`,
	}, "us-east-1")
}
