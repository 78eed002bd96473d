package dispatch

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/events"
)

// HandleBatch routes the events of one batch of the dispatcher queue, each record's body the
// EventBridge event a rule sent there, and reports the records to retry. The queue stands
// between EventBridge and the Lambda so that nothing invokes the Lambda directly: a
// function's resource policy can only add grants, so with a Lambda permission any principal
// of the account whose identity policy allows lambda:InvokeFunction could hand it a forged
// body to send under its role; the queue's policy denies every sender but the module's rules.
//
// A record is routed as Handle routes an event, and fails when Handle would have failed the
// invocation: SQS makes it visible again and, after the queue's maxReceiveCount, moves it to
// the failure queue (its dead-letter queue). A record Handle settles (routed, dropped and
// counted, or recorded in the failure queue with its reason, as a malformed body is) is
// deleted, so one bad record neither holds up the batch nor returns forever. The batch never
// fails as a whole: that would retry, and deliver again, the records that were routed.
func (d *Dispatcher) HandleBatch(ctx context.Context, batch events.SQSEvent) (events.SQSEventResponse, error) {
	var resp events.SQSEventResponse
	for _, r := range batch.Records {
		if err := d.Handle(ctx, json.RawMessage(r.Body)); err != nil {
			d.log.Warn("record not routed; SQS retries it, then dead-letters it to the failure queue",
				"message_id", r.MessageId, "error", err)
			resp.BatchItemFailures = append(resp.BatchItemFailures, events.SQSBatchItemFailure{ItemIdentifier: r.MessageId})
		}
	}
	return resp, nil
}
