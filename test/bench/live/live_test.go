package main

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/options"
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

// The burst's figures: the nearest-rank percentile, and the busiest window of one resource
// (watches left out, verbs of one resource together).
func TestBurstFigures(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		p    int
		want time.Duration
	}{{50, 500 * time.Millisecond}, {99, 990 * time.Millisecond}, {100, time.Second}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%d: got %s, want %s", tc.p, got, tc.want)
		}
	}
	if got := percentile(d[:1], 99); got != time.Millisecond {
		t.Errorf("p99 of one: %s", got)
	}
	t0 := time.Date(2026, 11, 25, 7, 0, 0, 0, time.UTC)
	r := newTimedRequests()
	for i := 0; i < 10; i++ { // 10 deletes in 0.9 s, 5 patches at 0.95 s
		r.at["delete nodeclaims"] = append(r.at["delete nodeclaims"], t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	for i := 0; i < 5; i++ {
		r.at["patch nodeclaims"] = append(r.at["patch nodeclaims"], t0.Add(950*time.Millisecond+time.Duration(i)*time.Millisecond))
		r.at["watch events"] = append(r.at["watch events"], t0.Add(time.Duration(i)*time.Millisecond))
	}
	r.at["create events"] = []time.Time{t0, t0.Add(time.Second), t0.Add(2 * time.Second)}
	if n, res := r.peak(time.Second); n != 15 || res != "nodeclaims" {
		t.Errorf("peak: %d of %s, want 15 of nodeclaims", n, res)
	}
}

// TestBurstSmall runs the burst bench small in make test, so that it cannot break unnoticed
// (issue 36: on dd387c1 it dead-lettered all its messages as foreign, and half its Spot
// warnings were for on-demand nodes): 20 Spot warnings and 20 rebalance recommendations over
// a second, in both signalling modes, through the router in process on envtest and the
// in-test SQS. It fails on anything dropped (a warning not recorded, a recommendation not
// ignored, a message left or dead-lettered, a forward missing); the latency target is make
// bench's, not judged here.
func TestBurstSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts moto_server and envtest")
	}
	b := &bench{title: "burst bench", f: flags{timeout: 5 * time.Minute, qps: options.DefaultKubeClientQPS, burst: options.DefaultKubeClientBurst}}
	bf := burstFlags{warnings: 20, over: time.Second, modes: "delete-nodeclaim,forward", senders: 2, sendBatch: 10, sqs: sqsInTest, noTarget: true}
	if err := b.runBurst(bf); err != nil {
		t.Fatal(err)
	}
	for _, f := range b.failures {
		t.Error(f)
	}
	if len(b.rows) == 0 {
		t.Error("the burst tabled nothing")
	}
}

// TestLiveSmall is a small live bench, so that it cannot break unnoticed: 50 instances named
// by one Health event, one round of the bare loop, the same with the router's watches and the
// router in process, on envtest and moto, and the cache weighed for 1,000 realistic nodes. It
// fails on anything the bench fails on (an outcome not recorded, a Spot warning not signalled,
// a paced pool over its limit) and on a table without the figures issue 36 budgets (API
// requests per instance against the bare loop's, cache heap per node); the budgets themselves
// are make bench's, at 4,000 and 100,000 nodes, not judged here.
func TestLiveSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts moto_server and envtest")
	}
	b := &bench{title: "live bench", f: flags{nodes: 50, perEvent: 4000, qps: options.DefaultKubeClientQPS, burst: options.DefaultKubeClientBurst,
		parallel: 16, pacedLimit: "2%", karpenterDelay: 100 * time.Millisecond, rounds: 1, spotNodes: 2, memoryNodes: 1000,
		watchReference: true, timeout: 10 * time.Minute}}
	if err := b.run(); err != nil {
		t.Fatal(err)
	}
	for _, f := range b.failures {
		t.Error(f)
	}
	for _, want := range []string{"API requests per instance / the bare loop's", "cache heap per node"} {
		if !slices.ContainsFunc(b.rows, func(r row) bool { return strings.Contains(r.measure, want) }) {
			t.Errorf("the live bench tabled no %q", want)
		}
	}
}
