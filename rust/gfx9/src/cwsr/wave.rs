//! One wave's block: what the trap handler's save routine writes and its restore routine
//! reads back, here done directly on a [`Wave`].

use super::layout::{hwreg_slot, Alloc, WaveBlock, VGPR_BYTES};
use super::{le, Error, Result};
use crate::state::{sreg, Target, Wave, LANES};

/// The last SGPR slot the aliased registers can end at: s0..s101 and the six of
/// FLAT_SCRATCH, XNACK_MASK and VCC (ROCdbgapi: `min(scalar_register_count +
/// scalar_alias_count, sgpr_count)`, 102 + 6 on gfx9).
const ALIASED_END: usize = 108;

/// Where each SGPR slot of the block comes from: slot `i < end - 6` is s`i`; the last six
/// of `end = min(sgprs, 108)` are FLAT_SCRATCH, XNACK_MASK, VCC (lo, hi each); slots past
/// `end` hold nothing.
fn sgpr_slot_source(slot: usize, sgprs: usize) -> Option<usize> {
    let end = sgprs.min(ALIASED_END);
    let user = end - 6;
    if slot < user {
        Some(slot)
    } else if slot < end {
        Some(sreg::FLAT_SCRATCH_LO + (slot - user))
    } else {
        None
    }
}

/// Writes `wave`'s block into `out` (which must hold the block's slot, and its workgroup's
/// LDS when `lds` is given: the first wave of a workgroup carries it). Returns the bytes the
/// wave takes in the wave area. Registers past `alloc` are not saved: the compiler keeps a
/// kernel within its descriptor's allocation.
pub fn save_wave(wave: &Wave, alloc: &Alloc, lds: Option<&[u8]>, out: &mut [u8]) -> Result<usize> {
    alloc.check(wave.target)?;
    let b = WaveBlock::of(alloc);
    let size = b.slot_bytes(lds.is_some());
    if out.len() < size {
        return Err(Error::new(
            "wave block",
            format!("{size} bytes do not fit in the {} left", out.len()),
        ));
    }
    if let Some(l) = lds {
        if l.len() != b.lds_bytes {
            return Err(Error::new(
                "lds",
                format!(
                    "the workgroup's LDS has {} bytes, its allocation {}",
                    l.len(),
                    b.lds_bytes
                ),
            ));
        }
    }
    if wave.pc >> 48 != 0 {
        return Err(Error::new(
            "pc",
            format!("{:#x} is past the 48-bit GPU VA space", wave.pc),
        ));
    }
    let out = &mut out[..size];
    save_vgprs(wave, alloc, &b, out);
    save_sgprs(wave, alloc, &b, out);
    save_hwregs(wave, &b, out);
    for t in 0..16 {
        le::put32(out, b.ttmp + 4 * t, wave.sgpr(sreg::TTMP0 + t));
    }
    if let Some(l) = lds {
        out[b.lds..b.lds + l.len()].copy_from_slice(l);
    }
    out[b.lds + b.lds_bytes * lds.is_some() as usize..].fill(0);
    Ok(size)
}

fn put_row(out: &mut [u8], at: usize, row: &[u32; LANES]) {
    for (chunk, v) in out[at..at + VGPR_BYTES].chunks_exact_mut(4).zip(row) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

fn get_row(block: &[u8], at: usize, row: &mut [u32; LANES]) {
    for (chunk, v) in block[at..at + VGPR_BYTES].chunks_exact(4).zip(row) {
        *v = u32::from_le_bytes(chunk.try_into().expect("4 bytes"));
    }
}

fn save_vgprs(wave: &Wave, alloc: &Alloc, b: &WaveBlock, out: &mut [u8]) {
    for r in 0..alloc.vgprs as usize {
        put_row(out, r * VGPR_BYTES, wave.v(r));
    }
    for r in 0..alloc.agprs as usize {
        put_row(out, b.agpr + r * VGPR_BYTES, wave.a(r));
    }
}

fn save_sgprs(wave: &Wave, alloc: &Alloc, b: &WaveBlock, out: &mut [u8]) {
    for slot in 0..alloc.sgprs as usize {
        let v = sgpr_slot_source(slot, alloc.sgprs as usize).map_or(0, |n| wave.sgpr(n));
        le::put32(out, b.sgpr + 4 * slot, v);
    }
}

/// The HWREG block; STATUS carries SCC in bit 0 (the interpreter keeps it in `scc`).
fn save_hwregs(wave: &Wave, b: &WaveBlock, out: &mut [u8]) {
    let exec = wave.exec();
    let xnack = wave.sgpr64(sreg::XNACK_MASK_LO);
    let words = [
        wave.m0(),
        wave.pc as u32,
        (wave.pc >> 32) as u32,
        exec as u32,
        (exec >> 32) as u32,
        (wave.status & !1) | wave.scc as u32,
        wave.trapsts,
        xnack as u32,
        (xnack >> 32) as u32,
        wave.mode,
    ];
    for (i, w) in words.iter().enumerate() {
        le::put32(out, b.hwreg + 4 * i, *w);
    }
    out[b.hwreg + 4 * hwreg_slot::USED..b.ttmp].fill(0);
}

/// Rebuilds a wave of `target` from its block (and copies the workgroup's LDS into `lds`
/// when given, for the first wave of a workgroup). The caller sets what the hardware does
/// not save either: HW_ID, TBA/TMA, the apertures and the wave's place in its workgroup.
/// `retired` starts at zero.
pub fn restore_wave(
    target: Target,
    alloc: &Alloc,
    block: &[u8],
    lds: Option<&mut [u8]>,
) -> Result<Wave> {
    alloc.check(target)?;
    let b = WaveBlock::of(alloc);
    let size = b.slot_bytes(lds.is_some());
    if block.len() < size {
        return Err(Error::new(
            "wave block",
            format!("{size} bytes needed, {} in the area", block.len()),
        ));
    }
    let hw = |i: usize| le::u32(block, b.hwreg + 4 * i);
    let pc_hi = hw(hwreg_slot::PC_HI);
    if pc_hi >> 16 != 0 {
        return Err(Error::new(
            "hwreg PC_HI",
            format!("{pc_hi:#x} has replay state in bits 31:16, which the emulator never saves"),
        ));
    }
    for i in hwreg_slot::USED..16 {
        if hw(i) != 0 {
            return Err(Error::new(
                format!("hwreg slot {i}"),
                format!("{:#x} where the handler writes nothing", hw(i)),
            ));
        }
    }
    let mut w = Wave::new(
        target,
        ((pc_hi as u64) << 32) | hw(hwreg_slot::PC_LO) as u64,
    );
    for r in 0..alloc.vgprs as usize {
        get_row(block, r * VGPR_BYTES, w.v_mut(r));
    }
    for r in 0..alloc.agprs as usize {
        get_row(block, b.agpr + r * VGPR_BYTES, w.a_mut(r));
    }
    for slot in 0..alloc.sgprs as usize {
        if let Some(n) = sgpr_slot_source(slot, alloc.sgprs as usize) {
            w.set_sgpr(n, le::u32(block, b.sgpr + 4 * slot));
        }
    }
    for t in 0..16 {
        w.set_sgpr(sreg::TTMP0 + t, le::u32(block, b.ttmp + 4 * t));
    }
    w.set_sgpr(sreg::M0, hw(hwreg_slot::M0));
    w.set_sgpr(sreg::EXEC_LO, hw(hwreg_slot::EXEC_LO));
    w.set_sgpr(sreg::EXEC_LO + 1, hw(hwreg_slot::EXEC_HI));
    // The handler restores XNACK_MASK from the HWREG block, not from the SGPR slots.
    w.set_sgpr(sreg::XNACK_MASK_LO, hw(hwreg_slot::XNACK_MASK_LO));
    w.set_sgpr(sreg::XNACK_MASK_LO + 1, hw(hwreg_slot::XNACK_MASK_HI));
    let status = hw(hwreg_slot::STATUS);
    w.scc = status & 1 != 0;
    w.status = status & !1;
    w.trapsts = hw(hwreg_slot::TRAPSTS);
    w.mode = hw(hwreg_slot::MODE);
    if let Some(l) = lds {
        if l.len() != b.lds_bytes {
            return Err(Error::new(
                "lds",
                format!(
                    "the workgroup's LDS has {} bytes, its allocation {}",
                    l.len(),
                    b.lds_bytes
                ),
            ));
        }
        l.copy_from_slice(&block[b.lds..b.lds + b.lds_bytes]);
    }
    Ok(w)
}
