//! Files by identity: `stat`/`fstat` keeping errno, a process' `/proc`
//! directory held open, and POSIX named semaphores.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// `stat(2)` of a path, keeping errno.
pub fn stat_path(path: &Path) -> io::Result<libc::stat> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable
    // memory of the size stat(2) fills.
    let r = unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: stat returned 0, so it initialised the whole struct.
    Ok(unsafe { st.assume_init() })
}

/// `fstat(2)` of an fd, keeping errno.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the fd is valid for the borrow and `st` is writable memory of
    // the size fstat(2) fills.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so it initialised the whole struct.
    Ok(unsafe { st.assume_init() })
}

/// `openat(dir, name, flags | O_CLOEXEC)`.
fn open_at(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: openat of a NUL-terminated relative path under a directory fd
    // valid for the borrow; the result is a new fd or -1.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A process' `/proc/<pid>` directory, held open: once that process is
/// gone, reads through it fail, whatever process takes the pid next.
#[derive(Debug)]
pub struct ProcDir {
    dir: OwnedFd,
}

impl ProcDir {
    /// Opens `<pid>` in `proc` (a `/proc` where `pid` is valid).
    pub fn open(proc: BorrowedFd<'_>, pid: i32) -> io::Result<ProcDir> {
        let name = CString::new(pid.to_string()).expect("no NUL in a number");
        Ok(ProcDir {
            dir: open_at(proc, &name, libc::O_RDONLY | libc::O_DIRECTORY)?,
        })
    }

    /// The process' `stat` line (ESRCH once it is gone).
    pub fn stat(&self) -> io::Result<String> {
        let f = std::fs::File::from(open_at(
            std::os::fd::AsFd::as_fd(&self.dir),
            c"stat",
            libc::O_RDONLY,
        )?);
        let mut buf = vec![0u8; 1024];
        let n = f.read_at(&mut buf, 0)?;
        buf.truncate(n);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// Creates the POSIX named semaphore `name` with `value` and the permission
/// bits `mode` (less the umask, as `sem_open` applies it), unless it exists:
/// returns whether it was created.
pub fn create_semaphore(name: &CStr, mode: u32, value: u32) -> io::Result<bool> {
    // SAFETY: `name` is NUL-terminated; with O_CREAT sem_open reads the two
    // variadic arguments mode and value, passed with their C types.
    let sem = unsafe {
        libc::sem_open(
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL,
            mode as libc::c_uint,
            value as libc::c_uint,
        )
    };
    if sem == libc::SEM_FAILED {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EEXIST) => Ok(false),
            _ => Err(e),
        };
    }
    // SAFETY: `sem` is the live handle sem_open just returned.
    if unsafe { libc::sem_close(sem) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

/// Removes the POSIX named semaphore `name`.
pub fn unlink_semaphore(name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated.
    if unsafe { libc::sem_unlink(name.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new tmpfs that is mounted nowhere (`fsopen`, `fsmount`): the fd of
/// its root directory, mode 0700.  Its files live in memory and reach
/// whoever holds the fd (`/proc/self/fd/N/NAME`, `openat`); it is gone
/// with the last fd.  Needs `CAP_SYS_ADMIN`.
pub fn private_tmpfs() -> io::Result<OwnedFd> {
    // <linux/mount.h>
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: fsopen reads the NUL-terminated file system name; it returns
    // a new fd or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsopen returned a new fd that nothing else owns.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as libc::c_int) };
    let set = |key: &CStr, value: &CStr| {
        // SAFETY: FSCONFIG_SET_STRING reads the two NUL-terminated strings.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set(c"mode", c"0700")?;
    // SAFETY: FSCONFIG_CMD_CREATE takes no pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsmount takes the configured context's fd and flags; it
    // returns a new fd or -1.
    let m = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) };
    if m < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fsmount returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(m as libc::c_int) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn stat_keeps_errno_and_a_proc_dir_outlives_nothing() {
        let e = stat_path(Path::new("/nonexistent/criu-rocm")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let a = stat_fd(f.as_fd()).unwrap();
        let b = stat_path(Path::new("/proc/self/status")).unwrap();
        assert_eq!(a.st_dev, b.st_dev);
        let proc = std::fs::File::open("/proc").unwrap();
        let me = ProcDir::open(proc.as_fd(), std::process::id() as i32).unwrap();
        assert!(me
            .stat()
            .unwrap()
            .starts_with(&format!("{} (", std::process::id())));
        let e = ProcDir::open(proc.as_fd(), i32::MAX).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }
}
