//! Writing restored BO contents back from a helper process beside CRIU's
//! restorer, and the gate each restored task passes before it may run.
//!
//! A restored task recreates its KFD process at its files, well before
//! CRIU's restorer reads the task's CPU memory in.  A copy inside the task
//! would have to end before the restorer unmaps the task's code, so the two
//! kinds of memory would be restored one after the other.  Instead criu main
//! starts a helper process, the writer, when the restore begins; each task,
//! right after RESTORE, posts a job on a board in shared memory: its real pid
//! and the number of a memfd describing the copy (the BOs' new offsets, which
//! of its fds reach which GPU, which hold dmabufs, and its end of a gate
//! channel).  The writer takes those fds with `pidfd_getfd` and marks the
//! job taken (the task keeps them open until then, then goes on to its
//! restorer) and copies on a thread of its own.
//!
//! The gate.  Each task with a KFD process holds one end of a
//! `SOCK_SEQPACKET` socket pair, the writer the other.  In CRIU's restorer,
//! once the task's own memory is in place and before it can return to its
//! code, the task (criu/pie/gpu-gate.c) waits on its end for the writer's
//! verdict: "written and verified", or why not.  On "written" it resumes its
//! own queues (KFD's `CRIU_OP` `RESUME` on its own `/dev/kfd`) and reports
//! the result back; on anything else it exits.  The channel's end-of-file is
//! the writer's death: the writer is the only holder of its end (the task
//! closes its copy once the writer took it), so a writer killed, or dying
//! with criu main (`PDEATHSIG`), is seen at once by every task at its gate.
//! The task's reports land on the board, where criu main checks every
//! task's outcome ([`Writer::settle`]) before it lets any task go.
//!
//! Before the gate, a task waiting for the writer to take its fds watches
//! the writer through criu's `/proc`: a `/proc/<pid>` directory fd stops
//! answering once that process is gone, whatever pid comes next.
//!
//! The writer is this program executed again in a helper mode
//! ([`WRITER_MODE`], [`writer_main`]) by [`os::process::spawn_self`], so it
//! runs in a process image of its own, with the C library's state its own.
//! criu main's child is a shim without an exit signal that only makes raw
//! system calls, waits for the writer and ends as it ended: CRIU's SIGCHLD
//! handler (which aborts the restore on any child's exit) never hears of
//! it, and criu main reaps it explicitly, before CRIU waits for its tasks at
//! their final `rt_sigreturn` with `wait4(-1, __WALL)`.  (The writer itself
//! cannot be that child: `execve` gives a process its exit signal back.)
//! The writer gets the board's memfd, the copy settings and CRIU's log fd;
//! it dies with the shim, the shim with criu main (`PDEATHSIG`).  It is a
//! process rather than a thread of criu main because criu main must stay
//! single threaded: it calls `setns(CLONE_NEWNS)` later.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use kfd_abi::exit;

use super::{gpu_jobs, log_gpu_stats, HelperLog, SessionError};
use crate::copy::{restore_contents_encoded, GpuStats};
use crate::env::EnginePolicy;
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, KfdImage};
#[cfg(doc)]
use crate::os;
use crate::os::fd::{
    memfd, pidfd_getfd, recv_record, recv_record_with_fd, send_record, seqpacket_pair, Received,
};
use crate::os::file::ProcDir;
use crate::os::futex;
use crate::os::process::{self, pidfd_open, ExitStatus};
use crate::os::shared::{Shared, SharedState};
use crate::pages::ContentHash;
use crate::plan::{BoBucket, GpuWork};

/// Jobs the board holds: KFD processes one restore can bring back (the
/// validation refuses images of more, so that a dump of more fails).
pub const SLOTS: usize = crate::validate::MAX_KFD_PROCESSES;
/// How long a task waits for the writer to take its fds.
const TAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// A job's first word.
const MAGIC: u64 = u64::from_le_bytes(*b"CRGPUJB3");
/// Word for "no fd" / "no limit".
const NONE: u64 = u64::MAX;
/// The writer's name in `/proc/<pid>/comm` (at most 15 bytes).
pub const WRITER_COMM: &str = "criu-rocm-gpuwr";
/// `argv[1]` of this program started as the GPU memory writer.
pub const WRITER_MODE: &str = "--criu-rocm-gpu-writer";
/// The fd number the writer finds the board's memfd at, then CRIU's log.
const BOARD_FD: RawFd = 3;
const LOG_FD: RawFd = 4;

/// Slot states (a zeroed slot is free).  A job is posted, then taken (the
/// writer holds its fds) or refused (it could not take them); a taken job
/// is written (contents verified, the task told) or failed (the task told
/// why); a written job ends resumed (the task restarted its queues), or
/// resume-failed or lost (the task said it could not, or ended silently).
const POSTING: u32 = 1;
const POSTED: u32 = 2;
const TAKEN: u32 = 3;
const WRITTEN: u32 = 4;
const RESUMED: u32 = 5;
const FAILED: u32 = 6;
const REFUSED: u32 = 7;
const LOST: u32 = 8;
const RESUME_FAILED: u32 = 9;

/// Whether a slot's job has its outcome.
fn settled(state: u32) -> bool {
    matches!(state, RESUMED | FAILED | REFUSED | LOST | RESUME_FAILED)
}

/// Bytes of a failed job's error kept on the board for criu main (more
/// than a gate verdict carries: criu main logs it whole).
const WHY_LEN: usize = 512;

/// The gate's records, as `criu/include/gpu-gate.h` lays them out: the
/// writer's verdict (`struct gpu_gate_verdict`: magic, status (0 or a
/// positive errno), why, NUL padded) and the task's report (`struct
/// gpu_gate_report`: magic, status of its RESUME).
pub mod gate {
    /// `GPU_GATE_MAGIC`.
    pub const MAGIC: u32 = 0x4154_4747;
    /// `GPU_GATE_WHY_LEN`.
    pub const WHY_LEN: usize = 240;
    /// `sizeof(struct gpu_gate_verdict)`.
    pub const VERDICT_LEN: usize = 8 + WHY_LEN;
    /// `sizeof(struct gpu_gate_report)`.
    pub const REPORT_LEN: usize = 8;

    /// A verdict record: `status` 0 (written and verified) or an errno.
    pub fn verdict(status: u32, why: &str) -> [u8; VERDICT_LEN] {
        let mut b = [0u8; VERDICT_LEN];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&status.to_le_bytes());
        let mut n = why.len().min(WHY_LEN - 1);
        while !why.is_char_boundary(n) {
            n -= 1;
        }
        b[8..8 + n].copy_from_slice(&why.as_bytes()[..n]);
        b
    }

    /// The status of a report record; `None` when it is not one.
    pub fn report_status(b: &[u8]) -> Option<u32> {
        if b.len() != REPORT_LEN || b[..4] != MAGIC.to_le_bytes() {
            return None;
        }
        Some(u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")))
    }

    /// A report record (what the restorer sends; for tests).
    pub fn report(status: u32) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..].copy_from_slice(&status.to_le_bytes());
        b
    }
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    real_pid: AtomicI32,
    vpid: AtomicI32,
    memfd: AtomicI32,
    /// The KFD image the job restores.
    image: AtomicU32,
    /// Why the job failed (UTF-8, NUL padded), written before its state.
    why: [AtomicU8; WHY_LEN],
}

impl Slot {
    /// Records why the job failed and sets `state`.
    fn fail(&self, state: u32, why: &str) {
        let mut n = why.len().min(WHY_LEN);
        while !why.is_char_boundary(n) {
            n -= 1;
        }
        for (i, b) in self.why.iter().enumerate() {
            b.store(
                why.as_bytes()
                    .get(i)
                    .copied()
                    .filter(|_| i < n)
                    .unwrap_or(0),
                Ordering::Relaxed,
            );
        }
        self.state.store(state, Ordering::Release);
    }

    fn why(&self) -> String {
        let bytes: Vec<u8> = self
            .why
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .take_while(|&b| b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[repr(C)]
struct Board {
    /// Bumped, and woken, on every change someone may wait for.
    seq: AtomicU32,
    stop: AtomicU32,
    /// Set by the writer as it ends, so that no task waits for it in vain.
    gone: AtomicU32,
    /// Slots handed out so far.
    used: AtomicU32,
    /// The writer's pid in criu main's pid namespace.
    writer: AtomicI32,
    /// The writer's parent (criu main's shim of it), in criu main's
    /// namespace.
    parent: AtomicI32,
    /// Set by the writer once it is named (tasks check its name).
    ready: AtomicU32,
    slots: [Slot; SLOTS],
}

// SAFETY: atomics only (and arrays of them), all valid when zeroed; no
// pointers.
unsafe impl SharedState for Board {}

/// A process watched through a `/proc` directory fd: once the process is
/// gone, reads through the fd fail (a new process with the same pid has a
/// directory of its own).
struct Watched {
    dir: ProcDir,
}

impl Watched {
    /// Opens `<pid>` in `proc` (a `/proc` where `pid` is valid) and checks
    /// that it is named `comm` and is a child of `parent`.
    fn open(proc: BorrowedFd<'_>, pid: i32, comm: &str, parent: i32) -> io::Result<Watched> {
        let w = Watched {
            dir: ProcDir::open(proc, pid)?,
        };
        let stat = w.dir.stat()?;
        let name = stat
            .split_once(" (")
            .and_then(|(_, r)| r.rsplit_once(") "))
            .map(|(c, _)| c);
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if name != Some(comm) || ppid != Some(parent) {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(w)
    }

    /// Whether the process still runs (not gone, not a zombie).
    fn alive(&self) -> bool {
        match self.dir.stat() {
            Ok(s) => !matches!(
                s.rsplit_once(") ").and_then(|(_, r)| r.chars().next()),
                Some('Z' | 'X' | 'x') | None
            ),
            Err(_) => false,
        }
    }
}

/// The board, mapped shared in criu main before any task exists, so every
/// task (forked from criu main or from a task) and the writer see it.
#[derive(Clone, Copy)]
pub struct Mailbox {
    board: &'static Board,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("writer", &self.board.writer.load(Ordering::Relaxed))
            .field("used", &self.board.used.load(Ordering::Relaxed))
            .finish()
    }
}

impl Mailbox {
    #[cfg(test)]
    fn create() -> io::Result<Self> {
        Ok(Mailbox {
            board: Shared::<Board>::create(c"criu-rocm-gpu-board")?.leak(),
        })
    }

    fn board(&self) -> &'static Board {
        self.board
    }

    fn bump(&self) {
        let b = self.board();
        b.seq.fetch_add(1, Ordering::AcqRel);
        futex::wake(&b.seq);
    }

    fn used(&self) -> &[Slot] {
        let b = self.board();
        &b.slots[..(b.used.load(Ordering::Acquire) as usize).min(SLOTS)]
    }

    /// In a restored task: posts a job (the task's real pid, its vpid, the
    /// KFD image and the fd number of the job's memfd).  `None` when the
    /// board is full.
    pub fn post(&self, real_pid: i32, vpid: i32, image: FileId, memfd: RawFd) -> Option<usize> {
        let b = self.board();
        let i = b.used.fetch_add(1, Ordering::AcqRel) as usize;
        if i >= SLOTS {
            return None;
        }
        let s = &b.slots[i];
        s.state.store(POSTING, Ordering::Release);
        s.real_pid.store(real_pid, Ordering::Relaxed);
        s.vpid.store(vpid, Ordering::Relaxed);
        s.image.store(image.0, Ordering::Relaxed);
        s.memfd.store(memfd, Ordering::Relaxed);
        s.state.store(POSTED, Ordering::Release);
        self.bump();
        Some(i)
    }

    /// In a restored task: waits until the writer holds the fds of job
    /// `slot` (so the task may close its own).  `proc` is criu's `/proc`,
    /// through which the task sees the writer die.
    pub fn wait_taken(
        &self,
        slot: usize,
        vpid: i32,
        proc: Option<BorrowedFd<'_>>,
    ) -> Result<(), SessionError> {
        let b = self.board();
        let s = &b.slots[slot];
        let writer = b.writer.load(Ordering::Acquire);
        let gone = |how: &str| SessionError::State {
            pid: vpid,
            what: format!(
                "the GPU memory writer (pid {writer}) {how} before it took the task's GPU files"
            ),
        };
        // The writer ran, named, before any task existed: not finding it
        // (its shim reaps it at once) means it died.
        let watched = match proc {
            Some(proc) => Some(
                Watched::open(proc, writer, WRITER_COMM, b.parent.load(Ordering::Acquire))
                    .map_err(|_| gone("died"))?,
            ),
            None => None,
        };
        let start = Instant::now();
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            match s.state.load(Ordering::Acquire) {
                POSTING | POSTED => {}
                REFUSED => {
                    return Err(SessionError::State {
                        pid: vpid,
                        what: format!(
                            "the GPU memory writer could not take the task's GPU files: {}",
                            s.why()
                        ),
                    })
                }
                // A failed copy is the gate's and criu main's to report.
                _ => return Ok(()),
            }
            if b.gone.load(Ordering::Acquire) != 0 {
                return Err(gone("ended"));
            }
            if watched.as_ref().is_some_and(|w| !w.alive()) {
                return Err(gone("died"));
            }
            if start.elapsed() > TAKE_TIMEOUT {
                return Err(SessionError::State {
                    pid: vpid,
                    what: format!(
                        "the GPU memory writer (pid {writer}) did not take the task's GPU files \
                         within {} s",
                        TAKE_TIMEOUT.as_secs()
                    ),
                });
            }
            futex::wait(&b.seq, seq, Duration::from_millis(100));
        }
    }
}

/// What a task tells the writer, as little-endian u64 words in a memfd.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub id: FileId,
    pub vpid: i32,
    /// The task's fd of the image directory.
    pub imgdir_fd: RawFd,
    /// The task's fd of the writer's end of its gate channel.
    pub chan_fd: RawFd,
    /// The pages files come from the image streamer: one pipe per GPU,
    /// in the order of `gpus`, over the gate channel (see
    /// [`write_back_streamed`]).
    pub streamed: bool,
    pub gpus: Vec<GpuWork>,
    /// RESTORE's buckets with their new offsets.
    pub restored: Vec<BoBucket>,
    /// The task's render fd of each minor (the one RESTORE was given).
    pub render: BTreeMap<RenderMinor, RawFd>,
    /// The task's dmabuf fd of each bucket, if KFD exported one.
    pub dmabufs: Vec<Option<RawFd>>,
}

fn fd_word(fd: Option<RawFd>) -> u64 {
    fd.map_or(NONE, |f| f as u64)
}

impl Job {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = vec![
            MAGIC,
            u64::from(self.id.0),
            self.vpid as u64,
            self.imgdir_fd as u64,
            self.chan_fd as u64,
            u64::from(self.streamed),
            self.gpus.len() as u64,
        ];
        for g in &self.gpus {
            let fd = self.render.get(&g.render_minor).copied();
            w.extend([
                u64::from(g.user.0),
                u64::from(g.actual.0),
                u64::from(g.render_minor.0),
                g.total,
                g.largest,
                fd_word(fd),
                g.bos.len() as u64,
            ]);
            w.extend(g.bos.iter().map(|&i| i as u64));
        }
        w.push(self.restored.len() as u64);
        for (i, b) in self.restored.iter().enumerate() {
            w.extend([
                b.addr.0,
                b.size,
                b.offset.0,
                b.restored_offset.0,
                u64::from(b.gpu_id.0),
                u64::from(b.alloc_flags),
                fd_word(self.dmabufs.get(i).copied().flatten()),
            ]);
        }
        w.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Parses what `encode` wrote; `None` on anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<Job> {
        if !bytes.len().is_multiple_of(8) {
            return None;
        }
        let mut w = Words(bytes.chunks_exact(8));
        if w.word()? != MAGIC {
            return None;
        }
        let id = FileId(w.u32()?);
        let vpid = i32::try_from(w.word()?).ok()?;
        let imgdir_fd = RawFd::try_from(w.word()?).ok()?;
        let chan_fd = RawFd::try_from(w.word()?).ok()?;
        let streamed = match w.word()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let mut render = BTreeMap::new();
        let gpus = (0..w.word()?)
            .map(|_| w.gpu(&mut render))
            .collect::<Option<Vec<_>>>()?;
        let (restored, dmabufs) = (0..w.word()?)
            .map(|_| w.bucket())
            .collect::<Option<(Vec<_>, Vec<_>)>>()?;
        if w.word().is_some() {
            return None;
        }
        Some(Job {
            id,
            vpid,
            imgdir_fd,
            chan_fd,
            streamed,
            gpus,
            restored,
            render,
            dmabufs,
        })
    }

    /// In a restored task: the job in a new memfd (CRIU's to place like
    /// the task's other kept fds).
    pub fn to_memfd(&self) -> io::Result<OwnedFd> {
        let f = memfd(c"criu-rocm-gpu-job")?;
        f.write_all_at(&self.encode(), 0)?;
        Ok(f.into())
    }
}

/// The little-endian words of an encoded [`Job`], read in order; each
/// reader answers `None` past the end or on a value out of its range.
struct Words<'a>(std::slice::ChunksExact<'a, u8>);

impl Words<'_> {
    fn word(&mut self) -> Option<u64> {
        let c = self.0.next()?;
        Some(u64::from_le_bytes(c.try_into().expect("8 bytes")))
    }

    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.word()?).ok()
    }

    /// An fd word: `Some(None)` for [`NONE`].
    fn fd(&mut self) -> Option<Option<RawFd>> {
        match self.word()? {
            NONE => Some(None),
            w => RawFd::try_from(w).ok().map(Some),
        }
    }

    /// One GPU's work; its render-node fd, if any, goes to `render`.
    fn gpu(&mut self, render: &mut BTreeMap<RenderMinor, RawFd>) -> Option<GpuWork> {
        let user = GpuId(self.u32()?);
        let actual = GpuId(self.u32()?);
        let render_minor = RenderMinor(self.u32()?);
        let total = self.word()?;
        let largest = self.word()?;
        if let Some(f) = self.fd()? {
            render.insert(render_minor, f);
        }
        let bos = (0..self.word()?)
            .map(|_| usize::try_from(self.word()?).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(GpuWork {
            user,
            actual,
            render_minor,
            bos,
            total,
            largest,
        })
    }

    /// One restored BO bucket and its dmabuf fd.
    fn bucket(&mut self) -> Option<(BoBucket, Option<RawFd>)> {
        let bucket = BoBucket {
            addr: GpuVa(self.word()?),
            size: self.word()?,
            offset: MmapOffset(self.word()?),
            restored_offset: MmapOffset(self.word()?),
            gpu_id: GpuId(self.u32()?),
            alloc_flags: self.u32()?,
            dmabuf_fd: crate::bo::KFD_INVALID_FD,
        };
        Some((bucket, self.fd()?))
    }
}

/// A job whose fds the writer holds.
struct Taken {
    slot: usize,
    job: Job,
    imgdir: OwnedFd,
    render: BTreeMap<RenderMinor, OwnedFd>,
    dmabufs: Vec<Option<OwnedFd>>,
    /// The writer's end of the task's gate channel.
    chan: OwnedFd,
}

impl Taken {
    fn take(slot: usize, s: &Slot) -> Result<Taken, SessionError> {
        let vpid = s.vpid.load(Ordering::Relaxed);
        let real = s.real_pid.load(Ordering::Relaxed);
        let os = |step: &str| {
            let step = format!("GPU memory writer: {step}");
            move |source| SessionError::Os {
                pid: vpid,
                step,
                source,
            }
        };
        let pidfd = pidfd_open(real).map_err(os(&format!("pidfd_open({real})")))?;
        let get = |fd: RawFd| {
            pidfd_getfd(pidfd.as_fd(), fd).map_err(os(&format!("pidfd_getfd of fd {fd}")))
        };
        let memfd = std::fs::File::from(get(s.memfd.load(Ordering::Relaxed))?);
        let len = memfd.metadata().map_err(os("fstat of the job"))?.len();
        let mut bytes = vec![0; usize::try_from(len).unwrap_or(0)];
        memfd
            .read_exact_at(&mut bytes, 0)
            .map_err(os("reading the job"))?;
        let job = Job::decode(&bytes).ok_or_else(|| SessionError::State {
            pid: vpid,
            what: "GPU memory writer: the task's job is malformed".into(),
        })?;
        let imgdir = get(job.imgdir_fd)?;
        let chan = get(job.chan_fd)?;
        let render = job
            .render
            .iter()
            .map(|(&m, &fd)| Ok((m, get(fd)?)))
            .collect::<Result<_, SessionError>>()?;
        let dmabufs = job
            .dmabufs
            .iter()
            .map(|d| d.map(get).transpose())
            .collect::<Result<_, SessionError>>()?;
        Ok(Taken {
            slot,
            job,
            imgdir,
            render,
            dmabufs,
            chan,
        })
    }

    fn run(
        &self,
        policy: EnginePolicy,
        staging_cap: Option<u64>,
    ) -> Result<Vec<GpuStats>, SessionError> {
        let vpid = self.job.vpid;
        // The directory's own path (the writer shares criu main's mounts),
        // so errors name the files as the user does; streamed images' staging
        // directory is mounted nowhere and has none.
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", self.imgdir.as_raw_fd()));
        let dir = std::fs::read_link(&fd_path)
            .ok()
            .filter(|p| p.is_dir() && !self.job.streamed)
            .unwrap_or(fd_path);
        let image = KfdImage::read(&dir, self.job.id)
            .map_err(|e| SessionError::core(vpid, "GPU memory writer: reading the KFD image", e))?;
        let dmabufs: Vec<Option<BorrowedFd<'_>>> = self
            .dmabufs
            .iter()
            .map(|d| d.as_ref().map(|f| f.as_fd()))
            .collect();
        let hashes = crate::pages::content_hashes(&image);
        let encoding =
            crate::pages::Encoding::of(&crate::image::kfd_image_name(self.job.id), &image.msg)
                .map_err(|e| SessionError::core(vpid, "GPU memory writer", e))?;
        let render_fd = |m| self.render.get(&m).map(|f| f.as_fd());
        let settings = (policy, staging_cap);
        if self.job.streamed {
            let chan = self.chan.as_fd();
            return write_back_streamed(
                &self.job, settings, render_fd, &dmabufs, chan, &hashes, encoding,
            );
        }
        write_back(
            &self.job, settings, render_fd, &dmabufs, &dir, &hashes, encoding,
        )
    }
}

/// Writes the BOs of `job` back from its pages files in `dir`, with the
/// copy settings (engine policy, staging cap), each GPU's render fd (the
/// VM's `drm_file`) and KFD's dmabuf of each bucket, checking `hashes`.
pub(super) fn write_back<'a>(
    job: &Job,
    (policy, staging_cap): (EnginePolicy, Option<u64>),
    render_fd: impl Fn(RenderMinor) -> Option<BorrowedFd<'a>>,
    dmabufs: &[Option<BorrowedFd<'a>>],
    dir: &Path,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: crate::pages::Encoding,
) -> Result<Vec<GpuStats>, SessionError> {
    let jobs = restored_jobs(job, (policy, staging_cap), render_fd, dmabufs)?;
    // An incremental dump's unchanged extents come from its parents
    // (checked before any task ran; checked again here as the files are
    // opened).
    let image = crate::image::KfdImage::read(dir, job.id)
        .map_err(|e| SessionError::core(job.vpid, "reading the KFD image", e))?;
    let overlays =
        crate::validate::chain::resolve(dir, &crate::image::kfd_image_name(job.id), &image)
            .map_err(|r| SessionError::State {
                pid: job.vpid,
                what: r.to_string(),
            })?;
    restore_contents_encoded(dir, job.id, jobs, hashes, encoding, &overlays)
        .map_err(|e| SessionError::core(job.vpid, "writing GPU memory back", e))
}

/// The copy jobs that write `job`'s BOs back into the restored process:
/// one per GPU, through its render fd and KFD's dmabufs, at the restored
/// mmap offsets.
fn restored_jobs<'a>(
    job: &Job,
    (policy, staging_cap): (EnginePolicy, Option<u64>),
    render_fd: impl Fn(RenderMinor) -> Option<BorrowedFd<'a>>,
    dmabufs: &[Option<BorrowedFd<'a>>],
) -> Result<Vec<crate::copy::GpuJob<'a>>, SessionError> {
    gpu_jobs(
        job.vpid,
        policy,
        staging_cap,
        &job.gpus,
        &job.restored,
        render_fd,
        dmabufs,
        true,
    )
}

/// [`write_back`] from the image streamer: the task sends each GPU's
/// pages file's pipe over the gate channel `chan`, in the order of the
/// job's GPUs, as the streamer gives it (the next only once this one is
/// read whole: the streamer serves one file at a time); each is read in
/// order, its end checked, its BOs against `hashes`.
pub(super) fn write_back_streamed<'a>(
    job: &Job,
    (policy, staging_cap): (EnginePolicy, Option<u64>),
    render_fd: impl Fn(RenderMinor) -> Option<BorrowedFd<'a>>,
    dmabufs: &[Option<BorrowedFd<'a>>],
    chan: BorrowedFd<'_>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: crate::pages::Encoding,
) -> Result<Vec<GpuStats>, SessionError> {
    let stall = crate::env::stream_timeout_from_env().map_err(|e| SessionError::State {
        pid: job.vpid,
        what: e.to_string(),
    })?;
    let mut first = Some(recv_pages_pipe(job, 0, chan, stall)?);
    let jobs = restored_jobs(job, (policy, staging_cap), render_fd, dmabufs)?;
    let mut stats = Vec::new();
    for (i, g) in jobs.into_iter().enumerate() {
        let pipe = match first.take() {
            Some(p) => p,
            None => recv_pages_pipe(job, i, chan, stall)?,
        };
        let done = crate::copy::restore_contents_streamed(pipe, job.id, g, hashes, encoding)
            .map_err(|e| SessionError::core(job.vpid, "writing GPU memory back", e))?;
        stats.extend(done);
    }
    Ok(stats)
}

/// The pipe of the pages file of GPU `i` of `job`, as its task sends it.
fn recv_pages_pipe(
    job: &Job,
    i: usize,
    chan: BorrowedFd<'_>,
    stall: Duration,
) -> Result<crate::stream::Pipe, SessionError> {
    let Some(gpu) = job.gpus.get(i).map(|g| g.user) else {
        return Err(SessionError::State {
            pid: job.vpid,
            what: format!("KFD image {}: no GPU {i} in the job", job.id),
        });
    };
    let name = crate::pages::pages_image_name(job.id, gpu);
    let fail = |what: String| SessionError::State {
        pid: job.vpid,
        what: format!("{name}: {what}"),
    };
    let mut buf = [0u8; 8];
    match recv_record_with_fd(chan, &mut buf, true) {
        Ok(Received::Record(4, Some(fd))) if buf[..4] == gpu.0.to_le_bytes() => {
            crate::stream::Pipe::new(fd, &name, stall)
                .map_err(|e| fail(format!("the image streamer's pipe: {e}")))
        }
        Ok(Received::Record(..)) => Err(fail(
            "the task sent no pipe of this file from the image streamer".into(),
        )),
        Ok(_) => Err(fail(
            "the task ended before it sent this file's pipe from the image streamer".into(),
        )),
        Err(e) => Err(fail(format!("receiving the pipe from the task: {e}"))),
    }
}

/// A new gate channel: the task's end and the writer's end of a
/// `SOCK_SEQPACKET` pair.
pub fn gate_channel() -> io::Result<(OwnedFd, OwnedFd)> {
    seqpacket_pair()
}

/// How a job ended, for criu main's check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    pub image: FileId,
    /// The task that restored it (pid in its namespace).
    pub vpid: i32,
    /// `Ok`: written, verified and resumed by the task; `Err`: why not.
    pub result: Result<(), String>,
}

/// criu main's handle on the writer.
#[derive(Debug)]
pub struct Writer {
    mailbox: Mailbox,
    /// The writer's pid (for messages).
    pid: libc::pid_t,
    /// Our child that ends as the writer ends (see `spawn_self`).
    shim: libc::pid_t,
    /// The writer, to kill it (then the shim reaps it before it ends).
    pidfd: Option<OwnedFd>,
}

/// What the writer is started with (parsed from its `argv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterArgs {
    pub policy: EnginePolicy,
    pub staging_cap: Option<u64>,
    /// CRIU's log, when criu main handed it over.
    pub log_fd: Option<RawFd>,
    /// The settings the boundary passed for the log ([`HelperLog::args`]).
    pub log_args: Vec<String>,
}

impl WriterArgs {
    fn to_argv(&self) -> Vec<CString> {
        let word = |s: String| CString::new(s).expect("no NUL in an argument");
        let mut v = vec![
            word(WRITER_MODE.into()),
            word(self.policy.as_str().into()),
            word(self.staging_cap.map_or("-".into(), |c| c.to_string())),
            word(self.log_fd.map_or("-".into(), |f| f.to_string())),
        ];
        v.extend(self.log_args.iter().map(|a| word(a.clone())));
        v
    }

    /// The writer's arguments in `argv` (`argv[0]` included), `None` when
    /// `argv[1]` is not [`WRITER_MODE`] (this program runs as itself).
    pub fn parse(argv: &[&[u8]]) -> Option<Result<WriterArgs, String>> {
        if argv.get(1).copied() != Some(WRITER_MODE.as_bytes()) {
            return None;
        }
        let text = |i: usize| -> Result<&str, String> {
            let a = argv.get(i).ok_or(format!("argument {i} is missing"))?;
            std::str::from_utf8(a).map_err(|_| format!("argument {i} is not UTF-8"))
        };
        let opt_num = |i: usize| -> Result<Option<u64>, String> {
            match text(i)? {
                "-" => Ok(None),
                t => t
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("argument {i} ({t:?}) is not a number")),
            }
        };
        Some((|| {
            let policy =
                crate::env::parse_engine_policy(Some(text(2)?)).map_err(|e| e.to_string())?;
            let staging_cap = opt_num(3)?;
            let log_fd = match opt_num(4)? {
                Some(f) => Some(RawFd::try_from(f).map_err(|_| "argument 4 is no fd")?),
                None => None,
            };
            let log_args = (5..argv.len()).map(text).collect::<Result<Vec<_>, _>>()?;
            Ok(WriterArgs {
                policy,
                staging_cap,
                log_fd,
                log_args: log_args.into_iter().map(str::to_owned).collect(),
            })
        })())
    }
}

impl Writer {
    /// Maps the board and starts the writer process (this program
    /// re-executed, see the module documentation); `policy` and
    /// `staging_cap` are the copy settings, `log` CRIU's log.  Call while
    /// criu main is single threaded: `PDEATHSIG` ties the writer to the
    /// calling thread.
    pub fn start(
        policy: EnginePolicy,
        staging_cap: Option<u64>,
        log: HelperLog<'_>,
    ) -> io::Result<Writer> {
        let board = Shared::<Board>::create(c"criu-rocm-gpu-board")?;
        let args = WriterArgs {
            policy,
            staging_cap,
            log_fd: log.fd.map(|_| LOG_FD),
            log_args: log.args.to_vec(),
        };
        let mut fds = vec![board.fd()];
        fds.extend(log.fd);
        let name = CString::new(WRITER_COMM).expect("no NUL");
        let shim =
            process::spawn_self(&name, &args.to_argv(), &fds, process::Tie::Supervised)?.shim;
        let mailbox = Mailbox {
            board: board.leak(),
        };
        let b = mailbox.board();
        b.parent.store(shim, Ordering::Release);
        // Tasks check the writer by its name: it must have it before any
        // task exists.
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            if b.ready.load(Ordering::Acquire) != 0 {
                break;
            }
            if let Some(st) = process::try_wait(shim) {
                return Err(io::Error::other(format!(
                    "the GPU memory writer {} as it started",
                    st.describe()
                )));
            }
            futex::wait(&b.seq, seq, Duration::from_millis(50));
        }
        let pid = b.writer.load(Ordering::Acquire);
        let w = Writer {
            mailbox,
            pid,
            shim,
            // The writer serves until told to stop: its pid is still its.
            pidfd: pidfd_open(pid).ok(),
        };
        log::debug!("GPU memory writer started (pid {})", w.pid);
        Ok(w)
    }

    pub fn mailbox(&self) -> Mailbox {
        self.mailbox
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// criu main, once every task passed its restorer's gate (or failed
    /// there): waits until every job has its outcome, stops and reaps the
    /// writer, and returns the outcomes.  The writer's death before that,
    /// or a writer that ended badly, is an error naming the writer.
    pub fn settle(self) -> Result<Vec<JobOutcome>, SessionError> {
        let b = self.mailbox.board();
        let mut status = None;
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            if self
                .mailbox
                .used()
                .iter()
                .all(|s| settled(s.state.load(Ordering::Acquire)))
            {
                break;
            }
            if let Some(st) = self.try_wait() {
                status = Some(st);
                break;
            }
            futex::wait(&b.seq, seq, Duration::from_millis(200));
        }
        b.stop.store(1, Ordering::Release);
        self.mailbox.bump();
        let died_early = status.is_some();
        let status = status.unwrap_or_else(|| self.reap());
        let outcomes = self.outcomes();
        if died_early || !status.success() {
            let open = outcomes.iter().filter(|o| o.result.is_err()).count();
            return Err(SessionError::Writer {
                pid: self.pid,
                what: format!(
                    "{} before the GPU memory of {} restored process(es) was confirmed",
                    status.describe(),
                    open.max(1)
                ),
            });
        }
        Ok(outcomes)
    }

    fn outcomes(&self) -> Vec<JobOutcome> {
        self.mailbox
            .used()
            .iter()
            .map(|s| {
                let state = s.state.load(Ordering::Acquire);
                let vpid = s.vpid.load(Ordering::Relaxed);
                let result = match state {
                    RESUMED => Ok(()),
                    FAILED | REFUSED | LOST | RESUME_FAILED => {
                        let why = s.why();
                        // The writer's errors name the pid already.
                        Err(why
                            .strip_prefix(&format!("pid {vpid}: "))
                            .unwrap_or(&why)
                            .to_owned())
                    }
                    TAKEN => Err("the GPU memory writer was still writing it".into()),
                    WRITTEN => Err("written, but the task had not resumed its GPU queues".into()),
                    _ => Err("posted, but the GPU memory writer had not taken it".into()),
                };
                JobOutcome {
                    image: FileId(s.image.load(Ordering::Relaxed)),
                    vpid,
                    result,
                }
            })
            .collect()
    }

    /// criu main, when the restore failed before [`Self::settle`]: a writer
    /// that died is reported with how it died; a running one is killed (its
    /// copies are for tasks that are gone) and reaped.
    pub fn abort(self) {
        // A task that failed at its gate has reported, or closed its end,
        // just before: let the writer note it (briefly; copies still going
        // on are for tasks that are gone).
        let b = self.mailbox.board();
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut status = self.try_wait();
        while status.is_none() && Instant::now() < deadline {
            let seq = b.seq.load(Ordering::Acquire);
            if !self
                .mailbox
                .used()
                .iter()
                .any(|s| s.state.load(Ordering::Acquire) == WRITTEN)
            {
                break;
            }
            futex::wait(&b.seq, seq, Duration::from_millis(50));
            status = self.try_wait();
        }
        let died = |st: ExitStatus| {
            if !st.success() {
                log::error!(
                    "the GPU memory writer (pid {}) {} during the restore",
                    self.pid,
                    st.describe()
                );
            }
        };
        // A writer that died on its own (a signal) may not be reaped by its
        // shim yet, nor done with its last threads: its pidfd says so only
        // once every thread is released, and before that every thread is
        // exiting or has its SIGKILL pending.  (A writer that ended itself
        // or faulted may for a moment show neither: looked at for a moment.)
        let exited = status.is_none()
            && self.pidfd.as_ref().is_some_and(|p| {
                exit::seen_within(exit::EXIT_GRACE, || {
                    // Not ended, so not reaped: the pid is still the writer's.
                    crate::os::fd::poll_one(p.as_fd(), libc::POLLIN, Duration::ZERO)
                        .unwrap_or(false)
                        || exit::exiting(self.pid as u32)
                })
            });
        match status {
            Some(st) => died(st),
            None if exited => died(self.reap()),
            None => {
                // Killed itself rather than through its shim, so that the
                // shim reaps it before it ends, and it is gone once the shim
                // is reaped.
                match self
                    .pidfd
                    .as_ref()
                    .map(|p| process::pidfd_send_signal(p.as_fd(), libc::SIGKILL))
                {
                    Some(Ok(())) => {
                        self.reap();
                        log::debug!("GPU memory writer stopped (pid {})", self.pid);
                    }
                    // It ended already, and its shim is ending as it did.
                    Some(Err(_)) => died(self.reap()),
                    None => {
                        // Our own child, not reaped yet: the pid is still its.
                        let _ = process::kill(self.shim, libc::SIGKILL);
                        self.reap();
                        log::debug!("GPU memory writer stopped (pid {})", self.pid);
                    }
                }
            }
        }
        for o in self.outcomes() {
            if let Err(why) = o.result {
                log::warn!(
                    "pid {}: the GPU restore of KFD image {} did not complete: {why}",
                    o.vpid,
                    o.image
                );
            }
        }
    }

    fn try_wait(&self) -> Option<ExitStatus> {
        process::try_wait(self.shim)
    }

    fn reap(&self) -> ExitStatus {
        process::wait(self.shim)
    }
}

/// The writer process proper (this program started with [`WRITER_MODE`],
/// logging set up by the caller): maps the board from fd 3, names itself,
/// serves until criu main says stop, and returns its exit status.
pub fn writer_main(args: &WriterArgs) -> i32 {
    // SAFETY: fd 3 is the board's memfd, handed over by Writer::start and
    // owned by nothing else in this fresh process image.
    let fd = unsafe { OwnedFd::from_raw_fd(BOARD_FD) };
    let board = match Shared::<Board>::from_fd(fd) {
        Ok(b) => b.leak(),
        Err(e) => {
            log::error!("GPU memory writer: mapping the board (fd {BOARD_FD}): {e}");
            return 1;
        }
    };
    let mailbox = Mailbox { board };
    process::set_name(&CString::new(WRITER_COMM).expect("no NUL"));
    board.writer.store(process::getpid(), Ordering::Release);
    board.ready.store(1, Ordering::Release);
    mailbox.bump();
    let (policy, cap) = (args.policy, args.staging_cap);
    let code = std::panic::catch_unwind(|| serve(mailbox, policy, cap)).unwrap_or(1);
    log::logger().flush();
    mailbox.board().gone.store(1, Ordering::Release);
    mailbox.bump();
    code
}

/// The writer process: takes posted jobs as they come (a task waits for
/// that), copies them one by one on a thread of its own, tells each task its
/// verdict and collects its report.  A job whose pages files come from the
/// image streamer gets a thread of its own: the streamer serves one file at
/// a time, in the order the tasks ask for them, so a job must read its
/// file whenever it comes, whatever job came first (it waits for its first
/// pipe before it takes its copy memory).
fn serve(mailbox: Mailbox, policy: EnginePolicy, staging_cap: Option<u64>) -> i32 {
    let b = mailbox.board();
    let (tx, rx) = std::sync::mpsc::channel::<Taken>();
    let runner = std::thread::spawn(move || {
        rx.into_iter()
            .all(|t| run_job(mailbox, t, policy, staging_cap))
    });
    let mut streamed = Vec::new();
    loop {
        let seq = b.seq.load(Ordering::Acquire);
        for (i, s) in mailbox.used().iter().enumerate() {
            if s.state.load(Ordering::Acquire) != POSTED {
                continue;
            }
            match Taken::take(i, s) {
                Ok(t) => {
                    log::info!(
                        "pid {}: GPU memory writer: writing KFD image {} back",
                        t.job.vpid,
                        t.job.id
                    );
                    s.state.store(TAKEN, Ordering::Release);
                    if t.job.streamed {
                        streamed.push(std::thread::spawn(move || {
                            run_job(mailbox, t, policy, staging_cap)
                        }));
                    } else if let Err(std::sync::mpsc::SendError(t)) = tx.send(t) {
                        let why = "the GPU memory writer's copy thread is gone";
                        s.fail(FAILED, why);
                        let _ = send_record(t.chan.as_fd(), &gate::verdict(libc::EIO as u32, why));
                    }
                }
                Err(e) => {
                    log::error!("{e}");
                    s.fail(REFUSED, &e.to_string());
                }
            }
            mailbox.bump();
        }
        // Lines of the copy thread wait for this one.
        log::logger().flush();
        if b.stop.load(Ordering::Acquire) != 0 {
            break;
        }
        futex::wait(&b.seq, seq, Duration::from_millis(200));
    }
    drop(tx);
    let ok = runner.join().is_ok() & streamed.into_iter().all(|t| t.join().is_ok());
    log::logger().flush();
    i32::from(!ok)
}

/// Copies one taken job, records its outcome in its slot and tells its
/// task the verdict; `true` (the runner goes on).
fn run_job(mailbox: Mailbox, t: Taken, policy: EnginePolicy, staging_cap: Option<u64>) -> bool {
    let i = t.slot;
    let slot = &mailbox.board().slots[i];
    let vpid = t.job.vpid;
    let result = t.run(policy, staging_cap);
    let Taken { chan, .. } = t;
    match result {
        Ok(stats) => {
            log_gpu_stats(vpid, "restored", &stats);
            // WRITTEN before the verdict goes out: the task may resume (or
            // fail RESUME) and criu main look at the slot before this
            // thread runs again, and it must then wait for the task's
            // report, not take the job as unwritten.
            slot.state.store(WRITTEN, Ordering::Release);
            match send_record(chan.as_fd(), &gate::verdict(0, "")) {
                Ok(()) => collect_report(mailbox, i, chan),
                Err(e) => slot.fail(
                    LOST,
                    &format!(
                        "GPU memory written, but the task could not be told ({e}); it is gone"
                    ),
                ),
            }
        }
        Err(e) => {
            log::error!("{e}");
            let why = e.to_string();
            // FAILED before the verdict goes out, as WRITTEN above: the
            // task fails at once and criu main, aborting, must find the
            // reason in the slot, not a job still taken.
            slot.fail(FAILED, &why);
            let _ = send_record(chan.as_fd(), &gate::verdict(e.errno() as u32, &why));
        }
    }
    mailbox.bump();
    true
}

/// Waits, on a thread of its own, for the report of the task behind job
/// `i`: its queues resumed, RESUME's error, or its end of the channel closed.
fn collect_report(mailbox: Mailbox, i: usize, chan: OwnedFd) {
    std::thread::spawn(move || {
        let s = &mailbox.board().slots[i];
        let mut buf = [0u8; 64];
        match recv_record(chan.as_fd(), &mut buf) {
            Ok(0) => s.fail(
                LOST,
                "the task ended before it reported its GPU queues resumed",
            ),
            Ok(n) => match gate::report_status(&buf[..n]) {
                Some(0) => s.state.store(RESUMED, Ordering::Release),
                Some(e) => s.fail(
                    RESUME_FAILED,
                    &format!(
                        "RESUME (restarting the GPU queues) in the task's restorer: {}",
                        io::Error::from_raw_os_error(e as i32)
                    ),
                ),
                None => s.fail(LOST, "the task's gate report is malformed"),
            },
            Err(e) => s.fail(LOST, &format!("reading the task's gate report: {e}")),
        }
        mailbox.bump();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: FileId(17),
            vpid: 4242,
            imgdir_fd: 1001,
            chan_fd: 1004,
            streamed: true,
            gpus: vec![GpuWork {
                user: GpuId(0x1a2b),
                actual: GpuId(0x5c3d),
                render_minor: RenderMinor(129),
                bos: vec![0, 2],
                total: 3 << 20,
                largest: 2 << 20,
            }],
            restored: vec![
                BoBucket {
                    addr: GpuVa(0x7000_0000_0000),
                    size: 2 << 20,
                    offset: MmapOffset(0x1_0000_0000),
                    restored_offset: MmapOffset(0x2_0000_0000),
                    gpu_id: GpuId(0x1a2b),
                    alloc_flags: crate::bo::ALLOC_VRAM,
                    dmabuf_fd: crate::bo::KFD_INVALID_FD,
                },
                BoBucket {
                    addr: GpuVa(0x7000_0100_0000),
                    size: 4096,
                    offset: MmapOffset(0xc000_0000_0000_0000),
                    restored_offset: MmapOffset(0xc000_0000_0000_0000),
                    gpu_id: GpuId(0x1a2b),
                    alloc_flags: crate::bo::ALLOC_DOORBELL,
                    dmabuf_fd: crate::bo::KFD_INVALID_FD,
                },
                BoBucket {
                    addr: GpuVa(0x7000_0200_0000),
                    size: 1 << 20,
                    offset: MmapOffset(0x1_0020_0000),
                    restored_offset: MmapOffset(0x2_0020_0000),
                    gpu_id: GpuId(0x1a2b),
                    alloc_flags: crate::bo::ALLOC_GTT,
                    dmabuf_fd: crate::bo::KFD_INVALID_FD,
                },
            ],
            render: BTreeMap::from([(RenderMinor(129), 1002)]),
            dmabufs: vec![Some(1003), None, None],
        }
    }

    #[test]
    fn jobs_round_trip_and_damage_is_refused() {
        let j = job();
        let bytes = j.encode();
        assert_eq!(Job::decode(&bytes), Some(j));
        assert_eq!(Job::decode(&bytes[..bytes.len() - 8]), None, "short");
        assert_eq!(Job::decode(&bytes[..bytes.len() - 3]), None, "ragged");
        let mut more = bytes.clone();
        more.extend([0; 8]);
        assert_eq!(Job::decode(&more), None, "trailing words");
        let mut bad = bytes;
        bad[0] ^= 1;
        assert_eq!(Job::decode(&bad), None, "magic");
    }

    /// A task posts, the writer (here: this test) takes it; a full board
    /// refuses.
    #[test]
    fn board_posts_and_fills_up() {
        let m = Mailbox::create().unwrap();
        let slot = m.post(100, 7, FileId(23), 55).unwrap();
        let s = &m.used()[slot];
        assert_eq!(s.state.load(Ordering::Acquire), POSTED);
        assert_eq!(
            (
                s.real_pid.load(Ordering::Relaxed),
                s.vpid.load(Ordering::Relaxed),
                s.image.load(Ordering::Relaxed),
                s.memfd.load(Ordering::Relaxed)
            ),
            (100, 7, 23, 55)
        );
        let waiter = std::thread::spawn(move || m.wait_taken(slot, 7, None));
        std::thread::sleep(Duration::from_millis(50));
        m.board().slots[slot].state.store(TAKEN, Ordering::Release);
        m.bump();
        waiter.join().unwrap().unwrap();
        m.board().slots[slot].fail(REFUSED, &"x".repeat(WHY_LEN + 60));
        assert_eq!(
            m.board().slots[slot].why().len(),
            WHY_LEN,
            "cut to the board's room"
        );
        let e = m.wait_taken(slot, 7, None).unwrap_err().to_string();
        assert!(e.contains("pid 7") && e.contains("could not take"), "{e}");
        m.board().gone.store(1, Ordering::Release);
        let e = m
            .wait_taken(m.post(1, 8, FileId(1), 1).unwrap(), 8, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pid 8") && e.contains("ended before"), "{e}");
        for _ in 2..SLOTS {
            assert!(m.post(1, 1, FileId(1), 1).is_some());
        }
        assert_eq!(m.post(1, 1, FileId(1), 1), None, "full");
    }

    /// Outcomes read off the board: resumed, failed with the writer's
    /// reason (its "pid N: " dropped), and jobs left in the middle.
    #[test]
    fn outcomes_name_image_task_and_reason() {
        let m = Mailbox::create().unwrap();
        let w = Writer {
            mailbox: m,
            pid: 0,
            shim: 0,
            pidfd: None,
        };
        let a = m.post(10, 1, FileId(3), 5).unwrap();
        let b = m.post(11, 2, FileId(4), 5).unwrap();
        let c = m.post(12, 3, FileId(5), 5).unwrap();
        m.board().slots[a].state.store(RESUMED, Ordering::Release);
        m.board().slots[b].fail(FAILED, "pid 2: writing GPU memory back: hash differs");
        m.board().slots[c].state.store(WRITTEN, Ordering::Release);
        let o = w.outcomes();
        assert_eq!(
            o[0],
            JobOutcome {
                image: FileId(3),
                vpid: 1,
                result: Ok(())
            }
        );
        assert_eq!(
            o[1].result,
            Err("writing GPU memory back: hash differs".to_owned())
        );
        assert!(o[2].result.as_ref().unwrap_err().contains("not resumed"));
        assert!(settled(RESUMED) && settled(LOST) && !settled(WRITTEN) && !settled(TAKEN));
    }

    /// The gate's records, byte for byte as criu/include/gpu-gate.h has them.
    #[test]
    fn gate_records_match_the_c_layout() {
        let v = gate::verdict(5, "pid 7: hash differs");
        assert_eq!(v.len(), 248);
        assert_eq!(&v[..4], &0x4154_4747u32.to_le_bytes());
        assert_eq!(u32::from_le_bytes(v[4..8].try_into().unwrap()), 5);
        assert_eq!(&v[8..27], b"pid 7: hash differs");
        assert!(v[27..].iter().all(|&b| b == 0));
        let long = gate::verdict(1, &"é".repeat(200));
        assert_eq!(long[8 + gate::WHY_LEN - 1], 0, "NUL-terminated");
        assert_eq!(gate::report_status(&gate::report(0)), Some(0));
        assert_eq!(gate::report_status(&gate::report(22)), Some(22));
        assert_eq!(gate::report_status(&[0; 8]), None);
        assert_eq!(gate::report_status(&gate::report(0)[..7]), None);
    }

    /// A verdict goes through a gate channel as one record; the end closed
    /// reads as end-of-file (the writer's or the task's death).
    #[test]
    fn gate_channel_carries_records_and_eof() {
        let (task, writer) = gate_channel().unwrap();
        send_record(writer.as_fd(), &gate::verdict(0, "")).unwrap();
        let mut buf = [0u8; 512];
        assert_eq!(
            recv_record(task.as_fd(), &mut buf).unwrap(),
            gate::VERDICT_LEN
        );
        send_record(task.as_fd(), &gate::report(0)).unwrap();
        let n = recv_record(writer.as_fd(), &mut buf).unwrap();
        assert_eq!(gate::report_status(&buf[..n]), Some(0));
        drop(writer);
        assert_eq!(recv_record(task.as_fd(), &mut buf).unwrap(), 0);
        let e = send_record(task.as_fd(), &gate::report(0)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "no SIGPIPE, EPIPE");
    }

    /// A watched process reads as alive until it exits, also as a zombie
    /// and after its pid is reaped; a process of another name or parent is
    /// refused.
    #[test]
    fn a_watched_process_is_seen_to_die() {
        let proc = std::fs::File::open("/proc").unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let me = process::getpid();
        let w = Watched::open(proc.as_fd(), pid, "sleep", me).unwrap();
        assert!(w.alive());
        assert!(Watched::open(proc.as_fd(), pid, WRITER_COMM, me).is_err());
        assert!(Watched::open(proc.as_fd(), pid, "sleep", me + 1).is_err());
        child.kill().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!w.alive(), "a zombie is not alive");
        child.wait().unwrap();
        assert!(!w.alive(), "reaped");
    }
}
