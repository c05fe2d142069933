#!/usr/bin/env bash
# Rebuilds the device code objects of test/hip/*.hip that gfx9's coverage test reads
# (rust/gfx9/tests/fixtures/hip/<prog>-<arch>.co), with the flags the runner uses: -O2, or
# those of a first line `// hipcc-flags: ...` (test/hip/README.md). Needs Debian's hipcc.
#
#   test/hip/fixtures.sh [--check]
#
# --check builds into a temporary directory and fails naming every fixture that differs
# from the committed one (a .hip changed without its fixtures).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
out=$top/rust/gfx9/tests/fixtures/hip
check=0
[ "${1:-}" = --check ] && check=1

command -v hipcc >/dev/null || { echo "fixtures: hipcc is not installed (scripts/install-deps.sh)" >&2; exit 1; }

# hip_flags_of
# shellcheck source=SCRIPTDIR/build.sh
. "$top/test/hip/build.sh"

dest=$out
if [ $check = 1 ]; then
	dest=$(mktemp -d)
	trap 'rm -rf "$dest"' EXIT
fi
mkdir -p "$dest"
rc=0
for src in "$top"/test/hip/*.hip; do
	prog=$(basename "$src" .hip)
	for arch in gfx908 gfx90a; do
		# shellcheck disable=SC2046 # the flags are words
		hipcc_scratch --offload-arch=$arch --cuda-device-only --no-gpu-bundle-output -c \
			$(hip_flags_of "$src") -o "$dest/$prog-$arch.co" "$src"
		if [ $check = 1 ] && ! cmp -s "$dest/$prog-$arch.co" "$out/$prog-$arch.co"; then
			echo "fixtures: $out/$prog-$arch.co is not what $src compiles to" >&2
			rc=1
		fi
	done
done
exit $rc
