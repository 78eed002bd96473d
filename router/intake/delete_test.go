package intake

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// batchSQS answers DeleteMessageBatch: each call waits for gate (when set), refuses the
// receipts in refuse, or fails whole with err.
type batchSQS struct {
	mu      sync.Mutex
	gate    chan struct{}
	refuse  map[string]bool
	err     error
	calls   [][]string // the receipts of each call
	deleted map[string]int
}

func (f *batchSQS) DeleteMessageBatch(_ context.Context, in *sqs.DeleteMessageBatchInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	var receipts []string
	for _, e := range in.Entries {
		receipts = append(receipts, aws.ToString(e.ReceiptHandle))
	}
	f.mu.Lock()
	f.calls = append(f.calls, receipts)
	f.mu.Unlock()
	if f.gate != nil {
		<-f.gate
	}
	if f.err != nil {
		return nil, f.err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &sqs.DeleteMessageBatchOutput{}
	for _, e := range in.Entries {
		r := aws.ToString(e.ReceiptHandle)
		if f.refuse[r] {
			out.Failed = append(out.Failed, sqstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("ReceiptHandleIsInvalid"), Message: aws.String("stale"), SenderFault: true})
			continue
		}
		if f.deleted == nil {
			f.deleted = map[string]int{}
		}
		f.deleted[r]++
		out.Successful = append(out.Successful, sqstypes.DeleteMessageBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

// arrived is how many calls reached the fake, and their entries.
func (f *batchSQS) arrived() (calls, entries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		entries += len(c)
	}
	return len(f.calls), entries
}

func receipt(i int) sqstypes.Message {
	return sqstypes.Message{MessageId: aws.String("m" + strconv.Itoa(i)), ReceiptHandle: aws.String("r" + strconv.Itoa(i))}
}

// TestDeleterGroupsDeletes: deletes that come while calls are in flight share the next calls
// (at most ten each, at most maxDeleteCalls at once); a lone delete goes out at once; each
// caller gets its own entry's result.
func TestDeleterGroupsDeletes(t *testing.T) {
	for _, tt := range []struct {
		name      string
		n         int
		blocked   bool // the calls wait until every delete is pending
		refuse    []int
		err       error
		wantCalls int
	}{
		{name: "one delete, one call", n: 1, wantCalls: 1},
		{name: "25 while the first call is in flight", n: 25, blocked: true, wantCalls: 4}, // 1, 10 and 10 at once; the last 4 after
		{name: "a refused entry fails alone", n: 12, blocked: true, refuse: []int{3, 7}, wantCalls: 3},
		{name: "a failed call fails its entries", n: 3, err: errors.New("sqs unreachable"), wantCalls: -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := &batchSQS{refuse: map[string]bool{}, err: tt.err}
			if tt.blocked {
				f.gate = make(chan struct{})
			}
			for _, i := range tt.refuse {
				f.refuse["r"+strconv.Itoa(i)] = true
			}
			d := newDeleter(f, "intake")
			errs := make([]error, tt.n)
			var wg sync.WaitGroup
			for i := range tt.n {
				wg.Go(func() { errs[i] = d.delete(context.Background(), receipt(i)) })
				if tt.blocked {
					// One at a time, each pending or in a call (every call waits at the gate)
					// before the next, so that the grouping does not depend on scheduling.
					waitFor(t, func() bool {
						calls, entries := f.arrived()
						d.mu.Lock()
						defer d.mu.Unlock()
						return len(d.pending)+entries == i+1 && d.calls == calls
					})
				}
			}
			if tt.blocked {
				close(f.gate)
			}
			wg.Wait()
			refused := map[int]bool{}
			for _, i := range tt.refuse {
				refused[i] = true
			}
			for i, err := range errs {
				if (err != nil) != (refused[i] || tt.err != nil) {
					t.Errorf("delete %d: %v", i, err)
				}
			}
			if tt.wantCalls > 0 && len(f.calls) != tt.wantCalls {
				t.Errorf("%d calls (%v), want %d", len(f.calls), f.calls, tt.wantCalls)
			}
			seen := 0
			for _, c := range f.calls {
				if len(c) > maxDeleteBatch {
					t.Errorf("a call of %d entries", len(c))
				}
				seen += len(c)
			}
			if seen != tt.n {
				t.Errorf("%d entries sent, want %d", seen, tt.n)
			}
			for r, k := range f.deleted {
				if k != 1 {
					t.Errorf("%s deleted %d times", r, k)
				}
			}
			// The calls end once their entries are answered.
			waitFor(t, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.calls == 0 && len(d.pending) == 0 })
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("condition not met within 5s"))
		}
	}
}
