#!/usr/bin/env bash
# Debian sid's ROCm 6.4 userspace in a chroot, for the ROCm 6.4 tests (issue 30): made once,
# kept in build/rocm64/sid and reused while its package list is the one below; extended in
# place when the list only grew (the new packages installed), rebuilt when it is missing,
# unfinished or lost a package.
#
#   usage: test/rocm64/chroot.sh            prints the chroot's path (as root)
#   env:   ROCM64_CHROOT=DIR   where the chroot lives (default build/rocm64/sid)
#          ROCM64_MIRROR=URL   the Debian archive to take sid from (default: the first Debian
#                              archive of the host's apt sources, /etc/apt/sources.list*)
#   exit:  0 ready; 77 the archive cannot be reached (the reason on stderr: callers count
#          their cases as skipped with it); 1 anything else (the log is named).
#
# The archive is the host's: no registry is named here. Its sid may be a snapshot whose
# Release is past Valid-Until, hence Acquire::Check-Valid-Until=false. A cold build takes
# a few minutes of downloads and 1.1 GB; a warm one is the stamp check.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
root=${ROCM64_CHROOT:-$top/build/rocm64/sid}
log=$(dirname "$root")/chroot-build.log
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

# What the cases use, no more (every fresh clone builds this): ROCr 6.4 (libhsakmt inside),
# rocminfo 7.2, HIP 6.4 with hipcc (clang and LLVM 21, whose llvm-mc also checks rust/gfx9's
# gfx942 tables; about 600 MB), and what the test programs are built with inside the chroot
# (gcc, libc and ROCr's headers), and rocm-smi 6.4 (librocm-smi64 and its Python script: 0.5 MB
# to fetch, 2.6 MB installed; the python3 it needs comes with rocminfo), with procps (rocm-smi
# --showpids names a process by `ps -p PID -o comm=`).
packages=(libhsa-runtime64-1 libhsa-runtime-dev rocminfo gcc libc6-dev hipcc libamdhip64-dev rocm-smi procps)
stamp_prefix="criu-rocm rocm64 chroot: "
stamp_text="$stamp_prefix${packages[*]}"

# The first Debian archive (a URI ending in /debian) of the host's apt sources, in either
# the one-line or the deb822 format.
host_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		case $f in
		*.sources) sed -n 's/^URIs:[[:space:]]*//p' "$f" | tr ' ' '\n' ;;
		*) sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f" ;;
		esac
	done | grep -m 1 '/debian/\?$' || true
}

die() { echo "rocm64 chroot: $*" >&2; exit 1; }
unreachable() { echo "rocm64 chroot: $*" >&2; exit 77; }

ready() { [ -f "$root/.criu-rocm-stamp" ] && [ "$(cat "$root/.criu-rocm-stamp")" = "$stamp_text" ]; }

# The packages of the list a finished chroot lacks, when every package it has is still
# listed (it can be extended in place); fails when there is no finished chroot or it has one
# the list dropped.
missing_packages() {
	local had p
	[ -f "$root/.criu-rocm-stamp" ] || return 1
	had=$(cat "$root/.criu-rocm-stamp")
	[ "${had#"$stamp_prefix"}" != "$had" ] || return 1
	for p in ${had#"$stamp_prefix"}; do
		[[ " ${packages[*]} " == *" $p "* ]] || return 1
	done
	for p in "${packages[@]}"; do
		[[ " ${had#"$stamp_prefix"} " == *" $p "* ]] || echo "$p"
	done
}

# Runs a command inside the chroot with /proc mounted, in a mount namespace of its own so
# nothing stays mounted when it ends.
in_chroot() { # DIR CMD...
	local dir=$1
	shift
	# shellcheck disable=SC2016 # expanded by the inner shell
	unshare -m sh -c 'mount -t proc proc "$1/proc" && shift && exec chroot "$@"' sh "$dir" "$dir" "$@"
}

build() { # MIRROR
	local mirror=$1 tmp=$root.tmp
	rm -rf "$tmp"
	mkdir -p "$(dirname "$root")"
	echo "rocm64 chroot: building Debian sid with ROCm 6.4 in $root from $mirror (log ${log#"$top"/})" >&2
	debootstrap --variant=minbase --keyring="$keyring" sid "$tmp" "$mirror" >"$log" 2>&1 ||
		die "debootstrap of sid from $mirror failed (log $log)"
	echo 'Acquire::Check-Valid-Until "false";' >"$tmp/etc/apt/apt.conf.d/99criu-rocm-snapshot"
	DEBIAN_FRONTEND=noninteractive in_chroot "$tmp" apt-get -q update >>"$log" 2>&1 ||
		die "apt-get update in the chroot failed (log $log)"
	DEBIAN_FRONTEND=noninteractive in_chroot "$tmp" apt-get -q install -y --no-install-recommends \
		"${packages[@]}" >>"$log" 2>&1 || die "apt-get install ${packages[*]} failed (log $log)"
	in_chroot "$tmp" apt-get clean >>"$log" 2>&1
	echo "$stamp_text" >"$tmp/.criu-rocm-stamp"
	rm -rf "$root"
	mv "$tmp" "$root"
}

extend() { # PACKAGE...
	echo "rocm64 chroot: installing $* into $root (log ${log#"$top"/})" >&2
	DEBIAN_FRONTEND=noninteractive in_chroot "$root" apt-get -q update >>"$log" 2>&1 ||
		die "apt-get update in the chroot failed (log $log)"
	DEBIAN_FRONTEND=noninteractive in_chroot "$root" apt-get -q install -y --no-install-recommends \
		"$@" >>"$log" 2>&1 || die "apt-get install $* failed (log $log)"
	in_chroot "$root" apt-get clean >>"$log" 2>&1
	echo "$stamp_text" >"$root/.criu-rocm-stamp"
}

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot)"
if ! ready; then
	mirror=${ROCM64_MIRROR:-$(host_mirror)}
	[ -n "$mirror" ] || unreachable "no Debian archive in the host's apt sources (/etc/apt/sources.list*) and ROCM64_MIRROR is unset"
	mirror=${mirror%/}
	wget -q -T 20 -t 2 -O /dev/null "$mirror/dists/sid/Release" ||
		unreachable "the Debian archive $mirror cannot be reached ($mirror/dists/sid/Release: wget exit $?)"
	if add=$(missing_packages); then
		# shellcheck disable=SC2086 # package names are words
		extend $add
	else
		command -v debootstrap >/dev/null || die "debootstrap is not installed (scripts/install-deps.sh installs it)"
		build "$mirror"
	fi
fi
echo "$root"
