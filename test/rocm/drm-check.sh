#!/usr/bin/env bash
# libdrm's amdgpu layer on kfd-emu's render nodes (issue #11). For every profile, builds
# drm-probe.c against the installed libdrm_amdgpu and runs it inside `kfd-emu run`:
# amdgpu_device_initialize, the AMDGPU_INFO queries, the firmware, IP and memory answers
# (checked against the KFD topology) and the marketing name ROCm shows, on every render
# node.
#
#   usage: test/rocm/drm-check.sh [PROFILE[+OVERRIDE]...]    (as root; default: every built-in
#          profile, then rx9070xt+test/gpu/hosts/rx9070xt-no-user-sdma.toml, whose DMA rings
#          take no user submissions)
#   env:   CARGO_TARGET_DIR  where kfd-emu was built (default rust/target); KFD_EMU names
#                            the binary itself
#          AMDGPU_IDS        libdrm's marketing-name table (/usr/share/libdrm/amdgpu.ids)
#
# The expected marketing name of a GPU is the profile's marketing_name when amdgpu.ids
# lists the GPU's device id and PCI revision (under that name: a profile naming it
# otherwise fails), and libdrm's fallback "AMD Radeon Graphics" when the table does not
# know the GPU (Debian's libdrm 2.4.114 predates the MI300X), which is then noted.
#
# Prints PASS or FAIL (with the reason) per profile, then exactly "N passed, M failed";
# the exit status is non-zero on any failure.
set -uo pipefail
export LC_ALL=C

self=$(realpath "$0")
here=$(dirname "$self")
top=$(cd "$here/../.." && pwd)
ids=${AMDGPU_IDS:-/usr/share/libdrm/amdgpu.ids}
fallback="AMD Radeon Graphics"

# The marketing name libdrm gives device id $1, PCI revision $2 (decimal), or nothing when
# the table has no such line: libdrm takes the first line whose id and revision match, and
# the third comma-separated field of it less leading blanks.
ids_name() {
	local did rev
	did=$(printf '%04X' "$1")
	rev=$(printf '%02X' "$2")
	grep -i -m1 "^${did},[[:blank:]]*${rev}," "$ids" | cut -d, -f3 | sed 's/^[[:blank:]]*//'
}

# Inside `kfd-emu run`: derives each GPU's expectation from the resolved profile and runs
# the probe ($1) with them. Output: the probe's lines, notes, and on failure the reason.
inside() {
	local probe=$1 prof="$KFD_EMU_STATE_DIR/profile.toml" args=() n=0 bad=0
	local minor did rev dma name want table err
	[ -r "$prof" ] || { echo "FAIL: no resolved profile at $prof"; return 1; }
	while IFS=$'\t' read -r minor did rev dma name; do
		n=$((n + 1))
		table=$(ids_name "$did" "$rev")
		if [ -z "$table" ]; then
			want=$fallback
			printf 'note: %04x rev %02x is not in %s: libdrm names it "%s"\n' \
				"$did" "$rev" "$ids" "$fallback"
		elif [ "$table" != "$name" ]; then
			printf 'FAIL: renderD%s: the profile says "%s", %s says "%s"\n' \
				"$minor" "$name" "$ids" "$table"
			bad=1
			want=$table
		else
			want=$name
		fi
		args+=("$minor:$rev:$dma:$want")
	done < <(awk '
		/^\[\[gpus\]\]$/ { if (g) out(); g = 1; minor = did = rev = name = ""; rev = 0; dma = 1; next }
		/^\[/ { if (g) out(); g = 0; next }
		g && /^drm_render_minor = / { minor = $3 }
		g && /^device_id = / { did = $3 }
		g && /^pci_revision = / { rev = $3 }
		g && /^dma_user_submission = false/ { dma = 0 }
		g && /^marketing_name = / { name = $0; sub(/^[^"]*"/, "", name); sub(/"[^"]*$/, "", name) }
		function out() { printf "%s\t%s\t%s\t%s\t%s\n", minor, did, rev, dma, name }
		END { if (g) out() }' "$prof")
	[ "$n" -gt 0 ] || { echo "FAIL: the profile has no GPU"; return 1; }
	err=$(mktemp)
	"$probe" "${args[@]}" 2>"$err" || bad=1
	if [ -s "$err" ]; then
		echo "FAIL: stderr of the probe (libdrm):"
		sed 's/^/  /' "$err"
		bad=1
	fi
	rm -f "$err"
	return "$bad"
}

if [ "${1:-}" = __in ]; then
	shift
	inside "$@"
	exit
fi

[ "$(id -u)" = 0 ] || { echo "drm-check.sh: needs root (kfd-emu mounts FUSE nodes)" >&2; exit 2; }
KFD_EMU=${KFD_EMU:-${CARGO_TARGET_DIR:-$top/rust/target}/release/kfd-emu}
[ -x "$KFD_EMU" ] || { echo "drm-check.sh: no $KFD_EMU (cargo build --release -p kfd-emu)" >&2; exit 2; }
[ -r "$ids" ] || { echo "drm-check.sh: no $ids (libdrm-common)" >&2; exit 2; }

work=$(mktemp -d /tmp/drm-check.XXXXXX)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2046 # pkg-config prints several words on purpose
if ! cc -std=gnu11 -Wall -Wextra -Werror -O2 -o "$work/drm-probe" "$here/drm-probe.c" \
	$(pkg-config --cflags --libs libdrm_amdgpu libdrm) 2>"$work/cc.log"; then
	echo "FAIL: drm-probe.c does not build:"
	sed 's/^/  /' "$work/cc.log"
	echo "0 passed, 1 failed"
	exit 1
fi

profiles=("$@")
if [ ${#profiles[@]} = 0 ]; then
	mapfile -t profiles < <("$KFD_EMU" profiles | awk '/^[^[:space:]]/ { print $1 }')
	profiles+=("rx9070xt+$top/test/gpu/hosts/rx9070xt-no-user-sdma.toml")
fi
pass=0 failn=0
for p in "${profiles[@]}"; do
	run=(--profile "${p%%+*}")
	if [ "$p" != "${p%%+*}" ]; then
		run+=(--profile-file "${p#*+}")
		p="${p%%+*}+$(basename "${p#*+}" .toml)"
	fi
	log=$work/$p.log
	if timeout 120 "$KFD_EMU" run "${run[@]}" -- "$self" __in "$work/drm-probe" >"$log" 2>&1; then
		echo "PASS drm $p ($(grep -c '^ok ' "$log") render nodes)"
		grep '^note:' "$log" | sort -u | sed 's/^/  /'
		pass=$((pass + 1))
	else
		echo "FAIL drm $p:"
		grep -v '^ok ' "$log" | sed 's/^/  /'
		failn=$((failn + 1))
	fi
done
echo "$pass passed, $failn failed"
[ "$failn" = 0 ]
