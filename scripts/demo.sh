#!/usr/bin/env bash
# make demo: GPU checkpoint/restore end to end on the emulator.
#
# Builds what is missing, runs three GPU programs on kfd-emu's four-GPU mi210x4 machine:
# gpu-workload (our KFD client: BOs with patterns, SDMA counters), rocr-workload (a
# program on Debian's ROCr 5.2, test/demo/rocr-workload.c: VRAM on every GPU, async copies
# streaming back from it, and one upload per GPU held in flight in the SDMA rings) and mlp
# (test/hip/mlp.hip, built with Debian's hipcc: a small MLP trained with SGD in HIP kernels,
# checkpointed mid-training between two steps; after the restore its loss curve and weights
# are compared bit for bit with an uninterrupted run's).
# Checkpoints each with criu-rocm (which kills them), restores them on a "different host"
# (the same profile with other gpu_ids, other render minors and another GPU order,
# test/demo/restore-host.toml), lets them verify their GPU memory, counters and copies (the
# in-flight uploads complete after the restore), and prints a summary. Exits non-zero,
# naming the step and the log, on any failure. Everything it writes is under build/demo/,
# which each run starts afresh.
#
#   usage: scripts/demo.sh             (as root; `make demo` runs it)
#   env:   DEMO_MIB=N   MiB of BOs per GPU (default 32)
#          DEMO_ROCR_MIB=N   MiB of VRAM per GPU for rocr-workload (default 16)
#          JOBS=N       build jobs (default 2)
#          DEMO_TIME_LIMIT=S   seconds the dump and restore may take (default 600)
#
# The run happens in a pid namespace of its own, so the pid the workload had at the dump is
# still free at the restore and nothing it started can outlive it. Inside, two kfd-emu
# instances run this script again as their command: `_dump` on the dump host, `_restore`
# on the restore host.
set -euo pipefail
export LC_ALL=C

self=$(realpath "$0")
top=$(cd "$(dirname "$self")/.." && pwd)
# alive, file_line, render_fds, json_ok/num/list
# shellcheck source=SCRIPTDIR/lib/workload.sh
. "$top/scripts/lib/workload.sh"
# hip_build
# shellcheck source=SCRIPTDIR/../test/hip/build.sh
. "$top/test/hip/build.sh"
demo=$top/build/demo
img=$demo/img
criu=$top/build/criu-rocm
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
kfd_emu=$target/kfd-emu
workload=$target/gpu-workload
rocr_workload=$top/build/demo/rocr-workload
rocr_log=$top/build/demo/rocr-workload.out
rocr_err=$top/build/demo/rocr-workload.err
rocr_img=$top/build/demo/img-rocr
rocr_mib=${DEMO_ROCR_MIB:-16}
mlp_bin=$top/build/hip/mlp
mlp_log=$demo/mlp.out
mlp_ref=$demo/mlp-uninterrupted.out
mlp_img=$demo/img-mlp
# mlp: training steps, the pause between them (ms), the step after which it is dumped.
mlp_steps=12 mlp_delay=700 mlp_at=5
profile=mi210x4
restore_override=$top/test/demo/restore-host.toml
wl_log=$demo/workload.out
wl_err=$demo/workload.err
mib=${DEMO_MIB:-32}
jobs=${JOBS:-2}
cargo=${CARGO:-cargo}
time_limit=${DEMO_TIME_LIMIT:-600}
steps=6

step() { echo "[$1/$steps] $2"; }
rel() { echo "${1#"$top"/}"; } # a path as seen from the top of the tree
note() { echo "      $*"; }
die() {
	echo "demo: FAIL: $*" >&2
	exit 1
}

now_us() { echo "${EPOCHREALTIME/./}"; }
# Microseconds as milliseconds or seconds, for people.
duration() {
	if [ "$1" -lt 1000000 ]; then
		echo "$(($1 / 1000)) ms"
	else
		printf '%d.%02d s\n' $(($1 / 1000000)) $(($1 % 1000000 / 10000))
	fi
}
human_bytes() {
	local b=$1
	if [ "$b" -ge $((1 << 20)) ]; then
		printf '%d.%d MiB\n' $((b >> 20)) $(((b & 0xfffff) * 10 >> 20))
	elif [ "$b" -ge 1024 ]; then
		echo "$((b >> 10)) KiB"
	else
		echo "$b B"
	fi
}
# Total size in bytes of the files matching a glob (0 when none).
bytes_of() {
	local f sum=0
	for f in "$@"; do [ -f "$f" ] && sum=$((sum + $(stat -c %s "$f"))); done
	echo "$sum"
}
count_of() {
	local f n=0
	for f in "$@"; do [ -f "$f" ] && n=$((n + 1)); done
	echo "$n"
}

# The last lines of CRIU's log worth reading when it failed.
criu_errors() {
	[ -f "$1" ] || return 0
	echo "--- last errors in $(rel "$1"):" >&2
	grep -E 'Error|amdgpu:' "$1" | tail -n 15 >&2 || true
}

# ---------------------------------------------------------------------------------------
# Inside kfd-emu (both hosts)

# The GPU nodes of the KFD topology in topology order, one "gpu_id render_minor" line each
# (gpu_id in hex), read from sysfs as any ROCm program would.
gpu_nodes() {
	local t=/sys/class/kfd/kfd/topology/nodes n id
	for n in "$t"/*; do echo "${n##*/}"; done | sort -n | while read -r n; do
		id=$(cat "$t/$n/gpu_id")
		[ "$id" != 0 ] || continue
		printf '0x%04x %s\n' "$id" "$(awk '$1 == "drm_render_minor" { print $2 }' "$t/$n/properties")"
	done
}

# The marketing name of the emulated GPUs (kfd-emu's resolved profile is there for scripts).
gpu_model() {
	sed -n 's/^marketing_name = "\(.*\)"$/\1/p' "${KFD_EMU_STATE_DIR:-/nonexistent}/profile.toml" 2>/dev/null |
		sort -u | paste -sd/
}

# Waits up to $3 seconds for line $1 of the workload's output (pid $2) and prints it; on
# failure also shows the end of its stderr.
workload_line() {
	file_line "$1" "$2" "$3" "$wl_log" && return 0
	tail -n 5 "$wl_err" >&2 2>/dev/null || true
	return 1
}

# The same for rocr-workload's output.
rocr_line() {
	file_line "$1" "$2" "$3" "$rocr_log" && return 0
	tail -n 5 "$rocr_err" >&2 2>/dev/null || true
	return 1
}

json_counters() { json_list "$1" counters; }

# A verification line must say ok; $2 names the moment.
check_verified() {
	json_ok "$1" || die "gpu-workload's verification $2 failed: $1 (log: $(rel "$wl_log"))"
}

# Every counter of line $2 must be greater than (gt) or at least (ge, $3) the one of $1.
counters_moved() {
	local a b i
	read -r -a a <<<"$(json_counters "$1")"
	read -r -a b <<<"$(json_counters "$2")"
	[ "${#a[@]}" -gt 0 ] && [ "${#a[@]}" = "${#b[@]}" ] || return 1
	for i in "${!a[@]}"; do
		if [ "$3" = ge ]; then
			((b[i] >= a[i])) || return 1
		else
			((b[i] > a[i])) || return 1
		fi
	done
}

save_env() {
	local file=$1 kv
	shift
	for kv in "$@"; do printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"; done >>"$file"
}

# rocr-workload on the dump host: start it, check it, dump it into $rocr_img. Its pid and
# numbers go to dump.env.
rocr_start() {
	local ngpus=$1 ready before
	: >"$rocr_log"
	setsid "$rocr_workload" --mib "$rocr_mib" </dev/null >"$rocr_log" 2>"$rocr_err" &
	rpid=$!
	ready=$(rocr_line 1 "$rpid" 120) || die "rocr-workload did not start (log: $(rel "$rocr_err"))"
	[[ $ready == '{"ready":true,'* ]] || die "rocr-workload's first line is not ready: $ready"
	[ "$(json_num "$ready" gpus)" = "$ngpus" ] ||
		die "ROCr shows rocr-workload $(json_num "$ready" gpus) GPUs, the topology $ngpus: $ready"
	sleep 1
	kill -USR1 "$rpid"
	before=$(rocr_line 2 "$rpid" 60) || die "rocr-workload did not answer SIGUSR1"
	json_ok "$before" || die "rocr-workload's check before the dump failed: $before"
	[ "$(json_num "$before" in_flight)" = "$ngpus" ] ||
		die "rocr-workload holds $(json_num "$before" in_flight) uploads in flight, not one per GPU: $before"
	note "rocr-workload (ROCr $(dpkg-query -W -f='${Version}' libhsa-runtime64-1 2>/dev/null)): pid $rpid," \
		"$rocr_mib MiB of VRAM per GPU checked, copy loops at $(json_list "$before" loops)," \
		"$ngpus uploads in flight"
}

rocr_dump() {
	local t0 t1 status
	mkdir -p "$rocr_img"
	t0=$(now_us)
	if ! { "$criu" dump -t "$rpid" -D "$rocr_img" -o dump.log -v4 2>&3; } 3>&2 2>/dev/null; then
		criu_errors "$rocr_img/dump.log"
		die "criu-rocm dump of rocr-workload failed (log: $(rel "$rocr_img")/dump.log)"
	fi
	t1=$(now_us)
	status=0
	wait "$rpid" 2>/dev/null || status=$?
	[ "$status" = 137 ] || die "after the dump, rocr-workload exited with status $status, not killed by criu (SIGKILL)"
	[ "$(count_of "$rocr_img"/amdgpu-kfd-*.img)" = 1 ] ||
		die "the dump of rocr-workload wrote no amdgpu-kfd-*.img (log: $(rel "$rocr_img")/dump.log)"
	note "rocr-workload (pid $rpid) dumped in $(duration $((t1 - t0))) with its copies in flight"
	save_env "$demo/dump.env" "rpid=$rpid" "rocr_dump_us=$((t1 - t0))"
}

# The dump host: start the workloads, let them run, checkpoint them.
dump_side() {
	local pid ready before t0 t1 status ngpus nkfd npages rpid
	gpu_nodes >"$demo/gpus-dump"
	ngpus=$(wc -l <"$demo/gpus-dump")
	[ "$ngpus" -gt 0 ] || die "kfd-emu shows no GPU in /sys/class/kfd/kfd/topology"
	save_env "$demo/dump.env" "model=$(gpu_model)"

	cd "$demo"
	step 2 "starting gpu-workload on $ngpus emulated GPUs ($profile), $mib MiB of BOs each"
	# Its own session and no terminal, so criu dumps it without --shell-job. The log exists
	# before the workload starts, for workload_line.
	: >"$wl_log"
	setsid "$workload" --mib "$mib" </dev/null >"$wl_log" 2>"$wl_err" &
	pid=$!
	ready=$(workload_line 1 "$pid" 60) || die "gpu-workload did not start (log: $(rel "$wl_err"))"
	[[ $ready == '{"ready":true,'* ]] || die "gpu-workload's first line is not ready: $ready"
	[ "$(json_num "$ready" pid)" = "$pid" ] || die "gpu-workload reports pid $(json_num "$ready" pid), setsid started $pid"
	note "pid $pid ready; SDMA counters running"
	sleep 1
	kill -USR1 "$pid"
	before=$(workload_line 2 "$pid" 30) || die "gpu-workload did not answer SIGUSR1"
	check_verified "$before" "before the dump"
	note "verified before the dump: counters at $(json_counters "$before")"
	render_fds "$pid" >"$demo/fds-dump"
	rocr_start "$ngpus"

	step 3 "checkpointing: criu-rocm dump -t $pid, then rocr-workload and mlp (logs: $(rel "$img")/dump.log, $(rel "$rocr_img")/dump.log, $(rel "$mlp_img")/dump.log)"
	mkdir -p "$img"
	t0=$(now_us)
	# bash's own stderr off around the dump: its notice that the workload was "Killed" is
	# expected, criu's messages still show (fd 3).
	if ! { "$criu" dump -t "$pid" -D "$img" -o dump.log -v4 2>&3; } 3>&2 2>/dev/null; then
		criu_errors "$img/dump.log"
		die "criu-rocm dump failed (log: $(rel "$img")/dump.log)"
	fi
	t1=$(now_us)
	status=0
	wait "$pid" 2>/dev/null || status=$?
	[ "$status" = 137 ] || die "after the dump, gpu-workload exited with status $status, not killed by criu (SIGKILL)"
	nkfd=$(count_of "$img"/amdgpu-kfd-*.img)
	npages=$(count_of "$img"/amdgpu-pages-*.img)
	if [ "$nkfd" = 0 ]; then
		die "criu-rocm dump succeeded but wrote no GPU image (amdgpu-kfd-*.img) into $(rel "$img"):" \
			"this criu-rocm does not save GPU state (log: $(rel "$img")/dump.log)"
	fi
	[ "$npages" = "$ngpus" ] ||
		die "the dump wrote $npages amdgpu-pages-*.img files for $ngpus GPUs (log: $(rel "$img")/dump.log)"
	note "dumped in $(duration $((t1 - t0))), workload killed"
	save_env "$demo/dump.env" "pid=$pid" "dump_us=$((t1 - t0))" "ngpus=$ngpus" \
		"bos_per_gpu=$(json_num "$ready" bos_per_gpu)"
	rocr_dump
	mlp_dump
}

# mlp on the dump host: trains until step $mlp_at, and is stopped (SIGSTOP) while it sleeps
# after it, so that the restore point is that step however long the dump takes to freeze
# it; then dumped. Then the same training, uninterrupted, for the comparison.
mlp_dump() {
	local mpid t0 t1 i last
	setsid "$mlp_bin" --steps "$mlp_steps" --delay-ms "$mlp_delay" --checksum --once </dev/null >"$mlp_log" 2>"$demo/mlp.err" &
	mpid=$!
	for ((i = 0; i < 1200; i++)); do
		grep -q "^mlp: step $mlp_at loss" "$mlp_log" && break
		alive "$mpid" || die "mlp ended before step $mlp_at: $(tail -n 2 "$demo/mlp.err" "$mlp_log" | paste -sd'|')"
		sleep 0.1
	done
	for ((i = 0; i < 200; i++)); do
		case $(cat "/proc/$mpid/syscall" 2>/dev/null) in 230\ *) break ;; esac # clock_nanosleep
		sleep 0.01
	done
	kill -STOP "$mpid"
	last=$(grep '^mlp: step' "$mlp_log" | tail -n 1 | cut -d' ' -f3)
	[ "$last" = "$mlp_at" ] || die "mlp went on to step $last before it stopped after step $mlp_at"
	mkdir -p "$mlp_img"
	t0=$(now_us)
	if ! { "$criu" dump -t "$mpid" -D "$mlp_img" -o dump.log -v4 2>&3; } 3>&2 2>/dev/null; then
		criu_errors "$mlp_img/dump.log"
		die "criu-rocm dump of mlp failed (log: $(rel "$mlp_img")/dump.log)"
	fi
	t1=$(now_us)
	wait "$mpid" 2>/dev/null || true
	note "mlp (Debian's HIP $(dpkg-query -W -f='${Version}' libamdhip64-5 2>/dev/null)): pid $mpid dumped in $(duration $((t1 - t0))) after step $mlp_at of $mlp_steps"
	save_env "$demo/dump.env" "mpid=$mpid" "mlp_dump_us=$((t1 - t0))"
	"$mlp_bin" --steps "$mlp_steps" --checksum --once >"$mlp_ref" 2>&1 ||
		die "the uninterrupted mlp run failed (log: $(rel "$mlp_ref"))"
	note "mlp trained $mlp_steps steps uninterrupted on the same host, for the comparison"
}

# rocr-workload on the restore host: restore it, then check that its uploads are still in
# flight, that its copy loops went on, and that the uploads complete once it opens the gate.
rocr_restore() {
	local t0 t1
	t0=$(now_us)
	if ! "$criu" restore -D "$rocr_img" -o restore.log -v4 -d --restore-sibling \
		--pidfile "$demo/rocr-restored.pid"; then
		criu_errors "$rocr_img/restore.log"
		die "criu-rocm restore of rocr-workload failed (log: $(rel "$rocr_img")/restore.log)"
	fi
	t1=$(now_us)
	save_env "$demo/restore.env" "rocr_restore_us=$((t1 - t0))"
	[ "$(cat "$demo/rocr-restored.pid")" = "$rpid" ] ||
		die "criu restored rocr-workload as pid $(cat "$demo/rocr-restored.pid"), the dump had $rpid"
	alive "$rpid" || die "the restored rocr-workload (pid $rpid) is gone (log: $(rel "$rocr_err"))"
	note "restored rocr-workload (pid $rpid) in $(duration $((t1 - t0))) (log: $(rel "$rocr_img")/restore.log)"
}

rocr_verify() {
	local before after released loops_before loops_after i
	before=$(sed -n 2p "$rocr_log")
	kill -USR1 "$rpid"
	after=$(rocr_line 3 "$rpid" 60) || die "the restored rocr-workload did not answer SIGUSR1"
	json_ok "$after" || die "rocr-workload's check after the restore failed: $after (log: $(rel "$rocr_log"))"
	[ "$(json_num "$after" bytes)" = "$(json_num "$before" bytes)" ] ||
		die "rocr-workload checked $(json_num "$after" bytes) bytes of VRAM after the restore, $(json_num "$before" bytes) before"
	[ "$(json_num "$after" in_flight)" = "$ngpus" ] ||
		die "after the restore, $(json_num "$after" in_flight) of rocr-workload's $ngpus uploads are still in flight: $after"
	read -r -a loops_before <<<"$(json_list "$before" loops)"
	read -r -a loops_after <<<"$(json_list "$after" loops)"
	for i in "${!loops_before[@]}"; do
		((${loops_after[i]:-0} > loops_before[i])) ||
			die "rocr-workload's copy loops did not go on: ${loops_before[*]} before the dump, ${loops_after[*]} after the restore"
	done
	note "rocr-workload checked its VRAM after the restore; copy loops at ${loops_after[*]}; $ngpus uploads still in flight"
	kill -USR2 "$rpid"
	released=$(rocr_line 4 "$rpid" 60) || die "the restored rocr-workload did not answer SIGUSR2"
	json_ok "$released" || die "rocr-workload's in-flight uploads failed after the restore: $released"
	[ "$(json_num "$released" released)" = "$ngpus" ] ||
		die "only $(json_num "$released" released) of $ngpus in-flight uploads completed: $released"
	note "the $ngpus uploads in flight at the dump completed after the restore; $(human_bytes "$(json_num "$released" bytes)") they wrote checked"
}

# The restore host: restore, verify while running, stop them (they verify again).
restore_side() {
	local pid t0 t1 before after rpid ngpus
	# shellcheck source=/dev/null
	. "$demo/dump.env"
	gpu_nodes >"$demo/gpus-restore"
	save_env "$demo/restore.env" "model=$(gpu_model)"

	step 4 "restoring on another host: $profile with gpu_ids $(cut -d' ' -f1 "$demo/gpus-restore" | paste -sd' ')"
	note "criu-rocm restore -D $(rel "$img") (log: $(rel "$img")/restore.log)"
	t0=$(now_us)
	# --restore-sibling: the workload becomes a child of this shell (criu's parent), which
	# can then collect its exit status. No `timeout` in between for that reason.
	if ! "$criu" restore -D "$img" -o restore.log -v4 -d --restore-sibling \
		--pidfile "$demo/restored.pid"; then
		criu_errors "$img/restore.log"
		die "criu-rocm restore failed (log: $(rel "$img")/restore.log)"
	fi
	t1=$(now_us)
	save_env "$demo/restore.env" "restore_us=$((t1 - t0))"
	[ "$(cat "$demo/restored.pid")" = "$pid" ] ||
		die "criu restored pid $(cat "$demo/restored.pid"), the dump had $pid"
	alive "$pid" || die "the restored gpu-workload (pid $pid) is gone (log: $(rel "$wl_err"))"
	render_fds "$pid" >"$demo/fds-restore"
	note "restored pid $pid in $(duration $((t1 - t0)))"
	rocr_restore

	step 5 "verifying: the restored workloads check their GPU memory, SDMA counters and copies"
	kill -USR1 "$pid"
	after=$(workload_line 3 "$pid" 60) || die "the restored gpu-workload did not answer SIGUSR1"
	check_verified "$after" "after the restore"
	before=$(sed -n 2p "$wl_log")
	[ "$(json_num "$after" bytes)" = "$(json_num "$before" bytes)" ] ||
		die "verified $(json_num "$after" bytes) bytes after the restore, $(json_num "$before" bytes) before"
	counters_moved "$before" "$after" ge ||
		die "SDMA counters went back: $(json_counters "$before") before the dump, $(json_counters "$after") after the restore"
	note "verified after the restore: counters at $(json_counters "$after")"
	rocr_verify
	mlp_restore
	sleep 1
	# All are children of this restore driver (--restore-sibling): SIGTERM and exit statuses;
	# mlp is sent nothing, its training ends on its own.
	exec /usr/bin/python3 "$top/scripts/lib/stop_and_reap.py" --prefix "demo: FAIL: " 180 \
		gpu-workload "$pid" "$demo/exit-status" rocr-workload "$rpid" "$demo/rocr-exit-status" \
		--no-term mlp "$mpid" "$demo/mlp-exit-status"
}

# mlp on the restore host: restored mid-training (stopped, as it was dumped), continued; it
# trains on to its last step. Last of the restores: bash would reap it, and lose its exit
# status, should it end before the restore driver execs the reaper.
mlp_restore() {
	local t0 t1 i
	t0=$(now_us)
	if ! "$criu" restore -D "$mlp_img" -o restore.log -v4 -d --restore-sibling --pidfile "$demo/mlp-restored.pid"; then
		criu_errors "$mlp_img/restore.log"
		die "criu-rocm restore of mlp failed (log: $(rel "$mlp_img")/restore.log)"
	fi
	t1=$(now_us)
	save_env "$demo/restore.env" "mlp_restore_us=$((t1 - t0))"
	[ "$(cat "$demo/mlp-restored.pid")" = "$mpid" ] ||
		die "criu restored mlp as pid $(cat "$demo/mlp-restored.pid"), the dump had $mpid"
	# CRIU stops it again at the end of the restore, which may land just after it returns.
	for ((i = 0; i < 100; i++)); do
		[ "$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$mpid/stat")" = T ] && break
		sleep 0.01
	done
	[ $i -lt 100 ] || die "the restored mlp is not stopped as it was dumped"
	kill -CONT "$mpid"
	note "restored mlp (pid $mpid) in $(duration $((t1 - t0))); it trains on from step $((mlp_at + 1))"
}

# The pid namespace: the dump host, then the restore host. Their drivers say what failed.
in_pidns() {
	# Signals from outside reach a namespace's init only through a handler.
	trap 'exit 130' INT TERM HUP
	"$kfd_emu" run --profile "$profile" -- "$self" _dump || exit
	"$kfd_emu" run --profile "$profile" --profile-file "$restore_override" -- "$self" _restore || exit
}

# ---------------------------------------------------------------------------------------
# Outside: preflight, build, run, summary

preflight() {
	local c missing=()
	[ "$(id -u)" = 0 ] || die "make demo needs root: kfd-emu mounts FUSE nodes in a private mount namespace and criu needs CAP_SYS_ADMIN"
	for c in "$cargo" unshare setsid timeout hipcc /usr/bin/python3 "${MAKE:-make}"; do
		command -v "$c" >/dev/null || missing+=("$c")
	done
	[ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: run scripts/install-deps.sh once first"
	[ -f "$restore_override" ] || die "$restore_override is missing"
}

# Runs a build command with its output in $1, saying every 30 s that it still runs (a first
# build takes minutes); on failure shows the log's tail.
build() {
	local log=$1 what=$2 t0 ticker rc=0
	shift 2
	t0=$(now_us)
	(for ((i = 1; ; i++)); do
		sleep 1 && kill -0 $$ 2>/dev/null || exit 0
		((i % 30)) || note "$what: still building ($(duration $(($(now_us) - t0))))"
	done) &
	ticker=$!
	"$@" >"$log" 2>&1 || rc=$?
	kill "$ticker" 2>/dev/null || true
	if [ "$rc" != 0 ]; then
		echo "--- last lines of $(rel "$log"):" >&2
		tail -n 30 "$log" >&2
		die "building $what failed (log: $(rel "$log"))"
	fi
	note "$what: ok ($(duration $(($(now_us) - t0))))"
}

# The end of step 5, after the restore host is gone: the workload's last verification (on
# SIGTERM) and its exit status.
verify_exit() {
	local after final status
	after=$(sed -n 3p "$wl_log")
	final=$(sed -n 4p "$wl_log")
	[ -n "$final" ] || die "the restored gpu-workload wrote no verification on SIGTERM (logs: $(rel "$wl_log"), $(rel "$wl_err"))"
	check_verified "$final" "at exit"
	counters_moved "$after" "$final" gt ||
		die "SDMA counters did not advance after the restore: $(json_counters "$after") then $(json_counters "$final")"
	status=$(cat "$demo/exit-status")
	[ "$status" = 0 ] || die "the restored gpu-workload exited with status $status (logs: $(rel "$wl_log"), $(rel "$wl_err"))"
	note "verified at exit: counters at $(json_counters "$final"), exit status 0"

	after=$(sed -n 3p "$rocr_log")
	final=$(sed -n 5p "$rocr_log")
	[ -n "$final" ] || die "the restored rocr-workload wrote no check on SIGTERM (logs: $(rel "$rocr_log"), $(rel "$rocr_err"))"
	json_ok "$final" || die "rocr-workload's last check failed: $final"
	status=$(cat "$demo/rocr-exit-status")
	[ "$status" = 0 ] || die "the restored rocr-workload exited with status $status (logs: $(rel "$rocr_log"), $(rel "$rocr_err"))"
	note "rocr-workload checked everything again at exit, freed it all, shut ROCr down: exit status 0"

	status=$(cat "$demo/mlp-exit-status")
	[ "$status" = 0 ] || die "the restored mlp exited with status $status (logs: $(rel "$mlp_log"), $(rel "$demo/mlp.err"))"
	tail -n 1 "$mlp_log" | grep -q '^mlp: PASSED$' || die "the restored mlp's checks failed (log: $(rel "$mlp_log"))"
	note "mlp trained on to step $((mlp_steps - 1)) after the restore and checked itself: exit status 0"
}

# mlp's lines that must be bit-identical with the uninterrupted run: each step's loss with
# its bits, the weights' checksum.
mlp_digest() { grep -E '^mlp: (step [0-9]+ loss .*bits|weights checksum)' "$1"; }

# The loss curve of the restored run, the restore point marked, and its verdict against the
# uninterrupted run: identical, or the first line that differs.
mlp_curve() {
	local step loss bar first
	while read -r _ _ step _ loss _; do
		bar=$(printf '%*s' "$(awk -v l="$loss" 'BEGIN { printf "%d", l * 60 + 0.5 }')" '' | tr ' ' '#')
		printf '              step %2d  %s  %s\n' "$step" "$loss" "$bar"
		[ "$step" = "$mlp_at" ] && echo "              ------- checkpointed here on $profile, restored on the other host -------"
	done < <(grep -E '^mlp: step [0-9]+ loss' "$mlp_log")
	first=$(diff <(mlp_digest "$mlp_ref") <(mlp_digest "$mlp_log") | grep -m1 '^[<>]')
	if [ -z "$first" ] && [ "$(mlp_digest "$mlp_log" | wc -l)" = $((mlp_steps + 1)) ]; then
		echo "              losses and weights ($(grep -o 'checksum [0-9a-f]*' "$mlp_log")): identical to an uninterrupted run"
	else
		echo "              NOT identical to an uninterrupted run: first difference: ${first:-a line is missing}"
		return 1
	fi
}

summary() {
	# Written by the hosts into dump.env and restore.env:
	local pid='' model='' ngpus='' bos_per_gpu='' dump_us='' restore_us=''
	local rpid='' rocr_dump_us='' rocr_restore_us='' mpid='' mlp_dump_us='' mlp_restore_us='' curve
	local old_model old_minor new_minor fd old_id new_id map=() minors=()
	local kfd pages render all cpu gpu_bytes npages before final
	local rocr_before rocr_final rocr_released rocr_all rocr_pages
	# shellcheck source=/dev/null
	. "$demo/dump.env"
	old_model=$model
	# shellcheck source=/dev/null
	. "$demo/restore.env"

	while read -r fd old_minor; do
		new_minor=$(awk -v fd="$fd" '$1 == fd { print $2 }' "$demo/fds-restore")
		old_id=$(awk -v m="$old_minor" '$2 == m { print $1 }' "$demo/gpus-dump")
		new_id=$(awk -v m="$new_minor" '$2 == m { print $1 }' "$demo/gpus-restore")
		map+=("${old_id:-?}->${new_id:-?}")
		minors+=("renderD$old_minor->renderD${new_minor:-?}")
	done <"$demo/fds-dump"

	kfd=$(bytes_of "$img"/amdgpu-kfd-*.img)
	render=$(bytes_of "$img"/amdgpu-renderD-*.img)
	pages=$(bytes_of "$img"/amdgpu-pages-*.img)
	npages=$(count_of "$img"/amdgpu-pages-*.img)
	all=$(bytes_of "$img"/*.img)
	cpu=$((all - kfd - render - pages))
	gpu_bytes=$((pages - 8 * npages)) # each pages file is a u64 size word and the BO bytes
	before=$(sed -n 2p "$wl_log")
	final=$(sed -n 4p "$wl_log")
	rocr_before=$(sed -n 2p "$rocr_log")
	rocr_released=$(sed -n 4p "$rocr_log")
	rocr_final=$(sed -n 5p "$rocr_log")
	rocr_all=$(bytes_of "$rocr_img"/*.img)
	rocr_pages=$(bytes_of "$rocr_img"/amdgpu-pages-*.img)
	curve=$(mlp_curve) || { echo "$curve"; die "the restored mlp's training differs from an uninterrupted run (logs: $(rel "$mlp_log"), $(rel "$mlp_ref"))"; }

	step 6 "summary"
	cat <<EOF

  criu-rocm demo: PASS
  GPUs        $ngpus x ${old_model:-?} ($profile), restored on $ngpus x ${model:-?} ($profile + $(rel "$restore_override"))
  gpu_ids     ${map[*]}  (the workload keeps seeing the old ids)
  render      ${minors[*]}
  saved       $(human_bytes "$gpu_bytes") of GPU memory ($((ngpus * bos_per_gpu)) data BOs + queues and counters) in $npages pages files
  image       $(human_bytes "$all") in $(rel "$img"): GPU pages $(human_bytes "$pages"), KFD $(human_bytes "$kfd"), render $(human_bytes "$render"), CPU side $(human_bytes "$cpu")
  dump        $(duration "$dump_us") (workload frozen, saved, killed)
  restore     $(duration "$restore_us") (on other gpu_ids, minors and GPU order)
  verified    $(human_bytes "$(json_num "$final" bytes)") in $((ngpus * bos_per_gpu)) BOs intact; SDMA counters kept counting:
              $(json_counters "$before") before the dump, $(json_counters "$final") at exit; exit status 0
  ROCr        rocr-workload on Debian's ROCr $(dpkg-query -W -f='${Version}' libhsa-runtime64-1 2>/dev/null), same hosts: $rocr_mib MiB of VRAM per GPU, async copies
              streaming on every GPU and $ngpus uploads in flight in the SDMA rings at the dump
              image $(human_bytes "$rocr_all") in $(rel "$rocr_img") (GPU pages $(human_bytes "$rocr_pages")); dump $(duration "$rocr_dump_us"), restore $(duration "$rocr_restore_us")
              after the restore: VRAM intact, the $(json_num "$rocr_released" released) in-flight uploads completed ($(human_bytes "$(json_num "$rocr_released" bytes)") checked),
              copy loops $(json_list "$rocr_before" loops) before the dump, $(json_list "$rocr_final" loops) at exit; exit status 0
  HIP         mlp on Debian's HIP $(dpkg-query -W -f='${Version}' libamdhip64-5 2>/dev/null), same hosts: a small MLP trained with SGD for $mlp_steps steps, checkpointed after
              step $mlp_at (dump $(duration "$mlp_dump_us"), restore $(duration "$mlp_restore_us")); the loss of each step:
$curve
  logs        $(rel "$demo")/ (img/dump.log, img/restore.log, workload.out, img-rocr/, rocr-workload.out, img-mlp/, mlp.out)
EOF
}

main() {
	local t0 rc
	preflight
	rm -rf "$demo"
	mkdir -p "$demo"
	t0=$(now_us)

	step 1 "building what is missing (logs in $(rel "$demo")/)"
	build "$demo/build-criu-rocm.log" "build/criu-rocm" "${MAKE:-make}" -C "$top" build/criu-rocm
	build "$demo/build-rust.log" "kfd-emu and gpu-workload" \
		env -C "$top/rust" "$cargo" build --release --locked -j "$jobs" -p kfd-emu -p kfd-client
	build "$demo/build-rocr-workload.log" "rocr-workload (Debian's ROCr)" \
		cc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$rocr_workload" "$top/test/demo/rocr-workload.c" \
		-lhsa-runtime64 -lpthread
	build "$demo/build-mlp.log" "mlp (Debian's hipcc)" hip_build "$top/test/hip/mlp.hip" "$mlp_bin" "$demo/hipcc-mlp.log"

	# One time limit for everything from here on. If it expires, unshare is killed and
	# --kill-child takes the namespace, with every process in it, down.
	rc=0
	timeout --foreground -k 10 "$time_limit" \
		unshare --pid --fork --mount-proc --kill-child "$self" _pidns || rc=$?
	case $rc in
	0) ;;
	130) die "interrupted; logs in $(rel "$demo")/" ;;
	124 | 137) die "the demo did not finish within $time_limit s (the last step shown above hung); logs in $(rel "$demo")/" ;;
	*)
		echo "demo: FAILED (exit $rc); logs in $(rel "$demo")/" >&2
		exit 1
		;;
	esac
	verify_exit
	summary
	echo "  total       $(duration $(($(now_us) - t0)))"
}

case ${1:-} in
_pidns) in_pidns ;;
_dump) dump_side ;;
_restore) restore_side ;;
"") main ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) die "unknown argument ${1}; usage: scripts/demo.sh" ;;
esac
