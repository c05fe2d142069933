//! The GPU guardian: a small process that unpauses the GPU queues of a
//! dump's paused processes when criu main dies without doing it (SIGKILL, a
//! crash), so that the tree does not run on with its GPU work stopped for
//! good.
//!
//! * It is started before the first KFD process is paused: this program
//!   executed again in a helper mode ([`GUARDIAN_MODE`], [`guardian_main`])
//!   by [`os::process::spawn_self`] with [`Tie::Detached`], so it runs in a
//!   process image of its own.  criu main's child is a shim without an exit
//!   signal that ends once the guardian is forked and is reaped at once, so
//!   the guardian is never a child CRIU waits for or that its SIGCHLD
//!   handlers see, and it outlives criu main: no `PDEATHSIG`, a session of
//!   its own (a Ctrl-C at criu's terminal does not reach it), and SIGHUP,
//!   SIGINT, SIGTERM, SIGQUIT and SIGPIPE ignored.
//! * It holds only what it needs: its end of a `SOCK_SEQPACKET` pair, a
//!   pidfd of criu main, CRIU's log fd, `/dev/null` as stdio, and for each
//!   paused process a copy of its KFD file (sent over the socket before the
//!   process is paused) and a pidfd.  Nothing else of criu's (the shim
//!   closes every other fd before the `execve`): a copy of the parasite's
//!   control socket, for one, would keep a task in its parasite after criu
//!   died.
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

use std::ffi::CString;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use kfd_abi::handle::Kfd;

use super::HelperLog;
#[cfg(doc)]
use crate::os;
use crate::os::fd::{
    inherited, poll_readable, recv_record_with_fd, send_record_with_fd, seqpacket_pair,
    stdio_to_null, Inherited, Received,
};
use crate::os::process::{
    self, pidfd_open, ptrace_detach, ptrace_interrupt, ptrace_seize, wait_nohang, Tie,
};
use crate::os::signal;

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
/// `argv[1]` of the guardian: this program runs as the guardian.
pub const GUARDIAN_MODE: &str = "--criu-rocm-gpu-guardian";
/// The guardian's fds: its end of the socket, criu main's pidfd, CRIU's log.
const SOCK_FD: RawFd = 3;
const CRIU_PIDFD: RawFd = 4;
const LOG_FD: RawFd = 5;
/// The signals the guardian ignores: those a terminal, a shell or a
/// supervisor sends a whole session or process group when it ends criu.
const IGNORED: [libc::c_int; 5] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGQUIT,
    libc::SIGPIPE,
];

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

/// Sends a message with, when given, one fd; never blocks and never raises
/// SIGPIPE.  Async-signal-safe.
fn send(
    sock: BorrowedFd<'_>,
    kind: Kind,
    id: u32,
    pid: i32,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let m = Msg {
        kind: kind as u32,
        id,
        pid,
        pad: 0,
    };
    send_record_with_fd(sock, &m.bytes(), fd)
}

/// Tells the guardian that process `id` was unpaused.  Async-signal-safe
/// (criu's signal handler uses it).
pub(crate) fn tell_unpaused(sock: BorrowedFd<'_>, id: u32) -> io::Result<()> {
    send(sock, Kind::Untrack, id, 0, None)
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
    match recv_record_with_fd(sock, &mut m, block)? {
        Received::Empty => Ok(Recv::Empty),
        Received::End => Ok(Recv::End),
        Received::Record(MSG_LEN, fd) => Ok(Recv::Msg(Msg::from_bytes(&m), fd)),
        Received::Record(..) => Err(io::Error::from_raw_os_error(libc::EPROTO)),
    }
}

/// What the guardian is started with (parsed from its `argv`; its fds are
/// [`SOCK_FD`], [`CRIU_PIDFD`] and, when `log_fd` is given, [`LOG_FD`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardianArgs {
    /// criu main's pid (for messages).
    pub criu: libc::pid_t,
    /// CRIU's log, when criu main handed it over.
    pub log_fd: Option<RawFd>,
    /// The boundary's settings for the log ([`HelperLog::args`]).
    pub log_args: Vec<String>,
}

impl GuardianArgs {
    fn to_argv(&self) -> Vec<CString> {
        let word = |s: String| CString::new(s).expect("no NUL in an argument");
        let mut v = vec![
            word(GUARDIAN_MODE.into()),
            word(self.criu.to_string()),
            word(self.log_fd.map_or("-".into(), |f| f.to_string())),
        ];
        v.extend(self.log_args.iter().map(|a| word(a.clone())));
        v
    }

    /// The guardian's arguments in `argv` (`argv[0]` included), `None`
    /// when `argv[1]` is not [`GUARDIAN_MODE`].
    pub fn parse(argv: &[&[u8]]) -> Option<Result<GuardianArgs, String>> {
        if argv.get(1).copied() != Some(GUARDIAN_MODE.as_bytes()) {
            return None;
        }
        let text = |i: usize| -> Result<&str, String> {
            let a = argv.get(i).ok_or(format!("argument {i} is missing"))?;
            std::str::from_utf8(a).map_err(|_| format!("argument {i} is not UTF-8"))
        };
        Some((|| {
            let criu = text(2)?
                .parse()
                .map_err(|_| format!("argument 2 ({:?}) is no pid", text(2)))?;
            let log_fd = match text(3)? {
                "-" => None,
                t => Some(
                    t.parse()
                        .map_err(|_| format!("argument 3 ({t:?}) is no fd"))?,
                ),
            };
            let log_args = (4..argv.len()).map(text).collect::<Result<Vec<_>, _>>()?;
            Ok(GuardianArgs {
                criu,
                log_fd,
                log_args: log_args.into_iter().map(str::to_owned).collect(),
            })
        })())
    }
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
    /// Starts the guardian; `log` is CRIU's log, which the guardian keeps
    /// to say what it did.
    pub fn start(log: HelperLog<'_>) -> io::Result<Guardian> {
        let (ours, theirs) = seqpacket_pair()?;
        let criu = process::getpid();
        let criu_pidfd = pidfd_open(criu)?;
        let args = GuardianArgs {
            criu,
            log_fd: log.fd.map(|_| LOG_FD),
            log_args: log.args.to_vec(),
        };
        let mut fds = vec![theirs.as_fd(), criu_pidfd.as_fd()];
        fds.extend(log.fd);
        let name = CString::new(COMM).expect("no NUL");
        let shim = process::spawn_self(&name, &args.to_argv(), &fds, Tie::Detached)?.shim;
        let st = process::wait(shim);
        drop(theirs);
        drop(criu_pidfd);
        if !st.success() {
            return Err(io::Error::other(format!(
                "the GPU guardian could not be started: its starter {}",
                st.describe()
            )));
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
    pub fn sock(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Before task `pid`'s KFD process is paused through `kfd`: hands the
    /// guardian a copy of the file.  Returns the id later messages use.
    pub fn track(&mut self, pid: i32, kfd: BorrowedFd<'_>) -> io::Result<u32> {
        let id = self.next;
        self.next += 1;
        send(self.sock.as_fd(), Kind::Track, id, pid, Some(kfd))?;
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
    if !poll_readable(&[sock], Some(READY_TIMEOUT))?[0] {
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
        self.pidfd
            .as_ref()
            .is_none_or(|p| poll_readable(&[p.as_fd()], Some(Duration::ZERO)).is_ok_and(|r| r[0]))
    }
}

/// Sets the guardian apart from criu main: its name, the signals it
/// ignores, and `/dev/null` as stdio (the shim kept criu's fds 0-2 only).
fn detach_from_criu() {
    process::set_name(&CString::new(COMM).expect("no NUL"));
    for sig in IGNORED {
        let _ = signal::ignore(sig);
    }
    let _ = stdio_to_null();
}

/// The guardian process proper (this program started with
/// [`GUARDIAN_MODE`], logging set up by the caller): says it is ready,
/// follows criu main's messages and, should criu main go without a last
/// word, unpauses what it left paused.  Returns the exit status.
pub fn guardian_main(args: &GuardianArgs) -> i32 {
    crate::testhook::disarm();
    detach_from_criu();
    // This mode can be started by hand too: take fds 3 and 4 only if they
    // are what Guardian::start hands over.
    let (s, p) = (inherited(SOCK_FD), inherited(CRIU_PIDFD));
    if s != Inherited::Socket || p != Inherited::Pidfd {
        log::error!(
            "GPU guardian: fd {SOCK_FD} is {s:?} and fd {CRIU_PIDFD} {p:?}, not the socket and \
             criu's pidfd: not started by criu-rocm's dump"
        );
        return 2;
    }
    // SAFETY: fd 3 is an open socket (checked above), handed over by
    // Guardian::start; this fresh process image holds no other owner of it.
    let sock = unsafe { OwnedFd::from_raw_fd(SOCK_FD) };
    // SAFETY: fd 4 is an open pidfd (checked above), criu main's, handed
    // over the same way.
    let criu_pidfd = unsafe { OwnedFd::from_raw_fd(CRIU_PIDFD) };
    let code = std::panic::catch_unwind(|| serve(sock.as_fd(), criu_pidfd.as_fd(), args.criu))
        .unwrap_or(1);
    log::logger().flush();
    code
}

fn serve(sock: BorrowedFd<'_>, criu_pidfd: BorrowedFd<'_>, criu: libc::pid_t) -> i32 {
    let me = process::getpid();
    if send(sock, Kind::Ready, 0, me, None).is_err() {
        return 1;
    }
    let mut w = Watch::default();
    loop {
        w.wait(sock, criu_pidfd);
        // Everything criu main sent before it went is still queued: read it
        // all before acting on its absence.
        if w.read_messages(sock).is_break() {
            return 0;
        }
        if w.killing {
            w.tracked.retain(|t| !t.gone());
            if w.tracked.is_empty() {
                return 0;
            }
        }
        if w.criu_gone {
            break;
        }
    }
    if w.killing {
        // criu main sent the SIGKILLs before it went; give them time.
        let end = Instant::now() + KILL_GRACE;
        while Instant::now() < end && w.tracked.iter().any(|t| !t.gone()) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    w.tracked.retain(|t| !t.gone());
    if w.tracked.is_empty() {
        return 0;
    }
    log::error!(
        "GPU guardian: criu-rocm (pid {criu}) ended during the dump with {} process(es) paused; unpausing them",
        w.tracked.len()
    );
    let mut code = 0;
    for t in &w.tracked {
        if !rescue(t, criu) {
            code = 1;
        }
    }
    code
}

/// What the guardian knows: the processes criu main paused and has not
/// taken back, whether it is killing them, whether it is gone.
#[derive(Default)]
struct Watch {
    tracked: Vec<Tracked>,
    killing: bool,
    criu_gone: bool,
}

impl Watch {
    /// Waits for a message, criu main's end or (while killing) a tracked
    /// process' end.
    fn wait(&mut self, sock: BorrowedFd<'_>, criu_pidfd: BorrowedFd<'_>) {
        let mut fds = vec![sock, criu_pidfd];
        if self.killing {
            fds.extend(
                self.tracked
                    .iter()
                    .filter_map(|t| t.pidfd.as_ref().map(|p| p.as_fd())),
            );
        }
        match poll_readable(&fds, None) {
            Ok(ready) => self.criu_gone |= ready[1],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => self.criu_gone = true,
        }
    }

    /// Reads every queued message; `Break` on Stop (criu main took every
    /// process back).
    fn read_messages(&mut self, sock: BorrowedFd<'_>) -> ControlFlow<()> {
        loop {
            let (m, fd) = match recv(sock, false) {
                Ok(Recv::Msg(m, fd)) => (m, fd),
                Ok(Recv::Empty) => return ControlFlow::Continue(()),
                Ok(Recv::End) | Err(_) => {
                    self.criu_gone = true;
                    return ControlFlow::Continue(());
                }
            };
            match Kind::of(m.kind) {
                Some(Kind::Track) => {
                    let Some(kfd) = fd else {
                        log::error!("GPU guardian: process {} came without its KFD file", m.pid);
                        continue;
                    };
                    self.tracked.push(Tracked {
                        id: m.id,
                        pid: m.pid,
                        kfd,
                        pidfd: pidfd_open(m.pid).ok(),
                    });
                }
                Some(Kind::Untrack) => self.tracked.retain(|t| t.id != m.id),
                Some(Kind::Owner) => {
                    if let Some(t) = self.tracked.iter_mut().find(|t| t.id == m.id) {
                        t.pid = m.pid;
                        t.pidfd = pidfd_open(m.pid).ok();
                    }
                }
                Some(Kind::Stop) => return ControlFlow::Break(()),
                Some(Kind::Killing) => self.killing = true,
                Some(Kind::Ready) | None => {}
            }
        }
    }
}

/// Becomes `t`'s ptracer, unpauses its queues, detaches.  False when the
/// queues could not be unpaused.
fn rescue(t: &Tracked, criu: libc::pid_t) -> bool {
    let pid = t.pid;
    let end = Instant::now() + SEIZE_TIMEOUT;
    while let Err(e) = ptrace_seize(pid) {
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
    if ptrace_interrupt(pid).is_err() {
        return;
    }
    let end = Instant::now() + DETACH_TIMEOUT;
    loop {
        match wait_nohang(pid) {
            Ok(Some(st)) => {
                if st.stopped() {
                    let _ = ptrace_detach(pid, st.stop_signal().unwrap_or(0));
                }
                return;
            }
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(1)),
            _ => return,
        }
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
        let (a, b) = seqpacket_pair().unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        send(a.as_fd(), Kind::Track, 3, 99, Some(f.as_fd())).unwrap();
        tell_unpaused(a.as_fd(), 3).unwrap();
        drop(a);
        let Recv::Msg(m, Some(fd)) = recv(b.as_fd(), true).unwrap() else {
            panic!("no message with an fd");
        };
        assert_eq!((m.kind, m.id, m.pid), (Kind::Track as u32, 3, 99));
        assert!(crate::os::fd::same_open_file(f.as_fd(), fd.as_fd()).unwrap());
        assert!(
            matches!(recv(b.as_fd(), true).unwrap(), Recv::Msg(m, None) if m.kind == Kind::Untrack as u32 && m.id == 3)
        );
        assert!(matches!(recv(b.as_fd(), false).unwrap(), Recv::End));
    }

    #[test]
    fn arguments_round_trip() {
        let a = GuardianArgs {
            criu: 1234,
            log_fd: Some(LOG_FD),
            log_args: vec!["4".into(), "0".into()],
        };
        let argv: Vec<CString> = std::iter::once(CString::new(COMM).unwrap())
            .chain(a.to_argv())
            .collect();
        let words: Vec<&[u8]> = argv.iter().map(|w| w.to_bytes()).collect();
        assert_eq!(GuardianArgs::parse(&words), Some(Ok(a)));
        assert_eq!(GuardianArgs::parse(&[b"criu", b"dump"]), None);
        assert!(matches!(
            GuardianArgs::parse(&[b"x", GUARDIAN_MODE.as_bytes(), b"nope", b"-"]),
            Some(Err(_))
        ));
    }
}
