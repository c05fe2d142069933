#!/usr/bin/env bash
# The Debian packages of build/deb/ (make deb), installed on this machine with apt:
#   1. criu-rocm beside Debian's criu: both binaries there and working; criu-rocm's
#      version, check, and a dump and restore of an ordinary process tree
#      (test/smoke/run.sh) through the installed /usr/sbin/criu-rocm;
#   2. criu-rocm-as-criu: replaces Debian's criu; `criu` on PATH is criu-rocm and reports
#      CRIU's version numbers (--version and the VERSION RPC container engines gate on),
#      and dumps and restores;
#   3. purging both leaves nothing behind (every path dpkg -L listed is gone).
# In 1 and 2, crit as installed (criu-rocm-crit, then crit on PATH) shows the KFD image of a
# GPU process the installed criu-rocm dumped on kfd-emu (CARGO_TARGET_DIR: where kfd-emu
# and gpu-workload were built, rust/target by default).
# The machine is left as it was found: Debian's criu is reinstalled if it was installed,
# and purged again if the test installed it.
#
#   usage: test/package/run.sh     (as root; `make test-package` builds the packages first)
#   env:   PACKAGE_TEST_NO_DEBIAN_CRIU=1  do not install Debian's criu for step 1 (its
#          co-installation is then counted as skipped)
set -euo pipefail
export LC_ALL=C DEBIAN_FRONTEND=noninteractive

top=$(cd "$(dirname "$0")/../.." && pwd)
deb=$top/build/deb
# shellcheck source=SCRIPTDIR/../../criu/upstream.lock
. "$top/criu/upstream.lock"
work=$(mktemp -d /tmp/criu-rocm-package.XXXXXX)
passed=0 skipped=0 skips=()
criu_before=

fail() {
	echo "package: FAIL: $*" >&2
	echo "package: $passed passed, 1 failed (logs: $work)"
	exit 1
}
pass() { echo "package: $1: PASS"; passed=$((passed + 1)); }
skip() { echo "package: $1: SKIPPED: $2"; skipped=$((skipped + 1)); skips+=("$1"); }

# Another apt or dpkg on the machine (an unattended upgrade, a second test run) holds the
# lock for a while at most: wait for it rather than fail.
apt_get() { apt-get -o DPkg::Lock::Timeout=300 "$@"; }
status() { dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true; }
apt_do() {
	local log=$work/apt.log
	echo "+ apt-get $*" >>"$log"
	apt_get -y -q --no-install-recommends "$@" >>"$log" 2>&1 || {
		tail -n 15 "$log" >&2
		fail "apt-get $* failed (see $log)"
	}
}

# Leaves the machine as it was: our packages purged, Debian's criu back if it was there.
cleanup() {
	local p=()
	for x in criu-rocm-as-criu criu-rocm; do [ -n "$(status "$x")" ] && [ "$(status "$x")" != not-installed ] && p+=("$x"); done
	[ ${#p[@]} = 0 ] || apt_get -y -q purge "${p[@]}" >>"$work/apt.log" 2>&1 || true
	if [ -n "$criu_before" ] && [ "$(status criu)" != installed ]; then
		apt_get -y -q --no-install-recommends install "criu=$criu_before" >>"$work/apt.log" 2>&1 ||
			echo "package: could not reinstall Debian's criu $criu_before (see $work/apt.log)" >&2
	elif [ -z "$criu_before" ] && [ "$(status criu)" = installed ]; then
		apt_get -y -q purge criu >>"$work/apt.log" 2>&1 ||
			echo "package: could not purge Debian's criu, which this test installed (see $work/apt.log)" >&2
	fi
}

[ "$(id -u)" = 0 ] || { echo "test/package/run.sh: needs root (it installs packages)" >&2; exit 2; }
shopt -s nullglob
debs=("$deb"/criu-rocm_*.deb)
as_criu=("$deb"/criu-rocm-as-criu_*.deb)
if [ ${#debs[@]} != 1 ] || [ ${#as_criu[@]} != 1 ]; then
	echo "test/package/run.sh: expected one criu-rocm and one criu-rocm-as-criu .deb in $deb (make deb)" >&2
	exit 2
fi
shopt -u nullglob
for p in criu-rocm criu-rocm-as-criu; do
	case $(status "$p") in "" | not-installed) ;; *)
		echo "test/package/run.sh: $p is installed on this machine ($(status "$p")); purge it first: the test installs and purges it" >&2
		exit 2 ;;
	esac
done
[ "$(status criu)" = installed ] && criu_before=$(dpkg-query -W -f='${Version}' criu)
trap cleanup EXIT
trap 'fail "line $LINENO: a command failed (status $?)"' ERR

version=$(dpkg-deb -f "${debs[0]}" Version)
upstream=${version%-*}
echo "package: testing criu-rocm $version (${debs[0]#"$top"/}, ${as_criu[0]#"$top"/})"

# Every file and link a package installed (directories are shared with other packages).
owned() { dpkg -L "$1" | while read -r f; do if [ ! -d "$f" ] || [ -L "$f" ]; then echo "$f"; fi; done; }

# Asks `criu` on PATH for its version over the RPC (criu swrk), as libcriu and go-criu do;
# prints major.minor.sublevel and go-criu's number for it. $1: pycriu's directory.
rpc_version() {
	/usr/bin/python3 - "$1" <<-'EOF'
	import os, socket, sys
	sys.path.insert(0, sys.argv[1])
	from pycriu import rpc
	a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
	a.set_inheritable(True)
	pid = os.fork()
	if pid == 0:
	    os.dup2(os.open(os.devnull, os.O_RDWR), 1)
	    os.execvp("criu", ["criu", "swrk", str(a.fileno())])
	a.close()
	req = rpc.criu_req()
	req.type = rpc.VERSION
	b.send(req.SerializeToString())
	resp = rpc.criu_resp()
	resp.ParseFromString(b.recv(65536))
	b.close()
	os.waitpid(pid, 0)
	v = resp.version
	if not resp.success or resp.type != rpc.VERSION:
	    sys.exit(f"criu swrk answered {resp}")
	if v.HasField("gitid"):
	    sys.exit(f"the VERSION RPC carries gitid {v.gitid!r}")
	n = v.major_number * 10000 + v.minor_number * 100 + v.sublevel
	print(f"{v.major_number}.{v.minor_number}.{v.sublevel} ({n} for go-criu)")
	EOF
}

# A GPU process (gpu-workload on an emulated mi100) dumped by $1 into $work/gpu-img, once.
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
gpu_dump() {
	[ -d "$work/gpu-img" ] && return 0
	for c in "$target/kfd-emu" "$target/gpu-workload"; do
		[ -x "$c" ] || fail "$c is missing (make test-package builds it)"
	done
	mkdir -p "$work/gpu-img"
	# shellcheck disable=SC2016 # the script's own $1..$3
	"$target/kfd-emu" run --profile mi100 -- /bin/bash -c '
		setsid "$1" --mib 1 --bos 2 </dev/null >"$2/wl.out" 2>&1 &
		pid=$!
		for i in $(seq 600); do grep -q "\"ready\":true" "$2/wl.out" && break; sleep 0.05; done
		grep -q "\"ready\":true" "$2/wl.out" || { echo "gpu-workload did not get ready" >&2; exit 1; }
		"$3" dump -t "$pid" -D "$2/gpu-img" -o dump.log -v4' \
		_ "$target/gpu-workload" "$work" "$1" >"$work/gpu-dump.log" 2>&1 ||
		fail "GPU dump through $1 on kfd-emu failed: $(tail -n 3 "$work/gpu-dump.log" | paste -sd' ') (see $work/gpu-img/dump.log)"
}
# crit_shows CRIT: CRIT shows the dump's KFD image, naming its magic and the dumped pid.
crit_shows() {
	local out kfd pid
	kfd=$(ls "$work"/gpu-img/amdgpu-kfd-*.img) || fail "the GPU dump wrote no amdgpu-kfd-*.img"
	pid=$(grep -o '"ready":true,"pid":[0-9]*' "$work/wl.out" | grep -o '[0-9]*$')
	out=$("$1" show "$kfd" 2>&1) || fail "$1 show $(basename "$kfd"): $out"
	grep -q '"magic": "AMDGPU_KFD"' <<<"$out" || fail "$1 show does not name AMDGPU_KFD: $(head -c 300 <<<"$out")"
	grep -q "\"pid\": $pid," <<<"$out" || fail "$1 show does not show pid $pid: $(head -c 300 <<<"$out")"
}

# ---------------------------------------------------------------------------------------
# 1. criu-rocm beside Debian's criu.
with_criu=0
if [ "${PACKAGE_TEST_NO_DEBIAN_CRIU:-}" = 1 ]; then
	skip "co-installed with Debian's criu" "PACKAGE_TEST_NO_DEBIAN_CRIU=1"
elif [ -n "$criu_before" ]; then
	with_criu=1
else
	cand=$(apt-cache policy criu 2>/dev/null | sed -n 's/^ *Candidate: //p')
	if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
		apt_get update -qq >>"$work/apt.log" 2>&1 || true
		cand=$(apt-cache policy criu 2>/dev/null | sed -n 's/^ *Candidate: //p')
	fi
	if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
		skip "co-installed with Debian's criu" "apt knows no 'criu' package here (no archive reachable)"
	else
		with_criu=1
	fi
fi
if [ $with_criu = 1 ]; then
	apt_do install "${debs[0]}" criu
else
	apt_do install "${debs[0]}"
fi
[ "$(status criu-rocm)" = installed ] || fail "criu-rocm is not installed after apt-get install"
owned criu-rocm >"$work/criu-rocm.list"
for f in /usr/sbin/criu-rocm /usr/share/man/man8/criu-rocm.8.gz /usr/share/doc/criu-rocm/copyright \
	/usr/share/doc/criu-rocm/image-format.md.gz /usr/share/doc/criu-rocm/README.Debian \
	/usr/bin/criu-rocm-crit /usr/share/man/man1/criu-rocm-crit.1.gz /usr/lib/criu-rocm/python3/crit/__main__.py \
	/usr/lib/criu-rocm/python3/pycriu/images/criu_amdgpu_pb2.py; do
	grep -qx "$f" "$work/criu-rocm.list" || fail "criu-rocm does not ship $f: $(paste -sd' ' "$work/criu-rocm.list")"
done
[ -x /usr/sbin/criu-rocm ] || fail "/usr/sbin/criu-rocm is not executable"
# Captured first: `| grep -q` under pipefail fails when grep quits before the writer.
man=$(zcat /usr/share/man/man8/criu-rocm.8.gz) || fail "cannot read criu-rocm.8.gz"
grep -qF '.TH "CRIU\-ROCM" "8"' <<<"$man" || fail "criu-rocm.8.gz is not criu-rocm's man page"
grep -q '^/usr/sbin/criu$' "$work/criu-rocm.list" && fail "criu-rocm ships /usr/sbin/criu"
pass "criu-rocm installs /usr/sbin/criu-rocm, its man page and docs"

v=$(/usr/sbin/criu-rocm --version) || fail "criu-rocm --version failed"
for line in "Version: $CRIU_VERSION" "criu-rocm: $upstream"; do
	grep -qx "$line" <<<"$v" || fail "criu-rocm --version lacks '$line': $(paste -sd'|' <<<"$v")"
done
grep -q '^criu-rocm GitID: ' <<<"$v" || fail "criu-rocm --version has no GitID line: $(paste -sd'|' <<<"$v")"
out=$(cd / && /usr/sbin/criu-rocm check 2>&1) || fail "criu-rocm check failed: $out"
grep -qx "Looks good." <<<"$out" || fail "criu-rocm check did not say 'Looks good.': $out"
pass "criu-rocm --version ($(paste -sd' ' <<<"$v")) and check"

"$top/test/smoke/run.sh" /usr/sbin/criu-rocm >"$work/smoke-criu-rocm.log" 2>&1 ||
	{ tail -n 20 "$work/smoke-criu-rocm.log" >&2; fail "dump and restore through /usr/sbin/criu-rocm (see $work/smoke-criu-rocm.log)"; }
pass "dump and restore of a process tree through /usr/sbin/criu-rocm"

v=$(/usr/bin/criu-rocm-crit --version 2>&1) || fail "criu-rocm-crit --version: $v"
[ "$v" = "$CRIU_VERSION" ] || fail "criu-rocm-crit --version says $v, not $CRIU_VERSION"
gpu_dump /usr/sbin/criu-rocm
crit_shows /usr/bin/criu-rocm-crit
pass "criu-rocm-crit $v shows the KFD image of a GPU process /usr/sbin/criu-rocm dumped"

if [ $with_criu = 1 ]; then
	[ "$(status criu)" = installed ] || fail "Debian's criu is not installed beside criu-rocm"
	[ "$(dpkg -S /usr/sbin/criu | cut -d: -f1)" = criu ] || fail "/usr/sbin/criu does not belong to Debian's criu"
	dv=$(/usr/sbin/criu --version) || fail "Debian's criu --version failed"
	grep -q criu-rocm <<<"$dv" && fail "/usr/sbin/criu is criu-rocm, not Debian's criu: $dv"
	grep -q '^Version: ' <<<"$dv" || fail "Debian's criu --version: $dv"
	pass "co-installed with Debian's criu $(dpkg-query -W -f='${Version}' criu) ($(head -n1 <<<"$dv"))"
fi

# ---------------------------------------------------------------------------------------
# 2. criu-rocm-as-criu: criu-rocm becomes the criu on PATH.
apt_do install "${as_criu[0]}"
[ "$(status criu-rocm-as-criu)" = installed ] || fail "criu-rocm-as-criu is not installed"
if [ $with_criu = 1 ]; then
	[ "$(status criu)" = installed ] && fail "Debian's criu is still installed beside criu-rocm-as-criu"
fi
owned criu-rocm-as-criu >"$work/criu-rocm-as-criu.list"
[ "$(dpkg -S /usr/sbin/criu | cut -d: -f1)" = criu-rocm-as-criu ] || fail "/usr/sbin/criu does not belong to criu-rocm-as-criu"
[ "$(readlink -f /usr/sbin/criu)" = /usr/sbin/criu-rocm ] || fail "/usr/sbin/criu -> $(readlink -f /usr/sbin/criu), not criu-rocm"
man=$(zcat /usr/share/man/man8/criu.8.gz) || fail "cannot read criu.8.gz"
grep -q '^\.TH "CRIU" "8"' <<<"$man" || fail "criu.8.gz is not CRIU's criu(8)"
# What an engine started with Debian's default PATH finds.
std_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
criu_path=$(PATH=$std_path command -v criu) || fail "no criu on PATH ($std_path)"
[ "$criu_path" = /usr/sbin/criu ] || fail "criu on PATH ($std_path) is $criu_path, not /usr/sbin/criu"
pass "criu-rocm-as-criu replaces Debian's criu: /usr/sbin/criu -> criu-rocm, criu(8)"

v=$(PATH=$std_path criu --version) || fail "criu --version failed"
[ "$(head -n1 <<<"$v")" = "Version: $CRIU_VERSION" ] || fail "criu --version does not start with 'Version: $CRIU_VERSION': $v"
# go-criu and libcriu read the VERSION RPC; with a git id go-criu would round the version
# down to the next minor release.
grep -q '^GitID: ' <<<"$v" && fail "criu --version reports a CRIU GitID, which engines read as a development version: $v"
rpc=$(PATH=$std_path rpc_version "$top/build/criu-$CRIU_VERSION/lib" 2>&1) || fail "VERSION RPC: $rpc"
[ "$rpc" = "$CRIU_VERSION ($(IFS=. read -r a b c <<<"$CRIU_VERSION"; echo $((a * 10000 + b * 100 + c))) for go-criu)" ] ||
	fail "the VERSION RPC reports $rpc, not CRIU $CRIU_VERSION"
pass "criu --version and the VERSION RPC report CRIU $rpc"

crit_path=$(PATH=$std_path command -v crit) || fail "no crit on PATH ($std_path)"
[ "$(readlink -f "$crit_path")" = /usr/bin/criu-rocm-crit ] || fail "crit on PATH is $crit_path -> $(readlink -f "$crit_path"), not criu-rocm-crit"
crit_shows "$crit_path"
man=$(zcat /usr/share/man/man1/crit.1.gz) || fail "cannot read crit.1.gz"
grep -q '^\.TH "CRIT" "1"' <<<"$man" || fail "crit.1.gz is not CRIU's crit(1)"
pass "crit on PATH is criu-rocm-crit and shows the GPU dump's KFD image"

"$top/test/smoke/run.sh" "$criu_path" >"$work/smoke-criu.log" 2>&1 ||
	{ tail -n 20 "$work/smoke-criu.log" >&2; fail "dump and restore through criu on PATH (see $work/smoke-criu.log)"; }
pass "dump and restore of a process tree through criu on PATH"

# ---------------------------------------------------------------------------------------
# 3. Purged, nothing is left.
apt_do purge criu-rocm-as-criu criu-rocm
for p in criu-rocm criu-rocm-as-criu; do
	case $(status "$p") in "" | not-installed) ;; *) fail "$p is still known to dpkg as $(status "$p") after purge" ;; esac
done
left=$(cat "$work/criu-rocm.list" "$work/criu-rocm-as-criu.list" | while read -r f; do
	if [ -e "$f" ] || [ -L "$f" ]; then echo "$f"; fi
done)
[ -z "$left" ] || fail "left behind after purge: $(paste -sd' ' <<<"$left")"
for d in /usr/share/doc/criu-rocm /usr/share/doc/criu-rocm-as-criu; do
	[ -e "$d" ] && fail "$d is left behind after purge"
done
left=$(find /usr/sbin /usr/share/man/man8 -maxdepth 1 -name 'criu*' 2>/dev/null)
left+=$(find /usr/bin /usr/share/man/man1 -maxdepth 1 \( -name 'crit*' -o -name 'criu-rocm*' \) 2>/dev/null)
[ -z "$left" ] || fail "left behind in /usr/sbin, /usr/bin or the man pages after purge: $(paste -sd' ' <<<"$left")"
[ -e /usr/lib/criu-rocm ] && fail "/usr/lib/criu-rocm is left behind after purge: $(find /usr/lib/criu-rocm | head -n 5 | paste -sd' ')"
pass "purged: the $(cat "$work"/*.list | wc -l) files and links both packages installed are gone"

cleanup
[ -z "$criu_before" ] || [ "$(status criu)" = installed ] || fail "Debian's criu $criu_before could not be reinstalled"
trap - EXIT
rm -rf "$work"
echo "package: $passed passed, 0 failed${skips[*]:+, $skipped skipped: ${skips[*]}}"
