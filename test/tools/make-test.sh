#!/usr/bin/env bash
# make test: gofmt, go vet, every Go suite, the Karpenter version matrix and Terraform's. The tools the suites need
# (tools-env.sh: kube-apiserver and etcd, helm, Alertmanager, Karpenter) build in the
# background from the start, beside go vet and the suites that need none of them. A suite
# that needs a tool asks the tool's script, which waits for the background build (each script
# holds a lock while it builds) and then finds the binary in the cache: no suite runs without
# its tool, and on a fresh 2-core machine the tools' compile fills the time go vet spends
# downloading modules and the suites spend waiting on servers. A failed build fails the run,
# whether or not a suite asked for that tool.
#
# After go vet the suites run in three streams, one package at a time each. The main stream
# holds the Go suites that wait on servers and clocks (envtest, moto, the real Karpenter): they
# keep a core busy about half the time. Beside it, Terraform's suite and the cluster in a box,
# which wait too; and at a lower priority (nice) the suites that only compute and have no
# deadline of their own: the simulation (a fake clock) and the image's two-platform build (a
# cross-compile), then the release. On 2 cores the other streams take the time the main one
# leaves idle; one after the other, the suites took 55 minutes from empty caches
# (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
timed=test/tools/timed.sh
"${MAKE:-make}" --no-print-directory fmt # before anything is built: a format error fails at once
log=$(mktemp)
trap 'rm -f "$log" "$log.env" "$log.side" "$log.compute"' EXIT
$timed tools test/tools/tools-env.sh >"$log.env" 2>"$log" &
tools=$!
finish_tools() {
  local rc=0
  wait "$tools" || rc=$?
  cat "$log" >&2
  if [[ $rc != 0 ]]; then
    echo "make test: building the tools failed (exit $rc)" >&2
    exit "$rc"
  fi
}
rc=0
$timed vet go vet ./... || rc=$?
if [[ $rc != 0 ]]; then
  finish_tools
  exit "$rc"
fi
# Beside the main stream, two more. The one that computes, at the lower priority: the
# simulation, then the image (both platforms), then the release, which runs `make release` for
# this platform only once test/image has compiled the image's binary (a link and the archives,
# not a cross-compile). The one that waits, at the usual priority: Terraform's suite (moto,
# terraform, envtest; it runs the Lambda's and test/terraform's Go tests itself), then the
# cluster in a box (test/box: the real Karpenter alone and with the router in front; then the
# five-minute soak, test/box/soak), whose controller-manager, scheduler and kwok the tools'
# background build makes last. Their output is kept and shown when all three are done.
# The compute stream's timeout is per package and wide: at nice 10 beside the two other streams,
# on a slow 2-core VM, the simulation got 3 minutes of CPU in its first 18 (of the 7 it needs).
compute=(./test/sim ./test/image ./test/release)
$timed go-compute nice -n 10 go test -p 1 -count=1 -timeout 75m "${compute[@]}" >"$log.compute" 2>&1 &
compute_pid=$!
(
  side_rc=0
  $timed terraform test/tools/terraform-tests.sh || side_rc=$?
  # test/box/soak apart, once, for five minutes, with its table (-v): make soak runs it for hours.
  # shellcheck disable=SC2046
  $timed box go test -p 1 -count=1 -timeout 20m $(go list ./test/box/... | grep -v /test/box/soak) || side_rc=$?
  $timed soak env SOAK_DURATION=5m SOAK_SEED= go test -count=1 -timeout 20m -v ./test/box/soak || side_rc=$?
  exit "$side_rc"
) >"$log.side" 2>&1 &
side_pid=$!
packages=$(go list ./... | grep -v -e /test/terraform -e /lambda/ -e /test/box -e '/test/sim$' -e '/test/image$' -e '/test/release$')
# shellcheck disable=SC2086
$timed go-test go test -p 1 -count=1 -timeout 30m $packages || rc=$?
# The Karpenter version matrix: its own modules, one per Karpenter version.
$timed karpenter test/tools/karpenter-versions.sh || rc=$?
side_rc=0
wait "$compute_pid" || side_rc=$?
wait "$side_pid" || side_rc=$?
echo "--- the stream that computes (simulation, image, release):"
cat "$log.compute"
echo "--- the stream that waits (Terraform, the box):"
cat "$log.side"
finish_tools
if [[ $rc != 0 ]]; then
  exit "$rc"
fi
exit "$side_rc"
