//! The dump side, in criu main.
//!
//! Order of calls (criu-rocm's patched `cr_dump_tasks`):
//! 1. [`DumpSession::pause_task`] for every task, right after the tree is
//!    frozen and before any memory is read: each KFD file the task holds is
//!    reached with `pidfd_getfd` (the same open file description, so the
//!    CRIU op acts on the task), `PROCESS_INFO` evicts its queues and
//!    `CHECKPOINT` takes the metadata at once, so the render-node files can
//!    be dumped in any order relative to the KFD file.
//! 2. [`DumpSession::dump_file`] when CRIU dumps a device fd: the KFD file
//!    writes `amdgpu-kfd-<id>.img` and the pages files; a render node
//!    writes `amdgpu-renderD-<id>.img`.
//! 3. [`DumpSession::check_complete`] once all memory is dumped.
//! 4. [`DumpSession::finish`] at the end: unpause unless the tree is about
//!    to be killed after a successful dump.  Upstream 4.2.1 unpauses as soon
//!    as the last device file is dumped, before the task's CPU memory; here
//!    the queues stay evicted until CRIU has read everything.
//!
//! Should criu main end before step 4, nothing stays paused: before the
//! first PROCESS_INFO the session starts the GPU guardian
//! ([`super::guardian`]), which unpauses whatever criu main left paused
//! when it dies (SIGKILL), and arms a handler ([`super::signals`]) that
//! unpauses everything on SIGTERM, SIGINT, SIGHUP or SIGPIPE before criu
//! main dies of it.  Every KFD process is handed to both before its
//! PROCESS_INFO and taken back once it is unpaused.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kfd_abi::handle::{Access, Kfd, Mapping, ProcessInfo};
use kfd_abi::sys;

use super::contexts::ContextProbes;
use super::dmabuf::{Claim, HeldIn, Holder, SharedBos};
use super::dmabuf_fd::{self, DmabufFd, PendingDmabufs, Resolved};
use super::guardian::Guardian;
use super::signals;
use super::{
    gpu_jobs, human_bytes, log_gpu_stats, log_incremental, owned_dmabufs, record_extents,
    HelperLog, SessionError,
};
use crate::bo;
use crate::copy::dump_contents_encoded;
use crate::env::{self, EnginePolicy};
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, RenderImage};
use crate::os::fd::{pidfd_getfd, task_fds, OpenFiles};
use crate::os::process::pidfd_open;
use crate::plan::{
    plan_dump, render_image, stat_fd, stat_path, BoBucket, CheckpointData, DeviceBucket,
    DeviceIdentities, DeviceKind, DumpPlan, GpuWork, SharedMem, HSAKMT_SEMAPHORE_FILE, HSAKMT_SHM,
};
use crate::proto::DrmBoEntry;
use crate::topology::{Topology, SYSFS_NODES};
use crate::validate::digests::{self, Digests};
use crate::validate::{self, chain};

/// Where the dump looks for things, and how it copies.
#[derive(Clone, Debug)]
pub struct DumpOptions {
    /// The KFD topology nodes directory.
    pub sysfs_nodes: PathBuf,
    /// `KFD_MAX_BUFFER_SIZE`.
    pub staging_cap: Option<u64>,
    /// `CRIU_ROCM_COPY_ENGINE`.
    pub policy: EnginePolicy,
    /// `KFD_COMPRESS`, `KFD_COMPRESS_THREADS`: zstd level and threads
    /// (`None`: one per spare core), or `None` (upstream's layout).
    pub compress: Option<(i32, Option<u32>)>,
    /// CRIU's log fd, where the GPU guardian and the signal handler write;
    /// it stays open for the whole dump.
    pub log_fd: Option<RawFd>,
    /// The boundary's settings for CRIU's log in the guardian
    /// ([`super::HelperLog::args`]).
    pub log_args: Vec<String>,
    /// `CRIU_ROCM_SIGN_KEY`: the key the completed dump is signed with.
    pub sign_key: Option<ed25519_dalek::SigningKey>,
}

impl DumpOptions {
    /// The product's paths and the environment's knobs.
    pub fn from_env() -> Result<Self, crate::Error> {
        Ok(DumpOptions {
            sysfs_nodes: PathBuf::from(SYSFS_NODES),
            staging_cap: env::max_buffer_size_from_env()?,
            policy: env::engine_policy_from_env()?,
            compress: env::compress_from_env()?,
            log_fd: None,
            log_args: Vec::new(),
            sign_key: validate::signature::sign_key_from_env()?,
        })
    }
}

/// One KFD process of the tree, paused.
struct PausedProc {
    /// The task (real pid) that holds the file we reached it through.
    task: i32,
    /// The task's fd number, for messages.
    task_fd: RawFd,
    /// Our copy of the task's KFD fd (same open file description).
    kfd: OwnedFd,
    info: ProcessInfo,
    ckpt: CheckpointData,
    /// dmabuf fds CHECKPOINT installed in our fd table, by bucket.
    dmabufs: Vec<Option<OwnedFd>>,
    /// Queues evicted and not yet unpaused.
    paused: bool,
    /// Its KFD image was written.
    dumped: bool,
    /// Its dump plan, made once ([`PausedProc::make_plan`]): by
    /// [`DumpSession::claim_kfd_early`] when a render file of the task is
    /// dumped before its KFD file, else by [`DumpSession::save`], which
    /// takes it.
    plan: Option<DumpPlan>,
    /// Its BOs were claimed before its KFD file was reached
    /// ([`DumpSession::claim_kfd_early`]): a further render file of the
    /// task claims nothing again.
    claimed_early: bool,
    /// Its BOs imported from another process' KFD BO, taken out of `ckpt`
    /// ([`super::kfd_import`]), for its image.
    imports: Vec<crate::proto::KfdImportEntry>,
    /// Further opens of /dev/kfd by the same process (task fd, our copy):
    /// one KFD process, paused once, saved once; these files only reopen.
    reopens: Vec<(RawFd, OwnedFd)>,
    /// The process' id with the guardian.
    guard_id: u32,
    /// Its slot in the signal handler's table (None: the table was full).
    slot: Option<usize>,
    /// When PROCESS_INFO was called: its queues are paused from then on.
    paused_at: Instant,
}

impl PausedProc {
    /// Its dump plan ([`plan_dump`]), made unless it was already: its
    /// CHECKPOINT data was taken once, and the tree stays frozen from the
    /// first render file to the KFD file (a pre-dump, whose tree runs
    /// again, dumps no render file and plans in [`DumpSession::save`]).
    fn make_plan(&mut self, topology: &Topology) -> Result<(), SessionError> {
        if self.plan.is_none() {
            let plan = plan_dump(topology, &self.ckpt, task_shared_mem(self.task)?)
                .map_err(|e| SessionError::core(self.task, "planning the GPU dump", e))?;
            self.plan = Some(plan);
        }
        Ok(())
    }
}

/// What [`DumpSession::dump_file`] saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dumped {
    Kfd,
    Render(RenderMinor),
    /// A dma-buf fd of a BO the dump saves.
    Dmabuf,
}

/// A render-node open file met at the pause ([`DumpSession::pause_task`]).
struct RenderFileSeen {
    minor: RenderMinor,
    /// The tasks holding it, ascending.
    pids: Vec<i32>,
    /// How many open files were met before it.
    seen: usize,
}

/// The GPU state of one `criu dump`.
pub struct DumpSession {
    opts: DumpOptions,
    devices: DeviceIdentities,
    topology: Option<Topology>,
    procs: Vec<PausedProc>,
    /// Each task's render-node fds (our copies), for CPU access to its BOs
    /// through the `drm_file` that owns them.
    render_fds: BTreeMap<i32, Vec<(RenderMinor, OwnedFd)>>,
    /// The open files of `render_fds`, each once, with the tasks that
    /// hold it.
    render_files: OpenFiles<RenderFileSeen>,
    /// Their context probes, started as they are met, by `seen`.
    contexts: ContextProbes,
    /// The open files of the paused processes' KFD fds: the process (its
    /// index in `procs`) and whether the file is one of its further opens.
    kfd_files: OpenFiles<(usize, bool)>,
    /// Started before the first pause.
    guardian: Option<Guardian>,
    /// The GPU image files written so far, for [`Self::write_digests`].
    digests: Digests,
    /// Pre-dump: how long the KFD processes' queues were paused, in all.
    pause_total: Duration,
    /// The BOs saved so far, to save one held by two files once.
    shared: SharedBos,
    /// Render images with a BO that is the same BO as one of a KFD file
    /// of their process not dumped yet: written once that file is, with
    /// its id ([`Self::write_pending`]).  (task, file id, image).
    pending: Vec<(i32, FileId, RenderImage)>,
    /// dma-buf fds whose BO's holder was not saved yet.
    dmabufs: PendingDmabufs,
}

impl DumpSession {
    /// A dump with `devices`, the identities the mappings were classified
    /// with (one probe of `/dev` serves both).
    pub fn new(opts: DumpOptions, devices: DeviceIdentities) -> Self {
        DumpSession {
            opts,
            devices,
            topology: None,
            procs: Vec::new(),
            render_fds: BTreeMap::new(),
            render_files: OpenFiles::default(),
            contexts: ContextProbes::default(),
            kfd_files: OpenFiles::default(),
            guardian: None,
            digests: Digests::default(),
            pause_total: Duration::ZERO,
            shared: SharedBos::default(),
            pending: Vec::new(),
            dmabufs: PendingDmabufs::default(),
        }
    }

    /// The guardian, started (and the signal handler armed) on first use:
    /// before anything is paused.
    fn guardian(&mut self, pid: i32) -> Result<&mut Guardian, SessionError> {
        if self.guardian.is_none() {
            let log = HelperLog {
                // SAFETY: CRIU's log fd stays open for the whole dump
                // (DumpOptions::log_fd).
                fd: self
                    .opts
                    .log_fd
                    .map(|fd| unsafe { BorrowedFd::borrow_raw(fd) }),
                args: &self.opts.log_args,
            };
            let g = Guardian::start(log).map_err(|source| SessionError::Os {
                pid,
                step: "starting the GPU guardian (it unpauses the GPU queues should criu-rocm die)"
                    .into(),
                source,
            })?;
            log::info!(
                "GPU guardian started (pid {}): it unpauses the GPU queues should criu-rocm die during the dump",
                g.pid()
            );
            signals::arm(self.opts.log_fd, g.sock().as_raw_fd()).map_err(|source| {
                SessionError::Os {
                    pid,
                    step: "installing the handler of SIGTERM, SIGINT, SIGHUP and SIGPIPE".into(),
                    source,
                }
            })?;
            self.guardian = Some(g);
        }
        Ok(self.guardian.as_mut().expect("started above"))
    }

    fn topology(&mut self, pid: i32) -> Result<&Topology, SessionError> {
        if self.topology.is_none() {
            let t = Topology::parse_sysfs(&self.opts.sysfs_nodes)
                .map_err(|e| SessionError::core(pid, "reading the KFD topology", e))?;
            self.topology = Some(t);
        }
        Ok(self.topology.as_ref().expect("parsed above"))
    }

    /// Pauses the KFD process behind every KFD file task `pid` holds, and
    /// takes its CHECKPOINT metadata; then starts the context probes of the
    /// render files met first here ([`ContextProbes`]), which run while the
    /// tree is dumped.  Returns how many KFD processes were new.
    pub fn pause_task(&mut self, pid: i32) -> Result<usize, SessionError> {
        self.pause_fds(pid, true)
    }

    /// [`Self::pause_task`]; `probe`: start the context probes (a
    /// pre-dump probes its render files after the tree runs again, and a
    /// probe beside the pause would only lengthen it).
    fn pause_fds(&mut self, pid: i32, probe: bool) -> Result<usize, SessionError> {
        self.refuse_dmabuf_mappings(pid)?;
        if self.devices.kfd.is_none() && self.devices.render_nodes.is_empty() {
            return Ok(0);
        }
        let os = |step: String| move |source| SessionError::Os { pid, step, source };
        let fds = task_fds(pid).map_err(os("listing /proc/<pid>/fd".into()))?;
        let mut pidfd = None;
        let mut new = 0;
        // The render files met first here: each one's `seen` and where our
        // copy of it is in the task's `render_fds`.
        let mut new_files = Vec::new();
        for fd in fds {
            // The task is frozen: its fd table cannot change under us, but
            // an fd CRIU cannot stat is not ours either.
            let Ok(st) = stat_path(Path::new(&format!("/proc/{pid}/fd/{fd}"))) else {
                continue;
            };
            let Some(kind) = self.devices.classify(&st) else {
                continue;
            };
            if pidfd.is_none() {
                pidfd = Some(pidfd_open(pid).map_err(os("pidfd_open".into()))?);
            }
            let pfd = pidfd.as_ref().expect("opened above").as_fd();
            let copy = pidfd_getfd(pfd, fd).map_err(os(format!("pidfd_getfd of fd {fd}")))?;
            match kind {
                DeviceKind::Render(minor) => {
                    let seen = self
                        .see_render_file(pid, minor, copy.as_fd())
                        .map_err(os(format!("kcmp of render-node fd {fd}")))?;
                    let held = self.render_fds.entry(pid).or_default();
                    new_files.extend(seen.map(|seen| (seen, held.len())));
                    held.push((minor, copy));
                }
                DeviceKind::Kfd => {
                    if self.pause_kfd(pid, fd, copy)? {
                        new += 1;
                    }
                }
            }
        }
        if probe {
            self.start_probes(pid, &new_files);
        }
        Ok(new)
    }

    /// Starts the context probes of the render files task `pid`'s walk met
    /// first (`new`: each one's `seen` and index in the task's
    /// `render_fds`), in the order `render_files` keeps them.  A probe
    /// that cannot start leaves the file to be probed at its dump.
    fn start_probes(&mut self, pid: i32, new: &[(usize, usize)]) {
        let Some(held) = self.render_fds.get(&pid) else {
            return;
        };
        let mut probes = Vec::with_capacity(new.len());
        for &(seen, i) in new {
            let fd = held[i].1.as_fd();
            match self.render_files.position(fd) {
                Ok(Some(at)) => probes.push((at, seen, fd)),
                Ok(None) => log::debug!(
                    "pid {pid}: the contexts of its render file are probed at its dump: \
                     the file is not among those met"
                ),
                Err(e) => log::debug!(
                    "pid {pid}: the contexts of its render file are probed at its dump: \
                     kcmp: {e}"
                ),
            }
        }
        probes.sort_unstable_by_key(|&(at, ..)| at);
        for (_, seen, fd) in probes {
            if let Err(e) = self.contexts.start(seen, fd) {
                log::debug!(
                    "pid {pid}: the contexts of its render file are probed at its dump: {e}"
                );
            }
        }
    }

    /// Refuses task `pid` when it holds a CPU mapping of a dma-buf (issue
    /// 29): its first, named with the dma-buf's fd and BO when the task
    /// holds an fd of it.  Runs before anything of the task is paused, so
    /// the refusal leaves it running as it was.
    fn refuse_dmabuf_mappings(&mut self, pid: i32) -> Result<(), SessionError> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|source| {
            SessionError::Os {
                pid,
                step: "reading /proc/<pid>/maps for dma-buf mappings".into(),
                source,
            }
        })?;
        let held = dmabuf_fd::dmabuf_mappings(&maps);
        let Some(m) = held.first() else {
            return Ok(());
        };
        let what = self.mapped_dmabuf(pid, m)?;
        Err(SessionError::State {
            pid,
            what: dmabuf_fd::mapping_held(&held, &what),
        })
    }

    /// What the dma-buf of mapping `m` of task `pid` is, in words: the
    /// task's fd of it and its BO ([`dmabuf_fd::identify`]), or that the
    /// task holds no fd of it.  The fd is the one of the mapping's device
    /// and inode; failing that (a mapping of another file of the same
    /// dma-buf), the one whose BO the mapping's offset falls in (amdgpu's
    /// PRIME mmap offsets a mapping by its BO's mmap offset), when one
    /// alone is.
    fn mapped_dmabuf(
        &mut self,
        pid: i32,
        m: &dmabuf_fd::DmabufMapping,
    ) -> Result<String, SessionError> {
        let os = |step: String| move |source| SessionError::Os { pid, step, source };
        let mut same_inode = None;
        let mut dmabufs = Vec::new();
        for fd in task_fds(pid).map_err(os("listing /proc/<pid>/fd".into()))? {
            let path = format!("/proc/{pid}/fd/{fd}");
            if !dmabuf_fd::links_to_dmabuf(Path::new(&path)) {
                continue;
            }
            dmabufs.push(fd);
            let Ok(st) = stat_path(Path::new(&path)) else {
                continue;
            };
            if st.st_ino == m.ino && (libc::major(st.st_dev), libc::minor(st.st_dev)) == m.dev {
                same_inode = Some(fd);
            }
        }
        if dmabufs.is_empty() {
            return Ok(format!(
                "a dma-buf (inode {}) the process holds no fd of (closed after the mmap), so \
                 not its GPU or BO either",
                m.ino
            ));
        }
        let pidfd = pidfd_open(pid).map_err(os("pidfd_open".into()))?;
        let gpus = self.host_gpus(pid)?;
        let mut found = Vec::new();
        let mut said = Vec::new();
        for fd in same_inode.map_or(dmabufs.clone(), |fd| vec![fd]) {
            let copy =
                pidfd_getfd(pidfd.as_fd(), fd).map_err(os(format!("pidfd_getfd of fd {fd}")))?;
            match dmabuf_fd::identify(copy.as_fd(), &gpus) {
                Ok((gpu, minor, offset, size)) => {
                    let bo = format!(
                        "dma-buf fd {fd} (a BO of GPU {gpu}, {}, mmap offset {offset:#x}, \
                         {size} bytes)",
                        minor.path()
                    );
                    if same_inode.is_some() || (offset..offset + size).contains(&m.offset) {
                        found.push(bo);
                    }
                }
                Err(why) => said.push(format!("fd {fd}: {why}")),
            }
        }
        Ok(match (same_inode, &found[..]) {
            (_, [one]) => one.clone(),
            (Some(fd), _) => {
                format!(
                    "dma-buf fd {fd} (not a BO of any GPU of this host: {})",
                    said.join("; ")
                )
            }
            (None, []) => {
                format!(
                "a dma-buf (inode {}, offset {:#x}) that none of the process' dma-buf fds ({}) \
                 is the file or BO of",
                m.ino,
                m.offset,
                dmabufs.iter().map(|fd| fd.to_string()).collect::<Vec<_>>().join(", ")
            )
            }
            (None, many) => format!("one of {}", many.join(", ")),
        })
    }

    /// The host's GPUs with a render node: (render minor, gpu_id).
    fn host_gpus(&mut self, pid: i32) -> Result<Vec<(RenderMinor, GpuId)>, SessionError> {
        let minors: Vec<RenderMinor> = self.devices.render_nodes.iter().map(|(m, _)| *m).collect();
        if minors.is_empty() {
            return Ok(Vec::new());
        }
        let topology = self.topology(pid)?;
        Ok(minors
            .into_iter()
            .filter_map(|m| Some((m, topology.gpu_by_render_minor(m)?.gpu_id?)))
            .collect())
    }

    /// Task `pid`'s render-node file `fd` (of `minor`) among the open
    /// files met so far: a new one (its `seen` returned), or one more
    /// holder of one.
    fn see_render_file(
        &mut self,
        pid: i32,
        minor: RenderMinor,
        fd: BorrowedFd<'_>,
    ) -> std::io::Result<Option<usize>> {
        let seen = self.render_files.len();
        let f = self.render_files.entry(fd, || RenderFileSeen {
            minor,
            pids: Vec::new(),
            seen,
        })?;
        if let Err(i) = f.pids.binary_search(&pid) {
            f.pids.insert(i, pid);
        }
        Ok((self.render_files.len() > seen).then_some(seen))
    }

    /// PROCESS_INFO + CHECKPOINT on a task's KFD file; false when that open
    /// file was reached before (an inherited or passed fd).
    fn pause_kfd(&mut self, pid: i32, fd: RawFd, copy: OwnedFd) -> Result<bool, SessionError> {
        let own = task_vpid(pid);
        let Some(copy) = self.join_known(pid, fd, copy, own)? else {
            return Ok(false);
        };
        let (guard_id, slot) = self.guard(pid, fd, &copy)?;
        let paused_at = Instant::now();
        let info = self.process_info(pid, fd, &copy, own, (guard_id, slot))?;
        // From here on the process is paused: record it first, so that
        // every later failure unpauses it.
        let at = self.procs.len();
        let kept = self.kfd_files.entry(copy.as_fd(), || (at, false)).map(drop);
        self.procs.push(PausedProc {
            task: pid,
            task_fd: fd,
            kfd: copy,
            info,
            ckpt: CheckpointData::default(),
            dmabufs: Vec::new(),
            paused: true,
            dumped: false,
            plan: None,
            claimed_early: false,
            imports: Vec::new(),
            reopens: Vec::new(),
            guard_id,
            slot,
            paused_at,
        });
        kept.map_err(|source| SessionError::Os {
            pid,
            step: format!("keeping fd {fd} (/dev/kfd) among the paused files"),
            source,
        })?;
        if info.num_bos == 0 {
            // KFD's RESTORE rejects `num_bos == 0` (criu_restore), so these
            // images could never be restored: refuse now, while the process
            // still runs (the failure path unpauses it), rather than kill it
            // after a dump that restore must refuse.
            return Err(SessionError::State {
                pid,
                what: format!(
                    "fd {fd} (/dev/kfd): the process opened it but holds no GPU buffer, \
                     and the kernel's CRIU RESTORE refuses a process without buffers; \
                     not dumping what could not be restored"
                ),
            });
        }
        let p = self.procs.last_mut().expect("pushed above");
        let (ckpt, dmabufs) =
            checkpoint(&p.kfd, &info).map_err(kfd_error(pid, fd, "CHECKPOINT"))?;
        p.ckpt = ckpt;
        p.dmabufs = dmabufs;
        Ok(true)
    }

    /// `copy` back when task `pid`'s KFD file `fd` is new to the dump;
    /// `None` when it is an open file paused before, or a further open of
    /// /dev/kfd by a process already paused (recorded to be reopened).
    fn join_known(
        &mut self,
        pid: i32,
        fd: RawFd,
        copy: OwnedFd,
        own: Option<u32>,
    ) -> Result<Option<OwnedFd>, SessionError> {
        if let Some((i, _)) = self.locate(pid, copy.as_fd())? {
            let p = &self.procs[i];
            log::debug!(
                "pid {pid}: fd {fd} is the KFD file of pid {} fd {} (already paused)",
                p.task,
                p.task_fd
            );
            return Ok(None);
        }
        // A further open of /dev/kfd by a process joins its KFD process; a
        // second PROCESS_INFO would evict its queues twice, and one UNPAUSE
        // would not bring them back.  The task's own KFD process is the one
        // whose PROCESS_INFO named the task itself.
        if let Some(i) = self
            .procs
            .iter()
            .position(|p| p.task == pid && Some(p.info.pid) == own)
        {
            let p = &mut self.procs[i];
            log::info!(
                "pid {pid}: fd {fd} is a further open of /dev/kfd (fd {} holds the state)",
                p.task_fd
            );
            self.kfd_files
                .entry(copy.as_fd(), || (i, true))
                .map_err(|source| SessionError::Os {
                    pid,
                    step: format!("keeping fd {fd} (/dev/kfd) among the paused files"),
                    source,
                })?;
            p.reopens.push((fd, copy));
            return Ok(None);
        }
        Ok(Some(copy))
    }

    /// Hands KFD file `copy` to whoever outlives a criu main that dies from
    /// here on and unpauses the process: the guardian (a copy of the file
    /// goes to it first) and, for the signals a process can catch, criu's
    /// handler.  Returns the guardian's id and the handler's slot.
    fn guard(
        &mut self,
        pid: i32,
        fd: RawFd,
        copy: &OwnedFd,
    ) -> Result<(u32, Option<usize>), SessionError> {
        let guard_id = self
            .guardian(pid)?
            .track(pid, copy.as_fd())
            .map_err(|source| SessionError::Os {
                pid,
                step: format!("fd {fd} (/dev/kfd): handing the file to the GPU guardian"),
                source,
            })?;
        let slot = signals::register(guard_id, pid, copy.as_raw_fd());
        if slot.is_none() {
            log::warn!(
                "pid {pid}: more than {} KFD processes paused; should criu-rocm be stopped by a \
                 signal, this one is left to the GPU guardian",
                signals::SLOTS
            );
        }
        Ok((guard_id, slot))
    }

    /// PROCESS_INFO, which pauses the queues; on failure takes the file
    /// back from the guardians (its id with the guardian, its slot in the
    /// handler).
    fn process_info(
        &mut self,
        pid: i32,
        fd: RawFd,
        copy: &OwnedFd,
        own: Option<u32>,
        (guard_id, slot): (u32, Option<usize>),
    ) -> Result<ProcessInfo, SessionError> {
        let guardian = self.guardian(pid)?;
        let info = match Kfd::from_fd(copy.as_fd()).criu_process_info() {
            Ok(info) => info,
            Err(e) => {
                // KFD puts the queues back itself when PROCESS_INFO fails.
                if let Some(slot) = slot {
                    signals::unregister(slot);
                }
                let _ = guardian.untrack(guard_id);
                return Err(kfd_error(pid, fd, "pausing the GPU queues")(e));
            }
        };
        if own != Some(info.pid) {
            // A file inherited from another process of the tree: KFD takes
            // the guardian's op only from the ptracer of the process' leader.
            if let Some(owner) = real_pid_of(info.pid, pid) {
                let _ = guardian.owner(guard_id, owner);
            }
        }
        log::info!(
            "pid {pid}: GPU queues paused: {} GPU(s), {} BO(s), {} queue/event object(s), {} of kernel data",
            info.num_devices,
            info.num_bos,
            info.num_objects,
            human_bytes(info.priv_data_size)
        );
        Ok(info)
    }

    /// Dumps a device file or dma-buf CRIU found in the tree (our copy
    /// `fd`, CRIU file id `id`, fd `owner.1` of task `owner.0`) into `dir`.
    /// `None`: not a GPU file.  The task holding a device file is the one
    /// whose file, reached at the pause, is the same open file.
    pub fn dump_file(
        &mut self,
        fd: BorrowedFd<'_>,
        id: FileId,
        owner: (i32, RawFd),
        dir: &Path,
    ) -> Result<Option<Dumped>, SessionError> {
        let st = stat_fd(fd).map_err(|source| SessionError::Os {
            pid: owner.0,
            step: format!("fstat of file {id} (fd {}) to dump", owner.1),
            source,
        })?;
        let dumped = match self.devices.classify(&st) {
            None if dmabuf_fd::is_dmabuf(fd) => {
                self.dump_dmabuf(fd, id, owner)?;
                Dumped::Dmabuf
            }
            None => return Ok(None),
            Some(DeviceKind::Kfd) => {
                self.dump_kfd(fd, id, dir)?;
                Dumped::Kfd
            }
            Some(DeviceKind::Render(minor)) => {
                let (pid, seen) = self.render_owner(fd, id)?;
                let contexts = self.contexts.take(seen);
                self.dump_render(pid, fd, (minor, contexts), id, dir)?;
                Dumped::Render(minor)
            }
        };
        self.write_dmabufs(dir)?;
        Ok(Some(dumped))
    }

    /// A dma-buf fd: which BO of which GPU it is ([`dmabuf_fd::identify`]),
    /// kept until the file that holds the BO is saved.
    fn dump_dmabuf(
        &mut self,
        fd: BorrowedFd<'_>,
        id: FileId,
        (pid, task_fd): (i32, RawFd),
    ) -> Result<(), SessionError> {
        let gpus = self.host_gpus(pid)?;
        let (gpu, minor, offset, size) =
            dmabuf_fd::identify(fd, &gpus).map_err(|said| SessionError::State {
                pid,
                what: dmabuf_fd::foreign(task_fd, id, &said),
            })?;
        let flags = dmabuf_fd::file_flags(fd).map_err(|source| SessionError::Os {
            pid,
            step: format!("F_GETFL of dma-buf fd {task_fd}"),
            source,
        })?;
        self.dmabufs.push(DmabufFd {
            pid,
            task_fd,
            id,
            gpu,
            minor,
            offset,
            size,
            flags,
        });
        Ok(())
    }

    /// The dma-buf images whose BO's holder is saved now, written; a
    /// dma-buf that cannot be saved fails the dump.
    fn write_dmabufs(&mut self, dir: &Path) -> Result<(), SessionError> {
        let procs = &self.procs;
        let user_of = |pid: i32, actual: GpuId| {
            procs
                .iter()
                .filter(|p| p.task == pid)
                .flat_map(|p| p.ckpt.devices.iter())
                .find(|d| d.actual == actual)
                .map_or(actual, |d| d.user)
        };
        for r in self.dmabufs.resolve(&self.shared, user_of) {
            match r {
                Resolved::Refused(pid, what) => return Err(SessionError::State { pid, what }),
                Resolved::Image(id, img) => {
                    img.write(dir, id).map_err(|e| {
                        SessionError::core(0, format!("writing the image of dma-buf file {id}"), e)
                    })?;
                    self.digests
                        .add_whole(crate::image::dmabuf_image_name(id), &img.encode());
                }
            }
        }
        Ok(())
    }

    /// The task whose render-node fd, reached at the pause, is the open file
    /// `fd`: one with a KFD process if several share it (inherited fds);
    /// and the file's `seen`.
    fn render_owner(&self, fd: BorrowedFd<'_>, id: FileId) -> Result<(i32, usize), SessionError> {
        let file = self
            .render_files
            .get(fd)
            .map_err(|source| SessionError::Os {
                pid: 0,
                step: format!("kcmp of render-node file {id}"),
                source,
            })?;
        let holders = file.map(|f| f.pids.as_slice()).unwrap_or_default();
        let seen = file.map_or(usize::MAX, |f| f.seen);
        holders
            .iter()
            .copied()
            .find(|&pid| self.procs.iter().any(|p| p.task == pid))
            .or_else(|| holders.first().copied())
            .map(|pid| (pid, seen))
            .ok_or_else(|| SessionError::State {
                pid: 0,
                what: format!(
                    "render-node file {id} was not open in any task when the tree was frozen"
                ),
            })
    }

    /// The paused process behind a KFD file, and whether the file is one
    /// of its further opens; `None` for a file not seen yet.
    fn locate(&self, pid: i32, fd: BorrowedFd<'_>) -> Result<Option<(usize, bool)>, SessionError> {
        let found = self.kfd_files.get(fd).map_err(|source| SessionError::Os {
            pid,
            step: "kcmp of KFD files".into(),
            source,
        })?;
        Ok(found.copied())
    }

    /// [`Self::locate`] for a file that must have been seen at the pause.
    fn find_proc(&self, fd: BorrowedFd<'_>, id: FileId) -> Result<(usize, bool), SessionError> {
        if let Some(found) = self.locate(0, fd)? {
            return Ok(found);
        }
        Err(SessionError::State {
            pid: 0,
            what: format!(
                "/dev/kfd file {id} was not open in any task when the tree was frozen \
                 (its queues were never paused); refusing to save it"
            ),
        })
    }

    fn dump_kfd(&mut self, fd: BorrowedFd<'_>, id: FileId, dir: &Path) -> Result<(), SessionError> {
        let (i, reopen) = self.find_proc(fd, id)?;
        let pid = self.procs[i].task;
        let topology = self.topology(pid)?.clone();
        let p = &self.procs[i];
        let owner = p.task;
        if reopen {
            // The state is saved with the process' first KFD file; this one
            // records the process, to be reopened at restore.
            let plan = plan_dump(&topology, &p.ckpt, SharedMem::default())
                .map_err(|e| SessionError::core(owner, "planning the GPU dump", e))?;
            let mut image = plan
                .finish_image(&BTreeMap::new(), crate::pages::Encoding::Raw)
                .map_err(|e| SessionError::core(owner, "building the KFD image", e))?;
            image.msg.criu_rocm_reopen = Some(true);
            image
                .write(dir, id)
                .map_err(|e| SessionError::core(owner, "writing the KFD image", e))?;
            self.digests.add_kfd(id, &image);
            log::info!("pid {owner}: KFD file {id} saved as a further open of /dev/kfd");
            return Ok(());
        }
        if p.dumped {
            return Err(SessionError::State {
                pid,
                what: format!("the KFD file of pid {owner} was dumped twice"),
            });
        }
        self.save(i, id, dir, &topology, false)
    }

    /// Saves KFD process `i` (its metadata from CHECKPOINT, its memory read
    /// now) as KFD file `id` in `dir`; `live`: the process runs meanwhile
    /// (a pre-dump), so its BOs are read through a snapshot of each slice
    /// (see [`crate::copy::cpu::CpuEngine::live`]).
    fn save(
        &mut self,
        i: usize,
        id: FileId,
        dir: &Path,
        topology: &Topology,
        live: bool,
    ) -> Result<(), SessionError> {
        let owner = self.procs[i].task;
        let start = Instant::now();
        self.shared.set_file(owner, id);
        self.claim_kfd(i, Some(id), topology)?;
        let plan = self.procs[i].plan.take().expect("made by claim_kfd");
        let p = &self.procs[i];
        let owners = render_owners(owner, &plan, &p.ckpt, self.render_fds.get(&owner));
        let render_fd =
            |minor: RenderMinor| -> Option<BorrowedFd<'_>> { owners.get(&minor).copied() };
        let dmabufs: Vec<Option<BorrowedFd<'_>>> = p
            .dmabufs
            .iter()
            .map(|d| d.as_ref().map(|f| f.as_fd()))
            .collect();
        let mut jobs = gpu_jobs(
            owner,
            self.opts.policy,
            self.opts.staging_cap,
            &plan.gpus,
            &p.ckpt.bos,
            render_fd,
            &dmabufs,
            false,
        )?;
        if live {
            jobs.iter_mut().for_each(|j| j.engines.set_live());
        }
        // Incremental: the same BOs in the parent images (--prev-images-dir),
        // whose unchanged extents this dump leaves out (a hole at its place,
        // or a zero chunk record in a compressed pages file), whether the
        // parent's pages are compressed or not.
        let parent = chain::dump_parent(dir, plan.image.pid);
        let (parent_digests, parent_bos) = match &parent {
            Some((_, img)) => chain::parent_digests(&plan.image.bo_entries, img),
            None => Default::default(),
        };
        let out = dump_contents_encoded(dir, id, jobs, self.opts.compress, &parent_digests)
            .map_err(|e| SessionError::core(owner, "saving GPU memory", e))?;
        let mut image = plan
            .finish_image(&out.hashes, out.encoding)
            .map_err(|e| SessionError::core(owner, "building the KFD image", e))?;
        image.msg.criu_rocm_imports = p.imports.clone();
        let kept = record_extents(&mut image.msg.bo_entries, &out, &parent_bos);
        if let Some((name, _)) = &parent {
            if !out.inherited.is_empty() {
                image.msg.criu_rocm_parent = Some(name.clone());
            }
            log_incremental(&format!("pid {owner}"), name, &out, kept, parent_bos.len());
        }
        image
            .write(dir, id)
            .map_err(|e| SessionError::core(owner, "writing the KFD image", e))?;
        self.digests.add_kfd_in(dir, id, &image);
        log_gpu_stats(owner, "saved", &out.stats);
        log::info!(
            "pid {owner}: KFD file {id}: {} GPU(s), {} BO(s), {} of GPU memory, {} object(s) saved in {:.1} ms",
            p.info.num_devices,
            p.info.num_bos,
            human_bytes(out.stats.iter().map(|s| s.bytes).sum()),
            p.info.num_objects,
            start.elapsed().as_secs_f64() * 1e3
        );
        self.procs[i].dumped = true;
        self.write_pending(owner, id, dir)
    }

    /// The render images of `pid` that waited for its KFD file `id`
    /// ([`Self::pending`]): their links to it completed, written.
    fn write_pending(&mut self, pid: i32, id: FileId, dir: &Path) -> Result<(), SessionError> {
        let (mine, rest) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(p, _, _)| *p == pid);
        self.pending = rest;
        for (_, rid, mut img) in mine {
            for b in &mut img.msg.bo_entries {
                if b.same_bo_index.is_some() && b.same_bo_file.is_none() {
                    b.same_bo_file = Some(id.0);
                }
            }
            self.write_render(pid, rid, &img, dir)?;
        }
        Ok(())
    }

    fn write_render(
        &mut self,
        pid: i32,
        id: FileId,
        img: &RenderImage,
        dir: &Path,
    ) -> Result<(), SessionError> {
        img.write(dir, id)
            .map_err(|e| SessionError::core(pid, "writing the render-node image", e))?;
        self.digests.add_render_in(dir, id, img);
        Ok(())
    }

    /// A new render image `id` of `pid`'s render file on `minor` (user ids
    /// of the task's KFD processes; a render fd without one keeps the host
    /// id), its host GPU and the copy settings (`live`: a pre-dump).
    fn render_setup(
        &mut self,
        pid: i32,
        minor: RenderMinor,
        id: FileId,
        live: bool,
    ) -> Result<(Topology, RenderImage, GpuId, super::gem::Copying), SessionError> {
        let topology = self.topology(pid)?.clone();
        let actual_to_user: BTreeMap<GpuId, GpuId> = self
            .procs
            .iter()
            .filter(|p| p.task == pid)
            .flat_map(|p| p.ckpt.devices.iter().map(|d| (d.actual, d.user)))
            .collect();
        let img = render_image(&topology, &actual_to_user, minor, id)
            .map_err(|e| SessionError::core(pid, minor.path(), e))?;
        let actual = super::gem::host_gpu(&topology, minor, &img);
        let copying = super::gem::Copying {
            policy: self.opts.policy,
            staging_cap: self.opts.staging_cap,
            compress: self.opts.compress,
            live,
        };
        Ok((topology, img, actual, copying))
    }

    /// Pre-dump, the tree running again: the GEM BOs of every render file
    /// met by [`Self::pre_dump_task`] (each open file once), read while
    /// the process runs, as render images numbered from
    /// [`PRE_DUMP_RENDER_IDS`] (above any pid, which names the KFD images),
    /// which the next dump finds by task and render node.  A BO another
    /// file saved already (every KFD file is saved before them, as
    /// `<its pid>`) is recorded as that file's, as a dump records it
    /// ([`Self::link_render`]): its bytes are saved once.
    fn pre_dump_render(&mut self, dir: &Path) -> Result<(), SessionError> {
        let files = self.distinct_render_files()?;
        let mut id = PRE_DUMP_RENDER_IDS;
        for (pid, minor, fd) in files {
            let (_, mut img, actual, copying) = self.render_setup(pid, minor, FileId(id), true)?;
            let at = (minor, FileId(id), actual);
            let mut link = |bos: &mut [DrmBoEntry]| self.link_render(pid, at, bos);
            // No probe was started at a pre-dump's pause (Self::pause_fds).
            let checks = (None, &mut link as &mut super::gem::Link<'_>);
            super::gem::save(pid, fd.as_fd(), at, &mut img, dir, copying, checks)?;
            if img.has_gem_bos() {
                self.write_render(pid, FileId(id), &img, dir)?;
                id += 1;
            }
        }
        Ok(())
    }

    /// The render files met by [`Self::pause_task`], each open file once
    /// (a file inherited or dup'ed is held at several fds), by first task
    /// and the order they were met in: its first task, render minor and a
    /// dup.
    fn distinct_render_files(&self) -> Result<Vec<(i32, RenderMinor, OwnedFd)>, SessionError> {
        let mut files: Vec<_> = self
            .render_files
            .iter()
            .filter_map(|(fd, f)| Some((f.pids.first().copied()?, f.seen, f.minor, fd)))
            .collect();
        files.sort_by_key(|&(pid, seen, ..)| (pid, seen));
        files
            .into_iter()
            .map(|(pid, _, minor, fd)| {
                let copy = fd.try_clone_to_owned().map_err(|source| SessionError::Os {
                    pid,
                    step: "dup of a render-node file".into(),
                    source,
                })?;
                Ok((pid, minor, copy))
            })
            .collect()
    }

    /// Before a render file of `pid` is saved: the BOs of its KFD
    /// processes not dumped yet claimed, so that a BO the render file
    /// imported from KFD is recorded as the KFD BO ([`SharedBos`]).
    /// Each KFD process is planned once and claimed once, however many
    /// render files the task holds: its plan is kept for [`Self::save`].
    fn claim_kfd_early(&mut self, pid: i32, topology: &Topology) -> Result<(), SessionError> {
        let early: Vec<usize> = (0..self.procs.len())
            .filter(|&i| {
                let p = &self.procs[i];
                p.task == pid && !p.dumped && !p.claimed_early
            })
            .collect();
        for i in early {
            self.claim_kfd(i, None, topology)?;
            self.procs[i].claimed_early = true;
        }
        Ok(())
    }

    /// The KFD BOs of process `i` (of KFD file `file`; `None`: not reached
    /// yet) claimed, its plan made: the ones that are another process' KFD
    /// BO (HIP IPC's imports) are taken out of its CHECKPOINT data and
    /// recorded as imports ([`super::kfd_import::take_imports`]), and the
    /// plan made again without them.
    fn claim_kfd(
        &mut self,
        i: usize,
        file: Option<FileId>,
        topology: &Topology,
    ) -> Result<(), SessionError> {
        self.procs[i].make_plan(topology)?;
        let p = &self.procs[i];
        let owner = p.task;
        let plan = p.plan.as_ref().expect("made above");
        let held = kfd_holders(owner, (p.task_fd, file), &plan.gpus, &p.ckpt.bos);
        let claims = self.claim(owner, held.iter().copied())?;
        let imports: BTreeMap<usize, Holder> = held
            .iter()
            .zip(claims)
            .filter_map(|((_, _, h), c)| match c {
                Claim::Same(first) => Some((h.index as usize, first)),
                Claim::First => None,
            })
            .collect();
        if imports.is_empty() {
            return Ok(());
        }
        let p = &mut self.procs[i];
        let taken = super::kfd_import::take_imports(owner, &mut p.ckpt, &mut p.dmabufs, &imports)?;
        for (b, first) in taken.iter().zip(imports.values()) {
            log::info!(
                "pid {owner}: /dev/kfd BO at GPU VA {:#x} (handle {}): the same BO as {first} \
                 (saved once, imported again at restore)",
                b.addr,
                kfd_abi::ids::BoHandle::new(GpuId(b.gpu_id), b.idr_handle)
            );
        }
        p.imports.extend(taken);
        p.plan = None;
        p.make_plan(topology)?;
        self.shared
            .reindex_kfd(owner, &imports.keys().copied().collect());
        Ok(())
    }

    /// The render image of file `fd`, with the GEM BOs it holds
    /// ([`super::gem::save`]).
    fn dump_render(
        &mut self,
        pid: i32,
        fd: BorrowedFd<'_>,
        (minor, contexts): (RenderMinor, Option<Vec<u32>>),
        id: FileId,
        dir: &Path,
    ) -> Result<(), SessionError> {
        let (topology, mut img, actual, copying) = self.render_setup(pid, minor, id, false)?;
        self.claim_kfd_early(pid, &topology)?;
        let mut link = |bos: &mut [DrmBoEntry]| self.link_render(pid, (minor, id, actual), bos);
        super::gem::save(
            pid,
            fd,
            (minor, id, actual),
            &mut img,
            dir,
            copying,
            (contexts, &mut link),
        )?;
        let waits = img
            .msg
            .bo_entries
            .iter()
            .any(|b| b.same_bo_index.is_some() && b.same_bo_file.is_none());
        if waits {
            log::info!(
                "pid {pid}: render node {} (file {id}) holds a BO of a KFD file not dumped yet: \
                 its image is written with that file's",
                minor.path()
            );
            self.pending.push((pid, id, img));
            return Ok(());
        }
        self.write_render(pid, id, &img, dir)?;
        log::info!(
            "pid {pid}: render node {} saved as GPU {}",
            minor.path(),
            img.gpu_id()
        );
        Ok(())
    }

    /// The BOs of a file `pid` holds, claimed ([`SharedBos`]): refused
    /// where they cannot be saved as one BO with another file's.
    fn claim(
        &mut self,
        pid: i32,
        held: impl IntoIterator<Item = (GpuId, u64, Holder)>,
    ) -> Result<Vec<Claim>, SessionError> {
        self.shared
            .claim_all(held)
            .map_err(|e| SessionError::State {
                pid,
                what: e.to_string(),
            })
    }

    /// The GEM BOs `bos` of render file `id` claimed: one another file
    /// saved already is recorded as that file's BO (criu-dev's `is_import`,
    /// our `same_bo_file`/`same_bo_index`, and `same_bo_pid` when that file
    /// is another process'; no bytes saved).
    fn link_render(
        &mut self,
        pid: i32,
        (minor, id, actual): (RenderMinor, FileId, GpuId),
        bos: &mut [DrmBoEntry],
    ) -> Result<(), SessionError> {
        let held = bos.iter().enumerate().map(|(i, b)| {
            let holder = Holder {
                pid,
                file: Some(id),
                index: i as u32,
                size: b.size,
                held_in: HeldIn::Render {
                    minor,
                    handle: b.handle,
                },
            };
            (actual, b.offset, holder)
        });
        let held: Vec<_> = held.collect();
        let claims = self.claim(pid, held)?;
        for (b, c) in bos.iter_mut().zip(claims) {
            if let Claim::Same(first) = c {
                log::info!(
                    "pid {pid}: render node {} (file {id}), GEM handle {}: the same BO as {first} \
                     (saved once, restored by importing it)",
                    minor.path(),
                    b.handle
                );
                b.is_import = 1;
                b.same_bo_file = first.file.map(|f| f.0);
                b.same_bo_index = Some(first.index);
                b.same_bo_pid = (first.pid != pid).then_some(first.pid as u32);
            }
        }
        Ok(())
    }

    /// Once every image is written: records the size and digest of every
    /// GPU image file this dump wrote in `dir` ([`digests::FILE`]), which
    /// the restore and `gpu-check` check before anything else.  Nothing is
    /// written when the dump saved no GPU file.
    pub fn write_digests(&self, dir: &Path) -> Result<(), crate::image::ImageError> {
        if self.digests.files.is_empty() {
            return Ok(());
        }
        let path = dir.join(digests::FILE);
        let file = path.display().to_string();
        let io = |op, source| crate::image::ImageError::Io {
            file: file.clone(),
            op,
            source,
        };
        let mut f = crate::image::create_image(&path).map_err(|e| io("create", e))?;
        std::io::Write::write_all(&mut f, &self.digests.encode()).map_err(|e| io("write", e))
    }

    /// Once every image is written (CRIU's included) and before the tree
    /// is killed or resumed: the validation that the restore and
    /// `gpu-check` run on `dir` ([`validate::check_dir`], without reading
    /// the BO contents: the dump hashed them as it wrote them).  `Err`:
    /// every refusal, one a line, each naming its file, field and limit;
    /// the dump must then fail, so that the tree keeps running.
    pub fn verify_images(&self, dir: &Path) -> Result<(), String> {
        let started = Instant::now();
        // Streamed images: the staging directory holds the metadata files
        // (the pages files went into the stream as they were written).
        let depth = match crate::stream::active() {
            Some(_) => validate::Depth::Streamed,
            None => validate::Depth::Metadata,
        };
        let report =
            validate::check_dir(dir, depth).map_err(|e| format!("{}: {e}", dir.display()))?;
        let refusals: Vec<String> = report.refusals().map(|r| r.to_string()).collect();
        // A dump without GPU state says nothing (its log has no GPU line).
        if report.has_gpu_state {
            log::info!(
                "validated the images as their restore will in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        if refusals.is_empty() {
            Ok(())
        } else {
            Err(refusals.join("\n"))
        }
    }

    /// Signs the image files of `dir` when `CRIU_ROCM_SIGN_KEY` named a
    /// key (after [`Self::verify_images`]: only images their restore
    /// accepts are signed).
    pub fn sign_images(&self, dir: &Path) -> Result<(), String> {
        let Some(key) = &self.opts.sign_key else {
            return Ok(());
        };
        let started = Instant::now();
        let (files, bytes) = validate::signature::sign(dir, key).map_err(|e| {
            format!(
                "{}: signing the images ({}): {e}",
                dir.display(),
                validate::signature::FILE
            )
        })?;
        // The digest a restore can require (CRIU_ROCM_VERIFY_SIGNATURE):
        // these images and no other dump signed with the key.
        log::info!(
            "signed {files} image files ({}) with {} in {:.1} ms: {} {}",
            human_bytes(bytes),
            validate::signature::key_name(&key.verifying_key()),
            started.elapsed().as_secs_f64() * 1e3,
            validate::signature::VERIFY_SIGNATURE_VAR,
            validate::signature::signature_digest(dir).unwrap_or_default()
        );
        Ok(())
    }

    /// After all memory is dumped: every paused KFD process must have been
    /// saved.
    pub fn check_complete(&self) -> Result<(), SessionError> {
        if let Some(d) = self.dmabufs.first() {
            return Err(SessionError::State {
                pid: d.pid,
                what: dmabuf_fd::unheld(d),
            });
        }
        if let Some((pid, id, _)) = self.pending.first() {
            return Err(SessionError::State {
                pid: *pid,
                what: format!(
                    "render-node file {id} holds a BO of a KFD file of its process that was \
                     never dumped; its image was not written"
                ),
            });
        }
        match self.procs.iter().find(|p| !p.dumped) {
            None => Ok(()),
            Some(p) => Err(SessionError::State {
                pid: p.task,
                what: format!(
                    "the KFD process behind fd {} was paused but its file was never dumped",
                    p.task_fd
                ),
            }),
        }
    }

    /// Ends the dump.  `resume`: the tree will run again (failure,
    /// `--leave-running`, `--leave-stopped`), so every paused KFD process is
    /// unpaused; otherwise they stay paused until CRIU kills them.  Returns
    /// the number of processes that could not be unpaused (each logged).
    pub fn finish(&mut self, resume: bool) -> usize {
        let mut failed = 0;
        for i in 0..self.procs.len() {
            if !resume || !self.procs[i].paused {
                continue;
            }
            match self.unpause(i) {
                Ok(_) => log::info!("pid {}: GPU queues unpaused", self.procs[i].task),
                Err(e) => {
                    failed += 1;
                    log::error!("{e}; its GPU work stays stopped");
                }
            }
        }
        self.release(resume);
        failed
    }

    /// UNPAUSE of KFD process `i`, which is then no longer the guardian's
    /// nor the signal handler's; how long its queues were paused.
    fn unpause(&mut self, i: usize) -> Result<Duration, SessionError> {
        let p = &mut self.procs[i];
        Kfd::from_fd(p.kfd.as_fd())
            .criu_unpause()
            .map_err(|source| SessionError::Kfd {
                pid: p.task,
                step: format!("fd {} (/dev/kfd): unpausing the GPU queues", p.task_fd),
                source,
            })?;
        let paused = p.paused_at.elapsed();
        p.paused = false;
        if let Some(slot) = p.slot.take() {
            signals::unregister(slot);
        }
        if let Some(g) = &self.guardian {
            let _ = g.untrack(p.guard_id);
        }
        Ok(paused)
    }

    /// Pre-dump, task `pid` frozen and seized: each KFD process behind its
    /// KFD files is paused only to take its buffer list and kernel state
    /// (PROCESS_INFO, CHECKPOINT) and unpaused at once; its memory is read
    /// later, while it runs ([`Self::pre_dump_memory`]).  A pre-dump needs
    /// no consistent copy: the dump after it reads everything again while
    /// frozen and keeps from the pre-dump only the extents whose content
    /// hashes are unchanged.  Returns how many KFD processes were new.
    pub fn pre_dump_task(&mut self, pid: i32) -> Result<usize, SessionError> {
        let first = self.procs.len();
        let new = self.pause_fds(pid, false)?;
        for i in first..self.procs.len() {
            let paused = self.unpause(i)?;
            log::info!(
                "pid {pid}: GPU queues unpaused after {:.3} ms paused (PROCESS_INFO to UNPAUSE); \
                 the pre-dump reads the GPU memory while the process runs",
                paused.as_secs_f64() * 1e3
            );
            self.pause_total += paused;
        }
        Ok(new)
    }

    /// Pre-dump, the tree running again: saves every KFD process met by
    /// [`Self::pre_dump_task`] into `dir` as KFD file `<its pid>` (the pid
    /// KFD reports, which the next dump looks its parent images up by).
    pub fn pre_dump_memory(&mut self, dir: &Path) -> Result<(), SessionError> {
        let mut ids = BTreeMap::new();
        for i in 0..self.procs.len() {
            let p = &self.procs[i];
            let id = FileId(p.info.pid);
            if let Some(other) = ids.insert(id, p.task) {
                return Err(SessionError::State {
                    pid: p.task,
                    what: format!(
                        "tasks {other} and {} both hold a KFD process of pid {} (in different \
                         pid namespaces); a GPU pre-dump names its images by that pid and \
                         cannot save both",
                        p.task, p.info.pid
                    ),
                });
            }
            let topology = self.topology(p.task)?.clone();
            self.save(i, id, dir, &topology, true)?;
        }
        self.pre_dump_render(dir)?;
        if !self.procs.is_empty() {
            log::info!(
                "GPU pre-dump: {} KFD process(es) saved; their queues were paused {:.3} ms in all",
                self.procs.len(),
                self.pause_total.as_secs_f64() * 1e3
            );
        }
        Ok(())
    }

    /// Closes the files and ends the guardian: on `resume` criu unpaused
    /// what it could (it reported the rest), so the guardian stops;
    /// otherwise CRIU kills the tree next, and the guardian stays until the
    /// processes are gone, in case criu main dies first.
    fn release(&mut self, resume: bool) {
        signals::disarm();
        if let Some(g) = self.guardian.take() {
            let pid = g.pid();
            let r = if resume { g.stop() } else { g.leave_to_kill() };
            if let Err(e) = r {
                log::warn!(
                    "the GPU guardian (pid {pid}) could not be told that the dump ended: {e}"
                );
            }
        }
        self.procs.clear();
        self.kfd_files.clear();
        self.render_fds.clear();
        self.render_files.clear();
        self.contexts.clear();
    }
}

impl Drop for DumpSession {
    fn drop(&mut self) {
        if self.guardian.is_some() {
            // Never finished: the signal handler's fds are about to close;
            // the guardian, told nothing, unpauses what is left.
            signals::disarm();
        }
    }
}

/// The first file id of a pre-dump's render images: above any pid (2^22),
/// the ids of its KFD images.
const PRE_DUMP_RENDER_IDS: u32 = 1 << 30;

/// The pid of task `pid` in its own pid namespace (the last `NSpid:`
/// entry), which is what KFD's PROCESS_INFO reports.
fn task_vpid(pid: i32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Our pid of the process whose pid is `vpid` in the pid namespace of task
/// `like` (a process of the same tree).
fn real_pid_of(vpid: u32, like: i32) -> Option<i32> {
    let ns = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let want = ns(like)?;
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let p: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        (task_vpid(p) == Some(vpid) && ns(p).as_ref() == Some(&want)).then_some(p)
    })
}

/// The VRAM and GTT BOs of KFD process `owner` (its file is the task's fd
/// `task_fd`) with their host GPU and mmap offset, for [`SharedBos`].
fn kfd_holders(
    owner: i32,
    (task_fd, file): (RawFd, Option<FileId>),
    gpus: &[GpuWork],
    bos: &[BoBucket],
) -> Vec<(GpuId, u64, Holder)> {
    gpus.iter()
        .flat_map(|w| w.bos.iter().map(move |&i| (w.actual, i)))
        .filter_map(|(gpu, i)| {
            let b = bos.get(i)?;
            let holder = Holder {
                pid: owner,
                file,
                index: i as u32,
                size: b.size,
                held_in: HeldIn::Kfd {
                    task_fd,
                    va: b.addr.0,
                },
            };
            Some((gpu, b.offset.0, holder))
        })
        .collect()
}

/// The BO buckets handed to CHECKPOINT.  KFD writes `dmabuf_fd` only in
/// the buckets it fills (and kernels before KFD 1.8 only for VRAM/GTT BOs):
/// every bucket starts with the invalid marker, as upstream's plugin's do,
/// so a bucket left unwritten never names an fd of ours (0 would be criu's
/// own stdin).
fn checkpoint_buckets(n: usize) -> Vec<sys::kfd_criu_bo_bucket> {
    vec![
        sys::kfd_criu_bo_bucket {
            dmabuf_fd: bo::KFD_INVALID_FD,
            ..Default::default()
        };
        n
    ]
}

/// The error of a KFD ioctl on task `pid`'s fd `fd` at `step`.
fn kfd_error(
    pid: i32,
    fd: RawFd,
    step: &str,
) -> impl FnOnce(kfd_abi::handle::Error) -> SessionError {
    let step = format!("fd {fd} (/dev/kfd): {step}");
    move |source| SessionError::Kfd { pid, step, source }
}

/// CHECKPOINT with buffers sized from PROCESS_INFO.
fn checkpoint(
    kfd: &OwnedFd,
    info: &ProcessInfo,
) -> Result<(CheckpointData, Vec<Option<OwnedFd>>), kfd_abi::handle::Error> {
    let mut devices = vec![sys::kfd_criu_device_bucket::default(); info.num_devices as usize];
    let mut bos = checkpoint_buckets(info.num_bos as usize);
    let size = usize::try_from(info.priv_data_size)
        .map_err(|_| kfd_abi::handle::Error::new("AMDKFD_IOC_CRIU_OP(CHECKPOINT)", libc::E2BIG))?;
    let mut priv_data = vec![0u8; size];
    Kfd::from_fd(kfd.as_fd()).criu_checkpoint(
        info.num_objects,
        &mut devices,
        &mut bos,
        &mut priv_data,
    )?;
    let dmabufs = owned_dmabufs(&bos);
    let ckpt = CheckpointData {
        pid: info.pid,
        devices: devices
            .iter()
            .map(|d| DeviceBucket {
                user: GpuId(d.user_gpu_id),
                actual: GpuId(d.actual_gpu_id),
            })
            .collect(),
        bos: bos
            .iter()
            .map(|b| BoBucket {
                addr: GpuVa(b.addr),
                size: b.size,
                offset: MmapOffset(b.offset),
                restored_offset: MmapOffset(0),
                gpu_id: GpuId(b.gpu_id),
                alloc_flags: b.alloc_flags,
                dmabuf_fd: bo::KFD_INVALID_FD,
            })
            .collect(),
        num_objects: info.num_objects,
        priv_data,
    };
    Ok((ckpt, dmabufs))
}

/// The thunk's shared memory as task `owner` sees it (through its mount
/// namespace).
fn task_shared_mem(owner: i32) -> Result<SharedMem, SessionError> {
    let root = format!("/proc/{owner}/root");
    SharedMem::probe(
        Path::new(&format!("{root}{HSAKMT_SHM}")),
        Path::new(&format!("{root}{HSAKMT_SEMAPHORE_FILE}")),
    )
    .map_err(|source| SessionError::Os {
        pid: owner,
        step: format!("reading {HSAKMT_SHM}"),
        source,
    })
}

/// For each GPU of the plan, the render-node file of task `owner` through
/// which the CPU maps its BOs.
///
/// The CPU maps a BO through the render-node file that owns it: the file
/// the task gave to ACQUIRE_VM (`drm_vma_node_allow` admits only that one;
/// `drm_gem_mmap` answers EACCES for any other, so a file of our own would
/// not do), or else through its dmabuf.  A task may hold several files of
/// one node (Mesa, VA-API); the owner is the one whose mapping the kernel
/// admits.
fn render_owners<'f>(
    owner: i32,
    plan: &DumpPlan,
    ckpt: &CheckpointData,
    task_render: Option<&'f Vec<(RenderMinor, OwnedFd)>>,
) -> BTreeMap<RenderMinor, BorrowedFd<'f>> {
    let mut owners = BTreeMap::new();
    for w in &plan.gpus {
        let Some(b) = w.bos.first().and_then(|&i| ckpt.bos.get(i)) else {
            continue;
        };
        let candidates = task_render
            .into_iter()
            .flatten()
            .filter(|(m, _)| *m == w.render_minor)
            .map(|(_, f)| f.as_fd());
        match owning_file(candidates, b.offset) {
            Some(fd) => {
                owners.insert(w.render_minor, fd);
            }
            None => log::warn!(
                "pid {owner}: GPU {}: no render-node file of the task owns its BOs \
                 (none of its {} files admits a mapping of BO at offset {}); the CPU \
                 can copy only BOs with a dmabuf",
                w.user,
                w.render_minor.path(),
                b.offset
            ),
        }
    }
    owners
}

/// The first of `files` through which the kernel lets us map the page at
/// `offset`, i.e. the render-node file that owns the BO there.  Only
/// EACCES (`drm_gem_mmap`'s answer to a file the BO's `vma_node` does not
/// admit) rules a file out: a refusal after that check (EPERM for a BO
/// without CPU access) still names the owner.
fn owning_file<'f>(
    files: impl Iterator<Item = BorrowedFd<'f>>,
    offset: MmapOffset,
) -> Option<BorrowedFd<'f>> {
    libc::off_t::try_from(offset.0).ok()?;
    for fd in files {
        // A read-only mapping of the page, unmapped at once; nothing reads it.
        match Mapping::of_file(
            fd,
            offset,
            crate::bo::PAGE_SIZE as usize,
            Access::ReadOnly,
            false,
        ) {
            Ok(_) => return Some(fd),
            Err(e) if e.errno() != libc::EACCES => return Some(fd),
            Err(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    /// Buckets KFD leaves as they were hand no fd over, whatever flags.
    #[test]
    fn unwritten_checkpoint_buckets_own_no_fd() {
        let mut bos = checkpoint_buckets(3);
        assert!(bos.iter().all(|b| b.dmabuf_fd == bo::KFD_INVALID_FD));
        bos[1].alloc_flags = bo::ALLOC_VRAM;
        bos[2].alloc_flags = bo::ALLOC_GTT;
        assert!(owned_dmabufs(&bos).iter().all(Option::is_none));
    }

    /// Only EACCES rules a file out: a write-only file refuses a read
    /// mapping with EACCES (as `drm_gem_mmap` refuses a file the BO's
    /// vma_node does not admit); a file mapping succeeds on, or one failing
    /// otherwise (/dev/null: ENODEV, past the ownership check), is taken.
    #[test]
    fn the_owner_is_the_first_file_not_refused_with_eacces() {
        let dir = crate::image::tests::tempdir();
        let path = dir.join("bo");
        std::fs::write(&path, vec![7u8; 2 * crate::bo::PAGE_SIZE as usize]).unwrap();
        let wo = OpenOptions::new().write(true).open(&path).unwrap();
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let off = MmapOffset(crate::bo::PAGE_SIZE);
        let got = owning_file([wo.as_fd(), rw.as_fd()].into_iter(), off).unwrap();
        assert_eq!(got.as_raw_fd(), rw.as_raw_fd());
        let got = owning_file([wo.as_fd(), null.as_fd()].into_iter(), off).unwrap();
        assert_eq!(got.as_raw_fd(), null.as_raw_fd());
        assert!(owning_file([wo.as_fd()].into_iter(), off).is_none());
        assert!(owning_file(std::iter::empty(), off).is_none());
    }
}
