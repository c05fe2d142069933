#!/usr/bin/python3
"""Mutation corpus of one GPU image directory (test/integrity/run.py).

  mutate.py gen IMG_DIR OUT_DIR [--seed N]
      Writes OUT_DIR/<mutant>/ for every mutant of IMG_DIR's GPU image files
      (amdgpu-kfd-*.img, amdgpu-renderD-*.img, amdgpu-pages-*.img) and
      OUT_DIR/manifest.json: [{"name", "class", "file", "what"}] in order.
      Files a mutant does not change are hard links to IMG_DIR's (the runner
      hashes every image before and after each restore, so a write through a
      link cannot pass unseen). The same seed and the same image layout give
      the same mutants.
  mutate.py list IMG_DIR [--seed N]
      Prints the mutants (name, class, what) without writing them.

Classes: flip (a byte inverted or xor-ed), bitflip (one bit), truncate, zero
(a range set to zero), extend (bytes appended), size-prefix (the leading u64
size word changed), field (a protobuf field of a KFD or render-node image
edited, the file re-framed so its size word agrees), forged (the same edits,
but for bytes inside KFD's own blob, with the file's line in
amdgpu-digests.img rewritten to match, so that only the cross-checks behind
the digests can refuse them; when the dump wrote that file), delete (files removed), swap (files exchanged). The digests
file, when present, takes the raw damage classes too. zstd_mutants() makes the
zstd-* classes of a dump with compressed pages files (KFD_COMPRESS=zstd):
flip/bitflip/zero inside frames, record (a chunk's length word), truncate,
extend, swap (two records exchanged), field and forged (the KFD image's
pages_compression fields). Field edits parse the
wire format themselves (field numbers from proto/criu-amdgpu.proto), so they
need no protobuf package; digests are XXH3-64 from the system's libxxhash
(libxxhash0) through ctypes.
"""

import ctypes
import json
import os
import random
import re
import shutil
import struct
import sys

DEFAULT_SEED = 14

# criu_kfd
KFD_PID, KFD_NUM_GPUS, KFD_NUM_CPUS, KFD_DEVICES, KFD_NUM_BOS = 1, 2, 3, 4, 5
KFD_BOS, KFD_NUM_OBJECTS, KFD_PRIV = 6, 7, 10
KFD_EXT_VERSION = 1000
KFD_PRIV_RECORD = 1001
KFD_PAGES_COMPRESSION, KFD_PAGES_LEVEL, KFD_PAGES_CHUNK = 1005, 1006, 1008
# kfd_device_entry
DEV_GPU_ID, DEV_RENDER_MINOR = 2, 21
# kfd_bo_entry
BO_ADDR, BO_SIZE, BO_OFFSET, BO_FLAGS, BO_GPU_ID, BO_XXH3 = 1, 2, 3, 4, 5, 1000
# criu_render_node
RN_GPU_ID, RN_ID, RN_MINOR, RN_NUM_BOS, RN_BOS = 1, 2, 3, 4, 5
# drm_bo_entry (criu-dev's numbers; content_xxh3 ours) and drm_vm_entry
GEM_SIZE, GEM_OFFSET, GEM_DOMAINS, GEM_HANDLE, GEM_IMPORT, GEM_NUM_VMS = 2, 3, 6, 7, 8, 9
GEM_VMS, GEM_XXH3 = 10, 1000
GEM_SAME_FILE, GEM_SAME_INDEX = 1003, 1004  # criu-rocm: "the same BO as" (issue 29)
GEM_PARENT_EXTENTS, GEM_PARENT_BO, GEM_SAME_PID = 1005, 1006, 1007
GEM_VM_SIZE = 2
RN_PARENT, RN_PID = 1007, 1009
# criu_dmabuf_node: criu-dev's gem_handle, criu-rocm's 1000-1004
DMA_HANDLE, DMA_BO_FILE, DMA_BO_INDEX, DMA_GPU_ID, DMA_SIZE, DMA_FLAGS = 1, 1000, 1001, 1002, \
    1003, 1004

VRAM, GTT = 1, 2
U32, U64 = (1 << 32) - 1, (1 << 64) - 1


class Bad(Exception):
    pass


DIGESTS = "amdgpu-digests.img"
DIGESTS_HEADER = "criu-rocm GPU image digests 1"
_xxh = None


def xxh3_64(data):
    global _xxh
    if _xxh is None:
        try:
            lib = ctypes.CDLL("libxxhash.so.0")
        except OSError as e:
            raise Bad(f"cannot load libxxhash.so.0 (Debian's libxxhash0; "
                      f"scripts/install-deps.sh installs it): {e}")
        lib.XXH3_64bits.restype = ctypes.c_uint64
        lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        _xxh = lib.XXH3_64bits
    return _xxh(bytes(data), len(data))


def forge_digests(text, name, data):
    """The digests file with the line of `name` saying `data`'s size and XXH3."""
    lines = text.decode().split("\n")
    if not lines or lines[0] != DIGESTS_HEADER:
        raise Bad(f"{DIGESTS}: unknown header {lines[0][:60]!r}")
    found = False
    for i, ln in enumerate(lines):
        w = ln.split()
        if len(w) == 3 and w[0] == name:
            if not w[2].startswith("xxh3:"):
                raise Bad(f"{DIGESTS}: {name} has digest {w[2]!r}, not a whole-file xxh3")
            lines[i] = f"{name} {len(data)} xxh3:{xxh3_64(data):016x}"
            found = True
    if not found:
        raise Bad(f"{DIGESTS}: no line for {name}")
    return "\n".join(lines).encode()


# ---------------------------------------------------------------------------
# Protobuf wire format: a message is a list of [field, wiretype, value];
# value is an int (varint, fixed64, fixed32) or bytes (length-delimited).

def read_varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b):
            raise Bad("truncated varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i
        if shift > 63:
            raise Bad("varint too long")


def varint(v):
    out = bytearray()
    v &= U64
    while True:
        c = v & 0x7F
        v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c)
            return bytes(out)


def parse(b):
    fields, i = [], 0
    while i < len(b):
        key, i = read_varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 1:
            v = struct.unpack_from("<Q", b, i)[0]
            i += 8
        elif wt == 5:
            v = struct.unpack_from("<I", b, i)[0]
            i += 4
        elif wt == 2:
            n, i = read_varint(b, i)
            if i + n > len(b):
                raise Bad("truncated field")
            v = bytes(b[i:i + n])
            i += n
        else:
            raise Bad(f"wire type {wt}")
        fields.append([f, wt, v])
    return fields


def encode(fields):
    out = bytearray()
    for f, wt, v in fields:
        out += varint(f << 3 | wt)
        if wt == 0:
            out += varint(v)
        elif wt == 1:
            out += struct.pack("<Q", v & U64)
        elif wt == 5:
            out += struct.pack("<I", v & U32)
        else:
            out += varint(len(v)) + v
    return bytes(out)


def get(fields, f, default=None):
    for x in fields:
        if x[0] == f:
            return x[2]
    return default


def put(fields, f, v):
    for x in fields:
        if x[0] == f:
            x[2] = v
            return
    raise Bad(f"no field {f}")


def subs(fields, f):
    """The embedded messages of repeated field f, parsed: [(index in fields, msg)]."""
    return [(i, parse(x[2])) for i, x in enumerate(fields) if x[0] == f]


def unframe(data):
    if len(data) < 8:
        raise Bad("no size word")
    (n,) = struct.unpack_from("<Q", data)
    if n != len(data) - 8:
        raise Bad(f"size word {n}, {len(data) - 8} bytes follow")
    return data[8:]


def frame(payload):
    return struct.pack("<Q", len(payload)) + payload


# ---------------------------------------------------------------------------
# KFD's private data as someone who writes images would edit it (issue 31)

# kfd_criu_queue_priv_data offsets (kfd-abi's layout) and the values written there.
QUEUE_FIELDS = {"type": (68, 2), "sdma-id": (96, 0xFFFF), "doorbell": (88, 4096)}
HOSTILE_EDITS = ["ctl-1m", "mqd-64k", "type", "sdma-id", "doorbell", "ring", "event-id", "svm",
                 "counts", "compute-gfx11", "compute-2xcc", "compute-ctx-cus"]
# kfd_device_entry fields the control stack size follows from.
DEV_SIMD_COUNT, DEV_SIMD_PER_CU = 4, 16
DEV_ARRAY_COUNT, DEV_ARRAYS_PER_ENGINE = 13, 14


def gfx11_ctl_stack(dev):
    """The control stack KFD sizes for a GFX 11 node with this device record's CUs (32 waves
    of 12 bytes per CU, a 48-byte header, page aligned): a size the image alone cannot tell
    from the GPU's own (its record names no generation), which its host's KFD never writes
    for a GFX 9 GPU."""
    cus = get(dev, DEV_SIMD_COUNT) // max(get(dev, DEV_SIMD_PER_CU, 1), 1)
    return (cus * 32 * 12 + 48 + 4095) // 4096 * 4096


def gfx9_ctl_stack(dev):
    """The control stack KFD sizes for a GFX 9 node with this device record's CUs and shader
    arrays (8 bytes for each of min(40 per CU, 512 per array) waves, a 48-byte header, page
    aligned)."""
    cus = get(dev, DEV_SIMD_COUNT) // max(get(dev, DEV_SIMD_PER_CU, 1), 1)
    arrays = get(dev, DEV_ARRAY_COUNT, 0) // max(get(dev, DEV_ARRAYS_PER_ENGINE, 1), 1)
    waves = min(cus * 40, arrays * 512)
    return (waves * 8 + 48 + 4095) // 4096 * 4096


def gfx908_save_area(ctl, cus):
    """The context save area of one XCC of a gfx908 node with `cus` CUs: the control stack,
    then 0x95000 bytes per CU (512 KiB of VGPRs, SGPRs, LDS, hardware registers)."""
    return ctl + cus * 0x95000


def as_compute(priv, queue, mqd, ctl):
    """The queue at `queue` made a compute (AQL) queue with `mqd` bytes of MQD and `ctl` of
    control stack, its bytes grown to match."""
    old_ctl, old_mqd = struct.unpack_from("<II", priv, queue + 108)
    struct.pack_into("<II", priv, queue + 68, 0, 1)
    struct.pack_into("<II", priv, queue + 108, ctl, mqd)
    grow = ctl + mqd - old_ctl - old_mqd
    if grow < 0:
        raise Bad("the queue's bytes would shrink")
    priv[queue + 120:queue + 120] = bytes(grow)


def priv_objects(priv, devices, bos, count, record):
    """The blob's objects: [(type, offset)]."""
    off, out = 8 + 8 * devices + record * bos, []
    for _ in range(count):
        (ty,) = struct.unpack_from("<I", priv, off)
        out.append((ty, off))
        if ty == 0:
            ctl, mqd = struct.unpack_from("<II", priv, off + 108)
            off += 120 + ctl + mqd
        else:
            off += 64 if ty == 1 else 24 + 8 * (4 + devices)
    if off != len(priv):
        raise Bad(f"priv_data: objects end at {off}, the blob at {len(priv)}")
    return out


def device_of(m, priv, queue):
    """The device record of the GPU the queue at `queue` runs on."""
    (gpu,) = struct.unpack_from("<I", priv, queue + 64)
    dev = next((d for _, d in subs(m, KFD_DEVICES) if get(d, DEV_GPU_ID) == gpu), None)
    if dev is None:
        raise Bad(f"no device record of GPU {gpu:#x}")
    return dev


def hostile_kfd(data, edit):
    """A KFD image (framed) with its private data edited self-consistently: bytes inserted
    where a size grows (ctl-1m: the first queue's control stack by 1 MiB, mqd-64k: its MQD
    by 64 KiB), a queue type no process owns, SDMA engine and doorbell ids out of range, the
    ring at 0x1000 (outside the process), the first event's id out of its range, an SVM range
    the process never mapped, num_of_objects 2^32-1; the first queue made a compute queue with a
    GFX 11 node's control stack (compute-gfx11), the MQDs of 2 XCCs (compute-2xcc) or the
    GPU's own control stack with the context save area of a gfx908 GPU of 8 CUs fewer (same
    control stack; compute-ctx-cus): sizes KFD writes for some GPU but not for the (GFX 9,
    one-XCC) host GPU that restores it."""
    m = parse(unframe(data))
    priv = bytearray(get(m, KFD_PRIV))
    n, devices, bos = get(m, KFD_NUM_OBJECTS), get(m, KFD_NUM_GPUS), get(m, KFD_NUM_BOS)
    objs = priv_objects(priv, devices, bos, n, get(m, KFD_PRIV_RECORD, 272))
    queue = next((o for t, o in objs if t == 0), None)
    event = next((o for t, o in objs if t == 1), None)
    if (queue is None and edit not in ("event-id", "svm", "counts")) or \
            (event is None and edit == "event-id"):
        raise Bad(f"no object for {edit} in the private data")
    if edit in ("ctl-1m", "mqd-64k"):
        field, grow = (108, 1 << 20) if edit == "ctl-1m" else (112, 64 << 10)
        (v,) = struct.unpack_from("<I", priv, queue + field)
        struct.pack_into("<I", priv, queue + field, v + grow)
        priv[queue + 120:queue + 120] = bytes(grow)
    elif edit == "compute-gfx11":
        as_compute(priv, queue, 2048, gfx11_ctl_stack(device_of(m, priv, queue)))
    elif edit == "compute-ctx-cus":
        dev = device_of(m, priv, queue)
        ctl = gfx9_ctl_stack(dev)
        cus = get(dev, DEV_SIMD_COUNT) // max(get(dev, DEV_SIMD_PER_CU, 1), 1)
        as_compute(priv, queue, 2048, ctl)
        struct.pack_into("<I", priv, queue + 104, gfx908_save_area(ctl, cus - 8))
    elif edit == "compute-2xcc":
        as_compute(priv, queue, 2 * 2048, 0)
    elif edit in QUEUE_FIELDS:
        off, v = QUEUE_FIELDS[edit]
        struct.pack_into("<I", priv, queue + off, v)
    elif edit == "ring":
        struct.pack_into("<Q", priv, queue + 8, 0x1000)
    elif edit == "event-id":
        struct.pack_into("<I", priv, event + 16, 5000)
    elif edit == "svm":
        priv += struct.pack("<IIQQ", 2, 0, 0x1000, 0x1000) + bytes(8 * (4 + devices))
        put(m, KFD_NUM_OBJECTS, n + 1)
    elif edit == "counts":
        put(m, KFD_NUM_OBJECTS, U32)
    else:
        raise Bad(f"unknown edit {edit}")
    put(m, KFD_PRIV, bytes(priv))
    return frame(encode(m))


# ---------------------------------------------------------------------------
# The image directory

class Images:
    """The GPU image files of a dump directory, read and (KFD, render and dma-buf images)
    parsed. kfd_needed: a dump of a KFD process (gpu-workload's); shared-bo's hold render
    files only. The `parent` link of an incremental dump is read as Images of its own."""

    def __init__(self, dir, kfd_needed=True):
        self.dir = dir
        names = sorted(os.listdir(dir))
        self.kfd = [n for n in names if re.fullmatch(r"amdgpu-kfd--?\d+\.img", n)]
        self.render = [n for n in names if re.fullmatch(r"amdgpu-renderD--?\d+\.img", n)]
        self.pages = [n for n in names if re.fullmatch(r"amdgpu-pages--?\d+-[0-9a-f]+\.img", n)]
        self.dmabuf = [n for n in names if re.fullmatch(r"amdgpu-dmabuf_\d+\.img", n)]
        self.digests = [DIGESTS] if DIGESTS in names else []
        if (kfd_needed and not self.kfd) or not self.pages:
            raise Bad(f"{dir}: no KFD image or no pages file to mutate")
        self.data = {n: open(os.path.join(dir, n), "rb").read() for n in self.gpu_files()}
        self.msgs = {n: parse(unframe(self.data[n])) for n in self.kfd + self.render + self.dmabuf}
        if self.digests:
            # Check the digests as the dump wrote them (and our XXH3).
            for n in self.kfd + self.render + self.dmabuf:
                if forge_digests(self.data[DIGESTS], n, self.data[n]) != self.data[DIGESTS]:
                    raise Bad(f"{DIGESTS}: the line of {n} is not its size and XXH3-64")
        link = os.path.join(dir, "parent")
        self.parent = Images(os.path.realpath(link), False) if os.path.islink(link) else None

    def gpu_files(self):
        return self.kfd + self.render + self.pages + self.dmabuf + self.digests

    def forged(self, files):
        """files (name -> bytes; "parent/NAME" for the parent's) with each directory's
        digests rewritten to match: only the cross-checks behind the digests can refuse."""
        out = dict(files)
        for img, pre in [(self, ""), (self.parent, "parent/")]:
            if img is None or not img.digests:
                continue
            d = img.data[DIGESTS]
            for n, data in files.items():
                if n.startswith(pre) and "/" not in n[len(pre):] and \
                        n[len(pre):] in img.msgs:
                    d = forge_digests(d, n[len(pre):], data)
            if d != img.data[DIGESTS]:
                out[pre + DIGESTS] = d
        return out


class Mutant:
    def __init__(self, name, cls, file, what, files=None, delete=(), swap=None):
        self.name, self.cls, self.file, self.what = name, cls, file, what
        self.files = files or {}       # name -> new bytes
        self.delete = list(delete)     # names removed
        self.swap = swap               # (a, b): contents exchanged
        self.opaque = False            # edits bytes only KFD interprets
        self.scenario = "wl"           # the dump it is of (test/integrity/run.py SCENARIOS)


def kind(name):
    return name.split("-")[1].split(".")[0]  # kfd, renderD, pages, digests


def short(name):
    """amdgpu-pages-3-1a2b.img -> pages-3-1a2b"""
    return name[len("amdgpu-"):-len(".img")]


def mutants(img, seed):
    rng = random.Random(seed)
    out = []

    def add(cls, file, what, **kw):
        out.append(Mutant(f"{cls}:{short(file) if file else 'all'}:{len(out):03d}", cls, file,
                          what, **kw))

    # Raw damage to every GPU image file.
    for f in img.gpu_files():
        d = img.data[f]
        n = len(d)
        # Pages files: mostly the BO bytes, once the size word; the others
        # anywhere, the size word included.
        lo = 8 if kind(f) == "pages" else 0
        offs = [rng.randrange(lo, n) for _ in range(7)] + [rng.randrange(0, 8)]
        for off in offs:
            mask = rng.randrange(1, 256)
            b = bytearray(d)
            b[off] ^= mask
            add("flip", f, f"byte {off} ^= {mask:#04x}", files={f: bytes(b)})
        for _ in range(4):
            off = rng.randrange(lo, n)
            bit = rng.randrange(8)
            b = bytearray(d)
            b[off] ^= 1 << bit
            add("bitflip", f, f"bit {bit} of byte {off}", files={f: bytes(b)})
        for keep in sorted({0, 4, 8, n - 1, rng.randrange(9, n - 1), rng.randrange(9, n - 1)}):
            add("truncate", f, f"cut to {keep} of {n} bytes", files={f: d[:keep]})
        zeros = [(0, n), (0, 8)]
        for _ in range(2):
            a = rng.randrange(lo, n - 1)
            zeros.append((a, min(n, a + rng.choice([1, 16, 4096]))))
        for a, e in zeros:
            b = bytearray(d)
            b[a:e] = bytes(e - a)
            if b == d:  # already zero there: make the zeroing count
                b[a] ^= 0xFF
                add("zero", f, f"bytes {a}..{e} were zero already; byte {a} ^= 0xff",
                    files={f: bytes(b)})
            else:
                add("zero", f, f"bytes {a}..{e} zeroed", files={f: bytes(b)})
        junk = bytes(rng.randrange(256) for _ in range(8))
        for tail, what in [(b"\0", "1 zero byte"), (junk, "8 random bytes"),
                           (bytes(4096), "4096 zero bytes")]:
            add("extend", f, f"{what} appended", files={f: d + tail})
        (size,) = struct.unpack_from("<Q", d)
        for new, what in [(size + 1, "+1"), (size - 1, "-1"), (0, "=0"), (1 << 63, "=2^63"),
                          (U64, "=2^64-1"), (size + 4096, "+4096")]:
            add("size-prefix", f, f"size word {size} -> {new & U64} ({what})",
                files={f: struct.pack("<Q", new & U64) + d[8:]})

    # Field edits, re-framed (a consistent file: only a cross-check or a
    # digest can catch them).
    for f in img.kfd:
        base = img.msgs[f]

        def edit(what, fn, f=f, base=base):
            m = [list(x) for x in base]
            fn(m)
            add("field", f, what, files={f: frame(encode(m))})

        pid = get(base, KFD_PID)
        for new in [pid + 1, 0, 1, U32]:
            edit(f"pid {pid} -> {new}", lambda m, v=new: put(m, KFD_PID, v))
        nobj = get(base, KFD_NUM_OBJECTS)
        for new in [nobj + 1, max(nobj - 1, 0) if nobj else 1, 0 if nobj else 2, U32]:
            edit(f"num_of_objects {nobj} -> {new}", lambda m, v=new: put(m, KFD_NUM_OBJECTS, v))
        nbos = get(base, KFD_NUM_BOS)
        for new in [nbos + 1, nbos - 1]:
            edit(f"num_of_bos {nbos} -> {new}", lambda m, v=new: put(m, KFD_NUM_BOS, v))
        for fld, nm in [(KFD_NUM_GPUS, "num_of_gpus"), (KFD_NUM_CPUS, "num_of_cpus")]:
            v = get(base, fld)
            edit(f"{nm} {v} -> {v + 1}", lambda m, fld=fld, v=v: put(m, fld, v + 1))

        devs = subs(base, KFD_DEVICES)
        gpus = [get(d, DEV_GPU_ID) for _, d in devs if get(d, DEV_GPU_ID)]
        bos = subs(base, KFD_BOS)

        def edit_bo(idx, what, fn):
            def apply(m):
                i, bo = bos[idx]
                bo = [list(x) for x in bo]
                fn(bo)
                m[i][2] = encode(bo)
            edit(f"BO {idx}: {what}", apply)

        data_bos = [k for k, (_, b) in enumerate(bos) if get(b, BO_FLAGS) & (VRAM | GTT)]
        other_bos = [k for k, (_, b) in enumerate(bos) if not get(b, BO_FLAGS) & (VRAM | GTT)]
        picked = sorted(set(rng.sample(data_bos, min(3, len(data_bos))) +
                            rng.sample(other_bos, min(1, len(other_bos)))))
        for k in picked:
            b = bos[k][1]
            addr, size, off = get(b, BO_ADDR), get(b, BO_SIZE), get(b, BO_OFFSET)
            gpu = get(b, BO_GPU_ID)
            bit = rng.randrange(12, 47)
            edit_bo(k, f"addr {addr:#x} -> {addr ^ 1 << bit:#x} (bit {bit})",
                    lambda bo, v=addr ^ 1 << bit: put(bo, BO_ADDR, v))
            edit_bo(k, f"addr {addr:#x} + 4096",
                    lambda bo, v=addr + 4096: put(bo, BO_ADDR, v))
            edit_bo(k, f"size {size:#x} + 4096", lambda bo, v=size + 4096: put(bo, BO_SIZE, v))
            if size > 4096:
                edit_bo(k, f"size {size:#x} - 4096", lambda bo, v=size - 4096: put(bo, BO_SIZE, v))
            edit_bo(k, f"size {size:#x} -> 0", lambda bo: put(bo, BO_SIZE, 0))
            bit = rng.randrange(12, 47)
            edit_bo(k, f"offset {off:#x} -> {off ^ 1 << bit:#x} (bit {bit})",
                    lambda bo, v=off ^ 1 << bit: put(bo, BO_OFFSET, v))
            edit_bo(k, f"offset {off:#x} + 4096", lambda bo, v=off + 4096: put(bo, BO_OFFSET, v))
            others = [g for g in gpus if g != gpu]
            if others:
                edit_bo(k, f"gpu_id {gpu:#x} -> {others[0]:#x} (the other GPU)",
                        lambda bo, v=others[0]: put(bo, BO_GPU_ID, v))
            edit_bo(k, f"gpu_id {gpu:#x} -> {gpu ^ 0x8000:#x} (no such GPU)",
                    lambda bo, v=gpu ^ 0x8000: put(bo, BO_GPU_ID, v))
            fl = get(b, BO_FLAGS)
            if fl & (VRAM | GTT):
                edit_bo(k, f"alloc_flags {fl:#x} -> {fl ^ (VRAM | GTT):#x} (VRAM <-> GTT)",
                        lambda bo, v=fl ^ (VRAM | GTT): put(bo, BO_FLAGS, v))
            if get(b, BO_XXH3) is not None:
                h = get(b, BO_XXH3)
                edit_bo(k, "content_xxh3 ^= 1", lambda bo, v=h ^ 1: put(bo, BO_XXH3, v))
                edit_bo(k, "content_xxh3 removed",
                        lambda bo: bo.__setitem__(slice(None), [x for x in bo if x[0] != BO_XXH3]))

        # Another BO's mmap offset (issue 29): two saved BOs of one GPU whose offset
        # ranges overlap, as images written before "same BO as" hold one BO twice.
        same_gpu = [(a, b) for a in data_bos for b in data_bos
                    if a < b and get(bos[a][1], BO_GPU_ID) == get(bos[b][1], BO_GPU_ID)]
        if same_gpu:
            a, b = same_gpu[0]
            off = get(bos[a][1], BO_OFFSET)
            edit_bo(b, f"offset -> BO {a}'s {off:#x} (one BO saved twice)",
                    lambda bo, v=off: put(bo, BO_OFFSET, v))

        def strip_hashes(m):
            for i, bo in subs(m, KFD_BOS):
                m[i][2] = encode([x for x in bo if x[0] != BO_XXH3])

        edit("content_xxh3 removed from every BO", strip_hashes)
        # Hashes gone and the contents damaged too: only a digest (or the
        # extension's rule that hashes are required) can refuse this one.
        for p in img.pages:
            m = [list(x) for x in base]
            strip_hashes(m)
            d = bytearray(img.data[p])
            off = rng.randrange(8, len(d))
            d[off] ^= 0x5A
            add("field", f, f"content_xxh3 removed from every BO and byte {off} of {p} ^= 0x5a",
                files={f: frame(encode(m)), p: bytes(d)})
        ext = get(base, KFD_EXT_VERSION)
        if ext is not None:
            edit(f"criu_rocm_ext_version {ext} removed",
                 lambda m: m.__setitem__(slice(None), [x for x in m if x[0] != KFD_EXT_VERSION]))
            for new in [0, ext + 1]:
                edit(f"criu_rocm_ext_version {ext} -> {new}",
                     lambda m, v=new: put(m, KFD_EXT_VERSION, v))
        for di, (i, dev) in enumerate(devs):
            g = get(dev, DEV_GPU_ID)
            if not g:
                continue

            def dev_edit(what, fn, i=i, dev=dev):
                def apply(m):
                    d2 = [list(x) for x in dev]
                    fn(d2)
                    m[i][2] = encode(d2)
                edit(what, apply)

            dev_edit(f"device {di}: gpu_id {g:#x} -> {g ^ 0x4000:#x}",
                     lambda d2, v=g ^ 0x4000: put(d2, DEV_GPU_ID, v))
            mn = get(dev, DEV_RENDER_MINOR)
            dev_edit(f"device {di}: drm_render_minor {mn} -> {mn + 7}",
                     lambda d2, v=mn + 7: put(d2, DEV_RENDER_MINOR, v))
        priv = get(base, KFD_PRIV)
        edit(f"priv_data cut by 1 of {len(priv)} bytes", lambda m: put(m, KFD_PRIV, priv[:-1]))
        po = rng.randrange(len(priv))
        pb = bytearray(priv)
        pb[po] ^= 0xFF
        edit(f"priv_data byte {po} ^= 0xff", lambda m, v=bytes(pb): put(m, KFD_PRIV, v))
        out[-1].opaque = True
        if len(bos) >= 2:
            i0, i1 = bos[0][0], bos[1][0]
            edit("BO entries 0 and 1 swapped", lambda m: (m.__setitem__(i0, list(base[i1])),
                                                         m.__setitem__(i1, list(base[i0]))))
            edit(f"BO entry 0 dropped, num_of_bos {nbos} -> {nbos - 1}",
                 lambda m: (m.pop(i0), put(m, KFD_NUM_BOS, nbos - 1)))
            edit(f"BO entry 0 repeated, num_of_bos {nbos} -> {nbos + 1}",
                 lambda m: (m.insert(i0, list(base[i0])), put(m, KFD_NUM_BOS, nbos + 1)))

    for f in img.render:
        base = img.msgs[f]

        def edit(what, fn, f=f, base=base):
            m = [list(x) for x in base]
            fn(m)
            add("field", f, what, files={f: frame(encode(m))})

        g = get(base, RN_GPU_ID)
        others = sorted({get(img.msgs[r], RN_GPU_ID) for r in img.render} - {g})
        if others:
            edit(f"gpu_id {g:#x} -> {others[0]:#x} (the other GPU)",
                 lambda m, v=others[0]: put(m, RN_GPU_ID, v))
        edit(f"gpu_id {g:#x} -> {g ^ 0x4000:#x} (no such GPU)",
             lambda m, v=g ^ 0x4000: put(m, RN_GPU_ID, v))
        edit(f"gpu_id {g:#x} -> 0", lambda m: put(m, RN_GPU_ID, 0))
        mn = get(base, RN_MINOR)
        if mn is not None:
            edit(f"drm_render_minor {mn} -> {mn + 7}", lambda m, v=mn + 7: put(m, RN_MINOR, v))

        # A GEM BO as criu-dev's plugin records one (drm_bo_entry: addr, size, offset,
        # alloc_flags, alignment, preferred_domains, handle, is_import, num_of_vms), which
        # criu-rocm does not restore: refused by both, naming the file and the BO.
        def add_gem_bo(m):
            bo = encode([[1, 0, 0], [2, 0, 1 << 20], [3, 0, 4 << 30], [4, 0, 0], [5, 0, 1],
                         [6, 0, 4], [7, 0, 5], [8, 0, 0], [9, 0, 0]])
            if get(m, RN_NUM_BOS) is None:
                m.append([RN_NUM_BOS, 0, 1])
            else:
                put(m, RN_NUM_BOS, 1)
            m.append([RN_BOS, 2, bo])
        if get(base, RN_BOS) is None:
            edit("a criu-dev GEM BO (handle 5, 1 MiB of VRAM) added, num_of_bos 1", add_gem_bo)

        # The render file's own GEM BOs (gpu-workload --gem-bo): each field the restore
        # recreates a BO from, and its hash; refused by both, naming the file and the BO.
        for k, (at, bo) in enumerate(subs(base, RN_BOS)[:1]):
            def gem(what, fn, at=at, bo=bo):
                def f(m):
                    b = [list(x) for x in bo]
                    fn(b)
                    m[at][2] = encode(b)
                edit(f"GEM BO {k}: {what}", f)
            h, size, off = get(bo, GEM_HANDLE), get(bo, GEM_SIZE), get(bo, GEM_OFFSET)
            gem(f"handle {h} -> 0", lambda b: put(b, GEM_HANDLE, 0))
            gem(f"size {size} -> {size + 4096}", lambda b, v=size + 4096: put(b, GEM_SIZE, v))
            gem(f"size {size} -> {size + 1}", lambda b, v=size + 1: put(b, GEM_SIZE, v))
            gem(f"offset {off:#x} -> {off + 2:#x}", lambda b, v=off + 2: put(b, GEM_OFFSET, v))
            gem("preferred_domains -> 0x40 (doorbell)", lambda b: put(b, GEM_DOMAINS, 0x40))
            gem("is_import -> 1", lambda b: put(b, GEM_IMPORT, 1))
            gem("num_of_vms + 1", lambda b: put(b, GEM_NUM_VMS, get(b, GEM_NUM_VMS) + 1))
            if get(bo, GEM_XXH3) is not None:
                gem("content_xxh3 xor 1", lambda b: put(b, GEM_XXH3, get(b, GEM_XXH3) ^ 1))
                gem("content_xxh3 removed (a criu-dev BO)",
                    lambda b: b.__setitem__(slice(None), [x for x in b if x[0] != GEM_XXH3]))
            # Made "the same BO as" another image's BO (is_import 1, same_bo_file,
            # same_bo_index, no content fields) pointing to nothing, to a BO of another
            # size, or to itself (a cycle): refused by both, naming the file and field.
            def link(b, file, index):
                b[:] = [x for x in b if x[0] not in (GEM_XXH3, 1001, 1002)]
                put(b, GEM_IMPORT, 1)
                b.append([GEM_SAME_FILE, 0, file])
                b.append([GEM_SAME_INDEX, 0, index])
            own = int(re.fullmatch(r"amdgpu-renderD-(-?\d+)\.img", f).group(1)) & U32
            gem("the same BO as file 999999's BO 0 (no such image)",
                lambda b: link(b, 999999, 0))
            gem(f"the same BO as its own BO {k} (a cycle)", lambda b, v=own, i=k: link(b, v, i))
            if img.kfd:
                kid = int(re.fullmatch(r"amdgpu-kfd-(-?\d+)\.img", img.kfd[0]).group(1)) & U32
                kbos = subs(img.msgs[img.kfd[0]], KFD_BOS)
                sized = [i for i, (_, kb) in enumerate(kbos)
                         if get(kb, BO_SIZE) != size and get(kb, BO_FLAGS, 0) & (VRAM | GTT)]
                if sized:
                    gem(f"the same BO as {img.kfd[0]}'s BO {sized[0]} (another size)",
                        lambda b, v=kid, i=sized[0]: link(b, v, i))
                gem(f"the same BO as {img.kfd[0]}'s BO {len(kbos)} (past its BOs)",
                    lambda b, v=kid, i=len(kbos): link(b, v, i))
            # A KFD BO's mmap offset on this render file's GPU (issue 29): the KFD BO
            # saved twice, as images written before "same BO as" hold one.
            for kf in img.kfd:
                kbos = subs(img.msgs[kf], KFD_BOS)
                same = [(i, get(kb, BO_OFFSET)) for i, (_, kb) in enumerate(kbos)
                        if get(kb, BO_FLAGS, 0) & (VRAM | GTT)
                        and get(kb, BO_GPU_ID) == get(base, RN_GPU_ID)]
                if same:
                    i, koff = same[0]
                    gem(f"offset -> {kf}'s BO {i}'s {koff:#x} (one BO saved twice)",
                        lambda b, v=koff: put(b, GEM_OFFSET, v))
                    break
            for j, (vat, vm) in enumerate(subs(bo, GEM_VMS)[:1]):
                def grow(b, vat=vat, vm=vm):
                    v = [list(x) for x in vm]
                    put(v, GEM_VM_SIZE, get(v, GEM_VM_SIZE) + size)
                    b[vat][2] = encode(v)
                gem(f"vm_entries[{j}].size past the BO", grow)

    # Whole files.
    for f in img.gpu_files():
        add("delete", f, f"{f} deleted", delete=[f])
    add("delete", None, "every pages file deleted", delete=list(img.pages))
    if img.render:
        add("delete", None, "every render-node image deleted", delete=list(img.render))
    for group in (img.render, img.pages):
        if len(group) >= 2:
            add("swap", group[0], f"{group[0]} and {group[1]} exchanged", swap=(group[0], group[1]))
    if img.render:
        add("swap", img.kfd[0], f"{img.kfd[0]} holds {img.render[0]}'s contents",
            files={img.kfd[0]: img.data[img.render[0]]})
        add("swap", img.render[0], f"{img.render[0]} holds {img.kfd[0]}'s contents",
            files={img.render[0]: img.data[img.kfd[0]]})
    if len(img.pages) >= 2:
        p0, p1 = img.pages[0], img.pages[1]
        add("swap", p0, f"{p0} holds {p1}'s contents", files={p0: img.data[p1]})
    # KFD's private data edited by someone who writes images: self-consistent, and with
    # the digests rewritten to match; only the private data's own checks can refuse.
    for f in img.kfd:
        for e in HOSTILE_EDITS:
            try:
                data = hostile_kfd(img.data[f], e)
            except Bad:
                continue
            files = {f: data}
            if img.digests:
                files[DIGESTS] = forge_digests(img.data[DIGESTS], f, data)
            add("hostile", f, f"private data: {e}; digests rewritten to match", files=files)
    # The field edits again, as a forger would make them: the digests say
    # the edited files are as dumped, so only the cross-checks can refuse.
    # Not the bytes inside the kernel's blob: they are KFD's own (queue
    # MQDs, control stacks), which only KFD's RESTORE judges; their framing
    # (the cut blob) is forged like the rest.
    if img.digests:
        for m in [m for m in out if m.cls == "field" and not m.opaque]:
            files = dict(m.files)
            d = img.data[DIGESTS]
            for n, data in m.files.items():
                if n in img.kfd or n in img.render:
                    d = forge_digests(d, n, data)
            files[DIGESTS] = d
            add("forged", m.file, f"{m.what}; digests rewritten to match", files=files)
    return out


def records(data):
    """The chunk records of a compressed pages file: [(offset of the length word, length)]."""
    out, off = [], 8
    while off + 8 <= len(data):
        (n,) = struct.unpack_from("<Q", data, off)
        out.append((off, n))
        off += 8 + n
    if off != len(data):
        raise Bad(f"compressed pages file: records end at {off}, the file at {len(data)}")
    return out


def zstd_mutants(img, seed):
    """Mutants of a dump with compressed pages files (KFD_COMPRESS=zstd), class names
    prefixed zstd-: damage inside the frames, to the records' length words, to the
    files' ends, the frames of a file exchanged, and the KFD image's compression fields
    (kind, level, chunk size) edited (also forged: digests rewritten to match)."""
    rng = random.Random(seed + 1)
    out = []

    def add(cls, file, what, **kw):
        out.append(Mutant(f"zstd-{cls}:{short(file)}:{len(out):03d}", "zstd-" + cls, file,
                          what, **kw))

    for f in img.pages:
        d = img.data[f]
        n = len(d)
        recs = records(d)
        frames = [(o, k) for o, k in recs if k > 0]
        if not frames:
            raise Bad(f"{f}: no compressed frame to damage")
        for _ in range(4):
            o, k = rng.choice(frames)
            at = o + 8 + rng.randrange(k)
            mask = rng.randrange(1, 256)
            b = bytearray(d)
            b[at] ^= mask
            add("flip", f, f"byte {at} (in the frame at {o}) ^= {mask:#04x}", files={f: bytes(b)})
        for _ in range(2):
            o, k = rng.choice(frames)
            at, bit = o + 8 + rng.randrange(k), rng.randrange(8)
            b = bytearray(d)
            b[at] ^= 1 << bit
            add("bitflip", f, f"bit {bit} of byte {at} (in the frame at {o})", files={f: bytes(b)})
        o, k = frames[0]
        for new, what in [(k + 1, "+1"), (k - 1, "-1"), (0, "=0 (a chunk of zeros)"),
                          (1 << 63, "=2^63"), (k + 4096, "+4096")]:
            b = bytearray(d)
            struct.pack_into("<Q", b, o, new & U64)
            add("record", f, f"length word at {o}: {k} -> {new & U64} ({what})",
                files={f: bytes(b)})
        a = o + 8 + rng.randrange(max(k - 16, 1))
        b = bytearray(d)
        b[a:a + 16] = bytes(len(b[a:a + 16]))
        add("zero", f, f"bytes {a}..{a + 16} (in the frame at {o}) zeroed", files={f: bytes(b)})
        for keep in sorted({8, 16, n - 1, o + 8 + k // 2}):
            add("truncate", f, f"cut to {keep} of {n} bytes", files={f: d[:keep]})
        add("extend", f, "1 zero byte appended", files={f: d + b"\0"})
        add("extend", f, "8 zero bytes appended (a zero chunk record)", files={f: d + bytes(8)})
        if len(frames) >= 2:
            (o0, k0), (o1, k1) = frames[0], frames[1]
            r0, r1 = d[o0:o0 + 8 + k0], d[o1:o1 + 8 + k1]
            b = d[:o0] + r1 + d[o0 + 8 + k0:o1] + r0 + d[o1 + 8 + k1:]
            add("swap", f, f"the records at {o0} and {o1} exchanged", files={f: b})
    for f in img.kfd:
        base = img.msgs[f]

        def edit(what, fn, f=f, base=base):
            m = [list(x) for x in base]
            fn(m)
            add("field", f, what, files={f: frame(encode(m))})

        if get(base, KFD_PAGES_COMPRESSION) is None:
            raise Bad(f"{f}: no pages_compression field: the dump did not compress")
        edit("pages_compression removed (upstream's layout)",
             lambda m: m.__setitem__(slice(None), [x for x in m if x[0] != KFD_PAGES_COMPRESSION]))
        edit("pages_compression 1 -> 2 (no such compression)",
             lambda m: put(m, KFD_PAGES_COMPRESSION, 2))
        edit("pages_compression_level -> 99", lambda m: put(m, KFD_PAGES_LEVEL, 99))
        if get(base, KFD_PAGES_CHUNK) is None:
            raise Bad(f"{f}: no pages_compression_chunk field (extension version 6)")
        edit("pages_compression_chunk removed (32 MiB chunks, as before version 6)",
             lambda m: m.__setitem__(slice(None), [x for x in m if x[0] != KFD_PAGES_CHUNK]))
        edit("pages_compression_chunk -> 4096", lambda m: put(m, KFD_PAGES_CHUNK, 4096))
        edit("pages_compression_chunk -> 3000 (not a multiple of a page)",
             lambda m: put(m, KFD_PAGES_CHUNK, 3000))
    if img.digests:
        for m in [m for m in out if m.cls == "zstd-field"]:
            files = dict(m.files)
            dg = img.data[DIGESTS]
            for n, data in m.files.items():
                dg = forge_digests(dg, n, data)
            files[DIGESTS] = dg
            add("forged", m.file, f"{m.what}; digests rewritten to match", files=files)
    return out


# ---------------------------------------------------------------------------
# The GEM, shared-BO and dma-buf records (issue 29), of shared-bo's dumps

def file_id(name):
    """amdgpu-renderD-7.img, amdgpu-dmabuf_7.img -> 7 (CRIU's file id, as a u32)"""
    return int(re.search(r"[-_](-?\d+)\.img$", name).group(1)) & U32


def drop(fields, f):
    fields[:] = [x for x in fields if x[0] != f]


def gem_mutants(img, scenario, seed):
    """Mutants of a shared-bo dump (test/integrity/run.py SCENARIOS), classes prefixed
    gem-: each criu-rocm field of its render images' GEM BOs that links them to another
    image (same_bo_file/index/pid, parent_extents, parent_bo), the render images'
    criu_rocm_parent and criu_rocm_pid, the parent images' (of an incremental dump) bytes
    and pid, and every field of its dma-buf images, edited and removed (field), the same
    with the digests rewritten to match (forged, but for values the image of another live
    state would hold: only the digests can tell those), and the dma-buf images' raw damage."""
    rng = random.Random(seed + 2)
    out = []

    def add(cls, file, what, forgeable=True, **kw):
        m = Mutant(f"gem-{scenario}-{cls}:{short(file.split('/')[-1])}:{len(out):03d}",
                   "gem-" + cls, file, what, **kw)
        m.scenario, m.forgeable = scenario, forgeable
        out.append(m)

    def edit(f, what, fn, forgeable=True):
        src = img.parent if f.startswith("parent/") else img
        m = [list(x) for x in src.msgs[f.split("/")[-1]]]
        fn(m)
        add("field", f, what, forgeable, files={f: frame(encode(m))})

    def bo_edit(f, at, what, fn, forgeable=True):
        def g(m):
            b = parse(m[at][2])
            fn(b)
            m[at][2] = encode(b)
        edit(f, f"bo_entries[{at_index(f, at)}] {what}", g, forgeable)

    def at_index(f, at):
        src = img.parent if f.startswith("parent/") else img
        return [i for i, _ in subs(src.msgs[f.split("/")[-1]], RN_BOS)].index(at)

    pids = {f: get(img.msgs[f], RN_PID) for f in img.render}
    for f in img.render:
        gem_render_mutants(img, f, pids, edit, bo_edit)
    if img.parent:
        for f in img.parent.render:
            gem_parent_mutants(img.parent, f, edit, bo_edit)
    for f in img.dmabuf:
        dmabuf_mutants(img, f, edit, add, rng)
    for m in [m for m in out if m.cls == "gem-field" and m.forgeable]:
        add("forged", m.file, f"{m.what}; digests rewritten to match", files=img.forged(m.files))
    return out


def gem_render_mutants(img, f, pids, edit, bo_edit):
    """The links of render image f's GEM BOs, its parent and pid."""
    base = img.msgs[f]
    own, pid = file_id(f), pids[f]
    for at, bo in subs(base, RN_BOS):
        spid, sfile = get(bo, GEM_SAME_PID), get(bo, GEM_SAME_FILE)
        if spid is not None:
            for v, why in [(spid + 1000, "no process of the dump"), (0, "pid 0"),
                           (pid, "its own process, which does not hold that file")]:
                bo_edit(f, at, f"same_bo_pid {spid} -> {v} ({why})",
                        lambda b, v=v: put(b, GEM_SAME_PID, v))
            bo_edit(f, at, f"same_bo_pid {spid} removed (file {sfile} taken as its own "
                    f"process')", lambda b: drop(b, GEM_SAME_PID))
            bo_edit(f, at, f"same_bo_file {sfile} -> {own} (itself, a cycle)",
                    lambda b: put(b, GEM_SAME_FILE, own))
            bo_edit(f, at, "same_bo_index + 1 (no such BO)",
                    lambda b: put(b, GEM_SAME_INDEX, get(b, GEM_SAME_INDEX) + 1))
        elif sfile is not None:
            other = sorted({p for p in pids.values() if p not in (None, pid)})
            if other:
                bo_edit(f, at, f"same_bo_pid {other[0]} added (a process that does not "
                        f"hold file {sfile})",
                        lambda b, v=other[0]: b.append([GEM_SAME_PID, 0, v]))
        gem_parent_fields(f, at, bo, bo_edit)
    parent = get(base, RN_PARENT)
    if parent is not None:
        others = [n for n in (img.parent.render if img.parent else [])
                  if n != parent.decode()]
        edits = [(b"amdgpu-renderD-999999.img", "no such image"),
                 (b"../../../etc/passwd", "a path out of the parent directory"),
                 (b"amdgpu-kfd-1.img", "no such image, a KFD image's name")]
        edits += [(n.encode(), "another render image of the parent") for n in others]
        for v, why in edits:
            edit(f, f"criu_rocm_parent {parent.decode()} -> {v.decode()} ({why})",
                 lambda m, v=v: put(m, RN_PARENT, v))
        edit(f, "criu_rocm_parent removed (parent extents without a parent)",
             lambda m: drop(m, RN_PARENT))
    if pid is not None:
        # The next incremental dump finds its parent by it; the restore does not read it but
        # where a "same BO as" record links images of two files (same_bo_pid names the
        # first holder's task, or is absent when the task is the image's own).
        for v in (pid + 1, 0):
            edit(f, f"criu_rocm_pid {pid} -> {v}", lambda m, v=v: put(m, RN_PID, v))


def gem_parent_fields(f, at, bo, bo_edit):
    """A GEM BO's parent_extents and parent_bo (an incremental dump's), edited."""
    ext, pbo = get(bo, GEM_PARENT_EXTENTS), get(bo, GEM_PARENT_BO)
    if ext is None:
        return
    bo_edit(f, at, "parent_extents removed (its bytes taken from the pages file's hole)",
            lambda b: drop(b, GEM_PARENT_EXTENTS))
    bo_edit(f, at, f"parent_extents {ext.hex()} -> zeros (the same)",
            lambda b: put(b, GEM_PARENT_EXTENTS, bytes(len(ext))))
    past = ext + bytes([0xFF])
    bo_edit(f, at, f"parent_extents {ext.hex()} -> {past.hex()} (extents past the BO)",
            lambda b: put(b, GEM_PARENT_EXTENTS, past))
    bo_edit(f, at, f"parent_extents {ext.hex()} -> empty",
            lambda b: put(b, GEM_PARENT_EXTENTS, b""))
    if pbo is not None:
        for v in (pbo + 1, 999):
            bo_edit(f, at, f"parent_bo {pbo} -> {v}", lambda b, v=v: put(b, GEM_PARENT_BO, v))
    bo_edit(f, at, "parent_bo removed", lambda b: drop(b, GEM_PARENT_BO))


def gem_parent_mutants(parent, f, edit, bo_edit):
    """The parent's render image f (an incremental dump's parent/): its own BOs' bytes as
    the child image takes them, and its pid."""
    base = parent.msgs[f]
    pf = "parent/" + f
    for at, bo in subs(base, RN_BOS):
        if get(bo, GEM_SAME_FILE) is not None:
            continue
        if get(bo, GEM_XXH3) is not None:
            bo_edit(pf, at, "content_xxh3 xor 1", lambda b: put(b, GEM_XXH3, get(b, GEM_XXH3) ^ 1))
        size = get(bo, GEM_SIZE)
        bo_edit(pf, at, f"size {size} -> {size + 4096}",
                lambda b, v=size + 4096: put(b, GEM_SIZE, v))
    pid = get(base, RN_PID)
    if pid is not None:
        edit(pf, f"criu_rocm_pid {pid} -> {pid + 1} (harmless: only the next dump reads "
             f"a parent's)",
             lambda m: put(m, RN_PID, pid + 1))


def dmabuf_mutants(img, f, edit, add, rng):
    """Every field of dma-buf image f edited and removed, and its raw damage."""
    base = img.msgs[f]
    renders = [file_id(n) for n in img.render]
    bfile, bidx = get(base, DMA_BO_FILE), get(base, DMA_BO_INDEX)
    gpu, size, flags = get(base, DMA_GPU_ID), get(base, DMA_SIZE), get(base, DMA_FLAGS)
    handle = get(base, DMA_HANDLE)
    setf = lambda fld, v: lambda m: put(m, fld, v)  # noqa: E731
    edit(f, f"gem_handle {handle} -> {handle + 7} (criu-dev's; criu-rocm restores from "
         f"bo_file)", setf(DMA_HANDLE, handle + 7))
    edit(f, f"bo_file {bfile} -> 999999 (no such file)", setf(DMA_BO_FILE, 999999))
    edit(f, f"bo_file {bfile} -> {file_id(f)} (the dma-buf itself)",
         setf(DMA_BO_FILE, file_id(f)))
    for o in [r for r in renders if r != bfile][:1]:
        edit(f, f"bo_file {bfile} -> {o} (the other render file, whose BO is the first's)",
             setf(DMA_BO_FILE, o))
    edit(f, f"bo_index {bidx} -> {bidx + 1} (no such BO)", setf(DMA_BO_INDEX, bidx + 1))
    edit(f, f"gpu_id {gpu:#x} -> {gpu ^ 0x4000:#x} (no such GPU)", setf(DMA_GPU_ID, gpu ^ 0x4000))
    edit(f, f"gpu_id {gpu:#x} -> 0", setf(DMA_GPU_ID, 0))
    edit(f, f"size {size} -> {size + 4096}", setf(DMA_SIZE, size + 4096))
    edit(f, f"size {size} -> {size // 2}", setf(DMA_SIZE, size // 2))
    edit(f, f"size {size} -> 0", setf(DMA_SIZE, 0))
    if flags is not None:
        # O_RDONLY is what an export without DRM_RDWR gives: the image of another live
        # state, which only the digests tell from this one (not forged).
        edit(f, f"file_flags {flags:#x} -> 0 (O_RDONLY)", setf(DMA_FLAGS, 0), forgeable=False)
        edit(f, f"file_flags {flags:#x} -> 0xffffffff (bits no dma-buf has)",
             setf(DMA_FLAGS, U32))
        edit(f, f"file_flags {flags:#x} -> {flags | 0o40000:#x} (O_DIRECT)",
             setf(DMA_FLAGS, flags | 0o40000))
        edit(f, f"file_flags {flags:#x} -> {flags & ~3 | 1:#x} (O_WRONLY, which no export gives)",
             setf(DMA_FLAGS, flags & ~3 | 1))
    for fld, nm in [(DMA_BO_FILE, "bo_file"), (DMA_BO_INDEX, "bo_index"), (DMA_GPU_ID, "gpu_id"),
                    (DMA_SIZE, "size"), (DMA_FLAGS, "file_flags")]:
        if get(base, fld) is not None:
            edit(f, f"{nm} removed", lambda m, fld=fld: drop(m, fld))
    d = img.data[f]
    n = len(d)
    for _ in range(3):
        off, mask = rng.randrange(n), rng.randrange(1, 256)
        b = bytearray(d)
        b[off] ^= mask
        add("flip", f, f"byte {off} ^= {mask:#04x}", files={f: bytes(b)})
    for keep in sorted({0, 8, n - 1}):
        add("truncate", f, f"cut to {keep} of {n} bytes", files={f: d[:keep]})
    add("extend", f, "1 zero byte appended", files={f: d + b"\0"})
    add("zero", f, f"bytes 0..{n} zeroed", files={f: bytes(n)})
    for new in (n - 8 + 1, n - 8 - 1):
        add("size-prefix", f, f"size word {n - 8} -> {new}",
            files={f: struct.pack("<Q", new) + d[8:]})
    add("delete", f, f"{f} deleted", delete=[f])


def write(img, m, dest):
    """Mutant m of img in dest: unchanged files hard-linked, the parent link (an
    incremental dump's) an absolute one to img's parent, or a directory of its own when m
    changes a file there ("parent/NAME")."""
    os.makedirs(dest)
    for n in sorted(os.listdir(img.dir)):
        src = os.path.join(img.dir, n)
        if n == "parent" and os.path.islink(src):
            write_parent(os.path.realpath(src), m, os.path.join(dest, n))
            continue
        if not os.path.isfile(src) or n in m.delete or n in m.files:
            continue
        if m.swap and n in m.swap:
            continue
        os.link(src, os.path.join(dest, n))
    for n, data in m.files.items():
        if n.startswith("parent/"):
            continue
        with open(os.path.join(dest, n), "wb") as fh:
            fh.write(data)
    if m.swap:
        a, b = m.swap
        shutil.copyfile(os.path.join(img.dir, b), os.path.join(dest, a))
        shutil.copyfile(os.path.join(img.dir, a), os.path.join(dest, b))


def write_parent(src, m, dest):
    mine = {n[len("parent/"):]: d for n, d in m.files.items() if n.startswith("parent/")}
    if not mine:
        os.symlink(src, dest)
        return
    os.makedirs(dest)
    for n in sorted(os.listdir(src)):
        if n in mine:
            with open(os.path.join(dest, n), "wb") as fh:
                fh.write(mine[n])
        elif os.path.isfile(os.path.join(src, n)):
            os.link(os.path.join(src, n), os.path.join(dest, n))


def main(argv):
    seed = DEFAULT_SEED
    if "--seed" in argv:
        i = argv.index("--seed")
        seed = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) == 3 and argv[0] == "gen":
        img = Images(argv[1])
        ms = mutants(img, seed)
        os.makedirs(argv[2], exist_ok=True)
        man = []
        for k, m in enumerate(ms):
            d = f"m{k:03d}"
            write(img, m, os.path.join(argv[2], d))
            man.append({"name": m.name, "dir": d, "class": m.cls, "file": m.file, "what": m.what})
        with open(os.path.join(argv[2], "manifest.json"), "w") as fh:
            json.dump(man, fh, indent=1)
        print(f"{len(ms)} mutants (seed {seed}) in {argv[2]}")
        return 0
    if len(argv) == 2 and argv[0] == "list":
        for m in mutants(Images(argv[1]), seed):
            print(f"{m.name}\t{m.what}")
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Bad as e:
        sys.exit(f"mutate.py: {e}")
