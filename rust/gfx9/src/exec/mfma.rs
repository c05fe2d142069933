//! MFMA (VOP3P-MAI): the matrix fused multiply-adds of gfx908 and gfx90a, D = A * B + C over
//! one or more independent blocks, with the operand layouts of AMD's MI100/MI200 ISA guides
//! (and AMD's matrix instruction calculator):
//!
//! - A (src0) and B (src1): lane `i + n*(g + G*b)` holds row `i` of A (column `i` of B) of
//!   block `b`, elements `kl*g .. kl*g + kl` of the k dimension (k-group `g` of `G`), packed
//!   in its VGPRs or AccVGPRs (one f32; two or four f16/bf16; four i8).
//! - C (src2) and D (vdst): n ≥ 16: block `b` takes `n*n/64` registers; element (i, j) sits
//!   in register `4*(i / (4*L)) + i % 4` of the block, lane `j + n*((i / 4) % L)` with `L =
//!   64/n` lane groups. n = 4: element (i, j) of block `b` in register `i`, lane `j + 4*b`.
//!
//! The f64 forms (gfx90a, gfx942) lay their operands out differently (AMD's matrix-cores
//! lab notes, `mfma_fp64_*.cpp`): one f64 (a register pair) per lane and element;
//! 16x16x4: A's lane `i + 16 k` holds A[i][k], B's lane `j + 16 k` holds B[k][j], pair `r`
//! of lane `l` of C and D holds element (4 r + l / 16, l % 16). 4x4x4 (four blocks): A's
//! lane `i + 4 b + 16 k` holds A[b][i][k], B's lane `j + 4 b + 16 k` holds B[b][k][j],
//! C and D are one pair, lane `j + 4 b + 16 i` holding D[b][i][j].
//!
//! Products are accumulated in k order in f32 (i32 for i8, f64 for f64), each fused into
//! the running sum (one rounding per step); the hardware's internal order and precision are
//! not specified beyond that, so results may differ in the last bits unless every partial
//! sum is exact (the tests keep them exact). Partial EXEC and the broadcast controls (CBSZ,
//! ABID, BLGP) are refused, not guessed.
//!
//! gfx942 adds dense forms with the f32/f16 forms' layouts and more elements per lane (MI300
//! ISA guide): xf32 (two f32 in two registers, read with the low 13 mantissa bits dropped:
//! the hardware truncates, as hipBLASLt's measurements show), i8 (eight in two registers)
//! and fp8/bf8 (eight in two registers, A's format first in the name; `fp8.rs` has the
//! formats; every product is exact in f32). On its f64 forms BLGP's three bits negate A, B
//! and C (LLVM's `neg:[a,b,c]`). The sparse v_smfmac_* forms are not run.

use super::fp8::F8;
use super::opdef::{def, def_on, OpDef};
use super::operand::Kind;
use super::{bad, Cx, Flow, Step};
use crate::decode::{Instr, VGPR0};
use crate::fp::f16_to_f32;
use crate::state::{Target, LANES};

/// How a lane's A and B registers hold its k elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    F32,
    /// Four f16 in two registers.
    F16,
    /// Two bf16 in one register (gfx908's bf16 forms).
    Bf16x2,
    /// Four bf16 in two registers (the _1k forms).
    Bf16x4,
    /// Four i8 in one register, accumulated in i32.
    I8,
    /// One f64 in a register pair, accumulated in f64 (the f64 layouts, above).
    F64,
    /// Eight i8 in two registers (gfx942), accumulated in i32.
    I8x8,
    /// Eight fp8 (E4M3FNUZ) or bf8 (E5M2FNUZ) in two registers (gfx942), exact in f32.
    F8(F8),
    /// Two f32 in two registers read as xf32 (gfx942): the low 13 mantissa bits are
    /// dropped (truncation toward zero, as the hardware does; NaN stays NaN).
    Xf32,
}

impl Elem {
    /// Elements per lane and the registers they take.
    fn per_lane(self) -> (usize, usize) {
        match self {
            Elem::F32 => (1, 1),
            Elem::F16 | Elem::Bf16x4 => (4, 2),
            Elem::Bf16x2 => (2, 1),
            Elem::I8 => (4, 1),
            Elem::F64 => (1, 2),
            Elem::Xf32 => (2, 2),
            Elem::I8x8 | Elem::F8(_) => (8, 2),
        }
    }

    /// Element `e` of registers `r` (low register first) as f32, or as i32 for i8.
    fn get(self, r: &[u32; 2], e: usize) -> Num {
        let half = |e: usize| (r[e / 2] >> (16 * (e % 2))) as u16;
        match self {
            Elem::F32 => Num::F(f32::from_bits(r[0])),
            Elem::F16 => Num::F(f16_to_f32(half(e))),
            Elem::Bf16x2 | Elem::Bf16x4 => Num::F(f32::from_bits((half(e) as u32) << 16)),
            Elem::I8 => Num::I((r[0] >> (8 * e)) as u8 as i8 as i32),
            Elem::F64 => Num::D(f64::from_bits(pair(r[0], r[1]))),
            Elem::I8x8 => Num::I((r[e / 4] >> (8 * (e % 4))) as u8 as i8 as i32),
            Elem::F8(f) => Num::F(f.to_f32((r[e / 4] >> (8 * (e % 4))) as u8)),
            Elem::Xf32 => {
                let x = f32::from_bits(r[e]);
                Num::F(if x.is_nan() {
                    x
                } else {
                    f32::from_bits(r[e] & !0x1fff)
                })
            }
        }
    }
}

fn pair(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

#[derive(Clone, Copy)]
enum Num {
    F(f32),
    I(i32),
    D(f64),
}

impl Num {
    fn neg(self) -> Num {
        match self {
            Num::F(x) => Num::F(-x),
            Num::I(x) => Num::I(x.wrapping_neg()),
            Num::D(x) => Num::D(-x),
        }
    }

    /// `self + x * y`, the product fused into the sum (wrapping for i32).
    fn fma(self, x: Num, y: Num) -> Num {
        match (self, x, y) {
            (Num::F(c), Num::F(x), Num::F(y)) => Num::F(x.mul_add(y, c)),
            (Num::I(c), Num::I(x), Num::I(y)) => Num::I(c.wrapping_add(x.wrapping_mul(y))),
            (Num::D(c), Num::D(x), Num::D(y)) => Num::D(x.mul_add(y, c)),
            _ => unreachable!("one element kind per opcode"),
        }
    }
}

/// One MFMA opcode's shape: n x n blocks, `blocks` of them, `groups` k-groups per block.
#[derive(Clone, Copy, Debug)]
struct Shape {
    n: usize,
    blocks: usize,
    groups: usize,
    /// A's elements (and B's but for gfx942's mixed fp8/bf8 forms).
    elem: Elem,
    elem_b: Elem,
}

impl Shape {
    fn regs_out(self) -> usize {
        if self.elem == Elem::F64 {
            2 * self.blocks * self.n * self.n / 64
        } else if self.n == 4 {
            4
        } else {
            self.blocks * self.n * self.n / 64
        }
    }

    fn k(self) -> usize {
        self.groups * self.elem.per_lane().0
    }

    /// The lane holding row/column `i` of block `b`, k-group `g` of A and B.
    fn ab_lane(self, i: usize, g: usize, b: usize) -> usize {
        if self.elem == Elem::F64 {
            return i + self.n * (b + self.blocks * g);
        }
        i + self.n * (g + self.groups * b)
    }

    /// Register (the first of a pair for f64) and lane of element (i, j) of block `b` of C
    /// and D.
    fn cd_at(self, b: usize, i: usize, j: usize) -> (usize, usize) {
        if self.elem == Elem::F64 {
            return match self.n {
                4 => (0, j + 4 * b + 16 * i),
                _ => (2 * (i / 4), j + 16 * (i % 4)),
            };
        }
        if self.n == 4 {
            return (i, j + 4 * b);
        }
        let groups = 64 / self.n;
        let per_block = self.n * self.n / 64;
        let r = 4 * (i / (4 * groups)) + i % 4;
        (per_block * b + r, j + self.n * ((i / 4) % groups))
    }
}

/// Where a MAI operand lives: AccVGPRs or VGPRs.
fn row<'a>(cx: &'a Cx<'_>, acc: bool, r: usize) -> &'a [u32; LANES] {
    if acc {
        cx.w.a(r)
    } else {
        cx.w.v(r)
    }
}

/// A lane's A or B registers.
fn ab_regs(
    cx: &Cx<'_>,
    code: u16,
    acc: bool,
    regs: usize,
    l: usize,
) -> Result<[u32; 2], super::Abort> {
    let r = code
        .checked_sub(VGPR0)
        .ok_or(bad("v_mfma", "A and B must be registers"))? as usize;
    if r + regs > 256 {
        return Err(bad("v_mfma", "register tuple runs past 255"));
    }
    let mut v = [0u32; 2];
    for (k, slot) in v.iter_mut().enumerate().take(regs) {
        *slot = row(cx, acc, r + k)[l];
    }
    Ok(v)
}

/// The negations gfx942 allows on the f64 forms (BLGP's bits: A, B, C), after refusing the
/// broadcast controls and partial EXEC.
fn controls(cx: &Cx<'_>, i: &Instr, s: Shape) -> Result<u8, super::Abort> {
    let abid = i.op_sel | ((i.op_sel_hi >> 2) & 1) << 3;
    let neg = if s.elem == Elem::F64 && cx.w.target == Target::Gfx942 {
        i.neg
    } else {
        0
    };
    if i.neg_hi != 0 || abid != 0 || i.neg != neg {
        return Err(bad("v_mfma", "CBSZ, ABID and BLGP are not modelled"));
    }
    if cx.w.exec() != u64::MAX {
        return Err(bad("v_mfma", "partial EXEC is not modelled"));
    }
    Ok(neg)
}

fn mfma(cx: &mut Cx<'_>, i: &Instr, s: Shape) -> Step {
    let neg = controls(cx, i, s)?;
    // gfx908: C and D are AccVGPRs; gfx90a: ACC_CD (the clamp bit's place) chooses.
    let cd_acc = cx.w.target == Target::Gfx908 || i.clamp;
    let nout = s.regs_out();
    if i.dst as usize + nout > 256 {
        return Err(bad("v_mfma", "destination tuple runs past 255"));
    }
    let mut d = [[0u32; LANES]; 32];
    load_c(cx, i, nout, cd_acc, s.elem == Elem::F64, &mut d)?;
    for b in 0..s.blocks {
        for ii in 0..s.n {
            for j in 0..s.n {
                let (r, l) = s.cd_at(b, ii, j);
                let mut acc = match s.elem {
                    Elem::I8 | Elem::I8x8 => Num::I(d[r][l] as i32),
                    Elem::F64 => Num::D(f64::from_bits(pair(d[r][l], d[r + 1][l]))),
                    _ => Num::F(f32::from_bits(d[r][l])),
                };
                if neg & 4 != 0 {
                    acc = acc.neg();
                }
                acc = dot(cx, i, s, neg, (b, ii, j), acc)?;
                match acc {
                    Num::F(f) => d[r][l] = f.to_bits(),
                    Num::I(v) => d[r][l] = v as u32,
                    Num::D(f) => {
                        d[r][l] = f.to_bits() as u32;
                        d[r + 1][l] = (f.to_bits() >> 32) as u32;
                    }
                };
            }
        }
    }
    for (k, vals) in d.iter().enumerate().take(nout) {
        let dst = i.dst as usize + k;
        if cd_acc {
            *cx.w.a_mut(dst) = *vals;
        } else {
            *cx.w.v_mut(dst) = *vals;
        }
    }
    Ok(Flow::Next)
}

/// `acc` plus row `ii` of block `b` of A times column `j` of B, in k order.
fn dot(
    cx: &Cx<'_>,
    i: &Instr,
    s: Shape,
    neg: u8,
    (b, ii, j): (usize, usize, usize),
    mut acc: Num,
) -> Result<Num, super::Abort> {
    let (per, regs) = s.elem.per_lane();
    for kk in 0..s.k() {
        let (g, e) = (kk / per, kk % per);
        let la = s.ab_lane(ii, g, b);
        let lb = s.ab_lane(j, g, b);
        let mut a = s
            .elem
            .get(&ab_regs(cx, i.src[0], i.op_sel_hi & 1 != 0, regs, la)?, e);
        let mut bv = s
            .elem_b
            .get(&ab_regs(cx, i.src[1], i.op_sel_hi & 2 != 0, regs, lb)?, e);
        if neg & 1 != 0 {
            a = a.neg();
        }
        if neg & 2 != 0 {
            bv = bv.neg();
        }
        acc = acc.fma(a, bv);
    }
    Ok(acc)
}

/// C: `nout` registers, or one scalar operand (an inline constant, 64 bits wide for the f64
/// forms) for every element.
fn load_c(
    cx: &Cx<'_>,
    i: &Instr,
    nout: usize,
    acc: bool,
    wide: bool,
    d: &mut [[u32; LANES]; 32],
) -> Result<(), super::Abort> {
    match i.src[2].checked_sub(VGPR0) {
        Some(r) if r as usize + nout > 256 => Err(bad("v_mfma", "C tuple runs past 255")),
        Some(r) => {
            for (k, out) in d.iter_mut().enumerate().take(nout) {
                *out = *row(cx, acc, r as usize + k);
            }
            Ok(())
        }
        None if wide => {
            let v = super::operand::scalar(cx.w, i, i.src[2], Kind::F64)?;
            for (k, out) in d.iter_mut().enumerate().take(nout) {
                *out = [(v >> (32 * (k % 2))) as u32; LANES];
            }
            Ok(())
        }
        None => {
            let v = super::operand::s32(cx.w, i, i.src[2])?;
            for out in d.iter_mut().take(nout) {
                *out = [v; LANES];
            }
            Ok(())
        }
    }
}

macro_rules! mfma_ops {
    ($($t:ident $op:literal $name:literal $n:literal $blocks:literal $groups:literal $elem:ident;)*) => {
        &[$(mfma_ops!(@one $t $op $name $n $blocks $groups $elem)),*]
    };
    (@one both $op:literal $name:literal $n:literal $blocks:literal $groups:literal $elem:ident) => {
        def($op, $name, |cx, i| mfma(cx, i, Shape { n: $n, blocks: $blocks, groups: $groups, elem: Elem::$elem, elem_b: Elem::$elem }))
    };
    (@one gfx90a $op:literal $name:literal $n:literal $blocks:literal $groups:literal $elem:ident) => {
        def_on(Target::Gfx90a, $op, $name, |cx, i| mfma(cx, i, Shape { n: $n, blocks: $blocks, groups: $groups, elem: Elem::$elem, elem_b: Elem::$elem }))
    };
    (@one gfx942 $op:literal $name:literal $n:literal $blocks:literal $groups:literal $elem:ident) => {
        def_on(Target::Gfx942, $op, $name, |cx, i| mfma(cx, i, Shape { n: $n, blocks: $blocks, groups: $groups, elem: Elem::$elem, elem_b: Elem::$elem }))
    };
}

/// The MFMA opcodes (VOP3P 0x40..).
pub static MFMA: &[OpDef] = mfma_ops! {
    both 0x40 "v_mfma_f32_32x32x1f32" 32 2 1 F32;
    both 0x41 "v_mfma_f32_16x16x1f32" 16 4 1 F32;
    both 0x42 "v_mfma_f32_4x4x1f32" 4 16 1 F32;
    both 0x44 "v_mfma_f32_32x32x2f32" 32 1 2 F32;
    both 0x45 "v_mfma_f32_16x16x4f32" 16 1 4 F32;
    both 0x48 "v_mfma_f32_32x32x4f16" 32 2 1 F16;
    both 0x49 "v_mfma_f32_16x16x4f16" 16 4 1 F16;
    both 0x4a "v_mfma_f32_4x4x4f16" 4 16 1 F16;
    both 0x4c "v_mfma_f32_32x32x8f16" 32 1 2 F16;
    both 0x4d "v_mfma_f32_16x16x16f16" 16 1 4 F16;
    both 0x50 "v_mfma_i32_32x32x4i8" 32 2 1 I8;
    both 0x51 "v_mfma_i32_16x16x4i8" 16 4 1 I8;
    both 0x52 "v_mfma_i32_4x4x4i8" 4 16 1 I8;
    both 0x54 "v_mfma_i32_32x32x8i8" 32 1 2 I8;
    both 0x55 "v_mfma_i32_16x16x16i8" 16 1 4 I8;
    gfx90a 0x63 "v_mfma_f32_32x32x4bf16_1k" 32 2 1 Bf16x4;
    gfx90a 0x64 "v_mfma_f32_16x16x4bf16_1k" 16 4 1 Bf16x4;
    gfx90a 0x65 "v_mfma_f32_4x4x4bf16_1k" 4 16 1 Bf16x4;
    gfx90a 0x66 "v_mfma_f32_32x32x8bf16_1k" 32 1 2 Bf16x4;
    gfx90a 0x67 "v_mfma_f32_16x16x16bf16_1k" 16 1 4 Bf16x4;
    both 0x68 "v_mfma_f32_32x32x2bf16" 32 2 1 Bf16x2;
    both 0x69 "v_mfma_f32_16x16x2bf16" 16 4 1 Bf16x2;
    both 0x6b "v_mfma_f32_4x4x2bf16" 4 16 1 Bf16x2;
    both 0x6c "v_mfma_f32_32x32x4bf16" 32 1 2 Bf16x2;
    both 0x6d "v_mfma_f32_16x16x8bf16" 16 1 4 Bf16x2;
    gfx90a 0x6e "v_mfma_f64_16x16x4f64" 16 1 4 F64;
    gfx90a 0x6f "v_mfma_f64_4x4x4f64" 4 4 4 F64;
};

/// gfx942's names of the MFMA forms it kept from gfx90a (same shapes and layouts; the
/// gfx90a names are dropped on gfx942, `exec/gfx942.rs`).
pub static MFMA_GFX942: &[OpDef] = mfma_ops! {
    gfx942 0x40 "v_mfma_f32_32x32x1_2b_f32" 32 2 1 F32;
    gfx942 0x41 "v_mfma_f32_16x16x1_4b_f32" 16 4 1 F32;
    gfx942 0x42 "v_mfma_f32_4x4x1_16b_f32" 4 16 1 F32;
    gfx942 0x44 "v_mfma_f32_32x32x2_f32" 32 1 2 F32;
    gfx942 0x45 "v_mfma_f32_16x16x4_f32" 16 1 4 F32;
    gfx942 0x48 "v_mfma_f32_32x32x4_2b_f16" 32 2 1 F16;
    gfx942 0x49 "v_mfma_f32_16x16x4_4b_f16" 16 4 1 F16;
    gfx942 0x4a "v_mfma_f32_4x4x4_16b_f16" 4 16 1 F16;
    gfx942 0x4c "v_mfma_f32_32x32x8_f16" 32 1 2 F16;
    gfx942 0x4d "v_mfma_f32_16x16x16_f16" 16 1 4 F16;
    gfx942 0x50 "v_mfma_i32_32x32x4_2b_i8" 32 2 1 I8;
    gfx942 0x51 "v_mfma_i32_16x16x4_4b_i8" 16 4 1 I8;
    gfx942 0x52 "v_mfma_i32_4x4x4_16b_i8" 4 16 1 I8;
    gfx942 0x5d "v_mfma_f32_32x32x4_2b_bf16" 32 2 1 Bf16x4;
    gfx942 0x5e "v_mfma_f32_16x16x4_4b_bf16" 16 4 1 Bf16x4;
    gfx942 0x5f "v_mfma_f32_4x4x4_16b_bf16" 4 16 1 Bf16x4;
    gfx942 0x60 "v_mfma_f32_32x32x8_bf16" 32 1 2 Bf16x4;
    gfx942 0x61 "v_mfma_f32_16x16x16_bf16" 16 1 4 Bf16x4;
    gfx942 0x6e "v_mfma_f64_16x16x4_f64" 16 1 4 F64;
    gfx942 0x6f "v_mfma_f64_4x4x4_4b_f64" 4 4 4 F64;
};

const FP8: Elem = Elem::F8(F8::Fp8);
const BF8: Elem = Elem::F8(F8::Bf8);

macro_rules! mfma_gfx942 {
    ($($op:literal $name:literal $n:literal $groups:literal $a:ident $b:ident;)*) => {
        &[$(def_on(Target::Gfx942, $op, $name, |cx, i| {
            mfma(cx, i, Shape { n: $n, blocks: 1, groups: $groups, elem: $a, elem_b: $b })
        })),*]
    };
}

const I8X8: Elem = Elem::I8x8;
const XF32: Elem = Elem::Xf32;

/// The dense MFMA forms new on gfx940: xf32, 8-bit-per-lane i8, and fp8/bf8 (A's format
/// first in the name); the same layouts as the f32/f16 forms, 2 or 8 elements per lane.
pub static MFMA_GFX942_NEW: &[OpDef] = mfma_gfx942! {
    0x3e "v_mfma_f32_16x16x8_xf32" 16 4 XF32 XF32;
    0x3f "v_mfma_f32_32x32x4_xf32" 32 2 XF32 XF32;
    0x56 "v_mfma_i32_32x32x16_i8" 32 2 I8X8 I8X8;
    0x57 "v_mfma_i32_16x16x32_i8" 16 4 I8X8 I8X8;
    0x70 "v_mfma_f32_16x16x32_bf8_bf8" 16 4 BF8 BF8;
    0x71 "v_mfma_f32_16x16x32_bf8_fp8" 16 4 BF8 FP8;
    0x72 "v_mfma_f32_16x16x32_fp8_bf8" 16 4 FP8 BF8;
    0x73 "v_mfma_f32_16x16x32_fp8_fp8" 16 4 FP8 FP8;
    0x74 "v_mfma_f32_32x32x16_bf8_bf8" 32 2 BF8 BF8;
    0x75 "v_mfma_f32_32x32x16_bf8_fp8" 32 2 BF8 FP8;
    0x76 "v_mfma_f32_32x32x16_fp8_bf8" 32 2 FP8 BF8;
    0x77 "v_mfma_f32_32x32x16_fp8_fp8" 32 2 FP8 FP8;
};
