//! The cargo-fuzz target `validate_dir` as a plain test, so it runs in
//! `cargo test` without a nightly toolchain: the seed corpus
//! (`fuzz/corpus/validate_dir`) and a few thousand seeded mutations of it
//! go through the validation path of a restore (`gpu-check`'s) as whole
//! image directories.  Every input must give verdicts without a panic, and
//! no single allocation may exceed [`ALLOC_CAP`]: sizes read from an image
//! (size words, BO sizes, counts) must never drive an allocation.
//!
//! The same for the target `validate_privdata`: KFD's private data alone
//! (`fuzz/corpus/validate_privdata`), whose validation must refuse what
//! KFD never writes and never panic.
//!
//! `AMDGPU_CR_WRITE_SEEDS=1 cargo test -p amdgpu-cr --test validate_fuzz`
//! rewrites the seed corpora.

// `fuzz_host` is the fuzz targets'.
#[allow(dead_code)]
#[path = "../fuzz/harness.rs"]
mod harness;
#[path = "../../test-support/rng.rs"]
mod rng;
#[path = "../../test-support/scratch.rs"]
mod scratch;
#[path = "../../test-support/seeds.rs"]
mod seeds;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use amdgpu_cr::image::frame;
use amdgpu_cr::pages::ExtentHasher;
use amdgpu_cr::proto::{CriuKfd, CriuRenderNode, KfdBoEntry};
use amdgpu_cr::topology::Topology;
use harness::{check_privdata, pack, validate_dir, Host, HOST_GPU, PRIV_BO};
use prost::Message;
use rng::Rng;
use scratch::scratch_dir;
use seeds::check_seed_corpus;

/// The largest single allocation the validation may make for inputs of a
/// few KiB: its fixed buffers (1 MiB for reading pages files) and the
/// image itself, never a size taken from the bytes.
const ALLOC_CAP: usize = 8 << 20;

/// Counts the largest allocation request of the test process.
struct Tracking;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

const PID: u32 = 4242;
const VRAM: u32 = 1;
const GTT: u32 = 2;
const DOORBELL: u32 = 1 << 3;
const WRITABLE: u32 = 1 << 31;

/// CRIU's pstree.img with one process.
fn pstree(pids: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x5456_4319u32.to_le_bytes());
    out.extend_from_slice(&0x5027_3030u32.to_le_bytes());
    for &pid in pids {
        let entry = [0x08, pid as u8 | 0x80, (pid >> 7) as u8];
        assert!(pid >> 14 == 0);
        out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        out.extend_from_slice(&entry);
    }
    out
}

/// A restorable image directory for `host` (KFD image, pages file,
/// render-node image, pstree), as an input; `second` adds a second KFD
/// process (pid + 1) with file id -2 (2^32 - 2); `compressed` writes the
/// pages file with zstd (`KFD_COMPRESS=zstd`).
fn seed(host: &Host, second: bool, compressed: bool) -> Vec<u8> {
    let topo = Topology::parse_sysfs(&host.opts.sysfs_nodes).unwrap();
    let gpu = amdgpu_cr::ids::GpuId(HOST_GPU);
    let entries = topo
        .to_image_entries(&[(gpu, gpu)].into_iter().collect())
        .unwrap();
    let contents: Vec<Vec<u8>> = vec![
        (0..8192u32).map(|i| (i * 7 + 3) as u8).collect(),
        (0..4096u32).map(|i| (i ^ 0x5a) as u8).collect(),
    ];
    let hash = |b: &[u8]| {
        let mut h = ExtentHasher::new(None);
        h.update(b);
        h.finish()
    };
    let bo = |addr: u64, flags: u32, data: Option<&Vec<u8>>| KfdBoEntry {
        addr,
        size: data.map_or(4096, |d| d.len() as u64),
        offset: 0x1_0000_0000 + addr,
        alloc_flags: flags,
        gpu_id: HOST_GPU,
        handle: None,
        content_xxh3: data.map(|d| hash(d)),
        content_hash_extent: None,
        content_extent_xxh3: Vec::new(),
        parent_extents: None,
        parent_bo: None,
    };
    let kfd = CriuKfd {
        pid: PID,
        num_of_gpus: 1,
        num_of_cpus: 1,
        device_entries: entries,
        num_of_bos: 3,
        bo_entries: vec![
            bo(0x7f00_0000_0000, VRAM | WRITABLE, Some(&contents[0])),
            bo(0x7f00_0001_0000, GTT | WRITABLE, Some(&contents[1])),
            bo(0x7f00_0002_0000, DOORBELL, None),
        ],
        num_of_objects: 1,
        shared_mem_size: 0,
        shared_mem_magic: 0,
        // The kernel's blob as KFD lays it out: process (version 1) and device records,
        // three 272-byte BO records, one event object (type 1, 64 bytes).
        priv_data: {
            let mut p = vec![0u8; 8 + 8 + 3 * 272 + 64];
            p[0] = 1;
            p[832..836].copy_from_slice(&1u32.to_le_bytes());
            p
        },
        criu_rocm_ext_version: Some(amdgpu_cr::image::EXT_VERSION),
        priv_bo_record_size: Some(272),
        criu_rocm_reopen: None,
        shared_mem_mode: None,
        semaphore_mode: None,
        pages_compression: compressed.then_some(1),
        pages_compression_level: compressed.then_some(3),
        criu_rocm_parent: None,
        pages_compression_chunk: compressed.then_some(2 << 20),
        criu_rocm_imports: Vec::new(),
    };
    // The second process (a task holds one KFD process): another pid.
    let kfd2 = frame(
        &CriuKfd {
            pid: PID + 1,
            ..kfd.clone()
        }
        .encode_to_vec(),
    );
    let kfd = frame(&kfd.encode_to_vec());
    let mut pages = ((8192 + 4096) as u64).to_le_bytes().to_vec();
    pages.extend_from_slice(&contents[0]);
    pages.extend_from_slice(&contents[1]);
    if compressed {
        let dir = scratch_dir("validate-seed-zstd");
        let (id, gpu) = (amdgpu_cr::image::FileId(0), amdgpu_cr::ids::GpuId(HOST_GPU));
        let c = amdgpu_cr::pages::Compress {
            level: 3,
            threads: None,
        };
        let bos = [(0, 8192), (1, 4096)];
        let mut w =
            amdgpu_cr::pages::PagesWriter::create_compressed(dir.path(), id, gpu, &bos, c).unwrap();
        std::io::Write::write_all(&mut w, &pages[8..]).unwrap();
        w.finish().unwrap();
        pages =
            std::fs::read(dir.path().join(amdgpu_cr::pages::pages_image_name(id, gpu))).unwrap();
    }
    let render = frame(
        &CriuRenderNode {
            gpu_id: HOST_GPU,
            id: None,
            drm_render_minor: Some(128),
            num_of_bos: None,
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let tree = pstree(if second { &[PID, PID + 1] } else { &[PID] });
    let mut files: Vec<(u8, &[u8])> = vec![(0, &kfd), (1, &pages), (2, &render), (3, &tree)];
    if second {
        files.extend([(4, &kfd2[..]), (5, &pages[..]), (6, &render[..])]);
    }
    pack(&files)
}

fn seeds(host: &Host) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("one", seed(host, false, false)),
        ("two", seed(host, true, false)),
        ("zstd", seed(host, false, true)),
    ]
}

/// The offsets of the entries of an input: (kind at, data start, data end).
fn entries(b: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= b.len() {
        let len = u32::from_le_bytes(b[at + 1..at + 5].try_into().unwrap()) as usize;
        let end = (at + 5).saturating_add(len).min(b.len());
        out.push((at, at + 5, end));
        at = end;
    }
    out
}

/// Damages one file of the input, or the archive's layout.
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    let es = entries(&b);
    if es.is_empty() {
        return b;
    }
    let (k, s, e) = es[rng.below(es.len())];
    // Aim at the first 64 bytes of a file half of the time: size words and
    // the protobuf fields that come first.
    let pick = |rng: &mut Rng| {
        let span = if rng.below(2) == 0 {
            (e - s).min(64)
        } else {
            e - s
        };
        s + rng.below(span)
    };
    match rng.below(9) {
        0 if e > s => {
            let i = pick(rng);
            b[i] ^= 1 << rng.below(8);
        }
        1 if e > s => {
            let i = pick(rng);
            b[i] = rng.next() as u8;
        }
        2 if e >= s + 8 => {
            // A file's size word: small and huge edits.
            let v = u64::from_le_bytes(b[s..s + 8].try_into().unwrap());
            let nv = [
                v.wrapping_add(1),
                v.wrapping_sub(1),
                0,
                u64::MAX,
                1 << 40,
                v << 1,
            ][rng.below(6)];
            b[s..s + 8].copy_from_slice(&nv.to_le_bytes());
        }
        3 => {
            // Truncate a file (its length word follows).
            let cut = rng.below(e - s + 1);
            b.drain(s + cut..e);
            b[k + 1..k + 5].copy_from_slice(&(cut as u32).to_le_bytes());
        }
        4 => {
            // Delete a file.
            b.drain(k..e);
        }
        5 => {
            // Rename a file: another kind.
            b[k] = rng.next() as u8;
        }
        6 if e > s + 8 => {
            // Insert bytes inside a file, its own size word kept.
            let at = s + 8 + rng.below(e - s - 8);
            let n = 1 + rng.below(16);
            let junk: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            b.splice(at..at, junk);
            let len = (e - s + n) as u32;
            b[k + 1..k + 5].copy_from_slice(&len.to_le_bytes());
        }
        7 => {
            // The archive's own length word.
            let v = [0u32, 1, u32::MAX, rng.next() as u32][rng.below(4)];
            b[k + 1..k + 5].copy_from_slice(&v.to_le_bytes());
        }
        _ => {
            // Duplicate a file under another name.
            let piece = b[k..e].to_vec();
            b.extend_from_slice(&piece);
            let last = b.len() - piece.len();
            b[last] = rng.next() as u8;
        }
    }
    b
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/validate_dir")
}

fn run(host: &Host, input: &[u8], dir: &Path) -> (usize, usize) {
    let v = validate_dir(host, input, dir);
    let ok = v.iter().filter(|e| e.verdict.is_ok()).count();
    (ok, v.len() - ok)
}

#[test]
fn validation_never_panics_and_allocates_within_bounds() {
    let root = scratch_dir("validate-host");
    let host = Host::new(root.path());
    let dir = root.path().join("img");
    // The seeds are restorable: the mutations start deep in the checks.
    for (name, s) in seeds(&host) {
        let v = validate_dir(&host, &s, &dir);
        assert!(
            !v.is_empty() && v.iter().all(|e| e.verdict.is_ok()),
            "seed {name}: {:?}",
            v.iter().map(|e| &e.verdict).collect::<Vec<_>>()
        );
    }
    // Then whatever the corpus holds (inputs kept from fuzzing runs too).
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    for e in std::fs::read_dir(corpus_dir()).unwrap() {
        corpus.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    corpus.sort();
    assert!(
        !corpus.is_empty(),
        "no seed corpus in {}",
        corpus_dir().display()
    );
    LARGEST.store(0, Ordering::Relaxed);
    let mut rng = Rng(0x1405_0000_dead_beef);
    let (mut accepted, mut refused, mut inputs) = (0, 0, 0);
    for round in 0..3000 {
        let base = &corpus[round % corpus.len()];
        // Up to three rounds of damage on top of each other.
        let mut m = mutate(&mut rng, base);
        for _ in 0..rng.below(3) {
            m = mutate(&mut rng, &m);
        }
        let (ok, bad) = run(&host, &m, &dir);
        accepted += ok;
        refused += bad;
        inputs += 1;
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= ALLOC_CAP,
            "an allocation of {largest} bytes for an input of {} bytes",
            m.len()
        );
    }
    eprintln!(
        "{inputs} inputs: {accepted} KFD image(s) accepted, {refused} refused, largest \
         allocation {} bytes",
        LARGEST.load(Ordering::Relaxed)
    );
    assert!(
        LARGEST.load(Ordering::Relaxed) > 0,
        "the allocator counted nothing"
    );
    assert!(
        refused > 1000,
        "only {refused} refusals: the mutations miss"
    );
    assert!(
        accepted > 100,
        "only {accepted} acceptances: the checks are not reached"
    );
}

#[test]
fn seed_corpus_is_current() {
    let root = scratch_dir("validate-seeds");
    let host = Host::new(root.path());
    check_seed_corpus(&corpus_dir(), "bin", seeds(&host));
}

/// Private data as KFD writes it for `check_privdata`'s process: an SDMA
/// queue, an AQL queue with a context save area (the host GPU's 120 CUs:
/// 4096 waves, a 0x9000-byte control stack), a signal event and, with
/// `svm`, an SVM range.
fn privdata_seed(svm: bool) -> Vec<u8> {
    let put32 =
        |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let mut blob = vec![0u8; 8 + 8 + 272];
    put32(&mut blob, 0, 1);
    let ring = PRIV_BO.0;
    for (id, compute) in [(0u32, false), (1, true)] {
        let mut q = vec![0u8; 120];
        put64(&mut q, 8, ring);
        put64(&mut q, 16, 0x1000);
        put64(&mut q, 24, ring + 0x1000);
        put64(&mut q, 32, ring + 0x1008);
        put32(&mut q, 64, HOST_GPU);
        put32(&mut q, 68, if compute { 0 } else { 1 });
        put32(&mut q, 72, u32::from(compute));
        put32(&mut q, 76, id);
        put32(&mut q, 88, id);
        let (mqd, ctl) = if compute {
            put64(&mut q, 56, ring + 0x10_0000);
            put32(&mut q, 104, 0x8_0000);
            (2048, 0x9000)
        } else {
            (512, 0)
        };
        put32(&mut q, 108, ctl);
        put32(&mut q, 112, mqd);
        q.resize(120 + mqd as usize + ctl as usize, 0);
        blob.extend_from_slice(&q);
    }
    let mut e = vec![0u8; 64];
    put32(&mut e, 0, 1);
    put32(&mut e, 16, 1);
    blob.extend_from_slice(&e);
    if svm {
        let mut r = vec![0u8; 24 + 8 * 5];
        put32(&mut r, 0, 2);
        put64(&mut r, 8, 0x10_0000);
        put64(&mut r, 16, 0x2000);
        blob.extend_from_slice(&r);
    }
    let mut file = vec![3 + u8::from(svm)];
    file.extend_from_slice(&blob);
    pack(&[(0, &file)])
}

/// Writes a value KFD's fields are often edited to (0, 1, small and huge
/// numbers, sizes grown by a page or 1 MiB) at an aligned offset of one of
/// the seeds' two queue records (after the archive header, the count byte,
/// the process, device and BO records; the SDMA queue's record and MQD are
/// 632 bytes), where the framing holds and the checks are reached.
fn poke_queue(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    let first = 5 + 1 + 8 + 8 + 272;
    let at = [first, first + 632][rng.below(2)] + 4 * rng.below(30);
    if at + 4 <= b.len() {
        let old = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let v = [0, 1, 2, 5, 0xffff, 1 << 20, u32::MAX, old + 4096, old ^ 1][rng.below(9)];
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

fn privdata_corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/validate_privdata")
}

#[test]
fn private_data_validation_refuses_and_never_panics() {
    let root = scratch_dir("privdata-host");
    let host = Host::new(root.path());
    let dir = root.path().join("img");
    let write = std::env::var_os("AMDGPU_CR_WRITE_SEEDS").is_some();
    let mut corpus = Vec::new();
    for (name, s) in [
        ("queues", privdata_seed(false)),
        ("svm", privdata_seed(true)),
    ] {
        assert_eq!(check_privdata(&host, &s, &dir), Ok(true), "seed {name}");
        let path = privdata_corpus_dir().join(format!("{name}.bin"));
        if write {
            std::fs::create_dir_all(privdata_corpus_dir()).unwrap();
            std::fs::write(&path, &s).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (AMDGPU_CR_WRITE_SEEDS=1 writes it)",
                path.display()
            )
        });
        assert_eq!(
            on_disk,
            s,
            "{} is stale (AMDGPU_CR_WRITE_SEEDS=1)",
            path.display()
        );
    }
    for e in std::fs::read_dir(privdata_corpus_dir()).unwrap() {
        corpus.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    corpus.sort();
    LARGEST.store(0, Ordering::Relaxed);
    let mut rng = Rng(0x3100_0000_feed_f00d);
    let (mut accepted, mut refused, mut unframed) = (0, 0, 0);
    for round in 0..3000 {
        let base = &corpus[round % corpus.len()];
        let mut m = if rng.below(2) == 0 {
            poke_queue(&mut rng, base)
        } else {
            mutate(&mut rng, base)
        };
        for _ in 0..rng.below(3) {
            m = mutate(&mut rng, &m);
        }
        match check_privdata(&host, &m, &dir) {
            Ok(true) => accepted += 1,
            Ok(false) => unframed += 1,
            Err(_) => refused += 1,
        }
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(largest <= ALLOC_CAP, "an allocation of {largest} bytes");
    }
    eprintln!(
        "3000 private data inputs: {accepted} accepted, {refused} refused, {unframed} not \
         framed"
    );
    assert!(refused > 300, "only {refused} refusals: the mutations miss");
    assert!(
        accepted > 100,
        "only {accepted} acceptances: the checks are not reached"
    );
}
