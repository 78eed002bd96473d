package watchdog_test

import (
	"context"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/health-router/health-router/router/checks"
	"github.com/health-router/health-router/router/watchdog"
)

// The watchdog as the router wires it: a leader-only runnable of the manager, reading the
// manager's cache, with the router's EC2 client, Event recorder, gates and registry.
// (Compiled, not run: it needs a cluster.)
func Example() {
	ctx := context.Background()
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{})
	if err != nil {
		panic(err)
	}
	ec2Client := ec2.NewFromConfig(aws.Config{})
	wd := watchdog.New(mgr.GetCache(), ec2Client, mgr.GetEventRecorder("health-router"), checks.NewFeatureGates(),
		clock.RealClock{}, crmetrics.Registry, watchdog.Options{Log: slog.Default()})
	if err := mgr.Add(wd); err != nil {
		panic(err)
	}
	// The CloudWatch publisher reads the latest counts at each flush:
	// stuck-empty, unavailable-image, reservation-drift.
	_ = wd.Findings().Counts()
	_ = mgr.Start(ctx)
}
