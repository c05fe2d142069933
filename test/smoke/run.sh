#!/usr/bin/env bash
# Smoke test: criu-rocm dumps and restores an ordinary process tree (memory, a pipe with
# data in flight, a file at an offset, a child) and the processes check their own state.
#   usage: test/smoke/run.sh CRIU_BINARY
set -euo pipefail

# Run inside a fresh pid namespace whose init is this script: processes CRIU kills are
# reaped here (this machine's pid 1 does not reap orphans, and a zombie holding a pid makes
# the restore's fork with that pid fail with EEXIST).
if [ "${SMOKE_IN_PIDNS:-}" != 1 ]; then
	exec env SMOKE_IN_PIDNS=1 unshare --pid --fork --mount-proc "$0" "$@"
fi

criu=$(realpath -s "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/criu-rocm-smoke.XXXXXX)
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
fail() {
	echo "smoke: FAIL: $*" >&2
	ps -e -o pid,ppid,stat,wchan:24,args >&2 || true
	for log in "$work"/img/*.log; do [ -f "$log" ] && { echo "--- $log"; grep -E "Error|Warn" "$log" | tail -n 20; }; done >&2
	exit 1
}

cc -O2 -Wall -Werror -o "$work/workload" "$here/workload.c"
mkdir "$work/img"

for round in 1 2 3; do
	rm -f "$work/ready" "$work/result" "$work/img"/*
	"$work/workload" "$work/data" "$work/ready" "$work/result" </dev/null >/dev/null 2>&1 &
	for _ in $(seq 100); do [ -e "$work/ready" ] && break; sleep 0.1; done
	[ -e "$work/ready" ] || fail "workload did not start"
	pid=$(cat "$work/ready")

	if [ $round = 3 ]; then
		# A plugin that cannot be loaded fails the dump, as in CRIU, and the failed dump
		# leaves the tree be. (Upstream's amdgpu plugin, which criu-rocm skips, is test-rpc's.)
		mkdir -p "$work/plugins" && : >"$work/plugins/broken.so"
		if "$criu" dump -t "$pid" -D "$work/img" -v4 -o dump.log --libdir "$work/plugins"; then
			fail "dump with an empty broken.so in --libdir succeeded"
		fi
		grep -q "Unable to load $work/plugins/broken.so" "$work/img/dump.log" ||
			fail "the failed dump did not name broken.so"
		kill -0 "$pid" || fail "the failed dump killed the tree"
		kill -TERM "$pid"
	elif [ $round = 2 ]; then
		# --leave-running: the tree keeps running and is still intact afterwards.
		"$criu" dump -t "$pid" -D "$work/img" -v4 -o dump.log --leave-running || fail "dump --leave-running"
		kill -0 "$pid" || fail "--leave-running killed the tree"
		kill -TERM "$pid"
	else
		"$criu" dump -t "$pid" -D "$work/img" -v4 -o dump.log || fail "dump"
		wait 2>/dev/null || true
		kill -0 "$pid" 2>/dev/null && fail "tree still alive after dump"
		"$criu" restore -D "$work/img" -d -v4 -o restore.log || fail "restore"
		kill -TERM "$pid"
	fi
	for _ in $(seq 200); do [ -s "$work/result" ] && break; sleep 0.1; done
	[ -s "$work/result" ] || fail "round $round: no verdict from the restored tree"
	grep -qx PASS "$work/result" || fail "round $round: $(cat "$work/result")"
	pid=
	echo "smoke: round $round ($(case $round in 1) echo dump, kill, restore ;; 2) echo dump --leave-running ;; 3) echo unloadable plugin refused ;; esac)): PASS"
done
echo "smoke: 3 passed, 0 failed"
