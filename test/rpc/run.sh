#!/usr/bin/env bash
# criu-rocm as container engines run it (issue 15): a binary called `criu`, started as
# `criu swrk 3` and spoken to over CRIU's RPC (test/rpc/rpc.py, a client written from
# CRIU 4.2.1's images/rpc.proto), with options as RPC fields and configuration files, no
# plugin directory, and whatever plugins the host carries.
#   - VERSION reports CRIU's numbers; FEATURE_CHECK answers what the kernel can do (each
#     feature against `criu check --feature` and against a probe of the kernel here);
#   - DUMP and RESTORE of a GPU process on an emulated host, with images_dir_fd, notify
#     scripts answered and the restored tree a sibling, as runc sends them;
#   - GPU knobs reach swrk through configuration files (--gpu-knob in the RPC's
#     config_file, /etc/criu/runc.conf as runc names it, /etc/criu/default.conf), replacing
#     the environment; a restore refused for a GPU reason carries gpu-check's verdict in
#     the RPC answer's cr_errmsg; a bad knob in a configuration file fails with its reason;
#   - upstream's amdgpu_plugin.so in the plugin directory, under its own file name and
#     another, is skipped with one warning naming the file, a plugin of another name loads
#     and runs, and `criu check` names both copies.
#
#   usage: test/rpc/run.sh CRIU_BINARY [CASE...]     (as root; `make test-rpc` runs it)
#          test/rpc/run.sh --list
#   env:   CARGO_TARGET_DIR   where kfd-emu and gpu-workload were built (rust/target)
#          UPSTREAM_PLUGIN    upstream's amdgpu_plugin.so (make test-rpc builds it)
#          CRIU_TREE          the patched CRIU tree (criu/include/criu-plugin.h, rpc.proto)
#          RPC_TEST_KEEP=1    keep the work directory even when everything passed
#
# Each case prints PASS, FAIL (with the reason and where its logs are) or SKIP (with why);
# the last line is exactly "N passed, M failed, K skipped"; the status is non-zero on any
# failure. /etc/criu is written only inside a private mount namespace, over an overlay.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, known_bug, on, cases_dispatch; alive, wait_gone, ... (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"
# wl_start, wl_verify, wl_finish, ...
# shellcheck source=SCRIPTDIR/../../scripts/lib/gpu-workload.sh
. "$top/scripts/lib/gpu-workload.sh"

host_file() { echo "$top/test/gpu/hosts/$1.toml"; }

rpc() { /usr/bin/python3 "$here/rpc.py" "$@"; }
# A field of a JSON object: jq-less, with Debian's python.
jget() { /usr/bin/python3 -c 'import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2]); print(json.dumps(v) if isinstance(v,(list,dict,bool)) or v is None else v)' "$1" "$2"; }


# rpc_dump PID DIR [rpc.py ARG...]: DUMP over RPC must succeed and kill PID. Sets OUT.
rpc_dump() {
	local pid=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	OUT=$(rpc dump "$CRIU" --pid "$pid" --dir "$dir" "$@" 2>>"$CASE_DIR/rpc.err") ||
		fail "RPC DUMP of $pid failed: $OUT; log: $(log_errors "$dir/dump.log")"
	wait_gone "$pid" 10 || fail "$pid still runs after the RPC DUMP"
	ls "$dir"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "the RPC DUMP wrote no amdgpu-kfd-*.img"
	grep -q '"post-dump"' <<<"$OUT" || fail "criu sent no post-dump notification: $OUT"
}

# rpc_restore DIR PID [rpc.py ARG...]: RESTORE over RPC must succeed with PID running.
rpc_restore() {
	local dir=$1 pid=$2
	shift 2
	OUT=$(rpc restore "$CRIU" --dir "$dir" "$@" 2>>"$CASE_DIR/rpc.err") ||
		fail "RPC RESTORE failed: $OUT; log: $(log_errors "$dir/restore.log")"
	[ "$(jget "$OUT" pid)" = "$pid" ] || fail "RPC RESTORE answered pid $(jget "$OUT" pid), not $pid: $OUT"
	alive "$pid" || fail "after the RPC RESTORE $pid does not run"
	grep -aq "amdgpu: pid $pid: GPU queues resumed" "$dir/restore.log" || fail "restore.log says no GPU queues of $pid were resumed"
	grep -q '"post-restore"' <<<"$OUT" || fail "criu sent no post-restore notification: $OUT"
}

# ---------------------------------------------------------------------------------------
# Cases

# go-criu gates on major*10000+minor*100+sublevel, rounded down when a gitid is present.
case_version() {
	local v want
	v=$(rpc version "$CRIU" 2>>"$CASE_DIR/rpc.err") || fail "VERSION: $v"
	want=$(IFS=. read -r a b c <<<"$CRIU_VERSION"; echo "$a $b $c")
	[ "$(jget "$v" major) $(jget "$v" minor) $(jget "$v" sublevel)" = "$want" ] || fail "VERSION answered $v, not CRIU $CRIU_VERSION"
	[ "$(jget "$v" gitid)" = null ] || fail "VERSION carries a gitid, which go-criu rounds up to the next minor release: $v"
	note "VERSION: $CRIU_VERSION, no gitid"
}

# Every feature FEATURE_CHECK reports must be what `criu check --feature` says and what
# the kernel does here (soft-dirty bits, userfaultfd events, pidfd_getfd).
case_feature_check() {
	local f p feat cli probe rpcv
	f=$(rpc features "$CRIU" 2>>"$CASE_DIR/rpc.err") || fail "FEATURE_CHECK failed: $f"
	p=$(rpc probe) || fail "probing the kernel failed"
	for feat in mem_track:mem_dirty_track lazy_pages:uffd-noncoop pidfd_store:pidfd_store; do
		rpcv=$(jget "$f" "${feat%%:*}")
		probe=$(jget "$p" "${feat%%:*}")
		if (cd / && "$CRIU" check --feature "${feat#*:}" >>"$CASE_DIR/check.out" 2>&1); then cli=true; else cli=false; fi
		[ "$rpcv" = "$cli" ] || fail "FEATURE_CHECK says ${feat%%:*}=$rpcv, criu check --feature ${feat#*:} says $cli"
		[ "$rpcv" = "$probe" ] || fail "FEATURE_CHECK says ${feat%%:*}=$rpcv, the kernel here says $probe"
	done
	note "FEATURE_CHECK ${f/\"success\": true, \"type\": \"FEATURE_CHECK\", /}, as criu check and the kernel say"
}

# Dump and restore of a GPU process over RPC on one host: the process checks all its GPU
# memory, counters and events, and keeps working.
case_dump_restore() { on mi100x2 -- dump_restore; }
dump_restore() {
	local img=$CASE_DIR/img v0 v1
	wl_start wl --mib 4 --bos 3 --events --threads 2
	v0=$(wl_verify "$WL") || exit 1
	rpc_dump "$WL" "$img"
	rpc_restore "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	[ "$(json_num "$v1" bytes)" = "$(json_num "$v0" bytes)" ] || fail "verified $(json_num "$v1" bytes) bytes after the restore, $(json_num "$v0" bytes) before"
	wl_finish "$WL"
	note "dumped and restored over RPC; $(json_num "$v1" bytes) bytes of GPU memory verified after; notified: $(jget "$OUT" notified)"
}

# A restore refused for a GPU reason, then the knob that lets it through from each kind of
# configuration file an engine's swrk reads. One dump on mi100x2, restored (copies of its
# images, one after the other) on a host whose GPUs have less VRAM.
case_knobs_in_config_files() {
	on mi100x2 -- dump_for_later
	on mi100x2 --profile-file "$(host_file mi100x2-small-vram)" -- knobs_in_config_files
}
dump_for_later() {
	wl_start wl --mib 4 --bos 2
	wl_verify "$WL" >/dev/null || exit 1
	rpc_dump "$WL" "$CASE_DIR/img"
}
knobs_in_config_files() {
	# /etc/criu of this host only: an overlay over /etc in a mount namespace of our own.
	exec unshare --mount --propagation private "$self" __in knobs_in_config_files_ns
}
knobs_in_config_files_ns() {
	local img=$CASE_DIR/img pid verdict reason msg before i
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	mkdir -p "$CASE_DIR/etc-upper" "$CASE_DIR/etc-work"
	mount -t overlay overlay -o "lowerdir=/etc,upperdir=$CASE_DIR/etc-upper,workdir=$CASE_DIR/etc-work" /etc ||
		fail "cannot mount an overlay over /etc"
	mkdir -p /etc/criu
	for i in 1 2 3 4 5; do cp -a "$img" "$CASE_DIR/img$i"; done
	before=$(img_sums "$CASE_DIR/img1")
	# Each restore is of the same dump: the process' stdout and stderr files must have the
	# sizes the dump recorded (CRIU checks), so they are put back as they were then.
	cp "$CASE_DIR/wl.out" "$CASE_DIR/wl.out.dumped"
	cp "$CASE_DIR/wl.err" "$CASE_DIR/wl.err.dumped"
	rewind() { cp "$CASE_DIR/wl.out.dumped" "$CASE_DIR/wl.out" && cp "$CASE_DIR/wl.err.dumped" "$CASE_DIR/wl.err"; }

	# 1. No knob: refused, and the RPC answer says why, as gpu-check does.
	verdict=$(cd / && "$CRIU" gpu-check -D "$CASE_DIR/img1" 2>&1) && fail "gpu-check accepts the images on this host: $verdict"
	reason=$(sed -n 's/.*NOT restorable here: //p' <<<"$verdict" | head -n1)
	[ -n "$reason" ] || fail "gpu-check gave no reason: $verdict"
	grep -q "KFD_VRAM_SIZE_CHECK=0" <<<"$reason" || fail "gpu-check does not name KFD_VRAM_SIZE_CHECK: $reason"
	OUT=$(KFD_VRAM_SIZE_CHECK=1 rpc restore "$CRIU" --dir "$CASE_DIR/img1" 2>>"$CASE_DIR/rpc.err") &&
		fail "the RPC RESTORE succeeded on a host with less VRAM: $OUT"
	msg=$(jget "$OUT" cr_errmsg)
	grep -qF -- "$reason" <<<"$msg" || fail "the RPC answer's cr_errmsg lacks gpu-check's verdict '$reason': $OUT"
	wait_gone "$pid" 5 || fail "the refused restore left $pid running"
	[ "$(img_sums "$CASE_DIR/img1")" = "$before" ] || fail "the refused restore changed the images"
	note "refused over RPC, cr_errmsg: $(cut -c1-160 <<<"$msg")..."

	# 2. A knob with a bad value in the RPC's config_file: refused, naming it.
	printf 'gpu-knob KFD_VRAM_SIZE_CHECK=maybe\n' >"$CASE_DIR/bad.conf"
	OUT=$(rpc restore "$CRIU" --dir "$CASE_DIR/img2" --config "$CASE_DIR/bad.conf" 2>>"$CASE_DIR/rpc.err") &&
		fail "the RPC RESTORE took KFD_VRAM_SIZE_CHECK=maybe: $OUT"
	msg=$(jget "$OUT" cr_errmsg)
	grep -qF -- '--gpu-knob KFD_VRAM_SIZE_CHECK=maybe: KFD_VRAM_SIZE_CHECK="maybe": expected 0, 1, NO or YES' <<<"$msg" ||
		fail "a bad knob in config_file: cr_errmsg does not say what is wrong: $OUT"

	# 3. The RPC's config_file (runc's org.criu.config annotation), replacing the environment.
	printf '# a container'"'"'s CRIU options\ngpu-knob KFD_VRAM_SIZE_CHECK=0\n' >"$CASE_DIR/container.conf"
	KFD_VRAM_SIZE_CHECK=1 rpc_restore "$CASE_DIR/img3" "$pid" --config "$CASE_DIR/container.conf"
	grep -aq "GPU knob KFD_VRAM_SIZE_CHECK=0 (from --gpu-knob, replacing KFD_VRAM_SIZE_CHECK=1 of the environment)" "$CASE_DIR/img3/restore.log" ||
		fail "restore.log does not say the knob came from --gpu-knob over the environment's"
	wl_finish "$pid"

	# 4. /etc/criu/runc.conf, the config_file runc names when no annotation does.
	printf 'gpu-knob KFD_VRAM_SIZE_CHECK=0\n' >/etc/criu/runc.conf
	rewind
	rpc_restore "$CASE_DIR/img4" "$pid" --config /etc/criu/runc.conf
	wl_finish "$pid"
	rm /etc/criu/runc.conf

	# 5. /etc/criu/default.conf, which every criu reads, swrk included; no config_file.
	printf 'gpu-knob KFD_VRAM_SIZE_CHECK=0\n' >/etc/criu/default.conf
	rewind
	rpc_restore "$CASE_DIR/img5" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	rm /etc/criu/default.conf
	note "restored with gpu-knob KFD_VRAM_SIZE_CHECK=0 from config_file (over the environment's 1), /etc/criu/runc.conf, /etc/criu/default.conf"
}

# A knob for the dump from a configuration file: a bad KFD_MAX_BUFFER_SIZE fails the DUMP
# before anything is frozen, naming it; a good one is used.
case_dump_knob_config_file() { on mi100x2 -- dump_knob_config_file; }
dump_knob_config_file() {
	local msg
	wl_start wl --mib 2 --bos 2
	printf 'gpu-knob KFD_MAX_BUFFER_SIZE=5000\n' >"$CASE_DIR/bad.conf"
	mkdir -p "$CASE_DIR/bad"
	OUT=$(rpc dump "$CRIU" --pid "$WL" --dir "$CASE_DIR/bad" --config "$CASE_DIR/bad.conf" 2>>"$CASE_DIR/rpc.err") &&
		fail "the RPC DUMP took KFD_MAX_BUFFER_SIZE=5000: $OUT"
	msg=$(jget "$OUT" cr_errmsg)
	{ grep -qF -- "--gpu-knob KFD_MAX_BUFFER_SIZE=5000" <<<"$msg" && grep -q "page size" <<<"$msg"; } ||
		fail "a bad KFD_MAX_BUFFER_SIZE in config_file: cr_errmsg does not say what is wrong: $OUT"
	wl_verify "$WL" >/dev/null || exit 1
	printf 'gpu-knob KFD_MAX_BUFFER_SIZE=64K\ngpu-knob CRIU_ROCM_COPY_ENGINE=cpu\n' >"$CASE_DIR/good.conf"
	rpc_dump "$WL" "$CASE_DIR/img" --config "$CASE_DIR/good.conf"
	{ grep -aq "GPU knob KFD_MAX_BUFFER_SIZE=64K (from --gpu-knob)" "$CASE_DIR/img/dump.log" &&
		grep -aq "GPU knob CRIU_ROCM_COPY_ENGINE=cpu (from --gpu-knob)" "$CASE_DIR/img/dump.log"; } ||
		fail "dump.log does not list the knobs of config_file"
	rpc_restore "$CASE_DIR/img" "$WL"
	wl_finish "$WL"
	note "a bad KFD_MAX_BUFFER_SIZE refused with its reason, the process left running; 64K and the cpu engine used"
}

# A plugin directory holding upstream's amdgpu plugin under its own name and under
# another, and a plugin of another name (probe-plugin.c, which records its init and exit).
make_plugin_dir() {
	PLUGIN_DIR=$CASE_DIR/plugins
	mkdir -p "$PLUGIN_DIR"
	cp "$UPSTREAM_PLUGIN" "$PLUGIN_DIR/amdgpu_plugin.so"
	cp "$UPSTREAM_PLUGIN" "$PLUGIN_DIR/gpu-vendor.so"
	cc -shared -fPIC -Wall -Werror -I "$CRIU_TREE/criu/include" -o "$PLUGIN_DIR/probe.so" "$here/probe-plugin.c" 2>"$CASE_DIR/cc.err" ||
		fail "cannot build probe-plugin.c: $(head -n 3 "$CASE_DIR/cc.err" | paste -sd' ')"
	export CRIU_TEST_PLUGIN_LOG=$CASE_DIR/probe.log
}
# skipped_once LOG WHAT: one warning line for each copy of upstream's plugin, naming it.
skipped_once() {
	local f n
	for f in amdgpu_plugin.so gpu-vendor.so; do
		n=$(grep -ac "Warn .*$PLUGIN_DIR/$f: skipped: it is upstream's AMD GPU plugin (\"amdgpu_plugin\")" "$1")
		[ "$n" = 1 ] || fail "$2: $n warning lines for $f, not 1 ($1)"
	done
	grep -aq "Error" "$1" && fail "$2 logged errors: $(log_errors "$1")"
	return 0
}

case_upstream_plugin_check() {
	local out
	make_plugin_dir
	out=$(cd / && "$CRIU" check -L "$PLUGIN_DIR" 2>&1) || fail "criu check -L failed: $out"
	grep -qx "Looks good." <<<"$out" || fail "criu check did not say 'Looks good.': $out"
	for f in amdgpu_plugin.so gpu-vendor.so; do
		[ "$(grep -c "$PLUGIN_DIR/$f: skipped: it is upstream's AMD GPU plugin" <<<"$out")" = 1 ] ||
			fail "criu check does not name $f once: $out"
	done
	grep -q "probe.so" <<<"$out" && fail "criu check complains about probe.so: $out"
	out=$(cd / && CRIU_LIBS_DIR=$PLUGIN_DIR "$CRIU" check 2>&1) || fail "criu check failed: $out"
	[ "$(grep -c "skipped: it is upstream's AMD GPU plugin" <<<"$out")" = 2 ] || fail "criu check with CRIU_LIBS_DIR does not name both copies: $out"
	note "criu check names both copies of upstream's plugin and says Looks good."
}

# The CLI dumps with -L, the RPC restores with CRIU_LIBS_DIR (the RPC has no libdir).
case_upstream_plugin_dump_restore() { on mi100x2 -- upstream_plugin_dump_restore; }
upstream_plugin_dump_restore() {
	local img=$CASE_DIR/img
	make_plugin_dir
	wl_start wl --mib 2 --bos 2 --events
	mkdir -p "$img"
	"$CRIU" dump -t "$WL" -D "$img" -o dump.log -v4 -L "$PLUGIN_DIR" >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "criu-rocm dump -L with upstream's plugin failed: $(log_errors "$img/dump.log")"
	wait_gone "$WL" 10 || fail "$WL still runs after the dump"
	skipped_once "$img/dump.log" "the dump"
	{ grep -qx "init 0" "$CRIU_TEST_PLUGIN_LOG" && grep -qx "exit 0 0" "$CRIU_TEST_PLUGIN_LOG"; } ||
		fail "probe.so did not run at the dump: $(paste -sd' ' "$CRIU_TEST_PLUGIN_LOG" 2>/dev/null)"
	grep -aq amdgpu_plugin "$img/inventory.img" || fail "inventory.img does not name amdgpu_plugin"
	CRIU_LIBS_DIR=$PLUGIN_DIR rpc_restore "$img" "$WL"
	skipped_once "$img/restore.log" "the RPC restore"
	grep -qx "init 2" "$CRIU_TEST_PLUGIN_LOG" || fail "probe.so did not run at the restore: $(paste -sd' ' "$CRIU_TEST_PLUGIN_LOG")"
	wl_verify "$WL" >/dev/null || exit 1
	wl_finish "$WL"
	note "upstream's plugin skipped under both names with one warning each, probe.so ran at dump and restore"
}

ordered_cases() {
	echo version feature_check dump_restore knobs_in_config_files dump_knob_config_file \
		upstream_plugin_check upstream_plugin_dump_restore | tr ' ' '\n'
}

main() {
	cases_select test/rpc/run.sh "$@"
	WORK=$(mktemp -d /tmp/criu-rocm-rpc-test.XXXXXX)
	mkdir -p "$WORK/pb"
	# The RPC's messages, from CRIU's own schema.
	protoc --proto_path="$CRIU_TREE/images" --python_out="$WORK/pb" "$CRIU_TREE/images/rpc.proto" ||
		{ echo "test/rpc/run.sh: protoc could not compile $CRIU_TREE/images/rpc.proto" >&2; exit 2; }
	export WORK RPC_PB_DIR=$WORK/pb
	echo "RPC tests: ${#WANTED[@]} case(s), criu-rocm $CRIU, work directory $WORK"
	cases_run_all "${RPC_TEST_KEEP:-}"
}

cases_dispatch "$@"
CRIU=$(realpath "$1")
shift
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
KFD_EMU=$target/kfd-emu
WORKLOAD=$target/gpu-workload
CRIU_TREE=${CRIU_TREE:-$top/build/criu-$(sed -n 's/^CRIU_VERSION=//p' "$top/criu/upstream.lock")}
UPSTREAM_PLUGIN=${UPSTREAM_PLUGIN:-$CRIU_TREE/plugins/amdgpu/amdgpu_plugin.so}
CRIU_VERSION=$(sed -n 's/^CRIU_VERSION=//p' "$top/criu/upstream.lock")
CASE_TIMEOUT=${RPC_TEST_TIMEOUT:-180}
export CRIU KFD_EMU WORKLOAD CRIU_TREE UPSTREAM_PLUGIN CRIU_VERSION CASE_TIMEOUT
[ "$(id -u)" = 0 ] || { echo "test/rpc/run.sh: needs root" >&2; exit 2; }
for c in "$CRIU" "$KFD_EMU" "$WORKLOAD" "$UPSTREAM_PLUGIN"; do
	[ -e "$c" ] || { echo "test/rpc/run.sh: $c is missing (make test-rpc builds it)" >&2; exit 2; }
done
for c in protoc cc unshare setsid timeout sha256sum /usr/bin/python3; do
	command -v "$c" >/dev/null || { echo "test/rpc/run.sh: $c is missing (scripts/install-deps.sh)" >&2; exit 2; }
done
/usr/bin/python3 -c 'import google.protobuf' 2>/dev/null || { echo "test/rpc/run.sh: python3-protobuf is missing (scripts/install-deps.sh)" >&2; exit 2; }
exec unshare --pid --fork --mount-proc --kill-child "$self" __main "$@"
