# shellcheck shell=bash
# shellcheck disable=SC2154 # out, img and criu are the sourcing script's (below)
# The steps scripts/bench-cr.sh and scripts/bench-hip.sh share: timing a command, dumping and
# restoring a process with criu-rocm, letting kfd-emu go idle between them, CRIU's
# --display-stats counters. Sourced, not run; bash only. The sourcing script sets:
#   BENCH       its name, for "BENCH: FAIL: ..." lines
#   out, img    its output directory and the image directory in it
#   criu        the criu-rocm binary
#   EMU_PID     kfd-emu's pid (inside kfd-emu run: the parent of the script's step)
# and may set `progress` while a line of progress is open on stdout.

progress= # set while a line of progress is open
die() {
	[ -z "$progress" ] || echo # end the progress line (stdout)
	echo "$BENCH: FAIL: $*" >&2
	exit 1
}

# Runs a command, writes "status wall_us maxrss_kib" of it to $1 (wait4's rusage: the
# Runs a command, writes "status wall_us maxrss_kib" of it to $1 (wait4's rusage: the
# command's own peak RSS, or a descendant's it waited for if larger); its stdout goes to $2.
# Timed here rather than around python's start-up.
read -r -d '' TIMER <<'EOF' || true
import os, sys, time
res, stdout, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
fd = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
t0 = time.monotonic_ns()
pid = os.fork()
if pid == 0:
    os.dup2(fd, 1)
    try:
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
t1 = time.monotonic_ns()
with open(res, "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {(t1 - t0) // 1000} {ru.ru_maxrss}\n")
EOF
timed() {
	local res=$1 stdout=$2
	shift 2
	/usr/bin/python3 -c "$TIMER" "$res" "$stdout" "$@"
}

# Waits up to $3 seconds for line $1 of log $4 (*.out) of process $2 and prints it; on
# failure also shows the end of the process' stderr (*.err).
log_line() {
	file_line "$@" && return 0
	tail -n 5 "${4%.out}.err" >&2 2>/dev/null || true
	return 1
}

criu_errors() {
	[ -f "$1" ] || return 0
	echo "--- last errors in $1:" >&2
	grep -E 'Error|amdgpu:' "$1" | tail -n 15 >&2 || true
}

# Sum of a "Name: N ..." line of criu's --display-stats output $1 (0 when absent).
stat_of() { awk -v k="$2:" 'index($0, k) == 1 { split(substr($0, length(k) + 1), f, " "); v += f[1] } END { print v + 0 }' "$1"; }

# Bytes of GPU memory in the image: each pages file is a u64 size word and the BO bytes.
gpu_image_bytes() {
	local f sum=0
	for f in "$img"/amdgpu-pages-*.img; do
		[ -f "$f" ] && sum=$((sum + $(stat -c %s "$f") - 8))
	done
	echo "$sum"
}

# The criu-rocm command line's prefix: empty, or the SDMA engine under the supervisor (set by
# tp_cycle for kind sdma).
WRAP=()

# Dumps pid $1 into the image directory (emptied first), with extra environment $2...;
# leaves "status wall_us maxrss_kib" in $out/dump.res and criu's stdout in $out/dump.stats.
dump_proc() {
	local pid=$1 status=0
	shift
	rm -rf "$img" && mkdir -p "$img"
	# In braces with stderr to a file: bash reports the process criu kills ("Killed") there.
	{
		timed "$out/dump.res" "$out/dump.stats" /usr/bin/env "$@" "${WRAP[@]}" "$criu" dump -t "$pid" -D "$img" \
			-o dump.log -v4 --display-stats
	} 2>"$out/dump.err"
	read -r status _ <"$out/dump.res"
	if [ "$status" != 0 ]; then
		cat "$out/dump.err" >&2
		criu_errors "$img/dump.log"
		die "criu-rocm dump -t $pid failed (log: $img/dump.log)"
	fi
	status=0
	wait "$pid" 2>/dev/null || status=$?
	[ "$status" = 137 ] || die "after the dump, pid $pid exited with status $status, not killed by criu"
}

restore_proc() {
	local pid=$1 status
	timed "$out/restore.res" "$out/restore.stats" /usr/bin/env "${WRAP[@]}" "$criu" restore -D "$img" -o restore.log -v4 -d \
		--display-stats
	read -r status _ <"$out/restore.res"
	if [ "$status" != 0 ]; then
		criu_errors "$img/restore.log"
		die "criu-rocm restore of pid $pid failed (log: $img/restore.log)"
	fi
	alive "$pid" || die "the restored pid $pid is gone (log: $out/proc.err)"
}

# kfd-emu's CPU time so far (utime + stime, in clock ticks); kfd-emu is $EMU_PID, the parent
# of in_emu.
EMU_PID=
emu_ticks() {
	local stat f
	stat=$(cat "/proc/$EMU_PID/stat") || die "kfd-emu (pid $EMU_PID) is gone"
	read -r -a f <<<"${stat##*) }"
	echo $((f[11] + f[12]))
}

# Waits until kfd-emu has used no CPU for 0.1 s (five polls of emu_ticks): the release of a
# process it was sent has ended. See the top for why.
settle() {
	local prev=-1 now same=0 i
	for ((i = 0; i < 1500; i++)); do
		now=$(emu_ticks)
		if [ "$now" = "$prev" ]; then
			same=$((same + 1))
			[ "$same" -ge 5 ] && return 0
		else
			same=0 prev=$now
		fi
		sleep 0.02
	done
	die "kfd-emu (pid $EMU_PID) did not go idle within 30 s of a kill"
}

# The restored process checks every byte (its answer: line $3 of its output, default 2);
# then it is killed (kfd-emu reaps it).
check_and_kill() {
	local pid=$1 kind=$2 n=${3:-2} line i
	kill -USR1 "$pid"
	line=$(log_line "$n" "$pid" 120 "$out/proc.out") || die "restored $kind pid $pid did not answer SIGUSR1"
	[[ $line == '{"ok":true,'* ]] || die "restored $kind pid $pid: verification failed: $line"
	kill -KILL "$pid"
	for ((i = 0; i < 200; i++)); do
		[ -e /proc/"$pid" ] || return 0
		sleep 0.05
	done
	die "pid $pid still exists 10 s after SIGKILL"
}

# The indices 0 .. $1-1 in the order of run $2: ascending in odd runs, descending in even
# ones (see the top).
in_turn() {
	if (($2 % 2)); then seq 0 $(($1 - 1)); else seq $(($1 - 1)) -1 0; fi
}
