package reschedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/health-router/health-router/router/awscalls"
	"github.com/health-router/health-router/router/event"
)

// What a failed call means for the caller; every error Events returns wraps one of them.
var (
	// ErrRefused: EC2 answered and will not do it (the event cannot move: no deadline, too
	// close to its start, past its deadline, unknown; or the router may not call it). Asking
	// again does not help: the pool's ordinary policy applies.
	ErrRefused = errors.New("refused by EC2")
	// ErrUnavailable: no answer, throttling past the SDK's retries, or a fault on EC2's side.
	// Ask again later.
	ErrUnavailable = errors.New("EC2 unavailable")
)

// eventsAPI is the part of EC2 that finds and moves scheduled events.
type eventsAPI interface {
	DescribeInstanceStatus(context.Context, *ec2.DescribeInstanceStatusInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceStatusOutput, error)
	ModifyInstanceEventStartTime(context.Context, *ec2.ModifyInstanceEventStartTimeInput, ...func(*ec2.Options)) (*ec2.ModifyInstanceEventStartTimeOutput, error)
}

// Event is one of an instance's scheduled events, as EC2 reports it.
type Event struct {
	ID          string
	Code        event.ScheduledType
	Description string
	NotBefore   time.Time
	NotAfter    time.Time // zero when EC2 reports none
	// Deadline is EC2's NotBeforeDeadline: how late the event may be moved; zero when it
	// cannot be.
	Deadline time.Time
}

// Events finds an instance's scheduled event and moves it. Its calls are counted by the
// client's awscalls.Middleware, as for every client the router builds.
type Events struct {
	api eventsAPI
}

// NewEvents returns Events calling api (an *ec2.Client).
func NewEvents(api eventsAPI) *Events { return &Events{api: api} }

// FindEvent returns instanceID's scheduled event of type code that is not over (EC2 keeps
// [Completed] and [Canceled] events for a while). With several, it returns the one that
// starts first. ok is false when EC2 reports no such event, or no such instance.
func (e *Events) FindEvent(ctx context.Context, instanceID string, code event.ScheduledType) (Event, bool, error) {
	pages := ec2.NewDescribeInstanceStatusPaginator(e.api, &ec2.DescribeInstanceStatusInput{
		InstanceIds: []string{instanceID}, IncludeAllInstances: aws.Bool(true),
	})
	var found Event
	ok := false
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			var ae smithy.APIError
			if errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound" {
				return Event{}, false, nil // terminated: nothing to move
			}
			return Event{}, false, fmt.Errorf("describing the scheduled events of %s: %w", instanceID, classify(err))
		}
		for _, st := range page.InstanceStatuses {
			if aws.ToString(st.InstanceId) != instanceID {
				continue
			}
			for _, ev := range st.Events {
				got := fromEC2(ev)
				if got.Code != code || got.NotBefore.IsZero() || event.ClosedDescription(got.Description) {
					continue
				}
				if !ok || got.NotBefore.Before(found.NotBefore) {
					found, ok = got, true
				}
			}
		}
	}
	return found, ok, nil
}

// Move asks EC2 to start instanceID's event eventID at newStart, and returns the event as EC2
// reports it after the move.
func (e *Events) Move(ctx context.Context, instanceID, eventID string, newStart time.Time) (Event, error) {
	out, err := e.api.ModifyInstanceEventStartTime(ctx, &ec2.ModifyInstanceEventStartTimeInput{
		InstanceId: aws.String(instanceID), InstanceEventId: aws.String(eventID), NotBefore: aws.Time(newStart),
	})
	if err != nil {
		return Event{}, fmt.Errorf("moving event %s of %s to %s: %w", eventID, instanceID, stamp(newStart), classify(err))
	}
	if out.Event == nil {
		return Event{ID: eventID, NotBefore: newStart}, nil // EC2 always reports the event; be lenient
	}
	return fromEC2(*out.Event), nil
}

func fromEC2(ev ec2types.InstanceStatusEvent) Event {
	return Event{
		ID: aws.ToString(ev.InstanceEventId), Code: event.ScheduledType(ev.Code), Description: aws.ToString(ev.Description),
		NotBefore: aws.ToTime(ev.NotBefore), NotAfter: aws.ToTime(ev.NotAfter), Deadline: aws.ToTime(ev.NotBeforeDeadline),
	}
}

// classify wraps err with ErrRefused or ErrUnavailable, in one place. A client error EC2
// answered (4xx: InvalidInstanceEventStartTime, InvalidInstanceEventIDNotFound,
// InvalidInstanceID.NotFound, InvalidParameterValue, UnauthorizedOperation, ...) is a refusal;
// throttling, a server fault and no answer at all (a network error, a timeout, the context
// ending) are unavailability.
func classify(err error) error {
	if awscalls.Unanswered(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrRefused, err)
}

// FailureReason says, for a decision, why a call failed to move an event: "not moved: EC2
// refused (code: message)" or "not moved: EC2 unavailable (...)".
func FailureReason(err error) string {
	var ae smithy.APIError
	switch {
	case errors.Is(err, ErrRefused) && errors.As(err, &ae):
		return fmt.Sprintf("not moved: EC2 refused (%s: %s)", ae.ErrorCode(), ae.ErrorMessage())
	case errors.Is(err, ErrRefused):
		return fmt.Sprintf("not moved: EC2 refused (%v)", err)
	}
	return fmt.Sprintf("not moved: EC2 unavailable (%v)", err)
}
