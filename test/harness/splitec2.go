package harness

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// standIn are the EC2 actions moto does not serve as EC2 does (scheduled events) or at all
// (ModifyInstanceEventStartTime), which EC2InstanceStatus answers instead.
var standIn = map[string]bool{"DescribeInstanceStatus": true, "ModifyInstanceEventStartTime": true}

// SplitEC2 returns the endpoint of a proxy in front of moto (its URL) that sends the EC2 Query
// calls moto does not serve as EC2 does (DescribeInstanceStatus, ModifyInstanceEventStartTime)
// to ec2s and every other call (SQS, EventBridge, the rest of EC2) to moto: the router sends
// all of its AWS calls to one endpoint (options.Run.AWSEndpointURL).
func SplitEC2(t testing.TB, moto string, ec2s *EC2InstanceStatus) string {
	t.Helper()
	target, err := url.Parse(moto)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// moto out of reach is a fault the test made (test/box/soak cuts it for a minute): answered
	// 502, as the default handler does, without its log line per call.
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if form, err := url.ParseQuery(string(body)); err == nil && standIn[form.Get("Action")] {
				ec2s.ServeHTTP(w, r)
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
