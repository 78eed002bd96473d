package options

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRunWebhook(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	o, err := ParseRun(req, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.WebhookURL != "" || o.WebhookTemplate != "" || len(o.WebhookHeaders) != 0 {
		t.Errorf("defaults: URL %q, template %q, headers %v; want no webhook", o.WebhookURL, o.WebhookTemplate, o.WebhookHeaders)
	}

	// From the environment, as the chart sets them (URL and headers from Secrets).
	o, err = ParseRun(req, env(map[string]string{
		"HEALTH_ROUTER_WEBHOOK_URL":      "https://hooks.slack.com/services/T0/B0/x",
		"HEALTH_ROUTER_WEBHOOK_HEADERS":  "Authorization=Bearer abc==,X-Team=platform",
		"HEALTH_ROUTER_WEBHOOK_TEMPLATE": `{"text": "{{jsonEscape .Reason}}"}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if o.WebhookURL != "https://hooks.slack.com/services/T0/B0/x" || o.WebhookTemplate != `{"text": "{{jsonEscape .Reason}}"}` ||
		o.WebhookHeaders["Authorization"] != "Bearer abc==" || o.WebhookHeaders["X-Team"] != "platform" || len(o.WebhookHeaders) != 2 {
		t.Errorf("from the environment: URL %q, template %q, headers %v", o.WebhookURL, o.WebhookTemplate, o.WebhookHeaders)
	}

	// @path reads the template from a file; the flag wins over the environment.
	path := filepath.Join(t.TempDir(), "body.tmpl")
	if err := os.WriteFile(path, []byte(`{"msg": {{json .Summary}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = ParseRun(append(req, "--webhook-url", "http://relay.monitoring:8080/hook", "--webhook-template", "@"+path),
		env(map[string]string{"HEALTH_ROUTER_WEBHOOK_TEMPLATE": "{{.Bogus}}", "HEALTH_ROUTER_WEBHOOK_URL": "https://elsewhere/x"}))
	if err != nil {
		t.Fatal(err)
	}
	if o.WebhookURL != "http://relay.monitoring:8080/hook" || o.WebhookTemplate != `{"msg": {{json .Summary}}}` {
		t.Errorf("from flags: URL %q, template %q", o.WebhookURL, o.WebhookTemplate)
	}
}

// TestParseRunWebhookErrors: each mistake names its flag, and no message shows the URL or a
// header value (both are usually credentials).
func TestParseRunWebhookErrors(t *testing.T) {
	req := []string{"--queue-url", "q", "--dead-letter-queue-url", "dlq"}
	url := []string{"--webhook-url", "https://hooks.example.com/services/S3CRET"}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"not a URL", append(req, "--webhook-url", "hooks.example.com/S3CRET"), "--webhook-url: want an http or https URL"},
		{"not http", append(req, "--webhook-url", "ftp://hooks.example.com/S3CRET"), "--webhook-url"},
		{"template without URL", append(req, "--webhook-template", `{"text": "x"}`), "--webhook-template needs --webhook-url"},
		{"headers without URL", append(req, "--webhook-headers", "Authorization=Bearer S3CRET"), "--webhook-headers needs --webhook-url"},
		{"unparsable template", append(append(req, url...), "--webhook-template", `{"text": "{{.Reason"}`), "--webhook-template"},
		{"unknown field", append(append(req, url...), "--webhook-template", `{{.Instance}}`), "--webhook-template"},
		{"missing template file", append(append(req, url...), "--webhook-template", "@/nonexistent/body.tmpl"), "--webhook-template: reading the template"},
		{"header without value", append(append(req, url...), "--webhook-headers", "Authorization"), "--webhook-headers: entry 1"},
		{"bad header name", append(append(req, url...), "--webhook-headers", "Auth orization=Bearer S3CRET"), "--webhook-headers"},
	} {
		_, err := ParseRun(tt.args, env(nil))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want one containing %q", tt.name, err, tt.want)
			continue
		}
		if strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("%s: error %q shows a credential", tt.name, err)
		}
	}
}
