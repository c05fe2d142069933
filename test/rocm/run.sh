#!/usr/bin/env bash
# Debian's ROCm 5.2 userspace, unchanged, on kfd-emu under every profile (issue 11): the
# proof that the emulator is faithful enough for ROCm's own libraries and tools, not only
# for our client.
#
#   usage: test/rocm/run.sh [PROFILE...]      (as root; `make test-rocm` runs it)
#          test/rocm/run.sh --list
#   env:   CARGO_TARGET_DIR      where kfd-emu was built (default rust/target)
#          ROCM_TEST_TIMEOUT=S   seconds one program may take (default 300)
#
# It compiles test/rocm/hsakmt-test.c (libhsakmt) and test/rocm/hsa-test.c (ROCr) with the
# system cc against Debian's headers into build/rocm/, then for every profile runs inside
# `kfd-emu run --profile P`:
#   hsakmt-test  topology, clocks, memory, events and SDMA queues through libhsakmt, checked
#                against `kfd-emu topology --profile P` and the machine table below
#   hsa-test     ROCr: agents, pools, async copies host<->VRAM and GPU->GPU, every byte
#   rocminfo     every agent listed with the right ISA name and marketing name
#   drm-check    test/rocm/drm-check.sh PROFILE: libdrm/amdgpu on the render nodes
# Each (program, profile) prints PASS, FAIL with the reason and its log, or SKIP with the
# reason (never counted as passed). The last line is exactly "N passed, M failed", then
# ", K skipped" when something was skipped; the exit status is non-zero on any failure.
set -uo pipefail
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=$top/build/rocm
logs=$out/logs
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
kfd_emu=$target/kfd-emu
timeout_s=${ROCM_TEST_TIMEOUT:-300}
all_profiles=(mi100 mi100x2 mi210x4 mi250x8 mi300x8 rx9070xt)

# The machines the profiles describe, written down here independently of the emulator:
# CPU nodes, GPUs, the GPUs' ISA, VRAM per GPU, and each GPU's PCI device id and revision
# (the marketing name is what Debian's libdrm, /usr/share/libdrm/amdgpu.ids, calls that
# device and revision: libhsakmt asks libdrm through the render node).
declare -A cpus=([mi100]=1 [mi100x2]=1 [mi210x4]=2 [mi250x8]=4 [mi300x8]=2 [rx9070xt]=1)
declare -A gpus=([mi100]=1 [mi100x2]=2 [mi210x4]=4 [mi250x8]=8 [mi300x8]=8 [rx9070xt]=1)
declare -A gfx=([mi100]=gfx908 [mi100x2]=gfx908 [mi210x4]=gfx90a [mi250x8]=gfx90a [mi300x8]=gfx942 [rx9070xt]=gfx1201)
declare -A vram_gib=([mi100]=32 [mi100x2]=32 [mi210x4]=64 [mi250x8]=64 [mi300x8]=192 [rx9070xt]=16)
declare -A pci_id=([mi100]="738C,01" [mi100x2]="738C,01" [mi210x4]="740F,02" [mi250x8]="740C,01" [mi300x8]="74A1,00" [rx9070xt]="7550,C0")

# What ROCr 5.2 cannot do, by profile: its hsa-test and rocminfo rows count as skipped, with
# this reason (rocminfo still runs there, and must fail or list no GPU exactly this way).
declare -A rocr_limit=(
	[rx9070xt]="ROCr 5.2 has no gfx1201 (RDNA4) in its ISA registry (isa.cpp): GpuAgent's constructor (amd_gpu_agent.cpp:111) fails with \"The GPU node has an unrecognized id\" and ROCr creates no GPU agent; libhsakmt and libdrm run there"
	[mi300x8]="ROCr 5.2 cannot run on an MI300X machine: it asserts that a CPU node's memory fits in 1 TiB (amd_memory_region.cpp:153, GetPhysicalSize() <= GetVirtualSize(): a non-APU node's system region is sized to the 1 TiB GPU VM) and each of the 2 CPU nodes has 1152 GiB; past that it would ignore all 8 GPUs, as its ISA registry (isa.cpp) has no gfx942"
)
rocr_limit_sign="GetPhysicalSize() <= GetVirtualSize()' failed"

programs=(hsakmt-test hsa-test rocminfo drm-check)
PASSED=0 FAILED=0 SKIPPED=0

result() { # STATUS PROGRAM PROFILE [REASON]
	local st=$1 prog=$2 prof=$3 why=${4:-}
	case $st in
	PASS) PASSED=$((PASSED + 1)) ;;
	FAIL) FAILED=$((FAILED + 1)) ;;
	SKIP) SKIPPED=$((SKIPPED + 1)) ;;
	esac
	printf '%-4s  %-11s %-8s%s\n' "$st" "$prog" "$prof" "${why:+  $why}"
}

# The first FAIL lines of a program's log (or its last lines), as a reason.
reason_from() { # LOG RC
	local f
	f=$(grep -m 3 '^FAIL ' "$1" | sed 's/^FAIL //' | paste -sd ';' -)
	[ -n "$f" ] || f=$(grep -v '^ok ' "$1" | tail -n 3 | paste -sd ';' -)
	echo "exit $2: ${f:-no output}; log ${1#"$top"/}"
}

# The marketing name libdrm gives a device id and revision: its amdgpu.ids line, or
# "AMD Radeon Graphics" (amdgpu_get_marketing_name's answer) when the table has none.
marketing_name() { # DEVICE,REV
	local ids=/usr/share/libdrm/amdgpu.ids name
	name=$(awk -F',[ \t]*' -v d="${1%,*}" -v r="${1#*,}" '
		!/^#/ && NF >= 3 && toupper($1) == toupper(d) && toupper($2) == toupper(r) { print $3; exit }' "$ids")
	echo "${name:-AMD Radeon Graphics}"
}

emu() { # PROFILE LOG CMD... : runs CMD on an emulated host, output to LOG; returns its status
	local prof=$1 log=$2
	shift 2
	timeout --kill-after=10 "$timeout_s" "$kfd_emu" run --profile "$prof" -- "$@" >"$log" 2>&1
}

build() {
	local prog=$1 lib=$2 log=$logs/build-$1.log
	shift 2
	if cc -std=gnu11 -O2 -Wall -Wextra -Werror -o "$out/$prog" "$here/$prog.c" "$lib" "$@" >"$log" 2>&1; then
		return 0
	fi
	echo "build of $prog failed: $(head -n 3 "$log" | paste -sd ';' -) (log ${log#"$top"/})"
	return 1
}

# The topology the profile gives KFD's sysfs (what libhsakmt reads), once per profile.
topology() { # PROFILE
	[ -s "$out/$1.topology" ] || "$kfd_emu" topology --profile "$1" >"$out/$1.topology" 2>"$out/$1.topology.err"
}

# The GPU pairs (A B, node numbers) of the ring hsa-test copies along (every GPU to the next
# one in node order) that the topology links both ways, by io_links or p2p_links. With no
# p2p_links_count (kernels before 5.19) libhsakmt derives links between all GPUs itself.
linked_ring_pairs() { # TOPOLOGY
	awk '
		/^== nodes\/[0-9]+\/gpu_id ==$/ { split($2, a, "/"); getline; if ($1 != 0) gpu[a[2] + 0] = 1; if (a[2] + 0 > max) max = a[2] + 0; sec = ""; next }
		/^== nodes\/[0-9]+\/(io|p2p)_links\/[0-9]+\/properties ==$/ { split($2, a, "/"); from = a[2] + 0; sec = "link"; next }
		/^== / { sec = ""; next }
		$1 == "p2p_links_count" { p2p = 1 }
		sec == "link" && $1 == "node_to" { link[from "," $2] = 1 }
		END {
			for (i = 0; i <= max; i++) if (gpu[i]) g[n++] = i
			for (i = 0; n > 1 && i < n; i++) {
				x = g[i]; y = g[(i + 1) % n]
				if (!p2p || (link[x "," y] && link[y "," x])) print x, y
			}
		}' "$1"
}

run_hsakmt() {
	local p=$1
	local log=$logs/hsakmt-test-$p.log topo=$out/$p.topology rc=0 n sdma want_ids got_ids
	topology "$p" || {
		result FAIL hsakmt-test "$p" "kfd-emu topology --profile $p failed: $(head -n 2 "$topo.err")"
		return
	}
	# The gpu_ids `kfd-emu profiles` lists must be the topology's, in node order.
	want_ids=$("$kfd_emu" profiles | awk -v p="$p" '$1 == p { f = 1; next } f && /gpus:/ { for (i = 2; i <= NF; i++) { sub(/@.*/, "", $i); printf "%s ", $i } exit }')
	want_ids=$(for id in $want_ids; do printf '%d ' "$id"; done)
	got_ids=$(awk '/^== nodes\/[0-9]+\/gpu_id ==$/ { getline; if ($1 != 0) printf "%d ", $1 }' "$topo")
	if [ -z "$want_ids" ] || [ "$want_ids" != "$got_ids" ]; then
		result FAIL hsakmt-test "$p" "gpu_ids: kfd-emu profiles lists [$want_ids], its topology has [$got_ids]"
		return
	fi
	emu "$p" "$log" "$out/hsakmt-test" --topology "$topo" --cpus "${cpus[$p]}" --gpus "${gpus[$p]}" \
		--marketing "$(marketing_name "${pci_id[$p]}")" || rc=$?
	n=$(sed -n 's/^hsakmt-test: \([0-9]*\) checks passed, 0 failed$/\1/p' "$log")
	sdma=$(grep -c '^ok   node [0-9]*: SDMA GTT -> VRAM: .* verified$' "$log")
	if [ "$rc" != 0 ] || [ -z "$n" ]; then
		result FAIL hsakmt-test "$p" "$(reason_from "$log" "$rc")"
	elif [ "$sdma" != "${gpus[$p]}" ]; then
		result FAIL hsakmt-test "$p" "SDMA copies verified on $sdma of ${gpus[$p]} GPUs; log ${log#"$top"/}"
	else
		result PASS hsakmt-test "$p" "$n checks, SDMA on ${gpus[$p]} GPUs"
	fi
}

run_hsa() {
	local p=$1
	local log=$logs/hsa-test-$p.log rc=0 n h2h got want unlinked
	if [ -n "${rocr_limit[$p]:-}" ]; then
		result SKIP hsa-test "$p" "${rocr_limit[$p]}"
		return
	fi
	topology "$p" || {
		result FAIL hsa-test "$p" "kfd-emu topology --profile $p failed: $(head -n 2 "$out/$p.topology.err")"
		return
	}
	emu "$p" "$log" "$out/hsa-test" --cpus "${cpus[$p]}" --gpus "${gpus[$p]}" --gfx "${gfx[$p]}" \
		--vram $((vram_gib[$p] << 30)) --marketing "$(marketing_name "${pci_id[$p]}")" || rc=$?
	n=$(sed -n 's/^hsa-test: \([0-9]*\) checks passed, 0 failed$/\1/p' "$log")
	h2h=$(grep -c '^ok   host -> node [0-9]* -> host: all' "$log")
	# GPU -> GPU copies: exactly the ring pairs the topology links.
	got=$(sed -n 's/^ok   host -> node \([0-9]*\) -> node \([0-9]*\) -> host: all.*/\1 \2/p' "$log" | paste -sd, -)
	want=$(linked_ring_pairs "$out/$p.topology" | paste -sd, -)
	unlinked=$(grep -c '^note no peer access' "$log")
	if [ "$rc" != 0 ] || [ -z "$n" ]; then
		result FAIL hsa-test "$p" "$(reason_from "$log" "$rc")"
	elif [ "$h2h" != "${gpus[$p]}" ] || [ "$got" != "$want" ]; then
		result FAIL hsa-test "$p" "verified $h2h host round trips (want ${gpus[$p]}), GPU->GPU copies between [$got] (the topology links [$want]); log ${log#"$top"/}"
	else
		result PASS hsa-test "$p" "$n checks, $h2h host<->VRAM and $(linked_ring_pairs "$out/$p.topology" | wc -l) GPU->GPU copies verified${unlinked:+$([ "$unlinked" != 0 ] && echo ", $unlinked GPU pairs without an IO link not copied")}"
	fi
}

# rocminfo 5.2 first runs `lsmod | grep amdgpu` and exits 1 without output from it. This
# kernel has no /proc/modules (lsmod fails), and the GPUs are kfd-emu's, not the amdgpu
# module's; the emulator does not pretend modules exist. So rocminfo alone gets a stand-in
# lsmod first on PATH that says what it is.
make_lsmod() {
	mkdir -p "$out/bin"
	cat >"$out/bin/lsmod" <<'EOF'
#!/bin/sh
# Stand-in for lsmod, put first on PATH for rocminfo by test/rocm/run.sh: rocminfo 5.2
# requires `lsmod | grep amdgpu` to print something; this kernel has no /proc/modules and
# the GPUs are served by kfd-emu, not by the amdgpu module.
echo "Module                  Size  Used by"
echo "amdgpu                     0  0 (stand-in: GPUs served by kfd-emu, see test/rocm/run.sh)"
EOF
	chmod +x "$out/bin/lsmod"
}

run_rocminfo() {
	local p=$1
	local log=$logs/rocminfo-$p.log rc=0 mkt summary bad want_gpus=${gpus[$p]}
	# Where ROCr cannot use the GPUs, rocminfo still runs: it must list the CPU agents and
	# no GPU, which confirms the reason the row is skipped.
	[ -n "${rocr_limit[$p]:-}" ] && want_gpus=0
	emu "$p" "$log" env PATH="$out/bin:$PATH" rocminfo || rc=$?
	if [ "$want_gpus" = 0 ] && [ "$rc" = 134 ] && grep -qF "$rocr_limit_sign" "$log"; then
		result SKIP rocminfo "$p" "${rocr_limit[$p]} (confirmed: rocminfo aborts on that assertion)"
		return
	fi
	if [ "$rc" != 0 ]; then
		result FAIL rocminfo "$p" "$(reason_from "$log" "$rc")"
		return
	fi
	mkt=$(marketing_name "${pci_id[$p]}")
	# One line per agent: its type, name and marketing name (the first of each after the
	# "Agent N" header; the ISA and pool sections come later).
	summary=$(awk '
		/^Agent [0-9]+/ { if (n) print t "|" nm "|" mk; n++; t = nm = mk = ""; next }
		n && t == "" && /^  Device Type:/ { sub(/^  Device Type: */, ""); t = $0 }
		n && nm == "" && /^  Name:/ { sub(/^  Name: */, ""); nm = $0 }
		n && mk == "" && /^  Marketing Name:/ { sub(/^  Marketing Name: */, ""); mk = $0 }
		END { if (n) print t "|" nm "|" mk }' "$log" | sed 's/ *|/|/g; s/ *$//')
	bad=$(awk -F'|' -v g="${gfx[$p]}" -v m="$mkt" -v c="${cpus[$p]}" -v n="$want_gpus" '
		$1 == "CPU" { nc++ }
		$1 == "GPU" { ng++; if ($2 != g || $3 != m) { printf "%sGPU agent %d: %s \"%s\" (want %s \"%s\")", sep, ng, $2, $3, g, m; sep = "; " } }
		END { if (nc != c || ng != n) printf "%s%d CPU and %d GPU agents, want %d and %d", sep, nc, ng, c, n }' <<<"$summary")
	if [ -n "$bad" ]; then
		result FAIL rocminfo "$p" "$bad; log ${log#"$top"/}"
	elif [ "$want_gpus" = 0 ]; then
		result SKIP rocminfo "$p" "${rocr_limit[$p]} (confirmed: rocminfo lists the ${cpus[$p]} CPU agents and no GPU)"
	else
		result PASS rocminfo "$p" "${cpus[$p]} CPU + ${gpus[$p]} GPU agents: ${gfx[$p]} \"$mkt\" (stand-in lsmod)"
	fi
}

# Host overrides drm-check also runs on top of a profile: rx9070xt with its DMA rings
# refusing user submissions (amdgpu.disable_kq=1), where HW_IP_INFO(DMA) counts no ring.
declare -A drm_overrides=([rx9070xt]="rx9070xt+$top/test/gpu/hosts/rx9070xt-no-user-sdma.toml")

run_drm() {
	local p=$1
	local log=$logs/drm-check-$p.log rc=0 also=()
	if [ ! -x "$here/drm-check.sh" ]; then
		result FAIL drm-check "$p" "test/rocm/drm-check.sh is missing or not executable"
		return
	fi
	[ -z "${drm_overrides[$p]:-}" ] || also=("${drm_overrides[$p]}")
	CARGO_TARGET_DIR=${target%/release} "$here/drm-check.sh" "$p" "${also[@]}" >"$log" 2>&1 || rc=$?
	if [ "$rc" != 0 ]; then
		result FAIL drm-check "$p" "$(reason_from "$log" "$rc")"
	else
		result PASS drm-check "$p" "$(grep '^PASS' "$log" | sed 's/^PASS *//' | paste -sd ';' | sed 's/;/; /g')"
	fi
}

main() {
	local wanted=("$@") p prog c
	[ ${#wanted[@]} -gt 0 ] || wanted=("${all_profiles[@]}")
	for p in "${wanted[@]}"; do
		[ -n "${gpus[$p]:-}" ] || { echo "test/rocm/run.sh: unknown profile $p (${all_profiles[*]})" >&2; exit 2; }
	done
	[ "$(id -u)" = 0 ] || { echo "test/rocm/run.sh: needs root (kfd-emu mounts FUSE nodes in a private mount namespace)" >&2; exit 2; }
	for c in cc rocminfo timeout "$kfd_emu"; do
		command -v "$c" >/dev/null || { echo "test/rocm/run.sh: $c is missing (scripts/install-deps.sh; make kfd-tools)" >&2; exit 2; }
	done
	[ -r /usr/share/libdrm/amdgpu.ids ] || { echo "test/rocm/run.sh: /usr/share/libdrm/amdgpu.ids is missing (libdrm-common)" >&2; exit 2; }
	rm -rf "$out" && mkdir -p "$logs"

	declare -A broken=()
	build hsakmt-test -lhsakmt -lpthread >"$logs/build.err" || broken[hsakmt-test]=$(cat "$logs/build.err")
	build hsa-test -lhsa-runtime64 >"$logs/build.err" || broken[hsa-test]=$(cat "$logs/build.err")
	make_lsmod
	echo "ROCm userspace tests: profiles ${wanted[*]}; libhsakmt $(dpkg-query -W -f='${Version}' libhsakmt1 2>/dev/null)," \
		"ROCr $(dpkg-query -W -f='${Version}' libhsa-runtime64-1 2>/dev/null), rocminfo $(dpkg-query -W -f='${Version}' rocminfo 2>/dev/null); logs in ${logs#"$top"/}"
	echo "note: rocminfo runs with a stand-in lsmod first on PATH: it requires \`lsmod | grep amdgpu\`, and this kernel has no /proc/modules"

	for p in "${wanted[@]}"; do
		for prog in "${programs[@]}"; do
			if [ -n "${broken[$prog]:-}" ]; then
				result FAIL "$prog" "$p" "${broken[$prog]}"
				continue
			fi
			case $prog in
			hsakmt-test) run_hsakmt "$p" ;;
			hsa-test) run_hsa "$p" ;;
			rocminfo) run_rocminfo "$p" ;;
			drm-check) run_drm "$p" ;;
			esac
		done
	done
	if [ "$SKIPPED" != 0 ]; then
		echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
	else
		echo "$PASSED passed, $FAILED failed"
	fi
	[ "$FAILED" = 0 ]
}

case ${1:-} in
--list)
	for p in "${all_profiles[@]}"; do
		for prog in "${programs[@]}"; do
			case $prog in
			hsa-test) [ -n "${rocr_limit[$p]:-}" ] && { echo "$prog $p (skipped: ${rocr_limit[$p]})"; continue; } ;;
			rocminfo) [ -n "${rocr_limit[$p]:-}" ] && { echo "$prog $p (skipped once it lists no GPU: ${rocr_limit[$p]})"; continue; } ;;
			esac
			echo "$prog $p"
		done
	done
	;;
-h | --help)
	sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	;;
*)
	main "$@"
	;;
esac
