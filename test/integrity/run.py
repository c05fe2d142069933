#!/usr/bin/python3
"""GPU image integrity on a mutation corpus (issue 14; `make test-integrity`).

  usage: test/integrity/run.py CRIU_BINARY [--seed N] [--only REGEX]
  env:   CARGO_TARGET_DIR       where kfd-emu and gpu-workload were built (rust/target)
         INTEGRITY_KEEP=1       keep the work directory even when everything passed

Dumps one gpu-workload (two GPUs, VRAM and GTT BOs, small BOs, an event, a render-node
GEM BO) on an
emulated mi100x2 host, writes >= 200 seeded mutants of its GPU image files
(test/integrity/mutate.py: byte and bit flips, truncation, zeroing, extension,
size-word changes, protobuf field edits, also with the digests file forged
to match, deleted and swapped files, KFD's private data edited as someone who
writes images would), and, of a second dump of the same process
(--leave-running, KFD_COMPRESS=zstd), the zstd-* mutants of its compressed pages files
(mutate.zstd_mutants: damage inside the frames, the records' length words, cut and
extended files, exchanged frames, the compression fields edited and forged), and on a
of shared-bo's dumps (SCENARIOS below) the gem-* mutants (mutate.gem_mutants: the GEM,
shared-BO and dma-buf records' fields edited, removed and forged), and on a
fresh mi100x2 host runs
`criu-rocm gpu-check` and `criu-rocm restore` on every mutant (all of them:
the ~250-350 restores take about a minute on 2 cores, well inside the
suite's budget, so no refused mutant is left out). Each mutant must end as
one of:

  refused   gpu-check and the restore both refuse, and a reason gpu-check
            printed ("NOT restorable...: REASON") appears word for word in the
            restore's log; nothing runs afterwards;
  verified  both accept: the restore succeeds and the process checks every
            byte of its BOs, its SDMA counters and its event (gpu-workload's own
            verification), then exits cleanly (shared-bo: a round written through
            one holder reads back through every other, the child's too, and its
            last check passes);

and never modify an image file (every *.img is hashed before and after).
The intact images go first, as a control: they must end "verified". The
hostile-* mutants (mutate.hostile_kfd: KFD's private data edited
self-consistently, the digests rewritten to match, values KFD never writes)
must end "refused".
Anything else fails the run, named: "disagree" (one refuses, the other not,
or different reasons), "silent" (the restore succeeded but the process found
damage, hung or died, or a refused restore left it running), "modified".
The last lines are a table per class and "N passed, M failed"; the exit
status is non-zero on any failure.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import mutate  # noqa: E402

PROFILE = "mi100x2"
# --other-render-opens --gem-bo: a render file holding a GEM BO of its own (issue 29), so
# that the corpus has a render image with a drm_bo_entry and the render file's pages file.
WORKLOAD_ARGS = ["--mib", "2", "--bos", "3", "--small-bos", "2", "--events",
                 "--other-render-opens", "--gem-bo"]
# shared-bo's dumps (test/rocm/shared-bo.c under `kfd-emu supervise`, issue 29), mutated by
# mutate.gem_mutants: "fork", a GEM BO held by a parent's two render files and its child's
# one (same_bo_file/index, same_bo_pid), pre-dumped and then dumped incrementally with
# the BO unchanged (parent_extents, parent_bo, criu_rocm_parent, criu_rocm_pid);
# "dmabuf", a GEM BO's dma-buf fd kept by the process (amdgpu-dmabuf_<id>.img). Their
# restores run under the supervisor (which hands out the restored dma-bufs).
SCENARIOS = {"fork": ["--hold", "--fork"], "dmabuf": ["--dmabuf"]}
RESTORE_TIMEOUT = 120
VERIFY_TIMEOUT = 60
OUTCOMES = ["refused", "verified", "disagree", "silent", "modified"]
FAILURES = {"disagree", "silent", "modified"}


def log(msg):
    print(msg, flush=True)


class Fail(Exception):
    pass


# ---------------------------------------------------------------------------
# Processes

def alive(pid):
    try:
        st = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return st.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pid, secs):
    end = time.time() + secs
    while time.time() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def lines_of(path, pid):
    pre = '{"ok":'
    tag = f',"pid":{pid},'
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return []
    return [ln for ln in text.splitlines() if ln.startswith(pre) and tag in ln]


def verify(out, pid, sig, secs):
    """Sends sig to pid and waits for its next verification line: the line, or None."""
    n = len(lines_of(out, pid))
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return None
    end = time.time() + secs
    while time.time() < end:
        ls = lines_of(out, pid)
        if len(ls) > n:
            return ls[n]
        if not alive(pid):
            ls = lines_of(out, pid)
            return ls[n] if len(ls) > n else None
        time.sleep(0.05)
    return None


def field(line, name):
    m = re.search(rf'"{name}":(\d+)', line.split(',"errors":')[0])
    return int(m.group(1)) if m else None


def leftovers():
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            comm = open(f"/proc/{d}/comm").read().strip()
        except OSError:
            continue
        if comm in ("gpu-workload", "shared-bo", "criu-rocm", "criu", "criu-gpu-guard", "criu-rocm-gpuwr") \
                and alive(int(d)):
            out.append(f"{d} {comm}")
    return out


def img_hashes(d):
    h = {}
    for n in sorted(os.listdir(d)):
        if n.endswith(".img"):
            with open(os.path.join(d, n), "rb") as fh:
                h[n] = hashlib.sha256(fh.read()).hexdigest()
    return h


# ---------------------------------------------------------------------------
# Inside the dump host

def in_dump(work):
    criu = os.environ["CRIU"]
    out = os.path.join(work, "wl.out")
    # O_APPEND|O_WRONLY: CRIU does not pin the size of such a file, so every
    # restore finds it however much earlier restores appended.
    with open(out, "ab") as o, open(os.path.join(work, "wl.err"), "ab") as e:
        wl = subprocess.Popen([os.environ["WORKLOAD"]] + WORKLOAD_ARGS, stdin=subprocess.DEVNULL,
                              stdout=o, stderr=e, start_new_session=True)
    end = time.time() + 60
    ready = None
    while time.time() < end and ready is None:
        for ln in open(out, errors="replace").read().splitlines():
            if ln.startswith(f'{{"ready":true,"pid":{wl.pid},'):
                ready = ln
        if wl.poll() is not None:
            break
        time.sleep(0.05)
    if ready is None:
        raise Fail(f"gpu-workload did not get ready: {open(os.path.join(work, 'wl.err')).read()[-300:]}")
    base = verify(out, wl.pid, signal.SIGUSR1, VERIFY_TIMEOUT)
    if base is None or not base.startswith('{"ok":true,'):
        raise Fail(f"gpu-workload's verification before the dump: {base}")
    # First the same process with compressed pages files (KFD_COMPRESS=zstd), left
    # running: its mutants restore the same pid as the others'.
    zimg = os.path.join(work, "img-zstd")
    os.makedirs(zimg)
    r = subprocess.run([criu, "dump", "-t", str(wl.pid), "-D", zimg, "-o", "dump.log", "-v4",
                        "--leave-running", "--gpu-knob", "KFD_COMPRESS=zstd"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Fail(f"criu-rocm dump --leave-running with KFD_COMPRESS=zstd failed "
                   f"(exit {r.returncode}); see {zimg}/dump.log")
    img = os.path.join(work, "img")
    os.makedirs(img)
    r = subprocess.run([criu, "dump", "-t", str(wl.pid), "-D", img, "-o", "dump.log", "-v4"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise Fail(f"criu-rocm dump failed (exit {r.returncode}); see {img}/dump.log")
    wl.wait(timeout=10)
    sb = {name: dump_shared_bo(work, name) for name in SCENARIOS}
    with open(os.path.join(work, "baseline.json"), "w") as fh:
        json.dump({"pid": wl.pid, "line": base, "sb": sb}, fh)


def sb_out(work, name):
    return os.path.join(work, f"sb-{name}.out")


def wait_line(path, regex, secs, after=0):
    """The first line of path past the first `after` that matches regex, or None."""
    end = time.time() + secs
    while time.time() < end:
        ls = [ln for ln in open(path, errors="replace").read().splitlines()
              if re.match(regex, ln)]
        if len(ls) > after:
            return ls[after]
        time.sleep(0.05)
    return None


def count_lines(path, regex):
    return sum(1 for ln in open(path, errors="replace").read().splitlines() if re.match(regex, ln))


def dump_shared_bo(work, name):
    """shared-bo SCENARIOS[name] started under the supervisor and dumped into img-NAME (the
    fork scenario: pre-dumped into img-NAME-pre first, then dumped against it): its pids."""
    criu, out = os.environ["CRIU"], sb_out(work, name)
    with open(out, "ab") as o:
        sup = subprocess.Popen([os.environ["KFD_EMU"], "supervise", "--",
                                os.path.join(work, "shared-bo")] + SCENARIOS[name],
                               stdin=subprocess.DEVNULL, stdout=o, stderr=o,
                               start_new_session=True)
    ready = wait_line(out, r"^ready \d+", 30)
    if ready is None:
        raise Fail(f"shared-bo {' '.join(SCENARIOS[name])} did not get ready: "
                   f"{open(out, errors='replace').read()[-300:]}")
    pids = [int(ready.split()[1])]
    if name == "fork":
        child = wait_line(out, r"^child \d+ ok$", 10)
        if child is None:
            raise Fail(f"shared-bo --fork's child did not import the BO: "
                       f"{open(out, errors='replace').read()[-300:]}")
        pids.append(int(child.split()[1]))
    img = os.path.join(work, f"img-{name}")
    prev = []
    if name == "fork":
        pre = img + "-pre"
        os.makedirs(pre)
        r = subprocess.run([criu, "pre-dump", "-t", str(pids[0]), "-D", pre, "-o",
                            "pre-dump.log", "-v4"], capture_output=True, text=True)
        if r.returncode != 0:
            raise Fail(f"criu-rocm pre-dump of shared-bo failed (exit {r.returncode}); "
                       f"see {pre}/pre-dump.log")
        prev = ["--prev-images-dir", "../" + os.path.basename(pre)]
    os.makedirs(img)
    r = subprocess.run([criu, "dump", "-t", str(pids[0]), "-D", img, "-o", "dump.log", "-v4"]
                       + prev, capture_output=True, text=True)
    if r.returncode != 0:
        raise Fail(f"criu-rocm dump of shared-bo failed (exit {r.returncode}); "
                   f"see {img}/dump.log")
    sup.wait(timeout=10)
    return pids


# ---------------------------------------------------------------------------
# Inside the check host

def reasons_of(text, rc):
    """The refusal reasons gpu-check printed (empty when it accepted)."""
    if rc == 0:
        return []
    rs = []
    for ln in text.splitlines():
        m = re.search(r"NOT restorable(?: here)?: (.*)$", ln)
        if m:
            rs.append(m.group(1).strip())
    if not rs:
        for ln in text.splitlines():
            m = re.match(r"criu-rocm gpu-check: (?:\S+: )?(.*)$", ln)
            if m:
                rs.append(m.group(1).strip())
    return [r for r in rs if r]


def restore_one(work, m, pid, baseline):
    """Restores mutant m: (accepted, detail)."""
    criu = os.environ["CRIU"]
    d = os.path.join(work, "mutants", m["dir"])
    logf = os.path.join(work, "logs", m["dir"] + ".restore.log")
    out = os.path.join(work, "wl.out")
    try:
        r = subprocess.run([criu, "restore", "-D", d, "-o", logf, "-v4", "-d"],
                           capture_output=True, text=True, timeout=RESTORE_TIMEOUT)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0:
        if not wait_gone(pid, 5):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5)
            return None, f"restore failed ({rc}) but pid {pid} runs"
        return False, f"restore failed ({rc})"
    if not alive(pid):
        return None, "restore exit 0 but the process does not run"
    v = verify(out, pid, signal.SIGUSR1, VERIFY_TIMEOUT)
    bad = None
    if v is None:
        bad = "no verification line after SIGUSR1"
    elif not v.startswith('{"ok":true,'):
        bad = f"verification failed: {v[:300]}"
    elif field(v, "bytes") != field(baseline, "bytes"):
        bad = f"verified {field(v, 'bytes')} bytes, {field(baseline, 'bytes')} before the dump"
    if bad is None:
        fin = verify(out, pid, signal.SIGTERM, VERIFY_TIMEOUT)
        if fin is None or not fin.startswith('{"ok":true,'):
            bad = f"final verification: {(fin or 'none')[:300]}"
        elif not wait_gone(pid, 15):
            bad = "still runs after its final verification"
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 5)
    return (None, bad) if bad else (True, "restored, every byte verified")


def restore_sb(work, m, name, pids):
    """Restores mutant m of shared-bo's dump `name` under the supervisor: (accepted,
    detail)."""
    criu = os.environ["CRIU"]
    d = os.path.join(work, "mutants", m["dir"])
    logf = os.path.join(work, "logs", m["dir"] + ".restore.log")
    try:
        r = subprocess.run([os.environ["KFD_EMU"], "supervise", "--", criu, "restore", "-D", d,
                            "-o", logf, "-v4", "-d"], capture_output=True, text=True,
                           timeout=RESTORE_TIMEOUT)
        rc = r.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    if rc != 0:
        if not all(wait_gone(p, 5) for p in pids):
            kill_all(pids)
            return None, f"restore failed ({rc}) but pids {pids} run"
        return False, f"restore failed ({rc})"
    if not all(alive(p) for p in pids):
        kill_all(pids)
        return None, f"restore exit 0 but not all of {pids} run"
    bad = sb_check(sb_out(work, name), pids)
    kill_all(pids)
    return (None, bad) if bad else (True, "restored, a round through every holder verified")


def kill_all(pids):
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)
            wait_gone(p, 5)


def sb_check(out, pids):
    """shared-bo's own checks after a restore: a round written through the first holder and
    read through the other (and, forked, the child's), then its last check on SIGTERM.
    None, or what failed."""
    steps = [(pids[0], signal.SIGUSR1, r"^round \d+: ", r"^round \d+: ok$")]
    if len(pids) > 1:
        steps += [(pids[1], signal.SIGUSR1, r"^(child reads round \d+|FAIL child)",
                   r"^child reads round \d+: ok$"),
                  (pids[1], signal.SIGTERM, None, None)]
    steps += [(pids[0], signal.SIGTERM, r"^(PASS|FAIL)", r"^PASS$")]
    for pid, sig, line, ok in steps:
        n = count_lines(out, line) if line else 0
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return f"{pid} is gone before {signal.Signals(sig).name}"
        if line is None:
            if not wait_gone(pid, 15):
                return f"{pid} still runs after SIGTERM"
            continue
        got = wait_line(out, line, VERIFY_TIMEOUT, n)
        if got is None or not re.match(ok, got):
            return f"after {signal.Signals(sig).name} to {pid}: {got or 'no line'}"
    if not wait_gone(pids[0], 15):
        return f"{pids[0]} still runs after its last check"
    return None


def in_check(work):
    man = json.load(open(os.path.join(work, "mutants", "manifest.json")))
    base = json.load(open(os.path.join(work, "baseline.json")))
    pid, baseline = base["pid"], base["line"]
    criu = os.environ["CRIU"]
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    results = []
    t0 = time.time()
    for m in man:
        d = os.path.join(work, "mutants", m["dir"])
        before = img_hashes(d)
        try:
            r = subprocess.run([criu, "gpu-check", "-D", d], capture_output=True, text=True,
                               timeout=RESTORE_TIMEOUT)
            rc, text = r.returncode, (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            rc, text = "timeout", f"gpu-check did not finish within {RESTORE_TIMEOUT} s"
        with open(os.path.join(work, "logs", m["dir"] + ".gpu-check"), "w") as fh:
            fh.write(text + "\n")
        results.append({"m": m, "gc_rc": rc, "gc": text, "reasons": reasons_of(text, rc),
                        "before": before})
    t_gc = time.time() - t0
    t1 = time.time()
    n_restores = 0
    for x in results:
        m = x["m"]
        n_restores += 1
        sc = m.get("scenario", "wl")
        if sc == "wl":
            x["restored"], x["detail"] = restore_one(work, m, pid, baseline)
        else:
            x["restored"], x["detail"] = restore_sb(work, m, sc, base["sb"][sc])
        left = leftovers()
        if left:
            x["restored"], x["detail"] = None, f"left behind: {'; '.join(left)}"
            for p in left:
                try:
                    os.kill(int(p.split()[0]), signal.SIGKILL)
                except OSError:
                    pass
        after = img_hashes(os.path.join(work, "mutants", m["dir"]))
        x["modified"] = sorted(n for n in set(x["before"]) | set(after)
                               if x["before"].get(n) != after.get(n))
        del x["before"]
    t_restore = time.time() - t1
    with open(os.path.join(work, "results.json"), "w") as fh:
        json.dump({"results": results, "t_gc": t_gc, "t_restore": t_restore,
                   "n_restores": n_restores}, fh)


# ---------------------------------------------------------------------------
# The verdicts

def verdict(x, logs):
    """(outcome, why) of one mutant."""
    m = x["m"]
    if x["modified"]:
        return "modified", f"images changed: {', '.join(x['modified'])}"
    gc_ok = x["gc_rc"] == 0
    r = x["restored"]
    if r is None:
        return "silent", x["detail"]
    if gc_ok and r:
        return "verified", x["detail"]
    if gc_ok and not r:
        why = restore_reason(os.path.join(logs, m["dir"] + ".restore.log"))
        return "disagree", f"gpu-check: {last_line(x['gc'])} | restore: {x['detail']}: {why}"
    if not gc_ok and r:
        return "disagree", f"gpu-check refused ({'; '.join(x['reasons']) or last_line(x['gc'])}) " \
                           f"but the restore succeeded and the process verified"
    text = open(os.path.join(logs, m["dir"] + ".restore.log"), errors="replace").read()
    if not x["reasons"]:
        return "disagree", f"gpu-check exit {x['gc_rc']} without a reason: {x['gc'][-200:]}"
    for reason in x["reasons"]:
        if reason in text:
            return "refused", reason
    return "disagree", f"gpu-check: {x['reasons'][0]} | restore: " \
                       f"{restore_reason(os.path.join(logs, m['dir'] + '.restore.log'))}"


def last_line(text):
    ls = [ln for ln in text.splitlines() if ln.strip()]
    return ls[-1] if ls else "(no output)"


def restore_reason(path):
    try:
        ls = open(path, errors="replace").read().splitlines()
    except OSError:
        return "(no log)"
    errs = [re.sub(r"^\([0-9. ]*\) *", "", ln) for ln in ls
            if ("Error" in ln or "amdgpu:" in ln) and "RLIMIT_NOFILE" not in ln
            and re.search(r"rror|fail|refus|FAIL", ln)]
    return " | ".join(errs[:2]) if errs else "(no error line)"


def report(work):
    res = json.load(open(os.path.join(work, "results.json")))
    logs = os.path.join(work, "logs")
    table = {}
    failed = []
    for x in res["results"]:
        out, why = verdict(x, logs)
        m = x["m"]
        table.setdefault(m["class"], {o: 0 for o in OUTCOMES})[out] += 1
        if out in FAILURES or (m["class"] == "intact" and out != "verified") or \
                (m["class"] == "hostile" and out != "refused"):
            failed.append((m, out, why))
    for m, out, why in failed:
        log(f"FAIL {m['name']} ({m['what']}): {out}: {why[:400]}")
    w = max(len(c) for c in table) + 2
    log("")
    log("class".ljust(w) + "".join(f"{o:>10}" for o in OUTCOMES + ["all"]))
    total = {o: 0 for o in OUTCOMES}
    for cls in sorted(table) + ["total"]:
        row = table.get(cls, total)
        if cls != "total":
            for o in OUTCOMES:
                total[o] += row[o]
        log(cls.ljust(w) + "".join(f"{row[o]:>10}" for o in OUTCOMES) + f"{sum(row.values()):>10}")
    n = sum(total.values())
    log(f"gpu-check on {n} mutants in {res['t_gc']:.0f} s; {res['n_restores']} restores "
        f"(and verifications) in {res['t_restore']:.0f} s")
    return n - len(failed), len(failed)


# ---------------------------------------------------------------------------

def build_shared_bo(work):
    """test/rocm/shared-bo.c built into the work directory."""
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libdrm"], check=True,
                               capture_output=True, text=True).stdout.split()
        subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-o",
                        os.path.join(work, "shared-bo"), os.path.join(TOP, "test/rocm/shared-bo.c")]
                       + flags, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise Fail(f"test/rocm/shared-bo.c does not build: {getattr(e, 'stderr', e)}")


def on_host(work, *args):
    kfd_emu = os.environ["KFD_EMU"]
    with open(os.path.join(work, "kfd-emu.log"), "ab") as e:
        r = subprocess.run([kfd_emu, "run", "--profile", PROFILE, "--", sys.executable,
                            os.path.realpath(__file__)] + list(args), stderr=e)
    if r.returncode != 0:
        try:
            why = open(os.path.join(work, "reason")).read().strip()
        except OSError:
            why = f"see {work}/kfd-emu.log"
        raise Fail(f"kfd-emu run -- {args[0]}: exit {r.returncode}: {why}")


def main(argv):
    seed, only = mutate.DEFAULT_SEED, None
    if "--seed" in argv:
        seed = int(argv[argv.index("--seed") + 1])
    if "--only" in argv:
        only = re.compile(argv[argv.index("--only") + 1])
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="criu-rocm-integrity.")
    log(f"GPU image integrity: criu-rocm {os.environ['CRIU']}, seed {seed}, "
        f"work directory {work}")
    try:
        build_shared_bo(work)
        on_host(work, "__dump", work)
        img = mutate.Images(os.path.join(work, "img"))
        ms = mutate.mutants(img, seed)
        if only:
            ms = [m for m in ms if only.search(m.name)]
        if not only and len(ms) < 200:
            raise Fail(f"only {len(ms)} mutants of {img.dir}: fewer than the 200 this test needs")
        zimg = mutate.Images(os.path.join(work, "img-zstd"))
        zms = mutate.zstd_mutants(zimg, seed)
        if only:
            zms = [m for m in zms if only.search(m.name)]
        # The controls, first: the intact images must restore, verified, or
        # every refusal below would prove nothing.
        ms.insert(0, mutate.Mutant("intact", "intact", None, "the images as dumped"))
        zms.insert(0, mutate.Mutant("zstd-intact", "intact", None,
                                    "the compressed images as dumped"))
        gems = []
        for name in SCENARIOS:
            gimg = mutate.Images(os.path.join(work, f"img-{name}"), kfd_needed=False)
            g = mutate.gem_mutants(gimg, name, seed)
            if only:
                g = [m for m in g if only.search(m.name)]
            intact = mutate.Mutant(f"gem-{name}-intact", "intact", None,
                                   f"shared-bo {' '.join(SCENARIOS[name])}'s images as dumped")
            intact.scenario = name
            gems += [(gimg, m) for m in [intact] + g]
        man = []
        for k, (src, m) in enumerate([(img, m) for m in ms] + [(zimg, m) for m in zms] + gems):
            d = f"m{k:03d}"
            mutate.write(src, m, os.path.join(work, "mutants", d))
            man.append({"name": m.name, "dir": d, "class": m.cls, "file": m.file, "what": m.what,
                        "scenario": m.scenario})
        os.makedirs(os.path.join(work, "mutants"), exist_ok=True)
        with open(os.path.join(work, "mutants", "manifest.json"), "w") as fh:
            json.dump(man, fh, indent=1)
        classes = {}
        for m in ms[1:] + zms[1:] + [m for _, m in gems if m.cls != "intact"]:
            classes[m.cls] = classes.get(m.cls, 0) + 1
        log(f"{len(ms)} mutants of {len(img.gpu_files())} GPU image files: "
            + ", ".join(f"{c} {n}" for c, n in sorted(classes.items())))
        dumped = [img.dir, zimg.dir] + [d for name in SCENARIOS
                                        for d in (os.path.join(work, f"img-{name}"),
                                                  os.path.join(work, f"img-{name}-pre"))
                                        if os.path.isdir(d)]
        base = [img_hashes(d) for d in dumped]
        on_host(work, "__check", work)
        passed, failed = report(work)
        if [img_hashes(d) for d in dumped] != base:
            log("FAIL the dumped images changed (a restore wrote through a mutant's hard link)")
            failed += 1
    except Fail as e:
        log(f"FAIL {e}")
        passed, failed = 0, 1
    log(f"total {time.time() - t0:.0f} s")
    if failed == 0 and os.environ.get("INTEGRITY_KEEP") != "1":
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"work directory kept: {work}")
    log(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def preflight(argv):
    if os.geteuid() != 0:
        sys.exit("test/integrity/run.py: needs root (kfd-emu mounts FUSE nodes, CRIU needs "
                 "CAP_SYS_ADMIN)")
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    target = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(TOP, "rust/target")),
                          "release")
    env = {"CRIU": os.path.realpath(argv[0]), "KFD_EMU": os.path.join(target, "kfd-emu"),
           "WORKLOAD": os.path.join(target, "gpu-workload")}
    for p in env.values():
        if not os.access(p, os.X_OK):
            sys.exit(f"test/integrity/run.py: {p} is missing (make test-integrity builds it)")
    if not shutil.which("unshare"):
        sys.exit("test/integrity/run.py: unshare is missing (scripts/install-deps.sh)")
    os.environ.update(env)
    # A pid namespace of our own: the dumped pid stays free for every restore,
    # and nothing outlives the run.
    os.execvp("unshare", ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                          sys.executable, os.path.realpath(__file__), "__main"] + argv[1:])


if __name__ == "__main__":
    a = sys.argv[1:]
    try:
        if a[:1] == ["__main"]:
            sys.exit(main(a[1:]))
        if a[:1] == ["__dump"]:
            in_dump(a[1])
            sys.exit(0)
        if a[:1] == ["__check"]:
            in_check(a[1])
            sys.exit(0)
    except Fail as e:
        with open(os.path.join(a[1], "reason"), "a") as fh:
            fh.write(f"{e}\n")
        sys.exit(1)
    preflight(a)
