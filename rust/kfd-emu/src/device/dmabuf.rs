//! The emulator's stand-in for amdgpu's dma-bufs.
//!
//! A FUSE ioctl cannot hand out a file descriptor, and this kernel has no
//! udmabuf or dma-heaps, so a "dmabuf" of a VRAM/GTT BO is a memfd the
//! emulator created, handed out as a file over it that looks like the
//! kernel's dma-buf to the process and to CRIU (its link reads `/dmabuf:`
//! and no path leads to it: the transport's [`Files`], `fuse::dmabuf`),
//! and recognised by that file's inode (`kfd-emu supervise` installs it in
//! the caller with SECCOMP_IOCTL_NOTIF_ADDFD).  As KFD keeps
//! one dma-buf per BO (`amdgpu_amdkfd_gpuvm_export_dmabuf` exports once and
//! hands out new fds of it), every export of one BO is a new fd of the same
//! file, so importing two of them into one render file gives one GEM
//! handle, as PRIME does.  Its size is the BO's (libdrm's
//! `amdgpu_bo_import` takes the size with lseek).
//!
//! The emulated GPU (an imported dma-buf in a render file's VM) reaches the
//! BO's own memory.  A CPU mapping of the memfd cannot alias the BO's range
//! of the render node's memfd, so its pages are a shadow of the BO, kept
//! coherent at the points of KFD's CRIU flow where its dma-bufs are used:
//! * CHECKPOINT (the process is paused and frozen) copies the BO into the
//!   shadow, which is sealed against new writable mappings and writes (a
//!   dump tool only reads).  After UNPAUSE the dma-buf is still one, as
//!   KFD's is (its BO lives): an import of it reaches the BO's own memory,
//!   so a pre-dump may copy the running process' BOs by SDMA; a CPU
//!   mapping of it still reads the snapshot (CHECKPOINT's bytes, not the
//!   BO's since: a gap), whose memory the daemon keeps until the BO is
//!   freed or checkpointed again;
//! * RESTORE hands out an empty shadow; what the restoring tool writes
//!   through its mapping is copied into the BO at RESUME, before the
//!   process' queues run (only the pages written: BOs the GPU filled meanwhile
//!   stay as the GPU left them), and the shadow's pages are given back.
//!
//! A mapping of a restore's shadow still held after RESUME reads zeros.
//!
//! Outside those ops (a dma-buf the process itself exported with
//! EXPORT_DMABUF or PRIME_HANDLE_TO_FD, whatever ops used it since; a
//! RESTORE's after RESUME, which criu-rocm hands the restored process as
//! its dma-buf fd), a mapping is made as
//! amdgpu makes one, onto the BO's own pages: `kfd-emu supervise` traps
//! every mmap of a file, and the supervisor maps instead the dma-buf's
//! *window* ([`Registry::window`]: a second `dmabuf:` file, over the
//! render node's memfd, one of this dma-buf by its inode too) at the
//! BO's offset in it, in the caller, with ptrace (`crate::inject`).  The
//! mapping's file offset is then the BO's render mmap offset plus the
//! offset asked, as the kernel's is (`drm_gem_prime_mmap` adds the BO's
//! fake offset).  What the window cannot be is a file to map at offset 0
//! by a process the supervisor does not see: unsupervised, an mmap of the
//! fd reaches only the shadow (zeros; what is written there never
//! reaches the BO).  The emulator cannot see the last close of a dma-buf
//! fd: a GEM BO that was exported keeps its memory after its last handle
//! is closed, until the emulator exits.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::mem::{Mapping, Memfd};

/// What the shadow holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shadow {
    /// Nothing (given back, or never used).
    Empty,
    /// The BO as CHECKPOINT found it.
    Snapshot,
    /// What a restoring tool writes, for the BO at RESUME.
    Filling,
}

/// Why a dma-buf is handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Checkpoint,
    Restore,
    /// PRIME_HANDLE_TO_FD of a render node's GEM BO: the shadow is not
    /// used (an import reaches the BO; a supervised CPU mapping of the fd
    /// maps the BO, see the module comment).
    Share,
    /// EXPORT_DMABUF by the process itself: the dma-buf for other devices
    /// and processes to import (mapped as for `Share`).
    Export,
}

/// Which BO a dma-buf is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The GPU's index in the profile.
    pub gpu: usize,
    /// The BO's offset in the GPU's render memfd (its mmap offset).
    pub offset: u64,
    /// `AMDGPU_GEM_DOMAIN_*` the BO prefers.
    pub domain: u32,
}

/// Opens the file handed out for a dma-buf: one whose reads, writes and
/// mappings reach `memfd` (`size` bytes), O_RDWR if `writable`, else
/// O_RDONLY (a shared writable mapping of it fails EACCES, as of a
/// dma-buf exported without `DRM_RDWR`).  The transport's (set with
/// [`Registry::set_files`]); without one the memfd itself is handed out
/// (the model's own tests, which run no transport).
pub trait Files: Send + Sync {
    fn open(&self, memfd: BorrowedFd<'_>, size: u64, writable: bool) -> io::Result<OwnedFd>;
}

/// What a dmabuf of the emulator refers to.
pub struct Dmabuf {
    pub size: u64,
    pub source: Source,
    /// The BO's memory, as the daemon maps it.
    pub map: Arc<Mapping>,
    /// (st_dev, st_ino) of the file handed out.
    pub id: (u64, u64),
    /// The file handed out (every fd of the dma-buf is one of it).
    file: OwnedFd,
    /// The memfd behind it; the registry keeps it while the BO lives.
    mem: Memfd,
    /// The daemon's mapping of the memfd (made before any seal).
    shadow: Mapping,
    state: Mutex<Shadow>,
    /// Exported by a process itself (`Export`, `Share`): its CPU mappings
    /// map the BO (see the module comment).
    exported: AtomicBool,
    /// Whether its file is O_RDWR: the access mode of the export that made
    /// it (PRIME's `DRM_RDWR`), kept by every later export, as the kernel's
    /// one dma-buf file per BO does.
    writable: bool,
    /// The window onto the render node's memfd, made at the first mapping.
    window: OnceLock<OwnedFd>,
}

/// The dmabufs handed out, by BO and by inode.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    files: OnceLock<Box<dyn Files>>,
}

#[derive(Default)]
struct Inner {
    by_bo: HashMap<(usize, u64), Arc<Dmabuf>>,
    by_id: HashMap<(u64, u64), Arc<Dmabuf>>,
}

fn file_id(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    // SAFETY: an all-zero stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is a live descriptor; `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: fcntl on a live descriptor with integer arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `lseek(fd, off, whence)`, None at ENXIO (no more data or hole).
fn seek(fd: BorrowedFd<'_>, off: u64, whence: i32) -> Option<u64> {
    // SAFETY: lseek on a live descriptor with integer arguments.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), off as libc::off_t, whence) };
    (r >= 0).then_some(r as u64)
}

impl Dmabuf {
    /// The file to install into a process.
    pub fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shadow> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where a CPU mapping of `len` bytes at dma-buf offset `offset` goes
    /// in the render node's memfd: None while a CRIU op's shadow stands in
    /// for the BO (a CHECKPOINT's snapshot, a RESTORE's until RESUME) and
    /// the process did not export the dma-buf itself (the mapping is the
    /// shadow's), EINVAL past the BO's end (`dma_buf_mmap_internal`).
    pub fn mapped_at(&self, offset: u64, len: u64) -> Option<Result<u64, i32>> {
        if !self.exported.load(Ordering::Acquire) && *self.lock() != Shadow::Empty {
            return None;
        }
        let end = offset.checked_add(len);
        Some(match end {
            Some(e) if e <= self.size.next_multiple_of(4096) => Ok(self.source.offset + offset),
            _ => Err(libc::EINVAL),
        })
    }

    /// CHECKPOINT: the shadow becomes a copy of the BO.
    fn snapshot(&self) -> io::Result<()> {
        let mut st = self.lock();
        if !self.shadow.copy_from(0, &self.map, 0, self.size as usize) {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        if *st != Shadow::Snapshot {
            // A dump tool only reads; a writable mapping would write
            // nowhere.  (F_SEAL_FUTURE_WRITE spares the daemon's mapping.)
            add_seals(self.mem.fd(), libc::F_SEAL_FUTURE_WRITE)?;
        }
        *st = Shadow::Snapshot;
        Ok(())
    }

    /// RESUME: the pages written through the shadow go into the BO; the
    /// shadow's pages are given back.
    fn fill_back(&self) {
        let mut st = self.lock();
        if *st != Shadow::Filling {
            return;
        }
        let fd = self.mem.fd();
        let mut off = 0;
        while let Some(data) = seek(fd, off, libc::SEEK_DATA).filter(|&d| d < self.size) {
            let end = seek(fd, data, libc::SEEK_HOLE)
                .unwrap_or(self.size)
                .min(self.size);
            self.map
                .copy_from(data, &self.shadow, data, (end - data) as usize);
            off = end;
        }
        self.mem.punch(0, self.size);
        *st = Shadow::Empty;
    }
}

impl Registry {
    /// Sets how dma-buf files are opened (once; later calls are ignored).
    pub fn set_files(&self, files: Box<dyn Files>) {
        let _ = self.files.set(files);
    }

    fn open_file(&self, mem: &Memfd, size: u64, writable: bool) -> io::Result<OwnedFd> {
        self.open_file_over(mem.fd(), size, writable)
    }

    fn open_file_over(&self, fd: BorrowedFd<'_>, size: u64, writable: bool) -> io::Result<OwnedFd> {
        match self.files.get() {
            Some(f) => f.open(fd, size, writable),
            None if writable => fd.try_clone_to_owned(),
            None => {
                std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(Into::into)
            }
        }
    }

    /// The dmabuf of the BO at render-memfd `offset` of GPU `gpu` (the
    /// existing one, or a new one over `map`, read-write), its shadow made
    /// ready for `purpose`.
    pub fn export(
        &self,
        source: Source,
        size: u64,
        map: &Arc<Mapping>,
        purpose: Purpose,
    ) -> io::Result<Arc<Dmabuf>> {
        self.export_as(source, size, map, purpose, true)
    }

    /// [`Self::export`], a new dmabuf's file O_RDWR if `writable`, else
    /// O_RDONLY (an existing one keeps its own: the kernel's export makes
    /// the BO's dma-buf file once).
    pub fn export_as(
        &self,
        source: Source,
        size: u64,
        map: &Arc<Mapping>,
        purpose: Purpose,
        writable: bool,
    ) -> io::Result<Arc<Dmabuf>> {
        let (gpu, offset) = (source.gpu, source.offset);
        let d = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match inner.by_bo.get(&(gpu, offset)) {
                Some(d) => d.clone(),
                None => {
                    let mem = Memfd::with_flags("kfd-emu-dmabuf", size, libc::MFD_ALLOW_SEALING)?;
                    add_seals(mem.fd(), libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)?;
                    let shadow = mem.map(0, size).map_err(io::Error::from_raw_os_error)?;
                    let file = self.open_file(&mem, size, writable)?;
                    let id = file_id(file.as_fd())?;
                    let d = Arc::new(Dmabuf {
                        size,
                        source,
                        map: map.clone(),
                        id,
                        file,
                        mem,
                        shadow,
                        state: Mutex::new(Shadow::Empty),
                        exported: AtomicBool::new(false),
                        writable,
                        window: OnceLock::new(),
                    });
                    inner.by_bo.insert((gpu, offset), d.clone());
                    inner.by_id.insert(id, d.clone());
                    d
                }
            }
        };
        match purpose {
            Purpose::Export | Purpose::Share => d.exported.store(true, Ordering::Release),
            Purpose::Checkpoint => d.snapshot()?,
            Purpose::Restore => {
                let mut st = d.lock();
                if *st == Shadow::Empty {
                    *st = Shadow::Filling;
                }
            }
        }
        Ok(d)
    }

    /// The window of dma-buf `d` onto `render` (the render node's memfd of
    /// its GPU): a file handed out as a dma-buf whose
    /// mappings reach `render` at their own offset, made once and known
    /// as `d` by its inode (an IMPORT_DMABUF or a dump of a mapping of it
    /// finds the BO).
    pub fn window<'a>(
        &self,
        d: &'a Arc<Dmabuf>,
        render: BorrowedFd<'_>,
    ) -> io::Result<BorrowedFd<'a>> {
        if d.window.get().is_none() {
            let size = std::fs::File::from(render.try_clone_to_owned()?)
                .metadata()?
                .len();
            let file = self.open_file_over(render, size, d.writable)?;
            let id = file_id(file.as_fd())?;
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            if d.window.set(file).is_ok() {
                inner.by_id.insert(id, d.clone());
            }
        }
        Ok(d.window.get().expect("set above").as_fd())
    }

    /// The dmabuf `fd` (a descriptor of the daemon's) is, or None for any
    /// other file.
    pub fn lookup(&self, fd: BorrowedFd<'_>) -> Option<Arc<Dmabuf>> {
        self.lookup_id(file_id(fd).ok()?)
    }

    /// The dmabuf of the file whose `(st_dev, st_ino)` is `id`, or None.
    pub fn lookup_id(&self, id: (u64, u64)) -> Option<Arc<Dmabuf>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_id.get(&id).cloned()
    }

    /// The dma-buf of the BO at render-memfd `offset` of GPU `gpu`, if one
    /// was handed out.
    pub fn get(&self, gpu: usize, offset: u64) -> Option<Arc<Dmabuf>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.by_bo.get(&(gpu, offset)).cloned()
    }

    /// RESUME of the BO's process (see the module comment).
    pub fn fill_back(&self, gpu: usize, offset: u64) {
        if let Some(d) = self.get(gpu, offset) {
            d.fill_back();
        }
    }

    /// The BO is freed: its dmabuf is no longer one of ours (fds of it
    /// that are still open reach a memfd no BO uses).
    pub fn forget(&self, gpu: usize, offset: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = inner.by_bo.remove(&(gpu, offset)) {
            inner.by_id.remove(&d.id);
            if let Some(id) = d.window.get().and_then(|w| file_id(w.as_fd()).ok()) {
                inner.by_id.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A VRAM BO of GPU 0 at `offset`.
    pub fn src(offset: u64) -> Source {
        Source {
            gpu: 0,
            offset,
            domain: 4,
        }
    }

    fn map_fd(fd: BorrowedFd<'_>, prot: i32) -> *mut u8 {
        // SAFETY: a fresh shared mapping of a live descriptor; used only
        // through raw pointers in this test.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        }
        .cast()
    }

    #[test]
    fn an_export_without_rdwr_makes_a_read_only_file_later_exports_keep() {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let bo = Arc::new(mem.map(0, 8192).unwrap());
        let r = Registry::default();
        let a = r
            .export_as(src(0), 8192, &bo, Purpose::Share, false)
            .unwrap();
        let b = r.export(src(0), 8192, &bo, Purpose::Share).unwrap();
        assert_eq!(a.id, b.id, "one dmabuf per BO");
        for d in [&a, &b] {
            // SAFETY: F_GETFL on a descriptor we hold.
            let fl = unsafe { libc::fcntl(d.file().as_raw_fd(), libc::F_GETFL) };
            assert_eq!(fl & libc::O_ACCMODE, libc::O_RDONLY);
        }
        assert_eq!(
            map_fd(a.file(), libc::PROT_READ | libc::PROT_WRITE),
            libc::MAP_FAILED.cast()
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EACCES)
        );
        let p = map_fd(a.file(), libc::PROT_READ);
        assert_ne!(p, libc::MAP_FAILED.cast());
        // SAFETY: unmapping our mapping.
        unsafe { libc::munmap(p.cast(), 8192) };
    }

    #[test]
    fn one_memfd_per_bo_whose_mapping_follows_checkpoint_and_restore() {
        let mem = Memfd::new("t", 1 << 20).unwrap();
        let bo = Arc::new(mem.map(0, 8192).unwrap());
        bo.write(0, &[0xab; 8192]);
        let r = Registry::default();
        let a = r.export(src(0), 8192, &bo, Purpose::Checkpoint).unwrap();
        let b = r.export(src(0), 8192, &bo, Purpose::Checkpoint).unwrap();
        assert_eq!(a.id, b.id, "one dmabuf per BO");
        let dup = a.file().try_clone_to_owned().unwrap();
        assert_eq!(r.lookup(dup.as_fd()).unwrap().size, 8192);
        assert!(r.lookup(mem.fd()).is_none(), "another file is not a dmabuf");
        // SAFETY: lseek on a descriptor we own.
        let end = unsafe { libc::lseek(dup.as_raw_fd(), 0, libc::SEEK_END) };
        assert_eq!(end, 8192, "lseek gives the BO size, as libdrm reads it");
        // A checkpoint's dmabuf reads the BO; it cannot be mapped writable.
        let p = map_fd(dup.as_fd(), libc::PROT_READ);
        assert_ne!(p, libc::MAP_FAILED.cast());
        let last = p.wrapping_add(8191);
        // SAFETY: inside the 8 KiB mapping.
        assert_eq!(unsafe { last.read_volatile() }, 0xab);
        assert_eq!(
            map_fd(dup.as_fd(), libc::PROT_READ | libc::PROT_WRITE),
            libc::MAP_FAILED.cast()
        );
        // Still a dma-buf after UNPAUSE (its BO lives): an import reaches
        // the BO.
        let d = r
            .lookup(dup.as_fd())
            .expect("still a dma-buf after UNPAUSE");
        bo.write(0, &[0xcd; 4096]);
        let mut got = [0u8; 1];
        d.map.read(0, &mut got);
        assert_eq!(got[0], 0xcd, "an import reaches the BO's own memory");
        // SAFETY: unmapping our mapping.
        unsafe { libc::munmap(p.cast(), 8192) };

        // A restore's dmabuf: what is written through it reaches the BO at
        // RESUME, and only that (the GPU wrote the first page meanwhile).
        let bo2 = Arc::new(mem.map(8192, 8192).unwrap());
        let c = r.export(src(8192), 8192, &bo2, Purpose::Restore).unwrap();
        let q = map_fd(c.file(), libc::PROT_READ | libc::PROT_WRITE);
        assert_ne!(q, libc::MAP_FAILED.cast());
        let second = q.wrapping_add(4096);
        // SAFETY: the second page of the 8 KiB mapping.
        unsafe { second.write_bytes(0x5a, 4096) };
        bo2.write(0, &[0x11; 4096]);
        let mut got = [0u8; 8192];
        bo2.read(0, &mut got);
        assert_eq!((got[0], got[4096]), (0x11, 0), "not before RESUME");
        r.fill_back(0, 8192);
        bo2.read(0, &mut got);
        assert_eq!(
            (got[0], got[4095], got[4096], got[8191]),
            (0x11, 0x11, 0x5a, 0x5a)
        );
        // SAFETY: unmapping our mapping.
        unsafe { libc::munmap(q.cast(), 8192) };
        assert!(r.lookup(c.file()).is_some());
        r.forget(0, 8192);
        assert!(r.lookup(c.file()).is_none());
    }
}
