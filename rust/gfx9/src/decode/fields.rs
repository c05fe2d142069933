//! Field layouts of each encoding (AMD's MI100/MI200 ISA guides, "Microcode Formats").

use super::{DecodeError, Dpp, Encoding, Ext, Instr, MemFlags, Sdwa, VCC, VGPR0};

fn bits(w: u32, lo: u32, n: u32) -> u32 {
    (w >> lo) & ((1u32 << n) - 1)
}

fn bit(w: u32, b: u32) -> bool {
    (w >> b) & 1 != 0
}

fn sign_extend(v: u32, n: u32) -> i32 {
    ((v << (32 - n)) as i32) >> (32 - n)
}

/// Fields of the first one or two words of an instruction of `enc`.
pub(super) fn extract(enc: Encoding, w0: u32, w1: u32) -> Result<Instr, DecodeError> {
    let mut i = Instr {
        enc,
        ..Instr::default()
    };
    match enc {
        Encoding::Sop2 | Encoding::Sopk | Encoding::Sop1 | Encoding::Sopc | Encoding::Sopp => {
            scalar_alu(&mut i, w0)
        }
        Encoding::Smem => smem(&mut i, w0, w1),
        Encoding::Vop2 | Encoding::Vop1 | Encoding::Vopc => vop_short(&mut i, w0),
        Encoding::Vop3 => vop3(&mut i, w0, w1),
        Encoding::Vop3p => vop3p(&mut i, w0, w1),
        Encoding::Ds => ds(&mut i, w0, w1),
        Encoding::Flat | Encoding::Global | Encoding::Scratch => flat(&mut i, w0, w1),
        Encoding::Mubuf => mubuf(&mut i, w0, w1),
    }
    Ok(i)
}

fn scalar_alu(i: &mut Instr, w: u32) {
    let (ssrc0, ssrc1, sdst, simm) = (bits(w, 0, 8), bits(w, 8, 8), bits(w, 16, 7), bits(w, 0, 16));
    match i.enc {
        Encoding::Sop2 => {
            (i.op, i.dst, i.src) = (
                bits(w, 23, 7) as u16,
                sdst as u16,
                [ssrc0 as u16, ssrc1 as u16, 0],
            );
        }
        Encoding::Sop1 => (i.op, i.dst, i.src[0]) = (ssrc1 as u16, sdst as u16, ssrc0 as u16),
        Encoding::Sopc => (i.op, i.src) = (sdst as u16, [ssrc0 as u16, ssrc1 as u16, 0]),
        Encoding::Sopk => {
            (i.op, i.dst, i.simm16) = (bits(w, 23, 5) as u16, sdst as u16, simm as u16)
        }
        _ => (i.op, i.simm16) = (sdst as u16, simm as u16),
    }
}

fn smem(i: &mut Instr, w0: u32, w1: u32) {
    i.sbase = (bits(w0, 0, 6) * 2) as u8;
    i.dst = bits(w0, 6, 7) as u16;
    i.op = bits(w0, 18, 8) as u16;
    i.flags = MemFlags {
        soe: bit(w0, 14),
        glc: bit(w0, 16),
        imm: bit(w0, 17),
        ..MemFlags::default()
    };
    i.offset = bits(w1, 0, 21) as i32;
    i.soffset = bits(w1, 25, 7) as u16;
}

fn vop_short(i: &mut Instr, w: u32) {
    let src0 = bits(w, 0, 9) as u16;
    let vsrc1 = VGPR0 + bits(w, 9, 8) as u16;
    match i.enc {
        Encoding::Vop2 => {
            i.op = bits(w, 25, 6) as u16;
            i.dst = bits(w, 17, 8) as u16;
            i.src = [src0, vsrc1, VCC];
            i.sdst = VCC;
        }
        Encoding::Vop1 => {
            i.op = bits(w, 9, 8) as u16;
            i.dst = bits(w, 17, 8) as u16;
            i.src[0] = src0;
        }
        _ => {
            i.op = bits(w, 17, 8) as u16;
            i.src = [src0, vsrc1, 0];
            i.sdst = VCC;
        }
    }
}

/// VOP3a and VOP3b share a layout except bits 8..15: abs and op_sel, or the scalar carry
/// destination. Which one applies is the opcode's business; both readings are kept.
fn vop3(i: &mut Instr, w0: u32, w1: u32) {
    i.op = bits(w0, 16, 10) as u16;
    i.dst = bits(w0, 0, 8) as u16;
    i.abs = bits(w0, 8, 3) as u8;
    i.op_sel = bits(w0, 11, 4) as u8;
    i.sdst = bits(w0, 8, 7) as u16;
    i.clamp = bit(w0, 15);
    vop3_sources(i, w1);
}

fn vop3_sources(i: &mut Instr, w1: u32) {
    i.src = [
        bits(w1, 0, 9) as u16,
        bits(w1, 9, 9) as u16,
        bits(w1, 18, 9) as u16,
    ];
    i.omod = bits(w1, 27, 2) as u8;
    i.neg = bits(w1, 29, 3) as u8;
}

fn vop3p(i: &mut Instr, w0: u32, w1: u32) {
    i.op = bits(w0, 16, 7) as u16;
    i.dst = bits(w0, 0, 8) as u16;
    i.neg_hi = bits(w0, 8, 3) as u8;
    i.op_sel = bits(w0, 11, 3) as u8;
    i.op_sel_hi = (bits(w1, 27, 2) | (bits(w0, 14, 1) << 2)) as u8;
    i.clamp = bit(w0, 15);
    i.src = [
        bits(w1, 0, 9) as u16,
        bits(w1, 9, 9) as u16,
        bits(w1, 18, 9) as u16,
    ];
    i.neg = bits(w1, 29, 3) as u8;
}

fn ds(i: &mut Instr, w0: u32, w1: u32) {
    i.offset = bits(w0, 0, 8) as i32;
    i.offset1 = bits(w0, 8, 8) as u8;
    i.op = bits(w0, 17, 8) as u16;
    i.flags.gds = bit(w0, 16);
    i.flags.acc = bit(w0, 25);
    i.addr = bits(w1, 0, 8) as u8;
    i.data = bits(w1, 8, 8) as u8;
    i.data1 = bits(w1, 16, 8) as u8;
    i.dst = bits(w1, 24, 8) as u16;
}

/// FLAT's offset is 12 bits unsigned; GLOBAL's and SCRATCH's 13 bits signed.
fn flat(i: &mut Instr, w0: u32, w1: u32) {
    i.offset = match i.enc {
        Encoding::Flat => bits(w0, 0, 12) as i32,
        _ => sign_extend(bits(w0, 0, 13), 13),
    };
    i.flags.lds = bit(w0, 13);
    i.flags.glc = bit(w0, 16);
    i.flags.slc = bit(w0, 17);
    i.flags.scc = bit(w0, 25);
    i.op = bits(w0, 18, 7) as u16;
    i.addr = bits(w1, 0, 8) as u8;
    i.data = bits(w1, 8, 8) as u8;
    i.sbase = bits(w1, 16, 7) as u8;
    i.flags.acc = bit(w1, 23);
    i.dst = bits(w1, 24, 8) as u16;
}

fn mubuf(i: &mut Instr, w0: u32, w1: u32) {
    i.offset = bits(w0, 0, 12) as i32;
    i.flags.offen = bit(w0, 12);
    i.flags.idxen = bit(w0, 13);
    i.flags.glc = bit(w0, 14);
    i.flags.scc = bit(w0, 15);
    i.flags.lds = bit(w0, 16);
    i.flags.slc = bit(w0, 17);
    i.op = bits(w0, 18, 7) as u16;
    i.addr = bits(w1, 0, 8) as u8;
    i.data = bits(w1, 8, 8) as u8;
    // VDATA is the store source, the load destination and the atomic's data and return.
    i.dst = i.data as u16;
    i.sbase = (bits(w1, 16, 5) * 4) as u8;
    i.flags.acc = bit(w1, 23);
    i.soffset = bits(w1, 24, 8) as u16;
}

/// DPP word: src0 VGPR, control, bound_ctrl, source modifiers, bank and row masks.
pub(super) fn dpp(i: &mut Instr, w: u32) {
    i.src[0] = VGPR0 + bits(w, 0, 8) as u16;
    i.neg = (bit(w, 20) as u8) | ((bit(w, 22) as u8) << 1);
    i.abs = (bit(w, 21) as u8) | ((bit(w, 23) as u8) << 1);
    i.ext = Ext::Dpp(Dpp {
        ctrl: bits(w, 8, 9) as u16,
        bound_ctrl: bit(w, 19),
        bank_mask: bits(w, 24, 4) as u8,
        row_mask: bits(w, 28, 4) as u8,
    });
}

/// SDWA word (GFX9): sources may be SGPRs (the S bits); VOPC's form may name a scalar
/// destination in place of dst_sel/dst_unused/clamp/omod.
pub(super) fn sdwa(i: &mut Instr, w: u32) {
    let reg = |v: u32, sgpr: bool| if sgpr { v as u16 } else { VGPR0 + v as u16 };
    i.src[0] = reg(bits(w, 0, 8), bit(w, 23));
    if i.enc == Encoding::Vop2 || i.enc == Encoding::Vopc {
        i.src[1] = reg(i.src[1] as u32 - VGPR0 as u32, bit(w, 31));
    }
    i.neg = (bit(w, 20) as u8) | ((bit(w, 28) as u8) << 1);
    i.abs = (bit(w, 21) as u8) | ((bit(w, 29) as u8) << 1);
    let mut s = Sdwa {
        src_sel: [bits(w, 16, 3) as u8, bits(w, 24, 3) as u8],
        src_sext: [bit(w, 19), bit(w, 27)],
        dst_sel: 6,
        dst_unused: 0,
    };
    if i.enc == Encoding::Vopc {
        if bit(w, 15) {
            i.sdst = bits(w, 8, 7) as u16;
        }
    } else {
        s.dst_sel = bits(w, 8, 3) as u8;
        s.dst_unused = bits(w, 11, 2) as u8;
        i.clamp = bit(w, 13);
        i.omod = bits(w, 14, 2) as u8;
    }
    i.ext = Ext::Sdwa(s);
}
