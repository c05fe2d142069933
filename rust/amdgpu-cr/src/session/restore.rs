//! The restore side.
//!
//! * [`RestoreSession`] runs inside each restored task (CRIU restores its
//!   files there): [`RestoreSession::restore_file`] recreates a KFD process
//!   (`/dev/kfd` opened by the task, GPUs matched, render nodes opened,
//!   `RESTORE`, BO contents written back) or hands out a render-node fd that
//!   shares the VM's `drm_file`; [`RestoreSession::update_vma`] tells CRIU
//!   where each device mapping now lives, matched by offset range.  The BO
//!   contents are handed to the GPU memory writer ([`super::writer`]) and
//!   written back beside the rest of the task's restore;
//!   [`RestoreSession::task_done`] waits only until the writer holds the
//!   task's fds, and gives CRIU the task's gate: the fds its restorer uses
//!   to learn that its GPU memory is confirmed and to resume its own queues.
//! * [`check_outcomes`] runs in criu main once every task passed its gate:
//!   every KFD image must have been restored exactly once, in the task the
//!   pstree has under the image's pid, and resumed there.
//! * [`dry_run`] answers "can these images be restored here, and onto which
//!   GPUs?" from the images and the topology, touching no device.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kfd_abi::handle::{Kfd, RenderNode};
use kfd_abi::sys;

use super::dmabuf_fd;
use super::render_gpu::RenderGpus;
use super::writer::{gate_channel, Job, JobOutcome, Mailbox};
use super::xproc::{self, Exchange};
use super::{human_bytes, kfd_image_ids, owned_dmabufs, SessionError};
use crate::bo;
use crate::env::{self, Checks, EnginePolicy};
use crate::ids::{GpuId, MmapOffset, RenderMinor};
use crate::image::{
    dmabuf_image_name, kfd_image_name, DmabufImage, FileId, ImageError, KfdImage, RenderImage,
};
use crate::matcher::GpuMap;
use crate::os::fd::dup_at_least;
use crate::plan::{
    open_semaphore, plan_restore, same_file, stat_path, BoBucket, DeviceIdentities, DeviceKind,
    RestorePlan, SharedMem, VmaFixups, HSAKMT_SEMAPHORE, HSAKMT_SEMAPHORE_FILE, HSAKMT_SHM,
};
use crate::proto::DrmBoEntry;
use crate::topology::{Topology, SYSFS_NODES};

/// Oldest KFD interface with the CRIU ops.
const KFD_CRIU_MIN_VERSION: (u32, u32) = (1, 8);

/// Where the restore looks for things, what it checks, and how it copies.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub dev_dir: PathBuf,
    pub sysfs_nodes: PathBuf,
    pub staging_cap: Option<u64>,
    pub policy: EnginePolicy,
    /// The `KFD_*_CHECK` knobs.
    pub checks: Checks,
    /// The render nodes of criu main's `/dev` (the host's), probed there.
    pub host_nodes: HostRenderNodes,
    /// `CRIU_ROCM_VERIFY_KEY` (and `CRIU_ROCM_VERIFY_SIGNATURE`): the
    /// signature the images need.
    pub verify_key: Option<crate::validate::signature::Required>,
}

/// `/dev/dri/renderD<N>` as criu main sees them: a restored task finds
/// each among its own nodes by identity, whatever its name there.
#[derive(Clone, Default)]
pub struct HostRenderNodes(pub Vec<(RenderMinor, libc::stat)>);

impl std::fmt::Debug for HostRenderNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(m, _)| m.0))
            .finish()
    }
}

impl HostRenderNodes {
    /// The render nodes below `dev`.
    pub fn probe(dev: &Path) -> Self {
        HostRenderNodes(DeviceIdentities::probe(dev).render_nodes)
    }

    /// Where a task whose render nodes are `here` (name, stat) reaches each
    /// host render node: the node of the same identity (rdev of a character
    /// device, device and inode of an emulated node or a bind mount of
    /// one).  A container keeps the mount points or device files of the
    /// GPUs it was dumped with and is given its new GPUs under those names,
    /// or under their own; a GPU it was not given is not reachable at all.
    /// A node of `here` whose identity criu main does not know counts under
    /// its own name when criu main has no node of that name.
    pub fn reachable(
        &self,
        here: &[(RenderMinor, libc::stat)],
    ) -> BTreeMap<RenderMinor, RenderMinor> {
        let mut out = BTreeMap::new();
        for (name, st) in here {
            match self.0.iter().find(|(_, h)| same_file(st, h)) {
                Some((host, _)) => {
                    out.entry(*host).or_insert(*name);
                }
                None if !self.0.iter().any(|(m, _)| m == name) => {
                    out.entry(*name).or_insert(*name);
                }
                None => {}
            }
        }
        out
    }
}

impl RestoreOptions {
    /// The product's paths and the environment's knobs (read once, in criu
    /// main, so a bad value fails before any task is created).
    pub fn from_env() -> Result<Self, crate::Error> {
        Ok(RestoreOptions {
            dev_dir: PathBuf::from("/dev"),
            sysfs_nodes: PathBuf::from(SYSFS_NODES),
            staging_cap: env::max_buffer_size_from_env()?,
            policy: env::engine_policy_from_env()?,
            checks: Checks::from_env()?,
            host_nodes: HostRenderNodes::probe(Path::new("/dev")),
            verify_key: crate::validate::signature::verify_key_from_env()?,
        })
    }

    fn render_path(&self, minor: RenderMinor) -> PathBuf {
        self.dev_dir.join(format!("dri/renderD{}", minor.0))
    }

    /// Places the GPUs of `dir`'s render files without KFD
    /// ([`RenderGpus`]) on the GPUs of `host` whose render node the task
    /// reaches (`reach`, [`Self::reachable_nodes`]).
    fn place_render_gpus(
        &self,
        dir: &Path,
        host: &Topology,
        reach: &BTreeMap<RenderMinor, RenderMinor>,
    ) -> Result<RenderGpus, Vec<crate::validate::Refusal>> {
        let mut usable = host.clone();
        usable.retain_gpus(|n| reach.contains_key(&n.render_minor()));
        RenderGpus::place(dir, &usable, &self.checks)
    }

    /// In a restored task: host render minor → the name of its node in
    /// this task's `dev_dir` (see [`HostRenderNodes::reachable`]).
    fn reachable_nodes(&self) -> BTreeMap<RenderMinor, RenderMinor> {
        let here = DeviceIdentities::probe(&self.dev_dir).render_nodes;
        self.host_nodes.reachable(&here)
    }
}

/// Opens the render node at `path`, read-write, close-on-exec.
fn open_render(path: &Path) -> Result<RenderNode, kfd_abi::handle::Error> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map(|f| RenderNode::from_fd(OwnedFd::from(f)))
        .map_err(|e| kfd_abi::handle::Error {
            ioctl: "open(/dev/dri/renderD*)",
            errno: e.raw_os_error().unwrap_or(libc::EIO),
        })
}

/// Logs the host GPUs this task cannot reach and the ones it reaches
/// under another name; returns the paths of the nodes it lacks.
fn log_reach(
    vpid: i32,
    opts: &RestoreOptions,
    reach: &BTreeMap<RenderMinor, RenderMinor>,
) -> Vec<String> {
    let mut missing = Vec::new();
    let Ok(t) = Topology::parse_sysfs(&opts.sysfs_nodes) else {
        return missing;
    };
    for n in t.nodes.iter().filter(|n| n.is_gpu()) {
        let m = n.render_minor();
        let gpu = n.gpu_id.map_or(0, |g| g.0);
        if !reach.contains_key(&m) {
            missing.push(opts.render_path(m).display().to_string());
        }
        match reach.get(&m) {
            None => log::info!(
                "pid {vpid}: host GPU {gpu:#x} (renderD{}) left out: this task has no render \
                 node of it (a container not given that GPU), as libhsakmt leaves it out",
                m.0
            ),
            Some(name) if *name != m => log::info!(
                "pid {vpid}: host GPU {gpu:#x} (renderD{}) is renderD{} in this task's /dev/dri",
                m.0,
                name.0
            ),
            Some(_) => {}
        }
    }
    missing
}

/// A KFD process recreated in this task.
struct RestoredKfd {
    id: FileId,
    /// The process' pid at dump (the image's `pid`).
    pid: u32,
    /// Our fd of the task's new `/dev/kfd` (kept above CRIU's fd range);
    /// dups of it go to CRIU for the file and for `/dev/kfd` mappings.
    kfd: OwnedFd,
    /// CRIU took the file already.
    handed_out: bool,
    /// user gpu_id → the render node now serving it and its host gpu_id.
    user_gpu: BTreeMap<GpuId, (RenderMinor, GpuId)>,
    /// The render fds given to RESTORE (they own the VM), by minor.
    render: BTreeMap<RenderMinor, OwnedFd>,
    fixups: VmaFixups,
    /// The BO contents, handed to the GPU memory writer.
    posted: Option<Posted>,
}

/// A render file whose GEM BOs were restored in this task.
struct RestoredGem {
    fixups: super::gem::GemFixups,
    /// A dup of the file, to map the BOs through.
    file: OwnedFd,
    id: FileId,
    /// The BOs' handles, in image order.
    handles: Vec<u32>,
}

/// A copy job on the writer's board, and the fds it names that only this
/// task holds until the writer has taken them.
struct Posted {
    slot: usize,
    _memfd: OwnedFd,
    dmabufs: Vec<Option<OwnedFd>>,
    /// The writer's end of the gate channel (closed once the writer took
    /// it: from then on its end-of-file is the writer's death).
    _chan_writer: OwnedFd,
    /// The task's end, for its restorer.
    chan_task: OwnedFd,
}

/// What a task's restorer needs at its gate (criu/include/gpu-gate.h):
/// its end of the channel to the writer, its `/dev/kfd` for its own
/// `RESUME`, and the KFD image, for messages.  The fds are the restorer's
/// to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    pub chan: RawFd,
    pub kfd: RawFd,
    pub image: FileId,
}

/// The GPU state restored in one task.
pub struct RestoreSession {
    opts: RestoreOptions,
    kfds: Vec<RestoredKfd>,
    /// The GPU memory writer's board (criu main starts the writer when the
    /// images hold a KFD process).
    mailbox: Option<Mailbox>,
    /// This task's pid in criu main's namespace and its fd of the image
    /// directory, for a job posted to the writer.
    task: Option<(i32, RawFd)>,
    /// The render files whose GEM BOs were restored: their new mmap
    /// offsets, and a dup of the file to map them through.
    gems: Vec<RestoredGem>,
    /// Files checked or recreated for the task (libhsakmt's shared memory
    /// and semaphore) by absolute path, held until its files and mappings
    /// are restored: CRIU opens those through these fds.
    held: Vec<(PathBuf, OwnedFd)>,
    /// BOs other processes import ([`xproc`]), when the images hold any.
    exchange: Option<Exchange>,
    /// The dma-bufs this task handed to them, kept until taken.
    handed: xproc::Posted,
    /// The host GPUs of the dump's GPUs that render files without KFD are
    /// of, once a file needed them.
    render_gpus: Option<RenderGpus>,
}

fn kfd_step(
    pid: i32,
    step: impl Into<String>,
) -> impl FnOnce(kfd_abi::handle::Error) -> SessionError {
    let step = step.into();
    move |source| SessionError::Kfd { pid, step, source }
}

fn os_step(pid: i32, step: impl Into<String>) -> impl FnOnce(std::io::Error) -> SessionError {
    let step = step.into();
    move |source| SessionError::Os { pid, step, source }
}

/// Image GPU → host GPU, in words, for logs and the dry run.
fn describe_map(plan: &RestorePlan) -> String {
    let mut s = String::new();
    for (i, d) in plan.devices.iter().enumerate() {
        let old = plan.old_minors.get(&d.user).map(|m| m.0).unwrap_or(0);
        let _ = write!(
            s,
            "{}GPU {} (renderD{old}) -> host GPU {} (renderD{})",
            if i == 0 { "" } else { ", " },
            d.user,
            d.actual,
            d.render_minor.0
        );
    }
    s
}

impl RestoreSession {
    pub fn new(opts: RestoreOptions) -> Self {
        RestoreSession {
            opts,
            kfds: Vec::new(),
            mailbox: None,
            task: None,
            gems: Vec::new(),
            held: Vec::new(),
            exchange: None,
            handed: xproc::Posted::default(),
            render_gpus: None,
        }
    }

    /// Hands BOs to the processes that import them through `exchange`
    /// (made in criu main before any task).
    pub fn use_exchange(&mut self, exchange: Exchange) {
        self.exchange = Some(exchange);
    }

    /// The BOs of file `id` other processes import, handed over: a dma-buf
    /// of each from `export(index)`.
    fn hand_over(
        &mut self,
        vpid: i32,
        id: FileId,
        fd_floor: RawFd,
        export: impl FnMut(u32) -> Result<OwnedFd, SessionError>,
    ) -> Result<(), SessionError> {
        let Some(ex) = self.exchange else {
            return Ok(());
        };
        self.handed.post_file(&ex, vpid, id, fd_floor, export)
    }

    /// The fd this task holds of the file CRIU is about to open as `path`
    /// (relative to the task's root, as CRIU names it, or absolute), to
    /// open it through instead: the file the restore checked or made,
    /// whatever became of the name since.  Stays ours.
    pub fn held_file(&self, path: &str) -> Option<BorrowedFd<'_>> {
        let path = Path::new("/").join(path);
        self.held
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, fd)| fd.as_fd())
    }

    fn hold_thunk_files(&mut self, vpid: i32, image: &KfdImage, fd_floor: RawFd) {
        for (path, fd) in hold_thunk_files(vpid, image, fd_floor) {
            if self.held_file(path.to_str().unwrap_or_default()).is_none() {
                self.held.push((path, fd));
            }
        }
    }

    /// Hands BO contents to the writer behind `mailbox` from now on.
    pub fn use_writer(&mut self, mailbox: Mailbox) {
        self.mailbox = Some(mailbox);
    }

    /// In a restored task, before its files: its pid in criu main's
    /// namespace and its fd of the image directory.
    pub fn set_task(&mut self, real_pid: i32, imgdir_fd: RawFd) {
        self.task = Some((real_pid, imgdir_fd));
    }

    /// Restores CRIU file `id` of the task whose pid (in its namespace) is
    /// `vpid`.  Fds this keeps are numbered `fd_floor` or above, clear of
    /// every fd CRIU still has to restore in the task.  `None`: no GPU image
    /// has this id.  The returned fd is CRIU's to place and close.
    pub fn restore_file(
        &mut self,
        vpid: i32,
        id: FileId,
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<Option<OwnedFd>, SessionError> {
        let index = match self.kfds.iter().position(|k| k.id == id) {
            // Restored early, for a render node of the same process.
            Some(i) if self.kfds[i].handed_out => {
                return Err(SessionError::State {
                    pid: vpid,
                    what: format!("KFD file {id} restored twice"),
                })
            }
            Some(i) => i,
            None if dir.join(crate::image::kfd_image_name(id)).exists() => {
                if let Some(fd) = self.reopen_kfd(vpid, id, fd_floor, dir)? {
                    return Ok(Some(fd));
                }
                self.restore_kfd(vpid, id, fd_floor, dir)?;
                self.kfds.len() - 1
            }
            None if dir.join(crate::image::render_image_name(id)).exists() => {
                return self.restore_render(vpid, id, fd_floor, dir).map(Some);
            }
            None if super::dmabuf_fd::has_image(dir, id) => {
                return self.restore_dmabuf(vpid, id, dir).map(Some);
            }
            None if has_pages_of(dir, id) => {
                return Err(SessionError::State {
                    pid: vpid,
                    what: format!(
                        "{} is missing: the task holds that /dev/kfd file (its GPU memory \
                         is in this directory), but its KFD image is not",
                        crate::image::kfd_image_name(id)
                    ),
                })
            }
            None => return Ok(None),
        };
        let k = &mut self.kfds[index];
        k.handed_out = true;
        let fd = k
            .kfd
            .try_clone()
            .map_err(os_step(vpid, "dup of /dev/kfd"))?;
        Ok(Some(fd))
    }

    /// A KFD image that is a further open of a process' /dev/kfd: the
    /// process' state comes from its first KFD image (restored now if CRIU
    /// has not reached it yet); this file is a fresh open, which joins the
    /// same KFD process.  `None`: `id` is a first KFD file.
    fn reopen_kfd(
        &mut self,
        vpid: i32,
        id: FileId,
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<Option<OwnedFd>, SessionError> {
        let image = KfdImage::read(dir, id)
            .map_err(|e| SessionError::core(vpid, "reading the KFD image", e))?;
        if image.msg.criu_rocm_reopen != Some(true) {
            return Ok(None);
        }
        let pid = image.msg.pid;
        if !self.kfds.iter().any(|k| k.pid == pid) {
            let ids = kfd_image_ids(dir).map_err(os_step(vpid, "listing the image directory"))?;
            let first = ids
                .into_iter()
                .filter(|&k| k != id)
                .find(|&k| {
                    KfdImage::read(dir, k)
                        .is_ok_and(|i| i.msg.pid == pid && i.msg.criu_rocm_reopen != Some(true))
                })
                .ok_or_else(|| SessionError::State {
                    pid: vpid,
                    what: format!(
                        "KFD file {id} reopens pid {pid}'s /dev/kfd, but no KFD image holds \
                         that process' state"
                    ),
                })?;
            self.restore_kfd(vpid, first, fd_floor, dir)?;
        }
        let kfd = Kfd::open().map_err(kfd_step(vpid, "reopening /dev/kfd"))?;
        log::info!("pid {vpid}: KFD file {id} reopened (state restored with the first KFD file)");
        Ok(Some(
            kfd.as_fd()
                .try_clone_to_owned()
                .map_err(os_step(vpid, "dup of /dev/kfd"))?,
        ))
    }

    /// A KFD image into this task: checked to be its own, its GPUs matched
    /// to this host's and planned, `/dev/kfd` and the render nodes opened,
    /// KFD's RESTORE, the BO contents posted to the GPU memory writer,
    /// libhsakmt's shared memory made sure of; kept for the rest of the
    /// restore.
    fn restore_kfd(
        &mut self,
        vpid: i32,
        id: FileId,
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<(), SessionError> {
        let start = Instant::now();
        let image = KfdImage::read(dir, id)
            .map_err(|e| SessionError::core(vpid, "reading the KFD image", e))?;
        self.check_kfd_owner(vpid, id, &image)?;
        let Some((mailbox, (real_pid, imgdir_fd))) = self.mailbox.zip(self.task) else {
            return Err(SessionError::State {
                pid: vpid,
                what: format!("KFD image {id}: no GPU memory writer to restore its GPU memory"),
            });
        };
        let (plan, reach) = self.match_and_plan(vpid, id, &image)?;
        // An image without buffers (which RESTORE refuses) never gets here:
        // criu_gpu_restore_init's validation (validate::check_dir) refuses it.
        let kfd = open_kfd(vpid, fd_floor)?;
        let render = self.open_render_nodes(vpid, &plan, &reach, fd_floor)?;
        let (restored, dmabufs) = kfd_restore(vpid, id, &image, &plan, &kfd, &render, fd_floor)?;
        let posted = post_job(
            (mailbox, real_pid, imgdir_fd),
            (vpid, id),
            &plan,
            &restored,
            &render,
            dmabufs,
            fd_floor,
        )?;
        let fixups = VmaFixups::from_restored(&plan, &restored)
            .map_err(|e| SessionError::core(vpid, "recording the new BO offsets", e))?;
        self.hold_thunk_files(vpid, &image, fd_floor);
        self.hand_over(vpid, id, fd_floor, |index| {
            posted
                .dmabufs
                .get(index as usize)
                .and_then(|d| d.as_ref())
                .ok_or_else(|| SessionError::State {
                    pid: vpid,
                    what: format!(
                        "KFD file {id}: another process imports its BO {index}, of which \
                         KFD's RESTORE gave no dma-buf"
                    ),
                })?
                .try_clone()
                .map_err(os_step(
                    vpid,
                    format!("KFD file {id}: dup of BO {index}'s dma-buf"),
                ))
        })?;
        let imported =
            super::kfd_import::import_all(vpid, id, &image, kfd.as_fd(), self.exchange.as_ref())?;
        log::info!(
            "pid {vpid}: KFD file {id} restored: {} GPU(s), {} BO(s) ({imported} imported from \
             other processes), {} object(s) in {:.1} ms; BO contents handed to the GPU memory \
             writer",
            plan.devices.len(),
            plan.bos.len() + imported,
            image.msg.num_of_objects,
            start.elapsed().as_secs_f64() * 1e3
        );
        self.kfds.push(RestoredKfd {
            id,
            pid: image.msg.pid,
            kfd,
            handed_out: false,
            user_gpu: plan
                .devices
                .iter()
                .map(|d| (d.user, (d.render_minor, d.actual)))
                .collect(),
            render,
            fixups,
            posted: Some(posted),
        });
        Ok(())
    }

    /// Refuses KFD image `id` in this task unless it is this task's own and
    /// the only one.
    fn check_kfd_owner(&self, vpid: i32, id: FileId, image: &KfdImage) -> Result<(), SessionError> {
        if image.msg.pid as i32 != vpid {
            // A KFD process belongs to the task that opens /dev/kfd; in
            // another task it would be another process' GPU state.
            return Err(SessionError::State {
                pid: vpid,
                what: format!(
                    "KFD image {id} was saved from pid {}, but the pstree gives its file to \
                     pid {vpid}; refusing to restore one process' GPU state into another",
                    image.msg.pid
                ),
            });
        }
        if let Some(other) = self.kfds.iter().find(|k| k.id != id) {
            return Err(SessionError::State {
                pid: vpid,
                what: format!(
                    "KFD images {} and {id} both hold a KFD process for this task, which can \
                     have one",
                    other.id
                ),
            });
        }
        Ok(())
    }

    /// The image's GPUs matched to the host GPUs this task has a render node
    /// of, the restore planned and its queues checked against those GPUs;
    /// with the render nodes this task reaches.
    fn match_and_plan(
        &self,
        vpid: i32,
        id: FileId,
        image: &KfdImage,
    ) -> Result<(RestorePlan, BTreeMap<RenderMinor, RenderMinor>), SessionError> {
        let reach = self.opts.reachable_nodes();
        let missing = log_reach(vpid, &self.opts, &reach);
        let (map, host) =
            crate::match_image_to_usable(image, &self.opts.sysfs_nodes, &self.opts.checks, |n| {
                reach.contains_key(&n.render_minor())
            })
            .map_err(|e| {
                let step = if missing.is_empty() {
                    "matching the image's GPUs to this host".to_owned()
                } else {
                    format!(
                        "matching the image's GPUs to the host GPUs this task has a render \
                         node of (it has no {})",
                        missing.join(", ")
                    )
                };
                SessionError::core(vpid, step, e)
            })?;
        let plan = plan_restore(image, &host, &map)
            .map_err(|e| SessionError::core(vpid, "planning the GPU restore", e))?;
        crate::validate::privdata::check_host(&kfd_image_name(id), image, &map, &host).map_err(
            |r| SessionError::State {
                pid: vpid,
                what: r.to_string(),
            },
        )?;
        log::info!("pid {vpid}: {}", describe_map(&plan));
        Ok((plan, reach))
    }

    /// The render node of every GPU of the plan, opened by its name in this
    /// task (`reach`) and moved above CRIU's fds.
    fn open_render_nodes(
        &self,
        vpid: i32,
        plan: &RestorePlan,
        reach: &BTreeMap<RenderMinor, RenderMinor>,
        fd_floor: RawFd,
    ) -> Result<BTreeMap<RenderMinor, OwnedFd>, SessionError> {
        let mut render = BTreeMap::new();
        for d in &plan.devices {
            let name = reach
                .get(&d.render_minor)
                .copied()
                .unwrap_or(d.render_minor);
            let path = self.opts.render_path(name);
            let node = open_render(&path).map_err(kfd_step(
                vpid,
                format!("GPU {}: opening {}", d.actual, path.display()),
            ))?;
            let fd = dup_at_least(node.as_fd(), fd_floor)
                .map_err(os_step(vpid, format!("moving {}", path.display())))?;
            render.insert(d.render_minor, fd);
        }
        Ok(render)
    }
    /// A render-node file: opened ([`Self::open_render_file`]), then its
    /// GEM BOs recreated on it ([`Self::restore_gem`]).
    fn restore_render(
        &mut self,
        vpid: i32,
        id: FileId,
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<OwnedFd, SessionError> {
        let img = RenderImage::read(dir, id)
            .map_err(|e| SessionError::core(vpid, "reading the render-node image", e))?;
        let (fd, gpu) = self.open_render_file(vpid, id, &img, fd_floor, dir)?;
        if img.has_gem_bos() {
            self.restore_gem(vpid, id, &img, (fd.as_fd(), gpu), fd_floor, dir)?;
        }
        Ok(fd)
    }

    /// The GEM BOs of render image `img` on its restored file `fd` (render
    /// node `minor` of this host, host GPU `actual`), kept for
    /// [`Self::update_vma`] with a dup of the file.
    fn restore_gem(
        &mut self,
        vpid: i32,
        id: FileId,
        img: &RenderImage,
        (fd, (minor, actual)): (BorrowedFd<'_>, (RenderMinor, GpuId)),
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<(), SessionError> {
        let copying = super::gem::Copying {
            policy: self.opts.policy,
            staging_cap: self.opts.staging_cap,
            compress: None,
            live: false,
        };
        let mut modes = None;
        let mut source = |b: &DrmBoEntry| self.same_bo(vpid, id, b, dir, &mut modes);
        let fixups = super::gem::restore(
            vpid,
            fd,
            img,
            (minor, id, actual),
            dir,
            copying,
            &mut source,
        )?;
        let file = dup_at_least(fd, fd_floor).map_err(os_step(vpid, "dup of a render node"))?;
        let handles: Vec<u32> = img.msg.bo_entries.iter().map(|b| b.handle).collect();
        self.hand_over(vpid, id, fd_floor, |index| {
            let access = export_access(vpid, dir, &mut modes, (id, index))?;
            let h = *handles
                .get(index as usize)
                .ok_or_else(|| SessionError::State {
                    pid: vpid,
                    what: format!(
                        "render-node file {id}: another process imports its BO {index}, which \
                         its image does not have"
                    ),
                })?;
            RenderNode::from_fd(fd)
                .prime_handle_to_fd(h, libc::O_CLOEXEC as u32 | access)
                .map_err(kfd_step(
                    vpid,
                    format!("render-node file {id}: PRIME_HANDLE_TO_FD of handle {h}"),
                ))
        })?;
        self.gems.push(RestoredGem {
            fixups,
            file,
            id,
            handles,
        });
        Ok(())
    }

    /// A dma-buf of the BO that GEM BO `b` of render file `id` is
    /// (`same_bo_file`, `same_bo_index`), restored in this task already: a
    /// KFD BO (the dma-buf KFD's RESTORE gave) or another render file's
    /// (exported with PRIME, with the access mode the dump's dma-buf fds of
    /// it had).  A BO not restored yet fails the restore, naming both.
    fn same_bo(
        &self,
        vpid: i32,
        id: FileId,
        b: &DrmBoEntry,
        dir: &Path,
        modes: &mut Option<ExportModes>,
    ) -> Result<OwnedFd, SessionError> {
        let (file, index) = (
            FileId(b.same_bo_file.unwrap_or_default()),
            b.same_bo_index.unwrap_or_default(),
        );
        let what = format!(
            "render-node file {id}, GEM handle {}: the same BO as BO {index} of file {file}",
            b.handle
        );
        let restored_here =
            self.kfds.iter().any(|k| k.id == file) || self.gems.iter().any(|g| g.id == file);
        if let (Some(pid), false) = (b.same_bo_pid, restored_here) {
            let what = format!("{what} of pid {pid}");
            let ex = self.exchange.ok_or_else(|| SessionError::State {
                pid: vpid,
                what: format!("{what}: the restore has no BO exchange between processes"),
            })?;
            return ex.take(vpid, (file, index), &what);
        }
        if let (Some(_), Some(ex)) = (b.same_bo_pid, self.exchange) {
            // CRIU restored the other process' file here (a file both
            // hold): imported from this task, not through the exchange.
            ex.count_off((file, index));
        }
        let access = export_access(vpid, dir, modes, (file, index))?;
        self.bo_dmabuf(vpid, (file, index), access, &what)?
            .ok_or_else(|| SessionError::State {
                pid: vpid,
                what: format!(
                    "{what}, which this task has not restored (files are restored in fd order; \
                     a BO held by another process is not restored)"
                ),
            })
    }

    /// A dma-buf of BO `index` of file `file` restored in this task: the
    /// one KFD's RESTORE gave for a KFD BO, a PRIME export of a render
    /// file's, read-write if `access` is `DRM_RDWR` when it makes the BO's
    /// dma-buf file).  `None`: this task has not restored that file (yet).
    /// `what` names the asker in refusals.
    fn bo_dmabuf(
        &self,
        vpid: i32,
        (file, index): (FileId, u32),
        access: u32,
        what: &str,
    ) -> Result<Option<OwnedFd>, SessionError> {
        let missing = |why: &str| SessionError::State {
            pid: vpid,
            what: format!("{what}, which {why}"),
        };
        if let Some(k) = self.kfds.iter().find(|k| k.id == file) {
            let dmabuf = k
                .posted
                .as_ref()
                .and_then(|p| p.dmabufs.get(index as usize))
                .and_then(|d| d.as_ref())
                .ok_or_else(|| missing("KFD's RESTORE gave no dma-buf of"))?;
            return dmabuf
                .try_clone()
                .map(Some)
                .map_err(os_step(vpid, format!("{what}: dup of its dma-buf")));
        }
        let Some(g) = self.gems.iter().find(|g| g.id == file) else {
            return Ok(None);
        };
        let h = *g
            .handles
            .get(index as usize)
            .ok_or_else(|| missing("its image does not have"))?;
        RenderNode::from_fd(g.file.as_fd())
            .prime_handle_to_fd(h, libc::O_CLOEXEC as u32 | access)
            .map(Some)
            .map_err(kfd_step(
                vpid,
                format!("{what}: PRIME_HANDLE_TO_FD of its handle {h}"),
            ))
    }

    /// A dma-buf fd (CRIU file `id`): its BO exported again from the
    /// restored holder ([`Self::bo_dmabuf`]), with the file's status flags
    /// as dumped, checked with `F_GETFL` (a dma-buf the export gives with
    /// another access mode fails, naming the image's `file_flags`).
    /// [`SessionError::Waits`]: the holder is not restored yet.
    fn restore_dmabuf(&self, vpid: i32, id: FileId, dir: &Path) -> Result<OwnedFd, SessionError> {
        let img = DmabufImage::read(dir, id)
            .map_err(|e| SessionError::core(vpid, "reading the dma-buf image", e))?;
        let (file, index) = img.bo();
        let what = format!("dma-buf file {id}: BO {index} of file {file}");
        let flags = img.msg.file_flags;
        let access = dmabuf_fd::export_access(flags);
        let Some(fd) = self.bo_dmabuf(vpid, (file, index), access, &what)? else {
            return Err(SessionError::Waits {
                pid: vpid,
                file,
                what,
            });
        };
        let nonblock = flags.unwrap_or(0) & libc::O_NONBLOCK as u32 != 0;
        if nonblock {
            set_nonblock(fd.as_fd()).map_err(os_step(vpid, format!("{what}: F_SETFL")))?;
        }
        let got =
            dmabuf_fd::file_flags(fd.as_fd()).map_err(os_step(vpid, format!("{what}: F_GETFL")))?;
        dmabuf_fd::check_restored(got, flags).map_err(|why| {
            let image = dir.join(dmabuf_image_name(id)).display().to_string();
            SessionError::core(
                vpid,
                what.clone(),
                ImageError::invalid(&image, "file_flags", why),
            )
        })?;
        log::info!(
            "pid {vpid}: {what}: exported again ({})",
            dmabuf_fd::flag_words(got)
        );
        Ok(fd)
    }

    /// The file of render image `img` (CRIU file `id`), the host render
    /// minor it is of and that GPU's host gpu_id: the one KFD's VM is on when
    /// the task's KFD process has this GPU (restored now if CRIU has not
    /// reached its file yet), else a fresh open of the GPU's node.
    fn open_render_file(
        &mut self,
        vpid: i32,
        id: FileId,
        img: &RenderImage,
        fd_floor: RawFd,
        dir: &Path,
    ) -> Result<(OwnedFd, (RenderMinor, GpuId)), SessionError> {
        let user = img.gpu_id();
        if self.render_fd_for(user).is_none() {
            // The render fd comes before the KFD file in this task: restore
            // this process' KFD image now, CRIU collects the file later.
            let ids = kfd_image_ids(dir).map_err(os_step(vpid, "listing the image directory"))?;
            for kid in ids {
                if self.kfds.iter().any(|k| k.id == kid) {
                    continue;
                }
                let image = KfdImage::read(dir, kid)
                    .map_err(|e| SessionError::core(vpid, "reading a KFD image", e))?;
                if image.msg.pid as i32 == vpid
                    && image.msg.criu_rocm_reopen != Some(true)
                    && image.gpu_ids().contains(&user)
                {
                    self.restore_kfd(vpid, kid, fd_floor, dir)?;
                    break;
                }
            }
        }
        if let Some((fd, gpu)) = self.render_fd_for(user) {
            // Same open file as the one RESTORE gave KFD: the application's
            // render fd and its KFD VM share one drm_file, as before.
            let fd = dup_at_least(fd, fd_floor).map_err(os_step(vpid, "dup of a render node"))?;
            return Ok((fd, gpu));
        }
        // No KFD process of the task has the GPU.
        let reach = self.opts.reachable_nodes();
        let (minor, gpu) = self.render_only_gpu(vpid, id, img, dir, &reach)?;
        let name = reach.get(&minor).copied();
        let path = self.opts.render_path(name.unwrap_or(minor));
        let n = open_render(&path).map_err(kfd_step(
            vpid,
            format!("GPU {user}: opening {}", path.display()),
        ))?;
        let fd =
            dup_at_least(n.as_fd(), fd_floor).map_err(os_step(vpid, "moving a render node"))?;
        Ok((fd, (minor, gpu)))
    }

    /// The host render minor and gpu_id of the GPU of render image `img`
    /// (CRIU file `id`), which no KFD process of the task has: where every
    /// task places the dump's such GPUs ([`RenderGpus`], among the GPUs
    /// whose node it reaches, `reach`) when the image records its GPU,
    /// else the host's GPU of its id.
    fn render_only_gpu(
        &mut self,
        vpid: i32,
        id: FileId,
        img: &RenderImage,
        dir: &Path,
        reach: &BTreeMap<RenderMinor, RenderMinor>,
    ) -> Result<(RenderMinor, GpuId), SessionError> {
        let user = img.gpu_id();
        let host = Topology::parse_sysfs(&self.opts.sysfs_nodes)
            .map_err(|e| SessionError::core(vpid, "reading the KFD topology", e))?;
        let Some(at_dump) = img.msg.criu_rocm_gpu.as_ref().map(|e| e.drm_render_minor) else {
            let node = host.gpu(user).ok_or_else(|| SessionError::State {
                pid: vpid,
                what: render_without_gpu(id, user).to_string(),
            })?;
            return Ok((node.render_minor(), node.gpu_id.unwrap_or(user)));
        };
        if self.render_gpus.is_none() {
            let placed = self
                .opts
                .place_render_gpus(dir, &host, reach)
                .map_err(|r| {
                    let why: Vec<String> = r.iter().map(ToString::to_string).collect();
                    SessionError::State {
                        pid: vpid,
                        what: why.join("; "),
                    }
                })?;
            self.render_gpus = Some(placed);
        }
        let placed = self.render_gpus.as_ref().and_then(|p| p.get(at_dump));
        let node = placed.and_then(|(g, _)| host.gpu(g));
        let (Some((gpu, how)), Some(node)) = (placed, node) else {
            return Err(SessionError::State {
                pid: vpid,
                what: render_without_gpu(id, user).to_string(),
            });
        };
        log::info!(
            "pid {vpid}: render file {id}: GPU {user} (renderD{at_dump}) -> host GPU {gpu} \
             (renderD{}): no KFD process of the task has it; {how}",
            node.render_minor().0
        );
        Ok((node.render_minor(), gpu))
    }

    /// The render file KFD's VM of GPU `user` is on, its minor and the host
    /// gpu_id of that GPU.
    fn render_fd_for(&self, user: GpuId) -> Option<(BorrowedFd<'_>, (RenderMinor, GpuId))> {
        self.kfds.iter().find_map(|k| {
            let (m, actual) = *k.user_gpu.get(&user)?;
            k.render.get(&m).map(|f| (f.as_fd(), (m, actual)))
        })
    }

    /// Where a device mapping of `len` bytes at `addr`, recorded at dump as
    /// `path` at byte offset `pgoff`, is to be mapped now: the new offset
    /// and an fd to map (CRIU's to close).  `None`: a `/dev/kfd` mapping of
    /// a task without a KFD process.
    pub fn update_vma(
        &self,
        vpid: i32,
        path: &str,
        addr: u64,
        pgoff: u64,
        len: u64,
    ) -> Result<Option<(u64, OwnedFd)>, SessionError> {
        // The dump took this mapping as a GPU one by its file's identity:
        // a path that names no GPU node now would be mapped as a plain file
        // at its old offset, onto whatever holds that offset today.
        let Some(device) = DeviceKind::from_path(path) else {
            return Err(SessionError::State {
                pid: vpid,
                what: format!(
                    "mapping at {addr:#x} ({len:#x} bytes at offset {pgoff:#x}) was dumped as a \
                     GPU mapping, but its path {path} names neither /dev/kfd nor a render node"
                ),
            });
        };
        if let Some(found) = self.kfd_bo_mapping(vpid, path, device, addr, pgoff, len)? {
            return Ok(Some(found));
        }
        if let DeviceKind::Render(m) = device {
            if let Some(found) = self.gem_bo_mapping(vpid, path, m, addr, pgoff, len)? {
                return Ok(Some(found));
            }
        }
        self.unbacked_mapping(vpid, device, addr, pgoff, len)
    }

    /// [`Self::update_vma`] of a mapping of a BO a KFD file restored: its
    /// new offset, through the KFD file or the render file of its VM.
    fn kfd_bo_mapping(
        &self,
        vpid: i32,
        path: &str,
        device: DeviceKind,
        addr: u64,
        pgoff: u64,
        len: u64,
    ) -> Result<Option<(u64, OwnedFd)>, SessionError> {
        for k in &self.kfds {
            let Some(r) = k.fixups.lookup(device, pgoff, len) else {
                continue;
            };
            let fd = match r.device {
                DeviceKind::Kfd => k.kfd.as_fd(),
                DeviceKind::Render(m) => match k.render.get(&m) {
                    Some(f) => f.as_fd(),
                    None => {
                        return Err(SessionError::State {
                            pid: vpid,
                            what: format!("mapping at {addr:#x}: renderD{} was not opened", m.0),
                        })
                    }
                },
            };
            let fd = fd
                .try_clone_to_owned()
                .map_err(os_step(vpid, "dup for a device mapping"))?;
            log::debug!(
                "pid {vpid}: mapping {addr:#x}+{len:#x} of {path} at {pgoff:#x} -> BO {} at {:#x}",
                r.bo_index,
                r.offset.0
            );
            return Ok(Some((r.offset.0, fd)));
        }
        Ok(None)
    }

    /// [`Self::update_vma`] of a mapping of a GEM BO a render file
    /// restored: its new offset, through that file.
    fn gem_bo_mapping(
        &self,
        vpid: i32,
        path: &str,
        m: RenderMinor,
        addr: u64,
        pgoff: u64,
        len: u64,
    ) -> Result<Option<(u64, OwnedFd)>, SessionError> {
        for g in &self.gems {
            let Some((offset, handle)) = g.fixups.lookup(m.0, pgoff, len) else {
                continue;
            };
            let fd = g
                .file
                .try_clone()
                .map_err(os_step(vpid, "dup for a device mapping"))?;
            log::debug!(
                "pid {vpid}: mapping {addr:#x}+{len:#x} of {path} at {pgoff:#x} -> GEM \
                 handle {handle} at {offset:#x}"
            );
            return Ok(Some((offset, fd)));
        }
        Ok(None)
    }

    /// [`Self::update_vma`] of a device mapping no restored BO backs:
    /// /dev/kfd pages that are not BOs (the events page) keep their
    /// offset, mapped through the task's new KFD file; a render node's is
    /// refused.
    fn unbacked_mapping(
        &self,
        vpid: i32,
        device: DeviceKind,
        addr: u64,
        pgoff: u64,
        len: u64,
    ) -> Result<Option<(u64, OwnedFd)>, SessionError> {
        match (device, self.kfds.first()) {
            (DeviceKind::Kfd, Some(k)) => {
                let fd = k
                    .kfd
                    .try_clone()
                    .map_err(os_step(vpid, "dup for a device mapping"))?;
                Ok(Some((pgoff, fd)))
            }
            (DeviceKind::Kfd, None) => Ok(None),
            (DeviceKind::Render(m), _) => Err(SessionError::State {
                pid: vpid,
                what: format!(
                    "mapping at {addr:#x} of renderD{} at offset {pgoff:#x} ({len:#x} bytes) \
                     belongs to no restored GPU buffer",
                    m.0
                ),
            }),
        }
    }
}

impl RestoreSession {
    /// After CRIU opened every mapping of the task: the fds kept for the
    /// hooks are closed, so the task's fd table is what it was at dump (KFD
    /// holds its own reference to each VM's render-node file, and CRIU maps
    /// through the dups it was given) — except the gate's two, which the
    /// task's restorer closes.  A KFD image restored early for a render fd
    /// must have been claimed by CRIU since.  `proc` is criu's `/proc`,
    /// through which the task sees the writer die while it waits.
    pub fn task_done(
        &mut self,
        vpid: i32,
        proc: Option<BorrowedFd<'_>>,
    ) -> Result<Option<Gate>, SessionError> {
        // Every process that imports a BO of ours must hold it first.
        if let Some(ex) = self.exchange {
            self.handed.finish(&ex, vpid)?;
        }
        // The writer must hold the fds a job names before ours close.
        if let Some(mailbox) = self.mailbox {
            for p in self.kfds.iter().filter_map(|k| k.posted.as_ref()) {
                mailbox.wait_taken(p.slot, vpid, proc)?;
            }
        }
        let unclaimed: Vec<String> = self
            .kfds
            .iter()
            .filter(|k| !k.handed_out)
            .map(|k| k.id.to_string())
            .collect();
        if !unclaimed.is_empty() {
            self.kfds.clear();
            return Err(SessionError::State {
                pid: vpid,
                what: format!(
                    "KFD image(s) {} were restored for a render node but the task has no such file",
                    unclaimed.join(", ")
                ),
            });
        }
        self.gems.clear();
        self.held.clear();
        let n = self.kfds.len();
        let mut gate = None;
        for k in self.kfds.drain(..) {
            if let Some(p) = k.posted {
                gate = Some(Gate {
                    chan: p.chan_task.into_raw_fd(),
                    kfd: k.kfd.into_raw_fd(),
                    image: k.id,
                });
            }
        }
        if n > 0 {
            log::debug!("pid {vpid}: closed the GPU hooks' own fds of {n} KFD process(es)");
        }
        Ok(gate)
    }
}

/// The dump's dma-buf export modes ([`dmabuf_fd::export_modes`]), read
/// when a restore first needs one.
type ExportModes = std::collections::BTreeMap<(FileId, u32), u32>;

/// [`dmabuf_fd::bo_export_access`] of BO `bo` of the dump in `dir`, the
/// images read into `modes` the first time.
fn export_access(
    vpid: i32,
    dir: &Path,
    modes: &mut Option<ExportModes>,
    bo: (FileId, u32),
) -> Result<u32, SessionError> {
    let modes = match modes {
        Some(m) => m,
        None => modes.insert(
            dmabuf_fd::export_modes(dir)
                .map_err(|e| SessionError::core(vpid, "reading the dma-buf images", e))?,
        ),
    };
    Ok(dmabuf_fd::bo_export_access(modes, bo))
}

/// Sets `O_NONBLOCK` on the open file `fd`.
fn set_nonblock(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let flags = dmabuf_fd::file_flags(fd)? as i32;
    // SAFETY: F_SETFL on a valid fd with an int argument touches no memory.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `/dev/kfd` opened, its interface version checked for checkpoint/restore,
/// and moved above CRIU's fds.
fn open_kfd(vpid: i32, fd_floor: RawFd) -> Result<OwnedFd, SessionError> {
    let kfd = Kfd::open().map_err(kfd_step(vpid, "opening /dev/kfd"))?;
    let (major, minor) = kfd.get_version().map_err(kfd_step(vpid, "KFD version"))?;
    if major != KFD_CRIU_MIN_VERSION.0 || minor < KFD_CRIU_MIN_VERSION.1 {
        return Err(SessionError::State {
            pid: vpid,
            what: format!(
                "the KFD interface is {major}.{minor}; checkpoint/restore needs 1.{} or later",
                KFD_CRIU_MIN_VERSION.1
            ),
        });
    }
    dup_at_least(kfd.as_fd(), fd_floor).map_err(os_step(vpid, "moving /dev/kfd"))
}

/// KFD's RESTORE of image `id` by the plan on `kfd`: the BOs with their
/// new mmap offsets, and the dmabufs KFD installed (moved above CRIU's
/// fds, owned from here on).
fn kfd_restore(
    vpid: i32,
    id: FileId,
    image: &KfdImage,
    plan: &RestorePlan,
    kfd: &OwnedFd,
    render: &BTreeMap<RenderMinor, OwnedFd>,
    fd_floor: RawFd,
) -> Result<(Vec<BoBucket>, Vec<Option<OwnedFd>>), SessionError> {
    let mut devices: Vec<sys::kfd_criu_device_bucket> = plan
        .devices
        .iter()
        .map(|d| sys::kfd_criu_device_bucket {
            user_gpu_id: d.user.0,
            actual_gpu_id: d.actual.0,
            drm_fd: render[&d.render_minor].as_raw_fd() as u32,
            ..Default::default()
        })
        .collect();
    let mut buckets: Vec<sys::kfd_criu_bo_bucket> = plan
        .bos
        .iter()
        .map(|b| sys::kfd_criu_bo_bucket {
            addr: b.addr.0,
            size: b.size,
            offset: b.offset.0,
            restored_offset: 0,
            gpu_id: b.gpu_id.0,
            alloc_flags: b.alloc_flags,
            dmabuf_fd: bo::KFD_INVALID_FD,
            ..Default::default()
        })
        .collect();
    let mut priv_data = image.msg.priv_data.clone();
    if let Err(e) = Kfd::from_fd(kfd.as_fd()).criu_restore(
        image.msg.num_of_objects,
        &mut devices,
        &mut buckets,
        &mut priv_data,
    ) {
        let layout = match image.priv_layout() {
            Ok(l) => format!("kernel data with {}-byte BO records", l.bo_record_size),
            Err(why) => format!("kernel data not understood: {why}"),
        };
        return Err(SessionError::Kfd {
            pid: vpid,
            step: format!("RESTORE of KFD image {id} ({layout})"),
            source: e,
        });
    }
    // The dmabufs KFD installed in our table, owned from here on.
    let mut dmabufs = owned_dmabufs(&buckets);
    let restored: Vec<BoBucket> = plan
        .bos
        .iter()
        .zip(&buckets)
        .map(|(b, k)| BoBucket {
            restored_offset: MmapOffset(k.restored_offset),
            ..*b
        })
        .collect();
    // Kept until the writer takes them: above CRIU's fds.
    for d in dmabufs.iter_mut() {
        if let Some(fd) = d.take() {
            *d = Some(
                dup_at_least(fd.as_fd(), fd_floor)
                    .map_err(os_step(vpid, "moving a BO's dmabuf"))?,
            );
        }
    }
    Ok((restored, dmabufs))
}

/// The GPU memory job of KFD image `id` (its BOs at their new offsets,
/// the render nodes and dmabufs to copy through) posted to the writer's
/// board, with the gate channel the task waits on; with `--stream`, the
/// pages files sent down that channel.
fn post_job(
    (mailbox, real_pid, imgdir_fd): (Mailbox, i32, RawFd),
    (vpid, id): (i32, FileId),
    plan: &RestorePlan,
    restored: &[BoBucket],
    render: &BTreeMap<RenderMinor, OwnedFd>,
    dmabufs: Vec<Option<OwnedFd>>,
    fd_floor: RawFd,
) -> Result<Posted, SessionError> {
    let (chan_task, chan_writer) = gate_channel()
        .and_then(|(t, w)| {
            Ok((
                dup_at_least(t.as_fd(), fd_floor)?,
                dup_at_least(w.as_fd(), fd_floor)?,
            ))
        })
        .map_err(os_step(vpid, "creating the GPU gate channel"))?;
    let job = Job {
        id,
        vpid,
        imgdir_fd,
        chan_fd: chan_writer.as_raw_fd(),
        streamed: crate::stream::active().is_some(),
        gpus: plan.gpus.clone(),
        restored: restored.to_vec(),
        render: render.iter().map(|(&m, f)| (m, f.as_raw_fd())).collect(),
        dmabufs: dmabufs
            .iter()
            .map(|d| d.as_ref().map(|f| f.as_raw_fd()))
            .collect(),
    };
    let memfd = job
        .to_memfd()
        .and_then(|f| dup_at_least(f.as_fd(), fd_floor))
        .map_err(os_step(vpid, "writing the GPU memory job"))?;
    let slot = mailbox
        .post(real_pid, vpid, id, memfd.as_raw_fd())
        .ok_or_else(|| SessionError::State {
            pid: vpid,
            what: format!(
                "KFD image {id}: the GPU memory writer's board is full ({} KFD processes)",
                super::writer::SLOTS
            ),
        })?;
    if let Some(streamer) = crate::stream::active() {
        send_streamed_pages(&streamer, vpid, id, &plan.gpus, chan_task.as_fd())?;
    }
    Ok(Posted {
        slot,
        _memfd: memfd,
        dmabufs,
        _chan_writer: chan_writer,
        chan_task,
    })
}

/// libhsakmt's shared memory and semaphore, recreated when another
/// process of the thunk removed them (it does when it closes KFD) and the
/// image's process had them, and held open (numbered `fd_floor` or above)
/// until the task's files and mappings are restored: CRIU opens the task's
/// fds and mappings of them through these (`RestoreSession::held_file`),
/// so a name removed or replaced meanwhile by another ROCm program ending
/// or starting changes nothing.  Failures are logged; CRIU's open of the
/// file by its name then names it.
fn hold_thunk_files(vpid: i32, image: &KfdImage, fd_floor: RawFd) -> Vec<(PathBuf, OwnedFd)> {
    let shm = SharedMem {
        size: image.msg.shared_mem_size,
        magic: image.msg.shared_mem_magic,
        mode: image.msg.shared_mem_mode.unwrap_or(0),
        semaphore_mode: image.msg.semaphore_mode.unwrap_or(0),
    };
    let mut held = Vec::new();
    let mut keep = |path: &str, f: std::fs::File| match dup_at_least(f.as_fd(), fd_floor) {
        Ok(fd) => held.push((PathBuf::from(path), fd)),
        Err(e) => log::warn!("pid {vpid}: holding {path}: {e}"),
    };
    match shm.open_or_recreate(Path::new(HSAKMT_SHM)) {
        Ok(None) => return held,
        Ok(Some((f, created))) => {
            if created {
                log::info!(
                    "pid {vpid}: {HSAKMT_SHM} was missing: recreated ({} bytes, magic {:#x})",
                    shm.size,
                    shm.magic
                );
            }
            keep(HSAKMT_SHM, f);
        }
        Err(e) => log::warn!("pid {vpid}: recreating {HSAKMT_SHM}: {e}"),
    }
    match open_semaphore(
        HSAKMT_SEMAPHORE,
        Path::new(HSAKMT_SEMAPHORE_FILE),
        shm.semaphore_mode,
    ) {
        Ok((f, created)) => {
            if created {
                log::info!(
                    "pid {vpid}: {HSAKMT_SEMAPHORE_FILE} was missing: recreated the thunk's \
                     semaphore (value 1)"
                );
            }
            keep(HSAKMT_SEMAPHORE_FILE, f);
        }
        Err(e) => log::warn!("pid {vpid}: creating the thunk's semaphore: {e}"),
    }
    held
}

/// Streamed images: asks the image streamer for each GPU's pages file of
/// KFD image `id`, in the job's order, and hands each pipe to the GPU
/// memory writer over the gate channel `chan` at once (the job is posted
/// already).  The streamer serves one file at a time, so the next request
/// returns once the writer has read the last file whole; the task keeps no
/// copy of a pipe.
fn send_streamed_pages(
    streamer: &crate::stream::Streamer,
    vpid: i32,
    id: FileId,
    gpus: &[crate::plan::GpuWork],
    chan: BorrowedFd<'_>,
) -> Result<(), SessionError> {
    for g in gpus {
        let name = crate::pages::pages_image_name(id, g.user);
        let pipe = streamer
            .open_raw(&name)
            .map_err(os_step(
                vpid,
                format!("asking the image streamer for {name}"),
            ))?
            .ok_or_else(|| SessionError::State {
                pid: vpid,
                what: format!("the image streamer has no {name}"),
            })?;
        crate::os::fd::send_record_with_fd(chan, &g.user.0.to_le_bytes(), Some(pipe.as_fd()))
            .map_err(os_step(
                vpid,
                format!("handing {name} to the GPU memory writer"),
            ))?;
    }
    Ok(())
}

/// Whether `dir` holds pages files of KFD image `id` (`amdgpu-pages-<id>-*`).
fn has_pages_of(dir: &Path, id: FileId) -> bool {
    let prefix = format!("amdgpu-pages-{id}-");
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.filter_map(Result::ok).any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
    })
}

/// criu main, once every task passed its restorer's gate: every KFD image
/// that holds a process' state must belong to a task of the restore
/// (`tasks`: their pids in their namespaces), must have been restored
/// exactly once, in that task, and its memory confirmed and queues resumed
/// there (`outcomes`, from the writer's board).  Returns how many processes
/// were; an error names the image and the task.
pub fn check_outcomes(
    dir: &Path,
    tasks: &[i32],
    outcomes: &[JobOutcome],
) -> Result<usize, SessionError> {
    let ids = kfd_image_ids(dir).map_err(os_step(0, "listing the image directory"))?;
    let mut n = 0;
    for id in ids {
        let image =
            KfdImage::read(dir, id).map_err(|e| SessionError::core(0, "reading a KFD image", e))?;
        if image.msg.criu_rocm_reopen == Some(true) {
            continue;
        }
        let pid = image.msg.pid as i32;
        if !tasks.contains(&pid) {
            return Err(SessionError::State {
                pid,
                what: format!(
                    "KFD image {id} was saved from pid {pid}, which is no task of this restore"
                ),
            });
        }
        let jobs: Vec<&JobOutcome> = outcomes.iter().filter(|o| o.image == id).collect();
        let job = match jobs.as_slice() {
            [] => {
                return Err(SessionError::State {
                    pid,
                    what: format!("KFD image {id} was restored in no task"),
                })
            }
            [one] => one,
            _ => {
                return Err(SessionError::State {
                    pid,
                    what: format!("KFD image {id} was restored {} times", jobs.len()),
                })
            }
        };
        if job.vpid != pid {
            return Err(SessionError::State {
                pid: job.vpid,
                what: format!(
                    "KFD image {id} of pid {pid} was restored in pid {}",
                    job.vpid
                ),
            });
        }
        if let Err(why) = &job.result {
            return Err(SessionError::State {
                pid,
                what: format!("KFD image {id}: {why}"),
            });
        }
        n += 1;
    }
    if let Some(o) = outcomes
        .iter()
        .find(|o| !dir.join(crate::image::kfd_image_name(o.image)).exists())
    {
        return Err(SessionError::State {
            pid: o.vpid,
            what: format!("restored KFD image {}, which this directory lacks", o.image),
        });
    }
    Ok(n)
}

/// A render-node image whose GPU no KFD image restores and this host lacks.
fn render_without_gpu(id: FileId, user: GpuId) -> crate::validate::Refusal {
    crate::validate::Refusal::new(
        crate::image::render_image_name(id),
        Some(user),
        "gpu_id",
        "no KFD image of the process has this GPU and this host has no such GPU, so the \
         render node cannot be reopened",
    )
}

/// One KFD image's verdict in a dry run.
#[derive(Clone, Debug)]
pub struct DryRunEntry {
    pub id: FileId,
    /// The image's pid (`None`: the image could not be read).
    pub pid: Option<u32>,
    /// The GPU mapping, or why there is none.
    pub verdict: Result<String, String>,
}

/// What a dry run found: the shared validation's report (its refusals
/// are the restore's) and a verdict per KFD image.
#[derive(Clone, Debug)]
pub struct DryRun {
    pub report: crate::validate::Report,
    pub entries: Vec<DryRunEntry>,
}

/// Checks the images of `dir` as the restore does before it touches any
/// process or device ([`crate::validate::check_dir`], reading every BO's
/// bytes too), then against this host: every GPU has a host GPU under the
/// `KFD_*_CHECK` knobs, `/dev/kfd` and the chosen render nodes exist.
/// Reads files only.
pub fn dry_run(dir: &Path, opts: &RestoreOptions) -> Result<DryRun, SessionError> {
    let mut report = crate::validate::check_dir(dir, crate::validate::Depth::Contents)
        .map_err(os_step(0, format!("listing {}", dir.display())))?;
    // A required signature was verified before (`gpu_check`, the
    // restore's first check); here only its note.
    report.notes.extend(crate::validate::signature::note(
        dir,
        opts.verify_key.as_ref(),
    ));
    // A render-node fd of a GPU no KFD image restores is reopened on the
    // host GPU its recorded entry is placed on (`RenderGpus`), or without
    // one on the host's GPU of its id, which must exist (as in
    // `render_only_gpu`).
    let kfd_gpus: std::collections::BTreeSet<GpuId> = report
        .kfd
        .iter()
        .filter_map(|v| v.image.as_ref())
        .flat_map(|i| i.gpu_ids())
        .collect();
    if let Ok(host) = Topology::parse_sysfs(&opts.sysfs_nodes) {
        let ids = super::render_image_ids(dir)
            .map_err(os_step(0, format!("listing {}", dir.display())))?;
        let mut recorded = false;
        for id in ids {
            let Ok(img) = RenderImage::read(dir, id) else {
                continue;
            };
            let user = img.gpu_id();
            recorded |= img.msg.criu_rocm_gpu.is_some();
            if img.msg.criu_rocm_gpu.is_none()
                && !kfd_gpus.contains(&user)
                && host.gpu(user).is_none()
            {
                report.other.push(render_without_gpu(id, user));
            }
        }
        if recorded {
            if let Err(r) = opts.place_render_gpus(dir, &host, &opts.reachable_nodes()) {
                report.other.extend(r);
            }
        }
    }
    let entries = report
        .kfd
        .iter()
        .map(|v| {
            let verdict = match (&v.refusal, &v.image) {
                (Some(r), _) => Err(r.to_string()),
                (None, Some(_)) if v.is_reopen() => {
                    Ok("a further open of the process' /dev/kfd (no state of its own)".into())
                }
                (None, Some(image)) => check_one(v.id, image, opts),
                (None, None) => Err(format!("{}: not read", crate::image::kfd_image_name(v.id))),
            };
            DryRunEntry {
                id: v.id,
                pid: v.pid(),
                verdict,
            }
        })
        .collect();
    Ok(DryRun { report, entries })
}

/// The host side of a dry run, for an image the validation accepted.
fn check_one(id: FileId, image: &KfdImage, opts: &RestoreOptions) -> Result<String, String> {
    let (map, host): (GpuMap, Topology) =
        crate::match_image_to_host(image, &opts.sysfs_nodes, &opts.checks)
            .map_err(|e| e.to_string())?;
    let plan = plan_restore(image, &host, &map).map_err(|e| e.to_string())?;
    crate::validate::privdata::check_host(&kfd_image_name(id), image, &map, &host)
        .map_err(|r| r.to_string())?;
    let kfd = opts.dev_dir.join("kfd");
    stat_path(&kfd).map_err(|e| format!("{}: {e}", kfd.display()))?;
    for d in &plan.devices {
        let p = opts.render_path(d.render_minor);
        stat_path(&p).map_err(|e| format!("GPU {}: {}: {e}", d.actual, p.display()))?;
    }
    let bytes: u64 = image
        .msg
        .bo_entries
        .iter()
        .filter(|b| bo::has_contents(b.alloc_flags))
        .map(|b| b.size)
        .sum();
    Ok(format!(
        "{}; {} BO(s), {} of GPU memory",
        describe_map(&plan),
        image.msg.bo_entries.len(),
        human_bytes(bytes)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pages files of an id ≥ 2^31 carry it as upstream's `%d` prints
    /// it; the KFD image's fallback check must find them under that name.
    #[test]
    fn pages_of_ids_past_i32_are_found() {
        let d = crate::image::tests::tempdir();
        let id = FileId(0x8000_0001);
        let name = crate::pages::pages_image_name(id, crate::ids::GpuId(0x1a2b));
        assert_eq!(name, "amdgpu-pages--2147483647-1a2b.img");
        std::fs::write(d.join(&name), b"").unwrap();
        assert!(has_pages_of(&d, id));
        assert!(!has_pages_of(&d, FileId(0x7fff_ffff)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn node(chr: bool, dev: u64, ino: u64, rdev: u64) -> libc::stat {
        // SAFETY: libc::stat is plain data; all-zero is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = if chr { libc::S_IFCHR } else { libc::S_IFREG } | 0o666;
        st.st_dev = dev;
        st.st_ino = ino;
        st.st_rdev = rdev;
        st
    }

    #[test]
    fn a_container_reaches_host_nodes_by_identity_not_name() {
        let m = RenderMinor;
        // criu main: emulated nodes (files, by device and inode).
        let host = HostRenderNodes(vec![
            (m(130), node(false, 50, 1, 0)),
            (m(131), node(false, 51, 1, 0)),
            (m(132), node(false, 52, 1, 0)),
        ]);
        // The container keeps its dumped names 128 and 129, bound to the
        // host's 131 and 130; it was not given 132.
        let here = [
            (m(128), node(false, 51, 1, 0)),
            (m(129), node(false, 50, 1, 0)),
        ];
        let r = host.reachable(&here);
        assert_eq!(r, BTreeMap::from([(m(130), m(129)), (m(131), m(128))]));

        // Character devices by rdev, whatever the inode: a container's own
        // device file of a host node.
        let host = HostRenderNodes(vec![(m(128), node(true, 5, 7, 0xe280))]);
        let here = [(m(128), node(true, 99, 3, 0xe280))];
        assert_eq!(host.reachable(&here), BTreeMap::from([(m(128), m(128))]));

        // A node of the task's that criu main does not have counts under its
        // own name; one that criu main has under that name, as another
        // device, does not.
        let host = HostRenderNodes(vec![(m(128), node(true, 5, 7, 0xe280))]);
        let here = [
            (m(129), node(true, 5, 8, 0xe281)),
            (m(128), node(true, 5, 9, 0xe283)),
        ];
        assert_eq!(host.reachable(&here), BTreeMap::from([(m(129), m(129))]));
        assert!(HostRenderNodes::default().reachable(&[]).is_empty());
    }
}
