#!/usr/bin/python3
"""Writes the config.json of a GPU container for test/containers/run.sh.

usage: oci-config.py OUT ROOTFS MINORS [--cgroups-path P] [--criu-config F] [--host-minors M]
                     [--cpu-topology yes] [--device-nodes D] -- ARGS...

The container gets, as a Kubernetes device plugin gives them: /dev/kfd, the render nodes
/dev/dri/renderD<N> of MINORS (comma separated), and device-cgroup rules for them; and the
KFD topology the (emulated) host shows, bound read-only from the namespace this runs in:
/sys/devices/virtual/kfd, /sys/class/kfd, /sys/class/drm, /sys/dev/char and every PCI
device directory a render node of the topology links to. /sys is a tmpfs holding only
those (kfd-emu's nodes are FUSE files, not character devices, so the device files are
bind mounts). With --host-minors, container node renderD<MINORS[i]> is the host's
renderD<HOST[i]> (the restore of a checkpoint made with other GPUs: the container keeps
its mount points, the engine binds the new GPUs there). --cpu-topology yes also binds
/sys/devices/system/node and /sys/devices/system/cpu, which libhsakmt reads.
--device-nodes D (comma separated minors) adds render nodes as hardware containers get
them: linux.devices entries /dev/dri/renderD<D> (character 226:D), which runc makes with
mknod in the container's /dev tmpfs.
"""
import json
import os
import sys


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    opts, args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    out, rootfs, minors = opts[0], opts[1], [int(m) for m in opts[2].split(",") if m]
    cgroups_path = criu_config = None
    cpu_topology = False
    device_nodes = []
    host = minors
    rest = opts[3:]
    while rest:
        k, v, rest = rest[0], rest[1], rest[2:]
        if k == "--cgroups-path":
            cgroups_path = v
        elif k == "--criu-config":
            criu_config = v
        elif k == "--cpu-topology":
            cpu_topology = v == "yes"
        elif k == "--device-nodes":
            device_nodes = [int(m) for m in v.split(",")]
        elif k == "--host-minors":
            host = [int(m) for m in v.split(",")]
        else:
            sys.exit(f"oci-config.py: unknown option {k}")
    if len(host) != len(minors):
        sys.exit("oci-config.py: --host-minors must name as many nodes as MINORS")

    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmp",
         "options": ["nosuid", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "tmpfs", "source": "sysfs-view",
         "options": ["nosuid", "noexec", "nodev", "mode=755", "size=1m"]},
    ]
    sysdirs = ["/sys/devices/virtual/kfd", "/sys/class/kfd", "/sys/class/drm", "/sys/dev/char"]
    # The PCI device directories the topology's render nodes live in.
    pci = set()
    for name in sorted(os.listdir("/sys/class/drm")):
        if name.startswith("renderD"):
            target = os.path.realpath(os.path.join("/sys/class/drm", name))
            parts = target.split("/")
            if len(parts) > 3 and parts[1] == "sys" and parts[2] == "devices":
                pci.add("/".join(parts[:4]))
    for d in sysdirs + sorted(pci):
        mounts.append({"destination": d, "type": "bind", "source": d,
                       "options": ["bind", "ro", "nosuid", "noexec", "nodev"]})
    # libhsakmt also reads every CPU node's caches (nodeN/cpu*/cache). kfd-emu lays out
    # the nodes of a profile with several as a tmpfs over the host's directory, which
    # re-exposes the host's own entries by bind mounts: bound without them (CRIU cannot
    # dump a bind mount of sysfs whose source is outside the container).
    if cpu_topology:
        for d, how in (("/sys/devices/system/node", "bind"), ("/sys/devices/system/cpu", "rbind")):
            mounts.append({"destination": d, "type": "bind", "source": d,
                           "options": [how, "ro", "nosuid", "noexec", "nodev"]})
    mounts.append({"destination": "/dev/kfd", "type": "bind", "source": "/dev/kfd",
                   "options": ["bind", "nosuid", "noexec"]})
    for m, h in zip(minors, host):
        mounts.append({"destination": f"/dev/dri/renderD{m}", "type": "bind",
                       "source": f"/dev/dri/renderD{h}", "options": ["bind", "nosuid", "noexec"]})

    devices = [{"allow": False, "access": "rwm"}]
    for h in host:
        devices.append({"allow": True, "type": "c", "major": 226, "minor": h, "access": "rw"})
    config = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/bin", "HOME=/"],
            "cwd": "/",
            "capabilities": {k: ["CAP_KILL", "CAP_SYS_PTRACE", "CAP_IPC_LOCK"] for k in
                             ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": rootfs, "readonly": False},
        "hostname": "gpu-ct",
        "mounts": mounts,
        "linux": {
            "resources": {"devices": devices},
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }
    if device_nodes:
        config["linux"]["devices"] = [
            {"path": f"/dev/dri/renderD{d}", "type": "c", "major": 226, "minor": d,
             "fileMode": 0o666, "uid": 0, "gid": 0} for d in device_nodes]
    if cgroups_path:
        config["linux"]["cgroupsPath"] = cgroups_path
    if criu_config:
        config.setdefault("annotations", {})["org.criu.config"] = criu_config
    with open(out, "w") as f:
        json.dump(config, f, indent=1)


main()
