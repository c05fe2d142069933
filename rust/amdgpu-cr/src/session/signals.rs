//! criu main's answer to SIGTERM, SIGINT, SIGHUP and SIGPIPE during a dump
//! that paused GPU queues: unpause every paused KFD process, say so in the
//! log, then die of the signal as if it had not been caught.
//!
//! From the first pause to the end of the dump a handler is installed for
//! those four signals (a signal criu-rocm inherited as ignored stays ignored,
//! as `nohup` and background jobs of a shell expect, except SIGPIPE, which
//! CRIU itself ignores).  SIGPIPE that the kernel raises for a write to a
//! closed pipe or socket (the sender is criu-rocm itself) is still ignored:
//! CRIU handles those write errors on its own.
//!
//! The handler runs only async-signal-safe code: the paused processes are a
//! fixed table of atomics (the raw number of criu's copy of each KFD file),
//! the CRIU op is one `ioctl`, the log lines are formatted on the stack and
//! written with `write(2)`, and the guardian is told with a non-blocking
//! `sendmsg`.  KFD takes CRIU ops on another process' file only from its
//! ptracer thread, criu's main thread; a process-directed signal mostly goes
//! to that thread, and a copy thread that gets one anyway passes it on to the
//! main thread.
//!
//! A process that does not fit in the table (more than [`SLOTS`] paused at
//! once) is left to the guardian, which unpauses it once criu-rocm is gone.

use std::ffi::c_int;
use std::fmt::Write as _;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Mutex;

use kfd_abi::handle::Kfd;

use super::guardian;
use crate::os::fd::write_once;
use crate::os::process::getpid;
use crate::os::signal::{self, Saved};

/// How many paused processes the handler can unpause itself.
pub const SLOTS: usize = 4096;

/// The signals that end a dump.
const SIGNALS: [c_int; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGPIPE, libc::SIGTERM];

struct Slot {
    /// criu's copy of the KFD file; -1: free.
    fd: AtomicI32,
    pid: AtomicI32,
    /// The guardian's id of the process.
    id: AtomicU32,
}

static TABLE: [Slot; SLOTS] = [const {
    Slot {
        fd: AtomicI32::new(-1),
        pid: AtomicI32::new(0),
        id: AtomicU32::new(0),
    }
}; SLOTS];
static LOG_FD: AtomicI32 = AtomicI32::new(-1);
static GUARD_FD: AtomicI32 = AtomicI32::new(-1);
/// A signal from outside that a copy thread passed on to the main thread.
static FORWARDED: AtomicI32 = AtomicI32::new(0);
/// The dispositions replaced by [`arm`], for [`disarm`].
static SAVED: Mutex<Option<Vec<Saved>>> = Mutex::new(None);

/// Installs the handler (once per dump) and tells it where to log and
/// which socket reaches the guardian.  Both fds must stay open until
/// [`disarm`].
pub fn arm(log_fd: Option<RawFd>, guard_sock: RawFd) -> io::Result<()> {
    LOG_FD.store(log_fd.unwrap_or(-1), Ordering::Release);
    GUARD_FD.store(guard_sock, Ordering::Release);
    let mut saved = SAVED.lock().unwrap_or_else(|p| p.into_inner());
    if saved.is_some() {
        return Ok(());
    }
    let mut replaced = Vec::new();
    for sig in SIGNALS {
        if sig != libc::SIGPIPE && signal::is_ignored(sig)? {
            continue;
        }
        match signal::catch(sig, on_signal, &SIGNALS) {
            Ok(old) => replaced.push(old),
            Err(e) => {
                replaced.iter().for_each(Saved::restore);
                return Err(e);
            }
        }
    }
    *saved = Some(replaced);
    Ok(())
}

/// Puts back the dispositions [`arm`] replaced; every slot is freed.
pub fn disarm() {
    if let Some(saved) = SAVED.lock().unwrap_or_else(|p| p.into_inner()).take() {
        saved.iter().for_each(Saved::restore);
    }
    for s in &TABLE {
        s.fd.store(-1, Ordering::Release);
    }
    GUARD_FD.store(-1, Ordering::Release);
}

/// Records paused process `id` (task `pid`, criu's KFD file copy `fd`) for
/// the handler; `None` when the table is full.
pub fn register(id: u32, pid: i32, fd: RawFd) -> Option<usize> {
    for (i, s) in TABLE.iter().enumerate() {
        if s.fd.load(Ordering::Acquire) >= 0 {
            continue;
        }
        s.pid.store(pid, Ordering::Relaxed);
        s.id.store(id, Ordering::Relaxed);
        s.fd.store(fd, Ordering::Release);
        return Some(i);
    }
    None
}

/// The process in `slot` is unpaused, or its file is about to be closed.
pub fn unregister(slot: usize) {
    TABLE[slot].fd.store(-1, Ordering::Release);
}

/// A log line formatted on the stack.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

fn log_line(args: std::fmt::Arguments<'_>) {
    let fd = LOG_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    let mut l = Line {
        buf: [0; 256],
        len: 0,
    };
    let _ = l.write_fmt(args);
    let _ = l.write_str("\n");
    // SAFETY: CRIU's log fd stays open while armed (see arm()).
    let _ = write_once(unsafe { BorrowedFd::borrow_raw(fd) }, &l.buf[..l.len]);
}

fn name(sig: c_int) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

/// Unpauses every registered process, from a signal handler.  Returns how
/// many could not be.
fn unpause_all(why: &str) -> usize {
    let guard = GUARD_FD.load(Ordering::Acquire);
    let mut failed = 0;
    for s in &TABLE {
        let fd = s.fd.swap(-1, Ordering::AcqRel);
        if fd < 0 {
            continue;
        }
        let pid = s.pid.load(Ordering::Relaxed);
        // SAFETY: the fd stays open while registered (the dump session
        // unregisters it before closing it), and the main thread it was
        // registered from is the one running this handler.
        let kfd = Kfd::from_fd(unsafe { BorrowedFd::borrow_raw(fd) });
        match kfd.criu_unpause() {
            Ok(()) => {
                log_line(format_args!(
                    "amdgpu: pid {pid}: GPU queues unpaused ({why})"
                ));
                if guard >= 0 {
                    // SAFETY: the guardian's socket stays open while armed
                    // (see arm()).
                    let sock = unsafe { BorrowedFd::borrow_raw(guard) };
                    let _ = guardian::tell_unpaused(sock, s.id.load(Ordering::Relaxed));
                }
            }
            Err(e) if e.errno() == libc::EINVAL => {}
            Err(e) => {
                failed += 1;
                log_line(format_args!(
                    "amdgpu: pid {pid}: unpausing the GPU queues ({why}) failed with errno {}; \
                     the GPU guardian tries again once criu-rocm is gone",
                    e.errno()
                ));
            }
        }
    }
    failed
}

fn on_signal(sig: c_int, sender: libc::pid_t) {
    let me = getpid();
    if sig == libc::SIGPIPE && sender == me && FORWARDED.swap(0, Ordering::AcqRel) != sig {
        // A write to a closed pipe or socket: CRIU handles its error.
        return;
    }
    if signal::gettid() != me {
        // Only criu's main thread (the ptracer) may issue the CRIU op.  A
        // copy thread gets the signal when the process was stopped as it
        // came (any thread may take it then): pass it on, noting that it
        // came from outside (the main thread sees us as its sender).
        FORWARDED.store(sig, Ordering::Release);
        let _ = signal::to_main_thread(sig);
        return;
    }
    let what = name(sig);
    log_line(format_args!(
        "Error (criu-rocm): got {what} during the dump; the dump fails, the paused GPU queues are unpaused first"
    ));
    let mut why = Line {
        buf: [0; 256],
        len: 0,
    };
    let _ = write!(why, "criu-rocm got {what} during the dump");
    let why = std::str::from_utf8(&why.buf[..why.len]).unwrap_or("criu-rocm got a signal");
    unpause_all(why);
    // Die of the signal, as without the handler.
    signal::die_of(sig);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_and_freed() {
        let a = register(1, 10, 100).unwrap();
        let b = register(2, 11, 101).unwrap();
        assert_ne!(a, b);
        unregister(a);
        assert_eq!(TABLE[a].fd.load(Ordering::Acquire), -1);
        assert_eq!(TABLE[b].fd.load(Ordering::Acquire), 101);
        unregister(b);
    }

    /// A write to a pipe nobody reads raises SIGPIPE from the writer
    /// itself: armed or not, it is ignored and the write fails with EPIPE.
    #[test]
    fn the_kernels_sigpipe_is_still_ignored() {
        let (r, w) = std::io::pipe().unwrap();
        drop(r);
        arm(None, -1).unwrap();
        let e = write_once(std::os::fd::AsFd::as_fd(&w), b"x").unwrap_err();
        disarm();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn lines_are_cut_not_overflowed() {
        let mut l = Line {
            buf: [0; 256],
            len: 0,
        };
        for _ in 0..100 {
            let _ = l.write_str("0123456789");
        }
        assert_eq!(l.len, 256);
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
    }
}
