package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/status"
	"github.com/health-router/health-router/test/harness"
)

// TestStatus writes the router's records with the real Signaller on a real kube-apiserver
// with the Karpenter CRDs, then reads them back with status.Read and with the command as
// a kubectl plugin: `kubectl health-router status`, kubectl finding kubectl-health_router
// on PATH.
func TestStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest suite; run without -short")
	}
	env := harness.KubeEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	clientset, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: clientset.EventsV1()})
	broadcaster.StartRecordingToSink(ctx.Done())
	t.Cleanup(broadcaster.Shutdown)
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC) // a Saturday, 14 h before the window
	sig := signal.New(kube, kube, signal.ModeDeleteNodeClaim, nil, "", broadcaster.NewRecorder(scheme, "health-router"), clocktesting.NewFakeClock(now))

	kafkaAnn := map[string]string{
		policy.AnnotationAction: "defer", policy.AnnotationWindowSchedule: "0 2 * * 6", policy.AnnotationWindowDuration: "4h",
		policy.AnnotationMaxConcurrentDrains: "1", policy.ScheduledActionKey(event.ScheduledSystemReboot): "drain",
	}
	pools := map[string]map[string]string{"kafka": kafkaAnn, "web": nil, "batch": {policy.AnnotationMaxConcurrentDrains: "50%"}}
	for name, ann := range pools {
		mustCreate(t, kube, &karpv1.NodePool{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64"}}},
			}}},
		})
	}
	claims := map[string]*karpv1.NodeClaim{}
	for _, name := range []string{"kafka-a", "kafka-b", "kafka-c", "kafka-d", "web-a", "batch-a", "batch-b"} {
		pool := strings.Split(name, "-")[0]
		nc := &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{karpv1.NodePoolLabelKey: pool}, Finalizers: []string{"karpenter.sh/termination"}},
			Spec: karpv1.NodeClaimSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{pool}}},
			},
		}
		mustCreate(t, kube, nc)
		nc.Status.NodeName = "ip-10-0-1-" + name
		if err := kube.Status().Update(ctx, nc); err != nil {
			t.Fatalf("status of nodeclaim %s: %v", name, err)
		}
		claims[name] = nc
		t.Cleanup(func() {
			// Let Karpenter's finalizer go so that envtest stops cleanly.
			cur := &karpv1.NodeClaim{}
			if kube.Get(context.Background(), client.ObjectKeyFromObject(nc), cur) == nil {
				cur.Finalizers = nil
				_ = kube.Update(context.Background(), cur)
			}
		})
	}

	week := now.Add(7 * 24 * time.Hour)
	retirement := func(id string) event.Event {
		return event.Event{ID: id, Kind: event.KindScheduledChange, Time: now.Add(-time.Hour), Deadline: week,
			Health: &event.Health{EventARN: "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/" + id, TypeCode: "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", Scheduled: event.ScheduledInstanceRetirement, Start: week}}
	}
	kafka := policy.FromAnnotations(kafkaAnn)
	target := func(nc string, inFlight int) policy.Target {
		return policy.Target{InstanceID: "i-" + nc, Found: true, NodeClaim: nc, NodePool: "kafka", Policy: kafka, PoolNodes: 4, DrainsInFlight: inFlight}
	}
	resolved := func(nc string) cluster.Resolved {
		return cluster.Resolved{InstanceID: "i-" + nc, NodeClaim: claims[nc]}
	}

	// kafka-a: a spot interruption drains it (urgent: no window, no pacing).
	spot := event.Event{ID: "ev-spot", Kind: event.KindSpotInterruption, Time: now.Add(-time.Minute), Deadline: now.Add(time.Minute)}
	d := policy.Decide(spot, target("kafka-a", 0), now)
	if d.Action != policy.ActionDrain {
		t.Fatalf("spot: %s", d.Reason)
	}
	if _, err := sig.Drain(ctx, spot, d, resolved("kafka-a"), false); err != nil {
		t.Fatal(err)
	}
	// kafka-b: a retirement waits for Saturday's window.
	deferTo := func(nc string, ev event.Event, d policy.Decision, want string) {
		t.Helper()
		if d.Action != policy.ActionDefer || !strings.Contains(d.Reason, want) {
			t.Fatalf("%s: %s (%s), want a deferral: %s", nc, d.Action, d.Reason, want)
		}
		// The record holds the event: give it the body AWS Health would have sent.
		ev.Body = []byte(fmt.Sprintf(`{"version":"0","id":%q,"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","time":"2026-11-21T10:00:00Z","region":"eu-west-1","resources":[%q],"detail":{"eventArn":%q,"service":"EC2","eventTypeCode":%q,"eventTypeCategory":"scheduledChange","statusCode":"upcoming","startTime":%q,"affectedEntities":[{"entityValue":%q}]}}`,
			ev.ID, "i-"+nc, ev.Health.EventARN, ev.Health.TypeCode, week.Format(time.RFC1123), "i-"+nc))
		ev.Instances = []string{"i-" + nc}
		if _, err := sig.Defer(ctx, ev, d, resolved(nc), false); err != nil {
			t.Fatal(err)
		}
	}
	deferTo("kafka-b", retirement("ev-window"), policy.Decide(retirement("ev-window"), target("kafka-b", 1), now), "waiting for the maintenance window")
	// kafka-c: a system reboot the pool drains at once, held by pacing (kafka-a is in flight).
	reboot := retirement("ev-reboot")
	reboot.Health.Scheduled = event.ScheduledSystemReboot
	deferTo("kafka-c", reboot, policy.Decide(reboot, target("kafka-c", 1), now), "held by max-concurrent-drains")
	// kafka-d: a reboot whose replacement image is still being built: held by the AMI check.
	reboot2 := retirement("ev-check")
	reboot2.Health.Scheduled = event.ScheduledSystemReboot
	dc := policy.ApplyChecks(policy.Decide(reboot2, target("kafka-d", 0), now), reboot2, kafka,
		[]policy.Check{{Name: "ami", Reason: "image ami-0e1f2a3b4c5d6e7f8 is pending, not available"}}, now)
	deferTo("kafka-d", reboot2, dc, "replacement is sound")
	// batch-a: deleted by someone else (kubectl delete, a Karpenter disruption).
	if err := kube.Delete(ctx, claims["batch-a"]); err != nil {
		t.Fatal(err)
	}

	rep, err := status.Read(ctx, kube, now, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.NodePools) != 3 || rep.NodePools[0].Name != "batch" || rep.NodePools[1].Name != "kafka" || rep.NodePools[2].Name != "web" {
		t.Fatalf("pools: %+v", rep.NodePools)
	}
	k := rep.NodePools[1]
	if k.Nodes != 4 || k.DrainsInFlight != 1 || k.DrainLimit == nil || *k.DrainLimit != 1 || len(k.Drains) != 1 ||
		k.Drains[0].NodeClaim != "kafka-a" || !k.Drains[0].Deleting || k.Drains[0].Since == nil {
		t.Errorf("kafka drains: %+v", k)
	}
	holds := map[string]string{}
	for _, d := range k.Deferred {
		holds[d.NodeClaim] = d.Hold + " " + d.Until.Format(time.RFC3339)
	}
	want := map[string]string{
		"kafka-b": "window 2026-11-28T02:00:00Z",
		"kafka-c": "pacing " + week.Add(-time.Hour).Format(time.RFC3339), // deadline minus drain-lead
		"kafka-d": "check " + now.Add(policy.CheckRecheck).Format(time.RFC3339),
	}
	if len(holds) != 3 || holds["kafka-b"] != want["kafka-b"] || holds["kafka-c"] != want["kafka-c"] || holds["kafka-d"] != want["kafka-d"] {
		t.Errorf("kafka deferred: %v, want %v", holds, want)
	}
	if k.Window == nil || k.Window.Open || k.Window.Next == nil || !k.Window.Next.Equal(time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)) {
		t.Errorf("kafka window: %+v", k.Window)
	}
	if b := rep.NodePools[0]; b.Nodes != 2 || b.DrainsInFlight != 1 || b.DrainLimit == nil || *b.DrainLimit != 1 || !b.Drains[0].Deleting || b.Drains[0].EventID != "" {
		t.Errorf("batch: %+v", b)
	}
	if w := rep.NodePools[2]; w.Nodes != 1 || w.DrainsInFlight != 0 || w.DrainLimit != nil || len(w.Deferred) != 0 || w.Window != nil {
		t.Errorf("web: %+v", w)
	}

	// The command, as a kubectl plugin.
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "health-router"), "./cmd/health-router")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building health-router: %v\n%s", err, out)
	}
	if err := os.Symlink(filepath.Join(bin, "health-router"), filepath.Join(bin, "kubectl-health_router")); err != nil {
		t.Fatal(err)
	}
	user, err := env.AddUser(envtest.User{Name: "oncall", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) (string, string, error) {
		cmd := exec.Command("kubectl", args...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kcPath)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}
	out, errOut, err := kubectl("health-router", "status", "--now", now.Format(time.RFC3339))
	if err != nil {
		t.Fatalf("kubectl health-router status: %v\n%s%s", err, out, errOut)
	}
	// The shadow report of a release with no ledger (issue 38, 13): not "no pool is in
	// shadow" and exit 0, but the ledger not found, and a non-zero exit.
	shadowOut, shadowErr, err := kubectl("health-router", "status", "--shadow", "-n", "not-the-routers", "--shadow-ledger", "not-the-routers")
	if err == nil || !strings.Contains(shadowErr, "no shadow ledger ledger.not-the-routers (nor, of a router before the store, the ConfigMap not-the-routers/not-the-routers)") || strings.Contains(shadowOut, "no pool is in shadow") {
		t.Errorf("status --shadow in the wrong namespace: %v\nstdout %q\nstderr %q", err, shadowOut, shadowErr)
	}
	for _, w := range []string{
		"NodePool kafka (4 NodeClaims)",
		`policy:    defer (scheduled-change.system-reboot=drain); window "0 2 * * 6" for 4h0m0s; drain-lead 1h0m0s; restart-grace 15m0s; max-concurrent-drains 1`,
		"window:    closed; opens 2026-11-28 02:00 UTC (in 6d14h) for 4h0m0s",
		"drains:    1 in flight (limit 1, FULL: further drains wait)",
		"deferred:  3 events: 1 HELD BY A CHECK (replacement not sound), 1 waiting for the window, 1 held by max-concurrent-drains; next at 2026-11-21 12:05 UTC",
		"NodePool batch (2 NodeClaims)",
		"NodePool web (1 NodeClaim)",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("kubectl health-router status lacks %q:\n%s", w, out)
		}
	}
	// The rows, whatever the column widths.
	for claim, fields := range map[string][]string{
		// A drain in delete-nodeclaim mode with no deferral to clear is a DELETE alone: since
		// its deletion (the API server's clock), with no event ID.
		"kafka-a": {"ip-10-0-1-kafka-a", "deleting", "UTC"},
		"kafka-b": {"scheduled-change", "2026-11-28 02:00 UTC (in 6d14h)", "window", "ev-window", "waiting for the maintenance window"},
		"kafka-c": {"2026-11-28 11:00 UTC (in 6d23h)", "pacing", "ev-reboot", "held by max-concurrent-drains 1"},
		"kafka-d": {"2026-11-21 12:05 UTC (in 5m)", "check", "ev-check", "ami: image ami-0e1f2a3b4c5d6e7f8 is pending"},
		"batch-a": {"deleting", "-"},
	} {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), claim+" ") {
				line = l
			}
		}
		rest := line
		for _, f := range fields {
			i := strings.Index(rest, f)
			if i < 0 {
				t.Errorf("row %s lacks %q (in order): %q", claim, f, line)
				break
			}
			rest = rest[i+len(f):]
		}
	}
	if strings.Contains(errOut, "was never called") || strings.Contains(errOut, "goroutine") {
		t.Errorf("stderr:\n%s", errOut)
	}
	out, errOut, err = kubectl("health-router", "status", "--nodepool", "kafka", "-o", "json", "--now", now.Format(time.RFC3339))
	if err != nil {
		t.Fatalf("-o json: %v\n%s", err, errOut)
	}
	var got status.Report
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	wantJSON, _ := json.Marshal(status.Report{Now: now, NodePools: []status.NodePool{k}})
	gotJSON, _ := json.Marshal(got)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("--nodepool kafka -o json:\n got %s\nwant %s", gotJSON, wantJSON)
	}
	if _, errOut, err := kubectl("health-router", "status", "--nodepool", "nosuch"); err == nil || !strings.Contains(errOut, "nodepool nosuch") || !strings.Contains(errOut, "not found") {
		t.Errorf("a missing nodepool: %v, %s", err, errOut)
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
