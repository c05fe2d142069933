#!/usr/bin/python3
"""Checks and damages criu-rocm's GPU image files for test/gpu/run.sh.

  imgcheck.py decode DIR UPSTREAM_PROTO OUR_PROTO
      Decodes every amdgpu-kfd-*.img and amdgpu-renderD-*.img of DIR with
      `protoc --decode`, once against upstream CRIU 4.2.1's message definitions
      (criu_kfd, criu_render_node) and once against ours (criu_amdgpu.*). Fails
      on a bad size word, a decode error, a missing required field, counts that
      disagree with the entries, or the two decodes disagreeing. Prints a JSON
      summary: {"kfd": {ID: {"pid", "gpus", "cpus", "bos", "objects"}},
      "render": {ID: GPU_ID}}.
  imgcheck.py pages DIR OUR_PROTO EXPECTED_DIR
      Checks that each pages file holds the VRAM/GTT BOs of its GPU in bucket
      order, and that every BO whose expected bytes gpu-workload wrote
      (EXPECTED_DIR/<pid>-<gpu_id %04x>-<addr %x>.bin) holds exactly those bytes.
      Every expected file must be matched by a BO.
  imgcheck.py upstream DIR UPSTREAM_PROTO
      Rewrites every amdgpu-kfd-*.img and amdgpu-renderD-*.img of DIR the way
      upstream CRIU 4.2.1's plugin writes them: decoded and re-encoded with
      upstream's own message definitions, dropping every field those do not
      know (criu-rocm's optional fields >= 1000 and criu-dev's render-node
      fields), and removes amdgpu-digests.img, which upstream does not write.
      Prints how many fields were dropped.
  imgcheck.py corrupt FILE MODE ARG [OUR_PROTO]
      truncate N     drops the last N bytes
      flip OFF       inverts the byte at OFF (negative: from the end)
      size-word D    adds D to the leading u64 size word
      num-bos D      adds D to criu_kfd.num_of_bos, or sets it with =D (re-encoded
                     with protoc)
      pid D          the same for criu_kfd.pid (the process the image was saved from)
      drop-hash first
                     removes content_xxh3 of the first BO that has one; prints its index
      bo-addr KIND:BIT
                     flips bit BIT of the addr of the first BO of KIND (doorbell: the
                     DOORBELL flag; vram: the VRAM flag); prints its index
  imgcheck.py hostile FILE EDIT
      Edits KFD's private data in a KFD image as someone who writes images
      would, keeping the blob self-consistent (bytes inserted where a size
      grows) and, when the directory has amdgpu-digests.img, the file's digest
      line recomputed: ctl-1m (the first queue's control stack grown by 1 MiB),
      mqd-64k (its MQD by 64 KiB), type (HIQ), sdma-id, doorbell, ring (outside
      the process), event-id (the first event's, out of its range), svm (an SVM
      range the process never mapped), counts (num_of_objects 2^32-1).

The image files are framed as a little-endian u64 size and that many bytes
(Documentation/image-format.md).
"""

import json
import os
import re
import struct
import subprocess
import sys
import tempfile

VRAM, GTT = 1, 2


class Bad(Exception):
    pass


def unframe(path):
    data = open(path, "rb").read()
    if len(data) < 8:
        raise Bad(f"{path}: {len(data)} bytes, no size word")
    (size,) = struct.unpack_from("<Q", data)
    if size != len(data) - 8:
        raise Bad(f"{path}: size word {size}, but {len(data) - 8} bytes follow")
    return data[8:]


def protoc(args, data, what):
    r = subprocess.run(["protoc"] + args, input=data, capture_output=True)
    err = r.stderr.decode(errors="replace").strip()
    if r.returncode != 0 or err:
        raise Bad(f"{what}: protoc {' '.join(args[:1])}: exit {r.returncode}: {err}")
    return r.stdout


def decode(data, proto, message, what):
    d = os.path.dirname(os.path.abspath(proto))
    text = protoc([f"--decode={message}", f"-I{d}", os.path.abspath(proto)], data, what)
    return parse_text(text.decode(errors="replace"), what)


SCALAR = re.compile(r'^\s*([A-Za-z_0-9]+): (.*)$')
OPEN = re.compile(r'^\s*([A-Za-z_0-9]+) \{$')


def parse_text(text, what):
    """protoc's text format: nested messages as dicts, every field as a list."""
    root = {}
    stack = [root]
    for line in text.splitlines():
        if not line.strip():
            continue
        m = OPEN.match(line)
        if m:
            child = {}
            stack[-1].setdefault(m.group(1), []).append(child)
            stack.append(child)
            continue
        if line.strip() == "}":
            stack.pop()
            continue
        m = SCALAR.match(line)
        if not m:
            raise Bad(f"{what}: unexpected protoc output line {line[:80]!r}")
        v = m.group(2)
        if not v.startswith('"'):
            v = int(v, 0)
        stack[-1].setdefault(m.group(1), []).append(v)
    if len(stack) != 1:
        raise Bad(f"{what}: unbalanced protoc output")
    return root


def one(msg, field, default=None):
    v = msg.get(field)
    if not v:
        if default is None:
            raise Bad(f"field {field} missing")
        return default
    return v[0]


def image_ids(dir, prefix):
    ids = []
    for n in os.listdir(dir):
        m = re.fullmatch(prefix + r"(-?\d+)\.img", n)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


def summarize_kfd(msg, what):
    gpus, cpus = [], []
    for d in msg.get("device_entries", []):
        (gpus if one(d, "gpu_id") else cpus).append(d)
    if one(msg, "num_of_gpus") != len(gpus) or one(msg, "num_of_cpus") != len(cpus):
        raise Bad(f"{what}: num_of_gpus/num_of_cpus {one(msg, 'num_of_gpus')}/"
                  f"{one(msg, 'num_of_cpus')}, entries {len(gpus)}/{len(cpus)}")
    bos = [{"addr": one(b, "addr"), "size": one(b, "size"), "gpu_id": one(b, "gpu_id"),
            "flags": one(b, "alloc_flags")} for b in msg.get("bo_entries", [])]
    if one(msg, "num_of_bos") != len(bos):
        raise Bad(f"{what}: num_of_bos {one(msg, 'num_of_bos')}, {len(bos)} bo_entries")
    ids = {one(g, "gpu_id") for g in gpus}
    for b in bos:
        if b["gpu_id"] not in ids:
            raise Bad(f"{what}: BO at {b['addr']:#x} names GPU {b['gpu_id']:#x}, not in the image")
    if not msg.get("priv_data"):
        raise Bad(f"{what}: no priv_data")
    return {"pid": one(msg, "pid"), "gpus": sorted(ids), "cpus": len(cpus), "bos": bos,
            "objects": one(msg, "num_of_objects")}


def cmd_decode(dir, upstream, ours, quiet=False):
    out = {"kfd": {}, "render": {}}
    for i in image_ids(dir, "amdgpu-kfd-"):
        path = os.path.join(dir, f"amdgpu-kfd-{i}.img")
        data = unframe(path)
        up = summarize_kfd(decode(data, upstream, "criu_kfd", path), path + " (upstream schema)")
        ou = summarize_kfd(decode(data, ours, "criu_amdgpu.criu_kfd", path), path)
        if up != ou:
            raise Bad(f"{path}: upstream's and our schema decode differently")
        out["kfd"][i] = ou
    for i in image_ids(dir, "amdgpu-renderD-"):
        path = os.path.join(dir, f"amdgpu-renderD-{i}.img")
        data = unframe(path)
        up = one(decode(data, upstream, "criu_render_node", path), "gpu_id")
        ou = one(decode(data, ours, "criu_amdgpu.criu_render_node", path), "gpu_id")
        if up != ou:
            raise Bad(f"{path}: gpu_id {up:#x} with upstream's schema, {ou:#x} with ours")
        out["render"][i] = ou
    if not out["kfd"]:
        raise Bad(f"{dir}: no amdgpu-kfd-*.img")
    if not quiet:
        print(json.dumps(out))
    return out


def cmd_pages(dir, ours, expected_dir):
    # Decoding with our schema only; `decode` checks the upstream one.
    kfd = {}
    for i in image_ids(dir, "amdgpu-kfd-"):
        path = os.path.join(dir, f"amdgpu-kfd-{i}.img")
        kfd[i] = summarize_kfd(decode(unframe(path), ours, "criu_amdgpu.criu_kfd", path), path)
    if not kfd:
        raise Bad(f"{dir}: no amdgpu-kfd-*.img")
    expected = set(n for n in os.listdir(expected_dir) if n.endswith(".bin"))
    if not expected:
        raise Bad(f"{expected_dir}: gpu-workload wrote no expected BO contents")
    matched, nbytes, data_bos = set(), 0, 0
    for i, img in kfd.items():
        for gpu in img["gpus"]:
            path = os.path.join(dir, f"amdgpu-pages-{i}-{gpu:04x}.img")
            bos = [b for b in img["bos"] if b["gpu_id"] == gpu and b["flags"] & (VRAM | GTT)]
            want = sum(b["size"] for b in bos)
            with open(path, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                if size != want:
                    raise Bad(f"{path}: size word {size}, the KFD image's BOs of GPU "
                              f"{gpu:#06x} add up to {want}")
                if os.fstat(f.fileno()).st_size != 8 + want:
                    raise Bad(f"{path}: {os.fstat(f.fileno()).st_size} bytes, expected {8 + want}")
                for b in bos:
                    name = f"{img['pid']}-{gpu:04x}-{b['addr']:x}.bin"
                    if name not in expected:
                        f.seek(b["size"], 1)
                        continue
                    exp = os.path.join(expected_dir, name)
                    if os.path.getsize(exp) != b["size"]:
                        raise Bad(f"BO at {b['addr']:#x} of GPU {gpu:#06x}: {b['size']} bytes, "
                                  f"gpu-workload filled {os.path.getsize(exp)}")
                    at = f.tell()
                    with open(exp, "rb") as e:
                        left = b["size"]
                        while left:
                            n = min(left, 1 << 20)
                            got, ref = f.read(n), e.read(n)
                            if got != ref:
                                k = next(j for j in range(len(ref)) if j >= len(got) or got[j] != ref[j])
                                off = b["size"] - left + k
                                raise Bad(f"{path}: BO at {b['addr']:#x} (pid {img['pid']}), byte "
                                          f"{off:#x} (file offset {at + off:#x}) differs from what "
                                          f"the process wrote")
                            left -= n
                    matched.add(name)
                    nbytes += b["size"]
                    data_bos += 1
    missing = expected - matched
    if missing:
        raise Bad(f"{len(missing)} BO(s) the process filled are in no pages file, e.g. "
                  f"{sorted(missing)[0]}")
    print(f"{data_bos} BO(s), {nbytes} bytes, hold exactly the process' patterns "
          f"({len(kfd)} KFD image(s))")


def cmd_corrupt(path, mode, arg, ours=None):
    data = bytearray(open(path, "rb").read())
    if mode == "truncate":
        data = data[: len(data) - int(arg)]
    elif mode == "flip":
        off = int(arg)
        data[off] ^= 0xFF
    elif mode == "size-word":
        (size,) = struct.unpack_from("<Q", data)
        struct.pack_into("<Q", data, 0, size + int(arg))
    elif mode in ("num-bos", "pid"):
        field = {"num-bos": "num_of_bos", "pid": "pid"}[mode]
        d = os.path.dirname(os.path.abspath(ours))
        args = [f"-I{d}", os.path.abspath(ours)]
        text = protoc(["--decode=criu_amdgpu.criu_kfd"] + args, bytes(data[8:]), path).decode()
        n = int(re.search(rf"^{field}: (\d+)$", text, re.M).group(1))
        n = int(arg[1:]) if arg.startswith("=") else n + int(arg)
        text = re.sub(rf"^{field}: \d+$", f"{field}: {n}", text, flags=re.M)
        payload = protoc(["--encode=criu_amdgpu.criu_kfd"] + args, text.encode(), path)
        data = bytearray(struct.pack("<Q", len(payload)) + payload)
    elif mode in ("drop-hash", "bo-addr"):
        d = os.path.dirname(os.path.abspath(ours))
        args = [f"-I{d}", os.path.abspath(ours)]
        text = protoc(["--decode=criu_amdgpu.criu_kfd"] + args, bytes(data[8:]), path).decode()
        blocks = list(re.finditer(r"^bo_entries \{\n(.*?)^\}\n", text, re.M | re.S))
        if mode == "drop-hash":
            pick = lambda b: re.search(r"^  content_xxh3: \d+$", b, re.M)
        else:
            kind, bit = arg.split(":")
            flag = {"doorbell": 1 << 3, "vram": 1 << 0}[kind]
            pick = lambda b: int(re.search(r"^  alloc_flags: (\d+)$", b, re.M).group(1)) & flag
        index = next((i for i, m in enumerate(blocks) if pick(m.group(1))), None)
        if index is None:
            raise Bad(f"{path}: no BO for {mode} {arg}")
        m = blocks[index]
        body = m.group(1)
        if mode == "drop-hash":
            body = re.sub(r"^  content_xxh3: \d+\n", "", body, flags=re.M)
        else:
            addr = int(re.search(r"^  addr: (\d+)$", body, re.M).group(1))
            body = re.sub(r"^  addr: \d+$", f"  addr: {addr ^ (1 << int(bit))}", body, flags=re.M)
        text = text[: m.start(1)] + body + text[m.end(1):]
        payload = protoc(["--encode=criu_amdgpu.criu_kfd"] + args, text.encode(), path)
        data = bytearray(struct.pack("<Q", len(payload)) + payload)
        print(index)
    else:
        raise Bad(f"unknown corruption {mode}")
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path) or ".", delete=False) as t:
        t.write(data)
    os.chmod(t.name, os.stat(path).st_mode & 0o7777)
    os.replace(t.name, path)


def cmd_hostile(path, edit):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "integrity"))
    import mutate
    data = mutate.hostile_kfd(open(path, "rb").read(), edit)
    open(path, "wb").write(data)
    digests = os.path.join(os.path.dirname(path), mutate.DIGESTS)
    if os.path.exists(digests):
        text = mutate.forge_digests(open(digests, "rb").read(), os.path.basename(path), data)
        open(digests, "wb").write(text)


UNKNOWN = re.compile(r'^\s*\d+: ')


def cmd_upstream(dir, upstream):
    d = os.path.dirname(os.path.abspath(upstream))
    args = [f"-I{d}", os.path.abspath(upstream)]
    dropped = 0
    for prefix, message in (("amdgpu-kfd-", "criu_kfd"), ("amdgpu-renderD-", "criu_render_node")):
        for i in image_ids(dir, prefix):
            path = os.path.join(dir, f"{prefix}{i}.img")
            text = protoc([f"--decode={message}"] + args, unframe(path), path).decode()
            kept = [l for l in text.splitlines() if not UNKNOWN.match(l)]
            dropped += text.count("\n") - len(kept)
            payload = protoc([f"--encode={message}"] + args, ("\n".join(kept) + "\n").encode(), path)
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(payload)) + payload)
    digests = os.path.join(dir, "amdgpu-digests.img")
    if os.path.exists(digests):
        os.unlink(digests)
    print(f"dropped {dropped} field(s) upstream 4.2.1 does not know")


def main():
    a = sys.argv[1:]
    try:
        if a[:1] == ["decode"] and len(a) == 4:
            cmd_decode(*a[1:])
        elif a[:1] == ["pages"] and len(a) == 4:
            cmd_pages(*a[1:])
        elif a[:1] == ["upstream"] and len(a) == 3:
            cmd_upstream(*a[1:])
        elif a[:1] == ["hostile"] and len(a) == 3:
            cmd_hostile(*a[1:])
        elif a[:1] == ["corrupt"] and len(a) in (4, 5):
            cmd_corrupt(*a[1:])
        else:
            sys.exit(__doc__)
    except (Bad, OSError, ValueError) as e:
        sys.exit(f"imgcheck: {e}")


if __name__ == "__main__":
    main()
