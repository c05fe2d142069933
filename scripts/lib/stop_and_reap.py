#!/usr/bin/python3
"""Stops restored processes that are children of the caller, and keeps their exit status.

  usage: exec stop_and_reap.py [--prefix P] SECS [--no-term] NAME PID OUT [[--no-term] NAME PID OUT ...]

Sends each PID SIGTERM (upon which the test programs check their memory once more and
end), waits up to SECS seconds for it to exit and writes its exit status to OUT. A
triple after --no-term is sent nothing: it is waited for to end on its own (a training
run restored mid-way: test/hip-cr, scripts/demo.sh). A restore with --restore-sibling
makes the restored processes children of the restore driver, but bash neither waits for a
child it did not start nor keeps the status of one it reaps: so a shell script execs this
in its own place (same process, same children) before they can exit. Exits 1 with
"P<reason>" on stderr when one does not end, ended before SIGTERM, or is not a child
(scripts/demo.sh, test/rocm/cr.sh).
"""
import os
import signal
import sys
import time


def triples(rest):
    """(name, pid, out, term) of each NAME PID OUT, term False after --no-term."""
    out = []
    while rest:
        term = rest[0] != "--no-term"
        if not term:
            rest = rest[1:]
        if len(rest) < 3:
            sys.exit(__doc__)
        out.append((rest[0], int(rest[1]), rest[2], term))
        rest = rest[3:]
    return out


def main(argv):
    prefix = ""
    if argv[:1] == ["--prefix"]:
        prefix, argv = argv[1], argv[2:]
    if not argv:
        sys.exit(__doc__)
    secs, rest = float(argv[0]), triples(argv[1:])
    if not rest:
        sys.exit(__doc__)
    for name, pid, out, term in rest:
        try:
            os.kill(pid, signal.SIGTERM if term else 0)
            deadline = time.monotonic() + secs
            while (r := os.waitpid(pid, os.WNOHANG))[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    after = "SIGTERM" if term else "the restore"
                    sys.exit(f"{prefix}{name} (pid {pid}) still runs {secs:g} s after {after}")
                time.sleep(0.05)
        except ProcessLookupError:
            sys.exit(f"{prefix}the restored {name} (pid {pid}) ended before SIGTERM")
        except ChildProcessError:
            sys.exit(f"{prefix}the restored {name} (pid {pid}) is not a child of the restore driver")
        with open(out, "w") as f:
            f.write(f"{os.waitstatus_to_exitcode(r[1])}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
