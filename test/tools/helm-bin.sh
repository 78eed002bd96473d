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
cache=${HEALTH_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/health-router}/helm/${HELM_VERSION}-k8s1.${HELM_K8S_MINOR}
if [[ -x $cache/helm ]]; then
  echo "$cache/helm"
  exit 0
fi
command -v go >/dev/null || { echo "helm-bin.sh: go is not on PATH" >&2; exit 1; }

export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
root=$(cd "$(dirname "$0")/../.." && pwd)
# One build at a time: a second caller (a suite while make test builds the tools in the
# background) waits for the first one's result instead of starting its own build.
mkdir -p "$cache"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "helm: another process is building helm into $cache; waiting for it" >&2
  flock 9
fi
if [[ -x $cache/helm ]]; then
  echo "$cache/helm"
  exit 0
fi
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
