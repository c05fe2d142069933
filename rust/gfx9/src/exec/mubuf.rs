//! MUBUF: buffer loads, stores and atomics through a 128-bit buffer resource (V#), with
//! GFX9's range check and swizzled (scratch) addressing.

use super::opdef::{def, def_on, OpDef};
use super::operand::s32;
use super::smem::invalidate;
use super::vmem::{atomic, dwords, load, narrow, store, Fmt, Loc};
use super::{Abort, Cx, Flow, Step};
use crate::decode::Instr;
use crate::memory::AtomicOp;
use crate::state::Target;

/// The fields of a buffer resource the address computation uses.
struct Resource {
    base: u64,
    stride: u64,
    num_records: u64,
    swizzle: bool,
    add_tid: bool,
    element_size: u64,
    index_stride: u64,
}

impl Resource {
    fn read(cx: &Cx<'_>, sgpr: u8) -> Resource {
        let d: [u32; 4] = std::array::from_fn(|k| cx.w.sgpr(sgpr as usize + k));
        Resource {
            base: (d[0] as u64) | ((d[1] & 0xffff) as u64) << 32,
            stride: ((d[1] >> 16) & 0x3fff) as u64,
            swizzle: d[1] >> 31 != 0,
            num_records: d[2] as u64,
            element_size: 2 << ((d[3] >> 19) & 3),
            index_stride: 8 << ((d[3] >> 21) & 3),
            add_tid: (d[3] >> 23) & 1 != 0,
        }
    }
}

/// The lane's address per the ISA guide's buffer addressing (section "Buffer Instructions").
fn loc(cx: &Cx<'_>, i: &Instr, r: &Resource, soffset: u64, l: usize, bytes: u64) -> Loc {
    let vidx = if i.flags.idxen {
        cx.w.v(i.addr as usize)[l] as u64
    } else {
        0
    };
    let voff_reg = i.addr as usize + i.flags.idxen as usize;
    let voff = if i.flags.offen {
        cx.w.v(voff_reg)[l] as u64
    } else {
        0
    };
    let index = vidx + if r.add_tid { l as u64 } else { 0 };
    let offset = voff + i.offset as u64;
    let in_range = if r.stride == 0 || !(i.flags.idxen || r.add_tid) {
        offset + bytes <= r.num_records
    } else {
        index < r.num_records
    };
    if !in_range && !r.add_tid {
        return Loc::Dropped;
    }
    let buf_off = if r.swizzle {
        let (is, es) = (r.index_stride, r.element_size);
        (index / is * r.stride + offset / es * es) * is + (index % is) * es + offset % es
    } else {
        offset + index * r.stride
    };
    Loc::Va(r.base.wrapping_add(soffset).wrapping_add(buf_off))
}

/// The resource and soffset of an access of `bytes` per lane. A swizzled access wider than
/// the resource's element size spreads over several elements, which is not modelled
/// (hipcc's scratch accesses are single dwords).
fn access(cx: &Cx<'_>, i: &Instr, bytes: usize) -> Result<(Resource, u64), Abort> {
    let r = Resource::read(cx, i.sbase);
    if r.swizzle && bytes as u64 > r.element_size {
        return Err(super::bad(
            "buffer access",
            "a swizzled access wider than the element size is not modelled",
        ));
    }
    Ok((r, s32(cx.w, i, i.soffset)? as u64))
}

fn ld(cx: &mut Cx<'_>, i: &Instr, f: Fmt) -> Step {
    let (r, so) = access(cx, i, f.bytes)?;
    load(cx, i, f, |cx, l| Ok(loc(cx, i, &r, so, l, f.bytes as u64)))
}

fn st(cx: &mut Cx<'_>, i: &Instr, bytes: usize) -> Step {
    let (r, so) = access(cx, i, bytes)?;
    store(cx, i, bytes, false, |cx, l| {
        Ok(loc(cx, i, &r, so, l, bytes as u64))
    })
}

fn at(cx: &mut Cx<'_>, i: &Instr, size: usize, op: AtomicOp) -> Step {
    let (r, so) = access(cx, i, size)?;
    atomic(cx, i, size, op, i.flags.glc, |cx, l| {
        Ok(loc(cx, i, &r, so, l, size as u64))
    })
}

fn nothing(_: &mut Cx<'_>, _: &Instr) -> Step {
    Ok(Flow::Next)
}

pub static MUBUF: &[OpDef] = &[
    def(0x10, "buffer_load_ubyte", |cx, i| {
        ld(cx, i, narrow(1, false))
    }),
    def(0x11, "buffer_load_sbyte", |cx, i| {
        ld(cx, i, narrow(1, true))
    }),
    def(0x12, "buffer_load_ushort", |cx, i| {
        ld(cx, i, narrow(2, false))
    }),
    def(0x13, "buffer_load_sshort", |cx, i| {
        ld(cx, i, narrow(2, true))
    }),
    def(0x14, "buffer_load_dword", |cx, i| ld(cx, i, dwords(1))),
    def(0x15, "buffer_load_dwordx2", |cx, i| ld(cx, i, dwords(2))),
    def(0x16, "buffer_load_dwordx3", |cx, i| ld(cx, i, dwords(3))),
    def(0x17, "buffer_load_dwordx4", |cx, i| ld(cx, i, dwords(4))),
    def(0x18, "buffer_store_byte", |cx, i| st(cx, i, 1)),
    def(0x1a, "buffer_store_short", |cx, i| st(cx, i, 2)),
    def(0x1c, "buffer_store_dword", |cx, i| st(cx, i, 4)),
    def(0x1d, "buffer_store_dwordx2", |cx, i| st(cx, i, 8)),
    def(0x1e, "buffer_store_dwordx3", |cx, i| st(cx, i, 12)),
    def(0x1f, "buffer_store_dwordx4", |cx, i| st(cx, i, 16)),
    def_on(Target::Gfx90a, 0x28, "buffer_wbl2", nothing),
    def_on(Target::Gfx90a, 0x29, "buffer_invl2", invalidate),
    def(0x3e, "buffer_wbinvl1", invalidate),
    def(0x3f, "buffer_wbinvl1_vol", invalidate),
    def(0x40, "buffer_atomic_swap", |cx, i| {
        at(cx, i, 4, AtomicOp::Swap)
    }),
    def(0x41, "buffer_atomic_cmpswap", |cx, i| {
        at(cx, i, 4, AtomicOp::CmpSwap)
    }),
    def(0x42, "buffer_atomic_add", |cx, i| {
        at(cx, i, 4, AtomicOp::Add)
    }),
    def(0x43, "buffer_atomic_sub", |cx, i| {
        at(cx, i, 4, AtomicOp::Sub)
    }),
    def(0x44, "buffer_atomic_smin", |cx, i| {
        at(cx, i, 4, AtomicOp::SMin)
    }),
    def(0x45, "buffer_atomic_umin", |cx, i| {
        at(cx, i, 4, AtomicOp::UMin)
    }),
    def(0x46, "buffer_atomic_smax", |cx, i| {
        at(cx, i, 4, AtomicOp::SMax)
    }),
    def(0x47, "buffer_atomic_umax", |cx, i| {
        at(cx, i, 4, AtomicOp::UMax)
    }),
    def(0x48, "buffer_atomic_and", |cx, i| {
        at(cx, i, 4, AtomicOp::And)
    }),
    def(0x49, "buffer_atomic_or", |cx, i| at(cx, i, 4, AtomicOp::Or)),
    def(0x4a, "buffer_atomic_xor", |cx, i| {
        at(cx, i, 4, AtomicOp::Xor)
    }),
    def(0x4b, "buffer_atomic_inc", |cx, i| {
        at(cx, i, 4, AtomicOp::Inc)
    }),
    def(0x4c, "buffer_atomic_dec", |cx, i| {
        at(cx, i, 4, AtomicOp::Dec)
    }),
    def(0x4d, "buffer_atomic_add_f32", |cx, i| {
        at(cx, i, 4, AtomicOp::FAdd)
    }),
    def(0x4e, "buffer_atomic_pk_add_f16", |cx, i| {
        at(cx, i, 4, AtomicOp::PkAddF16)
    }),
    def_on(Target::Gfx90a, 0x4f, "buffer_atomic_add_f64", |cx, i| {
        at(cx, i, 8, AtomicOp::FAdd)
    }),
    def_on(Target::Gfx90a, 0x50, "buffer_atomic_min_f64", |cx, i| {
        at(cx, i, 8, AtomicOp::FMin)
    }),
    def_on(Target::Gfx90a, 0x51, "buffer_atomic_max_f64", |cx, i| {
        at(cx, i, 8, AtomicOp::FMax)
    }),
    def(0x60, "buffer_atomic_swap_x2", |cx, i| {
        at(cx, i, 8, AtomicOp::Swap)
    }),
    def(0x61, "buffer_atomic_cmpswap_x2", |cx, i| {
        at(cx, i, 8, AtomicOp::CmpSwap)
    }),
    def(0x62, "buffer_atomic_add_x2", |cx, i| {
        at(cx, i, 8, AtomicOp::Add)
    }),
    def(0x63, "buffer_atomic_sub_x2", |cx, i| {
        at(cx, i, 8, AtomicOp::Sub)
    }),
];
