#!/usr/bin/env bash
# The gfx9 shader engine's rate inside kfd-emu (`make bench`'s engine row; issue 26).
#
#   scripts/bench-engine.sh
#   env: CARGO_TARGET_DIR     where kfd-emu and gfx9's `rate` example were built (release)
#        ENGINE_BENCH         the HIP client (default build/engine-bench, test/rocm/engine-bench.c)
#        BENCH_ENGINE_SECS    seconds each kernel runs (default 3)
#
# Debian's HIP 5.2 loads test/hip's committed gfx908 code objects (rust/gfx9/tests/fixtures/hip)
# on an emulated MI100 and launches a VALU-heavy kernel (transcendental's f32_fns: seven libm
# functions per item) and a memory-heavy one (saxpy) again and again. kfd-emu's log line of
# each dispatch (KFD_EMU_LOG=debug) gives the wave instructions and lane operations it ran
# and the CPU time of the worker that ran it; their sums give the rates per core. The
# baseline, measured in the same run: the same kernel over the same items run in-process by
# gfx9's own launcher (`rate hip ...`: the engine alone, memory in a map of pages); the ratio
# is what running inside the emulator (its GPU VM, its scheduler) keeps of that rate.
# Target: 10 M wave instructions/s per core, printed as met or NOT met.
set -euo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$0")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$top/rust/target}
kfd_emu=$target_dir/release/kfd-emu
rate=$target_dir/release/examples/rate
client=${ENGINE_BENCH:-$top/build/engine-bench}
fixtures=$top/rust/gfx9/tests/fixtures/hip
secs=${BENCH_ENGINE_SECS:-3}
target_m=10

for f in "$kfd_emu" "$rate" "$client"; do
	[ -x "$f" ] || { echo "bench-engine: $f is missing (make bench builds it)" >&2; exit 1; }
done
scratch=$(mktemp -d /tmp/bench-engine.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# "INSTRUCTIONS LANES CPU_SECONDS" summed over kfd-emu's log lines of dispatches over N items.
emulated() { # KIND PROG N
	local kind=$1 prog=$2 n=$3 log=$scratch/$1.log
	if ! KFD_EMU_LOG=debug "$kfd_emu" run --profile mi100 -- \
		"$client" "$kind" "$fixtures/$prog-gfx908.co" "$n" "$secs" >"$log" 2>&1; then
		echo "bench-engine: $kind: the HIP client failed on kfd-emu:" >&2
		tail -n 20 "$log" >&2
		return 1
	fi
	sed -n "s/.*grid \[$n, 1, 1\] in groups of \[256, 1, 1\]: .*; \([0-9]*\) wave instructions, \([0-9]*\) lane operations in [0-9.]* s, \([0-9.]*\) s of CPU.*/\1 \2 \3/p" "$log" |
		awk '{ i += $1; l += $2; c += $3; k++ } END { if (k) print i, l, c; else exit 1 }' || {
		echo "bench-engine: $kind: kfd-emu logged no dispatch of $n items; its log ends:" >&2
		tail -n 20 "$log" >&2
		return 1
	}
}

# The same, in-process.
in_process() { # KIND N
	"$rate" hip "$1" gfx908 "$2" "$secs" |
		sed -n 's/.*(\([0-9]*\) instructions, \([0-9]*\) lane operations in \([0-9.]*\) s of CPU.*/\1 \2 \3/p'
}

row() { # KIND PROG N WHAT
	local kind=$1 prog=$2 n=$3 what=$4 i l c bi bc
	read -r i l c < <(emulated "$kind" "$prog" "$n") || return 1
	read -r bi _ bc < <(in_process "$kind" "$n") || return 1
	awk -v what="$what" -v i="$i" -v l="$l" -v c="$c" -v bi="$bi" -v bc="$bc" -v t="$target_m" 'BEGIN {
		r = i / c / 1e6; b = bi / bc / 1e6
		printf "  %s: %.1f M wave instructions/s, %.0f M lane operations/s per core: %d M target %s; %.2f of the engine in-process (%.1f M/s) in this run\n",
			what, r, l / c / 1e6, t, (r >= t ? "met" : "NOT met"), r / b, b
	}'
}

echo "gfx9 shader engine in kfd-emu (mi100, gfx908; Debian's HIP 5.2 launching test/hip's code objects for ${secs} s each; per CPU second of the engine's worker):"
row valu transcendental 65536 "VALU-heavy (transcendental f32_fns, 65536 items)"
row memory saxpy 1048576 "memory-heavy (saxpy, 1 Mi items)"
