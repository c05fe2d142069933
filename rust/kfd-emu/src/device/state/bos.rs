//! A process' BOs with the indexes KFD and amdgpu keep for them: by GPU VA
//! (the VM's interval tree, `amdgpu_vm_it_*`, which `amdgpu_vm_bo_map`
//! asks for an overlap) and by render mmap offset (the DRM VMA offset
//! manager's tree, which `drm_gem_mmap` asks for the BO at an offset).
//! In the kernel both are O(log n); a scan of every BO per allocation or
//! mmap here would make a process of n BOs cost n² to create or restore.

use std::collections::BTreeMap;

use super::idr::Idr;
use super::{Bo, BoKey};
use crate::device::uapi::alloc;

/// Disjoint VA ranges `[start, end)`, by start, each with a value.
#[derive(Debug)]
pub struct VaRanges<V> {
    map: BTreeMap<u64, (u64, V)>,
}

impl<V> Default for VaRanges<V> {
    fn default() -> Self {
        VaRanges {
            map: BTreeMap::new(),
        }
    }
}

impl<V: Copy> VaRanges<V> {
    /// The ranges that overlap `[va, end)`, by start.
    pub fn overlapping(&self, va: u64, end: u64) -> impl Iterator<Item = (u64, u64, V)> + '_ {
        // Ranges are disjoint: of those starting at or before `va`, only the
        // last can reach into it.
        let first = self
            .map
            .range(..=va)
            .next_back()
            .filter(|(_, &(e, _))| va < end && e > va);
        let rest = self.map.range(va.saturating_add(1).min(end)..end);
        first.into_iter().chain(rest).map(|(&s, &(e, v))| (s, e, v))
    }

    pub fn overlaps(&self, va: u64, end: u64) -> bool {
        self.overlapping(va, end).next().is_some()
    }

    /// Adds `[va, end)` (non-empty), which must overlap none of the ranges.
    pub fn insert(&mut self, va: u64, end: u64, value: V) {
        debug_assert!(va < end && !self.overlaps(va, end));
        self.map.insert(va, (end, value));
    }

    pub fn remove(&mut self, va: u64) {
        self.map.remove(&va);
    }
}

/// A process' BOs by key, with their VA and offset indexes kept in step
/// (the only ways in and out are [`Bos::insert`] and [`Bos::remove`]).
#[derive(Default)]
pub struct Bos {
    map: BTreeMap<BoKey, Bo>,
    by_va: VaRanges<BoKey>,
    /// VRAM and GTT BOs by (GPU, render mmap offset).
    by_offset: BTreeMap<(usize, u64), BoKey>,
    /// Bytes of the BOs by GPU index, kept in step too: what the live
    /// sysfs files show after every allocation, without a walk of every BO.
    bytes: BTreeMap<usize, Bytes>,
    /// By GPU index, the process device's `alloc_idr` (ids from 0), kept
    /// in step too: the BOs' ids taken.
    ids: BTreeMap<usize, Idr>,
}

/// Bytes of a process' BOs on one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes {
    /// VRAM BOs.
    pub vram: u64,
    /// System-memory BOs the GPU's page tables map (GTT and userptr).
    pub sysmem: u64,
}

impl Bytes {
    fn of(bo: &Bo) -> Bytes {
        Bytes {
            vram: if bo.mem_type() == alloc::VRAM {
                bo.size
            } else {
                0
            },
            sysmem: if bo.flags & (alloc::GTT | alloc::USERPTR) != 0 {
                bo.size
            } else {
                0
            },
        }
    }
}

impl std::ops::Deref for Bos {
    type Target = BTreeMap<BoKey, Bo>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<'a> IntoIterator for &'a Bos {
    type Item = (&'a BoKey, &'a Bo);
    type IntoIter = std::collections::btree_map::Iter<'a, BoKey, Bo>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

fn rendered(bo: &Bo) -> bool {
    matches!(bo.mem_type(), alloc::VRAM | alloc::GTT)
}

impl Bos {
    /// Whether any BO's VA range overlaps `[va, va + size)`.
    pub fn va_taken(&self, va: u64, size: u64) -> bool {
        self.by_va.overlaps(va, va.saturating_add(size))
    }

    /// Adds a BO under a new key; its VA range must be free
    /// ([`Bos::va_taken`]).
    pub fn insert(&mut self, key: BoKey, bo: Bo) {
        debug_assert!(!self.map.contains_key(&key));
        self.by_va.insert(bo.va, bo.va + bo.size, key);
        if rendered(&bo) {
            self.by_offset.insert((key.gpu, bo.offset), key);
        }
        let (add, sum) = (Bytes::of(&bo), self.bytes.entry(key.gpu).or_default());
        sum.vram += add.vram;
        sum.sysmem += add.sysmem;
        self.ids
            .entry(key.gpu)
            .or_insert_with(|| Idr::from(0))
            .take(key.idr);
        self.map.insert(key, bo);
    }

    /// The lowest IDR id of GPU index `gpu` no BO holds, as
    /// `idr_alloc(&pdd->alloc_idr, mem, 0, 0)` hands them out: a freed
    /// BO's id is given to the next allocation or import.
    pub fn lowest_free_idr(&self, gpu: usize) -> Option<u32> {
        self.ids.get(&gpu).map_or(Some(0), Idr::lowest)
    }

    pub fn remove(&mut self, key: &BoKey) -> Option<Bo> {
        let bo = self.map.remove(key)?;
        if let Some(ids) = self.ids.get_mut(&key.gpu) {
            ids.free(key.idr);
        }
        self.by_va.remove(bo.va);
        if rendered(&bo) {
            self.by_offset.remove(&(key.gpu, bo.offset));
        }
        let (sub, sum) = (Bytes::of(&bo), self.bytes.entry(key.gpu).or_default());
        sum.vram -= sub.vram;
        sum.sysmem -= sub.sysmem;
        Some(bo)
    }

    /// The GPUs BO `key` is mapped on, to change.
    pub fn mapped_mut(&mut self, key: &BoKey) -> Option<&mut std::collections::BTreeSet<usize>> {
        self.map.get_mut(key).map(|b| &mut b.mapped)
    }

    /// The BOs whose VA range overlaps `[va, end)`, by VA.
    pub fn overlapping(&self, va: u64, end: u64) -> impl Iterator<Item = (&BoKey, &Bo)> + '_ {
        self.by_va
            .overlapping(va, end)
            .map(|(_, _, k)| self.map.get_key_value(&k).expect("indexed BOs exist"))
    }

    /// Bytes of the BOs on GPU index `gpu`.
    pub fn bytes_on(&self, gpu: usize) -> Bytes {
        self.bytes.get(&gpu).copied().unwrap_or_default()
    }

    /// The VRAM or GTT BO of GPU index `gpu` at render mmap offset
    /// `offset`.
    pub fn at_offset(&self, gpu: usize, offset: u64) -> Option<(&BoKey, &Bo)> {
        let k = self.by_offset.get(&(gpu, offset))?;
        self.map.get_key_value(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn va_ranges_find_what_overlaps() {
        let mut r = VaRanges::default();
        r.insert(0x1000, 0x3000, 1);
        r.insert(0x5000, 0x6000, 2);
        r.insert(0x6000, 0x8000, 3);
        let over =
            |r: &VaRanges<i32>, va, end| r.overlapping(va, end).map(|x| x.2).collect::<Vec<_>>();
        assert_eq!(over(&r, 0x2000, 0x2001), vec![1]);
        assert_eq!(over(&r, 0x0, 0x1000), Vec::<i32>::new());
        assert_eq!(over(&r, 0x3000, 0x5000), Vec::<i32>::new());
        assert_eq!(over(&r, 0x2fff, 0x6001), vec![1, 2, 3]);
        assert_eq!(over(&r, 0x5000, 0x5001), vec![2]);
        assert!(!r.overlaps(0x4000, 0x4000));
        r.remove(0x5000);
        assert_eq!(over(&r, 0x0, u64::MAX), vec![1, 3]);
    }

    #[test]
    fn bytes_and_ids_follow_inserts_and_removes() {
        let bo = |va: u64, size: u64, flags: u32| Bo {
            va,
            size,
            flags,
            offset: va,
            user_addr: 0,
            map: None,
            mapped: Default::default(),
            imported: false,
        };
        let key = |gpu: usize, idr: u32| BoKey { gpu, idr };
        let mut b = Bos::default();
        b.insert(key(0, 1), bo(0x1000, 0x1000, alloc::VRAM));
        b.insert(key(0, 2), bo(0x2000, 0x3000, alloc::GTT));
        b.insert(key(0, 3), bo(0x5000, 0x1000, alloc::USERPTR));
        b.insert(key(0, 4), bo(0x6000, 0x1000, alloc::DOORBELL));
        b.insert(key(1, 1), bo(0x7000, 0x2000, alloc::VRAM));
        let sums = |b: &Bos, gpu| {
            let walked = b.iter().filter(|(k, _)| k.gpu == gpu);
            let walked = walked.fold(Bytes::default(), |s, (_, bo)| Bytes {
                vram: s.vram + Bytes::of(bo).vram,
                sysmem: s.sysmem + Bytes::of(bo).sysmem,
            });
            assert_eq!(b.bytes_on(gpu), walked, "GPU {gpu}: kept and walked");
            walked
        };
        assert_eq!(
            sums(&b, 0),
            Bytes {
                vram: 0x1000,
                sysmem: 0x4000
            }
        );
        assert_eq!(
            sums(&b, 1),
            Bytes {
                vram: 0x2000,
                sysmem: 0
            }
        );
        b.remove(&key(0, 2));
        b.remove(&key(1, 1));
        assert_eq!(
            sums(&b, 0),
            Bytes {
                vram: 0x1000,
                sysmem: 0x1000
            }
        );
        assert_eq!(sums(&b, 1), Bytes::default());
        assert_eq!(sums(&b, 7), Bytes::default());

        // The lowest free id from 0: 0, never taken, then the removed BO's.
        assert_eq!(b.lowest_free_idr(0), Some(0));
        b.insert(key(0, 0), bo(0x9000, 0x1000, alloc::VRAM));
        assert_eq!(b.lowest_free_idr(0), Some(2), "the removed BO's id");
        assert_eq!(b.lowest_free_idr(1), Some(0));
        assert_eq!(b.lowest_free_idr(7), Some(0), "a GPU without BOs");
    }
}
