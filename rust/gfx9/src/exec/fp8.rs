//! gfx942's 8-bit floats and their conversions (MI300 ISA guide; AMD's HIP 6.4 header
//! `amd_hip_fp8.h` models the instructions in software for the host, which fixes the
//! details the guide leaves open).
//!
//! - **fp8** is E4M3FNUZ (bias 8, three mantissa bits, largest 240) and **bf8** E5M2FNUZ
//!   (bias 16, two mantissa bits, largest 57344). Neither has infinities or a negative zero:
//!   0x80 is the one NaN, 0x00 the one zero; exponent field 0 is denormal.
//! - **To f32** (`v_cvt_f32_fp8/bf8`, `v_cvt_pk_f32_fp8/bf8`) is exact; 0x80 gives the quiet
//!   NaN 0x7fc00000. The byte (or, for the pk forms, the word) is chosen with SDWA's src0_sel.
//! - **From f32** (`v_cvt_pk_fp8/bf8_f32`: two values into the word op_sel[3] picks, the other
//!   word kept; `v_cvt_sr_fp8/bf8_f32`: one value into the byte op_sel[3:2] picks, the others
//!   kept) rounds to nearest even. NaN, infinities and magnitudes above the largest value
//!   give 0x80 (no saturation: software clamps first, as the HIP header does with v_med3).
//!   Zero and anything that rounds to zero give 0x00.
//! - **Stochastic rounding** (the _sr_ forms, S1 the random bits): the f32 significand is
//!   first shifted to the fp8 denormal scale where the result is denormal (dropping bits),
//!   then the low 23 - m bits of S1 (m the mantissa width) are added below the kept bits
//!   and the sum truncated: a value rounds away from zero with a probability equal to the
//!   fraction it lies between its two neighbours.
//! - Clamp, output modifiers and DPP on these opcodes are refused (LLVM accepts none but
//!   clamp/omod on the VOP3 forms of the f32 results, which compilers do not emit here).

use super::opdef::{def_on, OpDef};
use super::operand::{scalar, vgpr, Kind};
use super::{bad, Abort, Cx, Flow, Step};
use crate::decode::{Encoding, Ext, Instr};
use crate::state::Target::Gfx942;
use crate::state::LANES;

/// One of gfx942's two 8-bit float formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F8 {
    /// E4M3FNUZ.
    Fp8,
    /// E5M2FNUZ.
    Bf8,
}

/// The NaN encoding of both formats.
pub const F8_NAN: u8 = 0x80;

impl F8 {
    fn mant_bits(self) -> i32 {
        match self {
            F8::Fp8 => 3,
            F8::Bf8 => 2,
        }
    }

    fn bias(self) -> i32 {
        match self {
            F8::Fp8 => 8,
            F8::Bf8 => 16,
        }
    }

    fn exp_max(self) -> i32 {
        match self {
            F8::Fp8 => 15,
            F8::Bf8 => 31,
        }
    }

    /// The largest finite value's f32 bits (240, 57344).
    fn max_bits(self) -> u32 {
        self.to_f32(0x7f).to_bits()
    }

    /// The value of `b` (exact).
    pub fn to_f32(self, b: u8) -> f32 {
        if b == F8_NAN {
            return f32::from_bits(0x7fc0_0000);
        }
        let m = self.mant_bits();
        let e = ((b & 0x7f) >> m) as i32;
        let f = (b as u32) & ((1 << m) - 1);
        let (sig, exp) = if e == 0 {
            (f, 1 - self.bias() - m)
        } else {
            (f | 1 << m, e - self.bias() - m)
        };
        let v = sig as f32 * f32::from_bits(((exp + 127) as u32) << 23);
        if b & 0x80 != 0 {
            -v
        } else {
            v
        }
    }

    /// `x` rounded to nearest even, or stochastically with the random bits `seed`.
    pub fn round_from(self, x: f32, seed: Option<u32>) -> u8 {
        let bits = x.to_bits();
        if !x.is_finite() || bits & 0x7fff_ffff > self.max_bits() {
            return F8_NAN;
        }
        let (e, frac) = ((bits >> 23) & 0xff, bits & 0x7f_ffff);
        if e == 0 && frac == 0 {
            return 0;
        }
        // x = m * 2^lsb; the result's quantum is 2^q.
        let (m, lsb) = if e == 0 {
            (frac, -149)
        } else {
            (frac | 1 << 23, e as i32 - 150)
        };
        let mb = self.mant_bits();
        let top = 31 - m.leading_zeros() as i32 + lsb;
        let q = top.max(1 - self.bias()) - mb;
        let shift = (q - lsb) as u32;
        let r = match seed {
            None => round_half_even(m as u64, shift),
            Some(s) => {
                let kept = 23 - mb as u32;
                let pre = shift - kept;
                let m1 = if pre >= 32 { 0 } else { m >> pre } as u64;
                (m1 + (s & ((1 << kept) - 1)) as u64) >> kept
            }
        };
        self.encode(bits >> 31 != 0, r, q)
    }

    /// The code of `(-1)^neg * r * 2^q`, r at most 2^(m+1).
    fn encode(self, neg: bool, r: u64, q: i32) -> u8 {
        if r == 0 {
            return 0;
        }
        let mb = self.mant_bits();
        let (r, q) = if r >> (mb + 1) != 0 {
            (r >> 1, q + 1)
        } else {
            (r, q)
        };
        let field = if r >> mb != 0 {
            q + mb + self.bias()
        } else {
            0
        };
        if field > self.exp_max() {
            return F8_NAN;
        }
        let mant = (r as u8) & ((1 << mb) - 1);
        ((neg as u8) << 7) | ((field as u8) << mb) | mant
    }
}

fn round_half_even(m: u64, shift: u32) -> u64 {
    if shift == 0 {
        return m;
    }
    if shift > 40 {
        return 0;
    }
    let (r, rem, half) = (m >> shift, m & ((1 << shift) - 1), 1u64 << (shift - 1));
    if rem > half || (rem == half && r & 1 == 1) {
        r + 1
    } else {
        r
    }
}

/// VOP1 opcodes new on gfx940: fp8/bf8 to f32.
pub static VOP1: &[OpDef] = &[
    def_on(Gfx942, 0x54, "v_cvt_f32_fp8", |cx, i| {
        to_f32(cx, i, F8::Fp8, false)
    }),
    def_on(Gfx942, 0x55, "v_cvt_f32_bf8", |cx, i| {
        to_f32(cx, i, F8::Bf8, false)
    }),
    def_on(Gfx942, 0x56, "v_cvt_pk_f32_fp8", |cx, i| {
        to_f32(cx, i, F8::Fp8, true)
    }),
    def_on(Gfx942, 0x57, "v_cvt_pk_f32_bf8", |cx, i| {
        to_f32(cx, i, F8::Bf8, true)
    }),
];

/// VOP3-only opcodes new on gfx940: f32 to fp8/bf8.
pub static VOP3: &[OpDef] = &[
    def_on(Gfx942, 0x2a2, "v_cvt_pk_fp8_f32", |cx, i| {
        pack(cx, i, F8::Fp8)
    }),
    def_on(Gfx942, 0x2a3, "v_cvt_pk_bf8_f32", |cx, i| {
        pack(cx, i, F8::Bf8)
    }),
    def_on(Gfx942, 0x2a4, "v_cvt_sr_fp8_f32", |cx, i| {
        stochastic(cx, i, F8::Fp8)
    }),
    def_on(Gfx942, 0x2a5, "v_cvt_sr_bf8_f32", |cx, i| {
        stochastic(cx, i, F8::Bf8)
    }),
];

/// Operand `code` of every lane, as raw bits (a VGPR row, or a scalar for all lanes).
fn lanes_of(cx: &Cx<'_>, i: &Instr, code: u16, kind: Kind) -> Result<[u32; LANES], Abort> {
    match vgpr(code) {
        Some(r) => Ok(*cx.w.v(r)),
        None => Ok([scalar(cx.w, i, code, kind)? as u32; LANES]),
    }
}

/// Source `n` as f32 bits with VOP3's abs and neg applied.
fn f32_lanes(cx: &Cx<'_>, i: &Instr, n: usize) -> Result<[u32; LANES], Abort> {
    let mut v = lanes_of(cx, i, i.src[n], Kind::F32)?;
    let (abs, neg) = ((i.abs >> n) & 1 != 0, (i.neg >> n) & 1 != 0);
    for x in v.iter_mut() {
        if abs {
            *x &= 0x7fff_ffff;
        }
        if neg {
            *x ^= 0x8000_0000;
        }
    }
    Ok(v)
}

/// The shift that brings the source bits to convert down to bit 0, and their mask: SDWA's
/// src0_sel (zero-extended, as SDWA reads sources), or the whole dword.
fn source_select(i: &Instr, name: &'static str) -> Result<(u32, u32), Abort> {
    if i.enc == Encoding::Vop3 && (i.clamp || i.omod != 0 || i.abs != 0 || i.neg != 0) {
        return Err(bad(
            name,
            "clamp, output and input modifiers are not modelled",
        ));
    }
    match i.ext {
        Ext::None => Ok((0, u32::MAX)),
        Ext::Dpp(_) => Err(bad(name, "DPP is not modelled")),
        Ext::Sdwa(s) if s.dst_sel != 6 || s.src_sext[0] => Err(bad(
            name,
            "SDWA dst_sel other than DWORD, or sext, is not modelled",
        )),
        Ext::Sdwa(s) => match s.src_sel[0] {
            b @ 0..=3 => Ok((8 * b as u32, 0xff)),
            w @ 4..=5 => Ok((16 * (w as u32 - 4), 0xffff)),
            6 => Ok((0, u32::MAX)),
            _ => Err(bad(name, "reserved SDWA select value")),
        },
    }
}

/// v_cvt_f32_fp8/bf8 (byte 0 of the selected source) and the pk forms (bytes 0 and 1 into
/// an even-aligned register pair).
fn to_f32(cx: &mut Cx<'_>, i: &Instr, f: F8, pk: bool) -> Step {
    let name = if pk {
        "v_cvt_pk_f32_fp8"
    } else {
        "v_cvt_f32_fp8"
    };
    let (shift, mask) = source_select(i, name)?;
    let src = lanes_of(cx, i, i.src[0], Kind::B32)?;
    let d = i.dst as usize;
    if pk && (!d.is_multiple_of(2) || d + 1 > 255) {
        return Err(bad(name, "destination pair misaligned or past v255"));
    }
    let exec = cx.w.exec();
    for l in (0..LANES).filter(|l| (exec >> l) & 1 != 0) {
        let v = (src[l] >> shift) & mask;
        cx.w.v_mut(d)[l] = f.to_f32(v as u8).to_bits();
        if pk {
            cx.w.v_mut(d + 1)[l] = f.to_f32((v >> 8) as u8).to_bits();
        }
    }
    Ok(Flow::Next)
}

fn no_output_modifiers(i: &Instr, name: &'static str) -> Result<(), Abort> {
    if i.clamp || i.omod != 0 {
        return Err(bad(name, "clamp and output modifiers are not modelled"));
    }
    Ok(())
}

/// v_cvt_pk_fp8/bf8_f32: D.word[op_sel[3]] = { f8(S1), f8(S0) }, the other word kept.
fn pack(cx: &mut Cx<'_>, i: &Instr, f: F8) -> Step {
    no_output_modifiers(i, "v_cvt_pk_fp8_f32")?;
    let (a, b) = (f32_lanes(cx, i, 0)?, f32_lanes(cx, i, 1)?);
    let shift = if i.op_sel & 8 != 0 { 16 } else { 0 };
    let exec = cx.w.exec();
    let row = cx.w.v_mut(i.dst as usize);
    for l in (0..LANES).filter(|l| (exec >> l) & 1 != 0) {
        let lo = f.round_from(f32::from_bits(a[l]), None) as u32;
        let hi = f.round_from(f32::from_bits(b[l]), None) as u32;
        row[l] = (row[l] & !(0xffff << shift)) | (lo | hi << 8) << shift;
    }
    Ok(Flow::Next)
}

/// v_cvt_sr_fp8/bf8_f32: D.byte[op_sel[3:2]] = f8(S0) rounded stochastically with S1.
fn stochastic(cx: &mut Cx<'_>, i: &Instr, f: F8) -> Step {
    no_output_modifiers(i, "v_cvt_sr_fp8_f32")?;
    if (i.abs | i.neg) & 2 != 0 {
        return Err(bad("v_cvt_sr_fp8_f32", "S1 takes no input modifiers"));
    }
    let (a, seed) = (f32_lanes(cx, i, 0)?, lanes_of(cx, i, i.src[1], Kind::B32)?);
    let shift = 8 * ((i.op_sel >> 2) & 3) as u32;
    let exec = cx.w.exec();
    let row = cx.w.v_mut(i.dst as usize);
    for l in (0..LANES).filter(|l| (exec >> l) & 1 != 0) {
        let v = f.round_from(f32::from_bits(a[l]), Some(seed[l])) as u32;
        row[l] = (row[l] & !(0xff << shift)) | v << shift;
    }
    Ok(Flow::Next)
}
