//! "Same BO as" records across images (issue 29): a render image's GEM BO
//! that is another image's BO (`same_bo_file`, `same_bo_index`: a dma-buf
//! of it imported into the render file) must point at a BO that exists,
//! has its size and GPU, and holds bytes of its own (a BO that is itself
//! another's is refused, so no chain and no cycle gets to a restore).
//! A dma-buf image (`bo_file`, `bo_index`: the BO a dma-buf fd of the
//! process is of) is checked the same way.
//!
//! "Its GPU": within one process, the user gpu_ids of both sides (the
//! process' own ids).  Across processes (`same_bo_pid`) user ids do not
//! compare: each process has its own (one restored from another host
//! keeps that host's ids, one started since sees this host's, and two
//! such may even give one id to two GPUs), so the link compares the
//! render minor the dump host gave each side's GPU, which every image of
//! one dump names alike (a render image's `drm_render_minor`, a KFD
//! image's GPU entry of that user id).

use std::collections::{BTreeMap, BTreeSet};

use super::{KfdVerdict, Refusal, RenderFile};
use crate::bo;
use crate::image::{kfd_image_name, render_image_name, DmabufImage, FileId, RenderImage};

/// The GPU of a BO as its image names it: the holding process' user
/// gpu_id and the dump host's render minor of that GPU (`None`: the image
/// does not say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GpuAt {
    user: u32,
    minor: Option<u32>,
}

impl GpuAt {
    fn of_render(img: &RenderImage) -> Self {
        GpuAt {
            user: img.msg.gpu_id,
            minor: img.msg.drm_render_minor,
        }
    }

    /// "GPU 0x1a2b (renderD128 at dump)".
    fn describe(self) -> String {
        match self.minor {
            Some(m) => format!("GPU {:#x} (renderD{m} at dump)", self.user),
            None => format!("GPU {:#x}", self.user),
        }
    }
}

/// What a link may point at: (size, GPU, whether it is a BO with bytes
/// of its own).
type Target = (u64, GpuAt, bool);

/// Every link among the GPU image files `files` -- the render images'
/// (`renders`, decoded once by [`super::read_render_files`]), the dma-buf
/// images' (`dmabufs`, decoded once by check_dir) and the KFD images'
/// imports (`kfd`, decoded by [`super::check_kfd_images`]) -- against the
/// BOs they name, over one index of them: the refusals.
pub(crate) fn check_all(
    files: &BTreeSet<String>,
    kfd: &[KfdVerdict],
    renders: &[RenderFile],
    dmabufs: &[(String, DmabufImage)],
) -> Vec<Refusal> {
    let targets = Targets::new(files, kfd, renders);
    let mut out = check(&targets, renders);
    out.extend(check_dmabufs(&targets, dmabufs));
    out.extend(check_kfd_imports(&targets));
    out
}

/// Every link of the render images `renders` to the KFD images and to
/// each other: the refusals.
fn check(targets: &Targets<'_>, renders: &[RenderFile]) -> Vec<Refusal> {
    let mut out = Vec::new();
    for r in renders.iter().filter(|r| r.id.is_some()) {
        // An image that does not read is refused by its own check.
        if let Some(img) = r.image() {
            out.extend(check_image(&r.name, img, targets));
        }
    }
    out
}

/// The links of render image `name`: one refusal per bad one.
fn check_image(name: &str, img: &RenderImage, targets: &Targets<'_>) -> Vec<Refusal> {
    let mut out = Vec::new();
    for (i, b) in img.msg.bo_entries.iter().enumerate() {
        let (Some(file), Some(index)) = (b.same_bo_file, b.same_bo_index) else {
            continue;
        };
        let why = match targets.get(FileId(file), index) {
            Err(why) => Some(("same_bo_file", why)),
            Ok(None) => Some((
                "same_bo_index",
                format!("file {file}'s image has no BO {index}"),
            )),
            Ok(Some((_, _, false))) => Some((
                "same_bo_index",
                format!(
                    "BO {index} of file {file} is itself another BO's or holds no bytes: \
                     a chain or cycle of \"same BO as\" records"
                ),
            )),
            Ok(Some((size, _, _))) if size != b.size => Some((
                "size",
                format!(
                    "is {} but BO {index} of file {file}, the same BO, has {size} bytes",
                    b.size
                ),
            )),
            Ok(Some((_, gpu, _))) => {
                other_gpu(GpuAt::of_render(img), (file, index, b.same_bo_pid), gpu)
                    .map(|why| ("same_bo_file", why))
                    .or_else(|| {
                        pid_mismatch(img, b, targets.render_pid(FileId(file)))
                            .map(|why| ("same_bo_pid", why))
                    })
            }
        };
        if let Some((f, why)) = why {
            out.push(Refusal::new(
                name,
                Some(img.gpu_id()),
                format!("bo_entries[{i}].{f}"),
                format!("GEM handle {}: {why}", b.handle),
            ));
        }
    }
    out
}

/// Why the BO of GPU `there` that a BO of GPU `here` links to (BO
/// `index` of file `file`, of process `pid` when that is another one) is
/// not of its GPU; `None` when it is.
fn other_gpu(
    here: GpuAt,
    (file, index, pid): (u32, u32, Option<u32>),
    there: GpuAt,
) -> Option<String> {
    let target = match pid {
        Some(p) => format!("BO {index} of file {file} (pid {p})"),
        None => format!("BO {index} of file {file}"),
    };
    match (pid, here.minor, there.minor) {
        (_, Some(a), Some(b)) if a != b => Some(format!(
            "{target} is of the dump host's {}, not this image's {}",
            there.describe(),
            here.describe()
        )),
        (None, _, _) if here.user != there.user => Some(format!(
            "{target} is of GPU {:#x}, not this image's",
            there.user
        )),
        (Some(_), None, _) | (Some(_), _, None) => Some(format!(
            "{target} is another process' BO, whose user gpu_ids are its own, and {} \
             names no render minor of the dump host to compare the GPUs by",
            if here.minor.is_none() {
                "this image"
            } else {
                "its image"
            }
        )),
        _ => None,
    }
}

/// What is wrong with the `same_bo_pid` of BO `b` of render image `img`,
/// whose first holder is a render file of task `holder` (both pids as the
/// dump wrote them, `criu_rocm_pid`; unknown for a KFD image): it names
/// that task when it is another than the image's own, and is absent when
/// it is the same (the restore hands the BO over between processes by it).
fn pid_mismatch(
    img: &RenderImage,
    b: &crate::proto::DrmBoEntry,
    holder: Option<u32>,
) -> Option<String> {
    let (own, holder) = (img.msg.criu_rocm_pid?, holder?);
    let file = b.same_bo_file?;
    match (b.same_bo_pid, holder != own) {
        (Some(p), true) if p != holder => Some(format!(
            "is {p}, but file {file} is a render file of pid {holder}"
        )),
        (Some(p), false) => Some(format!(
            "is {p}, but file {file} is a render file of this image's own pid {own}"
        )),
        (None, true) => Some(format!(
            "is absent, but file {file} is a render file of pid {holder}, not of this \
             image's pid {own}"
        )),
        _ => None,
    }
}

/// Every dma-buf image of `dmabufs` (name, image; one that does not
/// decode is refused by its own check) against the BO it names: the
/// refusals.
fn check_dmabufs(targets: &Targets<'_>, dmabufs: &[(String, DmabufImage)]) -> Vec<Refusal> {
    let mut out = Vec::new();
    for (name, img) in dmabufs {
        if let Some((field, why)) = dmabuf_target(targets, img) {
            let gpu = img.msg.gpu_id.map(crate::ids::GpuId);
            out.push(Refusal::new(name.as_str(), gpu, field, why));
        }
    }
    out
}

/// Every BO a KFD image of `kfd` imports from another process
/// (`criu_rocm_imports`) against the BO it names, as a render image's
/// links: the refusals, each naming the image and the field.
fn check_kfd_imports(targets: &Targets<'_>) -> Vec<Refusal> {
    let mut out = Vec::new();
    for v in targets.kfd {
        let Some(img) = &v.image else { continue };
        for (i, e) in img.msg.criu_rocm_imports.iter().enumerate() {
            let (file, index) = (FileId(e.same_bo_file), e.same_bo_index);
            let here = kfd_gpu_at(img, e.gpu_id);
            let why = match targets.get(file, index) {
                Err(why) => Some(("same_bo_file", why)),
                Ok(None) => Some((
                    "same_bo_index",
                    format!("file {file}'s image has no BO {index}"),
                )),
                Ok(Some((_, _, false))) => Some((
                    "same_bo_index",
                    format!("BO {index} of file {file} is another BO's or holds no bytes"),
                )),
                Ok(Some((size, _, _))) if size != e.size => Some((
                    "size",
                    format!(
                        "is {} but BO {index} of file {file}, the same BO, has {size} bytes",
                        e.size
                    ),
                )),
                Ok(Some(_)) if here.minor.is_none() => Some((
                    "gpu_id",
                    format!("is {:#x}, a GPU this image does not have", e.gpu_id),
                )),
                // Another process' BO: the dump host's render minors compare.
                Ok(Some((_, g, _))) => other_gpu(here, (file.0, index, Some(e.same_bo_pid)), g)
                    .map(|why| ("gpu_id", why)),
            };
            if let Some((f, why)) = why {
                out.push(Refusal::new(
                    kfd_image_name(v.id),
                    Some(crate::ids::GpuId(e.gpu_id)),
                    format!("criu_rocm_imports[{i}].{f}"),
                    format!("the BO imported at GPU VA {:#x}: {why}", e.addr),
                ));
            }
        }
    }
    out
}

/// The GPU of user id `user` of KFD image `img`, with the dump host's
/// render minor its GPU entry names (`None`: no entry has that id).
fn kfd_gpu_at(img: &crate::image::KfdImage, user: u32) -> GpuAt {
    let minor = img
        .msg
        .device_entries
        .iter()
        .find(|d| d.gpu_id == user)
        .map(|d| d.drm_render_minor);
    GpuAt { user, minor }
}

/// What is wrong with the BO dma-buf image `img` names: the field and why.
fn dmabuf_target(targets: &Targets<'_>, img: &DmabufImage) -> Option<(&'static str, String)> {
    let (file, index) = img.bo();
    let (size, gpu) = (img.msg.size.unwrap_or(0), img.msg.gpu_id.unwrap_or(0));
    match targets.get(file, index) {
        Err(why) => Some(("bo_file", why)),
        Ok(None) => Some(("bo_index", format!("file {file}'s image has no BO {index}"))),
        Ok(Some((_, _, false))) => Some((
            "bo_index",
            format!(
                "BO {index} of file {file} is another BO's or holds no bytes: the dma-buf \
                 must name the BO's first holder"
            ),
        )),
        Ok(Some((s, _, _))) if s != size => Some((
            "size",
            format!("is {size} but BO {index} of file {file}, the dma-buf's BO, has {s} bytes"),
        )),
        // The BO is of the same process: its user ids compare.
        Ok(Some((_, g, _))) if g.user != gpu => Some((
            "gpu_id",
            format!(
                "is {gpu:#x} but BO {index} of file {file} is of GPU {:#x}",
                g.user
            ),
        )),
        Ok(Some(_)) => None,
    }
}

/// The images links may point at, already decoded: each BO found in log
/// time however many links name it (a process can hold thousands of
/// shared BOs, and a KFD image thousands of BOs).
struct Targets<'a> {
    files: &'a BTreeSet<String>,
    /// In file id order ([`super::check_kfd_images`]).
    kfd: &'a [KfdVerdict],
    renders: BTreeMap<FileId, &'a RenderFile>,
}

impl<'a> Targets<'a> {
    fn new(files: &'a BTreeSet<String>, kfd: &'a [KfdVerdict], renders: &'a [RenderFile]) -> Self {
        let renders = renders.iter().filter_map(|r| Some((r.id?, r))).collect();
        Targets {
            files,
            kfd,
            renders,
        }
    }

    /// The pid of the task that holds render file `file` (its image's
    /// `criu_rocm_pid`): `None` for another file or an image without it.
    fn render_pid(&self, file: FileId) -> Option<u32> {
        let (_, img) = self.renders.get(&file)?.read.as_ref().ok()?;
        img.msg.criu_rocm_pid
    }

    /// BO `index` of file `file`'s image (a KFD image or a render image).
    /// `Err`: no such image, or one that does not read.
    fn get(&self, file: FileId, index: u32) -> Result<Option<Target>, String> {
        let index = index as usize;
        if self.files.contains(&kfd_image_name(file)) {
            let v = self
                .kfd
                .binary_search_by_key(&file.0, |v| v.id.0)
                .ok()
                .map(|at| &self.kfd[at]);
            let img = v.and_then(|v| v.image.as_ref()).ok_or_else(|| {
                let why = v.and_then(|v| v.refusal.as_ref());
                why.map_or_else(
                    || format!("{} does not read", kfd_image_name(file)),
                    |r| r.to_string(),
                )
            })?;
            let b = img.msg.bo_entries.get(index);
            return Ok(b.map(|b| {
                // The GPU entry of the BO's user id (a BO of no GPU of its
                // image is refused by the KFD image's own check).
                let gpu = kfd_gpu_at(img, b.gpu_id);
                (b.size, gpu, bo::has_contents(b.alloc_flags))
            }));
        }
        if let Some(r) = self.renders.get(&file) {
            let (_, img) = r.read.as_ref().map_err(|e| e.to_string())?;
            let b = img.msg.bo_entries.get(index);
            let gpu = GpuAt::of_render(img);
            return Ok(b.map(|b| (b.size, gpu, b.same_bo_index.is_none())));
        }
        Err(format!(
            "names file {file}, but the directory has no GPU image of that file ({} or {})",
            kfd_image_name(file),
            render_image_name(file)
        ))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::image::dmabuf_image_id;
    use crate::image::tests::{sample_kfd, tempdir};
    use crate::image::KfdImage;
    use crate::proto::{CriuRenderNode, DrmBoEntry};
    use std::path::Path;

    /// A render image of GPU `gpu` holding `bos`.
    pub(in crate::validate) fn render(gpu: u32, bos: Vec<DrmBoEntry>) -> RenderImage {
        RenderImage {
            msg: CriuRenderNode {
                gpu_id: gpu,
                num_of_bos: Some(bos.len() as u64),
                bo_entries: bos,
                ..Default::default()
            },
        }
    }

    fn bo(size: u64, link: Option<(u32, u32)>) -> DrmBoEntry {
        super::super::overlaps::tests::gem(0x1_0000_0000, size, link)
    }

    /// KFD image 5 (sample_kfd, decoded; its GPUs 0x1a2b and 0x5c3d
    /// renderD128 and renderD129 at dump) and render image 6 (of GPU
    /// 0x1a2b, renderD128: a 64 KiB BO, and a BO that is KFD BO 0) written
    /// in `dir`: what the links of the tests below point at.
    fn targets(dir: &Path) -> [KfdVerdict; 1] {
        let mut six = render(
            0x1a2b,
            vec![bo(0x1_0000, None), bo(0x20_0000, Some((5, 0)))],
        );
        six.msg.drm_render_minor = Some(128);
        six.msg.bo_entries[1].handle = 2;
        six.msg.bo_entries[1].offset = 0x2_0000_0000;
        six.write(dir, FileId(6)).unwrap();
        let mut msg = sample_kfd();
        msg.device_entries[1].drm_render_minor = 128;
        msg.device_entries[2].drm_render_minor = 129;
        [KfdVerdict {
            id: FileId(5),
            image: Some(KfdImage { msg }),
            refusal: None,
        }]
    }

    /// The refusals of render image 9, whose only BO links to `link`
    /// with `size` bytes; KFD image 5 (sample_kfd) and render image 6 (a
    /// 64 KiB BO, and a BO that is KFD BO 0) beside it.
    fn refusals(size: u64, link: (u32, u32)) -> Vec<String> {
        refusals_of(render(0x1a2b, vec![bo(size, Some(link))]))
    }

    /// The refusals of render image `nine` written as file 9 beside the
    /// images of [`targets`].
    fn refusals_of(nine: RenderImage) -> Vec<String> {
        let dir = tempdir();
        let kfd = targets(&dir);
        nine.write(&dir, FileId(9)).unwrap();
        let names = [
            "amdgpu-kfd-5.img",
            "amdgpu-renderD-6.img",
            "amdgpu-renderD-9.img",
        ];
        run_check(&dir, &names, &kfd, |t, r, _| check(t, r))
    }

    /// Runs link check `step` over the image files `names` written in
    /// `dir`, with the decoded KFD images `kfd`: its refusals as text.
    fn run_check(
        dir: &Path,
        names: &[&str],
        kfd: &[KfdVerdict],
        step: impl Fn(&Targets<'_>, &[RenderFile], &[(String, DmabufImage)]) -> Vec<Refusal>,
    ) -> Vec<String> {
        let files: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
        let renders = super::super::read_render_files(dir, &files);
        let dmabufs: Vec<(String, DmabufImage)> = files
            .iter()
            .filter_map(|n| Some((n.clone(), DmabufImage::read(dir, dmabuf_image_id(n)?).ok()?)))
            .collect();
        let targets = Targets::new(&files, kfd, &renders);
        let out = step(&targets, &renders, &dmabufs)
            .iter()
            .map(|r| r.to_string())
            .collect();
        out
    }

    /// The refusals of render image 9 of pid `own`, whose only BO is BO 0
    /// of render image 6 of pid 40, with `same_bo_pid`.
    fn pid_refusals(own: u32, same_bo_pid: Option<u32>) -> Vec<String> {
        let dir = tempdir();
        let mut six = render(0x1a2b, vec![bo(0x1_0000, None)]);
        six.msg.criu_rocm_pid = Some(40);
        six.msg.drm_render_minor = Some(128);
        six.write(&dir, FileId(6)).unwrap();
        let mut nine = render(0x1a2b, vec![bo(0x1_0000, Some((6, 0)))]);
        nine.msg.criu_rocm_pid = Some(own);
        nine.msg.drm_render_minor = Some(128);
        nine.msg.bo_entries[0].same_bo_pid = same_bo_pid;
        nine.write(&dir, FileId(9)).unwrap();
        let names = ["amdgpu-renderD-6.img", "amdgpu-renderD-9.img"];
        run_check(&dir, &names, &[], |t, r, _| check(t, r))
    }

    #[test]
    fn same_bo_pid_names_the_holders_task_when_it_is_another() {
        assert_eq!(pid_refusals(41, Some(40)), Vec::<String>::new());
        assert_eq!(pid_refusals(40, None), Vec::<String>::new());
        for (own, pid, want) in [
            (41, None, "same_bo_pid: GEM handle 1: is absent, but file 6 is a render file of pid 40"),
            (41, Some(42), "same_bo_pid: GEM handle 1: is 42, but file 6 is a render file of pid 40"),
            (40, Some(40), "same_bo_pid: GEM handle 1: is 40, but file 6 is a render file of this image's own pid 40"),
        ] {
            let got = pid_refusals(own, pid);
            assert!(
                got.len() == 1 && got[0].contains(want),
                "own {own}, same_bo_pid {pid:?}: {got:?}"
            );
        }
    }

    #[test]
    fn a_link_to_a_bo_of_its_size_and_gpu_holds() {
        assert_eq!(refusals(0x1_0000, (6, 0)), Vec::<String>::new());
        assert_eq!(refusals(0x20_0000, (5, 0)), Vec::<String>::new());
    }

    #[test]
    fn a_link_to_nothing_another_size_or_a_link_is_refused() {
        for (size, link, want) in [
            (
                0x1_0000,
                (7, 0),
                "bo_entries[0].same_bo_file: GEM handle 1: names file 7",
            ),
            (
                0x1_0000,
                (6, 2),
                "bo_entries[0].same_bo_index: GEM handle 1: file 6's image has no BO 2",
            ),
            (
                0x2000,
                (6, 0),
                "bo_entries[0].size: GEM handle 1: is 8192 but BO 0 of file 6",
            ),
            (0x20_0000, (6, 1), "a chain or cycle"),
            // The doorbell: a KFD BO without bytes.
            (0x2000, (5, 1), "holds no bytes"),
            (0x1_0000, (9, 0), "a chain or cycle"),
        ] {
            let got = refusals(size, link);
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(
                got[0].starts_with("amdgpu-renderD-9.img: GPU 0x1a2b: "),
                "{got:?}"
            );
            assert!(got[0].contains(want), "{want:?} not in {got:?}");
        }
    }

    /// Render image 9 of process 7, which sees GPU `user` at render minor
    /// `minor` at dump, its only BO the same as BO `index` of file `file`
    /// of another process, pid `pid` (`None`: of process 7 itself).
    fn linked(
        user: u32,
        minor: Option<u32>,
        (file, index): (u32, u32),
        pid: Option<u32>,
    ) -> RenderImage {
        let size = if file == 5 { 0x20_0000 } else { 0x1_0000 };
        let mut nine = render(user, vec![bo(size, Some((file, index)))]);
        nine.msg.drm_render_minor = minor;
        nine.msg.criu_rocm_pid = Some(7);
        nine.msg.bo_entries[0].same_bo_pid = pid;
        nine
    }

    /// Processes of one dump see GPUs by ids of their own (one restored
    /// from another host keeps that host's): a link to another process'
    /// BO holds when the dump host's render minor of both sides is one,
    /// whatever their user ids, and is refused when the minors differ,
    /// even with equal user ids.
    #[test]
    fn a_link_across_processes_compares_the_dump_hosts_gpu() {
        for link in [(6, 0), (5, 0)] {
            // Process 7 sees renderD128's GPU as 0x7777; pid 42 as 0x1a2b.
            assert_eq!(
                refusals_of(linked(0x7777, Some(128), link, Some(42))),
                Vec::<String>::new(),
                "{link:?}"
            );
            // Its 0x1a2b is renderD129, another GPU than pid 42's 0x1a2b.
            let got = refusals_of(linked(0x1a2b, Some(129), link, Some(42)));
            assert_eq!(got.len(), 1, "{got:?}");
            let want = format!(
                "bo_entries[0].same_bo_file: GEM handle 1: BO 0 of file {} (pid 42) is of the \
                 dump host's GPU 0x1a2b (renderD128 at dump), not this image's GPU 0x1a2b \
                 (renderD129 at dump)",
                link.0
            );
            assert!(got[0].contains(&want), "{want:?} not in {got:?}");
        }
    }

    /// Without the render minor on either side a link across processes
    /// cannot be checked and is refused; within a process the user ids
    /// compare, and so do the minors where both images name one.
    #[test]
    fn a_link_whose_gpus_cannot_be_compared_is_refused() {
        let got = refusals_of(linked(0x1a2b, None, (6, 0), Some(42)));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains("this image names no render minor"),
            "{got:?}"
        );
        let got = refusals_of(linked(0x1a2b, Some(128), (6, 0), None));
        assert_eq!(got, Vec::<String>::new());
        let got = refusals_of(linked(0x1a2b, Some(129), (5, 0), None));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].contains("renderD128 at dump), not this image's GPU 0x1a2b (renderD129"),
            "{got:?}"
        );
        let got = refusals_of(linked(0x5c3d, Some(128), (6, 0), None));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].ends_with("BO 0 of file 6 is of GPU 0x1a2b, not this image's"),
            "{got:?}"
        );
        let got = refusals_of(linked(0x5c3d, None, (6, 0), None));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].ends_with("BO 0 of file 6 is of GPU 0x1a2b, not this image's"),
            "{got:?}"
        );
    }

    /// The refusals of dma-buf image 11 naming BO `index` of file `file`,
    /// `size` bytes of GPU `gpu`, beside the images of [`refusals`].
    fn dmabuf_refusals(file: u32, index: u32, size: u64, gpu: u32) -> Vec<String> {
        let dir = tempdir();
        let kfd = targets(&dir);
        DmabufImage {
            msg: crate::proto::CriuDmabufNode {
                gem_handle: 1,
                bo_file: Some(file),
                bo_index: Some(index),
                gpu_id: Some(gpu),
                size: Some(size),
                file_flags: Some(2),
            },
        }
        .write(&dir, FileId(11))
        .unwrap();
        let names = [
            "amdgpu-kfd-5.img",
            "amdgpu-renderD-6.img",
            "amdgpu-dmabuf_11.img",
        ];
        run_check(&dir, &names, &kfd, |t, _, d| check_dmabufs(t, d))
    }

    #[test]
    fn a_dmabuf_names_an_existing_bo_of_its_size_and_gpu() {
        assert_eq!(
            dmabuf_refusals(6, 0, 0x1_0000, 0x1a2b),
            Vec::<String>::new()
        );
        let kfd = sample_kfd();
        let b = &kfd.bo_entries[0];
        assert_eq!(
            dmabuf_refusals(5, 0, b.size, b.gpu_id),
            Vec::<String>::new()
        );
        for (file, index, size, gpu, want) in [
            (7, 0, 0x1_0000, 0x1a2b, "bo_file: names file 7"),
            (
                6,
                2,
                0x1_0000,
                0x1a2b,
                "bo_index: file 6's image has no BO 2",
            ),
            (
                6,
                1,
                0x1_0000,
                0x1a2b,
                "bo_index: BO 1 of file 6 is another BO's",
            ),
            (6, 0, 0x2000, 0x1a2b, "size: is 8192 but BO 0 of file 6"),
            (
                6,
                0,
                0x1_0000,
                0x5c3d,
                "gpu_id: is 0x5c3d but BO 0 of file 6 is of GPU 0x1a2b",
            ),
        ] {
            let got = dmabuf_refusals(file, index, size, gpu);
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(got[0].starts_with("amdgpu-dmabuf_11.img: "), "{got:?}");
            assert!(got[0].contains(want), "{want:?} not in {got:?}");
        }
    }

    /// The refusals of KFD image 12 (pid 43), importing BO `index` of file
    /// `file` as `size` bytes of GPU `gpu`, beside the images of
    /// [`refusals`].
    fn import_refusals(file: u32, index: u32, size: u64, gpu: u32) -> Vec<String> {
        let dir = tempdir();
        let mut kfd = targets(&dir).to_vec();
        let mut importer = sample_kfd();
        importer.pid = 43;
        importer.device_entries[1].drm_render_minor = 128;
        importer.device_entries[2].drm_render_minor = 129;
        importer.criu_rocm_imports = vec![crate::proto::KfdImportEntry {
            addr: 0x7100_0000_0000,
            size,
            offset: 0x1_0000_0000,
            alloc_flags: bo::ALLOC_VRAM | bo::ALLOC_WRITABLE,
            gpu_id: gpu,
            idr_handle: 3,
            mapped_gpu_ids: vec![gpu],
            same_bo_file: file,
            same_bo_index: index,
            same_bo_pid: 42,
        }];
        kfd.push(KfdVerdict {
            id: FileId(12),
            image: Some(KfdImage { msg: importer }),
            refusal: None,
        });
        let names = [
            "amdgpu-kfd-5.img",
            "amdgpu-renderD-6.img",
            "amdgpu-kfd-12.img",
        ];
        run_check(&dir, &names, &kfd, |t, _, _| check_kfd_imports(t))
    }

    #[test]
    fn a_kfd_import_names_an_existing_bo_of_its_size_and_gpu() {
        let b = sample_kfd().bo_entries[0].clone();
        assert_eq!(
            import_refusals(5, 0, b.size, b.gpu_id),
            Vec::<String>::new()
        );
        for (file, index, size, gpu, want) in [
            (
                7,
                0,
                b.size,
                b.gpu_id,
                "criu_rocm_imports[0].same_bo_file: ",
            ),
            (
                5,
                9,
                b.size,
                b.gpu_id,
                "criu_rocm_imports[0].same_bo_index: ",
            ),
            (
                5,
                1,
                0x2000,
                b.gpu_id,
                "criu_rocm_imports[0].same_bo_index: ",
            ),
            (
                5,
                0,
                0x1000,
                b.gpu_id,
                "criu_rocm_imports[0].size: the BO imported at GPU VA 0x710000000000: is 4096",
            ),
            (
                5,
                0,
                b.size,
                0x5c3d,
                "criu_rocm_imports[0].gpu_id: the BO imported at GPU VA 0x710000000000: BO 0 of \
                 file 5 (pid 42) is of the dump host's GPU 0x1a2b (renderD128 at dump), not this \
                 image's GPU 0x5c3d (renderD129 at dump)",
            ),
            (
                5,
                0,
                b.size,
                0x7777,
                "criu_rocm_imports[0].gpu_id: the BO imported at GPU VA 0x710000000000: is \
                 0x7777, a GPU this image does not have",
            ),
        ] {
            let got = import_refusals(file, index, size, gpu);
            assert_eq!(got.len(), 1, "{got:?}");
            assert!(got[0].starts_with("amdgpu-kfd-12.img: "), "{got:?}");
            assert!(got[0].contains(want), "{want:?} not in {got:?}");
        }
    }
}
