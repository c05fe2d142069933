//! Signal dispositions: a handler per signal a caller catches, ignoring a
//! signal, and ending the process by a signal as if it
//! had not been caught.  The handler is a plain Rust `fn`; everything here
//! that a handler may call is async-signal-safe.

use std::ffi::{c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A signal handler: the signal and the pid of its sender as the kernel
/// recorded it (meaningful for a signal sent by `kill`/`tgkill` or raised
/// by the kernel for the process itself, such as SIGPIPE; 0 when unknown).
/// It runs in signal context: async-signal-safe calls only.
pub type Handler = fn(sig: c_int, sender: libc::pid_t);

/// Signal numbers are below this (the kernel's `_NSIG`).
const NSIG: usize = 65;

/// The handler [`catch`] installed for each signal (a `Handler` as an
/// address; 0: none).  One per signal, so that catching one signal never
/// changes what another's handler does.
static HANDLERS: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];

extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    let sender = if info.is_null() {
        0
    } else {
        // SAFETY: the kernel passes an SA_SIGINFO handler a valid siginfo.
        let info = unsafe { &*info };
        // SAFETY: si_pid reads the first word of the union after the
        // header, plain data for every si_code (the sender for SI_USER and
        // SI_TKILL).
        unsafe { info.si_pid() }
    };
    let h = usize::try_from(sig)
        .ok()
        .and_then(|s| HANDLERS.get(s))
        .map_or(0, |h| h.load(Ordering::Acquire));
    if h != 0 {
        // SAFETY: HANDLERS only ever hold 0 or a `Handler` stored by catch().
        let h: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
        h(sig, sender);
    }
}

/// A disposition [`catch`] replaced, to put back with [`Saved::restore`].
#[derive(Clone, Copy)]
pub struct Saved {
    sig: c_int,
    old: libc::sigaction,
}

impl std::fmt::Debug for Saved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saved").field("sig", &self.sig).finish()
    }
}

impl Saved {
    /// Puts the replaced disposition back.
    pub fn restore(&self) {
        // SAFETY: puts back a disposition sigaction read.
        unsafe { libc::sigaction(self.sig, &self.old, std::ptr::null_mut()) };
    }
}

fn current(sig: c_int) -> io::Result<libc::sigaction> {
    // SAFETY: sigaction is plain old data; all-zero is a valid value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reads the current disposition into `old`.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// Whether `sig` is ignored (`SIG_IGN`) now.
pub fn is_ignored(sig: c_int) -> io::Result<bool> {
    Ok(current(sig)?.sa_sigaction == libc::SIG_IGN)
}

/// Catches `sig` with `handler`, with the signals in `block` blocked while
/// it runs and interrupted system calls restarted.  Returns the
/// disposition replaced.
pub fn catch(sig: c_int, handler: Handler, block: &[c_int]) -> io::Result<Saved> {
    let slot = usize::try_from(sig)
        .ok()
        .and_then(|s| HANDLERS.get(s))
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let old = current(sig)?;
    slot.store(handler as usize, Ordering::Release);
    // SAFETY: sigaction is plain old data; all-zero is a valid value.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = trampoline as *const () as libc::sighandler_t;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    new.sa_mask = super::process::empty_set();
    for &s in block {
        // SAFETY: adds a signal number to a valid set (an invalid number
        // is refused with EINVAL, leaving the set as it was).
        unsafe { libc::sigaddset(&mut new.sa_mask, s) };
    }
    // SAFETY: installs the trampoline, which calls `handler` only.
    if unsafe { libc::sigaction(sig, &new, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Saved { sig, old })
}

/// Ignores `sig` from now on (`SIG_IGN`, which `execve` keeps).
pub fn ignore(sig: c_int) -> io::Result<()> {
    // SAFETY: SIG_IGN installs no code of ours.
    if unsafe { libc::signal(sig, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the process by `sig` as if it had not been caught: its default
/// disposition back, raised, and unblocked (it is blocked inside its own
/// handler).  Async-signal-safe; returns only if `sig`'s default action
/// does not end a process.
pub fn die_of(sig: c_int) {
    // SAFETY: sigaction is plain old data; all-zero (SIG_DFL, no flags) is valid.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: restores the default disposition of `sig`.
    unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
    // SAFETY: raise has no preconditions; the signal stays pending while blocked.
    unsafe { libc::raise(sig) };
    let mut set = super::process::empty_set();
    // SAFETY: adds a signal number to a valid set.
    unsafe { libc::sigaddset(&mut set, sig) };
    // SAFETY: unblocking delivers the pending signal.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// The calling thread's id.  Async-signal-safe.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Sends `sig` to this process' main thread (whose id is the pid).
/// Async-signal-safe.
pub fn to_main_thread(sig: c_int) -> io::Result<()> {
    let me = super::process::getpid();
    // SAFETY: tgkill takes integers only.
    if unsafe { libc::syscall(libc::SYS_tgkill, me, me, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicI32;

    static GOT: AtomicI32 = AtomicI32::new(0);
    static FROM: AtomicI32 = AtomicI32::new(0);

    fn note(sig: c_int, sender: libc::pid_t) {
        GOT.store(sig, Ordering::SeqCst);
        FROM.store(sender, Ordering::SeqCst);
    }

    /// A caught signal reaches the handler with its sender; the old
    /// disposition comes back.  SIGWINCH: nothing else in the tests uses it.
    #[test]
    fn a_caught_signal_reaches_the_handler_with_its_sender() {
        let saved = catch(libc::SIGWINCH, note, &[libc::SIGWINCH]).unwrap();
        assert!(!is_ignored(libc::SIGWINCH).unwrap());
        to_main_thread(libc::SIGWINCH).ok();
        // SAFETY: kill takes integers only; the signal is caught.
        unsafe { libc::kill(super::super::process::getpid(), libc::SIGWINCH) };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while GOT.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        saved.restore();
        assert_eq!(GOT.load(Ordering::SeqCst), libc::SIGWINCH);
        assert_eq!(FROM.load(Ordering::SeqCst), super::super::process::getpid());
        ignore(libc::SIGWINCH).unwrap();
        assert!(is_ignored(libc::SIGWINCH).unwrap());
        saved.restore();
        assert!(!is_ignored(libc::SIGWINCH).unwrap());
    }
}
