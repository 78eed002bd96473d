package intake

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/router/metrics"
)

// queueSQS is a queue of messages the router dead-letters (their bodies do not parse), so
// that the receive loops run without a pipeline. It checks, at every receive, that the
// messages being worked on and those asked for fit in the workers.
type queueSQS struct {
	mu                  sync.Mutex
	t                   *testing.T
	workers, share      int
	queue               []sqstypes.Message
	inFlight            int // received, not deleted
	receiving, maxRecv  int // receives in flight now, and at most
	deleted, deadLetter int
}

func (q *queueSQS) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	q.mu.Lock()
	n := int(in.MaxNumberOfMessages)
	if n < 1 || n > q.share || q.inFlight+n > q.workers {
		q.t.Errorf("receive of %d with %d in flight: over the share %d or the workers %d", n, q.inFlight, q.share, q.workers)
	}
	q.receiving++
	q.maxRecv = max(q.maxRecv, q.receiving)
	k := min(n, len(q.queue))
	out := q.queue[:k:k]
	q.queue = q.queue[k:]
	q.inFlight += k
	q.mu.Unlock()
	if k == 0 { // a long poll on an empty queue
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	q.mu.Lock()
	q.receiving--
	q.mu.Unlock()
	return &sqs.ReceiveMessageOutput{Messages: out}, nil
}

func (q *queueSQS) DeleteMessageBatch(_ context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	time.Sleep(time.Millisecond) // a round trip, so that deletes group
	q.mu.Lock()
	defer q.mu.Unlock()
	q.deleted += len(in.Entries)
	q.inFlight -= len(in.Entries)
	return &sqs.DeleteMessageBatchOutput{}, nil
}

func (q *queueSQS) ChangeMessageVisibility(context.Context, *sqs.ChangeMessageVisibilityInput, ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

func (q *queueSQS) SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.deadLetter++
	return &sqs.SendMessageOutput{MessageId: aws.String("dlq")}, nil
}

func (q *queueSQS) done(n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.deleted == n
}

// TestReceiveLoops: however many loops receive, the messages worked on never exceed the
// workers, each receive asks for at most its loop's share, every message is finished once,
// and the loops do poll at once.
func TestReceiveLoops(t *testing.T) {
	for _, tt := range []struct {
		workers, receivers, wantShare int
	}{
		{workers: 1, receivers: 1, wantShare: 1},
		{workers: 10, receivers: 1, wantShare: 10},
		{workers: 4, receivers: 2, wantShare: 2},
		{workers: 10, receivers: 3, wantShare: 4},
		{workers: 40, receivers: 2, wantShare: 10},
		{workers: 2, receivers: 5, wantShare: 1}, // more loops than workers: one per worker
	} {
		t.Run(strconv.Itoa(tt.workers)+"/"+strconv.Itoa(tt.receivers), func(t *testing.T) {
			const n = 60
			q := &queueSQS{t: t, workers: tt.workers, share: tt.wantShare}
			for i := range n {
				q.queue = append(q.queue, sqstypes.Message{MessageId: aws.String("m" + strconv.Itoa(i)), ReceiptHandle: aws.String("r" + strconv.Itoa(i)), Body: aws.String("{not json")})
			}
			m := metrics.NewRouter(prometheus.NewRegistry(), func() float64 { return 0 })
			in := New(Config{QueueURL: "intake", DeadLetterQueueURL: "dlq", Workers: tt.workers, Receivers: tt.receivers, WaitTime: time.Second},
				q, nil, m, nil, clock.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan error)
			go func() { stopped <- in.Start(ctx) }()
			waitFor(t, func() bool { return q.done(n) })
			loops := min(tt.receivers, tt.workers)
			waitFor(t, func() bool { q.mu.Lock(); defer q.mu.Unlock(); return q.maxRecv >= loops })
			cancel()
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
			if q.deadLetter != n || q.inFlight != 0 || q.maxRecv > loops {
				t.Errorf("dead-lettered %d of %d, %d left in flight, %d receives at once (loops %d)", q.deadLetter, n, q.inFlight, q.maxRecv, loops)
			}
		})
	}
}
