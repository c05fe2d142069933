//! The sysfs files that change while the emulator runs, as the kernel's
//! change with the GPU's use:
//!
//! * amdgpu's memory use of each GPU beside its PCI attributes
//!   (`mem_info_vram_used`, `mem_info_vis_vram_used`, `mem_info_gtt_used`,
//!   bytes), what `rocm-smi --showmeminfo` and its VRAM% read;
//! * KFD's per-process directory `/sys/class/kfd/kfd/proc/<pid>/` while a
//!   process has /dev/kfd open (`kfd_process.c`'s procfs), what
//!   `rocm-smi --showpids` reads: `pasid`; per GPU `vram_<gpu_id>` (the
//!   process' VRAM in bytes), `sdma_<gpu_id>` (the SDMA engines' busy
//!   time on its queues, µs, as KFD shows the engines' activity counter),
//!   `stats_<gpu_id>/evicted_ms` and, on GFX9 parts (whose kfd2kgd reads
//!   CU occupancy), `stats_<gpu_id>/cu_occupancy` (its resident waves
//!   over the waves a CU holds, rounded up, as KFD counts CUs), and
//!   `counters_<gpu_id>/{faults,page_in,page_out}` (SVM); and a directory
//!   `queues/<queue id>/` per user queue with its `gpuid`, `size` (ring
//!   bytes) and `type` (KFD's queue type), written without a newline as
//!   KFD's queue attributes are;
//! * each GPU's `gpu_metrics` table, whose timestamps and energy advance,
//!   and the attributes that follow the engines' load (`gpu_busy_percent`,
//!   `mem_busy_percent`, the `pp_dpm_*` current levels; see
//!   [`super::load`]), taken again every second on a clock of their own
//!   ([`load_files`]), as are the per-process files.
//!
//! [`files`] is pure: what a [`Snapshot`] of the device model shows.
//! [`Tree`] writes such files into a tmpfs the runner mounted read-only
//! for everyone else, through a writable clone of that mount
//! (`open_tree(OPEN_TREE_CLONE)`): a file is replaced by a rename, a new
//! directory is made under a hidden name and renamed into place, so that
//! a reader sees a whole old or a whole new file or directory, never one
//! half written.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use super::load::Load;
use super::pci_names;
use crate::profile::Profile;

/// The overlays (see [`super::overlays`]) whose tmpfs holds live files.
pub const DEVICES: &str = "/sys/devices";
pub const VIRTUAL: &str = "/sys/devices/virtual";

/// Below [`VIRTUAL`]: KFD's directory of processes.
pub const PROC_DIR: &str = "kfd/kfd/proc";

/// KFD's queue types (`enum kfd_queue_type` of Linux 6.18) as `queues/<id>/type` shows them.
pub mod queue_type {
    pub const COMPUTE: u32 = 0;
    pub const SDMA: u32 = 1;
    pub const SDMA_XGMI: u32 = 3;
    pub const SDMA_BY_ENG_ID: u32 = 4;
}

/// What the live files show, read from the device model under its lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Per GPU of the profile, in its order.
    pub gpus: Vec<GpuUse>,
    pub procs: Vec<ProcUse>,
}

/// Memory in use on one GPU, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    pub vram: u64,
    pub visible_vram: u64,
    pub gtt: u64,
}

/// One process with /dev/kfd open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcUse {
    /// The process (its lead thread's pid).
    pub pid: u32,
    pub pasid: u32,
    /// The GPUs it has a pdd for.
    pub gpus: Vec<ProcGpu>,
    pub queues: Vec<QueueUse>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcGpu {
    /// The GPU's id in the topology (not the process' own name for it).
    pub gpu_id: u32,
    /// The process' VRAM on it, bytes.
    pub vram: u64,
    /// Its waves resident on the GPU now.
    pub waves: u32,
    /// The SDMA engines' busy time on its queues, µs.
    pub sdma_us: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueUse {
    pub id: u32,
    pub gpu_id: u32,
    /// Ring bytes.
    pub size: u64,
    /// One of [`queue_type`].
    pub qtype: u32,
}

/// A file's text or bytes, or a directory (which may stay empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(String),
    Bytes(Vec<u8>),
}

impl Node {
    fn bytes(&self) -> &[u8] {
        match self {
            Node::Dir => &[],
            Node::File(text) => text.as_bytes(),
            Node::Bytes(b) => b,
        }
    }
}

/// What follows the engines' load, relative to a [`Tree`] of [`DEVICES`]:
/// each GPU's `gpu_metrics` table (the parts that have one) at `clock`,
/// its `gpu_busy_percent`, `mem_busy_percent` and DPM clock levels, with
/// `loads` (one per GPU of the profile, over the last window): rewritten
/// as time passes, as the SMU refreshes its metrics.
pub fn load_files(p: &Profile, clock: super::MetricsClock, loads: &[Load]) -> Files {
    let mut out = Files::new();
    for (g, load) in p.gpus.iter().zip(loads) {
        let (root, func) = pci_names(g);
        if let Some(table) = super::metrics::gpu_metrics(g, clock, load) {
            out.insert(format!("{root}/{func}/gpu_metrics"), Node::Bytes(table));
        }
        for (name, text) in super::activity_files(g, load) {
            out.insert(format!("{root}/{func}/{name}"), Node::File(text + "\n"));
        }
    }
    out
}

/// Paths relative to a [`Tree`]'s base, and what they are.
pub type Files = BTreeMap<String, Node>;

/// The live files of `p` for `s`: those below [`DEVICES`] (base: the
/// overlay's root) and those below [`VIRTUAL`]`/`[`PROC_DIR`].
pub fn files(p: &Profile, s: &Snapshot) -> (Files, Files) {
    let mut devices = Files::new();
    for (g, u) in p.gpus.iter().zip(&s.gpus) {
        let (root, func) = pci_names(g);
        for (name, v) in [
            ("mem_info_vram_used", u.vram),
            ("mem_info_vis_vram_used", u.visible_vram),
            ("mem_info_gtt_used", u.gtt),
        ] {
            devices.insert(
                format!("{root}/{func}/{name}"),
                Node::File(format!("{v}\n")),
            );
        }
    }
    let mut procs = Files::new();
    for pr in &s.procs {
        proc_files(p, pr, &mut procs);
    }
    (devices, procs)
}

/// The waves one CU holds at most, on GFX9 parts, whose CU occupancy KFD
/// reads (`stats_<id>/cu_occupancy`): SIMDs per CU times waves per SIMD.
fn waves_per_cu(p: &Profile, gpu_id: u32) -> Option<u32> {
    p.gpus
        .iter()
        .find(|g| g.gpu_id.0 == gpu_id && (90000..100000).contains(&g.gfx_target_version))
        .map(|g| (g.simd_per_cu * g.max_waves_per_simd).max(1))
}

fn proc_files(p: &Profile, pr: &ProcUse, out: &mut Files) {
    let dir = pr.pid.to_string();
    let mut file =
        |path: String, text: String| out.insert(format!("{dir}/{path}"), Node::File(text));
    file("pasid".into(), format!("{}\n", pr.pasid));
    for g in &pr.gpus {
        let id = g.gpu_id;
        file(format!("vram_{id}"), format!("{}\n", g.vram));
        file(format!("sdma_{id}"), format!("{}\n", g.sdma_us));
        file(format!("stats_{id}/evicted_ms"), "0\n".into());
        if let Some(per_cu) = waves_per_cu(p, id) {
            // KFD's count: the process' waves over a CU's, rounded up.
            let cus = g.waves.div_ceil(per_cu);
            file(format!("stats_{id}/cu_occupancy"), format!("{cus}\n"));
        }
        for c in ["faults", "page_in", "page_out"] {
            file(format!("counters_{id}/{c}"), "0\n".into());
        }
    }
    for q in &pr.queues {
        let qd = format!("queues/{}", q.id);
        file(format!("{qd}/gpuid"), q.gpu_id.to_string());
        file(format!("{qd}/size"), q.size.to_string());
        file(format!("{qd}/type"), q.qtype.to_string());
    }
    // Every directory, so that an empty one (queues/) is there too.
    let dirs: Vec<String> = out
        .keys()
        .filter(|k| k.starts_with(&format!("{dir}/")))
        .flat_map(|k| ancestors(k))
        .collect();
    out.insert(format!("{dir}/queues"), Node::Dir);
    for d in dirs {
        out.insert(d, Node::Dir);
    }
}

/// The directories above relative path `path` (not the base itself).
fn ancestors(path: &str) -> Vec<String> {
    let mut v = Vec::new();
    let mut p = path;
    while let Some((parent, _)) = p.rsplit_once('/') {
        v.push(parent.to_owned());
        p = parent;
    }
    v
}

fn parent(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(p, _)| p)
}

/// The hidden name a new file or directory is made under before it is
/// renamed to `path` (readers of sysfs directories skip dot names, as
/// rocm-smi does in KFD's `proc`).
fn hidden(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((d, n)) => format!("{d}/.{n}.new"),
        None => format!(".{path}.new"),
    }
}

/// Live files below `base` of a tmpfs, written through a writable clone
/// of its mount; remembers what it wrote, and writes only what changed.
pub struct Tree {
    /// The clone (`open_tree(OPEN_TREE_CLONE)`): reached as
    /// `/proc/self/fd/<fd>`, it is the same tmpfs, writable.
    root: OwnedFd,
    base: String,
    written: Files,
}

impl Tree {
    /// Files below `base` (relative to the mount's root; it exists) of
    /// the mount `root`.
    pub fn new(root: OwnedFd, base: &str) -> Tree {
        Tree {
            root,
            base: base.to_owned(),
            written: Files::new(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.root.as_raw_fd()));
        if !self.base.is_empty() {
            p.push(&self.base);
        }
        p.push(rel);
        p
    }

    /// Makes the tree show `new`: what went away is removed, what is new
    /// or changed is written (see the module's notes on atomicity).
    pub fn apply(&mut self, new: Files) -> io::Result<()> {
        let gone: Vec<String> = self
            .written
            .iter()
            .filter(|(p, n)| new.get(*p) != Some(n))
            .map(|(p, _)| p.clone())
            .collect();
        for p in &gone {
            // Replaced files are renamed over below; removed ones go.
            let inside_gone = parent(p)
                .is_some_and(|d| self.written.get(d) == Some(&Node::Dir) && !new.contains_key(d));
            if new.contains_key(p) || inside_gone {
                continue;
            }
            let r = match self.written[p] {
                Node::Dir => std::fs::remove_dir_all(self.path(p)),
                Node::File(_) | Node::Bytes(_) => std::fs::remove_file(self.path(p)),
            };
            ignore_gone(r).map_err(|e| self.err(p, e))?;
        }
        for (p, n) in &new {
            // Directories it does not list (the PCI functions') exist.
            let under_new = parent(p)
                .is_some_and(|d| new.get(d) == Some(&Node::Dir) && !self.written.contains_key(d));
            if under_new || self.written.get(p) == Some(n) {
                continue;
            }
            self.place(p, n, &new)?;
        }
        self.written = new;
        Ok(())
    }

    /// Writes `p` (a directory with everything `new` has below it) under
    /// its hidden name and renames it into place.
    fn place(&self, p: &str, n: &Node, new: &Files) -> io::Result<()> {
        let tmp = hidden(p);
        match n {
            Node::File(_) | Node::Bytes(_) => self.write_file(&tmp, n.bytes())?,
            Node::Dir => {
                if self.written.contains_key(p) {
                    return Ok(()); // was a directory, still is
                }
                ignore_gone(std::fs::remove_dir_all(self.path(&tmp)))
                    .map_err(|e| self.err(&tmp, e))?;
                std::fs::create_dir(self.path(&tmp)).map_err(|e| self.err(&tmp, e))?;
                let prefix = format!("{p}/");
                for (q, m) in new
                    .range(prefix.clone()..)
                    .take_while(|(q, _)| q.starts_with(&prefix))
                {
                    let at = format!("{tmp}/{}", &q[prefix.len()..]);
                    match m {
                        Node::Dir => std::fs::create_dir_all(self.path(&at)),
                        file => self.write_file(&at, file.bytes()),
                    }
                    .map_err(|e| self.err(&at, e))?;
                }
            }
        }
        std::fs::rename(self.path(&tmp), self.path(p)).map_err(|e| self.err(p, e))
    }

    /// A file of `text`, read-only like a sysfs attribute (made so by its
    /// open: a refresh writes a few files after each allocation, and each
    /// system call saved counts). Its directory is made only when missing.
    fn write_file(&self, rel: &str, text: &[u8]) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.path(rel);
        let open = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o444)
                .open(&path)
        };
        let mut f = match open() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(d) = path.parent() {
                    std::fs::create_dir_all(d)?;
                }
                open()?
            }
            r => r?,
        };
        f.write_all(text)
    }

    fn err(&self, rel: &str, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("live sysfs {}/{rel}: {e}", self.base))
    }
}

fn ignore_gone(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// A writable clone of the mount at `dir` (`open_tree(OPEN_TREE_CLONE)`:
/// detached, reachable only through the fd); taken before the mount is
/// made read-only, the clone stays writable.
pub fn clone_mount(dir: &str) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(dir).map_err(|_| io::Error::other("path contains NUL"))?;
    // SAFETY: a valid NUL-terminated path; open_tree takes integer flags.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("open_tree({dir}, OPEN_TREE_CLONE): {e}"),
        ));
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(p: &Profile) -> Snapshot {
        let g0 = p.gpus[0].gpu_id.0;
        Snapshot {
            gpus: p
                .gpus
                .iter()
                .enumerate()
                .map(|(i, _)| GpuUse {
                    vram: if i == 0 { 64 << 20 } else { 0 },
                    visible_vram: if i == 0 { 64 << 20 } else { 0 },
                    gtt: 4096,
                })
                .collect(),
            procs: vec![ProcUse {
                pid: 42,
                pasid: 32769,
                gpus: vec![ProcGpu {
                    gpu_id: g0,
                    vram: 64 << 20,
                    waves: 40,
                    sdma_us: 1234,
                }],
                queues: vec![QueueUse {
                    id: 0,
                    gpu_id: g0,
                    size: 1 << 16,
                    qtype: queue_type::COMPUTE,
                }],
            }],
        }
    }

    #[test]
    fn files_show_memory_use_and_processes() {
        let p = Profile::builtin("mi210x4").unwrap();
        let s = snapshot(&p);
        let (dev, procs) = files(&p, &s);
        let (root, func) = pci_names(&p.gpus[0]);
        assert_eq!(
            dev[&format!("{root}/{func}/mem_info_vram_used")],
            Node::File(format!("{}\n", 64u64 << 20))
        );
        assert_eq!(dev.len(), 3 * p.gpus.len());
        let g0 = p.gpus[0].gpu_id.0;
        assert_eq!(procs["42/pasid"], Node::File("32769\n".into()));
        assert_eq!(
            procs[&format!("42/vram_{g0}")],
            Node::File(format!("{}\n", 64u64 << 20))
        );
        assert_eq!(procs["42/queues/0/gpuid"], Node::File(g0.to_string()));
        assert_eq!(procs["42/queues/0/type"], Node::File("0".into()));
        // 40 waves on gfx90a's CUs of 4 SIMDs of 8 waves: 2 CUs.
        assert_eq!(
            procs[&format!("42/stats_{g0}/cu_occupancy")],
            Node::File("2\n".into())
        );
        assert_eq!(procs[&format!("42/sdma_{g0}")], Node::File("1234\n".into()));
        for d in ["42", "42/queues", "42/queues/0", &format!("42/stats_{g0}")] {
            assert_eq!(procs[d], Node::Dir, "{d}");
        }
        let none = files(
            &p,
            &Snapshot {
                gpus: s.gpus.clone(),
                procs: vec![],
            },
        )
        .1;
        assert!(none.is_empty());
    }

    /// A tmpfs-free check of the writer: a directory stands in for the
    /// mount (its fd is what the clone's would be).
    #[test]
    fn tree_adds_changes_and_removes() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("proc")).unwrap();
        let fd: OwnedFd = std::fs::File::open(tmp.path()).unwrap().into();
        let mut t = Tree::new(fd, "proc");
        let p = Profile::builtin("mi210x4").unwrap();
        let mut s = snapshot(&p);
        t.apply(files(&p, &s).1).unwrap();
        let g0 = p.gpus[0].gpu_id.0;
        let read = |rel: &str| std::fs::read_to_string(tmp.path().join("proc").join(rel));
        assert_eq!(
            read(&format!("42/vram_{g0}")).unwrap(),
            format!("{}\n", 64u64 << 20)
        );
        assert_eq!(read("42/queues/0/size").unwrap(), "65536");
        s.procs[0].gpus[0].vram = 0;
        s.procs[0].queues.clear();
        t.apply(files(&p, &s).1).unwrap();
        assert_eq!(read(&format!("42/vram_{g0}")).unwrap(), "0\n");
        assert!(read("42/queues/0/size").is_err());
        assert!(tmp.path().join("proc/42/queues").is_dir());
        s.procs.clear();
        t.apply(files(&p, &s).1).unwrap();
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("proc"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
