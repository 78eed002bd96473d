// Command dispatcher is the dispatcher Lambda: fed batches of the dispatcher queue by an SQS
// event source mapping, it routes the EventBridge events in them about EC2 instances to the
// intake queue of the EKS cluster that owns them. The logic is in package dispatch.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/utils/clock"

	"github.com/health-router/health-router/lambda/dispatch"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(context.Background(), log); err != nil {
		log.Error("dispatcher cannot start", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	queues, err := dispatch.ParseQueues(os.Getenv(dispatch.QueuesEnv))
	if err != nil {
		return err
	}
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return err
	}
	owners := dispatch.NewOwnerCache(ec2.NewFromConfig(cfg), clock.RealClock{})
	d := dispatch.New(owners, sqs.NewFromConfig(cfg), cloudwatch.NewFromConfig(cfg), queues, os.Getenv(dispatch.FailureQueueEnv), log).
		WithOrigin(os.Getenv(dispatch.AccountEnv), cfg.Region)
	lambda.Start(d.HandleBatch)
	return nil
}
