package app

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/options"
)

// A malformed queue URL is refused at start, naming the flag and what is wrong, before any
// AWS or Kubernetes client is made (no cluster is given here).
func TestRunRefusesAMalformedQueueURL(t *testing.T) {
	good := "https://sqs.eu-west-1.amazonaws.com/123456789012/hr-intake"
	for _, tc := range []struct {
		o    options.Run
		want string
	}{
		{options.Run{QueueURL: "arn:aws:sqs:eu-west-1:123456789012:hr-intake", DeadLetterQueueURL: good}, "--queue-url: \"arn:aws:sqs"},
		{options.Run{QueueURL: good, DeadLetterQueueURL: "https://sqs.eu-west-1.amazonaws.com/hr-dlq"}, "--dead-letter-queue-url: "},
		{options.Run{QueueURL: good, DeadLetterQueueURL: good + "2", KarpenterQueueURL: "Karpenter-prod"}, "--karpenter-queue-url: \"Karpenter-prod\" is not an SQS queue URL"},
	} {
		err := Run(context.Background(), tc.o, nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run = %v, want an error with %q", err, tc.want)
		}
	}
}
