package nodedrain

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/record"
)

// ReasonNodeDrainNotAdopted (Warning): a router that starts beside a drain routers before the
// store kept on the Node (AnnotationNodeDrain) did not adopt it, as EC2 schedules nothing for
// the instance and it runs: the annotation is removed and the Node left as it is (a cordon
// stays: the annotation, which anyone with `patch nodes` writes, cannot say who set it).
const ReasonNodeDrainNotAdopted = "HealthEventNodeDrainNotAdopted"

// statusAPI is the part of EC2 adoption asks: what is scheduled for an instance now, and
// whether it runs.
type statusAPI interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// Adopted is what Adopt did: drains moved into the store (Kept), ended because EC2 confirms
// nothing they were for (Ended), and annotations removed beside a record the store holds
// already, or that held no drain (a close, a running) or did not parse (Removed).
type Adopted struct{ Kept, Ended, Removed int }

// adoptPage is how many Nodes one list of Adopt asks for.
const adoptPage = 500

// Adopt moves, once, the drains routers before the store kept on Nodes (AnnotationNodeDrain)
// into the store and removes the key. Nothing is taken on the annotation's word, which anyone
// with `patch nodes` can write: a drain is adopted only while EC2 still schedules an event for
// the Node's instance, or the instance is not running; otherwise it ends, with a Warning Event
// on the Node, and the Node is left as it is: its `cordoned` may be a forger's, and lifting an
// operator's cordon on its word would take an order from it (kubectl uncordon, if it was ours). A
// close or a running the annotation kept is not adopted (it would only hide a real event). A
// Node whose HealthRecord holds a drain already only loses the key. EC2 unanswered: nothing is
// adopted, the keys stay for the next try.
//
// kube writes; api reads from the API server (the router's cache drops the key).
func Adopt(ctx context.Context, kube client.Client, api client.Reader, ec2API statusAPI, rec events.EventRecorder, log *slog.Logger) (Adopted, error) {
	var res Adopted
	nodes, err := withOldKey(ctx, api)
	if err != nil || len(nodes) == 0 {
		return res, err
	}
	store := record.NewStore(kube, api)
	for _, n := range nodes {
		old, ok, derr := FromAnnotation(n)
		mem, err := record.Load(ctx, api, record.NodeRecordName(n.Name))
		if err != nil {
			return res, err
		}
		if derr != nil || !ok || old.Closed || old.Running || len(mem.NodeDrain) > 0 {
			if err := removeOldKey(ctx, kube, n); err != nil {
				return res, err
			}
			res.Removed++
			continue
		}
		id := cluster.InstanceID(n.Spec.ProviderID)
		owed, why, err := owed(ctx, ec2API, id)
		if err != nil {
			return res, fmt.Errorf("asking EC2 about instance %s of node %s before adopting its drain: %w", id, n.Name, err)
		}
		if owed {
			// The record is the router's from now on; the cordon stays as it is.
			if err := store.UpdateNode(ctx, n, func(m *record.Memory) (bool, error) {
				if len(m.NodeDrain) > 0 {
					return false, nil
				}
				put(m, old)
				return true, nil
			}); err != nil {
				return res, fmt.Errorf("adopting the drain of node %s: %w", n.Name, err)
			}
			if err := removeOldKey(ctx, kube, n); err != nil {
				return res, err
			}
			res.Kept++
			log.Info("adopted a node drain from the old annotation", "node", n.Name, "instance", id, "event_id", old.EventID, "kind", old.Kind, "why", why)
			continue
		}
		if err := removeOldKey(ctx, kube, n); err != nil {
			return res, err
		}
		res.Ended++
		how := "left as it is"
		if n.Spec.Unschedulable {
			how = "left cordoned (the annotation cannot say who cordoned it: kubectl uncordon " + n.Name + " if an earlier router's drain did)"
		}
		rec.Eventf(n, nil, corev1.EventTypeWarning, ReasonNodeDrainNotAdopted, eventAction,
			"%s (%s): the drain recorded in %s was not adopted at an upgrade: %s; the annotation is removed, and the node %s", old.Kind, old.EventID, AnnotationNodeDrain, why, how)
		log.Warn("node drain not adopted from the old annotation", "node", n.Name, "instance", id, "event_id", old.EventID, "kind", old.Kind, "why", why, "cordoned", n.Spec.Unschedulable)
	}
	return res, nil
}

// owed reports whether EC2 shows a reason to drain the instance id: an event scheduled for it
// (neither completed nor cancelled), or the instance not running. An instance EC2 does not know
// (or a Node without one) is owed nothing: the drain would only evict pods from a Node whose
// instance is gone.
func owed(ctx context.Context, api statusAPI, id string) (bool, string, error) {
	if id == "" {
		return false, "the node names no EC2 instance", nil
	}
	out, err := api.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{InstanceIds: []string{id}, IncludeAllInstances: aws.Bool(true)})
	if err != nil {
		if strings.Contains(err.Error(), "InvalidInstanceID.NotFound") {
			return false, "EC2 does not know instance " + id, nil
		}
		return false, "", err
	}
	for _, st := range out.InstanceStatuses {
		for _, e := range st.Events {
			if e.NotBefore == nil || event.ClosedDescription(aws.ToString(e.Description)) {
				continue
			}
			return true, "EC2 schedules " + string(e.Code) + " for instance " + id, nil
		}
		if st.InstanceState != nil && st.InstanceState.Name != ec2types.InstanceStateNameRunning {
			return true, "instance " + id + " is " + string(st.InstanceState.Name), nil
		}
	}
	return false, "EC2 schedules nothing for instance " + id + " and it runs", nil
}

// withOldKey returns the Nodes that carry AnnotationNodeDrain, read from api: their metadata
// only, a page at a time, and in full only the few that carry the key.
func withOldKey(ctx context.Context, api client.Reader) ([]*corev1.Node, error) {
	var out []*corev1.Node
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	for {
		if err := api.List(ctx, list, client.Limit(adoptPage), client.Continue(list.Continue)); err != nil {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		for _, m := range list.Items {
			if _, ok := m.Annotations[AnnotationNodeDrain]; !ok {
				continue
			}
			n := &corev1.Node{}
			switch err := api.Get(ctx, client.ObjectKey{Name: m.Name}, n); {
			case apierrors.IsNotFound(err):
				continue // gone meanwhile: nothing to adopt
			case err != nil:
				return nil, fmt.Errorf("reading node %s: %w", m.Name, err)
			}
			out = append(out, n)
		}
		if list.Continue == "" {
			return out, nil
		}
	}
}

// removeOldKey removes AnnotationNodeDrain from n (under its resource version: a Node changed
// since it was read is read again at the next try).
func removeOldKey(ctx context.Context, kube client.Client, n *corev1.Node) error {
	body := map[string]any{"metadata": map[string]any{
		"resourceVersion": n.ResourceVersion,
		"annotations":     map[string]any{AnnotationNodeDrain: nil},
	}}
	patch, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if err := kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing %s from node %s: %w", AnnotationNodeDrain, n.Name, err)
	}
	return nil
}
