package eventwindow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/inplace"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/harness"
)

var t0 = time.Date(2026, 11, 18, 12, 0, 0, 0, time.UTC)

// fixture is one cluster's manager against the shared EC2 stand-in.
type fixture struct {
	m    *Manager
	kube client.Client
	rec  *events.FakeRecorder
	clk  *clocktesting.FakeClock
	reg  *prometheus.Registry
}

func newFixture(t *testing.T, api *ec2.Client, clusterName string, objs ...client.Object) *fixture {
	t.Helper()
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{kube: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build(), rec: events.NewFakeRecorder(100),
		clk: clocktesting.NewFakeClock(t0), reg: prometheus.NewRegistry()}
	f.m = New(f.kube, api, f.rec, f.clk, slog.New(slog.NewTextHandler(io.Discard, nil)), f.reg, clusterName)
	return f
}

func (f *fixture) pass(t *testing.T) {
	t.Helper()
	if err := f.m.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// events drains the Events posted so far.
func (f *fixture) events() []string {
	var out []string
	for {
		select {
		case e := <-f.rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (f *fixture) count(result string) float64 {
	return testutil.ToFloat64(f.m.results.WithLabelValues(result))
}

func pool(name string, ann map[string]string) *karpv1.NodePool {
	return &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
}

func asks(schedule, duration string) map[string]string {
	return map[string]string{policy.AnnotationEventWindow: "true", policy.AnnotationWindowSchedule: schedule, policy.AnnotationWindowDuration: duration}
}

func claim(name, pool, instance string) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{karpv1.NodePoolLabelKey: pool}},
		Status: karpv1.NodeClaimStatus{ProviderID: "aws:///eu-west-1a/" + instance}}
}

// byPool returns the stand-in's windows tagged with clusterName, by pool.
func byPool(srv *harness.EC2EventWindows, clusterName string) map[string][]harness.EventWindow {
	out := map[string][]harness.EventWindow{}
	for _, w := range srv.Windows() {
		if w.Tags[TagCluster] == clusterName {
			out[w.Tags[TagNodePool]] = append(out[w.Tags[TagNodePool]], w)
		}
	}
	return out
}

// since returns the calls made after the first n.
func since(srv *harness.EC2EventWindows, n int) []string { return srv.Calls()[n:] }

// saturday is the EC2 window of a pool whose window opens Saturday 02:00 for 4h, with the
// default drain-lead of 1h: the pool's shifted by it (a start AWS schedules at 03:00 is
// drained at 02:00, when the pool's window opens).
var saturday = []harness.WindowRange{{StartWeekDay: "saturday", StartHour: 3, EndWeekDay: "saturday", EndHour: 7}}

// TestCreate: a pool that asks gets one window, named and tagged by cluster and pool, holding
// its window's ranges and targeting its instance tag; its instances are tagged; the Event says
// so. A second pass makes no call at all: what the manager wrote is what it knows.
func TestCreate(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	srv.AddInstance("i-0000000000000000a", nil)
	f := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")), pool("web", nil), claim("kafka-a", "kafka", "i-0000000000000000a"))
	f.pass(t)
	got := byPool(srv, "prod")
	if len(got) != 1 || len(got["kafka"]) != 1 {
		t.Fatalf("windows %+v, want one, of kafka", got)
	}
	w := got["kafka"][0]
	if w.Name != "hr-prod-kafka" || !slices.Equal(w.Ranges, saturday) || !slices.Equal(w.TargetTags, []string{"healthrouter.io/event-window=prod/kafka"}) {
		t.Errorf("window %+v: want hr-prod-kafka, Saturday 03-07, targeting healthrouter.io/event-window=prod/kafka", w)
	}
	if v := srv.InstanceTags("i-0000000000000000a")[TagInstance]; v != "prod/kafka" {
		t.Errorf("instance tag %q, want prod/kafka", v)
	}
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Normal "+ReasonSynced) || !strings.Contains(ev[0], "Sat 03:00-Sat 07:00 UTC") {
		t.Errorf("events %q, want one %s naming the range", ev, ReasonSynced)
	}
	if want := []string{"DescribeInstanceEventWindows", "CreateInstanceEventWindow", "AssociateInstanceEventWindow", "CreateTags"}; !slices.Equal(srv.Calls(), want) {
		t.Errorf("calls %v, want %v", srv.Calls(), want)
	}
	if f.count(ResultCreated) != 1 || f.count(ResultAssociated) != 1 || testutil.ToFloat64(f.m.tagged) != 1 {
		t.Errorf("metrics: created %v, associated %v, tagged %v", f.count(ResultCreated), f.count(ResultAssociated), testutil.ToFloat64(f.m.tagged))
	}
	n := len(srv.Calls())
	f.clk.Step(time.Minute)
	f.pass(t)
	if c := since(srv, n); len(c) != 0 {
		t.Errorf("a second pass called %v, want nothing", c)
	}
	// Past DescribeTTL it reads EC2 again, finds the window as it left it, and writes nothing.
	f.clk.Step(DescribeTTL)
	f.pass(t)
	if c := since(srv, n); !slices.Equal(c, []string{"DescribeInstanceEventWindows"}) {
		t.Errorf("after DescribeTTL: %v, want one describe", c)
	}
}

// TestWindowLeavesTheLeads: the EC2 window is the pool's shifted by what the router does
// before AWS's start (issue 36, defect 6): by drain-lead, and for a pool that reboots a type in
// place by the time a run empties the node before the start too (from the opening plus the
// longest lead to the close plus the shortest). On dd387c1 it was the pool's own: a start AWS
// scheduled at the opening was drained drain-lead, or emptied 2h10m, before the window.
func TestWindowLeavesTheLeads(t *testing.T) {
	for _, tt := range []struct {
		name string
		ann  map[string]string
		want []harness.WindowRange
	}{
		{"drain-lead 2h", map[string]string{policy.AnnotationDrainLead: "2h"},
			[]harness.WindowRange{{StartWeekDay: "saturday", StartHour: 4, EndWeekDay: "saturday", EndHour: 10}}},
		{"system reboots kept in place (emptied 2h10m ahead)", map[string]string{policy.ScheduledActionKey(event.ScheduledSystemReboot): string(policy.ActionRebootInPlace)},
			[]harness.WindowRange{{StartWeekDay: "saturday", StartHour: 5, EndWeekDay: "saturday", EndHour: 9}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, api := harness.NewEC2EventWindows(t)
			ann := asks("0 2 * * 6", "6h")
			maps.Copy(ann, tt.ann)
			f := newFixture(t, api, "prod", pool("kafka", ann))
			f.m.WithInPlaceLead(inplace.Options{}.PrepareLead())
			f.pass(t)
			got := byPool(srv, "prod")["kafka"]
			if len(got) != 1 || !slices.Equal(got[0].Ranges, tt.want) {
				t.Errorf("windows %+v, want one with %v", got, tt.want)
			}
		})
	}
}

// TestModify: a changed schedule modifies the same window (its ID kept), and says from what
// to what.
func TestModify(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	np := pool("kafka", asks("0 2 * * 6", "4h"))
	f := newFixture(t, api, "prod", np)
	f.pass(t)
	before := byPool(srv, "prod")["kafka"]
	f.events()
	np.Annotations[policy.AnnotationWindowSchedule] = "0 1 * * 2,4"
	np.Annotations[policy.AnnotationWindowDuration] = "3h"
	if err := f.kube.Update(context.Background(), np); err != nil {
		t.Fatal(err)
	}
	n := len(srv.Calls())
	f.pass(t)
	after := byPool(srv, "prod")["kafka"]
	want := []harness.WindowRange{{StartWeekDay: "tuesday", StartHour: 2, EndWeekDay: "tuesday", EndHour: 5}, {StartWeekDay: "thursday", StartHour: 2, EndWeekDay: "thursday", EndHour: 5}}
	if len(after) != 1 || after[0].ID != before[0].ID || !slices.Equal(after[0].Ranges, want) {
		t.Fatalf("after the change: %+v, want window %s with %v", after, before[0].ID, want)
	}
	if c := since(srv, n); !slices.Equal(c, []string{"ModifyInstanceEventWindow"}) {
		t.Errorf("calls %v, want one modify", c)
	}
	if ev := f.events(); len(ev) != 1 || !strings.Contains(ev[0], "changed from Sat 03:00-Sat 07:00 UTC to Tue 02:00-Tue 05:00 UTC, Thu 02:00-Thu 05:00 UTC") {
		t.Errorf("events %q", ev)
	}
	if f.count(ResultModified) != 1 {
		t.Errorf("modified %v, want 1", f.count(ResultModified))
	}
}

// TestTwoClusters: two clusters with a pool of the same name get a window each, each with its
// own tags and target, and their instances carry their own cluster's value; neither touches
// the other's window when its own pool goes.
func TestTwoClusters(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	srv.AddInstance("i-0000000000000000a", nil)
	srv.AddInstance("i-0000000000000000b", nil)
	prodPool := pool("default", asks("0 2 * * 6", "4h"))
	prod := newFixture(t, api, "prod", prodPool, claim("default-a", "default", "i-0000000000000000a"))
	stage := newFixture(t, api, "stage", pool("default", asks("0 2 * * 0", "4h")), claim("default-b", "default", "i-0000000000000000b"))
	prod.pass(t)
	stage.pass(t)
	p, s := byPool(srv, "prod")["default"], byPool(srv, "stage")["default"]
	if len(p) != 1 || len(s) != 1 || p[0].ID == s[0].ID {
		t.Fatalf("prod %+v, stage %+v: want a window each", p, s)
	}
	if !slices.Equal(p[0].TargetTags, []string{"healthrouter.io/event-window=prod/default"}) || !slices.Equal(s[0].TargetTags, []string{"healthrouter.io/event-window=stage/default"}) {
		t.Errorf("targets %v and %v: want each cluster's own", p[0].TargetTags, s[0].TargetTags)
	}
	if p[0].Name != "hr-prod-default" || s[0].Name != "hr-stage-default" {
		t.Errorf("names %q and %q", p[0].Name, s[0].Name)
	}
	if a, b := srv.InstanceTags("i-0000000000000000a")[TagInstance], srv.InstanceTags("i-0000000000000000b")[TagInstance]; a != "prod/default" || b != "stage/default" {
		t.Errorf("instance tags %q, %q", a, b)
	}
	if err := prod.kube.Delete(context.Background(), prodPool); err != nil {
		t.Fatal(err)
	}
	prod.clk.Step(DescribeTTL) // read EC2 again: the other cluster's window is there too
	prod.pass(t)
	if len(byPool(srv, "prod")) != 0 || len(byPool(srv, "stage")["default"]) != 1 {
		t.Errorf("after prod's pool went: prod %v, stage %v; want prod's deleted, stage's kept", byPool(srv, "prod"), byPool(srv, "stage"))
	}
}

// TestDelete: the window goes (disassociated, then deleted) when the annotation goes, when the
// pool goes, and when its window becomes one EC2 cannot hold; a pool set to false makes none.
func TestDelete(t *testing.T) {
	tests := []struct {
		name   string
		change func(context.Context, client.Client, *karpv1.NodePool) error
	}{
		{"annotation removed", func(ctx context.Context, c client.Client, np *karpv1.NodePool) error {
			delete(np.Annotations, policy.AnnotationEventWindow)
			return c.Update(ctx, np)
		}},
		{"annotation false", func(ctx context.Context, c client.Client, np *karpv1.NodePool) error {
			np.Annotations[policy.AnnotationEventWindow] = "false"
			return c.Update(ctx, np)
		}},
		{"pool deleted", func(ctx context.Context, c client.Client, np *karpv1.NodePool) error { return c.Delete(ctx, np) }},
		{"pool put in shadow: a window changes when AWS acts", func(ctx context.Context, c client.Client, np *karpv1.NodePool) error {
			np.Annotations[policy.AnnotationMode] = policy.ModeShadow
			return c.Update(ctx, np)
		}},
		{"window EC2 cannot hold", func(ctx context.Context, c client.Client, np *karpv1.NodePool) error {
			np.Annotations[policy.AnnotationWindowSchedule] = "CRON_TZ=Europe/Paris 0 2 * * 6"
			return c.Update(ctx, np)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, api := harness.NewEC2EventWindows(t)
			np := pool("kafka", asks("0 2 * * 6", "4h"))
			f := newFixture(t, api, "prod", np, pool("web", asks("0 3 * * 0", "4h")))
			f.pass(t)
			if len(byPool(srv, "prod")) != 2 {
				t.Fatalf("windows %v, want kafka's and web's", byPool(srv, "prod"))
			}
			if err := tt.change(context.Background(), f.kube, np); err != nil {
				t.Fatal(err)
			}
			n := len(srv.Calls())
			f.pass(t)
			got := byPool(srv, "prod")
			if _, ok := got["kafka"]; ok || len(got["web"]) != 1 {
				t.Errorf("windows %v: want kafka's deleted, web's kept", got)
			}
			if c := since(srv, n); !slices.Equal(c, []string{"DisassociateInstanceEventWindow", "DeleteInstanceEventWindow"}) {
				t.Errorf("calls %v, want disassociate then delete", c)
			}
			if f.count(ResultDeleted) != 1 {
				t.Errorf("deleted %v, want 1", f.count(ResultDeleted))
			}
		})
	}
}

// TestStrayTargets (issue 38, item 7): AssociateInstanceEventWindow is authorized on the window
// alone, so whoever holds the router's grant may associate the cluster's windows with any tag,
// instance or Dedicated Host of the account. The manager takes every target it did not
// associate off the pool's window at its next read of EC2 (a Warning naming them, the metric),
// then associates the pool's tag if it is gone; a window no pool asks for any more is emptied of
// them and deleted. On main the strays stayed, and instance IDs kept the pool's tag out (EC2
// holds one type of target a window) and the window from being deleted.
func TestStrayTargets(t *testing.T) {
	const own = "healthrouter.io/event-window=prod/kafka"
	tag := func(k, v string) []ec2types.Tag { return []ec2types.Tag{{Key: aws.String(k), Value: aws.String(v)}} }
	for _, tt := range []struct {
		name  string
		stray func(ctx context.Context, api *ec2.Client, id string) error
		named string // what the Warning names
	}{
		{"another tag beside the pool's", func(ctx context.Context, api *ec2.Client, id string) error {
			_, err := api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(id),
				AssociationTarget: &ec2types.InstanceEventWindowAssociationRequest{InstanceTags: tag("team", "payments")}})
			return err
		}, "team=payments"},
		{"instance IDs instead of the pool's tag", func(ctx context.Context, api *ec2.Client, id string) error {
			if _, err := api.DisassociateInstanceEventWindow(ctx, &ec2.DisassociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(id),
				AssociationTarget: &ec2types.InstanceEventWindowDisassociationRequest{InstanceTags: tag(TagInstance, "prod/kafka")}}); err != nil {
				return err
			}
			_, err := api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(id),
				AssociationTarget: &ec2types.InstanceEventWindowAssociationRequest{InstanceIds: []string{"i-0000000000000dead", "i-0000000000000beef"}}})
			return err
		}, "i-0000000000000dead, i-0000000000000beef"},
		{"Dedicated Hosts instead of the pool's tag", func(ctx context.Context, api *ec2.Client, id string) error {
			if _, err := api.DisassociateInstanceEventWindow(ctx, &ec2.DisassociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(id),
				AssociationTarget: &ec2types.InstanceEventWindowDisassociationRequest{InstanceTags: tag(TagInstance, "prod/kafka")}}); err != nil {
				return err
			}
			_, err := api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(id),
				AssociationTarget: &ec2types.InstanceEventWindowAssociationRequest{DedicatedHostIds: []string{"h-0123456789abcdef0"}}})
			return err
		}, "h-0123456789abcdef0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			srv, api := harness.NewEC2EventWindows(t)
			np := pool("kafka", asks("0 2 * * 6", "4h"))
			f := newFixture(t, api, "prod", np)
			f.pass(t)
			id := byPool(srv, "prod")["kafka"][0].ID
			f.events()
			if err := tt.stray(ctx, api, id); err != nil {
				t.Fatal(err)
			}
			f.clk.Step(DescribeTTL) // the next read of EC2
			f.pass(t)
			w := srv.Windows()[id]
			if !slices.Equal(w.TargetTags, []string{own}) || len(w.TargetInstances)+len(w.TargetHosts) != 0 {
				t.Errorf("window targets tags %v, instances %v, hosts %v; want the pool's tag alone", w.TargetTags, w.TargetInstances, w.TargetHosts)
			}
			if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonProblem) || !strings.Contains(ev[0], tt.named) {
				t.Errorf("events %q, want one Warning naming %s", ev, tt.named)
			}
			if f.count(ResultStray) != 1 {
				t.Errorf("stray %v, want 1", f.count(ResultStray))
			}
			// Done once: the next pass asks nothing.
			n := len(srv.Calls())
			f.pass(t)
			if c := since(srv, n); len(c) != 0 {
				t.Errorf("a pass after the cleanup called %v", c)
			}
			// Strays again, and the pool no longer asks: the window is emptied and deleted.
			if err := tt.stray(ctx, api, id); err != nil {
				t.Fatal(err)
			}
			delete(np.Annotations, policy.AnnotationEventWindow)
			if err := f.kube.Update(ctx, np); err != nil {
				t.Fatal(err)
			}
			f.clk.Step(DescribeTTL)
			f.pass(t)
			if len(srv.Windows()) != 0 {
				t.Errorf("windows %+v, want the pool's deleted", srv.Windows())
			}
		})
	}
}

// TestInexpressible: a pool whose window EC2 cannot hold gets no window and no call: a Warning
// Event with the reason, once, and the metric once.
func TestInexpressible(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	f := newFixture(t, api, "prod", pool("kafka", asks("CRON_TZ=Europe/Paris 0 2 * * 6", "4h")))
	for range 3 {
		f.pass(t)
		f.clk.Step(DescribeTTL)
	}
	if len(srv.Windows()) != 0 {
		t.Errorf("windows %v, want none", srv.Windows())
	}
	for _, c := range srv.Calls() {
		if c != "DescribeInstanceEventWindows" {
			t.Errorf("call %s: want reads only", c)
		}
	}
	ev := f.events()
	if len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+ReasonProblem) || !strings.Contains(ev[0], "daylight saving") {
		t.Errorf("events %q, want one Warning with the reason", ev)
	}
	if f.count(ResultInexpressible) != 1 {
		t.Errorf("inexpressible %v, want 1", f.count(ResultInexpressible))
	}
	if p := f.m.Problems()["kafka"]; !strings.Contains(p, "Europe/Paris") {
		t.Errorf("Problems: %q", p)
	}
}

// TestRefused: EC2's refusals (the region's window limit, the pool's tag already another
// window's target) are a problem on the pool: a Warning Event with EC2's answer, the metric,
// and a backoff: NodeClaims appearing meanwhile ask EC2 nothing about the window; after the
// backoff one more try, and the next pause is longer. Once EC2 takes it, the window is made.
func TestRefused(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*harness.EC2EventWindows) string // returns the window to clear for the fix
		refused string                                // the call EC2 refuses
		message string
	}{
		{"200 windows", func(s *harness.EC2EventWindows) string {
			first := ""
			for i := range 200 {
				id := s.PutWindow(harness.EventWindow{Name: "other", Tags: map[string]string{"team": "x"}})
				if i == 0 {
					first = id
				}
			}
			return first
		}, "CreateInstanceEventWindow", "ResourceLimitExceeded"},
		{"tag already in another window", func(s *harness.EC2EventWindows) string {
			return s.PutWindow(harness.EventWindow{Name: "by-hand", Ranges: saturday, TargetTags: []string{"healthrouter.io/event-window=prod/kafka"}})
		}, "AssociateInstanceEventWindow", "already associated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, api := harness.NewEC2EventWindows(t)
			other := tt.setup(srv)
			f := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")))
			f.pass(t)
			// (The window may be made before the refusal: a Normal Event first.)
			ev := f.events()
			warnings := slices.DeleteFunc(slices.Clone(ev), func(e string) bool { return !strings.HasPrefix(e, "Warning "+ReasonProblem) })
			if len(warnings) != 1 || !strings.Contains(warnings[0], tt.message) || strings.Contains(warnings[0], "operation error") {
				t.Fatalf("events %q, want one Warning with EC2's answer %q, without the SDK's wrapping", ev, tt.message)
			}
			if f.count(ResultRefused) != 1 {
				t.Errorf("refused %v, want 1", f.count(ResultRefused))
			}
			tries := func() int {
				n := 0
				for _, c := range srv.Calls() {
					if c == tt.refused {
						n++
					}
				}
				return n
			}
			// NodeClaims appear and passes run for 59 seconds: no more tries, no reads of the
			// windows; the instances are tagged all the same.
			n := len(srv.Calls())
			for i := range 59 {
				id := fmt.Sprintf("i-%017x", i+1)
				srv.AddInstance(id, nil)
				if err := f.kube.Create(context.Background(), claim(fmt.Sprintf("kafka-%d", i), "kafka", id)); err != nil {
					t.Fatal(err)
				}
				f.clk.Step(time.Second)
				f.pass(t)
			}
			if c := since(srv, n); len(c) != 59 || slices.ContainsFunc(c, func(a string) bool { return a != "CreateTags" }) {
				t.Errorf("calls within the backoff %v, want one CreateTags a NodeClaim", c)
			}
			if v := srv.InstanceTags(fmt.Sprintf("i-%017x", 59))[TagInstance]; v != "prod/kafka" {
				t.Errorf("an instance of the pool in backoff is tagged %q, want prod/kafka", v)
			}
			if next := f.m.Next(); !next.Equal(t0.Add(RetryBase)) {
				t.Errorf("Next %s, want the backoff's end %s", next, t0.Add(RetryBase))
			}
			f.clk.Step(time.Second)
			f.pass(t)
			if n := tries(); n != 2 {
				t.Errorf("%d tries after the backoff, want 2", n)
			}
			if next := f.m.Next(); !next.Equal(f.clk.Now().Add(2 * RetryBase)) {
				t.Errorf("Next %s, want twice the backoff after the second refusal", next)
			}
			if ev := f.events(); len(ev) != 0 {
				t.Errorf("the same problem told again: %q", ev)
			}
			// The cause goes: the next try makes the window.
			srv.RemoveWindow(other)
			f.clk.Step(2 * RetryBase)
			f.pass(t)
			if w := byPool(srv, "prod")["kafka"]; len(w) != 1 || len(w[0].TargetTags) != 1 {
				t.Errorf("after the cause went: %+v, want the pool's window, associated", w)
			}
			if p := f.m.Problems()["kafka"]; p != "" {
				t.Errorf("problem still told: %q", p)
			}
		})
	}
}

// TestStandInRefusals: the EC2 stand-in refuses what EC2 documents it refuses, through the
// real SDK client: a range under 2 hours, under 4 hours a week, an hour past 23, ranges and a
// cron expression together, a window with targets deleted without ForceDelete, and a tag
// target already in another window. The manager's conversion never asks for the first ones
// (TestEC2Ranges in router/policy): this shows the stand-in would catch it if it did.
func TestStandInRefusals(t *testing.T) {
	ctx := context.Background()
	srv, api := harness.NewEC2EventWindows(t)
	r := func(sd ec2types.WeekDay, sh int32, ed ec2types.WeekDay, eh int32) ec2types.InstanceEventWindowTimeRangeRequest {
		return ec2types.InstanceEventWindowTimeRangeRequest{StartWeekDay: sd, StartHour: aws.Int32(sh), EndWeekDay: ed, EndHour: aws.Int32(eh)}
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return fmt.Sprint(err)
	}
	for _, tt := range []struct {
		name string
		in   *ec2.CreateInstanceEventWindowInput
		code string
	}{
		{"a range under 2h", &ec2.CreateInstanceEventWindowInput{TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{
			r(ec2types.WeekDayMonday, 2, ec2types.WeekDayMonday, 3), r(ec2types.WeekDayTuesday, 2, ec2types.WeekDayTuesday, 6)}}, "InvalidParameterValue"},
		{"under 4h a week", &ec2.CreateInstanceEventWindowInput{TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{r(ec2types.WeekDayMonday, 2, ec2types.WeekDayMonday, 5)}}, "InvalidParameterValue"},
		{"hour 24", &ec2.CreateInstanceEventWindowInput{TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{r(ec2types.WeekDayMonday, 18, ec2types.WeekDayMonday, 24)}}, "InvalidParameterValue"},
		{"ranges and cron", &ec2.CreateInstanceEventWindowInput{CronExpression: aws.String("* 0-4 * * 1"),
			TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{r(ec2types.WeekDayMonday, 2, ec2types.WeekDayMonday, 6)}}, "InvalidParameterCombination"},
		{"4h", &ec2.CreateInstanceEventWindowInput{TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{r(ec2types.WeekDayMonday, 2, ec2types.WeekDayMonday, 6)}}, ""},
	} {
		_, err := api.CreateInstanceEventWindow(ctx, tt.in)
		if (tt.code == "" && err != nil) || (tt.code != "" && code(err) != tt.code) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.code)
		}
	}
	ids := slices.Collect(maps.Keys(srv.Windows()))
	if len(ids) != 1 {
		t.Fatalf("windows %v, want the one valid", srv.Windows())
	}
	target := &ec2types.InstanceEventWindowAssociationRequest{InstanceTags: []ec2types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}}
	if _, err := api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(ids[0]), AssociationTarget: target}); err != nil {
		t.Fatal(err)
	}
	other := srv.PutWindow(harness.EventWindow{Ranges: saturday})
	if _, err := api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{InstanceEventWindowId: aws.String(other), AssociationTarget: target}); code(err) != "InvalidParameterValue" || !strings.Contains(err.Error(), "already associated") {
		t.Errorf("a target of another window: %v", err)
	}
	if _, err := api.DeleteInstanceEventWindow(ctx, &ec2.DeleteInstanceEventWindowInput{InstanceEventWindowId: aws.String(ids[0])}); code(err) != "InvalidParameterValue" {
		t.Errorf("deleting a window with targets: %v, want refused", err)
	}
	if _, err := api.DeleteInstanceEventWindow(ctx, &ec2.DeleteInstanceEventWindowInput{InstanceEventWindowId: aws.String(ids[0]), DryRun: aws.Bool(true)}); code(err) != "DryRunOperation" {
		t.Errorf("DryRun: %v", err)
	}
}

// TestUnavailable: EC2 failing the read of the windows is counted and backed off: passes in the
// meantime make no call about the windows, and the one after the backoff makes the window.
func TestUnavailable(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	srv.Fail = 1
	f := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")))
	f.pass(t)
	if f.count(ResultUnavailable) != 1 || len(srv.Windows()) != 0 {
		t.Fatalf("unavailable %v, windows %v", f.count(ResultUnavailable), srv.Windows())
	}
	for range 30 {
		f.clk.Step(time.Second)
		f.pass(t)
	}
	if c := srv.Calls(); len(c) != 1 {
		t.Errorf("calls %v within the backoff, want the one that failed", c)
	}
	f.clk.Step(RetryBase)
	f.pass(t)
	if len(byPool(srv, "prod")["kafka"]) != 1 {
		t.Errorf("after the backoff: %v, want the window", srv.Windows())
	}
}

// TestTagging: a NodeClaim that appears gets its instance tagged, once; an instance EC2 does not
// know yet fails no other and is tried again after RetryBase; a NodeClaim of a pool that does
// not ask, or of no pool, is left alone.
func TestTagging(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	for _, id := range []string{"i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c"} {
		srv.AddInstance(id, nil)
	}
	f := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")), pool("web", nil),
		claim("kafka-a", "kafka", "i-0000000000000000a"), claim("web-c", "web", "i-0000000000000000c"))
	f.pass(t)
	ctx := context.Background()
	for _, nc := range []*karpv1.NodeClaim{claim("kafka-b", "kafka", "i-0000000000000000b"), claim("kafka-d", "kafka", "i-0000000000000000d"), claim("kafka-pending", "kafka", "")} {
		if err := f.kube.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
	}
	n := len(srv.Calls())
	f.pass(t)
	// One batch of b and d fails on d; then each on its own.
	if c := since(srv, n); !slices.Equal(c, []string{"CreateTags", "CreateTags", "CreateTags"}) {
		t.Errorf("calls %v, want the batch, then b and d alone", c)
	}
	if v := srv.InstanceTags("i-0000000000000000b")[TagInstance]; v != "prod/kafka" {
		t.Errorf("b tagged %q", v)
	}
	if _, ok := srv.InstanceTags("i-0000000000000000c")[TagInstance]; ok {
		t.Error("an instance of a pool that does not ask is tagged")
	}
	n = len(srv.Calls())
	f.clk.Step(time.Second)
	f.pass(t)
	if c := since(srv, n); len(c) != 0 {
		t.Errorf("calls %v before RetryBase, want none", c)
	}
	srv.AddInstance("i-0000000000000000d", nil)
	f.clk.Step(RetryBase)
	f.pass(t)
	if v := srv.InstanceTags("i-0000000000000000d")[TagInstance]; v != "prod/kafka" {
		t.Errorf("d tagged %q after it appeared in EC2", v)
	}
	if got := testutil.ToFloat64(f.m.tagged); got != 3 {
		t.Errorf("tagged %v, want 3", got)
	}
}

// TestReconcile: the controller's Reconcile runs a Pass and asks to come back when the next
// backoff or re-read is due, never at once.
func TestReconcile(t *testing.T) {
	srv, api := harness.NewEC2EventWindows(t)
	srv.Limit = 0
	f := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")))
	res, err := f.m.Reconcile(context.Background(), passKey)
	if err != nil || res.RequeueAfter != RetryBase {
		t.Errorf("Reconcile = %+v, %v; want back after %s", res, err, RetryBase)
	}
}

// TestCleanup (issue 36, defect 2): a router restarted with the feature off (--event-windows
// off, or --shadow) beside the windows an earlier one created. They were left in EC2, kept by
// nobody; Cleanup deletes this cluster's (not another's) and ends once none is left. Retried
// while EC2 fails, for a bounded time; ended at once where EC2 refuses to list windows (never
// granted, none made).
func TestCleanup(t *testing.T) {
	tests := []struct {
		name     string
		fail     int
		denied   bool
		wantLeft int // this cluster's windows left
	}{
		{name: "deleted", wantLeft: 0},
		{name: "EC2 fails twice: deleted once it answers", fail: 2, wantLeft: 0},
		{name: "EC2 refuses to list: ended, nothing deleted", denied: true, wantLeft: 2},
		{name: "EC2 never answers: ended after its tries, nothing deleted", fail: 1000, wantLeft: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, api := harness.NewEC2EventWindows(t)
			on := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")), pool("web", asks("0 3 * * 0", "4h")))
			on.pass(t)
			other := newFixture(t, api, "stage", pool("kafka", asks("0 2 * * 6", "4h")))
			other.pass(t)
			// The restart, with the feature off: the pools still ask, nothing keeps them.
			off := newFixture(t, api, "prod", pool("kafka", asks("0 2 * * 6", "4h")), pool("web", asks("0 3 * * 0", "4h")))
			srv.Fail = tt.fail
			if tt.denied {
				srv.Denied = map[string]bool{"DescribeInstanceEventWindows": true}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- off.m.Cleanup(ctx) }()
			for {
				select {
				case err := <-done:
					if err != nil || ctx.Err() != nil {
						t.Fatalf("Cleanup: %v (%v)", err, ctx.Err())
					}
					left := 0
					for _, ws := range byPool(srv, "prod") {
						left += len(ws)
					}
					if left != tt.wantLeft || len(byPool(srv, "stage")["kafka"]) != 1 {
						t.Errorf("left %d of prod's windows (want %d), stage's %v", left, tt.wantLeft, byPool(srv, "stage"))
					}
					if want := float64(2 - tt.wantLeft); off.count(ResultDeleted) != want {
						t.Errorf("deleted %v, want %v", off.count(ResultDeleted), want)
					}
					return
				case <-time.After(10 * time.Millisecond):
					off.clk.Step(RetryBase) // the backoff passes
				}
			}
		})
	}
}
