#!/usr/bin/python3
"""An empty directory served over FUSE, for tests of what criu-rocm refuses on FUSE.

  usage: test/gpu/fuse-dir.py MOUNTPOINT      (as root, in a private mount namespace)

Mounts a FUSE filesystem (allow_other) at MOUNTPOINT whose root is an empty directory owned
by root, mode 0755 -- what any FUSE daemon may claim of any files it serves -- prints
"mounted" once the kernel's INIT is answered, and serves until the mount goes away
(umount: the kernel ends the connection). Speaks the kernel's FUSE protocol on /dev/fuse
directly (protocol 7.31): INIT, GETATTR, STATFS, LOOKUP (nothing is there), OPENDIR,
READDIR (empty), RELEASEDIR, ACCESS; ENOSYS for the rest.
"""

import errno
import os
import struct
import sys

INIT, GETATTR, LOOKUP, FORGET, STATFS, ACCESS = 26, 3, 1, 2, 17, 34
OPENDIR, READDIR, RELEASEDIR, DESTROY, BATCH_FORGET, INTERRUPT = 27, 28, 29, 38, 42, 36
NO_REPLY = (FORGET, BATCH_FORGET, INTERRUPT)
IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique


def attr():
    """fuse_attr_out of the root: 1 s valid, inode 1, a directory of root's, mode 0755."""
    fuse_attr = struct.pack("<QQQQQQIIIIIIIIII", 1, 0, 0, 0, 0, 0, 0, 0, 0,
                            0o040755, 2, 0, 0, 0, 4096, 0)
    return struct.pack("<QII", 1, 0, 0) + fuse_attr


def reply(fd, unique, error=0, body=b""):
    os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)


def answer(fd, opcode, unique, body):
    if opcode == INIT:
        major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
        # major, minor, max_readahead, flags, max_background, congestion_threshold,
        # max_write, time_gran, max_pages, map_alignment, flags2, unused[7]
        out = struct.pack("<IIIIHHIIHHI7I", 7, 31, readahead, 0, 16, 12, 65536, 1, 16, 0, 0,
                          *([0] * 7))
        reply(fd, unique, body=out)
    elif opcode == GETATTR:
        reply(fd, unique, body=attr())
    elif opcode == STATFS:
        reply(fd, unique, body=struct.pack("<QQQQQIIII6I", 0, 0, 0, 0, 0, 4096, 255, 4096, 0,
                                           *([0] * 6)))
    elif opcode == LOOKUP:
        reply(fd, unique, errno.ENOENT)
    elif opcode == OPENDIR:
        reply(fd, unique, body=struct.pack("<QII", 0, 0, 0))
    elif opcode in (READDIR, RELEASEDIR, ACCESS, DESTROY):
        reply(fd, unique)
    else:
        reply(fd, unique, errno.ENOSYS)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    fd = os.open("/dev/fuse", os.O_RDWR)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"fuse-dir", sys.argv[1].encode(), b"fuse.fuse-dir", 0, opts.encode()) != 0:
        e = ctypes.get_errno()
        sys.exit(f"fuse-dir.py: mounting FUSE on {sys.argv[1]}: {os.strerror(e)}")
    first = True
    while True:
        try:
            req = os.read(fd, 1 << 17)
        except OSError as e:
            if e.errno == errno.ENODEV:  # unmounted
                return
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            raise
        _, opcode, unique, _, _, _, _, _ = IN_HEADER.unpack_from(req)
        if opcode not in NO_REPLY:
            try:
                answer(fd, opcode, unique, req[IN_HEADER.size:])
            except OSError as e:
                if e.errno != errno.ENOENT:  # the request was interrupted meanwhile
                    raise
        if first and opcode == INIT:
            first = False
            print("mounted", flush=True)


if __name__ == "__main__":
    main()
