//! The VMA fix-up table: where each restored BO mapping was and where it is
//! now, looked up by the VMAs CRIU restores.

use super::{BoBucket, DeviceKind, PlanError, RestorePlan};
use crate::bo;
use crate::ids::{GpuVa, MmapOffset};

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
