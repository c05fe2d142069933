#!/usr/bin/env bash
# End-to-end tests of criu-rocm's AMD GPU checkpoint/restore on kfd-emu (issues #4 and #5):
# dumps and their images, faults during a dump, restores on the same and on other
# (emulated) hosts, incompatible hosts, damaged images, faults during a restore, and
# gpu-check's verdicts. The processes under test are gpu-workload's; they check their own
# GPU memory, SDMA counters, events and new allocations after every step.
#
#   usage: test/gpu/run.sh CRIU_BINARY [CASE...]      (as root; `make test-gpu` runs it)
#          test/gpu/run.sh --list
#   env:   GPU_TEST_TIMEOUT=S   seconds one case may take (default 150)
#          GPU_TEST_KEEP=1      keep the work directory even when everything passed
#          CARGO_TARGET_DIR     where kfd-emu and gpu-workload were built (rust/target)
#          CRIT                 crit with the GPU image support (default build/crit; make crit)
#
# Each case is a function `case_NAME` below; it prints PASS, FAIL (with the reason and
# where its logs are), XFAIL or XPASS. A case marked with a known bug (`known_bug`, with
# the failure that bug causes) that fails that way is an XFAIL and counts as passed;
# failing otherwise is a FAIL. Passing is an XPASS, also counted as passed (the bug may
# only show in some runs), with a reminder to drop the mark once the bug is fixed. The last
# line is exactly "N passed, M failed"; the exit status is non-zero on any failure.
#
# Everything runs in a pid namespace of its own whose init is this script: pids the dumps
# recorded stay free for the restores, nothing outlives the run, and the processes CRIU
# kills are reaped (this machine's pid 1 does not reap orphans). A case runs its steps
# inside one or more `kfd-emu run` instances (each an emulated host with its own device
# state) by running this script again as their command, see `on` below.
set -uo pipefail
export LC_ALL=C

top=$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)
# fail, note, skip, known_bug, on, cases_dispatch; alive, wait_gone, ... (workload.sh)
# shellcheck source=SCRIPTDIR/../../scripts/lib/cases.sh
. "$top/scripts/lib/cases.sh"
# wl_start, wl_verify, wl_finish, ...
# shellcheck source=SCRIPTDIR/../../scripts/lib/gpu-workload.sh
. "$top/scripts/lib/gpu-workload.sh"
# streamer, stream_start (the --stream cases' peer of the image streamer)
# shellcheck source=SCRIPTDIR/../../scripts/lib/streamer.sh
. "$top/scripts/lib/streamer.sh"

# ---------------------------------------------------------------------------------------
# Emulated hosts (`on PROFILE [--profile-file F] [--fail SPEC]... -- FUNCTION [ARG...]`, from
# scripts/lib/cases.sh, runs FUNCTION of this script on a new one)

host_file() { echo "$here/hosts/$1.toml"; }

# ---------------------------------------------------------------------------------------
# Processes (inside a host; alive, wait_gone, proc_state and wait_stopped come from
# scripts/lib/workload.sh)

# gpu-workload's and criu-rocm's live processes (criu, its GPU guardian and GPU memory
# writer, tasks it has forked and not yet named) in this pid namespace, as "pid comm state"
# (zombies are dead already; kfd-emu's runner reaps them).
leftovers() {
	local d comm s
	for d in /proc/[0-9]*; do
		comm=$(cat "$d/comm" 2>/dev/null) || continue
		case $comm in gpu-workload | criu-rocm | criu | criu-gpu-guard | criu-rocm-gpuwr) ;; *) continue ;; esac
		s=$(cat "$d/stat" 2>/dev/null) || continue
		s=${s##*) }
		case ${s%% *} in Z | X) continue ;; esac
		echo "${d#/proc/} $comm ${s%% *}"
	done
}

no_leftovers() {
	local l i
	for ((i = 0; i < 50; i++)); do
		l=$(leftovers)
		[ -z "$l" ] && return 0
		sleep 0.1
	done
	fail "$1: processes left behind: $(echo "$l" | paste -sd';')"
}



# counters_kept OLD NEW: no SDMA counter of line NEW went back from the one of OLD.
counters_kept() {
	counters_cmp "$1" "$2" ge || fail "counters went back: $(json_list "$1" counters) then $(json_list "$2" counters)"
}

# counters_cmp OLD NEW ge|gt: every SDMA counter of line NEW >= (or >) the one of OLD.
counters_cmp() {
	local a b i
	read -r -a a <<<"$(json_list "$1" counters)"
	read -r -a b <<<"$(json_list "$2" counters)"
	[ "${#a[@]}" -gt 0 ] && [ "${#a[@]}" = "${#b[@]}" ] || return 1
	for i in "${!a[@]}"; do
		if [ "$3" = gt ]; then ((b[i] > a[i])) || return 1; else ((b[i] >= a[i])) || return 1; fi
	done
}

# running_on PID LINE0: after a failed dump the process must still run with its GPU work
# unpaused: two more verifications, each ok, counters advancing.
running_on() {
	local pid=$1 v0=$2 v1 v2
	alive "$pid" || fail "the failed dump did not leave gpu-workload $pid running"
	v1=$(wl_verify "$pid") || exit 1
	sleep 0.2
	v2=$(wl_verify "$pid") || exit 1
	counters_cmp "$v0" "$v1" ge && counters_cmp "$v1" "$v2" gt ||
		fail "after the failed dump the SDMA counters of $pid do not advance:" \
			"$(json_list "$v0" counters) | $(json_list "$v1" counters) | $(json_list "$v2" counters)"
}

# ---------------------------------------------------------------------------------------
# criu-rocm (inside a host)

# dump PID DIR [criu ARG...]: log DIR/dump.log unless -o is given.
dump() {
	local pid=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	"$CRIU" dump -t "$pid" -D "$dir" -o dump.log -v4 "$@" >>"$CASE_DIR/criu.out" 2>&1
}

# rss_of FUNC ARG...: runs FUNC (dump or dump_ok) with criu-rocm under a wait4 wrapper that
# writes criu-rocm's peak RSS in bytes (ru_maxrss) to $CASE_DIR/rss; returns FUNC's status.
rss_of() {
	local f=$1 real=$CRIU rc=0
	shift
	: >"$CASE_DIR/rss"
	CRIU=$CASE_DIR/criu-rss
	printf '%s\n' '#!/bin/sh' "exec /usr/bin/python3 -c 'import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, st, ru = os.wait4(pid, 0)
open(sys.argv[1], \"w\").write(str(ru.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(st))' \"$CASE_DIR/rss\" \"$real\" \"\$@\"" >"$CRIU"
	chmod +x "$CRIU"
	"$f" "$@" || rc=$?
	CRIU=$real
	return "$rc"
}

# dump_ok PID DIR [ARG...]: the dump must succeed; without --leave-running the tree must
# be gone (killed by CRIU) afterwards.
dump_ok() {
	local pid=$1 dir=$2 st=0
	dump "$@" || fail "criu-rocm dump of $pid failed: $(log_errors "$dir/dump.log")"
	case " $* " in
	*" --leave-running "*) alive "$pid" || fail "dump --leave-running: $pid is gone" ;;
	*)
		wait "$pid" 2>/dev/null || st=$?
		wait_gone "$pid" 5 || fail "$pid still runs after the dump"
		# Reaped here when this shell started it (status 137: SIGKILL from CRIU).
		[ "$st" = 0 ] && fail "gpu-workload $pid exited by itself during the dump" ;;
	esac
	ls "$dir"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "the dump wrote no amdgpu-kfd-*.img"
	[ -e "$dir/$INCOMPLETE" ] && fail "the good dump left $INCOMPLETE in $dir"
	guardian_gone "the good dump"
}

# The marker an unfinished dump leaves in its image directory.
INCOMPLETE=criu-rocm-dump-incomplete

# guardian_gone WHAT: no GPU guardian runs (waits up to 15 s: after a good dump it waits
# for the killed tree to go, after a dead criu-rocm it unpauses first).
guardian_gone() {
	local i l
	for ((i = 0; i < 300; i++)); do
		l=$(leftovers | grep criu-gpu-guard) || return 0
		sleep 0.05
	done
	fail "$1: the GPU guardian still runs: $l"
}

# restore DIR LOG [criu ARG...]
restore() {
	local dir=$1 log=$2
	shift 2
	"$CRIU" restore -D "$dir" -o "$log" -v4 -d "$@" >>"$CASE_DIR/criu.out" 2>&1
}

# restore_ok DIR PID [ARG...]: the restore must succeed and PID run again.
restore_ok() {
	local dir=$1 pid=$2 log
	shift 2
	log=$dir/restore-$(date +%s%N).log
	restore "$dir" "$log" "$@" || fail "criu-rocm restore of $pid failed: $(log_errors "$log")"
	alive "$pid" || fail "after the restore gpu-workload $pid does not run"
	grep -aq "amdgpu: pid .*: GPU queues resumed" "$log" || fail "the restore log says no GPU queues were resumed ($log)"
	LAST_RESTORE_LOG=$log
}

# restore_fails DIR PID WHAT: the restore must fail, before the process runs, leave no
# process behind and keep the images as they were. Sets LAST_RESTORE_LOG.
restore_fails() {
	local dir=$1 pid=$2 what=$3 log before after
	shift 3
	log=$CASE_DIR/restore-fail-$(date +%s%N).log
	before=$(img_sums "$dir")
	if restore "$dir" "$log" "$@"; then
		fail "$what: criu-rocm restore succeeded"
	fi
	LAST_RESTORE_LOG=$log
	grep -aq "GPU queues resumed" "$log" && fail "$what: the failed restore had resumed GPU queues ($log)"
	wait_gone "$pid" 5 || fail "$what: the failed restore left $pid running"
	no_leftovers "$what"
	after=$(img_sums "$dir")
	[ "$before" = "$after" ] || fail "$what: the failed restore changed the images:" \
		"$(diff <(echo "$before") <(echo "$after") | grep '^[<>]' | head -n 2 | paste -sd' ')"
}


# The log must hold an error line matching each extended regex given.
log_has() {
	local log=$1 re
	shift
	for re in "$@"; do
		grep -aqE -- "$re" "$log" || fail "$(basename "$log") lacks /$re/; its errors: $(log_errors "$log" 6)"
	done
}

# gpu_check DIR: runs criu-rocm gpu-check; output in GC_OUT, status in GC_RC.
gpu_check() {
	GC_OUT=$("$CRIU" gpu-check -D "$1" 2>&1)
	GC_RC=$?
	printf '%s\n' "$GC_OUT" >>"$CASE_DIR/gpu-check.out"
}

# gpu_check_restorable DIR: gpu-check must say yes; prints the GPU mapping it found.
gpu_check_restorable() {
	gpu_check "$1"
	[ "$GC_RC" = 0 ] && grep -q "restorable: " <<<"$GC_OUT" || fail "gpu-check says the images cannot be restored here (exit $GC_RC): $(paste -sd' ' <<<"$GC_OUT")"
	sed -n 's/^pid [0-9]* (KFD image [0-9-]*): restorable: \(.*\); [0-9]* BO(s).*/\1/p' <<<"$GC_OUT"
}

# gpu_check_refuses DIR REGEX...: gpu-check must say no, for a reason matching each REGEX.
gpu_check_refuses() {
	local dir=$1 re
	shift
	gpu_check "$dir"
	[ "$GC_RC" != 0 ] || fail "gpu-check accepted images it should refuse: $(paste -sd' ' <<<"$GC_OUT")"
	for re in "$@"; do
		grep -E -- "NOT restorable here: .*$re" <<<"$GC_OUT" >/dev/null ||
			fail "gpu-check's verdict lacks /$re/: $(paste -sd' ' <<<"$GC_OUT")"
	done
}

# The GPU mapping a restore logged ("GPU a (renderDx) -> host GPU b (renderDy), ...").
restore_mapping() {
	grep -a -m1 -o 'amdgpu: pid [0-9]*: GPU 0x.* -> host GPU .*' "$1" | sed 's/^amdgpu: pid [0-9]*: //'
}

# restored_as_predicted MAP: the last restore mapped the GPUs as gpu-check predicted (MAP,
# from gpu_check_restorable).
restored_as_predicted() {
	[ "$1" = "$(restore_mapping "$LAST_RESTORE_LOG")" ] ||
		fail "gpu-check predicted '$1', the restore did '$(restore_mapping "$LAST_RESTORE_LOG")'"
}


# The user gpu_ids a workload started with, as %04x, from its ready line.
wl_gpus_hex() {
	local id
	for id in $(json_list "$(grep -m1 "^{\"ready\":true,\"pid\":$1," "$WL_OUT")" gpus); do
		printf '%04x\n' "$id"
	done
}

imgcheck() { /usr/bin/python3 "$here/imgcheck.py" "$@"; }
# A check in Python read from stdin, with ARGs; its complaint goes to $CASE_DIR/py.err.
pycheck() { /usr/bin/python3 - "$@" 2>"$CASE_DIR/py.err"; }
decode() { imgcheck decode "$1" "$UPSTREAM_PROTO" "$top/proto/criu-amdgpu.proto"; }

# ---------------------------------------------------------------------------------------
# Cases: dump (#4)

case_dump_images_decode() { on mi100x2 -- dump_images_decode; }
dump_images_decode() {
	local img=$CASE_DIR/img j gpus f
	wl_start wl --mib 4 --bos 3 --events
	dump_ok "$WL" "$img"
	j=$(decode "$img") || fail "$(decode "$img" 2>&1 >/dev/null)"
	echo "$j" >"$CASE_DIR/decoded.json"
	gpus=$(json_list "$(grep -m1 '"ready"' "$WL_OUT")" gpus | tr ' ' '\n' | sort -n | paste -sd,)
	pycheck "$j" "$WL" "$gpus" <<-'EOF' || fail "decoded images: $(tail -n1 "$CASE_DIR/py.err")"
		import json, sys
		d, pid, gpus = json.loads(sys.argv[1]), int(sys.argv[2]), sorted(map(int, sys.argv[3].split(",")))
		def check(c, why):
		    if not c:
		        sys.exit(why)
		check(len(d["kfd"]) == 1, f"{len(d['kfd'])} KFD images, expected 1")
		k = next(iter(d["kfd"].values()))
		check(k["pid"] == pid, f"KFD image pid {k['pid']}, the process is {pid}")
		check(k["gpus"] == gpus, f"KFD image GPUs {k['gpus']}, the process uses {gpus}")
		check(k["cpus"] == 1, f"{k['cpus']} CPU entries, mi100x2 has 1 CPU node")
		# per GPU: 3 data BOs, counter, ring, ring pointers, the doorbell slice and the
		# MMIO remap page (as libhsakmt allocates them); plus the signal page
		check(len(k["bos"]) == 2 * 8 + 1, f"{len(k['bos'])} BOs, expected 17")
		for g in gpus:
		    for flag, what in ((1 << 3, "DOORBELL"), (1 << 4, "MMIO_REMAP")):
		        n = sum(1 for b in k["bos"] if b["gpu_id"] == g and b["flags"] & flag)
		        check(n == 1, f"GPU {g:#x}: {n} {what} BOs, expected 1")
		check(k["objects"] == 3, f"{k['objects']} queue/event objects, expected 2 queues + 1 event")
		check(sorted(d["render"].values()) == gpus, f"render images name GPUs {sorted(d['render'].values())}")
	EOF
	for f in "$img"/amdgpu-*.img; do
		[ "$(stat -c %a "$f")" = 600 ] || fail "$(basename "$f") has mode $(stat -c %a "$f"), not 0600"
	done
	[ "$(ls "$img"/amdgpu-pages-*.img | wc -l)" = 2 ] || fail "expected 2 pages files: $(cd "$img" && echo amdgpu-pages-*)"
	grep -aq amdgpu_plugin "$img/inventory.img" || fail "inventory.img does not name amdgpu_plugin"
	# Observability: per GPU, what was saved, how fast.
	[ "$(grep -acE "amdgpu: pid $WL: GPU 0x[0-9a-f]+ \(host 0x[0-9a-f]+\): saved [0-9]+ BO\(s\), [0-9.]+ [KMG]iB in [0-9.]+ ms \([0-9]+ MB/s" "$img/dump.log")" = 2 ] ||
		fail "the dump log does not say per GPU what was saved (BOs, bytes, time, MB/s)"
	note "KFD image: 2 GPUs, 17 BOs (a doorbell and an MMIO BO each), 3 objects; decodes with upstream's and our schema"
}

case_dump_pages_hold_patterns() { on mi100x2 -- dump_pages_hold_patterns; }
dump_pages_hold_patterns() {
	local img=$CASE_DIR/img exp=$CASE_DIR/expected r
	mkdir -p "$exp"
	wl_start wl --mib 8 --bos 4 --small-bos 6 --dump-expected "$exp"
	dump_ok "$WL" "$img"
	r=$(imgcheck pages "$img" "$top/proto/criu-amdgpu.proto" "$exp" 2>&1) || fail "$r"
	note "$r"
}

# crit (build/crit, CRIU's image tool with patch 0013) decodes every GPU image file of a
# dump of two GPU processes, and what it shows agrees with what the dump logged: pids, GPU
# ids, BO and object counts, pages sizes and BOs per GPU, render nodes. The KFD and render
# images encode back to the same bytes.
case_dump_images_crit() { on mi100x2 -- dump_images_crit; }
dump_images_crit() {
	local img=$CASE_DIR/img f b nfiles=0
	[ -x "$CRIT" ] || fail "crit $CRIT is missing (make crit builds it)"
	wl_start wl --mib 2 --bos 2 --small-bos 3 --events --procs 2
	dump_ok "$WL" "$img"
	mkdir -p "$CASE_DIR/crit"
	for f in "$img"/amdgpu-*.img; do
		b=$(basename "$f" .img)
		# The digests are text (image-format.md), not for crit.
		[ "$b" = amdgpu-digests ] && continue
		"$CRIT" show "$f" >"$CASE_DIR/crit/$b.show" 2>"$CASE_DIR/crit/$b.err" ||
			fail "crit show $b.img: $(tail -n 1 "$CASE_DIR/crit/$b.err")"
		"$CRIT" decode -i "$f" -o "$CASE_DIR/crit/$b.json" 2>"$CASE_DIR/crit/$b.err" ||
			fail "crit decode $b.img: $(tail -n 1 "$CASE_DIR/crit/$b.err")"
		case $b in amdgpu-pages-*) ;; *)
			"$CRIT" encode -i "$CASE_DIR/crit/$b.json" -o "$CASE_DIR/crit/$b.img" 2>"$CASE_DIR/crit/$b.err" ||
				fail "crit encode $b: $(tail -n 1 "$CASE_DIR/crit/$b.err")"
			cmp -s "$f" "$CASE_DIR/crit/$b.img" || fail "crit decode | crit encode of $b.img changed its bytes" ;;
		esac
		nfiles=$((nfiles + 1))
	done
	pycheck "$CASE_DIR/crit" "$img/dump.log" "$WL $(wl_children "$WL")" \
		"$(json_list "$(grep -m1 '"ready"' "$WL_OUT")" gpus)" <<-'EOF' || fail "crit's view of the images: $(tail -n1 "$CASE_DIR/py.err")"
		import glob, json, os, re, sys
		d, log, pids, gpus = sys.argv[1], open(sys.argv[2], errors="replace").read(), \
		    sorted(map(int, sys.argv[3].split())), sorted(map(int, sys.argv[4].split()))
		def check(c, why):
		    if not c:
		        sys.exit(why)
		def img(name):
		    j = json.load(open(os.path.join(d, name + ".json")))
		    check(len(j["entries"]) == 1, f"{name}: {len(j['entries'])} entries")
		    s = open(os.path.join(d, name + ".show")).read()
		    check(j["magic"] in s, f"crit show {name} does not name {j['magic']}")
		    return j["magic"], j["entries"][0]
		kfd_log = {int(m[1]): (int(m[0]), int(m[2]), int(m[3]))
		           for m in re.findall(r"amdgpu: pid (\d+): KFD file (-?\d+): (\d+) GPU\(s\), (\d+) BO\(s\)", log)}
		paused = {int(m[0]): int(m[1]) for m in
		          re.findall(r"amdgpu: pid (\d+): GPU queues paused: \d+ GPU\(s\), \d+ BO\(s\), (\d+) queue/event", log)}
		saved = {(int(m[0]), int(m[1], 16)): int(m[2]) for m in
		         re.findall(r"amdgpu: pid (\d+): GPU 0x([0-9a-f]+) \(host 0x[0-9a-f]+\): saved (\d+) BO\(s\)", log)}
		render_log = sorted(int(g, 16) for g in re.findall(r"amdgpu: pid \d+: render node \S+ saved as GPU 0x([0-9a-f]+)", log))
		check(len(kfd_log) == len(pids), f"the dump log names {len(kfd_log)} KFD files for {len(pids)} processes")
		kfd_pid, seen = {}, []
		for path in sorted(glob.glob(os.path.join(d, "amdgpu-kfd-*.json"))):
		    name = os.path.basename(path)[:-5]
		    fid = int(name[len("amdgpu-kfd-"):])
		    magic, k = img(name)
		    check(magic == "AMDGPU_KFD", f"{name}: magic {magic}")
		    check(fid in kfd_log, f"{name}: the dump log has no KFD file {fid}")
		    pid, ngpus, nbos = kfd_log[fid]
		    check(k["pid"] == pid, f"{name}: pid {k['pid']}, the log says {pid}")
		    ids = sorted(e["gpu_id"] for e in k["device_entries"] if e["gpu_id"])
		    check(ids == gpus and k["num_of_gpus"] == ngpus == len(gpus),
		          f"{name}: GPUs {ids} ({k['num_of_gpus']}), the log says {ngpus}, the process uses {gpus}")
		    check(k["num_of_bos"] == len(k["bo_entries"]) == nbos,
		          f"{name}: {k['num_of_bos']} BOs ({len(k['bo_entries'])} entries), the log says {nbos}")
		    check(k["num_of_objects"] == paused.get(pid), f"{name}: {k['num_of_objects']} objects, the log says {paused.get(pid)}")
		    kfd_pid[fid] = pid
		    seen.append(pid)
		check(sorted(seen) == pids, f"KFD images of pids {sorted(seen)}, the processes are {pids}")
		npages = 0
		for path in sorted(glob.glob(os.path.join(d, "amdgpu-pages-*.json"))):
		    name = os.path.basename(path)[:-5]
		    fid, gpu = name[len("amdgpu-pages-"):].rsplit("-", 1)
		    fid, gpu = int(fid), int(gpu, 16)
		    magic, p = img(name)
		    check(magic == "AMDGPU_PAGES", f"{name}: magic {magic}")
		    bos = p.get("bos")
		    check(isinstance(bos, list), f"{name}: no BO list ({bos})")
		    check(p["size"] == p["payload_bytes"] == sum(b["size"] for b in bos),
		          f"{name}: size word {p['size']}, {p['payload_bytes']} bytes, BOs of {sum(b['size'] for b in bos)}")
		    n = saved.get((kfd_pid.get(fid), gpu))
		    check(len(bos) == n, f"{name}: {len(bos)} BOs, the log says {n} saved")
		    check(all(b["file_offset"] == sum(x["size"] for x in bos[:i]) for i, b in enumerate(bos)),
		          f"{name}: BO offsets are not back to back")
		    check(os.path.getsize(os.path.join(os.path.dirname(d), "img", name + ".img")) == 8 + p["size"],
		          f"{name}: file size is not 8 + {p['size']}")
		    npages += 1
		check(npages == len(pids) * len(gpus), f"{npages} pages files for {len(pids)} processes on {len(gpus)} GPUs")
		rg = []
		for path in sorted(glob.glob(os.path.join(d, "amdgpu-renderD-*.json"))):
		    name = os.path.basename(path)[:-5]
		    magic, r = img(name)
		    check(magic == "AMDGPU_RENDERD", f"{name}: magic {magic}")
		    check(r.get("id") == int(name[len("amdgpu-renderD-"):]), f"{name}: id {r.get('id')}")
		    rg.append(r["gpu_id"])
		check(sorted(rg) == render_log and rg, f"render images of GPUs {sorted(rg)}, the log says {render_log}")
		print(f"{len(seen)} KFD, {npages} pages and {len(rg)} render images")
	EOF
	note "crit decoded $nfiles GPU image files; pids, GPU ids, BO and object counts, pages sizes match the dump log"
}

case_dump_leave_running() { on mi100x2 -- dump_leave_running; }
dump_leave_running() {
	local img=$CASE_DIR/img v0 v1 v2
	wl_start wl --mib 4 --bos 2 --events --fresh
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img" --leave-running
	decode "$img" >/dev/null || fail "images of the --leave-running dump do not decode"
	log_has "$img/dump.log" "amdgpu: pid $WL: GPU queues unpaused"
	# Paused before CRIU reads any memory, unpaused only after it read all of it.
	pycheck "$img/dump.log" "$WL" <<-'EOF' || fail "GPU pause window in the dump log: $(tail -n1 "$CASE_DIR/py.err")"
		import sys
		lines = open(sys.argv[1], errors="replace").read().splitlines()
		def at(s, last=False):
		    hits = [i for i, l in enumerate(lines) if s in l]
		    if not hits:
		        sys.exit(f"no line with {s!r}")
		    return hits[-1] if last else hits[0]
		paused, unpaused = at(f"amdgpu: pid {sys.argv[2]}: GPU queues paused"), at("GPU queues unpaused")
		first, last = at("Dumping pages ("), at("Transferring pages", last=True)
		if not paused < first or not last < unpaused:
		    sys.exit(f"paused at line {paused}, memory read from {first} to {last}, unpaused at {unpaused}")
	EOF
	v1=$(wl_verify "$WL") || exit 1
	sleep 0.3
	v2=$(wl_verify "$WL") || exit 1
	counters_cmp "$v0" "$v1" ge && counters_cmp "$v1" "$v2" gt ||
		fail "SDMA counters after --leave-running do not advance: $(json_list "$v1" counters) then $(json_list "$v2" counters)"
	[ "$(json_num "$v2" events)" -gt "$(json_num "$v1" events)" ] || fail "events stopped firing: $v1 / $v2"
	wl_finish "$WL"
	note "counters $(json_list "$v0" counters) -> $(json_list "$v1" counters) -> $(json_list "$v2" counters)"
}

case_dump_no_gpu_state() { on mi100x2 -- dump_no_gpu_state; }
dump_no_gpu_state() {
	local img=$CASE_DIR/img n0 n1 pid
	# A process with no GPU state, alive inside the emulated host: counts in a file (one
	# process, no children, no file held open).
	setsid /usr/bin/python3 -c '
import os, sys, time
n, path = 0, sys.argv[1]
while True:
    n += 1
    with open(path + ".tmp", "w") as f:
        f.write(f"{n}\n")
    os.replace(path + ".tmp", path)
    time.sleep(0.02)
' "$CASE_DIR/count" </dev/null >/dev/null 2>&1 &
	pid=$!
	for ((n0 = 0; n0 < 100; n0++)); do [ -s "$CASE_DIR/count" ] && break; sleep 0.05; done
	sleep 0.2
	mkdir -p "$img"
	dump "$pid" "$img" || fail "dump of a process without GPU state failed: $(log_errors "$img/dump.log")"
	wait "$pid" 2>/dev/null
	wait_gone "$pid" 5 || fail "$pid still runs after the dump"
	n0=$(cat "$CASE_DIR/count")
	compgen -G "$img/amdgpu-*" >/dev/null && fail "GPU image files for a process without GPU state: $(cd "$img" && echo amdgpu-*)"
	grep -aq amdgpu_plugin "$img/inventory.img" && fail "inventory.img names amdgpu_plugin though nothing used a GPU"
	grep -aqE 'amdgpu:|GPU queues' "$img/dump.log" && fail "the GPU code acted on a process without GPU state: $(grep -aE 'amdgpu:|GPU queues' "$img/dump.log" | head -n 1)"
	gpu_check "$img"
	[ "$GC_RC" = 0 ] && grep -q "no GPU state in these images" <<<"$GC_OUT" ||
		fail "gpu-check on images without GPU state: exit $GC_RC: $(paste -sd' ' <<<"$GC_OUT")"
	restore "$img" "$img/restore.log" || fail "restore of a process without GPU state failed: $(log_errors "$img/restore.log")"
	alive "$pid" || fail "the restored process is gone"
	sleep 0.3
	n1=$(cat "$CASE_DIR/count")
	[ "$n1" -gt "$n0" ] || fail "the restored process does not count on: $n0 then $n1"
	kill -KILL "$pid"
	note "counted $n0 at the dump, $n1 after the restore"
}

# A process that opened /dev/kfd (GET_VERSION) but allocated nothing: KFD's RESTORE refuses
# num_bos == 0, so the dump must refuse, naming the process and the file, and the process
# must keep running (it is not killed for images no restore could use).
case_dump_kfd_open_no_buffers() { on mi100x2 -- dump_kfd_open_no_buffers; }
dump_kfd_open_no_buffers() {
	local img=$CASE_DIR/img pid
	setsid /usr/bin/python3 -c '
import fcntl, os, sys, time
fd = os.open("/dev/kfd", os.O_RDWR)
buf = bytearray(8)
fcntl.ioctl(fd, (2 << 30) | (8 << 16) | (ord("K") << 8) | 1, buf)  # AMDKFD_IOC_GET_VERSION
open(sys.argv[1], "w").write("open\n")
while True:
    time.sleep(1)
' "$CASE_DIR/ready" </dev/null >/dev/null 2>&1 &
	pid=$!
	for ((n = 0; n < 100; n++)); do [ -s "$CASE_DIR/ready" ] && break; sleep 0.05; done
	[ -s "$CASE_DIR/ready" ] || fail "the KFD opener $pid did not start"
	dump "$pid" "$img" && fail "the dump of a process holding /dev/kfd without GPU buffers succeeded"
	log_has "$img/dump.log" "amdgpu: pid $pid: fd [0-9]+ \(/dev/kfd\): the process opened it but holds no GPU buffer"
	alive "$pid" || fail "the refused dump killed $pid"
	guardian_gone "the refused dump"
	kill -KILL "$pid"
	note "$(grep -a -m1 -o "amdgpu: pid $pid: fd [0-9]* (/dev/kfd): .*" "$img/dump.log")"
}

case_dump_8_gpus() { on mi300x8 -- dump_8_gpus; }
dump_8_gpus() {
	local img=$CASE_DIR/img v0 v1 n
	wl_start wl --mib 2 --bos 2 --events
	v0=$(wl_verify "$WL") || exit 1
	[ "$(json_num "$v0" gpus)" = 8 ] || fail "gpu-workload uses $(json_num "$v0" gpus) GPUs on mi300x8"
	dump_ok "$WL" "$img"
	n=$(ls "$img"/amdgpu-pages-*.img | wc -l)
	[ "$n" = 8 ] || fail "$n pages files for 8 GPUs"
	[ "$(grep -ac "amdgpu: pid $WL: GPU 0x.*saved" "$img/dump.log")" = 8 ] || fail "the dump log does not report 8 GPUs saved"
	decode "$img" >/dev/null || fail "8-GPU images do not decode"
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	counters_kept "$v0" "$v1"
	wl_finish "$WL"
}

# Three processes (the first forks two before opening /dev/kfd), each with two more threads
# that run SDMA counters of their own, on both GPUs.
# KFD_MAX_BUFFER_SIZE bounds the memory the whole dump spends moving GPU memory, over all
# GPUs and lanes, not each GPU's: 8 GPUs with 64 MiB of BOs each (32 MiB BOs) dumped with a
# 16 MiB budget. criu-rocm's peak RSS (wait4's ru_maxrss: its VmHWM, or a child's it
# waited for if larger) minus the same for a dump of a process without GPU state must stay
# within the budget and a 6 MiB margin for what is not moving memory: the 8 copy threads'
# stacks and malloc arenas, the KFD image (a few hundred bytes a BO), topology and GPU
# plugin state. Before the budget was shared out this was 8 x (16 MiB window + 1 MiB
# write buffer) = 136 MiB. Then the same compressed (KFD_COMPRESS=zstd): refused within
# 16 MiB, within the budget at 64 MiB, zstd's compressors included.
case_dump_memory_budget_8_gpus() { on mi300x8 -- dump_memory_budget_8_gpus; }
dump_memory_budget_8_gpus() {
	local img=$CASE_DIR/img base=$CASE_DIR/base pid rss0 rss1 extra budget=$((16 << 20)) margin=$((6 << 20)) v0 v1
	setsid /usr/bin/python3 -c 'import time
while True: time.sleep(1)' </dev/null >/dev/null 2>&1 &
	pid=$!
	sleep 0.3
	KFD_MAX_BUFFER_SIZE=16M rss_of dump "$pid" "$base" || fail "dump of a process without GPU state failed: $(log_errors "$base/dump.log")"
	rss0=$(cat "$CASE_DIR/rss")
	wait "$pid" 2>/dev/null
	wl_start wl --mib 64 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	[ "$(json_num "$v0" gpus)" = 8 ] || fail "gpu-workload uses $(json_num "$v0" gpus) GPUs on mi300x8"
	KFD_MAX_BUFFER_SIZE=16M rss_of dump_ok "$WL" "$img"
	rss1=$(cat "$CASE_DIR/rss")
	[ "$(grep -ac "amdgpu: pid $WL: GPU 0x.*saved" "$img/dump.log")" = 8 ] || fail "the dump log does not report 8 GPUs saved"
	extra=$((rss1 - rss0))
	[ "$extra" -le $((budget + margin)) ] ||
		fail "peak RSS $((rss1 >> 10)) KiB, $((extra >> 10)) KiB over the dump without GPU state: more than the budget of $((budget >> 10)) KiB + $((margin >> 10)) KiB"
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	note "512 MiB on 8 GPUs, KFD_MAX_BUFFER_SIZE=16M: peak RSS $((rss1 >> 10)) KiB, $((extra >> 10)) KiB over a dump without GPU state ($((rss0 >> 10)) KiB)"
	rm -rf "$img"
	# Compressed, the zstd compressors are part of the budget: 2 MiB per GPU holds none
	# (the dump fails naming the knob and the process runs on); 64 MiB holds one per GPU.
	KFD_COMPRESS=zstd KFD_MAX_BUFFER_SIZE=16M dump "$WL" "$img" && fail "a compressed dump within 2 MiB per GPU succeeded"
	log_has "$img/dump.log" "amdgpu: pid $WL: .*cannot hold a zstd compressor .*raise KFD_MAX_BUFFER_SIZE"
	running_on "$WL" "$v1"
	rm -rf "$img"
	budget=$((64 << 20))
	KFD_COMPRESS=zstd KFD_MAX_BUFFER_SIZE=64M rss_of dump_ok "$WL" "$img"
	rss1=$(cat "$CASE_DIR/rss")
	extra=$((rss1 - rss0))
	[ "$extra" -le $((budget + margin)) ] ||
		fail "compressed: peak RSS $((rss1 >> 10)) KiB, $((extra >> 10)) KiB over the dump without GPU state: more than the budget of $((budget >> 10)) KiB + $((margin >> 10)) KiB"
	restore_ok "$img" "$WL"
	v0=$(wl_verify "$WL") || exit 1
	same_bytes "$v1" "$v0"
	wl_finish "$WL"
	note "compressed (zstd level 3), KFD_MAX_BUFFER_SIZE=64M: peak RSS $((rss1 >> 10)) KiB, $((extra >> 10)) KiB over a dump without GPU state"
	rm -rf "$img"
}

case_dump_multi_process_threads() { on mi100x2 -- dump_multi_process_threads; }
dump_multi_process_threads() {
	local img=$CASE_DIR/img exp=$CASE_DIR/expected kids j r p ncore
	mkdir -p "$exp"
	wl_start wl --procs 3 --threads 2 --mib 2 --bos 2 --dump-expected "$exp"
	kids=$(wl_children "$WL")
	[ "$(wc -w <<<"$kids")" = 2 ] || fail "gpu-workload --procs 3 reports children '$kids'"
	# shellcheck disable=SC2086
	wl_verify "$WL" $kids >/dev/null || exit 1
	dump_ok "$WL" "$img"
	for p in $kids; do wait_gone "$p" 5 || fail "child $p still runs after the dump"; done
	j=$(decode "$img") || fail "$(decode "$img" 2>&1 >/dev/null)"
	pycheck "$j" "$WL $kids" <<-'EOF' || fail "multi-process images: $(tail -n1 "$CASE_DIR/py.err")"
		import json, sys
		d, pids = json.loads(sys.argv[1]), sorted(map(int, sys.argv[2].split()))
		got = sorted(k["pid"] for k in d["kfd"].values())
		if got != pids:
		    sys.exit(f"KFD images of pids {got}, the tree is {pids}")
		for k in d["kfd"].values():
		    # 2 GPU counters + 2 thread counters, each a queue
		    if k["objects"] != 4 or len(k["gpus"]) != 2:
		        sys.exit(f"pid {k['pid']}: {k['objects']} objects on {len(k['gpus'])} GPUs, expected 4 queues on 2")
		if len(d["render"]) != 6:
		    sys.exit(f"{len(d['render'])} render-node images, expected 2 per process")
	EOF
	r=$(imgcheck pages "$img" "$top/proto/criu-amdgpu.proto" "$exp" 2>&1) || fail "$r"
	ncore=$(ls "$img"/core-*.img | wc -l)
	[ "$ncore" -ge 9 ] || fail "$ncore core images: the threads (3 per process) were not all dumped"
	note "$r; $ncore threads"
}

case_dump_1000_small_bos() { on mi100 -- dump_1000_small_bos; }
dump_1000_small_bos() {
	local img=$CASE_DIR/img exp=$CASE_DIR/expected v0 v1 r nbo
	mkdir -p "$exp"
	wl_start wl --mib 1 --bos 2 --small-bos 1024 --dump-expected "$exp"
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img"
	nbo=$(decode "$img" | /usr/bin/python3 -c 'import json,sys; print(sum(len(k["bos"]) for k in json.load(sys.stdin)["kfd"].values()))') ||
		fail "the images do not decode"
	[ "$nbo" -ge 1026 ] || fail "the KFD image holds $nbo BOs, the process had 1026 data BOs"
	r=$(imgcheck pages "$img" "$top/proto/criu-amdgpu.proto" "$exp" 2>&1) || fail "$r"
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	note "$nbo BOs; $r"
}

# 32000 BOs of one process (issue 25): their mappings make an mm-<pid>.img of more than
# 1 MiB, which the validation refused after a dump that had killed the process.
case_dump_32000_small_bos() { on mi100 -- dump_32000_small_bos; }
dump_32000_small_bos() {
	local img=$CASE_DIR/img v0 v1 nbo mm t0 t1 t2
	wl_start wl --mib 1 --bos 2 --small-bos 32000
	v0=$(wl_verify "$WL") || exit 1
	t0=${EPOCHREALTIME/./}
	dump_ok "$WL" "$img"
	t1=${EPOCHREALTIME/./}
	mm=$(stat -c %s "$img/mm-$WL.img") || fail "the dump wrote no mm-$WL.img"
	[ "$mm" -gt 1048576 ] || fail "mm-$WL.img is $mm bytes: 32000 mapped BOs should take more than 1 MiB"
	nbo=$(decode "$img" | /usr/bin/python3 -c 'import json,sys; print(sum(len(k["bos"]) for k in json.load(sys.stdin)["kfd"].values()))') ||
		fail "the images do not decode"
	[ "$nbo" -ge 32002 ] || fail "the KFD image holds $nbo BOs, the process had 32002 data BOs"
	gpu_check_restorable "$img" >/dev/null
	restore_ok "$img" "$WL"
	t2=${EPOCHREALTIME/./}
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	note "$nbo BOs, mm-$WL.img $mm bytes; dump $(((t1 - t0) / 1000)) ms, restore $(((t2 - t1) / 1000)) ms (gpu-check included)"
}

case_dump_1gib_bo() { on mi100 -- dump_1gib_bo; }
dump_1gib_bo() {
	local img=$CASE_DIR/img v0 v1 size
	wl_start wl --mib 1 --bos 1 --big-bo-mib 1024
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img"
	size=$(stat -c %s "$img"/amdgpu-pages-*.img)
	[ "$size" -gt $((1 << 30)) ] || fail "the pages file has $size bytes, less than the 1 GiB BO"
	note "$(grep -a -m1 -o 'GPU 0x[0-9a-f]* (host [^)]*): saved .*' "$img/dump.log")"
	restore_ok "$img" "$WL"
	note "$(grep -a -m1 -o 'GPU 0x[0-9a-f]* (host [^)]*): restored .*' "$LAST_RESTORE_LOG")"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	rm -rf "$img"
}

# A mostly-zero BO (zeros but for a dword per MiB) is written as holes: its pages file
# keeps its logical size, costs a few blocks of disk, and restores byte-exact.
case_dump_sparse_bo() { on mi100 -- dump_sparse_bo; }
dump_sparse_bo() {
	local img=$CASE_DIR/img v0 v1 f size disk
	wl_start wl --mib 1 --bos 1 --big-bo-mib 256 --big-bo-fill sparse
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img"
	f=$(ls "$img"/amdgpu-pages-*.img)
	size=$(stat -c %s "$f")
	disk=$(($(stat -c %b "$f") * $(stat -c %B "$f")))
	[ "$size" -gt $((256 << 20)) ] || fail "the pages file has $size bytes, less than the 256 MiB BO"
	# 1 MiB of pattern BO, the doorbell and queue BOs, and a block per MiB of the big BO
	# (two where a dword straddles nothing: 4 KiB each), with room for the file system.
	[ "$disk" -le $((4 << 20)) ] || fail "the pages file of a mostly-zero 256 MiB BO takes $disk bytes of disk"
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	note "pages file $size bytes, $disk on disk"
	rm -rf "$img"
}

# KFD_COMPRESS=zstd[:LEVEL] (environment or --gpu-knob) compresses the pages files: the
# image records it, gpu-check says upstream cannot restore it, the restore decompresses
# every byte back (the process verifies them), and compressible memory takes far less room.
case_dump_compressed() { on mi100x2 -- dump_compressed; }
dump_compressed() {
	local img=$CASE_DIR/img img2=$CASE_DIR/img2 v0 v1 f size total=0 bytes=0
	wl_start wl --mib 2 --bos 2 --big-bo-mib 64 --big-bo-fill sparse
	v0=$(wl_verify "$WL") || exit 1
	KFD_COMPRESS=zstd:5 KFD_COMPRESS_THREADS=1 dump_ok "$WL" "$img"
	for f in "$img"/amdgpu-pages-*.img; do
		size=$(stat -c %s "$f")
		total=$((total + $(od -An -t u8 -N 8 "$f")))
		bytes=$((bytes + size))
	done
	[ "$total" -gt $((128 << 20)) ] || fail "the pages files announce $total bytes, less than two 64 MiB BOs"
	[ $((bytes * 16)) -lt "$total" ] || fail "compressed pages files take $bytes bytes for $total bytes of mostly-zero BOs"
	gpu_check "$img"
	grep -q "note: compressed GPU pages (zstd level 5): upstream's amdgpu plugin cannot restore these" <<<"$GC_OUT" ||
		fail "gpu-check does not say the pages are compressed: $(paste -sd' ' <<<"$GC_OUT")"
	gpu_check_restorable "$img" >/dev/null
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	# Again through CRIU's option, compressing on the copying thread.
	dump_ok "$WL" "$img2" --gpu-knob KFD_COMPRESS=zstd --gpu-knob KFD_COMPRESS_THREADS=0
	gpu_check "$img2"
	grep -q "compressed GPU pages (zstd level 3)" <<<"$GC_OUT" || fail "gpu-check on the --gpu-knob dump: $(paste -sd' ' <<<"$GC_OUT")"
	restore_ok "$img2" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	[ "$(json_num "$v1" bytes)" = "$(json_num "$v0" bytes)" ] || fail "verified $(json_num "$v1" bytes) bytes after the second restore, $(json_num "$v0" bytes) before"
	wl_finish "$WL"
	note "$total bytes of BOs in $bytes bytes of pages files (zstd level 5)"
	rm -rf "$img" "$img2"
}

# ---------------------------------------------------------------------------------------
# Cases: GPU pre-dump (#17)

# pre_dump PID DIR [criu ARG...]: log DIR/pre-dump.log.
pre_dump() {
	local pid=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	"$CRIU" pre-dump -t "$pid" -D "$dir" -o pre-dump.log -v4 "$@" >>"$CASE_DIR/criu.out" 2>&1
}

# pre_dump_ok PID DIR [ARG...]: the pre-dump must succeed, leave PID running with its GPU
# work going on, save its GPU state and say how long its queues were paused; prints that.
pre_dump_ok() {
	local pid=$1 dir=$2 ms
	pre_dump "$@" || fail "criu-rocm pre-dump of $pid failed: $(log_errors "$dir/pre-dump.log")"
	alive "$pid" || fail "the pre-dump did not leave $pid running"
	ls "$dir"/amdgpu-kfd-*.img >/dev/null 2>&1 || fail "the pre-dump wrote no amdgpu-kfd-*.img"
	[ -e "$dir/$INCOMPLETE" ] && fail "the good pre-dump left $INCOMPLETE in $dir"
	[ -e "$dir/amdgpu-digests.img" ] || fail "the pre-dump wrote no amdgpu-digests.img"
	ms=$(grep -a -m1 -oE "amdgpu: pid $pid: GPU queues unpaused after [0-9.]+ ms paused" "$dir/pre-dump.log") ||
		fail "the pre-dump log does not say how long the GPU queues of $pid were paused"
	grep -aq "The kernel has no soft-dirty memory tracking" "$dir/pre-dump.log" ||
		[ -n "$(grep -a 'Dirty track supported' "$dir/pre-dump.log")" ] ||
		fail "the pre-dump log says nothing about memory tracking"
	guardian_gone "the good pre-dump"
	ms=${ms##* after }
	echo "${ms% paused}"
}

# A pre-dump pauses the GPU only for its ioctls and leaves the process running; the
# process keeps working and verifying; a dump on top of it restores byte-exact.
case_predump_runs_on() { on mi100x2 -- predump_runs_on; }
predump_runs_on() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img v0 v1 v2 paused
	wl_start wl --mib 8 --bos 4 --events --host-mib 8
	v0=$(wl_verify "$WL") || exit 1
	paused=$(pre_dump_ok "$WL" "$pre") || exit 1
	v1=$(wl_verify "$WL") || exit 1
	counters_cmp "$v0" "$v1" gt || fail "counters do not advance after the pre-dump: $(json_list "$v0" counters) then $(json_list "$v1" counters)"
	dump_ok "$WL" "$img" --prev-images-dir ../pre
	restore_ok "$img" "$WL"
	v2=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v2"
	wl_finish "$WL"
	note "GPU queues paused for $paused by the pre-dump"
}

# On one GPU a compressed dump compresses in lanes (threads, each with its own zstd
# compressor) and the restore reads the file in lanes that start at its chunks: a 96 MiB BO
# of fp16 weights is 48 chunks, shared out between the 2 cores.
case_dump_compressed_lanes() { on mi100 -- dump_compressed_lanes; }
dump_compressed_lanes() {
	local img=$CASE_DIR/img v0 v1 n d
	wl_start wl --mib 1 --bos 1 --big-bo-mib 96 --big-bo-fill fp16
	v0=$(wl_verify "$WL") || exit 1
	KFD_COMPRESS=zstd dump_ok "$WL" "$img"
	d=$(grep -a -c "amdgpu: GPU 0x[0-9a-f]*: lane of [0-9]* bytes" "$img/dump.log")
	[ "$(nproc)" -lt 2 ] || [ "$d" -ge 2 ] || fail "the compressed dump of a 96 MiB BO ran $d lane(s) on $(nproc) cores"
	restore_ok "$img" "$WL"
	n=$(grep -a -c "amdgpu: GPU 0x[0-9a-f]*: lane of [0-9]* bytes" "$LAST_RESTORE_LOG")
	[ "$(nproc)" -lt 2 ] || [ "$n" -ge 2 ] || fail "the restore of a 96 MiB compressed BO ran $n lane(s) on $(nproc) cores"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	note "$d dump and $n restore lanes; pages file $(stat -c %s "$img"/amdgpu-pages-*.img) bytes for 97 MiB of BOs"
	rm -rf "$img"
}

# wl_change PID: SIGUSR2, gpu-workload rewrites a tenth of its big BO; waits for its line.
wl_change() {
	local n i
	n=$(grep -c "^{\"changed\":true,\"pid\":$1," "$WL_OUT")
	kill -USR2 "$1" || fail "gpu-workload $1 is gone (SIGUSR2 failed)"
	for ((i = 0; i < 1200; i++)); do
		[ "$(grep -c "^{\"changed\":true,\"pid\":$1," "$WL_OUT")" -gt "$n" ] && return 0
		sleep 0.05
	done
	fail "gpu-workload $1 did not change its memory after SIGUSR2"
}

# Bytes of disk the pages files of an image directory take.
pages_disk() { du -B1 -c "$1"/amdgpu-pages-*.img | tail -n 1 | cut -f1; }

# A chain pre-dump -> pre-dump -> dump, a tenth of a 128 MiB BO changed before each of the
# last two: the dump writes only what changed (much less disk than a full dump of the same
# state), restore and gpu-check follow the chain (extents two links up included) and every
# byte comes back; a missing, damaged or mismatched parent is refused, by gpu-check and the
# restore in the same words, before any task exists.
case_predump_incremental_chain() { on mi100 -- predump_incremental_chain; }
predump_incremental_chain() {
	local pre1=$CASE_DIR/pre1 pre2=$CASE_DIR/pre2 full=$CASE_DIR/full img=$CASE_DIR/img
	local v0 v1 v2 fb ib kfd line
	wl_start wl --mib 4 --bos 2 --big-bo-mib 128
	v0=$(wl_verify "$WL") || exit 1
	pre_dump_ok "$WL" "$pre1" >/dev/null
	wl_change "$WL"
	pre_dump_ok "$WL" "$pre2" --prev-images-dir ../pre1 >/dev/null
	log_has "$pre2/pre-dump.log" "amdgpu: pid $WL: incremental GPU dump against parent/amdgpu-kfd-[0-9]+\.img"
	wl_change "$WL"
	v1=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$full" --leave-running
	dump_ok "$WL" "$img" --prev-images-dir ../pre2
	line=$(grep -a -m1 -oE "incremental GPU dump against .*" "$img/dump.log") ||
		fail "the dump with --prev-images-dir says nothing of its parent"
	fb=$(pages_disk "$full")
	ib=$(pages_disk "$img")
	[ "$ib" -le $((fb / 5)) ] || fail "the incremental dump's pages take $ib bytes of disk, the full dump's $fb"
	gpu_check_restorable "$img" >/dev/null
	kfd=$(cd "$pre1" && ls amdgpu-kfd-*.img)
	# Missing: the parent's parent.
	mv "$pre1" "$pre1.away"
	refused_alike "$img" "the parent's parent moved away" "parent/parent/: missing: the images take unchanged GPU memory"
	mv "$pre1.away" "$pre1"
	# Damaged: the last byte (of the kernel's blob) of the parent's parent's KFD image.
	cp "$pre1/$kfd" "$CASE_DIR/kfd.bak"
	printf '\x5a' | dd of="$pre1/$kfd" bs=1 seek=$(($(stat -c %s "$pre1/$kfd") - 1)) conv=notrunc status=none
	cmp -s "$pre1/$kfd" "$CASE_DIR/kfd.bak" && fail "the damage left $kfd as it was"
	refused_alike "$img" "a byte of the parent's parent's KFD image changed" "parent/parent/$kfd: .*changed"
	cp "$CASE_DIR/kfd.bak" "$pre1/$kfd"
	# Mismatched: the parent link skips a generation (pre1 holds other bytes where the dump
	# took extents from pre2).
	ln -sfn ../pre1 "$img/parent"
	refused_alike "$img" "the parent link pointing at an older pre-dump" \
		"parent/$kfd: GPU 0x[0-9a-f]+: bo_entries\[[0-9]+\]\.content_extent_xxh3\[[0-9]+\]: is [0-9a-f]+, but"
	ln -sfn ../pre2 "$img/parent"
	gpu_check_restorable "$img" >/dev/null
	restore_ok "$img" "$WL"
	v2=$(wl_verify "$WL") || exit 1
	same_bytes "$v1" "$v2"
	wl_finish "$WL"
	note "GPU pages on disk: full dump $fb bytes, incremental dump $ib bytes ($((ib * 100 / fb)) %)"
	note "${line#incremental GPU dump against }"
}

# Signed images (CRIU_ROCM_SIGN_KEY at dump, CRIU_ROCM_VERIFY_KEY at restore and gpu-check):
# a pre-dump signed through the environment and a dump on it through --gpu-knob, each
# directory with its own amdgpu-signature.img over every *.img. Unsigned keys, a changed
# byte of CRIU's own memory pages, a file added, a changed file of the parent, and another
# key are refused alike by gpu-check and the restore before any task exists, and so are an
# image directory or file others may write to, an image directory on FUSE and, with the dump's
# signature digest required (CRIU_ROCM_VERIFY_SIGNATURE), another dump signed with the same
# key; with the right key and digest the process comes back byte-exact. Without a required
# key the signature is a note.
case_signed_images() { on mi100x2 -- signed_images; }
signed_images() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img k=$CASE_DIR/keys v1 v2 pages kfd digest older
	mkdir -p "$k"
	openssl genpkey -algorithm ed25519 -out "$k/key.pem" 2>>"$CASE_DIR/openssl.err" &&
		openssl pkey -in "$k/key.pem" -pubout -out "$k/pub.pem" &&
		openssl genpkey -algorithm ed25519 -out "$k/other.pem" 2>>"$CASE_DIR/openssl.err" &&
		openssl pkey -in "$k/other.pem" -pubout -out "$k/other-pub.pem" ||
		fail "openssl could not make Ed25519 keys: $(cat "$CASE_DIR/openssl.err")"
	wl_start wl --mib 4 --bos 2
	CRIU_ROCM_SIGN_KEY=$k/key.pem pre_dump_ok "$WL" "$pre" >/dev/null
	wl_change "$WL"
	v1=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img" --prev-images-dir ../pre --gpu-knob "CRIU_ROCM_SIGN_KEY=$k/key.pem"
	log_has "$img/dump.log" "amdgpu: signed [0-9]+ image files \\([^)]+\\) with ed25519:[0-9a-f]{64}"
	[ -s "$pre/amdgpu-signature.img" ] || fail "the signed pre-dump wrote no amdgpu-signature.img"
	gpu_check_restorable "$img" >/dev/null
	grep -q "note: the images are signed by ed25519:[0-9a-f]*; CRIU_ROCM_VERIFY_KEY is unset" <<<"$GC_OUT" ||
		fail "gpu-check without a required key says nothing of the signature: $(paste -sd' ' <<<"$GC_OUT")"
	export CRIU_ROCM_VERIFY_KEY=$k/other-pub.pem
	refused_alike "$img" "images signed by another key" "amdgpu-signature.img: key: signed by ed25519:[0-9a-f]+, not by the required"
	export CRIU_ROCM_VERIFY_KEY=$k/pub.pem
	pages=$(cd "$img" && ls pages-*.img | head -n 1)
	cp "$img/$pages" "$CASE_DIR/pages.bak"
	printf '\x5a' | dd of="$img/$pages" bs=1 seek=$(($(stat -c %s "$img/$pages") / 2)) conv=notrunc status=none
	cmp -s "$img/$pages" "$CASE_DIR/pages.bak" && fail "the damage left $pages as it was"
	refused_alike "$img" "a byte of CRIU's memory pages changed" "$pages: sha256: differs from the signed digest"
	cp "$CASE_DIR/pages.bak" "$img/$pages"
	cp "$img/$pages" "$img/pages-9999.img"
	refused_alike "$img" "an image file added" "pages-9999.img: not covered by the signature"
	rm "$img/pages-9999.img"
	kfd=$(cd "$pre" && ls amdgpu-kfd-*.img)
	cp "$pre/$kfd" "$CASE_DIR/kfd.bak"
	printf '\x5a' | dd of="$pre/$kfd" bs=1 seek=$(($(stat -c %s "$pre/$kfd") - 1)) conv=notrunc status=none
	refused_alike "$img" "a byte of the parent's KFD image changed" "parent/$kfd: sha256: differs from the signed digest"
	cp "$CASE_DIR/kfd.bak" "$pre/$kfd"
	# CRIU opens a real directory named parent as it would the link: unsigned, refused.
	mv "$img/parent" "$CASE_DIR/parent.link"
	cp -a "$pre" "$img/parent"
	rm "$img/parent/amdgpu-signature.img"
	refused_alike "$img" "an unsigned directory in the parent's place" "amdgpu-signature.img: parent: parent/amdgpu-signature.img: No such file"
	rm -r "$img/parent"
	mv "$CASE_DIR/parent.link" "$img/parent"
	# Lazily restored pages are read after the check: refused up front.
	restore_fails "$img" "$WL" "a --lazy-pages restore of signed images" --lazy-pages
	log_has "$LAST_RESTORE_LOG" "CRIU_ROCM_VERIFY_KEY is set: --lazy-pages restores read images the signature check cannot see"
	# A relative key path would be looked up inside the image directory.
	CRIU_ROCM_VERIFY_KEY=keys/pub.pem restore_fails "$img" "$WL" "a relative key path"
	log_has "$LAST_RESTORE_LOG" "CRIU_ROCM_VERIFY_KEY=\"keys/pub.pem\": not an absolute path"
	# Only root and we may write the images verified, or they could change after the check.
	chmod g+w "$img"
	refused_alike "$img" "an image directory the group may write to" "the image directory is writable by group or others \\(mode 775\\)"
	chmod g-w "$img"
	chmod o+w "$img/$pages"
	refused_alike "$img" "an image file others may write to" "$pages: reading it: writable by group or others \\(mode [0-7]+\\): it could change after the check"
	chmod o-w "$img/$pages"
	signed_on_fuse_refused
	# Freshness: the digest the dump logged names this dump; with it required, the signed
	# pre-dump's images (an older dump with the same key) are refused in its place.
	digest=$(grep -aoE "CRIU_ROCM_VERIFY_SIGNATURE sha256:[0-9a-f]{64}" "$img/dump.log" | cut -d' ' -f2)
	[ -n "$digest" ] || fail "the signed dump logged no CRIU_ROCM_VERIFY_SIGNATURE digest"
	[ "$digest" = "sha256:$(sha256sum <"$img/amdgpu-signature.img" | cut -d' ' -f1)" ] ||
		fail "the dump logged $digest, not the SHA-256 of its amdgpu-signature.img"
	older="sha256:$(sha256sum <"$pre/amdgpu-signature.img" | cut -d' ' -f1)"
	CRIU_ROCM_VERIFY_SIGNATURE=$older refused_alike "$img" "the signature digest of another signed dump required" "amdgpu-signature.img: its SHA-256 is [0-9a-f]{64}, not the $older CRIU_ROCM_VERIFY_SIGNATURE requires"
	export CRIU_ROCM_VERIFY_SIGNATURE=$digest
	gpu_check_restorable "$img" >/dev/null
	grep -q "note: the images are signed by the required ed25519:[0-9a-f]* (CRIU_ROCM_VERIFY_SIGNATURE $digest, required)" <<<"$GC_OUT" ||
		fail "gpu-check with the right key and digest does not say so: $(paste -sd' ' <<<"$GC_OUT")"
	restore_ok "$img" "$WL"
	v2=$(wl_verify "$WL") || exit 1
	same_bytes "$v1" "$v2"
	wl_finish "$WL"
	unset CRIU_ROCM_VERIFY_KEY CRIU_ROCM_VERIFY_SIGNATURE
}

# On FUSE (and NFS, SMB, 9P) owners and modes are the server's word: with a key required,
# an image directory there is refused naming it and its filesystem, before anything in it is
# read. test/gpu/fuse-dir.py serves a directory of root's, mode 0755, over FUSE (allow_other),
# in this host's private mount namespace.
signed_on_fuse_refused() {
	local dir=$CASE_DIR/fuse fpid
	mkdir -p "$dir"
	/usr/bin/python3 "$here/fuse-dir.py" "$dir" >"$CASE_DIR/fuse-dir.out" 2>&1 &
	fpid=$!
	for _ in $(seq 100); do
		grep -q mounted "$CASE_DIR/fuse-dir.out" && break
		alive "$fpid" || fail "test/gpu/fuse-dir.py could not serve $dir: $(cat "$CASE_DIR/fuse-dir.out")"
		sleep 0.1
	done
	[ "$(stat -f -c %t "$dir")" = 65735546 ] || fail "$dir is not on FUSE after fuse-dir.py mounted it"
	refused_alike "$dir" "an image directory on FUSE" "the image directory is on a FUSE filesystem"
	umount "$dir" || fail "cannot unmount $dir"
	wait "$fpid" || fail "test/gpu/fuse-dir.py failed: $(cat "$CASE_DIR/fuse-dir.out")"
}

# Compression and incremental dumps combine: a chain pre-dump (zstd) -> pre-dump -> dump
# (zstd:1), a tenth of a 128 MiB BO changed before each of the last two. Each link past the
# first is incremental whatever its parent's pages are (its unchanged extents are zero
# records of 8 bytes in a compressed file, holes in a plain one); gpu-check and the restore
# take extents through compressed and plain links alike, and every byte comes back.
case_predump_compressed_chain() { on mi100 -- predump_compressed_chain; }
predump_compressed_chain() {
	local pre1=$CASE_DIR/pre1 pre2=$CASE_DIR/pre2 img=$CASE_DIR/img v1 v2 fb ib
	wl_start wl --mib 4 --bos 2 --big-bo-mib 128 --big-bo-fill fp16
	KFD_COMPRESS=zstd pre_dump_ok "$WL" "$pre1" >/dev/null
	wl_change "$WL"
	pre_dump_ok "$WL" "$pre2" --prev-images-dir ../pre1 >/dev/null
	log_has "$pre2/pre-dump.log" "amdgpu: pid $WL: incremental GPU dump against parent/amdgpu-kfd-[0-9]+\.img"
	wl_change "$WL"
	v1=$(wl_verify "$WL") || exit 1
	KFD_COMPRESS=zstd:1 dump_ok "$WL" "$img" --prev-images-dir ../pre2
	log_has "$img/dump.log" "amdgpu: pid $WL: incremental GPU dump against parent/amdgpu-kfd-[0-9]+\.img"
	fb=$(pages_disk "$pre1")
	ib=$(pages_disk "$img")
	[ "$ib" -le $((fb / 4)) ] || fail "the compressed incremental dump's pages take $ib bytes of disk, the compressed pre-dump's $fb"
	gpu_check_restorable "$img" >/dev/null
	grep -q "upstream's amdgpu plugin cannot restore these" <<<"$GC_OUT" ||
		fail "gpu-check does not say upstream cannot restore the compressed images: $(paste -sd' ' <<<"$GC_OUT")"
	restore_ok "$img" "$WL"
	v2=$(wl_verify "$WL") || exit 1
	same_bytes "$v1" "$v2"
	wl_finish "$WL"
	note "GPU pages on disk: compressed pre-dump $fb bytes, compressed incremental dump $ib bytes ($((ib * 100 / fb)) %)"
}

# ---------------------------------------------------------------------------------------
# Cases: faults during a dump (#4). Each failed dump must leave the process running with
# its GPU work going on, and say which process, GPU and step failed.

case_fault_dump_dir_full() { on mi100x2 -- fault_dump_dir_full; }
fault_dump_dir_full() {
	local img=$CASE_DIR/img log=$CASE_DIR/dump.log v0
	wl_start wl --mib 16 --bos 4
	v0=$(wl_verify "$WL") || exit 1
	mkdir -p "$img"
	# 4 MiB: CRIU's own images fit, 16 MiB of GPU memory per GPU does not.
	mount -t tmpfs -o size=4m gpu-test-full "$img" || fail "cannot mount a small tmpfs on $img"
	dump "$WL" "$img" -o "$log" && fail "the dump into a full directory succeeded"
	log_has "$log" "amdgpu: pid $WL: .*GPU 0x[0-9a-f]+.*No space left on device" \
		"amdgpu: pid $WL: GPU queues unpaused"
	running_on "$WL" "$v0"
	# What it wrote cannot pass for an image.
	[ -f "$img/$INCOMPLETE" ] || fail "the failed dump's images are not marked incomplete: $(ls "$img" | paste -sd' ')"
	gpu_check "$img"
	[ "$GC_RC" != 0 ] && grep -q "incomplete dump" <<<"$GC_OUT" ||
		fail "gpu-check does not refuse the failed dump's images: $(paste -sd' ' <<<"$GC_OUT")"
	guardian_gone "the failed dump"
	umount "$img"
	wl_finish "$WL"
	note "$(grep -a -m1 -o "amdgpu: pid $WL: .*No space left on device.*" "$log")"
}

case_fault_dump_dir_readonly() { on mi100x2 -- fault_dump_dir_readonly; }
fault_dump_dir_readonly() {
	local img=$CASE_DIR/img log=$CASE_DIR/dump.log v0
	wl_start wl --mib 4 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	mkdir -p "$img"
	mount --bind "$img" "$img" && mount -o remount,bind,ro "$img" || fail "cannot make $img read-only"
	dump "$WL" "$img" -o "$log" && fail "the dump into a read-only directory succeeded"
	log_has "$log" "Error .*Read-only file system"
	if grep -aq "amdgpu: pid $WL: GPU queues paused" "$log"; then
		log_has "$log" "amdgpu: pid $WL: GPU queues unpaused"
	fi
	[ -z "$(ls -A "$img")" ] || fail "files appeared in the read-only directory: $(ls -A "$img" | paste -sd' ')"
	running_on "$WL" "$v0"
	umount "$img"
	wl_finish "$WL"
	note "$(grep -a -m1 -o 'Error .*Read-only file system' "$log")"
}

# Only the GPU's image files cannot be written (read-only bind mounts of files with their
# names): CRIU's part of the dump works, the GPU part must fail cleanly.
case_fault_dump_gpu_files_readonly() { on mi100x2 -- fault_dump_gpu_files_readonly; }
fault_dump_gpu_files_readonly() {
	local probe=$CASE_DIR/probe img=$CASE_DIR/img log=$CASE_DIR/dump.log v0 f n=0
	wl_start wl --mib 4 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	# The names the GPU files will have (CRIU's file ids do not change between dumps).
	dump_ok "$WL" "$probe" --leave-running
	mkdir -p "$img"
	for f in "$probe"/amdgpu-pages-*.img "$probe"/amdgpu-kfd-*.img; do
		: >"$img/${f##*/}"
		mount --bind "$img/${f##*/}" "$img/${f##*/}" && mount -o remount,bind,ro "$img/${f##*/}" ||
			fail "cannot make $img/${f##*/} read-only"
		n=$((n + 1))
	done
	dump "$WL" "$img" -o "$log" && fail "the dump succeeded although its $n GPU image files are read-only"
	log_has "$log" "amdgpu: pid $WL: .*(amdgpu-pages|amdgpu-kfd).*Read-only file system" \
		"amdgpu: pid $WL: GPU queues unpaused"
	running_on "$WL" "$v0"
	for f in "$img"/amdgpu-*.img; do umount "$f" 2>/dev/null; done
	wl_finish "$WL"
	note "$(grep -a -m1 -o "amdgpu: pid $WL: .*Read-only file system.*" "$log")"
}

# criu-rocm without CAP_SYS_ADMIN and CAP_CHECKPOINT_RESTORE; then KFD itself refusing the
# CRIU op as it does for such a caller (EACCES).
case_fault_dump_no_capability() {
	on mi100x2 -- fault_dump_no_capability
	on mi100x2 --fail PROCESS_INFO:EACCES -- fault_dump_kfd_eacces
}
fault_dump_no_capability() {
	local img=$CASE_DIR/img log=$CASE_DIR/dump-nocap.log v0 out
	wl_start wl --mib 4 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	mkdir -p "$img"
	out=$(setpriv --inh-caps=-sys_admin,-checkpoint_restore --bounding-set=-sys_admin,-checkpoint_restore \
		"$CRIU" dump -t "$WL" -D "$img" -o "$log" -v4 2>&1) &&
		fail "criu-rocm without CAP_SYS_ADMIN/CAP_CHECKPOINT_RESTORE dumped: $out"
	grep -q "CAP_SYS_ADMIN or the CAP_CHECKPOINT_RESTORE" <<<"$out" ||
		fail "criu-rocm without the capabilities did not say why it failed: $(paste -sd' ' <<<"$out")"
	running_on "$WL" "$v0"
	wl_finish "$WL"
}
fault_dump_kfd_eacces() {
	local img=$CASE_DIR/img2 v0
	wl_start wl2 --mib 4 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	dump "$WL" "$img" && fail "the dump succeeded although KFD refused its CRIU op (EACCES)"
	log_has "$img/dump.log" "amdgpu: pid $WL: fd [0-9]+ \(/dev/kfd\): pausing the GPU queues: .*Permission denied"
	running_on "$WL" "$v0"
	wl_finish "$WL"
	note "$(grep -a -m1 -o "amdgpu: pid $WL: .*Permission denied.*" "$img/dump.log")"
}

# Two processes; KFD fails the second CHECKPOINT (the first process is paused and
# checkpointed by then). Both must run on; a second dump then succeeds.
case_fault_dump_checkpoint_ioctl() { on mi100x2 --fail CHECKPOINT:EIO:1:1 -- fault_dump_checkpoint_ioctl; }
fault_dump_checkpoint_ioctl() {
	local img=$CASE_DIR/img img2=$CASE_DIR/img2 kid v0 v1 v2 n
	wl_start wl --procs 2 --mib 2 --bos 2
	kid=$(wl_children "$WL")
	v0=$(wl_verify "$WL" "$kid") || exit 1
	dump "$WL" "$img" && fail "the dump succeeded although KFD failed a CHECKPOINT"
	log_has "$img/dump.log" "amdgpu: pid [0-9]+: fd [0-9]+ \(/dev/kfd\): CHECKPOINT: .*Input/output error"
	n=$(grep -acE "amdgpu: pid ($WL|$kid): GPU queues unpaused" "$img/dump.log")
	[ "$n" = 2 ] || fail "$n of 2 processes were unpaused after the failed CHECKPOINT"
	running_on "$WL" "$(sed -n 1p <<<"$v0")"
	running_on "$kid" "$(sed -n 2p <<<"$v0")"
	dump_ok "$WL" "$img2" --leave-running
	[ "$(ls "$img2"/amdgpu-kfd-*.img | wc -l)" = 2 ] || fail "the second dump saved $(ls "$img2"/amdgpu-kfd-*.img | wc -l) KFD processes, not 2"
	v1=$(wl_verify "$WL" "$kid") || exit 1
	sleep 0.2
	v2=$(wl_verify "$WL" "$kid") || exit 1
	counters_cmp "$(sed -n 1p <<<"$v1")" "$(sed -n 1p <<<"$v2")" gt &&
		counters_cmp "$(sed -n 2p <<<"$v1")" "$(sed -n 2p <<<"$v2")" gt ||
		fail "counters stopped after the second dump"
	wl_finish "$WL" "$kid"
	note "$(grep -a -m1 -o 'amdgpu: pid [0-9]*: fd [0-9]* (/dev/kfd): CHECKPOINT: .*' "$img/dump.log")"
}

# Render-node GEM BOs (issue 29): test/rocm/gem-test.c --hold, a libdrm_amdgpu client (Debian's
# libdrm_amdgpu; with --kfd also libhsakmt), holds GEM BOs with handles 1 (VRAM), 3 and 4 (GTT;
# 2 freed: a hole), filled, mapped in the GPU VM and kept mapped by the CPU. After the restore it
# checks the bytes through the CPU mappings it made before the dump, the handles, the GPU
# mappings and an SDMA copy between the old VAs. The restore recreates the handles in order:
# the hole by a placeholder freed afterwards where the kernel refuses GEM_CHANGE_HANDLE (the
# default, as Linux 7.1 and 6.18.36+), by a rename where it allows it (6.18.0-6.18.35).
gem_test_build() {
	GEM_TEST=$CASE_DIR/gem-test
	# shellcheck disable=SC2046 # pkg-config prints several words on purpose
	cc -std=gnu11 -Wall -Wextra -Werror -O2 -o "$GEM_TEST" "$top/test/rocm/gem-test.c" \
		$(pkg-config --cflags --libs libdrm_amdgpu libdrm) -lhsakmt 2>"$CASE_DIR/cc.log" ||
		fail "gem-test.c does not build: $(head -n 3 "$CASE_DIR/cc.log" | paste -sd' ')"
}
# gem_start [ARG...]: gem-test --hold ARG... until ready; its pid in GT (and $CASE_DIR/gt.pid).
gem_start() {
	local i
	gem_test_build
	setsid "$GEM_TEST" --hold "$@" </dev/null >"$CASE_DIR/gt.out" 2>&1 &
	GT=$!
	for ((i = 0; i < 600; i++)); do
		grep -q "^ready $GT\$" "$CASE_DIR/gt.out" && break
		alive "$GT" || break
		sleep 0.05
	done
	grep -q "^ready $GT\$" "$CASE_DIR/gt.out" || fail "gem-test --hold $* did not get ready: $(gem_reason)"
	echo "$GT" >"$CASE_DIR/gt.pid"
}
gem_reason() { grep -v '^ok ' "$CASE_DIR/gt.out" | tail -n 3 | paste -sd'|'; }
# gem_round N: SIGUSR1; gem-test must say "round N: ok".
gem_round() {
	kill -USR1 "$GT" || fail "round $1: cannot signal gem-test $GT"
	await_line "$CASE_DIR/gt.out" "^round $1: (ok|FAIL)\$" "^round $1: ok\$" 600 "$GT" ||
		fail "gem-test round $1 after the restore: $(gem_reason)"
}
# gem_finish: SIGTERM; gem-test checks once more and must say PASS and end.
gem_finish() {
	kill -TERM "$GT"
	wait_gone "$GT" 30 || fail "gem-test $GT did not end on SIGTERM"
	tail -n 1 "$CASE_DIR/gt.out" | grep -q '^PASS$' || fail "gem-test's last check failed: $(gem_reason)"
}
# gem_dump DIR: dumps gem-test; its render image must hold handles 1, 3 and 4.
gem_dump() {
	dump "$GT" "$1" || fail "criu-rocm dump of gem-test $GT failed: $(log_errors "$1/dump.log")"
	wait_gone "$GT" 5 || fail "gem-test $GT still runs after the dump"
	log_has "$1/dump.log" "amdgpu: pid $GT: render node /dev/dri/renderD12[89] \(file [0-9]+\): 3 GEM BO\(s\) saved \(handles 1, 3-4\)"
	ls "$1"/amdgpu-pages-*.img >/dev/null 2>&1 || fail "the dump wrote no pages file"
}
# gem_restore DIR METHOD: restores gem-test; the log must say how the hole was made (METHOD,
# a regular expression) and gem-test pass a round.
gem_restore() {
	local log=$1/restore.log
	gem_gpu_check_ok "$1"
	restore "$1" "$log" || fail "criu-rocm restore of gem-test $GT failed: $(log_errors "$log")"
	alive "$GT" || fail "after the restore gem-test $GT does not run: $(gem_reason)"
	log_has "$log" "GEM BO\(s\) restored with handles 1, 3-4: created in ascending handle order, $2"
	gem_round 1
	note "$(grep -a -m1 -o 'GEM BO(s) restored with handles.*' "$log")"
}
GEM_PLACEHOLDER='1 hole\(s\) filled with placeholder objects freed afterwards \(this kernel refuses GEM_CHANGE_HANDLE'
# Handles 3 and 4 both come out 2 (the lowest free) and are renamed.
GEM_RENAMED='2 past a hole renamed with GEM_CHANGE_HANDLE$'

case_gem_cr_same_host() { on mi100 -- gem_cr_same_host; }
gem_cr_same_host() {
	gem_start
	gem_dump "$CASE_DIR/img"
	gem_restore "$CASE_DIR/img" "$GEM_PLACEHOLDER"
	gem_finish
}

case_gem_cr_change_handle() { on mi100 --profile-file "$(host_file gem-change-handle)" -- gem_cr_change_handle; }
gem_cr_change_handle() {
	gem_start
	gem_dump "$CASE_DIR/img"
	gem_restore "$CASE_DIR/img" "$GEM_RENAMED"
	gem_finish
}

# With libhsakmt in the same process (a KFD process: its queues paused and resumed).
case_gem_cr_with_kfd() { on mi100 -- gem_cr_with_kfd; }
gem_cr_with_kfd() {
	gem_start --kfd
	gem_dump "$CASE_DIR/img"
	gem_restore "$CASE_DIR/img" "$GEM_PLACEHOLDER"
	log_has "$CASE_DIR/img/restore.log" "amdgpu: pid $GT: GPU queues resumed"
	gem_finish
}

# Dumped on mi100x2, restored on another mi100x2 (other gpu_ids and render minors): the GEM
# BOs follow their GPU's KFD remapping, their CPU mappings of renderD128 move to the new node.
case_gem_cr_other_host() {
	on mi100x2 -- gem_dump_for_later --kfd
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- gem_restore_other_host
}
gem_dump_for_later() {
	gem_start "$@"
	gem_dump "$CASE_DIR/img"
}
gem_restore_other_host() {
	GT=$(cat "$CASE_DIR/gt.pid")
	gem_restore "$CASE_DIR/img" "$GEM_PLACEHOLDER"
	log_has "$CASE_DIR/img/restore.log" 'GPU 0x3f2c \(renderD128\) -> host GPU 0x(51e7|a0c4) \(renderD13[01]\)'
	gem_finish
}

# Without KFD on mi100x2, gem-test holds a render file of each GPU, and each render image
# records its GPU's entry. Dumped where the first GPU has older firmware (60) than the
# second (65), restored where the host's first GPU has 65 and its second 60: giving each GPU
# of the dump, in render-minor order, the first host GPU left that accepts it would give
# renderD128 (fw 60, fits either) the host's first and leave renderD129 (fw 65) none; the
# placement crosses them, alike in gpu-check and the restore (session/render_gpu.rs).
case_gem_cr_crossed_gpus() {
	on mi100x2 --profile-file "$(host_file mi100x2-fw-first-older)" -- gem_dump_for_later
	on mi100x2 --profile-file "$(host_file mi100x2-fw-second-older)" -- gem_restore_crossed
}
gem_restore_crossed() {
	local log=$CASE_DIR/img/restore.log why
	GT=$(cat "$CASE_DIR/gt.pid")
	gem_restore "$CASE_DIR/img" "$GEM_PLACEHOLDER"
	why='no KFD process of the task has it; the first host GPU left that its properties accept and that leaves the dump.s later GPUs one each'
	log_has "$log" "amdgpu: pid $GT: render file [0-9]+: GPU 0x3f2c \(renderD128\) -> host GPU 0xa0c4 \(renderD130\): $why" \
		"amdgpu: pid $GT: render file [0-9]+: GPU 0xd9b1 \(renderD129\) -> host GPU 0x51e7 \(renderD131\): $why"
	gem_finish
}

# A kill point in the GEM BOs' dump: criu-rocm killed (SIGKILL) right after it saved a render
# file's GEM BOs. The process (a KFD process too) runs on, unpaused by the GPU guardian, the
# images say "incomplete dump", and a dump after that restores.
case_gem_dump_killed() { on mi100 -- gem_dump_killed; }
gem_dump_killed() {
	local img=$CASE_DIR/img-killed
	gem_start --kfd
	dump_killed "$GT" "$img" "GEM BO(s) saved" KILL
	log_has "$img/dump.log" "GEM BO\(s\) saved"
	killed_dump_left "$img" "the GEM BOs were saved" "$GT" --kfd
	gem_dump "$CASE_DIR/img"
	gem_restore "$CASE_DIR/img" "$GEM_PLACEHOLDER"
	gem_finish
}

# --stream with GEM BOs: gem-test's render file goes through the image streamer, its GEM
# BOs' pages file as the copy engines write it, read back in order at restore (its end and
# every BO's hash checked before any task runs); on the same host, and with KFD on another
# (other gpu_ids and render minors). Every GPU file is served once.
case_gem_stream_same_host() { on mi100 -- gem_stream_same_host; }
gem_stream_same_host() {
	gem_start
	gem_stream_dump
	gem_stream_restore "$CASE_DIR/restore.log"
	gem_finish
}
case_gem_stream_other_host() {
	on mi100x2 -- gem_stream_dump_for_later --kfd
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- gem_stream_restore_other_host
}
gem_stream_dump_for_later() {
	gem_start "$@"
	gem_stream_dump
}
gem_stream_restore_other_host() {
	GT=$(cat "$CASE_DIR/gt.pid")
	gem_stream_restore "$CASE_DIR/restore.log"
	log_has "$CASE_DIR/restore.log" 'GPU 0x3f2c \(renderD128\) -> host GPU 0x(51e7|a0c4) \(renderD13[01]\)' \
		"amdgpu: pid $GT: GPU queues resumed"
	gem_finish
}
# gem_stream_dump: gem-test dumped with --stream into $CASE_DIR/img.stream (image directory
# $CASE_DIR/dir); the stream must hold the render image and its GEM BOs' pages file.
gem_stream_dump() {
	local dir=$CASE_DIR/dir sizes
	stream_dump_ok "$GT" "$dir" "$CASE_DIR/img.stream"
	wait_gone "$GT" 5 || fail "gem-test $GT still runs after the dump"
	log_has "$dir/dump.log" "amdgpu: pid $GT: render node /dev/dri/renderD12[89] \(file [0-9]+\): 3 GEM BO\(s\) saved \(handles 1, 3-4\)"
	sizes=$(streamer list "$CASE_DIR/img.stream" | grep '^amdgpu-')
	local rid
	rid=$(sed -n 's/^amdgpu-renderD-\([0-9]*\)\.img .*/\1/p' <<<"$sizes" | head -n 1)
	[ -n "$rid" ] && grep -q "^amdgpu-pages-$rid-" <<<"$sizes" && grep -q '^amdgpu-digests.img ' <<<"$sizes" ||
		fail "the stream lacks the render image or its GEM pages file: $(paste -sd' ' <<<"$sizes")"
}
# gem_stream_restore LOG: gem-test restored from $CASE_DIR/img.stream; it must pass a round.
gem_stream_restore() {
	stream_restore "$CASE_DIR/dir" "$CASE_DIR/img.stream" "$1" ||
		fail "criu-rocm restore --stream of gem-test $GT failed: $(log_errors "$1")"
	alive "$GT" || fail "after the restore gem-test $GT does not run: $(gem_reason)"
	log_has "$1" "GEM BO\(s\) restored with handles 1, 3-4: created in ascending handle order, $GEM_PLACEHOLDER"
	served_once "$CASE_DIR/dir"
	gem_round 1
	note "$(grep -a -m1 -o 'GEM BO(s) restored with handles.*' "$1")"
}

# A stream damaged in the render image, then in the GEM BOs' pages file: the restore refuses
# the first before any task exists (amdgpu-digests.img), and fails the second before any
# task runs (a BO's content hash, checked as the pages are read), naming the file; the
# undamaged stream restores afterwards.
case_gem_stream_damaged() { on mi100 -- gem_stream_damaged; }
gem_stream_damaged() {
	local dir=$CASE_DIR/dir what
	gem_start
	gem_stream_dump
	for what in amdgpu-renderD- amdgpu-pages-; do
		cp "$CASE_DIR/img.stream" "$CASE_DIR/bad.stream"
		flip_in_stream "$CASE_DIR/bad.stream" "$what" || fail "no $what file in the stream"
		if stream_restore "$dir" "$CASE_DIR/bad.stream" "$dir/restore-$what.log"; then
			fail "a stream with a damaged $what file restored"
		fi
		wait_gone "$GT" 5 || fail "the refused restore left $GT running"
		no_leftovers "damaged $what"
	done
	# The flipped byte breaks the message (refused as it is decoded) or a field (refused by
	# its digest).
	log_has "$dir/restore-amdgpu-renderD-.log" "amdgpu: amdgpu-renderD-[0-9]+\.img: " \
		"the GPU images cannot be restored \(no task was created, no GPU device opened\)"
	log_has "$dir/restore-amdgpu-pages-.log" "restoring the GEM BOs of render node /dev/dri/renderD128 \(file [0-9]+\): .*amdgpu-pages-[0-9]+-[0-9a-f]+\.img"
	gem_stream_restore "$dir/restore.log"
	gem_finish
	note "render image: $(grep -a -m1 -oE 'amdgpu-renderD-[0-9]+\.img: .*' "$dir/restore-amdgpu-renderD-.log"); pages: $(grep -a -m1 -oE 'amdgpu-pages-[0-9]+-[0-9a-f]+\.img: .*' "$dir/restore-amdgpu-pages-.log")"
}

# gem_pages DIR: the GEM BOs' pages file of DIR (the render image's), one path.
gem_pages() {
	local rid
	rid=$(cd "$1" && ls amdgpu-renderD-*.img | head -n 1 | sed 's/amdgpu-renderD-\([0-9]*\)\.img/\1/')
	[ -n "$rid" ] || fail "$1 holds no render image"
	ls "$1"/amdgpu-pages-"$rid"-*.img 2>/dev/null | head -n 1
}
# gem_rewrite N: SIGUSR2; gem-test rewrites the next sixteenth of its --big BO ("rewrote N").
gem_rewrite() {
	local i
	kill -USR2 "$GT" || fail "cannot signal gem-test $GT"
	for ((i = 0; i < 600; i++)); do
		grep -q "^rewrote $1\$" "$CASE_DIR/gt.out" && return 0
		sleep 0.05
	done
	fail "gem-test did not rewrite a sixteenth of its --big BO: $(gem_reason)"
}
GEM_BIG_HANDLES='1, 3-5'

# A mostly-zero GEM BO (gem-test --big 32 --sparse: one page of 32 MiB written) is written
# as holes: its pages file takes a small part of its size on disk; it restores byte-exact.
case_gem_sparse_holes() { on mi100 -- gem_sparse_holes; }
gem_sparse_holes() {
	local img=$CASE_DIR/img pages size disk
	gem_start --big 32 --sparse
	dump "$GT" "$img" || fail "criu-rocm dump of gem-test $GT failed: $(log_errors "$img/dump.log")"
	wait_gone "$GT" 5 || fail "gem-test $GT still runs after the dump"
	log_has "$img/dump.log" "GEM BO\(s\) saved \(handles $GEM_BIG_HANDLES\)"
	pages=$(gem_pages "$img")
	size=$(stat -c %s "$pages")
	disk=$(du -B1 "$pages" | cut -f1)
	[ "$size" -gt $((32 << 20)) ] && [ "$disk" -lt $((size / 8)) ] ||
		fail "the GEM pages file of a mostly-zero 32 MiB BO is $size bytes, $disk on disk: not holes"
	restore "$img" "$img/restore.log" || fail "criu-rocm restore of gem-test $GT failed: $(log_errors "$img/restore.log")"
	log_has "$img/restore.log" "GEM BO\(s\) restored with handles $GEM_BIG_HANDLES"
	gem_round 1
	gem_finish
	note "GEM pages file of $size bytes, $disk on disk"
}

# pre-dump -> dump chain of GEM BOs (gem-test --hold --big 32: 32 MiB written, handle 5):
# the pre-dump saves the render file's GEM BOs while gem-test runs; a sixteenth of the big
# BO is rewritten; the dump with --prev-images-dir (and --leave-running) writes only the
# changed extents (its GEM pages take at most a quarter of the pre-dump's on disk) and
# records the parent; restore and gpu-check follow the chain and gem-test finds every byte.
# Refused by gpu-check and the restore alike, before any task exists: the parent missing,
# a mismatched parent (a pre-dump taken after one more sixteenth changed), and a damaged
# byte of the parent's GEM pages file. With ARG zstd: both compressed (KFD_COMPRESS).
case_gem_predump_chain() { on mi100 -- gem_predump_chain; }
case_gem_predump_chain_compressed() { on mi100 -- gem_predump_chain zstd; }
gem_predump_chain() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img later=$CASE_DIR/later knob=() pb ib line pp out_size
	[ "${1-}" = zstd ] && knob=(--gpu-knob KFD_COMPRESS=zstd)
	gem_start --big 32
	cp "$CASE_DIR/gt.pid" "$CASE_DIR/wl.pid"
	gem_pre_dump "$pre" "${knob[@]}"
	gem_round 1
	gem_rewrite 1
	dump "$GT" "$img" --leave-running --prev-images-dir ../pre "${knob[@]}" ||
		fail "criu-rocm dump --prev-images-dir of gem-test $GT failed: $(log_errors "$img/dump.log")"
	line=$(grep -a -m1 -oE "render node /dev/dri/renderD128 \(file [0-9]+\): incremental GPU dump against parent/amdgpu-renderD-[0-9]+\.img: .*" "$img/dump.log") ||
		fail "the dump says nothing of the GEM BOs' parent: $(log_errors "$img/dump.log")"
	pp=$(gem_pages "$pre")
	pb=$(du -B1 "$pp" | cut -f1)
	ib=$(du -B1 "$(gem_pages "$img")" | cut -f1)
	[ "$ib" -le $((pb / 4)) ] || fail "the incremental dump's GEM pages take $ib bytes of disk, the pre-dump's $pb"
	[ "${1-}" != zstd ] || [ "$(stat -c %s "$pp")" -lt $((4 << 20)) ] ||
		fail "the pre-dump's GEM pages file ($(stat -c %s "$pp") bytes for 32 MiB of a repeating pattern) is not compressed"
	# A later state (one more sixteenth rewritten), then gem-test ends for the restores; its
	# output file back to its size at the dump (CRIU checks it).
	out_size=$(stat -c %s "$CASE_DIR/gt.out")
	gem_rewrite 2
	gem_pre_dump "$later" "${knob[@]}"
	kill -KILL "$GT"
	wait_gone "$GT" 5 || fail "gem-test $GT did not end on SIGKILL"
	truncate -s "$out_size" "$CASE_DIR/gt.out"
	gem_gpu_check_ok "$img"
	mv "$pre" "$pre.away"
	refused_alike "$img" "the parent moved away" "parent/: missing: the images take unchanged GPU memory"
	mv "$pre.away" "$pre"
	ln -sfn ../later "$img/parent"
	refused_alike "$img" "the parent link pointing at a later pre-dump" \
		"parent/amdgpu-renderD-[0-9]+\.img: GPU 0x[0-9a-f]+: bo_entries\[3\]\.content_extent_xxh3\[1\]: is [0-9a-f]+, but"
	ln -sfn ../pre "$img/parent"
	cp "$pp" "$CASE_DIR/pages.bak"
	printf '\x5a' | dd of="$pp" bs=1 seek=$(($(stat -c %s "$pp") / 2)) conv=notrunc status=none
	cmp -s "$pp" "$CASE_DIR/pages.bak" && fail "the damage left $pp as it was"
	gem_damaged_parent "$img"
	cp "$CASE_DIR/pages.bak" "$pp"
	gem_gpu_check_ok "$img"
	restore "$img" "$img/restore.log" || fail "criu-rocm restore of gem-test $GT from the chain failed: $(log_errors "$img/restore.log")"
	alive "$GT" || fail "after the restore gem-test $GT does not run: $(gem_reason)"
	log_has "$img/restore.log" "GEM BO\(s\) restored with handles $GEM_BIG_HANDLES"
	gem_round 2
	gem_finish
	note "GEM pages on disk: pre-dump $pb bytes, incremental dump $ib bytes; ${line#*: incremental GPU dump against }"
}
# gem_gpu_check_ok DIR: gpu-check must find DIR restorable here.
gem_gpu_check_ok() {
	gpu_check "$1"
	[ "$GC_RC" = 0 ] || fail "gpu-check says $1 cannot be restored here (exit $GC_RC): $(paste -sd' ' <<<"$GC_OUT")"
}
# gem_pre_dump DIR [ARG...]: a pre-dump of gem-test $GT into DIR; it runs on, its four GEM
# BOs saved.
gem_pre_dump() {
	local dir=$1
	shift
	pre_dump "$GT" "$dir" "$@" || fail "criu-rocm pre-dump of gem-test $GT failed: $(log_errors "$dir/pre-dump.log")"
	alive "$GT" || fail "the pre-dump did not leave gem-test $GT running"
	log_has "$dir/pre-dump.log" "amdgpu: pid $GT: render node /dev/dri/renderD128 \(file [0-9]+\): 4 GEM BO\(s\) saved \(handles $GEM_BIG_HANDLES\)"
	[ -e "$dir/amdgpu-digests.img" ] && [ ! -e "$dir/$INCOMPLETE" ] || fail "the pre-dump's images in $dir are incomplete"
	guardian_gone "the GEM pre-dump"
}
# gem_damaged_parent IMG: a byte of the parent's GEM pages file changed. A plain pages file is
# read as the restore copies (a BO hash mismatch, before any task runs); gpu-check reads every
# byte; a compressed one's damage is in a frame.
gem_damaged_parent() {
	gpu_check "$1"
	[ "$GC_RC" != 0 ] || fail "gpu-check accepted a chain whose parent's GEM pages changed: $(paste -sd' ' <<<"$GC_OUT")"
	grep -q "NOT restorable here: .*amdgpu-pages-" <<<"$GC_OUT" ||
		fail "gpu-check's refusal of the damaged parent does not name a pages file: $(paste -sd' ' <<<"$GC_OUT")"
	restore_fails "$1" "$GT" "a byte of the parent's GEM pages file changed"
	grep -aq "amdgpu-pages-[0-9]*-[0-9a-f]*\.img" "$LAST_RESTORE_LOG" ||
		fail "the restore's refusal of the damaged parent does not name a pages file: $(log_errors "$LAST_RESTORE_LOG" 3)"
	note "damaged parent: $(grep -m1 -o 'NOT restorable here: .*' <<<"$GC_OUT")"
}

# A BO held by two files of one GPU (review item G3, issue 29): test/rocm/shared-bo.c, under
# `kfd-emu supervise` (which hands out the dma-buf fd), exports a VRAM BO and imports the
# dma-buf on a second open of renderD128: amdgpu gives the same BO back, not an import, so
# both holders list it at one mmap offset. Two render files (a GEM BO exported with PRIME) and
# KFD with a render file (a KFD BO exported with EXPORT_DMABUF). The dump saves the BO once
# and records the second holder as "the same BO as" the first; the restore (under `kfd-emu
# supervise`, which hands out the dma-bufs of the restored BOs) creates it once and imports
# it into the second holder: a write through the first holder's mapping reads back through
# the second's. On the same host, and with KFD on another (other gpu_ids and render minors:
# a render file without a KFD process keeps its GPU, which the other host lacks).
case_gem_shared_bo_cr() { on mi100 -- shared_bo_cr; }
case_kfd_shared_bo_cr() { on mi100 -- shared_bo_cr --kfd; }
shared_bo_cr() {
	shared_bo_dump "$@"
	shared_bo_restore
}
case_kfd_shared_bo_cr_other_host() {
	on mi100x2 -- shared_bo_dump --kfd
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- shared_bo_restore
}
# shared_bo_dump [--kfd]: the dump saves the BO once, the second render file's as the first
# holder's; shared-bo's pid in $CASE_DIR/sb.pid.
shared_bo_dump() {
	local img=$CASE_DIR/img pid first
	first=$(shared_bo_first "$@")
	pid=$(shared_bo_start "$CASE_DIR/sb.out" --hold "$@") || exit 1
	echo "$pid" >"$CASE_DIR/sb.pid"
	mkdir -p "$img"
	dump "$pid" "$img" || fail "criu-rocm dump of shared-bo $pid failed: $(log_errors "$img/dump.log")"
	wait_gone "$pid" 5 || fail "shared-bo $pid still runs after the dump"
	log_has "$img/dump.log" "amdgpu: pid $pid: render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1: the same BO as pid $pid: $first \(saved once, restored by importing it\)"
}
# shared_bo_restore: under the supervisor; the BO is imported into the second holder.
shared_bo_restore() {
	shared_bo_restore_checking 'GEM BO\(s\) restored with handles 1' 'the same BO as .* (saved'
}
# shared_bo_restore_checking RESTORED NOTED: shared-bo's images restored under the supervisor,
# the restore log matching RESTORED (@PID@ stands for the process' pid), a round and the end
# checked; NOTED picks the dump log's line the case notes.
shared_bo_restore_checking() {
	local img=$CASE_DIR/img log=$CASE_DIR/img/restore.log pid
	pid=$(cat "$CASE_DIR/sb.pid")
	gpu_check "$img"
	[ "$GC_RC" = 0 ] || fail "gpu-check says the images cannot be restored here (exit $GC_RC): $(paste -sd' ' <<<"$GC_OUT")"
	"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore.log -v4 -d >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "criu-rocm restore of shared-bo $pid failed: $(log_errors "$log")"
	log_has "$log" "${1//@PID@/$pid}"
	round_and_end shared-bo "$pid" "$CASE_DIR/sb.out" "the restore"
	note "$(grep -a -m1 -o "$2" "$img/dump.log" | cut -c1-200)"
}

# A pre-dump → dump chain of a BO held by two files (issue 29): the pre-dump records the
# second holder as "the same BO as" the first, as the dump does (a KFD first holder by the
# image its pid names), so it saves the BO once and its own validation accepts it; the dump
# with --prev-images-dir, the BO unchanged, leaves its bytes to the first holder's image in
# the pre-dump. The restore (under the supervisor) takes them from there: the BO holds the
# last pattern written before the pre-dump, and a write through one holder reads back
# through the other.
case_gem_shared_bo_predump_cr() { on mi100 -- shared_bo_predump_cr; }
case_kfd_shared_bo_predump_cr() { on mi100 -- shared_bo_predump_cr --kfd; }
shared_bo_predump_cr() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img pid line first parent='amdgpu-renderD-[0-9]+\.img'
	local what="render node /dev/dri/renderD128 \(file [0-9]+\)"
	first=$(shared_bo_first "$@")
	[ "${1-}" = --kfd ] && parent='amdgpu-kfd-[0-9]+\.img' && what=
	pid=$(shared_bo_start "$CASE_DIR/sb.out" --hold "$@") || exit 1
	echo "$pid" >"$CASE_DIR/sb.pid"
	pre_dump "$pid" "$pre" || fail "criu-rocm pre-dump of shared-bo $pid failed: $(log_errors "$pre/pre-dump.log")"
	alive "$pid" || fail "the pre-dump did not leave shared-bo $pid running"
	[ -e "$pre/amdgpu-digests.img" ] && [ ! -e "$pre/$INCOMPLETE" ] || fail "the pre-dump's images in $pre are incomplete"
	log_has "$pre/pre-dump.log" "amdgpu: pid $pid: render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1: the same BO as pid $pid: $first \(saved once"
	guardian_gone "the pre-dump of shared-bo"
	mkdir -p "$img"
	dump "$pid" "$img" --prev-images-dir ../pre ||
		fail "criu-rocm dump --prev-images-dir of shared-bo $pid failed: $(log_errors "$img/dump.log")"
	wait_gone "$pid" 5 || fail "shared-bo $pid still runs after the dump"
	log_has "$img/dump.log" "amdgpu: pid $pid: render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1: the same BO as pid $pid: $first \(saved once"
	line=$(grep -a -m1 -oE "amdgpu: pid $pid: ${what:+$what: }incremental GPU dump against parent/$parent: 0 B of 64\.0 KiB written, 64\.0 KiB unchanged left to the parent .*" "$img/dump.log") ||
		fail "the dump did not leave the shared BO's bytes to the pre-dump: $(grep -a 'incremental GPU dump\|parent images' "$img/dump.log" | head -n 3 | paste -sd'|')"
	shared_bo_restore
	note "${line#*: incremental GPU dump against }"
}
# shared_bo_first [--kfd]: the first holder of shared-bo's BO, as a dump log names it.
shared_bo_first() {
	if [ "${1-}" = --kfd ]; then
		echo 'fd [0-9]+ \(/dev/kfd\), BO 0 \(65536 bytes at GPU VA 0x[0-9a-f]+\)'
	else
		echo 'render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1 \(65536 bytes\)'
	fi
}

# One BO held by two processes (shared-bo --fork: a child imports the dma-buf on an open of
# its own, issue 29): the dump saves it once, with its first holder (the parent's render
# file), and records the child's render file as "the same BO as" that holder, with its pid.
# The restore of the parent hands a dma-buf of the restored BO to the child's restore
# (session/xproc.rs), which imports it at its handle: a write through the parent's mapping
# reads back through the child's. On the same host, and on another (other gpu_ids and render
# minors, the GPUs in the other order): neither process has KFD, so each render image records
# its GPU's topology entry, and every task places the dump's GPUs alike: both render files
# reopen the one host GPU the dump's renderD128 is matched to, and the BO is of it.
case_gem_shared_bo_two_procs_cr() { on mi100 -- shared_bo_two_procs_cr; }
shared_bo_two_procs_cr() {
	shared_bo_two_procs_dump "$CASE_DIR/img"
	shared_bo_two_procs_restore
}
case_gem_shared_bo_two_procs_cr_other_host() {
	on mi100x2 -- shared_bo_two_procs_dump "$CASE_DIR/img"
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- shared_bo_two_procs_restore_other_host
}
shared_bo_two_procs_restore_other_host() {
	local log=$CASE_DIR/img/restore.log pid child line
	read -r pid child <"$CASE_DIR/sb.pids"
	gpu_check "$CASE_DIR/img"
	[ "$GC_RC" = 0 ] || fail "gpu-check says the images cannot be restored here (exit $GC_RC): $(paste -sd' ' <<<"$GC_OUT")"
	shared_bo_two_procs_restore
	# Both tasks' render files on one host GPU of the other host, not renderD128.
	line='render file [0-9]+: GPU 0x3f2c \(renderD128\) -> host GPU 0x(51e7|a0c4) \(renderD13[01]\): no KFD process of the task has it'
	log_has "$log" "amdgpu: pid $pid: $line" "amdgpu: pid $child: $line"
	[ "$(grep -aoE "$line" "$log" | sed 's/.*-> //' | sort -u | wc -l)" = 1 ] ||
		fail "the parent's and the child's render files went to different host GPUs: $(grep -aoE "$line" "$log" | paste -sd'|')"
	note "$(grep -a -m1 -oE "$line.*" "$log" | cut -c1-200)"
}
# shared_bo_two_procs_restore: the images of shared_bo_two_procs_dump restored under the
# supervisor, the BO handed from the parent to the child, both checked to their end.
shared_bo_two_procs_restore() {
	local img=$CASE_DIR/img log=$CASE_DIR/img/restore.log pid child
	read -r pid child <"$CASE_DIR/sb.pids"
	"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore.log -v4 -d >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "criu-rocm restore of shared-bo $pid and its child $child failed: $(log_errors "$log")"
	log_has "$log" "amdgpu: pid $pid: BO 0 of file [0-9]+ handed to the process that imports it"
	shared_bo_two_procs_end "$pid" "$child" "$CASE_DIR/sb.out" "the restore"
	note "$(grep -a -m1 -o "pid $child: render node .* the same BO as .* (saved" "$img/dump.log" | cut -c1-240)"
}
# shared_bo_two_procs_dump DIR [PRE]: shared-bo --fork dumped into DIR, the child's BO saved as
# the parent's; "PID CHILD" in $CASE_DIR/sb.pids. With PRE: pre-dumped into PRE first (the
# child's BO recorded the same way), and the dump, the BO unchanged, leaves its bytes to it.
shared_bo_two_procs_dump() {
	local img=$1 pre=${2-} pid child prev=()
	local holder='render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1 \(65536 bytes\)'
	shared_bo_two_procs_start
	read -r pid child <"$CASE_DIR/sb.pids"
	mkdir -p "$img"
	if [ -n "$pre" ]; then
		pre_dump "$pid" "$pre" || fail "criu-rocm pre-dump of shared-bo $pid and its child $child failed: $(log_errors "$pre/pre-dump.log")"
		alive "$pid" && alive "$child" || fail "the pre-dump did not leave shared-bo $pid and its child $child running"
		[ -e "$pre/amdgpu-digests.img" ] && [ ! -e "$pre/$INCOMPLETE" ] || fail "the pre-dump's images in $pre are incomplete"
		log_has "$pre/pre-dump.log" "amdgpu: pid $child: render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1: the same BO as pid $pid: $holder \(saved once"
		prev=(--prev-images-dir "../${pre##*/}")
	fi
	dump "$pid" "$img" "${prev[@]}" || fail "criu-rocm dump of shared-bo $pid and its child $child failed: $(log_errors "$img/dump.log")"
	wait_gone "$pid" 5 || fail "shared-bo $pid still runs after the dump"
	wait_gone "$child" 5 || fail "shared-bo's child $child still runs after the dump"
	log_has "$img/dump.log" "amdgpu: pid $child: render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1: the same BO as pid $pid: $holder \(saved once, restored by importing it\)"
	[ -z "$pre" ] || log_has "$img/dump.log" "amdgpu: pid $pid: render node /dev/dri/renderD128 \(file [0-9]+\): incremental GPU dump against parent/amdgpu-renderD-[0-9]+\.img: 0 B of 64\.0 KiB written, 64\.0 KiB unchanged left to the parent"
}
# shared_bo_two_procs_start: shared-bo --hold --fork (output in $CASE_DIR/sb.out) with its
# child holding the BO too; "PID CHILD" in $CASE_DIR/sb.pids.
shared_bo_two_procs_start() {
	local out=$CASE_DIR/sb.out pid child i
	pid=$(shared_bo_start "$out" --hold --fork) || exit 1
	for ((i = 0; i < 200; i++)); do
		grep -q '^child [0-9]* ok$' "$out" && break
		sleep 0.05
	done
	child=$(sed -n 's/^child \([0-9]*\) ok$/\1/p' "$out")
	[ -n "$child" ] || fail "shared-bo's child did not import the BO: $(grep -v '^ok ' "$out" | tail -n 3 | paste -sd'|')"
	echo "$pid $child" >"$CASE_DIR/sb.pids"
}
# The same through a pre-dump → dump chain: the restore takes the BO's bytes from the
# pre-dump's image of the parent's render file, and hands the BO to the child's restore.
case_gem_shared_bo_two_procs_predump_cr() { on mi100 -- shared_bo_two_procs_predump_cr; }
shared_bo_two_procs_predump_cr() {
	local img=$CASE_DIR/img log=$CASE_DIR/img/restore.log pid child
	shared_bo_two_procs_dump "$img" "$CASE_DIR/pre"
	read -r pid child <"$CASE_DIR/sb.pids"
	"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore.log -v4 -d >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "criu-rocm restore of shared-bo $pid and its child $child from the chain failed: $(log_errors "$log")"
	log_has "$log" "amdgpu: pid $pid: BO 0 of file [0-9]+ handed to the process that imports it"
	shared_bo_two_procs_end "$pid" "$child" "$CASE_DIR/sb.out" "the restore from the chain"
}
# usr1_round NAME PID OUT WHAT: the program NAME (shared-bo, dmabuf-map), PID, its output in
# OUT, answers a SIGUSR1 after WHAT with a round that says "round 1: ok".
usr1_round() {
	local name=$1 pid=$2 out=$3 what=$4
	kill -USR1 "$pid"
	await_line "$out" '^round 1: (ok|FAIL)' '^round 1: ok$' 200 || fail "$name after $what: $(grep -v '^ok ' "$out" | tail -n 2 | paste -sd'|')"
}

# shared_bo_two_procs_end PID CHILD OUT WHAT: after WHAT the parent writes a round through its
# first open and reads it through its second, the child reads it through its own open; both
# end on SIGTERM, the parent's last check passing.
shared_bo_two_procs_end() {
	local pid=$1 child=$2 out=$3 what=$4
	alive "$pid" || fail "shared-bo $pid is gone after $what"
	alive "$child" || fail "shared-bo's child $child is gone after $what"
	usr1_round shared-bo "$pid" "$out" "$what"
	kill -USR1 "$child"
	await_line "$out" '^(child reads round 1: ok|FAIL child)' '^child reads round 1: ok$' 200 ||
		fail "after $what the child does not read the parent's write: $(grep -a 'child' "$out" | tail -n 2 | paste -sd'|')"
	kill -TERM "$child"
	wait_gone "$child" 30 || fail "shared-bo's child $child did not end on SIGTERM"
	kill -TERM "$pid"
	wait_gone "$pid" 30 || fail "shared-bo $pid did not end on SIGTERM"
	tail -n 1 "$out" | grep -q '^PASS$' || fail "shared-bo's last check failed: $(tail -n 2 "$out" | paste -sd'|')"
}

# A kill point in the hand-over: the parent's restored task stops (the test hook) right after
# it handed its BO to the child's restore, and criu-rocm is killed (SIGKILL). Both tasks die
# with criu and never run their own code; the images are unchanged, and the next restore
# works.
case_gem_shared_bo_two_procs_restore_killed() { on mi100 -- shared_bo_two_procs_restore_killed; }
shared_bo_two_procs_restore_killed() {
	local img=$CASE_DIR/img before cpid pid child p st=
	shared_bo_two_procs_dump "$img"
	read -r pid child <"$CASE_DIR/sb.pids"
	before=$(img_sums "$img")
	CRIU_ROCM_TEST_STOP_ON_LOG="handed to the process that imports it" env --default-signal=HUP,INT,PIPE,TERM \
		"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore-killed.log -v4 -d >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	wait_stopped "$pid" "$cpid" || fail "the restored shared-bo $pid never stopped at its hand-over: $(log_errors "$img/restore-killed.log")"
	log_has "$img/restore-killed.log" "amdgpu: pid $pid: BO 0 of file [0-9]+ handed to the process that imports it"
	# `kfd-emu supervise` execs its command: $cpid is criu-rocm itself (its children named
	# criu* are the tasks it restores, not yet renamed).
	kill -KILL "$cpid"
	wait "$cpid"
	for p in "$pid" "$child"; do
		kill -CONT "$p" 2>/dev/null
		if ! wait_gone "$p" 5; then
			st=$(proc_state "$p")
			kill -KILL "$p"
			fail "the restored task $p outlived the killed criu-rocm (state $st; killed now)"
		fi
	done
	grep -aq "^round 1:\|^child reads" "$CASE_DIR/sb.out" && fail "the killed restore's shared-bo ran its own code"
	[ "$before" = "$(img_sums "$img")" ] || fail "the killed restore changed the images"
	"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore.log -v4 -d >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "the restore after the killed one failed: $(log_errors "$img/restore.log")"
	shared_bo_two_procs_end "$pid" "$child" "$CASE_DIR/sb.out" "the restore after a killed one"
}

# Builds test/rocm/shared-bo.c and starts it under `kfd-emu supervise` with ARGS, its output
# in OUT; prints its pid once it is ready.
shared_bo_start() {
	supervised_start "$top/test/rocm/shared-bo.c" "$@"
}
# supervised_start SRC OUT [ARG...]: builds the C program SRC (on libdrm) and starts it under
# `kfd-emu supervise` with ARGS, its output in OUT; prints the pid its "ready PID" line names.
supervised_start() {
	local src=$1 out=$2 prog i pid
	shift 2
	prog=$CASE_DIR/$(basename "$src" .c)
	# shellcheck disable=SC2046 # pkg-config prints several words on purpose
	cc -std=gnu11 -Wall -Wextra -Werror -O2 -o "$prog" "$src" \
		$(pkg-config --cflags --libs libdrm) 2>"$CASE_DIR/cc.log" ||
		fail "${src##*/} does not build: $(head -n 3 "$CASE_DIR/cc.log" | paste -sd' ')"
	setsid "$KFD_EMU" supervise -- "$prog" "$@" </dev/null >"$out" 2>&1 &
	for ((i = 0; i < 600; i++)); do
		grep -q '^ready [0-9]*' "$out" && break
		sleep 0.05
	done
	pid=$(sed -n 's/^ready \([0-9]*\).*$/\1/p' "$out")
	[ -n "$pid" ] || fail "${prog##*/} did not get ready: $(grep -v '^ok ' "$out" | tail -n 3 | paste -sd'|')"
	echo "$pid"
}

# round_and_end NAME PID OUT WHAT: the program NAME (shared-bo, dmabuf-map), PID, its output
# in OUT, runs on after WHAT: a round on SIGUSR1 says "round 1: ok", and its last check on
# SIGTERM PASS.
round_and_end() {
	local name=$1 pid=$2 out=$3 what=$4
	alive "$pid" || fail "$name $pid is gone after $what"
	usr1_round "$name" "$pid" "$out" "$what"
	kill -TERM "$pid"
	wait_gone "$pid" 30 || fail "$name $pid did not end on SIGTERM"
	tail -n 1 "$out" | grep -q '^PASS$' || fail "$name's last check failed: $(tail -n 2 "$out" | paste -sd'|')"
}

# A process holding a dma-buf fd (test/rocm/shared-bo.c --dmabuf: a GEM BO exported with
# PRIME, a KFD BO exported with EXPORT_DMABUF, the fd kept, as HIP IPC's exporter and PRIME
# clients do) under `kfd-emu supervise`. The fd is what the kernel's is to the process and to
# CRIU: its link reads /dmabuf: and no mount of it is visible. The dump recognises it (CRIU
# offers it to the plugins, patch 0040) as a BO the dump saves (imported into criu's own open
# of the node: the same BO, at the same mmap offset) and records which (amdgpu-dmabuf_<id>.img,
# criu-dev's message); the restore exports the restored BO again at the fd's number, after its
# holder's file (CRIU retries the dma-buf). The process checks after the restore that the fd
# still reads /dmabuf:, is close-on-exec and read-write, and is its BO: imported on the second
# open of the node it made at the start (which holds the BO: "the same BO as" the first) it is
# that open's handle, whose mapping reads what the first open wrote, and a GEM BO's dma-buf
# imported on the first open is its own handle. On the same host, and with KFD on another
# (other gpu_ids and render minors).
case_gem_dmabuf_fd_cr() { on mi100 -- dmabuf_fd_cr; }
# The same with the GEM BO exported read-only (shared-bo --dmabuf --rdonly: PRIME without
# DRM_RDWR; a writable shared mapping of the fd fails EACCES): the image's file_flags say
# O_RDONLY, the restore exports the BO again without DRM_RDWR and checks the fd's F_GETFL
# (its log names the mode), and the process finds the fd read-only after the restore, not
# read-write.
case_gem_dmabuf_fd_rdonly_cr() { on mi100 -- dmabuf_fd_rdonly_cr; }
case_kfd_dmabuf_fd_cr() { on mi100 -- dmabuf_fd_cr --kfd; }
case_kfd_dmabuf_fd_cr_other_host() {
	on mi100x2 -- dmabuf_fd_dump --kfd
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- dmabuf_fd_restore
}
dmabuf_fd_cr() {
	dmabuf_fd_dump "$@"
	dmabuf_fd_restore
}
dmabuf_fd_rdonly_cr() {
	dmabuf_fd_dump --rdonly
	shared_bo_restore_checking 'amdgpu: pid @PID@: dma-buf file [0-9]+: BO [0-9]+ of file [0-9]+: exported again \(O_RDONLY\)' \
		'fd [0-9]* (dma-buf.*saved as BO [0-9]* of'
}
# dmabuf_fd_dump [--kfd | --rdonly]: the dump saves the dma-buf as its BO's; pid in
# $CASE_DIR/sb.pid.
dmabuf_fd_dump() {
	local img=$CASE_DIR/img out=$CASE_DIR/sb.out pid fd link held='render node /dev/dri/renderD128 \(file [0-9]+\), GEM handle 1 \(65536 bytes\)'
	[ "${1-}" = --kfd ] && held='fd [0-9]+ \(/dev/kfd\), BO 0 \(65536 bytes at GPU VA 0x[0-9a-f]+\)'
	pid=$(shared_bo_start "$out" --dmabuf "$@") || exit 1
	echo "$pid" >"$CASE_DIR/sb.pid"
	fd=$(sed -n 's/^ready [0-9]* dmabuf \([0-9]*\)$/\1/p' "$out")
	link=$(readlink "/proc/$pid/fd/$fd") || fail "shared-bo $pid has no fd ${fd:-?}"
	[ "$link" = /dmabuf: ] || fail "the dma-buf fd $fd of shared-bo $pid reads $link, not /dmabuf:"
	mkdir -p "$img"
	dump "$pid" "$img" || fail "criu-rocm dump of shared-bo $pid failed: $(log_errors "$img/dump.log")"
	wait_gone "$pid" 5 || fail "shared-bo $pid still runs after the dump"
	log_has "$img/dump.log" "amdgpu: pid $pid: fd $fd \(dma-buf, file [0-9]+\) of a BO of GPU 0x[0-9a-f]+ \(/dev/dri/renderD128, mmap offset 0x[0-9a-f]+, 65536 bytes\): saved as BO [0-9]+ of pid $pid: $held"
	ls "$img"/amdgpu-dmabuf_*.img >/dev/null 2>&1 || fail "the dump wrote no amdgpu-dmabuf_*.img"
}
# dmabuf_fd_restore: under the supervisor; the fd is the restored BO's export.
dmabuf_fd_restore() {
	shared_bo_restore_checking 'amdgpu: pid @PID@: dma-buf file [0-9]+: BO [0-9]+ of file [0-9]+: exported again \(O_RDWR\)' \
		'fd [0-9]* (dma-buf.*saved as BO [0-9]* of'
}

# A kill point right after the dma-buf fd was recreated (the restored task stops at the test
# hook's log line, after its render file's GEM BO and the dma-buf exported again): criu-rocm
# is killed (SIGKILL); the task dies with criu and never runs its own code, the images are
# unchanged, and the next restore works.
case_gem_dmabuf_fd_restore_killed() { on mi100 -- dmabuf_fd_restore_killed; }
dmabuf_fd_restore_killed() {
	local img=$CASE_DIR/img log=$CASE_DIR/restore-killed.log before cpid pid st=
	dmabuf_fd_dump
	pid=$(cat "$CASE_DIR/sb.pid")
	before=$(img_sums "$img")
	CRIU_ROCM_TEST_STOP_ON_LOG="exported again" env --default-signal=HUP,INT,PIPE,TERM \
		"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o "$log" -v4 -d >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	wait_stopped "$pid" "$cpid" || fail "the restored shared-bo $pid never stopped after its dma-buf was recreated: $(log_errors "$log")"
	log_has "$log" "amdgpu: pid $pid: dma-buf file [0-9]+: BO [0-9]+ of file [0-9]+: exported again"
	kill -KILL "$cpid"
	wait "$cpid"
	kill -CONT "$pid" 2>/dev/null
	if ! wait_gone "$pid" 5; then
		st=$(proc_state "$pid")
		kill -KILL "$pid"
		fail "the restored shared-bo $pid outlived the killed criu-rocm (state $st; killed now)"
	fi
	grep -aq "^round 1:" "$CASE_DIR/sb.out" && fail "the killed restore's shared-bo ran its own code"
	[ "$before" = "$(img_sums "$img")" ] || fail "the killed restore changed the images"
	dmabuf_fd_restore
}

# A dma-buf whose BO no file of the dump holds (shared-bo --dmabuf --orphan: the GEM handle
# closed once exported, the dma-buf alone keeps the BO) cannot be restored by exporting its BO
# again: the dump fails naming the process, fd and why; the process runs on.
case_gem_dmabuf_fd_orphan_refused() { on mi100 -- dmabuf_fd_orphan_refused; }
dmabuf_fd_orphan_refused() {
	local img=$CASE_DIR/img out=$CASE_DIR/sb.out pid fd
	pid=$(shared_bo_start "$out" --dmabuf --orphan) || exit 1
	fd=$(sed -n 's/^ready [0-9]* dmabuf \([0-9]*\)$/\1/p' "$out")
	dump "$pid" "$img" && fail "the dump of shared-bo $pid succeeded although no file holds its dma-buf's BO"
	log_has "$img/dump.log" "amdgpu: pid $pid: fd $fd \(dma-buf, file [0-9]+\) of a BO of GPU 0x[0-9a-f]+ .*: no file this dump saves holds its BO"
	round_and_end shared-bo "$pid" "$out" "the refused dump"
	note "$(grep -a -m1 -o 'fd [0-9]* (dma-buf.*holds its BO' "$img/dump.log" | cut -c1-200)"
}

# A dma-buf fd of another process' BO, that process not in the dump (test/gpu/progs/
# dmabuf-peer.c: a parent's GEM BO exported, the dma-buf kept by its child alone; the child
# dumped): no file the dump saves holds the BO, so the dma-buf cannot be restored by exporting
# it again; the dump fails naming the process, fd and why, and the child runs on. (A dma-buf
# that is not a GPU's cannot be made here: this kernel has no udmabuf, no dma-buf heaps and no
# other exporter built in.)
case_gem_dmabuf_fd_peer_refused() { on mi100 -- dmabuf_fd_peer_refused; }
dmabuf_fd_peer_refused() {
	local img=$CASE_DIR/img out=$CASE_DIR/dp.out pid fd parent
	pid=$(supervised_start "$here/progs/dmabuf-peer.c" "$out") || exit 1
	# Both from the line supervised_start waited for (the child writes it once forked).
	fd=$(sed -n 's/^ready [0-9]* dmabuf \([0-9]*\) parent [0-9]*$/\1/p' "$out")
	parent=$(sed -n 's/^ready [0-9]* dmabuf [0-9]* parent \([0-9]*\)$/\1/p' "$out")
	[ -n "$fd" ] && [ -n "$parent" ] || fail "dmabuf-peer's ready line names no dma-buf fd or parent: $(grep -a '^ready' "$out")"
	alive "$parent" || fail "dmabuf-peer's parent $parent is gone before the dump"
	dump "$pid" "$img" && fail "the dump of dmabuf-peer's child $pid succeeded although its dma-buf's BO is its parent's"
	log_has "$img/dump.log" "amdgpu: pid $pid: fd $fd \(dma-buf, file [0-9]+\) of a BO of GPU 0x[0-9a-f]+ .*: no file this dump saves holds its BO"
	alive "$pid" || fail "dmabuf-peer's child $pid is gone after the refused dump"
	kill -USR1 "$pid"
	await_line "$out" '^(alive 1|FAIL)' '^alive 1$' 200 || fail "after the refused dump: $(tail -n 2 "$out" | paste -sd'|')"
	kill -TERM "$pid" "$parent"
	wait_gone "$pid" 30 && wait_gone "$parent" 30 || fail "dmabuf-peer did not end on SIGTERM"
	tail -n 1 "$out" | grep -q '^PASS$' || fail "dmabuf-peer's child's last check failed: $(tail -n 2 "$out" | paste -sd'|')"
	note "$(grep -a -m1 -o 'fd [0-9]* (dma-buf.*holds its BO' "$img/dump.log" | cut -c1-200)"
}

# Kill points in the dump of a dma-buf fd (after its image was made: "saved as BO") and of a
# BO held twice (after the second holder was found the first's: "the same BO as"), in one
# process and across a parent and child: criu-rocm killed (SIGKILL) there leaves the
# processes running (a KFD process' GPU unpaused by the GPU guardian), the images marked
# incomplete; the processes pass a round through every holder and their last checks.
case_gem_dmabuf_fd_dump_killed() { on mi100 -- dmabuf_fd_dump_killed; }
case_kfd_dmabuf_fd_dump_killed() { on mi100 -- dmabuf_fd_dump_killed --kfd; }
dmabuf_fd_dump_killed() {
	local img=$CASE_DIR/img-killed pid
	pid=$(shared_bo_start "$CASE_DIR/sb.out" --dmabuf "$@") || exit 1
	dump_killed "$pid" "$img" "): saved as BO " KILL
	log_has "$img/dump.log" "amdgpu: pid $pid: fd [0-9]+ \(dma-buf, file [0-9]+\) .*: saved as BO"
	killed_dump_left "$img" "the dma-buf was saved" "$pid" "$@"
	round_and_end shared-bo "$pid" "$CASE_DIR/sb.out" "the killed dump"
}
case_kfd_shared_bo_dump_killed() { on mi100 -- shared_bo_dump_killed; }
shared_bo_dump_killed() {
	local img=$CASE_DIR/img-killed pid
	pid=$(shared_bo_start "$CASE_DIR/sb.out" --hold --kfd) || exit 1
	dump_killed "$pid" "$img" "the same BO as pid" KILL
	log_has "$img/dump.log" "amdgpu: pid $pid: render node .*: the same BO as pid $pid"
	killed_dump_left "$img" "the shared BO was found" "$pid" --kfd
	round_and_end shared-bo "$pid" "$CASE_DIR/sb.out" "the killed dump"
}
case_gem_shared_bo_two_procs_dump_killed() { on mi100 -- shared_bo_two_procs_dump_killed; }
shared_bo_two_procs_dump_killed() {
	local img=$CASE_DIR/img-killed pid child
	shared_bo_two_procs_start
	read -r pid child <"$CASE_DIR/sb.pids"
	# The child's first line of its render file is its "same BO as" one.
	dump_killed "$pid" "$img" "amdgpu: pid $child: render node" KILL
	log_has "$img/dump.log" "amdgpu: pid $child: render node .*: the same BO as pid $pid"
	killed_dump_left "$img" "the child's BO was found the parent's" "$pid" "$child"
	shared_bo_two_procs_end "$pid" "$child" "$CASE_DIR/sb.out" "the killed dump"
}

# A process mapping the dma-buf of its KFD BO (test/rocm/dmabuf-map.c, exported with
# EXPORT_DMABUF) under `kfd-emu supervise`: every mapping it makes is the BO's memory (a write
# through one mapping is read through the other, both ways). Dumped while it holds no such
# mapping, restored under the supervisor (which the dma-buf fd's export needs) left stopped,
# and attached again (`supervise --attach`: the restore's own listener is released, which
# seccomp would otherwise refuse with EBUSY), its rounds map the dma-buf exported again onto
# the restored BO. Holding a mapping of it, criu-rocm refuses the dump (the mapping is not
# saved yet) and the process runs on.
case_kfd_dmabuf_map_cr() { on mi100 -- dmabuf_map_cr; }
case_kfd_dmabuf_map_held_refused() { on mi100 -- dmabuf_map_held_refused; }
# dmabuf_map_start OUT [--hold]: builds and starts dmabuf-map; prints its pid once ready.
dmabuf_map_start() {
	supervised_start "$top/test/rocm/dmabuf-map.c" "$@"
}
dmabuf_map_cr() {
	local img=$CASE_DIR/img out=$CASE_DIR/dm.out pid
	pid=$(dmabuf_map_start "$out") || exit 1
	dump "$pid" "$img" || fail "criu-rocm dump of dmabuf-map $pid failed: $(log_errors "$img/dump.log")"
	wait_gone "$pid" 5 || fail "dmabuf-map $pid still runs after the dump"
	"$KFD_EMU" supervise -- "$CRIU" restore -D "$img" -o restore.log -v4 -d --leave-stopped \
		>>"$CASE_DIR/criu.out" 2>&1 || fail "criu-rocm restore of dmabuf-map $pid failed: $(log_errors "$img/restore.log")"
	"$KFD_EMU" supervise --attach "$pid" >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "supervise --attach $pid: $(tail -n 1 "$CASE_DIR/criu.out")"
	kill -CONT "$pid"
	round_and_end dmabuf-map "$pid" "$out" "the restore"
}
# Held: criu-rocm refuses the dump itself at the pause, before CRIU reads any memory (CRIU
# would take the mapping for shared memory and fail at /proc/PID/map_files, naming neither
# the dma-buf nor why). Its refusal is the dump's first error and names the process, the
# mapping's range, the dma-buf's fd and the BO's GPU; nothing of the process was paused (no
# GPU guardian stays), the images are marked incomplete, and the process runs on and passes
# a round.
dmabuf_map_held_refused() {
	local img=$CASE_DIR/img out=$CASE_DIR/dm.out pid map first re
	pid=$(dmabuf_map_start "$out" --hold) || exit 1
	map=$(awk '$6 == "/dmabuf:" { print $1 }' "/proc/$pid/maps")
	[ "$(wc -w <<<"$map")" = 1 ] || fail "dmabuf-map $pid holds not one mapping of its dma-buf but: ${map:-none}"
	dump "$pid" "$img" && fail "the dump of dmabuf-map $pid succeeded although it holds a mapping of its dma-buf"
	re="amdgpu: pid $pid: a CPU mapping $map \(rw-s\) of dma-buf fd [0-9]+ \(a BO of GPU 0x[0-9a-f]+, /dev/dri/renderD128, mmap offset 0x[0-9a-f]+, 65536 bytes\) is held: criu-rocm cannot restore a dma-buf mapping yet .*unmap it before the checkpoint"
	first=$(grep -a -E "Error|amdgpu: pid $pid: a CPU mapping" "$img/dump.log" | grep -v RLIMIT_NOFILE | head -n 1)
	grep -qE "$re" <<<"$first" ||
		fail "the dump of dmabuf-map $pid failed, but not first at criu-rocm's refusal of its dma-buf mapping $map: ${first:-no error line}"
	! grep -aqE "Handling VMA|amdgpu: pid $pid: GPU queues paused|GPU guardian started" "$img/dump.log" ||
		fail "the dump of dmabuf-map $pid went on past its refusal: $(grep -a -m1 -E "Handling VMA|GPU queues paused|GPU guardian started" "$img/dump.log")"
	[ -f "$img/$INCOMPLETE" ] || fail "the refused dump's images are not marked incomplete: $(ls "$img" | paste -sd' ')"
	guardian_gone "the refused dump"
	round_and_end dmabuf-map "$pid" "$out" "the refused dump"
	note "$(grep -a -m1 -oE "amdgpu: pid $pid: a CPU mapping .*" "$img/dump.log" | cut -c1-200)"
}

# What a render file holds that criu-rocm cannot save fails the dump closed, naming the
# process, render node, file and what it holds; the process runs on and passes a round:
# a submission context (gem-test --ctx; contexts, fences and BO lists are not saved); a
# kernel that cannot list GEM objects (before 6.18: GEM_LIST_HANDLES answers EINVAL) and a
# file with one; a BO still in use by a submission after the dump's wait (GEM_WAIT_IDLE
# reports it busy at the deadline).
case_gem_dump_ctx_refused() { on mi100 -- gem_dump_refused "1 amdgpu submission context\(s\) \(ids 1\)" --ctx; }
# The context probes' fallback: with every probe worker ending without a report (the test
# hook), each render file's dump probes the file itself and comes to the same answer: the
# held context still refused by name, and a KFD process' render files dumped and restored.
case_gem_dump_ctx_probe_fallback() { on mi100 -- gem_probe_fallback; }
gem_probe_fallback() {
	local img=$CASE_DIR/img-kfd
	export CRIU_ROCM_TEST_PROBE_WORKER_SILENT=1
	gem_dump_refused "1 amdgpu submission context\(s\) \(ids 1\)" --ctx
	log_has "$CASE_DIR/img/dump.log" "the context probe worker \(pid [0-9]+\) gave no whole report"
	wl_cr_saying "$img" "the context probe worker \(pid [0-9]+\) gave no whole report .*probed again"
}

# wl_cr_saying IMG RE: a small gpu-workload (2 BOs, its render files) dumped into IMG, whose
# dump log must match RE, restored and its bytes checked.
wl_cr_saying() {
	local img=$1 re=$2 v0 v1
	wl_start wl --mib 2 --bos 2
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img"
	log_has "$img/dump.log" "$re"
	restore_ok "$img" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
}
case_gem_dump_no_list_refused() {
	# gem-test's own first call (its check before "ready") is let through, the dump's fails.
	on mi100 --fail GEM_LIST_HANDLES:EINVAL:1:1 -- gem_dump_refused "GEM handle 1, and this kernel cannot list its GEM objects"
}
case_gem_dump_busy_refused() {
	on mi100 --fail GEM_WAIT_IDLE:ETIME -- gem_dump_refused "GEM handle 1 \(65536 bytes\) is still in use by a command submission after 10 s"
}
gem_dump_refused() {
	local img=$CASE_DIR/img what=$1
	shift
	gem_start "$@"
	dump "$GT" "$img" && fail "the dump succeeded although gem-test's render file holds what is not saved"
	log_has "$img/dump.log" "amdgpu: pid $GT: render node /dev/dri/renderD128 \(file [0-9]+\):? .*$what.*not dumping what could not be restored"
	alive "$GT" || fail "gem-test $GT is gone after the refused dump"
	gem_round 1
	gem_finish
	note "$(grep -a -m1 -oE "$what[^;]*" "$img/dump.log")"
}

# Before 6.18 a render file without GEM objects still dumps and restores: a KFD process'
# render files (which hold none: KFD's BOs have no GEM handles) are probed, handle by handle.
case_gem_no_list_kfd_only() { on mi100 --fail GEM_LIST_HANDLES:EINVAL -- gem_no_list_kfd_only; }
gem_no_list_kfd_only() {
	wl_cr_saying "$CASE_DIR/img" "render node /dev/dri/renderD128 \(file [0-9]+\): the kernel cannot list GEM objects .*handles 1-4095 are free, so the file holds none"
}

# A kill point inside the GEM objects' recreation: the restored task stops (the test hook)
# right after it recreated its render file's GEM objects, before their GPU mappings and
# bytes, and criu-rocm is killed (SIGKILL); the task, let go, dies with criu (a render-only
# restore ties its tasks to criu as a KFD one does) and never runs its own code. The images
# are unchanged, and the next restore works.
case_gem_restore_killed() { on mi100 -- gem_restore_killed; }
gem_restore_killed() {
	local img=$CASE_DIR/img log=$CASE_DIR/restore-killed.log before cpid st=
	gem_start
	gem_dump "$img"
	before=$(img_sums "$img")
	CRIU_ROCM_TEST_STOP_ON_LOG="GEM object(s) recreated" env --default-signal=HUP,INT,PIPE,TERM \
		"$CRIU" restore -D "$img" -o "$log" -v4 -d >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	wait_stopped "$GT" "$cpid" || fail "the restored gem-test $GT never stopped in its GEM recreation: $(log_errors "$log")"
	log_has "$log" "amdgpu: pid $GT: render node /dev/dri/renderD128 \(file [0-9]+\): 3 GEM object\(s\) recreated"
	grep -aq "GEM BO(s) restored" "$log" && fail "the restore went past the kill point"
	kill -KILL "$cpid"
	wait "$cpid"
	# The task dies with criu (its parent-death signal), stopped or not; let go, it must not
	# run its own code. Its pid stays taken while init reaps it.
	kill -CONT "$GT" 2>/dev/null
	if ! wait_gone "$GT" 5; then
		st=$(proc_state "$GT")
		kill -KILL "$GT"
		fail "the restored gem-test $GT outlived the killed criu-rocm (state $st; killed now)"
	fi
	grep -aq "^round 1:" "$CASE_DIR/gt.out" && fail "the killed restore's gem-test ran its own code"
	[ "$before" = "$(img_sums "$img")" ] || fail "the killed restore changed the images"
	gem_restore "$img" "$GEM_PLACEHOLDER"
	gem_finish
}

# The dump's own validation refuses its images (issue 25; the test hook lowers
# vm.max_map_count to 8, fewer than the process' VMAs): the dump fails before the
# process is killed, which runs on with its GPU unpaused and its memory intact; the image
# directory stays marked incomplete, with the reason, and restore and gpu-check refuse it.
# Refused the same way under --leave-running (the dump must not report success for images
# its restore refuses). The same process is then dumped without the hook, restored and
# verified byte-exact.
case_fault_dump_refused_by_validation() { on mi100x2 -- fault_dump_refused_by_validation; }
fault_dump_refused_by_validation() {
	local img=$CASE_DIR/img img2=$CASE_DIR/img2 img3=$CASE_DIR/img-leave-running v0 v1 log re
	wl_start wl --mib 2 --bos 2 --events
	v0=$(wl_verify "$WL") || exit 1
	CRIU_ROCM_TEST_MAX_MAP_COUNT=8 dump "$WL" "$img" && fail "the dump succeeded although its validation refuses mm-$WL.img"
	re="mm-$WL\\.img: vmas: [0-9]+ VMAs, more than the 8 a process can have \\(CRIU_ROCM_TEST_MAX_MAP_COUNT\\)"
	log_has "$img/dump.log" "amdgpu: $re"
	log_has "$img/dump.log" "the restore would refuse these images \(above\); the dump fails and the process keeps running"
	log_has "$img/dump.log" "amdgpu: pid $WL: GPU queues unpaused"
	running_on "$WL" "$v0"
	[ -e "$img/$INCOMPLETE" ] || fail "the refused dump left no $INCOMPLETE in $img"
	grep -Eq "^$re" "$img/$INCOMPLETE" || fail "$INCOMPLETE does not say why: $(paste -sd' ' "$img/$INCOMPLETE")"
	gpu_check "$img"
	[ "$GC_RC" != 0 ] && grep -Eq "incomplete dump: .*the dump's validation refused them: $re" <<<"$GC_OUT" ||
		fail "gpu-check does not refuse the images as incomplete, with the reason: $(paste -sd' ' <<<"$GC_OUT")"
	log=$CASE_DIR/restore-refused.log
	restore "$img" "$log" && fail "criu-rocm restore of the refused images succeeded"
	log_has "$log" "incomplete dump: .*the dump's validation refused them: $re"
	alive "$WL" || fail "the refused restore ended gpu-workload $WL"
	CRIU_ROCM_TEST_MAX_MAP_COUNT=8 dump "$WL" "$img3" --leave-running &&
		fail "the --leave-running dump succeeded although its validation refuses mm-$WL.img"
	log_has "$img3/dump.log" "amdgpu: $re" \
		"the restore would refuse these images \(above\); the dump fails and the process keeps running" \
		"amdgpu: pid $WL: GPU queues unpaused"
	running_on "$WL" "$v0"
	grep -Eq "^$re" "$img3/$INCOMPLETE" 2>/dev/null ||
		fail "the refused --leave-running dump left no $INCOMPLETE in $img3 saying why"
	dump_ok "$WL" "$img2"
	restore_ok "$img2" "$WL"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	wl_finish "$WL"
	note "$(grep -a -m1 -oE "$re" "$img/dump.log")"
}

# UNPAUSE fails after a --leave-running dump: the dump must not report success.
case_fault_dump_unpause_fails() { on mi100x2 --fail UNPAUSE -- fault_dump_unpause_fails; }
fault_dump_unpause_fails() {
	local img=$CASE_DIR/img
	wl_start wl --mib 2 --bos 2
	dump "$WL" "$img" --leave-running && fail "the dump reported success although the GPU could not be unpaused"
	log_has "$img/dump.log" "amdgpu: pid $WL: fd [0-9]+ \(/dev/kfd\): unpausing the GPU queues: .*its GPU work stays stopped" \
		"GPU work of the dumped tree could not be resumed"
	alive "$WL" || fail "the process is gone after the dump"
	kill -KILL "$WL"
}

# ---------------------------------------------------------------------------------------
# Cases: criu-rocm killed during a dump (#13). The dump stops itself at a named log line
# (CRIU_ROCM_TEST_STOP_ON_LOG, a hook for tests only) and gets a signal there. Whatever the
# signal, the process must run on with its GPU work going and its memory intact, the images
# must say "incomplete dump" to restore and gpu-check, and no GPU guardian may stay.

# stopped_on_log CPID WHAT LOG: waits until criu-rocm CPID, started in the background with
# CRIU_ROCM_TEST_STOP_ON_LOG, has stopped itself at its line; fails saying WHAT, with the
# errors of LOG, when it ends or goes on instead.
stopped_on_log() {
	local cpid=$1 i st=0 state=
	for ((i = 0; i < 1200; i++)); do
		state=$(proc_state "$cpid")
		case $state in T | Z | "") break ;; esac
		sleep 0.05
	done
	[ "$state" = T ] && return 0
	wait "$cpid" || st=$?
	fail "$2: criu-rocm never stopped there (state '$state', exit $st): $(log_errors "$3")"
}

# The action dump_killed runs, and names its log after.
CR_ACTION=${CR_ACTION:-dump}

# dump_killed PID DIR TEXT SIG: a dump (a $CR_ACTION) of PID that stops at the first log line holding
# TEXT, then gets SIG (and SIGCONT); criu-rocm must end by that signal. The signals a
# background job of this shell would ignore are reset (env --default-signal), as for a
# dump run from a terminal.
dump_killed() {
	local pid=$1 dir=$2 text=$3 sig=$4 cpid st=0
	mkdir -p "$dir"
	CRIU_ROCM_TEST_STOP_ON_LOG=$text env --default-signal=HUP,INT,PIPE,TERM \
		"$CRIU" "$CR_ACTION" -t "$pid" -D "$dir" -o "$CR_ACTION.log" -v4 >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	stopped_on_log "$cpid" "SIG$sig at /$text/" "$dir/$CR_ACTION.log"
	kill -"$sig" "$cpid"
	[ "$sig" = KILL ] || kill -CONT "$cpid"
	wait "$cpid" || st=$?
	[ "$st" = $((128 + $(kill -l "$sig"))) ] ||
		fail "SIG$sig at /$text/: criu-rocm ended with status $st, not by the signal ($(log_errors "$dir/$CR_ACTION.log"))"
}

# killed_dump_left IMG WHERE PID... [--kfd]: a dump into IMG killed (SIGKILL) after WHERE left
# each PID running (with --kfd: the first one's GPU queues unpaused by the GPU guardian, which
# is gone), its images marked incomplete, and gpu-check refuses them as such.
killed_dump_left() {
	local img=$1 where=$2 kfd= p i line
	shift 2
	[ "${*: -1}" = --kfd ] && kfd=1 && set -- "${@:1:$#-1}"
	if [ -n "$kfd" ]; then
		line="amdgpu: pid $1: GPU queues unpaused by the GPU guardian \(criu-rocm [0-9]+ ended during the dump\)"
		for ((i = 0; i < 300; i++)); do
			grep -aqE -- "$line" "$img/dump.log" && break
			sleep 0.05
		done
		log_has "$img/dump.log" "$line"
	fi
	guardian_gone "SIGKILL after $where"
	for p in "$@"; do
		alive "$p" || fail "$p is gone after the dump killed after $where"
	done
	[ -f "$img/$INCOMPLETE" ] || fail "the killed dump's images are not marked incomplete"
	gpu_check "$img"
	[ "$GC_RC" != 0 ] && grep -q "NOT restorable: incomplete dump" <<<"$GC_OUT" ||
		fail "gpu-check does not refuse the killed dump as incomplete: $(paste -sd' ' <<<"$GC_OUT")"
}

# killed_at POINT TEXT SIG...: one process; for each signal a dump (CR_ACTION=pre-dump: a
# pre-dump) killed at TEXT.
killed_at() {
	local point=$1 text=$2 sig img v0 line= n=0 i
	shift 2
	wl_start wl --mib 8 --bos 4 --host-mib 32 --events
	v0=$(wl_verify "$WL") || exit 1
	text=${text//@PID@/$WL}
	for sig in "$@"; do
		n=$((n + 1))
		img=$CASE_DIR/img-$n-$sig
		dump_killed "$WL" "$img" "$text" "$sig"
		if [ "$point" = freeze ]; then
			# Nothing was paused yet, and the guardian starts only before a pause.
			grep -aq "GPU queues paused\|GPU guardian started" "$img/$CR_ACTION.log" &&
				fail "SIG$sig at $point: the GPU was touched before the point"
		elif [ "$point" = copy ]; then
			# A pre-dump reads the GPU memory after the unpause: nothing is left paused.
			log_has "$img/$CR_ACTION.log" "amdgpu: pid $WL: GPU queues unpaused after [0-9.]+ ms paused"
			grep -aq "unpaused by the GPU guardian\|unpaused (criu-rocm got" "$img/$CR_ACTION.log" &&
				fail "SIG$sig at $point: something was still paused when criu-rocm was killed"
			line=
		else
			log_has "$img/$CR_ACTION.log" "amdgpu: pid $WL: GPU queues paused" "GPU guardian started \(pid [0-9]+\)"
			case $sig in
			KILL) line="amdgpu: pid $WL: GPU queues unpaused by the GPU guardian \(criu-rocm [0-9]+ ended during the dump\)" ;;
			*) line="amdgpu: pid $WL: GPU queues unpaused \(criu-rocm got SIG$sig during the dump\)" ;;
			esac
			# The guardian writes once criu-rocm is gone: give it a moment.
			for ((i = 0; i < 300; i++)); do
				grep -aqE -- "$line" "$img/$CR_ACTION.log" && break
				sleep 0.05
			done
			log_has "$img/$CR_ACTION.log" "$line"
		fi
		guardian_gone "SIG$sig at $point"
		running_on "$WL" "$v0"
		[ -f "$img/$INCOMPLETE" ] || fail "SIG$sig at $point: the images are not marked incomplete: $(ls "$img" | paste -sd' ')"
		gpu_check "$img"
		[ "$GC_RC" != 0 ] && grep -q "incomplete dump" <<<"$GC_OUT" ||
			fail "SIG$sig at $point: gpu-check does not refuse the images as an incomplete dump: $(paste -sd' ' <<<"$GC_OUT")"
		restore "$img" "$img/restore.log" && fail "SIG$sig at $point: the images of the killed dump were restored"
		log_has "$img/restore.log" "amdgpu: incomplete dump: .*$INCOMPLETE"
		alive "$WL" || fail "SIG$sig at $point: the refused restore took the process with it"
		note "SIG$sig: $([ -n "$line" ] && grep -a -m1 -oE -- "$line" "$img/$CR_ACTION.log" || echo "nothing was paused");" \
			"$(ls "$img" | grep -c '\.img$') image files, marked incomplete"
	done
	wl_finish "$WL"
}

case_fault_dump_killed_at_freeze() { on mi100x2 -- killed_at freeze "Collected @PID@ in" KILL TERM INT; }
case_fault_dump_killed_at_pause() { on mi100x2 -- killed_at pause "amdgpu: pid @PID@: GPU queues paused" KILL TERM INT; }
case_fault_dump_killed_at_bo_copy() { on mi100x2 -- killed_at bo-copy "copied to the pages file" KILL TERM INT HUP PIPE; }
case_fault_dump_killed_at_cpu_pages() { on mi100x2 -- killed_at cpu-pages "Transferring pages" KILL TERM INT; }
# A pre-dump killed while the GPU is paused (PROCESS_INFO to UNPAUSE) or while it reads
# the GPU memory of the running process: the same guarantees as a dump's.
case_fault_predump_killed_at_pause() { CR_ACTION=pre-dump on mi100x2 -- killed_at pause "amdgpu: pid @PID@: GPU queues paused" KILL TERM INT; }
case_fault_predump_killed_at_bo_copy() { CR_ACTION=pre-dump on mi100x2 -- killed_at copy "copied to the pages file" KILL TERM INT; }
case_fault_dump_killed_at_image_write() { on mi100x2 -- killed_at image-write "Dumping pstree" KILL TERM INT; }

# ---------------------------------------------------------------------------------------
# Cases: restore (#5)

# Dump, kill, restore on the same host: every BO byte, the counters (no lost or repeated
# step: gpu-workload checks each step against the last), events, new BOs and queues,
# threads with their own queues.
case_restore_same_host() { on mi100x2 -- restore_same_host; }
restore_same_host() {
	local img=$CASE_DIR/img v0 v1 v2 map
	wl_start wl --mib 8 --bos 4 --events --fresh --threads 2
	v0=$(wl_verify "$WL") || exit 1
	dump_ok "$WL" "$img"
	map=$(gpu_check_restorable "$img") || exit 1
	restore_ok "$img" "$WL"
	restored_as_predicted "$map"
	[ "$(render_fds "$WL" | wc -l)" = 2 ] || fail "the restored process has $(render_fds "$WL" | wc -l) render-node fds, not 2"
	# The BO contents went to criu main's GPU memory writer, which wrote them back beside
	# the restorer, before the queues were resumed.
	log_has "$LAST_RESTORE_LOG" "amdgpu: GPU memory writer started" \
		"amdgpu: pid $WL: KFD file [0-9]+ restored: .*BO contents handed to the GPU memory writer" \
		"amdgpu: pid $WL: GPU 0x[0-9a-f]+ \(host 0x[0-9a-f]+\): restored [0-9]+ BO\(s\)"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	counters_kept "$v0" "$v1"
	# The SET_EVENT left pending at the dump, then a FENCE+TRAP from SDMA.
	[ "$(json_num "$v1" events)" -ge $(($(json_num "$v0" events) + 2)) ] || fail "events did not fire after the restore: $v0 / $v1"
	[ "$(json_num "$v1" fresh)" = $(($(json_num "$v0" fresh) + 2)) ] || fail "new BOs and queues failed after the restore: $v1"
	sleep 0.3
	v2=$(wl_verify "$WL") || exit 1
	counters_cmp "$v1" "$v2" gt || fail "counters do not advance after the restore: $(json_list "$v1" counters) then $(json_list "$v2" counters)"
	wl_finish "$WL"
	note "counters $(json_list "$v0" counters) before, $(json_list "$v2" counters) after; $map"
}

# Dump on mi100x2, restore on another mi100x2 (other gpu_ids, minors and GPU order).
case_restore_other_host() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2 --events
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- restore_other_host
}
# dump_for_later NAME [gpu-workload ARG...]: starts a workload, verifies it, dumps it into
# $CASE_DIR/img; the pid goes to $CASE_DIR/NAME.pid.
dump_for_later() {
	local name=$1
	shift
	wl_start "$name" "$@"
	wl_verify "$WL" >/dev/null || exit 1
	dump_ok "$WL" "$CASE_DIR/img"
}
restore_other_host() {
	local img=$CASE_DIR/img pid map fds
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	map=$(gpu_check_restorable "$img") || exit 1
	restore_ok "$img" "$pid"
	restored_as_predicted "$map"
	grep -qE 'GPU 0x3f2c \(renderD128\) -> host GPU 0x(51e7|a0c4) \(renderD13[01]\)' <<<"$map" &&
		grep -qE 'GPU 0xd9b1 \(renderD129\) -> host GPU 0x(51e7|a0c4) \(renderD13[01]\)' <<<"$map" ||
		fail "unexpected GPU mapping on the other host: $map"
	fds=$(render_fds "$pid" | awk '{print $2}' | sort | paste -sd' ')
	[ "$fds" = "130 131" ] || fail "the restored process' render fds are on minors '$fds', not 130 131"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$map"
}

# The RDNA4 gfx1201 card (its DMA IP is SDMA 7), dumped there and restored on the same card
# with its DMA rings refusing user submissions (amdgpu.disable_kq=1). kfd-emu hands out no
# dmabufs, so on both the CPU copies, through the render file that owns the BOs (the one
# given to ACQUIRE_VM at the dump, to RESTORE at the restore).
case_restore_rdna4_sdma7() {
	on rx9070xt -- dump_for_later wl --mib 4 --bos 2 --events
	on rx9070xt --profile-file "$(host_file rx9070xt-no-user-sdma)" -- restore_rdna4_sdma7
}
restore_rdna4_sdma7() {
	local img=$CASE_DIR/img pid
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	log_has "$img/dump.log" "amdgpu: pid $pid: GPU 0x7b1d \\(host 0x7b1d\\): saved [1-9][0-9]* BO\\(s\\), .*; [1-9][0-9]* by CPU, 0 by SDMA\\)"
	gpu_check_restorable "$img" >/dev/null || exit 1
	restore_ok "$img" "$pid"
	log_has "$LAST_RESTORE_LOG" "amdgpu: pid $pid: GPU 0x7b1d \\(host 0x7b1d\\): restored [1-9][0-9]* BO\\(s\\), .*; [1-9][0-9]* by CPU, 0 by SDMA\\)"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "gfx1201: saved and restored by the CPU through the owning render file"
}

# Images laid out exactly as upstream CRIU 4.2.1's amdgpu plugin writes them (our optional
# fields and criu-dev's render-node fields dropped, re-encoded with upstream's own schema, no
# amdgpu-digests.img) restore too, without the checks they no longer carry: gpu-check and the
# restore each say so in one warning line.
case_restore_upstream_layout() {
	local r
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2 --events
	r=$(imgcheck upstream "$CASE_DIR/img" "$UPSTREAM_PROTO" 2>&1) || fail "$r"
	[[ $r == "dropped "[1-9]* ]] || fail "nothing to drop from criu-rocm's images: $r"
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- restore_upstream_layout "$r"
}
restore_upstream_layout() {
	local img=$CASE_DIR/img pid w
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	gpu_check_restorable "$img" >/dev/null || exit 1
	w="these GPU images carry no integrity data (upstream's layout: no amdgpu-digests.img, no BO content hashes)"
	[ "$(grep -cF -- "$w" <<<"$GC_OUT")" = 1 ] || fail "gpu-check does not warn once that the images carry no integrity data: $(paste -sd' ' <<<"$GC_OUT")"
	restore_ok "$img" "$pid"
	[ "$(grep -acF -- "$w" "$LAST_RESTORE_LOG")" = 1 ] || fail "the restore log does not warn once that the images carry no integrity data ($LAST_RESTORE_LOG)"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$1; restored on other GPUs"
}

# The image's GPUs can only land crossed (firmware versions force it): the doorbell and
# MMIO mappings on /dev/kfd must follow their GPU to the other position, or the queues
# never run again and the workload's verification fails.
case_restore_crossed_gpus() {
	on mi100x2 --profile-file "$(host_file mi100x2-fw-first-older)" -- dump_for_later wl --mib 4 --bos 2 --events
	on mi100x2 --profile-file "$(host_file mi100x2-fw-second-older)" -- restore_crossed
}
restore_crossed() {
	local img=$CASE_DIR/img pid map
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	map=$(gpu_check_restorable "$img") || exit 1
	grep -qE 'GPU 0xd9b1 \(renderD129\) -> host GPU 0x51e7 \(renderD131\)' <<<"$map" &&
		grep -qE 'GPU 0x3f2c \(renderD128\) -> host GPU 0xa0c4 \(renderD130\)' <<<"$map" ||
		fail "the GPUs were not crossed: $map"
	restore_ok "$img" "$pid"
	grep -qE 'mapping .* of /dev/kfd at 0x[0-9a-f]+ -> BO [0-9]+ at 0x[0-9a-f]+' "$LAST_RESTORE_LOG" ||
		fail "no /dev/kfd mapping (doorbell, MMIO) was moved in $LAST_RESTORE_LOG"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$map; /dev/kfd mappings moved with their GPUs"
}

# Two hives of four on mi250x8; restored where the hives are enumerated the other way
# round with other ids: each image hive must land on one host hive, whole.
case_restore_mi250x8_hives_swapped() {
	on mi250x8 -- dump_for_later wl --mib 1 --bos 2
	on mi250x8 --profile-file "$(host_file mi250x8-hives-swapped)" -- restore_hives_swapped
}
restore_hives_swapped() {
	local img=$CASE_DIR/img pid map
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	map=$(gpu_check_restorable "$img") || exit 1
	restore_ok "$img" "$pid"
	map=$(restore_mapping "$LAST_RESTORE_LOG")
	pycheck "$map" <<-'EOF' || fail "hives or NUMA nodes split or mixed: $map"
		import re, sys
		pairs = re.findall(r"GPU 0x([0-9a-f]+) \(renderD\d+\) -> host GPU 0x([0-9a-f]+)", sys.argv[1])
		if len(pairs) != 8 or len({n for _, n in pairs}) != 8:
		    sys.exit(1)
		# (hive, NUMA node) of each GPU on the dump host (mi250x8) and on this one
		old = dict(zip("8f1d 1b62 4ce5 d07a 2a93 7e48 c5b6 3d0f".split(), "A0 A0 A1 A1 B2 B2 B3 B3".split()))
		new = dict(zip("91a1 91a2 91a3 91a4 91b1 91b2 91b3 91b4".split(), "y2 y2 y3 y3 x0 x0 x1 x1".split()))
		for part in (0, 1):  # hives, then NUMA nodes: each group lands whole on one group
		    lands = {}
		    for o, n in pairs:
		        lands.setdefault(old[o][part], set()).add(new[n][part])
		    if any(len(v) != 1 for v in lands.values()) or len(set.union(*lands.values())) != len(lands):
		        sys.exit(1)
	EOF
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$map"
}

# incompatible_host OVERRIDE CHECK_KNOB REGEX...: dump on mi100x2; on the OVERRIDE host
# gpu-check and the restore must refuse for a reason matching each REGEX, leaving no
# process and the images intact; with CHECK_KNOB=0 (if given) both must then succeed
# there; otherwise a second attempt on a matching host must.
incompatible_host() {
	local override=$1 knob=$2
	shift 2
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 --profile-file "$(host_file "$override")" -- restore_refused "$knob" "$@"
	[ -n "$knob" ] || on mi100x2 -- restore_later
}
restore_refused() {
	local img=$CASE_DIR/img knob=$1 pid re
	shift
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	gpu_check_refuses "$img" "$@"
	restore_fails "$img" "$pid" "restore on an incompatible host"
	log_has "$LAST_RESTORE_LOG" "amdgpu: pid $pid: matching the image's GPUs to this host: .*($(IFS='|'; echo "$*"))"
	note "refused: $(grep -a -m1 -o "matching the image's GPUs to this host: .*" "$LAST_RESTORE_LOG" | cut -c1-200)"
	[ -n "$knob" ] || return 0
	export "$knob=0"
	gpu_check_restorable "$img" >/dev/null
	restore_ok "$img" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "accepted with $knob=0"
}
restore_later() {
	local pid
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	gpu_check_restorable "$CASE_DIR/img" >/dev/null
	restore_ok "$CASE_DIR/img" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
}

case_restore_fewer_gpus() { incompatible_host mi100x2-one-gpu "" "the image has 2 GPUs but this host shows only 1"; }
case_restore_smaller_vram() {
	incompatible_host mi100x2-small-vram KFD_VRAM_SIZE_CHECK \
		"GPU 0x(3f2c|d9b1) \(node [0-9]+\): no host GPU matches: .*vram_size 34359738368 > 17179869184"
}
case_restore_older_firmware() {
	incompatible_host mi100x2-old-fw KFD_FW_VER_CHECK \
		"GPU 0x(3f2c|d9b1) \(node [0-9]+\): no host GPU matches: .*fw_version 65 > 60"
}

# ---------------------------------------------------------------------------------------
# Cases: upstream CRIU 4.2.1's topology-remap scenarios (plugins/amdgpu/tests/
# test_topology_remap.c: nine pairs of source and destination topologies, each with an
# expected outcome), as kfd-emu hosts hosts/topo-remap/N-src.toml and N-dst.toml. Upstream
# only asks its matcher for a mapping; here a process using every GPU is dumped on the
# source host, then gpu-check and the restore run on the destination host. A restorable
# scenario must land as upstream expects and the process verify its GPU memory; a refused
# one must be refused by both, naming the failing property and no KFD_*_CHECK knob, and
# stay refused for that reason with KFD_NUMA_CHECK=0.
#
# criu-rocm's outcome is upstream's expected one in all nine. Where upstream's own code
# would differ on real sysfs: it requires equal io_links_count, which its unit test leaves
# 0 everywhere; with the counts sysfs shows, scenarios 7 and 8 (whose restore host has
# more links) would be refused. criu-rocm compares the links themselves, not their count
# (the count also holds links to GPUs a container cannot see), so it restores them, as the
# scenarios mean. It also checks GPU-GPU links, which upstream skips: in scenarios 1, 6
# and 8 they narrow the mapping but leave one.

remap_host() { echo "$here/hosts/topo-remap/$1-$2.toml"; }

# remap N BASE restorable IMAGE_IDS=HOST_IDS...: each image GPU of IMAGE_IDS (hex,
#   comma-separated) must land on one of HOST_IDS.
# remap N BASE refused REGEX: gpu-check and the restore must refuse for REGEX.
remap() {
	local n=$1 base=$2
	shift 2
	on "$base" --profile-file "$(remap_host "$n" src)" -- dump_for_later wl --mib 1 --bos 2
	on "$base" --profile-file "$(remap_host "$n" dst)" -- remap_restore "$@"
}
remap_restore() {
	local what=$1 img=$CASE_DIR/img pid map n
	shift
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	if [ "$what" = refused ]; then
		remap_refused "$img" "$pid" "$1"
		return
	fi
	map=$(gpu_check_restorable "$img") || exit 1
	restore_ok "$img" "$pid"
	restored_as_predicted "$map"
	n=$(wl_gpus_hex "$pid" | wc -l)
	pycheck "$map" "$n" "$@" <<-'EOF' || fail "unexpected GPU mapping: $(tail -n1 "$CASE_DIR/py.err")"
		import re, sys
		pairs = dict(re.findall(r"GPU 0x([0-9a-f]+) \(renderD\d+\) -> host GPU 0x([0-9a-f]+)", sys.argv[1]))
		if len(pairs) != int(sys.argv[2]) or len(set(pairs.values())) != len(pairs):
		    sys.exit(f"{len(pairs)} GPUs mapped onto {len(set(pairs.values()))}, the process has {sys.argv[2]}: {pairs}")
		for rule in sys.argv[3:]:
		    image, host = (side.split(",") for side in rule.split("="))
		    for g in image:
		        if pairs.get(g) not in host:
		            sys.exit(f"GPU 0x{g} went to 0x{pairs.get(g)}, not to one of {host}: {sys.argv[1]}")
	EOF
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$map"
}
remap_refused() {
	local img=$1 pid=$2 re=$3 numa why
	for numa in 1 0; do
		export KFD_NUMA_CHECK=$numa
		gpu_check_refuses "$img" "$re"
		grep -q "KFD_" <<<"$GC_OUT" &&
			fail "KFD_NUMA_CHECK=$numa: gpu-check names a knob that would not change the outcome: $(paste -sd' ' <<<"$GC_OUT")"
		restore_fails "$img" "$pid" "restore with KFD_NUMA_CHECK=$numa"
		log_has "$LAST_RESTORE_LOG" "amdgpu: pid $pid: matching the image's GPUs to this host: .*$re"
		why=$(grep -a -m1 -o "matching the image's GPUs to this host: .*" "$LAST_RESTORE_LOG")
		grep -q "KFD_" <<<"$why" && fail "KFD_NUMA_CHECK=$numa: the restore names a knob that would not change the outcome: $why"
	done
	unset KFD_NUMA_CHECK
	note "refused, with KFD_NUMA_CHECK=1 and 0: $(cut -c1-240 <<<"$why")"
}

# 0: two hives of two GPU models; the destination has the models the other way round.
# Upstream: SUCCESS, the hives swap.
case_restore_topo_remap_0() {
	remap 0 mi300x8 restorable a000,a001,a002,a003=b014,b015,b016,b017 \
		a014,a015,a016,a017=b000,b001,b002,b003
}
# 1: one model; GPUs 6 and 7 link to their CPU one way only, hive 0 has PCIe peers only
# in GPUs 4 and 5. Same topology on both hosts. Upstream: SUCCESS.
case_restore_topo_remap_1() {
	remap 1 mi300x8 restorable a000,a001,a002,a003=b000,b001,b002,b003 a014,a015=b014,b015 \
		a016,a017=b016,b017
}
# 2: scenario 1's links, but the hive whose GPUs all link to their CPU both ways is of the
# model whose destination hive has two GPUs with one-way CPU links. Upstream: FAIL.
case_restore_topo_remap_2() {
	remap 2 mi300x8 refused "GPU 0xa00[0-3] \(node [0-9]+\): no host GPU keeps its links and hive: .*host GPU 0xb01[67] \(node [0-9]+\): no bidirectional PCIe link to a CPU \(its links to CPUs: one-way PCIe to CPU node [01]\)"
}
# 3: every GPU links to its CPU one way; one GPU per hive (0xa002, 0xa017) has its CPU link
# back, other ones (0xb000, 0xb015) on the destination. Upstream: SUCCESS, onto those.
case_restore_topo_remap_3() {
	remap 3 mi300x8 restorable a002=b000 a017=b015 a000,a001,a003=b001,b002,b003 \
		a014,a015,a016=b014,b016,b017
}
# 4: as 3, but the destination's only GPU of the second model that a CPU links to links to
# another CPU: no bidirectional CPU link for 0xa017. Upstream: FAIL. This is issue 14's
# case: the refusal blamed the NUMA check and named KFD_NUMA_CHECK=0, which changed nothing.
case_restore_topo_remap_4() {
	remap 4 mi300x8 refused "GPU 0xa017 \(node 9\): no host GPU keeps its links and hive: .*host GPU 0xb01[4-7] \(node [0-9]+\): no bidirectional PCIe link to a CPU \(its links to CPUs: one-way PCIe to CPU node [01]\)"
}
# 5: one hive and four GPUs without XGMI, all PCIe peers. Upstream: SUCCESS.
case_restore_topo_remap_5() {
	remap 5 mi300x8 restorable a000,a001,a002,a003=b000,b001,b002,b003 \
		a014,a015,a016,a017=b014,b015,b016,b017
}
# 6: five GPUs, two models at other positions on the destination. Upstream: SUCCESS,
# 0xa001 -> 0xb002 possible and 0xa002 -> 0xb001 needed.
case_restore_topo_remap_6() {
	remap 6 mi100x2 restorable a002=b001 a004=b004 a000,a001,a003=b000,b002,b003
}
# 7: four GPUs with no link at all; on the destination they form a hive. Upstream:
# SUCCESS (a more capable host).
case_restore_topo_remap_7() {
	remap 7 mi300x8 restorable a000,a001,a002,a003=b000,b001,b002,b003 \
		a014,a015,a016,a017=b014,b015,b016,b017
}
# 8: three mutual PCIe peers on the source, four on the destination. Upstream: SUCCESS
# (a more capable host).
case_restore_topo_remap_8() {
	remap 8 mi100x2 restorable a000,a001,a002=b000,b001,b002,b003
}

# Damaged images: each fails before the process runs, without leftovers; then the intact
# images restore.
case_restore_damaged_images() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 -- restore_damaged_images
}
restore_damaged_images() {
	local img=$CASE_DIR/img pid kfd pages v
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	kfd=$(cd "$img" && ls amdgpu-kfd-*.img | head -n 1)
	pages=$(cd "$img" && ls amdgpu-pages-*.img | head -n 1)
	# name ~ file ~ corruption ~ what the restore log must say ~ gpu-check must refuse
	while IFS='~' read -r name file how re dry; do
		v=$CASE_DIR/$name
		cp -a "$img" "$v"
		# shellcheck disable=SC2086
		imgcheck corrupt "$v/$file" $how "$top/proto/criu-amdgpu.proto" || fail "$name: could not damage $file"
		restore_fails "$v" "$pid" "$name"
		log_has "$LAST_RESTORE_LOG" "$re"
		if [ "$dry" = yes ]; then gpu_check_refuses "$v" "$file"; fi
		note "$name: $(grep -a -oE 'amdgpu: .*' "$LAST_RESTORE_LOG" | grep -v -- '-> host GPU' | tail -n 1 | cut -c1-200)"
	done <<-EOF
		short-pages~$pages~truncate 4096~amdgpu: .*$pages.*~yes
		pages-size-word~$pages~size-word -4096~amdgpu: .*$pages.*~yes
		pages-flipped-byte~$pages~flip -3000~amdgpu: .*$pages: GPU 0x[0-9a-f]+: bo_entries\[[0-9]+\]\.content_xxh3: the BO at 0x[0-9a-f]+ \([0-9]+ bytes\) hashes to~yes
		kfd-flipped-tag~$kfd~flip 8~amdgpu: .*$kfd.*~yes
		kfd-size-word~$kfd~size-word 1~amdgpu: .*$kfd.*~yes
		kfd-truncated~$kfd~truncate 100~amdgpu: .*$kfd.*~yes
		kfd-num-bos~$kfd~num-bos 1~amdgpu: .*$kfd.*num_of_bos.*~yes
		kfd-num-bos-overflow~$kfd~num-bos =18446744073709551615~amdgpu: .*$kfd.*num_of_bos.*~yes
	EOF
	restore_ok "$img" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
}

case_restore_missing_render_node() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 -- restore_missing_render_node
	on mi100x2 -- restore_later
}
restore_missing_render_node() {
	local img=$CASE_DIR/img pid
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	umount /dev/dri/renderD129 && rm -f /dev/dri/renderD129 || fail "cannot remove /dev/dri/renderD129 in the emulated host"
	gpu_check_refuses "$img" "/dev/dri/renderD129"
	restore_fails "$img" "$pid" "restore without renderD129"
	# The GPU whose node is missing is left out, as libhsakmt leaves it out; the other
	# cannot hold the image's two.
	log_has "$LAST_RESTORE_LOG" \
		"amdgpu: pid $pid: host GPU 0xd9b1 \(renderD129\) left out: this task has no render node of it" \
		"amdgpu: pid $pid: matching the image's GPUs to the host GPUs this task has a render node of \(it has no /dev/dri/renderD129\): .*the image has 2 GPUs but this host shows only 1"
	note "$(grep -a -m1 -o "amdgpu: pid $pid: matching .*" "$LAST_RESTORE_LOG")"
}

# Integrity (#14): one damage per case to a fresh dump; gpu-check and the restore must refuse
# it with the same words (the restore before it creates any task), naming the file, the GPU
# and the field where there is one; then the intact images restore.
#
# refused_alike DIR WHAT REGEX: gpu-check's refusal must match REGEX, and the restore must
# fail logging exactly that refusal.
refused_alike() {
	local dir=$1 what=$2 re=$3 line
	gpu_check_refuses "$dir" "$re"
	line=$(grep -m1 -E -- "NOT restorable here: .*$re" <<<"$GC_OUT" | sed 's/.*NOT restorable here: //')
	restore_fails "$dir" "$(cat "$CASE_DIR/wl.pid")" "$what"
	grep -aqF -- "amdgpu: $line" "$LAST_RESTORE_LOG" ||
		fail "$what: gpu-check said '$line', the restore did not: $(log_errors "$LAST_RESTORE_LOG" 4)"
	grep -aq "the GPU images cannot be restored (no task was created" "$LAST_RESTORE_LOG" ||
		fail "$what: the restore did not refuse before creating its tasks ($LAST_RESTORE_LOG)"
	note "$what: $line"
}
integrity_case() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2 --events
	on mi100x2 -- "$@"
	on mi100x2 -- restore_later
}
# damaged COPY: a copy of the dump to damage (the intact one restores at the end).
damaged() {
	rm -rf "$CASE_DIR/$1"
	cp -a "$CASE_DIR/img" "$CASE_DIR/$1"
	echo "$CASE_DIR/$1"
}
img_name() { (cd "$CASE_DIR/img" && ls $1 | head -n 1); }

# Images from someone who writes them (issue 31): KFD's private data edited self-consistently
# (a queue's control stack grown by 1 MiB with the bytes there, its MQD by 64 KiB, a queue
# type no process owns, SDMA engine and doorbell ids out of range, a ring outside the
# process, an event id outside its range, an SVM range never mapped, a huge object count),
# in our layout with the digests recomputed and in upstream's (no extension fields, no
# digests file). gpu-check and the restore refuse each alike, naming the field, before any
# task runs; the emulator's log shows no CRIU RESTORE reached it. The intact dump restores.
case_hostile_private_data() {
	KFD_EMU_LOG=info on mi100x2 -- dump_for_later wl --mib 4 --bos 2 --events
	KFD_EMU_LOG=info on mi100x2 -- hostile_private_data
	on mi100x2 -- restore_later
}
hostile_private_data() {
	local layout edit v re n=0 emu=$CASE_DIR/kfd-emu.log
	local -A want=(
		[ctl-1m]='queues\[0\]\.ctl_stack_size: is 1048576, but KFD saves no control stack'
		[mqd-64k]='queues\[0\]\.mqd_size: is 66048, but KFD.s SDMA MQD is 512 bytes'
		[type]='queues\[0\]\.type: is 2, a queue type KFD never gives a process'
		[sdma-id]='queues\[0\]\.sdma_id: is 65535'
		[doorbell]='queues\[0\]\.doorbell_id: is 4096'
		[ring]='queues\[0\]\.q_address: is 0x1000'
		[event-id]='priv_data\.events\[0\]\.event_id: is 0x1388'
		[svm]='priv_data\.svm_ranges\[0\]: is \[0x1000, 0x2000\), which the process. mappings'
		[counts]='priv_data: does not hold'
	)
	for layout in ours upstream; do
		for edit in ctl-1m mqd-64k type sdma-id doorbell ring event-id svm counts; do
			v=$(damaged "hostile-$layout-$edit")
			if [ "$layout" = upstream ]; then
				imgcheck upstream "$v" "$UPSTREAM_PROTO" >/dev/null || fail "$edit: could not rewrite the images in upstream's layout"
			fi
			imgcheck hostile "$v/$(img_name 'amdgpu-kfd-*.img')" "$edit" || fail "$edit: could not edit the private data"
			refused_alike "$v" "$layout layout, $edit" "${want[$edit]}"
			n=$((n + 1))
		done
	done
	grep -q "CRIU_OP CHECKPOINT by process" "$emu" || fail "the emulator logged no CRIU op ($emu): the check below proves nothing"
	! grep -q "CRIU_OP RESTORE" "$emu" || fail "a CRIU RESTORE reached the emulator: $(grep -m1 'CRIU_OP RESTORE' "$emu")"
	note "$n hostile images refused by gpu-check and the restore; no CRIU RESTORE reached the emulator"
}

case_integrity_removed_content_hash() { integrity_case integrity_removed_content_hash; }
integrity_removed_content_hash() {
	local v kfd i
	v=$(damaged no-hash)
	kfd=$(img_name 'amdgpu-kfd-*.img')
	i=$(imgcheck corrupt "$v/$kfd" drop-hash first "$top/proto/criu-amdgpu.proto") || fail "could not drop a content hash"
	refused_alike "$v" "content_xxh3 of BO $i removed" \
		"$kfd: GPU 0x[0-9a-f]+: bo_entries\[$i\]\.content_xxh3: missing, though the image declares criu-rocm's extension"
}

case_integrity_flipped_bo_addr() { integrity_case integrity_flipped_bo_addr; }
integrity_flipped_bo_addr() {
	local v kfd i
	kfd=$(img_name 'amdgpu-kfd-*.img')
	# The doorbell (mapped through /dev/kfd): the process' own mapping gives it away.
	v=$(damaged addr-doorbell)
	i=$(imgcheck corrupt "$v/$kfd" bo-addr doorbell:40 "$top/proto/criu-amdgpu.proto") || fail "could not flip a doorbell address"
	refused_alike "$v" "bit 40 of the doorbell BO $i's addr flipped" \
		"$kfd: GPU 0x[0-9a-f]+: bo_entries\[$i\]\.addr: is 0x[0-9a-f]+, but the process maps this BO \(offset 0x[0-9a-f]+\) at 0x[0-9a-f]+ \(mm-[0-9]+\.img\)"
	# The same without the digests file (an upstream-layout dump keeps the mapping check).
	rm -f "$v/amdgpu-digests.img"
	refused_alike "$v" "the same without amdgpu-digests.img" "$kfd: GPU 0x[0-9a-f]+: bo_entries\[$i\]\.addr: "
	# A VRAM BO: its mapping through the render node, or else the image's digest.
	v=$(damaged addr-vram)
	i=$(imgcheck corrupt "$v/$kfd" bo-addr vram:40 "$top/proto/criu-amdgpu.proto") || fail "could not flip a VRAM BO address"
	refused_alike "$v" "bit 40 of the VRAM BO $i's addr flipped" \
		"$kfd: (GPU 0x[0-9a-f]+: bo_entries\[$i\]\.addr: |hashes to xxh3:[0-9a-f]+, but amdgpu-digests.img recorded)"
}

case_integrity_render_image_damaged() { integrity_case integrity_render_image_damaged; }
integrity_render_image_damaged() {
	local v r
	r=$(img_name 'amdgpu-renderD-*.img')
	v=$(damaged render-truncated)
	imgcheck corrupt "$v/$r" truncate 1 || fail "could not truncate $r"
	refused_alike "$v" "$r truncated" "$r: criu_render_node message: truncated: needs [0-9]+ bytes, only [0-9]+ present"
	v=$(damaged render-flipped)
	imgcheck corrupt "$v/$r" flip -1 || fail "could not flip a byte of $r"
	refused_alike "$v" "last byte of $r flipped" "$r: "
}

case_integrity_kfd_image_deleted() { integrity_case integrity_kfd_image_deleted; }
integrity_kfd_image_deleted() {
	local v kfd
	kfd=$(img_name 'amdgpu-kfd-*.img')
	v=$(damaged no-kfd)
	rm "$v/$kfd"
	refused_alike "$v" "$kfd deleted" "$kfd: missing: amdgpu-digests.img records it \([0-9]+ bytes\) from the dump"
	rm "$v/amdgpu-digests.img"
	refused_alike "$v" "$kfd and the digests deleted" \
		"$kfd: missing: files.img holds GPU file ${kfd//[!0-9]/} and inventory.img names amdgpu_plugin"
}

case_integrity_render_image_deleted() { integrity_case integrity_render_image_deleted; }
integrity_render_image_deleted() {
	local v r
	r=$(img_name 'amdgpu-renderD-*.img')
	v=$(damaged no-render)
	rm "$v/$r"
	refused_alike "$v" "$r deleted" "$r: missing: amdgpu-digests.img records it \([0-9]+ bytes\) from the dump"
}

# KFD fails RESUME (the task's own, at its restorer's GPU gate): the task must not run, the
# restore must fail and leave nothing behind; then it works on a good host.
case_restore_resume_fails() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 --fail RESUME -- restore_op_fails \
		"amdgpu: pid [0-9]+: RESUME \(restarting the GPU queues of KFD image [0-9]+\) failed with errno 5; the task does not run" \
		"amdgpu: pid [0-9]+: the GPU restore of KFD image [0-9]+ did not complete: RESUME .*Input/output error"
	on mi100x2 -- restore_later
}
# A KFD image whose pid field no longer names the process that holds its file (N -> N+1,
# N -> 1): gpu-check refuses it, and the restore fails with the same words before it creates
# any task, naming the image and the field; the intact images restore.
case_restore_pid_changed() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 -- restore_pid_changed
}
restore_pid_changed() {
	local img=$CASE_DIR/img pid kfd id v new
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	kfd=$(cd "$img" && ls amdgpu-kfd-*.img | head -n 1)
	id=${kfd#amdgpu-kfd-}
	id=${id%.img}
	for new in $((pid + 1)) 1; do
		v=$CASE_DIR/pid-$new
		cp -a "$img" "$v"
		imgcheck corrupt "$v/$kfd" pid "=$new" "$top/proto/criu-amdgpu.proto" || fail "could not set the pid of $kfd to $new"
		gpu_check_refuses "$v" "$kfd: pid: is $new, which is no process of these images \(pstree.img\)"
		restore_fails "$v" "$pid" "KFD image $id with pid $pid -> $new"
		log_has "$LAST_RESTORE_LOG" "amdgpu: $kfd: pid: is $new, which is no process of these images \(pstree.img\)"
		note "pid $pid -> $new: $(grep -a -m1 -oE "$kfd: pid: is $new[^;]*" "$LAST_RESTORE_LOG")"
	done
	restore_ok "$img" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
}

case_restore_restore_op_fails() {
	on mi100x2 -- dump_for_later wl --mib 4 --bos 2
	on mi100x2 --fail RESTORE:ENOMEM -- restore_op_fails "amdgpu: pid [0-9]+: RESTORE of KFD image [0-9-]+ .*Cannot allocate memory"
	on mi100x2 -- restore_later
}
restore_op_fails() {
	local pid
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	restore_fails "$CASE_DIR/img" "$pid" "restore with a failing KFD op"
	log_has "$LAST_RESTORE_LOG" "$@"
	note "$(grep -a -m1 -oE "$1.*" "$LAST_RESTORE_LOG" | cut -c1-200)"
}

# ---------------------------------------------------------------------------------------
# Cases: restores killed half way (issue #13). The restore is killed with SIGKILL (criu
# main, or separately the GPU memory writer) at four points, each on a fresh emulated host:
# as the writer starts (before any task handed it its GPU memory); at the hand-off (the task
# posted its GPU memory, the writer has not taken it); in the middle of the copy; at the
# sigreturn barrier (every task stopped at its final rt_sigreturn, criu in its pre-resume
# action script). Afterwards either the process runs and verifies all of its memory, or no
# task of the tree is left (none in its own code, none hung); the images are unchanged and
# the next restore works. Which one is due: the process runs only after a kill at the
# barrier when the target is the writer (it is gone by then: criu stopped it once every task
# had passed its GPU gate, and criu goes on); criu killed, even at the barrier, takes every
# task with it (they are traced with PTRACE_O_EXITKILL, patch 0024); everything else fails
# closed.
#
# criu-rocm has no hook for this. kfd-emu --hold RESTORE:FILE stops the restored task inside
# its KFD RESTORE (the writer started, nothing handed over) until the test creates FILE; the
# test freezes criu and the writer with SIGSTOP before a kill. The hand-off is the writer
# stopped, then the task let go until the log says "BO contents handed to the GPU memory
# writer"; mid-copy is the writer stopped once it has read 64 MiB of the 256 MiB of pages
# (/proc/PID/io); the barrier is an --action-script that holds criu at pre-resume. A kill
# that lands after its point (the copy already over) fails the case.
case_restore_killed_criu() { restore_killed criu; }
case_restore_killed_writer() { restore_killed writer; }
restore_killed() {
	local target=$1 point
	on mi100x2 -- dump_for_later wl --mib 128 --bos 2
	stat -c %s "$CASE_DIR/wl.out" "$CASE_DIR/wl.err" >"$CASE_DIR/wl.sizes"
	for point in writer-start hand-off mid-copy sigreturn; do
		on mi100x2 --hold "RESTORE:$CASE_DIR/go-$point" -- kill_restore_at "$point" "$target"
	done
}

# The dumped process' output files back to their size at dump, which CRIU checks: the
# process restored last wrote more.
rewind_output() {
	local sizes
	read -r -d '' -a sizes <"$CASE_DIR/wl.sizes"
	truncate -s "${sizes[0]}" "$CASE_DIR/wl.out"
	truncate -s "${sizes[1]}" "$CASE_DIR/wl.err"
}

# wait_log LOG ERE [SECS]: waits for a line of LOG matching ERE and prints it.
wait_log() {
	local i
	for ((i = 0; i < ${3:-30} * 100; i++)); do
		grep -a -m1 -E -- "$2" "$1" 2>/dev/null && return 0
		sleep 0.01
	done
	return 1
}

# wait_file FILE [SECS]: waits for FILE to exist.
wait_file() {
	local i
	for ((i = 0; i < ${2:-30} * 100; i++)); do
		[ -e "$1" ] && return 0
		sleep 0.01
	done
	return 1
}

# Bytes process $1 has read so far.
rchar() { sed -n 's/^rchar: //p' "/proc/$1/io" 2>/dev/null; }

# kill_restore_at POINT TARGET (in a host started with --hold RESTORE:$CASE_DIR/go-POINT):
# restores $CASE_DIR/img, kills TARGET (criu or writer) at POINT, checks what is left, then
# restores the images again.
kill_restore_at() {
	local point=$1 target=$2 what="$2 killed at $1" img=$CASE_DIR/img pid log before cpid wpid
	local go=$CASE_DIR/go-$1 hold=$CASE_DIR/hold.sh mark=$CASE_DIR/held-$2-$1 ran=no r0 line i
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	before=$(img_sums "$img")
	log=$CASE_DIR/restore-$target-$point.log
	printf '#!/bin/sh\n[ "$CRTOOLS_SCRIPT_ACTION" = pre-resume ] || exit 0\necho $$ >"%s"\nexec sleep 60\n' \
		"$mark" >"$hold"
	chmod +x "$hold"
	[ "$point" = sigreturn ] && touch "$go"
	rewind_output
	"$CRIU" restore -D "$img" -o "$log" -v4 -d --action-script "$hold" >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	line=$(wait_log "$log" 'GPU memory writer started \(pid [0-9]+\)') ||
		fail "$what: the restore log never said that the writer started ($log)"
	wpid=$(sed -E 's/.*\(pid ([0-9]+)\).*/\1/' <<<"$line")
	case $point in
	writer-start)
		wait_file "$go.held" || fail "$what: the task never reached its RESTORE ($log)"
		kill -STOP "$cpid" "$wpid"
		;;
	hand-off)
		wait_file "$go.held" || fail "$what: the task never reached its RESTORE ($log)"
		kill -STOP "$wpid"
		touch "$go"
		wait_log "$log" 'BO contents handed to the GPU memory writer' >/dev/null ||
			fail "$what: the task never handed its GPU memory over ($log)"
		sleep 0.2
		kill -STOP "$cpid"
		;;
	mid-copy)
		wait_file "$go.held" || fail "$what: the task never reached its RESTORE ($log)"
		r0=$(rchar "$wpid")
		touch "$go"
		for ((i = 0; i < 3000; i++)); do
			[ $(($(rchar "$wpid") - r0)) -ge $((64 << 20)) ] && break
			sleep 0.01
		done
		kill -STOP "$cpid" "$wpid"
		;;
	sigreturn)
		for ((i = 0; i < 1200; i++)); do
			[ -s "$mark" ] && break
			alive "$cpid" || break
			sleep 0.05
		done
		[ -s "$mark" ] || fail "$what: criu never ran its pre-resume script: $(log_errors "$log")"
		kill -STOP "$cpid"
		alive "$wpid" && fail "$what: the GPU memory writer ($wpid) still runs at the sigreturn barrier"
		;;
	esac
	# The other one goes on only once the target is gone (the writer dies with criu).
	case $target in
	criu)
		kill -KILL "$cpid"
		wait "$cpid" 2>/dev/null
		# Stopped or not, the writer dies with criu (PDEATHSIG through its shim); the
		# SIGCONT below must not reach it before that SIGKILL does.
		wait_gone "$wpid" 10 || fail "$what: the GPU memory writer ($wpid) outlives criu"
		;;
	writer)
		kill -KILL "$wpid" 2>/dev/null
		wait_gone "$wpid" 10 || fail "$what: the writer survives SIGKILL"
		;;
	esac
	kill -CONT "$cpid" "$wpid" 2>/dev/null
	touch "$go"
	[ -s "$mark" ] && kill -KILL "$(cat "$mark")" 2>/dev/null
	wait "$cpid" 2>/dev/null
	case $point in
	hand-off) ! grep -aq 'GPU memory writer: writing KFD image' "$log" ||
		fail "$what: the writer had taken the job ($log)" ;;
	mid-copy) ! grep -aqE 'restored [0-9]+ BO\(s\)|GPU queues resumed' "$log" ||
		fail "$what: the kill landed after the copy had ended ($log)" ;;
	esac
	# Either the process runs with all of its memory, or it is gone.
	wait_gone "$pid" 5 || ran=yes
	if [ $ran = yes ]; then
		wl_verify "$pid" >/dev/null || exit 1
		kill -KILL "$pid"
		wait_gone "$pid" 10 || fail "$what: gpu-workload $pid survives SIGKILL"
	fi
	no_leftovers "$what"
	[ "$before" = "$(img_sums "$img")" ] || fail "$what: the images changed"
	case $target/$point in
	writer/sigreturn) [ $ran = yes ] || fail "$what: the process, past every check, did not run ($log)" ;;
	*) [ $ran = no ] || fail "$what: the process ran ($log)" ;;
	esac
	# The writer is criu's child, not a restored task (CRIU used to say so of it).
	! grep -aqE "Task $wpid is in unexpected state|$wpid (exited|killed by signal)" "$log" ||
		fail "$what: CRIU took the writer for a restored task ($log)"
	case $target/$point in
	writer/writer-start | writer/hand-off)
		log_has "$log" "amdgpu: pid $pid: the GPU memory writer \(pid $wpid\) died before it took the task's GPU files" \
			"the GPU memory writer \(pid $wpid\) was killed by signal 9 \(SIGKILL\) during the restore" ;;
	writer/mid-copy)
		log_has "$log" "amdgpu: pid $pid: the GPU memory writer died \(criu or the writer was killed\) before it confirmed" \
			"the GPU memory writer \(pid $wpid\) was killed by signal 9 \(SIGKILL\) during the restore" ;;
	esac
	if [ $ran = yes ]; then
		note "$what: the process ran and verified"
	else
		line=
		[ "$target" = writer ] && line="; $(grep -a -m1 -oE "the GPU memory writer \(pid $wpid\) [^;]*" "$log")"
		note "$what: no task left$line"
	fi
	rewind_output
	restore_ok "$img" "$pid"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
}

# ---------------------------------------------------------------------------------------
# Case: criu killed at the end of a restore, before it lets the tasks go (issue #25). A tree
# of three GPU processes of two threads each is restored; criu stops itself at a log line
# (CRIU_ROCM_TEST_STOP_ON_LOG) and is killed there, each point on a fresh emulated host:
#   unlock   "Unlock network": the tasks wait at the end of CR_STATE_RESTORE_SIGCHLD, their
#            GPU state checked, not yet traced, each tied to its parent (the root to criu)
#            by its parent-death signal;
#   sibling  the same with --restore-sibling: the root task's parent is the caller of criu,
#            so only its restorer's watch on criu's pidfd can end it;
#   creds    every task has its own credentials and parent-death signal back and waits at
#            the end of CR_STATE_RESTORE_CREDS, traced (the window of issue #25);
#   armed    criu has set every task to stop at rt_sigreturn, just before CR_STATE_COMPLETE;
#   stopped  after CR_STATE_COMPLETE, the first thread stopped at its rt_sigreturn, the
#            others on their way there.
# Due at every point: no task left (pids and GPU memory freed), not half a tree; at
# sibling the root task logs that criu died. The next restore must work.
case_restore_killed_handoff() {
	local point
	on mi100x2 -- dump_tree_for_later
	for point in unlock sibling creds armed stopped; do
		on mi100x2 -- kill_restore_on_log "$point"
	done
}
dump_tree_for_later() {
	dump_for_later wl --procs 3 --threads 2 --mib 8 --bos 2 --events
	wl_children "$WL" >"$CASE_DIR/wl.kids"
	stat -c %s "$CASE_DIR/wl.out" "$CASE_DIR/wl.err" >"$CASE_DIR/wl.sizes"
}

# kill_restore_on_log POINT: restores $CASE_DIR/img, kills criu at POINT (see above), checks
# that no task is left, then restores the images again.
kill_restore_on_log() {
	local point=$1 what="criu killed at $1" img=$CASE_DIR/img text args=() log pid kids p cpid before
	local up=() gone=()
	case $point in
	unlock) text="Unlock network" ;;
	sibling) text="Unlock network" args=(--restore-sibling) ;;
	creds) text="Every task has its own credentials back" ;;
	armed) text="Every task is set to stop at rt_sigreturn" ;;
	stopped) text=" was stopped" ;;
	*) fail "no kill point $point" ;;
	esac
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	read -r -a kids <"$CASE_DIR/wl.kids"
	[ "${#kids[@]}" = 2 ] || fail "gpu-workload --procs 3 named ${#kids[@]} children, not 2"
	before=$(img_sums "$img")
	log=$CASE_DIR/restore-handoff-$point.log
	rewind_output
	CRIU_ROCM_TEST_STOP_ON_LOG=$text "$CRIU" restore -D "$img" -o "$log" -v4 -d "${args[@]}" \
		>>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	stopped_on_log "$cpid" "$what (/$text/)" "$log"
	kill -KILL "$cpid"
	wait "$cpid" 2>/dev/null
	for p in "$pid" "${kids[@]}"; do
		if wait_gone "$p" 5; then gone+=("$p"); else up+=("$p $(proc_state "$p")"); fi
	done
	[ "${#up[@]}" = 0 ] || fail "$what: tasks left: ${up[*]}${gone[*]:+ (${gone[*]} gone)} ($log)"
	[ "$point" != sibling ] || log_has "$log" \
		"pid $pid: criu died before it handed the restored tree over \(the task was at the end of CR_STATE_RESTORE_SIGCHLD\); the task exits"
	no_leftovers "$what"
	[ "$before" = "$(img_sums "$img")" ] || fail "$what: the images changed"
	note "$what: no task left ($(grep -ac 'criu died before it handed the restored tree over' "$log") of 3 processes logged that criu died)"
	rewind_output
	restore_ok "$img" "$pid"
	wl_verify "$pid" "${kids[@]}" >/dev/null || exit 1
	wl_finish "$pid" "${kids[@]}"
}

# Kill points before any restored task has a restorer to watch criu (issue 29's note): the
# tasks run CRIU's own code and wait for each other or for criu there, and criu is killed
# (SIGKILL). Trees whose tie to criu cannot run from parent to parent alone:
#   helper   gpu-workload in a session whose leader is dead, under a child subreaper
#            (test/gpu/session-orphan.c): CRIU forks a helper task in the dead leader's
#            place (its pid) as gpu-workload's parent, and ends it once the tasks are
#            restored. gpu-workload stops itself at its process-group line ("Restoring
#            PID to PGID pgid", before the end of CR_STATE_FORKING), the others wait for it;
#   sibling  a tree of three GPU processes in a UTS namespace of their own, restored with
#            --restore-sibling (as runc and podman restore containers): the root task's
#            parent is criu's caller. criu stops itself at "Wait until namespaces are
#            created"; the root task waits for criu at the end of CR_STATE_ROOT_TASK.
# Due: no task left (the helper included), stopped or let go, within 5 s; the images
# unchanged; the next restore works and the processes verify their GPU memory.
case_restore_killed_forking() {
	on mi100 -- restore_killed_forking helper
	on mi100x2 -- restore_killed_forking sibling
}
restore_killed_forking() {
	local img=$CASE_DIR/img-$1 root stopper text args=() wls=() tasks=()
	case $1 in
	helper)
		orphan_start --mib 2 --bos 2
		root=$ROOT stopper=$WL text="Restoring $WL to " wls=("$WL") tasks=("$ROOT" "$LEADER" "$WL")
		;;
	sibling)
		printf '#!/bin/sh\nexec unshare --uts %s "$@"\n' "$WORKLOAD" >"$CASE_DIR/uts-workload"
		chmod +x "$CASE_DIR/uts-workload"
		WORKLOAD=$CASE_DIR/uts-workload wl_start wl --procs 3 --mib 2 --bos 2
		read -r -a wls <<<"$WL $(wl_children "$WL")"
		[ "${#wls[@]}" = 3 ] || fail "gpu-workload --procs 3 named $((${#wls[@]} - 1)) children, not 2"
		root=$WL stopper=criu text="Wait until namespaces are created" tasks=("${wls[@]}") args=(--restore-sibling)
		;;
	*) fail "no tree $1" ;;
	esac
	wl_verify "${wls[@]}" >/dev/null || exit 1
	dump_ok "$root" "$img"
	stat -c %s "$CASE_DIR/wl.out" "$CASE_DIR/wl.err" >"$CASE_DIR/wl.sizes"
	kill_restore_untied "$1" "$img" "$stopper" "$text" "${tasks[*]}" "${args[@]}"
	rewind_output
	restore_ok "$img" "$root" "${args[@]}"
	[ "$1" != helper ] || ! alive "$LEADER" || fail "the helper task $LEADER still runs after the restore"
	wl_verify "${wls[@]}" >/dev/null || exit 1
	wl_finish "${wls[@]}"
	[ "$1" != helper ] || { kill -TERM "$ROOT" && wait_gone "$ROOT" 5; } || fail "session-orphan $ROOT did not end"
}
# orphan_start ARG...: session-orphan runs gpu-workload ARG... in a session whose leader is
# gone; ROOT, LEADER (the dead leader) and WL (gpu-workload) are set once it is ready.
orphan_start() {
	local prog=$CASE_DIR/session-orphan line i
	cc -std=gnu11 -Wall -Wextra -Werror -O2 -o "$prog" "$top/test/gpu/session-orphan.c" 2>"$CASE_DIR/cc.log" ||
		fail "session-orphan.c does not build: $(head -n 3 "$CASE_DIR/cc.log" | paste -sd' ')"
	WL_OUT=$CASE_DIR/wl.out
	setsid "$prog" "$WORKLOAD" "$@" </dev/null >"$WL_OUT" 2>"$CASE_DIR/wl.err" &
	ROOT=$!
	for ((i = 0; i < 1200; i++)); do
		line=$(grep -a -m1 '^session-orphan: leader' "$CASE_DIR/wl.err")
		[[ $line =~ leader\ ([0-9]+)\ gone,\ PROGRAM\ pid\ ([0-9]+) ]] &&
			grep -q "^{\"ready\":true,\"pid\":${BASH_REMATCH[2]}," "$WL_OUT" && break
		alive "$ROOT" || break
		sleep 0.05
	done
	[[ $line =~ leader\ ([0-9]+)\ gone,\ PROGRAM\ pid\ ([0-9]+) ]] &&
		grep -q "^{\"ready\":true,\"pid\":${BASH_REMATCH[2]}," "$WL_OUT" ||
		fail "session-orphan with gpu-workload $* did not get ready: $(tail -n 3 "$CASE_DIR/wl.err" | paste -sd' ')"
	LEADER=${BASH_REMATCH[1]} WL=${BASH_REMATCH[2]}
}
# kill_restore_untied TREE IMG STOPPER TEXT "TASKS" [ARG...]: restores IMG (with ARG...);
# STOPPER (a task's pid, or criu) stops itself at its first log line holding TEXT,
# and criu is killed there. No task of TASKS may be left, the images must be unchanged.
kill_restore_untied() {
	local what="criu killed before the restorers watch it ($1)" img=$2 stopper=$3 text=$4
	local log=$CASE_DIR/restore-killed-$1.log cpid before p up=() tasks
	read -r -a tasks <<<"$5"
	shift 5
	before=$(img_sums "$img")
	rewind_output
	CRIU_ROCM_TEST_STOP_ON_LOG=$text "$CRIU" restore -D "$img" -o "$log" -v4 -d "$@" >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	[ "$stopper" = criu ] && stopper=$cpid
	wait_stopped "$stopper" "$cpid" || fail "$what: $stopper never stopped at /$text/: $(log_errors "$log")"
	kill -KILL "$cpid"
	wait "$cpid" 2>/dev/null
	# Stopped or let go, no task may stay; their pids stay taken while init reaps them.
	kill -CONT "$stopper" 2>/dev/null
	for p in "${tasks[@]}"; do
		wait_gone "$p" 5 || up+=("$p $(proc_state "$p")")
	done
	if [ "${#up[@]}" != 0 ]; then
		for p in "${tasks[@]}"; do kill -KILL "$p" 2>/dev/null; done
		for p in "${tasks[@]}"; do wait_gone "$p" 5; done
		fail "$what: tasks outlived criu-rocm (pid state): ${up[*]} (killed now; $log)"
	fi
	no_leftovers "$what"
	[ "$before" = "$(img_sums "$img")" ] || fail "$what: the images changed"
	note "$what: no task left of ${#tasks[@]}"
}

# A tree of three GPU processes. CRIU's restore often opens /dev/kfd in them in another
# order than they first did (it varies from run to run); kfd-emu then moves each one back
# to the /dev/kfd slot its recorded doorbell and events mmap offsets name (its log says so
# at level info). Their queues must run and their events fire again.
case_restore_multi_process() { KFD_EMU_LOG=info on mi100x2 -- restore_multi_process; }
restore_multi_process() {
	local img=$CASE_DIR/img kids v0 v1 i moves handed
	wl_start wl --procs 3 --threads 2 --mib 2 --bos 2 --events
	kids=$(wl_children "$WL")
	# shellcheck disable=SC2086
	v0=$(wl_verify "$WL" $kids) || exit 1
	dump_ok "$WL" "$img"
	restore_ok "$img" "$WL"
	# One writer for the tree: each process handed it its BO contents.
	handed=$(grep -ac "BO contents handed to the GPU memory writer" "$LAST_RESTORE_LOG")
	[ "$handed" = 3 ] || fail "$handed of 3 processes handed their BO contents to the writer ($LAST_RESTORE_LOG)"
	# shellcheck disable=SC2086
	v1=$(wl_verify "$WL" $kids) || exit 1
	for i in 1 2 3; do
		counters_cmp "$(sed -n ${i}p <<<"$v0")" "$(sed -n ${i}p <<<"$v1")" ge || fail "counters went back in process $i"
	done
	# shellcheck disable=SC2086
	wl_finish "$WL" $kids
	moves=$(grep -o 'process [0-9]*: moved from /dev/kfd slot .*' "$CASE_DIR/kfd-emu.log" |
		sed 's|moved from /dev/kfd slot|slot|; s|to its image.s slot|->|' | paste -sd';' | sed 's/;/; /g')
	note "kfd-emu moved $(grep -c 'moved from /dev/kfd slot' "$CASE_DIR/kfd-emu.log") of 3 restored" \
		"processes back to the /dev/kfd slots of their images${moves:+: $moves}"
}

# A tree of 64 GPU processes (issue 25): each its own KFD process with BOs, an SDMA counter
# and a --vmas mapping set of its own, dumped, restored through one GPU memory writer and
# verified, every counter going on. Its dump and restore times are in the notes.
case_restore_tree_64() { on mi100 -- restore_tree_64; }
restore_tree_64() {
	local img=$CASE_DIR/img kids v0 v1 i n t0 t1 t2 handed
	wl_start wl --procs 64 --mib 1 --bos 2 --small-bos 2 --vmas 16 --interval-ms 20
	kids=$(wl_children "$WL")
	[ "$(wc -w <<<"$kids")" = 63 ] || fail "gpu-workload --procs 64 reports children '$kids'"
	# shellcheck disable=SC2086
	v0=$(wl_verify "$WL" $kids) || exit 1
	t0=$EPOCHREALTIME
	dump_ok "$WL" "$img"
	t1=$EPOCHREALTIME
	n=$(find "$img" -name 'amdgpu-kfd-*.img' | wc -l)
	[ "$n" = 64 ] || fail "the dump wrote $n KFD images, not 64"
	restore_ok "$img" "$WL"
	t2=$EPOCHREALTIME
	handed=$(grep -ac "BO contents handed to the GPU memory writer" "$LAST_RESTORE_LOG")
	[ "$handed" = 64 ] || fail "$handed of 64 processes handed their BO contents to the writer ($LAST_RESTORE_LOG)"
	# shellcheck disable=SC2086
	v1=$(wl_verify "$WL" $kids) || exit 1
	for ((i = 1; i <= 64; i++)); do
		counters_cmp "$(sed -n ${i}p <<<"$v0")" "$(sed -n ${i}p <<<"$v1")" ge || fail "counters went back in process $i"
	done
	# shellcheck disable=SC2086
	wl_finish "$WL" $kids
	note "64 GPU processes: dump $(((${t1/./} - ${t0/./}) / 1000)) ms, restore $(((${t2/./} - ${t1/./}) / 1000)) ms"
}

# Five dump/restore cycles, alternating between two hosts with different gpu_ids: each
# dump must keep naming the GPUs by the ids the process started with.
case_restore_five_cycles() {
	local i
	on mi100x2 -- cycle_start
	for i in 1 2 3 4 5; do
		if [ $((i % 2)) = 1 ]; then
			on mi100x2 --profile-file "$(host_file mi100x2-other)" -- cycle_step "$i"
		else
			on mi100x2 -- cycle_step "$i"
		fi
	done
}
cycle_start() {
	wl_start wl --mib 4 --bos 2 --events --fresh --threads 1
	wl_verify "$WL" >"$CASE_DIR/last.line" || exit 1
	cycle_dump 1
}
cycle_dump() {
	local img=$CASE_DIR/img$1 g
	dump_ok "$WL" "$img"
	for g in $(wl_gpus_hex "$WL"); do
		ls "$img"/amdgpu-pages-*-"$g".img >/dev/null 2>&1 ||
			fail "dump $1: no pages file for GPU $g (the id the process knows): $(cd "$img" && ls amdgpu-pages-* | paste -sd' ')"
	done
}
cycle_step() {
	local n=$1 v last
	WL_OUT=$CASE_DIR/wl.out
	WL=$(cat "$CASE_DIR/wl.pid")
	last=$(cat "$CASE_DIR/last.line")
	restore_ok "$CASE_DIR/img$n" "$WL"
	v=$(wl_verify "$WL") || exit 1
	counters_cmp "$last" "$v" ge || fail "cycle $n: counters went back: $(json_list "$last" counters) then $(json_list "$v" counters)"
	[ "$(json_num "$v" events)" -gt "$(json_num "$last" events)" ] || fail "cycle $n: events stopped firing"
	echo "$v" >"$CASE_DIR/last.line"
	if [ "$n" = 5 ]; then
		wl_finish "$WL"
		note "counters after 5 cycles: $(json_list "$v" counters); events fired: $(json_num "$v" events)"
	else
		cycle_dump $((n + 1))
	fi
}

# ---------------------------------------------------------------------------------------
# Cases: --stream, CRIU's image streamer (issue #28). test/gpu/streamer.py plays
# criu-image-streamer (packaged neither in Debian nor as a crate): `capture` takes every
# file CRIU sends into one stream file, `serve` gives them back, one request at a time
# and each file once, as the real tool does. The image directory holds only the socket
# and the logs: no GPU image file touches it.

# stream_dump_ok PID DIR STREAM [ARG...]: a dump (CR_ACTION) of PID with --stream into
# STREAM must succeed; no GPU image file may land in DIR.
stream_dump_ok() {
	local pid=$1 dir=$2 stream=$3 st=0
	shift 3
	stream_start capture "$dir" "$stream"
	"$CRIU" "${CR_ACTION:-dump}" -t "$pid" -D "$dir" -o dump.log -v4 --stream "$@" >>"$CASE_DIR/criu.out" 2>&1 ||
		fail "criu-rocm ${CR_ACTION:-dump} --stream of $pid failed: $(log_errors "$dir/dump.log")"
	wait "$STREAMER_PID" || st=$?
	[ "$st" = 0 ] || fail "the test streamer (capture) ended with $st: $(tail -n 3 "$dir/streamer-capture.log")"
	! ls "$dir" | grep -q '^amdgpu-' || fail "GPU image files landed in the image directory: $(ls "$dir" | paste -sd' ')"
	guardian_gone "the streamed dump"
}

# stream_restore DIR STREAM LOG [ARG...]: a restore with --stream served from STREAM;
# its status.
stream_restore() {
	local dir=$1 stream=$2 log=$3 st=0
	shift 3
	stream_start serve "$dir" "$stream"
	"$CRIU" restore -D "$dir" -o "$log" -v4 -d --stream "$@" >>"$CASE_DIR/criu.out" 2>&1 || st=$?
	# A failed restore may leave the peer waiting for requests that never come.
	wait_gone "$STREAMER_PID" 5 || kill -KILL "$STREAMER_PID" 2>/dev/null
	wait "$STREAMER_PID" 2>/dev/null
	return "$st"
}

# served_once DIR: every GPU file the capture took was served exactly once.
served_once() {
	local f dup
	for f in $(sed -n 's/^streamer: capture \(amdgpu-[^ ]*\) .*/\1/p' "$1/streamer-capture.log"); do
		grep -q "^streamer: serve $f " "$1/streamer-serve.log" || fail "$f was never asked for: $(paste -sd' ' "$1/streamer-serve.log")"
	done
	dup=$(sed -n 's/^streamer: \(serve\|missing\) \(amdgpu-[^ ]*\).*/\2/p' "$1/streamer-serve.log" | sort | uniq -d)
	[ -z "$dup" ] || fail "GPU files asked for more than once: $dup"
}

# Dump with --stream, restore with --stream on the same host: the GPU images go through the
# streamer, the pages files as they are copied, amdgpu-digests.img last; the restore asks
# for each once and the process runs on with every byte.
case_stream_same_host() { on mi100x2 -- stream_same_host; }
stream_same_host() {
	local dir=$CASE_DIR/dir stream=$CASE_DIR/img.stream v0 v1 last sizes
	wl_start wl --mib 8 --bos 4 --events --threads 2
	v0=$(wl_verify "$WL") || exit 1
	stream_dump_ok "$WL" "$dir" "$stream"
	wait "$WL" 2>/dev/null
	wait_gone "$WL" 5 || fail "$WL still runs after the dump"
	sizes=$(streamer list "$stream" | grep '^amdgpu-')
	grep -q '^amdgpu-kfd-' <<<"$sizes" && grep -q '^amdgpu-pages-' <<<"$sizes" &&
		grep -q '^amdgpu-renderD-' <<<"$sizes" && grep -q '^amdgpu-digests.img ' <<<"$sizes" ||
		fail "the stream lacks GPU images: $(paste -sd' ' <<<"$sizes")"
	last=$(grep -a '^streamer: request amdgpu-' "$dir/streamer-capture.log" | tail -n 1)
	[[ $last == "streamer: request amdgpu-digests.img" ]] || fail "amdgpu-digests.img is not the last GPU file sent to the stream: $last"
	log_has "$dir/dump.log" "sent [0-9]+ GPU metadata file\(s\), [0-9]+ bytes, to the image streamer"
	stream_restore "$dir" "$stream" "$dir/restore.log" || fail "criu-rocm restore --stream failed: $(log_errors "$dir/restore.log")"
	alive "$WL" || fail "after the restore gpu-workload $WL does not run"
	log_has "$dir/restore.log" "fetched amdgpu-digests.img and [0-9]+ GPU metadata file\(s\) from the image streamer" \
		"amdgpu: pid $WL: GPU queues resumed"
	served_once "$dir"
	v1=$(wl_verify "$WL") || exit 1
	same_bytes "$v0" "$v1"
	counters_kept "$v0" "$v1"
	wl_finish "$WL"
	note "stream of $(stat -c %s "$stream") bytes; GPU files: $(sed 's/ /:/' <<<"$sizes" | paste -sd' ')"
}

# Dumped with --stream on one mi100x2, restored with --stream on another (other gpu_ids,
# minors and GPU order), the stream file carried between them.
case_stream_other_host() {
	on mi100x2 -- stream_dump_for_later wl --mib 4 --bos 2 --events
	on mi100x2 --profile-file "$(host_file mi100x2-other)" -- stream_restore_other_host
}
stream_dump_for_later() {
	local name=$1
	shift
	wl_start "$name" "$@"
	wl_verify "$WL" >/dev/null || exit 1
	stream_dump_ok "$WL" "$CASE_DIR/dir" "$CASE_DIR/img.stream" ${STREAM_DUMP_ARGS:-}
	# Killed by the dump (status 137).
	wait "$WL" 2>/dev/null
	wait_gone "$WL" 5 || fail "$WL still runs after the dump"
}
stream_restore_other_host() {
	local dir=$CASE_DIR/dir pid map fds
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	stream_restore "$dir" "$CASE_DIR/img.stream" "$dir/restore.log" ||
		fail "criu-rocm restore --stream on the other host failed: $(log_errors "$dir/restore.log")"
	alive "$pid" || fail "after the restore gpu-workload $pid does not run"
	map=$(restore_mapping "$dir/restore.log")
	fds=$(render_fds "$pid" | awk '{print $2}' | sort | paste -sd' ')
	[ "$fds" = "130 131" ] || fail "the restored process' render fds are on minors '$fds', not 130 131"
	served_once "$dir"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "$map"
}

# Compressed pages files (KFD_COMPRESS) through the streamer, three compression lanes
# placing their records in order into one pipe; decompressed as they are read back.
case_stream_compressed() {
	STREAM_DUMP_ARGS="--gpu-knob KFD_COMPRESS=zstd --gpu-knob KFD_COMPRESS_THREADS=3" \
		on mi100x2 -- stream_dump_for_later wl --mib 2 --bos 2 --big-bo-mib 64 --big-bo-fill sparse
	on mi100x2 -- stream_restore_compressed
}
stream_restore_compressed() {
	local dir=$CASE_DIR/dir pid raw
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	raw=$(streamer list "$CASE_DIR/img.stream" | awk '/^amdgpu-pages-/ {s += $2} END {print s + 0}')
	# Two mostly-zero 64 MiB BOs and a few MiB of data.
	[ "$raw" -gt 0 ] && [ $((raw * 16)) -lt $((128 << 20)) ] || fail "the streamed pages files hold $raw bytes: not compressed"
	stream_restore "$dir" "$CASE_DIR/img.stream" "$dir/restore.log" ||
		fail "criu-rocm restore --stream of compressed pages failed: $(log_errors "$dir/restore.log")"
	alive "$pid" || fail "after the restore gpu-workload $pid does not run"
	log_has "$dir/restore.log" "compressed GPU pages"
	served_once "$dir"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "compressed pages files of $raw bytes in the stream for two mostly-zero 64 MiB BOs and the workload's data"
}

# pre-dump --stream: CRIU streams a pre-dump's images, and so does criu-rocm (the GPU
# memory read while the process runs). A stream carries no parent: a dump with
# --prev-images-dir and --stream is refused before anything is frozen.
case_stream_predump() { on mi100x2 -- stream_predump; }
stream_predump() {
	local dir=$CASE_DIR/dir v0 sizes st=0
	wl_start wl --mib 8 --bos 2 --events
	v0=$(wl_verify "$WL") || exit 1
	CR_ACTION=pre-dump stream_dump_ok "$WL" "$dir" "$CASE_DIR/pre.stream"
	sizes=$(streamer list "$CASE_DIR/pre.stream" | grep '^amdgpu-')
	grep -q '^amdgpu-kfd-' <<<"$sizes" && grep -q '^amdgpu-pages-' <<<"$sizes" && grep -q '^amdgpu-digests.img ' <<<"$sizes" ||
		fail "the pre-dump's stream lacks GPU images: $(paste -sd' ' <<<"$sizes")"
	log_has "$dir/dump.log" "amdgpu: pid $WL: GPU queues unpaused after [0-9.]+ ms paused"
	running_on "$WL" "$v0"
	mkdir -p "$CASE_DIR/prev"
	stream_start capture "$dir" "$CASE_DIR/inc.stream"
	"$CRIU" dump -t "$WL" -D "$dir" -o inc.log -v4 --stream --prev-images-dir ../prev >>"$CASE_DIR/criu.out" 2>&1 && st=0 || st=$?
	kill -KILL "$STREAMER_PID" 2>/dev/null
	wait "$STREAMER_PID" 2>/dev/null
	[ "$st" != 0 ] || fail "dump --stream --prev-images-dir succeeded"
	log_has "$dir/inc.log" "--prev-images-dir \.\./prev with --stream: the image streamer carries no parent images"
	! grep -aq "Seizing\|GPU queues paused" "$dir/inc.log" || fail "the refused dump froze the tree first"
	running_on "$WL" "$v0"
	wl_finish "$WL"
	note "pre-dump stream: $(sed 's/ /:/' <<<"$sizes" | paste -sd' ')"
}

# stream_dump_fault FAULT: the streamer dies (die) or stops reading (stop) once 1 MiB of a
# pages file went through; the dump must fail with the process running, its GPU unpaused,
# no guardian left, and the stream must not restore.
stream_dump_fault() {
	local fault=$1 dir=$CASE_DIR/dir stream=$CASE_DIR/img.stream v0 st=0 spid
	wl_start wl --mib 32 --bos 2 --events
	v0=$(wl_verify "$WL") || exit 1
	STREAMER_FAULT=$fault:amdgpu-pages-:1048576 stream_start capture "$dir" "$stream"
	spid=$STREAMER_PID
	CRIU_ROCM_STREAM_TIMEOUT=2 "$CRIU" dump -t "$WL" -D "$dir" -o dump.log -v4 --stream >>"$CASE_DIR/criu.out" 2>&1 || st=$?
	[ "$st" != 0 ] || fail "the dump succeeded though the streamer ${fault}d"
	grep -q "^streamer: $fault amdgpu-pages-" "$dir/streamer-capture.log" ||
		fail "the streamer never reached its fault: $(tail -n 3 "$dir/streamer-capture.log")"
	case $fault in
	die) log_has "$dir/dump.log" "the image streamer closed amdgpu-pages-[0-9]+-[0-9a-f]+\.img after [0-9]+ bytes" ;;
	stop) log_has "$dir/dump.log" "the image streamer took no byte of amdgpu-pages-[0-9]+-[0-9a-f]+\.img for 2 s \(CRIU_ROCM_STREAM_TIMEOUT\)" ;;
	esac
	log_has "$dir/dump.log" "amdgpu: pid $WL: GPU queues paused"
	! grep -aq "unpaused by the GPU guardian" "$dir/dump.log" || fail "the guardian had to unpause: criu-rocm did not"
	kill -KILL "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	guardian_gone "streamer ${fault}d mid-dump"
	running_on "$WL" "$v0"
	# What the streamer took is no image: its GPU files end without amdgpu-digests.img.
	! streamer list "$stream" | grep -q '^amdgpu-digests.img ' || fail "the failed dump's stream holds amdgpu-digests.img"
	wl_finish "$WL"
	note "criu-rocm: $(grep -a -m1 -oE "the image streamer (closed|took no byte of) [^;]*" "$dir/dump.log"); the process ran on"
}
case_stream_dump_streamer_killed() { on mi100x2 -- stream_dump_fault die; }
case_stream_dump_streamer_stopped() { on mi100x2 -- stream_dump_fault stop; }

# The streamer dies while the GPU memory writer reads a pages file from it: no task may
# run its code (the writer's verdict fails the gate), nothing may be left behind, and the
# same stream restores afterwards.
case_stream_restore_streamer_killed() {
	on mi100x2 -- stream_dump_for_later wl --mib 32 --bos 2 --events
	on mi100x2 -- stream_restore_killed
}
stream_restore_killed() {
	local dir=$CASE_DIR/dir pid log=$CASE_DIR/dir/restore-killed.log
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	if STREAMER_FAULT=die:amdgpu-pages-:1048576 stream_restore "$dir" "$CASE_DIR/img.stream" "$log"; then
		fail "the restore succeeded though the streamer died"
	fi
	grep -q "^streamer: die amdgpu-pages-" "$dir/streamer-serve.log" ||
		fail "the streamer never reached its fault: $(tail -n 3 "$dir/streamer-serve.log")"
	! grep -aq "GPU queues resumed" "$log" || fail "the failed restore resumed GPU queues ($log)"
	wait_gone "$pid" 5 || fail "the failed restore left $pid running"
	no_leftovers "streamer killed mid-restore"
	log_has "$log" "amdgpu-pages-[0-9]+-[0-9a-f]+\.img"
	stream_restore "$dir" "$CASE_DIR/img.stream" "$dir/restore.log" ||
		fail "the second restore --stream failed: $(log_errors "$dir/restore.log")"
	alive "$pid" || fail "after the second restore gpu-workload $pid does not run"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "killed mid-pages: $(log_errors "$log" 1)"
}

# A stream damaged in a KFD image, then in a pages file: the restore refuses the first
# before any task exists (amdgpu-digests.img), and fails the second before any task runs
# (the BO's content hash, checked as the pages are read).
case_stream_damaged() {
	on mi100x2 -- stream_dump_for_later wl --mib 4 --bos 2
	on mi100x2 -- stream_damaged
}
stream_damaged() {
	local dir=$CASE_DIR/dir pid what
	WL_OUT=$CASE_DIR/wl.out
	pid=$(cat "$CASE_DIR/wl.pid")
	for what in amdgpu-kfd- amdgpu-pages-; do
		cp "$CASE_DIR/img.stream" "$CASE_DIR/bad.stream"
		flip_in_stream "$CASE_DIR/bad.stream" "$what" || fail "no $what file in the stream"
		if stream_restore "$dir" "$CASE_DIR/bad.stream" "$dir/restore-$what.log"; then
			fail "a stream with a damaged $what file restored"
		fi
		! grep -aq "GPU queues resumed" "$dir/restore-$what.log" || fail "the damaged $what restore resumed GPU queues"
		wait_gone "$pid" 5 || fail "the refused restore left $pid running"
		no_leftovers "damaged $what"
	done
	log_has "$dir/restore-amdgpu-kfd-.log" "amdgpu-kfd-[0-9]+\.img: .*amdgpu-digests\.img recorded .* at dump: the file was changed" \
		"no task was created, no GPU device opened"
	log_has "$dir/restore-amdgpu-pages-.log" "amdgpu-pages-[0-9]+-[0-9a-f]+\.img"
	stream_restore "$dir" "$CASE_DIR/img.stream" "$dir/restore.log" ||
		fail "the undamaged stream did not restore: $(log_errors "$dir/restore.log")"
	alive "$pid" || fail "after the restore gpu-workload $pid does not run"
	wl_verify "$pid" >/dev/null || exit 1
	wl_finish "$pid"
	note "KFD image: $(grep -a -m1 -oE 'amdgpu-kfd-[0-9]+\.img: [^|]*changed' "$dir/restore-amdgpu-kfd-.log"); pages: $(log_errors "$dir/restore-amdgpu-pages-.log" 1)"
}

# flip_in_stream STREAM PREFIX: flips one byte in the middle of the data of the first file
# of the test stream whose name starts with PREFIX.
flip_in_stream() {
	/usr/bin/python3 - "$1" "$2" <<'PY'
import os, struct, sys
path, prefix = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    f.seek(len(b"criu-rocm test stream 1\n"))
    names, want = {}, None
    while True:
        kind = f.read(1)
        if not kind:
            sys.exit(1)
        if kind == b"F":
            fid, n = struct.unpack("<IH", f.read(6))
            names[fid] = f.read(n).decode()
        elif kind == b"D":
            fid, n = struct.unpack("<II", f.read(8))
            if names[fid].startswith(prefix) and n > 64:
                at = f.tell() + n // 2
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0xFF]))
                sys.exit(0)
            f.seek(n, os.SEEK_CUR)
        elif kind == b"E":
            f.read(4)
PY
}

# ---------------------------------------------------------------------------------------
# Cases: HIP kernels in flight at the dump (issue 27). test/hip/in-flight.hip (Debian's HIP
# 5.2) starts a kernel on every GPU whose waves hold registers and LDS and then spin on a
# host flag, which the program sets on SIGUSR1; then every work-item meets its workgroup at
# a barrier and finishes, and the program checks every result against the host. kfd-emu
# saves the waves into each queue's context save area at PROCESS_INFO (its log says so per
# queue) and rebuilds them from there when the queue runs again.

# hip_start: builds in-flight (build/hip) and starts it with --signal; returns once every
# kernel runs. Sets HIP_PID and HIP_OUT; the pid goes to $CASE_DIR/hip.pid.
hip_start() {
	local bin i
	bin=$("$top/test/hip/run.sh" --build in-flight) ||
		fail "hipcc could not build test/hip/in-flight.hip (see build/hip/logs/in-flight.build)"
	HIP_OUT=$CASE_DIR/in-flight.out
	setsid "$bin" --signal </dev/null >"$HIP_OUT" 2>&1 &
	HIP_PID=$!
	for ((i = 0; i < 1200; i++)); do
		grep -q "^in-flight: [0-9]* GPUs$" "$HIP_OUT" && break
		alive "$HIP_PID" || break
		sleep 0.05
	done
	grep -q "^in-flight: every kernel waits for its flag: .* ok$" "$HIP_OUT" ||
		fail "in-flight did not get its kernels running: $(tail -n 3 "$HIP_OUT" | paste -sd' ')"
	echo "$HIP_PID" >"$CASE_DIR/hip.pid"
}

# hip_finish PID GPUS: raises the flag; the kernel of each of the GPUS GPUs must end with
# the host's result and the program exit.
hip_finish() {
	local pid=$1 gpus=$2 n
	kill -USR1 "$pid" || fail "in-flight $pid is gone"
	await_line "$HIP_OUT" '^in-flight: (PASSED|FAILED)$' '^in-flight: PASSED$' 1200 "$pid" ||
		fail "in-flight did not pass: $(tail -n 4 "$HIP_OUT" | paste -sd' ')"
	n=$(grep -c "^in-flight: GPU [0-9]*'s kernel against the host: 8192 values checked, 0 mismatches: ok$" "$HIP_OUT")
	[ "$n" = "$gpus" ] || fail "in-flight checked the kernels of $n GPUs, not $gpus"
	wait_gone "$pid" || fail "in-flight $pid still runs after it passed"
}

# saved_queues N: kfd-emu (KFD_EMU_LOG=info) logged the waves of at least N queues saved.
saved_queues() {
	local n
	n=$(grep -c "waves saved into the context save area" "$CASE_DIR/kfd-emu.log")
	[ "$n" -ge "$1" ] || fail "kfd-emu saved the waves of $n queues, not $1 (see $CASE_DIR/kfd-emu.log)"
}

# A kernel in flight on each of mi210x4's GPUs at the dump; restored on the same host, each
# finishes with the host's result.
case_hip_kernel_in_flight() { KFD_EMU_LOG=info on mi210x4 -- hip_kernel_in_flight; }
hip_kernel_in_flight() {
	hip_start
	dump_ok "$HIP_PID" "$CASE_DIR/img"
	saved_queues 4
	restore_ok "$CASE_DIR/img" "$HIP_PID"
	hip_finish "$HIP_PID" 4
	note "$(grep -m1 -o "[0-9]* resident waves saved" "$CASE_DIR/kfd-emu.log") (first queue)"
}

# The same, restored on another mi210x4 (other gpu_ids, render minors and GPU order): the
# image alone carries the waves.
case_hip_kernel_in_flight_other_host() {
	KFD_EMU_LOG=info on mi210x4 -- hip_dump_for_later
	KFD_EMU_LOG=info on mi210x4 --profile-file "$(host_file mi210x4-other)" -- hip_restore_other_host
}
hip_dump_for_later() {
	hip_start
	dump_ok "$HIP_PID" "$CASE_DIR/img"
	saved_queues 4
}
hip_restore_other_host() {
	local pid map
	HIP_OUT=$CASE_DIR/in-flight.out
	pid=$(cat "$CASE_DIR/hip.pid")
	restore_ok "$CASE_DIR/img" "$pid"
	map=$(restore_mapping "$LAST_RESTORE_LOG")
	grep -q "renderD13[2-5]" <<<"$map" || fail "the restore did not map onto the other host's GPUs: $map"
	hip_finish "$pid" 4
	note "$map"
}

# A pre-dump while the kernels are in flight (their waves saved, then resumed from the save
# areas at UNPAUSE), then an incremental dump against it, restored: every kernel finishes
# with the host's result.
case_hip_kernel_in_flight_predump() { KFD_EMU_LOG=info on mi210x4 -- hip_kernel_in_flight_predump; }
hip_kernel_in_flight_predump() {
	local pre=$CASE_DIR/pre img=$CASE_DIR/img
	hip_start
	pre_dump_ok "$HIP_PID" "$pre" >/dev/null
	saved_queues 4
	alive "$HIP_PID" || fail "in-flight $HIP_PID is gone after the pre-dump"
	dump_ok "$HIP_PID" "$img" --prev-images-dir ../pre
	log_has "$img/dump.log" "amdgpu: pid $HIP_PID: incremental GPU dump against parent/amdgpu-kfd-[0-9]+\.img"
	saved_queues 8
	restore_ok "$img" "$HIP_PID"
	hip_finish "$HIP_PID" 4
}

# Dumped and restored through CRIU's image streamer (--stream) while the kernels are in
# flight.
case_hip_kernel_in_flight_stream() { KFD_EMU_LOG=info on mi210x4 -- hip_kernel_in_flight_stream; }
hip_kernel_in_flight_stream() {
	local dir=$CASE_DIR/dir stream=$CASE_DIR/img.stream
	hip_start
	stream_dump_ok "$HIP_PID" "$dir" "$stream"
	wait "$HIP_PID" 2>/dev/null
	wait_gone "$HIP_PID" 5 || fail "$HIP_PID still runs after the dump"
	saved_queues 4
	stream_restore "$dir" "$stream" "$dir/restore.log" ||
		fail "criu-rocm restore --stream failed: $(log_errors "$dir/restore.log")"
	log_has "$dir/restore.log" "amdgpu: pid $HIP_PID: GPU queues resumed"
	hip_finish "$HIP_PID" 4
}

# criu-rocm killed (SIGKILL) right after PROCESS_INFO saved the waves: the GPU guardian
# unpauses, the queues rebuild their waves from the save areas, and every kernel finishes
# with the host's result.
case_hip_dump_killed_after_wave_save() { KFD_EMU_LOG=info on mi210x4 -- hip_dump_killed_after_wave_save; }
hip_dump_killed_after_wave_save() {
	local img=$CASE_DIR/img
	hip_start
	dump_killed "$HIP_PID" "$img" "amdgpu: pid $HIP_PID: GPU queues paused" KILL
	waves_saved_then_unpaused "$img/$CR_ACTION.log" "the killed dump"
}

# After a dump killed with the waves of 4 queues saved: the GPU guardian unpauses (its line
# in LOG), no guardian is left (WHAT names the dump), and every kernel finishes.
waves_saved_then_unpaused() { # LOG WHAT
	local line i
	saved_queues 4
	line="amdgpu: pid $HIP_PID: GPU queues unpaused by the GPU guardian"
	for ((i = 0; i < 300; i++)); do
		grep -aq -- "$line" "$1" && break
		sleep 0.05
	done
	log_has "$1" "$line"
	guardian_gone "$2"
	alive "$HIP_PID" || fail "the killed dump did not leave in-flight $HIP_PID running"
	hip_finish "$HIP_PID" 4
}

# A dump killed (criu-rocm, SIGKILL) while kfd-emu's PROCESS_INFO saves the waves of the
# kernels in flight (held there by --hold SAVE_WAVES, after the pause, without the state
# lock): the kill waits for the ioctl, as it does on KFD; once the waves are saved criu-rocm
# ends, the GPU guardian unpauses, and every kernel goes on from its save area and finishes
# with the host's result.
case_hip_dump_killed_while_saving_waves() {
	KFD_EMU_LOG=info on mi210x4 --hold "SAVE_WAVES:$CASE_DIR/go" -- hip_dump_killed_while_saving_waves
}
hip_dump_killed_while_saving_waves() {
	local img=$CASE_DIR/img cpid
	hip_start
	mkdir -p "$img"
	"$CRIU" dump -t "$HIP_PID" -D "$img" -o dump.log -v4 >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	wait_file "$CASE_DIR/go.held" 60 || fail "the dump never reached the wave save ($img/dump.log)"
	kill -KILL "$cpid"
	touch "$CASE_DIR/go"
	wait "$cpid" 2>/dev/null
	waves_saved_then_unpaused "$img/dump.log" "the dump killed while saving waves"
}

# A restore of kernels in flight killed (criu-rocm, SIGKILL) while kfd-emu holds its RESUME
# (--hold): no task of the tree is left, none in its own code, the images unchanged; the next
# restore of the same images resumes every kernel, which finishes with the host's result
# although the killed restore left CRIU's ghost file of HIP's deleted comgr temporary in /tmp
# (patch 0080: each restore names its ghosts its own way).
case_hip_restore_killed_before_resume() {
	KFD_EMU_LOG=info on mi210x4 -- hip_dump_for_later
	KFD_EMU_LOG=info on mi210x4 --hold "RESUME:$CASE_DIR/go" -- hip_restore_killed_before_resume
}
hip_restore_killed_before_resume() {
	local img=$CASE_DIR/img pid cpid log=$CASE_DIR/restore-killed.log before ghosts
	HIP_OUT=$CASE_DIR/in-flight.out
	pid=$(cat "$CASE_DIR/hip.pid")
	before=$(img_sums "$img")
	find /tmp -maxdepth 1 -name '*.cr.*.ghost' | sort >"$CASE_DIR/ghosts.before"
	"$CRIU" restore -D "$img" -o "$log" -v4 -d >>"$CASE_DIR/criu.out" 2>&1 &
	cpid=$!
	wait_file "$CASE_DIR/go.held" 60 || fail "the restore never reached its RESUME ($log)"
	kill -KILL "$cpid"
	wait "$cpid" 2>/dev/null
	touch "$CASE_DIR/go"
	wait_gone "$pid" 10 || fail "in-flight $pid runs after its restore was killed before RESUME"
	no_leftovers "the restore killed before RESUME"
	[ "$before" = "$(img_sums "$img")" ] || fail "the killed restore changed the images"
	# (ghosts carry the dumped file's times: told apart by name)
	ghosts=$(find /tmp -maxdepth 1 -name '*.cr.*.ghost' | sort | comm -13 "$CASE_DIR/ghosts.before" -)
	[ -n "$ghosts" ] || fail "the killed restore left no ghost file in /tmp: this case no longer tests that one is not in the next restore's way"
	restore_ok "$img" "$pid"
	# What the killed restore left is for whoever cleans up: here, this case.
	rm -f $ghosts
	hip_finish "$pid" 4
}

# ---------------------------------------------------------------------------------------
# The driver

# Case order: as written in this file.
ordered_cases() {
	grep -o '^case_[a-z0-9_]*()' "$self" | sed 's/^case_//; s/()$//'
}

preflight() {
	local c
	[ "$(id -u)" = 0 ] || { echo "test/gpu/run.sh: needs root (kfd-emu mounts FUSE nodes, CRIU needs CAP_SYS_ADMIN)" >&2; exit 2; }
	for c in "$CRIU" "$KFD_EMU" "$WORKLOAD"; do
		[ -x "$c" ] || { echo "test/gpu/run.sh: $c is missing (make test-gpu builds it)" >&2; exit 2; }
	done
	for c in protoc setpriv unshare timeout sha256sum /usr/bin/python3; do
		command -v "$c" >/dev/null || { echo "test/gpu/run.sh: $c is missing (scripts/install-deps.sh)" >&2; exit 2; }
	done
}

upstream_proto() {
	local tarball
	CRIU_VERSION=$(sed -n 's/^CRIU_VERSION=//p' "$top/criu/upstream.lock")
	CRIU_TARBALL_NAME=$(sed -n 's/^CRIU_TARBALL_NAME=//p' "$top/criu/upstream.lock")
	tarball=$top/build/cache/$CRIU_TARBALL_NAME
	if [ -f "$tarball" ] &&
		tar -xJOf "$tarball" "criu-$CRIU_VERSION/plugins/amdgpu/criu-amdgpu.proto" >"$WORK/upstream/criu-amdgpu.proto" 2>/dev/null; then
		return 0
	fi
	cp "$top/build/criu-$CRIU_VERSION/plugins/amdgpu/criu-amdgpu.proto" "$WORK/upstream/criu-amdgpu.proto" 2>/dev/null
}

main() {
	cases_select test/gpu/run.sh "$@"
	WORK=$(mktemp -d /tmp/criu-rocm-gpu-test.XXXXXX)
	mkdir -p "$WORK/upstream"
	upstream_proto || { echo "test/gpu/run.sh: upstream's criu-amdgpu.proto not found (run make first)" >&2; exit 2; }
	export WORK UPSTREAM_PROTO=$WORK/upstream/criu-amdgpu.proto
	echo "GPU tests: ${#WANTED[@]} case(s), criu-rocm $CRIU, work directory $WORK"
	cases_run_all "${GPU_TEST_KEEP:-}"
}

cases_dispatch "$@"
CRIU=$(realpath "$1")
shift
target=${CARGO_TARGET_DIR:-$top/rust/target}/release
KFD_EMU=$target/kfd-emu
CRIT=${CRIT:-$top/build/crit}
WORKLOAD=$target/gpu-workload
CASE_TIMEOUT=${GPU_TEST_TIMEOUT:-150}
export CRIU KFD_EMU WORKLOAD CASE_TIMEOUT CRIT
preflight
exec unshare --pid --fork --mount-proc --kill-child "$self" __main "$@"
