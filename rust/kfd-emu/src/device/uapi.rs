//! Guest-visible ABI facts: ioctl numbers, struct sizes and field offsets
//! (linux/kfd_ioctl.h 1.11 layouts, little endian), the emulator's mmap
//! offset encoding and the SDMA v4 packet encodings.
//!
//! Field access goes through [`Args`], a byte buffer zero-extended to the
//! kernel's struct size, so callers with shorter or longer structs are
//! treated like KFD treats them (copy the minimum, zero-fill the rest).

/// KFD uapi version reported by GET_VERSION (the bookworm header's).
pub const KFD_MAJOR: u32 = 1;
pub const KFD_MINOR: u32 = 11;

/// KFD ioctl numbers (`_IOC_NR`) and the kernel's struct size for each.
pub mod kfd {
    pub const GET_VERSION: u32 = 0x01;
    pub const CREATE_QUEUE: u32 = 0x02;
    pub const DESTROY_QUEUE: u32 = 0x03;
    pub const SET_MEMORY_POLICY: u32 = 0x04;
    pub const GET_CLOCK_COUNTERS: u32 = 0x05;
    pub const GET_PROCESS_APERTURES: u32 = 0x06;
    pub const UPDATE_QUEUE: u32 = 0x07;
    pub const CREATE_EVENT: u32 = 0x08;
    pub const DESTROY_EVENT: u32 = 0x09;
    pub const SET_EVENT: u32 = 0x0a;
    pub const RESET_EVENT: u32 = 0x0b;
    pub const WAIT_EVENTS: u32 = 0x0c;
    pub const GET_PROCESS_APERTURES_NEW: u32 = 0x14;
    pub const ACQUIRE_VM: u32 = 0x15;
    pub const ALLOC_MEMORY_OF_GPU: u32 = 0x16;
    pub const FREE_MEMORY_OF_GPU: u32 = 0x17;
    pub const MAP_MEMORY_TO_GPU: u32 = 0x18;
    pub const UNMAP_MEMORY_FROM_GPU: u32 = 0x19;
    pub const SET_XNACK_MODE: u32 = 0x21;
    pub const CRIU_OP: u32 = 0x22;
    pub const AVAILABLE_MEMORY: u32 = 0x23;
    /// First nr past the 1.11 table: the kernel answers EINVAL.
    pub const COMMAND_END: u32 = 0x24;

    /// The kernel's argument size for `nr` (None: no such ioctl in 1.11).
    pub fn arg_size(nr: u32) -> Option<usize> {
        Some(match nr {
            GET_VERSION => 8,
            CREATE_QUEUE => 88,
            DESTROY_QUEUE => 8,
            SET_MEMORY_POLICY => 32,
            GET_CLOCK_COUNTERS => 40,
            GET_PROCESS_APERTURES => 400,
            UPDATE_QUEUE => 24,
            CREATE_EVENT => 32,
            DESTROY_EVENT | SET_EVENT | RESET_EVENT => 8,
            WAIT_EVENTS => 24,
            GET_PROCESS_APERTURES_NEW => 16,
            ACQUIRE_VM => 8,
            ALLOC_MEMORY_OF_GPU => 40,
            FREE_MEMORY_OF_GPU => 8,
            MAP_MEMORY_TO_GPU | UNMAP_MEMORY_FROM_GPU => 24,
            SET_XNACK_MODE => 4,
            CRIU_OP => 56,
            AVAILABLE_MEMORY => 16,
            0x0d..=0x13 | 0x1a..=0x20 => 0,
            _ => return None,
        })
    }
}

/// ALLOC_MEMORY_OF_GPU flags.
pub mod alloc {
    pub const VRAM: u32 = 1 << 0;
    pub const GTT: u32 = 1 << 1;
    pub const USERPTR: u32 = 1 << 2;
    pub const DOORBELL: u32 = 1 << 3;
    pub const MMIO_REMAP: u32 = 1 << 4;
    pub const TYPE_MASK: u32 = 0x1f;
    pub const PUBLIC: u32 = 1 << 29;
}

pub mod queue_type {
    pub const COMPUTE: u32 = 0;
    pub const SDMA: u32 = 1;
    pub const COMPUTE_AQL: u32 = 2;
    pub const SDMA_XGMI: u32 = 3;
}

pub mod event_type {
    pub const SIGNAL: u32 = 0;
    pub const DEBUG: u32 = 5;
}

pub mod criu_op {
    pub const PROCESS_INFO: u32 = 0;
    pub const CHECKPOINT: u32 = 1;
    pub const UNPAUSE: u32 = 2;
    pub const RESTORE: u32 = 3;
    pub const RESUME: u32 = 4;
}

pub const KFD_INVALID_FD: u32 = 0xffff_ffff;
pub const WAIT_COMPLETE: u32 = 0;
pub const WAIT_TIMEOUT: u32 = 1;
pub const TIMEOUT_INFINITE: u32 = 0xffff_ffff;
/// Signal event slots in a signal page, 8 bytes each.
pub const SIGNAL_EVENT_LIMIT: u32 = 4096;
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

/// CRIU private blob (B.5): version 1, MAX_GPU_INSTANCE = 64, so a BO
/// record is the 272-byte form (the C struct is 8-aligned: 12 + 4*64 = 268
/// rounded up); criu-rocm detects the stride from the size equation.
pub mod priv_blob {
    pub const VERSION: u32 = 1;
    pub const PROCESS: usize = 8;
    pub const DEVICE: usize = 8;
    pub const MAX_GPU_INSTANCE: usize = 64;
    pub const BO: usize = (12 + 4 * MAX_GPU_INSTANCE + 7) & !7;
    pub const QUEUE: usize = 120;
    pub const EVENT: usize = 64;
    pub const OBJ_QUEUE: u32 = 0;
    pub const OBJ_EVENT: u32 = 1;
    pub const OBJ_SVM: u32 = 2;
    pub const DEVICE_BUCKET: usize = 16;
    pub const BO_BUCKET: usize = 48;
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
pub mod kfd_off {
    pub const DOORBELL: u64 = 1;
    pub const EVENTS: u64 = 2;
    pub const MMIO: u64 = 3;
    pub const MEMFD_SIZE: u64 = 1 << 62;

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
    pub const VERSION: u32 = 0x00;
    pub const AMDGPU_INFO: u32 = 0x45;
    pub const AMDGPU_INFO_DEV_INFO: u32 = 0x16;
    pub const AMDGPU_FAMILY_AI: u32 = 141;
    pub const AMDGPU_FAMILY_NV: u32 = 143;
    pub const AMDGPU_FAMILY_GC_11_0_0: u32 = 145;
    /// Bytes of `drm_amdgpu_info_device` the emulator fills.
    pub const DEV_INFO_SIZE: usize = 200;
}

/// SDMA v4 packet opcodes (dw0 bits 7..0, sub-op 15..8).
pub mod sdma {
    pub const OP_NOP: u32 = 0;
    pub const OP_COPY: u32 = 1;
    pub const OP_WRITE: u32 = 2;
    pub const OP_FENCE: u32 = 5;
    pub const OP_TRAP: u32 = 6;
    pub const OP_CONST_FILL: u32 = 11;
    pub const SUBOP_LINEAR: u32 = 0;
}

/// An ioctl argument struct as bytes, at least the kernel's size.
#[derive(Clone, Debug)]
pub struct Args(pub Vec<u8>);

impl Args {
    pub fn new(input: &[u8], size: usize) -> Args {
        let mut v = input.to_vec();
        if v.len() < size {
            v.resize(size, 0);
        }
        Args(v)
    }
    pub fn u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.0[off..off + 4].try_into().unwrap())
    }
    pub fn u64(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.0[off..off + 8].try_into().unwrap())
    }
    pub fn set_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn set_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Little-endian field access on a byte slice (priv blob records).
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
pub fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
