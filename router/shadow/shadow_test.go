package shadow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

var now = time.Date(2026, 11, 21, 14, 2, 0, 0, time.UTC)

func health(id, arn, code string, start time.Time) event.Event {
	body := fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[],"detail":{"eventArn":%q,"service":"EC2","eventTypeCode":%q,"eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"affectedEntities":[{"entityValue":"i-0a1b2c3d4e5f60718"}]}}`,
		id, arn, code, start.UTC().Format(time.RFC1123))
	ev, err := event.Parse([]byte(body))
	if err != nil {
		panic(err)
	}
	return ev
}

func TestRecorded(t *testing.T) {
	start := now.Add(19 * 24 * time.Hour)
	first := health("ev-1", "arn:aws:health:eu-west-1::event/EC2/A", "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", start)
	outs := []Outcome{OutcomeOf(first, policy.Decision{Action: policy.ActionDefer, Until: start.Add(-time.Hour)}, now)}
	tests := []struct {
		name string
		ev   event.Event
		want bool
	}{
		{"a redelivery", first, true},
		{"an update of the event (a new ID under the same ARN) is decided again", health("ev-2", "arn:aws:health:eu-west-1::event/EC2/A", "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED", start.Add(time.Hour)), false},
		{"another event", health("ev-3", "arn:aws:health:eu-west-1::event/EC2/B", "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Recorded(outs, tt.ev); got != tt.want {
				t.Errorf("Recorded = %t, want %t", got, tt.want)
			}
		})
	}
}

func TestAddKeepsNewest(t *testing.T) {
	var outs []Outcome
	for i := 0; i < Kept+5; i++ {
		outs = Add(outs, Outcome{EventID: fmt.Sprintf("ev-%d", i), Action: policy.ActionDrain})
	}
	if len(outs) != Kept || outs[0].EventID != "ev-5" || outs[Kept-1].EventID != fmt.Sprintf("ev-%d", Kept+4) {
		t.Fatalf("kept %d, first %s", len(outs), outs[0].EventID)
	}
	outs = Add(outs, Outcome{EventID: "ev-10", Action: policy.ActionDefer})
	if n := len(outs); n != Kept || outs[n-1].EventID != "ev-10" || outs[n-1].Action != policy.ActionDefer {
		t.Fatalf("replacing: %+v", outs[n-1])
	}
}

func TestReadRefusesOtherVersions(t *testing.T) {
	for _, v := range []string{`{"version":2,"outcomes":[]}`, `not json`} {
		if _, err := Read(record.Memory{Shadow: json.RawMessage(v)}); err == nil {
			t.Errorf("%s: read", v)
		}
	}
}

func newClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

func entry(nc, ev string, decided time.Time) Entry {
	return Entry{NodePool: "kafka", NodeClaim: nc, Instance: "i-" + nc, Kind: event.KindScheduledChange, EventID: ev, Start: now.Add(19 * 24 * time.Hour),
		Decided: decided, Would: policy.ActionDefer, WouldAt: time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC), Hold: policy.HoldWindow, Reason: "window"}
}

// TestLedgerTwoLeaders: two routers (an old leader still flushing beside the new one) each
// add entries; neither loses the other's, and Karpenter's deletions land on the right ones.
func TestLedgerTwoLeaders(t *testing.T) {
	kube := newClient(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), log)
	b := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), log)
	a.Add(entry("kafka-1", "ev-1", now))
	b.Add(entry("kafka-2", "ev-1", now.Add(time.Second)))
	a.KarpenterActed("kafka-2", now.Add(time.Minute)) // seen by the old leader only
	for _, l := range []*Ledger{a, b, a} {
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	b.Add(entry("kafka-1", "ev-1", now)) // the same outcome again: replaces, keeps Karpenter's time
	if err := b.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLedger(context.Background(), kube, "health-router", DefaultLedgerName)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("entries %+v", got)
	}
	for _, e := range got {
		acted := !e.KarpenterAt.IsZero()
		if acted != (e.NodeClaim == "kafka-2") {
			t.Errorf("%s: Karpenter acted = %t", e.NodeClaim, acted)
		}
	}
}

func TestLedgerBounded(t *testing.T) {
	kube := newClient(t)
	l := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for i := 0; i < MaxEntries+50; i++ {
		l.Add(entry(fmt.Sprintf("kafka-%d", i), "ev-1", now.Add(time.Duration(i)*time.Second)))
	}
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLedger(context.Background(), kube, "health-router", DefaultLedgerName)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxEntries || got[0].NodeClaim != "kafka-50" {
		t.Fatalf("%d entries, oldest %s", len(got), got[0].NodeClaim)
	}
	hr := &record.HealthRecord{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: record.LedgerRecordName(DefaultLedgerName)}, hr); err != nil {
		t.Fatal(err)
	}
	if n := len(hr.Status.Ledger); n > record.LedgerMaxBytes {
		t.Errorf("ledger of %d bytes", n)
	}
	if !hr.OfLedger() || hr.OfClaim() || len(hr.OwnerReferences) != 0 {
		t.Errorf("the ledger's record: ledger %t, a NodeClaim's %t, owners %v", hr.OfLedger(), hr.OfClaim(), hr.OwnerReferences)
	}
}

func TestWatcher(t *testing.T) {
	kube := newClient(t)
	l := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clocktesting.NewFakeClock(now), slog.New(slog.NewTextHandler(io.Discard, nil)))
	drains := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "d"}, []string{"nodepool"})
	w := NewWatcher(kube, l, drains)
	deleting := metav1.NewTime(now.Add(time.Minute))
	claim := func(name string, outcomes bool, del *metav1.Time) (*karpv1.NodeClaim, record.Memory) {
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"}, DeletionTimestamp: del}}
		var mem record.Memory
		if outcomes {
			mem.Shadow = Encode(nil)
		}
		return nc, mem
	}
	l.Add(entry("kafka-1", "ev-1", now))
	l.Add(entry("kafka-2", "ev-1", now))
	l.Add(entry("kafka-3", "ev-1", now))
	w.Observe(claim("kafka-1", true, &deleting))
	w.Observe(claim("kafka-1", true, &deleting)) // seen again: counted once
	w.Observe(claim("kafka-2", true, nil))       // not deleting
	w.Observe(claim("kafka-3", false, &deleting))
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, _ := ReadLedger(context.Background(), kube, "health-router", DefaultLedgerName)
	for _, e := range got {
		if acted := !e.KarpenterAt.IsZero(); acted != (e.NodeClaim == "kafka-1") {
			t.Errorf("%s: acted %t", e.NodeClaim, acted)
		}
	}
	if v := testutil.ToFloat64(drains.WithLabelValues("kafka")); v != 1 {
		t.Errorf("drains counted %v", v)
	}
}

// TestReport: the summary pairs what Karpenter did with what the router would have done.
func TestReport(t *testing.T) {
	var es []Entry
	for i := 1; i <= 3; i++ {
		e := entry(fmt.Sprintf("kafka-%d", i), "ev-1", now)
		e.KarpenterAt = now.Add(time.Duration(i) * time.Second)
		es = append(es, e)
	}
	web := Entry{NodePool: "web", NodeClaim: "web-1", Instance: "i-w", Kind: event.KindRebalance, EventID: "rb-1", Decided: now, Would: policy.ActionIgnore, WouldAt: now, Reason: "recorded only"}
	es = append(es, web)
	r := BuildReport(es, "")
	if len(r.Pools) != 2 || r.Pools[0].NodePool != "kafka" {
		t.Fatalf("%+v", r.Pools)
	}
	wantKafka := "Karpenter drained 3 nodes of kafka at 2026-11-21 14:02 UTC (Sat) for scheduled-change (AWS's start 19 days later); the router would have deferred them to 2026-11-28 02:00 UTC (Sat) (window)"
	if got := r.Pools[0].Summary; len(got) != 1 || got[0] != wantKafka {
		t.Errorf("kafka summary:\n%q\nwant\n%q", got, wantKafka)
	}
	wantWeb := "1 node of web for rebalance-recommendation: Karpenter drained none; the router would have ignored it"
	if got := r.Pools[1].Summary; len(got) != 1 || got[0] != wantWeb {
		t.Errorf("web summary:\n%q\nwant\n%q", got, wantWeb)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "drained 2026-11-21 14:02 UTC (Sat)") || !strings.Contains(buf.String(), "NodePool web") {
		t.Errorf("table:\n%s", buf.String())
	}
	buf.Reset()
	if err := BuildReport(es, "web").WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || len(back.Pools) != 1 || back.Pools[0].NodePool != "web" {
		t.Errorf("json %s (%v)", buf.String(), err)
	}
}

// TestNoLedger: a ledger that does not exist is not "no pool is in shadow" (issue 38, 13: in
// the wrong namespace `status --shadow` said so and exited 0): ReadLedger says ErrNoLedger, and
// only the router's own /shadow, which knows it runs, serves it as nothing recorded yet.
func TestNoLedger(t *testing.T) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).Build()
	if _, err := ReadLedger(context.Background(), kube, "elsewhere", DefaultLedgerName); !errors.Is(err, ErrNoLedger) || !strings.Contains(err.Error(), "elsewhere/"+DefaultLedgerName) {
		t.Errorf("ReadLedger of a missing ConfigMap: %v, want ErrNoLedger naming it", err)
	}
	rec := httptest.NewRecorder()
	Handler(kube, "health-router", DefaultLedgerName, HandlerOptions{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "no would-be outcomes recorded") {
		t.Errorf("/shadow with no ledger yet: %d %q", rec.Code, rec.Body.String())
	}
}

// countingReader counts the ledger's reads and can fail them or hold them.
type countingReader struct {
	client.Reader
	gets atomic.Int64
	err  error
	hold chan struct{}
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	if c.hold != nil {
		<-c.hold
	}
	if c.err != nil {
		return c.err
	}
	return c.Reader.Get(ctx, key, obj, opts...)
}

// TestHandlerBounds: /shadow has the calendar's protections (issue 38, 6): an API error is
// answered with a fixed text (the detail goes to the log), requests past MaxInFlight get 503,
// and the ledger is read at most once per ledgerTTL whatever the request rate.
func TestHandlerBounds(t *testing.T) {
	get := func(h http.Handler) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
		return rec
	}
	t.Run("an API error is not returned verbatim", func(t *testing.T) {
		var logged bytes.Buffer
		r := &countingReader{Reader: newClient(t), err: errors.New(`configmaps "health-router-shadow" is forbidden: User "system:serviceaccount:health-router:health-router"`)}
		rec := get(Handler(r, "health-router", DefaultLedgerName, HandlerOptions{Log: slog.New(slog.NewTextHandler(&logged, nil))}))
		if rec.Code != http.StatusServiceUnavailable || strings.TrimSpace(rec.Body.String()) != TextUnavailable {
			t.Errorf("answer %d %q, want 503 %q", rec.Code, rec.Body.String(), TextUnavailable)
		}
		if !strings.Contains(logged.String(), "forbidden") {
			t.Errorf("the detail is not in the log: %q", logged.String())
		}
	})
	t.Run("past MaxInFlight: 503", func(t *testing.T) {
		r := &countingReader{Reader: newClient(t), hold: make(chan struct{})}
		h := Handler(r, "health-router", DefaultLedgerName, HandlerOptions{MaxInFlight: 1})
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- get(h) }()
		for r.gets.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		if rec := get(h); rec.Code != http.StatusServiceUnavailable || strings.TrimSpace(rec.Body.String()) != TextBusy {
			t.Errorf("a second request while one is answered: %d %q", rec.Code, rec.Body.String())
		}
		close(r.hold)
		if rec := <-done; rec.Code != http.StatusOK {
			t.Errorf("the first request: %d %q", rec.Code, rec.Body.String())
		}
	})
	t.Run("one read per TTL", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(now)
		kube := newClient(t)
		l := NewLedger(record.NewStore(kube, kube), kube, "health-router", DefaultLedgerName, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l.Add(entry("kafka-1", "ev-1", now))
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := &countingReader{Reader: kube}
		h := Handler(r, "health-router", DefaultLedgerName, HandlerOptions{Clock: clk})
		for range 20 {
			if rec := get(h); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "kafka-1") {
				t.Fatalf("%d %q", rec.Code, rec.Body.String())
			}
		}
		clk.Step(ledgerTTL)
		get(h)
		if n := r.gets.Load(); n != 2 {
			t.Errorf("%d reads of the ledger for 21 requests over one TTL and a step past it, want 2", n)
		}
	})
}
