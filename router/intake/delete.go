package intake

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

const (
	// maxDeleteBatch is SQS's limit of entries per DeleteMessageBatch.
	maxDeleteBatch = 10
	// maxDeleteCalls bounds the DeleteMessageBatch calls in flight at once: a burst's deletes
	// share calls instead of each making its own, and one slow call does not hold the rest.
	maxDeleteCalls = 4
	// deleteTimeout bounds one DeleteMessageBatch, whatever the contexts of its messages.
	deleteTimeout = 30 * time.Second
)

// deleteBatchAPI is the part of SQS the deleter uses.
type deleteBatchAPI interface {
	DeleteMessageBatch(context.Context, *sqs.DeleteMessageBatchInput, ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

// deleter deletes handled messages in DeleteMessageBatch calls of up to ten, as a group
// commit: a delete goes out at once when no call is in flight, and the deletes that come
// while calls are in flight share the next one. A lone message is never held back waiting
// for others (no linger), and a burst costs about a tenth of the calls of one DeleteMessage
// each (moto, single-threaded, served the burst bench's intake at 1.9 calls per message).
// A caller waits for its own entry's result; it deletes only once the message's outcome is
// recorded, so a batch never holds a message that is not done.
type deleter struct {
	api      deleteBatchAPI
	queueURL string
	mu       sync.Mutex
	pending  []*pendingDelete
	calls    int // DeleteMessageBatch calls in flight
}

type pendingDelete struct {
	ctx     context.Context
	id      string // the message ID, for errors
	receipt *string
	done    chan error
}

func newDeleter(api deleteBatchAPI, queueURL string) *deleter {
	return &deleter{api: api, queueURL: queueURL}
}

// delete deletes one message and returns once SQS answered for it.
func (d *deleter) delete(ctx context.Context, m sqstypes.Message) error {
	p := &pendingDelete{ctx: ctx, id: aws.ToString(m.MessageId), receipt: m.ReceiptHandle, done: make(chan error, 1)}
	d.mu.Lock()
	d.pending = append(d.pending, p)
	if d.calls == 0 || (len(d.pending) >= maxDeleteBatch && d.calls < maxDeleteCalls) {
		d.calls++
		go d.run()
	}
	d.mu.Unlock()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("deleting message %s: %w", p.id, ctx.Err())
	}
}

// run sends what is pending, ten at a time, until nothing is.
func (d *deleter) run() {
	for {
		d.mu.Lock()
		if len(d.pending) == 0 {
			d.calls--
			d.mu.Unlock()
			return
		}
		n := min(len(d.pending), maxDeleteBatch)
		batch := d.pending[:n:n]
		d.pending = d.pending[n:]
		d.mu.Unlock()
		d.flush(batch)
	}
}

func (d *deleter) flush(batch []*pendingDelete) {
	// The call outlives an entry whose caller gave up: the others still wait for it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), deleteTimeout)
	defer cancel()
	entries := make([]sqstypes.DeleteMessageBatchRequestEntry, len(batch))
	for i, p := range batch {
		entries[i] = sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: p.receipt}
	}
	out, err := d.api.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(d.queueURL), Entries: entries})
	if err != nil {
		for _, p := range batch {
			p.done <- fmt.Errorf("deleting message %s: %w", p.id, err)
		}
		return
	}
	failed := map[string]error{}
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = fmt.Errorf("SQS refused: %s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for i, p := range batch {
		if err, ok := failed[strconv.Itoa(i)]; ok {
			p.done <- fmt.Errorf("deleting message %s: %w", p.id, err)
			continue
		}
		p.done <- nil
	}
}
