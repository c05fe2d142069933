//! Writing restored BO contents back from a helper process, beside CRIU's
//! restorer.
//!
//! A restored task recreates its KFD process at its files, well before
//! CRIU's restorer reads the task's CPU memory in.  A copy inside the task
//! would have to end before the restorer unmaps the task's code, so the two
//! kinds of memory would be restored one after the other.  Instead criu main
//! starts a helper process, the writer, when the restore begins; each task,
//! right after RESTORE, posts a job on a board in shared memory: its real pid
//! and the number of a memfd describing the copy (the BOs' new offsets, which
//! of its fds reach which GPU, which hold dmabufs).  The writer takes those
//! fds with `pidfd_getfd` and marks the job taken (the task keeps them open
//! until then, then goes on to its restorer) and copies on a thread of its
//! own.  criu main waits for every job before it resumes the GPUs; a failed
//! copy fails the restore.
//!
//! The writer is cloned without an exit signal, so CRIU's SIGCHLD handler
//! (which aborts the restore on any child's exit) never hears of it: criu
//! main reaps it explicitly, and it dies with criu main (`PDEATHSIG`).  It
//! is a process rather than a thread of criu main because criu main must
//! stay single threaded: it calls `setns(CLONE_NEWNS)` later on.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use super::sys::{pidfd_getfd, pidfd_open};
use super::{gpu_jobs, log_gpu_stats, SessionError};
use crate::copy::{restore_contents, ContentHash, GpuStats};
use crate::env::EnginePolicy;
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, KfdImage};
use crate::plan::{BoBucket, GpuWork};

/// Jobs the board holds; a task finding it full copies by itself.
const SLOTS: usize = 1024;
/// How long a task waits for the writer to take its fds.
const TAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// A job's first word.
const MAGIC: u64 = u64::from_le_bytes(*b"CRGPUJB1");
/// Word for "no fd" / "no limit".
const NONE: u64 = u64::MAX;

/// Slot states (a zeroed slot is free): posted, then taken (the writer
/// holds the fds) or refused (it could not take them), then done or failed.
const POSTING: u32 = 1;
const POSTED: u32 = 2;
const TAKEN: u32 = 3;
const DONE: u32 = 4;
const FAILED: u32 = 5;
const REFUSED: u32 = 6;

/// Bytes of a failed job's error kept on the board for criu main.
const WHY_LEN: usize = 240;

#[repr(C)]
struct Slot {
    state: AtomicU32,
    real_pid: AtomicI32,
    vpid: AtomicI32,
    memfd: AtomicI32,
    /// Why the job failed (UTF-8, NUL padded), written before `FAILED`.
    why: [AtomicU8; WHY_LEN],
}

impl Slot {
    /// Records why the job failed and sets `state` (FAILED or REFUSED).
    fn fail(&self, state: u32, e: &SessionError) {
        let text = e.to_string();
        let mut n = text.len().min(WHY_LEN);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        for (i, b) in self.why.iter().enumerate() {
            b.store(
                text.as_bytes()
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
    slots: [Slot; SLOTS],
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared (not private) futex wait on a word of the board,
    // which stays mapped for the call; it only reads the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: wakes the waiters of a word of the board; no memory is touched.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// The board, mapped shared in criu main before any task exists, so every
/// task (forked from criu main or from a task) and the writer see it.
#[derive(Clone, Copy, Debug)]
pub struct Mailbox {
    board: NonNull<Board>,
}

// SAFETY: the board is shared memory touched only through atomics.
unsafe impl Send for Mailbox {}
// SAFETY: as above.
unsafe impl Sync for Mailbox {}

impl Mailbox {
    fn create() -> io::Result<Self> {
        // SAFETY: a fresh anonymous shared mapping chosen by the kernel; it
        // is never unmapped (it ends with each process' address space).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Board>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let board = NonNull::new(p.cast::<Board>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // Zeroed by the kernel: every slot FREE, nothing used.
        Ok(Mailbox { board })
    }

    fn board(&self) -> &Board {
        // SAFETY: the mapping lives as long as the process and holds a Board
        // (all atomics, valid when zeroed).
        unsafe { self.board.as_ref() }
    }

    fn bump(&self) {
        let b = self.board();
        b.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&b.seq);
    }

    fn used(&self) -> &[Slot] {
        let b = self.board();
        &b.slots[..(b.used.load(Ordering::Acquire) as usize).min(SLOTS)]
    }

    /// In a restored task: posts a job (the task's real pid, its vpid and
    /// the fd number of the job's memfd).  `None` when the board is full.
    pub fn post(&self, real_pid: i32, vpid: i32, memfd: RawFd) -> Option<usize> {
        let b = self.board();
        let i = b.used.fetch_add(1, Ordering::AcqRel) as usize;
        if i >= SLOTS {
            return None;
        }
        let s = &b.slots[i];
        s.state.store(POSTING, Ordering::Release);
        s.real_pid.store(real_pid, Ordering::Relaxed);
        s.vpid.store(vpid, Ordering::Relaxed);
        s.memfd.store(memfd, Ordering::Relaxed);
        s.state.store(POSTED, Ordering::Release);
        self.bump();
        Some(i)
    }

    /// In a restored task: waits until the writer holds the fds of job
    /// `slot` (so the task may close its own).
    pub fn wait_taken(&self, slot: usize, vpid: i32) -> Result<(), SessionError> {
        let b = self.board();
        let s = &b.slots[slot];
        let start = Instant::now();
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            match s.state.load(Ordering::Acquire) {
                // A failed copy is criu main's to report.
                TAKEN | DONE | FAILED => return Ok(()),
                REFUSED => {
                    return Err(SessionError::State {
                        pid: vpid,
                        what: "the GPU memory writer could not take the task's GPU files (see its \
                               error above)"
                            .into(),
                    })
                }
                _ => {}
            }
            if b.gone.load(Ordering::Acquire) != 0 {
                return Err(SessionError::State {
                    pid: vpid,
                    what: "the GPU memory writer ended before it took the task's GPU files".into(),
                });
            }
            if start.elapsed() > TAKE_TIMEOUT {
                return Err(SessionError::State {
                    pid: vpid,
                    what: format!(
                        "the GPU memory writer did not take the task's GPU files within {} s",
                        TAKE_TIMEOUT.as_secs()
                    ),
                });
            }
            futex_wait(&b.seq, seq, Duration::from_millis(200));
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
        let mut words = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")));
        let mut next = || words.next();
        let fd = |w: u64| -> Option<Option<RawFd>> {
            if w == NONE {
                Some(None)
            } else {
                RawFd::try_from(w).ok().map(Some)
            }
        };
        let u32_of = |w: u64| u32::try_from(w).ok();
        if next()? != MAGIC {
            return None;
        }
        let id = FileId(u32_of(next()?)?);
        let vpid = i32::try_from(next()?).ok()?;
        let imgdir_fd = RawFd::try_from(next()?).ok()?;
        let ngpus = next()?;
        let mut gpus = Vec::new();
        let mut render = BTreeMap::new();
        for _ in 0..ngpus {
            let user = GpuId(u32_of(next()?)?);
            let actual = GpuId(u32_of(next()?)?);
            let render_minor = RenderMinor(u32_of(next()?)?);
            let total = next()?;
            let largest = next()?;
            if let Some(f) = fd(next()?)? {
                render.insert(render_minor, f);
            }
            let nbos = next()?;
            let mut bos = Vec::new();
            for _ in 0..nbos {
                bos.push(usize::try_from(next()?).ok()?);
            }
            gpus.push(GpuWork {
                user,
                actual,
                render_minor,
                bos,
                total,
                largest,
            });
        }
        let nbuckets = next()?;
        let mut restored = Vec::new();
        let mut dmabufs = Vec::new();
        for _ in 0..nbuckets {
            let addr = GpuVa(next()?);
            let size = next()?;
            let offset = MmapOffset(next()?);
            let restored_offset = MmapOffset(next()?);
            let gpu_id = GpuId(u32_of(next()?)?);
            let alloc_flags = u32_of(next()?)?;
            let d = fd(next()?)?;
            restored.push(BoBucket {
                addr,
                size,
                offset,
                restored_offset,
                gpu_id,
                alloc_flags,
                dmabuf_fd: crate::bo::KFD_INVALID_FD,
            });
            dmabufs.push(d);
        }
        if next().is_some() {
            return None;
        }
        Some(Job {
            id,
            vpid,
            imgdir_fd,
            gpus,
            restored,
            render,
            dmabufs,
        })
    }

    /// In a restored task: the job in a new memfd (CRIU's to place like
    /// the task's other kept fds).
    pub fn to_memfd(&self) -> io::Result<OwnedFd> {
        // SAFETY: the name is a valid C string; memfd_create has no other
        // preconditions.
        let fd = unsafe { libc::memfd_create(c"criu-rocm-gpu-job".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nothing else owns.
        let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all_at(&self.encode(), 0)?;
        Ok(f.into())
    }
}

/// A job whose fds the writer holds.
struct Taken {
    slot: usize,
    job: Job,
    imgdir: OwnedFd,
    render: BTreeMap<RenderMinor, OwnedFd>,
    dmabufs: Vec<Option<OwnedFd>>,
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
        })
    }

    fn run(
        &self,
        policy: EnginePolicy,
        staging_cap: Option<u64>,
    ) -> Result<Vec<GpuStats>, SessionError> {
        let vpid = self.job.vpid;
        // The directory's own path (the writer shares criu main's mounts),
        // so errors name the files as the user does.
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", self.imgdir.as_raw_fd()));
        let dir = std::fs::read_link(&fd_path)
            .ok()
            .filter(|p| p.is_dir())
            .unwrap_or(fd_path);
        let image = KfdImage::read(&dir, self.job.id)
            .map_err(|e| SessionError::core(vpid, "GPU memory writer: reading the KFD image", e))?;
        let dmabufs: Vec<Option<BorrowedFd<'_>>> = self
            .dmabufs
            .iter()
            .map(|d| d.as_ref().map(|f| f.as_fd()))
            .collect();
        write_back(
            &self.job,
            (policy, staging_cap),
            |m| self.render.get(&m).map(|f| f.as_fd()),
            &dmabufs,
            &dir,
            &image.content_hashes(),
        )
    }
}

/// Writes the BOs of `job` back from its pages files in `dir`, with the
/// copy settings (engine policy, staging cap), each GPU's render fd (the
/// VM's `drm_file`) and KFD's dmabuf of each bucket, checking `hashes`.
/// The writer runs it with the fds it took, a task without a writer with
/// its own.
pub(super) fn write_back<'a>(
    job: &Job,
    (policy, staging_cap): (EnginePolicy, Option<u64>),
    render_fd: impl Fn(RenderMinor) -> Option<BorrowedFd<'a>>,
    dmabufs: &[Option<BorrowedFd<'a>>],
    dir: &Path,
    hashes: &BTreeMap<usize, ContentHash>,
) -> Result<Vec<GpuStats>, SessionError> {
    let jobs = gpu_jobs(
        job.vpid,
        policy,
        staging_cap,
        &job.gpus,
        &job.restored,
        render_fd,
        dmabufs,
        true,
    )?;
    restore_contents(dir, job.id, jobs, hashes)
        .map_err(|e| SessionError::core(job.vpid, "writing GPU memory back", e))
}

/// criu main's handle on the writer.
#[derive(Debug)]
pub struct Writer {
    mailbox: Mailbox,
    pid: libc::pid_t,
}

impl Writer {
    /// Maps the board and starts the writer process; `policy` and
    /// `staging_cap` are the copy settings.
    pub fn start(policy: EnginePolicy, staging_cap: Option<u64>) -> io::Result<Writer> {
        let mailbox = Mailbox::create()?;
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: a fork-like clone (no shared memory, no exit signal); the
        // caller (criu main at the start of the restore) is single threaded,
        // so the child's copy of every lock is free.  The child never
        // returns from this function.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                0 as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: prctl with integer arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
            // SAFETY: getppid has no preconditions.
            let code = if unsafe { libc::getppid() } != parent {
                1
            } else {
                // Never unwind out of here: above is criu main's code.
                std::panic::catch_unwind(|| serve(mailbox, policy, staging_cap)).unwrap_or(1)
            };
            log::logger().flush();
            mailbox.board().gone.store(1, Ordering::Release);
            mailbox.bump();
            // SAFETY: ends this process without running criu main's exit
            // handlers a second time.
            unsafe { libc::_exit(code) };
        }
        log::debug!("GPU memory writer started (pid {pid})");
        Ok(Writer {
            mailbox,
            pid: pid as libc::pid_t,
        })
    }

    pub fn mailbox(&self) -> Mailbox {
        self.mailbox
    }

    /// criu main, before RESUME (every task has posted by then): waits for
    /// every job, stops and reaps the writer, and fails when a copy failed.
    pub fn finish(self) -> Result<(), SessionError> {
        let b = self.mailbox.board();
        let mut gone = false;
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            if self
                .mailbox
                .used()
                .iter()
                .all(|s| matches!(s.state.load(Ordering::Acquire), DONE | FAILED | REFUSED))
            {
                break;
            }
            if self.exited() {
                gone = true;
                break;
            }
            futex_wait(&b.seq, seq, Duration::from_millis(200));
        }
        let failed: Vec<&Slot> = self
            .mailbox
            .used()
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) != DONE)
            .collect();
        b.stop.store(1, Ordering::Release);
        self.mailbox.bump();
        if !gone {
            self.reap();
        }
        let Some(first) = failed.first() else {
            return Ok(());
        };
        let pid = first.vpid.load(Ordering::Relaxed);
        let why = first.why();
        Err(SessionError::State {
            pid,
            what: if !why.is_empty() {
                // The writer's error names the pid already.
                let why = why
                    .strip_prefix(&format!("pid {pid}: "))
                    .unwrap_or(&why)
                    .to_owned();
                match failed.len() {
                    1 => why,
                    n => format!("{why} (and {} more task(s), see above)", n - 1),
                }
            } else {
                "the GPU memory writer died before it wrote this task's GPU memory back".into()
            },
        })
    }

    /// criu main, when the restore failed before [`Self::finish`]: the
    /// writer is killed (its copies are for tasks that are gone) and reaped.
    pub fn abort(self) {
        // SAFETY: kill of our own child, which has not been reaped yet.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        self.reap();
        log::debug!("GPU memory writer stopped (pid {})", self.pid);
    }

    fn exited(&self) -> bool {
        let mut st = 0;
        // SAFETY: waitpid on our own child, without blocking.
        let r = unsafe { libc::waitpid(self.pid, &mut st, libc::WNOHANG | libc::__WALL) };
        r == self.pid || r < 0
    }

    fn reap(&self) {
        let mut st = 0;
        // SAFETY: waitpid on our own child, which exits once it sees stop.
        unsafe { libc::waitpid(self.pid, &mut st, libc::__WALL) };
    }
}

/// The writer process: takes posted jobs as they come (a task waits for
/// that) and copies them one by one on a thread of its own.
fn serve(mailbox: Mailbox, policy: EnginePolicy, staging_cap: Option<u64>) -> i32 {
    let b = mailbox.board();
    let (tx, rx) = std::sync::mpsc::channel::<Taken>();
    let runner = std::thread::spawn(move || {
        for t in rx {
            let vpid = t.job.vpid;
            let slot = &mailbox.board().slots[t.slot];
            match t.run(policy, staging_cap) {
                Ok(stats) => {
                    log_gpu_stats(vpid, "restored", &stats);
                    slot.state.store(DONE, Ordering::Release);
                }
                Err(e) => {
                    log::error!("{e}");
                    slot.fail(FAILED, &e);
                }
            }
            drop(t);
            mailbox.bump();
        }
    });
    loop {
        let seq = b.seq.load(Ordering::Acquire);
        for (i, s) in mailbox.used().iter().enumerate() {
            if s.state.load(Ordering::Acquire) != POSTED {
                continue;
            }
            match Taken::take(i, s) {
                Ok(t) => {
                    s.state.store(TAKEN, Ordering::Release);
                    if tx.send(t).is_err() {
                        s.fail(
                            FAILED,
                            &SessionError::State {
                                pid: s.vpid.load(Ordering::Relaxed),
                                what: "the GPU memory writer's copy thread is gone".into(),
                            },
                        );
                    }
                }
                Err(e) => {
                    log::error!("{e}");
                    s.fail(REFUSED, &e);
                }
            }
            mailbox.bump();
        }
        // Lines of the copy thread wait for this one.
        log::logger().flush();
        if b.stop.load(Ordering::Acquire) != 0 {
            break;
        }
        futex_wait(&b.seq, seq, Duration::from_millis(200));
    }
    drop(tx);
    let ok = runner.join().is_ok();
    log::logger().flush();
    i32::from(!ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: FileId(17),
            vpid: 4242,
            imgdir_fd: 1001,
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
        let slot = m.post(100, 7, 55).unwrap();
        let s = &m.used()[slot];
        assert_eq!(s.state.load(Ordering::Acquire), POSTED);
        assert_eq!(
            (
                s.real_pid.load(Ordering::Relaxed),
                s.vpid.load(Ordering::Relaxed),
                s.memfd.load(Ordering::Relaxed)
            ),
            (100, 7, 55)
        );
        let waiter = std::thread::spawn(move || m.wait_taken(slot, 7));
        std::thread::sleep(Duration::from_millis(50));
        m.board().slots[slot].state.store(TAKEN, Ordering::Release);
        m.bump();
        waiter.join().unwrap().unwrap();
        m.board().slots[slot].fail(
            REFUSED,
            &SessionError::State {
                pid: 7,
                what: "x".repeat(300),
            },
        );
        assert_eq!(
            m.board().slots[slot].why().len(),
            WHY_LEN,
            "cut to the board's room"
        );
        let e = m.wait_taken(slot, 7).unwrap_err().to_string();
        assert!(e.contains("pid 7") && e.contains("could not take"), "{e}");
        m.board().gone.store(1, Ordering::Release);
        let e = m
            .wait_taken(m.post(1, 8, 1).unwrap(), 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pid 8") && e.contains("ended before"), "{e}");
        for _ in 2..SLOTS {
            assert!(m.post(1, 1, 1).is_some());
        }
        assert_eq!(m.post(1, 1, 1), None, "full");
    }
}
