package doctor

import (
	"context"
	"errors"
	"fmt"
	"github.com/health-router/health-router/router/inplace"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/health-router/health-router/router/eventwindow"
	"github.com/health-router/health-router/router/policy"
)

// eventWindowsAPI is what doctor asks EC2 about the router's event windows (DryRun calls, and
// one read of this cluster's windows).
type eventWindowsAPI interface {
	CreateInstanceEventWindow(context.Context, *ec2.CreateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.CreateInstanceEventWindowOutput, error)
	ModifyInstanceEventWindow(context.Context, *ec2.ModifyInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.ModifyInstanceEventWindowOutput, error)
	AssociateInstanceEventWindow(context.Context, *ec2.AssociateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.AssociateInstanceEventWindowOutput, error)
	DisassociateInstanceEventWindow(context.Context, *ec2.DisassociateInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.DisassociateInstanceEventWindowOutput, error)
	DeleteInstanceEventWindow(context.Context, *ec2.DeleteInstanceEventWindowInput, ...func(*ec2.Options)) (*ec2.DeleteInstanceEventWindowOutput, error)
	DescribeInstanceEventWindows(context.Context, *ec2.DescribeInstanceEventWindowsInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceEventWindowsOutput, error)
	CreateTags(context.Context, *ec2.CreateTagsInput, ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
}

// Check names of the event windows (--event-windows).
const (
	CheckEventWindowCalls = "router's EC2 event-window calls"
	CheckEventWindowTags  = "router's ec2:CreateTags (event-window target)"
	CheckEventWindowPools = "NodePool event windows"
)

// placeholderWindow is the window the DryRun calls name when this cluster has none yet.
const placeholderWindow = "iew-00000000000000000"

// doctorPool is the pool the DryRun create names: nothing is created, whatever the answer.
const doctorPool = "health-router-doctor"

const eventWindowsFix = "grant the router's role the event-window calls and ec2:CreateTags on the cluster's instances (terraform: enable_event_windows = true, statements EventWindows*)"

// routerEventWindows checks, with DryRun, every EC2 call the event-window manager makes:
// DescribeInstanceEventWindows, CreateInstanceEventWindow with this cluster's tags (the
// Terraform grant requires them), and Modify, Associate, Disassociate and Delete on a window of
// this cluster (a placeholder when it has none: a grant scoped to the cluster's windows denies
// it, and a denial then proves nothing); then CreateTags of the target tag on a NodeClaim's
// instance, and its scope (scopedWrite).
func (d *Doctor) routerEventWindows(ctx context.Context, r *Report, c Config, s scopeSample) {
	if c.ClusterName == "" {
		*r = append(*r, Item{Fail, CheckEventWindowCalls, "--event-windows without --cluster-name: the router refuses to start so", "pass the router's --cluster-name (HEALTH_ROUTER_CLUSTER_NAME) to doctor too"})
		return
	}
	api := d.ec2
	var denied, unknown, allowed []string
	note := func(action string, err error) {
		ok, no := dryRun(err)
		var ae smithy.APIError
		if errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceEventWindowId.NotFound" {
			ok = true // an endpoint that ignores DryRun looked the window up: authorised
		}
		switch {
		case ok:
			allowed = append(allowed, action)
		case no:
			denied = append(denied, action)
		default:
			unknown = append(unknown, fmt.Sprintf("%s (%v)", action, err))
		}
	}
	_, err := api.DescribeInstanceEventWindows(ctx, &ec2.DescribeInstanceEventWindowsInput{DryRun: aws.Bool(true)})
	note("DescribeInstanceEventWindows", err)
	tags := []ec2types.Tag{{Key: aws.String(eventwindow.TagCluster), Value: aws.String(c.ClusterName)}, {Key: aws.String(eventwindow.TagNodePool), Value: aws.String(doctorPool)}}
	_, err = api.CreateInstanceEventWindow(ctx, &ec2.CreateInstanceEventWindowInput{DryRun: aws.Bool(true), Name: aws.String(eventwindow.Name(c.ClusterName, doctorPool)),
		TimeRanges:        []ec2types.InstanceEventWindowTimeRangeRequest{{StartWeekDay: ec2types.WeekDaySaturday, StartHour: aws.Int32(2), EndWeekDay: ec2types.WeekDaySaturday, EndHour: aws.Int32(6)}},
		TagSpecifications: []ec2types.TagSpecification{{ResourceType: ec2types.ResourceTypeInstanceEventWindow, Tags: tags}}})
	note("CreateInstanceEventWindow", err)
	// A window of this cluster to name, read for real (the grant allows the read).
	id, real := placeholderWindow, false
	if out, err := api.DescribeInstanceEventWindows(ctx, &ec2.DescribeInstanceEventWindowsInput{MaxResults: aws.Int32(5),
		Filters: []ec2types.Filter{{Name: aws.String("tag:" + eventwindow.TagCluster), Values: []string{c.ClusterName}}}}); err == nil && len(out.InstanceEventWindows) > 0 {
		id, real = aws.ToString(out.InstanceEventWindows[0].InstanceEventWindowId), true
	}
	target := []ec2types.Tag{{Key: aws.String(eventwindow.TagInstance), Value: aws.String(eventwindow.TagValue(c.ClusterName, doctorPool))}}
	_, err = api.ModifyInstanceEventWindow(ctx, &ec2.ModifyInstanceEventWindowInput{DryRun: aws.Bool(true), InstanceEventWindowId: aws.String(id),
		TimeRanges: []ec2types.InstanceEventWindowTimeRangeRequest{{StartWeekDay: ec2types.WeekDaySaturday, StartHour: aws.Int32(2), EndWeekDay: ec2types.WeekDaySaturday, EndHour: aws.Int32(6)}}})
	note("ModifyInstanceEventWindow", err)
	_, err = api.AssociateInstanceEventWindow(ctx, &ec2.AssociateInstanceEventWindowInput{DryRun: aws.Bool(true), InstanceEventWindowId: aws.String(id),
		AssociationTarget: &ec2types.InstanceEventWindowAssociationRequest{InstanceTags: target}})
	note("AssociateInstanceEventWindow", err)
	_, err = api.DisassociateInstanceEventWindow(ctx, &ec2.DisassociateInstanceEventWindowInput{DryRun: aws.Bool(true), InstanceEventWindowId: aws.String(id),
		AssociationTarget: &ec2types.InstanceEventWindowDisassociationRequest{InstanceTags: target}})
	note("DisassociateInstanceEventWindow", err)
	_, err = api.DeleteInstanceEventWindow(ctx, &ec2.DeleteInstanceEventWindowInput{DryRun: aws.Bool(true), InstanceEventWindowId: aws.String(id)})
	note("DeleteInstanceEventWindow", err)

	onWindow := map[string]bool{"ModifyInstanceEventWindow": true, "AssociateInstanceEventWindow": true, "DisassociateInstanceEventWindow": true, "DeleteInstanceEventWindow": true}
	placeholderOnly := len(denied) > 0 && !real && allOf(denied, onWindow)
	switch {
	case len(denied) == 0 && len(unknown) == 0:
		where := "a placeholder window"
		if real {
			where = "window " + id
		}
		*r = append(*r, Item{OK, CheckEventWindowCalls, fmt.Sprintf("the router's credentials may call %s (DryRun; the window calls on %s)", strings.Join(allowed, ", "), where), ""})
	case placeholderOnly:
		*r = append(*r, Item{Unknown, CheckEventWindowCalls, fmt.Sprintf("%s denied on a placeholder window, which a grant scoped to this cluster's windows denies too (the cluster has no window yet); allowed: %s",
			strings.Join(denied, ", "), strings.Join(allowed, ", ")), eventWindowsFix})
	case len(denied) > 0:
		*r = append(*r, Item{Fail, CheckEventWindowCalls, fmt.Sprintf("denied: %s: pools with %s=true get no EC2 window (AWS keeps its own timing)", strings.Join(denied, ", "), policy.AnnotationEventWindow), eventWindowsFix})
	default:
		*r = append(*r, Item{Unknown, CheckEventWindowCalls, "cannot tell: " + strings.Join(unknown, "; "), eventWindowsFix})
	}
	d.scopedWrite(ctx, r, write{
		check:   CheckEventWindowTags,
		fix:     eventWindowsFix,
		allowed: "the router's credentials may tag this cluster's instances with their pool's event-window target",
		denied:  "new instances are not tagged, and their pool's EC2 window does not reach them",
		call: func(ctx context.Context, instance string) error {
			_, err := api.CreateTags(ctx, &ec2.CreateTagsInput{DryRun: aws.Bool(true), Resources: []string{instance}, Tags: target})
			return err
		},
		notFound: []string{"InvalidInstanceID.NotFound"},
	}, s)
}

func allOf(actions []string, set map[string]bool) bool {
	for _, a := range actions {
		if !set[a] {
			return false
		}
	}
	return true
}

// eventWindowPools lists the NodePools that ask for an EC2 event window and cannot have one:
// their window is one EC2 cannot express (the reason), or the router runs without
// --event-windows.
func (d *Doctor) eventWindowPools(ctx context.Context, r *Report, c Config) {
	var pools karpv1.NodePoolList
	if err := d.kube.List(ctx, &pools); err != nil {
		return // the annotations' check says it could not list them
	}
	asking, bad := 0, 0
	for _, np := range pools.Items {
		p := policy.FromAnnotations(np.Annotations)
		if !p.EventWindow {
			continue
		}
		asking++
		if !c.EventWindows {
			bad++
			*r = append(*r, Item{Warn, CheckEventWindowPools + ": " + np.Name, fmt.Sprintf("%s=true, but the router runs without --event-windows: no EC2 window is kept", policy.AnnotationEventWindow),
				"run the router with --event-windows (chart: settings.eventWindows) and --cluster-name, with the Terraform module's enable_event_windows"})
			continue
		}
		if _, err := p.Window.EC2Ranges(p.EC2Leads(inplace.Options{}.PrepareLead())...); err != nil {
			bad++
			*r = append(*r, Item{Warn, CheckEventWindowPools + ": " + np.Name, fmt.Sprintf("EC2 cannot express the pool's maintenance window: %v; the pool gets no EC2 window (AWS keeps its own timing, the deferral applies)", err),
				"set a window EC2 can hold: whole UTC hours, ranges of 2 h or more, 4 h a week or more, weekly, no daylight-saving CRON_TZ zone (docs/maintenance.md)"})
		}
	}
	if asking > 0 && bad == 0 {
		*r = append(*r, Item{OK, CheckEventWindowPools, fmt.Sprintf("%d NodePool(s) ask for an EC2 event window, each one EC2 can express", asking), ""})
	}
}
