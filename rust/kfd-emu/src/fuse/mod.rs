//! A small FUSE server, written against `/dev/fuse` directly, that
//! serves one device node as a file-root FUSE mount.
//!
//! Why not a FUSE crate: the one that has ioctl and passthrough answers
//! FUSE_INTERRUPT with ENOSYS, which makes every later blocked request on
//! the connection uninterruptible; a task parked in an emulated wait ioctl
//! then sits in D state and CRIU cannot seize it.
//!
//! Each node is its own connection: a FUSE fs whose root is a regular file
//! (`rootmode=100000`) mounted over a placeholder, so `/proc/PID/maps`
//! shows exactly the device path.  Opens are answered with
//! FOPEN_PASSTHROUGH to the node's backing memfd (mmap never reaches us),
//! ioctls are handed to a [`FileOps`], which may answer at once or park the
//! [`IoctlReply`].  An INTERRUPT for a parked request is passed to the
//! device ([`FileOps::interrupt`]), which forgets the request and answers
//! it EINTR itself; a device that does not know it leaves the EINTR answer
//! to the transport, and its own later answer is then dropped.

pub mod abi;
pub mod dmabuf;

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use abi::Pod;

use crate::os_err;

/// Largest write the kernel may send; we never take writes (passthrough),
/// but ioctl payloads (at most 16 KiB restricted) must fit.
const MAX_WRITE: u32 = 64 * 1024;
const READ_BUF: usize = MAX_WRITE as usize + 64 * 1024;
/// The largest errno a FUSE reply may carry.
const MAX_ERRNO: i32 = 511;

/// `_IOR(0xfe, 0x01, u64)`: answered by the transport itself on every
/// node with the open file description's `fh`.  Lets the device model find
/// which emulated open an fd argument (`ACQUIRE_VM.drm_fd`, a CRIU device
/// bucket's `drm_fd`) refers to: pull the fd (`device::pull_fd`), then ask
/// [`fh_of`].  Type 0xfe is used by neither KFD ('K') nor DRM ('d').
pub const FH_QUERY: u32 = (2 << 30) | (8 << 16) | (0xfe << 8) | 0x01;

/// The `fh` of an open of an emulated node (ENOTTY for any other file).
/// Another worker answers, so this must not run on the only worker of a
/// connection; every connection has at least two.
pub fn fh_of(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut fh = 0u64;
    // SAFETY: FH_QUERY writes 8 bytes to the pointer, a live local u64.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), FH_QUERY as _, &mut fh as *mut u64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fh)
}

/// The thread (and its process) that made a request.  Ids are in the
/// daemon's pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tid: u32,
    pub tgid: u32,
}

/// What a device node does with opens and ioctls.
pub trait FileOps: Send + Sync + 'static {
    /// A new open file description; returns its handle.
    fn open(&self, caller: &Caller) -> Result<u64, i32>;
    /// The last reference to `fh` is gone.
    fn release(&self, fh: u64);
    /// An ioctl on `fh`.  `input` holds `_IOC_SIZE(cmd)` bytes when the
    /// command writes; the answer must be at most `out_size` bytes.
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        fh: u64,
        caller: &Caller,
        cmd: u32,
        arg: u64,
        input: &[u8],
        out_size: u32,
        reply: IoctlReply,
    );
    /// The caller of the parked ioctl request `unique` got a signal
    /// (FUSE_INTERRUPT).  A device that still holds the request must
    /// forget it and answer it EINTR through its [`IoctlReply`] before
    /// returning `true`; `true` also says "my answer is already on its
    /// way" (a completion wins over a signal, as in KFD's waits).  `false`
    /// (the default) lets the transport answer EINTR; the device's later
    /// answer is then dropped.  Called without any transport lock held.
    fn interrupt(&self, unique: u64) -> bool {
        let _ = unique;
        false
    }
}

/// Whether an ioctl request is still inside `FileOps::ioctl` or parked.
#[derive(Debug)]
enum Pending {
    InCall { interrupted: bool },
    Parked,
}

struct Conn {
    name: String,
    fd: OwnedFd,
    ops: Arc<dyn FileOps>,
    backing_id: i32,
    pending: Mutex<HashMap<u64, Pending>>,
    tgids: Mutex<HashMap<u32, u32>>,
}

/// The answer to one ioctl.  Dropping it unanswered answers EIO, so a
/// device bug cannot leave a task blocked forever.
pub struct IoctlReply {
    conn: Arc<Conn>,
    unique: u64,
    out_size: u32,
    done: bool,
}

impl IoctlReply {
    /// Answers with `Ok(out bytes)` or `Err(positive errno)`.  A no-op when
    /// the request was already answered because it was interrupted.
    pub fn reply(mut self, r: Result<Vec<u8>, i32>) {
        self.done = true;
        self.send(r);
    }

    /// The request's FUSE id (for logs).
    pub fn unique(&self) -> u64 {
        self.unique
    }

    fn send(&self, r: Result<Vec<u8>, i32>) {
        if self
            .conn
            .pending
            .lock()
            .unwrap()
            .remove(&self.unique)
            .is_none()
        {
            return;
        }
        match r {
            Ok(data) if data.len() <= self.out_size as usize => {
                let out = abi::IoctlOut::default();
                self.conn.send(self.unique, 0, &[abi::bytes(&out), &data]);
            }
            Ok(data) => {
                log::error!(
                    "{}: ioctl answer of {} bytes exceeds out_size {}",
                    self.conn.name,
                    data.len(),
                    self.out_size
                );
                self.conn.send(self.unique, libc::EIO, &[]);
            }
            Err(e) => self.conn.send(self.unique, e, &[]),
        }
    }
}

impl Drop for IoctlReply {
    fn drop(&mut self) {
        if !self.done {
            log::error!(
                "{}: ioctl request {} dropped unanswered",
                self.conn.name,
                self.unique
            );
            self.send(Err(libc::EIO));
        }
    }
}

impl Conn {
    /// Writes one reply (see [`write_reply`]).
    fn send(&self, unique: u64, errno: i32, parts: &[&[u8]]) {
        write_reply(&self.name, self.fd.as_fd(), unique, errno, parts);
    }

    fn send_pod<T: Pod>(&self, unique: u64, v: &T) {
        self.send(unique, 0, &[abi::bytes(v)]);
    }

    fn caller(&self, tid: u32) -> Caller {
        if tid == 0 {
            return Caller { tid: 0, tgid: 0 };
        }
        if let Some(&tgid) = self.tgids.lock().unwrap().get(&tid) {
            return Caller { tid, tgid };
        }
        let tgid = read_tgid(tid).unwrap_or(tid);
        let mut cache = self.tgids.lock().unwrap();
        // Thread ids are recycled only after pid_max wraps; bound the cache
        // anyway so a long run with many short processes stays small.
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(tid, tgid);
        Caller { tid, tgid }
    }

    fn dispatch(self: &Arc<Self>, msg: &[u8]) {
        let Some(h) = abi::read::<abi::InHeader>(msg) else {
            log::error!("{}: short request of {} bytes", self.name, msg.len());
            return;
        };
        let body = &msg[size_of::<abi::InHeader>()..];
        let unique = h.unique;
        match h.opcode {
            abi::op::FORGET | abi::op::BATCH_FORGET => {}
            abi::op::GETATTR => {
                let out = abi::AttrOut {
                    attr_valid: 3600,
                    attr: abi::Attr {
                        ino: abi::FUSE_ROOT_ID,
                        size: 0,
                        mode: libc::S_IFREG | 0o666,
                        nlink: 1,
                        blksize: 4096,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                self.send_pod(unique, &out);
            }
            abi::op::STATFS => self.send_pod(unique, &abi::StatfsOut::empty()),
            abi::op::OPEN => {
                let caller = self.caller(h.pid);
                match self.ops.open(&caller) {
                    Ok(fh) => {
                        log::debug!("{}: OPEN by {caller:?} -> fh {fh}", self.name);
                        let out = abi::OpenOut {
                            fh,
                            // No FLUSH on each close() of a dup: KFD's and
                            // DRM's close of a dup does no round trip either
                            // (CRIU closes one per restored GPU mapping).
                            open_flags: abi::FOPEN_PASSTHROUGH | abi::FOPEN_NOFLUSH,
                            backing_id: self.backing_id,
                        };
                        self.send_pod(unique, &out);
                    }
                    Err(e) => self.send(unique, e, &[]),
                }
            }
            abi::op::FLUSH => self.send(unique, 0, &[]),
            abi::op::RELEASE => {
                if let Some(r) = abi::read::<abi::ReleaseIn>(body) {
                    self.ops.release(r.fh);
                }
                self.send(unique, 0, &[]);
            }
            abi::op::IOCTL => self.ioctl(&h, body),
            abi::op::INTERRUPT => self.interrupt(&h, body),
            abi::op::DESTROY => self.send(unique, 0, &[]),
            abi::op::INIT => {
                log::error!("{}: second INIT", self.name);
                self.send(unique, libc::EPROTO, &[]);
            }
            op => {
                log::debug!("{}: opcode {op} -> ENOSYS", self.name);
                self.send(unique, libc::ENOSYS, &[]);
            }
        }
    }

    fn ioctl(self: &Arc<Self>, h: &abi::InHeader, body: &[u8]) {
        let Some(io) = abi::read::<abi::IoctlIn>(body) else {
            self.send(h.unique, libc::EINVAL, &[]);
            return;
        };
        if io.flags & abi::FUSE_IOCTL_UNRESTRICTED != 0 {
            self.send(h.unique, libc::ENOSYS, &[]);
            return;
        }
        if io.flags & abi::FUSE_IOCTL_COMPAT != 0 {
            // 32-bit callers would need their own struct layouts.
            self.send(h.unique, libc::ENOTTY, &[]);
            return;
        }
        if io.cmd == FH_QUERY {
            let out = abi::IoctlOut::default();
            self.send(h.unique, 0, &[abi::bytes(&out), &io.fh.to_ne_bytes()]);
            return;
        }
        let data = &body[size_of::<abi::IoctlIn>()..];
        let Some(input) = data.get(..io.in_size as usize) else {
            self.send(h.unique, libc::EINVAL, &[]);
            return;
        };
        let caller = self.caller(h.pid);
        self.pending
            .lock()
            .unwrap()
            .insert(h.unique, Pending::InCall { interrupted: false });
        let reply = IoctlReply {
            conn: self.clone(),
            unique: h.unique,
            out_size: io.out_size,
            done: false,
        };
        self.ops
            .ioctl(io.fh, &caller, io.cmd, io.arg, input, io.out_size, reply);
        let mut pending = self.pending.lock().unwrap();
        match pending.get(&h.unique) {
            Some(Pending::InCall { interrupted: true }) => {
                pending.insert(h.unique, Pending::Parked);
                drop(pending);
                self.cancel(h.unique);
            }
            Some(Pending::InCall { interrupted: false }) => {
                pending.insert(h.unique, Pending::Parked);
            }
            Some(Pending::Parked) | None => {}
        }
    }

    fn interrupt(&self, h: &abi::InHeader, body: &[u8]) {
        let Some(i) = abi::read::<abi::InterruptIn>(body) else {
            return;
        };
        let mut pending = self.pending.lock().unwrap();
        match pending.get_mut(&i.unique) {
            Some(Pending::Parked) => {
                drop(pending);
                self.cancel(i.unique);
            }
            Some(Pending::InCall { interrupted }) => {
                // Answered when the call returns without an answer; a
                // request that completes normally is not disturbed.
                *interrupted = true;
            }
            None => {
                // Not read yet (the kernel requeues on EAGAIN) or already
                // answered (the kernel then ignores this answer).
                drop(pending);
                self.send(h.unique, libc::EAGAIN, &[]);
            }
        }
    }

    /// Ends the parked request `unique` after an interrupt: the device
    /// drops it and answers EINTR (or its answer is on its way), else the
    /// transport answers EINTR.
    fn cancel(&self, unique: u64) {
        if self.ops.interrupt(unique) {
            log::debug!("{}: request {unique} interrupted (device)", self.name);
            return;
        }
        if self.pending.lock().unwrap().remove(&unique).is_some() {
            log::debug!("{}: request {unique} interrupted -> EINTR", self.name);
            self.send(unique, libc::EINTR, &[]);
        }
    }

    fn worker(self: Arc<Self>) {
        read_requests(&self.name, self.fd.as_fd(), |msg| self.dispatch(msg));
    }
}

/// Reads the requests of the connection `fd` one by one into `dispatch`
/// until it ends (unmounted, or a read error, which is logged).
fn read_requests(name: &str, fd: BorrowedFd<'_>, mut dispatch: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; READ_BUF];
    loop {
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                Some(libc::ENODEV) => {
                    log::debug!("{name}: unmounted");
                    return;
                }
                _ => {
                    log::error!("{name}: reading /dev/fuse: {e}");
                    return;
                }
            }
        }
        dispatch(&buf[..n as usize]);
    }
}

/// Writes one reply to the connection `fd`.  Errors are logged: ENOENT
/// means the request was already finished (interrupted and answered, or
/// its caller died).
fn write_reply(name: &str, fd: BorrowedFd<'_>, unique: u64, errno: i32, parts: &[&[u8]]) {
    let errno = if (0..=MAX_ERRNO).contains(&errno) {
        errno
    } else {
        libc::EIO
    };
    let len = size_of::<abi::OutHeader>() + parts.iter().map(|p| p.len()).sum::<usize>();
    let hdr = abi::OutHeader {
        len: len as u32,
        error: -errno,
        unique,
    };
    let mut iov = Vec::with_capacity(parts.len() + 1);
    iov.push(libc::iovec {
        iov_base: abi::bytes(&hdr).as_ptr() as *mut _,
        iov_len: size_of::<abi::OutHeader>(),
    });
    for p in parts.iter().filter(|p| !p.is_empty()) {
        iov.push(libc::iovec {
            iov_base: p.as_ptr() as *mut _,
            iov_len: p.len(),
        });
    }
    // SAFETY: every iovec points into a live buffer (`hdr`, `parts`) of
    // the stated length for the duration of the call.
    let r = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            log::warn!("{name}: reply to {unique}: {e}");
        }
    }
}

fn read_tgid(tid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Refuses to run when the kernel would time out FUSE requests: a task
/// parked in a wait ioctl for longer would see its connection aborted.
pub fn check_request_timeouts() -> io::Result<()> {
    for name in ["default_request_timeout", "max_request_timeout"] {
        let path = format!("/proc/sys/fs/fuse/{name}");
        match std::fs::read_to_string(&path) {
            Ok(v) if v.trim() == "0" => {}
            Ok(v) => {
                return Err(io::Error::other(format!(
                    "{path} is {}; kfd-emu needs 0 (FUSE request timeouts would abort \
                     blocked wait ioctls): echo 0 > {path}",
                    v.trim()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{path}: {e}"))),
        }
    }
    Ok(())
}

/// One served device node.  The mount lives in the mount namespace of the
/// thread that created it; it goes away with that namespace or on
/// [`Mount::unmount`].
pub struct Mount {
    target: PathBuf,
    conn: Arc<Conn>,
    threads: Vec<JoinHandle<()>>,
}

impl Mount {
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Number of ioctl requests parked in the device (answered neither by
    /// the device nor by an interrupt).
    pub fn parked(&self) -> usize {
        self.conn
            .pending
            .lock()
            .unwrap()
            .values()
            .filter(|p| matches!(p, Pending::Parked))
            .count()
    }

    /// Detaches the mount and waits for the workers once the kernel has
    /// torn the connection down (after the last open file is closed).
    pub fn unmount(self) -> io::Result<()> {
        let c = cstr(&self.target)?;
        // SAFETY: `c` is a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for t in self.threads {
            let _ = t.join();
        }
        Ok(())
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Mounts a file-root FUSE fs over the existing regular file `target`,
/// completes INIT, registers `backing` for passthrough and starts
/// `threads` workers.
pub fn serve_file(
    name: &str,
    target: &Path,
    backing: BorrowedFd<'_>,
    ops: Arc<dyn FileOps>,
    threads: usize,
) -> io::Result<Mount> {
    let fd = mount_fuse(target, "100000")?;
    let result = init_and_start(name, target, fd, backing, ops, threads);
    if result.is_err() {
        let tgt = cstr(target)?;
        // SAFETY: valid path; undoing our own mount.
        unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH) };
    }
    result
}

/// Opens /dev/fuse and mounts a FUSE fs whose root has `rootmode` (octal)
/// on `target`; the connection's fd (INIT is queued on it).
fn mount_fuse(target: &Path, rootmode: &str) -> io::Result<OwnedFd> {
    // SAFETY: plain open(2) of a constant path.
    let raw = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(os_err("/dev/fuse"));
    }
    // SAFETY: `raw` is a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let opts = CString::new(format!(
        "fd={raw},rootmode={rootmode},user_id=0,group_id=0,allow_other"
    ))
    .expect("no NUL");
    let tgt = cstr(target)?;
    // SAFETY: all pointers are valid NUL-terminated strings.
    let r = unsafe {
        libc::mount(
            c"kfd-emu".as_ptr(),
            tgt.as_ptr(),
            c"fuse.kfd-emu".as_ptr(),
            libc::MS_NOSUID,
            opts.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(os_err(format!("mounting FUSE on {}", target.display())));
    }
    Ok(fd)
}

fn init_and_start(
    name: &str,
    target: &Path,
    fd: OwnedFd,
    backing: BorrowedFd<'_>,
    ops: Arc<dyn FileOps>,
    threads: usize,
) -> io::Result<Mount> {
    // The kernel queues INIT at mount time; answer it before anything else
    // so the backing file can be registered before the first OPEN.
    let (unique, init) = read_init(name, fd.as_fd())?;
    let mut conn = Conn {
        name: name.to_owned(),
        fd,
        ops,
        backing_id: 0,
        pending: Mutex::new(HashMap::new()),
        tgids: Mutex::new(HashMap::new()),
    };
    conn.send_pod(unique, &init_answer(&init));
    conn.backing_id = conn.open_backing(backing)?;
    let conn = Arc::new(conn);
    let mut handles = Vec::new();
    for i in 0..threads.max(2) {
        let c = conn.clone();
        handles.push(
            std::thread::Builder::new()
                .name(format!("fuse-{name}-{i}"))
                .spawn(move || c.worker())?,
        );
    }
    log::info!(
        "{name}: serving {} (backing id {}, {} workers)",
        target.display(),
        conn.backing_id,
        handles.len()
    );
    Ok(Mount {
        target: target.to_owned(),
        conn,
        threads: handles,
    })
}

/// The kernel's FUSE INIT request (its unique id and arguments), checked to
/// offer passthrough.
fn read_init(name: &str, fd: BorrowedFd<'_>) -> io::Result<(u64, abi::InitIn)> {
    let mut buf = vec![0u8; READ_BUF];
    let n = loop {
        // SAFETY: `buf` is live and writable for `buf.len()` bytes.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            break n as usize;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(os_err(format!("{name}: reading FUSE INIT")));
        }
    };
    let h = abi::read::<abi::InHeader>(&buf[..n])
        .filter(|h| h.opcode == abi::op::INIT)
        .ok_or_else(|| io::Error::other(format!("{name}: first FUSE request is not INIT")))?;
    let init = abi::read::<abi::InitIn>(&buf[size_of::<abi::InHeader>()..n])
        .ok_or_else(|| io::Error::other(format!("{name}: short FUSE INIT")))?;
    let kflags = u64::from(init.flags) | (u64::from(init.flags2) << 32);
    if init.major != abi::FUSE_KERNEL_VERSION
        || init.minor < abi::FUSE_KERNEL_MINOR_VERSION
        || kflags & abi::FUSE_PASSTHROUGH == 0
    {
        return Err(io::Error::other(format!(
            "{name}: kernel FUSE {}.{} (flags {kflags:#x}) lacks passthrough; need 7.40+ \
             with CONFIG_FUSE_PASSTHROUGH",
            init.major, init.minor
        )));
    }
    Ok((h.unique, init))
}

/// The answer to INIT: the features we use that the kernel offers.
fn init_answer(init: &abi::InitIn) -> abi::InitOut {
    let kflags = u64::from(init.flags) | (u64::from(init.flags2) << 32);
    let want = abi::FUSE_INIT_EXT
        | abi::FUSE_MAX_PAGES
        | abi::FUSE_BIG_WRITES
        | abi::FUSE_ASYNC_READ
        | abi::FUSE_PASSTHROUGH
        | abi::FUSE_DIRECT_IO_ALLOW_MMAP;
    let flags = want & kflags;
    abi::InitOut {
        major: abi::FUSE_KERNEL_VERSION,
        minor: abi::FUSE_KERNEL_MINOR_VERSION,
        max_readahead: init.max_readahead,
        flags: flags as u32,
        flags2: (flags >> 32) as u32,
        max_background: 64,
        congestion_threshold: 48,
        max_write: MAX_WRITE,
        time_gran: 1,
        max_pages: 256,
        max_stack_depth: 1,
        ..Default::default()
    }
}

impl Conn {
    /// Registers `backing` as the passthrough backing file; its backing id.
    fn open_backing(&self, backing: BorrowedFd<'_>) -> io::Result<i32> {
        open_backing(&self.name, self.fd.as_fd(), backing)
    }
}

/// Registers `backing` as a passthrough backing file of the connection
/// `fd`; its backing id.
fn open_backing(name: &str, fd: BorrowedFd<'_>, backing: BorrowedFd<'_>) -> io::Result<i32> {
    let map = abi::BackingMap {
        fd: backing.as_raw_fd(),
        ..Default::default()
    };
    // SAFETY: FUSE_DEV_IOC_BACKING_OPEN reads one `fuse_backing_map` from
    // the pointer, which refers to a live local.
    let id = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            abi::FUSE_DEV_IOC_BACKING_OPEN as _,
            &map as *const abi::BackingMap,
        )
    };
    if id <= 0 {
        return Err(os_err(format!(
            "{name}: registering the passthrough backing file (needs CAP_SYS_ADMIN)"
        )));
    }
    Ok(id)
}

/// Drops the connection's registration `id` (files opened with it keep
/// their backing file).
fn close_backing(fd: BorrowedFd<'_>, id: i32) {
    // SAFETY: FUSE_DEV_IOC_BACKING_CLOSE reads one u32 from the pointer,
    // a live local.
    unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            abi::FUSE_DEV_IOC_BACKING_CLOSE as _,
            &id as *const i32,
        )
    };
}
