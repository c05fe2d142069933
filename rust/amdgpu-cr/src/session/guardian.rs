//! The GPU guardian: a small process that unpauses the GPU queues of a
//! dump's paused processes when criu main dies without doing it (SIGKILL, a
//! crash), so that the tree does not run on with its GPU work stopped for
//! good.
//!
//! * It is started before the first KFD process is paused, by a double fork
//!   (the middle process has no exit signal and is reaped at once), so it is
//!   never a child CRIU waits for or that its SIGCHLD handlers see, and it
//!   outlives criu main: no `PDEATHSIG`, a session of its own (a Ctrl-C at
//!   criu's terminal does not reach it), and SIGHUP, SIGINT, SIGTERM and
//!   SIGPIPE ignored.
//! * It holds only what it needs: its end of a `SOCK_SEQPACKET` pair, a
//!   pidfd of criu main, CRIU's log fd, `/dev/null` as stdio, and for each
//!   paused process a copy of its KFD file (sent over the socket before the
//!   process is paused) and a pidfd.  Nothing else of criu's: a copy of the
//!   parasite's control socket, for one, would keep a task in its parasite
//!   after criu died.
//! * criu main tells it, per KFD process, "about to pause" (with the file),
//!   "unpaused" (forget it) and who owns it; at the end "stop" (every
//!   process was unpaused, or the dump left them to criu) or "the tree is
//!   being killed" (a good dump: it waits until the processes are gone and
//!   unpauses any that outlive criu main).
//! * When criu main is gone (its pidfd is readable, or the socket reached
//!   its end without "stop"), it reads what is left on the socket and, for
//!   each process still paused and alive, does what KFD requires of a
//!   caller of a CRIU op on another process' file: becomes its ptracer
//!   (`PTRACE_SEIZE`, retried while criu's trace is being released by the
//!   kernel), issues `UNPAUSE`, stops and detaches it.  KFD answers `EINVAL`
//!   when the queues were not paused (criu's signal handler got there
//!   first).  Then it exits.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use kfd_abi::handle::Kfd;

use crate::os::process::pidfd_open;

/// The name the guardian shows in `ps` (`comm`, at most 15 bytes).
pub const COMM: &str = "criu-gpu-guard";

/// How long the guardian keeps trying to become the ptracer of a process
/// whose trace criu's death is releasing.
const SEIZE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long, after a good dump, processes CRIU is killing may take to die
/// once criu main is gone before the guardian unpauses the survivors.
const KILL_GRACE: Duration = Duration::from_secs(3);
/// How long the guardian waits for a process it unpaused to stop for the
/// detach; past that it is detached when the guardian exits.
const DETACH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long criu main waits for a new guardian to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// What a message says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    /// Guardian → criu: set up; `pid` is the guardian's.
    Ready = 1,
    /// Process `id` (task `pid`) is about to be paused; its KFD file rides along.
    Track = 2,
    /// Process `id` was unpaused (or never got paused): forget it.
    Untrack = 3,
    /// Process `id`'s KFD process is led by `pid` (not the task that held the file).
    Owner = 4,
    /// The dump is over and nothing is left to unpause: exit.
    Stop = 5,
    /// A good dump: CRIU kills the tree now; unpause whatever outlives criu main.
    Killing = 6,
}

impl Kind {
    fn of(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Ready,
            2 => Kind::Track,
            3 => Kind::Untrack,
            4 => Kind::Owner,
            5 => Kind::Stop,
            6 => Kind::Killing,
            _ => return None,
        })
    }
}

/// [`Kind::Untrack`] for the signal handler.
pub(crate) const UNTRACK: u32 = Kind::Untrack as u32;

/// One message on the socket (one `SOCK_SEQPACKET` record).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct Msg {
    kind: u32,
    id: u32,
    pid: i32,
    pad: u32,
}

const MSG_LEN: usize = std::mem::size_of::<Msg>();

impl Msg {
    fn bytes(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[0..4].copy_from_slice(&self.kind.to_ne_bytes());
        b[4..8].copy_from_slice(&self.id.to_ne_bytes());
        b[8..12].copy_from_slice(&self.pid.to_ne_bytes());
        b
    }

    fn from_bytes(b: &[u8; MSG_LEN]) -> Msg {
        let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        Msg {
            kind: u32::from_ne_bytes(word(0)),
            id: u32::from_ne_bytes(word(4)),
            pid: i32::from_ne_bytes(word(8)),
            pad: 0,
        }
    }
}

/// Sends `msg` with, when given, one fd (`SCM_RIGHTS`); never blocks and
/// never raises SIGPIPE.  Async-signal-safe (criu's signal handler uses it).
pub(crate) fn send_raw(sock: RawFd, msg_kind: u32, id: u32, pid: i32, fd: Option<RawFd>) -> i32 {
    let m = Msg {
        kind: msg_kind,
        id,
        pid,
        pad: 0,
    }
    .bytes();
    let mut iov = libc::iovec {
        iov_base: m.as_ptr() as *mut libc::c_void,
        iov_len: m.len(),
    };
    // Room for one fd: CMSG_SPACE(sizeof(int)) is 24 bytes on LP64; 8-aligned.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        hdr.msg_control = cbuf.as_mut_ptr().cast();
        hdr.msg_controllen = space;
        // SAFETY: msg_control points to `space` writable bytes (cbuf is 32).
        let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
        // SAFETY: `c` is the first header inside cbuf, which has room for it.
        unsafe {
            (*c).cmsg_level = libc::SOL_SOCKET;
        }
        // SAFETY: as above.
        unsafe {
            (*c).cmsg_type = libc::SCM_RIGHTS;
        }
        // SAFETY: CMSG_LEN only computes a size.
        let len = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as usize;
        // SAFETY: as above.
        unsafe {
            (*c).cmsg_len = len;
        }
        // SAFETY: CMSG_DATA points inside cbuf, with room for one int.
        let data = unsafe { libc::CMSG_DATA(c) } as *mut RawFd;
        // SAFETY: `data` is inside cbuf and may be unaligned.
        unsafe { data.write_unaligned(fd) };
    }
    // SAFETY: `hdr` describes live buffers for the duration of the call.
    let r = unsafe { libc::sendmsg(sock, &hdr, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if r == MSG_LEN as isize {
        0
    } else {
        -1
    }
}

fn send(sock: BorrowedFd<'_>, kind: Kind, id: u32, pid: i32, fd: Option<RawFd>) -> io::Result<()> {
    if send_raw(sock.as_raw_fd(), kind as u32, id, pid, fd) == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What one receive gave.
enum Recv {
    Msg(Msg, Option<OwnedFd>),
    /// Nothing queued (non-blocking receive).
    Empty,
    /// The other end is closed and everything it sent was read.
    End,
}

fn recv(sock: BorrowedFd<'_>, block: bool) -> io::Result<Recv> {
    let mut m = [0u8; MSG_LEN];
    let mut iov = libc::iovec {
        iov_base: m.as_mut_ptr().cast(),
        iov_len: m.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&cbuf);
    let flags = libc::MSG_CMSG_CLOEXEC | if block { 0 } else { libc::MSG_DONTWAIT };
    let r = loop {
        // SAFETY: `hdr` describes live, writable buffers.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, flags) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        break r;
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Recv::Empty),
            _ => Err(e),
        };
    }
    let mut fd = None;
    // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR reads its length.
    let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
    if !c.is_null() {
        // SAFETY: `c` points at a complete header inside cbuf.
        let h = unsafe { c.read_unaligned() };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA points inside the header's data.
            let data = unsafe { libc::CMSG_DATA(c) } as *const RawFd;
            // SAFETY: the header carries at least one int (we sent one at most).
            let raw = unsafe { data.read_unaligned() };
            // SAFETY: the kernel installed this fd in our table for us.
            fd = Some(unsafe { OwnedFd::from_raw_fd(raw) });
        }
    }
    if r == 0 {
        return Ok(Recv::End);
    }
    if r as usize != MSG_LEN {
        return Err(io::Error::from_raw_os_error(libc::EPROTO));
    }
    Ok(Recv::Msg(Msg::from_bytes(&m), fd))
}

/// criu main's handle on its guardian.
#[derive(Debug)]
pub struct Guardian {
    sock: OwnedFd,
    pid: libc::pid_t,
    next: u32,
    /// Stop or Killing was sent.
    ended: bool,
}

impl Guardian {
    /// Starts the guardian; `log_fd` is CRIU's log, which the guardian keeps
    /// to say what it did.  Call while criu main is single threaded.
    pub fn start(log_fd: Option<RawFd>) -> io::Result<Guardian> {
        let mut pair = [-1; 2];
        // SAFETY: socketpair writes two fds into `pair`.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: socketpair returned two fresh fds owned by nobody else.
        let ours = unsafe { OwnedFd::from_raw_fd(pair[0]) };
        // SAFETY: as above.
        let theirs = unsafe { OwnedFd::from_raw_fd(pair[1]) };
        // SAFETY: getpid has no preconditions.
        let criu = unsafe { libc::getpid() };
        let criu_pidfd = pidfd_open(criu)?;
        // SAFETY: a fork-like clone without exit signal (CRIU's SIGCHLD
        // handlers never hear of it; we reap it below).  The caller is
        // single threaded, so the child's copies of every lock are free.
        let mid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                0 as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if mid < 0 {
            return Err(io::Error::last_os_error());
        }
        if mid == 0 {
            // SAFETY: fork in the single-threaded middle process.
            let g = unsafe { libc::fork() };
            if g == 0 {
                let keep = [theirs.as_raw_fd(), criu_pidfd.as_raw_fd()];
                let code = std::panic::catch_unwind(|| {
                    guardian_main(theirs.as_fd(), criu_pidfd.as_fd(), criu, &keep, log_fd)
                })
                .unwrap_or(1);
                log::logger().flush();
                // SAFETY: ends the guardian without running criu's exit handlers.
                unsafe { libc::_exit(code) };
            }
            // SAFETY: ends the middle process without running criu's exit handlers.
            unsafe { libc::_exit(if g < 0 { 1 } else { 0 }) };
        }
        let mut st = 0;
        // SAFETY: waitpid on our own child (no exit signal: __WALL).
        let r = unsafe { libc::waitpid(mid as libc::pid_t, &mut st, libc::__WALL) };
        drop(theirs);
        drop(criu_pidfd);
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 {
            return Err(io::Error::other("the GPU guardian could not be forked"));
        }
        let pid = wait_ready(ours.as_fd())?;
        Ok(Guardian {
            sock: ours,
            pid,
            next: 1,
            ended: false,
        })
    }

    /// The guardian's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// criu main's end of the socket (for the signal handler's messages).
    pub fn sock(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Before task `pid`'s KFD process is paused through `kfd`: hands the
    /// guardian a copy of the file.  Returns the id later messages use.
    pub fn track(&mut self, pid: i32, kfd: BorrowedFd<'_>) -> io::Result<u32> {
        let id = self.next;
        self.next += 1;
        send(
            self.sock.as_fd(),
            Kind::Track,
            id,
            pid,
            Some(kfd.as_raw_fd()),
        )?;
        Ok(id)
    }

    /// The process `id` is unpaused (or was never paused).
    pub fn untrack(&self, id: u32) -> io::Result<()> {
        send(self.sock.as_fd(), Kind::Untrack, id, 0, None)
    }

    /// The KFD process `id` is led by `pid` (criu's pid namespace).
    pub fn owner(&self, id: u32, pid: i32) -> io::Result<()> {
        send(self.sock.as_fd(), Kind::Owner, id, pid, None)
    }

    /// The dump is over and every process it paused was dealt with: the
    /// guardian exits.
    pub fn stop(mut self) -> io::Result<()> {
        self.ended = true;
        send(self.sock.as_fd(), Kind::Stop, 0, 0, None)
    }

    /// A good dump whose tree CRIU kills now: the guardian waits for the
    /// processes to go and unpauses any that outlive criu main.
    pub fn leave_to_kill(mut self) -> io::Result<()> {
        self.ended = true;
        send(self.sock.as_fd(), Kind::Killing, 0, 0, None)
    }
}

impl Drop for Guardian {
    fn drop(&mut self) {
        if !self.ended {
            // Closing the socket without a last word makes the guardian
            // unpause every process it still tracks once criu's trace is
            // released: the safe side.
            log::warn!(
                "the dump ended without telling the GPU guardian (pid {}); it unpauses what is left",
                self.pid
            );
        }
    }
}

fn wait_ready(sock: BorrowedFd<'_>) -> io::Result<libc::pid_t> {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = READY_TIMEOUT.as_millis() as libc::c_int;
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r == 0 {
        return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    match recv(sock, false)? {
        Recv::Msg(m, _) if m.kind == Kind::Ready as u32 => Ok(m.pid),
        _ => Err(io::Error::other(
            "the GPU guardian ended before it was ready",
        )),
    }
}

// ---------------------------------------------------------------------------
// The guardian process

/// A paused process the guardian answers for.
struct Tracked {
    id: u32,
    /// The task that held the file; then the KFD process' leader.
    pid: i32,
    kfd: OwnedFd,
    /// None when the process was gone already.
    pidfd: Option<OwnedFd>,
}

impl Tracked {
    fn gone(&self) -> bool {
        self.pidfd.as_ref().is_none_or(|p| readable(p.as_fd(), 0))
    }
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable(fd: BorrowedFd<'_>, ms: libc::c_int) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0
}

/// Sets the guardian apart from criu main: its own session and name,
/// signals it ignores, and no fd but `keep`, CRIU's log and /dev/null.
fn detach_from_criu(keep: &[RawFd], log_fd: Option<RawFd>) {
    // SAFETY: prctl with a pointer to a NUL-terminated name of ≤ 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"criu-gpu-guard".as_ptr()) };
    // SAFETY: setsid has no preconditions (we are no group leader: a fresh fork).
    unsafe { libc::setsid() };
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let how = match sig {
            libc::SIGHUP | libc::SIGINT | libc::SIGTERM | libc::SIGPIPE | libc::SIGQUIT => {
                libc::SIG_IGN
            }
            _ => libc::SIG_DFL,
        };
        // SAFETY: resets a disposition inherited from criu main.
        unsafe { libc::signal(sig, how) };
    }
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
    let mut none: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `none` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut none) };
    // SAFETY: unblocks every signal for this (only) thread.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) };
    let mut keep: Vec<RawFd> = keep.iter().copied().chain(log_fd).collect();
    // SAFETY: open of a constant path; the result is checked.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
    for std in 0..3 {
        if keep.contains(&std) || null < 0 {
            continue;
        }
        // SAFETY: dup2 of an fd we opened onto a standard fd number.
        unsafe { libc::dup2(null, std) };
    }
    keep.extend([0, 1, 2]);
    keep.sort_unstable();
    keep.dedup();
    let mut from: libc::c_uint = 0;
    for &k in &keep {
        if k as libc::c_uint > from {
            // SAFETY: closes fds in a range that holds none of `keep`.
            unsafe { libc::syscall(libc::SYS_close_range, from, k as libc::c_uint - 1, 0) };
        }
        from = k as libc::c_uint + 1;
    }
    // SAFETY: as above, the range above every fd kept.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

fn guardian_main(
    sock: BorrowedFd<'_>,
    criu_pidfd: BorrowedFd<'_>,
    criu: libc::pid_t,
    keep: &[RawFd],
    log_fd: Option<RawFd>,
) -> i32 {
    crate::testhook::disarm();
    detach_from_criu(keep, log_fd);
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if send(sock, Kind::Ready, 0, me, None).is_err() {
        return 1;
    }
    let mut tracked: Vec<Tracked> = Vec::new();
    let mut killing = false;
    let mut criu_gone = false;
    loop {
        let mut fds = vec![
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: criu_pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if killing {
            fds.extend(tracked.iter().filter_map(|t| {
                t.pidfd.as_ref().map(|p| libc::pollfd {
                    fd: p.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
            }));
        }
        // SAFETY: `fds` is a valid array of pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            criu_gone = true;
        }
        if fds[1].revents != 0 {
            criu_gone = true;
        }
        // Everything criu main sent before it went is still queued: read it
        // all before acting on its absence.
        loop {
            match recv(sock, false) {
                Ok(Recv::Msg(m, fd)) => match Kind::of(m.kind) {
                    Some(Kind::Track) => {
                        let Some(kfd) = fd else {
                            log::error!(
                                "GPU guardian: process {} came without its KFD file",
                                m.pid
                            );
                            continue;
                        };
                        tracked.push(Tracked {
                            id: m.id,
                            pid: m.pid,
                            kfd,
                            pidfd: pidfd_open(m.pid).ok(),
                        });
                    }
                    Some(Kind::Untrack) => tracked.retain(|t| t.id != m.id),
                    Some(Kind::Owner) => {
                        if let Some(t) = tracked.iter_mut().find(|t| t.id == m.id) {
                            t.pid = m.pid;
                            t.pidfd = pidfd_open(m.pid).ok();
                        }
                    }
                    Some(Kind::Stop) => return 0,
                    Some(Kind::Killing) => killing = true,
                    Some(Kind::Ready) | None => {}
                },
                Ok(Recv::Empty) => break,
                Ok(Recv::End) | Err(_) => {
                    criu_gone = true;
                    break;
                }
            }
        }
        if killing {
            tracked.retain(|t| !t.gone());
            if tracked.is_empty() {
                return 0;
            }
        }
        if criu_gone {
            break;
        }
    }
    if killing {
        // criu main sent the SIGKILLs before it went; give them time.
        let end = Instant::now() + KILL_GRACE;
        while Instant::now() < end && tracked.iter().any(|t| !t.gone()) {
            std::thread::sleep(Duration::from_millis(10));
        }
        tracked.retain(|t| !t.gone());
    }
    tracked.retain(|t| !t.gone());
    if tracked.is_empty() {
        return 0;
    }
    log::error!(
        "GPU guardian: criu-rocm (pid {criu}) ended during the dump with {} process(es) paused; unpausing them",
        tracked.len()
    );
    let mut code = 0;
    for t in &tracked {
        if !rescue(t, criu) {
            code = 1;
        }
    }
    code
}

/// Becomes `t`'s ptracer, unpauses its queues, detaches.  False when the
/// queues could not be unpaused.
fn rescue(t: &Tracked, criu: libc::pid_t) -> bool {
    let pid = t.pid;
    let end = Instant::now() + SEIZE_TIMEOUT;
    loop {
        // SAFETY: ptrace request with integer arguments.
        let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ESRCH) => {
                log::info!("GPU guardian: pid {pid} is gone; nothing to unpause");
                return true;
            }
            // Still traced: criu's trace is being released.
            Some(libc::EPERM) if Instant::now() < end && !t.gone() => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                if t.gone() {
                    return true;
                }
                log::error!(
                    "pid {pid}: the GPU guardian cannot become its ptracer to unpause its GPU queues: {e}; \
                     its GPU work stays stopped"
                );
                return false;
            }
        }
    }
    let ok = match Kfd::from_fd(t.kfd.as_fd()).criu_unpause() {
        Ok(()) => {
            log::info!(
                "pid {pid}: GPU queues unpaused by the GPU guardian (criu-rocm {criu} ended during the dump)"
            );
            true
        }
        Err(e) if e.errno() == libc::EINVAL => {
            log::info!("pid {pid}: GPU queues were not paused any more (the GPU guardian had nothing to do)");
            true
        }
        Err(e) => {
            log::error!(
                "pid {pid}: the GPU guardian could not unpause the GPU queues: {e}; its GPU work stays stopped"
            );
            false
        }
    };
    detach(pid);
    ok
}

/// Stops `pid` (seized by us) and detaches it, passing on a signal it
/// stopped for; after [`DETACH_TIMEOUT`] it is left for our exit to detach.
fn detach(pid: i32) {
    // SAFETY: ptrace request with integer arguments on our tracee.
    if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) } != 0 {
        return;
    }
    let end = Instant::now() + DETACH_TIMEOUT;
    loop {
        let mut st = 0;
        // SAFETY: waitpid on our tracee, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG | libc::__WALL) };
        if r == pid {
            if !libc::WIFSTOPPED(st) {
                return;
            }
            let sig = if (st >> 16) == libc::PTRACE_EVENT_STOP {
                0
            } else {
                libc::WSTOPSIG(st)
            };
            // SAFETY: ptrace request with integer arguments on our stopped tracee.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, sig as libc::c_long) };
            return;
        }
        if r < 0 || Instant::now() >= end {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = Msg {
            kind: Kind::Owner as u32,
            id: 7,
            pid: 4321,
            pad: 0,
        };
        let b = Msg::from_bytes(&m.bytes());
        assert_eq!((b.kind, b.id, b.pid), (Kind::Owner as u32, 7, 4321));
        assert_eq!(Kind::of(6), Some(Kind::Killing));
        assert_eq!(Kind::of(0), None);
    }

    #[test]
    fn an_fd_rides_along() {
        let mut pair = [-1; 2];
        // SAFETY: socketpair writes two fds into `pair`.
        let r = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        };
        assert_eq!(r, 0);
        // SAFETY: fresh fds from socketpair.
        let a = unsafe { OwnedFd::from_raw_fd(pair[0]) };
        // SAFETY: as above.
        let b = unsafe { OwnedFd::from_raw_fd(pair[1]) };
        let f = std::fs::File::open("/proc/self/status").unwrap();
        send(a.as_fd(), Kind::Track, 3, 99, Some(f.as_raw_fd())).unwrap();
        send(a.as_fd(), Kind::Stop, 0, 0, None).unwrap();
        drop(a);
        let Recv::Msg(m, Some(fd)) = recv(b.as_fd(), true).unwrap() else {
            panic!("no message with an fd");
        };
        assert_eq!((m.kind, m.id, m.pid), (Kind::Track as u32, 3, 99));
        assert!(crate::os::fd::same_open_file(f.as_fd(), fd.as_fd()).unwrap());
        assert!(
            matches!(recv(b.as_fd(), true).unwrap(), Recv::Msg(m, None) if m.kind == Kind::Stop as u32)
        );
        assert!(matches!(recv(b.as_fd(), false).unwrap(), Recv::End));
    }
}
