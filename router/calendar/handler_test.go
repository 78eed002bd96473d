package calendar

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	ics "github.com/arran4/golang-ical"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
)

// TestHandler serves the calendar of a cluster whose records the router's own types wrote,
// over HTTP.
func TestHandler(t *testing.T) {
	scheme, err := cluster.NewScheme()
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
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "kafka", Annotations: map[string]string{
			policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		}}},
		&karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "kafka-b", Labels: map[string]string{karpv1.NodePoolLabelKey: "kafka"},
				Annotations: map[string]string{cluster.AnnotationDeferred: string(records)}},
			Status: karpv1.NodeClaimStatus{NodeName: "ip-10-0-1-3"},
		},
	).Build()
	srv := httptest.NewServer(Handler(kube, clocktesting.NewFakeClock(now)))
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
