//! File descriptors: reaching another task's open files, comparing open
//! file descriptions, keeping an fd out of the way of numbers CRIU will
//! restore, memfds, and `SOCK_SEQPACKET` pairs carrying whole records.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Takes ownership of what a call returning a new fd or -1 returned.
fn owned(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A copy in our fd table of fd `target` of the task behind `pidfd`: the same
/// open file description, as `pidfd_getfd(2)` gives (close-on-exec set).
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, an fd number and flags, and returns
    // a new fd or -1; it touches no memory of ours.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) })
}

/// Whether two of our fds refer to the same open file description (`kcmp`).
pub fn same_open_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> io::Result<bool> {
    const KCMP_FILE: libc::c_int = 0;
    let me = super::process::getpid();
    // SAFETY: kcmp compares two fds of our own process, open for the
    // borrows; it touches no memory of ours.
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
    owned(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor.max(0)) }.into())
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

/// A new, empty memfd named `name` (close-on-exec).
pub fn memfd(name: &std::ffi::CStr) -> io::Result<std::fs::File> {
    // SAFETY: the name is a valid C string; memfd_create returns a new fd
    // or -1.
    owned(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) }.into()).map(Into::into)
}

/// A connected `AF_UNIX` `SOCK_SEQPACKET` pair (close-on-exec): records
/// arrive whole, and a closed end reads as end-of-file at the other.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair writes two fds into `fds` on success.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two fresh fds owned by nobody else.
    let a = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let b = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    Ok((a, b))
}

/// Sends one record on a seqpacket socket, whole or not at all, never
/// raising SIGPIPE (a gone peer is `EPIPE`); restarts on EINTR.
pub fn send_record(sock: BorrowedFd<'_>, rec: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: send reads `rec.len()` bytes of our buffer.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                rec.as_ptr().cast(),
                rec.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n == rec.len() as isize {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(if n < 0 {
            e
        } else {
            io::Error::from_raw_os_error(libc::EMSGSIZE)
        });
    }
}

/// Receives one record from a seqpacket socket; `Ok(0)`: the peer is gone.
/// Restarts on EINTR.
pub fn recv_record(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: recv writes at most `buf.len()` bytes into our buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pidfd_copy_is_the_same_open_file() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let me = super::super::process::pidfd_open(std::process::id() as i32).unwrap();
        let copy = pidfd_getfd(me.as_fd(), f.as_raw_fd()).unwrap();
        assert!(same_open_file(f.as_fd(), copy.as_fd()).unwrap());
        let other = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!same_open_file(f.as_fd(), other.as_fd()).unwrap());
        let high = dup_at_least(f.as_fd(), 900).unwrap();
        assert!(high.as_raw_fd() >= 900);
        assert!(task_fds(std::process::id() as i32)
            .unwrap()
            .contains(&high.as_raw_fd()));
        let e = pidfd_getfd(me.as_fd(), 1_000_000).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "errno kept");
    }

    #[test]
    fn records_go_whole_and_a_closed_end_reads_as_eof() {
        let (a, b) = seqpacket_pair().unwrap();
        send_record(a.as_fd(), b"one").unwrap();
        send_record(a.as_fd(), b"two!").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(recv_record(b.as_fd(), &mut buf).unwrap(), 3);
        assert_eq!(recv_record(b.as_fd(), &mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"two!");
        drop(a);
        assert_eq!(recv_record(b.as_fd(), &mut buf).unwrap(), 0);
        let e = send_record(b.as_fd(), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "no SIGPIPE, EPIPE");
    }
}
