package inplace

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/event"
	"github.com/health-router/health-router/router/record"
)

// statusAPI is the part of EC2 adoption asks: what is scheduled for an instance now.
type statusAPI interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
}

// Adopted is what AdoptRuns did: runs moved into the store as they were (Kept), given the
// Node back because EC2 no longer schedules their maintenance (Ended), started again from the
// cordon because their record cannot be trusted for a step that empties or reboots (Restarted),
// and annotations of runs already over removed (Removed).
type Adopted struct{ Kept, Ended, Restarted, Removed int }

// AdoptRuns moves, once, the runs routers before the store kept on NodeClaims (the
// record.AnnotationRun key) into their HealthRecords and removes the key. Nothing is taken on
// the annotation's word: a run naming another instance or Node than its NodeClaim's is not
// adopted; a run whose maintenance EC2 no longer schedules (type and start, or the start the
// router moved it from) ends and gives the Node back if it can (Cancelled); a run before its
// reboot starts again from the cordon (cordon and eviction are idempotent, and the Node's mark
// keeps what the old run changed), so a step that reboots is never taken from the annotation;
// a run past its reboot (waiting for the Node, uncordoning) is adopted as it is. A NodeClaim
// whose HealthRecord holds a run already only loses the key. EC2 unanswered: nothing is
// adopted, the keys stay for the next try.
func AdoptRuns(ctx context.Context, kube client.Client, api client.Reader, ec2API statusAPI, clk clock.PassiveClock, log *slog.Logger) (Adopted, error) {
	var res Adopted
	claims, err := record.WithOldKeys(ctx, api, record.AnnotationRun)
	if err != nil {
		return res, err
	}
	store := record.NewStore(kube, api)
	now := clk.Now()
	for _, nc := range claims {
		v, ok := nc.Annotations[record.AnnotationRun]
		if !ok {
			continue
		}
		mem, err := record.Load(ctx, api, nc.Name)
		if err != nil {
			return res, err
		}
		st, derr := decode(v)
		adopt := len(mem.Run) == 0 && derr == nil && !st.Over() && nc.DeletionTimestamp.IsZero() &&
			st.Instance == cluster.InstanceID(nc.Status.ProviderID) && st.Node == nc.Status.NodeName
		if adopt {
			shown, err := scheduledNow(ctx, ec2API, st)
			if err != nil {
				return res, fmt.Errorf("asking EC2 about the run of nodeclaim %s before adopting it: %w", nc.Name, err)
			}
			switch beforeReboot := st.Rebooted.IsZero() && st.RebootAsked.IsZero() && (st.Step == StepWait || st.Step == StepRelease || st.Step == StepCordon || st.Step == StepEvict || st.Step == StepReboot); {
			case !shown:
				if next, ok := Cancelled(st, "adopted at an upgrade: EC2 no longer schedules the maintenance", now); ok {
					st = next
				}
				res.Ended++
			case beforeReboot && st.Step != StepWait:
				st = advance(st, StepCordon, now)
				res.Restarted++
			default:
				res.Kept++
			}
			if err := store.Update(ctx, nc, func(m *record.Memory) (bool, error) {
				if len(m.Run) > 0 {
					return false, nil
				}
				m.Run = json.RawMessage(encode(st))
				return true, nil
			}); err != nil {
				return res, fmt.Errorf("adopting the run of nodeclaim %s: %w", nc.Name, err)
			}
			log.Info("adopted a reboot in place from the old annotation", "nodeclaim", nc.Name, "event_id", st.EventID, "step", st.Step)
		} else {
			res.Removed++
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": nc.ResourceVersion, "annotations": map[string]any{record.AnnotationRun: nil}}})
		if err := kube.Patch(ctx, nc, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			return res, fmt.Errorf("removing the old run of nodeclaim %s: %w", nc.Name, err)
		}
	}
	return res, nil
}

// scheduledNow reports whether EC2 schedules st's maintenance now (its type, at its start or
// the start the router moved it from), neither completed nor cancelled.
func scheduledNow(ctx context.Context, api statusAPI, st State) (bool, error) {
	out, err := api.DescribeInstanceStatus(ctx, &ec2.DescribeInstanceStatusInput{InstanceIds: []string{st.Instance}, IncludeAllInstances: aws.Bool(true)})
	if err != nil {
		if strings.Contains(err.Error(), "InvalidInstanceID.NotFound") {
			return false, nil // EC2 no longer knows the instance: nothing is scheduled for it
		}
		return false, err
	}
	for _, s := range out.InstanceStatuses {
		for _, e := range s.Events {
			if string(e.Code) != string(st.Type) || e.NotBefore == nil || event.ClosedDescription(aws.ToString(e.Description)) {
				continue
			}
			at := e.NotBefore.UTC().Truncate(time.Second)
			if at.Equal(st.Start.UTC().Truncate(time.Second)) || (!st.MovedFrom.IsZero() && at.Equal(st.MovedFrom.UTC().Truncate(time.Second))) {
				return true, nil
			}
		}
	}
	return false, nil
}
