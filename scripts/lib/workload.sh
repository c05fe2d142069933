# shellcheck shell=bash
# Shell helpers shared by scripts/demo.sh, scripts/bench-cr.sh and the shell test suites
# (through scripts/lib/cases.sh): the state of a process and the JSON lines gpu-workload
# prints. Sourced, not run; bash only.

# Whether process $1 exists and is neither a zombie nor dead.
alive() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	s=${s##*) }
	case ${s%% *} in Z | X) return 1 ;; esac
}

# Waits up to $2 seconds (default 30) for process $1 to be gone.
wait_gone() {
	local i
	for ((i = 0; i < ${2:-30} * 20; i++)); do
		alive "$1" || return 0
		sleep 0.05
	done
	return 1
}

# await_line OUT STOP PASS TRIES [PID]: waits, 0.05 s at a time and at most TRIES times (not
# past PID's end, given one), until a line of file OUT matches the extended regex STOP (the
# answer a program writes, passing or failing); succeeds if a line matches PASS.
await_line() {
	local out=$1 stop=$2 pass=$3 tries=$4 pid=${5:-} i
	for ((i = 0; i < tries; i++)); do
		grep -qE "$stop" "$out" && break
		[ -z "$pid" ] || alive "$pid" || break
		sleep 0.05
	done
	grep -qE "$pass" "$out"
}

# The state letter of process $1 (its /proc stat field), nothing once it is gone.
proc_state() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	s=${s##*) }
	echo "${s%% *}"
}

# wait_stopped PID CPID: waits up to 60 s for PID to be stopped (state T) while CPID (the
# criu-rocm that stops it) lives; fails if it never is.
wait_stopped() {
	local i
	for ((i = 0; i < 1200; i++)); do
		[ "$(proc_state "$1")" = T ] && return 0
		alive "$2" || break
		sleep 0.05
	done
	[ "$(proc_state "$1")" = T ]
}

# Waits up to $3 seconds for line $1 of file $4, which process $2 writes, and prints it.
# Fails, saying why on stderr, when the time runs out or the process ends without it.
file_line() {
	local n=$1 pid=$2 secs=$3 file=$4 i t0=$SECONDS state
	for ((i = 0; i < secs * 20; i++)); do
		[ "$(wc -l <"$file")" -ge "$n" ] && break
		alive "$pid" || break
		sleep 0.05
	done
	if [ "$(wc -l <"$file")" -ge "$n" ]; then
		sed -n "${n}p" "$file"
		return 0
	fi
	# The process' state now, and how long was waited: a wait that ends early with the
	# process alive means it looked gone once (a zombie, or /proc unreadable) and then not.
	state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || state=gone
	if alive "$pid"; then
		echo "pid $pid (state $state) wrote no line $n to $file after $((SECONDS - t0)) s of $secs s, $i polls" >&2
	else
		echo "pid $pid (state $state) ended without writing line $n to $file after $((SECONDS - t0)) s" >&2
	fi
	return 1
}

# "fd minor" of each render-node fd of process $1.
render_fds() {
	local f t
	for f in /proc/"$1"/fd/*; do
		t=$(readlink "$f") || continue
		case $t in /dev/dri/renderD*) echo "${f##*/} ${t#/dev/dri/renderD}" ;; esac
	done
}

# Fields of one of gpu-workload's JSON lines: whether it says ok, a number, a list of
# numbers (space separated). "errors", the only field holding strings, comes last and is
# cut off first, so its text cannot match.
json_ok() { [[ $1 == '{"ok":true,'* ]]; }
json_num() {
	local l=${1%%,\"errors\":*}
	[[ $l =~ \"$2\":([0-9]+) ]] && echo "${BASH_REMATCH[1]}"
}
json_list() {
	local l=${1%%,\"errors\":*}
	[[ $l =~ \"$2\":\[([0-9,]*)\] ]] && echo "${BASH_REMATCH[1]//,/ }"
}

# log_errors LOG [N]: the error lines of a CRIU log, without their timestamps, joined by
# '|': the last N (4); with N of 3 or more and more lines than N, the first one (usually
# the cause: CRIU's later lines are each task giving up) then "..." then the last N-1.
# CRIU's RLIMIT_NOFILE complaint, logged on every run here, is left out.
log_errors() {
	[ -f "$1" ] || return 0
	local n=${2:-4} lines
	lines=$(grep -a -E 'Error|amdgpu:' "$1" | grep -v 'RLIMIT_NOFILE' | grep -a -E 'Error|rror|fail|FAIL' |
		sed 's/^([0-9. ]*) *//' | cut -c1-300)
	[ -n "$lines" ] || return 0
	if [ "$n" -ge 3 ] && [ "$(wc -l <<<"$lines")" -gt "$n" ]; then
		{ head -n 1 <<<"$lines"; echo ...; tail -n "$((n - 1))" <<<"$lines"; } | paste -sd'|'
	else
		tail -n "$n" <<<"$lines" | paste -sd'|'
	fi
}

# The hashes of the image files of directory $1 (to show a step left them unchanged).
img_sums() { (cd "$1" && sha256sum -- *.img); }
