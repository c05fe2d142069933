//! The files kfd-emu hands out as dma-bufs: each a file named `dmabuf:` at
//! the root of a mount that nobody can reach by path.
//!
//! On the kernel a dma-buf fd is a file of an internal mount: its
//! `/proc/PID/fd` link reads `/dmabuf:` (plus the name DMA_BUF_SET_NAME
//! gave it), and no path leads to it, so a tool that checkpoints files by
//! path (CRIU) cannot dump it as a file.  The emulator's dma-buf is a
//! memfd of the daemon; handed out as it is, it reads `/memfd:…` and CRIU
//! dumps and restores it as a memfd, silently cutting it from its BO.  So
//! each dma-buf is opened here instead, from a FUSE fs mounted nowhere
//! (fsopen/fsmount: a detached mount) that holds a directory `N` per
//! dma-buf with one regular file `dmabuf:` in it.  The file is opened
//! through a detached clone of `N` (open_tree OPEN_TREE_CLONE), so its
//! path within its mount is `/dmabuf:`, with FOPEN_PASSTHROUGH to the
//! dma-buf's memfd: read, write and mmap go to the memfd without reaching
//! us, and `/proc/PID/maps` names the FUSE file.  Its device and inode
//! identify it.
//!
//! What stays unlike the kernel's: the file type is S_IFREG (FUSE cannot
//! answer a mode without type bits, as the kernel's anonymous dma-buf
//! inode has), statfs says FUSE, not DMA_BUF_MAGIC, and the dma-buf
//! ioctls (DMA_BUF_IOCTL_SYNC, SET_NAME, ...) answer ENOTTY.
//!
//! A dma-buf's passthrough registration lasts only while its file is
//! opened (a reopen through `/proc/PID/fd/N` is refused: the kernel's
//! dma-buf cannot be reopened as the same dma-buf either); its nodes, a few
//! bytes, live until the kernel forgets them.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use super::abi::{self, Pod};

/// The name of every dma-buf file (the kernel's, without a name set).
pub const FILE_NAME: &str = "dmabuf:";

const NAME: &str = "dmabuf";

// <linux/mount.h>
const FSOPEN_CLOEXEC: u32 = 1;
const FSCONFIG_SET_FLAG: u32 = 0;
const FSCONFIG_SET_STRING: u32 = 1;
const FSCONFIG_CMD_CREATE: u32 = 6;
const FSMOUNT_CLOEXEC: u32 = 1;
const MOUNT_ATTR_NOSUID: u32 = 2;
const OPEN_TREE_CLONE: u32 = 1;

/// One dma-buf: its directory is node `2k`, its file node `2k + 1`.
struct Entry {
    size: u64,
    /// The passthrough registration, until the file is open (the open file
    /// holds the memfd itself, so a freed BO's memory is not kept).
    backing_id: Option<i32>,
    /// LOOKUPs answered with the directory and with the file, less those
    /// the kernel forgot.
    lookups: [u64; 2],
    /// Being opened (not to be dropped yet).
    opening: bool,
}

#[derive(Default)]
struct Entries {
    last: u64,
    by_k: HashMap<u64, Entry>,
}

struct FsConn {
    fd: OwnedFd,
    entries: Mutex<Entries>,
}

/// The fs of dma-buf files.
pub struct DmabufFs {
    conn: Arc<FsConn>,
    /// The fs's detached mount (fsmount): the only way to it.
    mnt: OwnedFd,
}

fn syscall_fd(what: &str, r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(crate::os_err(format!("dmabuf: {what}")));
    }
    // SAFETY: the syscall returned a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// fsconfig(fs, cmd, key, value) with C strings.
fn fsconfig(
    fs: BorrowedFd<'_>,
    cmd: u32,
    key: Option<&str>,
    value: Option<&str>,
) -> io::Result<()> {
    let key = key.map(|k| CString::new(k).expect("no NUL"));
    let value = value.map(|v| CString::new(v).expect("no NUL"));
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: fsconfig reads the NUL-terminated strings (or nulls) passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            ptr(&key),
            ptr(&value),
            0,
        )
    };
    if r < 0 {
        return Err(crate::os_err(format!("dmabuf: fsconfig {:?}", key)));
    }
    Ok(())
}

impl DmabufFs {
    /// Creates the fs as a detached mount (no path leads to it) and starts
    /// serving it.  Needs CAP_SYS_ADMIN and FUSE passthrough.
    pub fn mount() -> io::Result<DmabufFs> {
        // SAFETY: plain open(2) of a constant path.
        let dev = syscall_fd("/dev/fuse", unsafe {
            libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC).into()
        })?;
        // SAFETY: fsopen reads the NUL-terminated fs name.
        let fs = syscall_fd("fsopen fuse", unsafe {
            libc::syscall(libc::SYS_fsopen, c"fuse".as_ptr(), FSOPEN_CLOEXEC)
        })?;
        let fd = dev.as_raw_fd().to_string();
        for (k, v) in [
            ("fd", fd.as_str()),
            ("rootmode", "40000"),
            ("user_id", "0"),
            ("group_id", "0"),
        ] {
            fsconfig(fs.as_fd(), FSCONFIG_SET_STRING, Some(k), Some(v))?;
        }
        fsconfig(fs.as_fd(), FSCONFIG_SET_FLAG, Some("allow_other"), None)?;
        fsconfig(fs.as_fd(), FSCONFIG_CMD_CREATE, None, None)?;
        // SAFETY: fsmount of our fs context fd with integer flags.
        let mnt = syscall_fd("fsmount", unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                fs.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                MOUNT_ATTR_NOSUID,
            )
        })?;
        let (unique, init) = super::read_init(NAME, dev.as_fd())?;
        let conn = Arc::new(FsConn {
            fd: dev,
            entries: Mutex::default(),
        });
        conn.send_pod(unique, &super::init_answer(&init));
        for i in 0..2 {
            let c = conn.clone();
            std::thread::Builder::new()
                .name(format!("fuse-{NAME}-{i}"))
                .spawn(move || c.worker())?;
        }
        Ok(DmabufFs { conn, mnt })
    }

    /// A new dma-buf file of `size` bytes whose reads, writes and mappings
    /// go to `backing` (opened O_RDWR if `writable`, else O_RDONLY;
    /// close-on-exec in the daemon).
    pub fn open(&self, backing: BorrowedFd<'_>, size: u64, writable: bool) -> io::Result<OwnedFd> {
        let backing_id = super::open_backing(NAME, self.conn.fd.as_fd(), backing)?;
        let k = {
            let mut e = self.conn.lock();
            e.last += 1;
            let k = e.last;
            e.by_k.insert(
                k,
                Entry {
                    size,
                    backing_id: Some(backing_id),
                    lookups: [0; 2],
                    opening: true,
                },
            );
            k
        };
        let file = self.open_in_clone(k, writable);
        if let Some(e) = self.conn.lock().by_k.get_mut(&k) {
            e.opening = false;
            e.backing_id = None;
        }
        super::close_backing(self.conn.fd.as_fd(), backing_id);
        self.conn.drop_if_unused(k);
        file
    }

    /// Opens `k/dmabuf:` through a detached clone of directory `k`.
    fn open_in_clone(&self, k: u64, writable: bool) -> io::Result<OwnedFd> {
        let access = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        let dir = CString::new(k.to_string()).expect("no NUL");
        // SAFETY: open_tree reads the NUL-terminated path under our mount fd.
        let tree = syscall_fd("open_tree", unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                self.mnt.as_raw_fd(),
                dir.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as u32,
            )
        })?;
        let name = CString::new(FILE_NAME).expect("no NUL");
        // SAFETY: openat on a live directory fd with a valid C string.
        syscall_fd("opening a dma-buf file", unsafe {
            libc::openat(tree.as_raw_fd(), name.as_ptr(), access | libc::O_CLOEXEC).into()
        })
    }
}

impl FsConn {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, unique: u64, errno: i32, parts: &[&[u8]]) {
        super::write_reply(NAME, self.fd.as_fd(), unique, errno, parts);
    }

    fn send_pod<T: Pod>(&self, unique: u64, v: &T) {
        self.send(unique, 0, &[abi::bytes(v)]);
    }

    /// Forgets dma-buf `k` once no lookup holds its nodes and it is not
    /// being opened.
    fn drop_if_unused(&self, k: u64) {
        let mut e = self.lock();
        let unused = e
            .by_k
            .get(&k)
            .is_some_and(|x| !x.opening && x.lookups == [0; 2]);
        if unused {
            e.by_k.remove(&k);
        }
    }

    fn forget(&self, node: u64, nlookup: u64) {
        let (k, file) = (node / 2, (node % 2) as usize);
        if let Some(x) = self.lock().by_k.get_mut(&k) {
            x.lookups[file] = x.lookups[file].saturating_sub(nlookup);
        }
        self.drop_if_unused(k);
    }

    fn attr(&self, node: u64) -> Option<abi::Attr> {
        let dir = abi::Attr {
            ino: node,
            mode: libc::S_IFDIR | 0o500,
            nlink: 2,
            blksize: 4096,
            ..Default::default()
        };
        if node == abi::FUSE_ROOT_ID {
            return Some(dir);
        }
        let e = self.lock();
        let x = e.by_k.get(&(node / 2))?;
        if node.is_multiple_of(2) {
            return Some(dir);
        }
        Some(abi::Attr {
            ino: node,
            size: x.size,
            mode: libc::S_IFREG | 0o600,
            nlink: 1,
            blksize: 4096,
            ..Default::default()
        })
    }

    /// The node `name` in directory `parent` names: `k` in the root,
    /// `dmabuf:` in `k`.
    fn child(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let node = if parent == abi::FUSE_ROOT_ID {
            let k: u64 = std::str::from_utf8(name).ok()?.parse().ok()?;
            2 * k
        } else if parent.is_multiple_of(2) && name == FILE_NAME.as_bytes() {
            parent + 1
        } else {
            return None;
        };
        let mut e = self.lock();
        let x = e.by_k.get_mut(&(node / 2))?;
        x.lookups[(node % 2) as usize] += 1;
        Some(node)
    }

    fn lookup(&self, h: &abi::InHeader, body: &[u8]) {
        let name = body.split(|&b| b == 0).next().unwrap_or_default();
        let found = self.child(h.nodeid, name);
        match found.and_then(|n| Some((n, self.attr(n)?))) {
            Some((nodeid, attr)) => {
                let out = abi::EntryOut {
                    nodeid,
                    generation: 1,
                    // Not cached once unused: the kernel drops the dentry
                    // and inode with the last file, and forgets the node.
                    entry_valid: 0,
                    attr_valid: 3600,
                    attr,
                    ..Default::default()
                };
                self.send_pod(h.unique, &out);
            }
            None => self.send(h.unique, libc::ENOENT, &[]),
        }
    }

    fn open(&self, h: &abi::InHeader) {
        // Only while `DmabufFs::open` opens it: the dma-buf's fds are all of
        // that one file (a reopen through /proc/PID/fd/N is refused).
        let backing_id = (h.nodeid % 2 == 1)
            .then(|| {
                self.lock()
                    .by_k
                    .get(&(h.nodeid / 2))
                    .and_then(|x| x.backing_id)
            })
            .flatten();
        match backing_id {
            Some(backing_id) => {
                let out = abi::OpenOut {
                    fh: h.nodeid,
                    open_flags: abi::FOPEN_PASSTHROUGH | abi::FOPEN_NOFLUSH,
                    backing_id,
                };
                self.send_pod(h.unique, &out);
            }
            None => self.send(h.unique, libc::ENOENT, &[]),
        }
    }

    fn batch_forget(&self, body: &[u8]) {
        let Some(b) = abi::read::<abi::BatchForgetIn>(body) else {
            return;
        };
        let mut rest = &body[size_of::<abi::BatchForgetIn>()..];
        for _ in 0..b.count {
            let Some(one) = abi::read::<abi::ForgetOne>(rest) else {
                return;
            };
            self.forget(one.nodeid, one.nlookup);
            rest = &rest[size_of::<abi::ForgetOne>()..];
        }
    }

    fn getattr(&self, h: &abi::InHeader) {
        match self.attr(h.nodeid) {
            Some(attr) => {
                let out = abi::AttrOut {
                    attr_valid: 3600,
                    attr,
                    ..Default::default()
                };
                self.send_pod(h.unique, &out);
            }
            None => self.send(h.unique, libc::ENOENT, &[]),
        }
    }

    fn dispatch(&self, msg: &[u8]) {
        let Some(h) = abi::read::<abi::InHeader>(msg) else {
            return;
        };
        let body = &msg[size_of::<abi::InHeader>()..];
        match h.opcode {
            abi::op::LOOKUP => self.lookup(&h, body),
            abi::op::FORGET => {
                if let Some(f) = abi::read::<abi::ForgetIn>(body) {
                    self.forget(h.nodeid, f.nlookup);
                }
            }
            abi::op::BATCH_FORGET => self.batch_forget(body),
            abi::op::GETATTR => self.getattr(&h),
            abi::op::OPEN => self.open(&h),
            abi::op::FLUSH | abi::op::RELEASE | abi::op::DESTROY => self.send(h.unique, 0, &[]),
            abi::op::IOCTL => self.send(h.unique, libc::ENOTTY, &[]),
            abi::op::STATFS => self.send_pod(h.unique, &abi::StatfsOut::empty()),
            _ => self.send(h.unique, libc::ENOSYS, &[]),
        }
    }

    fn worker(self: Arc<Self>) {
        super::read_requests(NAME, self.fd.as_fd(), |msg| self.dispatch(msg));
    }
}
