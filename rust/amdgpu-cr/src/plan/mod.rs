//! Dump and restore plans: pure data transformations between the KFD CRIU
//! buckets, the topology and the image.  Beside them: the VMA fix-up table
//! (`vma`), the recognition of GPU device files (`device`) and the thunk's
//! shared memory and semaphore (`hsakmt`).
//!
//! Id spaces: KFD's CHECKPOINT reports each device's *user* gpu_id (what
//! the application first saw) and *actual* gpu_id (the GPU it runs on);
//! BO buckets carry the user id.  Images store user ids only.  Pages files
//! are named and filtered by user id on both sides (upstream mixes actual
//! and user ids at dump, which breaks re-checkpointing a migrated process).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::BorrowedFd;

use crate::bo;
use crate::bo::BoRef;
use crate::ids::{GpuId, GpuVa, MmapOffset, RenderMinor};
use crate::image::{FileId, KfdImage, RenderImage, EXT_VERSION};
use crate::matcher::GpuMap;
use crate::pages::{record_hashes, ContentHash, Encoding};
use crate::proto::{CriuKfd, CriuRenderNode, KfdBoEntry};
use crate::topology::{Topology, TopologyError};

mod device;
mod hsakmt;
mod vma;

pub use device::{classify_device, same_file, stat_fd, stat_path, DeviceIdentities, DeviceKind};
pub use hsakmt::{
    ensure_semaphore, open_semaphore, SharedMem, HSAKMT_SEMAPHORE, HSAKMT_SEMAPHORE_FILE,
    HSAKMT_SHM,
};
pub use vma::{OffsetIndex, Overlap, VmaFixup, VmaFixups, VmaRemap};

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
        pages_compression_chunk: None,
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
        criu_rocm_imports: Vec::new(),
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
        record_hashes(&mut msg.bo_entries, hashes);
        Ok(KfdImage::validate("(new kfd image)", msg)?)
    }
}

/// The render-node image of a render fd with minor `minor`.  The gpu_id is
/// translated to the user id when the process' KFD fd was dumped first;
/// otherwise (no KFD fd, or a GPU outside the KFD process) the actual id is
/// recorded, which equals the user id unless the process migrated.
///
/// criu-dev's required fields `id`, `drm_render_minor` and `num_of_bos`
/// are filled (0 BOs: the dump adds the file's GEM BOs, see
/// `session::gem`) so criu-dev can read it too.
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
    let user = actual_to_user.get(&actual).copied();
    Ok(RenderImage {
        msg: CriuRenderNode {
            gpu_id: user.unwrap_or(actual).0,
            id: Some(id.0),
            drm_render_minor: Some(minor.0),
            num_of_bos: Some(0),
            // No KFD process of the task has the GPU: no KFD image
            // describes it, this does (session/render_gpu.rs).
            criu_rocm_gpu: user.is_none().then(|| node.gpu_entry()),
            ..Default::default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Checks;
    use crate::image::tests::tempdir;
    use crate::matcher::match_gpus;
    use crate::topology::tests::{cpu, gpu};
    use crate::topology::IOLINK_PCIE as P;
    use std::ffi::CString;
    use std::path::Path;

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
        assert_eq!(r.msg.criu_rocm_gpu, None, "a KFD image describes the GPU");
        assert_eq!(r.msg.id, Some(9));
        let r = render_image(&host(), &p.actual_to_user, RenderMinor(129), FileId(9)).unwrap();
        assert_eq!(
            r.gpu_id(),
            GpuId(0x1111),
            "GPU outside the KFD process keeps its id"
        );
        let e = r
            .msg
            .criu_rocm_gpu
            .as_ref()
            .expect("the GPU's entry recorded");
        assert_eq!((e.node_id, e.gpu_id, e.drm_render_minor), (1, 0x1111, 129));
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

    /// Two processes of one dump see the dump host's GPUs by ids of their
    /// own (77 restored before, its user ids in the other order of the
    /// GPUs'; 78 started since, with the host's ids), and each KFD image is
    /// matched to the restoring host by itself: every dump GPU (by its
    /// render minor at dump) must still land on one host GPU for both, or a
    /// BO one process hands the other would be of two GPUs.
    #[test]
    fn every_process_of_a_dump_maps_a_gpu_to_one_host_gpu() {
        let restored = CheckpointData {
            devices: vec![
                DeviceBucket {
                    user: GpuId(0xbbbb),
                    actual: GpuId(0x2222),
                },
                DeviceBucket {
                    user: GpuId(0xaaaa),
                    actual: GpuId(0x3333),
                },
            ],
            bos: vec![],
            ..ckpt()
        };
        let fresh = CheckpointData {
            pid: 78,
            devices: [0x2222, 0x3333]
                .map(|g| DeviceBucket {
                    user: GpuId(g),
                    actual: GpuId(g),
                })
                .to_vec(),
            ..restored.clone()
        };
        // The restoring host: the same GPUs, other ids and minors, listed
        // in the other order.
        let new_host = Topology::new(vec![
            cpu(0, &[(P, 5), (P, 6)]),
            gpu(5, 0x6666, &[(P, 0)]),
            gpu(6, 0x5555, &[(P, 0)]),
        ]);
        let by_minor = |c: &CheckpointData| {
            let p = plan_dump(&host(), c, SharedMem::default()).unwrap();
            let img = p.finish_image(&BTreeMap::new(), Encoding::Raw).unwrap();
            let topo = Topology::from_image_entries(&img.msg.device_entries).unwrap();
            let map = match_gpus(&topo, &new_host, &Checks::default()).unwrap();
            let plan = plan_restore(&img, &new_host, &map).unwrap();
            plan.devices
                .iter()
                .map(|d| (plan.old_minors[&d.user], d.actual))
                .collect::<BTreeMap<_, _>>()
        };
        let (a, b) = (by_minor(&restored), by_minor(&fresh));
        assert_eq!(a.len(), 2);
        assert_eq!(a, b);
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

        assert_vma_fixups(&plan, &restored, a.render_minor);
    }

    /// The fix-ups of [`restore_setup`]'s restore (GPU 0xaaaa's render
    /// node now `new_minor`): BOs found by their old offsets, whole or in
    /// part, on their own device only; the doorbell; not the events page.
    fn assert_vma_fixups(plan: &RestorePlan, restored: &[BoBucket], new_minor: RenderMinor) {
        let fx = VmaFixups::from_restored(plan, restored).unwrap();
        assert_eq!(fx.entries().len(), 4, "userptr BO has no fix-up");
        let old = DeviceKind::Render(RenderMinor(130));
        // Whole BO, at its GPU VA.
        let r = fx
            .lookup(old, 0x1_0000_0000, 0x10_4000 - 0x10_0000)
            .unwrap();
        assert_eq!(r.offset, MmapOffset(0x9_0000_0000));
        assert_eq!(r.device, DeviceKind::Render(new_minor));
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
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
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
        let created = |sm: &SharedMem, p: &Path| sm.open_or_recreate(p).unwrap().unwrap().1;
        assert!(created(&sm, &path));
        assert!(!created(&sm, &path), "existing file left alone");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["hsakmt_shared_mem"], "no temporary file left");
        assert_eq!(mode_of(&path), 0o666);
        std::fs::remove_file(&path).unwrap();
        // A recorded mode is restored whatever the umask.
        let sm = SharedMem { mode: 0o640, ..sm };
        assert!(created(&sm, &path));
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
        assert!(SharedMem::default()
            .open_or_recreate(&dir.join("none"))
            .unwrap()
            .is_none());
        // The scratch directory's random name: no other run, in this pid
        // namespace or another, takes the same semaphore.
        let stem = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let name = CString::new(format!("/{stem}")).unwrap();
        let file = Path::new("/dev/shm").join(format!("sem.{stem}"));
        assert!(ensure_semaphore(&name, &file, 0o602).unwrap());
        assert!(!ensure_semaphore(&name, &file, 0o666).unwrap());
        assert_eq!(mode_of(&file), 0o602);
        let (held, made) = open_semaphore(&name, &file, 0o666).unwrap();
        assert!(!made, "existing semaphore left alone");
        assert_eq!(
            held.metadata().unwrap().ino(),
            file.metadata().unwrap().ino()
        );
        crate::os::file::unlink_semaphore(&name).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The file handed back is the one made or found, whatever becomes of
    /// its name: removed and replaced by another program's file (of
    /// another size) right after.
    #[test]
    fn hsakmt_shared_mem_held_through_replacement() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempdir();
        let path = dir.join("hsakmt_shared_mem");
        let sm = SharedMem {
            size: 8192,
            magic: 0x1234_5678,
            ..SharedMem::default()
        };
        let (held, made) = sm.open_or_recreate(&path).unwrap().unwrap();
        assert!(made);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, [0u8; 16]).unwrap();
        let md = held.metadata().unwrap();
        assert_eq!(
            (md.len(), md.nlink()),
            (8192, 0),
            "still the file made here"
        );
        let (found, made) = sm.open_or_recreate(&path).unwrap().unwrap();
        assert!(!made, "an existing file is used as it is");
        assert_eq!(found.metadata().unwrap().len(), 16);
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
        // A task in a chroot: CRIU records its nodes below the chroot.
        assert_eq!(
            DeviceKind::from_path("srv/sid/dev/dri/renderD130"),
            Some(DeviceKind::Render(RenderMinor(130)))
        );
        assert_eq!(
            DeviceKind::from_path("srv/sid/dev/kfd"),
            Some(DeviceKind::Kfd)
        );
        assert_eq!(DeviceKind::from_path("dev/kfd"), Some(DeviceKind::Kfd));
        assert_eq!(DeviceKind::from_path("srv/devkfd"), None);
        assert_eq!(DeviceKind::from_path("srv/dev/renderD128"), None);
        assert_eq!(DeviceKind::from_path("srv/xdev/dri/renderD128"), None);
        assert_eq!(DeviceKind::from_path("kfd"), None);
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
