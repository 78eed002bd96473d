// Package awscalls counts every AWS API call the router makes, by API and result, with an
// aws-sdk-go-v2 middleware: one place for all clients (SQS, EC2, CloudWatch), so that the
// economy of the checks and the intake shows in health_router_aws_calls_total. It is also
// the one place that says what a failed call means (Classify: transient, or the queue is
// missing, the caller denied, the credentials refused) and what an SQS queue URL is
// (ParseQueueURL), for the router, its readiness and doctor alike.
package awscalls

import (
	"context"
	"errors"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/health-router/health-router/router/metrics"
)

// ResultSuccess is the result label of a call that succeeded; a failed call is labelled with
// its AWS error code (RequestLimitExceeded, ...) or "error" when there is none (no answer).
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// NewCounter returns the health_router_aws_calls_total counter, registered with reg.
func NewCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.AWSCalls,
		Help: "AWS API calls made by the router (after the SDK's retries), by API and result (success, the AWS error code, or error when there is none).",
	}, []string{metrics.LabelAPI, metrics.LabelResult})
	reg.MustRegister(c)
	return c
}

// Middleware returns an SDK API option that counts each operation once, after retries;
// add it with config.WithAPIOptions or the client's APIOptions. onError, if not nil, is
// told the API of each failed operation (for the CloudWatch AWSCallErrors metric).
func Middleware(calls *prometheus.CounterVec, onError func(api string)) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("HealthRouterCallCount",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				api := awsmiddleware.GetOperationName(ctx)
				calls.WithLabelValues(api, result(err)).Inc()
				if err != nil && onError != nil {
					onError(api)
				}
				return out, md, err
			}), middleware.After)
	}
}

func result(err error) string {
	if err == nil {
		return ResultSuccess
	}
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() != "" {
		return ae.ErrorCode()
	}
	return ResultError
}
