//! File descriptors: reaching another task's open files, comparing open
//! file descriptions, keeping an fd out of the way of numbers CRIU will
//! restore, memfds, and `SOCK_SEQPACKET` pairs carrying whole records.

use std::cmp::Ordering;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

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
    Ok(open_file_order(a, b)? == Ordering::Equal)
}

/// How the open file descriptions of two of our fds compare in the
/// kernel's order of them (`kcmp` KCMP_FILE: equal, or the order of the
/// obfuscated `struct file` pointers, the same for every call of one boot).
pub fn open_file_order(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> io::Result<Ordering> {
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
    match r {
        0 => Ok(Ordering::Equal),
        1 => Ok(Ordering::Less),
        2 => Ok(Ordering::Greater),
        r if r < 0 => Err(io::Error::last_os_error()),
        // 3: not equal, and no order (never for KCMP_FILE).
        _ => Err(io::Error::from_raw_os_error(libc::ENOTSUP)),
    }
}

/// Open file descriptions (each kept through a dup of one of its fds) with
/// a value each, in [`open_file_order`]: finding the one an fd refers to
/// among n takes log n `kcmp`s, not n.
pub struct OpenFiles<T> {
    files: Vec<(OwnedFd, T)>,
}

impl<T> Default for OpenFiles<T> {
    fn default() -> Self {
        OpenFiles { files: Vec::new() }
    }
}

impl<T> OpenFiles<T> {
    /// Where `fd`'s open file is kept (`Ok`), or would go (`Err`).
    fn search(&self, fd: BorrowedFd<'_>) -> io::Result<Result<usize, usize>> {
        let (mut lo, mut hi) = (0, self.files.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match open_file_order(self.files[mid].0.as_fd(), fd)? {
                Ordering::Equal => return Ok(Ok(mid)),
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
            }
        }
        Ok(Err(lo))
    }

    /// The value of `fd`'s open file, if it is kept.
    pub fn get(&self, fd: BorrowedFd<'_>) -> io::Result<Option<&T>> {
        Ok(self.search(fd)?.ok().map(|i| &self.files[i].1))
    }

    /// Where `fd`'s open file is in [`Self::iter`]'s order, if it is kept.
    pub fn position(&self, fd: BorrowedFd<'_>) -> io::Result<Option<usize>> {
        Ok(self.search(fd)?.ok())
    }

    /// The value of `fd`'s open file, kept first (through a dup of `fd`,
    /// with the value `new` makes) if it was not.
    pub fn entry(&mut self, fd: BorrowedFd<'_>, new: impl FnOnce() -> T) -> io::Result<&mut T> {
        let i = match self.search(fd)? {
            Ok(i) => i,
            Err(i) => {
                let dup = fd.try_clone_to_owned()?;
                self.files.insert(i, (dup, new()));
                i
            }
        };
        Ok(&mut self.files[i].1)
    }

    /// How many open files are kept.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Every open file kept (a dup of one of its fds) and its value.
    pub fn iter(&self) -> impl Iterator<Item = (BorrowedFd<'_>, &T)> {
        self.files.iter().map(|(f, v)| (f.as_fd(), v))
    }

    pub fn clear(&mut self) {
        self.files.clear();
    }
}

/// A duplicate of `fd` numbered `floor` or above (close-on-exec).
pub fn dup_at_least(fd: BorrowedFd<'_>, floor: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC duplicates a valid fd to the lowest free number
    // ≥ floor; the result is a new fd or -1.
    owned(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor.max(0)) }.into())
}

/// What an inherited fd number refers to, for a process started with fds
/// handed over at fixed numbers to check before it takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inherited {
    /// Not open.
    Closed,
    /// A socket.
    Socket,
    /// A pidfd.
    Pidfd,
    /// Something else.
    Other,
}

/// What our fd `fd` is, by `/proc/self/fd`, without taking it.
pub fn inherited(fd: RawFd) -> Inherited {
    match std::fs::read_link(format!("/proc/self/fd/{fd}")) {
        Err(_) => Inherited::Closed,
        Ok(target) => {
            let t = target.to_string_lossy();
            if t.starts_with("socket:") {
                Inherited::Socket
            } else if t == "anon_inode:[pidfd]" || t.starts_with("pidfd:") {
                Inherited::Pidfd
            } else {
                Inherited::Other
            }
        }
    }
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

/// Room for one fd in a control message: `CMSG_SPACE(sizeof(int))` is 24
/// bytes on LP64; 8-aligned.
type FdCmsg = [u64; 4];

/// Sends one record on a seqpacket socket with, when given, one fd
/// (`SCM_RIGHTS`): whole or not at all, never blocking (`EAGAIN` when the
/// socket is full) and never raising SIGPIPE (a gone peer is `EPIPE`).
/// Async-signal-safe: it allocates nothing and takes no lock.
pub fn send_record_with_fd(
    sock: BorrowedFd<'_>,
    rec: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: rec.as_ptr() as *mut libc::c_void,
        iov_len: rec.len(),
    };
    let mut cbuf: FdCmsg = [0; 4];
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if let Some(fd) = fd {
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        // SAFETY: CMSG_LEN only computes a size.
        let len = unsafe { libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) } as usize;
        hdr.msg_control = cbuf.as_mut_ptr().cast();
        hdr.msg_controllen = space;
        // SAFETY: msg_control points to `space` writable bytes (cbuf has
        // 32), so the first header is inside cbuf.
        let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
        let head = libc::cmsghdr {
            cmsg_len: len,
            cmsg_level: libc::SOL_SOCKET,
            cmsg_type: libc::SCM_RIGHTS,
        };
        // SAFETY: `c` points at the first header inside cbuf, 8-aligned.
        unsafe { c.write(head) };
        // SAFETY: CMSG_DATA points just past the header, inside cbuf.
        let data = unsafe { libc::CMSG_DATA(c) } as *mut RawFd;
        // SAFETY: `data` has room for one int inside cbuf (maybe unaligned).
        unsafe { data.write_unaligned(fd.as_raw_fd()) };
    }
    // SAFETY: `hdr` describes live buffers for the duration of the call.
    let r = unsafe {
        libc::sendmsg(
            sock.as_raw_fd(),
            &hdr,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if r as usize != rec.len() {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(())
}

/// What one [`recv_record_with_fd`] gave.
#[derive(Debug)]
pub enum Received {
    /// A record of this many bytes, and the fd that came with it.
    Record(usize, Option<OwnedFd>),
    /// Nothing queued (a non-blocking receive).
    Empty,
    /// The peer is gone and everything it sent was read.
    End,
}

/// Receives one record from a seqpacket socket into `buf`, with the fd that
/// came with it (close-on-exec); `block: false` returns
/// [`Received::Empty`] at once when nothing is queued.  Restarts on EINTR.
pub fn recv_record_with_fd(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    block: bool,
) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf: FdCmsg = [0; 4];
    // SAFETY: msghdr is plain old data; all-zero is a valid value.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&cbuf);
    let flags = libc::MSG_CMSG_CLOEXEC | if block { 0 } else { libc::MSG_DONTWAIT };
    let r = loop {
        // SAFETY: `hdr` describes live, writable buffers.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, flags) };
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break r;
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Received::Empty),
            _ => Err(e),
        };
    }
    let mut fd = None;
    // SAFETY: the kernel filled msg_control and msg_controllen; CMSG_FIRSTHDR
    // reads them (NULL when no header fits).
    let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
    if !c.is_null() {
        // SAFETY: `c` points at a complete header inside cbuf.
        let h = unsafe { c.read_unaligned() };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA points just past the header, inside cbuf.
            let data = unsafe { libc::CMSG_DATA(c) } as *const RawFd;
            // SAFETY: an SCM_RIGHTS header carries at least one int there,
            // inside cbuf (room for one only: more would be cut, MSG_CTRUNC).
            let raw = unsafe { data.read_unaligned() };
            // SAFETY: the kernel installed this fd in our table for us.
            fd = Some(unsafe { OwnedFd::from_raw_fd(raw) });
        }
    }
    if r == 0 && fd.is_none() {
        return Ok(Received::End);
    }
    Ok(Received::Record(r as usize, fd))
}

/// Waits until one of `fds` is readable, hung up or in error, for at most
/// `timeout` (`None`: no limit); returns which are.  An interrupted wait
/// is `ErrorKind::Interrupted`.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        t.as_millis().min(libc::c_int::MAX as u128) as libc::c_int
    });
    // SAFETY: `p` is a valid array of `p.len()` pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p.iter().map(|p| p.revents != 0).collect())
}

/// Waits until `fd` is ready for `events` (`POLLIN`, `POLLOUT`), hung up
/// or in error, for at most `timeout`; `false`: the time ran out.  An
/// interrupted wait is retried.
pub fn poll_one(fd: BorrowedFd<'_>, events: libc::c_short, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    let ms = timeout.as_millis().min(libc::c_int::MAX as u128) as libc::c_int;
    loop {
        // SAFETY: `p` is one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A new pipe (close-on-exec): its read end and its write end.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two ints of `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new fds that nothing else owns.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    Ok((r, w))
}

/// Sets `O_NONBLOCK` on the open file of `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid fd change only its status flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `buf` to `fd` with one `write(2)`; how much was written.
/// Async-signal-safe.
pub fn write_once(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: write reads `buf.len()` bytes of our buffer.
    let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Points fds 0, 1 and 2 at `/dev/null` (a process that must not hold its
/// starter's terminal or pipes).
pub fn stdio_to_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for std in 0..3 {
        // SAFETY: dup2 of an fd we own onto a standard fd number, which
        // std::io and the C library treat as always open.
        if unsafe { libc::dup2(null.as_raw_fd(), std) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Open files found by any of their fds among many kept in kcmp's
    /// order; a file not kept is not found, and one kept again is the
    /// same entry.
    #[test]
    fn open_files_are_found_by_any_of_their_fds() {
        let files: Vec<std::fs::File> = (0..40)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        let mut kept = OpenFiles::default();
        for (i, f) in files.iter().enumerate().filter(|(i, _)| i % 3 != 0) {
            *kept.entry(f.as_fd(), || 0).unwrap() += i;
        }
        for (i, f) in files.iter().enumerate() {
            let dup = f.try_clone().unwrap();
            let want = (i % 3 != 0).then_some(i);
            assert_eq!(kept.get(dup.as_fd()).unwrap().copied(), want, "file {i}");
        }
        *kept.entry(files[1].as_fd(), || 0).unwrap() += 100;
        assert_eq!(kept.get(files[1].as_fd()).unwrap(), Some(&101));
        assert_eq!(kept.iter().count(), files.len() - files.len().div_ceil(3));
        let order: Vec<_> = kept.iter().map(|(f, _)| f).collect();
        for w in order.windows(2) {
            assert_eq!(open_file_order(w[0], w[1]).unwrap(), Ordering::Less);
        }
        for (at, (f, _)) in kept.iter().enumerate() {
            let dup = f.try_clone_to_owned().unwrap();
            assert_eq!(kept.position(dup.as_fd()).unwrap(), Some(at));
        }
        assert_eq!(kept.position(files[0].as_fd()).unwrap(), None);
    }

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
