//! The emulated render nodes as character devices, under `kfd-emu
//! supervise`: the stat family answered for them as for DRM's nodes.
//!
//! The nodes are FUSE files (CUSE is not available on the machines this
//! runs on), so the kernel reports them as regular files of the FUSE
//! mount.  libdrm tells devices apart by `fstat` (S_IFCHR, major 226) and
//! `/sys/dev/char/226:<minor>/device/drm` (`drmGetPrimaryDeviceNameFromFd`,
//! which `amdgpu_device_initialize` compares): with regular files all
//! nodes compare equal, and ROCr 6.4 hands one GPU's fd to ACQUIRE_VM of
//! another.  The supervisor's filter traps the stat family; a call that
//! names a render node (by path, by fd, or a path through `/proc`) gets
//! the file's own attributes with the mode and rdev a devtmpfs node of
//! that minor has, and its size and blocks zero.  Any other call runs in
//! the kernel untouched (SECCOMP_USER_NOTIF_FLAG_CONTINUE).  `st_dev` and
//! `st_ino` stay the node's, as a devtmpfs node keeps its own, so
//! `/proc/PID/maps` and the stat of a mapping's file still agree.
//!
//! The name is resolved in the caller's view of the file system:
//! `/proc/TID/root` for an absolute path, `/proc/TID/cwd` or
//! `/proc/TID/fd/DIRFD` for a relative one, `/proc/TID/fd/FD` for `fstat`
//! and AT_EMPTY_PATH.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::device::{user_read, user_write};
use crate::supervise::StatCall;
use crate::sysfs::DRM_MAJOR;

/// What a stat call names, in the supervisor's view.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub path: PathBuf,
    /// Follow a final symlink (never for an fd's magic link, which is
    /// always followed: the fd's own file is meant).
    pub follow: bool,
}

/// The longest path read from a caller (PATH_MAX).
const PATH_MAX: usize = 4096;

/// Reads the NUL-terminated path at `addr` in thread `tid`, a page at a
/// time (a short string may end just before an unmapped page).
fn read_path(tid: u32, addr: u64) -> Result<Vec<u8>, i32> {
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < PATH_MAX {
        let chunk = (4096 - (at % 4096)) as usize;
        let mut buf = vec![0u8; chunk.min(PATH_MAX - out.len())];
        user_read(tid, at, &mut buf)?;
        if let Some(end) = buf.iter().position(|&c| c == 0) {
            out.extend_from_slice(&buf[..end]);
            return Ok(out);
        }
        out.extend_from_slice(&buf);
        at += buf.len() as u64;
    }
    Err(libc::ENAMETOOLONG)
}

/// Whether a path can name a device node at all: relative names and
/// absolute ones below `/dev` or `/proc` (a process' fd and map_files
/// links).  Other absolute paths are not looked at, so that the common
/// stat costs the supervisor no second look-up.
fn may_name_device(path: &[u8]) -> bool {
    !path.starts_with(b"/") || path.starts_with(b"/dev/") || path.starts_with(b"/proc/")
}

/// Where the call's file is, as the supervisor reaches it (None: not a
/// name that can be one of ours, or unreadable: the kernel answers).
pub fn target(tid: u32, fd: i32, call: &StatCall) -> Option<Target> {
    let name = match call.path {
        None => Vec::new(),
        Some(addr) => read_path(tid, addr).ok()?,
    };
    if name.is_empty() {
        // fstat, or AT_EMPTY_PATH (without it an empty name is ENOENT).
        if call.path.is_some() && call.flags & libc::AT_EMPTY_PATH == 0 || fd < 0 {
            return None;
        }
        return Some(Target {
            path: PathBuf::from(format!("/proc/{tid}/fd/{fd}")),
            follow: true,
        });
    }
    if !may_name_device(&name) {
        return None;
    }
    let name = std::ffi::OsStr::from_bytes(&name);
    let base = if name.as_bytes().starts_with(b"/") {
        format!("/proc/{tid}/root")
    } else if fd == libc::AT_FDCWD {
        format!("/proc/{tid}/cwd/")
    } else {
        format!("/proc/{tid}/fd/{fd}/")
    };
    let mut path = std::ffi::OsString::from(base);
    path.push(name);
    Some(Target {
        path: PathBuf::from(path),
        follow: call.flags & libc::AT_SYMLINK_NOFOLLOW == 0,
    })
}

/// A devtmpfs node's view of a file: character device `226:minor`, no
/// size.
pub fn as_chardev(st: &mut libc::stat, minor: u32) {
    st.st_mode = libc::S_IFCHR | (st.st_mode & 0o7777);
    st.st_rdev = libc::makedev(DRM_MAJOR, minor);
    st.st_size = 0;
    st.st_blocks = 0;
}

/// The same for `statx`.
pub fn as_chardev_x(stx: &mut libc::statx, minor: u32) {
    stx.stx_mode = (libc::S_IFCHR | (stx.stx_mode as u32 & 0o7777)) as u16;
    stx.stx_rdev_major = DRM_MAJOR;
    stx.stx_rdev_minor = minor;
    stx.stx_size = 0;
    stx.stx_blocks = 0;
}

/// stats `t` as the caller asked (`statx` with its mask), in the
/// supervisor.
pub enum Attr {
    Stat(libc::stat),
    Statx(libc::statx),
}

impl Attr {
    pub fn id(&self) -> (u64, u64) {
        match self {
            Attr::Stat(s) => (s.st_dev, s.st_ino),
            Attr::Statx(x) => (libc::makedev(x.stx_dev_major, x.stx_dev_minor), x.stx_ino),
        }
    }
}

pub fn lookup(t: &Target, call: &StatCall) -> Option<Attr> {
    let c = CString::new(t.path.as_os_str().as_bytes()).ok()?;
    let nofollow = if t.follow {
        0
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    match call.statx_mask {
        None => {
            // SAFETY: an all-zero stat is valid; fstatat fills it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `c` is NUL-terminated and `st` writable, both live.
            let r = unsafe { libc::fstatat(libc::AT_FDCWD, c.as_ptr(), &mut st, nofollow) };
            (r == 0).then_some(Attr::Stat(st))
        }
        Some(mask) => {
            // SAFETY: an all-zero statx is valid; statx fills it.
            let mut stx: libc::statx = unsafe { std::mem::zeroed() };
            let sync = call.flags & libc::AT_STATX_SYNC_TYPE;
            // SAFETY: `c` is NUL-terminated and `stx` writable, both live.
            let r = unsafe {
                libc::statx(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    nofollow | sync | (call.flags & libc::AT_NO_AUTOMOUNT),
                    mask,
                    &mut stx,
                )
            };
            (r == 0).then_some(Attr::Statx(stx))
        }
    }
}

/// Writes the character-device view of `attr` (render minor `minor`) to
/// the caller's buffer.
pub fn answer(tid: u32, call: &StatCall, attr: Attr, minor: u32) -> Result<(), i32> {
    match attr {
        Attr::Stat(mut st) => {
            as_chardev(&mut st, minor);
            user_write(tid, call.buf, pod_bytes(&st))
        }
        Attr::Statx(mut stx) => {
            as_chardev_x(&mut stx, minor);
            user_write(tid, call.buf, pod_bytes(&stx))
        }
    }
}

fn pod_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: `T` is a libc struct of plain integers (stat, statx), every
    // byte initialised (they come zeroed, then filled by the kernel).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(path: Option<u64>, flags: i32) -> StatCall {
        StatCall {
            path,
            flags,
            buf: 0,
            statx_mask: None,
        }
    }

    #[test]
    fn fstat_names_the_fd() {
        let t = target(7, 5, &call(None, 0)).unwrap();
        assert_eq!(t.path, PathBuf::from("/proc/7/fd/5"));
        assert!(t.follow);
        assert_eq!(target(7, -1, &call(None, 0)), None);
    }

    #[test]
    fn only_device_paths_are_looked_at() {
        assert!(may_name_device(b"/dev/dri/renderD128"));
        assert!(may_name_device(b"/proc/self/fd/3"));
        assert!(may_name_device(b"renderD128"));
        assert!(!may_name_device(b"/usr/lib/libc.so.6"));
        assert!(!may_name_device(b"/devices"));
    }

    #[test]
    fn a_node_becomes_226_minor() {
        // SAFETY: an all-zero stat is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        st.st_mode = libc::S_IFREG | 0o666;
        st.st_size = 1 << 40;
        st.st_ino = 42;
        as_chardev(&mut st, 129);
        assert_eq!(st.st_mode, libc::S_IFCHR | 0o666);
        assert_eq!(libc::major(st.st_rdev), 226);
        assert_eq!(libc::minor(st.st_rdev), 129);
        assert_eq!((st.st_size, st.st_ino), (0, 42));
    }
}
