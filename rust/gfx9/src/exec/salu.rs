//! Scalar ALU: SOP2, SOP1, SOPC and SOPK.

use super::opdef::{def, OpDef};
use super::operand::{s32, s64, set_s32, set_s64};
use super::{bad, Cx, Flow, Step};
use crate::decode::Instr;
use crate::state::{hwreg, Target, Wave};

type R32 = (u32, Option<bool>);
type R64 = (u64, Option<bool>);

fn nz32(v: u32) -> R32 {
    (v, Some(v != 0))
}

fn nz64(v: u64) -> R64 {
    (v, Some(v != 0))
}

fn finish(cx: &mut Cx<'_>, scc: Option<bool>) -> Step {
    if let Some(s) = scc {
        cx.w.scc = s;
    }
    Ok(Flow::Next)
}

/// SOP2 on 32-bit sources: `f(s0, s1, scc) -> (d, new scc)`.
fn sop2_32(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, u32, bool) -> R32) -> Step {
    let (a, b) = (s32(cx.w, i, i.src[0])?, s32(cx.w, i, i.src[1])?);
    let (d, scc) = f(a, b, cx.w.scc);
    set_s32(cx.w, i.dst, d)?;
    finish(cx, scc)
}

/// SOP2 on a 64-bit s0 and a 32-bit (`wide_b` false) or 64-bit s1.
fn sop2_64(cx: &mut Cx<'_>, i: &Instr, wide_b: bool, f: impl Fn(u64, u64, bool) -> R64) -> Step {
    let a = s64(cx.w, i, i.src[0])?;
    let b = if wide_b {
        s64(cx.w, i, i.src[1])?
    } else {
        s32(cx.w, i, i.src[1])? as u64
    };
    let (d, scc) = f(a, b, cx.w.scc);
    set_s64(cx.w, i.dst, d)?;
    finish(cx, scc)
}

fn sop1_32(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, bool) -> R32) -> Step {
    let (d, scc) = f(s32(cx.w, i, i.src[0])?, cx.w.scc);
    set_s32(cx.w, i.dst, d)?;
    finish(cx, scc)
}

fn sop1_64(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u64, bool) -> R64) -> Step {
    let (d, scc) = f(s64(cx.w, i, i.src[0])?, cx.w.scc);
    set_s64(cx.w, i.dst, d)?;
    finish(cx, scc)
}

/// SOP1 with a 64-bit source and a 32-bit result (bit counts, find-first).
fn sop1_64to32(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u64) -> R32) -> Step {
    let (d, scc) = f(s64(cx.w, i, i.src[0])?);
    set_s32(cx.w, i.dst, d)?;
    finish(cx, scc)
}

/// s_*_saveexec_b64: D = EXEC; EXEC = f(S0, EXEC); SCC = EXEC != 0.
fn saveexec(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u64, u64) -> u64) -> Step {
    let s = s64(cx.w, i, i.src[0])?;
    let old = cx.w.exec();
    let new = f(s, old);
    set_s64(cx.w, i.dst, old)?;
    cx.w.set_exec(new);
    finish(cx, Some(new != 0))
}

/// s_*_wrexec_b64: EXEC = D = f(S0, EXEC); SCC = EXEC != 0.
fn wrexec(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u64, u64) -> u64) -> Step {
    let new = f(s64(cx.w, i, i.src[0])?, cx.w.exec());
    cx.w.set_exec(new);
    set_s64(cx.w, i.dst, new)?;
    finish(cx, Some(new != 0))
}

fn sopc32(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, u32) -> bool) -> Step {
    let (a, b) = (s32(cx.w, i, i.src[0])?, s32(cx.w, i, i.src[1])?);
    finish(cx, Some(f(a, b)))
}

fn sopc64(cx: &mut Cx<'_>, i: &Instr, wide_b: bool, f: impl Fn(u64, u64) -> bool) -> Step {
    let a = s64(cx.w, i, i.src[0])?;
    let b = if wide_b {
        s64(cx.w, i, i.src[1])?
    } else {
        s32(cx.w, i, i.src[1])? as u64
    };
    finish(cx, Some(f(a, b)))
}

/// SOPK compares: D (the sdst register) against the immediate, signed or zero-extended.
fn cmpk(cx: &mut Cx<'_>, i: &Instr, signed: bool, f: impl Fn(i64, i64) -> bool) -> Step {
    let d = cx.w.sgpr(i.dst as usize);
    let (a, b) = if signed {
        (d as i32 as i64, i.simm16 as i16 as i64)
    } else {
        (d as i64, i.simm16 as i64)
    };
    finish(cx, Some(f(a, b)))
}

fn sopk(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, i32, bool) -> R32) -> Step {
    let (d, scc) = f(cx.w.sgpr(i.dst as usize), i.simm16 as i16 as i32, cx.w.scc);
    set_s32(cx.w, i.dst, d)?;
    finish(cx, scc)
}

fn bfe32(v: u32, ctl: u32, signed: bool) -> u32 {
    let (off, width) = (ctl & 31, (ctl >> 16) & 0x7f);
    if width == 0 {
        return 0;
    }
    let width = width.min(32);
    let x = v >> off;
    if width >= 32 {
        return x;
    }
    let m = x & ((1u32 << width) - 1);
    if signed && (m >> (width - 1)) & 1 == 1 {
        m | !((1u32 << width) - 1)
    } else {
        m
    }
}

fn bfe64(v: u64, ctl: u64, signed: bool) -> u64 {
    let (off, width) = (ctl & 63, (ctl >> 16) & 0x7f);
    if width == 0 {
        return 0;
    }
    let x = v >> off;
    if width >= 64 {
        return x;
    }
    let m = x & ((1u64 << width) - 1);
    if signed && (m >> (width - 1)) & 1 == 1 {
        m | !((1u64 << width) - 1)
    } else {
        m
    }
}

/// s_lshlN_add_u32: D = (S0 << N) + S1; SCC = the sum overflowed 32 bits.
fn lshl_add(a: u32, b: u32, n: u32) -> R32 {
    let wide = ((a as u64) << n) + b as u64;
    (wide as u32, Some(wide >> 32 != 0))
}

fn ff1_64(v: u64) -> u32 {
    if v == 0 {
        u32::MAX
    } else {
        v.trailing_zeros()
    }
}

fn flbit32(v: u32) -> u32 {
    if v == 0 {
        u32::MAX
    } else {
        v.leading_zeros()
    }
}

/// s_flbit_i32: leading bits equal to the sign bit, -1 when all are.
fn flbit_signed(v: u32) -> u32 {
    let x = if (v as i32) < 0 { !v } else { v };
    flbit32(x)
}

fn quadmask(v: u64, quads: u32) -> u64 {
    (0..quads).fold(0, |m, q| m | (((v >> (4 * q)) & 0xf != 0) as u64) << q)
}

fn wqm(v: u64) -> u64 {
    (0..16).fold(0, |m, q| {
        if (v >> (4 * q)) & 0xf != 0 {
            m | 0xf << (4 * q)
        } else {
            m
        }
    })
}

pub static SOP2: &[OpDef] = &[
    def(0x00, "s_add_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            let (d, c) = a.overflowing_add(b);
            (d, Some(c))
        })
    }),
    def(0x01, "s_sub_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            let (d, c) = a.overflowing_sub(b);
            (d, Some(c))
        })
    }),
    def(0x02, "s_add_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            let (d, o) = (a as i32).overflowing_add(b as i32);
            (d as u32, Some(o))
        })
    }),
    def(0x03, "s_sub_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            let (d, o) = (a as i32).overflowing_sub(b as i32);
            (d as u32, Some(o))
        })
    }),
    def(0x04, "s_addc_u32", |cx, i| {
        sop2_32(cx, i, |a, b, c| {
            let s = a as u64 + b as u64 + c as u64;
            (s as u32, Some(s >> 32 != 0))
        })
    }),
    def(0x05, "s_subb_u32", |cx, i| {
        sop2_32(cx, i, |a, b, c| {
            let s = (a as u64).wrapping_sub(b as u64).wrapping_sub(c as u64);
            (s as u32, Some((b as u64 + c as u64) > a as u64))
        })
    }),
    def(0x06, "s_min_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            (
                (a as i32).min(b as i32) as u32,
                Some((a as i32) < (b as i32)),
            )
        })
    }),
    def(0x07, "s_min_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| (a.min(b), Some(a < b)))
    }),
    def(0x08, "s_max_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            (
                (a as i32).max(b as i32) as u32,
                Some((a as i32) > (b as i32)),
            )
        })
    }),
    def(0x09, "s_max_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| (a.max(b), Some(a > b)))
    }),
    def(0x0a, "s_cselect_b32", |cx, i| {
        sop2_32(cx, i, |a, b, c| (if c { a } else { b }, None))
    }),
    def(0x0b, "s_cselect_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, c| (if c { a } else { b }, None))
    }),
    def(0x0c, "s_and_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a & b))
    }),
    def(0x0d, "s_and_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(a & b))
    }),
    def(0x0e, "s_or_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a | b))
    }),
    def(0x0f, "s_or_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(a | b))
    }),
    def(0x10, "s_xor_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a ^ b))
    }),
    def(0x11, "s_xor_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(a ^ b))
    }),
    def(0x12, "s_andn2_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a & !b))
    }),
    def(0x13, "s_andn2_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(a & !b))
    }),
    def(0x14, "s_orn2_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a | !b))
    }),
    def(0x15, "s_orn2_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(a | !b))
    }),
    def(0x16, "s_nand_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(!(a & b)))
    }),
    def(0x17, "s_nand_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(!(a & b)))
    }),
    def(0x18, "s_nor_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(!(a | b)))
    }),
    def(0x19, "s_nor_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(!(a | b)))
    }),
    def(0x1a, "s_xnor_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(!(a ^ b)))
    }),
    def(0x1b, "s_xnor_b64", |cx, i| {
        sop2_64(cx, i, true, |a, b, _| nz64(!(a ^ b)))
    }),
    def(0x1c, "s_lshl_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a << (b & 31)))
    }),
    def(0x1d, "s_lshl_b64", |cx, i| {
        sop2_64(cx, i, false, |a, b, _| nz64(a << (b & 63)))
    }),
    def(0x1e, "s_lshr_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(a >> (b & 31)))
    }),
    def(0x1f, "s_lshr_b64", |cx, i| {
        sop2_64(cx, i, false, |a, b, _| nz64(a >> (b & 63)))
    }),
    def(0x20, "s_ashr_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(((a as i32) >> (b & 31)) as u32))
    }),
    def(0x21, "s_ashr_i64", |cx, i| {
        sop2_64(cx, i, false, |a, b, _| {
            nz64(((a as i64) >> (b & 63)) as u64)
        })
    }),
    def(0x22, "s_bfm_b32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            ((((1u64 << (a & 31)) - 1) as u32) << (b & 31), None)
        })
    }),
    def(0x23, "s_bfm_b64", |cx, i| {
        let (a, b) = (s32(cx.w, i, i.src[0])?, s32(cx.w, i, i.src[1])?);
        let m = ((1u128 << (a & 63)) - 1) as u64;
        set_s64(cx.w, i.dst, m << (b & 63))?;
        Ok(Flow::Next)
    }),
    def(0x24, "s_mul_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| (a.wrapping_mul(b), None))
    }),
    def(0x25, "s_bfe_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(bfe32(a, b, false)))
    }),
    def(0x26, "s_bfe_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| nz32(bfe32(a, b, true)))
    }),
    def(0x27, "s_bfe_u64", |cx, i| {
        sop2_64(cx, i, false, |a, b, _| nz64(bfe64(a, b, false)))
    }),
    def(0x28, "s_bfe_i64", |cx, i| {
        sop2_64(cx, i, false, |a, b, _| nz64(bfe64(a, b, true)))
    }),
    def(0x2a, "s_absdiff_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            nz32((a as i32).wrapping_sub(b as i32).unsigned_abs())
        })
    }),
    def(0x2c, "s_mul_hi_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            (((a as u64 * b as u64) >> 32) as u32, None)
        })
    }),
    def(0x2d, "s_mul_hi_i32", |cx, i| {
        sop2_32(cx, i, |a, b, _| {
            (((a as i32 as i64 * b as i32 as i64) >> 32) as u32, None)
        })
    }),
    def(0x2e, "s_lshl1_add_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| lshl_add(a, b, 1))
    }),
    def(0x2f, "s_lshl2_add_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| lshl_add(a, b, 2))
    }),
    def(0x30, "s_lshl3_add_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| lshl_add(a, b, 3))
    }),
    def(0x31, "s_lshl4_add_u32", |cx, i| {
        sop2_32(cx, i, |a, b, _| lshl_add(a, b, 4))
    }),
    def(0x32, "s_pack_ll_b32_b16", |cx, i| {
        sop2_32(cx, i, |a, b, _| ((a & 0xffff) | b << 16, None))
    }),
    def(0x33, "s_pack_lh_b32_b16", |cx, i| {
        sop2_32(cx, i, |a, b, _| ((a & 0xffff) | (b & 0xffff_0000), None))
    }),
    def(0x34, "s_pack_hh_b32_b16", |cx, i| {
        sop2_32(cx, i, |a, b, _| ((a >> 16) | (b & 0xffff_0000), None))
    }),
];

pub static SOP1: &[OpDef] = &[
    def(0x00, "s_mov_b32", |cx, i| sop1_32(cx, i, |a, _| (a, None))),
    def(0x01, "s_mov_b64", |cx, i| sop1_64(cx, i, |a, _| (a, None))),
    def(0x02, "s_cmov_b32", |cx, i| {
        let d = cx.w.sgpr(i.dst as usize);
        sop1_32(cx, i, |a, c| (if c { a } else { d }, None))
    }),
    def(0x03, "s_cmov_b64", |cx, i| {
        let d = cx.w.sgpr64(i.dst as usize);
        sop1_64(cx, i, |a, c| (if c { a } else { d }, None))
    }),
    def(0x04, "s_not_b32", |cx, i| sop1_32(cx, i, |a, _| nz32(!a))),
    def(0x05, "s_not_b64", |cx, i| sop1_64(cx, i, |a, _| nz64(!a))),
    def(0x06, "s_wqm_b32", |cx, i| {
        sop1_32(cx, i, |a, _| nz32(wqm(a as u64) as u32))
    }),
    def(0x07, "s_wqm_b64", |cx, i| {
        sop1_64(cx, i, |a, _| nz64(wqm(a)))
    }),
    def(0x08, "s_brev_b32", |cx, i| {
        sop1_32(cx, i, |a, _| (a.reverse_bits(), None))
    }),
    def(0x09, "s_brev_b64", |cx, i| {
        sop1_64(cx, i, |a, _| (a.reverse_bits(), None))
    }),
    def(0x0a, "s_bcnt0_i32_b32", |cx, i| {
        sop1_32(cx, i, |a, _| nz32(a.count_zeros()))
    }),
    def(0x0b, "s_bcnt0_i32_b64", |cx, i| {
        sop1_64to32(cx, i, |a| nz32(a.count_zeros()))
    }),
    def(0x0c, "s_bcnt1_i32_b32", |cx, i| {
        sop1_32(cx, i, |a, _| nz32(a.count_ones()))
    }),
    def(0x0d, "s_bcnt1_i32_b64", |cx, i| {
        sop1_64to32(cx, i, |a| nz32(a.count_ones()))
    }),
    def(0x0e, "s_ff0_i32_b32", |cx, i| {
        sop1_32(cx, i, |a, _| (ff1_64(!a as u64 & 0xffff_ffff), None))
    }),
    def(0x0f, "s_ff0_i32_b64", |cx, i| {
        sop1_64to32(cx, i, |a| (ff1_64(!a), None))
    }),
    def(0x10, "s_ff1_i32_b32", |cx, i| {
        sop1_32(cx, i, |a, _| (ff1_64(a as u64), None))
    }),
    def(0x11, "s_ff1_i32_b64", |cx, i| {
        sop1_64to32(cx, i, |a| (ff1_64(a), None))
    }),
    def(0x12, "s_flbit_i32_b32", |cx, i| {
        sop1_32(cx, i, |a, _| (flbit32(a), None))
    }),
    def(0x13, "s_flbit_i32_b64", |cx, i| {
        sop1_64to32(cx, i, |a| {
            (if a == 0 { u32::MAX } else { a.leading_zeros() }, None)
        })
    }),
    def(0x14, "s_flbit_i32", |cx, i| {
        sop1_32(cx, i, |a, _| (flbit_signed(a), None))
    }),
    def(0x16, "s_sext_i32_i8", |cx, i| {
        sop1_32(cx, i, |a, _| (a as i8 as i32 as u32, None))
    }),
    def(0x17, "s_sext_i32_i16", |cx, i| {
        sop1_32(cx, i, |a, _| (a as i16 as i32 as u32, None))
    }),
    def(0x18, "s_bitset0_b32", |cx, i| {
        let d = cx.w.sgpr(i.dst as usize);
        sop1_32(cx, i, |a, _| (d & !(1 << (a & 31)), None))
    }),
    def(0x1a, "s_bitset1_b32", |cx, i| {
        let d = cx.w.sgpr(i.dst as usize);
        sop1_32(cx, i, |a, _| (d | 1 << (a & 31), None))
    }),
    def(0x1c, "s_getpc_b64", |cx, i| {
        set_s64(cx.w, i.dst, cx.w.pc + i.len as u64)?;
        Ok(Flow::Next)
    }),
    def(0x1d, "s_setpc_b64", |cx, i| {
        Ok(Flow::Jump(s64(cx.w, i, i.src[0])?))
    }),
    def(0x1e, "s_swappc_b64", |cx, i| {
        let target = s64(cx.w, i, i.src[0])?;
        set_s64(cx.w, i.dst, cx.w.pc + i.len as u64)?;
        Ok(Flow::Jump(target))
    }),
    def(0x20, "s_and_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| s & e)
    }),
    def(0x21, "s_or_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| s | e)
    }),
    def(0x22, "s_xor_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| s ^ e)
    }),
    def(0x23, "s_andn2_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| s & !e)
    }),
    def(0x24, "s_orn2_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| s | !e)
    }),
    def(0x25, "s_nand_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| !(s & e))
    }),
    def(0x26, "s_nor_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| !(s | e))
    }),
    def(0x27, "s_xnor_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| !(s ^ e))
    }),
    def(0x28, "s_quadmask_b32", |cx, i| {
        sop1_32(cx, i, |a, _| nz32(quadmask(a as u64, 8) as u32))
    }),
    def(0x29, "s_quadmask_b64", |cx, i| {
        sop1_64(cx, i, |a, _| nz64(quadmask(a, 16)))
    }),
    def(0x2a, "s_movrels_b32", |cx, i| {
        let v = s32(cx.w, i, i.src[0] + cx.w.m0() as u16)?;
        set_s32(cx.w, i.dst, v)?;
        Ok(Flow::Next)
    }),
    def(0x2c, "s_movreld_b32", |cx, i| {
        let v = s32(cx.w, i, i.src[0])?;
        set_s32(cx.w, i.dst + cx.w.m0() as u16, v)?;
        Ok(Flow::Next)
    }),
    def(0x30, "s_abs_i32", |cx, i| {
        sop1_32(cx, i, |a, _| nz32((a as i32).wrapping_abs() as u32))
    }),
    def(0x33, "s_andn1_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| !s & e)
    }),
    def(0x34, "s_orn1_saveexec_b64", |cx, i| {
        saveexec(cx, i, |s, e| !s | e)
    }),
    def(0x35, "s_andn1_wrexec_b64", |cx, i| {
        wrexec(cx, i, |s, e| !s & e)
    }),
    def(0x36, "s_andn2_wrexec_b64", |cx, i| {
        wrexec(cx, i, |s, e| s & !e)
    }),
    def(0x37, "s_bitreplicate_b64_b32", |cx, i| {
        let a = s32(cx.w, i, i.src[0])?;
        let d = (0..32).fold(0u64, |m, k| m | (((a >> k) & 1) as u64 * 3) << (2 * k));
        set_s64(cx.w, i.dst, d)?;
        Ok(Flow::Next)
    }),
];

pub static SOPC: &[OpDef] = &[
    def(0x00, "s_cmp_eq_i32", |cx, i| sopc32(cx, i, |a, b| a == b)),
    def(0x01, "s_cmp_lg_i32", |cx, i| sopc32(cx, i, |a, b| a != b)),
    def(0x02, "s_cmp_gt_i32", |cx, i| {
        sopc32(cx, i, |a, b| a as i32 > b as i32)
    }),
    def(0x03, "s_cmp_ge_i32", |cx, i| {
        sopc32(cx, i, |a, b| a as i32 >= b as i32)
    }),
    def(0x04, "s_cmp_lt_i32", |cx, i| {
        sopc32(cx, i, |a, b| (a as i32) < b as i32)
    }),
    def(0x05, "s_cmp_le_i32", |cx, i| {
        sopc32(cx, i, |a, b| a as i32 <= b as i32)
    }),
    def(0x06, "s_cmp_eq_u32", |cx, i| sopc32(cx, i, |a, b| a == b)),
    def(0x07, "s_cmp_lg_u32", |cx, i| sopc32(cx, i, |a, b| a != b)),
    def(0x08, "s_cmp_gt_u32", |cx, i| sopc32(cx, i, |a, b| a > b)),
    def(0x09, "s_cmp_ge_u32", |cx, i| sopc32(cx, i, |a, b| a >= b)),
    def(0x0a, "s_cmp_lt_u32", |cx, i| sopc32(cx, i, |a, b| a < b)),
    def(0x0b, "s_cmp_le_u32", |cx, i| sopc32(cx, i, |a, b| a <= b)),
    def(0x0c, "s_bitcmp0_b32", |cx, i| {
        sopc32(cx, i, |a, b| (a >> (b & 31)) & 1 == 0)
    }),
    def(0x0d, "s_bitcmp1_b32", |cx, i| {
        sopc32(cx, i, |a, b| (a >> (b & 31)) & 1 == 1)
    }),
    def(0x0e, "s_bitcmp0_b64", |cx, i| {
        sopc64(cx, i, false, |a, b| (a >> (b & 63)) & 1 == 0)
    }),
    def(0x0f, "s_bitcmp1_b64", |cx, i| {
        sopc64(cx, i, false, |a, b| (a >> (b & 63)) & 1 == 1)
    }),
    def(0x12, "s_cmp_eq_u64", |cx, i| {
        sopc64(cx, i, true, |a, b| a == b)
    }),
    def(0x13, "s_cmp_lg_u64", |cx, i| {
        sopc64(cx, i, true, |a, b| a != b)
    }),
];

/// s_getreg/s_setreg's simm16: register id, bit offset, size.
fn hwreg_field(simm: u16) -> (u16, u32, u32) {
    (
        simm & 0x3f,
        ((simm >> 6) & 31) as u32,
        ((simm >> 11) & 31) as u32 + 1,
    )
}

fn hwreg_mut<'a>(cx: &'a mut Cx<'_>, id: u16) -> Option<&'a mut u32> {
    match id {
        hwreg::MODE => Some(&mut cx.w.mode),
        hwreg::STATUS => Some(&mut cx.w.status),
        hwreg::TRAPSTS => Some(&mut cx.w.trapsts),
        hwreg::HW_ID => Some(&mut cx.w.hw_id),
        _ => None,
    }
}

/// SH_MEM_BASES: bits 63:48 of the private (15:0) and shared (31:16) apertures, which
/// hipcc's code reads to turn a stack or LDS address into a flat one.
fn sh_mem_bases(w: &Wave) -> u32 {
    let ap = w.apertures;
    (ap.private_base >> 48) as u32 & 0xffff | ((ap.shared_base >> 48) as u32) << 16
}

fn getreg(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let (id, off, size) = hwreg_field(i.simm16);
    let v = match id {
        hwreg::TBA_LO => cx.w.tba as u32,
        hwreg::TBA_HI => (cx.w.tba >> 32) as u32,
        hwreg::TMA_LO => cx.w.tma as u32,
        hwreg::TMA_HI => (cx.w.tma >> 32) as u32,
        hwreg::SH_MEM_BASES => sh_mem_bases(cx.w),
        hwreg::XCC_ID if cx.w.target == Target::Gfx942 => cx.w.xcc_id,
        hwreg::GPR_ALLOC | hwreg::LDS_ALLOC | hwreg::IB_STS => 0,
        _ => *hwreg_mut(cx, id)
            .ok_or_else(|| bad("s_getreg_b32", "hardware register not modelled"))?,
    };
    let field = ((v as u64 >> off) & ((1u64 << size) - 1)) as u32;
    set_s32(cx.w, i.dst, field)?;
    Ok(Flow::Next)
}

fn setreg(cx: &mut Cx<'_>, i: &Instr, value: u32) -> Step {
    let (id, off, size) = hwreg_field(i.simm16);
    let mask = (((1u64 << size) - 1) << off) as u32;
    let r =
        hwreg_mut(cx, id).ok_or_else(|| bad("s_setreg_b32", "hardware register not modelled"))?;
    *r = (*r & !mask) | ((value << off) & mask);
    Ok(Flow::Next)
}

pub static SOPK: &[OpDef] = &[
    def(0x00, "s_movk_i32", |cx, i| {
        sopk(cx, i, |_, k, _| (k as u32, None))
    }),
    def(0x01, "s_cmovk_i32", |cx, i| {
        sopk(cx, i, |d, k, c| (if c { k as u32 } else { d }, None))
    }),
    def(0x02, "s_cmpk_eq_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a == b)
    }),
    def(0x03, "s_cmpk_lg_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a != b)
    }),
    def(0x04, "s_cmpk_gt_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a > b)
    }),
    def(0x05, "s_cmpk_ge_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a >= b)
    }),
    def(0x06, "s_cmpk_lt_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a < b)
    }),
    def(0x07, "s_cmpk_le_i32", |cx, i| {
        cmpk(cx, i, true, |a, b| a <= b)
    }),
    def(0x08, "s_cmpk_eq_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a == b)
    }),
    def(0x09, "s_cmpk_lg_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a != b)
    }),
    def(0x0a, "s_cmpk_gt_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a > b)
    }),
    def(0x0b, "s_cmpk_ge_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a >= b)
    }),
    def(0x0c, "s_cmpk_lt_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a < b)
    }),
    def(0x0d, "s_cmpk_le_u32", |cx, i| {
        cmpk(cx, i, false, |a, b| a <= b)
    }),
    def(0x0e, "s_addk_i32", |cx, i| {
        sopk(cx, i, |d, k, _| {
            let (r, o) = (d as i32).overflowing_add(k);
            (r as u32, Some(o))
        })
    }),
    def(0x0f, "s_mulk_i32", |cx, i| {
        sopk(cx, i, |d, k, _| ((d as i32).wrapping_mul(k) as u32, None))
    }),
    def(0x11, "s_getreg_b32", getreg),
    def(0x12, "s_setreg_b32", |cx, i| {
        let v = cx.w.sgpr(i.dst as usize);
        setreg(cx, i, v)
    }),
    def(0x14, "s_setreg_imm32_b32", |cx, i| setreg(cx, i, i.literal)),
    def(0x15, "s_call_b64", |cx, i| {
        let next = cx.w.pc + i.len as u64;
        set_s64(cx.w, i.dst, next)?;
        Ok(Flow::Jump(
            next.wrapping_add((i.simm16 as i16 as i64 * 4) as u64),
        ))
    }),
];
