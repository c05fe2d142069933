//! Runs system calls in a thread of another process, with ptrace, as
//! CRIU's compel does: the thread is seized and interrupted, its
//! registers saved, each call made from the `syscall` instruction of its
//! vDSO, and its registers put back (or its interrupted call given a
//! result) before it is let go.  `crate::reattach` installs a listener
//! this way; `crate::serve` maps a dma-buf's BO in a supervised caller.
//! x86_64 only.

use std::io;

use crate::os_err;

/// The address of a `syscall` instruction (0f 05) in the vDSO of `pid`.
pub fn vdso_syscall(pid: i32) -> io::Result<u64> {
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
pub struct Seized {
    pid: i32,
    tid: i32,
    saved: libc::user_regs_struct,
    held: std::cell::RefCell<Vec<i32>>,
}

/// What a ptrace stop of a seized thread is.
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

fn stop_of(status: i32) -> Stop {
    let sig = libc::WSTOPSIG(status);
    match status >> 16 {
        0 if sig == libc::SIGTRAP | 0x80 => Stop::Syscall,
        0 => Stop::Signal(sig),
        e if e == libc::PTRACE_EVENT_STOP => Stop::Event,
        _ => Stop::Other(status),
    }
}

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

    /// Seizes thread `tid` of `pid` and interrupts it; `options` are
    /// PTRACE_O_* besides TRACESYSGOOD.
    pub fn new(pid: i32, tid: i32, options: i32) -> io::Result<Self> {
        Self::ptrace(
            libc::PTRACE_SEIZE,
            tid,
            0,
            (libc::PTRACE_O_TRACESYSGOOD | options) as usize,
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
    pub fn syscall(&self, at: u64, nr: i64, args: &[u64]) -> io::Result<i64> {
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

    /// [`Seized::syscall`], its failure (-errno) an error naming `what`.
    pub fn call(&self, at: u64, nr: i64, args: &[u64], what: &str) -> io::Result<u64> {
        let r = self.syscall(at, nr, args)?;
        if (-4095..0).contains(&r) {
            let e = io::Error::from_raw_os_error(-r as i32);
            return Err(io::Error::new(
                e.kind(),
                format!("{what} in thread {}: {e}", self.tid),
            ));
        }
        Ok(r as u64)
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// The registers the thread was seized with.
    pub fn regs(&self) -> &libc::user_regs_struct {
        &self.saved
    }

    /// The system call the thread was interrupted in returns `value` when
    /// it is let go, instead of restarting.
    pub fn complete(&mut self, value: i64) {
        self.saved.rax = value as u64;
        self.saved.orig_rax = u64::MAX;
    }
}

impl Drop for Seized {
    fn drop(&mut self) {
        let regs = &mut self.saved as *mut libc::user_regs_struct as usize;
        if Self::ptrace(libc::PTRACE_SETREGS, self.tid, 0, regs).is_err() {
            log::error!("ptrace: thread {}: registers not put back", self.tid);
        }
        // A thread of a stopped process stays stopped after the detach.
        let _ = Self::ptrace(libc::PTRACE_DETACH, self.tid, 0, 0);
        for &sig in self.held.borrow().iter() {
            // SAFETY: tgkill takes integers.
            if unsafe { libc::syscall(libc::SYS_tgkill, self.pid, self.tid, sig) } < 0 {
                log::error!(
                    "ptrace: thread {}: signal {sig} not sent again: {}",
                    self.tid,
                    io::Error::last_os_error()
                );
            }
        }
    }
}

/// The arguments of an mmap to make in another thread.
#[derive(Clone, Copy, Debug)]
pub struct Mmap {
    pub addr: u64,
    pub len: u64,
    pub prot: u64,
    pub flags: u64,
    /// The descriptor, in the thread's process.
    pub fd: i32,
    pub offset: u64,
}

/// Makes `map` in thread `tid` of `pid`, which waits in a seccomp-trapped
/// `mmap` of another file (the interrupt withdraws that notification),
/// closes `map.fd` there, and makes the trapped call return what the
/// made one returned.  Seccomp is suspended while the thread is seized
/// (PTRACE_O_SUSPEND_SECCOMP), so the made call is not trapped again.
/// Returns the made call's result (-errno on failure).
pub fn mmap_instead(pid: i32, tid: i32, map: Mmap) -> io::Result<i64> {
    let at = vdso_syscall(pid)?;
    let mut t = Seized::new(pid, tid, libc::PTRACE_O_SUSPEND_SECCOMP)?;
    let close = |t: &Seized| t.call(at, libc::SYS_close, &[map.fd as u64], "close");
    // The trapped call, interrupted: it would restart (-ERESTART*).
    let r = t.regs();
    let interrupted = (-516..=-512).contains(&(r.rax as i64));
    if r.orig_rax != libc::SYS_mmap as u64 || !interrupted {
        let what = format!(
            "thread {tid} is not in the trapped mmap (call {}, result {})",
            r.orig_rax as i64, r.rax as i64
        );
        close(&t)?;
        return Err(io::Error::other(what));
    }
    let args = [
        map.addr,
        map.len,
        map.prot,
        map.flags,
        map.fd as u64,
        map.offset,
    ];
    let made = t.syscall(at, libc::SYS_mmap, &args);
    close(&t)?;
    let made = made?;
    t.complete(made);
    Ok(made)
}
