//! End to end: kernels as hipcc writes them (assembled with llvm-mc-15 for gfx90a; the words
//! are committed with their assembly text) run over a `VecMemory`, checked against the host.

mod common;
use common::*;
use gfx9::exec::{CodeCache, Stop};
use gfx9::{Memory, Target, VecMemory, Wave};

/// saxpy(n, a, x, y): y[i] = a * x[i] + y[i] for i < n; kernarg {n: u32, a: f32, x, y}.
const SAXPY: &[u32] = &[
    0xc0060002, 0x00000000, // s_load_dwordx2 s[0:1], s[4:5], 0x0
    0xc00a0202, 0x00000008, // s_load_dwordx4 s[8:11], s[4:5], 0x8
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xd1fd0002, 0x04010c06, // v_lshl_add_u32 v2, s6, 6, v0
    0x7d980400, // v_cmp_gt_u32_e32 vcc, s0, v2
    0xbe82206a, // s_and_saveexec_b64 s[2:3], vcc
    0xbf88000e, // s_cbranch_execz 14
    0x7e060280, // v_mov_b32_e32 v3, 0
    0xd28f0004, 0x00020482, // v_lshlrev_b64 v[4:5], 2, v[2:3]
    0x7e020209, // v_mov_b32_e32 v1, s9
    0x320c0808, // v_add_co_u32_e32 v6, vcc, s8, v4
    0x380e0b01, // v_addc_co_u32_e32 v7, vcc, v1, v5, vcc
    0xdc508000, 0x087f0006, // global_load_dword v8, v[6:7], off
    0xdc508000, 0x090a0004, // global_load_dword v9, v4, s[10:11]
    0xbf8c0f70, // s_waitcnt vmcnt(0)
    0x76121001, // v_fmac_f32_e32 v9, s1, v8
    0xdc708000, 0x000a0904, // global_store_dword v4, v9, s[10:11]
    0xbf810000, // s_endpgm
];

/// sum(x, result): each 128-thread workgroup sums its x[] in LDS across two waves (two
/// barriers) and adds the sum to *result with a global atomic; kernarg {x, result}.
const REDUCE: &[u32] = &[
    0xc00a0002, 0x00000000, // s_load_dwordx4 s[0:3], s[4:5], 0x0
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xd1fd0001, 0x04010e06, // v_lshl_add_u32 v1, s6, 7, v0
    0x24040282, // v_lshlrev_b32_e32 v2, 2, v1
    0xdc508000, 0x03000002, // global_load_dword v3, v2, s[0:1]
    0x24080082, // v_lshlrev_b32_e32 v4, 2, v0
    0x7e0a0280, // v_mov_b32_e32 v5, 0
    0xd81a0200, 0x00000505, // ds_write_b32 v5, v5 offset:512
    0xbf8c0f70, // s_waitcnt vmcnt(0)
    0xd81a0000, 0x00000304, // ds_write_b32 v4, v3
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8a0000, // s_barrier
    0x7d9800c0, // v_cmp_gt_u32_e32 vcc, 64, v0
    0xbe88206a, // s_and_saveexec_b64 s[8:9], vcc
    0xbf880006, // s_cbranch_execz 6
    0xd86e4000, 0x06000004, // ds_read2_b32 v[6:7], v4 offset1:64
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0x680c0f06, // v_add_u32_e32 v6, v6, v7
    0xd8000200, 0x00000605, // ds_add_u32 v5, v6 offset:512
    0x87fe087e, // s_or_b64 exec, exec, s[8:9]
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xbf8a0000, // s_barrier
    0x7d940080, // v_cmp_eq_u32_e32 vcc, 0, v0
    0xbe88206a, // s_and_saveexec_b64 s[8:9], vcc
    0xbf880005, // s_cbranch_execz 5
    0xd86c0200, 0x06000005, // ds_read_b32 v6, v5 offset:512
    0xbf8cc07f, // s_waitcnt lgkmcnt(0)
    0xdd088000, 0x00020605, // global_atomic_add v5, v6, s[2:3]
    0xbf810000, // s_endpgm
];

const KERNARG: u64 = 0x20_0000;
const X: u64 = 0x30_0000;
const Y: u64 = 0x40_0000;

/// A minimal dispatcher for the tests: the waves of one workgroup, interleaved with a small
/// budget, released together from each s_barrier. With `evict_at`, before that slice of
/// budget the live waves (some of them waiting at a barrier) and the LDS go through a
/// context save area (`evict_and_resume`); returns whether they did.
fn run_group(
    mem: &mut VecMemory,
    cache: &mut CodeCache,
    group: u32,
    threads: u32,
    evict_at: Option<usize>,
) -> bool {
    let mut lds = vec![0u8; 4096];
    let mut evicted = false;
    let mut waves: Vec<Wave> = (0..threads.div_ceil(64))
        .map(|w| {
            let mut wave = Wave::new(Target::Gfx90a, CODE);
            wave.set_sgpr64(4, KERNARG);
            wave.sreg[6] = group;
            wave.set_exec(if threads - 64 * w >= 64 {
                u64::MAX
            } else {
                (1 << (threads - 64 * w)) - 1
            });
            for l in 0..64 {
                wave.set_lane(0, l, 64 * w + l as u32);
            }
            wave
        })
        .collect();
    let mut done = vec![false; waves.len()];
    let mut slice = 0;
    while done.iter().any(|d| !d) {
        let mut waiting = vec![false; waves.len()];
        for k in 0..waves.len() {
            if done[k] {
                continue;
            }
            loop {
                if evict_at == Some(slice) {
                    evict_and_resume(&mut waves, &done, &waiting, &mut lds, group);
                    evicted = true;
                }
                slice += 1;
                match waves[k].run(mem, &mut lds, cache, 7) {
                    Stop::Budget => continue,
                    Stop::Barrier => waiting[k] = true,
                    Stop::Endpgm => done[k] = true,
                    other => panic!("group {group} wave {k}: {other}"),
                }
                break;
            }
        }
        let at_barrier = waiting.iter().filter(|w| **w).count();
        assert!(
            at_barrier == 0 || at_barrier == done.iter().filter(|d| !**d).count(),
            "barrier reached by some waves only"
        );
    }
    evicted
}

/// What an eviction with wavefront save and a resume do to a workgroup: its live waves and
/// its LDS saved into a context save area in the CWSR layout, the LDS cleared, the waves
/// rebuilt from the area alone.
fn evict_and_resume(
    waves: &mut [Wave],
    done: &[bool],
    waiting: &[bool],
    lds: &mut [u8],
    group: u32,
) {
    use gfx9::cwsr::{Alloc, SaveArea, SaveWriter};
    const CTL: u32 = 0x1000;
    let t = Target::Gfx90a;
    // REDUCE's allocation: 8 VGPRs (VGPRS 0, ACCUM_OFFSET 1), 16 SGPRs, 4 KiB of LDS.
    let alloc = Alloc::from_descriptor(t, 0, 1, lds.len() as u32).expect("allocation");
    let mut packet = [0u8; 64];
    packet[0] = 2; // kernel dispatch
    packet[4..6].copy_from_slice(&128u16.to_le_bytes());
    packet[6] = 1;
    packet[8] = 1;
    packet[12..16].copy_from_slice(&(128 * (group + 1)).to_le_bytes());
    packet[16] = 1;
    packet[20] = 1;
    let mut area = vec![0u8; CTL as usize + 0x4000];
    let mut w = SaveWriter::new(t, &mut area, CTL).expect("save area");
    w.begin_dispatch(0, packet, alloc, group + 1, group)
        .expect("dispatch");
    let live: Vec<usize> = (0..waves.len()).filter(|&k| !done[k]).collect();
    for (i, &k) in live.iter().enumerate() {
        let l = (i == 0).then_some(&lds[..]);
        w.save(&waves[k], group, k as u8, waiting[k], false, l)
            .expect("save");
    }
    let saved = w.finish().expect("control stack");
    lds.fill(0);
    let sa = SaveArea::open(t, &area, CTL, &saved.control_stack).expect("open");
    for (i, &k) in live.iter().enumerate() {
        let rec = sa.stack().dispatches[0].waves[i];
        assert_eq!(
            (rec.wave_in_group as usize, rec.at_barrier),
            (k, waiting[k])
        );
        waves[k] = sa
            .wave(0, i, rec.first_of_group.then_some(&mut *lds))
            .expect("restore");
    }
}

fn load_code(mem: &mut VecMemory, code: &[u32]) {
    let bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.load(CODE, &bytes);
}

fn f32s(mem: &mut VecMemory, at: u64, n: usize) -> Vec<f32> {
    let mut b = vec![0u8; 4 * n];
    mem.read(at, &mut b).expect("mapped");
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn saxpy_matches_the_host() {
    let n = 1000usize; // not a multiple of 64: the last wave's tail lanes are masked off
    let a = 2.5f32;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 100.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + 0.5).collect();
    let mut mem = VecMemory::new();
    load_code(&mut mem, SAXPY);
    let mut karg = Vec::new();
    karg.extend((n as u32).to_le_bytes());
    karg.extend(a.to_le_bytes());
    karg.extend(X.to_le_bytes());
    karg.extend(Y.to_le_bytes());
    mem.load(KERNARG, &karg);
    mem.load(
        X,
        &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    mem.load(
        Y,
        &y.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    mem.map(Y + 4 * n as u64, 4096); // a canary after y
    let mut cache = CodeCache::new(8);
    for g in 0..n.div_ceil(64) as u32 {
        run_group(&mut mem, &mut cache, g, 64, None);
    }
    let got = f32s(&mut mem, Y, n + 1);
    for i in 0..n {
        assert_eq!(got[i].to_bits(), a.mul_add(x[i], y[i]).to_bits(), "y[{i}]");
    }
    assert_eq!(got[n], 0.0, "no store past n");
    assert!(
        cache.misses <= SAXPY.len() as u64,
        "each instruction decoded once: {} misses",
        cache.misses
    );
}

#[test]
fn lds_reduction_with_barriers_and_atomics_matches_the_host() {
    reduce(None);
}

/// The reduction evicted and resumed through a context save area before each slice of
/// budget in turn (mid-phase, with one wave waiting at a barrier, partial sums in LDS and in
/// registers) ends as uninterrupted.
#[test]
fn lds_reduction_resumed_from_a_save_area_matches_the_host() {
    let mut slices = 0;
    while reduce(Some(slices)) {
        slices += 1;
    }
    assert!(slices >= 8, "evicted before each of {slices} slices only");
    println!("evicted before each of {slices} slices");
}

/// Runs REDUCE over five workgroups (evicting each before its slice `evict_at`) and checks
/// the sum; returns whether every workgroup was evicted.
fn reduce(evict_at: Option<usize>) -> bool {
    let groups = 5u32;
    let n = 128 * groups as usize;
    let x: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) >> 8)
        .collect();
    let mut mem = VecMemory::new();
    load_code(&mut mem, REDUCE);
    let mut karg = Vec::new();
    karg.extend(X.to_le_bytes());
    karg.extend(Y.to_le_bytes());
    mem.load(KERNARG, &karg);
    mem.load(
        X,
        &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    mem.map(Y, 4);
    let mut cache = CodeCache::new(8);
    let mut evicted = true;
    for g in 0..groups {
        evicted &= run_group(&mut mem, &mut cache, g, 128, evict_at);
    }
    let mut b = [0u8; 4];
    mem.read(Y, &mut b).expect("mapped");
    let want = x.iter().fold(0u32, |s, v| s.wrapping_add(*v));
    assert_eq!(
        u32::from_le_bytes(b),
        want,
        "evicted before slice {evict_at:?}"
    );
    evicted && evict_at.is_some()
}

#[test]
fn a_fault_stops_the_wave_at_the_instruction_with_the_address() {
    let mut mem = VecMemory::new();
    load_code(&mut mem, SAXPY);
    let mut karg = Vec::new();
    karg.extend(64u32.to_le_bytes());
    karg.extend(1f32.to_le_bytes());
    karg.extend(0xdead_0000u64.to_le_bytes()); // x unmapped
    karg.extend(Y.to_le_bytes());
    mem.load(KERNARG, &karg);
    let mut cache = CodeCache::new(8);
    let mut w = Wave::new(Target::Gfx90a, CODE);
    w.set_sgpr64(4, KERNARG);
    let stop = w.run(&mut mem, &mut [], &mut cache, 1000);
    let global_load_pc = CODE + 4 * 16;
    match stop {
        Stop::Fault { fault, pc } => {
            assert_eq!(
                (fault.addr, fault.write, pc),
                (0xdead_0000, false, global_load_pc)
            );
            assert_eq!(w.pc, global_load_pc);
        }
        other => panic!("expected a fault, got {other}"),
    }
}

/// The committed words are what llvm-mc-15 assembles from their comments.
#[test]
fn committed_kernel_words_match_llvm_mc() {
    if std::process::Command::new("llvm-mc-15")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("SKIPPED committed_kernel_words_match_llvm_mc: llvm-mc-15 is not installed");
        return;
    }
    let src = include_str!("kernels.rs");
    for (name, words) in [("SAXPY", SAXPY), ("REDUCE", REDUCE)] {
        let start = src.find(&format!("const {name}:")).expect("table");
        let body = &src[start..start + src[start..].find("];").expect("end")];
        let asm: String = body
            .lines()
            .filter_map(|l| l.split_once("// ").map(|(_, a)| format!("{a}\n")))
            .collect();
        let out = assemble(&asm);
        assert_eq!(out, words.to_vec(), "{name}");
    }
}

fn assemble(asm: &str) -> Vec<u32> {
    use std::io::Write;
    let mut child = std::process::Command::new("llvm-mc-15")
        .args(["-arch=amdgcn", "-mcpu=gfx90a", "-show-encoding"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("llvm-mc-15");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(asm.as_bytes())
        .expect("write");
    let out = String::from_utf8(child.wait_with_output().expect("run").stdout).expect("utf8");
    let bytes: Vec<u8> = out
        .lines()
        .filter_map(|l| {
            l.split_once("encoding: [")?
                .1
                .split_once(']')
                .map(|(b, _)| b.to_string())
        })
        .flat_map(|b| {
            b.split(',')
                .map(|x| u8::from_str_radix(x.trim_start_matches("0x"), 16).expect("byte"))
                .collect::<Vec<_>>()
        })
        .collect();
    bytes
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
