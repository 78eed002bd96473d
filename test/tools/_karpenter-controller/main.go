// Command karpenter-controller is Karpenter's AWS controller wired as the provider's own
// cmd/controller wires it, with one difference for the suites: the cloud provider's repair
// policies wait HEALTH_ROUTER_REPAIR_TOLERATION (a Go duration) instead of their own
// toleration (30 minutes for a NotReady Node), so that a test sees node repair act within
// its time. Karpenter measures the toleration from the condition's last transition, but never
// from before the Node's creation (the API server's timestamp, which no client can backdate):
// nothing but a shorter toleration lets a suite's new node become repairable in seconds.
// Unset, the policies are the provider's, unchanged.
//
// test/tools/karpenter-bin.sh builds it with the argument "repair", as it builds the
// controller (a copy of go.mod, -mod=mod). The directory's name starts with "_" so that the
// module's ./... leaves it out: it imports provider packages whose dependencies go.mod does
// not list.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/samber/lo"

	v1 "github.com/aws/karpenter-provider-aws/pkg/apis/v1"
	"github.com/aws/karpenter-provider-aws/pkg/cloudprovider"
	"github.com/aws/karpenter-provider-aws/pkg/cloudprovider/registrationhooks"
	"github.com/aws/karpenter-provider-aws/pkg/controllers"
	"github.com/aws/karpenter-provider-aws/pkg/operator"
	"github.com/aws/karpenter-provider-aws/pkg/operator/options"

	corecloudprovider "sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/metrics"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	corecontrollers "sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"
	karpoptions "sigs.k8s.io/karpenter/pkg/operator/options"
)

// tolerationEnv names the repair policies' toleration for the suites.
const tolerationEnv = "HEALTH_ROUTER_REPAIR_TOLERATION"

// tolerations is the cloud provider with every repair policy's toleration set to d.
type tolerations struct {
	corecloudprovider.CloudProvider
	d time.Duration
}

func (t tolerations) RepairPolicies() []corecloudprovider.RepairPolicy {
	ps := t.CloudProvider.RepairPolicies()
	out := make([]corecloudprovider.RepairPolicy, len(ps))
	for i, p := range ps {
		p.TolerationDuration = t.d
		out[i] = p
	}
	return out
}

func main() {
	var toleration time.Duration
	if v := os.Getenv(tolerationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a duration of 0 or more\n", tolerationEnv, v)
			os.Exit(2)
		}
		toleration = d
	}
	ctx, op := operator.NewOperator(coreoperator.NewOperator())

	awsCloudProvider := cloudprovider.New(
		op.InstanceTypesProvider,
		op.InstanceProvider,
		op.EventRecorder,
		op.GetClient(),
		op.AMIProvider,
		op.SecurityGroupProvider,
		op.CapacityReservationProvider,
		op.PlacementGroupProvider,
		op.InstanceTypeStore,
		op.CABundle,
		cloudprovider.WithLegacyRepairPolicies(karpoptions.FromContext(ctx).LegacyNodeRepair),
		cloudprovider.WithRebootForRepair(options.FromContext(ctx).FeatureGates.RebootForRepair),
	)
	overlayUndecoratedCloudProvider := metrics.Decorate(awsCloudProvider)
	cloudProvider := overlay.Decorate(overlayUndecoratedCloudProvider, op.GetClient(), op.InstanceTypeStore)
	if os.Getenv(tolerationEnv) != "" {
		cloudProvider = tolerations{CloudProvider: cloudProvider, d: toleration}
	}
	repairPolicyMatcher := lo.Must(health.NewRepairPolicyMatcher(ctx, cloudProvider))
	clusterState := state.NewCluster(op.Clock, op.GetClient(), cloudProvider, state.WithRepairPolicyMatcher(repairPolicyMatcher))

	if karpoptions.FromContext(ctx).FeatureGates.ReservedCapacity {
		v1.CapacityReservationsEnabled = true
	}

	op.
		WithControllers(ctx, corecontrollers.NewControllers(
			ctx,
			op.Manager,
			op.Clock,
			op.GetClient(),
			op.EventRecorder,
			cloudProvider,
			overlayUndecoratedCloudProvider,
			clusterState,
			op.InstanceTypeStore,
			op.PredictionStore,
			corecontrollers.WithRegistrationHook(registrationhooks.NewPlacementGroupRegistrationHook(op.InstanceProvider)),
		)...).
		WithControllers(ctx, controllers.NewControllers(
			ctx,
			op.Manager,
			op.Config,
			op.Clock,
			op.EC2API,
			op.GetClient(),
			op.EventRecorder,
			op.UnavailableOfferingsCache,
			op.SSMCache,
			op.ValidationCache,
			op.RecreationCache,
			cloudProvider,
			op.SubnetProvider,
			op.SecurityGroupProvider,
			op.InstanceProfileProvider,
			op.InstanceProvider,
			op.PricingProvider,
			op.AMIProvider,
			op.LaunchTemplateProvider,
			op.VersionProvider,
			op.InstanceTypesProvider,
			op.CapacityReservationProvider,
			op.PlacementGroupProvider,
			op.AMIResolver,
			op.ZonalShiftProvider,
			op.InstanceStatusProvider,
			op.CABundle,
			op.CELEnvironment,
		)...).
		Start(ctx)
}
