#!/usr/bin/env bash
# Builds the rest of the cluster in a box's control plane (test/box) from the Go module proxy,
# once per machine and version: kube-controller-manager and kube-scheduler from the same
# k8s.io/kubernetes release as envtest's kube-apiserver (envtest-bins.sh). It prints the
# directory that holds them. No prebuilt binaries are downloaded: this workplace reaches only
# the module proxy, so the binaries are compiled from source.
#
# A script and a cache of its own rather than two more binaries in envtest-bins.sh: make test's
# suites need only kube-apiserver and etcd, and their first build must not wait for these two.
# The module download is the one envtest's build made (the module cache), and most of the
# compile too: the controller-manager and the scheduler share with kube-apiserver the API
# types, client-go, the apiserver library and the component base, already in the build cache
# once envtest's build ran (test/box asks for envtest first).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.0}
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/world/v${K8S_VERSION}
tool_ready world "$cache" "$cache" "kube-controller-manager and kube-scheduler" kube-controller-manager kube-scheduler

export GOTOOLCHAIN=${GOTOOLCHAIN_ENVTEST:-auto}
export GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The same module graph as envtest's build (k8s-modfile.sh): this repository's go.mod with the
# staging modules pinned to the release.
# shellcheck source=k8s-modfile.sh
source "$(dirname "$0")/k8s-modfile.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
k8s_modfile "$work" world
cd "$root"
export CGO_ENABLED=0
modfile=-modfile=$work/world.mod
echo "world: first run on this machine: building the box's controller-manager and scheduler from source (Go module proxy)" >&2
echo "world:   kube-controller-manager and kube-scheduler v${K8S_VERSION} into $cache" >&2
echo "world:   this takes a few minutes after envtest's build; later runs reuse the cached binaries at once" >&2
progress "fetching modules (k8s.io/kubernetes v${K8S_VERSION})"
go get "$modfile" k8s.io/kubernetes/cmd/kube-controller-manager@v${K8S_VERSION} k8s.io/kubernetes/cmd/kube-scheduler@v${K8S_VERSION} >&2
progress "compiling kube-controller-manager"
go build "$modfile" -trimpath -ldflags=-s -o "$cache/kube-controller-manager.tmp" k8s.io/kubernetes/cmd/kube-controller-manager
progress "compiling kube-scheduler"
go build "$modfile" -trimpath -ldflags=-s -o "$cache/kube-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler
mv "$cache/kube-controller-manager.tmp" "$cache/kube-controller-manager"
mv "$cache/kube-scheduler.tmp" "$cache/kube-scheduler"
progress "done: cached in $cache (delete that directory to rebuild)"
echo "$cache"
