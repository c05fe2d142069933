//! The VMA fix-up table: where each restored BO mapping was and where it is
//! now, looked up by the VMAs CRIU restores.

use std::collections::BTreeMap;

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

/// Byte ranges of BOs on device nodes (or in an address space), sorted by
/// (device, start), for finding the BO a mapping falls in in O(log n): a
/// process has a mapping, a BO and a lookup per BO, so a scan per lookup
/// would make the restore quadratic in BOs.  The key is whatever names the
/// device to the caller (a `DeviceKind`, a GPU).  Offset ranges on one
/// device never overlap in a dump (DRM fake offsets are unique per device;
/// KFD's doorbell and MMIO offsets encode their type and GPU), and
/// [`OffsetIndex::disjoint`] refuses ones that do, so the BO a mapping
/// falls in is unique; [`OffsetIndex::any`] admits overlaps (addresses of
/// BOs of several GPUs' VMs).
#[derive(Clone, Debug)]
pub struct OffsetIndex<K> {
    /// (device, start, size, value), sorted by (device, start, value).
    ranges: Vec<(K, u64, u64, usize)>,
    /// For each range, the furthest-reaching range of its device up to it:
    /// (its end, its position in `ranges`).
    reach: Vec<(u128, usize)>,
}

impl<K> Default for OffsetIndex<K> {
    fn default() -> Self {
        OffsetIndex {
            ranges: Vec::new(),
            reach: Vec::new(),
        }
    }
}

/// Two BOs (their values, the lower first) whose ranges on one device
/// overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub first: usize,
    pub second: usize,
}

impl<K: Ord + Copy> OffsetIndex<K> {
    /// Indexes `(device, start, size, value)` ranges, any of which may
    /// overlap (an empty one holds nothing and is left out).
    pub fn any(ranges: impl IntoIterator<Item = (K, u64, u64, usize)>) -> Self {
        let mut ranges: Vec<_> = ranges.into_iter().filter(|r| r.2 > 0).collect();
        ranges.sort_by_key(|&(k, start, _, v)| (k, start, v));
        let mut reach: Vec<(u128, usize)> = Vec::with_capacity(ranges.len());
        for (i, &(k, start, size, _)) in ranges.iter().enumerate() {
            let end = (start as u128 + size as u128, i);
            let prev = reach.last().filter(|_| i > 0 && ranges[i - 1].0 == k);
            reach.push(prev.map_or(end, |&p| if p.0 >= end.0 { p } else { end }));
        }
        OffsetIndex { ranges, reach }
    }

    /// As [`Self::any`], refusing two ranges of one device that overlap.
    pub fn disjoint(
        ranges: impl IntoIterator<Item = (K, u64, u64, usize)>,
    ) -> Result<Self, Overlap> {
        let index = Self::any(ranges);
        for (i, w) in index.ranges.windows(2).enumerate() {
            let (k0, k1) = (w[0].0, w[1].0);
            if k0 == k1 && index.reach[i].0 > w[1].1 as u128 {
                let v0 = index.ranges[index.reach[i].1].3;
                let v1 = w[1].3;
                return Err(Overlap {
                    first: v0.min(v1),
                    second: v0.max(v1),
                });
            }
        }
        Ok(index)
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Position in `ranges` of the last range of `device` starting at or
    /// before `at`.
    fn last_from(&self, device: K, at: u64) -> Option<usize> {
        let i = self
            .ranges
            .partition_point(|&(k, start, _, _)| (k, start) <= (device, at));
        let i = i.checked_sub(1)?;
        (self.ranges[i].0 == device).then_some(i)
    }

    /// The range of `device` that holds `[pgoff, pgoff + len)` (`len` 0:
    /// only `pgoff`), as its value and `pgoff`'s distance from its start.
    /// In an index of overlapping ranges, the one of them that reaches
    /// furthest must hold it.
    pub fn find(&self, device: K, pgoff: u64, len: u64) -> Option<(usize, u64)> {
        let (_, at) = self.reach[self.last_from(device, pgoff)?];
        let (_, start, size, value) = self.ranges[at];
        let delta = pgoff - start;
        (delta < size && len <= size - delta).then_some((value, delta))
    }
}

/// Restored BO mappings, looked up by the VMAs CRIU restores.
#[derive(Clone, Debug, Default)]
pub struct VmaFixups {
    entries: Vec<VmaFixup>,
    /// `entries` by old device and offset.
    index: OffsetIndex<DeviceKind>,
}

impl VmaFixups {
    /// Builds the table from RESTORE's output buckets (with
    /// `restored_offset`s).  Only BOs whose mapping lives on a device node
    /// get an entry; USERPTR memory is ordinary process memory.
    pub fn from_restored(plan: &RestorePlan, restored: &[BoBucket]) -> Result<Self, PlanError> {
        let minors: BTreeMap<_, _> = plan
            .devices
            .iter()
            .map(|d| (d.user, d.render_minor))
            .collect();
        let mut entries = Vec::new();
        for (i, b) in restored.iter().enumerate() {
            if !bo::needs_vma_fixup(b.alloc_flags) {
                continue;
            }
            let bad = |what: &str| PlanError::BadBo {
                index: i,
                addr: b.addr,
                gpu: b.gpu_id,
                what: what.into(),
            };
            let &minor = minors
                .get(&b.gpu_id)
                .ok_or_else(|| bad("restored BO of a GPU that is not in the plan"))?;
            let (old_device, new_device) = if bo::has_contents(b.alloc_flags) {
                (
                    DeviceKind::Render(plan.old_minors[&b.gpu_id]),
                    DeviceKind::Render(minor),
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
        let index = OffsetIndex::disjoint(
            entries
                .iter()
                .enumerate()
                .map(|(n, e)| (e.old_device, e.old_offset.0, e.size, n)),
        )
        .map_err(|o| {
            let (a, b) = (&entries[o.first], &entries[o.second]);
            PlanError::BadBo {
                index: b.bo_index,
                addr: b.addr,
                gpu: restored[b.bo_index].gpu_id,
                what: format!(
                    "its offsets {:#x}+{:#x} overlap BO {}'s ({:#x}+{:#x}) on the same device",
                    b.old_offset.0, b.size, a.bo_index, a.old_offset.0, a.size
                ),
            }
        })?;
        Ok(VmaFixups { entries, index })
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
    /// `addr + delta` with `pgoff = offset + delta`).  The match is unique
    /// ([`OffsetIndex`]).  `None`: not a restored BO (e.g. the KFD events
    /// page).
    pub fn lookup(&self, device: DeviceKind, pgoff: u64, len: u64) -> Option<VmaRemap> {
        let (n, delta) = self.index.find(device, pgoff, len)?;
        let e = &self.entries[n];
        Some(VmaRemap {
            bo_index: e.bo_index,
            device: e.new_device,
            offset: MmapOffset(e.new_offset.0.checked_add(delta)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_index_finds_the_range_holding_a_mapping() {
        let ix = OffsetIndex::disjoint([
            ('b', 0x1000, 0x1000, 7),
            ('a', 0x3000, 0x2000, 1),
            ('a', 0x1000, 0x1000, 0),
            ('a', 0x5000, 0, 9),
        ])
        .unwrap();
        assert_eq!(ix.len(), 3, "an empty range is left out");
        assert_eq!(ix.find('a', 0x1000, 0x1000), Some((0, 0)));
        assert_eq!(ix.find('a', 0x4000, 0x1000), Some((1, 0x1000)));
        assert_eq!(ix.find('a', 0x4000, 0x1001), None, "past the end");
        assert_eq!(ix.find('a', 0x2000, 0), None, "between ranges");
        assert_eq!(ix.find('a', 0x0fff, 0), None, "before the first");
        assert_eq!(ix.find('b', 0x1fff, 1), Some((7, 0xfff)));
        assert_eq!(ix.find('c', 0x1000, 0), None, "another device");
        assert_eq!(
            OffsetIndex::disjoint([
                ('a', 0x1000, 0x3000, 4),
                ('a', 0x2000, 0x1000, 2),
                ('b', 0, 1, 0)
            ])
            .unwrap_err(),
            Overlap {
                first: 2,
                second: 4
            }
        );
        // The same offsets on two devices do not overlap.
        assert!(OffsetIndex::disjoint([('a', 0, 0x1000, 0), ('b', 0, 0x1000, 1)]).is_ok());
    }

    #[test]
    fn offset_index_of_overlapping_ranges_finds_a_holder() {
        // A long range, then short ones inside and after it.
        let ix = OffsetIndex::any([
            ('a', 0x1000, 0x8000, 0),
            ('a', 0x2000, 0x1000, 1),
            ('a', 0xa000, 0x1000, 2),
        ]);
        assert_eq!(ix.find('a', 0x5000, 0).map(|f| f.0), Some(0));
        assert_eq!(ix.find('a', 0x2800, 0).map(|f| f.0), Some(0));
        assert_eq!(ix.find('a', 0x9000, 0), None);
        assert_eq!(ix.find('a', 0xa000, 0).map(|f| f.0), Some(2));
    }

    #[test]
    fn offset_index_lookups_scale() {
        // 200000 BOs and a lookup of each: a scan per lookup would take
        // minutes.
        let n = 200_000u64;
        let ix = OffsetIndex::disjoint((0..n).rev().map(|i| ('r', i << 12, 0x1000, i as usize)))
            .unwrap();
        for i in 0..n {
            assert_eq!(ix.find('r', (i << 12) + 8, 8), Some((i as usize, 8)));
        }
    }
}
