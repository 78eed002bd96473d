package dispatch

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/health-router/health-router/test/terraform/motoserver"
)

// A batch of the dispatcher queue: each record is routed on its own, and only the records
// Handle could not settle are reported back, for SQS to retry and then dead-letter. A
// malformed body is recorded in the failure queue with its reason and deleted, not retried;
// without a failure queue it is reported, so SQS's redrive dead-letters it: never dropped.
func TestHandleBatchReportsOnlyTheRecordsToRetry(t *testing.T) {
	type record struct{ id, body string } // body: "alpha"/"beta" for a Spot warning about that cluster's instance
	for _, tc := range []struct {
		name           string
		records        []record
		downed         []string // clusters whose queue cannot be reached
		noFailureQueue bool
		wantRetry      []string // message IDs in BatchItemFailures
		wantAlpha      int      // messages alpha gets
		wantBeta       int
		wantRecorded   []string // failure-queue records' reasons
	}{
		{name: "empty batch"},
		{name: "every record routed", records: []record{{"m1", "alpha"}, {"m2", "beta"}},
			wantAlpha: 1, wantBeta: 1},
		{name: "malformed body recorded with its reason, not retried", records: []record{{"m1", `{"id":`}, {"m2", "alpha"}},
			wantAlpha: 1, wantRecorded: []string{string(reasonUnroutable)}},
		{name: "empty body recorded, not retried", records: []record{{"m1", ""}},
			wantRecorded: []string{string(reasonUnroutable)}},
		{name: "malformed body without a failure queue is retried, for the redrive", records: []record{{"m1", `{"id":`}, {"m2", "alpha"}},
			noFailureQueue: true, wantRetry: []string{"m1"}, wantAlpha: 1},
		{name: "unreachable queue fails only its record", records: []record{{"m1", "alpha"}, {"m2", "beta"}, {"m3", "alpha"}},
			downed: []string{"beta"}, wantRetry: []string{"m2"}, wantAlpha: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			down := sqs.NewFromConfig(aws.Config{Region: motoserver.Region, Credentials: w.sqs.Options().Credentials, RetryMaxAttempts: 1},
				func(o *sqs.Options) { o.BaseEndpoint = aws.String("http://127.0.0.1:1") })
			rq := routedQueue{up: w.sqs, down: down}
			for _, c := range tc.downed {
				rq.downURLs = append(rq.downURLs, w.queues[c])
			}
			failures := w.failures
			if tc.noFailureQueue {
				failures = ""
			}
			d := New(NewOwnerCache(w.describe, w.clock), rq, w.cw, w.queues, failures, slog.New(slog.NewTextHandler(io.Discard, nil)))
			var batch events.SQSEvent
			for _, r := range tc.records {
				body := r.body
				switch body {
				case "alpha":
					body = string(fixture(t, "spot-interruption.json", "INSTANCE", w.alpha))
				case "beta":
					body = string(fixture(t, "spot-interruption.json", "INSTANCE", w.beta))
				}
				batch.Records = append(batch.Records, events.SQSMessage{MessageId: r.id, Body: body, EventSource: "aws:sqs"})
			}

			resp, err := d.HandleBatch(context.Background(), batch)
			if err != nil {
				t.Fatalf("HandleBatch = %v, want the failures reported per record, never the batch failed", err)
			}
			var retry []string
			for _, f := range resp.BatchItemFailures {
				retry = append(retry, f.ItemIdentifier)
			}
			if !slices.Equal(retry, tc.wantRetry) {
				t.Errorf("BatchItemFailures = %v, want %v", retry, tc.wantRetry)
			}
			if got := len(w.received(t, w.queues["alpha"])); got != tc.wantAlpha {
				t.Errorf("alpha got %d messages, want %d", got, tc.wantAlpha)
			}
			if got := len(w.received(t, w.queues["beta"])); got != tc.wantBeta {
				t.Errorf("beta got %d messages, want %d", got, tc.wantBeta)
			}
			var recorded []string
			for _, f := range w.failed(t) {
				recorded = append(recorded, f.attrs[AttrReason])
				if f.attrs[AttrDetail] == "" {
					t.Errorf("failure record %.40q has no detail", f.body)
				}
			}
			if !slices.Equal(recorded, tc.wantRecorded) {
				t.Errorf("failure queue holds %v, want %v", recorded, tc.wantRecorded)
			}
		})
	}
}
