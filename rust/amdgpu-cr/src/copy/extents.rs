//! Extents: the pieces of BOs that lanes copy (whole BOs or runs of hash
//! extents), the sinks and sources that hash them on the way, and an
//! incremental dump's sink that leaves extents unchanged since the parent
//! as holes; a dump's outcome composed from its extents' digests.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use super::{BoRef, ContentHash, DumpOutcome, GpuStats, HASH_EXTENT};
use crate::ids::{GpuVa, MmapOffset};
use crate::pages::{compose, Encoding, ExtentHasher, PagesWriter, CONTENT_EXTENT};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// An incremental dump's sink for one piece (which starts at an extent
/// boundary of its BO): hashes each extent and writes it, or leaves it as
/// a hole ([`PagesWriter::hole`]) when the parent's extent has the same
/// digest.
///
/// An extent handed whole (as [`CopyEngine::read_bo_aligned`] hands them)
/// is hashed in place, in the engine's mapping or staging buffer, and
/// copied only if it changed.  One handed in parts (a window or staging
/// buffer smaller than an extent, under a memory budget that small) is
/// written as it comes and hashed on the way, as a full dump does: keeping
/// it back until its digest is known would take an extent of memory the
/// budget does not have, so it is never left to the parent.
///
/// [`CopyEngine::read_bo_aligned`]: super::CopyEngine::read_bo_aligned
pub(super) struct IncrementalWriter<'w, 'p> {
    pub(super) out: &'w mut PagesWriter,
    pub(super) extent: u64,
    /// Bytes of the piece not yet given.
    pub(super) left: u64,
    /// The extent being given in parts: its hash so far and its bytes not
    /// yet given.
    pub(super) part: Option<(Xxh3, u64)>,
    /// Index in the BO of the next extent (or of the one being given).
    pub(super) next: u64,
    pub(super) parent: &'p [u64],
    pub(super) digests: Vec<u64>,
    /// Extents left to the parent.
    pub(super) kept: Vec<u64>,
    /// Bytes written to the pages file.
    pub(super) written: u64,
    /// Extents given in parts.
    pub(super) parted: u64,
}

impl<'w, 'p> IncrementalWriter<'w, 'p> {
    pub(super) fn new(out: &'w mut PagesWriter, p: &Piece<'_>, parent: &'p [u64]) -> Self {
        // Pieces start at a multiple of the extent (see Piece::of).
        let extent = p.extent.unwrap_or(p.bo.size).max(1);
        IncrementalWriter {
            out,
            extent,
            left: p.bo.size,
            part: None,
            next: p.start / extent,
            parent,
            digests: Vec::new(),
            kept: Vec::new(),
            written: 0,
            parted: 0,
        }
    }

    fn end_extent(&mut self, digest: u64) {
        self.digests.push(digest);
        self.next += 1;
    }
}

impl Write for IncrementalWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "more bytes than the piece holds",
            ));
        }
        let len = self.extent.min(self.left);
        let whole = usize::try_from(len).ok().filter(|&n| n <= buf.len());
        let n = match (self.part.as_mut(), whole) {
            (None, Some(n)) => {
                let bytes = &buf[..n];
                let d = xxh3_64(bytes);
                if self.parent.get(self.next as usize) == Some(&d) {
                    self.out.hole(len)?;
                    self.kept.push(self.next);
                } else {
                    self.out.write_all(bytes)?;
                    self.written += len;
                }
                self.end_extent(d);
                n
            }
            (part, _) => {
                let (h, due) = match part {
                    Some(p) => p,
                    None => {
                        self.parted += 1;
                        self.part.insert((Xxh3::new(), len))
                    }
                };
                let room = usize::try_from(*due).unwrap_or(usize::MAX);
                let bytes = &buf[..room.min(buf.len())];
                self.out.write_all(bytes)?;
                h.update(bytes);
                *due -= bytes.len() as u64;
                self.written += bytes.len() as u64;
                if *due == 0 {
                    let d = h.digest();
                    self.part = None;
                    self.end_extent(d);
                }
                bytes.len()
            }
        };
        self.left -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

pub(super) struct HashingWriter<'w> {
    pub(super) inner: &'w mut dyn Write,
    pub(super) hasher: ExtentHasher,
}

impl Write for HashingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

pub(super) struct HashingReader<'r> {
    pub(super) inner: &'r mut dyn Read,
    pub(super) hasher: ExtentHasher,
}

impl Read for HashingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A dump's outcome from its lanes' statistics, each BO's extent digests
/// (of [`CONTENT_EXTENT`]), the extents left to the parent and the bytes
/// written.
pub(super) fn outcome(
    stats: Vec<GpuStats>,
    digests: ExtentDigests,
    mut inherited: BTreeMap<usize, Vec<u64>>,
    written: u64,
    encoding: Encoding,
) -> DumpOutcome {
    for v in inherited.values_mut() {
        v.sort_unstable();
    }
    let extent = Some(CONTENT_EXTENT);
    DumpOutcome {
        encoding,
        stats,
        hashes: digests
            .iter()
            .map(|(&i, d)| {
                let value = compose(d);
                (i, ContentHash { value, extent })
            })
            .collect(),
        extents: digests,
        inherited,
        written,
    }
}

/// A part of a BO that one lane copies: the whole BO, or a run of its hash
/// extents.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece<'a> {
    /// The part, as a BO of its own (address, size and mapping offset
    /// moved to the part; no dmabuf, which would cover the whole BO).
    pub(super) bo: BoRef<'a>,
    /// Where the part starts in the BO: 0 or a multiple of `extent`.
    pub(super) start: u64,
    /// Extent of the BO's content hash (`None`: the BO is one extent).
    pub(super) extent: Option<u64>,
}

impl<'a> Piece<'a> {
    pub(super) fn whole(bo: BoRef<'a>, extent: Option<u64>) -> Self {
        Piece {
            bo,
            start: 0,
            extent,
        }
    }

    /// `bo` cut into runs of its hash extents of about [`HASH_EXTENT`]
    /// bytes when `split` and it has more than one run (and its addresses
    /// do not overflow), else whole.
    pub(super) fn of(bo: BoRef<'a>, extent: Option<u64>, split: bool) -> Vec<Self> {
        let unit = extent
            .filter(|&e| e > 0)
            .map(|e| e.saturating_mul((HASH_EXTENT / e).max(1)));
        let Some(e) = unit.filter(|&e| split && bo.size > e) else {
            return vec![Piece::whole(bo, extent)];
        };
        Self::runs(bo, e, extent)
    }

    /// `bo` cut into consecutive runs of `run` bytes (the last may be
    /// shorter), each hashed in extents of `extent`; whole when an address
    /// or mapping offset of a run would overflow.
    pub(super) fn runs(bo: BoRef<'a>, run: u64, extent: Option<u64>) -> Vec<Self> {
        let part = |start: u64| -> Option<Piece<'a>> {
            let cpu_map = match bo.cpu_map {
                Some((fd, off)) => Some((fd, MmapOffset(off.0.checked_add(start)?))),
                None => None,
            };
            Some(Piece {
                bo: BoRef {
                    addr: GpuVa(bo.addr.0.checked_add(start)?),
                    size: (bo.size - start).min(run),
                    cpu_map,
                    dmabuf: None,
                    ..bo
                },
                start,
                extent,
            })
        };
        let parts: Option<Vec<_>> = (0..bo.size).step_by(run as usize).map(part).collect();
        parts.unwrap_or_else(|| vec![Piece::whole(bo, extent)])
    }
}

/// Bucket index → the digests of the BO's extents, in order.
pub(super) type ExtentDigests = BTreeMap<usize, Vec<u64>>;

/// The digests of one piece: (bucket index, start in the BO, digests).
pub(super) type PieceDigests = (usize, u64, Vec<u64>);

/// Each BO's extent digests, in order, from those of its pieces, whichever
/// lanes had them.
pub(super) fn compose_pieces(parts: Vec<PieceDigests>) -> ExtentDigests {
    let mut by_bo: BTreeMap<usize, Vec<(u64, Vec<u64>)>> = BTreeMap::new();
    for (index, start, digests) in parts {
        by_bo.entry(index).or_default().push((start, digests));
    }
    by_bo
        .into_iter()
        .map(|(index, mut parts)| {
            parts.sort_by_key(|p| p.0);
            let all: Vec<u64> = parts.into_iter().flat_map(|p| p.1).collect();
            (index, all)
        })
        .collect()
}
