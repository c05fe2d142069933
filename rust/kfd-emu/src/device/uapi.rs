//! The guest-visible ABI as the device model uses it.  Struct layouts,
//! request numbers and uapi constants all come from `kfd-abi` (bindgen
//! over linux/kfd_ioctl.h and amdgpu_drm.h, plus its priv-blob layouts);
//! this module only adds the byte-level decoding of argument buffers and
//! what is the emulator's own: its mmap offset encoding, apertures and
//! the SDMA v4 opcodes.

use kfd_abi::ioctl;
pub use kfd_abi::layout;
pub use kfd_abi::sys;

/// KFD uapi major version reported by GET_VERSION (the minor is the
/// profile's, `crate::profile::Profile::kfd_minor_version`).
pub const KFD_MAJOR: u32 = sys::KFD_IOCTL_MAJOR_VERSION;

/// KFD ioctl numbers (`_IOC_NR`) and the kernel's struct size for each.
pub mod kfd {
    use super::ioctl::{self, *};

    const fn n(cmd: u32) -> u32 {
        ioctl::nr(cmd) as u32
    }

    pub const GET_VERSION: u32 = n(AMDKFD_IOC_GET_VERSION);
    pub const CREATE_QUEUE: u32 = n(AMDKFD_IOC_CREATE_QUEUE);
    pub const DESTROY_QUEUE: u32 = n(AMDKFD_IOC_DESTROY_QUEUE);
    pub const SET_MEMORY_POLICY: u32 = 0x04;
    pub const GET_CLOCK_COUNTERS: u32 = 0x05;
    pub const GET_PROCESS_APERTURES: u32 = 0x06;
    pub const UPDATE_QUEUE: u32 = n(AMDKFD_IOC_UPDATE_QUEUE);
    pub const CREATE_EVENT: u32 = n(AMDKFD_IOC_CREATE_EVENT);
    pub const DESTROY_EVENT: u32 = n(AMDKFD_IOC_DESTROY_EVENT);
    pub const SET_EVENT: u32 = n(AMDKFD_IOC_SET_EVENT);
    pub const RESET_EVENT: u32 = n(AMDKFD_IOC_RESET_EVENT);
    pub const WAIT_EVENTS: u32 = n(AMDKFD_IOC_WAIT_EVENTS);
    /// The four deprecated debugger requests (0x0d..=0x10).
    pub const DBG_FIRST: u32 = 0x0d;
    pub const DBG_LAST: u32 = 0x10;
    pub const SET_SCRATCH_BACKING_VA: u32 = 0x11;
    pub const GET_TILE_CONFIG: u32 = 0x12;
    pub const SET_TRAP_HANDLER: u32 = 0x13;
    pub const GET_PROCESS_APERTURES_NEW: u32 = n(AMDKFD_IOC_GET_PROCESS_APERTURES_NEW);
    pub const ACQUIRE_VM: u32 = n(AMDKFD_IOC_ACQUIRE_VM);
    pub const ALLOC_MEMORY_OF_GPU: u32 = n(AMDKFD_IOC_ALLOC_MEMORY_OF_GPU);
    pub const FREE_MEMORY_OF_GPU: u32 = n(AMDKFD_IOC_FREE_MEMORY_OF_GPU);
    pub const MAP_MEMORY_TO_GPU: u32 = n(AMDKFD_IOC_MAP_MEMORY_TO_GPU);
    pub const UNMAP_MEMORY_FROM_GPU: u32 = n(AMDKFD_IOC_UNMAP_MEMORY_FROM_GPU);
    pub const SET_CU_MASK: u32 = 0x1a;
    pub const GET_QUEUE_WAVE_STATE: u32 = 0x1b;
    pub const GET_DMABUF_INFO: u32 = 0x1c;
    pub const IMPORT_DMABUF: u32 = 0x1d;
    pub const ALLOC_QUEUE_GWS: u32 = 0x1e;
    pub const SMI_EVENTS: u32 = 0x1f;
    pub const SVM: u32 = 0x20;
    pub const SET_XNACK_MODE: u32 = n(AMDKFD_IOC_SET_XNACK_MODE);
    pub const CRIU_OP: u32 = n(AMDKFD_IOC_CRIU_OP);
    pub const AVAILABLE_MEMORY: u32 = n(AMDKFD_IOC_AVAILABLE_MEMORY);
    /// KFD 1.12.
    pub const EXPORT_DMABUF: u32 = n(AMDKFD_IOC_EXPORT_DMABUF);
    /// KFD 1.13.
    pub const RUNTIME_ENABLE: u32 = n(AMDKFD_IOC_RUNTIME_ENABLE);
    pub const DBG_TRAP: u32 = n(AMDKFD_IOC_DBG_TRAP);
    /// The first request number of the 1.11 table (AMDKFD_COMMAND_START).
    pub const COMMAND_START: u32 = 0x01;
    /// First nr past the 1.11 table (AMDKFD_COMMAND_END; see
    /// [`command_end`] for later versions): the kernel
    /// answers ENOTTY for it and everything above, and for nr 0.
    pub const COMMAND_END: u32 = 0x24;

    /// AMDKFD_COMMAND_END of KFD 1.`minor`: EXPORT_DMABUF came with 1.12,
    /// RUNTIME_ENABLE and DBG_TRAP with 1.13; 1.14 to 1.18 added none.
    pub const fn command_end(minor: u32) -> u32 {
        match minor {
            ..=11 => COMMAND_END,
            12 => EXPORT_DMABUF + 1,
            _ => DBG_TRAP + 1,
        }
    }

    /// The kernel's argument size for `nr` (None: not in the 1.18 table).
    pub fn arg_size(nr: u32) -> Option<usize> {
        use super::sys;
        use std::mem::size_of;
        Some(match nr {
            GET_VERSION => size_of::<sys::kfd_ioctl_get_version_args>(),
            CREATE_QUEUE => size_of::<sys::kfd_ioctl_create_queue_args>(),
            DESTROY_QUEUE => size_of::<sys::kfd_ioctl_destroy_queue_args>(),
            SET_MEMORY_POLICY => size_of::<sys::kfd_ioctl_set_memory_policy_args>(),
            GET_CLOCK_COUNTERS => size_of::<sys::kfd_ioctl_get_clock_counters_args>(),
            GET_PROCESS_APERTURES => size_of::<sys::kfd_ioctl_get_process_apertures_args>(),
            UPDATE_QUEUE => size_of::<sys::kfd_ioctl_update_queue_args>(),
            CREATE_EVENT => size_of::<sys::kfd_ioctl_create_event_args>(),
            DESTROY_EVENT => size_of::<sys::kfd_ioctl_destroy_event_args>(),
            SET_EVENT => size_of::<sys::kfd_ioctl_set_event_args>(),
            RESET_EVENT => size_of::<sys::kfd_ioctl_reset_event_args>(),
            WAIT_EVENTS => size_of::<sys::kfd_ioctl_wait_events_args>(),
            DBG_FIRST..=DBG_LAST => size_of::<sys::kfd_ioctl_dbg_register_args>(),
            SET_SCRATCH_BACKING_VA => size_of::<sys::kfd_ioctl_set_scratch_backing_va_args>(),
            GET_TILE_CONFIG => size_of::<sys::kfd_ioctl_get_tile_config_args>(),
            SET_TRAP_HANDLER => size_of::<sys::kfd_ioctl_set_trap_handler_args>(),
            GET_PROCESS_APERTURES_NEW => size_of::<sys::kfd_ioctl_get_process_apertures_new_args>(),
            ACQUIRE_VM => size_of::<sys::kfd_ioctl_acquire_vm_args>(),
            ALLOC_MEMORY_OF_GPU => size_of::<sys::kfd_ioctl_alloc_memory_of_gpu_args>(),
            FREE_MEMORY_OF_GPU => size_of::<sys::kfd_ioctl_free_memory_of_gpu_args>(),
            MAP_MEMORY_TO_GPU => size_of::<sys::kfd_ioctl_map_memory_to_gpu_args>(),
            UNMAP_MEMORY_FROM_GPU => size_of::<sys::kfd_ioctl_unmap_memory_from_gpu_args>(),
            SET_CU_MASK => size_of::<sys::kfd_ioctl_set_cu_mask_args>(),
            GET_QUEUE_WAVE_STATE => size_of::<sys::kfd_ioctl_get_queue_wave_state_args>(),
            GET_DMABUF_INFO => size_of::<sys::kfd_ioctl_get_dmabuf_info_args>(),
            IMPORT_DMABUF => size_of::<sys::kfd_ioctl_import_dmabuf_args>(),
            ALLOC_QUEUE_GWS => size_of::<sys::kfd_ioctl_alloc_queue_gws_args>(),
            SMI_EVENTS => size_of::<sys::kfd_ioctl_smi_events_args>(),
            SVM => size_of::<sys::kfd_ioctl_svm_args>(),
            SET_XNACK_MODE => size_of::<sys::kfd_ioctl_set_xnack_mode_args>(),
            CRIU_OP => size_of::<sys::kfd_ioctl_criu_args>(),
            AVAILABLE_MEMORY => size_of::<sys::kfd_ioctl_get_available_memory_args>(),
            EXPORT_DMABUF => size_of::<super::layout::kfd_ioctl_export_dmabuf_args>(),
            RUNTIME_ENABLE => size_of::<super::layout::kfd_ioctl_runtime_enable_args>(),
            DBG_TRAP => size_of::<super::layout::kfd_ioctl_dbg_trap_args>(),
            _ => return None,
        })
    }
}

/// ALLOC_MEMORY_OF_GPU flags.
pub mod alloc {
    use super::sys;
    pub const VRAM: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_VRAM;
    pub const GTT: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_GTT;
    pub const USERPTR: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_USERPTR;
    pub const DOORBELL: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL;
    pub const MMIO_REMAP: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP;
    pub const TYPE_MASK: u32 = VRAM | GTT | USERPTR | DOORBELL | MMIO_REMAP;
    pub const PUBLIC: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC;
    pub const WRITABLE: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE;
    pub const EXECUTABLE: u32 = sys::KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE;
}

pub mod queue_type {
    use super::sys;
    pub const COMPUTE: u32 = sys::KFD_IOC_QUEUE_TYPE_COMPUTE;
    pub const SDMA: u32 = sys::KFD_IOC_QUEUE_TYPE_SDMA;
    pub const COMPUTE_AQL: u32 = sys::KFD_IOC_QUEUE_TYPE_COMPUTE_AQL;
    pub const SDMA_XGMI: u32 = sys::KFD_IOC_QUEUE_TYPE_SDMA_XGMI;
    /// KFD 1.17: an SDMA queue on the engine `sdma_engine_id` names.
    pub const SDMA_BY_ENG_ID: u32 = 4;
    /// Where CREATE_QUEUE's `sdma_engine_id` is (KFD 1.17 grew the
    /// arguments from 88 to 96 bytes).
    pub const SDMA_ENGINE_ID_AT: usize = 88;
}

pub mod event_type {
    use super::sys;
    pub const SIGNAL: u32 = sys::KFD_IOC_EVENT_SIGNAL;
    pub const DEBUG: u32 = sys::KFD_IOC_EVENT_DEBUG_EVENT;
    pub const MEMORY: u32 = sys::KFD_IOC_EVENT_MEMORY;
    pub const LAST: u32 = sys::KFD_IOC_EVENT_MEMORY;
}

pub use kfd_abi::layout::criu_op;

pub const KFD_INVALID_FD: u32 = layout::KFD_INVALID_FD;
pub const WAIT_COMPLETE: u32 = sys::KFD_IOC_WAIT_RESULT_COMPLETE;
pub const WAIT_TIMEOUT: u32 = sys::KFD_IOC_WAIT_RESULT_TIMEOUT;
pub const WAIT_FAIL: u32 = sys::KFD_IOC_WAIT_RESULT_FAIL;
pub const TIMEOUT_INFINITE: u32 = 0xffff_ffff;
/// Signal event slots in a signal page, 8 bytes each.
pub const SIGNAL_EVENT_LIMIT: u32 = sys::KFD_SIGNAL_EVENT_LIMIT;
pub const SIGNAL_PAGE_SIZE: u64 = SIGNAL_EVENT_LIMIT as u64 * 8;
pub const UNSIGNALED_SLOT: u64 = u64::MAX;
/// Non-signal event ids start here (KFD_FIRST_NONSIGNAL_EVENT_ID).
pub const FIRST_NONSIGNAL_EVENT_ID: u32 = 0x8000_0000;
pub const MAX_QUEUES_PER_PROCESS: u32 = 1024;

/// Per-process doorbell slice per GPU (SOC15: 2 pages of 8-byte doorbells).
pub const DOORBELL_SLICE: u64 = 8192;
pub const PAGE: u64 = 4096;

/// Apertures the emulator reports (GFX9 dGPU values).
pub const GPUVM_BASE: u64 = 0x100_0000;
pub const GPUVM_LIMIT: u64 = (1 << 47) - 1;
pub const LDS_BASE: u64 = 1 << 48;
pub const SCRATCH_BASE: u64 = 2 << 48;

/// CRIU private blob (B.5): version 1 with MAX_GPU_INSTANCE = 64, so BO
/// records are the 272-byte form; criu-rocm detects the stride from the
/// size equation.
pub mod priv_blob {
    use super::layout;
    use std::mem::size_of;
    pub type BoPriv = layout::kfd_criu_bo_priv_data64;
    pub const VERSION: u32 = layout::KFD_CRIU_PRIV_VERSION;
    pub const PROCESS: usize = size_of::<layout::kfd_criu_process_priv_data>();
    pub const DEVICE: usize = size_of::<layout::kfd_criu_device_priv_data>();
    pub const MAX_GPU_INSTANCE: usize = 64;
    pub const BO: usize = size_of::<BoPriv>();
    pub const QUEUE: usize = size_of::<layout::kfd_criu_queue_priv_data>();
    pub const EVENT: usize = size_of::<layout::kfd_criu_event_priv_data>();
    pub const OBJ_QUEUE: u32 = layout::object_type::QUEUE;
    pub const OBJ_EVENT: u32 = layout::object_type::EVENT;
    pub const OBJ_SVM_RANGE: u32 = layout::object_type::SVM_RANGE;
    pub const DEVICE_BUCKET: usize = size_of::<super::sys::kfd_criu_device_bucket>();
    pub const BO_BUCKET: usize = size_of::<super::sys::kfd_criu_bo_bucket>();
}

/// The emulator's /dev/kfd mmap offsets.  Real KFD puts the type in bits
/// 63..62, which a FUSE regular file refuses (EOVERFLOW), and finds the
/// process from `current` at mmap time, which FUSE never shows us.  So:
///
/// ```text
///  bit 63..62  0
///  bit 61..60  type: 1 doorbell, 2 events, 3 MMIO remap
///  bit 59..44  process slot (1..65535, unique among live processes)
///  bit 43..36  GPU index in the profile (0 for events)
///  bit 35..0   byte offset inside the object
/// ```
///
/// All of them are byte ranges of the one /dev/kfd memfd (sized 2^62).
///
/// A process gets a free slot when it opens /dev/kfd (round robin, like
/// pids).  Its CRIU blob records the slot, and RESTORE moves the restored
/// process back to it (`State::claim_slot`), so the offsets it mapped
/// before the checkpoint keep naming its own doorbells and events page,
/// whatever order the processes of a tree are restored in.
pub mod kfd_off {
    pub const DOORBELL: u64 = 1;
    pub const EVENTS: u64 = 2;
    pub const MMIO: u64 = 3;
    pub const MEMFD_SIZE: u64 = 1 << 62;
    /// Bytes of one type's range that belong to one process slot.
    pub const SLOT_SPAN: u64 = 1 << 44;
    /// Slots are 1..=MAX_SLOT (0 is never handed out).
    pub const MAX_SLOT: u32 = 0xffff;

    pub fn encode(ty: u64, slot: u32, gpu_index: usize, value: u64) -> u64 {
        (ty << 60) | ((slot as u64 & 0xffff) << 44) | ((gpu_index as u64 & 0xff) << 36) | value
    }
}

/// Render-node memfd layout: VRAM and GTT BOs get page-aligned byte ranges
/// handed out upward from 4 GiB (where DRM fake offsets live too), never
/// reused while the emulator runs, so offsets are device-wide unique.
pub const RENDER_OFFSET_BASE: u64 = 4 << 30;
pub const RENDER_MEMFD_SIZE: u64 = 1 << 46;

/// DRM ioctls on the render node.
pub mod drm {
    use super::ioctl;
    pub const IOCTL_TYPE: u8 = ioctl::DRM_IOCTL_BASE;
    pub const VERSION: u32 = ioctl::nr(ioctl::DRM_IOCTL_VERSION) as u32;
    pub const GET_CLIENT: u32 = ioctl::nr(ioctl::DRM_IOCTL_GET_CLIENT) as u32;
    pub const AMDGPU_INFO: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_INFO) as u32;
    pub const GEM_CLOSE: u32 = ioctl::nr(ioctl::DRM_IOCTL_GEM_CLOSE) as u32;
    pub const PRIME_HANDLE_TO_FD: u32 = ioctl::nr(ioctl::DRM_IOCTL_PRIME_HANDLE_TO_FD) as u32;
    pub const PRIME_FD_TO_HANDLE: u32 = ioctl::nr(ioctl::DRM_IOCTL_PRIME_FD_TO_HANDLE) as u32;
    pub const AMDGPU_CTX: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_CTX) as u32;
    pub const AMDGPU_BO_LIST: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_BO_LIST) as u32;
    pub const AMDGPU_CS: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_CS) as u32;
    pub const AMDGPU_GEM_VA: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_VA) as u32;
    pub const AMDGPU_WAIT_CS: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_WAIT_CS) as u32;
    pub const AMDGPU_GEM_USERPTR: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_USERPTR) as u32;
    pub const AMDGPU_GEM_CREATE: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_CREATE) as u32;
    pub const AMDGPU_GEM_MMAP: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_MMAP) as u32;
    pub const AMDGPU_GEM_METADATA: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_METADATA) as u32;
    pub const AMDGPU_GEM_WAIT_IDLE: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_WAIT_IDLE) as u32;
    pub const AMDGPU_GEM_OP: u32 = ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_OP) as u32;
    pub const AMDGPU_GEM_LIST_HANDLES: u32 =
        ioctl::nr(ioctl::DRM_IOCTL_AMDGPU_GEM_LIST_HANDLES) as u32;
    pub const GEM_CHANGE_HANDLE: u32 = ioctl::nr(ioctl::DRM_IOCTL_GEM_CHANGE_HANDLE) as u32;
    /// drm.h's numbers of core ioctls the model only refuses (their
    /// arguments are never read).
    pub const GET_UNIQUE: u32 = 0x01;
    pub const GET_MAGIC: u32 = 0x02;
    pub const GET_STATS: u32 = 0x06;
    pub const SET_VERSION: u32 = 0x07;
    pub const GEM_FLINK: u32 = 0x0a;
    pub const GEM_OPEN: u32 = 0x0b;
    pub const SET_CLIENT_CAP: u32 = 0x0d;
    pub const SET_UNIQUE: u32 = 0x10;
    pub const AUTH_MAGIC: u32 = 0x11;
    pub const BLOCK: u32 = 0x12;
    pub const UNBLOCK: u32 = 0x13;
    pub const SET_MASTER: u32 = 0x1e;
    pub const DROP_MASTER: u32 = 0x1f;
}

/// SDMA v4 opcodes (dw0 bits 7..0) and sub-opcodes (bits 15..8), as in
/// the kernel's vega10_sdma_pkt_open.h (SDMA 4.x: GFX9 and gfx942).
pub mod sdma {
    pub const OP_NOP: u32 = 0;
    pub const OP_COPY: u32 = 1;
    pub const OP_WRITE: u32 = 2;
    pub const OP_FENCE: u32 = 5;
    pub const OP_TRAP: u32 = 6;
    pub const OP_POLL_REGMEM: u32 = 8;
    pub const OP_ATOMIC: u32 = 10;
    pub const OP_CONST_FILL: u32 = 11;
    pub const OP_TIMESTAMP: u32 = 13;
    /// SDMA 5.2 and later: a GCR (cache flush/invalidate) request.
    pub const OP_GCR_REQ: u32 = 17;
    pub const SUBOP_USER_GCR: u32 = 1;
    pub const SUBOP_COPY_LINEAR: u32 = 0;
    pub const SUBOP_COPY_LINEAR_SUB_WIND: u32 = 4;
    pub const SUBOP_WRITE_LINEAR: u32 = 0;
    pub const SUBOP_TIMESTAMP_SET: u32 = 0;
    pub const SUBOP_TIMESTAMP_GET: u32 = 1;
    pub const SUBOP_TIMESTAMP_GET_GLOBAL: u32 = 2;
    /// POLL_REGMEM's retry count meaning "forever".
    pub const POLL_RETRY_FOREVER: u32 = 0xfff;

    /// ATOMIC operations: the TC_OP encoding of the GFX9 texture cache.
    /// Bit 5 selects 64 bits; the `_RTN` forms are 0x00..0x3f, the plain
    /// forms the same plus 0x40.  These are the low 5 bits.
    pub mod atomic {
        pub const SWAP: u32 = 7;
        pub const CMPSWAP: u32 = 8;
        pub const ADD: u32 = 15;
        pub const SUB: u32 = 16;
        pub const SMIN: u32 = 17;
        pub const UMIN: u32 = 18;
        pub const SMAX: u32 = 19;
        pub const UMAX: u32 = 20;
        pub const AND: u32 = 21;
        pub const OR: u32 = 22;
        pub const XOR: u32 = 23;
        pub const INC: u32 = 24;
        pub const DEC: u32 = 25;
        pub const BIT_64: u32 = 0x20;
        pub const NO_RETURN: u32 = 0x40;
    }
}

/// Types for which every byte pattern is a value: `#[repr(C)]` structs of
/// integers, arrays of them, unions of them or raw pointers.  Argument
/// buffers are decoded into these.
///
/// # Safety
///
/// Implement only for such types (no references, bools, enums, niches).
pub unsafe trait FromBytes: Copy + 'static {}

/// [`FromBytes`] types without implicit padding, so their bytes can be
/// read back.
///
/// # Safety
///
/// Implement only for `FromBytes` types whose fields (explicit `pad`
/// members included) cover every byte.
pub unsafe trait AsBytes: FromBytes {}

macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        // SAFETY: integers, or bindgen/kfd-abi structs whose members are
        // integers, integer arrays and explicit pads covering every byte
        // (kfd-abi asserts the sizes and offsets against the kernel's).
        $(unsafe impl FromBytes for $t {} unsafe impl AsBytes for $t {})*
    };
}

pod!(
    u32,
    u64,
    sys::kfd_ioctl_get_version_args,
    sys::kfd_ioctl_create_queue_args,
    sys::kfd_ioctl_destroy_queue_args,
    sys::kfd_ioctl_update_queue_args,
    sys::kfd_ioctl_set_memory_policy_args,
    sys::kfd_ioctl_get_clock_counters_args,
    sys::kfd_process_device_apertures,
    sys::kfd_ioctl_get_process_apertures_new_args,
    sys::kfd_ioctl_create_event_args,
    sys::kfd_ioctl_destroy_event_args,
    sys::kfd_ioctl_set_event_args,
    sys::kfd_ioctl_reset_event_args,
    sys::kfd_ioctl_wait_events_args,
    sys::kfd_ioctl_acquire_vm_args,
    sys::kfd_ioctl_alloc_memory_of_gpu_args,
    sys::kfd_ioctl_free_memory_of_gpu_args,
    sys::kfd_ioctl_map_memory_to_gpu_args,
    sys::kfd_ioctl_set_xnack_mode_args,
    sys::kfd_criu_device_bucket,
    sys::kfd_criu_bo_bucket,
    sys::kfd_ioctl_get_available_memory_args,
    sys::kfd_ioctl_get_process_apertures_args,
    sys::kfd_ioctl_dbg_register_args,
    sys::kfd_ioctl_set_scratch_backing_va_args,
    sys::kfd_ioctl_get_tile_config_args,
    sys::kfd_ioctl_set_trap_handler_args,
    sys::kfd_ioctl_set_cu_mask_args,
    sys::kfd_ioctl_get_queue_wave_state_args,
    sys::kfd_ioctl_get_dmabuf_info_args,
    sys::kfd_ioctl_import_dmabuf_args,
    sys::kfd_ioctl_alloc_queue_gws_args,
    sys::kfd_ioctl_smi_events_args,
    sys::kfd_hsa_memory_exception_data,
    sys::kfd_hsa_hw_exception_data,
    sys::drm_amdgpu_info_device,
    sys::drm_amdgpu_info_hw_ip,
    sys::drm_amdgpu_info_firmware,
    sys::drm_amdgpu_info_gds,
    sys::drm_amdgpu_info_vram_gtt,
    sys::drm_amdgpu_heap_info,
    sys::drm_amdgpu_memory_info,
    sys::drm_amdgpu_info_vce_clock_table,
    sys::drm_client,
    sys::drm_gem_close,
    sys::drm_prime_handle,
    sys::drm_amdgpu_gem_userptr,
    sys::drm_amdgpu_gem_va,
    sys::drm_amdgpu_ctx_in,
    sys::drm_amdgpu_bo_list_in,
    sys::drm_amdgpu_cs_in,
    sys::drm_amdgpu_cs_chunk,
    sys::drm_amdgpu_cs_chunk_ib,
    sys::drm_amdgpu_wait_cs_in,
    sys::drm_amdgpu_gem_create_in,
    sys::drm_amdgpu_gem_wait_idle_in,
    layout::gem618::drm_gem_change_handle,
    layout::gem618::drm_amdgpu_gem_op,
    layout::gem618::drm_amdgpu_gem_vm_entry,
    layout::gem618::drm_amdgpu_gem_list_handles,
    layout::gem618::drm_amdgpu_gem_list_handles_entry,
    layout::kfd_criu_process_priv_data,
    layout::kfd_criu_device_priv_data,
    layout::kfd_criu_queue_priv_data,
    layout::kfd_criu_event_priv_data,
    layout::kfd_ioctl_export_dmabuf_args,
    layout::kfd_ioctl_runtime_enable_args,
    layout::kfd_ioctl_dbg_trap_args,
);

macro_rules! from_bytes_only {
    ($($t:ty),* $(,)?) => {
        // SAFETY: integer, integer-array, union and raw-pointer members
        // only; these have implicit padding (tail or between members), so
        // they are decoded but written back field by field with `put`.
        $(unsafe impl FromBytes for $t {})*
    };
}

from_bytes_only!(
    sys::kfd_ioctl_criu_args,
    sys::kfd_event_data,
    sys::drm_version,
    sys::drm_amdgpu_info,
    sys::drm_amdgpu_gem_metadata,
    priv_blob::BoPriv,
);

/// Decodes `T` from the start of `b` like KFD copies arguments: the
/// minimum of both sizes, the rest zero.
pub fn decode<T: FromBytes>(b: &[u8]) -> T {
    let mut v = std::mem::MaybeUninit::<T>::zeroed();
    let n = b.len().min(size_of::<T>());
    // SAFETY: `v` has size_of::<T>() writable bytes, n is at most that and
    // at most b.len().
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), n) };
    // SAFETY: every byte is initialized (zeroed, then copied) and any byte
    // pattern is a T (FromBytes).
    unsafe { v.assume_init() }
}

/// The bytes of `v`.
pub fn bytes<T: AsBytes>(v: &T) -> &[u8] {
    // SAFETY: an AsBytes value is size_of::<T>() initialized bytes (no
    // implicit padding), borrowed for the slice's lifetime.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Encodes `v` as an ioctl answer of `out_size` bytes: truncated, or
/// zero-extended like KFD does for callers with larger structs.
pub fn encode<T: AsBytes>(v: &T, out_size: usize) -> Vec<u8> {
    let mut o = bytes(v).to_vec();
    o.resize(out_size, 0);
    o
}

/// Writes `v` at byte `off` of `buf` (offsets come from `offset_of!` on
/// the kfd-abi types); silently clipped to `buf`, like a short struct.
pub fn put<V: AsBytes>(buf: &mut [u8], off: usize, v: &V) {
    let b = bytes(v);
    if off < buf.len() {
        let n = b.len().min(buf.len() - off);
        buf[off..off + n].copy_from_slice(&b[..n]);
    }
}

/// Decodes the `i`-th `T` of an array in `b` (the caller checked bounds).
pub fn nth<T: FromBytes>(b: &[u8], i: usize) -> T {
    decode(&b[i * size_of::<T>()..(i + 1) * size_of::<T>()])
}

/// Appends the bytes of `v`.
pub fn push<T: AsBytes>(out: &mut Vec<u8>, v: &T) {
    out.extend_from_slice(bytes(v));
}

use std::mem::size_of;
