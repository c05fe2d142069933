//! FLAT, GLOBAL and SCRATCH: per-lane addresses from VGPRs (and an SGPR base).

use super::opdef::{def, def_on, OpDef};
use super::vmem::{atomic, d16, dwords, load, narrow, store, Fmt, Loc};
use super::{Abort, Cx, Step};
use crate::decode::{Encoding, Instr};
use crate::memory::AtomicOp;
use crate::state::Target;

/// SADDR 0x7f: no scalar base ("off").
const OFF: u8 = 0x7f;

#[inline(always)]
fn vaddr64(cx: &Cx<'_>, i: &Instr, l: usize) -> u64 {
    let r = i.addr as usize;
    cx.w.v(r)[l] as u64 | (cx.w.v(r + 1)[l] as u64) << 32
}

/// A flat address: the shared and private apertures reach LDS and scratch.
#[inline(always)]
fn flat_loc(cx: &Cx<'_>, a: u64, l: usize) -> Loc {
    let hi = a >> 32;
    let ap = cx.w.apertures;
    if ap.shared_base != 0 && hi == ap.shared_base >> 32 {
        Loc::Lds(a as u32)
    } else if ap.private_base != 0 && hi == ap.private_base >> 32 {
        Loc::Private {
            lane: l as u8,
            offset: a as u32,
        }
    } else {
        Loc::Va(a)
    }
}

#[inline(always)]
fn loc(cx: &Cx<'_>, i: &Instr, l: usize) -> Result<Loc, Abort> {
    let off = i.offset as i64 as u64;
    Ok(match i.enc {
        Encoding::Flat => flat_loc(cx, vaddr64(cx, i, l).wrapping_add(off), l),
        Encoding::Global if i.sbase == OFF => Loc::Va(vaddr64(cx, i, l).wrapping_add(off)),
        Encoding::Global => {
            let base = cx.w.sgpr64(i.sbase as usize);
            Loc::Va(
                base.wrapping_add(cx.w.v(i.addr as usize)[l] as u64)
                    .wrapping_add(off),
            )
        }
        _ => {
            let o = if i.sbase == OFF {
                cx.w.v(i.addr as usize)[l]
            } else {
                cx.w.sgpr(i.sbase as usize)
            };
            Loc::Private {
                lane: l as u8,
                offset: (o as i64 + i.offset as i64) as u32,
            }
        }
    })
}

fn ld(cx: &mut Cx<'_>, i: &Instr, f: Fmt) -> Step {
    load(cx, i, f, |cx, l| loc(cx, i, l))
}

fn st(cx: &mut Cx<'_>, i: &Instr, bytes: usize, hi: bool) -> Step {
    store(cx, i, bytes, hi, |cx, l| loc(cx, i, l))
}

fn at(cx: &mut Cx<'_>, i: &Instr, size: usize, op: AtomicOp) -> Step {
    atomic(cx, i, size, op, i.flags.glc, |cx, l| loc(cx, i, l))
}

/// The opcodes FLAT and GLOBAL share, mnemonics prefixed by segment.
macro_rules! seg_table {
    ($pfx:literal, $($extra:expr),* $(,)?) => { &[
        def(0x10, concat!($pfx, "_load_ubyte"), |cx, i| ld(cx, i, narrow(1, false))),
        def(0x11, concat!($pfx, "_load_sbyte"), |cx, i| ld(cx, i, narrow(1, true))),
        def(0x12, concat!($pfx, "_load_ushort"), |cx, i| ld(cx, i, narrow(2, false))),
        def(0x13, concat!($pfx, "_load_sshort"), |cx, i| ld(cx, i, narrow(2, true))),
        def(0x14, concat!($pfx, "_load_dword"), |cx, i| ld(cx, i, dwords(1))),
        def(0x15, concat!($pfx, "_load_dwordx2"), |cx, i| ld(cx, i, dwords(2))),
        def(0x16, concat!($pfx, "_load_dwordx3"), |cx, i| ld(cx, i, dwords(3))),
        def(0x17, concat!($pfx, "_load_dwordx4"), |cx, i| ld(cx, i, dwords(4))),
        def(0x18, concat!($pfx, "_store_byte"), |cx, i| st(cx, i, 1, false)),
        def(0x19, concat!($pfx, "_store_byte_d16_hi"), |cx, i| st(cx, i, 1, true)),
        def(0x1a, concat!($pfx, "_store_short"), |cx, i| st(cx, i, 2, false)),
        def(0x1b, concat!($pfx, "_store_short_d16_hi"), |cx, i| st(cx, i, 2, true)),
        def(0x1c, concat!($pfx, "_store_dword"), |cx, i| st(cx, i, 4, false)),
        def(0x1d, concat!($pfx, "_store_dwordx2"), |cx, i| st(cx, i, 8, false)),
        def(0x1e, concat!($pfx, "_store_dwordx3"), |cx, i| st(cx, i, 12, false)),
        def(0x1f, concat!($pfx, "_store_dwordx4"), |cx, i| st(cx, i, 16, false)),
        def(0x20, concat!($pfx, "_load_ubyte_d16"), |cx, i| ld(cx, i, d16(1, false, false))),
        def(0x21, concat!($pfx, "_load_ubyte_d16_hi"), |cx, i| ld(cx, i, d16(1, false, true))),
        def(0x22, concat!($pfx, "_load_sbyte_d16"), |cx, i| ld(cx, i, d16(1, true, false))),
        def(0x23, concat!($pfx, "_load_sbyte_d16_hi"), |cx, i| ld(cx, i, d16(1, true, true))),
        def(0x24, concat!($pfx, "_load_short_d16"), |cx, i| ld(cx, i, d16(2, false, false))),
        def(0x25, concat!($pfx, "_load_short_d16_hi"), |cx, i| ld(cx, i, d16(2, false, true))),
        def(0x40, concat!($pfx, "_atomic_swap"), |cx, i| at(cx, i, 4, AtomicOp::Swap)),
        def(0x41, concat!($pfx, "_atomic_cmpswap"), |cx, i| at(cx, i, 4, AtomicOp::CmpSwap)),
        def(0x42, concat!($pfx, "_atomic_add"), |cx, i| at(cx, i, 4, AtomicOp::Add)),
        def(0x43, concat!($pfx, "_atomic_sub"), |cx, i| at(cx, i, 4, AtomicOp::Sub)),
        def(0x44, concat!($pfx, "_atomic_smin"), |cx, i| at(cx, i, 4, AtomicOp::SMin)),
        def(0x45, concat!($pfx, "_atomic_umin"), |cx, i| at(cx, i, 4, AtomicOp::UMin)),
        def(0x46, concat!($pfx, "_atomic_smax"), |cx, i| at(cx, i, 4, AtomicOp::SMax)),
        def(0x47, concat!($pfx, "_atomic_umax"), |cx, i| at(cx, i, 4, AtomicOp::UMax)),
        def(0x48, concat!($pfx, "_atomic_and"), |cx, i| at(cx, i, 4, AtomicOp::And)),
        def(0x49, concat!($pfx, "_atomic_or"), |cx, i| at(cx, i, 4, AtomicOp::Or)),
        def(0x4a, concat!($pfx, "_atomic_xor"), |cx, i| at(cx, i, 4, AtomicOp::Xor)),
        def(0x4b, concat!($pfx, "_atomic_inc"), |cx, i| at(cx, i, 4, AtomicOp::Inc)),
        def(0x4c, concat!($pfx, "_atomic_dec"), |cx, i| at(cx, i, 4, AtomicOp::Dec)),
        def_on(Target::Gfx90a, 0x4f, concat!($pfx, "_atomic_add_f64"), |cx, i| at(cx, i, 8, AtomicOp::FAdd)),
        def_on(Target::Gfx90a, 0x50, concat!($pfx, "_atomic_min_f64"), |cx, i| at(cx, i, 8, AtomicOp::FMin)),
        def_on(Target::Gfx90a, 0x51, concat!($pfx, "_atomic_max_f64"), |cx, i| at(cx, i, 8, AtomicOp::FMax)),
        def(0x60, concat!($pfx, "_atomic_swap_x2"), |cx, i| at(cx, i, 8, AtomicOp::Swap)),
        def(0x61, concat!($pfx, "_atomic_cmpswap_x2"), |cx, i| at(cx, i, 8, AtomicOp::CmpSwap)),
        def(0x62, concat!($pfx, "_atomic_add_x2"), |cx, i| at(cx, i, 8, AtomicOp::Add)),
        def(0x63, concat!($pfx, "_atomic_sub_x2"), |cx, i| at(cx, i, 8, AtomicOp::Sub)),
        def(0x64, concat!($pfx, "_atomic_smin_x2"), |cx, i| at(cx, i, 8, AtomicOp::SMin)),
        def(0x65, concat!($pfx, "_atomic_umin_x2"), |cx, i| at(cx, i, 8, AtomicOp::UMin)),
        def(0x66, concat!($pfx, "_atomic_smax_x2"), |cx, i| at(cx, i, 8, AtomicOp::SMax)),
        def(0x67, concat!($pfx, "_atomic_umax_x2"), |cx, i| at(cx, i, 8, AtomicOp::UMax)),
        def(0x68, concat!($pfx, "_atomic_and_x2"), |cx, i| at(cx, i, 8, AtomicOp::And)),
        def(0x69, concat!($pfx, "_atomic_or_x2"), |cx, i| at(cx, i, 8, AtomicOp::Or)),
        def(0x6a, concat!($pfx, "_atomic_xor_x2"), |cx, i| at(cx, i, 8, AtomicOp::Xor)),
        def(0x6b, concat!($pfx, "_atomic_inc_x2"), |cx, i| at(cx, i, 8, AtomicOp::Inc)),
        def(0x6c, concat!($pfx, "_atomic_dec_x2"), |cx, i| at(cx, i, 8, AtomicOp::Dec)),
        $($extra,)*
    ] };
}

pub static FLAT: &[OpDef] = seg_table!("flat",);

/// GLOBAL's table; SCRATCH uses its loads and stores (same opcode numbers; the lookup
/// refuses SCRATCH atomics, which do not exist).
pub static GLOBAL: &[OpDef] = seg_table!(
    "global",
    def(0x4d, "global_atomic_add_f32", |cx, i| at(
        cx,
        i,
        4,
        AtomicOp::FAdd
    )),
    def(0x4e, "global_atomic_pk_add_f16", |cx, i| at(
        cx,
        i,
        4,
        AtomicOp::PkAddF16
    )),
);
