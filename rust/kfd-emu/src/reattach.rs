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

#[cfg(target_arch = "x86_64")]
use crate::inject::{vdso_syscall, Seized};
use crate::os_err;

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
    let tag = crate::supervise::new_tag();
    for (i, tid) in threads(pid)?.into_iter().enumerate() {
        let listener = Seized::new(pid, tid, 0).and_then(|t| {
            seized(i, tid)?;
            install_releasing(state_dir, &t, syscall_at, &pidfd, tag)
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
        crate::supervise::hand_over(state_dir, l, tag)?;
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

#[cfg(target_arch = "x86_64")]
/// Installs the supervisor's filter with a new listener in the thread
/// and returns that listener (the thread's copy is closed).
fn install_listener(t: &Seized, at: u64, pidfd: &OwnedFd, tag: u32) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let call = |nr: i64, args: &[u64], what: &str| t.call(at, nr, args, what);
    let page = 4096u64;
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let scratch = call(libc::SYS_mmap, &[0, page, prot, flags, u64::MAX, 0], "mmap")?;
    let prog = crate::supervise::tagged_filter(tag);
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
        .open(format!("/proc/{}/mem", t.tid()))
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

/// [`install_listener`]; when seccomp refuses (EBUSY: a filter of the
/// thread has a listener, as one a supervised `criu restore` passed on to
/// the tasks it forked has, under the filter restored from the image),
/// the daemon's listeners of the thread's filters are released, oldest
/// first, until the new one installs.  Releasing one ends its service to
/// every task of its filter: those restored with it are attached too.
#[cfg(target_arch = "x86_64")]
fn install_releasing(
    state_dir: &Path,
    t: &Seized,
    at: u64,
    pidfd: &OwnedFd,
    tag: u32,
) -> io::Result<OwnedFd> {
    let mut older: Option<Vec<u32>> = None;
    loop {
        match install_listener(t, at, pidfd, tag) {
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {}
            r => return r,
        }
        if older.is_none() {
            older = Some(filter_tags(t.tid())?);
        }
        let Some(old) = older.as_mut().and_then(|v| v.pop()) else {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                "seccomp: a filter of the thread has a listener the emulator does not hold",
            ));
        };
        if crate::supervise::release(state_dir, old)? {
            log::info!(
                "supervise --attach: thread {}: released the listener of its filter {old:#x}",
                t.tid()
            );
        }
    }
}

/// The tags of the supervisor's filters of seized thread `tid`, newest
/// first (PTRACE_SECCOMP_GET_FILTER; other filters are left out).
#[cfg(target_arch = "x86_64")]
fn filter_tags(tid: i32) -> io::Result<Vec<u32>> {
    const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
    let mut tags = Vec::new();
    for i in 0usize.. {
        // SAFETY: a null buffer asks only for the instruction count.
        let n = unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, i, 0usize) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
                break;
            }
            return Err(os_err(format!("PTRACE_SECCOMP_GET_FILTER({tid}, {i})")));
        }
        let zero = libc::sock_filter {
            code: 0,
            jt: 0,
            jf: 0,
            k: 0,
        };
        let mut prog = vec![zero; n as usize];
        // SAFETY: the kernel writes `n` instructions into `prog`.
        let r = unsafe { libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, i, prog.as_mut_ptr()) };
        if r < 0 {
            return Err(os_err(format!("PTRACE_SECCOMP_GET_FILTER({tid}, {i})")));
        }
        tags.extend(crate::supervise::tag_of(&prog));
    }
    Ok(tags)
}
