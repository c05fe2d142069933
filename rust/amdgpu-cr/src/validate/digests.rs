//! `amdgpu-digests.img`: the size and XXH3-64 of every GPU image file a
//! dump wrote, so that the restore and `gpu-check` find any change to them
//! before the first KFD call (see Documentation/image-format.md).
//!
//! A file of its own, not fields in the images: a KFD image cannot hold its
//! own digest, upstream CRIU ignores files it does not know (and its
//! decoder, optional fields it does not know, so both would do), and one
//! list also tells which files the dump wrote, so a deleted, added or
//! swapped file is named.  Text, one line per file, so that it can be read
//! and checked by hand:
//!
//! ```text
//! criu-rocm GPU image digests 1
//! amdgpu-kfd-5.img 12714 xxh3:8c1f0e3a5b7d9f21
//! amdgpu-pages-5-1e8f.img 33628168 xxh3-bo:0123456789abcdef
//! amdgpu-renderD-6.img 18 xxh3:00ff00ff00ff00ff
//! ```
//!
//! `xxh3:` is the XXH3-64 of the whole file.  A pages file holds GB of BO
//! contents, whose every byte the KFD image's per-BO `content_xxh3` covers
//! already; its `xxh3-bo:` is the XXH3-64 of its 8-byte header followed by
//! those hashes (little endian, bucket order), which ties the file's size
//! and contents to its KFD image without reading it twice at restore.  The
//! restore checks the bytes against the BO hashes as it copies them, before
//! any task runs; `gpu-check` reads them all up front.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64;

use super::Refusal;
use crate::bo;
use crate::ids::GpuId;
use crate::image::{kfd_image_name, render_image_name, FileId, KfdImage, RenderImage};
use crate::pages::{pages_image_name, pages_total};
use crate::proto::KfdBoEntry;

/// Whether the image's pages files are compressed (any value but none:
/// an unknown one is refused by the image's validation).
fn compressed(image: &KfdImage) -> bool {
    image.msg.pages_compression.unwrap_or(0) != 0
}

/// The file's name in the image directory.
pub const FILE: &str = "amdgpu-digests.img";
/// Its first line.
const HEADER: &str = "criu-rocm GPU image digests 1";

/// Whether `name` is a GPU image file that the digests cover.
pub fn is_gpu_image(name: &str) -> bool {
    name.ends_with(".img")
        && [
            "amdgpu-kfd-",
            "amdgpu-renderD-",
            "amdgpu-pages-",
            "amdgpu-dmabuf_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

/// What is recorded of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// XXH3-64 of the whole file.
    Whole(u64),
    /// A pages file: XXH3-64 of its header and its BOs' hashes.
    Bo(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub digest: Digest,
}

/// The digests of a dump's GPU image files, by file name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub files: BTreeMap<String, Entry>,
}

/// The `xxh3-bo` digest of the pages file of `gpu`: its header (the Σ of
/// the sizes of the GPU's BOs with contents) and those BOs' hashes.
pub fn pages_digest(bos: &[KfdBoEntry], gpu: GpuId) -> u64 {
    let mut total: u64 = 0;
    let mut hashes = Vec::new();
    for b in bos
        .iter()
        .filter(|b| b.gpu_id == gpu.0 && bo::has_contents(b.alloc_flags))
    {
        total = total.wrapping_add(b.size);
        hashes.extend_from_slice(&b.content_xxh3.unwrap_or(0).to_le_bytes());
    }
    let mut bytes = total.to_le_bytes().to_vec();
    bytes.extend_from_slice(&hashes);
    xxh3_64(&bytes)
}

impl Digests {
    /// Records a file written whole from `bytes`.
    pub fn add_whole(&mut self, name: String, bytes: &[u8]) {
        self.files.insert(
            name,
            Entry {
                size: bytes.len() as u64,
                digest: Digest::Whole(xxh3_64(bytes)),
            },
        );
    }

    /// Records KFD image `id` (its encoded bytes) and its pages files, as
    /// [`Digests::add_kfd`], with the sizes of compressed pages files as
    /// written in `dir` (those of upstream's layout follow from the image).
    pub fn add_kfd_in(&mut self, dir: &Path, id: FileId, image: &KfdImage) {
        self.add_whole(kfd_image_name(id), &image.encode());
        if image.msg.criu_rocm_reopen != Some(true) {
            self.add_pages_in(dir, id, image);
        }
    }

    /// Records render image `id` and, when its file held GEM BOs, their
    /// pages file (as a KFD image's, through [`RenderImage::contents_view`]).
    pub fn add_render_in(&mut self, dir: &Path, id: FileId, image: &RenderImage) {
        self.add_whole(render_image_name(id), &image.encode());
        if image.has_gem_bos() {
            self.add_pages_in(dir, id, &image.contents_view());
        }
    }

    /// [`Self::add_pages`], with the sizes of compressed pages files as
    /// written in `dir`.
    fn add_pages_in(&mut self, dir: &Path, id: FileId, image: &KfdImage) {
        self.add_pages(id, image);
        if !compressed(image) {
            return;
        }
        let streamer = crate::stream::active();
        for gpu in image.gpu_ids() {
            let name = pages_image_name(id, gpu);
            let size = match &streamer {
                Some(s) => s.sent(&name).unwrap_or(0),
                None => std::fs::metadata(dir.join(&name)).map_or(0, |m| m.len()),
            };
            if let Some(e) = self.files.get_mut(&name) {
                e.size = size;
            }
        }
    }

    /// Records KFD image `id` (its encoded bytes) and its pages files.
    pub fn add_kfd(&mut self, id: FileId, image: &KfdImage) {
        self.add_whole(kfd_image_name(id), &image.encode());
        if image.msg.criu_rocm_reopen != Some(true) {
            self.add_pages(id, image);
        }
    }

    /// Records the pages files of `image`'s GPUs.
    fn add_pages(&mut self, id: FileId, image: &KfdImage) {
        for gpu in image.gpu_ids() {
            let total = pages_total("", &image.msg.bo_entries, gpu).unwrap_or(0);
            self.files.insert(
                pages_image_name(id, gpu),
                Entry {
                    size: total.saturating_add(8),
                    digest: Digest::Bo(pages_digest(&image.msg.bo_entries, gpu)),
                },
            );
        }
    }

    /// The files listed that are no pages file, with their sizes: what a
    /// streamed restore fetches before anything else.
    pub fn metadata_files(&self) -> impl Iterator<Item = (&str, u64)> {
        self.files
            .iter()
            .filter(|(_, e)| matches!(e.digest, Digest::Whole(_)))
            .map(|(n, e)| (n.as_str(), e.size))
    }

    pub fn lists(&self, name: &str) -> bool {
        self.files.contains_key(name)
    }

    /// The file's contents.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("{HEADER}\n");
        for (name, e) in &self.files {
            let (kind, v) = match e.digest {
                Digest::Whole(v) => ("xxh3", v),
                Digest::Bo(v) => ("xxh3-bo", v),
            };
            s.push_str(&format!("{name} {} {kind}:{v:016x}\n", e.size));
        }
        s.into_bytes()
    }

    /// Parses the file's contents; a refusal names the line at fault.
    pub fn parse(bytes: &[u8]) -> Result<Self, Refusal> {
        let bad = |line: usize, why: String| Refusal::new(FILE, None, format!("line {line}"), why);
        let text = std::str::from_utf8(bytes)
            .map_err(|e| Refusal::new(FILE, None, "", format!("not text: {e}")))?;
        let mut lines = text.split_inclusive('\n').enumerate();
        match lines.next() {
            Some((_, l)) if l == format!("{HEADER}\n") => {}
            _ => return Err(bad(1, format!("is not \"{HEADER}\""))),
        }
        let mut out = Digests::default();
        for (i, line) in lines {
            let n = i + 1;
            let Some(line) = line.strip_suffix('\n') else {
                return Err(bad(n, "is not terminated (the file is truncated)".into()));
            };
            let parts: Vec<&str> = line.split(' ').collect();
            let [name, size, digest] = parts.as_slice() else {
                return Err(bad(n, "is not \"NAME SIZE KIND:DIGEST\"".into()));
            };
            if !is_gpu_image(name) || name.contains('/') {
                return Err(bad(n, format!("names {name:?}, no GPU image file")));
            }
            let size: u64 = size
                .parse()
                .map_err(|_| bad(n, format!("size {size:?} is not a number")))?;
            let hex = |v: &str| {
                (v.len() == 16)
                    .then(|| u64::from_str_radix(v, 16).ok())
                    .flatten()
                    .ok_or_else(|| bad(n, format!("digest {v:?} is not 16 hex digits")))
            };
            let digest = if let Some(v) = digest.strip_prefix("xxh3:") {
                Digest::Whole(hex(v)?)
            } else if let Some(v) = digest.strip_prefix("xxh3-bo:") {
                Digest::Bo(hex(v)?)
            } else {
                return Err(bad(n, format!("digest {digest:?} is of no known kind")));
            };
            if out
                .files
                .insert((*name).to_owned(), Entry { size, digest })
                .is_some()
            {
                return Err(bad(n, format!("lists {name} a second time")));
            }
        }
        Ok(out)
    }

    /// A file read whole (`bytes`) against its record, if it has one.
    pub fn check_whole(&self, name: &str, bytes: &[u8]) -> Result<(), Refusal> {
        let Some(e) = self.files.get(name) else {
            return Ok(());
        };
        let changed = |got: String, want: String| {
            Refusal::new(
                name,
                None,
                "",
                format!("{got}, but {FILE} recorded {want} at dump: the file was changed"),
            )
        };
        if e.size != bytes.len() as u64 {
            return Err(changed(
                format!("is {} bytes", bytes.len()),
                e.size.to_string(),
            ));
        }
        match e.digest {
            Digest::Whole(want) => {
                let got = xxh3_64(bytes);
                if got != want {
                    return Err(changed(
                        format!("hashes to xxh3:{got:016x}"),
                        format!("xxh3:{want:016x}"),
                    ));
                }
            }
            Digest::Bo(want) => {
                return Err(changed(
                    "is a whole file".into(),
                    format!("a pages digest (xxh3-bo:{want:016x})"),
                ));
            }
        }
        Ok(())
    }

    /// KFD image `id` (read as `bytes`, decoded as `image`) and its pages
    /// files against their records.
    pub fn check_kfd(
        &self,
        _dir: &Path,
        id: FileId,
        bytes: &[u8],
        image: &KfdImage,
    ) -> Result<(), Refusal> {
        self.check_whole(&kfd_image_name(id), bytes)?;
        if image.msg.criu_rocm_reopen == Some(true) {
            return Ok(());
        }
        self.check_pages(id, &kfd_image_name(id), image)
    }

    /// Render image `id` (read as `bytes`, decoded as `image`) and the
    /// pages file of its GEM BOs against their records.
    pub fn check_render(
        &self,
        id: FileId,
        bytes: &[u8],
        image: &RenderImage,
    ) -> Result<(), Refusal> {
        let name = render_image_name(id);
        self.check_whole(&name, bytes)?;
        if !image.has_gem_bos() {
            return Ok(());
        }
        self.check_pages(id, &name, &image.contents_view())
    }

    /// The pages files of `image` (named `of` in messages) against their
    /// records.
    fn check_pages(&self, id: FileId, of: &str, image: &KfdImage) -> Result<(), Refusal> {
        for gpu in image.gpu_ids() {
            let name = pages_image_name(id, gpu);
            let Some(e) = self.files.get(&name) else {
                continue;
            };
            let total = pages_total(&name, &image.msg.bo_entries, gpu)?;
            let got = pages_digest(&image.msg.bo_entries, gpu);
            // A compressed file's size is its own (checked against the
            // directory by `check_listing`); upstream's layout, the total's.
            let size = if compressed(image) {
                e.size
            } else {
                total.saturating_add(8)
            };
            let ok = match e.digest {
                Digest::Bo(want) => want == got && e.size == size,
                Digest::Whole(_) => false,
            };
            if !ok {
                return Err(Refusal::new(
                    &name,
                    Some(gpu),
                    "",
                    format!(
                        "its size and BO hashes in {of} give xxh3-bo:{got:016x} and {} bytes, \
                         but {FILE} recorded {} at dump: the file was changed",
                        size,
                        match e.digest {
                            Digest::Bo(v) => format!("xxh3-bo:{v:016x} and {} bytes", e.size),
                            Digest::Whole(v) => format!("xxh3:{v:016x}"),
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The directory's GPU image files (`present`) against the list: every
    /// file listed is there (pages files with their size), no other is.
    /// `streamed`: the pages files are not in `dir` but in the image
    /// streamer's stream (checked as they are read).
    pub fn check_listing(
        &self,
        dir: &Path,
        present: &BTreeSet<String>,
        streamed: bool,
    ) -> Vec<Refusal> {
        let mut out = Vec::new();
        for (name, e) in &self.files {
            if streamed && matches!(e.digest, Digest::Bo(_)) {
                continue;
            }
            if !present.contains(name) {
                out.push(Refusal::new(
                    name,
                    None,
                    "",
                    format!(
                        "missing: {FILE} records it ({} bytes) from the dump, but the \
                         directory has no such file",
                        e.size
                    ),
                ));
                continue;
            }
            if let Digest::Bo(_) = e.digest {
                match std::fs::metadata(dir.join(name)) {
                    Ok(m) if m.len() == e.size => {}
                    Ok(m) => out.push(Refusal::new(
                        name,
                        None,
                        "",
                        format!(
                            "is {} bytes, not the {} that {FILE} recorded at dump",
                            m.len(),
                            e.size
                        ),
                    )),
                    Err(err) => out.push(Refusal::new(name, None, "", format!("stat: {err}"))),
                }
            }
        }
        for name in present {
            if !self.files.contains_key(name) {
                out.push(Refusal::new(
                    name,
                    None,
                    "",
                    format!("not written by the dump: {FILE} does not list it"),
                ));
            }
        }
        out
    }
}
