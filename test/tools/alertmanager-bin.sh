#!/usr/bin/env bash
# Builds Prometheus Alertmanager from the Go module proxy, once per machine and version,
# and prints the path of the binary (use it as ALERTMANAGER_BIN). The alert gate's tests
# run against this real server. No prebuilt binary is downloaded: this workplace reaches
# only the module proxy, so the binary is compiled from source.
set -euo pipefail

VERSION=${ALERTMANAGER_VERSION:-v0.34.2}
# shellcheck source=tool-cache.sh
source "$(dirname "$0")/tool-cache.sh"
cache=$tool_cache_root/alertmanager/${VERSION}
tool_ready alertmanager "$cache" "$cache/alertmanager" alertmanager alertmanager

export GOTOOLCHAIN=${GOTOOLCHAIN_ALERTMANAGER:-auto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "alertmanager: first run on this machine: building alertmanager ${VERSION} from source (Go module proxy) into $cache" >&2
echo "alertmanager:   this takes a few minutes on 2 cores; later runs reuse the cached binary at once" >&2
progress "fetching github.com/prometheus/alertmanager@${VERSION}"
# The module zip lacks the web UI's built assets (ui/app/dist, made by npm in its release
# process), which ui/web.go embeds: build from a copy of the module with a placeholder
# page there. The tests use the API only; the module's go.mod and go.sum pin every
# dependency (checked against the checksum database).
dir=$(cd "$work" && go mod download -json "github.com/prometheus/alertmanager@${VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n $dir && -d $dir ]] || { echo "alertmanager-bin.sh: could not download github.com/prometheus/alertmanager@${VERSION}" >&2; exit 1; }
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$work/src/ui/app/dist"
echo '<!doctype html><title>Alertmanager</title><p>UI not built (health-router test binary: API only)' >"$work/src/ui/app/dist/index.html"
progress "compiling alertmanager"
# cgo off and -trimpath, as every build make runs: the standard library comes from the build cache.
(cd "$work/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags=-s -o "$work/alertmanager" ./cmd/alertmanager) >&2
mv "$work/alertmanager" "$cache/alertmanager"
progress "done: cached in $cache (delete that directory to rebuild)"
echo "$cache/alertmanager"
