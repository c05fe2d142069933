//! The device model behind the transports: an emulated KFD (`/dev/kfd`)
//! and one amdgpu render node per GPU of the profile.  It knows no
//! transport: fd arguments are resolved by the [`FdResolver`] the
//! transport gives, answers go out through a [`Replier`].
//!
//! The state machine:
//! * `state`: processes, BOs, queues, events, parked waits; `state::svm`:
//!   a process' SVM ranges; `state::gem`: a render file's GEM objects, VM,
//!   contexts, BO lists and CS jobs;
//! * `vm`: the GPU VMs; `sdma`: the engine executing SDMA packets;
//!   `aql`: the CP model, the AQL packet processor of compute queues
//!   (barriers, kernel dispatches, vendor packets, the CP's queue errors);
//!   `shader`: the shader engine running dispatches' waves (the `gfx9`
//!   crate) on a thread of its own, outside the state lock;
//! * `live_sysfs`: what the live sysfs files show of the state;
//!   `activity`: the engines' busy time they show;
//! * `asic`: what amdgpu reports about each GPU; `dmabuf`: the emulated
//!   dma-bufs; `devcgroup`: the opener's device cgroup;
//! * `mem`: memfd, mapping, caller-memory and caller-fd backends.
//!
//! The ABI decode above it (each decodes an ioctl's arguments, runs the
//! operation on the state and encodes the answer):
//! * [`uapi`]: ioctl numbers, struct layouts, the mmap offset encoding;
//! * `kfd`, `criu`, `svm`: /dev/kfd; `render`, `gem`: the render nodes;
//!   `supervised`: the fd-returning ioctls of `kfd-emu supervise`;
//! * this module: the dispatch.
//!
//! All opens of a node share one sparse memfd (FUSE passthrough backing):
//! VRAM/GTT BOs live at their mmap offset in the render node's memfd,
//! doorbells, signal pages and MMIO pages at the offsets of
//! [`uapi::kfd_off`] in the /dev/kfd memfd.

mod activity;
mod aql;
mod asic;
mod criu;
mod devcgroup;
mod dmabuf;
pub use dmabuf::Files as DmabufFiles;
mod gem;
mod kfd;
mod live_sysfs;
mod mem;
mod render;
mod runtime;
mod sdma;
mod shader;
mod state;
mod supervised;
mod svm;
pub mod uapi;
mod vm;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use mem::{pull_fd, user_read, user_write};
use state::{Devices, Done, Gpu, Open, State};
pub use supervised::FdInstaller;
use uapi::{kfd as nr, sys, AsBytes};

/// A device node the emulator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Kfd,
    Render { minor: u32 },
}

/// The thread issuing a request, in the daemon's pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tid: u32,
    pub tgid: u32,
}

/// The answer to one ioctl: `Ok(out bytes)` (at most `out_size`) or
/// `Err(positive errno)`.
pub trait Replier: Send {
    fn reply(self: Box<Self>, r: Result<Vec<u8>, i32>);
    /// The transport's id of the request (FUSE `unique`), by which
    /// [`Emulator::interrupt`] finds a parked wait.  None: never
    /// interrupted.
    fn request_id(&self) -> Option<u64> {
        None
    }
}

/// Maps an fd of a process to the emulated open (`fh`) it refers to.
/// The transport provides it (it knows which files are its opens); the
/// model asks before it takes its lock.
pub trait FdResolver: Send + Sync {
    fn open_of(&self, tgid: u32, fd: i32) -> Result<u64, i32>;
}

/// Fds resolved before taking the state lock (resolution talks to the
/// transport, and an fd drop may release an open), and the emulator's
/// dma-buf the fd of GET_DMABUF_INFO or IMPORT_DMABUF is, if it is one.
struct Resolved(Vec<(i32, Result<u64, i32>)>, Option<Arc<dmabuf::Dmabuf>>);

impl Resolved {
    fn dmabuf(&self) -> Option<&dmabuf::Dmabuf> {
        self.1.as_deref()
    }
}

impl FdResolver for Resolved {
    fn open_of(&self, _tgid: u32, fd: i32) -> Result<u64, i32> {
        self.0
            .iter()
            .find(|(f, _)| *f == fd)
            .map_or(Err(libc::EBADF), |(_, r)| *r)
    }
}

struct Shared {
    st: Mutex<State>,
    /// Wakes the engine (new queue, new wait deadline, shutdown).
    wake: Condvar,
    /// Signalled when the engine's out-of-lock SDMA execution ends
    /// (`State::sdma_busy` back to None).
    quiet: Condvar,
    stop: AtomicBool,
    resolver: Box<dyn FdResolver>,
    devs: Arc<Devices>,
    /// The shader engine's work queue (its thread runs `shader::Engine::run`).
    shader: shader::Engine,
    /// Each GPU's shader ISA (when the shader engine runs it) and XCCs.
    targets: Vec<aql::Shaders>,
    /// The engines' busy time (`activity`).
    activity: activity::Activity,
}

/// The emulated devices; shared by all transport threads.
pub struct Emulator {
    shared: Arc<Shared>,
    /// The engine thread and the shader engine's.
    engine: Mutex<Vec<JoinHandle<()>>>,
    /// Supervised answers that did not reach their caller (`supervised`).
    replays: supervised::Replays,
}

/// Poll periods of the engine: short while rings move, backing off to
/// `IDLE_POLL` while SDMA queues exist but are idle, `NO_QUEUE_POLL` when
/// there is nothing to poll (only wait timeouts to serve).
const BUSY_POLL: Duration = Duration::from_micros(50);
const IDLE_POLL: Duration = Duration::from_millis(2);
const NO_QUEUE_POLL: Duration = Duration::from_millis(20);

/// Whether KFD request `n` may have the shader engine save waves, which it
/// does without the state lock: CRIU_OP PROCESS_INFO and UPDATE_QUEUE.
fn saves_waves(n: u32, input: &[u8]) -> bool {
    n == nr::UPDATE_QUEUE
        || n == nr::CRIU_OP
            && uapi::decode::<sys::kfd_ioctl_criu_args>(input).op == uapi::criu_op::PROCESS_INFO
}

fn send(done: Done) {
    for (r, v) in done {
        r.reply(v);
    }
}

/// Decodes the argument as `T` (zero-extended or truncated like KFD),
/// runs `f` on it and encodes the answer in `out_size` bytes.
fn with<T: AsBytes>(
    input: &[u8],
    out_size: usize,
    f: impl FnOnce(&mut T) -> state::R<()>,
) -> state::R<Vec<u8>> {
    let mut a = uapi::decode::<T>(input);
    f(&mut a)?;
    let mut out = uapi::encode(&a, out_size);
    // KFD copies its whole buffer back: a newer caller's fields past the
    // struct this version knows return as they came in.
    let (n, m) = (std::mem::size_of::<T>(), out.len().min(input.len()));
    if m > n {
        out[n..m].copy_from_slice(&input[n..m]);
    }
    Ok(out)
}

fn status_field(pid: u32, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
}

fn effective_caps(tid: u32) -> u64 {
    status_field(tid, "CapEff:")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

/// CAP_CHECKPOINT_RESTORE (40) or CAP_SYS_ADMIN (21) in the effective set.
fn may_checkpoint(tid: u32) -> bool {
    effective_caps(tid) & (1 << 40 | 1 << 21) != 0
}

/// CAP_SYS_ADMIN in the effective set.
fn sys_admin(tid: u32) -> bool {
    effective_caps(tid) & (1 << 21) != 0
}

/// The start time of process `pid` in clock ticks after boot
/// (`/proc/PID/stat` field 22), which with the pid names one process.
fn process_start(pid: u32) -> Option<u64> {
    start_in_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of a `/proc/PID/stat` line.  The command (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields
/// after its last ")" start with field 3.
fn start_in_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// The tracer of `pid` (`TracerPid:`, 0 for none); None when its status
/// cannot be read.
pub fn tracer_of(pid: u32) -> Option<u32> {
    status_field(pid, "TracerPid:").and_then(|v| v.parse().ok())
}

fn tgid_of(tid: u32) -> Option<u32> {
    status_field(tid, "Tgid:").and_then(|v| v.parse().ok())
}

impl Emulator {
    /// The devices of `profile`; `resolver` finds the open an fd argument
    /// (ACQUIRE_VM's `drm_fd`, ...) refers to (the transport's, or a
    /// table in in-process tests).
    pub fn new(
        profile: &crate::profile::Profile,
        resolver: Box<dyn FdResolver>,
    ) -> std::io::Result<Emulator> {
        let mut gpus = Vec::new();
        let system_mem = profile.cpus.iter().map(|c| c.mem_size).sum();
        for g in profile.gpus() {
            gpus.push(Gpu {
                id: g.gpu_id.0,
                minor: g.drm_render_minor.0,
                vram_size: g.vram_size,
                vram_public: g.vram_public,
                max_sdma_queues: (g.num_sdma_engines + g.num_sdma_xgmi_engines)
                    * g.num_sdma_queues_per_engine,
                sdma_engines: g.num_sdma_engines + g.num_sdma_xgmi_engines,
                num_gws: g.num_gws,
                per_process_xnack: matches!(g.gfx_target_version, 90010 | 90400..=90402),
                asic: asic::Asic::new(g, system_mem),
                mem: mem::Memfd::new(
                    &format!("kfd-emu-renderD{}", g.drm_render_minor.0),
                    uapi::RENDER_MEMFD_SIZE,
                )?,
                num_xcc: g.num_xcc.max(1),
                ctl_stack_size: kfd_abi::criu::ctl_stack_size(&g.cwsr_props()).unwrap_or(0),
                cwsr_size: kfd_abi::criu::cwsr_size(&g.cwsr_props()).unwrap_or(0),
            });
        }
        let devs = Arc::new(Devices {
            gpus,
            kfd: mem::Memfd::new("kfd-emu-kfd", uapi::kfd_off::MEMFD_SIZE)?,
            dmabufs: Default::default(),
            gem_change_handle: profile.gem_change_handle,
            kfd_minor: profile.kfd_minor_version,
        });
        let shared = Arc::new(Shared {
            st: Mutex::new(State::new(devs.clone())),
            wake: Condvar::new(),
            quiet: Condvar::new(),
            stop: AtomicBool::new(false),
            resolver,
            targets: devs
                .gpus
                .iter()
                .map(|g| aql::Shaders {
                    target: shader_target(g),
                    cus: shader::CuLayout::new(
                        g.num_xcc,
                        g.asic.shader_engines,
                        g.asic.sh_per_se,
                        g.asic.cu_bitmap(),
                        shader::WaveSlots::new(g.asic.simd_per_cu, g.asic.max_waves_per_simd),
                    ),
                })
                .collect(),
            activity: activity::Activity::new(
                &devs
                    .gpus
                    .iter()
                    .map(|g| g.num_xcc.max(1) as usize)
                    .collect::<Vec<_>>(),
            ),
            devs,
            shader: shader::Engine::default(),
        });
        let s2 = shared.clone();
        let engine = std::thread::Builder::new()
            .name("kfd-emu-engine".into())
            .spawn(move || engine_loop(&s2))?;
        let s3 = shared.clone();
        let shader = std::thread::Builder::new()
            .name("kfd-emu-shader".into())
            .spawn(move || s3.shader.run(&*s3))?;
        Ok(Emulator {
            shared,
            engine: Mutex::new(vec![engine, shader]),
            replays: Default::default(),
        })
    }

    /// How the dma-bufs `kfd-emu supervise` hands out are opened (the
    /// transport's; see `dmabuf::Files`).
    pub fn set_dmabuf_files(&self, files: Box<dyn DmabufFiles>) {
        self.shared.devs.dmabufs.set_files(files);
    }

    pub fn nodes(&self) -> Vec<NodeKind> {
        let mut v = vec![NodeKind::Kfd];
        v.extend(
            self.shared
                .devs
                .gpus
                .iter()
                .map(|g| NodeKind::Render { minor: g.minor }),
        );
        v
    }

    /// The memfd backing `node`.  Panics for a node [`Emulator::nodes`]
    /// did not list (a transport bug).
    pub fn backing_fd(&self, node: &NodeKind) -> BorrowedFd<'_> {
        match node {
            NodeKind::Kfd => self.shared.devs.kfd.fd(),
            NodeKind::Render { minor } => self
                .shared
                .devs
                .gpus
                .iter()
                .find(|g| g.minor == *minor)
                .unwrap_or_else(|| panic!("kfd-emu: no GPU has render minor {minor}"))
                .mem
                .fd(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Waits (releasing the lock meanwhile) until the engine is not moving
    /// bytes for any process of `leads` outside the lock.
    fn quiesce<'a>(&self, st: MutexGuard<'a, State>, leads: &[u32]) -> MutexGuard<'a, State> {
        self.shared
            .quiet
            .wait_while(st, |st| st.sdma_busy.is_some_and(|b| leads.contains(&b)))
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn open(&self, node: &NodeKind, caller: &Caller) -> Result<u64, i32> {
        let mut st = self.lock();
        match node {
            NodeKind::Kfd => {
                let start = process_start(caller.tgid);
                if !st.stale(caller.tgid, start) {
                    return st.open_kfd(caller.tgid, start);
                }
                // KFD finds a process by its mm: this is a new one.
                log::info!(
                    "kfd-emu: pid {}: a new process opens /dev/kfd before the release of the \
                     exited one with its pid arrived; ending that one now",
                    caller.tgid
                );
                st = self.quiesce(st, &[caller.tgid]);
                // Another thread of the new process may have ended it
                // while the lock was let go.
                let done = if st.stale(caller.tgid, start) {
                    st.end_stale(caller.tgid)
                } else {
                    Done::new()
                };
                let fh = st.open_kfd(caller.tgid, start);
                self.unlock_then_finish(st, done);
                fh
            }
            NodeKind::Render { minor } => {
                let gpu = self
                    .shared
                    .devs
                    .gpus
                    .iter()
                    .position(|g| g.minor == *minor)
                    .ok_or(libc::ENODEV)?;
                // The open of a character device the opener's device cgroup
                // denies fails in the VFS (devcgroup_inode_permission).
                if devcgroup::devices_list(caller.tgid)
                    .is_some_and(|l| !devcgroup::list_allows(&l, *minor))
                {
                    return Err(libc::EPERM);
                }
                Ok(st.open_render(gpu, sys_admin(caller.tid)))
            }
        }
    }

    /// An mmap of `len` bytes at `offset` through render open `fh` (trapped
    /// under `kfd-emu supervise`; FUSE passthrough never shows mmap):
    /// `drm_gem_mmap`'s answer, Ok when the kernel would map.
    pub fn render_mmap(&self, fh: u64, caller: &Caller, offset: u64, len: u64) -> Result<(), i32> {
        let r = self.lock().render_mmap(fh, offset, len);
        if let Err(e) = r {
            log::info!(
                "kfd-emu: pid {}: mmap of {len} bytes at offset {offset:#x} through render \
                 file {fh} refused ({}): {}",
                caller.tgid,
                std::io::Error::from_raw_os_error(e),
                match e {
                    libc::EACCES => {
                        "the file does not own the BO (drm_gem_mmap: drm_vma_node_is_allowed)"
                    }
                    libc::EPERM => "the GEM BO was made NO_CPU_ACCESS",
                    _ => "no BO starts there or the mapping is larger",
                }
            );
        }
        r
    }

    /// A trapped mmap of `len` bytes at `offset` of the file whose
    /// `(st_dev, st_ino)` is `file`: for a dma-buf the process exported
    /// (see `dmabuf`), the file to map instead (the dma-buf's window onto
    /// the BO's render memfd, a new fd of it) and the offset in it; None
    /// for any other file (the kernel maps it).  `writes_read_only` says
    /// whether the mmap is a writable shared mapping of a file opened
    /// read-only: asked of a dma-buf only, first, as do_mmap checks the
    /// file's mode before the dma-buf is asked anything (EACCES).
    pub fn dmabuf_mmap(
        &self,
        file: (u64, u64),
        caller: &Caller,
        (offset, len): (u64, u64),
        writes_read_only: impl FnOnce() -> bool,
    ) -> Option<Result<(OwnedFd, u64), i32>> {
        let devs = &self.shared.devs;
        let d = devs.dmabufs.lookup_id(file)?;
        if writes_read_only() {
            log::info!(
                "kfd-emu: pid {}: writable shared mmap of a read-only dma-buf (a BO of {} \
                 bytes of GPU {}) refused (EACCES)",
                caller.tgid,
                d.size,
                devs.gpus[d.source.gpu].id
            );
            return Some(Err(libc::EACCES));
        }
        let at = match d.mapped_at(offset, len)? {
            Ok(at) => at,
            Err(e) => {
                log::info!(
                    "kfd-emu: pid {}: mmap of {len} bytes at offset {offset:#x} of a dma-buf \
                     of {} bytes refused (EINVAL): past its end",
                    caller.tgid,
                    d.size
                );
                return Some(Err(e));
            }
        };
        let mem = &devs.gpus[d.source.gpu].mem;
        let window = devs
            .dmabufs
            .window(&d, mem.fd())
            .and_then(|w| w.try_clone_to_owned());
        Some(match window {
            Ok(w) => Ok((w, at)),
            Err(e) => {
                log::error!("kfd-emu: pid {}: dma-buf window: {e}", caller.tgid);
                Err(libc::ENOMEM)
            }
        })
    }

    /// The caller of parked request `id` (see [`Replier::request_id`]) on
    /// `node` got a signal.  A wait still parked leaves the model at once
    /// and is answered EINTR, so an auto-reset event signalled before the
    /// caller retries stays signalled for the retry.  A wait that is no
    /// longer parked was completed and its answer is being sent: it wins
    /// over the signal, as in KFD.  Returns whether the model answers
    /// (always, for /dev/kfd: only its waits are ever parked).
    pub fn interrupt(&self, node: &NodeKind, id: u64) -> bool {
        if *node != NodeKind::Kfd {
            return false;
        }
        let mut st = self.lock();
        let waiter = st.procs.values_mut().find_map(|p| {
            let i = p
                .waiters
                .iter()
                .position(|w| w.reply.request_id() == Some(id))?;
            Some(p.waiters.swap_remove(i))
        });
        drop(st);
        if let Some(w) = waiter {
            log::debug!("kfd-emu: wait of thread {} interrupted", w.tid);
            send(vec![w.finish(Err(libc::EINTR))]);
        }
        true
    }

    pub fn release(&self, fh: u64) {
        let mut st = self.lock();
        if let Some(&Open::Kfd { lead }) = st.opens.get(&fh) {
            // The last close frees the BOs the engine may be copying.
            st = self.quiesce(st, &[lead]);
        }
        let done = st.release(fh);
        self.unlock_then_finish(st, done);
    }

    /// Lets go of the lock, then sends the answers `done` holds and gives
    /// back the pages of the BOs freed under it (see [`State::take_freed`]),
    /// so that a freed range reads as zero before the freeing call answers.
    /// The engines' counts of a process that ended are forgotten under the
    /// lock, so that a later process with its pid starts from nothing.
    fn unlock_then_finish(&self, mut st: MutexGuard<'_, State>, done: Done) {
        for lead in st.take_ended() {
            self.shared.activity.forget(lead);
        }
        let freed = st.take_freed();
        drop(st);
        send(done);
        State::give_back(&self.shared.devs, freed);
    }

    /// Handles one ioctl; answers through `reply` now or later (a parked
    /// WAIT_EVENTS).
    #[allow(clippy::too_many_arguments)]
    pub fn ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        input: &[u8],
        out_size: u32,
        reply: Box<dyn Replier>,
    ) {
        let _ = arg;
        let kind = self.lock().opens.get(&fh).copied();
        let r = match kind {
            None => Err(libc::EBADF),
            Some(Open::Render { gpu, authenticated }) => {
                self.render_ioctl(fh, gpu, authenticated, caller, cmd, input, out_size)
            }
            Some(Open::Kfd { lead }) => {
                match self.kfd_ioctl(lead, caller, cmd, input, out_size as usize, reply) {
                    Some((reply, r)) => {
                        reply.reply(r);
                        return;
                    }
                    None => return,
                }
            }
        };
        reply.reply(r);
    }

    #[allow(clippy::too_many_arguments)]
    fn render_ioctl(
        &self,
        fh: u64,
        gpu: usize,
        authenticated: bool,
        caller: &Caller,
        cmd: u32,
        input: &[u8],
        out_size: u32,
    ) -> Result<Vec<u8>, i32> {
        if (cmd >> 8) & 0xff != u32::from(uapi::drm::IOCTL_TYPE) {
            return Err(libc::ENOTTY);
        }
        let out_size = out_size as usize;
        let n = cmd & 0xff;
        match n {
            uapi::drm::VERSION => render::version(caller, input, out_size),
            uapi::drm::GET_CLIENT => render::get_client(caller, authenticated, input, out_size),
            n if render::refused(n) => Err(libc::EACCES),
            uapi::drm::AMDGPU_INFO => {
                let asic = &self.shared.devs.gpus[gpu].asic;
                render::info(asic, caller, input, || self.lock().usage(gpu))?;
                Ok(vec![0; out_size])
            }
            uapi::drm::GEM_CLOSE
            | uapi::drm::PRIME_FD_TO_HANDLE
            | uapi::drm::AMDGPU_CTX
            | uapi::drm::AMDGPU_BO_LIST
            | uapi::drm::AMDGPU_CS
            | uapi::drm::AMDGPU_GEM_VA
            | uapi::drm::AMDGPU_WAIT_CS
            | uapi::drm::AMDGPU_GEM_USERPTR
            | uapi::drm::AMDGPU_GEM_CREATE
            | uapi::drm::AMDGPU_GEM_MMAP
            | uapi::drm::AMDGPU_GEM_METADATA
            | uapi::drm::AMDGPU_GEM_WAIT_IDLE
            | uapi::drm::AMDGPU_GEM_OP
            | uapi::drm::AMDGPU_GEM_LIST_HANDLES
            | uapi::drm::GEM_CHANGE_HANDLE => self.gem_ioctl(fh, gpu, caller, n, input, out_size),
            // Syncobjs, caps, scheduling, user queues: not modelled.
            _ => Err(libc::ENOTTY),
        }
    }

    /// The GEM/VM/CS ioctls of a render file (`gem`).  Fault injection
    /// (`--fail CS:...`) comes first, as the kernel's argument checks.
    fn gem_ioctl(
        &self,
        fh: u64,
        gpu: usize,
        caller: &Caller,
        n: u32,
        input: &[u8],
        out_size: usize,
    ) -> Result<Vec<u8>, i32> {
        let injected = crate::fault::check(crate::fault::drm_op(n)).err();
        if let Some(e) = injected {
            return self.gem_fault(fh, gpu, n, input, out_size, e);
        }
        if n == uapi::drm::GEM_CHANGE_HANDLE && !self.shared.devs.gem_change_handle {
            // Linux 7.1, 6.18.36 and 7.0.13 refuse every call.
            return Err(libc::EINVAL);
        }
        let dmabuf = if n == uapi::drm::PRIME_FD_TO_HANDLE {
            Some(self.dmabuf_arg(caller, input)?)
        } else {
            None
        };
        let mut st = self.lock();
        let resets = st.resets[gpu];
        let (i, o) = (input, out_size);
        match n {
            uapi::drm::GEM_CLOSE | uapi::drm::AMDGPU_BO_LIST | uapi::drm::AMDGPU_GEM_CREATE => {
                return self.gem_lifetime_ioctl(&mut st, fh, gpu, caller, n, i, o);
            }
            uapi::drm::AMDGPU_CS => return self.gem_cs(st, fh, gpu, caller, i, o),
            _ => {}
        }
        // A dma-buf of a GEM BO of this GPU is that BO.
        let own = dmabuf
            .as_ref()
            .filter(|d| d.source.gpu == gpu)
            .and_then(|d| st.gem_bo(gpu, d.source.offset));
        let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
        match n {
            uapi::drm::PRIME_FD_TO_HANDLE => with(i, o, |a: &mut sys::drm_prime_handle| {
                a.handle = match own {
                    Some(obj) => f.import_object(obj)?,
                    None => f.import(dmabuf.expect("resolved above"))?,
                };
                Ok(())
            }),
            uapi::drm::AMDGPU_CTX => {
                let out = gem::ctx(f, &uapi::decode(i), resets)?;
                let mut v = out.to_vec();
                v.resize(o, 0);
                Ok(v)
            }
            uapi::drm::AMDGPU_WAIT_CS => {
                let e = gem::wait_cs(f, &uapi::decode(i), self.has_ip(gpu))?;
                if e != 0 {
                    return Err(e);
                }
                Ok(vec![0u8; o])
            }
            _ => Self::gem_object_ioctl(f, caller, n, i, o),
        }
    }

    /// Whether GPU `gpu` has rings of IP type `ip` (`AMDGPU_HW_IP_*`).
    fn has_ip(&self, gpu: usize) -> impl Fn(u32) -> bool + '_ {
        let g = &self.shared.devs.gpus[gpu];
        move |ip: u32| match ip {
            state::gem::AMDGPU_HW_IP_GFX => g.asic.gfx_rings > 0,
            state::gem::AMDGPU_HW_IP_COMPUTE => g.asic.compute_rings > 0,
            state::gem::AMDGPU_HW_IP_DMA => g.asic.sdma_instances > 0,
            _ => false,
        }
    }

    /// The dma-buf PRIME_FD_TO_HANDLE names, resolved before the state
    /// lock: EBADF for no fd, dma_buf_get's EINVAL for one that is none.
    fn dmabuf_arg(&self, caller: &Caller, input: &[u8]) -> Result<Arc<dmabuf::Dmabuf>, i32> {
        let a: sys::drm_prime_handle = uapi::decode(input);
        let file = mem::pull_fd(caller.tgid, a.fd).map_err(|_| libc::EBADF)?;
        self.shared
            .devs
            .dmabufs
            .lookup(std::os::fd::AsFd::as_fd(&file))
            .ok_or(libc::EINVAL)
    }

    /// The render-file ioctls on one GEM object or the file's VM: GEM_MMAP,
    /// WAIT_IDLE, METADATA, OP, LIST_HANDLES, CHANGE_HANDLE, USERPTR, VA.
    fn gem_object_ioctl(
        f: &mut state::gem::RenderFile,
        caller: &Caller,
        n: u32,
        i: &[u8],
        o: usize,
    ) -> Result<Vec<u8>, i32> {
        match n {
            uapi::drm::AMDGPU_GEM_MMAP => gem::gem_mmap(f, i, o),
            uapi::drm::AMDGPU_GEM_WAIT_IDLE => gem::wait_idle(f, i, o),
            uapi::drm::AMDGPU_GEM_METADATA => gem::metadata(f, i, o),
            uapi::drm::AMDGPU_GEM_OP => with(i, o, |a| gem::gem_op(f, caller.tid, a)),
            uapi::drm::AMDGPU_GEM_LIST_HANDLES => {
                with(i, o, |a| gem::list_handles(f, caller.tid, a))
            }
            uapi::drm::GEM_CHANGE_HANDLE => with(
                i,
                o,
                |a: &mut kfd_abi::layout::gem618::drm_gem_change_handle| {
                    f.change_handle(a.handle, a.new_handle)
                },
            ),
            uapi::drm::AMDGPU_GEM_USERPTR => with(i, o, |a| gem::userptr(f, caller.tgid, a)),
            uapi::drm::AMDGPU_GEM_VA => {
                let top = asic::VM_SIZE - asic::VA_RESERVED_TOP;
                gem::gem_va(f, &uapi::decode(i), top)?;
                Ok(i[..o.min(i.len())].to_vec())
            }
            _ => unreachable!("dispatched by gem_ioctl"),
        }
    }

    /// An injected fault `e` of render-file ioctl `n` (`crate::fault`):
    /// most fail the call before it changes anything; some mean more.
    fn gem_fault(
        &self,
        fh: u64,
        gpu: usize,
        n: u32,
        input: &[u8],
        out_size: usize,
        e: i32,
    ) -> Result<Vec<u8>, i32> {
        // A status word of 1 and no error: busy (WAIT_IDLE) or timed out
        // (WAIT_CS) at the deadline.
        let busy = || {
            let mut o = vec![0u8; out_size];
            let k = 8.min(out_size);
            o[..k].copy_from_slice(&1u64.to_le_bytes()[..k]);
            Ok(o)
        };
        match (n, e) {
            // A GPU reset blamed on the submitting context.
            (uapi::drm::AMDGPU_CS, libc::ECANCELED) => {
                let a: sys::drm_amdgpu_cs_in = uapi::decode(input);
                let mut st = self.lock();
                st.resets[gpu] += 1;
                let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
                f.make_guilty(a.ctx_id);
                log::warn!(
                    "fault injection: GPU {gpu} reset; context {} guilty",
                    a.ctx_id
                );
                Err(libc::ECANCELED)
            }
            (uapi::drm::AMDGPU_GEM_WAIT_IDLE, libc::ETIME) => {
                let a: sys::drm_amdgpu_gem_wait_idle_in = uapi::decode(input);
                self.lock()
                    .render
                    .get(&fh)
                    .ok_or(libc::EBADF)?
                    .object(a.handle)?;
                busy()
            }
            (uapi::drm::AMDGPU_WAIT_CS, libc::ETIME | libc::ECANCELED) => {
                let a: sys::drm_amdgpu_wait_cs_in = uapi::decode(input);
                let mut st = self.lock();
                let f = st.render.get(&fh).ok_or(libc::EBADF)?;
                gem::wait_cs(f, &a, self.has_ip(gpu))?;
                if e == libc::ETIME {
                    return busy();
                }
                st.resets[gpu] += 1;
                let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
                f.fail(a.ctx_id, (a.ip_type, a.ring), a.handle, libc::ECANCELED);
                Err(libc::ECANCELED)
            }
            _ => Err(e),
        }
    }

    /// AMDGPU_CS: the submission checked under the state lock `st`, its IBs
    /// run by the SDMA engine without it; a hung IB is a job timeout and a
    /// GPU reset (the fence fails with ETIME).
    fn gem_cs(
        &self,
        mut st: MutexGuard<'_, State>,
        fh: u64,
        gpu: usize,
        caller: &Caller,
        i: &[u8],
        o: usize,
    ) -> Result<Vec<u8>, i32> {
        let g = &self.shared.devs.gpus[gpu];
        // amdgpu_cs_p2_ib: a ring marked no_user_submission takes no IB
        // from user space (EINVAL).
        let dma_user = g.asic.dma_user_submission;
        let has_ip = self.has_ip(gpu);
        let may_submit = |ip: u32| has_ip(ip) && (ip != state::gem::AMDGPU_HW_IP_DMA || dma_user);
        let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
        let job = gem::cs(f, caller.tid, &uapi::decode(i), g.asic.sdma.hw, may_submit)?;
        drop(st);
        // The bytes move without the state lock.
        let hang = job.ibs.into_iter().find_map(|ib| sdma::run_ib(ib).err());
        if let Some(h) = hang {
            log::warn!(
                "kfd-emu: GPU {} (render file {fh}): SDMA IB of context {} hung: {}; \
                 the job times out and the GPU is reset (fence error ETIME)",
                g.id,
                job.ctx,
                h.what
            );
            let mut st = self.lock();
            st.resets[gpu] += 1;
            if let Some(f) = st.render.get_mut(&fh) {
                f.fail(job.ctx, job.entity, job.seq, libc::ETIME);
            }
        }
        let mut v = job.seq.to_le_bytes().to_vec();
        v.resize(o, 0);
        Ok(v)
    }

    /// The render-file ioctls that make or drop references to GEM BOs
    /// (GEM_CREATE, GEM_CLOSE, BO_LIST): after them, BOs nothing refers
    /// to are freed.
    #[allow(clippy::too_many_arguments)]
    fn gem_lifetime_ioctl(
        &self,
        st: &mut State,
        fh: u64,
        gpu: usize,
        caller: &Caller,
        n: u32,
        i: &[u8],
        o: usize,
    ) -> Result<Vec<u8>, i32> {
        let r = match n {
            uapi::drm::AMDGPU_GEM_CREATE => {
                let plan = gem::create_plan(&uapi::decode(i))?;
                st.render.get(&fh).ok_or(libc::EBADF)?;
                let obj = st.gem_create(gpu, &plan)?;
                let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
                // The union's `out`: the handle, then padding.
                Ok(uapi::encode(&u64::from(f.create(obj)?), o))
            }
            uapi::drm::GEM_CLOSE => {
                let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
                with(i, o, |a: &mut sys::drm_gem_close| f.close(a.handle))
            }
            _ => {
                let f = st.render.get_mut(&fh).ok_or(libc::EBADF)?;
                let h = gem::bo_list(f, caller.tid, &uapi::decode(i))?;
                Ok(uapi::encode(&u64::from(h), o))
            }
        };
        st.sweep_gem();
        r
    }

    /// Resolves the fd arguments of `n` (ACQUIRE_VM's drm_fd, RESTORE's
    /// device buckets) before the state lock is taken.
    fn pre_resolve(&self, caller: &Caller, n: u32, input: &[u8]) -> Resolved {
        let mut fds = Vec::new();
        match n {
            nr::ACQUIRE_VM => {
                fds.push(uapi::decode::<sys::kfd_ioctl_acquire_vm_args>(input).drm_fd as i32)
            }
            nr::GET_DMABUF_INFO => fds
                .push(uapi::decode::<sys::kfd_ioctl_get_dmabuf_info_args>(input).dmabuf_fd as i32),
            nr::IMPORT_DMABUF => {
                fds.push(uapi::decode::<sys::kfd_ioctl_import_dmabuf_args>(input).dmabuf_fd as i32)
            }
            nr::CRIU_OP => {
                let a = uapi::decode::<sys::kfd_ioctl_criu_args>(input);
                if a.op == uapi::criu_op::RESTORE {
                    let cnt = a.num_devices.min(64) as usize;
                    let mut b = vec![0u8; cnt * uapi::priv_blob::DEVICE_BUCKET];
                    if mem::user_read(caller.tid, a.devices, &mut b).is_ok() {
                        for i in 0..cnt {
                            let d: sys::kfd_criu_device_bucket = uapi::nth(&b, i);
                            fds.push(d.drm_fd as i32);
                        }
                    }
                }
            }
            _ => {}
        }
        let dmabuf = match n {
            nr::GET_DMABUF_INFO | nr::IMPORT_DMABUF => self.own_dmabuf(caller, fds[0]),
            _ => None,
        };
        Resolved(
            fds.into_iter()
                .map(|fd| (fd, self.shared.resolver.open_of(caller.tgid, fd)))
                .collect(),
            dmabuf,
        )
    }

    /// The emulator's dma-buf the caller's `fd` is (None: a closed fd or
    /// another file).
    fn own_dmabuf(&self, caller: &Caller, fd: i32) -> Option<Arc<dmabuf::Dmabuf>> {
        let file = mem::pull_fd(caller.tgid, fd).ok()?;
        self.shared
            .devs
            .dmabufs
            .lookup(std::os::fd::AsFd::as_fd(&file))
    }

    fn kfd_ioctl(
        &self,
        lead: u32,
        caller: &Caller,
        cmd: u32,
        input: &[u8],
        out_size: usize,
        reply: Box<dyn Replier>,
    ) -> Option<state::Answer> {
        let n = cmd & 0xff;
        if let Some(e) = self.kfd_refusal(lead, caller, n, input) {
            return Some((reply, Err(e)));
        }
        if n == nr::CRIU_OP {
            // Tests only (kfd-emu run --hold): before any lock or state.
            crate::fault::hold(
                uapi::decode::<sys::kfd_ioctl_criu_args>(input).op,
                caller.tgid,
            );
        }
        let resolved = self.pre_resolve(caller, n, input);
        let mut done = Done::new();
        let mut st = self.lock();
        if n == nr::WAIT_EVENTS {
            let minor = self.shared.devs.kfd_minor;
            let r = kfd::wait_events(
                &mut st,
                minor,
                lead,
                caller,
                uapi::decode(input),
                out_size,
                reply,
            );
            if r.is_none() {
                self.shared.wake.notify_all();
            }
            return r;
        }
        if matches!(
            n,
            nr::FREE_MEMORY_OF_GPU | nr::DESTROY_QUEUE | nr::UPDATE_QUEUE | nr::CRIU_OP
        ) {
            // These free memory or change queues the engine may be
            // using, or need the queues quiet (checkpoint): wait for
            // the process' SDMA pass in flight (RESUME names another
            // process).
            let other = if n == nr::CRIU_OP {
                uapi::decode::<sys::kfd_ioctl_criu_args>(input).pid
            } else {
                lead
            };
            st = self.quiesce(st, &[lead, other]);
        }
        if saves_waves(n, input) {
            let (st, r) = if n == nr::UPDATE_QUEUE {
                self.update_queue(st, lead, input, out_size)
            } else {
                self.process_info(st, lead, caller, input, out_size)
            };
            self.shared.wake.notify_all();
            self.unlock_then_finish(st, done);
            return Some((reply, r));
        }
        let call = Call {
            lead,
            caller,
            input,
            out_size,
            resolved: &resolved,
        };
        let r = kfd_call(&mut st, n, call, &mut done);
        if matches!(n, nr::CREATE_QUEUE | nr::CRIU_OP) {
            self.shared.wake.notify_all();
        }
        // FREE_MEMORY_OF_GPU, or a RESTORE that failed, freed BOs.
        self.unlock_then_finish(st, done);
        Some((reply, r))
    }

    /// KFD's refusals of KFD request `n` before any state: a number
    /// outside the table, an fd another process opened (CRIU_OP by its
    /// tracer aside), CRIU_OP without the capability.
    fn kfd_refusal(&self, lead: u32, caller: &Caller, n: u32, input: &[u8]) -> Option<i32> {
        if nr::arg_size(n).is_none() || n >= nr::command_end(self.shared.devs.kfd_minor) {
            // Outside [AMDKFD_COMMAND_START, AMDKFD_COMMAND_END).
            return Some(libc::ENOTTY);
        }
        if caller.tgid != lead && !(n == nr::CRIU_OP && tracer_of(lead) == Some(caller.tid)) {
            return Some(libc::EBADF);
        }
        if n == nr::CRIU_OP && !may_checkpoint(caller.tid) {
            return Some(libc::EACCES);
        }
        // KFD would let the tracer restore into its tracee with the tracer's
        // memory and fds; CRIU never does that, and allowing it here would
        // hide a product bug (RESTORE must run inside the restored task).
        if n == nr::CRIU_OP
            && caller.tgid != lead
            && uapi::decode::<sys::kfd_ioctl_criu_args>(input).op == uapi::criu_op::RESTORE
        {
            return Some(libc::EBADF);
        }
        None
    }

    /// CRIU_OP PROCESS_INFO: evicts the process' queues under the lock,
    /// then, without it, has the shader engine save the waves of the
    /// dispatches in flight into their queues' context save areas (it
    /// takes the lock between its rounds), and takes the outcome.
    fn process_info<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        lead: u32,
        caller: &Caller,
        input: &[u8],
        out_size: usize,
    ) -> (MutexGuard<'a, State>, state::R<Vec<u8>>) {
        let mut a = uapi::decode::<sys::kfd_ioctl_criu_args>(input);
        let r = match criu::process_info(&mut st, lead, &mut a) {
            Ok(jobs) if !jobs.is_empty() => {
                let ids: Vec<u32> = jobs.iter().map(|j| j.queue).collect();
                drop(st);
                // Tests only (kfd-emu run --hold SAVE_WAVES): paused, unlocked.
                crate::fault::hold(crate::fault::SAVE_WAVES, caller.tgid);
                let outcomes = self.shared.shader.save(jobs);
                st = self.lock();
                criu::saved(&mut st, lead, &ids, outcomes)
            }
            r => r.map(drop),
        };
        log_criu_op(a.op, caller, &r);
        (st, r.map(|()| criu::answer(&a, input, out_size)))
    }

    /// UPDATE_QUEUE: changes the queue under the lock; when that unmaps a
    /// queue with a dispatch in flight, has the shader engine save its
    /// waves without the lock (as PROCESS_INFO does), then records them
    /// with the queue.
    fn update_queue<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        lead: u32,
        input: &[u8],
        out_size: usize,
    ) -> (MutexGuard<'a, State>, state::R<Vec<u8>>) {
        let mut job = None;
        let r = with(input, out_size, |a| {
            job = kfd::update_queue(&mut st, lead, a)?;
            Ok(())
        });
        if let Some(job) = job {
            let id = job.queue;
            drop(st);
            let outcome = self.shared.shader.save(vec![job]).pop();
            st = self.lock();
            if let Some(o) = outcome {
                kfd::update_queue_saved(&mut st, lead, id, o);
            }
        }
        (st, r)
    }

    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        self.shared.shader.stop();
        for h in self
            .engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = h.join();
        }
        let mut st = self.lock();
        let mut done = Done::new();
        for p in st.procs.values_mut() {
            for w in p.waiters.drain(..) {
                done.push(w.finish(Err(libc::EINTR)));
            }
        }
        drop(st);
        send(done);
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One line per CRIU op: tests show that a refused image reached no
/// RESTORE.
fn log_criu_op(op: u32, caller: &Caller, r: &state::R<()>) {
    log::info!(
        "kfd-emu: CRIU_OP {} by process {}: {}",
        criu::op_name(op),
        caller.tgid,
        r.as_ref()
            .map_or_else(|e| format!("errno {e}"), |()| "ok".into())
    );
}

/// One KFD request under the state lock: the process whose fd it came
/// on, who asks, its argument, the answer's size, and the fds its
/// argument names, resolved before the lock.
#[derive(Clone, Copy)]
struct Call<'a> {
    lead: u32,
    caller: &'a Caller,
    input: &'a [u8],
    out_size: usize,
    resolved: &'a Resolved,
}

impl<'a> Call<'a> {
    /// Its process, caller, argument and answer size.
    fn parts(self) -> (u32, &'a Caller, &'a [u8], usize) {
        (self.lead, self.caller, self.input, self.out_size)
    }
}

/// KFD request `n` (in the table; WAIT_EVENTS and PROCESS_INFO are served
/// apart), by family.
fn kfd_call(st: &mut State, n: u32, c: Call, done: &mut Done) -> state::R<Vec<u8>> {
    if n == nr::CRIU_OP {
        return criu_call(st, c, done);
    }
    memory_call(st, n, c)
        .or_else(|| queue_call(st, n, c))
        .or_else(|| event_call(st, n, c, done))
        .or_else(|| process_call(st, n, c))
        // A table entry without a function: KFD's answer.
        .unwrap_or(Err(libc::EINVAL))
}

/// The process' GPU memory: VMs, BOs, their mappings, dma-bufs, SVM
/// ranges and the memory policies (None: not one of these).
fn memory_call(st: &mut State, n: u32, c: Call) -> Option<state::R<Vec<u8>>> {
    let (lead, caller, i, o) = c.parts();
    let resolved = c.resolved;
    Some(match n {
        nr::EXPORT_DMABUF => with(i, o, |a| {
            kfd::export_dmabuf(st, lead, a)?;
            log::warn!(
                "kfd-emu: AMDKFD_IOC_EXPORT_DMABUF from process {lead}: a dma-buf fd \
                 needs `kfd-emu supervise`"
            );
            Err(libc::EOPNOTSUPP)
        }),
        nr::ACQUIRE_VM => with(i, o, |a| kfd::acquire_vm(st, lead, caller, resolved, a)),
        nr::ALLOC_MEMORY_OF_GPU => with(i, o, |a| kfd::alloc_memory(st, lead, caller, a)),
        nr::FREE_MEMORY_OF_GPU => with(i, o, |a| kfd::free_memory(st, lead, a)),
        nr::MAP_MEMORY_TO_GPU => with(i, o, |a| kfd::map_memory(st, lead, caller, a, true)),
        // UNMAP's struct is MAP's (kfd-abi asserts both layouts).
        nr::UNMAP_MEMORY_FROM_GPU => with(i, o, |a| kfd::map_memory(st, lead, caller, a, false)),
        nr::AVAILABLE_MEMORY => with(i, o, |a| kfd::available_memory(st, lead, a)),
        nr::SET_XNACK_MODE => with(i, o, |a| kfd::set_xnack(st, lead, a)),
        nr::SET_MEMORY_POLICY => with(i, o, |a| kfd::set_memory_policy(st, lead, a)),
        nr::SET_SCRATCH_BACKING_VA => with(i, o, |a| kfd::set_scratch_backing_va(st, lead, a)),
        nr::GET_DMABUF_INFO => with(i, o, |a: &mut sys::kfd_ioctl_get_dmabuf_info_args| {
            let d = kfd::dmabuf_arg(resolved, resolved.dmabuf(), caller, a.dmabuf_fd)?;
            kfd::get_dmabuf_info(st, lead, d, a)
        }),
        nr::IMPORT_DMABUF => with(i, o, |a: &mut sys::kfd_ioctl_import_dmabuf_args| {
            let d = kfd::dmabuf_arg(resolved, resolved.dmabuf(), caller, a.dmabuf_fd)?;
            kfd::import_dmabuf(st, lead, d, a)
        }),
        nr::SVM => match st.procs.get_mut(&lead) {
            Some(p) => svm::ioctl(p, i, o),
            None => Err(libc::ESRCH),
        },
        _ => return None,
    })
}

/// The process' user-mode queues (None: not a queue request).
fn queue_call(st: &mut State, n: u32, c: Call) -> Option<state::R<Vec<u8>>> {
    let (lead, caller, i, o) = c.parts();
    Some(match n {
        nr::CREATE_QUEUE => {
            // KFD 1.17's sdma_engine_id, past the 1.11 struct.
            let at = uapi::queue_type::SDMA_ENGINE_ID_AT;
            let engine = i
                .get(at..at + 4)
                .filter(|_| st.devs.kfd_minor >= 17)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()));
            with(i, o, |a| kfd::create_queue(st, lead, a, engine))
        }
        nr::DESTROY_QUEUE => with(i, o, |a| kfd::destroy_queue(st, lead, a)),
        nr::SET_CU_MASK => with(i, o, |a| kfd::set_cu_mask(st, lead, caller, a)),
        nr::GET_QUEUE_WAVE_STATE => with(i, o, |a| kfd::get_queue_wave_state(st, lead, caller, a)),
        nr::ALLOC_QUEUE_GWS => with(i, o, |a| kfd::alloc_queue_gws(st, lead, a)),
        _ => return None,
    })
}

/// Events and the SMI event fd (None: not an event request; WAIT_EVENTS
/// is served before).
fn event_call(st: &mut State, n: u32, c: Call, done: &mut Done) -> Option<state::R<Vec<u8>>> {
    let (lead, _, i, o) = c.parts();
    Some(match n {
        nr::CREATE_EVENT => with(i, o, |a| kfd::create_event(st, lead, a)),
        nr::DESTROY_EVENT => with(i, o, |a: &mut sys::kfd_ioctl_destroy_event_args| {
            kfd::destroy_event(st, lead, a.event_id, done)
        }),
        nr::SET_EVENT => with(i, o, |a: &mut sys::kfd_ioctl_set_event_args| {
            kfd::set_event(st, lead, a.event_id, done)
        }),
        nr::RESET_EVENT => with(i, o, |a: &mut sys::kfd_ioctl_reset_event_args| {
            kfd::reset_event(st, lead, a.event_id)
        }),
        nr::SMI_EVENTS => with(i, o, |a| kfd::smi_events(st, lead, a)),
        _ => return None,
    })
}

/// The version, the process' apertures, clocks and tile configuration,
/// its runtime and trap handler, the debugger (None: none of these).
fn process_call(st: &mut State, n: u32, c: Call) -> Option<state::R<Vec<u8>>> {
    let (lead, caller, i, o) = c.parts();
    Some(match n {
        nr::GET_VERSION => with(i, o, |a| kfd::get_version(st, a)),
        nr::RUNTIME_ENABLE => with(i, o, |a| runtime::runtime_enable(st, lead, a)),
        nr::DBG_TRAP => with(i, o, |a| runtime::dbg_trap(st, caller, a)),
        nr::GET_PROCESS_APERTURES_NEW => with(i, o, |a| kfd::apertures_new(st, lead, caller, a)),
        nr::GET_CLOCK_COUNTERS => with(i, o, |a| kfd::clock_counters(st, lead, a)),
        nr::GET_PROCESS_APERTURES => with(i, o, |a| kfd::apertures_old(st, lead, a)),
        // The deprecated debugger interface is gone from KFD.
        nr::DBG_FIRST..=nr::DBG_LAST => Err(libc::EPERM),
        nr::GET_TILE_CONFIG => with(i, o, |a| kfd::get_tile_config(st, lead, caller, a)),
        nr::SET_TRAP_HANDLER => with(i, o, |a| kfd::set_trap_handler(st, lead, a)),
        _ => return None,
    })
}

/// CRIU_OP's CHECKPOINT, UNPAUSE, RESTORE and RESUME (PROCESS_INFO is
/// served before).
fn criu_call(st: &mut State, c: Call, done: &mut Done) -> state::R<Vec<u8>> {
    let (lead, caller, i, o) = c.parts();
    let resolved = c.resolved;
    let a = uapi::decode::<sys::kfd_ioctl_criu_args>(i);
    let r = match a.op {
        uapi::criu_op::CHECKPOINT => criu::checkpoint(st, lead, caller, &a),
        uapi::criu_op::UNPAUSE => criu::unpause(st, lead),
        uapi::criu_op::RESTORE => criu::restore(st, lead, caller, resolved, &a),
        uapi::criu_op::RESUME => criu::resume(st, caller.tid, a.pid, done),
        _ => Err(libc::EINVAL),
    };
    log_criu_op(a.op, caller, &r);
    r.map(|()| criu::answer(&a, i, o))
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Clears `State::sdma_busy` when an out-of-lock execution ends, even by
/// a panic (an ioctl waiting in `quiesce` must not wait forever).
struct Busy<'a>(&'a Shared);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.lock().sdma_busy = None;
        self.0.quiet.notify_all();
    }
}

/// One pass of the SDMA engine over every process: packets are planned
/// under the state lock, their bytes moved without it, the results
/// committed under it (see `sdma`).  Returns whether any packet ran.
fn sdma_pass(sh: &Shared) -> bool {
    let leads: Vec<u32> = sh.lock().procs.keys().copied().collect();
    let mut worked = false;
    for lead in leads {
        if sh.stop.load(Ordering::SeqCst) {
            break;
        }
        let mut st = sh.lock();
        let ips: Vec<asic::IpVersion> = sh.devs.gpus.iter().map(|g| g.asic.sdma.hw).collect();
        let Some(work) = st.procs.get(&lead).map(|p| sdma::plan(p, &ips)) else {
            continue;
        };
        if work.is_empty() {
            continue;
        }
        st.sdma_busy = Some(lead);
        drop(st);
        let busy = Busy(sh);
        let result = sdma::execute(work);
        for (gpu, took) in result.iter().map(sdma::QueueDone::took) {
            sh.activity.sdma_ran(lead, gpu, took);
        }
        let mut done = Done::new();
        let mut st = sh.lock();
        if let Some(p) = st.procs.get_mut(&lead) {
            worked |= sdma::commit(p, result, &mut done);
        }
        drop(st);
        drop(busy);
        send(done);
    }
    worked
}

/// The shader ISA of a GPU the shader engine runs: gfx908 (GC 9.4.1), gfx90a
/// (GC 9.4.2) and gfx942 (GC 9.4.3).
fn shader_target(g: &Gpu) -> Option<gfx9::Target> {
    match g.gc_version() {
        (9, 4, 1) => Some(gfx9::Target::Gfx908),
        (9, 4, 2) => Some(gfx9::Target::Gfx90a),
        (9, 4, 3) => Some(gfx9::Target::Gfx942),
        _ => None,
    }
}

impl shader::Host for Shared {
    fn refresh(&self, keys: &[shader::JobKey]) -> Vec<shader::Refresh> {
        let st = self.lock();
        keys.iter()
            .map(|k| match st.procs.get(&k.lead) {
                Some(p) if p.queues.get(&k.queue).is_some_and(|q| q.aql.running) => {
                    if p.evicted() {
                        shader::Refresh::Paused
                    } else {
                        shader::Refresh::Live(p.gpu_range(k.gpu, 0, aql::VA_TOP))
                    }
                }
                _ => shader::Refresh::Gone,
            })
            .collect()
    }

    /// KFD's handling of an SQ message interrupt: the low 24 bits of the
    /// data name the event (kfd_signal_event_interrupt).
    fn interrupt(&self, key: &shader::JobKey, data: &[u32]) {
        let mut done = Done::new();
        let mut st = self.lock();
        if let Some(p) = st.procs.get_mut(&key.lead) {
            for d in data {
                p.trap(d & 0xff_ffff, &mut done);
            }
        }
        drop(st);
        send(done);
    }

    fn finish(&self, key: &shader::JobKey, outcome: &shader::Outcome) {
        let mut done = Done::new();
        let mut st = self.lock();
        if let Some(p) = st.procs.get_mut(&key.lead) {
            aql::finish(p, key, outcome, &mut done);
        }
        drop(st);
        send(done);
        self.wake.notify_all();
    }

    fn busy(&self, start: Instant, end: Instant, r: &activity::Round) {
        self.activity.shader_round(start, end, r);
    }
}

fn engine_loop(sh: &Shared) {
    let mut idle = BUSY_POLL;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let worked = sdma_pass(sh);
        let mut st = sh.lock();
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut done = Done::new();
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut any_sdma = false;
        let mut worked = worked;
        let mut launches = Vec::new();
        let mut invalidate = Vec::new();
        for p in st.procs.values_mut() {
            any_sdma |= !p.evicted() && p.queues.values().any(|q| q.is_sdma() && !q.halted);
            let a = aql::pass(p, &sh.targets, &mut done);
            worked |= a.worked;
            launches.extend(a.launches);
            invalidate.extend(a.invalidate.into_iter().map(|g| (p.lead, g)));
            // A queue waiting on a barrier or a header is polled like SDMA.
            any_sdma |= a.waiting;
            if let Some(d) = p.expire_waiters(now, &mut done) {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        idle = if worked {
            BUSY_POLL
        } else {
            (idle * 2).min(IDLE_POLL)
        };
        let mut sleep = if any_sdma { idle } else { NO_QUEUE_POLL };
        if let Some(d) = next {
            sleep = sleep.min(d.saturating_duration_since(now));
        }
        sh.shader.submit(launches, invalidate);
        if done.is_empty() {
            let _unused = sh.wake.wait_timeout(st, sleep);
        } else {
            drop(st);
            send(done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_whatever_the_command() {
        let tail = "S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 4242 19 20";
        assert_eq!(start_in_stat(&format!("77 (sleep) {tail}")), Some(4242));
        assert_eq!(start_in_stat(&format!("77 (a) (b c) {tail}")), Some(4242));
        assert_eq!(start_in_stat("77 (cut off) S 1 2"), None);
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f: Vec<&str> = me.split_whitespace().collect();
        // This test binary's name has no spaces: field 22 is the 22nd word.
        assert_eq!(start_in_stat(&me), f[21].parse().ok());
        assert_eq!(process_start(std::process::id()), f[21].parse().ok());
    }
}
