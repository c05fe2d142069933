#!/usr/bin/env bash
# Installs what building and testing criu-rocm needs on Debian bookworm, as root.
# Idempotent and quiet: nothing is installed (and apt is not even updated) when all is present.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)

# CRIU's build (protobuf, netlink, libnet, capabilities, nftables, gnutls, bsd), zdtm's runner
# (Debian's python3 with protobuf and yaml, iproute2, iptables), the Rust side (libclang for
# bindgen, libdrm headers, protoc for prost), meson/ninja (packager door), the man page, the
# tools the tests use (libxxhash0: test/integrity's XXH3 digests; llvm-15: llvm-mc-15, which
# checks the gfx9 crate's opcode tables in cargo test), Debian's ROCm 5.2
# userspace that test-rocm runs unchanged on the emulator (libhsakmt, ROCr and their
# headers, rocminfo), what `make deb` builds and checks the Debian packages with
# (dpkg-dev, debhelper, lintian), and the container engines test-containers runs GPU
# containers under, with busybox for their rootfs (runc, crun, podman, docker.io,
# containerd, busybox-static, and zstd for podman's checkpoint archives). Installing
# docker.io and containerd starts no daemon where there is no init system; where there is
# one, the test's own dockerd and containerd keep apart from the system's. The build
# dependencies of Debian's crun source package, which `make crun-criu` builds with CRIU
# (scripts/build-crun-criu.sh), complete the list. debootstrap
# builds the Debian sid chroot with ROCm 6.4 that test-rocm64 runs (test/rocm64/chroot.sh).
packages=(
	build-essential pkg-config git xz-utils patch
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	libnl-3-dev libnl-route-3-dev libnet1-dev libcap-dev libbsd-dev libaio-dev libgnutls28-dev
	libnftables-dev uuid-dev
	python3 python3-protobuf python3-yaml python3-future
	iproute2 iptables kmod procps psmisc
	libclang-dev clang libdrm-dev
	meson ninja-build asciidoctor shellcheck libxxhash0 openssl
	libhsakmt-dev libhsa-runtime-dev rocminfo llvm-15
	# Debian's HIP 5.2: test/hip's programs, gfx9's coverage test (hipcc brings clang-15),
	# and the ROCm libraries test/hip's rocrand and rocsparse programs call
	hipcc libamdhip64-dev librocrand-dev librocsparse-dev
	dpkg-dev debhelper lintian
	runc crun podman docker.io containerd busybox-static zstd
	gperf go-md2man libseccomp-dev libsystemd-dev libyajl-dev
	golang-github-opencontainers-image-spec-dev golang-github-opencontainers-specs-dev
	debootstrap
)

missing=()
for p in "${packages[@]}"; do
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get update -qq >/tmp/criu-rocm-apt.log 2>&1 ||
		! apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/criu-rocm-apt.log 2>&1; then
		tail -n 20 /tmp/criu-rocm-apt.log >&2
		echo "install-deps: could not install: ${missing[*]} (see /tmp/criu-rocm-apt.log)" >&2
		exit 1
	fi
fi

# The pinned Rust toolchain with rustfmt and clippy (rust/rust-toolchain.toml).
if ! command -v rustup >/dev/null 2>&1 && ! command -v cargo >/dev/null 2>&1; then
	echo "install-deps: no Rust toolchain (cargo/rustup) on PATH" >&2
	exit 1
fi
if command -v rustup >/dev/null 2>&1; then
	chan=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' "$top/rust/rust-toolchain.toml")
	# Listings are captured before grep: `| grep -q` under pipefail can fail on SIGPIPE.
	toolchains=$(rustup toolchain list)
	if ! grep -q "^$chan" <<<"$toolchains"; then
		echo "install-deps: installing Rust $chan"
		rustup toolchain install "$chan" --profile minimal -c rustfmt -c clippy >/dev/null
	fi
	for c in rustfmt clippy; do
		components=$(rustup component list --toolchain "$chan" --installed 2>/dev/null || true)
		if ! grep -q "^$c" <<<"$components"; then
			echo "install-deps: adding Rust component $c"
			rustup component add --toolchain "$chan" "$c" >/dev/null
		fi
	done
fi

# The crates rust/Cargo.lock pins, into cargo's registry cache, so that builds that must
# not reach the network (`make deb`'s package build runs cargo offline) find them all.
if ! (cd "$top/rust" && cargo fetch --locked --offline >/dev/null 2>&1); then
	echo "install-deps: fetching the Rust crates of rust/Cargo.lock"
	(cd "$top/rust" && cargo fetch --locked -q) || { echo "install-deps: cargo fetch failed" >&2; exit 1; }
fi

# zdtm imports these from Debian's interpreter; check them rather than trusting the packages.
if ! /usr/bin/python3 -c 'import google.protobuf, yaml' 2>/dev/null; then
	echo "install-deps: /usr/bin/python3 lacks protobuf or yaml even after installing python3-protobuf python3-yaml" >&2
	exit 1
fi
