#!/usr/bin/env bash
# Runs a command and says on stderr how long it took, in wall time and in CPU time (user +
# system, of the command and everything it waited for): make test's phases, timed. CI has 90
# minutes on a fresh 2-core machine; wall time depends on what else runs there, CPU time
# hardly, so the two together say where the time goes. Usage: timed.sh NAME COMMAND [ARG...]
set -uo pipefail
name=$1
shift
start=$SECONDS
"$@"
rc=$?
elapsed=$((SECONDS - start))
# The second line of `times` is the children's user and system time, as "1m2.345s 0m6.789s";
# it runs in this shell (in a command substitution it would see only the subshell's own).
tf=$(mktemp)
times >"$tf"
cpu=$(sed -n 2p "$tf" | awk '{
  n = 0
  for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); n += p[1] * 60 + p[2] }
  printf "%dm%02ds", n / 60, n % 60
}')
rm -f "$tf"
printf 'timed: %-9s %3dm%02ds wall, %s CPU (exit %d)\n' "$name" $((elapsed / 60)) $((elapsed % 60)) "$cpu" "$rc" >&2
exit "$rc"
