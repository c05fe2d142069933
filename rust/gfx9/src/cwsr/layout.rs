//! Where the trap handler puts things: a wave's register allocation, the block it saves per
//! wave, the context save area's header, and the area's size as KFD and libhsakmt compute it.
//!
//! Sources of the numbers (facts, no code):
//! - `drivers/gpu/drm/amd/amdkfd/cwsr_trap_handler_gfx9.asm` (Linux; built for gfx908 as
//!   ASIC_FAMILY=CHIP_ARCTURUS and for gfx90a as CHIP_ALDEBARAN): the save order and offsets;
//! - `kfd_queue.c` (`kfd_queue_ctx_save_restore_size`) and libhsakmt's `queues.c`
//!   (`update_ctx_save_restore_size`, `fill_cwsr_header`): the area's sizes;
//! - `include/uapi/linux/kfd_ioctl.h` (`struct kfd_context_save_area_header`) and
//!   `kfd_mqd_manager_v9.c` (`get_wave_state`): the header;
//! - ROCdbgapi's gfx9 `cwsr_record_t::register_address`: the same layout read back, which also
//!   shows where the aliased SGPRs (VCC, FLAT_SCRATCH, XNACK_MASK) sit and the 64 bytes the CP
//!   leaves past each wave's block.

use super::{le, Error, Result};
use crate::state::Target;

/// Bytes of one VGPR (or AccVGPR) of a wave64: 64 lanes of 4 bytes, lane `l` at `4 * l`
/// (the handler stores with `buffer_store_dword` through an ADD_TID buffer of stride 4).
pub const VGPR_BYTES: usize = 64 * 4;
/// The HWREG block: 16 dwords at `size(VGPR) + size(SGPR)` ("HWREG size 128 bytes" in the
/// handler counts this block and the TTMP block after it).
pub const HWREG_BYTES: usize = 64;
/// The TTMP block: TTMP`n` at `size(VGPR) + size(SGPR) + 0x40 + 4n` (the handler stores
/// TTMP4–7 at +0x50, TTMP8–11 at +0x60, TTMP13 at +0x74; the others are its scratch, and
/// [`save_wave`](super::save_wave) writes all sixteen so that a restore is exact).
pub const TTMP_BYTES: usize = 64;
/// Bytes the CP leaves past each wave's block before the next wave's (ROCdbgapi's walk of a
/// gfx9 wave area starts each record 64 bytes below the previous one); nothing writes them.
pub const WAVE_GAP: usize = 64;
/// LDS_ALLOC.LDS_SIZE counts 64 dwords ("SQ LDS granularity is 64DW" in the handler).
pub const LDS_GRANULE: u32 = 256;
/// The largest LDS a workgroup can have on gfx908 and gfx90a (64 KiB per CU).
pub const LDS_MAX: u32 = 64 * 1024;

/// Dword index of each hardware register in the HWREG block, in the handler's save order:
/// M0, PC_LO, PC_HI, EXEC_LO, EXEC_HI, STATUS, TRAPSTS, XNACK_MASK_LO, XNACK_MASK_HI, MODE.
pub mod hwreg_slot {
    pub const M0: usize = 0;
    pub const PC_LO: usize = 1;
    /// PC[47:32]; the handler keeps IB_STS.RCNT in bits 31:27 and FIRST_REPLAY in bit 26,
    /// which the emulator (no XNACK replay) writes as zero.
    pub const PC_HI: usize = 2;
    pub const EXEC_LO: usize = 3;
    pub const EXEC_HI: usize = 4;
    /// SQ_WAVE_STATUS; bit 0 is SCC.
    pub const STATUS: usize = 5;
    pub const TRAPSTS: usize = 6;
    pub const XNACK_MASK_LO: usize = 7;
    pub const XNACK_MASK_HI: usize = 8;
    pub const MODE: usize = 9;
    /// Slots the handler writes; 10..16 stay zero.
    pub const USED: usize = 10;
}

/// The registers and LDS one wave (and its workgroup) holds, as the SPI allocated them: what
/// decides the size and shape of its saved block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Alloc {
    /// Architectural VGPRs, a multiple of 4, 4..=256.
    pub vgprs: u16,
    /// AccVGPRs: as many as `vgprs` on gfx908 (the handler saves both files with one
    /// count); on gfx90a the unified file's remainder past ACCUM_OFFSET, a multiple of 4
    /// with `vgprs + agprs` a multiple of 8.
    pub agprs: u16,
    /// SGPRs the handler saves, a multiple of 16, 16..=128 (GPR_ALLOC.SGPR_SIZE, whose 16-SGPR
    /// blocks do not count the 16 TTMPs). VCC, XNACK_MASK and FLAT_SCRATCH are the last six of
    /// `min(sgprs, 108)`.
    pub sgprs: u16,
    /// The workgroup's LDS, a multiple of [`LDS_GRANULE`], at most [`LDS_MAX`].
    pub lds_bytes: u32,
}

impl Alloc {
    /// The allocation a kernel descriptor asks for: `rsrc1` is COMPUTE_PGM_RSRC1 (VGPRS in
    /// bits 5:0, SGPRS in bits 9:6), `rsrc3` COMPUTE_PGM_RSRC3 (gfx90a: ACCUM_OFFSET in bits
    /// 5:0), `lds_bytes` the workgroup's LDS (the descriptor's group segment plus the dispatch
    /// packet's, rounded up to [`LDS_GRANULE`]).
    ///
    /// Granules (LLVM AMDGPUUsage, "compute_pgm_rsrc1"): gfx908 VGPRs `(v + 1) * 4` (and as
    /// many AccVGPRs), gfx90a the unified file `(v + 1) * 8` with `(accum_offset + 1) * 4`
    /// architectural; GFX9 SGPRs `(s + 1) * 16`.
    pub fn from_descriptor(
        target: Target,
        rsrc1: u32,
        rsrc3: u32,
        lds_bytes: u32,
    ) -> Result<Alloc> {
        let v = rsrc1 & 0x3f;
        let sgprs = (((rsrc1 >> 6) & 0xf) + 1) * 16;
        let (vgprs, agprs) = match target {
            Target::Gfx908 => ((v + 1) * 4, (v + 1) * 4),
            Target::Gfx90a | Target::Gfx942 => {
                let total = (v + 1) * 8;
                let arch = ((rsrc3 & 0x3f) + 1) * 4;
                if arch > total {
                    return Err(Error::new(
                        "kernel descriptor ACCUM_OFFSET",
                        format!("{arch} architectural VGPRs exceed the {total} allocated"),
                    ));
                }
                (arch, total - arch)
            }
        };
        let lds = lds_bytes
            .checked_next_multiple_of(LDS_GRANULE)
            .unwrap_or(u32::MAX);
        let a = Alloc {
            vgprs: vgprs.min(u16::MAX as u32) as u16,
            agprs: agprs.min(u16::MAX as u32) as u16,
            sgprs: sgprs as u16,
            lds_bytes: lds,
        };
        a.check(target)?;
        Ok(a)
    }

    /// The allocation the handler reads back with s_getreg: GPR_ALLOC (gfx908: VGPR_SIZE in
    /// bits 13:8, `(n + 1) * 4`; gfx90a: the unified VGPR_SIZE in bits 11:6, `(n + 1) * 8`,
    /// and ACCV_OFFSET in bits 17:12, `(n + 1) * 4`; both: SGPR_SIZE in bits 26:24,
    /// `(n + 1) * 16`) and LDS_ALLOC (LDS_SIZE in bits 20:12, 64-dword granules).
    pub fn from_hwregs(target: Target, gpr_alloc: u32, lds_alloc: u32) -> Result<Alloc> {
        let sgprs = (((gpr_alloc >> 24) & 0x7) + 1) * 16;
        let (vgprs, agprs) = match target {
            Target::Gfx908 => {
                let n = (((gpr_alloc >> 8) & 0x3f) + 1) * 4;
                (n, n)
            }
            Target::Gfx90a | Target::Gfx942 => {
                let total = (((gpr_alloc >> 6) & 0x3f) + 1) * 8;
                let arch = (((gpr_alloc >> 12) & 0x3f) + 1) * 4;
                if arch > total {
                    return Err(Error::new(
                        "GPR_ALLOC.ACCV_OFFSET",
                        format!("{arch} architectural VGPRs exceed the {total} allocated"),
                    ));
                }
                (arch, total - arch)
            }
        };
        let a = Alloc {
            vgprs: vgprs as u16,
            agprs: agprs as u16,
            sgprs: sgprs as u16,
            lds_bytes: ((lds_alloc >> 12) & 0x1ff) * LDS_GRANULE,
        };
        a.check(target)?;
        Ok(a)
    }

    /// GPR_ALLOC as s_getreg would read it for this allocation (base fields zero).
    pub fn gpr_alloc(&self, target: Target) -> u32 {
        let sgpr = (self.sgprs as u32 / 16 - 1) << 24;
        match target {
            Target::Gfx908 => ((self.vgprs as u32 / 4 - 1) << 8) | sgpr,
            Target::Gfx90a | Target::Gfx942 => {
                let total = (self.vgprs as u32 + self.agprs as u32) / 8 - 1;
                (total << 6) | ((self.vgprs as u32 / 4 - 1) << 12) | sgpr
            }
        }
    }

    /// LDS_ALLOC as s_getreg would read it (base zero).
    pub fn lds_alloc(&self) -> u32 {
        (self.lds_bytes / LDS_GRANULE) << 12
    }

    /// Refuses an allocation the hardware cannot have, naming the field.
    pub fn check(&self, target: Target) -> Result<()> {
        let (v, a, s) = (self.vgprs as u32, self.agprs as u32, self.sgprs as u32);
        if v == 0 || v > 256 || !v.is_multiple_of(4) {
            return Err(Error::new(
                "vgprs",
                format!("{v} is not a multiple of 4 in 4..=256"),
            ));
        }
        let agprs_ok = match target {
            Target::Gfx908 => a == v,
            Target::Gfx90a | Target::Gfx942 => {
                a <= 256 && a.is_multiple_of(4) && (v + a).is_multiple_of(8)
            }
        };
        if !agprs_ok {
            return Err(Error::new(
                "agprs",
                format!("{a} AccVGPRs beside {v} VGPRs is no {target:?} allocation"),
            ));
        }
        if s == 0 || s > 128 || !s.is_multiple_of(16) {
            return Err(Error::new(
                "sgprs",
                format!("{s} is not a multiple of 16 in 16..=128"),
            ));
        }
        if self.lds_bytes > LDS_MAX || !self.lds_bytes.is_multiple_of(LDS_GRANULE) {
            return Err(Error::new(
                "lds_bytes",
                format!(
                    "{} is not a multiple of {LDS_GRANULE} up to {LDS_MAX}",
                    self.lds_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Offsets within one wave's saved block, from the address the SPI gives the wave: VGPRs at
/// 0, AccVGPRs after them, then SGPRs, HWREGs, TTMPs, and for the first wave of a workgroup
/// the LDS; then [`WAVE_GAP`] bytes before the next wave's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaveBlock {
    pub agpr: usize,
    pub sgpr: usize,
    pub hwreg: usize,
    pub ttmp: usize,
    pub lds: usize,
    /// Bytes from the block's start to the next wave's block, without LDS.
    pub slot: usize,
    pub lds_bytes: usize,
}

impl WaveBlock {
    /// The handler's `get_vgpr_size_bytes` counts `vgprs + agprs` (doubled VGPR_SIZE on
    /// gfx908, the unified VGPR_SIZE on gfx90a); SGPRs follow at that size, HWREGs at
    /// `size(VGPR) + size(SGPR)`, LDS at `size(VGPR) + size(SGPR) + 128`.
    pub fn of(alloc: &Alloc) -> WaveBlock {
        let agpr = alloc.vgprs as usize * VGPR_BYTES;
        let sgpr = agpr + alloc.agprs as usize * VGPR_BYTES;
        let hwreg = sgpr + alloc.sgprs as usize * 4;
        let ttmp = hwreg + HWREG_BYTES;
        let lds = ttmp + TTMP_BYTES;
        WaveBlock {
            agpr,
            sgpr,
            hwreg,
            ttmp,
            lds,
            slot: lds + WAVE_GAP,
            lds_bytes: alloc.lds_bytes as usize,
        }
    }

    /// Bytes the wave takes in the wave area, LDS included when it carries its workgroup's.
    pub fn slot_bytes(&self, first_of_group: bool) -> usize {
        self.slot + if first_of_group { self.lds_bytes } else { 0 }
    }
}

/// `struct kfd_context_save_area_header` at offset 0 of each XCC's context save area
/// (40 bytes, libhsakmt's SIZEOF_HSA_USER_CONTEXT_SAVE_AREA_HEADER). libhsakmt fills the
/// debug and error fields at queue creation; KFD's `get_wave_state` writes only the first four
/// after a save: `control_stack_offset` = CP_HQD_CNTL_STACK_OFFSET (the control stack grows
/// down from `ctl_stack_size`), `control_stack_size` = the bytes used,
/// `wave_state_offset` = CP_HQD_WG_STATE_OFFSET (the wave area grows up from `ctl_stack_size`,
/// this is its end), `wave_state_size` = the bytes used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub control_stack_offset: u32,
    pub control_stack_size: u32,
    pub wave_state_offset: u32,
    pub wave_state_size: u32,
    pub debug_offset: u32,
    pub debug_size: u32,
    pub err_payload_addr: u64,
    pub err_event_id: u32,
    pub reserved1: u32,
}

impl Header {
    pub const SIZE: usize = 40;

    pub fn read(area: &[u8]) -> Result<Header> {
        if area.len() < Self::SIZE {
            return Err(Error::new(
                "header",
                format!(
                    "the area has {} bytes, the header needs {}",
                    area.len(),
                    Self::SIZE
                ),
            ));
        }
        Ok(Header {
            control_stack_offset: le::u32(area, 0),
            control_stack_size: le::u32(area, 4),
            wave_state_offset: le::u32(area, 8),
            wave_state_size: le::u32(area, 12),
            debug_offset: le::u32(area, 16),
            debug_size: le::u32(area, 20),
            err_payload_addr: le::u64(area, 24),
            err_event_id: le::u32(area, 32),
            reserved1: le::u32(area, 36),
        })
    }

    /// Writes the four `wave_state` fields, as KFD does, leaving libhsakmt's fields alone.
    pub fn write_wave_state(&self, area: &mut [u8]) {
        le::put32(area, 0, self.control_stack_offset);
        le::put32(area, 4, self.control_stack_size);
        le::put32(area, 8, self.wave_state_offset);
        le::put32(area, 12, self.wave_state_size);
    }

    /// Writes all 40 bytes.
    pub fn write(&self, area: &mut [u8]) {
        self.write_wave_state(area);
        le::put32(area, 16, self.debug_offset);
        le::put32(area, 20, self.debug_size);
        le::put64(area, 24, self.err_payload_addr);
        le::put32(area, 32, self.err_event_id);
        le::put32(area, 36, self.reserved1);
    }
}

/// KFD's per-CU budget for a workgroup's saved state (`WG_CONTEXT_DATA_SIZE_PER_CU`):
/// VGPRs 0x80000 on gfx908 and gfx90a (`kfd_get_vgpr_size_per_cu`: ARCTURUS, ALDEBARAN),
/// SGPRs 0x4000, LDS 0x10000 (`lds_size_in_kb << 10` in libhsakmt, 64 KiB on both), HWREGs
/// 0x1000.
pub const WG_DATA_PER_CU: u32 = 0x80000 + 0x4000 + 0x10000 + 0x1000;

/// The wave area KFD and libhsakmt size for `cus` CUs of one XCC:
/// `cus * WG_CONTEXT_DATA_SIZE_PER_CU`, page aligned. The context save area of one XCC is
/// `ctl_stack_size + wave_area_size` (KFD's `cwsr_size`, libhsakmt's
/// `ctx_save_restore_size`), where `ctl_stack_size = align(40 + 8 * waves + 8, 4096)` with
/// `waves = min(cus * 40, array_count / simd_arrays_per_engine * 512)` before GFX10
/// (kfd-abi's `criu::ctl_stack_size`). libhsakmt allocates `(ctx_save_restore_size +
/// debug_memory_size) * num_xcc`, `debug_memory_size = align(waves * 32, 64)`, and points each
/// header's `debug_offset` past the last XCC's area.
pub fn wave_area_size(cus: u32) -> Option<u32> {
    cus.checked_mul(WG_DATA_PER_CU)?
        .checked_next_multiple_of(4096)
}
