#!/usr/bin/env bash
# Puts the pinned upstream CRIU tarball into the build cache and prints its path.
#
# Source: $CRIU_TARBALL if set (offline builds), else the distribution's source package named
# in criu/upstream.lock, fetched with apt-get through a private apt state directory
# (scripts/lib/apt-source.sh; the system's apt configuration is never changed). A tarball whose sha256 differs from the lock is refused.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=SCRIPTDIR/lib/apt-source.sh
. "$top/scripts/lib/apt-source.sh"
# shellcheck source=../criu/upstream.lock
. "$top/criu/upstream.lock"
cache=${CRIU_CACHE_DIR:-$top/build/cache}
dest=$cache/$CRIU_TARBALL_NAME

die() { echo "fetch-criu: $*" >&2; exit 1; }

verify() {
	local sum
	sum=$(sha256sum "$1" | cut -d' ' -f1)
	[ "$sum" = "$CRIU_TARBALL_SHA256" ] && return 0
	echo "fetch-criu: $1: sha256 $sum does not match the pinned $CRIU_TARBALL_SHA256 (criu/upstream.lock)" >&2
	return 1
}

mkdir -p "$cache"
rm -f "$dest".tmp.*

if [ -n "${CRIU_TARBALL:-}" ]; then
	[ -r "$CRIU_TARBALL" ] || die "CRIU_TARBALL=$CRIU_TARBALL: no such readable file"
	verify "$CRIU_TARBALL" || die "refusing CRIU_TARBALL=$CRIU_TARBALL"
	# Cached like a download, so later builds need neither the variable nor the network.
	if ! cmp -s "$CRIU_TARBALL" "$dest"; then
		cp "$CRIU_TARBALL" "$dest.tmp.$$" && mv "$dest.tmp.$$" "$dest"
	fi
	echo "$dest"
	exit 0
fi

if [ -f "$dest" ]; then
	if verify "$dest"; then
		echo "$dest"
		exit 0
	fi
	echo "fetch-criu: discarding the cached copy and fetching again" >&2
	rm -f "$dest"
fi

apt_dir=$cache/apt
echo "fetch-criu: fetching source package $CRIU_SOURCE_PACKAGE=$CRIU_SOURCE_VERSION" >&2
# Only the upstream tarball is needed; the packaging files may be missing on a mirror, so
# apt-get's exit status is not the verdict: the tarball and its checksum are.
rc=0
apt_source_download "$apt_dir" "trixie sid" "$CRIU_SOURCE_PACKAGE=$CRIU_SOURCE_VERSION" || rc=$?
case $rc in
2) die "no Debian archive found in the machine's apt sources; set CRIU_TARBALL=/path/to/$CRIU_TARBALL_NAME" ;;
3)
	sed 's/^/  /' "$apt_dir/update.log" >&2
	die "could not read the source package index for '$CRIU_SOURCE_PACKAGE' (no network or registry?); set CRIU_TARBALL=/path/to/$CRIU_TARBALL_NAME to build offline"
	;;
esac
got=$apt_dir/dl/$CRIU_TARBALL_NAME
if [ ! -s "$got" ]; then
	sed 's/^/  /' "$apt_dir/source.log" >&2
	die "could not get $CRIU_TARBALL_NAME from source package '$CRIU_SOURCE_PACKAGE' $CRIU_SOURCE_VERSION; set CRIU_TARBALL=/path/to/$CRIU_TARBALL_NAME to build offline"
fi
verify "$got" || die "the downloaded $CRIU_TARBALL_NAME is corrupt or not the pinned release"
mv "$got" "$dest"
rm -rf "$apt_dir"
echo "$dest"
