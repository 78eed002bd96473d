package awscalls

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/aws/smithy-go"
)

func TestClassify(t *testing.T) {
	api := func(code string) error {
		return fmt.Errorf("operation error SQS: ReceiveMessage: %w", &smithy.GenericAPIError{Code: code, Message: "m"})
	}
	for _, tc := range []struct {
		name string
		err  error
		want Failure
	}{
		{"query protocol missing queue", api("AWS.SimpleQueueService.NonExistentQueue"), NotFound},
		{"json protocol missing queue", api("QueueDoesNotExist"), NotFound},
		{"denied", api("AccessDenied"), Denied},
		{"denied json", api("AccessDeniedException"), Denied},
		{"invalid token", api("InvalidClientTokenId"), Credentials},
		{"expired token", api("ExpiredToken"), Credentials},
		{"unrecognised client", api("UnrecognizedClientException"), Credentials},
		{"throttled", api("ThrottlingException"), Transient},
		{"request throttled", api("RequestThrottled"), Transient},
		{"5xx", api("InternalError"), Transient},
		{"validation is not a setup problem", api("InvalidParameterValue"), Transient},
		{"timeout", fmt.Errorf("receiving: %w", context.DeadlineExceeded), Transient},
		{"dns", fmt.Errorf("send: %w", &net.DNSError{Err: "no such host", Name: "sqs.nowhere.amazonaws.com", IsNotFound: true}), Unreachable},
		{"dns timeout", fmt.Errorf("send: %w", &net.DNSError{Err: "i/o timeout", IsTimeout: true}), Transient},
		{"refused", fmt.Errorf("send: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), Unreachable},
		{"no credentials", errors.New("operation error SQS: ReceiveMessage, get identity: get credentials: failed to refresh cached credentials, no EC2 IMDS role found"), Credentials},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Classify(tc.err)
			if got != tc.want {
				t.Fatalf("Classify(%v) = %s, want %s", tc.err, got, tc.want)
			}
			if want := tc.want == NotFound || tc.want == Denied || tc.want == Credentials; got.Permanent() != want {
				t.Errorf("Permanent() = %v", got.Permanent())
			}
		})
	}
}

func TestParseQueueURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		want   QueueURL
		refuse string // part of the error, "" when accepted
	}{
		{url: "https://sqs.eu-west-1.amazonaws.com/123456789012/hr-intake", want: QueueURL{Region: "eu-west-1", Account: "123456789012", Name: "hr-intake"}},
		{url: "https://sqs.cn-north-1.amazonaws.com.cn/123456789012/q.fifo", want: QueueURL{Region: "cn-north-1", Account: "123456789012", Name: "q.fifo"}},
		{url: "https://eu-west-1.queue.amazonaws.com/123456789012/q", want: QueueURL{Region: "eu-west-1", Account: "123456789012", Name: "q"}},
		{url: "https://vpce-0abc-1234.sqs.us-east-1.vpce.amazonaws.com/123456789012/q", want: QueueURL{Region: "us-east-1", Account: "123456789012", Name: "q"}},
		{url: "http://127.0.0.1:5000/123456789012/hr-intake", want: QueueURL{Account: "123456789012", Name: "hr-intake"}},
		{url: "http://localstack:4566/000000000000/q", want: QueueURL{Account: "000000000000", Name: "q"}},
		{url: "", refuse: "empty"},
		{url: "arn:aws:sqs:eu-west-1:123456789012:hr-intake", refuse: "it is an ARN"},
		{url: "hr-intake", refuse: "it is a name"},
		{url: "ftp://sqs.eu-west-1.amazonaws.com/123456789012/q", refuse: `scheme "ftp"`},
		{url: "http://sqs.eu-west-1.amazonaws.com/123456789012/q", refuse: "https only"},
		{url: "https:///123456789012/q", refuse: "no host"},
		{url: "https://sqs.eu-west-1.amazonaws.com/hr-intake", refuse: "not /<account>/<name>"},
		{url: "https://sqs.eu-west-1.amazonaws.com/123456789012/q/extra", refuse: "not /<account>/<name>"},
		{url: "https://sqs.eu-west-1.amazonaws.com/12345/q", refuse: "not 12 digits"},
		{url: "https://sqs.eu-west-1.amazonaws.com/123456789012/bad name", refuse: "queue name"},
		{url: "https://s3.eu-west-1.amazonaws.com/123456789012/q", refuse: "not an SQS endpoint"},
		{url: "https://sqs.eu-west-1.amazonaws.com/123456789012/q?x=1", refuse: "query"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			got, err := ParseQueueURL(tc.url)
			if tc.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("ParseQueueURL(%q) = %+v, %v; want an error with %q", tc.url, got, err, tc.refuse)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseQueueURL(%q) = %+v, %v; want %+v", tc.url, got, err, tc.want)
			}
		})
	}
}
