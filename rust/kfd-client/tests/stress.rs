//! Eight clients at once against one kfd-emu daemon.
//!
//! The outer test starts `kfd-emu run --profile mi100x2 -- <this binary> --ignored --exact
//! inner_stress_parent`; the parent then spawns eight `inner_stress_worker` processes at once,
//! requires each to succeed, and afterwards allocates all VRAM of every GPU from a fresh client
//! to show the daemon kept serving and took every byte of the workers' VRAM back. kfd-emu is
//! found as in tests/emu.rs.

mod common;

use common::{run_inner_under_emu, self_args};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kfd_client::queue::SdmaQueue;
use kfd_client::{sdma, topology, KfdClient, MemKind};

const PROFILE: &str = "mi100x2";
const WORKERS: usize = 8;
const BOS_PER_WORKER: usize = 64;

/// Deterministic per-worker pseudo-random numbers (xorshift64), so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn eight_processes_under_emulator() {
    let t0 = Instant::now();
    run_inner_under_emu(PROFILE, "inner_stress_parent");
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "stress took {:?}",
        t0.elapsed()
    );
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_stress_parent() {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|i| {
            Command::new(&exe)
                .args(self_args("inner_stress_worker"))
                .env("STRESS_WORKER", i.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let mut failed = Vec::new();
    for (i, ch) in children.into_iter().enumerate() {
        let out = ch.wait_with_output().expect("wait worker");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() || !text.contains("1 passed") {
            failed.push(format!("worker {i}: {}\n{text}", out.status));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));

    // The daemon still serves a new client, and every byte of the workers' VRAM came back:
    // each GPU's whole VRAM (the topology's size) is available and one BO of that size fits,
    // so a single leaked VRAM BO fails here. Cheap: a BO is a sparse range of the daemon's
    // memfd and only the pages touched below cost memory.
    let t = Instant::now();
    let c = KfdClient::open().unwrap();
    for g in c.gpus() {
        let vram = vram_size(&c, g.node_id);
        assert!(
            vram >= 1 << 30,
            "GPU {:?}: VRAM {vram} from the topology",
            g.gpu_id
        );
        let avail = c.kfd().available_memory(g.gpu_id).unwrap();
        assert_eq!(
            avail, vram,
            "GPU {:?}: VRAM leaked by the workers",
            g.gpu_id
        );
        let bo = c.alloc(g.gpu_id, vram, MemKind::Vram).unwrap();
        assert_eq!(bo.size(), vram);
        assert_eq!(c.kfd().available_memory(g.gpu_id).unwrap(), 0);
        let e = c.alloc(g.gpu_id, 4096, MemKind::Vram).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
        let v = bo.volatile();
        let n = v.len();
        v.subslice(0, 1 << 20).unwrap().fill(0x5a);
        v.subslice(n - (1 << 20), 1 << 20).unwrap().fill(0xa5);
        let mut head = vec![0u8; 1 << 20];
        let mut tail = vec![0u8; 1 << 20];
        v.subslice(0, 1 << 20).unwrap().copy_to(&mut head);
        v.subslice(n - (1 << 20), 1 << 20)
            .unwrap()
            .copy_to(&mut tail);
        assert!(head.iter().all(|&b| b == 0x5a));
        assert!(tail.iter().all(|&b| b == 0xa5));
        bo.free().unwrap();
        assert_eq!(c.kfd().available_memory(g.gpu_id).unwrap(), vram);
    }
    println!(
        "full-VRAM check of {} GPUs: {:?}",
        c.gpus().len(),
        t.elapsed()
    );
}

/// A GPU's VRAM size in bytes: `size_in_bytes` of its first memory bank in the topology.
fn vram_size(c: &KfdClient, node_id: u32) -> u64 {
    let path = c
        .topology_root()
        .join(format!("nodes/{node_id}/mem_banks/0/properties"));
    let text = std::fs::read_to_string(&path).unwrap();
    let props = topology::parse_properties(&path, &text).unwrap();
    props["size_in_bytes"]
}

#[test]
#[ignore = "needs /dev/kfd (run through the outer test or `kfd-emu run`)"]
fn inner_stress_worker() {
    let id: u64 = std::env::var("STRESS_WORKER")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0x1000_0001));
    let c = KfdClient::open().unwrap();
    assert_eq!(c.gpus().len(), 2, "profile {PROFILE} has two GPUs");
    let gpus: Vec<_> = c.gpus().iter().map(|g| g.gpu_id).collect();

    let mut bos = Vec::new();
    for n in 0..BOS_PER_WORKER {
        let gpu = gpus[n % gpus.len()];
        let kind = if rng.next().is_multiple_of(2) {
            MemKind::Vram
        } else {
            MemKind::Gtt
        };
        let size = 4096u64 << (rng.next() % 7); // 4 KiB .. 256 KiB
        let bo = c.alloc(gpu, size, kind).unwrap();
        let seed = (id as u8).wrapping_mul(31).wrapping_add(n as u8);
        let bytes: Vec<u8> = (0..size as usize)
            .map(|i| seed ^ (i as u8).wrapping_mul(13))
            .collect();
        bo.volatile().copy_from(&bytes);
        bos.push((bo, seed));
    }
    for (n, (bo, seed)) in bos.iter().enumerate() {
        let bad = bo
            .to_vec()
            .iter()
            .enumerate()
            .position(|(i, &b)| b != *seed ^ (i as u8).wrapping_mul(13));
        assert_eq!(bad, None, "worker {id} BO {n} ({:?}) corrupted", bo.va());
    }

    // Per GPU: copy a 64 KiB VRAM source to GTT with SDMA a few times, fencing each round.
    for &g in &gpus {
        const SZ: u64 = 64 << 10;
        let src = c.alloc(g, SZ, MemKind::Vram).unwrap();
        let dst = c.alloc(g, SZ, MemKind::Gtt).unwrap();
        let flag = c.alloc(g, 4096, MemKind::Gtt).unwrap();
        let bytes: Vec<u8> = (0..SZ as usize).map(|i| (i as u8) ^ (id as u8)).collect();
        src.volatile().copy_from(&bytes);
        let mut q = SdmaQueue::create(&c, g, 4096).unwrap();
        let (s, d, f) = (src.va().0, dst.va().0, flag.va().0);
        for round in 1..=20u32 {
            q.submit_with(|v| {
                sdma::copy_linear_split(v, s, d, SZ)?;
                sdma::fence(v, f, round)
            })
            .unwrap();
        }
        q.wait_idle(Duration::from_secs(20)).unwrap();
        assert_eq!(dst.to_vec(), src.to_vec(), "worker {id} GPU {g:?} copy");
        let fence = flag.volatile().read_u32(0);
        assert_eq!(fence, 20, "worker {id} GPU {g:?} fence");
        q.destroy().unwrap();
        src.free().unwrap();
        dst.free().unwrap();
        flag.free().unwrap();
    }

    // Free in a shuffled order.
    while !bos.is_empty() {
        let i = (rng.next() % bos.len() as u64) as usize;
        let (bo, _) = bos.swap_remove(i);
        bo.free().unwrap();
    }
}
