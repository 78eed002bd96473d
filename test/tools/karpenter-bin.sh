#!/usr/bin/env bash
# Builds the Karpenter AWS provider's controller (cmd/controller) from the Go module proxy,
# once per machine and version, and prints the path of the binary (use it as KARPENTER_BIN).
# The version is the one go.mod requires, so the suite runs the Karpenter whose API types and
# message parsers the router is compiled against. No prebuilt image or binary is downloaded:
# this workplace reaches only the module proxy, so the controller is compiled from source.
#
# The first build takes a few minutes; afterwards the cached binary is reused. The cache lives
# outside the repository, keyed by the provider version.
#
# With the argument "repair" it builds the same controller with one addition: the provider's
# own cmd/controller/main.go, taken from the module cache at build time (never kept in this
# repository), beside test/tools/_karpenter-controller/toleration.go, its cloud provider wrapped
# so that the environment can shorten the repair policies' toleration
# (HEALTH_ROUTER_REPAIR_TOLERATION) for the suite that shows node repair beside a reboot in
# place. Its cache is keyed by the provider version and that file's hash.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN_KARPENTER:-auto}
VERSION=${KARPENTER_VERSION:-$(cd "$root" && go list -m -f '{{.Version}}' github.com/aws/karpenter-provider-aws)}
if [[ -z $VERSION ]]; then
  echo "karpenter-bin.sh: cannot read the github.com/aws/karpenter-provider-aws version from go.mod" >&2
  exit 1
fi
pkg=github.com/aws/karpenter-provider-aws/cmd/controller
key=$VERSION
if [[ ${1:-} == repair ]]; then
  key=$VERSION-repair-$(sha256sum "$root/test/tools/_karpenter-controller/toleration.go" | cut -c1-12)
fi
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/karpenter/${key}
tool_ready karpenter "$cache" "$cache/controller" "the controller" controller
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Built inside this repository's own module graph (a copy of go.mod and go.sum, so the
# repository's files are never written): Karpenter's dependencies are then the versions the
# router is compiled against (client-go, controller-runtime, Karpenter core, the AWS SDK's
# EC2 client, the largest package of all), and with make's flags (cgo off, -trimpath) the
# build cache already holds them from `go vet` and the tests: on a fresh machine only what
# the controller alone uses is compiled. The go.mod copy also carries this repository's
# replace of timestreamwrite (the provider requires v1.43.1, which the module proxy does not
# serve; nothing the controller compiles imports it).
cp "$root/go.mod" "$work/karpenter.mod"
cp "$root/go.sum" "$work/karpenter.sum"
cd "$root"
if [[ ${1:-} == repair ]]; then
  # The provider's main.go and the suites' wrapper, as one package in a directory of its own
  # with the same module graph (go.mod and go.sum copied there: the module root).
  dir=$(GOFLAGS=-mod=mod go list -modfile="$work/karpenter.mod" -m -f '{{.Dir}}' "github.com/aws/karpenter-provider-aws")
  if [[ -z $dir ]]; then
    GOFLAGS=-mod=mod go mod download -modfile="$work/karpenter.mod" "github.com/aws/karpenter-provider-aws@$VERSION"
    dir=$(GOFLAGS=-mod=mod go list -modfile="$work/karpenter.mod" -m -f '{{.Dir}}' "github.com/aws/karpenter-provider-aws")
  fi
  mkdir -p "$work/mod/controller"
  cp "$root/go.mod" "$work/mod/go.mod"
  cp "$root/go.sum" "$work/mod/go.sum"
  cp "$dir/cmd/controller/main.go" "$work/mod/controller/main.go"
  chmod u+w "$work/mod/controller/main.go"
  cp "$root/test/tools/_karpenter-controller/toleration.go" "$work/mod/controller/"
  # The one line changed: the cloud provider the controllers get is wrapped.
  sed -i -E 's/^([[:space:]]*cloudProvider := )(overlay\.Decorate\(.*\))$/\1repairToleration(\2)/' "$work/mod/controller/main.go"
  if ! grep -q 'cloudProvider := repairToleration(overlay.Decorate(' "$work/mod/controller/main.go"; then
    echo "karpenter-bin.sh repair: Karpenter ${VERSION}'s cmd/controller/main.go no longer builds its cloud provider with overlay.Decorate on one line: update the patch" >&2
    exit 1
  fi
  cd "$work/mod"
  pkg=./controller
  modflag=()
else
  modflag=(-modfile="$work/karpenter.mod")
fi
echo "building Karpenter's AWS controller ${VERSION} into $cache (first run only, a few minutes)" >&2
start=$(date +%s)
CGO_ENABLED=0 GOFLAGS=-mod=mod go build "${modflag[@]}" -trimpath -ldflags=-s \
  -o "$cache/controller.tmp" "$pkg"
mv "$cache/controller.tmp" "$cache/controller"
echo "built Karpenter's controller in $(( $(date +%s) - start )) s" >&2
echo "$cache/controller"
