//! `make bench`'s CWSR row: how long kfd-emu's PROCESS_INFO takes to stop and save every
//! wave of a busy GPU into the queues' context save areas, against a memcpy of the same bytes
//! measured in the same run.
//!
//! The emulator runs in this process (as its device model tests do: this process is the GPU
//! user). An MI100 gets 8 AQL queues, each with a dispatch of 128 resident waves that hold
//! 128 VGPRs and 128 AccVGPRs each (KFD's largest gfx908 allocation but one) and spin on a
//! flag; once every wave has counted itself in, PROCESS_INFO saves them all (about 66 MB of
//! wave state). Then UNPAUSE, the flag goes up, and every dispatch must complete: a save the
//! queues cannot resume from fails the bench. It reports; a slow result never fails it.

#![allow(clippy::multiple_unsafe_ops_per_block)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kfd_emu::device::uapi::{alloc, criu_op, kfd as nr, queue_type};
use kfd_emu::device::{Emulator, NodeKind};
use kfd_emu::profile::Profile;

#[path = "../tests/model/mod.rs"]
mod model;
use model::{args, kfd_iowr, map_doorbell, map_node, me, queue_args, Table};

const QUEUES: usize = 8;
/// 128 waves of 64 work-items: the waves kfd-emu keeps resident per dispatch.
const GRID: u32 = 128 * 64;
const GROUP: u32 = 256;
/// COMPUTE_PGM_RSRC1.VGPRS 31: 128 VGPRs (and as many AccVGPRs on gfx908), 16 SGPRs.
const RSRC1: u32 = 31;

const CODE_VA: u64 = 0x5000_0000;
const DATA_VA: u64 = 0x5001_0000;
const SIGS_VA: u64 = 0x5002_0000;
const RING_VA: u64 = 0x5010_0000;
const AQ_VA: u64 = 0x5020_0000;
const CTX_VA: u64 = 0x6000_0000;

/// Each wave adds 64 to the counter at kernarg+16, then spins until the flag at kernarg+8
/// is set (llvm-mc-15, gfx908).
const KERNEL: &[u32] = &[
    0xc0060100, 0x00000010, // s_load_dwordx2 s[4:5], s[0:1], 0x10
    0x7e020281, // v_mov_b32_e32 v1, 1
    0x7e000280, // v_mov_b32_e32 v0, 0
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xdd088000, 0x00040100, // global_atomic_add v0, v1, s[4:5]
    0xc00300c0, 0x00000008, // s_load_dword s3, s[0:1], 0x8 glc
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8e0001, // s_sleep 1
    0xbf068003, // s_cmp_eq_u32 s3, 0
    0xbf85fffa, // s_cbranch_scc1 -6 (the load)
    0xbf810000, // s_endpgm
];

struct Gpu {
    emu: Emulator,
    kfd: u64,
    minor: u32,
    gpu_id: u32,
    /// The node's control stack and context save area sizes, which KFD
    /// 1.17 and later require of a queue exactly (libhsakmt computes them).
    ctl: u64,
    ctx_size: u64,
}

fn criu_op_args(op: u32) -> Vec<u8> {
    let mut a = vec![0u8; 56];
    a[48..52].copy_from_slice(&op.to_le_bytes());
    a
}

impl Gpu {
    fn call(&self, n: u32, input: &[u8]) -> Result<Vec<u8>, String> {
        model::call(
            &self.emu,
            self.kfd,
            &me(),
            kfd_iowr(n, input.len()),
            input,
            input.len(),
        )
        .map_err(|e| format!("ioctl {n:#x}: errno {e}"))
    }

    /// A GTT BO at `va`, mapped on the GPU and into this process.
    fn bo(&self, va: u64, size: u64) -> Result<*mut u8, String> {
        let a = args(
            &[
                (0, va),
                (8, size),
                (32, self.gpu_id as u64),
                (36, alloc::GTT as u64),
            ],
            40,
        );
        let out = self.call(nr::ALLOC_MEMORY_OF_GPU, &a)?;
        let handle = u64::from_le_bytes(out[16..24].try_into().expect("8 bytes"));
        let offset = u64::from_le_bytes(out[24..32].try_into().expect("8 bytes"));
        let mut m = vec![0u8; 24];
        m[0..8].copy_from_slice(&handle.to_le_bytes());
        m[8..16].copy_from_slice(&((&self.gpu_id as *const u32) as u64).to_le_bytes());
        m[16..20].copy_from_slice(&1u32.to_le_bytes());
        self.call(nr::MAP_MEMORY_TO_GPU, &m)?;
        let render = NodeKind::Render { minor: self.minor };
        Ok(map_node(&self.emu, render, offset, size as usize))
    }
}

/// Writes `v` at byte `off` of a live mapping.
fn put<T: Copy>(p: *mut u8, off: usize, v: T) {
    // SAFETY: the callers stay inside their mappings.
    unsafe { std::ptr::write_volatile(p.add(off).cast::<T>(), v) }
}

fn get<T: Copy>(p: *mut u8, off: usize) -> T {
    // SAFETY: as in `put`.
    unsafe { std::ptr::read_volatile(p.add(off).cast::<T>()) }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(120);
    while !f() {
        if Instant::now() > end {
            return Err(format!("{what}: not within 120 s"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn setup() -> Result<Gpu, String> {
    let p = Profile::builtin("mi100").map_err(|e| e.to_string())?;
    let fds = Table::default();
    let emu = Emulator::new(&p, Box::new(fds.clone())).map_err(|e| e.to_string())?;
    let (minor, gpu_id) = (p.gpus()[0].drm_render_minor.0, p.gpus()[0].gpu_id.0);
    let props = p.gpus()[0].cwsr_props();
    let ctl = kfd_abi::criu::ctl_stack_size(&props).ok_or("no control stack size for mi100")?;
    let ctx_size = kfd_abi::criu::cwsr_size(&props).ok_or("no save area size for mi100")?;
    let kfd = emu
        .open(&NodeKind::Kfd, &me())
        .map_err(|e| format!("open: {e}"))?;
    let render = emu
        .open(&NodeKind::Render { minor }, &me())
        .map_err(|e| format!("open render: {e}"))?;
    fds.insert(900, render);
    let g = Gpu {
        emu,
        kfd,
        minor,
        gpu_id,
        ctl: ctl.into(),
        ctx_size: ctx_size.into(),
    };
    g.call(nr::ACQUIRE_VM, &args(&[(0, 900), (4, gpu_id as u64)], 8))?;
    Ok(g)
}

/// Loads the kernel, creates the queues and dispatches on each; returns the data and
/// signal mappings.
fn start(g: &Gpu) -> Result<(*mut u8, *mut u8), String> {
    let code = g.bo(CODE_VA, 0x1000)?;
    let data = g.bo(DATA_VA, 0x1000)?;
    let sigs = g.bo(SIGS_VA, 0x1000)?;
    put(code, 16, 256u64);
    put(code, 48, RSRC1);
    put(code, 52, 2u32 << 1);
    put(code, 56, 1u32 << 3);
    for (i, w) in KERNEL.iter().enumerate() {
        put(code, 256 + 4 * i, *w);
    }
    put(data, 16, DATA_VA + 0x100);
    for q in 0..QUEUES {
        let off = q as u64 * 0x1000;
        let ring = g.bo(RING_VA + off, 0x1000)?;
        let aq = g.bo(AQ_VA + off, 0x1000)?;
        let ctx = CTX_VA + q as u64 * g.ctx_size.next_multiple_of(1 << 20);
        g.bo(ctx, g.ctx_size)?;
        for i in 0..64 {
            put(ring, i * 64, 1u32);
        }
        let a = queue_args(
            g.gpu_id,
            queue_type::COMPUTE_AQL,
            (RING_VA + off, 4096),
            (AQ_VA + off + 56, AQ_VA + off + 128),
            Some((ctx, g.ctx_size, g.ctl)),
        );
        let out = g.call(nr::CREATE_QUEUE, &a)?;
        let db = map_doorbell(
            &g.emu,
            u64::from_le_bytes(out[24..32].try_into().expect("8 bytes")),
        );
        put(sigs, 64 * q + 8, 1i64);
        put(ring, 4, GROUP | 1 << 16);
        put(ring, 8, 1u32);
        put(ring, 12, GRID);
        put(ring, 16, 1u32);
        put(ring, 20, 1u32);
        put(ring, 24, 0u64);
        put(ring, 32, CODE_VA);
        put(ring, 40, DATA_VA);
        put(ring, 56, SIGS_VA + 64 * q as u64);
        put(aq, 56, 1u64);
        put(ring, 0, 2u32 | 1 << 16);
        put(db, 0, 0u64);
    }
    Ok((data, sigs))
}

fn best(n: usize, mut f: impl FnMut()) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn run() -> Result<(), String> {
    let g = setup()?;
    let (data, sigs) = start(&g)?;
    let waves = QUEUES * GRID as usize / 64;
    wait_until("every wave counts itself in", || {
        get::<u32>(data, 0x100) as usize == 64 * waves
    })?;
    let t = Instant::now();
    g.call(nr::CRIU_OP, &criu_op_args(criu_op::PROCESS_INFO))?;
    let save = t.elapsed();
    // The bytes the waves take in the save areas: VGPRs, AccVGPRs, SGPRs, HWREGs, TTMPs.
    let a = gfx9::cwsr::Alloc::from_descriptor(gfx9::Target::Gfx908, RSRC1, 0, 0)
        .map_err(|e| e.to_string())?;
    let bytes = waves * gfx9::cwsr::WaveBlock::of(&a).slot_bytes(false);
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let memcpy = best(5, || {
        black_box(&mut dst[..]).copy_from_slice(black_box(&src));
    });
    g.call(nr::CRIU_OP, &criu_op_args(criu_op::UNPAUSE))?;
    put(data, 8, 1u32);
    for q in 0..QUEUES {
        wait_until(&format!("queue {q}'s resumed dispatch completes"), || {
            get::<i64>(sigs, 64 * q + 8) == 0
        })?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "cwsr: PROCESS_INFO of a busy MI100 ({QUEUES} queues x {} waves of 128+128 VGPRs, \
         {:.1} MB of wave state): {:.1} ms to stop and save every wave; memcpy of the same \
         bytes {:.1} ms: {:.1}x memcpy (every dispatch resumed and completed)",
        GRID / 64,
        bytes as f64 / 1e6,
        ms(save),
        ms(memcpy),
        ms(save) / ms(memcpy).max(1e-9)
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cwsr_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
