//! Content hashes of BOs, in extents so that parts of one BO can be copied
//! (and hashed) by different threads.
//!
//! A BO's bytes are cut into consecutive extents of `extent` bytes (the
//! last may be shorter), each hashed with XXH3-64; the BO's hash is the
//! XXH3-64 of those digests as little-endian u64s, or the one digest itself
//! when the BO fits in a single extent.  So a BO of at most one extent has
//! the plain XXH3-64 of its bytes, as in images written before extents (no
//! `content_hash_extent` field), whose larger BOs are hashed whole: their
//! extent is "unbounded" and they are copied by one thread.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::Xxh3;

use crate::image::KfdImage;
use crate::proto::{DrmBoEntry, KfdBoEntry};

/// The unit in which a large BO is shared out among copy threads (a
/// multiple of the extent it is hashed in), and the extent of images that
/// hash in extents without saying which.
pub const HASH_EXTENT: u64 = 32 << 20;

/// Extent size criu-rocm's dump hashes with, and so the unit an
/// incremental dump compares with its parent and writes or leaves out.
/// 2 MiB: the GPU's large page (amdgpu maps VRAM in 2 MiB fragments, and
/// what a kernel writes dirties whole fragments), small enough that a
/// change costs at most 2 MiB of write, large enough that the digests
/// cost 4 KiB per GiB of VRAM in the KFD image; small enough too that a
/// copy window (or SDMA staging buffer) holds whole extents, which an
/// incremental dump hashes in place.
pub const CONTENT_EXTENT: u64 = 2 << 20;

/// The hash an image records for a BO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentHash {
    pub value: u64,
    /// Extent size; `None`: the whole BO is one extent.
    pub extent: Option<u64>,
}

// Defined with the BO facts, so that the image codec can check it.
pub use crate::bo::compose;

/// Hashes a stream that starts at an extent boundary of a BO, one digest
/// per extent (or part of one at the end).
pub struct ExtentHasher {
    extent: u64,
    /// Bytes fed into `cur`.
    filled: u64,
    cur: Xxh3,
    digests: Vec<u64>,
}

impl ExtentHasher {
    /// `extent`: `None` for one extent however long the stream.
    pub fn new(extent: Option<u64>) -> Self {
        ExtentHasher {
            extent: extent.filter(|&e| e > 0).unwrap_or(u64::MAX),
            filled: 0,
            cur: Xxh3::new(),
            digests: Vec::new(),
        }
    }

    pub fn update(&mut self, mut buf: &[u8]) {
        while !buf.is_empty() {
            let room = self.extent - self.filled;
            let n = usize::try_from(room).map_or(buf.len(), |r| r.min(buf.len()));
            self.cur.update(&buf[..n]);
            self.filled += n as u64;
            buf = &buf[n..];
            if self.filled == self.extent {
                self.digests.push(self.cur.digest());
                self.cur.reset();
                self.filled = 0;
            }
        }
    }

    /// The digests of the extents seen (a last partial one included).  An
    /// empty stream has the digest of no bytes.
    pub fn digests(mut self) -> Vec<u64> {
        if self.filled > 0 || self.digests.is_empty() {
            self.digests.push(self.cur.digest());
        }
        self.digests
    }

    /// The hash of a whole BO streamed through this hasher.
    pub fn finish(self) -> u64 {
        compose(&self.digests())
    }
}

/// The optional per-BO content hashes of a KFD image (bucket index →
/// hash), for `copy::restore_contents` and `gpu-check`.  Empty for images
/// written by upstream.
pub fn content_hashes(image: &KfdImage) -> BTreeMap<usize, ContentHash> {
    image
        .msg
        .bo_entries
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let value = b.content_xxh3?;
            let extent = b.content_hash_extent;
            Some((i, ContentHash { value, extent }))
        })
        .collect()
}

/// A BO entry of an image that records the hash of its contents: KFD's
/// and a render node's.
pub trait HashedBo {
    /// The BO's size in bytes.
    fn size(&self) -> u64;
    /// Sets `content_xxh3` and `content_hash_extent`.
    fn set_hash(&mut self, value: u64, extent: Option<u64>);
}

macro_rules! hashed_bo {
    ($($entry:ty),*) => {$(
        impl HashedBo for $entry {
            fn size(&self) -> u64 {
                self.size
            }
            fn set_hash(&mut self, value: u64, extent: Option<u64>) {
                self.content_xxh3 = Some(value);
                self.content_hash_extent = extent;
            }
        }
    )*};
}
hashed_bo!(KfdBoEntry, DrmBoEntry);

/// Records the hashes a dump's workers computed (bucket index → hash) in
/// an image's BO entries, as [`content_hashes`] reads them back.  The
/// extent is said only where it matters: a BO of one extent has the plain
/// hash of its bytes.
pub fn record_hashes<B: HashedBo>(entries: &mut [B], hashes: &BTreeMap<usize, ContentHash>) {
    for (&i, h) in hashes {
        if let Some(b) = entries.get_mut(i) {
            let extent = h.extent.filter(|&x| b.size() > x);
            b.set_hash(h.value, extent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn one_extent_is_the_plain_hash() {
        let d = data(10_000);
        for extent in [None, Some(10_000), Some(1 << 20)] {
            let mut h = ExtentHasher::new(extent);
            h.update(&d[..3]);
            h.update(&d[3..]);
            assert_eq!(h.finish(), xxh3_64(&d), "{extent:?}");
        }
        assert_eq!(ExtentHasher::new(Some(4096)).finish(), xxh3_64(&[]));
    }

    /// Parts hashed separately (cut at extent boundaries) give the same
    /// BO hash as the whole stream, whatever the write sizes.
    #[test]
    fn parts_compose_to_the_whole() {
        let d = data(5 * 4096 + 100);
        let mut whole = ExtentHasher::new(Some(4096));
        for c in d.chunks(1000) {
            whole.update(c);
        }
        let whole = whole.finish();
        let mut digests = Vec::new();
        for part in [&d[..2 * 4096], &d[2 * 4096..3 * 4096], &d[3 * 4096..]] {
            let mut h = ExtentHasher::new(Some(4096));
            h.update(part);
            digests.extend(h.digests());
        }
        assert_eq!(digests.len(), 6);
        assert_eq!(compose(&digests), whole);
        let by_hand: Vec<u64> = d.chunks(4096).map(xxh3_64).collect();
        assert_eq!(digests, by_hand);
        assert_ne!(
            whole,
            xxh3_64(&d),
            "a BO of several extents is not hashed whole"
        );
        // Any changed byte changes it.
        let mut bad = d.clone();
        bad[4096 * 4 + 5] ^= 0x80;
        let mut h = ExtentHasher::new(Some(4096));
        h.update(&bad);
        assert_ne!(h.finish(), whole);
    }
}
