#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver and etcd) from the Go module proxy,
# once per machine and version, and prints the directory that holds them
# (use it as KUBEBUILDER_ASSETS). No prebuilt binaries are downloaded: this workplace
# reaches only the module proxy, so the binaries are compiled from source.
#
# The build takes a few minutes the first time; afterwards the cached binaries are
# reused. The cache lives outside the repository, keyed by the Kubernetes version.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.0}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/envtest/v${K8S_VERSION}-etcd${ETCD_VERSION}
tool_ready envtest "$cache" "$cache" "kube-apiserver and etcd" kube-apiserver etcd

export GOTOOLCHAIN=${GOTOOLCHAIN_ENVTEST:-auto}
export GOFLAGS=-mod=mod
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Built inside this repository's own module graph (k8s-modfile.sh: a copy of go.mod and
# go.sum, so the repository's files are never written, with the staging modules pinned to the
# release): every package kube-apiserver shares with the router (~700 of them) is then the
# version the router is compiled against and already in the build cache. go.mod keeps the
# shared modules at the versions this release needs, so adding k8s.io/kubernetes upgrades only
# modules the router does not compile.
# shellcheck source=k8s-modfile.sh
source "$(dirname "$0")/k8s-modfile.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
k8s_modfile "$work" envtest
cd "$root"
export CGO_ENABLED=0
modfile=-modfile=$work/envtest.mod
echo "envtest: first run on this machine: building the test control plane from source (Go module proxy)" >&2
echo "envtest:   kube-apiserver v${K8S_VERSION} and etcd ${ETCD_VERSION} into $cache" >&2
echo "envtest:   this takes several minutes (about 15 on 2 cores); later runs reuse the cached binaries at once" >&2
progress "fetching modules (k8s.io/kubernetes v${K8S_VERSION}, go.etcd.io/etcd/server/v3 ${ETCD_VERSION})"
go get "$modfile" k8s.io/kubernetes/cmd/kube-apiserver@v${K8S_VERSION} go.etcd.io/etcd/server/v3@${ETCD_VERSION} >&2
progress "compiling kube-apiserver (the long step)"
go build "$modfile" -trimpath -ldflags=-s -o "$cache/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
progress "compiling etcd"
go build "$modfile" -trimpath -ldflags=-s -o "$cache/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$cache/kube-apiserver.tmp" "$cache/kube-apiserver"
mv "$cache/etcd.tmp" "$cache/etcd"
progress "done: cached in $cache (delete that directory to rebuild)"
echo "$cache"
