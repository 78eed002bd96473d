package app

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/handback"
	"github.com/health-router/health-router/router/options"
)

// sqsForwarder sends a pending event to Karpenter's interruption queue, as the router's
// forward mode does.
type sqsForwarder struct {
	api interface {
		SendMessage(context.Context, *sqs.SendMessageInput, ...func(*sqs.Options)) (*sqs.SendMessageOutput, error)
	}
	queueURL string
}

func (f sqsForwarder) Forward(ctx context.Context, body []byte) error {
	_, err := f.api.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(f.queueURL), MessageBody: aws.String(string(body))})
	return err
}

// Handback runs `health-router handback` against the cluster at restCfg.
func Handback(ctx context.Context, o options.Handback, restCfg *rest.Config) (handback.Report, error) {
	scheme, err := cluster.NewScheme()
	if err != nil {
		return handback.Report{}, err
	}
	kube, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return handback.Report{}, fmt.Errorf("connecting to the cluster: %w", err)
	}
	var fwd handback.Forwarder
	if o.KarpenterQueueURL != "" {
		var loaders []func(*config.LoadOptions) error
		if o.Region != "" {
			loaders = append(loaders, config.WithRegion(o.Region))
		}
		awsCfg, err := config.LoadDefaultConfig(ctx, loaders...)
		if err != nil {
			return handback.Report{}, fmt.Errorf("loading AWS configuration: %w", err)
		}
		if o.AWSEndpointURL != "" {
			awsCfg.BaseEndpoint = aws.String(o.AWSEndpointURL)
		}
		fwd = sqsForwarder{api: sqs.NewFromConfig(awsCfg), queueURL: o.KarpenterQueueURL}
	}
	h := handback.New(kube, fwd, clock.RealClock{}, handback.Options{Pending: o.Pending, DryRun: o.DryRun, LeaseNamespace: o.Namespace,
		LeaseName: o.LeaderElectionID, ConfirmTimeout: o.ConfirmTimeout, LedgerName: o.ShadowLedger,
		KarpenterVersion: o.KarpenterVersion})
	return h.Run(ctx)
}
