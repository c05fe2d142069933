//! A render file's amdgpu submission contexts, which fail its dump (see
//! [`super::gem`]): amdgpu has no call that lists them, so every id it can
//! hand out is probed (CTX GET_STABLE_PSTATE, which only reads), 4095
//! ioctls a file.  A dump starts the probes when it meets the files at the
//! pause, the tree frozen, each in a worker process of its own
//! ([`ContextProbes`], [`crate::os::process::fork_worker`]): they run
//! beside CRIU's dump of the tasks' memory and the copies of the KFD BOs
//! instead of after them, on the CPU time those leave idle (`SCHED_IDLE`),
//! and the render file's dump takes the outcome.
//!
//! Not a thread: CRIU later enters a container's mount namespace
//! (`setns`) to dump its tmpfs, which a multi-threaded process cannot.  A
//! worker is a copy of criu holding the same open file, so the same
//! contexts; it reports through a pipe and never ends on its own (see
//! `fork_worker`), and the file's dump ends and reaps it.  The workers
//! probe one after the other (each waits for the one before to close its
//! end of a pipe), as one thread would.  Anything short of a whole report
//! (a worker that could not start, failed a probe, or was killed) makes
//! the file's dump probe itself: the outcome is never guessed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use kfd_abi::handle::RenderNode;
use kfd_abi::layout::gem618;

use crate::os::fd::{pipe, poll_one, set_nonblocking};
use crate::os::process::{end_worker, fork_worker};

/// The ids probed: 1 to this.  The kernel hands contexts out lowest-free
/// from 1 (`ctx_handles`, whose ids end below `AMDGPU_VM_MAX_NUM_CTX`,
/// 4096); GEM handles, probed on kernels that cannot list them, the same
/// way (the file's `object_idr`).
pub(crate) const PROBED_IDS: u32 = gem618::AMDGPU_VM_MAX_NUM_CTX - 1;

/// The context ids a render file holds, or the id whose probe failed and
/// how.
pub(crate) type Outcome = Result<Vec<u32>, (u32, kfd_abi::handle::Error)>;

/// Probes every context id of render file `fd`.
pub(crate) fn probe(fd: BorrowedFd<'_>) -> Outcome {
    let node = RenderNode::from_fd(fd);
    let mut held = Vec::new();
    for ctx in 1..=PROBED_IDS {
        if node.ctx_exists(ctx).map_err(|e| (ctx, e))? {
            held.push(ctx);
        }
    }
    Ok(held)
}

/// A worker's report: the held ids, then 0 and their count, as
/// little-endian u32s.  At most this many bytes.
const REPORT_BYTES: usize = 4 * (PROBED_IDS as usize + 2);

/// A worker's whole report: its held ids, or why it is not one.
fn read_report(bytes: &[u8]) -> Result<Vec<u32>, String> {
    if !bytes.len().is_multiple_of(4) || bytes.len() < 8 {
        return Err(format!("a report of {} bytes", bytes.len()));
    }
    let words: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    let (held, end) = words.split_at(words.len() - 2);
    let ascending = held.windows(2).all(|w| w[0] < w[1]);
    let in_range = held.iter().all(|&c| (1..=PROBED_IDS).contains(&c));
    if end != [0, held.len() as u32] || !ascending || !in_range {
        return Err(format!("a malformed report of {} words", words.len()));
    }
    Ok(held.to_vec())
}

/// What a worker does: waits for the worker before it to close `baton`'s
/// other end, probes `fd` and writes its report to `report` (non-blocking:
/// a pipe too small for it cuts it short, never stalls it).  Worker code
/// ([`fork_worker`]): ioctls, reads and writes on its stack only.
fn work(fd: RawFd, report: RawFd, baton: Option<RawFd>) {
    if let Some(b) = baton {
        let mut byte = 0u8;
        loop {
            // SAFETY: read of one byte into our stack.
            let n = unsafe { libc::read(b, std::ptr::from_mut(&mut byte).cast(), 1) };
            let interrupted =
                n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if !interrupted && n <= 0 {
                break;
            }
        }
    }
    // SAFETY: `fd` is the render file this worker keeps open until its
    // work is done.
    let node = RenderNode::from_fd(unsafe { BorrowedFd::borrow_raw(fd) });
    let mut buf = [0u8; REPORT_BYTES];
    let mut len = 0;
    let mut put = |w: u32| {
        buf[len..len + 4].copy_from_slice(&w.to_le_bytes());
        len += 4;
    };
    let mut held = 0u32;
    for ctx in 1..=PROBED_IDS {
        match node.ctx_exists(ctx) {
            Ok(true) => {
                put(ctx);
                held += 1;
            }
            Ok(false) => {}
            // No trailer: the file's dump probes again, and names the id.
            Err(_) => return,
        }
    }
    put(0);
    put(held);
    let mut at = 0;
    while at < len {
        // SAFETY: write of our stack's `buf[at..len]`.
        let n = unsafe { libc::write(report, buf[at..].as_ptr().cast(), len - at) };
        if n > 0 {
            at += n as usize;
        } else if n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Puts worker `pid` under `policy`: `SCHED_IDLE` as it starts, so that it
/// probes only on a CPU the dump leaves idle (the copies of the KFD BOs,
/// CRIU's dump of the tasks' memory), and back to `SCHED_OTHER` once the
/// dump waits for it ([`ContextProbes::take`]): under `SCHED_IDLE` each of
/// a probe's 4095 round trips to the driver waits for an idle CPU.  Set by
/// the dump, never by the worker itself, so the two never cross.  A
/// refusal is ignored: the probe only runs at another priority.
fn set_policy(pid: libc::pid_t, policy: libc::c_int) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the policy of our own child `pid`, not yet reaped, from
    // a parameter on our stack.
    unsafe { libc::sched_setscheduler(pid, policy, &param) };
}

/// A started probe: the worker and the read end of its report.
struct Worker {
    pid: libc::pid_t,
    report: OwnedFd,
}

/// The context probes of the render files a dump met, each in a worker
/// started as the file is met, one after the other; each outcome kept
/// for the file's dump ([`Self::take`]).
#[derive(Default)]
pub(crate) struct ContextProbes {
    /// The files' workers, by the key [`Self::start`] was given.
    pending: BTreeMap<usize, Worker>,
    /// The read end of a pipe whose write end only the last worker
    /// started holds: the next one starts probing once it reads
    /// end-of-file.
    baton: Option<OwnedFd>,
    /// The pending workers were put back under the dump's own policy
    /// ([`Self::hurry`]).
    hurried: bool,
}

impl ContextProbes {
    /// Starts the probe of render file `fd` under `key`.
    pub fn start(&mut self, key: usize, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let (report_r, report_w) = pipe()?;
        set_nonblocking(report_w.as_fd())?;
        let (baton_r, baton_w) = pipe()?;
        let (fd, report, after) = (
            fd.as_raw_fd(),
            report_w.as_raw_fd(),
            self.baton.as_ref().map(AsRawFd::as_raw_fd),
        );
        let mut keep = vec![fd, report, baton_w.as_raw_fd()];
        keep.extend(after);
        let silent = crate::testhook::probe_worker_silent();
        // SAFETY: `work` makes only raw system calls on its own stack.
        let pid = unsafe {
            fork_worker(&keep, move || {
                if !silent {
                    work(fd, report, after);
                }
            })?
        };
        set_policy(
            pid,
            if self.hurried {
                libc::SCHED_OTHER
            } else {
                libc::SCHED_IDLE
            },
        );
        self.baton = Some(baton_r);
        self.pending.insert(
            key,
            Worker {
                pid,
                report: report_r,
            },
        );
        Ok(())
    }

    /// The held context ids the probe started under `key` reported, once
    /// it is done; `None` if none was started or its report is not whole
    /// (logged): the caller probes itself.
    pub fn take(&mut self, key: usize) -> Option<Vec<u32>> {
        self.hurry();
        let w = self.pending.remove(&key)?;
        let mut bytes = Vec::with_capacity(REPORT_BYTES);
        let read = File::from(w.report).read_to_end(&mut bytes);
        let status = end_worker(w.pid);
        let report = read
            .map_err(|e| format!("reading its report: {e}"))
            .and_then(|_| read_report(&bytes));
        match report {
            Ok(held) => Some(held),
            Err(why) => {
                log::info!(
                    "the context probe worker (pid {}) gave no whole report ({why}; it {}): \
                     the render file is probed again",
                    w.pid,
                    status.describe()
                );
                None
            }
        }
    }

    /// Puts the workers still pending back under the dump's own policy
    /// ([`set_policy`]), once a dump: the first file taken waits, and the
    /// ones after it follow.
    fn hurry(&mut self) {
        if std::mem::replace(&mut self.hurried, true) {
            return;
        }
        for w in self.pending.values() {
            set_policy(w.pid, libc::SCHED_OTHER);
        }
    }

    /// Ends the workers whose outcome was not taken, each once it closed
    /// its fds (or [`FINISH_TIMEOUT`] after the first was waited for): a
    /// process killed with the render file open closes it as a dying
    /// process, and amdgpu's flush of the file then stops the context
    /// entities it counts as that process' own (`drm_sched_entity_flush`).
    /// The waits are the dump's: the workers run under its own policy
    /// ([`Self::hurry`]).
    pub fn clear(&mut self) {
        self.hurry();
        let deadline = Instant::now() + FINISH_TIMEOUT;
        for (_, w) in std::mem::take(&mut self.pending) {
            wait_closed(&File::from(w.report), deadline);
            end_worker(w.pid);
        }
        self.baton = None;
        self.hurried = false;
    }
}

/// How long [`ContextProbes::clear`] waits for the workers to finish, in
/// all: 4095 ioctls take a few ms on a kernel, about 50 ms on kfd-emu.
const FINISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits until the worker whose report is `report` closed its fds (the
/// pipe reads end-of-file; what it wrote is dropped) or `deadline`.
fn wait_closed(report: &File, deadline: Instant) {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if !matches!(poll_one(report.as_fd(), libc::POLLIN, left), Ok(true)) {
            return;
        }
        match (&*report).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

impl Drop for ContextProbes {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that is not a render node fails the first probe: its worker
    /// gives no report, and inline the probe names id 1; a key never
    /// started has no outcome.
    #[test]
    fn a_failed_probe_is_no_report() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut p = ContextProbes::default();
        p.start(3, f.as_fd()).unwrap();
        p.start(4, f.as_fd()).unwrap();
        assert_eq!(probe(f.as_fd()).map_err(|e| e.0), Err(1));
        assert_eq!(p.take(4), None, "the second, after the first");
        assert_eq!(p.take(3), None);
        assert_eq!(p.take(3), None, "taken once");
        assert_eq!(p.take(5), None, "never started");
        p.start(6, f.as_fd()).unwrap();
        p.clear();
        assert_eq!(p.take(6), None, "cleared");
    }

    /// A worker probes under `SCHED_IDLE` until the dump first waits for
    /// one; then it and every worker started after run as the dump does.
    #[test]
    fn workers_idle_until_the_dump_waits_for_one() {
        // SAFETY: reads the policy of our own child, not yet reaped.
        let policy = |pid| unsafe { libc::sched_getscheduler(pid) };
        let f = std::fs::File::open("/dev/null").unwrap();
        let mut p = ContextProbes::default();
        p.start(1, f.as_fd()).unwrap();
        p.start(2, f.as_fd()).unwrap();
        let (a, b) = (p.pending[&1].pid, p.pending[&2].pid);
        assert_eq!((policy(a), policy(b)), (libc::SCHED_IDLE, libc::SCHED_IDLE));
        assert_eq!(p.take(1), None);
        assert_eq!(policy(b), libc::SCHED_OTHER, "put back at the first wait");
        p.start(3, f.as_fd()).unwrap();
        assert_eq!(
            policy(p.pending[&3].pid),
            libc::SCHED_OTHER,
            "started after it"
        );
        p.clear();
        p.start(4, f.as_fd()).unwrap();
        assert_eq!(policy(p.pending[&4].pid), libc::SCHED_IDLE, "the next dump");
        p.hurry();
        assert_eq!(policy(p.pending[&4].pid), libc::SCHED_OTHER, "cleared");
        p.clear();
    }

    #[test]
    fn only_a_whole_report_counts() {
        let words = |w: &[u32]| w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(read_report(&words(&[0, 0])), Ok(vec![]));
        assert_eq!(read_report(&words(&[2, 7, 0, 2])), Ok(vec![2, 7]));
        for bad in [
            &[][..],
            &[0],
            &[2, 7, 0, 1],
            &[7, 2, 0, 2],
            &[2, 7, 0],
            &[4096, 0, 1],
            &[0, 0, 0],
        ] {
            assert!(read_report(&words(bad)).is_err(), "{bad:?}");
        }
        assert!(
            read_report(&[0, 0, 0, 0, 0, 0, 0]).is_err(),
            "not whole words"
        );
    }
}
