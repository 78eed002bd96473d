package awscalls

import (
	"errors"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
)

// ec2ServerFaults are EC2 error codes of faults on its side (answered with a 5xx status, which
// Unanswered also reads; the code alone says it when the status is lost).
var ec2ServerFaults = map[string]bool{"InternalError": true, "InternalFailure": true, "ServiceUnavailable": true, "Unavailable": true}

// Unanswered reports whether an EC2 write failed without EC2 deciding it: no API error at all
// (the network), throttling or a retryable code past the SDK's retries, or a fault on EC2's
// side. Otherwise EC2 answered and refused (a client error): asking again at once does not help.
func Unanswered(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return true
	}
	code := ae.ErrorCode()
	_, throttled := retry.DefaultThrottleErrorCodes[code]
	_, timedOut := retry.DefaultRetryableErrorCodes[code]
	var re *awshttp.ResponseError
	return throttled || timedOut || ec2ServerFaults[code] || (errors.As(err, &re) && re.HTTPStatusCode() >= 500)
}
