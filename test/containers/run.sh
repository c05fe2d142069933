#!/usr/bin/env bash
# GPU containers checkpointed and restored by container engines with criu-rocm as their
# `criu` (issue 15), on kfd-emu hosts.
#
#   usage: test/containers/run.sh CRIU_BINARY [CASE...]   (as root; `make test-containers`)
#          test/containers/run.sh --list
#   env:   CARGO_TARGET_DIR    where kfd-emu and gpu-workload were built (default rust/target)
#          CRUN                crun built with CRIU (default build/crun-criu/bin/crun, which
#                              `make crun-criu` builds; Debian's crun has no CRIU)
#          CT_KEEP=1           keep the work directory even when everything passed
#
# criu-rocm is the `criu` the engines find: a directory holding a `criu` symlink to it comes
# first on PATH, as package criu-rocm-as-criu makes /usr/sbin/criu. Engines pass no plugin
# directory and no GPU option: the GPU path is criu-rocm's own. The same directory holds a
# `crun` symlink to $CRUN (crun with CRIU: its libcriu runs `criu swrk` from PATH).
#
# The container (test/containers/oci-config.py writes its config.json) runs gpu-workload
# from a busybox rootfs built here from the host's binaries (no network, no image registry),
# and is given /dev/kfd, some render nodes and the KFD topology of the emulated host, as a
# Kubernetes device plugin gives GPUs: bind mounts from kfd-emu's namespace (its nodes are
# FUSE files, not character devices) and device-cgroup rules for the render nodes. A case:
#   * starts the container on an emulated host and has the workload verify itself once
#     (SIGUSR1: every BO's pattern and the SDMA counters);
#   * checkpoints it with the engine, restores it with the engine (on the same host, on
#     another host, into a container given other GPUs), and has the workload verify again:
#     its GPU memory must be intact and its SDMA counters must have moved on;
#   * checks in criu-rocm's restore log which host GPUs the process got, and in the
#     restored process which render nodes it holds (they must be inside its container);
#     restored into a container given other render nodes at their own paths (the *-own-paths
#     cases, as Kubernetes' device plugin gives them), the container must hold exactly those;
#   * stops it with SIGTERM (a last verification, exit status 0).
#
# The Docker and containerd cases (docker.sh, containerd.sh, sourced below) run the same
# workload in containers their daemons make, on daemons of their own.
#
# Each case prints PASS, FAIL (with the reason and its directory) or SKIP (with the exact
# reason); the last line is "N passed, M failed, K skipped". Non-zero exit on any failure.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, known_bug, on, cases_dispatch; alive, wait_gone, ... (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"

PY=/usr/bin/python3
HOSTS=$top/test/gpu/hosts
CASES="runc-same-host runc-other-host runc-gpu-subset runc-own-paths runc-gpu-subset-own-paths"
CASES+=" runc-own-paths-too-few runc-device-nodes"
CASES+=" runc-rocr runc-rocr-gpu-subset runc-hip-gpu-subset crun-same-host crun-own-paths"
CASES+=" podman-export-import podman-crun-export-import podman-own-paths"
WL_ARGS="--mib 8 --bos 4 --interval-ms 2"
# The container's program: gpu-workload, or rocr-workload (Debian's ROCr, test/demo).
WL_CMD="exec /bin/gpu-workload $WL_ARGS </dev/null >/tmp/wl.out 2>&1"
ROCR_CMD="exec /bin/rocr-workload --mib 4 </dev/null >/tmp/wl.out 2>/tmp/wl.err"
# test/hip/mlp.hip (Debian's HIP 5.2): steps, and the step whose forward/backward kernel is
# in flight (held) at the checkpoint.
MLP_STEPS=10 MLP_AT=3
HIP_CMD="exec /bin/mlp --steps $MLP_STEPS --hold-at $MLP_AT --checksum --once </dev/null >/tmp/wl.out 2>/tmp/wl.err"

# ---------------------------------------------------------------------------------------
# Logs

# ---------------------------------------------------------------------------------------
# The container

# rootfs DIR: busybox (static), gpu-workload, rocr-workload and mlp with the libraries they
# link (and the code object manager HIP loads at run time), and libdrm's table of
# marketing names.
make_rootfs() {
	local r=$1 l a p comgr=/usr/lib/x86_64-linux-gnu/libamd_comgr.so.2
	mkdir -p "$r/bin" "$r/proc" "$r/dev" "$r/sys" "$r/tmp"
	chmod 1777 "$r/tmp"
	cp /bin/busybox "$r/bin/" || return 1
	for a in sh sleep cat kill ls; do ln -sf busybox "$r/bin/$a"; done
	cp "$WORKLOAD" "$r/bin/gpu-workload" || return 1
	cc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$r/bin/rocr-workload" "$top/test/demo/rocr-workload.c" \
		-lhsa-runtime64 -lpthread || return 1
	cp "$MLP" "$r/bin/mlp" && cp --parents -L "$comgr" "$r/" || return 1
	for p in "$WORKLOAD" "$r/bin/rocr-workload" "$MLP" "$comgr"; do
		for l in $(ldd "$p" | awk '$2 == "=>" { print $3 } $1 ~ /^\// { print $1 }'); do
			cp --parents -L "$l" "$r/" || return 1
		done
	done
	if [ -f /usr/share/libdrm/amdgpu.ids ]; then
		cp --parents /usr/share/libdrm/amdgpu.ids "$r/" || return 1
	fi
}

# bundle DIR MINORS [HOST_MINORS]: a bundle whose container has render nodes MINORS (bound
# from the host's HOST_MINORS, default the same) and runs $WL_CMD (with ROCr, the CPU
# topology libhsakmt reads too); with DEVICE_NODES (minors), also those render nodes as
# device files (linux.devices).
bundle() {
	local dir=$1 minors=$2 hostm=${3:-$2} extra=()
	[ "$hostm" = "$minors" ] || extra=(--host-minors "$hostm")
	[ -z "${DEVICE_NODES:-}" ] || extra+=(--device-nodes "$DEVICE_NODES")
	[ "$WL_CMD" != "$ROCR_CMD" ] && [ "$WL_CMD" != "$HIP_CMD" ] || extra+=(--cpu-topology yes)
	mkdir -p "$dir"
	"$PY" "$here/oci-config.py" "$dir/config.json" "$ROOTFS" "$minors" \
		--cgroups-path "/criu-rocm-ct/$CASE-$$" "${extra[@]}" -- /bin/sh -c "$WL_CMD" ||
		fail "writing $dir/config.json failed"
}

# The workload's output, read through the container's root.
wl_out() { cat "/proc/$1/root/tmp/wl.out" 2>/dev/null; }

# wl_line PID N: waits for line N of the workload's output and prints it.
wl_line() {
	local pid=$1 n=$2 i
	for ((i = 0; i < 600; i++)); do
		[ "$(wl_out "$pid" | wc -l)" -ge "$n" ] && break
		alive "$pid" || break
		sleep 0.05
	done
	[ "$(wl_out "$pid" | wc -l)" -ge "$n" ] || {
		echo "gpu-workload (pid $pid) wrote no line $n: $(wl_out "$pid" | tail -n 2 | paste -sd'|')" >&2
		return 1
	}
	wl_out "$pid" | sed -n "${n}p"
}

# The first counter of a verification line (gpu-workload's SDMA counters, rocr-workload's
# copy loops).
counter() { sed -n 's/.*"\(counters\|loops\)":\[\([0-9]*\).*/\2/p' <<<"$1"; }

# verify PID N WHAT: a SIGUSR1 verification, line N, must be ok; prints it.
verify() {
	local pid=$1 n=$2 what=$3 l
	kill -USR1 "$pid" || fail "$what: cannot signal the workload ($pid)"
	l=$(wl_line "$pid" "$n" 2>&1) || fail "$what: $l"
	case $l in
	'{"ok":true'*'"errors":[]}') ;;
	*) fail "$what: the workload's verification failed: ${l:0:400}" ;;
	esac
	echo "$l"
}

# wl_ready PID: waits for the workload's ready line (kept in $CASE_DIR/ready) and has it
# verify once (line 2, kept in $CASE_DIR/before).
wl_ready() {
	local pid=$1 l
	l=$(wl_line "$pid" 1 2>&1) || fail "the workload did not start in the container: $l"
	case $l in '{"ready":true'*) ;; *) fail "the workload did not get ready: ${l:0:300}" ;; esac
	echo "$l" >"$CASE_DIR/ready"
	verify "$pid" 2 "before the checkpoint" >"$CASE_DIR/before"
}

# wl_moved_on PID N WHAT: the workload runs, its verification N is ok and its counters
# moved on from the one before the checkpoint (kept in $CASE_DIR/after).
wl_moved_on() {
	local pid=$1 n=$2 what=$3 l
	alive "$pid" || fail "$what: the workload ($pid) is not running"
	l=$(verify "$pid" "$n" "$what")
	[ "$(counter "$l")" -gt "$(counter "$(cat "$CASE_DIR/before")")" ] ||
		fail "$what: the SDMA counter did not move on: before $(cat "$CASE_DIR/before"), now $l"
	echo "$l" >"$CASE_DIR/after"
}

# wl_stop PID: SIGTERM; the workload's last verification must be ok.
wl_stop() {
	local pid=$1 l out
	# Its output lives in the container's /tmp, gone with the container: keep it open.
	exec {out}<"/proc/$pid/root/tmp/wl.out" || fail "cannot open the workload's output"
	kill -TERM "$pid"
	wait_gone "$pid" 10 || fail "the workload ($pid) did not exit on SIGTERM"
	l=$(tail -n 1 <&"$out")
	exec {out}<&-
	case $l in
	'{"ok":true'*'"errors":[]}') ;;
	*) fail "the last verification failed: ${l:-no line}" ;;
	esac
}

# The KFD topology the emulated host shows in sysfs: what a container binds (over a tmpfs
# /sys) when its engine makes it from options rather than from oci-config.py's config.
topology_dirs() {
	local n
	echo /sys/devices/virtual/kfd /sys/class/kfd /sys/class/drm /sys/dev/char
	for n in /sys/class/drm/renderD*; do realpath "$n" | cut -d/ -f1-4; done | sort -u
}

# engine_pid ENGINE ID: the container's init pid.
engine_pid() {
	"$ENGINE" --root "$WORK/$CASE/state" state "$1" 2>/dev/null |
		"$PY" -c 'import json, sys; print(json.load(sys.stdin)["pid"])'
}

# E ARGS...: the engine with this case's state directory, its output in engine.log.
E() {
	echo "+ $ENGINE $*" >>"$CASE_DIR/engine.log"
	"$ENGINE" --root "$WORK/$CASE/state" "$@" </dev/null >>"$CASE_DIR/engine.log" 2>&1
}

# ct_start ID BUNDLE: runs the container, waits for the workload's ready line and has it
# verify once. Leaves the verification line in $CASE_DIR/before.
ct_start() {
	local id=$1 b=$2 pid
	E run -d --bundle "$b" "$id" || fail "$ENGINE run failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|')"
	pid=$(engine_pid "$id") || fail "$ENGINE state $id: no pid"
	wl_ready "$pid"
}

# ct_checkpoint ID: the engine's checkpoint into $CASE_DIR/img (the container stops).
ct_checkpoint() {
	local id=$1 pid t0
	pid=$(engine_pid "$id")
	rm -rf "$CASE_DIR/img"
	mkdir -p "$CASE_DIR/img"
	t0=${EPOCHREALTIME/./}
	E checkpoint --image-path "$CASE_DIR/img" --work-path "$CASE_DIR/img" "$id" ||
		fail "$ENGINE checkpoint failed: $(log_errors "$CASE_DIR/img/dump.log")$(tail -n 1 "$CASE_DIR/engine.log")"
	echo "checkpoint: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	wait_gone "$pid" 10 || fail "the workload ($pid) still runs after the checkpoint"
	ls "$CASE_DIR/img"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "the checkpoint wrote no amdgpu-kfd-*.img"
}

# ct_restore ID BUNDLE: the engine's restore of $CASE_DIR/img as container ID; then a
# verification (line 3) whose counters moved on from the one before the checkpoint.
ct_restore() {
	local id=$1 b=$2 pid t0
	t0=${EPOCHREALTIME/./}
	E restore -d --image-path "$CASE_DIR/img" --work-path "$CASE_DIR/img" --bundle "$b" "$id" ||
		fail "$ENGINE restore failed: $(log_errors "$CASE_DIR/img/restore.log")"
	echo "restore: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	pid=$(engine_pid "$id") || fail "$ENGINE state $id after the restore: no pid"
	wl_moved_on "$pid" 3 "after the restore"
	echo "$pid" >"$CASE_DIR/pid"
}

# held_nodes PID: the render nodes the process holds open, as its fd links name them.
held_nodes() {
	local f
	for f in /proc/"$1"/fd/*; do readlink "$f"; done 2>/dev/null | grep -o 'renderD[0-9]*' | sort -u | paste -sd' '
}

# check_nodes_inside PID: every render node the process holds exists in its container.
check_nodes_inside() {
	local pid=$1 n held
	held=$(held_nodes "$pid")
	[ -n "$held" ] || fail "the restored workload holds no render node"
	for n in $held; do
		[ -e "/proc/$pid/root/dev/dri/$n" ] || fail "the restored workload holds $n, which is not in its container"
	done
	note "render nodes held after the restore: $held"
}

# render_names MINORS: "renderD128 renderD129" of "128,129".
render_names() { tr ',' '\n' <<<"$1" | sed 's/^/renderD/' | sort -u | paste -sd' '; }

# dri_names PID: the names in the process' /dev/dri.
dri_names() { find "/proc/$1/root/dev/dri" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort | paste -sd' '; }

# mapped_hosts: the host render minors criu-rocm's restore gave the image's GPUs.
mapped_hosts() {
	grep -a -o -- '-> host GPU 0x[0-9a-f]* (renderD[0-9]*)' "$CASE_DIR/img/restore.log" |
		grep -o 'renderD[0-9]*' | sort -u | paste -sd' '
}

# ct_stop ID: SIGTERM; the workload's last verification must be ok and it must exit 0.
ct_stop() {
	local id=$1 st
	wl_stop "$(cat "$CASE_DIR/pid")"
	st=$("$ENGINE" --root "$WORK/$CASE/state" state "$id" 2>/dev/null | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["status"])')
	[ "$st" = stopped ] || fail "after the workload's exit the container is '$st', not stopped"
	E delete -f "$id" || true
}

# ---------------------------------------------------------------------------------------
# Cases (the functions named in_* run on an emulated host)

in_same_host() {
	bundle "$CASE_DIR/b1" "$1"
	ct_start ct "$CASE_DIR/b1"
	ct_checkpoint ct
	ct_restore ct "$CASE_DIR/b1"
	check_nodes_inside "$(cat "$CASE_DIR/pid")"
	ct_stop ct
}

# in_dump_only MINORS [TOPOLOGY_GPUS]: start a container given render nodes MINORS and
# checkpoint it. With TOPOLOGY_GPUS (the host's count), the workload must have left out
# the GPUs it was not given (ENOENT on their nodes, as libhsakmt) and the dump must hold
# a KFD process of exactly the container's GPUs (KFD gives a process only the GPUs its
# device cgroup allows).
in_dump_only() {
	local n
	bundle "$CASE_DIR/b1" "$1"
	ct_start ct "$CASE_DIR/b1"
	if [ -n "${2:-}" ]; then
		n=$(tr ',' '\n' <<<"$1" | wc -l)
		[ "$(grep -o '"errno":2}' "$CASE_DIR/ready" | wc -l)" = $(($2 - n)) ] ||
			fail "the workload did not leave out the $(($2 - n)) GPUs the container was not given: $(cat "$CASE_DIR/ready")"
	fi
	ct_checkpoint ct
	if [ -n "${2:-}" ]; then
		grep -aq "GPU queues paused: $n GPU(s)" "$CASE_DIR/img/dump.log" ||
			fail "the dump did not hold a KFD process of the container's $n GPUs: $(grep -a 'GPU queues paused' "$CASE_DIR/img/dump.log" | head -n 1)"
		note "dumped a KFD process of $n GPUs; the workload left out $(($2 - n))"
	fi
}

# in_restore_as MINORS HOST_MINORS: restore into a container whose nodes MINORS are the
# host's HOST_MINORS; the restore must have given the image's GPUs exactly those.
in_restore_as() {
	local want got
	bundle "$CASE_DIR/b2" "$1" "$2"
	ct_restore ct "$CASE_DIR/b2"
	want=$(render_names "$2")
	got=$(mapped_hosts)
	[ "$got" = "$want" ] || fail "the restore gave the image's GPUs host nodes '$got', the container was given '$want'"
	note "restored onto host GPUs $got (container nodes renderD${1//,/ renderD})"
	check_nodes_inside "$(cat "$CASE_DIR/pid")"
	ct_stop ct
}

# in_restore_own_paths MINORS: restore into a container given the host's render nodes
# MINORS at their own paths (host renderD130 is the container's renderD130), as Kubernetes'
# AMD device plugin gives them, where the checkpoint's container had others. The engine
# names the new nodes as external mounts and the image's nodes have none: criu-rocm puts
# the image's render-node mounts at the new paths (patch 0050). The restore must have
# given the image's GPUs exactly MINORS, the container must hold exactly those nodes
# (no mount point of the old ones left), and the process must hold them.
in_restore_own_paths() {
	local want got have pid
	bundle "$CASE_DIR/b2" "$1"
	ct_restore ct "$CASE_DIR/b2"
	want=$(render_names "$1")
	got=$(mapped_hosts)
	[ "$got" = "$want" ] || fail "the restore gave the image's GPUs host nodes '$got', the container was given '$want'"
	pid=$(cat "$CASE_DIR/pid")
	have=$(dri_names "$pid")
	[ "$have" = "$want" ] || fail "the restored container's /dev/dri holds '$have', the engine gave it '$want'"
	grep -aq "the image's render node /dev/dri/renderD[0-9]* becomes" "$CASE_DIR/img/restore.log" ||
		fail "criu-rocm's restore log says nothing of placing the image's render nodes"
	note "restored onto host GPUs $got at their own paths (dumped with $(grep -ao "render node /dev/dri/renderD[0-9]* becomes" "$CASE_DIR/img/restore.log" | grep -o 'renderD[0-9]*' | paste -sd' '))"
	check_nodes_inside "$pid"
	[ "$(held_nodes "$pid")" = "$want" ] || fail "the restored workload holds '$(held_nodes "$pid")', not the container's '$want'"
	ct_stop ct
}

# rocr-workload (Debian's ROCr 5.2) in a runc container: VRAM on both GPUs, async copies
# streaming and one gated upload per GPU held in the SDMA ring across the checkpoint.
# After the restore: a check (line 3; the copy loops moved on), the gated copies released
# and checked (line 4), and SIGTERM's last check.
in_rocr() {
	local pid l
	WL_CMD=$ROCR_CMD
	bundle "$CASE_DIR/b1" "$1"
	ct_start ct "$CASE_DIR/b1"
	ct_checkpoint ct
	ct_restore ct "$CASE_DIR/b1"
	pid=$(cat "$CASE_DIR/pid")
	kill -USR2 "$pid"
	l=$(wl_line "$pid" 4 2>&1) || fail "releasing the gated copies: $l"
	case $l in
	'{"ok":true'*'"released":'[1-9]*'"errors":[]}') ;;
	*) fail "the gated copies held across the checkpoint failed: ${l:0:400}" ;;
	esac
	note "gated copies: ${l:0:80}"
	check_nodes_inside "$pid"
	ct_stop ct
}

case_runc-rocr() {
	export ENGINE=runc
	on mi100x2 -- in_rocr 128,129
}

# The same program from a container given 2 of mi250x8's 8 GPUs into one given 2 others:
# libhsakmt leaves out the six GPUs without a node (ROCr sees 2 agents), the restore must
# use exactly the new container's GPUs.
in_rocr_dump() {
	local l
	WL_CMD=$ROCR_CMD
	bundle "$CASE_DIR/b1" "$1"
	ct_start ct "$CASE_DIR/b1"
	l=$(cat "$CASE_DIR/ready")
	case $l in *'"gpus":2,'*) ;; *) fail "ROCr did not see exactly the container's 2 GPUs: $l" ;; esac
	ct_checkpoint ct
}
in_rocr_restore_as() {
	local pid l want got
	WL_CMD=$ROCR_CMD
	bundle "$CASE_DIR/b2" "$1" "$2"
	ct_restore ct "$CASE_DIR/b2"
	want=$(render_names "$2")
	got=$(mapped_hosts)
	[ "$got" = "$want" ] || fail "the restore gave the image's GPUs host nodes '$got', the container was given '$want'"
	note "restored onto host GPUs $got"
	pid=$(cat "$CASE_DIR/pid")
	kill -USR2 "$pid"
	l=$(wl_line "$pid" 4 2>&1) || fail "releasing the gated copies: $l"
	case $l in
	'{"ok":true'*'"released":'[1-9]*'"errors":[]}') ;;
	*) fail "the gated copies held across the checkpoint failed: ${l:0:400}" ;;
	esac
	check_nodes_inside "$pid"
	ct_stop ct
}
case_runc-rocr-gpu-subset() {
	export ENGINE=runc
	on mi250x8 -- in_rocr_dump 128,129
	on mi250x8 -- in_rocr_restore_as 128,129 134,135
}

# mlp (Debian's HIP 5.2: a small MLP trained with SGD) from a container given 2 of mi250x8's
# 8 GPUs into one given 2 others, checkpointed mid-training with a kernel in flight: step
# MLP_AT's forward/backward kernel is held at its gate (mlp --hold-at), its waves saved by
# kfd-emu at the checkpoint; restored and released (SIGUSR1), it must train to its end with
# every step's loss and the final weights bit-identical to an uninterrupted run's on the
# same host.
in_hip_dump() {
	local pid i
	WL_CMD=$HIP_CMD
	bundle "$CASE_DIR/b1" "$1"
	E run -d --bundle "$CASE_DIR/b1" ct || fail "$ENGINE run failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|')"
	pid=$(engine_pid ct) || fail "$ENGINE state ct: no pid"
	for ((i = 0; i < 1200; i++)); do
		wl_out "$pid" | grep -q "^mlp: step $MLP_AT in flight: 2 waves hold$" && break
		alive "$pid" || break
		sleep 0.1
	done
	wl_out "$pid" | grep -q "^mlp: step $MLP_AT in flight: 2 waves hold$" ||
		fail "mlp's step $MLP_AT was not held in flight: $(wl_out "$pid" | tail -n 1)$(tail -n 2 "/proc/$pid/root/tmp/wl.err" 2>/dev/null | paste -sd'|')"
	ct_checkpoint ct
	grep -aqE "kfd-emu: process [0-9]+ queue [0-9]+ packet [0-9]+: [0-9]+ resident waves saved" "$CASE_DIR/kfd-emu.log" ||
		fail "kfd-emu saved no waves at the checkpoint (the kernel in flight; kfd-emu.log)"
	"$MLP" --steps "$MLP_STEPS" --checksum --once >"$CASE_DIR/mlp-uninterrupted.out" 2>&1 ||
		fail "the uninterrupted mlp run failed: $(tail -n 2 "$CASE_DIR/mlp-uninterrupted.out" | paste -sd'|')"
}
in_hip_restore_as() {
	local pid out want got first
	WL_CMD=$HIP_CMD
	bundle "$CASE_DIR/b2" "$1" "$2"
	E restore -d --image-path "$CASE_DIR/img" --work-path "$CASE_DIR/img" --bundle "$CASE_DIR/b2" ct ||
		fail "$ENGINE restore failed: $(log_errors "$CASE_DIR/img/restore.log")"
	pid=$(engine_pid ct) || fail "$ENGINE state ct after the restore: no pid"
	want=$(render_names "$2")
	got=$(mapped_hosts)
	[ "$got" = "$want" ] || fail "the restore gave the image's GPUs host nodes '$got', the container was given '$want'"
	check_nodes_inside "$pid"
	# Its output lives in the container's /tmp, gone with the container: keep it open.
	exec {out}<"/proc/$pid/root/tmp/wl.out" || fail "cannot open mlp's output"
	kill -USR1 "$pid"
	wait_gone "$pid" 300 || fail "the restored mlp did not finish its training"
	cat <&"$out" >"$CASE_DIR/mlp.out"
	exec {out}<&-
	tail -n 1 "$CASE_DIR/mlp.out" | grep -q '^mlp: PASSED$' || fail "the restored mlp's checks failed: $(tail -n 3 "$CASE_DIR/mlp.out" | paste -sd'|')"
	first=$(diff <(mlp_digest "$CASE_DIR/mlp-uninterrupted.out") <(mlp_digest "$CASE_DIR/mlp.out") | grep -m1 '^[<>]' | cut -c3-)
	[ -z "$first" ] || fail "the restored mlp differs from an uninterrupted run first at: $first"
	note "restored onto host GPUs $got during step $MLP_AT of $MLP_STEPS; losses and weights identical to an uninterrupted run ($(grep -o 'checksum [0-9a-f]*' "$CASE_DIR/mlp.out"))"
	E delete -f ct || true
}
# mlp's lines that must match: each step's loss with its bits, the weights' checksum.
mlp_digest() { grep -E '^mlp: (step [0-9]+ loss .*bits|weights checksum)' "$1"; }
case_runc-hip-gpu-subset() {
	export ENGINE=runc KFD_EMU_LOG=info
	on mi250x8 -- in_hip_dump 128,129
	on mi250x8 -- in_hip_restore_as 128,129 134,135
}

case_runc-same-host() {
	export ENGINE=runc
	on mi100x2 -- in_same_host 128,129
}

# mi100x2 → the same two MI100s seen by another machine: other gpu_ids, render minors
# 131 and 130. The container keeps its mount points renderD128/129 (CRIU restores the
# container's mount tree); the engine's restore config binds the new host's nodes there.
case_runc-other-host() {
	export ENGINE=runc
	on mi100x2 -- in_dump_only 128,129
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- in_restore_as 128,129 131,130
}

# mi250x8 (two XGMI hives of four): dumped in a container given GPUs 0 and 1 (renderD128,
# renderD129), restored into one given GPUs 6 and 7 (renderD134, renderD135), as a device
# plugin hands out two of eight GPUs. The topology shows all eight in both containers.
case_runc-gpu-subset() {
	export ENGINE=runc
	on mi250x8 -- in_dump_only 128,129 8
	on mi250x8 -- in_restore_as 128,129 134,135
}

# Kubernetes' way: mi100x2 → the other machine of the same two MI100s (minors 131, 130), into
# a container given renderD130 and renderD131 at their own paths.
case_runc-own-paths() {
	export ENGINE=runc
	on mi100x2 -- in_dump_only 128,129
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- in_restore_own_paths 130,131
}

# in_restore_refused MINORS REGEX: the restore into a container given render nodes MINORS
# at their own paths must fail, its log saying why (a line matching REGEX), with no process
# of the container left.
in_restore_refused() {
	local why pid
	bundle "$CASE_DIR/b2" "$1"
	E restore -d --image-path "$CASE_DIR/img" --work-path "$CASE_DIR/img" --bundle "$CASE_DIR/b2" ct &&
		fail "$ENGINE restore into a container given renderD${1//,/ renderD} succeeded; it must be refused"
	why=$(grep -a -m1 -E -- "$2" "$CASE_DIR/img/restore.log")
	[ -n "$why" ] || fail "the refused restore did not say why (/$2/): $(log_errors "$CASE_DIR/img/restore.log")"
	pid=$(engine_pid ct)
	if [ -n "$pid" ] && alive "$pid"; then fail "a process of the refused container runs ($pid)"; fi
	note "refused: ${why#*: }"
	E delete -f ct || true
}

# Two of mi250x8's eight GPUs (renderD128, renderD129) → two others (renderD134, renderD135)
# at their own paths, on the same host.
case_runc-gpu-subset-own-paths() {
	export ENGINE=runc
	on mi250x8 -- in_dump_only 128,129 8
	on mi250x8 -- in_restore_own_paths 134,135
}

# in_device_nodes STEP MINOR: hardware's render nodes, modelled: the host (this emulated
# host's private /dev) gets character devices renderD200 and renderD201 (226:200, 226:201:
# no GPU behind them, never opened), and the container is given renderD128/129 as bind
# mounts (its GPUs) and renderD<MINOR> as a device file, which runc makes with mknod in its
# /dev tmpfs and CRIU restores from the image as dumped. STEP dump: checkpoint a container
# given renderD200. STEP restore: restore into one given renderD201 instead; criu-rocm must
# replace the restored renderD200 by renderD201 (226:201), and the GPUs must work.
in_device_nodes() {
	local m pid have rdev
	for m in 200 201; do
		[ -e "/dev/dri/renderD$m" ] || mknod -m 666 "/dev/dri/renderD$m" c 226 "$m" ||
			fail "cannot make the host's device node /dev/dri/renderD$m"
	done
	if [ "$1" = dump ]; then
		DEVICE_NODES=$2 in_dump_only 128,129
		return
	fi
	DEVICE_NODES=$2 bundle "$CASE_DIR/b2" 128,129
	ct_restore ct "$CASE_DIR/b2"
	pid=$(cat "$CASE_DIR/pid")
	have=$(dri_names "$pid")
	[ "$have" = "renderD128 renderD129 renderD$2" ] ||
		fail "the restored container's /dev/dri holds '$have', runc gave it 'renderD128 renderD129 renderD$2'"
	rdev=$(stat -c '%F %t:%T' "/proc/$pid/root/dev/dri/renderD$2")
	[ "$rdev" = "character special file e2:$(printf '%x' "$2")" ] ||
		fail "the restored container's renderD$2 is '$rdev', not character device 226:$2"
	grep -aq "device node /dev/dri/renderD200 (226:200) of the image becomes /dev/dri/renderD$2 (226:$2" \
		"$CASE_DIR/img/restore.log" || fail "criu-rocm's restore log says nothing of replacing renderD200"
	note "the restored /dev tmpfs' renderD200 (226:200) became renderD$2 (226:$2)"
	check_nodes_inside "$pid"
	ct_stop ct
}

case_runc-device-nodes() {
	export ENGINE=runc
	on mi100x2 -- in_device_nodes dump 200
	on mi100x2 -- in_device_nodes restore 201
}

# A container dumped with two GPUs restored into one given a single other node: refused.
case_runc-own-paths-too-few() {
	export ENGINE=runc
	on mi100x2 -- in_dump_only 128,129
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- in_restore_refused 130 "have no source in this restore"
}

# cgroup_v1 FN ARGS...: FN with crun able to make cgroups here. These machines run cgroups
# in hybrid mode with a controller (hugetlb) in the cgroup2 hierarchy that no v1 hierarchy
# took, and crun refuses that ("cgroups in hybrid mode not supported, drop all controllers
# from cgroupv2"; runc does not care). In the emulated host's own mount namespace (its
# mounts propagate nowhere) a tmpfs covers /sys/fs/cgroup/unified, so crun sees cgroup v1
# alone, as on a host whose v1 hierarchies hold every controller.
cgroup_v1() {
	local c
	c=$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)
	if [ -n "$c" ]; then
		mount -t tmpfs -o size=4k,mode=755 no-cgroup2 /sys/fs/cgroup/unified ||
			fail "cannot cover /sys/fs/cgroup/unified (cgroup2 controllers: $c) for crun"
	fi
	"$@"
}

# crun built with CRIU ($CRUN, `crun` on PATH): crun dlopens libcriu.so.2, which runs
# `criu swrk` from PATH, criu-rocm.
case_crun-same-host() {
	export ENGINE=crun
	on mi100x2 -- cgroup_v1 in_same_host 128,129
}

# crun 1.8.1 restores into the checkpointed cgroups (CRIU, --manage-cgroups soft, creates
# them with the dumped properties) and moves the process into its own only after CRIU
# returned; unlike runc, it names CRIU no cgroup of the new container. Under cgroup v1 the
# dumped devices cgroup allows the old render minors alone, so the GPUs of the new
# container's nodes cannot be opened while the task is restored: the restore must fail
# closed, after criu-rocm placed crun's external mounts at the new paths.
in_crun_refused() {
	in_restore_refused 130,131 "opening /dev/dri/renderD13[01]: .*Operation not permitted"
	grep -aq "the image's render node /dev/dri/renderD128 becomes /dev/dri/renderD130" "$CASE_DIR/img/restore.log" ||
		fail "criu-rocm did not place crun's render-node mounts at the new paths"
}
case_crun-own-paths() {
	export ENGINE=crun
	on mi100x2 -- cgroup_v1 in_dump_only 128,129
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- cgroup_v1 in_crun_refused
}

# podman with this case's own storage and state (vfs: no overlay mounts to leave behind),
# cgroupfs (cgroup v1 here) and the OCI runtime $PODMAN_RUNTIME (runc, or crun with CRIU);
# the rlimits the runtime sets must not exceed this machine's (no CAP_SYS_RESOURCE:
# podman's default RLIMIT_NOFILE of 1048576 cannot be set here).
pod() {
	podman --root "$WORK/podman/root" --runroot "$WORK/podman/runroot" --tmpdir "$WORK/podman/tmp" \
		--storage-driver vfs --cgroup-manager cgroupfs --events-backend file \
		--runtime "${PODMAN_RUNTIME:-runc}" "$@"
}
P() {
	echo "+ podman $*" >>"$CASE_DIR/engine.log"
	pod "$@" </dev/null >>"$CASE_DIR/engine.log" 2>&1
}

# podman's CRIU log of the last checkpoint or restore, from the archive or the container.
podman_log() {
	local f=$1 d
	d=$(pod inspect -f '{{.StaticDir}}' gpuct 2>/dev/null)
	if [ -n "$d" ] && [ -f "$d/$f" ]; then
		cat "$d/$f"
	elif [ -f "$CASE_DIR/ck.tar.zst" ]; then
		tar -xOf "$CASE_DIR/ck.tar.zst" "$f" 2>/dev/null
	fi
}

# in_podman_checkpoint MINORS: a container given render nodes MINORS runs gpu-workload,
# which verifies once; `podman container checkpoint --export` into $CASE_DIR/ck.tar.zst,
# and the container is removed.
in_podman_checkpoint() {
	local minors=$1 m d pid l t0 args=()
	tar -C "$ROOTFS" -c . | pod import - localhost/criu-rocm-gpu-ct:test >>"$CASE_DIR/engine.log" 2>&1 ||
		fail "podman import of the rootfs failed: $(tail -n 1 "$CASE_DIR/engine.log")"
	# shellcheck disable=SC2054 # commas inside the mount specifications
	args=(--name gpuct -d --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
		--mount type=tmpfs,destination=/sys --mount type=tmpfs,destination=/tmp
		--mount type=bind,source=/dev/kfd,destination=/dev/kfd)
	for m in ${minors//,/ }; do
		args+=(--mount "type=bind,source=/dev/dri/renderD$m,destination=/dev/dri/renderD$m"
			--device-cgroup-rule "c 226:$m rw")
	done
	for d in $(topology_dirs); do
		args+=(--mount "type=bind,source=$d,destination=$d,ro=true")
	done
	P run "${args[@]}" localhost/criu-rocm-gpu-ct:test \
		/bin/sh -c "exec /bin/gpu-workload $WL_ARGS </dev/null >/tmp/wl.out 2>&1" ||
		fail "podman run failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|')"
	pid=$(pod inspect -f '{{.State.Pid}}' gpuct 2>/dev/null)
	alive "${pid:-0}" || fail "the podman container is not running: $(pod logs gpuct 2>&1 | tail -n 2 | paste -sd'|')"
	wl_ready "$pid"
	t0=${EPOCHREALTIME/./}
	P container checkpoint --export "$CASE_DIR/ck.tar.zst" gpuct ||
		fail "podman container checkpoint --export failed: $(log_errors <(podman_log dump.log)) $(tail -n 1 "$CASE_DIR/engine.log")"
	echo "checkpoint --export: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	wait_gone "$pid" 10 || fail "the workload ($pid) still runs after the checkpoint"
	# Listed first: `| grep -q` under pipefail fails when tar gets SIGPIPE.
	l=$(tar -tf "$CASE_DIR/ck.tar.zst" 2>&1)
	grep -q 'checkpoint/amdgpu-kfd-.*\.img' <<<"$l" ||
		fail "the exported archive holds no checkpoint/amdgpu-kfd-*.img"
	P rm -f gpuct || fail "podman rm failed"
}

# podman_retarget OLD NEW: the exported container now gets the host's render nodes NEW
# (comma separated) at their own paths in place of OLD. podman has no option to give a
# restored container other devices; a CRI engine restoring for the kubelet builds the new
# container from the new pod's spec, which the device plugin filled. This rewrites the
# container configuration in the archive that `restore --import` creates the container
# from (config.dump, spec.dump): the render-node bind mounts and device-cgroup rules.
podman_retarget() {
	local x=$CASE_DIR/retarget
	rm -rf "$x"
	mkdir -p "$x"
	tar -C "$x" -xf "$CASE_DIR/ck.tar.zst" || fail "cannot unpack the exported archive"
	"$PY" - "$x" "$1" "$2" <<'PYEOF' || fail "rewriting the archive's container configuration failed"
import json, sys
root, old, new = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
m = dict(zip((int(o) for o in old), (int(n) for n in new)))
def fix(v):
    if isinstance(v, dict):
        if v.get("major") == 226 and v.get("minor") in m:
            v = dict(v, minor=m[v["minor"]])
        return {k: fix(x) for k, x in v.items()}
    if isinstance(v, list):
        return [fix(x) for x in v]
    if isinstance(v, str):
        for o, n in m.items():
            v = v.replace(f"/dev/dri/renderD{o}", f"/dev/dri/renderD{n}")
    return v
for f in ("config.dump", "spec.dump"):
    with open(f"{root}/{f}") as h:
        d = json.load(h)
    with open(f"{root}/{f}", "w") as h:
        json.dump(fix(d), h)
PYEOF
	tar -C "$x" --zstd -cf "$CASE_DIR/ck.tar.zst" . || fail "cannot pack the rewritten archive"
	rm -rf "$x"
}

# in_podman_restore [MINORS]: `podman container restore --import`, a verification whose
# counters moved on, the render nodes it holds inside the container (exactly MINORS when
# given, which the restore must have given the image's GPUs), then SIGTERM's last one.
in_podman_restore() {
	local pid l out t0 want got n
	t0=${EPOCHREALTIME/./}
	P container restore --import "$CASE_DIR/ck.tar.zst" ||
		fail "podman container restore --import failed: $(log_errors <(podman_log restore.log)) $(tail -n 1 "$CASE_DIR/engine.log")"
	echo "restore --import: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	pid=$(pod inspect -f '{{.State.Pid}}' gpuct 2>/dev/null)
	wl_moved_on "${pid:-0}" 3 "after the restore"
	check_nodes_inside "$pid"
	if [ -n "${1:-}" ]; then
		# podman keeps no restore.log after a restore that worked: the container's nodes
		# must be the host's of the same names (device and inode), and the only ones.
		want=$(render_names "$1")
		for n in $want; do
			[ "$(stat -c %d:%i "/proc/$pid/root/dev/dri/$n" 2>&1)" = "$(stat -c %d:%i "/dev/dri/$n")" ] ||
				fail "the restored container's /dev/dri/$n is not the host's $n"
		done
		got=$(dri_names "$pid")
		[ "$got" = "$want" ] || fail "the restored container's /dev/dri holds '$got', podman gave it '$want'"
		[ "$(held_nodes "$pid")" = "$want" ] || fail "the restored workload holds '$(held_nodes "$pid")', not '$want'"
		note "restored onto host GPUs $want at their own paths"
	fi
	wl_stop "$pid"
	P rm -f gpuct || true
}

in_podman() {
	in_podman_checkpoint "$1"
	in_podman_restore ""
}

case_podman-export-import() {
	on mi100x2 -- in_podman 128,129
}

# podman with crun built with CRIU as its OCI runtime.
case_podman-crun-export-import() {
	export PODMAN_RUNTIME=$CRUN
	on mi100x2 -- cgroup_v1 in_podman 128,129
}

# Checkpointed with renderD128/129, restored on the other machine of mi100x2's two MI100s
# (minors 131, 130) into a container given renderD130/131 at their own paths.
case_podman-own-paths() {
	on mi100x2 -- in_podman_checkpoint 128,129
	podman_retarget 128,129 130,131
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- in_podman_restore 130,131
}

# containerd and Docker: their cases, in files of their own.
# shellcheck source=SCRIPTDIR/containerd.sh
. "$here/containerd.sh"
# shellcheck source=SCRIPTDIR/docker.sh
. "$here/docker.sh"

# ---------------------------------------------------------------------------------------
# Driver

run_case() {
	CASE=$1
	CASE_DIR=$WORK/$CASE
	mkdir -p "$CASE_DIR"
	export CASE CASE_DIR
	local t0=${EPOCHREALTIME/./} rc
	("case_$CASE")
	rc=$?
	local ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
	if [ -s "$CASE_DIR/skip" ]; then
		SKIPPED=$((SKIPPED + 1))
		echo "SKIP $CASE: $(cat "$CASE_DIR/skip")"
	elif [ $rc = 0 ] && [ ! -s "$CASE_DIR/reason" ]; then
		PASSED=$((PASSED + 1))
		echo "PASS $CASE ($((ms / 1000)).$((ms % 1000 / 100)) s; $(paste -sd';' "$CASE_DIR/times" 2>/dev/null)${CASE_DIR:+; }$(paste -sd';' "$CASE_DIR/notes" 2>/dev/null))"
	else
		FAILED=$((FAILED + 1))
		echo "FAIL $CASE: $(head -c 1500 "$CASE_DIR/reason" 2>/dev/null || echo "exit status $rc") ($CASE_DIR)"
	fi
}

main() {
	case ${1:-} in
	--list)
		tr ' ' '\n' <<<"$CASES"
		exit 0
		;;
	__in)
		shift
		"$@"
		exit $?
		;;
	"" | -*)
		echo "usage: $0 CRIU_BINARY [CASE...]" >&2
		exit 2
		;;
	esac
	[ "$(id -u)" = 0 ] || { echo "test/containers: must run as root" >&2; exit 2; }
	CRIU=$(realpath "$1")
	shift
	local target=${CARGO_TARGET_DIR:-$top/rust/target} t missing=()
	KFD_EMU=$target/release/kfd-emu
	WORKLOAD=$target/release/gpu-workload
	# hip_build
	# shellcheck source=SCRIPTDIR/../hip/build.sh
	. "$top/test/hip/build.sh"
	MLP=$(hip_build "$top/test/hip/mlp.hip" "$top/build/hip/mlp" "$top/build/hip/logs/mlp.build") ||
		{ echo "test/containers: building test/hip/mlp.hip failed (log: build/hip/logs/mlp.build)" >&2; exit 2; }
	for t in "$CRIU" "$KFD_EMU" "$WORKLOAD"; do
		[ -x "$t" ] || { echo "test/containers: $t is missing (build it first)" >&2; exit 2; }
	done
	CRUN=$(realpath -m "${CRUN:-$top/build/crun-criu/bin/crun}")
	[ -x "$CRUN" ] || { echo "test/containers: $CRUN is missing: crun with CRIU, which make crun-criu builds (Debian's crun has no CRIU)" >&2; exit 2; }
	case $("$CRUN" --version) in
	*+CRIU*) ;;
	*) echo "test/containers: $CRUN --version lists no +CRIU: it cannot checkpoint" >&2; exit 2 ;;
	esac
	# scripts/install-deps.sh installs them: missing is a failure, not a skip.
	for t in runc crun podman busybox ldd dockerd /usr/bin/docker containerd ctr; do
		command -v "$t" >/dev/null || missing+=("$t")
	done
	[ ${#missing[@]} = 0 ] || { echo "test/containers: not installed: ${missing[*]} (run scripts/install-deps.sh)" >&2; exit 2; }
	WORK=$(mktemp -d /tmp/criu-rocm-containers.XXXXXX)
	mkdir -p "$WORK/bin"
	ln -s "$CRIU" "$WORK/bin/criu"
	ln -s "$CRUN" "$WORK/bin/crun"
	PATH=$WORK/bin:$PATH
	ROOTFS=$WORK/rootfs
	make_rootfs "$ROOTFS" || { echo "test/containers: building the rootfs failed" >&2; exit 1; }
	[ "$(command -v criu)" = "$WORK/bin/criu" ] || { echo "test/containers: criu on PATH is $(command -v criu)" >&2; exit 1; }
	export PATH WORK ROOTFS KFD_EMU WORKLOAD MLP CRIU CRUN
	echo "test/containers: criu on PATH is criu-rocm ($(criu --version | head -n 1)); runc $(runc --version | sed -n '1s/runc version //p'), crun $(crun --version | sed -n '1s/crun version //p'), podman $(podman --version | sed 's/podman version //'); work in $WORK"
	PASSED=0 FAILED=0 SKIPPED=0
	local c list=("$@")
	[ ${#list[@]} -gt 0 ] || read -ra list <<<"$CASES"
	for c in "${list[@]}"; do
		run_case "$c"
	done
	local tail=""
	[ "$SKIPPED" = 0 ] || tail=", $SKIPPED skipped"
	# The containers' cgroups (runc leaves their parent behind); rmdir takes only empty ones,
	# so the cgroups of containers still running elsewhere stay.
	rmdir /sys/fs/cgroup/*/criu-rocm-ct/* /sys/fs/cgroup/*/criu-rocm-ct 2>/dev/null
	echo "$PASSED passed, $FAILED failed$tail"
	if [ "$FAILED" = 0 ] && [ -z "${CT_KEEP:-}" ]; then
		rm -rf "$WORK"
	fi
	[ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
}

main "$@"
