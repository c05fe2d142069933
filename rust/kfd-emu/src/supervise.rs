//! `kfd-emu supervise -- CMD`: runs CMD under a seccomp filter whose
//! listener the emulator holds, so that the emulated devices can answer the
//! ioctls whose result is a new file descriptor, which FUSE cannot.
//!
//! * The filter (`filter`) traps `ioctl` with the request numbers
//!   that return fds: AMDKFD_IOC_CRIU_OP (CHECKPOINT and RESTORE hand out
//!   one dma-buf per VRAM/GTT BO), AMDKFD_IOC_EXPORT_DMABUF (KFD 1.12) and
//!   DRM_IOCTL_PRIME_HANDLE_TO_FD; and
//!   every `mmap` of a file (no MAP_ANONYMOUS), so that the device model
//!   can refuse a BO mapping through a render-node file that does not own
//!   the BO, as `drm_gem_mmap` does (FUSE passthrough maps the backing
//!   file without asking the daemon); and the stat family, so that the
//!   render nodes look like DRM's character devices (`crate::chardev`:
//!   libdrm tells devices apart by `fstat`).  Every other system call, and these
//!   on any other architecture, are allowed by the filter itself.
//! * `kfd-emu supervise` installs the filter with
//!   SECCOMP_FILTER_FLAG_NEW_LISTENER, sends the listener over the unix
//!   socket `$KFD_EMU_STATE_DIR/supervise.sock` to the `kfd-emu run` that
//!   serves the devices, waits for its acknowledgement, closes its own
//!   copy and execs CMD.  Children of CMD inherit the filter (CRIU's
//!   restored tasks too): their trapped calls go to the same listener.
//! * The daemon (`serve`) answers each trapped ioctl on a thread of its
//!   own, so no call waits behind another; an mmap, whose check never
//!   waits, is answered on the listener's thread.  A call on a file that is not
//!   one of the emulated device nodes, or one the handler does not take
//!   (another CRIU op), is answered SECCOMP_USER_NOTIF_FLAG_CONTINUE: the
//!   kernel runs it as if there were no filter.  No trapped call is ever
//!   parked: the handler answers at once.
//! * The target's memory and fds are reached with process_vm_readv/writev
//!   and pidfd_getfd; SECCOMP_IOCTL_NOTIF_ID_VALID after those reads
//!   proves the thread is still the one that made the call (not a reused
//!   pid).  A notification whose caller got a signal is withdrawn and the
//!   call restarts; the handler's answers are idempotent (`Notice::addfd`
//!   fails then, and the device model replays its result to the restarted
//!   call).
//!
//! A dumped filter comes back without its listener: `kfd-emu supervise
//! --attach PID` (`crate::reattach`) gives a restored process one again.
//! CRIU under a filter cannot dump a process with one (see the README).

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;

use kfd_abi::ioctl::{AMDKFD_IOC_CRIU_OP, AMDKFD_IOC_EXPORT_DMABUF, DRM_IOCTL_PRIME_HANDLE_TO_FD};

use crate::os_err;

/// The socket in the state directory on which the daemon takes listeners.
pub const SOCKET: &str = "supervise.sock";

/// The request numbers the filter traps.
pub const TRAPPED: [u32; 3] = [
    AMDKFD_IOC_CRIU_OP,
    AMDKFD_IOC_EXPORT_DMABUF,
    DRM_IOCTL_PRIME_HANDLE_TO_FD,
];

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
/// BPF_LD (0x00) | BPF_W (0x00) | BPF_ABS (0x20).
const BPF_LD_W_ABS: u16 = 0x20;
/// BPF_JMP (0x05) | BPF_JEQ (0x10) | BPF_K (0x00).
const BPF_JEQ_K: u16 = 0x15;
/// BPF_JMP (0x05) | BPF_JSET (0x40) | BPF_K (0x00).
const BPF_JSET_K: u16 = 0x45;
/// BPF_RET (0x06) | BPF_K (0x00).
const BPF_RET_K: u16 = 0x06;
/// BPF_LDX (0x01) | BPF_W (0x00) | BPF_IMM (0x00): the tag's load into X,
/// which nothing reads.
const BPF_LDX_IMM: u16 = 0x01;

// struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer;
// __u64 args[6].
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
/// The low 32 bits of args[1] (the ioctl request, an `unsigned int` in
/// the kernel) on a little-endian machine.
const DATA_ARG1_LO: u32 = 16 + 8;
/// The low 32 bits of args[3] (mmap's flags, an `unsigned long` whose
/// high half holds no flag).
const DATA_ARG3_LO: u32 = 16 + 3 * 8;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The stat family: under the filter, the emulated render nodes are
/// character devices (`crate::serve` answers these calls for them).
pub const STAT_CALLS: [libc::c_long; 5] = [
    libc::SYS_fstat,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
];

/// The filter: `ioctl` with a request in [`TRAPPED`], `mmap` without
/// MAP_ANONYMOUS and the stat family ([`STAT_CALLS`]) → USER_NOTIF,
/// anything else → ALLOW.
pub fn filter() -> Vec<libc::sock_filter> {
    let n = TRAPPED.len() as u8;
    let s = STAT_CALLS.len() as u8;
    // Instruction index of the mmap check, then of the two returns.
    let mmap_at = 3 + s;
    let allow = mmap_at + 5 + n;
    let notif = allow + 1;
    // A jump offset from instruction `at` to `to`.
    let to = |at: u8, to: u8| to - at - 1;
    let mut f = vec![
        insn(BPF_LD_W_ABS, 0, 0, DATA_ARCH),
        // Another architecture (a 32-bit compat call): allow.
        insn(BPF_JEQ_K, 0, to(1, allow), AUDIT_ARCH),
        insn(BPF_LD_W_ABS, 0, 0, DATA_NR),
    ];
    for (i, &nr) in STAT_CALLS.iter().enumerate() {
        f.push(insn(BPF_JEQ_K, to(3 + i as u8, notif), 0, nr as u32));
    }
    f.extend([
        insn(
            BPF_JEQ_K,
            0,
            to(mmap_at, mmap_at + 3),
            libc::SYS_mmap as u32,
        ),
        insn(BPF_LD_W_ABS, 0, 0, DATA_ARG3_LO),
        insn(
            BPF_JSET_K,
            to(mmap_at + 2, allow),
            to(mmap_at + 2, notif),
            libc::MAP_ANONYMOUS as u32,
        ),
        insn(BPF_JEQ_K, 0, to(mmap_at + 3, allow), libc::SYS_ioctl as u32),
        insn(BPF_LD_W_ABS, 0, 0, DATA_ARG1_LO),
    ]);
    for (i, &req) in TRAPPED.iter().enumerate() {
        f.push(insn(BPF_JEQ_K, to(mmap_at + 5 + i as u8, notif), 0, req));
    }
    f.push(insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW));
    f.push(insn(BPF_RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF));
    debug_assert_eq!(f.len(), notif as usize + 1);
    f
}

/// [`filter`], tagged: its first instruction loads `tag` into X (read by
/// nothing), so that the filter of a listener the daemon holds can be
/// told among a thread's (PTRACE_SECCOMP_GET_FILTER; see [`tag_of`]).
pub fn tagged_filter(tag: u32) -> Vec<libc::sock_filter> {
    let mut f = filter();
    // Every jump is forward and relative: prepending moves none.
    f.insert(0, insn(BPF_LDX_IMM, 0, 0, tag));
    f
}

/// The tag of a filter [`tagged_filter`] made, None for any other.
pub fn tag_of(prog: &[libc::sock_filter]) -> Option<u32> {
    let (first, rest) = prog.split_first()?;
    let plain = filter();
    let same = |a: &libc::sock_filter, b: &libc::sock_filter| {
        (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k)
    };
    let ours = first.code == BPF_LDX_IMM
        && rest.len() == plain.len()
        && rest.iter().zip(&plain).all(|(a, b)| same(a, b));
    ours.then_some(first.k)
}

/// A new tag for a listener's filter (random, never 0).
pub fn new_tag() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    u32::from_ne_bytes(b).max(1)
}

/// Runs the filter over one system call (tests: the program's meaning).
pub fn run_filter(prog: &[libc::sock_filter], data: &libc::seccomp_data) -> u32 {
    let word = |off: u32| -> u32 {
        match off {
            DATA_NR => data.nr as u32,
            DATA_ARCH => data.arch,
            o if (16..64).contains(&o) => {
                let a = data.args[(o as usize - 16) / 8];
                if o % 8 == 0 {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            _ => 0,
        }
    };
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let i = &prog[pc];
        match i.code {
            BPF_LD_W_ABS => acc = word(i.k),
            BPF_JEQ_K => {
                pc += if acc == i.k { i.jt } else { i.jf } as usize;
            }
            BPF_JSET_K => {
                pc += if acc & i.k != 0 { i.jt } else { i.jf } as usize;
            }
            BPF_RET_K => return i.k,
            BPF_LDX_IMM => {}
            c => panic!("opcode {c:#x}"),
        }
        pc += 1;
    }
}

fn has_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|c| c & (1 << 21) != 0)
}

/// Installs the filter on the calling thread (the process is
/// single-threaded here), tagged `tag`, and returns its listener.
fn install_filter(tag: u32) -> io::Result<OwnedFd> {
    if !has_sys_admin() {
        // seccomp() demands it of an unprivileged caller.
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
            return Err(os_err("PR_SET_NO_NEW_PRIVS"));
        }
    }
    let prog = tagged_filter(tag);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: seccomp reads `fprog` and the program it points to, both
    // live across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        return Err(os_err("seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER)"));
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A control message carrying one fd: `struct cmsghdr` and the fd, laid
/// out as CMSG_LEN/CMSG_SPACE place them (the header's size is a
/// multiple of the alignment on Linux, so the data follows it directly).
#[repr(C)]
struct FdCmsg {
    hdr: libc::cmsghdr,
    fd: RawFd,
    pad: u32,
}

fn fd_cmsg(fd: RawFd) -> FdCmsg {
    // SAFETY: an all-zero cmsghdr is valid (its private padding fields
    // on some libcs cannot be named).
    let mut hdr: libc::cmsghdr = unsafe { std::mem::zeroed() };
    hdr.cmsg_level = libc::SOL_SOCKET;
    hdr.cmsg_type = libc::SCM_RIGHTS;
    hdr.cmsg_len = (std::mem::size_of::<libc::cmsghdr>() + std::mem::size_of::<RawFd>()) as _;
    FdCmsg { hdr, fd, pad: 0 }
}

fn msghdr(iov: &mut libc::iovec, cm: &mut FdCmsg) -> libc::msghdr {
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (cm as *mut FdCmsg).cast();
    msg.msg_controllen = std::mem::size_of::<FdCmsg>() as _;
    msg
}

/// Sends `fd` with one data byte over `sock` (SCM_RIGHTS).
fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>, tag: u32) -> io::Result<()> {
    let msg = request(b'L', tag);
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    let mut cm = fd_cmsg(fd.as_raw_fd());
    let msg = msghdr(&mut iov, &mut cm);
    // SAFETY: `msg` and everything it points to live across the call.
    if unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) } != REQUEST as isize {
        return Err(os_err("sending the seccomp listener"));
    }
    Ok(())
}

/// A request on the socket: a kind (`L`: the listener of the filter of
/// this tag comes with it; `R`: release the listener of this tag) and the
/// tag.
const REQUEST: usize = 5;

fn request(kind: u8, tag: u32) -> [u8; REQUEST] {
    let t = tag.to_le_bytes();
    [kind, t[0], t[1], t[2], t[3]]
}

/// What came on the socket.
enum Request {
    Listener(OwnedFd, u32),
    Release(u32),
}

/// Receives one request ([`send_fd`], [`release`]).
fn recv_request(sock: &UnixStream) -> io::Result<Request> {
    let mut req = [0u8; REQUEST];
    let mut iov = libc::iovec {
        iov_base: req.as_mut_ptr().cast(),
        iov_len: REQUEST,
    };
    let mut cm = fd_cmsg(-1);
    cm.hdr.cmsg_len = 0;
    let mut msg = msghdr(&mut iov, &mut cm);
    // SAFETY: `msg` and its buffers live across the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let tag = u32::from_le_bytes([req[1], req[2], req[3], req[4]]);
    if n == REQUEST as isize && req[0] == b'R' && msg.msg_controllen == 0 {
        return Ok(Request::Release(tag));
    }
    let want = std::mem::size_of::<libc::cmsghdr>() + std::mem::size_of::<RawFd>();
    let ok = n == REQUEST as isize
        && req[0] == b'L'
        && msg.msg_controllen >= want
        && cm.hdr.cmsg_level == libc::SOL_SOCKET
        && cm.hdr.cmsg_type == libc::SCM_RIGHTS
        && cm.hdr.cmsg_len == want
        && cm.fd >= 0;
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no listener received",
        ));
    }
    // SAFETY: the kernel installed this fd for us.
    Ok(Request::Listener(
        unsafe { OwnedFd::from_raw_fd(cm.fd) },
        tag,
    ))
}

/// `kfd-emu supervise -- CMD`: installs the filter, hands the listener to
/// the daemon of `state_dir` and execs CMD (returns only on failure).
pub fn supervise(state_dir: &Path, cmd: &[OsString]) -> io::Error {
    let Some(prog) = cmd.first() else {
        return io::Error::new(io::ErrorKind::InvalidInput, "no command given after --");
    };
    let sock = match connect(state_dir) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let tag = new_tag();
    let listener = match install_filter(tag) {
        Ok(l) => l,
        Err(e) => return e,
    };
    if let Err(e) = send_listener(sock, listener, tag) {
        return e;
    }
    std::process::Command::new(prog).args(&cmd[1..]).exec()
}

/// Hands `listener` (of a filter tagged `tag`) to the daemon of
/// `state_dir` (`kfd-emu supervise --attach`, `crate::reattach`).
pub fn hand_over(state_dir: &Path, listener: OwnedFd, tag: u32) -> io::Result<()> {
    send_listener(connect(state_dir)?, listener, tag)
}

/// Asks the daemon of `state_dir` to close its listener of the filter
/// tagged `tag` (the calls that filter traps fail ENOSYS from then on, as
/// a restored filter's do); returns whether it held one.  Seccomp gives a
/// thread no new listener while a filter of its own has one
/// (`supervise --attach` of a process a supervised CRIU restored: it
/// inherited that CRIU's filter, under the one restored from its image).
pub fn release(state_dir: &Path, tag: u32) -> io::Result<bool> {
    let mut sock = connect(state_dir)?;
    sock.write_all(&request(b'R', tag))?;
    let mut ack = [0u8];
    sock.read_exact(&mut ack)
        .map_err(|e| io::Error::new(e.kind(), format!("waiting for the emulator: {e}")))?;
    Ok(ack[0] == b'+')
}

fn connect(state_dir: &Path) -> io::Result<UnixStream> {
    let path = state_dir.join(SOCKET);
    UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {e} (is this running under `kfd-emu run`?)",
                path.display()
            ),
        )
    })
}

/// Sends the listener (closing our copy) and waits for the daemon to
/// take it.
fn send_listener(sock: UnixStream, listener: OwnedFd, tag: u32) -> io::Result<()> {
    send_fd(&sock, listener.as_fd(), tag)?;
    drop(listener);
    let mut ack = [0u8];
    (&sock)
        .read_exact(&mut ack)
        .map_err(|e| io::Error::new(e.kind(), format!("waiting for the emulator: {e}")))?;
    if ack[0] != b'+' {
        return Err(io::Error::other(
            "the emulator refused the listener (see its log)",
        ));
    }
    Ok(())
}

/// One trapped call.
pub struct Notice<'a> {
    listener: BorrowedFd<'a>,
    pub id: u64,
    /// The calling thread and its process, in the daemon's pid namespace.
    pub tid: u32,
    pub tgid: u32,
    /// The file the call names.
    pub fd: i32,
    pub call: Call,
}

/// The trapped system call and its other arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Ioctl {
        cmd: u32,
        arg: u64,
    },
    /// An mmap of `len` bytes at file offset `offset` (`addr`, `prot`
    /// and `flags` as the caller passed them).
    Mmap {
        addr: u64,
        len: u64,
        prot: u64,
        flags: u64,
        offset: u64,
    },
    /// A stat-family call; the notice's `fd` is its directory fd
    /// (AT_FDCWD for `stat` and `lstat`) or, for `fstat`, its fd.
    Stat(StatCall),
}

/// The arguments of a stat-family call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatCall {
    /// The path (a pointer in the caller); None for `fstat`.
    pub path: Option<u64>,
    /// AT_* flags (`lstat`: AT_SYMLINK_NOFOLLOW).
    pub flags: i32,
    /// Where the answer goes: a `struct stat`, or for `statx` a
    /// `struct statx` of this mask.
    pub buf: u64,
    pub statx_mask: Option<u32>,
}

impl StatCall {
    /// Decodes a stat-family call: its fd and arguments (None: another call).
    pub fn decode(nr: libc::c_long, a: &[u64; 6]) -> Option<(i32, StatCall)> {
        let call = |path, flags, buf, statx_mask| StatCall {
            path,
            flags,
            buf,
            statx_mask,
        };
        Some(match nr {
            libc::SYS_fstat => (a[0] as i32, call(None, 0, a[1], None)),
            libc::SYS_stat => (libc::AT_FDCWD, call(Some(a[0]), 0, a[1], None)),
            libc::SYS_lstat => (
                libc::AT_FDCWD,
                call(Some(a[0]), libc::AT_SYMLINK_NOFOLLOW, a[1], None),
            ),
            libc::SYS_newfstatat => (a[0] as i32, call(Some(a[1]), a[3] as i32, a[2], None)),
            libc::SYS_statx => (
                a[0] as i32,
                call(Some(a[1]), a[2] as i32, a[4], Some(a[3] as u32)),
            ),
            _ => return None,
        })
    }
}

/// How the daemon answers a trapped call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run the call as if there were no filter.
    Continue,
    /// The call returns this value.
    Return(i64),
    /// The call fails with this (positive) errno.
    Error(i32),
    /// The handler carried the call out in the caller itself (its
    /// notification is withdrawn): nothing to answer.
    Done,
}

/// What answers trapped calls (the device model).
pub trait Handler: Send + Sync {
    fn handle(&self, n: &Notice<'_>) -> Verdict;
}

impl Notice<'_> {
    /// Whether the call is still waiting for this answer (the thread did
    /// not die or get interrupted, and its pid names it still).
    pub fn valid(&self) -> bool {
        let id = self.id;
        // SAFETY: ID_VALID reads one u64 from a live local.
        unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
                &id as *const u64,
            ) == 0
        }
    }

    /// Installs a new fd of `file` in the caller's fd table (close-on-exec
    /// only if asked: KFD's dma-buf fds are not) and returns its number;
    /// fails (ENOENT) once the call is no longer waiting.
    pub fn addfd(&self, file: BorrowedFd<'_>, cloexec: bool) -> Result<u32, i32> {
        let a = libc::seccomp_notif_addfd {
            id: self.id,
            flags: 0,
            srcfd: file.as_raw_fd() as u32,
            newfd: 0,
            newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
        };
        // SAFETY: ADDFD reads one seccomp_notif_addfd from a live local.
        let r = unsafe {
            libc::ioctl(
                self.listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_ADDFD as _,
                &a as *const libc::seccomp_notif_addfd,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        Ok(r as u32)
    }
}

fn tgid_of(tid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn respond(listener: BorrowedFd<'_>, id: u64, v: Verdict) {
    let (val, error, flags) = match v {
        Verdict::Done => return,
        Verdict::Continue => (0, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
        Verdict::Return(v) => (v, 0, 0),
        Verdict::Error(e) => (0, -e, 0),
    };
    let mut r = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags,
    };
    // SAFETY: SEND reads one seccomp_notif_resp from a live local.
    let rc = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND as _,
            &mut r as *mut libc::seccomp_notif_resp,
        )
    };
    if rc < 0 {
        // ENOENT: the caller was interrupted (its call restarts) or died.
        log::debug!(
            "supervise: answer to notification {id:#x}: {}",
            io::Error::last_os_error()
        );
    }
}

/// Answers the notifications of `listener` until no task uses its filter.
pub fn serve(listener: OwnedFd, handler: Arc<dyn Handler>, stop: Option<BorrowedFd<'_>>) {
    let listener = Arc::new(listener);
    let stop = stop.map_or(-1, |s| s.as_raw_fd());
    loop {
        // A negative fd is ignored by poll.
        let mut pfds = [listener.as_raw_fd(), stop].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: poll on two pollfds of a live local array.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), 2, -1) };
        let pfd = pfds[0];
        if pfds[1].revents != 0 {
            // Released ([`release`]): the listener closes with us.
            return;
        }
        if r < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            log::error!("supervise: poll: {}", io::Error::last_os_error());
            return;
        }
        if pfd.revents & libc::POLLIN == 0 {
            // POLLHUP: every task of the filter is gone.
            return;
        }
        // SAFETY: RECV wants a zeroed seccomp_notif (all-zero is valid).
        let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: RECV writes one seccomp_notif into the live local.
        let rc = unsafe {
            libc::ioctl(
                listener.as_raw_fd(),
                libc::SECCOMP_IOCTL_NOTIF_RECV as _,
                &mut n as *mut libc::seccomp_notif,
            )
        };
        if rc < 0 {
            match io::Error::last_os_error().raw_os_error() {
                // The caller died or was interrupted before we read it.
                Some(libc::ENOENT) | Some(libc::EINTR) => continue,
                _ => {
                    log::error!("supervise: NOTIF_RECV: {}", io::Error::last_os_error());
                    return;
                }
            }
        }
        let nr = n.data.nr as libc::c_long;
        if nr == libc::SYS_mmap || STAT_CALLS.contains(&nr) {
            // An mmap check never waits (a look-up under the model's lock),
            // nor does a stat: answered here, without a thread's start-up
            // per call.
            answer(listener.as_fd(), &n, &*handler);
            continue;
        }
        let (l, h) = (listener.clone(), handler.clone());
        let spawned = std::thread::Builder::new()
            .name("kfd-emu-notif".into())
            .spawn(move || answer(l.as_fd(), &n, &*h));
        if let Err(e) = spawned {
            log::error!("supervise: no thread for a notification: {e}");
            respond(listener.as_fd(), n.id, Verdict::Error(libc::EAGAIN));
        }
    }
}

fn answer(listener: BorrowedFd<'_>, n: &libc::seccomp_notif, h: &dyn Handler) {
    let a = n.data.args;
    let call = match n.data.nr as libc::c_long {
        libc::SYS_ioctl => Some((
            a[0] as i32,
            Call::Ioctl {
                cmd: a[1] as u32,
                arg: a[2],
            },
        )),
        libc::SYS_mmap => Some((
            a[4] as i32,
            Call::Mmap {
                addr: a[0],
                len: a[1],
                prot: a[2],
                flags: a[3],
                offset: a[5],
            },
        )),
        nr => StatCall::decode(nr, &a).map(|(fd, s)| (fd, Call::Stat(s))),
    };
    let v = match call.filter(|_| n.data.arch == AUDIT_ARCH) {
        None => Verdict::Continue,
        Some((fd, call)) => match tgid_of(n.pid) {
            None => Verdict::Continue,
            Some(tgid) => {
                let notice = Notice {
                    listener,
                    id: n.id,
                    tid: n.pid,
                    tgid,
                    fd,
                    call,
                };
                // The pid read from /proc is the caller's only while the
                // notification is live.
                if notice.valid() {
                    h.handle(&notice)
                } else {
                    return;
                }
            }
        },
    };
    respond(listener, n.id, v);
}

/// Takes listeners on `state_dir/supervise.sock` and serves each on a
/// thread of its own.  The socket is the daemon's, root-only (0600).
pub fn listen(state_dir: &Path, handler: Arc<dyn Handler>) -> io::Result<()> {
    let path = state_dir.join(SOCKET);
    let _ = std::fs::remove_file(&path);
    let sock = UnixListener::bind(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let live = Arc::new(Live::default());
    std::thread::Builder::new()
        .name("kfd-emu-supervise".into())
        .spawn(move || {
            for conn in sock.incoming() {
                let Ok(conn) = conn else { continue };
                let (h, l) = (handler.clone(), live.clone());
                let _ = std::thread::Builder::new()
                    .name("kfd-emu-listener".into())
                    .spawn(move || take_request(conn, h, &l));
            }
        })?;
    Ok(())
}

/// The listeners being served, by their filter's tag: the eventfd that
/// stops each one's [`serve`], and a channel on which it says it stopped.
#[derive(Default)]
struct Live(std::sync::Mutex<std::collections::HashMap<u32, Vec<Stopper>>>);

struct Stopper {
    stop: Arc<OwnedFd>,
    stopped: std::sync::mpsc::Receiver<()>,
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u32, Vec<Stopper>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One connection to the socket: a listener to serve, or a release.
fn take_request(mut conn: UnixStream, h: Arc<dyn Handler>, live: &Live) {
    match recv_request(&conn) {
        Ok(Request::Listener(fd, tag)) => match check_listener(fd) {
            Ok(l) => {
                let _ = conn.write_all(b"+");
                drop(conn);
                serve_tagged(l, h, tag, live);
            }
            Err(e) => {
                log::error!("supervise: {e}");
                let _ = conn.write_all(b"-");
            }
        },
        Ok(Request::Release(tag)) => {
            let stoppers = live.lock().remove(&tag).unwrap_or_default();
            for s in &stoppers {
                // SAFETY: write of 8 bytes from a live local to an eventfd.
                unsafe { libc::eventfd_write(s.stop.as_raw_fd(), 1) };
                let _ = s.stopped.recv_timeout(std::time::Duration::from_secs(5));
            }
            log::info!(
                "supervise: released {} listener(s) of filter tag {tag:#x}",
                stoppers.len()
            );
            let _ = conn.write_all(if stoppers.is_empty() { b"-" } else { b"+" });
        }
        Err(e) => {
            log::error!("supervise: {e}");
            let _ = conn.write_all(b"-");
        }
    }
}

/// [`serve`], stoppable by a release of `tag`.
fn serve_tagged(l: OwnedFd, h: Arc<dyn Handler>, tag: u32, live: &Live) {
    // SAFETY: eventfd takes integers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        log::error!(
            "supervise: eventfd (the listener cannot be released): {}",
            io::Error::last_os_error()
        );
        return serve(l, h, None);
    }
    // SAFETY: a fresh fd nobody else owns.
    let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    let (tx, rx) = std::sync::mpsc::channel();
    live.lock().entry(tag).or_default().push(Stopper {
        stop: stop.clone(),
        stopped: rx,
    });
    serve(l, h, Some(stop.as_fd()));
    let _ = tx.send(());
    if let Some(v) = live.lock().get_mut(&tag) {
        v.retain(|s| !Arc::ptr_eq(&s.stop, &stop));
    }
}

/// Accepts only a seccomp listener.
fn check_listener(fd: OwnedFd) -> io::Result<OwnedFd> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if link.as_os_str() != "anon_inode:seccomp notify" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the fd sent is {}, not a seccomp listener", link.display()),
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(nr: i64, arch: u32, req: u64) -> libc::seccomp_data {
        libc::seccomp_data {
            nr: nr as i32,
            arch,
            instruction_pointer: 0,
            args: [3, req, 0x1000, 0, 0, 0],
        }
    }

    fn mmap(flags: i32) -> libc::seccomp_data {
        libc::seccomp_data {
            nr: libc::SYS_mmap as i32,
            arch: AUDIT_ARCH,
            instruction_pointer: 0,
            args: [0, 0x1000, 3, flags as u64, 5, 0x10_0000],
        }
    }

    #[test]
    fn a_tagged_filter_traps_as_the_plain_one_and_tells_its_tag() {
        let (plain, tagged) = (filter(), tagged_filter(0x1234_5678));
        assert_eq!(tag_of(&tagged), Some(0x1234_5678));
        assert_eq!(tag_of(&plain), None, "an untagged filter");
        assert_eq!(tag_of(&tagged[1..]), None);
        for data in [
            call(libc::SYS_ioctl, AUDIT_ARCH, AMDKFD_IOC_CRIU_OP as u64),
            call(libc::SYS_ioctl, AUDIT_ARCH, 0x1234),
            call(libc::SYS_fstat, AUDIT_ARCH, 0),
            mmap(libc::MAP_SHARED),
            mmap(libc::MAP_ANONYMOUS),
        ] {
            assert_eq!(run_filter(&plain, &data), run_filter(&tagged, &data));
        }
    }

    #[test]
    fn filter_traps_mmap_of_files_only() {
        let f = filter();
        for flags in [
            libc::MAP_SHARED,
            libc::MAP_PRIVATE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            libc::MAP_PRIVATE | libc::MAP_DENYWRITE,
        ] {
            assert_eq!(run_filter(&f, &mmap(flags)), libc::SECCOMP_RET_USER_NOTIF);
        }
        for flags in [
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
        ] {
            assert_eq!(run_filter(&f, &mmap(flags)), libc::SECCOMP_RET_ALLOW);
        }
        let mut other = mmap(libc::MAP_SHARED);
        other.arch = 0x4000_0003;
        assert_eq!(run_filter(&f, &other), libc::SECCOMP_RET_ALLOW);
        for nr in [libc::SYS_munmap, libc::SYS_mprotect, libc::SYS_mremap] {
            let mut d = mmap(libc::MAP_SHARED);
            d.nr = nr as i32;
            assert_eq!(run_filter(&f, &d), libc::SECCOMP_RET_ALLOW);
        }
    }

    #[test]
    fn filter_traps_the_stat_family() {
        let f = filter();
        for nr in STAT_CALLS {
            assert_eq!(
                run_filter(&f, &call(nr, AUDIT_ARCH, 0)),
                libc::SECCOMP_RET_USER_NOTIF
            );
            assert_eq!(
                run_filter(&f, &call(nr, 0x4000_0003, 0)),
                libc::SECCOMP_RET_ALLOW
            );
        }
        for nr in [
            libc::SYS_open,
            libc::SYS_openat,
            libc::SYS_access,
            libc::SYS_readlink,
        ] {
            assert_eq!(
                run_filter(&f, &call(nr, AUDIT_ARCH, 0)),
                libc::SECCOMP_RET_ALLOW
            );
        }
        let a = [libc::AT_FDCWD as u64, 0x1000, 0x0fff, 0x800, 0x2000, 0];
        let (fd, c) = StatCall::decode(libc::SYS_statx, &a).unwrap();
        assert_eq!(
            (fd, c.path, c.flags, c.statx_mask, c.buf),
            (libc::AT_FDCWD, Some(0x1000), 0x0fff, Some(0x800), 0x2000)
        );
        let (fd, c) = StatCall::decode(libc::SYS_fstat, &[5, 0x3000, 0, 0, 0, 0]).unwrap();
        assert_eq!((fd, c.path, c.buf), (5, None, 0x3000));
        let (_, c) = StatCall::decode(libc::SYS_lstat, &[0x1000, 0x3000, 0, 0, 0, 0]).unwrap();
        assert_eq!(c.flags, libc::AT_SYMLINK_NOFOLLOW);
    }

    #[test]
    fn filter_traps_only_the_fd_returning_ioctls() {
        let f = filter();
        let run = |d| run_filter(&f, &d);
        for req in TRAPPED {
            assert_eq!(
                run(call(libc::SYS_ioctl, AUDIT_ARCH, req as u64)),
                libc::SECCOMP_RET_USER_NOTIF
            );
            // The kernel takes the request as an unsigned int.
            assert_eq!(
                run(call(
                    libc::SYS_ioctl,
                    AUDIT_ARCH,
                    0xffff_ffff_0000_0000 | req as u64
                )),
                libc::SECCOMP_RET_USER_NOTIF
            );
            assert_eq!(
                run(call(libc::SYS_ioctl, 0x4000_0003, req as u64)),
                libc::SECCOMP_RET_ALLOW,
                "another architecture"
            );
            assert_eq!(
                run(call(libc::SYS_read, AUDIT_ARCH, req as u64)),
                libc::SECCOMP_RET_ALLOW
            );
        }
        for req in [
            kfd_abi::ioctl::AMDKFD_IOC_GET_VERSION,
            kfd_abi::ioctl::DRM_IOCTL_PRIME_FD_TO_HANDLE,
            kfd_abi::ioctl::DRM_IOCTL_AMDGPU_CS,
        ] {
            assert_eq!(
                run(call(libc::SYS_ioctl, AUDIT_ARCH, req as u64)),
                libc::SECCOMP_RET_ALLOW
            );
        }
    }
}
