package harness

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// EC2InstanceStatus serves DescribeInstanceStatus in EC2's Query protocol, as EC2 answers it: a
// form-encoded POST with Action=DescribeInstanceStatus, InstanceId.N, IncludeAllInstances
// and NextToken in; a DescribeInstanceStatusResponse document with instanceStatusSet items
// (instanceState, systemStatus, instanceStatus with details, eventsSet) and nextToken out;
// InvalidInstanceID.NotFound when an asked ID does not exist. Moto cannot report scheduled
// events or impaired status, so the poller's tests use this server.
//
// Set instances with Add and Set; read what was asked with Stats.
type EC2InstanceStatus struct {
	mu        sync.Mutex
	instances map[string]*Instance
	// PageSize is how many statuses one answer holds before a nextToken.
	PageSize int
	// Fail answers this many more calls with InternalError (500).
	Fail int
	// URL is the server's endpoint, for clients built by the test.
	URL string
	// Latency is how long each answer takes (5 ms by default, so parallel calls overlap).
	Latency time.Duration

	calls      int
	asked      [][]string // instance IDs of each call
	includeAll []bool     // IncludeAllInstances of each call
	inFlight   int
	maxFlight  int
}

// Instance is what EC2 reports for one instance.
type Instance struct {
	State          string // running (the default), stopped, ...
	InstanceStatus string // ok (the default), impaired, ...
	SystemStatus   string
	ImpairedSince  time.Time // reported in the details when set
	Events         []ScheduledEvent
}

// ScheduledEvent is one of an instance's scheduled events.
type ScheduledEvent struct {
	ID, Code, Description string
	NotBefore, NotAfter   time.Time
}

// NewEC2InstanceStatus starts the server and returns it with an EC2 client that sends every
// call to it once (no retries), so that calls can be counted.
func NewEC2InstanceStatus(t testing.TB) (*EC2InstanceStatus, *ec2.Client) {
	s := &EC2InstanceStatus{instances: map[string]*Instance{}, PageSize: 1000, Latency: 5 * time.Millisecond}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	cfg := AWSConfig(nil)
	cfg.Retryer = func() aws.Retryer { return aws.NopRetryer{} }
	return s, ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(srv.URL) })
}

// Add sets what EC2 reports for instance id.
func (s *EC2InstanceStatus) Add(id string, in *Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.State == "" {
		in.State = "running"
	}
	if in.InstanceStatus == "" {
		in.InstanceStatus = "ok"
	}
	if in.SystemStatus == "" {
		in.SystemStatus = "ok"
	}
	s.instances[id] = in
}

// Set changes what EC2 reports for instance id.
func (s *EC2InstanceStatus) Set(id string, f func(in *Instance)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.instances[id])
}

// Stats returns the calls answered, the most in flight at once, the instance IDs each call
// named and whether each asked IncludeAllInstances.
func (s *EC2InstanceStatus) Stats() (calls, maxFlight int, asked [][]string, includeAll []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.maxFlight, slices.Clone(s.asked), slices.Clone(s.includeAll)
}

// ServeHTTP answers one DescribeInstanceStatus call.
func (s *EC2InstanceStatus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost || r.Form.Get("Action") != "DescribeInstanceStatus" {
		http.Error(w, "unsupported", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.calls++
	s.inFlight++
	s.maxFlight = max(s.maxFlight, s.inFlight)
	latency := s.Latency
	s.mu.Unlock()
	time.Sleep(latency)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--

	var ids []string
	for i := 1; r.Form.Has(fmt.Sprintf("InstanceId.%d", i)); i++ {
		ids = append(ids, r.Form.Get(fmt.Sprintf("InstanceId.%d", i)))
	}
	s.asked = append(s.asked, ids)
	s.includeAll = append(s.includeAll, r.Form.Get("IncludeAllInstances") == "true")
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	if s.Fail > 0 {
		s.Fail--
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InternalError</Code><Message>An internal error has occurred</Message></Error></Errors><RequestID>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestID></Response>`)
		return
	}
	var missing []string
	for _, id := range ids {
		if s.instances[id] == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("The instance ID '%s' does not exist", missing[0])
		if len(missing) > 1 {
			msg = fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))
		}
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>%s</Message></Error></Errors><RequestID>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestID></Response>`, msg)
		return
	}
	if len(ids) == 0 { // the poller always names its instances
		http.Error(w, "the poller must name its instances", http.StatusBadRequest)
		return
	}
	start := 0
	if tok := r.Form.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InvalidParameterValue</Code><Message>Invalid NextToken</Message></Error></Errors><RequestID>x</RequestID></Response>`)
			return
		}
		start = n
	}
	end := min(start+s.PageSize, len(ids))
	var b strings.Builder
	for _, id := range ids[start:end] {
		in := s.instances[id]
		code := map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}[in.State]
		fmt.Fprintf(&b, `<item><instanceId>%s</instanceId><availabilityZone>eu-west-1a</availabilityZone><availabilityZoneId>euw1-az1</availabilityZoneId><instanceState><code>%d</code><name>%s</name></instanceState>`, id, code, in.State)
		summary := func(tag, status string) {
			reach, since := "passed", ""
			if status == "impaired" {
				reach = "failed"
				if !in.ImpairedSince.IsZero() {
					since = "<impairedSince>" + in.ImpairedSince.UTC().Format("2006-01-02T15:04:05.000Z") + "</impairedSince>"
				}
			}
			fmt.Fprintf(&b, `<%s><status>%s</status><details><item><name>reachability</name><status>%s</status>%s</item></details></%s>`, tag, status, reach, since, tag)
		}
		summary("systemStatus", in.SystemStatus)
		summary("instanceStatus", in.InstanceStatus)
		if len(in.Events) > 0 {
			b.WriteString("<eventsSet>")
			for _, e := range in.Events {
				fmt.Fprintf(&b, `<item><instanceEventId>%s</instanceEventId><code>%s</code><description>`, e.ID, e.Code)
				_ = xml.EscapeText(&b, []byte(e.Description))
				fmt.Fprintf(&b, `</description><notBefore>%s</notBefore>`, e.NotBefore.UTC().Format("2006-01-02T15:04:05.000Z"))
				if !e.NotAfter.IsZero() {
					fmt.Fprintf(&b, `<notAfter>%s</notAfter>`, e.NotAfter.UTC().Format("2006-01-02T15:04:05.000Z"))
				}
				b.WriteString(`</item>`)
			}
			b.WriteString("</eventsSet>")
		}
		b.WriteString("</item>")
	}
	next := ""
	if end < len(ids) {
		next = fmt.Sprintf("<nextToken>page-%d</nextToken>", end)
	}
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><DescribeInstanceStatusResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>3be1508e-c444-4fef-89cc-0b1223c4f02f</requestId><instanceStatusSet>%s</instanceStatusSet>%s</DescribeInstanceStatusResponse>`, b.String(), next)
}
