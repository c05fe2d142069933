//! What KFD writes into its CRIU private data beyond the record layouts of
//! [`crate::layout`]: the values a checkpoint can hold, so that a reader can
//! tell a blob KFD wrote from one it never would.  Facts from the kernel's
//! amdkfd (the MQD managers of GFX 9 to 12, the device queue manager's
//! checkpoint info, `kfd_queue_ctx_save_restore_size` and the event limits);
//! the kernel emulator writes blobs by them and criu-rocm checks images
//! against them.

/// `enum kfd_queue_type`: what a queue record's `type_` holds (the kernel's
/// own numbering, not the CREATE_QUEUE ioctl's; AQL is the `format`).
pub mod queue_type {
    /// A compute queue (PM4 or AQL).
    pub const COMPUTE: u32 = 0;
    /// An SDMA queue on a PCIe engine.
    pub const SDMA: u32 = 1;
    /// The kernel's own interface queue (never a process').
    pub const HIQ: u32 = 2;
    /// The kernel's debug interface queue (never a process').
    pub const DIQ: u32 = 3;
    /// An SDMA queue on an XGMI engine.
    pub const SDMA_XGMI: u32 = 4;
    /// An SDMA queue on an engine the process chose.
    pub const SDMA_BY_ENG_ID: u32 = 5;

    /// Whether a process can own a queue of type `t`.
    pub const fn is_process_queue(t: u32) -> bool {
        matches!(t, COMPUTE | SDMA | SDMA_XGMI | SDMA_BY_ENG_ID)
    }

    /// Whether `t` is one of the SDMA types.
    pub const fn is_sdma(t: u32) -> bool {
        matches!(t, SDMA | SDMA_XGMI | SDMA_BY_ENG_ID)
    }
}

/// `enum kfd_queue_format`: a queue record's `format`.
pub mod queue_format {
    /// PM4 packets.
    pub const PM4: u32 = 0;
    /// AQL packets.
    pub const AQL: u32 = 1;
}

/// The compute MQD of one XCC: `sizeof(struct v9_mqd)`, and of the v10,
/// v11 and v12 compute MQDs, 512 dwords each.
pub const COMPUTE_MQD_SIZE: u32 = 2048;
/// The SDMA MQD: `sizeof(struct v9_sdma_mqd)`, and of the v10, v11 and
/// v12 SDMA MQDs, 128 dwords each.
pub const SDMA_MQD_SIZE: u32 = 512;
/// The most XCCs (compute partitions' dies) a KFD node has.
pub const MAX_XCC: u32 = 8;
/// `KFD_MAX_NUM_OF_QUEUES_PER_PROCESS`: queue ids and doorbell ids are below it.
pub const MAX_QUEUES_PER_PROCESS: u32 = 1024;
/// `KFD_SIGNAL_EVENT_LIMIT`: signal and debug event ids are below it.
pub const SIGNAL_EVENT_LIMIT: u32 = crate::sys::KFD_SIGNAL_EVENT_LIMIT;
/// `KFD_FIRST_NONSIGNAL_EVENT_ID`: the other events' ids start here.
pub const FIRST_NONSIGNAL_EVENT_ID: u32 = 0x8000_0000;
/// The last event type (`KFD_IOC_EVENT_MEMORY`).
pub const LAST_EVENT_TYPE: u32 = crate::sys::KFD_IOC_EVENT_MEMORY;
/// The page the control stack and context save sizes are aligned to.
const PAGE: u32 = 4096;

/// The MQD bytes KFD's checkpoint writes for a queue of type `qtype` on a
/// node of `num_xcc` XCCs (one compute MQD per XCC); `None` for a type a
/// process never owns.
pub const fn mqd_size(qtype: u32, num_xcc: u32) -> Option<u32> {
    match qtype {
        queue_type::COMPUTE => Some(COMPUTE_MQD_SIZE * num_xcc),
        t if queue_type::is_sdma(t) => Some(SDMA_MQD_SIZE),
        _ => None,
    }
}

/// What the control stack size of a node depends on (its topology
/// properties and XCC count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CwsrProps {
    /// `gfx_target_version` (90008 for gfx908).
    pub gfx_target_version: u32,
    /// SIMDs of the whole node.
    pub simd_count: u32,
    /// SIMDs per CU.
    pub simd_per_cu: u32,
    /// Shader arrays.
    pub array_count: u32,
    /// Shader arrays per shader engine.
    pub simd_arrays_per_engine: u32,
    /// XCCs of the node (1 but on multi-die GFX 9.4.3 parts).
    pub num_xcc: u32,
}

/// Representative `gfx_target_version`s of the generations whose control
/// stacks KFD sizes differently: before Navi10 (8 bytes per wave, at most
/// 40 waves per CU), GFX 10 (12 bytes, 32 waves, at most 0x7000 bytes) and
/// GFX 11 on (12 bytes, 32 waves).
pub const CWSR_GENERATIONS: [u32; 3] = [90000, 100100, 110000];

/// The control stack size of one XCC's queue that KFD computes for a node
/// (and, from 6.12 on, requires at CREATE_QUEUE; libhsakmt computed the
/// same before): a header, 8 more bytes and a record per wave slot, page
/// aligned.  `None` for a node without CWSR (before GFX 8) or with
/// nonsensical counts.
pub fn ctl_stack_size(p: &CwsrProps) -> Option<u32> {
    let gfxv = p.gfx_target_version;
    if gfxv < 80001 || p.simd_per_cu == 0 || p.num_xcc == 0 {
        return None;
    }
    let cu = p.simd_count / p.simd_per_cu / p.num_xcc;
    let waves = if gfxv < 100100 {
        let per_array = p.array_count.checked_div(p.simd_arrays_per_engine)?;
        cu.checked_mul(40)?.min(per_array.checked_mul(512)?)
    } else {
        cu.checked_mul(32)?
    };
    let per_wave = if gfxv >= 100100 { 12 } else { 8 };
    let bytes = waves.checked_mul(per_wave)?.checked_add(8 + 40)?;
    let mut size = bytes.checked_next_multiple_of(PAGE)?;
    if gfxv / 10000 == 10 {
        size = size.min(0x7000);
    }
    Some(size)
}

/// KFD's per-CU budget for the VGPRs of a node's saved workgroups
/// (`kfd_get_vgpr_size_per_cu`): 512 KiB on GFX 9.0.8, 9.0.10, 9.4.2 and
/// 9.5.0, 384 KiB on GFX 11.0.0/1 and 12, 256 KiB on the others.
const fn vgpr_size_per_cu(gfxv: u32) -> u32 {
    match gfxv {
        90008 | 90010 | 90402 | 90500 => 0x80000,
        110000 | 110001 | 120000 | 120001 => 0x60000,
        _ => 0x40000,
    }
}

/// The context save area size of one XCC's queue that KFD computes for a
/// node (the topology's `cwsr_size`, which Linux 6.12 on requires at
/// CREATE_QUEUE; libhsakmt computed the same before): the control stack,
/// then per CU its VGPRs, 16 KiB of SGPRs, 64 KiB of LDS and 4 KiB of
/// hardware registers, page aligned.  `None` where [`ctl_stack_size`] is.
pub fn cwsr_size(p: &CwsrProps) -> Option<u32> {
    cwsr_size_with(p, vgpr_size_per_cu(p.gfx_target_version))
}

/// The control stack and, per CU, `vgpr` bytes of VGPRs, 16 KiB of SGPRs,
/// 64 KiB of LDS and 4 KiB of hardware registers, page aligned.
fn cwsr_size_with(p: &CwsrProps, vgpr: u32) -> Option<u32> {
    let ctl = ctl_stack_size(p)?;
    let cu = p.simd_count / p.simd_per_cu / p.num_xcc;
    let per_cu = vgpr + 0x4000 + 0x10000 + 0x1000;
    let wg_data = cu.checked_mul(per_cu)?.checked_next_multiple_of(PAGE)?;
    ctl.checked_add(wg_data)
}

/// The context save areas a queue of the node may have been created
/// with: KFD's [`cwsr_size`] first, then on GFX 9.4 parts the one a
/// libhsakmt older than them computes (it budgets 256 KiB of VGPRs per CU
/// for a generation it does not know; kernels before 6.12 took it).
/// Empty where [`cwsr_size`] is `None`.
pub fn cwsr_sizes(p: &CwsrProps) -> Vec<u32> {
    let mut sizes: Vec<u32> = cwsr_size(p).into_iter().collect();
    if p.gfx_target_version / 100 == 904 {
        sizes.extend(cwsr_size_with(p, 0x4_0000).filter(|s| !sizes.contains(s)));
    }
    sizes
}

/// The end-of-pipe buffer of a compute queue that KFD computes for a node
/// of `gfx_target_version` (its `eop_buffer_size`, required of a queue's
/// `eop_ring_buffer_size` from 6.12 on): 32 KiB on Tonga, a page on every
/// other GFX 8 and later GPU; `None` before GFX 8.
pub const fn eop_buffer_size(gfx_target_version: u32) -> Option<u32> {
    match gfx_target_version {
        80002 => Some(0x8000),
        v if v >= 80000 => Some(PAGE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(gfxv: u32, cus: u32, arrays: u32, per_engine: u32, xcc: u32) -> CwsrProps {
        CwsrProps {
            gfx_target_version: gfxv,
            simd_count: cus * 4,
            simd_per_cu: 4,
            array_count: arrays,
            simd_arrays_per_engine: per_engine,
            num_xcc: xcc,
        }
    }

    #[test]
    fn control_stacks_as_kfd_sizes_them() {
        // MI100: 120 CUs, 8 arrays of 1 per engine: 4096 of 4800 waves * 8 + 48, 9 pages.
        assert_eq!(ctl_stack_size(&props(90008, 120, 8, 1, 1)), Some(0x9000));
        // Few arrays cap the waves: 2 arrays / 2 per engine * 512 waves.
        assert_eq!(ctl_stack_size(&props(90000, 64, 2, 2, 1)), Some(0x2000));
        // Navi21: 80 CUs * 32 waves * 12 bytes, over the GFX 10 limit.
        assert_eq!(ctl_stack_size(&props(100300, 80, 8, 2, 1)), Some(0x7000));
        // GFX 11: 96 CUs * 32 * 12 + 48 = 36912, 10 pages.
        assert_eq!(ctl_stack_size(&props(110000, 96, 12, 2, 1)), Some(0xa000));
        // MI300X: 304 CUs over 8 XCCs.
        assert_eq!(ctl_stack_size(&props(90402, 304, 32, 4, 8)), Some(0x3000));
        assert_eq!(ctl_stack_size(&props(80000, 8, 1, 1, 1)), None);
        assert_eq!(ctl_stack_size(&props(90008, 8, 1, 0, 1)), None);
    }

    #[test]
    fn context_save_areas_of_cu_counts_and_eop_buffers() {
        // MI100: 9 pages of control stack, 120 CUs of 0x95000.
        assert_eq!(
            cwsr_size(&props(90008, 120, 8, 1, 1)),
            Some(0x9000 + 120 * 0x9_5000)
        );
        // MI210 (104 CUs) and MI250X's GCD (110 CUs): one control stack
        // size (4096 waves), two save areas.
        let mi210 = props(90010, 104, 8, 1, 1);
        let gcd = props(90010, 110, 8, 1, 1);
        assert_eq!(ctl_stack_size(&mi210), ctl_stack_size(&gcd));
        assert_ne!(cwsr_size(&mi210), cwsr_size(&gcd));
        // MI300X: 38 CUs per XCC of 0x95000 after 3 pages.
        assert_eq!(
            cwsr_size(&props(90402, 304, 32, 4, 8)),
            Some(0x3000 + 38 * 0x9_5000)
        );
        // Other gfx9: 256 KiB of VGPRs per CU; GFX 11.0.0: 384 KiB.
        assert_eq!(
            cwsr_size(&props(90000, 64, 2, 2, 1)),
            Some(0x2000 + 64 * 0x5_5000)
        );
        assert_eq!(
            cwsr_size(&props(110000, 96, 12, 2, 1)),
            Some(0xa000 + 96 * 0x7_5000)
        );
        // An older libhsakmt's on GFX 9.4 only.
        assert_eq!(
            cwsr_sizes(&props(90402, 304, 32, 4, 8)),
            [0x3000 + 38 * 0x9_5000, 0x3000 + 38 * 0x5_5000]
        );
        assert_eq!(cwsr_sizes(&mi210), [0x9000 + 104 * 0x9_5000]);
        assert_eq!(cwsr_size(&props(80000, 8, 1, 1, 1)), None);
        assert_eq!(eop_buffer_size(90008), Some(4096));
        assert_eq!(eop_buffer_size(80002), Some(0x8000));
        assert_eq!(eop_buffer_size(70000), None);
    }

    #[test]
    fn mqd_sizes() {
        assert_eq!(mqd_size(queue_type::COMPUTE, 1), Some(2048));
        assert_eq!(mqd_size(queue_type::COMPUTE, 8), Some(16384));
        assert_eq!(mqd_size(queue_type::SDMA_XGMI, 8), Some(512));
        assert_eq!(mqd_size(queue_type::HIQ, 1), None);
    }
}
