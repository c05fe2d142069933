//! Incremental dumps: a KFD image whose BOs take unchanged extents from the
//! same BOs of a parent image, found through CRIU's `parent` link (made by
//! `--prev-images-dir`), which may take them from its own parent in turn.
//! A render image's GEM BOs do the same, through its
//! [`RenderImage::contents_view`] (the parent a render image of the same
//! task and render node: [`dump_render_parent`]).
//!
//! The dump ([`dump_parent`], [`parent_digests`]) compares each extent's
//! digest, read while frozen, with the parent's and leaves a hole where
//! they agree; the image lists those extents (`parent_extents`, a bitmap,
//! with `parent_bo` and `criu_rocm_parent`).  Restore and `gpu-check`
//! ([`resolve`]) follow the chain to the image that holds each such
//! extent, checking every link before anything is read: its directory and
//! KFD image exist, the dump that wrote it completed, its KFD image and
//! pages files match its `amdgpu-digests.img`, its BO is the same BO and
//! records the same digest for the extent.  The bytes read from there are
//! then checked against the child's own BO hash as they are copied.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::digests::{self, Digests};
use super::Refusal;
use crate::bo;
use crate::ids::GpuId;
use crate::image::{kfd_image_id, read_whole, render_image_id, FileId, KfdImage, RenderImage};
use crate::incomplete;
use crate::pages::zstd::{check_records, chunks, Chunk};
use crate::pages::{
    content_bos, pages_image_name, pages_total, Encoding, Overlay, Source, CONTENT_EXTENT,
};
use crate::proto::KfdBoEntry;

/// CRIU's link from an image directory to its parent's.
pub const PARENT_LINK: &str = "parent";

/// A BO's extent size and the digest of each extent, as its image records
/// them; `None` when it has no hash or its extents' digests are not kept
/// (images from before incremental dumps hash large BOs in 32 MiB extents
/// and keep only the composed hash).
pub fn extent_digests(b: &KfdBoEntry) -> Option<(u64, Vec<u64>)> {
    let h = b.content_xxh3?;
    match b.content_hash_extent {
        None => Some((b.size, vec![h])),
        Some(e) if !b.content_extent_xxh3.is_empty() => Some((e, b.content_extent_xxh3.clone())),
        Some(_) => None,
    }
}

// Defined with the BO facts, so that the image codec can check them.
pub use crate::bo::{bit, bitmap};

/// The extent an image made now records for a BO of `size` bytes.
pub fn dump_extent(size: u64) -> u64 {
    if size > CONTENT_EXTENT {
        CONTENT_EXTENT
    } else {
        size
    }
}

/// A compressed link's chunks and their records' offsets, per GPU.
type Records = BTreeMap<GpuId, (Vec<Chunk>, Vec<u64>)>;

/// One image of a chain.
struct Link {
    dir: PathBuf,
    /// How messages name the directory ("parent/", "parent/parent/", ...).
    shown: String,
    id: FileId,
    /// The image's file name (a KFD or a render image).
    name: String,
    /// The KFD image, or a render image's contents view.
    image: KfdImage,
    /// Each BO's start in its GPU's pages file (in the uncompressed layout).
    starts: Vec<u64>,
    /// A compressed link: its chunk size, and per GPU its chunks (in the
    /// order of [`chunks`]) and each one's record offset.
    records: Option<(u64, Records)>,
}

impl Link {
    fn refusal(&self, file: &str, gpu: Option<GpuId>, field: String, reason: String) -> Refusal {
        Refusal {
            file: format!("{}{file}", self.shown),
            gpu,
            field,
            reason,
        }
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Each BO's start in its GPU's pages file (past the 8-byte header; BOs
/// without contents take no room).
fn starts(bos: &[KfdBoEntry]) -> Vec<u64> {
    let mut next: BTreeMap<u32, u64> = BTreeMap::new();
    bos.iter()
        .map(|b| {
            let at = next.entry(b.gpu_id).or_insert(8);
            let start = *at;
            if bo::has_contents(b.alloc_flags) {
                *at = at.saturating_add(b.size);
            }
            start
        })
        .collect()
}

/// Reads and checks the image `name` in the parent directory `dir`:
/// the dump that wrote it completed, and its KFD (or render) image and
/// pages files are those its `amdgpu-digests.img` records.
fn load_link(dir: &Path, shown: &str, name: &str) -> Result<Link, Refusal> {
    let at = LinkDir { dir, shown };
    let (id, bytes, image) = at.read_image(name)?;
    at.check_digests(name, id, &bytes, &image)?;
    let encoding = Encoding::of(name, &image.msg).map_err(|e| at.named(name, e.into()))?;
    let mut records = BTreeMap::new();
    for gpu in image.gpu_ids() {
        let total = pages_total(name, &image.msg.bo_entries, gpu)
            .map_err(|e| at.refuse(name, "bo_entries", e.to_string()))?;
        match encoding {
            Encoding::Zstd { chunk, .. } => {
                records.insert(gpu, at.zstd_records(id, &image, gpu, chunk)?);
            }
            Encoding::Raw => at.check_pages_size(name, pages_image_name(id, gpu), total)?,
        }
    }
    let starts = starts(&image.msg.bo_entries);
    Ok(Link {
        dir: dir.to_owned(),
        shown: shown.to_owned(),
        id,
        name: name.to_owned(),
        image,
        starts,
        records: match encoding {
            Encoding::Zstd { chunk, .. } => Some((chunk, records)),
            Encoding::Raw => None,
        },
    })
}

/// A parent directory being read, and how messages name it.
struct LinkDir<'a> {
    dir: &'a Path,
    shown: &'a str,
}

impl LinkDir<'_> {
    fn refuse(&self, file: &str, field: &str, reason: String) -> Refusal {
        Refusal {
            file: format!("{}{file}", self.shown),
            gpu: None,
            field: field.to_owned(),
            reason,
        }
    }

    /// A refusal about `file` of this directory.
    fn named(&self, file: &str, mut x: Refusal) -> Refusal {
        x.file = format!("{}{file}", self.shown);
        x
    }

    /// A refusal naming its file inside this directory.
    fn prefixed(&self, mut x: Refusal) -> Refusal {
        x.file = format!("{}{}", self.shown, x.file);
        x
    }

    /// The directory is there and complete; its KFD image `name` (or
    /// render image: its contents view), read and decoded.
    fn read_image(&self, name: &str) -> Result<(FileId, Vec<u8>, KfdImage), Refusal> {
        if !self.dir.is_dir() {
            return Err(self.refuse(
                "",
                "",
                "missing: the images take unchanged GPU memory from the parent dump there \
                 (--prev-images-dir), which is gone"
                    .into(),
            ));
        }
        incomplete::check(self.dir).map_err(|why| self.refuse(incomplete::MARKER, "", why))?;
        let id = kfd_image_id(name)
            .or_else(|| render_image_id(name))
            .ok_or_else(|| {
                self.refuse(
                    name,
                    "",
                    "is not the name of a KFD or render-node image (criu_rocm_parent of its \
                     child)"
                        .into(),
                )
            })?;
        let bytes =
            read_whole(&self.dir.join(name), None).map_err(|e| self.named(name, e.into()))?;
        let image = match render_image_id(name) {
            Some(_) => RenderImage::decode(name, &bytes).map(|r| r.contents_view()),
            None => KfdImage::decode(name, &bytes),
        };
        let image = image.map_err(|e| self.named(name, e.into()))?;
        Ok((id, bytes, image))
    }

    /// The directory's `amdgpu-digests.img` lists the image and records
    /// it and its pages files as they are.
    fn check_digests(
        &self,
        name: &str,
        id: FileId,
        bytes: &[u8],
        image: &KfdImage,
    ) -> Result<(), Refusal> {
        let manifest = read_whole(&self.dir.join(digests::FILE), None).map_err(|e| {
            self.refuse(
                digests::FILE,
                "",
                format!("{e}: a parent's GPU images must carry their digests"),
            )
        })?;
        let manifest = Digests::parse(&manifest).map_err(|x| self.prefixed(x))?;
        if !manifest.lists(name) {
            return Err(self.refuse(
                digests::FILE,
                "",
                format!("does not list {name}, which the child names as its parent"),
            ));
        }
        let checked = match render_image_id(name) {
            Some(_) => RenderImage::decode(name, bytes)
                .map_err(Refusal::from)
                .and_then(|r| manifest.check_render(id, bytes, &r)),
            None => manifest.check_kfd(self.dir, id, bytes, image),
        };
        checked.map_err(|x| self.prefixed(x))
    }

    /// A compressed pages file of GPU `gpu`: each chunk's record, walked
    /// and bounded as the restore does.
    fn zstd_records(
        &self,
        id: FileId,
        image: &KfdImage,
        gpu: GpuId,
        chunk: u64,
    ) -> Result<(Vec<Chunk>, Vec<u64>), Refusal> {
        let file = pages_image_name(id, gpu);
        let f = File::open(self.dir.join(&file))
            .map_err(|e| self.refuse(&file, "", format!("missing or unreadable: {e}")))?;
        let len = f
            .metadata()
            .map_err(|e| self.refuse(&file, "", format!("fstat: {e}")))?
            .len();
        let bos = content_bos(&image.msg.bo_entries, gpu);
        let shown_file = format!("{}{file}", self.shown);
        let offsets = check_records(&f, &shown_file, &file, &bos, chunk, 8, len).map_err(|e| {
            let mut x = Refusal::from(e);
            if !x.file.starts_with(self.shown) {
                x.file = format!("{}{}", self.shown, x.file);
            }
            x.gpu = Some(gpu);
            x
        })?;
        Ok((chunks(&bos, chunk), offsets))
    }

    /// A plain pages file `file` of the image `name` holds exactly its
    /// BOs' bytes (`total`) after its header.
    fn check_pages_size(&self, name: &str, file: String, total: u64) -> Result<(), Refusal> {
        let len = std::fs::metadata(self.dir.join(&file))
            .map_err(|e| self.refuse(&file, "", format!("missing or unreadable: {e}")))?
            .len();
        if len != total.saturating_add(8) {
            return Err(self.refuse(
                &file,
                "",
                format!(
                    "is {len} bytes, but its BOs in {name} need {}",
                    total.saturating_add(8)
                ),
            ));
        }
        Ok(())
    }
}

/// The parent image of KFD process `pid` for a dump into `dir`, when `dir`
/// has a parent link holding one usable image of that process.  A parent
/// that cannot be used is logged and ignored: the dump then saves all GPU
/// memory.
pub fn dump_parent(dir: &Path, pid: u32) -> Option<(String, KfdImage)> {
    let what = format!("pid {pid}");
    find_parent(dir, &what, |name, bytes| {
        kfd_image_id(name).is_some()
            && KfdImage::decode(name, bytes)
                .is_ok_and(|i| i.msg.pid == pid && i.msg.criu_rocm_reopen != Some(true))
    })
}

/// [`dump_parent`] of the render file of task `pid` (as CRIU names it) on
/// render minor `minor`: the parent's render image of that task and node
/// with GEM BOs of its own (its contents view).  A render file whose BOs
/// are all other files' (a dma-buf of a BO imported on a second open of the
/// node) saves no bytes, so it is no parent and has none.
pub fn dump_render_parent(dir: &Path, pid: u32, minor: u32) -> Option<(String, KfdImage)> {
    let what = format!("pid {pid}, render node renderD{minor}");
    find_parent(dir, &what, |name, bytes| {
        render_image_id(name).is_some()
            && RenderImage::decode(name, bytes).is_ok_and(|r| {
                r.msg.criu_rocm_pid == Some(pid)
                    && r.msg.drm_render_minor == Some(minor)
                    && r.has_own_bos()
            })
    })
}

/// The one image of the parent link of `dir` that `pick` (name, bytes)
/// chooses, loaded and checked; `what` names its owner in the log.
fn find_parent(
    dir: &Path,
    what: &str,
    pick: impl Fn(&str, &[u8]) -> bool,
) -> Option<(String, KfdImage)> {
    let link = dir.join(PARENT_LINK);
    if std::fs::symlink_metadata(&link).is_err() {
        return None;
    }
    let entries = match std::fs::read_dir(&link) {
        Ok(e) => e,
        Err(e) => {
            log::warn!("{}: {e}; the GPU memory is saved whole", link.display());
            return None;
        }
    };
    let found: Vec<String> = entries
        .flatten()
        .filter_map(|ent| ent.file_name().into_string().ok())
        .filter(|name| {
            (kfd_image_id(name).is_some() || render_image_id(name).is_some())
                && read_whole(&link.join(name), None).is_ok_and(|b| pick(name, &b))
        })
        .collect();
    let name = match found.as_slice() {
        [] => {
            log::info!(
                "{what}: the parent images ({}) hold no GPU state of it; its GPU memory is \
                 saved whole",
                link.display()
            );
            return None;
        }
        [one] => one.clone(),
        more => {
            log::warn!(
                "{what}: the parent images ({}) hold {} images of it; its GPU memory is saved \
                 whole",
                link.display(),
                more.len()
            );
            return None;
        }
    };
    match load_link(&link, &format!("{PARENT_LINK}/"), &name) {
        Ok(l) => Some((name, l.image)),
        Err(r) => {
            log::warn!("{what}: not using the parent images: {r}; its GPU memory is saved whole");
            None
        }
    }
}

/// For the content BOs of a dump (`bos`, its image's entries, user
/// gpu_ids), the digests of the same BO in `parent` (same GPU, address,
/// size, flags, GEM handle and extent), and that BO's index there.
pub fn parent_digests(
    bos: &[KfdBoEntry],
    parent: &KfdImage,
) -> (BTreeMap<usize, Vec<u64>>, BTreeMap<usize, u32>) {
    let by_key: BTreeMap<BoKey, usize> = parent
        .msg
        .bo_entries
        .iter()
        .enumerate()
        .filter(|(_, b)| bo::has_contents(b.alloc_flags))
        .map(|(j, b)| (bo_key(b), j))
        .collect();
    let mut digests = BTreeMap::new();
    let mut index = BTreeMap::new();
    for (i, b) in bos.iter().enumerate() {
        if !bo::has_contents(b.alloc_flags) {
            continue;
        }
        let Some(&j) = by_key.get(&bo_key(b)) else {
            continue;
        };
        let Some((e, d)) = extent_digests(&parent.msg.bo_entries[j]) else {
            continue;
        };
        if e != dump_extent(b.size) || d.len() as u64 != b.size.div_ceil(e) {
            continue;
        }
        let Ok(j) = u32::try_from(j) else { continue };
        digests.insert(i, d);
        index.insert(i, j);
    }
    (digests, index)
}

/// What makes a BO of a parent the same BO: GPU, address, size, flags and
/// GEM handle (a render image's; none for KFD's).
type BoKey = (u32, u64, u64, u32, Option<u32>);

fn bo_key(b: &KfdBoEntry) -> BoKey {
    (b.gpu_id, b.addr, b.size, b.alloc_flags, b.handle)
}

/// Whether the image takes any extent from a parent.
pub fn is_incremental(image: &KfdImage) -> bool {
    image.msg.bo_entries.iter().any(|b| {
        b.parent_extents
            .as_ref()
            .is_some_and(|m| m.iter().any(|&x| x != 0))
    })
}

/// Follows the chain of the KFD image `name` of `dir` (or render image:
/// its contents view; already validated itself) for every extent it takes from a parent: per GPU, the ranges of
/// its pages file to read from an ancestor's instead.  Empty for an image
/// that takes nothing.  Refuses, naming the file and field, a parent that
/// is missing, damaged, incomplete, or not the one the image was made
/// against.
///
/// In steps, per BO that takes extents ([`Walk::bo`]): per extent taken,
/// the link that holds it itself ([`Walk::holder`], loading parents as the
/// walk reaches them, [`Walk::next_link`], each BO on the way checked as
/// the same BO with the same digest, [`Walk::same_bo`]), then where its
/// bytes are in that link's pages file ([`Walk::source`]).
pub fn resolve(
    dir: &Path,
    name: &str,
    image: &KfdImage,
) -> Result<BTreeMap<GpuId, Arc<Overlay>>, Refusal> {
    if !is_incremental(image) {
        return Ok(BTreeMap::new());
    }
    let mut walk = Walk::new(dir, name, image);
    for (i, b) in image.msg.bo_entries.iter().enumerate() {
        walk.bo(i, b)?;
    }
    Ok(walk.finish())
}

/// The state of [`resolve`]: the links loaded so far and the overlays
/// built.
struct Walk<'a> {
    dir: &'a Path,
    image: &'a KfdImage,
    child_name: String,
    /// The child's BOs' starts in their pages files.
    child_starts: Vec<u64>,
    /// `links[0]` is the parent, `links[1]` its parent, ...
    links: Vec<Link>,
    /// The directories met, so that a loop of parent links ends.
    seen: BTreeSet<PathBuf>,
    /// Pages files opened, once each.
    files: BTreeMap<PathBuf, Arc<File>>,
    out: BTreeMap<GpuId, Overlay>,
}

/// An extent of a BO of the child, as the walk up the chain looks for it.
#[derive(Clone, Copy)]
struct Extent<'b> {
    /// The child's BO.
    i: usize,
    b: &'b KfdBoEntry,
    gpu: GpuId,
    /// Extent size and index.
    e: u64,
    k: u64,
    /// Its digest in the child.
    want: u64,
}

impl<'a> Walk<'a> {
    fn new(dir: &'a Path, name: &str, image: &'a KfdImage) -> Self {
        let mut seen = BTreeSet::new();
        if let Ok(c) = dir.canonicalize() {
            seen.insert(c);
        }
        Walk {
            dir,
            image,
            child_name: name.to_owned(),
            child_starts: starts(&image.msg.bo_entries),
            links: Vec::new(),
            seen,
            files: BTreeMap::new(),
            out: BTreeMap::new(),
        }
    }

    /// Every extent the child's BO `i` takes from its parent.
    fn bo(&mut self, i: usize, b: &KfdBoEntry) -> Result<(), Refusal> {
        let Some(map) = b.parent_extents.as_deref() else {
            return Ok(());
        };
        let gpu = GpuId(b.gpu_id);
        let child = self.child_name.clone();
        let missing = |field: &str| {
            Refusal::new(
                &child,
                Some(gpu),
                format!("bo_entries[{i}].{field}"),
                "missing, though parent_extents takes extents from the parent",
            )
        };
        let (e, mine) = extent_digests(b).ok_or_else(|| missing("content_extent_xxh3"))?;
        let n = b.size.div_ceil(e);
        for k in (0..n).filter(|&k| bit(map, k)) {
            let first = b.parent_bo.ok_or_else(|| missing("parent_bo"))? as usize;
            let x = Extent {
                i,
                b,
                gpu,
                e,
                k,
                want: mine[k as usize],
            };
            let (depth, j) = self.holder(x, first)?;
            let source = self.source(x, depth, j)?;
            let off = k * e;
            let len = e.min(b.size - off);
            self.out
                .entry(gpu)
                .or_default()
                .push_source(self.child_starts[i] + off, len, source);
        }
        Ok(())
    }

    /// The link (depth in the chain) and BO that hold extent `x` itself,
    /// walking up from the parent's BO `j`.
    fn holder(&mut self, x: Extent<'_>, mut j: usize) -> Result<(usize, usize), Refusal> {
        let mut depth = 0;
        loop {
            if depth == self.links.len() {
                self.next_link()?;
            }
            let pb = self.same_bo(x, depth, j)?;
            if !pb.parent_extents.as_deref().is_some_and(|m| bit(m, x.k)) {
                return Ok((depth, j));
            }
            let l = &self.links[depth];
            j = pb.parent_bo.ok_or_else(|| {
                l.refusal(
                    &l.name(),
                    Some(x.gpu),
                    format!("bo_entries[{j}].parent_bo"),
                    "missing, though parent_extents takes extents from the parent".into(),
                )
            })? as usize;
            depth += 1;
        }
    }

    /// Loads the parent of the last link loaded (of the child at first).
    fn next_link(&mut self) -> Result<(), Refusal> {
        let (from_dir, from_shown, from_name, from_image) = match self.links.last() {
            None => (
                self.dir.to_owned(),
                String::new(),
                self.child_name.clone(),
                self.image,
            ),
            Some(l) => (l.dir.clone(), l.shown.clone(), l.name(), &l.image),
        };
        let Some(pname) = from_image.msg.criu_rocm_parent.clone() else {
            return Err(Refusal {
                file: format!("{from_shown}{from_name}"),
                gpu: None,
                field: "criu_rocm_parent".into(),
                reason: "missing, though its BOs take extents from a parent".into(),
            });
        };
        let pdir = from_dir.join(PARENT_LINK);
        let shown = format!("{from_shown}{PARENT_LINK}/");
        // No bound on the chain's length (a dump can have any number of
        // parents): every link is a directory not met before, and one that
        // does not resolve fails to load.
        if let Ok(c) = pdir.canonicalize() {
            if !self.seen.insert(c) {
                return Err(Refusal {
                    file: shown,
                    gpu: None,
                    field: String::new(),
                    reason: "the chain of parent links loops".into(),
                });
            }
        }
        let link = load_link(&pdir, &shown, &pname)?;
        self.links.push(link);
        Ok(())
    }

    /// BO `j` of the link at `depth`: the same BO as the child's, with the
    /// same digest for the extent.
    fn same_bo(&self, x: Extent<'_>, depth: usize, j: usize) -> Result<&KfdBoEntry, Refusal> {
        let (i, b, gpu, k, child_name) = (x.i, x.b, x.gpu, x.k, &self.child_name);
        let links = &self.links;
        let l = &links[depth];
        let pb = l.image.msg.bo_entries.get(j).ok_or_else(|| {
            let (file, field) = match depth {
                0 => (child_name.clone(), format!("bo_entries[{i}].parent_bo")),
                _ => (
                    format!("{}{}", links[depth - 1].shown, links[depth - 1].name()),
                    "parent_bo".to_owned(),
                ),
            };
            Refusal {
                file,
                gpu: Some(gpu),
                field,
                reason: format!("is {j}, but {}{} has no such BO", l.shown, l.name()),
            }
        })?;
        let same = bo_key(pb) == bo_key(b) && bo::has_contents(pb.alloc_flags);
        if !same {
            return Err(l.refusal(
                &l.name(),
                Some(gpu),
                format!("bo_entries[{j}]"),
                format!(
                    "is not the BO of {child_name} bo_entries[{i}] (GPU {}, address {:#x}, \
                     {} bytes) that takes extents from it: the parent is not the dump \
                     these images were made against",
                    gpu, b.addr, b.size
                ),
            ));
        }
        let theirs = extent_digests(pb).filter(|(pe, _)| *pe == x.e);
        let got = theirs
            .as_ref()
            .and_then(|(_, d)| d.get(k as usize).copied());
        if got != Some(x.want) {
            return Err(l.refusal(
                &l.name(),
                Some(gpu),
                format!("bo_entries[{j}].content_extent_xxh3[{k}]"),
                format!(
                    "{}, but {child_name} bo_entries[{i}] takes that extent from there \
                     with digest {:016x}: the parent is not the dump these images \
                     were made against",
                    match got {
                        Some(g) => format!("is {g:016x}"),
                        None => "is missing".into(),
                    },
                    x.want
                ),
            ));
        }
        Ok(pb)
    }

    /// Where extent `x`'s bytes are in the pages file of the link at
    /// `depth`, whose BO `j` holds it.
    fn source(&mut self, x: Extent<'_>, depth: usize, j: usize) -> Result<Source, Refusal> {
        let (gpu, k) = (x.gpu, x.k);
        let l = &self.links[depth];
        let path = l.dir.join(pages_image_name(l.id, gpu));
        let src = match self.files.get(&path) {
            Some(f) => f.clone(),
            None => {
                let f = File::open(&path).map_err(|err| {
                    l.refusal(
                        &pages_image_name(l.id, gpu),
                        Some(gpu),
                        String::new(),
                        format!("open: {err}"),
                    )
                })?;
                let f = Arc::new(f);
                self.files.insert(path, f.clone());
                f
            }
        };
        let off = k * x.e;
        let len = x.e.min(x.b.size - off);
        let Some((chunk, records)) = &l.records else {
            return Ok(Source::Raw {
                file: src,
                at: l.starts[j] + off,
            });
        };
        // The chunk of BO j holding the extent: chunks run over the GPU's
        // content BOs in bucket order.
        let found = records.get(&gpu).and_then(|(all, offsets)| {
            let at = all.partition_point(|c| (c.bo, c.start) <= (j, off));
            let at = at.checked_sub(1)?;
            let c = all[at];
            (c.bo == j && off < c.start + c.len).then(|| (c, offsets[at]))
        });
        let Some((c, record)) = found else {
            return Err(l.refusal(
                &pages_image_name(l.id, gpu),
                Some(gpu),
                format!("bo_entries[{j}]"),
                format!("has no compressed chunk holding bytes {off:#x}.."),
            ));
        };
        if off + len > c.start + c.len {
            return Err(l.refusal(
                &pages_image_name(l.id, gpu),
                Some(gpu),
                format!("bo_entries[{j}]"),
                format!(
                    "its extent {k} spans two compressed chunks of {chunk} \
                     bytes, which criu-rocm does not read"
                ),
            ));
        }
        Ok(Source::Frame {
            file: src,
            name: format!("{}{}", l.shown, pages_image_name(l.id, gpu)),
            gpu,
            record,
            chunk: c,
            skip: off - c.start,
        })
    }

    fn finish(self) -> BTreeMap<GpuId, Arc<Overlay>> {
        self.out
            .into_iter()
            .map(|(g, mut o)| {
                o.finish();
                (g, Arc::new(o))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::tempdir;
    use crate::pages::ExtentHasher;
    use crate::proto::{CriuRenderNode, DrmBoEntry, DrmVmEntry};

    const GPU: u32 = 0x1a2b;
    const SIZE: u64 = 3 * CONTENT_EXTENT;

    /// A render image of task 42 on renderD128 whose GEM BO (handle
    /// `handle`, 6 MiB of GTT) holds `bytes`, written into `dir` as file
    /// `id` with its pages file and digests; `parent`: the extents it
    /// leaves to the parent's image `name` (holes in its pages file).
    fn write_render(
        dir: &Path,
        id: FileId,
        handle: u32,
        bytes: &[u8],
        parent: Option<(&[u64], &str)>,
    ) -> RenderImage {
        let mut h = ExtentHasher::new(Some(CONTENT_EXTENT));
        h.update(bytes);
        let digests = h.digests();
        let mut b = DrmBoEntry {
            size: SIZE,
            offset: 0x10_0000,
            alignment: 1,
            preferred_domains: kfd_abi::sys::AMDGPU_GEM_DOMAIN_GTT,
            handle,
            num_of_vms: 1,
            vm_entries: vec![DrmVmEntry {
                addr: 0x4000_0000,
                size: SIZE,
                offset: 0,
                flags: 0,
            }],
            content_xxh3: Some(crate::bo::compose(&digests)),
            content_hash_extent: Some(CONTENT_EXTENT),
            content_extent_xxh3: digests,
            ..Default::default()
        };
        let mut msg = CriuRenderNode {
            gpu_id: GPU,
            drm_render_minor: Some(128),
            num_of_bos: Some(1),
            criu_rocm_pid: Some(42),
            ..Default::default()
        };
        let mut pages = SIZE.to_le_bytes().to_vec();
        pages.extend_from_slice(bytes);
        if let Some((kept, name)) = parent {
            b.parent_extents = Some(bitmap(kept));
            b.parent_bo = Some(0);
            msg.criu_rocm_parent = Some(name.to_owned());
            for &k in kept {
                let at = (8 + k * CONTENT_EXTENT) as usize;
                pages[at..at + CONTENT_EXTENT as usize].fill(0);
            }
        }
        msg.bo_entries = vec![b];
        let img = RenderImage::decode(
            "t",
            &crate::image::frame(&prost::Message::encode_to_vec(&msg)),
        )
        .unwrap();
        img.write(dir, id).unwrap();
        std::fs::write(dir.join(pages_image_name(id, GpuId(GPU))), pages).unwrap();
        let mut d = Digests::default();
        d.add_render_in(dir, id, &img);
        std::fs::write(dir.join(digests::FILE), d.encode()).unwrap();
        img
    }

    /// A render image's GEM BO takes extents 0 and 2 from its parent's
    /// render image (found by task and render minor), and restore follows
    /// that chain; a parent whose BO has another handle, or another
    /// digest for a taken extent, is refused naming the parent's field.
    #[test]
    fn a_render_image_takes_extents_from_its_parents() {
        let root = tempdir();
        let (pdir, dir) = (root.join("pre"), root.join("img"));
        std::fs::create_dir_all(&pdir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("../pre", dir.join(PARENT_LINK)).unwrap();
        let pid_ = FileId(1 << 30);
        let pname = crate::image::render_image_name(pid_);
        let mut bytes: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8 | 1).collect();
        write_render(&pdir, pid_, 5, &bytes, None);
        let (found, view) = dump_render_parent(&dir, 42, 128).expect("the parent's render image");
        assert_eq!(found, pname);
        assert!(dump_render_parent(&dir, 43, 128).is_none(), "another task");
        assert!(dump_render_parent(&dir, 42, 129).is_none(), "another node");
        // A second render file of the task and node whose BO is the first's
        // (a dma-buf imported on a second open) is no parent.
        let mut second = RenderImage::read(&pdir, pid_).unwrap();
        second.msg.bo_entries[0].same_bo_file = Some(pid_.0);
        second.msg.bo_entries[0].same_bo_index = Some(0);
        second.write(&pdir, FileId(pid_.0 + 1)).unwrap();
        let (again, _) = dump_render_parent(&dir, 42, 128).expect("the render image with bytes");
        assert_eq!(again, pname);
        bytes[CONTENT_EXTENT as usize + 9] ^= 0xff;
        let child = write_render(&dir, FileId(6), 5, &bytes, Some((&[0, 2], &pname)));
        let (d, j) = parent_digests(&child.contents_view().msg.bo_entries, &view);
        assert_eq!(j, BTreeMap::from([(0, 0)]));
        assert_eq!(d[&0][0], child.msg.bo_entries[0].content_extent_xxh3[0]);
        let name = crate::image::render_image_name(FileId(6));
        let overlays = resolve(&dir, &name, &child.contents_view()).unwrap();
        assert!(overlays.contains_key(&GpuId(GPU)), "{overlays:?}");
        // The parent's BO with another handle: another BO.
        write_render(&pdir, pid_, 7, &bytes, None);
        let r = resolve(&dir, &name, &child.contents_view()).unwrap_err();
        assert_eq!(r.file, format!("parent/{pname}"), "{r}");
        assert!(r.reason.contains("is not the BO of"), "{r}");
        // The same BO with other bytes in a taken extent.
        bytes[9] ^= 0xff;
        write_render(&pdir, pid_, 5, &bytes, None);
        let r = resolve(&dir, &name, &child.contents_view()).unwrap_err();
        assert_eq!(r.field, "bo_entries[0].content_extent_xxh3[0]", "{r}");
    }
}
