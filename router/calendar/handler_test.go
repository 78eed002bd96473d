package calendar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	ics "github.com/arran4/golang-ical"

	hrcluster "github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/record/recordtest"
)

// cluster is a fake API server's client holding the pool kafka, with a Saturday window, and
// its NodeClaim kafka-b on node ip-10-0-1-3, whose drain is deferred to the window.
func cluster(t *testing.T) client.Client {
	t.Helper()
	scheme, err := hrcluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	records, err := json.Marshal([]record.Record{
		{EventID: "ev-window", Key: "arn:aws:health:eu-west-1::event/EC2/X/ev-window", Kind: event.KindScheduledChange,
			Until: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), Reason: "waiting for the maintenance window", State: record.StateDeferred, Hold: policy.HoldWindow},
		{EventID: "ev-old", Kind: event.KindScheduledChange, Until: now.Add(-time.Hour), State: record.StateSuperseded},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: map[string]string{
			policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		}}},
		&karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "kafka-b", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"},
				Annotations: map[string]string{record.Annotation: string(records)}},
			Status: karpv1.NodeClaimStatus{NodeName: "ip-10-0-1-3"},
		},
	).Build()
	recordtest.FromAnnotations(t, c)
	return c
}

// serve answers one request of the handler.
func serve(t *testing.T, h http.Handler, method, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	resp := rec.Result()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestHandler serves the calendar of a cluster whose records the router's own types wrote,
// over HTTP.
func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler(cluster(t), clocktesting.NewFakeClock(now), HandlerOptions{}))
	t.Cleanup(srv.Close)

	get := func(t *testing.T, method, path string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}

	t.Run("the calendar", func(t *testing.T) {
		resp, body := get(t, http.MethodGet, Path)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/calendar") {
			t.Fatalf("%s, Content-Type %q:\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
		}
		cal := parse(t, []byte(body))
		var got []string
		for _, e := range cal.Events() {
			got = append(got, prop(e, ics.ComponentPropertyDtStart)+" "+prop(e, ics.ComponentPropertySummary))
		}
		// The superseded record is history, not a plan.
		want := []string{
			"20261128T020000Z kafka: maintenance window",
			"20261128T020000Z kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)",
			"20261205T020000Z kafka: maintenance window",
		}
		if strings.Join(slices.Sorted(slices.Values(got)), "\n") != strings.Join(want, "\n") {
			t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
	t.Run("one pool", func(t *testing.T) {
		if resp, body := get(t, http.MethodGet, Path+"?nodepool=kafka"); resp.StatusCode != http.StatusOK || len(parse(t, []byte(body)).Events()) != 3 {
			t.Errorf("%s:\n%s", resp.Status, body)
		}
	})
	t.Run("a pool that does not exist", func(t *testing.T) {
		if resp, body := get(t, http.MethodGet, Path+"?nodepool=nope"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s, want 404:\n%s", resp.Status, body)
		}
	})
	t.Run("HEAD", func(t *testing.T) {
		if resp, _ := get(t, http.MethodHead, Path); resp.StatusCode != http.StatusOK || resp.ContentLength <= 0 {
			t.Errorf("%s, Content-Length %d", resp.Status, resp.ContentLength)
		}
	})
	t.Run("POST", func(t *testing.T) {
		if resp, _ := get(t, http.MethodPost, Path); resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s, want 405", resp.Status)
		}
	})
}

// TestHandlerBounds: an answer carries at most MaxEvents events (the soonest, the calendar
// saying how many it left out) and MaxBytes bytes (a larger calendar is refused whole).
func TestHandlerBounds(t *testing.T) {
	for _, tt := range []struct {
		name      string
		opts      HandlerOptions
		code      int
		events    []string // DTSTART SUMMARY, soonest first (a tie in UID order); nil with a refusal
		desc      string   // in X-WR-CALDESC
		body      string   // the whole body of a refusal
		forbidden string   // never in the body
	}{
		{name: "the defaults carry all three", code: http.StatusOK, events: []string{
			"20261128T020000Z kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)",
			"20261128T020000Z kafka: maintenance window",
			"20261205T020000Z kafka: maintenance window",
		}, desc: "maintenance windows"},
		{name: "two events: the latest left out", opts: HandlerOptions{MaxEvents: 2}, code: http.StatusOK, events: []string{
			"20261128T020000Z kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)",
			"20261128T020000Z kafka: maintenance window",
		}, desc: "the soonest 2 shown; 1 later ones left out"},
		{name: "one event", opts: HandlerOptions{MaxEvents: 1}, code: http.StatusOK, events: []string{
			"20261128T020000Z kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)",
		}, desc: "the soonest 1 shown; 2 later ones left out"},
		{name: "over the byte bound: refused whole", opts: HandlerOptions{MaxBytes: 1024}, code: http.StatusInternalServerError,
			body: TextTooLarge + "\n", forbidden: "ip-10-0-1-3"},
		{name: "exactly at the byte bound of the default answer", opts: HandlerOptions{MaxBytes: defaultAnswerSize(t)}, code: http.StatusOK, events: []string{
			"20261128T020000Z kafka: scheduled-change drain of node ip-10-0-1-3 (hold: window)",
			"20261128T020000Z kafka: maintenance window",
			"20261205T020000Z kafka: maintenance window",
		}, desc: "maintenance windows"},
		{name: "a byte short of it", opts: HandlerOptions{MaxBytes: defaultAnswerSize(t) - 1}, code: http.StatusInternalServerError,
			body: TextTooLarge + "\n", forbidden: "ip-10-0-1-3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := serve(t, Handler(cluster(t), clocktesting.NewFakeClock(now), tt.opts), http.MethodGet, Path)
			if resp.StatusCode != tt.code {
				t.Fatalf("%s, want %d:\n%s", resp.Status, tt.code, body)
			}
			if tt.forbidden != "" && strings.Contains(body, tt.forbidden) {
				t.Errorf("the refusal names %q:\n%s", tt.forbidden, body)
			}
			if tt.events == nil {
				if body != tt.body {
					t.Errorf("body %q, want %q", body, tt.body)
				}
				return
			}
			cal := parse(t, []byte(body))
			var got []string
			for _, e := range cal.Events() {
				got = append(got, prop(e, ics.ComponentPropertyDtStart)+" "+prop(e, ics.ComponentPropertySummary))
			}
			if strings.Join(got, "\n") != strings.Join(tt.events, "\n") {
				t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.events, "\n"))
			}
			var desc string
			for _, p := range cal.CalendarProperties {
				if p.IANAToken == string(ics.PropertyXWRCalDesc) {
					desc = p.Value
				}
			}
			if !strings.Contains(desc, tt.desc) {
				t.Errorf("X-WR-CALDESC %q, want it to contain %q", desc, tt.desc)
			}
		})
	}
}

// defaultAnswerSize is the size of the fixture's whole calendar.
func defaultAnswerSize(t *testing.T) int {
	t.Helper()
	_, body := serve(t, Handler(cluster(t), clocktesting.NewFakeClock(now), HandlerOptions{}), http.MethodGet, Path)
	return len(body)
}

// failingReader answers every read with err.
type failingReader struct{ err error }

func (r failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return r.err
}

func (r failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return r.err
}

// TestHandlerErrorsAreGeneric: an answer that is not a calendar says what kind of failure it
// is and nothing more; the detail (an API server's address, a name given in the query) goes to
// the log only.
func TestHandlerErrorsAreGeneric(t *testing.T) {
	secret := errors.New(`listing NodeClaims: Get "https://10.100.0.1:443/apis/karpenter.sh/v1/nodeclaims": dial tcp 10.100.0.1:443: connect: connection refused`)
	for _, tt := range []struct {
		name    string
		reader  client.Reader
		target  string
		code    int
		body    string
		logged  string // in the log; "" for nothing logged at error level
		unknown string // never in the body
	}{
		{name: "the API server unreachable", reader: failingReader{secret}, target: Path, code: http.StatusInternalServerError,
			body: TextUnavailable + "\n", logged: "10.100.0.1:443", unknown: "10.100"},
		{name: "a pool that does not exist", reader: cluster(t), target: Path + "?nodepool=%3Cscript%3Ealert(1)%3C%2Fscript%3E", code: http.StatusNotFound,
			body: TextNotFound + "\n", unknown: "script"},
		{name: "the cache not started", reader: failingReader{errors.New("the cache is not started, can not read objects")}, target: Path + "?nodepool=kafka",
			code: http.StatusInternalServerError, body: TextUnavailable + "\n", logged: "cache is not started", unknown: "cache"},
		{name: "another path", reader: cluster(t), target: "/metrics", code: http.StatusNotFound, body: "404 page not found\n"},
		{name: "another method", reader: cluster(t), target: Path, code: http.StatusMethodNotAllowed, body: "Method Not Allowed\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			h := Handler(tt.reader, clocktesting.NewFakeClock(now), HandlerOptions{Log: slog.New(slog.NewTextHandler(&logs, nil))})
			method := http.MethodGet
			if tt.code == http.StatusMethodNotAllowed {
				method = http.MethodPost
			}
			resp, body := serve(t, h, method, tt.target)
			if resp.StatusCode != tt.code || body != tt.body {
				t.Errorf("%s %q, want %d %q", resp.Status, body, tt.code, tt.body)
			}
			if tt.unknown != "" && strings.Contains(body, tt.unknown) {
				t.Errorf("the answer names %q: %q", tt.unknown, body)
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q, want text/plain", ct)
			}
			switch {
			case tt.logged != "" && !strings.Contains(logs.String(), tt.logged):
				t.Errorf("the log does not hold the detail %q:\n%s", tt.logged, logs.String())
			case tt.logged == "" && strings.Contains(logs.String(), "level=ERROR"):
				t.Errorf("logged an error:\n%s", logs.String())
			}
		})
	}
}

// blockingReader holds every read until release is closed, counting them.
type blockingReader struct {
	client.Reader
	reads   *atomic.Int32
	release chan struct{}
}

func (r blockingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	r.reads.Add(1)
	<-r.release
	return r.Reader.List(ctx, list, opts...)
}

// TestHandlerInFlight: past MaxInFlight requests at once, a request is turned away at once
// (503, Retry-After), without reading the cluster; a slot freed serves again.
func TestHandlerInFlight(t *testing.T) {
	r := blockingReader{Reader: cluster(t), reads: &atomic.Int32{}, release: make(chan struct{})}
	h := Handler(r, clocktesting.NewFakeClock(now), HandlerOptions{MaxInFlight: 1})
	first := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
		first <- rec.Code
	}()
	for r.reads.Load() == 0 { // the first request holds the one slot, in its read
		time.Sleep(time.Millisecond)
	}
	resp, body := serve(t, h, http.MethodGet, Path)
	if resp.StatusCode != http.StatusServiceUnavailable || body != TextBusy+"\n" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a second request at once: %s %q, Retry-After %q; want 503 %q with Retry-After", resp.Status, body, resp.Header.Get("Retry-After"), TextBusy)
	}
	if n := r.reads.Load(); n != 1 {
		t.Errorf("%d reads begun, want the first request's one: the turned-away request read the cluster", n)
	}
	close(r.release)
	if code := <-first; code != http.StatusOK {
		t.Errorf("the first request: %d, want 200", code)
	}
	if resp, _ := serve(t, h, http.MethodGet, Path); resp.StatusCode != http.StatusOK {
		t.Errorf("after the slot was freed: %s, want 200", resp.Status)
	}
}
