//! `kfd-emu supervise --attach PID`: gives the threads of a process that
//! CRIU restored the listener its filter lost.
//!
//! A process that ran under `kfd-emu supervise` is dumped with the
//! supervisor's seccomp filter, and CRIU restores that filter without a
//! listener (seccomp has no way to make one for a filter after the fact):
//! every call it traps (the stat family, file mmaps, the fd-returning
//! ioctls) would then fail with ENOSYS.  Seccomp stacks filters and, of
//! filters that return the same action, the newest one's decides; so each
//! thread is given the same filter once more, installed with
//! SECCOMP_FILTER_FLAG_NEW_LISTENER, and the new listener goes to the
//! daemon as `kfd-emu supervise` would send its own:
//!
//! 1. the process is stopped (`criu restore --leave-stopped`; or SIGSTOP);
//! 2. each thread is seized with ptrace and made to run, one at a time,
//!    `mmap` (a scratch page), `seccomp(SET_MODE_FILTER, NEW_LISTENER)`
//!    with the program written into that page, `munmap`, from the
//!    `syscall` instruction of its vDSO — the way CRIU's compel runs
//!    system calls in a seized task;
//! 3. the listener is copied out with pidfd_getfd and closed in the
//!    thread, whose registers are put back before it is let go (still
//!    stopped: the caller sends SIGCONT), and signals that reached the
//!    thread meanwhile are sent to it again;
//! 4. once every thread has a listener, and only then, the listeners go
//!    to the daemon (see [`attach`]).
//!
//! A thread interrupted in a system call keeps it: its registers are
//! restored as they were, and the kernel restarts the call when the
//! thread resumes.  Threads the process starts later inherit the new
//! filter.  x86_64 only.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;

fn os_err(what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Gives every thread of `pid` a listener and hands them to the daemon of
/// `state_dir`; returns how many threads got one.
///
/// All or nothing: every thread is given its filter first, and the
/// listeners go to the daemon only once every thread has one.  When a
/// thread fails, the listeners made so far are closed: the threads that
/// got a filter have one more without a listener, which answers as the
/// filter CRIU restored does (ENOSYS), so the process is as it was and
/// `--attach` may be tried again.
#[cfg(target_arch = "x86_64")]
pub fn attach(state_dir: &Path, pid: i32) -> io::Result<usize> {
    attach_with(state_dir, pid, &mut |_, _| Ok(()))
}

/// [`attach`], calling `seized(index, tid)` on each thread once it is
/// seized, before its filter is installed: tests make a thread fail
/// there, or send it a signal.
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
pub fn attach_with(
    state_dir: &Path,
    pid: i32,
    seized: &mut dyn FnMut(usize, i32) -> io::Result<()>,
) -> io::Result<usize> {
    wait_stopped(pid)?;
    let syscall_at = vdso_syscall(pid)?;
    // SAFETY: pidfd_open takes a pid and flags.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(os_err(format!("pidfd_open({pid})")));
    }
    // SAFETY: a fresh fd nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let mut listeners = Vec::new();
    for (i, tid) in threads(pid)?.into_iter().enumerate() {
        let listener = Seized::new(pid, tid).and_then(|t| {
            seized(i, tid)?;
            t.install_listener(syscall_at, &pidfd)
        });
        listeners.push(listener.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("thread {tid} of {pid}: {e}; no thread was given a listener"),
            )
        })?);
    }
    let n = listeners.len();
    for l in listeners {
        crate::supervise::hand_over(state_dir, l)?;
    }
    Ok(n)
}

/// The thread ids of `pid` (stopped: no thread comes or goes).
#[cfg(target_arch = "x86_64")]
fn threads(pid: i32) -> io::Result<Vec<i32>> {
    let mut v = Vec::new();
    for ent in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        v.push(
            ent?.file_name()
                .to_string_lossy()
                .parse()
                .map_err(|_| io::Error::other("a task id that is not a number"))?,
        );
    }
    Ok(v)
}

#[cfg(not(target_arch = "x86_64"))]
pub fn attach(_state_dir: &Path, _pid: i32) -> io::Result<usize> {
    Err(io::Error::other(
        "supervise --attach is implemented on x86_64 only",
    ))
}

/// Waits (up to 5 s) until `pid` is in a group stop: `criu restore
/// --leave-stopped` sends its SIGSTOP as it lets the tasks go.
#[cfg(target_arch = "x86_64")]
fn wait_stopped(pid: i32) -> io::Result<()> {
    for _ in 0..500 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if state == Some("T") {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err(io::Error::other(format!(
        "process {pid} is not stopped (restore it with --leave-stopped, or SIGSTOP it)"
    )))
}

/// The address of a `syscall` instruction (0f 05) in the vDSO of `pid`.
#[cfg(target_arch = "x86_64")]
fn vdso_syscall(pid: i32) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let (start, end) = maps
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .ok_or_else(|| io::Error::other(format!("process {pid} has no vDSO")))?;
    let mut text = vec![0u8; (end - start) as usize];
    std::fs::File::open(format!("/proc/{pid}/mem"))?.read_exact_at(&mut text, start)?;
    text.windows(2)
        .position(|w| w == [0x0f, 0x05])
        .map(|i| start + i as u64)
        .ok_or_else(|| io::Error::other(format!("no syscall instruction in the vDSO of {pid}")))
}

/// A thread seized with ptrace and stopped; let go (registers restored,
/// detached) when dropped.
///
/// A signal that reaches the thread while it is seized stops it in
/// signal-delivery-stop, and the ptrace restart that goes on with the
/// injected call discards it: such signals are kept in `held` and sent to
/// the thread again once it is let go (pending until the process
/// continues; the sender's identity is ours then, the signal the same).
#[cfg(target_arch = "x86_64")]
struct Seized {
    pid: i32,
    tid: i32,
    saved: libc::user_regs_struct,
    held: std::cell::RefCell<Vec<i32>>,
}

/// What a ptrace stop of a seized thread is.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// Entry or exit of a system call (PTRACE_O_TRACESYSGOOD).
    Syscall,
    /// PTRACE_EVENT_STOP: a group stop or PTRACE_INTERRUPT.
    Event,
    /// Signal-delivery-stop of this signal.
    Signal(i32),
    /// Another ptrace event (status given).
    Other(i32),
}

#[cfg(target_arch = "x86_64")]
fn stop_of(status: i32) -> Stop {
    let sig = libc::WSTOPSIG(status);
    match status >> 16 {
        0 if sig == libc::SIGTRAP | 0x80 => Stop::Syscall,
        0 => Stop::Signal(sig),
        e if e == libc::PTRACE_EVENT_STOP => Stop::Event,
        _ => Stop::Other(status),
    }
}

#[cfg(target_arch = "x86_64")]
impl Seized {
    fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<()> {
        // SAFETY: the requests used here read or write only `data`'s
        // user_regs_struct (GETREGS/SETREGS), which the callers own.
        if unsafe { libc::ptrace(req, tid, addr, data) } < 0 {
            return Err(os_err(format!("ptrace({req}, {tid})")));
        }
        Ok(())
    }

    /// Waits for the next stop of the thread.
    fn wait_stop(tid: i32) -> io::Result<i32> {
        let mut status = 0;
        // SAFETY: waitpid writes `status`.
        if unsafe { libc::waitpid(tid, &mut status, libc::__WALL) } < 0 {
            return Err(os_err(format!("waitpid({tid})")));
        }
        if !libc::WIFSTOPPED(status) {
            return Err(io::Error::other(format!(
                "thread {tid} ended while being attached (status {status:#x})"
            )));
        }
        Ok(status)
    }

    fn new(pid: i32, tid: i32) -> io::Result<Self> {
        Self::ptrace(
            libc::PTRACE_SEIZE,
            tid,
            0,
            libc::PTRACE_O_TRACESYSGOOD as usize,
        )?;
        let mut s = Seized {
            pid,
            tid,
            // SAFETY: plain integers; overwritten by GETREGS below.
            saved: unsafe { std::mem::zeroed() },
            held: Default::default(),
        };
        Self::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0)?;
        // The interrupt's stop, or a signal's delivery stop before it:
        // either is a stop to work from.
        if let Stop::Signal(sig) = stop_of(Self::wait_stop(tid)?) {
            s.held.borrow_mut().push(sig);
        }
        let regs = &mut s.saved as *mut libc::user_regs_struct as usize;
        Self::ptrace(libc::PTRACE_GETREGS, tid, 0, regs)?;
        Ok(s)
    }

    /// Runs system call `nr` with `args` in the thread from the `syscall`
    /// instruction at `at`; returns its result (-errno on failure).
    fn syscall(&self, at: u64, nr: i64, args: &[u64]) -> io::Result<i64> {
        let mut r = self.saved;
        r.rip = at;
        r.rax = nr as u64;
        // No syscall to restart while the injected one runs.
        r.orig_rax = u64::MAX;
        let regs = [
            &mut r.rdi, &mut r.rsi, &mut r.rdx, &mut r.r10, &mut r.r8, &mut r.r9,
        ];
        for (reg, &a) in regs.into_iter().zip(args) {
            *reg = a;
        }
        let p = &mut r as *mut libc::user_regs_struct as usize;
        Self::ptrace(libc::PTRACE_SETREGS, self.tid, 0, p)?;
        // Syscall entry, then exit (TRACESYSGOOD marks both with 0x80).
        // A seized thread of a stopped process may report its group stop
        // (PTRACE_EVENT_STOP) first: it is resumed past it.  A signal's
        // delivery stop is resumed past too, the signal held (see
        // [`Seized`]).
        let (mut syscall_stops, mut event_stops) = (0, 0);
        while syscall_stops < 2 {
            Self::ptrace(libc::PTRACE_SYSCALL, self.tid, 0, 0)?;
            match stop_of(Self::wait_stop(self.tid)?) {
                Stop::Syscall => syscall_stops += 1,
                Stop::Event if event_stops < 4 => event_stops += 1,
                Stop::Signal(sig) if self.held.borrow().len() < 64 => {
                    self.held.borrow_mut().push(sig)
                }
                st => {
                    return Err(io::Error::other(format!(
                        "thread {} stopped ({st:?}) during an injected system call",
                        self.tid
                    )));
                }
            }
        }
        Self::ptrace(libc::PTRACE_GETREGS, self.tid, 0, p)?;
        Ok(r.rax as i64)
    }

    /// Installs the supervisor's filter with a new listener in the thread
    /// and returns that listener (the thread's copy is closed).
    fn install_listener(&self, at: u64, pidfd: &OwnedFd) -> io::Result<OwnedFd> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let call = |nr: i64, args: &[u64], what: &str| -> io::Result<u64> {
            let r = self.syscall(at, nr, args)?;
            if (-4095..0).contains(&r) {
                let e = io::Error::from_raw_os_error(-r as i32);
                return Err(io::Error::new(
                    e.kind(),
                    format!("{what} in the thread: {e}"),
                ));
            }
            Ok(r as u64)
        };
        let page = 4096u64;
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let scratch = call(libc::SYS_mmap, &[0, page, prot, flags, u64::MAX, 0], "mmap")?;
        let prog = crate::supervise::filter();
        // struct sock_fprog { u16 len; (pad) struct sock_filter *filter; },
        // then the program.
        let mut bytes = Vec::with_capacity(16 + prog.len() * 8);
        bytes.extend_from_slice(&(prog.len() as u64).to_ne_bytes());
        bytes.extend_from_slice(&(scratch + 16).to_ne_bytes());
        for i in &prog {
            bytes.extend_from_slice(&i.code.to_ne_bytes());
            bytes.extend_from_slice(&[i.jt, i.jf]);
            bytes.extend_from_slice(&i.k.to_ne_bytes());
        }
        let installed = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/mem", self.tid))
            .and_then(|m| m.write_all_at(&bytes, scratch))
            .and_then(|()| {
                call(
                    libc::SYS_seccomp,
                    &[
                        libc::SECCOMP_SET_MODE_FILTER as u64,
                        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                        scratch,
                    ],
                    "seccomp(SET_MODE_FILTER, NEW_LISTENER)",
                )
            });
        call(libc::SYS_munmap, &[scratch, page], "munmap")?;
        let target_fd = installed?;
        // SAFETY: pidfd_getfd takes a pidfd, an fd number and flags.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_pidfd_getfd,
                pidfd.as_raw_fd(),
                target_fd as i32,
                0,
            )
        };
        let got = if fd < 0 {
            Err(os_err("pidfd_getfd of the listener"))
        } else {
            // SAFETY: a fresh fd nobody else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        };
        call(libc::SYS_close, &[target_fd], "close")?;
        got
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Seized {
    fn drop(&mut self) {
        let regs = &mut self.saved as *mut libc::user_regs_struct as usize;
        if Self::ptrace(libc::PTRACE_SETREGS, self.tid, 0, regs).is_err() {
            log::error!(
                "supervise --attach: thread {}: registers not put back",
                self.tid
            );
        }
        // A thread of a stopped process stays stopped after the detach.
        let _ = Self::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0);
        for &sig in self.held.borrow().iter() {
            // SAFETY: tgkill takes integers.
            if unsafe { libc::syscall(libc::SYS_tgkill, self.pid, self.tid, sig) } < 0 {
                log::error!(
                    "supervise --attach: thread {}: signal {sig} not sent again: {}",
                    self.tid,
                    io::Error::last_os_error()
                );
            }
        }
    }
}
