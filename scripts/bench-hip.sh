#!/usr/bin/env bash
# make bench, the HIP row (issue 27): criu-rocm's dump and restore of a whole HIP process on
# kfd-emu, against CRIU's own dump and restore of the same bytes of anonymous memory, in one
# run on this machine. It prints a table; it fails only when a step fails (or a process finds
# its memory or its kernel changed by the dump and restore), never on a slow result.
#
#   usage: scripts/bench-hip.sh        (as root, after `make`; `make bench` runs it, `make
#                                       bench-hip` runs it alone, in a minute or two)
#   env:   BENCH_HIP_MIB=N     MiB of device memory (and of anonymous memory) per process
#                              (default 256)
#          BENCH_HIP_RUNS=N    counted runs; each figure is the best of them (default 5)
#          BENCH_HIP_TIME_LIMIT=S  seconds the whole run may take (default 900)
#          BENCH_HIP_CRIU=PATH the criu-rocm binary to measure (default build/criu-rocm)
#
# Processes, on one emulated MI100 (kfd-emu profile mi100, KFD_EMU_LOG=info), each dumped by
# criu-rocm with -v4 --display-stats into build/bench-hip/img, restored (-d), made to check
# what it holds, and killed:
#   hip N    bench-hip N (scripts/bench-hip.hip, Debian's HIP 5.2): N MiB of VRAM (hipMalloc,
#            filled with a pattern) and one kernel in flight (2 workgroups of 256 work-items,
#            8 waves, computing with registers, LDS and barriers until told to stop): at the
#            dump kfd-emu saves its waves into the queue's context save area
#   hip 0    bench-hip 0: the same without the device memory (HIP's fixed cost with a kernel)
#   idle 0   bench-hip 0 --idle: HIP initialised, no allocation, no kernel, no queue
#   anon N   bench-anon N (scripts/bench-anon.c): N MiB of touched private anonymous memory
#   anon 0   bench-anon 0
# A run does them one after the other, in the order above in odd runs and reversed in even
# ones; a first run warms up and is not counted; kfd-emu is let go idle after each dump's
# kill (scripts/bench-cr.sh says why, for both).
#
# Rows, from the fastest of the counted runs of each figure:
#   whole     the commands' wall time of each kind; HIP N over anon N (no target: the
#             HIP process carries HIP's fixed cost, which the anonymous one has not)
#   marginal  (N - 0) of each, as MB/s: hip N less hip 0 against anon N less anon 0, the
#             cost of the device memory against CRIU's of the same bytes (target >= 1.0,
#             as bench-cr.sh's rows)
#   frozen    CRIU's "Frozen time" (--display-stats: freezing to the end of the dump)
#   fixed     hip 0 less anon 0: HIP's runtime state (queues, their save areas, ring
#             buffers, signals, the code objects, its threads) and the kernel's waves; hip 0
#             less idle 0: the queue and the waves alone. Its image: CRIU's memory pages, of
#             which the queues' context save areas (the pages of each area present in the
#             process before the dump: the area of every queue kfd-emu logged at CREATE_QUEUE,
#             read in /proc/PID/pagemap), and the GPU BOs' pages
set -euo pipefail
export LC_ALL=C

self=$(realpath "$0")
top=$(cd "$(dirname "$self")/.." && pwd)
# alive, file_line, json_num
# shellcheck source=SCRIPTDIR/lib/workload.sh
. "$top/scripts/lib/workload.sh"
# die, timed, log_line, stat_of, gpu_image_bytes, dump_proc, restore_proc, emu_ticks,
# settle, check_and_kill, in_turn
BENCH=bench-hip
# shellcheck source=SCRIPTDIR/lib/bench.sh
. "$top/scripts/lib/bench.sh"
# hip_build
# shellcheck source=SCRIPTDIR/../test/hip/build.sh
. "$top/test/hip/build.sh"
out=$top/build/bench-hip
img=$out/img
emu_log=$out/kfd-emu.log
criu=${BENCH_HIP_CRIU:-$top/build/criu-rocm}
kfd_emu=${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu
anon=$out/bench-anon
hip=$out/bench-hip
mib=${BENCH_HIP_MIB:-256}
runs=${BENCH_HIP_RUNS:-5}
time_limit=${BENCH_HIP_TIME_LIMIT:-900}

# ---------------------------------------------------------------------------------------
# Inside kfd-emu

# Starts a process of kind $1 (hip, idle or anon) holding $2 MiB as a child of this shell
# and sets PID once it is ready.
PID=
start_proc() {
	local kind=$1 size=$2 pid line
	: >"$out/proc.out"
	case $kind in
	hip) setsid "$hip" "$size" </dev/null >"$out/proc.out" 2>"$out/proc.err" & ;;
	idle) setsid "$hip" "$size" --idle </dev/null >"$out/proc.out" 2>"$out/proc.err" & ;;
	anon) setsid "$anon" "$size" </dev/null >"$out/proc.out" 2>"$out/proc.err" & ;;
	esac
	pid=$!
	line=$(log_line 1 "$pid" 300 "$out/proc.out") || die "$kind process ($size MiB) did not start"
	if [[ $line != '{"ready":true,'* ]] || [ "$(json_num "$line" pid)" != "$pid" ]; then
		die "$kind process (pid $pid): unexpected first line: $line"
	fi
	PID=$pid
}

# "queues area_bytes present_bytes" of process $1's compute queues: their context save
# areas as kfd-emu logged them at CREATE_QUEUE, and how many bytes of them are present in
# the process (/proc/PID/pagemap: present or swapped pages). Before the dump that is what
# HIP touched; in the restored process, what CRIU dumped and restored of them.
read -r -d '' AREAS <<'EOF' || true
import re, struct, sys
pid, log = sys.argv[1], sys.argv[2]
pat = re.compile(rf"kfd-emu: process {pid} GPU \S+ queue \d+ created: compute, .*context save area (0x[0-9a-f]+), (\d+) bytes")
areas = [(int(m[1], 16), int(m[2])) for m in map(pat.search, open(log, errors="replace")) if m]
page, present = 4096, 0
with open(f"/proc/{pid}/pagemap", "rb") as f:
    for addr, size in areas:
        f.seek(addr // page * 8)
        words = f.read((size + page - 1) // page * 8)
        present += sum(1 for (w,) in struct.iter_unpack("<Q", words) if w >> 62) * page
print(len(areas), sum(s for _, s in areas), present)
EOF
save_areas() { /usr/bin/python3 -c "$AREAS" "$1" "$emu_log"; }

# How many times kfd-emu saved the waves of a queue of process $1 so far.
waves_saved() {
	grep -acE "kfd-emu: process $1 queue [0-9]+ packet [0-9]+: [0-9]+ resident waves saved" "$emu_log" || true
}

# One dump/restore cycle of kind $1 with $2 MiB; appends to $out/hip.txt:
#   kind size run dump_us restore_us frozen_us cpu_bytes gpu_bytes queues area_bytes
#   present_bytes saved_queues restored_bytes
# (present_bytes: of the save areas before the dump; restored_bytes: after the restore)
cycle() {
	local kind=$1 size=$2 run=$3 pid dump_us restore_us frozen_us cpu gpu areas=(0 0 0) after=(0 0 0) saved
	start_proc "$kind" "$size"
	pid=$PID
	[ "$kind" = anon ] || read -r -a areas < <(save_areas "$pid")
	saved=$(waves_saved "$pid")
	dump_proc "$pid"
	settle
	saved=$(($(waves_saved "$pid") - saved))
	if [ "$kind" = hip ] && [ "$saved" -lt 1 ]; then
		die "the dump of $kind pid $pid saved the waves of no queue (its kernel was in flight; $emu_log)"
	fi
	read -r _ dump_us _ <"$out/dump.res"
	frozen_us=$(stat_of "$out/dump.stats" "Frozen time")
	[ "$frozen_us" -gt 0 ] || die "criu --display-stats gave no Frozen time ($out/dump.stats)"
	cpu=$(($(stat_of "$out/dump.stats" "Memory pages written") * $(getconf PAGESIZE)))
	gpu=$(gpu_image_bytes)
	restore_proc "$pid"
	read -r _ restore_us _ <"$out/restore.res"
	[ "$kind" = anon ] || read -r -a after < <(save_areas "$pid")
	check_and_kill "$pid" "$kind"
	mkdir -p "$out/logs"
	cp "$img/dump.log" "$out/logs/$kind$size-run$run-dump.log"
	cp "$img/restore.log" "$out/logs/$kind$size-run$run-restore.log"
	cp "$out/dump.stats" "$out/logs/$kind$size-run$run-dump.stats"
	echo "$kind $size $run $dump_us $restore_us $frozen_us $cpu $gpu ${areas[*]} $saved ${after[2]}" >>"$out/hip.txt"
}

in_emu() {
	local run k kinds=("hip $mib" "hip 0" "idle 0" "anon $mib" "anon 0")
	EMU_PID=$PPID
	# libhsakmt's files in a /dev/shm of this emulated host's own (test/hip-cr's hosts too).
	mount -t tmpfs -o mode=1777,size=64m bench-hip-shm /dev/shm || die "cannot mount a private /dev/shm"
	: >"$out/hip.txt"
	printf '  runs (each: dump, restore and check of a HIP process with %s MiB of VRAM and a kernel\n' "$mib"
	printf '  in flight, with the kernel alone, with neither; of %s MiB of anonymous memory, of none):\n' "$mib"
	printf '  warm-up'
	progress=1
	cycle hip "$mib" 0
	cycle anon "$mib" 0
	for ((run = 1; run <= runs; run++)); do
		printf ' %d' "$run"
		for k in $(in_turn "${#kinds[@]}" "$run"); do
			# shellcheck disable=SC2086 # "kind size"
			cycle ${kinds[k]} "$run"
		done
	done
	echo
	progress=
}

in_pidns() {
	# Signals from outside reach a namespace's init only through a handler.
	trap 'exit 130' INT TERM HUP
	# kfd-emu's log (and this script's failures inside it) go to $emu_log.
	KFD_EMU_LOG=info "$kfd_emu" run --profile mi100 -- "$self" _emu 2>"$emu_log"
}

# ---------------------------------------------------------------------------------------
# Outside: preflight, the programs, run, table

preflight() {
	local c missing=()
	[ "$(id -u)" = 0 ] || die "needs root: kfd-emu mounts FUSE nodes in a private mount namespace and criu needs CAP_SYS_ADMIN"
	for c in "$criu" "$kfd_emu"; do
		[ -x "$c" ] || die "$c is missing: run make (and the cargo build of make bench) first"
	done
	for c in cc hipcc unshare setsid timeout getconf /usr/bin/python3; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	[ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: run scripts/install-deps.sh once first"
	if ! [[ $mib =~ ^[0-9]+$ ]] || [ "$mib" -lt 16 ]; then
		die "BENCH_HIP_MIB=$mib: expected a number of MiB, at least 16"
	fi
	if ! [[ $runs =~ ^[0-9]+$ ]] || [ "$runs" -lt 1 ]; then
		die "BENCH_HIP_RUNS=$runs: expected a number, at least 1"
	fi
}

# The table, from the result lines of all counted runs: each figure the fastest run's.
read -r -d '' TABLE <<'EOF' || true
import sys

hip_txt, mib = sys.argv[1], int(sys.argv[2])
M = 1 << 20
rows = {}
for line in open(hip_txt):
    f = line.split()
    if f[2] == "0":
        continue  # the warm-up
    rows.setdefault((f[0], int(f[1])), []).append([int(x) for x in f[3:]])
runs = len(rows[("hip", mib)])


def best(kind, size, j):
    return min(r[j] for r in rows[(kind, size)])


DUMP, REST, FROZEN, CPU, GPU, QUEUES, AREA, PRESENT, SAVED, RESTORED = range(10)
ms = lambda kind, size, j: best(kind, size, j) / 1000
kinds = (("hip", mib, f"HIP, {mib} MiB VRAM + kernel"), ("hip", 0, "HIP, kernel only"),
         ("idle", 0, "HIP, idle (no queue)"), ("anon", mib, f"anonymous, {mib} MiB"), ("anon", 0, "anonymous, none"))
print(f"  HIP process (bench-hip, Debian's HIP 5.2) on one emulated MI100 against CRIU's dump and restore of")
print(f"  anonymous memory (bench-anon), best of {runs} run(s); whole commands, ms")
line = "  {:<32} {:>8} {:>8} {:>8}   {:>9} {:>9}"
print(line.format("", "dump", "restore", "frozen", "CPU pages", "GPU BOs"))
for kind, size, what in kinds:
    print(line.format(what, f"{ms(kind, size, DUMP):.0f}", f"{ms(kind, size, REST):.0f}",
                      f"{ms(kind, size, FROZEN):.0f}", f"{best(kind, size, CPU) / M:.1f} MiB",
                      f"{best(kind, size, GPU) / M:.1f} MiB"))
ratio = lambda j: ms("hip", mib, j) / ms("anon", mib, j)
print(f"  whole HIP process / anonymous, {mib} MiB: dump {ratio(DUMP):.2f}, restore {ratio(REST):.2f}, "
      f"frozen {ratio(FROZEN):.2f} (no target: HIP's fixed cost is in it)")
for what, j in (("dump", DUMP), ("restore", REST), ("frozen", FROZEN)):
    h = ms("hip", mib, j) - ms("hip", 0, j)
    a = ms("anon", mib, j) - ms("anon", 0, j)
    r = a / h if h > 0 else float("nan")
    print(f"  marginal {what:<8} {mib} MiB: HIP {h:.0f} ms ({mib * M / 1e3 / max(h, 1e-9):.0f} MB/s), "
          f"anonymous {a:.0f} ms; anon/HIP {r:.2f}, target >= 1.0: {'met' if r >= 1.0 else 'NOT met'}")
for what, j in (("dump", DUMP), ("restore", REST), ("frozen", FROZEN)):
    print(f"  fixed {what:<8} HIP - anonymous (none): {ms('hip', 0, j) - ms('anon', 0, j):.0f} ms, "
          f"of which the queue and its kernel's waves (kernel only - idle) "
          f"{ms('hip', 0, j) - ms('idle', 0, j):.0f} ms")
h0 = [r for r in rows[("hip", 0)]][0]
print(f"  HIP's image (kernel only): {best('hip', 0, CPU) / M:.1f} MiB of CPU pages (idle HIP "
      f"{best('idle', 0, CPU) / M:.1f}, anonymous none {best('anon', 0, CPU) / M:.1f}), of which "
      f"context save areas {h0[RESTORED] >> 10} KiB (restored; {h0[PRESENT] >> 10} KiB present "
      f"before the dump) of {h0[AREA] / M:.1f} MiB reserved in {h0[QUEUES]} compute queue(s); "
      f"{best('hip', 0, GPU) / M:.1f} MiB of GPU BOs; waves of {h0[SAVED]} queue(s) saved per dump")
EOF

main() {
	local rc t0
	preflight
	rm -rf "$out"
	mkdir -p "$out"
	cc -O2 -Wall -Werror -o "$anon" "$top/scripts/bench-anon.c" || die "compiling scripts/bench-anon.c failed"
	hip_build "$top/scripts/bench-hip.hip" "$hip" "$out/bench-hip.build" >/dev/null ||
		{ tail -n 20 "$out/bench-hip.build" >&2; die "building scripts/bench-hip.hip failed"; }
	echo "HIP checkpoint/restore bench: criu-rocm on kfd-emu (mi100), logs in ${out#"$top"/}/"
	t0=${EPOCHREALTIME/./}
	rc=0
	timeout --foreground -k 10 "$time_limit" \
		unshare --pid --fork --mount-proc --kill-child "$self" _pidns || rc=$?
	if [ "$rc" != 0 ]; then
		grep -a "^$BENCH: FAIL: " "$emu_log" >&2 || tail -n 20 "$emu_log" >&2
		case $rc in
		124 | 137) die "the bench did not finish within $time_limit s; logs in ${out#"$top"/}/" ;;
		*) die "the bench failed (exit $rc); logs in ${out#"$top"/}/" ;;
		esac
	fi
	/usr/bin/python3 -c "$TABLE" "$out/hip.txt" "$mib"
	echo "  raw numbers: ${out#"$top"/}/hip.txt; criu logs: ${out#"$top"/}/logs/; kfd-emu's: ${out#"$top"/}/kfd-emu.log"
	echo "  took $(((${EPOCHREALTIME/./} - t0) / 1000000)) s"
}

case ${1:-} in
_pidns) in_pidns ;;
_emu) in_emu ;;
"") main ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) die "unknown argument $1; usage: scripts/bench-hip.sh" ;;
esac
