//! One refusal per test, on a directory laid out as a dump writes it.

use std::path::Path;

use super::digests::{Digests, FILE};
use super::*;
use crate::criu_images::fixtures::{write_files, write_inventory, write_mm, write_pstree};
use crate::criu_images::FileMapping;
use crate::image::tests::{sample_kfd, tempdir, TestDir};
use crate::image::{frame, RenderImage, EXT_VERSION};
use crate::proto::{CriuKfd, CriuRenderNode};

const KFD: FileId = FileId(5);
const RENDER: FileId = FileId(6);
const PID: u32 = 42;
const KFD_NAME: &str = "amdgpu-kfd-5.img";
const RENDER_NAME: &str = "amdgpu-renderD-6.img";
const PAGES0: &str = "amdgpu-pages-5-1a2b.img";

fn bytes_of(size: u64, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn hash(bytes: &[u8], extent: Option<u64>) -> u64 {
    let mut h = crate::pages::ExtentHasher::new(extent);
    h.update(bytes);
    h.finish()
}

/// The image a dump writes for `sample_kfd`'s process, and its pages.
fn dumped_kfd() -> (CriuKfd, Vec<(GpuId, Vec<u8>)>) {
    let mut m = sample_kfd();
    m.pid = PID;
    m.device_entries[1].drm_render_minor = 128;
    m.device_entries[2].drm_render_minor = 129;
    m.priv_bo_record_size = Some(272);
    m.priv_data = vec![0; 8 + 2 * 8 + 3 * 272];
    m.priv_data[0] = 1;
    let b0 = bytes_of(m.bo_entries[0].size, 1);
    let b2 = bytes_of(m.bo_entries[2].size, 2);
    m.bo_entries[0].content_xxh3 = Some(hash(&b0, m.bo_entries[0].content_hash_extent));
    m.bo_entries[2].content_xxh3 = Some(hash(&b2, None));
    (m, vec![(GpuId(0x1a2b), b0), (GpuId(0x5c3d), b2)])
}

fn write_kfd(dir: &Path, m: &CriuKfd) {
    std::fs::write(dir.join(KFD_NAME), frame(&prost::Message::encode_to_vec(m))).unwrap();
}

fn write_digests(dir: &Path) {
    let mut d = Digests::default();
    let bytes = std::fs::read(dir.join(KFD_NAME)).unwrap();
    let image = KfdImage::decode(KFD_NAME, &bytes).unwrap();
    d.add_kfd(KFD, &image);
    d.add_whole(
        RENDER_NAME.into(),
        &std::fs::read(dir.join(RENDER_NAME)).unwrap(),
    );
    std::fs::write(dir.join(FILE), d.encode()).unwrap();
}

/// A directory as criu-rocm dumps one process with two GPUs, a render
/// fd, a BO mapped through its render node and a doorbell through KFD.
fn fixture() -> TestDir {
    let dir = tempdir();
    let (m, pages) = dumped_kfd();
    write_kfd(&dir, &m);
    for (gpu, b) in &pages {
        let mut f = (b.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(b);
        std::fs::write(dir.join(pages_image_name(KFD, *gpu)), f).unwrap();
    }
    RenderImage {
        msg: CriuRenderNode {
            gpu_id: 0x1a2b,
            ..Default::default()
        },
    }
    .write(&dir, RENDER)
    .unwrap();
    write_pstree(&dir, &[PID]);
    write_inventory(&dir, &[crate::criu_images::AMDGPU_PLUGIN]);
    write_files(
        &dir,
        &[KFD.0, RENDER.0],
        &[(20, "/dev/dri/renderD128"), (21, "/dev/kfd")],
    );
    write_mm(&dir, PID, &mappings(&m));
    write_digests(&dir);
    dir
}

/// BO 0 through renderD128, the doorbell BO 1 through /dev/kfd, each at
/// its address and offset (BO 0 in two pieces).
fn mappings(m: &CriuKfd) -> Vec<FileMapping> {
    let (b0, b1) = (&m.bo_entries[0], &m.bo_entries[1]);
    vec![
        FileMapping {
            start: b0.addr,
            end: b0.addr + 0x1000,
            pgoff: b0.offset,
            file: 20,
        },
        FileMapping {
            start: b0.addr + 0x1000,
            end: b0.addr + b0.size,
            pgoff: b0.offset + 0x1000,
            file: 20,
        },
        FileMapping {
            start: b1.addr,
            end: b1.addr + b1.size,
            pgoff: b1.offset,
            file: 21,
        },
    ]
}

fn refusals(dir: &Path, depth: Depth) -> Vec<String> {
    check_dir(dir, depth)
        .unwrap()
        .refusals()
        .map(|r| r.to_string())
        .collect()
}

/// `edit` applied to the KFD image (digests left as dumped unless
/// `redigest`): the first refusal, which must name `want`.
fn refused_after(edit: impl Fn(&mut CriuKfd), redigest: bool, want: &[&str]) -> String {
    let dir = fixture();
    let (mut m, _) = dumped_kfd();
    edit(&mut m);
    write_kfd(&dir, &m);
    if redigest {
        write_digests(&dir);
    }
    let got = refusals(&dir, Depth::Metadata);
    let first = got.first().cloned().unwrap_or_default();
    for w in want {
        assert!(first.contains(w), "{first:?} lacks {w:?} (all: {got:?})");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    first
}

#[test]
fn a_dumped_directory_passes() {
    let dir = fixture();
    for depth in [Depth::Metadata, Depth::Contents] {
        let r = check_dir(&dir, depth).unwrap();
        assert!(r.is_ok(), "{:?}", r.refusals().collect::<Vec<_>>());
        assert_eq!(r.warning, None);
        assert_eq!(r.kfd.len(), 1);
        assert_eq!(r.kfd[0].pid(), Some(PID));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_removed_content_hash_is_refused() {
    let first = refused_after(|m| m.bo_entries[2].content_xxh3 = None, false, &[]);
    assert_eq!(
        first,
        format!(
            "amdgpu-kfd-5.img: GPU 0x5c3d: bo_entries[2].content_xxh3: missing, though the \
             image declares criu-rocm's extension version {EXT_VERSION}, which hashes every BO \
             with contents"
        )
    );
}

#[test]
fn a_flipped_bo_address_bit_is_refused_by_the_mappings() {
    // Digests rewritten too: the process' own mappings still catch it.
    let first = refused_after(|m| m.bo_entries[0].addr ^= 1 << 40, true, &[]);
    assert_eq!(
        first,
        "amdgpu-kfd-5.img: GPU 0x1a2b: bo_entries[0].addr: is 0x710000000000, but the process \
         maps this BO (offset 0x100000000) at 0x700000000000 (mm-42.img), not at its address"
    );
    // The doorbell, mapped through /dev/kfd.
    refused_after(
        |m| m.bo_entries[1].addr ^= 1 << 20,
        true,
        &["bo_entries[1].addr", "GPU 0x1a2b"],
    );
    // A BO the process never mapped: by the digest.
    refused_after(
        |m| m.bo_entries[2].addr ^= 1 << 40,
        false,
        &[KFD_NAME, "but amdgpu-digests.img recorded xxh3:"],
    );
}

#[test]
fn an_edited_bo_offset_or_size_is_refused_by_the_mappings() {
    refused_after(
        |m| m.bo_entries[0].offset ^= 1 << 20,
        true,
        &[KFD_NAME, "GPU 0x1a2b", "bo_entries[0].offset", "renderD128"],
    );
    refused_after(
        |m| m.bo_entries[1].offset ^= 1 << 12,
        true,
        &["bo_entries[1].offset", "/dev/kfd"],
    );
    // A smaller doorbell no longer holds its mapping.
    refused_after(
        |m| m.bo_entries[1].size = 0x1000,
        true,
        &["bo_entries[1].offset"],
    );
}

#[test]
fn counts_that_disagree_with_the_kernel_blob_are_refused() {
    refused_after(
        |m| m.num_of_objects = 2,
        true,
        &[KFD_NAME, "priv_data", "num_of_objects 2"],
    );
    // Upstream's images (no recorded record size): detected sizes.
    refused_after(
        |m| {
            m.priv_bo_record_size = None;
            m.priv_data.truncate(20);
        },
        true,
        &["priv_data"],
    );
}

#[test]
fn pid_and_buffers_are_checked_up_front() {
    refused_after(
        |m| m.pid = 43,
        true,
        &["amdgpu-kfd-5.img: pid: is 43, which is no process of these images"],
    );
    refused_after(
        |m| {
            m.bo_entries.clear();
            m.num_of_bos = 0;
            m.priv_data = vec![0; 24];
        },
        true,
        &["bo_entries: holds no GPU buffer"],
    );
}

#[test]
fn metadata_edits_are_caught_by_the_digest() {
    refused_after(
        |m| m.shared_mem_magic = 1,
        false,
        &[
            "amdgpu-kfd-5.img: hashes to xxh3:",
            "but amdgpu-digests.img recorded xxh3:",
        ],
    );
}

#[test]
fn an_undecodable_kfd_image_is_named_with_its_error() {
    let dir = fixture();
    std::fs::write(dir.join(KFD_NAME), frame(&[0xff; 16])).unwrap();
    let r = check_dir(&dir, Depth::Metadata).unwrap();
    assert_eq!(r.kfd[0].pid(), None);
    let why = r.kfd[0].refusal.as_ref().unwrap().to_string();
    assert!(
        why.starts_with("amdgpu-kfd-5.img: criu_kfd: cannot decode: "),
        "{why}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn render_image_damage_is_refused() {
    let dir = fixture();
    let p = dir.join(RENDER_NAME);
    let mut b = std::fs::read(&p).unwrap();
    b.pop();
    std::fs::write(&p, &b).unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got.iter()
            .any(|r| r.starts_with("amdgpu-renderD-6.img: criu_render_node message: truncated")),
        "{got:?}"
    );
    // A change that still decodes: the digest.
    let mut m = RenderImage::read(&dir, RENDER).unwrap_or(RenderImage {
        msg: CriuRenderNode::default(),
    });
    m.msg.gpu_id = 0x5c3d;
    m.write(&dir, RENDER).unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got.iter().any(|r| r.starts_with("amdgpu-renderD-6.img: ")
            && r.contains("but amdgpu-digests.img recorded")),
        "{got:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deleted_images_are_named() {
    for (name, with_digests, want) in [
        (
            KFD_NAME,
            true,
            "amdgpu-kfd-5.img: missing: amdgpu-digests.img records it",
        ),
        (
            KFD_NAME,
            false,
            "amdgpu-kfd-5.img: missing: files.img holds GPU file 5",
        ),
        (
            RENDER_NAME,
            true,
            "amdgpu-renderD-6.img: missing: amdgpu-digests.img records it",
        ),
        (
            RENDER_NAME,
            false,
            "amdgpu-kfd-6.img (or amdgpu-renderD-6.img): missing: files.img holds GPU file 6",
        ),
        (
            PAGES0,
            true,
            "amdgpu-pages-5-1a2b.img: GPU 0x1a2b: open: No such file",
        ),
    ] {
        let dir = fixture();
        std::fs::remove_file(dir.join(name)).unwrap();
        if !with_digests {
            // An upstream-layout directory: no digests, no extension.
            std::fs::remove_file(dir.join(FILE)).unwrap();
            let (mut m, _) = dumped_kfd();
            m.criu_rocm_ext_version = None;
            if name != KFD_NAME {
                write_kfd(&dir, &m);
            }
        }
        let got = refusals(&dir, Depth::Metadata);
        assert!(got.iter().any(|r| r.starts_with(want)), "{want}: {got:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
    // Only the KFD image left: no GPU state is not "nothing to do".
    let dir = fixture();
    for n in [
        KFD_NAME,
        RENDER_NAME,
        PAGES0,
        "amdgpu-pages-5-5c3d.img",
        FILE,
    ] {
        std::fs::remove_file(dir.join(n)).unwrap();
    }
    let r = check_dir(&dir, Depth::Metadata).unwrap();
    assert!(r.has_gpu_state);
    assert!(!r.is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_digests_file_must_match_the_directory() {
    let dir = fixture();
    std::fs::write(dir.join("amdgpu-renderD-9.img"), b"x").unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got.iter().any(|r| {
            r
            == "amdgpu-renderD-9.img: not written by the dump: amdgpu-digests.img does not list it"
        }),
        "{got:?}"
    );
    std::fs::remove_file(dir.join("amdgpu-renderD-9.img")).unwrap();
    std::fs::remove_file(dir.join(FILE)).unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert_eq!(
        got,
        vec![format!(
            "amdgpu-digests.img: missing, though amdgpu-kfd-5.img declares criu-rocm's \
             extension version {EXT_VERSION}, whose dump records the digest of every GPU image \
             file there"
        )]
    );
    std::fs::write(dir.join(FILE), b"criu-rocm GPU image digests 1\nbad line\n").unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got.iter()
            .any(|r| r.starts_with("amdgpu-digests.img: line 2: ")),
        "{got:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn digests_roundtrip_and_reject_damage() {
    let mut d = Digests::default();
    d.add_whole("amdgpu-kfd-1.img".into(), b"abc");
    let text = d.encode();
    assert_eq!(Digests::parse(&text).unwrap(), d);
    for bad in [
        &b"junk\n"[..],
        b"criu-rocm GPU image digests 1\namdgpu-kfd-1.img 3 xxh3:00\n",
        b"criu-rocm GPU image digests 1\namdgpu-kfd-1.img x xxh3:0000000000000000\n",
        b"criu-rocm GPU image digests 1\n../etc 3 xxh3:0000000000000000\n",
        b"criu-rocm GPU image digests 1\namdgpu-kfd-1.img 3 md5:0000000000000000\n",
        b"criu-rocm GPU image digests 1\namdgpu-kfd-1.img 3 xxh3:0000000000000000",
        b"\xff",
    ] {
        let e = Digests::parse(bad).unwrap_err();
        assert_eq!(e.file, FILE);
    }
}

#[test]
fn upstream_layout_restores_with_one_warning() {
    let dir = fixture();
    let (mut m, _) = dumped_kfd();
    m.criu_rocm_ext_version = None;
    m.priv_bo_record_size = None;
    for b in &mut m.bo_entries {
        b.content_xxh3 = None;
        b.content_hash_extent = None;
    }
    write_kfd(&dir, &m);
    std::fs::remove_file(dir.join(FILE)).unwrap();
    let r = check_dir(&dir, Depth::Contents).unwrap();
    assert!(r.is_ok(), "{:?}", r.refusals().collect::<Vec<_>>());
    let w = r.warning.unwrap();
    assert!(w.contains("carry no integrity data"), "{w}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_contents_are_refused_as_the_restore_words_it() {
    let dir = fixture();
    let p = dir.join(PAGES0);
    let mut b = std::fs::read(&p).unwrap();
    b[8 + 0x15_0000] ^= 1;
    std::fs::write(&p, &b).unwrap();
    assert!(check_dir(&dir, Depth::Metadata).unwrap().is_ok());
    let got = refusals(&dir, Depth::Contents);
    assert_eq!(got.len(), 1, "{got:?}");
    let (m, pages) = dumped_kfd();
    let mut bytes = pages[0].1.clone();
    bytes[0x15_0000] ^= 1;
    let copy = crate::copy::CopyError::HashMismatch {
        file: PAGES0.into(),
        gpu: GpuId(0x1a2b),
        bo: 0,
        addr: crate::ids::GpuVa(m.bo_entries[0].addr),
        size: m.bo_entries[0].size,
        expected: m.bo_entries[0].content_xxh3.unwrap(),
        got: hash(&bytes, m.bo_entries[0].content_hash_extent),
    };
    assert_eq!(got[0], copy.to_string());
    assert!(
        got[0].starts_with(
            "amdgpu-pages-5-1a2b.img: GPU 0x1a2b: bo_entries[0].content_xxh3: the BO at \
             0x700000000000 (2097152 bytes) hashes to"
        ),
        "{}",
        got[0]
    );
    // The size word: refused at the metadata depth already.
    b[..8].copy_from_slice(&1u64.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got[0].starts_with("amdgpu-pages-5-1a2b.img: GPU 0x1a2b: size header: says 1 bytes"),
        "{got:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn device_bos_are_as_kfd_makes_them() {
    // The doorbell BO 1 of GPU 0x1a2b given to the other GPU too.
    refused_after(
        |m| {
            let mut b = m.bo_entries[1].clone();
            b.addr += 0x10_0000;
            b.offset += 0x10_0000;
            m.bo_entries.push(b);
            m.num_of_bos = 4;
            m.priv_data = vec![0; 8 + 2 * 8 + 4 * 272];
        },
        true,
        &[
            "GPU 0x1a2b: bo_entries[3].gpu_id: gives the GPU a second doorbell BO (bo_entries[1] is one)",
        ],
    );
    refused_after(
        |m| {
            m.bo_entries[1].alloc_flags = bo::ALLOC_MMIO_REMAP;
            m.bo_entries[1].size = 0x2000;
        },
        true,
        &["bo_entries[1].size: is 0x2000, but KFD's MMIO remap BO is one page"],
    );
}

#[test]
fn a_render_minor_no_gpu_had_is_refused() {
    refused_after(
        |m| m.device_entries[1].drm_render_minor = 135,
        true,
        &[
            "amdgpu-kfd-5.img: device_entries: no GPU had render minor 128 at dump, but the \
           process maps /dev/dri/renderD128",
        ],
    );
}

#[test]
fn gpu_check_gives_the_restores_first_reason() {
    // An edited hash fails the digest (the restore's reason) before the
    // contents (which gpu-check reads too).
    let dir = fixture();
    let (mut m, _) = dumped_kfd();
    m.bo_entries[0].content_xxh3 = m.bo_entries[0].content_xxh3.map(|h| h ^ 1);
    write_kfd(&dir, &m);
    let meta = refusals(&dir, Depth::Metadata);
    assert_eq!(refusals(&dir, Depth::Contents), meta);
    assert!(meta[0].contains("amdgpu-digests.img recorded"), "{meta:?}");
    // With the digests forged, only the contents tell, and only gpu-check
    // reads them up front (the restore's copy finds the same).
    write_digests(&dir);
    assert!(check_dir(&dir, Depth::Metadata).unwrap().is_ok());
    let got = refusals(&dir, Depth::Contents);
    assert!(
        got[0].contains("bo_entries[0].content_xxh3: the BO at"),
        "{got:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plugin_files_of_other_plugins_are_not_gpu_files() {
    let dir = fixture();
    write_files(
        &dir,
        &[KFD.0, RENDER.0, 77],
        &[(20, "/dev/dri/renderD128"), (21, "/dev/kfd")],
    );
    let got = refusals(&dir, Depth::Metadata);
    assert!(
        got.iter().any(|r| r.starts_with(
            "amdgpu-kfd-77.img (or amdgpu-renderD-77.img): missing: files.img holds GPU file 77"
        )),
        "{got:?}"
    );
    write_inventory(&dir, &[crate::criu_images::AMDGPU_PLUGIN, "cuda_plugin"]);
    assert_eq!(refusals(&dir, Depth::Metadata), Vec::<String>::new());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// More KFD processes than one restore's writer board holds are refused
/// up front (and so by the dump that wrote them), naming the limit.
#[test]
fn more_kfd_processes_than_a_restore_holds_are_refused() {
    let dir = fixture();
    let image = std::fs::read(dir.join(KFD_NAME)).unwrap();
    let limit = |dir: &Path| {
        refusals(dir, Depth::Metadata)
            .into_iter()
            .filter(|r| r.contains("GPU memory writer's board"))
            .collect::<Vec<_>>()
    };
    for id in 1..MAX_KFD_PROCESSES as u32 {
        std::fs::write(dir.join(kfd_image_name(FileId(1000 + id))), &image).unwrap();
    }
    assert_eq!(limit(&dir), Vec::<String>::new());
    std::fs::write(dir.join(kfd_image_name(FileId(999))), &image).unwrap();
    assert_eq!(
        limit(&dir),
        vec![format!(
            "amdgpu-kfd-*.img: {} KFD processes, more than the {MAX_KFD_PROCESSES} one restore \
             brings back (the GPU memory writer's board)",
            MAX_KFD_PROCESSES + 1
        )]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
