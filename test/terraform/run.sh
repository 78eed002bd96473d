#!/usr/bin/env bash
# Tests of the AWS side (terraform/, lambda/, test/terraform/), in one go:
#   terraform fmt, offline init + validate of the module and every example, `terraform test`
#   (plan-time assertions with a mocked provider), gofmt/go vet, the dispatcher's Go tests
#   against moto_server, the dashboard/alarm consistency test, the module applied to moto_server
#   with real events through its rules, the runbook's way in followed with doctor at each step
#   (TestRunbook: examples/basic applied to moto, the chart on envtest), and the Lambda zip build.
# Usage: test/terraform/run.sh            (about 8 minutes on 2 cores, warm Go cache)
#        SHORT=1 test/terraform/run.sh    (skips the apply against moto: about 1 minute)
# Exits non-zero when a step fails; the last line is "N passed, N failed[, N skipped]".
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 skipped=0
failures=()

# step NAME COMMAND...: runs COMMAND, shows its output when it fails.
step() {
	local name=$1
	shift
	local start=$SECONDS
	if "$@" >"$work/step.log" 2>&1; then
		passed=$((passed + 1))
		printf 'PASS  %-50s %4ss\n' "$name" $((SECONDS - start))
	else
		failed=$((failed + 1))
		failures+=("$name")
		printf 'FAIL  %-50s %4ss\n' "$name" $((SECONDS - start))
		# Failures first (verbose go test output would bury them), then the end of the log.
		grep -E -e '--- FAIL|_test\.go:[0-9]+:|^Error|^FAIL' "$work/step.log" | head -n 60 | sed 's/^/      ! /'
		sed 's/^/      | /' "$work/step.log" | tail -n 40
	fi
}

skip() {
	skipped=$((skipped + 1))
	printf 'SKIP  %s\n' "$1"
}

loud() {
	printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n'
	printf '!!! %s\n' "$@"
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n'
}

# ---------------------------------------------------------------- Terraform
tf=$(command -v terraform || true)
[ -z "$tf" ] && [ -x /usr/local/bin/terraform ] && tf=/usr/local/bin/terraform
mirror=${TF_PROVIDER_MIRROR:-}
if [ -z "$mirror" ]; then
	found=$(find / -maxdepth 6 -path '*registry.terraform.io/hashicorp/aws' -type d 2>/dev/null | head -n 1)
	[ -n "$found" ] && mirror=${found%/registry.terraform.io/hashicorp/aws}
fi

tf_init() { # DIR: offline init, provider from the mirror, state of init outside the repository
	TF_DATA_DIR="$work/tfdata/${1//\//_}" "$tf" -chdir="$1" init -backend=false -input=false -no-color
}
tf_init_validate() { # DIR
	tf_init "$1" && tf_in "$1" validate -no-color
}
tf_in() { # DIR COMMAND...
	local dir=$1
	shift
	TF_DATA_DIR="$work/tfdata/${dir//\//_}" "$tf" -chdir="$dir" "$@"
}

if [ -z "$tf" ]; then
	loud "terraform NOT FOUND: fmt, validate, terraform test and the moto apply are SKIPPED" \
		"install terraform >= 1.9 to run them"
	skip "terraform checks (terraform absent)"
elif [ -z "$mirror" ]; then
	loud "no provider mirror with registry.terraform.io/hashicorp/aws found (set TF_PROVIDER_MIRROR)" \
		"terraform init cannot work offline: validate and terraform test are SKIPPED"
	skip "terraform checks (no provider mirror)"
else
	export TF_PROVIDER_MIRROR=$mirror
	cat >"$work/terraformrc" <<-RC
		provider_installation {
		  filesystem_mirror {
		    path    = "$mirror"
		    include = ["registry.terraform.io/hashicorp/*"]
		  }
		}
	RC
	export TF_CLI_CONFIG_FILE=$work/terraformrc TF_PLUGIN_CACHE_DIR=
	echo "terraform: $("$tf" version | head -n 1), providers from $mirror"

	step "terraform fmt -check" "$tf" fmt -check -recursive -diff terraform test/terraform/moto
	for dir in terraform terraform/examples/*/ test/terraform/moto; do
		dir=${dir%/}
		step "terraform init + validate $dir" tf_init_validate "$dir"
	done
	step "terraform test (terraform/tests)" tf_in terraform test -no-color
	step "terraform test (terraform/examples/basic/tests: the runbook)" tf_in terraform/examples/basic test -no-color
fi

# ---------------------------------------------------------------- Go
step "gofmt lambda test/terraform" bash -c '[ -z "$(gofmt -l lambda test/terraform | tee /dev/stderr)" ]'
step "go vet" go vet ./lambda/... ./test/terraform/...

if [ -z "$(command -v moto_server || true)" ] && [ ! -x /root/.pyenv/shims/moto_server ]; then
	loud "moto_server NOT FOUND: the dispatcher and moto apply tests will SKIP (pip install 'moto[server]')"
fi
short=()
if [ -n "${SHORT:-}" ]; then
	short=(-short)
	loud "SHORT=1: the terraform apply against moto is SKIPPED"
fi
step "go test ./lambda/... (dispatcher vs moto)" go test -p 1 -count=1 "${short[@]}" ./lambda/...
step "go test ./test/terraform/... (consistency, moto apply, runbook)" go test -p 1 -count=1 -timeout 15m "${short[@]}" -v ./test/terraform/...
if grep -q -e '--- SKIP' "$work/step.log" 2>/dev/null; then
	skipped=$((skipped + $(grep -c -e '--- SKIP' "$work/step.log")))
	grep -A1 -e '--- SKIP' "$work/step.log" | sed 's/^/      | /'
fi
# The zip must hold an executable linux/arm64 ELF named bootstrap (e_machine 183 = AArch64).
check_zip() {
	python3 - "$1" <<-'PY'
		import struct, sys, zipfile
		z = zipfile.ZipFile(sys.argv[1])
		info = z.getinfo("bootstrap")
		head = z.open(info).read(20)
		assert head[:4] == b"\x7fELF", "bootstrap is not an ELF binary"
		assert struct.unpack("<H", head[18:20])[0] == 183, "bootstrap is not arm64"
		assert (info.external_attr >> 16) & 0o111, "bootstrap is not executable"
	PY
}
step "lambda/build.sh (linux/arm64 zip)" bash -c "lambda/build.sh '$work/dispatcher.zip'"
step "dispatcher zip: executable arm64 bootstrap" check_zip "$work/dispatcher.zip"

# ---------------------------------------------------------------- summary
echo
if [ "$failed" -gt 0 ]; then
	echo "failed: ${failures[*]}"
fi
if [ "$skipped" -gt 0 ]; then
	echo "$passed passed, $failed failed, $skipped skipped"
else
	echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
