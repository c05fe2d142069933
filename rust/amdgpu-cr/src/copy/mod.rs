//! Moving BO contents between GPU memory and the pages files.
//!
//! Two engines implement [`CopyEngine`]:
//! * [`cpu::CpuEngine`] maps the BO through a device fd (the render-node
//!   file that owns it at its mmap offset, or else its dmabuf) in windows
//!   of at most the staging size and copies with the CPU.  It works for GTT BOs and for VRAM BOs allocated with KFD's
//!   PUBLIC flag (the others may lie past the CPU-visible BAR, where a
//!   touch faults), and on the emulator.
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
//!
//! The parts, one concern each: `engine.rs` (which engine copies a BO),
//! `extents.rs` (pieces of BOs and the hashing on the way), `lanes.rs` (a
//! GPU's work shared out among threads), `budget.rs` (the memory budget's
//! share-out), `dump.rs` and `compressed.rs` (plain and zstd pages files),
//! `restore.rs`; the engines themselves in [`cpu`], [`sdma`] and [`drm`].

mod budget;
mod compressed;
pub mod cpu;
pub mod drm;
mod dump;
mod engine;
mod extents;
mod lanes;
mod restore;
pub mod sdma;

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::time::Duration;

pub use crate::pages::{ContentHash, HASH_EXTENT};
pub use budget::{zstd_lanes, MIN_ZSTD_WINDOW};
pub use compressed::dump_compressed;
pub use dump::{dump_contents, dump_contents_encoded};
pub use engine::{choose_engine, EngineKind, Engines};
pub use lanes::MIN_LANE_BYTES;
pub use restore::{
    restore_contents, restore_contents_encoded, restore_contents_from, restore_contents_streamed,
    PagesFrom,
};

use crate::ids::{GpuId, GpuVa, MmapOffset};
use crate::image::ImageError;
use crate::pages::Encoding;

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
    ///
    /// [`CONTENT_EXTENT`]: crate::pages::CONTENT_EXTENT
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
///
/// [`CONTENT_EXTENT`]: crate::pages::CONTENT_EXTENT
pub type ParentDigests = BTreeMap<usize, Vec<u64>>;

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
    //! Helpers for the tests of copy/'s parts, and what they all use.
    pub(crate) use super::*;
    pub(crate) use crate::bo;
    pub(crate) use crate::env::{self, EnginePolicy};
    pub(crate) use crate::ids::{GpuVa, MmapOffset};
    pub(crate) use crate::image::FileId;
    pub(crate) use crate::pages::{compose, pages_image_name, PagesReader, CONTENT_EXTENT};
    pub(crate) use std::os::fd::{AsFd, BorrowedFd};
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::{Arc, Mutex};

    /// A GPU engine that copies with the CPU and logs what it is asked to
    /// do ("copy N", "hdp N" for BO N).
    pub(crate) struct FakeGpu {
        cpu: cpu::CpuEngine,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl FakeGpu {
        pub(crate) fn new() -> (Self, Arc<Mutex<Vec<String>>>) {
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

    pub(crate) fn bo_ref<'a>(
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
    pub(crate) fn one_vram_bo(dev: BorrowedFd<'_>, off: u64, size: u64) -> Vec<GpuJob<'_>> {
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
}
