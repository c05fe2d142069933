#!/usr/bin/env bash
# libdrm_amdgpu's GEM side on kfd-emu's render nodes (issue 29): builds gem-test.c against
# Debian's libdrm_amdgpu and libhsakmt and runs it under `kfd-emu supervise` (dma-buf fds)
# inside `kfd-emu run`, one case per line of the table below: BO allocation, CPU and GPU
# mappings, metadata, Linux 6.18's GEM_LIST_HANDLES, GEM_OP GET_MAPPING_INFO and
# GEM_CHANGE_HANDLE (refused, or renaming on a 6.18.0-6.18.35 host), an SDMA copy through
# amdgpu_cs_submit, and dma-buf export and import (the same GPU; another GPU in another
# process), alone and in a process that also uses KFD.
#
#   usage: test/rocm/gem-check.sh [CASE...]    (as root; `make test-gem` runs it)
#   env:   CARGO_TARGET_DIR  where kfd-emu was built (default rust/target); KFD_EMU names
#                            the binary itself
#
# Prints PASS or FAIL (with the reason) per case, then exactly "N passed, M failed"; the
# exit status is non-zero on any failure.
set -uo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
ch=$top/test/gpu/hosts/gem-change-handle.toml

# name | profile | profile override file or - | gem-test arguments
cases=(
	"gem_alone|mi100|-|"
	"gem_two_gpus|mi100x2|-|"
	"gem_with_kfd|mi210x4|-|--kfd"
	"gem_change_handle|mi100|$ch|--change-handle --kfd"
)

[ "$(id -u)" = 0 ] || { echo "gem-check.sh: needs root (kfd-emu mounts FUSE nodes)" >&2; exit 2; }
KFD_EMU=${KFD_EMU:-${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu}
[ -x "$KFD_EMU" ] || { echo "gem-check.sh: no $KFD_EMU (cargo build --release -p kfd-emu)" >&2; exit 2; }

work=$(mktemp -d /tmp/gem-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2046 # pkg-config prints several words on purpose
if ! cc -std=gnu11 -Wall -Wextra -Werror -O2 -o "$work/gem-test" "$here/gem-test.c" \
	$(pkg-config --cflags --libs libdrm_amdgpu libdrm) -lhsakmt 2>"$work/cc.log"; then
	echo "FAIL: gem-test.c does not build:"
	sed 's/^/  /' "$work/cc.log"
	echo "0 passed, 1 failed"
	exit 1
fi

want=("$@")
pass=0 failn=0
for c in "${cases[@]}"; do
	IFS='|' read -r name prof file args <<<"$c"
	if [ ${#want[@]} -gt 0 ] && ! printf '%s\n' "${want[@]}" | grep -qx "$name"; then
		continue
	fi
	run=(--profile "$prof")
	[ "$file" = - ] || run+=(--profile-file "$file")
	log=$work/$name.log
	# shellcheck disable=SC2086 # the arguments are words
	if timeout 120 "$KFD_EMU" run "${run[@]}" -- "$KFD_EMU" supervise -- "$work/gem-test" $args \
		>"$log" 2>&1 && grep -q '^PASS' "$log"; then
		echo "PASS $name ($prof: $(grep -c '^ok ' "$log") checks)"
		pass=$((pass + 1))
	else
		echo "FAIL $name ($prof):"
		grep -v '^ok ' "$log" | tail -n 15 | sed 's/^/  /'
		failn=$((failn + 1))
	fi
done
echo "$pass passed, $failn failed"
[ "$failn" = 0 ]
