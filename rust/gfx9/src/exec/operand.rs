//! Scalar operands: registers, inline constants, the literal, and scalar destinations.

use super::{bad, Abort};
use crate::decode::{Instr, LITERAL, VGPR0};
use crate::state::{sreg, Wave};

/// How an operand's bits are read: its width and whether inline float constants and the
/// literal take a floating-point meaning (f64's literal is the high dword).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    B16,
    F16,
    B32,
    F32,
    B64,
    F64,
}

impl Kind {
    pub fn wide(self) -> bool {
        matches!(self, Kind::B64 | Kind::F64)
    }
}

/// Inline float constants 240..=248 (0.5, -0.5, 1, -1, 2, -2, 4, -4, 1/(2*pi)) per width.
const INLINE_F16: [u16; 9] = [
    0x3800, 0xb800, 0x3c00, 0xbc00, 0x4000, 0xc000, 0x4400, 0xc400, 0x3118,
];
const INLINE_F32: [u32; 9] = [
    0x3f00_0000,
    0xbf00_0000,
    0x3f80_0000,
    0xbf80_0000,
    0x4000_0000,
    0xc000_0000,
    0x4080_0000,
    0xc080_0000,
    0x3e22_f983,
];
const INLINE_F64: [u64; 9] = [
    0x3fe0_0000_0000_0000,
    0xbfe0_0000_0000_0000,
    0x3ff0_0000_0000_0000,
    0xbff0_0000_0000_0000,
    0x4000_0000_0000_0000,
    0xc000_0000_0000_0000,
    0x4010_0000_0000_0000,
    0xc010_0000_0000_0000,
    0x3fc4_5f30_6dc9_c882,
];

fn inline_float(code: u16, kind: Kind) -> u64 {
    let k = (code - 240) as usize;
    match kind {
        Kind::B16 | Kind::F16 => INLINE_F16[k] as u64,
        Kind::B32 | Kind::F32 => INLINE_F32[k] as u64,
        Kind::B64 | Kind::F64 => INLINE_F64[k],
    }
}

fn truncate(v: u64, kind: Kind) -> u64 {
    match kind {
        Kind::B16 | Kind::F16 => v & 0xffff,
        Kind::B32 | Kind::F32 => v & 0xffff_ffff,
        _ => v,
    }
}

/// The value of a non-VGPR operand `code` of `i`, read as `kind`.
pub fn scalar(w: &Wave, i: &Instr, code: u16, kind: Kind) -> Result<u64, Abort> {
    let c = code as usize;
    let v = match code {
        0..=127 if kind.wide() => w.sgpr64(c),
        0..=127 => w.sgpr(c) as u64,
        128..=192 => (code - 128) as u64,
        193..=208 => (-((code - 192) as i64)) as u64,
        // SRC_SHARED_BASE, SRC_PRIVATE_BASE read as 64 bits: the aperture's base address
        // (LLVM 16 and later read them so and shift the high dword down).
        235 if kind.wide() => w.apertures.shared_base,
        237 if kind.wide() => w.apertures.private_base,
        236 | 238 if kind.wide() => {
            return Err(bad(
                "operand",
                "a 64-bit read of SRC_SHARED_LIMIT/SRC_PRIVATE_LIMIT is not implemented",
            ))
        }
        // SRC_SHARED_BASE/LIMIT, SRC_PRIVATE_BASE/LIMIT read as 32 bits: the high dword of
        // the 4 GiB aperture (base and limit share it).
        235 | 236 => w.apertures.shared_base >> 32,
        237 | 238 => w.apertures.private_base >> 32,
        240..=248 => return Ok(inline_float(code, kind)),
        251 => (w.vcc() == 0) as u64,
        252 => (w.exec() == 0) as u64,
        253 => w.scc as u64,
        LITERAL if kind == Kind::F64 => (i.literal as u64) << 32,
        LITERAL => i.literal as u64,
        _ => {
            return Err(bad(
                "operand",
                "source operand code is reserved or not implemented",
            ))
        }
    };
    Ok(truncate(v, kind))
}

pub fn s32(w: &Wave, i: &Instr, code: u16) -> Result<u32, Abort> {
    scalar(w, i, code, Kind::B32).map(|v| v as u32)
}

pub fn s64(w: &Wave, i: &Instr, code: u16) -> Result<u64, Abort> {
    scalar(w, i, code, Kind::B64)
}

/// Writes a scalar destination (SGPRs, VCC, TTMPs, M0, EXEC; codes above 127 refused).
pub fn set_s32(w: &mut Wave, code: u16, v: u32) -> Result<(), Abort> {
    if code > sreg::EXEC_LO as u16 + 1 {
        return Err(bad(
            "scalar destination",
            "operand code names no writable register",
        ));
    }
    w.set_sgpr(code as usize, v);
    Ok(())
}

pub fn set_s64(w: &mut Wave, code: u16, v: u64) -> Result<(), Abort> {
    set_s32(w, code, v as u32)?;
    set_s32(w, code + 1, (v >> 32) as u32)
}

/// The VGPR number of an operand code, or `None` for a scalar or constant.
pub fn vgpr(code: u16) -> Option<usize> {
    (code >= VGPR0).then(|| (code - VGPR0) as usize)
}
