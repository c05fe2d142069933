#!/usr/bin/env bash
# Debian sid's ROCm 6.4 userspace, unchanged, in a chroot on kfd-emu speaking Linux 6.18's
# KFD (1.18), and criu-rocm checkpointing a ROCr 6.4 process (issue 30).
#
#   usage: test/rocm64/run.sh CRIU_BINARY [CASE...]   (as root; `make test-rocm64` runs it)
#          test/rocm64/run.sh --list
#   env:   CARGO_TARGET_DIR   where kfd-emu was built (default rust/target)
#          CRIU_TREE          the prepared CRIU tree (its zdtm library builds the C/R program)
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
#   rocm-smi-P    rocm-smi 6.4 (its default report, --showmeminfo vram and --showmetrics) on
#                 profile P lists every GPU with temperature and power, the profile's VRAM
#                 total for each, and each GPU's gpu_metrics table: amdgpu's revision and size
#                 for the part (mi210x4 1.3, 120 B; mi300x8 1.5, 360 B) and the idle readings
#                 (hotspot and memory temperature, socket power, gfx activity, gfx clock);
#                 a second --showmetrics 2 s later: system_clock_counter, firmware_timestamp
#                 and energy_accumulator grew on every GPU
#                 (rx9070xt: SMU 14.0.2's 1.3, 120 B, whose driver leaves firmware_timestamp and
#                 energy_accumulator "not available": only system_clock_counter must grow)
#   rocm-smi-busy-P   HIP 6.4's in-flight --signal holds a kernel on every GPU of P: once every
#                 GPU's gpu_busy_percent reads at least 50, rocm-smi --showuse, --showmemuse and
#                 -c show every GPU at least 50 % busy, its memory at least 10 % and sclk at its
#                 top level, --showpids details a CU occupancy on every GPU (mi300x8: every XCC's
#                 current_gfxclk at the top clock in --showmetrics); once the kernels finished and
#                 the busy readings fell to 0, at most 5 % and sclk at level 0, and the GFX
#                 activity accumulators grew from the busy report to the idle one
#   rocm-smi-live-P   a ROCr 6.4 process (test/rocm64/vram-hold.c) holds 64 MiB of VRAM and a
#                 queue on every GPU of P: rocm-smi --showmeminfo vram shows each GPU's VRAM
#                 used (at least that, and together exactly what the process holds), and
#                 --showpids the process' pid, its name (ps, which rocm-smi runs), its GPUs
#                 and its VRAM; once it exited, 0 used on every GPU and no KFD process
#   hsa-P         ROCr 6.4 (test/rocm/hsa-test.c built in the chroot): agents, pools, SDMA
#                 async copies host<->VRAM and GPU->GPU, every byte verified
#   hsa-P-kfd1.16 the same with the profile at KFD 1.16 (SDMA queues not by engine id)
#   cr-same, cr-other   a ROCr 6.4 process (test/zdtm/static/gpu_rocr_buffers.c built in
#                 the chroot: VRAM, host and locked memory written by SDMA copies, runtime
#                 enabled) dumped by criu-rocm mid-run and restored on the same host or on
#                 another (other gpu_id), a round of new work, then its final check
#   cr-P          the same on multi-GPU profile P (peer copies too), under `kfd-emu
#                 supervise`: restored stopped, the supervisor's filter is given its listener
#                 again (`kfd-emu supervise --attach`), then the process resumes
#   cr-mi250x8-other   the same restored on another mi250x8 (test/gpu/hosts/
#                 mi250x8-hives-swapped.toml: every gpu_id, render minor and hive differs)
#   hip-P         HIP 6.4 programs (test/hip's vector-add, reduce, in-flight, o0_calls (at
#                 -O0: scratch stack, spills, recursive calls), dgemm (f64 MFMA) and, on gfx942
#                 only (its needs-isa line), fp8 (fp8 conversions, fp8 and xf32 MFMA); built in the chroot by
#                 hipcc for gfx90a and gfx942) on profile P (mi210x4: gfx90a, mi300x8:
#                 gfx942), each checking its results on the host
#   cr-hip-P      a HIP 6.4 process with a kernel in flight on every GPU of P (in-flight
#                 --signal) dumped while its waves wait, restored on the same host (under
#                 `kfd-emu supervise`), let go: every kernel's result checked on the host.
#                 The dump must have saved the waves of a kernel on every GPU (kfd-emu's
#                 log) and, on a GPU of several XCCs (mi300x8), into more than one XCC's
#                 slice of the save area and control stack
#   cr-hip-o0-mi300x8   cr-hip-mi300x8 with in-flight built at -O0 (in-flight-o0): every
#                 local of the kernel lives in its wave's scratch, which on MI300X is a slot of
#                 its XCC's slice of the queue's scratch; saved and resumed with the waves
#   cr-hip-P-other   the same restored on another host (test/gpu/hosts/P-other.toml: every
#                 gpu_id and render minor differs, the GPUs listed in another order; on
#                 mi300x8 the hive_id too)
#   hip-ipc-P     HIP 6.4 IPC (test/rocm64/ipc-mem.hip) on profile P: an exporter's hipIpcGetMemHandle
#                 (ROCr's dma-buf IPC, HSA_ENABLE_IPC_MODE_LEGACY=0: EXPORT_DMABUF, the fd
#                 handed over its abstract unix socket @hsaPID), importers' hipIpcOpenMemHandle
#                 (GET_DMABUF_INFO, IMPORT_DMABUF) reading the buffer, before and after the
#                 exporter writes it again. ROCr 6.4's default (legacy) IPC needs the DKMS-only
#                 AMDKFD_IOC_IPC_EXPORT_HANDLE, which Linux 6.18's KFD lacks: not tested
#   cr-hip-ipc-P  the exporter alone (its IPC handle exported, an importer came and went)
#                 dumped and restored on the same host (under `kfd-emu supervise`): its buffer
#                 checked, a new importer opens the handle and reads it, the exporter writes
#                 it again and another importer reads that
#   cr-hip-ipc-P-other   cr-hip-ipc-P restored on another host (test/gpu/hosts/P-other.toml:
#                 every gpu_id and render minor differs, the GPUs listed in another order):
#                 the handle names the exporter's pid and its socket @hsaPID, both restored
#                 by CRIU, and its buffer is on the restored BO's GPU, which an importer on the
#                 new host opens from its own first GPU
#   cr-hip-ipc-tree-P   exporter and importer (the handle open) under one shell dumped as one
#                 tree and restored on the same host (under `kfd-emu supervise`): the importer's
#                 KFD BO recorded as the exporter's (saved once) and imported again at restore
#                 at its VA and handle; the importer reads the buffer and writes it (seed 3),
#                 the exporter sees that write, writes it again and passes
#   cr-hip-ipc-tree-killed-P   the same tree dumped, its restore killed at the importer's
#                 import (the test hook stops its task there, after the exporter's RESTORE
#                 handed it the BO; criu-rocm gets SIGKILL): no task outlives criu nor runs
#                 its own code, the images unchanged; once their pids are free, the same
#                 images restored again and let go as in cr-hip-ipc-tree-P (the next restore
#                 works)
# Each prints PASS, FAIL with the reason, or SKIP with the reason; the last line is
# exactly "N passed, M failed" (", K skipped" when some were). Non-zero exit on failure.
set -uo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$(realpath "$0")")" && pwd)
top=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
KFD_EMU=$target/kfd-emu
work=$top/build/rocm64/cases
HIP=${HIP:-0} # 1: the C/R steps run the HIP program (cr-hip-*)
. "$top/scripts/lib/workload.sh"
# hip_flags_of
# shellcheck source=SCRIPTDIR/../hip/build.sh
. "$top/test/hip/build.sh"

profiles=(mi100 mi100x2 mi210x4 mi250x8 mi300x8 rx9070xt)
declare -A gpus=([mi100]=1 [mi100x2]=2 [mi210x4]=4 [mi250x8]=8 [mi300x8]=8 [rx9070xt]=1)
declare -A cpus=([mi100]=1 [mi100x2]=1 [mi210x4]=2 [mi250x8]=4 [mi300x8]=2 [rx9070xt]=1)
declare -A gfx=([mi100]=gfx908 [mi100x2]=gfx908 [mi210x4]=gfx90a [mi250x8]=gfx90a [mi300x8]=gfx942 [rx9070xt]=gfx1201)
declare -A vram_gib=([mi100]=32 [mi100x2]=32 [mi210x4]=64 [mi250x8]=64 [mi300x8]=192 [rx9070xt]=16)


cases() {
	local p
	for p in "${profiles[@]}"; do echo "rocminfo-$p"; done
	echo rocm-smi-mi210x4 rocm-smi-mi300x8 rocm-smi-rx9070xt rocm-smi-live-mi210x4 rocm-smi-live-mi300x8 | tr ' ' '\n'
	echo rocm-smi-busy-mi210x4 rocm-smi-busy-mi300x8 | tr ' ' '\n'
	for p in "${profiles[@]}"; do echo "hsa-$p"; done
	echo hsa-mi210x4-kfd1.16 hsa-mi250x8-kfd1.16 cr-same cr-other cr-mi210x4 cr-mi300x8 cr-mi250x8-other | tr ' ' '\n'
	echo hip-mi210x4 hip-mi300x8 cr-hip-mi210x4 cr-hip-mi300x8 cr-hip-o0-mi300x8 cr-hip-mi210x4-other cr-hip-mi300x8-other | tr ' ' '\n'
	echo hip-ipc-mi210x4 cr-hip-ipc-mi210x4 cr-hip-ipc-mi210x4-other cr-hip-ipc-tree-mi210x4 cr-hip-ipc-tree-killed-mi210x4 | tr ' ' '\n'
}

# The HIP 6.4 programs (test/hip/*.hip) and the GPUs their code objects are built for.
hip_programs=(vector-add reduce in-flight o0_calls dgemm fp8)
# Built beside them for the IPC cases (hip-ipc-*, cr-hip-ipc-*), from test/rocm64 (HIP 5.2,
# which test/hip's programs are for, has no IPC that Linux's KFD serves).
hip_ipc='ipc-mem'
hip_arches=(gfx90a gfx942)

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

# The C/R program's steps. Its case directory is $ROOT/tmp/rocm64/CASE (also /tmp/rocm64/CASE
# inside the chroot); images are kept outside the chroot. SUPERVISE 1: the program runs under
# `kfd-emu supervise`, and its restored copy gets the supervisor's listener again.
host_dump() { # ROOT CASEDIR IMG CRIU SUPERVISE
	ROOT=$1
	local cdir=$2 img=$3 criu=$4 sup=() pid
	[ "$5" = 1 ] && sup=("$KFD_EMU" supervise --)
	bind_host || exit 1
	if [ "$HIP" = 1 ]; then
		hip_host_start "$cdir" "$5" || exit 1
	else
		"${sup[@]}" chroot "$ROOT" /opt/criu-rocm-tests/gpu_rocr_buffers --pidfile="${cdir#"$ROOT"}/t.pid" \
			--outfile="${cdir#"$ROOT"}/t.out" >>"$cdir/start.log" 2>&1 || { echo "did not start: $(tail -n 3 "$cdir/t.out.inprogress" 2>/dev/null | paste -sd'|')"; exit 1; }
	fi
	pid=$(cat "$cdir/t.pid")
	"$criu" dump -t "$pid" -D "$img" -o dump.log -v4 >>"$cdir/criu.out" 2>&1 ||
		{ echo "dump failed: $(log_errors "$img/dump.log")"; exit 1; }
	wait_gone "$pid" 10 || { echo "$pid still runs after the dump"; exit 1; }
}

host_restore() { # ROOT CASEDIR IMG CRIU SUPERVISE
	ROOT=$1
	local cdir=$2 img=$3 criu=$4 sup=$5 stop=() pid i
	[ "$sup" = 1 ] && stop=(--leave-stopped)
	bind_host || exit 1
	pid=$(cat "$cdir/t.pid")
	"$criu" restore -D "$img" -o restore.log -v4 -d --restore-sibling "${stop[@]}" >>"$cdir/criu.out" 2>&1 ||
		{ echo "restore failed: $(log_errors "$img/restore.log")"; exit 1; }
	alive "$pid" || { echo "restored $pid does not run"; exit 1; }
	if [ "$sup" = 1 ]; then
		"$KFD_EMU" supervise --attach "$pid" >>"$cdir/criu.out" 2>&1 ||
			{ echo "supervise --attach $pid: $(tail -n 1 "$cdir/criu.out")"; exit 1; }
		kill -CONT "$pid"
	fi
	[ "$HIP" = 1 ] && hip_host_finish "$cdir" && exit 0
	kill -USR1 "$pid"
	for ((i = 0; i < 600; i++)); do
		grep -qE ': round 1: (ok|FAIL)$' "$cdir/t.out.inprogress" 2>/dev/null && break
		sleep 0.1
	done
	grep -qE ': round 1: ok$' "$cdir/t.out.inprogress" || { echo "round after restore: $(tail -n 3 "$cdir/t.out.inprogress" | paste -sd'|')"; exit 1; }
	exec /usr/bin/python3 "$top/scripts/lib/stop_and_reap.py" 120 program "$pid" "$cdir/exit-status"
}

# The HIP C/R program: test/hip/in-flight --signal (the binary $HIP_PROG, in-flight unless
# set), in a session of its own, its output in the case directory; returns once every kernel
# waits for its flag.
hip_host_start() { # CASEDIR SUPERVISE
	local cdir=$1 sup=() i
	[ "$2" = 1 ] && sup=("$KFD_EMU" supervise --)
	setsid "${sup[@]}" chroot "$ROOT" "/opt/criu-rocm-tests/hip/${HIP_PROG:-in-flight}" --signal \
		</dev/null >"$cdir/t.out" 2>&1 &
	for ((i = 0; i < 1200; i++)); do
		grep -q '^in-flight: [0-9]* GPUs$' "$cdir/t.out" && break
		sleep 0.1
	done
	grep -q '^in-flight: every kernel waits for its flag: .* ok$' "$cdir/t.out" ||
		{ echo "in-flight did not get its kernels running: $(tail -n 3 "$cdir/t.out" | paste -sd'|')"; return 1; }
	in_flight_pid >"$cdir/t.pid" || { echo "no in-flight process chrooted in $ROOT"; return 1; }
}

# The pid of the in-flight program chrooted in $ROOT: another worktree's test-rocm64 may run
# its own copy at the same time, in its own chroot.
in_flight_pid() {
	local p
	for p in $(pgrep -f "^/opt/criu-rocm-tests/hip/${HIP_PROG:-in-flight} --signal"); do
		[ "$(readlink "/proc/$p/root")" = "$ROOT" ] && echo "$p" && return 0
	done
	return 1
}

hip_host_finish() { # CASEDIR
	local cdir=$1 pid i
	pid=$(cat "$cdir/t.pid")
	kill -USR1 "$pid"
	for ((i = 0; i < 1200; i++)); do
		grep -qE '^in-flight: (PASSED|FAILED)$' "$cdir/t.out" && break
		sleep 0.1
	done
	grep -q '^in-flight: PASSED$' "$cdir/t.out" || { echo "after restore: $(tail -n 4 "$cdir/t.out" | paste -sd'|')"; exit 1; }
	wait_gone "$pid" 30 || { echo "in-flight $pid still runs after it passed"; exit 1; }
	echo 0 >"$cdir/exit-status"
}

# The IPC cases' steps (test/rocm64/ipc-mem.hip), on the host in `kfd-emu run` with the chroot's
# view bound. Each program runs in the chroot under `kfd-emu supervise`, with ROCr's dma-buf
# IPC, its output in CASEDIR/NAME.out; the handle file is CASEDIR/h.
ipc_bin=/opt/criu-rocm-tests/hip/ipc-mem

# The command words running a command in the chroot under supervise (set by host_ipc). Not a
# function: bash would wait in a subshell for a background call and write "Killed" into the
# exporter's output once the dump killed it, which CRIU then finds grown.
ipc_cmd=()

# wait_line FILE REGEX SECONDS: FILE has a line matching REGEX within SECONDS.
wait_line() {
	local i
	for ((i = 0; i < $3 * 10; i++)); do
		grep -qE "$2" "$1" 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# ipc_reached FILE WORD SECONDS: FILE shows "ipc-mem: WORD" (or FAILED) within SECONDS, and
# it is WORD.
ipc_reached() {
	wait_line "$1" "^ipc-mem: ($2|FAILED)\$" "$3" && grep -q "^ipc-mem: $2\$" "$1"
}

# The pid of the process chrooted in $ROOT whose command line starts with PREFIX.
chrooted_pid() { # PREFIX
	local p
	for p in $(pgrep -f "^$1"); do
		[ "$(readlink "/proc/$p/root")" = "$ROOT" ] && echo "$p" && return 0
	done
	return 1
}

# An importer run to its end: it read the buffer written with SEED and passed.
ipc_import() { # CASEDIR NAME SEED
	local cdir=$1 in=${1#"$ROOT"}
	if ! "${ipc_cmd[@]}" "$ipc_bin" import "$in/h" --seed "$3" </dev/null >"$cdir/$2.out" 2>&1 ||
		! grep -q '^ipc-mem: PASSED$' "$cdir/$2.out"; then
		echo "importer $2 (seed $3): $(tail -n 2 "$cdir/$2.out" | paste -sd'|')"
		return 1
	fi
}

# The exporter, once let go (SIGUSR1): its buffer still as written, written again with seed 2
# and read so by a new importer; then (SIGUSR1) it ends and passed.
ipc_finish() { # CASEDIR PID
	local cdir=$1 pid=$2
	kill -USR1 "$pid"
	ipc_reached "$cdir/e.out" refilled 60 ||
		{ echo "exporter $pid did not write its buffer again: $(tail -n 3 "$cdir/e.out" | paste -sd'|')"; return 1; }
	ipc_import "$cdir" i2 2 || return 1
	kill -USR1 "$pid"
	ipc_reached "$cdir/e.out" PASSED 60 ||
		{ echo "exporter $pid: $(tail -n 3 "$cdir/e.out" | paste -sd'|')"; return 1; }
	wait_gone "$pid" 30 || { echo "exporter $pid still runs after it passed"; return 1; }
}

# The exporter started in a session of its own, its handle written; pid in CASEDIR/t.pid.
ipc_export() { # CASEDIR
	local cdir=$1
	setsid "${ipc_cmd[@]}" "$ipc_bin" export "${cdir#"$ROOT"}/h" </dev/null >"$cdir/e.out" 2>&1 &
	wait_line "$cdir/e.out" '^ipc-mem: exported$' 120 ||
		{ echo "the exporter did not export: $(tail -n 3 "$cdir/e.out" | paste -sd'|')"; return 1; }
	chrooted_pid "$ipc_bin export" >"$cdir/t.pid" || { echo "no exporter chrooted in $ROOT"; return 1; }
}

host_ipc() { # ROOT STEP CASEDIR IMG CRIU
	ROOT=$1
	local step=$2 cdir=$3 img=$4 criu=$5 pid
	ipc_cmd=("$KFD_EMU" supervise -- chroot "$ROOT" env HSA_ENABLE_IPC_MODE_LEGACY=0)
	bind_host || exit 1
	case $step in
	run)
		ipc_export "$cdir" && ipc_import "$cdir" i1 1 && ipc_finish "$cdir" "$(cat "$cdir/t.pid")" ;;
	dump)
		ipc_export "$cdir" && ipc_import "$cdir" i0 1 || exit 1
		pid=$(cat "$cdir/t.pid")
		"$criu" dump -t "$pid" -D "$img" -o dump.log -v4 >>"$cdir/criu.out" 2>&1 ||
			{ echo "dump failed: $(log_errors "$img/dump.log")"; exit 1; }
		wait_gone "$pid" 10 || { echo "$pid still runs after the dump"; exit 1; } ;;
	restore)
		pid=$(cat "$cdir/t.pid")
		"$criu" restore -D "$img" -o restore.log -v4 -d --restore-sibling --leave-stopped >>"$cdir/criu.out" 2>&1 ||
			{ echo "restore failed: $(log_errors "$img/restore.log")"; exit 1; }
		"$KFD_EMU" supervise --attach "$pid" >>"$cdir/criu.out" 2>&1 ||
			{ echo "supervise --attach $pid: $(tail -n 1 "$cdir/criu.out")"; exit 1; }
		kill -CONT "$pid"
		ipc_import "$cdir" i1 1 && ipc_finish "$cdir" "$pid" ;;
	tree) ipc_tree "$cdir" "$img" "$criu" ;;
	tree-killed) ipc_tree "$cdir" "$img" "$criu" killed ;;
	esac
}

# Exporter and importer (its handle open) children of one shell, started; pids in
# CASEDIR/tree.pids (exporter, importer, shell). The importer writes the buffer with seed 3
# once let go, and the exporter expects that.
ipc_tree_start() { # CASEDIR
	local cdir=$1 in=${1#"$ROOT"} e i sh
	# shellcheck disable=SC2016 # expanded by the chroot's shell
	setsid "${ipc_cmd[@]}" sh -c '
		bin=$1 in=$2
		"$bin" export "$in/h" --expect 3 >"$in/e.out" 2>&1 &
		i=0
		until grep -q "^ipc-mem: exported$" "$in/e.out"; do
			i=$((i + 1)) && [ $i -lt 1200 ] || exit 1
			sleep 0.1
		done
		"$bin" import "$in/h" --hold --write 3 >"$in/i.out" 2>&1 &
		wait' sh "$ipc_bin" "$in" </dev/null >"$cdir/sh.out" 2>&1 &
	ipc_reached "$cdir/i.out" imported 180 ||
		{ echo "the importer did not open the handle: $(tail -n 3 "$cdir/e.out" "$cdir/i.out" | paste -sd'|')"; return 1; }
	e=$(chrooted_pid "$ipc_bin export") || { echo "no exporter in $ROOT"; return 1; }
	i=$(chrooted_pid "$ipc_bin import") || { echo "no importer in $ROOT"; return 1; }
	sh=$(ps -o ppid= -p "$e" | tr -d ' ')
	echo "$e $i $sh" >"$cdir/tree.pids"
}

# The tree let go: the importer reads the buffer again, writes it (seed 3) and passes; the
# exporter sees that write, writes the buffer again and passes; the shell ends.
ipc_tree_finish() { # CASEDIR
	local cdir=$1 e i sh
	read -r e i sh <"$cdir/tree.pids"
	kill -USR1 "$i"
	ipc_reached "$cdir/i.out" PASSED 60 ||
		{ echo "importer $i: $(tail -n 3 "$cdir/i.out" | paste -sd'|')"; return 1; }
	kill -USR1 "$e"
	ipc_reached "$cdir/e.out" refilled 60 ||
		{ echo "exporter $e: $(tail -n 3 "$cdir/e.out" | paste -sd'|')"; return 1; }
	kill -USR1 "$e"
	ipc_reached "$cdir/e.out" PASSED 60 ||
		{ echo "exporter $e: $(tail -n 3 "$cdir/e.out" | paste -sd'|')"; return 1; }
	wait_gone "$sh" 30 || { echo "shell $sh still runs"; return 1; }
}

# A kill point of the tree's restore: the importer's task stops (the test hook) at its
# import, after the exporter's RESTORE handed it the BO, and criu-rocm is killed there. No
# task outlives criu nor runs its own code (their outputs unchanged), the images unchanged.
ipc_tree_killed_restore() { # CASEDIR IMG CRIU
	local cdir=$1 img=$2 criu=$3 e i sh before outs cpid pid st
	read -r e i sh <"$cdir/tree.pids"
	before=$(img_sums "$img")
	outs=$(cat "$cdir/e.out" "$cdir/i.out" | wc -l)
	CRIU_ROCM_TEST_STOP_ON_LOG="importing the restored BO" env --default-signal=HUP,INT,PIPE,TERM \
		"$KFD_EMU" supervise -- "$criu" restore -D "$img" -o restore-killed.log -v4 -d --restore-sibling --leave-stopped >>"$cdir/criu.out" 2>&1 &
	cpid=$!
	wait_stopped "$i" "$cpid" ||
		{ echo "the restored importer $i never stopped at its import: $(log_errors "$img/restore-killed.log")"; return 1; }
	grep -aq "pid $i: KFD file [0-9]*, BO at GPU VA .*: importing the restored BO" "$img/restore-killed.log" ||
		{ echo "importer $i stopped elsewhere than at its import"; return 1; }
	# `kfd-emu supervise` execs its command: $cpid is criu-rocm itself (its children named
	# criu* are the tasks it restores, not yet renamed). Bounded, so that a criu that does not
	# end fails here with the reason, well before the host's `timeout 300` (emu) ends the step.
	kill -KILL "$cpid"
	if ! wait_gone "$cpid" 30; then
		echo "criu-rocm $cpid did not end within 30 s of its SIGKILL (state $(proc_state "$cpid"))"
		return 1
	fi
	wait "$cpid"
	for pid in "$e" "$i" "$sh"; do
		kill -CONT "$pid" 2>/dev/null
		if ! wait_gone "$pid" 5; then
			st=$(proc_state "$pid")
			kill -KILL "$pid"
			echo "restored task $pid outlived the killed criu-rocm (state $st; killed now)"
			return 1
		fi
	done
	[ "$outs" = "$(cat "$cdir/e.out" "$cdir/i.out" | wc -l)" ] || { echo "the killed restore's tasks ran their own code"; return 1; }
	[ "$before" = "$(img_sums "$img")" ] || { echo "the killed restore changed the images"; return 1; }
}

# Exporter and importer dumped as one tree and restored on the same host: criu restores
# under `kfd-emu supervise` (KFD's RESTORE hands the exporter's task the dma-buf of its
# restored BO there, which the importer's task imports), the tree restored stopped, then
# let go: each process passes (ipc_tree_finish). The restored tasks keep criu's filter:
# seccomp gives a task one listener, so `supervise --attach` cannot give them another, and
# what the filter CRIU restored notifies fails (ENOSYS): no new importer after the restore.
# With "killed", a restore killed at the importer's import comes first
# (ipc_tree_killed_restore), then this one.
ipc_tree() { # CASEDIR IMG CRIU [killed]
	local cdir=$1 img=$2 criu=$3 mode=${4:-} e i sh pid why k
	ipc_tree_start "$cdir" || return 1
	read -r e i sh <"$cdir/tree.pids"
	"$criu" dump -t "$sh" -D "$img" -o dump.log -v4 >>"$cdir/criu.out" 2>&1 ||
		{ echo "dump of the tree of $sh (exporter $e, importer $i) failed: $(log_errors "$img/dump.log")"; return 1; }
	grep -aq "pid $i: /dev/kfd BO at GPU VA .*: the same BO as pid $e" "$img/dump.log" ||
		{ echo "the dump did not record importer $i's KFD BO as exporter $e's"; return 1; }
	for pid in "$e" "$i" "$sh"; do
		wait_gone "$pid" 10 || { echo "$pid still runs after the dump"; return 1; }
	done
	if [ "$mode" = killed ]; then
		ipc_tree_killed_restore "$cdir" "$img" "$criu" || return 1
		# Gone is not reaped: the next restore forks its tasks at these pids.
		for pid in "$e" "$i" "$sh"; do
			k=0
			while [ -e "/proc/$pid" ] && ((k++ < 200)); do sleep 0.05; done
			[ -e "/proc/$pid" ] && { echo "pid $pid still taken 10 s after the killed restore"; return 1; }
		done
		why=$(ipc_tree_restore "$cdir" "$img" "$criu") || { echo "the restore after the killed one: $why"; return 1; }
		return 0
	fi
	ipc_tree_restore "$cdir" "$img" "$criu"
}

# The tree restored from IMG under `kfd-emu supervise`, stopped, its importer's BO imported
# again from the exporter's, then let go to its end (ipc_tree_finish).
ipc_tree_restore() { # CASEDIR IMG CRIU
	local cdir=$1 img=$2 criu=$3 e i sh
	read -r e i sh <"$cdir/tree.pids"
	"$KFD_EMU" supervise -- "$criu" restore -D "$img" -o restore.log -v4 -d --restore-sibling --leave-stopped >>"$cdir/criu.out" 2>&1 ||
		{ echo "restore failed: $(log_errors "$img/restore.log")"; return 1; }
	grep -aq "pid $i: KFD file [0-9]*: BO at GPU VA .* imported again from pid $e's BO" "$img/restore.log" ||
		{ echo "the restore did not import importer $i's BO again from exporter $e"; return 1; }
	kill -CONT "$sh" "$e" "$i"
	ipc_tree_finish "$cdir"
}

case ${1:-} in
--in-host) shift && in_host "$@" ;;
--host-ipc) shift && host_ipc "$@"; exit ;;
--host-dump) shift && host_dump "$@" && exit 0 ;;
--host-restore) shift && host_restore "$@" ;;
--list) cases && exit 0 ;;
esac

# ---------------------------------------------------------------------------------------
# The suite

CRIU=${1:?usage: test/rocm64/run.sh CRIU_BINARY [CASE...]}
CRIU=$(realpath "$CRIU")
shift
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
	local d=$ROOT/opt/criu-rocm-tests z=${CRIU_TREE:?}/test/zdtm
	mkdir -p "$d/src"
	cp "$top/test/rocm/hsa-test.c" "$top/test/rocm/report.h" "$here/vram-hold.c" "$d/src/" &&
		cp "$top"/test/zdtm/static/{gpu_rocr_buffers.c,gpu_round.c,gpu_round.h,rocr_common.c,rocr_common.h,gpu_pattern.h} "$d/src/" &&
		cp "$z"/lib/*.c "$z"/lib/*.h "$d/src/" && cp -r "$z"/lib/arch/x86/include/. "$d/src/" || return 1
	chroot "$ROOT" sh -ec 'cd /opt/criu-rocm-tests/src
		gcc -std=gnu11 -O2 -Wall -o ../hsa-test hsa-test.c -lhsa-runtime64
		gcc -std=gnu11 -O2 -Wall -o ../vram-hold vram-hold.c -lhsa-runtime64
		gcc -O2 -D_GNU_SOURCE -D_LARGEFILE64_SOURCE -iquote . -o ../gpu_rocr_buffers gpu_rocr_buffers.c \
			gpu_round.c rocr_common.c datagen.c msg.c parseargs.c test.c streamutil.c lock.c ns.c tcp.c \
			unix.c fs.c sysctl.c mem.c file.c mountinfo.c -lhsa-runtime64' >"$top/build/rocm64/programs.log" 2>&1
}
if ! build_programs; then
	for c in "${want[@]}"; do result FAIL "$c" "the test programs did not build in the chroot: $(tail -n 3 "$top/build/rocm64/programs.log" | paste -sd'|')"; done
	echo "$PASSED passed, $FAILED failed"
	exit 1
fi

# The HIP programs, built by the chroot's hipcc (LLVM 21) for gfx90a and gfx942 when a source
# is newer than its binary (about 20 s each here).
build_hip() {
	local d=$ROOT/opt/criu-rocm-tests/hip p src arches flags
	arches=$(printf ' --offload-arch=%s' "${hip_arches[@]}")
	mkdir -p "$d"
	cp -p "$top/test/hip/check.h" "$d/" || return 1
	for p in "${hip_programs[@]}" "$hip_ipc"; do
		src=$top/test/hip/$p.hip
		[ "$p" = "$hip_ipc" ] && src=$here/$p.hip
		cp -p "$src" "$d/" || return 1
		[ "$d/$p" -nt "$d/$p.hip" ] && [ "$d/$p" -nt "$d/check.h" ] && continue
		flags=$(hip_flags_of "$d/$p.hip")
		# shellcheck disable=SC2086 # the arch and source flags are words
		in_chroot_proc hipcc $arches $flags -o "/opt/criu-rocm-tests/hip/$p" "/opt/criu-rocm-tests/hip/$p.hip" ||
			return 1
	done
	# in-flight again at -O0 for cr-hip-o0-*: its kernel's locals in scratch.
	[ "$d/in-flight-o0" -nt "$d/in-flight.hip" ] && [ "$d/in-flight-o0" -nt "$d/check.h" ] && return 0
	# shellcheck disable=SC2086 # the arch flags are words
	in_chroot_proc hipcc $arches -O0 -o /opt/criu-rocm-tests/hip/in-flight-o0 /opt/criu-rocm-tests/hip/in-flight.hip
}

# Runs a command in the chroot with /proc mounted (hipcc's clang reads it), in a mount
# namespace of its own.
in_chroot_proc() {
	# shellcheck disable=SC2016 # expanded by the inner shell
	unshare -m sh -c 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"' sh "$ROOT" "$ROOT" "$@"
}

hip_wanted() {
	local c
	for c in "${want[@]}"; do
		case $c in hip-* | cr-hip-* | rocm-smi-busy-*) return 0 ;; esac
	done
	return 1
}
hip_built=1
if hip_wanted && ! build_hip >"$top/build/rocm64/hip-programs.log" 2>&1; then
	hip_built=0
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

# The gpu_metrics revision and size amdgpu gives the profile's GPUs, and the --showmetrics
# lines (after "GPU[N] : ") each GPU must show: kfd-emu's idle readings.
declare -A metrics_rev=([mi210x4]='1.3 120' [mi300x8]='1.5 360' [rx9070xt]='1.3 120')
declare -A metrics_power=([mi210x4]='average_socket_power (W): 40' [mi300x8]='current_socket_power (W): 140'
	[rx9070xt]='average_socket_power (W): 15')
# The gpu_metrics fields that advance with time on the part (the others' drivers fill all three),
# and a line its driver leaves "not available".
declare -A metrics_clocked=([rx9070xt]='system_clock_counter')
declare -A metrics_na=([rx9070xt]='energy_accumulator (15.259uJ (2^-16)): N/A')
metrics_lines() { # PROFILE
	printf '%s\n' "Metric Version and Size (Bytes): ${metrics_rev[$1]}" 'temperature_hotspot (C): 40' \
		'temperature_mem (C): 38' "${metrics_power[$1]}" 'average_gfx_activity (%): 0'
	[ -z "${metrics_na[$1]:-}" ] || echo "${metrics_na[$1]}"
}

# The GPUs whose --showmetrics shows every line of metrics_lines PROFILE, of the log LOG, and
# the first line missing.
metrics_shown() { # LOG PROFILE
	local line n fewest=${gpus[$2]} missing=
	while IFS= read -r line; do
		n=$(grep -cF -- ": $line" "$1")
		[ "$n" -ge "$fewest" ] || { fewest=$n && missing=${missing:-$line}; }
	done < <(metrics_lines "$2")
	echo "$fewest${missing:+ (missing: $missing)}"
}

# The GPUs of PROFILE whose gpu_metrics fields that advance (metrics_clocked; by default
# system_clock_counter, firmware_timestamp and energy_accumulator) all grew from the first
# --showmetrics of LOG to the second (after a line "again").
metrics_advanced() { # LOG PROFILE
	local f fields=${metrics_clocked[$2]:-system_clock_counter firmware_timestamp energy_accumulator} want
	want=$(wc -w <<<"$fields")
	for f in $fields; do
		awk -v f="$f" '/^again$/ { second = 1 }
			match($0, /^GPU\[[0-9]+\]/) && index($0, ": " f " (") {
				g = substr($0, 5, RLENGTH - 5); v = $NF
				if (second) { if (v ~ /^[0-9]+$/ && v + 0 > first[g] + 0 && v + 0 < 2 ^ 63) print g }
				else first[g] = v
			}' "$1"
	done | sort | uniq -c | awk -v want="$want" '$1 == want { n++ } END { print n + 0 }'
}

# rocm-smi's default report has a row per GPU ("N  NODE  0xDID, GUID  TEMP  POWER ..."),
# --showmeminfo vram a "VRAM Total Memory (B)" line per GPU, --showmetrics metrics_lines,
# and a second --showmetrics two seconds later the timestamps and energy advanced.
run_rocm_smi() { # PROFILE
	local p=$1 c=rocm-smi-$1 log=$work/rocm-smi-$1.log rows sensed vram bytes=$((vram_gib[$1] << 30)) bad metrics grew
	emu "$log" "$p" 0 sh -c 'rocm-smi && rocm-smi --showmeminfo vram && rocm-smi --showmetrics && sleep 2 && echo again && rocm-smi --showmetrics' ||
		{ result FAIL "$c" "exit $?: $(grep -m 2 -iE 'error|not found|fail' "$log" | paste -sd'|'); log ${log#"$top"/}"; return; }
	rows=$(grep -cE '^[0-9]+ +[0-9]+ +0x[0-9a-f]+, +[0-9]+ ' "$log")
	sensed=$(grep -cE '^[0-9]+ +[0-9]+ +0x[0-9a-f]+, +[0-9]+ +[0-9.]+°C +[0-9.]+W ' "$log")
	vram=$(grep -cE "^GPU\[[0-9]+\][[:space:]]*: VRAM Total Memory \(B\): $bytes$" "$log")
	metrics=$(metrics_shown "$log" "$p")
	grew=$(metrics_advanced "$log" "$p")
	bad=$(grep -m 2 -E 'Not supported|Unsupported|not found|Failed to retrieve' "$log" | paste -sd'|')
	if [ "$rows" != "${gpus[$p]}" ] || [ "$sensed" != "${gpus[$p]}" ] || [ "$vram" != "${gpus[$p]}" ] ||
		[ "${metrics%% *}" != "${gpus[$p]}" ] || [ "$grew" != "${gpus[$p]}" ] || [ -n "$bad" ]; then
		result FAIL "$c" "$rows GPU rows, $sensed with temperature and power, $vram with $bytes B of VRAM, $metrics with gpu_metrics, $grew whose timestamps and energy advanced (want ${gpus[$p]} each)${bad:+; $bad}; log ${log#"$top"/}"
	else
		result PASS "$c" "${gpus[$p]} GPUs listed with temperature and power, each with $bytes B of VRAM and gpu_metrics ${metrics_rev[$p]% *} whose ${metrics_clocked[$p]:-timestamps and energy} advance"
	fi
}

# In the chroot: vram-hold MIB started, rocm-smi's memory and process reports while it holds,
# "after", and the same once it exited and KFD let its memory go. Its output file is emptied
# before it starts: the chroot's /tmp keeps the last run's "holding" line, and a background
# job's redirection truncates only once the job runs, after the wait below may have read it.
# shellcheck disable=SC2016 # expanded by the chroot's shell
smi_live_script='out=/tmp/rocm64-vram-hold.out
: >$out
/opt/criu-rocm-tests/vram-hold "$1" >$out 2>&1 &
pid=$! i=0
until grep -q "^vram-hold: holding" $out; do
	i=$((i + 1))
	{ [ $i -lt 600 ] && kill -0 $pid 2>/dev/null; } || { echo "vram-hold did not hold: $(cat $out)"; exit 1; }
	sleep 0.1
done
echo "vram-hold pid $pid"
rocm-smi --showmeminfo vram && rocm-smi --showpids || exit
kill -USR1 $pid && wait $pid && tail -n 1 $out
i=0
while [ "$(cat /sys/class/drm/card*/device/mem_info_vram_used | sort -u)" != 0 ] && [ $i -lt 100 ]; do
	i=$((i + 1)) && sleep 0.1
done
echo after
rocm-smi --showmeminfo vram && rocm-smi --showpids'

# The used VRAM lines of rocm-smi --showmeminfo vram on standard input, one number a line.
vram_used() { sed -n 's/^GPU\[[0-9]*\][[:space:]]*: VRAM Total Used Memory (B): \([0-9]*\)$/\1/p'; }

run_rocm_smi_live() { # PROFILE
	local p=$1 c=rocm-smi-live-$1 log=$work/rocm-smi-live-$1.log mib=64 n=${gpus[$1]} pid held row used after
	emu "$log" "$p" 1 sh -c "$smi_live_script" sh "$mib" ||
		{ result FAIL "$c" "exit $?: $(grep -m 2 -iE 'error|not|fail' "$log" | paste -sd'|'); log ${log#"$top"/}"; return; }
	pid=$(sed -n 's/^vram-hold pid \([0-9]*\)$/\1/p' "$log")
	held=$(sed '/^after$/q' "$log" | vram_used | awk -v m=$((mib << 20)) '$1 >= m { n++; s += $1 } END { print n + 0, s + 0 }')
	row=$(grep -E "^$pid[[:space:]]+vram-hold[[:space:]]+$n[[:space:]]+[0-9]+[[:space:]]+0[[:space:]]" "$log" | awk '{ print $4 }')
	used=$(sed '/^after$/q' "$log" | vram_used | awk '{ s += $1 } END { print s + 0 }')
	after=$(sed -n '/^after$/,$p' "$log" | vram_used | grep -c '^0$')
	if [ -z "$pid" ] || [ "${held% *}" != "$n" ] || [ "$row" != "$used" ] || [ "$after" != "$n" ] ||
		! grep -q 'No KFD PIDs currently running' "$log"; then
		result FAIL "$c" "pid ${pid:-?}: ${held% *} of $n GPUs with >= $mib MiB used, its --showpids VRAM ${row:-none} (a row naming vram-hold; all GPUs' used: $used), $after GPUs at 0 after it exited; log ${log#"$top"/}"
	else
		result PASS "$c" "pid $pid held $mib MiB + ROCr's own on each of $n GPUs: rocm-smi showed $used B used, the same in --showpids (named vram-hold); 0 on every GPU and no KFD process after"
	fi
}

# In the chroot: in-flight --signal started (a kernel waiting on every GPU); once every GPU's
# gpu_busy_percent reads at least 50, rocm-smi's use, memory use, clocks, processes and
# metrics; the kernels let go; once every GPU's busy readings are 0, "idle" and the use,
# memory use and clocks again. every_gpu ATTR TEST waits up to 60 s for every GPU's amdgpu
# attribute ATTR to pass the test TEST ("-ge 50"): the readings average over a second.
# shellcheck disable=SC2016 # expanded by the chroot's shell
smi_busy_script='out=/tmp/rocm64-busy.out
: >$out
every_gpu() {
	i=0
	while :; do
		ok=1
		for f in /sys/class/drm/card*/device/$1; do [ "$(cat $f)" $2 ] || ok=0; done
		[ $ok = 1 ] && return 0
		i=$((i + 1))
		[ $i -lt 600 ] || { echo "$1 not $2 on every GPU in 60 s: $(cat /sys/class/drm/card*/device/$1 | paste -sd " ")"; return 1; }
		sleep 0.1
	done
}
/opt/criu-rocm-tests/hip/in-flight --signal >$out 2>&1 &
pid=$! i=0
until grep -q "^in-flight: every kernel waits for its flag" $out; do
	i=$((i + 1))
	{ [ $i -lt 1200 ] && kill -0 $pid 2>/dev/null; } || { echo "in-flight did not get its kernels running: $(tail -n 3 $out)"; exit 1; }
	sleep 0.1
done
every_gpu gpu_busy_percent "-ge 50" || exit 1
rocm-smi --showuse --showmemuse -c && rocm-smi --showpids details && rocm-smi --showmetrics || exit
kill -USR1 $pid && wait $pid
tail -n 1 $out
every_gpu gpu_busy_percent "-eq 0" && every_gpu mem_busy_percent "-eq 0" || exit 1
echo idle
rocm-smi --showuse --showmemuse -c'

# The GPUs whose "GPU[N] : LABEL: V" rocm-smi line on standard input has V at least MIN and
# at most MAX.
smi_within() { # LABEL MIN MAX
	grep -F ": $1: " | awk -v lo="$2" -v hi="$3" '$NF ~ /^[0-9]+$/ && $NF + 0 >= lo && $NF + 0 <= hi { n++ } END { print n + 0 }'
}

# The GPUs whose GFX Activity accumulator grew from the busy part of LOG to its idle part.
smi_acc_grew() { # LOG
	awk '/^idle$/ { idle = 1 }
		match($0, /^GPU\[[0-9]+\]/) && index($0, ": GFX Activity: ") {
			g = substr($0, 5, RLENGTH - 5)
			if (idle) { if ($NF + 0 > busy[g] + 0) n++ } else busy[g] = $NF
		}
		END { print n + 0 }' "$1"
}

run_rocm_smi_busy() { # PROFILE
	local p=$1 c=rocm-smi-busy-$1 log=$work/rocm-smi-busy-$1.log n=${gpus[$1]} busy idle use mem sclk cus xccs acc want_xccs=0
	emu "$log" "$p" 1 sh -c "$smi_busy_script" ||
		{ result FAIL "$c" "exit $?: $(grep -m 2 -iE 'error|not |fail|did not' "$log" | paste -sd'|'); log ${log#"$top"/}"; return; }
	busy=$(sed '/^idle$/q' "$log") idle=$(sed -n '/^idle$/,$p' "$log")
	use="$(smi_within 'GPU use (%)' 50 100 <<<"$busy")/$(smi_within 'GPU use (%)' 0 5 <<<"$idle")"
	mem="$(smi_within 'GPU Memory Read/Write Activity (%)' 10 100 <<<"$busy")/$(smi_within 'GPU Memory Read/Write Activity (%)' 0 5 <<<"$idle")"
	sclk="$(grep -c ': sclk clock level: 1: ' <<<"$busy")/$(grep -c ': sclk clock level: 0: ' <<<"$idle")"
	cus=$(grep -E '^[0-9]+[[:space:]]+in-flight[[:space:]]' <<<"$busy" | awk '$NF ~ /^[0-9]+$/ && $NF > 0 { n++ } END { print n + 0 }')
	acc=$(smi_acc_grew "$log")
	[ "$p" = mi300x8 ] && want_xccs=$n
	xccs=$(grep -cE ': current_gfxclks \(MHz\): \[2100(, 2100){7}\]$' <<<"$busy")
	if [ "$use" != "$n/$n" ] || [ "$mem" != "$n/$n" ] || [ "$sclk" != "$n/$n" ] || [ "$cus" != "$n" ] ||
		[ "$acc" != "$n" ] || [ "$xccs" != "$want_xccs" ] || ! grep -q '^in-flight: PASSED$' "$log"; then
		result FAIL "$c" "of $n GPUs busy/idle: GPU use $use, memory $mem, sclk level $sclk; $cus with a CU occupancy, $acc whose GFX activity grew, $xccs with every XCC at the top gfxclk (want $want_xccs)$(grep -q '^in-flight: PASSED$' "$log" || echo "; in-flight did not pass"); log ${log#"$top"/}"
	else
		result PASS "$c" "a kernel on each of $n GPUs: rocm-smi showed each >= 50 % busy, memory >= 10 %, sclk at its top level, a CU occupancy$([ "$want_xccs" = 0 ] || echo ", all 8 XCCs at 2100 MHz"); after it, each <= 5 % at level 0 and the GFX activity accumulators grew"
	fi
}

run_hsa() { # CASE PROFILE [--profile-file F]
	local c=$1 p=$2 log=$work/$1.log n
	shift 2
	emu "$log" "$p" "$@" 1 /opt/criu-rocm-tests/hsa-test --cpus "${cpus[$p]}" --gpus "${gpus[$p]}" \
		--gfx "${gfx[$p]}" --vram $((vram_gib[$p] << 30))
	n=$(sed -n 's/^hsa-test: \([0-9]*\) checks passed, 0 failed$/\1/p' "$log")
	if [ -z "$n" ]; then
		result FAIL "$c" "$(grep -m 3 '^FAIL ' "$log" | paste -sd'|'); log ${log#"$top"/}"
	else
		result PASS "$c" "$n checks, $(grep -c '^ok   host -> node [0-9]* -> host: all' "$log") host<->VRAM and $(grep -c '^ok   host -> node [0-9]* -> node' "$log") GPU->GPU SDMA copies verified"
	fi
}

# HIP 6.4 programs on PROFILE, each checking its results on the host.
run_hip() { # CASE PROFILE
	local c=$1 p=$2 prog log isa ok=()
	for prog in "${hip_programs[@]}"; do
		isa=$(sed -n 's|^// hip-test: needs-isa ||p' "$top/test/hip/$prog.hip")
		if [ -n "$isa" ] && [[ " $isa " != *" ${gfx[$p]} "* ]]; then
			ok+=("$prog (not run: needs $isa)")
			continue
		fi
		log=$work/$c-$prog.log
		emu "$log" "$p" 1 "/opt/criu-rocm-tests/hip/$prog" --hold-ms 100
		if ! grep -q "^$prog: PASSED$" "$log"; then
			result FAIL "$c" "$prog on $p: $(grep -v ': ok$' "$log" | head -n 3 | paste -sd'|'); log ${log#"$top"/}"
			return
		fi
		ok+=("$prog ($(grep -c ': ok$' "$log") checks)")
	done
	result PASS "$c" "HIP 6.4 on ${gpus[$p]} ${gfx[$p]}: ${ok[*]}"
}

# waves_saved CDIR PROFILE: the dump saved the waves of a kernel on every GPU of PROFILE
# (kfd-emu's log, one line per queue) and, where a GPU has several XCCs, each queue's on more
# than one of them. Prints what it saw, or why it fails.
waves_saved() {
	local log=$1/emu.log n few xccs
	n=$(grep -ac "resident waves saved into the context save area" "$log")
	if [ "$n" -lt "${gpus[$2]}" ]; then
		echo "kfd-emu saved the waves of $n queue(s), not ${gpus[$2]} (the kernels in flight; ${log#"$top"/})"
		return 1
	fi
	xccs=$(grep -ao "([0-9]* of [0-9]* XCCs saved waves" "$log" | tr -d '(' | awk '{ print $1 "/" $3 }' | sort | uniq -c | awk '{ print $1 " queue(s) " $2 }' | paste -sd,)
	if [ -z "$xccs" ]; then
		# mi300x8's GPUs have 8 XCCs each; the others one.
		[ "$2" != mi300x8 ] || { echo "kfd-emu's log names no XCC that saved waves on $2 (${log#"$top"/})"; return 1; }
		echo "waves saved by $n queues"
		return 0
	fi
	few=$(grep -ao "([0-9]* of [0-9]* XCCs saved waves" "$log" | tr -d '(' | awk '$1 < 2 { n++ } END { print n + 0 }')
	if [ "$few" -gt 0 ]; then
		echo "$few queue(s) saved their waves on one XCC only (${log#"$top"/})"
		return 1
	fi
	echo "waves saved by $n queues, on several XCCs each (XCCs that saved waves/all: $xccs)"
}

# CASE SUPERVISE DUMP_PROFILE RESTORE_PROFILE [--profile-file F]: F makes the restoring host.
run_cr() {
	local c=$1 sup=$2 p1=$3 p2=$4 cdir=$ROOT/tmp/rocm64/$1 img=$work/$1/img why t1 t2
	shift 4
	rm -rf "${cdir:?}" "${work:?}/$c" && mkdir -p "$cdir" "$img"
	t1=$(date +%s%N)
	local level=${KFD_EMU_LOG:-}
	[ "$HIP" = 1 ] && level=info # the log says whose waves the dump saved
	why=$(HIP=$HIP HIP_PROG=${HIP_PROG:-} KFD_EMU_LOG=$level "$KFD_EMU" run --profile "$p1" -- "$here/run.sh" --host-dump "$ROOT" "$cdir" "$img" "$CRIU" "$sup" 2>>"$cdir/emu.log") ||
		{ result FAIL "$c" "on $p1: ${why:-exit $?}; case ${cdir#"$top"/}"; return; }
	t2=$(date +%s%N)
	why=$(HIP=$HIP HIP_PROG=${HIP_PROG:-} "$KFD_EMU" run --profile "$p2" "$@" -- "$here/run.sh" --host-restore "$ROOT" "$cdir" "$img" "$CRIU" "$sup" 2>>"$cdir/emu.log") ||
		{ result FAIL "$c" "on $p2: ${why:-exit $?}; case ${cdir#"$top"/}"; return; }
	if [ "$(cat "$cdir/exit-status" 2>/dev/null)" != 0 ] || ! tail -n 1 "$cdir/t.out" 2>/dev/null | grep -qE ': PASS(ED)?$'; then
		result FAIL "$c" "the restored program did not pass: $(tail -n 3 "$cdir/t.out" "$cdir/t.out.inprogress" 2>/dev/null | paste -sd'|')"
		return
	fi
	local what="ROCr 6.4 process (runtime enabled)" after="a round of new work and its final check passed"
	if [ "$HIP" = 1 ]; then
		what="HIP 6.4 process${HIP_PROG:+ ($HIP_PROG)} with $(grep -m1 -o '^in-flight: [0-9]* GPUs' "$cdir/t.out" | cut -d' ' -f2) kernels in flight"
		why=$(waves_saved "$cdir" "$p1") || { result FAIL "$c" "$why"; return; }
		after="every kernel finished with the host's result; $why"
	fi
	result PASS "$c" "$what dumped on $p1 ($((($(date +%s%N) - t1) / 1000000)) ms all, dump step $(((t2 - t1) / 1000000)) ms), restored on $p2${*:+ ($(basename "${!#}" .toml))}, $after"
}

# The IPC cases: hip-ipc (no C/R), cr-hip-ipc (the exporter dumped and restored on the
# same host), cr-hip-ipc-tree (exporter and importer dumped as one tree and restored).
run_ipc() { # CASE PROFILE
	local c=$1 p=$2 cdir=$ROOT/tmp/rocm64/$1 img=$work/$1/img why ipc=("$KFD_EMU" run --profile "$2" -- "$here/run.sh" --host-ipc "$ROOT")
	# cr-hip-ipc-P-other restores on another host.
	local there=("${ipc[@]}") host=$p
	if [ "${c%-other}" != "$c" ]; then
		there=("$KFD_EMU" run --profile "$p" --profile-file "$top/test/gpu/hosts/$p-other.toml" -- "$here/run.sh" --host-ipc "$ROOT")
		host="another $p ($p-other.toml)"
	fi
	rm -rf "${cdir:?}" "${work:?}/$c" && mkdir -p "$cdir" "$img"
	case $c in
	hip-ipc-*)
		why=$("${ipc[@]}" run "$cdir" "$img" "$CRIU" 2>>"$cdir/emu.log") || { result FAIL "$c" "${why:-exit $?}; case ${cdir#"$top"/}"; return; }
		result PASS "$c" "HIP 6.4 IPC on $p: importers read the exporter's buffer, before and after it wrote it again" ;;
	cr-hip-ipc-tree-killed-*)
		why=$("${ipc[@]}" tree-killed "$cdir" "$img" "$CRIU" 2>>"$cdir/emu.log") || { result FAIL "$c" "${why:-exit $?}; case ${cdir#"$top"/}"; return; }
		result PASS "$c" "restore of HIP 6.4 IPC exporter and importer killed at the importer's import on $p: no task outlived criu or ran its code, the images unchanged; restored again, the importer read and wrote the buffer, the exporter saw the write" ;;
	cr-hip-ipc-tree-*)
		why=$("${ipc[@]}" tree "$cdir" "$img" "$CRIU" 2>>"$cdir/emu.log") || { result FAIL "$c" "${why:-exit $?}; case ${cdir#"$top"/}"; return; }
		result PASS "$c" "HIP 6.4 IPC exporter and importer dumped as one tree and restored on $p: the importer's KFD BO imported again from the exporter's, the importer read and wrote it, the exporter saw the write" ;;
	cr-hip-ipc-*)
		why=$("${ipc[@]}" dump "$cdir" "$img" "$CRIU" 2>>"$cdir/emu.log") || { result FAIL "$c" "on $p: ${why:-exit $?}; case ${cdir#"$top"/}"; return; }
		why=$("${there[@]}" restore "$cdir" "$img" "$CRIU" 2>>"$cdir/emu.log") || { result FAIL "$c" "restored on $host: ${why:-exit $?}; case ${cdir#"$top"/}"; return; }
		result PASS "$c" "HIP 6.4 IPC exporter dumped on $p and restored on $host: its buffer intact, new importers opened its handle and read it, before and after it wrote it again" ;;
	esac
}

mkdir -p "$work"
for c in "${want[@]}"; do
	case $c in
	rocminfo-*) run_rocminfo "${c#rocminfo-}" ;;
	rocm-smi-busy-*) if [ "$hip_built" = 0 ]; then
		result FAIL "$c" "the HIP programs did not build in the chroot: $(tail -n 3 "$top/build/rocm64/hip-programs.log" | paste -sd'|')"
	else
		run_rocm_smi_busy "${c#rocm-smi-busy-}"
	fi ;;
	rocm-smi-live-*) run_rocm_smi_live "${c#rocm-smi-live-}" ;;
	rocm-smi-*) run_rocm_smi "${c#rocm-smi-}" ;;
	hsa-*-kfd1.16)
		p=${c#hsa-} && p=${p%-kfd1.16}
		echo "kfd_minor_version = 16" >"$work/kfd1.16.toml"
		run_hsa "$c" "$p" --profile-file "$work/kfd1.16.toml"
		;;
	hsa-*) run_hsa "$c" "${c#hsa-}" ;;
	cr-same) run_cr "$c" 0 mi100 mi100 ;;
	cr-other) run_cr "$c" 0 mi100 mi100x2 --profile-file "$top/test/gpu/hosts/mi100x2-one-gpu.toml" ;;
	cr-mi210x4 | cr-mi300x8) run_cr "$c" 1 "${c#cr-}" "${c#cr-}" ;;
	cr-mi250x8-other) run_cr "$c" 1 mi250x8 mi250x8 --profile-file "$top/test/gpu/hosts/mi250x8-hives-swapped.toml" ;;
	hip-ipc-* | cr-hip-ipc-*) if [ "$hip_built" = 0 ]; then
		result FAIL "$c" "the HIP programs did not build in the chroot: $(tail -n 3 "$top/build/rocm64/hip-programs.log" | paste -sd'|')"
	else
		p=${c%-other} && run_ipc "$c" "${p##*-}"
	fi ;;
	hip-* | cr-hip-*) if [ "$hip_built" = 0 ]; then
		result FAIL "$c" "the HIP programs did not build in the chroot: $(tail -n 3 "$top/build/rocm64/hip-programs.log" | paste -sd'|')"
	elif [ "${c#cr-}" = "$c" ]; then
		run_hip "$c" "${c#hip-}"
	elif [ "${c#cr-hip-o0-}" != "$c" ]; then
		HIP=1 HIP_PROG=in-flight-o0 run_cr "$c" 1 "${c#cr-hip-o0-}" "${c#cr-hip-o0-}"
	elif [ "${c%-other}" != "$c" ]; then
		p=${c#cr-hip-} && p=${p%-other}
		HIP=1 run_cr "$c" 1 "$p" "$p" --profile-file "$top/test/gpu/hosts/$p-other.toml"
	else
		HIP=1 run_cr "$c" 1 "${c#cr-hip-}" "${c#cr-hip-}"
	fi ;;
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
