# shellcheck shell=bash
# The case-runner framework shared by the shell test suites (test/gpu/run.sh,
# test/sdma/run.sh, test/rpc/run.sh, test/containers/run.sh, test/rocm/cr.sh): how a case
# reports, how it runs a step on an emulated host, and the entry points a suite script is
# run again with; choosing the cases to run (cases_select), running one and printing its
# result (cases_run_one), running them all and printing the totals (cases_run_all).
# Sourced, not run; bash only.
#
# Sourcing it sets `self` (the script's own path, run again by `on` and the entry points)
# and `here` (its directory), and sources scripts/lib/workload.sh (alive, wait_gone, ...).
# A case has CASE_DIR, its own directory; `on` needs KFD_EMU (the kfd-emu binary).

self=$(realpath "$0")
# shellcheck disable=SC2034 # the suites use it
here=$(dirname "$self")
# shellcheck source=SCRIPTDIR/workload.sh
. "$(dirname "${BASH_SOURCE[0]}")/workload.sh"

# ---------------------------------------------------------------------------------------
# Reporting, from a case or any step of it (a suite's runner reads these files)

# Records why the case fails and ends the current process (case or in-host step).
fail() {
	printf '%s\n' "$*" >>"$CASE_DIR/reason"
	exit 1
}

# A line printed under the case's PASS.
note() { printf '%s\n' "$*" >>"$CASE_DIR/notes"; }

# Records why the case is skipped and ends the current process with status 0.
skip() {
	printf '%s\n' "$*" >>"$CASE_DIR/skip"
	exit 0
}

# known_bug "BUG-N: DESCRIPTION" REGEX: the running case fails because of a known bug, and
# its failure reason must match REGEX (a different failure is a real one).
known_bug() { printf '%s\n%s\n' "$1" "$2" >"$CASE_DIR/known-bug"; }

# ---------------------------------------------------------------------------------------
# Emulated hosts

# on PROFILE [kfd-emu run OPTION...] -- FUNCTION [ARG...]: FUNCTION of this script (run as
# `$self __in FUNCTION ARG...`) inside a new kfd-emu instance, an emulated host with
# PROFILE. A suite may set the array CASES_ON_WRAP to a command the script runs under there
# (test/rocm/cr.sh: a private mount namespace). kfd-emu's stderr goes to the case's
# kfd-emu.log; when the host fails, the case fails (with the step's reason if it gave one).
on() {
	local opts=() rc
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		opts+=("$1")
		shift
	done
	shift
	"$KFD_EMU" run --profile "${opts[@]}" -- ${CASES_ON_WRAP[@]+"${CASES_ON_WRAP[@]}"} "$self" __in "$@" \
		2>>"$CASE_DIR/kfd-emu.log"
	rc=$?
	if [ $rc != 0 ]; then
		[ -s "$CASE_DIR/reason" ] || fail "kfd-emu run --profile ${opts[*]} -- $1: exit status $rc (see $CASE_DIR/kfd-emu.log)"
		exit 1
	fi
}

# ---------------------------------------------------------------------------------------
# Running a case (in the suite's runner, the init of its own pid namespace)

# Whatever a case left running in the namespace (kfd-emu kills its own descendants; this
# catches the rest after a timeout).
kill_leftovers() {
	local d p
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		[ "$p" = 1 ] || [ "$p" = $$ ] && continue
		kill -KILL "$p" 2>/dev/null
	done
	wait 2>/dev/null
}

# cases_run_one NAME: runs case_NAME as `$self __case NAME` in its own directory
# $WORK/NAME (also its working directory), under `timeout $CASE_TIMEOUT`, kills what it
# left, and prints one of
#   PASS  NAME (SECS)                 and the case's notes under it
#   SKIP  NAME: WHY                   the case called skip
#   XFAIL NAME (SECS): known bug: BUG it called known_bug and failed as that bug fails
#   XPASS NAME (SECS): ...            it called known_bug and passed (counted as passed)
#   FAIL  NAME (SECS): REASON         and where its logs are
# counting them in PASSED (PASS, XFAIL, XPASS), SKIPPED and FAILED (cases_init sets them
# to 0); XFAIL names go to XFAILS.
cases_run_one() {
	local name=$1 t0 rc secs reason bug bug_re status
	CASE_DIR=$WORK/$name
	rm -rf "$CASE_DIR"
	mkdir -p "$CASE_DIR"
	export CASE_DIR
	t0=${EPOCHREALTIME/./}
	(cd "$CASE_DIR" && timeout -k 10 "$CASE_TIMEOUT" "$self" __case "$name") >"$CASE_DIR/case.out" 2>&1
	rc=$?
	kill_leftovers
	secs=$(((${EPOCHREALTIME/./} - t0) / 100000))
	secs="$((secs / 10)).$((secs % 10)) s"
	reason=$(cat "$CASE_DIR/reason" 2>/dev/null)
	[ "$rc" = 124 ] || [ "$rc" = 137 ] && reason="timed out after ${CASE_TIMEOUT} s${reason:+; $reason}"
	[ "$rc" != 0 ] && [ -z "$reason" ] && reason="exit status $rc (see $CASE_DIR/case.out)"
	bug=$(sed -n 1p "$CASE_DIR/known-bug" 2>/dev/null)
	bug_re=$(sed -n 2p "$CASE_DIR/known-bug" 2>/dev/null)
	if [ "$rc" = 0 ] && [ -f "$CASE_DIR/skip" ]; then
		status=SKIP
	elif [ "$rc" = 0 ] && [ -z "$bug" ]; then
		status=PASS
	elif [ "$rc" = 0 ]; then
		status=XPASS
	elif [ -n "$bug" ] && grep -qE -- "$bug_re" <<<"$reason"; then
		status=XFAIL
	else
		status=FAIL
	fi
	case $status in
	PASS)
		PASSED=$((PASSED + 1))
		echo "PASS  $name ($secs)"
		sed 's/^/      /' "$CASE_DIR/notes" 2>/dev/null
		;;
	SKIP)
		SKIPPED=$((SKIPPED + 1))
		echo "SKIP  $name: $(head -n 1 "$CASE_DIR/skip")"
		;;
	XFAIL)
		PASSED=$((PASSED + 1))
		XFAILS+=("$name")
		echo "XFAIL $name ($secs): known bug: $bug"
		echo "      fails as expected: $(cut -c1-400 <<<"$reason" | head -n 1)"
		;;
	XPASS)
		PASSED=$((PASSED + 1))
		echo "XPASS $name ($secs): passed although marked for ${bug%%:*}; once that is fixed, drop the mark"
		;;
	FAIL)
		FAILED=$((FAILED + 1))
		echo "FAIL  $name ($secs): $reason"
		[ -n "$bug" ] && echo "      marked as failing for ${bug%%:*}, but it failed otherwise"
		echo "      logs: $CASE_DIR"
		;;
	esac
	return 0
}

# cases_init: no case run yet.
cases_init() { PASSED=0 FAILED=0 SKIPPED=0 XFAILS=(); }

# cases_select SUITE [NAME...]: no case run yet (cases_init), and WANTED the cases to run:
# the NAMEs, or every case in the suite's order (ordered_cases) when none is given. A NAME
# without a case_NAME function ends the suite (exit status 2, SUITE naming it).
cases_select() {
	local suite=$1 name
	shift
	cases_init
	trap 'exit 130' INT TERM HUP
	WANTED=("$@")
	[ ${#WANTED[@]} -gt 0 ] || mapfile -t WANTED < <(ordered_cases)
	for name in "${WANTED[@]}"; do
		declare -F "case_$name" >/dev/null || { echo "$suite: no case $name (--list)" >&2; exit 2; }
	done
}

# cases_run_all KEEP: runs each of WANTED (cases_run_one), prints the total time and the
# known bugs that failed as expected, removes $WORK when no case failed (unless KEEP is 1),
# and ends with cases_summary's line and status.
cases_run_all() {
	local keep=$1 name t0
	t0=${EPOCHREALTIME/./}
	for name in "${WANTED[@]}"; do cases_run_one "$name"; done
	echo "total $(((${EPOCHREALTIME/./} - t0) / 1000000)) s${XFAILS[*]:+; expected failures (known bugs): ${XFAILS[*]}}"
	if [ "$FAILED" = 0 ] && [ "$keep" != 1 ]; then rm -rf "$WORK"; fi
	cases_summary
}

# cases_summary: the last line of a suite, "N passed, M failed" (", K skipped" when K > 0);
# its status is non-zero when a case failed.
cases_summary() {
	if [ "$SKIPPED" != 0 ]; then
		echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	else
		echo "$PASSED passed, $FAILED failed"
	fi
	[ "$FAILED" = 0 ]
}

# ---------------------------------------------------------------------------------------
# Entry points

# cases_dispatch "$@": the ways a suite script runs itself, and --list and --help:
#   __main ARG...        main ARG... (the script as init of its own pid namespace)
#   __case NAME          case_NAME (one case, under the runner's timeout)
#   __in FUNCTION ARG... FUNCTION ARG... inside an emulated host (see `on`), after
#                        cases_host_setup when the script defines one
#   --list               ordered_cases (the suite's case names, one a line)
#   "", -h, --help       the comment at the top of the script, exit status 2
# It exits with the status of what it ran; for any other first argument (the script's own
# command line: CRIU_BINARY [CASE...]) it returns.
cases_dispatch() {
	case ${1:-} in
	__main)
		shift
		main "$@"
		;;
	__case)
		case_"$2"
		;;
	__in)
		shift
		if declare -F cases_host_setup >/dev/null; then cases_host_setup; fi
		"$@"
		;;
	--list)
		ordered_cases
		;;
	"" | -h | --help)
		sed -n '2,/^set -uo/p' "$self" | sed '$d; s/^# \{0,1\}//'
		exit 2
		;;
	*)
		return 0
		;;
	esac
	exit
}
