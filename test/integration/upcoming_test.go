package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/options"
	"github.com/health-router/health-router/router/podnotice"
	"github.com/health-router/health-router/router/policy"
	"github.com/health-router/health-router/router/record"
	"github.com/health-router/health-router/router/signal"
	"github.com/health-router/health-router/router/upcoming"
	"github.com/health-router/health-router/test/harness"
)

// marksAndNotices turns on what an Options built in code leaves off (the flags' defaults turn them on):
// the node marks and the pod Events.
func marksAndNotices(perEvent int) func(*options.Run) {
	return func(o *options.Run) { o.NodeMarks, o.PodEventsPerEvent = true, perEvent }
}

// windowPool returns a pool's annotations that defer scheduled changes to a daily one-hour
// window about twelve hours away, and that window's next start.
func windowPool(now time.Time, taint bool) (map[string]string, time.Time) {
	hour := (now.UTC().Hour() + 12) % 24
	next := time.Date(now.UTC().Year(), now.UTC().Month(), now.UTC().Day(), hour, 0, 0, 0, time.UTC)
	if !next.After(now) {
		next = next.Add(24 * time.Hour)
	}
	ann := map[string]string{
		policy.AnnotationAction:         string(policy.ActionDefer),
		policy.AnnotationWindowSchedule: fmt.Sprintf("0 %d * * *", hour),
		policy.AnnotationWindowDuration: "1h",
	}
	if taint {
		ann[policy.AnnotationTaintUpcoming] = "true"
	}
	return ann, next
}

func nodeName(id string) string { return "ip-" + id[len(id)-8:] }

func (s *stage) nodeObj(name string) *corev1.Node {
	s.t.Helper()
	n := &corev1.Node{}
	if err := s.kube.Get(s.ctx, client.ObjectKey{Name: name}, n); err != nil {
		s.t.Fatalf("node %s: %v", name, err)
	}
	return n
}

func (s *stage) namespace(name string) {
	s.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// pod creates a pod bound to node (envtest has no scheduler and no kubelet: it stays Pending,
// which a drain would evict all the same); a daemon pod is a DaemonSet's, which a drain leaves.
func (s *stage) pod(namespace, name, node string, daemon bool) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}}}
	if daemon {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "node-exporter",
			UID: types.UID("6f1c7a52-0000-4000-8000-000000000001"), Controller: ptr.To(true)}}
	}
	s.create(p)
}

// eventsOf lists the events.k8s.io Events of a namespace with a reason.
func (s *stage) eventsOf(namespace, reason string) []eventsv1.Event {
	s.t.Helper()
	var evs eventsv1.EventList
	if err := s.kube.List(s.ctx, &evs, client.InNamespace(namespace)); err != nil {
		s.t.Fatalf("listing events of %s: %v", namespace, err)
	}
	return slices.DeleteFunc(evs.Items, func(e eventsv1.Event) bool { return e.Reason != reason })
}

// activeRecord returns the one active record of a NodeClaim, or false.
func (s *stage) activeRecord(claim string) (record.Record, bool) {
	set := s.memory(claim).Set()
	active := set.Active()
	if len(active) != 1 {
		return record.Record{}, false
	}
	return active[0], true
}

var dedicated = corev1.Taint{Key: "dedicated", Value: "kafka", Effect: corev1.TaintEffectNoSchedule}

// TestNodeMarks runs the live router (app.Run) on moto and envtest, and reads what it shows
// on Nodes (router/upcoming) and tells pods (router/podnotice).
func TestNodeMarks(t *testing.T) {
	s := newStage(t)

	t.Run("marks follow the outcome", func(t *testing.T) {
		s.t = t
		ann, window := windowPool(time.Now(), true)
		s.pool("kafka", ann)
		ann, _ = windowPool(time.Now(), false)
		s.pool("web", ann)
		kafka, web := s.node("kafka", "i-0c1d2e3f4a5b60001"), s.node("web", "i-0c1d2e3f4a5b60002")
		kafkaNode, webNode := nodeName("i-0c1d2e3f4a5b60001"), nodeName("i-0c1d2e3f4a5b60002")
		// What others put on the Node stays whatever the router marks.
		n := s.nodeObj(kafkaNode)
		n.Labels["team"] = "streaming"
		n.Spec.Taints = append(n.Spec.Taints, dedicated)
		if err := s.kube.Update(s.ctx, n); err != nil {
			t.Fatal(err)
		}
		// The API server adds node.kubernetes.io/not-ready itself: the taints before the router.
		theirs := s.nodeObj(kafkaNode).Spec.Taints
		if !slices.Contains(theirs, dedicated) {
			t.Fatalf("taints before the router: %v", theirs)
		}
		s.router(signal.ModeDeleteNodeClaim, marksAndNotices(podnotice.DefaultPerEvent))

		start := time.Now().Add(10 * 24 * time.Hour)
		arn := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/marks-1"
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start, "upcoming", arn, "i-0c1d2e3f4a5b60001", "i-0c1d2e3f4a5b60002"))

		// Each node is marked with its record: the label at its Until, the annotation naming the event.
		for _, c := range []struct {
			claim, node string
			taint       bool
		}{{kafka, kafkaNode, true}, {web, webNode, false}} {
			var rec record.Record
			s.eventually("a window deferral of "+c.claim, 60*time.Second, func() bool {
				var ok bool
				rec, ok = s.activeRecord(c.claim)
				return ok
			})
			if rec.Hold != policy.HoldWindow || !rec.Until.Equal(window) {
				t.Fatalf("%s deferred with hold %q until %s, want the window at %s", c.claim, rec.Hold, rec.Until, window)
			}
			want := strconv.FormatInt(rec.Until.Unix(), 10)
			var m upcoming.Marks
			s.eventually("the marks on node "+c.node, 60*time.Second, func() bool {
				m = upcoming.Current(s.nodeObj(c.node))
				return m.At == want && m.Annotation != "" && (m.Taint != "") == c.taint
			})
			var p upcoming.Pending
			if err := json.Unmarshal([]byte(m.Annotation), &p); err != nil {
				t.Fatalf("annotation %s of %s: %v", upcoming.AnnotationMaintenance, c.node, err)
			}
			if p.Event != rec.EventID || p.Kind != string(event.KindScheduledChange) || p.Decision != string(policy.ActionDefer) ||
				p.Hold != string(policy.HoldWindow) || !p.Until.Equal(rec.Until) || p.Records != 1 {
				t.Errorf("annotation of %s: %+v, want the record %s (until %s)", c.node, p, rec.EventID, rec.Until)
			}
			if c.taint && m.Taint != string(event.KindScheduledChange) {
				t.Errorf("taint of %s: value %q, want %q", c.node, m.Taint, event.KindScheduledChange)
			}
		}
		n = s.nodeObj(kafkaNode)
		if n.Labels["team"] != "streaming" || !slices.Contains(n.Spec.Taints, dedicated) {
			t.Errorf("the router's marks took others' away: labels %v, taints %v", n.Labels, n.Spec.Taints)
		}
		if w := s.nodeObj(webNode); slices.ContainsFunc(w.Spec.Taints, func(t corev1.Taint) bool { return t.Key == upcoming.TaintKey }) {
			t.Errorf("node %s of a pool without taint-upcoming is tainted: %v", webNode, w.Spec.Taints)
		}

		// AWS closes the event: the records end and every mark goes; the other taint stays.
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start, "closed", arn, "i-0c1d2e3f4a5b60001", "i-0c1d2e3f4a5b60002"))
		for _, c := range []struct{ claim, node string }{{kafka, kafkaNode}, {web, webNode}} {
			s.eventually("the deferral of "+c.claim+" cancelled", 60*time.Second, func() bool {
				set := s.memory(c.claim).Set()
				return len(set.Active()) == 0 && slices.ContainsFunc(set.Records, func(r record.Record) bool { return r.State == record.StateCancelled })
			})
			s.eventually("the marks gone from "+c.node, 60*time.Second, func() bool { return upcoming.Current(s.nodeObj(c.node)).None() })
		}
		n = s.nodeObj(kafkaNode)
		if n.Labels["team"] != "streaming" || !equality.Semantic.DeepEqual(n.Spec.Taints, theirs) {
			t.Errorf("after the marks went: labels %v, taints %v (want %v)", n.Labels, n.Spec.Taints, theirs)
		}

		// A new deferral (another maintenance: the cancelled one's time is remembered as done)
		// marks the node again; turning taint-upcoming off takes the taint alone.
		arn2 := "arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/marks-2"
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start.Add(24*time.Hour), "upcoming", arn2, "i-0c1d2e3f4a5b60001"))
		var marked upcoming.Marks
		s.eventually("node "+kafkaNode+" marked and tainted again", 60*time.Second, func() bool {
			marked = upcoming.Current(s.nodeObj(kafkaNode))
			return marked.At != "" && marked.Annotation != "" && marked.Taint != ""
		})
		np := &karpv1.NodePool{}
		if err := s.kube.Get(s.ctx, client.ObjectKey{Name: "kafka"}, np); err != nil {
			t.Fatal(err)
		}
		base := np.DeepCopy()
		np.Annotations[policy.AnnotationTaintUpcoming] = "false"
		if err := s.kube.Patch(s.ctx, np, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
		s.eventually("the taint gone from "+kafkaNode, 60*time.Second, func() bool { return upcoming.Current(s.nodeObj(kafkaNode)).Taint == "" })
		n = s.nodeObj(kafkaNode)
		if m := upcoming.Current(n); m.At != marked.At || m.Annotation != marked.Annotation {
			t.Errorf("turning the taint off changed the other marks: %+v, was %+v", m, marked)
		}
		if !equality.Semantic.DeepEqual(n.Spec.Taints, theirs) {
			t.Errorf("taints after taint-upcoming=false: %v, want %v", n.Spec.Taints, theirs)
		}
		if _, ok := s.activeRecord(kafka); !ok {
			t.Error("turning the taint off ended the deferral")
		}
	})

	t.Run("pods are told of a deferral and of a drain", func(t *testing.T) {
		s.t = t
		ann, window := windowPool(time.Now(), false)
		s.pool("ledger", ann)
		s.pool("spot", nil)
		ledger := s.node("ledger", "i-0c1d2e3f4a5b60011")
		spot := s.spotNode("spot", "i-0c1d2e3f4a5b60012")
		ledgerNode, spotNode := nodeName("i-0c1d2e3f4a5b60011"), nodeName("i-0c1d2e3f4a5b60012")
		s.namespace("payments")
		s.pod("payments", "ledger-0", ledgerNode, false)
		s.pod("payments", "ledger-1", ledgerNode, false)
		s.pod("payments", "node-exporter-ledger", ledgerNode, true)
		s.pod("payments", "checkout-0", spotNode, false)
		s.pod("payments", "node-exporter-spot", spotNode, true)
		s.router(signal.ModeDeleteNodeClaim, marksAndNotices(podnotice.DefaultPerEvent))

		start := time.Now().Add(10 * 24 * time.Hour)
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", start, "upcoming",
			"arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/pods-1", "i-0c1d2e3f4a5b60011"))
		s.put("aws.ec2", "EC2 Spot Instance Interruption Warning", map[string]string{"instance-id": "i-0c1d2e3f4a5b60012", "instance-action": "terminate"})
		s.eventually("the ledger node deferred", 60*time.Second, func() bool { _, ok := s.activeRecord(ledger); return ok })
		s.eventually("the spot node drained", 60*time.Second, func() bool { return !s.claim(spot).DeletionTimestamp.IsZero() })

		// byPod waits for one Event of reason on each of pods, and returns them by pod.
		byPod := func(reason string, pods ...string) map[string]eventsv1.Event {
			got := map[string]eventsv1.Event{}
			s.eventually(fmt.Sprintf("%s Events on %v", reason, pods), 60*time.Second, func() bool {
				clear(got)
				for _, e := range s.eventsOf("payments", reason) {
					got[e.Regarding.Name] = e
				}
				return len(got) >= len(pods)
			})
			return got
		}
		deferred := byPod(podnotice.ReasonDeferred, "ledger-0", "ledger-1")
		drained := byPod(podnotice.ReasonDrain, "checkout-0")
		planned := window.UTC().Format(time.RFC3339)
		for _, name := range []string{"ledger-0", "ledger-1"} {
			e, ok := deferred[name]
			if !ok {
				t.Errorf("no %s Event on pod %s (got %v)", podnotice.ReasonDeferred, name, keys(deferred))
				continue
			}
			if e.Regarding.Kind != "Pod" || e.Regarding.Namespace != "payments" || !strings.Contains(e.Note, planned) || !strings.Contains(e.Note, ledgerNode) {
				t.Errorf("Event on %s: regarding %+v, note %q; want the pod, the node and the planned time %s", name, e.Regarding, e.Note, planned)
			}
		}
		if e, ok := drained["checkout-0"]; !ok || e.Regarding.Kind != "Pod" || !strings.Contains(e.Note, spotNode) || !strings.Contains(e.Note, string(event.KindSpotInterruption)) {
			t.Errorf("drain Event on checkout-0: %+v (present %v)", e, ok)
		}
		if len(deferred) != 2 || len(drained) != 1 {
			t.Errorf("pods told: deferred %v, drained %v; want ledger-0 and ledger-1, checkout-0", keys(deferred), keys(drained))
		}
		// The DaemonSet's pods stay through a drain: nothing is said to them. Their Events
		// would have been written with their nodes' others, which are all in by now. Each
		// pod is told once: one Event, no repeat counted in a series.
		time.Sleep(2 * time.Second)
		for reason, want := range map[string][]string{podnotice.ReasonDeferred: {"ledger-0", "ledger-1"}, podnotice.ReasonDrain: {"checkout-0"}} {
			var got []string
			for _, e := range s.eventsOf("payments", reason) {
				got = append(got, e.Regarding.Name)
				if e.Series != nil {
					t.Errorf("%s on %s repeated: series %+v", reason, e.Regarding.Name, e.Series)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s Events on %v, want one on each of %v (none on the DaemonSet's pods)", reason, got, want)
			}
		}
	})

	t.Run("a bulk event stays under the bound", func(t *testing.T) {
		s.t = t
		const perEvent, nodes, podsPerNamespace = 10, 8, 2
		ann, _ := windowPool(time.Now(), false)
		s.pool("batch", ann)
		namespaces := []string{"bulk-a", "bulk-b"}
		for _, ns := range namespaces {
			s.namespace(ns)
		}
		var ids []string
		for i := range nodes {
			id := fmt.Sprintf("i-0c1d2e3f4a5b6%04d", 100+i)
			ids = append(ids, id)
			s.node("batch", id)
			for _, ns := range namespaces {
				for j := range podsPerNamespace {
					s.pod(ns, fmt.Sprintf("job-%d-%d", i, j), nodeName(id), false)
				}
			}
		}
		pods := nodes * len(namespaces) * podsPerNamespace

		// One Health event names every node. Its message is kept as SQS delivers it, to be
		// delivered again below (SQS and EventBridge deliver at least once).
		s.put("aws.health", "AWS Health Event", health("AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED", time.Now().Add(10*24*time.Hour), "upcoming",
			"arn:aws:health:eu-west-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/bulk-1", ids...))
		msg, err := s.sqs.ReceiveMessage(s.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.intakeURL), MaxNumberOfMessages: 1, WaitTimeSeconds: 5})
		if err != nil {
			t.Fatalf("the Health event in the intake queue: %v", err)
		}
		if len(msg.Messages) != 1 {
			t.Fatalf("the Health event in the intake queue: %d messages, want 1", len(msg.Messages))
		}
		body := aws.ToString(msg.Messages[0].Body)
		if _, err := s.sqs.ChangeMessageVisibility(s.ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(s.intakeURL),
			ReceiptHandle: msg.Messages[0].ReceiptHandle, VisibilityTimeout: 0}); err != nil {
			t.Fatal(err)
		}
		s.router(signal.ModeDeleteNodeClaim, marksAndNotices(perEvent))

		// told counts the pod Events and reads the summaries; ok when the bound is met exactly
		// and every pod past it is counted once.
		var last string
		defer func() {
			if t.Failed() {
				t.Logf("last seen: %s", last)
			}
		}()
		check := func() (ok bool, problems []string) {
			told, counted := 0, 0
			for _, ns := range namespaces {
				for _, e := range s.eventsOf(ns, podnotice.ReasonDeferred) {
					told++
					if e.Regarding.Kind != "Pod" || e.Series != nil {
						problems = append(problems, fmt.Sprintf("pod Event %s: regarding %s/%s, series %+v", e.Name, e.Regarding.Kind, e.Regarding.Name, e.Series))
					}
				}
				sums := s.eventsOf(ns, podnotice.ReasonSummary)
				if len(sums) != 1 {
					problems = append(problems, fmt.Sprintf("%d summary Events in %s", len(sums), ns))
					continue
				}
				e := sums[0]
				if e.Regarding.Kind != "Namespace" || e.Regarding.Name != ns || e.Namespace != ns || e.Series != nil {
					problems = append(problems, fmt.Sprintf("summary in %s: regarding %+v, in %s, series %+v", ns, e.Regarding, e.Namespace, e.Series))
				}
				var n int
				if _, err := fmt.Sscanf(e.Note, "%d pods of this namespace", &n); err != nil {
					problems = append(problems, fmt.Sprintf("summary note in %s: %q", ns, e.Note))
				}
				counted += n
			}
			if told > perEvent {
				problems = append(problems, fmt.Sprintf("%d pod Events for one event, over the bound of %d", told, perEvent))
			}
			last = fmt.Sprintf("%d pod Events, %d pods counted in summaries, problems %v", told, counted, problems)
			return told == perEvent && counted == pods-perEvent && len(problems) == 0, problems
		}
		s.eventually(fmt.Sprintf("%d pod Events and summaries counting the other %d pods", perEvent, pods-perEvent), 60*time.Second, func() bool {
			ok, _ := check()
			return ok
		})

		// The same message again: it decides nothing new, and tells nothing more.
		s.putRaw(body)
		s.eventually("the redelivery handled", 60*time.Second, func() bool { v, f := s.queueCounts(s.intakeURL); return v == 0 && f == 0 })
		time.Sleep(3 * time.Second) // anything it would tell is written by now
		if ok, problems := check(); !ok {
			t.Errorf("after a redelivery: %s %v", last, problems)
		}
	})
}

// TestSummaryInPlace drives the notifier itself against the API server: whether a summary
// is written once or grows over several flushes depends, in the live router, on how its
// queue runs empty; here it grows for certain. The API server keeps an events.k8s.io Event's
// note immutable: the rewrite must still land, on the one Event.
func TestSummaryInPlace(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest suite")
	}
	cfg := harness.KubeAPIServer(t)
	scheme, err := cluster.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	kube, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	s := &stage{t: t, ctx: context.Background(), restCfg: cfg, kube: kube}
	s.namespace("grow")
	for node := range 3 {
		for i := range 2 {
			s.pod("grow", fmt.Sprintf("p-%d-%d", node, i), fmt.Sprintf("node-%d", node), false)
		}
	}
	n := podnotice.New(kube, events.NewFakeRecorder(100), clock.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, podnotice.Options{PerEvent: 2})
	notice := podnotice.Notice{EventID: "ev-grow", Kind: event.KindScheduledChange, Action: policy.ActionDefer, Hold: policy.HoldWindow,
		Until: time.Now().Add(12 * time.Hour), NodePool: "batch"}
	for node, want := range []string{"", "2 pods of this namespace on 1 nodes", "4 pods of this namespace on 2 nodes"} {
		notice.Node = fmt.Sprintf("node-%d", node)
		n.Handle(s.ctx, notice)
		n.Flush(s.ctx)
		sums := s.eventsOf("grow", podnotice.ReasonSummary)
		switch {
		case want == "" && len(sums) != 0:
			t.Fatalf("after node-%d: %d summaries, want none", node, len(sums))
		case want != "" && (len(sums) != 1 || !strings.HasPrefix(sums[0].Note, want)):
			t.Fatalf("after node-%d: summaries %+v, want one starting %q", node, sums, want)
		case want != "" && (sums[0].Regarding.Kind != "Namespace" || sums[0].Regarding.Name != "grow" || sums[0].Series != nil):
			t.Errorf("summary: regarding %+v, series %+v", sums[0].Regarding, sums[0].Series)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
