#!/usr/bin/env bash
# Checkpoint/restore of real ROCm processes (issue 12): Debian's libhsakmt and ROCr 5.2,
# unchanged, in programs checkpointed mid-work by criu-rocm with no extra options and
# restored on the same emulated host, on hosts with other gpu_ids, render minors and GPU
# order, and across swapped XGMI hives; five cycles in a row; a tree of two processes.
#
#   usage: test/rocm/cr.sh CRIU_BINARY [CASE...]      (as root; `make test-rocm-cr` runs it)
#          test/rocm/cr.sh --list
#   env:   CARGO_TARGET_DIR      where kfd-emu was built (default rust/target)
#          ROCM_CR_TIMEOUT=S     seconds one case may take (default 300)
#          ROCM_CR_KEEP=1        keep the work directory even when everything passed
#
# The programs are criu-rocm's zdtm tests on ROCm (test/zdtm/static/gpu_hsakmt_*,
# gpu_rocr_*; the comment at the top of each says what it holds), built in the patched
# CRIU tree with ZDTM_ROCM=1 and run here on their own (--pidfile, --outfile), which is
# how zdtm.py starts them too. Besides zdtm's SIGTERM (check, then end) they answer
# SIGUSR1 with a round: check everything, run new work (allocations, copies, frees),
# write "round N: ok". A case:
#   * starts the program on an emulated host (`kfd-emu run`) and lets it get going;
#   * dumps it with `criu-rocm dump -t PID` (nothing else: no --link-remap, no
#     --shell-job, no --ext-*), which kills it;
#   * restores it (`criu-rocm restore -d`) on the same host or on another one; a host
#     other than the dump host starts with an empty /dev/shm, as a machine where no ROCm
#     process ran, so libhsakmt's shared memory and semaphore must be recreated;
#   * asks for a round, and checks it said ok (in each process of a tree);
#   * for several cycles, dumps again and restores on the next host;
#   * at last sends SIGTERM: the program checks once more, runs new work, frees
#     everything, shuts its runtime down, writes PASS and must exit with status 0.
# Every host step runs in a private mount namespace with its own /dev/shm, so nothing
# here touches the machine's /dev/shm (other ROCm programs may use it meanwhile).
#
# Each case prints PASS, FAIL (with the reason and its directory) or SKIP (with the
# reason: ROCr 5.2 cannot run on the mi300x8 machine); the last line is exactly
# "N passed, M failed" (", K skipped" when some were). Non-zero exit on any failure.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, known_bug, on, cases_dispatch; alive, wait_gone, ... (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"

HOSTS=$top/test/gpu/hosts
ROCR_TESTS="gpu_rocr_idle gpu_rocr_buffers gpu_rocr_stream gpu_rocr_wait gpu_rocr_tree"
HSAKMT_TESTS="gpu_hsakmt_idle gpu_hsakmt_buffers gpu_hsakmt_maps"
# Same words as test/rocm/run.sh's reason for skipping ROCr there.
MI300X8_ROCR="ROCr 5.2 cannot run on an MI300X machine: it asserts that a CPU node's memory fits in 1 TiB (amd_memory_region.cpp:153) and each of mi300x8's 2 CPU nodes has 1152 GiB; past that its ISA registry has no gfx942"

# ---------------------------------------------------------------------------------------
# Emulated hosts

# `on PROFILE [--profile-file F] -- FUNCTION [ARG...]` (scripts/lib/cases.sh) runs FUNCTION
# of this script on a new emulated host, here in a private mount namespace with an empty
# /dev/shm of its own (cases_host_setup).
CASES_ON_WRAP=(unshare --mount --propagation private)
cases_host_setup() {
	# A host of its own: an empty /dev/shm (this runs in a private mount namespace).
	mount -t tmpfs -o mode=1777,size=64m rocm-cr-shm /dev/shm || fail "cannot mount a private /dev/shm"
}

# The options of a host given as an override of the profile: a name in test/gpu/hosts, or
# a path.
other() {
	case $1 in
	*/*) echo "--profile-file $1" ;;
	*) echo "--profile-file $HOSTS/$1.toml" ;;
	esac
}

# ---------------------------------------------------------------------------------------
# The program under test (inside a host)

OUT() { echo "$CASE_DIR/t.out"; }
# Its output so far (zdtm writes OUTFILE.inprogress until the program ends).
out_now() { cat "$(OUT).inprogress" "$(OUT)" 2>/dev/null; }
# Its FAIL and ERR lines, or its last lines, for a reason.
out_reason() {
	local l
	l=$(out_now | grep -E ' (FAIL|ERR): ' | head -n 3 | sed 's/^[0-9:.]*: *[0-9]*: //' | cut -c1-300 | paste -sd'|')
	[ -n "$l" ] || l=$(out_now | tail -n 3 | cut -c1-200 | paste -sd'|')
	echo "${l:-no output}"
}

# t_start TEST: starts the program, as zdtm.py does (it daemonizes once its state is ready).
t_start() {
	local test=$1
	echo "$test" >"$CASE_DIR/test"
	"$STATIC/$test" --pidfile="$CASE_DIR/t.pid" --outfile="$(OUT)" >>"$CASE_DIR/start.log" 2>&1 ||
		fail "$test did not get ready: $(out_reason)"
	T_PID=$(cat "$CASE_DIR/t.pid")
	alive "$T_PID" || fail "$test ($T_PID) is gone right after it got ready: $(out_reason)"
}

t_pid() { T_PID=$(cat "$CASE_DIR/t.pid"); }

# Processes of the program (a tree has two).
t_procs() { if grep -q 'and child [0-9]*:' <(out_now); then echo 2; else echo 1; fi; }

# t_dump N: `criu-rocm dump -t PID` into img-N; the program must be gone afterwards.
t_dump() {
	local img=$CASE_DIR/img-$1 t0
	mkdir -p "$img"
	t0=${EPOCHREALTIME/./}
	"$CRIU" dump -t "$T_PID" -D "$img" -o dump.log -v4 >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "dump $1 of $T_PID failed: $(log_errors "$img/dump.log")"
	echo "dump $1: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	wait_gone "$T_PID" 10 || fail "dump $1: $T_PID still runs after the dump"
	ls "$img"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "dump $1 wrote no amdgpu-kfd-*.img"
	pending_sdma "$img" >"$img/pending"
}

# t_restore N: `criu-rocm restore -d` of img-N; the program must run again. With
# --restore-sibling it becomes a child of this shell, which collects its exit status.
t_restore() {
	local img=$CASE_DIR/img-$1 t0
	t0=${EPOCHREALTIME/./}
	"$CRIU" restore -D "$img" -o "restore.log" -v4 -d --restore-sibling >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "restore $1 of $T_PID failed: $(log_errors "$img/restore.log")"
	echo "restore $1: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	alive "$T_PID" || fail "restore $1: $T_PID does not run: $(out_reason)"
	grep -aq "amdgpu: pid .*: GPU queues resumed" "$img/restore.log" ||
		fail "restore $1: the log says no GPU queues were resumed"
	grep -a -m1 -o 'amdgpu: pid [0-9]*: GPU 0x.* -> host GPU .*' "$img/restore.log" |
		sed 's/^amdgpu: pid [0-9]*: //' >"$img/mapping"
}

# t_round N: SIGUSR1 to the program's process group; each process must say round N ok.
t_round() {
	local n=$1 procs i got bad
	procs=$(t_procs)
	kill -USR1 -- "-$T_PID" 2>/dev/null || fail "round $n: cannot signal $T_PID"
	for ((i = 0; i < 1800; i++)); do
		got=$(out_now | grep -cE ": round $n( \([a-z]+\))?: (ok|FAIL)$")
		[ "$got" -ge "$procs" ] && break
		alive "$T_PID" || break
		sleep 0.1
	done
	bad=$(out_now | grep -cE ": round $n( \([a-z]+\))?: FAIL$")
	[ "$got" -ge "$procs" ] || fail "round $n: $got of $procs process(es) answered in 180 s: $(out_reason)"
	[ "$bad" = 0 ] || fail "round $n failed: $(out_reason)"
}

# t_finish: SIGTERM to the restored program (a child of this shell thanks to
# --restore-sibling), upon which it checks once more and ends; its exit status into
# $CASE_DIR/exit-status. Ends the host step.
t_finish() {
	exec /usr/bin/python3 "$top/scripts/lib/stop_and_reap.py" 180 program "$T_PID" "$CASE_DIR/exit-status"
}

# After the last host step: the program passed, wrote no FAIL and exited with status 0.
t_passed() {
	local st
	st=$(cat "$CASE_DIR/exit-status" 2>/dev/null) || fail "no exit status: $(cat "$CASE_DIR/reason" 2>/dev/null)"
	[ -f "$(OUT)" ] || fail "the program did not finish its output (exit status $st): $(out_reason)"
	if grep -qE ' (FAIL|ERR): ' "$(OUT)"; then
		fail "the program failed after the last restore (exit status $st): $(out_reason)"
	fi
	tail -n 1 "$(OUT)" | grep -q ': PASS$' || fail "the program's last line is not PASS (exit status $st): $(out_reason)"
	[ "$st" = 0 ] || fail "the program wrote PASS but exited with status $st"
}

# The SDMA queues of the images that held packets not yet executed at the dump, read from
# kfd-emu's MQDs in KFD's private data ("KEMQ", version 1, read and write pointers): the
# emulator's record of where each ring was. Prints "PENDING TOTAL".
pending_sdma() {
	/usr/bin/python3 - "$1" <<'EOF'
import glob, struct, sys
pending = total = 0
for path in glob.glob(sys.argv[1] + "/amdgpu-kfd-*.img"):
    data = open(path, "rb").read()
    at = data.find(b"KEMQ")
    while at >= 0:
        if at + 24 <= len(data):
            version, rptr, wptr = struct.unpack_from("<IQQ", data, at + 4)
            if version == 1:
                total += 1
                pending += wptr > rptr
        at = data.find(b"KEMQ", at + 4)
print(pending, total)
EOF
}

# ---------------------------------------------------------------------------------------
# Case shapes

# Starts TEST, lets it work for a while, dumps it.
start_dump() { # TEST
	t_start "$1"
	sleep "${SETTLE:-1}"
	t_dump 1
}

# Restores dump N, runs a round, and then either dumps N+1 or finishes. On a host whose
# /dev/shm lacks libhsakmt's files (any host but the dump host), the restore must recreate
# both and say so; where they exist, it must leave them alone.
restore_round() { # N LAST(0/1)
	local fresh=0 log
	t_pid
	[ -e /dev/shm/hsakmt_shared_mem ] || fresh=1
	t_restore "$1"
	log=$CASE_DIR/img-$1/restore.log
	if [ "$fresh" = 1 ]; then
		if ! grep -aq 'hsakmt_shared_mem was missing: recreated' "$log" ||
			! grep -aq 'sem.hsakmt_semaphore was missing: recreated' "$log"; then
			fail "restore $1 on a host without libhsakmt's /dev/shm files did not say it recreated both"
		fi
		if [ ! -e /dev/shm/hsakmt_shared_mem ] || [ ! -e /dev/shm/sem.hsakmt_semaphore ]; then
			fail "restore $1: libhsakmt's /dev/shm files are still missing"
		fi
		echo "restore $1" >>"$CASE_DIR/recreated"
	elif grep -aq 'was missing: recreated' "$log"; then
		fail "restore $1 recreated libhsakmt's /dev/shm files although they were there"
	fi
	t_round "$1"
	if [ "$2" = 1 ]; then
		t_finish
	else
		t_dump $(($1 + 1))
	fi
}

# Same host: everything inside one emulated host (its /dev/shm stays).
same_host() { # TEST
	t_start "$1"
	sleep "${SETTLE:-1}"
	t_dump 1
	restore_round 1 1
}

# cross PROFILE DUMP_OVERRIDE RESTORE_OVERRIDE TEST: dumped on one host, restored on another.
cross() {
	local prof=$1 from=$2 to=$3 test=$4
	# shellcheck disable=SC2046 # the override is words
	on "$prof" $([ -n "$from" ] && other "$from") -- start_dump "$test"
	# shellcheck disable=SC2046
	on "$prof" $([ -n "$to" ] && other "$to") -- restore_round 1 1
	t_passed
	describe
}

# cycles PROFILE A B N TEST: dumped on host A, restored on B, A, B, ... N times.
cycles() {
	local prof=$1 a=$2 b=$3 n=$4 test=$5 i host
	# shellcheck disable=SC2046
	on "$prof" $([ -n "$a" ] && other "$a") -- start_dump "$test"
	for ((i = 1; i <= n; i++)); do
		if [ $((i % 2)) = 1 ]; then host=$b; else host=$a; fi
		# shellcheck disable=SC2046
		on "$prof" $([ -n "$host" ] && other "$host") -- restore_round "$i" "$([ "$i" = "$n" ] && echo 1 || echo 0)"
	done
	t_passed
	describe
}

same() { # PROFILE TEST
	on "$1" -- same_host "$2"
	t_passed
	describe
}

# Notes for a passing case: rounds, dump/restore times, GPU mappings, pending SDMA work.
describe() {
	local d m p rounds
	rounds=$(grep -cE ': round [0-9]+( \([a-z]+\))?: ok$' "$(OUT)")
	note "$(sed -n 's/^[0-9:.]*: *[0-9]*: //p' "$(OUT)" | head -n 1)"
	note "$rounds round(s) ok after restores; $(paste -sd' ' "$CASE_DIR/times" | sed 's/: /=/g; s/ ms/ms/g')"
	[ -f "$CASE_DIR/recreated" ] &&
		note "libhsakmt's /dev/shm files recreated at: $(paste -sd, "$CASE_DIR/recreated" | sed 's/,/, /g')"
	for d in "$CASE_DIR"/img-*; do
		m=$(cat "$d/mapping" 2>/dev/null)
		p=$(cat "$d/pending" 2>/dev/null)
		note "${d##*/}: SDMA queues with packets pending at the dump: ${p% *} of ${p#* }${m:+; restored $m}"
	done
}

# The gated copies of gpu_rocr_wait must be in flight in every dump: each GPU's queue
# holds its POLL_REGMEM and copy unexecuted.
all_pending() {
	local d p
	for d in "$CASE_DIR"/img-*; do
		p=$(cat "$d/pending")
		[ "${p% *}" -ge "$1" ] || fail "${d##*/}: only ${p% *} of ${p#* } SDMA queues held pending packets at the dump, want $1 (the gated copies)"
	done
}

rocr_skip() { # PROFILE
	[ "$1" = mi300x8 ] && skip "$MI300X8_ROCR"
}

# ---------------------------------------------------------------------------------------
# Cases: case_NAME() { ...; }, run in this order.

# libhsakmt
case_hsakmt_idle_same_host() { same mi100x2 gpu_hsakmt_idle; }
case_hsakmt_idle_other_host() { cross mi100x2 "" mi100x2-other gpu_hsakmt_idle; }
case_hsakmt_idle_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_hsakmt_idle; }
case_hsakmt_idle_mi300x8() { same mi300x8 gpu_hsakmt_idle; }
case_hsakmt_buffers_same_host() { same mi210x4 gpu_hsakmt_buffers; }
case_hsakmt_buffers_other_host() { cross mi100x2 "" mi100x2-other gpu_hsakmt_buffers; }
case_hsakmt_buffers_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_hsakmt_buffers; }
case_hsakmt_buffers_mi300x8() { same mi300x8 gpu_hsakmt_buffers; }
case_hsakmt_buffers_five_cycles() { cycles mi100x2 "" mi100x2-other 5 gpu_hsakmt_buffers; }
# 60000 mappings (issue 25): a memory map of 1.8 MB, which the validation refused after a
# dump that had killed the process.
case_hsakmt_maps_same_host() { same mi100 gpu_hsakmt_maps; }

# libhsakmt removes /dev/shm/hsakmt_shared_mem (and its semaphore) whenever one of its
# processes closes KFD, whatever others still map it. Another ROCm program on the machine
# that ended while a restore ran, between the restore's check that the file is there (when
# the task's /dev/kfd is restored) and CRIU's opening of it by path (libhsakmt's fd on it,
# a higher number than /dev/kfd's, then its mapping in open_vmas), made the restore fail:
# zdtm's gpu_rocr_tree, once, on the machine's shared /dev/shm. The restore now holds the
# file it checked or made and CRIU opens that one (patch 0081). Here, all through the
# restore, the file is removed again and again, as ROCm programs ending one after the other
# remove it: the restore must succeed, CRIU must have opened the held file, and the program
# run on. (A restored task cannot be stopped at that point instead: CRIU fails a restore
# whose task stops.)
case_hsakmt_idle_shm_removed_mid_restore() {
	on mi100 -- shm_removed_mid_restore gpu_hsakmt_idle
	t_passed
}
shm_removed_mid_restore() { # TEST
	local img=$CASE_DIR/img-1 cpid rpid st=0
	t_start "$1"
	sleep "${SETTLE:-1}"
	t_dump 1
	"$CRIU" restore -D "$img" -o restore.log -v4 -d --restore-sibling >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	/usr/bin/python3 -c '
import os
while True:
    try:
        os.unlink("/dev/shm/hsakmt_shared_mem")
    except FileNotFoundError:
        pass' &
	rpid=$!
	wait "$cpid" || st=$?
	kill "$rpid"
	wait "$rpid" 2>/dev/null
	[ "$st" = 0 ] || fail "the restore failed while the file was being removed:" \
		"$(grep -a -m1 -o "Can't open file .* on restore.*" "$img/restore.log" || log_errors "$img/restore.log")"
	grep -aq "Opening dev/shm/hsakmt_shared_mem through the GPU restore's fd" "$img/restore.log" ||
		fail "CRIU opened libhsakmt's shared memory by its name, not through the file the restore checked ($img/restore.log)"
	alive "$T_PID" || fail "the restored program $T_PID does not run: $(out_reason)"
	t_round 1
	t_finish
}

# ROCr
case_rocr_idle_same_host() { same mi100x2 gpu_rocr_idle; }
case_rocr_idle_other_host() { cross mi100x2 "" mi100x2-other gpu_rocr_idle; }
case_rocr_idle_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_rocr_idle; }
case_rocr_buffers_same_host() { same mi210x4 gpu_rocr_buffers; }
case_rocr_buffers_other_host() { cross mi100x2 "" mi100x2-other gpu_rocr_buffers; }
case_rocr_buffers_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_rocr_buffers; }
case_rocr_stream_same_host() { same mi210x4 gpu_rocr_stream; }
case_rocr_stream_other_host() { cross mi100x2 "" mi100x2-other gpu_rocr_stream; }
case_rocr_stream_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_rocr_stream; }
case_rocr_stream_five_cycles() { cycles mi100x2 "" mi100x2-other 5 gpu_rocr_stream; }
case_rocr_wait_same_host() {
	same mi100x2 gpu_rocr_wait
	all_pending 2
}
case_rocr_wait_other_host() {
	cross mi210x4 "" "$top/test/demo/restore-host.toml" gpu_rocr_wait
	all_pending 4
}
case_rocr_wait_hives_swapped() {
	cross mi250x8 "" mi250x8-hives-swapped gpu_rocr_wait
	all_pending 8
}
case_rocr_wait_five_cycles() {
	cycles mi100x2 "" mi100x2-other 5 gpu_rocr_wait
	all_pending 2
}
case_rocr_tree_same_host() { same mi100x2 gpu_rocr_tree; }
case_rocr_tree_other_host() { cross mi100x2 "" mi100x2-other gpu_rocr_tree; }
case_rocr_tree_hives_swapped() { cross mi250x8 "" mi250x8-hives-swapped gpu_rocr_tree; }
case_rocr_tree_five_cycles() { cycles mi100x2 "" mi100x2-other 5 gpu_rocr_tree; }

# Both processes of the tree map libhsakmt's semaphore and shared memory, each file recorded
# once for both, and each process opens its mappings of them through the file its own GPU
# restore held (patch 0081), in parallel with the other. CRIU keeps its record of a regular
# file in memory all restored tasks share: the open through a held fd once changed the
# record's name to one on the task's own stack for the length of the open, and the other
# process, opening the same file in that window, opened that garbage and failed ("Can't open
# vma", once in CI at the first restore of rocr_tree_five_cycles). Here each task waits
# HELD_OPEN_DELAY_MS right before each open through a held fd
# (CRIU_ROCM_TEST_HELD_OPEN_DELAY_MS, a hook for tests only), which holds such a window open:
# the two processes' opens of the semaphore must overlap (else the case fails: it could not
# have seen the race), the restore must succeed and both processes run on.
HELD_OPEN_DELAY_MS=500
case_rocr_tree_held_files_opened_at_once() {
	on mi100x2 -- start_dump gpu_rocr_tree
	# shellcheck disable=SC2046 # the override is words
	on mi100x2 $(other mi100x2-other) -- held_files_opened_at_once
	t_passed
	describe
}
held_files_opened_at_once() {
	local log=$CASE_DIR/img-1/restore.log opens gap
	t_pid
	CRIU_ROCM_TEST_HELD_OPEN_DELAY_MS=$HELD_OPEN_DELAY_MS t_restore 1
	# Each process' line "(SS.UUUUUU)    PID: Opening dev/shm/sem.hsakmt_semaphore through
	# the GPU restore's fd N of it" as "PID MICROSECONDS" (its wait comes right after it).
	opens=$(grep -a "Opening dev/shm/sem.hsakmt_semaphore through the GPU restore's fd" "$log" |
		sed -n 's/^(\([0-9]*\)\.\([0-9]*\)) *\([0-9]*\): .*/\3 \1\2/p' | sort -u -k1,1n)
	[ "$(wc -l <<<"$opens")" = 2 ] ||
		fail "both processes of the tree must open their mapping of libhsakmt's semaphore through a held fd; the log ($log) has: $(paste -sd, <<<"$opens")"
	gap=$(awk 'NR == 1 { a = $2 } NR == 2 { d = $2 - a; print d < 0 ? -d : d }' <<<"$opens")
	[ "$gap" -lt $((HELD_OPEN_DELAY_MS * 1000)) ] ||
		fail "the two processes opened libhsakmt's semaphore $gap us apart, more than the $HELD_OPEN_DELAY_MS ms each waited: the opens did not overlap ($log)"
	note "the two processes' opens of libhsakmt's semaphore through held fds overlapped: $((gap / 1000)) ms apart, each waiting $HELD_OPEN_DELAY_MS ms"
	t_round 1
	t_finish
}
case_rocr_mi300x8() {
	rocr_skip mi300x8
	same mi300x8 gpu_rocr_buffers
}

# ---------------------------------------------------------------------------------------
# The driver

ordered_cases() { grep -o '^case_[a-z0-9_]*()' "$self" | sed 's/^case_//; s/()$//'; }

# Builds the programs in the CRIU tree (zdtm's library first), from this checkout's sources.
build_tests() {
	local f log=$WORK/build.log
	for f in "$top"/test/zdtm/static/*; do
		cmp -s "$f" "$STATIC/$(basename "$f")" || cp "$f" "$STATIC/"
	done
	# shellcheck disable=SC2086,SC2016 # lists of names; expanded by the inner sh
	if ! flock "$TREE/../.tree.lock" sh -c 'make -s -j2 -C "$1/test/zdtm/lib" && shift && ZDTM_ROCM=1 make -s -j2 -C "$@"' \
		sh "$TREE" "$STATIC" $HSAKMT_TESTS $ROCR_TESTS >"$log" 2>&1; then
		tail -n 20 "$log" >&2
		echo "test/rocm/cr.sh: building the programs failed (log: $log)" >&2
		exit 2
	fi
}

preflight() {
	local c
	[ "$(id -u)" = 0 ] || { echo "test/rocm/cr.sh: needs root (kfd-emu mounts FUSE nodes, CRIU needs CAP_SYS_ADMIN)" >&2; exit 2; }
	for c in "$CRIU" "$KFD_EMU"; do
		[ -x "$c" ] || { echo "test/rocm/cr.sh: $c is missing (make test-rocm-cr builds it)" >&2; exit 2; }
	done
	for c in unshare timeout flock /usr/bin/python3; do
		command -v "$c" >/dev/null || { echo "test/rocm/cr.sh: $c is missing (scripts/install-deps.sh)" >&2; exit 2; }
	done
	if [ ! -f /usr/include/hsakmt.h ] || [ ! -f /usr/include/hsa/hsa.h ]; then
		echo "test/rocm/cr.sh: Debian's libhsakmt-dev and libhsa-runtime-dev are missing (scripts/install-deps.sh)" >&2
		exit 2
	fi
	[ -f "$TREE/test/zdtm/static/Makefile" ] ||
		{ echo "test/rocm/cr.sh: no patched CRIU tree at $TREE (run make)" >&2; exit 2; }
}

main() {
	cases_select test/rocm/cr.sh "$@"
	WORK=$(mktemp -d /tmp/criu-rocm-rocm-cr.XXXXXX)
	export WORK
	build_tests
	echo "ROCm C/R tests: ${#WANTED[@]} case(s), criu-rocm $CRIU, libhsakmt $(dpkg-query -W -f='${Version}' libhsakmt1 2>/dev/null)," \
		"ROCr $(dpkg-query -W -f='${Version}' libhsa-runtime64-1 2>/dev/null); work directory $WORK"
	cases_run_all "${ROCM_CR_KEEP:-}"
}

cases_dispatch "$@"
CRIU=$(realpath "$1")
shift
KFD_EMU=${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu
CASE_TIMEOUT=${ROCM_CR_TIMEOUT:-300}
CRIU_VERSION=$(sed -n 's/^CRIU_VERSION=//p' "$top/criu/upstream.lock")
TREE=$top/build/criu-$CRIU_VERSION
STATIC=$TREE/test/zdtm/static
export CRIU KFD_EMU CASE_TIMEOUT TREE STATIC
preflight
exec unshare --pid --fork --mount-proc --kill-child "$self" __main "$@"
