//! What saving and restoring every wave of a fully occupied GPU costs the emulator
//! (`cargo run --release -p gfx9 --example cwsr_rate`): waves per second and bytes per second
//! of `cwsr::SaveWriter` and `cwsr::SaveArea` on one core, into and out of a context save area
//! in host memory.
//!
//! Occupancy is KFD's: the control stack of one queue is sized for `min(cus * 40,
//! arrays / arrays_per_engine * 512)` = 4096 waves on MI100 (120 CUs) and MI210 (104 CUs);
//! the registers per wave are chosen so that 4096 of them fill the wave area KFD sizes
//! (`cus * 0x95000`): 28 VGPRs + 28 AccVGPRs on MI100, 24 + 24 on MI210, 112 SGPRs, workgroups
//! of 4 waves with 8 KiB of LDS.
//!
//! Times are this thread's CPU time (`/proc/thread-self/schedstat`), not wall time: the
//! machine the numbers come from is shared.

use std::time::Duration;

use gfx9::cwsr::layout::{wave_area_size, Header};
use gfx9::cwsr::{Alloc, SaveArea, SaveWriter};
use gfx9::state::LANES;
use gfx9::{Target, Wave};

const CTL_STACK: u32 = 0x9000;
const WAVES: u32 = 4096;
const PER_GROUP: u32 = 4;
const LDS: u32 = 8192;

/// CPU time this thread has run.
fn cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns = s.split_whitespace().next().and_then(|n| n.parse().ok());
    Duration::from_nanos(ns.expect("schedstat's run time"))
}

fn packet(groups: u32) -> [u8; 64] {
    let mut p = [0u8; 64];
    p[0..2].copy_from_slice(&2u16.to_le_bytes());
    p[2..4].copy_from_slice(&1u16.to_le_bytes());
    p[4..6].copy_from_slice(&((PER_GROUP * 64) as u16).to_le_bytes());
    p[6..8].copy_from_slice(&1u16.to_le_bytes());
    p[8..10].copy_from_slice(&1u16.to_le_bytes());
    p[12..16].copy_from_slice(&(groups * PER_GROUP * 64).to_le_bytes());
    p[16..20].copy_from_slice(&1u32.to_le_bytes());
    p[20..24].copy_from_slice(&1u32.to_le_bytes());
    p
}

fn run(name: &str, target: Target, cus: u32, rsrc1: u32, rsrc3: u32) {
    let alloc = Alloc::from_descriptor(target, rsrc1, rsrc3, LDS).expect("allocation");
    let size = CTL_STACK as usize + wave_area_size(cus).expect("size") as usize;
    let mut area = vec![0u8; size];
    Header {
        debug_offset: size as u32,
        ..Header::default()
    }
    .write(&mut area);
    let mut waves = Vec::new();
    for i in 0..PER_GROUP {
        let mut w = Wave::new(target, 0x7f00_0000_1000 + i as u64 * 4);
        for r in 0..alloc.vgprs as usize {
            w.v_mut(r).copy_from_slice(&[r as u32 ^ i; LANES]);
        }
        waves.push(w);
    }
    let lds = vec![0x5au8; LDS as usize];
    let groups = WAVES / PER_GROUP;

    let t = cpu();
    let mut writer = SaveWriter::new(target, &mut area, CTL_STACK).expect("writer");
    writer
        .begin_dispatch(1, packet(groups * 2), alloc, groups, 0)
        .expect("dispatch");
    for g in 0..groups {
        for (i, w) in waves.iter().enumerate() {
            let l = (i == 0).then_some(&lds[..]);
            writer.save(w, g, i as u8, false, false, l).expect("save");
        }
    }
    let saved = writer.finish().expect("finish");
    let save = cpu() - t;
    let bytes = (saved.wg_state_offset - saved.ctl_stack_size) as f64;

    let t = cpu();
    let sa = SaveArea::open(target, &area, CTL_STACK, &saved.control_stack).expect("open");
    let mut lds_back = vec![0u8; LDS as usize];
    let mut n = 0;
    for (j, rec) in sa.stack().dispatches[0].waves.iter().enumerate() {
        let l = rec.first_of_group.then_some(&mut lds_back[..]);
        let w = sa.wave(0, j, l).expect("restore");
        n += w.pc as usize & 1;
    }
    let restore = cpu() - t;
    assert_eq!(n, 0);

    let per_s = |d: Duration| WAVES as f64 / d.as_secs_f64();
    let mb_s = |d: Duration| bytes / d.as_secs_f64() / 1e6;
    println!(
        "{name}: {WAVES} waves of {}+{} VGPRs, {} SGPRs, {} MB of wave area, control stack {} bytes",
        alloc.vgprs,
        alloc.agprs,
        alloc.sgprs,
        bytes / 1e6,
        saved.control_stack.len()
    );
    println!(
        "  save    {:7.1} ms  {:9.0} waves/s  {:7.0} MB/s",
        save.as_secs_f64() * 1e3,
        per_s(save),
        mb_s(save)
    );
    println!(
        "  restore {:7.1} ms  {:9.0} waves/s  {:7.0} MB/s",
        restore.as_secs_f64() * 1e3,
        per_s(restore),
        mb_s(restore)
    );
}

fn main() {
    // The first round touches the area's pages for the first time; the second is the steady
    // state.
    for round in 1..=2 {
        println!("round {round}");
        rounds();
    }
}

fn rounds() {
    // MI100: VGPRS granule 6 -> 28 VGPRs (and 28 AccVGPRs), SGPRS granule 6 -> 112.
    run(
        "MI100 gfx908, 120 CUs",
        Target::Gfx908,
        120,
        6 | (6 << 6),
        0,
    );
    // MI210: 48 unified VGPRs (granule 5), ACCUM_OFFSET 5 -> 24 + 24.
    run(
        "MI210 gfx90a, 104 CUs",
        Target::Gfx90a,
        104,
        5 | (6 << 6),
        5,
    );
}
