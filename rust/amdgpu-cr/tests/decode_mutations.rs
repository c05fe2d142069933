//! Property-style robustness test of the image decoders: thousands of
//! deterministic mutations of valid images (bit flips, byte stores,
//! truncation, insertion, size-word edits) must decode or fail cleanly,
//! never panic, and anything that decodes must survive the topology
//! conversion and match itself.  Complements the cargo-fuzz target in
//! `fuzz/`, which needs a nightly toolchain.
//!
//! The same seeds form the fuzz corpus (`fuzz/corpus/decode_images`);
//! `AMDGPU_CR_WRITE_SEEDS=1 cargo test -p amdgpu-cr --test decode_mutations`
//! rewrites them.

#[path = "../../test-support/rng.rs"]
mod rng;
#[path = "../../test-support/seeds.rs"]
mod seeds;

use std::path::PathBuf;

use amdgpu_cr::env::Checks;
use amdgpu_cr::image::{frame, KfdImage, RenderImage};
use amdgpu_cr::matcher::{match_gpus, MatchError};
use amdgpu_cr::proto::{CriuKfd, CriuRenderNode, DevIolink, KfdBoEntry, KfdDeviceEntry};
use amdgpu_cr::topology::Topology;
use prost::Message;
use rng::Rng;
use seeds::check_seed_corpus;

/// io_links of (type, node_to_id).
fn iolinks(links: &[(u32, u32)]) -> Vec<DevIolink> {
    links
        .iter()
        .map(|&(t, to)| DevIolink {
            r#type: t,
            node_to_id: to,
        })
        .collect()
}

fn gpu(node_id: u32, gpu_id: u32, links: &[(u32, u32)]) -> KfdDeviceEntry {
    KfdDeviceEntry {
        node_id,
        gpu_id,
        simd_count: 304,
        mem_banks_count: 1,
        vendor_id: 0x1002,
        device_id: 0x74a1,
        fw_version: 150,
        capability: 0x2c00_0000,
        drm_render_minor: 128 + node_id,
        vram_size: 192 << 30,
        vram_public: 1,
        iolinks: iolinks(links),
        ..Default::default()
    }
}

fn cpu(node_id: u32, links: &[(u32, u32)]) -> KfdDeviceEntry {
    KfdDeviceEntry {
        node_id,
        cpu_cores_count: 48,
        iolinks: iolinks(links),
        ..Default::default()
    }
}

fn bo(addr: u64, size: u64, gpu_id: u32, flags: u32) -> KfdBoEntry {
    KfdBoEntry {
        addr,
        size,
        offset: addr << 4,
        alloc_flags: flags,
        gpu_id,
        handle: None,
        content_xxh3: Some(addr ^ size),
        // Hashed in extents when larger than one (of 1 MiB here).
        content_hash_extent: (size > 1 << 20).then_some(1 << 20),
        content_extent_xxh3: Vec::new(),
        parent_extents: None,
        parent_bo: None,
    }
}

/// Seeds: a single GPU, and two CPUs with a 2+2 XGMI hive layout.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let single = CriuKfd {
        pid: 1234,
        num_of_gpus: 1,
        num_of_cpus: 1,
        device_entries: vec![cpu(0, &[(2, 1)]), gpu(1, 0x1a2b, &[(2, 0)])],
        num_of_bos: 3,
        bo_entries: vec![
            bo(0x7f00_0000_0000, 0x20_0000, 0x1a2b, 1 | 1 << 31),
            bo(0x7f00_0100_0000, 0x2000, 0x1a2b, 1 << 3),
            bo(0x7f00_0200_0000, 0x1000, 0x1a2b, 2),
        ],
        num_of_objects: 2,
        shared_mem_size: 0,
        shared_mem_magic: 0,
        priv_data: vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        criu_rocm_ext_version: Some(1),
        ..Default::default()
    };
    let hives = CriuKfd {
        pid: 99,
        num_of_gpus: 4,
        num_of_cpus: 2,
        device_entries: vec![
            cpu(0, &[(2, 2), (2, 3)]),
            cpu(1, &[(2, 4), (2, 5)]),
            gpu(2, 0x11, &[(2, 0), (11, 3)]),
            gpu(3, 0x12, &[(2, 0), (11, 2)]),
            gpu(4, 0x21, &[(2, 1), (11, 5)]),
            gpu(5, 0x22, &[(2, 1), (11, 4)]),
        ],
        num_of_bos: 4,
        bo_entries: vec![
            bo(0x1000_0000, 0x1000, 0x11, 1),
            bo(0x2000_0000, 0x1000, 0x12, 2),
            bo(0x3000_0000, 0x1000, 0x21, 1),
            bo(0x4000_0000, 0x1000, 0x22, 4),
        ],
        num_of_objects: 0,
        shared_mem_size: 4096,
        shared_mem_magic: 0xcafe,
        priv_data: vec![1; 40],
        criu_rocm_ext_version: Some(1),
        ..Default::default()
    };
    let render = CriuRenderNode {
        gpu_id: 0x1a2b,
        id: Some(7),
        drm_render_minor: Some(128),
        num_of_bos: Some(0),
        ..Default::default()
    };
    vec![
        ("kfd-single", frame(&single.encode_to_vec())),
        ("kfd-hives", frame(&hives.encode_to_vec())),
        ("render", frame(&render.encode_to_vec())),
    ]
}

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len());
                b[i] = rng.next() as u8;
            }
            2 => {
                let n = rng.below(b.len() + 1);
                b.truncate(n);
            }
            3 => {
                let i = rng.below(b.len() + 1);
                b.insert(i, rng.next() as u8);
            }
            4 if b.len() >= 8 => {
                // Make the size word agree with the (mutated) payload so the
                // protobuf layer, not the framing, sees the damage.
                let n = (b.len() - 8) as u64;
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
            5 if b.len() >= 8 => {
                let v = [0, 1, u64::MAX, 1 << 40, rng.next()][rng.below(5)];
                b[..8].copy_from_slice(&v.to_le_bytes());
            }
            _ if b.len() > 9 => {
                // Splice: duplicate a slice of the payload (repeated fields).
                let s = 8 + rng.below(b.len() - 8);
                let e = (s + rng.below(32)).min(b.len());
                let piece = b[s..e].to_vec();
                let at = 8 + rng.below(b.len() - 8);
                b.splice(at..at, piece);
                let n = (b.len() - 8) as u64;
                b[..8].copy_from_slice(&n.to_le_bytes());
            }
            _ => {}
        }
    }
    b
}

fn exercise(bytes: &[u8]) -> bool {
    let _ = RenderImage::decode("mutant", bytes);
    let Ok(img) = KfdImage::decode("mutant", bytes) else {
        return false;
    };
    let again = KfdImage::decode("mutant", &img.encode()).expect("re-encoded image decodes");
    assert_eq!(again, img);
    let t = Topology::from_image_entries(&img.msg.device_entries).expect("validated entries");
    let _ = t.hives();
    if t.gpus().count() <= 8 {
        match match_gpus(&t, &t, &Checks::default()) {
            Ok(map) => assert_eq!(map.len(), t.gpus().count()),
            Err(MatchError::SearchLimit(_)) => {}
            Err(e) => panic!("image topology does not match itself: {e}"),
        }
    }
    true
}

#[test]
fn mutated_images_never_panic() {
    let seeds = seeds();
    for (name, s) in &seeds {
        if name.starts_with("kfd") {
            assert!(exercise(s), "seed {name} must decode");
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut decoded, mut total) = (0, 0);
    for round in 0..30_000 {
        let (_, seed) = &seeds[round % seeds.len()];
        let m = mutate(&mut rng, seed);
        total += 1;
        if exercise(&m) {
            decoded += 1;
        }
    }
    // Some mutants must survive validation, or the test explores nothing
    // past the framing.
    assert!(decoded > 100, "only {decoded} of {total} mutants decoded");
    assert!(
        decoded < total,
        "every mutant decoded: validation is not exercised"
    );
}

#[test]
fn seed_corpus_is_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode_images");
    check_seed_corpus(&dir, "img", seeds());
}
