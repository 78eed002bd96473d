package app

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/iam"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/health-router/health-router/router/cluster"
	"github.com/health-router/health-router/router/doctor"
	"github.com/health-router/health-router/router/options"
)

// Doctor checks a live setup with the caller's credentials (run it as the router).
func Doctor(ctx context.Context, o options.Doctor, restCfg *rest.Config) (doctor.Report, error) {
	var loaders []func(*config.LoadOptions) error
	if o.Region != "" {
		loaders = append(loaders, config.WithRegion(o.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loaders...)
	if err != nil {
		return nil, fmt.Errorf("loading AWS configuration: %w", err)
	}
	if o.AWSEndpointURL != "" {
		awsCfg.BaseEndpoint = aws.String(o.AWSEndpointURL)
	}
	scheme, err := cluster.NewScheme()
	if err != nil {
		return nil, err
	}
	var kube client.Client // nil without a cluster: doctor says what it could not check
	if restCfg != nil {
		if kube, err = client.New(restCfg, client.Options{Scheme: scheme}); err != nil {
			return nil, fmt.Errorf("connecting to the cluster: %w", err)
		}
	}
	d := doctor.New(sqs.NewFromConfig(awsCfg), eventbridge.NewFromConfig(awsCfg), ec2.NewFromConfig(awsCfg), iam.NewFromConfig(awsCfg), sts.NewFromConfig(awsCfg), kube)
	return d.Run(ctx, doctor.Config{
		QueueURL: o.QueueURL, DeadLetterQueueURL: o.DeadLetterQueueURL, KarpenterQueueURL: o.KarpenterQueueURL,
		KarpenterRoleARN: o.KarpenterRoleARN, KarpenterNamespace: o.KarpenterNamespace, KarpenterDeployment: o.KarpenterDeployment, Namespace: o.Namespace, Gates: o.Gates,
		KarpenterVersion:     o.KarpenterVersion,
		InstanceStatusPoller: o.InstanceStatusPoller, Reschedule: o.Reschedule, RebootInPlace: o.RebootInPlace, Shadow: o.Shadow,
		EventWindows: o.EventWindows, ClusterName: o.ClusterName,
	}), nil
}
