#!/usr/bin/env bash
# Checkpoint/restore of HIP programs (issue 27): Debian's hipcc and HIP 5.2, unchanged, on
# kfd-emu's shader engine, dumped by criu-rocm with no extra options and restored on the
# same emulated host and on hosts with other gpu_ids, render minors and GPU order.
#
#   usage: test/hip-cr/run.sh CRIU_BINARY [CASE...]    (as root; `make test-hip-cr` runs it)
#          test/hip-cr/run.sh --list
#   env:   CARGO_TARGET_DIR      where kfd-emu was built (default rust/target)
#          HIP_CR_TIMEOUT=S      seconds one case may take (default 400)
#          HIP_CR_KEEP=1         keep the work directory (build/hip-cr/work.*) even when
#                                everything passed
#
# The programs, built as test/hip builds its own (test/hip/build.sh, into build/hip and
# build/hip-cr):
#   * test/hip/mlp.hip: a small MLP trained with SGD (--steps N --delay-ms MS --hold-at
#     STEPS --checksum --once). After the restore it trains on to the end; every step's
#     loss (its bits) and the final weights' checksum must equal those of an uninterrupted
#     run on the same GPU ISA.
#   * test/hip-cr/hold.hip: holds HIP state (device buffers, hipHostMalloc and
#     hipHostRegister memory, streams with events, peer access, a kernel spinning on every
#     GPU; a forked child) and answers SIGUSR1 with a round (what it holds is intact, the
#     spinners end when released, new kernels on every GPU and stream work) and SIGTERM
#     with a last round and its exit.
#   * test/hip-cr/busy.hip: a kernel on every GPU that computes (registers, LDS, barriers)
#     until SIGTERM; then every value is checked against the host's.
#   * test/hip-cr/cu-mask.hip: a stream with a CU mask (hipExtStreamCreateWithCUMask: ROCr's
#     hsa_amd_queue_cu_set_mask) whose kernel's waves record their HW_ID and hold; then
#     every wave must have run on the mask's one CU, no more resident at once than it holds.
#   * test/hip-cr/wait-value.hip: on every GPU a stream held by hipStreamWaitValue32 (HIP
#     5.2's wait kernel spins on a host word) and one waiting for its event, until SIGTERM;
#     then what ran behind the waits is checked.
# Dumps between kernels: hold is dumped while it waits for a signal; mlp is stopped
# (SIGSTOP) while it sleeps between two steps and dumped stopped, so that a slow dump cannot
# run into the next step; CRIU restores it stopped and the case continues it. Dumps with
# kernels in flight (the *_in_flight cases, hold --spin, busy, wait-value): mlp --hold-at
# holds a step's forward/backward kernel mid-way (its waves wait at a gate in host memory,
# holding their activations) and is dumped then, running; after the restore SIGUSR1 lets
# the kernel go on. Each such dump must have saved the waves of as many queues as the case
# has kernels in flight (kfd-emu's log, KFD_EMU_LOG=info); the programs count their waves
# in, so a kernel started over instead of resumed fails too. A dump is never retried: a
# failed dump fails the case. kill_in_flight dumps nothing: busy killed with its kernels
# running must leave no ERROR line in kfd-emu's log, and the daemon serves the next process.
#
# Every host step runs in a private mount namespace with its own /dev/shm (libhsakmt's
# files), as test/rocm/cr.sh's do, and its own /tmp; a host other than the dump host starts
# with both empty. The work directory is build/hip-cr/work.XXXXXX.
# After every restore: each dumped process's KFD image was restored exactly once, by the
# process of its pid, with as many queue/event objects as the dump paused (HIP's internal
# streams, signals and save areas come back once, into the right task).
#
# Each case prints PASS (with notes), FAIL (with the reason and its directory) or SKIP
# (with the reason); the last line is exactly "N passed, M failed" (", K skipped" when
# some were). Non-zero exit on any failure.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, on, cases_dispatch; alive, wait_gone, log_errors (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"
# hip_build
# shellcheck source=SCRIPTDIR/../hip/build.sh
. "$top/test/hip/build.sh"

HOSTS=$top/test/gpu/hosts
DEMO_OTHER=$top/test/demo/restore-host.toml
declare -A GFX=([mi100]=gfx908 [mi100x2]=gfx908 [mi210x4]=gfx90a [mi250x8]=gfx90a)
# mlp: steps (a case may export another number for its host steps), the pause between
# steps (ms), the step after which it is dumped.
MLP_STEPS=${MLP_STEPS:-10} MLP_DELAY=300 MLP_AT=3

# ---------------------------------------------------------------------------------------
# Emulated hosts

# `on PROFILE [--profile-file F] -- FUNCTION [ARG...]` (scripts/lib/cases.sh): FUNCTION on
# a new emulated host, in a private mount namespace with an empty /dev/shm and an empty /tmp
# (HIP's code object manager keeps deleted files open there, which CRIU saves as ghost
# files and recreates at the restore). What the run needs from under /tmp (a checkout
# there, as a CI's may be: the scripts, builds and the work directory) stays visible in
# the new /tmp, bound back at its own path (through an fd opened before: mount must not
# canonicalize /proc/self/fd/N, which would name the new, empty directory).
CASES_ON_WRAP=(unshare --mount --propagation private)
cases_host_setup() {
	mount -t tmpfs -o mode=1777,size=64m hip-cr-shm /dev/shm || fail "cannot mount a private /dev/shm"
	local keep=() fds=() p fd i
	for p in "$top" "${CARGO_TARGET_DIR:-}" "$(dirname "${CRIU:-/}")"; do
		case $p in
		/tmp/*) exec {fd}<"$p" || fail "cannot open $p"; keep+=("$p") fds+=("$fd") ;;
		esac
	done
	mount -t tmpfs -o mode=1777,size=256m hip-cr-tmp /tmp || fail "cannot mount a private /tmp"
	for i in "${!keep[@]}"; do
		mkdir -p "${keep[$i]}" && mount --no-canonicalize --bind "/proc/self/fd/${fds[$i]}" "${keep[$i]}" ||
			fail "cannot keep ${keep[$i]} in the private /tmp"
		fd=${fds[$i]}
		exec {fd}<&-
	done
}

other() { # NAME (test/gpu/hosts) or PATH: the options of that host override
	case $1 in
	*/*) echo "--profile-file $1" ;;
	*) echo "--profile-file $HOSTS/$1.toml" ;;
	esac
}

# ---------------------------------------------------------------------------------------
# The programs (inside a host). Process K's pid is in $CASE_DIR/pK.pid, its output in
# pK.out (stdout) and pK.err (stderr).

# p_start K BIN ARG...: starts a program in a session of its own (CRIU dumps a whole
# session, no --shell-job).
p_start() {
	local k=$1
	shift
	setsid "$@" </dev/null >"$CASE_DIR/p$k.out" 2>"$CASE_DIR/p$k.err" &
	echo $! >"$CASE_DIR/p$k.pid"
}
p_pid() { cat "$CASE_DIR/p$1.pid"; }
p_out() { cat "$CASE_DIR/p$1.out" 2>/dev/null; }
p_reason() { # K: its last lines, for a reason
	local l
	l=$(grep -ahE 'FAIL|rror' "$CASE_DIR/p$1.out" "$CASE_DIR/p$1.err" 2>/dev/null | head -n 3 | cut -c1-300 | paste -sd'|')
	[ -n "$l" ] || l=$(tail -q -n 2 "$CASE_DIR/p$1.out" "$CASE_DIR/p$1.err" 2>/dev/null | cut -c1-200 | paste -sd'|')
	echo "${l:-no output}"
}

# p_wait K REGEX COUNT WHAT: waits (up to 120 s) until COUNT lines of process K's output
# match REGEX.
p_wait() {
	local k=$1 re=$2 n=$3 what=$4 i pid
	pid=$(p_pid "$k")
	for ((i = 0; i < 1200; i++)); do
		[ "$(p_out "$k" | grep -cE -- "$re")" -ge "$n" ] && return 0
		alive "$pid" || break
		sleep 0.1
	done
	[ "$(p_out "$k" | grep -cE -- "$re")" -ge "$n" ] && return 0
	fail "process $k ($pid): $what did not come: $(p_reason "$k")"
}

# hold_round K: SIGUSR1 to process K's session; each of its processes must say its next
# round is ok.
hold_round() {
	local k=$1 r n
	n=$(p_out "$k" | grep -cE '^hold( \(child\))?: ready')
	r=$(($(p_out "$k" | grep -cE '^hold: round [0-9]+: ') + 1))
	kill -USR1 -- "-$(p_pid "$k")" || fail "round $r: cannot signal process $k"
	p_wait "$k" "^hold( \(child\))?: round $r: " "$n" "round $r"
	if p_out "$k" | grep -qE "^hold( \(child\))?: round $r: FAIL"; then
		fail "process $k: round $r failed: $(p_out "$k" | grep -E "round $r: FAIL" | head -n 1)"
	fi
}

# mlp_paused K STEP: waits for mlp's line of STEP and then until its main thread sleeps
# after it (clock_nanosleep, syscall 230 on x86_64), and stops it there (SIGSTOP): no
# kernel is in flight, and none starts however long the dump takes to freeze it. CRIU
# restores it stopped; mlp_go continues it.
mlp_paused() {
	local k=$1 step=$2 pid i last
	pid=$(p_pid "$k")
	p_wait "$k" "^mlp: step $step loss" 1 "step $step"
	for ((i = 0; i < 200; i++)); do
		case $(cat "/proc/$pid/syscall" 2>/dev/null) in 230\ *) break ;; esac
		sleep 0.01
	done
	[ $i -lt 200 ] || fail "mlp ($pid) did not sleep after step $step"
	kill -STOP "$pid"
	for ((i = 0; i < 100; i++)); do
		[ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat")" = T ] && break
		sleep 0.01
	done
	last=$(p_out "$k" | grep -E '^mlp: step' | tail -n 1 | cut -d' ' -f3)
	[ "$last" = "$step" ] || fail "mlp ($pid) went on to step $last before it stopped after step $step"
}
# mlp_held K STEP: waits until the forward/backward kernel of mlp's STEP is in flight,
# every wave of it waiting at the gate (mlp --hold-at).
mlp_held() { p_wait "$1" "^mlp: step $2 in flight: 2 waves hold$" 1 "step $2 in flight"; }

# mlp_stop_at K STEP: mlp_held with MLP_HOLD (mlp --hold-at), else mlp_paused.
mlp_stop_at() { if [ -n "${MLP_HOLD:-}" ]; then mlp_held "$@"; else mlp_paused "$@"; fi; }

# mlp_go K: mlp, stopped by mlp_stop_at (and still stopped after a pre-dump, or restored
# as it was dumped), trains on: SIGUSR1 lets a held kernel go on (MLP_HOLD); a stopped mlp
# (CRIU stops it again at the end of the restore, which may land just after `restore -d`
# returns) is continued.
mlp_go() {
	local pid i
	pid=$(p_pid "$1")
	if [ -n "${MLP_HOLD:-}" ]; then
		kill -USR1 "$pid" || fail "mlp ($pid) is gone"
		return
	fi
	for ((i = 0; i < 100; i++)); do
		[ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat")" = T ] && break
		sleep 0.01
	done
	[ $i -lt 100 ] || fail "mlp ($pid) is not stopped as it was"
	kill -CONT "$pid"
}

# ---------------------------------------------------------------------------------------
# criu-rocm (inside a host)

# c_dump N K... [-- CRIU_ARG...]: `criu-rocm dump -t PID` of each process K into img-N-K;
# each must be gone afterwards. With KERNELS_IN_FLIGHT=Q, the dump of each must have saved
# the waves of Q of its queues (waves_saved). Never retried: a failed dump fails the case.
c_dump() {
	local n=$1 k ks=() extra=() img t0 before
	shift
	while [ $# -gt 0 ] && [ "$1" != -- ]; do ks+=("$1") && shift; done
	[ $# -gt 0 ] && shift && extra=("$@")
	for k in "${ks[@]}"; do
		img=$CASE_DIR/img-$n-$k
		mkdir -p "$img"
		before=$(saved_queues "$k")
		t0=${EPOCHREALTIME/./}
		"$CRIU" dump -t "$(p_pid "$k")" -D "$img" -o dump.log -v4 ${extra[@]+"${extra[@]}"} >>"$CASE_DIR/criu.out" 2>&1 ||
			fail "dump $n of process $k ($(p_pid "$k")) failed: $(log_errors "$img/dump.log")"
		echo "dump $n: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
		wait_gone "$(p_pid "$k")" 10 || fail "dump $n: process $k still runs after the dump"
		ls "$img"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "dump $n of process $k wrote no amdgpu-kfd-*.img"
		waves_saved "$k" "$before" "dump $n"
	done
}

# saved_queues K: how many times kfd-emu (KFD_EMU_LOG=info) saved the waves of a queue of
# process K into its context save area, so far in the case.
saved_queues() {
	grep -acE "kfd-emu: process $(p_pid "$1") queue [0-9]+ packet [0-9]+: [0-9]+ resident waves saved" \
		"$CASE_DIR/kfd-emu.log" 2>/dev/null
}

# waves_saved K BEFORE WHAT: with KERNELS_IN_FLIGHT=Q, WHAT (a dump or pre-dump of process
# K) saved the waves of exactly Q queues since saved_queues said BEFORE; noted per dump.
waves_saved() {
	local q=${KERNELS_IN_FLIGHT:-} got
	[ -n "$q" ] || return 0
	got=$(($(saved_queues "$1") - $2))
	[ "$got" = "$q" ] ||
		fail "$3 of process $1: kfd-emu saved the waves of $got queue(s), want $q (the kernels in flight; kfd-emu.log)"
	echo "$3: $got" >>"$CASE_DIR/saved"
}

# c_restore N K...: `criu-rocm restore -d --restore-sibling` of img-N-K (the processes
# become children of this shell); each must run again, its KFD images restored once each.
c_restore() {
	local n=$1 k img t0
	shift
	for k in "$@"; do
		img=$CASE_DIR/img-$n-$k
		t0=${EPOCHREALTIME/./}
		"$CRIU" restore -D "$img" -o restore.log -v4 -d --restore-sibling >>"$CASE_DIR/criu.out" 2>&1 ||
			fail "restore $n of process $k failed: $(log_errors "$img/restore.log")"
		echo "restore $n: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
		alive "$(p_pid "$k")" || fail "restore $n: process $k does not run: $(p_reason "$k")"
		restored_once "$img"
		grep -a -m1 -o 'amdgpu: pid [0-9]*: GPU 0x.* -> host GPU .*' "$img/restore.log" |
			sed 's/^amdgpu: pid [0-9]*: //' >"$img/mapping"
	done
}

# restored_once IMG: every process whose GPU queues the dump paused had its KFD file
# restored exactly once, by itself (its pid), with the objects the dump paused.
restored_once() {
	local img=$1 pid objs got
	grep -aoE 'amdgpu: pid [0-9]+: GPU queues paused: .* [0-9]+ queue/event object' "$img/dump.log" |
		sed -E 's/amdgpu: pid ([0-9]+):.* ([0-9]+) queue.*/\1 \2/' >"$img/paused"
	[ -s "$img/paused" ] || fail "${img##*/}: the dump log names no process whose GPU queues it paused"
	while read -r pid objs; do
		got=$(grep -aE "^\([0-9. ]+\) +$pid: amdgpu: pid $pid: KFD file [0-9]+ restored: " "$img/restore.log" |
			sed -E 's/.* ([0-9]+) object\(s\).*/\1/')
		[ "$(wc -w <<<"$got")" = 1 ] ||
			fail "${img##*/}: the KFD file of pid $pid was restored $(wc -w <<<"$got") times by itself, want once"
		[ "$got" = "$objs" ] ||
			fail "${img##*/}: pid $pid's KFD file came back with $got objects, the dump paused $objs"
	done <"$img/paused"
	[ "$(grep -acE 'amdgpu: pid [0-9]+: KFD file [0-9]+ restored: ' "$img/restore.log")" = "$(wc -l <"$img/paused")" ] ||
		fail "${img##*/}: more KFD files restored than processes dumped"
}

# finish term|wait K...: SIGTERM to each hold process K, or (wait: mlp) nothing until it
# ends on its own; their exit statuses into pK.status. Ends the host step.
finish() {
	local args=() k mode=$1
	shift
	for k in "$@"; do
		[ "$mode" = wait ] && args+=(--no-term)
		args+=("process-$k" "$(p_pid "$k")" "$CASE_DIR/p$k.status")
	done
	exec /usr/bin/python3 "$top/scripts/lib/stop_and_reap.py" 300 "${args[@]}"
}

# ---------------------------------------------------------------------------------------
# Checks after the last host step

# passed K: process K exited with status 0 and its last line says PASSED.
passed() {
	local k=$1 st
	st=$(cat "$CASE_DIR/p$k.status" 2>/dev/null) || fail "process $k: no exit status"
	[ "$st" = 0 ] || fail "process $k exited with status $st: $(p_reason "$k")"
	p_out "$k" | tail -n 1 | grep -qE ': PASSED$' || fail "process $k's last line is not PASSED: $(p_reason "$k")"
}

# mlp_identical K GFX: every step's loss bits and the weights' checksum equal the
# uninterrupted run's on that ISA.
mlp_identical() {
	local k=$1 ref first
	ref=$(mlp_reference "$2") || fail "$ref"
	first=$(diff <(mlp_digest <"$ref") <(p_out "$k" | mlp_digest) | grep -m1 '^[<>]')
	[ -z "$first" ] || fail "mlp after the restore differs from an uninterrupted run first at: $first (ref $ref)"
	[ "$(p_out "$k" | mlp_digest | grep -c '^mlp: step')" = "$MLP_STEPS" ] || fail "mlp did not print $MLP_STEPS steps"
	note "mlp: $MLP_STEPS steps, loss and weights bit-identical to an uninterrupted run ($(p_out "$k" | grep -o 'checksum [0-9a-f]*'))"
}
# mlp's lines that must match: steps with their loss bits, the checksum.
mlp_digest() { grep -E '^mlp: (step [0-9]+ loss .*bits|weights checksum)'; }

# The uninterrupted run on ISA GFX (mlp --checksum --once, no pause), made once per suite
# run on a host of its own; prints its output file.
mlp_reference() {
	local ref=$WORK/mlp-ref-$1-$MLP_STEPS.out prof
	if [ ! -s "$ref" ]; then
		for prof in mi100 mi210x4; do [ "${GFX[$prof]}" = "$1" ] && break; done
		(on "$prof" -- mlp_reference_run "$ref") ||
			{ echo "the uninterrupted mlp run on $prof failed: $(tail -n 2 "$ref.tmp" | paste -sd'|')" && return 1; }
	fi
	echo "$ref"
}
mlp_reference_run() {
	"$MLP" --steps "$MLP_STEPS" --checksum --once >"$1.tmp" 2>&1 && mv "$1.tmp" "$1"
}

# Notes for a passing case: dump and restore times, GPU mappings.
describe() {
	local d
	note "$(paste -sd' ' "$CASE_DIR/times" | sed 's/: /=/g; s/ ms/ms/g')"
	[ -s "$CASE_DIR/saved" ] && note "queues whose waves kfd-emu saved: $(paste -sd' ' "$CASE_DIR/saved" | sed 's/: /=/g')"
	for d in "$CASE_DIR"/img-*; do
		[ -s "$d/mapping" ] && note "${d##*/}: restored $(cat "$d/mapping")"
	done
	return 0
}

# ---------------------------------------------------------------------------------------
# Case shapes

# hold_dump K ARGS...: hold started with ARGS, a round, then dumped (img-1-K).
hold_dump() {
	local k=$1
	shift
	p_start "$k" "$HOLD" "$@"
	p_wait "$k" '^hold( \(child\))?: ready' "$(hold_procs "$@")" "the ready line"
	hold_round "$k"
	c_dump 1 "$k"
}
hold_procs() { case " $* " in *" --fork "*) echo 2 ;; *) echo 1 ;; esac; }

# hold_restore N K...: restore img-N-K of each, a round each, then dump N+1 (LAST=0) or finish.
hold_restore() {
	local n=$1 last=$2 k
	shift 2
	c_restore "$n" "$@"
	for k in "$@"; do hold_round "$k"; done
	[ "$last" = 1 ] && finish term "$@"
	c_dump $((n + 1)) "$@"
}

# hold_case PROFILE DUMP_HOST RESTORE_HOST ARGS...: hold dumped on one host (a name in
# test/gpu/hosts, a path, or "" for the profile itself), restored on the other.
hold_case() {
	local prof=$1 from=$2 to=$3
	shift 3
	# shellcheck disable=SC2046 # the override is words
	on "$prof" $([ -n "$from" ] && other "$from") -- hold_dump 1 "$@"
	# shellcheck disable=SC2046
	on "$prof" $([ -n "$to" ] && other "$to") -- hold_restore 1 1 1
	passed 1
	describe
}

# mlp_start K: mlp, with steps held (MLP_HOLD) or a pause between steps.
mlp_start() {
	if [ -n "${MLP_HOLD:-}" ]; then
		p_start "$1" "$MLP" --steps "$MLP_STEPS" --hold-at "$MLP_HOLD" --checksum --once
	else
		p_start "$1" "$MLP" --steps "$MLP_STEPS" --delay-ms "$MLP_DELAY" --checksum --once
	fi
}
# mlp_dump K STEP: mlp started, dumped after STEP (MLP_HOLD: during STEP).
mlp_dump() {
	mlp_start "$1"
	mlp_stop_at "$1" "$2"
	c_dump 1 "$1"
	mlp_at_dump "$1" 1 "$2"
}
# mlp_at_dump K N STEP: dump N happened right after STEP, or during it (its output ends
# there).
mlp_at_dump() {
	local last
	last=$(p_out "$1" | grep -E '^mlp: step' | tail -n 1 | cut -d' ' -f3)
	[ "$last" = "$3" ] || fail "dump $2 landed after step $last, not $3"
	echo "$2 $3" >>"$CASE_DIR/dumped-at"
}

# mlp_restore N LAST [NEXT_STEP]: restore img-N-1; then dump N+1 after NEXT_STEP, or
# (LAST=1) let it train to its end.
mlp_restore() {
	c_restore "$1" 1
	mlp_go 1
	[ "$2" = 1 ] && finish wait 1
	mlp_stop_at 1 "$3"
	c_dump $(($1 + 1)) 1
	mlp_at_dump 1 $(($1 + 1)) "$3"
}

mlp_case() { # PROFILE DUMP_HOST RESTORE_HOST
	local prof=$1
	# shellcheck disable=SC2046 # the override is words
	on "$prof" $([ -n "$2" ] && other "$2") -- mlp_dump 1 "$MLP_AT"
	# shellcheck disable=SC2046
	on "$prof" $([ -n "$3" ] && other "$3") -- mlp_restore 1 1
	passed 1
	mlp_identical 1 "${GFX[$prof]}"
	note "dumped $(mlp_when) step $MLP_AT of $MLP_STEPS"
	describe
}
# How mlp was dumped: "after" a step, or "during" it (its kernel in flight).
mlp_when() { if [ -n "${MLP_HOLD:-}" ]; then echo during; else echo after; fi; }

# ---------------------------------------------------------------------------------------
# Cases: case_NAME() { ...; }, run in this order.

# (1) Right after hipInit, nothing allocated.
case_init_same_host() { on mi100 -- init_same_host; passed 1; describe; }
init_same_host() {
	p_start 1 "$HOLD"
	p_wait 1 '^hold: ready' 1 "the ready line"
	c_dump 1 1
	c_restore 1 1
	hold_round 1
	finish term 1
}
case_init_other_host() {
	on mi100x2 -- init_dump
	# shellcheck disable=SC2046 # the override is words
	on mi100x2 $(other mi100x2-other) -- hold_restore 1 1 1
	passed 1
	describe
}
init_dump() {
	p_start 1 "$HOLD"
	p_wait 1 '^hold: ready' 1 "the ready line"
	c_dump 1 1
}

# (2) The MLP training loop checkpointed mid-training.
case_mlp_same_host() { on mi100 -- mlp_same_host; passed 1; mlp_identical 1 gfx908; describe; }
mlp_same_host() {
	mlp_dump 1 "$MLP_AT"
	mlp_restore 1 1
}
case_mlp_other_host() { mlp_case mi210x4 "" "$DEMO_OTHER"; }
case_mlp_other_host_mi100x2() { mlp_case mi100x2 "" mi100x2-other; }
# (9) Five cycles in a row, between two hosts.
case_mlp_five_cycles() {
	local i host
	export MLP_STEPS=12
	on mi100x2 -- mlp_dump 1 1
	for ((i = 1; i <= 5; i++)); do
		if [ $((i % 2)) = 1 ]; then host=$(other mi100x2-other); else host=; fi
		# shellcheck disable=SC2086 # the override is words
		on mi100x2 $host -- mlp_restore "$i" "$([ "$i" = 5 ] && echo 1 || echo 0)" $((1 + 2 * i))
	done
	passed 1
	mlp_identical 1 gfx908
	note "dumped $(mlp_when) steps $(cut -d' ' -f2 "$CASE_DIR/dumped-at" | paste -sd,) of $MLP_STEPS"
	describe
}
case_hold_five_cycles() {
	local i host
	on mi100x2 -- hold_dump 1 --buffers --streams
	for ((i = 1; i <= 5; i++)); do
		if [ $((i % 2)) = 1 ]; then host=$(other mi100x2-other); else host=; fi
		# shellcheck disable=SC2086
		on mi100x2 $host -- hold_restore "$i" "$([ "$i" = 5 ] && echo 1 || echo 0)" 1
	done
	passed 1
	describe
}

# (6) Two HIP processes, each dumped; and a parent with a child, dumped as one tree.
case_two_processes() {
	on mi100x2 -- two_dump
	# shellcheck disable=SC2046 # the override is words
	on mi100x2 $(other mi100x2-other) -- hold_restore 1 1 1 2
	passed 1
	passed 2
	describe
}
two_dump() {
	p_start 1 "$HOLD" --buffers --streams
	p_start 2 "$HOLD" --buffers --host
	p_wait 1 '^hold: ready' 1 "the ready line"
	p_wait 2 '^hold: ready' 1 "the ready line"
	hold_round 1
	hold_round 2
	c_dump 1 1 2
}
case_tree() { hold_case mi100x2 "" mi100x2-other --fork --buffers --streams; }

# (7) hipHostMalloc and hipHostRegister memory the kernels write.
case_host_memory() { hold_case mi210x4 "" "$DEMO_OTHER" --host --buffers; }

# (8) A pre-dump after step 1 (it trains on), then the incremental dump after step MLP_AT.
case_mlp_predump() { on mi100 -- mlp_predump; passed 1; mlp_identical 1 gfx908; describe; }
mlp_predump() {
	local pre=$CASE_DIR/pre
	local before
	mlp_start 1
	mlp_stop_at 1 1
	mkdir -p "$pre"
	before=$(saved_queues 1)
	"$CRIU" pre-dump -t "$(p_pid 1)" -D "$pre" -o pre-dump.log -v4 >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "pre-dump failed: $(log_errors "$pre/pre-dump.log")"
	alive "$(p_pid 1)" || fail "mlp is gone after the pre-dump"
	waves_saved 1 "$before" pre-dump
	mlp_go 1
	mlp_stop_at 1 "$MLP_AT"
	c_dump 1 1 -- --prev-images-dir ../pre
	mlp_at_dump 1 1 "$MLP_AT"
	[ -L "$CASE_DIR/img-1-1/parent" ] || fail "the incremental dump has no parent link"
	c_restore 1 1
	mlp_go 1
	finish wait 1
}

# (4) Several streams with events and dependencies.
case_streams() { hold_case mi100x2 "" mi100x2-other --streams --buffers; }

# (5) Peer copies between GPUs (GPU 0 to every other), each round.
case_peer() { hold_case mi210x4 "" "$DEMO_OTHER" --peer; }

# ---------------------------------------------------------------------------------------
# Cases with kernels in flight at every dump (kfd-emu saves their waves at PROCESS_INFO).

# (2) The MLP dumped while step MLP_AT's forward/backward kernel is in flight (held at its
# gate), restored on the same host, on another mi210x4; released, it trains to its end,
# bit-identical to an uninterrupted run.
case_mlp_in_flight_same_host() { export MLP_HOLD=$MLP_AT KFD_EMU_LOG=info KERNELS_IN_FLIGHT=1; case_mlp_same_host; }
case_mlp_in_flight_other_host() { export MLP_HOLD=$MLP_AT KFD_EMU_LOG=info KERNELS_IN_FLIGHT=1; case_mlp_other_host; }
# (8) The pre-dump during step 1, the incremental dump during step MLP_AT.
case_mlp_in_flight_predump() { export MLP_HOLD=1,$MLP_AT KFD_EMU_LOG=info KERNELS_IN_FLIGHT=1; case_mlp_predump; }
# (9) Five dumps in a row, each during a step (1, 3, 5, 7, 9), between two hosts.
case_mlp_in_flight_five_cycles() { export MLP_HOLD=1,3,5,7,9 KFD_EMU_LOG=info KERNELS_IN_FLIGHT=1; case_mlp_five_cycles; }

# (3) A kernel spinning on a host flag on every GPU at the dump (hold --spin), with device
# buffers; restored on another mi210x4, the spinners end when released.
case_spin_every_gpu() { export KFD_EMU_LOG=info KERNELS_IN_FLIGHT=4; hold_case mi210x4 "" "$DEMO_OTHER" --spin --buffers; }

# (3) One long kernel on every GPU of mi210x4 computing at the dump (busy), restored on
# another mi210x4 (other gpu_ids, render minors, GPU order): released, each ends with the
# host's result.
case_busy_every_gpu() {
	export KFD_EMU_LOG=info KERNELS_IN_FLIGHT=4
	running_case mi210x4 mi210x4-other "$BUSY" '^busy: 4 GPUs running$'
	note "$(p_out 1 | grep -o "GPU 0's kernel ([0-9]* and [0-9]* rounds)")"
}

# (4) hipStreamWaitValue32 spinning on every GPU of mi100x2 at the dump, a second stream
# waiting for an event behind it; restored on another mi100x2, released, both streams'
# kernels run (wait-value).
case_wait_value() {
	export KFD_EMU_LOG=info KERNELS_IN_FLIGHT=2
	running_case mi100x2 mi100x2-other "$WAIT_VALUE" '^wait-value: 2 GPUs waiting$'
}

# A stream with a CU mask of one CU (cu-mask) on mi100x2, dumped while the waves that
# CU holds wait, restored on another mi100x2: every wave ran on that CU before and after the
# restore (the queue keeps its mask), and no more were resident than the CU's wave slots.
case_cu_mask() {
	export KFD_EMU_LOG=info KERNELS_IN_FLIGHT=1
	running_case mi100x2 mi100x2-other "$CU_MASK" '^cu-mask: [0-9]+ waves resident on 1 CU$'
	note "$(p_out 1 | grep -o '[0-9]* waves resident on 1 CU')"
}

# running_case PROFILE RESTORE_HOST BIN READY: BIN started and dumped once its output has
# the line READY (a regex), restored on RESTORE_HOST and released (SIGTERM): it must pass.
running_case() {
	on "$1" -- running_dump "$3" "$4"
	# shellcheck disable=SC2046 # the override is words
	on "$1" $(other "$2") -- running_restore
	passed 1
	describe
}
running_dump() {
	p_start 1 "$1"
	p_wait 1 "$2" 1 "the line $2"
	c_dump 1 1
}
running_restore() {
	c_restore 1 1
	finish term 1
}
# A HIP process killed while its kernels compute (busy on both GPUs of mi100x2): as KFD's
# release removes a dying process' queues without a word, kfd-emu ends those dispatches
# quietly (its log has no ERROR line; each ends with an info line saying its process exits),
# and serves the next process, whose kernels run on both GPUs (hold --spin, a round).
case_kill_in_flight() {
	export KFD_EMU_LOG=info
	on mi100x2 -- kill_in_flight
	passed 2
	quiet_end "$(cat "$CASE_DIR/killed")"
}
kill_in_flight() {
	local pid
	p_start 1 "$BUSY"
	p_wait 1 '^busy: 2 GPUs running$' 1 "the line 'busy: 2 GPUs running'"
	pid=$(p_pid 1)
	echo "$pid" >"$CASE_DIR/killed"
	kill -KILL "$pid"
	wait_gone "$pid" 10 || fail "busy ($pid) still exists 10 s after SIGKILL"
	p_start 2 "$HOLD" --spin --buffers
	p_wait 2 '^hold: ready' 1 "the ready line"
	hold_round 2
	finish term 2
}
# quiet_end PID: kfd-emu's log of the case has no ERROR line, and says how PID's dispatches
# ended (a dispatch the release removed first has no line: noted).
quiet_end() {
	local errors ended
	errors=$(grep -a ': ERROR: ' "$CASE_DIR/kfd-emu.log" | head -n 3 | cut -c1-300 | paste -sd'|')
	[ -z "$errors" ] || fail "kfd-emu logged errors after process $1 was killed: $errors"
	ended=$(grep -acE "kfd-emu: process $1 GPU .* AQL queue [0-9]+: .*: its process exits .*; the queue ends with it" \
		"$CASE_DIR/kfd-emu.log")
	note "process $1 killed with 2 kernels in flight: no ERROR line; $ended dispatch(es) ended as its memory went, the rest at its release"
}

# ---------------------------------------------------------------------------------------
# The driver

ordered_cases() { grep -o '^case_[a-z0-9_]*()' "$self" | sed 's/^case_//; s/()$//'; }

# prog_build SRC BIN [HEADER...]: hip_build, its log in logs/ beside BIN; prints BIN, or
# the log's tail on stderr and fails.
prog_build() {
	local src=$1 bin=$2 log
	shift 2
	log=$(dirname "$bin")/logs/$(basename "$bin").build
	hip_build "$src" "$bin" "$log" "$@" && return 0
	tail -n 20 "$log" >&2
	echo "test/hip-cr: building $(basename "$bin") failed" >&2
	return 1
}

build_programs() {
	HOLD=$(prog_build "$here/hold.hip" "$top/build/hip-cr/hold" "$top/test/zdtm/static/hip_state.h") &&
		MLP=$(prog_build "$top/test/hip/mlp.hip" "$top/build/hip/mlp") &&
		BUSY=$(prog_build "$here/busy.hip" "$top/build/hip-cr/busy") &&
		WAIT_VALUE=$(prog_build "$here/wait-value.hip" "$top/build/hip-cr/wait-value") &&
		CU_MASK=$(prog_build "$here/cu-mask.hip" "$top/build/hip-cr/cu-mask") || exit 2
	export HOLD MLP BUSY WAIT_VALUE CU_MASK
}

preflight() {
	local c
	[ "$(id -u)" = 0 ] || { echo "test/hip-cr: needs root (kfd-emu mounts FUSE nodes, CRIU needs CAP_SYS_ADMIN)" >&2; exit 2; }
	for c in "$CRIU" "$KFD_EMU"; do
		[ -x "$c" ] || { echo "test/hip-cr: $c is missing (make test-hip-cr builds it)" >&2; exit 2; }
	done
	for c in hipcc unshare setsid timeout flock /usr/bin/python3; do
		command -v "$c" >/dev/null || { echo "test/hip-cr: $c is missing (scripts/install-deps.sh)" >&2; exit 2; }
	done
}

main() {
	cases_select test/hip-cr "$@"
	mkdir -p "$top/build/hip-cr"
	WORK=$(mktemp -d "$top/build/hip-cr/work.XXXXXX")
	export WORK
	build_programs
	echo "HIP C/R tests: ${#WANTED[@]} case(s), criu-rocm $CRIU, HIP $(dpkg-query -W -f='${Version}' libamdhip64-5 2>/dev/null); work directory $WORK"
	cases_run_all "${HIP_CR_KEEP:-}"
}

cases_dispatch "$@"
CRIU=$(realpath "$1")
shift
KFD_EMU=${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu
CASE_TIMEOUT=${HIP_CR_TIMEOUT:-400}
export CRIU KFD_EMU CASE_TIMEOUT
preflight
exec unshare --pid --fork --mount-proc --kill-child "$self" __main "$@"
