# shellcheck shell=bash
# The containerd cases of test/containers/run.sh (sourced by it; they use its helpers), and
# what the Docker cases (docker.sh) share with them: containerd 1.6 of bookworm, its runc
# shim (io.containerd.runc.v2) → runc → `criu swrk`.
#
# Each emulated host runs a containerd of the case's own inside kfd-emu's namespace, with
# its own root, state, sockets and no CRI plugin; criu-rocm is the `criu` first on its PATH,
# which the shim and runc inherit. (The shim's CriuPath option would reach runc as
# `--criu`, but ctr has no flag for it, containerd 2.0 removed it and runc 1.2 ignores
# `--criu`: PATH is what works for every version.) Snapshots are `native` copies (no
# overlay mounts). The image is the suite's busybox rootfs as an OCI archive
# (test/containers/oci-image.py), `ctr images import`ed: no registry.
#
# ctr 1.6 restores a task only through `ctr containers restore`, from a checkpoint image
# of an image-based container (`ctr run --checkpoint` and `ctr tasks start --checkpoint`
# do not exist there; a `ctr tasks checkpoint` image cannot be restored by ctr). Such a
# container gets its devices from `ctr run --device`, which takes only device nodes:
# kfd-emu's FUSE nodes are bind-mounted instead, and since ctr has no flag for a
# device-cgroup rule alone, the container runs `--privileged` (every device allowed).
#
# Cases:
#   containerd-image-other-host  `ctr containers checkpoint --task --rw --image` of a running
#                      GPU container into an image (the container runs on, its GPU
#                      unpaused), `ctr images export` of it; on another host (a second
#                      mi100x2: the checkpoint's spec names the same render nodes) a new
#                      containerd imports it and `ctr containers restore --live --rw`
#                      restores the container, whose workload verifies its GPU memory

# shellcheck disable=SC2153,SC2154 # CASE, CRIU, WORK, here, ... are run.sh's
CASES+=" containerd-image-other-host"

CTR_IMAGE=localhost/criu-rocm-gpu-ct:test
CTR_CHECKPOINT=localhost/criu-rocm-gpu-ct-checkpoint:1

# ---------------------------------------------------------------------------------------
# The runc shim, under containerd and under dockerd

# with_restore_log WORK_LOG FINAL_LOG CMD...: runs CMD, a restore through the runc shim,
# keeping criu-rocm's restore log as $CASE_DIR/img/restore.log: the shim's CRIU work
# directory (WORK_LOG) goes with its bundle when the restore fails, so a copy of it is
# kept as it grows; after a restore that worked, the shim's copy (FINAL_LOG). Returns
# CMD's status.
with_restore_log() {
	local work=$1 final=$2 keeper rc
	shift 2
	mkdir -p "$CASE_DIR/img"
	(while :; do cp "$work" "$CASE_DIR/img/restore.log" 2>/dev/null; sleep 0.02; done) &
	keeper=$!
	"$@"
	rc=$?
	kill "$keeper"
	wait "$keeper" 2>/dev/null
	[ ! -f "$final" ] || cp "$final" "$CASE_DIR/img/restore.log"
	return $rc
}

# ---------------------------------------------------------------------------------------
# containerd

# containerd_start DIR: a containerd whose state lives in DIR; CTR_ADDRESS points at it.
# Stopped when the calling process exits.
containerd_start() {
	local d=$1 i
	mkdir -p "$d"
	cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"
EOF
	containerd --config "$d/config.toml" </dev/null >"$d/containerd.log" 2>&1 &
	CONTAINERD_PID=$!
	trap containerd_stop EXIT
	CTR_ADDRESS=$d/containerd.sock CTR_ROOT=$d/root CTR_STATE=$d/state
	for ((i = 0; i < 600; i++)); do
		ctr_ version >/dev/null 2>&1 && break
		alive "$CONTAINERD_PID" || fail "containerd exited: $(grep -a 'level=\(error\|fatal\)' "$d/containerd.log" | tail -n 2 | paste -sd'|')"
		sleep 0.05
	done
	ctr_ version >/dev/null 2>&1 || fail "containerd did not answer on $CTR_ADDRESS within 30 s"
}

containerd_stop() {
	kill -TERM "$CONTAINERD_PID" 2>/dev/null && wait_gone "$CONTAINERD_PID" 15
}

# ctr_ ARGS...: ctr on this case's containerd, namespace criu-rocm, native snapshots.
ctr_() {
	CONTAINERD_SNAPSHOTTER=native ctr --address "$CTR_ADDRESS" --namespace criu-rocm "$@"
}

# C ARGS...: ctr, its output in engine.log.
C() {
	echo "+ ctr $*" >>"$CASE_DIR/engine.log"
	ctr_ "$@" </dev/null >>"$CASE_DIR/engine.log" 2>&1
}

# ctr_pid ID: the pid of container ID's task.
ctr_pid() { ctr_ tasks ls 2>/dev/null | awk -v id="$1" '$1 == id { print $2 }'; }

# ctr_image: the suite's rootfs as image $CTR_IMAGE.
ctr_image() {
	[ -f "$WORK/image.oci.tar" ] || "$PY" "$here/oci-image.py" "$ROOTFS" "$WORK/image.oci.tar" "$CTR_IMAGE" ||
		fail "writing the OCI archive of the rootfs failed"
	C images import "$WORK/image.oci.tar" || fail "ctr images import failed: $(tail -n 1 "$CASE_DIR/engine.log")"
}

# ctr_gpu_run ID MINORS: ctr run of container ID from $CTR_IMAGE running $WL_CMD, given
# /dev/kfd and render nodes MINORS (bind mounts; see above) and the emulator's topology
# over a tmpfs /sys; the workload must get ready and verify once. runc keeps its state in
# the case's directory, not in the shared /run/containerd/runc (a checkpoint carries the
# runtime options: the restored container's runc uses the same), and the container's
# cgroup is under /criu-rocm-ct, which run.sh cleans up, as the runc cases'.
ctr_gpu_run() {
	local id=$1 m d pid args
	# shellcheck disable=SC2054 # commas inside the mount specifications
	args=(-d --null-io --privileged --runc-root "$CASE_DIR/runc" --cgroup "/criu-rocm-ct/$CASE-$$" --mount type=tmpfs,src=tmpfs,dst=/sys,options=nosuid:nodev:noexec
		--mount type=tmpfs,src=tmpfs,dst=/sys/fs/cgroup --mount type=tmpfs,src=tmpfs,dst=/tmp
		--mount type=bind,src=/dev/kfd,dst=/dev/kfd,options=rbind)
	for m in ${2//,/ }; do
		args+=(--mount "type=bind,src=/dev/dri/renderD$m,dst=/dev/dri/renderD$m,options=rbind")
	done
	for d in $(topology_dirs); do
		args+=(--mount "type=bind,src=$d,dst=$d,options=rbind:ro")
	done
	C run "${args[@]}" "$CTR_IMAGE" "$id" /bin/sh -c "$WL_CMD" ||
		fail "ctr run failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|')"
	pid=$(ctr_pid "$id")
	alive "${pid:-0}" || fail "the container's task is not running: $(ctr_ tasks ls 2>&1 | paste -sd'|')"
	wl_ready "$pid"
}

# ---------------------------------------------------------------------------------------
# Cases

in_ctr_checkpoint_export() {
	local pid t0 l
	containerd_start "$CASE_DIR/c1"
	ctr_image
	ctr_gpu_run ct "$1"
	pid=$(ctr_pid ct)
	t0=${EPOCHREALTIME/./}
	C containers checkpoint --task --rw --image ct "$CTR_CHECKPOINT" ||
		fail "ctr containers checkpoint failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|')"
	echo "checkpoint: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	[ "$(ctr_pid ct)" = "$pid" ] || fail "the checkpointed container's task is no longer $pid"
	wl_moved_on "$pid" 3 "the container after its checkpoint"
	C images export --skip-manifest-json "$CASE_DIR/checkpoint.tar" "$CTR_CHECKPOINT" ||
		fail "ctr images export of the checkpoint failed: $(tail -n 1 "$CASE_DIR/engine.log")"
	# The CRIU images: a tar blob inside the exported archive.
	l=$(for b in $(tar -tf "$CASE_DIR/checkpoint.tar" | grep '^blobs/sha256/.'); do
		tar -xOf "$CASE_DIR/checkpoint.tar" "$b" | tar -t 2>/dev/null
	done)
	grep -q '^amdgpu-kfd-.*\.img$' <<<"$l" || fail "the exported checkpoint image holds no amdgpu-kfd-*.img"
	note "checkpoint image: $(du -k "$CASE_DIR/checkpoint.tar" | cut -f1) KiB exported, $(grep -c '^amdgpu-' <<<"$l") GPU image files"
	wl_stop "$pid"
	C tasks rm ct
	C containers rm ct
}
in_ctr_import_restore() {
	local pid t0
	containerd_start "$CASE_DIR/c2"
	ctr_image
	C images import --all-platforms --no-unpack "$CASE_DIR/checkpoint.tar" ||
		fail "ctr images import of the checkpoint failed: $(tail -n 1 "$CASE_DIR/engine.log")"
	t0=${EPOCHREALTIME/./}
	with_restore_log "$CTR_STATE/io.containerd.runtime.v2.task/criu-rocm/ct/work/restore.log" \
		"$CTR_ROOT/io.containerd.runtime.v2.task/criu-rocm/ct/restore.log" \
		C containers restore --live --rw ct "$CTR_CHECKPOINT" ||
		fail "ctr containers restore failed: $(tail -n 2 "$CASE_DIR/engine.log" | paste -sd'|') $(log_errors "$CASE_DIR/img/restore.log")"
	echo "restore: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms" >>"$CASE_DIR/times"
	[ -f "$CASE_DIR/img/restore.log" ] || fail "ctr containers restore left no restore.log"
	pid=$(ctr_pid ct)
	wl_moved_on "${pid:-0}" 3 "after ctr containers restore"
	check_nodes_inside "$pid"
	wl_stop "$pid"
	C tasks rm ct || fail "ctr tasks rm after the workload's exit failed: $(tail -n 1 "$CASE_DIR/engine.log")"
	C containers rm ct
}
case_containerd-image-other-host() {
	on mi100x2 -- in_ctr_checkpoint_export 128,129
	on mi100x2 -- in_ctr_import_restore
}
