#!/usr/bin/python3
"""A small peer of CRIU's image streamer protocol, for the --stream tests.

criu-image-streamer (github.com/checkpoint-restore/criu-image-streamer) is packaged
neither in Debian nor as a Rust crate; this plays its part towards CRIU, as CRIU's
criu/img-streamer.c speaks it:

* CRIU connects to IMAGES_DIR/streamer-capture.sock (dump) or streamer-serve.sock
  (restore) and sends, per image file, one request: a little-endian u32 length, then an
  img_streamer_request_entry message (field 1, the file name);
* restore only: the streamer answers with a u32 length and an img_streamer_reply_entry
  (field 1, whether it has the file); CRIU stops there when it has not;
* CRIU sends one end of a new pipe (SCM_RIGHTS, one dummy byte): the write end at dump,
  which it writes the file into and closes; the read end at restore, which the streamer
  writes the file into and closes.

  capture IMAGES_DIR STREAM   takes every file CRIU sends, concurrently, into the file
                              STREAM (its own record format, below) until CRIU hangs up
                              and every pipe is closed
  serve IMAGES_DIR STREAM     serves the files of STREAM, one request at a time and each
                              file once (a second request is answered "no such file"),
                              as criu-image-streamer does, until CRIU hangs up
  list STREAM                 prints "NAME SIZE" per complete file

STREAMER_FAULT=die:PREFIX:BYTES or stop:PREFIX:BYTES (tests): once BYTES bytes of a file
whose name starts with PREFIX went through, the streamer kills itself (SIGKILL), or stops
moving that file's bytes for good (it keeps its pipe open).

Both print "socket-init" on stdout once the socket listens (as the real tool does on its
progress fd) and log every request on stderr ("serve NAME SIZE", "request NAME" as a
capture is asked for, "capture NAME SIZE" once its bytes are all in, "missing NAME"). A file whose pipe did not end is left out of the stream (CRIU failed).

STREAM: "criu-rocm test stream 1\\n", then records: b"F" u32 id u16 len name (a file
begins), b"D" u32 id u32 len bytes (its next bytes), b"E" u32 id (it ended whole).
"""
import fcntl
import os
import signal
import socket
import struct
import sys
import threading

MAGIC = b"criu-rocm test stream 1\n"
F_SETPIPE_SZ = 1031
SOCKETS = {"capture": "streamer-capture.sock", "serve": "streamer-serve.sock"}


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return v, i


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        got = conn.recv(n - len(buf))
        if not got:
            return None
        buf += got
    return buf


def recv_request(conn):
    """The next file name CRIU asks for, or None when it hung up."""
    head = recv_exact(conn, 4)
    if head is None:
        return None
    msg = recv_exact(conn, struct.unpack("<I", head)[0])
    if msg is None or not msg or msg[0] != 0x0A:
        raise SystemExit("streamer: malformed request")
    n, i = varint(msg, 1)
    return msg[i : i + n].decode()


def recv_pipe(conn):
    _, fds, _, _ = socket.recv_fds(conn, 1, 1)
    if len(fds) != 1:
        raise SystemExit("streamer: CRIU sent no pipe")
    return fds[0]


def listen(images, mode):
    path = os.path.join(images, SOCKETS[mode])
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    print("socket-init", flush=True)
    conn, _ = s.accept()
    s.close()
    os.unlink(path)
    return conn


def fault_at(name, before, after):
    """Applies STREAMER_FAULT when a file's bytes pass its mark."""
    spec = os.environ.get("STREAMER_FAULT")
    if not spec:
        return
    kind, prefix, at = spec.split(":")
    if not name.startswith(prefix) or not before < int(at) <= after:
        return
    log(kind, name, after)
    if kind == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Event().wait()


LOG_LOCK = threading.Lock()


def log(*words):
    with LOG_LOCK:
        sys.stderr.write(" ".join(["streamer:", *map(str, words)]) + "\n")
        sys.stderr.flush()


def capture(images, stream):
    out = open(stream, "wb")
    out.write(MAGIC)
    lock = threading.Lock()
    threads = []

    def take(fid, name, fd):
        size = 0
        with os.fdopen(fd, "rb", buffering=0) as p:
            while True:
                chunk = p.read(1 << 20)
                if not chunk:
                    break
                with lock:
                    out.write(b"D" + struct.pack("<II", fid, len(chunk)) + chunk)
                fault_at(name, size, size + len(chunk))
                size += len(chunk)
        with lock:
            out.write(b"E" + struct.pack("<I", fid))
        log("capture", name, size)

    conn = listen(images, "capture")
    fid = 0
    while True:
        name = recv_request(conn)
        if name is None:
            break
        fd = recv_pipe(conn)
        # In the order CRIU asked (each file's "capture" line comes when its
        # thread has read it all, which can be in another order).
        log("request", name)
        fid += 1
        raw = name.encode()
        with lock:
            out.write(b"F" + struct.pack("<IH", fid, len(raw)) + raw)
        t = threading.Thread(target=take, args=(fid, name, fd))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    out.close()


def index(stream):
    """{name: [(offset, length), ...]} of the files that ended whole."""
    names, chunks, whole = {}, {}, {}
    with open(stream, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise SystemExit(f"streamer: {stream} is no test stream")
        while True:
            kind = f.read(1)
            if not kind:
                break
            if kind == b"F":
                fid, n = struct.unpack("<IH", f.read(6))
                names[fid] = f.read(n).decode()
                chunks[fid] = []
            elif kind == b"D":
                fid, n = struct.unpack("<II", f.read(8))
                chunks[fid].append((f.tell(), n))
                f.seek(n, os.SEEK_CUR)
            elif kind == b"E":
                (fid,) = struct.unpack("<I", f.read(4))
                whole[names[fid]] = chunks[fid]
            else:
                raise SystemExit(f"streamer: {stream}: bad record {kind!r}")
    return whole


def serve(images, stream):
    files = index(stream)
    conn = listen(images, "serve")
    with open(stream, "rb") as f:
        while True:
            name = recv_request(conn)
            if name is None:
                break
            parts = files.pop(name, None)
            conn.sendall(struct.pack("<I", 2) + bytes([0x08, int(parts is not None)]))
            if parts is None:
                log("missing", name)
                continue
            fd = recv_pipe(conn)
            try:
                # As criu-image-streamer does: a file CRIU opens before it reads the
                # last one whole must fit in the pipe.
                fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
            size = 0
            try:
                with os.fdopen(fd, "wb", buffering=0) as p:
                    for off, n in parts:
                        f.seek(off)
                        data = f.read(n)
                        for i in range(0, n, 1 << 16):
                            fault_at(name, size, size + len(data[i : i + (1 << 16)]))
                            p.write(data[i : i + (1 << 16)])
                            size += len(data[i : i + (1 << 16)])
            except BrokenPipeError:
                log("broken", name, size)
                continue
            log("serve", name, size)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "list":
        for name, parts in sorted(index(sys.argv[2]).items()):
            print(name, sum(n for _, n in parts))
        return
    if len(sys.argv) != 4 or sys.argv[1] not in ("capture", "serve"):
        raise SystemExit(__doc__)
    {"capture": capture, "serve": serve}[sys.argv[1]](sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
