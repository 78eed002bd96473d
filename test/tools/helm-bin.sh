#!/usr/bin/env bash
# Builds helm from the Go module proxy, once per machine and version, and prints the path of the
# binary (the chart tests read it as HELM_BIN). No prebuilt binary is downloaded: this workplace
# reaches only the module proxy, so helm is compiled from source (a minute or two, the first
# time; afterwards the cached binary is reused). The cache lives outside the repository.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
# The Kubernetes version `helm template` and `helm lint` assume without a cluster: helm's own
# Makefile stamps the minor version of its client-go (v0.37 for helm v3.22.0).
HELM_K8S_MINOR=${HELM_K8S_MINOR:-37}
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/helm/${HELM_VERSION}-k8s1.${HELM_K8S_MINOR}
tool_ready helm "$cache" "$cache/helm" helm helm

export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building helm ${HELM_VERSION} into $cache (first run only, a minute or two; cached afterwards)" >&2
# The version stamps come from -ldflags, as helm's own Makefile sets them.
ldflags="-s -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
for pkg in pkg/lint/rules pkg/chartutil; do
  ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=${HELM_K8S_MINOR}"
done
# Built inside this repository's own module graph (a copy of go.mod and go.sum; the
# repository's files are never written), as Karpenter is (karpenter-bin.sh): helm's client-go,
# apimachinery and the rest are the versions the tests compiled already, with the same flags
# (cgo off, -trimpath), so only what helm alone uses is compiled. go.mod keeps the modules
# both use at versions helm accepts, so adding helm upgrades none the router compiles.
cp "$root/go.mod" "$work/helm.mod"
cp "$root/go.sum" "$work/helm.sum"
cd "$root"
CGO_ENABLED=0 GOFLAGS=-mod=mod go get -modfile="$work/helm.mod" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -modfile="$work/helm.mod" -trimpath -ldflags "$ldflags" -o "$work/helm" helm.sh/helm/v3/cmd/helm
mv "$work/helm" "$cache/helm"
echo "$cache/helm"
