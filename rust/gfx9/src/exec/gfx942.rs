//! gfx942 (MI300, CDNA3): gfx90a's opcode tables less what gfx940 dropped or renamed, plus
//! the opcodes it added that this engine runs (MI300 ISA guide; checked against LLVM 21's
//! llvm-mc for gfx942 at test time, as gfx908/gfx90a are against llvm-mc-15).
//!
//! The memory instructions' cache bits are named sc0/sc1/nt on gfx942 where gfx90a has
//! glc/scc/slc; they sit at the same bits and the engine reads them alike (sc0 of an atomic
//! returns the old value, as glc does; a load with sc0 or sc1 reads past what the memory read
//! ahead, as one with glc or scc does).

use super::opdef::{def_on, OpDef};
use super::valu::{v1, v3};
use super::{bad, Cx, Step};
use crate::decode::{Encoding, Instr, LITERAL};
use crate::state::Target::Gfx942;

/// Mnemonics of gfx90a's tables that gfx942 does not have under that opcode and name:
/// dropped outright, or renamed (the new name is an entry below or in `mfma.rs`).
const DROPPED: &[&str] = &[
    // The cache maintenance of gfx940 is buffer_inv and buffer_wbl2 with sc bits.
    "buffer_invl2",
    "buffer_wbinvl1",
    "buffer_wbinvl1_vol",
    // gfx940 has no unfused f32 multiply-add: v_mac/v_mad are gone, VOP2 0x17/0x18 are
    // v_fmamk_f32/v_fmaak_f32.
    "v_mac_f32",
    "v_mad_f32",
    "v_mad_legacy_f32",
    "v_madmk_f32",
    "v_madak_f32",
    // MFMA: gfx940 renamed the f32/f16/bf16_1k forms and dropped the old bf16 and the
    // 32x32x8/16x16x16 i8 forms (mfma.rs holds the gfx942 names).
    "v_mfma_f32_32x32x1f32",
    "v_mfma_f32_16x16x1f32",
    "v_mfma_f32_4x4x1f32",
    "v_mfma_f32_32x32x2f32",
    "v_mfma_f32_16x16x4f32",
    "v_mfma_f32_32x32x4f16",
    "v_mfma_f32_16x16x4f16",
    "v_mfma_f32_4x4x4f16",
    "v_mfma_f32_32x32x8f16",
    "v_mfma_f32_16x16x16f16",
    "v_mfma_i32_32x32x4i8",
    "v_mfma_i32_16x16x4i8",
    "v_mfma_i32_4x4x4i8",
    "v_mfma_i32_32x32x8i8",
    "v_mfma_i32_16x16x16i8",
    "v_mfma_f32_32x32x4bf16_1k",
    "v_mfma_f32_16x16x4bf16_1k",
    "v_mfma_f32_4x4x4bf16_1k",
    "v_mfma_f32_32x32x8bf16_1k",
    "v_mfma_f32_16x16x16bf16_1k",
    "v_mfma_f32_32x32x2bf16",
    "v_mfma_f32_16x16x2bf16",
    "v_mfma_f32_4x4x2bf16",
    "v_mfma_f32_32x32x4bf16",
    "v_mfma_f32_16x16x8bf16",
    "v_mfma_f64_16x16x4f64",
    "v_mfma_f64_4x4x4f64",
];

/// Whether gfx942 lacks gfx90a's entry `name`.
pub(super) fn dropped(name: &str) -> bool {
    DROPPED.contains(&name)
}

/// VOP2 opcodes new on gfx940: the fused forms of v_madmk/v_madak, K the literal.
pub static VOP2: &[OpDef] = &[
    def_on(Gfx942, 0x17, "v_fmamk_f32", |cx, i| fma_k(cx, i, true)),
    def_on(Gfx942, 0x18, "v_fmaak_f32", |cx, i| fma_k(cx, i, false)),
];

/// v_fmamk_f32 (D = S0 * K + S1) and v_fmaak_f32 (D = S0 * S1 + K), fused.
fn fma_k(cx: &mut Cx<'_>, i: &Instr, k_second: bool) -> Step {
    if i.enc != Encoding::Vop2 {
        return Err(bad("v_fmamk/fmaak", "has no VOP3 form"));
    }
    let src = if k_second {
        [i.src[0], LITERAL, i.src[1]]
    } else {
        [i.src[0], i.src[1], LITERAL]
    };
    v3(cx, &Instr { src, ..*i }, |a: f32, b: f32, c: f32| {
        a.mul_add(b, c)
    })
}

/// MUBUF: gfx940's L1/L2 invalidation.
pub static MUBUF: &[OpDef] = &[def_on(Gfx942, 0x29, "buffer_inv", super::smem::invalidate)];

/// VOP1 opcodes new on gfx940.
pub static VOP1: &[OpDef] = &[def_on(Gfx942, 0x38, "v_mov_b64", |cx, i| {
    v1(cx, i, |a: u64| a)
})];

/// VOP3-only opcodes new on gfx940.
pub static VOP3: &[OpDef] = &[def_on(Gfx942, 0x208, "v_lshl_add_u64", |cx, i| {
    // D = (S0 << S1[2:0]) + S2, 64-bit.
    v3(cx, i, |a: u64, s: u32, c: u64| {
        (a << (s & 7)).wrapping_add(c)
    })
})];
