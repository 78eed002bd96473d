package record

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/event"
)

// AnnotationDrainSignalled held the drain stamp before the store (Memory.Drain), and
// AnnotationRun a reboot in place's run on the NodeClaim (Memory.Run; router/inplace keeps
// the key for the Node's part of a run, on the Node).
const (
	AnnotationDrainSignalled = "healthrouter.io/drain-signalled"
	AnnotationRun            = "healthrouter.io/in-place"
	// AnnotationShadow held a pool in shadow's would-be outcomes (Memory.Shadow): told only,
	// never adopted; removed at an upgrade.
	AnnotationShadow = "healthrouter.io/shadow"
)

// adoptPage is how many NodeClaims one list of WithOldKeys asks for.
const adoptPage = 500

// WithOldKeys returns the NodeClaims that carry any of keys, read from api (the API server:
// the router's cache drops the old keys). It lists their metadata only, a page at a time, and
// reads in full only the few that carry a key: at a start among 100,000 NodeClaims a full list
// decoded every spec and status, twice (deferrals and runs), beside the first events' work.
func WithOldKeys(ctx context.Context, api client.Reader, keys ...string) ([]*karpv1.NodeClaim, error) {
	var out []*karpv1.NodeClaim
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: "karpenter.sh", Version: "v1", Kind: "NodeClaimList"})
	for {
		if err := api.List(ctx, list, client.Limit(adoptPage), client.Continue(list.Continue)); err != nil {
			return nil, fmt.Errorf("listing nodeclaims: %w", err)
		}
		for _, m := range list.Items {
			if !slices.ContainsFunc(keys, func(k string) bool { _, ok := m.Annotations[k]; return ok }) {
				continue
			}
			nc := &karpv1.NodeClaim{}
			switch err := api.Get(ctx, client.ObjectKey{Name: m.Name}, nc); {
			case apierrors.IsNotFound(err):
				continue // gone meanwhile: nothing to adopt
			case err != nil:
				return nil, fmt.Errorf("reading nodeclaim %s: %w", m.Name, err)
			}
			out = append(out, nc)
		}
		if list.Continue == "" {
			return out, nil
		}
	}
}

// statusAPI is the part of EC2 adoption uses: what is scheduled for an instance now.
type statusAPI interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// Adoption is what an upgrade did with the memory routers before the store kept on
// NodeClaims (Annotation, AnnotationDrainSignalled).
type Adoption struct {
	// Adopted counts the deferrals of a maintenance EC2 still schedules, now in the store and
	// due at once (decided again on the pool's policy of now); Ended those EC2 no longer
	// shows, or of another kind (Spot warnings, state changes, impairments: reported again
	// if still true), not adopted; Removed the NodeClaims whose old keys were removed.
	Adopted, Ended, Removed int
}

// Adopt moves, once, the memory routers before the store wrote on NodeClaims into the store
// and removes the old keys. Nothing is taken on the word of the annotation, which anyone with
// `patch nodeclaims` can write: a deferral is adopted only when EC2 still schedules its
// maintenance (its type and start), and is then due at once, so that the router decides it
// again from the event as EC2 holds it; ended records (tombstones) and drain stamps are not
// adopted (a tombstone could hide a real event; a stamp would delete the NodeClaim). A
// NodeClaim that has a HealthRecord already only loses the old keys. An EC2 that does not
// answer adopts nothing and leaves the keys for the next try.
//
// kube writes; api reads from the API server (the router's cache drops the old keys).
func Adopt(ctx context.Context, kube client.Client, api client.Reader, ec2API statusAPI, clk clock.PassiveClock, log *slog.Logger) (Adoption, error) {
	var res Adoption
	old, err := WithOldKeys(ctx, api, Annotation, AnnotationDrainSignalled, AnnotationShadow)
	if err != nil || len(old) == 0 {
		return res, err
	}
	store := NewStore(kube, api)
	// What EC2 schedules now, for the instances with deferrals to adopt.
	var ids []string
	for _, nc := range old {
		if id := instanceOf(nc); id != "" {
			ids = append(ids, id)
		}
	}
	scheduled, err := schedules(ctx, ec2API, ids)
	if err != nil {
		return res, fmt.Errorf("asking EC2 what it schedules, before adopting deferrals: %w", err)
	}
	now := clk.Now().UTC()
	for _, nc := range old {
		hr := &HealthRecord{}
		switch err := api.Get(ctx, client.ObjectKey{Name: nc.Name}, hr); {
		case apierrors.IsNotFound(err):
			set, derr := Decode(nc.Annotations[Annotation])
			var keep []Record
			for _, r := range set.Records {
				if derr == nil && r.Active() && r.Kind == event.KindScheduledChange && slices.ContainsFunc(scheduled[instanceOf(nc)], func(m string) bool { return SameMaintenance(m, r.Match) }) {
					r.Until, r.Hold, r.Reason = now, "", "adopted from "+Annotation+" at an upgrade: EC2 still schedules "+r.Match+"; decided again"
					keep = append(keep, r)
					continue
				}
				if r.Active() {
					res.Ended++
					log.Info("not adopted from the old annotation", "nodeclaim", nc.Name, "event_id", r.EventID, "kind", r.Kind, "match", r.Match)
				}
			}
			if len(keep) > 0 {
				if err := store.Update(ctx, nc, func(m *Memory) (bool, error) {
					s := m.Set()
					for _, r := range keep {
						s.Put(r)
					}
					m.SetSet(s)
					return true, nil
				}); err != nil {
					return res, fmt.Errorf("adopting the deferrals of nodeclaim %s: %w", nc.Name, err)
				}
				res.Adopted += len(keep)
			}
		case err != nil:
			return res, fmt.Errorf("reading the healthrecord of nodeclaim %s: %w", nc.Name, err)
		}
		if err := removeOldKeys(ctx, kube, nc); err != nil {
			return res, err
		}
		res.Removed++
	}
	return res, nil
}

// removeOldKeys removes Annotation and AnnotationDrainSignalled from nc, under its resource
// version (a conflict is retried by the caller's next try).
func removeOldKeys(ctx context.Context, kube client.Client, nc *karpv1.NodeClaim) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": nc.ResourceVersion,
		"annotations":     map[string]any{Annotation: nil, AnnotationDrainSignalled: nil, AnnotationShadow: nil},
	}})
	if err != nil {
		return err
	}
	if err := kube.Patch(ctx, nc, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("removing the old keys of nodeclaim %s: %w", nc.Name, err)
	}
	return nil
}

// schedules returns, per instance, the Match of every maintenance EC2 schedules for it and
// has not completed or cancelled.
func schedules(ctx context.Context, api statusAPI, ids []string) (map[string][]string, error) {
	out := map[string][]string{}
	for len(ids) > 0 {
		batch := ids[:min(100, len(ids))]
		ids = ids[len(batch):]
		in := &ec2.DescribeInstanceStatusInput{InstanceIds: batch, IncludeAllInstances: aws.Bool(true)}
		for {
			res, err := api.DescribeInstanceStatus(ctx, in)
			if err != nil {
				if strings.Contains(err.Error(), "InvalidInstanceID.NotFound") {
					break // instances EC2 no longer knows: nothing is scheduled for them
				}
				return nil, err
			}
			for _, st := range res.InstanceStatuses {
				for _, e := range st.Events {
					if e.NotBefore == nil || event.ClosedDescription(aws.ToString(e.Description)) {
						continue
					}
					id := aws.ToString(st.InstanceId)
					out[id] = append(out[id], string(e.Code)+"@"+e.NotBefore.UTC().Truncate(time.Second).Format(time.RFC3339))
				}
			}
			if aws.ToString(res.NextToken) == "" {
				break
			}
			in.NextToken = res.NextToken
		}
	}
	return out, nil
}

// instanceOf is the EC2 instance ID of nc's provider ID (aws:///<zone>/<id>), or "".
func instanceOf(nc *karpv1.NodeClaim) string { return instanceOfProvider(nc.Status.ProviderID) }

// instanceOfProvider is the EC2 instance ID of a provider ID (aws:///<zone>/<id>), or "":
// router/cluster's InstanceID, restated, as cluster reads this package.
func instanceOfProvider(providerID string) string {
	_, rest, ok := strings.Cut(providerID, ":///")
	if !ok {
		return ""
	}
	return rest[strings.LastIndex(rest, "/")+1:]
}
