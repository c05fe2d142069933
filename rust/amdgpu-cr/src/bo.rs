//! KFD buffer-object flags and the per-BO facts the rest of the core needs.
//!
//! The flag values are the `KFD_IOC_ALLOC_MEM_FLAGS_*` bits of the KFD uapi,
//! taken from kfd-abi's bindings under the short names the core uses;
//! CHECKPOINT hands back their low 32 bits in `alloc_flags`.

use std::os::fd::BorrowedFd;

use kfd_abi::sys;
use xxhash_rust::xxh3::xxh3_64;

use crate::ids::{GpuId, GpuVa, MmapOffset};

/// VRAM BO (contents saved in the pages file).
pub const ALLOC_VRAM: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
/// GTT (system memory, GPU mapped) BO (contents saved in the pages file).
pub const ALLOC_GTT: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_GTT;
/// Userptr BO: its pages are ordinary process memory that CRIU dumps.
pub const ALLOC_USERPTR: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
/// Doorbell slice; no contents, only its mapping is remapped.
pub const ALLOC_DOORBELL: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL;
/// MMIO remap page; no contents, only its mapping is remapped.
pub const ALLOC_MMIO_REMAP: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP;
/// VRAM the CPU may touch (KFD allocates it CPU_ACCESS_REQUIRED, so amdgpu
/// keeps it where the BAR reaches; without it the BO can be mapped, but on
/// a small-BAR board its pages past the visible window fault when touched).
pub const ALLOC_PUBLIC: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC;
/// The CPU may write the BO.
pub const ALLOC_WRITABLE: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;

/// `dmabuf_fd` value meaning "no dmabuf was exported for this bucket".
pub use kfd_abi::layout::KFD_INVALID_FD;

/// Page size assumed by the image format and by KFD (BO sizes are multiples).
pub const PAGE_SIZE: u64 = 4096;

/// Whether the pages file holds this BO's bytes (VRAM and GTT BOs only).
pub fn has_contents(alloc_flags: u32) -> bool {
    alloc_flags & (ALLOC_VRAM | ALLOC_GTT) != 0
}

/// Σ sizes of the BOs with contents among `(bucket index, alloc_flags,
/// size)`: the byte count of a pages file.  `Err(i)`: the size of bucket
/// `i` makes the sum overflow.
pub fn contents_total(bos: impl IntoIterator<Item = (usize, u32, u64)>) -> Result<u64, usize> {
    let mut total: u64 = 0;
    for (i, flags, size) in bos {
        if has_contents(flags) {
            total = total.checked_add(size).ok_or(i)?;
        }
    }
    Ok(total)
}

/// The KFD flags under which a render-node GEM BO's bytes are copied and
/// checked like a KFD BO's: VRAM for a BO that prefers VRAM, GTT for the
/// rest (GTT or CPU domain: system memory either way), PUBLIC for VRAM the
/// CPU may map (`AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED`).
pub fn gem_alloc_flags(preferred_domains: u32, create_flags: u64) -> u32 {
    if preferred_domains & sys::AMDGPU_GEM_DOMAIN_VRAM != 0 {
        let public = create_flags & u64::from(sys::AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED) != 0;
        ALLOC_VRAM | ALLOC_WRITABLE | if public { ALLOC_PUBLIC } else { 0 }
    } else {
        ALLOC_GTT | ALLOC_WRITABLE
    }
}

/// Whether a CPU mapping of this BO must be pointed at a new mmap offset after
/// restore: every BO whose mapping lives on a device node.
pub fn needs_vma_fixup(alloc_flags: u32) -> bool {
    alloc_flags & (ALLOC_VRAM | ALLOC_GTT | ALLOC_DOORBELL | ALLOC_MMIO_REMAP) != 0
}

/// Whether the CPU can map the BO (GTT, or VRAM allocated PUBLIC).
pub fn host_visible(alloc_flags: u32) -> bool {
    alloc_flags & ALLOC_GTT != 0
        || alloc_flags & (ALLOC_VRAM | ALLOC_PUBLIC) == (ALLOC_VRAM | ALLOC_PUBLIC)
}

/// One BO to copy, and the handles through which it can be reached.
#[derive(Clone, Copy, Debug)]
pub struct BoRef<'a> {
    /// Bucket index (names the BO in errors and keys the hashes).
    pub index: usize,
    /// User gpu_id.
    pub gpu: GpuId,
    pub addr: GpuVa,
    pub size: u64,
    pub alloc_flags: u32,
    /// An fd and offset through which the CPU can map the whole BO: the
    /// render-node file that owns it (the one given to ACQUIRE_VM or
    /// RESTORE: `drm_gem_mmap` refuses any other file with EACCES) at its
    /// mmap offset, or else its dmabuf at offset 0.
    pub cpu_map: Option<(BorrowedFd<'a>, MmapOffset)>,
    /// The dmabuf fd KFD exported for the BO (CHECKPOINT/RESTORE output).
    pub dmabuf: Option<BorrowedFd<'a>>,
}

/// The BO hash from its extents' digests, in order.
pub fn compose(digests: &[u64]) -> u64 {
    match digests {
        [one] => *one,
        _ => {
            let bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
            xxh3_64(&bytes)
        }
    }
}

/// Whether bit `k` of a `parent_extents` bitmap is set.
pub fn bit(map: &[u8], k: u64) -> bool {
    usize::try_from(k / 8)
        .ok()
        .and_then(|i| map.get(i))
        .is_some_and(|b| b & (1 << (k % 8)) != 0)
}

/// The bitmap of a sorted list of extent indices.
pub fn bitmap(extents: &[u64]) -> Vec<u8> {
    let len = extents.last().map_or(0, |&k| k / 8 + 1) as usize;
    let mut map = vec![0u8; len];
    for &k in extents {
        map[(k / 8) as usize] |= 1 << (k % 8);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_are_the_uapi_bits() {
        let bits = [
            ALLOC_VRAM,
            ALLOC_GTT,
            ALLOC_USERPTR,
            ALLOC_DOORBELL,
            ALLOC_MMIO_REMAP,
            ALLOC_PUBLIC,
            ALLOC_WRITABLE,
        ];
        assert_eq!(bits, [1, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 29, 1 << 31]);
        assert_eq!(KFD_INVALID_FD, u32::MAX);
    }

    #[test]
    fn content_and_fixup_classes() {
        assert!(has_contents(ALLOC_VRAM | ALLOC_WRITABLE));
        assert!(has_contents(ALLOC_GTT));
        assert!(!has_contents(ALLOC_USERPTR));
        assert!(!has_contents(ALLOC_DOORBELL));
        assert!(needs_vma_fixup(ALLOC_MMIO_REMAP));
        assert!(needs_vma_fixup(ALLOC_DOORBELL));
        assert!(!needs_vma_fixup(ALLOC_USERPTR));
        assert!(host_visible(ALLOC_GTT));
        assert!(host_visible(ALLOC_VRAM | ALLOC_PUBLIC));
        assert!(!host_visible(ALLOC_VRAM));
    }
}
