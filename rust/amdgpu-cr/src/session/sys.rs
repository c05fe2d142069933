//! The few system calls the sessions need beyond the ABI crate: reaching
//! another task's open files, comparing open file descriptions, and moving
//! an fd out of the way of the numbers CRIU will restore.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// `pidfd_open(pid, 0)`.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// A copy in our fd table of fd `target` of the task behind `pidfd`: the same
/// open file description, as `pidfd_getfd(2)` gives (close-on-exec set).
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, an fd number and flags, and returns
    // a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Whether two of our fds refer to the same open file description.
pub fn same_open_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> io::Result<bool> {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    // SAFETY: kcmp compares two fds of our own process; both are open for
    // the borrows.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            me,
            me,
            KCMP_FILE,
            a.as_raw_fd() as libc::c_ulong,
            b.as_raw_fd() as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r == 0)
}

/// A duplicate of `fd` numbered `floor` or above (close-on-exec).
pub fn dup_at_least(fd: BorrowedFd<'_>, floor: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a valid fd to the lowest free number
    // ≥ floor; the result is a new fd or -1.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor.max(0)) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The open fd numbers of task `pid`, from `/proc/<pid>/fd`.
pub fn task_fds(pid: i32) -> io::Result<Vec<RawFd>> {
    let mut fds = Vec::new();
    for ent in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        if let Some(n) = ent?.file_name().to_str().and_then(|n| n.parse().ok()) {
            fds.push(n);
        }
    }
    fds.sort_unstable();
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pidfd_copy_is_the_same_open_file() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let me = pidfd_open(std::process::id() as i32).unwrap();
        let copy = pidfd_getfd(me.as_fd(), f.as_raw_fd()).unwrap();
        assert!(same_open_file(f.as_fd(), copy.as_fd()).unwrap());
        let other = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!same_open_file(f.as_fd(), other.as_fd()).unwrap());
        let high = dup_at_least(f.as_fd(), 900).unwrap();
        assert!(high.as_raw_fd() >= 900);
        assert!(task_fds(std::process::id() as i32)
            .unwrap()
            .contains(&high.as_raw_fd()));
    }
}
