#!/usr/bin/env bash
# Builds the dispatcher Lambda's deployment zip (provided.al2023, arm64, handler "bootstrap").
# Usage: lambda/build.sh [output.zip]   (default: dist/dispatcher.zip at the repository root)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/dist/dispatcher.zip}
case $out in /*) ;; *) out=$PWD/$out ;; esac
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$root" && GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -trimpath -tags lambda.norpc \
	-ldflags='-s -w' -o "$work/bootstrap" ./lambda/dispatcher)

mkdir -p "$(dirname "$out")"
rm -f "$out"
if command -v zip >/dev/null 2>&1; then
	(cd "$work" && zip -q -X "$out" bootstrap)
else
	# python3's zipfile keeps the executable bit Lambda needs.
	(cd "$work" && python3 -m zipfile -c "$out" bootstrap)
fi
echo "built $out"
