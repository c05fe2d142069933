//! The control stack of kfd-emu's CP model, version 2 (version 1, which has no XCC fields,
//! is still read, as XCC 0 of 1).
//!
//! On gfx9 the control stack is the CP's: it lives one page after the MQD, KFD copies it out
//! at CHECKPOINT and back at RESTORE, and its records (relaunch state and wave entries,
//! 8 bytes per wave in KFD's sizing) are firmware-internal. The emulated CP writes its own
//! records instead, in the same place and within the same size, so that the checkpointed MQD
//! and control stack are all a restored queue needs to resume its dispatches; nothing is kept
//! elsewhere.
//!
//! The stream is little-endian and written so that it ends at `ctl_stack_size` (the control
//! stack grows down; CP_HQD_CNTL_STACK_OFFSET is where it starts). Layout:
//!
//! ```text
//! stack header, 16 bytes
//!    0 u32 magic 0x4b545343 ("CSTK")
//!    4 u16 version (2)
//!    6 u16 dispatches
//!    8 u32 waves, all dispatches
//!   12 u32 bytes of the whole stream, this header included
//! per dispatch in flight: a dispatch record, 128 bytes, then its wave records
//!    0 u32 tag 0x50534944 ("DISP")
//!    4 u32 waves (records that follow)
//!    8 u64 dispatch id: the AQL read index of its packet
//!   16 [64] the kernel dispatch packet as the CP read it (the ring slot may be reused since)
//!   80 u32 next workgroup: linear index (x fastest) of the first workgroup not started
//!   84 u32 workgroups done
//!   88 u16 VGPRs, u16 AccVGPRs, u16 SGPRs per wave; u16 zero
//!   96 u32 LDS bytes per workgroup
//!  100 u16 the XCC whose waves these are, u16 the XCCs the dispatch runs on (version 2;
//!          version 1: zero, read as XCC 0 of 1)
//!  104 24 bytes zero
//! wave record, 8 bytes
//!    0 u32 bits 23:0 the wave's block in the wave area, in 64-byte units from its start
//!          (`ctl_stack_size`); bits 27:24 the wave's index in its workgroup; bit 28 first
//!          saved wave of its workgroup (its block carries the LDS); bit 29 waiting at
//!          s_barrier; bit 30 halted (s_sethalt); bit 31 zero
//!    4 u32 its workgroup, linear index
//! ```
//!
//! The blocks are packed in record order from the start of the wave area, so each offset is
//! the sum of the slots before it; the waves of one workgroup are adjacent, the first of them
//! flagged. On a GPU of several XCCs (MI300) the CP hands the dispatch's workgroups to the
//! XCCs of the partition round-robin, XCC `x` of `n` taking the linear indices `x`, `x + n`,
//! ...; each XCC saves its own waves into its own slice of the context save area and writes
//! its own control stack, whose dispatch record names the XCC and counts that XCC's
//! workgroups only. Workgroups running are those with wave records, each one of the XCC's;
//! `done + running` is the number of the XCC's workgroups below `next`.
//! [`ControlStack::decode`] checks all of it and names the first field that is wrong.

use std::collections::HashSet;

use super::layout::{Alloc, WaveBlock};
use super::{le, Error, Result};
use crate::state::Target;

pub const MAGIC: u32 = 0x4b54_5343;
pub const VERSION: u16 = 2;
/// The version before the XCC fields.
const VERSION_ONE_XCC: u16 = 1;
/// The most XCCs a dispatch record names (KFD's nodes have at most 8).
pub const MAX_XCC: u16 = 32;
pub const HEADER_BYTES: usize = 16;
pub const DISPATCH_BYTES: usize = 128;
pub const WAVE_BYTES: usize = 8;
const DISPATCH_TAG: u32 = 0x5053_4944;
/// Wave blocks start on 64-byte boundaries; 24 bits of them reach 1 GiB.
const OFFSET_UNIT: u32 = 64;
const OFFSET_LIMIT: u64 = (1 << 24) * OFFSET_UNIT as u64;
/// 1024 work-items in a workgroup: 16 waves of 64.
pub const MAX_WAVES_PER_GROUP: u32 = 16;
const AQL_KERNEL_DISPATCH: u16 = 2;

/// The saved state of a queue: its dispatches in flight.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControlStack {
    pub dispatches: Vec<DispatchState>,
}

/// A dispatch in flight: how far it got and the waves saved of its running workgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchState {
    pub dispatch_id: u64,
    /// The 64-byte AQL kernel dispatch packet.
    pub packet: [u8; 64],
    pub alloc: Alloc,
    pub next_workgroup: u32,
    pub workgroups_done: u32,
    /// The XCC whose waves the record lists.
    pub xcc: Xcc,
    pub waves: Vec<SavedWave>,
}

/// One XCC of the XCCs a dispatch runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Xcc {
    pub index: u16,
    pub count: u16,
}

impl Xcc {
    /// A GPU of one XCC.
    pub const ONE: Xcc = Xcc { index: 0, count: 1 };

    /// Whether the CP hands workgroup `linear` to this XCC (round-robin).
    pub fn owns(self, linear: u32) -> bool {
        linear % self.count as u32 == self.index as u32
    }

    /// How many of the workgroups below `next` are this XCC's.
    pub fn below(self, next: u32) -> u32 {
        let (x, n) = (self.index as u32, self.count as u32);
        if next > x {
            (next - x).div_ceil(n)
        } else {
            0
        }
    }
}

/// One saved wave: where its block is and what the scheduler knew of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SavedWave {
    /// Bytes from the start of the wave area (`ctl_stack_size` in the context save area).
    pub offset: u32,
    pub workgroup: u32,
    pub wave_in_group: u8,
    pub first_of_group: bool,
    pub at_barrier: bool,
    pub halted: bool,
}

impl DispatchState {
    /// Workgroups per dimension (`ceil(grid / workgroup size)`), from the packet.
    pub fn grid_workgroups(&self) -> Result<[u32; 3]> {
        let p = &self.packet;
        let kind = le::u16(p, 0) & 0xff;
        if kind != AQL_KERNEL_DISPATCH {
            return Err(Error::new(
                "packet.header",
                format!("type {kind} is no kernel dispatch"),
            ));
        }
        let mut n = [0; 3];
        for (d, (name, slot)) in ["x", "y", "z"].iter().zip(n.iter_mut()).enumerate() {
            let wg = le::u16(p, 4 + 2 * d) as u32;
            let grid = le::u32(p, 12 + 4 * d);
            if wg == 0 || grid == 0 {
                return Err(Error::new(
                    format!("packet.workgroup_size_{name}"),
                    format!("workgroup size {wg}, grid size {grid}: neither may be zero"),
                ));
            }
            *slot = grid.div_ceil(wg);
        }
        Ok(n)
    }

    /// Workgroups of the whole dispatch.
    pub fn workgroups(&self) -> Result<u32> {
        let [x, y, z] = self.grid_workgroups()?;
        x.checked_mul(y)
            .and_then(|xy| xy.checked_mul(z))
            .ok_or_else(|| {
                Error::new(
                    "packet.grid_size",
                    format!("{x}x{y}x{z} workgroups exceed 2^32"),
                )
            })
    }

    /// Waves of a full workgroup.
    pub fn waves_per_group(&self) -> u32 {
        let p = &self.packet;
        let items: u64 = (0..3).map(|d| le::u16(p, 4 + 2 * d) as u64).product();
        items.div_ceil(64).min(u32::MAX as u64) as u32
    }

    /// The workgroup id (x, y, z) of a linear workgroup index.
    pub fn workgroup_id(&self, linear: u32) -> Result<[u32; 3]> {
        let [x, y, _] = self.grid_workgroups()?;
        Ok([linear % x, linear / x % y, linear / x / y])
    }
}

impl ControlStack {
    /// Waves of all dispatches.
    pub fn wave_count(&self) -> usize {
        self.dispatches.iter().map(|d| d.waves.len()).sum()
    }

    /// The stream's length (none for a queue without dispatches in flight: the control stack
    /// stays empty, as the hardware's does).
    pub fn encoded_len(&self) -> usize {
        if self.dispatches.is_empty() {
            return 0;
        }
        HEADER_BYTES + self.dispatches.len() * DISPATCH_BYTES + self.wave_count() * WAVE_BYTES
    }

    /// The stream. Fields that do not fit their bits are refused; the rest of the checks is
    /// [`decode`](Self::decode)'s.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.dispatches.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = vec![0; self.encoded_len()];
        let dispatches = u16::try_from(self.dispatches.len())
            .map_err(|_| Error::new("control stack: dispatches", "more than 65535"))?;
        le::put32(&mut out, 0, MAGIC);
        le::put16(&mut out, 4, VERSION);
        le::put16(&mut out, 6, dispatches);
        le::put32(&mut out, 8, self.wave_count() as u32);
        let len = out.len() as u32;
        le::put32(&mut out, 12, len);
        let mut at = HEADER_BYTES;
        for (i, d) in self.dispatches.iter().enumerate() {
            at = encode_dispatch(d, &mut out, at)
                .map_err(|e| e.within(&format!("control stack: dispatch[{i}]")))?;
        }
        Ok(out)
    }

    /// Reads a stream and checks it whole: magic, version, lengths and counts, each dispatch's
    /// packet and allocation, the wave blocks' packing, workgroup membership and the dispatch
    /// progress. The error names the first field that is wrong.
    pub fn decode(target: Target, b: &[u8]) -> Result<ControlStack> {
        if b.is_empty() {
            return Ok(ControlStack::default());
        }
        let (dispatches, waves, version) = decode_header(b)?;
        let mut stack = ControlStack::default();
        let mut at = HEADER_BYTES;
        let mut cursor = 0u64;
        for i in 0..dispatches {
            let field = format!("control stack: dispatch[{i}]");
            let (d, next) = decode_dispatch(target, (b, version), at, &mut cursor)
                .map_err(|e| e.within(&field))?;
            stack.dispatches.push(d);
            at = next;
        }
        if at != b.len() {
            return Err(Error::new(
                "control stack: bytes",
                format!("{} bytes, the records end at {at}", b.len()),
            ));
        }
        if stack.wave_count() != waves as usize {
            return Err(Error::new(
                "control stack: waves",
                format!(
                    "{waves}, the dispatches hold {} wave records",
                    stack.wave_count()
                ),
            ));
        }
        Ok(stack)
    }

    /// Bytes of the wave area the saved waves occupy (their blocks are packed from its start).
    pub fn wave_area_used(&self) -> u64 {
        self.dispatches
            .iter()
            .flat_map(|d| {
                let b = WaveBlock::of(&d.alloc);
                d.waves
                    .iter()
                    .map(move |w| b.slot_bytes(w.first_of_group) as u64)
            })
            .sum()
    }
}

fn encode_dispatch(d: &DispatchState, out: &mut [u8], at: usize) -> Result<usize> {
    le::put32(out, at, DISPATCH_TAG);
    le::put32(out, at + 4, d.waves.len() as u32);
    le::put64(out, at + 8, d.dispatch_id);
    out[at + 16..at + 80].copy_from_slice(&d.packet);
    le::put32(out, at + 80, d.next_workgroup);
    le::put32(out, at + 84, d.workgroups_done);
    le::put16(out, at + 88, d.alloc.vgprs);
    le::put16(out, at + 90, d.alloc.agprs);
    le::put16(out, at + 92, d.alloc.sgprs);
    le::put32(out, at + 96, d.alloc.lds_bytes);
    le::put16(out, at + 100, d.xcc.index);
    le::put16(out, at + 102, d.xcc.count);
    let mut at = at + DISPATCH_BYTES;
    for (j, w) in d.waves.iter().enumerate() {
        let field = |f: &str| format!("wave[{j}].{f}");
        if !w.offset.is_multiple_of(OFFSET_UNIT) || w.offset as u64 >= OFFSET_LIMIT {
            return Err(Error::new(
                field("offset"),
                format!(
                    "{:#x} is not a multiple of {OFFSET_UNIT} below {OFFSET_LIMIT:#x}",
                    w.offset
                ),
            ));
        }
        if w.wave_in_group as u32 >= MAX_WAVES_PER_GROUP {
            return Err(Error::new(
                field("wave_in_group"),
                format!(
                    "{} is past the {MAX_WAVES_PER_GROUP} waves of a workgroup",
                    w.wave_in_group
                ),
            ));
        }
        let word = (w.offset / OFFSET_UNIT)
            | ((w.wave_in_group as u32) << 24)
            | ((w.first_of_group as u32) << 28)
            | ((w.at_barrier as u32) << 29)
            | ((w.halted as u32) << 30);
        le::put32(out, at, word);
        le::put32(out, at + 4, w.workgroup);
        at += WAVE_BYTES;
    }
    Ok(at)
}

fn decode_header(b: &[u8]) -> Result<(u16, u32, u16)> {
    if b.len() < HEADER_BYTES {
        return Err(Error::new(
            "control stack: bytes",
            format!("{} bytes, the stack header has {HEADER_BYTES}", b.len()),
        ));
    }
    let magic = le::u32(b, 0);
    if magic != MAGIC {
        return Err(Error::new(
            "control stack: magic",
            format!("{magic:#x}, expected {MAGIC:#x} (\"CSTK\")"),
        ));
    }
    let version = le::u16(b, 4);
    if version != VERSION && version != VERSION_ONE_XCC {
        return Err(Error::new(
            "control stack: version",
            format!("{version}, this CP model reads versions {VERSION_ONE_XCC} and {VERSION}"),
        ));
    }
    let bytes = le::u32(b, 12);
    if bytes as usize != b.len() {
        return Err(Error::new(
            "control stack: bytes",
            format!("the header says {bytes}, the stack has {}", b.len()),
        ));
    }
    Ok((le::u16(b, 6), le::u32(b, 8), version))
}

/// One dispatch record and its waves from `at`; `cursor` is where the next wave block must
/// start in the wave area.
fn decode_dispatch(
    target: Target,
    (b, version): (&[u8], u16),
    at: usize,
    cursor: &mut u64,
) -> Result<(DispatchState, usize)> {
    let (waves, end) = record_bounds(b, at, version)?;
    let mut d = decode_record(target, b, at, waves)?;
    d.xcc = decode_xcc(b, at, version)?;
    d.waves = decode_waves(b, at + DISPATCH_BYTES, waves)?;
    check_waves(&d, cursor)?;
    Ok((d, end))
}

/// The dispatch record at `at` and its wave records lie within the stack,
/// tagged and with reserved bytes zero (of a version 1 record, the XCC
/// fields too); returns its wave count and end.
fn record_bounds(b: &[u8], at: usize, version: u16) -> Result<(usize, usize)> {
    if b.len() < at + DISPATCH_BYTES {
        return Err(Error::new(
            "record",
            format!(
                "ends at {}, past the stack's {} bytes",
                at + DISPATCH_BYTES,
                b.len()
            ),
        ));
    }
    let tag = le::u32(b, at);
    if tag != DISPATCH_TAG {
        return Err(Error::new(
            "tag",
            format!("{tag:#x}, expected {DISPATCH_TAG:#x} (\"DISP\")"),
        ));
    }
    let waves = le::u32(b, at + 4) as usize;
    let end = waves
        .checked_mul(WAVE_BYTES)
        .and_then(|w| w.checked_add(at + DISPATCH_BYTES))
        .filter(|&e| e <= b.len())
        .ok_or_else(|| {
            Error::new(
                "waves",
                format!("{waves} records run past the stack's {} bytes", b.len()),
            )
        })?;
    let reserved = if version == VERSION_ONE_XCC { 100 } else { 104 };
    if le::u16(b, at + 94) != 0
        || b[at + reserved..at + DISPATCH_BYTES]
            .iter()
            .any(|&x| x != 0)
    {
        return Err(Error::new("reserved", "nonzero"));
    }
    Ok((waves, end))
}

/// The XCC a record names: XCC 0 of 1 in version 1, one of at most
/// [`MAX_XCC`] in version 2.
fn decode_xcc(b: &[u8], at: usize, version: u16) -> Result<Xcc> {
    if version == VERSION_ONE_XCC {
        return Ok(Xcc::ONE);
    }
    let xcc = Xcc {
        index: le::u16(b, at + 100),
        count: le::u16(b, at + 102),
    };
    if xcc.count == 0 || xcc.count > MAX_XCC {
        return Err(Error::new(
            "xcc_count",
            format!("{}, a dispatch runs on 1 to {MAX_XCC} XCCs", xcc.count),
        ));
    }
    if xcc.index >= xcc.count {
        return Err(Error::new(
            "xcc",
            format!("{} of {} XCCs", xcc.index, xcc.count),
        ));
    }
    Ok(xcc)
}

/// The dispatch record at `at` (its waves not yet read): an allocation the
/// target can give, a next workgroup within the grid.
fn decode_record(target: Target, b: &[u8], at: usize, waves: usize) -> Result<DispatchState> {
    let alloc = Alloc {
        vgprs: le::u16(b, at + 88),
        agprs: le::u16(b, at + 90),
        sgprs: le::u16(b, at + 92),
        lds_bytes: le::u32(b, at + 96),
    };
    alloc.check(target).map_err(|e| e.within("alloc"))?;
    let d = DispatchState {
        dispatch_id: le::u64(b, at + 8),
        packet: b[at + 16..at + 80].try_into().expect("64 bytes"),
        alloc,
        next_workgroup: le::u32(b, at + 80),
        workgroups_done: le::u32(b, at + 84),
        xcc: Xcc::ONE,
        waves: Vec::with_capacity(waves),
    };
    let total = d.workgroups()?;
    if d.next_workgroup > total {
        return Err(Error::new(
            "next_workgroup",
            format!(
                "{} is past the dispatch's {total} workgroups",
                d.next_workgroup
            ),
        ));
    }
    Ok(d)
}

/// The `waves` wave records from `at`, each with bit 31 clear.
fn decode_waves(b: &[u8], at: usize, waves: usize) -> Result<Vec<SavedWave>> {
    let mut out = Vec::with_capacity(waves);
    for i in 0..waves {
        let wat = at + i * WAVE_BYTES;
        let word = le::u32(b, wat);
        if word >> 31 != 0 {
            return Err(Error::new(format!("wave[{i}].flags"), "bit 31 is set"));
        }
        out.push(SavedWave {
            offset: (word & 0xff_ffff) * OFFSET_UNIT,
            workgroup: le::u32(b, wat + 4),
            wave_in_group: ((word >> 24) & 0xf) as u8,
            first_of_group: (word >> 28) & 1 != 0,
            at_barrier: (word >> 29) & 1 != 0,
            halted: (word >> 30) & 1 != 0,
        });
    }
    Ok(out)
}

/// The waves' packing and workgroup membership, and the dispatch's progress.
fn check_waves(d: &DispatchState, cursor: &mut u64) -> Result<()> {
    let block = WaveBlock::of(&d.alloc);
    let per_group = d.waves_per_group();
    let mut groups = HashSet::new();
    let mut members = HashSet::new();
    let mut current = None;
    for (j, w) in d.waves.iter().enumerate() {
        let field = |f: &str| format!("wave[{j}].{f}");
        if w.offset as u64 != *cursor {
            return Err(Error::new(
                field("offset"),
                format!(
                    "{:#x}, the blocks before it end at {:#x}",
                    w.offset, *cursor
                ),
            ));
        }
        *cursor += block.slot_bytes(w.first_of_group) as u64;
        check_place(d, j, w, per_group)?;
        let starts = current != Some(w.workgroup);
        if starts != w.first_of_group {
            return Err(Error::new(
                field("first_of_group"),
                format!(
                    "{} on {} record of workgroup {}",
                    w.first_of_group,
                    if starts { "the first" } else { "a later" },
                    w.workgroup
                ),
            ));
        }
        if starts && !groups.insert(w.workgroup) {
            return Err(Error::new(
                field("workgroup"),
                format!("workgroup {}'s waves are not adjacent", w.workgroup),
            ));
        }
        if !members.insert((w.workgroup, w.wave_in_group)) {
            return Err(Error::new(
                field("wave_in_group"),
                format!(
                    "wave {} of workgroup {} is saved twice",
                    w.wave_in_group, w.workgroup
                ),
            ));
        }
        current = Some(w.workgroup);
    }
    let running = groups.len() as u64;
    let started = d.xcc.below(d.next_workgroup);
    if d.workgroups_done as u64 + running != started as u64 {
        return Err(Error::new(
            "workgroups_done",
            format!(
                "{} done and {running} running do not add up to the {started} started{}",
                d.workgroups_done,
                if d.xcc.count > 1 {
                    format!(" on XCC {} of {}", d.xcc.index, d.xcc.count)
                } else {
                    String::new()
                }
            ),
        ));
    }
    Ok(())
}

/// Wave record `j`'s workgroup has started and is its XCC's, and its index
/// is within a workgroup.
fn check_place(d: &DispatchState, j: usize, w: &SavedWave, per_group: u32) -> Result<()> {
    let field = |f: &str| format!("wave[{j}].{f}");
    if w.workgroup >= d.next_workgroup {
        return Err(Error::new(
            field("workgroup"),
            format!(
                "{} has not started: the next workgroup is {}",
                w.workgroup, d.next_workgroup
            ),
        ));
    }
    if !d.xcc.owns(w.workgroup) {
        return Err(Error::new(
            field("workgroup"),
            format!(
                "{} is not XCC {}'s: the CP hands XCC {} of {} the workgroups {} + k * {}",
                w.workgroup, d.xcc.index, d.xcc.index, d.xcc.count, d.xcc.index, d.xcc.count
            ),
        ));
    }
    if w.wave_in_group as u32 >= per_group {
        return Err(Error::new(
            field("wave_in_group"),
            format!("{} in a workgroup of {per_group} waves", w.wave_in_group),
        ));
    }
    Ok(())
}
