//! The VALU engine: operands of all 64 lanes (VGPRs, scalars, constants, DPP and SDWA
//! sources, input modifiers), EXEC masking, and result writes (clamp, omod, 16-bit halves,
//! SDWA destination selects). The opcode tables in `vop.rs` give it one closure per opcode;
//! each runner is generic over the closure, so the lane loop compiles per opcode.

use super::operand::{scalar, vgpr, Kind};
use super::{bad, Abort, Cx, Flow, Step};
use crate::decode::{Ext, Instr, VGPR0};
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::state::{Wave, LANES};

/// A lane value type of the VALU.
pub trait Val: Copy {
    const KIND: Kind;
    fn from_bits(b: u64) -> Self;
    fn to_bits(self) -> u64;
    /// |x| for floats (bit clear); integers ignore the modifier.
    fn abs(self) -> Self {
        self
    }
    fn neg(self) -> Self {
        self
    }
    /// Clamp to [0, 1] and output modifier for floats.
    fn out_mod(self, _clamp: bool, _omod: u8) -> Self {
        self
    }
}

macro_rules! int_val {
    ($t:ty, $k:expr) => {
        impl Val for $t {
            const KIND: Kind = $k;
            fn from_bits(b: u64) -> Self {
                b as $t
            }
            fn to_bits(self) -> u64 {
                self as u64 & mask($k)
            }
        }
    };
}

const fn mask(k: Kind) -> u64 {
    match k {
        Kind::B16 | Kind::F16 => 0xffff,
        Kind::B32 | Kind::F32 => 0xffff_ffff,
        _ => u64::MAX,
    }
}

int_val!(u32, Kind::B32);
int_val!(i32, Kind::B32);
int_val!(u64, Kind::B64);
int_val!(i64, Kind::B64);
int_val!(u16, Kind::B16);
int_val!(i16, Kind::B16);

fn omod_factor(omod: u8) -> f64 {
    match omod {
        1 => 2.0,
        2 => 4.0,
        3 => 0.5,
        _ => 1.0,
    }
}

impl Val for f32 {
    const KIND: Kind = Kind::F32;
    fn from_bits(b: u64) -> Self {
        f32::from_bits(b as u32)
    }
    fn to_bits(self) -> u64 {
        f32::to_bits(self) as u64
    }
    fn abs(self) -> Self {
        f32::abs(self)
    }
    fn neg(self) -> Self {
        -self
    }
    fn out_mod(self, clamp: bool, omod: u8) -> Self {
        let x = if omod != 0 {
            self * omod_factor(omod) as f32
        } else {
            self
        };
        if clamp {
            clamp01(x as f64) as f32
        } else {
            x
        }
    }
}

impl Val for f64 {
    const KIND: Kind = Kind::F64;
    fn from_bits(b: u64) -> Self {
        f64::from_bits(b)
    }
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
    fn abs(self) -> Self {
        f64::abs(self)
    }
    fn neg(self) -> Self {
        -self
    }
    fn out_mod(self, clamp: bool, omod: u8) -> Self {
        let x = self * omod_factor(omod);
        if clamp {
            clamp01(x)
        } else {
            x
        }
    }
}

/// Clamp to [0, 1]; NaN becomes 0 as the hardware's clamp does.
fn clamp01(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// An IEEE half as its bits; arithmetic converts to f32 (exact) and rounds back once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct F16(pub u16);

impl F16 {
    pub fn f(self) -> f32 {
        f16_to_f32(self.0)
    }
    pub fn of(x: f32) -> F16 {
        F16(f32_to_f16(x))
    }
}

impl Val for F16 {
    const KIND: Kind = Kind::F16;
    fn from_bits(b: u64) -> Self {
        F16(b as u16)
    }
    fn to_bits(self) -> u64 {
        self.0 as u64
    }
    fn abs(self) -> Self {
        F16(self.0 & 0x7fff)
    }
    fn neg(self) -> Self {
        F16(self.0 ^ 0x8000)
    }
    fn out_mod(self, clamp: bool, omod: u8) -> Self {
        if clamp || omod != 0 {
            F16::of(self.f().out_mod(clamp, omod))
        } else {
            self
        }
    }
}

/// Where a source's lanes come from.
#[derive(Clone, Copy)]
enum From {
    Uniform(u64),
    Row(usize),
    Lanes,
}

/// One source operand prepared for all lanes.
struct Src {
    from: From,
    /// 16-bit operands: read the high half (VOP3 op_sel).
    shift: u32,
    abs: bool,
    neg: bool,
    /// DPP- or SDWA-transformed lanes (used when `from` is `Lanes`).
    lanes: [u64; LANES],
}

impl Src {
    #[inline(always)]
    fn get<T: Val>(&self, w: &Wave, lane: usize) -> T {
        let raw = match self.from {
            From::Uniform(v) => v,
            From::Row(r) if T::KIND.wide() => w.v(r)[lane] as u64 | (w.v(r + 1)[lane] as u64) << 32,
            From::Row(r) => (w.v(r)[lane] >> self.shift) as u64,
            From::Lanes => self.lanes[lane],
        };
        let mut x = T::from_bits(raw);
        if self.abs {
            x = x.abs();
        }
        if self.neg {
            x = x.neg();
        }
        x
    }
}

/// Per-instruction operand preparation.
pub struct Ops {
    src: [Src; 3],
    /// Lanes the instruction writes: EXEC, narrowed by DPP's row/bank masks and invalid
    /// source lanes.
    pub active: u64,
}

impl Ops {
    #[inline(always)]
    pub fn a<T: Val>(&self, w: &Wave, l: usize) -> T {
        self.src[0].get(w, l)
    }
    #[inline(always)]
    pub fn b<T: Val>(&self, w: &Wave, l: usize) -> T {
        self.src[1].get(w, l)
    }
    #[inline(always)]
    pub fn c<T: Val>(&self, w: &Wave, l: usize) -> T {
        self.src[2].get(w, l)
    }
}

/// Prepares the sources `kinds` describes (`None`: unused) of `i`.
pub fn prepare(w: &Wave, i: &Instr, kinds: [Option<Kind>; 3]) -> Result<Ops, Abort> {
    let mut ops = Ops {
        src: std::array::from_fn(|_| Src {
            from: From::Uniform(0),
            shift: 0,
            abs: false,
            neg: false,
            lanes: [0; LANES],
        }),
        active: w.exec(),
    };
    for (n, kind) in kinds.iter().enumerate() {
        if let Some(kind) = *kind {
            ops.src[n] = source(w, i, n, kind)?;
        }
    }
    match i.ext {
        Ext::None => {}
        Ext::Dpp(d) => super::vop_ext::dpp(w, &mut ops, &d, kinds[0])?,
        Ext::Sdwa(s) => super::vop_ext::sdwa_sources(w, &s, &mut ops, kinds)?,
    }
    Ok(ops)
}

fn source(w: &Wave, i: &Instr, n: usize, kind: Kind) -> Result<Src, Abort> {
    let code = i.src[n];
    let hi = (i.op_sel >> n) & 1 != 0 && matches!(kind, Kind::B16 | Kind::F16);
    let shift = if hi { 16 } else { 0 };
    let from = match vgpr(code) {
        Some(r) => From::Row(r),
        None => From::Uniform(scalar(w, i, code, kind)? >> shift),
    };
    Ok(Src {
        from,
        shift,
        abs: (i.abs >> n) & 1 != 0,
        neg: (i.neg >> n) & 1 != 0,
        lanes: [0; LANES],
    })
}

impl Ops {
    /// Turns source `n` into explicit lanes (DPP/SDWA), returning them for rewriting.
    pub(super) fn materialise(&mut self, w: &Wave, n: usize, wide: bool) -> &mut [u64; LANES] {
        let s = &mut self.src[n];
        for l in 0..LANES {
            s.lanes[l] = match s.from {
                From::Uniform(v) => v,
                From::Row(r) if wide => w.v(r)[l] as u64 | (w.v(r + 1)[l] as u64) << 32,
                From::Row(r) => (w.v(r)[l] >> s.shift) as u64,
                From::Lanes => s.lanes[l],
            };
        }
        s.from = From::Lanes;
        s.shift = 0;
        &mut s.lanes
    }
}

/// Iterates the set bits of a lane mask.
#[inline(always)]
pub fn lanes(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let l = m.trailing_zeros() as usize;
            m &= m - 1;
            l
        })
    })
}

/// Writes `out` (lane values of kind `D`) to the VGPR destination of `i` for `active` lanes.
pub fn write<D: Val>(
    w: &mut Wave,
    i: &Instr,
    active: u64,
    out: &[u64; LANES],
) -> Result<(), Abort> {
    let r = i.dst as usize;
    if let Ext::Sdwa(s) = i.ext {
        return super::vop_ext::sdwa_write(w, r, active, out, &s);
    }
    match D::KIND {
        Kind::B64 | Kind::F64 => {
            for l in lanes(active) {
                w.v_mut(r)[l] = out[l] as u32;
            }
            for l in lanes(active) {
                w.v_mut(r + 1)[l] = (out[l] >> 32) as u32;
            }
        }
        Kind::B16 | Kind::F16 if i.op_sel & 8 != 0 => {
            let row = w.v_mut(r);
            for l in lanes(active) {
                row[l] = (row[l] & 0xffff) | (out[l] as u32) << 16;
            }
        }
        _ => {
            let row = w.v_mut(r);
            for l in lanes(active) {
                row[l] = out[l] as u32;
            }
        }
    }
    Ok(())
}

/// Checks a destination VGPR tuple stays within v0..v255.
pub fn check_dst(i: &Instr, regs: usize, name: &'static str) -> Result<(), Abort> {
    if i.dst as usize + regs > 256 {
        return Err(bad(name, "destination VGPR tuple runs past v255"));
    }
    Ok(())
}

fn finish<D: Val>(cx: &mut Cx<'_>, i: &Instr, ops: &Ops, out: &[u64; LANES]) -> Step {
    check_dst(i, if D::KIND.wide() { 2 } else { 1 }, "VALU")?;
    write::<D>(cx.w, i, ops.active, out)?;
    Ok(Flow::Next)
}

/// Runs `f` per active lane and writes its result with clamp/omod applied.
#[inline(always)]
fn run_lanes<D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    ops: Ops,
    f: impl Fn(&Ops, &Wave, usize) -> D,
) -> Step {
    let mut out = [0u64; LANES];
    let (clamp, omod) = (i.clamp, i.omod);
    for l in lanes(ops.active) {
        out[l] = f(&ops, cx.w, l).out_mod(clamp, omod).to_bits();
    }
    finish::<D>(cx, i, &ops, &out)
}

pub fn v1<A: Val, D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(A) -> D) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), None, None])?;
    run_lanes(cx, i, ops, |o, w, l| f(o.a(w, l)))
}

pub fn v2<A: Val, B: Val, D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(A, B) -> D) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), Some(B::KIND), None])?;
    run_lanes(cx, i, ops, |o, w, l| f(o.a(w, l), o.b(w, l)))
}

pub fn v3<A: Val, B: Val, C: Val, D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    f: impl Fn(A, B, C) -> D,
) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), Some(B::KIND), Some(C::KIND)])?;
    run_lanes(cx, i, ops, |o, w, l| f(o.a(w, l), o.b(w, l), o.c(w, l)))
}

/// Two sources and the lane number (v_mbcnt).
pub fn v2_lane<D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, u32, usize) -> D) -> Step {
    let ops = prepare(cx.w, i, [Some(Kind::B32), Some(Kind::B32), None])?;
    run_lanes(cx, i, ops, |o, w, l| f(o.a(w, l), o.b(w, l), l))
}

/// The VOP2 MAC forms: the destination is the third source.
pub fn mac<A: Val, D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(A, A, A) -> D) -> Step {
    let j = Instr {
        src: [i.src[0], i.src[1], VGPR0 + i.dst],
        ..*i
    };
    v3(cx, &j, f)
}

/// A lane mask of scalar operand `code` (VCC or an SGPR pair).
fn mask_operand(w: &Wave, i: &Instr, code: u16) -> Result<u64, Abort> {
    scalar(w, i, code, Kind::B64)
}

/// Writes a lane mask to a scalar destination (VCC, an SGPR pair, EXEC).
fn set_mask(w: &mut Wave, code: u16, v: u64) -> Result<(), Abort> {
    super::operand::set_s64(w, code, v)
}

/// VOPC: compares per lane into a mask (inactive lanes 0) written to VCC or the VOP3
/// sdst; the cmpx forms write EXEC as well.
pub fn cmp<A: Val>(cx: &mut Cx<'_>, i: &Instr, x: bool, f: impl Fn(A, A) -> bool) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), Some(A::KIND), None])?;
    let mut m = 0u64;
    for l in lanes(ops.active) {
        m |= (f(ops.a(cx.w, l), ops.b(cx.w, l)) as u64) << l;
    }
    let sdst = if i.enc == crate::decode::Encoding::Vop3 {
        i.dst
    } else {
        i.sdst
    };
    set_mask(cx.w, sdst, m)?;
    if x {
        cx.w.set_exec(m);
    }
    Ok(Flow::Next)
}

/// v_cmp_class: the second source is a mask of `class_bit` classes.
pub fn cmp_class<A: Val>(cx: &mut Cx<'_>, i: &Instr, x: bool, class: impl Fn(A) -> u32) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), Some(Kind::B32), None])?;
    let mut m = 0u64;
    for l in lanes(ops.active) {
        let bits: u32 = ops.b(cx.w, l);
        m |= (((bits >> class(ops.a(cx.w, l))) & 1) as u64) << l;
    }
    let sdst = if i.enc == crate::decode::Encoding::Vop3 {
        i.dst
    } else {
        i.sdst
    };
    set_mask(cx.w, sdst, m)?;
    if x {
        cx.w.set_exec(m);
    }
    Ok(Flow::Next)
}

/// Carry arithmetic: `f(a, b, carry_in) -> (d, carry_out)`; carry-in from src2 (VCC in the
/// VOP2 form) when `carry_in`, carry-out to VCC or VOP3b's sdst.
pub fn carry(
    cx: &mut Cx<'_>,
    i: &Instr,
    carry_in: bool,
    f: impl Fn(u32, u32, bool) -> (u32, bool),
) -> Step {
    let ops = prepare(cx.w, i, [Some(Kind::B32), Some(Kind::B32), None])?;
    let cin = if carry_in {
        mask_operand(cx.w, i, i.src[2])?
    } else {
        0
    };
    let mut out = [0u64; LANES];
    let mut cout = 0u64;
    for l in lanes(ops.active) {
        let (d, c) = f(ops.a(cx.w, l), ops.b(cx.w, l), (cin >> l) & 1 != 0);
        out[l] = d as u64;
        cout |= (c as u64) << l;
    }
    check_dst(i, 1, "carry op")?;
    write::<u32>(cx.w, i, ops.active, &out)?;
    set_mask(cx.w, i.sdst, cout)?;
    Ok(Flow::Next)
}

/// v_cndmask_b32: src2 (VCC in VOP2) selects src1 where set, src0 elsewhere.
pub fn cndmask(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let ops = prepare(cx.w, i, [Some(Kind::F32), Some(Kind::F32), None])?;
    let sel = mask_operand(cx.w, i, i.src[2])?;
    run_lanes(cx, i, ops, |o, w, l| -> f32 {
        if (sel >> l) & 1 != 0 {
            o.b(w, l)
        } else {
            o.a(w, l)
        }
    })
}

/// VOP3b with a 64-bit result and a carry-out (v_mad_u64_u32, v_mad_i64_i32, div_scale).
pub fn wide_carry<A: Val, C: Val, D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    f: impl Fn(A, A, C) -> (D, bool),
) -> Step {
    let ops = prepare(cx.w, i, [Some(A::KIND), Some(A::KIND), Some(C::KIND)])?;
    let mut out = [0u64; LANES];
    let mut cout = 0u64;
    for l in lanes(ops.active) {
        let (d, c) = f(ops.a(cx.w, l), ops.b(cx.w, l), ops.c(cx.w, l));
        out[l] = d.to_bits();
        cout |= (c as u64) << l;
    }
    check_dst(i, if D::KIND.wide() { 2 } else { 1 }, "VOP3b")?;
    write::<D>(cx.w, i, ops.active, &out)?;
    set_mask(cx.w, i.sdst, cout)?;
    Ok(Flow::Next)
}

/// v_div_fmas: fma, then scaled by 2^64 (2^128 for f64) where VCC is set, the direction
/// given by the exponent of the third source.
pub fn div_fmas<T: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(T, T, T, bool) -> T) -> Step {
    let ops = prepare(cx.w, i, [Some(T::KIND), Some(T::KIND), Some(T::KIND)])?;
    let vcc = cx.w.vcc();
    run_lanes(cx, i, ops, |o, w, l| {
        f(o.a(w, l), o.b(w, l), o.c(w, l), (vcc >> l) & 1 != 0)
    })
}

/// v_readlane_b32 / v_readfirstlane_b32: one lane of a VGPR into an SGPR.
pub fn readlane(cx: &mut Cx<'_>, i: &Instr, first: bool) -> Step {
    let lane = if first {
        let e = cx.w.exec();
        if e == 0 {
            0
        } else {
            e.trailing_zeros() as usize
        }
    } else {
        (super::operand::s32(cx.w, i, i.src[1])? & 63) as usize
    };
    let v = match vgpr(i.src[0]) {
        Some(r) => cx.w.v(r)[lane],
        None => scalar(cx.w, i, i.src[0], Kind::B32)? as u32,
    };
    super::operand::set_s32(cx.w, i.dst, v)?;
    Ok(Flow::Next)
}

/// v_writelane_b32: an SGPR or constant into one lane of a VGPR, whatever EXEC says.
pub fn writelane(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let v = scalar(cx.w, i, i.src[0], Kind::B32)? as u32;
    let lane = (super::operand::s32(cx.w, i, i.src[1])? & 63) as usize;
    check_dst(i, 1, "v_writelane_b32")?;
    cx.w.v_mut(i.dst as usize)[lane] = v;
    Ok(Flow::Next)
}

/// Packed math (VOP3P): each half picks its source halves by op_sel (low result) and
/// op_sel_hi (high result), negated by neg / neg_hi.
pub fn packed16(
    cx: &mut Cx<'_>,
    i: &Instr,
    n: usize,
    f: impl Fn(u16, u16, u16) -> u16,
    float: bool,
) -> Step {
    let mut src = [[0u32; LANES]; 3];
    for (k, s) in src.iter_mut().enumerate().take(n) {
        *s = row_or_uniform(cx.w, i, i.src[k], Kind::B32)?;
    }
    let mut out = [0u64; LANES];
    let half = |k: usize, l: usize, hi_res: bool| -> u16 {
        let sel = if hi_res { i.op_sel_hi } else { i.op_sel };
        let v = if (sel >> k) & 1 != 0 {
            src[k][l] >> 16
        } else {
            src[k][l]
        } as u16;
        let negm = if hi_res { i.neg_hi } else { i.neg };
        if float && (negm >> k) & 1 != 0 {
            v ^ 0x8000
        } else {
            v
        }
    };
    for l in lanes(cx.w.exec()) {
        let lo = f(half(0, l, false), half(1, l, false), half(2, l, false));
        let hi = f(half(0, l, true), half(1, l, true), half(2, l, true));
        let (lo, hi) = if float && i.clamp {
            (clamp16(lo), clamp16(hi))
        } else {
            (lo, hi)
        };
        out[l] = lo as u64 | (hi as u64) << 16;
    }
    check_dst(i, 1, "VOP3P")?;
    write::<u32>(cx.w, i, cx.w.exec(), &out)?;
    Ok(Flow::Next)
}

fn clamp16(h: u16) -> u16 {
    F16(h).out_mod(true, 0).0
}

/// gfx90a's packed f32 (v_pk_fma/mul/add_f32, v_pk_mov_b32): 64-bit register pairs, each
/// result dword picking a source dword by op_sel / op_sel_hi.
pub fn packed32(
    cx: &mut Cx<'_>,
    i: &Instr,
    n: usize,
    f: impl Fn(u32, u32, u32) -> u32,
    float: bool,
) -> Step {
    let mut src = [[0u64; LANES]; 3];
    for (k, s) in src.iter_mut().enumerate().take(n) {
        *s = wide_row_or_uniform(cx.w, i, i.src[k])?;
    }
    let mut out = [0u64; LANES];
    let part = |k: usize, l: usize, hi_res: bool| -> u32 {
        let sel = if hi_res { i.op_sel_hi } else { i.op_sel };
        let v = if (sel >> k) & 1 != 0 {
            (src[k][l] >> 32) as u32
        } else {
            src[k][l] as u32
        };
        let negm = if hi_res { i.neg_hi } else { i.neg };
        if float && (negm >> k) & 1 != 0 {
            v ^ 0x8000_0000
        } else {
            v
        }
    };
    for l in lanes(cx.w.exec()) {
        let lo = f(part(0, l, false), part(1, l, false), part(2, l, false));
        let hi = f(part(0, l, true), part(1, l, true), part(2, l, true));
        out[l] = lo as u64 | (hi as u64) << 32;
    }
    check_dst(i, 2, "VOP3P")?;
    write::<u64>(cx.w, i, cx.w.exec(), &out)?;
    Ok(Flow::Next)
}

fn row_or_uniform(w: &Wave, i: &Instr, code: u16, kind: Kind) -> Result<[u32; LANES], Abort> {
    Ok(match vgpr(code) {
        Some(r) => *w.v(r),
        None => [scalar(w, i, code, kind)? as u32; LANES],
    })
}

fn wide_row_or_uniform(w: &Wave, i: &Instr, code: u16) -> Result<[u64; LANES], Abort> {
    Ok(match vgpr(code) {
        Some(r) => std::array::from_fn(|l| w.v(r)[l] as u64 | (w.v(r + 1)[l] as u64) << 32),
        None => {
            let lo = scalar(w, i, code, Kind::B32)?;
            let v = if code < 128 {
                scalar(w, i, code, Kind::B64)?
            } else {
                lo | lo << 32
            };
            [v; LANES]
        }
    })
}

/// v_pk_mov_b32: the low result dword is a dword of src0, the high one a dword of src1,
/// each picked by its op_sel bit.
pub fn pk_mov(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let (s0, s1) = (
        wide_row_or_uniform(cx.w, i, i.src[0])?,
        wide_row_or_uniform(cx.w, i, i.src[1])?,
    );
    let mut out = [0u64; LANES];
    for l in lanes(cx.w.exec()) {
        let lo = if i.op_sel & 1 != 0 {
            s0[l] >> 32
        } else {
            s0[l] & 0xffff_ffff
        };
        let hi = if i.op_sel & 2 != 0 {
            s1[l] >> 32
        } else {
            s1[l] & 0xffff_ffff
        };
        out[l] = lo | hi << 32;
    }
    check_dst(i, 2, "v_pk_mov_b32")?;
    write::<u64>(cx.w, i, cx.w.exec(), &out)?;
    Ok(Flow::Next)
}
