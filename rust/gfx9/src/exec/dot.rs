//! Dot products and mixed-precision FMA of gfx908 and gfx90a: VOP3P's v_fma_mix_f32,
//! v_fma_mixlo/hi_f16, v_dot2_f32_f16 and the integer dots (2 x 16, 4 x 8, 8 x 4 bits), and
//! VOP2's accumulating v_dot2c_f32_f16 and v_dot4c_i32_i8 (MI100/MI200 ISA guides).
//!
//! Each result is rounded once, as the hardware's fused datapath does: products of f16 and
//! f32 values are exact in f64, sums carry their rounding error (two-sum) into a
//! round-to-odd f64, which then rounds correctly to f32 or f16.

use super::opdef::{def, OpDef};
use super::operand::Kind;
use super::valu::{check_dst, lanes, mac, row_or_uniform, write};
use super::{Cx, Flow, Step};
use crate::decode::Instr;
use crate::fp::{f16_to_f32, f32_to_f16};
use crate::state::LANES;

/// a + b and its rounding error, exactly (Knuth's two-sum).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    (s, (a - (s - bb)) + (b - bb))
}

/// `s` rounded to odd given the sign of what rounding dropped (`err`): when inexact and even,
/// one ulp toward the exact value, so that a later, narrower rounding is correct.
fn round_odd(s: f64, err: f64) -> f64 {
    if err == 0.0 || !s.is_finite() || s.to_bits() & 1 == 1 {
        return s;
    }
    let away = (err > 0.0) == (s > 0.0) || s == 0.0;
    let b = s.to_bits();
    if s == 0.0 {
        // The smallest subnormal on the side of the error.
        return f64::from_bits(1 | if err < 0.0 { 1 << 63 } else { 0 });
    }
    f64::from_bits(if away { b + 1 } else { b - 1 })
}

/// The exact sum of `terms` (each exact in f64), rounded to odd.
fn sum_odd(terms: &[f64]) -> f64 {
    let (mut s, mut err) = (0.0, 0.0);
    for &t in terms {
        let (n, e) = two_sum(s, t);
        s = n;
        err += e;
    }
    let (s, e) = two_sum(s, err);
    round_odd(s, e)
}

/// A round-to-odd f64 to f16, rounding to nearest even once.
fn odd_to_f16(x: f64) -> u16 {
    let f = x as f32;
    let f = if f.is_finite() && f as f64 != x && f.to_bits() & 1 == 0 {
        let toward_zero = (f as f64).abs() > x.abs();
        f32::from_bits(if toward_zero {
            f.to_bits() - 1
        } else {
            f.to_bits() + 1
        })
    } else {
        f
    };
    f32_to_f16(f)
}

/// Clamp to [0, 1] (NaN to 0), as VOP3P's clamp bit does for floats.
fn clamp01(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Half `sel` (0: low, 1: high) of a dword.
fn half(v: u32, sel: u8) -> u16 {
    (v >> (16 * (sel & 1) as u32)) as u16
}

fn bit(m: u8, k: usize) -> u8 {
    m >> k & 1
}

/// A v_fma_mix source: an f16 half (op_sel_hi set; op_sel picks the half) or the whole f32,
/// then |x| (neg_hi) and -x (neg).
fn mix_operand(i: &Instr, k: usize, v: u32) -> f64 {
    let x = if bit(i.op_sel_hi, k) != 0 {
        f16_to_f32(half(v, bit(i.op_sel, k))) as f64
    } else {
        f32::from_bits(v) as f64
    };
    let x = if bit(i.neg_hi, k) != 0 { x.abs() } else { x };
    if bit(i.neg, k) != 0 {
        -x
    } else {
        x
    }
}

/// a * b + c of a v_fma_mix, rounded to odd in f64.
fn mix(i: &Instr, s: [u32; 3]) -> f64 {
    let [a, b, c] = std::array::from_fn(|k| mix_operand(i, k, s[k]));
    sum_odd(&[a * b, c])
}

/// The two f16 elements of a v_dot2_f32_f16 source: op_sel picks the first's half,
/// op_sel_hi the second's; neg and neg_hi negate them.
fn f16_pair(i: &Instr, k: usize, v: u32) -> [f64; 2] {
    let lo = f16_to_f32(half(v, bit(i.op_sel, k))) as f64;
    let hi = f16_to_f32(half(v, bit(i.op_sel_hi, k))) as f64;
    let neg = |x: f64, m: u8| if bit(m, k) != 0 { -x } else { x };
    [neg(lo, i.neg), neg(hi, i.neg_hi)]
}

fn dot2_f32_f16(i: &Instr, s: [u32; 3]) -> u32 {
    let (a, b) = (f16_pair(i, 0, s[0]), f16_pair(i, 1, s[1]));
    let c = f32::from_bits(s[2]) as f64;
    let c = if bit(i.neg, 2) != 0 { -c } else { c };
    let r = sum_odd(&[a[0] * b[0], a[1] * b[1], c]);
    let r = if i.clamp { clamp01(r) } else { r };
    (r as f32).to_bits()
}

/// An integer dot of `n` elements of `bits` bits each (signed or not) plus c: wrapped to 32
/// bits, or saturated when `clamp`.
fn int_dot(a: u32, b: u32, c: u32, bits: u32, signed: bool, clamp: bool) -> u32 {
    let n = 32 / bits;
    let el = |v: u32, k: u32| -> i64 {
        let x = (v >> (k * bits)) & ((1u64 << bits) - 1) as u32;
        if signed {
            ((x << (32 - bits)) as i32 >> (32 - bits)) as i64
        } else {
            x as i64
        }
    };
    let acc = if signed { c as i32 as i64 } else { c as i64 };
    let sum = (0..n).fold(acc, |s, k| s + el(a, k) * el(b, k));
    match (clamp, signed) {
        (false, _) => sum as u32,
        (true, true) => sum.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32,
        (true, false) => sum.clamp(0, u32::MAX as i64) as u32,
    }
}

/// A VOP3P instruction computing each lane's dword from its three source dwords and the
/// destination's old value; `kinds` say how an inline constant reads for each source.
fn lanes3(cx: &mut Cx<'_>, i: &Instr, kinds: [Kind; 3], f: impl Fn([u32; 3], u32) -> u32) -> Step {
    let mut src = [[0u32; LANES]; 3];
    for (k, s) in src.iter_mut().enumerate() {
        *s = row_or_uniform(cx.w, i, i.src[k], kinds[k])?;
    }
    check_dst(i, 1, "VOP3P")?;
    let old = *cx.w.v(i.dst as usize);
    let mut out = [0u64; LANES];
    for l in lanes(cx.w.exec()) {
        out[l] = f([src[0][l], src[1][l], src[2][l]], old[l]) as u64;
    }
    write::<u32>(cx.w, i, cx.w.exec(), &out)?;
    Ok(Flow::Next)
}

/// How a v_fma_mix source reads an inline constant: as f16 where op_sel_hi makes it one.
fn mix_kinds(i: &Instr) -> [Kind; 3] {
    std::array::from_fn(|k| {
        if bit(i.op_sel_hi, k) != 0 {
            Kind::F16
        } else {
            Kind::F32
        }
    })
}

/// The f16 result of a v_fma_mixlo/hi, clamped when asked.
fn mix_f16(i: &Instr, s: [u32; 3]) -> u32 {
    let r = mix(i, s);
    odd_to_f16(if i.clamp { clamp01(r) } else { r }) as u32
}

const INT: [Kind; 3] = [Kind::B32; 3];

pub static VOP3P_DOT: &[OpDef] = &[
    def(0x20, "v_fma_mix_f32", |cx, i| {
        lanes3(cx, i, mix_kinds(i), |s, _| {
            let r = mix(i, s);
            (if i.clamp { clamp01(r) } else { r } as f32).to_bits()
        })
    }),
    def(0x21, "v_fma_mixlo_f16", |cx, i| {
        lanes3(cx, i, mix_kinds(i), |s, old| {
            old & 0xffff_0000 | mix_f16(i, s)
        })
    }),
    def(0x22, "v_fma_mixhi_f16", |cx, i| {
        lanes3(cx, i, mix_kinds(i), |s, old| {
            old & 0xffff | mix_f16(i, s) << 16
        })
    }),
    def(0x23, "v_dot2_f32_f16", |cx, i| {
        lanes3(cx, i, [Kind::F16, Kind::F16, Kind::F32], |s, _| {
            dot2_f32_f16(i, s)
        })
    }),
    def(0x26, "v_dot2_i32_i16", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 16, true, i.clamp)
        })
    }),
    def(0x27, "v_dot2_u32_u16", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 16, false, i.clamp)
        })
    }),
    def(0x28, "v_dot4_i32_i8", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 8, true, i.clamp)
        })
    }),
    def(0x29, "v_dot4_u32_u8", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 8, false, i.clamp)
        })
    }),
    def(0x2a, "v_dot8_i32_i4", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 4, true, i.clamp)
        })
    }),
    def(0x2b, "v_dot8_u32_u4", |cx, i| {
        lanes3(cx, i, INT, |s, _| {
            int_dot(s[0], s[1], s[2], 4, false, i.clamp)
        })
    }),
];

/// VOP2's accumulating dots: D = dot(S0, S1) + D.
pub static VOP2_DOT: &[OpDef] = &[
    def(0x37, "v_dot2c_f32_f16", |cx, i| {
        let plain = Instr {
            op_sel: 0,
            op_sel_hi: 0b11,
            neg: 0,
            neg_hi: 0,
            clamp: false,
            ..*i
        };
        mac(cx, i, move |a: u32, b: u32, c: u32| {
            dot2_f32_f16(&plain, [a, b, c])
        })
    }),
    def(0x39, "v_dot4c_i32_i8", |cx, i| {
        mac(cx, i, |a: u32, b: u32, c: u32| {
            int_dot(a, b, c, 8, true, false)
        })
    }),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_odd_keeps_a_later_f16_rounding_correct() {
        // 1 + 2^-11 is an f16 tie (rounds to 1.0, even); a hair above it must round up.
        let tie = 1.0 + 2f64.powi(-11);
        assert_eq!(odd_to_f16(sum_odd(&[tie, 0.0])), 0x3c00);
        assert_eq!(odd_to_f16(sum_odd(&[tie, 2f64.powi(-80)])), 0x3c01);
        assert_eq!(odd_to_f16(sum_odd(&[tie, -(2f64.powi(-80))])), 0x3c00);
        assert_eq!(
            odd_to_f16(sum_odd(&[65520.0, 0.0])),
            0x7c00,
            "overflow to infinity"
        );
    }

    #[test]
    fn integer_dots_wrap_or_saturate() {
        // Four bytes of -128 times -128 plus i32::MAX: saturates with clamp.
        assert_eq!(int_dot(0x8080_8080, 0x8080_8080, 0, 8, true, false), 65536);
        assert_eq!(
            int_dot(0x8080_8080, 0x8080_8080, i32::MAX as u32, 8, true, true),
            i32::MAX as u32
        );
        assert_eq!(
            int_dot(0xffff_ffff, 0xffff_ffff, 1, 4, false, false),
            8 * 225 + 1
        );
        assert_eq!(
            int_dot(0xffff_ffff, 0xffff_ffff, u32::MAX, 4, false, true),
            u32::MAX
        );
        // Nibbles 0xf are -1 signed.
        assert_eq!(
            int_dot(0xffff_ffff, 0x1111_1111, 0, 4, true, false),
            (-8i32) as u32
        );
        assert_eq!(
            int_dot(0x0002_fffe, 0x0003_0005, 7, 16, true, false),
            7 + 6 - 10
        );
    }
}
