//! An object in shared memory: a `MAP_SHARED` mapping of a memfd sized for
//! one `T`, zero-filled by the kernel.  Children forked after it is mapped
//! share it; a helper started with [`super::process::spawn_self`] maps the
//! same memfd from the fd it is handed ([`Shared::from_fd`]).

use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use super::fd::memfd;

/// A type that may live in memory other processes map and change.
///
/// # Safety
/// The all-zero bit pattern is a valid `Self`, `Self` has no padding whose
/// contents matter, and every field is only read or written through atomics
/// (or other interior mutability that stays sound when another process
/// changes the bytes at any time).  No pointers: they mean nothing in
/// another process.
pub unsafe trait SharedState: Sync + Sized {}

/// One `T` in a shared mapping of a memfd; unmapped on drop, or kept for
/// the life of the process with [`Shared::leak`].
pub struct Shared<T: SharedState> {
    ptr: NonNull<T>,
    fd: OwnedFd,
}

impl<T: SharedState> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("at", &self.ptr)
            .field("fd", &self.fd)
            .finish()
    }
}

// SAFETY: the mapping is owned by the value and `T` is Sync (SharedState),
// so moving the owner to another thread is sound.
unsafe impl<T: SharedState> Send for Shared<T> {}
// SAFETY: `&Shared<T>` only gives out `&T`, and `T: Sync`.
unsafe impl<T: SharedState> Sync for Shared<T> {}

impl<T: SharedState> Shared<T> {
    /// A new zeroed `T` on a new memfd named `name` (close-on-exec).
    pub fn create(name: &std::ffi::CStr) -> io::Result<Self> {
        let f = memfd(name)?;
        f.set_len(std::mem::size_of::<T>() as u64)?;
        Self::map(f.into())
    }

    /// Maps the `T` behind `fd` (a memfd of [`Shared::create`] handed over
    /// by another process); `EINVAL` unless its size is that of a `T`.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let len = std::fs::File::from(fd.try_clone()?).metadata()?.len();
        if len != std::mem::size_of::<T>() as u64 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Self::map(fd)
    }

    fn map(fd: OwnedFd) -> io::Result<Self> {
        // SAFETY: a new shared mapping of a file we hold, at an address the
        // kernel picks; nothing else is mapped over.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<T>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<T>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Shared { ptr, fd })
    }

    /// The memfd, to hand to a helper process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Keeps the mapping for the rest of the process (and in its forks);
    /// the memfd is closed.
    pub fn leak(self) -> &'static T {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped, so its fd is read out exactly once
        // and closed here, as Drop would.
        drop(unsafe { std::ptr::read(&me.fd) });
        // SAFETY: the mapping is never unmapped from now on, and holds a
        // valid T (SharedState: zeroed bytes are one, and it only changes
        // through atomics).
        unsafe { me.ptr.as_ref() }
    }
}

impl<T: SharedState> Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping lives as long as `self` and holds a valid T
        // (see SharedState).
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: SharedState> Drop for Shared<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping this value owns; no reference into it
        // outlives `self` (Deref borrows self).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), std::mem::size_of::<T>()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Cells([AtomicU64; 3]);
    // SAFETY: atomics only, valid when zeroed.
    unsafe impl SharedState for Cells {}

    #[test]
    fn two_mappings_of_one_memfd_see_each_other() {
        let a = Shared::<Cells>::create(c"test-shared").unwrap();
        assert!(a.0.iter().all(|c| c.load(Ordering::Relaxed) == 0), "zeroed");
        let b = Shared::<Cells>::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap();
        a.0[2].store(42, Ordering::Release);
        assert_eq!(b.0[2].load(Ordering::Acquire), 42);
        let leaked: &'static Cells = b.leak();
        leaked.0[0].store(7, Ordering::Release);
        assert_eq!(a.0[0].load(Ordering::Acquire), 7);
        #[allow(dead_code)]
        struct Big([AtomicU64; 4]);
        // SAFETY: atomics only, valid when zeroed.
        unsafe impl SharedState for Big {}
        let e = Shared::<Big>::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "size differs");
    }
}
