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
cache=${HEALTH_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/health-router}/world/v${K8S_VERSION}
if [[ -x $cache/kube-controller-manager && -x $cache/kube-scheduler ]]; then
  echo "$cache"
  exit 0
fi

command -v go >/dev/null || { echo "world-bins.sh: go is not on PATH (needed to build kube-controller-manager and kube-scheduler)" >&2; exit 1; }

# One build at a time: a second caller (make world while a test builds the box) waits for the
# first one's result instead of starting its own build.
mkdir -p "$cache"
exec 9>"$cache.lock"
if ! flock -n 9; then
  echo "world: another process is building kube-controller-manager and kube-scheduler into $cache; waiting for it" >&2
  flock 9
fi
if [[ -x $cache/kube-controller-manager && -x $cache/kube-scheduler ]]; then
  echo "$cache"
  exit 0
fi

export GOTOOLCHAIN=${GOTOOLCHAIN_ENVTEST:-auto}
export GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
# progress reports a step on stderr with the time since the build began (stdout carries
# only the directory).
progress() { printf 'world: [%3dm%02ds] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$*" >&2; }

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
