//! The emulator's stand-in for amdgpu's dma-bufs.
//!
//! A FUSE ioctl cannot hand out a file descriptor, and this kernel has no
//! udmabuf or dma-heaps, so a "dmabuf" of a VRAM/GTT BO is a sealed memfd
//! the emulator created and recognises by its inode (`kfd-emu
//! supervise` installs it in the caller with SECCOMP_IOCTL_NOTIF_ADDFD).
//! As KFD keeps one dma-buf per BO (`amdgpu_amdkfd_gpuvm_export_dmabuf`
//! exports once and hands out new fds of it), every export of one BO is a
//! new fd of the same memfd, so importing two of them into one render file
//! gives one GEM handle, as PRIME does.
//!
//! The memfd's size is the BO's (libdrm's `amdgpu_bo_import` takes the
//! size with lseek); its contents are *not* the BO's: the emulated GPU
//! reaches the BO through the registry, a CPU mapping of the memfd reads
//! zeros, and it is sealed against writes (a shared writable mapping is
//! EPERM), so nothing can mistake it for the BO's memory.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use super::mem::Mapping;

/// What a dmabuf of the emulator refers to.
pub struct Dmabuf {
    pub size: u64,
    /// The BO's memory, as the daemon maps it.
    pub map: Arc<Mapping>,
    /// (st_dev, st_ino) of the memfd.
    pub id: (u64, u64),
    /// The memfd; the registry keeps it while the BO lives.
    file: OwnedFd,
}

/// The dmabufs handed out, by BO and by inode.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_bo: HashMap<(usize, u64), Arc<Dmabuf>>,
    by_id: HashMap<(u64, u64), Arc<Dmabuf>>,
}

fn file_id(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: fstat writes one stat struct into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a live descriptor; `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

fn sealed_memfd(size: u64) -> io::Result<OwnedFd> {
    let name = CString::new("kfd-emu-dmabuf").expect("no NUL");
    // SAFETY: memfd_create reads a valid NUL-terminated string.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on an fd we own with integer arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

impl Registry {
    /// The dmabuf of the BO at render-memfd `offset` of GPU `gpu`: the
    /// existing one, or a new one over `map`.
    pub fn export(
        &self,
        gpu: usize,
        offset: u64,
        size: u64,
        map: &Arc<Mapping>,
    ) -> io::Result<Arc<Dmabuf>> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = inner.by_bo.get(&(gpu, offset)) {
            return Ok(d.clone());
        }
        let file = sealed_memfd(size)?;
        let id = file_id(file.as_fd())?;
        let d = Arc::new(Dmabuf {
            size,
            map: map.clone(),
            id,
            file,
        });
        inner.by_bo.insert((gpu, offset), d.clone());
        inner.by_id.insert(id, d.clone());
        Ok(d)
    }

    /// The dmabuf `fd` (a descriptor of the daemon's) is, or None for any
    /// other file.
    pub fn lookup(&self, fd: BorrowedFd<'_>) -> Option<Arc<Dmabuf>> {
        let id = file_id(fd).ok()?;
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.get(&id).cloned()
    }

    /// The BO is freed: its dmabuf is no longer one of ours (fds of it
    /// that are still open become plain memfds).
    pub fn forget(&self, gpu: usize, offset: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = inner.by_bo.remove(&(gpu, offset)) {
            inner.by_id.remove(&d.id);
        }
    }
}

impl Dmabuf {
    /// The memfd, to install into a process.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_memfd_per_bo_recognised_by_inode_and_sealed() {
        let mem = super::super::mem::Memfd::new("t", 1 << 20).unwrap();
        let map = Arc::new(mem.map(0, 8192).unwrap());
        let r = Registry::default();
        let a = r.export(0, 0, 8192, &map).unwrap();
        let b = r.export(0, 0, 8192, &map).unwrap();
        assert_eq!(a.id, b.id, "one dmabuf per BO");
        let dup = a.file().try_clone_to_owned().unwrap();
        assert_eq!(r.lookup(dup.as_fd()).unwrap().size, 8192);
        // SAFETY: lseek on a descriptor we own.
        let end = unsafe { libc::lseek(dup.as_raw_fd(), 0, libc::SEEK_END) };
        assert_eq!(end, 8192, "lseek gives the BO size, as libdrm reads it");
        // SAFETY: a shared writable mapping request; the seal refuses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                dup.as_raw_fd(),
                0,
            )
        };
        assert_eq!(p, libc::MAP_FAILED);
        assert!(r.lookup(mem.fd()).is_none(), "another file is not a dmabuf");
        r.forget(0, 0);
        assert!(r.lookup(dup.as_fd()).is_none());
    }
}
