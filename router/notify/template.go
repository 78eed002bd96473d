package notify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// DefaultTemplate renders a Slack-compatible incoming-webhook body, `{"text": "..."}` (Teams'
// and Mattermost's incoming webhooks take the same). Every value is written through
// slackText: event fields and reasons are claims from outside (a queue message, a NodePool
// annotation), so a `<!channel>` or a disguised link `<http://evil|click>` in one arrives as
// text, not as a mention or a link, and any value yields valid JSON.
const DefaultTemplate = `{"text": "{{with .Cluster}}[{{slackText .}}] {{end}}` +
	`{{if eq .Phase "received"}}Received {{slackText .Kind}}{{else if eq .Phase "shadow"}}Shadow, nothing done: would {{slackText .Action}} for {{slackText .Kind}}{{else}}Decided {{slackText .Action}}: {{slackText .Kind}}{{end}}` +
	` of {{slackText (join .Instances ", ")}}{{with .MoreInstances}} and {{.}} more{{end}}` +
	`{{with .Node}} (node {{slackText .}}{{with $.NodePool}}, nodepool {{slackText .}}{{end}}){{end}}` +
	`\n{{slackText .Summary}}` +
	`{{if not .Deadline.IsZero}}\nAWS acts at {{rfc3339 .Deadline}}{{end}}` +
	`{{if not .Until.IsZero}}\nDecided again by {{rfc3339 .Until}}{{end}}` +
	`{{with .Reason}}\nWhy: {{slackText .}}{{end}}` +
	`{{range .Warnings}}\nWarning: {{slackText .}}{{end}}` +
	`\nEvent {{slackText .EventID}}"}`

// funcs are the functions a template may call besides text/template's own:
//
//	json        the value as JSON (a string is quoted): {"notice": {{json .}}}
//	jsonEscape  the value as text, escaped to sit inside a JSON string: "{{jsonEscape .Reason}}"
//	slackText   as jsonEscape, with &, < and > first escaped as Slack asks of text that is not
//	            markup: "{{slackText .Reason}}" in a Slack (or Slack-compatible) "text"
//	join        strings.Join: {{join .Instances ", "}}
//	rfc3339     a time in UTC, RFC 3339; empty for the zero time
var funcs = template.FuncMap{
	"json": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"jsonEscape": jsonEscape,
	"slackText": func(v any) (string, error) {
		return jsonEscape(slackEscaper.Replace(fmt.Sprint(v)))
	},
	"join": strings.Join,
	"rfc3339": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	},
}

func jsonEscape(v any) (string, error) {
	b, err := json.Marshal(fmt.Sprint(v))
	if err != nil {
		return "", err
	}
	return string(b[1 : len(b)-1]), nil
}

// slackEscaper escapes the three characters Slack reads as markup: `<` opens a mention
// (<!channel>, <@U123>) or a link whose text hides its target (<http://evil|click>), and `&`
// an entity. One pass: the & of an &lt; it writes is not escaped again.
var slackEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// ParseTemplate parses a body template (empty: DefaultTemplate) and renders it once for a
// notice of each phase, so that a template naming a field Notice does not have (which
// text/template finds only when it runs) fails at start-up, not at the first event.
func ParseTemplate(text string) (*template.Template, error) {
	if strings.TrimSpace(text) == "" {
		text = DefaultTemplate
	}
	t, err := template.New("webhook").Funcs(funcs).Option("missingkey=error").Parse(text)
	if err != nil {
		return nil, err
	}
	for _, n := range sampleNotices() {
		if _, err := render(t, n); err != nil {
			return nil, fmt.Errorf("rendering a %s notice: %w", n.Phase, err)
		}
	}
	return t, nil
}

// sampleNotices are a notice of each phase with every field set.
func sampleNotices() []Notice {
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	ev := event.Event{
		ID: "sample", Kind: event.KindScheduledChange, Time: at, Instances: []string{"i-0123456789abcdef0"}, Deadline: at.Add(72 * time.Hour),
		Health: &event.Health{TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Status: event.HealthUpcoming, Scheduled: event.ScheduledInstanceRetirement, Start: at.Add(72 * time.Hour)},
	}
	d := policy.Decision{
		EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Node: "ip-10-0-0-1.ec2.internal", NodeClaim: "default-abcde", NodePool: "default",
		Action: policy.ActionDefer, Until: at.Add(24 * time.Hour), Hold: policy.HoldWindow, Deadline: ev.Deadline,
		Reason: "sample reason", Warnings: []string{"sample warning"},
	}
	return []Notice{Received(ev, "sample"), FromDecision(ev, d, "sample")}
}

// render renders n, failing once the body passes maxBodyBytes: a template that would render
// far more (a range over the instances) stops there instead of growing the body further.
func render(t *template.Template, n Notice) ([]byte, error) {
	var b cappedBuffer
	if err := t.Execute(&b, n); err != nil {
		return nil, err // a failed Write's error as it is: text/template does not wrap it
	}
	return b.Bytes(), nil
}

// cappedBuffer is a bytes.Buffer that refuses to grow past maxBodyBytes.
type cappedBuffer struct{ bytes.Buffer }

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > maxBodyBytes {
		return 0, fmt.Errorf("the body passes %d bytes, the most a notice may have", maxBodyBytes)
	}
	return b.Buffer.Write(p)
}

// ParseHeaders parses `k=v,k=v` into header names and values (a value may contain `=`, as a
// base64 token does, but not `,`). Errors name the header, never its value: values are
// usually credentials.
func ParseHeaders(s string) (map[string]string, error) {
	h := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return h, nil
	}
	for i, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("entry %d: want name=value", i+1)
		}
		h[k] = strings.TrimSpace(v)
	}
	if err := checkHeaders(h); err != nil {
		return nil, err
	}
	return h, nil
}

// checkHeaders rejects what net/http would refuse to send: a name that is not an RFC 9110
// token, a value with a control character.
func checkHeaders(h map[string]string) error {
	var errs []error
	for k, v := range h {
		if !isToken(k) {
			errs = append(errs, fmt.Errorf("header name %q is not a valid HTTP header name", k))
		}
		if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			errs = append(errs, fmt.Errorf("header %s: the value has a control character", k))
		}
	}
	return errors.Join(errs...)
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
		default:
			return false
		}
	}
	return true
}
