#!/usr/bin/python3
"""Stops restored processes that are children of the caller, and keeps their exit status.

  usage: exec stop_and_reap.py [--prefix P] [--no-term] SECS NAME PID OUT [NAME PID OUT ...]

Sends each PID SIGTERM (upon which the test programs check their memory once more and
end), waits up to SECS seconds for it to exit and writes its exit status to OUT. A
restore with --restore-sibling makes the restored processes children of the restore
driver, but bash neither waits for a child it did not start nor keeps the status of one
it reaps: so a shell script execs this in its own place (same process, same children)
before they can exit. With --no-term it sends nothing and waits for each to end on its own
(test/hip-cr: a training run restored mid-way). Exits 1 with "P<reason>" on stderr when one
does not end, ended before SIGTERM, or is not a child (scripts/demo.sh, test/rocm/cr.sh).
"""
import os
import signal
import sys
import time


def main(argv):
    prefix, term = "", True
    if argv[:1] == ["--prefix"]:
        prefix, argv = argv[1], argv[2:]
    if argv[:1] == ["--no-term"]:
        term, argv = False, argv[1:]
    secs, rest = float(argv[0]), argv[1:]
    if not rest or len(rest) % 3:
        sys.exit(__doc__)
    for name, pid, out in zip(rest[0::3], map(int, rest[1::3]), rest[2::3]):
        try:
            if term:
                os.kill(pid, signal.SIGTERM)
            else:
                os.kill(pid, 0)
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
