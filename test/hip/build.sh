# shellcheck shell=bash
# Building HIP programs as test/hip does (test/hip/README.md), shared by test/hip/run.sh,
# test/hip/fixtures.sh and test/hip-cr/run.sh. Sourced, not run; bash only.

# The hipcc flags of a source: its first line's `// hipcc-flags:` words, else -O2.
hip_flags_of() { # FILE
	local first
	first=$(head -n 1 "$1")
	case $first in
	"// hipcc-flags:"*) echo "${first#// hipcc-flags:}" ;;
	*) echo -O2 ;;
	esac
}

# hipcc_scratch ARG...: hipcc ARGs with its temporary files in a directory of their own,
# removed afterwards: Debian's clang makes one directory per offload arch in TMPDIR
# (/tmp/PROG-XXXXXX) for the device objects and removes the objects but not the directories.
hipcc_scratch() {
	local tmp rc=0
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/hipcc.XXXXXX") || return 1
	TMPDIR=$tmp hipcc "$@" || rc=$?
	rm -rf "$tmp"
	return $rc
}

# hip_build SRC BIN LOG [HEADER...]: builds SRC for gfx908 and gfx90a into BIN unless BIN
# is newer than SRC, test/hip/check.h and each HEADER; the compiler's output goes to LOG.
# Prints BIN, or fails.
hip_build() {
	local src=$1 bin=$2 log=$3 dep fresh=1
	shift 3
	mkdir -p "$(dirname "$bin")" "$(dirname "$log")"
	for dep in "$src" "$(dirname "${BASH_SOURCE[0]}")/check.h" "$@"; do
		[ -x "$bin" ] && [ "$bin" -nt "$dep" ] || fresh=0
	done
	if [ $fresh = 1 ]; then
		echo "$bin"
		return 0
	fi
	# shellcheck disable=SC2046 # the flags are words
	hipcc_scratch --offload-arch=gfx908 --offload-arch=gfx90a $(hip_flags_of "$src") -o "$bin.tmp" \
		"$src" >"$log" 2>&1 || return 1
	mv "$bin.tmp" "$bin" && echo "$bin"
}
