package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
)

// testdataEvents parses the event package's sample bodies, keeping the kinds a policy decides
// on; it fails unless every such kind is there.
func testdataEvents(t *testing.T) []event.Event {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "event", "testdata", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no event bodies in ../event/testdata: %v", err)
	}
	var evs []event.Event
	kinds := map[event.Kind]bool{}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := event.Parse(body)
		if err == nil && ev.Kind == event.KindCapacityBlockExpiration {
			ev.Instances = []string{"i-0a1b2c3d4e5f60901"} // as the pipeline finds the block's NodeClaims
		}
		if err != nil || len(ev.Instances) == 0 {
			continue // rejected on purpose (RDS, ASG lifecycle...) or names no instance
		}
		evs = append(evs, ev)
		kinds[ev.Kind] = true
	}
	for _, k := range event.InstanceKinds {
		if !kinds[k] {
			t.Fatalf("no sample event of kind %s in ../event/testdata", k)
		}
	}
	return evs
}

// Reasons and warnings that break naive string interpolation into JSON.
var hostile = []string{
	`plain reason`,
	`a "quoted" reason`,
	"two\nlines\r\nand a\ttab",
	`back\slash \" and \n (literal)`,
	"control \x01\x1f chars, <html> & ampersand, \u2028 line separator",
	`}", "injected": "yes`,
	"",
}

// TestDefaultTemplateValidJSON renders the default template for every kind, both phases and
// hostile reasons: the body is JSON of the form {"text": ...} and the text carries the reason,
// the instance and the summary unchanged but for Slack's escapes of &, < and >.
func TestDefaultTemplateValidJSON(t *testing.T) {
	tmpl, err := ParseTemplate("")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for _, ev := range testdataEvents(t) {
		for _, reason := range hostile {
			d := policy.Decision{
				EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Node: "ip-10-0-0-1.ec2.internal", NodePool: `pool "a"`,
				Action: policy.ActionDefer, Until: now.Add(time.Hour), Hold: policy.HoldWindow, Reason: reason, Warnings: []string{reason, "second"},
			}
			for _, n := range []Notice{Received(ev, `cluster "x"`), FromDecision(ev, d, "c\n1")} {
				body, err := render(tmpl, n)
				if err != nil {
					t.Fatalf("%s %s: %v", ev.Kind, n.Phase, err)
				}
				var got map[string]string
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatalf("%s %s, reason %q: not JSON: %v\n%s", ev.Kind, n.Phase, reason, err, body)
				}
				text, ok := got["text"]
				if !ok || len(got) != 1 {
					t.Fatalf("%s %s: %s, want one key, text", ev.Kind, n.Phase, body)
				}
				for _, want := range []string{n.Summary, ev.Instances[0], n.Cluster, string(ev.Kind)} {
					if !strings.Contains(text, slackEscaped(want)) {
						t.Errorf("%s %s: text %q lacks %q", ev.Kind, n.Phase, text, want)
					}
				}
				if n.Phase == PhaseDecided {
					for _, want := range []string{reason, "Decided defer: ", `pool "a"`, "2026-11-21T13:00:00Z"} {
						if !strings.Contains(text, slackEscaped(want)) {
							t.Errorf("%s decided: text %q lacks %q", ev.Kind, text, want)
						}
					}
				}
			}
		}
	}
}

// slackEscaped is s as Slack asks text to be written, spelled out independently of the code.
func slackEscaped(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestSummaryEveryKind: every kind says what happened in its own words, not its kind name.
func TestSummaryEveryKind(t *testing.T) {
	want := map[event.Kind]string{
		event.KindScheduledChange:         "_", // AWS Health AWS_EC2_..., or EC2 scheduled event EC2_INSTANCE_STATUS_...
		event.KindSpotInterruption:        "Spot interruption",
		event.KindRebalance:               "rebalance recommendation",
		event.KindStateChange:             "instance state ",
		event.KindCapacityReservation:     "capacity reservation interruption: instance action ",
		event.KindInstanceStatus:          "instance status ",
		event.KindCapacityBlockExpiration: "Capacity Block cr-",
	}
	for _, ev := range testdataEvents(t) {
		got := Summary(ev)
		if ev.Kind == event.KindScheduledChange {
			from := "AWS Health AWS_EC2_"
			if ev.Source == event.SourceHealthRouter {
				from = "EC2 scheduled event EC2_INSTANCE_STATUS_"
			}
			if !strings.HasPrefix(got, from) {
				t.Errorf("Summary(%s) = %q, want it to start with %q", ev.ID, got, from)
			}
		}
		if !strings.Contains(got, want[ev.Kind]) || strings.Contains(got, "unknown") {
			t.Errorf("Summary(%s %s) = %q, want it to contain %q and no unknown field", ev.Kind, ev.ID, got, want[ev.Kind])
		}
	}
}

func TestFromDecision(t *testing.T) {
	ev := event.Event{ID: "e1", Kind: event.KindSpotInterruption, Instances: []string{"i-1", "i-2"}, Deadline: time.Unix(100, 0), Time: time.Unix(0, 0)}
	d := policy.Decision{EventID: "e1", Kind: ev.Kind, InstanceID: "i-2", Node: "n2", NodePool: "p", Action: policy.ActionDrain, Reason: "r", Warnings: []string{"w"}}
	n := FromDecision(ev, d, "c")
	if n.Phase != PhaseDecided || len(n.Instances) != 1 || n.Instances[0] != "i-2" || n.Node != "n2" || n.Action != policy.ActionDrain || !n.Deadline.Equal(ev.Deadline) || n.Cluster != "c" {
		t.Errorf("FromDecision = %+v", n)
	}
	d.Warnings[0] = "changed"
	if n.Warnings[0] != "w" {
		t.Error("the notice shares the decision's Warnings")
	}
	r := Received(ev, "c")
	if r.Phase != PhaseReceived || len(r.Instances) != 2 || r.Action != "" {
		t.Errorf("Received = %+v", r)
	}
	if r.key() == n.key() {
		t.Error("a receipt and a decision share a deduplication key")
	}
}

// TestNewRefuses: a bad URL, template or header fails New with a message naming the flag,
// and the URL (which may hold a token) is not in it.
func TestNewRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts Options
		want string
	}{
		{"no URL", Options{}, "--webhook-url"},
		{"not http", Options{URL: "ftp://hooks.example.com/T0KEN"}, "--webhook-url"},
		{"no host", Options{URL: "https:///T0KEN"}, "--webhook-url"},
		{"unparsable template", Options{URL: "https://h/x", Template: `{"text": "{{.Reason"}`}, "--webhook-template"},
		{"unknown function", Options{URL: "https://h/x", Template: `{{shout .Reason}}`}, "--webhook-template"},
		{"unknown field", Options{URL: "https://h/x", Template: `{"text": "{{.Instance}}"}`}, "--webhook-template"},
		{"bad header name", Options{URL: "https://h/x", Headers: map[string]string{"Bad Name": "v"}}, "--webhook-headers"},
		{"header value with a newline", Options{URL: "https://h/x", Headers: map[string]string{"Authorization": "Bearer a\nb"}}, "--webhook-headers"},
	} {
		_, err := New(tt.opts, nil, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: New = %v, want an error naming %s", tt.name, err, tt.want)
			continue
		}
		if strings.Contains(err.Error(), "T0KEN") {
			t.Errorf("%s: the error %q shows the URL", tt.name, err)
		}
	}
	if _, err := New(Options{URL: "https://h/x", Template: `{"notice": {{json .}}}`}, nil, clocktesting.NewFakeClock(time.Now()), slog.New(slog.DiscardHandler), prometheus.NewRegistry()); err != nil {
		t.Errorf("a valid custom template: %v", err)
	}
}

func TestParseHeaders(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"", map[string]string{}, ""},
		{"Authorization=Bearer abc==", map[string]string{"Authorization": "Bearer abc=="}, ""},
		{" X-A = 1 , X-B=two words", map[string]string{"X-A": "1", "X-B": "two words"}, ""},
		{"X-Empty=", map[string]string{"X-Empty": ""}, ""},
		{"Authorization", nil, "entry 1: want name=value"},
		{"X-A=1,=secret", nil, "entry 2: want name=value"},
		{"Bad:Name=secret", nil, `"Bad:Name" is not a valid`},
	} {
		got, err := ParseHeaders(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseHeaders(%q) = %v, %v; want an error %q", tt.in, got, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("ParseHeaders(%q): the error %q shows a value", tt.in, err)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("ParseHeaders(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			continue
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("ParseHeaders(%q)[%s] = %q, want %q", tt.in, k, got[k], v)
			}
		}
	}
}

func TestKeySetBounded(t *testing.T) {
	s := newKeySet(3)
	for _, k := range []string{"a", "b", "c"} {
		s.add(k)
	}
	s.contains("a") // a is now the most recent: b is the oldest
	s.add("d")
	if s.contains("b") || !s.contains("a") || !s.contains("c") || !s.contains("d") || len(s.index) != 3 {
		t.Errorf("after a, b, c, use of a, d: index %v, want a, c, d", s.index)
	}
}

// TestDefaultTemplateEscapesSlackMarkup: event and decision fields are text in the default
// (Slack) body, never markup: a mention (<!channel>) or a disguised link (<http://evil|click>)
// from an event or a reason arrives escaped, as Slack asks (&amp; &lt; &gt;).
func TestDefaultTemplateEscapesSlackMarkup(t *testing.T) {
	tmpl, err := ParseTemplate("")
	if err != nil {
		t.Fatal(err)
	}
	ev := event.Event{ID: "<!channel>", Kind: event.KindScheduledChange, Instances: []string{"<@U0123>"}, Time: time.Unix(0, 0),
		Health: &event.Health{TypeCode: "<!here>", Status: "<http://evil.example|upcoming>"}}
	d := policy.Decision{EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Node: "<!subteam^S0123>", NodePool: "a&b",
		Action: policy.ActionDefer, Until: time.Unix(3600, 0), Hold: policy.HoldWindow,
		Reason: "see <http://evil.example|the runbook> & act", Warnings: []string{"<!everyone>"}}
	for _, n := range []Notice{Received(ev, "<#C0123>"), FromDecision(ev, d, "<#C0123>")} {
		body, err := render(tmpl, n)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%s: not JSON: %v\n%s", n.Phase, err, body)
		}
		text := got["text"]
		if strings.ContainsAny(text, "<>") {
			t.Errorf("%s: text %q has Slack markup", n.Phase, text)
		}
		want := []string{"&lt;!channel&gt;", "&lt;@U0123&gt;", "&lt;#C0123&gt;", "&lt;!here&gt;", "&lt;http://evil.example|upcoming&gt;"}
		if n.Phase == PhaseDecided {
			want = append(want, "&lt;!subteam^S0123&gt;", "a&amp;b", "see &lt;http://evil.example|the runbook&gt; &amp; act", "&lt;!everyone&gt;")
		}
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: text %q lacks %q", n.Phase, text, w)
			}
		}
	}
}

// TestCaps: a notice of hostile size (an ID and a reason of a megabyte each, 10,000
// instances, 1,000 warnings) is clipped when notified: each field to maxFieldBytes on a
// rune boundary, the instances to maxInstances (the rest counted), the warnings to
// maxWarnings (the rest said); its default body is valid JSON within maxBodyBytes. A custom
// template that renders more than maxBodyBytes fails the notice, counted, and sends nothing.
func TestCaps(t *testing.T) {
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	huge := strings.Repeat("é", 1<<19) // a megabyte, two bytes a rune
	ev := event.Event{ID: huge, Kind: event.KindScheduledChange, Time: at, Health: &event.Health{TypeCode: huge, Status: huge}}
	for i := range 10_000 {
		ev.Instances = append(ev.Instances, fmt.Sprintf("i-%017x", i))
	}
	d := policy.Decision{EventID: ev.ID, Kind: ev.Kind, InstanceID: ev.Instances[0], Node: huge, NodePool: huge,
		Action: policy.ActionDefer, Until: at, Hold: policy.HoldWindow, Reason: huge}
	for range 1000 {
		d.Warnings = append(d.Warnings, huge[:2<<10])
	}

	n := idle(t)
	n.Notify(Received(ev, huge))
	n.Notify(FromDecision(ev, d, huge))
	if len(n.queue) != 2 {
		t.Fatalf("queued %d notices, want 2", len(n.queue))
	}
	for range 2 {
		nt := <-n.queue
		fields := append([]string{nt.Cluster, nt.EventID, nt.Summary, nt.Node, nt.NodePool, nt.Reason}, nt.Instances...)
		for _, f := range append(fields, nt.Warnings...) {
			if len(f) > maxFieldBytes || !utf8.ValidString(f) {
				t.Errorf("%s: a field of %d bytes (valid UTF-8: %t), want at most %d", nt.Phase, len(f), utf8.ValidString(f), maxFieldBytes)
				break
			}
		}
		if nt.Phase == PhaseReceived && (len(nt.Instances) != maxInstances || nt.MoreInstances != 10_000-maxInstances) {
			t.Errorf("received: %d instances and %d more, want %d and %d", len(nt.Instances), nt.MoreInstances, maxInstances, 10_000-maxInstances)
		}
		if nt.Phase == PhaseDecided && (len(nt.Warnings) != maxWarnings+1 || !strings.Contains(nt.Warnings[maxWarnings], "990 more warnings")) {
			t.Errorf("decided: %d warnings, want %d and a last one saying 990 more", len(nt.Warnings), maxWarnings+1)
		}
		body, err := n.Body(nt)
		if err != nil {
			t.Fatalf("%s: %v", nt.Phase, err)
		}
		var got map[string]string
		if err := json.Unmarshal(body, &got); err != nil || len(body) > maxBodyBytes {
			t.Errorf("%s: a body of %d bytes (JSON: %t), want valid JSON of at most %d", nt.Phase, len(body), json.Valid(body), maxBodyBytes)
		}
		if nt.Phase == PhaseReceived && !strings.Contains(got["text"], fmt.Sprintf(" and %d more", 10_000-maxInstances)) {
			t.Errorf("received: the text does not count the instances left out: %.300q", got["text"])
		}
	}

	// A template that renders the whole notice once per instance: 300 instances, over the cap.
	ev = event.Event{ID: "e1", Kind: event.KindSpotInterruption, Time: at, Instances: ev.Instances[:300]}
	var posted atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { posted.Add(1) }))
	t.Cleanup(srv.Close)
	reg := prometheus.NewRegistry()
	big, err := New(Options{URL: srv.URL, Template: `[{{range .Instances}}{{json $}},{{end}}{}]`}, nil,
		clocktesting.NewFakeClock(at), slog.New(slog.DiscardHandler), reg)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := big.Body(Received(ev, "")); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("a body of %d bytes rendered with error %v, want an error naming the cap", len(body), err)
	}
	big.deliver(context.Background(), Received(ev, ""))
	if got := testutil.ToFloat64(big.failures.WithLabelValues(ReasonTemplate)); got != 1 || posted.Load() != 0 {
		t.Errorf("failures{reason=template} = %g and %d posts after a body over the cap, want 1 and none", got, posted.Load())
	}
}
