//! The GPU pages file: `amdgpu-pages-<id>-<gpu_id %04x>.img`, one per GPU.
//!
//! Format (upstream's, see Documentation/image-format.md): a `u64 LE`
//! total, then the full bytes of every VRAM/GTT BO of that GPU whose
//! contents are saved ([`crate::bo::has_contents`]), in bucket order,
//! `total` = Σ sizes ([`pages_total`]).  File blocks ([`SPARSE_BLOCK`])
//! whose bytes are all zero are holes: they cost no disk blocks and read as
//! zeros, to upstream's plugin as to us.
//!
//! This module owns everything about that file, below the copy engines and
//! beside the protobuf messages of [`crate::image`] (which it uses for the
//! file ids and errors; `image` does not use it):
//! * [`PagesWriter`]: writes the file, or one lane's byte range of it
//!   ([`PagesWriter::create_lanes`]), leaving zero blocks as holes;
//! * [`PagesReader`] over a [`SparseFile`]: reads it back (or a lane's
//!   range: [`PagesReader::open_lanes`]), checking the header against the
//!   BO sizes, giving holes as zeros without reading them;
//! * [`hash`]: the per-BO content hashes (XXH3-64 in extents of
//!   [`HASH_EXTENT`]) the KFD image records of the bytes this file holds,
//!   [`content_hashes`] to get them from an image, [`ExtentHasher`] to
//!   compute them on a stream.
//!
//! A byte range of the file is addressed by the BO's place in bucket
//! order: BO `i` of a GPU starts at `8 + Σ sizes of the GPU's content BOs
//! before it`.

pub mod hash;
mod out;
mod reader;
mod writer;
pub mod zstd;

#[cfg(test)]
mod tests;

use crate::bo;
use crate::ids::GpuId;
use crate::image::{FileId, ImageError};
use crate::proto::KfdBoEntry;

pub use hash::{
    compose, content_hashes, record_hashes, ContentHash, ExtentHasher, CONTENT_EXTENT, HASH_EXTENT,
};
pub use reader::{Overlay, PagesReader, Source, SparseFile};
pub use writer::PagesWriter;
pub use zstd::{Compress, Encoding, FrameError};

/// Name of the pages file of file `id` for the GPU with *user* id `gpu`.
pub fn pages_image_name(id: FileId, gpu: GpuId) -> String {
    format!("amdgpu-pages-{id}-{:04x}.img", gpu.0)
}

/// Σ sizes of the BOs of `gpu` whose contents the pages file holds.
pub fn pages_total(file: &str, bos: &[KfdBoEntry], gpu: GpuId) -> Result<u64, ImageError> {
    let bos = bos.iter().enumerate().filter(|(_, b)| b.gpu_id == gpu.0);
    bo::contents_total(bos.map(|(i, b)| (i, b.alloc_flags, b.size)))
        .map_err(|i| ImageError::sizes_overflow(file, i, gpu))
}

/// File blocks the pages writer leaves as holes when all their bytes are
/// zero: the page size, which is the block size of the usual file systems
/// (ext4, XFS, tmpfs); a larger block is still a hole when all of its
/// pages are.
pub const SPARSE_BLOCK: u64 = 4096;

/// A pages writer's buffer unless the memory budget gives it less.
/// Whether every byte of `b` is zero.
pub fn all_zero(b: &[u8]) -> bool {
    // 64-byte chunks ORed together vectorize; stop at the first non-zero
    // chunk (GPU data rarely starts with a long run of zeros unless all is).
    let mut chunks = b.chunks_exact(64);
    for c in &mut chunks {
        if c.iter().fold(0u8, |a, &x| a | x) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&x| x == 0)
}

/// The content BOs of `gpu` in a KFD image's buckets, in file order:
/// (bucket index, size).
pub fn content_bos(bos: &[KfdBoEntry], gpu: GpuId) -> Vec<(usize, u64)> {
    bos.iter()
        .enumerate()
        .filter(|(_, b)| b.gpu_id == gpu.0 && bo::has_contents(b.alloc_flags))
        .map(|(i, b)| (i, b.size))
        .collect()
}
