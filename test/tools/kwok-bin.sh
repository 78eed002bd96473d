#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok), the kubelets of the cluster in a box (test/box), from
# the Go module proxy, once per machine and version, and prints the path of the binary (KWOK_BIN
# overrides it in test/box). No prebuilt binary is downloaded: this workplace reaches only the
# module proxy, so kwok is compiled from source. The cache lives outside the repository, keyed
# by kwok's version.
set -euo pipefail

KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/kwok/${KWOK_VERSION}
tool_ready kwok "$cache" "$cache/kwok" kwok kwok

export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
export GOFLAGS=-mod=mod CGO_ENABLED=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$(cd "$(dirname "$0")/../.." && pwd)
echo "kwok: first run on this machine: building kwok ${KWOK_VERSION} from source (Go module proxy) into $cache" >&2
# Built inside this repository's own module graph (a copy of go.mod and go.sum; the
# repository's files are never written), as Karpenter and helm are: of kwok's ~1,000 packages
# all but ~90 are the router's too (client-go, apimachinery, the apiserver library, grpc,
# otel), at the versions the router is compiled against, so with make's flags (cgo off,
# -trimpath) the build cache already holds them from `go vet` and the tests. kwok v0.8.0 asks
# for Kubernetes 0.36 modules; it builds against the router's 0.37.
cp "$root/go.mod" "$work/kwok.mod"
cp "$root/go.sum" "$work/kwok.sum"
cd "$root"
progress "fetching modules (sigs.k8s.io/kwok ${KWOK_VERSION})"
go get -modfile="$work/kwok.mod" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" >&2
progress "compiling kwok"
go build -modfile="$work/kwok.mod" -trimpath -ldflags=-s -o "$cache/kwok.tmp" sigs.k8s.io/kwok/cmd/kwok
mv "$cache/kwok.tmp" "$cache/kwok"
progress "done: cached in $cache (delete that directory to rebuild)"
echo "$cache/kwok"
