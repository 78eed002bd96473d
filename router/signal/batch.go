package signal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

const (
	// maxBatch is SQS's limit of messages per SendMessageBatch.
	maxBatch = 10
	// batchLinger is how long a forward waits for others to share its SendMessageBatch: long
	// enough to gather the drains of a bulk event carried out in parallel, short against a
	// two-minute notice.
	batchLinger = 5 * time.Millisecond
	// batchTimeout bounds one SendMessageBatch, whatever the contexts of its senders.
	batchTimeout = 30 * time.Second
)

// batchAPI is the part of SQS the forward batcher uses.
type batchAPI interface {
	SendMessageBatch(context.Context, *sqs.SendMessageBatchInput, ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
}

// batcher gathers forwards to Karpenter's queue into SendMessageBatch calls of up to ten:
// a bulk event's drains cost a tenth of the calls; a lone forward waits batchLinger.
type batcher struct {
	api      batchAPI
	queueURL string
	mu       sync.Mutex
	pending  []*pendingSend
	timer    *time.Timer
}

type pendingSend struct {
	ctx  context.Context
	body string
	done chan error
}

func newBatcher(api batchAPI, queueURL string) *batcher {
	return &batcher{api: api, queueURL: queueURL}
}

// send forwards body, sharing a SendMessageBatch with concurrent sends; it returns once the
// message is accepted by SQS (or refused).
func (b *batcher) send(ctx context.Context, body string) error {
	p := &pendingSend{ctx: ctx, body: body, done: make(chan error, 1)}
	b.mu.Lock()
	b.pending = append(b.pending, p)
	switch {
	case len(b.pending) >= maxBatch:
		batch := b.take()
		b.mu.Unlock()
		go b.flush(batch)
	case len(b.pending) == 1:
		b.timer = time.AfterFunc(batchLinger, func() {
			b.mu.Lock()
			batch := b.take()
			b.mu.Unlock()
			b.flush(batch)
		})
		b.mu.Unlock()
	default:
		b.mu.Unlock()
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// take empties the pending list; the caller holds b.mu.
func (b *batcher) take() []*pendingSend {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	batch := b.pending
	b.pending = nil
	return batch
}

func (b *batcher) flush(batch []*pendingSend) {
	if len(batch) == 0 {
		return
	}
	// The call outlives a sender that gave up: the others still wait for it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), batchTimeout)
	defer cancel()
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(batch))
	for i, p := range batch {
		entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(p.body)}
	}
	out, err := b.api.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(b.queueURL), Entries: entries})
	if err != nil {
		for _, p := range batch {
			p.done <- err
		}
		return
	}
	failed := map[string]error{}
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = fmt.Errorf("SQS refused the message: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for i, p := range batch {
		if err, ok := failed[strconv.Itoa(i)]; ok {
			p.done <- err
			continue
		}
		p.done <- nil
	}
}

// errNoBatcher is returned when forward mode has no queue to send to.
var errNoBatcher = errors.New("forward mode without Karpenter's queue")
