package main

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/test/bench/realistic"
)

func TestRequestKey(t *testing.T) {
	for _, tc := range []struct {
		method, path, query, want string
	}{
		{"GET", "/apis/karpenter.sh/v1/nodeclaims/default-000001", "", "get nodeclaims"},
		{"GET", "/apis/karpenter.sh/v1/nodeclaims", "labelSelector=x", "list nodeclaims"},
		{"GET", "/api/v1/nodes", "watch=true&resourceVersion=5", "watch nodes"},
		{"PATCH", "/apis/karpenter.sh/v1/nodeclaims/default-000001", "", "patch nodeclaims"},
		{"PUT", "/apis/karpenter.sh/v1/nodeclaims/default-000001/status", "", "update nodeclaims/status"},
		{"DELETE", "/apis/karpenter.sh/v1/nodeclaims/default-000001", "", "delete nodeclaims"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/default/events", "", "create events"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/health-router", "", "update leases"},
		{"GET", "/api/v1/namespaces/default", "", "get namespaces"},
	} {
		r := &http.Request{Method: tc.method, URL: &url.URL{Path: tc.path, RawQuery: tc.query}}
		if got := verb(r) + " " + resourceOf(tc.path); got != tc.want {
			t.Errorf("%s %s?%s: got %q, want %q", tc.method, tc.path, tc.query, got, tc.want)
		}
	}
}

// The bulk event is split as EventBridge must: no body over 256 KiB, no more IDs than asked,
// every instance named once, and each body an event the router parses.
func TestHealthEventsSplit(t *testing.T) {
	now := time.Date(2026, 11, 22, 5, 0, 0, 0, time.UTC)
	var ids []string
	for i := 0; i < 9001; i++ {
		ids = append(ids, realistic.InstanceID(i))
	}
	for _, per := range []int{4000, 1000, 10000} {
		bodies, eventIDs := healthEvents(ids, per, now, 1, 4)
		if len(bodies) != len(eventIDs) {
			t.Fatalf("per %d: %d bodies, %d IDs", per, len(bodies), len(eventIDs))
		}
		seen := map[string]bool{}
		for i, b := range bodies {
			if len(b) > maxEventBytes {
				t.Errorf("per %d: body %d is %d bytes, over 256 KiB", per, i, len(b))
			}
			ev, err := event.Parse([]byte(b))
			if err != nil {
				t.Fatalf("per %d: body %d does not parse: %v", per, i, err)
			}
			if ev.ID != eventIDs[i] || len(ev.Instances) > per {
				t.Errorf("per %d: body %d: ID %s (want %s), %d instances", per, i, ev.ID, eventIDs[i], len(ev.Instances))
			}
			for _, id := range ev.Instances {
				if seen[id] {
					t.Errorf("per %d: %s named twice", per, id)
				}
				seen[id] = true
			}
		}
		if len(seen) != len(ids) {
			t.Errorf("per %d: %d instances named, want %d", per, len(seen), len(ids))
		}
	}
}

func TestPacedLimit(t *testing.T) {
	for _, tc := range []struct {
		v     string
		nodes int
		want  int
	}{{"20", 800, 20}, {"2%", 800, 16}, {"2%", 801, 17}, {"2%", 10, 1}, {"5", 3, 5}} {
		if got := pacedLimitFor(tc.v, tc.nodes); got != tc.want {
			t.Errorf("%s of %d: got %d, want %d", tc.v, tc.nodes, got, tc.want)
		}
	}
}
