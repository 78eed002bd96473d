package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// attributesAPI is the part of SQS the quiet-queue wait uses.
type attributesAPI interface {
	GetQueueAttributes(context.Context, *sqs.GetQueueAttributesInput, ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
}

// quietAttributes are the counts that are all 0 on a quiet queue: nothing waiting, nothing
// received and not yet deleted (in flight, or left invisible for a retry), nothing delayed.
var quietAttributes = []sqstypes.QueueAttributeName{
	sqstypes.QueueAttributeNameApproximateNumberOfMessages,
	sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
	sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed,
}

// waitQuiet waits until the queue has been quiet for settle (each count 0 at every poll in
// that time: the counts are approximate, and a message between a receive and its delete
// flickers), or timeout has passed. It returns how long it waited; past the timeout, an error
// with the counts last seen (a message the router keeps retrying stays invisible).
func waitQuiet(ctx context.Context, api attributesAPI, queueURL string, settle, poll, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var quietSince time.Time
	last := map[string]string{}
	for {
		out, err := api.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL), AttributeNames: quietAttributes})
		if err != nil {
			return time.Since(start), fmt.Errorf("reading the intake queue's counts: %w", err)
		}
		last = out.Attributes
		switch {
		case !quiet(last):
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) >= settle:
			return time.Since(start), nil
		}
		if time.Since(start) >= timeout {
			return time.Since(start), fmt.Errorf("the intake queue is not quiet after %s: %s waiting, %s in flight, %s delayed", timeout.Round(time.Second),
				or0(last[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)]), or0(last[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible)]),
				or0(last[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesDelayed)]))
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return time.Since(start), ctx.Err()
		}
	}
}

func quiet(attrs map[string]string) bool {
	for _, a := range quietAttributes {
		if n, err := strconv.Atoi(or0(attrs[string(a)])); err != nil || n != 0 {
			return false
		}
	}
	return true
}

func or0(s string) string {
	if s == "" {
		return "0"
	}
	return s
}
