# shellcheck shell=bash
# Sourced by the scripts that build a tool from the Go module proxy into the cache
# (envtest-bins.sh, world-bins.sh, kwok-bin.sh, helm-bin.sh, alertmanager-bin.sh,
# karpenter-bin.sh): what each of them does around its build, written once.

# tool_cache_root is the cache every tool is built into, outside the repository:
# HEALTH_ROUTER_CACHE, or health-router in the user's cache directory.
tool_cache_root=${HEALTH_ROUTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/health-router}

# tool_built DIR FILE... reports whether every FILE is an executable in DIR.
tool_built() {
  local dir=$1 f
  shift
  for f; do [[ -x $dir/$f ]] || return 1; done
}

# tool_ready NAME DIR OUT WHAT FILE... prints OUT and ends the script when every FILE is built
# in DIR already. Otherwise it takes DIR's lock, so that one build runs at a time (a second
# caller, make demo while make test builds, waits for the first one's result and then finds it
# built), and returns to the script, which builds. From then on, progress reports the build's
# steps. NAME prefixes what it says on stderr; WHAT names what is built.
tool_ready() {
  local name=$1 dir=$2 out=$3 what=$4
  shift 4
  if tool_built "$dir" "$@"; then
    echo "$out"
    exit 0
  fi
  command -v go >/dev/null || {
    echo "$name: go is not on PATH (needed to build $what)" >&2
    exit 1
  }
  mkdir -p "$dir"
  exec 9>"$dir.lock"
  if ! flock -n 9; then
    echo "$name: another process is building $what into $dir; waiting for it" >&2
    flock 9
  fi
  if tool_built "$dir" "$@"; then
    echo "$out"
    exit 0
  fi
  tool_name=$name
  tool_start=$SECONDS
}

# progress reports a step of the build on stderr with the time since it began (stdout carries
# only what the script prints for its caller).
progress() {
  local t=$((SECONDS - tool_start))
  printf '%s: [%3dm%02ds] %s\n' "$tool_name" $((t / 60)) $((t % 60)) "$*" >&2
}
