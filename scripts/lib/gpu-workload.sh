# shellcheck shell=bash
# gpu-workload (rust/kfd-client) driven from a case of a shell test suite.
# Sourced after scripts/lib/cases.sh (fail, CASE_DIR, alive, wait_gone, json_ok); needs
# WORKLOAD, the gpu-workload binary.

# wl_start NAME [gpu-workload ARG...]: starts gpu-workload in its own session (so CRIU
# dumps it without --shell-job), output in $CASE_DIR/NAME.out; waits for its ready line.
# Sets WL (its pid) and WL_OUT.
wl_start() {
	local name=$1 i
	shift
	WL_OUT=$CASE_DIR/$name.out
	setsid "$WORKLOAD" "$@" </dev/null >"$WL_OUT" 2>"$CASE_DIR/$name.err" &
	WL=$!
	for ((i = 0; i < 1200; i++)); do
		grep -q "^{\"ready\":true,\"pid\":$WL," "$WL_OUT" && break
		alive "$WL" || break
		sleep 0.05
	done
	grep -q "^{\"ready\":true,\"pid\":$WL," "$WL_OUT" ||
		fail "gpu-workload $* did not get ready: $(tail -n 3 "$CASE_DIR/$name.err" | paste -sd' ')"
	echo "$WL" >"$CASE_DIR/$name.pid"
}

# The pids of gpu-workload's children (--procs), from its ready line.
wl_children() {
	local l
	l=$(grep -m1 "^{\"ready\":true,\"pid\":$1," "$WL_OUT")
	[[ $l =~ \"children\":\[([0-9,]*)\] ]] && echo "${BASH_REMATCH[1]//,/ }"
}

# Verification lines of pid $1 so far.
ok_count() { grep -c "^{\"ok\":[a-z]*,\"pid\":$1," "$WL_OUT"; }

# Prints the $2-th verification line of pid $1, waiting up to $3 seconds for it.
wl_line() {
	local pid=$1 n=$2 secs=${3:-60} i
	for ((i = 0; i < secs * 20; i++)); do
		[ "$(ok_count "$pid")" -ge "$n" ] && break
		alive "$pid" || break
		sleep 0.05
	done
	[ "$(ok_count "$pid")" -ge "$n" ] || return 1
	grep "^{\"ok\":[a-z]*,\"pid\":$pid," "$WL_OUT" | sed -n "${n}p"
}

# wl_verify PID [MORE_PIDS...]: SIGUSR1 to PID (gpu-workload passes it on to its children);
# waits for a new verification line from PID and each of MORE_PIDS; prints them, one per
# line, in that order, and requires each to say ok.
wl_verify() {
	local p n=() line i=0
	for p in "$@"; do n+=($(($(ok_count "$p") + 1))); done
	kill -USR1 "$1" 2>/dev/null || fail "gpu-workload $1 is gone (SIGUSR1 failed)"
	for p in "$@"; do
		line=$(wl_line "$p" "${n[i]}" 60) || fail "gpu-workload $p gave no verification line after SIGUSR1" \
			"($(alive "$p" && echo running || echo gone))"
		json_ok "$line" || fail "gpu-workload $p: verification failed: $line"
		echo "$line"
		i=$((i + 1))
	done
}

# wl_finish PID [MORE_PIDS...]: SIGTERM; every process' last verification must say ok and
# the processes must end.
wl_finish() {
	local p n=() line i=0
	for p in "$@"; do n+=($(($(ok_count "$p") + 1))); done
	kill -TERM "$1" 2>/dev/null || fail "gpu-workload $1 is gone (SIGTERM failed)"
	for p in "$@"; do
		line=$(wl_line "$p" "${n[i]}" 90) || fail "gpu-workload $p gave no final verification line"
		json_ok "$line" || fail "gpu-workload $p: final verification failed: $line"
		i=$((i + 1))
	done
	for p in "$@"; do wait_gone "$p" || fail "gpu-workload $p still runs after its final verification"; done
}

# same_bytes BEFORE AFTER: verification line AFTER (after a restore) checked as many bytes
# as line BEFORE did.
same_bytes() {
	[ "$(json_num "$2" bytes)" = "$(json_num "$1" bytes)" ] ||
		fail "verified $(json_num "$2" bytes) bytes after the restore, $(json_num "$1" bytes) before"
}
