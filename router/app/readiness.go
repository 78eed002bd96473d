package app

import (
	"context"
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Reasons of the Events on the router's own Pod when its queues turn it NotReady and back.
const (
	ReasonQueueUnusable = "QueueUnusable"
	ReasonQueueUsable   = "QueueUsable"
)

// podEvents returns the readiness hook (intake.Readiness.OnChange) that posts an Event on the
// router's own Pod: kubectl describe pod then shows why it is NotReady next to the kubelet's
// "Readiness probe failed", whose probe answer withholds the reason. The Pod is read (for
// its UID, which kubectl describe matches Events by) when the Event is posted.
func podEvents(ctx context.Context, reader client.Reader, recorder events.EventRecorder, namespace, name string, log *slog.Logger) func(bool, string) {
	return func(ready bool, reason string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
		if err := reader.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			log.Error("reading the router's own Pod for its readiness Event; posting it by name", "pod", namespace+"/"+name, "err", err)
			pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		}
		if ready {
			recorder.Eventf(pod, nil, corev1.EventTypeNormal, ReasonQueueUsable, "CheckQueues", "every queue is usable again: ready")
			return
		}
		recorder.Eventf(pod, nil, corev1.EventTypeWarning, ReasonQueueUnusable, "CheckQueues", "NotReady until mended: %s", truncate(reason))
	}
}

// truncate keeps a note within the API server's limit for an Event's note (1 kB).
func truncate(s string) string {
	const max = 1000
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max-3], "") + "..."
}
