package app

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/test/harness"
)

// The readiness hook posts a Warning Event naming the queue and the error on the router's
// own Pod, bound to its UID (so that kubectl describe pod shows it), and a Normal one when
// the queues are usable again: on envtest's API server.
func TestPodEvents(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	restCfg := harness.KubeAPIServer(t)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "health-router"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "health-router-7d9f-abcde"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "health-router", Image: "health-router"}}}}
	for _, o := range []client.Object{ns, pod} {
		if err := kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := events.NewEventBroadcasterAdapter(cs)
	broadcaster.StartRecordingToSink(ctx.Done())
	t.Cleanup(broadcaster.Shutdown)
	hook := podEvents(ctx, kube, broadcaster.NewRecorder("health-router"), ns.Name, pod.Name, slog.New(slog.NewTextHandler(io.Discard, nil)))

	const reason = "intake queue https://sqs.eu-west-1.amazonaws.com/123456789012/hr-intake: does not exist: QueueDoesNotExist"
	hook(false, reason)
	hook(true, "")
	var got []eventsv1.Event
	for deadline := time.Now().Add(30 * time.Second); len(got) < 2; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Events on the Pod: %+v", got)
		}
		var list eventsv1.EventList
		if err := kube.List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
			t.Fatal(err)
		}
		got = list.Items
	}
	byReason := map[string]eventsv1.Event{}
	for _, e := range got {
		if e.Regarding.Kind != "Pod" || e.Regarding.Name != pod.Name || e.Regarding.UID != pod.UID {
			t.Errorf("Event %s regards %+v, not the Pod %s (%s)", e.Reason, e.Regarding, pod.Name, pod.UID)
		}
		byReason[e.Reason] = e
	}
	if e := byReason[ReasonQueueUnusable]; e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, reason) {
		t.Errorf("NotReady Event: %+v", e)
	}
	if e := byReason[ReasonQueueUsable]; e.Type != corev1.EventTypeNormal {
		t.Errorf("ready Event: %+v", e)
	}
}
