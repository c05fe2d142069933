//! The host GPU of a render file whose task has no KFD process of its GPU
//! (a GEM-only client, a process handed a BO by another: issue 29).
//!
//! A KFD image describes its GPUs (every topology property) and the
//! matcher finds them a host GPU ([`crate::match_image_to_usable`]); a
//! render file without KFD has no such image, so the dump records its
//! GPU's topology entry in the render image (`criu_rocm_gpu`).  Every
//! task of a restore, and `gpu-check`, places all such GPUs of the dump
//! the same way, from the image directory and the host alone, so that a
//! BO one process hands another (`same_bo_pid`) is of one GPU on both
//! sides, and two GPUs of the dump never share one host GPU:
//!
//! 1. a GPU a KFD image of the dump has too (by its render minor at dump,
//!    which every image of one dump names alike) goes where that image's
//!    own match puts it;
//! 2. then a GPU whose id the host has keeps it (the same host);
//! 3. then the rest go to host GPUs left whose properties accept them
//!    (the matcher's checks and knobs), one each, by the matcher's
//!    backtracking search: a placement is found whenever one exists.  The
//!    search takes them in the order of their render minors at dump and
//!    each one's host GPUs in node order, so each takes the first host GPU
//!    left that accepts it and still leaves every later one a host GPU;
//!    where taking just the first one left places them all, that is the
//!    placement.
//!
//! A GPU none accepts is refused, and so is the first GPU the others leave
//! none, naming the render image and why each host GPU left does not fit.

use std::collections::BTreeMap;
use std::path::Path;

use super::{kfd_image_ids, render_image_ids};
use crate::env::Checks;
use crate::ids::GpuId;
use crate::image::{render_image_name, FileId, KfdImage, RenderImage};
use crate::matcher::MatchError;
use crate::proto::KfdDeviceEntry;
use crate::topology::Topology;
use crate::validate::Refusal;

/// How a GPU of the dump got its host GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// As the KFD image of that file id places it.
    Kfd(FileId),
    /// The host has its id.
    Kept,
    /// The first host GPU left whose properties accept it and that leaves
    /// the later GPUs one each.
    Matched,
}

impl std::fmt::Display for Placed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placed::Kfd(id) => write!(f, "where KFD image {id} places it"),
            Placed::Kept => f.write_str("the host has its id"),
            Placed::Matched => f.write_str(
                "the first host GPU left that its properties accept and that leaves the dump's \
                 later GPUs one each",
            ),
        }
    }
}

/// The host GPUs of the dump's GPUs that render files without KFD are of,
/// by their render minor at dump.
#[derive(Clone, Debug, Default)]
pub(crate) struct RenderGpus {
    by_minor: BTreeMap<u32, (GpuId, Placed)>,
}

impl RenderGpus {
    /// Places every GPU recorded in a render image of `dir`, on the GPUs
    /// of `host`.  `Err`: one refusal per GPU that finds none (each GPU
    /// none accepts, and the first the others leave none).
    pub fn place(dir: &Path, host: &Topology, checks: &Checks) -> Result<Self, Vec<Refusal>> {
        let wanted = recorded_gpus(dir);
        let mut out = RenderGpus::default();
        if wanted.is_empty() {
            return Ok(out);
        }
        out.by_kfd_images(dir, host, checks, &wanted);
        let taken = |out: &RenderGpus, g: GpuId| out.by_minor.values().any(|(h, _)| *h == g);
        for (&minor, (_, e)) in &wanted {
            let id = GpuId(e.gpu_id);
            if !out.by_minor.contains_key(&minor) && host.gpu(id).is_some() && !taken(&out, id) {
                out.by_minor.insert(minor, (id, Placed::Kept));
            }
        }
        let left: Vec<(u32, &(FileId, KfdDeviceEntry))> = wanted
            .iter()
            .filter(|(m, _)| !out.by_minor.contains_key(m))
            .map(|(&m, w)| (m, w))
            .collect();
        let mut free = host.clone();
        free.retain_gpus(|n| n.gpu_id.is_some_and(|g| !taken(&out, g)));
        let refusals = out.by_properties(&left, &free, checks);
        if refusals.is_empty() {
            Ok(out)
        } else {
            Err(refusals)
        }
    }

    /// The host GPU of the GPU that was render minor `minor` at dump, and
    /// how it was chosen.
    pub fn get(&self, minor: u32) -> Option<(GpuId, Placed)> {
        self.by_minor.get(&minor).copied()
    }

    /// Step 1: the GPUs of `wanted` a KFD image of `dir` has, where that
    /// image's match puts them (an image that does not read or match is
    /// left to its own restore, which refuses it).
    fn by_kfd_images(
        &mut self,
        dir: &Path,
        host: &Topology,
        checks: &Checks,
        wanted: &BTreeMap<u32, (FileId, KfdDeviceEntry)>,
    ) {
        for id in kfd_image_ids(dir).unwrap_or_default() {
            let Ok(image) = KfdImage::read(dir, id) else {
                continue;
            };
            let has = |e: &&KfdDeviceEntry| {
                e.gpu_id != 0
                    && wanted.contains_key(&e.drm_render_minor)
                    && !self.by_minor.contains_key(&e.drm_render_minor)
            };
            if image.msg.criu_rocm_reopen == Some(true)
                || !image.msg.device_entries.iter().any(|e| has(&e))
            {
                continue;
            }
            let Ok(map) = crate::matcher::match_gpus(
                &match Topology::from_image_entries(&image.msg.device_entries) {
                    Ok(t) => t,
                    Err(_) => continue,
                },
                host,
                checks,
            ) else {
                continue;
            };
            let found: Vec<(u32, GpuId)> = image
                .msg
                .device_entries
                .iter()
                .filter(has)
                .filter_map(|e| Some((e.drm_render_minor, map.get(GpuId(e.gpu_id))?)))
                .collect();
            for (minor, g) in found {
                self.by_minor.insert(minor, (g, Placed::Kfd(id)));
            }
        }
    }

    /// Step 3: the GPUs of `left` (in render-minor order) on the GPUs of
    /// `free`, by their properties: the matcher's search over a topology
    /// of their entries without links, numbered in that order, so that it
    /// takes them in render-minor order and each one's host GPUs in node
    /// order ([`crate::matcher::match_gpus_into`]).  Returns one refusal
    /// per GPU none accepts, and one for the GPU the others leave none.
    fn by_properties(
        &mut self,
        left: &[(u32, &(FileId, KfdDeviceEntry))],
        free: &Topology,
        checks: &Checks,
    ) -> Vec<Refusal> {
        let refuse = |i: usize, why: &str| {
            let (minor, (file, e)) = left[i];
            Refusal::new(
                render_image_name(*file),
                Some(GpuId(e.gpu_id)),
                "criu_rocm_gpu",
                format!(
                    "no KFD process has this GPU (renderD{minor} at dump) and no host GPU left \
                     takes it: {why}"
                ),
            )
        };
        // Index in `left` of the GPUs still to place.
        let (mut todo, unfit) = distinct_gpus(left);
        let mut refusals: Vec<Refusal> = unfit.into_iter().map(|(i, why)| refuse(i, why)).collect();
        if free.gpus().next().is_none() {
            for i in todo {
                refusals.push(refuse(i, "every host GPU is another GPU's of the dump"));
            }
            return refusals;
        }
        // A GPU none accepts is refused and left out, until the others
        // place or one of them is left without a host GPU.
        while !todo.is_empty() {
            let image = without_links(todo.iter().map(|&i| &left[i].1 .1));
            let index = |g: GpuId| {
                todo.iter()
                    .position(|&i| left[i].1 .1.gpu_id == g.0)
                    .expect("a GPU of the image")
            };
            match crate::matcher::match_gpus_into(&image, free, checks) {
                Ok(map) => {
                    for &i in &todo {
                        let (minor, (_, e)) = left[i];
                        let g = map.get(GpuId(e.gpu_id)).expect("every image GPU placed");
                        self.by_minor.insert(minor, (g, Placed::Matched));
                    }
                    break;
                }
                Err(MatchError::NoCandidate { gpu, detail, .. }) => {
                    let n = index(gpu);
                    refusals.push(refuse(todo[n], &detail));
                    todo.remove(n);
                }
                Err(MatchError::NoPlacement { gpu, detail, .. }) => {
                    let n = index(gpu);
                    let node = image.gpu(gpu).expect("a GPU of the image");
                    // The matcher names the host GPUs it accepts (each
                    // taken by another); the others, why it does not.
                    let mut why = crate::matcher::property_refusals(node, free, checks);
                    if !why.is_empty() {
                        why.push_str("; ");
                    }
                    why.push_str(&detail);
                    refusals.push(refuse(todo[n], &why));
                    break;
                }
                Err(e) => {
                    refusals.push(refuse(todo[0], &e.to_string()));
                    break;
                }
            }
        }
        refusals
    }
}

/// The indices in `left` of the GPUs step 3 can place, and why each other
/// one cannot: its entry is no GPU's, or an earlier one has its gpu_id
/// (which names a GPU in the matcher's placement).
fn distinct_gpus(
    left: &[(u32, &(FileId, KfdDeviceEntry))],
) -> (Vec<usize>, Vec<(usize, &'static str)>) {
    let mut ok = Vec::new();
    let mut unfit = Vec::new();
    for (i, (_, (_, e))) in left.iter().enumerate() {
        if e.gpu_id == 0 {
            unfit.push((i, "its entry is no GPU (gpu_id 0)"));
        } else if left[..i].iter().any(|(_, (_, o))| o.gpu_id == e.gpu_id) {
            unfit.push((i, "another GPU of the dump has its gpu_id"));
        } else {
            ok.push(i);
        }
    }
    (ok, unfit)
}

/// A topology of GPU entries `gpus` without their links, numbered in
/// their order (node 0, 1, ...), which the matcher takes them in.
fn without_links<'a>(gpus: impl Iterator<Item = &'a KfdDeviceEntry>) -> Topology {
    let entries: Vec<KfdDeviceEntry> = gpus
        .enumerate()
        .map(|(n, e)| KfdDeviceEntry {
            node_id: n as u32,
            iolinks: Vec::new(),
            ..e.clone()
        })
        .collect();
    Topology::from_image_entries(&entries).expect("distinct node ids")
}

/// The GPU entries the render images of `dir` record (`criu_rocm_gpu`),
/// by their render minor at dump, each with the first image naming it.
fn recorded_gpus(dir: &Path) -> BTreeMap<u32, (FileId, KfdDeviceEntry)> {
    // A directory that does not list places nothing: each render file
    // without KFD is then refused where it is restored.
    let ids = render_image_ids(dir).unwrap_or_default();
    let mut out = BTreeMap::new();
    for id in ids {
        let Ok(img) = RenderImage::read(dir, id) else {
            continue;
        };
        if let Some(e) = img.msg.criu_rocm_gpu {
            out.entry(e.drm_render_minor).or_insert((id, e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::{gpu_entry, tempdir};
    use crate::topology::tests::{cpu, gpu};
    use crate::topology::IOLINK_PCIE as P;

    /// A render image of file `id` of a GPU without KFD: user id `gpu`,
    /// render minor `minor` at dump, its entry `entry`.
    fn write_render(dir: &Path, id: u32, minor: u32, mut entry: KfdDeviceEntry) {
        entry.drm_render_minor = minor;
        let img = RenderImage {
            msg: crate::proto::CriuRenderNode {
                gpu_id: entry.gpu_id,
                drm_render_minor: Some(minor),
                criu_rocm_gpu: Some(entry),
                ..Default::default()
            },
        };
        img.write(dir, FileId(id)).unwrap();
    }

    /// A host of two GPUs like gpu_entry's, `ids` in node order.
    fn host(ids: [u32; 2]) -> Topology {
        Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, ids[0], &[(P, 0)]),
            gpu(2, ids[1], &[(P, 0)]),
        ])
    }

    /// Props of the test topology's GPUs as an entry.
    fn entry(node: u32, id: u32) -> KfdDeviceEntry {
        let t = host([id, 0x9999]);
        let mut e = t.gpu(GpuId(id)).unwrap().gpu_entry();
        e.node_id = node;
        e
    }

    #[test]
    fn the_same_host_keeps_each_gpu_and_another_gets_one_each() {
        let dir = tempdir();
        // Two processes' render files of one GPU, and a third of another.
        write_render(&dir, 3, 129, entry(2, 0x2222));
        write_render(&dir, 4, 129, entry(2, 0x2222));
        write_render(&dir, 5, 128, entry(1, 0x1111));
        let same = RenderGpus::place(&dir, &host([0x1111, 0x2222]), &Checks::default()).unwrap();
        assert_eq!(same.get(128), Some((GpuId(0x1111), Placed::Kept)));
        assert_eq!(same.get(129), Some((GpuId(0x2222), Placed::Kept)));
        // Another host: other ids, in its node order, one host GPU each.
        let other = RenderGpus::place(&dir, &host([0x6666, 0x5555]), &Checks::default()).unwrap();
        assert_eq!(other.get(128), Some((GpuId(0x6666), Placed::Matched)));
        assert_eq!(other.get(129), Some((GpuId(0x5555), Placed::Matched)));
        // One of the host's ids is the dump's: kept, the other takes the rest.
        let mixed = RenderGpus::place(&dir, &host([0x2222, 0x7777]), &Checks::default()).unwrap();
        assert_eq!(mixed.get(129), Some((GpuId(0x2222), Placed::Kept)));
        assert_eq!(mixed.get(128), Some((GpuId(0x7777), Placed::Matched)));
    }

    #[test]
    fn a_gpu_no_host_gpu_takes_is_refused_naming_the_image() {
        let dir = tempdir();
        let mut big = entry(1, 0x1111);
        big.simd_count += 1;
        write_render(&dir, 7, 128, big);
        let e = RenderGpus::place(&dir, &host([0x6666, 0x5555]), &Checks::default()).unwrap_err();
        assert_eq!(e.len(), 1);
        let s = e[0].to_string();
        assert!(
            s.starts_with("amdgpu-renderD-7.img: GPU 0x1111: criu_rocm_gpu: "),
            "{s}"
        );
        assert!(s.contains("host GPU 0x6666 (node 1): simd_count"), "{s}");
    }

    /// A host of GPUs X (0x6666, node 1, 64 GiB of VRAM) and Y (0x5555,
    /// node 2, 32 GiB): a dump GPU of 32 GiB fits either, one of 64 GiB
    /// only X.
    fn big_and_small() -> Topology {
        let mut small = gpu(2, 0x5555, &[(P, 0)]);
        small.props.vram_size = 32 << 30;
        Topology::new(vec![
            cpu(0, &[(P, 1), (P, 2)]),
            gpu(1, 0x6666, &[(P, 0)]),
            small,
        ])
    }

    /// Taking the first host GPU left for each GPU in render-minor order
    /// would give X to renderD128's GPU, which fits Y too, and leave
    /// renderD129's, which fits only X, none.
    #[test]
    fn a_gpu_leaves_the_host_gpu_a_later_one_needs() {
        let dir = tempdir();
        let mut a = entry(1, 0x1111);
        a.vram_size = 32 << 30;
        write_render(&dir, 3, 128, a);
        write_render(&dir, 4, 129, entry(2, 0x2222));
        let got = RenderGpus::place(&dir, &big_and_small(), &Checks::default())
            .unwrap_or_else(|r| panic!("{}", r[0]));
        assert_eq!(got.get(128), Some((GpuId(0x5555), Placed::Matched)));
        assert_eq!(got.get(129), Some((GpuId(0x6666), Placed::Matched)));
    }

    /// Two GPUs only X fits: the later one is refused, saying that X is
    /// the other's and why Y does not fit.
    #[test]
    fn a_gpu_the_others_leave_none_is_refused_naming_each_host_gpu() {
        let dir = tempdir();
        write_render(&dir, 3, 128, entry(1, 0x1111));
        write_render(&dir, 4, 129, entry(2, 0x2222));
        let e = RenderGpus::place(&dir, &big_and_small(), &Checks::default()).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        let s = e[0].to_string();
        assert!(
            s.starts_with(
                "amdgpu-renderD-4.img: GPU 0x2222: criu_rocm_gpu: no KFD process has this GPU \
                 (renderD129 at dump) and no host GPU left takes it: "
            ),
            "{s}"
        );
        assert!(
            s.contains("host GPU 0x5555 (node 2): vram_size 68719476736 > 34359738368"),
            "{s}"
        );
        assert!(
            s.contains("host GPU 0x6666 (node 1): taken by image GPU 0x1111"),
            "{s}"
        );
        // Y would take it without the VRAM size check, and X the other.
        assert!(s.ends_with("with KFD_VRAM_SIZE_CHECK=0 (which skips the vram_size check) this host would take the image"), "{s}");
        // A third GPU of the dump that fits neither is refused too.
        let mut odd = entry(1, 0x3333);
        odd.device_id += 1;
        write_render(&dir, 5, 130, odd);
        let e = RenderGpus::place(&dir, &big_and_small(), &Checks::default()).unwrap_err();
        let s: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(
            s[0].starts_with("amdgpu-renderD-5.img: GPU 0x3333: "),
            "{s:?}"
        );
        assert!(
            s[0].contains("host GPU 0x6666 (node 1): device_id"),
            "{s:?}"
        );
        assert!(
            s[1].starts_with("amdgpu-renderD-4.img: GPU 0x2222: "),
            "{s:?}"
        );
    }

    /// A GPU a KFD image has goes where that image's match puts it, even
    /// where the render files' own order would put it elsewhere.
    #[test]
    fn a_gpu_of_a_kfd_image_follows_its_match() {
        let dir = tempdir();
        write_render(&dir, 3, 129, entry(2, 0x2222));
        let mut kfd = crate::image::tests::sample_kfd();
        // The KFD process has only the GPU that was renderD129 (node 2),
        // as 0x1a2b: the BOs of sample_kfd's on it.
        let mut g = entry(2, 0x1a2b);
        g.drm_render_minor = 129;
        g.iolinks = gpu_entry(2, 0).iolinks;
        kfd.device_entries.truncate(1);
        kfd.device_entries[0].iolinks = vec![crate::proto::DevIolink {
            r#type: P,
            node_to_id: 2,
        }];
        kfd.device_entries.push(g);
        kfd.num_of_gpus = 1;
        kfd.bo_entries.truncate(2);
        kfd.num_of_bos = 2;
        KfdImage { msg: kfd }.write(&dir, FileId(9)).unwrap();
        let one = Topology::new(vec![cpu(0, &[(P, 2)]), gpu(2, 0x5555, &[(P, 0)])]);
        let got = RenderGpus::place(&dir, &one, &Checks::default()).unwrap();
        assert_eq!(got.get(129), Some((GpuId(0x5555), Placed::Kfd(FileId(9)))));
    }
}
