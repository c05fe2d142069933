# shellcheck shell=bash
# The Docker cases of test/containers/run.sh (sourced by it after containerd.sh; they use
# the helpers of both): Debian's docker.io 20.10, dockerd → containerd → runc → `criu swrk`,
# with criu-rocm as runc's criu.
#
# Each emulated host runs a dockerd of the case's own, started inside kfd-emu's namespace
# (the only place /dev/kfd and the render nodes exist) with its own data root, exec root,
# socket and pid file, experimental mode (checkpoints), no network (`bridge: none`,
# `iptables: false`), the vfs storage driver (no overlay mounts) and a cgroup parent under
# /criu-rocm-ct. Its containerd is the one dockerd starts (its socket in the exec root).
# The image is the suite's busybox rootfs, `docker import`ed (no registry).
#
# The container is given the GPUs as ROCm's `--device /dev/kfd --device /dev/dri` gives
# them on hardware, but by bind mounts: kfd-emu's nodes are FUSE files, which `docker run
# --device` refuses ("not a device node"). So `--mount type=bind` of /dev/kfd and of each
# render node, `--device-cgroup-rule 'c 226:N rw'` for each (KFD and kfd-emu give a process
# only the GPUs its device cgroup allows), and the emulator's KFD topology bound read-only
# over a tmpfs /sys (docker's own sysfs would show the VM's, which has no KFD).
#
# How dockerd reaches criu-rocm: `criu` first on dockerd's PATH (containerd and its runc
# shim inherit it), or a daemon.json runtime that runs runc with `--criu criu-rocm`
# (runc 1.1 of bookworm honours it; runc 1.2 ignores it and 1.4 removed it). The cases use
# both: docker-other-host runs its dockerds with a `criu` on PATH that fails if run, so only
# the runtime's `--criu` can have checkpointed and restored it.
#
# Cases:
#   docker-same-host   `docker checkpoint create --leave-running=false` and `docker start
#                      --checkpoint` of the same container
#   docker-other-host  checkpoint with --checkpoint-dir on one host; on another host (other
#                      gpu_ids and render minors) a new dockerd, `docker create` of a new
#                      container given that host's GPUs at the old paths, the checkpoint
#                      copied into its checkpoints/ (dockerd 20.10 answers `docker start
#                      --checkpoint-dir` with "custom checkpointdir is not supported") and
#                      `docker start --checkpoint`
#   docker-dump-fails  KFD fails the dump's CHECKPOINT op: `docker checkpoint create` fails,
#                      the container runs on (not paused, its GPU unpaused, its counters
#                      moving); then a checkpoint and restore of it succeed

# shellcheck disable=SC2153 # CASE, CRIU, WORK, ... are run.sh's
CASES+=" docker-same-host docker-other-host docker-dump-fails"

# Debian's CLI, which matches its dockerd (a machine may carry a newer one in /usr/local/bin).
DOCKER=/usr/bin/docker
DK_IMAGE="criu-rocm-gpu-ct:test"

# ---------------------------------------------------------------------------------------
# dockerd

# dockerd_start DIR [RUNTIME_CRIU]: a dockerd whose state lives in DIR; DOCKER_HOST points
# at it. With RUNTIME_CRIU, its default runtime is runc with `--criu RUNTIME_CRIU`, and the
# `criu` on its PATH fails if anything runs it. Stopped when the calling process exits.
dockerd_start() {
	local d=$1 criu=${2:-} i path=$PATH
	mkdir -p "$d/root" "$d/exec"
	"$PY" - "$d" "$criu" "/criu-rocm-ct/$CASE-$$" >"$d/daemon.json" <<'EOF' || fail "writing $d/daemon.json failed"
import json, sys
d, criu, cgroup = sys.argv[1:4]
c = {"experimental": True, "bridge": "none", "iptables": False, "ip-masq": False,
     "ip-forward": False, "storage-driver": "vfs", "data-root": d + "/root",
     "exec-root": d + "/exec", "pidfile": d + "/dockerd.pid",
     "hosts": ["unix://" + d + "/docker.sock"], "cgroup-parent": cgroup,
     "shutdown-timeout": 5}
if criu:
    c["runtimes"] = {"criu-rocm": {"path": "runc", "runtimeArgs": ["--criu", criu]}}
    c["default-runtime"] = "criu-rocm"
json.dump(c, sys.stdout, indent=1)
EOF
	if [ -n "$criu" ]; then
		mkdir -p "$d/bin"
		printf '#!/bin/sh\necho "the criu on PATH ran ($*), not the runtime'"'"'s --criu" >&2\nexit 1\n' >"$d/bin/criu"
		chmod +x "$d/bin/criu"
		path=$d/bin:${PATH#"$WORK/bin:"}
	fi
	PATH=$path dockerd --config-file "$d/daemon.json" </dev/null >"$d/dockerd.log" 2>&1 &
	DOCKERD_PID=$!
	trap dockerd_stop EXIT
	export DOCKER_HOST=unix://$d/docker.sock
	for ((i = 0; i < 600; i++)); do
		"$DOCKER" version >/dev/null 2>&1 && break
		alive "$DOCKERD_PID" || fail "dockerd exited: $(grep -a 'level=\(error\|fatal\)' "$d/dockerd.log" | tail -n 2 | paste -sd'|')"
		sleep 0.05
	done
	"$DOCKER" version >/dev/null 2>&1 || fail "dockerd did not answer on $d/docker.sock within 30 s"
	DK_ROOT=$d/root DK_EXEC=$d/exec
}

dockerd_stop() {
	kill -TERM "$DOCKERD_PID" 2>/dev/null && wait_gone "$DOCKERD_PID" 15
}

# D ARGS...: the docker CLI, its output in engine.log.
D() {
	echo "+ docker $*" >>"$CASE_DIR/engine.log"
	"$DOCKER" "$@" </dev/null >>"$CASE_DIR/engine.log" 2>&1
}

# The last lines docker printed, for a failure's reason.
dk_said() { tail -n "${1:-1}" "$CASE_DIR/engine.log" | paste -sd'|'; }

# dk FORMAT NAME: a field of docker inspect.
dk() { "$DOCKER" inspect -f "$1" "$2" 2>/dev/null; }

# ---------------------------------------------------------------------------------------
# The container

# dk_image: the suite's rootfs as image $DK_IMAGE.
dk_image() {
	tar -C "$ROOTFS" -c . | "$DOCKER" import - "$DK_IMAGE" >>"$CASE_DIR/engine.log" 2>&1 ||
		fail "docker import of the rootfs failed: $(dk_said)"
}

# dk_create NAME MINORS [HOST_MINORS]: docker create of container NAME running $WL_CMD,
# given render nodes /dev/dri/renderD<MINORS> bound from the host's HOST_MINORS (default
# the same) and /dev/kfd.
dk_create() {
	local name=$1 minors host d i args
	read -ra minors <<<"${2//,/ }"
	read -ra host <<<"${3:-$2}"
	read -ra host <<<"${host[*]//,/ }"
	# /sys/fs/cgroup too: docker mounts its defaults before the user's mounts, so its cgroup
	# mount would lie under the tmpfs /sys, on a directory of the container's rootfs that
	# runc made, which a new container's rootfs lacks (CRIU: "Can't stat mountpoint").
	# shellcheck disable=SC2054 # commas inside the mount specifications
	args=(--name "$name" --network none --mount type=tmpfs,destination=/sys
		--mount type=tmpfs,destination=/sys/fs/cgroup --mount type=tmpfs,destination=/tmp
		--mount type=bind,source=/dev/kfd,destination=/dev/kfd)
	for i in "${!minors[@]}"; do
		args+=(--mount "type=bind,source=/dev/dri/renderD${host[i]},destination=/dev/dri/renderD${minors[i]}"
			--device-cgroup-rule "c 226:${host[i]} rw")
	done
	for d in $(topology_dirs); do
		args+=(--mount "type=bind,source=$d,destination=$d,readonly")
	done
	D create "${args[@]}" "$DK_IMAGE" /bin/sh -c "$WL_CMD" || fail "docker create failed: $(dk_said 2)"
}

# dk_run NAME MINORS: creates and starts the container; the workload must get ready and
# verify once.
dk_run() {
	local pid
	dk_create "$@"
	D start "$1" || fail "docker start failed: $(dk_said 2)"
	pid=$(dk '{{.State.Pid}}' "$1")
	alive "${pid:-0}" || fail "the container is not running: $(dk '{{.State.Status}} {{.State.Error}}' "$1")"
	wl_ready "$pid"
}

# dk_checkpoint NAME CHECKPOINT [--checkpoint-dir DIR]: docker checkpoint create; the
# container must have stopped and the checkpoint must hold the GPU images.
dk_checkpoint() {
	local name=$1 cp=$2 pid t0 dir
	shift 2
	pid=$(dk '{{.State.Pid}}' "$name")
	t0=${EPOCHREALTIME/./}
	D checkpoint create --leave-running=false "$@" "$name" "$cp" ||
		fail "docker checkpoint create failed: $(dk_said 2)"
	echo "checkpoint: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	wait_gone "$pid" 10 || fail "the workload ($pid) still runs after the checkpoint"
	dir=$DK_ROOT/containers/$(dk '{{.Id}}' "$name")/checkpoints/$cp
	[ "${1:-}" != --checkpoint-dir ] || dir=$2/$cp
	ls "$dir"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "the checkpoint in $dir holds no amdgpu-kfd-*.img"
}

# dk_restore NAME CHECKPOINT: docker start --checkpoint; the workload must run on with its
# GPU memory intact and its counters moved on (verification 3). Keeps criu-rocm's restore
# log as $CASE_DIR/img/restore.log (with_restore_log, containerd.sh).
dk_restore() {
	local name=$1 cp=$2 pid t0 task
	task=io.containerd.runtime.v2.task/moby/$(dk '{{.Id}}' "$name")
	t0=${EPOCHREALTIME/./}
	with_restore_log "$DK_EXEC/containerd/daemon/$task/work/restore.log" \
		"$DK_ROOT/containerd/daemon/$task/restore.log" D start --checkpoint "$cp" "$name" ||
		fail "docker start --checkpoint failed: $(dk_said 2) $(log_errors "$CASE_DIR/img/restore.log")"
	[ -f "$CASE_DIR/img/restore.log" ] || fail "docker start --checkpoint left no restore.log"
	echo "restore: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	pid=$(dk '{{.State.Pid}}' "$name")
	wl_moved_on "${pid:-0}" 3 "after docker start --checkpoint"
	check_nodes_inside "$pid"
	echo "$pid" >"$CASE_DIR/pid"
}

# dk_stop NAME: SIGTERM's last verification; docker must see the workload exit with 0.
dk_stop() {
	local st i
	wl_stop "$(cat "$CASE_DIR/pid")"
	for ((i = 0; i < 100; i++)); do
		st=$(dk '{{.State.Status}} {{.State.ExitCode}}' "$1")
		[ "$st" = "exited 0" ] && break
		sleep 0.05
	done
	[ "$st" = "exited 0" ] || fail "after the workload's exit docker says the container is '$st', not 'exited 0'"
	D rm "$1" || fail "docker rm failed: $(dk_said)"
}

# ---------------------------------------------------------------------------------------
# Cases

in_docker_same_host() {
	dockerd_start "$CASE_DIR/d"
	dk_image
	dk_run gpuct "$1"
	dk_checkpoint gpuct cp1
	[ "$(dk '{{.State.Status}}' gpuct)" = exited ] || fail "after the checkpoint the container is '$(dk '{{.State.Status}}' gpuct)', not exited"
	dk_restore gpuct cp1
	dk_stop gpuct
}
case_docker-same-host() { on mi100x2 -- in_docker_same_host 128,129; }

in_docker_dump_to() {
	dockerd_start "$CASE_DIR/d1" "$CRIU"
	dk_image
	dk_run gpuct "$1"
	mkdir -p "$CASE_DIR/ck"
	dk_checkpoint gpuct cp1 --checkpoint-dir "$CASE_DIR/ck"
}
in_docker_restore_new() {
	local id want got
	dockerd_start "$CASE_DIR/d2" "$CRIU"
	dk_image
	dk_create gpuct2 "$1" "$2"
	id=$(dk '{{.Id}}' gpuct2)
	mkdir -p "$DK_ROOT/containers/$id/checkpoints"
	cp -a "$CASE_DIR/ck/cp1" "$DK_ROOT/containers/$id/checkpoints/" || fail "copying the checkpoint failed"
	dk_restore gpuct2 cp1
	want=$(tr ',' '\n' <<<"$2" | sed 's/^/renderD/' | sort -u | paste -sd' ')
	got=$(mapped_hosts)
	[ "$got" = "$want" ] || fail "the restore gave the image's GPUs host nodes '$got', the container was given '$want'"
	note "restored into a new container on another host, onto host GPUs $got (container nodes renderD${1//,/ renderD}), criu-rocm as runc --criu"
	dk_stop gpuct2
}
case_docker-other-host() {
	on mi100x2 -- in_docker_dump_to 128,129
	on mi100x2 --profile-file "$HOSTS/mi100x2-other.toml" -- in_docker_restore_new 128,129 131,130
}

# KFD fails the first CHECKPOINT op (kfd-emu --fail CHECKPOINT:EIO:0:1).
in_docker_dump_fails() {
	local pid id log l
	dockerd_start "$CASE_DIR/d"
	dk_image
	dk_run gpuct "$1"
	pid=$(dk '{{.State.Pid}}' gpuct)
	id=$(dk '{{.Id}}' gpuct)
	D checkpoint create gpuct cp1 && fail "docker checkpoint create succeeded although KFD failed the CHECKPOINT op"
	grep -q "criu-dump.log" <<<"$(dk_said)" || fail "docker's refusal does not name CRIU's log: $(dk_said)"
	# The runc shim keeps CRIU's log of a failed checkpoint in the bundle.
	log=$DK_EXEC/containerd/daemon/io.containerd.runtime.v2.task/moby/$id/criu-dump.log
	[ -f "$log" ] || fail "no criu-dump.log in the container's bundle after the failed checkpoint"
	cp "$log" "$CASE_DIR/dump.log"
	grep -aqE "amdgpu: pid [0-9]+: fd [0-9]+ \(/dev/kfd\): CHECKPOINT: .*Input/output error" "$log" ||
		fail "the failed dump's log does not name the CHECKPOINT failure: $(log_errors "$log")"
	grep -aqE "amdgpu: pid [0-9]+: GPU queues unpaused" "$log" ||
		fail "the failed dump's log does not say the GPU queues were unpaused: $(log_errors "$log")"
	note "criu-dump.log: $(grep -a -m1 -oE 'amdgpu: pid [0-9]+: fd [0-9]+ \(/dev/kfd\): CHECKPOINT: .*' "$log" | cut -c1-160)"
	l=$(dk '{{.State.Status}} {{.State.Paused}} {{.State.Pid}}' gpuct)
	[ "$l" = "running false $pid" ] || fail "after the failed checkpoint docker says '$l', not 'running false $pid'"
	wl_moved_on "$pid" 3 "after the failed checkpoint"
	note "the container ran on, GPU unpaused: $(cut -c1-90 "$CASE_DIR/after")"
	cp "$CASE_DIR/after" "$CASE_DIR/before"
	dk_checkpoint gpuct cp2
	D start --checkpoint cp2 gpuct || fail "docker start --checkpoint after a failed checkpoint failed: $(dk_said 2)"
	pid=$(dk '{{.State.Pid}}' gpuct)
	wl_moved_on "${pid:-0}" 4 "after checkpoint and restore following the failed one"
	echo "$pid" >"$CASE_DIR/pid"
	dk_stop gpuct
}
case_docker-dump-fails() { on mi100x2 --fail CHECKPOINT:EIO:0:1 -- in_docker_dump_fails 128,129; }
