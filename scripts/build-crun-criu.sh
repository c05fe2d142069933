#!/usr/bin/env bash
# Builds crun with CRIU support from Debian's source package of the crun installed here,
# against the libcriu of criu-rocm's CRIU tree; `make crun-criu` runs it.
#
#   usage: scripts/build-crun-criu.sh OUT   (OUT/libcriu holds CRIU's `make install-lib`)
#
# Debian bookworm's crun is built without CRIU: crun compiles its checkpoint/restore in only
# when pkg-config finds `criu >= 3.15` at build time, and bookworm has no libcriu-dev. This
# fetches the source package (scripts/lib/apt-source.sh: a private apt state, the system's
# apt configuration untouched), unpacks it with Debian's patches, and runs its own
# debian/rules build with OUT/libcriu/lib/pkgconfig on PKG_CONFIG_PATH (criu.pc names
# include/criu; crun includes <criu/criu.h>, so include/ is added) and a run path to
# OUT/libcriu/lib, so that crun's dlopen("libcriu.so.2") finds that library without an
# LD_LIBRARY_PATH. libcriu is CRIU's RPC client: it runs `criu swrk` from PATH, so the crun
# built here checkpoints with whatever `criu` comes first on PATH (criu-rocm-as-criu, or a
# directory holding a `criu` link to criu-rocm). Result: OUT/bin/crun, whose --version
# lists +CRIU (checked). Build dependencies: scripts/install-deps.sh.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=SCRIPTDIR/lib/apt-source.sh
. "$top/scripts/lib/apt-source.sh"

die() { echo "build-crun-criu: $*" >&2; exit 1; }

[ $# = 1 ] || die "usage: $0 OUT"
out=$(realpath -m "$1")
lib=$out/libcriu/lib
if [ ! -f "$lib/pkgconfig/criu.pc" ] || [ ! -e "$lib/libcriu.so.2" ]; then
	die "$out/libcriu holds no libcriu (criu.pc, libcriu.so.2): run CRIU's make install-lib into it first (make crun-criu does)"
fi

version=$(dpkg-query -W -f='${Version}' crun 2>/dev/null) ||
	die "Debian's crun is not installed (scripts/install-deps.sh installs it): its source package is the one built here"

echo "build-crun-criu: crun $version from its Debian source package, against $(PKG_CONFIG_PATH=$lib/pkgconfig pkg-config --modversion criu) libcriu in $lib" >&2
rc=0
apt_source_download "$out/apt" "bookworm bookworm-updates" "crun=$version" || rc=$?
case $rc in
0) ;;
2) die "no Debian archive found in the machine's apt sources" ;;
3) sed 's/^/  /' "$out/apt/update.log" >&2; die "could not read the source package index (no network or registry?)" ;;
*) sed 's/^/  /' "$out/apt/source.log" >&2; die "could not download source package crun=$version" ;;
esac
dsc=$(ls "$out"/apt/dl/crun_*.dsc)
rm -rf "$out/src"
dpkg-source -x "$dsc" "$out/src" >"$out/dpkg-source.log" 2>&1 ||
	{ tail -n 20 "$out/dpkg-source.log" >&2; die "dpkg-source -x $dsc failed"; }

# Debian's own build steps (autoreconf, configure with the distribution's flags, the
# generated sources), without its test run and documentation.
(cd "$out/src" &&
	PKG_CONFIG_PATH=$lib/pkgconfig DEB_LDFLAGS_MAINT_APPEND="-Wl,-rpath,$lib" \
		DEB_CPPFLAGS_MAINT_APPEND="-I$out/libcriu/include" \
		DEB_BUILD_OPTIONS="nocheck nodoc parallel=${JOBS:-2}" debian/rules build) >"$out/build.log" 2>&1 ||
	{ tail -n 40 "$out/build.log" >&2; die "debian/rules build failed (log: $out/build.log)"; }

grep -q '^#define HAVE_CRIU 1' "$out/src/config.h" ||
	die "configure did not find criu >= 3.15 through $lib/pkgconfig (log: $out/build.log)"
mkdir -p "$out/bin"
cp "$out/src/crun" "$out/bin/crun.tmp" && mv "$out/bin/crun.tmp" "$out/bin/crun"
features=$("$out/bin/crun" --version | sed -n '/^+/p')
case $features in
*+CRIU*) ;;
*) die "$out/bin/crun --version lists no +CRIU: $features" ;;
esac
rm -rf "$out/apt"
echo "$out/bin/crun"
