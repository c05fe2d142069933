//! The GPU image files: names, the 8-byte size framing, and bounded and
//! validated decoding of the protobuf files.
//!
//! Layout (see Documentation/image-format.md):
//! * `amdgpu-kfd-<id>.img`: `u64 LE size` + `criu_kfd` message of that size;
//! * `amdgpu-renderD-<id>.img`: `u64 LE size` + `criu_render_node` message;
//! * `amdgpu-pages-<id>-<gpu_id %04x>.img`: the BO contents, see
//!   [`crate::pages`] (which owns that file's format).
//!
//! Everything read from an image is untrusted: sizes are checked against the
//! file length and a cap before anything is allocated, and the decoded
//! messages are checked for internal consistency before use.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use prost::Message;

use crate::bo;
use crate::ids::GpuId;
use crate::proto::{CriuDmabufNode, CriuKfd, CriuRenderNode, DrmBoEntry};

/// Version of our optional extensions written in `criu_kfd`
/// (`criu_rocm_ext_version`).  1 = per-BO `content_xxh3`; 2 = and
/// `content_hash_extent` on BOs hashed in extents; 3 = and the dump wrote
/// the digests of its GPU image files ([`crate::validate::digests`]); 4 =
/// and `pages_compression` when the pages files are compressed
/// ([`crate::pages::zstd`]); 5 = and 2 MiB extents with each extent's
/// digest (`content_extent_xxh3`), and a dump with `--prev-images-dir` may
/// leave unchanged extents to its parent (`parent_extents`,
/// [`crate::validate::chain`]); 6 = and compressed pages files record their
/// chunk size (`pages_compression_chunk`, 2 MiB: a chunk is an extent), so
/// compressed dumps can be incremental and parents.
pub const EXT_VERSION: u32 = 6;

/// CRIU's id of a dumped file (the `id` of its `files.img` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId(pub u32);

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Upstream prints the id with `%d` of an int; do the same so that
        // file names agree for every id value.
        write!(f, "{}", self.0 as i32)
    }
}

impl FileId {
    /// The id that `s` spells as upstream prints it (`%d` of an int), or
    /// `None` when no id prints as exactly `s` ("+3", "03", "-0" and
    /// numbers outside i32 spell none), so that reading a directory finds
    /// exactly the files that writing names.
    pub fn parse(s: &str) -> Option<FileId> {
        let id = FileId(s.parse::<i32>().ok()? as u32);
        (id.to_string() == s).then_some(id)
    }
}

/// The file id in `name` between `prefix` and `.img`, as the image
/// name functions below write it; `None` for any other name.
fn image_id(name: &str, prefix: &str) -> Option<FileId> {
    name.strip_prefix(prefix)
        .and_then(|n| n.strip_suffix(".img"))
        .and_then(FileId::parse)
}

/// Name of the KFD image of file `id`.
pub fn kfd_image_name(id: FileId) -> String {
    format!("amdgpu-kfd-{id}.img")
}

/// The file id of a KFD image's name (`amdgpu-kfd-<id>.img`, as
/// [`kfd_image_name`] writes it), `None` for any other name.
pub fn kfd_image_id(name: &str) -> Option<FileId> {
    image_id(name, "amdgpu-kfd-")
}

/// Name of the render-node image of file `id`.
pub fn render_image_name(id: FileId) -> String {
    format!("amdgpu-renderD-{id}.img")
}

/// The file id of a render-node image's name, `None` for any other name.
pub fn render_image_id(name: &str) -> Option<FileId> {
    image_id(name, "amdgpu-renderD-")
}

/// Name of the dma-buf image of file `id` (criu-dev's name).
pub fn dmabuf_image_name(id: FileId) -> String {
    format!("amdgpu-dmabuf_{id}.img")
}

/// The file id of a dma-buf image's name, `None` for any other name.
pub fn dmabuf_image_id(name: &str) -> Option<FileId> {
    image_id(name, "amdgpu-dmabuf_")
}

/// Errors reading or writing GPU images.  Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{file}: {op}: {source}")]
    Io {
        file: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{file}: {field} is {size} bytes, more than the limit of {limit}")]
    TooLarge {
        file: String,
        field: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{file}: truncated: {field} needs {expected} bytes, only {got} present")]
    Truncated {
        file: String,
        field: &'static str,
        expected: u64,
        got: u64,
    },
    #[error("{file}: {extra} unexpected bytes after {field}")]
    TrailingData {
        file: String,
        field: &'static str,
        extra: u64,
    },
    #[error("{file}: cannot decode {message}: {source}")]
    Decode {
        file: String,
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{file}: {field}: {reason}")]
    Invalid {
        file: String,
        field: String,
        reason: String,
    },
    #[error("{file}: header says {header} bytes of BO contents but the image's BOs for GPU {gpu} add up to {expected}")]
    PagesSizeMismatch {
        file: String,
        gpu: GpuId,
        header: u64,
        expected: u64,
    },
}

impl ImageError {
    pub(crate) fn invalid(file: &str, field: impl Into<String>, reason: impl Into<String>) -> Self {
        ImageError::Invalid {
            file: file.to_owned(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(file: &str, op: &'static str, source: io::Error) -> Self {
        ImageError::Io {
            file: file.to_owned(),
            op,
            source,
        }
    }

    /// The sum of the sizes of `gpu`'s content BOs overflows at bucket `i`.
    pub(crate) fn sizes_overflow(file: &str, i: usize, gpu: GpuId) -> Self {
        ImageError::invalid(
            file,
            format!("bo_entries[{i}].size"),
            format!("sum of BO sizes of GPU {gpu} overflows"),
        )
    }

    /// The OS error number behind this error, if any (for the C boundary).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            ImageError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Prefixes `payload` with its size (u64 little endian).
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Splits a whole framed file into its payload, checking the size word
/// against the data present and for trailing garbage.  No other bound: the
/// file was read whole at its size ([`read_whole`]), and a payload can
/// only be what the file holds.
pub fn unframe<'a>(
    file: &str,
    field: &'static str,
    bytes: &'a [u8],
) -> Result<&'a [u8], ImageError> {
    let Some((head, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(ImageError::Truncated {
            file: file.to_owned(),
            field: "size header",
            expected: 8,
            got: bytes.len() as u64,
        });
    };
    let size = u64::from_le_bytes(*head);
    let present = rest.len() as u64;
    if size > present {
        return Err(ImageError::Truncated {
            file: file.to_owned(),
            field,
            expected: size,
            got: present,
        });
    }
    if size < present {
        return Err(ImageError::TrailingData {
            file: file.to_owned(),
            field,
            extra: present - size,
        });
    }
    Ok(rest)
}

/// Decodes the framed protobuf message `M` of image `file` (`bytes` =
/// whole file): its size word, then the message named `message`.
fn decode_framed<M: prost::Message + Default>(
    file: &str,
    message: &'static str,
    field: &'static str,
    bytes: &[u8],
) -> Result<M, ImageError> {
    M::decode(unframe(file, field, bytes)?).map_err(|source| ImageError::Decode {
        file: file.to_owned(),
        message,
        source,
    })
}

/// Reads a whole image file, allocating its size as `fstat` reports it
/// and reading no more (a file that grows meanwhile is cut there, and its
/// decoding finds it short).  `cap`: a larger file is refused before
/// anything is read.
pub fn read_whole(path: &Path, cap: Option<u64>) -> Result<Vec<u8>, ImageError> {
    let file = path.display().to_string();
    let f = File::open(path).map_err(|e| ImageError::io(&file, "open", e))?;
    let len = f
        .metadata()
        .map_err(|e| ImageError::io(&file, "fstat", e))?
        .len();
    if let Some(limit) = cap.filter(|&c| len > c) {
        return Err(ImageError::TooLarge {
            file,
            field: "file",
            size: len,
            limit,
        });
    }
    let mut buf = Vec::new();
    usize::try_from(len)
        .ok()
        .and_then(|n| buf.try_reserve_exact(n).ok())
        .ok_or_else(|| ImageError::io(&file, "allocate", io::ErrorKind::OutOfMemory.into()))?;
    f.take(len)
        .read_to_end(&mut buf)
        .map_err(|e| ImageError::io(&file, "read", e))?;
    Ok(buf)
}

/// Writes a framed file (mode 0600, truncating an old file of that name).
pub fn write_framed(path: &Path, payload: &[u8]) -> Result<(), ImageError> {
    let file = path.display().to_string();
    let mut f = create_image(path).map_err(|e| ImageError::io(&file, "create", e))?;
    f.write_all(&frame(payload))
        .map_err(|e| ImageError::io(&file, "write", e))?;
    Ok(())
}

/// Writes `bytes` as the whole file `path` (mode 0600, truncating).
pub(crate) fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create_image(path)?.write_all(bytes)
}

pub(crate) fn create_image(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// A decoded `amdgpu-kfd-<id>.img` whose contents passed validation.
#[derive(Clone, Debug, PartialEq)]
pub struct KfdImage {
    pub msg: CriuKfd,
}

/// A KFD image's GPU and CPU counts against its device entries, and at
/// least one GPU.
fn check_device_counts(file: &str, msg: &CriuKfd) -> Result<(), ImageError> {
    let gpus = msg.device_entries.iter().filter(|d| d.gpu_id != 0).count();
    let cpus = msg.device_entries.len() - gpus;
    if gpus as u64 != u64::from(msg.num_of_gpus) {
        return Err(ImageError::invalid(
            file,
            "num_of_gpus",
            format!(
                "is {} but device_entries holds {gpus} GPU entries",
                msg.num_of_gpus
            ),
        ));
    }
    if cpus as u64 != u64::from(msg.num_of_cpus) {
        return Err(ImageError::invalid(
            file,
            "num_of_cpus",
            format!(
                "is {} but device_entries holds {cpus} CPU entries",
                msg.num_of_cpus
            ),
        ));
    }
    if gpus == 0 {
        return Err(ImageError::invalid(
            file,
            "device_entries",
            "no GPU entry (KFD cannot restore a process without GPUs)",
        ));
    }
    Ok(())
}

/// The GPU ids of a KFD image's device entries, each node and GPU named
/// once.
fn unique_device_ids(file: &str, msg: &CriuKfd) -> Result<BTreeSet<u32>, ImageError> {
    let mut node_ids = BTreeSet::new();
    let mut gpu_ids = BTreeSet::new();
    for (i, d) in msg.device_entries.iter().enumerate() {
        if !node_ids.insert(d.node_id) {
            return Err(ImageError::invalid(
                file,
                format!("device_entries[{i}].node_id"),
                format!("node {} appears twice", d.node_id),
            ));
        }
        if d.gpu_id != 0 && !gpu_ids.insert(d.gpu_id) {
            return Err(ImageError::invalid(
                file,
                format!("device_entries[{i}].gpu_id"),
                format!("GPU {} appears twice", GpuId(d.gpu_id)),
            ));
        }
    }
    Ok(gpu_ids)
}

/// BO entry `i` of a KFD image: on one of its GPUs, not empty, not past
/// the address space, hashed in whole pages.
fn check_bo_entry(
    file: &str,
    i: usize,
    b: &crate::proto::KfdBoEntry,
    gpu_ids: &BTreeSet<u32>,
) -> Result<(), ImageError> {
    if !gpu_ids.contains(&b.gpu_id) {
        return Err(ImageError::invalid(
            file,
            format!("bo_entries[{i}].gpu_id"),
            format!("GPU {} is not among the image's devices", GpuId(b.gpu_id)),
        ));
    }
    if b.size == 0 {
        return Err(ImageError::invalid(
            file,
            format!("bo_entries[{i}].size"),
            "is 0",
        ));
    }
    if b.addr.checked_add(b.size).is_none() {
        return Err(ImageError::invalid(
            file,
            format!("bo_entries[{i}]"),
            format!("addr {:#x} + size {:#x} overflows", b.addr, b.size),
        ));
    }
    // Pieces of a BO are mapped at extent offsets: whole pages.
    if let Some(e) = b.content_hash_extent {
        if e == 0 || !e.is_multiple_of(crate::bo::PAGE_SIZE) {
            return Err(ImageError::invalid(
                file,
                format!("bo_entries[{i}].content_hash_extent"),
                format!("is {e}, not a positive multiple of the page size"),
            ));
        }
    }
    check_extents(file, i, b)
}

impl KfdImage {
    /// Decodes and validates the payload of a KFD image (`bytes` = whole file).
    pub fn decode(file: &str, bytes: &[u8]) -> Result<Self, ImageError> {
        let msg: CriuKfd = decode_framed(file, "criu_kfd", "criu_kfd message", bytes)?;
        Self::validate(file, msg)
    }

    /// Reads `amdgpu-kfd-<id>.img` from `dir`.
    pub fn read(dir: &Path, id: FileId) -> Result<Self, ImageError> {
        let path = dir.join(kfd_image_name(id));
        let bytes = read_whole(&path, None)?;
        Self::decode(&path.display().to_string(), &bytes)
    }

    /// Checks the message for consistency; `file` names it in errors.
    pub fn validate(file: &str, msg: CriuKfd) -> Result<Self, ImageError> {
        check_device_counts(file, &msg)?;
        let gpu_ids = unique_device_ids(file, &msg)?;
        if msg.num_of_bos != msg.bo_entries.len() as u64 {
            return Err(ImageError::invalid(
                file,
                "num_of_bos",
                format!(
                    "is {} but bo_entries holds {} entries",
                    msg.num_of_bos,
                    msg.bo_entries.len()
                ),
            ));
        }
        for (i, b) in msg.bo_entries.iter().enumerate() {
            check_bo_entry(file, i, b, &gpu_ids)?;
        }
        if msg.priv_data.is_empty() {
            return Err(ImageError::invalid(file, "priv_data", "is empty"));
        }
        for gpu in &gpu_ids {
            // Computing the pages files' totals here catches overflowing
            // sizes early.
            let bos = msg.bo_entries.iter().enumerate();
            bo::contents_total(
                bos.filter(|(_, b)| b.gpu_id == *gpu)
                    .map(|(i, b)| (i, b.alloc_flags, b.size)),
            )
            .map_err(|i| ImageError::sizes_overflow(file, i, GpuId(*gpu)))?;
        }
        Ok(KfdImage { msg })
    }

    /// Encodes the framed file contents.
    pub fn encode(&self) -> Vec<u8> {
        frame(&self.msg.encode_to_vec())
    }

    /// Writes `amdgpu-kfd-<id>.img` into `dir`.
    pub fn write(&self, dir: &Path, id: FileId) -> Result<(), ImageError> {
        write_framed(&dir.join(kfd_image_name(id)), &self.msg.encode_to_vec())
    }

    /// Layout of the kernel blob (which BO record size wrote it), for
    /// explaining a RESTORE that the kernel refuses.
    pub fn priv_layout(&self) -> Result<crate::privdata::PrivLayout, crate::privdata::PrivError> {
        crate::privdata::detect(
            &self.msg.priv_data,
            self.msg.num_of_gpus,
            self.msg.num_of_bos,
            self.msg.num_of_objects,
        )
    }

    /// User gpu_ids of the GPU entries, in image order.
    pub fn gpu_ids(&self) -> Vec<GpuId> {
        self.msg
            .device_entries
            .iter()
            .filter(|d| d.gpu_id != 0)
            .map(|d| GpuId(d.gpu_id))
            .collect()
    }
}

/// The incremental-dump fields of BO `i`: its extents' digests compose to
/// its hash, and the extents it takes from a parent exist.
fn check_extents(file: &str, i: usize, b: &crate::proto::KfdBoEntry) -> Result<(), ImageError> {
    let extents = b
        .content_hash_extent
        .map_or(1, |e| b.size.div_ceil(e.max(1)));
    if !b.content_extent_xxh3.is_empty() {
        let field = format!("bo_entries[{i}].content_extent_xxh3");
        if b.content_hash_extent.is_none() || b.content_extent_xxh3.len() as u64 != extents {
            return Err(ImageError::invalid(
                file,
                field,
                format!(
                    "holds {} digests, but the BO has {extents} extent(s)",
                    b.content_extent_xxh3.len()
                ),
            ));
        }
        if b.content_xxh3 != Some(crate::bo::compose(&b.content_extent_xxh3)) {
            return Err(ImageError::invalid(
                file,
                field,
                "does not compose to content_xxh3",
            ));
        }
    }
    let Some(map) = b.parent_extents.as_deref() else {
        return Ok(());
    };
    let field = format!("bo_entries[{i}].parent_extents");
    if map.len() as u64 > extents.div_ceil(8)
        || (0..map.len() as u64 * 8)
            .filter(|&k| k >= extents)
            .any(|k| crate::bo::bit(map, k))
    {
        return Err(ImageError::invalid(
            file,
            field,
            format!("names extents past the BO's {extents}"),
        ));
    }
    if b.parent_bo.is_none() {
        return Err(ImageError::invalid(
            file,
            format!("bo_entries[{i}].parent_bo"),
            "missing, though parent_extents is set",
        ));
    }
    Ok(())
}

/// A render image's GEM BOs (`drm_bo_entry`): what the restore recreates
/// must be what a kernel's GEM_CREATE and GEM_VA take, and its bytes must be
/// in criu-rocm's pages file.  Refused, naming the file, field and BO: a
/// handle 0 or twice, a size of no whole pages, domains amdgpu does not
/// know, a mapping outside its BO or with flags GEM_VA does not take, more
/// free handles below the highest than a restore fills ([`GEM_MAX_HOLES`]),
/// a dma-buf import (not restored yet), and criu-dev's BOs (their bytes are
/// in criu-dev's own files, which criu-rocm does not read).
fn check_gem_bos(file: &str, msg: &CriuRenderNode) -> Result<(), ImageError> {
    let mut handles = BTreeSet::new();
    let mut offsets = BTreeSet::new();
    for (i, b) in msg.bo_entries.iter().enumerate() {
        let bad = |field: &str, why: String| {
            ImageError::invalid(
                file,
                format!("bo_entries[{i}]{field}"),
                format!("{why} (GEM handle {}, {} bytes)", b.handle, b.size),
            )
        };
        if b.handle == 0 || b.handle > i32::MAX as u32 || !handles.insert(b.handle) {
            return Err(bad(
                ".handle",
                format!("{} is 0, past INT_MAX or twice", b.handle),
            ));
        }
        if !offsets.insert(b.offset) {
            return Err(bad(".offset", format!("{:#x} is another BO's", b.offset)));
        }
        check_gem_bo(b).map_err(|(field, why)| bad(field, why))?;
        check_gem_vms(b).map_err(|(field, why)| bad(&field, why))?;
    }
    check_gem_holes(file, msg)?;
    check_gem_contents(file, msg)
}

/// The number of free handles below `highest` in a file that holds `count`
/// GEM objects whose highest handle is `highest`: the placeholder objects a
/// restore makes where the kernel does not rename handles.
pub(crate) fn gem_holes(highest: u32, count: usize) -> u64 {
    u64::from(highest).saturating_sub(count as u64)
}

/// The most holes below a render file's GEM handles that a dump writes
/// (it refuses more) and a restore fills with placeholder objects of a page
/// each.
pub(crate) const GEM_MAX_HOLES: u64 = 16384;

/// Handles with more holes below them than a dump writes would make a
/// restore create that many placeholders: refused, naming the handle.
fn check_gem_holes(file: &str, msg: &CriuRenderNode) -> Result<(), ImageError> {
    let Some((i, b)) = msg
        .bo_entries
        .iter()
        .enumerate()
        .max_by_key(|(_, b)| b.handle)
    else {
        return Ok(());
    };
    let holes = gem_holes(b.handle, msg.bo_entries.len());
    if holes <= GEM_MAX_HOLES {
        return Ok(());
    }
    Err(ImageError::invalid(
        file,
        format!("bo_entries[{i}].handle"),
        format!(
            "GEM handle {} has {holes} free handles below it, more than the {GEM_MAX_HOLES} a \
             dump writes and a restore fills with placeholder objects",
            b.handle
        ),
    ))
}

/// One GEM BO's own fields: the failing field and why.
fn check_gem_bo(b: &DrmBoEntry) -> Result<(), (&'static str, String)> {
    use kfd_abi::layout::gem618::AMDGPU_GEM_DOMAIN_MASK;
    let pages = |v: u64| v.is_multiple_of(bo::PAGE_SIZE);
    if b.size == 0 || !pages(b.size) {
        return Err((".size", "is not a positive number of whole pages".into()));
    }
    if b.offset == 0 || !pages(b.offset) || b.offset.checked_add(b.size).is_none() {
        return Err((
            ".offset",
            format!("{:#x} is no mmap offset of the BO", b.offset),
        ));
    }
    let domains = b.preferred_domains;
    if domains & !AMDGPU_GEM_DOMAIN_MASK != 0
        || domains
            & (kfd_abi::sys::AMDGPU_GEM_DOMAIN_VRAM
                | kfd_abi::sys::AMDGPU_GEM_DOMAIN_GTT
                | kfd_abi::sys::AMDGPU_GEM_DOMAIN_CPU)
            == 0
    {
        return Err((
            ".preferred_domains",
            format!("{domains:#x}: not VRAM, GTT or CPU memory, whose bytes are saved"),
        ));
    }
    if b.alignment != 0 && !b.alignment.is_power_of_two() {
        return Err((
            ".alignment",
            format!("{:#x} is no power of two", b.alignment),
        ));
    }
    match (b.is_import, b.same_bo_file, b.same_bo_index) {
        (0, None, None) => {}
        (1, Some(_), Some(_)) => return check_gem_link(b),
        (0, _, _) => {
            return Err((
                ".is_import",
                "is 0 but same_bo_file/same_bo_index name the BO this one is".into(),
            ))
        }
        (1, None, _) => {
            return Err((
                ".same_bo_file",
                "missing: an imported BO (is_import 1) that names no image holding it, \
                 as criu-dev writes an import from another device or process, which \
                 criu-rocm does not restore"
                    .into(),
            ))
        }
        (1, Some(_), None) => {
            return Err((
                ".same_bo_index",
                "missing: same_bo_file names an image but not which of its BOs this is".into(),
            ))
        }
        (v, _, _) => return Err((".is_import", format!("is {v}, not 0 or 1"))),
    }
    if b.content_xxh3.is_none() {
        return Err((
            ".content_xxh3",
            "missing: a GEM BO saved by criu-dev, whose bytes are in its \
             amdgpu-drm-pages-* files, which criu-rocm does not read"
                .into(),
        ));
    }
    Ok(())
}

/// A GEM BO that is another image's BO: its bytes are that one's, so it
/// carries none of its own.
fn check_gem_link(b: &DrmBoEntry) -> Result<(), (&'static str, String)> {
    if b.content_xxh3.is_some() || b.content_hash_extent.is_some() {
        return Err((
            ".content_xxh3",
            "is set on a BO that is the same BO as another image's (same_bo_file), whose \
             bytes are saved there only"
                .into(),
        ));
    }
    Ok(())
}

/// A GEM BO's GPU mappings: whole pages of the BO, with flags GEM_VA maps
/// a BO with.  The failing field and why.
fn check_gem_vms(b: &DrmBoEntry) -> Result<(), (String, String)> {
    use kfd_abi::layout::gem618::AMDGPU_VM_MAP_FLAGS;
    if b.num_of_vms as usize != b.vm_entries.len() {
        return Err((
            ".num_of_vms".into(),
            format!(
                "is {} but vm_entries holds {}",
                b.num_of_vms,
                b.vm_entries.len()
            ),
        ));
    }
    let pages = |v: u64| v.is_multiple_of(bo::PAGE_SIZE);
    for (j, v) in b.vm_entries.iter().enumerate() {
        let inside = v.offset.checked_add(v.size).is_some_and(|e| e <= b.size);
        if v.size == 0
            || !pages(v.size | v.offset | v.addr)
            || !inside
            || v.addr.checked_add(v.size).is_none()
        {
            return Err((
                format!(".vm_entries[{j}]"),
                format!(
                    "maps {:#x} bytes at BO offset {:#x} to GPU address {:#x}: not whole \
                     pages of the BO",
                    v.size, v.offset, v.addr
                ),
            ));
        }
        if v.flags & !u64::from(AMDGPU_VM_MAP_FLAGS) != 0 {
            return Err((
                format!(".vm_entries[{j}].flags"),
                format!(
                    "{:#x}: not AMDGPU_VM_PAGE_*/MTYPE flags GEM_VA maps a BO with (outside \
                     {AMDGPU_VM_MAP_FLAGS:#x})",
                    v.flags
                ),
            ));
        }
    }
    Ok(())
}

/// The hash fields of a render image's BOs as a KFD BO's, and the pages
/// file's total.
fn check_gem_contents(file: &str, msg: &CriuRenderNode) -> Result<(), ImageError> {
    let view = RenderImage { msg: msg.clone() }.contents_view().msg;
    for (i, b) in view.bo_entries.iter().enumerate() {
        if let Some(e) = b.content_hash_extent {
            if e == 0 || !e.is_multiple_of(bo::PAGE_SIZE) {
                return Err(ImageError::invalid(
                    file,
                    format!("bo_entries[{i}].content_hash_extent"),
                    format!("is {e}, not a positive multiple of the page size"),
                ));
            }
        }
        check_extents(file, i, b)?;
    }
    bo::contents_total(
        view.bo_entries
            .iter()
            .enumerate()
            .map(|(i, b)| (i, b.alloc_flags, b.size)),
    )
    .map_err(|i| ImageError::sizes_overflow(file, i, GpuId(msg.gpu_id)))?;
    // The pages encoding is the reader's and validation's (`pages::Encoding`),
    // as for a KFD image: the codec does not depend on pages/.
    Ok(())
}

/// The GPU entry a render image records (`criu_rocm_gpu`) is of its GPU:
/// the image's gpu_id and render minor, which the restore places it by.
fn check_recorded_gpu(file: &str, msg: &CriuRenderNode) -> Result<(), ImageError> {
    let Some(e) = &msg.criu_rocm_gpu else {
        return Ok(());
    };
    if e.gpu_id != msg.gpu_id {
        let why = format!(
            "is {:#x} but the image's gpu_id is {:#x}",
            e.gpu_id, msg.gpu_id
        );
        return Err(ImageError::invalid(file, "criu_rocm_gpu.gpu_id", why));
    }
    if Some(e.drm_render_minor) != msg.drm_render_minor {
        let why = format!(
            "is {} but the image's drm_render_minor is {:?}",
            e.drm_render_minor, msg.drm_render_minor
        );
        return Err(ImageError::invalid(
            file,
            "criu_rocm_gpu.drm_render_minor",
            why,
        ));
    }
    Ok(())
}

/// A decoded `amdgpu-renderD-<id>.img`.
#[derive(Clone, Debug, PartialEq)]
pub struct RenderImage {
    pub msg: CriuRenderNode,
}

impl RenderImage {
    /// Decodes a render-node image (`bytes` = whole file).
    pub fn decode(file: &str, bytes: &[u8]) -> Result<Self, ImageError> {
        // A render image holds one id (plus criu-dev's DRM BO list).
        let msg: CriuRenderNode =
            decode_framed(file, "criu_render_node", "criu_render_node message", bytes)?;
        if msg.gpu_id == 0 {
            return Err(ImageError::invalid(file, "gpu_id", "is 0 (a CPU id)"));
        }
        if let Some(n) = msg.num_of_bos {
            if n != msg.bo_entries.len() as u64 {
                return Err(ImageError::invalid(
                    file,
                    "num_of_bos",
                    format!(
                        "is {n} but bo_entries holds {} entries",
                        msg.bo_entries.len()
                    ),
                ));
            }
        }
        check_gem_bos(file, &msg)?;
        check_recorded_gpu(file, &msg)?;
        Ok(RenderImage { msg })
    }

    /// Reads `amdgpu-renderD-<id>.img` from `dir`.
    pub fn read(dir: &Path, id: FileId) -> Result<Self, ImageError> {
        let path = dir.join(render_image_name(id));
        let bytes = read_whole(&path, None)?;
        Self::decode(&path.display().to_string(), &bytes)
    }

    /// Encodes the framed file contents.
    pub fn encode(&self) -> Vec<u8> {
        frame(&self.msg.encode_to_vec())
    }

    /// Writes `amdgpu-renderD-<id>.img` into `dir`.
    pub fn write(&self, dir: &Path, id: FileId) -> Result<(), ImageError> {
        write_framed(&dir.join(render_image_name(id)), &self.msg.encode_to_vec())
    }

    /// The user gpu_id this render node belongs to.
    pub fn gpu_id(&self) -> GpuId {
        GpuId(self.msg.gpu_id)
    }

    /// Its GEM BOs as the KFD image's shape the pages code reads: one
    /// `kfd_bo_entry` per `drm_bo_entry`, in order (the same index), at its
    /// first GPU address (0 if unmapped), mmap offset and GEM handle, with
    /// the KFD flags its bytes are copied under ([`bo::gem_alloc_flags`]),
    /// its content hashes and parent extents, and the render file's pages
    /// encoding, parent image and task pid.  The pages file,
    /// its digests, its hashes and its encoding are then one code path with
    /// a KFD image's.
    pub fn contents_view(&self) -> KfdImage {
        let m = &self.msg;
        let bo_entries: Vec<crate::proto::KfdBoEntry> = m
            .bo_entries
            .iter()
            .map(|b| crate::proto::KfdBoEntry {
                addr: b.vm_entries.first().map_or(0, |v| v.addr),
                size: b.size,
                offset: b.offset,
                // The same BO as another image's: its bytes are there.
                alloc_flags: if b.same_bo_index.is_some() {
                    0
                } else {
                    bo::gem_alloc_flags(b.preferred_domains, b.alloc_flags)
                },
                gpu_id: m.gpu_id,
                content_xxh3: b.content_xxh3,
                content_hash_extent: b.content_hash_extent,
                content_extent_xxh3: b.content_extent_xxh3.clone(),
                // The GEM handle: an incremental dump's BOs are the parent's
                // of the same handle too.
                handle: Some(b.handle),
                parent_extents: b.parent_extents.clone(),
                parent_bo: b.parent_bo,
            })
            .collect();
        let gpu = crate::proto::KfdDeviceEntry {
            gpu_id: m.gpu_id,
            drm_render_minor: m.drm_render_minor.unwrap_or(0),
            ..Default::default()
        };
        KfdImage {
            msg: CriuKfd {
                num_of_gpus: 1,
                device_entries: vec![gpu],
                num_of_bos: bo_entries.len() as u64,
                bo_entries,
                pages_compression: m.pages_compression,
                pages_compression_level: m.pages_compression_level,
                pages_compression_chunk: m.pages_compression_chunk,
                pid: m.criu_rocm_pid.unwrap_or(0),
                criu_rocm_parent: m.criu_rocm_parent.clone(),
                ..Default::default()
            },
        }
    }

    /// Whether the render file held GEM BOs.
    pub fn has_gem_bos(&self) -> bool {
        !self.msg.bo_entries.is_empty()
    }

    /// Whether a GEM BO of the render file holds bytes of its own: one that
    /// is not another image's BO (`same_bo_index`).
    pub fn has_own_bos(&self) -> bool {
        self.msg
            .bo_entries
            .iter()
            .any(|b| b.same_bo_index.is_none())
    }
}

/// What is wrong with a dma-buf image's `file_flags`: only what F_GETFL
/// reports of a dma-buf (an access mode an export gives, O_RDONLY or
/// O_RDWR, O_NONBLOCK, which the restore sets again, and O_LARGEFILE,
/// 0o100000 on x86-64, which the kernel adds) is a dma-buf fd's.
fn dmabuf_flags_fault(flags: u32) -> Option<String> {
    const O_LARGEFILE: u32 = 0o100000;
    let known = libc::O_ACCMODE as u32 | libc::O_NONBLOCK as u32 | O_LARGEFILE;
    if flags & !known != 0 {
        return Some(format!(
            "is {flags:#x}: bits {:#x} are no dma-buf fd's status flags (the restore sets \
             O_NONBLOCK only)",
            flags & !known
        ));
    }
    match flags & libc::O_ACCMODE as u32 {
        3 => Some(format!("is {flags:#x}: access mode 3 is no file's")),
        m if m == libc::O_WRONLY as u32 => Some(format!(
            "is {flags:#x}: O_WRONLY, which no dma-buf export gives (PRIME_HANDLE_TO_FD and \
             EXPORT_DMABUF make O_RDONLY or, with DRM_RDWR, O_RDWR files)"
        )),
        _ => None,
    }
}

/// A decoded `amdgpu-dmabuf_<id>.img`: a dma-buf fd of the process and
/// the BO it is of (`bo_file`, `bo_index`: an entry of another image of
/// the dump).
#[derive(Clone, Debug, PartialEq)]
pub struct DmabufImage {
    pub msg: CriuDmabufNode,
}

impl DmabufImage {
    /// Decodes a dma-buf image (`bytes` = whole file).  criu-rocm's fields
    /// are required: criu-dev's image alone (a GEM handle of no named file)
    /// does not say which file's BO it is.
    pub fn decode(file: &str, bytes: &[u8]) -> Result<Self, ImageError> {
        let msg: CriuDmabufNode =
            decode_framed(file, "criu_dmabuf_node", "criu_dmabuf_node message", bytes)?;
        let missing = |field: &str| {
            ImageError::invalid(
                file,
                field,
                "is missing (criu-dev's dma-buf image names no file; criu-rocm restores a \
                 dma-buf from the file whose BO it is)",
            )
        };
        for (field, present) in [
            ("bo_file", msg.bo_file.is_some()),
            ("bo_index", msg.bo_index.is_some()),
            ("gpu_id", msg.gpu_id.is_some()),
            ("size", msg.size.is_some()),
        ] {
            if !present {
                return Err(missing(field));
            }
        }
        if msg.gpu_id == Some(0) {
            return Err(ImageError::invalid(file, "gpu_id", "is 0 (a CPU id)"));
        }
        if msg.size == Some(0) {
            return Err(ImageError::invalid(file, "size", "is 0 (no BO)"));
        }
        if let Some(why) = msg.file_flags.and_then(dmabuf_flags_fault) {
            return Err(ImageError::invalid(file, "file_flags", why));
        }
        Ok(DmabufImage { msg })
    }

    /// Reads `amdgpu-dmabuf_<id>.img` from `dir`.
    pub fn read(dir: &Path, id: FileId) -> Result<Self, ImageError> {
        let path = dir.join(dmabuf_image_name(id));
        let bytes = read_whole(&path, Some(4096))?;
        Self::decode(&path.display().to_string(), &bytes)
    }

    /// Encodes the framed file contents.
    pub fn encode(&self) -> Vec<u8> {
        frame(&self.msg.encode_to_vec())
    }

    /// Writes `amdgpu-dmabuf_<id>.img` into `dir`.
    pub fn write(&self, dir: &Path, id: FileId) -> Result<(), ImageError> {
        write_framed(&dir.join(dmabuf_image_name(id)), &self.msg.encode_to_vec())
    }

    /// The file and index of the BO it is of.
    pub fn bo(&self) -> (FileId, u32) {
        (
            FileId(self.msg.bo_file.unwrap_or_default()),
            self.msg.bo_index.unwrap_or_default(),
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {

    use super::*;
    use crate::proto::{DevIolink, KfdBoEntry, KfdDeviceEntry};

    pub(crate) fn gpu_entry(node_id: u32, gpu_id: u32) -> KfdDeviceEntry {
        KfdDeviceEntry {
            node_id,
            gpu_id,
            simd_count: 256,
            mem_banks_count: 1,
            vendor_id: 0x1002,
            device_id: 0x740f,
            vram_size: 64 << 30,
            iolinks: vec![DevIolink {
                r#type: 2,
                node_to_id: 0,
            }],
            ..Default::default()
        }
    }

    pub(crate) fn sample_kfd() -> CriuKfd {
        let cpu = KfdDeviceEntry {
            node_id: 0,
            cpu_cores_count: 16,
            ..Default::default()
        };
        CriuKfd {
            pid: 42,
            num_of_gpus: 2,
            num_of_cpus: 1,
            device_entries: vec![cpu, gpu_entry(1, 0x1a2b), gpu_entry(2, 0x5c3d)],
            num_of_bos: 3,
            bo_entries: vec![
                KfdBoEntry {
                    addr: 0x7000_0000_0000,
                    size: 0x20_0000,
                    offset: 0x1_0000_0000,
                    alloc_flags: bo::ALLOC_VRAM | bo::ALLOC_WRITABLE,
                    gpu_id: 0x1a2b,
                    handle: None,
                    content_xxh3: Some(7),
                    content_hash_extent: Some(0x10_0000),
                    content_extent_xxh3: Vec::new(),
                    parent_extents: None,
                    parent_bo: None,
                },
                KfdBoEntry {
                    addr: 0x7000_0100_0000,
                    size: 0x2000,
                    offset: 0xc000_0000_0000_0000,
                    alloc_flags: bo::ALLOC_DOORBELL,
                    gpu_id: 0x1a2b,
                    handle: None,
                    content_xxh3: None,
                    content_hash_extent: None,
                    content_extent_xxh3: Vec::new(),
                    parent_extents: None,
                    parent_bo: None,
                },
                KfdBoEntry {
                    addr: 0x7000_0200_0000,
                    size: 0x1000,
                    offset: 0x1_0020_0000,
                    alloc_flags: bo::ALLOC_GTT,
                    gpu_id: 0x5c3d,
                    handle: None,
                    content_xxh3: None,
                    content_hash_extent: None,
                    content_extent_xxh3: Vec::new(),
                    parent_extents: None,
                    parent_bo: None,
                },
            ],
            num_of_objects: 0,
            shared_mem_size: 0,
            shared_mem_magic: 0,
            priv_data: vec![1, 0, 0, 0, 0, 0, 0, 0],
            criu_rocm_ext_version: Some(EXT_VERSION),
            priv_bo_record_size: None,
            criu_rocm_reopen: None,
            shared_mem_mode: None,
            semaphore_mode: None,
            pages_compression: None,
            pages_compression_level: None,
            criu_rocm_parent: None,
            pages_compression_chunk: None,
            criu_rocm_imports: Vec::new(),
        }
    }

    /// Top-level field numbers present in an encoded message, and the
    /// payloads of its length-delimited fields; a scanner written from the
    /// protobuf wire format so the test does not trust prost.
    pub(crate) fn scan_fields(mut b: &[u8]) -> Vec<(u64, Option<Vec<u8>>)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let (byte, rest) = b.split_first().expect("varint in bounds");
                *b = rest;
                v |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = varint(&mut b);
            let (field, wire) = (key >> 3, key & 7);
            match wire {
                0 => {
                    varint(&mut b);
                    out.push((field, None));
                }
                1 => {
                    b = &b[8..];
                    out.push((field, None));
                }
                5 => {
                    b = &b[4..];
                    out.push((field, None));
                }
                2 => {
                    let len = varint(&mut b) as usize;
                    out.push((field, Some(b[..len].to_vec())));
                    b = &b[len..];
                }
                w => panic!("unexpected wire type {w}"),
            }
        }
        out
    }

    fn assert_has(
        fields: &[(u64, Option<Vec<u8>>)],
        required: std::ops::RangeInclusive<u64>,
        what: &str,
    ) {
        for tag in required {
            assert!(
                fields.iter().any(|(f, _)| *f == tag),
                "{what}: required field {tag} missing"
            );
        }
    }

    #[test]
    fn names_follow_upstream_patterns() {
        assert_eq!(kfd_image_name(FileId(7)), "amdgpu-kfd-7.img");
        assert_eq!(render_image_name(FileId(12)), "amdgpu-renderD-12.img");
        assert_eq!(kfd_image_name(FileId(u32::MAX)), "amdgpu-kfd--1.img");
    }

    #[test]
    fn file_ids_read_back_exactly_as_written() {
        for id in [0, 1, 7, 0x7fff_ffff, 0x8000_0000, 0x8000_0005, u32::MAX] {
            let name = kfd_image_name(FileId(id));
            assert_eq!(kfd_image_id(&name), Some(FileId(id)), "{name}");
            assert_eq!(FileId::parse(&FileId(id).to_string()), Some(FileId(id)));
        }
        // Spellings upstream's %d never prints name no image.
        for name in [
            "amdgpu-kfd-+3.img",
            "amdgpu-kfd-03.img",
            "amdgpu-kfd--0.img",
            "amdgpu-kfd-2147483648.img",
            "amdgpu-kfd-4294967295.img",
            "amdgpu-kfd-.img",
            "amdgpu-kfd-3.img.bak",
            "amdgpu-renderD-3.img",
        ] {
            assert_eq!(kfd_image_id(name), None, "{name}");
        }
    }

    #[test]
    fn required_fields_are_emitted_even_when_zero() {
        let mut msg = sample_kfd();
        // All-zero scalars are the case a proto3-style encoder would drop.
        msg.pid = 0;
        msg.num_of_objects = 0;
        let bytes = msg.encode_to_vec();
        let top = scan_fields(&bytes);
        assert_has(&top, 1..=3, "criu_kfd");
        assert_has(&top, 5..=5, "criu_kfd");
        assert_has(&top, 7..=10, "criu_kfd");
        let devices: Vec<_> = top.iter().filter(|(f, _)| *f == 4).collect();
        assert_eq!(devices.len(), 3);
        for (_, payload) in devices {
            let dev = scan_fields(payload.as_ref().unwrap());
            assert_has(&dev, 1..=31, "kfd_device_entry");
            for (f, link) in &dev {
                if *f == 32 {
                    assert_has(&scan_fields(link.as_ref().unwrap()), 1..=2, "dev_iolink");
                }
            }
        }
        for (_, payload) in top.iter().filter(|(f, _)| *f == 6) {
            let bo = scan_fields(payload.as_ref().unwrap());
            assert_has(&bo, 1..=5, "kfd_bo_entry");
            assert!(!bo.iter().any(|(f, _)| *f == 6), "criu-dev handle emitted");
        }
        let rn = CriuRenderNode {
            gpu_id: 0x1a2b,
            ..Default::default()
        }
        .encode_to_vec();
        assert_has(&scan_fields(&rn), 1..=1, "criu_render_node");
    }

    /// The GPU entry a render image records must be of its GPU: id and
    /// render minor.
    #[test]
    fn render_image_recorded_gpu_is_its_own() {
        let decode = |id: u32, minor: u32| {
            let mut e = gpu_entry(1, id);
            e.drm_render_minor = minor;
            let img = RenderImage {
                msg: CriuRenderNode {
                    gpu_id: 0x1a2b,
                    drm_render_minor: Some(128),
                    criu_rocm_gpu: Some(e),
                    ..Default::default()
                },
            };
            RenderImage::decode("r.img", &img.encode()).map(|_| ())
        };
        assert!(decode(0x1a2b, 128).is_ok());
        let e = decode(0x5c3d, 128).unwrap_err().to_string();
        assert!(
            e.contains("criu_rocm_gpu.gpu_id: is 0x5c3d but the image's gpu_id is 0x1a2b"),
            "{e}"
        );
        let e = decode(0x1a2b, 129).unwrap_err().to_string();
        assert!(e.contains("criu_rocm_gpu.drm_render_minor: is 129"), "{e}");
    }

    /// A render image's GEM BOs: criu-rocm's are accepted; criu-dev's
    /// (bytes in its own files), imports and damaged ones are refused
    /// (restore and gpu-check decode alike), naming the file, field and BO.
    #[test]
    fn render_image_gem_bos_are_checked() {
        let good = crate::proto::DrmBoEntry {
            addr: 0x7000_0000,
            size: 0x10000,
            offset: 0x1_0010_0000,
            preferred_domains: 4,
            handle: 3,
            num_of_vms: 1,
            vm_entries: vec![crate::proto::DrmVmEntry {
                addr: 0x7000_0000,
                size: 0x10000,
                offset: 0,
                flags: 0xe,
            }],
            content_xxh3: Some(1),
            ..Default::default()
        };
        let decode = |bo: crate::proto::DrmBoEntry| {
            let rn = CriuRenderNode {
                gpu_id: 0x1a2b,
                id: Some(7),
                drm_render_minor: Some(128),
                num_of_bos: Some(1),
                bo_entries: vec![bo],
                ..Default::default()
            };
            RenderImage::decode("amdgpu-renderD-7.img", &frame(&rn.encode_to_vec()))
        };
        let img = decode(good.clone()).unwrap();
        let view = img.contents_view();
        assert_eq!(view.gpu_ids(), vec![GpuId(0x1a2b)]);
        assert_eq!(
            view.msg.bo_entries[0].alloc_flags & bo::ALLOC_VRAM,
            bo::ALLOC_VRAM
        );
        assert_eq!(view.msg.bo_entries[0].offset, good.offset);
        type Edit = fn(&mut crate::proto::DrmBoEntry);
        let cases: [(Edit, &str); 10] = [
            (|b| b.content_xxh3 = None, "content_xxh3"),
            // Page-table bits (EXECUTABLE|READABLE|WRITEABLE PTE bits): PRT
            // to GEM_VA.
            (|b| b.vm_entries[0].flags = 0x70, "vm_entries[0].flags"),
            (|b| b.vm_entries[0].flags = 1 << 32, "vm_entries[0].flags"),
            // 16385 free handles below the only BO: a restore would make
            // that many placeholders.
            (|b| b.handle = 16386, "more than the 16384"),
            (|b| b.is_import = 1, "is_import"),
            (|b| b.handle = 0, "handle"),
            (|b| b.size = 0x10001, "size"),
            (|b| b.preferred_domains = 0x40, "preferred_domains"),
            (|b| b.num_of_vms = 2, "num_of_vms"),
            (|b| b.vm_entries[0].offset = 0x1000, "vm_entries[0]"),
        ];
        for (edit, field) in cases {
            let mut bo = good.clone();
            edit(&mut bo);
            let e = decode(bo).unwrap_err().to_string();
            for want in ["amdgpu-renderD-7.img", "bo_entries[0]", field, "GEM handle"] {
                assert!(e.contains(want), "{want:?} not in {e}");
            }
        }
        // As many holes as a dump writes, and every flag GEM_VA takes.
        let mut bo = good.clone();
        bo.handle = 16385;
        bo.vm_entries[0].flags = u64::from(kfd_abi::layout::gem618::AMDGPU_VM_MAP_FLAGS);
        decode(bo).unwrap();
    }

    /// protoc's C++ parser enforces `required` like protobuf-c does: let it
    /// decode our bytes with the schema.  The build needs protoc anyway
    /// (build.rs), so a missing one is a failure, not a skip.
    #[test]
    fn protoc_accepts_our_encoding() {
        let protoc = std::env::var_os("PROTOC").unwrap_or_else(|| "/usr/bin/protoc".into());
        assert!(
            Path::new(&protoc).exists(),
            "{}: protoc not found (Debian's protobuf-compiler; set PROTOC)",
            Path::new(&protoc).display()
        );
        let proto_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
        let mut msg = sample_kfd();
        msg.pid = 0;
        let run = |ty: &str, bytes: Vec<u8>| {
            let mut child = std::process::Command::new(&protoc)
                .arg(format!("--decode=criu_amdgpu.{ty}"))
                .arg(format!("-I{}", proto_dir.display()))
                .arg("criu-amdgpu.proto")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn protoc");
            child.stdin.take().unwrap().write_all(&bytes).unwrap();
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            // protoc decodes partial messages but warns about them.
            let complete = out.status.success() && !stderr.contains("missing required");
            (complete, String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let (ok, text) = run("criu_kfd", msg.encode_to_vec());
        assert!(ok, "protoc found our criu_kfd incomplete");
        assert!(text.contains("pid: 0"), "{text}");
        assert!(text.contains("gds_size_in_kb: 0"), "{text}");
        // Sanity of the check itself: a message missing a required field
        // must be rejected by protoc.
        let (ok, _) = run("dev_iolink", vec![0x08, 0x02]);
        assert!(!ok, "protoc accepted a dev_iolink without node_to_id");
        let (ok, _) = run(
            "criu_render_node",
            CriuRenderNode {
                gpu_id: 0,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert!(ok, "protoc found our criu_render_node incomplete");
    }

    #[test]
    fn roundtrip_through_files() {
        let dir = tempdir();
        let img = KfdImage::validate("t", sample_kfd()).unwrap();
        img.write(&dir, FileId(5)).unwrap();
        let back = KfdImage::read(&dir, FileId(5)).unwrap();
        assert_eq!(back, img);
        assert_eq!(back.gpu_ids(), vec![GpuId(0x1a2b), GpuId(0x5c3d)]);
        let rn = RenderImage {
            msg: CriuRenderNode {
                gpu_id: 0x5c3d,
                ..Default::default()
            },
        };
        rn.write(&dir, FileId(6)).unwrap();
        assert_eq!(
            RenderImage::read(&dir, FileId(6)).unwrap().gpu_id(),
            GpuId(0x5c3d)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn framing_errors_name_file_and_field() {
        let good = KfdImage::validate("t", sample_kfd()).unwrap().encode();
        let e = KfdImage::decode("f.img", &good[..5])
            .unwrap_err()
            .to_string();
        assert!(e.contains("f.img") && e.contains("size header"), "{e}");
        let e = KfdImage::decode("f.img", &good[..good.len() - 1])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("truncated") && e.contains("criu_kfd message"),
            "{e}"
        );
        let mut long = good.clone();
        long.push(0);
        let e = KfdImage::decode("f.img", &long).unwrap_err().to_string();
        assert!(e.contains("1 unexpected bytes"), "{e}");
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        // A size word is bounded by the bytes the file holds, nothing else.
        let e = KfdImage::decode("f.img", &huge).unwrap_err().to_string();
        assert!(e.contains("needs 18446744073709551615 bytes, only"), "{e}");
        let mut garbage = frame(&[0xff; 16]);
        garbage.truncate(24);
        assert!(matches!(
            KfdImage::decode("f.img", &garbage),
            Err(ImageError::Decode { .. })
        ));
    }

    #[test]
    fn semantic_errors_are_caught() {
        let check = |edit: &dyn Fn(&mut CriuKfd), want: &str| {
            let mut m = sample_kfd();
            edit(&mut m);
            let e = KfdImage::validate("x.img", m).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("x.img"), "{e} lacks {want}");
        };
        check(&|m| m.num_of_bos = 9, "num_of_bos");
        check(&|m| m.num_of_gpus = 3, "num_of_gpus");
        check(&|m| m.num_of_cpus = 0, "num_of_cpus");
        check(&|m| m.device_entries[2].gpu_id = 0x1a2b, "appears twice");
        check(&|m| m.device_entries[2].node_id = 1, "node 1 appears twice");
        check(&|m| m.bo_entries[1].gpu_id = 0x9999, "bo_entries[1].gpu_id");
        check(&|m| m.bo_entries[0].size = 0, "bo_entries[0].size");
        check(&|m| m.bo_entries[0].addr = u64::MAX, "overflows");
        for bad in [0, 4097] {
            check(
                &|m| m.bo_entries[0].content_hash_extent = Some(bad),
                "bo_entries[0].content_hash_extent",
            );
        }
        check(&|m| m.priv_data.clear(), "priv_data");
        check(
            &|m| {
                m.bo_entries[2].gpu_id = 0x1a2b;
                m.bo_entries[2].size = u64::MAX - 0x1000;
                m.bo_entries[2].addr = 0;
            },
            "overflows",
        );
        check(
            &|m| {
                m.device_entries.retain(|d| d.gpu_id == 0);
                m.num_of_gpus = 0;
            },
            "no GPU entry",
        );
    }

    /// A fresh directory of one test (`tempfile`: a name of its own, made
    /// exclusively), removed when dropped; kept, and named on stderr, when
    /// `CRIU_ROCM_TEST_KEEP=1`. It reads as its path.
    pub(crate) struct TestDir(tempfile::TempDir);

    impl std::ops::Deref for TestDir {
        type Target = Path;
        fn deref(&self) -> &Path {
            self.0.path()
        }
    }

    impl AsRef<Path> for TestDir {
        fn as_ref(&self) -> &Path {
            self.0.path()
        }
    }

    pub(crate) fn tempdir() -> TestDir {
        TestDir(crate::scratch::scratch_dir("test"))
    }

    #[test]
    fn a_dmabuf_image_without_our_fields_is_refused_naming_the_field() {
        let full = CriuDmabufNode {
            gem_handle: 1,
            bo_file: Some(6),
            bo_index: Some(0),
            gpu_id: Some(0x1a2b),
            size: Some(4096),
            file_flags: None,
        };
        let ok = DmabufImage { msg: full };
        assert_eq!(DmabufImage::decode("d", &ok.encode()).unwrap(), ok);
        // criu-dev's own image: the GEM handle alone.
        let upstream = frame(
            &CriuDmabufNode {
                gem_handle: 3,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let e = DmabufImage::decode("amdgpu-dmabuf_7.img", &upstream).unwrap_err();
        assert!(e.to_string().contains("bo_file: is missing"), "{e}");
        for (m, field) in [
            (
                CriuDmabufNode {
                    gpu_id: Some(0),
                    ..full
                },
                "gpu_id",
            ),
            (
                CriuDmabufNode {
                    size: Some(0),
                    ..full
                },
                "size",
            ),
            (
                CriuDmabufNode {
                    bo_index: None,
                    ..full
                },
                "bo_index",
            ),
        ] {
            let e = DmabufImage::decode("d", &frame(&m.encode_to_vec())).unwrap_err();
            assert!(e.to_string().contains(field), "{e}");
        }
        assert_eq!(
            dmabuf_image_id(&dmabuf_image_name(FileId(-3i32 as u32))),
            Some(FileId(-3i32 as u32))
        );
    }

    #[test]
    fn dmabuf_file_flags_no_dmabuf_fd_has_are_refused() {
        let with = |flags| DmabufImage {
            msg: CriuDmabufNode {
                gem_handle: 1,
                bo_file: Some(6),
                bo_index: Some(0),
                gpu_id: Some(0x1a2b),
                size: Some(4096),
                file_flags: Some(flags),
            },
        };
        // What the dump writes: O_RDWR | O_LARGEFILE, with O_NONBLOCK; O_RDONLY.
        for flags in [0x8002, 0x8802, 0] {
            let m = with(flags);
            assert_eq!(DmabufImage::decode("d", &m.encode()).unwrap(), m);
        }
        for (flags, want) in [
            (0xffff_ffff, "file_flags: is 0xffffffff: bits"),
            (0o40002, "file_flags: is 0x4002: bits 0x4000"),
            (3, "file_flags: is 0x3: access mode 3"),
            (
                0x8001,
                "file_flags: is 0x8001: O_WRONLY, which no dma-buf export gives",
            ),
        ] {
            let e = DmabufImage::decode("d", &with(flags).encode()).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
    }
}
