//! DPP (data-parallel primitives: source 0 read from another lane) and SDWA (sub-dword
//! selects of sources and destination) for VOP1/VOP2/VOPC.

use super::super::{bad, Abort};
use super::{lanes, ExtLanes, Kinds, Ops};
use crate::decode::{Dpp, Ext, Instr, Sdwa};
use crate::state::{Wave, LANES};

/// The lane DPP control `ctrl` reads for `lane`, `None` when out of range.
pub fn dpp_source_lane(ctrl: u16, lane: usize) -> Result<Option<usize>, Abort> {
    let (row, idx) = (lane & !15, lane & 15);
    let n = (ctrl & 15) as usize;
    Ok(match ctrl {
        0x000..=0x0ff => Some((lane & !3) | ((ctrl as usize >> ((lane & 3) * 2)) & 3)),
        0x101..=0x10f => (idx + n < 16).then_some(lane + n),
        0x111..=0x11f => (idx >= n).then(|| lane - n),
        0x121..=0x12f => Some(row + ((idx + 16 - n) & 15)),
        0x130 => (lane < 63).then_some(lane + 1),
        0x134 => Some((lane + 1) & 63),
        0x138 => (lane > 0).then(|| lane - 1),
        0x13c => Some((lane + 63) & 63),
        0x140 => Some(row + 15 - idx),
        0x141 => Some((lane & !7) + 7 - (lane & 7)),
        0x142 => (row > 0).then(|| row - 1),
        0x143 => (row >= 32).then_some(31),
        _ => return Err(bad("DPP", "reserved dpp_ctrl value")),
    })
}

/// Copies the sources into `buf` and rewrites them as the DPP or SDWA word says; returns
/// the lanes the instruction writes.
pub fn rewrite(
    w: &Wave,
    i: &Instr,
    kinds: Kinds,
    plain: &Ops<'_>,
    buf: &mut ExtLanes,
) -> Result<u64, Abort> {
    for (n, lanes) in buf.iter_mut().enumerate() {
        if kinds[n].is_some() {
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = plain.raw(n, l);
            }
        }
    }
    match i.ext {
        Ext::Dpp(d) => dpp(w.exec(), plain.active, &d, &mut buf[0]),
        Ext::Sdwa(s) => {
            sdwa_sources(&s, kinds, buf)?;
            Ok(plain.active)
        }
        Ext::None => Ok(plain.active),
    }
}

/// Rewrites source 0 with DPP lanes and narrows the active lanes: lanes outside the row and
/// bank masks are not written; a lane whose source is out of range or inactive reads 0 with
/// bound_ctrl, and is not written without it.
fn dpp(exec: u64, active: u64, d: &Dpp, src0: &mut [u64; LANES]) -> Result<u64, Abort> {
    let src = *src0;
    let mut written = active;
    for l in lanes(active) {
        let enabled = (d.row_mask >> (l / 16)) & 1 != 0 && (d.bank_mask >> ((l & 15) / 4)) & 1 != 0;
        let from = dpp_source_lane(d.ctrl, l)?.filter(|&s| (exec >> s) & 1 != 0);
        match from {
            _ if !enabled => written &= !(1 << l),
            Some(s) => src0[l] = src[s],
            None if d.bound_ctrl => src0[l] = 0,
            None => written &= !(1 << l),
        }
    }
    Ok(written)
}

/// The selected byte, word or dword of `v`, zero- or sign-extended.
pub fn select(v: u32, sel: u8, sext: bool) -> Result<u32, Abort> {
    let (shift, width) = match sel {
        0..=3 => (8 * sel as u32, 8),
        4 | 5 => (16 * (sel as u32 - 4), 16),
        6 => return Ok(v),
        _ => return Err(bad("SDWA", "reserved select value")),
    };
    let x = (v >> shift) & ((1 << width) - 1);
    Ok(if sext && (x >> (width - 1)) & 1 != 0 {
        x | !((1 << width) - 1)
    } else {
        x
    })
}

/// Applies the source selects of an SDWA instruction to sources 0 and 1.
fn sdwa_sources(s: &Sdwa, kinds: Kinds, buf: &mut ExtLanes) -> Result<(), Abort> {
    for (n, lanes) in buf.iter_mut().enumerate() {
        match kinds[n] {
            None => continue,
            Some(k) if k.wide() => return Err(bad("SDWA", "64-bit operands take no SDWA")),
            Some(_) => {}
        }
        for v in lanes.iter_mut() {
            *v = select(*v as u32, s.src_sel[n], s.src_sext[n])? as u64;
        }
    }
    Ok(())
}

/// Writes an SDWA result: the selected part of the destination takes the value; the rest is
/// zeroed, sign-extended or preserved (dst_unused).
pub fn sdwa_write(
    w: &mut Wave,
    r: usize,
    active: u64,
    out: &[u64; LANES],
    s: &Sdwa,
) -> Result<(), Abort> {
    let (shift, width) = match s.dst_sel {
        0..=3 => (8 * s.dst_sel as u32, 8u32),
        4 | 5 => (16 * (s.dst_sel as u32 - 4), 16),
        6 => (0, 32),
        _ => return Err(bad("SDWA", "reserved dst_sel value")),
    };
    let field = if width == 32 {
        u32::MAX
    } else {
        ((1u32 << width) - 1) << shift
    };
    let row = w.v_mut(r);
    for l in lanes(active) {
        let v = ((out[l] as u32) << shift) & field;
        row[l] = match s.dst_unused {
            2 => (row[l] & !field) | v,
            1 if width < 32 => {
                let top = (v >> (shift + width - 1)) & 1;
                let above = if top != 0 {
                    u32::MAX.checked_shl(shift + width).unwrap_or(0)
                } else {
                    0
                };
                v | above
            }
            _ => v,
        };
    }
    Ok(())
}
