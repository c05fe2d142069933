//! Moving BO contents between GPU memory and the pages files.
//!
//! Two engines implement [`CopyEngine`]:
//! * [`cpu::CpuEngine`] maps the BO through a device fd (the render-node
//!   file that owns it at its mmap offset, or else its dmabuf) in windows
//!   of at most the staging size and copies with the CPU.  It works for GTT BOs and for VRAM BOs allocated with KFD's
//!   PUBLIC flag (amdgpu refuses to map the others: they are
//!   `AMDGPU_GEM_CREATE_NO_CPU_ACCESS`), and on the emulator.
//! * [`sdma::SdmaEngine`] imports the BO's dmabuf into a render node and
//!   copies with the GPU's SDMA engine to and from a userptr staging buffer.
//!   Under `auto` it moves every VRAM BO it can reach (BAR reads of
//!   write-combined VRAM are far slower, and need HDP maintenance).  It
//!   needs real hardware and is only tested against a packet-interpreting
//!   model here.
//!
//! When the CPU touches VRAM on a GPU that has an SDMA engine, each piece
//! is bracketed by [`GpuEngine::hdp_barrier`] (a NOP IB: amdgpu flushes
//! HDP before an IB and invalidates it after), as the kernel's own CPU
//! access to VRAM flushes and invalidates HDP.
//!
//! [`dump_contents`] and [`restore_contents`] run one worker per GPU in
//! parallel, each with its own engines and staging memory, streaming that
//! GPU's BOs in bucket order into (or out of) its pages file, and hashing
//! the contents (XXH3-64, in extents: see [`crate::pages::hash`]) on the way.  When the
//! CPU copies, a GPU's work is shared out among lanes (threads) over the
//! spare cores, a BO larger than a hash extent in pieces of extents.

pub mod cpu;
pub mod drm;
pub mod sdma;

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use crate::pages::{ContentHash, HASH_EXTENT};

use crate::bo;
use crate::env::{self, EnginePolicy};
use crate::ids::{GpuId, GpuVa, MmapOffset};
use crate::image::{FileId, ImageError};
use crate::pages::{
    compose, pages_image_name, Compress, Encoding, ExtentHasher, PagesReader, PagesWriter,
    CONTENT_EXTENT,
};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Errors moving BO contents; each names the GPU (user id) and the BO.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("GPU {gpu}, BO {bo}: mmap of {len:#x} bytes at offset {offset}: {source}")]
    Map {
        gpu: GpuId,
        bo: usize,
        offset: MmapOffset,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error("GPU {gpu}, BO {bo}: {op}: {source}")]
    Device {
        gpu: GpuId,
        bo: usize,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("GPU {gpu}, BO {bo}: {file}: {op}: {source}")]
    Stream {
        gpu: GpuId,
        bo: usize,
        file: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("GPU {gpu}, BO {bo}: GPU reset during copy: {op}: {source}")]
    GpuReset {
        gpu: GpuId,
        bo: usize,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("GPU {gpu}, BO {bo}: SDMA copy did not finish within {timeout:?}")]
    Timeout {
        gpu: GpuId,
        bo: usize,
        timeout: Duration,
    },
    #[error("GPU {gpu}, BO {bo}: no copy engine: {why}")]
    NoEngine { gpu: GpuId, bo: usize, why: String },
    /// Worded as `gpu-check` words it ([`crate::validate::Refusal::content_mismatch`]).
    #[error("{}", crate::validate::Refusal::content_mismatch(file, *gpu, *bo, addr.0, *size, *expected, *got))]
    HashMismatch {
        file: String,
        gpu: GpuId,
        bo: usize,
        addr: GpuVa,
        size: u64,
        expected: u64,
        got: u64,
    },
    #[error("GPU {gpu}: {what}")]
    Setup { gpu: GpuId, what: String },
    #[error("GPU {gpu}: copy worker panicked")]
    Panicked { gpu: GpuId },
    #[error(transparent)]
    Image(#[from] ImageError),
}

impl CopyError {
    /// The OS error number behind this error, if any (for the C boundary).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            CopyError::Map { source, .. }
            | CopyError::Device { source, .. }
            | CopyError::GpuReset { source, .. }
            | CopyError::Stream { source, .. } => source.raw_os_error(),
            CopyError::Image(e) => e.raw_os_error(),
            CopyError::Timeout { .. } => Some(libc::ETIMEDOUT),
            _ => None,
        }
    }
}

// Defined beside the BO flags, below the plans that make them.
pub use crate::bo::BoRef;

/// Copies one BO's bytes out to a sink, or in from a source, all `size`
/// bytes in order.
pub trait CopyEngine: Send {
    /// Short name for logs and statistics.
    fn name(&self) -> &'static str;
    /// Streams the BO's contents into `sink`.
    fn read_bo(&mut self, bo: &BoRef<'_>, sink: &mut dyn Write) -> Result<(), CopyError>;
    /// [`CopyEngine::read_bo`], handing `sink` whole `unit`s of the BO at
    /// a time (from its start; the last may be shorter) when the engine's
    /// window or staging buffer holds one, so that the sink can hash each
    /// in place (an incremental dump's extents); slices of a window or
    /// staging buffer smaller than a unit otherwise.  The default hands
    /// what `read_bo` does.
    fn read_bo_aligned(
        &mut self,
        bo: &BoRef<'_>,
        unit: u64,
        sink: &mut dyn Write,
    ) -> Result<(), CopyError> {
        let _ = unit;
        self.read_bo(bo, sink)
    }
    /// Fills the BO from `src` (exactly `bo.size` bytes).
    fn write_bo(&mut self, bo: &BoRef<'_>, src: &mut dyn Read) -> Result<(), CopyError>;
}

/// An engine that submits work to the GPU, and so can make CPU access to
/// VRAM coherent.
pub trait GpuEngine: CopyEngine {
    /// Flushes HDP (CPU writes through the BAR reach VRAM) and invalidates
    /// it (later CPU reads see VRAM); errors name `bo`.
    fn hdp_barrier(&mut self, bo: &BoRef<'_>) -> Result<(), CopyError>;
}

/// Which engine handles a BO under `policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Cpu,
    Sdma,
}

/// Engine selection.  `auto`: SDMA for VRAM BOs when the GPU has a working
/// SDMA engine and the BO a dmabuf (real hardware), the CPU for the rest
/// (GTT, BOs KFD exported no dmabuf for, the emulator, a GPU whose DMA ring
/// refused us).  Forced choices fail when their engine cannot reach the BO.
pub fn choose_engine(
    policy: EnginePolicy,
    bo: &BoRef<'_>,
    sdma_available: bool,
) -> Result<EngineKind, CopyError> {
    let no = |why: &str| CopyError::NoEngine {
        gpu: bo.gpu,
        bo: bo.index,
        why: why.into(),
    };
    let can_cpu = bo.cpu_map.is_some();
    let can_sdma = sdma_available && bo.dmabuf.is_some();
    match policy {
        EnginePolicy::Cpu if can_cpu => Ok(EngineKind::Cpu),
        EnginePolicy::Cpu => Err(no(
            "CRIU_ROCM_COPY_ENGINE=cpu but the BO has no CPU mapping",
        )),
        EnginePolicy::Sdma if can_sdma => Ok(EngineKind::Sdma),
        EnginePolicy::Sdma => Err(no(
            "CRIU_ROCM_COPY_ENGINE=sdma but the BO has no dmabuf or the GPU no SDMA path",
        )),
        EnginePolicy::Auto => {
            if can_sdma && bo.alloc_flags & bo::ALLOC_VRAM != 0 {
                Ok(EngineKind::Sdma)
            } else if can_cpu {
                Ok(EngineKind::Cpu)
            } else if can_sdma {
                Ok(EngineKind::Sdma)
            } else {
                Err(no("neither a CPU mapping nor a dmabuf with SDMA"))
            }
        }
    }
}

/// The engines of one GPU worker (or lane).
pub struct Engines<'a> {
    pub policy: EnginePolicy,
    pub cpu: Option<cpu::CpuEngine>,
    pub sdma: Option<Box<dyn GpuEngine + 'a>>,
    /// Whether the SDMA engine copies BOs (false under policy `cpu`, where
    /// it is there for HDP barriers only).
    pub sdma_copies: bool,
    /// The bytes of the memory budget for the CPU window and the pages
    /// file's write buffer (besides what an SDMA engine holds).
    pub budget: u64,
    /// The BOs may change while copied (a pre-dump: the process runs): the
    /// CPU engines read each slice once into memory of their own
    /// ([`cpu::CpuEngine::live`]).
    pub live: bool,
}

impl<'a> Engines<'a> {
    /// A CPU engine and a pages-file write buffer within `budget` bytes
    /// (see [`env::lane_split`]), plus the SDMA engine if the device has
    /// one (under policy `cpu` it only issues HDP barriers).
    pub fn new(policy: EnginePolicy, budget: u64, sdma: Option<Box<dyn GpuEngine + 'a>>) -> Self {
        Engines {
            policy,
            cpu: Some(cpu::CpuEngine::new(env::lane_split(budget).0)),
            sdma_copies: policy != EnginePolicy::Cpu,
            sdma,
            budget,
            live: false,
        }
    }

    /// For BOs that may change while they are copied (see [`Self::live`]).
    pub fn set_live(&mut self) {
        self.live = true;
        self.set_window(env::lane_split(self.budget).0);
    }

    /// A CPU engine (live or not, as these engines are) with a mapping
    /// window within `window` bytes.
    fn set_window(&mut self, window: u64) {
        self.cpu = Some(if self.live {
            cpu::CpuEngine::live(window)
        } else {
            cpu::CpuEngine::new(window)
        });
    }

    /// CPU-only engines for another lane of the same GPU, within `budget`.
    fn another_lane(&self, budget: u64) -> Engines<'a> {
        let mut e = Engines::new(EnginePolicy::Cpu, budget, None);
        e.live = self.live;
        e.set_window(env::lane_split(budget).0);
        e
    }

    /// Bytes of the pages file's write buffer of a lane with these engines.
    fn write_buffer(&self) -> usize {
        env::lane_split(self.budget).1 as usize
    }

    /// Moves one piece with the engine `policy` picks for it (`f` does the
    /// moving); CPU access to a VRAM BO is bracketed by HDP barriers when
    /// the GPU has an engine that can issue them.
    fn with_engine<T>(
        &mut self,
        bo: &BoRef<'_>,
        f: impl FnOnce(&mut dyn CopyEngine) -> Result<T, CopyError>,
    ) -> Result<(EngineKind, T), CopyError> {
        let kind = choose_engine(self.policy, bo, self.sdma.is_some() && self.sdma_copies)?;
        let missing = |what: &str| CopyError::NoEngine {
            gpu: bo.gpu,
            bo: bo.index,
            why: format!("{what} engine not set up"),
        };
        match kind {
            EngineKind::Sdma => {
                let sdma = self.sdma.as_deref_mut().ok_or_else(|| missing("SDMA"))?;
                Ok((kind, f(sdma)?))
            }
            EngineKind::Cpu => {
                let cpu = self.cpu.as_mut().ok_or_else(|| missing("CPU"))?;
                let hdp = match self.sdma.as_deref_mut() {
                    Some(g) if bo.alloc_flags & bo::ALLOC_VRAM != 0 => Some(g),
                    _ => None,
                };
                match hdp {
                    Some(g) => {
                        g.hdp_barrier(bo)?;
                        let r = f(cpu)?;
                        g.hdp_barrier(bo)?;
                        Ok((kind, r))
                    }
                    None => Ok((kind, f(cpu)?)),
                }
            }
        }
    }
}

/// One GPU's share of a dump or restore.
pub struct GpuJob<'a> {
    /// User gpu_id: names the pages file.
    pub user: GpuId,
    /// Host gpu_id the copies run on (for statistics).
    pub actual: GpuId,
    /// The GPU's content BOs in bucket order.
    pub bos: Vec<BoRef<'a>>,
    pub engines: Engines<'a>,
}

/// What one GPU worker did, for the caller to log.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuStats {
    pub user: GpuId,
    pub actual: GpuId,
    pub bos: usize,
    pub bytes: u64,
    pub cpu_bos: usize,
    pub sdma_bos: usize,
    pub elapsed: Duration,
}

impl GpuStats {
    /// Throughput in MB/s (10^6 bytes), 0 for an empty or instant copy.
    pub fn mb_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            0.0
        } else {
            self.bytes as f64 / 1e6 / secs
        }
    }
}

/// Result of a dump: per-GPU statistics and per-BO content hashes.
#[derive(Clone, Debug, Default)]
pub struct DumpOutcome {
    pub stats: Vec<GpuStats>,
    /// Bucket index → hash of the BO's bytes (in extents of
    /// [`CONTENT_EXTENT`]).
    pub hashes: BTreeMap<usize, ContentHash>,
    /// How the pages files hold the bytes.
    pub encoding: Encoding,
    /// Bucket index → the digest of each of its extents.
    pub extents: BTreeMap<usize, Vec<u64>>,
    /// Bucket index → the extents left out of the pages file (holes there)
    /// because the parent holds the same bytes, in order.
    pub inherited: BTreeMap<usize, Vec<u64>>,
    /// Bytes of GPU memory written to the pages files: all of it, but for
    /// the extents an incremental dump left to its parent.
    pub written: u64,
}

/// Bucket index → the digests of the extents (of [`CONTENT_EXTENT`]) of
/// the same BO in the parent image, for an incremental dump.
pub type ParentDigests = BTreeMap<usize, Vec<u64>>;

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
struct IncrementalWriter<'w, 'p> {
    out: &'w mut PagesWriter,
    extent: u64,
    /// Bytes of the piece not yet given.
    left: u64,
    /// The extent being given in parts: its hash so far and its bytes not
    /// yet given.
    part: Option<(Xxh3, u64)>,
    /// Index in the BO of the next extent (or of the one being given).
    next: u64,
    parent: &'p [u64],
    digests: Vec<u64>,
    /// Extents left to the parent.
    kept: Vec<u64>,
    /// Bytes written to the pages file.
    written: u64,
    /// Extents given in parts.
    parted: u64,
}

impl<'w, 'p> IncrementalWriter<'w, 'p> {
    fn new(out: &'w mut PagesWriter, p: &Piece<'_>, parent: &'p [u64]) -> Self {
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

struct HashingWriter<'w> {
    inner: &'w mut dyn Write,
    hasher: ExtentHasher,
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

struct HashingReader<'r> {
    inner: &'r mut dyn Read,
    hasher: ExtentHasher,
}

impl Read for HashingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn run_parallel<I: Send, T: Send>(
    items: Vec<I>,
    gpu_of: impl Fn(&I) -> GpuId,
    work: impl Fn(I) -> Result<T, CopyError> + Sync,
) -> Result<Vec<T>, CopyError> {
    let gpus: Vec<GpuId> = items.iter().map(gpu_of).collect();
    let results: Vec<std::thread::Result<Result<T, CopyError>>> = std::thread::scope(|s| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| {
                let work = &work;
                s.spawn(move || work(item))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut out = Vec::with_capacity(results.len());
    let mut first_err = None;
    for (gpu, r) in gpus.into_iter().zip(results) {
        match r {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                log::error!("{e}");
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(CopyError::Panicked { gpu });
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// A part of a BO that one lane copies: the whole BO, or a run of its hash
/// extents.
#[derive(Clone, Copy, Debug)]
struct Piece<'a> {
    /// The part, as a BO of its own (address, size and mapping offset
    /// moved to the part; no dmabuf, which would cover the whole BO).
    bo: BoRef<'a>,
    /// Where the part starts in the BO: 0 or a multiple of `extent`.
    start: u64,
    /// Extent of the BO's content hash (`None`: the BO is one extent).
    extent: Option<u64>,
}

impl<'a> Piece<'a> {
    fn whole(bo: BoRef<'a>, extent: Option<u64>) -> Self {
        Piece {
            bo,
            start: 0,
            extent,
        }
    }

    /// `bo` cut into runs of its hash extents of about [`HASH_EXTENT`]
    /// bytes when `split` and it has more than one run (and its addresses
    /// do not overflow), else whole.
    fn of(bo: BoRef<'a>, extent: Option<u64>, split: bool) -> Vec<Self> {
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
    fn runs(bo: BoRef<'a>, run: u64, extent: Option<u64>) -> Vec<Self> {
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
type ExtentDigests = BTreeMap<usize, Vec<u64>>;

/// The digests of one piece: (bucket index, start in the BO, digests).
type PieceDigests = (usize, u64, Vec<u64>);

/// Each BO's extent digests, in order, from those of its pieces, whichever
/// lanes had them.
fn compose_pieces(parts: Vec<PieceDigests>) -> ExtentDigests {
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

/// The pieces of one GPU that one thread copies: a contiguous run in
/// bucket order, so its bytes are one range of the pages file.
struct Lane<'a> {
    user: GpuId,
    actual: GpuId,
    pieces: Vec<Piece<'a>>,
    engines: Engines<'a>,
}

impl Lane<'_> {
    fn bytes(&self) -> Result<u64, CopyError> {
        self.pieces
            .iter()
            .try_fold(0u64, |t, p| t.checked_add(p.bo.size))
            .ok_or_else(|| CopyError::Setup {
                gpu: self.user,
                what: "sum of BO sizes overflows".into(),
            })
    }

    fn stats(&self) -> GpuStats {
        GpuStats {
            user: self.user,
            actual: self.actual,
            bos: 0,
            bytes: 0,
            cpu_bos: 0,
            sdma_bos: 0,
            elapsed: Duration::ZERO,
        }
    }
}

/// A GPU's work is split into lanes only when each gets at least this much.
pub const MIN_LANE_BYTES: u64 = 32 << 20;

/// Threads per GPU: the CPU cores shared out among the GPUs.
fn lanes_per_gpu(gpus: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / gpus.max(1)).max(1)
}

/// Splits a GPU's job into at most `max` lanes of about equal bytes, BOs
/// larger than their hash extent (`extent_of` a bucket index) in pieces of
/// extents.  A job with an SDMA engine (one per GPU) stays whole, its BOs
/// too; the CPU window is shared out among the lanes, so a GPU never maps
/// more than the job's window at once.
fn split_job<'a>(
    job: GpuJob<'a>,
    max: usize,
    extent_of: &dyn Fn(usize) -> Option<u64>,
) -> Vec<Lane<'a>> {
    let GpuJob {
        user,
        actual,
        bos,
        mut engines,
    } = job;
    let split = engines.sdma.is_none() && max > 1;
    let pieces: Vec<Piece<'a>> = bos
        .into_iter()
        .flat_map(|b| Piece::of(b, extent_of(b.index), split))
        .collect();
    let total: u64 = pieces
        .iter()
        .map(|p| p.bo.size)
        .fold(0, u64::saturating_add);
    let n = (total / MIN_LANE_BYTES)
        .min(max as u64)
        .min(pieces.len() as u64)
        .max(1) as usize;
    if n == 1 || engines.sdma.is_some() {
        return vec![Lane {
            user,
            actual,
            pieces,
            engines,
        }];
    }
    let budget = engines.budget / n as u64;
    engines.set_window(env::lane_split(budget).0);
    engines.budget = budget;
    let like = engines.another_lane(budget);
    let sizes: Vec<u64> = pieces.iter().map(|p| p.bo.size).collect();
    let mut engines = Some(engines);
    let mut rest = pieces;
    let mut lanes: Vec<Lane<'_>> = Vec::with_capacity(n);
    let mut start = 0;
    for end in lane_ends(&sizes, n) {
        let tail = rest.split_off(end - start);
        lanes.push(Lane {
            user,
            actual,
            pieces: std::mem::replace(&mut rest, tail),
            engines: engines.take().unwrap_or_else(|| like.another_lane(budget)),
        });
        start = end;
    }
    lanes
}

/// Where `n` contiguous lanes over pieces of `sizes` end (exclusive
/// indices, the last one `sizes.len()`): each boundary is the piece
/// boundary nearest to its share of the bytes, every lane keeps at least
/// one piece.  Nearest, not
/// the first boundary past the share: four BOs of 64 MiB followed by a
/// doorbell page go to two lanes two and two, not three and one (which made
/// the slower lane take 1.5 times as long as an even split).
fn lane_ends(sizes: &[u64], n: usize) -> Vec<usize> {
    let m = sizes.len();
    let n = n.clamp(1, m.max(1));
    let mut prefix = Vec::with_capacity(m + 1);
    prefix.push(0u128);
    for &s in sizes {
        prefix.push(prefix[prefix.len() - 1] + u128::from(s));
    }
    let total = prefix[m];
    let mut ends = Vec::with_capacity(n);
    let mut prev = 0;
    for k in 1..n {
        let ideal = total * k as u128 / n as u128;
        // Leave at least one BO for each lane after this one.
        let end = (prev + 1..=m - (n - k))
            .min_by_key(|&i| prefix[i].abs_diff(ideal))
            .unwrap_or(prev + 1);
        ends.push(end);
        prev = end;
    }
    ends.push(m);
    ends
}

/// The most lanes, up to `max`, among which `budget` can be shared so that
/// each lane's CPU window holds `window` bytes; one if none can.
fn lanes_with_window(budget: u64, window: u64, max: usize) -> usize {
    (1..=max)
        .rev()
        .find(|&n| env::lane_split(budget / n as u64).0 >= window)
        .unwrap_or(1)
}

/// Every job split into lanes (one per GPU when `one_lane`; fewer when
/// sharing its budget out would leave a lane a CPU window smaller than
/// `min_window`), each paired with its range of the GPU's pages file
/// (`open` gives one writer or reader per lane length, with write buffers
/// of the given bytes; it is also given the GPU's BOs, bucket index and
/// size, in file order).
fn into_lanes<'a, F>(
    jobs: Vec<GpuJob<'a>>,
    extent_of: &dyn Fn(usize) -> Option<u64>,
    one_lane: bool,
    min_window: u64,
    open: impl Fn(GpuId, &[u64], usize, &[(usize, u64)]) -> Result<Vec<F>, ImageError>,
) -> Result<Vec<(Lane<'a>, F)>, CopyError> {
    let per_gpu = if one_lane {
        1
    } else {
        lanes_per_gpu(jobs.len())
    };
    let mut lanes = Vec::new();
    for job in jobs {
        let bos: Vec<(usize, u64)> = job.bos.iter().map(|b| (b.index, b.size)).collect();
        let max = lanes_with_window(job.engines.budget, min_window, per_gpu);
        let split = split_job(job, max, extent_of);
        let lens = split
            .iter()
            .map(Lane::bytes)
            .collect::<Result<Vec<_>, _>>()?;
        let files = open(split[0].user, &lens, split[0].engines.write_buffer(), &bos)?;
        lanes.extend(split.into_iter().zip(files));
    }
    Ok(lanes)
}

/// Takes the memory of `decoders` zstd decompressors per lane out of the
/// lane's CPU window, so that the budget still bounds the whole copy.
fn make_room_for_zstd(lanes: &mut [(Lane<'_>, impl Sized)], decoders: u64) {
    let zstd = decoders * crate::pages::zstd::decompressor_memory();
    for (l, _) in lanes {
        if l.engines.cpu.is_some() {
            if l.engines.budget < zstd + 2 * bo::PAGE_SIZE {
                log::warn!(
                    "GPU {}: a copy lane's share of {} ({} bytes) cannot hold its {decoders} \
                     zstd decompressor(s) ({zstd} bytes) and a window: the restore uses more \
                     memory than the budget; raise {}",
                    l.user,
                    env::MAX_BUFFER_SIZE_VAR,
                    l.engines.budget,
                    env::MAX_BUFFER_SIZE_VAR
                );
            }
            let budget = l.engines.budget.saturating_sub(zstd);
            l.engines.set_window(env::lane_split(budget).0);
        }
    }
}

/// Adds up the lanes' statistics per GPU (elapsed: the slowest lane).
fn merge_stats(lanes: Vec<GpuStats>) -> Vec<GpuStats> {
    let mut out: Vec<GpuStats> = Vec::new();
    for s in lanes {
        log::debug!(
            "GPU {}: lane of {} bytes in {:.1} ms",
            s.actual,
            s.bytes,
            s.elapsed.as_secs_f64() * 1e3
        );
        match out.iter_mut().find(|o| o.user == s.user) {
            Some(o) => {
                o.bos += s.bos;
                o.bytes += s.bytes;
                o.cpu_bos += s.cpu_bos;
                o.sdma_bos += s.sdma_bos;
                o.elapsed = o.elapsed.max(s.elapsed);
            }
            None => out.push(s),
        }
    }
    out
}

/// Dumps every job's BOs into `amdgpu-pages-<id>-<user gpu_id>.img` in
/// `dir`: one worker per GPU, split into lanes over the spare CPU cores
/// when the CPU does the copying (see [`MIN_LANE_BYTES`]).  All workers run
/// to completion; the first error is returned.
pub fn dump_contents(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
) -> Result<DumpOutcome, CopyError> {
    dump_contents_encoded(dir, id, jobs, None, &BTreeMap::new())
}

/// [`dump_contents`], compressing the pages files with zstd when
/// `compress` gives a level and lanes (`None` lanes: the CPU cores shared
/// out among the GPUs), see [`dump_compressed`].
///
/// `parent` (incremental dump): the extent digests of BOs the parent image
/// holds too; an extent whose digest is the parent's is left out (a hole,
/// or a zero chunk record) and listed in [`DumpOutcome::inherited`].
pub fn dump_contents_encoded(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    compress: Option<(i32, Option<u32>)>,
    parent: &ParentDigests,
) -> Result<DumpOutcome, CopyError> {
    if let Some((level, threads)) = compress {
        return dump_compressed(dir, id, jobs, Compress { level, threads }, parent);
    }
    let extent = CONTENT_EXTENT;
    // An incremental dump hashes each extent in place, in a CPU window
    // that holds it: fewer lanes rather than windows too small for one.
    let min_window = if parent.is_empty() { 0 } else { extent };
    // A streamed pages file is written in order: one lane per GPU.
    let lanes = into_lanes(
        jobs,
        &|_| Some(extent),
        crate::stream::active().is_some(),
        min_window,
        |gpu, lens, buffer, _| PagesWriter::create_lanes_buffered(dir, id, gpu, lens, buffer),
    )?;
    let inherited: std::sync::Mutex<BTreeMap<usize, Vec<u64>>> = Default::default();
    let (written, parted) = (AtomicU64::new(0), AtomicU64::new(0));
    let (stats, digests) = run_lanes(
        lanes,
        "copied to the pages file",
        |engine, p, out| {
            let Some(from) = parent.get(&p.bo.index) else {
                let mut sink = HashingWriter {
                    inner: out,
                    hasher: ExtentHasher::new(p.extent),
                };
                engine.read_bo(&p.bo, &mut sink)?;
                written.fetch_add(p.bo.size, Ordering::Relaxed);
                return Ok(sink.hasher.digests());
            };
            let mut sink = IncrementalWriter::new(out, p, from);
            engine.read_bo_aligned(&p.bo, sink.extent, &mut sink)?;
            written.fetch_add(sink.written, Ordering::Relaxed);
            parted.fetch_add(sink.parted, Ordering::Relaxed);
            if !sink.kept.is_empty() {
                let mut m = inherited.lock().unwrap_or_else(|e| e.into_inner());
                m.entry(p.bo.index).or_default().extend(sink.kept);
            }
            Ok(sink.digests)
        },
        |out| out.finish().map(drop).map_err(CopyError::from),
    )?;
    let parted = parted.into_inner();
    if parted > 0 {
        log::warn!(
            "{parted} extent(s) of {} came in parts (a copy window or staging buffer smaller \
             than an extent: KFD_MAX_BUFFER_SIZE too small for the GPUs and copy threads), \
             so they were written whole even if unchanged",
            crate::units::human_bytes(extent)
        );
    }
    let inherited = inherited.into_inner().unwrap_or_else(|e| e.into_inner());
    let written = written.into_inner();
    Ok(outcome(stats, digests, inherited, written, Encoding::Raw))
}

/// A dump's outcome from its lanes' statistics, each BO's extent digests
/// (of [`CONTENT_EXTENT`]), the extents left to the parent and the bytes
/// written.
fn outcome(
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

/// The least CPU window a compressing lane keeps besides its compressor.
pub const MIN_ZSTD_WINDOW: u64 = 1 << 20;

/// How many compressing lanes a GPU's share of the budget (`budget`, past
/// any SDMA staging) holds at `level`, at most `want`, and the level: each
/// lane holds a
/// compressor ([`crate::pages::zstd::compressor_memory`]) and a CPU window
/// of at least [`MIN_ZSTD_WINDOW`], or of a chunk when `incremental` (its
/// chunks are hashed in place in the window, and an unchanged one is
/// neither copied nor compressed).  Fewer lanes, then a lower level, when
/// the budget cannot hold them (the caller says so); an incremental dump
/// whose budget holds no lane with a chunk's window falls back to windows
/// of [`MIN_ZSTD_WINDOW`] (its chunks then come in parts and are
/// compressed whole, changed or not).  `None` when not even one lane at
/// level 1 fits.
pub fn zstd_lanes(budget: u64, want: usize, level: i32, incremental: bool) -> Option<(usize, i32)> {
    let fit = |window: u64| {
        let lane = |level: i32| crate::pages::zstd::compressor_memory(level) + window;
        let lanes = (budget / lane(level)).min(want.max(1) as u64) as usize;
        if lanes >= 1 {
            return Some((lanes, level));
        }
        (1..level)
            .rev()
            .find(|&l| lane(l) <= budget)
            .map(|l| (1, l))
    };
    let chunk = crate::pages::zstd::CHUNK.max(MIN_ZSTD_WINDOW);
    if incremental {
        fit(chunk).or_else(|| fit(MIN_ZSTD_WINDOW))
    } else {
        fit(MIN_ZSTD_WINDOW)
    }
}

/// One GPU's compressed dump: its pages file, the pieces its lanes take in
/// turn (whole chunks, or whole BOs when one engine copies), and where each
/// BO's chunks start in the file's chunk list.
struct ZstdGpu<'a> {
    file: crate::pages::zstd::ZstdPagesFile,
    pieces: Vec<Piece<'a>>,
    next: std::sync::atomic::AtomicUsize,
    first_chunk: BTreeMap<usize, usize>,
}

/// [`dump_contents`] into compressed pages files ([`crate::pages::zstd`]):
/// per GPU, lanes (threads; one when an SDMA engine copies) take whole
/// chunks in turn, each hashing and compressing a chunk straight from the
/// engine's window or staging buffer into memory with its own
/// single-threaded zstd context; the file places the records in chunk
/// order.  The compressors live in each lane's share of the budget (see
/// [`zstd_lanes`]); with `parent`, each chunk (an extent) is handed whole
/// ([`CopyEngine::read_bo_aligned`]) and hashed in place first, and one the
/// parent holds with the same digest is neither copied nor compressed but
/// written as a zero record and listed as inherited.
pub fn dump_compressed(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    c: Compress,
    parent: &ParentDigests,
) -> Result<DumpOutcome, CopyError> {
    use crate::pages::zstd::{ZstdPagesFile, CHUNK};
    let cores = lanes_per_gpu(jobs.len());
    let want = c.threads.map_or(cores, |t| t.max(1) as usize);
    let incremental = !parent.is_empty();
    // One level for the image: the lowest any GPU's share holds.
    let mut level = c.level;
    let mut plan = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let want = if job.engines.sdma.is_some() { 1 } else { want };
        let Some((n, l)) = zstd_lanes(job.engines.budget, want, c.level, incremental) else {
            return Err(CopyError::Setup {
                gpu: job.user,
                what: format!(
                    "{} bytes of {} per GPU cannot hold a zstd compressor ({} bytes at level 1) \
                     and a copy window of {MIN_ZSTD_WINDOW}: raise {} or unset {}",
                    job.engines.budget,
                    env::MAX_BUFFER_SIZE_VAR,
                    crate::pages::zstd::compressor_memory(1),
                    env::MAX_BUFFER_SIZE_VAR,
                    env::COMPRESS_VAR
                ),
            });
        };
        if n < want {
            log::warn!(
                "GPU {}: {} compressing lanes (not {want}): each holds a zstd compressor of {} \
                 bytes at level {l} within {} ({} bytes for this GPU; see {})",
                job.user,
                n,
                crate::pages::zstd::compressor_memory(l),
                env::MAX_BUFFER_SIZE_VAR,
                job.engines.budget,
                env::COMPRESS_THREADS_VAR
            );
        }
        if l < c.level {
            log::warn!(
                "GPU {}: zstd level {l}, not {} ({}): a compressor at level {} needs {} bytes, \
                 more than {} leaves this GPU ({} bytes)",
                job.user,
                c.level,
                env::COMPRESS_VAR,
                c.level,
                crate::pages::zstd::compressor_memory(c.level),
                env::MAX_BUFFER_SIZE_VAR,
                job.engines.budget
            );
        }
        level = level.min(l);
        plan.push(n);
    }
    let zmem = crate::pages::zstd::compressor_memory(level);
    let mut gpus = Vec::with_capacity(jobs.len());
    let mut lanes: Vec<(usize, Lane<'_>)> = Vec::new();
    for (g, (job, n)) in jobs.into_iter().zip(plan).enumerate() {
        let GpuJob {
            user,
            actual,
            bos,
            mut engines,
        } = job;
        let list: Vec<(usize, u64)> = bos.iter().map(|b| (b.index, b.size)).collect();
        let file = ZstdPagesFile::create(dir, id, user, &list, CHUNK)?;
        let mut first_chunk = BTreeMap::new();
        for (k, ch) in file.chunks().iter().enumerate() {
            first_chunk.entry(ch.bo).or_insert(k);
        }
        let split = engines.sdma.is_none() && n > 1;
        let pieces: Vec<Piece<'_>> = bos
            .into_iter()
            .flat_map(|b| chunk_pieces(b, split))
            .collect();
        let n = n.min(pieces.len()).max(1);
        let lane_budget = engines.budget / n as u64;
        let window =
            (lane_budget.saturating_sub(zmem) / bo::PAGE_SIZE * bo::PAGE_SIZE).max(bo::PAGE_SIZE);
        engines.set_window(window);
        engines.budget = lane_budget;
        let like = engines.another_lane(lane_budget);
        let mut engines = Some(engines);
        for _ in 0..n {
            lanes.push((
                g,
                Lane {
                    user,
                    actual,
                    pieces: Vec::new(),
                    engines: engines.take().unwrap_or_else(|| {
                        let mut e = like.another_lane(lane_budget);
                        e.set_window(window);
                        e
                    }),
                },
            ));
        }
        gpus.push(ZstdGpu {
            file,
            pieces,
            next: Default::default(),
            first_chunk,
        });
    }
    let inherited: std::sync::Mutex<BTreeMap<usize, Vec<u64>>> = Default::default();
    let counts = ChunkCounts::default();
    let per_lane = run_parallel(
        lanes,
        |(_, l)| l.user,
        |(g, mut lane)| {
            let gpu = &gpus[g];
            // A lane that panics stops the others too (they would wait
            // for its chunk's record for ever).
            struct StopOnPanic<'f>(&'f crate::pages::zstd::ZstdPagesFile);
            impl Drop for StopOnPanic<'_> {
                fn drop(&mut self) {
                    if std::thread::panicking() {
                        self.0.fail();
                    }
                }
            }
            let _stop = StopOnPanic(&gpu.file);
            match zstd_lane(id, gpu, &mut lane, level, parent, &inherited, &counts) {
                // A lane stopped by another's failure: the other gives the
                // cause.
                Err(_) if gpu.file.fail() => Ok((lane.stats(), Vec::new())),
                r => r,
            }
        },
    )?;
    for g in &gpus {
        g.file.finish()?;
    }
    let mut stats = Vec::new();
    let mut digests = Vec::new();
    for (s, d) in per_lane {
        stats.push(s);
        digests.extend(d);
    }
    let inherited = inherited.into_inner().unwrap_or_else(|e| e.into_inner());
    let stats = merge_stats(stats);
    let parted = counts.parted.into_inner();
    if parted > 0 {
        log::warn!(
            "{parted} chunk(s) of {} came in parts (a copy window or staging buffer smaller \
             than a chunk: {} too small for the GPUs, compressors and copy threads), so they \
             were compressed even if unchanged",
            crate::units::human_bytes(CHUNK),
            env::MAX_BUFFER_SIZE_VAR
        );
    }
    let written = counts.compressed.into_inner();
    Ok(outcome(
        stats,
        compose_pieces(digests),
        inherited,
        written,
        Encoding::Zstd {
            level,
            chunk: CHUNK,
        },
    ))
}

/// `bo` cut into pieces of one chunk each when `split`, else whole (each
/// hashed in extents of [`CONTENT_EXTENT`], a chunk's size).
fn chunk_pieces(bo: BoRef<'_>, split: bool) -> Vec<Piece<'_>> {
    let extent = Some(CONTENT_EXTENT);
    if !split || bo.size <= CONTENT_EXTENT {
        return vec![Piece::whole(bo, extent)];
    }
    Piece::runs(bo, CONTENT_EXTENT, extent)
}

/// One compressing lane: takes the GPU's next piece until none is left.
fn zstd_lane<'a>(
    id: FileId,
    gpu: &ZstdGpu<'a>,
    lane: &mut Lane<'a>,
    level: i32,
    parent: &ParentDigests,
    inherited: &std::sync::Mutex<BTreeMap<usize, Vec<u64>>>,
    counts: &ChunkCounts,
) -> Result<(GpuStats, Vec<PieceDigests>), CopyError> {
    use std::sync::atomic::Ordering;
    let start = Instant::now();
    let mut stats = lane.stats();
    let mut out = Vec::new();
    let setup = |what: String| CopyError::Setup {
        gpu: lane.user,
        what,
    };
    let mut enc = crate::pages::zstd::FrameEncoder::new(level)
        .map_err(|e| setup(format!("zstd compressor: {e}")))?;
    loop {
        let i = gpu.next.fetch_add(1, Ordering::Relaxed);
        let Some(p) = gpu.pieces.get(i) else { break };
        let first = gpu.first_chunk.get(&p.bo.index).copied().unwrap_or(0);
        let mut sink = ChunkSink {
            file: &gpu.file,
            enc: &mut enc,
            next: first + (p.start / crate::pages::zstd::CHUNK) as usize,
            left: 0,
            k: p.start / crate::pages::zstd::CHUNK,
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            parent: parent.get(&p.bo.index).map(Vec::as_slice),
            digests: Vec::new(),
            kept: Vec::new(),
            compressed: 0,
            parted: 0,
        };
        // With a parent, each chunk whole from the window or staging
        // buffer (when it holds one), to be hashed there before anything
        // is compressed.
        let (kind, ()) = lane
            .engines
            .with_engine(&p.bo, |engine| match sink.parent {
                Some(_) => engine.read_bo_aligned(&p.bo, crate::pages::zstd::CHUNK, &mut sink),
                None => engine.read_bo(&p.bo, &mut sink),
            })?;
        counts
            .compressed
            .fetch_add(sink.compressed, Ordering::Relaxed);
        counts.parted.fetch_add(sink.parted, Ordering::Relaxed);
        if sink.left != 0 {
            return Err(CopyError::Stream {
                gpu: p.bo.gpu,
                bo: p.bo.index,
                file: pages_image_name(id, p.bo.gpu),
                op: "compress",
                source: io::Error::other("the copy ended inside a chunk"),
            });
        }
        if !sink.kept.is_empty() {
            let mut m = inherited.lock().unwrap_or_else(|e| e.into_inner());
            m.entry(p.bo.index).or_default().extend(sink.kept.iter());
        }
        out.push((p.bo.index, p.start, std::mem::take(&mut sink.digests)));
        count(&mut stats, kind, p);
        log::debug!(
            "GPU {}: BO {}, bytes {}..{}: compressed to the pages file",
            lane.user,
            p.bo.index,
            p.start,
            p.start + p.bo.size
        );
    }
    stats.elapsed = start.elapsed();
    Ok((stats, out))
}

/// What a compressed dump's lanes did, counted across them.
#[derive(Default)]
struct ChunkCounts {
    /// Bytes of the chunks compressed (not those left to the parent).
    compressed: AtomicU64,
    /// Chunks an incremental dump was handed in parts, and so compressed
    /// whether they changed or not.
    parted: AtomicU64,
}

/// A compressing lane's sink for one piece (which starts at a chunk): a
/// chunk is hashed and compressed as it streams in, its record placed in
/// the file when it ends.  With a parent, a chunk handed whole
/// ([`CopyEngine::read_bo_aligned`]) is hashed in place first (in the
/// engine's window or staging buffer) and, when the parent's has the same
/// digest, not compressed (a zero record, listed in `kept`); one handed
/// in parts (a window or staging buffer smaller than a chunk) is
/// compressed as it comes, as in a full dump: holding it back until its
/// digest is known would take a chunk of memory outside the budget.
struct ChunkSink<'s> {
    file: &'s crate::pages::zstd::ZstdPagesFile,
    enc: &'s mut crate::pages::zstd::FrameEncoder,
    /// Index in the file of the chunk being written.
    next: usize,
    /// Its bytes still to come (0: none begun).
    left: u64,
    /// Its index in its BO (an extent's).
    k: u64,
    hasher: xxhash_rust::xxh3::Xxh3,
    parent: Option<&'s [u64]>,
    digests: Vec<u64>,
    kept: Vec<u64>,
    /// Bytes of the chunks compressed.
    compressed: u64,
    /// Chunks the parent has a digest for that came in parts.
    parted: u64,
}

impl ChunkSink<'_> {
    fn zfail(e: String) -> io::Error {
        io::Error::other(format!("zstd compression: {e}"))
    }

    /// Places the record of the chunk just ended, of `len` bytes and
    /// digest `d`.
    fn place(&mut self, len: u64, d: u64, compressed: bool) -> io::Result<()> {
        let rec = if compressed {
            self.compressed += len;
            self.enc.end().map_err(Self::zfail)?
        } else {
            self.kept.push(self.k);
            self.enc.skip()
        };
        self.file.place(self.next, rec)?;
        self.digests.push(d);
        self.next += 1;
        self.k += 1;
        Ok(())
    }
}

impl Write for ChunkSink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let c = self.file.chunks().get(self.next).copied().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "write past the last chunk")
            })?;
            let parent = self.parent.and_then(|p| p.get(self.k as usize)).copied();
            let whole = usize::try_from(c.len).ok().filter(|&n| n <= buf.len());
            match (parent, whole) {
                (Some(p), Some(n)) => {
                    // The chunk whole, in place: hashed before anything
                    // is done with it.
                    let bytes = &buf[..n];
                    let d = xxhash_rust::xxh3::xxh3_64(bytes);
                    let changed = d != p;
                    if changed {
                        self.enc.begin(c.len);
                        self.enc.put(bytes).map_err(Self::zfail)?;
                    }
                    self.place(c.len, d, changed)?;
                    return Ok(n);
                }
                (Some(_), None) => self.parted += 1,
                (None, _) => {}
            }
            self.left = c.len;
            self.enc.begin(c.len);
            self.hasher.reset();
        }
        let n = self.left.min(buf.len() as u64) as usize;
        self.hasher.update(&buf[..n]);
        self.enc.put(&buf[..n]).map_err(Self::zfail)?;
        self.left -= n as u64;
        if self.left == 0 {
            let len = self.file.chunks()[self.next].len;
            let d = self.hasher.digest();
            self.place(len, d, true)?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs every lane on a thread of its own: `move_piece` moves a piece
/// between its engine and the lane's range of the pages file (`F`), hashed
/// on the way, and returns the piece's extent digests; `finish` closes the
/// range.  All lanes run to completion; the first error is returned.  Gives
/// the statistics per GPU and each BO's hash.  Each piece done is logged
/// at debug level with `done` ("copied to the pages file").
fn run_lanes<'a, F: Send>(
    lanes: Vec<(Lane<'a>, F)>,
    done: &str,
    move_piece: impl Fn(&mut dyn CopyEngine, &Piece<'a>, &mut F) -> Result<Vec<u64>, CopyError> + Sync,
    finish: impl Fn(F) -> Result<(), CopyError> + Sync,
) -> Result<(Vec<GpuStats>, ExtentDigests), CopyError> {
    let per_lane = run_parallel(
        lanes,
        |(l, _)| l.user,
        |(mut lane, mut file)| {
            let start = Instant::now();
            let mut stats = lane.stats();
            let mut digests = Vec::with_capacity(lane.pieces.len());
            for p in &lane.pieces {
                let (kind, d) = lane
                    .engines
                    .with_engine(&p.bo, |engine| move_piece(engine, p, &mut file))?;
                digests.push((p.bo.index, p.start, d));
                count(&mut stats, kind, p);
                log::debug!(
                    "GPU {}: BO {}, bytes {}..{}: {done}",
                    lane.user,
                    p.bo.index,
                    p.start,
                    p.start + p.bo.size
                );
            }
            finish(file)?;
            stats.elapsed = start.elapsed();
            Ok((stats, digests))
        },
    )?;
    let mut stats = Vec::new();
    let mut digests = Vec::new();
    for (s, d) in per_lane {
        stats.push(s);
        digests.extend(d);
    }
    Ok((merge_stats(stats), compose_pieces(digests)))
}

/// Counts a piece: its bytes, and its BO once (with the piece at its start).
fn count(stats: &mut GpuStats, kind: EngineKind, p: &Piece<'_>) {
    stats.bytes += p.bo.size;
    if p.start != 0 {
        return;
    }
    stats.bos += 1;
    match kind {
        EngineKind::Cpu => stats.cpu_bos += 1,
        EngineKind::Sdma => stats.sdma_bos += 1,
    }
}

/// Restores every job's BOs from its pages file in `dir`, with the workers
/// and lanes of [`dump_contents`].  `hashes` (bucket index → hash, from the
/// image's optional fields) are verified when present, once every lane is
/// done; a BO hashed whole (an image from before extents) is copied by one
/// lane.
pub fn restore_contents(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
) -> Result<Vec<GpuStats>, CopyError> {
    restore_contents_encoded(dir, id, jobs, hashes, Encoding::Raw, &BTreeMap::new())
}

/// [`restore_contents`] from pages files in `encoding` (the KFD image's):
/// a compressed file is decompressed as it streams, by lanes that start at
/// its chunks (see [`crate::pages::zstd`]).
///
/// `overlays`: per GPU, the ranges of an incremental dump's pages file
/// read from its ancestors' ([`crate::validate::chain::resolve`]),
/// compressed or not.
pub fn restore_contents_encoded(
    dir: &Path,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
    overlays: &BTreeMap<GpuId, std::sync::Arc<crate::pages::Overlay>>,
) -> Result<Vec<GpuStats>, CopyError> {
    restore_from(&PagesFrom::Dir(dir), id, jobs, hashes, encoding, overlays)
}

/// Where a restore reads its pages files.
pub enum PagesFrom<'a> {
    /// `amdgpu-pages-<id>-<gpu>.img` of this directory.
    Dir(&'a Path),
    /// Their pipes from the image streamer, by GPU (user gpu_id): each
    /// read in order by one lane (see [`crate::stream`]).
    Stream(std::sync::Mutex<BTreeMap<GpuId, crate::stream::Pipe>>),
}

/// [`restore_contents_encoded`] of the GPU of `job` from its pages file's
/// pipe from the image streamer: one lane, in order, the end of the
/// stream checked (no parent: a stream carries none).
pub fn restore_contents_streamed(
    pipe: crate::stream::Pipe,
    id: FileId,
    job: GpuJob<'_>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
) -> Result<Vec<GpuStats>, CopyError> {
    let from = PagesFrom::Stream(std::sync::Mutex::new([(job.user, pipe)].into()));
    restore_from(&from, id, vec![job], hashes, encoding, &BTreeMap::new())
}

fn restore_from(
    from: &PagesFrom<'_>,
    id: FileId,
    jobs: Vec<GpuJob<'_>>,
    hashes: &BTreeMap<usize, ContentHash>,
    encoding: Encoding,
    overlays: &BTreeMap<GpuId, std::sync::Arc<crate::pages::Overlay>>,
) -> Result<Vec<GpuStats>, CopyError> {
    let names: BTreeMap<usize, (GpuId, GpuVa, u64)> = jobs
        .iter()
        .flat_map(|j| j.bos.iter().map(|b| (b.index, (b.gpu, b.addr, b.size))))
        .collect();
    let extent_of = |i: usize| hashes.get(&i).map_or(Some(HASH_EXTENT), |h| h.extent);
    // Lanes of a compressed file start at its chunks: pieces are runs of
    // whole extents (see Piece::of), which start at chunks when the chunk
    // divides the run; a BO hashed otherwise keeps one lane per GPU.
    let one_lane = match encoding {
        Encoding::Raw => false,
        Encoding::Zstd { chunk, .. } => !jobs.iter().flat_map(|j| j.bos.iter()).all(|b| {
            b.size <= chunk
                || extent_of(b.index).is_some_and(|e| {
                    let run = e.saturating_mul((HASH_EXTENT / e.max(1)).max(1));
                    e > 0 && run % chunk == 0
                })
        }),
    };
    let one_lane = one_lane || matches!(from, PagesFrom::Stream(_));
    let mut lanes = into_lanes(jobs, &extent_of, one_lane, 0, |gpu, lens, _, bos| {
        let overlay = overlays.get(&gpu).cloned();
        match from {
            PagesFrom::Dir(dir) => {
                PagesReader::open_encoded_lanes(dir, id, gpu, bos, encoding, lens, overlay)
            }
            PagesFrom::Stream(pipes) => {
                let pipe = pipes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&gpu)
                    .ok_or_else(|| {
                        ImageError::invalid(
                            &pages_image_name(id, gpu),
                            "",
                            "the image streamer gave no such file",
                        )
                    })?;
                Ok(vec![PagesReader::streamed(pipe, gpu, bos, encoding)?])
            }
        }
    })?;
    let decoders =
        u64::from(encoding != Encoding::Raw) + u64::from(overlays.values().any(|o| o.has_frames()));
    if decoders > 0 {
        make_room_for_zstd(&mut lanes, decoders);
    }
    let (stats, got_hashes) = run_lanes(
        lanes,
        "copied from the pages file",
        |engine, p, input| {
            let mut src = HashingReader {
                inner: input,
                hasher: ExtentHasher::new(p.extent),
            };
            engine.write_bo(&p.bo, &mut src)?;
            Ok(src.hasher.digests())
        },
        |input| input.finish_stream().map(drop).map_err(CopyError::from),
    )?;
    for (index, got) in got_hashes {
        let got = compose(&got);
        let (Some(want), Some(&(gpu, addr, size))) = (hashes.get(&index), names.get(&index)) else {
            continue;
        };
        if want.value != got {
            return Err(CopyError::HashMismatch {
                file: pages_image_name(id, gpu),
                gpu,
                bo: index,
                addr,
                size,
                expected: want.value,
                got,
            });
        }
    }
    Ok(stats)
}

/// Reads exactly `buf.len()` bytes, naming the BO and file on failure.
pub(crate) fn fill_from(
    src: &mut dyn Read,
    buf: &mut [u8],
    bo: &BoRef<'_>,
) -> Result<(), CopyError> {
    src.read_exact(buf).map_err(|source| CopyError::Stream {
        gpu: bo.gpu,
        bo: bo.index,
        file: "pages file".into(),
        op: "read",
        source,
    })
}

/// Writes all of `buf`, naming the BO and file on failure.
pub(crate) fn drain_to(sink: &mut dyn Write, buf: &[u8], bo: &BoRef<'_>) -> Result<(), CopyError> {
    sink.write_all(buf).map_err(|source| CopyError::Stream {
        gpu: bo.gpu,
        bo: bo.index,
        file: "pages file".into(),
        op: "write",
        source,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::BorrowedFd;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::sync::{Arc, Mutex};

    /// A GPU engine that copies with the CPU and logs what it is asked to
    /// do ("copy N", "hdp N" for BO N).
    struct FakeGpu {
        cpu: cpu::CpuEngine,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl FakeGpu {
        fn new() -> (Self, Arc<Mutex<Vec<String>>>) {
            let log = Arc::new(Mutex::new(Vec::new()));
            (
                FakeGpu {
                    cpu: cpu::CpuEngine::new(4096),
                    log: log.clone(),
                },
                log,
            )
        }
    }

    impl CopyEngine for FakeGpu {
        fn name(&self) -> &'static str {
            "fake-gpu"
        }
        fn read_bo(&mut self, bo: &BoRef<'_>, sink: &mut dyn Write) -> Result<(), CopyError> {
            self.log.lock().unwrap().push(format!("copy {}", bo.index));
            self.cpu.read_bo(bo, sink)
        }
        fn write_bo(&mut self, bo: &BoRef<'_>, src: &mut dyn Read) -> Result<(), CopyError> {
            self.log.lock().unwrap().push(format!("copy {}", bo.index));
            self.cpu.write_bo(bo, src)
        }
    }

    impl GpuEngine for FakeGpu {
        fn hdp_barrier(&mut self, bo: &BoRef<'_>) -> Result<(), CopyError> {
            self.log.lock().unwrap().push(format!("hdp {}", bo.index));
            Ok(())
        }
    }

    /// Under `auto` VRAM goes by the GPU engine and GTT by the CPU; under
    /// `cpu` the CPU copies VRAM between two HDP barriers, GTT without.
    #[test]
    fn vram_goes_by_sdma_and_cpu_access_to_vram_is_hdp_bracketed() {
        let dev = device(1 << 20);
        let bo = |index, flags| BoRef {
            index,
            gpu: GpuId(1),
            addr: GpuVa(0x10000 * (index as u64 + 1)),
            size: 4096,
            alloc_flags: flags,
            cpu_map: Some((dev.as_fd(), MmapOffset(4096 * index as u64))),
            dmabuf: Some(dev.as_fd()),
        };
        let vram = bo(0, bo::ALLOC_VRAM | bo::ALLOC_PUBLIC);
        let gtt = bo(1, bo::ALLOC_GTT);
        for (policy, want) in [
            (EnginePolicy::Auto, vec!["copy 0"]),
            (EnginePolicy::Cpu, vec!["hdp 0", "hdp 0"]),
        ] {
            let (gpu, log) = FakeGpu::new();
            let mut e = Engines::new(policy, 4096, Some(Box::new(gpu)));
            for b in [&vram, &gtt] {
                let (kind, ()) = e
                    .with_engine(b, |eng| eng.read_bo(b, &mut io::sink()))
                    .unwrap();
                let expect = if b.index == 0 && policy == EnginePolicy::Auto {
                    EngineKind::Sdma
                } else {
                    EngineKind::Cpu
                };
                assert_eq!(kind, expect, "{policy:?}, BO {}", b.index);
            }
            assert_eq!(*log.lock().unwrap(), want, "{policy:?}");
        }
    }

    /// A memfd of `size` bytes standing in for a render node: BOs live at
    /// byte offsets.
    pub(crate) fn device(size: u64) -> std::fs::File {
        // SAFETY: the name is a valid C string; memfd_create has no other
        // preconditions.
        let fd = unsafe { libc::memfd_create(c"amdgpu-cr-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd was just returned by memfd_create and is owned by no one else.
        let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.set_len(size).unwrap();
        f
    }

    fn bo_ref<'a>(
        cpu: Option<BorrowedFd<'a>>,
        dmabuf: Option<BorrowedFd<'a>>,
        flags: u32,
    ) -> BoRef<'a> {
        BoRef {
            index: 4,
            gpu: GpuId(0x1a2b),
            addr: GpuVa(0x1000),
            size: 4096,
            alloc_flags: flags,
            cpu_map: cpu.map(|fd| (fd, MmapOffset(0))),
            dmabuf,
        }
    }

    #[test]
    fn engine_selection() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let fd = f.as_fd();
        let vram = bo::ALLOC_VRAM;
        use EngineKind::*;
        use EnginePolicy as P;
        // Emulator: no dmabuf → CPU.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), None, vram), true).unwrap(),
            Cpu
        );
        // Hardware (a dmabuf), VRAM → SDMA.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), vram), true).unwrap(),
            Sdma
        );
        // GTT → CPU even with a dmabuf; so is PUBLIC VRAM only without SDMA.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), bo::ALLOC_GTT), true).unwrap(),
            Cpu
        );
        assert_eq!(
            choose_engine(
                P::Auto,
                &bo_ref(Some(fd), Some(fd), vram | bo::ALLOC_PUBLIC),
                true
            )
            .unwrap(),
            Sdma
        );
        // No SDMA on this device → CPU fallback.
        assert_eq!(
            choose_engine(P::Auto, &bo_ref(Some(fd), Some(fd), vram), false).unwrap(),
            Cpu
        );
        assert!(choose_engine(P::Auto, &bo_ref(None, None, vram), true).is_err());
        assert_eq!(
            choose_engine(P::Cpu, &bo_ref(Some(fd), Some(fd), vram), true).unwrap(),
            Cpu
        );
        let e = choose_engine(P::Sdma, &bo_ref(Some(fd), None, vram), true).unwrap_err();
        assert!(
            e.to_string().contains("CRIU_ROCM_COPY_ENGINE=sdma") && e.to_string().contains("BO 4")
        );
        assert!(choose_engine(P::Cpu, &bo_ref(None, Some(fd), vram), true).is_err());
    }

    /// A GPU's BOs split into lanes: contiguous, in bucket order, about
    /// equal in bytes, the CPU window shared out; small or SDMA jobs stay
    /// whole.
    #[test]
    fn lanes_split_a_gpu_by_bytes() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mib = 1u64 << 20;
        let bos: Vec<BoRef<'_>> = [40, 24, 40, 8]
            .iter()
            .enumerate()
            .map(|(i, &m)| BoRef {
                index: i,
                size: m * mib,
                ..bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)
            })
            .collect();
        fn job(bos: Vec<BoRef<'_>>) -> GpuJob<'_> {
            GpuJob {
                user: GpuId(7),
                actual: GpuId(8),
                bos,
                engines: Engines::new(EnginePolicy::Auto, 64 << 20, None),
            }
        }
        let whole = |_| None;
        let lanes = split_job(job(bos.clone()), 2, &whole);
        let idx: Vec<Vec<usize>> = lanes
            .iter()
            .map(|l| l.pieces.iter().map(|p| p.bo.index).collect())
            .collect();
        assert_eq!(idx, vec![vec![0, 1], vec![2, 3]]);
        // The GPU's budget is shared out: each lane maps at most 31 MiB
        // and buffers 1 MiB of the pages file.
        for l in &lanes {
            assert_eq!(l.engines.budget, 32 * mib);
            assert_eq!(l.engines.cpu.as_ref().unwrap().window(), 31 * mib);
            assert_eq!(l.engines.write_buffer(), 1 << 20);
        }
        assert_eq!(
            split_job(job(bos.clone()), 8, &whole).len(),
            3,
            "at least 32 MiB a lane"
        );
        assert_eq!(
            split_job(job(bos[3..].to_vec()), 8, &whole).len(),
            1,
            "small job"
        );
        // Equal BOs and a few small ones: the boundary nearest to half the
        // bytes, not the first BO boundary past it.
        let even: Vec<BoRef<'_>> = [64 * mib, 64 * mib, 64 * mib, 64 * mib, 4096, 65536]
            .iter()
            .enumerate()
            .map(|(i, &size)| BoRef {
                index: i,
                size,
                ..bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)
            })
            .collect();
        let lanes = split_job(job(even), 2, &whole);
        let per_lane: Vec<u64> = lanes.iter().map(|l| l.bytes().unwrap()).collect();
        assert_eq!(per_lane, vec![128 * mib, 128 * mib + 4096 + 65536]);
        let mut with_sdma = job(bos);
        with_sdma.engines.sdma = Some(Box::new(FakeGpu::new().0));
        assert_eq!(
            split_job(with_sdma, 4, &whole).len(),
            1,
            "one SDMA engine per GPU"
        );
    }

    /// One BO larger than its hash extent goes to several lanes in pieces
    /// of extents, each mapped at its own offset; with SDMA, or hashed
    /// whole, it stays in one piece.
    #[test]
    fn a_large_bo_is_shared_out_in_extents() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let mib = 1u64 << 20;
        let big = BoRef {
            index: 3,
            size: 100 * mib,
            addr: GpuVa(0x7000_0000_0000),
            cpu_map: Some((f.as_fd(), MmapOffset(0x1_0000_0000))),
            dmabuf: Some(f.as_fd()),
            ..bo_ref(None, None, bo::ALLOC_VRAM)
        };
        let job = |sdma: bool| GpuJob {
            user: GpuId(7),
            actual: GpuId(8),
            bos: vec![big],
            engines: Engines::new(
                EnginePolicy::Auto,
                64 << 20,
                sdma.then(|| Box::new(FakeGpu::new().0) as Box<dyn GpuEngine>),
            ),
        };
        let extent = |_| Some(32 * mib);
        let lanes = split_job(job(false), 4, &extent);
        let pieces: Vec<Vec<(u64, u64, u64, u64)>> = lanes
            .iter()
            .map(|l| {
                l.pieces
                    .iter()
                    .map(|p| (p.start, p.bo.size, p.bo.addr.0, p.bo.cpu_map.unwrap().1 .0))
                    .collect()
            })
            .collect();
        let (a, m) = (0x7000_0000_0000u64, 0x1_0000_0000u64);
        assert_eq!(
            pieces,
            vec![
                vec![(0, 32 * mib, a, m)],
                vec![(32 * mib, 32 * mib, a + 32 * mib, m + 32 * mib)],
                vec![
                    (64 * mib, 32 * mib, a + 64 * mib, m + 64 * mib),
                    (96 * mib, 4 * mib, a + 96 * mib, m + 96 * mib)
                ],
            ]
        );
        assert!(lanes
            .iter()
            .all(|l| l.pieces.iter().all(|p| p.bo.dmabuf.is_none())));
        assert!(lanes
            .iter()
            .all(|l| l.pieces.iter().all(|p| p.bo.index == 3)));
        let one = split_job(job(true), 4, &extent);
        assert_eq!(
            (one.len(), one[0].pieces.len()),
            (1, 1),
            "SDMA copies it whole"
        );
        assert_eq!(
            one[0].pieces[0].extent,
            Some(32 * mib),
            "still hashed in extents"
        );
        let one = split_job(job(false), 4, &|_| None);
        assert_eq!((one.len(), one[0].pieces.len()), (1, 1), "hashed whole");
        let one = split_job(job(false), 1, &extent);
        assert_eq!(
            (one.len(), one[0].pieces.len()),
            (1, 1),
            "one core: not cut"
        );
    }

    #[test]
    fn lane_ends_are_balanced_and_never_empty() {
        assert_eq!(lane_ends(&[10, 10, 10, 10], 2), vec![2, 4]);
        assert_eq!(lane_ends(&[10, 10, 10, 10, 1], 2), vec![2, 5]);
        assert_eq!(lane_ends(&[100, 1, 1, 1], 2), vec![1, 4]);
        assert_eq!(lane_ends(&[1, 1, 1, 100], 3), vec![2, 3, 4]);
        assert_eq!(lane_ends(&[5, 5], 4), vec![1, 2], "no more lanes than BOs");
        assert_eq!(lane_ends(&[7], 1), vec![1]);
        assert_eq!(lane_ends(&[u64::MAX, u64::MAX, u64::MAX], 3), vec![1, 2, 3]);
    }

    #[test]
    fn stats_throughput() {
        let s = GpuStats {
            user: GpuId(1),
            actual: GpuId(2),
            bos: 1,
            bytes: 2_000_000,
            cpu_bos: 1,
            sdma_bos: 0,
            elapsed: Duration::from_millis(500),
        };
        assert!((s.mb_per_s() - 4.0).abs() < 1e-9);
    }

    /// One GPU (0x1a2b) with one VRAM BO of `size` bytes at `off` of `dev`,
    /// copied by the CPU engine.
    fn one_vram_bo(dev: BorrowedFd<'_>, off: u64, size: u64) -> Vec<GpuJob<'_>> {
        let gpu = GpuId(0x1a2b);
        vec![GpuJob {
            user: gpu,
            actual: gpu,
            bos: vec![BoRef {
                index: 0,
                gpu,
                addr: GpuVa(0x7000_0000_0000),
                size,
                alloc_flags: bo::ALLOC_VRAM,
                cpu_map: Some((dev, MmapOffset(off))),
                dmabuf: None,
            }],
            engines: Engines::new(EnginePolicy::Auto, 64 << 20, None),
        }]
    }

    /// A compressed dump in two lanes: every chunk's record in order (the
    /// file reads back whole), zero chunks as bare records, the hashes
    /// those of the uncompressed dump; then restored in lanes.
    #[test]
    fn a_compressed_dump_in_lanes_round_trips() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 9 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size)
            .map(|x| (x % 251) as u8 ^ (x >> 21) as u8)
            .collect();
        let e = CONTENT_EXTENT as usize;
        data[3 * e..4 * e].fill(0);
        dev.write_all_at(&data, off).unwrap();
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let plain = dump_contents(&tempdir(), FileId(3), jobs()).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(
            &dir,
            FileId(3),
            jobs(),
            Some((3, Some(2))),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(out.hashes, plain.hashes, "hashed as the uncompressed dump");
        assert_eq!(out.extents, plain.extents);
        let enc = Encoding::Zstd {
            level: 3,
            chunk: CONTENT_EXTENT,
        };
        assert_eq!(out.encoding, enc);
        let gpu = GpuId(0x1a2b);
        let len = std::fs::metadata(dir.join(pages_image_name(FileId(3), gpu)))
            .unwrap()
            .len();
        assert!(len < size / 4, "compressed to {len} of {size}");
        let bos = [(0usize, size)];
        let mut r = PagesReader::open_encoded(&dir, FileId(3), gpu, &bos, enc, None).unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).unwrap();
        assert!(back == data, "the records are in chunk order");
        dev.write_all_at(&vec![0xee; size as usize], off).unwrap();
        restore_contents_encoded(&dir, FileId(3), jobs(), &out.hashes, enc, &BTreeMap::new())
            .unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == data, "every byte comes back");
    }

    /// A budget too small for a compressor at the level asked for lowers
    /// the lanes, then the level; one too small for any is refused naming
    /// the knob.  An incremental dump's lanes want a chunk's window (no
    /// other buffer), else fall back to the least window.
    #[test]
    fn the_compressors_fit_in_the_budget() {
        use crate::pages::zstd::{compressor_memory, CHUNK};
        let lane = |l| compressor_memory(l) + MIN_ZSTD_WINDOW;
        assert_eq!(zstd_lanes(64 << 20, 2, 3, false), Some((2, 3)));
        assert_eq!(zstd_lanes(lane(3) + 4096, 2, 3, false), Some((1, 3)));
        assert_eq!(zstd_lanes(lane(3) - 4096, 1, 3, false), Some((1, 2)));
        assert_eq!(zstd_lanes(lane(1) - 4096, 1, 3, false), None);
        assert!(lane(19) > lane(3) && lane(3) > lane(1));
        let whole = |l| compressor_memory(l) + CHUNK;
        assert_eq!(zstd_lanes(2 * whole(3), 2, 3, true), Some((2, 3)));
        assert_eq!(zstd_lanes(2 * whole(3) - 4096, 2, 3, true), Some((1, 3)));
        assert_eq!(zstd_lanes(whole(1) - 4096, 1, 1, true), Some((1, 1)));
        assert_eq!(zstd_lanes(lane(1) - 4096, 1, 1, true), None);
        let f = std::fs::File::open("/dev/null").unwrap();
        let job = GpuJob {
            user: GpuId(7),
            actual: GpuId(7),
            bos: vec![bo_ref(Some(f.as_fd()), None, bo::ALLOC_VRAM)],
            engines: Engines::new(EnginePolicy::Auto, 1 << 20, None),
        };
        let e = dump_contents_encoded(
            &crate::image::tests::tempdir(),
            FileId(1),
            vec![job],
            Some((3, None)),
            &BTreeMap::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("KFD_MAX_BUFFER_SIZE"), "{e}");
    }

    /// A chain of four dumps of one BO, uncompressed and compressed in
    /// turn, each changing one extent: each link leaves the others to its
    /// parents, and every link restores through [`chain::resolve`] (its
    /// extents read from plain and compressed ancestors alike).
    #[test]
    fn a_mixed_chain_of_compressed_and_plain_dumps_restores() {
        use crate::image::tests::{sample_kfd, tempdir};
        use crate::image::KfdImage;
        use crate::validate::chain;
        use crate::validate::digests::{self, Digests};
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 5 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 253) as u8 | 1).collect();
        let gpu = GpuId(0x1a2b);
        let id = FileId(5);
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let root = tempdir();
        let mut prev: Option<(std::path::PathBuf, DumpOutcome)> = None;
        let mut links = Vec::new();
        for (n, compress) in [None, Some(3), None, Some(1)].into_iter().enumerate() {
            let e = CONTENT_EXTENT as usize;
            if n > 0 {
                data[n * e + 5] ^= 0x5a;
            }
            dev.write_all_at(&data, off).unwrap();
            let dir = root.join(format!("l{n}"));
            std::fs::create_dir(&dir).unwrap();
            let parent: ParentDigests = match &prev {
                Some((pdir, p)) => {
                    std::os::unix::fs::symlink(pdir, dir.join(chain::PARENT_LINK)).unwrap();
                    BTreeMap::from([(0, p.extents[&0].clone())])
                }
                None => BTreeMap::new(),
            };
            let out =
                dump_contents_encoded(&dir, id, jobs(), compress.map(|l| (l, Some(2))), &parent)
                    .unwrap();
            if n > 0 {
                let mut want: Vec<u64> = (0..6).filter(|&k| k != n as u64).collect();
                want.sort_unstable();
                assert_eq!(out.inherited, BTreeMap::from([(0, want)]), "link {n}");
                // Only the changed chunk is compressed (or copied):
                // `written` counts the bytes given to the compressors.
                assert_eq!(out.written, CONTENT_EXTENT, "link {n}: bytes written");
            }
            let mut m = sample_kfd();
            m.device_entries.truncate(2);
            m.num_of_gpus = 1;
            m.bo_entries.truncate(1);
            m.num_of_bos = 1;
            let b = &mut m.bo_entries[0];
            b.addr = 0x7000_0000_0000;
            b.size = size;
            b.alloc_flags = bo::ALLOC_VRAM;
            b.content_xxh3 = Some(out.hashes[&0].value);
            b.content_hash_extent = Some(CONTENT_EXTENT);
            b.content_extent_xxh3 = out.extents[&0].clone();
            if let Some(ks) = out.inherited.get(&0) {
                b.parent_extents = Some(chain::bitmap(ks));
                b.parent_bo = Some(0);
                m.criu_rocm_parent = Some(crate::image::kfd_image_name(id));
            }
            out.encoding.record(&mut m);
            let image = KfdImage { msg: m };
            image.write(&dir, id).unwrap();
            let mut d = Digests::default();
            d.add_kfd_in(&dir, id, &image);
            std::fs::write(dir.join(digests::FILE), d.encode()).unwrap();
            links.push((dir.clone(), image, out.clone(), data.clone()));
            prev = Some((dir, out));
        }
        let compressed = std::fs::metadata(links[3].0.join(pages_image_name(id, gpu)))
            .unwrap()
            .len();
        assert!(
            compressed < size / 4,
            "the compressed child is {compressed} bytes"
        );
        for (n, (dir, image, out, want)) in links.iter().enumerate() {
            let overlays = chain::resolve(dir, id, image).unwrap();
            assert_eq!(overlays.is_empty(), n == 0, "link {n}");
            dev.write_all_at(&vec![0; size as usize], off).unwrap();
            restore_contents_encoded(dir, id, jobs(), &out.hashes, out.encoding, &overlays)
                .unwrap_or_else(|e| panic!("link {n}: {e}"));
            let mut back = vec![0; size as usize];
            dev.read_exact_at(&mut back, off).unwrap();
            assert!(back == *want, "link {n}: every byte comes back");
        }
        // Without its ancestors' extents the last link's hash check fails.
        let (dir, _, out, _) = &links[3];
        let e =
            restore_contents_encoded(dir, id, jobs(), &out.hashes, out.encoding, &BTreeMap::new())
                .unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { .. }), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A compressed incremental dump under a budget whose copy window is
    /// smaller than a chunk: the chunks come in parts and are compressed
    /// whole, unchanged or not (nothing held back outside the budget), and
    /// the dump restores on its own.
    #[test]
    fn a_compressed_incremental_dump_with_a_window_below_a_chunk_compresses_everything() {
        use crate::image::tests::tempdir;
        use crate::pages::zstd::{compressor_memory, CHUNK};
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 3 * CHUNK);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let budget = compressor_memory(1) + MIN_ZSTD_WINDOW + 4096;
        assert_eq!(zstd_lanes(budget, 1, 1, true), Some((1, 1)));
        let jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines = Engines::new(EnginePolicy::Auto, budget, None);
            j
        };
        let z = Some((1, Some(1)));
        let parent =
            dump_contents_encoded(&tempdir(), FileId(1), jobs(), z, &BTreeMap::new()).unwrap();
        assert_eq!(parent.written, size);
        data[(CHUNK + 7) as usize] ^= 0xff;
        dev.write_all_at(&data, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), z, &parent.extents).unwrap();
        assert_eq!(out.written, size, "every chunk compressed");
        assert!(out.inherited.is_empty(), "{:?}", out.inherited);
        assert_eq!(out.extents[&0].len(), 3, "still hashed in chunks");
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_contents_encoded(
            &dir,
            FileId(2),
            jobs(),
            &out.hashes,
            out.encoding,
            &BTreeMap::new(),
        )
        .unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == data, "every byte comes back");
    }

    /// Restores the uncompressed incremental dump `out` of one BO of `size`
    /// bytes (KFD file 2 in `dir`), its extents `kept` read through an
    /// overlay of the parent's pages file (KFD file 1 in `parent_dir`).
    fn restore_over_parent(
        dir: &Path,
        parent_dir: &Path,
        gpu: GpuId,
        size: u64,
        kept: &[u64],
        jobs: Vec<GpuJob<'_>>,
        out: &DumpOutcome,
    ) -> Result<(), CopyError> {
        use crate::pages::Overlay;
        let src = std::sync::Arc::new(
            std::fs::File::open(parent_dir.join(pages_image_name(FileId(1), gpu))).unwrap(),
        );
        let mut o = Overlay::default();
        for &k in kept {
            let start = 8 + k * CONTENT_EXTENT;
            let len = CONTENT_EXTENT.min(size - k * CONTENT_EXTENT);
            o.push(start, len, src.clone(), start);
        }
        o.finish();
        let overlays = BTreeMap::from([(gpu, std::sync::Arc::new(o))]);
        restore_contents_encoded(dir, FileId(2), jobs, &out.hashes, Encoding::Raw, &overlays)
            .map(drop)
    }

    /// A BO of `size` bytes dumped whole, then (after the extents
    /// `changed` changed) incrementally against that dump with a memory
    /// budget of `budget`; restored from the incremental dump through an
    /// overlay of the parent's pages file, every byte checked.  Gives the
    /// incremental dump's outcome and its pages file's disk bytes.
    fn incremental_round_trip(size: u64, changed: &[u64], budget: u64) -> (DumpOutcome, u64) {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::{FileExt, MetadataExt};

        let off = 1u64 << 20;
        let dev = device(off + size);
        let data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines = Engines::new(EnginePolicy::Auto, budget, None);
            j
        };
        let parent_dir = tempdir();
        let parent = dump_contents(&parent_dir, FileId(1), jobs()).unwrap();
        let mut now = data;
        for &k in changed {
            now[(k * CONTENT_EXTENT + 7) as usize] ^= 0xff;
        }
        dev.write_all_at(&now, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), None, &parent.extents).unwrap();
        let pages = dir.join(pages_image_name(FileId(2), gpu));
        let disk = std::fs::metadata(&pages).unwrap().blocks() * 512;
        let kept: Vec<u64> = out.inherited.get(&0).cloned().unwrap_or_default();
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_over_parent(&dir, &parent_dir, gpu, size, &kept, jobs(), &out).unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == now, "every byte comes back");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&parent_dir).unwrap();
        (out, disk)
    }

    /// An incremental dump writes the changed extents and nothing of the
    /// others, whichever lane hashes them (a BO cut into pieces at 32 MiB
    /// when there are cores to spare), the last, shorter extent included:
    /// the bytes written and the pages file's disk blocks are those of the
    /// changed extents (and of the file blocks they share with the holes
    /// beside them), every other extent is left to the parent.
    #[test]
    fn an_incremental_dump_writes_only_changed_extents() {
        let size = 2 * HASH_EXTENT + (3 << 20);
        let n = size.div_ceil(CONTENT_EXTENT);
        let last = n - 1;
        let changed = [0, HASH_EXTENT / CONTENT_EXTENT, last];
        let (out, disk) = incremental_round_trip(size, &changed, 64 << 20);
        let want = 2 * CONTENT_EXTENT + (size - last * CONTENT_EXTENT);
        assert_eq!(out.written, want, "bytes written");
        let kept: Vec<u64> = (0..n).filter(|k| !changed.contains(k)).collect();
        assert_eq!(out.inherited, BTreeMap::from([(0, kept)]));
        let slack = 2 * changed.len() as u64 * crate::pages::SPARSE_BLOCK;
        assert!(
            disk <= want + slack,
            "{disk} bytes on disk for {want} written"
        );
        assert_eq!(out.stats[0].bytes, size, "every byte hashed");
    }

    /// A memory budget whose copy window is smaller than an extent: the
    /// extents that come in parts are written whole, unchanged or not,
    /// without holding an extent back (the last, of a page, fits a window
    /// and is left to the parent); the dump still restores.
    #[test]
    fn an_incremental_dump_under_a_budget_below_an_extent_writes_everything() {
        let size = 3 * CONTENT_EXTENT + 4096;
        let budget = CONTENT_EXTENT / 2;
        assert!(env::lane_split(budget).0 < CONTENT_EXTENT);
        let (out, _) = incremental_round_trip(size, &[1], budget);
        assert_eq!(out.written, 3 * CONTENT_EXTENT);
        assert_eq!(out.inherited, BTreeMap::from([(0, vec![3])]));
        assert_eq!(out.extents[&0].len(), 4, "still hashed in extents");
    }

    /// An incremental dump leaves out (as holes) the extents whose digest
    /// is the parent's, and lists them; the restore reads those from the
    /// parent's pages file through an overlay and gets every byte back.
    #[test]
    fn an_incremental_dump_leaves_unchanged_extents_to_its_parent() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let (off, size) = (1u64 << 20, 4 * CONTENT_EXTENT + 4096);
        let dev = device(off + size);
        let data: Vec<u8> = (0..size).map(|x| (x % 253) as u8 | 1).collect();
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let parent_dir = tempdir();
        let parent = dump_contents(&parent_dir, FileId(1), jobs()).unwrap();
        // Extent 2 changes after the parent.
        let mut now = data.clone();
        now[(2 * CONTENT_EXTENT + 7) as usize] ^= 0xff;
        dev.write_all_at(&now, off).unwrap();
        let dir = tempdir();
        let out = dump_contents_encoded(&dir, FileId(2), jobs(), None, &parent.extents).unwrap();
        assert_eq!(out.inherited, BTreeMap::from([(0, vec![0, 1, 3, 4])]));
        assert_eq!(out.written, CONTENT_EXTENT, "only extent 2 is written");
        assert_eq!(out.hashes[&0].value, compose(&out.extents[&0]));
        let pages = dir.join(pages_image_name(FileId(2), gpu));
        let f = std::fs::read(&pages).unwrap();
        assert_eq!(f.len() as u64, 8 + size, "the layout is kept");
        let e = CONTENT_EXTENT as usize;
        assert!(f[8..8 + e].iter().all(|&b| b == 0), "extent 0 is left out");
        assert_eq!(
            f[8 + 2 * e..8 + 3 * e],
            now[2 * e..3 * e],
            "extent 2 is written"
        );
        // Restore: the left-out extents from the parent's file.
        dev.write_all_at(&vec![0; size as usize], off).unwrap();
        restore_over_parent(&dir, &parent_dir, gpu, size, &[0, 1, 3, 4], jobs(), &out).unwrap();
        let mut back = vec![0; size as usize];
        dev.read_exact_at(&mut back, off).unwrap();
        assert!(back == now, "every byte comes back");
        // Without the parent's extents the hash check fails.
        let e = restore_contents(&dir, FileId(2), jobs(), &out.hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { .. }), "{e}");
    }

    /// A pre-dump copies while the process writes its BOs: whatever bytes
    /// a live engine saves, the digests it records are theirs (an extent
    /// recorded with another's digest would later be taken for unchanged,
    /// and the parent's stale bytes restored in its place), plain and
    /// incremental, with a block that flips between zero and not.
    #[test]
    fn a_live_dump_records_the_digests_of_the_bytes_it_saves() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::{AtomicBool, Ordering};
        use xxhash_rust::xxh3::xxh3_64;

        let (off, size) = (1u64 << 20, 3 * CONTENT_EXTENT);
        let dev = device(off + size);
        let mut data: Vec<u8> = (0..size).map(|x| (x % 251) as u8 | 1).collect();
        let zero_block = (CONTENT_EXTENT + 8192) as usize;
        data[zero_block..zero_block + 4096].fill(0);
        dev.write_all_at(&data, off).unwrap();
        let gpu = GpuId(0x1a2b);
        let live_jobs = || {
            let mut j = one_vram_bo(dev.as_fd(), off, size);
            j[0].engines.set_live();
            j
        };
        let stop = AtomicBool::new(false);
        let writer = dev.try_clone().unwrap();
        // Stops the writing thread however the checks end (a failed assert
        // would otherwise wait for it for ever).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            let _stop = Stop(&stop);
            s.spawn(|| {
                // One byte of each extent, and one of the zero block, flipping.
                let mut b = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    b = b.wrapping_add(1);
                    for at in [7, CONTENT_EXTENT + 11, 2 * CONTENT_EXTENT + 13] {
                        writer.write_all_at(&[b | 1], off + at).unwrap();
                    }
                    writer
                        .write_all_at(&[b & 1], off + zero_block as u64 + 100)
                        .unwrap();
                }
            });
            let check = |dir: &std::path::Path, id: FileId, out: &DumpOutcome| {
                let f = std::fs::read(dir.join(pages_image_name(id, gpu))).unwrap();
                let e = CONTENT_EXTENT as usize;
                let inherited = out.inherited.get(&0).cloned().unwrap_or_default();
                for (k, &d) in out.extents[&0].iter().enumerate() {
                    if inherited.contains(&(k as u64)) {
                        continue;
                    }
                    let saved = &f[8 + k * e..8 + (k + 1) * e];
                    assert_eq!(
                        d,
                        xxh3_64(saved),
                        "extent {k}: its digest is of other bytes"
                    );
                }
            };
            for round in 0..20 {
                let dir = tempdir();
                let out = dump_contents(&dir, FileId(1), live_jobs()).unwrap();
                check(&dir, FileId(1), &out);
                let idir = tempdir();
                let inc = dump_contents_encoded(&idir, FileId(2), live_jobs(), None, &out.extents)
                    .unwrap();
                check(&idir, FileId(2), &inc);
                assert!(round < 19 || inc.written > 0, "the flipping bytes are seen");
            }
        });
    }

    /// A BO of three hash extents: dumped and restored (in pieces when
    /// there are cores to spare), its hash composed from the extents'; an
    /// image hashing it whole restores too; a flipped byte in its second
    /// extent fails the restore.
    #[test]
    fn a_bo_of_several_extents_round_trips() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;
        use xxhash_rust::xxh3::xxh3_64;

        let (off, size) = (1u64 << 20, 2 * HASH_EXTENT + (5 << 20));
        let dev = device(off + size);
        let data: Vec<u8> = (0..size)
            .map(|x| (x % 251) as u8 ^ (x >> 20) as u8)
            .collect();
        dev.write_all_at(&data, off).unwrap();
        let jobs = || one_vram_bo(dev.as_fd(), off, size);
        let dir = tempdir();
        let out = dump_contents(&dir, FileId(3), jobs()).unwrap();
        let by_hand: Vec<u64> = data.chunks(CONTENT_EXTENT as usize).map(xxh3_64).collect();
        assert_eq!(by_hand.len() as u64, size.div_ceil(CONTENT_EXTENT));
        let want = ContentHash {
            value: compose(&by_hand),
            extent: Some(CONTENT_EXTENT),
        };
        assert_eq!(out.extents, BTreeMap::from([(0, by_hand.clone())]));
        assert_eq!(out.hashes, BTreeMap::from([(0, want)]));
        assert_eq!((out.stats[0].bos, out.stats[0].bytes), (1, size));
        let pages = std::fs::read(dir.join(pages_image_name(FileId(3), GpuId(0x1a2b)))).unwrap();
        assert!(pages[8..] == data[..], "pages file holds the BO in order");

        let wipe = || dev.write_all_at(&vec![0; size as usize], off).unwrap();
        let back = || {
            let mut b = vec![0; size as usize];
            dev.read_exact_at(&mut b, off).unwrap();
            b == data
        };
        wipe();
        let stats = restore_contents(&dir, FileId(3), jobs(), &out.hashes).unwrap();
        assert_eq!((stats[0].bos, stats[0].bytes), (1, size));
        assert!(back());
        // An image from before extents: the plain hash, the BO copied whole.
        wipe();
        let whole = ContentHash {
            value: xxh3_64(&data),
            extent: None,
        };
        restore_contents(&dir, FileId(3), jobs(), &BTreeMap::from([(0, whole)])).unwrap();
        assert!(back());
        // The composed hash read as a whole-BO one does not match.
        let misread = ContentHash {
            extent: None,
            ..want
        };
        let e =
            restore_contents(&dir, FileId(3), jobs(), &BTreeMap::from([(0, misread)])).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 0, .. }), "{e}");

        let path = dir.join(pages_image_name(FileId(3), GpuId(0x1a2b)));
        let mut bytes = pages;
        bytes[8 + HASH_EXTENT as usize + 7] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = restore_contents(&dir, FileId(3), jobs(), &out.hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 0, .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Two GPUs, each a memfd "render node" holding its BOs; dump both in
    /// parallel, wipe the memory, restore, compare; then corrupt a pages
    /// file and see the hash check fail.
    #[test]
    fn parallel_dump_and_restore_with_hashes() {
        use crate::image::tests::tempdir;
        use std::os::unix::fs::FileExt;

        let devs = [device(64 << 20), device(64 << 20)];
        let gpus = [GpuId(0x1a2b), GpuId(0x5c3d)];
        // (gpu index, offset, size, bucket index)
        let layout = [
            (0, 0x10_0000u64, 3 * 4096u64, 0usize),
            (1, 0x20_0000, 5 << 20, 1),
            (0, 0x80_0000, 4096, 2),
        ];
        let fill = |seed: u8| {
            for &(g, off, size, i) in &layout {
                let data: Vec<u8> = (0..size)
                    .map(|x| (x as u8) ^ seed ^ (i as u8 * 17))
                    .collect();
                devs[g].write_all_at(&data, off).unwrap();
            }
        };
        let jobs = |policy| -> Vec<GpuJob<'_>> {
            (0..2)
                .map(|g| GpuJob {
                    user: gpus[g],
                    actual: GpuId(0x100 + g as u32),
                    bos: layout
                        .iter()
                        .filter(|l| l.0 == g)
                        .map(|&(_, off, size, i)| BoRef {
                            index: i,
                            gpu: gpus[g],
                            addr: GpuVa(off),
                            size,
                            alloc_flags: bo::ALLOC_VRAM,
                            cpu_map: Some((devs[g].as_fd(), MmapOffset(off))),
                            dmabuf: None,
                        })
                        .collect(),
                    engines: Engines::new(policy, 1 << 20, None),
                })
                .collect()
        };
        let dir = tempdir();
        fill(0x3c);
        let out = dump_contents(&dir, FileId(8), jobs(EnginePolicy::Auto)).unwrap();
        assert_eq!(out.hashes.len(), 3);
        assert_eq!(out.stats.len(), 2);
        assert_eq!(
            (out.stats[0].bos, out.stats[0].bytes, out.stats[0].cpu_bos),
            (2, 4 * 4096, 2)
        );
        assert_eq!(out.stats[1].bytes, 5 << 20);
        let pages = std::fs::read(dir.join(pages_image_name(FileId(8), gpus[0]))).unwrap();
        assert_eq!(u64::from_le_bytes(pages[..8].try_into().unwrap()), 4 * 4096);
        let mut bo2 = vec![0; 4096];
        devs[0].read_exact_at(&mut bo2, 0x80_0000).unwrap();
        assert_eq!(
            &pages[8 + 3 * 4096..],
            &bo2[..],
            "bucket order within the file"
        );

        fill(0);
        let hashes = out.hashes.clone();
        let stats = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap();
        assert_eq!(stats.len(), 2);
        let again = dump_contents(&tempdir(), FileId(8), jobs(EnginePolicy::Cpu)).unwrap();
        assert_eq!(again.hashes, out.hashes);

        // Flip one byte of BO 1's saved contents.
        let path = dir.join(pages_image_name(FileId(8), gpus[1]));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8 + 12345] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap_err();
        assert!(matches!(e, CopyError::HashMismatch { bo: 1, .. }), "{e}");
        // Forcing SDMA without an SDMA engine is an error naming the knob.
        let e = dump_contents(&dir, FileId(9), jobs(EnginePolicy::Sdma)).unwrap_err();
        assert!(e.to_string().contains("CRIU_ROCM_COPY_ENGINE"), "{e}");
        // A missing pages file names the file.
        std::fs::remove_file(&path).unwrap();
        let e = restore_contents(&dir, FileId(8), jobs(EnginePolicy::Auto), &hashes).unwrap_err();
        assert!(
            e.to_string()
                .contains(&pages_image_name(FileId(8), gpus[1])),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
