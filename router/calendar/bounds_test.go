package calendar

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/health-router/health-router/router/status"
)

// TestDefaultBoundsAgree: DefaultMaxEvents drains, with reasons of 1 KiB (the router's are a
// line), fit in DefaultMaxBytes: the event bound is the one a real cluster meets, and the byte
// bound only catches what no cluster writes.
func TestDefaultBoundsAgree(t *testing.T) {
	var ds []status.Deferred
	for i := range DefaultMaxEvents + 500 {
		ds = append(ds, deferred(fmt.Sprintf("general-%05d", i), fmt.Sprintf("ip-10-0-%d-%d.eu-west-1.compute.internal", i/250, i%250),
			fmt.Sprintf("8a2d1f63-4c8b-4e9f-8d32-%012d", i), now.Add(time.Duration(i)*time.Minute), status.HoldPDB, strings.Repeat("r", 1024)))
	}
	var buf bytes.Buffer
	start := time.Now()
	omitted, err := New(DefaultHorizon).WriteLimited(&buf, report(now, status.NodePool{Name: "general", Deferred: ds}), DefaultMaxEvents)
	if err != nil {
		t.Fatal(err)
	}
	if omitted != 500 {
		t.Errorf("omitted %d, want 500", omitted)
	}
	if buf.Len() > DefaultMaxBytes {
		t.Errorf("%d events of 1 KiB reasons: %d bytes, over DefaultMaxBytes %d", DefaultMaxEvents, buf.Len(), DefaultMaxBytes)
	}
	t.Logf("%d events, 1 KiB reasons: %d bytes (%.0f per event), written in %s", DefaultMaxEvents, buf.Len(), float64(buf.Len())/DefaultMaxEvents, time.Since(start))
}
