//! BOs shared through dma-bufs between the files a dump saves (review item
//! G3).
//!
//! amdgpu gives every BO one mmap offset in its device's address space
//! (`drm_vma_offset_manager`, one per device), and a dma-buf of a BO
//! imported on the same device is that BO again, not an import
//! (`amdgpu_gem_prime_import` hands back its own GEM object, so
//! GEM_LIST_HANDLES does not flag it `IS_IMPORT`): a KFD BO exported with
//! EXPORT_DMABUF and imported into a render file, a render-node GEM BO
//! exported with PRIME and imported by KFD (IMPORT_DMABUF) or by another
//! render file of the GPU (of this process or another) is listed by every
//! holder with the same offset.  Each holder's image records it as a BO of
//! its own, and a restore would make two BOs of it: a write through one
//! holder would no longer reach the other.  Until the images can say that
//! two holders share one BO, such a dump is refused, naming both holders.
//!
//! [`SharedBos`] keeps, for one dump, every saved BO's range of the mmap
//! offsets of its host GPU with the holder that saved it; a claim on a range
//! another holder already has is the refusal.

use std::collections::BTreeMap;

use crate::ids::GpuId;

/// The holder of a BO in a dump, for messages: "pid 12: fd 4 (/dev/kfd),
/// BO 3 (2097152 bytes at GPU VA 0x...)".
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub pid: i32,
    /// The file and the BO in it, in words.
    pub what: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {}: {}", self.pid, self.what)
    }
}

/// Two holders of one BO (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SharedBo {
    pub gpu: GpuId,
    /// The mmap offset both ranges cover.
    pub offset: u64,
    pub first: Holder,
    pub second: Holder,
}

impl std::fmt::Display for SharedBo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "one BO of GPU {} (mmap offset {:#x}) is held by {} and by {} (shared through a \
             dma-buf: an export imported on the same GPU); a restore would make two copies of it, \
             and a write through one holder would no longer reach the other; not dumping what \
             could not be restored as it was",
            self.gpu, self.offset, self.first, self.second
        )
    }
}

/// The BOs saved so far in one dump, by host GPU and mmap offset.
#[derive(Debug, Default)]
pub(crate) struct SharedBos {
    /// GPU → start offset → (size, holder).
    by_gpu: BTreeMap<GpuId, BTreeMap<u64, (u64, Holder)>>,
}

impl SharedBos {
    /// The BO of `size` bytes at mmap offset `offset` of host GPU `gpu`,
    /// saved by `holder`.  Err: another holder has (part of) that range.
    /// A BO without an offset (size 0) claims nothing.
    pub fn claim(
        &mut self,
        gpu: GpuId,
        offset: u64,
        size: u64,
        holder: Holder,
    ) -> Result<(), Box<SharedBo>> {
        if size == 0 {
            return Ok(());
        }
        let end = offset.saturating_add(size);
        let map = self.by_gpu.entry(gpu).or_default();
        let clash = map
            .range(..end)
            .next_back()
            .filter(|(&start, (len, _))| start.saturating_add(*len) > offset);
        if let Some((&start, (_, first))) = clash {
            return Err(Box::new(SharedBo {
                gpu,
                offset: start.max(offset),
                first: first.clone(),
                second: holder,
            }));
        }
        map.insert(offset, (size, holder));
        Ok(())
    }

    /// [`Self::claim`] of every BO of `bos` (host GPU, mmap offset, size,
    /// holder), all or none: on a clash the ones claimed here are given
    /// back.
    pub fn claim_all(
        &mut self,
        bos: impl IntoIterator<Item = (GpuId, u64, u64, Holder)>,
    ) -> Result<(), Box<SharedBo>> {
        let mut done = Vec::new();
        for (gpu, offset, size, holder) in bos {
            if let Err(e) = self.claim(gpu, offset, size, holder) {
                for (g, o) in done {
                    if let Some(m) = self.by_gpu.get_mut(&g) {
                        m.remove(&o);
                    }
                }
                return Err(e);
            }
            if size > 0 {
                done.push((gpu, offset));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pid: i32, what: &str) -> Holder {
        Holder {
            pid,
            what: what.into(),
        }
    }

    #[test]
    fn a_range_held_twice_on_one_gpu_names_both_holders() {
        let mut s = SharedBos::default();
        let g = GpuId(0x3f2c);
        s.claim(g, 0x10000, 0x4000, h(7, "fd 4 (/dev/kfd), BO 0"))
            .unwrap();
        s.claim(g, 0x14000, 0x1000, h(7, "render file 5, GEM handle 1"))
            .unwrap();
        // The same offsets on another GPU are another BO.
        s.claim(GpuId(0x51e7), 0x10000, 0x4000, h(7, "fd 4, BO 1"))
            .unwrap();
        let e = s
            .claim(g, 0x13000, 0x1000, h(8, "render file 9, GEM handle 2"))
            .unwrap_err();
        assert_eq!((e.gpu, e.offset), (g, 0x13000));
        assert_eq!(e.first, h(7, "fd 4 (/dev/kfd), BO 0"));
        let m = e.to_string();
        assert!(m.contains("pid 7: fd 4 (/dev/kfd), BO 0"), "{m}");
        assert!(m.contains("pid 8: render file 9, GEM handle 2"), "{m}");
        assert!(m.contains("GPU 0x3f2c"), "{m}");
        // A range that starts inside an earlier one.
        let e = s
            .claim(g, 0xf000, 0x2000, h(8, "render file 9, GEM handle 3"))
            .unwrap_err();
        assert_eq!(e.offset, 0x10000);
        // Next to it, no clash; no offset, no claim.
        s.claim(g, 0x15000, 0x1000, h(8, "x")).unwrap();
        s.claim(g, 0x10000, 0, h(8, "userptr")).unwrap();
    }

    #[test]
    fn a_refused_batch_claims_nothing() {
        let mut s = SharedBos::default();
        let g = GpuId(1);
        s.claim(g, 0x8000, 0x1000, h(1, "a")).unwrap();
        let batch = vec![
            (g, 0x1000, 0x1000, h(2, "b")),
            (g, 0x8000, 0x1000, h(2, "c")),
        ];
        assert_eq!(s.claim_all(batch).unwrap_err().first, h(1, "a"));
        s.claim(g, 0x1000, 0x1000, h(3, "d"))
            .expect("the batch's first claim was given back");
    }
}
