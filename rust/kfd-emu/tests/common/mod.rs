//! Shared helpers for the transport and runner tests: running a test body
//! in a child process inside a private mount namespace (the test harness is
//! multi-threaded, and a thread cannot unshare its mount namespace), and a
//! small device double behind the FUSE transport.

#![allow(dead_code)]

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use kfd_emu::fuse::{Caller, FileOps, IoctlReply};

pub const ROLE_ENV: &str = "KFD_EMU_TEST_ROLE";

/// The role this process plays, if it is a re-executed helper.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// Re-executes this test binary running only `test` (ignored or not: a
/// child role is an ignored test) with `role` set; with
/// `unshare`, the child gets a private mount namespace first.
pub fn helper(test: &str, role: &str, env: &[(&str, String)], unshare: bool) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE_ENV, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if unshare {
        let hook = || {
            // SAFETY: unshare has no memory preconditions.
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: constant NUL-terminated path, null optional strings.
            let r = unsafe {
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: the hook only makes async-signal-safe syscalls between
        // fork and exec.
        unsafe { cmd.pre_exec(hook) };
    }
    cmd
}

/// Runs `test` as role `role` in a private mount namespace and asserts it
/// passed.
pub fn run_in_ns(test: &str, role: &str) {
    let out: Output = helper(test, role, &[], true).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helper {role} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "helper {role} did not run its test:\n{text}"
    );
}

pub const fn ioc(dir: u32, nr: u32, size: u32) -> u32 {
    (dir << 30) | (size << 16) | (0x4b << 8) | nr
}
/// Answers `{tgid, tid, value + 1}` for input `{_, _, value}`.
pub const ECHO: u32 = ioc(3, 0xa0, 16);
/// Parks until POST.
pub const WAIT: u32 = ioc(3, 0xa1, 8);
/// Answers every parked WAIT with the posted value.
pub const POST: u32 = ioc(1, 0xa2, 8);

/// Works 300 ms inside the call, then answers `{1}`.
pub const SLOW: u32 = ioc(3, 0xa3, 8);
/// Works 300 ms inside the call, then parks until POST.
pub const SLOW_PARK: u32 = ioc(3, 0xa4, 8);

/// What the double does with an interrupt of a parked request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnInterrupt {
    /// Declines (the trait's default): the transport answers EINTR.
    #[default]
    Transport,
    /// Forgets the request and answers it EINTR itself.
    Cancel,
    /// Keeps it and claims its answer is on the way (the next POST).
    Keep,
}

/// A device double: numbered opens, an echo ioctl, a parkable wait.
#[derive(Default)]
pub struct Double {
    next_fh: AtomicU64,
    pub opens: Mutex<HashMap<u64, Caller>>,
    pub released: Mutex<Vec<u64>>,
    parked: Mutex<Vec<IoctlReply>>,
    pub on_interrupt: Mutex<OnInterrupt>,
    /// The requests `FileOps::interrupt` was called for.
    pub interrupted: Mutex<Vec<u64>>,
}

impl Double {
    /// Requests the double holds parked.
    pub fn held(&self) -> usize {
        self.parked.lock().unwrap().len()
    }
}

impl FileOps for Double {
    fn open(&self, caller: &Caller) -> Result<u64, i32> {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed) + 100;
        self.opens.lock().unwrap().insert(fh, *caller);
        Ok(fh)
    }

    fn release(&self, fh: u64) {
        self.released.lock().unwrap().push(fh);
    }

    fn ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        _arg: u64,
        input: &[u8],
        _out_size: u32,
        reply: IoctlReply,
    ) {
        if !self.opens.lock().unwrap().contains_key(&fh) {
            return reply.reply(Err(libc::EBADF));
        }
        match cmd {
            ECHO => {
                let v = u64::from_ne_bytes(input[8..16].try_into().unwrap());
                let mut out = Vec::new();
                out.extend_from_slice(&caller.tgid.to_ne_bytes());
                out.extend_from_slice(&caller.tid.to_ne_bytes());
                out.extend_from_slice(&(v + 1).to_ne_bytes());
                reply.reply(Ok(out));
            }
            WAIT => self.parked.lock().unwrap().push(reply),
            SLOW => {
                std::thread::sleep(std::time::Duration::from_millis(300));
                reply.reply(Ok(1u64.to_ne_bytes().to_vec()));
            }
            SLOW_PARK => {
                std::thread::sleep(std::time::Duration::from_millis(300));
                self.parked.lock().unwrap().push(reply);
            }
            POST => {
                for r in self.parked.lock().unwrap().drain(..) {
                    r.reply(Ok(input.to_vec()));
                }
                reply.reply(Ok(Vec::new()));
            }
            _ => reply.reply(Err(libc::ENOTTY)),
        }
    }

    fn interrupt(&self, unique: u64) -> bool {
        self.interrupted.lock().unwrap().push(unique);
        match *self.on_interrupt.lock().unwrap() {
            OnInterrupt::Transport => false,
            OnInterrupt::Keep => true,
            OnInterrupt::Cancel => {
                let mut parked = self.parked.lock().unwrap();
                if let Some(i) = parked.iter().position(|r| r.unique() == unique) {
                    let r = parked.swap_remove(i);
                    drop(parked);
                    r.reply(Err(libc::EINTR));
                }
                true
            }
        }
    }
}

#[path = "../../../test-support/scratch.rs"]
mod scratch;
#[allow(unused_imports)] // not every test binary makes scratch directories
pub use scratch::scratch_dir;

/// A memfd of `len` bytes.
pub fn memfd(len: u64) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: memfd_create with a constant name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"kfd-emu-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    assert_eq!(
        // SAFETY: ftruncate on an fd we own.
        unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), len as i64) },
        0
    );
    fd
}

/// ioctl with an 8..16 byte buffer; returns Ok(buffer) or Err(errno).
pub fn raw_ioctl(fd: i32, cmd: u32, buf: &mut [u8]) -> Result<(), i32> {
    // SAFETY: `buf` is live and at least `_IOC_SIZE(cmd)` bytes (callers
    // pass buffers sized for the command).
    let r = unsafe { libc::ioctl(fd, cmd as _, buf.as_mut_ptr()) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(())
    }
}

/// A process's state letter from /proc/PID/stat.
pub fn proc_state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")?.1.chars().next()
}

/// Polls `f` every 10 ms for up to `secs`.
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    f()
}
