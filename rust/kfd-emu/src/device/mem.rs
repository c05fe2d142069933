//! Backends: the sparse memfds behind the device nodes, the daemon's own
//! mappings of them, the caller's memory (`process_vm_readv/writev`) and
//! the caller's files (`pidfd_getfd`).

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use kfd_abi::exit;

use crate::os_err;

/// One sparse memfd backing all opens of one device node.
pub struct Memfd {
    fd: OwnedFd,
    size: u64,
}

impl Memfd {
    pub fn new(name: &str, size: u64) -> io::Result<Memfd> {
        Self::with_flags(name, size, 0)
    }

    /// As [`Memfd::new`], with more `memfd_create` flags
    /// (`MFD_ALLOW_SEALING`).
    pub fn with_flags(name: &str, size: u64, flags: u32) -> io::Result<Memfd> {
        let cname = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: memfd_create reads a valid NUL-terminated string.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on an fd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Memfd { fd, size })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Maps `[off, off+len)` shared into the daemon.
    pub fn map(&self, off: u64, len: u64) -> Result<Mapping, i32> {
        if len == 0 || off.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(libc::EINVAL);
        }
        // SAFETY: a fresh shared mapping of our own memfd; no Rust object
        // aliases the new address range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(libc::ENOMEM);
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len: len as usize,
        })
    }

    /// Gives the pages of `[off, off+len)` back (freed BOs read as zero).
    pub fn punch(&self, off: u64, len: u64) {
        // SAFETY: fallocate on an fd we own with integer arguments.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
    }
}

/// The daemon's shared mapping of a range of a memfd; the memory is shared
/// with the emulated processes, so it is only accessed by copies.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; all
// accesses are bounds-checked raw copies, never references.
unsafe impl Send for Mapping {}
// SAFETY: as above: no interior references are handed out.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    fn range(&self, off: u64, n: usize) -> Option<usize> {
        let end = off.checked_add(n as u64)?;
        (end <= self.len as u64).then_some(off as usize)
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> bool {
        let Some(o) = self.range(off, buf.len()) else {
            return false;
        };
        // SAFETY: o <= len, so the pointer stays inside the live mapping.
        let src = unsafe { self.ptr.add(o) };
        // SAFETY: [o, o+n) lies inside the live mapping; buf is a distinct
        // Rust buffer of n bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) };
        true
    }

    pub fn write(&self, off: u64, data: &[u8]) -> bool {
        let Some(o) = self.range(off, data.len()) else {
            return false;
        };
        // SAFETY: o <= len, so the pointer stays inside the live mapping.
        let dst = unsafe { self.ptr.add(o) };
        // SAFETY: [o, o+n) lies inside the live mapping; data is a distinct
        // Rust buffer of n bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        true
    }

    /// Copies `n` bytes at `src_off` of `src` to `off` of this mapping;
    /// overlapping ranges (one mapping) copy like memmove.
    pub fn copy_from(&self, off: u64, src: &Mapping, src_off: u64, n: usize) -> bool {
        let (Some(d), Some(s)) = (self.range(off, n), src.range(src_off, n)) else {
            return false;
        };
        // SAFETY: s <= src.len, so the pointer stays inside src's mapping.
        let from = unsafe { src.ptr.add(s) };
        // SAFETY: d <= self.len, so the pointer stays inside this mapping.
        let to = unsafe { self.ptr.add(d) };
        // SAFETY: [s, s+n) and [d, d+n) lie inside the two live mappings;
        // ptr::copy allows them to overlap (one mapping).  No Rust
        // reference aliases mapped memory.
        unsafe { std::ptr::copy(from, to, n) };
        true
    }

    /// The naturally aligned `T` at `off`, for atomics.
    fn aligned<T>(&self, off: u64) -> Option<*mut T> {
        let o = self.range(off, size_of::<T>())?;
        // SAFETY: o + size_of::<T>() <= len: inside the live mapping.
        let p = unsafe { self.ptr.add(o) };
        p.cast::<T>().is_aligned().then_some(p.cast())
    }

    /// Atomically replaces the 32-bit word at `off` by `f(old)` (unless
    /// `f` returns None) and returns the old value; None when the word is
    /// not naturally aligned or not inside the mapping.
    pub fn atomic_u32(&self, off: u64, f: impl FnMut(u32) -> Option<u32>) -> Option<u32> {
        let p = self.aligned::<u32>(off)?;
        // SAFETY: p is aligned and inside the mapping, which outlives the
        // reference (borrowed from self).  The memory is shared with other
        // processes, whose accesses Rust's model does not see; the CPU's
        // atomic RMW is coherent with their atomics on the same page.
        let a = unsafe { AtomicU32::from_ptr(p) };
        Some(
            match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, f) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// As [`Mapping::atomic_u32`] for a 64-bit word.
    pub fn atomic_u64(&self, off: u64, f: impl FnMut(u64) -> Option<u64>) -> Option<u64> {
        let p = self.aligned::<u64>(off)?;
        // SAFETY: as in atomic_u32.
        let a = unsafe { AtomicU64::from_ptr(p) };
        Some(
            match a.fetch_update(Ordering::SeqCst, Ordering::SeqCst, f) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    pub fn read_u64(&self, off: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(off, &mut b).then(|| u64::from_le_bytes(b))
    }

    pub fn write_u64(&self, off: u64, v: u64) -> bool {
        self.write(off, &v.to_le_bytes())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping the range this value mapped and owns.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Duplicates fd `fd` of process `tgid` into this process
/// (`pidfd_open` + `pidfd_getfd`; needs ptrace access to the process).
pub fn pull_fd(tgid: u32, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open with integer arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, tgid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(os_err(format!("pidfd_open({tgid})")));
    }
    // SAFETY: a fresh fd nobody else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd with a valid pidfd and integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(os_err(format!("pidfd_getfd(pid {tgid}, fd {fd})")));
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// Reads `buf.len()` bytes at `addr` of thread `tid` (EFAULT on failure).
pub fn user_read(tid: u32, addr: u64, buf: &mut [u8]) -> Result<(), i32> {
    if buf.is_empty() {
        return Ok(());
    }
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`, which lives across the call;
    // the remote one is only interpreted by the kernel.
    let n = unsafe { libc::process_vm_readv(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != buf.len() as isize {
        return Err(libc::EFAULT);
    }
    Ok(())
}

/// Whether process `tgid` exits: each thread of it is gone, past the
/// release of its memory (process_vm_readv answers ESRCH), or on its way
/// there (exiting, or SIGKILL pending: a kill or exit_group() of the
/// process reaches its threads one by one), so none touches its memory
/// again.  A process whose leader alone exited (pthread_exit) still has
/// its memory in its other, running threads.
///
/// A thread may for a moment show no sign of an exit under way (see
/// [`exit::EXIT_GRACE`]) while the memory an access needed is already gone
/// (the leader's, say): a process not seen exiting at once is looked at
/// again for up to that grace before its memory counts as there.  Only a
/// failed access asks, so only a fault waits.
pub fn memory_gone(tgid: u32) -> bool {
    exit::seen_within(exit::EXIT_GRACE, || {
        exit::every_thread(tgid, without_memory)
    })
}

/// Whether thread `tid` has no address space (any address: a thread with
/// one answers EFAULT).
fn without_memory(tid: u32) -> bool {
    let mut b = [0u8; 1];
    let local = libc::iovec {
        iov_base: b.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: std::ptr::dangling_mut::<libc::c_void>(),
        iov_len: 1,
    };
    // SAFETY: the local iovec covers `b`, which lives across the call;
    // the remote one is only interpreted by the kernel.
    let n = unsafe { libc::process_vm_readv(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Writes `data` at `addr` of thread `tid` (EFAULT on failure).
pub fn user_write(tid: u32, addr: u64, data: &[u8]) -> Result<(), i32> {
    if data.is_empty() {
        return Ok(());
    }
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: the local iovec covers `data` (only read by the kernel).
    let n = unsafe { libc::process_vm_writev(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != data.len() as isize {
        return Err(libc::EFAULT);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state letter of process `pid` (`/proc/PID/stat` field 3).
    fn state(pid: u32) -> Option<char> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        s.rsplit_once(") ")?.1.chars().next()
    }

    #[test]
    fn a_process_has_its_memory_until_it_exits() {
        assert!(
            !memory_gone(std::process::id()),
            "this process has its memory"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep starts");
        let pid = child.id();
        assert!(!memory_gone(pid), "a running child has its memory");
        child.kill().expect("SIGKILL");
        // A zombie (killed, not yet reaped) has no address space left.
        let t0 = std::time::Instant::now();
        while state(pid) != Some('Z') {
            assert!(
                t0.elapsed().as_secs() < 10,
                "pid {pid} did not become a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(memory_gone(pid), "a zombie's memory is gone");
        child.wait().expect("reaped");
        assert!(memory_gone(pid), "a reaped process' memory is gone");
    }
}
