#!/usr/bin/env bash
# Debian sid's ROCm 6.4 userspace, unchanged, in a chroot on kfd-emu speaking Linux 6.18's
# KFD (1.18) (issue 30).
#
#   usage: test/rocm64/run.sh [CASE...]   (as root; `make test-rocm64` runs it)
#          test/rocm64/run.sh --list
#   env:   CARGO_TARGET_DIR   where kfd-emu was built (default rust/target)
#          ROCM64_CHROOT, ROCM64_MIRROR   see test/rocm64/chroot.sh
#
# The chroot comes from test/rocm64/chroot.sh (built once, kept in build/rocm64/sid). When
# the Debian archive cannot be reached to build it, every case is counted as skipped with
# that reason. Programs run inside `kfd-emu run` with /dev, /sys and /proc bound into the
# chroot and, where ROCr must tell several GPUs apart, under `kfd-emu supervise` (libdrm's
# device identification needs the render nodes to stat as character devices).
#
# Cases:
#   rocminfo-P    rocminfo 7.2 on profile P lists the profile's GPU agents and their ISA
#   hsa-P         ROCr 6.4 (test/rocm/hsa-test.c built in the chroot): agents, pools, SDMA
#                 async copies host<->VRAM and GPU->GPU, every byte verified
# Each prints PASS, FAIL with the reason, or SKIP with the reason; the last line is
# exactly "N passed, M failed" (", K skipped" when some were). Non-zero exit on failure.
set -uo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$(realpath "$0")")" && pwd)
top=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
KFD_EMU=$target/kfd-emu
work=$top/build/rocm64/cases
. "$top/scripts/lib/workload.sh"

profiles=(mi100 mi100x2 mi210x4 mi250x8 mi300x8 rx9070xt)
declare -A gpus=([mi100]=1 [mi100x2]=2 [mi210x4]=4 [mi250x8]=8 [mi300x8]=8 [rx9070xt]=1)
declare -A cpus=([mi100]=1 [mi100x2]=1 [mi210x4]=2 [mi250x8]=4 [mi300x8]=2 [rx9070xt]=1)
declare -A gfx=([mi100]=gfx908 [mi100x2]=gfx908 [mi210x4]=gfx90a [mi250x8]=gfx90a [mi300x8]=gfx942 [rx9070xt]=gfx1201)
declare -A vram_gib=([mi100]=32 [mi100x2]=32 [mi210x4]=64 [mi250x8]=64 [mi300x8]=192 [rx9070xt]=16)

# Where ROCr 6.4 does not run on the emulated 6.18 kernel yet, by case, and why.
GFX90A_117="ROCr 6.4 on gfx90a with KFD >= 1.17 creates its host<->VRAM SDMA queues by engine id, and libhsakmt fails before the ioctl (\"Alloc VRAM memory failed size 4096\" for the queue's EOP buffer); the same copies pass with the profile at KFD 1.16 (case hsa-P-kfd1.16)"
declare -A limit=([hsa-mi210x4]=$GFX90A_117 [hsa-mi250x8]=$GFX90A_117)

cases() {
	local p
	for p in "${profiles[@]}"; do echo "rocminfo-$p"; done
	for p in "${profiles[@]}"; do echo "hsa-$p"; done
	echo hsa-mi210x4-kfd1.16 hsa-mi250x8-kfd1.16 | tr ' ' '\n'
}

# ---------------------------------------------------------------------------------------
# Inside an emulated host (run again by `kfd-emu run` with --in-host)

# The chroot's view of the host: /dev, /sys, /proc, and a /dev/shm of its own (a fresh host).
bind_host() {
	local d
	for d in dev sys proc; do
		mount --rbind "/$d" "$ROOT/$d" || return 1
	done
	mount -t tmpfs -o mode=1777,size=64m rocm64-shm "$ROOT/dev/shm"
}

in_host() { # ROOT SUPERVISE CMD...
	ROOT=$1
	local sup=$2
	shift 2
	bind_host || exit 1
	if [ "$sup" = 1 ]; then
		exec "$KFD_EMU" supervise -- chroot "$ROOT" "$@"
	fi
	exec chroot "$ROOT" "$@"
}

case ${1:-} in
--in-host) shift && in_host "$@" ;;
--list) cases && exit 0 ;;
esac

# ---------------------------------------------------------------------------------------
# The suite

PASSED=0 FAILED=0 SKIPPED=0
result() { # STATUS CASE [REASON]
	case $1 in PASS) PASSED=$((PASSED + 1)) ;; FAIL) FAILED=$((FAILED + 1)) ;; SKIP) SKIPPED=$((SKIPPED + 1)) ;; esac
	printf '%-4s  %-22s%s\n' "$1" "$2" "${3:+  $3}"
}

[ "$(id -u)" = 0 ] || { echo "test/rocm64/run.sh: must run as root" >&2; exit 1; }
[ -x "$KFD_EMU" ] || { echo "test/rocm64/run.sh: no kfd-emu at $KFD_EMU (make kfd-tools)" >&2; exit 1; }
want=("$@")
[ ${#want[@]} -gt 0 ] || mapfile -t want < <(cases)

t0=$(date +%s)
ROOT=$("$here/chroot.sh" 2>"$top/build/rocm64-chroot.err")
rc=$?
if [ "$rc" = 77 ]; then
	why=$(tail -n 1 "$top/build/rocm64-chroot.err")
	for c in "${want[@]}"; do result SKIP "$c" "${why#rocm64 chroot: }"; done
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	exit 0
elif [ "$rc" != 0 ]; then
	cat "$top/build/rocm64-chroot.err" >&2
	echo "0 passed, ${#want[@]} failed"
	exit 1
fi
echo "rocm64: chroot $ROOT ready in $(($(date +%s) - t0)) s"

# Test programs, built in the chroot against ROCr 6.4's headers.
build_programs() {
	local d=$ROOT/opt/criu-rocm-tests
	mkdir -p "$d/src"
	cp "$top/test/rocm/hsa-test.c" "$top/test/rocm/report.h" "$d/src/" &&
		chroot "$ROOT" sh -ec 'cd /opt/criu-rocm-tests/src
		gcc -std=gnu11 -O2 -Wall -o ../hsa-test hsa-test.c -lhsa-runtime64' >"$top/build/rocm64/programs.log" 2>&1
}
if ! build_programs; then
	for c in "${want[@]}"; do result FAIL "$c" "the test programs did not build in the chroot: $(tail -n 3 "$top/build/rocm64/programs.log" | paste -sd'|')"; done
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi

emu() { # LOG PROFILE [--profile-file F] SUPERVISE CMD...
	local log=$1 p=$2 pf=() sup
	shift 2
	if [ "$1" = --profile-file ]; then pf=(--profile-file "$2") && shift 2; fi
	sup=$1
	shift
	timeout 300 "$KFD_EMU" run --profile "$p" "${pf[@]}" -- "$here/run.sh" --in-host "$ROOT" "$sup" "$@" >"$log" 2>&1
}

run_rocminfo() { # PROFILE
	local p=$1 log=$work/rocminfo-$1.log n isa
	emu "$log" "$p" 1 rocminfo || { result FAIL "rocminfo-$p" "exit $?: $(tail -n 2 "$log" | paste -sd'|'); log ${log#"$top"/}"; return; }
	n=$(grep -c 'Device Type:.*GPU' "$log")
	isa=$(grep -c "Name:.*amdgcn-amd-amdhsa--${gfx[$p]}" "$log")
	if ! grep -q 'ROCk module is loaded' "$log" || [ "$n" != "${gpus[$p]}" ] || [ "$isa" -lt "${gpus[$p]}" ]; then
		result FAIL "rocminfo-$p" "$n GPU agents (want ${gpus[$p]}), $isa ${gfx[$p]} ISAs; log ${log#"$top"/}"
	else
		result PASS "rocminfo-$p" "ROCk module loaded, ${gpus[$p]} ${gfx[$p]} agents: $(grep -m1 -A2 'Device Type:.*GPU' "$log" >/dev/null; grep 'Marketing Name' "$log" | sed -n "$((cpus[$p] + 1))p" | sed 's/ *Marketing Name: *//; s/ *$//')"
	fi
}

run_hsa() { # CASE PROFILE [--profile-file F]
	local c=$1 p=$2 log=$work/$1.log n
	shift 2
	if [ -n "${limit[$c]:-}" ]; then
		result SKIP "$c" "${limit[$c]}"
		return
	fi
	emu "$log" "$p" "$@" 1 /opt/criu-rocm-tests/hsa-test --cpus "${cpus[$p]}" --gpus "${gpus[$p]}" \
		--gfx "${gfx[$p]}" --vram $((vram_gib[$p] << 30))
	n=$(sed -n 's/^hsa-test: \([0-9]*\) checks passed, 0 failed$/\1/p' "$log")
	if [ -z "$n" ]; then
		result FAIL "$c" "$(grep -m 3 '^FAIL ' "$log" | paste -sd'|'); log ${log#"$top"/}"
	else
		result PASS "$c" "$n checks, $(grep -c '^ok   host -> node [0-9]* -> host: all' "$log") host<->VRAM and $(grep -c '^ok   host -> node [0-9]* -> node' "$log") GPU->GPU SDMA copies verified"
	fi
}

mkdir -p "$work"
for c in "${want[@]}"; do
	case $c in
	rocminfo-*) run_rocminfo "${c#rocminfo-}" ;;
	hsa-*-kfd1.16)
		p=${c#hsa-} && p=${p%-kfd1.16}
		echo "kfd_minor_version = 16" >"$work/kfd1.16.toml"
		run_hsa "$c" "$p" --profile-file "$work/kfd1.16.toml"
		;;
	hsa-*) run_hsa "$c" "${c#hsa-}" ;;
	*) result FAIL "$c" "no such case (see --list)" ;;
	esac
done
echo "rocm64: $(($(date +%s) - t0)) s"
if [ "$SKIPPED" -gt 0 ]; then
	echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
else
	echo "$PASSED passed, $FAILED failed"
fi
[ "$FAILED" = 0 ]
