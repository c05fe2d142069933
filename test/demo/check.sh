#!/usr/bin/env bash
# Cheap checks of `make demo`'s pieces, without running the demo: scripts/demo.sh parses
# (and passes shellcheck when it is installed) and prints its usage, and the restore host's
# override really differs from the dump host in every gpu_id, every render minor and the
# order of the GPUs (needs kfd-emu built: cargo build --release -p kfd-emu).
#   usage: test/demo/check.sh [KFD_EMU]
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
demo=$top/scripts/demo.sh
override=$top/test/demo/restore-host.toml
kfd_emu=${1:-${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu}
fail() {
	echo "demo check: FAIL: $*" >&2
	exit 1
}

bash -n "$demo" || fail "scripts/demo.sh does not parse"
if command -v shellcheck >/dev/null; then
	shellcheck -x "$demo" "$0" || fail "shellcheck reports the above"
else
	echo "demo check: shellcheck not installed, skipped"
fi
"$demo" --help | grep -q 'usage: scripts/demo.sh' || fail "scripts/demo.sh --help prints no usage"

[ -x "$kfd_emu" ] || fail "$kfd_emu is not built"
# "gpu_id minor" per GPU in topology order.
gpus() {
	"$kfd_emu" topology "$@" | awk '
		/^== nodes\/[0-9]+\/gpu_id ==$/ { getline id; if (id != 0) { gpu = id } else { gpu = "" } }
		/^drm_render_minor / && gpu != "" { print gpu, $2; gpu = "" }'
}
old=$(gpus --profile mi210x4) || fail "kfd-emu topology --profile mi210x4"
new=$(gpus --profile mi210x4 --profile-file "$override") || fail "kfd-emu rejects $override"
if [ "$(wc -l <<<"$old")" != 4 ] || [ "$(wc -l <<<"$new")" != 4 ]; then
	fail "expected 4 GPUs on both hosts: dump host ${old//$'\n'/, }; restore host ${new//$'\n'/, }"
fi
common_ids=$(comm -12 <(cut -d' ' -f1 <<<"$old" | sort) <(cut -d' ' -f1 <<<"$new" | sort))
[ -z "$common_ids" ] || fail "gpu_ids on both hosts: $common_ids"
common_minors=$(comm -12 <(cut -d' ' -f2 <<<"$old" | sort) <(cut -d' ' -f2 <<<"$new" | sort))
[ -z "$common_minors" ] || fail "render minors on both hosts: $common_minors"
# Another order: the restore host does not list its GPUs by ascending gpu_id as mi210x4 does,
# nor by ascending minor.
[ "$(cut -d' ' -f1 <<<"$old")" = "$(cut -d' ' -f1 <<<"$old" | sort -n)" ] ||
	fail "mi210x4 no longer lists its GPUs by ascending gpu_id; revisit this check"
[ "$(cut -d' ' -f1 <<<"$new")" != "$(cut -d' ' -f1 <<<"$new" | sort -n)" ] ||
	fail "the restore host lists its GPUs in the dump host's order (by ascending gpu_id)"
[ "$(cut -d' ' -f2 <<<"$new")" != "$(cut -d' ' -f2 <<<"$new" | sort -n)" ] ||
	fail "the restore host lists its GPUs by ascending render minor, as the dump host does"
echo "demo check: PASS"
