//! DS: LDS reads, writes, atomics and the cross-lane permutes.
//!
//! Out-of-range LDS addresses behave as on the hardware: reads return zero, writes and
//! atomics are dropped.

use super::opdef::{def, def_on, OpDef};
use super::valu::lanes;
use super::{bad, Cx, Flow, Step};
use crate::decode::Instr;
use crate::memory::AtomicOp;
use crate::state::{Target, LANES};

pub fn lds_read(lds: &[u8], at: u32, buf: &mut [u8]) {
    let a = at as usize;
    match lds.get(a..a + buf.len()) {
        Some(src) => buf.copy_from_slice(src),
        None => buf.fill(0),
    }
}

pub fn lds_write(lds: &mut [u8], at: u32, data: &[u8]) {
    let a = at as usize;
    if let Some(dst) = lds.get_mut(a..a + data.len()) {
        dst.copy_from_slice(data);
    }
}

pub fn lds_atomic(lds: &mut [u8], at: u32, size: usize, op: AtomicOp, src: u64, cmp: u64) -> u64 {
    let mut b = [0u8; 8];
    lds_read(lds, at, &mut b[..size]);
    let old = u64::from_le_bytes(b);
    lds_write(
        lds,
        at,
        &op.apply(size, old, src, cmp).to_le_bytes()[..size],
    );
    old
}

fn check(r: usize, n: usize) -> Result<(), super::Abort> {
    if r + n > 256 {
        return Err(bad("DS", "VGPR tuple runs past v255"));
    }
    Ok(())
}

/// The 16-bit offset of the one-address forms.
fn offset16(i: &Instr) -> u32 {
    i.offset as u32 | (i.offset1 as u32) << 8
}

fn addr(cx: &Cx<'_>, i: &Instr, l: usize) -> u32 {
    cx.w.v(i.addr as usize)[l]
}

fn gather(cx: &Cx<'_>, r: usize, n: usize, l: usize, buf: &mut [u8]) {
    for k in 0..n {
        buf[4 * k..4 * k + 4].copy_from_slice(&cx.w.v(r + k)[l].to_le_bytes());
    }
}

fn scatter(cx: &mut Cx<'_>, r: usize, n: usize, l: usize, buf: &[u8]) {
    for k in 0..n {
        cx.w.v_mut(r + k)[l] =
            u32::from_le_bytes([buf[4 * k], buf[4 * k + 1], buf[4 * k + 2], buf[4 * k + 3]]);
    }
}

/// ds_read_*: `bytes` per lane, sign- or zero-extended below a dword.
fn read(cx: &mut Cx<'_>, i: &Instr, bytes: usize, sext: bool) -> Step {
    let n = bytes.div_ceil(4);
    check(i.dst as usize, n)?;
    for l in lanes(cx.w.exec()) {
        let mut buf = [0u8; 16];
        lds_read(
            cx.lds,
            addr(cx, i, l).wrapping_add(offset16(i)),
            &mut buf[..bytes],
        );
        if bytes < 4 && sext {
            let v = if bytes == 1 {
                buf[0] as i8 as i32
            } else {
                i16::from_le_bytes([buf[0], buf[1]]) as i32
            };
            buf[..4].copy_from_slice(&v.to_le_bytes());
        }
        scatter(cx, i.dst as usize, n, l, &buf);
    }
    Ok(Flow::Next)
}

fn write(cx: &mut Cx<'_>, i: &Instr, bytes: usize) -> Step {
    let n = bytes.div_ceil(4);
    check(i.data as usize, n)?;
    for l in lanes(cx.w.exec()) {
        let mut buf = [0u8; 16];
        gather(cx, i.data as usize, n, l, &mut buf);
        let at = addr(cx, i, l).wrapping_add(offset16(i));
        lds_write(cx.lds, at, &buf[..bytes]);
    }
    Ok(Flow::Next)
}

/// ds_read2*/ds_write2*: two elements of `size` at offset0 and offset1 times `size * stride`.
fn two_addresses(cx: &Cx<'_>, i: &Instr, l: usize, size: usize, stride: u32) -> [u32; 2] {
    let base = addr(cx, i, l);
    let unit = size as u32 * stride;
    [
        base.wrapping_add(i.offset as u32 * unit),
        base.wrapping_add(i.offset1 as u32 * unit),
    ]
}

fn read2(cx: &mut Cx<'_>, i: &Instr, size: usize, stride: u32) -> Step {
    let n = size / 4;
    check(i.dst as usize, 2 * n)?;
    for l in lanes(cx.w.exec()) {
        let mut buf = [0u8; 16];
        let [a0, a1] = two_addresses(cx, i, l, size, stride);
        lds_read(cx.lds, a0, &mut buf[..size]);
        lds_read(cx.lds, a1, &mut buf[size..2 * size]);
        scatter(cx, i.dst as usize, 2 * n, l, &buf);
    }
    Ok(Flow::Next)
}

fn write2(cx: &mut Cx<'_>, i: &Instr, size: usize, stride: u32) -> Step {
    let n = size / 4;
    check(i.data as usize, n)?;
    check(i.data1 as usize, n)?;
    for l in lanes(cx.w.exec()) {
        let (mut b0, mut b1) = ([0u8; 8], [0u8; 8]);
        gather(cx, i.data as usize, n, l, &mut b0);
        gather(cx, i.data1 as usize, n, l, &mut b1);
        let [a0, a1] = two_addresses(cx, i, l, size, stride);
        lds_write(cx.lds, a0, &b0[..size]);
        lds_write(cx.lds, a1, &b1[..size]);
    }
    Ok(Flow::Next)
}

/// DS atomics: source data0, compare data0 / source data1 for cmpst (DS's order).
fn atomic(cx: &mut Cx<'_>, i: &Instr, size: usize, op: AtomicOp, ret: bool) -> Step {
    let n = size / 4;
    let val = |cx: &Cx<'_>, r: u8, l: usize| -> u64 {
        let lo = cx.w.v(r as usize)[l] as u64;
        if n == 2 {
            lo | (cx.w.v(r as usize + 1)[l] as u64) << 32
        } else {
            lo
        }
    };
    check(i.data as usize, n)?;
    check(i.data1 as usize, n)?;
    if ret {
        check(i.dst as usize, n)?;
    }
    for l in lanes(cx.w.exec()) {
        let (src, cmp) = match op {
            AtomicOp::CmpSwap => (val(cx, i.data1, l), val(cx, i.data, l)),
            _ => (val(cx, i.data, l), 0),
        };
        let at = addr(cx, i, l).wrapping_add(offset16(i));
        let old = lds_atomic(cx.lds, at, size, op, src, cmp);
        if ret {
            scatter(cx, i.dst as usize, n, l, &old.to_le_bytes());
        }
    }
    Ok(Flow::Next)
}

/// ds_permute_b32 (push: lane l's data goes to lane addr/4) and ds_bpermute_b32 (pull).
fn permute(cx: &mut Cx<'_>, i: &Instr, push: bool) -> Step {
    check(i.dst as usize, 1)?;
    let exec = cx.w.exec();
    let data = *cx.w.v(i.data as usize);
    let mut out = *cx.w.v(i.dst as usize);
    if push {
        out = [0; LANES];
    }
    for l in lanes(exec) {
        let k = ((addr(cx, i, l).wrapping_add(offset16(i)) / 4) & 63) as usize;
        if push {
            out[k] = data[l];
        } else {
            out[l] = data[k];
        }
    }
    let dst = cx.w.v_mut(i.dst as usize);
    for l in lanes(exec) {
        dst[l] = out[l];
    }
    Ok(Flow::Next)
}

/// ds_swizzle_b32: the offset selects quad-permute mode (bit 15) or the and/or/xor masks
/// of a lane id within 32 lanes.
fn swizzle(cx: &mut Cx<'_>, i: &Instr) -> Step {
    check(i.dst as usize, 1)?;
    let off = offset16(i) as usize;
    let exec = cx.w.exec();
    let data = *cx.w.v(i.data as usize);
    let src = |l: usize| -> usize {
        if off & 0x8000 != 0 {
            (l & !3) | ((off >> (2 * (l & 3))) & 3)
        } else {
            let (and, or, xor) = (off & 31, (off >> 5) & 31, (off >> 10) & 31);
            (l & !31) | ((((l & 31) & and) | or) ^ xor)
        }
    };
    let mut out = [0u32; LANES];
    for l in lanes(exec) {
        let s = src(l);
        out[l] = if (exec >> s) & 1 != 0 { data[s] } else { 0 };
    }
    let dst = cx.w.v_mut(i.dst as usize);
    for l in lanes(exec) {
        dst[l] = out[l];
    }
    Ok(Flow::Next)
}

macro_rules! ds_atomics {
    ($($op:literal $rop:literal $name:literal $rname:literal $size:literal $a:expr;)*) => { &[
        $(
            def($op, $name, |cx, i| atomic(cx, i, $size, $a, false)),
            def($rop, $rname, |cx, i| atomic(cx, i, $size, $a, true)),
        )*
    ] };
}

pub static DS_ATOMICS: &[OpDef] = ds_atomics! {
    0x00 0x20 "ds_add_u32" "ds_add_rtn_u32" 4 AtomicOp::Add;
    0x01 0x21 "ds_sub_u32" "ds_sub_rtn_u32" 4 AtomicOp::Sub;
    0x02 0x22 "ds_rsub_u32" "ds_rsub_rtn_u32" 4 AtomicOp::Rsub;
    0x03 0x23 "ds_inc_u32" "ds_inc_rtn_u32" 4 AtomicOp::Inc;
    0x04 0x24 "ds_dec_u32" "ds_dec_rtn_u32" 4 AtomicOp::Dec;
    0x05 0x25 "ds_min_i32" "ds_min_rtn_i32" 4 AtomicOp::SMin;
    0x06 0x26 "ds_max_i32" "ds_max_rtn_i32" 4 AtomicOp::SMax;
    0x07 0x27 "ds_min_u32" "ds_min_rtn_u32" 4 AtomicOp::UMin;
    0x08 0x28 "ds_max_u32" "ds_max_rtn_u32" 4 AtomicOp::UMax;
    0x09 0x29 "ds_and_b32" "ds_and_rtn_b32" 4 AtomicOp::And;
    0x0a 0x2a "ds_or_b32" "ds_or_rtn_b32" 4 AtomicOp::Or;
    0x0b 0x2b "ds_xor_b32" "ds_xor_rtn_b32" 4 AtomicOp::Xor;
    0x10 0x30 "ds_cmpst_b32" "ds_cmpst_rtn_b32" 4 AtomicOp::CmpSwap;
    0x12 0x32 "ds_min_f32" "ds_min_rtn_f32" 4 AtomicOp::FMin;
    0x13 0x33 "ds_max_f32" "ds_max_rtn_f32" 4 AtomicOp::FMax;
    0x15 0x35 "ds_add_f32" "ds_add_rtn_f32" 4 AtomicOp::FAdd;
    0x40 0x60 "ds_add_u64" "ds_add_rtn_u64" 8 AtomicOp::Add;
    0x41 0x61 "ds_sub_u64" "ds_sub_rtn_u64" 8 AtomicOp::Sub;
    0x42 0x62 "ds_rsub_u64" "ds_rsub_rtn_u64" 8 AtomicOp::Rsub;
    0x43 0x63 "ds_inc_u64" "ds_inc_rtn_u64" 8 AtomicOp::Inc;
    0x44 0x64 "ds_dec_u64" "ds_dec_rtn_u64" 8 AtomicOp::Dec;
    0x45 0x65 "ds_min_i64" "ds_min_rtn_i64" 8 AtomicOp::SMin;
    0x46 0x66 "ds_max_i64" "ds_max_rtn_i64" 8 AtomicOp::SMax;
    0x47 0x67 "ds_min_u64" "ds_min_rtn_u64" 8 AtomicOp::UMin;
    0x48 0x68 "ds_max_u64" "ds_max_rtn_u64" 8 AtomicOp::UMax;
    0x49 0x69 "ds_and_b64" "ds_and_rtn_b64" 8 AtomicOp::And;
    0x4a 0x6a "ds_or_b64" "ds_or_rtn_b64" 8 AtomicOp::Or;
    0x4b 0x6b "ds_xor_b64" "ds_xor_rtn_b64" 8 AtomicOp::Xor;
    0x50 0x70 "ds_cmpst_b64" "ds_cmpst_rtn_b64" 8 AtomicOp::CmpSwap;
    0x52 0x72 "ds_min_f64" "ds_min_rtn_f64" 8 AtomicOp::FMin;
    0x53 0x73 "ds_max_f64" "ds_max_rtn_f64" 8 AtomicOp::FMax;
};

pub static DS_MOVES: &[OpDef] = &[
    def(0x0d, "ds_write_b32", |cx, i| write(cx, i, 4)),
    def(0x0e, "ds_write2_b32", |cx, i| write2(cx, i, 4, 1)),
    def(0x0f, "ds_write2st64_b32", |cx, i| write2(cx, i, 4, 64)),
    def(0x1e, "ds_write_b8", |cx, i| write(cx, i, 1)),
    def(0x1f, "ds_write_b16", |cx, i| write(cx, i, 2)),
    def(0x2d, "ds_wrxchg_rtn_b32", |cx, i| {
        atomic(cx, i, 4, AtomicOp::Swap, true)
    }),
    def(0x36, "ds_read_b32", |cx, i| read(cx, i, 4, false)),
    def(0x37, "ds_read2_b32", |cx, i| read2(cx, i, 4, 1)),
    def(0x38, "ds_read2st64_b32", |cx, i| read2(cx, i, 4, 64)),
    def(0x39, "ds_read_i8", |cx, i| read(cx, i, 1, true)),
    def(0x3a, "ds_read_u8", |cx, i| read(cx, i, 1, false)),
    def(0x3b, "ds_read_i16", |cx, i| read(cx, i, 2, true)),
    def(0x3c, "ds_read_u16", |cx, i| read(cx, i, 2, false)),
    def(0x3d, "ds_swizzle_b32", swizzle),
    def(0x3e, "ds_permute_b32", |cx, i| permute(cx, i, true)),
    def(0x3f, "ds_bpermute_b32", |cx, i| permute(cx, i, false)),
    def(0x4d, "ds_write_b64", |cx, i| write(cx, i, 8)),
    def(0x4e, "ds_write2_b64", |cx, i| write2(cx, i, 8, 1)),
    def(0x4f, "ds_write2st64_b64", |cx, i| write2(cx, i, 8, 64)),
    def_on(Target::Gfx90a, 0x5c, "ds_add_f64", |cx, i| {
        atomic(cx, i, 8, AtomicOp::FAdd, false)
    }),
    def(0x6d, "ds_wrxchg_rtn_b64", |cx, i| {
        atomic(cx, i, 8, AtomicOp::Swap, true)
    }),
    def(0x76, "ds_read_b64", |cx, i| read(cx, i, 8, false)),
    def(0x77, "ds_read2_b64", |cx, i| read2(cx, i, 8, 1)),
    def(0x78, "ds_read2st64_b64", |cx, i| read2(cx, i, 8, 64)),
    def_on(Target::Gfx90a, 0x7c, "ds_add_rtn_f64", |cx, i| {
        atomic(cx, i, 8, AtomicOp::FAdd, true)
    }),
    def(0xde, "ds_write_b96", |cx, i| write(cx, i, 12)),
    def(0xdf, "ds_write_b128", |cx, i| write(cx, i, 16)),
    def(0xfe, "ds_read_b96", |cx, i| read(cx, i, 12, false)),
    def(0xff, "ds_read_b128", |cx, i| read(cx, i, 16, false)),
];

pub static DS: &[&[OpDef]] = &[DS_ATOMICS, DS_MOVES];
