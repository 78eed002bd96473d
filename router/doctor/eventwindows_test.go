package doctor

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/test/harness"
)

// TestRouterEventWindows: the DryRun checks of the event-window calls and of CreateTags,
// against the EC2 stand-in through the real SDK client. Nothing is created, changed or tagged,
// whatever the answers.
func TestRouterEventWindows(t *testing.T) {
	const tagged, untagged = "i-0000000000000000a", "i-0000000000000000b"
	sample := scopeSample{tagged: tagged, taggedBy: "kafka-a", untagged: untagged, untaggedBy: "ng-node", honoured: true}
	tests := []struct {
		name    string
		cluster string
		setup   func(*harness.EC2EventWindows)
		status  Status // of CheckEventWindowCalls
		detail  string
		tags    Status // of CheckEventWindowTags; "" when not made
	}{
		{"allowed, on the cluster's window", "prod", func(s *harness.EC2EventWindows) {
			s.PutWindow(harness.EventWindow{Tags: map[string]string{eventwindow.TagCluster: "prod", eventwindow.TagNodePool: "kafka"}})
		}, OK, "on window iew-", OK},
		{"allowed, no window yet", "prod", func(*harness.EC2EventWindows) {}, OK, "a placeholder window", OK},
		{"create denied", "prod", func(s *harness.EC2EventWindows) { s.Denied = map[string]bool{"CreateInstanceEventWindow": true} }, Fail, "denied: CreateInstanceEventWindow", OK},
		{"window calls denied on a placeholder", "prod", func(s *harness.EC2EventWindows) {
			s.Denied = map[string]bool{"ModifyInstanceEventWindow": true, "DeleteInstanceEventWindow": true}
		}, Unknown, "placeholder window", OK},
		{"window calls denied on the cluster's window", "prod", func(s *harness.EC2EventWindows) {
			s.PutWindow(harness.EventWindow{Tags: map[string]string{eventwindow.TagCluster: "prod"}})
			s.Denied = map[string]bool{"AssociateInstanceEventWindow": true}
		}, Fail, "denied: AssociateInstanceEventWindow", OK},
		{"tags denied", "prod", func(s *harness.EC2EventWindows) { s.Denied = map[string]bool{"CreateTags": true} }, OK, "", Fail},
		{"no cluster name", "", func(*harness.EC2EventWindows) {}, Fail, "--cluster-name", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, api := harness.NewEC2EventWindows(t)
			srv.AddInstance(tagged, nil)
			srv.AddInstance(untagged, nil)
			srv.Scope = map[string]bool{tagged: true}
			tt.setup(srv)
			before := len(srv.Windows())
			var r Report
			(&Doctor{ec2: api}).routerEventWindows(context.Background(), &r, Config{EventWindows: true, ClusterName: tt.cluster}, sample)
			got := map[string]Item{}
			for _, i := range r {
				got[i.Check] = i
			}
			if i := got[CheckEventWindowCalls]; i.Status != tt.status || !strings.Contains(i.Detail, tt.detail) {
				t.Errorf("calls: %+v, want %s mentioning %q", i, tt.status, tt.detail)
			}
			if i := got[CheckEventWindowTags]; i.Status != tt.tags {
				t.Errorf("tags: %+v, want %q", i, tt.tags)
			}
			if tt.tags == OK {
				if i := got[CheckEventWindowTags+" scope"]; i.Status != OK {
					t.Errorf("scope: %+v, want ok (refused outside the cluster's instances)", i)
				}
			}
			if i := got[CheckEventWindowCalls]; i.Status != OK && !strings.Contains(i.Fix, "enable_event_windows") && tt.cluster != "" {
				t.Errorf("fix %q: want the Terraform variable named", i.Fix)
			}
			if len(srv.Windows()) != before || len(srv.InstanceTags(tagged)) != 0 {
				t.Errorf("doctor changed EC2: windows %v, tags %v", srv.Windows(), srv.InstanceTags(tagged))
			}
		})
	}
}

// TestEventWindowPools: doctor lists the pools that ask for an EC2 event window they cannot
// have: a window EC2 cannot express (with the reason), or a router without --event-windows.
func TestEventWindowPools(t *testing.T) {
	pool := func(name, schedule string) client.Object {
		return &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			policy.AnnotationEventWindow: "true", policy.AnnotationWindowSchedule: schedule, policy.AnnotationWindowDuration: "4h"}}}
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		pools []client.Object
		on    bool
		want  []Item // Status, Check; Detail a substring
	}{
		{"expressible", []client.Object{pool("kafka", "0 2 * * 6")}, true, []Item{{Status: OK, Check: CheckEventWindowPools, Detail: "1 NodePool(s)"}}},
		{"one EC2 cannot express", []client.Object{pool("kafka", "0 2 * * 6"), pool("paris", "CRON_TZ=Europe/Paris 0 2 * * 6")}, true,
			[]Item{{Status: Warn, Check: CheckEventWindowPools + ": paris", Detail: "daylight saving"}}},
		{"router without --event-windows", []client.Object{pool("kafka", "0 2 * * 6")}, false,
			[]Item{{Status: Warn, Check: CheckEventWindowPools + ": kafka", Detail: "without --event-windows"}}},
		{"none asks", []client.Object{&karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "web"}}}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &Doctor{kube: fake.NewClientBuilder().WithScheme(scheme).WithObjects(tt.pools...).Build()}
			var r Report
			d.eventWindowPools(context.Background(), &r, Config{EventWindows: tt.on})
			if len(r) != len(tt.want) {
				t.Fatalf("report %+v, want %d item(s)", r, len(tt.want))
			}
			for i, w := range tt.want {
				if r[i].Status != w.Status || r[i].Check != w.Check || !strings.Contains(r[i].Detail, w.Detail) {
					t.Errorf("item %d: %+v, want %+v", i, r[i], w)
				}
			}
		})
	}
}
