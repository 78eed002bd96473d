#!/usr/bin/env bash
# Builds, once per machine and version, every tool the suites of make test need, and prints
# them as the environment the suites read (one NAME=value a line): KARPENTER_BIN,
# KARPENTER_REPAIR_BIN (the same controller with node repair's toleration settable),
# KUBEBUILDER_ASSETS (kube-apiserver, etcd), HELM_BIN, ALERTMANAGER_BIN, WORLD_BINS
# (kube-controller-manager, kube-scheduler) and KWOK_BIN, for the cluster in a box. A failed build fails
# this script, so no suite runs without its tool (none is skipped). make test runs it in the
# background (make-test.sh), so the order is the order the suites need them in: envtest and
# helm for test/deploy, Alertmanager for test/gates, Karpenter for test/karpenter, then the
# box's controller-manager, scheduler and kwok for test/box, which runs last.
set -euo pipefail
cd "$(dirname "$0")"
assets=$(./timed.sh envtest ./envtest-bins.sh)
helm=$(./timed.sh helm ./helm-bin.sh)
alertmanager=$(./timed.sh alertmgr ./alertmanager-bin.sh)
karpenter=$(./timed.sh karpenter ./karpenter-bin.sh)
repair=$(./timed.sh karprep ./karpenter-bin.sh repair)
world=$(./timed.sh world ./world-bins.sh)
kwok=$(./timed.sh kwok ./kwok-bin.sh)
printf '%s\n' "KARPENTER_BIN=$karpenter" "KARPENTER_REPAIR_BIN=$repair" "KUBEBUILDER_ASSETS=$assets" "HELM_BIN=$helm" "ALERTMANAGER_BIN=$alertmanager" \
  "WORLD_BINS=$world" "KWOK_BIN=$kwok"
