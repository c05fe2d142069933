//! The VALU engine: operands of all 64 lanes (VGPRs, scalars, constants, DPP and SDWA
//! sources, input modifiers), EXEC masking, and result writes (clamp, omod, 16-bit halves,
//! SDWA destination selects). The opcode tables in `vop.rs` give it one closure per opcode;
//! each runner is generic over the closure, so the lane loop compiles per opcode.

/// DPP and SDWA: the sources and destination they rewrite.
mod ext;
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

/// Where a source's lanes come from (borrowed from the wave for one instruction).
#[derive(Clone, Copy)]
enum From<'w> {
    Uniform(u64),
    /// A VGPR, shifted right (16-bit operands' op_sel high half).
    Row(&'w [u32; LANES], u32),
    /// A 64-bit VGPR pair.
    Pair(&'w [u32; LANES], &'w [u32; LANES]),
    /// Lanes rewritten by DPP or SDWA.
    Lanes(&'w [u64; LANES]),
}

/// One source operand prepared for all lanes.
#[derive(Clone, Copy)]
struct Src<'w> {
    from: From<'w>,
    abs: bool,
    neg: bool,
}

impl Src<'_> {
    #[inline(always)]
    fn raw(&self, lane: usize) -> u64 {
        match self.from {
            From::Uniform(v) => v,
            From::Row(r, shift) => (r[lane] >> shift) as u64,
            From::Pair(lo, hi) => lo[lane] as u64 | (hi[lane] as u64) << 32,
            From::Lanes(v) => v[lane],
        }
    }
}

/// The sources of one instruction, and the lanes it writes: EXEC, narrowed by DPP's row
/// and bank masks and invalid source lanes.
pub struct Ops<'w> {
    src: [Src<'w>; 3],
    pub active: u64,
}

impl Ops<'_> {
    /// Source `n` without modifiers (for DPP and SDWA to rewrite).
    pub(super) fn raw(&self, n: usize, l: usize) -> u64 {
        self.src[n].raw(l)
    }
}

/// Source kinds of an instruction (`None`: unused).
pub type Kinds = [Option<Kind>; 3];

/// Lane buffers DPP and SDWA rewrite sources 0 and 1 into.
pub type ExtLanes = [[u64; LANES]; 2];

/// Calls `f` with the sources of `i` prepared; DPP and SDWA rewrite them first.
#[inline(always)]
pub fn with_ops<R>(
    w: &Wave,
    i: &Instr,
    kinds: Kinds,
    f: impl FnOnce(&Ops<'_>) -> R,
) -> Result<R, Abort> {
    let plain = plain_ops(w, i, kinds)?;
    if let Ext::None = i.ext {
        return Ok(f(&plain));
    }
    let mut buf: ExtLanes = [[0; LANES]; 2];
    let active = ext::rewrite(w, i, kinds, &plain, &mut buf)?;
    let mut ops = Ops {
        src: plain.src,
        active,
    };
    for (n, lanes) in buf.iter().enumerate() {
        if kinds[n].is_some() {
            ops.src[n].from = From::Lanes(lanes);
        }
    }
    Ok(f(&ops))
}

#[inline(always)]
fn plain_ops<'w>(w: &'w Wave, i: &Instr, kinds: Kinds) -> Result<Ops<'w>, Abort> {
    let none = Src {
        from: From::Uniform(0),
        abs: false,
        neg: false,
    };
    let mut ops = Ops {
        src: [none; 3],
        active: w.exec(),
    };
    for (n, kind) in kinds.iter().enumerate() {
        if let Some(kind) = *kind {
            ops.src[n] = source(w, i, n, kind)?;
        }
    }
    Ok(ops)
}

#[inline(always)]
fn source<'w>(w: &'w Wave, i: &Instr, n: usize, kind: Kind) -> Result<Src<'w>, Abort> {
    let code = i.src[n];
    let hi = (i.op_sel >> n) & 1 != 0 && matches!(kind, Kind::B16 | Kind::F16);
    let shift = if hi { 16 } else { 0 };
    let from = match vgpr(code) {
        Some(r) if kind.wide() => From::Pair(w.v(r), w.v(r + 1)),
        Some(r) => From::Row(w.v(r), shift),
        None => From::Uniform(scalar(w, i, code, kind)? >> shift),
    };
    Ok(Src {
        from,
        abs: (i.abs >> n) & 1 != 0,
        neg: (i.neg >> n) & 1 != 0,
    })
}

pub use crate::regfile::lanes;

/// Writes `out` (lane values of kind `D`) to the VGPR destination of `i` for `active` lanes.
pub fn write<D: Val>(
    w: &mut Wave,
    i: &Instr,
    active: u64,
    out: &[u64; LANES],
) -> Result<(), Abort> {
    let r = i.dst as usize;
    if let Ext::Sdwa(s) = i.ext {
        return ext::sdwa_write(w, r, active, out, &s);
    }
    match D::KIND {
        Kind::B64 | Kind::F64 => {
            blend(w.v_mut(r), active, |l, _| out[l] as u32);
            blend(w.v_mut(r + 1), active, |l, _| (out[l] >> 32) as u32);
        }
        Kind::B16 | Kind::F16 if i.op_sel & 8 != 0 => {
            blend(w.v_mut(r), active, |l, old| {
                (old & 0xffff) | (out[l] as u32) << 16
            });
        }
        _ => blend(w.v_mut(r), active, |l, _| out[l] as u32),
    }
    Ok(())
}

/// Sets `row[l]` to `f(l, row[l])` for the lanes of `active`: a select over every lane,
/// without a branch per lane, so that the loop vectorises.
#[inline(always)]
fn blend(row: &mut [u32; LANES], active: u64, f: impl Fn(usize, u32) -> u32) {
    if active == u64::MAX {
        for (l, d) in row.iter_mut().enumerate() {
            *d = f(l, *d);
        }
        return;
    }
    for (l, d) in row.iter_mut().enumerate() {
        let keep = ((active >> l) & 1).wrapping_sub(1) as u32;
        *d = (f(l, *d) & !keep) | (*d & keep);
    }
}

/// Checks a destination VGPR tuple stays within v0..v255.
pub fn check_dst(i: &Instr, regs: usize, name: &'static str) -> Result<(), Abort> {
    if i.dst as usize + regs > 256 {
        return Err(bad(name, "destination VGPR tuple runs past v255"));
    }
    Ok(())
}

/// All 64 lanes of source `n` as `T`, modifiers applied: one match per instruction, then
/// loops the compiler can vectorise.
#[inline(always)]
fn gather<T: Val>(ops: &Ops<'_>, n: usize) -> [T; LANES] {
    let s = &ops.src[n];
    let mut v = [T::from_bits(0); LANES];
    match s.from {
        From::Uniform(x) => v = [T::from_bits(x); LANES],
        From::Row(r, shift) => v
            .iter_mut()
            .zip(r)
            .for_each(|(d, x)| *d = T::from_bits((x >> shift) as u64)),
        From::Pair(lo, hi) => {
            for l in 0..LANES {
                v[l] = T::from_bits(lo[l] as u64 | (hi[l] as u64) << 32);
            }
        }
        From::Lanes(x) => v.iter_mut().zip(x).for_each(|(d, x)| *d = T::from_bits(*x)),
    }
    if s.abs {
        v.iter_mut().for_each(|x| *x = x.abs());
    }
    if s.neg {
        v.iter_mut().for_each(|x| *x = x.neg());
    }
    v
}

/// Runs `f`, a lane loop, compiled for AVX2 and FMA when the CPU has them: the loops
/// vectorise, and `mul_add` becomes the FMA instruction instead of a call per lane. Both are
/// IEEE operations with the same results in either form (fused multiply-add rounds once,
/// denormals are kept: nothing here sets MXCSR's flush or denormals-are-zero bits).
#[inline(always)]
pub(super) fn fast<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above), all `avx2_fma` requires.
        return unsafe { avx2_fma(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: not yet detected, 1: absent, 2: present.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        0 => {
            let has = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma");
            HAS.store(1 + has as u8, Ordering::Relaxed);
            has
        }
        v => v == 2,
    }
}

/// `f` inlined into code compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn avx2_fma<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// Computes `f` for every lane (inactive ones too: lane functions are pure) and writes the
/// active lanes' results with clamp/omod applied.
#[inline(always)]
fn run_all<D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    kinds: Kinds,
    f: impl Fn(&Ops<'_>, &mut [u64; LANES]),
) -> Step {
    let mut out = [0u64; LANES];
    let active = with_ops(cx.w, i, kinds, |ops| {
        fast(
            #[inline(always)]
            || f(ops, &mut out),
        );
        ops.active
    })?;
    check_dst(i, if D::KIND.wide() { 2 } else { 1 }, "VALU")?;
    fast(
        #[inline(always)]
        || {
            if i.clamp || i.omod != 0 {
                for v in out.iter_mut() {
                    *v = D::from_bits(*v).out_mod(i.clamp, i.omod).to_bits();
                }
            }
            write::<D>(cx.w, i, active, &out)
        },
    )?;
    Ok(Flow::Next)
}

/// Three sources (of kinds `kinds`; unused ones read zero) and the lane number, for every
/// lane: the form of [`run_all`] for lane functions that need the lane or a lane mask.
#[inline(always)]
fn lanes3<A: Val, B: Val, C: Val, D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    kinds: Kinds,
    f: impl Fn(A, B, C, usize) -> D,
) -> Step {
    run_all::<D>(
        cx,
        i,
        kinds,
        #[inline(always)]
        |ops, out| {
            let (a, b, c) = (
                gather::<A>(ops, 0),
                gather::<B>(ops, 1),
                gather::<C>(ops, 2),
            );
            for l in 0..LANES {
                out[l] = f(a[l], b[l], c[l], l).to_bits();
            }
        },
    )
}

pub fn v1<A: Val, D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(A) -> D) -> Step {
    run_all::<D>(
        cx,
        i,
        [Some(A::KIND), None, None],
        #[inline(always)]
        |ops, out| {
            let a = gather::<A>(ops, 0);
            for l in 0..LANES {
                out[l] = f(a[l]).to_bits();
            }
        },
    )
}

pub fn v2<A: Val, B: Val, D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(A, B) -> D) -> Step {
    run_all::<D>(
        cx,
        i,
        [Some(A::KIND), Some(B::KIND), None],
        #[inline(always)]
        |ops, out| {
            let (a, b) = (gather::<A>(ops, 0), gather::<B>(ops, 1));
            for l in 0..LANES {
                out[l] = f(a[l], b[l]).to_bits();
            }
        },
    )
}

pub fn v3<A: Val, B: Val, C: Val, D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    f: impl Fn(A, B, C) -> D,
) -> Step {
    run_all::<D>(
        cx,
        i,
        [Some(A::KIND), Some(B::KIND), Some(C::KIND)],
        #[inline(always)]
        |ops, out| {
            let (a, b, c) = (
                gather::<A>(ops, 0),
                gather::<B>(ops, 1),
                gather::<C>(ops, 2),
            );
            for l in 0..LANES {
                out[l] = f(a[l], b[l], c[l]).to_bits();
            }
        },
    )
}

/// Two sources and the lane number (v_mbcnt).
pub fn v2_lane<D: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(u32, u32, usize) -> D) -> Step {
    let kinds = [Some(Kind::B32), Some(Kind::B32), None];
    lanes3(cx, i, kinds, |a, b, _: u32, l| f(a, b, l))
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

/// The destination of a compare mask: VCC, VOP3's vdst field, or SDWA's sdst.
fn compare_dst(i: &Instr) -> u16 {
    if i.enc == crate::decode::Encoding::Vop3 {
        i.dst
    } else {
        i.sdst
    }
}

/// A per-lane predicate of two sources into a lane mask (inactive lanes 0).
fn compare_mask<A: Val, B: Val>(
    w: &Wave,
    i: &Instr,
    kinds: Kinds,
    f: impl Fn(A, B) -> bool,
) -> Result<u64, Abort> {
    with_ops(w, i, kinds, |ops| {
        fast(
            #[inline(always)]
            || {
                let (a, b) = (gather::<A>(ops, 0), gather::<B>(ops, 1));
                let all = (0..LANES).fold(0u64, |m, l| m | (f(a[l], b[l]) as u64) << l);
                all & ops.active
            },
        )
    })
}

fn write_compare(cx: &mut Cx<'_>, i: &Instr, x: bool, m: u64) -> Step {
    set_mask(cx.w, compare_dst(i), m)?;
    if x {
        cx.w.set_exec(m);
    }
    Ok(Flow::Next)
}

/// VOPC: compares per lane into a mask written to VCC or the VOP3 sdst; the cmpx forms
/// write EXEC as well.
pub fn cmp<A: Val>(cx: &mut Cx<'_>, i: &Instr, x: bool, f: impl Fn(A, A) -> bool) -> Step {
    let kinds = [Some(A::KIND), Some(A::KIND), None];
    let m = compare_mask(cx.w, i, kinds, |a: A, b: A| f(a, b))?;
    write_compare(cx, i, x, m)
}

/// v_cmp_class: the second source is a mask of `class_bit` classes.
pub fn cmp_class<A: Val>(cx: &mut Cx<'_>, i: &Instr, x: bool, class: impl Fn(A) -> u32) -> Step {
    let kinds = [Some(A::KIND), Some(Kind::B32), None];
    let m = compare_mask(cx.w, i, kinds, |a: A, b: u32| (b >> class(a)) & 1 != 0)?;
    write_compare(cx, i, x, m)
}

/// Per-lane results with a carry-out mask (inactive lanes 0), of every lane.
fn with_carry<A: Val, C: Val, D: Val>(
    w: &Wave,
    i: &Instr,
    kinds: Kinds,
    f: impl Fn(A, A, C, usize) -> (D, bool),
) -> Result<(u64, [u64; LANES], u64), Abort> {
    let mut out = [0u64; LANES];
    let (active, cout) = with_ops(w, i, kinds, |ops| {
        fast(
            #[inline(always)]
            || {
                let (a, b, c) = (
                    gather::<A>(ops, 0),
                    gather::<A>(ops, 1),
                    gather::<C>(ops, 2),
                );
                let mut cout = 0u64;
                for l in 0..LANES {
                    let (d, carry) = f(a[l], b[l], c[l], l);
                    out[l] = d.to_bits();
                    cout |= (carry as u64) << l;
                }
                (ops.active, cout & ops.active)
            },
        )
    })?;
    Ok((active, out, cout))
}

fn write_with_carry<D: Val>(cx: &mut Cx<'_>, i: &Instr, r: (u64, [u64; LANES], u64)) -> Step {
    let (active, out, cout) = r;
    check_dst(i, if D::KIND.wide() { 2 } else { 1 }, "carry op")?;
    write::<D>(cx.w, i, active, &out)?;
    set_mask(cx.w, i.sdst, cout)?;
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
    let cin = if carry_in {
        mask_operand(cx.w, i, i.src[2])?
    } else {
        0
    };
    let kinds = [Some(Kind::B32), Some(Kind::B32), None];
    let r = with_carry(cx.w, i, kinds, |a, b, _: u32, l| {
        f(a, b, (cin >> l) & 1 != 0)
    })?;
    write_with_carry::<u32>(cx, i, r)
}

/// v_cndmask_b32: src2 (VCC in VOP2) selects src1 where set, src0 elsewhere.
pub fn cndmask(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let sel = mask_operand(cx.w, i, i.src[2])?;
    let kinds = [Some(Kind::F32), Some(Kind::F32), None];
    lanes3(
        cx,
        i,
        kinds,
        |a: f32, b: f32, _: u32, l| {
            if (sel >> l) & 1 != 0 {
                b
            } else {
                a
            }
        },
    )
}

/// VOP3b with a carry-out (v_mad_u64_u32, v_mad_i64_i32, div_scale).
pub fn wide_carry<A: Val, C: Val, D: Val>(
    cx: &mut Cx<'_>,
    i: &Instr,
    f: impl Fn(A, A, C) -> (D, bool),
) -> Step {
    let kinds = [Some(A::KIND), Some(A::KIND), Some(C::KIND)];
    let r = with_carry(cx.w, i, kinds, |a, b, c, _| f(a, b, c))?;
    write_with_carry::<D>(cx, i, r)
}

/// v_div_fmas: fma, then scaled where VCC is set (the function decides by how much).
pub fn div_fmas<T: Val>(cx: &mut Cx<'_>, i: &Instr, f: impl Fn(T, T, T, bool) -> T) -> Step {
    let vcc = cx.w.vcc();
    let kinds = [Some(T::KIND), Some(T::KIND), Some(T::KIND)];
    lanes3(cx, i, kinds, |a, b, c, l| f(a, b, c, (vcc >> l) & 1 != 0))
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

pub fn row_or_uniform(w: &Wave, i: &Instr, code: u16, kind: Kind) -> Result<[u32; LANES], Abort> {
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
