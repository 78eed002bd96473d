package harness

import (
	"container/heap"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// SQS serves Amazon SQS's JSON protocol (awsJson1_0, what aws-sdk-go-v2 speaks) for standard
// queues, for the benches that need an SQS whose own cost does not grow with the queue:
// moto_server's scans every message of the queue on each receive, delete and visibility
// change, so a backlog of a few thousand messages makes each call cost milliseconds of its
// one Python core (the burst bench measured 151 s of moto's CPU for 2,000 messages). Each
// operation here is O(log n) in the queue's messages.
//
// Served: CreateQueue, GetQueueUrl, SendMessage, SendMessageBatch, ReceiveMessage (long
// polling, VisibilityTimeout, MaxNumberOfMessages, the system attributes
// ApproximateReceiveCount, SentTimestamp, ApproximateFirstReceiveTimestamp and SenderId, and
// message attributes as sent), DeleteMessage, DeleteMessageBatch, ChangeMessageVisibility and
// GetQueueAttributes (ApproximateNumberOfMessages, ...NotVisible, ...Delayed). Refused as SQS
// refuses, with its error codes: QueueDoesNotExist, ReceiptHandleIsInvalid,
// InvalidParameterValue (a receipt handle of an earlier receive, a timeout out of range),
// MessageNotInflight, and InvalidAction for what is not served. Not modelled: FIFO queues,
// redrive policies, retention, and at-least-once duplicates.
type SQS struct {
	// URL is the server's endpoint (the SDK's BaseEndpoint).
	URL    string
	srv    *httptest.Server
	mu     sync.Mutex
	queues map[string]*sqsQueue
	seq    atomic.Uint64
	calls  sync.Map // operation -> *atomic.Int64
	onSend func(queue, body string, at time.Time)
}

// AWSSplit serves one AWS endpoint for two servers, as AWS_ENDPOINT_URL names one: SQS's
// JSON protocol (X-Amz-Target: AmazonSQS.*) goes to sqsURL, everything else to otherURL.
func AWSSplit(otherURL, sqsURL string) *httptest.Server {
	return httptest.NewServer(SplitHandler(otherURL, sqsURL))
}

// SplitHandler is AWSSplit's handler, for a server of the caller's.
func SplitHandler(otherURL, sqsURL string) http.Handler {
	other, _ := url.Parse(otherURL)
	q, _ := url.Parse(sqsURL)
	toOther, toSQS := httputil.NewSingleHostReverseProxy(other), httputil.NewSingleHostReverseProxy(q)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.") {
			toSQS.ServeHTTP(w, r)
			return
		}
		toOther.ServeHTTP(w, r)
	})
}

// NewSQS starts the server on a loopback port; Close stops it.
func NewSQS() *SQS {
	s := &SQS{queues: map[string]*sqsQueue{}}
	s.srv = httptest.NewServer(s)
	s.URL = s.srv.URL
	return s
}

// OnSend has f called with every message accepted (the queue's name, the body, when it was
// accepted), as a bench measures when a message reached a queue whose consumer it does not
// control. f is called with the server's lock held: it must not block.
func (s *SQS) OnSend(f func(queue, body string, at time.Time)) {
	s.mu.Lock()
	s.onSend = f
	s.mu.Unlock()
}

// Close stops the server.
func (s *SQS) Close() { s.srv.Close() }

// Calls is how many calls of each operation the server answered.
func (s *SQS) Calls() map[string]int64 {
	out := map[string]int64{}
	s.calls.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

type sqsQueue struct {
	name       string
	visibility time.Duration
	delay      time.Duration
	byID       map[string]*sqsMessage
	byHandle   map[string]*sqsMessage
	deleted    map[string]bool // receipt handles of deleted messages: deleting again succeeds
	ready      sqsHeap         // every message, by when it is visible next
	changed    chan struct{}   // closed and replaced when a message may have become receivable
}

type sqsMessage struct {
	id, body     string
	attributes   json.RawMessage // message attributes, as sent
	sent         time.Time
	firstReceive time.Time
	receives     int
	visibleAt    time.Time
	delayed      bool // not yet received and not yet visible: DelaySeconds
	handle       string
	earlier      []string // receipt handles of earlier receives
	seq          uint64
	index        int // in the heap
}

// sqsHeap orders messages by when they are visible, then by when they were sent.
type sqsHeap []*sqsMessage

func (h sqsHeap) Len() int { return len(h) }
func (h sqsHeap) Less(i, j int) bool {
	if !h[i].visibleAt.Equal(h[j].visibleAt) {
		return h[i].visibleAt.Before(h[j].visibleAt)
	}
	return h[i].seq < h[j].seq
}
func (h sqsHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *sqsHeap) Push(x any)   { m := x.(*sqsMessage); m.index = len(*h); *h = append(*h, m) }
func (h *sqsHeap) Pop() any {
	old := *h
	m := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	m.index = -1
	return m
}

// sqsError is an error answer of the JSON protocol.
type sqsError struct {
	status      int
	code, query string // __type's shape name; the x-amzn-query-error code of the awsQueryCompatible trait
	msg         string
}

func (e *sqsError) Error() string { return e.code + ": " + e.msg }

func errNoQueue() *sqsError {
	return &sqsError{400, "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", "The specified queue does not exist."}
}

func errInvalidHandle(h string) *sqsError {
	return &sqsError{400, "ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", fmt.Sprintf("The input receipt handle %q is not a valid receipt handle.", h)}
}

func errInvalid(format string, args ...any) *sqsError {
	return &sqsError{400, "InvalidParameterValue", "InvalidParameterValue", fmt.Sprintf(format, args...)}
}

func (s *SQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	if r.Method != http.MethodPost || !ok {
		writeSQS(w, nil, &sqsError{400, "InvalidAction", "InvalidAction", "only SQS's JSON protocol is served (POST with X-Amz-Target: AmazonSQS.<operation>)"})
		return
	}
	c, _ := s.calls.LoadOrStore(op, new(atomic.Int64))
	c.(*atomic.Int64).Add(1)
	var in sqsInput
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeSQS(w, nil, &sqsError{400, "MalformedInput", "MalformedInput", err.Error()})
		return
	}
	var out any
	var err *sqsError
	switch op {
	case "CreateQueue":
		out, err = s.createQueue(r, in)
	case "GetQueueUrl":
		out, err = s.getQueueURL(r, in)
	case "ReceiveMessage":
		out, err = s.receive(r, in)
	default:
		s.mu.Lock()
		q := s.queues[queueName(in.QueueURL)]
		if q == nil {
			err = errNoQueue()
		} else {
			out, err = s.operate(q, op, in)
		}
		s.mu.Unlock()
	}
	writeSQS(w, out, err)
}

func writeSQS(w http.ResponseWriter, out any, err *sqsError) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	if err != nil {
		w.Header().Set("X-Amzn-Query-Error", err.query+";Sender")
		w.WriteHeader(err.status)
		_ = json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#" + err.code, "message": err.msg})
		return
	}
	if out == nil {
		out = struct{}{}
	}
	_ = json.NewEncoder(w).Encode(out)
}

// sqsInput is the union of the operations' inputs this server reads.
type sqsInput struct {
	QueueName             string
	QueueURL              string `json:"QueueUrl"`
	Attributes            map[string]string
	AttributeNames        []string
	MessageBody           string
	DelaySeconds          *int
	MessageAttributes     json.RawMessage
	MaxNumberOfMessages   int
	WaitTimeSeconds       int
	VisibilityTimeout     *int
	MessageAttributeNames []string
	// MessageSystemAttributeNames replaced AttributeNames in ReceiveMessage.
	MessageSystemAttributeNames []string
	ReceiptHandle               string
	Entries                     []sqsEntry
}

type sqsEntry struct {
	ID                string `json:"Id"`
	MessageBody       string
	DelaySeconds      *int
	MessageAttributes json.RawMessage
	ReceiptHandle     string
}

func queueName(url string) string { return url[strings.LastIndex(url, "/")+1:] }

func (s *SQS) queueURL(r *http.Request, name string) string {
	return fmt.Sprintf("http://%s/000000000000/%s", r.Host, name)
}

func seconds(attrs map[string]string, key string, def time.Duration) (time.Duration, *sqsError) {
	v, ok := attrs[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errInvalid("invalid value for the parameter %s", key)
	}
	return time.Duration(n) * time.Second, nil
}

func (s *SQS) createQueue(r *http.Request, in sqsInput) (any, *sqsError) {
	if in.QueueName == "" || strings.HasSuffix(in.QueueName, ".fifo") {
		return nil, errInvalid("a standard queue's name is required (FIFO queues are not served)")
	}
	vis, err := seconds(in.Attributes, "VisibilityTimeout", 30*time.Second)
	if err != nil {
		return nil, err
	}
	delay, err := seconds(in.Attributes, "DelaySeconds", 0)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queues[in.QueueName] == nil {
		s.queues[in.QueueName] = &sqsQueue{name: in.QueueName, visibility: vis, delay: delay, byID: map[string]*sqsMessage{},
			byHandle: map[string]*sqsMessage{}, deleted: map[string]bool{}, changed: make(chan struct{})}
	}
	return map[string]string{"QueueUrl": s.queueURL(r, in.QueueName)}, nil
}

func (s *SQS) getQueueURL(r *http.Request, in sqsInput) (any, *sqsError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queues[in.QueueName] == nil {
		return nil, errNoQueue()
	}
	return map[string]string{"QueueUrl": s.queueURL(r, in.QueueName)}, nil
}

// operate serves the operations on one queue other than ReceiveMessage; s.mu is held.
func (s *SQS) operate(q *sqsQueue, op string, in sqsInput) (any, *sqsError) {
	now := time.Now()
	switch op {
	case "SendMessage":
		id, sum, err := s.send(q, now, in.MessageBody, in.DelaySeconds, in.MessageAttributes)
		if err != nil {
			return nil, err
		}
		return map[string]string{"MessageId": id, "MD5OfMessageBody": sum}, nil
	case "SendMessageBatch":
		if len(in.Entries) == 0 || len(in.Entries) > 10 {
			return nil, &sqsError{400, "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "1 to 10 entries"}
		}
		ok, failed := []map[string]string{}, []map[string]any{}
		for _, e := range in.Entries {
			id, sum, err := s.send(q, now, e.MessageBody, e.DelaySeconds, e.MessageAttributes)
			if err != nil {
				failed = append(failed, map[string]any{"Id": e.ID, "SenderFault": true, "Code": err.code, "Message": err.msg})
				continue
			}
			ok = append(ok, map[string]string{"Id": e.ID, "MessageId": id, "MD5OfMessageBody": sum})
		}
		return map[string]any{"Successful": ok, "Failed": failed}, nil
	case "DeleteMessage":
		return nil, q.remove(in.ReceiptHandle)
	case "DeleteMessageBatch":
		if len(in.Entries) == 0 || len(in.Entries) > 10 {
			return nil, &sqsError{400, "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "1 to 10 entries"}
		}
		ok, failed := []map[string]string{}, []map[string]any{}
		for _, e := range in.Entries {
			if err := q.remove(e.ReceiptHandle); err != nil {
				failed = append(failed, map[string]any{"Id": e.ID, "SenderFault": true, "Code": err.code, "Message": err.msg})
				continue
			}
			ok = append(ok, map[string]string{"Id": e.ID})
		}
		return map[string]any{"Successful": ok, "Failed": failed}, nil
	case "ChangeMessageVisibility":
		if in.VisibilityTimeout == nil || *in.VisibilityTimeout < 0 || *in.VisibilityTimeout > 43200 {
			return nil, errInvalid("VisibilityTimeout must be 0 to 43200 seconds")
		}
		m := q.byHandle[in.ReceiptHandle]
		switch {
		case m == nil || q.deleted[in.ReceiptHandle]:
			return nil, errInvalidHandle(in.ReceiptHandle)
		case m.handle != in.ReceiptHandle:
			return nil, errInvalid("Value %s for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired.", in.ReceiptHandle)
		case !m.visibleAt.After(now):
			return nil, &sqsError{400, "MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", "The message is not in flight."}
		}
		m.visibleAt = now.Add(time.Duration(*in.VisibilityTimeout) * time.Second)
		heap.Fix(&q.ready, m.index)
		if *in.VisibilityTimeout == 0 {
			q.wake()
		}
		return nil, nil
	case "GetQueueAttributes":
		visible, inFlight, delayed := 0, 0, 0
		for _, m := range q.ready {
			switch {
			case !m.visibleAt.After(now):
				visible++
			case m.delayed:
				delayed++
			default:
				inFlight++
			}
		}
		attrs := map[string]string{
			"ApproximateNumberOfMessages":           strconv.Itoa(visible),
			"ApproximateNumberOfMessagesNotVisible": strconv.Itoa(inFlight),
			"ApproximateNumberOfMessagesDelayed":    strconv.Itoa(delayed),
			"VisibilityTimeout":                     strconv.Itoa(int(q.visibility / time.Second)),
			"DelaySeconds":                          strconv.Itoa(int(q.delay / time.Second)),
			"QueueArn":                              "arn:aws:sqs:" + Region + ":000000000000:" + q.name,
		}
		out := map[string]string{}
		for _, name := range in.AttributeNames {
			if name == "All" {
				out = attrs
				break
			}
			if v, ok := attrs[name]; ok {
				out[name] = v
			}
		}
		return map[string]any{"Attributes": out}, nil
	}
	return nil, &sqsError{400, "InvalidAction", "InvalidAction", "the operation " + op + " is not served by this SQS"}
}

func (s *SQS) send(q *sqsQueue, now time.Time, body string, delaySeconds *int, attrs json.RawMessage) (id, sum string, err *sqsError) {
	if body == "" {
		return "", "", errInvalid("the message body must not be empty")
	}
	// SQS counts the attributes in the limit: each one's name, data type and value.
	if size := len(body) + attributesSize(attrs); size > MaxMessageSize {
		return "", "", errInvalid("One or more parameters are invalid. Reason: Message must be shorter than %d bytes (body and attributes: %d).", MaxMessageSize, size)
	}
	delay := q.delay
	if delaySeconds != nil {
		if *delaySeconds < 0 || *delaySeconds > 900 {
			return "", "", errInvalid("DelaySeconds must be 0 to 900")
		}
		delay = time.Duration(*delaySeconds) * time.Second
	}
	seq := s.seq.Add(1)
	m := &sqsMessage{id: fmt.Sprintf("00000000-0000-4000-8000-%012d", seq), body: body, attributes: attrs, sent: now,
		visibleAt: now.Add(delay), delayed: delay > 0, seq: seq}
	q.byID[m.id] = m
	heap.Push(&q.ready, m)
	if s.onSend != nil {
		s.onSend(q.name, body, now)
	}
	if delay == 0 {
		q.wake()
	}
	h := md5.Sum([]byte(body))
	return m.id, hex.EncodeToString(h[:]), nil
}

// MaxMessageSize is the limit of a message, body and attributes, as the Terraform module's
// queues have it (262,144 bytes, the AWS provider's default).
const MaxMessageSize = 256 * 1024

// attributesSize is what message attributes count towards MaxMessageSize.
func attributesSize(raw json.RawMessage) int {
	var attrs map[string]struct {
		DataType    string
		StringValue string
		BinaryValue []byte
	}
	if len(raw) == 0 || json.Unmarshal(raw, &attrs) != nil {
		return 0
	}
	n := 0
	for name, a := range attrs {
		n += len(name) + len(a.DataType) + len(a.StringValue) + len(a.BinaryValue)
	}
	return n
}

// remove deletes the message a receipt handle (of any of its receives) names.
func (q *sqsQueue) remove(handle string) *sqsError {
	if q.deleted[handle] {
		return nil
	}
	m := q.byHandle[handle]
	if m == nil {
		return errInvalidHandle(handle)
	}
	heap.Remove(&q.ready, m.index)
	delete(q.byID, m.id)
	for _, h := range append(m.earlier, m.handle) {
		delete(q.byHandle, h)
		q.deleted[h] = true
	}
	return nil
}

func (q *sqsQueue) wake() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// receive takes up to max visible messages, waiting up to wait for the first.
func (s *SQS) receive(r *http.Request, in sqsInput) (any, *sqsError) {
	max := in.MaxNumberOfMessages
	if max == 0 {
		max = 1
	}
	if max < 1 || max > 10 {
		return nil, errInvalid("MaxNumberOfMessages must be 1 to 10")
	}
	if in.WaitTimeSeconds < 0 || in.WaitTimeSeconds > 20 {
		return nil, errInvalid("WaitTimeSeconds must be 0 to 20")
	}
	deadline := time.Now().Add(time.Duration(in.WaitTimeSeconds) * time.Second)
	for {
		s.mu.Lock()
		q := s.queues[queueName(in.QueueURL)]
		if q == nil {
			s.mu.Unlock()
			return nil, errNoQueue()
		}
		vis := q.visibility
		if in.VisibilityTimeout != nil {
			if *in.VisibilityTimeout < 0 || *in.VisibilityTimeout > 43200 {
				s.mu.Unlock()
				return nil, errInvalid("VisibilityTimeout must be 0 to 43200 seconds")
			}
			vis = time.Duration(*in.VisibilityTimeout) * time.Second
		}
		now := time.Now()
		var out []map[string]any
		for len(out) < max && len(q.ready) > 0 && !q.ready[0].visibleAt.After(now) {
			m := q.ready[0]
			if m.handle != "" {
				m.earlier = append(m.earlier, m.handle)
			}
			m.receives++
			if m.receives == 1 {
				m.firstReceive = now
			}
			m.delayed = false
			m.handle = fmt.Sprintf("%s#%d", m.id, m.receives)
			q.byHandle[m.handle] = m
			m.visibleAt = now.Add(vis)
			heap.Fix(&q.ready, 0)
			out = append(out, m.wire(in))
		}
		// What wakes a waiting receive: a send, a message made visible, or the next message's
		// invisibility ending.
		changed := q.changed
		next := time.Duration(-1)
		if len(q.ready) > 0 {
			next = q.ready[0].visibleAt.Sub(now)
		}
		s.mu.Unlock()
		left := time.Until(deadline)
		if len(out) > 0 || left <= 0 {
			if out == nil {
				out = []map[string]any{}
			}
			return map[string]any{"Messages": out}, nil
		}
		if next >= 0 && next < left {
			left = next + time.Millisecond
		}
		t := time.NewTimer(left)
		select {
		case <-changed:
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return map[string]any{"Messages": []map[string]any{}}, nil
		}
		t.Stop()
	}
}

// wire is a received message as ReceiveMessage answers it.
func (m *sqsMessage) wire(in sqsInput) map[string]any {
	sum := md5.Sum([]byte(m.body))
	out := map[string]any{"MessageId": m.id, "ReceiptHandle": m.handle, "Body": m.body, "MD5OfBody": hex.EncodeToString(sum[:])}
	system := map[string]string{
		"ApproximateReceiveCount":          strconv.Itoa(m.receives),
		"SentTimestamp":                    strconv.FormatInt(m.sent.UnixMilli(), 10),
		"ApproximateFirstReceiveTimestamp": strconv.FormatInt(m.firstReceive.UnixMilli(), 10),
		"SenderId":                         "AIDAHEALTHROUTERTEST",
	}
	attrs := map[string]string{}
	for _, name := range append(in.MessageSystemAttributeNames, in.AttributeNames...) {
		if name == "All" {
			attrs = system
			break
		}
		if v, ok := system[name]; ok {
			attrs[name] = v
		}
	}
	if len(attrs) > 0 {
		out["Attributes"] = attrs
	}
	if len(m.attributes) > 0 && len(in.MessageAttributeNames) > 0 {
		var all map[string]json.RawMessage
		if json.Unmarshal(m.attributes, &all) == nil {
			picked := map[string]json.RawMessage{}
			for name, v := range all {
				for _, want := range in.MessageAttributeNames {
					if want == "All" || want == ".*" || want == name || (strings.HasSuffix(want, ".*") && strings.HasPrefix(name, strings.TrimSuffix(want, "*"))) {
						picked[name] = v
						break
					}
				}
			}
			if len(picked) > 0 {
				out["MessageAttributes"] = picked
			}
		}
	}
	return out
}
