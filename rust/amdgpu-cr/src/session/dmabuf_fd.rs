//! dma-buf fds in a process' fd table (issues 29 and 30): HIP IPC's
//! exporter keeps a dma-buf of the BO it exported, libdrm and VA-API
//! clients keep PRIME fds.
//!
//! Dump: CRIU offers the file to the plugins (patch 0040); its link reads
//! `/dmabuf:`.  Which BO of which GPU it is: the dma-buf is imported
//! (PRIME_FD_TO_HANDLE) into an open of each render node of ours; amdgpu
//! gives an exported BO back on its own device (`amdgpu_gem_prime_import`:
//! not an import, so GEM_LIST_HANDLES does not flag it `IS_IMPORT`), whose
//! mmap offset (GEM_MMAP) is the BO's, as every holder lists it.  That
//! (GPU, offset) is looked up among the BOs this dump saves ([`SharedBos`]);
//! the record names the holder's image and BO (`bo_file`, `bo_index`).  A
//! dma-buf seen before its holder's file waits for it ([`PendingDmabufs`]);
//! one whose BO no file of its process saves fails the dump, naming the
//! process, fd and why.
//!
//! Restore: the BO is exported again from its restored holder (the dma-buf
//! KFD's RESTORE gave for a KFD BO, PRIME_HANDLE_TO_FD for a render file's,
//! with `DRM_RDWR` only when the image's `file_flags` are read-write),
//! which is the BO's one dma-buf file as on the kernel (KFD and PRIME keep
//! one per BO and hand out fds of it, its access mode the first export's;
//! the restore's exports of the BO for its other holders' imports ask for
//! the same mode, as the kernel keeps that file while the BO has handles).
//! The fd's `F_GETFL` is checked against `file_flags` (access mode,
//! O_NONBLOCK): a dma-buf the export cannot give as dumped (a read-only
//! one of a writable KFD BO, one whose BO was exported read-write for
//! another holder first) fails the restore, naming the image and field.  A holder CRIU has not restored yet
//! in the task makes CRIU retry the file after the task's other files.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

use kfd_abi::handle::RenderNode;
use kfd_abi::layout::gem618;

use super::dmabuf::{HeldIn, Holder, SharedBos};
use crate::ids::{GpuId, RenderMinor};
use crate::image::{dmabuf_image_id, DmabufImage, FileId, ImageError};
use crate::proto::CriuDmabufNode;

/// The link of every dma-buf file (plus the name its exporter set).
const LINK_PREFIX: &str = "/dmabuf:";

/// Whether a file's path as `/proc` writes it (an fd's link target, a
/// maps line's path) is a dma-buf's.
pub fn is_dmabuf_link(target: &[u8]) -> bool {
    target.starts_with(LINK_PREFIX.as_bytes())
}

/// Whether the fd link `proc_fd` (`/proc/PID/fd/N`) reads a dma-buf's
/// path; one that cannot be read is not.
pub fn links_to_dmabuf(proc_fd: &Path) -> bool {
    std::fs::read_link(proc_fd).is_ok_and(|l| is_dmabuf_link(l.as_os_str().as_encoded_bytes()))
}

/// Whether `fd` is a dma-buf by its link.
pub fn is_dmabuf(fd: BorrowedFd<'_>) -> bool {
    links_to_dmabuf(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))
}

/// A dma-buf fd of a process and the BO it is of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DmabufFd {
    /// The process and its fd number.
    pub pid: i32,
    pub task_fd: RawFd,
    /// CRIU's id of the file.
    pub id: FileId,
    pub gpu: GpuId,
    pub minor: RenderMinor,
    pub offset: u64,
    pub size: u64,
    /// `fcntl(F_GETFL)` of the file.
    pub flags: u32,
}

impl std::fmt::Display for DmabufFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fd {} (dma-buf, file {}) of a BO of GPU {} ({}, mmap offset {:#x}, {} bytes)",
            self.task_fd,
            self.id,
            self.gpu,
            self.minor.path(),
            self.offset,
            self.size
        )
    }
}

/// Where the dma-buf's BO is, on one render node: its mmap offset and size;
/// `Err`: why not there.
fn probe(fd: BorrowedFd<'_>, minor: RenderMinor) -> Result<(u64, u64), String> {
    let node = RenderNode::open(minor).map_err(|e| format!("{}: {e}", minor.path()))?;
    let handle = node
        .prime_fd_to_handle(fd)
        .map_err(|e| format!("{}: PRIME_FD_TO_HANDLE: {e}", minor.path()))?;
    let listed = node.gem_list_handles().map_err(|e| {
        format!(
            "{}: GEM_LIST_HANDLES: {e} (a kernel before 6.18 cannot tell an export of this GPU \
             from an import)",
            minor.path()
        )
    })?;
    let entry = listed
        .iter()
        .find(|e| e.gem_handle == handle)
        .ok_or_else(|| {
            format!(
                "{}: the imported handle {handle} is not listed",
                minor.path()
            )
        })?;
    if entry.flags & gem618::AMDGPU_GEM_LIST_HANDLES_FLAG_IS_IMPORT != 0 {
        return Err(format!(
            "{}: not a BO of this GPU (an import)",
            minor.path()
        ));
    }
    let offset = node
        .gem_mmap(handle)
        .map_err(|e| format!("{}: GEM_MMAP: {e}", minor.path()))?;
    // Our open of the node is closed here, and the handle with it.
    Ok((offset.0, entry.size))
}

/// Which host GPU's BO the dma-buf `fd` is, among `gpus` (render minor,
/// host gpu_id): its GPU, node, mmap offset and size.  `Err`: of none (a
/// BO of another device, or no GPU's), with what each node said.
pub(crate) fn identify(
    fd: BorrowedFd<'_>,
    gpus: &[(RenderMinor, GpuId)],
) -> Result<(GpuId, RenderMinor, u64, u64), String> {
    let mut said = Vec::new();
    for &(minor, gpu) in gpus {
        match probe(fd, minor) {
            Ok((offset, size)) => return Ok((gpu, minor, offset, size)),
            Err(e) => said.push(e),
        }
    }
    if said.is_empty() {
        said.push("this host has no GPU render node".into());
    }
    Err(said.join("; "))
}

/// The file status flags of `fd` (`F_GETFL`).
pub(crate) fn file_flags(fd: BorrowedFd<'_>) -> std::io::Result<u32> {
    // SAFETY: F_GETFL reads the flags of a valid fd and touches no memory.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as u32)
}

/// The status flags a restored dma-buf fd must have as dumped: its access
/// mode (fixed when the BO's dma-buf file is made, by the export's
/// `DRM_RDWR`) and `O_NONBLOCK` (set again by the restore).  Close-on-exec
/// is the fd's, not the file's: CRIU's fdinfo restores it.
const RESTORED_FLAGS: u32 = libc::O_ACCMODE as u32 | libc::O_NONBLOCK as u32;

/// The access flag to export a BO again with for a dma-buf dumped with
/// `file_flags` (`DRM_RDWR`, or none for O_RDONLY); an image without the
/// field (before criu-rocm saved it) is restored read-write, as it was.
pub(crate) fn export_access(file_flags: Option<u32>) -> u32 {
    match file_flags.map(|f| f & libc::O_ACCMODE as u32) {
        Some(mode) if mode == libc::O_RDONLY as u32 => 0,
        _ => libc::O_RDWR as u32,
    }
}

/// The access flag to export each BO (image file, index) of the dump in
/// `dir` with when the restore makes its dma-buf file for another holder's
/// import: the mode its dma-buf fds had, as the dump's dma-buf images naming
/// it record (the kernel keeps a BO's one dma-buf file while the BO has
/// handles, so the imports were of that file too).  The images are read
/// once; [`bo_export_access`] looks a BO up.
pub(crate) fn export_modes(dir: &Path) -> Result<BTreeMap<(FileId, u32), u32>, ImageError> {
    let listing = std::fs::read_dir(dir)
        .map_err(|e| ImageError::io(&dir.display().to_string(), "listing", e))?;
    let mut modes = BTreeMap::new();
    for entry in listing.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(dmabuf_image_id) else {
            continue;
        };
        let img = DmabufImage::read(dir, id)?;
        modes
            .entry(img.bo())
            .or_insert_with(|| export_access(img.msg.file_flags));
    }
    Ok(modes)
}

/// The access flag to export BO `bo` with, of the `modes` of
/// [`export_modes`]: `DRM_RDWR` when no dma-buf image names it.
pub(crate) fn bo_export_access(modes: &BTreeMap<(FileId, u32), u32>, bo: (FileId, u32)) -> u32 {
    modes.get(&bo).copied().unwrap_or(libc::O_RDWR as u32)
}

/// A file's status flags in words: access mode and O_NONBLOCK.
pub(crate) fn flag_words(flags: u32) -> String {
    let mode = match flags & libc::O_ACCMODE as u32 {
        m if m == libc::O_RDONLY as u32 => "O_RDONLY",
        m if m == libc::O_WRONLY as u32 => "O_WRONLY",
        _ => "O_RDWR",
    };
    if flags & libc::O_NONBLOCK as u32 != 0 {
        format!("{mode}|O_NONBLOCK")
    } else {
        mode.to_owned()
    }
}

/// Whether the dma-buf `got` (F_GETFL of the fd exported again) is the
/// file the image's `file_flags` describes; `Err`: why not, in words.
pub(crate) fn check_restored(got: u32, file_flags: Option<u32>) -> Result<(), String> {
    let want = file_flags.unwrap_or(libc::O_RDWR as u32);
    if got & RESTORED_FLAGS == want & RESTORED_FLAGS {
        return Ok(());
    }
    Err(format!(
        "is {want:#x} ({}), but the BO exported again gives a dma-buf that is {got:#x} ({}): \
         the BO's one dma-buf file keeps the access mode of its first export (a KFD BO's is \
         read-write exactly when the BO is writable; a render BO exported read-write for \
         another holder first stays read-write), so the export cannot reproduce the dumped \
         file; not restoring it otherwise",
        flag_words(want),
        flag_words(got),
    ))
}

/// The dump's dma-buf fds whose BO's holder was not saved yet.
#[derive(Debug, Default)]
pub(crate) struct PendingDmabufs(Vec<DmabufFd>);

/// What became of a dma-buf fd at [`PendingDmabufs::resolve`].
#[derive(Debug)]
pub(crate) enum Resolved {
    /// Its record, to write.
    Image(FileId, DmabufImage),
    /// It cannot be saved: the process, and why in words naming the fd.
    Refused(i32, String),
}

impl PendingDmabufs {
    pub fn push(&mut self, d: DmabufFd) {
        self.0.push(d);
    }

    /// The dma-bufs whose holder `shared` now knows, taken out: their
    /// records (with the user gpu_id `user_of` gives a host GPU of the
    /// process), or why they cannot be saved.
    pub fn resolve(
        &mut self,
        shared: &SharedBos,
        user_of: impl Fn(i32, GpuId) -> GpuId,
    ) -> Vec<Resolved> {
        let mut out = Vec::new();
        self.0.retain(|d| match resolve_one(d, shared, &user_of) {
            None => true,
            Some(r) => {
                out.push(r);
                false
            }
        });
        out
    }

    /// The first dma-buf still waiting (at the end of the dump: its BO is
    /// held by no file the dump saved).
    pub fn first(&self) -> Option<&DmabufFd> {
        self.0.first()
    }
}

/// One dma-buf against the claimed BOs; `None`: its holder is not known
/// yet.
fn resolve_one(
    d: &DmabufFd,
    shared: &SharedBos,
    user_of: &impl Fn(i32, GpuId) -> GpuId,
) -> Option<Resolved> {
    let h: Holder = shared.holder_at(d.gpu, d.offset)?;
    let file = h.file?;
    if h.pid != d.pid {
        return Some(Resolved::Refused(
            d.pid,
            format!(
            "{d}: the BO is held by {h}, another process: criu-rocm restores a dma-buf fd only \
             from a BO its own process' files hold; not dumping what could not be restored as \
             it was"
        ),
        ));
    }
    if h.size != d.size {
        return Some(Resolved::Refused(
            d.pid,
            format!(
            "{d}: the BO at that offset is {h}, of another size: not one BO as far as the dump \
             can tell; not dumping what could not be restored as it was"
        ),
        ));
    }
    let gem_handle = match h.held_in {
        HeldIn::Render { handle, .. } => handle,
        HeldIn::Kfd { .. } => 0,
    };
    let msg = CriuDmabufNode {
        gem_handle,
        bo_file: Some(file.0),
        bo_index: Some(h.index),
        gpu_id: Some(user_of(d.pid, d.gpu).0),
        size: Some(d.size),
        file_flags: Some(d.flags),
    };
    log::info!("pid {}: {d}: saved as BO {} of {h}", d.pid, h.index);
    Some(Resolved::Image(d.id, DmabufImage { msg }))
}

/// The refusal of a dma-buf whose BO no file of the dump holds.
pub(crate) fn unheld(d: &DmabufFd) -> String {
    format!(
        "{d}: no file this dump saves holds its BO (a BO only the dma-buf keeps, or one of a \
         process outside the dump): criu-rocm restores a dma-buf fd by exporting its BO again \
         from the restored holder; not dumping what could not be restored as it was"
    )
}

/// The refusal of a dma-buf of no GPU of this host.
pub(crate) fn foreign(task_fd: RawFd, id: FileId, said: &str) -> String {
    format!(
        "fd {task_fd} (dma-buf, file {id}) is not a BO of any GPU of this host \
         ({said}): criu-rocm saves dma-bufs of GPU BOs only; not dumping what could not be \
         restored as it was"
    )
}

/// A CPU mapping of a dma-buf, a line of `/proc/PID/maps` whose file is
/// one (issue 29): CRIU would take it for shared memory and fail at it
/// (it cannot open the mapping through `/proc/PID/map_files`), and
/// criu-rocm cannot restore one yet, so the dump refuses it first
/// ([`mapping_held`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DmabufMapping {
    /// The address range as the maps line writes it (`start-end`, hex).
    pub range: String,
    /// Its permissions (`rw-s`).
    pub perms: String,
    /// Its file offset: on amdgpu the BO's mmap offset plus the offset
    /// into the dma-buf (the GEM PRIME mmap adds the BO's offset).
    pub offset: u64,
    /// The dma-buf's device (major, minor) and inode number.
    pub dev: (u32, u32),
    pub ino: u64,
}

/// The dma-buf mappings among the lines of a `/proc/PID/maps` text.
pub(crate) fn dmabuf_mappings(maps: &str) -> Vec<DmabufMapping> {
    maps.lines().filter_map(dmabuf_mapping).collect()
}

/// One maps line (`start-end perms offset major:minor inode path`), when
/// its file is a dma-buf.
fn dmabuf_mapping(line: &str) -> Option<DmabufMapping> {
    let mut rest = line;
    let mut field = || {
        let t = rest.trim_start();
        let end = t.find(char::is_whitespace).unwrap_or(t.len());
        let (f, r) = t.split_at(end);
        rest = r;
        f
    };
    let (range, perms, offset, dev, ino) = (field(), field(), field(), field(), field());
    if !is_dmabuf_link(rest.trim_start().as_bytes()) {
        return None;
    }
    let (major, minor) = dev.split_once(':')?;
    Some(DmabufMapping {
        range: range.to_owned(),
        perms: perms.to_owned(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        ino: ino.parse().ok()?,
    })
}

/// The refusal of a process holding the dma-buf mappings `maps` (not
/// empty): the first is named, with `what` the dma-buf is (its fd and BO,
/// in words), and how many more there are.
pub(crate) fn mapping_held(maps: &[DmabufMapping], what: &str) -> String {
    let m = &maps[0];
    let more = match maps.len() {
        1 => String::new(),
        n => format!(" (and {} more dma-buf mapping(s))", n - 1),
    };
    format!(
        "a CPU mapping {} ({}) of {what} is held{more}: criu-rocm cannot restore a dma-buf \
         mapping yet (CRIU would take it for shared memory, which it cannot read through \
         /proc/PID/map_files); unmap it before the checkpoint; not dumping what could not be \
         restored",
        m.range, m.perms
    )
}

/// Whether `dir` has a dma-buf image of file `id`.
pub(crate) fn has_image(dir: &Path, id: FileId) -> bool {
    dir.join(crate::image::dmabuf_image_name(id)).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::dmabuf::tests::render;

    fn dfd(pid: i32, offset: u64, size: u64) -> DmabufFd {
        DmabufFd {
            pid,
            task_fd: 9,
            id: FileId(0x1f),
            gpu: GpuId(0x3f2c),
            minor: RenderMinor(128),
            offset,
            size,
            flags: libc::O_RDWR as u32,
        }
    }

    #[test]
    fn a_dmabuf_waits_for_its_holder_then_names_it() {
        let mut shared = SharedBos::default();
        let mut p = PendingDmabufs::default();
        p.push(dfd(7, 0x10000, 0x4000));
        let user = |_: i32, g: GpuId| GpuId(g.0 + 1);
        assert!(p.resolve(&shared, user).is_empty(), "no holder yet");
        shared
            .claim(GpuId(0x3f2c), 0x10000, render(7, 5, 2, 0x4000))
            .unwrap();
        let out = p.resolve(&shared, user);
        let [Resolved::Image(id, img)] = out.as_slice() else {
            panic!("{out:?}")
        };
        assert_eq!(*id, FileId(0x1f));
        assert_eq!(img.bo(), (FileId(5), 1));
        assert_eq!(img.msg.gem_handle, 2);
        assert_eq!(img.msg.gpu_id, Some(0x3f2d));
        assert!(p.first().is_none());
    }

    #[test]
    fn a_dmabuf_is_exported_again_with_its_access_mode_and_checked() {
        let (rd, rw, nb) = (
            libc::O_RDONLY as u32,
            libc::O_RDWR as u32,
            libc::O_NONBLOCK as u32,
        );
        assert_eq!(export_access(Some(rd | 0o100000)), 0);
        assert_eq!(export_access(Some(rw | 0o100000)), rw);
        assert_eq!(export_access(None), rw);
        check_restored(rd | 0o100000, Some(rd)).unwrap();
        check_restored(rw | nb | 0o100000, Some(rw | nb)).unwrap();
        check_restored(rw, None).unwrap();
        let e = check_restored(rw, Some(rd)).unwrap_err();
        assert!(e.starts_with("is 0x0 (O_RDONLY), but"), "{e}");
        assert!(e.contains("0x2 (O_RDWR)"), "{e}");
        let e = check_restored(rw, Some(rw | nb)).unwrap_err();
        assert!(e.contains("(O_RDWR|O_NONBLOCK)"), "{e}");
    }

    #[test]
    fn a_bo_is_exported_for_its_other_holders_as_its_dmabuf_fds_were() {
        let dir = crate::image::tests::tempdir();
        let img = |file: u32, flags| DmabufImage {
            msg: CriuDmabufNode {
                gem_handle: 1,
                bo_file: Some(file),
                bo_index: Some(0),
                gpu_id: Some(0x1a2b),
                size: Some(4096),
                file_flags: Some(flags),
            },
        };
        img(7, 0x8000).write(&dir, FileId(0x20)).unwrap();
        img(8, 0x8002).write(&dir, FileId(0x21)).unwrap();
        let modes = export_modes(&dir).unwrap();
        assert_eq!(bo_export_access(&modes, (FileId(7), 0)), 0);
        let rw = libc::O_RDWR as u32;
        assert_eq!(bo_export_access(&modes, (FileId(8), 0)), rw);
        assert_eq!(bo_export_access(&modes, (FileId(7), 1)), rw);
    }

    #[test]
    fn another_process_bo_or_size_is_refused_naming_the_fd() {
        let mut shared = SharedBos::default();
        shared
            .claim(GpuId(0x3f2c), 0x10000, render(8, 5, 1, 0x4000))
            .unwrap();
        shared
            .claim(GpuId(0x3f2c), 0x20000, render(7, 6, 1, 0x2000))
            .unwrap();
        let mut p = PendingDmabufs::default();
        p.push(dfd(7, 0x10000, 0x4000));
        p.push(dfd(7, 0x20000, 0x4000));
        let out = p.resolve(&shared, |_, g| g);
        let words: Vec<String> = out
            .iter()
            .map(|r| match r {
                Resolved::Refused(7, w) => w.clone(),
                Resolved::Refused(..) => panic!("another pid"),
                Resolved::Image(..) => panic!("saved"),
            })
            .collect();
        assert!(
            words[0].starts_with("fd 9 (dma-buf, file 31)"),
            "{}",
            words[0]
        );
        assert!(words[0].contains("another process"), "{}", words[0]);
        assert!(words[1].contains("of another size"), "{}", words[1]);
        assert!(unheld(&dfd(7, 0, 1)).contains("no file this dump saves holds its BO"));
    }

    #[test]
    fn dmabuf_mappings_are_found_in_maps_and_refused_by_range() {
        let maps = "\
00400000-00401000 r-xp 00000000 08:01 1234                               /usr/bin/dmabuf-map
7f0000000000-7f0000010000 rw-s 100000000 00:06 77                        /dev/dri/renderD128
7f1234560000-7f1234570000 rw-s 00000000 00:0e 4242                       /dmabuf:
7f1234580000-7f1234581000 r--s 00001000 00:0e 4242                       /dmabuf:my name
7f12345a0000-7f12345a1000 rw-s 00000000 00:01 99                         /memfd:dmabuf: (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let m = dmabuf_mappings(maps);
        assert_eq!(
            m,
            vec![
                DmabufMapping {
                    range: "7f1234560000-7f1234570000".into(),
                    perms: "rw-s".into(),
                    offset: 0,
                    dev: (0, 0xe),
                    ino: 4242,
                },
                DmabufMapping {
                    range: "7f1234580000-7f1234581000".into(),
                    perms: "r--s".into(),
                    offset: 0x1000,
                    dev: (0, 0xe),
                    ino: 4242,
                },
            ]
        );
        let w = mapping_held(&m, "dma-buf fd 5");
        assert!(
            w.starts_with(
                "a CPU mapping 7f1234560000-7f1234570000 (rw-s) of dma-buf fd 5 is held \
                 (and 1 more dma-buf mapping(s)): criu-rocm cannot restore a dma-buf mapping yet"
            ),
            "{w}"
        );
        assert!(w.contains("unmap it before the checkpoint"), "{w}");
        assert!(!mapping_held(&m[..1], "x").contains("more"));
        assert!(dmabuf_mappings("").is_empty());
    }

    #[test]
    fn dmabuf_links_are_told_by_their_prefix() {
        use std::os::fd::AsFd;
        assert!(is_dmabuf_link(b"/dmabuf:"));
        assert!(is_dmabuf_link(b"/dmabuf:my name"));
        for other in [
            &b"/dev/dri/renderD128"[..],
            b"/memfd:dmabuf: (deleted)",
            b"anon_inode:dmabuf",
            b"/dmabuf",
            b"",
        ] {
            assert!(!is_dmabuf_link(other), "{}", String::from_utf8_lossy(other));
        }
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert!(!is_dmabuf(file.as_fd()));
        assert!(!links_to_dmabuf(Path::new("/proc/self/fd/-1")));
    }
}
