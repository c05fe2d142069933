# shellcheck shell=bash
# The case-runner framework shared by the shell test suites (test/gpu/run.sh,
# test/sdma/run.sh, test/rpc/run.sh, test/containers/run.sh, test/rocm/cr.sh): how a case
# reports, how it runs a step on an emulated host, and the entry points a suite script is
# run again with. Sourced, not run; bash only. Running the cases and printing their results
# stays in each suite (each has its own output format, which CI and the README read).
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
