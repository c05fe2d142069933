//! KFD as a further holder across processes (issue 29): a BO one process
//! imported over KFD (`IMPORT_DMABUF`, as HIP IPC's `hipIpcOpenMemHandle`
//! does with ROCr's dma-buf IPC) from a BO another process of the dump
//! holds.
//!
//! Dump.  The BO is claimed as its first holder's ([`super::dmabuf`]); the
//! importer's KFD image leaves it out of `bo_entries` and of KFD's
//! `priv_data` (KFD's RESTORE cannot import a dma-buf) and records it in
//! `criu_rocm_imports` instead: its bucket and record as CHECKPOINT gave
//! them, and the first holder's file, BO index and pid.  Its bytes are the
//! first holder's, saved once ([`take_imports`]).
//!
//! Restore.  The importer's RESTORE recreates its other BOs at their IDR
//! ids; then, once the first holder's task posted a dma-buf of the restored
//! BO on the exchange ([`super::xproc`]), the importer takes it and imports
//! it at its VA and maps it on its GPUs ([`import_all`]), all in its file
//! restore, before any task runs its own code.
//!
//! Handles.  KFD names a BO `gpu_id << 32 | id`, the id from the process'
//! IDR of the GPU: RESTORE puts each BO at its saved id, and
//! `IMPORT_DMABUF` takes the lowest free one (`idr_alloc(0, 0)`).  An
//! import gets its saved handle back only when every lower id of its GPU
//! is held by a BO restored before it ([`check_handles`]): the dump refuses
//! a process where that does not hold (a BO freed below the import since),
//! and the restore checks again before it imports anything.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::dmabuf::Holder;
use super::xproc::Exchange;
use super::SessionError;
use crate::ids::GpuId;
use crate::image::{FileId, KfdImage};
use crate::plan::CheckpointData;
use crate::privdata::{self, BoRecord};
use crate::proto::KfdImportEntry;
use kfd_abi::ids::BoHandle;

/// An import whose handle `IMPORT_DMABUF` would not give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HandleClash {
    /// User gpu_id.
    pub gpu: u32,
    pub idr: u32,
    /// The id the import would get.
    pub lowest: u32,
}

impl std::fmt::Display for HandleClash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KFD's IMPORT_DMABUF hands the lowest free id of the GPU's IDR, {} once the \
             process' other BOs are restored, not its id {} of the dump (handle {}): a BO \
             below it was freed since",
            self.lowest,
            self.idr,
            BoHandle::new(GpuId(self.gpu), self.idr)
        )
    }
}

/// Whether importing `imports` (user gpu_id, IDR id) in order, after the
/// BOs `held` (user gpu_id, IDR id) exist, gives each its id back.
pub(crate) fn check_handles(
    held: impl IntoIterator<Item = (u32, u32)>,
    imports: &[(u32, u32)],
) -> Result<(), HandleClash> {
    let mut taken: BTreeSet<(u32, u32)> = held.into_iter().collect();
    for &(gpu, idr) in imports {
        let lowest = (0..=u32::MAX)
            .find(|&i| !taken.contains(&(gpu, i)))
            .unwrap_or(u32::MAX);
        if lowest != idr {
            return Err(HandleClash { gpu, idr, lowest });
        }
        taken.insert((gpu, idr));
    }
    Ok(())
}

/// The imports in the order they are made: by GPU, then id.
fn import_order(imports: &[KfdImportEntry]) -> Vec<&KfdImportEntry> {
    let mut v: Vec<&KfdImportEntry> = imports.iter().collect();
    v.sort_by_key(|e| (e.gpu_id, e.idr_handle));
    v
}

/// The BO records of a CHECKPOINT's (or an image's) private data.
fn records(
    blob: &[u8],
    num_devices: u32,
    num_bos: u64,
    num_objects: u32,
) -> Result<(privdata::PrivLayout, Vec<BoRecord>), String> {
    let layout = privdata::detect(blob, num_devices, num_bos, num_objects)
        .map_err(|e| format!("KFD's private data: {e}"))?;
    let recs = privdata::bo_records(blob, num_devices, num_bos, &layout)
        .ok_or("KFD's private data is shorter than its BO records")?;
    Ok((layout, recs))
}

/// At dump: takes the BOs of `ckpt` that are imports (bucket index → the
/// BO they are, of another process' KFD file) out of it, its `dmabufs`
/// (by bucket) in step, and returns their records for the image
/// (`criu_rocm_imports`).  Refused, naming the BO: a first holder without
/// a file, a handle an import could not get back, no BO left for RESTORE.
pub(crate) fn take_imports(
    pid: i32,
    ckpt: &mut CheckpointData,
    dmabufs: &mut Vec<Option<OwnedFd>>,
    imports: &BTreeMap<usize, Holder>,
) -> Result<Vec<KfdImportEntry>, SessionError> {
    let fail = |what: String| SessionError::State { pid, what };
    let ndev = ckpt.devices.len() as u32;
    let (layout, recs) = records(
        &ckpt.priv_data,
        ndev,
        ckpt.bos.len() as u64,
        ckpt.num_objects,
    )
    .map_err(fail)?;
    let mut out = Vec::new();
    for (&i, first) in imports {
        let (b, r) = (&ckpt.bos[i], &recs[i]);
        let file = first.file.ok_or_else(|| {
            fail(format!(
                "/dev/kfd BO {i} imports {first}, whose file has no id yet; not dumping what \
                 could not be restored as it was"
            ))
        })?;
        out.push(KfdImportEntry {
            addr: b.addr.0,
            size: b.size,
            offset: b.offset.0,
            alloc_flags: b.alloc_flags,
            gpu_id: b.gpu_id.0,
            idr_handle: r.idr_handle,
            mapped_gpu_ids: r.mapped_gpu_ids.clone(),
            same_bo_file: file.0,
            same_bo_index: first.index,
            same_bo_pid: first.pid as u32,
        });
    }
    let held = (0..ckpt.bos.len())
        .filter(|i| !imports.contains_key(i))
        .map(|i| (ckpt.bos[i].gpu_id.0, recs[i].idr_handle));
    let order: Vec<(u32, u32)> = import_order(&out)
        .iter()
        .map(|e| (e.gpu_id, e.idr_handle))
        .collect();
    check_handles(held, &order).map_err(|c| {
        fail(format!(
            "the /dev/kfd BO imported at handle {} on GPU {:#x}: {c}; not dumping what could \
             not be restored as it was",
            BoHandle::new(GpuId(c.gpu), c.idr),
            c.gpu
        ))
    })?;
    if imports.len() == ckpt.bos.len() {
        return Err(fail(
            "every /dev/kfd BO of the process is an import of another process' BO, and KFD's \
             RESTORE needs at least one of its own"
                .into(),
        ));
    }
    let drop: BTreeSet<usize> = imports.keys().copied().collect();
    ckpt.priv_data =
        privdata::without_bos(&ckpt.priv_data, ndev, ckpt.bos.len() as u64, &layout, &drop)
            .ok_or_else(|| fail("KFD's private data is shorter than its BO records".into()))?;
    drop_indices(&mut ckpt.bos, &drop);
    drop_indices(dmabufs, &drop);
    Ok(out)
}

/// `v` without its elements at `drop`.
fn drop_indices<T>(v: &mut Vec<T>, drop: &BTreeSet<usize>) {
    *v = std::mem::take(v)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !drop.contains(i))
        .map(|(_, x)| x)
        .collect();
}

/// At restore, in the importer's task, after its RESTORE (`kfd` its new
/// `/dev/kfd`): each BO KFD file `id` imported from another process
/// imported again, from the dma-buf the first holder's task posted on
/// `ex`, at its VA with its handle, and mapped on its GPUs.  Fails before
/// any import when a handle could not be had again.  Returns how many.
pub(crate) fn import_all(
    vpid: i32,
    id: FileId,
    image: &KfdImage,
    kfd: BorrowedFd<'_>,
    ex: Option<&Exchange>,
) -> Result<usize, SessionError> {
    let imports = &image.msg.criu_rocm_imports;
    if imports.is_empty() {
        return Ok(0);
    }
    let fail = |what: String| SessionError::State {
        pid: vpid,
        what: format!("KFD file {id}: {what}"),
    };
    let ex = ex.ok_or_else(|| {
        fail(format!(
            "{} BO(s) imported from other processes, but criu main made no exchange to hand \
             them over",
            imports.len()
        ))
    })?;
    let order = import_order(imports);
    check_restored_handles(image, &order).map_err(fail)?;
    for e in order {
        import_one(vpid, id, e, kfd, ex)?;
    }
    Ok(imports.len())
}

/// [`check_handles`] of image `image`'s imports in `order` against its
/// other BOs: `Err` names the GPU and handle.
fn check_restored_handles(image: &KfdImage, order: &[&KfdImportEntry]) -> Result<(), String> {
    let m = &image.msg;
    let (_, recs) = records(&m.priv_data, m.num_of_gpus, m.num_of_bos, m.num_of_objects)?;
    let held = m
        .bo_entries
        .iter()
        .zip(&recs)
        .map(|(b, r)| (b.gpu_id, r.idr_handle));
    let order: Vec<(u32, u32)> = order.iter().map(|e| (e.gpu_id, e.idr_handle)).collect();
    check_handles(held, &order).map_err(|c| {
        format!(
            "the BO imported from another process at handle {} on GPU {:#x} cannot be \
             imported again: {c}",
            BoHandle::new(GpuId(c.gpu), c.idr),
            c.gpu
        )
    })
}

/// One import: the dma-buf taken from the exchange, `IMPORT_DMABUF`, its
/// handle checked, `MAP_MEMORY_TO_GPU` on the GPUs it was mapped on.
fn import_one(
    vpid: i32,
    id: FileId,
    e: &KfdImportEntry,
    kfd: BorrowedFd<'_>,
    ex: &Exchange,
) -> Result<(), SessionError> {
    let h = BoHandle::new(GpuId(e.gpu_id), e.idr_handle);
    let what = format!(
        "KFD file {id}, BO at GPU VA {:#x} on GPU {:#x} (handle {h}), imported from pid {}'s \
         file {} BO {}",
        e.addr, e.gpu_id, e.same_bo_pid, e.same_bo_file, e.same_bo_index
    );
    let dmabuf = ex.take(vpid, (FileId(e.same_bo_file), e.same_bo_index), &what)?;
    log::info!("pid {vpid}: {what}: importing the restored BO");
    let step = |s: &str| format!("{what}: {s}");
    let k = kfd_abi::handle::Kfd::from_fd(kfd);
    let got = k
        .import_dmabuf(GpuId(e.gpu_id), e.addr, dmabuf.as_fd())
        .map_err(|source| SessionError::Kfd {
            pid: vpid,
            step: step("IMPORT_DMABUF"),
            source,
        })?;
    if got != h {
        return Err(SessionError::State {
            pid: vpid,
            what: step(&format!("IMPORT_DMABUF gave handle {got}")),
        });
    }
    let gpus: Vec<GpuId> = e.mapped_gpu_ids.iter().map(|&g| GpuId(g)).collect();
    if !gpus.is_empty() {
        let n = k
            .map_memory_to_gpu(got, &gpus)
            .map_err(|source| SessionError::Kfd {
                pid: vpid,
                step: step("MAP_MEMORY_TO_GPU"),
                source,
            })?;
        if n as usize != gpus.len() {
            return Err(SessionError::State {
                pid: vpid,
                what: step(&format!("mapped on {n} of its {} GPU(s)", gpus.len())),
            });
        }
    }
    log::info!(
        "pid {vpid}: KFD file {id}: BO at GPU VA {:#x} imported again from pid {}'s BO (handle \
         {h}, mapped on {} GPU(s))",
        e.addr,
        e.same_bo_pid,
        gpus.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_gets_its_id_back_only_above_held_ids() {
        // Ids 0..=2 held, the import was 3: it gets 3.
        let held = [(1, 0), (1, 1), (1, 2), (2, 0)];
        assert_eq!(check_handles(held, &[(1, 3)]), Ok(()));
        // Two imports in order fill 3 and 4; another GPU's ids are its own.
        assert_eq!(check_handles(held, &[(1, 3), (1, 4), (2, 1)]), Ok(()));
        // A BO freed below the import since: it would get 1.
        let e = check_handles([(1, 0), (1, 2)], &[(1, 3)]).unwrap_err();
        assert_eq!(
            e,
            HandleClash {
                gpu: 1,
                idr: 3,
                lowest: 1
            }
        );
        assert!(e.to_string().contains("handle 0x100000003"), "{e}");
    }
}
