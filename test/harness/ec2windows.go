package harness

import (
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
)

// EC2EventWindows serves EC2's event windows and instance tags in EC2's Query protocol, with
// state, as EC2 answers them: CreateInstanceEventWindow, ModifyInstanceEventWindow,
// AssociateInstanceEventWindow, DisassociateInstanceEventWindow, DeleteInstanceEventWindow,
// DescribeInstanceEventWindows and CreateTags. Moto serves no event windows.
//
// It refuses what EC2 documents it refuses (Amazon EC2 User Guide, "Define event windows for
// scheduled events", Considerations; API reference, CreateInstanceEventWindow): a time range
// under 2 hours, ranges under 4 hours a week in all, an hour outside 0-23, time ranges and a
// cron expression together; more than 200 windows in the region; a target (an instance tag)
// already associated with another window, a second target type, more than 50 tags; and a
// window with targets deleted without ForceDelete. The codes are EC2's common client errors
// (InvalidParameterValue, InvalidParameterCombination, ResourceLimitExceeded); which code EC2
// gives each refusal is not documented, and the router reads none of them. A time range that
// ends before it starts in the week (Saturday into Sunday) is refused too: EC2 does not
// document it, and the router never writes one.
//
// CreateTags: ResourceId.N and Tag.N.Key/Value; every instance must exist (Add), else
// InvalidInstanceID.NotFound; with Scope set, an instance outside it is UnauthorizedOperation,
// as the Terraform module's grant conditioned on the instance's tags answers.
//
// Every call honours DryRun before it looks anything up (DryRunOperation, or
// UnauthorizedOperation for an action in Denied); Fail answers that many calls InternalError.
type EC2EventWindows struct {
	mu      sync.Mutex
	windows map[string]*EventWindow
	tags    map[string]map[string]string // instance ID -> tags
	nextID  int
	calls   []string // Action of each call, DryRun ones included

	// Limit is how many windows the region holds (200, EC2's).
	Limit int
	// Fail answers this many more calls with InternalError (500).
	Fail int
	// Denied lists the actions the caller may not call: answered UnauthorizedOperation.
	Denied map[string]bool
	// Scope, when set, is the instances CreateTags may tag.
	Scope map[string]bool
	// PageSize is how many windows one DescribeInstanceEventWindows answer holds.
	PageSize int
}

// EventWindow is one event window as the server holds it.
type EventWindow struct {
	ID, Name, Cron string
	Ranges         []WindowRange
	Tags           map[string]string
	// TargetTags are the instance tags associated with it, "key=value"; TargetInstances the
	// instance IDs; TargetHosts the Dedicated Host IDs.
	TargetTags, TargetInstances, TargetHosts []string
}

// WindowRange is one time range of a window: weekdays as EC2 writes them (sunday, monday...).
type WindowRange struct {
	StartWeekDay string
	StartHour    int
	EndWeekDay   string
	EndHour      int
}

// NewEC2EventWindows starts the server and returns it with an EC2 client that sends every
// call to it once (no retries), so that calls can be counted.
func NewEC2EventWindows(t testing.TB) (*EC2EventWindows, *ec2.Client) {
	s, c, stop := StartEC2EventWindows()
	t.Cleanup(stop)
	return s, c
}

// StartEC2EventWindows is NewEC2EventWindows for a caller with no testing.TB (the simulation's
// runs): stop closes the server.
func StartEC2EventWindows() (*EC2EventWindows, *ec2.Client, func()) {
	s := &EC2EventWindows{windows: map[string]*EventWindow{}, tags: map[string]map[string]string{}, Limit: 200, PageSize: 50}
	srv := httptest.NewServer(s)
	cfg := AWSConfig(nil)
	cfg.Retryer = func() aws.Retryer { return aws.NopRetryer{} }
	return s, ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(srv.URL) }), srv.Close
}

// AddInstance makes instance id exist, with tags.
func (s *EC2EventWindows) AddInstance(id string, tags map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[id] = maps.Clone(tags)
	if s.tags[id] == nil {
		s.tags[id] = map[string]string{}
	}
}

// InstanceTags returns instance id's tags.
func (s *EC2EventWindows) InstanceTags(id string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.tags[id])
}

// Windows returns the windows the server holds, by ID.
func (s *EC2EventWindows) Windows() map[string]EventWindow {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]EventWindow{}
	for id, w := range s.windows {
		c := *w
		c.Ranges, c.Tags = slices.Clone(w.Ranges), maps.Clone(w.Tags)
		c.TargetTags, c.TargetInstances, c.TargetHosts = slices.Clone(w.TargetTags), slices.Clone(w.TargetInstances), slices.Clone(w.TargetHosts)
		out[id] = c
	}
	return out
}

// PutWindow adds a window as another owner would have made it, and returns its ID.
func (s *EC2EventWindows) PutWindow(w EventWindow) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	w.ID = fmt.Sprintf("iew-%017x", s.nextID)
	s.windows[w.ID] = &w
	return w.ID
}

// RemoveWindow deletes window id as another owner would.
func (s *EC2EventWindows) RemoveWindow(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.windows, id)
}

// Calls returns the Action of every call answered, in order.
func (s *EC2EventWindows) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// ServeHTTP answers one call.
func (s *EC2EventWindows) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != http.MethodPost {
		http.Error(w, "unsupported", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	action := r.Form.Get("Action")
	s.calls = append(s.calls, action)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	if s.Fail > 0 {
		s.Fail--
		ec2Error(w, http.StatusInternalServerError, "InternalError", "An internal error has occurred")
		return
	}
	if s.Denied[action] {
		ec2Error(w, http.StatusForbidden, "UnauthorizedOperation", fmt.Sprintf("You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/health-router/test is not authorized to perform: ec2:%s", action))
		return
	}
	f := r.Form
	switch action {
	case "CreateTags":
		s.createTags(w, f)
	case "CreateInstanceEventWindow", "ModifyInstanceEventWindow":
		s.put(w, f, action)
	case "AssociateInstanceEventWindow", "DisassociateInstanceEventWindow":
		s.associate(w, f, action)
	case "DeleteInstanceEventWindow":
		s.delete(w, f)
	case "DescribeInstanceEventWindows":
		s.describe(w, f)
	default:
		http.Error(w, "unsupported", http.StatusBadRequest)
	}
}

// dryRun answers a DryRun call: it would have succeeded. Called with s.mu held.
func dryRun(w http.ResponseWriter, f url.Values) bool {
	if f.Get("DryRun") != "true" {
		return false
	}
	ec2Error(w, http.StatusPreconditionFailed, "DryRunOperation", "Request would have succeeded, but DryRun flag is set.")
	return true
}

// list reads the values of prefix.1, prefix.2, ...
func list(f url.Values, prefix string) []string {
	var out []string
	for i := 1; f.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, f.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// tagList reads prefix.N.Key and prefix.N.Value.
func tagList(f url.Values, prefix string) [][2]string {
	var out [][2]string
	for i := 1; f.Has(fmt.Sprintf("%s.%d.Key", prefix, i)); i++ {
		out = append(out, [2]string{f.Get(fmt.Sprintf("%s.%d.Key", prefix, i)), f.Get(fmt.Sprintf("%s.%d.Value", prefix, i))})
	}
	return out
}

func (s *EC2EventWindows) createTags(w http.ResponseWriter, f url.Values) {
	ids, tags := list(f, "ResourceId"), tagList(f, "Tag")
	if s.Scope != nil {
		for _, id := range ids {
			if !s.Scope[id] {
				ec2Error(w, http.StatusForbidden, "UnauthorizedOperation", fmt.Sprintf("You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/health-router/test is not authorized to perform: ec2:CreateTags on resource: arn:aws:ec2:eu-west-1:111122223333:instance/%s", id))
				return
			}
		}
	}
	if dryRun(w, f) {
		return
	}
	if len(ids) == 0 || len(tags) == 0 {
		ec2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameters ResourceId and Tag")
		return
	}
	for _, id := range ids {
		if s.tags[id] == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance ID '%s' does not exist", id))
			return
		}
	}
	for _, id := range ids {
		for _, t := range tags {
			s.tags[id][t[0]] = t[1]
		}
	}
	fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><CreateTagsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId><return>true</return></CreateTagsResponse>`)
}

var weekDays = []string{"sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"}

// ranges reads and checks TimeRange.N; the message is "" when EC2 takes them.
func ranges(f url.Values) ([]WindowRange, string) {
	var out []WindowRange
	total := 0
	for i := 1; f.Has(fmt.Sprintf("TimeRange.%d.StartWeekDay", i)); i++ {
		p := fmt.Sprintf("TimeRange.%d.", i)
		r := WindowRange{StartWeekDay: f.Get(p + "StartWeekDay"), EndWeekDay: f.Get(p + "EndWeekDay")}
		var err1, err2 error
		r.StartHour, err1 = strconv.Atoi(f.Get(p + "StartHour"))
		r.EndHour, err2 = strconv.Atoi(f.Get(p + "EndHour"))
		sd, ed := slices.Index(weekDays, r.StartWeekDay), slices.Index(weekDays, r.EndWeekDay)
		switch {
		case err1 != nil || err2 != nil || r.StartHour < 0 || r.StartHour > 23 || r.EndHour < 0 || r.EndHour > 23:
			return nil, fmt.Sprintf("Value for parameter TimeRange.%d is invalid: the hours must be 0 to 23", i)
		case sd < 0 || ed < 0:
			return nil, fmt.Sprintf("Value for parameter TimeRange.%d is invalid: unknown week day", i)
		}
		h := (ed*24 + r.EndHour) - (sd*24 + r.StartHour)
		switch {
		case h <= 0:
			return nil, fmt.Sprintf("Value for parameter TimeRange.%d is invalid: the range must end after it starts", i)
		case h < 2:
			return nil, fmt.Sprintf("Value for parameter TimeRange.%d is invalid: each time range must be at least 2 hours", i)
		}
		total += h
		out = append(out, r)
	}
	if len(out) > 0 && total < 4 {
		return nil, "The event window must be at least 4 hours: the combined time ranges total " + strconv.Itoa(total) + " hours"
	}
	return out, ""
}

// put answers CreateInstanceEventWindow and ModifyInstanceEventWindow.
func (s *EC2EventWindows) put(w http.ResponseWriter, f url.Values, action string) {
	rs, bad := ranges(f)
	if dryRun(w, f) { // permission first, as EC2 answers DryRun
		return
	}
	var win *EventWindow
	if action == "ModifyInstanceEventWindow" {
		if win = s.windows[f.Get("InstanceEventWindowId")]; win == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceEventWindowId.NotFound", fmt.Sprintf("The event window ID '%s' does not exist", f.Get("InstanceEventWindowId")))
			return
		}
	}
	switch {
	case bad != "":
		ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", bad)
		return
	case len(rs) > 0 && f.Get("CronExpression") != "":
		ec2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "You can specify either time ranges or a cron expression, not both")
		return
	case action == "CreateInstanceEventWindow" && len(s.windows) >= s.Limit:
		ec2Error(w, http.StatusBadRequest, "ResourceLimitExceeded", fmt.Sprintf("You have reached the limit of %d event windows in this Region", s.Limit))
		return
	}
	if win == nil {
		s.nextID++
		win = &EventWindow{ID: fmt.Sprintf("iew-%017x", s.nextID), Tags: map[string]string{}}
		for i := 1; f.Has(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); i++ {
			if rt := f.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); rt != "instance-event-window" {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("'%s' is not a valid taggable resource type for this operation", rt))
				return
			}
			for _, t := range tagList(f, fmt.Sprintf("TagSpecification.%d.Tag", i)) {
				win.Tags[t[0]] = t[1]
			}
		}
		s.windows[win.ID] = win
	}
	if f.Has("Name") {
		win.Name = f.Get("Name")
	}
	if len(rs) > 0 || f.Has("CronExpression") {
		win.Ranges, win.Cron = rs, f.Get("CronExpression")
	}
	writeWindow(w, action, "instanceEventWindow", win)
}

// associate answers AssociateInstanceEventWindow and DisassociateInstanceEventWindow for
// instance tags, instance IDs and Dedicated Host IDs.
func (s *EC2EventWindows) associate(w http.ResponseWriter, f url.Values, action string) {
	if dryRun(w, f) {
		return
	}
	win := s.windows[f.Get("InstanceEventWindowId")]
	if win == nil {
		ec2Error(w, http.StatusBadRequest, "InvalidInstanceEventWindowId.NotFound", fmt.Sprintf("The event window ID '%s' does not exist", f.Get("InstanceEventWindowId")))
		return
	}
	var tags []string
	for _, t := range tagList(f, "AssociationTarget.InstanceTag") {
		tags = append(tags, t[0]+"="+t[1])
	}
	ids := list(f, "AssociationTarget.InstanceId")
	hosts := list(f, "AssociationTarget.DedicatedHostId")
	if action == "DisassociateInstanceEventWindow" {
		win.TargetTags = slices.DeleteFunc(win.TargetTags, func(t string) bool { return slices.Contains(tags, t) })
		win.TargetInstances = slices.DeleteFunc(win.TargetInstances, func(id string) bool { return slices.Contains(ids, id) })
		win.TargetHosts = slices.DeleteFunc(win.TargetHosts, func(id string) bool { return slices.Contains(hosts, id) })
		writeWindow(w, action, "instanceEventWindow", win)
		return
	}
	kinds := 0
	for _, n := range []int{len(tags) + len(win.TargetTags), len(ids) + len(win.TargetInstances), len(hosts) + len(win.TargetHosts)} {
		if n > 0 {
			kinds++
		}
	}
	switch {
	case kinds > 1:
		ec2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "Only one type of target (instance IDs, Dedicated Host IDs, or tags) can be associated with an event window")
		return
	case len(tags)+len(win.TargetTags) > 50 || len(ids)+len(win.TargetInstances) > 100 || len(hosts)+len(win.TargetHosts) > 50:
		ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "An event window takes at most 50 instance tags, 100 instance IDs or 50 Dedicated Host IDs")
		return
	}
	for _, other := range s.windows {
		if other == win {
			continue
		}
		for _, t := range tags {
			if slices.Contains(other.TargetTags, t) {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("The target %s is already associated with event window %s", t, other.ID))
				return
			}
		}
		for _, id := range slices.Concat(ids, hosts) {
			if slices.Contains(other.TargetInstances, id) || slices.Contains(other.TargetHosts, id) {
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("The target %s is already associated with event window %s", id, other.ID))
				return
			}
		}
	}
	for _, t := range tags {
		if !slices.Contains(win.TargetTags, t) {
			win.TargetTags = append(win.TargetTags, t)
		}
	}
	for _, id := range ids {
		if !slices.Contains(win.TargetInstances, id) {
			win.TargetInstances = append(win.TargetInstances, id)
		}
	}
	for _, id := range hosts {
		if !slices.Contains(win.TargetHosts, id) {
			win.TargetHosts = append(win.TargetHosts, id)
		}
	}
	writeWindow(w, action, "instanceEventWindow", win)
}

func (s *EC2EventWindows) delete(w http.ResponseWriter, f url.Values) {
	id := f.Get("InstanceEventWindowId")
	win := s.windows[id]
	switch {
	case dryRun(w, f):
	case win == nil:
		ec2Error(w, http.StatusBadRequest, "InvalidInstanceEventWindowId.NotFound", fmt.Sprintf("The event window ID '%s' does not exist", id))
	case len(win.TargetTags)+len(win.TargetInstances)+len(win.TargetHosts) > 0 && f.Get("ForceDelete") != "true":
		ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("The event window %s has associated targets: disassociate them, or use ForceDelete", id))
	default:
		delete(s.windows, id)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><DeleteInstanceEventWindowResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId><instanceEventWindowState><instanceEventWindowId>%s</instanceEventWindowId><state>deleting</state></instanceEventWindowState></DeleteInstanceEventWindowResponse>`, id)
	}
}

// describe answers DescribeInstanceEventWindows: InstanceEventWindowId.N, Filter.N.Name
// (tag:<key>, tag-key) with Filter.N.Value.M, MaxResults and NextToken.
func (s *EC2EventWindows) describe(w http.ResponseWriter, f url.Values) {
	if dryRun(w, f) {
		return
	}
	ids := list(f, "InstanceEventWindowId")
	type filter struct {
		name   string
		values []string
	}
	var filters []filter
	for i := 1; f.Has(fmt.Sprintf("Filter.%d.Name", i)); i++ {
		filters = append(filters, filter{f.Get(fmt.Sprintf("Filter.%d.Name", i)), list(f, fmt.Sprintf("Filter.%d.Value", i))})
	}
	var match []*EventWindow
	for _, id := range slices.Sorted(maps.Keys(s.windows)) {
		win := s.windows[id]
		ok := len(ids) == 0 || slices.Contains(ids, id)
		for _, flt := range filters {
			switch {
			case strings.HasPrefix(flt.name, "tag:"):
				v, has := win.Tags[strings.TrimPrefix(flt.name, "tag:")]
				ok = ok && has && slices.Contains(flt.values, v)
			case flt.name == "tag-key":
				ok = ok && slices.ContainsFunc(flt.values, func(k string) bool { _, has := win.Tags[k]; return has })
			default:
				ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", fmt.Sprintf("The filter '%s' is invalid", flt.name))
				return
			}
		}
		if ok {
			match = append(match, win)
		}
	}
	for _, id := range ids {
		if s.windows[id] == nil {
			ec2Error(w, http.StatusBadRequest, "InvalidInstanceEventWindowId.NotFound", fmt.Sprintf("The event window ID '%s' does not exist", id))
			return
		}
	}
	start := 0
	if tok := f.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil || n > len(match) {
			ec2Error(w, http.StatusBadRequest, "InvalidParameterValue", "Invalid NextToken")
			return
		}
		start = n
	}
	size := s.PageSize
	if n, err := strconv.Atoi(f.Get("MaxResults")); err == nil && n > 0 && n < size {
		size = n
	}
	end := min(len(match), start+size)
	var b strings.Builder
	b.WriteString(`<instanceEventWindowSet>`)
	for _, win := range match[start:end] {
		b.WriteString(windowXML("item", win))
	}
	b.WriteString(`</instanceEventWindowSet>`)
	if end < len(match) {
		fmt.Fprintf(&b, `<nextToken>page-%d</nextToken>`, end)
	}
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><DescribeInstanceEventWindowsResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId>%s</DescribeInstanceEventWindowsResponse>`, b.String())
}

// writeWindow answers action with win as its element tag.
func writeWindow(w http.ResponseWriter, action, tag string, win *EventWindow) {
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><%sResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>7a62c49f-347e-4fc4-9331-6e8eEXAMPLE</requestId>%s</%sResponse>`, action, windowXML(tag, win), action)
}

// windowXML writes an InstanceEventWindow element.
func windowXML(tag string, win *EventWindow) string {
	type kv struct {
		Key   string `xml:"key"`
		Value string `xml:"value"`
	}
	type timeRange struct {
		StartWeekDay string `xml:"startWeekDay"`
		StartHour    int    `xml:"startHour"`
		EndWeekDay   string `xml:"endWeekDay"`
		EndHour      int    `xml:"endHour"`
	}
	type target struct {
		InstanceIDs []string `xml:"instanceIdSet>item"`
		Tags        []kv     `xml:"tagSet>item"`
		HostIDs     []string `xml:"dedicatedHostIdSet>item"`
	}
	type window struct {
		XMLName xml.Name
		ID      string      `xml:"instanceEventWindowId"`
		Ranges  []timeRange `xml:"timeRangeSet>item"`
		Name    string      `xml:"name,omitempty"`
		Cron    string      `xml:"cronExpression,omitempty"`
		Target  target      `xml:"associationTarget"`
		State   string      `xml:"state"`
		Tags    []kv        `xml:"tagSet>item"`
	}
	out := window{XMLName: xml.Name{Local: tag}, ID: win.ID, Name: win.Name, Cron: win.Cron, State: "active",
		Target: target{InstanceIDs: win.TargetInstances, HostIDs: win.TargetHosts}}
	for _, r := range win.Ranges {
		out.Ranges = append(out.Ranges, timeRange(r))
	}
	for _, t := range win.TargetTags {
		k, v, _ := strings.Cut(t, "=")
		out.Target.Tags = append(out.Target.Tags, kv{k, v})
	}
	for _, k := range slices.Sorted(maps.Keys(win.Tags)) {
		out.Tags = append(out.Tags, kv{k, win.Tags[k]})
	}
	b, err := xml.Marshal(out)
	if err != nil {
		panic(err) // strings and ints always marshal
	}
	return string(b)
}
