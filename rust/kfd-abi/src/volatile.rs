//! Memory that something outside this program may read or write at any time: a GPU (BOs
//! mapped through a render node or `/dev/kfd`, userptr memory a queue copies into) or another
//! process (a shared mapping).  Such memory is never handed out as `&[u8]` or `&mut [u8]`,
//! whose contents the compiler may assume stay put while the reference lives; bytes move in
//! and out by copies from raw pointers, words by volatile loads and stores (vm-memory's
//! `VolatileSlice` discipline).

use std::marker::PhantomData;
use std::ptr::NonNull;

/// `len` bytes at `ptr` that a device or another process may change at any time, valid for
/// `'a`.  Hands out no reference to them.
#[derive(Clone, Copy, Debug)]
pub struct VolatileSlice<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'a std::cell::UnsafeCell<[u8]>>,
}

// SAFETY: a VolatileSlice is a pointer and a length; every access through it is a copy or a
// volatile access, which is as sound from another thread as from this one.
unsafe impl Send for VolatileSlice<'_> {}
// SAFETY: as above.
unsafe impl Sync for VolatileSlice<'_> {}

impl<'a> VolatileSlice<'a> {
    /// The `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr + len` is mapped readable and writable memory (or, if it is only ever read
    /// through this slice, readable) for all of `'a`, and no Rust reference to any of it is
    /// alive during `'a`.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Self {
            ptr,
            len,
            _memory: PhantomData,
        }
    }

    /// Bytes in the slice.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the slice has no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the slice (to hand to the kernel, which copies itself).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The `len` bytes at `offset`, or `None` past the end.
    pub fn subslice(&self, offset: usize, len: usize) -> Option<VolatileSlice<'a>> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above): a pointer into the memory `self` covers.
        let start = unsafe { self.ptr.add(offset) };
        // SAFETY: `len` bytes at `start` are part of the memory `self` covers, for `'a`.
        Some(unsafe { Self::new(start, len) })
    }

    /// Copies the first `dst.len()` bytes (or all of them, if fewer) into `dst`; returns how
    /// many.  Bytes a device writes meanwhile may be copied old or new, each on its own.
    pub fn copy_to(&self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len);
        // SAFETY: `n` bytes are readable at `ptr` (see `new`) and writable in `dst`, a Rust
        // buffer the device memory cannot overlap; no reference to the device memory is made.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), dst.as_mut_ptr(), n) };
        n
    }

    /// Copies `src` (or its first `self.len()` bytes) to the start of the slice; returns how
    /// many bytes.
    pub fn copy_from(&self, src: &[u8]) -> usize {
        let n = src.len().min(self.len);
        // SAFETY: `n` bytes are writable at `ptr` (see `new`) and readable in `src`, which
        // cannot overlap the device memory; no reference to the device memory is made.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), n) };
        n
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: `len` writable bytes at `ptr` (see `new`).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }

    /// The little-endian `u32` at `offset` (4-byte aligned), read once, volatile.
    ///
    /// # Panics
    /// When `offset` is out of bounds or not aligned.
    pub fn read_u32(&self, offset: usize) -> u32 {
        let p = self.word::<u32>(offset);
        // SAFETY: `word` checked that 4 aligned bytes at `p` lie in the slice.
        u32::from_le(unsafe { p.read_volatile() })
    }

    /// Writes `value` little endian at `offset` (4-byte aligned), once, volatile.
    ///
    /// # Panics
    /// When `offset` is out of bounds or not aligned.
    pub fn write_u32(&self, offset: usize, value: u32) {
        let p = self.word::<u32>(offset);
        // SAFETY: `word` checked that 4 aligned bytes at `p` lie in the slice.
        unsafe { p.write_volatile(value.to_le()) };
    }

    /// The little-endian `u64` at `offset` (8-byte aligned), read once, volatile (one
    /// access, as a device updating a pointer expects).
    ///
    /// # Panics
    /// When `offset` is out of bounds or not aligned.
    pub fn read_u64(&self, offset: usize) -> u64 {
        let p = self.word::<u64>(offset);
        // SAFETY: `word` checked that 8 aligned bytes at `p` lie in the slice.
        u64::from_le(unsafe { p.read_volatile() })
    }

    /// Writes `value` little endian at `offset` (8-byte aligned), once, volatile.
    ///
    /// # Panics
    /// When `offset` is out of bounds or not aligned.
    pub fn write_u64(&self, offset: usize, value: u64) {
        let p = self.word::<u64>(offset);
        // SAFETY: `word` checked that 8 aligned bytes at `p` lie in the slice.
        unsafe { p.write_volatile(value.to_le()) };
    }

    fn word<T>(&self, offset: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            offset.checked_add(size).is_some_and(|end| end <= self.len),
            "offset {offset:#x} past a {}-byte slice",
            self.len
        );
        // SAFETY: in bounds (asserted above).
        let p = unsafe { self.ptr.as_ptr().add(offset) }.cast::<T>();
        assert!(
            p.is_aligned(),
            "offset {offset:#x} is not {size}-byte aligned"
        );
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_words_and_bounds() {
        let mut backing = vec![0u8; 64];
        let ptr = NonNull::new(backing.as_mut_ptr()).unwrap();
        // SAFETY: `backing` outlives `v` and is not touched through a reference meanwhile.
        let v = unsafe { VolatileSlice::new(ptr, 64) };
        assert_eq!(v.copy_from(&[1, 2, 3, 4, 5]), 5);
        v.write_u32(8, 0xdead_beef);
        assert_eq!(v.read_u32(8), 0xdead_beef);
        assert_eq!(v.read_u32(0), u32::from_le_bytes([1, 2, 3, 4]));
        let mut out = [0u8; 128];
        assert_eq!(v.copy_to(&mut out), 64, "at most the slice");
        assert_eq!(&out[8..12], &0xdead_beefu32.to_le_bytes());
        let tail = v.subslice(60, 4).unwrap();
        tail.fill(0xab);
        assert_eq!(v.read_u32(60), 0xabab_abab);
        assert!(v.subslice(60, 5).is_none() && v.subslice(usize::MAX, 2).is_none());
        let read = |o| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.read_u32(o)));
        assert!(read(62).is_err(), "past the end");
        assert!(read(2).is_err(), "unaligned");
        drop(backing);
    }

    #[test]
    fn u64_words_are_aligned_and_bounded() {
        let mut backing = [0u64; 4];
        let ptr = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` outlives `v` and is not touched through a reference meanwhile.
        let v = unsafe { VolatileSlice::new(ptr, 32) };
        v.write_u64(8, 0x0123_4567_89ab_cdef);
        assert_eq!(v.read_u64(8), 0x0123_4567_89ab_cdef);
        assert_eq!(v.read_u32(8), 0x89ab_cdef, "little endian");
        let read = |o| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.read_u64(o)));
        assert!(read(28).is_err(), "past the end");
        assert!(read(4).is_err(), "unaligned");
        assert_eq!(backing[1], 0x0123_4567_89ab_cdef_u64.to_le());
    }
}
