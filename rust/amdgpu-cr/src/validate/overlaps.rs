//! One BO saved twice (issue 29): the mmap-offset ranges of the BOs with
//! bytes of every image of a dump (KFD VRAM/GTT BOs, render-node GEM BOs),
//! by GPU, must not overlap unless one is a "same BO as" record of the
//! other ([`super::links`]).  A GPU's DRM fake offsets are unique across
//! its files and processes, so two saved BOs whose ranges overlap are one
//! BO held twice: images written before criu-rocm recorded "same BO as"
//! hold such a BO as two independent copies, which would restore as two
//! BOs (the sharing silently lost).  Doorbell and MMIO BOs (offsets of
//! `/dev/kfd`) and USERPTR BOs are not in that space and are left out.
//!
//! Linear after a sort by (GPU, offset): a dump holds tens of thousands
//! of BOs.

use super::{KfdVerdict, Refusal, RenderFile};
use crate::bo;
use crate::ids::GpuId;
use crate::image::kfd_image_name;

/// One saved BO's mmap-offset range.
#[derive(Clone, Copy, Debug)]
struct Range {
    gpu: u32,
    start: u64,
    end: u128,
    /// Its image (an index into the names) and entry.
    file: usize,
    index: usize,
    /// The BO it is: (CRIU file id, entry) of the image that saved it
    /// (a link's target).
    bo: (u32, u32),
}

/// The overlaps among the BOs of the KFD images `kfd` (decoded by
/// [`super::check_kfd_images`]) and of the render images `renders`
/// (decoded by [`super::read_render_files`]): one refusal per BO that
/// overlaps an earlier one (by GPU and offset) that is another BO.
pub(crate) fn check(kfd: &[KfdVerdict], renders: &[RenderFile]) -> Vec<Refusal> {
    let mut names = Vec::new();
    let mut ranges = Vec::new();
    kfd_ranges(kfd, &mut names, &mut ranges);
    render_ranges(renders, &mut names, &mut ranges);
    ranges.sort_unstable_by_key(|r| (r.gpu, r.start, r.file, r.index));
    sweep(&ranges)
        .into_iter()
        .map(|(earlier, r)| refusal(&names, earlier, r))
        .collect()
}

/// The VRAM/GTT BOs of the KFD images that read (a further open of
/// `/dev/kfd` repeats its first file's BOs and is left out).
fn kfd_ranges(kfd: &[KfdVerdict], names: &mut Vec<String>, out: &mut Vec<Range>) {
    for v in kfd.iter().filter(|v| !v.is_reopen()) {
        let Some(img) = &v.image else {
            continue;
        };
        let file = names.len();
        names.push(kfd_image_name(v.id));
        let bos = img.msg.bo_entries.iter().enumerate();
        out.extend(
            bos.filter(|(_, b)| bo::has_contents(b.alloc_flags) && b.size > 0)
                .map(|(i, b)| Range {
                    gpu: b.gpu_id,
                    start: b.offset,
                    end: u128::from(b.offset) + u128::from(b.size),
                    file,
                    index: i,
                    bo: (v.id.0, i as u32),
                }),
        );
    }
}

/// The GEM BOs of the render images that read (one that does not is
/// refused by its own check); a "same BO as" record is its target's BO.
fn render_ranges(renders: &[RenderFile], names: &mut Vec<String>, out: &mut Vec<Range>) {
    for r in renders {
        let (Some(id), Some(img)) = (r.id, r.image()) else {
            continue;
        };
        let file = names.len();
        names.push(r.name.clone());
        let bos = img.msg.bo_entries.iter().enumerate();
        out.extend(bos.filter(|(_, b)| b.size > 0).map(|(i, b)| Range {
            gpu: img.msg.gpu_id,
            start: b.offset,
            end: u128::from(b.offset) + u128::from(b.size),
            file,
            index: i,
            bo: match (b.same_bo_file, b.same_bo_index) {
                (Some(f), Some(t)) => (f, t),
                _ => (id.0, i as u32),
            },
        }));
    }
}

/// Walks `ranges` (sorted by GPU and start) keeping the furthest-reaching
/// range of the GPU so far: each range that starts before it ends and is
/// another BO, with it.  Any two overlapping ranges of different BOs make
/// at least one such pair (of the first range that overlaps an earlier
/// one of another BO, the furthest-reaching earlier range overlaps it too,
/// and is another BO, or else two earlier ranges would overlap already).
fn sweep(ranges: &[Range]) -> Vec<(&Range, &Range)> {
    let mut out = Vec::new();
    let mut reach: Option<&Range> = None;
    for r in ranges {
        match reach {
            Some(p) if p.gpu == r.gpu && p.end > u128::from(r.start) => {
                if p.bo != r.bo {
                    out.push((p, r));
                }
                if r.end > p.end {
                    reach = Some(r);
                }
            }
            _ => reach = Some(r),
        }
    }
    out
}

fn refusal(names: &[String], earlier: &Range, r: &Range) -> Refusal {
    let span = |x: &Range| format!("{:#x}+{:#x}", x.start, x.end - u128::from(x.start));
    Refusal::new(
        names[r.file].as_str(),
        Some(GpuId(r.gpu)),
        format!("bo_entries[{}].offset", r.index),
        format!(
            "mmap offsets {} overlap those of {}'s BO {} ({}), which is not recorded as the \
             same BO: one BO saved twice (images written before criu-rocm recorded \"same BO \
             as\") would restore as two",
            span(r),
            names[earlier.file],
            earlier.index,
            span(earlier)
        ),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::image::tests::{sample_kfd, tempdir};
    use crate::image::{FileId, KfdImage};
    use crate::proto::DrmBoEntry;

    /// A saved GEM BO of `size` bytes at mmap offset `offset` (VRAM, a
    /// content hash), or with `link` (file, index) a "same BO as" link
    /// without content fields.
    pub(in crate::validate) fn gem(offset: u64, size: u64, link: Option<(u32, u32)>) -> DrmBoEntry {
        DrmBoEntry {
            size,
            offset,
            handle: 1,
            preferred_domains: kfd_abi::sys::AMDGPU_GEM_DOMAIN_VRAM,
            content_xxh3: link.is_none().then_some(7),
            is_import: u32::from(link.is_some()),
            same_bo_file: link.map(|l| l.0),
            same_bo_index: link.map(|l| l.1),
            ..Default::default()
        }
    }

    /// The refusals of KFD image 5 (sample_kfd: VRAM BO 0 at
    /// 0x1_0000_0000+0x20_0000 of GPU 0x1a2b, GTT BO 2 of GPU 0x5c3d) and
    /// render image 9 of GPU `gpu` holding `bos`.
    fn refusals(gpu: u32, bos: Vec<DrmBoEntry>) -> Vec<String> {
        let dir = tempdir();
        let kfd = KfdImage { msg: sample_kfd() };
        kfd.write(&dir, FileId(5)).unwrap();
        let mut bos = bos;
        for (i, b) in bos.iter_mut().enumerate() {
            b.handle = i as u32 + 1;
        }
        super::super::links::tests::render(gpu, bos)
            .write(&dir, FileId(9))
            .unwrap();
        let files: BTreeSet<String> = ["amdgpu-kfd-5.img", "amdgpu-renderD-9.img"]
            .into_iter()
            .map(String::from)
            .collect();
        let renders = super::super::read_render_files(&dir, &files);
        // A render image that does not read would be left out unseen.
        assert!(renders[0].image().is_some());
        let verdicts = [KfdVerdict {
            id: FileId(5),
            image: Some(kfd),
            refusal: None,
        }];
        check(&verdicts, &renders)
            .iter()
            .map(|r| r.to_string())
            .collect()
    }

    #[test]
    fn disjoint_bos_links_and_other_gpus_hold() {
        let none = Vec::<String>::new();
        // Right after the KFD BO; the KFD BO's range on another GPU.
        assert_eq!(
            refusals(0x1a2b, vec![gem(0x1_0020_0000, 0x1000, None)]),
            none
        );
        assert_eq!(
            refusals(0x5c3d, vec![gem(0x1_0000_0000, 0x1000, None)]),
            none
        );
        // "The same BO as" KFD BO 0, beside a GEM BO of its own.
        let link = gem(0x1_0000_0000, 0x20_0000, Some((5, 0)));
        let own = gem(0x2_0000_0000, 0x1000, None);
        assert_eq!(refusals(0x1a2b, vec![own, link]), none);
    }

    #[test]
    fn two_copies_of_one_bo_are_refused_naming_both() {
        for (gpu, bos, want) in [
            // An old image: the KFD BO's bytes again, in the render file.
            (
                0x1a2b,
                vec![gem(0x1_0000_0000, 0x20_0000, None)],
                "amdgpu-renderD-9.img: GPU 0x1a2b: bo_entries[0].offset: mmap offsets \
                 0x100000000+0x200000 overlap those of amdgpu-kfd-5.img's BO 0 \
                 (0x100000000+0x200000)",
            ),
            // Partly, inside the KFD BO.
            (
                0x1a2b,
                vec![gem(0x1_0010_0000, 0x1000, None)],
                "bo_entries[0].offset: mmap offsets 0x100100000+0x1000 overlap those of \
                 amdgpu-kfd-5.img's BO 0",
            ),
            // Two GEM BOs of one render file, past the KFD BOs.
            (
                0x5c3d,
                vec![
                    gem(0x2_0000_0000, 0x2000, None),
                    gem(0x2_0000_1000, 0x1000, None),
                ],
                "bo_entries[1].offset: mmap offsets 0x200001000+0x1000 overlap those of \
                 amdgpu-renderD-9.img's BO 0",
            ),
            // A link to another BO than the one it overlaps.
            (
                0x5c3d,
                vec![gem(0x1_0020_0000, 0x1000, Some((5, 0)))],
                "amdgpu-renderD-9.img: GPU 0x5c3d: bo_entries[0].offset: mmap offsets \
                 0x100200000+0x1000 overlap those of amdgpu-kfd-5.img's BO 2",
            ),
        ] {
            let got = refusals(gpu, bos);
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(got[0].contains(want), "{want:?} not in {got:?}");
        }
    }

    #[test]
    fn the_sweep_finds_an_overlap_behind_a_longer_range() {
        let r = |start: u64, len: u64, bo: u32| Range {
            gpu: 1,
            start,
            end: u128::from(start + len),
            file: 0,
            index: bo as usize,
            bo: (0, bo),
        };
        // BO 0 spans 0..0x10000; BO 1 inside it; BO 2 after BO 1, inside BO 0.
        let ranges = [
            r(0, 0x1_0000, 0),
            r(0x1000, 0x1000, 1),
            r(0x4000, 0x1000, 2),
        ];
        let got: Vec<_> = sweep(&ranges)
            .iter()
            .map(|(a, b)| (a.index, b.index))
            .collect();
        assert_eq!(got, [(0, 1), (0, 2)]);
    }
}
