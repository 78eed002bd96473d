#!/usr/bin/env bash
# Runs a command and says on stderr how long it took (make test's phases: CI has 90 minutes on
# a fresh machine, and this is where the time goes). Usage: timed.sh NAME COMMAND [ARG...]
set -uo pipefail
name=$1
shift
start=$SECONDS
"$@"
rc=$?
elapsed=$((SECONDS - start))
printf 'timed: %-8s %3dm%02ds (exit %d)\n' "$name" $((elapsed / 60)) $((elapsed % 60)) "$rc" >&2
exit "$rc"
