#!/usr/bin/env bash
# The SDMA copy path of criu-rocm end to end on kfd-emu (issue #19): KFD hands out dma-buf
# fds and the render nodes run GEM/VM/CS, served to criu-rocm through `kfd-emu supervise`
# (a seccomp listener held by the emulator). criu-rocm runs with CRIU_ROCM_COPY_ENGINE=sdma.
#
#   usage: test/sdma/run.sh CRIU_BINARY [CASE...]      (as root; `make test-sdma` runs it)
#          test/sdma/run.sh --list
#   env:   CARGO_TARGET_DIR   where kfd-emu and gpu-workload were built (rust/target)
#          SDMA_TEST_TIMEOUT  seconds a case may take (300)
#          SDMA_TEST_KEEP=1   keep the work directory even when everything passed
#
# Each case covers ONE dump -> restore pass: criu runs under a seccomp filter, and CRIU under
# a filter cannot dump a process that has one (PTRACE_O_SUSPEND_SECCOMP is EPERM), while
# every task a supervised `criu restore` restores inherits the filter. A second pass would
# need a criu outside the supervisor, which then saves the filter without its listener.
#
# Not here: upstream CRIU 4.2.1 with its own amdgpu plugin, unmodified, cannot see the
# emulated nodes as devices (they are regular files on FUSE: CRIU dumps them as paths and the
# plugin tells /dev/kfd from a render node by st_rdev), so images cannot be exchanged with it
# on kfd-emu (rust/kfd-emu/README.md, Known gaps).
#
# Each case runs in its own directory under the runner, the init of a pid namespace of its
# own (scripts/lib/cases.sh), and prints PASS or FAIL (with the reason and where its logs
# are). A case marked with a known bug (`known_bug`: the issue, and a regex of the failure
# it causes) that fails that way is an XFAIL, counted as passed; failing otherwise is a
# FAIL; passing is an XPASS (also passed) with a reminder to drop the mark. The last line is
# exactly "N passed, M failed"; the exit status is non-zero on any failure.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, known_bug, on, cases_dispatch; alive, wait_gone, ... (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"
# streamer, stream_start (the --stream case's peer of the image streamer)
# shellcheck source=SCRIPTDIR/../../scripts/lib/streamer.sh
. "$top/scripts/lib/streamer.sh"

# wl_start [ARG...]: gpu-workload (with ARGs) in its own session; sets WL and WL_OUT.
wl_start() {
	local i
	WL_OUT=$CASE_DIR/wl.out
	setsid "$WORKLOAD" "$@" </dev/null >"$WL_OUT" 2>"$CASE_DIR/wl.err" &
	WL=$!
	for ((i = 0; i < 1200; i++)); do
		grep -q "^{\"ready\":true,\"pid\":$WL," "$WL_OUT" && return 0
		alive "$WL" || break
		sleep 0.05
	done
	fail "gpu-workload did not get ready: $(tail -n 3 "$CASE_DIR/wl.err" | paste -sd' ')"
}

oks() { grep -c "^{\"ok\":[a-z]*,\"pid\":$WL," "$WL_OUT"; }

# verify [SIGNAL]: one more verification line from $WL (SIGUSR1, or SIGTERM: the last), ok.
verify() {
	local n i line
	n=$(($(oks) + 1))
	kill "-${1:-USR1}" "$WL" 2>/dev/null || fail "gpu-workload $WL is gone"
	for ((i = 0; i < 1200; i++)); do
		[ "$(oks)" -ge "$n" ] && break
		sleep 0.05
	done
	line=$(grep "^{\"ok\":[a-z]*,\"pid\":$WL," "$WL_OUT" | sed -n "${n}p")
	[ -n "$line" ] || fail "gpu-workload $WL gave no verification line"
	json_ok "$line" || fail "gpu-workload $WL: verification failed: $line"
	echo "$line"
}

# sup criu ARG...: criu-rocm with the SDMA engine forced (or the engine policy $ENGINE),
# under the emulator's supervisor.
sup() {
	CRIU_ROCM_COPY_ENGINE=${ENGINE:-sdma} "$KFD_EMU" supervise -- "$CRIU" "$@" >>"$CASE_DIR/criu.out" 2>&1
}

log_errors() { grep -a -E 'Error|amdgpu:.*(fail|rror)' "$1" 2>/dev/null | grep -v RLIMIT | tail -n 3 | paste -sd'|'; }

# all_by_sdma LOG VERB GPUS: every GPU line of LOG says VERB with 0 BOs by the CPU.
all_by_sdma() {
	local n
	n=$(grep -a -c -E "amdgpu: pid [0-9]+: GPU .*: $2 [0-9]+ BO\(s\).*; 0 by CPU, [0-9]+ by SDMA\)" "$1")
	[ "$n" = "$3" ] || fail "$(basename "$1"): $n of $3 GPU(s) $2 all BOs by SDMA: $(grep -a -E ": $2 [0-9]+ BO" "$1" | sed 's/^([0-9. ]*) *//' | paste -sd'|')"
}

# ---------------------------------------------------------------------------------------
# Cases (run inside a host)

# dump_restore GPUS: SDMA dump (the process is killed), SDMA restore, the process verifies.
dump_restore() {
	local d=$CASE_DIR/img
	mkdir -p "$d"
	wl_start
	verify >/dev/null
	sup dump -t "$WL" -D "$d" -o dump.log -v4 || fail "SDMA dump failed: $(log_errors "$d/dump.log")"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	all_by_sdma "$d/dump.log" saved "$1"
	sup restore -D "$d" -o restore.log -v4 -d || fail "SDMA restore failed: $(log_errors "$d/restore.log")"
	all_by_sdma "$d/restore.log" restored "$1"
	alive "$WL" || fail "gpu-workload $WL does not run after the restore"
	grep -q '^Seccomp:[[:space:]]*2' "/proc/$WL/status" ||
		fail "the restored task has no seccomp filter: the restore did not run under the supervisor"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
}
# engine POLICY: the same pass with CRIU_ROCM_COPY_ENGINE=POLICY under the supervisor, where
# KFD hands out dma-bufs: the CPU engine may map BOs through them (their CPU mapping must
# show the BO at the dump, and reach it by RESUME at the restore). The process verifies
# every byte; which engine moved which BO is the product's choice.
engine() {
	local d=$CASE_DIR/img
	mkdir -p "$d"
	wl_start
	verify >/dev/null
	ENGINE=$1 sup dump -t "$WL" -D "$d" -o dump.log -v4 || fail "$1 dump failed: $(log_errors "$d/dump.log")"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	grep -a -q -E "amdgpu: pid [0-9]+: GPU .*: saved [0-9]+ BO" "$d/dump.log" || fail "no GPU copy in the dump log"
	ENGINE=$1 sup restore -D "$d" -o restore.log -v4 -d || fail "$1 restore failed: $(log_errors "$d/restore.log")"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
}
case_auto_engine_with_dmabufs() { on mi100x2 -- engine auto; }

# A process that also opens its render nodes outside KFD (Mesa, VA-API) before /dev/kfd: its
# first file of each node is not the one it gave ACQUIRE_VM. The kernel maps a BO only
# through the file that owns it (drm_gem_mmap: EACCES for any other file; under the
# supervisor the emulator refuses alike), so the CPU engine must find that file at the dump
# and map through the file given to RESTORE at the restore; the process checks every byte.
other_render_opens() {
	local d=$CASE_DIR/img
	mkdir -p "$d"
	wl_start --other-render-opens
	verify >/dev/null
	ENGINE=cpu sup dump -t "$WL" -D "$d" -o dump.log -v4 || fail "cpu dump failed: $(log_errors "$d/dump.log")"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	grep -a -q -E "amdgpu: pid [0-9]+: GPU .*: saved [0-9]+ BO.*[1-9][0-9]* by CPU" "$d/dump.log" ||
		fail "no BO saved by the CPU in the dump log"
	ENGINE=cpu sup restore -D "$d" -o restore.log -v4 -d || fail "cpu restore failed: $(log_errors "$d/restore.log")"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
}
case_cpu_engine_other_render_opens() {
	KFD_EMU_LOG=info on mi100x2 -- other_render_opens
	# The dump's probe of the task's first file must have met the refusal, or the case
	# tested nothing.
	grep -q "does not own the BO" "$CASE_DIR/kfd-emu.log" ||
		fail "the emulator refused no BO mapping through a render file that does not own it"
}
case_cpu_engine_with_dmabufs() { on mi100x2 -- engine cpu; }

case_dump_restore_1_gpu() { on mi100 -- dump_restore 1; }
case_dump_restore_2_gpus() { on mi100x2 -- dump_restore 2; }
case_dump_restore_8_gpus() { on mi300x8 -- dump_restore 8; }
# --stream (#28): the SDMA engine's pages go into their pipes to the image streamer
# (test/gpu/streamer.py) as they are copied, and come back from it at the restore; no GPU
# image touches the image directory, and the process verifies every byte.
case_stream_dump_restore() { on mi100x2 -- stream_dump_restore; }
stream_dump_restore() {
	local d=$CASE_DIR/img s=$CASE_DIR/img.stream
	wl_start
	verify >/dev/null
	stream_start capture "$d" "$s"
	sup dump -t "$WL" -D "$d" -o dump.log -v4 --stream || fail "SDMA dump --stream failed: $(log_errors "$d/dump.log")"
	wait "$STREAMER_PID" || fail "the test streamer (capture) failed: $(tail -n 2 "$d/streamer-capture.log")"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	all_by_sdma "$d/dump.log" saved 2
	! ls "$d" | grep -q '^amdgpu-' || fail "GPU image files landed in the image directory: $(ls "$d" | paste -sd' ')"
	stream_start serve "$d" "$s"
	sup restore -D "$d" -o restore.log -v4 -d --stream || fail "SDMA restore --stream failed: $(log_errors "$d/restore.log")"
	wait "$STREAMER_PID" || fail "the test streamer (serve) failed: $(tail -n 2 "$d/streamer-serve.log")"
	all_by_sdma "$d/restore.log" restored 2
	alive "$WL" || fail "gpu-workload $WL does not run after the restore"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
	note "$(grep -c '^streamer: serve amdgpu-' "$d/streamer-serve.log") GPU files served, $(stat -c %s "$s") bytes of stream"
}
# KFD_COMPRESS=zstd: the SDMA engine's staging reads and writes go through the compressing
# writer and the decompressing reader; the process verifies every byte.
case_dump_restore_compressed() { on mi100x2 -- dump_restore_compressed; }
dump_restore_compressed() {
	local gc
	KFD_COMPRESS=zstd:1 dump_restore 2
	gc=$("$CRIU" gpu-check -D "$CASE_DIR/img" 2>&1)
	grep -q "compressed GPU pages (zstd level 1)" <<<"$gc" || fail "gpu-check does not name the compression: $(paste -sd' ' <<<"$gc")"
}

# An incremental dump by SDMA (#17): a pre-dump of a process with a 64 MiB BO (while it runs),
# one 2 MiB block in 16 of that BO rewritten (SIGUSR2), then a dump with --prev-images-dir,
# every BO read by SDMA both times: the changed extents are found by hashing each one whole
# in the SDMA staging buffer, so the incremental pages (plain: disk blocks; compressed with
# KFD_COMPRESS set: the pre-dump compressed too, file sizes) are a fifth of the pre-dump's
# or less. The restore from the
# incremental image, by SDMA, takes the rest from the pre-dump; the process verifies every
# byte, the rewritten blocks included.
predump_incremental() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img fb ib line n i
	mkdir -p "$pre" "$img"
	wl_start --mib 1 --bos 1 --big-bo-mib 64 --big-bo-fill fp16 --change-every 16
	verify >/dev/null
	sup pre-dump -t "$WL" -D "$pre" -o pre-dump.log -v4 ||
		fail "SDMA pre-dump failed: $(log_errors "$pre/pre-dump.log")"
	alive "$WL" || fail "the pre-dump did not leave gpu-workload $WL running"
	all_by_sdma "$pre/pre-dump.log" saved 1
	n=$(grep -c "^{\"changed\":true,\"pid\":$WL," "$WL_OUT")
	kill -USR2 "$WL" || fail "gpu-workload $WL is gone (SIGUSR2 failed)"
	for ((i = 0; i < 1200; i++)); do
		[ "$(grep -c "^{\"changed\":true,\"pid\":$WL," "$WL_OUT")" -gt "$n" ] && break
		sleep 0.05
	done
	[ "$(grep -c "^{\"changed\":true,\"pid\":$WL," "$WL_OUT")" -gt "$n" ] ||
		fail "gpu-workload $WL did not change its big BO after SIGUSR2"
	verify >/dev/null
	sup dump -t "$WL" -D "$img" -o dump.log -v4 --prev-images-dir ../pre ||
		fail "SDMA incremental dump failed: $(log_errors "$img/dump.log")"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	all_by_sdma "$img/dump.log" saved 1
	line=$(grep -a -m1 -oE "incremental GPU dump against parent/amdgpu-kfd-[0-9]+\.img: .*" "$img/dump.log") ||
		fail "the dump with --prev-images-dir says nothing of its parent"
	grep -a -q "came in parts" "$img/dump.log" &&
		fail "extents came in parts through SDMA staging: $(grep -a -m1 'came in parts' "$img/dump.log")"
	if [ -n "${KFD_COMPRESS:-}" ]; then
		fb=$(stat -c %s "$pre"/amdgpu-pages-*.img | awk '{ s += $1 } END { print s }')
		ib=$(stat -c %s "$img"/amdgpu-pages-*.img | awk '{ s += $1 } END { print s }')
		[ "$fb" -gt $((8 << 20)) ] || fail "the compressed pre-dump's pages take only $fb bytes for 64 MiB of fp16 values"
	else
		fb=$(du -B1 -c "$pre"/amdgpu-pages-*.img | tail -n 1 | cut -f1)
		ib=$(du -B1 -c "$img"/amdgpu-pages-*.img | tail -n 1 | cut -f1)
		[ "$fb" -gt $((64 << 20)) ] || fail "the pre-dump's pages take only $fb bytes of disk for a 64 MiB BO"
	fi
	[ "$ib" -le $((fb / 5)) ] || fail "the incremental pages take $ib bytes, the pre-dump's $fb (${line})"
	sup restore -D "$img" -o restore.log -v4 -d || fail "SDMA restore failed: $(log_errors "$img/restore.log")"
	all_by_sdma "$img/restore.log" restored 1
	alive "$WL" || fail "gpu-workload $WL does not run after the restore"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
	note "GPU pages: pre-dump $fb bytes, incremental dump $ib bytes ($((ib * 100 / fb)) %); ${line#*: }"
}
case_predump_incremental() { on mi100 -- predump_incremental; }
# The same with the dump compressed (KFD_COMPRESS=zstd:1): each 2 MiB chunk hashed in place
# in the staging buffer, only the changed ones compressed.
case_predump_incremental_compressed() { KFD_COMPRESS=zstd:1 on mi100 -- predump_incremental; }

# The RDNA4 gfx1201 card: its DMA IP is SDMA 7, so criu-rocm writes the CPV bit and the
# eighth COPY_LINEAR dword (sdma_v7_0_emit_copy_buffer's packet), which the emulator's engine
# reads as SDMA 7 does.
case_dump_restore_sdma7() { on rx9070xt -- dump_restore 1; }

# The same card with its DMA rings refusing user submissions (amdgpu.disable_kq=1):
# HW_IP_INFO(DMA) counts no ring. Forced SDMA fails, naming the GPU and why; under `auto`
# criu-rocm says why and copies with the CPU (through the render file that owns the BOs:
# the emulator's dma-bufs cannot be mapped for their pages), and the restore verifies.
no_user_sdma() {
	local d=$CASE_DIR/img
	mkdir -p "$d"
	wl_start
	verify >/dev/null
	CRIU_ROCM_COPY_ENGINE=auto "$KFD_EMU" supervise -- "$CRIU" dump -t "$WL" -D "$d" -o dump.log -v4 \
		>>"$CASE_DIR/criu.out" 2>&1 || fail "auto dump failed: $(log_errors "$d/dump.log")"
	grep -a -q -E "GPU 0x7b1d: no SDMA engine \(GPU 0x7b1d: no DMA ring accepts user submissions .*available_rings 0\)\); copying with the CPU" "$d/dump.log" ||
		fail "dump.log does not say why the CPU copies: $(grep -a 'SDMA' "$d/dump.log" | tail -n 2 | paste -sd'|')"
	grep -a -q -E "GPU 0x7b1d .*: saved [1-9][0-9]* BO\(s\).*; [1-9][0-9]* by CPU, 0 by SDMA\)" "$d/dump.log" ||
		fail "the dump did not copy every BO by the CPU"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
	CRIU_ROCM_COPY_ENGINE=auto "$KFD_EMU" supervise -- "$CRIU" restore -D "$d" -o restore.log -v4 -d \
		>>"$CASE_DIR/criu.out" 2>&1 || fail "auto restore failed: $(log_errors "$d/restore.log")"
	verify >/dev/null
	verify TERM >/dev/null
	wait_gone "$WL" 10 || fail "gpu-workload $WL did not exit after SIGTERM"
}
case_no_user_submission_auto_uses_cpu() {
	on rx9070xt --profile-file "$here/../gpu/hosts/rx9070xt-no-user-sdma.toml" -- no_user_sdma
}
case_no_user_submission_forced_sdma_fails() {
	on rx9070xt --profile-file "$here/../gpu/hosts/rx9070xt-no-user-sdma.toml" -- \
		dump_fails 'setting up SDMA: GPU 0x7b1d: no DMA ring accepts user submissions'
}

# The same state dumped by the CPU engine, by the CPU engine with KFD's dma-bufs handed out,
# and by SDMA: the GPU images must be byte for byte the same. gpu-workload is stopped
# (SIGSTOP), so no SDMA step runs between the dumps (its queue drains); the first two leave
# it running (stopped), the last kills it.
images_match() {
	local a=$CASE_DIR/cpu b=$CASE_DIR/sdma c=$CASE_DIR/cpu-dmabuf f n=0
	mkdir -p "$a" "$b"
	wl_start
	kill -STOP "$WL"
	sleep 0.3
	CRIU_ROCM_COPY_ENGINE=cpu "$CRIU" dump -t "$WL" -D "$a" -o dump.log -v4 --leave-running \
		>>"$CASE_DIR/criu.out" 2>&1 || fail "CPU dump failed: $(log_errors "$a/dump.log")"
	grep -a -q -E "; [0-9]+ by CPU, 0 by SDMA\)" "$a/dump.log" || fail "the CPU dump used SDMA"
	# The CPU engine again, with KFD's dma-bufs handed out (it may map BOs through them).
	mkdir -p "$c"
	ENGINE=cpu sup dump -t "$WL" -D "$c" -o dump.log -v4 --leave-running ||
		fail "CPU dump under the supervisor failed: $(log_errors "$c/dump.log")"
	sup dump -t "$WL" -D "$b" -o dump.log -v4 || fail "SDMA dump failed: $(log_errors "$b/dump.log")"
	all_by_sdma "$b/dump.log" saved 2
	for f in "$a"/amdgpu-*.img; do
		cmp -s "$f" "$b/${f##*/}" || fail "${f##*/} differs between the CPU and the SDMA dump"
		cmp -s "$f" "$c/${f##*/}" || fail "${f##*/} differs between the CPU dumps without and with dma-bufs"
		n=$((n + 1))
	done
	[ "$n" -ge 3 ] || fail "only $n amdgpu image files to compare"
	wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
}
case_images_match_cpu_engine() { on mi100x2 -- images_match; }

# dump_fails REGEX: the SDMA dump must fail with a reason matching REGEX, and leave the
# process running with its GPU work unpaused (two verifications, SDMA counters advancing).
dump_fails() {
	local d=$CASE_DIR/img v1 v2
	mkdir -p "$d"
	wl_start
	verify >/dev/null
	sup dump -t "$WL" -D "$d" -o dump.log -v4 && fail "the SDMA dump succeeded despite the fault"
	grep -a -q -E "$1" "$d/dump.log" || fail "dump.log lacks /$1/: $(log_errors "$d/dump.log")"
	alive "$WL" || fail "the failed dump killed gpu-workload $WL"
	v1=$(verify) || exit 1
	sleep 0.2
	v2=$(verify) || exit 1
	[ "$(json_list "$v2" counters)" != "$(json_list "$v1" counters)" ] ||
		fail "after the failed dump the SDMA counters do not advance: $(json_list "$v1" counters)"
	verify TERM >/dev/null
}
case_fault_cs_refused() { on mi100x2 --fail CS:EINVAL -- dump_fails 'AMDGPU_CS.*Invalid argument'; }
case_fault_wait_cs_timeout() {
	on mi100x2 --fail WAIT_CS:ETIME -- dump_fails 'SDMA.*(did not finish|did not signal|timed out|timeout)'
}
case_fault_gpu_reset_at_cs() {
	on mi100x2 --fail CS:ECANCELED -- dump_fails 'AMDGPU_CS.*(Operation canceled|GPU reset)'
}
case_fault_gpu_reset_in_job() {
	on mi100x2 --fail WAIT_CS:ECANCELED -- dump_fails 'WAIT_CS.*(Operation canceled|GPU reset)'
}
case_fault_gem_va_refused() { on mi100x2 --fail GEM_VA:ENOMEM -- dump_fails 'GEM_VA.*Cannot allocate memory'; }

# retried ERRNO: one CS fails with ERRNO (EAGAIN, EINTR: the kernel's "try again"); libdrm
# restarts such ioctls, and so does criu-rocm (kfd-abi's `restarting`). The dump must then
# succeed by SDMA.
retried() {
	local d=$CASE_DIR/img
	mkdir -p "$d"
	wl_start
	verify >/dev/null
	if sup dump -t "$WL" -D "$d" -o dump.log -v4; then
		wait_gone "$WL" 10 || fail "gpu-workload $WL still runs after the dump"
		all_by_sdma "$d/dump.log" saved 2
		sup restore -D "$d" -o restore.log -v4 -d || fail "SDMA restore failed: $(log_errors "$d/restore.log")"
		verify >/dev/null
		verify TERM >/dev/null
	else
		fail "one CS answered $1 was not retried: the dump failed: $(log_errors "$d/dump.log")"
	fi
}
case_retry_cs_eagain() { on mi100x2 --fail CS:EAGAIN:0:1 -- retried EAGAIN; }
case_retry_cs_eintr() { on mi100x2 --fail CS:EINTR:0:1 -- retried EINTR; }

# Debian's ROCr 5.2, unchanged, in criu-rocm's zdtm programs (gpu_rocr_buffers: buffers on
# four GPUs; gpu_rocr_stream: copy loops between the GPUs), dumped mid-work and restored by
# test/rocm/cr.sh with criu-rocm replaced by this wrapper: SDMA engine, under the supervisor.
# Every BO of every GPU must move by SDMA, both ways.
case_rocr_programs_4_gpus() {
	local w=$CASE_DIR/criu-sdma out wd logs=0 l
	printf '#!/bin/sh\nCRIU_ROCM_COPY_ENGINE=sdma exec %q supervise -- %q "$@"\n' "$KFD_EMU" "$CRIU" >"$w"
	chmod +x "$w"
	out=$(ROCM_CR_KEEP=1 CARGO_TARGET_DIR="${KFD_EMU%/release/kfd-emu}" "$top/test/rocm/cr.sh" "$w" \
		rocr_buffers_same_host rocr_stream_same_host 2>&1)
	printf '%s\n' "$out" >"$CASE_DIR/rocm-cr.out"
	wd=$(sed -n 's/.*work directory \(\/tmp\/criu-rocm-rocm-cr\.[A-Za-z0-9]*\).*/\1/p' <<<"$out")
	grep -q '^2 passed, 0 failed$' <<<"$out" ||
		fail "test/rocm/cr.sh with the SDMA engine: $(grep -E '^FAIL' <<<"$out" | head -n 2 | cut -c1-300 | paste -sd' ') ($wd)"
	for l in "$wd"/rocr_*/img-1/dump.log "$wd"/rocr_*/img-1/restore*.log; do
		[ -f "$l" ] || continue
		logs=$((logs + 1))
		grep -a -q -E ': (saved|restored) [0-9]+ BO\(s\)' "$l" || fail "$l: no GPU copy line"
		if grep -a -E ': (saved|restored) [0-9]+ BO\(s\)' "$l" | grep -v -q '; 0 by CPU, '; then
			fail "$l: BOs moved by the CPU: $(grep -a -E ': (saved|restored) [0-9]+ BO' "$l" | grep -v '; 0 by CPU' | head -n 1)"
		fi
	done
	[ "$logs" -ge 4 ] || fail "only $logs dump/restore logs in $wd"
	rm -rf "$wd"
}

# ---------------------------------------------------------------------------------------

# Every case, in the order of their names (as declared: `--list`).
ordered_cases() { declare -F | sed -n 's/^declare -f case_//p'; }

main() {
	cases_select test/sdma/run.sh "$@"
	WORK=$(mktemp -d /tmp/criu-rocm-sdma.XXXXXX)
	export WORK
	echo "SDMA tests: ${#WANTED[@]} case(s), criu-rocm $CRIU, work directory $WORK"
	cases_run_all "${SDMA_TEST_KEEP:-}"
}

cases_dispatch "$@"
CRIU=$(realpath "$1")
shift
[ "$(id -u)" = 0 ] || { echo "test/sdma/run.sh: needs root" >&2; exit 2; }
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
KFD_EMU=$target/kfd-emu
WORKLOAD=$target/gpu-workload
for b in "$CRIU" "$KFD_EMU" "$WORKLOAD"; do
	[ -x "$b" ] || { echo "test/sdma/run.sh: $b is missing (make kfd-tools build/criu-rocm)" >&2; exit 2; }
done
CASE_TIMEOUT=${SDMA_TEST_TIMEOUT:-300}
export CRIU KFD_EMU WORKLOAD CASE_TIMEOUT
exec unshare --pid --fork --mount-proc --kill-child "$self" __main "$@"
