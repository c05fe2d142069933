//! The GPU side of one CRIU run: what the hooks do, in the order CRIU calls
//! them, with the state that has to live between two hooks.
//!
//! * [`dump::DumpSession`] lives in criu main during `criu dump`: it pauses
//!   every KFD process of the frozen tree before CRIU reads memory, writes
//!   the images when CRIU dumps the device files, checks that nothing paused
//!   was left out, and unpauses on every path that lets the tree run again.
//!   Should criu main die first, [`signals`] (SIGTERM, SIGINT, SIGHUP,
//!   SIGPIPE) and the [`guardian`] process (anything else, SIGKILL
//!   included) unpause what it left paused.
//! * [`restore::RestoreSession`] lives in each restored task (it runs the
//!   device-file and VMA hooks there and hands the task's GPU memory to the
//!   writer); the task resumes its own queues at its restorer's gate
//!   ([`writer`]), and [`restore::check_outcomes`] in criu main checks every
//!   task's outcome before any task may run.
//!
//! The C boundary (`criu-gpu`) only translates arguments into these calls.

pub(crate) mod contexts;
pub(crate) mod dmabuf;
pub(crate) mod dmabuf_fd;
pub mod dump;
pub(crate) mod gem;
pub mod gpu_check;
pub mod guardian;
pub(crate) mod kfd_import;
mod render_gpu;
// Below the session: validation reads the mark too.
pub use crate::incomplete;
pub use crate::units::human_bytes;
pub mod restore;
pub mod signals;
pub mod streamed;
pub mod writer;
pub mod xproc;

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::copy::{drm::sdma_for, Engines, GpuJob};
use crate::env::{self, EnginePolicy};
use crate::image::FileId;
use crate::plan::GpuWork;
use crate::validate::chain;

/// How criu main's log reaches a helper process (criu re-executed: the
/// GPU memory writer, the GPU guardian): its fd and the boundary's
/// settings for it, passed through as arguments.
#[derive(Clone, Copy, Debug)]
pub struct HelperLog<'a> {
    pub fd: Option<BorrowedFd<'a>>,
    pub args: &'a [String],
}

/// A helper mode this program was executed in (`argv[1]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelperMode {
    /// The GPU memory writer of a restore.
    Writer(writer::WriterArgs),
    /// The GPU guardian of a dump.
    Guardian(guardian::GuardianArgs),
}

impl HelperMode {
    /// The helper mode `argv` (`argv[0]` included) names, `None` when this
    /// program runs as itself; `Some(Err)`: a helper mode with bad
    /// arguments.
    pub fn parse(argv: &[&[u8]]) -> Option<Result<HelperMode, String>> {
        if let Some(w) = writer::WriterArgs::parse(argv) {
            return Some(w.map(HelperMode::Writer));
        }
        guardian::GuardianArgs::parse(argv).map(|g| g.map(HelperMode::Guardian))
    }

    /// The helper's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            HelperMode::Writer(_) => "GPU memory writer",
            HelperMode::Guardian(_) => "GPU guardian",
        }
    }

    /// CRIU's log fd it was handed, and the settings for it.
    pub fn log(&self) -> (Option<std::os::fd::RawFd>, &[String]) {
        match self {
            HelperMode::Writer(a) => (a.log_fd, &a.log_args),
            HelperMode::Guardian(a) => (a.log_fd, &a.log_args),
        }
    }

    /// Runs the helper (logging set up by the caller); its exit status.
    pub fn run(&self) -> i32 {
        match self {
            HelperMode::Writer(a) => writer::writer_main(a),
            HelperMode::Guardian(a) => guardian::guardian_main(a),
        }
    }
}

/// Failures of a hook, with the process, GPU, file and step they concern.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A KFD or render-node ioctl failed.
    #[error("pid {pid}: {step}: {source}")]
    Kfd {
        pid: i32,
        step: String,
        source: kfd_abi::handle::Error,
    },
    /// A system call around the devices failed.
    #[error("pid {pid}: {step}: {source}")]
    Os {
        pid: i32,
        step: String,
        source: std::io::Error,
    },
    /// The core refused (image, topology, match, plan or copy), for a
    /// process.
    #[error("pid {pid}: {step}: {source}")]
    Core {
        pid: i32,
        step: String,
        source: crate::Error,
    },
    /// Any other inconsistency, in words.
    #[error("pid {pid}: {what}")]
    State { pid: i32, what: String },
    /// The GPU memory writer (process `pid`) failed or died.
    #[error("the GPU memory writer (pid {pid}) {what}")]
    Writer { pid: i32, what: String },
    /// The file waits for GPU file `file`, which the task has not
    /// restored yet (CRIU retries it after the task's other files).
    #[error("pid {pid}: {what}, which this task has not restored yet")]
    Waits {
        pid: i32,
        file: FileId,
        what: String,
    },
}

impl SessionError {
    /// The positive errno for the C boundary.
    pub fn errno(&self) -> i32 {
        match self {
            SessionError::Kfd { source, .. } => source.errno(),
            SessionError::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            SessionError::Core { source, .. } => source.errno(),
            SessionError::State { .. } => libc::EINVAL,
            SessionError::Writer { .. } => libc::EIO,
            SessionError::Waits { .. } => libc::EAGAIN,
        }
    }

    pub(crate) fn core(pid: i32, step: impl Into<String>, e: impl Into<crate::Error>) -> Self {
        SessionError::Core {
            pid,
            step: step.into(),
            source: e.into(),
        }
    }
}

/// Lists the KFD images (`amdgpu-kfd-<id>.img`) in an image directory, by
/// file id, in id order.
pub fn kfd_image_ids(dir: &Path) -> std::io::Result<Vec<FileId>> {
    image_ids(dir, crate::image::kfd_image_id)
}

/// Lists the render images (`amdgpu-renderD-<id>.img`) in an image
/// directory, by file id, in id order.
pub fn render_image_ids(dir: &Path) -> std::io::Result<Vec<FileId>> {
    image_ids(dir, crate::image::render_image_id)
}

/// The file ids of the names in `dir` that `id_of` takes, in id order.
fn image_ids(dir: &Path, id_of: fn(&str) -> Option<FileId>) -> std::io::Result<Vec<FileId>> {
    let mut ids = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let name = ent?.file_name();
        let Some(id) = name.to_str().and_then(id_of) else {
            continue;
        };
        ids.push(id);
    }
    ids.sort_by_key(|i| i.0);
    Ok(ids)
}

/// The copy engines of one GPU worker, within `share` bytes of the
/// budget: always the CPU engine; an SDMA engine on a fresh render-node fd
/// of that GPU (a VM of its own), its staging buffer taking up to half the
/// share, when KFD exported dmabufs for its BOs (real hardware) and the
/// policy copies by SDMA, or, under `cpu`, when VRAM BOs need its HDP
/// barriers.  A set-up failure (no DMA ring taking user submissions, a
/// refused NOP IB, ...) is logged with its reason and the CPU copies;
/// under `sdma` it is the caller's error, naming the GPU and the reason.
fn engines_for<'a>(
    pid: i32,
    policy: EnginePolicy,
    share: u64,
    work: &GpuWork,
    has_dmabufs: bool,
    has_vram: bool,
) -> Result<Engines<'a>, SessionError> {
    let staging = env::staging_size(Some((share / 2).max(crate::bo::PAGE_SIZE)), work.largest);
    // Under `cpu` the SDMA engine is still wanted for the HDP barriers
    // around CPU access to VRAM (see `copy`).
    let want_sdma = has_dmabufs && (policy != EnginePolicy::Cpu || has_vram);
    let sdma = if want_sdma {
        let made = kfd_abi::handle::RenderNode::open(work.render_minor)
            .map_err(|e| crate::copy::CopyError::Setup {
                gpu: work.actual,
                what: format!("opening {}: {e}", work.render_minor.path()),
            })
            .and_then(|node| sdma_for(node.as_fd(), work.actual, staging, work.largest, &[]));
        match made {
            Ok(e) => Some(e),
            Err(e) if policy == EnginePolicy::Sdma => {
                return Err(SessionError::core(pid, "setting up SDMA", e))
            }
            Err(e) if policy == EnginePolicy::Auto => {
                log::warn!(
                    "pid {pid}: GPU {}: no SDMA engine ({e}); copying with the CPU{}",
                    work.user,
                    if has_vram {
                        ", VRAM through the BAR without HDP flush/invalidate"
                    } else {
                        ""
                    }
                );
                None
            }
            Err(e) => {
                log::warn!(
                    "pid {pid}: GPU {}: no DMA ring for HDP flush/invalidate ({e}); \
                     the CPU copies VRAM through the BAR without them",
                    work.user
                );
                None
            }
        }
    } else {
        None
    };
    let rest = if sdma.is_some() {
        share.saturating_sub(staging)
    } else {
        share
    };
    Ok(Engines::new(policy, rest, sdma))
}

/// The per-GPU copy jobs of a dump (`restored` false: BOs at their
/// checkpoint offsets) or a restore (`restored` true: at their new ones).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gpu_jobs<'a>(
    pid: i32,
    policy: EnginePolicy,
    staging_cap: Option<u64>,
    gpus: &[GpuWork],
    buckets: &[crate::plan::BoBucket],
    render_fd: impl Fn(crate::ids::RenderMinor) -> Option<std::os::fd::BorrowedFd<'a>>,
    dmabufs: &[Option<std::os::fd::BorrowedFd<'a>>],
    restored: bool,
) -> Result<Vec<GpuJob<'a>>, SessionError> {
    let mut jobs = Vec::with_capacity(gpus.len());
    // One budget (KFD_MAX_BUFFER_SIZE) for the whole process, shared out
    // evenly among its GPUs (each share among the GPU's lanes).
    let share = env::gpu_share(staging_cap, gpus.len());
    for w in gpus {
        let bos = w.bo_refs(buckets, render_fd(w.render_minor), dmabufs, restored);
        let has_dmabufs = bos.iter().any(|b| b.dmabuf.is_some());
        let has_vram = bos
            .iter()
            .any(|b| b.dmabuf.is_some() && b.alloc_flags & crate::bo::ALLOC_VRAM != 0);
        jobs.push(GpuJob {
            user: w.user,
            actual: w.actual,
            bos,
            engines: engines_for(pid, policy, share, w, has_dmabufs, has_vram)?,
        });
    }
    Ok(jobs)
}

/// Logs one line per GPU worker: `verb` is "saved" or "restored".
pub(crate) fn log_gpu_stats(pid: i32, verb: &str, stats: &[crate::copy::GpuStats]) {
    for s in stats {
        log::info!(
            "pid {pid}: GPU {} (host {}): {verb} {} BO(s), {} in {:.1} ms ({:.0} MB/s; {} by CPU, {} by SDMA)",
            s.user,
            s.actual,
            s.bos,
            human_bytes(s.bytes),
            s.elapsed.as_secs_f64() * 1e3,
            s.mb_per_s(),
            s.cpu_bos,
            s.sdma_bos
        );
    }
}

/// A BO entry of an image that records its extents (a KFD image's or a
/// render image's).
pub(crate) trait ExtentFields {
    fn size(&self) -> u64;
    /// Its extents' digests (a BO of more than one extent).
    fn set_digests(&mut self, digests: Vec<u64>);
    /// An incremental dump: the bitmap of the extents left to the parent,
    /// and the parent's BO index.
    fn set_parent(&mut self, extents: Vec<u8>, parent_bo: Option<u32>);
}

/// The two BO entry messages carry the same extent fields.
macro_rules! extent_fields {
    ($($entry:ty),*) => {$(
        impl ExtentFields for $entry {
            fn size(&self) -> u64 {
                self.size
            }
            fn set_digests(&mut self, digests: Vec<u64>) {
                self.content_extent_xxh3 = digests;
            }
            fn set_parent(&mut self, extents: Vec<u8>, parent_bo: Option<u32>) {
                self.parent_extents = Some(extents);
                self.parent_bo = parent_bo;
            }
        }
    )*};
}
extent_fields!(crate::proto::KfdBoEntry, crate::proto::DrmBoEntry);

/// Records in `bos` (an image's entries, by bucket index) each dumped BO's
/// extent digests and, for an incremental dump, the extents left to the
/// parent (`parent_bos`: the parent's BO of each bucket); returns the
/// bytes left to it.
pub(crate) fn record_extents<B: ExtentFields>(
    bos: &mut [B],
    out: &crate::copy::DumpOutcome,
    parent_bos: &BTreeMap<usize, u32>,
) -> u64 {
    let mut kept = 0u64;
    for (&i, d) in &out.extents {
        let Some(b) = bos.get_mut(i) else {
            continue;
        };
        if d.len() > 1 {
            b.set_digests(d.clone());
        }
        if let Some(ks) = out.inherited.get(&i) {
            let (size, e) = (b.size(), chain::dump_extent(b.size()));
            kept += ks.iter().map(|&k| e.min(size - k * e)).sum::<u64>();
            b.set_parent(chain::bitmap(ks), parent_bos.get(&i).copied());
        }
    }
    kept
}

/// The log line of an incremental dump of `what` against `parent`.
pub(crate) fn log_incremental(
    what: &str,
    parent: &str,
    out: &crate::copy::DumpOutcome,
    kept: u64,
    matched: usize,
) {
    let total: u64 = out.stats.iter().map(|s| s.bytes).sum();
    log::info!(
        "{what}: incremental GPU dump against {}/{parent}: {} of {} written, {} \
         unchanged left to the parent ({matched} of {} BO(s) matched)",
        chain::PARENT_LINK,
        human_bytes(out.written),
        human_bytes(total),
        human_bytes(kept),
        out.extents.len()
    );
}

/// Whether KFD installed `dmabuf_fd` in our fd table for this bucket
/// (CHECKPOINT and RESTORE output): KFD exports a dmabuf only for VRAM and
/// GTT BOs and writes the invalid marker, or nothing at all before KFD
/// 1.8, for the others; so only a VRAM/GTT bucket holding a valid fd
/// number carries an fd that is ours to close.
fn kfd_wrote_dmabuf(b: &kfd_abi::sys::kfd_criu_bo_bucket) -> bool {
    crate::bo::has_contents(b.alloc_flags)
        && b.dmabuf_fd != crate::bo::KFD_INVALID_FD
        && i32::try_from(b.dmabuf_fd).is_ok()
}

/// Takes ownership of the dmabuf fds KFD installed in our fd table for
/// each bucket (CHECKPOINT and RESTORE output).
pub(crate) fn owned_dmabufs(
    buckets: &[kfd_abi::sys::kfd_criu_bo_bucket],
) -> Vec<Option<std::os::fd::OwnedFd>> {
    buckets
        .iter()
        .map(|b| {
            kfd_wrote_dmabuf(b).then(|| {
                // SAFETY: KFD installed this fd for us; nothing else owns it.
                unsafe {
                    <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(
                        b.dmabuf_fd as i32,
                    )
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the fds KFD wrote are taken (and so closed when dropped): a
    /// bucket still holding the marker, a non-VRAM/GTT bucket a pre-1.8
    /// kernel left at 0, or an fd number past i32 are not ours.
    #[test]
    fn only_dmabufs_kfd_wrote_are_owned() {
        use crate::bo::{ALLOC_DOORBELL, ALLOC_GTT, ALLOC_USERPTR, ALLOC_VRAM, KFD_INVALID_FD};
        use kfd_abi::sys::kfd_criu_bo_bucket;
        use std::os::fd::IntoRawFd;
        let exported = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        let bucket = |alloc_flags, dmabuf_fd| kfd_criu_bo_bucket {
            alloc_flags,
            dmabuf_fd,
            ..Default::default()
        };
        let buckets = [
            bucket(ALLOC_VRAM, exported as u32),
            bucket(ALLOC_VRAM, KFD_INVALID_FD),
            bucket(ALLOC_GTT, 0x8000_0000),
            bucket(ALLOC_USERPTR, 0),
            bucket(ALLOC_DOORBELL, 0),
            bucket(ALLOC_DOORBELL, KFD_INVALID_FD),
        ];
        let owned = owned_dmabufs(&buckets);
        assert!(owned[1..].iter().all(Option::is_none), "{owned:?}");
        let taken = owned
            .into_iter()
            .next()
            .flatten()
            .map(IntoRawFd::into_raw_fd);
        assert_eq!(taken, Some(exported));
        // SAFETY: `exported` is our /dev/null fd, handed back by into_raw_fd.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(exported) });
    }

    #[test]
    fn kfd_images_are_found_by_id() {
        let d = crate::image::tests::tempdir();
        for n in [
            "amdgpu-kfd-12.img",
            "amdgpu-kfd-3.img",
            "amdgpu-pages-3-4660.img",
            "amdgpu-renderD-4.img",
            "amdgpu-kfd-x.img",
        ] {
            std::fs::write(d.join(n), b"").unwrap();
        }
        assert_eq!(kfd_image_ids(&d).unwrap(), vec![FileId(3), FileId(12)]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Upstream prints file ids with `%d`: an id ≥ 2^31 names a file with a
    /// minus sign, which the listing must find (a decoded image, written
    /// by the writer, listed by the restore).
    #[test]
    fn kfd_images_of_ids_past_i32_are_found() {
        let d = crate::image::tests::tempdir();
        let ids = [FileId(0x8000_0000), FileId(0xffff_fffe), FileId(5)];
        let img = crate::image::KfdImage::validate("t", crate::image::tests::sample_kfd()).unwrap();
        for id in ids {
            img.write(&d, id).unwrap();
        }
        assert!(d.join("amdgpu-kfd--2147483648.img").exists());
        assert!(d.join("amdgpu-kfd--2.img").exists());
        let found = kfd_image_ids(&d).unwrap();
        assert_eq!(
            found,
            vec![FileId(5), FileId(0x8000_0000), FileId(0xffff_fffe)]
        );
        for id in found {
            assert_eq!(crate::image::KfdImage::read(&d, id).unwrap(), img);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
