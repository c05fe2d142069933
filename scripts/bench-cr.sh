#!/usr/bin/env bash
# make bench, part 2: GPU checkpoint/restore throughput and dump memory, on kfd-emu
# (the benchmarks of issues #4 and #5).
#
# In one run on this machine, compares criu-rocm's dump and restore of GPU buffer objects
# with CRIU's own dump and restore of the same number of bytes of anonymous memory, and
# measures criu-rocm's peak RSS while it dumps 4x KFD_MAX_BUFFER_SIZE of VRAM. It prints a
# table; it fails only when a step fails (or a process finds its memory changed by the
# dump and restore), never on a slow result.
#
#   usage: scripts/bench-cr.sh        (as root, after `make`; `make bench` runs it)
#   env:   BENCH_CR_MIB=N      MiB per process in the throughput runs (default 256)
#          BENCH_CR_RUNS=N     counted runs; each figure is the best of them (default 10: one
#                              run's restore time varies by about 10% on a shared machine)
#          BENCH_CR_LARGE_MIB=N   MiB per process of the second throughput table (default 1024;
#                              0 leaves it out)
#          BENCH_CR_LARGE_RUNS=N  its counted runs (default 5)
#          BENCH_CR_STAGING=S  KFD_MAX_BUFFER_SIZE of the RSS runs (default 32M; the VRAM
#                              dumped is 4x this)
#          BENCH_CR_TIME_LIMIT=S  seconds the whole run may take (default 900); a run it ends prints
#                              the tables it measured before, says which it did not, and fails
#          BENCH_CR_CRIU=PATH  the criu-rocm binary to measure (default build/criu-rocm)
#          BENCH_CR_ONLY=incr  only the incremental dump (the "incr" row below, a few seconds):
#                              no throughput runs, RSS, sparse or compression rows
#          BENCH_CR_ONLY=scale only the scale table (the "scale" rows below, about two minutes)
#          BENCH_CR_SCALE_BOS="N ..."   BO counts of the scale table (default 1000 4000 16000
#                              32000; its 16k/4k ratio needs 4000 and 16000)
#          BENCH_CR_SCALE_VMAS="N ..."  VMA counts of the scale table (default 1000 16000 60000)
#          BENCH_CR_SCALE_RUNS=N        its runs, each figure the best of them (default 2)
#
# Processes, on one emulated MI100 (kfd-emu profile mi100), each dumped by criu-rocm with
# the same flags (-v4 --display-stats) into the same image directory, build/bench-cr/img:
#   gpu N    gpu-workload --mib N --bos 4: N MiB of BOs (half VRAM, half GTT), SDMA running
#   gpu 0    gpu-workload --mib 1 --bos 4: the same program with 1 MiB of BOs
#   big N    gpu-workload --mib N --bos 1: N MiB in one BO (the copy threads share it out
#            in pieces of hash extents); its rows use gpu 0 as the fixed cost
#   both N   gpu-workload --mib N --bos 4 --host-mib N: N MiB of BOs and N MiB of host
#            memory, as a training job holds both; its row divides the restores of gpu N
#            and anon N by its own (marginal times): 1.0 if the two kinds of memory were
#            restored one after the other, above 1.0 as criu-rocm's GPU memory writer
#            copies while CRIU's restorer reads the CPU memory in
#   sdma N   as gpu N, dumped and restored with CRIU_ROCM_COPY_ENGINE=sdma under
#            `kfd-emu supervise` (KFD hands out dma-bufs, the render nodes run the copies'
#            CS): the emulator's SDMA engine, a daemon thread copying with the CPU; its row
#            is the emulator's numbers, not a GPU's
#   anon N   bench-anon N (scripts/bench-anon.c): N MiB of touched private anonymous memory
#   anon 0   bench-anon 0: the same program with none
#   zero N   gpu-workload --mib 1 --bos 1 --big-bo-mib N --big-bo-fill zero (N = 1024, and
#            0 for none), once after the runs: the disk blocks of its pages file
#            (st_blocks*512), the zero BO's being the difference, target <= 1 MiB
#   fill-F N gpu-workload --mib 1 --bos 1 --big-bo-mib N --big-bo-fill F, F = fp16 (weight-like
#            fp16 values), pattern (the workload's incompressible pattern) and sparse (zeros but
#            a dword per MiB), dumped with KFD_COMPRESS=none and =zstd (level 3, default
#            threads) in turn, twice, after the runs: the pages files' bytes (st_size) and the
#            whole dump and restore times, compressed over uncompressed (best of the two)
#   incr     gpu-workload --mib 1 --bos 1 --big-bo-mib 1024 --change-every 20 (issue 17's
#            row: 1 GiB of VRAM, 5 % of its 2 MiB extents changed since a pre-dump), once after
#            the runs: pre-dumped (the GPU paused only for its ioctls: the log's time), then one
#            2 MiB block of its big BO in 20 rewritten (SIGUSR2), dumped whole and dumped
#            incrementally (--prev-images-dir ../pre), both with --leave-running, killed,
#            restored from the latter and checked: the incremental dump's pages on disk (target
#            <= 0.1 of the full dump's) and frozen time (target <= 0.5 of the full dump's), and
#            its wall time. Both frozen times are the window the process sees frozen (freeze to
#            thaw): a dump that kills it would count its death too (CRIU waits for it before it
#            stops the clock; in kfd-emu about 60 ms for the 1 GiB mapping torn down), which
#            the full dump, left running, does not
#   large    gpu, big and anon at BENCH_CR_LARGE_MIB, after the runs: the same throughput
#            rows at that size (their fixed costs are gpu 0 and anon 0 of the runs)
#   scale    how dump and restore grow with the number of BOs and of VMAs of one process
#            (issue 25: every step linear or n log n), after the rest: gpu-workload --mib 1
#            --bos 1 --small-bos N (N more 4 KiB BOs, half VRAM and half GTT, each mapped
#            by the process: a BO, a VMA and a mapping's lookup apiece) and gpu-workload
#            --mib 1 --bos 1 --vmas N (N one-page anonymous VMAs), each dumped, restored and
#            checked; the whole commands' wall time, per item, and kfd-emu's share: its CPU
#            time (utime + stime from /proc) during the command. The emulator's work is not
#            the product's (on hardware KFD does it), so it is shown apart; the restore's
#            16k/4k BO ratio has the target <= 4.5 (4 for linear, and room for n log n)
# Each is started, dumped (criu kills it), restored (-d), made to check every byte of its
# memory, and killed. A run does them one after the other, odd runs in the order of
# in_emu's lists and even runs in the reverse order (the RSS runs after them, in a fixed
# order); a first run warms up and is not counted.
#
# Two things on this machine kind decide a step's time without being part of it, so the
# bench holds them equal for every kind:
#   - Teardown. A killed process' anonymous memory is freed before its pid goes; a GPU
#     process' memory is freed by KFD's release afterwards (on hardware a work item; in
#     kfd-emu, punching its memfd pages: about 0.15 s of CPU for 1 GiB, which the restore
#     of 1 GiB used to wait for: 0.94-0.96 of CRIU). So after the dump's kill the bench
#     waits until kfd-emu has been idle for 0.1 s, whatever the kind, before the restore.
#   - Host memory. The VM gives freed memory back to its host (free page reporting), and a
#     write to such memory is slow: 1 GiB written into the page cache took 1.49 s from it
#     and 0.26 s from memory a file had just given back. Which memory a dump's pages file
#     gets depends on what the step before freed, which is why the order alternates: with
#     one fixed order the 1 GiB one-BO GPU dump, always after the anonymous one, measured
#     0.75-0.81 of CRIU and 1.1-1.2 after another GPU dump. (Waiting for kfd-emu after the
#     check's kill too left more of the memory cold: the 256 MiB one-BO dump fell to 0.98.)
#     A GPU dump right after the anonymous process' cycle still often gets such memory
#     (1 GiB: 1.4-2.2 s against 0.6-0.7 s), CRIU's dump after a GPU cycle has not been
#     seen to (0.68-0.71 s); why is not known. Hence 5 runs at the large size, not 3.
#
# Frozen time: CRIU's "Frozen time" of each dump (--display-stats: from freezing the process
# to the end of the dump, the downtime of a checkpoint), marginal as below; its ratio is
# anonymous over GPU, so that >= 1.0 means the GPU memory keeps the process frozen no longer.
#
# Throughput, in MB/s (10^6 bytes/s), two ways:
#   in-tool   bytes over the time the tool itself reports for moving them: for GPU BOs the
#             "amdgpu: ... saved|restored N BO(s), ... in T ms" log line (all BO contents
#             streamed between the GPU and the pages file, hashed on the way); for anonymous
#             memory CRIU's counters (--display-stats: "Memory pages written" over "Memory
#             dump time", which in a dump includes the writing). Dump only for anonymous
#             memory: CRIU has no timer around its restore of memory (the restorer reads it).
#   marginal  whole commands: (bytes(N) - bytes(0)) / (wall(N) - wall(0)), so that freezing,
#             the parasite, the GPU ioctls, page-table work and restore forking are counted
#             and a process' fixed cost is not.  The "1 BO" rows are marginal too.
# Each time is the fastest of the counted runs (the other users of this machine can only
# slow a run down); ratio = GPU BOs / anonymous memory, target >= 1.0.
#
# Peak RSS: every dump of that part runs with KFD_MAX_BUFFER_SIZE=$BENCH_CR_STAGING.
# criu-rocm's peak RSS (wait4's ru_maxrss) while dumping gpu-workload --mib 4S --bos 1 (4x
# the staging size of VRAM, in one BO, so the copy engine must window it) against the same
# dump of bench-anon 0 (a process with no GPU memory; CRIU moves a process' CPU pages
# through pipes, not through its own RSS, so the process' size does not matter). The bound
# is KFD_MAX_BUFFER_SIZE + 8 MiB: the budget covers every GPU's and lane's mapping window,
# SDMA staging and pages-file write buffer; the 8 MiB is for what the dump holds besides:
# its threads' stacks and malloc arenas, the KFD image (a few hundred bytes per BO, so
# under 1 MiB for thousands of BOs) and, on hardware, the SDMA engine's command buffers.
# Measured on the emulator, the extra over the budget is about 0.1 MiB.
# The same on 8 GPUs, once, in a second emulator (profile mi300x8): gpu-workload --mib 128
# --bos 2 (1 GiB of BOs of 64 MiB) against bench-anon 0, KFD_MAX_BUFFER_SIZE unset (the
# default budget, 64 MiB, for the whole dump: 8 MiB a GPU).
set -euo pipefail
export LC_ALL=C

self=$(realpath "$0")
top=$(cd "$(dirname "$self")/.." && pwd)
# alive, file_line, json_num
# shellcheck source=SCRIPTDIR/lib/workload.sh
. "$top/scripts/lib/workload.sh"
# die, timed, log_line, criu_errors, stat_of, gpu_image_bytes, dump_proc, restore_proc,
# emu_ticks, settle, check_and_kill, in_turn
BENCH=bench-cr
# shellcheck source=SCRIPTDIR/lib/bench.sh
. "$top/scripts/lib/bench.sh"
out=$top/build/bench-cr
img=$out/img
criu=${BENCH_CR_CRIU:-$top/build/criu-rocm}
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
kfd_emu=$target/kfd-emu
workload=$target/gpu-workload
anon=$out/bench-anon
profile=mi100
mib=${BENCH_CR_MIB:-256}
runs=${BENCH_CR_RUNS:-10}
large=${BENCH_CR_LARGE_MIB:-1024}
large_runs=${BENCH_CR_LARGE_RUNS:-5}
staging=${BENCH_CR_STAGING:-32M}
time_limit=${BENCH_CR_TIME_LIMIT:-900}
only=${BENCH_CR_ONLY:-}
scale_bos=${BENCH_CR_SCALE_BOS:-1000 4000 16000 32000}
scale_vmas=${BENCH_CR_SCALE_VMAS:-1000 16000 60000}
scale_runs=${BENCH_CR_SCALE_RUNS:-2}
# The incremental row (issue 17): a BO of this many MiB of VRAM, one 2 MiB block in this many
# rewritten after the pre-dump.
incr_mib=1024
incr_every=20
# The allowance over KFD_MAX_BUFFER_SIZE in the RSS bound (see the top).
rss_const_mib=8

# Bytes of a size in KFD_MAX_BUFFER_SIZE syntax (number, optional K/k, M or G).
size_bytes() {
	local n=${1%[kKMG]} s=1
	[[ $n =~ ^[0-9]+$ ]] || die "BENCH_CR_STAGING=$1: expected a number with an optional K, M or G"
	case $1 in
	*[kK]) s=$((1 << 10)) ;;
	*M) s=$((1 << 20)) ;;
	*G) s=$((1 << 30)) ;;
	esac
	echo $((n * s))
}

# The copy time in microseconds of the "amdgpu: ... saved|restored ... in T ms" lines of log
# $1 (the slowest GPU: workers run in parallel; 0 when none).
gpu_copy_us() {
	sed -nE "s/.*amdgpu: pid [0-9]+: GPU .*: $2 [0-9]+ BO\(s\), .* in ([0-9.]+) ms .*/\1/p" "$1" |
		awk '{ us = $1 * 1000; if (us > m) m = us } END { printf "%d\n", m }'
}

# ---------------------------------------------------------------------------------------
# Inside kfd-emu

# Starts a process of kind $1 ("gpu" or "anon") holding $2 MiB (gpu-workload: in $3 BOs,
# default 4) as a child of this shell and sets PID once it is ready.
PID=
start_proc() {
	local kind=$1 size=$2 bos=${3:-4} log=$out/proc.out pid line
	: >"$log"
	local host=()
	[ "$kind" = big ] && bos=1
	[ "$kind" = both ] && host=(--host-mib "$size")
	if [ "$kind" = zero ]; then
		# 1 MiB of pattern in one BO, and a BO of $size MiB of zeros (none for 0).
		size=1 bos=1
		[ "$2" -gt 0 ] && host=(--big-bo-mib "$2" --big-bo-fill zero)
	fi
	if [[ $kind == fill-* ]]; then
		host=(--big-bo-mib "$size" --big-bo-fill "${kind#fill-}")
		size=1 bos=1
	fi
	# The scale table's processes: $size more BOs, or VMAs.
	case $kind in
	bos) host=(--small-bos "$size") size=1 bos=1 ;;
	vmas) host=(--vmas "$size") size=1 bos=1 ;;
	esac
	if [ "$kind" != anon ]; then
		setsid "$workload" --mib "$((size > 0 ? size : 1))" --bos "$bos" --interval-ms 10 "${host[@]}" \
			</dev/null >"$log" 2>"$out/proc.err" &
	else
		setsid "$anon" "$size" </dev/null >"$log" 2>"$out/proc.err" &
	fi
	pid=$!
	line=$(log_line 1 "$pid" 120 "$log") || die "$kind process ($size MiB) did not start"
	if [[ $line != '{"ready":true,'* ]] || [ "$(json_num "$line" pid)" != "$pid" ]; then
		die "$kind process (pid $pid): unexpected first line: $line"
	fi
	PID=$pid
}

# One dump/restore cycle of kind $1 with $2 MiB; appends a result line to $out/tp.txt:
#   kind size run dump_wall_us restore_wall_us bytes tool_us restore_tool_us frozen_us
# (frozen_us: CRIU's "Frozen time", from freezing the process to the end of the dump).
tp_cycle() {
	local kind=$1 size=$2 run=$3 pid dump_us restore_us bytes tool_us rtool_us frozen_us
	start_proc "$kind" "$size"
	pid=$PID
	WRAP=()
	[ "$kind" = sdma ] && WRAP=(CRIU_ROCM_COPY_ENGINE=sdma "$kfd_emu" supervise --)
	dump_proc "$pid"
	settle
	read -r _ dump_us _ <"$out/dump.res"
	frozen_us=$(stat_of "$out/dump.stats" "Frozen time")
	[ "$frozen_us" -gt 0 ] || die "criu --display-stats gave no Frozen time ($out/dump.stats)"
	if [ "$kind" != anon ]; then
		bytes=$(gpu_image_bytes)
		tool_us=$(gpu_copy_us "$img/dump.log" saved)
		[ "$tool_us" -gt 0 ] || die "no 'amdgpu: ... saved' line in the dump log ($img/dump.log)"
	else
		bytes=$(($(stat_of "$out/dump.stats" "Memory pages written") * $(getconf PAGESIZE)))
		# In a dump (not a pre-dump) CRIU writes the pages inside its memory dump timer, so
		# "Memory dump time" is the whole of it ("Memory write time" is a part of it).
		tool_us=$(stat_of "$out/dump.stats" "Memory dump time")
		[ "$bytes" -gt 0 ] || die "criu --display-stats wrote no memory counters ($out/dump.stats)"
	fi
	restore_proc "$pid"
	WRAP=()
	read -r _ restore_us _ <"$out/restore.res"
	rtool_us=0
	[ "$kind" != anon ] && rtool_us=$(gpu_copy_us "$img/restore.log" restored)
	if [ "$kind" = sdma ]; then
		if ! grep -qE "saved [0-9]+ BO\(s\).*; 0 by CPU, [1-9][0-9]* by SDMA\)" "$img/dump.log" ||
			! grep -qE "restored [0-9]+ BO\(s\).*; 0 by CPU, [1-9][0-9]* by SDMA\)" "$img/restore.log"; then
			die "the sdma run did not move every BO by SDMA (logs: $img/dump.log, restore.log)"
		fi
	fi
	check_and_kill "$pid" "$kind"
	mkdir -p "$out/logs"
	cp "$img/dump.log" "$out/logs/$kind$size-run$run-dump.log"
	cp "$img/restore.log" "$out/logs/$kind$size-run$run-restore.log"
	cp "$out/dump.stats" "$out/logs/$kind$size-run$run-dump.stats"
	cp "$out/restore.stats" "$out/logs/$kind$size-run$run-restore.stats"
	echo "$kind $size $run $dump_us $restore_us $bytes $tool_us $rtool_us $frozen_us" >>"$out/tp.txt"
}

# Peak RSS of criu-rocm dumping kind $1 with $2 MiB (gpu: in one BO) under
# KFD_MAX_BUFFER_SIZE=$staging; appends "kind size run maxrss_kib bytes" to $out/rss.txt.
rss_cycle() {
	local kind=$1 size=$2 run=$3 pid rss bytes=0
	start_proc "$kind" "$size" 1
	pid=$PID
	dump_proc "$pid" KFD_MAX_BUFFER_SIZE="$staging"
	read -r _ _ rss <"$out/dump.res"
	[ "$kind" = gpu ] && bytes=$(gpu_image_bytes)
	mkdir -p "$out/logs"
	cp "$img/dump.log" "$out/logs/rss-$kind$size-run$run-dump.log"
	echo "$kind $size $run $rss $bytes" >>"$out/rss.txt"
}

# Disk use of a sparse pages file: dumps (and restores and checks) the same process with
# and without a BO of $1 MiB of zeros; appends "size logical_bytes disk_bytes" of each
# dump's pages files to $out/sparse.txt.
sparse_cycle() {
	local size pid f logical disk
	for size in 0 "$1"; do
		start_proc zero "$size"
		pid=$PID
		dump_proc "$pid"
		logical=0 disk=0
		for f in "$img"/amdgpu-pages-*.img; do
			logical=$((logical + $(stat -c %s "$f")))
			disk=$((disk + $(stat -c '%b * %B' "$f")))
		done
		restore_proc "$pid"
		check_and_kill "$pid" zero
		echo "$size $logical $disk" >>"$out/sparse.txt"
	done
}

# Compression: dumps (and restores and checks) a BO of $1 MiB of each kind of data without
# and with KFD_COMPRESS=zstd, twice; appends "fill mode run dump_us restore_us bytes" to
# $out/zstd.txt (bytes: the pages files' st_size).
zstd_cycle() {
	local run fill mode pid dump_us restore_us bytes f
	for run in 1 2; do
		for fill in fp16 pattern sparse; do
			for mode in none zstd; do
				start_proc "fill-$fill" "$1"
				pid=$PID
				dump_proc "$pid" KFD_COMPRESS="$mode"
				read -r _ dump_us _ <"$out/dump.res"
				bytes=0
				for f in "$img"/amdgpu-pages-*.img; do bytes=$((bytes + $(stat -c %s "$f"))); done
				restore_proc "$pid"
				read -r _ restore_us _ <"$out/restore.res"
				check_and_kill "$pid" "fill-$fill"
				mkdir -p "$out/logs"
				cp "$img/dump.log" "$out/logs/zstd-$fill-$mode-run$run-dump.log"
				cp "$img/restore.log" "$out/logs/zstd-$fill-$mode-run$run-restore.log"
				echo "$fill $mode $run $dump_us $restore_us $bytes" >>"$out/zstd.txt"
			done
		done
	done
}

# Pre-dump, change one 2 MiB block in $2, full and incremental dump of an N MiB BO ($1),
# restore of the latter and check; appends "size every pause_ms full_wall_us full_frozen_us
# full_disk incr_wall_us incr_frozen_us incr_disk" to $out/incr.txt.
incr_cycle() {
	local size=$1 every=$2 pid pre=$out/pre full=$out/full img=$out/incr pause_ms fw ff fd iw if_ id n i status
	setsid "$workload" --mib 1 --bos 1 --big-bo-mib "$size" --change-every "$every" --interval-ms 10 \
		</dev/null >"$out/proc.out" 2>"$out/proc.err" &
	pid=$!
	log_line 1 "$pid" 120 "$out/proc.out" >/dev/null || die "incr process ($size MiB) did not start"
	rm -rf "$pre" "$full" "$img" && mkdir -p "$pre" "$full" "$img"
	"$criu" pre-dump -t "$pid" -D "$pre" -o pre-dump.log -v4 >/dev/null 2>&1 ||
		{ criu_errors "$pre/pre-dump.log"; die "criu-rocm pre-dump -t $pid failed"; }
	pause_ms=$(sed -nE "s/.*GPU queues unpaused after ([0-9.]+) ms paused.*/\1/p" "$pre/pre-dump.log" | head -n 1)
	[ -n "$pause_ms" ] || die "the pre-dump log does not say how long the GPU was paused ($pre/pre-dump.log)"
	n=$(grep -c '"changed":true' "$out/proc.out" || true)
	kill -USR2 "$pid"
	for ((i = 0; i < 600; i++)); do
		[ "$(grep -c '"changed":true' "$out/proc.out" || true)" -gt "$n" ] && break
		sleep 0.05
	done
	[ "$(grep -c '"changed":true' "$out/proc.out" || true)" -gt "$n" ] || die "gpu-workload did not change its BO after SIGUSR2"
	timed "$out/full.res" "$out/full.stats" "$criu" dump -t "$pid" -D "$full" -o dump.log -v4 \
		--display-stats --leave-running
	read -r status fw _ <"$out/full.res"
	[ "$status" = 0 ] || { criu_errors "$full/dump.log"; die "the full dump of pid $pid failed"; }
	ff=$(stat_of "$out/full.stats" "Frozen time")
	fd=$(du -B1 -c "$full"/amdgpu-pages-*.img | tail -n 1 | cut -f1)
	{
		timed "$out/incr.res" "$out/incr.stats" "$criu" dump -t "$pid" -D "$img" -o dump.log -v4 \
			--display-stats --prev-images-dir ../pre --leave-running
	} 2>"$out/dump.err"
	read -r status iw _ <"$out/incr.res"
	[ "$status" = 0 ] || { criu_errors "$img/dump.log"; die "the incremental dump of pid $pid failed"; }
	alive "$pid" || die "pid $pid did not run on after its incremental dump with --leave-running"
	kill -KILL "$pid"
	status=0
	wait "$pid" 2>/dev/null || status=$?
	[ "$status" = 137 ] || die "pid $pid exited with status $status, not killed after its dumps"
	grep -q "incremental GPU dump against parent/" "$img/dump.log" ||
		die "the dump with --prev-images-dir did not use its parent ($img/dump.log)"
	if_=$(stat_of "$out/incr.stats" "Frozen time")
	id=$(du -B1 -c "$img"/amdgpu-pages-*.img | tail -n 1 | cut -f1)
	restore_proc "$pid"
	# Lines: ready, changed, then the verification.
	check_and_kill "$pid" incr 3
	mkdir -p "$out/logs"
	cp "$pre/pre-dump.log" "$out/logs/incr-pre-dump.log"
	cp "$full/dump.log" "$out/logs/incr-full-dump.log"
	cp "$img/dump.log" "$out/logs/incr-dump.log"
	echo "$size $every $pause_ms $fw $ff $fd $iw $if_ $id" >>"$out/incr.txt"
}

# One dump/restore cycle of a process with $2 more BOs or VMAs (kind $1: bos or vmas); appends
# "kind n run dump_us dump_emu_ticks restore_us restore_emu_ticks" to $out/scale.txt.
scale_cycle() {
	local kind=$1 n=$2 run=$3 pid e0 e1 e2 e3 dump_us restore_us
	start_proc "$kind" "$n"
	pid=$PID
	e0=$(emu_ticks)
	dump_proc "$pid"
	e1=$(emu_ticks)
	settle
	e2=$(emu_ticks)
	restore_proc "$pid"
	e3=$(emu_ticks)
	read -r _ dump_us _ <"$out/dump.res"
	read -r _ restore_us _ <"$out/restore.res"
	check_and_kill "$pid" "$kind"
	settle
	mkdir -p "$out/logs"
	cp "$img/dump.log" "$out/logs/scale-$kind$n-run$run-dump.log"
	cp "$img/restore.log" "$out/logs/scale-$kind$n-run$run-restore.log"
	echo "$kind $n $run $dump_us $((e1 - e0)) $restore_us $((e3 - e2))" >>"$out/scale.txt"
}

# The scale table's cycles: every BO and VMA count, $scale_runs times (alternating order).
scale_cycles() {
	local run k items=()
	for k in $scale_bos; do items+=("bos $k"); done
	for k in $scale_vmas; do items+=("vmas $k"); done
	for ((run = 1; run <= scale_runs; run++)); do
		printf ' %d' "$run"
		for k in $(in_turn "${#items[@]}" "$run"); do
			# shellcheck disable=SC2086 # "kind n"
			scale_cycle ${items[k]} "$run"
		done
	done
}

in_emu() {
	local run vram_mib
	EMU_PID=$PPID
	vram_mib=$((4 * $(size_bytes "$staging") >> 20))
	: >"$out/tp.txt"
	: >"$out/rss.txt"
	: >"$out/sparse.txt"
	: >"$out/zstd.txt"
	: >"$out/incr.txt"
	: >"$out/scale.txt"
	if [ "$only" = scale ]; then
		printf '  scale table only (BENCH_CR_ONLY=scale): runs'
		progress=1
		scale_cycles
		echo
		progress=
		return
	fi
	if [ "$only" = incr ]; then
		printf '  incremental dump only (BENCH_CR_ONLY=incr):'
		progress=1
		incr_cycle "$incr_mib" "$incr_every"
		echo
		progress=
		return
	fi
	# Run 0 warms up (the emulator, the page cache, the binaries) and is not counted.
	printf '  runs (each: dump, restore and check of %s MiB of GPU BOs in 4 BOs and in 1, of %s MiB\n' "$mib" "$mib"
	printf '  of anonymous memory, of neither, of the BOs by the SDMA engine; peak RSS of two dumps\n'
	printf '  with KFD_MAX_BUFFER_SIZE=%s):\n' "$staging"
	printf '  warm-up'
	progress=1
	tp_cycle gpu "$mib" 0
	tp_cycle anon "$mib" 0
	local kinds=("gpu $mib" "anon $mib" "gpu 0" "anon 0" "big $mib" "both $mib" "sdma $mib") k
	for ((run = 1; run <= runs; run++)); do
		printf ' %d' "$run"
		for k in $(in_turn "${#kinds[@]}" "$run"); do
			# shellcheck disable=SC2086 # "kind size"
			tp_cycle ${kinds[k]} "$run"
		done
		rss_cycle gpu "$vram_mib" "$run"
		rss_cycle anon 0 "$run"
	done
	if [ "$large" -gt 0 ] && [ "$large" != "$mib" ]; then
		printf ' %s-MiB' "$large"
		kinds=(gpu anon big)
		for ((run = 1; run <= large_runs; run++)); do
			printf ' %d' "$run"
			for k in $(in_turn "${#kinds[@]}" "$run"); do
				tp_cycle "${kinds[k]}" "$large" "$run"
			done
		done
	fi
	printf ' sparse'
	sparse_cycle 1024
	printf ' zstd'
	zstd_cycle "$mib"
	printf ' incremental'
	incr_cycle "$incr_mib" "$incr_every"
	printf ' scale'
	scale_cycles
	echo
	progress=
}

# On mi300x8: criu-rocm's peak RSS dumping gpu-workload --mib 128 --bos 2 on each of the 8
# GPUs (1 GiB of BOs of 64 MiB) under the default budget, and dumping bench-anon 0; appends
# "gpus kind maxrss_kib" of each to $out/rss8.txt.
in_emu8() {
	local pid rss
	: >"$out/rss8.txt"
	printf '  8 GPUs (mi300x8): peak RSS of a dump of 1 GiB of BOs'
	progress=1
	for kind in anon gpu; do
		if [ "$kind" = gpu ]; then
			setsid "$workload" --mib 128 --bos 2 --interval-ms 10 </dev/null >"$out/proc.out" 2>"$out/proc.err" &
		else
			setsid "$anon" 0 </dev/null >"$out/proc.out" 2>"$out/proc.err" &
		fi
		pid=$!
		log_line 1 "$pid" 120 "$out/proc.out" >/dev/null || die "$kind process on mi300x8 did not start"
		dump_proc "$pid" -u KFD_MAX_BUFFER_SIZE
		read -r _ _ rss <"$out/dump.res"
		[ "$kind" = gpu ] && [ "$(grep -ac 'amdgpu: pid .*: GPU 0x.*saved' "$img/dump.log")" != 8 ] &&
			die "the 8-GPU dump did not save 8 GPUs ($img/dump.log)"
		echo "8 $kind $rss" >>"$out/rss8.txt"
		mkdir -p "$out/logs"
		cp "$img/dump.log" "$out/logs/rss8-$kind-dump.log"
	done
	echo
	progress=
}

in_pidns() {
	# Signals from outside reach a namespace's init only through a handler.
	trap 'exit 130' INT TERM HUP
	# A failure inside has said what failed.
	"$kfd_emu" run --profile "$profile" -- "$self" _emu
	[ -n "$only" ] || "$kfd_emu" run --profile mi300x8 -- "$self" _emu8
}

# ---------------------------------------------------------------------------------------
# Outside: preflight, the baseline program, run, table

preflight() {
	local c missing=()
	[ "$(id -u)" = 0 ] || die "needs root: kfd-emu mounts FUSE nodes in a private mount namespace and criu needs CAP_SYS_ADMIN"
	for c in "$criu" "$kfd_emu" "$workload"; do
		[ -x "$c" ] || die "$c is missing: run make (and the cargo build of make bench) first"
	done
	for c in cc unshare setsid timeout getconf /usr/bin/python3; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	[ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: run scripts/install-deps.sh once first"
	if ! [[ $mib =~ ^[0-9]+$ ]] || [ "$mib" -lt 16 ]; then
		die "BENCH_CR_MIB=$mib: expected a number of MiB, at least 16"
	fi
	if ! [[ $runs =~ ^[0-9]+$ ]] || [ "$runs" -lt 1 ]; then
		die "BENCH_CR_RUNS=$runs: expected a number, at least 1"
	fi
	if ! [[ $large =~ ^[0-9]+$ ]] || { [ "$large" -gt 0 ] && [ "$large" -lt 16 ]; }; then
		die "BENCH_CR_LARGE_MIB=$large: expected 0 or a number of MiB, at least 16"
	fi
	if ! [[ $large_runs =~ ^[0-9]+$ ]] || [ "$large_runs" -lt 1 ]; then
		die "BENCH_CR_LARGE_RUNS=$large_runs: expected a number, at least 1"
	fi
	case $only in
	"" | incr | scale) ;;
	*) die "BENCH_CR_ONLY=$only: expected incr or scale (or unset: everything)" ;;
	esac
	local k
	for k in $scale_bos $scale_vmas; do
		[[ $k =~ ^[1-9][0-9]*$ ]] || die "BENCH_CR_SCALE_BOS/VMAS: $k is not a positive number"
	done
	if ! [[ $scale_runs =~ ^[0-9]+$ ]] || [ "$scale_runs" -lt 1 ]; then
		die "BENCH_CR_SCALE_RUNS=$scale_runs: expected a number, at least 1"
	fi
	if [ $(($(size_bytes "$staging") % $(getconf PAGESIZE))) != 0 ] || [ "$(size_bytes "$staging")" -lt $((1 << 20)) ]; then
		die "BENCH_CR_STAGING=$staging: expected a multiple of the page size, at least 1M"
	fi
}

# The table, from the result lines of all runs: for each quantity the best run (the fastest
# time), since the other users of this machine can only ever slow a run down.
read -r -d '' TABLE <<'EOF' || true
import contextlib, io, statistics, sys

tp, rss, mib, runs, staging, stg, const, sparse, rss8, zstd, incr, large, large_runs, only, scale, tck, partial = sys.argv[1:18]
mib, runs, stg, const = int(mib), int(runs), int(stg), int(const)
large, large_runs = int(large), int(large_runs)
M = 1 << 20


def incr_table():
    size, every, pause_ms, fw, ff, fd, iw, if_, id_ = open(incr).read().split()
    fw, ff, fd, iw, if_, id_ = (int(x) for x in (fw, ff, fd, iw, if_, id_))
    share = 100 / int(every)
    line = "  {:<24} {:>8} {:>8} {:>8}  {}"
    print()
    print(f"  incremental GPU dump: a {size} MiB VRAM BO pre-dumped, {share:g} % of its 2 MiB extents")
    print("  rewritten, dumped whole and with --prev-images-dir, both --leave-running (one run;")
    print("  then killed, restored from the incremental dump and checked)")
    print(f"  {'GPU queues paused by the pre-dump':<42} {float(pause_ms):8.3f} ms")
    print(line.format("", "full", "increm.", "inc/full", ""))
    verdict = lambda r, t: f"target <= {t}: " + ("met" if r <= t else "NOT met")
    print(line.format("GPU pages on disk, MiB", f"{fd / M:.1f}", f"{id_ / M:.1f}", f"{id_ / fd:.3f}",
          verdict(id_ / fd, 0.1)))
    print(line.format("frozen time, ms", f"{ff / 1000:.0f}", f"{if_ / 1000:.0f}", f"{if_ / ff:.2f}",
          verdict(if_ / ff, 0.5)))
    print(line.format("dump wall time, ms", f"{fw / 1000:.0f}", f"{iw / 1000:.0f}", f"{iw / fw:.2f}", ""))


def scale_table():
    best = {}
    for l in open(scale):
        kind, n, run, d_us, d_t, r_us, r_t = l.split()
        b = best.setdefault((kind, int(n)), [None] * 4)
        for j, v in enumerate((int(d_us) / 1e6, int(d_t) / int(tck), int(r_us) / 1e6, int(r_t) / int(tck))):
            b[j] = v if b[j] is None else min(b[j], v)
    if not best:
        raise ValueError("no scale run finished")
    runs_ = len({l.split()[2] for l in open(scale)})
    print()
    print(f"  scale: one process on one GPU (mi100), best of {runs_} run(s); whole commands, seconds;")
    print("  emu = kfd-emu's CPU time during the command (the emulator's share, KFD's work on hardware);")
    print("  us/item = (time - time of the previous row) / (items - its items)")
    row = "  {:<12} {:>8} {:>7} {:>8}   {:>8} {:>7} {:>8}"
    print(row.format("", "dump", "emu", "us/item", "restore", "emu", "us/item"))
    for kind, what in (("bos", "BOs"), ("vmas", "VMAs")):
        prev = None
        for n in sorted(k[1] for k in best if k[0] == kind):
            d, de, r, re_ = best[(kind, n)]
            per = lambda t, j: f"{(t - prev[1][j]) * 1e6 / (n - prev[0]):.0f}" if prev else "-"
            print(row.format(f"{n} {what}", f"{d:.2f}", f"{de:.2f}", per(d, 0), f"{r:.2f}", f"{re_:.2f}", per(r, 2)))
            prev = (n, (d, de, r, re_))
    if ("bos", 4000) in best and ("bos", 16000) in best:
        a, b = best[("bos", 4000)], best[("bos", 16000)]
        ratio = lambda j: b[j] / a[j] if a[j] > 0 else float("nan")
        met = lambda x: "met" if x <= 4.5 else "NOT met"
        print(f"  16k/4k BOs: dump {ratio(0):.2f} ({met(ratio(0))}), restore {ratio(2):.2f} ({met(ratio(2))}), "
              f"target <= 4.5; kfd-emu's CPU: dump {ratio(1):.2f}, restore {ratio(3):.2f}")


if only == "incr":
    incr_table()
    sys.exit(0)
if only == "scale":
    scale_table()
    sys.exit(0)

res = {}


def load_tp():
    for line in open(tp):
        k, size, run, dump_us, rest_us, nbytes, tool_us, rtool_us, frozen_us = line.split()
        res[(k, int(size), int(run))] = dict(
            dump=int(dump_us), rest=int(rest_us), bytes=int(nbytes), tool=int(tool_us), rtool=int(rtool_us),
            frozen=int(frozen_us),
        )
RUNS = range(1, runs + 1)


def best(k, size, field):
    """The shortest time in microseconds of `field` over the runs at `size`, and the bytes of
    that run."""
    n = large_runs if large > 0 and size == large and size != mib else runs
    r = min(range(1, n + 1), key=lambda r: res[(k, size, r)][field])
    return res[(k, size, r)][field], res[(k, size, r)]["bytes"]


def mbps(b, us):
    return b / us if b > 0 and us > 0 else None


def in_tool(k, field, size=mib):
    us, b = best(k, size, field)
    return mbps(b, us)


def marginal(k, field, zero=None, size=mib):
    (n_us, n_b), (z_us, z_b) = best(k, size, field), best(zero or k, 0, field)
    return mbps(n_b - z_b, n_us - z_us)


def fmt(x, f="{:.0f}"):
    return "n/a" if x is None else f.format(x)


line = "  {:<18} {:>9} {:>12} {:>6}  {}"


def throughput_rows(size):
    rows = []
    for name, g, a in (
        ("dump, in-tool", in_tool("gpu", "tool", size), in_tool("anon", "tool", size)),
        ("dump, marginal", marginal("gpu", "dump", size=size), marginal("anon", "dump", size=size)),
        ("restore, in-tool", in_tool("gpu", "rtool", size), "-"),
        ("restore, marginal", marginal("gpu", "rest", size=size), marginal("anon", "rest", size=size)),
        ("dump, 1 BO", marginal("big", "dump", "gpu", size), marginal("anon", "dump", size=size)),
        ("restore, 1 BO", marginal("big", "rest", "gpu", size), marginal("anon", "rest", size=size)),
    ):
        if a == "-":
            rows.append((name, fmt(g), "-", "", "(CRIU has no timer around its restore of memory)"))
            continue
        ratio = g / a if g is not None and a is not None else None
        verdict = "" if ratio is None else ("met" if ratio >= 1.0 else "NOT met")
        rows.append((name, fmt(g), fmt(a), fmt(ratio, "{:.2f}"), verdict))
    return rows



def throughput():
    load_tp()
    rows = throughput_rows(mib)


    def ms(k, size, field):
        return best(k, size, field)[0] / 1000


    print(f"  throughput: {mib} MiB per process, 1 GPU (mi100), best of {runs} run(s);")
    print("  MB/s = 10^6 bytes/s; ratio = GPU BOs / anonymous memory, target >= 1.0")
    print(line.format("MB/s", "GPU BOs", "anon memory", "ratio", ""))
    for r in rows:
        print(line.format(*r))
    # GPU and CPU memory in one process against the two apart: 1.0 when restored one after
    # the other.
    t_both = ms("both", mib, "rest") - ms("gpu", 0, "rest")
    t_apart = ms("gpu", mib, "rest") - ms("gpu", 0, "rest") + ms("anon", mib, "rest") - ms("anon", 0, "rest")
    print(line.format(
        "restore, GPU + CPU",
        f"{t_both:.0f} ms",
        f"{t_apart:.0f} ms",
        f"{t_apart / t_both:.2f}" if t_both > 0 else "n/a",
        f"({mib} MiB of each in one process / the two apart, marginal)",
    ))
    # How long the process stays frozen (CRIU's Frozen time: from freezing it to the end of
    # the dump), per MiB of memory beyond a process with none: the downtime of a checkpoint.
    f_gpu = ms("gpu", mib, "frozen") - ms("gpu", 0, "frozen")
    f_anon = ms("anon", mib, "frozen") - ms("anon", 0, "frozen")
    print(line.format(
        "frozen, marginal",
        f"{f_gpu:.0f} ms",
        f"{f_anon:.0f} ms",
        f"{f_anon / f_gpu:.2f}" if f_gpu > 0 else "n/a",
        f"(frozen time for {mib} MiB, N - none; ratio = anon / GPU, target >= 1.0)",
    ))
    print(line.format(
        "frozen ms N / 0",
        f"{ms('gpu', mib, 'frozen'):.0f} / {ms('gpu', 0, 'frozen'):.0f}",
        f"{ms('anon', mib, 'frozen'):.0f} / {ms('anon', 0, 'frozen'):.0f}",
        "", "(CRIU's Frozen time, N MiB / none)",
    ))
    for what, field in (("dump", "dump"), ("restore", "rest")):
        print(line.format(
            f"{what} ms N / 0",
            f"{ms('gpu', mib, field):.0f} / {ms('gpu', 0, field):.0f}",
            f"{ms('anon', mib, field):.0f} / {ms('anon', 0, field):.0f}",
            "", "(whole command, N MiB / none)",
        ))

    if large > 0 and large != mib:
        print()
        print(f"  throughput: {large} MiB per process, best of {large_runs} run(s); fixed costs from the runs above")
        print(line.format("MB/s", "GPU BOs", "anon memory", "ratio", ""))
        for r in throughput_rows(large):
            print(line.format(*r))
    print()
    print("  copy engines, GPU BOs in-tool MB/s: the CPU engine (maps the BOs) against the SDMA engine")
    print("  (dma-bufs, GEM_VA, CS; under kfd-emu supervise). The emulator's SDMA is a daemon thread")
    print("  copying with the CPU: these are the emulator's numbers, not a GPU's.")
    print(line.format("MB/s", "CPU eng.", "SDMA eng.", "SDMA/CPU", ""))
    for name, field in (("dump, in-tool", "tool"), ("restore, in-tool", "rtool")):
        c, d = in_tool("gpu", field), in_tool("sdma", field)
        print(line.format(name, fmt(c), fmt(d), fmt(d / c if c and d else None, "{:.2f}"), ""))


def rss_tables():
    peak = {}
    for line_ in open(rss):
        k, size, run, kib, _ = line_.split()
        peak[(k, int(run))] = int(kib) * 1024
    gpu = [peak[("gpu", r)] for r in RUNS]
    base = [peak[("anon", r)] for r in RUNS]
    extra = [g - b for g, b in zip(gpu, base)]
    bound = stg + (const << 20)
    print()
    print(f"  peak RSS of criu-rocm dump (ru_maxrss), KFD_MAX_BUFFER_SIZE={staging}, median and worst of {runs} run(s)")
    print(f"  {'no GPU memory (bench-anon 0)':<42} {statistics.median(base) / M:6.1f} MiB")
    print(f"  {f'{4 * stg // M} MiB of VRAM in one BO (gpu-workload)':<42} {statistics.median(gpu) / M:6.1f} MiB")
    state = "within" if max(extra) <= bound else "EXCEEDED"
    print(f"  {'extra = peak - baseline':<42} {statistics.median(extra) / M:6.1f} MiB (worst run {max(extra) / M:.1f})")
    print(f"  {'bound = KFD_MAX_BUFFER_SIZE + ' + str(const) + ' MiB':<42} {bound / M:6.1f} MiB: {state}")


def rss8_table():
    p8 = {k: int(v) * 1024 for _, k, v in (l.split() for l in open(rss8))}
    extra8, budget8 = p8["gpu"] - p8["anon"], 64 * M
    print()
    print("  peak RSS of an 8-GPU dump (mi300x8, 1 GiB of BOs, KFD_MAX_BUFFER_SIZE unset: budget 64 MiB)")
    print(f"  {'no GPU memory (bench-anon 0)':<42} {p8['anon'] / M:6.1f} MiB")
    print(f"  {'8 x 128 MiB of BOs (gpu-workload)':<42} {p8['gpu'] / M:6.1f} MiB")
    print(f"  {'extra = peak - baseline':<42} {extra8 / M:6.1f} MiB: "
          + ("within" if extra8 <= budget8 + const * M else "EXCEEDED")
          + f" the budget + {const} MiB ({(budget8 + const * M) / M:.0f} MiB)")


def sparse_table():
    sp = {int(a): (int(b), int(c)) for a, b, c in (l.split() for l in open(sparse))}
    (z_log, z_disk), (n_log, n_disk) = sp[0], max((k, v) for k, v in sp.items() if k > 0)[1]
    big = max(sp)
    extra = n_disk - z_disk
    print()
    print(f"  sparse pages file: a BO of {big} MiB of zeros beside 1 MiB of pattern (one run)")
    print(f"  {'pages file, logical size':<42} {n_log / M:8.1f} MiB (without the zero BO {z_log / M:.1f})")
    print(f"  {'pages file, disk blocks (st_blocks*512)':<42} {n_disk / 1024:8.0f} KiB (without the zero BO {z_disk / 1024:.0f})")
    print(f"  {f'disk blocks of the {big} MiB zero BO':<42} {extra / 1024:8.0f} KiB: target <= 1024 KiB "
          + ("met" if extra <= M else "NOT met"))


def zstd_table():
    zs = {}
    for l in open(zstd):
        fill, mode, run, d_us, r_us, nb = l.split()
        zs.setdefault((fill, mode), []).append((int(d_us), int(r_us), int(nb)))
    print()
    print(f"  compression (KFD_COMPRESS=zstd, level 3): a {mib} MiB BO beside 1 MiB of pattern, compressed")
    print("  over uncompressed, best of 2; size = the pages files' bytes (st_size); times = whole commands")
    zl = "  {:<30} {:>10} {:>10} {:>10}"
    print(zl.format("data", "size", "dump time", "restore"))
    for fill, what in (("fp16", "fp16 weights"), ("pattern", "random pattern"),
                       ("sparse", "zeros, a dword per MiB")):
        n, z = zs[(fill, "none")], zs[(fill, "zstd")]
        size = min(x[2] for x in z) / min(x[2] for x in n)
        dump = min(x[0] for x in z) / min(x[0] for x in n)
        rest = min(x[1] for x in z) / min(x[1] for x in n)
        print(zl.format(what, f"{size:.3f}", f"{dump:.2f}", f"{rest:.2f}"))

def section(name, table):
    """Prints one table. After a run the time limit ended (partial == "1"), a table whose
    runs were not reached says so instead, and the ones measured before it still print."""
    if partial != "1":
        table()
        return
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            table()
    except (OSError, KeyError, ValueError, IndexError, ZeroDivisionError, statistics.StatisticsError) as e:
        print(f"\n  {name}: not measured, the run ended before it ({type(e).__name__}: {e})")
        return
    print(buf.getvalue(), end="")


section("throughput", throughput)
section("peak RSS", rss_tables)
section("peak RSS of an 8-GPU dump", rss8_table)
section("sparse pages file", sparse_table)
section("compression", zstd_table)
section("incremental GPU dump", incr_table)
section("scale", scale_table)
EOF

# table [partial]: the tables of the runs in $out; "partial" after the time limit ended the
# run: the tables it reached print, the others say they were not measured.
table() {
	/usr/bin/python3 -c "$TABLE" "$out/tp.txt" "$out/rss.txt" "$mib" "$runs" "$staging" \
		"$(size_bytes "$staging")" "$rss_const_mib" "$out/sparse.txt" "$out/rss8.txt" "$out/zstd.txt" "$out/incr.txt" \
		"$large" "$large_runs" "$only" "$out/scale.txt" "$(getconf CLK_TCK)" "${1:+1}"
	echo "  raw numbers: ${out#"$top"/}/tp.txt, rss.txt and scale.txt; criu logs: ${out#"$top"/}/logs/"
}

main() {
	local rc t0
	preflight
	rm -rf "$out"
	mkdir -p "$out"
	cc -O2 -Wall -Werror -o "$anon" "$top/scripts/bench-anon.c" || die "compiling scripts/bench-anon.c failed"
	echo "checkpoint/restore bench: criu-rocm on kfd-emu ($profile), logs in ${out#"$top"/}/"
	t0=${EPOCHREALTIME/./}
	rc=0
	timeout --foreground -k 10 "$time_limit" \
		unshare --pid --fork --mount-proc --kill-child "$self" _pidns || rc=$?
	case $rc in
	0) ;;
	124 | 137)
		echo
		echo "  the time limit ($time_limit s) ended the run; what it measured before:"
		table partial || true
		die "the bench did not finish within $time_limit s; logs in ${out#"$top"/}/"
		;;
	*) die "the bench failed (exit $rc); logs in ${out#"$top"/}/" ;;
	esac
	echo
	table
	echo "  took $(((${EPOCHREALTIME/./} - t0) / 1000000)) s"
}

case ${1:-} in
_pidns) in_pidns ;;
_emu) in_emu ;;
_emu8) in_emu8 ;;
"") main ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) die "unknown argument $1; usage: scripts/bench-cr.sh" ;;
esac
