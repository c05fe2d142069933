//! The opcode tables: which opcodes of each encoding this engine runs, on which target.

use std::sync::OnceLock;

use crate::decode::{Encoding, Instr};
use crate::state::Target;

pub use super::opdef::OpDef;

/// Whether `d` exists on `t`: gfx908 and gfx90a by their tables; gfx942 has gfx90a's
/// entries less those `exec/gfx942.rs` names as dropped or renamed, and its own.
pub fn on_target(d: &OpDef, t: Target) -> bool {
    match (t, d.only) {
        (_, Some(o)) if o == t => true,
        (Target::Gfx942, None | Some(Target::Gfx90a)) => !super::gfx942::dropped(d.name),
        (_, only) => only.is_none(),
    }
}

const FAMILIES: [Encoding; 15] = [
    Encoding::Sop2,
    Encoding::Sopk,
    Encoding::Sop1,
    Encoding::Sopc,
    Encoding::Sopp,
    Encoding::Smem,
    Encoding::Vop2,
    Encoding::Vop1,
    Encoding::Vopc,
    Encoding::Vop3,
    Encoding::Vop3p,
    Encoding::Ds,
    Encoding::Flat,
    Encoding::Global,
    Encoding::Mubuf,
];

/// The table of an encoding (SCRATCH shares GLOBAL's opcode space and functions; VOP3's
/// table holds only the VOP3-only opcodes, the promoted ones come from VOP1/VOP2/VOPC).
pub fn opcodes(enc: Encoding) -> &'static [&'static [OpDef]] {
    match enc {
        Encoding::Vopc => super::vop::VOPC,
        Encoding::Ds => super::ds::DS,
        Encoding::Vop3p => VOP3P,
        Encoding::Vop2 => VOP2,
        Encoding::Vop1 => VOP1,
        Encoding::Vop3 => VOP3,
        Encoding::Mubuf => MUBUF,
        other => std::slice::from_ref(single(other)),
    }
}

fn single(enc: Encoding) -> &'static &'static [OpDef] {
    match enc {
        Encoding::Sop2 => &super::salu::SOP2,
        Encoding::Sopk => &super::salu::SOPK,
        Encoding::Sop1 => &super::salu::SOP1,
        Encoding::Sopc => &super::salu::SOPC,
        Encoding::Sopp => &super::sopp::SOPP,
        Encoding::Smem => &super::smem::SMEM,
        Encoding::Flat => &super::flat::FLAT,
        Encoding::Global | Encoding::Scratch => &super::flat::GLOBAL,
        Encoding::Vopc
        | Encoding::Ds
        | Encoding::Vop3p
        | Encoding::Vop2
        | Encoding::Vop1
        | Encoding::Vop3
        | Encoding::Mubuf => &EMPTY,
    }
}

static EMPTY: &[OpDef] = &[];

/// VOP3P: packed math, dot products and mixed-precision FMA, and the matrix (MAI) opcodes.
static VOP3P: &[&[OpDef]] = &[
    super::vop::VOP3P,
    super::dot::VOP3P_DOT,
    super::mfma::MFMA,
    super::mfma::MFMA_GFX942,
    super::mfma::MFMA_GFX942_NEW,
];
/// VOP1 and VOP3, with gfx942's additions (its fp8/bf8 conversions in `fp8.rs`).
static VOP1: &[&[OpDef]] = &[super::vop::VOP1, super::gfx942::VOP1, super::fp8::VOP1];
static VOP3: &[&[OpDef]] = &[super::vop::VOP3, super::gfx942::VOP3, super::fp8::VOP3];
/// VOP2, with the accumulating dot products.
static VOP2: &[&[OpDef]] = &[super::vop::VOP2, super::dot::VOP2_DOT, super::gfx942::VOP2];
static MUBUF: &[&[OpDef]] = &[super::mubuf::MUBUF, super::gfx942::MUBUF];

/// Dense opcode → table entry per encoding, for one target.
struct Index {
    by_enc: Vec<Vec<Option<&'static OpDef>>>,
}

fn family(enc: Encoding) -> usize {
    let enc = if enc == Encoding::Scratch {
        Encoding::Global
    } else {
        enc
    };
    FAMILIES.iter().position(|e| *e == enc).unwrap_or(0)
}

impl Index {
    fn build(t: Target) -> Index {
        let by_enc = FAMILIES
            .iter()
            .map(|&enc| {
                let mut v = vec![None; 1024];
                for d in opcodes(enc).iter().flat_map(|s| s.iter()) {
                    if on_target(d, t) {
                        v[d.op as usize] = Some(d);
                    }
                }
                v
            })
            .collect();
        Index { by_enc }
    }

    fn get(&self, enc: Encoding, op: u16) -> Option<&'static OpDef> {
        *self.by_enc[family(enc)].get(op as usize)?
    }
}

fn index(t: Target) -> &'static Index {
    static GFX908: OnceLock<Index> = OnceLock::new();
    static GFX90A: OnceLock<Index> = OnceLock::new();
    static GFX942: OnceLock<Index> = OnceLock::new();
    match t {
        Target::Gfx908 => GFX908.get_or_init(|| Index::build(t)),
        Target::Gfx90a => GFX90A.get_or_init(|| Index::build(t)),
        Target::Gfx942 => GFX942.get_or_init(|| Index::build(t)),
    }
}

/// The table entry that runs `i` on `t`. VOP3 opcodes below 0x1c0 are the VOP3 forms of
/// VOPC (0x000), VOP2 (0x100) and VOP1 (0x140) opcodes.
pub fn lookup(t: Target, i: &Instr) -> Option<&'static OpDef> {
    let idx = index(t);
    match (i.enc, i.op) {
        (Encoding::Vop3, op @ 0..0x100) => idx.get(Encoding::Vopc, op),
        (Encoding::Vop3, op @ 0x100..0x140) => idx.get(Encoding::Vop2, op - 0x100),
        (Encoding::Vop3, op @ 0x140..0x1c0) => idx.get(Encoding::Vop1, op - 0x140),
        (Encoding::Scratch, 0x40..) => None,
        (enc, op) => idx.get(enc, op),
    }
}
