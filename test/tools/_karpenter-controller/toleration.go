// Package main is the suites' addition to Karpenter's AWS controller: test/tools/karpenter-bin.sh
// repair builds the provider's own cmd/controller (its main.go, taken from the module cache at
// build time, never kept here) with this file beside it, and wraps its cloud provider in
// repairToleration. The repair policies then wait HEALTH_ROUTER_REPAIR_TOLERATION (a Go
// duration) instead of their own toleration (30 minutes for a NotReady Node), so that a test
// sees node repair act within its time: Karpenter measures the toleration from the condition's
// last transition, but never from before the Node's creation (the API server's timestamp, which
// no client can backdate). Unset, the cloud provider is the provider's, unchanged.
//
// The directory's name starts with "_" so that the module's ./... leaves it out.
package main

import (
	"fmt"
	"os"
	"time"

	corecloudprovider "sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// tolerationEnv names the repair policies' toleration for the suites.
const tolerationEnv = "HEALTH_ROUTER_REPAIR_TOLERATION"

// tolerations is a cloud provider with every repair policy's toleration set to d.
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

// repairToleration wraps cp as HEALTH_ROUTER_REPAIR_TOLERATION asks (cp itself when unset).
func repairToleration(cp corecloudprovider.CloudProvider) corecloudprovider.CloudProvider {
	v := os.Getenv(tolerationEnv)
	if v == "" {
		return cp
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: want a duration of 0 or more\n", tolerationEnv, v)
		os.Exit(2)
	}
	return tolerations{CloudProvider: cp, d: d}
}
