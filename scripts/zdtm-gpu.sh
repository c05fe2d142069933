#!/usr/bin/env bash
# Runs criu-rocm's zdtm GPU tests (test/zdtm/static/gpu_*) with upstream's zdtm.py, each
# inside its own emulated machine: `kfd-emu run --profile P -- zdtm.py run ...`, so zdtm,
# the test and criu all see the same emulated /dev/kfd, render nodes and KFD topology.
#
#   usage: scripts/zdtm-gpu.sh --criu-bin BIN --tree CRIU_TREE --list FILE
#                              [--kfd-emu BIN] [--kfd-client DIR] [--report DIR]
#                              [--only NAME] [--nocr | --selftest] [-- extra zdtm.py args]
#
# The list (test/zdtm-gpu.list) holds one zdtm.py run a line:
#   zdtm/static/NAME FLAVOURS PROFILE [zdtm.py mode options...]
# e.g. `zdtm/static/gpu_vram_gtt h mi100x2 --iters 3`, or one that cannot run, with why:
#   zdtm/static/NAME FLAVOURS PROFILE skip: REASON
# which is reported as SKIP with its reason in every mode and never counted as passed.
#
#   --nocr      runs every line without checkpoint/restore (zdtm.py --nocr): the tests
#               themselves must pass.
#   --selftest  runs each test of the list once with --nocr (must PASS) and once more with
#               ZDTM_GPU_CORRUPT=1, which makes the test damage one dword of its GPU data
#               before it checks (must FAIL, with a FAIL: line in its output): proves that
#               every test checks what it claims to.
#   --only NAME runs only the lines of test NAME.
#   --kfd-client DIR is the kfd-client crate (header in DIR/include); its static library
#               is taken from the kfd-emu binary's directory (cargo's target/release).
#
# Root only, like scripts/zdtm.sh (no CAP_SYS_RESOURCE here: ZDTM_AS_ROOT=1 keeps the tests
# root; zdtm needs Debian's /usr/bin/python3 first on PATH). GPU tests need root anyway to
# use /dev/kfd.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
criu='' tree='' list='' report='' only='' mode=cr
emu=$top/rust/target/release/kfd-emu
client=$top/rust/kfd-client
while [ $# -gt 0 ]; do
	case "$1" in
	--criu-bin) criu=$(realpath "$2"); shift 2 ;;
	--tree) tree=$(realpath "$2"); shift 2 ;;
	--list) list=$(realpath "$2"); shift 2 ;;
	--kfd-emu) emu=$(realpath "$2"); shift 2 ;;
	--kfd-client) client=$(realpath "$2"); shift 2 ;;
	--report) report=$(realpath -m "$2"); shift 2 ;;
	--only) only=$2; shift 2 ;;
	--nocr) mode=nocr; shift ;;
	--selftest) mode=selftest; shift ;;
	--) shift; break ;;
	*) echo "zdtm-gpu.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
if [ -z "$criu" ] || [ -z "$tree" ] || [ -z "$list" ]; then
	echo "zdtm-gpu.sh: need --criu-bin, --tree and --list" >&2
	exit 2
fi
[ "$(id -u)" = 0 ] || { echo "zdtm-gpu.sh: zdtm must run as root (see scripts/zdtm.sh)" >&2; exit 1; }
[ -x "$emu" ] || { echo "zdtm-gpu.sh: no kfd-emu at $emu (cd rust && cargo build --release -p kfd-emu)" >&2; exit 1; }
lib=$(dirname "$emu")/libkfd_client.a
[ -f "$lib" ] || { echo "zdtm-gpu.sh: no $lib (cd rust && cargo build --release -p kfd-client)" >&2; exit 1; }
[ -f "$client/include/kfd_client.h" ] || { echo "zdtm-gpu.sh: no kfd_client.h in $client/include" >&2; exit 1; }
[ -f "$tree/lib/pycriu/rpc_pb2.py" ] || { echo "zdtm-gpu.sh: $tree/lib/pycriu is not built (make -C $tree lib)" >&2; exit 1; }
grep -q 'KFD_CLIENT_LIB' "$tree/test/zdtm/static/Makefile" ||
	{ echo "zdtm-gpu.sh: $tree lacks criu/patches/0010-zdtm-gpu-tests.patch (re-run make)" >&2; exit 1; }

export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
export ZDTM_AS_ROOT=1
# The Makefile of zdtm/static lists and builds the GPU tests only with these (patch 0010),
# and the tests on Debian's ROCm userspace (gpu_hsakmt_*, gpu_rocr_*) only with ZDTM_ROCM=1
# (patch 0014); zdtm.py's `make NAME.pid` inherits them.
export KFD_CLIENT_LIB=$lib KFD_CLIENT_INC=$client/include ZDTM_ROCM=1
static=$tree/test/zdtm/static

# The lines to run: "name flavours profile options...".
lines=()
while read -r test flavours profile opts; do
	case "$test" in '' | '#'*) continue ;; esac
	[ -n "$profile" ] || { echo "zdtm-gpu.sh: $list: '$test' names no profile" >&2; exit 2; }
	[ -z "$only" ] || [ "$(basename "$test")" = "$only" ] || continue
	lines+=("$test $flavours $profile $opts")
done < <(sed 's/[[:space:]]*#.*//' "$list")
[ ${#lines[@]} -gt 0 ] || { echo "zdtm-gpu.sh: nothing to run from $list" >&2; exit 2; }
if printf '%s\n' "${lines[@]}" | grep -q '^zdtm/static/gpu_\(hsakmt\|rocr\)_' &&
	{ [ ! -f /usr/include/hsakmt.h ] || [ ! -f /usr/include/hsa/hsa.h ]; }; then
	echo "zdtm-gpu.sh: the list has tests on ROCm, but Debian's libhsakmt-dev or libhsa-runtime-dev is missing (scripts/install-deps.sh)" >&2
	exit 1
fi

if printf '%s\n' "${lines[@]}" | grep -q '^zdtm/static/gpu_hip_' && ! command -v hipcc >/dev/null; then
	echo "zdtm-gpu.sh: the list has tests on HIP, but Debian's hipcc is missing (scripts/install-deps.sh)" >&2
	exit 1
fi

# Our test sources: prepare-criu.sh copies them when it makes the tree; a test edited since
# is not a CRIU input (it must not rebuild CRIU), so refresh changed files here.
for f in "$top"/test/zdtm/static/*; do
	cmp -s "$f" "$static/$(basename "$f")" || cp "$f" "$static/"
done
mapfile -t names < <(printf '%s\n' "${lines[@]}" | awk '$4 != "skip:" { sub(".*/", "", $1); print $1 }' | sort -u)
log=$tree/zdtm-gpu-build.log
# The lock the Makefile takes for builds in this tree (see TREE_LOCK there). TMPDIR: a
# scratch directory, removed afterwards (hipcc's clang leaves an empty directory per
# offload arch of a HIP test there).
hiptmp=$(mktemp -d)
# shellcheck disable=SC2016 # expanded by the inner sh
if ! TMPDIR=$hiptmp flock "$(dirname "$tree")/.tree.lock" sh -c 'make -s -j2 -C "$1/test/zdtm/lib" && shift && make -s -j2 -C "$@"' \
	sh "$tree" "$static" "${names[@]}" >"$log" 2>&1; then
	rm -rf "$hiptmp"
	tail -n 30 "$log" >&2
	echo "zdtm-gpu.sh: building the GPU tests failed (log: $log)" >&2
	exit 1
fi
rm -rf "$hiptmp"

# run_zdtm PROFILE TEST FLAVOURS [zdtm.py options...]: one zdtm.py run on a fresh emulator,
# in a private mount namespace with an empty /dev/shm of its own, as a machine of its own
# has. libhsakmt removes its /dev/shm/hsakmt_shared_mem when any of its processes closes
# KFD; on the machine's /dev/shm, another ROCm program ending between a restore's check
# that the file is there and CRIU's opening of it made the restore fail ("Can't open file
# dev/shm/hsakmt_shared_mem on restore", gpu_rocr_tree, once; fixed by patch 0081, tested
# by test/rocm/cr.sh's hsakmt_idle_shm_removed_mid_restore). A host of its own all the same.
run_zdtm() {
	local profile=$1 test=$2 flavours=$3
	shift 3
	# shellcheck disable=SC2016 # expanded by the inner sh
	(cd "$tree/test" && unshare --mount --propagation private sh -c \
		'mount -t tmpfs -o mode=1777,size=64m zdtm-gpu-shm /dev/shm && exec "$@"' sh \
		"$emu" run --profile "$profile" -- \
		/usr/bin/python3 zdtm.py run -t "$test" -f "$flavours" --criu-bin "$criu" --keep-going "$@")
}

pass=0 fail=0 skipped=0 failed=() t_all=$(date +%s)
# A line marked `skip: REASON`: reported, counted apart, never run.
skipped_line() {
	local what=$1 opts=$2
	case $opts in
	skip:*)
		skipped=$((skipped + 1))
		printf 'zdtm-gpu: %-62s SKIP: %s\n' "$what" "${opts#skip: }"
		return 0
		;;
	esac
	return 1
}
result() {
	local ok=$1 what=$2 start=$3 ms
	ms=$((($(date +%s%N) - start) / 1000000))
	if [ "$ok" = 1 ]; then
		pass=$((pass + 1))
		printf 'zdtm-gpu: %-62s PASS (%d.%03ds)\n' "$what" $((ms / 1000)) $((ms % 1000))
	else
		fail=$((fail + 1))
		failed+=("$what")
		printf 'zdtm-gpu: %-62s FAIL (%d.%03ds)\n' "$what" $((ms / 1000)) $((ms % 1000))
	fi
}

# Shows why a run failed: zdtm's errors and the test's own FAIL/ERR lines (without CRIU's
# RLIMIT_NOFILE complaint, which every run here logs: no CAP_SYS_RESOURCE).
explain() {
	local name=$1 out=$2
	grep -E "FAIL|Error|ERR" "$out" | grep -v -e '^=\+ ' -e '----' -e 'RLIMIT_NOFILE' -e '^#\+ FAIL #\+$' |
		tail -n 12 | sed 's/^/    /'
	if [ -n "$report" ]; then
		mkdir -p "$report"
		cp "$out" "$report/$name.zdtm.log"
		cp "$static/$name.out" "$report/$name.out" 2>/dev/null || true
	fi
}

out=$tree/zdtm-gpu-last.log
if [ "$mode" = selftest ]; then
	# One emulator profile per test: the first line naming it.
	declare -A seen=()
	for l in "${lines[@]}"; do
		read -r test flavours profile opts <<<"$l"
		name=$(basename "$test")
		skipped_line "$name $flavours $profile" "$opts" && continue
		[ -z "${seen[$name]:-}" ] || continue
		seen[$name]=1
		flav=${flavours%%,*}

		start=$(date +%s%N)
		if run_zdtm "$profile" "$test" "$flav" --nocr "$@" >"$out" 2>&1; then
			result 1 "$name $flav $profile --nocr" "$start"
		else
			result 0 "$name $flav $profile --nocr" "$start"
			explain "$name" "$out"
		fi

		start=$(date +%s%N)
		if ZDTM_GPU_CORRUPT=1 run_zdtm "$profile" "$test" "$flav" --nocr "$@" >"$out" 2>&1; then
			result 0 "$name $flav $profile --nocr, corrupted: must fail" "$start"
			echo "    the test passed although ZDTM_GPU_CORRUPT damaged its data"
		elif grep -q ' FAIL: ' "$static/$name.out" 2>/dev/null; then
			result 1 "$name $flav $profile --nocr, corrupted: fails" "$start"
			grep ' FAIL: ' "$static/$name.out" | head -n 1 | sed 's/.* FAIL: /FAIL: /' | cut -c1-200 | sed 's/^/    /'
		else
			result 0 "$name $flav $profile --nocr, corrupted: must fail with FAIL:" "$start"
			explain "$name" "$out"
		fi
	done
else
	declare -A seen=()
	for l in "${lines[@]}"; do
		read -r test flavours profile opts <<<"$l"
		name=$(basename "$test")
		skipped_line "$name $flavours $profile" "$opts" && continue
		extra=()
		if [ "$mode" = nocr ]; then
			# Without C/R the mode options change nothing: once per test and profile.
			[ -z "${seen[$name $profile]:-}" ] || continue
			seen[$name $profile]=1
			opts='' extra=(--nocr)
		fi
		what="$name $flavours $profile${opts:+ $opts}${extra:+ ${extra[*]}}"
		start=$(date +%s%N)
		# shellcheck disable=SC2086 # the list's mode options are words
		if ! run_zdtm "$profile" "$test" "$flavours" $opts "${extra[@]}" "$@" >"$out" 2>&1; then
			result 0 "$what" "$start"
			explain "$name" "$out"
		elif grep -q '^Skipping zdtm/\|^Tracking memory is not available' "$out"; then
			# zdtm.py exits 0 when it runs nothing: a skip must not count as a pass.
			result 0 "$what (zdtm.py ran nothing)" "$start"
			grep '^Skipping zdtm/\|^Tracking memory' "$out" | sed 's/^/    /'
		else
			result 1 "$what" "$start"
		fi
	done
fi

if [ "$skipped" != 0 ]; then
	echo "zdtm-gpu: $pass passed, $fail failed, $skipped skipped in $(($(date +%s) - t_all)) s"
else
	echo "zdtm-gpu: $pass passed, $fail failed in $(($(date +%s) - t_all)) s"
fi
[ $fail = 0 ] || { printf 'zdtm-gpu: failed: %s\n' "${failed[@]}"; exit 1; }
