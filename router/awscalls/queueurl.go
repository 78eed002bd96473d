package awscalls

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// QueueURL is an SQS queue URL taken apart.
type QueueURL struct {
	// Region is the URL's region, for an AWS endpoint ("" for another endpoint: a local
	// stand-in such as moto or LocalStack).
	Region  string
	Account string
	Name    string
}

var (
	queueName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,80}(\.fifo)?$`)
	account   = regexp.MustCompile(`^[0-9]{12}$`)
	// The hosts AWS serves SQS on: sqs.<region>.amazonaws.com (and .com.cn), its FIPS
	// endpoints, the legacy <region>.queue.amazonaws.com, and interface VPC endpoints.
	awsHost = regexp.MustCompile(`^(?:sqs(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com(?:\.cn)?|vpce-[a-z0-9-]+\.sqs\.([a-z0-9-]+)\.vpce\.amazonaws\.com(?:\.cn)?)$`)
)

// ParseQueueURL takes an SQS queue URL apart: https://sqs.<region>.amazonaws.com/<account>/<name>,
// or http(s)://<host>[:port]/<account>/<name> on another endpoint (a local stand-in). What
// is refused is refused with what is wrong, and with what was probably meant where a
// common mistake is recognised (a queue's ARN or name instead of its URL).
func ParseQueueURL(s string) (QueueURL, error) {
	bad := func(why string) (QueueURL, error) {
		return QueueURL{}, fmt.Errorf("%q is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>): %s", s, why)
	}
	switch {
	case s == "":
		return bad("empty")
	case strings.HasPrefix(s, "arn:"):
		return bad("it is an ARN; give the queue's URL (the Terraform module's queue_url output, or aws sqs get-queue-url)")
	case !strings.Contains(s, "/"):
		return bad("it is a name; give the queue's URL (aws sqs get-queue-url --queue-name " + s + ")")
	}
	u, err := url.Parse(s)
	if err != nil {
		return bad(err.Error())
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return bad(fmt.Sprintf("scheme %q, not https", u.Scheme))
	}
	if u.Hostname() == "" {
		return bad("no host")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return bad("a query or fragment after the queue's name")
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return bad("the path is not /<account>/<name>")
	}
	q := QueueURL{Account: parts[0], Name: parts[1]}
	if !queueName.MatchString(q.Name) {
		return bad(fmt.Sprintf("queue name %q: up to 80 letters, digits, - and _ (and .fifo)", q.Name))
	}
	host := strings.ToLower(u.Hostname())
	if !strings.HasSuffix(host, ".amazonaws.com") && !strings.HasSuffix(host, ".amazonaws.com.cn") {
		return q, nil // another endpoint: its host and port are its own
	}
	m := awsHost.FindStringSubmatch(host)
	if m == nil {
		return bad(fmt.Sprintf("host %q is not an SQS endpoint (sqs.<region>.amazonaws.com)", u.Host))
	}
	if u.Scheme != "https" {
		return bad("AWS serves SQS over https only")
	}
	if !account.MatchString(q.Account) {
		return bad(fmt.Sprintf("account %q is not 12 digits", q.Account))
	}
	q.Region = m[1] + m[2] + m[3]
	return q, nil
}
