#!/usr/bin/env bash
# Both doors install the same files: `make install` and `meson install`, each into a DESTDIR
# with its own PREFIX, must lay down a working criu-rocm and its man page.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/criu-rocm-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "install: FAIL: $*" >&2; exit 1; }

check_tree() {
	local root=$1 door=$2
	[ -x "$root/bin/criu-rocm" ] || fail "$door: no $root/bin/criu-rocm"
	[ -s "$root/share/man/man8/criu-rocm.8" ] || fail "$door: no man page under $root/share/man/man8"
	# Captured first: `| grep -q` under pipefail fails when grep quits before the writer.
	local version
	version=$("$root/bin/criu-rocm" --version) || fail "$door: installed criu-rocm --version failed"
	for line in '^Version: ' '^criu-rocm: ' '^criu-rocm GitID: '; do
		grep -q "$line" <<<"$version" || fail "$door: installed criu-rocm --version lacks '$line': $version"
	done
	cmp -s "$root/bin/criu-rocm" "$top/build/criu-rocm" || fail "$door: installed binary differs from build/criu-rocm"
	echo "install: $door: PASS"
}

make -s -C "$top" install DESTDIR="$work/make" PREFIX=/opt/criu-rocm >/dev/null
check_tree "$work/make/opt/criu-rocm" "make install"

meson setup "$work/meson-build" "$top" --prefix=/opt/criu-rocm >/dev/null
meson compile -C "$work/meson-build" >/dev/null
DESTDIR="$work/meson" meson install -C "$work/meson-build" --no-rebuild >/dev/null
check_tree "$work/meson/opt/criu-rocm" "meson install"
echo "install: 2 passed, 0 failed"
