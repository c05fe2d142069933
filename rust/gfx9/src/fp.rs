//! Floating-point helpers the VALU needs beyond Rust's f32/f64: IEEE half precision,
//! the class mask of v_cmp_class, and AMD's conversions (saturating, NaN to zero).

/// IEEE binary16 bits to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            let shift = man.leading_zeros() - 21;
            let m = (man << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        0x1f => sign | 0x7f80_0000 | (man << 13) | if man != 0 { 0x40_0000 } else { 0 },
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 to IEEE binary16 bits, rounding to nearest even; NaNs stay quiet NaNs.
pub fn f32_to_f16(f: f32) -> u16 {
    let b = f.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        return sign | subnormal_f16(man | 0x80_0000, 14 - e) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    sign | round_half_even(half, man & 0x1fff, 0x1000) as u16
}

/// `m` (24 bits with the implicit one) shifted right by `shift - 1 + 10` into a subnormal.
fn subnormal_f16(m: u32, shift: i32) -> u32 {
    let shift = shift as u32;
    if shift > 24 {
        return 0;
    }
    let kept = m >> shift;
    let rest = m & ((1 << shift) - 1);
    round_half_even(kept, rest, 1 << (shift - 1))
}

fn round_half_even(kept: u32, rest: u32, half: u32) -> u32 {
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// The v_cmp_class mask bits a value falls in: 0 signaling NaN, 1 quiet NaN, 2 -inf,
/// 3 -normal, 4 -denormal, 5 -0, 6 +0, 7 +denormal, 8 +normal, 9 +inf.
pub fn class_bit(
    neg: bool,
    exp_all_ones: bool,
    exp_zero: bool,
    man_zero: bool,
    quiet: bool,
) -> u32 {
    let k = match (exp_all_ones, exp_zero, man_zero) {
        (true, _, false) => return if quiet { 1 } else { 0 },
        (true, _, true) => 9,
        (false, true, true) => 6,
        (false, true, false) => 7,
        _ => 8,
    };
    if neg {
        11 - k
    } else {
        k
    }
}

pub fn class_f32(x: f32) -> u32 {
    let b = x.to_bits();
    let (e, m) = ((b >> 23) & 0xff, b & 0x7f_ffff);
    class_bit(b >> 31 != 0, e == 0xff, e == 0, m == 0, m & 0x40_0000 != 0)
}

pub fn class_f64(x: f64) -> u32 {
    let b = x.to_bits();
    let (e, m) = ((b >> 52) & 0x7ff, b & 0xf_ffff_ffff_ffff);
    class_bit(b >> 63 != 0, e == 0x7ff, e == 0, m == 0, m & (1 << 51) != 0)
}

pub fn class_f16(h: u16) -> u32 {
    let (e, m) = ((h >> 10) & 0x1f, h & 0x3ff);
    class_bit(h >> 15 != 0, e == 0x1f, e == 0, m == 0, m & 0x200 != 0)
}

/// f32 to i32 as v_cvt_i32_f32 does: truncation, saturation, NaN to 0 (Rust's `as`).
pub fn f32_to_i32(x: f32) -> i32 {
    x as i32
}

/// Frexp exponent as v_frexp_exp_i32_* returns it (0 for NaN and infinities).
pub fn frexp_exp(x: f64) -> i32 {
    if !x.is_finite() || x == 0.0 {
        return 0;
    }
    let b = x.to_bits();
    let e = ((b >> 52) & 0x7ff) as i32;
    if e == 0 {
        let lz = (b & 0xf_ffff_ffff_ffff).leading_zeros() as i32 - 12;
        return -1022 - lz;
    }
    e - 1022
}

/// Frexp mantissa in [0.5, 1) with the sign of `x` (NaN and infinities unchanged).
pub fn frexp_mant(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    ldexp(x, -frexp_exp(x))
}

/// `x * 2^e`, exact until the result rounds into the subnormals or overflows.
pub fn ldexp(x: f64, e: i32) -> f64 {
    let mut x = x;
    let mut e = e.clamp(-2200, 2200);
    while e > 1000 {
        x *= f64::from_bits(0x7e70_0000_0000_0000); // 2^1000
        e -= 1000;
    }
    while e < -1000 {
        x *= f64::from_bits(0x0170_0000_0000_0000); // 2^-1000
        e += 1000;
    }
    x * f64::from_bits(((e + 1023) as u64) << 52)
}

/// f32 `x * 2^e`, rounded once.
pub fn ldexp_f32(x: f32, e: i32) -> f32 {
    ldexp(x as f64, e) as f32
}
