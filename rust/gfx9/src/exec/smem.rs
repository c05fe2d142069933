//! SMEM: scalar loads and stores through the scalar data cache (here: straight to memory).

use super::opdef::{def, OpDef};
use super::operand::{s32, set_s32};
use super::{bad, Cx, Flow, Step};
use crate::decode::Instr;

/// The byte address of an s_load/s_store: SGPR-pair base plus the immediate (21-bit signed)
/// and/or the SGPR offset.
fn address(cx: &Cx<'_>, i: &Instr, base: u64) -> Result<u64, super::Abort> {
    let imm = ((i.offset << 11) >> 11) as i64;
    let off = match (i.flags.imm, i.flags.soe) {
        (true, true) => imm + s32(cx.w, i, i.soffset)? as i64,
        (true, false) => imm,
        (false, _) => s32(cx.w, i, (i.offset & 0xff) as u16)? as i64,
    };
    Ok(base.wrapping_add(off as u64))
}

/// A buffer resource's 48-bit base from its first two dwords.
fn buffer_base(cx: &Cx<'_>, sbase: u8) -> u64 {
    cx.w.sgpr64(sbase as usize) & 0xffff_ffff_ffff
}

fn load(cx: &mut Cx<'_>, i: &Instr, dwords: usize, buffer: bool) -> Step {
    if i.dst as usize + dwords > 128 {
        return Err(bad("s_load", "destination range runs past the SGPRs"));
    }
    let base = if buffer {
        buffer_base(cx, i.sbase)
    } else {
        cx.w.sgpr64(i.sbase as usize)
    };
    let addr = address(cx, i, base)? & !3;
    let mut buf = [0u8; 64];
    if i.flags.glc {
        cx.mem.read_fresh(addr, &mut buf[..dwords * 4])?;
    } else {
        cx.mem.read(addr, &mut buf[..dwords * 4])?;
    }
    for k in 0..dwords {
        let v = u32::from_le_bytes([buf[4 * k], buf[4 * k + 1], buf[4 * k + 2], buf[4 * k + 3]]);
        set_s32(cx.w, i.dst + k as u16, v)?;
    }
    Ok(Flow::Next)
}

fn store(cx: &mut Cx<'_>, i: &Instr, dwords: usize) -> Step {
    let addr = address(cx, i, cx.w.sgpr64(i.sbase as usize))? & !3;
    let mut buf = [0u8; 16];
    for k in 0..dwords {
        buf[4 * k..4 * k + 4].copy_from_slice(&cx.w.sgpr(i.dst as usize + k).to_le_bytes());
    }
    cx.mem.write(addr, &buf[..dwords * 4])?;
    Ok(Flow::Next)
}

fn nothing(_: &mut Cx<'_>, _: &Instr) -> Step {
    Ok(Flow::Next)
}

/// s_dcache_inv: what the wave read before may have changed ([`Memory::acquire`]).
///
/// [`Memory::acquire`]: crate::memory::Memory::acquire
pub(super) fn invalidate(cx: &mut Cx<'_>, _: &Instr) -> Step {
    cx.mem.acquire();
    Ok(Flow::Next)
}

/// Clock counters: the retired-instruction count stands in for a clock (monotonic per wave).
fn memtime(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let t = cx.w.retired;
    super::operand::set_s64(cx.w, i.dst, t)?;
    Ok(Flow::Next)
}

pub static SMEM: &[OpDef] = &[
    def(0x00, "s_load_dword", |cx, i| load(cx, i, 1, false)),
    def(0x01, "s_load_dwordx2", |cx, i| load(cx, i, 2, false)),
    def(0x02, "s_load_dwordx4", |cx, i| load(cx, i, 4, false)),
    def(0x03, "s_load_dwordx8", |cx, i| load(cx, i, 8, false)),
    def(0x04, "s_load_dwordx16", |cx, i| load(cx, i, 16, false)),
    def(0x08, "s_buffer_load_dword", |cx, i| load(cx, i, 1, true)),
    def(0x09, "s_buffer_load_dwordx2", |cx, i| load(cx, i, 2, true)),
    def(0x0a, "s_buffer_load_dwordx4", |cx, i| load(cx, i, 4, true)),
    def(0x0b, "s_buffer_load_dwordx8", |cx, i| load(cx, i, 8, true)),
    def(0x0c, "s_buffer_load_dwordx16", |cx, i| {
        load(cx, i, 16, true)
    }),
    def(0x10, "s_store_dword", |cx, i| store(cx, i, 1)),
    def(0x11, "s_store_dwordx2", |cx, i| store(cx, i, 2)),
    def(0x12, "s_store_dwordx4", |cx, i| store(cx, i, 4)),
    def(0x20, "s_dcache_inv", invalidate),
    def(0x21, "s_dcache_wb", nothing),
    def(0x22, "s_dcache_inv_vol", invalidate),
    def(0x23, "s_dcache_wb_vol", nothing),
    def(0x24, "s_memtime", memtime),
    def(0x25, "s_memrealtime", memtime),
];
