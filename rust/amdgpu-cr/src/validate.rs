//! The one validation of an image directory's GPU state, shared by the
//! restore (criu main, before any task is created or any device opened) and
//! by `criu-rocm gpu-check`: whatever makes one refuse makes the other
//! refuse, with the same [`Refusal`].
//!
//! It reads files only, and only of the directory: the GPU images, the
//! digests file written at dump ([`digests`]), and the CRIU images that
//! describe the process (`inventory.img`, `files.img`, `pstree.img`,
//! `mm-<pid>.img`).  It never looks at this host (GPU matching is the
//! restore's next step, [`crate::match_image_to_host`]).  What it checks:
//!
//! * every GPU image decodes and is consistent in itself
//!   ([`KfdImage::validate`], [`RenderImage::decode`]);
//! * an image that declares criu-rocm's extension has the content hash of
//!   every BO with contents, and a kernel blob that parses with the BO
//!   record size recorded at dump (upstream's images: with a known size);
//! * KFD's private data holds only values KFD writes ([`privdata`]: MQD
//!   and control stack sizes, queue types, engine, doorbell and event ids,
//!   ring and context save addresses inside the process' BOs, SVM ranges
//!   inside its mappings, the blob's version), since the kernel's RESTORE
//!   copies by the sizes the blob declares;
//! * the KFD process has BOs (KFD refuses to restore one without) and a
//!   pid that the process tree restores, once;
//! * each GPU's pages file has exactly the bytes its BOs need
//!   ([`Depth::Contents`]: and every BO matches its content hash);
//! * every BO the process mapped (its `mm-<pid>.img`) is mapped at its own
//!   address and offset, and every mapping of a render node is of a BO;
//! * every GPU file of `files.img` has its image when the inventory names
//!   the AMD GPU plugin, and every KFD image belongs to a file;
//! * a "same BO as" record points at a BO with bytes of its own, of its
//!   size and GPU ([`links`]), and no two saved BOs of one GPU have
//!   overlapping mmap-offset ranges unless one is such a record of the
//!   other ([`overlaps`]: one BO saved twice, by images written before
//!   criu-rocm recorded "same BO as", would restore as two);
//! * with a digests file: every GPU image file it lists is present, with
//!   its size and XXH3-64, and no other is.  An image that declares
//!   extension version 3 or later requires the digests file.
//!
//! Images without any of criu-rocm's data (upstream's layout) are
//! validated as far as they go and reported with one warning,
//! [`Report::warning`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;
use std::path::Path;

use crate::bo;
use crate::criu_images::{self, FileMapping, Files};
use crate::ids::GpuId;
use crate::image::{
    dmabuf_image_id, kfd_image_id, kfd_image_name, read_whole, render_image_name, DmabufImage,
    FileId, ImageError, KfdImage, RenderImage,
};
use crate::pages::{content_bos, pages_image_name, pages_total, Encoding, FrameError, PagesReader};
use crate::plan::{DeviceKind, OffsetIndex};

pub mod chain;
pub mod digests;
mod links;
mod overlaps;
pub mod privdata;
pub mod signature;

/// The most KFD processes (KFD images that are no reopen) one restore
/// brings back: the slots of the GPU memory writer's board (half a KiB
/// each, in a mapping shared with every restored task).  A dump of more is refused by its own
/// validation, before the process is killed.
pub const MAX_KFD_PROCESSES: usize = 1024;

/// The first extension version whose dump writes [`digests::FILE`].
pub const DIGESTS_SINCE: u32 = 3;

/// Why images cannot be restored: the image file, the GPU when the reason
/// concerns one, the field (empty when the whole file is at fault) and the
/// reason.  File names carry no directory, so the restore and `gpu-check`
/// word a refusal alike wherever they found the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub file: String,
    pub gpu: Option<GpuId>,
    pub field: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        if let Some(g) = self.gpu {
            write!(f, "GPU {g}: ")?;
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    pub fn new(
        file: impl Into<String>,
        gpu: Option<GpuId>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Refusal {
            file: base_name(&file.into()),
            gpu,
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A BO whose bytes differ from the hash the image saved for them (the
    /// same words from `gpu-check` and from the restore's copy).
    pub fn content_mismatch(
        file: &str,
        gpu: GpuId,
        bo: usize,
        addr: u64,
        size: u64,
        expected: u64,
        got: u64,
    ) -> Self {
        Refusal::new(
            file,
            Some(gpu),
            format!("bo_entries[{bo}].content_xxh3"),
            format!(
                "the BO at {addr:#x} ({size} bytes) hashes to {got:#018x}, not the \
                 {expected:#018x} saved at dump: the pages file is damaged"
            ),
        )
    }
}

impl From<ImageError> for Refusal {
    fn from(e: ImageError) -> Self {
        match e {
            ImageError::Io { file, op, source } => {
                Refusal::new(file, None, "", format!("{op}: {source}"))
            }
            ImageError::TooLarge {
                file,
                field,
                size,
                limit,
            } => Refusal::new(
                file,
                None,
                field,
                format!("is {size} bytes, more than the limit of {limit}"),
            ),
            ImageError::Truncated {
                file,
                field,
                expected,
                got,
            } => Refusal::new(
                file,
                None,
                field,
                format!("truncated: needs {expected} bytes, only {got} present"),
            ),
            ImageError::TrailingData { file, field, extra } => Refusal::new(
                file,
                None,
                field,
                format!("{extra} unexpected bytes after it"),
            ),
            ImageError::Decode {
                file,
                message,
                source,
            } => Refusal::new(file, None, message, format!("cannot decode: {source}")),
            ImageError::Invalid {
                file,
                field,
                reason,
            } => Refusal::new(file, None, field, reason),
            ImageError::PagesSizeMismatch {
                file,
                gpu,
                header,
                expected,
            } => Refusal::new(
                file,
                Some(gpu),
                "size header",
                format!(
                    "says {header} bytes of BO contents but the image's BOs add up to {expected}"
                ),
            ),
        }
    }
}

fn base_name(file: &str) -> String {
    Path::new(file)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(file)
        .to_owned()
}

/// How far [`check_dir`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// Everything but the BO contents (the restore: its copy checks every
    /// BO against its hash as it goes, before any task runs).
    Metadata,
    /// And every byte of every pages file against its BO's hash
    /// (`gpu-check`).
    Contents,
    /// [`Depth::Metadata`] of streamed images (`--stream`, see
    /// [`crate::stream`]): `dir` holds the metadata files only (the KFD
    /// and render-node images, `amdgpu-digests.img`), none of CRIU's; the
    /// pages files are in the stream, and their size words, lengths and
    /// bytes are checked as the restore reads them.
    Streamed,
}

/// The verdict on one KFD image.
#[derive(Clone, Debug)]
pub struct KfdVerdict {
    pub id: FileId,
    /// The decoded image (`None`: it could not be read).
    pub image: Option<KfdImage>,
    pub refusal: Option<Refusal>,
}

impl KfdVerdict {
    /// The image's pid, when it could be read.
    pub fn pid(&self) -> Option<u32> {
        self.image.as_ref().map(|i| i.msg.pid)
    }

    /// A further open of a process' `/dev/kfd` (no state of its own).
    pub fn is_reopen(&self) -> bool {
        self.image
            .as_ref()
            .is_some_and(|i| i.msg.criu_rocm_reopen == Some(true))
    }
}

/// What [`check_dir`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One per KFD image, in id order.
    pub kfd: Vec<KfdVerdict>,
    /// Refusals that are not one KFD image's (render-node images, the
    /// digests file, files missing from the directory).
    pub other: Vec<Refusal>,
    /// Set when the images carry none (or only part) of criu-rocm's
    /// integrity data: one line to show, not a refusal.
    pub warning: Option<String>,
    /// Whether the directory holds any GPU state at all.
    pub has_gpu_state: bool,
    /// Facts to show that are neither refusals nor warnings (e.g. that
    /// the pages files are compressed).
    pub notes: Vec<String>,
}

impl Report {
    /// Every refusal, KFD images first.
    pub fn refusals(&self) -> impl Iterator<Item = &Refusal> {
        self.kfd
            .iter()
            .filter_map(|k| k.refusal.as_ref())
            .chain(self.other.iter())
    }

    pub fn is_ok(&self) -> bool {
        self.refusals().next().is_none()
    }
}

/// The GPU image files of `dir`, by name.
fn gpu_files(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        let Ok(name) = ent.file_name().into_string() else {
            continue;
        };
        if digests::is_gpu_image(&name) {
            out.insert(name);
        }
    }
    Ok(out)
}

/// Validates the GPU state of the image directory `dir` (see the module
/// documentation).  Reads files only.  `Err`: the directory itself could
/// not be listed.
///
/// In steps: the digests file ([`read_manifest`]), the render-node images
/// read and decoded once for every step that needs them
/// ([`read_render_files`]), each KFD image ([`check_kfd_images`]), each
/// render-node image ([`check_render_images`]), their "same BO as" links
/// ([`links`]) and overlaps ([`overlaps`]),
/// the digests file against the directory ([`check_listing`]), `files.img`
/// against the images ([`check_files_img`]).
pub fn check_dir(dir: &Path, depth: Depth) -> std::io::Result<Report> {
    let files = gpu_files(dir)?;
    let mut report = Report {
        has_gpu_state: !files.is_empty(),
        ..Default::default()
    };
    let manifest = read_manifest(dir, &mut report);
    let renders = read_render_files(dir, &files);
    let ctx = Context::read(dir, &renders);
    let declared = check_kfd_images(dir, &files, manifest.as_ref(), &ctx, depth, &mut report);
    check_render_images(dir, &renders, manifest.as_ref(), depth, &mut report);
    let dmabufs = check_dmabuf_images(dir, &files, manifest.as_ref(), &mut report);
    report
        .other
        .extend(links::check_all(&files, &report.kfd, &renders, &dmabufs));
    report.other.extend(overlaps::check(&report.kfd, &renders));
    check_listing(dir, &files, manifest.as_ref(), declared, depth, &mut report);
    check_files_img(&files, &ctx, manifest.as_ref(), &mut report);
    Ok(report)
}

/// What the KFD images declare of criu-rocm's integrity data: the first
/// image with the extension and its version; whether every image has it.
#[derive(Clone, Copy)]
struct Declared {
    first: Option<(FileId, u32)>,
    all_hashed: bool,
}

/// The digests file, when the directory has one that parses (a damaged
/// one is a refusal).
fn read_manifest(dir: &Path, report: &mut Report) -> Option<digests::Digests> {
    match read_whole(&dir.join(digests::FILE), None) {
        Ok(bytes) => match digests::Digests::parse(&bytes) {
            Ok(m) => Some(m),
            Err(r) => {
                report.other.push(r);
                None
            }
        },
        Err(ImageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            report.other.push(e.into());
            None
        }
    }
}

/// Each KFD image of `files`, in id order, into `report.kfd`; then the
/// number of KFD processes against what one restore brings back.
fn check_kfd_images(
    dir: &Path,
    files: &BTreeSet<String>,
    manifest: Option<&digests::Digests>,
    ctx: &Context,
    depth: Depth,
    report: &mut Report,
) -> Declared {
    let mut ids: Vec<FileId> = files.iter().filter_map(|n| kfd_image_id(n)).collect();
    ids.sort_by_key(|i| i.0);
    let mut pids_seen: BTreeMap<u32, FileId> = BTreeMap::new();
    let mut declared = Declared {
        first: None,
        all_hashed: true,
    };
    for &id in &ids {
        let mut v = KfdVerdict {
            id,
            image: None,
            refusal: None,
        };
        let name = kfd_image_name(id);
        match read_whole(&dir.join(&name), None)
            .and_then(|bytes| KfdImage::decode(&name, &bytes).map(|i| (bytes, i)))
        {
            Err(e) => v.refusal = Some(e.into()),
            Ok((bytes, image)) => {
                note_compression(&name, &image, report);
                if let Some(ext) = image.msg.criu_rocm_ext_version {
                    declared.first.get_or_insert((id, ext));
                } else {
                    declared.all_hashed = false;
                }
                // The contents last, so that gpu-check's first reason is
                // the restore's (whose copy checks them later).
                v.refusal = check_kfd(dir, id, &image, ctx, &mut pids_seen, depth)
                    .err()
                    .or_else(|| manifest.and_then(|m| m.check_kfd(dir, id, &bytes, &image).err()))
                    .or_else(|| match depth {
                        Depth::Contents if image.msg.criu_rocm_reopen != Some(true) => image
                            .gpu_ids()
                            .into_iter()
                            .find_map(|gpu| check_pages(dir, id, &name, &image, gpu, depth).err()),
                        _ => None,
                    });
                v.image = Some(image);
            }
        }
        report.kfd.push(v);
    }
    let processes = report.kfd.iter().filter(|v| !v.is_reopen()).count();
    if processes > MAX_KFD_PROCESSES {
        report.other.push(Refusal::new(
            "amdgpu-kfd-*.img",
            None,
            "",
            format!(
                "{processes} KFD processes, more than the {MAX_KFD_PROCESSES} one restore brings \
                 back (the GPU memory writer's board)"
            ),
        ));
    }
    declared
}

/// A note, once, when the pages files are compressed.
fn note_compression(name: &str, image: &KfdImage, report: &mut Report) {
    if let Ok(e @ Encoding::Zstd { .. }) = Encoding::of(name, &image.msg) {
        let note =
            format!("compressed GPU pages ({e}): upstream's amdgpu plugin cannot restore these");
        if !report.notes.contains(&note) {
            report.notes.push(note);
        }
    }
}

/// A render-node image of the directory, read and decoded once for the
/// whole of [`check_dir`]: its own checks ([`check_render_images`]), the
/// GEM BOs a process' mappings may be of ([`Context`]), the "same BO as"
/// links ([`links`]) and the overlaps ([`overlaps`]) all use this one
/// decoding (a dump of many processes has as many render images, a render
/// image thousands of GEM BOs).
pub(crate) struct RenderFile {
    pub name: String,
    /// Its CRIU file id (`None`: not named amdgpu-renderD-<file id>.img).
    pub id: Option<FileId>,
    /// The file's bytes (for the digests file's check) and its image;
    /// `Err`: it does not read or decode.
    pub read: Result<(Vec<u8>, RenderImage), Refusal>,
}

impl RenderFile {
    /// The image, when the file read and decoded.
    pub fn image(&self) -> Option<&RenderImage> {
        self.read.as_ref().ok().map(|(_, img)| img)
    }
}

/// The render-node images among `files`, each read and decoded.
fn read_render_files(dir: &Path, files: &BTreeSet<String>) -> Vec<RenderFile> {
    let names = files.iter().filter(|n| n.starts_with("amdgpu-renderD-"));
    names
        .map(|name| RenderFile {
            name: name.clone(),
            id: crate::image::render_image_id(name),
            read: read_whole(&dir.join(name), None)
                .and_then(|bytes| RenderImage::decode(name, &bytes).map(|img| (bytes, img)))
                .map_err(Refusal::from),
        })
        .collect()
}

/// Render-node images: each must decode; the bytes of their GEM BOs are
/// checked as a KFD image's.
fn check_render_images(
    dir: &Path,
    renders: &[RenderFile],
    manifest: Option<&digests::Digests>,
    depth: Depth,
    report: &mut Report,
) {
    for r in renders {
        if let Err(r) = check_render(dir, r, manifest, depth) {
            report.other.push(r);
        }
    }
}

/// Dma-buf images: each must decode and match its digest; the BO each
/// names is checked with the links ([`links::check_all`]), which take the
/// images decoded here (those named as the dump names them).
fn check_dmabuf_images(
    dir: &Path,
    files: &BTreeSet<String>,
    manifest: Option<&digests::Digests>,
    report: &mut Report,
) -> Vec<(String, DmabufImage)> {
    let mut decoded = Vec::new();
    for name in files.iter().filter(|n| n.starts_with("amdgpu-dmabuf_")) {
        let checked = read_whole(&dir.join(name), Some(4096))
            .and_then(|b| DmabufImage::decode(name, &b).map(|img| (b, img)))
            .map_err(Refusal::from)
            .and_then(|(b, img)| {
                if dmabuf_image_id(name).is_some() {
                    decoded.push((name.clone(), img));
                }
                manifest.map_or(Ok(()), |m| m.check_whole(name, &b))
            });
        if let Err(r) = checked {
            report.other.push(r);
        }
    }
    decoded
}

/// The digests file against the directory; without one, a refusal when
/// an image declares it, else the warning of images without integrity
/// data.
fn check_listing(
    dir: &Path,
    files: &BTreeSet<String>,
    manifest: Option<&digests::Digests>,
    declared: Declared,
    depth: Depth,
    report: &mut Report,
) {
    if let Some(m) = manifest {
        report
            .other
            .extend(m.check_listing(dir, files, depth == Depth::Streamed));
        return;
    }
    if dir.join(digests::FILE).exists() {
        // There, but unreadable: read_manifest's refusal.
        return;
    }
    if let Some((id, ext)) = declared.first.filter(|&(_, ext)| ext >= DIGESTS_SINCE) {
        report.other.push(Refusal::new(
            digests::FILE,
            None,
            "",
            format!(
                "missing, though {} declares criu-rocm's extension version {ext}, \
                 whose dump records the digest of every GPU image file there",
                kfd_image_name(id)
            ),
        ));
    } else if report.has_gpu_state {
        report.warning = Some(if declared.first.is_some() && declared.all_hashed {
            format!(
                "these GPU images carry BO content hashes but no {} (an older \
                 criu-rocm's): changes to their metadata cannot be detected",
                digests::FILE
            )
        } else {
            format!(
                "these GPU images carry no integrity data (upstream's layout: no {}, \
                 no BO content hashes): damage to them cannot be detected",
                digests::FILE
            )
        });
    }
}

/// Every GPU file of `files.img` must have its image, every KFD image its
/// file.
fn check_files_img(
    files: &BTreeSet<String>,
    ctx: &Context,
    manifest: Option<&digests::Digests>,
    report: &mut Report,
) {
    let Some(f) = &ctx.files else {
        return;
    };
    // Plugin files are all GPU files only when the inventory names no
    // plugin but the AMD GPU one.
    let gpu_plugin = ctx.plugins.as_ref().is_some_and(|p| {
        p.iter().any(|n| n == criu_images::AMDGPU_PLUGIN)
            && p.iter().all(|n| n == criu_images::AMDGPU_PLUGIN)
    });
    if gpu_plugin {
        for &raw in &f.ext {
            if let Some(r) = missing_image(FileId(raw), files, manifest) {
                report.other.push(r);
                report.has_gpu_state = true;
            }
        }
    }
    let ext: BTreeSet<u32> = f.ext.iter().copied().collect();
    for v in report.kfd.iter_mut().filter(|v| v.refusal.is_none()) {
        if !ext.contains(&v.id.0) {
            v.refusal = Some(Refusal::new(
                kfd_image_name(v.id),
                None,
                "",
                format!(
                    "files.img holds no GPU file {}: the image belongs to no file of \
                     these images",
                    v.id
                ),
            ));
        }
    }
}

/// The refusal of GPU file `id` of `files.img` when the directory has no
/// image of it, naming the image it lacks.
fn missing_image(
    id: FileId,
    files: &BTreeSet<String>,
    manifest: Option<&digests::Digests>,
) -> Option<Refusal> {
    let (kfd, render) = (kfd_image_name(id), render_image_name(id));
    let dmabuf = crate::image::dmabuf_image_name(id);
    if files.contains(&kfd) || files.contains(&render) || files.contains(&dmabuf) {
        return None;
    }
    let pages = files
        .iter()
        .any(|n| n.starts_with(&format!("amdgpu-pages-{id}-")));
    let missing = if pages {
        kfd.clone()
    } else {
        match manifest {
            Some(m) if m.lists(&render) => render.clone(),
            Some(m) if m.lists(&kfd) => kfd.clone(),
            Some(m) if m.lists(&dmabuf) => dmabuf.clone(),
            _ => format!("{kfd} (or {render})"),
        }
    };
    Some(Refusal::new(
        missing,
        None,
        "",
        format!(
            "missing: files.img holds GPU file {id} and inventory.img names {}, but the \
             directory has no image of that file",
            criu_images::AMDGPU_PLUGIN
        ),
    ))
}

/// The render images' GEM BOs: their mmap offset ranges by render minor
/// at dump, so that a mapping finds the one it falls in in log time.
type GemRanges = OffsetIndex<u32>;

/// The CRIU images a KFD image is checked against (each `None` when the
/// directory lacks it; an unreadable one is a refusal where it matters).
struct Context {
    pids: Result<Option<BTreeSet<u32>>, String>,
    files: Option<Files>,
    files_err: Option<String>,
    plugins: Option<Vec<String>>,
    /// The render images' GEM BOs: mmap offset ranges by minor at dump.
    gem: GemRanges,
}

impl Context {
    fn read(dir: &Path, renders: &[RenderFile]) -> Self {
        let (files, files_err) = match criu_images::files(dir) {
            Ok(f) => (f, None),
            Err(e) => (None, Some(e)),
        };
        Context {
            pids: criu_images::pstree_pids(dir),
            files,
            files_err,
            plugins: criu_images::inventory_plugins(dir).ok().flatten(),
            gem: gem_ranges(renders),
        }
    }
}

/// The mmap offset ranges of the render images' GEM BOs, by render minor
/// at dump (a damaged render image is refused on its own).
fn gem_ranges(renders: &[RenderFile]) -> GemRanges {
    let images = renders.iter().filter_map(RenderFile::image);
    OffsetIndex::any(images.flat_map(|img| {
        let minor = img.msg.drm_render_minor.unwrap_or(0);
        let bos = img.msg.bo_entries.iter().enumerate();
        bos.map(move |(i, b)| (minor, b.offset, b.size, i))
    }))
}

/// The checks of one decoded KFD image against itself and the other files.
fn check_kfd(
    dir: &Path,
    id: FileId,
    image: &KfdImage,
    ctx: &Context,
    pids_seen: &mut BTreeMap<u32, FileId>,
    depth: Depth,
) -> Result<(), Refusal> {
    let name = kfd_image_name(id);
    let msg = &image.msg;
    check_kfd_pid(&name, msg.pid, ctx)?;
    if msg.criu_rocm_reopen == Some(true) {
        return Ok(());
    }
    if let Some(other) = pids_seen.insert(msg.pid, id) {
        return Err(Refusal::new(
            &name,
            None,
            "pid",
            format!(
                "is {}, as in {}: a process has one KFD process",
                msg.pid,
                kfd_image_name(other)
            ),
        ));
    }
    check_bo_list(&name, image)?;
    check_device_bos(&name, image)?;
    check_priv(&name, image)?;
    privdata::check(dir, &name, image)?;
    for gpu in image.gpu_ids() {
        let depth = match depth {
            Depth::Streamed => Depth::Streamed,
            _ => Depth::Metadata,
        };
        check_pages(dir, id, &name, image, gpu, depth)?;
    }
    // An incremental dump: every link of its chain of parents.
    chain::resolve(dir, &name, image)?;
    check_kfd_mappings(dir, &name, image, ctx)
}

/// The image's process is one of the images' (`pstree.img`).
fn check_kfd_pid(name: &str, pid: u32, ctx: &Context) -> Result<(), Refusal> {
    match &ctx.pids {
        Err(why) => Err(Refusal::new("pstree.img", None, "", why.clone())),
        Ok(Some(p)) if !p.contains(&pid) => Err(Refusal::new(
            name,
            None,
            "pid",
            format!("is {pid}, which is no process of these images (pstree.img)"),
        )),
        _ => Ok(()),
    }
}

/// The process has BOs (RESTORE refuses none), and each one with contents
/// has its hash when the image declares criu-rocm's extension.
fn check_bo_list(name: &str, image: &KfdImage) -> Result<(), Refusal> {
    let msg = &image.msg;
    if msg.bo_entries.is_empty() {
        return Err(Refusal::new(
            name,
            None,
            "bo_entries",
            "holds no GPU buffer, and the kernel's RESTORE refuses a process without \
             buffers (it had opened /dev/kfd but allocated nothing)",
        ));
    }
    let Some(ext) = msg.criu_rocm_ext_version else {
        return Ok(());
    };
    for (i, b) in msg.bo_entries.iter().enumerate() {
        if bo::has_contents(b.alloc_flags) && b.content_xxh3.is_none() {
            return Err(Refusal::new(
                name,
                Some(GpuId(b.gpu_id)),
                format!("bo_entries[{i}].content_xxh3"),
                format!(
                    "missing, though the image declares criu-rocm's extension version \
                     {ext}, which hashes every BO with contents"
                ),
            ));
        }
    }
    Ok(())
}

/// The process' shared mappings of GPU files (`mm-<pid>.img`, `files.img`)
/// against the image, when the directory has CRIU's images.
fn check_kfd_mappings(
    dir: &Path,
    name: &str,
    image: &KfdImage,
    ctx: &Context,
) -> Result<(), Refusal> {
    let pid = image.msg.pid;
    if let Some(e) = &ctx.files_err {
        return Err(Refusal::new("files.img", None, "", e.clone()));
    }
    let Some(files) = &ctx.files else {
        return Ok(());
    };
    match criu_images::shared_file_mappings(dir, pid) {
        Err(e) => Err(Refusal::new(format!("mm-{pid}.img"), None, "", e)),
        Ok(Some(maps)) => check_mappings(name, image, (files, &ctx.gem), &maps, pid),
        Ok(None) => Ok(()),
    }
}

/// KFD gives a process one doorbell and one MMIO remap BO per GPU, the
/// latter one page, and RESTORE refuses others.
fn check_device_bos(name: &str, image: &KfdImage) -> Result<(), Refusal> {
    let mut seen: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for (i, b) in image.msg.bo_entries.iter().enumerate() {
        for (flag, what) in [
            (bo::ALLOC_DOORBELL, "doorbell"),
            (bo::ALLOC_MMIO_REMAP, "MMIO remap"),
        ] {
            if b.alloc_flags & flag == 0 {
                continue;
            }
            if let Some(first) = seen.insert((b.gpu_id, flag), i) {
                return Err(Refusal::new(
                    name,
                    Some(GpuId(b.gpu_id)),
                    format!("bo_entries[{i}].gpu_id"),
                    format!(
                        "gives the GPU a second {what} BO (bo_entries[{first}] is one); KFD \
                         has one per GPU"
                    ),
                ));
            }
            if flag == bo::ALLOC_MMIO_REMAP && b.size != bo::PAGE_SIZE {
                return Err(Refusal::new(
                    name,
                    Some(GpuId(b.gpu_id)),
                    format!("bo_entries[{i}].size"),
                    format!(
                        "is {:#x}, but KFD's MMIO remap BO is one page ({:#x})",
                        b.size,
                        bo::PAGE_SIZE
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The kernel's blob must hold what the image's counts say.
fn check_priv(name: &str, image: &KfdImage) -> Result<(), Refusal> {
    let m = &image.msg;
    let what = || {
        format!(
            "does not hold num_of_gpus {} devices, num_of_bos {} BOs and num_of_objects {} \
             objects",
            m.num_of_gpus, m.num_of_bos, m.num_of_objects
        )
    };
    match m.priv_bo_record_size {
        Some(size) => {
            crate::privdata::walk(
                &m.priv_data,
                m.num_of_gpus,
                m.num_of_bos,
                m.num_of_objects,
                u64::from(size),
            )
            .map_err(|e| {
                Refusal::new(
                    name,
                    None,
                    "priv_data",
                    format!("{} in {size}-byte BO records: {e}", what()),
                )
            })?;
        }
        None => match image.priv_layout() {
            Ok(_) | Err(crate::privdata::PrivError::Ambiguous(_)) => {}
            Err(e) => {
                return Err(Refusal::new(
                    name,
                    None,
                    "priv_data",
                    format!("{}: {e}", what()),
                ))
            }
        },
    }
    Ok(())
}

/// A render-node image `name`: decoded and validated, against the digests
/// file, and the pages file of its GEM BOs as a KFD image's (through
/// [`RenderImage::contents_view`]).
fn check_render(
    dir: &Path,
    render: &RenderFile,
    manifest: Option<&digests::Digests>,
    depth: Depth,
) -> Result<(), Refusal> {
    let name = render.name.as_str();
    let (bytes, image) = render.read.as_ref().map_err(Clone::clone)?;
    let id = render
        .id
        .ok_or_else(|| Refusal::new(name, None, "", "not named amdgpu-renderD-<file id>.img"))?;
    if let Some(m) = manifest {
        m.check_render(id, bytes, image)?;
    }
    if !image.has_gem_bos() {
        return Ok(());
    }
    let view = image.contents_view();
    check_pages(dir, id, name, &view, image.gpu_id(), depth)?;
    // An incremental dump: every link of its chain of parents.
    chain::resolve(dir, name, &view).map(drop)
}

/// One GPU's pages file: its size; at [`Depth::Contents`] every BO's
/// bytes against its hash.  `name` is the image the BOs are of.
fn check_pages(
    dir: &Path,
    id: FileId,
    name: &str,
    image: &KfdImage,
    gpu: GpuId,
    depth: Depth,
) -> Result<(), Refusal> {
    pages_total(name, &image.msg.bo_entries, gpu)?;
    let encoding = Encoding::of(name, &image.msg)?;
    let bos = content_bos(&image.msg.bo_entries, gpu);
    let overlay = match depth {
        Depth::Contents => chain::resolve(dir, name, image)?.remove(&gpu),
        Depth::Metadata => None,
        Depth::Streamed => return Ok(()),
    };
    let pages = PagesReader::open_encoded(dir, id, gpu, &bos, encoding, overlay);
    let mut pages = pages.map_err(|e| {
        let mut r = Refusal::from(e);
        r.gpu = Some(gpu);
        r
    })?;
    let hashes = crate::pages::content_hashes(image);
    if depth != Depth::Contents || hashes.is_empty() {
        return Ok(());
    }
    let file = pages_image_name(id, gpu);
    let mut buf = vec![0u8; 1 << 20];
    let bos = image
        .msg
        .bo_entries
        .iter()
        .enumerate()
        .filter(|(_, b)| b.gpu_id == gpu.0 && bo::has_contents(b.alloc_flags));
    for (i, b) in bos {
        let want = hashes.get(&i);
        let mut h = crate::pages::ExtentHasher::new(want.and_then(|w| w.extent));
        let mut left = b.size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            pages.read_exact(&mut buf[..n]).map_err(|e| {
                // A damaged compressed frame is refused in the words the
                // restore's copy uses (its error is this refusal).
                match e.get_ref().and_then(|i| i.downcast_ref::<FrameError>()) {
                    Some(f) => Refusal::new(&f.file, Some(f.gpu), f.field(), f.reason.clone()),
                    None => Refusal::new(
                        &file,
                        Some(gpu),
                        format!("bo_entries[{i}]"),
                        format!("read: {e}"),
                    ),
                }
            })?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
        let got = h.finish();
        if let Some(w) = want.filter(|w| w.value != got) {
            return Err(Refusal::content_mismatch(
                &file, gpu, i, b.addr, b.size, w.value, got,
            ));
        }
    }
    Ok(())
}

/// The process' own mappings of its GPU buffers (`mm-<pid>.img`, paths
/// from `files.img`) against the image's BOs: a BO the process mapped must
/// be mapped at its address (CPU and GPU share the address of a BO), at
/// the offset of its address; a mapping of a render node must be of a BO.
fn check_mappings(
    name: &str,
    image: &KfdImage,
    (files, gem): (&Files, &GemRanges),
    maps: &[FileMapping],
    pid: u32,
) -> Result<(), Refusal> {
    let check = Mappings {
        name,
        mm: format!("mm-{pid}.img"),
        bos: &image.msg.bo_entries,
        minors: image
            .msg
            .device_entries
            .iter()
            .filter(|d| d.gpu_id != 0)
            .map(|d| (d.drm_render_minor, GpuId(d.gpu_id)))
            .collect(),
    };
    // BO index → (where first mapped, its offset, mapped at its own address).
    let mut seen: BTreeMap<usize, (u64, u64, bool)> = BTreeMap::new();
    let by_offset = bos_by_offset(check.bos);
    for m in maps {
        let Some(path) = files.reg.get(&m.file) else {
            continue;
        };
        let Some(device) = DeviceKind::from_path(path) else {
            continue;
        };
        let gpu = check.gpu_of(device, path, m)?;
        let len = m.end - m.start;
        match by_offset.find(gpu.map(|g| g.0), m.pgoff, len) {
            Some((i, delta)) => {
                let at_home = check.bos[i].addr.checked_add(delta) == Some(m.start);
                let e = seen.entry(i).or_insert((m.start, m.pgoff, false));
                e.2 |= at_home;
            }
            None if in_gem_bo(gem, device, m.pgoff, len) => {}
            None => check.of_no_bo(path, m, gpu)?,
        }
    }
    check.at_home(seen)
}

/// What [`check_mappings`] checks a process' mappings against.
struct Mappings<'a> {
    name: &'a str,
    /// `mm-<pid>.img`, for messages.
    mm: String,
    bos: &'a [crate::proto::KfdBoEntry],
    /// Render minor at dump → GPU.
    minors: BTreeMap<u32, GpuId>,
}

impl Mappings<'_> {
    /// The GPU whose render node `m` maps (`None`: a `/dev/kfd` mapping).
    /// The restore maps a render node only through a BO of the process'
    /// GPUs, found by the node they had at dump.
    fn gpu_of(
        &self,
        device: DeviceKind,
        path: &str,
        m: &FileMapping,
    ) -> Result<Option<GpuId>, Refusal> {
        let DeviceKind::Render(minor) = device else {
            return Ok(None);
        };
        match self.minors.get(&minor.0) {
            Some(&g) => Ok(Some(g)),
            None => Err(Refusal::new(
                self.name,
                None,
                "device_entries",
                format!(
                    "no GPU had render minor {} at dump, but the process maps {path} at {:#x} \
                     ({})",
                    minor.0, m.start, self.mm
                ),
            )),
        }
    }

    /// A mapping of `gpu`'s render node (or of `/dev/kfd`) at an offset no
    /// BO has: refused when it lies in a BO's address range (it must be of
    /// that BO) or maps a render node.
    fn of_no_bo(&self, path: &str, m: &FileMapping, gpu: Option<GpuId>) -> Result<(), Refusal> {
        let len = m.end - m.start;
        // BOs mapped through this device: contents BOs of its GPU through a
        // render node, doorbells and MMIO through /dev/kfd.
        let of_device = |b: &crate::proto::KfdBoEntry| match gpu {
            Some(g) => b.gpu_id == g.0 && bo::has_contents(b.alloc_flags),
            None => bo::needs_vma_fixup(b.alloc_flags) && !bo::has_contents(b.alloc_flags),
        };
        if let Some((i, b)) = self
            .bos
            .iter()
            .enumerate()
            .find(|(_, b)| of_device(b) && m.start >= b.addr && m.start - b.addr < b.size)
        {
            return Err(Refusal::new(
                self.name,
                Some(GpuId(b.gpu_id)),
                format!("bo_entries[{i}].offset"),
                format!(
                    "is {:#x}, but the process maps the BO's address {:#x} at offset {:#x} of \
                     {path} ({})",
                    b.offset, m.start, m.pgoff, self.mm
                ),
            ));
        }
        match gpu {
            Some(g) => Err(Refusal::new(
                self.name,
                Some(g),
                "bo_entries",
                format!(
                    "no BO holds the mapping of {path} at {:#x} (offset {:#x}, {len} bytes) \
                     that {} records",
                    m.start, m.pgoff, self.mm
                ),
            )),
            None => Ok(()),
        }
    }

    /// Each BO mapped is mapped at its own address somewhere.
    fn at_home(&self, seen: BTreeMap<usize, (u64, u64, bool)>) -> Result<(), Refusal> {
        let Some((i, (start, pgoff, _))) = seen.into_iter().find(|(_, (_, _, home))| !home) else {
            return Ok(());
        };
        let b = &self.bos[i];
        Err(Refusal::new(
            self.name,
            Some(GpuId(b.gpu_id)),
            format!("bo_entries[{i}].addr"),
            format!(
                "is {:#x}, but the process maps this BO (offset {pgoff:#x}) at {start:#x} ({}), \
                 not at its address",
                b.addr, self.mm
            ),
        ))
    }
}

/// Whether `len` bytes at `pgoff` of render node `device` are of a GEM BO
/// of the render images (`gem`: offset ranges by minor at dump).
fn in_gem_bo(gem: &GemRanges, device: DeviceKind, pgoff: u64, len: u64) -> bool {
    let DeviceKind::Render(minor) = device else {
        return false;
    };
    gem.find(minor.0, pgoff, len).is_some()
}

/// The BOs a device maps, by their offset in its file: contents BOs of
/// each GPU (through its render node), doorbells and MMIO (through
/// `/dev/kfd`, key `None`), so that a mapping finds its BO in log time.
/// KFD's offsets of one file do not overlap; where an image's do, the
/// index finds one of them that holds the mapping, if any does.
fn bos_by_offset(bos: &[crate::proto::KfdBoEntry]) -> OffsetIndex<Option<u32>> {
    OffsetIndex::any(bos.iter().enumerate().filter_map(|(i, b)| {
        let key = if bo::has_contents(b.alloc_flags) {
            Some(b.gpu_id)
        } else if bo::needs_vma_fixup(b.alloc_flags) {
            None
        } else {
            return None;
        };
        Some((key, b.offset, b.size, i))
    }))
}

#[cfg(test)]
mod tests;
