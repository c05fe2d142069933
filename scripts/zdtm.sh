#!/usr/bin/env bash
# Runs upstream's zdtm suite from the patched CRIU tree against a CRIU binary.
#   usage: scripts/zdtm.sh --criu-bin BIN --tree CRIU_TREE --list FILE [--report DIR]
#                          [--flavours F] [-- extra zdtm.py args]
#
# The list holds one test per line, `zdtm/static/NAME [FLAVOURS]` (default flavours "h,ns").
# --flavours F runs only flavour F ("h", "ns", ...) of the tests that have it (to time one).
#
# Root only: this machine lacks CAP_SYS_RESOURCE, so CRIU cannot prlimit a task of another
# uid, and zdtm by default drops non-suid tests to a test uid. ZDTM_AS_ROOT=1 (our zdtm
# patch 0004) keeps every test root. zdtm must run under Debian's /usr/bin/python3 (it has
# the protobuf and yaml modules) and the tests it spawns must find that interpreter first on
# PATH too.
set -euo pipefail

criu= tree= list= report= only=
while [ $# -gt 0 ]; do
	case "$1" in
	--criu-bin) criu=$(realpath "$2"); shift 2 ;;
	--tree) tree=$(realpath "$2"); shift 2 ;;
	--list) list=$(realpath "$2"); shift 2 ;;
	--report) report=$2; shift 2 ;;
	--flavours) only=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "zdtm.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ -n "$criu" ] && [ -n "$tree" ] && [ -n "$list" ] || { echo "zdtm.sh: need --criu-bin, --tree and --list" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "zdtm.sh: zdtm must run as root here (no CAP_SYS_RESOURCE; see the comment at the top)" >&2; exit 1; }

export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export ZDTM_AS_ROOT=1
cd "$tree"

# zdtm needs pycriu's generated modules (the top Makefile builds CRIU's lib/) and its test
# binaries.
[ -f lib/pycriu/rpc_pb2.py ] || { echo "zdtm.sh: $tree/lib/pycriu is not built (make -C $tree lib)" >&2; exit 1; }
# The lock the Makefile takes for builds in this tree (see TREE_LOCK there).
flock "$(dirname "$tree")/.tree.lock" make -s -j2 -C test/zdtm >"$tree/zdtm-build.log" 2>&1 || { tail -n 30 "$tree/zdtm-build.log" >&2; exit 1; }

pass=0 fail=0 failed=() t_all=$(date +%s)
while read -r test flavours _; do
	case "$test" in '' | '#'*) continue ;; esac
	flavours=${flavours:-h,ns}
	if [ -n "$only" ]; then
		case ",$flavours," in *",$only,"*) flavours=$only ;; *) continue ;; esac
	fi
	start=$(date +%s%N)
	if (cd test && /usr/bin/python3 zdtm.py run -t "$test" -f "$flavours" --criu-bin "$criu" \
		--keep-going "$@" >"$tree/zdtm-last.log" 2>&1); then
		pass=$((pass + 1))
		ms=$((($(date +%s%N) - start) / 1000000))
		printf 'zdtm: %-40s %-6s PASS (%d.%03ds)\n' "$test" "$flavours" $((ms / 1000)) $((ms % 1000))
	else
		fail=$((fail + 1))
		failed+=("$test")
		printf 'zdtm: %-40s %-6s FAIL\n' "$test" "$flavours"
		grep -E "FAIL|Error" "$tree/zdtm-last.log" | tail -n 15 | sed 's/^/    /'
		[ -n "$report" ] && mkdir -p "$report" && cp "$tree/zdtm-last.log" "$report/$(basename "$test").log"
	fi
done <"$list"

echo "zdtm: $pass passed, $fail failed in $(($(date +%s) - t_all)) s"
[ $fail = 0 ] || { echo "zdtm: failed: ${failed[*]}"; exit 1; }
