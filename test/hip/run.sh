#!/usr/bin/env bash
# HIP programs on kfd-emu's shader engine (issue 26): Debian's hipcc and HIP 5.2, unchanged.
#
#   usage: test/hip/run.sh [NAME...]        (as root; `make test-hip` runs it)
#          test/hip/run.sh --list
#          test/hip/run.sh --build NAME     (builds NAME only; prints the binary's path)
#   env:   CARGO_TARGET_DIR      where kfd-emu was built (default rust/target)
#          HIP_TEST_TIMEOUT=S    seconds one program may take (default 300)
#          HIP_TEST_PROFILES     profiles to run on (default "mi100 mi210x4")
#
# Every test/hip/*.hip (or the NAMEs given, without .hip) is built once with hipcc for both
# gfx908 and gfx90a into build/hip/ (rebuilt when the source or check.h is newer), then run on
# `kfd-emu run --profile P` for each profile: mi100 (gfx908) and mi210x4 (gfx90a). A program
# checks its own results and exits 0 when they are right (test/hip/README.md). Its source may
# say:
#   // hipcc-flags: F...                on its first line: hipcc flags instead of -O2
#   // hip-test: expect-abort TEXT      the program must die (non-zero) with TEXT in its
#                                       output; then vector-add runs in the same emulator,
#                                       which proves the daemon lives on
#   // hip-test: needs-gpus N           it runs on profiles with N GPUs or more and is
#                                       reported SKIP (with the reason) on the others
#   // hip-test: needs-isa GFX...       it runs on the profiles of those ISAs only and is
#                                       reported SKIP (with the reason) on the others
# Each (program, profile) prints PASS, FAIL with the reason and the log's tail, or SKIP with
# the reason (never counted as passed). The last line is "N passed, M failed" (", K skipped");
# the exit status is non-zero on any failure.
set -uo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=$top/build/hip
logs=$out/logs
kfd_emu=${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu
timeout_s=${HIP_TEST_TIMEOUT:-300}
read -r -a profiles <<<"${HIP_TEST_PROFILES:-mi100 mi210x4}"
declare -A gfx=([mi100]=gfx908 [mi100x2]=gfx908 [mi210x4]=gfx90a [mi250x8]=gfx90a)
PASSED=0 FAILED=0 SKIPPED=0
# hip_build
# shellcheck source=SCRIPTDIR/build.sh
. "$here/build.sh"

names=()
if [ "${1:-}" = --list ]; then
	for f in "$here"/*.hip; do basename "$f" .hip; done
	exit 0
fi
if [ $# -gt 0 ]; then
	names=("$@")
else
	for f in "$here"/*.hip; do names+=("$(basename "$f" .hip)"); done
fi

result() { # STATUS NAME PROFILE [REASON [LOG]]
	local st=$1 name=$2 prof=$3 why=${4:-} log=${5:-}
	case $st in
	PASS) PASSED=$((PASSED + 1)) ;;
	FAIL) FAILED=$((FAILED + 1)) ;;
	SKIP) SKIPPED=$((SKIPPED + 1)) ;;
	esac
	printf '%-4s %-20s %-8s %s\n' "$st" "$name" "$prof" "$why"
	if [ "$st" = FAIL ] && [ -n "$log" ] && [ -f "$log" ]; then
		tail -n 25 "$log" | sed 's/^/     | /'
	fi
}

# The value of a "// hip-test: KEY ..." line of a source.
directive() { # FILE KEY
	sed -n "s|^// hip-test: $2 ||p" "$1" | head -n 1
}

# The GPUs profile PROFILE emulates (its [[gpus]] tables).
gpus_of() { # PROFILE
	grep -c '^\[\[gpus\]\]' "$top/rust/kfd-emu/profiles/$1.toml"
}

# Builds NAME for gfx908 and gfx90a; prints the binary's path, or fails (the compiler's log
# is build/hip/logs/NAME.build).
build() { # NAME
	hip_build "$here/$1.hip" "$out/$1" "$logs/$1.build"
}

# Runs BIN on PROFILE; the log goes to LOG. An expect-abort program must die with its text.
run_case() { # NAME PROFILE BIN LOG
	local name=$1 prof=$2 bin=$3 log=$4 abort rc
	abort=$(directive "$here/$name.hip" expect-abort)
	if [ -z "$abort" ]; then
		timeout -k 10 "$timeout_s" "$kfd_emu" run --profile "$prof" -- "$bin" >"$log" 2>&1
		rc=$?
		[ $rc -eq 0 ] && return 0
		echo "exit status $rc"
		return 1
	fi
	local after=$out/vector-add
	# shellcheck disable=SC2016 # expanded by the inner shell
	timeout -k 10 "$timeout_s" "$kfd_emu" run --profile "$prof" -- \
		sh -c '"$1"; echo "hip-test: exit status $?"; "$2"' sh "$bin" "$after" >"$log" 2>&1
	rc=$?
	if grep -q '^hip-test: exit status 0$' "$log"; then
		echo "it exited 0; expected to die with \"$abort\""
		return 1
	fi
	if ! grep -qF "$abort" "$log"; then
		echo "it died without \"$abort\""
		return 1
	fi
	if [ $rc -ne 0 ]; then
		echo "vector-add after it failed (exit status $rc): the emulator did not live on"
		return 1
	fi
	return 0
}

if [ "${1:-}" = --build ] && [ $# = 2 ]; then
	build "$2"
	exit
fi

if [ ! -x "$kfd_emu" ]; then
	echo "test/hip: $kfd_emu is missing: build it with 'make kfd-tools'" >&2
	exit 1
fi
if ! command -v hipcc >/dev/null; then
	echo "test/hip: hipcc is missing: scripts/install-deps.sh installs Debian's hipcc" >&2
	exit 1
fi

for prof in "${profiles[@]}"; do
	g=${gfx[$prof]:-}
	if [ -z "$g" ]; then
		for name in "${names[@]}"; do
			result SKIP "$name" "$prof" "no ISA HIP 5.2 and the shader engine share on $prof"
		done
		continue
	fi
	# vector-add runs after every expect-abort program: build it first.
	build vector-add >/dev/null
	for name in "${names[@]}"; do
		if [ ! -f "$here/$name.hip" ]; then
			result FAIL "$name" "$prof" "no test/hip/$name.hip"
			continue
		fi
		need=$(directive "$here/$name.hip" needs-gpus)
		if [ -n "$need" ] && [ "$(gpus_of "$prof")" -lt "$need" ]; then
			result SKIP "$name" "$prof" "needs $need GPUs, $prof has $(gpus_of "$prof")"
			continue
		fi
		isa=$(directive "$here/$name.hip" needs-isa)
		if [ -n "$isa" ] && [[ " $isa " != *" $g "* ]]; then
			result SKIP "$name" "$prof" "needs $isa, $prof is $g"
			continue
		fi
		log=$logs/$name-$prof.log
		if ! bin=$(build "$name"); then
			result FAIL "$name" "$prof" "hipcc failed" "$logs/$name.build"
			continue
		fi
		t0=$EPOCHREALTIME
		if why=$(run_case "$name" "$prof" "$bin" "$log"); then
			result PASS "$name" "$prof" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }')"
		else
			result FAIL "$name" "$prof" "$why (log: ${log#"$top"/})" "$log"
		fi
	done
done

summary="$PASSED passed, $FAILED failed"
[ $SKIPPED -gt 0 ] && summary+=", $SKIPPED skipped"
echo "$summary"
[ $FAILED -eq 0 ]
