//! Dump and restore plans (pure data transformations between the KFD CRIU
//! buckets, the topology and the image), the VMA fix-up table, and device
//! recognition.
//!
//! Id spaces: KFD's CHECKPOINT reports each device's *user* gpu_id (what
//! the application first saw) and *actual* gpu_id (the GPU it runs on);
//! BO buckets carry the user id.  Images store user ids only.  Pages files
//! are named and filtered by user id on both sides (upstream mixes actual
//! and user ids at dump, which breaks re-checkpointing a migrated process).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use crate::bo;
use crate::copy::BoRef;
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, KfdImage, RenderImage, EXT_VERSION};
use crate::matcher::GpuMap;
use crate::pages::{ContentHash, Encoding};
use crate::proto::{CriuKfd, CriuRenderNode, KfdBoEntry};
use crate::topology::{Topology, TopologyError};

/// Errors building a plan; they name the GPU or BO involved.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("CHECKPOINT device bucket {index}: {what}")]
    BadDevice { index: usize, what: String },
    #[error("BO {index} (addr {addr}, GPU {gpu}): {what}")]
    BadBo {
        index: usize,
        addr: GpuVa,
        gpu: GpuId,
        what: String,
    },
    #[error("GPU {gpu}: {what}")]
    Gpu { gpu: GpuId, what: String },
    #[error("render node renderD{minor}: {what}")]
    Render { minor: RenderMinor, what: String },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
}

/// A device bucket of CHECKPOINT (and, with a render fd, of RESTORE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceBucket {
    pub user: GpuId,
    pub actual: GpuId,
}

/// A BO bucket of CHECKPOINT / RESTORE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoBucket {
    pub addr: GpuVa,
    pub size: u64,
    /// mmap offset at checkpoint.
    pub offset: MmapOffset,
    /// mmap offset after RESTORE (output of RESTORE).
    pub restored_offset: MmapOffset,
    /// *User* gpu_id.
    pub gpu_id: GpuId,
    pub alloc_flags: u32,
    /// dmabuf fd the kernel installed in our fd table, or
    /// [`bo::KFD_INVALID_FD`].
    pub dmabuf_fd: u32,
}

impl BoBucket {
    /// The dmabuf fd, if the kernel exported one.
    pub fn dmabuf(&self) -> Option<i32> {
        (self.dmabuf_fd != bo::KFD_INVALID_FD)
            .then_some(self.dmabuf_fd)
            .and_then(|fd| i32::try_from(fd).ok())
    }
}

/// What CHECKPOINT returned for one process.
#[derive(Clone, Debug, Default)]
pub struct CheckpointData {
    /// Virtual pid (PROCESS_INFO).
    pub pid: u32,
    pub devices: Vec<DeviceBucket>,
    pub bos: Vec<BoBucket>,
    pub num_objects: u32,
    pub priv_data: Vec<u8>,
}

/// Facts about the thunk's (libhsakmt's) shared bookkeeping recorded at
/// dump: `/dev/shm/hsakmt_shared_mem` (size, first word, mode) and the
/// mode of its semaphore `/dev/shm/sem.hsakmt_semaphore`.  Modes are
/// permission bits, 0 when not recorded (images of upstream or of older
/// criu-rocm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedMem {
    pub size: u64,
    pub magic: u32,
    pub mode: u32,
    pub semaphore_mode: u32,
}

/// Where the thunk (libhsakmt) keeps its shared bookkeeping.
pub const HSAKMT_SHM: &str = "/dev/shm/hsakmt_shared_mem";

/// The file behind the thunk's semaphore (glibc keeps named semaphores in
/// `/dev/shm/sem.<name>`).
pub const HSAKMT_SEMAPHORE_FILE: &str = "/dev/shm/sem.hsakmt_semaphore";

/// Mode the thunk asks for when it creates either file.
const THUNK_MODE: u32 = 0o666;

fn permission_bits(path: &Path) -> io::Result<u32> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.permissions().mode() & 0o7777),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn mode_or_default(mode: u32) -> u32 {
    if mode == 0 {
        THUNK_MODE
    } else {
        mode
    }
}

impl SharedMem {
    /// Records the size, first 32-bit word (little endian) and mode of the
    /// thunk's shared memory file `shm` and the mode of its semaphore file
    /// `sem` (both read through the dumped task's root); size 0 when the
    /// shared memory does not exist.
    pub fn probe(shm: &Path, sem: &Path) -> io::Result<Self> {
        use std::io::Read;
        let semaphore_mode = permission_bits(sem)?;
        let mut f = match std::fs::File::open(shm) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(SharedMem {
                    semaphore_mode,
                    ..SharedMem::default()
                })
            }
            Err(e) => return Err(e),
        };
        let md = f.metadata()?;
        let mut word = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match f.read(&mut word[got..])? {
                0 => break,
                n => got += n,
            }
        }
        use std::os::unix::fs::PermissionsExt;
        Ok(SharedMem {
            size: md.len(),
            magic: u32::from_le_bytes(word),
            mode: md.permissions().mode() & 0o7777,
            semaphore_mode,
        })
    }

    /// Recreates the file with the recorded size, magic and mode (0666
    /// when none was recorded) when it is missing in the restored task's
    /// mount namespace; the rest of its contents (thunk counters) is not
    /// saved, as upstream.  CRIU then finds the file as the process had it
    /// mapped, mode included.  An existing file is left alone.  Returns
    /// whether it was created.
    pub fn recreate(&self, path: &Path) -> io::Result<bool> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        if self.size == 0 {
            return Ok(false);
        }
        if path.exists() {
            return Ok(false);
        }
        // Built under a name of this task's own and linked into place whole:
        // the other restored processes of a tree recreate the same file at
        // the same time, and one that found it half made (size 0) would
        // fail CRIU's size check of the restored mapping.
        let mode = mode_or_default(self.mode);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".criu-rocm-{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let made = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&tmp)?;
            // The restorer's umask is not the one the file was created under.
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.set_len(self.size)?;
            let n = self.size.min(4) as usize;
            f.write_all(&self.magic.to_le_bytes()[..n])?;
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            }
        })();
        let _ = std::fs::remove_file(&tmp);
        made
    }
}

/// Name of the thunk's POSIX semaphore guarding its shared memory.
pub const HSAKMT_SEMAPHORE: &std::ffi::CStr = c"/hsakmt_semaphore";

/// Makes sure the named POSIX semaphore exists, created with value 1 (as
/// the thunk creates it) and the permission bits `mode` (0666 when 0) on
/// its file `file`, without changing an existing one.  Returns whether it
/// was created.
pub fn ensure_semaphore(name: &std::ffi::CStr, file: &Path, mode: u32) -> io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let mode = mode_or_default(mode);
    if !crate::os::file::create_semaphore(name, mode, 1)? {
        return Ok(false);
    }
    // sem_open applied our umask.
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(mode))?;
    Ok(true)
}

/// The content work of one GPU: which BOs go to (or come from) its pages
/// file, in bucket order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuWork {
    /// Names the pages file.
    pub user: GpuId,
    /// The GPU the copy runs on (checkpoint: where the BOs are; restore:
    /// the new host GPU).
    pub actual: GpuId,
    pub render_minor: RenderMinor,
    /// Bucket indices of the VRAM/GTT BOs of this GPU.
    pub bos: Vec<usize>,
    /// Σ sizes (the pages file header).
    pub total: u64,
    pub largest: u64,
}

impl GpuWork {
    /// The copy requests of this GPU's content BOs, in bucket order.
    ///
    /// * `render_fd`: the fd of this GPU's render node whose `drm_file` owns
    ///   the BOs' mmap offsets (the file given to ACQUIRE_VM or RESTORE:
    ///   `drm_gem_mmap` refuses any other with EACCES), or `None`;
    /// * `dmabufs[i]`: the dmabuf fd of bucket `i`, if the kernel gave one;
    ///   the CPU maps the BO through it when there is no `render_fd`;
    /// * `restored`: map at `restored_offset` (restore) instead of `offset`.
    pub fn bo_refs<'a>(
        &self,
        buckets: &[BoBucket],
        render_fd: Option<BorrowedFd<'a>>,
        dmabufs: &[Option<BorrowedFd<'a>>],
        restored: bool,
    ) -> Vec<BoRef<'a>> {
        self.bos
            .iter()
            .filter_map(|&i| buckets.get(i).map(|b| (i, b)))
            .map(|(i, b)| BoRef {
                index: i,
                gpu: b.gpu_id,
                addr: b.addr,
                size: b.size,
                alloc_flags: b.alloc_flags,
                // Through the render-node file that owns the BO, at its mmap
                // offset, or else through the BO's own dmabuf (offset 0):
                // both reach the BO's pages (`drm_gem_mmap` and
                // `drm_gem_prime_mmap` end in the same object mmap).
                cpu_map: match (render_fd, dmabufs.get(i).copied().flatten()) {
                    (Some(fd), _) => Some((
                        fd,
                        if restored {
                            b.restored_offset
                        } else {
                            b.offset
                        },
                    )),
                    (None, Some(d)) => Some((d, MmapOffset(0))),
                    (None, None) => None,
                },
                dmabuf: dmabufs.get(i).copied().flatten(),
            })
            .collect()
    }
}

/// Everything the dump of one KFD fd writes.
#[derive(Clone, Debug)]
pub struct DumpPlan {
    /// actual gpu_id → user gpu_id of this process.
    pub actual_to_user: BTreeMap<GpuId, GpuId>,
    /// The image message, without content hashes yet.
    pub image: CriuKfd,
    pub gpus: Vec<GpuWork>,
}

fn check_devices(devices: &[DeviceBucket]) -> Result<(), PlanError> {
    let (mut users, mut actuals) = (BTreeSet::new(), BTreeSet::new());
    for (index, d) in devices.iter().enumerate() {
        let bad = |what: String| Err(PlanError::BadDevice { index, what });
        if d.user.0 == 0 || d.actual.0 == 0 {
            return bad(format!("gpu_id 0 (user {}, actual {})", d.user, d.actual));
        }
        if !users.insert(d.user) {
            return bad(format!("user gpu_id {} appears twice", d.user));
        }
        if !actuals.insert(d.actual) {
            return bad(format!("actual gpu_id {} appears twice", d.actual));
        }
    }
    if devices.is_empty() {
        return Err(PlanError::BadDevice {
            index: 0,
            what: "the process has no GPU".into(),
        });
    }
    Ok(())
}

fn check_bos(bos: &[BoBucket], users: &BTreeSet<GpuId>) -> Result<(), PlanError> {
    for (index, b) in bos.iter().enumerate() {
        let bad = |what: &str| {
            Err(PlanError::BadBo {
                index,
                addr: b.addr,
                gpu: b.gpu_id,
                what: what.into(),
            })
        };
        if !users.contains(&b.gpu_id) {
            return bad("gpu_id is not one of the process' GPUs");
        }
        if b.size == 0 {
            return bad("size 0");
        }
        if b.addr.0.checked_add(b.size).is_none() {
            return bad("address range overflows");
        }
    }
    Ok(())
}

fn gpu_work(
    bos: &[BoBucket],
    user: GpuId,
    actual: GpuId,
    render_minor: RenderMinor,
) -> Result<GpuWork, PlanError> {
    let mut w = GpuWork {
        user,
        actual,
        render_minor,
        bos: Vec::new(),
        total: 0,
        largest: 0,
    };
    for (i, b) in bos.iter().enumerate() {
        if b.gpu_id == user && bo::has_contents(b.alloc_flags) {
            w.bos.push(i);
            w.total = w.total.checked_add(b.size).ok_or_else(|| PlanError::Gpu {
                gpu: user,
                what: "sum of BO sizes overflows".into(),
            })?;
            w.largest = w.largest.max(b.size);
        }
    }
    Ok(w)
}

/// Builds the dump of one process from CHECKPOINT's output and the host
/// topology.
pub fn plan_dump(
    topology: &Topology,
    ckpt: &CheckpointData,
    shared_mem: SharedMem,
) -> Result<DumpPlan, PlanError> {
    check_devices(&ckpt.devices)?;
    let users: BTreeSet<GpuId> = ckpt.devices.iter().map(|d| d.user).collect();
    check_bos(&ckpt.bos, &users)?;
    let actual_to_user: BTreeMap<GpuId, GpuId> =
        ckpt.devices.iter().map(|d| (d.actual, d.user)).collect();
    let device_entries = topology.to_image_entries(&actual_to_user)?;
    let num_of_cpus = device_entries.iter().filter(|e| e.gpu_id == 0).count();
    let mut gpus = Vec::new();
    for d in &ckpt.devices {
        let node = topology.gpu(d.actual).ok_or_else(|| PlanError::Gpu {
            gpu: d.actual,
            what: "not in the host topology".into(),
        })?;
        gpus.push(gpu_work(&ckpt.bos, d.user, d.actual, node.render_minor())?);
    }
    let image = CriuKfd {
        pid: ckpt.pid,
        num_of_gpus: ckpt.devices.len() as u32,
        num_of_cpus: num_of_cpus as u32,
        device_entries,
        num_of_bos: ckpt.bos.len() as u64,
        bo_entries: ckpt
            .bos
            .iter()
            .map(|b| KfdBoEntry {
                addr: b.addr.0,
                size: b.size,
                offset: b.offset.0,
                alloc_flags: b.alloc_flags,
                gpu_id: b.gpu_id.0,
                handle: None,
                content_xxh3: None,
                content_hash_extent: None,
                content_extent_xxh3: Vec::new(),
                parent_extents: None,
                parent_bo: None,
            })
            .collect(),
        num_of_objects: ckpt.num_objects,
        shared_mem_size: shared_mem.size,
        shared_mem_magic: shared_mem.magic,
        shared_mem_mode: (shared_mem.mode != 0).then_some(shared_mem.mode),
        semaphore_mode: (shared_mem.semaphore_mode != 0).then_some(shared_mem.semaphore_mode),
        pages_compression: None,
        pages_compression_level: None,
        criu_rocm_parent: None,
        priv_data: ckpt.priv_data.clone(),
        criu_rocm_ext_version: Some(EXT_VERSION),
        priv_bo_record_size: match crate::privdata::detect(
            &ckpt.priv_data,
            ckpt.devices.len() as u32,
            ckpt.bos.len() as u64,
            ckpt.num_objects,
        ) {
            Ok(l) => Some(l.bo_record_size as u32),
            Err(e) => {
                log::warn!("pid {}: kernel CRIU data: {e}", ckpt.pid);
                None
            }
        },
        criu_rocm_reopen: None,
    };
    Ok(DumpPlan {
        actual_to_user,
        image,
        gpus,
    })
}

impl DumpPlan {
    /// The validated image, with the content hashes the workers computed
    /// (bucket index → hash) and the encoding they wrote the pages files in.
    pub fn finish_image(
        &self,
        hashes: &BTreeMap<usize, ContentHash>,
        encoding: Encoding,
    ) -> Result<KfdImage, PlanError> {
        let mut msg = self.image.clone();
        encoding.record(&mut msg);
        for (&i, h) in hashes {
            if let Some(e) = msg.bo_entries.get_mut(i) {
                e.content_xxh3 = Some(h.value);
                // Said only where it matters: a BO of one extent has the
                // plain hash of its bytes.
                e.content_hash_extent = h.extent.filter(|&x| e.size > x);
            }
        }
        Ok(KfdImage::validate("(new kfd image)", msg)?)
    }
}

/// The render-node image of a render fd with minor `minor`.  The gpu_id is
/// translated to the user id when the process' KFD fd was dumped first;
/// otherwise (no KFD fd, or a GPU outside the KFD process) the actual id is
/// recorded, which equals the user id unless the process migrated.
///
/// criu-dev's required fields `id`, `drm_render_minor` and `num_of_bos`
/// are filled (no render-node BOs are saved) so criu-dev can read it too.
pub fn render_image(
    topology: &Topology,
    actual_to_user: &BTreeMap<GpuId, GpuId>,
    minor: RenderMinor,
    id: FileId,
) -> Result<RenderImage, PlanError> {
    let node = topology
        .gpu_by_render_minor(minor)
        .ok_or_else(|| PlanError::Render {
            minor,
            what: "no GPU with this render minor in the topology".into(),
        })?;
    let actual = node.gpu_id.expect("gpu node");
    let user = actual_to_user.get(&actual).copied().unwrap_or(actual);
    Ok(RenderImage {
        msg: CriuRenderNode {
            gpu_id: user.0,
            id: Some(id.0),
            drm_render_minor: Some(minor.0),
            num_of_bos: Some(0),
            bo_entries: Vec::new(),
        },
    })
}

/// One device of the restore: the user id KFD keeps showing the process,
/// the host GPU it now runs on, and that GPU's render node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreDevice {
    pub user: GpuId,
    pub actual: GpuId,
    pub render_minor: RenderMinor,
}

/// Inputs of RESTORE and the content work, from an image and a GPU map.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    pub devices: Vec<RestoreDevice>,
    /// RESTORE's BO buckets (user gpu_ids, old offsets).
    pub bos: Vec<BoBucket>,
    pub gpus: Vec<GpuWork>,
    /// Old render minor of each user gpu_id (from the image), to recognise
    /// the mappings of the dump host's render nodes.
    pub old_minors: BTreeMap<GpuId, RenderMinor>,
}

/// Plans RESTORE of `image` onto `host` with `map` (user → host gpu_id).
pub fn plan_restore(
    image: &KfdImage,
    host: &Topology,
    map: &GpuMap,
) -> Result<RestorePlan, PlanError> {
    let mut devices = Vec::new();
    let mut old_minors = BTreeMap::new();
    for e in image.msg.device_entries.iter().filter(|e| e.gpu_id != 0) {
        let user = GpuId(e.gpu_id);
        let actual = map.get(user).ok_or_else(|| PlanError::Gpu {
            gpu: user,
            what: "no host GPU was chosen for it".into(),
        })?;
        let node = host.gpu(actual).ok_or_else(|| PlanError::Gpu {
            gpu: actual,
            what: "the chosen host GPU is not in the host topology".into(),
        })?;
        devices.push(RestoreDevice {
            user,
            actual,
            render_minor: node.render_minor(),
        });
        old_minors.insert(user, RenderMinor(e.drm_render_minor));
    }
    let bos: Vec<BoBucket> = image
        .msg
        .bo_entries
        .iter()
        .map(|b| BoBucket {
            addr: GpuVa(b.addr),
            size: b.size,
            offset: MmapOffset(b.offset),
            restored_offset: MmapOffset(0),
            gpu_id: GpuId(b.gpu_id),
            alloc_flags: b.alloc_flags,
            dmabuf_fd: bo::KFD_INVALID_FD,
        })
        .collect();
    let mut gpus = Vec::new();
    for d in &devices {
        gpus.push(gpu_work(&bos, d.user, d.actual, d.render_minor)?);
    }
    Ok(RestorePlan {
        devices,
        bos,
        gpus,
        old_minors,
    })
}

/// The device a mapping is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKind {
    Kfd,
    Render(RenderMinor),
}

impl DeviceKind {
    /// Recognises `/dev/kfd` and `/dev/dri/renderD<N>` paths as CRIU records
    /// them (a leading `//` is collapsed).
    pub fn from_path(path: &str) -> Option<Self> {
        let trimmed = path.trim_start_matches('/');
        if trimmed == "dev/kfd" {
            return Some(DeviceKind::Kfd);
        }
        let minor = trimmed.strip_prefix("dev/dri/renderD")?;
        if minor.is_empty() || !minor.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        minor
            .parse()
            .ok()
            .map(|m| DeviceKind::Render(RenderMinor(m)))
    }
}

/// One restored BO mapping: where it was, where it is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmaFixup {
    pub bo_index: usize,
    pub addr: GpuVa,
    pub size: u64,
    /// The device the mapping was on at dump, and its offset there.
    pub old_device: DeviceKind,
    pub old_offset: MmapOffset,
    /// The device to map now, and the offset there.
    pub new_device: DeviceKind,
    pub new_offset: MmapOffset,
}

/// The answer for one VMA: map `device` at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmaRemap {
    pub bo_index: usize,
    pub device: DeviceKind,
    pub offset: MmapOffset,
}

/// Restored BO mappings, looked up by the VMAs CRIU restores.
#[derive(Clone, Debug, Default)]
pub struct VmaFixups {
    entries: Vec<VmaFixup>,
}

impl VmaFixups {
    /// Builds the table from RESTORE's output buckets (with
    /// `restored_offset`s).  Only BOs whose mapping lives on a device node
    /// get an entry; USERPTR memory is ordinary process memory.
    pub fn from_restored(plan: &RestorePlan, restored: &[BoBucket]) -> Result<Self, PlanError> {
        let mut entries = Vec::new();
        for (i, b) in restored.iter().enumerate() {
            if !bo::needs_vma_fixup(b.alloc_flags) {
                continue;
            }
            let dev = plan
                .devices
                .iter()
                .find(|d| d.user == b.gpu_id)
                .ok_or_else(|| PlanError::BadBo {
                    index: i,
                    addr: b.addr,
                    gpu: b.gpu_id,
                    what: "restored BO of a GPU that is not in the plan".into(),
                })?;
            let (old_device, new_device) = if bo::has_contents(b.alloc_flags) {
                (
                    DeviceKind::Render(plan.old_minors[&b.gpu_id]),
                    DeviceKind::Render(dev.render_minor),
                )
            } else {
                (DeviceKind::Kfd, DeviceKind::Kfd)
            };
            entries.push(VmaFixup {
                bo_index: i,
                addr: b.addr,
                size: b.size,
                old_device,
                old_offset: b.offset,
                new_device,
                new_offset: b.restored_offset,
            });
        }
        Ok(VmaFixups { entries })
    }

    pub fn entries(&self) -> &[VmaFixup] {
        &self.entries
    }

    /// Finds the new device and offset of a mapping of `len` bytes of
    /// `device` at byte offset `pgoff` (`len` 0 = unknown, only `pgoff` is
    /// checked).  The VMA may cover any part of a BO (split by mprotect, a
    /// partial mapping) at any CPU address: it matches the BO whose old
    /// offset range on that device contains `[pgoff, pgoff + len)`, and
    /// keeps its offset within the BO.  This includes upstream's exact
    /// `(addr, offset)` match and the address-range rule (a VMA at
    /// `addr + delta` with `pgoff = offset + delta`).  Offset ranges of
    /// distinct BOs on one device do not overlap (DRM fake offsets are
    /// unique per device; KFD offsets encode type and GPU), so the match is
    /// unique.  `None`: not a restored BO (e.g. the KFD events page).
    pub fn lookup(&self, device: DeviceKind, pgoff: u64, len: u64) -> Option<VmaRemap> {
        self.entries.iter().find_map(|e| {
            if e.old_device != device {
                return None;
            }
            let delta = pgoff.checked_sub(e.old_offset.0)?;
            if delta >= e.size || len > e.size - delta {
                return None;
            }
            Some(VmaRemap {
                bo_index: e.bo_index,
                device: e.new_device,
                offset: MmapOffset(e.new_offset.0.checked_add(delta)?),
            })
        })
    }
}

/// File identity: character devices compare by device number (a real
/// `/dev/kfd` may be reached through other nodes with the same rdev);
/// other files (the emulator's nodes on FUSE) by device and inode.
/// Whether two `stat`s are the same device file: character devices by
/// rdev (a container's own node of a device is another inode), anything
/// else (an emulated node, a bind mount of one) by device and inode.
pub fn same_file(a: &libc::stat, b: &libc::stat) -> bool {
    let chr = |s: &libc::stat| s.st_mode & libc::S_IFMT == libc::S_IFCHR;
    match (chr(a), chr(b)) {
        (true, true) => a.st_rdev == b.st_rdev,
        (false, false) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// Decides whether a file (an fd or a mapping's file, as `stat`) is
/// `/dev/kfd`, one of the render nodes, or none of ours.  The one place
/// that recognises GPU device files.
pub fn classify_device(
    st: &libc::stat,
    kfd: Option<&libc::stat>,
    render_nodes: &[(RenderMinor, libc::stat)],
) -> Option<DeviceKind> {
    if kfd.is_some_and(|k| same_file(st, k)) {
        return Some(DeviceKind::Kfd);
    }
    render_nodes
        .iter()
        .find(|(_, r)| same_file(st, r))
        .map(|(m, _)| DeviceKind::Render(*m))
}

pub use crate::os::file::{stat_fd, stat_path};

/// The identities of this host's (or namespace's) GPU device files:
/// `<dev>/kfd` and every `<dev>/dri/renderD<N>`.  Missing files are simply
/// absent (a host without AMD GPUs has none, and nothing is "ours").
#[derive(Clone, Default)]
pub struct DeviceIdentities {
    pub kfd: Option<libc::stat>,
    pub render_nodes: Vec<(RenderMinor, libc::stat)>,
}

impl DeviceIdentities {
    /// Stats the device files below `dev` (the product passes `/dev`).
    pub fn probe(dev: &Path) -> Self {
        let kfd = stat_path(&dev.join("kfd")).ok();
        let mut render_nodes = Vec::new();
        if let Ok(rd) = std::fs::read_dir(dev.join("dri")) {
            for ent in rd.flatten() {
                let name = ent.file_name();
                let Some(minor) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("renderD"))
                    .and_then(|m| m.parse::<u32>().ok())
                else {
                    continue;
                };
                if let Ok(st) = stat_path(&ent.path()) {
                    render_nodes.push((RenderMinor(minor), st));
                }
            }
        }
        render_nodes.sort_by_key(|(m, _)| *m);
        DeviceIdentities { kfd, render_nodes }
    }

    /// See [`classify_device`].
    pub fn classify(&self, st: &libc::stat) -> Option<DeviceKind> {
        classify_device(st, self.kfd.as_ref(), &self.render_nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Checks;
    use crate::image::tests::tempdir;
    use crate::matcher::match_gpus;
    use crate::topology::tests::{cpu, gpu};
    use crate::topology::IOLINK_PCIE as P;
    use std::ffi::CString;

    fn host() -> Topology {
        Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2), (P, 3)]),
            gpu(1, 0x1111, &[(P, 0)]),
            gpu(2, 0x2222, &[(P, 0)]),
            gpu(3, 0x3333, &[(P, 0)]),
        ])
    }

    fn ckpt() -> CheckpointData {
        // A process restored before: user ids differ from actual ids, and it
        // only has two of the three GPUs.
        let vram = bo::ALLOC_VRAM | bo::ALLOC_WRITABLE;
        let bucket = |addr: u64, size, offset, gpu, flags| BoBucket {
            addr: GpuVa(addr),
            size,
            offset: MmapOffset(offset),
            restored_offset: MmapOffset(0),
            gpu_id: GpuId(gpu),
            alloc_flags: flags,
            dmabuf_fd: bo::KFD_INVALID_FD,
        };
        CheckpointData {
            pid: 77,
            devices: vec![
                DeviceBucket {
                    user: GpuId(0xaaaa),
                    actual: GpuId(0x2222),
                },
                DeviceBucket {
                    user: GpuId(0xbbbb),
                    actual: GpuId(0x3333),
                },
            ],
            bos: vec![
                bucket(0x10_0000, 0x4000, 0x1_0000_0000, 0xaaaa, vram),
                bucket(
                    0x20_0000,
                    0x2000,
                    0xc000_0000_0000_0000,
                    0xaaaa,
                    bo::ALLOC_DOORBELL,
                ),
                bucket(0x30_0000, 0x1000, 0x1_0001_0000, 0xbbbb, bo::ALLOC_GTT),
                bucket(0x40_0000, 0x8000, 0x1_0002_0000, 0xaaaa, vram),
                bucket(0x50_0000, 0x1000, 0x7fff_0000, 0xbbbb, bo::ALLOC_USERPTR),
            ],
            num_objects: 3,
            priv_data: vec![1; 64],
        }
    }

    #[test]
    fn dump_plan_uses_user_ids_and_skips_foreign_gpus() {
        let p = plan_dump(&host(), &ckpt(), SharedMem::default()).unwrap();
        assert_eq!(p.image.num_of_gpus, 2);
        assert_eq!(p.image.num_of_cpus, 1);
        let gpu_ids: Vec<u32> = p.image.device_entries.iter().map(|e| e.gpu_id).collect();
        assert_eq!(gpu_ids, vec![0, 0xaaaa, 0xbbbb]);
        assert_eq!(p.gpus.len(), 2);
        let a = &p.gpus[0];
        assert_eq!(
            (a.user, a.actual, a.render_minor),
            (GpuId(0xaaaa), GpuId(0x2222), RenderMinor(130))
        );
        assert_eq!(a.bos, vec![0, 3]);
        assert_eq!((a.total, a.largest), (0xc000, 0x8000));
        assert_eq!(p.gpus[1].bos, vec![2]);
        assert_eq!(
            p.image.priv_bo_record_size, None,
            "the test blob is not a kernel blob"
        );
        let h = |value, extent| ContentHash { value, extent };
        let hashes = BTreeMap::from([(0, h(11, Some(4096))), (3, h(33, None))]);
        let img = p.finish_image(&hashes, Encoding::Raw).unwrap();
        let b = &img.msg.bo_entries;
        assert_eq!(b[3].content_xxh3, Some(33));
        assert_eq!(b[3].content_hash_extent, None);
        assert_eq!(b[1].content_xxh3, None);
        assert_eq!(b[0].content_xxh3, Some(11));
        assert!(b[0].size > 4096, "the fixture's BO 0 spans several extents");
        assert_eq!(b[0].content_hash_extent, Some(4096));
        let hashes = BTreeMap::from([(0, h(11, Some(b[0].size)))]);
        let img = p.finish_image(&hashes, Encoding::Raw).unwrap();
        assert_eq!(
            img.msg.bo_entries[0].content_hash_extent, None,
            "a BO of one extent has the plain hash, said without an extent"
        );
    }

    #[test]
    fn dump_plan_records_the_kernel_bo_record_size() {
        let mut c = ckpt();
        // process + 2 devices + 5 BOs of 272 bytes, 3 events.
        let mut blob = vec![0u8; 8 + 2 * 8 + 5 * 272];
        blob[0] = 1;
        for _ in 0..3 {
            let mut ev = vec![0u8; 64];
            ev[0] = 1;
            blob.extend_from_slice(&ev);
        }
        c.priv_data = blob;
        let p = plan_dump(&host(), &c, SharedMem::default()).unwrap();
        assert_eq!(p.image.priv_bo_record_size, Some(272));
        let img = p.finish_image(&BTreeMap::new(), Encoding::Raw).unwrap();
        assert_eq!(img.priv_layout().unwrap().events, 3);
    }

    #[test]
    fn dump_plan_rejects_inconsistent_buckets() {
        let mut c = ckpt();
        c.bos[2].gpu_id = GpuId(0x1111);
        let e = plan_dump(&host(), &c, SharedMem::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("BO 2") && e.contains("0x1111"), "{e}");
        let mut c = ckpt();
        c.devices[1].actual = GpuId(0x2222);
        let e = plan_dump(&host(), &c, SharedMem::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("appears twice"), "{e}");
        let mut c = ckpt();
        c.devices[1].actual = GpuId(0x4444);
        let e = plan_dump(&host(), &c, SharedMem::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("0x4444"), "{e}");
    }

    #[test]
    fn render_image_translates_to_user_ids() {
        let p = plan_dump(&host(), &ckpt(), SharedMem::default()).unwrap();
        let r = render_image(&host(), &p.actual_to_user, RenderMinor(131), FileId(9)).unwrap();
        assert_eq!(r.gpu_id(), GpuId(0xbbbb));
        assert_eq!(r.msg.id, Some(9));
        let r = render_image(&host(), &p.actual_to_user, RenderMinor(129), FileId(9)).unwrap();
        assert_eq!(
            r.gpu_id(),
            GpuId(0x1111),
            "GPU outside the KFD process keeps its id"
        );
        assert!(render_image(&host(), &p.actual_to_user, RenderMinor(140), FileId(9)).is_err());
    }

    fn restore_setup() -> (RestorePlan, Vec<BoBucket>) {
        let p = plan_dump(&host(), &ckpt(), SharedMem::default()).unwrap();
        let img = p.finish_image(&BTreeMap::new(), Encoding::Raw).unwrap();
        let image_topo = Topology::from_image_entries(&img.msg.device_entries).unwrap();
        // The new host has two GPUs with new ids and render minors.
        let new_host = Topology::new(vec![
            cpu(0, &[(P, 5), (P, 6)]),
            gpu(5, 0x5555, &[(P, 0)]),
            gpu(6, 0x6666, &[(P, 0)]),
        ]);
        let map = match_gpus(&image_topo, &new_host, &Checks::default()).unwrap();
        let plan = plan_restore(&img, &new_host, &map).unwrap();
        let mut restored = plan.bos.clone();
        for (i, b) in restored.iter_mut().enumerate() {
            b.restored_offset = MmapOffset(0x9_0000_0000 + (i as u64) * 0x10_0000);
        }
        (plan, restored)
    }

    #[test]
    fn restore_plan_and_vma_fixups() {
        let (plan, restored) = restore_setup();
        assert_eq!(plan.devices.len(), 2);
        let a = plan
            .devices
            .iter()
            .find(|d| d.user == GpuId(0xaaaa))
            .unwrap();
        assert!(matches!(
            a.render_minor,
            RenderMinor(133) | RenderMinor(134)
        ));
        assert_eq!(plan.old_minors[&GpuId(0xaaaa)], RenderMinor(130));
        let g = plan.gpus.iter().find(|g| g.user == GpuId(0xaaaa)).unwrap();
        assert_eq!(g.bos, vec![0, 3]);

        let dev = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsFd;
        let refs = g.bo_refs(
            &restored,
            Some(dev.as_fd()),
            &[None, None, None, Some(dev.as_fd())],
            true,
        );
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[1].index, 3);
        // Through the owning render fd at the restored offset; through the
        // dmabuf, at offset 0, only without a render fd.
        assert_eq!(refs[1].cpu_map.unwrap().1, MmapOffset(0x9_0030_0000));
        assert!(refs[0].dmabuf.is_none() && refs[1].dmabuf.is_some());
        let no_render = g.bo_refs(
            &restored,
            None,
            &[None, None, None, Some(dev.as_fd())],
            true,
        );
        assert_eq!(no_render[1].cpu_map.unwrap().1, MmapOffset(0));
        assert!(no_render[0].cpu_map.is_none());
        assert_eq!(
            g.bo_refs(&restored, None, &[], false)[0]
                .cpu_map
                .map(|m| m.1),
            None
        );

        let fx = VmaFixups::from_restored(&plan, &restored).unwrap();
        assert_eq!(fx.entries().len(), 4, "userptr BO has no fix-up");
        let old = DeviceKind::Render(RenderMinor(130));
        // Whole BO, at its GPU VA.
        let r = fx
            .lookup(old, 0x1_0000_0000, 0x10_4000 - 0x10_0000)
            .unwrap();
        assert_eq!(r.offset, MmapOffset(0x9_0000_0000));
        assert_eq!(r.device, DeviceKind::Render(a.render_minor));
        // Tail of BO 3 after an mprotect split, mapped at another address.
        let r = fx
            .lookup(old, 0x1_0002_6000, 0x7000_2000 - 0x7000_0000)
            .unwrap();
        assert_eq!((r.bo_index, r.offset), (3, MmapOffset(0x9_0030_6000)));
        // Past the end of the BO: no match.
        assert!(fx
            .lookup(old, 0x1_0002_6000, 0x7000_4000 - 0x7000_0000)
            .is_none());
        // Same offset on another device: no match.
        assert!(fx
            .lookup(DeviceKind::Render(RenderMinor(131)), 0x1_0000_0000, 0x4000)
            .is_none());
        // Doorbell on /dev/kfd.
        let r = fx
            .lookup(
                DeviceKind::Kfd,
                0xc000_0000_0000_0000,
                0x20_2000 - 0x20_0000,
            )
            .unwrap();
        assert_eq!(
            (r.device, r.offset),
            (DeviceKind::Kfd, MmapOffset(0x9_0010_0000))
        );
        // Length unknown (0): the offset alone decides.
        assert_eq!(fx.lookup(old, 0x1_0002_7000, 0).unwrap().bo_index, 3);
        assert!(fx.lookup(old, 0x1_0002_8000, 0).is_none());
        // Events page: not ours.
        assert!(fx
            .lookup(
                DeviceKind::Kfd,
                0x8000_0000_0000_0000,
                0x60_1000 - 0x60_0000
            )
            .is_none());
    }

    #[test]
    fn hsakmt_shared_mem_probe_and_recreate() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempdir();
        let path = dir.join("hsakmt_shared_mem");
        let sem_file = dir.join("sem.test");
        assert_eq!(
            SharedMem::probe(&path, &sem_file).unwrap(),
            SharedMem::default()
        );
        let mode_of = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Old images record no mode: the thunk's own 0666.
        let sm = SharedMem {
            size: 8192,
            magic: 0x1234_5678,
            ..SharedMem::default()
        };
        assert!(sm.recreate(&path).unwrap());
        assert!(!sm.recreate(&path).unwrap(), "existing file left alone");
        assert_eq!(mode_of(&path), 0o666);
        std::fs::remove_file(&path).unwrap();
        // A recorded mode is restored whatever the umask.
        let sm = SharedMem { mode: 0o640, ..sm };
        assert!(sm.recreate(&path).unwrap());
        assert_eq!(mode_of(&path), 0o640);
        std::fs::write(&sem_file, b"x").unwrap();
        std::fs::set_permissions(&sem_file, std::fs::Permissions::from_mode(0o604)).unwrap();
        assert_eq!(
            SharedMem::probe(&path, &sem_file).unwrap(),
            SharedMem {
                semaphore_mode: 0o604,
                ..sm
            }
        );
        assert!(!SharedMem::default().recreate(&dir.join("none")).unwrap());
        let stem = format!("amdgpu-cr-test-{}", std::process::id());
        let name = CString::new(format!("/{stem}")).unwrap();
        let file = Path::new("/dev/shm").join(format!("sem.{stem}"));
        assert!(ensure_semaphore(&name, &file, 0o602).unwrap());
        assert!(!ensure_semaphore(&name, &file, 0o666).unwrap());
        assert_eq!(mode_of(&file), 0o602);
        crate::os::file::unlink_semaphore(&name).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_paths() {
        assert_eq!(DeviceKind::from_path("/dev/kfd"), Some(DeviceKind::Kfd));
        assert_eq!(DeviceKind::from_path("//dev/kfd"), Some(DeviceKind::Kfd));
        assert_eq!(
            DeviceKind::from_path("/dev/dri/renderD129"),
            Some(DeviceKind::Render(RenderMinor(129)))
        );
        assert_eq!(DeviceKind::from_path("/dev/dri/card0"), None);
        assert_eq!(DeviceKind::from_path("/dev/dri/renderD"), None);
        assert_eq!(DeviceKind::from_path("/dev/dri/renderD12x"), None);
        assert_eq!(DeviceKind::from_path("/dev/kfd2"), None);
    }

    #[test]
    fn classify_by_file_identity() {
        let dir = tempdir();
        std::fs::create_dir_all(dir.join("dri")).unwrap();
        std::fs::write(dir.join("kfd"), b"").unwrap();
        std::fs::write(dir.join("dri/renderD128"), b"").unwrap();
        std::fs::write(dir.join("dri/renderD129"), b"").unwrap();
        std::fs::write(dir.join("dri/card0"), b"").unwrap();
        std::fs::write(dir.join("other"), b"").unwrap();
        let ids = DeviceIdentities::probe(&dir);
        assert_eq!(ids.render_nodes.len(), 2);
        let f = std::fs::File::open(dir.join("dri/renderD129")).unwrap();
        use std::os::fd::AsFd;
        let st = stat_fd(f.as_fd()).unwrap();
        assert_eq!(
            ids.classify(&st),
            Some(DeviceKind::Render(RenderMinor(129)))
        );
        assert_eq!(
            ids.classify(&stat_path(&dir.join("kfd")).unwrap()),
            Some(DeviceKind::Kfd)
        );
        assert_eq!(ids.classify(&stat_path(&dir.join("other")).unwrap()), None);
        // A hard link is the same file.
        std::fs::hard_link(dir.join("kfd"), dir.join("kfd-link")).unwrap();
        assert_eq!(
            ids.classify(&stat_path(&dir.join("kfd-link")).unwrap()),
            Some(DeviceKind::Kfd)
        );
        // Character devices compare by rdev: /dev/null is not /dev/zero, and a
        // regular file never equals a character device.
        let null = stat_path(Path::new("/dev/null")).unwrap();
        let zero = stat_path(Path::new("/dev/zero")).unwrap();
        assert_eq!(
            classify_device(&null, Some(&null), &[]),
            Some(DeviceKind::Kfd)
        );
        assert_eq!(classify_device(&zero, Some(&null), &[]), None);
        assert_eq!(
            classify_device(&null, ids.kfd.as_ref(), &ids.render_nodes),
            None
        );
        // No /dev/kfd at all: nothing is ours.
        assert_eq!(
            DeviceIdentities::probe(&dir.join("nope")).classify(&null),
            None
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
