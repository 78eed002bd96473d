package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/health-router/health-router/lambda/dispatch"
)

// A dispatcher without its cluster => queue map must fail at start, naming the variable,
// rather than drop every event.
func TestRunFailsFastWithoutQueues(t *testing.T) {
	for _, value := range []string{"", "{}", `{"prod-eu":`} {
		t.Setenv(dispatch.QueuesEnv, value)
		err := run(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), dispatch.QueuesEnv) {
			t.Errorf("%s=%q: run = %v, want an error naming %s", dispatch.QueuesEnv, value, err, dispatch.QueuesEnv)
		}
	}
}
