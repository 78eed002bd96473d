#!/usr/bin/env bash
# Builds the Karpenter AWS provider's controller (cmd/controller) from the Go module proxy,
# once per machine and version, and prints the path of the binary (use it as KARPENTER_BIN).
# The version is the one go.mod requires, so the suite runs the Karpenter whose API types and
# message parsers the router is compiled against. No prebuilt image or binary is downloaded:
# this workplace reaches only the module proxy, so the controller is compiled from source.
#
# The first build takes a few minutes; afterwards the cached binary is reused. The cache lives
# outside the repository, keyed by the provider version.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
export GOTOOLCHAIN=${GOTOOLCHAIN_KARPENTER:-auto}
VERSION=${KARPENTER_VERSION:-$(cd "$root" && go list -m -f '{{.Version}}' github.com/aws/karpenter-provider-aws)}
if [[ -z $VERSION ]]; then
  echo "karpenter-bin.sh: cannot read the github.com/aws/karpenter-provider-aws version from go.mod" >&2
  exit 1
fi
cache=${HEALTH_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/health-router}/karpenter/${VERSION}
if [[ -x $cache/controller ]]; then
  echo "$cache/controller"
  exit 0
fi

export GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache"

# The provider requires timestreamwrite v1.43.1, which the module proxy does not serve; nothing
# the controller compiles imports it (only the provider's own tests do), so the same replace as
# this repository's go.mod lets the module graph load.
tsw=$(cd "$root" && go list -m -f '{{if .Replace}}{{.Replace.Version}}{{end}}' github.com/aws/aws-sdk-go-v2/service/timestreamwrite)
{
  echo "module karpenterbin"
  echo "go 1.26"
  echo "require github.com/aws/karpenter-provider-aws ${VERSION}"
  if [[ -n $tsw ]]; then
    echo "replace github.com/aws/aws-sdk-go-v2/service/timestreamwrite => github.com/aws/aws-sdk-go-v2/service/timestreamwrite ${tsw}"
  fi
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "github.com/aws/karpenter-provider-aws/cmd/controller"
GO
cd "$work"
echo "building Karpenter's AWS controller ${VERSION} into $cache (first run only, a few minutes)" >&2
start=$(date +%s)
go get github.com/aws/karpenter-provider-aws/cmd/controller@"${VERSION}" >&2
go build -trimpath -ldflags=-s -o "$cache/controller.tmp" github.com/aws/karpenter-provider-aws/cmd/controller
mv "$cache/controller.tmp" "$cache/controller"
echo "built Karpenter's controller in $(( $(date +%s) - start )) s" >&2
echo "$cache/controller"
