//! BOs shared through dma-bufs between the files a dump saves (review item
//! G3, issue 29).
//!
//! amdgpu gives every BO one mmap offset in its device's address space
//! (`drm_vma_offset_manager`, one per device), and a dma-buf of a BO
//! imported on the same device is that BO again, not an import
//! (`amdgpu_gem_prime_import` hands back its own GEM object, so
//! GEM_LIST_HANDLES does not flag it `IS_IMPORT`): a KFD BO exported with
//! EXPORT_DMABUF and imported into a render file, a render-node GEM BO
//! exported with PRIME and imported by KFD (IMPORT_DMABUF) or by another
//! render file of the GPU (of this process or another) is listed by every
//! holder with the same offset.
//!
//! [`SharedBos`] keeps, for one dump (all its processes), every saved BO's
//! range of the mmap offsets of its host GPU with the holder that saved it
//! first.  A further holder of the same range, a render file of the same
//! process, is recorded as "same BO as" the first one
//! ([`Claim::Same`]: the render image's `same_bo_file`/`same_bo_index`,
//! no second copy of the bytes), and the restore imports a dma-buf of the
//! first holder's restored BO into it.  A further render file of another
//! process is recorded the same way, with the first holder's pid
//! (`same_bo_pid`): the restore of that process hands the dma-buf over
//! ([`super::xproc`]).  A further holder that is a KFD file of another
//! process than a first holder's KFD file (HIP IPC's importer) is recorded
//! in its KFD image as an import of that BO, and imported again at restore
//! ([`super::kfd_import`]).  Refused, naming both holders ([`SharedBo`]): a
//! range that overlaps another without being the same BO, KFD as a further
//! holder of a render file's BO or of its own process' BO (KFD's RESTORE
//! makes every BO of its own; it cannot import one), and a further holder
//! in another process whose first holder is a KFD file not dumped yet (its
//! image would be written before the file it names has an id).

use std::collections::BTreeMap;
use std::os::fd::RawFd;

use crate::ids::{GpuId, RenderMinor};
use crate::image::FileId;

/// The file a holder holds a BO through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeldIn {
    /// KFD BO `index` (at GPU VA `va`) of the process whose `/dev/kfd` is
    /// the task's fd `task_fd`.
    Kfd { task_fd: RawFd, va: u64 },
    /// A render file, GEM handle `handle`.
    Render { minor: RenderMinor, handle: u32 },
}

/// The holder of a BO in a dump.  Formatted (on a refusal only) as
/// "pid 12: fd 4 (/dev/kfd), BO 3 (2097152 bytes at GPU VA 0x...)" or
/// "pid 12: render node /dev/dri/renderD128 (file 9), GEM handle 1 (65536
/// bytes)".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub pid: i32,
    /// The CRIU file whose image records the BO (None: a KFD file not
    /// reached yet, whose BOs were claimed for a render file of its process
    /// dumped before it).
    pub file: Option<FileId>,
    /// The BO's index in that image's `bo_entries`.
    pub index: u32,
    pub size: u64,
    pub held_in: HeldIn,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.held_in {
            HeldIn::Kfd { task_fd, va } => write!(
                f,
                "pid {}: fd {task_fd} (/dev/kfd), BO {} ({} bytes at GPU VA {va:#x})",
                self.pid, self.index, self.size
            ),
            HeldIn::Render { minor, handle } => {
                write!(f, "pid {}: render node {}", self.pid, minor.path())?;
                if let Some(id) = self.file {
                    write!(f, " (file {id})")?;
                }
                write!(f, ", GEM handle {handle} ({} bytes)", self.size)
            }
        }
    }
}

/// Why two holders of one range cannot be saved as one BO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Why {
    /// The ranges overlap but differ: not one BO as far as the dump can
    /// tell.
    Overlap,
    /// The holders are two processes, and the first one's file has no id
    /// yet.
    TwoProcesses,
    /// The further holder is KFD.
    KfdImports,
}

/// Two holders of one BO the dump cannot save as one (see the module
/// documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SharedBo {
    pub gpu: GpuId,
    /// The mmap offset both ranges cover.
    pub offset: u64,
    pub first: Holder,
    pub second: Holder,
    pub why: Why,
}

impl std::fmt::Display for SharedBo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "one BO of GPU {} (mmap offset {:#x}) is held by {} and by {} (shared through a \
             dma-buf: an export imported on the same GPU); ",
            self.gpu, self.offset, self.first, self.second
        )?;
        f.write_str(match self.why {
            Why::Overlap => {
                "their ranges of the GPU's mmap offsets overlap without being one BO, so a \
                 restore would make two copies of it"
            }
            Why::TwoProcesses => {
                "the first holder is a KFD file of another process that is not dumped yet, so \
                 the further holder's image cannot name it: a restore would make two copies of \
                 it"
            }
            Why::KfdImports => {
                "the further holder is KFD (an import of the first holder's dma-buf), and the \
                 first holder is a render file or the same process: criu-rocm imports a BO \
                 into KFD again only from another process' KFD BO, and KFD's RESTORE cannot \
                 import one: a restore would make two copies of it"
            }
        })?;
        f.write_str("; not dumping what could not be restored as it was")
    }
}

/// What [`SharedBos::claim`] made of a BO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// No other holder: this one saves the BO and its bytes.
    First,
    /// The same BO as this earlier holder's.
    Same(Holder),
}

/// The BOs saved so far in one dump, by host GPU and mmap offset.
#[derive(Debug, Default)]
pub(crate) struct SharedBos {
    /// GPU → start offset → first holder.
    by_gpu: BTreeMap<GpuId, BTreeMap<u64, Holder>>,
    /// pid → where its KFD BOs claimed before their file was reached are
    /// (GPU, start offset), for [`Self::set_file`].
    unfiled: BTreeMap<i32, Vec<(GpuId, u64)>>,
}

impl SharedBos {
    /// The BO of `holder.size` bytes at mmap offset `offset` of host GPU
    /// `gpu`, held by `holder`.  A BO without an offset (size 0) claims
    /// nothing.  The holder that claimed the range already (a KFD BO claimed
    /// early, see [`Self::set_file`]) is the first holder again.
    pub fn claim(&mut self, gpu: GpuId, offset: u64, holder: Holder) -> Result<Claim, SharedBo> {
        if holder.size == 0 {
            return Ok(Claim::First);
        }
        let end = offset.saturating_add(holder.size);
        let map = self.by_gpu.entry(gpu).or_default();
        let clash = map
            .range(..end)
            .next_back()
            .filter(|(&start, h)| start.saturating_add(h.size) > offset);
        let Some((&start, &first)) = clash else {
            map.insert(offset, holder);
            if holder.file.is_none() && matches!(holder.held_in, HeldIn::Kfd { .. }) {
                self.unfiled
                    .entry(holder.pid)
                    .or_default()
                    .push((gpu, offset));
            }
            return Ok(Claim::First);
        };
        if start == offset && first == holder {
            return Ok(Claim::First);
        }
        let kfd = |h: &Holder| matches!(h.held_in, HeldIn::Kfd { .. });
        let why = if start != offset || first.size != holder.size {
            Why::Overlap
        } else if kfd(&holder) && (!kfd(&first) || first.pid == holder.pid) {
            Why::KfdImports
        } else if first.pid != holder.pid && first.file.is_none() {
            Why::TwoProcesses
        } else {
            return Ok(Claim::Same(first));
        };
        Err(SharedBo {
            gpu,
            offset: start.max(offset),
            first,
            second: holder,
            why,
        })
    }

    /// The first holder of the BO that starts at mmap offset `offset` of
    /// host GPU `gpu`, if one is claimed.
    pub fn holder_at(&self, gpu: GpuId, offset: u64) -> Option<Holder> {
        self.by_gpu.get(&gpu)?.get(&offset).copied()
    }

    /// The file of the KFD BOs of `pid` claimed before their file was
    /// reached.
    pub fn set_file(&mut self, pid: i32, file: FileId) {
        for (gpu, offset) in self.unfiled.remove(&pid).unwrap_or_default() {
            // A holder claim_all gave back, or another one claimed at that
            // offset since, is not filed (the KFD BOs of `pid` left unfiled
            // are all listed here).
            let h = self.by_gpu.get_mut(&gpu).and_then(|m| m.get_mut(&offset));
            if let Some(h) = h.filter(|h| h.pid == pid && h.file.is_none()) {
                if matches!(h.held_in, HeldIn::Kfd { .. }) {
                    h.file = Some(file);
                }
            }
        }
    }

    /// The KFD BOs of `pid` after the buckets `dropped` (their indices,
    /// taken out as imports, [`super::kfd_import`]) left its image: each
    /// claimed index moved down by the dropped ones below it.
    pub fn reindex_kfd(&mut self, pid: i32, dropped: &std::collections::BTreeSet<usize>) {
        for h in self.by_gpu.values_mut().flat_map(|m| m.values_mut()) {
            if h.pid == pid && matches!(h.held_in, HeldIn::Kfd { .. }) {
                h.index -= dropped.range(..h.index as usize).count() as u32;
            }
        }
    }

    /// [`Self::claim`] of every BO of `bos` (host GPU, mmap offset,
    /// holder), all or none: on a refusal the ones claimed here are given
    /// back.  What each became, in order.
    pub fn claim_all(
        &mut self,
        bos: impl IntoIterator<Item = (GpuId, u64, Holder)>,
    ) -> Result<Vec<Claim>, Box<SharedBo>> {
        let mut done = Vec::new();
        let mut claims = Vec::new();
        for (gpu, offset, holder) in bos {
            let known = self
                .by_gpu
                .get(&gpu)
                .is_some_and(|m| m.contains_key(&offset));
            match self.claim(gpu, offset, holder) {
                Ok(c) => {
                    if c == Claim::First && holder.size > 0 && !known {
                        done.push((gpu, offset));
                    }
                    claims.push(c);
                }
                Err(e) => {
                    for (g, o) in done {
                        if let Some(m) = self.by_gpu.get_mut(&g) {
                            m.remove(&o);
                        }
                    }
                    return Err(Box::new(e));
                }
            }
        }
        Ok(claims)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The holder of GEM handle `handle` (BO `handle - 1`) of render file
    /// `file` on renderD128.
    pub(crate) fn render(pid: i32, file: u32, handle: u32, size: u64) -> Holder {
        Holder {
            pid,
            file: Some(FileId(file)),
            index: handle - 1,
            size,
            held_in: HeldIn::Render {
                minor: RenderMinor(128),
                handle,
            },
        }
    }

    fn kfd(pid: i32, index: u32, size: u64) -> Holder {
        Holder {
            pid,
            file: None,
            index,
            size,
            held_in: HeldIn::Kfd {
                task_fd: 4,
                va: 0x7f00_0000_0000,
            },
        }
    }

    #[test]
    fn a_further_holder_of_one_process_is_the_same_bo() {
        let mut s = SharedBos::default();
        let g = GpuId(0x3f2c);
        let a = render(7, 5, 1, 0x4000);
        assert_eq!(s.claim(g, 0x10000, a), Ok(Claim::First));
        // The same offsets on another GPU are another BO.
        let other = render(7, 6, 1, 0x4000);
        assert_eq!(s.claim(GpuId(0x51e7), 0x10000, other), Ok(Claim::First));
        assert_eq!(
            s.claim(g, 0x10000, render(7, 9, 2, 0x4000)),
            Ok(Claim::Same(a))
        );
        // Another file with the same handle number is another holder.
        assert_eq!(
            s.claim(g, 0x10000, render(7, 10, 1, 0x4000)),
            Ok(Claim::Same(a))
        );
        // Next to it, no clash; no offset, no claim.
        assert_eq!(
            s.claim(g, 0x14000, render(8, 9, 3, 0x1000)),
            Ok(Claim::First)
        );
        assert_eq!(s.claim(g, 0x10000, render(8, 9, 4, 0)), Ok(Claim::First));
    }

    #[test]
    fn what_cannot_be_one_bo_names_both_holders() {
        let mut s = SharedBos::default();
        let g = GpuId(0x3f2c);
        s.claim(g, 0x10000, kfd(7, 0, 0x4000)).unwrap();
        s.set_file(7, FileId(11));
        let e = s.claim(g, 0x13000, render(7, 9, 2, 0x1000)).unwrap_err();
        assert_eq!((e.gpu, e.offset, e.why), (g, 0x13000, Why::Overlap));
        assert_eq!(e.first.file, Some(FileId(11)));
        let m = e.to_string();
        for want in [
            "pid 7: fd 4 (/dev/kfd), BO 0 (16384 bytes at GPU VA 0x7f0000000000)",
            "pid 7: render node /dev/dri/renderD128 (file 9), GEM handle 2 (4096 bytes)",
            "GPU 0x3f2c",
            "a restore would make two copies",
        ] {
            assert!(m.contains(want), "{want:?} not in {m}");
        }
        // Another process' render file: the same BO as the first holder's.
        let kfd7 = kfd(7, 0, 0x4000);
        assert_eq!(
            s.claim(g, 0x10000, render(8, 9, 2, 0x4000)),
            Ok(Claim::Same(Holder {
                file: Some(FileId(11)),
                ..kfd7
            }))
        );
        // A first holder of another process without a file id yet.
        s.claim(g, 0x30000, kfd(9, 2, 0x1000)).unwrap();
        let e = s.claim(g, 0x30000, render(8, 9, 5, 0x1000)).unwrap_err();
        assert_eq!(e.why, Why::TwoProcesses);
        // A range that starts inside an earlier one.
        let e = s.claim(g, 0xf000, render(7, 9, 3, 0x2000)).unwrap_err();
        assert_eq!((e.offset, e.why), (0x10000, Why::Overlap));
        // KFD as the further holder of a render file's BO.
        s.claim(g, 0x20000, render(7, 9, 1, 0x1000)).unwrap();
        let e = s.claim(g, 0x20000, kfd(7, 1, 0x1000)).unwrap_err();
        assert_eq!(e.why, Why::KfdImports);
        // KFD of another process as the further holder of a KFD BO: the
        // same BO (HIP IPC), but not of the same process.
        let e = s.claim(g, 0x10000, kfd(7, 3, 0x4000)).unwrap_err();
        assert_eq!(e.why, Why::KfdImports);
        assert_eq!(
            s.claim(g, 0x10000, kfd(12, 3, 0x4000)),
            Ok(Claim::Same(Holder {
                file: Some(FileId(11)),
                ..kfd7
            }))
        );
    }

    #[test]
    fn dropped_imports_move_the_later_kfd_bos_down() {
        let mut s = SharedBos::default();
        let g = GpuId(1);
        s.claim(g, 0x8000, kfd(3, 4, 0x1000)).unwrap();
        s.claim(g, 0x9000, kfd(3, 1, 0x1000)).unwrap();
        s.claim(g, 0xa000, render(3, 9, 5, 0x1000)).unwrap();
        s.reindex_kfd(3, &[0, 2].into());
        assert_eq!(s.holder_at(g, 0x8000).unwrap().index, 2);
        assert_eq!(s.holder_at(g, 0x9000).unwrap().index, 0);
        assert_eq!(s.holder_at(g, 0xa000).unwrap().index, 4);
    }

    #[test]
    fn a_kfd_bo_claimed_early_is_its_own_first_holder() {
        let mut s = SharedBos::default();
        let g = GpuId(1);
        s.claim(g, 0x8000, kfd(3, 0, 0x1000)).unwrap();
        assert_eq!(s.claim(g, 0x8000, kfd(3, 0, 0x1000)), Ok(Claim::First));
    }

    #[test]
    fn a_refused_batch_claims_nothing() {
        let mut s = SharedBos::default();
        let g = GpuId(1);
        s.claim(g, 0x8000, render(1, 1, 1, 0x1000)).unwrap();
        let batch = vec![
            (g, 0x1000, render(2, 2, 1, 0x1000)),
            // Overlapping the first without being it.
            (g, 0x8800, render(2, 2, 2, 0x1000)),
        ];
        assert_eq!(
            s.claim_all(batch).unwrap_err().first,
            render(1, 1, 1, 0x1000)
        );
        assert_eq!(
            s.claim(g, 0x1000, render(3, 3, 1, 0x1000)),
            Ok(Claim::First),
            "the batch's first claim was given back"
        );
    }
}
