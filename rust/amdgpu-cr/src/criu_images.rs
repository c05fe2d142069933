//! The CRIU images the GPU code reads besides its own, so that the GPU
//! images can be checked against the process they belong to: the process
//! tree (`pstree.img`: which pids the images restore), the inventory (does
//! it name the AMD GPU plugin), the files (`files.img`: which files a plugin
//! saved, and the path of every mapped file) and a task's memory map
//! (`mm-<pid>.img`: where the process mapped its GPU buffers).  The format is
//! CRIU's: a `u32` common magic (not in `inventory.img`), the image's `u32`
//! magic, then entries, each a `u32` size and a protobuf message, all little
//! endian.  Only the fields used here are decoded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prost::Message;

/// `IMG_COMMON_MAGIC` of CRIU's `magic.h`.
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `PSTREE_MAGIC` of CRIU's `magic.h`.
const PSTREE_MAGIC: u32 = 0x5027_3030;
/// `INVENTORY_MAGIC`, `FILES_MAGIC` and `MM_MAGIC` of CRIU's `magic.h`.
const INVENTORY_MAGIC: u32 = 0x5831_3116;
const FILES_MAGIC: u32 = 0x5630_3138;
const MM_MAGIC: u32 = 0x5749_2820;
/// The most bytes CRIU's encoding of one VMA can take in `mm-<pid>.img`:
/// a `vma_entry` (`vma.proto`: six 64-bit fields of at most 1 + 10 bytes,
/// four 32-bit ones of at most 1 + 5) = 90 bytes, as field 14 of
/// `mm_entry` (1-byte tag, 1-byte length) = 92; plus an `aio_ring_entry`
/// (at most 1 + 10 + 2 × (1 + 5) = 23 bytes, 25 framed), as an AIO ring is
/// a VMA of its own.
pub const VMA_ENTRY_MAX: u64 = 92 + 25;
/// The most bytes of `mm_entry` besides its VMAs and AIO rings: eleven
/// 64-bit fields (121 bytes), `exe_file_id` (6), the saved auxiliary
/// vector (at most 2 × (24 + 4 + 1) words of 11 bytes, 638), `dumpable`
/// (11) and `thp_disabled` (2): 778, rounded up.
pub const MM_FIXED_MAX: u64 = 1024;
/// The kernel's default `vm.max_map_count` (`DEFAULT_MAX_MAP_COUNT`), when
/// `/proc/sys/vm/max_map_count` cannot be read.
pub const DEFAULT_MAX_MAP_COUNT: u64 = 65530;
/// `fd_types` of CRIU's `fdinfo.proto`: a regular file, a plugin's file.
pub const FD_TYPE_REG: u32 = 1;
pub const FD_TYPE_EXT: u32 = 16;
/// `VMA_AREA_REGULAR` and `VMA_FILE_SHARED` of CRIU's `image.h`.
const VMA_AREA_REGULAR: u32 = 1;
const VMA_FILE_SHARED: u32 = 1 << 7;
/// The name the AMD GPU plugin records in the inventory.
pub const AMDGPU_PLUGIN: &str = "amdgpu_plugin";

/// The part of CRIU's `PstreeEntry` read here.
#[derive(Clone, PartialEq, Message)]
struct PstreeEntry {
    #[prost(uint32, tag = "1")]
    pid: u32,
}

/// The pids of the processes `pstree.img` in `dir` restores; `Ok(None)`
/// when the directory has no `pstree.img`.  Errors (here and below) do not
/// name the file: the caller does.
pub fn pstree_pids(dir: &Path) -> Result<Option<BTreeSet<u32>>, String> {
    let Some(data) = read_image(dir, "pstree.img", None)? else {
        return Ok(None);
    };
    parse_pstree(&data).map(Some)
}

fn parse_pstree(data: &[u8]) -> Result<BTreeSet<u32>, String> {
    let mut pids = BTreeSet::new();
    for entry in entries(data, Some(IMG_COMMON_MAGIC), PSTREE_MAGIC, "process-tree")? {
        let e = PstreeEntry::decode(entry).map_err(|e| format!("an entry: {e}"))?;
        pids.insert(e.pid);
    }
    Ok(pids)
}

/// The entries of a CRIU image: `common` (absent in the inventory), then
/// `magic`, then size-prefixed messages.  `what` names the image kind.
fn entries<'a>(
    data: &'a [u8],
    common: Option<u32>,
    magic: u32,
    what: &str,
) -> Result<Vec<&'a [u8]>, String> {
    let word = |at: usize| -> Option<u32> {
        data.get(at..at.checked_add(4)?)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let mut at = 0;
    if let Some(c) = common {
        if word(0) != Some(c) {
            return Err(format!("not a CRIU {what} image (bad magic)"));
        }
        at = 4;
    }
    if word(at) != Some(magic) {
        return Err(format!("not a CRIU {what} image (bad magic)"));
    }
    at += 4;
    let mut out = Vec::new();
    while at < data.len() {
        let size = word(at).ok_or("a truncated entry size")? as usize;
        at += 4;
        // The only bound an entry needs: CRIU writes and reads entries of
        // any size, and none can be larger than what its file holds.
        let left = data.len() - at;
        if size > left {
            return Err(format!(
                "an entry of {size} bytes at offset {}, but only {left} bytes are left in the file",
                at - 4
            ));
        }
        out.push(&data[at..at + size]);
        at += size;
    }
    Ok(out)
}

/// `vm.max_map_count` of this host: the most VMAs a process can have, so
/// the most CRIU's `mm-<pid>.img` of a process dumped here holds (and the
/// most a restore here can map).
pub fn max_map_count() -> (u64, &'static str) {
    if let Some(n) = crate::testhook::max_map_count() {
        return (n, crate::testhook::MAX_MAP_COUNT_ENV);
    }
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(|n| (n, "vm.max_map_count"))
        .unwrap_or((
            DEFAULT_MAX_MAP_COUNT,
            "the kernel's default vm.max_map_count",
        ))
}

/// The largest `mm-<pid>.img` CRIU writes for a process of `vmas` VMAs.
pub fn mm_image_max(vmas: u64) -> u64 {
    vmas.saturating_mul(VMA_ENTRY_MAX)
        .saturating_add(MM_FIXED_MAX + 12)
}

/// Reads `name` in `dir` whole, allocating no more than its size;
/// `Ok(None)` when it does not exist.  `cap` (bytes, and why) refuses a
/// larger file before anything is read.
fn read_image(
    dir: &Path,
    name: &str,
    cap: Option<(u64, String)>,
) -> Result<Option<Vec<u8>>, String> {
    let path = dir.join(name);
    match crate::image::read_whole(&path, cap.as_ref().map(|(c, _)| *c)) {
        Ok(d) => Ok(Some(d)),
        Err(crate::image::ImageError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(crate::image::ImageError::TooLarge { size, limit, .. }) => Err(format!(
            "size: {size} bytes, more than the {limit} bytes {}",
            cap.map(|(_, why)| why).unwrap_or_default()
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Clone, PartialEq, Message)]
struct PluginsEntry {
    #[prost(string, repeated, tag = "12")]
    plugins: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct InventoryEntry {
    #[prost(message, optional, tag = "12")]
    plugins_entry: Option<PluginsEntry>,
}

/// The plugins `inventory.img` in `dir` names; `Ok(None)` without one.
pub fn inventory_plugins(dir: &Path) -> Result<Option<Vec<String>>, String> {
    let Some(data) = read_image(dir, "inventory.img", None)? else {
        return Ok(None);
    };
    let list = entries(&data, None, INVENTORY_MAGIC, "inventory")?;
    let [one] = list.as_slice() else {
        return Err(format!("{} entries, not one", list.len()));
    };
    let inv = InventoryEntry::decode(*one).map_err(|e| e.to_string())?;
    Ok(Some(
        inv.plugins_entry.map(|p| p.plugins).unwrap_or_default(),
    ))
}

#[derive(Clone, PartialEq, Message)]
struct RegFileEntry {
    #[prost(string, tag = "6")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct FileEntry {
    #[prost(uint32, tag = "1")]
    r#type: u32,
    #[prost(uint32, tag = "2")]
    id: u32,
    #[prost(message, optional, tag = "3")]
    reg: Option<RegFileEntry>,
}

/// What `files.img` says about the files of a dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Files {
    /// Ids of the files a plugin saved (`EXT`), in order.
    pub ext: Vec<u32>,
    /// Id → path of every regular file (mapped files included).
    pub reg: BTreeMap<u32, String>,
}

/// Reads `files.img` in `dir`; `Ok(None)` without one.
pub fn files(dir: &Path) -> Result<Option<Files>, String> {
    let Some(data) = read_image(dir, "files.img", None)? else {
        return Ok(None);
    };
    parse_files(&data).map(Some)
}

fn parse_files(data: &[u8]) -> Result<Files, String> {
    let mut out = Files::default();
    for (i, entry) in entries(data, Some(IMG_COMMON_MAGIC), FILES_MAGIC, "files")?
        .into_iter()
        .enumerate()
    {
        let e = FileEntry::decode(entry).map_err(|e| format!("entry {i}: {e}"))?;
        match e.r#type {
            FD_TYPE_EXT => out.ext.push(e.id),
            FD_TYPE_REG => {
                if let Some(r) = e.reg {
                    out.reg.insert(e.id, r.name);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

#[derive(Clone, PartialEq, Message)]
struct VmaEntry {
    #[prost(uint64, tag = "1")]
    start: u64,
    #[prost(uint64, tag = "2")]
    end: u64,
    #[prost(uint64, tag = "3")]
    pgoff: u64,
    #[prost(uint64, tag = "4")]
    shmid: u64,
    #[prost(uint32, tag = "7")]
    status: u32,
}

#[derive(Clone, PartialEq, Message)]
struct MmEntry {
    #[prost(message, repeated, tag = "14")]
    vmas: Vec<VmaEntry>,
}

/// A shared mapping of a file, from a task's `mm-<pid>.img`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMapping {
    pub start: u64,
    pub end: u64,
    /// Byte offset in the file.
    pub pgoff: u64,
    /// The mapped file's id in `files.img`.
    pub file: u32,
}

/// The VMAs of task `pid` (`mm-<pid>.img` in `dir`); `Ok(None)` without
/// that image.  The image may hold as many VMAs as [`max_map_count`]
/// allows, and no more.
fn read_vmas(dir: &Path, pid: u32) -> Result<Option<Vec<VmaEntry>>, String> {
    let (most, source) = max_map_count();
    let cap = (
        mm_image_max(most),
        format!(
            "that CRIU writes for {most} VMAs ({source}) of at most {VMA_ENTRY_MAX} bytes each"
        ),
    );
    let Some(data) = read_image(dir, &format!("mm-{pid}.img"), Some(cap))? else {
        return Ok(None);
    };
    parse_vmas(&data, (most, source)).map(Some)
}

/// The shared file mappings of task `pid` (`mm-<pid>.img` in `dir`);
/// `Ok(None)` without that image.
pub fn shared_file_mappings(dir: &Path, pid: u32) -> Result<Option<Vec<FileMapping>>, String> {
    Ok(read_vmas(dir, pid)?.map(shared_of))
}

/// The address ranges `[start, end)` of every mapping of task `pid`
/// (`mm-<pid>.img` in `dir`); `Ok(None)` without that image.
pub fn vmas(dir: &Path, pid: u32) -> Result<Option<Vec<(u64, u64)>>, String> {
    Ok(read_vmas(dir, pid)?.map(|vmas| {
        vmas.into_iter()
            .filter(|v| v.end > v.start)
            .map(|v| (v.start, v.end))
            .collect()
    }))
}

/// The VMAs of an `mm-<pid>.img`, which may hold at most `most` of them
/// (`source` names that limit).
fn parse_vmas(data: &[u8], (most, source): (u64, &str)) -> Result<Vec<VmaEntry>, String> {
    let list = entries(data, Some(IMG_COMMON_MAGIC), MM_MAGIC, "memory map")?;
    let [one] = list.as_slice() else {
        return Err(format!("{} entries, not one", list.len()));
    };
    let mm = MmEntry::decode(*one).map_err(|e| e.to_string())?;
    if mm.vmas.len() as u64 > most {
        return Err(format!(
            "vmas: {} VMAs, more than the {most} a process can have ({source})",
            mm.vmas.len()
        ));
    }
    Ok(mm.vmas)
}

/// The shared file mappings of an `mm-<pid>.img` (at most `limit` VMAs).
#[cfg(test)]
fn parse_mm(data: &[u8], limit: (u64, &str)) -> Result<Vec<FileMapping>, String> {
    Ok(shared_of(parse_vmas(data, limit)?))
}

/// The shared mappings of files among `vmas`.
fn shared_of(vmas: Vec<VmaEntry>) -> Vec<FileMapping> {
    vmas.into_iter()
        .filter(|v| {
            v.status & VMA_AREA_REGULAR != 0 && v.status & VMA_FILE_SHARED != 0 && v.end > v.start
        })
        .filter_map(|v| {
            Some(FileMapping {
                start: v.start,
                end: v.end,
                pgoff: v.pgoff,
                file: u32::try_from(v.shmid).ok()?,
            })
        })
        .collect()
}

/// Writers of the CRIU images read here, for tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub(crate) fn image(common: Option<u32>, magic: u32, msgs: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(c) = common {
            out.extend_from_slice(&c.to_le_bytes());
        }
        out.extend_from_slice(&magic.to_le_bytes());
        for m in msgs {
            out.extend_from_slice(&(m.len() as u32).to_le_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    pub(crate) fn write_pstree(dir: &Path, pids: &[u32]) {
        let msgs: Vec<Vec<u8>> = pids
            .iter()
            .map(|&pid| PstreeEntry { pid }.encode_to_vec())
            .collect();
        std::fs::write(
            dir.join("pstree.img"),
            image(Some(IMG_COMMON_MAGIC), PSTREE_MAGIC, &msgs),
        )
        .unwrap();
    }

    pub(crate) fn write_inventory(dir: &Path, plugins: &[&str]) {
        let inv = InventoryEntry {
            plugins_entry: Some(PluginsEntry {
                plugins: plugins.iter().map(|p| p.to_string()).collect(),
            }),
        };
        std::fs::write(
            dir.join("inventory.img"),
            image(None, INVENTORY_MAGIC, &[inv.encode_to_vec()]),
        )
        .unwrap();
    }

    /// `files.img` with plugin files `ext` and regular files `reg`.
    pub(crate) fn write_files(dir: &Path, ext: &[u32], reg: &[(u32, &str)]) {
        let mut msgs = Vec::new();
        for &id in ext {
            msgs.push(
                FileEntry {
                    r#type: FD_TYPE_EXT,
                    id,
                    reg: None,
                }
                .encode_to_vec(),
            );
        }
        for &(id, name) in reg {
            msgs.push(
                FileEntry {
                    r#type: FD_TYPE_REG,
                    id,
                    reg: Some(RegFileEntry { name: name.into() }),
                }
                .encode_to_vec(),
            );
        }
        std::fs::write(
            dir.join("files.img"),
            image(Some(IMG_COMMON_MAGIC), FILES_MAGIC, &msgs),
        )
        .unwrap();
    }

    /// `mm-<pid>.img` with shared file mappings `maps`.
    pub(crate) fn write_mm(dir: &Path, pid: u32, maps: &[FileMapping]) {
        let mm = MmEntry {
            vmas: maps
                .iter()
                .map(|m| VmaEntry {
                    start: m.start,
                    end: m.end,
                    pgoff: m.pgoff,
                    shmid: u64::from(m.file),
                    status: VMA_AREA_REGULAR | VMA_FILE_SHARED,
                })
                .collect(),
        };
        std::fs::write(
            dir.join(format!("mm-{pid}.img")),
            image(Some(IMG_COMMON_MAGIC), MM_MAGIC, &[mm.encode_to_vec()]),
        )
        .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::image;
    use super::*;

    /// pstree.img of one process (pid 33, threads 33, 38, 39) as CRIU
    /// 4.2.1 wrote it.
    const ONE: [u8; 26] = [
        0x19, 0x43, 0x56, 0x54, 0x30, 0x30, 0x27, 0x50, 0x0e, 0x00, 0x00, 0x00, 0x08, 0x21, 0x10,
        0x00, 0x18, 0x21, 0x20, 0x21, 0x28, 0x21, 0x28, 0x26, 0x28, 0x27,
    ];

    #[test]
    fn criu_pstree_images_read() {
        assert_eq!(parse_pstree(&ONE).unwrap(), BTreeSet::from([33]));
        let mut two = ONE.to_vec();
        two.extend_from_slice(&[4, 0, 0, 0, 0x08, 0x22, 0x10, 0x21]);
        assert_eq!(parse_pstree(&two).unwrap(), BTreeSet::from([33, 34]));
        assert!(parse_pstree(&ONE[..20])
            .unwrap_err()
            .contains("only 8 bytes are left in the file"));
        let mut bad = ONE;
        bad[4] ^= 1;
        assert!(parse_pstree(&bad).unwrap_err().contains("magic"));
        let d = crate::image::tests::tempdir();
        assert_eq!(pstree_pids(&d).unwrap(), None);
        std::fs::write(d.join("pstree.img"), ONE).unwrap();
        assert_eq!(pstree_pids(&d).unwrap(), Some(BTreeSet::from([33])));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn inventory_files_and_mm_read() {
        let d = crate::image::tests::tempdir();
        assert_eq!(inventory_plugins(&d).unwrap(), None);
        assert_eq!(files(&d).unwrap(), None);
        assert_eq!(shared_file_mappings(&d, 5).unwrap(), None);
        let inv = InventoryEntry {
            plugins_entry: Some(PluginsEntry {
                plugins: vec![AMDGPU_PLUGIN.into()],
            }),
        };
        std::fs::write(
            d.join("inventory.img"),
            image(None, INVENTORY_MAGIC, &[inv.encode_to_vec()]),
        )
        .unwrap();
        assert_eq!(
            inventory_plugins(&d).unwrap(),
            Some(vec![AMDGPU_PLUGIN.to_string()])
        );
        let f = |t, id, name: Option<&str>| {
            FileEntry {
                r#type: t,
                id,
                reg: name.map(|n| RegFileEntry { name: n.into() }),
            }
            .encode_to_vec()
        };
        std::fs::write(
            d.join("files.img"),
            image(
                Some(IMG_COMMON_MAGIC),
                FILES_MAGIC,
                &[
                    f(FD_TYPE_REG, 3, Some("/dev/kfd")),
                    f(FD_TYPE_EXT, 7, None),
                    f(2, 8, None),
                ],
            ),
        )
        .unwrap();
        let got = files(&d).unwrap().unwrap();
        assert_eq!(got.ext, vec![7]);
        assert_eq!(got.reg, BTreeMap::from([(3, "/dev/kfd".to_string())]));
        let v = |start, pgoff, status| VmaEntry {
            start,
            end: start + 0x1000,
            pgoff,
            shmid: 3,
            status,
        };
        let mm = MmEntry {
            vmas: vec![
                v(0x1000, 0x5000, VMA_AREA_REGULAR | VMA_FILE_SHARED),
                v(0x2000, 0, VMA_AREA_REGULAR | (1 << 6)),
            ],
        };
        std::fs::write(
            d.join("mm-5.img"),
            image(Some(IMG_COMMON_MAGIC), MM_MAGIC, &[mm.encode_to_vec()]),
        )
        .unwrap();
        assert_eq!(
            shared_file_mappings(&d, 5).unwrap().unwrap(),
            vec![FileMapping {
                start: 0x1000,
                end: 0x2000,
                pgoff: 0x5000,
                file: 3
            }]
        );
        std::fs::write(d.join("mm-6.img"), b"junk").unwrap();
        assert!(shared_file_mappings(&d, 6).unwrap_err().contains("magic"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[cfg(test)]
mod large {
    use super::fixtures::image;
    use super::*;

    /// CRIU's whole `vma_entry`, every field written as CRIU writes it
    /// (proto2 `required`: present even when zero).
    #[derive(Clone, PartialEq, Message)]
    pub(super) struct FullVma {
        #[prost(uint64, required, tag = "1")]
        pub start: u64,
        #[prost(uint64, required, tag = "2")]
        pub end: u64,
        #[prost(uint64, required, tag = "3")]
        pub pgoff: u64,
        #[prost(uint64, required, tag = "4")]
        pub shmid: u64,
        #[prost(uint32, required, tag = "5")]
        pub prot: u32,
        #[prost(uint32, required, tag = "6")]
        pub flags: u32,
        #[prost(uint32, required, tag = "7")]
        pub status: u32,
        #[prost(sint64, required, tag = "8")]
        pub fd: i64,
        #[prost(uint64, optional, tag = "9")]
        pub madv: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        pub fdflags: Option<u32>,
    }

    #[derive(Clone, PartialEq, Message)]
    struct FullMm {
        #[prost(message, repeated, tag = "14")]
        vmas: Vec<FullVma>,
    }

    /// A task's memory map as CRIU writes it for a process with `n`
    /// anonymous private read-write mappings and one shared mapping of
    /// file 3.
    fn mm_of(n: u64) -> Vec<u8> {
        let anon = |i: u64| FullVma {
            start: 0x7f00_0000_0000 + 2 * i * 0x1000,
            end: 0x7f00_0000_1000 + 2 * i * 0x1000,
            pgoff: 0,
            shmid: 0,
            prot: 3,
            flags: 0x22,
            status: VMA_AREA_REGULAR | (1 << 5),
            fd: -1,
            madv: None,
            fdflags: None,
        };
        let mut vmas: Vec<FullVma> = (0..n).map(anon).collect();
        vmas.push(FullVma {
            start: 0x1000,
            end: 0x2000,
            pgoff: 0x4000,
            shmid: 3,
            prot: 3,
            flags: 1,
            status: VMA_AREA_REGULAR | VMA_FILE_SHARED,
            fd: -1,
            madv: None,
            fdflags: Some(2),
        });
        image(
            Some(IMG_COMMON_MAGIC),
            MM_MAGIC,
            &[FullMm { vmas }.encode_to_vec()],
        )
    }

    /// 40000 mappings make an mm entry of more than 1 MiB (the issue's
    /// 1241810 bytes); 60000 stay within the default vm.max_map_count.
    #[test]
    fn mm_of_60000_mappings_reads() {
        for n in [40_000, 60_000] {
            let data = mm_of(n);
            assert!(data.len() > 1 << 20, "{} bytes", data.len());
            let maps = parse_mm(&data, (DEFAULT_MAX_MAP_COUNT, "x")).unwrap();
            assert_eq!(maps.len(), 1, "{n} mappings");
            assert_eq!(maps[0].pgoff, 0x4000);
            assert!(data.len() as u64 <= mm_image_max(n + 1));
        }
    }

    /// The bound per VMA is CRIU's largest encoding of one, and a map of
    /// more VMAs than the limit, or a file larger than they can take, is
    /// refused with the limit named.
    #[test]
    fn mm_bounds_come_from_the_writer() {
        let widest = FullVma {
            start: u64::MAX,
            end: u64::MAX,
            pgoff: u64::MAX,
            shmid: u64::MAX,
            prot: u32::MAX,
            flags: u32::MAX,
            status: u32::MAX,
            fd: i64::MIN,
            madv: Some(u64::MAX),
            fdflags: Some(u32::MAX),
        };
        let mm = FullMm { vmas: vec![widest] };
        assert_eq!(mm.encoded_len() as u64, 92, "one VMA in mm_entry");
        let data = mm_of(100);
        let e = parse_mm(&data, (100, "vm.max_map_count")).unwrap_err();
        assert_eq!(
            e,
            "vmas: 101 VMAs, more than the 100 a process can have (vm.max_map_count)"
        );
        let d = crate::image::tests::tempdir();
        std::fs::write(d.join("mm-7.img"), mm_of(100)).unwrap();
        assert_eq!(shared_file_mappings(&d, 7).unwrap().unwrap().len(), 1);
        let big = vec![0u8; mm_image_max(max_map_count().0) as usize + 1];
        std::fs::write(d.join("mm-8.img"), big).unwrap();
        let e = shared_file_mappings(&d, 8).unwrap_err();
        assert!(e.contains("bytes each"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// An entry is bounded by the bytes left in its file, whatever its size.
    #[test]
    fn entry_larger_than_its_file_is_refused() {
        let mut data = mm_of(10);
        data.truncate(data.len() - 1);
        let e = parse_mm(&data, (DEFAULT_MAX_MAP_COUNT, "x")).unwrap_err();
        assert!(e.contains("bytes are left in the file"), "{e}");
    }
}
