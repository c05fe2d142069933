//! A kernel dispatch as the CP and SPI start it: the kernel's code properties, the grid split
//! into workgroups and waves, and the register state of a new wave (AMDGPUUsage, "Kernel
//! Descriptor" and "Initial Kernel Execution State").
//!
//! The kernel object an AQL packet names is a kernel descriptor (code objects v3-v5) or an
//! `amd_kernel_code_t` (code object v2; ROCr's precompiled blit kernels). The fields a wave
//! needs sit at the same offsets in both: the code entry offset at byte 16, COMPUTE_PGM_RSRC3
//! at 44 (descriptor only), RSRC1 at 48, RSRC2 at 52 and the user-SGPR enables at 56, whose
//! low bits mean the same in both. The segment sizes come from the dispatch packet.
//!
//! Nothing here knows queues or memory: the caller reads the 64 bytes, the packet and the
//! queue's scratch setup, and places the waves.

use crate::state::{Apertures, Target, Wave, LANES};

/// Bytes of the kernel object a wave's setup reads.
pub const KERNEL_OBJECT_BYTES: usize = 64;
/// Work-items a workgroup may hold.
pub const MAX_GROUP_ITEMS: u64 = 1024;
/// LDS a workgroup may allocate, and its allocation granule.
pub const MAX_LDS: u32 = 64 * 1024;
const LDS_GRANULE: u32 = 512;
/// Scratch is given to waves in whole KiB.
const SCRATCH_WAVE_GRANULE: u64 = 1024;

/// The user SGPRs a kernel may enable (bits of `kernel_code_properties`), in the order the CP
/// loads them, with their size in SGPRs.
const USER_SGPRS: [(u32, usize); 10] = [
    (0, 4), // private segment buffer (the scratch V#)
    (1, 2), // dispatch ptr (the AQL packet)
    (2, 2), // queue ptr (amd_queue_t)
    (3, 2), // kernarg segment ptr
    (4, 2), // dispatch id
    (5, 2), // flat scratch init
    (6, 1), // private segment size
    (7, 1), // grid workgroup count X (amd_kernel_code_t only)
    (8, 1), // Y
    (9, 1), // Z
];

/// What a kernel object says about starting its waves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCode {
    /// Byte offset from the kernel object to the first instruction.
    pub entry_offset: i64,
    pub rsrc1: u32,
    pub rsrc2: u32,
    pub rsrc3: u32,
    /// `kernel_code_properties`: the user-SGPR enables.
    pub properties: u32,
    /// The kernarg segment's size as a kernel descriptor gives it (byte 8); None for an
    /// `amd_kernel_code_t`, whose size lies beyond the bytes read.
    pub kernarg_size: Option<u32>,
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl KernelCode {
    /// Reads the first [`KERNEL_OBJECT_BYTES`] of a kernel object.
    pub fn parse(b: &[u8; KERNEL_OBJECT_BYTES]) -> KernelCode {
        KernelCode {
            entry_offset: (le32(b, 16) as u64 | (le32(b, 20) as u64) << 32) as i64,
            rsrc3: le32(b, 44),
            rsrc1: le32(b, 48),
            rsrc2: le32(b, 52),
            properties: le32(b, 56),
            kernarg_size: (!Self::is_amd_kernel_code_t(b)).then(|| le32(b, 8)),
        }
    }

    /// Whether the object is an `amd_kernel_code_t`: version 1.x and machine kind AMDGPU (1)
    /// where a descriptor has its group segment size (a 1-byte one) and its kernarg size.
    fn is_amd_kernel_code_t(b: &[u8; KERNEL_OBJECT_BYTES]) -> bool {
        le32(b, 0) == 1 && u16::from_le_bytes([b[8], b[9]]) == 1
    }

    /// The address of the first instruction of the kernel at `object`.
    pub fn entry(&self, object: u64) -> u64 {
        object.wrapping_add(self.entry_offset as u64)
    }

    /// RSRC2.USER_SGPR: how many SGPRs the CP loads before the system SGPRs.
    pub fn user_sgpr_count(&self) -> usize {
        (self.rsrc2 >> 1 & 0x1f) as usize
    }

    fn rsrc2_bit(&self, bit: u32) -> bool {
        self.rsrc2 >> bit & 1 != 0
    }

    /// RSRC2.ENABLE_PRIVATE_SEGMENT: the wave gets its scratch byte offset in an SGPR.
    pub fn wants_scratch_offset(&self) -> bool {
        self.rsrc2_bit(0)
    }

    /// RSRC2.ENABLE_VGPR_WORKITEM_ID plus one: the work-item id components loaded.
    pub fn workitem_dims(&self) -> usize {
        (self.rsrc2 >> 11 & 3) as usize + 1
    }

    /// The MODE register's start value: RSRC1's FLOAT_MODE, DX10_CLAMP and IEEE_MODE.
    pub fn mode(&self) -> u32 {
        let float_mode = self.rsrc1 >> 12 & 0xff;
        let dx10 = self.rsrc1 >> 21 & 1;
        let ieee = self.rsrc1 >> 23 & 1;
        float_mode | dx10 << 8 | ieee << 9
    }
}

/// Why a dispatch's shape cannot run (the CP's queue errors name the same cases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// A grid or workgroup dimension is 0.
    Dimension,
    /// The workgroup holds more than [`MAX_GROUP_ITEMS`] work-items.
    GroupTooLarge,
    /// The group segment is larger than the LDS a workgroup may have.
    Lds,
}

impl std::fmt::Display for ShapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShapeError::Dimension => "a grid or workgroup dimension is zero",
            ShapeError::GroupTooLarge => "the workgroup holds more than 1024 work-items",
            ShapeError::Lds => "the group segment is larger than 64 KiB of LDS",
        })
    }
}

/// A dispatch's grid: its size and its workgroups' size in work-items, per dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub size: [u32; 3],
    pub group: [u32; 3],
}

impl Grid {
    /// Checks the shape; the LDS a workgroup gets for a group segment of `lds` bytes.
    pub fn check(&self, lds: u32) -> Result<usize, ShapeError> {
        if self.size.contains(&0) || self.group.contains(&0) {
            return Err(ShapeError::Dimension);
        }
        let items: u64 = self.group.iter().map(|&g| g as u64).product();
        if items > MAX_GROUP_ITEMS {
            return Err(ShapeError::GroupTooLarge);
        }
        if lds > MAX_LDS {
            return Err(ShapeError::Lds);
        }
        Ok(lds.div_ceil(LDS_GRANULE) as usize * LDS_GRANULE as usize)
    }

    /// Workgroups per dimension (the last one of a dimension may be partial).
    pub fn groups(&self) -> [u32; 3] {
        [0, 1, 2].map(|d| self.size[d].div_ceil(self.group[d].max(1)))
    }

    /// Workgroups in the grid.
    pub fn group_count(&self) -> u64 {
        self.groups().iter().map(|&g| g as u64).product()
    }

    /// The id of workgroup `n` (X varies fastest).
    pub fn group_id(&self, n: u64) -> [u32; 3] {
        let g = self.groups().map(|g| g.max(1) as u64);
        [n % g[0], n / g[0] % g[1], n / (g[0] * g[1])].map(|v| v as u32)
    }

    /// The work-items of workgroup `id` per dimension: the group size, less at the grid's
    /// far edges.
    pub fn extent(&self, id: [u32; 3]) -> [u32; 3] {
        [0, 1, 2].map(|d| {
            let start = id[d] as u64 * self.group[d] as u64;
            (self.size[d] as u64 - start).min(self.group[d] as u64) as u32
        })
    }

    /// Waves of 64 lanes a workgroup of `extent` needs.
    pub fn waves(extent: [u32; 3]) -> u32 {
        let items: u32 = extent.iter().product();
        items.div_ceil(LANES as u32)
    }
}

/// Scratch bytes a wave gets for `per_lane` bytes of private segment per work-item.
pub fn wave_scratch_bytes(per_lane: u32) -> u64 {
    (per_lane as u64 * LANES as u64).div_ceil(SCRATCH_WAVE_GRANULE) * SCRATCH_WAVE_GRANULE
}

/// What every wave of a dispatch gets alike.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchRegs {
    /// GPU VA of the AQL packet (dispatch ptr).
    pub packet: u64,
    /// GPU VA of the queue's `amd_queue_t` (queue ptr).
    pub queue: u64,
    pub kernarg: u64,
    pub dispatch_id: u64,
    /// The queue's scratch buffer resource (private segment buffer).
    pub scratch_resource: [u32; 4],
    /// Base of the queue's scratch memory (flat scratch init on GFX9: the kernel adds its
    /// wave offset and moves it to FLAT_SCRATCH).
    pub scratch_base: u64,
    /// Private segment bytes per work-item.
    pub private_size: u32,
    pub apertures: Apertures,
}

impl DispatchRegs {
    /// The registers of the waves of one XCC of a partition, whose slice of the queue's
    /// scratch starts `offset` bytes in: the CP moves the flat scratch base and the private
    /// segment buffer's 48-bit base (V# dword 0 and the low half of dword 1) alike.
    pub fn with_scratch_at(&self, offset: u64) -> DispatchRegs {
        const BASE_MASK: u64 = (1 << 48) - 1;
        let [lo, hi, ..] = self.scratch_resource;
        let base = (lo as u64 | ((hi & 0xffff) as u64) << 32).wrapping_add(offset) & BASE_MASK;
        let mut r = *self;
        r.scratch_base = self.scratch_base.wrapping_add(offset);
        r.scratch_resource[0] = base as u32;
        r.scratch_resource[1] = (hi & !0xffff) | (base >> 32) as u32;
        r
    }
}

/// Where one wave sits: its workgroup, the workgroup's extent, its index in the workgroup, its
/// scratch byte offset from the queue's scratch base and the hardware slot the SPI gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub group: [u32; 3],
    pub extent: [u32; 3],
    pub wave: u32,
    pub scratch_offset: u32,
    pub slot: HwSlot,
}

/// The hardware a wave runs on, as HW_ID and XCC_ID report it: the XCC, shader engine, shader
/// array and CU, the SIMD of the CU and the wave slot of the SIMD.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HwSlot {
    pub xcc: u8,
    pub se: u8,
    pub sh: u8,
    pub cu: u8,
    pub simd: u8,
    pub wave: u8,
}

impl HwSlot {
    /// HW_ID of GCN and CDNA: WAVE_ID 3:0, SIMD_ID 5:4, CU_ID 11:8, SH_ID 12, SE_ID from 13,
    /// and the workgroup's TG_ID 19:16 (the low bits of its X id).
    pub fn hw_id(&self, group_x: u32) -> u32 {
        u32::from(self.wave & 0xf)
            | u32::from(self.simd & 3) << 4
            | u32::from(self.cu & 0xf) << 8
            | u32::from(self.sh & 1) << 12
            | u32::from(self.se & 7) << 13
            | (group_x & 0xf) << 16
    }

    /// Gives `w`, of a workgroup whose X id is `group_x`, this slot's HW_ID and XCC_ID.
    pub fn seat(&self, w: &mut Wave, group_x: u32) {
        w.hw_id = self.hw_id(group_x);
        w.xcc_id = u32::from(self.xcc);
    }
}

/// Gives `w` the state of a new wave of `code` at `p` (any state it had is replaced, its
/// VGPRs beyond the work-item ids keep stale values, as on the hardware).
pub fn start_wave(
    w: &mut Wave,
    target: Target,
    object: u64,
    code: &KernelCode,
    grid: &Grid,
    regs: &DispatchRegs,
    p: &Placement,
) {
    w.reset(target, code.entry(object));
    w.mode = code.mode();
    seat_wave(w, regs, p);
    let next = load_user_sgprs(w, code, grid, regs);
    load_system_sgprs(w, target, code, regs, p, next);
    let live = load_workitem_ids(w, target, code, p);
    w.set_exec(if live >= LANES as u32 {
        u64::MAX
    } else {
        (1u64 << live) - 1
    });
}

/// What a wave gets from where it sits rather than from its registers: the apertures, its
/// index in the workgroup and HW_ID. A new wave gets it at launch, a wave rebuilt from a
/// context save area (which holds none of it) when it is relaunched.
pub fn seat_wave(w: &mut Wave, regs: &DispatchRegs, p: &Placement) {
    w.apertures = regs.apertures;
    w.id_in_group = p.wave;
    p.slot.seat(w, p.group[0]);
}

/// The user SGPRs the kernel enables, from s0, as far as RSRC2.USER_SGPR reaches; returns
/// the first system SGPR.
fn load_user_sgprs(w: &mut Wave, code: &KernelCode, grid: &Grid, regs: &DispatchRegs) -> usize {
    let count = code.user_sgpr_count();
    let groups = grid.groups();
    let mut at = 0;
    for (bit, n) in USER_SGPRS {
        if code.properties >> bit & 1 == 0 {
            continue;
        }
        let words: [u32; 4] = match bit {
            0 => regs.scratch_resource,
            1 => split(regs.packet),
            2 => split(regs.queue),
            3 => split(regs.kernarg),
            4 => split(regs.dispatch_id),
            5 => split(regs.scratch_base),
            6 => [regs.private_size, 0, 0, 0],
            _ => [groups[bit as usize - 7], 0, 0, 0],
        };
        for (k, &v) in words.iter().take(n).enumerate() {
            if at + k < count {
                w.set_sgpr(at + k, v);
            }
        }
        at += n;
    }
    count
}

fn split(v: u64) -> [u32; 4] {
    [v as u32, (v >> 32) as u32, 0, 0]
}

/// Workgroup ids, workgroup info and the scratch wave offset, as RSRC2 enables them (with
/// architected flat scratch, ENABLE_PRIVATE_SEGMENT sets FLAT_SCRATCH to the wave's scratch
/// base instead of the offset SGPR).
fn load_system_sgprs(
    w: &mut Wave,
    target: Target,
    code: &KernelCode,
    regs: &DispatchRegs,
    p: &Placement,
    mut at: usize,
) {
    for d in 0..3 {
        if code.rsrc2_bit(7 + d as u32) {
            w.set_sgpr(at, p.group[d]);
            at += 1;
        }
    }
    if code.rsrc2_bit(10) {
        // Workgroup info: only ordered-append (GDS) kernels read it.
        w.set_sgpr(at, 0);
        at += 1;
    }
    if code.wants_scratch_offset() {
        if target.architected_flat_scratch() {
            let base = regs.scratch_base.wrapping_add(p.scratch_offset as u64);
            w.set_sgpr64(crate::state::sreg::FLAT_SCRATCH_LO, base);
        } else {
            w.set_sgpr(at, p.scratch_offset);
        }
    }
}

/// Work-item ids of the wave's lanes: v0, v1, v2 on gfx908, packed into v0 (10 bits each) on
/// gfx90a. Returns the number of live lanes.
fn load_workitem_ids(w: &mut Wave, target: Target, code: &KernelCode, p: &Placement) -> u32 {
    let dims = code.workitem_dims();
    let items: u32 = p.extent.iter().product();
    let first = p.wave * LANES as u32;
    let live = items.saturating_sub(first).min(LANES as u32);
    let ids = workitem_ids(p.extent, first, live);
    match target {
        Target::Gfx90a | Target::Gfx942 => {
            let mut packed = [0u32; LANES];
            for (d, row) in ids.iter().enumerate().take(dims) {
                for (v, id) in packed.iter_mut().zip(row) {
                    *v |= (id & 0x3ff) << (10 * d);
                }
            }
            *w.v_mut(0) = packed;
        }
        Target::Gfx908 => {
            for (d, row) in ids.iter().enumerate().take(dims) {
                *w.v_mut(d) = *row;
            }
        }
    }
    live
}

/// The X, Y and Z work-item ids of the lanes of the wave whose first item is `first` in a
/// workgroup of `extent`; lanes from `live` on (past the workgroup's last item) get zeros.
/// Ids step from lane to lane (X fastest) instead of dividing per lane.
fn workitem_ids(extent: [u32; 3], first: u32, live: u32) -> [[u32; LANES]; 3] {
    let [ex, ey, _] = extent;
    let mut ids = [[0u32; LANES]; 3];
    let mut at = [first % ex, first / ex % ey, first / (ex * ey)];
    for lane in 0..live as usize {
        for (d, row) in ids.iter_mut().enumerate() {
            row[lane] = at[d];
        }
        at[0] += 1;
        if at[0] == ex {
            at[0] = 0;
            at[1] += 1;
            if at[1] == ey {
                at[1] = 0;
                at[2] += 1;
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(props: u32, rsrc2: u32, entry: i64) -> [u8; KERNEL_OBJECT_BYTES] {
        let mut b = [0u8; KERNEL_OBJECT_BYTES];
        b[16..24].copy_from_slice(&entry.to_le_bytes());
        b[48..52].copy_from_slice(&(1u32 << 23 | 1 << 21 | 0xc0 << 12).to_le_bytes());
        b[52..56].copy_from_slice(&rsrc2.to_le_bytes());
        b[56..60].copy_from_slice(&props.to_le_bytes());
        b
    }

    const GRID: Grid = Grid {
        size: [300, 3, 1],
        group: [128, 2, 1],
    };

    #[test]
    fn a_grid_splits_into_partial_workgroups_at_its_edges() {
        assert_eq!(GRID.groups(), [3, 2, 1]);
        assert_eq!(GRID.group_count(), 6);
        assert_eq!(GRID.group_id(4), [1, 1, 0]);
        assert_eq!(GRID.extent([2, 1, 0]), [44, 1, 1]);
        assert_eq!(Grid::waves([44, 1, 1]), 1);
        assert_eq!(Grid::waves([128, 2, 1]), 4);
        assert_eq!(GRID.check(100), Ok(512));
        let big = Grid {
            size: [1, 1, 1],
            group: [1025, 1, 1],
        };
        assert_eq!(big.check(0), Err(ShapeError::GroupTooLarge));
        assert_eq!(GRID.check(MAX_LDS + 1), Err(ShapeError::Lds));
        let zero = Grid {
            size: [0, 1, 1],
            group: [1, 1, 1],
        };
        assert_eq!(zero.check(0), Err(ShapeError::Dimension));
        assert_eq!(wave_scratch_bytes(20), 2048);
    }

    #[test]
    fn the_kernarg_size_comes_from_a_descriptor_not_an_amd_kernel_code_t() {
        let mut kd = object(0b1000, 0, 256);
        kd[8..12].copy_from_slice(&280u32.to_le_bytes());
        assert_eq!(KernelCode::parse(&kd).kernarg_size, Some(280));
        // amd_kernel_code_t 1.1, machine kind AMDGPU, gfx9.0.8.
        let mut akc = object(0b1000, 0, 256);
        akc[0..4].copy_from_slice(&1u32.to_le_bytes());
        akc[4..8].copy_from_slice(&1u32.to_le_bytes());
        akc[8..12].copy_from_slice(&(1u32 | 9 << 16).to_le_bytes());
        akc[12..16].copy_from_slice(&(8u32 << 16).to_le_bytes());
        assert_eq!(KernelCode::parse(&akc).kernarg_size, None);
    }

    /// Private segment buffer, dispatch ptr, kernarg ptr, flat scratch init (user SGPRs 12),
    /// workgroup ids X and Y, the scratch wave offset, X and Y work-item ids.
    fn hip_like() -> KernelCode {
        let rsrc2 = 1 | 12 << 1 | 1 << 7 | 1 << 8 | 1 << 11;
        KernelCode::parse(&object(0b10_1011, rsrc2, 256))
    }

    fn regs() -> DispatchRegs {
        DispatchRegs {
            packet: 0x1_0000_0040,
            queue: 0x2_0000_0000,
            kernarg: 0x3_0000_1000,
            dispatch_id: 7,
            scratch_resource: [0xa, 0xb, 0xc, 0xd],
            scratch_base: 0x4_0000_0000,
            private_size: 16,
            apertures: Apertures::default(),
        }
    }

    #[test]
    fn user_and_system_sgprs_follow_the_enables() {
        let code = hip_like();
        let mut w = Wave::new(Target::Gfx908, 0);
        let p = Placement {
            group: [2, 1, 0],
            extent: [44, 1, 1],
            wave: 0,
            scratch_offset: 0x800,
            slot: HwSlot::default(),
        };
        start_wave(&mut w, Target::Gfx908, 0x9000, &code, &GRID, &regs(), &p);
        assert_eq!(w.pc, 0x9100);
        assert_eq!(&w.sreg[0..4], &[0xa, 0xb, 0xc, 0xd]);
        assert_eq!(w.sgpr64(4), 0x1_0000_0040, "dispatch ptr");
        assert_eq!(w.sgpr64(6), 0x3_0000_1000, "kernarg ptr (no queue ptr)");
        assert_eq!(w.sgpr64(8), 0x4_0000_0000, "flat scratch init");
        assert_eq!(w.sgpr(10), 0, "past the enabled user SGPRs");
        assert_eq!([w.sgpr(12), w.sgpr(13), w.sgpr(14)], [2, 1, 0x800]);
        assert_eq!(w.exec(), (1 << 44) - 1);
        assert_eq!(w.mode, 0xc0 | 1 << 8 | 1 << 9);
        assert_eq!((w.lane(0, 43), w.lane(1, 43)), (43, 0));
    }

    #[test]
    fn gfx90a_packs_workitem_ids_in_v0() {
        let code = hip_like();
        let p = Placement {
            group: [0, 0, 0],
            extent: [128, 2, 1],
            wave: 3,
            scratch_offset: 0,
            slot: HwSlot::default(),
        };
        let mut w = Wave::new(Target::Gfx90a, 0);
        start_wave(&mut w, Target::Gfx90a, 0x9000, &code, &GRID, &regs(), &p);
        // Wave 3 holds linear ids 192..255: x = 64..127, y = 1.
        assert_eq!(w.lane(0, 5), 69 | 1 << 10);
        assert_eq!(w.exec(), u64::MAX);
        let mut w = Wave::new(Target::Gfx908, 0);
        start_wave(&mut w, Target::Gfx908, 0x9000, &code, &GRID, &regs(), &p);
        assert_eq!((w.lane(0, 5), w.lane(1, 5)), (69, 1));
    }

    #[test]
    fn stepped_workitem_ids_are_the_divided_ones() {
        for extent in [[256, 1, 1], [5, 3, 7], [7, 1, 30], [1, 1, 1024], [3, 40, 2]] {
            let items: u32 = extent.iter().product();
            for wave in 0..items.div_ceil(64) {
                let first = wave * 64;
                let live = (items - first).min(64);
                let ids = workitem_ids(extent, first, live);
                for (lane, got) in (0..64)
                    .map(|l| [ids[0][l], ids[1][l], ids[2][l]])
                    .enumerate()
                {
                    let n = first + lane as u32;
                    let want = if (lane as u32) < live {
                        [
                            n % extent[0],
                            n / extent[0] % extent[1],
                            n / (extent[0] * extent[1]),
                        ]
                    } else {
                        [0; 3]
                    };
                    assert_eq!(got, want, "extent {extent:?}, wave {wave}, lane {lane}");
                }
            }
        }
    }

    #[test]
    fn an_xccs_scratch_slice_moves_both_bases() {
        let regs = DispatchRegs {
            scratch_resource: [0xffff_f000, 0x8001_7fff, 0xc, 0xd],
            scratch_base: 0x7fff_ffff_f000,
            ..Default::default()
        };
        let r = regs.with_scratch_at(0x2000);
        assert_eq!(r.scratch_base, 0x8000_0000_1000);
        assert_eq!(
            r.scratch_resource,
            [0x1000, 0x8001_8000, 0xc, 0xd],
            "carry into dword 1"
        );
        assert_eq!(regs.with_scratch_at(0), regs);
    }

    #[test]
    fn gfx942_sets_flat_scratch_to_the_wave_base() {
        // Dispatch ptr and kernarg ptr only (no scratch V#, no flat scratch init: architected
        // flat scratch refuses them), workgroup id X, private segment enabled.
        let code = KernelCode::parse(&object(0b1010, 1 | 4 << 1 | 1 << 7, 256));
        let p = Placement {
            group: [3, 0, 0],
            extent: [64, 1, 1],
            wave: 0,
            scratch_offset: 0x2000,
            slot: HwSlot::default(),
        };
        let mut w = Wave::new(Target::Gfx942, 0);
        start_wave(&mut w, Target::Gfx942, 0x9000, &code, &GRID, &regs(), &p);
        assert_eq!(
            w.flat_scratch(),
            0x4_0000_2000,
            "queue scratch base + wave offset"
        );
        assert_eq!(
            [w.sgpr(4), w.sgpr(5)],
            [3, 0],
            "workgroup id X, no offset SGPR"
        );
        let mut w = Wave::new(Target::Gfx90a, 0);
        start_wave(&mut w, Target::Gfx90a, 0x9000, &code, &GRID, &regs(), &p);
        assert_eq!(
            (w.flat_scratch(), w.sgpr(5)),
            (0, 0x2000),
            "gfx90a: the offset SGPR"
        );
    }

    #[test]
    fn amd_kernel_code_t_grid_counts_follow_its_enables() {
        // Kernarg ptr and the three grid workgroup counts, 5 user SGPRs, workgroup id X.
        let code = KernelCode::parse(&object(1 << 3 | 7 << 7, 5 << 1 | 1 << 7, 256));
        let mut w = Wave::new(Target::Gfx908, 0);
        let p = Placement {
            group: [1, 0, 0],
            extent: [128, 2, 1],
            ..Placement::default()
        };
        start_wave(&mut w, Target::Gfx908, 0, &code, &GRID, &regs(), &p);
        assert_eq!(w.sgpr64(0), 0x3_0000_1000);
        assert_eq!([w.sgpr(2), w.sgpr(3), w.sgpr(4), w.sgpr(5)], [3, 2, 1, 1]);
    }
}
