//! Instruction formats: which encoding a word starts, its length and its fields.
//!
//! The decoder knows formats, not opcodes: it turns one to three 32-bit words into an [`Instr`]
//! whose operand fields are normalised across encodings (a VOP2 or VOPC instruction names its
//! implicit VCC operands the way its VOP3 form names them explicitly). Which opcodes exist and
//! what they do is the business of the tables in [`crate::exec`].

mod fields;

use std::fmt;

/// Operand code of VCC_LO, the scalar register pair VOP2/VOPC instructions use implicitly.
pub const VCC: u16 = 106;
/// Operand code of the 32-bit literal that follows an instruction.
pub const LITERAL: u16 = 255;
/// Operand code of a DPP-extended VOP1/VOP2/VOPC source 0.
pub const DPP: u16 = 250;
/// Operand code of an SDWA-extended VOP1/VOP2/VOPC source 0.
pub const SDWA: u16 = 249;
/// Operand codes 256..=511 name VGPRs.
pub const VGPR0: u16 = 256;

/// The instruction encodings of GFX9.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Encoding {
    Sop2,
    Sopk,
    Sop1,
    Sopc,
    #[default]
    Sopp,
    Smem,
    Vop2,
    Vop1,
    Vopc,
    Vop3,
    Vop3p,
    Ds,
    Flat,
    Global,
    Scratch,
    Mubuf,
}

impl Encoding {
    /// The name AMD's ISA guides use.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Sop2 => "SOP2",
            Encoding::Sopk => "SOPK",
            Encoding::Sop1 => "SOP1",
            Encoding::Sopc => "SOPC",
            Encoding::Sopp => "SOPP",
            Encoding::Smem => "SMEM",
            Encoding::Vop2 => "VOP2",
            Encoding::Vop1 => "VOP1",
            Encoding::Vopc => "VOPC",
            Encoding::Vop3 => "VOP3",
            Encoding::Vop3p => "VOP3P",
            Encoding::Ds => "DS",
            Encoding::Flat => "FLAT",
            Encoding::Global => "GLOBAL",
            Encoding::Scratch => "SCRATCH",
            Encoding::Mubuf => "MUBUF",
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// DPP controls of a VOP1/VOP2/VOPC instruction (the second word when src0 is 250).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dpp {
    pub ctrl: u16,
    pub bound_ctrl: bool,
    pub bank_mask: u8,
    pub row_mask: u8,
}

/// SDWA selects of a VOP1/VOP2/VOPC instruction (the second word when src0 is 249).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sdwa {
    /// Per source: 0..=3 a byte, 4..=5 a word, 6 the dword.
    pub src_sel: [u8; 2],
    pub src_sext: [bool; 2],
    pub dst_sel: u8,
    /// 0 pad with zeros, 1 sign-extend, 2 preserve the unselected bits.
    pub dst_unused: u8,
}

/// Operand-extension word of a VOP1/VOP2/VOPC instruction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ext {
    #[default]
    None,
    Dpp(Dpp),
    Sdwa(Sdwa),
}

/// One decoded instruction, its fields normalised across encodings.
///
/// Operand codes are the 9-bit source encoding of the ISA: 0..=101 SGPRs, 102.. special
/// registers, 128..=208 inline integers, 240..=248 inline floats, 255 the literal, 256..=511
/// VGPRs. Fields an encoding does not have are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Instr {
    pub enc: Encoding,
    /// The opcode field as encoded (VOP3's ten bits include the VOPC/VOP2/VOP1 promotions).
    pub op: u16,
    /// Length in bytes, literal and extension word included.
    pub len: u8,
    /// Scalar destination (SOP*, SMEM sdata) or VGPR number (VALU, memory vdst).
    pub dst: u16,
    /// Scalar destination of a carry or compare result: VCC for VOP2/VOPC, VOP3b's sdst.
    pub sdst: u16,
    pub src: [u16; 3],
    pub literal: u32,
    /// SOPK/SOPP immediate.
    pub simm16: u16,
    pub abs: u8,
    pub neg: u8,
    pub neg_hi: u8,
    pub op_sel: u8,
    pub op_sel_hi: u8,
    pub clamp: bool,
    pub omod: u8,
    pub ext: Ext,
    /// Memory: immediate offset (sign-extended where the encoding is signed).
    pub offset: i32,
    /// DS: the second offset of the two-address forms.
    pub offset1: u8,
    /// Memory: VGPR address (DS/FLAT addr, MUBUF vaddr).
    pub addr: u8,
    /// Memory: VGPR data (DS data0, FLAT data, MUBUF vdata).
    pub data: u8,
    pub data1: u8,
    /// SMEM sbase, FLAT saddr, MUBUF srsrc: an SGPR number (0x7f: none for FLAT).
    pub sbase: u8,
    /// SMEM soffset, MUBUF soffset: an operand code.
    pub soffset: u16,
    pub flags: MemFlags,
}

/// Single-bit memory controls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemFlags {
    pub glc: bool,
    /// gfx90a's SCC (gfx942's sc1) of FLAT/GLOBAL/SCRATCH and MUBUF: system scope. The bit
    /// is reserved on gfx908, where code leaves it clear.
    pub scc: bool,
    pub slc: bool,
    pub gds: bool,
    pub imm: bool,
    pub soe: bool,
    pub offen: bool,
    pub idxen: bool,
    pub lds: bool,
    /// gfx90a: data registers are AccVGPRs.
    pub acc: bool,
}

/// Why words are not an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// More words are needed: call again with at least `need` words.
    Truncated { need: usize },
    /// The high bits match no GFX9 encoding (VINTRP, EXP, MTBUF and MIMG are graphics formats
    /// this engine does not implement and report the same way).
    UnknownEncoding { word: u32 },
    /// A field holds a value the encoding forbids.
    BadField {
        enc: Encoding,
        field: &'static str,
        value: u32,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { need } => write!(f, "instruction needs {need} words"),
            DecodeError::UnknownEncoding { word } => {
                write!(f, "word {word:#010x} is no GFX9 compute encoding")
            }
            DecodeError::BadField { enc, field, value } => {
                write!(
                    f,
                    "{enc} field {field} holds {value:#x}, which the encoding forbids"
                )
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes the instruction that starts at `words[0]`.
pub fn decode(words: &[u32]) -> Result<Instr, DecodeError> {
    let w0 = *words.first().ok_or(DecodeError::Truncated { need: 1 })?;
    let enc = encoding_of(w0)?;
    let base = base_words(enc);
    let w1 = if base == 2 { word(words, 1)? } else { 0 };
    let mut i = fields::extract(enc, w0, w1)?;
    i.len = (base * 4) as u8;
    attach_trailing_word(&mut i, words, base)?;
    Ok(i)
}

/// The encoding whose fixed high bits `w0` carries.
pub fn encoding_of(w0: u32) -> Result<Encoding, DecodeError> {
    let enc = match w0 >> 23 {
        0x17d => Encoding::Sop1,
        0x17e => Encoding::Sopc,
        0x17f => Encoding::Sopp,
        0x1a7 => Encoding::Vop3p,
        _ => match w0 >> 25 {
            0x3f => Encoding::Vop1,
            0x3e => Encoding::Vopc,
            _ if w0 >> 31 == 0 => Encoding::Vop2,
            _ if w0 >> 28 == 0b1011 => Encoding::Sopk,
            _ if w0 >> 30 == 0b10 => Encoding::Sop2,
            _ => return encoding_of_6bit(w0),
        },
    };
    Ok(enc)
}

fn encoding_of_6bit(w0: u32) -> Result<Encoding, DecodeError> {
    Ok(match w0 >> 26 {
        0b110000 => Encoding::Smem,
        0b110100 => Encoding::Vop3,
        0b110110 => Encoding::Ds,
        0b110111 => match (w0 >> 14) & 3 {
            0 => Encoding::Flat,
            1 => Encoding::Scratch,
            2 => Encoding::Global,
            _ => {
                return Err(DecodeError::BadField {
                    enc: Encoding::Flat,
                    field: "seg",
                    value: 3,
                })
            }
        },
        0b111000 => Encoding::Mubuf,
        _ => return Err(DecodeError::UnknownEncoding { word: w0 }),
    })
}

fn base_words(enc: Encoding) -> usize {
    match enc {
        Encoding::Sop2
        | Encoding::Sopk
        | Encoding::Sop1
        | Encoding::Sopc
        | Encoding::Sopp
        | Encoding::Vop2
        | Encoding::Vop1
        | Encoding::Vopc => 1,
        _ => 2,
    }
}

fn word(words: &[u32], n: usize) -> Result<u32, DecodeError> {
    words
        .get(n)
        .copied()
        .ok_or(DecodeError::Truncated { need: n + 1 })
}

/// Appends the literal or the DPP/SDWA word the fields ask for.
fn attach_trailing_word(i: &mut Instr, words: &[u32], base: usize) -> Result<(), DecodeError> {
    match i.enc {
        Encoding::Vop1 | Encoding::Vop2 | Encoding::Vopc if i.src[0] == DPP => {
            fields::dpp(i, word(words, base)?);
        }
        Encoding::Vop1 | Encoding::Vop2 | Encoding::Vopc if i.src[0] == SDWA => {
            fields::sdwa(i, word(words, base)?);
        }
        Encoding::Vop3 | Encoding::Vop3p if i.src.contains(&LITERAL) => {
            return Err(DecodeError::BadField {
                enc: i.enc,
                field: "src (GFX9 VOP3 takes no literal)",
                value: LITERAL as u32,
            });
        }
        _ if needs_literal(i) => i.literal = word(words, base)?,
        _ => return Ok(()),
    }
    i.len += 4;
    Ok(())
}

/// VOP2's madmk/madak (f32 0x17/0x18, f16 0x24/0x25) and SOPK's s_setreg_imm32_b32 (0x14)
/// carry a literal whatever their sources; elsewhere a source code 255 asks for one.
fn needs_literal(i: &Instr) -> bool {
    match i.enc {
        Encoding::Vop2 if matches!(i.op, 0x17 | 0x18 | 0x24 | 0x25) => true,
        Encoding::Sopk => i.op == 0x14,
        Encoding::Sop2
        | Encoding::Sop1
        | Encoding::Sopc
        | Encoding::Vop2
        | Encoding::Vop1
        | Encoding::Vopc => i.src.contains(&LITERAL),
        _ => false,
    }
}
