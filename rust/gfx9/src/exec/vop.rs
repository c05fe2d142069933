//! VALU opcode tables: VOP1, VOP2, VOPC (also reached through their VOP3 forms), the
//! VOP3-only opcodes and VOP3P.

use super::opdef::{def, def_on, OpDef};
use super::valu::{
    carry, cmp, cmp_class, cndmask, div_fmas, mac, packed16, packed32, readlane, v1, v2, v2_lane,
    v3, wide_carry, writelane, F16,
};
use super::{bad, Cx, Flow, Step};
use crate::decode::{Encoding, Instr, LITERAL, VGPR0};
use crate::fp::{
    class_f16, class_f32, class_f64, f16_to_f32, f32_to_f16, frexp_exp, frexp_mant, ldexp,
    ldexp_f32,
};
use crate::state::Target;

/// Exact f64 view of a float lane value (for compares).
trait Fv: Copy {
    fn fv(self) -> f64;
}
impl Fv for f32 {
    fn fv(self) -> f64 {
        self as f64
    }
}
impl Fv for f64 {
    fn fv(self) -> f64 {
        self
    }
}
impl Fv for F16 {
    fn fv(self) -> f64 {
        self.f() as f64
    }
}

/// Exact i128 view of an integer lane value (for compares).
trait Iv: Copy {
    fn iv(self) -> i128;
}
macro_rules! iv {
    ($($t:ty),*) => { $(impl Iv for $t { fn iv(self) -> i128 { self as i128 } })* };
}
iv!(i16, u16, i32, u32, i64, u64);

fn f16op(f: impl Fn(f32) -> f32) -> impl Fn(F16) -> F16 {
    move |a| F16::of(f(a.f()))
}

/// IEEE minNum with -0 below +0 (a NaN operand yields the other one).
fn fmin<T: PartialOrd + Copy + Neg0>(a: T, b: T) -> T {
    match (a.nan(), b.nan()) {
        (true, _) => b,
        (_, true) => a,
        _ if a < b || (a == b && a.neg0()) => a,
        _ => b,
    }
}

/// IEEE maxNum with +0 above -0.
fn fmax<T: PartialOrd + Copy + Neg0>(a: T, b: T) -> T {
    match (a.nan(), b.nan()) {
        (true, _) => b,
        (_, true) => a,
        _ if a > b || (a == b && b.neg0()) => a,
        _ => b,
    }
}

/// NaN and sign tests for fmin/fmax.
trait Neg0 {
    fn nan(self) -> bool;
    fn neg0(self) -> bool;
}
impl Neg0 for f32 {
    fn nan(self) -> bool {
        self.is_nan()
    }
    fn neg0(self) -> bool {
        self.is_sign_negative()
    }
}
impl Neg0 for f64 {
    fn nan(self) -> bool {
        self.is_nan()
    }
    fn neg0(self) -> bool {
        self.is_sign_negative()
    }
}

/// AMD's legacy multiply: zero times anything (even inf or NaN) is zero.
fn mul_legacy(a: f32, b: f32) -> f32 {
    if a == 0.0 || b == 0.0 {
        0.0
    } else {
        a * b
    }
}

fn fract32(x: f32) -> f32 {
    if x.is_infinite() {
        return f32::NAN;
    }
    (x - x.floor()).min(f32::from_bits(0x3f7f_ffff))
}

fn fract64(x: f64) -> f64 {
    if x.is_infinite() {
        return f64::NAN;
    }
    (x - x.floor()).min(f64::from_bits(0x3fef_ffff_ffff_ffff))
}

/// v_ffbh_u32 / v_ffbl_b32: -1 when no bit is set.
fn ffbh(v: u32) -> u32 {
    if v == 0 {
        u32::MAX
    } else {
        v.leading_zeros()
    }
}
fn ffbl(v: u32) -> u32 {
    if v == 0 {
        u32::MAX
    } else {
        v.trailing_zeros()
    }
}
fn ffbh_i32(v: u32) -> u32 {
    let x = if (v as i32) < 0 { !v } else { v };
    ffbh(x)
}

fn bfe(v: u32, off: u32, width: u32, signed: bool) -> u32 {
    let (off, width) = (off & 31, width & 31);
    if width == 0 {
        return 0;
    }
    let x = (v >> off) & ((1u32 << width) - 1);
    if signed && (x >> (width - 1)) & 1 == 1 {
        x | !((1u32 << width) - 1)
    } else {
        x
    }
}

fn med3<T: PartialOrd + Copy>(a: T, b: T, c: T, min: fn(T, T) -> T, max: fn(T, T) -> T) -> T {
    max(min(a, b), min(max(a, b), c))
}

fn perm_byte(s0: u32, s1: u32, sel: u32) -> u32 {
    let both = (s0 as u64) << 32 | s1 as u64;
    match sel {
        0..=7 => ((both >> (8 * sel)) & 0xff) as u32,
        8..=11 => {
            let byte = 2 * (sel - 8) + 1;
            if (both >> (8 * byte + 7)) & 1 != 0 {
                0xff
            } else {
                0
            }
        }
        12 => 0,
        _ => 0xff,
    }
}

fn perm(s0: u32, s1: u32, s2: u32) -> u32 {
    (0..4).fold(0, |d, k| {
        d | perm_byte(s0, s1, (s2 >> (8 * k)) & 0xff) << (8 * k)
    })
}

fn exponent32(x: f32) -> i32 {
    ((x.to_bits() >> 23) & 0xff) as i32
}

/// v_div_scale_f32 (the ISA's pseudocode): pre-scales numerator or denominator so that the
/// reciprocal and quotient stay normal; VCC tells v_div_fmas to undo it.
fn div_scale_f32(s0: f32, den: f32, num: f32) -> (f32, bool) {
    let denorm = |x: f32| x != 0.0 && x.is_subnormal();
    if num == 0.0 || den == 0.0 {
        return (f32::NAN, false);
    }
    let (en, ed) = (exponent32(num), exponent32(den));
    if en - ed >= 96 {
        return (if s0 == den { ldexp_f32(s0, 64) } else { s0 }, true);
    }
    if denorm(den) {
        return (ldexp_f32(s0, 64), false);
    }
    let (r, q) = (1.0 / den, num / den);
    if denorm(r) && !denorm(q) {
        return (if s0 == den { ldexp_f32(s0, 64) } else { s0 }, true);
    }
    if denorm(r) {
        return (ldexp_f32(s0, -64), false);
    }
    if denorm(q) {
        return (if s0 == num { ldexp_f32(s0, 64) } else { s0 }, true);
    }
    if en <= 23 {
        return (ldexp_f32(s0, 64), false);
    }
    (s0, false)
}

fn div_fmas_f32(a: f32, b: f32, c: f32, vcc: bool) -> f32 {
    let r = a.mul_add(b, c);
    match vcc {
        false => r,
        true if exponent32(c) > 127 => ldexp_f32(r, 64),
        true => ldexp_f32(r, -64),
    }
}

/// v_div_fixup: the special cases of a quotient `q` of `num / den`.
fn div_fixup(q: f64, den: f64, num: f64) -> f64 {
    let neg = den.is_sign_negative() != num.is_sign_negative();
    let signed = |x: f64| if neg { -x } else { x };
    if num.is_nan() || den.is_nan() {
        return f64::NAN;
    }
    if (den == 0.0 && num == 0.0) || (den.is_infinite() && num.is_infinite()) {
        return f64::NAN;
    }
    if den == 0.0 || num.is_infinite() {
        return signed(f64::INFINITY);
    }
    if den.is_infinite() || num == 0.0 {
        return signed(0.0);
    }
    signed(q.abs())
}

/// The first 1201 fractional bits of 2/π (the bit after the binary point first), the constant
/// v_trig_preop_f64 reads; the bits past 1201 are zero.
const TWO_OVER_PI: [u64; 19] = [
    0xa2f9_836e_4e44_1529,
    0xfc27_57d1_f534_ddc0,
    0xdb62_9599_3c43_9041,
    0xfe51_63ab_debb_c561,
    0xb724_6e3a_424d_d2e0,
    0x0649_2eea_09d1_921c,
    0xfe1d_eb1c_b129_a73e,
    0xe882_35f5_2ebb_4484,
    0xe99c_7026_b45f_7e41,
    0x3991_d639_8353_39f4,
    0x9c84_5f8b_bdf9_283b,
    0x1ff8_97ff_de05_980f,
    0xef2f_118b_5a0a_6d1f,
    0x6d36_7ecf_27cb_09b7,
    0x4f46_3f66_9e5f_ea2d,
    0x7527_bac7_ebe5_f17b,
    0x3d07_39f7_8a52_92ea,
    0x6bfb_5fb1_1f8d_5d08,
    0x5603_3046_fc7b_0000,
];

/// 53 bits of 2/π after its first `skip` fractional bits.
fn two_over_pi_bits(skip: u32) -> u64 {
    let word = |k: usize| TWO_OVER_PI.get(k).copied().unwrap_or(0) as u128;
    let (k, off) = ((skip / 64) as usize, skip % 64);
    let window = (word(k) << 64 | word(k + 1)) << off;
    (window >> (128 - 53)) as u64
}

/// v_trig_preop_f64: the `sel`-th 53-bit piece of 2/π for reducing `x` (shifted further for
/// large exponents, and scaled up by 2^128 for the huge ones the caller pre-scaled down).
fn trig_preop(x: f64, sel: u32) -> f64 {
    let exp = ((x.to_bits() >> 52) & 0x7ff) as u32;
    let shift = (sel & 31) * 53 + exp.saturating_sub(1077);
    let scale = -53 - shift as i32 + if exp >= 1968 { 128 } else { 0 };
    ldexp(two_over_pi_bits(shift) as f64, scale)
}

fn div_scale_f64(s0: f64, den: f64, num: f64) -> (f64, bool) {
    if num == 0.0 || den == 0.0 {
        return (f64::NAN, false);
    }
    (s0, false)
}

fn div_fmas_f64(a: f64, b: f64, c: f64, vcc: bool) -> f64 {
    let r = a.mul_add(b, c);
    match vcc {
        false => r,
        true if (c.to_bits() >> 52) & 0x7ff > 1023 => ldexp(r, 128),
        true => ldexp(r, -128),
    }
}

/// f32 to f16 rounding toward zero (v_cvt_pkrtz_f16_f32).
fn f32_to_f16_rtz(x: f32) -> u16 {
    let h = f32_to_f16(x);
    let back = f16_to_f32(h);
    if x.is_nan() || back.abs() <= x.abs() {
        return h;
    }
    if back.is_infinite() {
        return (h & 0x8000) | 0x7bff;
    }
    h - 1
}

fn madmk_or_madak(cx: &mut Cx<'_>, i: &Instr, k_second: bool, f16: bool) -> Step {
    if i.enc != Encoding::Vop2 {
        return Err(bad("v_madmk/madak", "has no VOP3 form"));
    }
    let src = if k_second {
        [i.src[0], LITERAL, i.src[1]]
    } else {
        [i.src[0], i.src[1], LITERAL]
    };
    let j = Instr { src, ..*i };
    if f16 {
        v3(cx, &j, |a: F16, b: F16, c: F16| {
            F16::of(a.f() * b.f() + c.f())
        })
    } else {
        v3(cx, &j, |a: f32, b: f32, c: f32| a * b + c)
    }
}

fn swap(cx: &mut Cx<'_>, i: &Instr) -> Step {
    let Some(src) = i.src[0].checked_sub(VGPR0) else {
        return Err(bad("v_swap_b32", "source is not a VGPR"));
    };
    let exec = cx.w.exec();
    for l in super::valu::lanes(exec) {
        let (a, b) = (cx.w.v(i.dst as usize)[l], cx.w.v(src as usize)[l]);
        cx.w.v_mut(i.dst as usize)[l] = b;
        cx.w.v_mut(src as usize)[l] = a;
    }
    Ok(Flow::Next)
}

fn nop(_: &mut Cx<'_>, _: &Instr) -> Step {
    Ok(Flow::Next)
}

pub static VOP1: &[OpDef] = &[
    def(0x00, "v_nop", nop),
    def(0x01, "v_mov_b32", |cx, i| v1(cx, i, |a: u32| a)),
    def(0x02, "v_readfirstlane_b32", |cx, i| readlane(cx, i, true)),
    def(0x03, "v_cvt_i32_f64", |cx, i| v1(cx, i, |a: f64| a as i32)),
    def(0x04, "v_cvt_f64_i32", |cx, i| v1(cx, i, |a: i32| a as f64)),
    def(0x05, "v_cvt_f32_i32", |cx, i| v1(cx, i, |a: i32| a as f32)),
    def(0x06, "v_cvt_f32_u32", |cx, i| v1(cx, i, |a: u32| a as f32)),
    def(0x07, "v_cvt_u32_f32", |cx, i| v1(cx, i, |a: f32| a as u32)),
    def(0x08, "v_cvt_i32_f32", |cx, i| v1(cx, i, |a: f32| a as i32)),
    def(0x0a, "v_cvt_f16_f32", |cx, i| {
        v1(cx, i, |a: f32| F16(f32_to_f16(a)))
    }),
    def(0x0b, "v_cvt_f32_f16", |cx, i| v1(cx, i, |a: F16| a.f())),
    def(0x0c, "v_cvt_rpi_i32_f32", |cx, i| {
        v1(cx, i, |a: f32| (a + 0.5).floor() as i32)
    }),
    def(0x0d, "v_cvt_flr_i32_f32", |cx, i| {
        v1(cx, i, |a: f32| a.floor() as i32)
    }),
    def(0x0f, "v_cvt_f32_f64", |cx, i| v1(cx, i, |a: f64| a as f32)),
    def(0x10, "v_cvt_f64_f32", |cx, i| v1(cx, i, |a: f32| a as f64)),
    def(0x11, "v_cvt_f32_ubyte0", |cx, i| {
        v1(cx, i, |a: u32| (a & 0xff) as f32)
    }),
    def(0x12, "v_cvt_f32_ubyte1", |cx, i| {
        v1(cx, i, |a: u32| ((a >> 8) & 0xff) as f32)
    }),
    def(0x13, "v_cvt_f32_ubyte2", |cx, i| {
        v1(cx, i, |a: u32| ((a >> 16) & 0xff) as f32)
    }),
    def(0x14, "v_cvt_f32_ubyte3", |cx, i| {
        v1(cx, i, |a: u32| (a >> 24) as f32)
    }),
    def(0x15, "v_cvt_u32_f64", |cx, i| v1(cx, i, |a: f64| a as u32)),
    def(0x16, "v_cvt_f64_u32", |cx, i| v1(cx, i, |a: u32| a as f64)),
    def(0x17, "v_trunc_f64", |cx, i| v1(cx, i, |a: f64| a.trunc())),
    def(0x18, "v_ceil_f64", |cx, i| v1(cx, i, |a: f64| a.ceil())),
    def(0x19, "v_rndne_f64", |cx, i| {
        v1(cx, i, |a: f64| a.round_ties_even())
    }),
    def(0x1a, "v_floor_f64", |cx, i| v1(cx, i, |a: f64| a.floor())),
    def(0x1b, "v_fract_f32", |cx, i| v1(cx, i, fract32)),
    def(0x1c, "v_trunc_f32", |cx, i| v1(cx, i, |a: f32| a.trunc())),
    def(0x1d, "v_ceil_f32", |cx, i| v1(cx, i, |a: f32| a.ceil())),
    def(0x1e, "v_rndne_f32", |cx, i| {
        v1(cx, i, |a: f32| a.round_ties_even())
    }),
    def(0x1f, "v_floor_f32", |cx, i| v1(cx, i, |a: f32| a.floor())),
    def(0x20, "v_exp_f32", |cx, i| v1(cx, i, |a: f32| a.exp2())),
    def(0x21, "v_log_f32", |cx, i| v1(cx, i, |a: f32| a.log2())),
    def(0x22, "v_rcp_f32", |cx, i| v1(cx, i, |a: f32| 1.0 / a)),
    def(0x23, "v_rcp_iflag_f32", |cx, i| v1(cx, i, |a: f32| 1.0 / a)),
    def(0x24, "v_rsq_f32", |cx, i| {
        v1(cx, i, |a: f32| 1.0 / a.sqrt())
    }),
    def(0x25, "v_rcp_f64", |cx, i| v1(cx, i, |a: f64| 1.0 / a)),
    def(0x26, "v_rsq_f64", |cx, i| {
        v1(cx, i, |a: f64| 1.0 / a.sqrt())
    }),
    def(0x27, "v_sqrt_f32", |cx, i| v1(cx, i, |a: f32| a.sqrt())),
    def(0x28, "v_sqrt_f64", |cx, i| v1(cx, i, |a: f64| a.sqrt())),
    def(0x29, "v_sin_f32", |cx, i| {
        v1(cx, i, |a: f32| {
            (a as f64 * std::f64::consts::TAU).sin() as f32
        })
    }),
    def(0x2a, "v_cos_f32", |cx, i| {
        v1(cx, i, |a: f32| {
            (a as f64 * std::f64::consts::TAU).cos() as f32
        })
    }),
    def(0x2b, "v_not_b32", |cx, i| v1(cx, i, |a: u32| !a)),
    def(0x2c, "v_bfrev_b32", |cx, i| {
        v1(cx, i, |a: u32| a.reverse_bits())
    }),
    def(0x2d, "v_ffbh_u32", |cx, i| v1(cx, i, ffbh)),
    def(0x2e, "v_ffbl_b32", |cx, i| v1(cx, i, ffbl)),
    def(0x2f, "v_ffbh_i32", |cx, i| v1(cx, i, ffbh_i32)),
    def(0x30, "v_frexp_exp_i32_f64", |cx, i| {
        v1(cx, i, |a: f64| frexp_exp(a))
    }),
    def(0x31, "v_frexp_mant_f64", |cx, i| v1(cx, i, frexp_mant)),
    def(0x32, "v_fract_f64", |cx, i| v1(cx, i, fract64)),
    def(0x33, "v_frexp_exp_i32_f32", |cx, i| {
        v1(cx, i, |a: f32| frexp_exp(a as f64))
    }),
    def(0x34, "v_frexp_mant_f32", |cx, i| {
        v1(cx, i, |a: f32| frexp_mant(a as f64) as f32)
    }),
    def(0x39, "v_cvt_f16_u16", |cx, i| {
        v1(cx, i, |a: u16| F16::of(a as f32))
    }),
    def(0x3a, "v_cvt_f16_i16", |cx, i| {
        v1(cx, i, |a: i16| F16::of(a as f32))
    }),
    def(0x3b, "v_cvt_u16_f16", |cx, i| {
        v1(cx, i, |a: F16| a.f() as u16)
    }),
    def(0x3c, "v_cvt_i16_f16", |cx, i| {
        v1(cx, i, |a: F16| a.f() as i16)
    }),
    def(0x3d, "v_rcp_f16", |cx, i| v1(cx, i, f16op(|a| 1.0 / a))),
    def(0x3e, "v_sqrt_f16", |cx, i| v1(cx, i, f16op(f32::sqrt))),
    def(0x3f, "v_rsq_f16", |cx, i| {
        v1(cx, i, f16op(|a| 1.0 / a.sqrt()))
    }),
    def(0x40, "v_log_f16", |cx, i| v1(cx, i, f16op(f32::log2))),
    def(0x41, "v_exp_f16", |cx, i| v1(cx, i, f16op(f32::exp2))),
    def(0x44, "v_floor_f16", |cx, i| v1(cx, i, f16op(f32::floor))),
    def(0x45, "v_ceil_f16", |cx, i| v1(cx, i, f16op(f32::ceil))),
    def(0x46, "v_trunc_f16", |cx, i| v1(cx, i, f16op(f32::trunc))),
    def(0x47, "v_rndne_f16", |cx, i| {
        v1(cx, i, f16op(f32::round_ties_even))
    }),
    def(0x48, "v_fract_f16", |cx, i| {
        v1(cx, i, f16op(|a| (a - a.floor()).min(f16_to_f32(0x3bff))))
    }),
    def(0x49, "v_sin_f16", |cx, i| {
        v1(cx, i, f16op(|a| (a * std::f32::consts::TAU).sin()))
    }),
    def(0x4a, "v_cos_f16", |cx, i| {
        v1(cx, i, f16op(|a| (a * std::f32::consts::TAU).cos()))
    }),
    def(0x51, "v_swap_b32", swap),
    def_on(Target::Gfx90a, 0x52, "v_accvgpr_mov_b32", |cx, i| {
        let src = i.src[0]
            .checked_sub(VGPR0)
            .ok_or(bad("v_accvgpr_mov_b32", "source is not an AccVGPR"))?;
        let exec = cx.w.exec();
        for l in super::valu::lanes(exec) {
            let v = cx.w.a(src as usize)[l];
            cx.w.a_mut(i.dst as usize)[l] = v;
        }
        Ok(Flow::Next)
    }),
];

pub static VOP2: &[OpDef] = &[
    def(0x00, "v_cndmask_b32", cndmask),
    def(0x01, "v_add_f32", |cx, i| v2(cx, i, |a: f32, b: f32| a + b)),
    def(0x02, "v_sub_f32", |cx, i| v2(cx, i, |a: f32, b: f32| a - b)),
    def(0x03, "v_subrev_f32", |cx, i| {
        v2(cx, i, |a: f32, b: f32| b - a)
    }),
    def_on(Target::Gfx908, 0x04, "v_mul_legacy_f32", |cx, i| {
        v2(cx, i, mul_legacy)
    }),
    def_on(Target::Gfx90a, 0x04, "v_fmac_f64", |cx, i| {
        mac(cx, i, |a: f64, b: f64, c: f64| a.mul_add(b, c))
    }),
    def(0x05, "v_mul_f32", |cx, i| v2(cx, i, |a: f32, b: f32| a * b)),
    def(0x06, "v_mul_i32_i24", |cx, i| {
        v2(cx, i, |a: u32, b: u32| {
            sext24(a).wrapping_mul(sext24(b)) as u32
        })
    }),
    def(0x07, "v_mul_hi_i32_i24", |cx, i| {
        v2(cx, i, |a: u32, b: u32| {
            ((sext24(a) as i64 * sext24(b) as i64) >> 32) as u32
        })
    }),
    def(0x08, "v_mul_u32_u24", |cx, i| {
        v2(cx, i, |a: u32, b: u32| {
            (a & 0xff_ffff).wrapping_mul(b & 0xff_ffff)
        })
    }),
    def(0x09, "v_mul_hi_u32_u24", |cx, i| {
        v2(cx, i, |a: u32, b: u32| {
            (((a & 0xff_ffff) as u64 * (b & 0xff_ffff) as u64) >> 32) as u32
        })
    }),
    def(0x0a, "v_min_f32", |cx, i| v2(cx, i, fmin::<f32>)),
    def(0x0b, "v_max_f32", |cx, i| v2(cx, i, fmax::<f32>)),
    def(0x0c, "v_min_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| a.min(b))
    }),
    def(0x0d, "v_max_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| a.max(b))
    }),
    def(0x0e, "v_min_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.min(b))
    }),
    def(0x0f, "v_max_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.max(b))
    }),
    def(0x10, "v_lshrrev_b32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| b >> (a & 31))
    }),
    def(0x11, "v_ashrrev_i32", |cx, i| {
        v2(cx, i, |a: u32, b: i32| b >> (a & 31))
    }),
    def(0x12, "v_lshlrev_b32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| b << (a & 31))
    }),
    def(0x13, "v_and_b32", |cx, i| v2(cx, i, |a: u32, b: u32| a & b)),
    def(0x14, "v_or_b32", |cx, i| v2(cx, i, |a: u32, b: u32| a | b)),
    def(0x15, "v_xor_b32", |cx, i| v2(cx, i, |a: u32, b: u32| a ^ b)),
    def(0x16, "v_mac_f32", |cx, i| {
        mac(cx, i, |a: f32, b: f32, c: f32| a * b + c)
    }),
    def(0x17, "v_madmk_f32", |cx, i| {
        madmk_or_madak(cx, i, true, false)
    }),
    def(0x18, "v_madak_f32", |cx, i| {
        madmk_or_madak(cx, i, false, false)
    }),
    def(0x19, "v_add_co_u32", |cx, i| {
        carry(cx, i, false, |a, b, _| a.overflowing_add(b))
    }),
    def(0x1a, "v_sub_co_u32", |cx, i| {
        carry(cx, i, false, |a, b, _| a.overflowing_sub(b))
    }),
    def(0x1b, "v_subrev_co_u32", |cx, i| {
        carry(cx, i, false, |a, b, _| b.overflowing_sub(a))
    }),
    def(0x1c, "v_addc_co_u32", |cx, i| {
        carry(cx, i, true, |a, b, c| {
            let s = a as u64 + b as u64 + c as u64;
            (s as u32, s >> 32 != 0)
        })
    }),
    def(0x1d, "v_subb_co_u32", |cx, i| {
        carry(cx, i, true, |a, b, c| {
            (
                a.wrapping_sub(b).wrapping_sub(c as u32),
                (b as u64 + c as u64) > a as u64,
            )
        })
    }),
    def(0x1e, "v_subbrev_co_u32", |cx, i| {
        carry(cx, i, true, |a, b, c| {
            (
                b.wrapping_sub(a).wrapping_sub(c as u32),
                (a as u64 + c as u64) > b as u64,
            )
        })
    }),
    def(0x1f, "v_add_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(a.f() + b.f()))
    }),
    def(0x20, "v_sub_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(a.f() - b.f()))
    }),
    def(0x21, "v_subrev_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(b.f() - a.f()))
    }),
    def(0x22, "v_mul_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(a.f() * b.f()))
    }),
    def(0x23, "v_mac_f16", |cx, i| {
        mac(cx, i, |a: F16, b: F16, c: F16| {
            F16::of(a.f() * b.f() + c.f())
        })
    }),
    def(0x24, "v_madmk_f16", |cx, i| {
        madmk_or_madak(cx, i, true, true)
    }),
    def(0x25, "v_madak_f16", |cx, i| {
        madmk_or_madak(cx, i, false, true)
    }),
    def(0x26, "v_add_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| a.wrapping_add(b))
    }),
    def(0x27, "v_sub_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| a.wrapping_sub(b))
    }),
    def(0x28, "v_subrev_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| b.wrapping_sub(a))
    }),
    def(0x29, "v_mul_lo_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| a.wrapping_mul(b))
    }),
    def(0x2a, "v_lshlrev_b16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| b << (a & 15))
    }),
    def(0x2b, "v_lshrrev_b16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| b >> (a & 15))
    }),
    def(0x2c, "v_ashrrev_i16", |cx, i| {
        v2(cx, i, |a: u16, b: i16| b >> (a & 15))
    }),
    def(0x2d, "v_max_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(fmax(a.f(), b.f())))
    }),
    def(0x2e, "v_min_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| F16::of(fmin(a.f(), b.f())))
    }),
    def(0x2f, "v_max_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| a.max(b))
    }),
    def(0x30, "v_max_i16", |cx, i| {
        v2(cx, i, |a: i16, b: i16| a.max(b))
    }),
    def(0x31, "v_min_u16", |cx, i| {
        v2(cx, i, |a: u16, b: u16| a.min(b))
    }),
    def(0x32, "v_min_i16", |cx, i| {
        v2(cx, i, |a: i16, b: i16| a.min(b))
    }),
    def(0x33, "v_ldexp_f16", |cx, i| {
        v2(cx, i, |a: F16, b: i16| F16::of(ldexp_f32(a.f(), b as i32)))
    }),
    def(0x34, "v_add_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.wrapping_add(b))
    }),
    def(0x35, "v_sub_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.wrapping_sub(b))
    }),
    def(0x36, "v_subrev_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| b.wrapping_sub(a))
    }),
    def(0x3b, "v_fmac_f32", |cx, i| {
        mac(cx, i, |a: f32, b: f32, c: f32| a.mul_add(b, c))
    }),
    def(0x3d, "v_xnor_b32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| !(a ^ b))
    }),
];

fn sext24(v: u32) -> i32 {
    ((v << 8) as i32) >> 8
}

macro_rules! float_cmps {
    ($($base:literal $t:ty, $s:literal;)*) => { &[$(
        def($base + 0x0, concat!("v_cmp_f_", $s), |cx, i| cmp(cx, i, false, |_: $t, _: $t| false)),
        def($base + 0x1, concat!("v_cmp_lt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() < b.fv())),
        def($base + 0x2, concat!("v_cmp_eq_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() == b.fv())),
        def($base + 0x3, concat!("v_cmp_le_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() <= b.fv())),
        def($base + 0x4, concat!("v_cmp_gt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() > b.fv())),
        def($base + 0x5, concat!("v_cmp_lg_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() < b.fv() || a.fv() > b.fv())),
        def($base + 0x6, concat!("v_cmp_ge_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() >= b.fv())),
        def($base + 0x7, concat!("v_cmp_o_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !a.fv().is_nan() && !b.fv().is_nan())),
        def($base + 0x8, concat!("v_cmp_u_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv().is_nan() || b.fv().is_nan())),
        def($base + 0x9, concat!("v_cmp_nge_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !(a.fv() >= b.fv()))),
        def($base + 0xa, concat!("v_cmp_nlg_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !(a.fv() < b.fv() || a.fv() > b.fv()))),
        def($base + 0xb, concat!("v_cmp_ngt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !(a.fv() > b.fv()))),
        def($base + 0xc, concat!("v_cmp_nle_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !(a.fv() <= b.fv()))),
        def($base + 0xd, concat!("v_cmp_neq_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.fv() != b.fv())),
        def($base + 0xe, concat!("v_cmp_nlt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| !(a.fv() < b.fv()))),
        def($base + 0xf, concat!("v_cmp_tru_", $s), |cx, i| cmp(cx, i, false, |_: $t, _: $t| true)),
        def($base + 0x10, concat!("v_cmpx_f_", $s), |cx, i| cmp(cx, i, true, |_: $t, _: $t| false)),
        def($base + 0x11, concat!("v_cmpx_lt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() < b.fv())),
        def($base + 0x12, concat!("v_cmpx_eq_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() == b.fv())),
        def($base + 0x13, concat!("v_cmpx_le_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() <= b.fv())),
        def($base + 0x14, concat!("v_cmpx_gt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() > b.fv())),
        def($base + 0x15, concat!("v_cmpx_lg_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() < b.fv() || a.fv() > b.fv())),
        def($base + 0x16, concat!("v_cmpx_ge_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() >= b.fv())),
        def($base + 0x17, concat!("v_cmpx_o_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !a.fv().is_nan() && !b.fv().is_nan())),
        def($base + 0x18, concat!("v_cmpx_u_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv().is_nan() || b.fv().is_nan())),
        def($base + 0x19, concat!("v_cmpx_nge_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !(a.fv() >= b.fv()))),
        def($base + 0x1a, concat!("v_cmpx_nlg_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !(a.fv() < b.fv() || a.fv() > b.fv()))),
        def($base + 0x1b, concat!("v_cmpx_ngt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !(a.fv() > b.fv()))),
        def($base + 0x1c, concat!("v_cmpx_nle_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !(a.fv() <= b.fv()))),
        def($base + 0x1d, concat!("v_cmpx_neq_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.fv() != b.fv())),
        def($base + 0x1e, concat!("v_cmpx_nlt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| !(a.fv() < b.fv()))),
        def($base + 0x1f, concat!("v_cmpx_tru_", $s), |cx, i| cmp(cx, i, true, |_: $t, _: $t| true)),
    )*] };
}

macro_rules! int_cmps {
    ($($base:literal $t:ty, $s:literal;)*) => { &[$(
        def($base + 0x0, concat!("v_cmp_f_", $s), |cx, i| cmp(cx, i, false, |_: $t, _: $t| false)),
        def($base + 0x1, concat!("v_cmp_lt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() < b.iv())),
        def($base + 0x2, concat!("v_cmp_eq_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() == b.iv())),
        def($base + 0x3, concat!("v_cmp_le_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() <= b.iv())),
        def($base + 0x4, concat!("v_cmp_gt_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() > b.iv())),
        def($base + 0x5, concat!("v_cmp_ne_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() != b.iv())),
        def($base + 0x6, concat!("v_cmp_ge_", $s), |cx, i| cmp(cx, i, false, |a: $t, b: $t| a.iv() >= b.iv())),
        def($base + 0x7, concat!("v_cmp_t_", $s), |cx, i| cmp(cx, i, false, |_: $t, _: $t| true)),
        def($base + 0x10, concat!("v_cmpx_f_", $s), |cx, i| cmp(cx, i, true, |_: $t, _: $t| false)),
        def($base + 0x11, concat!("v_cmpx_lt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() < b.iv())),
        def($base + 0x12, concat!("v_cmpx_eq_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() == b.iv())),
        def($base + 0x13, concat!("v_cmpx_le_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() <= b.iv())),
        def($base + 0x14, concat!("v_cmpx_gt_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() > b.iv())),
        def($base + 0x15, concat!("v_cmpx_ne_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() != b.iv())),
        def($base + 0x16, concat!("v_cmpx_ge_", $s), |cx, i| cmp(cx, i, true, |a: $t, b: $t| a.iv() >= b.iv())),
        def($base + 0x17, concat!("v_cmpx_t_", $s), |cx, i| cmp(cx, i, true, |_: $t, _: $t| true)),
    )*] };
}

// The unordered compares are the negations of the ordered ones (NaN compares true).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub static VOPC_FLOAT: &[OpDef] = float_cmps! {
    0x20 F16, "f16";
    0x40 f32, "f32";
    0x60 f64, "f64";
};

pub static VOPC_INT: &[OpDef] = int_cmps! {
    0xa0 i16, "i16";
    0xa8 u16, "u16";
    0xc0 i32, "i32";
    0xc8 u32, "u32";
    0xe0 i64, "i64";
    0xe8 u64, "u64";
};

pub static VOPC_CLASS: &[OpDef] = &[
    def(0x10, "v_cmp_class_f32", |cx, i| {
        cmp_class(cx, i, false, class_f32)
    }),
    def(0x11, "v_cmpx_class_f32", |cx, i| {
        cmp_class(cx, i, true, class_f32)
    }),
    def(0x12, "v_cmp_class_f64", |cx, i| {
        cmp_class(cx, i, false, class_f64)
    }),
    def(0x13, "v_cmpx_class_f64", |cx, i| {
        cmp_class(cx, i, true, class_f64)
    }),
    def(0x14, "v_cmp_class_f16", |cx, i| {
        cmp_class(cx, i, false, |h: F16| class_f16(h.0))
    }),
    def(0x15, "v_cmpx_class_f16", |cx, i| {
        cmp_class(cx, i, true, |h: F16| class_f16(h.0))
    }),
];

/// The VOPC opcodes.
pub static VOPC: &[&[OpDef]] = &[VOPC_CLASS, VOPC_FLOAT, VOPC_INT];

pub static VOP3: &[OpDef] = &[
    def(0x1c0, "v_mad_legacy_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| mul_legacy(a, b) + c)
    }),
    def(0x1c1, "v_mad_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| a * b + c)
    }),
    def(0x1c2, "v_mad_i32_i24", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            sext24(a).wrapping_mul(sext24(b)).wrapping_add(c as i32) as u32
        })
    }),
    def(0x1c3, "v_mad_u32_u24", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            (a & 0xff_ffff).wrapping_mul(b & 0xff_ffff).wrapping_add(c)
        })
    }),
    def(0x1c8, "v_bfe_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| bfe(a, b, c, false))
    }),
    def(0x1c9, "v_bfe_i32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| bfe(a, b, c, true))
    }),
    def(0x1ca, "v_bfi_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| (a & b) | (!a & c))
    }),
    def(0x1cb, "v_fma_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| a.mul_add(b, c))
    }),
    def(0x1cc, "v_fma_f64", |cx, i| {
        v3(cx, i, |a: f64, b: f64, c: f64| a.mul_add(b, c))
    }),
    def(0x1ce, "v_alignbit_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            (((a as u64) << 32 | b as u64) >> (c & 31)) as u32
        })
    }),
    def(0x1cf, "v_alignbyte_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            (((a as u64) << 32 | b as u64) >> (8 * (c & 3))) as u32
        })
    }),
    def(0x1d0, "v_min3_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| fmin(fmin(a, b), c))
    }),
    def(0x1d1, "v_min3_i32", |cx, i| {
        v3(cx, i, |a: i32, b: i32, c: i32| a.min(b).min(c))
    }),
    def(0x1d2, "v_min3_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| a.min(b).min(c))
    }),
    def(0x1d3, "v_max3_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| fmax(fmax(a, b), c))
    }),
    def(0x1d4, "v_max3_i32", |cx, i| {
        v3(cx, i, |a: i32, b: i32, c: i32| a.max(b).max(c))
    }),
    def(0x1d5, "v_max3_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| a.max(b).max(c))
    }),
    def(0x1d6, "v_med3_f32", |cx, i| {
        v3(cx, i, |a: f32, b: f32, c: f32| {
            med3(a, b, c, fmin::<f32>, fmax::<f32>)
        })
    }),
    def(0x1d7, "v_med3_i32", |cx, i| {
        v3(cx, i, |a: i32, b: i32, c: i32| {
            med3(a, b, c, Ord::min, Ord::max)
        })
    }),
    def(0x1d8, "v_med3_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            med3(a, b, c, Ord::min, Ord::max)
        })
    }),
    def(0x1de, "v_div_fixup_f32", |cx, i| {
        v3(cx, i, |q: f32, d: f32, n: f32| {
            div_fixup(q as f64, d as f64, n as f64) as f32
        })
    }),
    def(0x1df, "v_div_fixup_f64", |cx, i| v3(cx, i, div_fixup)),
    def(0x1e0, "v_div_scale_f32", |cx, i| {
        wide_carry(cx, i, |a: f32, b: f32, c: f32| div_scale_f32(a, b, c))
    }),
    def(0x1e1, "v_div_scale_f64", |cx, i| {
        wide_carry(cx, i, |a: f64, b: f64, c: f64| div_scale_f64(a, b, c))
    }),
    def(0x1e2, "v_div_fmas_f32", |cx, i| {
        div_fmas(cx, i, div_fmas_f32)
    }),
    def(0x1e3, "v_div_fmas_f64", |cx, i| {
        div_fmas(cx, i, div_fmas_f64)
    }),
    def(0x1e8, "v_mad_u64_u32", |cx, i| {
        wide_carry(cx, i, |a: u32, b: u32, c: u64| {
            let p = a as u128 * b as u128 + c as u128;
            (p as u64, p >> 64 != 0)
        })
    }),
    def(0x1e9, "v_mad_i64_i32", |cx, i| {
        wide_carry(cx, i, |a: i32, b: i32, c: i64| {
            let p = a as i128 * b as i128 + c as i128;
            (p as i64, p != p as i64 as i128)
        })
    }),
    def(0x1ed, "v_perm_b32", |cx, i| v3(cx, i, perm)),
    def(0x1f1, "v_mad_u32_u16", |cx, i| {
        v3(cx, i, |a: u16, b: u16, c: u32| {
            (a as u32 * b as u32).wrapping_add(c)
        })
    }),
    def(0x1f2, "v_mad_i32_i16", |cx, i| {
        v3(cx, i, |a: i16, b: i16, c: i32| {
            (a as i32 * b as i32).wrapping_add(c)
        })
    }),
    def(0x1f3, "v_xad_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| (a ^ b).wrapping_add(c))
    }),
    def(0x1fd, "v_lshl_add_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            (a << (b & 31)).wrapping_add(c)
        })
    }),
    def(0x1fe, "v_add_lshl_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            a.wrapping_add(b) << (c & 31)
        })
    }),
    def(0x1ff, "v_add3_u32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| {
            a.wrapping_add(b).wrapping_add(c)
        })
    }),
    def(0x200, "v_lshl_or_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| (a << (b & 31)) | c)
    }),
    def(0x201, "v_and_or_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| (a & b) | c)
    }),
    def(0x202, "v_or3_b32", |cx, i| {
        v3(cx, i, |a: u32, b: u32, c: u32| a | b | c)
    }),
    def(0x203, "v_mad_f16", |cx, i| {
        v3(cx, i, |a: F16, b: F16, c: F16| {
            F16::of(a.f() * b.f() + c.f())
        })
    }),
    def(0x204, "v_mad_u16", |cx, i| {
        v3(cx, i, |a: u16, b: u16, c: u16| {
            a.wrapping_mul(b).wrapping_add(c)
        })
    }),
    def(0x205, "v_mad_i16", |cx, i| {
        v3(cx, i, |a: i16, b: i16, c: i16| {
            a.wrapping_mul(b).wrapping_add(c)
        })
    }),
    def(0x206, "v_fma_f16", |cx, i| {
        v3(cx, i, |a: F16, b: F16, c: F16| {
            F16::of((a.f() as f64 * b.f() as f64 + c.f() as f64) as f32)
        })
    }),
    def(0x207, "v_div_fixup_f16", |cx, i| {
        v3(cx, i, |q: F16, d: F16, n: F16| {
            F16::of(div_fixup(q.f() as f64, d.f() as f64, n.f() as f64) as f32)
        })
    }),
    def(0x280, "v_add_f64", |cx, i| {
        v2(cx, i, |a: f64, b: f64| a + b)
    }),
    def(0x281, "v_mul_f64", |cx, i| {
        v2(cx, i, |a: f64, b: f64| a * b)
    }),
    def(0x282, "v_min_f64", |cx, i| v2(cx, i, fmin::<f64>)),
    def(0x283, "v_max_f64", |cx, i| v2(cx, i, fmax::<f64>)),
    def(0x284, "v_ldexp_f64", |cx, i| {
        v2(cx, i, |a: f64, b: i32| ldexp(a, b))
    }),
    def(0x285, "v_mul_lo_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.wrapping_mul(b))
    }),
    def(0x286, "v_mul_hi_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| ((a as u64 * b as u64) >> 32) as u32)
    }),
    def(0x287, "v_mul_hi_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| ((a as i64 * b as i64) >> 32) as u32)
    }),
    def(0x288, "v_ldexp_f32", |cx, i| {
        v2(cx, i, |a: f32, b: i32| ldexp_f32(a, b))
    }),
    def(0x289, "v_readlane_b32", |cx, i| readlane(cx, i, false)),
    def(0x28a, "v_writelane_b32", writelane),
    def(0x28b, "v_bcnt_u32_b32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.count_ones().wrapping_add(b))
    }),
    def(0x28c, "v_mbcnt_lo_u32_b32", |cx, i| {
        v2_lane(cx, i, |a, b, l| {
            (a & ((1u64 << l) - 1) as u32).count_ones().wrapping_add(b)
        })
    }),
    def(0x28d, "v_mbcnt_hi_u32_b32", |cx, i| {
        v2_lane(cx, i, |a, b, l| {
            (a & (((1u64 << l) - 1) >> 32) as u32)
                .count_ones()
                .wrapping_add(b)
        })
    }),
    def(0x28f, "v_lshlrev_b64", |cx, i| {
        v2(cx, i, |a: u32, b: u64| b << (a & 63))
    }),
    def(0x290, "v_lshrrev_b64", |cx, i| {
        v2(cx, i, |a: u32, b: u64| b >> (a & 63))
    }),
    def(0x291, "v_ashrrev_i64", |cx, i| {
        v2(cx, i, |a: u32, b: i64| b >> (a & 63))
    }),
    def(0x292, "v_trig_preop_f64", |cx, i| {
        v2(cx, i, |a: f64, b: u32| trig_preop(a, b))
    }),
    def(0x293, "v_bfm_b32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| {
            (((1u64 << (a & 31)) - 1) as u32) << (b & 31)
        })
    }),
    def(0x296, "v_cvt_pkrtz_f16_f32", |cx, i| {
        v2(cx, i, |a: f32, b: f32| {
            f32_to_f16_rtz(a) as u32 | (f32_to_f16_rtz(b) as u32) << 16
        })
    }),
    def(0x297, "v_cvt_pk_u16_u32", |cx, i| {
        v2(cx, i, |a: u32, b: u32| a.min(0xffff) | b.min(0xffff) << 16)
    }),
    def(0x298, "v_cvt_pk_i16_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| {
            (a.clamp(-32768, 32767) as u16 as u32) | (b.clamp(-32768, 32767) as u16 as u32) << 16
        })
    }),
    def(0x29c, "v_add_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| {
            sat_or_wrap(a as i64 + b as i64, cx_clamp(i))
        })
    }),
    def(0x29d, "v_sub_i32", |cx, i| {
        v2(cx, i, |a: i32, b: i32| {
            sat_or_wrap(a as i64 - b as i64, cx_clamp(i))
        })
    }),
    def(0x29e, "v_add_i16", |cx, i| {
        v2(cx, i, |a: i16, b: i16| a.wrapping_add(b))
    }),
    def(0x29f, "v_sub_i16", |cx, i| {
        v2(cx, i, |a: i16, b: i16| a.wrapping_sub(b))
    }),
    def(0x2a0, "v_pack_b32_f16", |cx, i| {
        v2(cx, i, |a: F16, b: F16| a.0 as u32 | (b.0 as u32) << 16)
    }),
    def_on(Target::Gfx90a, 0x2a1, "v_mul_legacy_f32", |cx, i| {
        v2(cx, i, mul_legacy)
    }),
];

fn cx_clamp(i: &Instr) -> bool {
    i.clamp
}

/// Integer clamp of VOP3 signed adds: saturate instead of wrapping.
fn sat_or_wrap(v: i64, clamp: bool) -> i32 {
    if clamp {
        v.clamp(i32::MIN as i64, i32::MAX as i64) as i32
    } else {
        v as i32
    }
}

fn f16_bin(f: impl Fn(f32, f32, f32) -> f32) -> impl Fn(u16, u16, u16) -> u16 {
    move |a, b, c| f32_to_f16(f(f16_to_f32(a), f16_to_f32(b), f16_to_f32(c)))
}

fn f32_bits(f: impl Fn(f32, f32, f32) -> f32) -> impl Fn(u32, u32, u32) -> u32 {
    move |a, b, c| f(f32::from_bits(a), f32::from_bits(b), f32::from_bits(c)).to_bits()
}

/// v_accvgpr_read/write (gfx908's VOP3P 0x58/0x59; gfx90a has the same opcodes).
fn accvgpr(cx: &mut Cx<'_>, i: &Instr, to_acc: bool) -> Step {
    let exec = cx.w.exec();
    let src = i.src[0];
    for l in super::valu::lanes(exec) {
        let v = match (to_acc, src.checked_sub(VGPR0)) {
            (true, Some(r)) => cx.w.v(r as usize)[l],
            (false, Some(r)) => cx.w.a(r as usize)[l],
            (true, None) => super::operand::s32(cx.w, i, src)?,
            (false, None) => return Err(bad("v_accvgpr_read_b32", "source is not an AccVGPR")),
        };
        if to_acc {
            cx.w.a_mut(i.dst as usize)[l] = v;
        } else {
            cx.w.v_mut(i.dst as usize)[l] = v;
        }
    }
    Ok(Flow::Next)
}

pub static VOP3P: &[OpDef] = &[
    def(0x02, "v_pk_add_i16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.wrapping_add(b), false)
    }),
    def(0x03, "v_pk_sub_i16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.wrapping_sub(b), false)
    }),
    def(0x01, "v_pk_mul_lo_u16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.wrapping_mul(b), false)
    }),
    def(0x04, "v_pk_lshlrev_b16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| b << (a & 15), false)
    }),
    def(0x05, "v_pk_lshrrev_b16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| b >> (a & 15), false)
    }),
    def(0x06, "v_pk_ashrrev_i16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| ((b as i16) >> (a & 15)) as u16, false)
    }),
    def(0x07, "v_pk_max_i16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| (a as i16).max(b as i16) as u16, false)
    }),
    def(0x08, "v_pk_min_i16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| (a as i16).min(b as i16) as u16, false)
    }),
    def(0x0a, "v_pk_add_u16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.wrapping_add(b), false)
    }),
    def(0x0b, "v_pk_sub_u16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.wrapping_sub(b), false)
    }),
    def(0x0c, "v_pk_max_u16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.max(b), false)
    }),
    def(0x0d, "v_pk_min_u16", |cx, i| {
        packed16(cx, i, 2, |a, b, _| a.min(b), false)
    }),
    def(0x0e, "v_pk_fma_f16", |cx, i| {
        packed16(
            cx,
            i,
            3,
            f16_bin(|a, b, c| (a as f64 * b as f64 + c as f64) as f32),
            true,
        )
    }),
    def(0x0f, "v_pk_add_f16", |cx, i| {
        packed16(cx, i, 2, f16_bin(|a, b, _| a + b), true)
    }),
    def(0x10, "v_pk_mul_f16", |cx, i| {
        packed16(cx, i, 2, f16_bin(|a, b, _| a * b), true)
    }),
    def(0x11, "v_pk_min_f16", |cx, i| {
        packed16(cx, i, 2, f16_bin(|a, b, _| fmin(a, b)), true)
    }),
    def(0x12, "v_pk_max_f16", |cx, i| {
        packed16(cx, i, 2, f16_bin(|a, b, _| fmax(a, b)), true)
    }),
    def_on(Target::Gfx90a, 0x30, "v_pk_fma_f32", |cx, i| {
        packed32(cx, i, 3, f32_bits(|a, b, c| a.mul_add(b, c)), true)
    }),
    def_on(Target::Gfx90a, 0x31, "v_pk_mul_f32", |cx, i| {
        packed32(cx, i, 2, f32_bits(|a, b, _| a * b), true)
    }),
    def_on(Target::Gfx90a, 0x32, "v_pk_add_f32", |cx, i| {
        packed32(cx, i, 2, f32_bits(|a, b, _| a + b), true)
    }),
    def_on(Target::Gfx90a, 0x33, "v_pk_mov_b32", super::valu::pk_mov),
    def(0x58, "v_accvgpr_read_b32", |cx, i| accvgpr(cx, i, false)),
    def(0x59, "v_accvgpr_write_b32", |cx, i| accvgpr(cx, i, true)),
];
