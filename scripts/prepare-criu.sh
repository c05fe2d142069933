#!/usr/bin/env bash
# Makes DEST a pristine extraction of TARBALL with criu-rocm's patch series applied and our
# own C files copied in. Work happens in a scratch directory that replaces DEST only when
# every patch applied, so an interrupted or failed run never leaves a half-patched tree.
# Patches must apply exactly (--fuzz=0): on a newer CRIU a hunk placed by guesswork is worse
# than a build that stops and names the patch to refresh.
#   usage: prepare-criu.sh TARBALL DEST [--no-patches]
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
tarball=$1
dest=$2
mode=${3:-}

scratch=$dest.tmp.$$
trap 'rm -rf "$scratch"' EXIT
rm -rf "$scratch"
mkdir -p "$scratch"
tar -xf "$tarball" -C "$scratch" --strip-components=1

if [ "$mode" != "--no-patches" ]; then
	while read -r p; do
		case "$p" in '' | '#'*) continue ;; esac
		if [ ! -f "$top/criu/patches/$p" ]; then
			echo "prepare-criu: criu/patches/series names $p, which does not exist" >&2
			exit 1
		fi
		if ! out=$(patch -d "$scratch" -p1 --forward --batch --fuzz=0 --no-backup-if-mismatch <"$top/criu/patches/$p" 2>&1); then
			echo "$out" | sed 's/^/  /' >&2
			echo "prepare-criu: patch criu/patches/$p does not apply to $(basename "$tarball")" >&2
			exit 1
		fi
	done <"$top/criu/patches/series"
	cp "$top"/criu/*.c "$scratch/criu/"
	cp "$top"/criu/pie/*.c "$scratch/criu/pie/"
	cp "$top"/criu/include/*.h "$scratch/criu/include/"
	# The GPU image messages, for pycriu and crit (compiled there by patch 0013).
	cp "$top/proto/criu-amdgpu.proto" "$scratch/lib/pycriu/images/"
	# Our zdtm tests (GPU), listed in zdtm/static's Makefile by patch 0010.
	cp "$top"/test/zdtm/static/* "$scratch/test/zdtm/static/"
fi

rm -rf "$dest"
mv "$scratch" "$dest"
trap - EXIT
