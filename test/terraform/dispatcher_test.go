package terraform

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/health-router/health-router/test/terraform/motoserver"
)

// directInvoke matches a resource that lets a principal invoke a Lambda function itself.
var directInvoke = regexp.MustCompile(`resource\s+"(aws_lambda_permission|aws_lambda_function_url)"\s+"(\w+)"`)

// Issue 38, 1: nothing in the module may let anyone invoke the dispatcher directly. A Lambda
// permission for the rules is the obvious way to wire them, and the wrong one: a function's
// resource policy only adds grants, so every principal of the account whose identity policy
// allows lambda:InvokeFunction could hand the dispatcher a forged event. The rules send to the
// dispatcher queue instead (terraform/tests: module.tftest.hcl, run "dispatcher"; the moto
// apply checks the applied function has no policy at all).
func TestNoDirectInvokeOfTheDispatcher(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(moduleDir, "*.tf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no module files in %s: %v", moduleDir, err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range directInvoke.FindAllStringSubmatch(string(src), -1) {
			t.Errorf("%s declares %s.%s: the dispatcher must be fed by its queue's event source mapping, invoked by nobody directly", filepath.Base(f), m[1], m[2])
		}
	}
}

// checkDispatcherQueue checks the applied dispatcher queue: encrypted, redriven to the failure
// queue, and a policy that lets EventBridge send for the module's rules only and denies every
// other sender.
func checkDispatcherQueue(t *testing.T, attrs map[string]string, ruleARNs []string) {
	t.Helper()
	if attrs["SqsManagedSseEnabled"] != "true" {
		t.Errorf("dispatcher queue not encrypted: %v", attrs)
	}
	if !strings.Contains(attrs["RedrivePolicy"], ":"+e2eDispatcherPrefix+"-dispatcher-failures") {
		t.Errorf("dispatcher queue redrive %q, want the failure queue", attrs["RedrivePolicy"])
	}
	var policy struct {
		Statement []struct {
			Sid       string
			Effect    string
			Principal any
			Condition map[string]map[string]any
		}
	}
	if err := json.Unmarshal([]byte(attrs["Policy"]), &policy); err != nil {
		t.Fatalf("dispatcher queue policy %q: %v", attrs["Policy"], err)
	}
	var allows, denyOthers int
	for _, s := range policy.Statement {
		switch {
		case s.Effect == "Allow":
			allows++
			var got []string
			switch v := s.Condition["ArnEquals"]["aws:SourceArn"].(type) {
			case string:
				got = []string{v}
			case []any:
				for _, a := range v {
					got = append(got, a.(string))
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(ruleARNs))
			if p, _ := s.Principal.(map[string]any); p["Service"] != "events.amazonaws.com" || !slices.Equal(got, want) {
				t.Errorf("dispatcher queue Allow %+v, want EventBridge for the rules %v only", s, want)
			}
		case s.Sid == "DenyOtherSenders":
			denyOthers++
		}
	}
	if allows != 1 || denyOthers != 1 {
		t.Errorf("dispatcher queue policy has %d Allow and %d DenyOtherSenders statements, want 1 and 1: %s", allows, denyOthers, attrs["Policy"])
	}
}

// checkNoDirectInvoke asks moto's Lambda, with requests signed as an SDK client would sign them
// (the module has no Lambda client to share), that the applied dispatcher has no resource policy
// (no principal was granted lambda:InvokeFunction) and is fed by one event source mapping from
// the dispatcher queue with partial batch failures.
func checkNoDirectInvoke(t *testing.T, ctx context.Context, srv *motoserver.Server, fn, queueARN string) {
	t.Helper()
	status, body := lambdaGet(t, ctx, srv, "/2015-03-31/functions/"+url.PathEscape(fn)+"/policy")
	if status != http.StatusNotFound || !strings.Contains(body, "ResourceNotFound") {
		t.Errorf("GetPolicy of the dispatcher = %d %s, want 404 ResourceNotFoundException: no principal may invoke it directly", status, body)
	}
	status, body = lambdaGet(t, ctx, srv, "/2015-03-31/event-source-mappings/?EventSourceArn="+url.QueryEscape(queueARN))
	var out struct {
		EventSourceMappings []struct {
			EventSourceArn        string
			FunctionArn           string
			FunctionResponseTypes []string
		}
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("ListEventSourceMappings = %d %s", status, body)
	}
	if len(out.EventSourceMappings) != 1 {
		t.Fatalf("%d event source mappings from the dispatcher queue, want 1: %s", len(out.EventSourceMappings), body)
	}
	m := out.EventSourceMappings[0]
	if m.EventSourceArn != queueARN || m.FunctionArn != fn || !slices.Equal(m.FunctionResponseTypes, []string{"ReportBatchItemFailures"}) {
		t.Errorf("event source mapping %+v, want %s -> %s with ReportBatchItemFailures", m, queueARN, fn)
	}
}

// lambdaGet sends a SigV4-signed GET of Lambda's REST API to moto.
func lambdaGet(t *testing.T, ctx context.Context, srv *motoserver.Server, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(srv.Endpoint, "/")+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := srv.Config.Credentials.Retrieve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const emptyPayload = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" // SHA-256 of ""
	if err := v4.NewSigner().SignHTTP(ctx, creds, req, emptyPayload, "lambda", srv.Config.Region, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
