//! The engine's rate on a VALU-heavy and a memory-heavy loop, in wave instructions and lane
//! operations per second on one core (`cargo run --release -p gfx9 --example rate`), then on
//! two kernels as hipcc compiles them (test/hip's code objects, run by the tests' launcher):
//! transcendental's f32 kernel (VALU-heavy: seven libm functions per element) and saxpy over
//! 1 Mi elements (memory-heavy).
//!
//! Both loops were assembled with llvm-mc-15 for gfx90a; each runs 1024 iterations per wave,
//! all 64 lanes active, over a `VecMemory` (a map of 4 KiB pages: the memory-heavy number
//! includes its lookups, as the emulator's rate will include its GPU VM's).

use std::time::{Duration, Instant};

use gfx9::exec::{CodeCache, Stop};
use gfx9::{Target, VecMemory, Wave};

#[path = "../tests/common/launch.rs"]
mod launch;

const CODE: u64 = 0x10_0000;
const DATA: u64 = 0x80_0000;
const COUNTER: u64 = 0x90_0000;

const VALU_LOOP: &[u32] = &[
    0xb0000400, // s_movk_i32 s0, 0x400
    0xd1cb0001, 0x04060702, // .Lloop: v_fma_f32 v1, v2, v3, v1
    0x0a080501, // v_mul_f32_e32 v4, v1, v2
    0x680a0d05, // v_add_u32_e32 v5, v5, v6
    0x760e0704, // v_fmac_f32_e32 v7, v4, v3
    0x2a100305, // v_xor_b32_e32 v8, v5, v1
    0x7e120d08, // v_cvt_f32_u32_e32 v9, v8
    0x16140909, // v_max_f32_e32 v10, v9, v4
    0x24160a83, // v_lshlrev_b32_e32 v11, 3, v5
    0x80808100, // s_sub_u32 s0, s0, 1
    0xbf078000, // s_cmp_lg_u32 s0, 0
    0xbf85fff4, // s_cbranch_scc1 .Lloop
    0xbf810000, // s_endpgm
];

const MEMORY_LOOP: &[u32] = &[
    0xb0000400, // s_movk_i32 s0, 0x400
    0x24040082, // v_lshlrev_b32_e32 v2, 2, v0
    0xdc508000, 0x03040002, // .Lloop: global_load_dword v3, v2, s[4:5]
    0xbf8c0f70, // s_waitcnt vmcnt(0)
    0x020606f2, // v_add_f32_e32 v3, 1.0, v3
    0xdc708000, 0x00040302, // global_store_dword v2, v3, s[4:5]
    0xdc508100, 0x04040002, // global_load_dword v4, v2, s[4:5] offset:256
    0xdd088000, 0x00060002, // global_atomic_add v2, v0, s[6:7]
    0x80808100, // s_sub_u32 s0, s0, 1
    0xbf078000, // s_cmp_lg_u32 s0, 0
    0xbf85fff3, // s_cbranch_scc1 .Lloop
    0xbf810000, // s_endpgm
];

/// CPU time this thread has run (Linux's schedstat, in nanoseconds): on a shared machine
/// the rate per core is instructions over CPU time, not over wall time.
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(
        s.split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    )
}

/// Wave instructions retired, and the wall and CPU time they took, over waves run for at
/// least `min` of wall time.
fn measure(code: &[u32], min: Duration) -> (u64, Duration, Duration) {
    let mut mem = VecMemory::new();
    let bytes: Vec<u8> = code.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.load(CODE, &bytes);
    mem.map(DATA, 64 * 4 + 256);
    mem.map(COUNTER, 4 * 64);
    let mut cache = CodeCache::new(10);
    let (mut retired, start, cpu) = (0u64, Instant::now(), thread_cpu());
    while start.elapsed() < min {
        let mut w = Wave::new(Target::Gfx90a, CODE);
        w.set_sgpr64(4, DATA);
        w.set_sgpr64(6, COUNTER);
        for l in 0..64 {
            w.set_lane(0, l, l as u32);
            w.set_lane(2, l, 0x3f80_0000);
            w.set_lane(3, l, 0x3f00_0000);
        }
        let stop = w.run(&mut mem, &mut [], &mut cache, u64::MAX);
        assert_eq!(stop, Stop::Endpgm, "the loop ends");
        retired += w.retired;
    }
    (retired, start.elapsed(), thread_cpu() - cpu)
}

fn report(name: &str, code: &[u32]) {
    let (n, wall, cpu) = measure(code, Duration::from_secs(2));
    let rate = n as f64 / cpu.as_secs_f64();
    println!(
        "{name}: {:.1} M wave instructions/s per core, {:.0} M lane operations/s \
         ({n} instructions in {:.2} s of CPU, {:.2} s of wall time: {:.1} M/s wall)",
        rate / 1e6,
        rate * 64.0 / 1e6,
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64() / 1e6,
    );
}

/// Wave instructions, lane operations, wall and CPU time of launches of one hipcc kernel.
struct HipRun {
    instructions: u64,
    lanes: u64,
    wall: Duration,
    cpu: Duration,
}

impl HipRun {
    fn print(&self, name: &str) {
        let rate = self.instructions as f64 / self.cpu.as_secs_f64();
        println!(
            "{name}: {:.1} M wave instructions/s per core, {:.0} M lane operations/s \
             ({} instructions, {} lane operations in {:.2} s of CPU, {:.2} s of wall time)",
            rate / 1e6,
            self.lanes as f64 / self.cpu.as_secs_f64() / 1e6,
            self.instructions,
            self.lanes,
            self.cpu.as_secs_f64(),
            self.wall.as_secs_f64(),
        );
    }
}

/// Launches of one hipcc kernel for at least `min` of wall time (one at least: a `min` of 0
/// launches it once, for counting the engine's own instructions under a tool such as
/// callgrind).
fn measure_hip(
    prog: &str,
    t: Target,
    setup: impl Fn(&mut launch::Gpu) -> Box<dyn Fn(&mut launch::Gpu)>,
    min: Duration,
) -> HipRun {
    let mut g = launch::Gpu::new(prog, t);
    let run = setup(&mut g);
    let (start, cpu) = (Instant::now(), thread_cpu());
    loop {
        run(&mut g);
        if start.elapsed() >= min {
            break;
        }
    }
    HipRun {
        instructions: g.retired,
        lanes: g.lanes,
        wall: start.elapsed(),
        cpu: thread_cpu() - cpu,
    }
}

/// transcendental's f32 kernel over `n` items (a multiple of 256).
fn hip_valu(t: Target, n: u32, min: Duration) -> HipRun {
    measure_hip(
        "transcendental",
        t,
        |g| {
            let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.37 - 18.0).collect();
            let (dx, dout) = (g.alloc_f32(&x), g.alloc(&vec![0; 4 * 7 * n as usize]));
            Box::new(move |g| {
                let args = launch::Args::default().u32(n).ptr(dx).ptr(dout);
                g.launch("_Z7f32_fns", [n / 256, 1, 1], [256, 1, 1], args);
            })
        },
        min,
    )
}

/// saxpy over `n` items (a multiple of 256).
fn hip_memory(t: Target, n: u32, min: Duration) -> HipRun {
    measure_hip(
        "saxpy",
        t,
        |g| {
            let (dx, dy) = (
                g.alloc(&vec![0; 4 * n as usize]),
                g.alloc(&vec![0; 4 * n as usize]),
            );
            Box::new(move |g| {
                let args = launch::Args::default().u32(n).f32(2.0).ptr(dx).ptr(dy);
                g.launch("_Z5saxpy", [n / 256, 1, 1], [256, 1, 1], args);
            })
        },
        min,
    )
}

/// `rate hip valu|memory gfx908|gfx90a N SECS`: one kernel of test/hip's code objects as
/// scripts/bench-engine.sh runs it inside kfd-emu, for at least SECS seconds over N items:
/// the baseline the emulator's rate is measured against in the same run.
fn hip_baseline(args: &[String]) {
    let usage = "usage: rate hip valu|memory gfx908|gfx90a N SECS";
    let [which, target, n, secs] = args else {
        panic!("{usage}");
    };
    let t = match target.as_str() {
        "gfx908" => Target::Gfx908,
        "gfx90a" => Target::Gfx90a,
        _ => panic!("{usage}"),
    };
    let n: u32 = n.parse().expect(usage);
    let min = Duration::from_secs_f64(secs.parse().expect(usage));
    let run = match which.as_str() {
        "valu" => hip_valu(t, n, min),
        "memory" => hip_memory(t, n, min),
        _ => panic!("{usage}"),
    };
    run.print(&format!("{which} {target} in-process"));
}

/// `rate [valu|memory]`: both loops and both kernels, or the VALU or memory ones; or
/// `rate hip ...` (see [`hip_baseline`]).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "hip") {
        return hip_baseline(&args[1..]);
    }
    let which = args.first().cloned().unwrap_or_default();
    let secs = Duration::from_secs(2);
    if which != "memory" {
        report("VALU-heavy loop", VALU_LOOP);
        hip_valu(Target::Gfx90a, 4096, secs)
            .print("VALU-heavy hipcc kernel (transcendental f32: seven libm functions)");
    }
    if which != "valu" {
        report("memory-heavy loop", MEMORY_LOOP);
        hip_memory(Target::Gfx90a, 1 << 20, secs)
            .print("memory-heavy hipcc kernel (saxpy, 1 Mi elements)");
    }
}
