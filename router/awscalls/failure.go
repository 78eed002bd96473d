package awscalls

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/aws/smithy-go"
)

// Failure is what a failed AWS call means to whoever made it: whether a retry can mend it,
// and, when not, what the owner has to fix. It is decided here, once, for every caller (the
// intake's readiness, the queue checks at start, doctor).
type Failure int

const (
	// Transient: throttling, a 5xx, a timeout, or an AWS error of no class below. A retry
	// may mend it; it says nothing about the setup.
	Transient Failure = iota
	// Unreachable: no answer at all (the endpoint's name does not resolve, the connection is
	// refused). Transient for a loop that retries, but to doctor a sign of a wrong endpoint.
	Unreachable
	// NotFound: the queue (or other resource) named does not exist.
	NotFound
	// Denied: the caller's credentials are valid, and not allowed the call.
	Denied
	// Credentials: the credentials are refused (invalid, expired, signed with a wrong key).
	Credentials
)

// Permanent reports whether no retry mends f: only the owner, fixing the setup, does.
func (f Failure) Permanent() bool { return f == NotFound || f == Denied || f == Credentials }

// String says what f means, for a log line, a readiness reason or a checklist.
func (f Failure) String() string {
	switch f {
	case Unreachable:
		return "unreachable"
	case NotFound:
		return "does not exist"
	case Denied:
		return "access denied"
	case Credentials:
		return "credentials refused"
	}
	return "transient error"
}

// The error codes of each permanent class, as SQS answers them in both of its protocols (the
// Query protocol's code, which the JSON protocol also sends in x-amzn-query-error and the SDK
// reports, and the JSON protocol's own), and as STS, EC2 and the other services answer.
var (
	notFoundCodes = map[string]bool{
		"AWS.SimpleQueueService.NonExistentQueue": true,
		"QueueDoesNotExist":                       true,
	}
	deniedCodes = map[string]bool{
		"AccessDenied":              true,
		"AccessDeniedException":     true,
		"UnauthorizedOperation":     true, // EC2
		"KMS.AccessDeniedException": true, // SQS on a queue whose key denies the caller
	}
	credentialCodes = map[string]bool{
		"InvalidClientTokenId":        true, // "The security token included in the request is invalid."
		"UnrecognizedClientException": true,
		"InvalidAccessKeyId":          true,
		"ExpiredToken":                true,
		"ExpiredTokenException":       true,
		"RequestExpired":              true,
		"SignatureDoesNotMatch":       true,
		"InvalidSignatureException":   true,
		"IncompleteSignature":         true,
		"MissingAuthenticationToken":  true,
		"InvalidSecurity":             true,
		"AuthFailure":                 true, // EC2
	}
)

// Classify says what err, returned by an AWS SDK call, means. A nil error is Transient: ask
// only about failures.
func Classify(err error) Failure {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch code := ae.ErrorCode(); {
		case notFoundCodes[code]:
			return NotFound
		case deniedCodes[code]:
			return Denied
		case credentialCodes[code]:
			return Credentials
		}
		return Transient
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Transient
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsTemporary || dns.IsTimeout {
			return Transient
		}
		return Unreachable
	}
	var op *net.OpError
	if errors.As(err, &op) && !op.Timeout() {
		return Unreachable // refused, reset, no route
	}
	// The SDK found no credentials at all (no environment, profile, web identity or
	// instance role): no call can be made.
	if msg := err.Error(); strings.Contains(msg, "get identity: ") || strings.Contains(msg, "failed to refresh cached credentials") {
		return Credentials
	}
	return Transient
}

// Describe is err with what it means in front: "does not exist: operation error SQS: ...".
func Describe(err error) string {
	return Classify(err).String() + ": " + err.Error()
}
