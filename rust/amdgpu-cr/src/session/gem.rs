//! Render-node GEM BOs (issue 29): the GEM objects a render file holds
//! (GEM_CREATE, as a VA-API, Mesa or libdrm_amdgpu client makes them) are
//! saved with the file and recreated with the same handles.
//!
//! Dump ([`save`], when CRIU dumps the render file): GEM_LIST_HANDLES names
//! every object, GEM_MMAP its mmap offset, GEM_OP(GET_MAPPING_INFO) its GPU
//! VA mappings; the render image records them as criu-dev's `drm_bo_entry`s
//! and their bytes go through the copy engines into the file's pages file
//! (`amdgpu-pages-<id>-<gpu>.img`), as a KFD image's: the same budget,
//! holes, hashes, compression and incremental extents (through
//! [`RenderImage::contents_view`]; the parent a render image of the same
//! task and render node, [`chain::dump_render_parent`]), into the image
//! streamer with `--stream`.  A pre-dump saves them too, read while the
//! process runs ([`Copying::live`]).
//! Kernels before Linux 6.18 cannot list a file's objects: there the file is
//! saved only if none of its first 4095 handles names one
//! ([`no_objects_before_618`]).  A file with an amdgpu submission context
//! fails the dump ([`refuse_contexts`]); every BO is waited idle
//! (GEM_WAIT_IDLE) before its bytes are copied.
//!
//! A BO another file of the dump holds already (a dma-buf imported on the
//! same GPU: see [`super::dmabuf`]) is recorded as that file's BO
//! (`same_bo_file`, `same_bo_index`) and its bytes are not saved again.
//!
//! Restore ([`restore`], when CRIU opens the render file), in this order:
//! 1. [`recreate`]: each object again with GEM_CREATE, in ascending handle
//!    order (a BO that is another file's: a dma-buf of it imported with
//!    PRIME_FD_TO_HANDLE, which takes the lowest free handle the same way).  The kernel gives the lowest free handle, so a file whose
//!    handles have no holes gets the same ones; a hole is renamed over with
//!    GEM_CHANGE_HANDLE where the kernel has it (Linux 6.18.0 to 6.18.35),
//!    and elsewhere (before 6.18, from 6.18.36 and 7.1 on: EINVAL) filled
//!    with a placeholder object, freed once every object has its handle.  A
//!    handle that cannot be had fails the restore, before any task runs,
//!    naming the render file and the BO.
//! 2. [`map_gpu`]: every GPU VA mapping again (GEM_VA MAP).
//! 3. the bytes from the pages file (with `--stream`, its pipe from the
//!    image streamer, read in order) through the copy engines, at the new
//!    mmap offsets, an incremental dump's unchanged extents from
//!    its parents' pages files.
//! 4. [`GemFixups`]: the new mmap offsets, for CRIU's restore of the CPU
//!    mappings of the render file ([`super::restore::RestoreSession::update_vma`]).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use kfd_abi::handle::RenderNode;
use kfd_abi::layout::gem618;

use super::contexts::{self, PROBED_IDS};
use super::{gpu_jobs, log_gpu_stats, log_incremental, record_extents, SessionError};
use crate::bo;
use crate::copy::{dump_contents_encoded, restore_contents_from, GpuJob, GpuStats, PagesFrom};
use crate::env::EnginePolicy;
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, RenderImage};
use crate::plan::{BoBucket, GpuWork};
use crate::proto::{DrmBoEntry, DrmVmEntry};
use crate::topology::Topology;
use crate::validate::chain;

/// The copy settings of a dump or restore.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copying {
    pub policy: EnginePolicy,
    pub staging_cap: Option<u64>,
    /// zstd level and threads (dump only).
    pub compress: Option<(i32, Option<u32>)>,
    /// A pre-dump: the process runs while its BOs are read (see
    /// [`crate::copy::cpu::CpuEngine::live`]).
    pub live: bool,
}

/// The host GPU of render node `minor` in `topology`: the GPU the GEM BOs
/// of a render image of that node are copied on.  A node the topology does
/// not list keeps the image's GPU.
pub(crate) fn host_gpu(topology: &Topology, minor: RenderMinor, img: &RenderImage) -> GpuId {
    topology
        .gpu_by_render_minor(minor)
        .and_then(|n| n.gpu_id)
        .unwrap_or(img.gpu_id())
}

/// A render file's name in messages.
fn file_name(minor: RenderMinor, id: FileId) -> String {
    format!("render node {} (file {id})", minor.path())
}

fn kfd_err(
    pid: i32,
    minor: RenderMinor,
    id: FileId,
    what: impl std::fmt::Display,
) -> impl FnOnce(kfd_abi::handle::Error) -> SessionError {
    let step = format!("{}: {what}", file_name(minor, id));
    move |source| SessionError::Kfd { pid, step, source }
}

/// What a dump does with a render file's listed BOs before their bytes
/// are saved: marks the ones another file of the dump holds as that file's
/// (`same_bo_*`, whose bytes are then not saved again), or refuses.
pub(crate) type Link<'a> = dyn FnMut(&mut [DrmBoEntry]) -> Result<(), SessionError> + 'a;

/// Dump: the GEM objects of render file `fd` (CRIU file `id`, minor
/// `minor`, of host GPU `actual`) into `img` and its pages file in `dir`;
/// `link` sees them first; `contexts`: the context ids the file's probe
/// reported if one was started at the pause ([`contexts::ContextProbes`]),
/// else it is probed now.
pub(crate) fn save(
    pid: i32,
    fd: BorrowedFd<'_>,
    (minor, id, actual): (RenderMinor, FileId, GpuId),
    img: &mut RenderImage,
    dir: &Path,
    copying: Copying,
    (contexts, link): (Option<Vec<u32>>, &mut Link<'_>),
) -> Result<(), SessionError> {
    let node = RenderNode::from_fd(fd);
    let probed = contexts.map_or_else(|| contexts::probe(fd), Ok);
    refuse_contexts(pid, minor, id, probed)?;
    let list = match node.gem_list_handles() {
        Ok(l) => l,
        Err(e) if matches!(e.errno(), libc::EINVAL | libc::ENOTTY) => {
            return no_objects_before_618(pid, &node, minor, id, &e);
        }
        Err(e) => return Err(kfd_err(pid, minor, id, "listing its GEM objects")(e)),
    };
    if list.is_empty() {
        return Ok(());
    }
    refuse_unsupported(pid, minor, id, &list)?;
    let mut entries = Vec::with_capacity(list.len());
    for e in &list {
        entries.push(describe(pid, &node, minor, id, e)?);
    }
    link(&mut entries)?;
    wait_idle(pid, &node, minor, id, &list)?;
    img.msg.num_of_bos = Some(entries.len() as u64);
    img.msg.bo_entries = entries;
    img.msg.criu_rocm_pid = u32::try_from(pid).ok();
    save_contents(pid, fd, (minor, id, actual), img, dir, copying)?;
    log::info!(
        "pid {pid}: {}: {} GEM BO(s) saved (handles {})",
        file_name(minor, id),
        img.msg.bo_entries.len(),
        handle_list(img.msg.bo_entries.iter().map(|b| b.handle))
    );
    Ok(())
}

/// The bytes of `img`'s GEM BOs through the copy engines into the pages
/// file of render file `id` in `dir`, their hashes and the pages encoding
/// into `img`.  Incremental (`--prev-images-dir`, or after a pre-dump): the
/// extents whose digests are those of the same BO (same handle, size, flags
/// and address) of the parent's render image of this task and render node
/// are left out, as a KFD image's ([`chain::dump_render_parent`]).
fn save_contents(
    pid: i32,
    fd: BorrowedFd<'_>,
    (minor, id, actual): (RenderMinor, FileId, GpuId),
    img: &mut RenderImage,
    dir: &Path,
    copying: Copying,
) -> Result<(), SessionError> {
    let mut jobs = copy_jobs(pid, fd, img, (minor, actual), None, copying)?;
    if copying.live {
        jobs.iter_mut().for_each(|j| j.engines.set_live());
    }
    let parent = u32::try_from(pid)
        .ok()
        .filter(|_| img.has_own_bos())
        .and_then(|p| chain::dump_render_parent(dir, p, minor.0));
    let (parent_digests, parent_bos) = match &parent {
        Some((_, p)) => chain::parent_digests(&img.contents_view().msg.bo_entries, p),
        None => Default::default(),
    };
    let step = format!("saving the GEM BOs of {}", file_name(minor, id));
    let out = dump_contents_encoded(dir, id, jobs, copying.compress, &parent_digests)
        .map_err(|e| SessionError::core(pid, step, e))?;
    crate::pages::record_hashes(&mut img.msg.bo_entries, &out.hashes);
    let kept = record_extents(&mut img.msg.bo_entries, &out, &parent_bos);
    if let Some((name, _)) = &parent {
        if !out.inherited.is_empty() {
            img.msg.criu_rocm_parent = Some(name.clone());
        }
        let what = format!("pid {pid}: {}", file_name(minor, id));
        log_incremental(&what, name, &out, kept, parent_bos.len());
    }
    let mut view = img.contents_view();
    out.encoding.record(&mut view.msg);
    img.msg.pages_compression = view.msg.pages_compression;
    img.msg.pages_compression_level = view.msg.pages_compression_level;
    img.msg.pages_compression_chunk = view.msg.pages_compression_chunk;
    log_gpu_stats(pid, "saved", &out.stats);
    Ok(())
}

/// How long a dump waits for the submissions that use a GEM BO to finish
/// before it copies the BO's bytes: amdgpu's job timeout (10 s) ends any
/// job by then.
const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A render file with a submission context fails the dump: contexts (and
/// the fences, syncobjs and BO lists a client uses with them) are not
/// saved, and a restored client's next command submission on its context
/// would fail.  `probed`: the file's contexts ([`contexts::probe`]).
fn refuse_contexts(
    pid: i32,
    minor: RenderMinor,
    id: FileId,
    probed: contexts::Outcome,
) -> Result<(), SessionError> {
    let held =
        probed.map_err(|(ctx, e)| kfd_err(pid, minor, id, format!("probing context {ctx}"))(e))?;
    if held.is_empty() {
        return Ok(());
    }
    Err(SessionError::State {
        pid,
        what: format!(
            "{} holds {} amdgpu submission context(s) (ids {}): criu-rocm does not save \
             contexts, fences, syncobjs or BO lists, and the restored process' next command \
             submission would fail; not dumping what could not be restored",
            file_name(minor, id),
            held.len(),
            handle_list(held.iter().copied())
        ),
    })
}

/// A kernel before 6.18 cannot list a file's GEM objects: the file is saved
/// without any only if none of handles 1 to [`PROBED_IDS`] names one (GEM_OP
/// GET_GEM_CREATE_INFO, which only reads).  Handles are handed out
/// lowest-free from 1, so a file whose first 4095 handles are free holds
/// none unless it once held that many at a time.
fn no_objects_before_618(
    pid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    minor: RenderMinor,
    id: FileId,
    why: &kfd_abi::handle::Error,
) -> Result<(), SessionError> {
    for h in 1..=PROBED_IDS {
        if node
            .gem_exists(h)
            .map_err(kfd_err(pid, minor, id, format!("probing GEM handle {h}")))?
        {
            return Err(SessionError::State {
                pid,
                what: format!(
                    "{} holds GEM handle {h}, and this kernel cannot list its GEM objects \
                     (GEM_LIST_HANDLES: {why}; before Linux 6.18), so they cannot be saved; \
                     not dumping what could not be restored",
                    file_name(minor, id)
                ),
            });
        }
    }
    log::info!(
        "pid {pid}: {}: the kernel cannot list GEM objects (GEM_LIST_HANDLES: {why}, before \
         Linux 6.18); handles 1-{PROBED_IDS} are free, so the file holds none",
        file_name(minor, id)
    );
    Ok(())
}

/// Every listed BO idle before its bytes are copied: a command submission
/// of the (frozen) process may still write it.  A BO still busy after
/// [`IDLE_TIMEOUT`] fails the dump, naming it.
fn wait_idle(
    pid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    minor: RenderMinor,
    id: FileId,
    list: &[gem618::drm_amdgpu_gem_list_handles_entry],
) -> Result<(), SessionError> {
    for e in list {
        let h = e.gem_handle;
        let idle = node.gem_wait_idle(h, IDLE_TIMEOUT).map_err(kfd_err(
            pid,
            minor,
            id,
            format!("waiting for GEM handle {h} to be idle (GEM_WAIT_IDLE)"),
        ))?;
        if !idle {
            return Err(SessionError::State {
                pid,
                what: format!(
                    "{}: GEM handle {h} ({} bytes) is still in use by a command submission \
                     after {} s (GEM_WAIT_IDLE), so its bytes cannot be copied; not dumping \
                     what could not be restored",
                    file_name(minor, id),
                    e.size,
                    IDLE_TIMEOUT.as_secs()
                ),
            });
        }
    }
    Ok(())
}

/// What criu-rocm does not save yet fails the dump, naming the BO: GEM
/// objects imported from a dma-buf, and handles with more holes below them
/// than a restore fills ([`crate::image::GEM_MAX_HOLES`]).
fn refuse_unsupported(
    pid: i32,
    minor: RenderMinor,
    id: FileId,
    list: &[gem618::drm_amdgpu_gem_list_handles_entry],
) -> Result<(), SessionError> {
    let refuse = |e: &gem618::drm_amdgpu_gem_list_handles_entry, why: &str| SessionError::State {
        pid,
        what: format!(
            "{} holds {} GEM object(s), e.g. handle {} ({} bytes, domains {:#x}, flags {:#x}): \
             {why}; not dumping what could not be restored",
            file_name(minor, id),
            list.len(),
            e.gem_handle,
            e.size,
            e.preferred_domains,
            e.alloc_flags
        ),
    };
    let import = gem618::AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT;
    if let Some(e) = list.iter().find(|e| e.flags & import != 0) {
        return Err(refuse(
            e,
            "it is a dma-buf imported from another device or process, and criu-rocm does not \
             save imported GEM objects yet",
        ));
    }
    if let Some(e) = list.iter().max_by_key(|e| e.gem_handle) {
        let holes = crate::image::gem_holes(e.gem_handle, list.len());
        if holes > crate::image::GEM_MAX_HOLES {
            return Err(refuse(
                e,
                &format!(
                    "{holes} free handles lie below it, more than the {} placeholder objects a \
                     restore makes to reproduce the handles",
                    crate::image::GEM_MAX_HOLES
                ),
            ));
        }
    }
    Ok(())
}

/// One listed GEM object as criu-dev records it: its mmap offset and GPU
/// VA mappings (the first one's address is the BO's `addr`).
fn describe(
    pid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    minor: RenderMinor,
    id: FileId,
    e: &gem618::drm_amdgpu_gem_list_handles_entry,
) -> Result<DrmBoEntry, SessionError> {
    let h = e.gem_handle;
    let offset = match node.gem_mmap(h) {
        Ok(o) => o,
        // amdgpu_gem_mmap_ioctl: a userptr BO or one made NO_CPU_ACCESS.
        Err(err) if err.errno() == libc::EPERM => {
            return Err(SessionError::State {
                pid,
                what: format!(
                    "{}: GEM handle {h} ({} bytes, domains {:#x}, flags {:#x}) cannot be mapped \
                     by the CPU (GEM_MMAP: {err}: a userptr or NO_CPU_ACCESS BO), so its bytes \
                     cannot be saved; not dumping what could not be restored",
                    file_name(minor, id),
                    e.size,
                    e.preferred_domains,
                    e.alloc_flags
                ),
            })
        }
        Err(err) => {
            return Err(kfd_err(pid, minor, id, format!("GEM_MMAP of handle {h}"))(
                err,
            ))
        }
    };
    let vm_entries = vm_entries(pid, node, minor, id, e)?;
    Ok(DrmBoEntry {
        addr: vm_entries.first().map_or(0, |v| v.addr),
        size: e.size,
        offset: offset.0,
        alloc_flags: e.alloc_flags,
        alignment: e.alignment,
        preferred_domains: e.preferred_domains as u32,
        handle: h,
        is_import: 0,
        num_of_vms: vm_entries.len() as u32,
        vm_entries,
        ..Default::default()
    })
}

/// The GPU VA mappings of listed GEM object `e`, as criu-dev records them;
/// a mapping with flags GEM_VA does not take fails the dump, naming it.
fn vm_entries(
    pid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    minor: RenderMinor,
    id: FileId,
    e: &gem618::drm_amdgpu_gem_list_handles_entry,
) -> Result<Vec<DrmVmEntry>, SessionError> {
    let h = e.gem_handle;
    let maps = match node.gem_mapping_info(h) {
        Ok(m) => m,
        // A BO without a bo_va in the file's VM (amdgpu's fix of
        // GET_MAPPING_INFO's NULL bo_va): no mappings.
        Err(err) if err.errno() == libc::ENOENT => Vec::new(),
        Err(err) => {
            return Err(kfd_err(
                pid,
                minor,
                id,
                format!("the GPU mappings of GEM handle {h}"),
            )(err))
        }
    };
    let mut vm_entries = Vec::with_capacity(maps.len());
    for m in &maps {
        if m.flags & !u64::from(gem618::AMDGPU_VM_MAP_FLAGS) != 0 {
            return Err(SessionError::State {
                pid,
                what: format!(
                    "{}: GEM handle {h} ({} bytes) is mapped at GPU address {:#x} with flags \
                     {:#x}, which are no AMDGPU_VM_PAGE_*/MTYPE flags GEM_VA maps a BO with \
                     (outside {:#x}), so the mapping cannot be made again; not dumping what \
                     could not be restored",
                    file_name(minor, id),
                    e.size,
                    m.addr,
                    m.flags,
                    gem618::AMDGPU_VM_MAP_FLAGS
                ),
            });
        }
        vm_entries.push(DrmVmEntry {
            addr: m.addr,
            size: m.size,
            offset: m.offset,
            flags: m.flags,
        });
    }
    Ok(vm_entries)
}

/// The copy jobs of a render image's GEM BOs on render file `fd` of host
/// GPU `actual` (render node `minor`): a dump's at the BOs' mmap offsets
/// of the dump, a restore's at their `restored` ones.
fn copy_jobs<'a>(
    pid: i32,
    fd: BorrowedFd<'a>,
    img: &RenderImage,
    (minor, actual): (RenderMinor, GpuId),
    restored: Option<&[MmapOffset]>,
    copying: Copying,
) -> Result<Vec<GpuJob<'a>>, SessionError> {
    let (work, buckets) = contents_work(img, actual, minor, restored);
    gpu_jobs(
        pid,
        copying.policy,
        copying.staging_cap,
        std::slice::from_ref(&work),
        &buckets,
        |_| Some(fd),
        &[],
        restored.is_some(),
    )
}

/// The copy work of a render image's GEM BOs on host GPU `actual` (its
/// render node `minor`): every BO with bytes of its own (not one that is
/// another image's BO), in image order, at its mmap offset of the dump, or
/// at `restored` ones.
fn contents_work(
    img: &RenderImage,
    actual: GpuId,
    minor: RenderMinor,
    restored: Option<&[MmapOffset]>,
) -> (GpuWork, Vec<BoBucket>) {
    let view = img.contents_view();
    let buckets: Vec<BoBucket> = view
        .msg
        .bo_entries
        .iter()
        .enumerate()
        .map(|(i, b)| BoBucket {
            addr: GpuVa(b.addr),
            size: b.size,
            offset: MmapOffset(b.offset),
            restored_offset: restored.and_then(|r| r.get(i).copied()).unwrap_or_default(),
            gpu_id: GpuId(b.gpu_id),
            alloc_flags: b.alloc_flags,
            dmabuf_fd: bo::KFD_INVALID_FD,
        })
        .collect();
    let own = || buckets.iter().filter(|b| bo::has_contents(b.alloc_flags));
    let work = GpuWork {
        user: img.gpu_id(),
        actual,
        render_minor: minor,
        bos: (0..buckets.len())
            .filter(|&i| bo::has_contents(buckets[i].alloc_flags))
            .collect(),
        total: own().map(|b| b.size).sum(),
        largest: own().map(|b| b.size).max().unwrap_or(0),
    };
    (work, buckets)
}

/// "1-3, 5": handles in words.
fn handle_list(handles: impl IntoIterator<Item = u32>) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for h in handles {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == h => *last = h,
            _ => runs.push((h, h)),
        }
    }
    let words: Vec<String> = runs
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect();
    words.join(", ")
}

/// The new mmap offsets of a render file's GEM BOs, for CRIU's restore of
/// the file's CPU mappings: by the render minor at dump and the BO's
/// offset then.
#[derive(Debug, Default)]
pub(crate) struct GemFixups {
    /// Render minor at dump.
    pub old_minor: u32,
    /// Old offset → (size, new offset, handle).
    pub by_offset: BTreeMap<u64, (u64, u64, u32)>,
}

impl GemFixups {
    /// The new offset of `len` bytes at `pgoff` of the render node that had
    /// minor `minor` at dump, and the BO's handle.
    pub fn lookup(&self, minor: u32, pgoff: u64, len: u64) -> Option<(u64, u32)> {
        if minor != self.old_minor {
            return None;
        }
        let (&old, &(size, new, handle)) = self.by_offset.range(..=pgoff).next_back()?;
        let delta = pgoff - old;
        (delta.checked_add(len)? <= size).then_some((new + delta, handle))
    }
}

/// How [`recreate`] gave the objects their handles, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
struct HandleMethod {
    /// Objects renamed with GEM_CHANGE_HANDLE.
    renamed: usize,
    /// Placeholders that filled holes (freed since).
    placeholders: usize,
    /// The kernel refused GEM_CHANGE_HANDLE (its errno).
    change_refused: Option<String>,
}

impl std::fmt::Display for HandleMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("created in ascending handle order")?;
        if self.renamed > 0 {
            write!(
                f,
                ", {} past a hole renamed with GEM_CHANGE_HANDLE",
                self.renamed
            )?;
        }
        if self.placeholders > 0 {
            write!(
                f,
                ", {} hole(s) filled with placeholder objects freed afterwards",
                self.placeholders
            )?;
        }
        if let Some(why) = &self.change_refused {
            write!(f, " (this kernel refuses GEM_CHANGE_HANDLE: {why})")?;
        }
        Ok(())
    }
}

/// Where a restore gets a BO that is another image's BO
/// (`same_bo_file`/`same_bo_index`): a dma-buf of that BO, restored
/// already, to import.
pub(crate) type Source<'a> = dyn FnMut(&DrmBoEntry) -> Result<OwnedFd, SessionError> + 'a;

/// Restore: the GEM objects of render image `img` (file `id`) on the
/// restored render file `fd` of host GPU `actual` (render node `minor`),
/// their GPU mappings and bytes; the new mmap offsets for the CPU mappings.
/// A BO that is another image's is imported from `source`.
pub(crate) fn restore(
    vpid: i32,
    fd: BorrowedFd<'_>,
    img: &RenderImage,
    (minor, id, actual): (RenderMinor, FileId, GpuId),
    dir: &Path,
    copying: Copying,
    source: &mut Source<'_>,
) -> Result<GemFixups, SessionError> {
    let node = RenderNode::from_fd(fd);
    let (handles, method) = recreate(vpid, &node, img, (minor, id), source)?;
    log::info!(
        "pid {vpid}: {}: {} GEM object(s) recreated; mapping them in the GPU VM and restoring \
         their bytes",
        file_name(minor, id),
        handles.len()
    );
    map_gpu(vpid, &node, img, minor, id)?;
    let mut offsets = Vec::with_capacity(handles.len());
    for b in &img.msg.bo_entries {
        let h = b.handle;
        let o = node.gem_mmap(h).map_err(kfd_err(
            vpid,
            minor,
            id,
            format!("GEM_MMAP of handle {h}"),
        ))?;
        offsets.push(o);
    }
    let stats = restore_bytes(vpid, fd, img, (minor, id, actual), dir, &offsets, copying)?;
    log_gpu_stats(vpid, "restored", &stats);
    log::info!(
        "pid {vpid}: {}: {} GEM BO(s) restored with handles {}: {method}",
        file_name(minor, id),
        handles.len(),
        handle_list(handles.iter().copied())
    );
    let by_offset = img
        .msg
        .bo_entries
        .iter()
        .zip(&offsets)
        .map(|(b, o)| (b.offset, (b.size, o.0, b.handle)))
        .collect();
    Ok(GemFixups {
        old_minor: img.msg.drm_render_minor.unwrap_or(minor.0),
        by_offset,
    })
}

/// The bytes of every BO from the render file's pages file, through the
/// BOs' new mmap offsets `offsets` (image order).
fn restore_bytes(
    vpid: i32,
    fd: BorrowedFd<'_>,
    img: &RenderImage,
    (minor, id, actual): (RenderMinor, FileId, GpuId),
    dir: &Path,
    offsets: &[MmapOffset],
    copying: Copying,
) -> Result<Vec<GpuStats>, SessionError> {
    let jobs = copy_jobs(vpid, fd, img, (minor, actual), Some(offsets), copying)?;
    let view = img.contents_view();
    let name = crate::image::render_image_name(id);
    let encoding = crate::pages::Encoding::of(&name, &view.msg)
        .map_err(|e| SessionError::core(vpid, name.clone(), e))?;
    let hashes = crate::pages::content_hashes(&view);
    // With --stream, the pages file (one: the render node's GPU) is read
    // from the stream in order, its end and every BO's hash checked before
    // any task runs; a stream carries no parent.  Otherwise an incremental
    // dump's unchanged extents come from its parents' pages files (the
    // chain checked before any task ran, again here as the files are
    // opened).
    let (from, overlays) = match crate::stream::active() {
        None => {
            let overlays = chain::resolve(dir, &name, &view).map_err(|r| SessionError::State {
                pid: vpid,
                what: r.to_string(),
            })?;
            (PagesFrom::Dir(dir), overlays)
        }
        Some(streamer) => {
            let mut pipes = BTreeMap::new();
            for j in &jobs {
                pipes.insert(j.user, streamed_pages(vpid, &streamer, id, j.user)?);
            }
            (
                PagesFrom::Stream(std::sync::Mutex::new(pipes)),
                BTreeMap::new(),
            )
        }
    };
    restore_contents_from(&from, id, jobs, &hashes, encoding, &overlays).map_err(|e| {
        SessionError::core(
            vpid,
            format!("restoring the GEM BOs of {}", file_name(minor, id)),
            e,
        )
    })
}

/// Restore with `--stream`: the pipe of render file `id`'s pages file of
/// GPU `gpu` from the image streamer (which serves one file at a time: it
/// is read whole at once).
fn streamed_pages(
    vpid: i32,
    streamer: &crate::stream::Streamer,
    id: FileId,
    gpu: GpuId,
) -> Result<crate::stream::Pipe, SessionError> {
    let name = crate::pages::pages_image_name(id, gpu);
    let pipe = streamer.open(&name).map_err(|source| SessionError::Os {
        pid: vpid,
        step: format!("asking the image streamer for {name}"),
        source,
    })?;
    pipe.ok_or_else(|| SessionError::State {
        pid: vpid,
        what: format!("the image streamer has no {name}"),
    })
}

/// Every GEM object of `img` again on `node`, each with its handle at
/// dump (see the module documentation); the handles, in image order.
fn recreate(
    vpid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    img: &RenderImage,
    (minor, id): (RenderMinor, FileId),
    source: &mut Source<'_>,
) -> Result<(Vec<u32>, HandleMethod), SessionError> {
    let taken: BTreeSet<u32> = match node.gem_list_handles() {
        Ok(l) => l.iter().map(|e| e.gem_handle).collect(),
        // Before 6.18: the handles GEM_CREATE returns are checked instead.
        Err(_) => BTreeSet::new(),
    };
    let mut order: Vec<&DrmBoEntry> = img.msg.bo_entries.iter().collect();
    order.sort_by_key(|b| b.handle);
    let mut r = Recreation {
        vpid,
        node,
        minor,
        id,
        method: HandleMethod::default(),
        placeholders: Vec::new(),
        made: Vec::new(),
        source,
    };
    let result = order.into_iter().try_for_each(|b| r.one(b, &taken));
    let freed = r.free_placeholders();
    if let Err(e) = result.and(freed) {
        close_all(node, &r.made);
        return Err(e);
    }
    let handles = img.msg.bo_entries.iter().map(|b| b.handle).collect();
    Ok((handles, r.method))
}

/// [`recreate`]'s state: the objects made so far and the placeholders that
/// fill holes.
struct Recreation<'n, 'f, 's, 'x> {
    vpid: i32,
    node: &'n RenderNode<BorrowedFd<'f>>,
    minor: RenderMinor,
    id: FileId,
    method: HandleMethod,
    placeholders: Vec<u32>,
    made: Vec<u32>,
    source: &'s mut Source<'x>,
}

impl Recreation<'_, '_, '_, '_> {
    /// `b` made on the file: created, or imported when it is another
    /// image's BO.  Its handle.
    fn make(&mut self, b: &DrmBoEntry) -> Result<u32, SessionError> {
        if b.same_bo_index.is_none() {
            return create(self.vpid, self.node, b, self.minor, self.id);
        }
        let dmabuf = (self.source)(b)?;
        self.node
            .prime_fd_to_handle(dmabuf.as_fd())
            .map_err(kfd_err(
                self.vpid,
                self.minor,
                self.id,
                format!(
                    "PRIME_FD_TO_HANDLE of GEM handle {} (the same BO as BO {} of file {})",
                    b.handle,
                    b.same_bo_index.unwrap_or_default(),
                    b.same_bo_file.unwrap_or_default()
                ),
            ))
    }

    /// The refusal of `b`'s handle, for `why`.
    fn lost(&self, b: &DrmBoEntry, why: String) -> SessionError {
        SessionError::State {
            pid: self.vpid,
            what: format!(
                "{}: GEM handle {} ({} bytes, domains {:#x}) cannot be had again: {why}; not \
                 restoring a file whose buffers would have other handles",
                file_name(self.minor, self.id),
                b.handle,
                b.size,
                b.preferred_domains
            ),
        }
    }

    /// `b` again with its handle (the next in ascending order).
    fn one(&mut self, b: &DrmBoEntry, taken: &BTreeSet<u32>) -> Result<(), SessionError> {
        if taken.contains(&b.handle) {
            return Err(self.lost(b, "the restored file holds that handle already".into()));
        }
        if self.method.change_refused.is_some() {
            self.fill(b)?;
        }
        let h = self.make(b)?;
        self.made.push(h);
        if h == b.handle {
            return Ok(());
        }
        if h > b.handle {
            return Err(self.lost(b, format!("GEM_CREATE gave handle {h}, past it")));
        }
        if self.method.change_refused.is_none() && self.rename(b, h)? {
            return Ok(());
        }
        self.refill(b, h)
    }

    /// GEM_CHANGE_HANDLE of the new object `h` to `b`'s handle: whether the
    /// kernel did it (false: it refuses renaming, which is remembered).
    fn rename(&mut self, b: &DrmBoEntry, h: u32) -> Result<bool, SessionError> {
        match self.node.gem_change_handle(h, b.handle) {
            Ok(()) => {
                *self.made.last_mut().expect("pushed") = b.handle;
                self.method.renamed += 1;
                Ok(true)
            }
            Err(e) if matches!(e.errno(), libc::EINVAL | libc::ENOTTY) => {
                self.method.change_refused = Some(e.to_string());
                Ok(false)
            }
            Err(e) => Err(self.lost(b, format!("GEM_CHANGE_HANDLE {h} -> it: {e}"))),
        }
    }

    /// No renaming: the new object `h` goes, placeholders fill the hole up
    /// to `b`'s handle, which the kernel then gives the object.
    fn refill(&mut self, b: &DrmBoEntry, h: u32) -> Result<(), SessionError> {
        self.made.pop();
        self.node.gem_close(h).map_err(kfd_err(
            self.vpid,
            self.minor,
            self.id,
            format!("closing handle {h}"),
        ))?;
        self.fill(b)?;
        let h = self.make(b)?;
        self.made.push(h);
        if h != b.handle {
            return Err(self.lost(
                b,
                format!("GEM_CREATE gave handle {h} after the placeholders"),
            ));
        }
        Ok(())
    }

    /// Placeholders at every free handle below `b`'s.
    fn fill(&mut self, b: &DrmBoEntry) -> Result<(), SessionError> {
        let made =
            fill_below(self.vpid, self.node, b.handle, self.minor, self.id).map_err(|got| {
                self.lost(
                    b,
                    match got {
                        Some(p) => format!("the kernel gave a placeholder handle {p}, past it"),
                        None => "no placeholder object could be made".into(),
                    },
                )
            })?;
        self.placeholders.extend(made);
        Ok(())
    }

    /// Every placeholder closed: one the kernel keeps would hold memory and
    /// a handle the process never made, so that fails the restore.
    fn free_placeholders(&mut self) -> Result<(), SessionError> {
        self.method.placeholders = self.placeholders.len();
        let mut failed = None;
        for &p in &self.placeholders {
            if let Err(e) = self.node.gem_close(p) {
                failed.get_or_insert((p, e));
            }
        }
        match failed {
            None => Ok(()),
            Some((p, e)) => Err(kfd_err(
                self.vpid,
                self.minor,
                self.id,
                format!("closing placeholder handle {p}"),
            )(e)),
        }
    }
}

/// GEM_CREATE of `b` as at dump (its size, domains, flags, and alignment,
/// which GEM_LIST_HANDLES reports in pages).
fn create(
    vpid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    b: &DrmBoEntry,
    minor: RenderMinor,
    id: FileId,
) -> Result<u32, SessionError> {
    let align = b.alignment.saturating_mul(bo::PAGE_SIZE);
    node.gem_create(b.size, align, u64::from(b.preferred_domains), b.alloc_flags)
        .map_err(kfd_err(
            vpid,
            minor,
            id,
            format!(
                "GEM_CREATE for handle {} ({} bytes, domains {:#x}, flags {:#x})",
                b.handle, b.size, b.preferred_domains, b.alloc_flags
            ),
        ))
}

/// Placeholder objects (a page of GTT each) at every free handle below
/// `handle`, which is free then: their handles.  `Err(Some(p))`: the kernel
/// gave placeholder handle `p` past `handle` (closed); `Err(None)`: none
/// could be made.
fn fill_below(
    vpid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    handle: u32,
    minor: RenderMinor,
    id: FileId,
) -> Result<Vec<u32>, Option<u32>> {
    let gtt = u64::from(kfd_abi::sys::AMDGPU_GEM_DOMAIN_GTT);
    let mut made = Vec::new();
    loop {
        let p = match node.gem_create(bo::PAGE_SIZE, 0, gtt, 0) {
            Ok(p) => p,
            Err(e) => {
                log::error!(
                    "pid {vpid}: {}: a placeholder object: {e}",
                    file_name(minor, id)
                );
                close_all(node, &made);
                return Err(None);
            }
        };
        if p < handle {
            made.push(p);
            continue;
        }
        let _ = node.gem_close(p);
        if p == handle {
            return Ok(made);
        }
        close_all(node, &made);
        return Err(Some(p));
    }
}

fn close_all(node: &RenderNode<BorrowedFd<'_>>, handles: &[u32]) {
    for &h in handles {
        let _ = node.gem_close(h);
    }
}

/// Every GPU VA mapping of `img`'s BOs again in the file's VM.
fn map_gpu(
    vpid: i32,
    node: &RenderNode<BorrowedFd<'_>>,
    img: &RenderImage,
    minor: RenderMinor,
    id: FileId,
) -> Result<(), SessionError> {
    for b in &img.msg.bo_entries {
        for v in &b.vm_entries {
            node.gem_va(
                b.handle,
                kfd_abi::sys::AMDGPU_VA_OP_MAP,
                v.flags as u32,
                GpuVa(v.addr),
                v.offset,
                v.size,
            )
            .map_err(kfd_err(
                vpid,
                minor,
                id,
                format!(
                    "GEM_VA MAP of handle {} ({:#x} bytes at BO offset {:#x} to {:#x}, flags {:#x})",
                    b.handle, v.size, v.offset, v.addr, v.flags
                ),
            ))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_in_words() {
        assert_eq!(handle_list([1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
        assert_eq!(handle_list([4]), "4");
        assert_eq!(handle_list([]), "");
    }

    #[test]
    fn fixups_find_a_mapping_inside_a_bo_of_the_same_node() {
        let f = GemFixups {
            old_minor: 128,
            by_offset: [
                (0x10000, (0x4000, 0x90000, 3)),
                (0x20000, (0x1000, 0xa0000, 4)),
            ]
            .into(),
        };
        assert_eq!(f.lookup(128, 0x11000, 0x3000), Some((0x91000, 3)));
        assert_eq!(f.lookup(128, 0x11000, 0x4000), None, "past the BO");
        assert_eq!(f.lookup(129, 0x10000, 0x1000), None, "another node");
        assert_eq!(f.lookup(128, 0x20000, 0x1000), Some((0xa0000, 4)));
        assert_eq!(f.lookup(128, 0x1000, 0x1000), None);
    }

    #[test]
    fn the_method_says_what_ran() {
        let m = HandleMethod {
            renamed: 0,
            placeholders: 2,
            change_refused: Some("EINVAL".into()),
        };
        let s = m.to_string();
        assert!(s.contains("2 hole(s) filled with placeholder"), "{s}");
        assert!(s.contains("refuses GEM_CHANGE_HANDLE"), "{s}");
        let m = HandleMethod {
            renamed: 1,
            ..Default::default()
        };
        assert!(m
            .to_string()
            .contains("1 past a hole renamed with GEM_CHANGE_HANDLE"));
    }
}
