//! Processes: our ids, pidfds, children reaped by pid (also those without
//! an exit signal), a helper started by re-executing this program, and a
//! worker that runs a function in a copy of this process.

use std::ffi::{c_char, CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Our pid.
pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Our parent's pid.
pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `sig` to the process behind `pidfd` (not to whatever process
/// took its pid after it ended: `ESRCH` then).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: pidfd_send_signal with a NULL siginfo takes integers only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Names this thread (`comm`, at most 15 bytes are kept).
pub fn set_name(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated name (the kernel copies at
    // most 16 bytes).
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// A child's wait status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitStatus(pub libc::c_int);

impl ExitStatus {
    /// Exited with status 0.
    pub fn success(self) -> bool {
        libc::WIFEXITED(self.0) && libc::WEXITSTATUS(self.0) == 0
    }

    /// The signal a tracee stopped with (`None`: it did not stop, or it
    /// stopped for `PTRACE_INTERRUPT`/`PTRACE_LISTEN`, a group stop of a
    /// seized tracee's: nothing to pass on).
    pub fn stop_signal(self) -> Option<libc::c_int> {
        (libc::WIFSTOPPED(self.0) && (self.0 >> 16) != libc::PTRACE_EVENT_STOP)
            .then(|| libc::WSTOPSIG(self.0))
    }

    /// Whether the tracee stopped (for a signal or an event).
    pub fn stopped(self) -> bool {
        libc::WIFSTOPPED(self.0)
    }

    /// How the child ended, in words ("was killed by signal 9 (SIGKILL)").
    pub fn describe(self) -> String {
        if libc::WIFSIGNALED(self.0) {
            let sig = libc::WTERMSIG(self.0);
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGBUS => " (SIGBUS)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        } else if libc::WIFEXITED(self.0) && libc::WEXITSTATUS(self.0) != 0 {
            format!("exited with status {}", libc::WEXITSTATUS(self.0))
        } else {
            "ended".into()
        }
    }
}

/// Reaps child or tracee `pid` if it ended or stopped (`__WALL`), without
/// blocking: `Ok(None)` while it runs.
pub fn wait_nohang(pid: libc::pid_t) -> io::Result<Option<ExitStatus>> {
    let mut st = 0;
    // SAFETY: waitpid writes the status into our int.
    let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG | libc::__WALL) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r == pid).then_some(ExitStatus(st)))
}

/// Reaps child `pid` if it ended (`__WALL`: also a child without an exit
/// signal); `None` while it runs.  A child that cannot be waited for (it is
/// gone already) reads as ended with status 0.
pub fn try_wait(pid: libc::pid_t) -> Option<ExitStatus> {
    let mut st = 0;
    // SAFETY: waitpid writes the status into our int.
    let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG | libc::__WALL) };
    (r == pid || r < 0).then_some(ExitStatus(st))
}

/// Waits for child `pid` to end and reaps it (`__WALL`), restarting on EINTR.
pub fn wait(pid: libc::pid_t) -> ExitStatus {
    loop {
        let mut st = 0;
        // SAFETY: waitpid writes the status into our int.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return ExitStatus(st);
        }
    }
}

/// `PTRACE_SEIZE` of `pid` (no options): we become its ptracer without
/// stopping it.
pub fn ptrace_seize(pid: libc::pid_t) -> io::Result<()> {
    // SAFETY: a ptrace request with integer arguments only.
    ptrace_result(unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) })
}

/// `PTRACE_INTERRUPT` of our tracee `pid`: it stops (reaped by
/// [`wait_nohang`]).
pub fn ptrace_interrupt(pid: libc::pid_t) -> io::Result<()> {
    // SAFETY: a ptrace request with integer arguments only.
    ptrace_result(unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) })
}

/// `PTRACE_DETACH` of our stopped tracee `pid`, passing on signal `sig`
/// (0: none).
pub fn ptrace_detach(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: a ptrace request with integer arguments only.
    ptrace_result(unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, sig as libc::c_long) })
}

fn ptrace_result(r: libc::c_long) -> io::Result<()> {
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Fds a helper started by [`spawn_self`] may be handed.
const MAX_FDS: usize = 16;

extern "C" {
    /// The process environment (POSIX `environ`).
    static environ: *const *const c_char;
}

/// How a helper started by [`spawn_self`] is tied to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tie {
    /// It dies with the calling thread: the shim waits for it and ends as
    /// it ended, and each dies with its parent (`PDEATHSIG`).
    Supervised,
    /// It outlives us: no `PDEATHSIG`, a session of its own, and never our
    /// child (the shim ends as soon as the helper is forked, so the helper
    /// is reparented to the init or subreaper above us).  The shim's status
    /// says only whether the helper was forked; the helper tells the rest.
    Detached,
}

/// A helper started by [`spawn_self`]: the pid to reap (the shim, our
/// child) and the helper's own pid is the helper's to tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spawned {
    /// Our child without an exit signal; with [`Tie::Supervised`] it ends
    /// as the helper ends, with [`Tie::Detached`] once the helper is forked.
    pub shim: libc::pid_t,
}

/// Starts this program (`/proc/self/exe`) again, with `args` (`argv[1..]`;
/// `argv[0]` is `name`) and our environment, holding `fds[i]` as fd `3 + i`
/// and nothing else of ours but fds 0-2.
///
/// The new program runs under a shim: our child, with no exit signal, so
/// that nobody's SIGCHLD handler or `wait(-1)` (without `__WALL`) hears of
/// it (an `execve` would give the child itself an exit signal again).  Reap
/// the shim by pid ([`wait`], [`try_wait`]).  With [`Tie::Supervised`] the
/// shim waits for the helper and ends as it ended (the same exit status, or
/// killed by the same signal), so that its status is the helper's; kill the
/// shim to kill the helper.  Each dies with its parent (`PDEATHSIG`): the
/// shim with the calling thread, the helper with the shim.  With
/// [`Tie::Detached`] the helper gets a session of its own and no
/// `PDEATHSIG`, and the shim ends at once, leaving it to outlive us.
///
/// Soundness: the shim is a copy of a possibly multi-threaded process that
/// skipped the C library's fork handling (`fork()` cannot make a child
/// without an exit signal), so it, and the helper until its `execve`, only
/// make raw system calls that touch no lock and no allocator; everything
/// they need (argv, envp, the fd plan) is built here before the clone, the
/// way `posix_spawn` does it.  The helper proper runs in a fresh process
/// image.
pub fn spawn_self(
    name: &CStr,
    args: &[CString],
    fds: &[BorrowedFd<'_>],
    tie: Tie,
) -> io::Result<Spawned> {
    let mut argv: Vec<*const c_char> = std::iter::once(name.as_ptr())
        .chain(args.iter().map(|a| a.as_ptr()))
        .collect();
    argv.push(std::ptr::null());
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    let mut plan = FdPlan {
        sources: [-1; MAX_FDS],
        n: fds.len(),
        parking: 0,
    };
    for (s, f) in plan.sources.iter_mut().zip(fds) {
        *s = f.as_raw_fd();
    }
    // Sources first move above every number in play, so that placing them
    // at 3.. never overwrites one not yet placed.
    plan.parking = plan.sources[..plan.n]
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(FIRST_FD + plan.n as RawFd)
        + 1;
    let setup = ChildSetup {
        dies_with_parent: tie == Tie::Supervised,
        signals: ChildSignals::Default,
    };
    // SAFETY: the child runs `shim` only (see the soundness note above),
    // which makes raw system calls on what was prepared above and ends in
    // `execve` or `_exit`.
    let shim_pid = unsafe { fork_child(setup, || shim(tie, &plan, c"/proc/self/exe", &argv)) }?;
    Ok(Spawned { shim: shim_pid })
}

/// The first fd number a helper is handed.
const FIRST_FD: RawFd = 3;

/// Which of our fds a helper gets, as fds 3, 4, ...
struct FdPlan {
    sources: [RawFd; MAX_FDS],
    n: usize,
    /// Above every source and target.
    parking: RawFd,
}

/// `clone(flags)` without a new stack: a copy of this process, continuing
/// here; 0 in the child.
///
/// # Safety
/// The child must only make async-signal-safe calls that touch no lock and
/// no allocator, and leave through `execve` or `_exit`.
unsafe fn raw_fork(flags: libc::c_ulong) -> libc::c_long {
    // SAFETY: no new stack and no shared memory: the child is a copy; the
    // caller keeps the child to what is safe in such a copy.
    unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) }
}

/// How a child of [`fork_child`] starts, before the code it was given.
#[derive(Clone, Copy)]
struct ChildSetup {
    /// SIGKILL at the calling thread's death ([`die_with`]).
    dies_with_parent: bool,
    /// What becomes of the signals it inherited handlers for.
    signals: ChildSignals,
}

/// The start of [`spawn_self`] and [`fork_worker`]: `child` run in a copy
/// of this process, our child without an exit signal (a fork-like clone),
/// set up first as `setup` says with what was prepared here before the
/// clone (our pid, an empty signal set).  Returns the child's pid.
/// `child` is not to return (the shim executes or exits, a worker waits
/// to be killed); one that did would end the child with status 127, never
/// returning here.
///
/// # Safety
/// As [`raw_fork`]'s: `child` must only make raw system calls that touch
/// no lock and no allocator, on memory made before the call or on its own
/// stack, and leave through `execve`, `_exit` or a wait to be killed.
unsafe fn fork_child(setup: ChildSetup, child: impl FnOnce()) -> io::Result<libc::pid_t> {
    let parent = getpid();
    let unblocked = empty_set();
    // SAFETY: a fork-like clone (no flags, exit signal 0).  The child sets
    // itself up with raw system calls on what was prepared above, then runs
    // `child`, whose caller promised the same, and never returns here; the
    // parent goes on as before.
    let pid = unsafe { raw_fork(0) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        if setup.dies_with_parent {
            die_with(parent);
        }
        set_signals(setup.signals, &unblocked);
        child();
        exit_now(127)
    }
    Ok(pid as libc::pid_t)
}

/// Ends the calling process at once, running no exit handler.
fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit has no preconditions and runs nothing of this process.
    unsafe { libc::_exit(code) }
}

/// The shim of [`spawn_self`], once [`fork_child`] set it up (dying with
/// its parent when supervised, every signal to its default): raw system
/// calls on integers and on memory prepared before the clone; no
/// allocation, no lock, no unwinding.
fn shim(tie: Tie, plan: &FdPlan, exe: &CStr, argv: &[*const c_char]) -> ! {
    place_fds(plan);
    let me = getpid();
    // SAFETY: a fork-like clone with SIGCHLD as its exit signal; the child
    // only arms PDEATHSIG or starts a session, and executes (see spawn_self).
    let helper = unsafe { raw_fork(libc::SIGCHLD as libc::c_ulong) };
    if helper < 0 {
        exit_now(126);
    }
    if helper == 0 {
        match tie {
            Tie::Supervised => die_with(me),
            Tie::Detached => {
                // SAFETY: setsid takes no arguments; a fresh fork is no
                // process group leader, so it cannot fail.
                unsafe { libc::setsid() };
            }
        }
        // SAFETY: a NUL-terminated path, a NULL-terminated argv of C
        // strings alive in this copy of the parent's memory, and the
        // environment.
        unsafe { libc::execve(exe.as_ptr(), argv.as_ptr(), environ) };
        exit_now(127);
    }
    if tie == Tie::Detached {
        exit_now(0);
    }
    exit_as(helper as libc::pid_t, me)
}

/// Arms SIGKILL at the parent's death, and exits should `parent` have died
/// before that.  Child code (see [`fork_child`]).
fn die_with(parent: libc::pid_t) {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if getppid() != parent {
        exit_now(126);
    }
}

/// What a child of [`fork_child`] makes of the signals: the parent's
/// handlers (CRIU's SIGCHLD handler, for one) are not its to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ChildSignals {
    /// Every signal to its default action: a shim, and the program it
    /// executes.
    Default,
    /// Every signal but the faults ignored: a worker is ended by its
    /// parent or with it, not by a signal sent to the parent's process
    /// group.
    IgnoredButFaults,
}

/// Every signal (but SIGKILL, SIGSTOP) as `how` says, and the mask
/// `unblocked` prepared before the clone (none blocked).  Child code (see
/// [`fork_child`]).
fn set_signals(how: ChildSignals, unblocked: &libc::sigset_t) {
    const FAULTS: [libc::c_int; 7] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGABRT,
        libc::SIGTRAP,
        libc::SIGSYS,
    ];
    for sig in 1..=libc::SIGSYS {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let action = if how == ChildSignals::Default || FAULTS.contains(&sig) {
            libc::SIG_DFL
        } else {
            libc::SIG_IGN
        };
        // SAFETY: signal() with SIG_DFL or SIG_IGN installs no code of ours.
        unsafe { libc::signal(sig, action) };
    }
    // SAFETY: a valid sigset prepared before the clone.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, unblocked, std::ptr::null_mut()) };
}

/// Places the plan's fds at FIRST_FD on (parked above `plan.parking` first,
/// so no source is overwritten before it is copied) and closes all others.
/// Shim code (see [`shim`]).
fn place_fds(plan: &FdPlan) {
    let mut parked: [RawFd; MAX_FDS] = [-1; MAX_FDS];
    for (slot, &s) in parked.iter_mut().zip(&plan.sources[..plan.n]) {
        // SAFETY: F_DUPFD of an fd we inherited to a number ≥ parking.
        *slot = unsafe { libc::fcntl(s, libc::F_DUPFD, plan.parking) };
        if *slot < 0 {
            exit_now(126);
        }
    }
    for (i, &p) in parked[..plan.n].iter().enumerate() {
        // SAFETY: dup2 of our own fd onto a number below parking, which
        // holds none of the parked copies (the result has no CLOEXEC).
        if unsafe { libc::dup2(p, FIRST_FD + i as RawFd) } < 0 {
            exit_now(126);
        }
    }
    let keep = (FIRST_FD as usize + plan.n) as libc::c_uint;
    // SAFETY: closes every fd above the ones placed; touches no memory.
    unsafe { libc::syscall(libc::SYS_close_range, keep, libc::c_uint::MAX, 0) };
}

/// Waits for `helper` and ends shim `me` as it ended: the same exit code,
/// or killed by the same signal.  Shim code (see [`shim`]).
fn exit_as(helper: libc::pid_t, me: libc::pid_t) -> ! {
    let st = loop {
        let mut st = 0;
        // SAFETY: waitpid writes the status into our int.
        let r = unsafe { libc::waitpid(helper, &mut st, 0) };
        if r == helper {
            break st;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            exit_now(126);
        }
    };
    if libc::WIFSIGNALED(st) {
        // Its default action (every disposition is the default here).
        let _ = kill(me, libc::WTERMSIG(st));
        exit_now(128 + libc::WTERMSIG(st));
    }
    exit_now(libc::WEXITSTATUS(st))
}

/// Fds a worker started by [`fork_worker`] may keep.
const MAX_WORKER_FDS: usize = 8;

/// Starts `work` in a copy of this process: our child without an exit
/// signal (so, as with [`spawn_self`], no SIGCHLD handler hears of it, nor
/// a `wait(-1)` without `__WALL`), holding only the fds `keep` of ours,
/// dying with the calling thread (`PDEATHSIG`) and ignoring every signal
/// that is not a fault.  Once `work` returns it closes all its fds and
/// waits to be killed: it never ends on its own, so that a `wait4(-1,
/// __WALL)` of CRIU's (compel's wait for its tracees to stop at a syscall,
/// the reaping of a killed tree) cannot meet it ended.  End it with
/// [`end_worker`].
///
/// # Safety
/// `work` runs in a copy of a possibly multi-threaded process that skipped
/// the C library's fork handling: it must make only raw system calls that
/// touch no lock and no allocator (no logging, no panic), on memory made
/// before the call or on its own stack.
pub unsafe fn fork_worker(keep: &[RawFd], work: impl FnOnce()) -> io::Result<libc::pid_t> {
    if keep.len() > MAX_WORKER_FDS {
        return Err(io::Error::from_raw_os_error(libc::EMFILE));
    }
    let mut kept = [-1; MAX_WORKER_FDS];
    kept[..keep.len()].copy_from_slice(keep);
    kept.sort_unstable();
    let setup = ChildSetup {
        dies_with_parent: true,
        signals: ChildSignals::IgnoredButFaults,
    };
    // SAFETY: the child makes raw system calls on what was prepared above
    // and runs `work`, whose caller promised the same, then waits to be
    // killed.
    unsafe {
        fork_child(setup, move || {
            close_all_but(&kept);
            work();
            close_all_but(&[]);
            wait_to_be_killed()
        })
    }
}

/// Waits, never to return: nothing a worker does not ignore but SIGKILL
/// reaches it.  Worker code (see [`fork_worker`]).
fn wait_to_be_killed() -> ! {
    loop {
        // SAFETY: pause takes no arguments; nothing we do not ignore but
        // SIGKILL reaches us, so it does not return.
        unsafe { libc::pause() };
    }
}

/// Ends worker `pid` of [`fork_worker`] (SIGKILL) and reaps it.
pub fn end_worker(pid: libc::pid_t) -> ExitStatus {
    // Our child, not reaped yet: the pid is still its.
    let _ = kill(pid, libc::SIGKILL);
    wait(pid)
}

/// Closes every fd but the non-negative ones of `keep` (ascending).
/// Worker code (see [`fork_worker`]).
fn close_all_but(keep: &[RawFd]) {
    let mut from: libc::c_uint = 0;
    for &k in keep.iter().filter(|&&k| k >= 0) {
        let k = k as libc::c_uint;
        if k > from {
            // SAFETY: closes fds [from, k - 1]; touches no memory.
            unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0) };
        }
        from = from.max(k + 1);
    }
    // SAFETY: closes every fd from `from` on; touches no memory.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

/// An empty signal set.
pub(crate) fn empty_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signal set `name` ("SigIgn:", ...) of a /proc status text.
    fn sig_mask(status: &str, name: &str) -> u64 {
        let line = status.lines().find_map(|l| l.strip_prefix(name));
        u64::from_str_radix(line.expect(name).trim(), 16).unwrap()
    }

    /// The test binary re-executed: `--list` lists its tests and exits 0
    /// (it ran our argv); it is reaped by pid although it has no exit signal.
    #[test]
    fn a_spawned_self_runs_and_is_reaped_by_pid() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let list = [CString::new("--list").unwrap()];
        let pid = spawn_self(
            c"criu-rocm-test",
            &list,
            &[std::os::fd::AsFd::as_fd(&f)],
            Tie::Supervised,
        )
        .unwrap()
        .shim;
        let st = wait(pid);
        assert!(st.success(), "{}", st.describe());
        let bad = [CString::new("--no-such-flag").unwrap()];
        let pid = spawn_self(c"x", &bad, &[], Tie::Supervised).unwrap().shim;
        let st = wait(pid);
        assert!(!st.success(), "{}", st.describe());
        assert!(
            st.describe().starts_with("exited with status"),
            "{}",
            st.describe()
        );
    }

    /// A detached helper runs on its own: its shim is reaped, and the
    /// helper is not our child.  The helper is the test binary running one
    /// other test, logging to the pipe it holds as fd 3, so the test sees
    /// that it ran.
    #[test]
    fn a_detached_helper_outlives_its_shim() {
        let (r, w) = std::io::pipe().unwrap();
        let args = [
            CString::new("--exact").unwrap(),
            CString::new("os::process::tests::statuses_in_words").unwrap(),
            CString::new("--logfile").unwrap(),
            CString::new("/dev/fd/3").unwrap(),
        ];
        let shim = spawn_self(
            c"criu-rocm-test",
            &args,
            &[std::os::fd::AsFd::as_fd(&w)],
            Tie::Detached,
        )
        .unwrap()
        .shim;
        drop(w);
        let st = wait(shim);
        assert!(st.success(), "{}", st.describe());
        // The pipe reads end-of-file once the helper (the only holder of
        // its write end) is gone; its log says it ran the test.
        let mut log = String::new();
        std::io::Read::read_to_string(&mut &r, &mut log).unwrap();
        assert!(
            log.lines()
                .any(|l| l == "ok os::process::tests::statuses_in_words"),
            "the helper's log: {log:?}"
        );
        // The shim was reaped, and the helper was never this thread's child:
        // an ended child stays on its parent's list until it is reaped.
        let e = wait_nohang(shim).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECHILD));
        let tid = super::super::signal::gettid();
        let kids = std::fs::read_to_string(format!("/proc/self/task/{tid}/children")).unwrap();
        assert_eq!(kids.trim(), "", "children of this thread");
    }

    /// A worker holds only the fds it keeps, closes them once its work is
    /// done (its pipe reads end-of-file) and then waits to be ended: it is
    /// reaped by pid, killed by SIGKILL.
    #[test]
    fn a_worker_keeps_its_fds_and_waits_to_be_ended() {
        let (r, w) = crate::os::fd::pipe().unwrap();
        let other = std::fs::File::open("/proc/self/status").unwrap();
        let (wfd, ofd) = (w.as_raw_fd(), other.as_raw_fd());
        let work = move || {
            // SAFETY: F_GETFD of an fd number touches no memory.
            let held = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
            let said = [u8::from(held(wfd)), u8::from(held(ofd))];
            // SAFETY: write of the two bytes on our stack.
            unsafe { libc::write(wfd, said.as_ptr().cast(), said.len()) };
        };
        // SAFETY: the work makes raw fcntl and write calls on its stack.
        let pid = unsafe { fork_worker(&[wfd], work) }.unwrap();
        drop(w);
        let mut said = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(r), &mut said).unwrap();
        assert_eq!(said, [1, 0], "the kept fd held, the other closed");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let mask = |name| sig_mask(&status, name);
        // Of signals 1-31 (the realtime ones are left as inherited), all
        // but SIGKILL, SIGSTOP and the seven faults (SIGILL, SIGTRAP,
        // SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS).
        let standard = 0x7fff_ffff;
        assert_eq!(mask("SigIgn:") & standard, 0x3ffb_fa07, "ignored: {status}");
        assert_eq!(mask("SigBlk:"), 0, "blocked: {status}");
        assert_eq!(wait_nohang(pid).unwrap(), None, "it waits to be ended");
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count();
        assert_eq!(fds, 0, "no fd left once its work is done");
        let st = end_worker(pid);
        assert_eq!(st.describe(), "was killed by signal 9 (SIGKILL)");
        let e = wait_nohang(pid).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ECHILD), "reaped");
    }

    /// argv[0] of the helper [`supervised_helper_sleeps`] is started as.
    const SLEEPER: &CStr = c"criu-rocm-sleeper";

    /// Not a test: the helper of [`a_supervised_shim_ends_as_its_helper`],
    /// which sleeps when started under [`SLEEPER`]'s name (and returns at
    /// once when the test binary is run with `--ignored`).
    #[test]
    #[ignore]
    fn supervised_helper_sleeps() {
        if std::env::args_os()
            .next()
            .is_some_and(|a| a.as_encoded_bytes() == SLEEPER.to_bytes())
        {
            std::thread::sleep(std::time::Duration::from_secs(60));
        }
    }

    /// The shim of a supervised helper holds none of our signal settings
    /// (this test binary ignores SIGPIPE; no standard signal is ignored or
    /// blocked in the shim), ends killed by the signal that killed its
    /// helper, and a helper whose shim is killed dies with it.
    #[test]
    fn a_supervised_shim_ends_as_its_helper() {
        let args = [
            CString::new("--exact").unwrap(),
            CString::new("os::process::tests::supervised_helper_sleeps").unwrap(),
            CString::new("--ignored").unwrap(),
        ];
        let helper_of = |shim: libc::pid_t| {
            let children = format!("/proc/{shim}/task/{shim}/children");
            for _ in 0..1000 {
                let kids = std::fs::read_to_string(&children).unwrap_or_default();
                if let Some(pid) = kids.split_whitespace().next() {
                    return pid.parse::<libc::pid_t>().unwrap();
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            panic!("shim {shim} never forked its helper");
        };
        let shim = spawn_self(SLEEPER, &args, &[], Tie::Supervised)
            .unwrap()
            .shim;
        let helper = helper_of(shim);
        let status = std::fs::read_to_string(format!("/proc/{shim}/status")).unwrap();
        let mask = |name| sig_mask(&status, name);
        // Signals 1-31 (the realtime ones are left as inherited).
        assert_eq!(mask("SigIgn:") & 0x7fff_ffff, 0, "ignored: {status}");
        assert_eq!(mask("SigBlk:"), 0, "blocked: {status}");
        kill(helper, libc::SIGTERM).unwrap();
        assert_eq!(wait(shim).describe(), "was killed by signal 15 (SIGTERM)");

        let shim = spawn_self(SLEEPER, &args, &[], Tie::Supervised)
            .unwrap()
            .shim;
        let helper = helper_of(shim);
        let pidfd = pidfd_open(helper).unwrap();
        kill(shim, libc::SIGKILL).unwrap();
        assert_eq!(wait(shim).describe(), "was killed by signal 9 (SIGKILL)");
        assert!(
            crate::os::fd::poll_one(
                std::os::fd::AsFd::as_fd(&pidfd),
                libc::POLLIN,
                std::time::Duration::from_secs(10)
            )
            .unwrap(),
            "the helper outlived its shim by 10 s"
        );
    }

    #[test]
    fn statuses_in_words() {
        assert_eq!(ExitStatus(9).describe(), "was killed by signal 9 (SIGKILL)");
        assert_eq!(ExitStatus(3 << 8).describe(), "exited with status 3");
        assert!(ExitStatus(0).success() && !ExitStatus(9).success());
    }
}
