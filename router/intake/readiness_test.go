package intake

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/health-router/health-router/router/metrics"
	"github.com/health-router/health-router/test/harness"
)

// sqsAnswers serves SQS's JSON protocol (awsJson1_0) as SQS answers ReceiveMessage: an empty
// receive, or the error set, with its status, x-amzn-query-error code and JSON __type, for
// the errors moto does not produce (AccessDenied, an invalid token, throttling, a 500).
type sqsAnswers struct {
	mu       sync.Mutex
	status   int
	query    string // x-amzn-query-error's code
	jsonType string
	receives atomic.Int64
}

func (s *sqsAnswers) set(status int, query, jsonType string) {
	s.mu.Lock()
	s.status, s.query, s.jsonType = status, query, jsonType
	s.mu.Unlock()
}

func (s *sqsAnswers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Amz-Target") != "AmazonSQS.ReceiveMessage" {
		http.Error(w, "not served", http.StatusBadRequest)
		return
	}
	s.receives.Add(1)
	s.mu.Lock()
	status, query, jsonType := s.status, s.query, s.jsonType
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-Requestid", "req-1")
	if status == 0 {
		w.Write([]byte(`{"Messages":[]}`))
		return
	}
	if query != "" {
		w.Header().Set("X-Amzn-Query-Error", query+";Sender")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"__type": jsonType, "message": "answered by the test"})
}

// The intake's receives make the readiness probe: a permanent error (the queue gone, access
// denied, the token refused) fails it with the queue and the error named; a receive that
// succeeds again mends it; throttling and 5xx leave it ready.
func TestReadinessFollowsReceives(t *testing.T) {
	answers := &sqsAnswers{}
	srv := httptest.NewServer(answers)
	t.Cleanup(srv.Close)
	client := sqs.New(sqs.Options{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""), RetryMaxAttempts: 1})
	const queueURL = "https://sqs.eu-west-1.amazonaws.com/123456789012/hr-intake"
	fc := clocktesting.NewFakeClock(time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC))
	ready := NewReadiness(fc)
	var turns []string
	var turnsMu sync.Mutex
	ready.OnChange(func(ok bool, reason string) {
		turnsMu.Lock()
		defer turnsMu.Unlock()
		if ok {
			turns = append(turns, "ready")
		} else {
			turns = append(turns, "not ready: "+reason)
		}
	})
	in := New(Config{QueueURL: queueURL, Workers: 1, WaitTime: 0}, client, nil, metrics.NewRouter(prometheus.NewRegistry(), nil), nil, fc,
		slog.New(slog.NewTextHandler(io.Discard, nil))).WithReadiness(ready)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); in.Start(ctx) }()
	t.Cleanup(func() { cancel(); fc.Step(time.Minute); <-done })

	// after waits for two more receives (so that one began after the answer changed), stepping
	// the fake clock past the loop's wait after a failed receive.
	after := func() {
		t.Helper()
		n := answers.receives.Load() + 2
		for deadline := time.Now().Add(10 * time.Second); answers.receives.Load() < n; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the intake stopped receiving")
			}
			fc.Step(5 * time.Second)
		}
	}
	after()
	if err := ready.Check(nil); err != nil {
		t.Fatalf("ready with receives that succeed: %v", err)
	}
	for _, tc := range []struct {
		name            string
		status          int
		query, jsonType string
		notReady        bool
	}{
		{"throttled", 400, "AWS.SimpleQueueService.RequestThrottled", "com.amazonaws.sqs#RequestThrottled", false},
		{"5xx", 500, "", "com.amazonaws.sqs#InternalError", false},
		{"access denied", 400, "AccessDenied", "com.amazon.coral.service#AccessDeniedException", true},
		{"recovered", 0, "", "", false},
		{"queue deleted", 400, "AWS.SimpleQueueService.NonExistentQueue", "com.amazonaws.sqs#QueueDoesNotExist", true},
		{"a throttle meanwhile keeps it failing", 400, "", "ThrottlingException", true},
		{"recovered again", 0, "", "", false},
		{"invalid security token", 403, "InvalidClientTokenId", "com.amazon.coral.service#UnrecognizedClientException", true},
	} {
		answers.set(tc.status, tc.query, tc.jsonType)
		after()
		err := ready.Check(nil)
		if !tc.notReady {
			if err != nil {
				t.Errorf("%s: not ready: %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: still ready", tc.name)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "intake queue "+queueURL) || (tc.query != "" && !strings.Contains(msg, tc.query)) {
			t.Errorf("%s: the reason does not name the queue and the error: %s", tc.name, msg)
		}
	}
	turnsMu.Lock()
	defer turnsMu.Unlock()
	if len(turns) != 5 || !strings.Contains(turns[0], "access denied") || turns[1] != "ready" || !strings.Contains(turns[2], "does not exist") ||
		turns[3] != "ready" || !strings.Contains(turns[4], "credentials refused") {
		t.Errorf("readiness turned:\n%s", strings.Join(turns, "\n"))
	}
}

// At start, each queue is checked on moto: readiness is false while the intake queue does not
// exist, with the queue and the error named, and turns true once the queue is created,
// without a restart.
func TestQueueCheckWaitsForAMissingQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("moto")
	}
	moto := harness.Moto(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := sqs.NewFromConfig(harness.AWSConfig(nil), func(o *sqs.Options) { o.BaseEndpoint = aws.String(moto) })
	dlq, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("hr-dlq")})
	if err != nil {
		t.Fatal(err)
	}
	intakeURL := strings.Replace(aws.ToString(dlq.QueueUrl), "hr-dlq", "hr-intake", 1)
	ready := NewReadiness(clock.RealClock{})
	turns := make(chan string, 10)
	ready.OnChange(func(ok bool, reason string) {
		if ok {
			turns <- "ready"
		} else {
			turns <- reason
		}
	})
	check := NewQueueCheck(client, []Queue{{RoleIntake, intakeURL}, {RoleDeadLetter, aws.ToString(dlq.QueueUrl)}, {RoleKarpenter, ""}}, ready, clock.RealClock{},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if ready.Check(nil) == nil {
		t.Fatal("ready before the queues were checked")
	}
	done := make(chan struct{})
	go func() { defer close(done); check.Start(ctx) }()
	var reason string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := ready.Check(nil)
		// Each queue is checked on its own: the reason is settled once none is "not checked yet".
		if err != nil && strings.Contains(err.Error(), "NonExistentQueue") && !strings.Contains(err.Error(), "not checked yet") {
			reason = err.Error()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reason naming the missing queue: %v", err)
		}
	}
	if !strings.Contains(reason, "intake queue "+intakeURL) || strings.Contains(reason, "hr-dlq") {
		t.Fatalf("reason: %s", reason)
	}
	if _, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("hr-intake")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the queue check did not see the queue created")
	}
	if err := ready.Check(nil); err != nil {
		t.Fatalf("not ready once the queue exists: %v", err)
	}
	// OnChange (the pod's Event) is told of the missing queue once, however many checks
	// met it, and of its repair; not of "not checked yet".
	close(turns)
	var got []string
	for turn := range turns {
		got = append(got, turn)
	}
	if len(got) != 2 || !strings.Contains(got[0], "intake queue "+intakeURL+": does not exist") || got[1] != "ready" {
		t.Errorf("OnChange told:\n%s", strings.Join(got, "\n"))
	}
}
