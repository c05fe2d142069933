//! Per-lane memory access shared by FLAT/GLOBAL/SCRATCH and MUBUF: where each lane's
//! access goes, how loaded bytes land in VGPRs and stores gather them.

use super::valu::lanes;
use super::{bad, Abort, Cx, Flow, Step};
use crate::decode::Instr;
use crate::memory::{AtomicOp, Fault, Lanes};
use crate::state::LANES;

/// Where one lane's access goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// A GPU virtual address.
    Va(u64),
    /// A byte offset in the workgroup's LDS (flat accesses to the shared aperture).
    Lds(u32),
    /// A byte offset in lane `lane`'s private (scratch) memory, which is swizzled per dword:
    /// each dword of a wider access has its own address ([`Memory::private_address`]).
    ///
    /// [`Memory::private_address`]: crate::memory::Memory::private_address
    Private { lane: u8, offset: u32 },
    /// Out of a buffer's range: loads read zero, stores and atomics are dropped.
    Dropped,
}

/// How loaded bytes land in the destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fmt {
    pub bytes: usize,
    pub sext: bool,
    /// `Some(hi)`: a 16-bit result written into one half, the other kept (the d16 forms).
    pub d16: Option<bool>,
}

pub const fn dwords(n: usize) -> Fmt {
    Fmt {
        bytes: 4 * n,
        sext: false,
        d16: None,
    }
}

pub const fn narrow(bytes: usize, sext: bool) -> Fmt {
    Fmt {
        bytes,
        sext,
        d16: None,
    }
}

pub const fn d16(bytes: usize, sext: bool, hi: bool) -> Fmt {
    Fmt {
        bytes,
        sext,
        d16: Some(hi),
    }
}

fn regs(bytes: usize) -> usize {
    bytes.div_ceil(4)
}

/// The piece of a private access of `len` bytes at `offset` that starts `at` bytes into it,
/// up to the next dword boundary: its address and length.
fn private_piece(cx: &Cx<'_>, lane: u8, offset: u32, at: usize, len: usize) -> (u64, usize) {
    let o = offset.wrapping_add(at as u32);
    let n = (4 - (o % 4) as usize).min(len - at);
    let fs = cx.w.flat_scratch();
    (cx.mem.private_address(fs, lane as usize, o), n)
}

/// Reads one lane's bytes; `fresh`: past the wave's caches (GLC).
fn read_loc(cx: &mut Cx<'_>, loc: Loc, buf: &mut [u8], fresh: bool) -> Result<(), Abort> {
    match loc {
        Loc::Va(a) => read_va(cx, a, buf, fresh)?,
        Loc::Lds(o) => super::ds::lds_read(cx.lds, o, buf),
        Loc::Private { lane, offset } => {
            let mut at = 0;
            while at < buf.len() {
                let (a, n) = private_piece(cx, lane, offset, at, buf.len());
                cx.mem.read(a, &mut buf[at..at + n])?;
                at += n;
            }
        }
        Loc::Dropped => buf.fill(0),
    }
    Ok(())
}

fn write_loc(cx: &mut Cx<'_>, loc: Loc, data: &[u8]) -> Result<(), Abort> {
    match loc {
        Loc::Va(a) => cx.mem.write(a, data)?,
        Loc::Lds(o) => super::ds::lds_write(cx.lds, o, data),
        Loc::Private { lane, offset } => {
            let mut at = 0;
            while at < data.len() {
                let (a, n) = private_piece(cx, lane, offset, at, data.len());
                cx.mem.write(a, &data[at..at + n])?;
                at += n;
            }
        }
        Loc::Dropped => {}
    }
    Ok(())
}

fn check_tuple(r: usize, n: usize, name: &'static str) -> Result<(), Abort> {
    if r + n > 256 {
        return Err(bad(name, "VGPR tuple runs past v255"));
    }
    Ok(())
}

/// Extends a narrow little-endian value as `f` says.
fn extend(buf: &[u8], f: Fmt) -> u32 {
    let mut w = [0u8; 4];
    w[..f.bytes.min(4)].copy_from_slice(&buf[..f.bytes.min(4)]);
    let v = u32::from_le_bytes(w);
    match (f.bytes, f.sext) {
        (1, true) => v as u8 as i8 as i32 as u32,
        (2, true) => v as u16 as i16 as i32 as u32,
        _ => v,
    }
}

/// Where each active lane's access goes (inactive lanes: [`Loc::Dropped`]), computed once
/// per instruction. A lane's location depends on its own address registers only, which no
/// other lane's access writes, so computing them ahead is what the lane-by-lane order gives.
fn locate(
    cx: &Cx<'_>,
    loc: &impl Fn(&Cx<'_>, usize) -> Result<Loc, Abort>,
) -> Result<[Loc; LANES], Abort> {
    let mut at = [Loc::Dropped; LANES];
    for l in lanes(cx.w.exec()) {
        at[l] = loc(cx, l)?;
    }
    Ok(at)
}

/// The base address when all 64 lanes are active and lane `l` reaches global memory at
/// `base + l * bytes`: one access then serves the wave, as the hardware coalesces it (a
/// fault names the same first address the lane-by-lane order would).
fn coalesced(cx: &Cx<'_>, bytes: usize, at: &[Loc; LANES]) -> Option<u64> {
    if cx.w.exec() != u64::MAX {
        return None;
    }
    let Loc::Va(base) = at[0] else {
        return None;
    };
    let mut next = base;
    for a in at {
        if *a != Loc::Va(next) {
            return None;
        }
        next = next.wrapping_add(bytes as u64);
    }
    Some(base)
}

/// Puts the loaded bytes of all 64 lanes (`bytes` per lane, consecutive) into their
/// destination registers.
fn place_all(cx: &mut Cx<'_>, i: &Instr, f: Fmt, all: &[u8]) {
    if f.d16.is_some() || !f.bytes.is_multiple_of(4) {
        for (l, lane) in all.chunks_exact(f.bytes).take(LANES).enumerate() {
            place(cx, i, f, l, lane);
        }
        return;
    }
    let (r, acc) = (i.dst as usize, i.flags.acc);
    for k in 0..f.bytes / 4 {
        let row = cx.w.row_mut(acc, r + k);
        for (d, lane) in row.iter_mut().zip(all.chunks_exact(f.bytes)) {
            *d = dword(&lane[4 * k..]);
        }
    }
}

/// The little-endian dword at the start of `b`.
#[inline(always)]
fn dword(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Puts one lane's loaded bytes into its destination registers.
fn place(cx: &mut Cx<'_>, i: &Instr, f: Fmt, l: usize, buf: &[u8]) {
    let (r, acc) = (i.dst as usize, i.flags.acc);
    if let Some(hi) = f.d16 {
        let v = extend(buf, f) & 0xffff;
        let old = cx.w.row(acc, r)[l];
        cx.w.row_mut(acc, r)[l] = if hi {
            (old & 0xffff) | v << 16
        } else {
            (old & 0xffff_0000) | v
        };
    } else if f.bytes < 4 {
        cx.w.row_mut(acc, r)[l] = extend(buf, f);
    } else {
        for (k, d) in buf.chunks_exact(4).enumerate() {
            cx.w.row_mut(acc, r + k)[l] = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
        }
    }
}

fn read_va(cx: &mut Cx<'_>, a: u64, buf: &mut [u8], fresh: bool) -> Result<(), Fault> {
    if fresh {
        cx.mem.read_fresh(a, buf)
    } else {
        cx.mem.read(a, buf)
    }
}

/// The lanes' VAs when every active lane reaches global memory (not LDS, scratch, or out
/// of a buffer's range): one [`Memory`] call then serves them all.
///
/// [`Memory`]: crate::memory::Memory
fn vas(at: &[Loc; LANES], mask: u64) -> Option<[u64; LANES]> {
    let mut va = [0u64; LANES];
    for l in lanes(mask) {
        let Loc::Va(a) = at[l] else {
            return None;
        };
        va[l] = a;
    }
    Some(va)
}

/// Puts the loaded bytes of the lanes of `mask` (`f.bytes` per lane, lane `l` at
/// `l * f.bytes`) into their destination registers.
fn place_lanes(cx: &mut Cx<'_>, i: &Instr, f: Fmt, mask: u64, all: &[u8]) {
    if f.d16.is_some() || !f.bytes.is_multiple_of(4) {
        for l in lanes(mask) {
            place(cx, i, f, l, &all[l * f.bytes..(l + 1) * f.bytes]);
        }
        return;
    }
    let (r, acc) = (i.dst as usize, i.flags.acc);
    for k in 0..f.bytes / 4 {
        let row = cx.w.row_mut(acc, r + k);
        for l in lanes(mask) {
            row[l] = dword(&all[l * f.bytes + 4 * k..]);
        }
    }
}

/// Loads `f` per active lane into `i.dst` (VGPRs or AccVGPRs).
pub fn load(
    cx: &mut Cx<'_>,
    i: &Instr,
    f: Fmt,
    loc: impl Fn(&Cx<'_>, usize) -> Result<Loc, Abort>,
) -> Step {
    check_tuple(i.dst as usize, regs(f.bytes), "vector load")?;
    let at = locate(cx, &loc)?;
    // GLC (agent scope) and SCC (system scope: another agent's write must be seen) both
    // read past what the memory read ahead.
    let (mask, fresh) = (cx.w.exec(), i.flags.glc || i.flags.scc);
    let mut all = [0u8; 16 * LANES];
    let all = &mut all[..f.bytes * LANES];
    if let Some(base) = coalesced(cx, f.bytes, &at) {
        read_va(cx, base, all, fresh)?;
        place_all(cx, i, f, all);
        return Ok(Flow::Next);
    }
    if let Some(addrs) = vas(&at, mask) {
        let lanes = Lanes {
            addrs: &addrs,
            mask,
            bytes: f.bytes,
        };
        cx.mem.read_lanes(&lanes, fresh, all)?;
        place_lanes(cx, i, f, mask, all);
        return Ok(Flow::Next);
    }
    let mut buf = [0u8; 16];
    for l in lanes(mask) {
        read_loc(cx, at[l], &mut buf[..f.bytes], fresh)?;
        place(cx, i, f, l, &buf[..f.bytes]);
    }
    Ok(Flow::Next)
}

/// One lane's store bytes (`hi`: the high half of the d16_hi forms).
fn gather_store(cx: &Cx<'_>, i: &Instr, bytes: usize, hi: bool, l: usize, buf: &mut [u8]) {
    let (r, acc) = (i.data as usize, i.flags.acc);
    for k in 0..regs(bytes) {
        let v = cx.w.row(acc, r + k)[l];
        let v = if hi { v >> 16 } else { v };
        let n = (bytes - 4 * k).min(4);
        buf[4 * k..4 * k + n].copy_from_slice(&v.to_le_bytes()[..n]);
    }
}

/// The store bytes of all 64 lanes, consecutive.
fn gather_all(cx: &Cx<'_>, i: &Instr, bytes: usize, hi: bool, all: &mut [u8]) {
    if hi || !bytes.is_multiple_of(4) {
        for (l, lane) in all.chunks_exact_mut(bytes).take(LANES).enumerate() {
            gather_store(cx, i, bytes, hi, l, lane);
        }
        return;
    }
    let (r, acc) = (i.data as usize, i.flags.acc);
    for k in 0..bytes / 4 {
        let row = cx.w.row(acc, r + k);
        for (lane, v) in all.chunks_exact_mut(bytes).zip(row) {
            lane[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Stores `bytes` from `i.data` per active lane (`hi`: the high half of the d16_hi forms).
pub fn store(
    cx: &mut Cx<'_>,
    i: &Instr,
    bytes: usize,
    hi: bool,
    loc: impl Fn(&Cx<'_>, usize) -> Result<Loc, Abort>,
) -> Step {
    check_tuple(i.data as usize, regs(bytes), "vector store")?;
    let at = locate(cx, &loc)?;
    let mask = cx.w.exec();
    if let Some(base) = coalesced(cx, bytes, &at) {
        let mut all = [0u8; 16 * LANES];
        gather_all(cx, i, bytes, hi, &mut all[..bytes * LANES]);
        cx.mem.write(base, &all[..bytes * LANES])?;
        return Ok(Flow::Next);
    }
    if let Some(addrs) = vas(&at, mask) {
        let mut all = [0u8; 16 * LANES];
        gather_all(cx, i, bytes, hi, &mut all[..bytes * LANES]);
        let lanes = Lanes {
            addrs: &addrs,
            mask,
            bytes,
        };
        cx.mem.write_lanes(&lanes, &all[..bytes * LANES])?;
        return Ok(Flow::Next);
    }
    let mut buf = [0u8; 16];
    for l in lanes(mask) {
        gather_store(cx, i, bytes, hi, l, &mut buf[..bytes]);
        write_loc(cx, at[l], &buf[..bytes])?;
    }
    Ok(Flow::Next)
}

/// An atomic of `size` bytes per active lane: source (and compare, for cmpswap, in the
/// registers after it) from `i.data`; the old value into `i.dst` when `ret`.
pub fn atomic(
    cx: &mut Cx<'_>,
    i: &Instr,
    size: usize,
    op: AtomicOp,
    ret: bool,
    loc: impl Fn(&Cx<'_>, usize) -> Result<Loc, Abort>,
) -> Step {
    let n = size / 4;
    let (d, acc) = (i.data as usize, i.flags.acc);
    let srcs = if op == AtomicOp::CmpSwap { 2 * n } else { n };
    check_tuple(d, srcs, "vector atomic")?;
    if ret {
        check_tuple(i.dst as usize, n, "vector atomic")?;
    }
    let at = locate(cx, &loc)?;
    for l in lanes(cx.w.exec()) {
        let get = |k: usize| -> u64 {
            let lo = cx.w.row(acc, d + k)[l] as u64;
            if n == 2 {
                lo | (cx.w.row(acc, d + k + 1)[l] as u64) << 32
            } else {
                lo
            }
        };
        let (src, cmp) = (get(0), if op == AtomicOp::CmpSwap { get(n) } else { 0 });
        let old = match at[l] {
            Loc::Va(a) => cx.mem.atomic(a, size, op, src, cmp)?,
            Loc::Lds(o) => super::ds::lds_atomic(cx.lds, o, size, op, src, cmp),
            // A lane's private memory is its own: read, apply, write back.
            at @ Loc::Private { .. } => {
                let mut b = [0u8; 8];
                read_loc(cx, at, &mut b[..size], true)?;
                let old = u64::from_le_bytes(b);
                let new = op.apply(size, old, src, cmp).to_le_bytes();
                write_loc(cx, at, &new[..size])?;
                old
            }
            Loc::Dropped => 0,
        };
        if ret {
            let r = i.dst as usize;
            cx.w.row_mut(acc, r)[l] = old as u32;
            if n == 2 {
                cx.w.row_mut(acc, r + 1)[l] = (old >> 32) as u32;
            }
        }
    }
    Ok(Flow::Next)
}
