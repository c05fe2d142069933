#!/usr/bin/env bash
# `make deb`: builds criu-rocm's Debian packages into build/deb/ and lints them.
#
# The packaging lives in packaging/debian, not in a top-level debian/: a distribution that
# packages criu-rocm brings its own debian/, and an upstream one at the top would be in its
# way. This script assembles a scratch source tree, build/deb/criu-rocm-<version>/, from
# the checkout's files (tracked and new, as they are in the working tree, so local edits
# are packaged), packaging/debian as debian/, CRIU's pinned tarball in build/cache/ and the
# git revision in .gitrev; then dpkg-buildpackage builds the binary packages there, from
# source, offline (debian/rules), and lintian must find nothing (errors, warnings or info;
# debian/*.lintian-overrides say why for what is overridden).
#
#   env: JOBS=N                  parallel jobs (default 2)
#        DEB_CARGO_TARGET=DIR    cargo's target directory, kept across package builds so
#                                the crates compile once (default build/deb/cargo-target;
#                                empty: the scratch tree's own, a build from nothing)
#        CRIU_TARBALL=PATH       the pinned CRIU tarball (else the cache, else fetched)
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/build/deb
jobs=${JOBS:-2}
cargo_target=${DEB_CARGO_TARGET-$out/cargo-target}

die() { echo "build-deb: $*" >&2; exit 1; }

for c in dpkg-buildpackage dpkg-parsechangelog dh lintian; do
	command -v "$c" >/dev/null || die "$c is missing (scripts/install-deps.sh installs it)"
done

version=$(dpkg-parsechangelog -l "$top/packaging/debian/changelog" -S Version)
upstream=${version%-*}
src=$out/criu-rocm-$upstream

# The package build is offline: every crate Cargo.lock names must be in cargo's cache
# already (scripts/install-deps.sh fetches them).
(cd "$top/rust" && ${CARGO:-cargo} fetch --locked --offline >/dev/null 2>&1) ||
	die "cargo's registry cache lacks crates of rust/Cargo.lock; run scripts/install-deps.sh (it fetches them)"
tarball=$("$top/scripts/fetch-criu.sh")

mkdir -p "$out"
rm -rf "$src" "$out"/criu-rocm*_*.deb "$out"/criu-rocm_*.changes "$out"/criu-rocm_*.buildinfo
mkdir -p "$src/build/cache"
if git -C "$top" rev-parse --show-toplevel >/dev/null 2>&1; then
	# Tracked and new files as they are now; deleted ones are skipped (--ignore-failed-read
	# would hide other errors, so list only what exists).
	(cd "$top" && git ls-files -z --cached --others --exclude-standard |
		while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
		tar --null -T - -cf -) | tar -xf - -C "$src"
	git -C "$top" describe --always --dirty >"$src/.gitrev"
else
	(cd "$top" && tar --exclude=./build --exclude=./rust/target -cf - .) | tar -xf - -C "$src"
fi
rm -rf "$src/debian"
cp -a "$top/packaging/debian" "$src/debian"
cp "$tarball" "$src/build/cache/"

log=$out/build.log
echo "build-deb: building criu-rocm $version in $src (log: $log)"
t0=$(date +%s)
# dpkg-buildpackage -b: the binary packages, built from source; a source package would
# need an orig tarball of the checkout, which nobody consumes here.
# Nothing of a calling make (its flags, variables, jobserver) reaches the package build.
if ! (cd "$src" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES \
	${cargo_target:+CRIU_ROCM_CARGO_TARGET_DIR="$cargo_target"} \
	DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
	dpkg-buildpackage -b -us -uc) >"$log" 2>&1; then
	tail -n 40 "$log" >&2
	die "dpkg-buildpackage failed after $(($(date +%s) - t0)) s (log: $log)"
fi
secs=$(($(date +%s) - t0))

changes=$out/criu-rocm_${version}_$(dpkg-architecture -qDEB_HOST_ARCH).changes
[ -f "$changes" ] || die "no $changes after the build"
# Info tags too: the packages must be clean, or say in an override why not. One override
# may go unused: the "thIk" spelling error is four bytes of zstd's machine code that only
# some code layouts produce (debian/criu-rocm.lintian-overrides), so lintian's own verdict
# is taken without that one line of it.
lintian --fail-on none --info --display-info "$changes" >"$out/lintian.log" 2>&1 ||
	{ cat "$out/lintian.log" >&2; die "lintian could not check the packages ($out/lintian.log)"; }
if grep -E '^[EWIXOP]: ' "$out/lintian.log" |
	grep -vE '^I: criu-rocm: unused-override spelling-error-in-binary thIk think \[usr/sbin/criu-rocm\]' |
	grep -q .; then
	cat "$out/lintian.log" >&2
	die "lintian found problems in the packages (above; $out/lintian.log)"
fi
rm -rf "$src"
echo "build-deb: built in $secs s, lintian clean:"
for f in "$out"/*.deb; do echo "  build/deb/${f##*/}"; done
