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

// EC2InstanceStatus serves DescribeInstanceStatus, ModifyInstanceEventStartTime,
// RebootInstances and DescribeInstances in EC2's Query protocol, as EC2 answers them. Moto reports no scheduled events, no impaired status
// and does not serve ModifyInstanceEventStartTime, so the poller's and the reschedule
// package's tests use this server.
//
// DescribeInstanceStatus: a form-encoded POST with Action=DescribeInstanceStatus,
// InstanceId.N, IncludeAllInstances and NextToken in; a DescribeInstanceStatusResponse
// document with instanceStatusSet items (instanceState, systemStatus, instanceStatus with
// details, eventsSet with notBeforeDeadline when an event has one) and nextToken out;
// InvalidInstanceID.NotFound when an asked ID does not exist.
//
// ModifyInstanceEventStartTime: InstanceId, InstanceEventId and NotBefore in; a
// ModifyInstanceEventStartTimeResponse document with the moved event out, after which the
// event starts at NotBefore (and its NotAfter is shifted as much). Refused as EC2 refuses
// (Amazon EC2 User Guide, "Reschedule scheduled events"; the codes are EC2's documented
// ones, the messages this server's own): InvalidInstanceID.NotFound for an unknown
// instance, InvalidInstanceEventIDNotFound for an unknown event, and
// InvalidInstanceEventStartTime for an event without a deadline, an event that starts
// within 5 minutes (or has started), a new start less than 60 minutes ahead or after the
// deadline.
//
// RebootInstances: InstanceId.N in; every instance must exist. An instance whose
// RebootMigration is "default" and that has a system-reboot event is moved to new hardware
// (reboot migration, Amazon EC2 User Guide, "Reboot migration"): the event is cleared, unless
// MigrationFails, when EC2 reboots it in place and the event remains.
//
// DescribeInstances: InstanceId.N in; a DescribeInstancesResponse with one reservation per
// instance (instanceId, instanceState, maintenanceOptions with autoRecovery and, when set,
// rebootMigration) out. Only what the router reads of it: moto serves the rest of EC2.
//
// All honour DryRun as EC2 does (DryRunOperation, or UnauthorizedOperation for an action
// in Denied) unless IgnoreDryRun makes the server behave as local stand-ins do.
//
// Set instances with Add and Set; read what was asked with Stats and Moves.
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
	// Now is the server's clock, for the bounds of ModifyInstanceEventStartTime (time.Now
	// by default).
	Now func() time.Time
	// Denied lists the actions the caller may not call: answered UnauthorizedOperation.
	Denied map[string]bool
	// IgnoreDryRun answers a DryRun call as any other, as moto does.
	IgnoreDryRun bool
	// Scope, when set, is the instances the caller's grant of the writes (RebootInstances,
	// ModifyInstanceEventStartTime) reaches, as an IAM condition on the instance's tags does:
	// a write naming another instance (one that does not exist included) is answered
	// UnauthorizedOperation.
	Scope map[string]bool

	calls      int
	asked      [][]string // instance IDs of each call
	includeAll []bool     // IncludeAllInstances of each call
	inFlight   int
	maxFlight  int
	moves      []Move
	reboots    []Reboot
}

// Move is one ModifyInstanceEventStartTime call the server answered, and its answer.
type Move struct {
	InstanceID, EventID string
	NotBefore           time.Time // as asked; zero when it did not parse
	DryRun              bool
	// Error is the error code answered ("" for a moved event).
	Error string
}

// Reboot is one RebootInstances call.
type Reboot struct {
	InstanceIDs []string
	DryRun      bool
	// Error is the error code answered ("" for a reboot).
	Error string
}

// Reboots returns the RebootInstances calls made so far.
func (s *EC2InstanceStatus) Reboots() []Reboot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reboots)
}

// reboot answers one RebootInstances call (InstanceId.N) as EC2 does: every instance must
// exist (InvalidInstanceID.NotFound otherwise), DryRun and denials answered first.
func (s *EC2InstanceStatus) reboot(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rb := Reboot{DryRun: r.Form.Get("DryRun") == "true"}
	for i := 1; r.Form.Has("InstanceId." + strconv.Itoa(i)); i++ {
		rb.InstanceIDs = append(rb.InstanceIDs, r.Form.Get("InstanceId."+strconv.Itoa(i)))
	}
	defer func() { s.reboots = append(s.reboots, rb) }()
	if s.failed(w) {
		rb.Error = "InternalError"
		return
	}
	if rb.Error = s.unauthorized(w, r); rb.Error != "" {
		return
	}
	for _, id := range rb.InstanceIDs {
		if s.instances[id] == nil {
			rb.Error = "InvalidInstanceID.NotFound"
			ec2Error(w, http.StatusBadRequest, rb.Error, fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
	}
	for _, id := range rb.InstanceIDs {
		if in := s.instances[id]; in.RebootMigration == "default" && !in.MigrationFails {
			in.Events = slices.DeleteFunc(in.Events, func(e ScheduledEvent) bool { return e.Code == "system-reboot" })
		}
	}
	fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><RebootInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId><return>true</return></RebootInstancesResponse>`)
}

// Instance is what EC2 reports for one instance.
type Instance struct {
	State          string // running (the default), stopped, ...
	InstanceStatus string // ok (the default), impaired, ...
	SystemStatus   string
	ImpairedSince  time.Time // reported in the details when set
	Events         []ScheduledEvent
	// RebootMigration is maintenanceOptions.rebootMigration ("default", "disabled"; "" for an
	// instance that does not support it: not reported).
	RebootMigration string
	// MigrationFails: a reboot migration attempted on this instance does not happen (EC2
	// reboots it in place; the system-reboot event remains).
	MigrationFails bool
}

// ScheduledEvent is one of an instance's scheduled events.
type ScheduledEvent struct {
	ID, Code, Description string
	NotBefore, NotAfter   time.Time
	// NotBeforeDeadline is how late the event may be rescheduled (zero: it cannot be).
	NotBeforeDeadline time.Time
}

// NewEC2InstanceStatus starts the server and returns it with an EC2 client that sends every
// call to it once (no retries), so that calls can be counted.
func NewEC2InstanceStatus(t testing.TB) (*EC2InstanceStatus, *ec2.Client) {
	s := &EC2InstanceStatus{instances: map[string]*Instance{}, PageSize: 1000, Latency: 5 * time.Millisecond, Now: time.Now}
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

// SetFail answers the next n calls with InternalError, as Fail does; safe while the server
// answers (0 ends an outage).
func (s *EC2InstanceStatus) SetFail(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Fail = n
}

// Snapshot returns a copy of what the server reports for every instance, by ID: EC2 as it
// stands, for a checker that reads it beside the code under test (test/box/soak).
func (s *EC2InstanceStatus) Snapshot() map[string]Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Instance, len(s.instances))
	for id, in := range s.instances {
		c := *in
		c.Events = slices.Clone(in.Events)
		out[id] = c
	}
	return out
}

// Stats returns the calls answered, the most in flight at once, the instance IDs each call
// named and whether each asked IncludeAllInstances.
func (s *EC2InstanceStatus) Stats() (calls, maxFlight int, asked [][]string, includeAll []bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.maxFlight, slices.Clone(s.asked), slices.Clone(s.includeAll)
}

// Moves returns the ModifyInstanceEventStartTime calls answered, in order.
func (s *EC2InstanceStatus) Moves() []Move {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.moves)
}

// Event returns instance id's scheduled event eventID as the server holds it.
func (s *EC2InstanceStatus) Event(id, eventID string) (ScheduledEvent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.instances[id]; in != nil {
		for _, e := range in.Events {
			if e.ID == eventID {
				return e, true
			}
		}
	}
	return ScheduledEvent{}, false
}

// ec2Time is how EC2's Query protocol writes a time.
const ec2Time = "2006-01-02T15:04:05.000Z"

// ec2Error writes an EC2 error response.
func ec2Error(w http.ResponseWriter, status int, code, msg string) {
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>%s</Code><Message>`, code)
	_ = xml.EscapeText(w, []byte(msg))
	fmt.Fprint(w, `</Message></Error></Errors><RequestID>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</RequestID></Response>`)
}

// ServeHTTP answers one call.
func (s *EC2InstanceStatus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost {
		http.Error(w, "unsupported", http.StatusBadRequest)
		return
	}
	switch r.Form.Get("Action") {
	case "DescribeInstanceStatus":
		s.describe(w, r)
	case "ModifyInstanceEventStartTime":
		s.modify(w, r)
	case "RebootInstances":
		s.reboot(w, r)
	case "DescribeInstances":
		s.describeInstances(w, r)
	default:
		http.Error(w, "unsupported", http.StatusBadRequest)
	}
}

// unauthorized answers a denied or DryRun call as EC2 does, and returns the error code it
// answered: "" when the call goes on. Called with s.mu held.
func (s *EC2InstanceStatus) unauthorized(w http.ResponseWriter, r *http.Request) string {
	action := r.Form.Get("Action")
	if s.Scope != nil && (action == "RebootInstances" || action == "ModifyInstanceEventStartTime") {
		for k, vs := range r.Form {
			if (k == "InstanceId" || strings.HasPrefix(k, "InstanceId.")) && len(vs) > 0 && !s.Scope[vs[0]] {
				ec2Error(w, http.StatusForbidden, "UnauthorizedOperation", fmt.Sprintf("You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/health-router/test is not authorized to perform: ec2:%s on resource: arn:aws:ec2:eu-west-1:111122223333:instance/%s because no identity-based policy allows the ec2:%s action.", action, vs[0], action))
				return "UnauthorizedOperation"
			}
		}
	}
	if s.Denied[action] {
		ec2Error(w, http.StatusForbidden, "UnauthorizedOperation", fmt.Sprintf("You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/health-router/test is not authorized to perform: ec2:%s because no identity-based policy allows the ec2:%s action.", action, action))
		return "UnauthorizedOperation"
	}
	if r.Form.Get("DryRun") == "true" && !s.IgnoreDryRun {
		ec2Error(w, http.StatusPreconditionFailed, "DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
		return "DryRunOperation"
	}
	return ""
}

// failed answers an InternalError (500) while Fail is set. Called with s.mu held.
func (s *EC2InstanceStatus) failed(w http.ResponseWriter) bool {
	if s.Fail <= 0 {
		return false
	}
	s.Fail--
	ec2Error(w, http.StatusInternalServerError, "InternalError", "An internal error has occurred")
	return true
}

// modify answers one ModifyInstanceEventStartTime call.
func (s *EC2InstanceStatus) modify(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	id, eventID := r.Form.Get("InstanceId"), r.Form.Get("InstanceEventId")
	m := Move{InstanceID: id, EventID: eventID, DryRun: r.Form.Get("DryRun") == "true"}
	defer func() { s.moves = append(s.moves, m) }()
	refuse := func(status int, code, format string, args ...any) {
		m.Error = code
		ec2Error(w, status, code, fmt.Sprintf(format, args...))
	}
	newStart, badTime := time.Parse(time.RFC3339, r.Form.Get("NotBefore"))
	m.NotBefore = newStart
	if s.failed(w) {
		m.Error = "InternalError"
		return
	}
	if m.Error = s.unauthorized(w, r); m.Error != "" {
		return
	}
	for _, p := range []string{"InstanceId", "InstanceEventId", "NotBefore"} {
		if r.Form.Get(p) == "" {
			refuse(http.StatusBadRequest, "MissingParameter", "The request must contain the parameter %s", p)
			return
		}
	}
	if badTime != nil {
		refuse(http.StatusBadRequest, "InvalidParameterValue", "Value (%s) for parameter NotBefore is invalid", r.Form.Get("NotBefore"))
		return
	}
	in := s.instances[id]
	if in == nil {
		refuse(http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		return
	}
	i := slices.IndexFunc(in.Events, func(e ScheduledEvent) bool { return e.ID == eventID })
	if i < 0 {
		refuse(http.StatusBadRequest, "InvalidInstanceEventIDNotFound", "The event ID '%s' does not exist for instance '%s'", eventID, id)
		return
	}
	e := &in.Events[i]
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	const badStart = "InvalidInstanceEventStartTime"
	switch {
	case e.NotBeforeDeadline.IsZero():
		refuse(http.StatusBadRequest, badStart, "The event '%s' has no deadline and cannot be rescheduled", eventID)
	case !e.NotBefore.After(now.Add(5 * time.Minute)):
		refuse(http.StatusBadRequest, badStart, "The event '%s' starts within 5 minutes (%s) and cannot be rescheduled", eventID, e.NotBefore.UTC().Format(ec2Time))
	case newStart.Before(now.Add(time.Hour)):
		refuse(http.StatusBadRequest, badStart, "The new start time must be at least 60 minutes from the current time")
	case newStart.After(e.NotBeforeDeadline):
		refuse(http.StatusBadRequest, badStart, "The new start time must be on or before the event deadline %s", e.NotBeforeDeadline.UTC().Format(ec2Time))
	default:
		shift := newStart.Sub(e.NotBefore)
		e.NotBefore = newStart
		if !e.NotAfter.IsZero() {
			e.NotAfter = e.NotAfter.Add(shift)
		}
		var b strings.Builder
		writeEvent(&b, "event", *e)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ModifyInstanceEventStartTimeResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>59dbff89-35bd-4eac-99ed-be587EXAMPLE</requestId>%s</ModifyInstanceEventStartTimeResponse>`, b.String())
	}
}

// writeEvent writes e as an InstanceStatusEvent element named tag.
func writeEvent(b *strings.Builder, tag string, e ScheduledEvent) {
	fmt.Fprintf(b, `<%s><instanceEventId>%s</instanceEventId><code>%s</code><description>`, tag, e.ID, e.Code)
	_ = xml.EscapeText(b, []byte(e.Description))
	fmt.Fprintf(b, `</description><notBefore>%s</notBefore>`, e.NotBefore.UTC().Format(ec2Time))
	if !e.NotAfter.IsZero() {
		fmt.Fprintf(b, `<notAfter>%s</notAfter>`, e.NotAfter.UTC().Format(ec2Time))
	}
	if !e.NotBeforeDeadline.IsZero() {
		fmt.Fprintf(b, `<notBeforeDeadline>%s</notBeforeDeadline>`, e.NotBeforeDeadline.UTC().Format(ec2Time))
	}
	fmt.Fprintf(b, `</%s>`, tag)
}

// describeInstances answers one DescribeInstances call for the instances it names.
func (s *EC2InstanceStatus) describeInstances(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	if s.failed(w) || s.unauthorized(w, r) != "" {
		return
	}
	var b strings.Builder
	for i := 1; r.Form.Has("InstanceId." + strconv.Itoa(i)); i++ {
		id := r.Form.Get("InstanceId." + strconv.Itoa(i))
		in := s.instances[id]
		if in == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
		code := map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}[in.State]
		migration := ""
		if in.RebootMigration != "" {
			migration = "<rebootMigration>" + in.RebootMigration + "</rebootMigration>"
		}
		fmt.Fprintf(&b, `<item><reservationId>r-%s</reservationId><ownerId>111122223333</ownerId><instancesSet><item><instanceId>%s</instanceId><instanceState><code>%d</code><name>%s</name></instanceState><maintenanceOptions><autoRecovery>default</autoRecovery>%s</maintenanceOptions></item></instancesSet></item>`,
			strings.TrimPrefix(id, "i-"), id, code, in.State, migration)
	}
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>8f7724cf-496f-496e-8fe3-example</requestId><reservationSet>%s</reservationSet></DescribeInstancesResponse>`, b.String())
}

// describe answers one DescribeInstanceStatus call.
func (s *EC2InstanceStatus) describe(w http.ResponseWriter, r *http.Request) {
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
	if s.failed(w) || s.unauthorized(w, r) != "" {
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
		ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", msg)
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
			ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "Invalid NextToken")
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
					since = "<impairedSince>" + in.ImpairedSince.UTC().Format(ec2Time) + "</impairedSince>"
				}
			}
			fmt.Fprintf(&b, `<%s><status>%s</status><details><item><name>reachability</name><status>%s</status>%s</item></details></%s>`, tag, status, reach, since, tag)
		}
		summary("systemStatus", in.SystemStatus)
		summary("instanceStatus", in.InstanceStatus)
		if len(in.Events) > 0 {
			b.WriteString("<eventsSet>")
			for _, e := range in.Events {
				writeEvent(&b, "item", e)
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
