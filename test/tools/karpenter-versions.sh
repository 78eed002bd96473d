#!/usr/bin/env bash
# The Karpenter version matrix (test/karpenter-versions): every body the router forwards, read
# by the interruption message parsers of each Karpenter version the router is checked against.
# Each version is a module of its own (the main module builds against one Karpenter only), so
# each runs its own `go test`, with the GOFLAGS make exports. Each pulls only Karpenter's
# messages packages and what they import (samber/lo, x/text, apimachinery's sets): about 11 MB
# of modules a version, a few seconds each once the standard library is built.
set -euo pipefail
cd "$(dirname "$0")/../karpenter-versions"
rc=0
for mod in v*/go.mod; do
  dir=$(dirname "$mod")
  (cd "$dir" && go test -count=1 ./...) || rc=1
done
exit "$rc"
