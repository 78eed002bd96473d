package intake

import (
	"context"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Holds remembers deferred messages that wait on live state rather than on a time: a drain
// held by pacing waits for one of its pool's drains to finish; a drain held by an AMI check
// waits for the image to become available. Releasing makes them visible at once. It is an
// optimisation: held messages come back at their until-time anyway (and after a restart).
type Holds struct {
	mu      sync.Mutex
	waiting map[string]map[string]bool // key -> receipt handles
}

// NewHolds returns an empty registry.
func NewHolds() *Holds { return &Holds{waiting: map[string]map[string]bool{}} }

// PoolKey is the hold key of drains paced in a NodePool.
func PoolKey(pool string) string { return "pool/" + pool }

// ImageKey is the hold key of drains waiting on an image.
func ImageKey(image string) string { return "image/" + image }

// Add registers a message's receipt handle under key.
func (h *Holds) Add(key, receipt string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting[key] == nil {
		h.waiting[key] = map[string]bool{}
	}
	h.waiting[key][receipt] = true
}

// Len returns how many messages wait under key.
func (h *Holds) Len(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting[key])
}

// visibilityAPI is the part of SQS releasing a hold uses.
type visibilityAPI interface {
	ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

// Release makes every message held under key visible now. A receipt that is stale (the
// message was received again meanwhile) fails harmlessly: that message is already back.
func (h *Holds) Release(ctx context.Context, api visibilityAPI, queueURL, key string) int {
	h.mu.Lock()
	receipts := h.waiting[key]
	delete(h.waiting, key)
	h.mu.Unlock()
	n := 0
	for r := range receipts {
		if _, err := api.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(queueURL), ReceiptHandle: aws.String(r), VisibilityTimeout: 0}); err == nil {
			n++
		}
	}
	return n
}

// ReleasePool releases drains paced in pool; call it when one of the pool's NodeClaims is gone.
func (in *Intake) ReleasePool(ctx context.Context, pool string) int {
	return in.holds.Release(ctx, in.sqs, in.cfg.QueueURL, PoolKey(pool))
}
