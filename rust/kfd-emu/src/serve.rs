//! What `kfd-emu run` serves, and the glue between the transports and the
//! device model: one FUSE [`FileOps`] per device node and the `kfd-emu
//! supervise` handler, all delegating to the shared [`device::Emulator`].

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use crate::chardev;
use crate::device::{self, Emulator, NodeKind};
use crate::fuse::dmabuf::DmabufFs;
use crate::fuse::{Caller, FileOps, IoctlReply};
use crate::profile::Profile;
use crate::sysfs::live;

/// One device node to serve.
pub struct NodeSpec {
    /// Absolute path inside the namespace (`/dev/kfd`,
    /// `/dev/dri/renderD128`).
    pub path: PathBuf,
    pub backing: OwnedFd,
    pub ops: Arc<dyn FileOps>,
}

/// The devices and how to stop them.
pub struct Devices {
    pub nodes: Vec<NodeSpec>,
    pub shutdown: Box<dyn FnOnce()>,
    /// What answers the calls `kfd-emu supervise` traps: listeners are
    /// taken on `STATE_DIR/supervise.sock` when there is one.
    pub supervisor: Option<Arc<dyn crate::supervise::Handler>>,
    /// The live sysfs files, given their mounts once the runner made them.
    pub live: Option<Arc<LiveSysfs>>,
}

/// The live sysfs files of a run ([`crate::sysfs::live`]), written again
/// after every call that may change what they show, before the caller
/// gets its answer: the opens and releases of the nodes, the /dev/kfd
/// ioctls that allocate or free memory or make or destroy queues, the
/// render-node ioctls that make, free, import or move GEM objects, and
/// every ioctl `kfd-emu supervise` answers.  The processes' resident waves
/// and SDMA time (`stats_<gpu_id>/cu_occupancy`, `sdma_<gpu_id>`) change
/// with the engines, not with those calls: they are taken on the tick
/// ([`LiveSysfs::tick`]) and shown as then.  Until [`LiveSysfs::attach`],
/// nothing is written.
pub struct LiveSysfs {
    emu: Arc<Emulator>,
    profile: Profile,
    trees: OnceLock<Mutex<Written>>,
    /// When the emulator started: the SMU's clock in `gpu_metrics`.
    start: std::time::Instant,
}

/// How often the `gpu_metrics` tables are taken again (amdgpu reads the
/// SMU's at every read; a reader here sees them at most this old).
const METRICS_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// The live files' two trees and the snapshot they show.
struct Written {
    devices: live::Tree,
    procs: live::Tree,
    /// The `gpu_metrics` tables and the other files that follow the
    /// engines' load, on their own clock ([`LiveSysfs::tick`]).
    metrics: live::Tree,
    /// The engines' busy time when last written: the start of the window
    /// the next write shows the load of.
    totals: Vec<crate::sysfs::load::Totals>,
    /// `None` until written once, and after a failed write.
    shown: Option<live::Snapshot>,
}

impl LiveSysfs {
    /// Takes the writable clones of the mounts at [`live::DEVICES`] and
    /// [`live::VIRTUAL`] and writes the files once.
    pub fn attach(&self, devices: OwnedFd, virt: OwnedFd) -> io::Result<()> {
        let trees = Written {
            metrics: live::Tree::new(devices.try_clone()?, ""),
            devices: live::Tree::new(devices, ""),
            procs: live::Tree::new(virt, live::PROC_DIR),
            shown: None,
            totals: self.emu.load_totals(),
        };
        if self.trees.set(Mutex::new(trees)).is_err() {
            return Err(io::Error::other("live sysfs attached twice"));
        }
        self.write_metrics()?;
        self.write()
    }

    /// Takes the processes' waves and SDMA time and writes the
    /// per-process files, then the `gpu_metrics` tables and the load over
    /// the last period, every [`METRICS_PERIOD`] while `live` lives (a
    /// thread of its own).  A reader that sees the load of a period sees
    /// the processes' files of the same tick or a later one.
    fn tick(live: std::sync::Weak<LiveSysfs>) {
        loop {
            std::thread::sleep(METRICS_PERIOD);
            let Some(l) = live.upgrade() else { return };
            l.emu.sample_activity();
            l.refresh();
            if let Err(e) = l.write_metrics() {
                log::error!("kfd-emu: {e}");
            }
        }
    }

    fn write_metrics(&self) -> io::Result<()> {
        use crate::sysfs::load;
        let Some(trees) = self.trees.get() else {
            return Ok(());
        };
        let mut t = trees.lock().unwrap_or_else(|e| e.into_inner());
        let clock = crate::sysfs::MetricsClock::since(self.start);
        let now = self.emu.load_totals();
        let prev = std::mem::replace(&mut t.totals, now.clone());
        let loads: Vec<load::Load> = prev
            .iter()
            .zip(&now)
            .map(|(a, b)| load::window(a, b))
            .collect();
        t.metrics
            .apply(live::load_files(&self.profile, clock, &loads))
    }

    /// Writes what changed; a failure is logged (the call that caused it
    /// has its own answer).
    pub fn refresh(&self) {
        if let Err(e) = self.write() {
            log::error!("kfd-emu: {e}");
        }
    }

    fn write(&self) -> io::Result<()> {
        let Some(trees) = self.trees.get() else {
            return Ok(());
        };
        let mut t = trees.lock().unwrap_or_else(|e| e.into_inner());
        // Taken under the writer's lock: a later snapshot is written later.
        let now = self.emu.sysfs_snapshot();
        // Most calls that may change what the files show do not (a render
        // file's GEM_OP, a node opened by a process already listed).
        if t.shown.as_ref() == Some(&now) {
            return Ok(());
        }
        t.shown = None;
        let (devices, procs) = live::files(&self.profile, &now);
        t.devices.apply(devices)?;
        t.procs.apply(procs)?;
        t.shown = Some(now);
        Ok(())
    }
}

/// /dev/kfd ioctls after which the live sysfs files may show something
/// else (memory, queues, a restored process).
fn kfd_changes_use(cmd: u32) -> bool {
    use device::uapi::kfd as nr;
    matches!(
        cmd & 0xff,
        nr::CREATE_QUEUE
            | nr::DESTROY_QUEUE
            | nr::ALLOC_MEMORY_OF_GPU
            | nr::FREE_MEMORY_OF_GPU
            | nr::IMPORT_DMABUF
            | nr::CRIU_OP
    )
}

/// Render-node ioctls after which the live sysfs files may show something
/// else (GEM objects made, freed, imported or moved between domains).  Not
/// every render ioctl: a dump probes 4095 context ids per render file, and
/// a snapshot of the whole model after each cost seconds per file on a tree
/// of 64 processes.
fn render_changes_use(cmd: u32) -> bool {
    use device::uapi::drm as nr;
    matches!(
        cmd & 0xff,
        nr::AMDGPU_GEM_CREATE
            | nr::AMDGPU_GEM_USERPTR
            | nr::GEM_CLOSE
            | nr::PRIME_FD_TO_HANDLE
            | nr::AMDGPU_GEM_OP
            | nr::GEM_CHANGE_HANDLE
    )
}

struct NodeOps {
    emu: Arc<Emulator>,
    node: NodeKind,
    live: Arc<LiveSysfs>,
}

/// Hands the transport's reply to the device model's `Replier`, after
/// the live sysfs files are written again when `refresh` names them.
struct Reply(IoctlReply, Option<Arc<LiveSysfs>>);

impl device::Replier for Reply {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>) {
        if let Some(live) = &self.1 {
            live.refresh();
        }
        self.0.reply(r)
    }

    fn request_id(&self) -> Option<u64> {
        Some(self.0.unique())
    }
}

/// Fd arguments resolved through this transport: pull the caller's fd,
/// ask the transport for the open's fh.
struct FuseResolver;

impl device::FdResolver for FuseResolver {
    fn open_of(&self, tgid: u32, fd: i32) -> Result<u64, i32> {
        let pulled = device::pull_fd(tgid, fd).map_err(|_| libc::EBADF)?;
        crate::fuse::fh_of(pulled.as_fd()).map_err(|e| match e.raw_os_error() {
            // Not one of our nodes: the kernel's "not a DRM file".
            Some(libc::ENOTTY) => libc::EINVAL,
            Some(e) => e,
            None => libc::EINVAL,
        })
    }
}

fn device_caller(c: &Caller) -> device::Caller {
    device::Caller {
        tid: c.tid,
        tgid: c.tgid,
    }
}

impl FileOps for NodeOps {
    fn open(&self, caller: &Caller) -> Result<u64, i32> {
        let r = self.emu.open(&self.node, &device_caller(caller));
        self.live.refresh();
        r
    }

    fn release(&self, fh: u64) {
        self.emu.release(fh);
        self.live.refresh();
    }

    fn ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        input: &[u8],
        out_size: u32,
        reply: IoctlReply,
    ) {
        let changes = match self.node {
            NodeKind::Kfd => kfd_changes_use(cmd),
            _ => render_changes_use(cmd),
        };
        self.emu.ioctl(
            fh,
            &device_caller(caller),
            cmd,
            arg,
            input,
            out_size,
            Box::new(Reply(reply, changes.then(|| self.live.clone()))),
        )
    }

    fn interrupt(&self, unique: u64) -> bool {
        self.emu.interrupt(&self.node, unique)
    }
}

/// Where a node appears in the namespace.
pub fn node_path(node: &NodeKind) -> PathBuf {
    match node {
        NodeKind::Kfd => PathBuf::from("/dev/kfd"),
        NodeKind::Render { minor } => PathBuf::from(format!("/dev/dri/renderD{minor}")),
    }
}

/// Creates the emulator for `profile` and the nodes to serve.
pub fn devices(profile: &Profile) -> io::Result<Devices> {
    let emu = Arc::new(Emulator::new(profile, Box::new(FuseResolver))?);
    emu.set_dmabuf_files(Box::new(DmabufFiles::default()));
    let live = Arc::new(LiveSysfs {
        emu: emu.clone(),
        profile: profile.clone(),
        trees: OnceLock::new(),
        start: std::time::Instant::now(),
    });
    let weak = Arc::downgrade(&live);
    std::thread::Builder::new()
        .name("gpu-metrics".into())
        .spawn(move || LiveSysfs::tick(weak))?;
    let mut nodes = Vec::new();
    for node in emu.nodes() {
        nodes.push(NodeSpec {
            path: node_path(&node),
            backing: emu.backing_fd(&node).try_clone_to_owned()?,
            ops: Arc::new(NodeOps {
                emu: emu.clone(),
                node,
                live: live.clone(),
            }),
        });
    }
    let e = emu.clone();
    let nodes_of = emu.nodes();
    Ok(Devices {
        nodes,
        shutdown: Box::new(move || e.shutdown()),
        supervisor: Some(Arc::new(Supervised {
            emu,
            nodes: nodes_of,
            ids: OnceLock::new(),
            live: live.clone(),
        })),
        live: Some(live),
    })
}

/// Whether an mmap of `file` with `prot` and `flags` is a writable shared
/// mapping of a file opened without write access (do_mmap: EACCES).
fn writes_read_only(file: BorrowedFd<'_>, prot: u64, flags: u64) -> bool {
    const MAP_TYPE: u64 = 0x0f;
    let shared = matches!(
        flags & MAP_TYPE,
        f if f == libc::MAP_SHARED as u64 || f == libc::MAP_SHARED_VALIDATE as u64
    );
    // SAFETY: F_GETFL reads the flags of a valid fd and touches no memory.
    let mode = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    shared
        && prot & libc::PROT_WRITE as u64 != 0
        && mode >= 0
        && mode & libc::O_ACCMODE == libc::O_RDONLY
}

/// The dma-buf files (`fuse::dmabuf`), mounted at the first export.
#[derive(Default)]
struct DmabufFiles(OnceLock<Result<DmabufFs, String>>);

impl device::DmabufFiles for DmabufFiles {
    fn open(&self, memfd: BorrowedFd<'_>, size: u64, writable: bool) -> io::Result<OwnedFd> {
        let fs = self.0.get_or_init(|| {
            DmabufFs::mount().map_err(|e| {
                log::error!("dma-buf files: {e}");
                e.to_string()
            })
        });
        match fs {
            Ok(fs) => fs.open(memfd, size, writable),
            Err(e) => Err(io::Error::other(e.clone())),
        }
    }
}

/// Runs `kfd-emu inject-mmap ARGS` (`crate::inject::mmap_instead`, in a
/// process of its own: the daemon reaps orphans with waitpid(-1), which
/// would take a tracer's stops).  Its exit is left to that reaper.
fn inject_mmap(args: &[u64]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("kfd-emu's own path: {e}"))?;
    let child = std::process::Command::new(exe)
        .arg("inject-mmap")
        .args(args.iter().map(u64::to_string))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("kfd-emu inject-mmap: {e}"))?;
    let (mut out, mut err) = (String::new(), String::new());
    use std::io::Read;
    if let Some(mut o) = child.stdout {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr {
        let _ = e.read_to_string(&mut err);
    }
    match out.trim().parse::<i64>() {
        Ok(_) => Ok(()),
        Err(_) => Err(err.trim().to_string()),
    }
}

/// Answers the calls `kfd-emu supervise` traps (see `crate::supervise`).
struct Supervised {
    emu: Arc<Emulator>,
    nodes: Vec<NodeKind>,
    /// (st_dev, st_ino) of each node as mounted, taken on first use (the
    /// nodes are mounted after the devices are made).
    ids: OnceLock<Vec<(u64, u64)>>,
    live: Arc<LiveSysfs>,
}

fn file_id(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is live and `st` writable.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

impl Supervised {
    /// A stat-family call: a render node's attributes as a character
    /// device's (`crate::chardev`), anything else by the kernel.
    fn stat(
        &self,
        n: &crate::supervise::Notice<'_>,
        call: &crate::supervise::StatCall,
        ids: &[(u64, u64)],
    ) -> crate::supervise::Verdict {
        use crate::supervise::Verdict;
        let Some(attr) = chardev::target(n.tid, n.fd, call).and_then(|t| chardev::lookup(&t, call))
        else {
            return Verdict::Continue;
        };
        let id = attr.id();
        let Some(minor) = ids.iter().zip(&self.nodes).find_map(|(i, k)| match k {
            NodeKind::Render { minor } if *i == id => Some(*minor),
            _ => None,
        }) else {
            return Verdict::Continue;
        };
        // The names read are the caller's only while the call is live.
        if !n.valid() {
            return Verdict::Continue;
        }
        match chardev::answer(n.tid, call, attr, minor) {
            Ok(()) => Verdict::Return(0),
            Err(e) => Verdict::Error(e),
        }
    }
}

impl crate::supervise::Handler for Supervised {
    fn handle(&self, n: &crate::supervise::Notice<'_>) -> crate::supervise::Verdict {
        let v = self.answer(n);
        if matches!(n.call, crate::supervise::Call::Ioctl { .. }) {
            self.live.refresh();
        }
        v
    }
}

impl Supervised {
    /// A trapped mmap of a file that is no device node: a dma-buf the
    /// process exported is mapped onto its BO (`device::dmabuf`) in the
    /// caller; anything else is let through.
    fn dmabuf_mmap(
        &self,
        n: &crate::supervise::Notice<'_>,
        file: BorrowedFd<'_>,
        id: (u64, u64),
    ) -> crate::supervise::Verdict {
        use crate::supervise::{Call, Verdict};
        let Call::Mmap {
            addr,
            len,
            prot,
            flags,
            offset,
        } = n.call
        else {
            return Verdict::Continue;
        };
        let caller = device::Caller {
            tid: n.tid,
            tgid: n.tgid,
        };
        let mapped = self.emu.dmabuf_mmap(id, &caller, (offset, len), || {
            writes_read_only(file, prot, flags)
        });
        let (window, at) = match mapped {
            None => return Verdict::Continue,
            Some(Err(e)) => return Verdict::Error(e),
            Some(Ok(w)) => w,
        };
        let refuse = |why: String| {
            log::warn!(
                "kfd-emu: pid {} thread {}: mmap of dma-buf fd {} not mapped onto its BO \
                 (ENODEV): {why}",
                n.tgid,
                n.tid,
                n.fd
            );
            Verdict::Error(libc::ENODEV)
        };
        if cfg!(not(target_arch = "x86_64")) {
            return refuse("implemented on x86_64 only".into());
        }
        // A tracer (a debugger, or CRIU dumping it) keeps the injector
        // from seizing the thread; so may a thread gone.
        if device::tracer_of(n.tid).is_none_or(|t| t != 0) {
            return refuse("the thread is traced".into());
        }
        let fd = match n.addfd(window.as_fd(), true) {
            Ok(fd) => fd,
            // The call was withdrawn: it restarts, or the caller died.
            Err(_) => return Verdict::Done,
        };
        let args = [
            n.tgid as u64,
            n.tid as u64,
            addr,
            len,
            prot,
            flags,
            fd as u64,
            at,
        ];
        match inject_mmap(&args) {
            Ok(()) => Verdict::Done,
            Err(e) => refuse(e),
        }
    }

    fn answer(&self, n: &crate::supervise::Notice<'_>) -> crate::supervise::Verdict {
        use crate::supervise::{Call, Verdict};
        let ids = self.ids.get_or_init(|| {
            self.nodes
                .iter()
                .map(|k| {
                    std::fs::metadata(node_path(k))
                        .map(|m| {
                            use std::os::unix::fs::MetadataExt;
                            (m.dev(), m.ino())
                        })
                        .unwrap_or((u64::MAX, u64::MAX))
                })
                .collect()
        });
        if let Call::Stat(call) = n.call {
            return self.stat(n, &call, ids);
        }
        // A bad fd: the kernel answers EBADF itself.
        let Ok(file) = device::pull_fd(n.tgid, n.fd) else {
            return Verdict::Continue;
        };
        // The pulled file is the caller's only if the call is still live.
        if !n.valid() {
            return Verdict::Continue;
        }
        // A file that cannot be stat'ed is left to the kernel.
        let Some(id) = file_id(file.as_fd()) else {
            return Verdict::Continue;
        };
        let Some(node) = ids.iter().position(|i| *i == id).map(|i| self.nodes[i]) else {
            return self.dmabuf_mmap(n, file.as_fd(), id);
        };
        let Ok(fh) = crate::fuse::fh_of(file.as_fd()) else {
            return Verdict::Continue;
        };
        let caller = device::Caller {
            tid: n.tid,
            tgid: n.tgid,
        };
        struct Install<'a, 'b>(&'a crate::supervise::Notice<'b>);
        impl device::FdInstaller for Install<'_, '_> {
            fn install(&self, file: BorrowedFd<'_>, cloexec: bool) -> Result<u32, i32> {
                self.0.addfd(file, cloexec)
            }
        }
        let (cmd, arg) = match n.call {
            Call::Ioctl { cmd, arg } => (cmd, arg),
            Call::Stat(_) => unreachable!("answered above"),
            Call::Mmap { len, offset, .. } => {
                if node == NodeKind::Kfd {
                    return Verdict::Continue;
                }
                return match self.emu.render_mmap(fh, &caller, offset, len) {
                    Ok(()) => Verdict::Continue,
                    Err(e) => Verdict::Error(e),
                };
            }
        };
        match self.emu.fd_ioctl(fh, &caller, cmd, arg, &Install(n)) {
            None => Verdict::Continue,
            Some(Ok(())) => Verdict::Return(0),
            Some(Err(e)) => Verdict::Error(e),
        }
    }
}
